//! The memory calls: allocation (synchronous, stream-ordered, pinned host), copies and
//! memsets. Every device range is checked when the call is made (an error returned at
//! once) and again when its stream runs it (an error that breaks the context, as a GPU's
//! illegal address does).

use std::ffi::{c_uint, c_void};
use std::sync::Arc;

use super::context::{ctx_device, current_device, tri};
use super::memory::{self, resolve, Fault};
use super::stream::{self, default_stream, lookup, run_and_wait, Stream};
use super::{codes, refuse, write_out, CUdeviceptr, CUresult, Handle};

fn check(addr: CUdeviceptr, len: usize, op: &str) -> Result<(), CUresult> {
    resolve(addr, len, op)
        .map(|_| ())
        .map_err(|f| refuse(f.code, op, f.msg))
}

fn alloc_now(out: *mut CUdeviceptr, size: usize, device: usize, op: &str) -> CUresult {
    match memory::allocate(device, size, op == "cuMemAllocAsync", op) {
        // SAFETY: the caller's out-pointer (checked for null).
        Ok(p) => unsafe { write_out(out, p, op) },
        Err(f) => refuse(f.code, op, f.msg),
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(out: *mut CUdeviceptr, size: usize) -> CUresult {
    let d = tri!(current_device("cuMemAlloc"));
    alloc_now(out, size, d, "cuMemAlloc")
}

/// As `cudaFree`, waits for the device's queued work first (a free never races a kernel).
#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(addr: CUdeviceptr) -> CUresult {
    let d = tri!(current_device("cuMemFree"));
    let code = stream::synchronize_device(d, "cuMemFree");
    if code == codes::STREAM_CAPTURE_UNSUPPORTED {
        return code;
    }
    match memory::free(addr, "cuMemFree") {
        Ok(()) => codes::SUCCESS,
        Err(f) => refuse(f.code, "cuMemFree", f.msg),
    }
}

/// Stream-ordered allocation: the range is valid from the call on (a GPU makes it valid
/// from the stream's point on; using it earlier is not detected).
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(
    out: *mut CUdeviceptr,
    size: usize,
    h: Handle,
) -> CUresult {
    let s = tri!(lookup(h, "cuMemAllocAsync"));
    if s.capture().is_some() {
        return refuse(
            codes::NOT_SUPPORTED,
            "cuMemAllocAsync",
            "allocation nodes in a captured graph are not emulated",
        );
    }
    alloc_now(out, size, s.device, "cuMemAllocAsync")
}

/// Stream-ordered free: the range is freed when the stream reaches it, so a later item
/// on another stream that is not ordered after it fails as a use after free.
#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync(addr: CUdeviceptr, h: Handle) -> CUresult {
    let op = "cuMemFreeAsync";
    let s = tri!(lookup(h, op));
    if s.capture().is_some() {
        return refuse(
            codes::NOT_SUPPORTED,
            op,
            "free nodes in a captured graph are not emulated",
        );
    }
    if addr == 0 {
        return codes::SUCCESS;
    }
    tri!(check(addr, 0, op));
    s.submit(op, Arc::new(move || memory::free(addr, "cuMemFreeAsync")));
    codes::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostAlloc(
    out: *mut *mut c_void,
    size: usize,
    _flags: c_uint,
) -> CUresult {
    if size == 0 {
        return refuse(
            codes::INVALID_VALUE,
            "cuMemHostAlloc",
            "zero bytes requested",
        );
    }
    let p = memory::host_alloc(size);
    if p.is_null() {
        return refuse(
            codes::OUT_OF_MEMORY,
            "cuMemHostAlloc",
            format!("{size} bytes"),
        );
    }
    write_out(out, p.cast(), "cuMemHostAlloc")
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocHost_v2(out: *mut *mut c_void, size: usize) -> CUresult {
    cuMemHostAlloc(out, size, 0)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    if memory::host_free(p.cast()) {
        codes::SUCCESS
    } else {
        refuse(
            codes::INVALID_VALUE,
            "cuMemFreeHost",
            format!("{p:?} is not a pinned allocation"),
        )
    }
}

/// A host address carried into a stream item.
#[derive(Clone, Copy)]
struct HostPtr(usize);

fn htod_op(
    dst: CUdeviceptr,
    src: *const u8,
    n: usize,
    what: &'static str,
    snapshot: bool,
) -> stream::Op {
    if snapshot {
        // Pageable source: CUDA copies it before the call returns.
        // SAFETY: the caller's `n` readable bytes.
        let data: Vec<u8> = unsafe { std::slice::from_raw_parts(src, n) }.to_vec();
        Arc::new(move || {
            let (d, _) = resolve(dst, n, what)?;
            // SAFETY: `d` is `n` bytes of a live allocation.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), d, n) };
            Ok(())
        })
    } else {
        let src = HostPtr(src as usize);
        Arc::new(move || {
            let (d, _) = resolve(dst, n, what)?;
            // SAFETY: a pinned source the caller keeps alive until the stream passes.
            unsafe { std::ptr::copy(src.0 as *const u8, d, n) };
            Ok(())
        })
    }
}

fn dtoh_op(dst: *mut u8, src: CUdeviceptr, n: usize, what: &'static str) -> stream::Op {
    let dst = HostPtr(dst as usize);
    Arc::new(move || {
        let (s, _) = resolve(src, n, what)?;
        // SAFETY: a destination the caller keeps alive until the stream passes it.
        unsafe { std::ptr::copy(s, dst.0 as *mut u8, n) };
        Ok(())
    })
}

fn dtod_op(dst: CUdeviceptr, src: CUdeviceptr, n: usize, what: &'static str) -> stream::Op {
    Arc::new(move || {
        let (s, _) = resolve(src, n, what)?;
        let (d, _) = resolve(dst, n, what)?;
        // SAFETY: both ranges checked; they may overlap.
        unsafe { std::ptr::copy(s, d, n) };
        Ok(())
    })
}

/// Queues `op` on `s`, or runs it synchronously (`sync`); a zero-byte call does nothing.
fn issue(s: &Stream, what: &'static str, n: usize, sync: bool, op: stream::Op) -> CUresult {
    if n == 0 {
        return codes::SUCCESS;
    }
    if sync {
        return run_and_wait(s, what, op);
    }
    s.submit(what, op);
    codes::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
) -> CUresult {
    let what = "cuMemcpyHtoD";
    let d = tri!(current_device(what));
    tri!(check(dst, n, what));
    issue(
        &default_stream(d),
        what,
        n,
        true,
        htod_op(dst, src.cast(), n, what, false),
    )
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
    h: Handle,
) -> CUresult {
    let what = "cuMemcpyHtoDAsync";
    let s = tri!(lookup(h, what));
    tri!(check(dst, n, what));
    let pageable = !memory::is_pinned(src.cast(), n) && s.capture().is_none();
    issue(
        &s,
        what,
        n,
        false,
        htod_op(dst, src.cast(), n, what, pageable),
    )
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize) -> CUresult {
    let what = "cuMemcpyDtoH";
    let d = tri!(current_device(what));
    tri!(check(src, n, what));
    issue(
        &default_stream(d),
        what,
        n,
        true,
        dtoh_op(dst.cast(), src, n, what),
    )
}

/// To pageable memory the copy is synchronous, as in CUDA; to pinned memory it is not.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(
    dst: *mut c_void,
    src: CUdeviceptr,
    n: usize,
    h: Handle,
) -> CUresult {
    let what = "cuMemcpyDtoHAsync";
    let s = tri!(lookup(h, what));
    tri!(check(src, n, what));
    let sync = !memory::is_pinned(dst.cast(), n) && s.capture().is_none();
    issue(&s, what, n, sync, dtoh_op(dst.cast(), src, n, what))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult {
    let what = "cuMemcpyDtoD";
    let d = tri!(current_device(what));
    tri!(check(src, n, what));
    tri!(check(dst, n, what));
    issue(
        &default_stream(d),
        what,
        n,
        true,
        dtod_op(dst, src, n, what),
    )
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoDAsync_v2(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    n: usize,
    h: Handle,
) -> CUresult {
    let what = "cuMemcpyDtoDAsync";
    let s = tri!(lookup(h, what));
    tri!(check(src, n, what));
    tri!(check(dst, n, what));
    issue(&s, what, n, false, dtod_op(dst, src, n, what))
}

/// A copy between devices; each address must lie on its context's device.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyPeerAsync(
    dst: CUdeviceptr,
    dst_ctx: Handle,
    src: CUdeviceptr,
    src_ctx: Handle,
    n: usize,
    h: Handle,
) -> CUresult {
    let what = "cuMemcpyPeerAsync";
    let s = tri!(lookup(h, what));
    for (addr, ctx, role) in [(dst, dst_ctx, "destination"), (src, src_ctx, "source")] {
        let Some(dev) = ctx_device(ctx) else {
            return refuse(
                codes::INVALID_CONTEXT,
                what,
                format!("{role} context {ctx:?}"),
            );
        };
        match resolve(addr, n, what) {
            Ok((_, on)) if on == dev => {}
            Ok((_, on)) => {
                return refuse(
                    codes::INVALID_VALUE,
                    what,
                    format!(
                        "the {role} {addr:#x} is on device {on}, its context is device {dev}'s"
                    ),
                )
            }
            Err(f) => return refuse(f.code, what, f.msg),
        }
    }
    issue(&s, what, n, false, dtod_op(dst, src, n, what))
}

fn memset_op(dst: CUdeviceptr, bytes: usize, pattern: Vec<u8>, what: &'static str) -> stream::Op {
    Arc::new(move || {
        let (d, _) = resolve(dst, bytes, what)?;
        if pattern.iter().all(|b| *b == 0) {
            // SAFETY: `bytes` bytes of a live allocation.
            unsafe { memory::zero(d, bytes) };
        } else if pattern.iter().all(|b| *b == pattern[0]) {
            // SAFETY: `bytes` bytes of a live allocation.
            unsafe { std::ptr::write_bytes(d, pattern[0], bytes) };
        } else {
            // SAFETY: as above.
            let out = unsafe { std::slice::from_raw_parts_mut(d, bytes) };
            for chunk in out.chunks_mut(pattern.len()) {
                chunk.copy_from_slice(&pattern[..chunk.len()]);
            }
        }
        Ok::<(), Fault>(())
    })
}

unsafe fn memset(
    dst: CUdeviceptr,
    pattern: Vec<u8>,
    count: usize,
    h: Option<Handle>,
    what: &'static str,
) -> CUresult {
    let bytes = count * pattern.len();
    if pattern.len() > 1 && !dst.is_multiple_of(pattern.len() as u64) {
        return refuse(
            codes::INVALID_VALUE,
            what,
            format!("{dst:#x} is not {}-byte aligned", pattern.len()),
        );
    }
    let s = match h {
        Some(h) => tri!(lookup(h, what)),
        None => default_stream(tri!(current_device(what))),
    };
    tri!(check(dst, bytes, what));
    issue(
        &s,
        what,
        bytes,
        h.is_none(),
        memset_op(dst, bytes, pattern, what),
    )
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8_v2(dst: CUdeviceptr, value: u8, n: usize) -> CUresult {
    memset(dst, vec![value], n, None, "cuMemsetD8")
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8Async(
    dst: CUdeviceptr,
    value: u8,
    n: usize,
    h: Handle,
) -> CUresult {
    memset(dst, vec![value], n, Some(h), "cuMemsetD8Async")
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD16_v2(dst: CUdeviceptr, value: u16, n: usize) -> CUresult {
    memset(dst, value.to_ne_bytes().to_vec(), n, None, "cuMemsetD16")
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD16Async(
    dst: CUdeviceptr,
    value: u16,
    n: usize,
    h: Handle,
) -> CUresult {
    memset(
        dst,
        value.to_ne_bytes().to_vec(),
        n,
        Some(h),
        "cuMemsetD16Async",
    )
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD32_v2(dst: CUdeviceptr, value: u32, n: usize) -> CUresult {
    memset(dst, value.to_ne_bytes().to_vec(), n, None, "cuMemsetD32")
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD32Async(
    dst: CUdeviceptr,
    value: u32,
    n: usize,
    h: Handle,
) -> CUresult {
    memset(
        dst,
        value.to_ne_bytes().to_vec(),
        n,
        Some(h),
        "cuMemsetD32Async",
    )
}
