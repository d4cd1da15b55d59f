//! Collective communication between the ranks of a group.
//!
//! [`Communicator`] is shaped like NCCL's API (rank-ordered, every rank calls the same
//! collectives in the same order, grouped calls allowed) so a device implementation can
//! sit behind it; [`InProcessComm`] serves CPU ranks that are threads of one process,
//! through shared memory: no allocation per call once buffers have grown, no mailbox.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::error::KernelError;

/// The collectives one rank of a group can take part in. Every rank of the group must
/// make the same calls in the same order (as with NCCL).
///
/// Semantics are NCCL's: a call is ordered after the rank's earlier work on its stream and
/// before its later work, and calls between [`Communicator::group_start`] and
/// [`Communicator::group_end`] may be fused and complete together. A device
/// implementation enqueues on the rank's stream and returns at once; the in-process one
/// has no stream, so each call completes before it returns and grouping is a no-op.
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
    fn all_gather(&self, input: &[f32], out: &mut [f32]) -> Result<(), KernelError>;
    /// Element-wise sum over ranks, in place, identical on every rank.
    fn all_reduce_sum(&self, data: &mut [f32]) -> Result<(), KernelError>;
    /// Sum over ranks of `input`, of which this rank receives chunk `rank`
    /// (`input.len() == size × out.len()`).
    fn reduce_scatter_sum(&self, input: &[f32], out: &mut [f32]) -> Result<(), KernelError>;
    /// Copies `root`'s `data` to every rank.
    fn broadcast(&self, data: &mut [f32], root: usize) -> Result<(), KernelError>;
    /// Uneven all-gather: rank `r` contributes `counts[r]` values; `out` is their concatenation.
    fn all_gather_varying(
        &self,
        input: &[f32],
        counts: &[usize],
        out: &mut [f32],
    ) -> Result<(), KernelError>;
    /// Seconds this rank has spent inside collectives (waiting included).
    fn seconds_in_collectives(&self) -> f64;
}

/// Shared state of one in-process group.
struct Shared {
    size: usize,
    /// One buffer per rank; a rank only writes its own, between barriers.
    slots: Vec<UnsafeCell<Vec<f32>>>,
    arrived: AtomicUsize,
    generation: AtomicU64,
    poisoned: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
}

// SAFETY: slot `r` is written only by rank `r` between two barriers and read by others
// only after the barrier that follows the write; the barrier's acquire/release ordering
// publishes the writes.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

/// One rank's handle on an in-process group (threads of one process).
pub struct InProcessComm {
    shared: Arc<Shared>,
    rank: usize,
    nanos: AtomicU64,
}

