//! MERGE POINT (issue #13): a CUDA rank's backend and collectives.
//!
//! This branch has the GPU collectives (`dcpserve_kernels::cuda_comm`) but not the CUDA
//! backend, so [`cuda_rank_backend`] checks the driver and the rank's GPU, then refuses.
//! When `CudaBackend` is merged it becomes:
//!
//! ```text
//! pub(crate) fn cuda_rank_backend(rank: usize, specs: &RankCommSpecs)
//!     -> Result<(CudaBackend, RankChannels<CudaBackend>), String>
//! {
//!     let visible = cuda_devices_for_ranks().map_err(|e| format!("--device cuda: {e}"))?;
//!     let gpu = gpu_for_rank(rank, visible).ok_or("no CUDA device is visible")?;
//!     let backend = CudaBackend::new(gpu).map_err(|e| e.to_string())?;
//!     let comms = connect_gpu(specs, rank, backend.stream().clone())?; // GPU collectives
//!     Ok((backend, comms))
//! }
//! ```
//!
//! and `rank::compute_thread`'s `Device::Cuda` arm calls `run_rank(args, backend, comms,
//! …)`, as the CPU arm does. `connect_gpu` mirrors `RankCommSpecs::connect`: for each
//! micro-batch's world and DCP group spec, `cuda_comm::join_gpu_group(spec.id.0,
//! spec.group_rank(rank), spec.ranks.len(), stream, …)` (which picks NCCL or device-local
//! copies and says why: log it), wrapped as `Arc<dyn Collectives<CudaBackend>>` through
//! the glue described in `cuda_comm`'s module doc. The world group of a layout with more
//! ranks than GPUs on several GPUs (e.g. 4 ranks on 2 GPUs) has no transport yet
//! (`GpuCommKind::Unsupported`).

use std::convert::Infallible;

use dcpserve_kernels::cuda_comm::cuda_devices_for_ranks;
use dcpserve_kernels::device::gpu_for_rank;

use crate::collective::RankCommSpecs;

/// Builds rank `rank`'s CUDA backend and GPU collectives — not yet: see the module doc.
/// Fails with a clear message in every case (no driver, no GPU, or no backend in this
/// build); never panics.
pub(crate) fn cuda_rank_backend(rank: usize, specs: &RankCommSpecs) -> Result<Infallible, String> {
    let visible = cuda_devices_for_ranks().map_err(|e| format!("--device cuda: {e}"))?;
    let gpu = gpu_for_rank(rank, visible)
        .ok_or("--device cuda: the CUDA driver shows no GPU to this process")?;
    let _ = specs;
    Err(format!(
        "--device cuda: the CUDA backend is not built into this binary yet (rank {rank} would run on GPU {gpu} of {visible})"
    ))
}
