//! A small persistent thread pool tuned for very frequent, short parallel regions.
//!
//! Decode calls into the pool a few hundred times per token, so dispatch has to cost
//! well under a microsecond: workers spin for a short while after each job before
//! parking on a condvar, and a job is published through shared atomics without any
//! heap allocation. The calling thread takes part as worker 0.

use std::any::Any;
use std::cell::Cell;
use std::cell::UnsafeCell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker spins before it parks.
const SPIN: Duration = Duration::from_micros(100);

/// Number of cores this process may use (at least 1).
pub fn available_cores() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// Cores online on this machine, whatever this process may use (compare
/// [`available_cores`], which follows the process's CPU affinity).
pub fn online_cores() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    if n > 0 {
        n as usize
    } else {
        available_cores()
    }
}

/// Keeps hot atomics on separate cache lines so workers don't false-share.
#[repr(align(128))]
struct Padded<T>(T);

type TaskFn<'a> = dyn Fn(usize) + Sync + 'a;

fn noop(_: usize) {}

#[derive(Clone, Copy)]
struct Job {
    f: *const TaskFn<'static>,
    n_tasks: usize,
}

/// `state` packs `epoch << 32 | CLOSED | active`: the job epoch, whether the caller
/// has closed the job to newcomers, and how many workers joined it and are not done.
/// Workers join with a CAS, so the caller never waits for a worker that was descheduled
/// before joining (common when several ranks share 2 cores): it just does the tasks.
const CLOSED: u64 = 1 << 31;
const ACTIVE_MASK: u64 = CLOSED - 1;

struct Shared {
    state: Padded<AtomicU64>,
    next: Padded<AtomicUsize>,
    job: UnsafeCell<Job>,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    shutdown: AtomicBool,
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    cv: Condvar,
    spin: Duration,
}

// SAFETY: `job` is written only by the thread holding `run_lock` while the previous job
// is closed with no active worker, and read by workers only after joining the new
// epoch; the pointee is `Sync` and outlives the job because `run` waits until no
// joined worker is active.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

thread_local! {
    static IN_POOL: Cell<bool> = const { Cell::new(false) };
}

/// A persistent pool of `n_threads` workers (including the calling thread).
///
/// ```
/// use dcpserve_kernels::ThreadPool;
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// let pool = ThreadPool::new(2);
/// let sum = AtomicUsize::new(0);
/// pool.run(100, |t| { sum.fetch_add(t, Ordering::Relaxed); });
/// assert_eq!(sum.into_inner(), 4950);
/// ```
pub struct ThreadPool {
    shared: Arc<Shared>,
    handles: Vec<JoinHandle<()>>,
    run_lock: Mutex<()>,
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadPool")
            .field("n_threads", &self.n_threads())
            .finish()
    }
}

impl ThreadPool {
    /// Creates a pool with `n_threads` workers in total (the caller of [`run`](Self::run)
    /// is one of them, so `n_threads - 1` OS threads are spawned). `0` is treated as 1.
    /// If the OS refuses to spawn a thread, the pool simply ends up smaller.
    pub fn new(n_threads: usize) -> Self {
        Self::with_spin(n_threads, SPIN)
    }

    /// Like [`new`](Self::new) with a custom idle spin time before workers park
    /// (shorter wastes less CPU when many pools share few cores).
    pub fn with_spin(n_threads: usize, spin: Duration) -> Self {
        let shared = Arc::new(Shared {
            state: Padded(AtomicU64::new(CLOSED)),
            next: Padded(AtomicUsize::new(0)),
            job: UnsafeCell::new(Job {
                f: &noop as &TaskFn<'static> as *const TaskFn<'static>,
                n_tasks: 0,
            }),
            panic: Mutex::new(None),
            shutdown: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            cv: Condvar::new(),
            spin,
        });
        let mut handles = Vec::new();
        for i in 1..n_threads.max(1) {
            let s = Arc::clone(&shared);
            match std::thread::Builder::new()
                .name(format!("dcp-kernel-{i}"))
                .spawn(move || worker_loop(&s))
            {
                Ok(h) => handles.push(h),
                Err(_) => break,
            }
        }
        ThreadPool {
            shared,
            handles,
            run_lock: Mutex::new(()),
        }
    }

    /// Total number of workers, including the calling thread.
    pub fn n_threads(&self) -> usize {
        self.handles.len() + 1
    }

