//! Runs the blocks of a grid: every thread of a block as a fiber on the calling OS
//! thread, switched at each `__syncthreads` and warp collective, so that a barrier is
//! released only once every thread it names has reached it (and a barrier that can never
//! be released is reported as the hang it would be on a GPU).

use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr};
use std::ptr;

use super::error::{LaunchError, LaunchErrorKind, ASSERT_PREFIX};
use super::fault::{self, AltStack};
use super::fiber::{self, Fiber, Stacks, State, ThreadAbi, Uint3};
use super::schedule::Schedule;
use super::shared_poison::TlsBlock;

/// A module's kernel entry: unpacks `params` and runs one CUDA thread.
pub(crate) type Entry = unsafe extern "C" fn(*mut *mut c_void);

/// The device's floating-point mode for the fibers of a block: round to nearest, no
/// flush of subnormals (NVRTC's `--ftz=false`), whatever the host thread had set;
/// restored when dropped.
struct DeviceFpMode {
    saved: u32,
}

/// MXCSR with every exception masked, round to nearest, no FTZ / DAZ.
const DEVICE_MXCSR: u32 = 0x1F80;

impl DeviceFpMode {
    fn enter() -> DeviceFpMode {
        let mut saved = 0u32;
        // SAFETY: stores MXCSR into a local.
        unsafe { std::arch::asm!("stmxcsr [{}]", in(reg) &mut saved, options(nostack)) };
        if saved & !0x3F != DEVICE_MXCSR {
            // SAFETY: loads a valid MXCSR value.
            unsafe { std::arch::asm!("ldmxcsr [{}]", in(reg) &DEVICE_MXCSR, options(nostack)) };
        }
        DeviceFpMode { saved }
    }
}

impl Drop for DeviceFpMode {
    fn drop(&mut self) {
        if self.saved & !0x3F != DEVICE_MXCSR {
            // SAFETY: restores the value read in `enter`.
            unsafe { std::arch::asm!("ldmxcsr [{}]", in(reg) &self.saved, options(nostack)) };
        }
    }
}

/// One warp's pending collective.
#[derive(Default, Clone)]
struct Warp {
    /// Lanes waiting at it, the mask they named, and whether it is a vote or sync
    /// (op >= 32) or a shuffle.
    arrived: u32,
    mask: u32,
    vote_op: Option<u32>,
    exited: u32,
}

/// What one block's fibers share (reached from each fiber through `abi.runtime`).
pub(crate) struct BlockRun {
    stacks: Stacks,
    threads: usize,
    warps: Vec<Warp>,
    at_barrier: usize,
    exited: usize,
    sched_sp: *mut u8,
    error: Option<LaunchError>,
    entry: Option<Entry>,
    params: *mut *mut c_void,
    dyn_shared: Vec<u128>,
    order: Vec<u32>,
    /// The fiber running now (for a fault's report).
    current: usize,
    /// Where a faulting fiber goes to report (see `fault`).
    landing: Vec<u128>,
    _alt_stack: AltStack,
}

thread_local! {
    // Each OS thread keeps its stacks (and shared-memory buffers) from block to block.
    static RUN: RefCell<BlockRun> = RefCell::new(BlockRun::new());
}

/// The launch a block belongs to.
pub(crate) struct GridJob<'a> {
    pub entry: Entry,
    pub params: *mut *mut c_void,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub dynamic_shared_bytes: usize,
    pub schedule: &'a Schedule,
    /// The module's static shared memory, filled with garbage before each block.
    pub shared_tls: Option<TlsBlock>,
}

/// Runs block `linear` of `job` on the calling OS thread.
pub(crate) fn run_block(job: &GridJob<'_>, linear: u64) -> Result<(), LaunchError> {
    RUN.with(|r| {
        let mut run = r.try_borrow_mut().map_err(|_| {
            LaunchError::new(
                LaunchErrorKind::Failed,
                "a kernel launched from inside a kernel",
            )
        })?;
        run.run(job, linear)
    })
}

impl BlockRun {
    fn new() -> BlockRun {
        BlockRun {
            stacks: Stacks::empty(),
            threads: 0,
            warps: Vec::new(),
            at_barrier: 0,
            exited: 0,
            sched_sp: ptr::null_mut(),
            error: None,
            entry: None,
            params: ptr::null_mut(),
            dyn_shared: Vec::new(),
            order: Vec::new(),
            current: 0,
            landing: vec![0; 16 * 1024 / 16],
            _alt_stack: AltStack::for_this_thread(),
        }
    }

