//! Hierarchical collectives of a group whose members live in several MPI processes.
//!
//! The members one process hosts are threads: they meet through a shared-memory
//! [`InProcessComm`] (in group order). The first of them, the process's *leader*, also
//! holds an MPI communicator among the group's distinct processes (`LeaderComm`). Every
//! collective is a local phase (gather or reduce the process's members), the leaders' MPI
//! phase, then a local broadcast of the result. A group hosted by one process needs no
//! MPI phase at all.
//!
//! Members of one process must be contiguous in group order, so that a process's share
//! of any rank-ordered buffer is one block and the MPI phase is a plain `*v` collective.
//!
//! Failure: [`Communicator::abort`] marks the process's part of the group aborted (every
//! later call fails at once) and aborts the local [`InProcessComm`], so local members
//! waiting for the leader wake with an error. An MPI call that is already blocked waiting
//! for a dead peer process cannot be interrupted (MPI has no way to cancel a blocking
//! collective); a process that dies ends the job through the launcher (`mpirun` kills the
//! other processes), which is how such a wait ends.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use super::layout::{spans, split, Layout};
use super::leader::LeaderComm;
use super::wire::WireElem;
use super::MpiEnv;
use crate::comm::elems::ElemsMut;
use crate::comm::{CommGroupSpec, Communicator, InProcessComm};
use crate::error::KernelError;

/// What the members one process hosts share.
struct ProcessPart {
    layout: Layout,
    aborted: AtomicBool,
}

/// One member's handle on a group whose members live in several MPI processes (see the
/// [module docs](self)). Built by [`crate::comm::GroupOwner::adopt`] for
/// [`crate::comm::Transport::Mpi`]; a member uses it from one thread at a time.
pub struct HierarchicalComm {
    rank: usize,
    local: InProcessComm,
    part: Arc<ProcessPart>,
    /// The leader's MPI communicator (`None` on other members, or when the group has one
    /// process).
    mpi: Option<Mutex<LeaderComm>>,
    nanos: AtomicU64,
}

/// This process's members of the group `spec` lays out over the MPI processes
/// `processes`, indexed by group rank (`None` for members of other processes). Creates the
/// leaders' MPI communicator: blocks until every process of the group has called this
/// for the group.
pub(crate) fn adopt(
    spec: &CommGroupSpec,
    processes: &[usize],
) -> Result<Vec<Option<Arc<dyn Communicator>>>, KernelError> {
    let env = MpiEnv::get().ok_or_else(|| {
        KernelError::Comm(format!(
            "MPI is not initialized in this process (call MpiEnv::init before adopting MPI group {:?})",
            spec.id
        ))
    })?;
    if processes.len() != spec.ranks.len() {
        return Err(KernelError::Comm(format!(
            "an MPI group of {} ranks names {} processes",
            spec.ranks.len(),
            processes.len()
        )));
    }
    if let Some(&p) = processes.iter().find(|&&p| p >= env.world_size()) {
        return Err(KernelError::Comm(format!(
            "MPI group {:?} names process {p}, but the job has {} processes",
            spec.id,
            env.world_size()
        )));
    }
    let spans = spans(processes)?;
    let me = spans
        .iter()
        .position(|(p, _)| *p == env.world_rank())
        .ok_or_else(|| {
            KernelError::Comm(format!(
                "MPI process {} hosts no member of group {:?} (processes {processes:?})",
                env.world_rank(),
                spec.id
            ))
        })?;
    let mpi = if spans.len() > 1 {
        let procs: Vec<usize> = spans.iter().map(|(p, _)| *p).collect();
        Some(LeaderComm::create(env, &procs, spec.id)?)
    } else {
        None
    };
    let layout = Layout {
        size: processes.len(),
        spans: spans.into_iter().map(|(_, s)| s).collect(),
        me,
    };
    let mine = layout.mine();
    let part = Arc::new(ProcessPart {
        layout,
        aborted: AtomicBool::new(false),
    });
    let mut out: Vec<Option<Arc<dyn Communicator>>> = vec![None; processes.len()];
    let mut mpi = mpi.map(Mutex::new);
    for (local, rank) in InProcessComm::group(mine.len()).into_iter().zip(mine) {
        out[rank] = Some(Arc::new(HierarchicalComm {
            rank,
            local,
            part: part.clone(),
            mpi: mpi.take(),
            nanos: AtomicU64::new(0),
        }));
    }
    Ok(out)
}

