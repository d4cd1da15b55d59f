//! Hierarchical collectives ([`Transport::Mpi`]) run for real: each test launches itself
//! under `mpirun` (the parent), and the launched copies (the children, marked by
//! `DCPSERVE_MPI_CHILD`) run the group's members as threads of several processes and
//! check every collective against values computed here.
//!
//! Needs Open MPI's `mpirun` on PATH (`scripts/test.sh` installs it): without it the
//! tests fail rather than pass without having run.
#![cfg(feature = "mpi")]

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dcpserve_kernels::comm::mpi::MpiEnv;
use dcpserve_kernels::comm::{connect, CommGroupSpec, GroupId, GroupOwner, Transport};
use dcpserve_kernels::{Communicator, Elems, ElemsMut};
use half::bf16;

/// Set in the children's environment.
const CHILD: &str = "DCPSERVE_MPI_CHILD";
/// How long one `mpirun` may take before it is killed.
const TIMEOUT: Duration = Duration::from_secs(120);

fn mpirun_path() -> std::path::PathBuf {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join("mpirun"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "mpirun is not on PATH: these tests run under MPI. Install Open MPI \
                 (`apt-get install openmpi-bin libopenmpi-dev`; scripts/test.sh installs it)"
            )
        })
}

/// Runs this test binary's test `name` in `np` processes under `mpirun` and fails unless
/// every process succeeds.
fn run_parent(name: &str, np: usize) {
    let mpirun = mpirun_path();
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(&mpirun)
        .args(["--allow-run-as-root", "--oversubscribe", "-np"])
        .arg(np.to_string())
        .args(["-x", CHILD])
        .arg(&exe)
        .args(["--exact", name, "--nocapture", "--test-threads", "1"])
        .env(CHILD, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", mpirun.display()));
    let pipe = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let out = pipe(Box::new(child.stdout.take().unwrap()));
    let err = pipe(Box::new(child.stderr.take().unwrap()));
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if start.elapsed() > TIMEOUT {
            // SIGTERM first: mpirun then takes its processes down with it.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            std::thread::sleep(Duration::from_secs(3));
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (out, err) = (out.join().unwrap(), err.join().unwrap());
    match status {
        Some(s) if s.success() => {
            // Each process must have run this one test to its end (a filter that matched
            // nothing would pass too). The children's output is interleaved, so each
            // writes one whole line of its own (libtest's summary comes in pieces).
            let missing: Vec<usize> = (0..np)
                .filter(|r| !out.contains(&done_line(name, *r)))
                .collect();
            assert!(
                missing.is_empty(),
                "{name}: processes {missing:?} did not finish the test:\n--- stdout\n{out}\n--- stderr\n{err}"
            );
            eprintln!("{name}: {np} processes passed in {:.1?}", start.elapsed())
        }
        Some(s) => panic!("mpirun -np {np} {name} failed ({s}):\n--- stdout\n{out}\n--- stderr\n{err}"),
        None => panic!(
            "mpirun -np {np} {name} ran past {TIMEOUT:?} and was killed:\n--- stdout\n{out}\n--- stderr\n{err}"
        ),
    }
}

/// The line a child prints when it finished test `name` (one write, so that it arrives
/// whole among the other processes' output).
fn done_line(name: &str, rank: usize) -> String {
    format!("dcpserve-mpi-child-done {name} rank {rank}\n")
}

/// In the parent: launches `np` children under `mpirun` and checks they all succeed. In
/// a child: starts MPI, runs `body`, finalizes MPI and says it is done.
fn mpi_test(name: &str, np: usize, body: impl FnOnce(&'static MpiEnv)) {
    if std::env::var_os(CHILD).is_none() {
        run_parent(name, np);
        return;
    }
    // A failing member thread must end its process at once: its peers, blocked in MPI
    // waiting for it, would otherwise keep the job alive until the parent's timeout.
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default(info);
        unsafe { libc::_exit(101) };
    }));
    let env = MpiEnv::init().expect("MPI_Init_thread");
    assert_eq!(env.world_size(), np, "the job's processes");
    body(env);
    let rank = env.world_rank();
    env.finalize();
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(done_line(name, rank).as_bytes()).unwrap();
    stdout.flush().unwrap();
}

/// One group of a test: its fixed id (the same in every process, so no spec needs
/// sending), its members' global ranks and the process hosting each.
struct Layout {
    id: u64,
    ranks: Vec<usize>,
    processes: Vec<usize>,
}

