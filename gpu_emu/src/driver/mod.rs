//! The emulated CUDA driver API: devices, primary contexts, checked device memory, streams on
//! worker threads, events, graph capture and replay, modules and kernel launches.
//!
//! Every exported function has the C name and ABI of the CUDA 13 driver symbol cudarc 0.19
//! resolves (`dlsym` by name, on first use). Handles (contexts, streams, events, modules,
//! functions, graphs) are small integers in a registry, so a destroyed or foreign handle is
//! an error, not a dangling pointer. Each refused call prints why on stderr (`dcpemu: ...`).

pub mod config;
pub mod context;
pub mod errors;
pub mod events;
pub mod graph;
pub mod launch;
pub mod memory;
pub mod memory_api;
pub mod registry;
pub mod stream;
pub mod stream_api;

#[cfg(test)]
mod launch_tests;
#[cfg(test)]
pub(crate) mod tests;

/// `CUresult`: a `#[repr(u32)]` enum in cudarc's bindings, a `u32` on the C ABI.
pub type CUresult = u32;
/// `CUdeviceptr`: `unsigned long long`.
pub type CUdeviceptr = u64;
/// `CUdevice`: `int`.
pub type CUdevice = i32;
/// Opaque handles (`CUcontext`, `CUstream`, ...): pointers on the C ABI.
pub type Handle = *mut std::ffi::c_void;

pub use errors::codes;

/// Prints why a call is refused and returns its error code.
pub(crate) fn refuse(code: CUresult, op: &str, why: impl std::fmt::Display) -> CUresult {
    eprintln!("dcpemu: {op}: {why} ({})", errors::name(code));
    code
}

/// Writes `value` through an out-pointer the caller passed, refusing a null one.
///
/// # Safety
/// `out` is null or valid for a write of `T`.
pub(crate) unsafe fn write_out<T>(out: *mut T, value: T, op: &str) -> CUresult {
    if out.is_null() {
        return refuse(codes::INVALID_VALUE, op, "null output pointer");
    }
    out.write(value);
    codes::SUCCESS
}
