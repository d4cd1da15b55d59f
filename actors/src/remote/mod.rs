//! Rank actors in other processes: the ranks of a model split evenly over the processes
//! of an MPI job (`--distributed-executor-backend mpi`).
//!
//! Process 0 hosts the API server, the scheduler, the supervisor, the KV-block manager
//! and the first `tp / P` ranks; process `p` hosts ranks `p·tp/P ..`. The scheduler's
//! step plans (plain data, see [`crate::plan`]) reach a remote rank through a proxy actor
//! in process 0 that forwards them over MPI ([`proxy`]); the rank process runs the same
//! [`crate::rank::RankActor`]s as process 0 ([`host`]), and their failures come back the
//! same way. Collectives go rank to rank: shared memory inside a process, MPI between
//! processes (`dcpserve_kernels::comm::Transport::Mpi`). Liveness is a heartbeat each
//! way ([`cluster`]): a rank process that dies or hangs is declared lost within
//! [`LOST_AFTER`], its model's requests end with an error and the model reports itself
//! unavailable; an MPI job cannot take a lost process back, so the job is relaunched.

#[cfg(feature = "mpi")]
pub mod cluster;
#[cfg(feature = "mpi")]
pub mod host;
pub mod messages;
#[cfg(feature = "mpi")]
pub mod proxy;

use std::ops::Range;
use std::time::Duration;

use dcpserve_kernels::comm::Transport;
use serde::{Deserialize, Serialize};

#[cfg(feature = "mpi")]
pub use cluster::Cluster;

/// How often each side tells the other it is alive.
pub const HEARTBEAT_EVERY: Duration = Duration::from_millis(250);
/// Silence after which a process is declared lost.
pub const LOST_AFTER: Duration = Duration::from_secs(3);

/// Which process hosts which ranks: `ranks_per_process` consecutive ranks each.
///
/// ```
/// use dcpserve_actors::remote::ProcessMap;
/// let map = ProcessMap::new(4, 2).unwrap();
/// assert_eq!(map.ranks_of(1), 2..4);
/// assert_eq!(map.process_of(1), 0);
/// assert!(ProcessMap::new(4, 3).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessMap {
    pub processes: usize,
    pub ranks_per_process: usize,
}

impl ProcessMap {
    /// Every rank in this process.
    pub fn single(tp: usize) -> Self {
        Self {
            processes: 1,
            ranks_per_process: tp.max(1),
        }
    }

    /// `tp` ranks over `processes` processes; they must divide evenly.
    pub fn new(tp: usize, processes: usize) -> Result<Self, String> {
        if processes == 0 || !tp.is_multiple_of(processes) {
            return Err(format!(
                "--distributed-executor-backend mpi: the {processes} MPI processes must divide the tensor-parallel size {tp} (each process hosts tp / processes ranks)."
            ));
        }
        Ok(Self {
            processes,
            ranks_per_process: tp / processes,
        })
    }

    /// The process hosting global rank `rank`.
    pub fn process_of(&self, rank: usize) -> usize {
        rank / self.ranks_per_process
    }

    /// The ranks process `p` hosts.
    pub fn ranks_of(&self, p: usize) -> Range<usize> {
        p * self.ranks_per_process..(p + 1) * self.ranks_per_process
    }

    /// How a group of `ranks` communicates: shared memory when one process hosts them
    /// all, MPI otherwise.
    pub fn transport(&self, ranks: &[usize]) -> Transport {
        let processes: Vec<usize> = ranks.iter().map(|&r| self.process_of(r)).collect();
        if processes.windows(2).all(|w| w[0] == w[1]) {
            Transport::SharedMemory
        } else {
            Transport::Mpi { processes }
        }
    }
}