    fn fiber(&self, i: usize) -> *mut Fiber {
        self.stacks.fiber(i)
    }

    fn run(&mut self, job: &GridJob<'_>, linear: u64) -> Result<(), LaunchError> {
        let [bx, by, bz] = job.block;
        let n = (bx as usize) * (by as usize) * (bz as usize);
        self.stacks
            .reserve(n)
            .map_err(|e| LaunchError::new(LaunchErrorKind::OutOfResources, e))?;
        self.threads = n;
        self.warps.clear();
        self.warps.resize(n.div_ceil(32), Warp::default());
        self.at_barrier = 0;
        self.exited = 0;
        self.error = None;
        self.entry = Some(job.entry);
        self.params = job.params;
        // Dynamic shared memory starts as NaN-like garbage, as reading it before writing
        // is a bug (the device leaves whatever the previous block had there).
        let words = job.dynamic_shared_bytes.div_ceil(16);
        self.dyn_shared.clear();
        self.dyn_shared.resize(words, u128::MAX);
        let dyn_ptr: *mut c_void = if words == 0 {
            ptr::null_mut()
        } else {
            self.dyn_shared.as_mut_ptr().cast()
        };
        if let Some(tls) = job.shared_tls {
            tls.poison();
        }
        let [gx, gy, _] = job.grid;
        let block_idx = Uint3 {
            x: (linear % u64::from(gx)) as u32,
            y: ((linear / u64::from(gx)) % u64::from(gy)) as u32,
            z: (linear / (u64::from(gx) * u64::from(gy))) as u32,
        };
        let self_ptr: *mut c_void = (self as *mut BlockRun).cast();
        for i in 0..n {
            let f = self.fiber(i);
            let t = i as u32;
            // SAFETY: slot i is reserved and idle; its control page is ours to write.
            unsafe {
                f.write(Fiber {
                    abi: ThreadAbi {
                        thread_idx: Uint3 {
                            x: t % bx,
                            y: (t / bx) % by,
                            z: t / (bx * by),
                        },
                        block_idx,
                        block_dim: Uint3 {
                            x: bx,
                            y: by,
                            z: bz,
                        },
                        grid_dim: Uint3 {
                            x: job.grid[0],
                            y: job.grid[1],
                            z: job.grid[2],
                        },
                        lane: t % 32,
                        warp_size: 32,
                        dyn_shared: dyn_ptr,
                        runtime: self_ptr,
                        sync_block,
                        warp_op,
                        fail,
                        active_mask,
                        sync_block_count,
                    },
                    sp: self.stacks.prepare(i, fiber_entry),
                    state: State::Runnable,
                    linear: t,
                    coll_value: 0,
                    coll_op: 0,
                    coll_result: 0,
                });
            }
        }
        let fp_mode = DeviceFpMode::enter();
        // SAFETY: every fiber is initialised above.
        let result = unsafe { Self::schedule(self, job.schedule) };
        drop(fp_mode);
        self.entry = None;
        self.params = ptr::null_mut();
        result.map_err(|e| {
            e.context(format_args!(
                "block ({}, {}, {})",
                block_idx.x, block_idx.y, block_idx.z
            ))
        })
    }

    /// Runs every runnable thread in turn (in the schedule's order) until all have
    /// exited, one fails, or none can move. Works through a raw pointer: the fibers
    /// reach the same `BlockRun` through their control blocks while it runs.
    ///
    /// # Safety
    /// `this` is the block's run, initialised by [`BlockRun::run`].
    unsafe fn schedule(this: *mut BlockRun, schedule: &Schedule) -> Result<(), LaunchError> {
        fault::install();
        let previous = fault::set_current(Some(this as *mut dyn fault::FaultSink));
        // SAFETY (whole body): `this` is live; fibers only run inside `switch`.
        let mut order = std::mem::take(unsafe { &mut (*this).order });
        let result = loop {
            let threads = unsafe { (*this).threads };
            schedule.order(threads, &mut order);
            let mut ran = false;
            for &i in &order {
                let f = unsafe { (*this).fiber(i as usize) };
                if unsafe { (*f).state } != State::Runnable {
                    continue;
                }
                ran = true;
                unsafe { (*this).current = i as usize };
                unsafe { fiber::switch(ptr::addr_of_mut!((*this).sched_sp), (*f).sp) };
                if unsafe { (*this).error.is_some() } {
                    break;
                }
            }
            if let Some(e) = unsafe { (*this).error.take() } {
                break Err(e);
            }
            if unsafe { (*this).exited } == threads {
                break Ok(());
            }
            if !ran {
                let report = unsafe { (*this).deadlock_report() };
                break Err(LaunchError::new(LaunchErrorKind::Failed, report));
            }
        };
        unsafe { (*this).order = order };
        fault::set_current(previous);
        result
    }

