//! The [`Backend`](crate::Backend) parts for `CudaBackend`: argument plumbing from the
//! traits to the ops of the sibling modules, and the host fallback (sampling).

use std::ops::Range;

use cudarc::driver::{CudaSlice, CudaViewMut};

use crate::backend::{
    AttentionOps, DenseOps, DeviceMemory, KvStorage, LatentAttentionParams, PagedAttentionParams,
    Precision, Rng, RopeScalingKind, RouterParams, Routing, RowDraw, RowDrawn, SamplingOps,
    StepQueues, Strided, WeightMatrix, WeightStorage,
};
use crate::cuda::device::driver_err;
use crate::cuda::matmul::CudaMatrix;
use crate::cuda::memory::{check_range, CudaKvBuffer, CudaKvMut, CudaKvRef, CudaRef};
use crate::cuda::ops::{CudaRope, RmsInput};
use crate::cuda::{per_row, CudaBackend};
use crate::dtype::DType;
use crate::error::{check_len, KernelError};
use crate::kv_dtype::KvCacheDType;
use crate::ops::RopeTable;
use crate::sampling::sample;
use crate::sampling_params::SamplingParams;
use crate::step_graph;

impl CudaBackend {
    /// Copies a view to a new host vector (waits for the stream).
    fn to_host(&self, v: CudaRef<'_>) -> Result<Vec<f32>, KernelError> {
        let mut host = vec![0.0f32; v.len()];
        self.download(v, &mut host)?;
        Ok(host)
    }
}

impl DeviceMemory for CudaBackend {
    type Buffer = CudaSlice<f32>;
    type View<'a> = CudaRef<'a>;
    type ViewMut<'a> = CudaViewMut<'a, f32>;

    fn name(&self) -> &'static str {
        "cuda"
    }

    fn zeros(&self, len: usize) -> Result<CudaSlice<f32>, KernelError> {
        self.alloc_f32(len, true)
    }

    fn alloc(&self, len: usize) -> Result<CudaSlice<f32>, KernelError> {
        // The trait leaves an alloc's contents unspecified: no clearing.
        self.alloc_f32(len, false)
    }

    fn upload(&self, host: &[f32]) -> Result<CudaSlice<f32>, KernelError> {
        if host.is_empty() {
            return self.zeros(0);
        }
        step_graph::refuse("allocates device memory")?;
        self.stream()
            .clone_htod(host)
            .map_err(|e| driver_err("uploading", e))
    }

    fn download(&self, src: CudaRef<'_>, host: &mut [f32]) -> Result<(), KernelError> {
        check_len("download host", src.len(), host.len())?;
        if src.is_empty() {
            return Ok(());
        }
        step_graph::refuse("downloads device memory")?;
        self.stream()
            .memcpy_dtoh(&src.cuda(), host)
            .map_err(|e| driver_err("downloading", e))?;
        self.synchronize()
    }

    fn len(&self, buf: &CudaSlice<f32>) -> usize {
        buf.len()
    }

    fn view_len(&self, v: CudaRef<'_>) -> usize {
        v.len()
    }

    fn view<'a>(
        &self,
        buf: &'a CudaSlice<f32>,
        range: Range<usize>,
    ) -> Result<CudaRef<'a>, KernelError> {
        CudaRef::new(buf, range)
    }

    fn view_mut<'a>(
        &self,
        buf: &'a mut CudaSlice<f32>,
        range: Range<usize>,
    ) -> Result<CudaViewMut<'a, f32>, KernelError> {
        check_range("view range", &range, buf.len())?;
        Ok(buf.slice_mut(range))
    }
}

impl KvStorage for CudaBackend {
    type KvBuffer = CudaKvBuffer;
    type KvView<'a> = CudaKvRef<'a>;
    type KvViewMut<'a> = CudaKvMut<'a>;

    fn kv_zeros(
        &self,
        dtype: KvCacheDType,
        len: usize,
        row_len: usize,
    ) -> Result<CudaKvBuffer, KernelError> {
        self.kv_zeros_op(dtype, len, row_len)
    }

    fn kv_len(&self, buf: &CudaKvBuffer) -> usize {
        buf.len()
    }

    fn kv_view<'a>(
        &self,
        buf: &'a CudaKvBuffer,
        range: Range<usize>,
    ) -> Result<CudaKvRef<'a>, KernelError> {
        CudaKvRef::new(buf, range)
    }

    fn kv_view_mut<'a>(
        &self,
        buf: &'a mut CudaKvBuffer,
        range: Range<usize>,
    ) -> Result<CudaKvMut<'a>, KernelError> {
        CudaKvMut::new(buf, range)
    }

    fn kv_download(&self, src: CudaKvRef<'_>, host: &mut [f32]) -> Result<(), KernelError> {
        self.kv_download_op(src, host)
    }
}

impl WeightStorage for CudaBackend {
    type Matrix = CudaMatrix;
    type Rope = CudaRope;

