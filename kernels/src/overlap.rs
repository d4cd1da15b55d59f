//! Overlapping one micro-batch's communication with another's compute on the same rank.
//!
//! A rank that runs two micro-batches gives each its own compute thread and its own
//! communicators, and the two threads share one [`ComputeBaton`]. A thread computes only
//! while it holds the baton and lends it out for the time it waits in a collective
//! ([`BatonComm`]), so while one micro-batch waits for its peers (or for the link) the
//! rank's core computes the other one instead of spinning. Only one of the two threads
//! computes at a time, so the cores are never oversubscribed and the switches happen at
//! collectives only — the way vLLM's dual-batch overlap yields between its two
//! micro-batch threads at every communication point.

use std::sync::{Arc, Condvar, Mutex, PoisonError};

use crate::comm::{Communicator, Elems, ElemsMut};
use crate::error::KernelError;

/// The right to compute on a rank, shared by its micro-batch threads (micro-batches 0
/// and 1).
///
/// Besides mutual exclusion it orders the long computations (the attention, see
/// [`BatonTurn::begin_long`]): while both micro-batches have a step in progress, their
/// long computations alternate, 0, 1, 0, 1, … on every rank. The collectives before
/// each long computation keep the ranks in step, so every rank computes one
/// micro-batch's attention while the other micro-batch's collectives (and the short
/// computations between them) proceed — rather than half the ranks computing one
/// micro-batch and half the other, each waiting for the other half in every collective.
#[derive(Default)]
pub struct ComputeBaton {
    state: Mutex<BatonState>,
    changed: Condvar,
}

#[derive(Default)]
struct BatonState {
    held: bool,
    /// Threads back from a collective, ready to compute and waiting for the baton.
    waiting: usize,
    /// Times the baton has been taken (lets a yielding thread see the other had its turn).
    turns: u64,
    /// Threads that lent the baton out for a collective and have not asked for it back.
    lent: usize,
    /// The thread waiting in `yield_to_waiter` paused inside a long computation.
    suspended_long: bool,
    /// Which micro-batches have a step in progress.
    active: [bool; 2],
    /// The micro-batch whose long computation came last.
    last_long: Option<usize>,
}

impl ComputeBaton {
    /// A free baton.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Waits for the baton on behalf of micro-batch `micro_batch` (0 or 1) and holds it
    /// until the returned guard drops; the micro-batch counts as having a step in
    /// progress meanwhile.
    ///
    /// ```
    /// use dcpserve_kernels::ComputeBaton;
    /// let baton = ComputeBaton::new();
    /// let turn = baton.hold(0);
    /// assert!(!baton.is_free());
    /// drop(turn);
    /// assert!(baton.is_free());
    /// ```
    pub fn hold(self: &Arc<Self>, micro_batch: usize) -> BatonTurn {
        let mb = micro_batch.min(1);
        self.lock().active[mb] = true;
        self.acquire(false);
        BatonTurn {
            baton: self.clone(),
            micro_batch: mb,
        }
    }

    /// Whether no thread holds the baton.
    pub fn is_free(&self) -> bool {
        !self.lock().held
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BatonState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wait<'a>(
        &self,
        st: std::sync::MutexGuard<'a, BatonState>,
    ) -> std::sync::MutexGuard<'a, BatonState> {
        self.changed
            .wait(st)
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes the baton; `urgent` for a thread back from a collective, which the holder
    /// lets through at its next turn boundary (a thread starting a step just waits).
    fn acquire(&self, urgent: bool) {
        let mut st = self.lock();
        st.waiting += usize::from(urgent);
        while st.held {
            st = self.wait(st);
        }
        st.waiting -= usize::from(urgent);
        st.held = true;
        st.turns += 1;
    }

    fn release(&self) {
        self.lock().held = false;
        self.changed.notify_all();
    }
}

/// A held baton (one micro-batch's step in progress); dropping it frees the baton.
pub struct BatonTurn {
    baton: Arc<ComputeBaton>,
    micro_batch: usize,
}

impl BatonTurn {
    /// A turn boundary for the holder. If the other micro-batch is ready to compute
    /// again (its collective has completed), it runs until its next collective, then the
    /// caller goes on. Inside a long computation (`in_long`) this keeps the other's chain
    /// of collectives from waiting for the whole of it.
    pub fn yield_to_waiter(&self, in_long: bool) {
        let b = &*self.baton;
        let mut st = b.lock();
        if st.waiting == 0 && st.lent > 0 {
            // The other thread may be runnable (its collective done) but not yet running
            // on this core: let it run far enough to ask for the baton.
            drop(st);
            std::thread::yield_now();
            st = b.lock();
        }
        if st.waiting == 0 {
            return;
        }
        st.suspended_long = in_long;
        let turns = st.turns;
        st.held = false;
        b.changed.notify_all();
        st.waiting += 1;
        while st.held || st.turns == turns {
            st = b.wait(st);
        }
        st.waiting -= 1;
        st.held = true;
        st.turns += 1;
        st.suspended_long = false;
    }

