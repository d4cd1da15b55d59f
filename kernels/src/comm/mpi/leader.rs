//! The MPI phase of a hierarchical collective: one communicator per group among the
//! group's distinct processes, spoken by each process's leader (its first local member).

use std::mem::ManuallyDrop;
use std::os::raw::c_void;

use mpi::collective::{CommunicatorCollectives as _, Root as _, SystemOperation};
use mpi::datatype::{Equivalence, Partition, PartitionMut};
use mpi::raw::AsRaw as _;
use mpi::topology::{Communicator as _, Group as _, SimpleCommunicator};
use mpi::Count;

use super::MpiEnv;
use crate::comm::GroupId;
use crate::error::KernelError;

/// Tags of `MPI_Comm_create_group` are taken modulo this (the standard guarantees
/// `MPI_TAG_UB >= 32767`), so that creations of different groups running concurrently
/// from different threads do not match each other's messages.
const TAG_SPAN: u64 = 32_768;

/// A communicator among the leaders of one group's processes (rank `p` = the group's
/// `p`-th distinct process, in order of first appearance).
pub(super) struct LeaderComm {
    /// Freed on drop only while MPI is still running (see the `Drop` impl).
    comm: ManuallyDrop<SimpleCommunicator>,
}

impl Drop for LeaderComm {
    /// `MPI_Comm_free` after `MPI_Finalize` is an error that aborts the job, and a handle
    /// may outlive finalize (kept by a rank thread that is still winding down): then the
    /// handle is left to the process's exit.
    fn drop(&mut self) {
        if !mpi::environment::is_finalized() {
            // SAFETY: dropped once, here; not used afterwards.
            unsafe { ManuallyDrop::drop(&mut self.comm) };
        }
    }
}

// SAFETY: the handle is an MPI communicator; MPI runs with MPI_THREAD_MULTIPLE, so it may
// be used from any thread, and the owner (a `Mutex` in the leader's handle) ensures one
// thread at a time uses it.
unsafe impl Send for LeaderComm {}

/// MPI counts and displacements are C ints.
fn count(n: usize) -> Result<Count, KernelError> {
    Count::try_from(n).map_err(|_| {
        KernelError::Comm(format!(
            "{n} elements is more than one MPI call can move ({})",
            Count::MAX
        ))
    })
}

/// Counts and their displacements (prefix sums) as C ints.
fn counts_displs(counts: &[usize]) -> Result<(Vec<Count>, Vec<Count>), KernelError> {
    let mut displs = Vec::with_capacity(counts.len());
    let mut at = 0usize;
    for &c in counts {
        displs.push(count(at)?);
        at += c;
    }
    count(at)?;
    Ok((counts.iter().map(|&c| c as Count).collect(), displs))
}

fn check_len(what: &str, want: usize, got: usize) -> Result<(), KernelError> {
    if want == got {
        Ok(())
    } else {
        Err(KernelError::Shape(format!(
            "{what}: expected {want} values, got {got}"
        )))
    }
}

impl LeaderComm {
    /// Creates the communicator among the world ranks `processes` (distinct, in group
    /// order) with `MPI_Comm_create_group`: collective over those processes only (every
    /// one of them must call it, for the same group), so the other processes of the job
    /// need not take part. Blocks until all of them have called it.
    pub(super) fn create(
        env: &MpiEnv,
        processes: &[usize],
        id: GroupId,
    ) -> Result<Self, KernelError> {
        let world = env.world();
        let ranks = processes
            .iter()
            .map(|&p| count(p))
            .collect::<Result<Vec<_>, _>>()?;
        let group = world.group().include(&ranks);
        let tag = (id.0 % TAG_SPAN) as i32;
        let comm = world
            .split_by_subgroup_with_tag(&group, tag)
            .ok_or_else(|| {
                KernelError::Comm(format!(
                    "MPI_Comm_create_group for group {id:?} gave no communicator to world rank {} (processes {processes:?})",
                    env.world_rank()
                ))
            })?;
        Ok(Self {
            comm: ManuallyDrop::new(comm),
        })
    }

    /// `MPI_Allgatherv`: process `p` contributes `send` (`counts[p]` values); `out` is
    /// the concatenation in process order.
    pub(super) fn all_gather_v<W: Equivalence>(
        &self,
        send: &[W],
        counts: &[usize],
        out: &mut [W],
    ) -> Result<(), KernelError> {
        check_len("MPI all-gather output", counts.iter().sum(), out.len())?;
        check_len(
            "MPI all-gather input",
            counts[self.comm.rank() as usize],
            send.len(),
        )?;
        let (c, d) = counts_displs(counts)?;
        let mut part = PartitionMut::new(out, c, d);
        self.comm.all_gather_varcount_into(send, &mut part);
        Ok(())
    }

    /// `MPI_Reduce_scatter` of f32 sums: process `p` receives the `counts[p]` values of
    /// its block of the element-wise sum of every process's `send`. Each value is summed
    /// once, on the process that receives it.
    pub(super) fn reduce_scatter_sum_f32(
        &self,
        send: &[f32],
        counts: &[usize],
        out: &mut [f32],
    ) -> Result<(), KernelError> {
        check_len("MPI reduce-scatter input", counts.iter().sum(), send.len())?;
        check_len(
            "MPI reduce-scatter output",
            counts[self.comm.rank() as usize],
            out.len(),
        )?;
        let (c, _) = counts_displs(counts)?;
        // rsmpi 0.8 only wraps MPI_Reduce_scatter_block (equal counts); processes may host
        // different numbers of members, so call the counted form directly.
        // SAFETY: `send` holds sum(counts) f32s and `out` counts[rank] f32s (checked
        // above); the datatype, operation and communicator handles are live.
        let rc = unsafe {
            mpi::ffi::MPI_Reduce_scatter(
                send.as_ptr() as *const c_void,
                out.as_mut_ptr() as *mut c_void,
                c.as_ptr(),
                f32::equivalent_datatype().as_raw(),
                SystemOperation::sum().as_raw(),
                self.comm.as_raw(),
            )
        };
        if rc != 0 {
            return Err(KernelError::Comm(format!(
                "MPI_Reduce_scatter failed (error {rc})"
            )));
        }
        Ok(())
    }

    /// `MPI_Bcast` of `data` from process `root`.
    pub(super) fn broadcast<W: Equivalence>(&self, data: &mut [W], root: usize) {
        self.comm.process_at_rank(root as i32).broadcast_into(data);
    }

    /// `MPI_Alltoallv`: `send` holds `send_counts[q]` values for process `q` (in process
    /// order), `recv` receives `recv_counts[p]` values from process `p`.
    pub(super) fn all_to_all_v<W: Equivalence>(
        &self,
        send: &[W],
        send_counts: &[usize],
        recv: &mut [W],
        recv_counts: &[usize],
    ) -> Result<(), KernelError> {
        check_len("MPI all-to-all input", send_counts.iter().sum(), send.len())?;
        check_len(
            "MPI all-to-all output",
            recv_counts.iter().sum(),
            recv.len(),
        )?;
        let (sc, sd) = counts_displs(send_counts)?;
        let (rc, rd) = counts_displs(recv_counts)?;
        let s = Partition::new(send, sc, sd);
        let mut r = PartitionMut::new(recv, rc, rd);
        self.comm.all_to_all_varcount_into(&s, &mut r);
        Ok(())
    }
}
