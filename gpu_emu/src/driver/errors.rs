//! CUDA error codes, and `cuGetErrorName` / `cuGetErrorString`.

use std::ffi::c_char;

use super::{write_out, CUresult};

/// The `CUresult` values the emulator returns (numbers from the CUDA 13 headers).
pub mod codes {
    pub const SUCCESS: u32 = 0;
    pub const INVALID_VALUE: u32 = 1;
    pub const OUT_OF_MEMORY: u32 = 2;
    pub const NOT_INITIALIZED: u32 = 3;
    pub const NO_DEVICE: u32 = 100;
    pub const INVALID_DEVICE: u32 = 101;
    pub const INVALID_IMAGE: u32 = 200;
    pub const INVALID_CONTEXT: u32 = 201;
    pub const INVALID_HANDLE: u32 = 400;
    pub const NOT_FOUND: u32 = 500;
    pub const NOT_READY: u32 = 600;
    pub const ILLEGAL_ADDRESS: u32 = 700;
    pub const LAUNCH_OUT_OF_RESOURCES: u32 = 701;
    pub const ASSERT: u32 = 710;
    pub const LAUNCH_FAILED: u32 = 719;
    pub const NOT_PERMITTED: u32 = 800;
    pub const NOT_SUPPORTED: u32 = 801;
    pub const STREAM_CAPTURE_UNSUPPORTED: u32 = 900;
    pub const STREAM_CAPTURE_INVALIDATED: u32 = 901;
    pub const STREAM_CAPTURE_UNMATCHED: u32 = 903;
    pub const STREAM_CAPTURE_UNJOINED: u32 = 904;
    pub const STREAM_CAPTURE_ISOLATION: u32 = 905;
    pub const CAPTURED_EVENT: u32 = 907;
    pub const UNKNOWN: u32 = 999;
}

const TABLE: &[(u32, &str, &str)] = &[
    (codes::SUCCESS, "CUDA_SUCCESS\0", "no error\0"),
    (
        codes::INVALID_VALUE,
        "CUDA_ERROR_INVALID_VALUE\0",
        "invalid argument\0",
    ),
    (
        codes::OUT_OF_MEMORY,
        "CUDA_ERROR_OUT_OF_MEMORY\0",
        "out of memory\0",
    ),
    (
        codes::NOT_INITIALIZED,
        "CUDA_ERROR_NOT_INITIALIZED\0",
        "initialization error\0",
    ),
    (
        codes::NO_DEVICE,
        "CUDA_ERROR_NO_DEVICE\0",
        "no CUDA-capable device is detected\0",
    ),
    (
        codes::INVALID_DEVICE,
        "CUDA_ERROR_INVALID_DEVICE\0",
        "invalid device ordinal\0",
    ),
    (
        codes::INVALID_IMAGE,
        "CUDA_ERROR_INVALID_IMAGE\0",
        "device kernel image is invalid\0",
    ),
    (
        codes::INVALID_CONTEXT,
        "CUDA_ERROR_INVALID_CONTEXT\0",
        "invalid device context\0",
    ),
    (
        codes::INVALID_HANDLE,
        "CUDA_ERROR_INVALID_HANDLE\0",
        "invalid resource handle\0",
    ),
    (
        codes::NOT_FOUND,
        "CUDA_ERROR_NOT_FOUND\0",
        "named symbol not found\0",
    ),
    (
        codes::NOT_READY,
        "CUDA_ERROR_NOT_READY\0",
        "device not ready\0",
    ),
    (
        codes::ILLEGAL_ADDRESS,
        "CUDA_ERROR_ILLEGAL_ADDRESS\0",
        "an illegal memory access was encountered\0",
    ),
    (
        codes::LAUNCH_OUT_OF_RESOURCES,
        "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES\0",
        "too many resources requested for launch\0",
    ),
    (
        codes::ASSERT,
        "CUDA_ERROR_ASSERT\0",
        "device-side assert triggered\0",
    ),
    (
        codes::LAUNCH_FAILED,
        "CUDA_ERROR_LAUNCH_FAILED\0",
        "unspecified launch failure\0",
    ),
    (
        codes::NOT_PERMITTED,
        "CUDA_ERROR_NOT_PERMITTED\0",
        "operation not permitted\0",
    ),
    (
        codes::NOT_SUPPORTED,
        "CUDA_ERROR_NOT_SUPPORTED\0",
        "operation not supported\0",
    ),
    (
        codes::STREAM_CAPTURE_UNSUPPORTED,
        "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED\0",
        "operation not permitted when stream is capturing\0",
    ),
    (
        codes::STREAM_CAPTURE_INVALIDATED,
        "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED\0",
        "operation failed due to a previous error during capture\0",
    ),
    (
        codes::STREAM_CAPTURE_UNMATCHED,
        "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED\0",
        "capture was not initiated in this stream\0",
    ),
    (
        codes::STREAM_CAPTURE_UNJOINED,
        "CUDA_ERROR_STREAM_CAPTURE_UNJOINED\0",
        "the capture sequence contains a fork that was not joined to the primary stream\0",
    ),
    (
        codes::STREAM_CAPTURE_ISOLATION,
        "CUDA_ERROR_STREAM_CAPTURE_ISOLATION\0",
        "operation would make the legacy stream depend on a capturing blocking stream\0",
    ),
    (
        codes::CAPTURED_EVENT,
        "CUDA_ERROR_CAPTURED_EVENT\0",
        "operation not permitted on an event last recorded in a capturing stream\0",
    ),
    (codes::UNKNOWN, "CUDA_ERROR_UNKNOWN\0", "unknown error\0"),
];

fn entry(code: CUresult) -> Option<&'static (u32, &'static str, &'static str)> {
    TABLE.iter().find(|(c, _, _)| *c == code)
}

/// The symbolic name of `code`, for messages.
pub fn name(code: CUresult) -> &'static str {
    entry(code).map_or("CUDA_ERROR_?", |(_, n, _)| n.trim_end_matches('\0'))
}

/// # Safety
/// `out` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(error: CUresult, out: *mut *const c_char) -> CUresult {
    match entry(error) {
        Some((_, n, _)) => write_out(out, n.as_ptr().cast(), "cuGetErrorName"),
        None => codes::INVALID_VALUE,
    }
}

/// # Safety
/// `out` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(error: CUresult, out: *mut *const c_char) -> CUresult {
    match entry(error) {
        Some((_, _, s)) => write_out(out, s.as_ptr().cast(), "cuGetErrorString"),
        None => codes::INVALID_VALUE,
    }
}
