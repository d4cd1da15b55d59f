//! CUDA graphs of decode steps, one cache per lane (stream): the
//! [`StepGraphs`](crate::step_graph::StepGraphs) side of
//! [`step_graph`](crate::step_graph) on a [`CudaBackend`].
//!
//! A captured graph is stored under the key of the operations it holds (their
//! signatures' hash and count) and launched whenever a step's check pass produces the
//! same key. Keys carry every device address, so a graph is tied to the lane's
//! workspace, scratch and metadata half; a decode batch of one size uses two graphs
//! (one per staging half). The cache keeps the [`MAX_GRAPHS`] most recently used.
//!
//! Capture runs in thread-local mode: another thread (another rank on the GPU, the
//! other micro-batch) allocating memory meanwhile does not break it, while anything
//! this thread does that a capture forbids fails the capture, and the step runs
//! eagerly instead.

use std::collections::HashMap;
use std::sync::Mutex;

use cudarc::driver::{result, sys};

use crate::cuda::device::driver_err;
use crate::cuda::lanes;
use crate::cuda::CudaBackend;
use crate::error::KernelError;
use crate::step_graph::{
    GraphKey, Refusal, StepGraphs, PASSING_REFUSAL_WEIGHT, REFUSALS_BEFORE_OFF,
};

/// Graphs kept per lane (each is a few hundred nodes of host and device memory).
pub(crate) const MAX_GRAPHS: usize = 64;

/// An instantiated graph.
struct Exec {
    exec: sys::CUgraphExec,
    /// When it was last launched (the lane's step counter), for eviction.
    used: u64,
}

// SAFETY: a graph exec is a driver handle usable from any thread of the context; it
// is only touched under the lane's lock.
unsafe impl Send for Exec {}

impl Drop for Exec {
    fn drop(&mut self) {
        // An exec still running is freed by the driver when it completes.
        // SAFETY: the handle came from instantiate and is destroyed once.
        let _ = unsafe { result::graph::exec_destroy(self.exec) };
    }
}

/// How a lane's decode steps ran.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GraphStats {
    /// Steps launched from a stored graph.
    pub replayed: u64,
    /// Steps captured into a new graph (and launched).
    pub captured: u64,
    /// Steps that tried a graph and ran eagerly (an operation refused).
    pub refused: u64,
}

/// One lane's graphs and pass bookkeeping.
#[derive(Default)]
pub(crate) struct LaneGraphs {
    execs: HashMap<GraphKey, Exec>,
    /// Steps seen (the clock of `Exec::used`).
    clock: u64,
    /// Why graphs are off on this lane, once they are.
    off: Option<String>,
    /// Refused steps in a row, weighted (a passing refusal counts 1, a lasting one
    /// [`PASSING_REFUSAL_WEIGHT`]).
    streak: u32,
    /// Keys seen once and not captured yet (their first step ran eagerly), with the
    /// clock of that step; bounded like the graphs.
    seen: HashMap<GraphKey, u64>,
    /// The staging arena's position when the step's first pass began.
    saved_meta: Option<usize>,
    capturing: bool,
    stats: GraphStats,
}

impl LaneGraphs {
    /// Stores `exec` under `key`, dropping the least recently used past [`MAX_GRAPHS`].
    fn store(&mut self, key: GraphKey, exec: sys::CUgraphExec) {
        self.execs.insert(
            key,
            Exec {
                exec,
                used: self.clock,
            },
        );
        while self.execs.len() > MAX_GRAPHS {
            let oldest = self
                .execs
                .iter()
                .min_by_key(|(_, e)| e.used)
                .map(|(k, _)| *k);
            match oldest {
                Some(k) => drop(self.execs.remove(&k)),
                None => break,
            }
        }
    }
}

impl CudaBackend {
    /// The calling thread's lane graphs.
    fn lane_graphs(&self) -> std::sync::MutexGuard<'_, LaneGraphs> {
        lanes::lock(&self.graphs[self.lane_index()])
    }

    /// How the calling thread's lane ran its decode steps so far, and why graphs are
    /// off on it (when they are).
    pub fn graph_stats(&self) -> (GraphStats, Option<String>) {
        let g = self.lane_graphs();
        (g.stats, g.off.clone())
    }

    fn bind(&self) -> Result<(), KernelError> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| driver_err("binding the context", e))
    }
}

/// New graph state for `lanes` lanes.
pub(crate) fn lane_graphs(lanes: usize) -> Vec<Mutex<LaneGraphs>> {
    (0..lanes).map(|_| Mutex::default()).collect()
}

impl StepGraphs for CudaBackend {
    fn graphs_on(&self) -> bool {
        self.lane_graphs().off.is_none()
    }

    fn save_state(&self) -> Result<(), KernelError> {
        let mark = self.meta_mark();
        let mut g = self.lane_graphs();
        g.clock += 1;
        g.saved_meta = Some(mark);
        Ok(())
    }

