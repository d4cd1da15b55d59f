//! Events: a record is an item of its stream that marks the event complete when the stream
//! reaches it; a wait is an item that blocks its stream until then.
//!
//! Recorded on a capturing stream, an event belongs to the capture: a stream that waits on
//! it joins the capture (the fork/join pattern of multi-stream capture), and synchronizing
//! on it is refused, as CUDA does.

use std::ffi::c_uint;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use super::context::{current_device, tri};
use super::memory::Fault;
use super::registry::Registry;
use super::stream::{invalidate, lookup, Capture, Clock};
use super::{codes, refuse, write_out, CUresult, Handle};

struct EventState {
    /// How many times it was recorded outside a capture.
    recorded: u64,
    /// The latest record its stream has reached.
    completed: u64,
    at: Option<Instant>,
    captured_in: Option<Arc<Capture>>,
    /// What a record in a capture covered (see [`Capture::clocks`]).
    captured_clock: Clock,
}

pub struct Event {
    state: Mutex<EventState>,
    reached: Condvar,
    timing: bool,
}

impl Event {
    fn lock(&self) -> MutexGuard<'_, EventState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wait_for(&self, target: u64) {
        let mut st = self.lock();
        while st.completed < target {
            st = self.reached.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }
}

pub static EVENTS: Registry<Event> = Registry::new(0xE7);

fn get(h: Handle, op: &str) -> Result<Arc<Event>, CUresult> {
    EVENTS.get(h).ok_or_else(|| {
        refuse(
            codes::INVALID_HANDLE,
            op,
            format!("{h:?} is not a live event"),
        )
    })
}

/// `CU_EVENT_DISABLE_TIMING`.
const DISABLE_TIMING: c_uint = 0x2;

#[no_mangle]
pub unsafe extern "C" fn cuEventCreate(out: *mut Handle, flags: c_uint) -> CUresult {
    tri!(current_device("cuEventCreate"));
    let e = Arc::new(Event {
        state: Mutex::new(EventState {
            recorded: 0,
            completed: 0,
            at: None,
            captured_in: None,
            captured_clock: Clock::new(),
        }),
        reached: Condvar::new(),
        timing: flags & DISABLE_TIMING == 0,
    });
    write_out(out, EVENTS.insert(e), "cuEventCreate")
}

#[no_mangle]
pub unsafe extern "C" fn cuEventDestroy_v2(h: Handle) -> CUresult {
    match EVENTS.remove(h) {
        Some(_) => codes::SUCCESS,
        None => refuse(
            codes::INVALID_HANDLE,
            "cuEventDestroy",
            format!("{h:?} is not a live event"),
        ),
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuEventRecord(h: Handle, stream: Handle) -> CUresult {
    let e = tri!(get(h, "cuEventRecord"));
    let s = tri!(lookup(stream, "cuEventRecord"));
    if let Some(c) = s.capture() {
        // A node of the capture: ordering inside the graph is its issue order.
        let clock = c.clock_of(s.key());
        let mut st = e.lock();
        st.captured_in = Some(c);
        st.captured_clock = clock;
        return codes::SUCCESS;
    }
    let n = {
        let mut st = e.lock();
        st.captured_in = None;
        st.recorded += 1;
        st.recorded
    };
    let ev = e.clone();
    s.submit(
        "cuEventRecord",
        Arc::new(move || {
            let mut st = ev.lock();
            if st.completed < n {
                st.completed = n;
                st.at = Some(Instant::now());
            }
            ev.reached.notify_all();
            Ok(())
        }),
    );
    codes::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuEventRecordWithFlags(
    h: Handle,
    stream: Handle,
    _flags: c_uint,
) -> CUresult {
    cuEventRecord(h, stream)
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamWaitEvent(stream: Handle, h: Handle, _flags: c_uint) -> CUresult {
    let op = "cuStreamWaitEvent";
    let e = tri!(get(h, op));
    let s = tri!(lookup(stream, op));
    let (target, captured, clock) = {
        let st = e.lock();
        (
            st.recorded,
            st.captured_in.clone(),
            st.captured_clock.clone(),
        )
    };
    match (captured, s.capture()) {
        (Some(ec), Some(sc)) if Arc::ptr_eq(&ec, &sc) => {
            sc.merge_clock(s.key(), &clock);
            codes::SUCCESS
        }
        (Some(_), Some(sc)) => {
            invalidate(&sc, "a wait on an event of another capture");
            refuse(
                codes::STREAM_CAPTURE_ISOLATION,
                op,
                "the event belongs to another capture",
            )
        }
        (Some(ec), None) => {
            // The stream joins the capture: its work from now on is part of the graph.
            if stream as usize <= 2 {
                return refuse(
                    codes::STREAM_CAPTURE_ISOLATION,
                    op,
                    "the default stream cannot join a capture",
                );
            }
            ec.merge_clock(s.key(), &clock);
            s.set_capture(Some(ec));
            codes::SUCCESS
        }
        (None, Some(sc)) => {
            if target == 0 {
                return codes::SUCCESS;
            }
            invalidate(&sc, "a wait on an event recorded outside the capture");
            refuse(
                codes::STREAM_CAPTURE_ISOLATION,
                op,
                "a capturing stream waits on an event recorded outside the capture",
            )
        }
        (None, None) => {
            if target > 0 {
                s.submit(
                    "cuStreamWaitEvent",
                    Arc::new(move || {
                        e.wait_for(target);
                        Ok::<(), Fault>(())
                    }),
                );
            }
            codes::SUCCESS
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuEventSynchronize(h: Handle) -> CUresult {
    let e = tri!(get(h, "cuEventSynchronize"));
    let target = {
        let st = e.lock();
        if st.captured_in.is_some() {
            return refuse(
                codes::CAPTURED_EVENT,
                "cuEventSynchronize",
                "the event was recorded in a capture",
            );
        }
        st.recorded
    };
    e.wait_for(target);
    codes::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuEventQuery(h: Handle) -> CUresult {
    let e = tri!(get(h, "cuEventQuery"));
    let st = e.lock();
    if st.captured_in.is_some() {
        return refuse(
            codes::CAPTURED_EVENT,
            "cuEventQuery",
            "the event was recorded in a capture",
        );
    }
    if st.completed >= st.recorded {
        codes::SUCCESS
    } else {
        codes::NOT_READY
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime_v2(
    ms: *mut f32,
    start: Handle,
    end: Handle,
) -> CUresult {
    let op = "cuEventElapsedTime";
    let (a, b) = (tri!(get(start, op)), tri!(get(end, op)));
    if !a.timing || !b.timing {
        return refuse(
            codes::INVALID_HANDLE,
            op,
            "an event was created with CU_EVENT_DISABLE_TIMING",
        );
    }
    let (ta, tb) = {
        let (sa, sb) = (a.lock(), b.lock());
        if sa.completed < sa.recorded || sb.completed < sb.recorded {
            return codes::NOT_READY;
        }
        (sa.at, sb.at)
    };
    match (ta, tb) {
        (Some(ta), Some(tb)) => {
            let v = if tb >= ta {
                (tb - ta).as_secs_f64() * 1e3
            } else {
                -((ta - tb).as_secs_f64() * 1e3)
            };
            write_out(ms, v as f32, op)
        }
        _ => refuse(codes::INVALID_HANDLE, op, "an event was never recorded"),
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime(ms: *mut f32, start: Handle, end: Handle) -> CUresult {
    cuEventElapsedTime_v2(ms, start, end)
}
