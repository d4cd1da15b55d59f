//! Streams: each one a worker thread running its queue in order, asynchronously to the
//! caller; stream capture records the work into a graph instead.
//!
//! A failed item (an illegal address, a kernel error) makes its device's context broken, as
//! on a GPU: it is printed at once, later items of that device are skipped, and every
//! synchronizing call on the device returns the error from then on.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use super::memory::Fault;
use super::registry::Registry;
use super::{codes, config, context, refuse, CUresult, Handle};

/// One unit of stream work. `Fn`, not `FnOnce`: a captured graph runs it again per launch.
pub type Op = Arc<dyn Fn() -> Result<(), Fault> + Send + Sync>;

/// Stream work with the name of the call that issued it (for messages).
#[derive(Clone)]
pub struct Item {
    pub what: String,
    pub op: Op,
}

/// A stream capture in progress: the work recorded, in issue order, from the stream that
/// began it and every stream that joined it through an event.
pub struct Capture {
    pub origin: usize,
    pub items: Mutex<Vec<Item>>,
    /// Set when a call not permitted during capture was made; ending it then fails.
    pub invalidated: Mutex<Option<String>>,
    /// Per member stream ([`Stream::key`]): how much of each member's captured work it is
    /// ordered after (a vector clock), to find forks never joined back to the origin.
    pub clocks: Mutex<HashMap<usize, Clock>>,
}

/// Member stream -> items of it an ordering covers.
pub type Clock = HashMap<usize, usize>;

impl Capture {
    pub fn new(origin: usize) -> Capture {
        Capture {
            origin,
            items: Mutex::new(Vec::new()),
            invalidated: Mutex::new(None),
            clocks: Mutex::new(HashMap::new()),
        }
    }

    /// The clock of member `key` (what an event recorded there now covers).
    pub fn clock_of(&self, key: usize) -> Clock {
        lock(&self.clocks).get(&key).cloned().unwrap_or_default()
    }

    /// Member `key` waits on an event whose record covered `clock`.
    pub fn merge_clock(&self, key: usize, clock: &Clock) {
        let mut clocks = lock(&self.clocks);
        let mine = clocks.entry(key).or_default();
        for (k, v) in clock {
            let e = mine.entry(*k).or_default();
            *e = (*e).max(*v);
        }
    }

    /// A member whose captured work the origin (`origin_key`) is not ordered after.
    pub fn unjoined(&self, origin_key: usize) -> Option<usize> {
        let clocks = lock(&self.clocks);
        let origin = clocks.get(&origin_key).cloned().unwrap_or_default();
        clocks.iter().find_map(|(k, c)| {
            let done = c.get(k).copied().unwrap_or(0);
            (*k != origin_key && done > origin.get(k).copied().unwrap_or(0)).then_some(done)
        })
    }
}

struct State {
    queue: VecDeque<Item>,
    enqueued: u64,
    done: u64,
    capture: Option<Arc<Capture>>,
    destroyed: bool,
}

/// A stream of one device.
pub struct Stream {
    pub device: usize,
    state: Mutex<State>,
    progress: Condvar,
}

pub static STREAMS: Registry<Stream> = Registry::new(0x57);

/// Per device: the first failure of its stream work (the context is broken after it).
static DEVICE_FAULT: [Mutex<Option<Fault>>; 64] = [const { Mutex::new(None) }; 64];

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The failure that broke `device`'s context, if any.
pub fn device_fault(device: usize) -> Option<Fault> {
    lock(&DEVICE_FAULT[device]).clone()
}

fn record_fault(device: usize, what: &str, f: Fault) {
    eprintln!(
        "dcpemu: device {device}: {what} failed: {} ({})",
        f.msg,
        super::errors::name(f.code)
    );
    let mut slot = lock(&DEVICE_FAULT[device]);
    if slot.is_none() {
        *slot = Some(f);
    }
}

impl Stream {
    /// A new stream with its worker thread.
    pub fn spawn(device: usize) -> Arc<Stream> {
        let s = Arc::new(Stream {
            device,
            state: Mutex::new(State {
                queue: VecDeque::new(),
                enqueued: 0,
                done: 0,
                capture: None,
                destroyed: false,
            }),
            progress: Condvar::new(),
        });
        let worker = s.clone();
        std::thread::Builder::new()
            .name(format!("dcpemu-stream-{device}"))
            .spawn(move || worker.run())
            .expect("spawning a stream worker");
        s
    }

    fn run(&self) {
        loop {
            let item = {
                let mut st = lock(&self.state);
                loop {
                    if let Some(item) = st.queue.pop_front() {
                        break item;
                    }
                    if st.destroyed {
                        return;
                    }
                    st = self.progress.wait(st).unwrap_or_else(|p| p.into_inner());
                }
            };
            if let Some(d) = config::random_delay() {
                std::thread::sleep(d);
            }
            if device_fault(self.device).is_none() {
                if let Err(f) = (item.op)() {
                    record_fault(self.device, &item.what, f);
                }
            }
            let mut st = lock(&self.state);
            st.done += 1;
            self.progress.notify_all();
        }
    }

