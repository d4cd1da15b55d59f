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
//!    graph is stored under its own key and launched.
//! 3. **Eager**: any operation that cannot be part of a graph (a download, a host
//!    wait, an allocation, a collective with host rendezvous) refuses itself in a graph
//!    pass ([`refuse`]); the step is then run eagerly. A lane whose steps keep refusing
//!    ([`REFUSALS_BEFORE_OFF`] in a row, e.g. MoE routing read back on the host) turns
//!    graphs off for good, with the reason.
//!
//! Steps are made graph-stable by design elsewhere: buffers live in workspaces and
//! scratch that persist across steps, metadata has bucketed sizes, and attention's
//! split plan depends on a bucketed context length; so a decode batch of a given size
//! replays the same graph until a bucket changes.
//!
//! The pass state is per thread: each micro-batch's compute thread drives its own
//! lane (stream). Backends without graphs ([`Backend::step_graphs`] is `None`, the
//! CPU) run every step eagerly and [`enqueue`] just runs the operation.
//!
//! [`Backend::step_graphs`]: crate::Backend::step_graphs

use std::cell::RefCell;
use std::hash::{DefaultHasher, Hasher};

use crate::error::KernelError;

/// Refused graph steps in a row after which a lane stops trying graphs.
pub const REFUSALS_BEFORE_OFF: u32 = 4;

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

struct PassState {
    pass: GraphPass,
    hasher: DefaultHasher,
    ops: u64,
    /// The first operation that refused to be part of a graph in this pass.
    refused: Option<String>,
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
fn finish() -> (GraphKey, Option<String>) {
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
/// logits", "allocates device memory"): fine when eager; in a graph pass it marks the
/// pass refused and fails, so the step is run again eagerly.
pub fn refuse(what: &str) -> Result<(), KernelError> {
    PASS.with(|p| {
        let mut st = p.borrow_mut();
        if st.pass == GraphPass::Eager {
            return Ok(());
        }
        if st.refused.is_none() {
            st.refused = Some(what.to_string());
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
    /// Starts capturing the queue's operations.
    fn begin_capture(&self) -> Result<(), KernelError>;
    /// Ends the capture, stores the graph under `key` and launches it.
    fn finish_capture(&self, key: GraphKey) -> Result<(), KernelError>;
    /// Ends a capture that will not be used (a failed or refused pass); no-op when
    /// none is running.
    fn abandon_capture(&self);
    /// Notes a refused step (`why`); returns true when the queue now turns graphs off.
    fn note_refusal(&self, why: &str) -> bool;
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
pub fn run_step<T, E: From<KernelError>>(
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
    g.begin_capture()?;
    start(GraphPass::Record);
    let recorded = step();
    let (key, refused) = finish();
    if let Some(why) = refused {
        g.abandon_capture();
        return eager_after_refusal(g, &why, step);
    }
    let recorded = match recorded {
        Ok(r) => r,
        Err(e) => {
            g.abandon_capture();
            return Err(e);
        }
    };
    if let Err(e) = g.finish_capture(key) {
        // Nothing of the pass ran: run it eagerly, and stop trying if this repeats.
        g.abandon_capture();
        return eager_after_refusal(g, &format!("capturing the step failed: {e}"), step);
    }
    g.note_graph_step(true);
    Ok(recorded)
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
    why: &str,
    mut step: impl FnMut() -> Result<T, E>,
) -> Result<T, E> {
    g.note_refusal(why);
    g.restore_state()?;
    step()
}

#[cfg(test)]
mod tests;
