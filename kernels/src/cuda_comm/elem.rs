//! Element types the GPU collectives move, and the errors of the libraries underneath.

use cudarc::driver::{DeviceRepr, DriverError, ValidAsZeroBits};
use cudarc::nccl::result::NcclError;
use cudarc::nccl::sys::ncclDataType_t;
use half::bf16;

use crate::error::KernelError;

/// An element type of GPU collectives: f32 (activations) and bf16 (activations of bf16
/// models, KV exchange). Sealed: the sum kernel exists for these two only.
pub trait GpuCommElem: DeviceRepr + ValidAsZeroBits + Copy + Send + Sync + 'static {
    /// NCCL's name of the type.
    const NCCL: ncclDataType_t;
    /// The device-local sum kernel for the type (in `sum.cu`).
    const SUM_KERNEL: &'static str;
}

impl GpuCommElem for f32 {
    const NCCL: ncclDataType_t = ncclDataType_t::ncclFloat32;
    const SUM_KERNEL: &'static str = "dcp_sum_f32";
}

impl GpuCommElem for bf16 {
    const NCCL: ncclDataType_t = ncclDataType_t::ncclBfloat16;
    const SUM_KERNEL: &'static str = "dcp_sum_bf16";
}

/// A CUDA driver error as a [`KernelError`], saying which call failed.
pub(crate) fn drv(what: &str) -> impl FnOnce(DriverError) -> KernelError + '_ {
    move |e| KernelError::Comm(format!("{what}: CUDA driver error {e:?}"))
}

/// An NCCL error as a [`KernelError`], saying which call failed.
pub(crate) fn nccl(what: &str) -> impl FnOnce(NcclError) -> KernelError + '_ {
    // NcclError's Debug prints no code; its field is the ncclResult_t.
    move |e| KernelError::Comm(format!("{what}: NCCL error {:?}", e.0))
}
