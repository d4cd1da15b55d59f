//! Collectives of GPU ranks, on cudarc's device buffers and the rank's CUDA stream.
//!
//! Two transports, picked per group by [`choose_gpu_collectives`]:
//!
//! * [`NcclCollectives`]: NCCL through cudarc's `nccl` binding, for ranks on distinct
//!   GPUs, in one process ([`NcclCollectives::group`], `ncclCommInitAll`) or several
//!   ([`NcclCollectives::from_unique_id`] with an id from [`new_nccl_unique_id`], sent
//!   to the other processes over MPI by `nccl_unique_id_over_mpi` with feature `mpi`).
//! * [`DeviceLocalCollectives`]: ranks (threads of one process) sharing one GPU —
//!   device-to-device copies and a fixed-order sum kernel (`sum.cu`, compiled by NVRTC)
//!   between their streams, ordered by events, no host wait on the GPU.
//!
//! Both offer the methods of [`crate::comm::Collectives`] under the same names and
//! semantics, as inherent methods on cudarc's `CudaView<'_, T>` / `CudaViewMut<'_, T>`
//! for `T` = f32 or bf16 ([`GpuCommElem`]), plus `broadcast`. Every call enqueues on the
//! stream the collectives were built with — the rank backend's stream — and returns.
//!
//! # Glue to the backend trait (added when the CUDA backend is merged)
//!
//! `CudaBackend` (in `crate::cuda`) has `View<'a> = CudaView<'a, f32>`,
//! `ViewMut<'a> = CudaViewMut<'a, f32>` and one `Arc<CudaStream>` (`stream()`). The glue
//! is one enum and one forwarding impl, in `cuda_comm/glue.rs`:
//!
//! ```text
//! pub enum GpuCollectives { Nccl(NcclCollectives), DeviceLocal(DeviceLocalCollectives) }
//! impl Collectives<CudaBackend> for GpuCollectives {
//!     fn rank(&self) -> usize              { match self { Nccl(c) => c.rank(), DeviceLocal(c) => c.rank() } }
//!     fn size(&self) -> usize              { …same… }
//!     fn group_start(&self)                { …c.group_start() }
//!     fn group_end(&self) -> Result<…>     { …c.group_end() }
//!     fn all_gather(&self, _dev: &CudaBackend, input, out)        { …c.all_gather::<f32>(input, out) }
//!     fn all_reduce_sum(&self, _dev, data)                         { …c.all_reduce_sum::<f32>(data) }
//!     fn reduce_scatter_sum(&self, _dev, input, out)               { …c.reduce_scatter_sum::<f32>(input, out) }
//!     fn all_gather_varying(&self, _dev, input, counts, out)       { …c.all_gather_varying::<f32>(input, counts, out) }
//!     fn all_to_all(&self, _dev, input, out)                       { …c.all_to_all::<f32>(input, out) }
//!     fn abort(&self)                                              { …c.abort() }
//! }
//! ```
//!
//! `dev` is not needed: the collectives hold the same stream as the backend (build them
//! with `backend.stream().clone()`; a debug assertion `Arc::ptr_eq(dev.stream(),
//! c.stream())` in the glue catches a mix-up). A group is built per rank group by
//! `choose_gpu_collectives(&ordinals)`: `Nccl` → `NcclCollectives::group(&streams)`
//! (one process) or `from_unique_id` (a `Transport::Nccl { unique_id }` spec, one call
//! per rank on its own thread); `DeviceLocal` → `DeviceLocalCollectives::group(&streams)`.
//!
//! # Without a GPU
//!
//! Constructors check with `dlopen` that `libcuda`, `libnvrtc` / `libnccl` load before
//! cudarc touches them (cudarc panics on a missing library) and return a
//! [`KernelError`](crate::KernelError) saying what is missing ([`probe`]).
//! Nothing here has run on a GPU yet.

mod choose;
mod device_local;
mod elem;
mod nccl;
mod nccl_init;
pub mod probe;
mod rendezvous;
mod sum_kernel;

pub use choose::{choose_gpu_collectives, GpuCommKind};
pub use device_local::{device_local_preflight, DeviceLocalCollectives};
pub use elem::GpuCommElem;
pub use nccl::NcclCollectives;
#[cfg(feature = "mpi")]
pub use nccl_init::nccl_unique_id_over_mpi;
pub use nccl_init::{nccl_preflight, new_nccl_unique_id, NCCL_UNIQUE_ID_BYTES};
pub use probe::{check_driver, cuda_devices_for_ranks, visible_device_count, CudaLib};
pub use sum_kernel::SUM_SOURCE;

#[cfg(test)]
mod tests;
