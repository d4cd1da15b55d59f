//! Fibers for the threads of a block: a hand-written x86-64 context switch (a few
//! nanoseconds, against a system call per `swapcontext`) and stacks in 64 KiB-aligned
//! slots whose first page is the thread's control block ([`Fiber`]), which the kernel
//! code finds by masking its stack pointer (`dcpemu_self()` in `include/dcpemu.h`).

use std::ffi::c_void;
use std::ptr;

/// Size and alignment of one slot: control page, guard page, stack (`DCPEMU_STACK_SLOT`).
pub(crate) const SLOT: usize = 65536;
const PAGE: usize = 4096;
/// Where the stack begins in a slot (above the control page and the guard page).
const STACK_START: usize = 2 * PAGE;
/// Stack bytes of one thread.
pub(crate) const STACK_BYTES: usize = SLOT - STACK_START;

/// A slot's offset of its control block and stack top: slots are 64 KiB apart, so
/// without it every thread's control block and hot stack frames would map to the same
/// cache sets.
fn color(slot_base: usize) -> usize {
    ((slot_base >> 16) & 31) << 6
}

const _: () = assert!(31 * 64 + std::mem::size_of::<Fiber>() <= PAGE);

/// `uint3` of the header.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Uint3 {
    pub x: u32,
    pub y: u32,
    pub z: u32,
}

/// `dcpemu_thread` of `include/dcpemu.h`, field for field.
#[repr(C)]
pub(crate) struct ThreadAbi {
    pub thread_idx: Uint3,
    pub block_idx: Uint3,
    pub block_dim: Uint3,
    pub grid_dim: Uint3,
    pub lane: u32,
    pub warp_size: u32,
    pub dyn_shared: *mut c_void,
    pub runtime: *mut c_void,
    pub sync_block: unsafe extern "C" fn(*mut ThreadAbi),
    pub warp_op: unsafe extern "C" fn(*mut ThreadAbi, u32, u64, u32) -> u64,
    pub fail: unsafe extern "C" fn(*mut ThreadAbi, *const std::ffi::c_char),
    pub active_mask: unsafe extern "C" fn(*mut ThreadAbi) -> u32,
    pub sync_block_count: unsafe extern "C" fn(*mut ThreadAbi, std::ffi::c_int) -> u32,
}

/// Where a thread of the block stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    Runnable,
    AtBlockBarrier,
    AtWarpCollective,
    Exited,
    Failed,
}

/// A thread's control block: the header's part first, then the scheduler's.
#[repr(C)]
pub(crate) struct Fiber {
    pub abi: ThreadAbi,
    /// Saved stack pointer while switched out.
    pub sp: *mut u8,
    pub state: State,
    /// Index in the block (x fastest).
    pub linear: u32,
    /// The value and operation this thread brought to a warp collective, and its result.
    pub coll_value: u64,
    pub coll_op: u32,
    pub coll_result: u64,
}

std::arch::global_asm!(
    ".text",
    ".globl dcpemu_fiber_switch",
    ".hidden dcpemu_fiber_switch",
    ".type dcpemu_fiber_switch,@function",
    // (save: *mut *mut u8 in rdi, next stack pointer in rsi): pushes the callee-saved
    // registers, parks rsp in *save, resumes the other stack. The FP control words are
    // not switched (loading them costs more than the rest together): every fiber of a
    // block runs under the MXCSR the block runner sets (see `block::DeviceFpMode`).
    "dcpemu_fiber_switch:",
    "push rbp",
    "push rbx",
    "push r12",
    "push r13",
    "push r14",
    "push r15",
    "mov [rdi], rsp",
    "mov rsp, rsi",
    "pop r15",
    "pop r14",
    "pop r13",
    "pop r12",
    "pop rbx",
    "pop rbp",
    "ret",
    ".size dcpemu_fiber_switch, . - dcpemu_fiber_switch",
    ".globl dcpemu_fiber_start",
    ".hidden dcpemu_fiber_start",
    ".type dcpemu_fiber_start,@function",
    // First return target of a new fiber: entry(r12); the entry never returns.
    "dcpemu_fiber_start:",
    "mov rdi, r12",
    "call r13",
    "ud2",
    ".size dcpemu_fiber_start, . - dcpemu_fiber_start",
);

extern "C" {
    fn dcpemu_fiber_switch(save: *mut *mut u8, next: *mut u8);
    fn dcpemu_fiber_start();
}

