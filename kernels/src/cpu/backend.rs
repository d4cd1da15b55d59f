//! [`CpuBackend`]: the [`Backend`](crate::Backend) over host memory, calling the CPU kernels directly.

use crate::shape_checks::rope_token_width;
use std::ops::Range;
use std::sync::Arc;

use crate::attention::{paged_attention_typed, write_kv_typed, AttentionBatch};
use crate::backend::{
    AttentionOps, DenseOps, DeviceMemory, HostViews, KvStorage, LatentAttentionParams,
    PagedAttentionParams, Precision, Rng, RopeScalingKind, RouterParams, Routing, RowDraw,
    RowDrawn, SamplingOps, StepQueues, Strided, WeightMatrix, WeightStorage,
};
use crate::cpu::int16_matmul;
use crate::cpu::int8_matmul::{auto_int8, int8_supported, matmul_int8, CpuMatmul, Int8Isa};
use crate::cpu::kv_store::{KvMut, KvRef, KvStore};
use crate::cpu::rows::{copy_strided, gather_rows, scatter_add_rows, write_rows};
use crate::dcp::merge::{merge_partials, scale_by_lse_share};
use crate::dtype::DType;
use crate::error::{check_len, KernelError};
use crate::kv_dtype::KvCacheDType;
use crate::latent_attention::{latent_attention_typed, LatentBatch};
use crate::matmul::matmul_with_precision;
use crate::moe_routing::route_experts;
use crate::ops::{add_bias, add_inplace, rms_norm, rms_norm_inplace, silu_mul, RopeTable};
use crate::pool::ThreadPool;
use crate::row_sampling::{check_draws, draw_row_on_host};
use crate::sampling::{argmax, sample};
use crate::sampling_params::SamplingParams;

/// The CPU device: buffers are `Vec<f32>`, views are slices, weights are
/// [`WeightMatrix`] (shared, never copied), and multi-threaded kernels run on the
/// backend's [`ThreadPool`]. Products with quantized weights use int8 activations or
/// the f32 path as its [`CpuMatmul`] says (default `auto`: per product, as
/// [`auto_int8`] decides, unless `DCPSERVE_CPU_MATMUL` names one path).
///
/// ```
/// use dcpserve_kernels::{CpuBackend, DenseOps, DeviceMemory};
/// let cpu = CpuBackend::new(2);
/// let mut a = cpu.upload(&[1.0, 2.0]).unwrap();
/// let b = cpu.upload(&[0.5, 0.5]).unwrap();
/// cpu.add(cpu.view_mut(&mut a, 0..2).unwrap(), cpu.view(&b, 0..2).unwrap()).unwrap();
/// assert_eq!(a, [1.5, 2.5]);
/// ```
#[derive(Debug, Clone)]
pub struct CpuBackend {
    pool: Arc<ThreadPool>,
    /// The int8 path for quantized weights, when chosen and available.
    int8: Option<Int8Isa>,
    /// With `int8`: only the products [`auto_int8`] picks take it (`auto`).
    per_product: bool,
}

impl CpuBackend {
    /// A backend with its own pool of `threads` compute threads.
    pub fn new(threads: usize) -> Self {
        Self::with_pool(Arc::new(ThreadPool::new(threads)))
    }

    /// A backend computing on an existing pool (e.g. a rank's pinned threads).
    pub fn with_pool(pool: Arc<ThreadPool>) -> Self {
        CpuBackend {
            pool,
            int8: None,
            per_product: false,
        }
        .with_cpu_matmul(CpuMatmul::Auto)
    }

    /// Chooses how quantized weights are multiplied ([`CpuMatmul::resolve`]: `int8`
    /// falls back to `f32` on a CPU without an int8 dot product).
    pub fn with_cpu_matmul(mut self, mode: CpuMatmul) -> Self {
        self.per_product = mode.per_product();
        self.int8 = match mode.resolve() {
            _ if self.per_product => Int8Isa::detect(),
            CpuMatmul::Int8 => Int8Isa::detect(),
            _ => None,
        };
        self
    }

    /// How quantized weights are multiplied: `Int8` or `F32` for every product, or
    /// `Auto` when [`auto_int8`] picks per product (a CPU without an int8 path: `F32`).
    pub fn cpu_matmul(&self) -> CpuMatmul {
        match (self.int8, self.per_product) {
            (Some(_), true) => CpuMatmul::Auto,
            (Some(_), false) => CpuMatmul::Int8,
            (None, _) => CpuMatmul::F32,
        }
    }