    /// Why no thread can move: who waits where.
    fn deadlock_report(&self) -> String {
        let mut at_sync = 0;
        let mut waits = Vec::new();
        for (w, warp) in self.warps.iter().enumerate() {
            if warp.arrived != 0 {
                waits.push(format!(
                    "warp {w}: lanes {:#010x} wait at a warp collective of mask {:#010x} (lanes {:#010x} exited)",
                    warp.arrived, warp.mask, warp.exited
                ));
            }
        }
        for i in 0..self.threads {
            // SAFETY: initialised control blocks.
            if unsafe { (*self.fiber(i)).state } == State::AtBlockBarrier {
                at_sync += 1;
            }
        }
        format!(
            "deadlock (the kernel would hang on a GPU): {at_sync} of {} threads wait at __syncthreads, {} exited; {}",
            self.threads,
            self.exited,
            if waits.is_empty() { "no warp collective pending".to_owned() } else { waits.join("; ") }
        )
    }
}

impl fault::FaultSink for BlockRun {
    fn landing_for(&self, sp: usize) -> Option<usize> {
        if !self.stacks.contains(sp) {
            return None;
        }
        let top = (self.landing.as_ptr() as usize + self.landing.len() * 16) & !15;
        // As if called: the return address slot below a 16-byte aligned top.
        Some(top - 8)
    }

    unsafe fn fault(&mut self, addr: usize, sig: std::ffi::c_int) -> ! {
        let f = self.fiber(self.current);
        let what = if self.stacks.is_guard(self.current, addr) {
            format!(
                "stack overflow (a thread's stack here is {} KiB)",
                fiber::STACK_BYTES / 1024
            )
        } else if addr == 0 && sig == libc::SIGSEGV {
            "invalid memory access (a null or non-canonical address: a device pointer not translated?)".to_owned()
        } else {
            format!(
                "invalid memory access at {addr:#x} ({})",
                if sig == libc::SIGBUS {
                    "SIGBUS"
                } else {
                    "SIGSEGV"
                }
            )
        };
        // SAFETY: f is the fiber that faulted; it never runs again.
        unsafe { fail_with(self, f, LaunchErrorKind::IllegalAddress, what) }
    }
}

/// The block and fiber of a thread's control block.
///
/// # Safety
/// `abi` is the control block of a running fiber of a live [`BlockRun`].
unsafe fn parts<'a>(abi: *mut ThreadAbi) -> (&'a mut BlockRun, *mut Fiber) {
    // SAFETY: the caller's contract; ThreadAbi is the first field of Fiber.
    unsafe { (&mut *((*abi).runtime as *mut BlockRun), abi.cast::<Fiber>()) }
}

/// Switches from fiber `f` back to the scheduler until it is resumed.
///
/// # Safety
/// Called on `f`'s own stack.
unsafe fn yield_to_scheduler(run: *mut BlockRun, f: *mut Fiber) {
    // SAFETY: the scheduler's stack pointer was saved when it switched to f.
    unsafe { fiber::switch(&mut (*f).sp, (*run).sched_sp) }
}

/// Records `msg` as the launch's error and leaves the fiber for good.
pub(crate) unsafe fn fail_with(
    run: &mut BlockRun,
    f: *mut Fiber,
    kind: LaunchErrorKind,
    msg: String,
) -> ! {
    // SAFETY: f is running.
    let t = unsafe { &(*f).abi.thread_idx };
    let msg = format!("thread ({}, {}, {}): {msg}", t.x, t.y, t.z);
    run.error = Some(LaunchError::new(kind, msg));
    // SAFETY: as above.
    unsafe {
        (*f).state = State::Failed;
        yield_to_scheduler(run, f);
    }
    // A failed fiber is never resumed.
    std::process::abort()
}

