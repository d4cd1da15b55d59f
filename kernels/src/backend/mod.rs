//! The device seam: [`Backend`] owns buffers and runs every op a forward pass needs.
//!
//! In the spirit of candle's `BackendDevice` / `BackendStorage`, one trait carries the
//! device's types (a buffer of f32 elements, views into it, weight matrices in any
//! [`DType`], RoPE tables) and its ops. Shapes and step metadata (token positions,
//! block tables, KV slots) stay host slices: they are small, the scheduler produces
//! them on the host, and a device backend uploads them once per call (or per step).
//!
//! Backends:
//! * [`CpuBackend`](crate::CpuBackend) (`kernels/src/cpu/`): host memory, the buffer is
//!   a `Vec<f32>` and views are plain slices, so every op is a direct call of today's
//!   CPU kernel with no copy.
//! * [`CudaBackend`](crate::cuda::CudaBackend) (`kernels/src/cuda/`): buffers are
//!   cudarc `CudaSlice<f32>` with [`CudaRef`](crate::cuda::CudaRef) (a `Copy` handle
//!   making `CudaView`s) / `CudaViewMut` as the view types, weights as f32 or bf16
//!   (GGML formats decoded to bf16 at upload), matmul through cuBLAS, and the
//!   remaining ops as NVRTC-compiled kernels launched on the rank's stream. Its arm
//!   of [`test_on_every_backend!`](crate::test_on_every_backend) runs every op test
//!   below where a GPU is present and prints `skipped` elsewhere.
//!
//! Collectives are not part of this trait: they belong to the
//! [`Communicator`](crate::Communicator), which an NCCL (GPU) or MPI (between
//! processes) implementation replaces.

use std::ops::Range;

use crate::dtype::DType;
use crate::error::KernelError;
use crate::kv_dtype::KvCacheDType;
use crate::matmul::Precision;
use crate::moe_routing::{RouterParams, Routing};
use crate::ops::RopeScalingKind;
use crate::row_sampling::{RowDraw, RowDrawn};
use crate::sampling::{Rng, SamplingParams};
use crate::weights::WeightMatrix;

pub mod compare;
#[cfg(test)]
mod tests;

/// One side of a [`Backend::copy_strided`]: rows `stride` values apart, each starting
/// `offset` values into its row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Strided {
    /// Distance between the starts of consecutive rows.
    pub stride: usize,
    /// Where the copied part starts within a row.
    pub offset: usize,
}

impl Strided {
    /// Rows `stride` apart, the copied part at `offset`.
    pub fn new(stride: usize, offset: usize) -> Self {
        Self { stride, offset }
    }

    /// Contiguous rows of exactly the copied width.
    pub fn packed(width: usize) -> Self {
        Self::new(width, 0)
    }
}

/// Shape and step metadata of one [`Backend::paged_attention`] call (the queries are
/// passed separately as a device view).
#[derive(Debug, Clone, Copy)]
pub struct PagedAttentionParams<'a> {
    /// Query heads.
    pub n_q_heads: usize,
    /// KV heads (query head `h` uses KV head `h / (n_q_heads / n_kv_heads)`, GQA).
    pub n_kv_heads: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// Tokens per cache block.
    pub block_size: usize,
    /// Score scale, usually `1 / sqrt(head_dim)`.
    pub scale: f32,
    /// Sequence index (into `block_tables`) of each token.
    pub token_seq: &'a [u32],
    /// Cached tokens each token attends to (causal mask applied by the caller).
    pub token_kv_len: &'a [u32],
    /// Per sequence: local token `j` lives in slot
    /// `block_tables[s][j / block_size] * block_size + j % block_size`.
    pub block_tables: &'a [&'a [u32]],
}

/// Shape and step metadata of one [`Backend::latent_attention`] call (MLA with
/// absorbed weights: one latent KV head, values are the `v_dim` prefix of each key row).
#[derive(Debug, Clone, Copy)]
pub struct LatentAttentionParams<'a> {
    /// Query heads.
    pub n_heads: usize,
    /// Key width: the cache row (`kv_lora_rank + qk_rope_head_dim`).
    pub dim: usize,
    /// Value width: the row prefix attention averages (`kv_lora_rank`).
    pub v_dim: usize,
    /// Tokens per cache block.
    pub block_size: usize,
    /// Score scale.
    pub scale: f32,
    /// Sequence index (into `block_tables`) of each token.
    pub token_seq: &'a [u32],
    /// Cached tokens each token attends to (causal mask applied by the caller).
    pub token_kv_len: &'a [u32],
    /// Per sequence: local token `j` lives in slot `block_tables[s][j / B]·B + j % B`.
    pub block_tables: &'a [&'a [u32]],
}

