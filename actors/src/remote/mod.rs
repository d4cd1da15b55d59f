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

use std::time::Duration;

pub use crate::process_map::ProcessMap;
#[cfg(feature = "mpi")]
pub use cluster::Cluster;

/// How often each side tells the other it is alive.
pub const HEARTBEAT_EVERY: Duration = Duration::from_millis(250);
/// Silence after which a process is declared lost. Liveness is heartbeats on threads that
/// do nothing else, not a step watchdog: a step may legitimately take longer (a long
/// prefill, a large shard loading) while its process still beats, and a stopped
/// (SIGSTOP) or dead process falls silent whatever its ranks were doing.
pub const LOST_AFTER: Duration = Duration::from_secs(3);

/// Warns when the MPI launcher bound this process to fewer cores than its host has: Open
/// MPI binds each process to one core by default (`--bind-to core` for up to 2
/// processes), and the rank threads of a process would then share that core.
#[cfg(feature = "mpi")]
pub(crate) fn warn_if_bound(process: usize) {
    let online = dcpserve_kernels::online_cores();
    let usable = dcpserve_kernels::available_cores();
    if usable < online {
        tracing::warn!(
            "MPI process {process} may use {usable} of its host's {online} cores (bound by the MPI launcher): its ranks' threads share them; launch with `mpirun --bind-to none` (or give each process the cores of its ranks, e.g. `--map-by ppr:1:node:PE=N`)"
        );
    }
}
