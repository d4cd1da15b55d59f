//! The CUDA backend: [`CudaBackend`] implements [`Backend`](crate::Backend) on one
//! NVIDIA GPU through cudarc (driver API, NVRTC, cuBLAS), all loaded at run time, so
//! this module builds and lints everywhere and fails with
//! [`KernelError::Unavailable`] (never a panic) where there is no driver or device.
//!
//! * Memory: buffers are cudarc [`CudaSlice<f32>`]; [`CudaRef`] (read-only, `Copy`) and
//!   [`CudaViewMut<f32>`] are the views; KV caches are [`CudaKvBuffer`]s of any
//!   [`KvCacheDType`](crate::KvCacheDType) (bf16 is the usual choice on a GPU).
//! * Weights: f32 matrices stay f32; every other format (f16, bf16, the GGML quants) is
//!   decoded on the host and stored as bf16 at upload ([`CudaMatrix`]). `matmul` uses
//!   cuBLAS (SGEMM for f32; bf16 tensor-core GEMM with f32 accumulation for bf16
//!   weights, the default [`GpuMatmul::Bf16`] and always under
//!   [`Precision::Fast`](crate::Precision::Fast)) and, with [`GpuMatmul::Exact`], an
//!   exact bf16-weight kernel for [`Precision::Exact`](crate::Precision::Exact) products.
//! * Kernels: CUDA C in `kernels/src/cuda/kernels/*.cu`, compiled by NVRTC to a CUBIN
//!   for the device's architecture once per process ([`compile_kernels`]).
//! * One context (the device's primary context, shared by every backend on that GPU)
//!   and one stream per micro-batch of the backend's rank (`lanes`): several backends
//!   (ranks) may share a GPU, each ordering its own work, and a rank's two
//!   micro-batches overlap (one's collectives while the other computes). Every op is
//!   enqueued on the calling thread's stream ([`CudaBackend::stream`], chosen by
//!   [`StepQueues::bind_micro_batch`](crate::StepQueues::bind_micro_batch)); a micro-batch's
//!   collectives belong on it too (cudarc's cross-stream event tracking is off for the
//!   backend's context).
//! * Step metadata (positions, slots, block tables) is staged per op in the stream's
//!   pinned arena and copied asynchronously into its device arena (`staging`): no
//!   host wait and no allocation per op;
//!   [`StepQueues::begin_step`](crate::StepQueues::begin_step) recycles it. Op temporaries
//!   (attention split partials, bf16 copies of GEMM inputs) live in the stream's
//!   reused scratch (`scratch`).
//! * CUDA graphs (`graphs`, [`CudaGraphs`], on by default): a decode step of a dense
//!   model on one rank (no collectives: NCCL needs all ranks to capture together) runs
//!   through [`step_graph::run_step`](crate::step_graph::run_step); every
//!   kernel, copy, GEMM and NCCL call is issued with its full signature, so a step
//!   whose signatures hash to a stored graph's key launches that graph instead, and a
//!   new one is captured otherwise. Steps that download, wait, allocate or meet other
//!   ranks on the host (MoE routing) run eagerly, and a
//!   stream whose steps keep doing so stops trying.
//! * Sampling: `sample_rows`, which the answering rank uses, draws every row on the
//!   device (`kernels/sampling.cu`) and brings back only the tokens and the
//!   log-probabilities asked for; it leaves to the host the rows it cannot draw
//!   exactly (NaN or +inf logits, a top-k above [`SORT_CAP`], a top-p nucleus past the
//!   [`SORT_CAP`] most likely tokens, more than [`MAX_TOP_LOGPROBS`] top
//!   log-probabilities), and its draws equal the host's except within rounding of a
//!   boundary (parallel f64 sums).
//! * Stated limitations: `sample` (one row with a generator; the ranks use
//!   `sample_rows`) downloads the logits and runs the CPU function (`route_experts`
//!   routes on the device up to 1024 experts, wider on the host); attention reads each
//!   KV head once per query head (no GQA sharing inside a block yet); block tables are
//!   staged again for every layer's attention (identical within a step); with `--gpu-matmul
//!   exact`, products with bf16 weights use a simple kernel, fast for decode but not
//!   for large prefill batches; prefill attention is one block per (token, head)
//!   without tiling or tensor cores.
//!   Nothing here has run on a GPU yet: the kernels compile (NVRTC, CI), the CUDA arms
//!   of the op tests await a device (`scripts/gpu-check.sh` runs them there).
//!
//! Libraries: `libcuda.so.1` from the driver; `libnvrtc.so.13` and `libcublas.so.13`
//! from the loader path or from [`NVRTC_LIB_DIR_ENV`] / [`CUDA_LIB_DIR_ENV`].