impl InProcessComm {
    /// Creates the handles of a group of `size` ranks.
    ///
    /// ```
    /// use dcpserve_kernels::{Communicator, InProcessComm};
    /// let comms = InProcessComm::group(2);
    /// std::thread::scope(|s| {
    ///     for c in &comms {
    ///         s.spawn(move || {
    ///             let mut x = vec![c.rank() as f32 + 1.0; 3];
    ///             c.all_reduce_sum(&mut x).unwrap();
    ///             assert_eq!(x, vec![3.0; 3]);
    ///         });
    ///     }
    /// });
    /// ```
    pub fn group(size: usize) -> Vec<InProcessComm> {
        let shared = Arc::new(Shared {
            size,
            slots: (0..size).map(|_| UnsafeCell::new(Vec::new())).collect(),
            arrived: AtomicUsize::new(0),
            generation: AtomicU64::new(0),
            poisoned: AtomicBool::new(false),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        (0..size)
            .map(|rank| InProcessComm {
                shared: shared.clone(),
                rank,
                nanos: AtomicU64::new(0),
            })
            .collect()
    }

    /// Marks the group broken: every rank blocked in (or entering) a collective returns an
    /// error instead of waiting forever for a rank that died.
    pub fn poison(&self) {
        self.shared.poisoned.store(true, Ordering::SeqCst);
        let _g = self.shared.lock.lock();
        self.shared.wake.notify_all();
    }

    fn barrier(&self) -> Result<(), KernelError> {
        let s = &*self.shared;
        if s.size == 1 {
            return Ok(());
        }
        let gen = s.generation.load(Ordering::Acquire);
        if s.arrived.fetch_add(1, Ordering::AcqRel) + 1 == s.size {
            s.arrived.store(0, Ordering::Release);
            s.generation.fetch_add(1, Ordering::AcqRel);
            let _g = s.lock.lock();
            s.wake.notify_all();
            return self.check();
        }
        // Spin briefly (ranks usually arrive together), then sleep: more ranks than cores
        // must not burn the cores the late ranks need.
        let start = Instant::now();
        let mut spins = 0u32;
        while s.generation.load(Ordering::Acquire) == gen {
            self.check()?;
            spins += 1;
            if spins < 2000 {
                std::hint::spin_loop();
            } else if start.elapsed() < Duration::from_micros(50) {
                std::thread::yield_now();
            } else {
                let g = s
                    .lock
                    .lock()
                    .map_err(|_| KernelError::Comm("lock poisoned".into()))?;
                if s.generation.load(Ordering::Acquire) == gen
                    && !s.poisoned.load(Ordering::Acquire)
                {
                    let _ = s.wake.wait_timeout(g, Duration::from_millis(5));
                }
            }
        }
        self.check()
    }

    fn check(&self) -> Result<(), KernelError> {
        if self.shared.poisoned.load(Ordering::Acquire) {
            Err(KernelError::Comm("a rank of the group failed".into()))
        } else {
            Ok(())
        }
    }

    /// Writes `data` into this rank's slot.
    fn publish(&self, data: &[f32]) {
        // SAFETY: only this rank writes its slot, and only between barriers.
        let slot = unsafe { &mut *self.shared.slots[self.rank].get() };
        slot.clear();
        slot.extend_from_slice(data);
    }

    fn slot(&self, r: usize) -> &[f32] {
        // SAFETY: read after the barrier that follows the owner's write.
        unsafe { &*self.shared.slots[r].get() }
    }

    fn timed<T>(&self, f: impl FnOnce() -> Result<T, KernelError>) -> Result<T, KernelError> {
        let t = Instant::now();
        let r = f();
        self.nanos
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        r
    }
}

fn len_error(what: &str, want: usize, got: usize) -> KernelError {
    KernelError::Shape(format!("{what}: expected {want} values, got {got}"))
}

impl Communicator for InProcessComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.shared.size
    }

    fn all_gather(&self, input: &[f32], out: &mut [f32]) -> Result<(), KernelError> {
        let (n, c) = (self.size(), input.len());
        if out.len() != n * c {
            return Err(len_error("all_gather output", n * c, out.len()));
        }
        self.timed(|| {
            self.publish(input);
            self.barrier()?;
            for r in 0..n {
                let src = self.slot(r);
                if src.len() != c {
                    return Err(len_error("all_gather peer", c, src.len()));
                }
                out[r * c..(r + 1) * c].copy_from_slice(src);
            }
            self.barrier()
        })
    }

    fn all_gather_varying(
        &self,
        input: &[f32],
        counts: &[usize],
        out: &mut [f32],
    ) -> Result<(), KernelError> {
        let n = self.size();
        if counts.len() != n || counts[self.rank] != input.len() {
            return Err(KernelError::Shape(
                "all_gather_varying: counts disagree with input".into(),
            ));
        }
        let total: usize = counts.iter().sum();
        if out.len() != total {
            return Err(len_error("all_gather_varying output", total, out.len()));
        }
        self.timed(|| {
            self.publish(input);
            self.barrier()?;
            let mut at = 0;
            for (r, &c) in counts.iter().enumerate() {
                let src = self.slot(r);
                if src.len() != c {
                    return Err(len_error("all_gather_varying peer", c, src.len()));
                }
                out[at..at + c].copy_from_slice(src);
                at += c;
            }
            self.barrier()
        })
    }

    fn all_reduce_sum(&self, data: &mut [f32]) -> Result<(), KernelError> {
        if self.size() == 1 {
            return Ok(());
        }
        self.timed(|| {
            self.publish(data);
            self.barrier()?;
            // Same order on every rank, so every rank gets bit-identical sums.
            data.copy_from_slice(self.slot(0));
            for r in 1..self.size() {
                let src = self.slot(r);
                if src.len() != data.len() {
                    return Err(len_error("all_reduce peer", data.len(), src.len()));
                }
                for (d, s) in data.iter_mut().zip(src) {
                    *d += s;
                }
            }
            self.barrier()
        })
    }