impl Layout {
    fn new(id: u64, ranks: &[usize], processes: &[usize]) -> Self {
        Self {
            id,
            ranks: ranks.to_vec(),
            processes: processes.to_vec(),
        }
    }

    fn spec(&self) -> CommGroupSpec {
        CommGroupSpec {
            id: GroupId(self.id),
            ranks: self.ranks.clone(),
            transport: Transport::Mpi {
                processes: self.processes.clone(),
            },
        }
    }

    fn hosts_member(&self, process: usize) -> bool {
        self.processes.contains(&process)
    }
}

/// Element types the tests run in: f32 and bf16 (small integers are exact in both).
trait Elem: Copy + PartialEq + std::fmt::Debug + Send + Sync + 'static {
    fn of(x: f32) -> Self;
    fn elems(x: &[Self]) -> Elems<'_>;
    fn elems_mut(x: &mut [Self]) -> ElemsMut<'_>;
}
impl Elem for f32 {
    fn of(x: f32) -> Self {
        x
    }
    fn elems(x: &[Self]) -> Elems<'_> {
        x.into()
    }
    fn elems_mut(x: &mut [Self]) -> ElemsMut<'_> {
        x.into()
    }
}
impl Elem for bf16 {
    fn of(x: f32) -> Self {
        bf16::from_f32(x)
    }
    fn elems(x: &[Self]) -> Elems<'_> {
        x.into()
    }
    fn elems_mut(x: &mut [Self]) -> ElemsMut<'_> {
        x.into()
    }
}

/// Member `r`'s `i`-th value in a test: a small integer, positive or negative.
fn v(r: usize, i: usize) -> f32 {
    ((r * 7 + i * 3) % 11) as f32 - 5.0
}

fn vals<T: Elem>(n: usize, f: impl Fn(usize) -> f32) -> Vec<T> {
    (0..n).map(|i| T::of(f(i))).collect()
}

/// Every collective once, checked against values computed directly.
fn exercise<T: Elem>(c: &dyn Communicator) {
    let (r, n) = (c.rank(), c.size());
    let what = |op: &str| format!("{op} ({:?}, rank {r} of {n})", std::any::type_name::<T>());

    let input: Vec<T> = vals::<T>(3, |i| v(r, i));
    let mut out = vec![T::of(0.0); n * 3];
    c.all_gather_elems(T::elems(&input), T::elems_mut(&mut out))
        .unwrap();
    assert_eq!(
        out,
        vals::<T>(n * 3, |k| v(k / 3, k % 3)),
        "{}",
        what("all_gather")
    );

    let counts: Vec<usize> = (0..n).map(|s| (s * 2 + 1) % 3).collect();
    let input: Vec<T> = vals::<T>(counts[r], |i| v(r, i));
    let mut out = vec![T::of(0.0); counts.iter().sum()];
    c.all_gather_varying_elems(T::elems(&input), &counts, T::elems_mut(&mut out))
        .unwrap();
    let want: Vec<T> = (0..n)
        .flat_map(|s| vals::<T>(counts[s], move |i| v(s, i)))
        .collect();
    assert_eq!(out, want, "{}", what("all_gather_varying"));

    // Lengths below, at and above the number of processes (uneven MPI blocks, empty ones).
    for len in [0, 1, 5, 37] {
        let mut data: Vec<T> = vals::<T>(len, |i| v(r, i));
        c.all_reduce_sum_elems(T::elems_mut(&mut data)).unwrap();
        let want: Vec<T> = vals::<T>(len, |i| (0..n).map(|s| v(s, i)).sum());
        assert_eq!(data, want, "{} of {len}", what("all_reduce_sum"));
    }

    let chunk = 2;
    let input: Vec<T> = vals::<T>(n * chunk, |i| v(r, i));
    let mut out = vec![T::of(0.0); chunk];
    c.reduce_scatter_sum_elems(T::elems(&input), T::elems_mut(&mut out))
        .unwrap();
    let want: Vec<T> = vals::<T>(chunk, |i| (0..n).map(|s| v(s, r * chunk + i)).sum());
    assert_eq!(out, want, "{}", what("reduce_scatter_sum"));

    for root in 0..n {
        let mut data: Vec<T> = if r == root {
            vals::<T>(4, |i| v(root, i))
        } else {
            vals::<T>(4, |_| 99.0)
        };
        c.broadcast_elems(T::elems_mut(&mut data), root).unwrap();
        assert_eq!(
            data,
            vals::<T>(4, |i| v(root, i)),
            "{} from {root}",
            what("broadcast")
        );
    }

    // Chunk s (2 values) goes to member s.
    let w = |from: usize, to: usize, k: usize| (from * 8 + to * 2 + k) as f32;
    let input: Vec<T> = vals::<T>(n * 2, |i| w(r, i / 2, i % 2));
    let mut out = vec![T::of(0.0); n * 2];
    c.all_to_all_elems(T::elems(&input), T::elems_mut(&mut out))
        .unwrap();
    assert_eq!(
        out,
        vals::<T>(n * 2, |i| w(i / 2, r, i % 2)),
        "{}",
        what("all_to_all")
    );

    // Grouped calls complete like plain ones.
    c.group_start();
    let mut data: Vec<T> = vals::<T>(3, |i| v(r, i));
    c.all_reduce_sum_elems(T::elems_mut(&mut data)).unwrap();
    c.group_end().unwrap();
    assert_eq!(
        data,
        vals::<T>(3, |i| (0..n).map(|s| v(s, i)).sum()),
        "{}",
        what("grouped all_reduce")
    );
}

