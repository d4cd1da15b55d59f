//! [`StepQueues`]: which of a device's queues the calling thread's ops go to, and
//! whether steps replay from device graphs. A backend with one queue (the CPU, whose
//! ops run on the calling thread) keeps every default.

use crate::error::KernelError;
use crate::step_graph::StepGraphs;

/// The queues a rank's compute threads enqueue on (one per micro-batch) and the step
/// boundaries a device backend recycles its staging memory at.
pub trait StepQueues: Send + Sync {
    /// Sends the calling thread's later ops to micro-batch `mb`'s queue, ordered after
    /// everything already enqueued on the other queues (the rank's compute thread of
    /// micro-batch `mb` calls it before serving). CUDA: stream `mb`, so one
    /// micro-batch's collectives overlap the other's kernels; a backend with one queue
    /// ignores it.
    fn bind_micro_batch(&self, mb: usize) -> Result<(), KernelError> {
        let _ = mb;
        Ok(())
    }
    /// The micro-batch the calling thread bound ([`StepQueues::bind_micro_batch`]); 0
    /// when it bound none or the backend has one queue. Buffers a micro-batch reuses
    /// from step to step (workspaces) stay with it, since two queues do not order with
    /// each other.
    fn micro_batch(&self) -> usize {
        0
    }
    /// Marks the start of a step on the calling thread's queue, before its first op:
    /// a device backend recycles the step metadata staged by earlier steps (CUDA: its
    /// pinned staging arena, after an event of the step before last). Ops work without
    /// it too (they stage into fresh room, waiting when it runs out).
    fn begin_step(&self) -> Result<(), KernelError> {
        Ok(())
    }
    /// The calling thread's queue as a device-graph runner, when this backend replays
    /// steps from graphs ([`step_graph::run_step`](crate::step_graph::run_step) drives
    /// it); `None` (the CPU, or graphs switched off) runs every step eagerly.
    fn step_graphs(&self) -> Option<&dyn StepGraphs> {
        None
    }
}
