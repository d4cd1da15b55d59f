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
//! # Glue to the backend trait
//!
//! `CudaBackend` (in `crate::cuda`) has `View<'a> = CudaRef<'a>` (a `Copy` handle whose
//! `cuda()` is the `CudaView<'a, f32>`), `ViewMut<'a> = CudaViewMut<'a, f32>` and one
//! `Arc<CudaStream>` (`stream()`). The glue is one forwarding impl on [`GpuCollectives`]
//! (either transport), in `cuda_comm/glue.rs`, in this shape:
//!
//! ```text
//! impl Collectives<CudaBackend> for GpuCollectives {
//!     fn rank(&self) -> usize          { GpuCollectives::rank(self) }
//!     fn size(&self) -> usize          { GpuCollectives::size(self) }
//!     fn group_start(&self)            { GpuCollectives::group_start(self) }
//!     fn group_end(&self) -> Result<…> { GpuCollectives::group_end(self) }
//!     fn all_gather(&self, _dev: &CudaBackend, input, out)  { GpuCollectives::all_gather::<f32>(self, input, out) }
//!     fn all_reduce_sum(&self, _dev, data)                   { GpuCollectives::all_reduce_sum::<f32>(self, data) }
//!     fn reduce_scatter_sum(&self, _dev, input, out)         { GpuCollectives::reduce_scatter_sum::<f32>(self, input, out) }
//!     fn all_gather_varying(&self, _dev, input, counts, out) { GpuCollectives::all_gather_varying::<f32>(self, input, counts, out) }
//!     fn all_to_all(&self, _dev, input, out)                 { GpuCollectives::all_to_all::<f32>(self, input, out) }
//!     fn abort(&self)                                        { GpuCollectives::abort(self) }
//! }
//! ```
//!
//! `dev` is not needed: the collectives hold the same stream as the backend thread that
//! calls them (micro-batch `mb`'s groups are built with `backend.stream_of(mb)`, and
//! that micro-batch's thread binds stream `mb`; a
//! `debug_assert!(Arc::ptr_eq(dev.stream(), self.stream()))` in the glue catches a
//! mix-up). A rank gets its handle for each group of its
//! `RankCommSpecs` with [`join_gpu_group`]`(spec.id.0, group_rank, size, stream, …)`
//! (threads of one process: the last rank to arrive picks NCCL or device-local copies
//! with [`choose_gpu_collectives`] and builds the group), or, for a group spread over
//! processes, [`NcclCollectives::from_unique_id`] with the id of a
//! `Transport::Nccl { unique_id }` spec ([`new_nccl_unique_id`] on the owner, sent over MPI
//! by `nccl_unique_id_over_mpi`).
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
mod glue;
mod join;
mod nccl;
mod nccl_init;
pub mod probe;
mod rendezvous;
mod sum_kernel;

pub use choose::{choose_gpu_collectives, GpuCommKind};
pub use device_local::{device_local_preflight, DeviceLocalCollectives};
pub use elem::GpuCommElem;
pub use join::{join_gpu_group, GpuCollectives};
pub use nccl::NcclCollectives;
#[cfg(feature = "mpi")]
pub use nccl_init::nccl_unique_id_over_mpi;
pub use nccl_init::{nccl_preflight, new_nccl_unique_id, NCCL_UNIQUE_ID_BYTES};
pub use probe::{check_driver, cuda_devices_for_ranks, visible_device_count, CudaLib};
pub use sum_kernel::SUM_SOURCE;

#[cfg(test)]
mod tests;
