//! The driver through its C entry points: memory checks, stream ordering, events, graph
//! capture and replay.

use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::Arc;
use std::time::Duration;

use super::context::*;
use super::errors::codes;
use super::events::*;
use super::graph::*;
use super::memory_api::*;
use super::stream::lookup;
use super::stream_api::*;
use super::{CUdeviceptr, Handle};

/// Five devices for every test of the crate, the settings being read once per process
/// (device 4 is broken on purpose by a fault test).
pub(crate) fn init() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| std::env::set_var("DCPEMU_DEVICES", "5"));
    unsafe {
        assert_eq!(cuInit(0), codes::SUCCESS);
        let mut ctx = null_mut();
        assert_eq!(cuDevicePrimaryCtxRetain(&mut ctx, 0), codes::SUCCESS);
        assert_eq!(cuCtxSetCurrent(ctx), codes::SUCCESS);
    }
}

pub(crate) fn alloc(bytes: usize) -> CUdeviceptr {
    let mut p = 0;
    assert_eq!(unsafe { cuMemAlloc_v2(&mut p, bytes) }, codes::SUCCESS);
    p
}

pub(crate) fn upload<T: Copy>(dst: CUdeviceptr, data: &[T]) {
    let bytes = std::mem::size_of_val(data);
    assert_eq!(
        unsafe { cuMemcpyHtoD_v2(dst, data.as_ptr().cast(), bytes) },
        codes::SUCCESS
    );
}

pub(crate) fn download<T: Copy + Default>(src: CUdeviceptr, n: usize) -> Vec<T> {
    let mut out = vec![T::default(); n];
    let bytes = n * std::mem::size_of::<T>();
    assert_eq!(
        unsafe { cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), src, bytes) },
        codes::SUCCESS
    );
    out
}

pub(crate) fn new_stream() -> Handle {
    let mut s = null_mut();
    assert_eq!(unsafe { cuStreamCreate(&mut s, 1) }, codes::SUCCESS);
    s
}

#[test]
fn devices_and_attributes() {
    init();
    unsafe {
        let mut n = 0;
        assert_eq!(cuDeviceGetCount(&mut n), codes::SUCCESS);
        assert_eq!(n, 5);
        let mut v = 0;
        assert_eq!(cuDeviceGetAttribute(&mut v, 75, 0), codes::SUCCESS);
        assert_eq!(v, 9);
        assert_eq!(cuDeviceGetAttribute(&mut v, 75, 5), codes::INVALID_DEVICE);
        let mut name = [0i8; 64];
        assert_eq!(cuDeviceGetName(name.as_mut_ptr(), 64, 1), codes::SUCCESS);
    }
}

#[test]
fn copies_round_trip_and_memset() {
    init();
    let p = alloc(64);
    upload(p, &[1u32, 2, 3, 4]);
    assert_eq!(download::<u32>(p, 4), vec![1, 2, 3, 4]);
    unsafe {
        assert_eq!(cuMemsetD32_v2(p + 4, 7, 2), codes::SUCCESS);
        assert_eq!(cuMemsetD8_v2(p + 12, 0, 4), codes::SUCCESS);
    }
    assert_eq!(download::<u32>(p, 4), vec![1, 7, 7, 0]);
    let q = alloc(16);
    unsafe { assert_eq!(cuMemcpyDtoD_v2(q, p, 16), codes::SUCCESS) };
    assert_eq!(download::<u32>(q, 4), vec![1, 7, 7, 0]);
}

