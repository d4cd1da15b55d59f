//! The stream calls: create, destroy, synchronize, query, and stream capture.

use std::ffi::{c_int, c_uint};
use std::sync::Arc;

use super::context::{current_device, tri};
use super::graph::{Graph, GRAPHS};
use super::stream::{fault_code, invalidate, lookup, synchronize_device, Capture, Stream, STREAMS};
use super::{codes, refuse, write_out, CUresult, Handle};

unsafe fn create(out: *mut Handle, op: &str) -> CUresult {
    let d = tri!(current_device(op));
    if out.is_null() {
        return refuse(codes::INVALID_VALUE, op, "null output pointer");
    }
    let s = Stream::spawn(d);
    *out = STREAMS.insert(s);
    codes::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(out: *mut Handle, _flags: c_uint) -> CUresult {
    create(out, "cuStreamCreate")
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamCreateWithPriority(
    out: *mut Handle,
    _flags: c_uint,
    _priority: c_int,
) -> CUresult {
    create(out, "cuStreamCreateWithPriority")
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetStreamPriorityRange(
    least: *mut c_int,
    greatest: *mut c_int,
) -> CUresult {
    if !least.is_null() {
        *least = 0;
    }
    if !greatest.is_null() {
        *greatest = -5;
    }
    codes::SUCCESS
}

/// As in CUDA, work already queued still runs; the handle is invalid at once.
#[no_mangle]
pub unsafe extern "C" fn cuStreamDestroy_v2(h: Handle) -> CUresult {
    match STREAMS.remove(h) {
        Some(s) => {
            if let Some(c) = s.capture() {
                invalidate(&c, "a capturing stream was destroyed");
            }
            s.retire();
            codes::SUCCESS
        }
        None => refuse(
            codes::INVALID_HANDLE,
            "cuStreamDestroy",
            format!("{h:?} is not a live stream"),
        ),
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize(h: Handle) -> CUresult {
    let s = tri!(lookup(h, "cuStreamSynchronize"));
    if let Some(c) = s.capture() {
        invalidate(&c, "cuStreamSynchronize on a capturing stream");
        return refuse(
            codes::STREAM_CAPTURE_UNSUPPORTED,
            "cuStreamSynchronize",
            "the stream is capturing",
        );
    }
    s.drain();
    fault_code(s.device)
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamQuery(h: Handle) -> CUresult {
    let s = tri!(lookup(h, "cuStreamQuery"));
    if let Some(c) = s.capture() {
        invalidate(&c, "cuStreamQuery on a capturing stream");
        return refuse(
            codes::STREAM_CAPTURE_UNSUPPORTED,
            "cuStreamQuery",
            "the stream is capturing",
        );
    }
    match fault_code(s.device) {
        codes::SUCCESS if s.idle() => codes::SUCCESS,
        codes::SUCCESS => codes::NOT_READY,
        f => f,
    }
}

/// `mode` (global, thread-local, relaxed) only changes which other calls CUDA forbids
/// meanwhile; the emulator refuses the same synchronizing calls in every mode.
#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture_v2(h: Handle, _mode: u32) -> CUresult {
    if (h as usize) <= 2 {
        return refuse(
            codes::STREAM_CAPTURE_UNSUPPORTED,
            "cuStreamBeginCapture",
            "the default (legacy) stream cannot be captured",
        );
    }
    let s = tri!(lookup(h, "cuStreamBeginCapture"));
    if s.capture().is_some() {
        return refuse(
            codes::INVALID_VALUE,
            "cuStreamBeginCapture",
            "the stream is already capturing",
        );
    }
    s.set_capture(Some(Arc::new(Capture::new(h as usize))));
    codes::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamEndCapture(h: Handle, graph: *mut Handle) -> CUresult {
    let s = tri!(lookup(h, "cuStreamEndCapture"));
    let Some(c) = s.capture() else {
        return refuse(
            codes::INVALID_VALUE,
            "cuStreamEndCapture",
            "the stream is not capturing",
        );
    };
    if c.origin != h as usize {
        invalidate(&c, "cuStreamEndCapture on a stream that joined the capture");
        return refuse(
            codes::STREAM_CAPTURE_UNMATCHED,
            "cuStreamEndCapture",
            "the capture was begun on another stream",
        );
    }
    // Every stream that joined the capture leaves it with the origin.
    for other in STREAMS.all() {
        if other.capture().is_some_and(|o| Arc::ptr_eq(&o, &c)) {
            other.set_capture(None);
        }
    }
    s.set_capture(None);
    if let Some(n) = c.unjoined(s.key()) {
        if !graph.is_null() {
            *graph = std::ptr::null_mut();
        }
        return refuse(
            codes::STREAM_CAPTURE_UNJOINED,
            "cuStreamEndCapture",
            format!(
                "a stream forked into the capture ({n} items) was never joined back to the origin"
            ),
        );
    }
    let why = c
        .invalidated
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    if let Some(why) = why {
        if !graph.is_null() {
            *graph = std::ptr::null_mut();
        }
        return refuse(codes::STREAM_CAPTURE_INVALIDATED, "cuStreamEndCapture", why);
    }
    let items = std::mem::take(&mut *c.items.lock().unwrap_or_else(|p| p.into_inner()));
    let g = GRAPHS.insert(Arc::new(Graph { items }));
    write_out(graph, g, "cuStreamEndCapture")
}

/// `CUstreamCaptureStatus`: 0 none, 1 active, 2 invalidated.
#[no_mangle]
pub unsafe extern "C" fn cuStreamIsCapturing(h: Handle, status: *mut u32) -> CUresult {
    let s = tri!(lookup(h, "cuStreamIsCapturing"));
    let v = match s.capture() {
        None => 0,
        Some(c)
            if c.invalidated
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_some() =>
        {
            2
        }
        Some(_) => 1,
    };
    write_out(status, v, "cuStreamIsCapturing")
}

/// Waits for every stream of the current context's device.
#[no_mangle]
pub unsafe extern "C" fn cuCtxSynchronize() -> CUresult {
    let d = tri!(current_device("cuCtxSynchronize"));
    synchronize_device(d, "cuCtxSynchronize")
}
