//! A communicator group: the ranks of one NCCL communicator, all threads of this process,
//! meeting for each collective.
//!
//! Each rank's collectives run as items of its stream. The n-th collective a rank's stream
//! runs meets the n-th of every other rank (NCCL requires every rank to issue the same
//! collectives in the same order); the last rank to arrive computes the result for all of
//! them and wakes the others. Point-to-point sends post a copy of their data to the
//! receiver's mailbox and return; receives wait for it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use super::reduce::{reduce, Dtype, RedOp};
use crate::driver::codes;
use crate::driver::memory::Fault;

/// What a collective is, as every rank must agree on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    AllReduce(RedOp),
    AllGather,
    ReduceScatter(RedOp),
    Broadcast { root: usize },
}

/// One rank's part of a collective: host addresses of its buffers, resolved on its stream.
#[derive(Debug, Clone, Copy)]
pub struct Part {
    pub kind: Kind,
    pub dtype: Dtype,
    /// Elements per rank: the all-reduce length, the all-gather input, the
    /// reduce-scatter output, the broadcast length.
    pub count: usize,
    pub send: usize,
    pub recv: usize,
}

struct Meeting {
    parts: Vec<Option<Part>>,
    arrived: usize,
    left: usize,
    done: Option<Result<(), String>>,
}

#[derive(Default)]
struct State {
    meetings: HashMap<u64, Meeting>,
    /// Per rank: how many collectives its stream has run.
    executed: Vec<u64>,
    /// (from, to) -> messages in send order.
    mail: HashMap<(usize, usize), VecDeque<Vec<u8>>>,
    aborted: bool,
}

pub struct Group {
    pub size: usize,
    state: Mutex<State>,
    changed: Condvar,
}

/// A collective that ended because the communicator was aborted (not a device fault:
/// NCCL kernels exit on abort and leave the stream usable).
pub const ABORTED: &str = "communicator aborted";

impl Group {
    pub fn new(size: usize) -> Group {
        Group {
            size,
            state: Mutex::new(State {
                executed: vec![0; size],
                ..State::default()
            }),
            changed: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wait<'a>(&self, g: MutexGuard<'a, State>, rank: usize, what: &str) -> MutexGuard<'a, State> {
        let (g, t) = self
            .changed
            .wait_timeout(g, Duration::from_secs(60))
            .unwrap_or_else(|p| p.into_inner());
        if t.timed_out() {
            eprintln!(
                "dcpemu: NCCL rank {rank} of {}: still waiting for its peers in {what} after 60 s",
                self.size
            );
        }
        g
    }

    /// Ends every pending and future collective of the group.
    pub fn abort(&self) {
        self.lock().aborted = true;
        self.changed.notify_all();
    }

    pub fn aborted(&self) -> bool {
        self.lock().aborted
    }

    /// Rank `rank`'s next collective: meets its peers', returns once all have arrived and
    /// the result is written. `Err(ABORTED)` if the group was aborted meanwhile.
    pub fn collective(&self, rank: usize, part: Part) -> Result<(), String> {
        let mut g = self.lock();
        if g.aborted {
            return Err(ABORTED.into());
        }
        let seq = g.executed[rank];
        g.executed[rank] += 1;
        let size = self.size;
        let m = g.meetings.entry(seq).or_insert_with(|| Meeting {
            parts: vec![None; size],
            arrived: 0,
            left: 0,
            done: None,
        });
        if let Some(first) = m.parts.iter().flatten().next() {
            if first.kind != part.kind || first.dtype != part.dtype || first.count != part.count {
                let why = format!(
                    "collective #{seq}: rank {rank} issued {:?} of {} {:?}, another rank {:?} of {} {:?}",
                    part.kind, part.count, part.dtype, first.kind, first.count, first.dtype
                );
                m.done = Some(Err(why));
            }
        }
        m.parts[rank] = Some(part);
        m.arrived += 1;
        if m.arrived == size && m.done.is_none() {
            let parts: Vec<Part> = m
                .parts
                .iter()
                .map(|p| p.expect("every rank arrived"))
                .collect();
            // SAFETY: each part's buffers were resolved on its rank's stream, which waits
            // here until this write is done.
            unsafe { compute(&parts) };
            m.done = Some(Ok(()));
            self.changed.notify_all();
        }
        loop {
            let m = g
                .meetings
                .get_mut(&seq)
                .expect("meeting lives until all left");
            if let Some(done) = m.done.clone() {
                m.left += 1;
                if m.left == size {
                    g.meetings.remove(&seq);
                }
                self.changed.notify_all();
                return done;
            }
            if g.aborted {
                return Err(ABORTED.into());
            }
            g = self.wait(g, rank, "a collective");
        }
    }