fn len_error(what: &str, want: usize, got: usize) -> KernelError {
    KernelError::Shape(format!("{what}: expected {want} values, got {got}"))
}

impl HierarchicalComm {
    fn layout(&self) -> &Layout {
        &self.part.layout
    }

    /// Runs a collective: fails at once when aborted, counts its time.
    fn call(&self, f: impl FnOnce() -> Result<(), KernelError>) -> Result<(), KernelError> {
        self.check()?;
        let t = Instant::now();
        let r = f();
        self.nanos
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        r
    }

    fn check(&self) -> Result<(), KernelError> {
        if self.part.aborted.load(Ordering::Acquire) {
            Err(KernelError::Comm(
                "the group was aborted (a rank of the group failed)".into(),
            ))
        } else {
            Ok(())
        }
    }

    /// The leader's MPI phase (a no-op on other members and in a one-process group). An
    /// error breaks the process's part of the group, so the members waiting for the
    /// leader's result fail instead of waiting forever.
    fn leader_phase(
        &self,
        f: impl FnOnce(&LeaderComm) -> Result<(), KernelError>,
    ) -> Result<(), KernelError> {
        let Some(mpi) = &self.mpi else {
            return Ok(());
        };
        let r = self.check().and_then(|()| {
            let comm = mpi.lock().unwrap_or_else(PoisonError::into_inner);
            f(&comm)
        });
        if r.is_err() {
            self.abort();
        }
        r
    }

    /// The leader's result to the process's other members (after an MPI phase).
    fn local_result<T: WireElem>(&self, data: &mut [T]) -> Result<(), KernelError> {
        if self.layout().multi() {
            self.local.broadcast_elems(T::elems_mut(data), 0)?;
        }
        Ok(())
    }

    fn all_gather_t<T: WireElem>(&self, input: &[T], out: &mut [T]) -> Result<(), KernelError> {
        let (n, c) = (self.size(), input.len());
        if out.len() != n * c {
            return Err(len_error("all_gather output", n * c, out.len()));
        }
        let mine = self.layout().mine();
        self.call(|| {
            // This process's members fill their block of `out`…
            let block = mine.start * c..mine.end * c;
            self.local
                .all_gather_elems(T::elems(input), T::elems_mut(&mut out[block.clone()]))?;
            // …the leaders exchange blocks…
            self.leader_phase(|mpi| {
                let send = out[block].to_vec();
                mpi.all_gather_v(
                    T::wire(&send),
                    &self.layout().proc_counts(c),
                    T::wire_mut(out),
                )
            })?;
            // …and the leader hands the whole to its members.
            self.local_result(out)
        })
    }

    fn all_gather_varying_t<T: WireElem>(
        &self,
        input: &[T],
        counts: &[usize],
        out: &mut [T],
    ) -> Result<(), KernelError> {
        if counts.len() != self.size() || counts[self.rank] != input.len() {
            return Err(KernelError::Shape(
                "all_gather_varying: counts disagree with input".into(),
            ));
        }
        let total: usize = counts.iter().sum();
        if out.len() != total {
            return Err(len_error("all_gather_varying output", total, out.len()));
        }
        let mine = self.layout().mine();
        let at: usize = counts[..mine.start].iter().sum();
        let len: usize = counts[mine.clone()].iter().sum();
        self.call(|| {
            self.local.all_gather_varying_elems(
                T::elems(input),
                &counts[mine.clone()],
                T::elems_mut(&mut out[at..at + len]),
            )?;
            self.leader_phase(|mpi| {
                let send = out[at..at + len].to_vec();
                let proc_counts: Vec<usize> = self
                    .layout()
                    .spans
                    .iter()
                    .map(|s| counts[s.clone()].iter().sum())
                    .collect();
                mpi.all_gather_v(T::wire(&send), &proc_counts, T::wire_mut(out))
            })?;
            self.local_result(out)
        })
    }