    /// Runs `f(task)` for every task in `0..n_tasks` across the pool and returns when
    /// all are done. A panic in a task is re-raised here after all workers finished.
    /// Calling `run` from inside a task runs the inner tasks serially on that thread.
    pub fn run<F: Fn(usize) + Sync>(&self, n_tasks: usize, f: F) {
        if n_tasks == 0 {
            return;
        }
        if self.handles.is_empty() || n_tasks == 1 || IN_POOL.with(|c| c.get()) {
            for t in 0..n_tasks {
                f(t);
            }
            return;
        }
        let _guard = self.run_lock.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        let f_ref: &TaskFn<'_> = &f;
        // SAFETY: only the lifetime is erased; `run` does not return before every
        // worker that joined this job has left it, so `f` outlives all uses.
        let f_ptr = unsafe { std::mem::transmute::<&TaskFn<'_>, &'static TaskFn<'static>>(f_ref) };
        // SAFETY: the previous job is closed with no active worker: nobody reads `job`.
        unsafe {
            *s.job.get() = Job { f: f_ptr, n_tasks };
        }
        s.next.0.store(0, Ordering::Relaxed);
        let epoch = (s.state.0.load(Ordering::Relaxed) >> 32).wrapping_add(1) & 0xFFFF_FFFF;
        s.state.0.store(epoch << 32, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _l = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.cv.notify_all();
        }
        IN_POOL.with(|c| c.set(true));
        do_tasks(s, f_ref, n_tasks);
        IN_POOL.with(|c| c.set(false));
        // Every task is claimed: close the job and wait only for workers that joined.
        let mut st = s.state.0.fetch_or(CLOSED, Ordering::AcqRel);
        let mut spins = 0u32;
        while st & ACTIVE_MASK != 0 {
            if spins < 20_000 {
                spins += 1;
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
            st = s.state.0.load(Ordering::Acquire);
        }
        let payload = s.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(p) = payload {
            resume_unwind(p);
        }
    }
}

fn do_tasks(s: &Shared, f: &TaskFn<'_>, n_tasks: usize) {
    loop {
        let t = s.next.0.fetch_add(1, Ordering::Relaxed);
        if t >= n_tasks {
            break;
        }
        if let Err(p) = catch_unwind(AssertUnwindSafe(|| f(t))) {
            let mut slot = s.panic.lock().unwrap_or_else(|e| e.into_inner());
            if slot.is_none() {
                *slot = Some(p);
            }
            // Skip the remaining tasks: the caller is going to unwind anyway.
            s.next.0.store(n_tasks, Ordering::Relaxed);
        }
    }
}

fn worker_loop(s: &Shared) {
    IN_POOL.with(|c| c.set(true));
    let mut seen = 0u64;
    loop {
        let epoch = wait_for_epoch(s, seen);
        seen = epoch;
        if s.shutdown.load(Ordering::Acquire) {
            return;
        }
        // Join the job unless it is already closed (or superseded).
        let mut cur = s.state.0.load(Ordering::Acquire);
        let joined = loop {
            if cur >> 32 != epoch || cur & CLOSED != 0 {
                break false;
            }
            match s
                .state
                .0
                .compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break true,
                Err(c) => cur = c,
            }
        };
        if !joined {
            continue;
        }
        // SAFETY: the job of this open epoch stays valid while we are counted active.
        let job = unsafe { *s.job.get() };
        // SAFETY: as above; `run` waits for the active count to drop before returning.
        let f = unsafe { &*job.f };
        do_tasks(s, f, job.n_tasks);
        s.state.0.fetch_sub(1, Ordering::Release);
    }
}

/// Waits until the epoch differs from `seen` (or shutdown) and returns it.
fn wait_for_epoch(s: &Shared, seen: u64) -> u64 {
    let epoch = || s.state.0.load(Ordering::SeqCst) >> 32;
    let start = Instant::now();
    let mut i = 0u32;
    loop {
        let e = epoch();
        if e != seen || s.shutdown.load(Ordering::Relaxed) {
            return e;
        }
        std::hint::spin_loop();
        i = i.wrapping_add(1);
        if i.is_multiple_of(128) && start.elapsed() > s.spin {
            break;
        }
    }
    let mut l = s.lock.lock().unwrap_or_else(|e| e.into_inner());
    s.sleepers.fetch_add(1, Ordering::SeqCst);
    let mut e = epoch();
    while e == seen && !s.shutdown.load(Ordering::SeqCst) {
        l = s.cv.wait(l).unwrap_or_else(|e| e.into_inner());
        e = epoch();
    }
    s.sleepers.fetch_sub(1, Ordering::SeqCst);
    e
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let _l = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.cv.notify_all();
        }
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

/// Pins the calling thread to the cores `cores` (Linux; elsewhere it does nothing).
/// Returns whether it took effect.
pub fn pin_current_thread(cores: std::ops::Range<usize>) -> bool {
    #[cfg(target_os = "linux")]
    // SAFETY: `set` is a plain bit set on the stack; pid 0 means the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for c in cores.filter(|&c| c < libc::CPU_SETSIZE as usize) {
            libc::CPU_SET(c, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = cores;
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_every_task_once() {
        let pool = ThreadPool::new(3);
        assert_eq!(pool.n_threads(), 3);
        for n in [0usize, 1, 2, 7, 1000] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool.run(n, |t| {
                hits[t].fetch_add(1, Ordering::Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        }
    }

    #[test]
    fn many_small_jobs_and_parking() {
        let pool = ThreadPool::new(2);
        let total = AtomicUsize::new(0);
        for i in 0..2000 {
            pool.run(4, |_| {
                total.fetch_add(1, Ordering::Relaxed);
            });
            if i % 500 == 0 {
                // Let the workers park, then wake them again.
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        assert_eq!(total.into_inner(), 8000);
    }

    #[test]
    fn panics_propagate() {
        let pool = ThreadPool::new(2);
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.run(64, |t| {
                if t == 33 {
                    panic!("boom");
                }
            })
        }));
        assert!(r.is_err());
        // The pool stays usable.
        let c = AtomicUsize::new(0);
        pool.run(10, |_| {
            c.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(c.into_inner(), 10);
    }

    #[test]
    fn nested_run_is_serial() {
        let pool = ThreadPool::new(2);
        let c = AtomicUsize::new(0);
        pool.run(4, |_| {
            pool.run(3, |_| {
                c.fetch_add(1, Ordering::Relaxed);
            })
        });
        assert_eq!(c.into_inner(), 12);
        assert!(available_cores() >= 1);
    }
}