    fn restore_state(&self) -> Result<(), KernelError> {
        let mark = self.lane_graphs().saved_meta;
        match mark {
            Some(m) => self.meta_reset(m),
            None => Ok(()),
        }
    }

    fn launch_cached(&self, key: GraphKey) -> Result<bool, KernelError> {
        let mut g = self.lane_graphs();
        let clock = g.clock;
        let Some(e) = g.execs.get_mut(&key) else {
            return Ok(false);
        };
        e.used = clock;
        self.bind()?;
        // SAFETY: a live exec of this context, launched on the lane's stream.
        unsafe { result::graph::launch(e.exec, self.stream().cu_stream()) }
            .map_err(|e| driver_err("launching a CUDA graph", e))?;
        Ok(true)
    }

    fn begin_capture(&self) -> Result<(), KernelError> {
        self.bind()?;
        // SAFETY: the lane's live stream; ended by finish/abandon_capture.
        unsafe {
            result::stream::begin_capture(
                self.stream().cu_stream(),
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        }
        .map_err(|e| driver_err("starting a stream capture", e))?;
        self.lane_graphs().capturing = true;
        Ok(())
    }

    fn finish_capture(&self, key: GraphKey) -> Result<(), KernelError> {
        let stream = self.stream().cu_stream();
        self.lane_graphs().capturing = false;
        // SAFETY: the stream is capturing (begin_capture succeeded).
        let graph = unsafe { result::stream::end_capture(stream) }
            .map_err(|e| driver_err("ending a stream capture", e))?;
        if graph.is_null() {
            return Err(KernelError::Device(
                "the stream capture produced no graph".into(),
            ));
        }
        // SAFETY: `graph` is the valid graph just captured; destroyed right after
        // instantiation (the exec does not need it).
        let exec = unsafe {
            let exec = result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0));
            let _ = result::graph::destroy(graph);
            exec
        }
        .map_err(|e| driver_err("instantiating a CUDA graph", e))?;
        // SAFETY: the fresh exec, on the lane's stream.
        if let Err(e) = unsafe { result::graph::launch(exec, stream) } {
            // Not kept: a graph that cannot launch would fail every later replay.
            // SAFETY: the exec just instantiated, never launched.
            let _ = unsafe { result::graph::exec_destroy(exec) };
            return Err(driver_err("launching a CUDA graph", e));
        }
        let mut g = self.lane_graphs();
        g.seen.remove(&key);
        g.store(key, exec);
        Ok(())
    }

    fn first_sighting(&self, key: GraphKey) -> bool {
        let mut g = self.lane_graphs();
        if g.seen.contains_key(&key) {
            return false;
        }
        let clock = g.clock;
        g.seen.insert(key, clock);
        if g.seen.len() > 4 * MAX_GRAPHS {
            // Forget the older half (shapes that did not come back soon).
            let mut clocks: Vec<u64> = g.seen.values().copied().collect();
            clocks.sort_unstable();
            let cut = clocks[clocks.len() / 2];
            g.seen.retain(|_, &mut c| c > cut);
        }
        true
    }

    fn abandon_capture(&self) {
        let mut g = self.lane_graphs();
        if !std::mem::take(&mut g.capturing) {
            return;
        }
        // SAFETY: the stream is capturing; ending it (even an invalidated capture)
        // returns the stream to normal, and a graph it hands back is destroyed.
        if let Ok(graph) = unsafe { result::stream::end_capture(self.stream().cu_stream()) } {
            if !graph.is_null() {
                let _ = unsafe { result::graph::destroy(graph) };
            }
        }
    }

    fn note_refusal(&self, why: &Refusal) -> bool {
        let lane = self.lane_index();
        let mut g = self.lane_graphs();
        g.stats.refused += 1;
        g.streak += if why.passing {
            1
        } else {
            PASSING_REFUSAL_WEIGHT
        };
        let why = &why.what;
        if g.streak >= REFUSALS_BEFORE_OFF * PASSING_REFUSAL_WEIGHT && g.off.is_none() {
            tracing::warn!(
                device = self.ordinal(),
                stream = lane,
                "CUDA graphs off for this stream: its decode steps keep failing to be \
                 captured (last: {why}); they launch kernels one by one"
            );
            g.off = Some(why.to_string());
        }
        g.off.is_some()
    }

    fn note_graph_step(&self, captured: bool) {
        let mut g = self.lane_graphs();
        g.streak = 0;
        if captured {
            g.stats.captured += 1;
        } else {
            g.stats.replayed += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn graph_state_starts_empty_and_on() {
        let lanes = lane_graphs(2);
        assert_eq!(lanes.len(), 2);
        let g = lanes[1].lock().unwrap();
        assert!(g.off.is_none() && g.execs.is_empty() && !g.capturing);
        assert_eq!(g.stats, GraphStats::default());
    }
}
