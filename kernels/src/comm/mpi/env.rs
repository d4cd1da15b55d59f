//! The process's MPI environment: started once, never twice, and finalized on the way out.

use std::sync::{Mutex, OnceLock, PoisonError};

use mpi::environment::Universe;
use mpi::topology::{Communicator as _, SimpleCommunicator};
use mpi::Threading;

use crate::error::KernelError;

/// This process's place in the MPI job.
pub struct MpiEnv {
    universe: Mutex<Option<Universe>>,
    rank: usize,
    size: usize,
    host: String,
}

static ENV: OnceLock<Result<MpiEnv, String>> = OnceLock::new();

/// Whether an MPI launcher (`mpirun`, `srun` with PMIx/PMI2) started this process: the
/// launchers' environment variables, read before MPI is initialized.
pub fn launched_by_mpi() -> bool {
    ["OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"]
        .iter()
        .any(|v| std::env::var_os(v).is_some())
}

impl MpiEnv {
    /// Initializes MPI with full thread support (once per process; later calls return the
    /// same environment). Fails when the MPI library cannot give `MPI_THREAD_MULTIPLE`.
    pub fn init() -> Result<&'static MpiEnv, KernelError> {
        ENV.get_or_init(|| {
            let (universe, threading) = mpi::initialize_with_threading(Threading::Multiple)
                .ok_or("MPI was already initialized by someone else")?;
            if threading != Threading::Multiple {
                return Err(format!(
                    "the MPI library gives thread support {threading:?}, and the rank processes need MPI_THREAD_MULTIPLE (Open MPI 4 built with threads does)"
                ));
            }
            // A peer that dies must not take this process down with it: errors are
            // returned (and the heartbeats tell a lost process), not fatal. Communicators
            // created later inherit the handler.
            // SAFETY: plain MPI call on the world communicator after initialization.
            unsafe {
                mpi::ffi::MPI_Comm_set_errhandler(
                    mpi::ffi::RSMPI_COMM_WORLD,
                    mpi::ffi::RSMPI_ERRORS_RETURN,
                );
            }
            let world = universe.world();
            let host = mpi::environment::processor_name().unwrap_or_else(|_| "?".into());
            Ok(MpiEnv {
                rank: world.rank() as usize,
                size: world.size() as usize,
                host,
                universe: Mutex::new(Some(universe)),
            })
        })
        .as_ref()
        .map_err(|e| KernelError::Comm(format!("starting MPI: {e}")))
    }

    /// The environment, if [`MpiEnv::init`] succeeded in this process.
    pub fn get() -> Option<&'static MpiEnv> {
        ENV.get().and_then(|e| e.as_ref().ok())
    }

    /// This process's rank in `MPI_COMM_WORLD`.
    pub fn world_rank(&self) -> usize {
        self.rank
    }

    /// Processes in the job.
    pub fn world_size(&self) -> usize {
        self.size
    }

    /// The host this process runs on (`MPI_Get_processor_name`).
    pub fn host(&self) -> &str {
        &self.host
    }

    /// `MPI_COMM_WORLD`, to duplicate or split (collectively, in the same order on every
    /// process).
    pub fn world(&self) -> SimpleCommunicator {
        SimpleCommunicator::world()
    }

    /// Finalizes MPI (`MPI_Finalize`, collective over the job): call once, when every
    /// process is leaving in order. A process that leaves after a peer died should exit
    /// without it (finalize would wait for the dead peer).
    pub fn finalize(&self) {
        let universe = self
            .universe
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        drop(universe);
    }
}