    /// Posts a copy of `bytes` from `from` to `to`.
    pub fn send(&self, from: usize, to: usize, bytes: Vec<u8>) -> Result<(), String> {
        let mut g = self.lock();
        if g.aborted {
            return Err(ABORTED.into());
        }
        g.mail.entry((from, to)).or_default().push_back(bytes);
        self.changed.notify_all();
        Ok(())
    }

    /// Waits for the next message from `from` to `to`.
    pub fn recv(&self, from: usize, to: usize) -> Result<Vec<u8>, String> {
        let mut g = self.lock();
        loop {
            if g.aborted {
                return Err(ABORTED.into());
            }
            if let Some(m) = g.mail.get_mut(&(from, to)).and_then(VecDeque::pop_front) {
                return Ok(m);
            }
            g = self.wait(g, to, "ncclRecv");
        }
    }
}

/// Writes every rank's output of one collective.
///
/// # Safety
/// Every part's `send` and `recv` hold the extents its kind and count imply.
unsafe fn compute(parts: &[Part]) {
    let n = parts.len();
    let p0 = parts[0];
    let esz = p0.dtype.size();
    let bytes = p0.count * esz;
    match p0.kind {
        Kind::AllReduce(op) => {
            let ins: Vec<*const u8> = parts.iter().map(|p| p.send as *const u8).collect();
            let out = reduce(&ins, p0.dtype, op, p0.count);
            for p in parts {
                std::ptr::copy_nonoverlapping(out.as_ptr(), p.recv as *mut u8, bytes);
            }
        }
        Kind::ReduceScatter(op) => {
            let mut outs = Vec::with_capacity(n);
            for r in 0..n {
                let ins: Vec<*const u8> = parts
                    .iter()
                    .map(|p| (p.send + r * bytes) as *const u8)
                    .collect();
                outs.push(reduce(&ins, p0.dtype, op, p0.count));
            }
            for (p, out) in parts.iter().zip(outs) {
                std::ptr::copy_nonoverlapping(out.as_ptr(), p.recv as *mut u8, bytes);
            }
        }
        Kind::AllGather => {
            let mut all = Vec::with_capacity(n * bytes);
            for p in parts {
                all.extend_from_slice(std::slice::from_raw_parts(p.send as *const u8, bytes));
            }
            for p in parts {
                std::ptr::copy_nonoverlapping(all.as_ptr(), p.recv as *mut u8, all.len());
            }
        }
        Kind::Broadcast { root } => {
            let data = std::slice::from_raw_parts(parts[root].send as *const u8, bytes).to_vec();
            for p in parts {
                std::ptr::copy_nonoverlapping(data.as_ptr(), p.recv as *mut u8, bytes);
            }
        }
    }
}

/// A collective's failure as a stream fault (an abort is not one; see [`ABORTED`]).
pub fn fault(what: &str, why: String) -> Result<(), Fault> {
    if why == ABORTED {
        eprintln!("dcpemu: {what}: {ABORTED}; the collective ends without a result");
        return Ok(());
    }
    Err(Fault::new(codes::LAUNCH_FAILED, format!("{what}: {why}")))
}
