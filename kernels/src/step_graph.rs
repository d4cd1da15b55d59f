//! Decode steps as device graphs (CUDA graphs), replayed only when they provably equal
//! the step at hand.
//!
//! A decode step of a small model is hundreds of tiny kernels; launched one by one, the
//! GPU waits on the host between them. A captured graph runs them back to back. The
//! danger is replaying a graph that differs from what the step would have launched (a
//! new batch size, a grown table, a moved buffer). So every device operation of a
//! step goes through [`enqueue`] with its *signature*: the operation's kind and every
//! argument it is launched with (device addresses, sizes, scalars, grid). A step runs
//! in passes ([`run_step`]):
//!
//! 1. **Check**: the step's host code runs (staging its metadata into pinned memory as
//!    always) but no operation is issued; their signatures are hashed. If a graph was
//!    captured from a step with the same hash and count ([`GraphKey`]), that graph is
//!    launched: it is exactly the launches this step would make, reading this step's
//!    metadata from the same pinned addresses.
//! 2. **Record** (on a miss): the step runs again under stream capture; the captured
//!    graph is stored under its own key and launched. A key seen for the first time is
//!    run eagerly instead (a warm-up: first runs initialise things a capture must not
//!    contain, and a shape seen once is not worth a graph); an error in the capture
//!    also falls back to an eager run.
//! 3. **Eager**: any operation that cannot be part of a graph (a download, a host
//!    wait, an allocation, a collective with host rendezvous) refuses itself in a graph
//!    pass ([`refuse`]); the step is then run eagerly. A lane whose steps keep refusing
//!    ([`REFUSALS_BEFORE_OFF`] in a row, e.g. MoE routing read back on the host) turns
//!    graphs off for good, with the reason; refusals that pass once buffers have grown
//!    ([`refuse_for_now`]) weigh far less.
//!
//! Steps are made graph-stable by design elsewhere: buffers live in workspaces and
//! scratch that persist across steps, metadata has bucketed sizes, and attention's
//! split plan depends on a bucketed context length; so a decode batch of a given size
//! replays the same graph until a bucket changes.
//!
//! The pass state is per thread: each micro-batch's compute thread drives its own
//! lane (stream). Backends without graphs ([`StepQueues::step_graphs`] is `None`, the
//! CPU) run every step eagerly and [`enqueue`] just runs the operation.
//!
//! [`StepQueues::step_graphs`]: crate::StepQueues::step_graphs

use std::cell::RefCell;
use std::hash::{DefaultHasher, Hasher};

use crate::error::KernelError;

/// Refused graph steps in a row after which a lane stops trying graphs (a refusal that
/// only a first-time growth causes counts as 1/[`PASSING_REFUSAL_WEIGHT`] of one).
pub const REFUSALS_BEFORE_OFF: u32 = 4;

/// How many refusals "for now" ([`refuse_for_now`]: a buffer growing, an arena
/// outgrown) make one lasting refusal: they pass once the buffers have grown, so only a
/// long run of them turns graphs off.
pub const PASSING_REFUSAL_WEIGHT: u32 = 16;

/// How the calling thread's device operations are issued right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GraphPass {
    /// Issued at once (no graph).
    Eager,
    /// Not issued; their signatures are hashed.
    Check,
    /// Issued into a stream capture; their signatures are hashed.
    Record,
}

/// Identifies a step's operations: the hash of their signatures and their number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GraphKey {
    pub hash: u64,
    pub ops: u64,
}

/// Why a graph pass could not be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// What the refusing operation does.
    pub what: String,
    /// It passes once buffers have grown ([`refuse_for_now`]).
    pub passing: bool,
}

struct PassState {
    pass: GraphPass,
    hasher: DefaultHasher,
    ops: u64,
    /// The first operation that refused to be part of a graph in this pass.
    refused: Option<Refusal>,
}

thread_local! {
    static PASS: RefCell<PassState> = RefCell::new(PassState {
        pass: GraphPass::Eager,
        hasher: DefaultHasher::new(),
        ops: 0,
        refused: None,
    });
}