    fn upload_matrix(&self, w: &WeightMatrix) -> Result<CudaMatrix, KernelError> {
        self.upload_matrix_op(w)
    }

    fn matrix_shape(&self, w: &CudaMatrix) -> (usize, usize, DType) {
        w.shape()
    }

    fn matrix_storage(&self, w: &CudaMatrix) -> DType {
        w.device_dtype()
    }

    fn rope_table(
        &self,
        head_dim: usize,
        theta: f32,
        scaling: RopeScalingKind,
        max_positions: usize,
    ) -> Result<CudaRope, KernelError> {
        self.rope_upload(RopeTable::new(head_dim, theta, scaling, max_positions))
    }
}

impl StepQueues for CudaBackend {
    fn bind_micro_batch(&self, mb: usize) -> Result<(), KernelError> {
        self.bind_lane(mb)
    }

    fn micro_batch(&self) -> usize {
        crate::cuda::lanes::bound(self.id)
    }

    fn begin_step(&self) -> Result<(), KernelError> {
        self.begin_lane_step()
    }

    fn step_graphs(&self) -> Option<&dyn crate::step_graph::StepGraphs> {
        (self.cuda_graphs() == crate::CudaGraphs::On).then_some(self as _)
    }
}

impl DenseOps for CudaBackend {
    fn matmul(
        &self,
        x: CudaRef<'_>,
        m: usize,
        w: &CudaMatrix,
        mut out: CudaViewMut<'_, f32>,
        precision: Precision,
    ) -> Result<(), KernelError> {
        self.matmul_op(x, m, w, &mut out, precision)
    }

    fn rms_norm(
        &self,
        x: CudaRef<'_>,
        weight: CudaRef<'_>,
        eps: f32,
        mut out: CudaViewMut<'_, f32>,
    ) -> Result<(), KernelError> {
        self.rms_norm_op(RmsInput::Separate(x, &mut out), weight, eps)
    }

    fn rms_norm_inplace(
        &self,
        mut x: CudaViewMut<'_, f32>,
        weight: CudaRef<'_>,
        eps: f32,
    ) -> Result<(), KernelError> {
        self.rms_norm_op(RmsInput::InPlace(&mut x), weight, eps)
    }

    fn silu_mul(
        &self,
        gate: CudaRef<'_>,
        up: CudaRef<'_>,
        mut out: CudaViewMut<'_, f32>,
    ) -> Result<(), KernelError> {
        self.silu_mul_op(gate, up, &mut out)
    }

    fn add(&self, mut a: CudaViewMut<'_, f32>, b: CudaRef<'_>) -> Result<(), KernelError> {
        self.add_op(&mut a, b)
    }

    fn add_bias(&self, mut x: CudaViewMut<'_, f32>, bias: CudaRef<'_>) -> Result<(), KernelError> {
        self.add_bias_op(&mut x, bias)
    }

    fn copy(&self, src: CudaRef<'_>, mut dst: CudaViewMut<'_, f32>) -> Result<(), KernelError> {
        self.copy_op(src, &mut dst)
    }

    fn fill(&self, mut x: CudaViewMut<'_, f32>, value: f32) -> Result<(), KernelError> {
        self.fill_op(&mut x, value)
    }