    /// Called by the holder before a long computation. Waits (baton handed over) while
    /// the other micro-batch is paused inside its own long computation, or while it is
    /// the other's turn for one (it has a step in progress and this micro-batch had the
    /// last long computation).
    pub fn begin_long(&self) {
        let b = &*self.baton;
        let (me, other) = (self.micro_batch, 1 - self.micro_batch);
        let mut st = b.lock();
        let blocked =
            |st: &BatonState| st.suspended_long || (st.last_long == Some(me) && st.active[other]);
        if blocked(&st) {
            st.held = false;
            b.changed.notify_all();
            while st.held || blocked(&st) {
                st = b.wait(st);
            }
            st.held = true;
            st.turns += 1;
        }
        st.last_long = Some(me);
    }
}

impl Drop for BatonTurn {
    fn drop(&mut self) {
        self.baton.lock().active[self.micro_batch] = false;
        self.baton.release();
    }
}

/// Lends the baton out for the duration of a collective and takes it back afterwards,
/// even when the collective unwinds.
struct Lent<'a>(&'a ComputeBaton);

impl<'a> Lent<'a> {
    fn new(baton: &'a ComputeBaton) -> Self {
        baton.lock().lent += 1;
        baton.release();
        Lent(baton)
    }
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        self.0.lock().lent -= 1;
        self.0.acquire(true);
    }
}

/// A communicator whose caller holds a [`ComputeBaton`]: every collective of more than
/// one rank lends the baton to the rank's other micro-batch thread while it runs.
///
/// ```
/// use std::sync::Arc;
/// use dcpserve_kernels::{BatonComm, Communicator, ComputeBaton, InProcessComm};
/// // One rank of a 2-rank group; the other rank is a plain thread.
/// let mut comms = InProcessComm::group(2).into_iter();
/// let (mine, peer) = (comms.next().unwrap(), comms.next().unwrap());
/// let baton = ComputeBaton::new();
/// let comm = BatonComm::new(Arc::new(mine), baton.clone());
/// std::thread::scope(|s| {
///     s.spawn(move || peer.all_reduce_sum(&mut [2.0]).unwrap());
///     let _turn = baton.hold(0);
///     let mut x = [1.0];
///     comm.all_reduce_sum(&mut x).unwrap();
///     assert_eq!(x, [3.0]);
/// });
/// ```
pub struct BatonComm {
    inner: Arc<dyn Communicator>,
    baton: Arc<ComputeBaton>,
}

impl BatonComm {
    /// Wraps `inner`; the threads calling it must hold `baton`.
    pub fn new(inner: Arc<dyn Communicator>, baton: Arc<ComputeBaton>) -> Self {
        Self { inner, baton }
    }

    fn lend<T>(&self, f: impl FnOnce(&dyn Communicator) -> T) -> T {
        if self.inner.size() == 1 {
            return f(self.inner.as_ref());
        }
        let _back = Lent::new(&self.baton);
        f(self.inner.as_ref())
    }
}

impl Communicator for BatonComm {
    fn group_start(&self) {
        self.inner.group_start()
    }
    fn group_end(&self) -> Result<(), KernelError> {
        self.lend(|c| c.group_end())
    }
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn all_gather_elems(&self, input: Elems<'_>, out: ElemsMut<'_>) -> Result<(), KernelError> {
        self.lend(|c| c.all_gather_elems(input, out))
    }
    fn all_reduce_sum_elems(&self, data: ElemsMut<'_>) -> Result<(), KernelError> {
        self.lend(|c| c.all_reduce_sum_elems(data))
    }
    fn reduce_scatter_sum_elems(
        &self,
        input: Elems<'_>,
        out: ElemsMut<'_>,
    ) -> Result<(), KernelError> {
        self.lend(|c| c.reduce_scatter_sum_elems(input, out))
    }
    fn broadcast_elems(&self, data: ElemsMut<'_>, root: usize) -> Result<(), KernelError> {
        self.lend(|c| c.broadcast_elems(data, root))
    }
    fn all_gather_varying_elems(
        &self,
        input: Elems<'_>,
        counts: &[usize],
        out: ElemsMut<'_>,
    ) -> Result<(), KernelError> {
        self.lend(|c| c.all_gather_varying_elems(input, counts, out))
    }
    fn all_to_all_elems(&self, input: Elems<'_>, out: ElemsMut<'_>) -> Result<(), KernelError> {
        self.lend(|c| c.all_to_all_elems(input, out))
    }
    fn abort(&self) {
        // Never waits, so the baton stays with the caller.
        self.inner.abort()
    }
    fn seconds_in_collectives(&self) -> f64 {
        self.inner.seconds_in_collectives()
    }
}

#[cfg(test)]
mod tests;
