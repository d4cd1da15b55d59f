//! A CUDA rank's backend and collectives: the rank's GPU (rank r on GPU r mod the
//! visible count), its [`CudaBackend`] (one context, one stream per micro-batch), and
//! one GPU group handle per communicator group of its [`RankCommSpecs`] — NCCL when the
//! group's ranks are on distinct GPUs, device-to-device copies when some share one
//! (NCCL refuses two ranks of a communicator on one device; e.g. 4 ranks on 2 GPUs use
//! peer copies between the GPUs); the choice is logged.
//!
//! Two micro-batches (overlap): each micro-batch's compute thread binds its own
//! stream, and its groups are built on that stream, so micro-batch 0's collectives
//! run on the GPU while micro-batch 1's kernels do, with no host wait between them.
//!
//! Not yet: GPU ranks in several processes (a group spanning processes needs an NCCL
//! id sent over MPI, `Transport::Nccl`) and modeled links. Each is refused here with a
//! message saying so.

use std::sync::Arc;
use std::time::Duration;

use dcpserve_config::RankSettings;
use dcpserve_kernels::comm::{CommGroupSpec, Transport};
use dcpserve_kernels::cuda_comm::{cuda_devices_for_ranks, join_gpu_group};
use dcpserve_kernels::device::gpu_for_rank;
use dcpserve_kernels::{Collectives, CudaBackend};
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
    settings: &RankSettings,
) -> Result<(CudaBackend, RankChannels<CudaBackend>), String> {
    let visible = cuda_devices_for_ranks().map_err(|e| format!("--device cuda: {e}"))?;
    let gpu = gpu_for_rank(rank, visible)
        .ok_or("--device cuda: the CUDA driver shows no GPU to this process")?;
    check_cuda_specs(specs)?;
    let backend = CudaBackend::with_micro_batches(gpu, specs.micro_batches.len())
        .map(|b| {
            b.with_gpu_matmul(settings.gpu_matmul)
                .with_cuda_graphs(settings.cuda_graphs)
        })
        .map_err(|e| format!("--device cuda, GPU {gpu}: {e}"))?;
    let join = |spec: &CommGroupSpec,
                what: &str,
                mb: usize|
     -> Result<Arc<dyn Collectives<CudaBackend>>, String> {
        if !matches!(spec.transport, Transport::SharedMemory) {
            return Err(format!(
                "--device cuda: the {what} group spans processes; GPU ranks in several \
                 processes are not supported yet"
            ));
        }
        let group_rank = spec
            .group_rank(rank)
            .ok_or_else(|| format!("rank {rank} is not in its {what} group"))?;
        // The group enqueues on this micro-batch's stream, ordered with its kernels.
        let stream = backend
            .stream_of(mb)
            .ok_or_else(|| format!("micro-batch {mb} has no stream"))?;
        let (c, kind) = join_gpu_group(
            spec.id.0,
            group_rank,
            spec.ranks.len(),
            stream.clone(),
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
        .enumerate()
        .map(|(i, mb)| {
            Ok(RankComms {
                world: join(&mb.world, "tensor-parallel", i)?,
                dcp: join(&mb.dcp, "DCP", i)?,
                dcp_merge: specs.dcp_merge,
                split: specs.split,
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

/// What a CUDA rank refuses before touching the driver: a modeled link (a CPU
/// benchmark setting). One or two micro-batches are both fine.
pub(crate) fn check_cuda_specs(specs: &RankCommSpecs) -> Result<(), String> {
    if specs.micro_batches.is_empty() {
        return Err("--device cuda: a rank without a micro-batch".into());
    }
    if specs.link.is_some() {
        return Err("--device cuda: a modeled link is a CPU benchmark setting".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use dcpserve_kernels::dcp::{Layout, MergeExchange};
    use dcpserve_kernels::LinkModel;

    use super::*;
    use crate::collective::GroupLayout;
    use crate::process_map::ProcessMap;

    fn specs(micro_batches: usize, link: Option<LinkModel>) -> RankCommSpecs {
        let layout = Layout::new(2, 1, 1, 16, micro_batches).unwrap();
        GroupLayout::new(&layout, &ProcessMap::single(2))
            .unwrap()
            .rank_specs(&layout, 1, link, MergeExchange::default())
    }

    #[test]
    fn two_micro_batches_pass_the_cuda_checks() {
        assert!(check_cuda_specs(&specs(1, None)).is_ok());
        assert!(check_cuda_specs(&specs(2, None)).is_ok());
        let link = LinkModel {
            latency: std::time::Duration::from_micros(5),
            bytes_per_second: 1e9,
        };
        let e = check_cuda_specs(&specs(2, Some(link))).unwrap_err();
        assert!(e.contains("modeled link"), "{e}");
    }

    #[test]
    fn two_micro_batches_fail_cleanly_without_a_driver() {
        if dcpserve_kernels::cuda_comm::check_driver().is_ok() {
            eprintln!("skipped: this machine has a CUDA driver");
            return;
        }
        let e = cuda_rank_backend(1, &specs(2, None), &RankSettings::default())
            .err()
            .unwrap();
        assert!(e.starts_with("--device cuda"), "{e}");
    }
}