    fn reduce_scatter_sum(&self, input: &[f32], out: &mut [f32]) -> Result<(), KernelError> {
        let n = self.size();
        if input.len() != n * out.len() {
            return Err(len_error(
                "reduce_scatter input",
                n * out.len(),
                input.len(),
            ));
        }
        self.timed(|| {
            self.publish(input);
            self.barrier()?;
            let (lo, hi) = (self.rank * out.len(), (self.rank + 1) * out.len());
            out.copy_from_slice(&self.slot(0)[lo..hi]);
            for r in 1..n {
                for (d, s) in out.iter_mut().zip(&self.slot(r)[lo..hi]) {
                    *d += s;
                }
            }
            self.barrier()
        })
    }

    fn broadcast(&self, data: &mut [f32], root: usize) -> Result<(), KernelError> {
        if root >= self.size() {
            return Err(KernelError::Shape(format!(
                "broadcast root {root} out of range"
            )));
        }
        self.timed(|| {
            if self.rank == root {
                self.publish(data);
            }
            self.barrier()?;
            if self.rank != root {
                let src = self.slot(root);
                if src.len() != data.len() {
                    return Err(len_error("broadcast", data.len(), src.len()));
                }
                data.copy_from_slice(src);
            }
            self.barrier()
        })
    }

    fn seconds_in_collectives(&self) -> f64 {
        self.nanos.load(Ordering::Relaxed) as f64 * 1e-9
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run<F: Fn(&InProcessComm) + Sync>(n: usize, f: F) {
        let comms = InProcessComm::group(n);
        std::thread::scope(|s| {
            for c in &comms {
                let f = &f;
                s.spawn(move || f(c));
            }
        });
    }

    #[test]
    fn collectives_agree_with_their_definitions() {
        for n in [1, 2, 3, 4] {
            run(n, |c| {
                let r = c.rank() as f32;
                for round in 0..50 {
                    let input: Vec<f32> =
                        (0..4).map(|i| r * 10.0 + i as f32 + round as f32).collect();
                    let mut out = vec![0.0; 4 * n];
                    c.all_gather(&input, &mut out).unwrap();
                    for q in 0..n {
                        for i in 0..4 {
                            assert_eq!(out[q * 4 + i], q as f32 * 10.0 + i as f32 + round as f32);
                        }
                    }
                    let mut sum = input.clone();
                    c.all_reduce_sum(&mut sum).unwrap();
                    let ranks: f32 = (0..n).map(|q| q as f32 * 10.0).sum();
                    for (i, v) in sum.iter().enumerate() {
                        assert_eq!(*v, ranks + n as f32 * (i as f32 + round as f32));
                    }
                    let big: Vec<f32> = (0..2 * n).map(|i| i as f32 + r).collect();
                    let mut mine = vec![0.0; 2];
                    c.reduce_scatter_sum(&big, &mut mine).unwrap();
                    let rs: f32 = (0..n).map(|q| q as f32).sum();
                    for (j, v) in mine.iter().enumerate() {
                        let i = c.rank() * 2 + j;
                        assert_eq!(*v, n as f32 * i as f32 + rs);
                    }
                    let mut b = vec![r; 3];
                    c.broadcast(&mut b, n - 1).unwrap();
                    assert_eq!(b, vec![(n - 1) as f32; 3]);
                    let counts: Vec<usize> = (0..n).map(|q| q + 1).collect();
                    let mine: Vec<f32> = vec![r; c.rank() + 1];
                    let mut out = vec![0.0; counts.iter().sum()];
                    c.all_gather_varying(&mine, &counts, &mut out).unwrap();
                    let want: Vec<f32> = (0..n).flat_map(|q| vec![q as f32; q + 1]).collect();
                    assert_eq!(out, want);
                }
            });
        }
    }

    #[test]
    fn a_poisoned_group_errors_instead_of_hanging() {
        let comms = InProcessComm::group(2);
        comms[1].poison();
        let mut x = vec![1.0];
        assert!(comms[0].all_reduce_sum(&mut x).is_err());
    }
}
