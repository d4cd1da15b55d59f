//! Running a grid: the launching thread takes blocks from a shared counter, helped by up
//! to `DCPEMU_BLOCK_THREADS - 1` pool threads that live as long as the process (each
//! keeps its fiber stacks, so a launch costs no thread start and no stack mapping).
//! The launch returns only once every helper is done with it, so the caller's parameter
//! array outlives every use.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex};

use super::block::{self, Entry, GridJob};
use super::error::LaunchError;
use super::schedule::Schedule;
use super::shared_poison::TlsBlock;
use super::LaunchDims;

/// One launch, shared by the threads that run its blocks.
pub(crate) struct Grid {
    pub entry: Entry,
    pub params: *mut *mut c_void,
    pub dims: LaunchDims,
    pub shared_tls: Option<TlsBlock>,
    pub schedule: Mutex<Schedule>,
    pub total: u64,
    next: AtomicU64,
    stop: AtomicBool,
    error: Mutex<Option<LaunchError>>,
    helpers_left: Mutex<usize>,
    helpers_done: Condvar,
}

// SAFETY: `params` is only read, and only while the launching thread waits for the
// helpers (see `run`); everything else is Send + Sync.
unsafe impl Send for Grid {}
// SAFETY: as above.
unsafe impl Sync for Grid {}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Grid {
    pub(crate) fn new(
        entry: Entry,
        params: *mut *mut c_void,
        dims: LaunchDims,
        shared_tls: Option<TlsBlock>,
        schedule: Schedule,
    ) -> Grid {
        let total = dims.grid.iter().map(|&d| u64::from(d)).product();
        Grid {
            entry,
            params,
            dims,
            shared_tls,
            schedule: Mutex::new(schedule),
            total,
            next: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            error: Mutex::new(None),
            helpers_left: Mutex::new(0),
            helpers_done: Condvar::new(),
        }
    }

    /// Runs blocks until none is left or one fails (`worker` varies a random schedule).
    fn run_part(&self, worker: u64) {
        let schedule = lock(&self.schedule).for_worker(worker);
        let job = GridJob {
            entry: self.entry,
            params: self.params,
            grid: self.dims.grid,
            block: self.dims.block,
            dynamic_shared_bytes: self.dims.dynamic_shared_bytes as usize,
            schedule: &schedule,
            shared_tls: self.shared_tls,
        };
        loop {
            let b = self.next.fetch_add(1, Ordering::Relaxed);
            if b >= self.total || self.stop.load(Ordering::Relaxed) {
                return;
            }
            if let Err(e) = block::run_block(&job, b) {
                self.stop.store(true, Ordering::Relaxed);
                lock(&self.error).get_or_insert(e);
                return;
            }
        }
    }
}

/// Counts a helper out when it is done with a grid, even if it panicked.
struct HelperDone(Arc<Grid>);

impl Drop for HelperDone {
    fn drop(&mut self) {
        let mut left = lock(&self.0.helpers_left);
        *left -= 1;
        if *left == 0 {
            self.0.helpers_done.notify_all();
        }
    }
}

/// A grid handed to a pool thread, with the thread's worker number.
type Assignment = (Arc<Grid>, u64);

/// The pool's threads, each fed through its own channel.
static POOL: Mutex<Vec<Sender<Assignment>>> = Mutex::new(Vec::new());

/// Hands `grid` to `helpers` pool threads, starting threads as needed; returns how many
/// took it.
fn submit(grid: &Arc<Grid>, helpers: usize) -> usize {
    let mut pool = lock(&POOL);
    while pool.len() < helpers {
        let (tx, rx) = channel::<Assignment>();
        let spawned = std::thread::Builder::new()
            .name(format!("dcpemu-blocks-{}", pool.len() + 1))
            .spawn(move || {
                for (grid, worker) in rx {
                    let done = HelperDone(grid);
                    done.0.run_part(worker);
                }
            });
        if spawned.is_err() {
            break;
        }
        pool.push(tx);
    }
    let n = helpers.min(pool.len());
    *lock(&grid.helpers_left) = n;
    let mut sent = 0;
    for (w, tx) in pool.iter().take(n).enumerate() {
        if tx.send((grid.clone(), w as u64 + 1)).is_ok() {
            sent += 1;
        }
    }
    // A thread that is gone will not count itself out.
    *lock(&grid.helpers_left) -= n - sent;
    sent
}

/// Runs every block of `grid` on the calling thread and up to `threads - 1` helpers.
pub(crate) fn run(grid: Arc<Grid>, threads: usize) -> Result<(), LaunchError> {
    let helpers = (threads.saturating_sub(1) as u64).min(grid.total.saturating_sub(1)) as usize;
    if helpers > 0 {
        submit(&grid, helpers);
    }
    grid.run_part(0);
    let mut left = lock(&grid.helpers_left);
    while *left > 0 {
        left = grid
            .helpers_done
            .wait(left)
            .unwrap_or_else(|p| p.into_inner());
    }
    drop(left);
    match lock(&grid.error).take() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