/// All-reduce sums that are not exact in f32 (so their bits depend on the order of the
/// additions) must still be bit-identical on every member.
fn all_reduce_is_identical_everywhere(c: &dyn Communicator) {
    let (r, n) = (c.rank(), c.size());
    let len = 29;
    let mut data: Vec<f32> = (0..len)
        .map(|i| 1.0 / (3.0 + r as f32 + 0.37 * i as f32) + 1e4 * (r % 2) as f32)
        .collect();
    c.all_reduce_sum(&mut data).unwrap();
    let mut everyone = vec![0f32; n * len];
    c.all_gather(&data, &mut everyone).unwrap();
    for s in 0..n {
        let theirs = &everyone[s * len..(s + 1) * len];
        assert!(
            theirs
                .iter()
                .zip(&data)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "rank {r}: all_reduce sums differ from rank {s}'s:\n{data:?}\n{theirs:?}"
        );
    }
}

/// Adopts this process's part of every group in `layouts` (in order, as every process
/// does), runs each local member as a thread through `rounds` rounds of every collective
/// in every group it belongs to, then checks abort, and finalizes MPI.
fn run_groups(env: &MpiEnv, layouts: &[Layout], rounds: usize) {
    let me = env.world_rank();
    let mine: Vec<&Layout> = layouts.iter().filter(|l| l.hosts_member(me)).collect();
    let owners: Vec<GroupOwner> = mine
        .iter()
        .map(|l| GroupOwner::adopt(l.spec()).unwrap())
        .collect();
    // The global ranks this process hosts, each with its handles (in `mine`'s order).
    let mut local: Vec<usize> = mine
        .iter()
        .flat_map(|l| l.ranks.iter().zip(&l.processes))
        .filter(|(_, &p)| p == me)
        .map(|(&g, _)| g)
        .collect();
    local.sort_unstable();
    local.dedup();
    let members: Vec<Vec<Arc<dyn Communicator>>> = local
        .iter()
        .map(|&g| {
            mine.iter()
                .filter(|l| l.ranks.contains(&g))
                .map(|l| connect(&l.spec(), g).unwrap())
                .collect()
        })
        .collect();
    for l in &mine {
        for (&g, &p) in l.ranks.iter().zip(&l.processes) {
            let err = connect(&l.spec(), g).err().unwrap().to_string();
            let want = if p == me {
                "already connected"
            } else {
                "not a member of this process"
            };
            assert!(err.contains(want), "connect({g}): {err}");
        }
    }

    std::thread::scope(|s| {
        for comms in &members {
            s.spawn(move || {
                for _ in 0..rounds {
                    for c in comms {
                        exercise::<f32>(&**c);
                        exercise::<bf16>(&**c);
                        all_reduce_is_identical_everywhere(&**c);
                    }
                }
            });
        }
    });

    for (l, owner) in mine.iter().zip(&owners) {
        for (gr, &p) in l.processes.iter().enumerate() {
            let t = owner.seconds_in_collectives(gr);
            if p == me {
                assert!(
                    t > 0.0,
                    "group {} rank {gr} spent no time in collectives",
                    l.id
                );
            } else {
                assert_eq!(t, 0.0, "a member of another process");
            }
        }
    }

    // Abort: a member waiting for its process's leader wakes with an error, and after
    // the abort every call fails at once. Only this process's part of a group is
    // aborted, so no MPI call is ever left waiting on the peers.
    std::thread::scope(|s| {
        for (l, owner) in mine.iter().zip(&owners) {
            let handles: Vec<&Arc<dyn Communicator>> = local
                .iter()
                .zip(&members)
                .filter(|(g, _)| l.ranks.contains(g))
                .map(|(&g, comms)| {
                    let k = mine
                        .iter()
                        .filter(|m| m.ranks.contains(&g))
                        .position(|m| m.id == l.id)
                        .unwrap();
                    &comms[k]
                })
                .collect();
            if handles.len() >= 2 {
                // Not the leader: it waits in the local phase for the leader, which
                // never comes; the owner's abort must wake it.
                let waiter = handles[1].clone();
                let t = s.spawn(move || {
                    let mut x = [1.0f32; 4];
                    waiter.all_reduce_sum(&mut x)
                });
                std::thread::sleep(Duration::from_millis(100));
                owner.abort();
                let r = t.join().unwrap();
                assert!(r.is_err(), "a waiting member was not woken by abort");
            } else {
                owner.abort();
            }
            for c in handles {
                let start = Instant::now();
                let mut x = [1.0f32; 4];
                let mut y = [0.0f32; 4 * 8];
                assert!(c.all_reduce_sum(&mut x).is_err());
                assert!(c.broadcast(&mut x, 0).is_err());
                assert!(c.all_gather(&x, &mut y[..4 * c.size()]).is_err());
                assert!(
                    start.elapsed() < Duration::from_millis(500),
                    "abort not fast"
                );
            }
        }
    });

    // Before MPI is finalized: the leaders' communicators are freed with their handles.
    drop(members);
    drop(owners);
}