/// A compute device: its memory types and the ops of a transformer forward pass.
///
/// Every op validates its arguments and returns [`KernelError`] on a mismatch rather
/// than panicking. Buffers hold f32 elements (activations, norms' weights); KV caches
/// live in [`Backend::KvBuffer`]s of a chosen [`KvCacheDType`];
/// weights in any [`DType`] live in [`Backend::Matrix`]. A buffer is addressed through
/// views ([`Backend::view`], [`Backend::view_mut`]) so ops can work on part of one.
///
/// ```
/// use dcpserve_kernels::{Backend, CpuBackend, Precision, WeightMatrix};
/// let dev = CpuBackend::new(1);
/// let w = dev.upload_matrix(&WeightMatrix::from_f32(2, 2, vec![1.0, 0.0, 1.0, 1.0]).unwrap())
///     .unwrap();
/// let x = dev.upload(&[3.0, 4.0]).unwrap();
/// let mut y = dev.zeros(2).unwrap();
/// dev.matmul(dev.view(&x, 0..2).unwrap(), 1, &w, dev.view_mut(&mut y, 0..2).unwrap(),
///     Precision::Exact).unwrap();
/// let mut host = [0.0; 2];
/// dev.download(dev.view(&y, 0..2).unwrap(), &mut host).unwrap();
/// assert_eq!(host, [3.0, 7.0]);
/// ```
pub trait Backend: Send + Sync {
    /// An owned device buffer of f32 elements.
    type Buffer: Send + Sync;
    /// A read-only window of a buffer.
    type View<'a>: Copy
    where
        Self: 'a;
    /// A writable window of a buffer.
    type ViewMut<'a>
    where
        Self: 'a;
    /// A weight matrix `[rows, cols]` in device memory, stored in its [`DType`].
    type Matrix: Send + Sync;
    /// RoPE cos/sin tables in device memory.
    type Rope: Send + Sync;
    /// An owned KV-cache buffer, its elements stored in a [`KvCacheDType`] (f32, bf16 or
    /// FP8 with a per-tensor scale); ops convert on store and on read.
    type KvBuffer: Send + Sync;
    /// A read-only window of a KV-cache buffer.
    type KvView<'a>: Copy
    where
        Self: 'a;
    /// A writable window of a KV-cache buffer.
    type KvViewMut<'a>
    where
        Self: 'a;

    /// Short name for logs and test names (`"cpu"`, `"cuda"`).
    fn name(&self) -> &'static str;

    // --- scheduling ---------------------------------------------------------------

    /// Sends the calling thread's later ops to micro-batch `mb`'s queue, ordered after
    /// everything already enqueued on the other queues (the rank's compute thread of
    /// micro-batch `mb` calls it before serving). CUDA: stream `mb`, so one
    /// micro-batch's collectives overlap the other's kernels; a backend with one queue
    /// (the CPU, whose ops run on the calling thread) ignores it.
    fn bind_micro_batch(&self, mb: usize) -> Result<(), KernelError> {
        let _ = mb;
        Ok(())
    }
    /// The micro-batch the calling thread bound ([`Backend::bind_micro_batch`]); 0 when
    /// it bound none or the backend has one queue. Buffers a micro-batch reuses from
    /// step to step (workspaces) stay with it, since two queues do not order with
    /// each other.
    fn micro_batch(&self) -> usize {
        0
    }
    /// Marks the start of a step on the calling thread's queue, before its first op:
    /// a device backend recycles the step metadata staged by earlier steps (CUDA: its
    /// pinned staging arena, after an event of the step before last). Ops work without
    /// it too (they stage into fresh room, waiting when it runs out).
    fn begin_step(&self) -> Result<(), KernelError> {
        Ok(())
    }
    /// The calling thread's queue as a device-graph runner, when this backend replays
    /// steps from graphs ([`step_graph::run_step`](crate::step_graph::run_step) drives
    /// it); `None` (the CPU, or graphs switched off) runs every step eagerly.
    fn step_graphs(&self) -> Option<&dyn crate::step_graph::StepGraphs> {
        None
    }

    // --- memory -------------------------------------------------------------------

