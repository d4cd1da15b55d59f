//! The control plane's transport: byte messages between the processes of the job, as MPI
//! point-to-point messages on a communicator of their own (a duplicate of
//! `MPI_COMM_WORLD`, so they never match a collective's traffic).

use mpi::point_to_point::{Destination as _, MatchedReceiveVec as _, Source as _};
use mpi::topology::{Communicator as _, SimpleCommunicator};

use super::MpiEnv;

/// Tag of every control message (order between two processes is MPI's: non-overtaking).
const CONTROL_TAG: i32 = 7;

/// Byte messages to and from the other processes of the job.
pub struct ControlChannel {
    /// Freed on drop only while MPI is still up (`MPI_Comm_free` after `MPI_Finalize`
    /// aborts the job).
    comm: std::mem::ManuallyDrop<SimpleCommunicator>,
}

impl Drop for ControlChannel {
    fn drop(&mut self) {
        if !mpi::environment::is_finalized() {
            // SAFETY: dropped once, here, and never used again.
            unsafe { std::mem::ManuallyDrop::drop(&mut self.comm) };
        }
    }
}

// SAFETY: MPI is initialized with MPI_THREAD_MULTIPLE (`MpiEnv::init` refuses less), so
// any thread may send and probe on the communicator; the handle itself never changes.
unsafe impl Send for ControlChannel {}
unsafe impl Sync for ControlChannel {}

impl ControlChannel {
    /// The job's control channel. Collective: every process creates it once, at start-up,
    /// before any other communicator.
    pub fn new(env: &MpiEnv) -> Self {
        Self {
            comm: std::mem::ManuallyDrop::new(env.world().duplicate()),
        }
    }

    /// This process's rank in the job.
    pub fn rank(&self) -> usize {
        self.comm.rank() as usize
    }

    /// Processes in the job.
    pub fn size(&self) -> usize {
        self.comm.size() as usize
    }

    /// Sends `bytes` to process `to` (returns once the buffer may be reused).
    pub fn send(&self, to: usize, bytes: &[u8]) {
        self.comm
            .process_at_rank(to as i32)
            .send_with_tag(bytes, CONTROL_TAG);
    }

    /// A message that has arrived, if any: its sender and bytes. Never blocks (blocking MPI
    /// receives spin on a core; callers poll and sleep instead).
    pub fn try_recv(&self) -> Option<(usize, Vec<u8>)> {
        let matched = self
            .comm
            .any_process()
            .immediate_matched_probe_with_tag(CONTROL_TAG)?;
        let (bytes, status) = matched.matched_receive_vec::<u8>();
        Some((status.source_rank() as usize, bytes))
    }
}