#[test]
fn out_of_bounds_and_freed_memory_are_refused() {
    init();
    let p = alloc(100);
    let buf = [0u8; 200];
    unsafe {
        // One byte past the end.
        assert_eq!(
            cuMemcpyHtoD_v2(p, buf.as_ptr().cast(), 101),
            codes::ILLEGAL_ADDRESS
        );
        assert_eq!(
            cuMemcpyHtoD_v2(p + 1, buf.as_ptr().cast(), 100),
            codes::ILLEGAL_ADDRESS
        );
        assert_eq!(cuMemsetD8_v2(p + 100, 0, 1), codes::ILLEGAL_ADDRESS);
        assert_eq!(cuMemcpyHtoD_v2(p, buf.as_ptr().cast(), 100), codes::SUCCESS);
        // Not a device address at all.
        assert_eq!(cuMemsetD8_v2(0x1234, 0, 1), codes::ILLEGAL_ADDRESS);
        assert_eq!(cuMemFree_v2(p + 4), codes::INVALID_VALUE);
        assert_eq!(cuMemFree_v2(p), codes::SUCCESS);
        assert_eq!(cuMemFree_v2(p), codes::INVALID_VALUE);
        let mut out = [0u8; 4];
        assert_eq!(
            cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), p, 4),
            codes::ILLEGAL_ADDRESS
        );
    }
    let e = super::memory::resolve(p, 4, "test").unwrap_err();
    assert!(e.msg.contains("freed by cuMemFree"), "{}", e.msg);
}

#[test]
fn memory_limit_is_enforced() {
    init();
    let mut p = 0;
    let total = super::config::get().memory_bytes;
    assert_eq!(
        unsafe { cuMemAlloc_v2(&mut p, total + 1) },
        codes::OUT_OF_MEMORY
    );
}

/// A stream item that sleeps, so that unordered work would overtake it.
fn slow_item(stream: Handle, ms: u64) {
    let s = lookup(stream, "test").unwrap();
    s.submit(
        "sleep",
        Arc::new(move || {
            std::thread::sleep(Duration::from_millis(ms));
            Ok(())
        }),
    );
}

#[test]
fn events_order_two_streams() {
    init();
    let (a, b) = (new_stream(), new_stream());
    let p = alloc(4);
    let q = alloc(4);
    unsafe {
        let mut ev = null_mut();
        assert_eq!(cuEventCreate(&mut ev, 0), codes::SUCCESS);
        slow_item(a, 50);
        assert_eq!(cuMemsetD32Async(p, 42, 1, a), codes::SUCCESS);
        assert_eq!(cuEventRecord(ev, a), codes::SUCCESS);
        assert_eq!(cuEventQuery(ev), codes::NOT_READY);
        assert_eq!(cuStreamWaitEvent(b, ev, 0), codes::SUCCESS);
        assert_eq!(cuMemcpyDtoDAsync_v2(q, p, 4, b), codes::SUCCESS);
        assert_eq!(cuStreamSynchronize(b), codes::SUCCESS);
        assert_eq!(cuEventQuery(ev), codes::SUCCESS);
        assert_eq!(download::<u32>(q, 1), vec![42]);
        let mut ms = 0f32;
        let mut start = null_mut();
        assert_eq!(cuEventCreate(&mut start, 0), codes::SUCCESS);
        assert_eq!(cuEventRecord(start, a), codes::SUCCESS);
        slow_item(a, 20);
        assert_eq!(cuEventRecord(ev, a), codes::SUCCESS);
        assert_eq!(cuEventSynchronize(ev), codes::SUCCESS);
        assert_eq!(cuEventElapsedTime_v2(&mut ms, start, ev), codes::SUCCESS);
        assert!(ms >= 19.0, "{ms}");
        assert_eq!(cuStreamDestroy_v2(a), codes::SUCCESS);
        assert_eq!(cuStreamSynchronize(a), codes::INVALID_HANDLE);
    }
}

#[test]
fn stream_runs_asynchronously_in_order() {
    init();
    let s = new_stream();
    let p = alloc(4);
    unsafe {
        slow_item(s, 50);
        for v in 1..=5u32 {
            assert_eq!(cuMemsetD32Async(p, v, 1, s), codes::SUCCESS);
        }
        assert_eq!(cuStreamQuery(s), codes::NOT_READY);
        assert_eq!(cuStreamSynchronize(s), codes::SUCCESS);
        assert_eq!(cuStreamQuery(s), codes::SUCCESS);
    }
    assert_eq!(download::<u32>(p, 1), vec![5]);
}

