//! A CUDA rank's backend and collectives: the rank's GPU (rank r on GPU r mod the
//! visible count), its [`CudaBackend`] (one context and stream), and one GPU group
//! handle per communicator group of its [`RankCommSpecs`] — NCCL when the group's
//! ranks are on distinct GPUs, device-to-device copies when some share one (NCCL
//! refuses two ranks of a communicator on one device; e.g. 4 ranks on 2 GPUs use peer
//! copies between the GPUs); the choice is logged.
//!
//! Not yet: GPU ranks in several processes (a group spanning processes needs an NCCL
//! id sent over MPI, `Transport::Nccl`), two micro-batches (overlap) and modeled links.
//! Each is refused here with a message saying so.

use std::sync::Arc;
use std::time::Duration;

use dcpserve_kernels::comm::{CommGroupSpec, Transport};
use dcpserve_kernels::cuda_comm::{cuda_devices_for_ranks, join_gpu_group};
use dcpserve_kernels::device::gpu_for_rank;
use dcpserve_kernels::{Collectives, CudaBackend, GpuMatmul};
use dcpserve_model::arch::RankComms;

use crate::collective::{RankChannels, RankCommSpecs};

/// How long a rank waits for the other ranks of a GPU group to arrive (they load
/// nothing before joining, so this only covers thread start-up).
const JOIN_PATIENCE: Duration = Duration::from_secs(120);

/// Rank `rank`'s CUDA backend and its GPU collectives. Fails with a clear message (no
/// driver, no GPU, an unsupported layout); never panics.
pub(crate) fn cuda_rank_backend(
    rank: usize,
    specs: &RankCommSpecs,
    gpu_matmul: GpuMatmul,
) -> Result<(CudaBackend, RankChannels<CudaBackend>), String> {
    let visible = cuda_devices_for_ranks().map_err(|e| format!("--device cuda: {e}"))?;
    let gpu = gpu_for_rank(rank, visible)
        .ok_or("--device cuda: the CUDA driver shows no GPU to this process")?;
    if specs.micro_batches.len() > 1 {
        return Err(
            "--device cuda: two micro-batches (overlap_micro_batches) are not \
                    supported on GPU ranks yet"
                .into(),
        );
    }
    if specs.link.is_some() {
        return Err("--device cuda: a modeled link is a CPU benchmark setting".into());
    }
    let backend = CudaBackend::new(gpu)
        .map(|b| b.with_gpu_matmul(gpu_matmul))
        .map_err(|e| format!("--device cuda, GPU {gpu}: {e}"))?;
    let join =
        |spec: &CommGroupSpec, what: &str| -> Result<Arc<dyn Collectives<CudaBackend>>, String> {
            if !matches!(spec.transport, Transport::SharedMemory) {
                return Err(format!(
                    "--device cuda: the {what} group spans processes; GPU ranks in several \
                 processes are not supported yet"
                ));
            }
            let group_rank = spec
                .group_rank(rank)
                .ok_or_else(|| format!("rank {rank} is not in its {what} group"))?;
            let (c, kind) = join_gpu_group(
                spec.id.0,
                group_rank,
                spec.ranks.len(),
                backend.stream().clone(),
                JOIN_PATIENCE,
            )
            .map_err(|e| format!("--device cuda, {what} group: {e}"))?;
            if group_rank == 0 {
                tracing::info!(rank, group = what, "GPU collectives: {kind}");
            }
            Ok(Arc::new(c))
        };
    let micro_batches = specs
        .micro_batches
        .iter()
        .map(|mb| {
            Ok(RankComms {
                world: join(&mb.world, "tensor-parallel")?,
                dcp: join(&mb.dcp, "DCP")?,
                dcp_merge: specs.dcp_merge,
            })
        })
        .collect::<Result<_, String>>()?;
    Ok((
        backend,
        RankChannels {
            micro_batches,
            baton: None,
        },
    ))
}