/// Switches from the current context (its stack pointer saved in `*save`) to `next`.
///
/// # Safety
/// `next` must be a stack pointer saved by this function or made by [`Stacks::prepare`].
pub(crate) unsafe fn switch(save: *mut *mut u8, next: *mut u8) {
    // SAFETY: the caller's contract.
    unsafe { dcpemu_fiber_switch(save, next) }
}

/// The stack slots of one OS thread, reused by every block it runs.
pub(crate) struct Stacks {
    base: *mut u8,
    map_len: usize,
    slots: usize,
}

impl Stacks {
    pub(crate) const fn empty() -> Stacks {
        Stacks {
            base: ptr::null_mut(),
            map_len: 0,
            slots: 0,
        }
    }

    /// Makes sure at least `n` slots exist (keeps them when there are enough).
    pub(crate) fn reserve(&mut self, n: usize) -> Result<(), String> {
        if n <= self.slots {
            return Ok(());
        }
        self.release();
        let map_len = (n + 1) * SLOT;
        // SAFETY: a fresh anonymous private mapping; checked below.
        let p = unsafe {
            libc::mmap(
                ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(format!("cannot map {n} fiber stacks of {SLOT} bytes"));
        }
        self.base = p.cast();
        self.map_len = map_len;
        self.slots = n;
        for i in 0..n {
            let guard = self.slot(i).wrapping_add(PAGE);
            // SAFETY: the guard page lies inside the mapping. An overflowing stack faults
            // there instead of overwriting the control block.
            if unsafe { libc::mprotect(guard.cast(), PAGE, libc::PROT_NONE) } != 0 {
                return Err("cannot protect a fiber stack's guard page".into());
            }
        }
        Ok(())
    }

    /// The base (control block) of slot `i`, 64 KiB aligned.
    pub(crate) fn slot(&self, i: usize) -> *mut u8 {
        let aligned = (self.base as usize).next_multiple_of(SLOT);
        (aligned + i * SLOT) as *mut u8
    }

    /// Whether `addr` lies in the mapping of the slots.
    pub(crate) fn contains(&self, addr: usize) -> bool {
        let base = self.base as usize;
        !self.base.is_null() && addr >= base && addr < base + self.map_len
    }

    /// Whether `addr` lies in slot `i`'s guard page.
    pub(crate) fn is_guard(&self, i: usize, addr: usize) -> bool {
        let guard = self.slot(i) as usize + PAGE;
        addr >= guard && addr < guard + PAGE
    }

    /// The control block of slot `i` (at the slot's colour offset, as `dcpemu_self()`
    /// computes it).
    pub(crate) fn fiber(&self, i: usize) -> *mut Fiber {
        let base = self.slot(i);
        base.wrapping_add(color(base as usize)).cast()
    }

    /// A fresh stack in slot `i` whose first switch calls `entry(fiber)`.
    ///
    /// # Safety
    /// `i` < the reserved count; nothing may be running on that stack.
    pub(crate) unsafe fn prepare(
        &self,
        i: usize,
        entry: unsafe extern "C" fn(*mut Fiber) -> !,
    ) -> *mut u8 {
        let base = self.slot(i) as usize;
        let top = base + SLOT - 16 - color(base);
        debug_assert!(top >= self.slot(i) as usize + STACK_START);
        // The frame `dcpemu_fiber_switch` pops: r15..rbp, then `ret` into
        // dcpemu_fiber_start with rsp 16-byte aligned for its call.
        let sp = (top - 56) as *mut u64;
        let words: [u64; 7] = [
            0,
            0,
            entry as usize as u64,         // r13
            self.fiber(i) as usize as u64, // r12
            0,
            0,
            dcpemu_fiber_start as unsafe extern "C" fn() as usize as u64,
        ];
        for (k, w) in words.iter().enumerate() {
            // SAFETY: inside slot i's stack, which nothing uses.
            unsafe { sp.add(k).write(*w) };
        }
        sp.cast()
    }

    fn release(&mut self) {
        if !self.base.is_null() {
            // SAFETY: the mapping made by `reserve`; no fiber runs on it.
            unsafe { libc::munmap(self.base.cast(), self.map_len) };
        }
        // Field by field: assigning a whole `Stacks` would drop (and release) again.
        self.base = ptr::null_mut();
        self.map_len = 0;
        self.slots = 0;
    }
}

impl Drop for Stacks {
    fn drop(&mut self) {
        self.release();
    }
}
