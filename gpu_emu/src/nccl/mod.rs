//! The emulated NCCL: communicators among the ranks of one process (threads), with the
//! collectives and point-to-point calls the engine makes, each enqueued on the given
//! stream and meeting its peers there ([`group`]).
//!
//! Group calls (`ncclGroupStart` / `End`) need no deferral here: no call blocks its caller
//! (the meeting happens on the stream workers), and sends never wait for their receiver,
//! so any order of grouped calls completes. (Real NCCL needs the group for that; code
//! that forgets it can deadlock on a GPU and not here.)

pub mod group;
pub mod reduce;

#[cfg(test)]
mod tests;

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void};
use std::sync::{Arc, Condvar, Mutex};

use crate::driver::context::current_device;
use crate::driver::memory::resolve;
use crate::driver::registry::Registry;
use crate::driver::stream::lookup;
use crate::driver::Handle;
use group::{fault, Group, Kind, Part};
use reduce::{Dtype, RedOp};

/// `ncclResult_t`.
pub type NcclResult = u32;
pub mod result {
    pub const SUCCESS: u32 = 0;
    pub const UNHANDLED_CUDA_ERROR: u32 = 1;
    pub const SYSTEM_ERROR: u32 = 2;
    pub const INTERNAL_ERROR: u32 = 3;
    pub const INVALID_ARGUMENT: u32 = 4;
    pub const INVALID_USAGE: u32 = 5;
    pub const REMOTE_ERROR: u32 = 6;
}

/// `NCCL_VERSION_CODE` of 2.28.3.
pub const VERSION: c_int = 22803;
pub const UNIQUE_ID_BYTES: usize = 128;

/// `ncclUniqueId`: 128 bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId {
    pub internal: [u8; UNIQUE_ID_BYTES],
}

pub struct Comm {
    pub group: Arc<Group>,
    pub rank: usize,
    pub device: usize,
}

static COMMS: Registry<Comm> = Registry::new(0x2CC1);

fn refuse(code: NcclResult, op: &str, why: impl std::fmt::Display) -> NcclResult {
    eprintln!("dcpemu: {op}: {why} (ncclResult {code})");
    code
}

macro_rules! tri {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(code) => return code,
        }
    };
}