/// The calling thread's current pass.
pub fn current_pass() -> GraphPass {
    PASS.with(|p| p.borrow().pass)
}

/// Starts pass `pass` on the calling thread (a fresh hash).
fn start(pass: GraphPass) {
    PASS.with(|p| {
        *p.borrow_mut() = PassState {
            pass,
            hasher: DefaultHasher::new(),
            ops: 0,
            refused: None,
        }
    });
}

/// Ends the calling thread's pass: its key and what refused, back to eager.
fn finish() -> (GraphKey, Option<Refusal>) {
    PASS.with(|p| {
        let st = std::mem::replace(
            &mut *p.borrow_mut(),
            PassState {
                pass: GraphPass::Eager,
                hasher: DefaultHasher::new(),
                ops: 0,
                refused: None,
            },
        );
        let key = GraphKey {
            hash: st.hasher.finish(),
            ops: st.ops,
        };
        (key, st.refused)
    })
}

/// Issues one device operation: at once when eager, not at all in a check pass, into
/// the capture in a record pass. `kind` names the operation (a kernel's name, `"gemm"`,
/// `"memcpy_htod"`) and `args` are every value it is issued with: all of them, or a
/// graph of another step could be replayed for this one.
pub fn enqueue(
    kind: &str,
    args: &[u64],
    issue: impl FnOnce() -> Result<(), KernelError>,
) -> Result<(), KernelError> {
    let pass = PASS.with(|p| {
        let mut st = p.borrow_mut();
        if st.pass != GraphPass::Eager {
            st.hasher.write(kind.as_bytes());
            st.hasher.write_u8(0xff);
            st.hasher.write_usize(args.len());
            for &a in args {
                st.hasher.write_u64(a);
            }
            st.ops += 1;
        }
        st.pass
    });
    match pass {
        GraphPass::Check => Ok(()),
        GraphPass::Eager | GraphPass::Record => issue(),
    }
}

/// Called by an operation that cannot be part of a graph (`what` it does: "downloads
/// logits", "meets other ranks on the host"): fine when eager; in a graph pass it marks
/// the pass refused and fails, so the step is run again eagerly.
pub fn refuse(what: &str) -> Result<(), KernelError> {
    refuse_as(what, false)
}

/// [`refuse`] for an operation that only this once keeps the step out of a graph (a
/// buffer growing to a new size, a metadata arena outgrown): the eager run grows it and
/// later steps fit.
pub fn refuse_for_now(what: &str) -> Result<(), KernelError> {
    refuse_as(what, true)
}

fn refuse_as(what: &str, passing: bool) -> Result<(), KernelError> {
    PASS.with(|p| {
        let mut st = p.borrow_mut();
        if st.pass == GraphPass::Eager {
            return Ok(());
        }
        if st.refused.is_none() {
            st.refused = Some(Refusal {
                what: what.to_string(),
                passing,
            });
        }
        Err(KernelError::Unavailable(format!(
            "{what}: not possible inside a graph step (it is run again eagerly)"
        )))
    })
}

/// A device queue that can capture and replay steps ([`run_step`] drives it). The
/// calls concern the calling thread's queue (its micro-batch's stream).
pub trait StepGraphs: Send + Sync {
    /// Whether the calling thread's queue uses graphs at all (not turned off).
    fn graphs_on(&self) -> bool;
    /// Before a step's first pass: remember the host-side state a pass changes (the
    /// metadata arena's position), so every pass of the step starts from it.
    fn save_state(&self) -> Result<(), KernelError>;
    /// Before a second or later pass: put that state back.
    fn restore_state(&self) -> Result<(), KernelError>;
    /// Launches the graph stored under `key`, if there is one; whether it did.
    fn launch_cached(&self, key: GraphKey) -> Result<bool, KernelError>;
    /// Notes that a step with `key` was seen; true the first time (recently), when the
    /// step runs eagerly instead of being captured: that warms up what a first run
    /// initialises (cuBLAS heuristics, lazy loading), which must not happen inside a
    /// capture, and does not capture shapes seen only once.
    fn first_sighting(&self, key: GraphKey) -> bool;
    /// Starts capturing the queue's operations.
    fn begin_capture(&self) -> Result<(), KernelError>;
    /// Ends the capture, stores the graph under `key` and launches it.
    fn finish_capture(&self, key: GraphKey) -> Result<(), KernelError>;
    /// Ends a capture that will not be used (a failed or refused pass); no-op when
    /// none is running.
    fn abandon_capture(&self);
    /// Notes a refused step (`why`); returns true when the queue now turns graphs off.
    fn note_refusal(&self, why: &Refusal) -> bool;
    /// Notes a step that ran as a graph (`captured`: newly captured, else replayed).
    fn note_graph_step(&self, captured: bool);
}