    /// The int8 path's ISA when a product of `format` weights with `m` rows takes it.
    fn int8_for(&self, format: DType, m: usize) -> Option<Int8Isa> {
        let isa = self.int8?;
        let wanted = int8_supported(format) && (!self.per_product || auto_int8(format, m));
        (wanted && !crate::cpu::scalar_forced()).then_some(isa)
    }

    /// Whether `auto` runs a product of `format` weights with `m` rows on the
    /// int16-activation kernels ([`crate::cpu::int16_matmul::applies`]).
    fn int16_for(&self, format: DType, m: usize) -> bool {
        self.per_product && self.int8_for(format, m).is_none() && int16_matmul::applies(format, m)
    }

    /// The pool the kernels run on.
    pub fn pool(&self) -> &ThreadPool {
        &self.pool
    }
}

fn check_range(what: &'static str, range: &Range<usize>, len: usize) -> Result<(), KernelError> {
    if range.start > range.end || range.end > len {
        return Err(KernelError::OutOfRange {
            what,
            value: range.end.max(range.start),
            limit: len + 1,
        });
    }
    Ok(())
}

impl DeviceMemory for CpuBackend {
    type Buffer = Vec<f32>;
    type View<'a> = &'a [f32];
    type ViewMut<'a> = &'a mut [f32];

    fn name(&self) -> &'static str {
        "cpu"
    }

    fn zeros(&self, len: usize) -> Result<Vec<f32>, KernelError> {
        Ok(vec![0.0; len])
    }

    fn alloc(&self, len: usize) -> Result<Vec<f32>, KernelError> {
        // Zeroed pages come straight from the allocator; uninitialized f32s would be UB.
        self.zeros(len)
    }

    fn upload(&self, host: &[f32]) -> Result<Vec<f32>, KernelError> {
        Ok(host.to_vec())
    }

    fn download(&self, src: &[f32], host: &mut [f32]) -> Result<(), KernelError> {
        check_len("download host", src.len(), host.len())?;
        host.copy_from_slice(src);
        Ok(())
    }

    fn len(&self, buf: &Vec<f32>) -> usize {
        buf.len()
    }

    fn view_len(&self, v: &[f32]) -> usize {
        v.len()
    }

    fn view<'a>(&self, buf: &'a Vec<f32>, range: Range<usize>) -> Result<&'a [f32], KernelError> {
        check_range("view range", &range, buf.len())?;
        Ok(&buf[range])
    }

    fn view_mut<'a>(
        &self,
        buf: &'a mut Vec<f32>,
        range: Range<usize>,
    ) -> Result<&'a mut [f32], KernelError> {
        check_range("view range", &range, buf.len())?;
        Ok(&mut buf[range])
    }
}

impl KvStorage for CpuBackend {
    type KvBuffer = KvStore;
    type KvView<'a> = KvRef<'a>;
    type KvViewMut<'a> = KvMut<'a>;

    fn kv_zeros(
        &self,
        dtype: KvCacheDType,
        len: usize,
        row_len: usize,
    ) -> Result<KvStore, KernelError> {
        KvStore::zeros(dtype, len, row_len)
    }

    fn kv_len(&self, buf: &KvStore) -> usize {
        buf.len()
    }

    fn kv_view<'a>(&self, buf: &'a KvStore, range: Range<usize>) -> Result<KvRef<'a>, KernelError> {
        buf.checked_view(range)
    }

    fn kv_view_mut<'a>(
        &self,
        buf: &'a mut KvStore,
        range: Range<usize>,
    ) -> Result<KvMut<'a>, KernelError> {
        buf.checked_view_mut(range)
    }

    fn kv_download(&self, src: KvRef<'_>, host: &mut [f32]) -> Result<(), KernelError> {
        check_len("kv_download host", src.len(), host.len())?;
        src.decode(0, host);
        Ok(())
    }
}

impl WeightStorage for CpuBackend {
    type Matrix = WeightMatrix;
    type Rope = RopeTable;

    fn upload_matrix(&self, w: &WeightMatrix) -> Result<WeightMatrix, KernelError> {
        Ok(w.clone()) // shares the storage
    }

    fn matrix_shape(&self, w: &WeightMatrix) -> (usize, usize, DType) {
        (w.rows(), w.cols(), w.format())
    }