    /// Sum over ranks, identical on every rank. The process's members are summed in f32,
    /// in group order, through shared memory; the leaders then reduce-scatter those
    /// partial sums (`MPI_Reduce_scatter`: each value is summed exactly once, on the
    /// process that owns its block) and all-gather the blocks (`MPI_Allgatherv`: copies).
    /// So every rank receives the very bits one process computed, whatever order MPI
    /// sums in (`MPI_Allreduce` does not promise identical results on every process), and
    /// no root process carries the whole reduction (as `MPI_Reduce` + `MPI_Bcast` would).
    ///
    /// bf16: MPI has no bf16 sum, so values are summed in f32 and rounded to bf16 once, at
    /// the end (more exact than the in-process group, which rounds after each addition).
    fn all_reduce_sum_t<T: WireElem>(&self, data: &mut [T]) -> Result<(), KernelError> {
        if self.size() == 1 {
            return self.check();
        }
        self.call(|| {
            let mut acc: Vec<f32> = data.iter().map(|&x| x.to_f32()).collect();
            self.local.all_reduce_sum_elems(ElemsMut::F32(&mut acc))?;
            if !self.layout().multi() {
                data.iter_mut()
                    .zip(&acc)
                    .for_each(|(d, &a)| *d = T::from_f32(a));
                return Ok(());
            }
            self.leader_phase(|mpi| {
                let l = self.layout();
                let blocks = split(acc.len(), l.spans.len());
                let mut block = vec![0f32; blocks[l.me]];
                mpi.reduce_scatter_sum_f32(&acc, &blocks, &mut block)?;
                // Rounded once, before the all-gather (which then moves bf16: half the bytes).
                let block: Vec<T> = block.into_iter().map(T::from_f32).collect();
                mpi.all_gather_v(T::wire(&block), &blocks, T::wire_mut(data))
            })?;
            self.local_result(data)
        })
    }

    /// Sum over ranks, scattered: the process's members are summed in f32 through shared
    /// memory, the leaders reduce-scatter the partial sums by process
    /// (`MPI_Reduce_scatter` with each process's members' share), and each leader hands its
    /// members their chunks. bf16 is summed in f32 and rounded once (see all-reduce).
    fn reduce_scatter_sum_t<T: WireElem>(
        &self,
        input: &[T],
        out: &mut [T],
    ) -> Result<(), KernelError> {
        let (n, c) = (self.size(), out.len());
        if input.len() != n * c {
            return Err(len_error("reduce_scatter input", n * c, input.len()));
        }
        let mine = self.layout().mine();
        self.call(|| {
            let mut acc: Vec<f32> = input.iter().map(|&x| x.to_f32()).collect();
            self.local.all_reduce_sum_elems(ElemsMut::F32(&mut acc))?;
            if !self.layout().multi() {
                let chunk = &acc[self.rank * c..(self.rank + 1) * c];
                out.iter_mut()
                    .zip(chunk)
                    .for_each(|(d, &a)| *d = T::from_f32(a));
                return Ok(());
            }
            // The process's chunks (its members', in order), summed over processes.
            let mut chunks = vec![T::default(); mine.len() * c];
            self.leader_phase(|mpi| {
                let mut sums = vec![0f32; mine.len() * c];
                mpi.reduce_scatter_sum_f32(&acc, &self.layout().proc_counts(c), &mut sums)?;
                chunks
                    .iter_mut()
                    .zip(&sums)
                    .for_each(|(d, &s)| *d = T::from_f32(s));
                Ok(())
            })?;
            self.local_result(&mut chunks)?;
            let j = self.rank - mine.start;
            out.copy_from_slice(&chunks[j * c..(j + 1) * c]);
            Ok(())
        })
    }