    /// This stream's identity within a capture.
    pub fn key(&self) -> usize {
        self as *const Stream as usize
    }

    /// The capture this stream records into, if any.
    pub fn capture(&self) -> Option<Arc<Capture>> {
        lock(&self.state).capture.clone()
    }

    pub fn set_capture(&self, c: Option<Arc<Capture>>) {
        lock(&self.state).capture = c;
    }

    /// Queues `op` (or records it, while capturing). Returns the ticket to wait for, `None`
    /// when it was recorded.
    pub fn submit(&self, what: impl Into<String>, op: Op) -> Option<u64> {
        let item = Item {
            what: what.into(),
            op,
        };
        let mut st = lock(&self.state);
        if let Some(c) = &st.capture {
            lock(&c.items).push(item);
            *lock(&c.clocks)
                .entry(self.key())
                .or_default()
                .entry(self.key())
                .or_default() += 1;
            return None;
        }
        st.queue.push_back(item);
        st.enqueued += 1;
        self.progress.notify_all();
        Some(st.enqueued)
    }

    /// Blocks until the item with `ticket` (and everything before it) has run.
    pub fn wait_ticket(&self, ticket: u64) {
        let mut st = lock(&self.state);
        while st.done < ticket {
            st = self.progress.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Blocks until the queue is empty.
    pub fn drain(&self) {
        let ticket = lock(&self.state).enqueued;
        self.wait_ticket(ticket);
    }

    /// Whether every queued item has run.
    pub fn idle(&self) -> bool {
        let st = lock(&self.state);
        st.done == st.enqueued
    }

    /// Lets the worker exit once its queue is empty.
    pub fn retire(&self) {
        lock(&self.state).destroyed = true;
        self.progress.notify_all();
    }
}

/// The stream a handle names: 0 (legacy), 1 (`CU_STREAM_LEGACY`) and 2
/// (`CU_STREAM_PER_THREAD`) are the current device's default stream.
pub fn lookup(h: Handle, op: &str) -> Result<Arc<Stream>, CUresult> {
    let v = h as usize;
    if v <= 2 {
        let d = context::current_device(op)?;
        return Ok(default_stream(d));
    }
    STREAMS.get(h).ok_or_else(|| {
        refuse(
            codes::INVALID_HANDLE,
            op,
            format!("{h:?} is not a live stream"),
        )
    })
}

/// Device `d`'s default stream (created on first use).
pub fn default_stream(d: usize) -> Arc<Stream> {
    static DEFAULTS: Mutex<Option<HashMap<usize, Arc<Stream>>>> = Mutex::new(None);
    lock(&DEFAULTS)
        .get_or_insert_with(HashMap::new)
        .entry(d)
        .or_insert_with(|| Stream::spawn(d))
        .clone()
}

/// Every live stream of `device`, the default one included.
fn device_streams(device: usize) -> Vec<Arc<Stream>> {
    let mut v: Vec<_> = STREAMS
        .all()
        .into_iter()
        .filter(|s| s.device == device)
        .collect();
    v.push(default_stream(device));
    v
}

/// The error a synchronizing call on `device` reports.
pub fn fault_code(device: usize) -> CUresult {
    device_fault(device).map_or(codes::SUCCESS, |f| f.code)
}

/// Waits for all of `device`'s streams (`cuCtxSynchronize`).
pub fn synchronize_device(device: usize, op: &str) -> CUresult {
    for s in device_streams(device) {
        if s.capture().is_some() {
            return refuse(
                codes::STREAM_CAPTURE_UNSUPPORTED,
                op,
                "a stream of this context is capturing",
            );
        }
        s.drain();
    }
    fault_code(device)
}

/// Runs `op` on `stream` and waits for it: a synchronous call (a copy to pageable memory,
/// `cuMemcpy*` without `Async`). Refused while the stream captures.
pub fn run_and_wait(stream: &Stream, what: &str, op: Op) -> CUresult {
    if let Some(c) = stream.capture() {
        invalidate(&c, what);
        return refuse(
            codes::STREAM_CAPTURE_UNSUPPORTED,
            what,
            "synchronous while the stream captures",
        );
    }
    if let Some(f) = device_fault(stream.device) {
        return f.code;
    }
    match stream.submit(what, op) {
        Some(t) => stream.wait_ticket(t),
        None => unreachable!("not capturing"),
    }
    fault_code(stream.device)
}

/// Marks a capture as failed: its end call reports it.
pub fn invalidate(c: &Capture, why: &str) {
    lock(&c.invalidated).get_or_insert_with(|| why.to_string());
}

/// A sequence number, for captures and anything else that needs one.
pub fn next_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}
