//! Collective communication between the ranks of a group.
//!
//! [`Communicator`] is shaped like NCCL's API (rank-ordered, every rank calls the same
//! collectives in the same order, grouped calls allowed) so a device implementation can
//! sit behind it; [`InProcessComm`] serves CPU ranks that are threads of one process,
//! through shared memory: no allocation per call once buffers have grown, no mailbox.
//!
//! Collectives move f32 or bf16 elements ([`Elems`] / [`ElemsMut`]); the f32 forms
//! (`all_gather`, `all_reduce_sum`, …) are shorthands for the element-generic ones.
//! A rank does not build its communicators itself: it receives a plain, serializable
//! [`CommGroupSpec`] and connects through the [`bootstrap`] — shared memory inside one
//! process today; the spec's [`Transport`] is where an NCCL unique id or an MPI
//! communicator plugs in for ranks in other processes.
//!
//! A rank's forward pass does not call the host [`Communicator`] directly: it calls
//! [`Collectives`] on its backend's buffers, which [`HostCollectives`] maps onto a host
//! communicator for host-memory backends and a device backend implements over its own
//! transport (NCCL), so device buffers are never staged through the host.

pub mod bootstrap;
mod collectives;
pub(crate) mod elems;
mod in_process;
#[cfg(feature = "mpi")]
pub mod mpi;

pub use bootstrap::{connect, CommGroupSpec, GroupId, GroupOwner, Transport};
pub use collectives::{Collectives, HostCollectives, SoloCollectives};
pub use elems::{CommElem, Elems, ElemsMut};
pub use in_process::InProcessComm;

use crate::error::KernelError;

/// The collectives one rank of a group can take part in. Every rank of the group must
/// make the same calls in the same order (as with NCCL).
///
/// Semantics are NCCL's: a call is ordered after the rank's earlier work on its stream and
/// before its later work, and calls between [`Communicator::group_start`] and
/// [`Communicator::group_end`] may be fused and complete together. A device
/// implementation enqueues on the rank's stream and returns at once; the in-process one
/// has no stream, so each call completes before it returns and grouping is a no-op.
///
/// The `*_elems` methods are the implementation's; every rank of a call must pass the
/// same element type. The f32 methods without the suffix are provided on top of them.
pub trait Communicator: Send + Sync {
    /// Opens a group of calls that may be issued together (`ncclGroupStart`).
    fn group_start(&self) {}
    /// Closes the group (`ncclGroupEnd`).
    fn group_end(&self) -> Result<(), KernelError> {
        Ok(())
    }
    /// This rank's index in the group.
    fn rank(&self) -> usize;
    /// Ranks in the group.
    fn size(&self) -> usize;
    /// `out` = the `input`s of all ranks, concatenated in rank order (`out.len() == size × input.len()`).
    fn all_gather_elems(&self, input: Elems<'_>, out: ElemsMut<'_>) -> Result<(), KernelError>;
    /// Element-wise sum over ranks, in place, identical on every rank.
    fn all_reduce_sum_elems(&self, data: ElemsMut<'_>) -> Result<(), KernelError>;
    /// Sum over ranks of `input`, of which this rank receives chunk `rank`
    /// (`input.len() == size × out.len()`).
    fn reduce_scatter_sum_elems(
        &self,
        input: Elems<'_>,
        out: ElemsMut<'_>,
    ) -> Result<(), KernelError>;
    /// Copies `root`'s `data` to every rank.
    fn broadcast_elems(&self, data: ElemsMut<'_>, root: usize) -> Result<(), KernelError>;
    /// Uneven all-gather: rank `r` contributes `counts[r]` values; `out` is their concatenation.
    fn all_gather_varying_elems(
        &self,
        input: Elems<'_>,
        counts: &[usize],
        out: ElemsMut<'_>,
    ) -> Result<(), KernelError>;
    /// All-to-all (`ncclAllToAll`): `input` is `size` equal chunks, chunk `s` going to
    /// rank `s`; `out` receives `size` chunks of the same length, chunk `r` from rank `r`.
    fn all_to_all_elems(&self, input: Elems<'_>, out: ElemsMut<'_>) -> Result<(), KernelError>;
    /// Breaks the group: every collective of every rank of the group that is waiting, or
    /// starts later, fails instead of waiting for a rank that died (`ncclCommAbort`).
    fn abort(&self);
    /// Seconds this rank has spent inside collectives (waiting included).
    fn seconds_in_collectives(&self) -> f64;

    /// [`Communicator::all_gather_elems`] over f32.
    fn all_gather(&self, input: &[f32], out: &mut [f32]) -> Result<(), KernelError> {
        self.all_gather_elems(input.into(), out.into())
    }
    /// [`Communicator::all_reduce_sum_elems`] over f32.
    fn all_reduce_sum(&self, data: &mut [f32]) -> Result<(), KernelError> {
        self.all_reduce_sum_elems(data.into())
    }
    /// [`Communicator::reduce_scatter_sum_elems`] over f32.
    fn reduce_scatter_sum(&self, input: &[f32], out: &mut [f32]) -> Result<(), KernelError> {
        self.reduce_scatter_sum_elems(input.into(), out.into())
    }
    /// [`Communicator::broadcast_elems`] over f32.
    fn broadcast(&self, data: &mut [f32], root: usize) -> Result<(), KernelError> {
        self.broadcast_elems(data.into(), root)
    }
    /// [`Communicator::all_gather_varying_elems`] over f32.
    fn all_gather_varying(
        &self,
        input: &[f32],
        counts: &[usize],
        out: &mut [f32],
    ) -> Result<(), KernelError> {
        self.all_gather_varying_elems(input.into(), counts, out.into())
    }
    /// [`Communicator::all_to_all_elems`] over f32.
    ///
    /// ```
    /// use dcpserve_kernels::{Communicator, InProcessComm};
    /// let comms = InProcessComm::group(2);
    /// std::thread::scope(|s| {
    ///     for c in &comms {
    ///         s.spawn(move || {
    ///             let r = c.rank() as f32;
    ///             // Chunk s (one value) goes to rank s.
    ///             let send = [10.0 * r, 10.0 * r + 1.0];
    ///             let mut got = [0.0; 2];
    ///             c.all_to_all(&send, &mut got).unwrap();
    ///             assert_eq!(got, [r, 10.0 + r]);
    ///         });
    ///     }
    /// });
    /// ```
    fn all_to_all(&self, input: &[f32], out: &mut [f32]) -> Result<(), KernelError> {
        self.all_to_all_elems(input.into(), out.into())
    }
}

#[cfg(test)]
mod tests;
