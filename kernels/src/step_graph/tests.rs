//! The pass logic of [`run_step`] with a fake queue: what is launched, captured or run
//! eagerly, and when a lane gives graphs up.

use std::cell::RefCell;
use std::collections::HashMap;

use super::*;

/// A fake device queue: counts issued operations per pass and keeps "graphs" as the
/// number of operations captured under a key.
#[derive(Default)]
struct FakeQueue {
    log: RefCell<Vec<String>>,
    graphs: RefCell<HashMap<GraphKey, u64>>,
    capturing: RefCell<bool>,
    refusals: RefCell<u32>,
    seen: RefCell<Vec<GraphKey>>,
    off: RefCell<bool>,
    fail_capture: bool,
}

// The fake is only used from the test's thread.
unsafe impl Sync for FakeQueue {}
unsafe impl Send for FakeQueue {}

impl FakeQueue {
    fn log(&self, s: impl Into<String>) {
        self.log.borrow_mut().push(s.into());
    }
    fn take_log(&self) -> Vec<String> {
        std::mem::take(&mut *self.log.borrow_mut())
    }
}

impl StepGraphs for FakeQueue {
    fn graphs_on(&self) -> bool {
        !*self.off.borrow()
    }
    fn save_state(&self) -> Result<(), KernelError> {
        self.log("save");
        Ok(())
    }
    fn restore_state(&self) -> Result<(), KernelError> {
        self.log("restore");
        Ok(())
    }
    fn launch_cached(&self, key: GraphKey) -> Result<bool, KernelError> {
        let hit = self.graphs.borrow().contains_key(&key);
        if hit {
            self.log(format!("replay {}", key.ops));
        }
        Ok(hit)
    }
    fn begin_capture(&self) -> Result<(), KernelError> {
        *self.capturing.borrow_mut() = true;
        self.log("capture");
        Ok(())
    }
    fn finish_capture(&self, key: GraphKey) -> Result<(), KernelError> {
        if self.fail_capture {
            return Err(KernelError::Device("capture invalidated".into()));
        }
        *self.capturing.borrow_mut() = false;
        self.graphs.borrow_mut().insert(key, key.ops);
        self.log(format!("stored {}", key.ops));
        Ok(())
    }
    fn abandon_capture(&self) {
        if std::mem::take(&mut *self.capturing.borrow_mut()) {
            self.log("abandon");
        }
    }
    fn first_sighting(&self, key: GraphKey) -> bool {
        let mut seen = self.seen.borrow_mut();
        if seen.contains(&key) {
            return false;
        }
        seen.push(key);
        self.log("first sighting");
        true
    }
    fn note_refusal(&self, why: &Refusal) -> bool {
        self.log(format!("refused: {}", why.what));
        let mut r = self.refusals.borrow_mut();
        *r += if why.passing {
            1
        } else {
            PASSING_REFUSAL_WEIGHT
        };
        if *r >= REFUSALS_BEFORE_OFF * PASSING_REFUSAL_WEIGHT {
            *self.off.borrow_mut() = true;
        }
        *self.off.borrow()
    }
    fn note_graph_step(&self, captured: bool) {
        *self.refusals.borrow_mut() = 0;
        self.log(if captured {
            "graph: new"
        } else {
            "graph: replayed"
        });
    }
}

/// A step of `ops` kernels whose first argument is `arg`; logs what is really issued.
fn step(q: &FakeQueue, ops: u64, arg: u64) -> Result<u64, KernelError> {
    for i in 0..ops {
        enqueue("kernel", &[arg, i], || {
            q.log(format!("issue {i} ({:?})", current_pass()));
            Ok(())
        })?;
    }
    Ok(ops)
}

#[test]
fn without_graphs_the_step_runs_once_eagerly() {
    let q = FakeQueue::default();
    let r: Result<u64, KernelError> = run_step(None, || step(&q, 2, 1));
    assert_eq!(r.unwrap(), 2);
    assert_eq!(q.take_log(), ["issue 0 (Eager)", "issue 1 (Eager)"]);
}

/// Runs a step of `ops` kernels with argument `arg`, returning the log.
fn run(q: &FakeQueue, ops: u64, arg: u64) -> Vec<String> {
    let r: Result<u64, KernelError> = run_step(Some(q), || step(q, ops, arg));
    assert_eq!(r.unwrap(), ops);
    assert_eq!(current_pass(), GraphPass::Eager);
    q.take_log()
}

#[test]
fn a_new_step_runs_eagerly_then_is_captured_then_replayed_without_issuing() {
    let q = FakeQueue::default();
    // First sighting: the check pass issued nothing, the step runs eagerly (warm-up).
    assert_eq!(
        run(&q, 2, 7),
        [
            "save",
            "restore",
            "first sighting",
            "issue 0 (Eager)",
            "issue 1 (Eager)"
        ]
    );
    // Second: the record pass issues into the capture, which is stored and launched.
    assert_eq!(
        run(&q, 2, 7),
        [
            "save",
            "restore",
            "capture",
            "issue 0 (Record)",
            "issue 1 (Record)",
            "stored 2",
            "graph: new"
        ]
    );
    // Then: replayed, nothing issued one by one.
    assert_eq!(run(&q, 2, 7), ["save", "replay 2", "graph: replayed"]);
}

#[test]
fn any_changed_argument_or_count_is_a_new_graph() {
    let q = FakeQueue::default();
    run(&q, 2, 7);
    run(&q, 2, 7);
    for (ops, arg) in [(2, 8), (3, 7)] {
        let first = run(&q, ops, arg);
        assert!(first.contains(&"first sighting".to_string()), "{first:?}");
        let second = run(&q, ops, arg);
        assert!(second.contains(&"capture".to_string()), "{second:?}");
    }
    assert_eq!(q.graphs.borrow().len(), 3);
}

