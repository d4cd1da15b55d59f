//! Collectives of CPU ranks that are threads of one process, through shared memory.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use half::bf16;

use super::elems::CommElem;
use super::Communicator;
use crate::error::KernelError;

/// One rank's published buffer, one vector per element type (each keeps its capacity).
#[derive(Default)]
struct Slot {
    f32: Vec<f32>,
    bf16: Vec<bf16>,
}

/// Picks a [`Slot`]'s vector of the element type.
trait SlotElem: CommElem {
    fn of(slot: &Slot) -> &Vec<Self>;
    fn of_mut(slot: &mut Slot) -> &mut Vec<Self>;
}

impl SlotElem for f32 {
    fn of(slot: &Slot) -> &Vec<Self> {
        &slot.f32
    }
    fn of_mut(slot: &mut Slot) -> &mut Vec<Self> {
        &mut slot.f32
    }
}

impl SlotElem for bf16 {
    fn of(slot: &Slot) -> &Vec<Self> {
        &slot.bf16
    }
    fn of_mut(slot: &mut Slot) -> &mut Vec<Self> {
        &mut slot.bf16
    }
}

/// Shared state of one in-process group.
struct Shared {
    size: usize,
    /// One buffer per rank; a rank only writes its own, between barriers.
    slots: Vec<UnsafeCell<Slot>>,
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
            slots: (0..size)
                .map(|_| UnsafeCell::new(Slot::default()))
                .collect(),
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
    fn publish<T: SlotElem>(&self, data: &[T]) {
        // SAFETY: only this rank writes its slot, and only between barriers.
        let slot = T::of_mut(unsafe { &mut *self.shared.slots[self.rank].get() });
        slot.clear();
        slot.extend_from_slice(data);
    }

    fn slot<T: SlotElem>(&self, r: usize) -> &[T] {
        // SAFETY: read after the barrier that follows the owner's write.
        T::of(unsafe { &*self.shared.slots[r].get() })
    }

    fn timed<T>(&self, f: impl FnOnce() -> Result<T, KernelError>) -> Result<T, KernelError> {
        let t = Instant::now();
        let r = f();
        self.nanos
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        r
    }

    fn all_gather_t<T: SlotElem>(&self, input: &[T], out: &mut [T]) -> Result<(), KernelError> {
        let (n, c) = (self.size(), input.len());
        if out.len() != n * c {
            return Err(len_error("all_gather output", n * c, out.len()));
        }
        self.timed(|| {
            self.publish(input);
            self.barrier()?;
            for r in 0..n {
                let src = self.slot::<T>(r);
                if src.len() != c {
                    return Err(len_error("all_gather peer", c, src.len()));
                }
                out[r * c..(r + 1) * c].copy_from_slice(src);
            }
            self.barrier()
        })
    }

    fn all_gather_varying_t<T: SlotElem>(
        &self,
        input: &[T],
        counts: &[usize],
        out: &mut [T],
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
                let src = self.slot::<T>(r);
                if src.len() != c {
                    return Err(len_error("all_gather_varying peer", c, src.len()));
                }
                out[at..at + c].copy_from_slice(src);
                at += c;
            }
            self.barrier()
        })
    }

    fn all_reduce_sum_t<T: SlotElem>(&self, data: &mut [T]) -> Result<(), KernelError> {
        if self.size() == 1 {
            return Ok(());
        }
        self.timed(|| {
            self.publish(data);
            self.barrier()?;
            // Same order on every rank, so every rank gets bit-identical sums.
            data.copy_from_slice(self.slot::<T>(0));
            for r in 1..self.size() {
                let src = self.slot::<T>(r);
                if src.len() != data.len() {
                    return Err(len_error("all_reduce peer", data.len(), src.len()));
                }
                for (d, &s) in data.iter_mut().zip(src) {
                    *d = T::add(*d, s);
                }
            }
            self.barrier()
        })
    }

    fn reduce_scatter_sum_t<T: SlotElem>(
        &self,
        input: &[T],
        out: &mut [T],
    ) -> Result<(), KernelError> {
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
            out.copy_from_slice(&self.slot::<T>(0)[lo..hi]);
            for r in 1..n {
                for (d, &s) in out.iter_mut().zip(&self.slot::<T>(r)[lo..hi]) {
                    *d = T::add(*d, s);
                }
            }
            self.barrier()
        })
    }

    fn broadcast_t<T: SlotElem>(&self, data: &mut [T], root: usize) -> Result<(), KernelError> {
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
                let src = self.slot::<T>(root);
                if src.len() != data.len() {
                    return Err(len_error("broadcast", data.len(), src.len()));
                }
                data.copy_from_slice(src);
            }
            self.barrier()
        })
    }

    fn all_to_all_t<T: SlotElem>(&self, input: &[T], out: &mut [T]) -> Result<(), KernelError> {
        let n = self.size();
        crate::comm::elems::check_all_to_all(n, input.len(), out.len())?;
        let c = input.len() / n;
        let mine = self.rank * c..(self.rank + 1) * c;
        self.timed(|| {
            self.publish(input);
            self.barrier()?;
            for r in 0..n {
                let src = self.slot::<T>(r);
                if src.len() != n * c {
                    return Err(len_error("all_to_all peer", n * c, src.len()));
                }
                out[r * c..(r + 1) * c].copy_from_slice(&src[mine.clone()]);
            }
            self.barrier()
        })
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

    super::elems::communicator_elems_by_type!();

    /// Poisons the group's shared state: every rank blocked in (or entering) a collective
    /// returns an error instead of waiting forever for a rank that died.
    fn abort(&self) {
        self.shared.poisoned.store(true, Ordering::SeqCst);
        let _g = self.shared.lock.lock();
        self.shared.wake.notify_all();
    }

    fn seconds_in_collectives(&self) -> f64 {
        self.nanos.load(Ordering::Relaxed) as f64 * 1e-9
    }
}
