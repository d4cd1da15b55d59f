//! A fault inside kernel code (SIGSEGV / SIGBUS on a fiber's stack) becomes a launch
//! error naming the thread and the address, as a GPU reports an illegal address, instead
//! of killing the process. The handler moves the faulting thread onto a small landing
//! stack that records the error and switches back to the block's scheduler; a fault
//! anywhere else goes to the handler installed before (Rust's stack-overflow report, or
//! the default action).

use std::cell::Cell;
use std::ffi::{c_int, c_void};
use std::ptr;
use std::sync::OnceLock;

/// What the handler needs from the block a thread runs (the block's scheduler,
/// `block::BlockRun`, implements it; the trait keeps this file from naming it).
pub(crate) trait FaultSink {
    /// The landing stack pointer for a fault at stack pointer `sp`, if `sp` is on one of
    /// the block's fiber stacks (a fault elsewhere is not a kernel's).
    fn landing_for(&self, sp: usize) -> Option<usize>;

    /// Records a fault of the running fiber at `addr` and leaves for the scheduler.
    ///
    /// # Safety
    /// Called on the landing stack, for the fiber that faulted.
    unsafe fn fault(&mut self, addr: usize, sig: c_int) -> !;
}

/// The block a thread runs, if any.
pub(crate) type Current = Option<*mut dyn FaultSink>;

thread_local! {
    /// The block this OS thread is running (none outside a block).
    static CURRENT: Cell<Current> = const { Cell::new(None) };
}

/// Sets the block the calling thread runs; returns the previous one.
pub(crate) fn set_current(run: Current) -> Current {
    CURRENT.with(|c| c.replace(run))
}

/// The handlers found for SIGSEGV and SIGBUS when ours were installed.
struct Previous([libc::sigaction; 2]);
// SAFETY: plain data (handler addresses, masks, flags), only read after installation.
unsafe impl Send for Previous {}
// SAFETY: as above.
unsafe impl Sync for Previous {}

static PREVIOUS: OnceLock<Previous> = OnceLock::new();

/// Installs the handler once per process.
pub(crate) fn install() {
    PREVIOUS.get_or_init(|| {
        let mut prev: [libc::sigaction; 2] = unsafe { std::mem::zeroed() };
        for (i, sig) in [libc::SIGSEGV, libc::SIGBUS].into_iter().enumerate() {
            // SAFETY: a zeroed sigaction filled in; sigaction() writes the old one.
            unsafe {
                let mut sa: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = handler
                    as unsafe extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void)
                    as usize;
                sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
                libc::sigemptyset(&mut sa.sa_mask);
                libc::sigaction(sig, &sa, &mut prev[i]);
            }
        }
        Previous(prev)
    });
}

/// An alternate signal stack for a thread that has none (a fault on a fiber's guard
/// page needs another stack to run the handler on). Disabled again when dropped.
pub(crate) struct AltStack {
    mem: Option<Vec<u8>>,
}

impl AltStack {
    pub(crate) fn for_this_thread() -> AltStack {
        // SAFETY: querying and setting the calling thread's alternate stack.
        unsafe {
            let mut old: libc::stack_t = std::mem::zeroed();
            if libc::sigaltstack(ptr::null(), &mut old) != 0 || old.ss_flags & libc::SS_DISABLE == 0
            {
                return AltStack { mem: None };
            }
            let mut mem = vec![0u8; 64 * 1024];
            let st = libc::stack_t {
                ss_sp: mem.as_mut_ptr().cast(),
                ss_flags: 0,
                ss_size: mem.len(),
            };
            if libc::sigaltstack(&st, ptr::null_mut()) != 0 {
                return AltStack { mem: None };
            }
            AltStack { mem: Some(mem) }
        }
    }
}

impl Drop for AltStack {
    fn drop(&mut self) {
        if self.mem.is_some() {
            // SAFETY: disabling the stack this thread installed before it is freed.
            unsafe {
                let st = libc::stack_t {
                    ss_sp: ptr::null_mut(),
                    ss_flags: libc::SS_DISABLE,
                    ss_size: 0,
                };
                libc::sigaltstack(&st, ptr::null_mut());
            }
        }
    }
}

unsafe extern "C" fn handler(sig: c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    let run = CURRENT.with(|c| c.get());
    let uc = ctx.cast::<libc::ucontext_t>();
    if let (Some(run), false) = (run, uc.is_null()) {
        // SAFETY: the kernel's context of this signal; `run` is this thread's live block.
        unsafe {
            let gregs = &mut (*uc).uc_mcontext.gregs;
            let sp = gregs[libc::REG_RSP as usize] as usize;
            if let Some(landing) = (*run).landing_for(sp) {
                gregs[libc::REG_RDI as usize] = (*info).si_addr() as usize as i64;
                gregs[libc::REG_RSI as usize] = i64::from(sig);
                gregs[libc::REG_RSP as usize] = landing as i64;
                gregs[libc::REG_RIP as usize] =
                    fault_landing as unsafe extern "C" fn(usize, c_int) -> ! as usize as i64;
                return;
            }
        }
    }
    // Not a kernel's fault: whoever handled it before.
    let Some(prev) = PREVIOUS.get() else { return };
    let prev = prev.0[usize::from(sig != libc::SIGSEGV)];
    match prev.sa_sigaction {
        libc::SIG_DFL | libc::SIG_IGN => {
            // SAFETY: back to the default action; returning re-raises the fault.
            unsafe { libc::signal(sig, libc::SIG_DFL) };
        }
        f if prev.sa_flags & libc::SA_SIGINFO != 0 => {
            // SAFETY: the previous three-argument handler, as the kernel would call it.
            let f: unsafe extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) =
                unsafe { std::mem::transmute(f) };
            unsafe { f(sig, info, ctx) }
        }
        f => {
            // SAFETY: the previous one-argument handler.
            let f: unsafe extern "C" fn(c_int) = unsafe { std::mem::transmute(f) };
            unsafe { f(sig) }
        }
    }
}

/// Where a faulting kernel thread resumes (on the block's landing stack): records the
/// error and leaves for the scheduler.
unsafe extern "C" fn fault_landing(addr: usize, sig: c_int) -> ! {
    let run = CURRENT.with(|c| c.get());
    // The handler only lands here while a block runs one of its fibers.
    let Some(run) = run else {
        std::process::abort()
    };
    // SAFETY: `run` is this thread's live block, which the faulting fiber belongs to.
    unsafe { (*run).fault(addr, sig) }
}
