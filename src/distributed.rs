//! Running one engine as an MPI job (`mpirun -np P dcpserve ... --distributed-executor-backend mpi`,
//! or `srun`): every process starts the same program; process 0 becomes the engine (API
//! server, scheduler, its share of the ranks) and every other process serves its share
//! of the ranks for it. Feature `mpi`.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // First thing in main(): in processes 1.. this serves ranks and exits.
//! let cluster = dcpserve::distributed::init()?;
//! // ... build and run the engine with `distributed_executor_backend: Mpi` ...
//! dcpserve::distributed::shutdown();
//! # let _ = cluster; Ok(()) }
//! ```

use std::sync::Arc;

use dcpserve_actors::remote::{host, Cluster};
use dcpserve_kernels::comm::mpi::MpiEnv;

pub use dcpserve_kernels::comm::mpi::launched_by_mpi;

/// Starts MPI. In process 0, connects to the other processes and returns the cluster
/// the engine's supervisors use; in any other process, serves ranks until process 0
/// shuts the job down (or is lost) and exits the process — it never returns there.
pub fn init() -> crate::Result<Arc<Cluster>> {
    let env = MpiEnv::init().map_err(|e| crate::Error::Config(e.to_string()))?;
    if env.world_rank() != 0 {
        let code = host::run(env);
        std::process::exit(code);
    }
    Cluster::start(env).map_err(crate::Error::Config)
}

/// Tells the rank processes to leave and finalizes MPI (a no-op outside an MPI job).
pub fn shutdown() {
    if let Some(c) = Cluster::global() {
        c.shutdown();
    }
}