    fn copy_strided(
        &self,
        src: (CudaRef<'_>, Strided),
        (mut dst, d): (CudaViewMut<'_, f32>, Strided),
        rows: usize,
        width: usize,
    ) -> Result<(), KernelError> {
        self.copy_strided_op(src, (&mut dst, d), rows, width)
    }

    fn gather_rows(
        &self,
        src: CudaRef<'_>,
        width: usize,
        rows: &[usize],
        mut dst: CudaViewMut<'_, f32>,
    ) -> Result<(), KernelError> {
        self.gather_rows_op(src, width, rows, &mut dst)
    }

    fn scatter_add_rows(
        &self,
        src: CudaRef<'_>,
        width: usize,
        rows: &[usize],
        scales: &[f32],
        mut dst: CudaViewMut<'_, f32>,
    ) -> Result<(), KernelError> {
        self.scatter_add_rows_op(src, width, rows, scales, &mut dst)
    }

    fn rope(
        &self,
        table: &CudaRope,
        mut x: CudaViewMut<'_, f32>,
        positions: &[usize],
        stride: usize,
        offset: usize,
        interleaved: bool,
    ) -> Result<(), KernelError> {
        self.rope_op(table, &mut x, positions, stride, offset, interleaved)
    }

    fn embedding(
        &self,
        table: &CudaMatrix,
        ids: &[u32],
        mut out: CudaViewMut<'_, f32>,
    ) -> Result<(), KernelError> {
        self.embedding_op(table, ids, &mut out)
    }
}

impl AttentionOps for CudaBackend {
    fn write_kv(
        &self,
        k_cache: CudaKvMut<'_>,
        v_cache: CudaKvMut<'_>,
        n_kv_heads: usize,
        head_dim: usize,
        slots: &[usize],
        k: CudaRef<'_>,
        v: CudaRef<'_>,
    ) -> Result<(), KernelError> {
        self.write_kv_op(k_cache, v_cache, n_kv_heads, head_dim, slots, k, v)
    }

    fn write_rows(
        &self,
        mut cache: CudaKvMut<'_>,
        width: usize,
        slots: &[usize],
        rows: CudaRef<'_>,
    ) -> Result<usize, KernelError> {
        self.kv_store_rows(&mut cache, width, slots, rows)
    }

    fn paged_attention(
        &self,
        q: CudaRef<'_>,
        p: &PagedAttentionParams<'_>,
        k_cache: CudaKvRef<'_>,
        v_cache: CudaKvRef<'_>,
        mut out: CudaViewMut<'_, f32>,
        mut lse: CudaViewMut<'_, f32>,
    ) -> Result<(), KernelError> {
        self.paged_attention_op(q, p, k_cache, v_cache, &mut out, &mut lse)
    }

    fn latent_attention(
        &self,
        q: CudaRef<'_>,
        p: &LatentAttentionParams<'_>,
        cache: CudaKvRef<'_>,
        mut out: CudaViewMut<'_, f32>,
        mut lse: CudaViewMut<'_, f32>,
    ) -> Result<(), KernelError> {
        self.latent_attention_op(q, p, cache, &mut out, &mut lse)
    }

    fn merge_lse(
        &self,
        partial_out: &[CudaRef<'_>],
        partial_lse: &[CudaRef<'_>],
        n_rows: usize,
        head_dim: usize,
        mut out: CudaViewMut<'_, f32>,
        mut lse: CudaViewMut<'_, f32>,
    ) -> Result<(), KernelError> {
        self.merge_lse_op(
            partial_out,
            partial_lse,
            n_rows,
            head_dim,
            &mut out,
            &mut lse,
        )
    }

    fn scale_by_lse_share(
        &self,
        mut out: CudaViewMut<'_, f32>,
        lse: CudaRef<'_>,
        all_lse: CudaRef<'_>,
        parts: usize,
        head_dim: usize,
    ) -> Result<(), KernelError> {
        self.scale_by_lse_share_op(&mut out, lse, all_lse, parts, head_dim)
    }
}

/// Routing and sampling on CUDA. `sample` (one row with a generator) copies the logits to
/// the host and runs the CPU function; the ranks use `sample_rows`, which draws on the
/// device, and `route_experts` routes on the device.
impl SamplingOps for CudaBackend {
    /// Routes on the device; only the chosen ids and weights come back (see
    /// `cuda::routing`).
    fn route_experts(
        &self,
        logits: CudaRef<'_>,
        p: &RouterParams,
        correction_bias: Option<CudaRef<'_>>,
    ) -> Result<Routing, KernelError> {
        self.route_experts_op(logits, p, correction_bias)
    }

    /// One block per row on the device; only the token ids come back.
    fn argmax(&self, logits: CudaRef<'_>, vocab: usize) -> Result<Vec<u32>, KernelError> {
        if vocab == 0 || !logits.len().is_multiple_of(vocab) {
            return Err(KernelError::Shape(format!(
                "argmax: {} logits are not rows of {vocab}",
                logits.len()
            )));
        }
        let rows = logits.len() / vocab;
        if rows == 0 {
            return Ok(Vec::new());
        }
        step_graph::refuse("downloads argmax tokens")?;
        let mut ids = self
            .stream()
            .alloc_zeros::<u32>(rows)
            .map_err(|e| driver_err("allocating", e))?;
        let lv = logits.cuda();
        let mut b = self.launch_of("argmax_f32")?;
        b.ptr(&lv).u64(vocab as u64).ptr_mut(&mut ids);
        // SAFETY: one block per whole row; `ids` holds one id per row. The kernel's
        // shared arrays are sized for 1024 threads.
        unsafe { b.launch(per_row(rows, 1024)?) }?;
        let mut host = vec![0u32; rows];
        self.stream()
            .memcpy_dtoh(&ids, &mut host)
            .map_err(|e| driver_err("downloading", e))?;
        self.synchronize()?;
        Ok(host)
    }

    /// Downloads the row of logits and samples on the host.
    fn sample(
        &self,
        logits: CudaRef<'_>,
        params: &SamplingParams,
        rng: &mut Rng,
    ) -> Result<u32, KernelError> {
        if logits.is_empty() {
            return Err(KernelError::Shape("sample: empty logits".into()));
        }
        step_graph::refuse("downloads logits")?;
        let host = self.to_host(logits)?;
        Ok(sample(&host, params, rng))
    }

    /// On the device (`kernels/sampling.cu`): only tokens and log-probabilities come
    /// back; see the `sampling` module for the rows it leaves to the host.
    fn sample_rows(
        &self,
        logits: CudaRef<'_>,
        vocab: usize,
        draws: &[RowDraw<'_>],
    ) -> Result<Vec<Option<RowDrawn>>, KernelError> {
        self.sample_rows_op(logits, vocab, draws)
    }
}
