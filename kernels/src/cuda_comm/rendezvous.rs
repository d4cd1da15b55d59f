//! The host-side meeting point of ranks sharing one GPU: a reusable barrier that can be
//! broken (abort), and one published slot per rank.
//!
//! Unlike the CPU's in-process barrier, this one sleeps at once instead of spinning: the
//! GPU ranks only exchange pointers and events here, and the work they wait for runs on
//! the device, so a rank has nothing to gain from burning a core.

use std::sync::{Condvar, Mutex, PoisonError};

use crate::error::KernelError;

/// What a rank publishes for one collective: its buffer and what it holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Published {
    /// Device pointer of the rank's buffer.
    pub ptr: u64,
    /// Elements in it.
    pub len: usize,
    /// Bytes per element (every rank of a call must move the same type).
    pub elem_bytes: usize,
}

#[derive(Default)]
struct State {
    arrived: usize,
    generation: u64,
    broken: bool,
}

/// A barrier for `size` ranks plus their published slots.
pub(crate) struct Rendezvous {
    size: usize,
    state: Mutex<State>,
    wake: Condvar,
    slots: Vec<Mutex<Published>>,
}

impl Rendezvous {
    pub(crate) fn new(size: usize) -> Self {
        Self {
            size,
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            slots: (0..size)
                .map(|_| Mutex::new(Published::default()))
                .collect(),
        }
    }

    /// Sets rank `rank`'s slot (only that rank writes it, before a barrier).
    pub(crate) fn publish(&self, rank: usize, p: Published) {
        *self.slots[rank]
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = p;
    }

    /// Rank `rank`'s slot (read after the barrier that follows its write).
    pub(crate) fn slot(&self, rank: usize) -> Published {
        *self.slots[rank]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until every rank has arrived; fails once the group is broken.
    pub(crate) fn wait(&self) -> Result<(), KernelError> {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if s.broken {
            return Err(broken());
        }
        let generation = s.generation;
        s.arrived += 1;
        if s.arrived == self.size {
            s.arrived = 0;
            s.generation = s.generation.wrapping_add(1);
            self.wake.notify_all();
            return Ok(());
        }
        while s.generation == generation && !s.broken {
            s = self.wake.wait(s).unwrap_or_else(PoisonError::into_inner);
        }
        if s.generation == generation {
            return Err(broken());
        }
        Ok(())
    }

    /// Breaks the group: every rank waiting, or arriving later, gets an error.
    pub(crate) fn break_group(&self) {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .broken = true;
        self.wake.notify_all();
    }
}

fn broken() -> KernelError {
    KernelError::Comm("a rank of the device-local group failed (the group was aborted)".into())
}
