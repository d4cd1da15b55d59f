//! Ranks in other processes, launched and connected by MPI (Open MPI through the `mpi`
//! crate; feature `mpi`).
//!
//! [`env`](mod@env) starts MPI once per process (`MPI_Init_thread` with `MPI_THREAD_MULTIPLE`: the
//! control plane and every rank's collectives call MPI from their own threads) and says
//! which process this is. [`ControlChannel`] carries the control plane's messages (step
//! plans out, step answers and failures back) between process 0 and the rank processes as
//! MPI point-to-point messages: no second socket protocol. [`HierarchicalComm`] is a rank's
//! communicator in a group spread over processes ([`crate::comm::Transport::Mpi`]):
//! shared memory between the members of one process, MPI between processes.

pub mod control;
pub mod env;
pub mod hierarchical;
mod layout;
mod leader;
mod wire;

pub use control::ControlChannel;
pub use env::{launched_by_mpi, MpiEnv};
pub use hierarchical::HierarchicalComm;