    /// From any root: through shared memory to the root's leader, `MPI_Bcast` from the
    /// root's process, then from each other leader to its members.
    fn broadcast_t<T: WireElem>(&self, data: &mut [T], root: usize) -> Result<(), KernelError> {
        if root >= self.size() {
            return Err(KernelError::Shape(format!(
                "broadcast root {root} out of range"
            )));
        }
        let l = self.layout();
        let root_proc = l.spans.iter().position(|s| s.contains(&root)).unwrap();
        let mine = l.mine();
        self.call(|| {
            if root_proc == l.me {
                self.local
                    .broadcast_elems(T::elems_mut(data), root - mine.start)?;
            }
            self.leader_phase(|mpi| {
                mpi.broadcast(T::wire_mut(data), root_proc);
                Ok(())
            })?;
            if root_proc != l.me {
                self.local_result(data)?;
            }
            Ok(())
        })
    }

    /// All-to-all: each leader gathers its members' inputs through shared memory, sends
    /// each process the chunks its members are owed (`MPI_Alltoallv`: processes host
    /// different numbers of members), and hands its members what arrived.
    fn all_to_all_t<T: WireElem>(&self, input: &[T], out: &mut [T]) -> Result<(), KernelError> {
        let n = self.size();
        crate::comm::elems::check_all_to_all(n, input.len(), out.len())?;
        let l = self.layout();
        if !l.multi() {
            // One process: the local group is the whole group, in the same order.
            return self.call(|| {
                self.local
                    .all_to_all_elems(T::elems(input), T::elems_mut(out))
            });
        }
        let c = input.len() / n;
        let mine = l.mine();
        let ln = mine.len();
        self.call(|| {
            // [local member i][destination member s][c]
            let mut gathered = vec![T::default(); ln * n * c];
            self.local
                .all_gather_elems(T::elems(input), T::elems_mut(&mut gathered))?;
            // [source member r, in group order][local destination j][c]
            let mut recv = vec![T::default(); n * ln * c];
            self.leader_phase(|mpi| {
                let mut send = Vec::with_capacity(ln * n * c);
                for q in &l.spans {
                    for i in 0..ln {
                        send.extend_from_slice(
                            &gathered[(i * n + q.start) * c..(i * n + q.end) * c],
                        );
                    }
                }
                let send_counts: Vec<usize> = l.spans.iter().map(|q| ln * q.len() * c).collect();
                mpi.all_to_all_v(
                    T::wire(&send),
                    &send_counts,
                    T::wire_mut(&mut recv),
                    &send_counts,
                )
            })?;
            self.local_result(&mut recv)?;
            let j = self.rank - mine.start;
            for r in 0..n {
                out[r * c..(r + 1) * c]
                    .copy_from_slice(&recv[(r * ln + j) * c..(r * ln + j + 1) * c]);
            }
            Ok(())
        })
    }
}

impl Communicator for HierarchicalComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.layout().size
    }

    crate::comm::elems::communicator_elems_by_type!();

    /// Marks this process's part of the group aborted (every later call of its members
    /// fails at once) and aborts the local shared-memory group, so members waiting on it
    /// wake with an error. Members in other processes are not told (MPI cannot interrupt
    /// their blocked calls; a dead process ends the job through the launcher).
    fn abort(&self) {
        self.part.aborted.store(true, Ordering::SeqCst);
        self.local.abort();
    }

    fn seconds_in_collectives(&self) -> f64 {
        self.nanos.load(Ordering::Relaxed) as f64 * 1e-9
    }
}
