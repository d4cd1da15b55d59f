//! What every fuzz target shares: an allocator that enforces the memory bound, and the
//! rule that only a panic escaping the target is a crash.
//!
//! Each input may allocate at most [`BASE_BYTES`] plus [`BYTES_PER_INPUT_BYTE`] times its
//! own length in one allocation: whatever a file or request claims, the reader may only
//! allocate in proportion to the bytes it really has. A larger request aborts the process,
//! which libFuzzer reports as a crash and saves the input. (libFuzzer's own
//! `-malloc_limit_mb` needs a sanitizer's malloc hooks, which a build without
//! AddressSanitizer lacks.) The total is bounded by `-rss_limit_mb` in `scripts/fuzz.sh`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Allowance of every input, whatever its size (the targets' fixtures, built once, fit).
pub const BASE_BYTES: usize = 32 << 20;
/// Allowance per byte of input.
pub const BYTES_PER_INPUT_BYTE: usize = 256;

static LIMIT: AtomicUsize = AtomicUsize::new(usize::MAX);

struct BoundedAlloc;

impl BoundedAlloc {
    fn check(&self, size: usize) {
        let limit = LIMIT.load(Ordering::Relaxed);
        if size > limit {
            // Lift the bound so that the report itself can allocate.
            LIMIT.store(usize::MAX, Ordering::Relaxed);
            let _ = writeln!(
                std::io::stderr(),
                "==dcpserve-fuzz== allocation of {size} bytes exceeds this input's bound of \
                 {limit} bytes\n{}",
                std::backtrace::Backtrace::force_capture()
            );
            std::process::abort();
        }
    }
}

// SAFETY: forwards to the system allocator unchanged; only refuses (by aborting) sizes
// above the bound.
unsafe impl GlobalAlloc for BoundedAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.check(layout.size());
        System.alloc(layout)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        self.check(layout.size());
        System.alloc_zeroed(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        self.check(new_size);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static ALLOC: BoundedAlloc = BoundedAlloc;

/// Runs `target` on `data` under the allocation bound of `data`'s length. A panic that
/// escapes `target` aborts (a crash libFuzzer records); one the code under test catches
/// and turns into an error itself (the grammar engine's, see `dcpserve_model::grammar`)
/// does not, unlike under libfuzzer-sys's own panic hook, which aborts on every panic.
pub fn run(data: &[u8], target: fn(&[u8])) {
    static DEFAULT_HOOK: std::sync::Once = std::sync::Once::new();
    DEFAULT_HOOK.call_once(|| drop(std::panic::take_hook()));
    let limit = BASE_BYTES.saturating_add(data.len().saturating_mul(BYTES_PER_INPUT_BYTE));
    LIMIT.store(limit, Ordering::Relaxed);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| target(data)));
    LIMIT.store(usize::MAX, Ordering::Relaxed);
    if result.is_err() {
        std::process::abort();
    }
}