unsafe extern "C" fn fiber_entry(f: *mut Fiber) -> ! {
    // SAFETY: f is this fiber's control block, its runtime the live BlockRun.
    let run = unsafe { (*f).abi.runtime as *mut BlockRun };
    // SAFETY: as above; entry and params are set for the launch.
    unsafe {
        if let Some(entry) = (*run).entry {
            entry((*run).params);
        }
        thread_exit(&mut *run, f);
        yield_to_scheduler(run, f);
    }
    std::process::abort()
}

/// Marks `f` exited; releases a barrier that only waited for it.
unsafe fn thread_exit(run: &mut BlockRun, f: *mut Fiber) {
    // SAFETY: f is running.
    let (linear, lane) = unsafe { ((*f).linear as usize, (*f).abi.lane) };
    let warp = &mut run.warps[linear / 32];
    warp.exited |= 1 << lane;
    if warp.arrived != 0 && warp.mask & (1 << lane) != 0 {
        let msg = format!(
            "exited while lanes {:#010x} of its warp wait for it at a warp collective",
            warp.arrived
        );
        // SAFETY: f is running.
        unsafe { fail_with(run, f, LaunchErrorKind::Failed, msg) };
    }
    // SAFETY: f is running.
    unsafe { (*f).state = State::Exited };
    run.exited += 1;
    if run.at_barrier > 0 && run.at_barrier + run.exited == run.threads {
        release_block_barrier(run);
    }
}

/// Lets every thread waiting at `__syncthreads` go on, each with the count of the
/// waiting threads that brought a non-zero predicate (`__syncthreads_count`; a plain
/// `__syncthreads` brings 0).
fn release_block_barrier(run: &mut BlockRun) {
    let mut count = 0u64;
    for i in 0..run.threads {
        let g = run.fiber(i);
        // SAFETY: initialised control blocks; only the running fiber touches them.
        unsafe {
            if (*g).state == State::AtBlockBarrier && (*g).coll_value != 0 {
                count += 1;
            }
        }
    }
    for i in 0..run.threads {
        let g = run.fiber(i);
        // SAFETY: as above.
        unsafe {
            if (*g).state == State::AtBlockBarrier {
                (*g).state = State::Runnable;
                (*g).coll_result = count;
            }
        }
    }
    run.at_barrier = 0;
}

unsafe extern "C" fn sync_block(abi: *mut ThreadAbi) {
    // SAFETY: the caller's.
    unsafe { sync_block_count(abi, 0) };
}

unsafe extern "C" fn sync_block_count(abi: *mut ThreadAbi, pred: std::ffi::c_int) -> u32 {
    // SAFETY: called by a running fiber with its own control block.
    let (run, f) = unsafe { parts(abi) };
    // SAFETY: f is running.
    unsafe {
        (*f).state = State::AtBlockBarrier;
        (*f).coll_value = u64::from(pred != 0);
    }
    run.at_barrier += 1;
    if run.at_barrier + run.exited == run.threads {
        release_block_barrier(run);
    }
    // SAFETY: on f's stack; the release set the count.
    unsafe {
        yield_to_scheduler(run, f);
        (*f).coll_result as u32
    }
}

const OP_BALLOT: u32 = 32;
const OP_SYNCWARP: u32 = 33;

