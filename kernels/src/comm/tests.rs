//! Tests of the collectives, the element types and the bootstrap.

use super::bootstrap::{connect, CommGroupSpec, GroupId, GroupOwner, Transport};
use super::*;

fn run<F: Fn(&InProcessComm) + Sync>(n: usize, f: F) {
    let comms = InProcessComm::group(n);
    std::thread::scope(|s| {
        for c in &comms {
            let f = &f;
            s.spawn(move || f(c));
        }
    });
}

#[test]
fn collectives_agree_with_their_definitions() {
    for n in [1, 2, 3, 4] {
        run(n, |c| {
            let r = c.rank() as f32;
            for round in 0..50 {
                let input: Vec<f32> = (0..4).map(|i| r * 10.0 + i as f32 + round as f32).collect();
                let mut out = vec![0.0; 4 * n];
                c.all_gather(&input, &mut out).unwrap();
                for q in 0..n {
                    for i in 0..4 {
                        assert_eq!(out[q * 4 + i], q as f32 * 10.0 + i as f32 + round as f32);
                    }
                }
                let mut sum = input.clone();
                c.all_reduce_sum(&mut sum).unwrap();
                let ranks: f32 = (0..n).map(|q| q as f32 * 10.0).sum();
                for (i, v) in sum.iter().enumerate() {
                    assert_eq!(*v, ranks + n as f32 * (i as f32 + round as f32));
                }
                let big: Vec<f32> = (0..2 * n).map(|i| i as f32 + r).collect();
                let mut mine = vec![0.0; 2];
                c.reduce_scatter_sum(&big, &mut mine).unwrap();
                let rs: f32 = (0..n).map(|q| q as f32).sum();
                for (j, v) in mine.iter().enumerate() {
                    let i = c.rank() * 2 + j;
                    assert_eq!(*v, n as f32 * i as f32 + rs);
                }
                let mut b = vec![r; 3];
                c.broadcast(&mut b, n - 1).unwrap();
                assert_eq!(b, vec![(n - 1) as f32; 3]);
                let counts: Vec<usize> = (0..n).map(|q| q + 1).collect();
                let mine: Vec<f32> = vec![r; c.rank() + 1];
                let mut out = vec![0.0; counts.iter().sum()];
                c.all_gather_varying(&mine, &counts, &mut out).unwrap();
                let want: Vec<f32> = (0..n).flat_map(|q| vec![q as f32; q + 1]).collect();
                assert_eq!(out, want);
            }
        });
    }
}

#[test]
fn a_poisoned_group_errors_instead_of_hanging() {
    let comms = InProcessComm::group(2);
    comms[1].abort();
    let mut x = vec![1.0];
    assert!(comms[0].all_reduce_sum(&mut x).is_err());
}

#[test]
fn all_to_all_delivers_chunk_s_of_rank_r_to_rank_s() {
    for n in [1, 2, 3, 4, 5] {
        for c in [1, 3] {
            run(n, |comm| {
                let r = comm.rank();
                // Value = 100·sender + 10·receiver + index within the chunk.
                let send: Vec<f32> = (0..n * c)
                    .map(|i| (100 * r + 10 * (i / c) + i % c) as f32)
                    .collect();
                for _round in 0..20 {
                    let mut got = vec![0.0; n * c];
                    comm.all_to_all(&send, &mut got).unwrap();
                    for from in 0..n {
                        for k in 0..c {
                            assert_eq!(got[from * c + k], (100 * from + 10 * r + k) as f32);
                        }
                    }
                }
            });
        }
    }
}

#[test]
fn all_to_all_refuses_uneven_buffers() {
    let comms = InProcessComm::group(2);
    let mut out = vec![0.0; 3];
    assert!(comms[0].all_to_all(&[1.0, 2.0, 3.0], &mut out).is_err());
}