mod attention;
mod backend;
mod device;
mod graphs;
mod kv;
mod lanes;
mod launch;
mod matmul;
mod memory;
mod module;
mod ops;
mod routing;
mod sampling;
mod scratch;
mod staging;

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DeviceRepr, LaunchConfig};

pub use cudarc::driver::{CudaView, CudaViewMut};
pub use device::{
    cuda_device_count, cuda_driver_version, cuda_total_memory, CUDA_LIB_DIR_ENV, NVRTC_LIB_DIR_ENV,
};
pub use graphs::GraphStats;
pub use matmul::CudaMatrix;
pub use memory::{CudaKvBuffer, CudaKvMut, CudaKvRef, CudaRef};
pub use module::{compile_kernels, CompiledSource, KernelSource, SOURCES};
pub use ops::CudaRope;
pub use sampling::{MAX_TOP_LOGPROBS, SORT_CAP};

use crate::device::{CudaGraphs, GpuMatmul};
use crate::error::KernelError;
use crate::step_graph;
use device::{
    driver_err, keep_pool_memory, require_cublas, require_cuda13, require_driver, require_nvrtc,
};
use lanes::Lane;
pub(crate) use launch::KernelLaunch;
use module::{cached_kernels, Kernels};

/// Threads per block of the element-wise kernels.
const BLOCK: u32 = 256;

/// One GPU as a [`Backend`](crate::Backend): a context, one stream per micro-batch
/// (each with its cuBLAS handle; see [`CudaBackend::with_micro_batches`]) and the
/// loaded kernels.
///
/// ```
/// use dcpserve_kernels::cuda::CudaBackend;
/// use dcpserve_kernels::KernelError;
/// match CudaBackend::new(0) {
///     Ok(gpu) => println!("{} on {}", dcpserve_kernels::DeviceMemory::name(&gpu), gpu.device_name()),
///     // No driver or no GPU: a clear error, never a panic.
///     Err(KernelError::Unavailable(why)) => println!("no CUDA: {why}"),
///     Err(e) => panic!("{e}"),
/// }
/// ```
pub struct CudaBackend {
    /// Each lane's captured step graphs (`graphs`); first, so they are destroyed before
    /// the streams and the kernel modules they use (fields drop in order).
    graphs: Vec<std::sync::Mutex<graphs::LaneGraphs>>,
    ctx: Arc<CudaContext>,
    /// One lane (stream, cuBLAS handle) per micro-batch; ops go to the calling
    /// thread's bound lane ([`lanes::bound`]).
    lanes: Vec<Lane>,
    /// Keys this backend's thread-local lane binding.
    id: u64,
    kernels: Kernels,
    name: String,
    /// How products with bf16 weights run (`--gpu-matmul`).
    gpu_matmul: GpuMatmul,
    /// Whether decode steps may run as CUDA graphs (`--cuda-graphs`).
    cuda_graphs: CudaGraphs,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend")
            .field("ordinal", &self.ctx.ordinal())
            .field("device", &self.name)
            .finish()
    }
}

impl CudaBackend {
    /// A backend on device `ordinal` (as `CUDA_VISIBLE_DEVICES` numbers them), with its
    /// own stream on the device's primary context: [`CudaBackend::with_micro_batches`]
    /// with one micro-batch. Compiles the kernels on first use
    /// in the process (NVRTC, for the device's architecture). Errors:
    /// [`KernelError::Unavailable`] without a driver (for CUDA 13 or newer), a device,
    /// NVRTC or cuBLAS;
    /// [`KernelError::Device`] when the driver fails.
    pub fn new(ordinal: usize) -> Result<CudaBackend, KernelError> {
        Self::with_micro_batches(ordinal, 1)
    }