#[test]
fn free_async_is_stream_ordered() {
    init();
    let s = new_stream();
    let mut p = 0;
    unsafe {
        assert_eq!(cuMemAllocAsync(&mut p, 16, s), codes::SUCCESS);
        slow_item(s, 30);
        assert_eq!(cuMemsetD8Async(p, 1, 16, s), codes::SUCCESS);
        assert_eq!(cuMemFreeAsync(p, s), codes::SUCCESS);
        // Still live until the stream reaches the free.
        assert!(super::memory::resolve(p, 16, "test").is_ok());
        assert_eq!(cuStreamSynchronize(s), codes::SUCCESS);
    }
    assert!(super::memory::resolve(p, 16, "test").is_err());
}

#[test]
fn capture_records_and_replays() {
    init();
    let s = new_stream();
    let side = new_stream();
    let p = alloc(8);
    let q = alloc(8);
    upload(p, &[1u32, 2]);
    unsafe {
        let (mut fork, mut join) = (null_mut(), null_mut());
        assert_eq!(cuEventCreate(&mut fork, 2), codes::SUCCESS);
        assert_eq!(cuEventCreate(&mut join, 2), codes::SUCCESS);
        assert_eq!(cuStreamBeginCapture_v2(s, 0), codes::SUCCESS);
        let mut status = 9;
        assert_eq!(cuStreamIsCapturing(s, &mut status), codes::SUCCESS);
        assert_eq!(status, 1);
        // Fork to `side`, copy there, join back.
        assert_eq!(cuEventRecord(fork, s), codes::SUCCESS);
        assert_eq!(cuStreamWaitEvent(side, fork, 0), codes::SUCCESS);
        assert_eq!(cuMemcpyDtoDAsync_v2(q, p, 8, side), codes::SUCCESS);
        assert_eq!(cuEventRecord(join, side), codes::SUCCESS);
        assert_eq!(cuStreamWaitEvent(s, join, 0), codes::SUCCESS);
        assert_eq!(cuMemsetD32Async(p, 9, 1, s), codes::SUCCESS);
        assert_eq!(cuEventSynchronize(join), codes::CAPTURED_EVENT);
        let mut graph = null_mut();
        assert_eq!(cuStreamEndCapture(s, &mut graph), codes::SUCCESS);
        assert_eq!(cuStreamIsCapturing(side, &mut status), codes::SUCCESS);
        assert_eq!(status, 0);
        // Nothing ran during the capture.
        assert_eq!(download::<u32>(p, 2), vec![1, 2]);
        assert_eq!(download::<u32>(q, 2), vec![0, 0]);
        let mut exec = null_mut();
        assert_eq!(
            cuGraphInstantiateWithFlags(&mut exec, graph, 0),
            codes::SUCCESS
        );
        assert_eq!(cuGraphLaunch(exec, s), codes::SUCCESS);
        assert_eq!(cuStreamSynchronize(s), codes::SUCCESS);
        assert_eq!(download::<u32>(q, 2), vec![1, 2]);
        assert_eq!(download::<u32>(p, 2), vec![9, 2]);
        // A replay reads the buffers as they are now.
        upload(p, &[5u32, 6]);
        assert_eq!(cuGraphLaunch(exec, s), codes::SUCCESS);
        assert_eq!(cuStreamSynchronize(s), codes::SUCCESS);
        assert_eq!(download::<u32>(q, 2), vec![5, 6]);
        assert_eq!(cuGraphExecDestroy(exec), codes::SUCCESS);
        assert_eq!(cuGraphDestroy(graph), codes::SUCCESS);
        assert_eq!(cuGraphLaunch(exec, s), codes::INVALID_HANDLE);
    }
}