#[test]
fn bf16_collectives_agree_with_their_definitions() {
    use half::bf16;
    let b = bf16::from_f32;
    for n in [1, 2, 3, 4] {
        run(n, |c| {
            let r = c.rank() as f32;
            let input: Vec<bf16> = (0..4).map(|i| b(r * 10.0 + i as f32)).collect();
            let mut out = vec![bf16::ZERO; 4 * n];
            c.all_gather_elems(input.as_slice().into(), out.as_mut_slice().into())
                .unwrap();
            for q in 0..n {
                for i in 0..4 {
                    assert_eq!(out[q * 4 + i], b(q as f32 * 10.0 + i as f32));
                }
            }
            // Small integers are exact in bf16, so the sums are too.
            let mut sum = input.clone();
            c.all_reduce_sum_elems(sum.as_mut_slice().into()).unwrap();
            let ranks: f32 = (0..n).map(|q| q as f32 * 10.0).sum();
            for (i, v) in sum.iter().enumerate() {
                assert_eq!(*v, b(ranks + n as f32 * i as f32));
            }
            let big: Vec<bf16> = (0..2 * n).map(|i| b(i as f32 + r)).collect();
            let mut mine = vec![bf16::ZERO; 2];
            c.reduce_scatter_sum_elems(big.as_slice().into(), mine.as_mut_slice().into())
                .unwrap();
            let rs: f32 = (0..n).map(|q| q as f32).sum();
            for (j, v) in mine.iter().enumerate() {
                let i = c.rank() * 2 + j;
                assert_eq!(*v, b(n as f32 * i as f32 + rs));
            }
            let mut x = vec![b(r); 3];
            c.broadcast_elems(x.as_mut_slice().into(), n - 1).unwrap();
            assert_eq!(x, vec![b((n - 1) as f32); 3]);
            let send: Vec<bf16> = (0..n).map(|s| b((10 * c.rank() + s) as f32)).collect();
            let mut got = vec![bf16::ZERO; n];
            c.all_to_all_elems(send.as_slice().into(), got.as_mut_slice().into())
                .unwrap();
            let want: Vec<bf16> = (0..n).map(|q| b((10 * q + c.rank()) as f32)).collect();
            assert_eq!(got, want);
            let counts: Vec<usize> = (0..n).map(|q| q + 1).collect();
            let mine = vec![b(r); c.rank() + 1];
            let mut out = vec![bf16::ZERO; counts.iter().sum()];
            c.all_gather_varying_elems(mine.as_slice().into(), &counts, out.as_mut_slice().into())
                .unwrap();
            let want: Vec<bf16> = (0..n).flat_map(|q| vec![b(q as f32); q + 1]).collect();
            assert_eq!(out, want);
        });
    }
}

#[test]
fn mixed_element_types_are_refused() {
    let comms = InProcessComm::group(1);
    let mut out = vec![half::bf16::ZERO; 2];
    let err = comms[0]
        .all_gather_elems([1.0f32, 2.0].as_slice().into(), out.as_mut_slice().into())
        .unwrap_err();
    assert!(err.to_string().contains("F32"), "{err}");
}

#[test]
fn a_spec_round_trips_through_bytes_and_the_bootstrap() {
    let owner = GroupOwner::create(vec![3, 1, 2], Transport::SharedMemory).unwrap();
    let bytes = serde_json::to_vec(owner.spec()).unwrap();
    let spec: CommGroupSpec = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(&spec, owner.spec());
    assert!(connect(&spec, 7).is_err(), "not a member");
    let comms: Vec<_> = [3, 1, 2]
        .iter()
        .map(|&r| connect(&spec, r).unwrap())
        .collect();
    assert!(connect(&spec, 1).is_err(), "a rank connects once");
    // Group rank follows the spec's order, not the global rank.
    assert_eq!(
        comms.iter().map(|c| c.rank()).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                let mut x = vec![0.0; 3];
                c.all_gather(&[c.rank() as f32], &mut x).unwrap();
                assert_eq!(x, vec![0.0, 1.0, 2.0]);
            });
        }
    });
    assert!(owner.seconds_in_collectives(0) > 0.0);
    // The owner aborts through the trait: members' collectives fail fast.
    owner.abort();
    assert!(comms[0].all_reduce_sum(&mut [1.0]).is_err());
    drop(owner);
    let again = GroupOwner::create(vec![0], Transport::SharedMemory).unwrap();
    let stale = CommGroupSpec {
        id: GroupId(u64::MAX),
        ..again.spec().clone()
    };
    assert!(connect(&stale, 0).is_err(), "unregistered group");
}

#[test]
fn transports_not_in_this_build_fail_with_a_clear_error() {
    // MPI needs the `mpi` feature, and then an initialized MPI (these tests never start it).
    let mpi_error = if cfg!(feature = "mpi") {
        "MPI is not initialized in this process"
    } else {
        "lacks it"
    };
    for (transport, adopt_error, connect_error) in [
        (
            Transport::Nccl {
                unique_id: vec![0; 128],
            },
            "not implemented in this build",
            "not implemented in this build",
        ),
        (
            Transport::Mpi {
                processes: vec![0, 1],
            },
            mpi_error,
            if cfg!(feature = "mpi") {
                "is not registered in this process"
            } else {
                "lacks it"
            },
        ),
    ] {
        let err = GroupOwner::create(vec![0, 1], transport.clone())
            .err()
            .unwrap();
        assert!(err.to_string().contains(adopt_error), "{err}");
        let spec = CommGroupSpec {
            id: GroupId(u64::MAX - 1),
            ranks: vec![0, 1],
            transport,
        };
        let err = connect(&spec, 0).err().unwrap();
        assert!(err.to_string().contains(connect_error), "{err}");
    }
}
