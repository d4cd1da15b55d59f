//! Which process of an MPI job hosts which ranks (all of them in this process without MPI).

use std::ops::Range;

use dcpserve_kernels::comm::Transport;
use serde::{Deserialize, Serialize};

/// Which process hosts which ranks: `ranks_per_process` consecutive ranks each.
///
/// ```
/// use dcpserve_actors::process_map::ProcessMap;
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
    pub fn single(world: usize) -> Self {
        Self {
            processes: 1,
            ranks_per_process: world.max(1),
        }
    }

    /// `world` ranks (tp × pcp) over `processes` processes; they must divide evenly.
    pub fn new(world: usize, processes: usize) -> Result<Self, String> {
        if processes == 0 || !world.is_multiple_of(processes) {
            return Err(format!(
                "--distributed-executor-backend mpi: the {processes} MPI processes must divide the world size {world} (tensor-parallel × prefill-context-parallel size; each process hosts world / processes ranks)."
            ));
        }
        Ok(Self {
            processes,
            ranks_per_process: world / processes,
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