#[test]
fn one_member_per_process() {
    mpi_test("one_member_per_process", 2, |env| {
        run_groups(env, &[Layout::new(1, &[0, 1], &[0, 1])], 1);
    });
}

#[test]
fn two_members_per_process() {
    mpi_test("two_members_per_process", 2, |env| {
        run_groups(env, &[Layout::new(1, &[0, 1, 2, 3], &[0, 0, 1, 1])], 1);
    });
}

#[test]
fn uneven_members_per_process() {
    mpi_test("uneven_members_per_process", 2, |env| {
        // Group ranks are not global ranks here, and the processes host 2 and 1 members.
        run_groups(env, &[Layout::new(1, &[5, 3, 4], &[0, 0, 1])], 1);
    });
}

#[test]
fn three_processes() {
    mpi_test("three_processes", 3, |env| {
        // Processes in group order 1, 0, 2: the leaders' communicator follows group order.
        run_groups(env, &[Layout::new(1, &[0, 1, 2, 3], &[1, 0, 0, 2])], 1);
    });
}

#[test]
fn groups_inside_one_process() {
    mpi_test("groups_inside_one_process", 2, |env| {
        // Each group lives in one process: no MPI phase, and the other process never
        // adopts it.
        run_groups(
            env,
            &[
                Layout::new(1, &[0, 1], &[0, 0]),
                Layout::new(2, &[2, 3, 4], &[1, 1, 1]),
                Layout::new(3, &[5], &[1]),
            ],
            1,
        );
    });
}

#[test]
fn concurrent_groups() {
    mpi_test("concurrent_groups", 2, |env| {
        // A world group and two subgroups (like DCP groups) whose leaders are different
        // threads, so two MPI communicators are in use at once in each process.
        run_groups(
            env,
            &[
                Layout::new(10, &[0, 1, 2, 3], &[0, 0, 1, 1]),
                Layout::new(11, &[0, 2], &[0, 1]),
                Layout::new(12, &[1, 3], &[0, 1]),
            ],
            3,
        );
    });
}

#[test]
fn bad_layouts_are_refused() {
    mpi_test("bad_layouts_are_refused", 2, |_| {
        let err = GroupOwner::adopt(Layout::new(1, &[0, 1, 2], &[0, 1, 0]).spec())
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("not contiguous"), "{err}");
        let err = GroupOwner::adopt(Layout::new(2, &[0, 1], &[0, 7]).spec())
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("the job has 2 processes"), "{err}");
    });
}
