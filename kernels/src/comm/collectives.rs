//! Collectives over a backend's buffers: what a rank's forward pass calls.
//!
//! [`Collectives`] is the rank-side face of a communicator: the same NCCL-shaped calls
//! as [`Communicator`], but on [`Backend`] views, so a device implementation hands the
//! device pointers straight to its transport (NCCL on the rank's stream) and nothing is
//! staged through host memory. Two implementations live here:
//!
//! * [`HostCollectives`] wraps any host [`Communicator`] (shared memory between rank
//!   threads today, MPI between processes next) for a backend whose buffers are host
//!   memory ([`HostViews`]: the CPU backend).
//! * [`SoloCollectives`] is the group of one rank on any backend: every collective is a
//!   device copy or nothing.
//!
//! A CUDA backend adds its own: an NCCL communicator, or device-to-device copies for
//! ranks that share one GPU (NCCL refuses two ranks of a communicator on one device).

use std::sync::Arc;

use super::Communicator;
use crate::backend::{Backend, HostViews};
use crate::error::{check_len, KernelError};

/// The collectives one rank of a group runs on its backend's buffers. Every rank of
/// the group makes the same calls in the same order (as with NCCL); the semantics of
/// each call are those of the [`Communicator`] method of the same name.
///
/// ```
/// use std::sync::Arc;
/// use dcpserve_kernels::comm::{Collectives, HostCollectives};
/// use dcpserve_kernels::{CpuBackend, DeviceMemory, InProcessComm};
/// let dev = CpuBackend::new(1);
/// let groups: Vec<_> = InProcessComm::group(2).into_iter().map(|c| HostCollectives::new(Arc::new(c))).collect();
/// std::thread::scope(|s| {
///     for g in &groups {
///         let dev = &dev;
///         s.spawn(move || {
///             let mut x = dev.upload(&[1.0, 2.0]).unwrap();
///             Collectives::<CpuBackend>::all_reduce_sum(g, dev, dev.view_mut(&mut x, 0..2).unwrap()).unwrap();
///             let mut host = [0.0; 2];
///             dev.download(dev.view(&x, 0..2).unwrap(), &mut host).unwrap();
///             assert_eq!(host, [2.0, 4.0]);
///         });
///     }
/// });
/// ```
pub trait Collectives<B: Backend>: Send + Sync {
    /// This rank's index in the group.
    fn rank(&self) -> usize;
    /// Ranks in the group.
    fn size(&self) -> usize;
    /// Opens a group of calls that may be issued together (`ncclGroupStart`).
    fn group_start(&self) {}
    /// Closes the group (`ncclGroupEnd`).
    fn group_end(&self) -> Result<(), KernelError> {
        Ok(())
    }
    /// `out` = every rank's `input`, concatenated in rank order.
    fn all_gather(
        &self,
        dev: &B,
        input: B::View<'_>,
        out: B::ViewMut<'_>,
    ) -> Result<(), KernelError>;
    /// Element-wise sum over ranks, in place.
    fn all_reduce_sum(&self, dev: &B, data: B::ViewMut<'_>) -> Result<(), KernelError>;
    /// Sum over ranks of `input`, of which this rank receives chunk `rank`.
    fn reduce_scatter_sum(
        &self,
        dev: &B,
        input: B::View<'_>,
        out: B::ViewMut<'_>,
    ) -> Result<(), KernelError>;
    /// Uneven all-gather: rank `r` contributes `counts[r]` values.
    fn all_gather_varying(
        &self,
        dev: &B,
        input: B::View<'_>,
        counts: &[usize],
        out: B::ViewMut<'_>,
    ) -> Result<(), KernelError>;
    /// All-to-all: chunk `s` of `input` goes to rank `s`; chunk `r` of `out` comes from
    /// rank `r`.
    fn all_to_all(
        &self,
        dev: &B,
        input: B::View<'_>,
        out: B::ViewMut<'_>,
    ) -> Result<(), KernelError>;
    /// Breaks the group (see [`Communicator::abort`]).
    fn abort(&self);
}

/// A host [`Communicator`] serving a backend whose views are host memory.
#[derive(Clone)]
pub struct HostCollectives {
    comm: Arc<dyn Communicator>,
}

impl HostCollectives {
    /// Collectives through `comm`.
    pub fn new(comm: Arc<dyn Communicator>) -> Self {
        Self { comm }
    }

    /// The host communicator underneath (for its time counters).
    pub fn communicator(&self) -> &Arc<dyn Communicator> {
        &self.comm
    }
}

impl<B: HostViews> Collectives<B> for HostCollectives {
    fn rank(&self) -> usize {
        self.comm.rank()
    }
    fn size(&self) -> usize {
        self.comm.size()
    }
    fn group_start(&self) {
        self.comm.group_start()
    }
    fn group_end(&self) -> Result<(), KernelError> {
        self.comm.group_end()
    }
    fn all_gather(
        &self,
        _: &B,
        input: B::View<'_>,
        out: B::ViewMut<'_>,
    ) -> Result<(), KernelError> {
        self.comm.all_gather(B::host(input), B::host_mut(out))
    }
    fn all_reduce_sum(&self, _: &B, data: B::ViewMut<'_>) -> Result<(), KernelError> {
        self.comm.all_reduce_sum(B::host_mut(data))
    }
    fn reduce_scatter_sum(
        &self,
        _: &B,
        input: B::View<'_>,
        out: B::ViewMut<'_>,
    ) -> Result<(), KernelError> {
        self.comm
            .reduce_scatter_sum(B::host(input), B::host_mut(out))
    }
    fn all_gather_varying(
        &self,
        _: &B,
        input: B::View<'_>,
        counts: &[usize],
        out: B::ViewMut<'_>,
    ) -> Result<(), KernelError> {
        self.comm
            .all_gather_varying(B::host(input), counts, B::host_mut(out))
    }
    fn all_to_all(
        &self,
        _: &B,
        input: B::View<'_>,
        out: B::ViewMut<'_>,
    ) -> Result<(), KernelError> {
        self.comm.all_to_all(B::host(input), B::host_mut(out))
    }
    fn abort(&self) {
        self.comm.abort()
    }
}

/// The group of one rank, on any backend: gathers and scatters are copies, sums are
/// the identity.
#[derive(Debug, Clone, Copy, Default)]
pub struct SoloCollectives;

impl<B: Backend> Collectives<B> for SoloCollectives {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn all_gather(
        &self,
        dev: &B,
        input: B::View<'_>,
        out: B::ViewMut<'_>,
    ) -> Result<(), KernelError> {
        dev.copy(input, out)
    }
    fn all_reduce_sum(&self, _: &B, _: B::ViewMut<'_>) -> Result<(), KernelError> {
        Ok(())
    }
    fn reduce_scatter_sum(
        &self,
        dev: &B,
        input: B::View<'_>,
        out: B::ViewMut<'_>,
    ) -> Result<(), KernelError> {
        dev.copy(input, out)
    }
    fn all_gather_varying(
        &self,
        dev: &B,
        input: B::View<'_>,
        counts: &[usize],
        out: B::ViewMut<'_>,
    ) -> Result<(), KernelError> {
        check_len("all_gather_varying counts", 1, counts.len())?;
        check_len("all_gather_varying input", counts[0], dev.view_len(input))?;
        dev.copy(input, out)
    }
    fn all_to_all(
        &self,
        dev: &B,
        input: B::View<'_>,
        out: B::ViewMut<'_>,
    ) -> Result<(), KernelError> {
        dev.copy(input, out)
    }
    fn abort(&self) {}
}