    /// A buffer of `len` zeros.
    fn zeros(&self, len: usize) -> Result<Self::Buffer, KernelError>;
    /// A buffer of `len` elements whose contents are unspecified (the caller writes
    /// before it reads; a device backend skips the clearing).
    fn alloc(&self, len: usize) -> Result<Self::Buffer, KernelError>;
    /// A buffer holding a copy of `host`.
    fn upload(&self, host: &[f32]) -> Result<Self::Buffer, KernelError>;
    /// Copies `src` into `host` (`host.len()` must equal the view's length).
    fn download(&self, src: Self::View<'_>, host: &mut [f32]) -> Result<(), KernelError>;
    /// Elements in `buf`.
    fn len(&self, buf: &Self::Buffer) -> usize;
    /// Elements in a view.
    fn view_len(&self, v: Self::View<'_>) -> usize;
    /// Elements `range` of `buf`, read-only.
    fn view<'a>(
        &self,
        buf: &'a Self::Buffer,
        range: Range<usize>,
    ) -> Result<Self::View<'a>, KernelError>;
    /// Elements `range` of `buf`, writable.
    fn view_mut<'a>(
        &self,
        buf: &'a mut Self::Buffer,
        range: Range<usize>,
    ) -> Result<Self::ViewMut<'a>, KernelError>;
    /// A KV-cache buffer of `len` zero elements of `dtype`.
    fn kv_zeros(&self, dtype: KvCacheDType, len: usize) -> Result<Self::KvBuffer, KernelError>;
    /// Elements in a KV-cache buffer.
    fn kv_len(&self, buf: &Self::KvBuffer) -> usize;
    /// Elements `range` of a KV-cache buffer, read-only.
    fn kv_view<'a>(
        &self,
        buf: &'a Self::KvBuffer,
        range: Range<usize>,
    ) -> Result<Self::KvView<'a>, KernelError>;
    /// Elements `range` of a KV-cache buffer, writable.
    fn kv_view_mut<'a>(
        &self,
        buf: &'a mut Self::KvBuffer,
        range: Range<usize>,
    ) -> Result<Self::KvViewMut<'a>, KernelError>;
    /// Copies a KV-cache view into `host`, converted to f32 (tests and diagnostics).
    fn kv_download(&self, src: Self::KvView<'_>, host: &mut [f32]) -> Result<(), KernelError>;
    /// Places a host weight matrix on the device, keeping its [`DType`].
    fn upload_matrix(&self, w: &WeightMatrix) -> Result<Self::Matrix, KernelError>;
    /// `(rows, cols, dtype)` of a device matrix, `dtype` being the host format it was
    /// uploaded from.
    fn matrix_shape(&self, w: &Self::Matrix) -> (usize, usize, DType);
    /// The element type the device keeps a matrix in, whose values products and
    /// gathers use: the uploaded format on the CPU; `F32` or `BF16` on CUDA, which
    /// decodes every other format to bf16 at upload.
    fn matrix_storage(&self, w: &Self::Matrix) -> DType {
        self.matrix_shape(w).2
    }
    /// RoPE tables for `head_dim`-wide vectors (Hugging Face `rope_theta` and
    /// `rope_scaling`, incl. YaRN), precomputed for positions `0..max_positions`.
    fn rope_table(
        &self,
        head_dim: usize,
        theta: f32,
        scaling: RopeScalingKind,
        max_positions: usize,
    ) -> Result<Self::Rope, KernelError>;

    // --- dense ops ----------------------------------------------------------------

    /// `out[m, w.rows] = x[m, w.cols] · wᵀ`; `precision` may allow bf16 products for
    /// bf16 weights ([`Precision::Fast`]).
    fn matmul(
        &self,
        x: Self::View<'_>,
        m: usize,
        w: &Self::Matrix,
        out: Self::ViewMut<'_>,
        precision: Precision,
    ) -> Result<(), KernelError>;
    /// Several products of the same input: `outs[i] = x[m, cols] · ws[i]ᵀ` (the q/k/v or
    /// gate/up projections). A backend may run them together (the CPU backend does
    /// for decode-sized `m`: one parallel region instead of one per product); the
    /// default runs [`matmul`](Backend::matmul) for each.
    fn matmul_each(
        &self,
        x: Self::View<'_>,
        m: usize,
        products: Vec<(&Self::Matrix, Self::ViewMut<'_>)>,
        precision: Precision,
    ) -> Result<(), KernelError> {
        for (w, out) in products {
            self.matmul(x, m, w, out, precision)?;
        }
        Ok(())
    }
    /// RMSNorm over rows of `weight.len()`: `out = x / sqrt(mean(x²) + eps) · weight`.
    fn rms_norm(
        &self,
        x: Self::View<'_>,
        weight: Self::View<'_>,
        eps: f32,
        out: Self::ViewMut<'_>,
    ) -> Result<(), KernelError>;
    /// In-place [`rms_norm`](Backend::rms_norm).
    fn rms_norm_inplace(
        &self,
        x: Self::ViewMut<'_>,
        weight: Self::View<'_>,
        eps: f32,
    ) -> Result<(), KernelError>;
    /// SwiGLU: `out = silu(gate) · up`.
    fn silu_mul(
        &self,
        gate: Self::View<'_>,
        up: Self::View<'_>,
        out: Self::ViewMut<'_>,
    ) -> Result<(), KernelError>;
    /// `a += b` (residual connections).
    fn add(&self, a: Self::ViewMut<'_>, b: Self::View<'_>) -> Result<(), KernelError>;
    /// Adds `bias` to every `bias.len()`-wide row of `x` (projection biases).
    fn add_bias(&self, x: Self::ViewMut<'_>, bias: Self::View<'_>) -> Result<(), KernelError>;
    /// Copies `src` into `dst` (equal lengths), e.g. picking rows of activations.
    fn copy(&self, src: Self::View<'_>, dst: Self::ViewMut<'_>) -> Result<(), KernelError>;
    /// Sets every element of `x` to `value`.
    fn fill(&self, x: Self::ViewMut<'_>, value: f32) -> Result<(), KernelError>;
    /// A 2-D strided copy (like `cudaMemcpy2D`): for `i` in `0..rows`, the `width` values
    /// at `src[i·src_stride + src_offset..]` go to `dst[i·dst_stride + dst_offset..]`.
    /// MLA uses it to take one head out of every token's row and to put it back.
    fn copy_strided(
        &self,
        src: (Self::View<'_>, Strided),
        dst: (Self::ViewMut<'_>, Strided),
        rows: usize,
        width: usize,
    ) -> Result<(), KernelError>;
    /// Row gather (`index_select`): row `j` of `dst` is row `rows[j]` of `src`, rows
    /// being `width` wide (the tokens routed to one expert).
    fn gather_rows(
        &self,
        src: Self::View<'_>,
        width: usize,
        rows: &[usize],
        dst: Self::ViewMut<'_>,
    ) -> Result<(), KernelError>;
    /// Weighted row scatter-add (`index_add`): `dst[rows[j]] += scales[j] · src[j]` for
    /// `width`-wide rows, in order of `j` (an expert's outputs into the MoE sum).
    fn scatter_add_rows(
        &self,
        src: Self::View<'_>,
        width: usize,
        rows: &[usize],
        scales: &[f32],
        dst: Self::ViewMut<'_>,
    ) -> Result<(), KernelError>;
    /// Rotates, for each token `t`, the `head_dim`-wide vector at `offset` of every
    /// `stride`-wide row of token `t`'s part of `x` (`x` is `[positions.len(), …]`) by
    /// position `positions[t]`. GQA heads: `stride = head_dim`, `offset = 0`; MLA: the
    /// rope part of each query head, or of the latent key row. `interleaved` rotates
    /// pairs `(2i, 2i+1)`, otherwise `(i, i + d/2)`.
    #[allow(clippy::too_many_arguments)]
    fn rope(
        &self,
        table: &Self::Rope,
        x: Self::ViewMut<'_>,
        positions: &[usize],
        stride: usize,
        offset: usize,
        interleaved: bool,
    ) -> Result<(), KernelError>;
    /// Embedding gather: row `ids[i]` of `table` (decoded to f32) into row `i` of `out`.
    fn embedding(
        &self,
        table: &Self::Matrix,
        ids: &[u32],
        out: Self::ViewMut<'_>,
    ) -> Result<(), KernelError>;

    // --- attention ----------------------------------------------------------------

    /// Stores K/V rows of new tokens into paged caches
    /// (`[num_blocks, block_size, n_kv_heads, head_dim]`), converted to the caches'
    /// element type; slot `usize::MAX` skips a token (one another DCP rank stores).
    #[allow(clippy::too_many_arguments)]
    fn write_kv(
        &self,
        k_cache: Self::KvViewMut<'_>,
        v_cache: Self::KvViewMut<'_>,
        n_kv_heads: usize,
        head_dim: usize,
        slots: &[usize],
        k: Self::View<'_>,
        v: Self::View<'_>,
    ) -> Result<(), KernelError>;
    /// Stores `width`-wide rows into a paged cache of such rows (MLA's latent cache,
    /// `[num_blocks, block_size, width]`): row `t` of `rows` goes to slot `slots[t]`;
    /// `usize::MAX` skips a token (one another DCP rank stores). Rows are converted to
    /// the cache's element type. Returns the rows stored.
    fn write_rows(
        &self,
        cache: Self::KvViewMut<'_>,
        width: usize,
        slots: &[usize],
        rows: Self::View<'_>,
    ) -> Result<usize, KernelError>;
    /// Paged GQA attention of `q` (`[n_tokens, n_q_heads, head_dim]`): the output
    /// `[n_tokens, n_q_heads, head_dim]` and its log-sum-exp `[n_tokens, n_q_heads]`
    /// (`-inf` and zeros for tokens without keys), so partials over KV shards merge.
    /// The caches are read in their element type (no dequantized copy of them).
    fn paged_attention(
        &self,
        q: Self::View<'_>,
        p: &PagedAttentionParams<'_>,
        k_cache: Self::KvView<'_>,
        v_cache: Self::KvView<'_>,
        out: Self::ViewMut<'_>,
        lse: Self::ViewMut<'_>,
    ) -> Result<(), KernelError>;
    /// MLA latent attention of absorbed queries `q` (`[n_tokens, n_heads, dim]`) against
    /// the latent cache: output `[n_tokens, n_heads, v_dim]` and log-sum-exp.
    fn latent_attention(
        &self,
        q: Self::View<'_>,
        p: &LatentAttentionParams<'_>,
        cache: Self::KvView<'_>,
        out: Self::ViewMut<'_>,
        lse: Self::ViewMut<'_>,
    ) -> Result<(), KernelError>;
    /// Merges attention partials over disjoint KV shards by their log-sum-exp: row `i`
    /// of part `p` is `partial_out[p][i·head_dim..]` with `partial_lse[p][i]`.
    fn merge_lse(
        &self,
        partial_out: &[Self::View<'_>],
        partial_lse: &[Self::View<'_>],
        n_rows: usize,
        head_dim: usize,
        out: Self::ViewMut<'_>,
        lse: Self::ViewMut<'_>,
    ) -> Result<(), KernelError>;

    /// Scales each attention partial by its shard's share of the merged log-sum-exp,
    /// the step before a reduce-scatter sums the shards (vLLM's `correct_attn_out`): row
    /// `i` (`head_dim` wide) of `out` is multiplied by `exp(lse[i] − LSE_i)`, where
    /// `LSE_i` merges `all_lse[p·n_rows + i]` over the `parts` shards (`n_rows` is
    /// `lse`'s length). An empty shard (`−inf`) gets weight 0.
    fn scale_by_lse_share(
        &self,
        out: Self::ViewMut<'_>,
        lse: Self::View<'_>,
        all_lse: Self::View<'_>,
        parts: usize,
        head_dim: usize,
    ) -> Result<(), KernelError>;

    // --- routing and sampling (results come back to the host) ------------------------

    /// MoE routing of router logits `[n_tokens, n_experts]` (see
    /// [`route_experts`](crate::route_experts)).
    fn route_experts(
        &self,
        logits: Self::View<'_>,
        p: &RouterParams,
        correction_bias: Option<Self::View<'_>>,
    ) -> Result<Routing, KernelError>;
    /// The most likely token of each `vocab`-wide row of `logits`.
    fn argmax(&self, logits: Self::View<'_>, vocab: usize) -> Result<Vec<u32>, KernelError>;
    /// One token drawn from one row of `logits` with `params` (greedy below temperature
    /// 1e-5) and the sequence's `rng`.
    fn sample(
        &self,
        logits: Self::View<'_>,
        params: &SamplingParams,
        rng: &mut Rng,
    ) -> Result<u32, KernelError>;
    /// One draw per entry of `draws` from the `vocab`-wide rows of `logits` (see
    /// [`row_sampling`](crate::row_sampling)): the chosen token, whether the draw used
    /// its uniform number, and the log-probabilities asked for, in the order of `draws`.
    /// Only these come back to the host, not the logits.
    ///
    /// `Some` answers equal [`draw_row_on_host`](crate::row_sampling::draw_row_on_host)
    /// on the row (the CPU backend's bit for bit; a device's except when a draw or a
    /// top-p cut falls within rounding of a boundary, its exponentials and parallel
    /// sums rounding differently in the last bits). `None`: this backend cannot draw
    /// that row exactly (see the backend's limits); the caller draws it on the host,
    /// its stream untouched. Errors: `vocab == 0`, `logits` not whole rows, a row out
    /// of range, a sampling draw without a uniform number in `[0, 1)`.
    ///
    /// ```
    /// use dcpserve_kernels::row_sampling::RowDraw;
    /// use dcpserve_kernels::{Backend, CpuBackend, SamplingParams};
    /// let dev = CpuBackend::new(1);
    /// let logits = dev.upload(&[0.0, 3.0, 1.0, 5.0, 0.0, 0.0]).unwrap();
    /// let greedy = SamplingParams { temperature: 0.0, ..Default::default() };
    /// let draws = [
    ///     RowDraw { row: 1, params: &greedy, uniform: None, top_logprobs: Some(0) },
    ///     RowDraw { row: 0, params: &SamplingParams::default(), uniform: Some(0.5), top_logprobs: None },
    /// ];
    /// let got = dev.sample_rows(dev.view(&logits, 0..6).unwrap(), 3, &draws).unwrap();
    /// let first = got[0].as_ref().unwrap();
    /// assert_eq!((first.token, first.used_uniform), (0, false));
    /// assert!(first.logprob.unwrap() < 0.0 && first.top_logprobs.is_empty());
    /// assert!(got[1].as_ref().unwrap().used_uniform);
    /// ```
    fn sample_rows(
        &self,
        logits: Self::View<'_>,
        vocab: usize,
        draws: &[RowDraw<'_>],
    ) -> Result<Vec<Option<RowDrawn>>, KernelError>;
}

/// A backend whose views are host memory, so a host
/// [`Communicator`](crate::Communicator) (shared memory, MPI) can move its buffers:
/// [`HostCollectives`](crate::HostCollectives) relies on it. A CUDA backend does not
/// implement it; its collectives (NCCL) take device views directly.
pub trait HostViews: Backend {
    /// The host slice behind a view.
    fn host<'a>(v: Self::View<'a>) -> &'a [f32]
    where
        Self: 'a;
    /// The writable host slice behind a view.
    fn host_mut<'a>(v: Self::ViewMut<'a>) -> &'a mut [f32]
    where
        Self: 'a;
    /// A host slice as a view.
    fn of_host<'a>(s: &'a [f32]) -> Self::View<'a>
    where
        Self: 'a;
    /// A writable host slice as a view.
    fn of_host_mut<'a>(s: &'a mut [f32]) -> Self::ViewMut<'a>
    where
        Self: 'a;
}

/// Runs generic test bodies on every backend present: for each `name`, a module `name`
/// with one `#[test]` per backend calling `name(&backend)`, where `name` is a
/// `fn<B: Backend>(&B)` in the invoking module. CPU always; CUDA on device 0 where a
/// driver and a GPU are present, otherwise its test prints
/// `skipped: no CUDA device (<reason>)` to stderr and passes.
///
/// ```
/// use dcpserve_kernels::{test_on_every_backend, Backend, CpuBackend};
/// fn zeros_are_zero<B: Backend>(dev: &B) {
///     let b = dev.zeros(3).unwrap();
///     let mut host = [1.0; 3];
///     dev.download(dev.view(&b, 0..3).unwrap(), &mut host).unwrap();
///     assert_eq!(host, [0.0; 3]);
/// }
/// test_on_every_backend!(zeros_are_zero); // in a test build: `zeros_are_zero::cpu`
/// fn main() {
///     zeros_are_zero(&CpuBackend::new(1));
/// }
/// ```
#[macro_export]
macro_rules! test_on_every_backend {
    ($($name:ident),+ $(,)?) => {
        $(
            #[allow(non_snake_case)]
            mod $name {
                #[test]
                fn cpu() {
                    super::$name(&$crate::CpuBackend::new(2));
                }

                #[test]
                fn cuda() {
                    // Exact products, so `Precision::Exact` means what it does on the CPU.
                    match $crate::cuda::CudaBackend::new(0)
                        .map(|d| d.with_gpu_matmul($crate::GpuMatmul::Exact))
                    {
                        Ok(dev) => super::$name(&dev),
                        Err($crate::KernelError::Unavailable(why)) => {
                            // Straight to stderr, past the harness's capture.
                            use ::std::io::Write as _;
                            let _ = ::std::writeln!(
                                ::std::io::stderr(),
                                "skipped: no CUDA device ({why})"
                            );
                        }
                        Err(e) => panic!("CUDA backend failed to start: {e}"),
                    }
                }
            }
        )+
    };
}
