//! Which GPU communicator a group of ranks gets: NCCL, or in-process device copies.

use std::fmt;

/// The transport a group of GPU ranks uses, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuCommKind {
    /// Every rank has its own GPU: NCCL ([`super::NcclCollectives`]).
    Nccl {
        /// The device ordinal of each rank, in group order.
        devices: Vec<usize>,
    },
    /// All ranks share one GPU: device-to-device copies and a sum kernel between the
    /// ranks' streams ([`super::DeviceLocalCollectives`]). NCCL refuses two ranks of one
    /// communicator on one device.
    DeviceLocal {
        /// The one device ordinal the ranks share.
        device: usize,
        /// Ranks in the group.
        ranks: usize,
    },
    /// Some ranks share a GPU and others do not (placement `rank mod visible GPUs` gives
    /// it for a group larger than the GPU count on more than one GPU, e.g. 4 ranks on 2
    /// GPUs: `[0, 1, 0, 1]`): NCCL refuses the shared GPUs, so the ranks (threads of one
    /// process) use the device-local communicator across GPUs, with peer copies
    /// (`cuMemcpyPeerAsync`) between GPUs ([`super::DeviceLocalCollectives`]).
    InProcess {
        /// The device ordinal of each rank, in group order.
        devices: Vec<usize>,
    },
}

/// Picks the communicator for a group whose rank `i` runs on GPU `devices[i]`: NCCL when
/// the ranks are on distinct GPUs (a group of one included), the device-local
/// communicator otherwise (on one GPU, or across GPUs of which some are shared). Log the
/// result's [`Display`](fmt::Display): it says which and why.
///
/// ```
/// use dcpserve_kernels::cuda_comm::{choose_gpu_collectives, GpuCommKind};
/// assert!(matches!(choose_gpu_collectives(&[0, 1]), GpuCommKind::Nccl { .. }));
/// assert!(matches!(choose_gpu_collectives(&[0, 0]), GpuCommKind::DeviceLocal { device: 0, ranks: 2 }));
/// assert!(matches!(choose_gpu_collectives(&[0, 1, 0, 1]), GpuCommKind::InProcess { .. }));
/// ```
pub fn choose_gpu_collectives(devices: &[usize]) -> GpuCommKind {
    let mut sorted = devices.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    if sorted.len() == devices.len() {
        GpuCommKind::Nccl {
            devices: devices.to_vec(),
        }
    } else if sorted.len() == 1 {
        GpuCommKind::DeviceLocal {
            device: sorted[0],
            ranks: devices.len(),
        }
    } else {
        GpuCommKind::InProcess {
            devices: devices.to_vec(),
        }
    }
}

impl fmt::Display for GpuCommKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuCommKind::Nccl { devices } => write!(
                f,
                "NCCL: the group's {} rank(s) are on distinct GPUs {devices:?}",
                devices.len()
            ),
            GpuCommKind::DeviceLocal { device, ranks } => write!(
                f,
                "device-local copies: the group's {ranks} ranks share GPU {device} (NCCL refuses two ranks of one communicator on one GPU)"
            ),
            GpuCommKind::InProcess { devices } => write!(
                f,
                "in-process device copies: the group's ranks are on GPUs {devices:?}, some shared (NCCL refuses two ranks of one communicator on one GPU); peer copies between GPUs"
            ),
        }
    }
}
