use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::InProcessComm;

/// Rank 0 runs micro-batches A and B on two threads sharing a baton; rank 1 runs them
/// without one, and its A reaches the collective only once rank 0's B has computed.
/// Returns whether rank 0's B computed while rank 0's A waited in its collective.
fn b_computes_while_a_waits(lend: bool) -> bool {
    let mut group_a = InProcessComm::group(2).into_iter().map(Arc::new);
    let mut group_b = InProcessComm::group(2).into_iter().map(Arc::new);
    let (a0, a1) = (group_a.next().unwrap(), group_a.next().unwrap());
    let (b0, b1) = (group_b.next().unwrap(), group_b.next().unwrap());
    let baton = ComputeBaton::new();
    let wrap = |c: Arc<InProcessComm>| -> Arc<dyn Communicator> {
        if lend {
            Arc::new(BatonComm::new(c, baton.clone()))
        } else {
            c
        }
    };
    let (a0, b0) = (wrap(a0), wrap(b0));
    let a_holds = AtomicBool::new(false);
    let b_computed = AtomicBool::new(false);
    let mut in_time = false;
    std::thread::scope(|s| {
        s.spawn(|| {
            let _turn = baton.hold(0);
            a_holds.store(true, Ordering::SeqCst);
            let mut x = [1.0];
            a0.all_reduce_sum(&mut x).unwrap();
            assert_eq!(x, [3.0]);
        });
        while !a_holds.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        s.spawn(|| {
            let _turn = baton.hold(1);
            b_computed.store(true, Ordering::SeqCst);
            let mut x = [10.0];
            b0.all_reduce_sum(&mut x).unwrap();
            assert_eq!(x, [30.0]);
        });
        s.spawn(|| b1.all_reduce_sum(&mut [20.0]).unwrap());
        // Rank 1's A: waits (a bounded time) for rank 0's B, then joins A's collective.
        let t = Instant::now();
        while !b_computed.load(Ordering::SeqCst) && t.elapsed() < Duration::from_secs(1) {
            std::thread::sleep(Duration::from_millis(1));
        }
        in_time = b_computed.load(Ordering::SeqCst);
        a1.all_reduce_sum(&mut [2.0]).unwrap();
    });
    in_time
}

#[test]
fn the_other_micro_batch_computes_while_one_waits_in_a_collective() {
    assert!(b_computes_while_a_waits(true));
}

#[test]
fn control_without_lending_the_other_micro_batch_is_stuck() {
    // Holding the baton across the wait blocks B until rank 1's A gives up waiting: the
    // test above would fail without `BatonComm`.
    assert!(!b_computes_while_a_waits(false));
}

#[test]
fn only_one_micro_batch_computes_at_a_time_and_results_are_exact() {
    // Two ranks, each with two micro-batch threads sharing its own baton.
    let groups: Vec<Vec<Arc<InProcessComm>>> = (0..2)
        .map(|_| InProcessComm::group(2).into_iter().map(Arc::new).collect())
        .collect();
    let batons = [ComputeBaton::new(), ComputeBaton::new()];
    let computing = [AtomicUsize::new(0), AtomicUsize::new(0)];
    let overlaps = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for (rank, baton) in batons.iter().enumerate() {
            for (mb, group) in groups.iter().enumerate() {
                let comm = BatonComm::new(group[rank].clone(), baton.clone());
                let (computing, overlaps) = (&computing[rank], &overlaps);
                s.spawn(move || {
                    let _turn = baton.hold(mb);
                    for round in 0..200 {
                        if computing.fetch_add(1, Ordering::SeqCst) != 0 {
                            overlaps.fetch_add(1, Ordering::SeqCst);
                        }
                        let spin = Instant::now();
                        while spin.elapsed() < Duration::from_micros(20 * (rank as u64 + 1)) {}
                        computing.fetch_sub(1, Ordering::SeqCst);
                        let mut x = vec![(rank + 1) as f32 * (mb * 1000 + round) as f32; 8];
                        comm.all_reduce_sum(&mut x).unwrap();
                        assert!(x.iter().all(|&v| v == 3.0 * (mb * 1000 + round) as f32));
                    }
                });
            }
        }
    });
    assert_eq!(overlaps.load(Ordering::SeqCst), 0);
    assert!(batons.iter().all(|b| b.is_free()));
}

#[test]
fn long_computations_alternate_between_micro_batches() {
    // Two ranks, two micro-batches each; every micro-batch does 4 long computations,
    // each followed by a collective. While both micro-batches are active, every rank
    // runs their long computations in turn.
    let groups: Vec<Vec<Arc<InProcessComm>>> = (0..2)
        .map(|_| InProcessComm::group(2).into_iter().map(Arc::new).collect())
        .collect();
    let batons = [ComputeBaton::new(), ComputeBaton::new()];
    let logs = [
        std::sync::Mutex::new(Vec::new()),
        std::sync::Mutex::new(Vec::new()),
    ];
    std::thread::scope(|s| {
        for (rank, baton) in batons.iter().enumerate() {
            for (mb, group) in groups.iter().enumerate() {
                let comm = BatonComm::new(group[rank].clone(), baton.clone());
                let log = &logs[rank];
                s.spawn(move || {
                    let turn = baton.hold(mb);
                    // Both micro-batches have a step in progress before the first one.
                    while baton.lock().active != [true, true] {
                        std::thread::yield_now();
                    }
                    for _ in 0..4 {
                        turn.begin_long();
                        log.lock().unwrap().push(mb);
                        let spin = Instant::now();
                        while spin.elapsed() < Duration::from_micros(300) {}
                        comm.all_reduce_sum(&mut [1.0]).unwrap();
                    }
                });
            }
        }
    });
    for log in &logs {
        let log = log.lock().unwrap();
        assert_eq!(log.len(), 8);
        assert!(log.windows(2).all(|w| w[0] != w[1]), "order {log:?}");
    }
}