    /// A backend on device `ordinal` with one stream per micro-batch (`micro_batches`,
    /// at least 1): a thread that calls
    /// [`bind_micro_batch(mb)`](crate::StepQueues::bind_micro_batch) enqueues its ops on
    /// stream `mb`, so the micro-batches of a rank overlap on the GPU. Errors as
    /// [`CudaBackend::new`].
    pub fn with_micro_batches(
        ordinal: usize,
        micro_batches: usize,
    ) -> Result<CudaBackend, KernelError> {
        require_driver()?;
        let count = cuda_device_count()?;
        if ordinal >= count {
            return Err(KernelError::Unavailable(format!(
                "no CUDA device {ordinal}: the driver shows {count} (CUDA_VISIBLE_DEVICES={})",
                std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_else(|_| "unset".into())
            )));
        }
        require_cuda13()?;
        require_nvrtc()?;
        require_cublas()?;
        let ctx = CudaContext::new(ordinal).map_err(|e| driver_err("creating a context", e))?;
        // SAFETY: cudarc's cross-stream events (a few driver calls per kernel argument)
        // are replaced by explicit ordering: a micro-batch's buffers (workspace,
        // temporaries, metadata) are allocated, used and freed on its own stream; the
        // shared ones (weights, KV cache) are written on lane 0 while loading, and
        // `bind_micro_batch` orders the binding lane after the others; NCCL and the
        // device-local collectives go on the micro-batch's own stream. While serving,
        // each micro-batch touches only its own sequences' KV blocks; a block passes to
        // the other micro-batch only after the step that last used it has answered,
        // and that answer needed every rank's last collective of the step, which its
        // stream ran after the step's attention kernels.
        unsafe { ctx.disable_event_tracking() };
        if ctx.has_async_alloc() {
            keep_pool_memory(&ctx);
        }
        let lanes = (0..micro_batches.max(1))
            .map(|_| Lane::new(&ctx))
            .collect::<Result<Vec<_>, _>>()?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| driver_err("reading the compute capability", e))?;
        let compiled = cached_kernels(&format!("sm_{major}{minor}"))?;
        let kernels = Kernels::load(&ctx, &compiled)?;
        let name = ctx.name().unwrap_or_else(|_| "CUDA device".into());
        Ok(CudaBackend {
            ctx,
            lanes,
            id: lanes::new_backend_id(),
            kernels,
            name,
            gpu_matmul: GpuMatmul::default(),
            cuda_graphs: CudaGraphs::default(),
            graphs: graphs::lane_graphs(micro_batches.max(1)),
        })
    }

    /// Sets how products with bf16 weights run: cuBLAS bf16 tensor-core GEMMs (the
    /// default; every `matmul` then runs as [`Precision::Fast`](crate::Precision::Fast)
    /// would) or the exact f32-activation kernel (each `matmul` as its caller asks).
    pub fn with_gpu_matmul(mut self, mode: GpuMatmul) -> Self {
        self.gpu_matmul = mode;
        self
    }

    /// How products with bf16 weights run.
    pub fn gpu_matmul(&self) -> GpuMatmul {
        self.gpu_matmul
    }

    /// Sets whether decode steps run as CUDA graphs (default on; see
    /// [`step_graph`](crate::step_graph)).
    pub fn with_cuda_graphs(mut self, mode: CudaGraphs) -> Self {
        self.cuda_graphs = mode;
        self
    }

    /// Whether decode steps may run as CUDA graphs.
    pub fn cuda_graphs(&self) -> CudaGraphs {
        self.cuda_graphs
    }

    /// The stream the calling thread's ops are enqueued on: its bound micro-batch's
    /// ([`bind_micro_batch`](crate::StepQueues::bind_micro_batch)), stream 0 when it bound
    /// none. A micro-batch's collectives go on it too, so they order with its kernels.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.lane().stream
    }

    /// Micro-batch `mb`'s stream (what its GPU collectives must be built with).
    pub fn stream_of(&self, mb: usize) -> Option<&Arc<CudaStream>> {
        self.lanes.get(mb).map(|l| &l.stream)
    }

    /// Micro-batches (streams) this backend serves.
    pub fn micro_batches(&self) -> usize {
        self.lanes.len()
    }

    /// The calling thread's lane.
    fn lane(&self) -> &Lane {
        &self.lanes[self.lane_index()]
    }

    /// The index of the calling thread's lane.
    fn lane_index(&self) -> usize {
        // `bind_micro_batch` refuses lanes past the end; a stale binding of a reused
        // id cannot happen (ids are never reused), so this is the bound lane.
        lanes::bound(self.id).min(self.lanes.len() - 1)
    }

    /// Binds the calling thread to lane `mb` (see `StepQueues::bind_micro_batch`).
    fn bind_lane(&self, mb: usize) -> Result<(), KernelError> {
        if mb >= self.lanes.len() {
            return Err(KernelError::Unavailable(format!(
                "micro-batch {mb}: this CUDA backend was built with {} stream(s)",
                self.lanes.len()
            )));
        }
        lanes::bind(self.id, mb);
        lanes::order_after_others(&self.lanes, mb)
    }

    /// The device's (primary) context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// The device's name, e.g. `NVIDIA H200`.
    pub fn device_name(&self) -> &str {
        &self.name
    }

    /// Total device memory in bytes.
    pub fn total_memory(&self) -> Result<usize, KernelError> {
        self.ctx
            .total_mem()
            .map_err(|e| driver_err("reading the memory size", e))
    }

    /// Free device memory in bytes (all processes' use counted).
    pub fn free_memory(&self) -> Result<usize, KernelError> {
        self.ctx
            .mem_get_info()
            .map(|(free, _)| free)
            .map_err(|e| driver_err("reading free memory", e))
    }

    /// Waits until every op the calling thread's stream holds has finished (and
    /// reports an error a kernel hit).
    pub fn synchronize(&self) -> Result<(), KernelError> {
        step_graph::refuse("waits for the stream")?;
        self.stream()
            .synchronize()
            .map_err(|e| driver_err("synchronizing the stream", e))
    }

    /// A buffer of `len` f32s, zeroed or not; a zero-length one without asking the
    /// driver for zero bytes (which it refuses).
    pub(crate) fn alloc_f32(
        &self,
        len: usize,
        zeroed: bool,
    ) -> Result<CudaSlice<f32>, KernelError> {
        step_graph::refuse_for_now("allocates device memory")?;
        let r = if len == 0 {
            self.stream().null::<f32>()
        } else if zeroed {
            self.stream().alloc_zeros::<f32>(len)
        } else {
            // SAFETY: f32 has no invalid bit patterns; callers write before reading.
            unsafe { self.stream().alloc::<f32>(len) }
        };
        r.map_err(|e| driver_err("allocating device memory", e))
    }

    /// Copies host data the device keeps (weights, RoPE tables) to a new buffer.
    pub(crate) fn upload_owned<T: DeviceRepr>(
        &self,
        host: &[T],
    ) -> Result<CudaSlice<T>, KernelError> {
        step_graph::refuse("allocates device memory")?;
        if host.is_empty() {
            // Zero-length allocations are refused by the driver; one element is harmless.
            return unsafe { self.stream().alloc::<T>(1) }.map_err(|e| driver_err("allocating", e));
        }
        self.stream()
            .clone_htod(host)
            .map_err(|e| driver_err("uploading", e))
    }

    /// Stages one op's step metadata (positions, slots, block tables, token maps) in
    /// the calling thread's lane arena: no host wait, no allocation (see
    /// `staging`). Returns each part's device address, for kernels enqueued on
    /// [`CudaBackend::stream`] by the same op.
    pub(crate) fn stage_meta<const N: usize>(
        &self,
        parts: [&[u8]; N],
    ) -> Result<[u64; N], KernelError> {
        lanes::lock(&self.lane().meta).stage(parts)
    }

    /// At least `n` f32s of the calling thread's lane scratch, for one op's kernels
    /// (see `scratch`: one call per op).
    pub(crate) fn scratch_f32(&self, n: usize) -> Result<u64, KernelError> {
        lanes::lock(&self.lane().scratch).f32s(n)
    }

    /// At least `n` u16s (bf16) of the lane scratch; as [`CudaBackend::scratch_f32`].
    pub(crate) fn scratch_u16(&self, n: usize) -> Result<u64, KernelError> {
        lanes::lock(&self.lane().scratch).u16s(n)
    }

    /// Where the calling thread's lane stages its next metadata (see `graphs`: every
    /// pass of a step stages from the same place).
    fn meta_mark(&self) -> usize {
        lanes::lock(&self.lane().meta).mark()
    }

    /// Stages the next metadata from `mark` again (a mark of this step).
    fn meta_reset(&self, mark: usize) -> Result<(), KernelError> {
        lanes::lock(&self.lane().meta).reset_to(mark)
    }

    /// Starts a step on the calling thread's lane (see `StepQueues::begin_step`).
    fn begin_lane_step(&self) -> Result<(), KernelError> {
        lanes::lock(&self.lane().meta).begin_step()
    }

    pub(crate) fn kernel(
        &self,
        name: &'static str,
    ) -> Result<&cudarc::driver::CudaFunction, KernelError> {
        self.kernels.get(name)
    }

    /// A launch of kernel `name` on the calling thread's stream, to be given its
    /// arguments (see `launch`: they form its graph signature too).
    pub(crate) fn launch_of(&self, name: &'static str) -> Result<KernelLaunch<'_>, KernelError> {
        Ok(KernelLaunch::new(name, self.kernel(name)?, self.stream()))
    }
}

/// A grid-stride launch over `n` elements.
pub(crate) fn grid(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(BLOCK as usize).clamp(1, 1 << 16) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One block of `threads` per row.
pub(crate) fn per_row(rows: usize, threads: u32) -> Result<LaunchConfig, KernelError> {
    let rows = u32::try_from(rows)
        .ok()
        .filter(|&r| r <= i32::MAX as u32)
        .ok_or_else(|| KernelError::Shape(format!("{rows} rows exceed one CUDA grid")))?;
    Ok(LaunchConfig {
        grid_dim: (rows, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    })
}

pub(crate) fn launch_err(what: &str, e: cudarc::driver::DriverError) -> KernelError {
    driver_err(&format!("launching {what}"), e)
}