    fn rope_table(
        &self,
        head_dim: usize,
        theta: f32,
        scaling: RopeScalingKind,
        max_positions: usize,
    ) -> Result<RopeTable, KernelError> {
        Ok(RopeTable::new(head_dim, theta, scaling, max_positions))
    }
}

impl StepQueues for CpuBackend {}

impl DenseOps for CpuBackend {
    fn matmul(
        &self,
        x: &[f32],
        m: usize,
        w: &WeightMatrix,
        out: &mut [f32],
        precision: Precision,
    ) -> Result<(), KernelError> {
        if let Some(isa) = self.int8_for(w.format(), m) {
            return matmul_int8(&self.pool, x, m, w, out, isa);
        }
        if self.int16_for(w.format(), m) {
            return int16_matmul::matmul(&self.pool, x, m, w, out);
        }
        matmul_with_precision(&self.pool, x, m, w, out, precision)
    }

    fn matmul_each(
        &self,
        x: &[f32],
        m: usize,
        mut products: Vec<(&WeightMatrix, &mut [f32])>,
        precision: Precision,
    ) -> Result<(), KernelError> {
        // x is quantized once for products all on the int16 kernels; the f32 fused path
        // runs products together when none takes a quantized-activation path.
        if !products.is_empty() && products.iter().all(|(w, _)| self.int16_for(w.format(), m)) {
            return int16_matmul::matmul_each(&self.pool, x, m, &mut products);
        }
        let quantized_acts = products
            .iter()
            .any(|(w, _)| self.int8_for(w.format(), m).is_some() || self.int16_for(w.format(), m));
        if !quantized_acts
            && crate::cpu::matmul::matmul_each_small(
                &self.pool,
                x,
                m,
                &mut products,
                crate::cpu::isa(),
            )?
        {
            return Ok(());
        }
        for (w, out) in products {
            self.matmul(x, m, w, out, precision)?;
        }
        Ok(())
    }

    fn rms_norm(
        &self,
        x: &[f32],
        weight: &[f32],
        eps: f32,
        out: &mut [f32],
    ) -> Result<(), KernelError> {
        rms_norm(x, weight, eps, out)
    }

    fn rms_norm_inplace(&self, x: &mut [f32], weight: &[f32], eps: f32) -> Result<(), KernelError> {
        rms_norm_inplace(x, weight, eps)
    }

    fn silu_mul(&self, gate: &[f32], up: &[f32], out: &mut [f32]) -> Result<(), KernelError> {
        silu_mul(gate, up, out)
    }

    fn add(&self, a: &mut [f32], b: &[f32]) -> Result<(), KernelError> {
        add_inplace(a, b)
    }

    fn add_bias(&self, x: &mut [f32], bias: &[f32]) -> Result<(), KernelError> {
        add_bias(x, bias)
    }

    fn copy(&self, src: &[f32], dst: &mut [f32]) -> Result<(), KernelError> {
        check_len("copy destination", src.len(), dst.len())?;
        dst.copy_from_slice(src);
        Ok(())
    }

    fn fill(&self, x: &mut [f32], value: f32) -> Result<(), KernelError> {
        x.fill(value);
        Ok(())
    }

    fn copy_strided(
        &self,
        src: (&[f32], Strided),
        dst: (&mut [f32], Strided),
        rows: usize,
        width: usize,
    ) -> Result<(), KernelError> {
        copy_strided(src, dst, rows, width)
    }

    fn gather_rows(
        &self,
        src: &[f32],
        width: usize,
        rows: &[usize],
        dst: &mut [f32],
    ) -> Result<(), KernelError> {
        gather_rows(src, width, rows, dst)
    }

    fn scatter_add_rows(
        &self,
        src: &[f32],
        width: usize,
        rows: &[usize],
        scales: &[f32],
        dst: &mut [f32],
    ) -> Result<(), KernelError> {
        scatter_add_rows(src, width, rows, scales, dst)
    }

    fn rope(
        &self,
        table: &RopeTable,
        x: &mut [f32],
        positions: &[usize],
        stride: usize,
        offset: usize,
        interleaved: bool,
    ) -> Result<(), KernelError> {
        let width = rope_token_width(x.len(), positions.len())?;
        if positions.is_empty() {
            return Ok(());
        }
        for (token, &pos) in x.chunks_exact_mut(width).zip(positions) {
            if offset == 0 && stride == table.head_dim() {
                table.apply(token, width / stride.max(1), pos, interleaved)?;
            } else {
                table.apply_strided(token, stride, offset, pos, interleaved)?;
            }
        }
        Ok(())
    }