fn comm(h: Handle, op: &str) -> Result<Arc<Comm>, NcclResult> {
    COMMS.get(h).ok_or_else(|| {
        refuse(
            result::INVALID_ARGUMENT,
            op,
            format!("{h:?} is not a live communicator"),
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn ncclGetVersion(version: *mut c_int) -> NcclResult {
    if version.is_null() {
        return result::INVALID_ARGUMENT;
    }
    *version = VERSION;
    result::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn ncclGetErrorString(code: NcclResult) -> *const c_char {
    let s: &'static str = match code {
        result::SUCCESS => "no error\0",
        result::UNHANDLED_CUDA_ERROR => "unhandled cuda error\0",
        result::SYSTEM_ERROR => "unhandled system error\0",
        result::INTERNAL_ERROR => "internal error\0",
        result::INVALID_ARGUMENT => "invalid argument\0",
        result::INVALID_USAGE => "invalid usage\0",
        result::REMOTE_ERROR => "remote process exited or there was a network error\0",
        _ => "unknown result code\0",
    };
    s.as_ptr().cast()
}

/// A fresh id: "dcpemu", the process id, a counter and the time, as opaque bytes.
#[no_mangle]
pub unsafe extern "C" fn ncclGetUniqueId(out: *mut UniqueId) -> NcclResult {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    if out.is_null() {
        return result::INVALID_ARGUMENT;
    }
    let mut id = UniqueId {
        internal: [0; UNIQUE_ID_BYTES],
    };
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    id.internal[..6].copy_from_slice(b"dcpemu");
    id.internal[8..12].copy_from_slice(&std::process::id().to_le_bytes());
    id.internal[16..24].copy_from_slice(&n.to_le_bytes());
    id.internal[24..32].copy_from_slice(&t.to_le_bytes());
    *out = id;
    result::SUCCESS
}

/// Groups being formed by `ncclCommInitRank`, by id.
struct Forming {
    group: Arc<Group>,
    joined: usize,
    /// The device of each rank that joined.
    devices: Arc<Mutex<Vec<usize>>>,
}

/// NCCL refuses a communicator with two ranks on one GPU ("Duplicate GPU detected").
fn duplicate_device(devices: &[usize]) -> Option<usize> {
    let mut seen = std::collections::HashSet::new();
    devices.iter().copied().find(|d| !seen.insert(*d))
}

static FORMING: Mutex<Option<HashMap<[u8; UNIQUE_ID_BYTES], Forming>>> = Mutex::new(None);
static FORMED: Condvar = Condvar::new();

/// Joins the group named by `id` as rank `rank` of `nranks`; blocks until all have joined.
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRank(
    out: *mut Handle,
    nranks: c_int,
    id: UniqueId,
    rank: c_int,
) -> NcclResult {
    let op = "ncclCommInitRank";
    let Ok(device) = current_device(op) else {
        return result::INVALID_USAGE;
    };
    if out.is_null() || nranks < 1 || rank < 0 || rank >= nranks {
        return refuse(
            result::INVALID_ARGUMENT,
            op,
            format!("rank {rank} of {nranks}"),
        );
    }
    if id.internal[..6] != *b"dcpemu" {
        return refuse(
            result::INVALID_ARGUMENT,
            op,
            "the unique id was not made by ncclGetUniqueId",
        );
    }
    if id.internal[8..12] != std::process::id().to_le_bytes() {
        return refuse(
            result::INVALID_USAGE,
            op,
            "the unique id comes from another process: emulated NCCL ranks are threads of one process",
        );
    }
    let size = nranks as usize;
    let mut forming = FORMING.lock().unwrap_or_else(|p| p.into_inner());
    let table = forming.get_or_insert_with(HashMap::new);
    let f = table.entry(id.internal).or_insert_with(|| Forming {
        group: Arc::new(Group::new(size)),
        joined: 0,
        devices: Arc::new(Mutex::new(Vec::new())),
    });
    if f.group.size != size {
        return refuse(
            result::INVALID_USAGE,
            op,
            format!("ranks disagree on the size ({} and {size})", f.group.size),
        );
    }
    f.joined += 1;
    f.devices
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(device);
    let devices = f.devices.clone();
    let group = f.group.clone();
    FORMED.notify_all();
    loop {
        let table = forming.get_or_insert_with(HashMap::new);
        match table.get(&id.internal) {
            Some(f) if f.joined < size => {}
            _ => break,
        }
        forming = FORMED.wait(forming).unwrap_or_else(|p| p.into_inner());
    }
    // The last to see the group complete forgets the id (an id names one group).
    if let Some(table) = forming.as_mut() {
        table.remove(&id.internal);
    }
    drop(forming);
    if let Some(d) = duplicate_device(&devices.lock().unwrap_or_else(|p| p.into_inner())) {
        return refuse(
            result::INVALID_USAGE,
            op,
            format!(
                "two ranks of the communicator are on device {d} (NCCL: duplicate GPU detected)"
            ),
        );
    }
    *out = COMMS.insert(Arc::new(Comm {
        group,
        rank: rank as usize,
        device,
    }));
    result::SUCCESS
}

/// One communicator per device of `devlist` (or 0..ndev), rank i on `devlist[i]`.
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitAll(
    out: *mut Handle,
    ndev: c_int,
    devlist: *const c_int,
) -> NcclResult {
    let op = "ncclCommInitAll";
    if out.is_null() || ndev < 1 {
        return refuse(result::INVALID_ARGUMENT, op, format!("{ndev} devices"));
    }
    let n = crate::driver::config::get().devices;
    let devices: Vec<usize> = (0..ndev as usize)
        .map(|r| {
            if devlist.is_null() {
                r
            } else {
                *devlist.add(r) as usize
            }
        })
        .collect();
    if let Some(d) = duplicate_device(&devices) {
        return refuse(
            result::INVALID_USAGE,
            op,
            format!(
                "two ranks of the communicator are on device {d} (NCCL: duplicate GPU detected)"
            ),
        );
    }
    let group = Arc::new(Group::new(ndev as usize));
    for r in 0..ndev as usize {
        let dev = if devlist.is_null() {
            r as c_int
        } else {
            *devlist.add(r)
        };
        if dev < 0 || dev as usize >= n {
            return refuse(
                result::INVALID_ARGUMENT,
                op,
                format!("device {dev} (there are {n})"),
            );
        }
        *out.add(r) = COMMS.insert(Arc::new(Comm {
            group: group.clone(),
            rank: r,
            device: dev as usize,
        }));
    }
    result::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommAbort(h: Handle) -> NcclResult {
    match COMMS.remove(h) {
        Some(c) => {
            c.group.abort();
            result::SUCCESS
        }
        None => refuse(
            result::INVALID_ARGUMENT,
            "ncclCommAbort",
            format!("{h:?} is not a live communicator"),
        ),
    }
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommDestroy(h: Handle) -> NcclResult {
    match COMMS.remove(h) {
        Some(_) => result::SUCCESS,
        None => refuse(
            result::INVALID_ARGUMENT,
            "ncclCommDestroy",
            format!("{h:?} is not a live communicator"),
        ),
    }
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommGetAsyncError(h: Handle, err: *mut NcclResult) -> NcclResult {
    let c = tri!(comm(h, "ncclCommGetAsyncError"));
    if err.is_null() {
        return result::INVALID_ARGUMENT;
    }
    *err = if c.group.aborted() {
        result::REMOTE_ERROR
    } else {
        result::SUCCESS
    };
    result::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommCount(h: Handle, count: *mut c_int) -> NcclResult {
    let c = tri!(comm(h, "ncclCommCount"));
    if count.is_null() {
        return result::INVALID_ARGUMENT;
    }
    *count = c.group.size as c_int;
    result::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommUserRank(h: Handle, rank: *mut c_int) -> NcclResult {
    let c = tri!(comm(h, "ncclCommUserRank"));
    if rank.is_null() {
        return result::INVALID_ARGUMENT;
    }
    *rank = c.rank as c_int;
    result::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommCuDevice(h: Handle, dev: *mut c_int) -> NcclResult {
    let c = tri!(comm(h, "ncclCommCuDevice"));
    if dev.is_null() {
        return result::INVALID_ARGUMENT;
    }
    *dev = c.device as c_int;
    result::SUCCESS
}

thread_local! {
    static GROUP_DEPTH: Cell<u32> = const { Cell::new(0) };
}

#[no_mangle]
pub unsafe extern "C" fn ncclGroupStart() -> NcclResult {
    GROUP_DEPTH.with(|d| d.set(d.get() + 1));
    result::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn ncclGroupEnd() -> NcclResult {
    GROUP_DEPTH.with(|d| match d.get() {
        0 => refuse(
            result::INVALID_USAGE,
            "ncclGroupEnd",
            "without ncclGroupStart",
        ),
        n => {
            d.set(n - 1);
            result::SUCCESS
        }
    })
}

/// Checks the call's comm, stream and types, then enqueues `part` on the stream.
#[allow(clippy::too_many_arguments)]
unsafe fn collective(
    op: &'static str,
    h: Handle,
    stream: Handle,
    kind: Kind,
    dtype: u32,
    count: usize,
    (send, send_elems): (*const c_void, usize),
    (recv, recv_elems): (*mut c_void, usize),
) -> NcclResult {
    let c = tri!(comm(h, op));
    let Some(dt) = Dtype::from_nccl(dtype) else {
        return refuse(result::INVALID_ARGUMENT, op, format!("data type {dtype}"));
    };
    let Ok(s) = lookup(stream, op) else {
        return result::INVALID_ARGUMENT;
    };
    if s.device != c.device {
        return refuse(
            result::INVALID_USAGE,
            op,
            format!(
                "rank {} is on device {}, the stream on device {}",
                c.rank, c.device, s.device
            ),
        );
    }
    let (sb, rb) = (send_elems * dt.size(), recv_elems * dt.size());
    for (addr, bytes, role) in [(send as u64, sb, "send"), (recv as u64, rb, "recv")] {
        if bytes == 0 {
            continue;
        }
        match resolve(addr, bytes, op) {
            Ok((_, d)) if d == c.device => {}
            Ok((_, d)) => {
                return refuse(
                    result::INVALID_ARGUMENT,
                    op,
                    format!("{role} buffer on device {d}"),
                )
            }
            Err(f) => return refuse(result::INVALID_ARGUMENT, op, f.msg),
        }
    }
    let (send, recv) = (send as u64, recv as u64);
    s.submit(
        op,
        Arc::new(move || {
            let host = |addr: u64, bytes: usize| -> Result<usize, crate::driver::memory::Fault> {
                if bytes == 0 {
                    return Ok(0);
                }
                resolve(addr, bytes, op).map(|(p, _)| p as usize)
            };
            let part = Part {
                kind,
                dtype: dt,
                count,
                send: host(send, sb)?,
                recv: host(recv, rb)?,
            };
            match c.group.collective(c.rank, part) {
                Ok(()) => Ok(()),
                Err(why) => fault(op, why),
            }
        }),
    );
    result::SUCCESS
}

fn red_op(op: u32, call: &str) -> Result<RedOp, NcclResult> {
    RedOp::from_nccl(op)
        .ok_or_else(|| refuse(result::INVALID_ARGUMENT, call, format!("reduction {op}")))
}

fn group_size(h: Handle) -> usize {
    COMMS.get(h).map_or(1, |c| c.group.size)
}

#[no_mangle]
pub unsafe extern "C" fn ncclAllReduce(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: u32,
    op: u32,
    h: Handle,
    stream: Handle,
) -> NcclResult {
    let r = tri!(red_op(op, "ncclAllReduce"));
    collective(
        "ncclAllReduce",
        h,
        stream,
        Kind::AllReduce(r),
        dtype,
        count,
        (send, count),
        (recv, count),
    )
}

#[no_mangle]
pub unsafe extern "C" fn ncclReduceScatter(
    send: *const c_void,
    recv: *mut c_void,
    recv_count: usize,
    dtype: u32,
    op: u32,
    h: Handle,
    stream: Handle,
) -> NcclResult {
    let r = tri!(red_op(op, "ncclReduceScatter"));
    let n = group_size(h);
    collective(
        "ncclReduceScatter",
        h,
        stream,
        Kind::ReduceScatter(r),
        dtype,
        recv_count,
        (send, recv_count * n),
        (recv, recv_count),
    )
}

#[no_mangle]
pub unsafe extern "C" fn ncclAllGather(
    send: *const c_void,
    recv: *mut c_void,
    send_count: usize,
    dtype: u32,
    h: Handle,
    stream: Handle,
) -> NcclResult {
    let n = group_size(h);
    collective(
        "ncclAllGather",
        h,
        stream,
        Kind::AllGather,
        dtype,
        send_count,
        (send, send_count),
        (recv, send_count * n),
    )
}

#[no_mangle]
pub unsafe extern "C" fn ncclBroadcast(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: u32,
    root: c_int,
    h: Handle,
    stream: Handle,
) -> NcclResult {
    let c = tri!(comm(h, "ncclBroadcast"));
    if root < 0 || root as usize >= c.group.size {
        return refuse(
            result::INVALID_ARGUMENT,
            "ncclBroadcast",
            format!("root {root} of {}", c.group.size),
        );
    }
    // Only the root's send buffer is read.
    let send_elems = if c.rank == root as usize { count } else { 0 };
    collective(
        "ncclBroadcast",
        h,
        stream,
        Kind::Broadcast {
            root: root as usize,
        },
        dtype,
        count,
        (send, send_elems),
        (recv, count),
    )
}

#[allow(clippy::too_many_arguments)]
unsafe fn p2p(
    op: &'static str,
    buf: u64,
    count: usize,
    dtype: u32,
    peer: c_int,
    h: Handle,
    stream: Handle,
    sending: bool,
) -> NcclResult {
    let c = tri!(comm(h, op));
    let Some(dt) = Dtype::from_nccl(dtype) else {
        return refuse(result::INVALID_ARGUMENT, op, format!("data type {dtype}"));
    };
    if peer < 0 || peer as usize >= c.group.size {
        return refuse(
            result::INVALID_ARGUMENT,
            op,
            format!("peer {peer} of {}", c.group.size),
        );
    }
    let Ok(s) = lookup(stream, op) else {
        return result::INVALID_ARGUMENT;
    };
    let bytes = count * dt.size();
    if bytes > 0 {
        if let Err(f) = resolve(buf, bytes, op) {
            return refuse(result::INVALID_ARGUMENT, op, f.msg);
        }
    }
    let peer = peer as usize;
    s.submit(
        op,
        Arc::new(move || {
            let p = if bytes == 0 {
                0
            } else {
                resolve(buf, bytes, op)?.0 as usize
            };
            let r = if sending {
                // SAFETY: `bytes` bytes of a live allocation, resolved just now.
                let data = unsafe { std::slice::from_raw_parts(p as *const u8, bytes) }.to_vec();
                c.group.send(c.rank, peer, data)
            } else {
                c.group.recv(peer, c.rank).and_then(|data| {
                    if data.len() != bytes {
                        return Err(format!(
                            "rank {peer} sent {} bytes, rank {} receives {bytes}",
                            data.len(),
                            c.rank
                        ));
                    }
                    // SAFETY: as above.
                    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p as *mut u8, bytes) };
                    Ok(())
                })
            };
            match r {
                Ok(()) => Ok(()),
                Err(why) => fault(op, why),
            }
        }),
    );
    result::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn ncclSend(
    send: *const c_void,
    count: usize,
    dtype: u32,
    peer: c_int,
    h: Handle,
    stream: Handle,
) -> NcclResult {
    p2p("ncclSend", send as u64, count, dtype, peer, h, stream, true)
}

#[no_mangle]
pub unsafe extern "C" fn ncclRecv(
    recv: *mut c_void,
    count: usize,
    dtype: u32,
    peer: c_int,
    h: Handle,
    stream: Handle,
) -> NcclResult {
    p2p(
        "ncclRecv",
        recv as u64,
        count,
        dtype,
        peer,
        h,
        stream,
        false,
    )
}