unsafe extern "C" fn warp_op(abi: *mut ThreadAbi, mask: u32, value: u64, op: u32) -> u64 {
    // SAFETY: called by a running fiber with its own control block.
    let (run, f) = unsafe { parts(abi) };
    // SAFETY: f is running.
    let (linear, lane) = unsafe { ((*f).linear as usize, (*f).abi.lane) };
    let w = linear / 32;
    let lanes_here = (run.threads - w * 32).min(32);
    let existing = if lanes_here == 32 {
        u32::MAX
    } else {
        (1u32 << lanes_here) - 1
    };
    let warp = &run.warps[w];
    let kind = if op < 32 { None } else { Some(op) };
    let ok = mask & (1 << lane) != 0
        && mask & !existing == 0
        && mask & warp.exited == 0
        && (op >= 32 || mask & (1 << op) != 0)
        && (warp.arrived == 0 || (warp.mask == mask && warp.vote_op == kind));
    // The checks above are the fast path; the message is built only for a failure.
    let problem = if ok {
        None
    } else {
        let what = match op {
            OP_BALLOT => "vote".to_owned(),
            OP_SYNCWARP => "__syncwarp".to_owned(),
            src => format!("shuffle from lane {src}"),
        };
        Some(if mask & (1 << lane) == 0 {
            format!("{what} with mask {mask:#010x}, which does not name the calling lane {lane}")
        } else if mask & !existing != 0 {
            format!("{what} with mask {mask:#010x} naming lanes that do not exist (the warp has {lanes_here} threads)")
        } else if mask & warp.exited != 0 {
            format!(
                "{what} with mask {mask:#010x} naming lanes {:#010x} that have exited",
                mask & warp.exited
            )
        } else if op < 32 && mask & (1 << op) == 0 {
            format!("{what}: lane {op} is not in the mask {mask:#010x} (its value is undefined)")
        } else {
            format!(
                "{what} with mask {mask:#010x} while lanes {:#010x} of the warp wait at another warp collective (mask {:#010x})",
                warp.arrived, warp.mask
            )
        })
    };
    if let Some(p) = problem {
        // SAFETY: f is running.
        unsafe { fail_with(run, f, LaunchErrorKind::Failed, p) };
    }
    // SAFETY: f is running.
    unsafe {
        (*f).coll_value = value;
        (*f).coll_op = op;
        (*f).state = State::AtWarpCollective;
    }
    let warp = &mut run.warps[w];
    warp.mask = mask;
    warp.vote_op = if op < 32 { None } else { Some(op) };
    warp.arrived |= 1 << lane;
    if warp.arrived == mask {
        complete_warp_collective(run, w, mask);
    }
    // SAFETY: on f's stack.
    unsafe {
        yield_to_scheduler(run, f);
        (*f).coll_result
    }
}

/// Every lane of `mask` has arrived: computes each one's result and lets them go on.
fn complete_warp_collective(run: &mut BlockRun, w: usize, mask: u32) {
    let base = w * 32;
    let mut values = [0u64; 32];
    let mut ballot = 0u32;
    for (l, v) in values.iter_mut().enumerate() {
        if mask & (1 << l) != 0 {
            // SAFETY: lane l exists (checked against the mask on arrival).
            *v = unsafe { (*run.fiber(base + l)).coll_value };
            if *v != 0 {
                ballot |= 1 << l;
            }
        }
    }
    for l in 0..32 {
        if mask & (1 << l) == 0 {
            continue;
        }
        let g = run.fiber(base + l);
        // SAFETY: as above; the lane waits at this collective.
        unsafe {
            (*g).coll_result = match (*g).coll_op {
                src @ 0..=31 => values[src as usize],
                OP_BALLOT => u64::from(ballot),
                _ => 0,
            };
            (*g).state = State::Runnable;
        }
    }
    run.warps[w].arrived = 0;
}

unsafe extern "C" fn fail(abi: *mut ThreadAbi, msg: *const c_char) {
    // SAFETY: called by a running fiber; msg is a C string from the header.
    let (run, f) = unsafe { parts(abi) };
    let text = if msg.is_null() {
        "kernel failure".to_owned()
    } else {
        // SAFETY: as above.
        unsafe { CStr::from_ptr(msg) }
            .to_string_lossy()
            .into_owned()
    };
    let kind = if text.starts_with(ASSERT_PREFIX) {
        LaunchErrorKind::Assert
    } else {
        LaunchErrorKind::Failed
    };
    // SAFETY: f is running.
    unsafe { fail_with(run, f, kind, text) }
}

/// The lanes of the caller's warp that have not exited (the emulator's threads never
/// diverge within a warp in a way it could observe).
unsafe extern "C" fn active_mask(abi: *mut ThreadAbi) -> u32 {
    // SAFETY: called by a running fiber.
    let (run, f) = unsafe { parts(abi) };
    // SAFETY: f is running.
    let w = unsafe { (*f).linear as usize } / 32;
    let lanes_here = (run.threads - w * 32).min(32);
    let existing = if lanes_here == 32 {
        u32::MAX
    } else {
        (1u32 << lanes_here) - 1
    };
    existing & !run.warps[w].exited
}