/// Runs `step` (one forward pass; callable several times, each call issuing the same
/// operations for the same input) on `graphs`'s queue: replayed from a graph when one
/// matches, captured when none does, eagerly when an operation refuses or `graphs` is
/// `None`. Returns what the pass that counts returned (its device work launched).
///
/// ```
/// use dcpserve_kernels::step_graph::run_step;
/// use dcpserve_kernels::KernelError;
/// // Without a graph-capable queue the step just runs.
/// let r: Result<u32, KernelError> = run_step(None, || Ok(7));
/// assert_eq!(r.unwrap(), 7);
/// ```
pub fn run_step<T, E: From<KernelError> + std::fmt::Display>(
    graphs: Option<&dyn StepGraphs>,
    mut step: impl FnMut() -> Result<T, E>,
) -> Result<T, E> {
    let Some(g) = graphs.filter(|g| g.graphs_on()) else {
        return step();
    };
    // Whatever happens (an early return, a panic), the thread leaves eager and with no
    // capture open.
    let _reset = Reset(g);
    g.save_state()?;
    start(GraphPass::Check);
    let checked = step();
    let (key, refused) = finish();
    if let Some(why) = refused {
        return eager_after_refusal(g, &why, step);
    }
    let checked = checked?;
    if g.launch_cached(key)? {
        g.note_graph_step(false);
        return Ok(checked);
    }
    drop(checked);
    g.restore_state()?;
    if g.first_sighting(key) {
        return step();
    }
    if let Err(e) = g.begin_capture() {
        let why = format!("starting a capture failed: {e}");
        return eager_after_refusal(g, &Refusal::lasting(why), step);
    }
    start(GraphPass::Record);
    let recorded = step();
    let (key, refused) = finish();
    // The check pass ran the same host code without an error, so an error now comes
    // from the capture itself (an operation the driver would not capture): like a
    // refusal, the step runs eagerly.
    let why = match (refused, recorded) {
        (Some(why), _) => why,
        (None, Err(e)) => Refusal::lasting(format!("a captured operation failed: {e}")),
        (None, Ok(recorded)) => match g.finish_capture(key) {
            Ok(()) => {
                g.note_graph_step(true);
                return Ok(recorded);
            }
            Err(e) => Refusal::lasting(format!("capturing the step failed: {e}")),
        },
    };
    g.abandon_capture();
    eager_after_refusal(g, &why, step)
}

impl Refusal {
    fn lasting(what: String) -> Refusal {
        Refusal {
            what,
            passing: false,
        }
    }
}

/// Returns the thread to eager passes and ends a capture left open, when dropped.
struct Reset<'a>(&'a dyn StepGraphs);

impl Drop for Reset<'_> {
    fn drop(&mut self) {
        let _ = finish();
        self.0.abandon_capture();
    }
}

/// The step once more, eagerly, after a graph pass refused (`why`).
fn eager_after_refusal<T, E: From<KernelError>>(
    g: &dyn StepGraphs,
    why: &Refusal,
    mut step: impl FnMut() -> Result<T, E>,
) -> Result<T, E> {
    g.note_refusal(why);
    g.restore_state()?;
    step()
}

#[cfg(test)]
mod tests;