#[test]
fn a_refusing_operation_runs_the_step_eagerly_and_repeated_refusals_turn_graphs_off() {
    let q = FakeQueue::default();
    let refusing = || -> Result<u64, KernelError> {
        step(&q, 1, 1)?;
        refuse("downloads routing")?;
        step(&q, 1, 2)
    };
    for i in 1..=REFUSALS_BEFORE_OFF {
        let r = run_step(Some(&q), refusing);
        assert_eq!(r.unwrap(), 1, "the eager run's result");
        let log = q.take_log();
        assert_eq!(
            log,
            [
                "save",
                "refused: downloads routing",
                "restore",
                "issue 0 (Eager)",
                "issue 0 (Eager)"
            ],
            "step {i}"
        );
    }
    assert!(!q.graphs_on());
    // Off: plain eager steps, no passes.
    let _ = run_step(Some(&q), refusing);
    assert_eq!(q.take_log(), ["issue 0 (Eager)", "issue 0 (Eager)"]);
    // And `refuse` is harmless when eager.
    assert!(refuse("anything").is_ok());
    assert!(refuse_for_now("anything").is_ok());
}

#[test]
fn refusals_for_now_weigh_little_and_a_graph_step_clears_them() {
    let q = FakeQueue::default();
    let mut grown = false;
    // A buffer that must grow once, the first time.
    let mut growing = || -> Result<u64, KernelError> {
        if !grown {
            refuse_for_now("allocates device scratch")?;
            grown = true;
        }
        step(&q, 1, 1)
    };
    let r = run_step(Some(&q), &mut growing);
    assert_eq!(r.unwrap(), 1);
    assert_eq!(*q.refusals.borrow(), 1);
    assert!(q.graphs_on());
    // More passing refusals than REFUSALS_BEFORE_OFF do not turn graphs off.
    for _ in 0..REFUSALS_BEFORE_OFF * 2 {
        let _ = run_step(Some(&q), || -> Result<u64, KernelError> {
            refuse_for_now("staged step metadata outgrew its arena")?;
            Ok(0)
        });
    }
    assert!(q.graphs_on());
    // A step that ends up as a graph clears the streak.
    run(&q, 1, 1);
    run(&q, 1, 1);
    assert_eq!(*q.refusals.borrow(), 0);
}

#[test]
fn a_refusal_while_recording_abandons_the_capture() {
    let q = FakeQueue::default();
    run(&q, 1, 1);
    let mut calls = 0;
    let r = run_step(Some(&q), || {
        calls += 1;
        // Only the second pass (the record pass) refuses.
        if calls == 2 {
            refuse("waits for the stream")?;
        }
        step(&q, 1, 1)
    });
    assert_eq!(r.unwrap(), 1);
    assert_eq!(
        q.take_log(),
        [
            "save",
            "restore",
            "capture",
            "abandon",
            "refused: waits for the stream",
            "restore",
            "issue 0 (Eager)"
        ]
    );
    assert!(q.graphs.borrow().is_empty());
}

#[test]
fn an_error_while_recording_falls_back_to_eager() {
    let q = FakeQueue::default();
    run(&q, 1, 1);
    let mut calls = 0;
    let r = run_step(Some(&q), || {
        calls += 1;
        // The driver refuses an operation under capture (the check pass was fine).
        if calls == 2 {
            return Err(KernelError::Device(
                "operation not permitted when stream is capturing".into(),
            ));
        }
        step(&q, 1, 1)
    });
    assert_eq!(r.unwrap(), 1);
    let log = q.take_log();
    assert!(log.contains(&"abandon".to_string()), "{log:?}");
    assert!(log
        .iter()
        .any(|l| l.starts_with("refused: a captured operation failed")));
    assert_eq!(log.last().unwrap(), "issue 0 (Eager)");
}

#[test]
fn a_failed_capture_falls_back_to_eager() {
    let q = FakeQueue {
        fail_capture: true,
        ..Default::default()
    };
    run(&q, 1, 1);
    let log = run(&q, 1, 1);
    assert_eq!(log.last().unwrap(), "issue 0 (Eager)", "{log:?}");
    assert!(log
        .iter()
        .any(|l| l.starts_with("refused: capturing the step failed")));
}

#[test]
fn a_real_error_is_returned_from_the_check_pass_without_issuing() {
    let q = FakeQueue::default();
    let r: Result<u64, KernelError> = run_step(Some(&q), || {
        step(&q, 1, 1)?;
        Err(KernelError::Shape("bad input".into()))
    });
    assert!(matches!(r, Err(KernelError::Shape(_))));
    assert_eq!(q.take_log(), ["save"]);
    assert_eq!(current_pass(), GraphPass::Eager);
}

#[test]
fn a_panicking_step_leaves_the_thread_eager_and_no_capture_open() {
    let q = FakeQueue::default();
    run(&q, 1, 1);
    let mut calls = 0;
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _: Result<u64, KernelError> = run_step(Some(&q), || {
            calls += 1;
            if calls == 2 {
                panic!("a bug in the record pass");
            }
            step(&q, 1, 1)
        });
    }));
    assert!(r.is_err());
    assert_eq!(current_pass(), GraphPass::Eager);
    assert!(!*q.capturing.borrow());
    assert!(q.take_log().contains(&"abandon".to_string()));
}