    fn embedding(
        &self,
        table: &WeightMatrix,
        ids: &[u32],
        out: &mut [f32],
    ) -> Result<(), KernelError> {
        table.gather_rows(ids, out)
    }
}

impl AttentionOps for CpuBackend {
    fn write_kv(
        &self,
        k_cache: KvMut<'_>,
        v_cache: KvMut<'_>,
        n_kv_heads: usize,
        head_dim: usize,
        slots: &[usize],
        k: &[f32],
        v: &[f32],
    ) -> Result<(), KernelError> {
        write_kv_typed(k_cache, v_cache, n_kv_heads, head_dim, slots, k, v)
    }

    fn write_rows(
        &self,
        cache: KvMut<'_>,
        width: usize,
        slots: &[usize],
        rows: &[f32],
    ) -> Result<usize, KernelError> {
        write_rows(cache, width, slots, rows)
    }

    fn paged_attention(
        &self,
        q: &[f32],
        p: &PagedAttentionParams<'_>,
        k_cache: KvRef<'_>,
        v_cache: KvRef<'_>,
        out: &mut [f32],
        lse: &mut [f32],
    ) -> Result<(), KernelError> {
        let batch = AttentionBatch { q, params: *p };
        paged_attention_typed(&self.pool, &batch, k_cache, v_cache, out, lse)
    }

    fn latent_attention(
        &self,
        q: &[f32],
        p: &LatentAttentionParams<'_>,
        cache: KvRef<'_>,
        out: &mut [f32],
        lse: &mut [f32],
    ) -> Result<(), KernelError> {
        let batch = LatentBatch { q, params: *p };
        latent_attention_typed(&self.pool, &batch, cache, out, lse)
    }

    fn merge_lse(
        &self,
        partial_out: &[&[f32]],
        partial_lse: &[&[f32]],
        n_rows: usize,
        head_dim: usize,
        out: &mut [f32],
        lse: &mut [f32],
    ) -> Result<(), KernelError> {
        merge_partials(partial_out, partial_lse, n_rows, head_dim, out, lse)
    }

    fn scale_by_lse_share(
        &self,
        out: &mut [f32],
        lse: &[f32],
        all_lse: &[f32],
        parts: usize,
        head_dim: usize,
    ) -> Result<(), KernelError> {
        scale_by_lse_share(out, lse, all_lse, parts, head_dim)
    }
}

impl SamplingOps for CpuBackend {
    fn route_experts(
        &self,
        logits: &[f32],
        p: &RouterParams,
        correction_bias: Option<&[f32]>,
    ) -> Result<Routing, KernelError> {
        route_experts(logits, p, correction_bias)
    }

    fn argmax(&self, logits: &[f32], vocab: usize) -> Result<Vec<u32>, KernelError> {
        if vocab == 0 || !logits.len().is_multiple_of(vocab) {
            return Err(KernelError::Shape(format!(
                "argmax: {} logits are not rows of {vocab}",
                logits.len()
            )));
        }
        Ok(logits.chunks_exact(vocab).map(argmax).collect())
    }

    fn sample(
        &self,
        logits: &[f32],
        params: &SamplingParams,
        rng: &mut Rng,
    ) -> Result<u32, KernelError> {
        if logits.is_empty() {
            return Err(KernelError::Shape("sample: empty logits".into()));
        }
        Ok(sample(logits, params, rng))
    }

    /// The host sampler itself, row by row (never `None`).
    fn sample_rows(
        &self,
        logits: &[f32],
        vocab: usize,
        draws: &[RowDraw<'_>],
    ) -> Result<Vec<Option<RowDrawn>>, KernelError> {
        check_draws(logits.len(), vocab, draws)?;
        Ok(draws
            .iter()
            .map(|d| Some(draw_row_on_host(&logits[d.row * vocab..][..vocab], d)))
            .collect())
    }
}

impl HostViews for CpuBackend {
    fn host<'a>(v: &'a [f32]) -> &'a [f32]
    where
        Self: 'a,
    {
        v
    }

    fn host_mut<'a>(v: &'a mut [f32]) -> &'a mut [f32]
    where
        Self: 'a,
    {
        v
    }

    fn of_host<'a>(s: &'a [f32]) -> &'a [f32]
    where
        Self: 'a,
    {
        s
    }

    fn of_host_mut<'a>(s: &'a mut [f32]) -> &'a mut [f32]
    where
        Self: 'a,
    {
        s
    }
}