#[test]
fn a_fork_never_joined_fails_the_capture() {
    init();
    let (s, side) = (new_stream(), new_stream());
    let p = alloc(8);
    unsafe {
        let mut fork = null_mut();
        assert_eq!(cuEventCreate(&mut fork, 2), codes::SUCCESS);
        assert_eq!(cuStreamBeginCapture_v2(s, 0), codes::SUCCESS);
        assert_eq!(cuEventRecord(fork, s), codes::SUCCESS);
        assert_eq!(cuStreamWaitEvent(side, fork, 0), codes::SUCCESS);
        assert_eq!(cuMemsetD8Async(p, 1, 8, side), codes::SUCCESS);
        let mut graph = null_mut();
        assert_eq!(
            cuStreamEndCapture(s, &mut graph),
            codes::STREAM_CAPTURE_UNJOINED
        );
        assert!(graph.is_null());
        let mut status = 9;
        assert_eq!(cuStreamIsCapturing(side, &mut status), codes::SUCCESS);
        assert_eq!(status, 0);
    }
}

#[test]
fn synchronizing_a_capturing_stream_invalidates_the_capture() {
    init();
    let s = new_stream();
    unsafe {
        assert_eq!(cuStreamBeginCapture_v2(s, 0), codes::SUCCESS);
        assert_eq!(cuStreamSynchronize(s), codes::STREAM_CAPTURE_UNSUPPORTED);
        let mut graph = null_mut();
        assert_eq!(
            cuStreamEndCapture(s, &mut graph),
            codes::STREAM_CAPTURE_INVALIDATED
        );
        assert!(graph.is_null());
        // Capturing the legacy stream is refused.
        assert_eq!(
            cuStreamBeginCapture_v2(null_mut(), 0),
            codes::STREAM_CAPTURE_UNSUPPORTED
        );
    }
}

#[test]
fn contexts_are_per_thread() {
    init();
    std::thread::spawn(|| unsafe {
        let mut ctx: Handle = null_mut();
        assert_eq!(cuCtxGetCurrent(&mut ctx), codes::SUCCESS);
        assert!(ctx.is_null());
        let mut p = 0;
        assert_eq!(cuMemAlloc_v2(&mut p, 8), codes::INVALID_CONTEXT);
        let mut c = null_mut();
        assert_eq!(cuDevicePrimaryCtxRetain(&mut c, 2), codes::SUCCESS);
        assert_eq!(cuCtxSetCurrent(c), codes::SUCCESS);
        assert_eq!(cuMemAlloc_v2(&mut p, 8), codes::SUCCESS);
        assert!(super::memory::resolve(p, 8, "test").unwrap().1 == 2);
    })
    .join()
    .unwrap();
}

#[test]
fn error_strings() {
    let mut s: *const std::ffi::c_char = std::ptr::null();
    unsafe {
        assert_eq!(super::errors::cuGetErrorName(700, &mut s), codes::SUCCESS);
        assert_eq!(
            std::ffi::CStr::from_ptr(s).to_str().unwrap(),
            "CUDA_ERROR_ILLEGAL_ADDRESS"
        );
        assert_eq!(
            super::errors::cuGetErrorString(12345, &mut s),
            codes::INVALID_VALUE
        );
    }
    let _: *mut c_void = null_mut();
}

#[test]
fn zeroing_whole_pages_and_partial_ends() {
    init();
    let n = 5 * 4096 + 300;
    let p = alloc(n);
    upload(p, &vec![7u8; n]);
    // From an unaligned offset to an unaligned end: pages released, ends written.
    unsafe { assert_eq!(cuMemsetD8_v2(p + 100, 0, n - 200), codes::SUCCESS) };
    let got: Vec<u8> = download(p, n);
    assert!(got[..100].iter().all(|b| *b == 7));
    assert!(got[100..n - 100].iter().all(|b| *b == 0));
    assert!(got[n - 100..].iter().all(|b| *b == 7));
}
