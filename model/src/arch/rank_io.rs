//! What a forward step returns and the communicators it computes with: shared by the
//! dense and MLA forwards and the output head, kept apart from them so none of those
//! modules depends on another for these types.

use std::sync::Arc;

use dcpserve_kernels::dcp::MergeExchange;
use dcpserve_kernels::{Backend, Communicator, CpuBackend, InProcessComm};

/// Logits of the requested tokens, row-major `[logits_for.len(), vocab]`, in a buffer of
/// the backend (on the CPU a `Vec<f32>`).
pub struct ForwardOutput<B: Backend = CpuBackend> {
    pub logits: B::Buffer,
    pub vocab_size: usize,
}

/// The communicators one rank computes with: its tensor-parallel group (all ranks of
/// the model) and its decode-context-parallel group (a contiguous block of `dcp` ranks),
/// and how the DCP group exchanges attention partials.
#[derive(Clone)]
pub struct RankComms {
    pub world: Arc<dyn Communicator>,
    pub dcp: Arc<dyn Communicator>,
    pub dcp_merge: MergeExchange,
}

impl RankComms {
    /// The communicators of a model served by one rank (every collective is a no-op).
    pub fn single() -> Self {
        let world: Arc<dyn Communicator> = Arc::new(InProcessComm::group(1).remove(0));
        Self {
            dcp: world.clone(),
            world,
            dcp_merge: MergeExchange::default(),
        }
    }
}
