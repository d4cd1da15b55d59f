//! `--device` checked when an engine starts, before any weight is read: a machine
//! without a CUDA driver gets a clear error instead of a failure deep in loading.

use dcpserve_kernels::cuda_comm::cuda_devices_for_ranks;
use dcpserve_kernels::Device;

use crate::error::{Error, Result};

/// Checks that the ranks' device is there: always for the CPU; for CUDA, that the
/// driver loads and shows at least one GPU (rank `r` then runs on GPU `r mod count`).
pub(crate) fn check_device(device: Device) -> Result<()> {
    match device {
        Device::Cpu => Ok(()),
        Device::Cuda => {
            let visible = cuda_devices_for_ranks()
                .map_err(|e| Error::Config(format!("--device cuda: {e}")))?;
            tracing::info!(
                "--device cuda: {visible} visible GPU(s); rank r runs on GPU r mod {visible}"
            );
            Ok(())
        }
    }
}
