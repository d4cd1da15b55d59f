//! NCCL collectives on a rank's CUDA stream (cudarc's `nccl` binding, raw layer).
//!
//! cudarc's safe `Comm` is not used: its `Drop` panics when `ncclCommAbort` fails and it
//! offers no abort of a live communicator, and a rank's group must be breakable from the
//! supervisor's thread when a peer dies. The raw handle lives here in an `AtomicPtr`;
//! calls are serialized by a mutex, which [`NcclCollectives::abort`] waits for only
//! briefly: a call stuck inside NCCL (connection setup waiting for a dead peer) is what
//! `ncclCommAbort` exists to unblock, so abort goes ahead without the lock then.

use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use cudarc::driver::{CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut};
use cudarc::nccl::result as nccl_result;
use cudarc::nccl::sys::{ncclComm, ncclComm_t, ncclRedOp_t};

use super::elem::{drv, nccl, GpuCommElem};
use crate::comm::elems::check_all_to_all;
use crate::error::{check_len, KernelError};
use crate::step_graph;

/// How long [`NcclCollectives::abort`] waits for a call in progress before aborting
/// under it.
const ABORT_WAIT: Duration = Duration::from_secs(1);

/// One rank's NCCL communicator, enqueuing on the rank's stream.
///
/// Every call enqueues on [`NcclCollectives::stream`] and returns at once (NCCL's
/// semantics); a call between [`NcclCollectives::group_start`] and
/// [`NcclCollectives::group_end`] is fused with the others of the group.
pub struct NcclCollectives {
    /// The communicator; null once aborted or destroyed. An NCCL communicator may be
    /// used from any thread as long as its calls are not concurrent (`calls`).
    comm: AtomicPtr<ncclComm>,
    /// Held for the duration of every call on `comm`.
    calls: Mutex<()>,
    stream: Arc<CudaStream>,
    rank: usize,
    size: usize,
    aborted: AtomicBool,
    /// An error of `group_start` (which returns nothing), reported by `group_end`.
    group_error: Mutex<Option<KernelError>>,
}

impl NcclCollectives {
    /// Wraps an initialized communicator of group rank `rank` of `size`.
    pub(crate) fn from_raw(
        comm: ncclComm_t,
        stream: Arc<CudaStream>,
        rank: usize,
        size: usize,
    ) -> Self {
        Self {
            comm: AtomicPtr::new(comm),
            calls: Mutex::new(()),
            stream,
            rank,
            size,
            aborted: AtomicBool::new(false),
            group_error: Mutex::new(None),
        }
    }

    /// This rank's index in the group.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the group.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The stream every call enqueues on (the rank backend's stream).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Runs `f` with the live communicator and the stream's context current on this
    /// thread; fails once the group was aborted.
    fn with_comm<R>(
        &self,
        what: &str,
        f: impl FnOnce(ncclComm_t) -> Result<R, KernelError>,
    ) -> Result<R, KernelError> {
        let _call = self.calls.lock().unwrap_or_else(PoisonError::into_inner);
        let comm = self.comm.load(Ordering::Acquire);
        if comm.is_null() || self.aborted.load(Ordering::Acquire) {
            return Err(KernelError::Comm(format!(
                "{what}: the NCCL group was aborted (a rank of the group failed)"
            )));
        }
        self.stream.context().bind_to_thread().map_err(drv(what))?;
        f(comm)
    }

    fn cu_stream(&self) -> cudarc::nccl::sys::cudaStream_t {
        self.stream.cu_stream() as _
    }

    /// The signature words of an NCCL call on `comm` and this stream: the communicator,
    /// `args` (buffers, count, type, op or peer) and the stream.
    fn sig<const N: usize>(&self, comm: ncclComm_t, args: [u64; N]) -> Vec<u64> {
        let mut sig = Vec::with_capacity(N + 2);
        sig.push(comm as usize as u64);
        sig.extend(args);
        sig.push(self.cu_stream() as usize as u64);
        sig
    }

    /// Opens a group of calls issued together (`ncclGroupStart`).
    pub fn group_start(&self) {
        if let Err(e) = enqueue_group_start() {
            *self
                .group_error
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(e);
        }
    }

    /// Closes the group (`ncclGroupEnd`), reporting an error of the matching
    /// `group_start` too.
    pub fn group_end(&self) -> Result<(), KernelError> {
        let end = enqueue_group_end();
        if let Some(e) = self
            .group_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            return Err(e);
        }
        end
    }

    /// `out` = every rank's `input`, concatenated in rank order (`ncclAllGather`).
    pub fn all_gather<T: GpuCommElem>(
        &self,
        input: CudaView<'_, T>,
        mut out: CudaViewMut<'_, T>,
    ) -> Result<(), KernelError> {
        check_len("all_gather output", self.size * input.len(), out.len())?;
        self.with_comm("ncclAllGather", |comm| {
            let (src, _read) = input.device_ptr(&self.stream);
            let (dst, _write) = out.device_ptr_mut(&self.stream);
            let n = input.len();
            let sig = self.sig(comm, [src, dst, n as u64, T::NCCL as u64]);
            step_graph::enqueue("nccl_all_gather", &sig, || {
                // SAFETY: both pointers are live device buffers of the stated lengths on
                // this context; the guards keep cudarc's events until the call is
                // enqueued.
                unsafe {
                    nccl_result::all_gather(src as _, dst as _, n, T::NCCL, comm, self.cu_stream())
                }
                .map(|_| ())
                .map_err(nccl("ncclAllGather"))
            })
        })
    }

    /// Element-wise sum over ranks, in place (`ncclAllReduce`). NCCL's sum order is its
    /// own: every rank gets the same bits for a given algorithm, not those of the CPU's
    /// rank-ordered sum.
    pub fn all_reduce_sum<T: GpuCommElem>(
        &self,
        mut data: CudaViewMut<'_, T>,
    ) -> Result<(), KernelError> {
        let n = data.len();
        self.with_comm("ncclAllReduce", |comm| {
            let (ptr, _write) = data.device_ptr_mut(&self.stream);
            // SAFETY: in-place all-reduce of a live device buffer of `n` elements.
            unsafe { self.sum_call::<T>(comm, Sum::AllReduce, ptr, ptr, n) }
        })
    }

    /// Sum over ranks of `input`, of which this rank receives chunk `rank`
    /// (`ncclReduceScatter`).
    pub fn reduce_scatter_sum<T: GpuCommElem>(
        &self,
        input: CudaView<'_, T>,
        mut out: CudaViewMut<'_, T>,
    ) -> Result<(), KernelError> {
        check_len("reduce_scatter input", self.size * out.len(), input.len())?;
        let n = out.len();
        self.with_comm("ncclReduceScatter", |comm| {
            let (src, _read) = input.device_ptr(&self.stream);
            let (dst, _write) = out.device_ptr_mut(&self.stream);
            // SAFETY: live device buffers of size × n and n elements.
            unsafe { self.sum_call::<T>(comm, Sum::ReduceScatter, src, dst, n) }
        })
    }

    /// One NCCL sum over the ranks from `src` into `dst` (`n` elements each way for an
    /// all-reduce; `n` per rank received for a reduce-scatter), enqueued with its
    /// signature.
    ///
    /// # Safety
    /// `src` and `dst` must be live device buffers of the sizes the call implies.
    unsafe fn sum_call<T: GpuCommElem>(
        &self,
        comm: ncclComm_t,
        kind: Sum,
        src: u64,
        dst: u64,
        n: usize,
    ) -> Result<(), KernelError> {
        let op = ncclRedOp_t::ncclSum;
        let sig = self.sig(comm, [src, dst, n as u64, T::NCCL as u64, op as u64]);
        let (what, name) = match kind {
            Sum::AllReduce => ("nccl_all_reduce", "ncclAllReduce"),
            Sum::ReduceScatter => ("nccl_reduce_scatter", "ncclReduceScatter"),
        };
        step_graph::enqueue(what, &sig, || {
            let (s, d, stream) = (src as _, dst as _, self.cu_stream());
            // SAFETY: the caller's contract.
            unsafe {
                match kind {
                    Sum::AllReduce => nccl_result::all_reduce(s, d, n, T::NCCL, op, comm, stream),
                    Sum::ReduceScatter => {
                        nccl_result::reduce_scatter(s, d, n, T::NCCL, op, comm, stream)
                    }
                }
            }
            .map(|_| ())
            .map_err(nccl(name))
        })
    }

    /// Copies `root`'s `data` to every rank (`ncclBroadcast`, in place).
    pub fn broadcast<T: GpuCommElem>(
        &self,
        mut data: CudaViewMut<'_, T>,
        root: usize,
    ) -> Result<(), KernelError> {
        if root >= self.size {
            return Err(KernelError::Shape(format!(
                "broadcast root {root} out of range"
            )));
        }
        let n = data.len();
        self.with_comm("ncclBroadcast", |comm| {
            let (ptr, _write) = data.device_ptr_mut(&self.stream);
            // SAFETY: in-place broadcast of a live buffer of n elements.
            unsafe { self.broadcast_call::<T>(comm, ptr, ptr, n, root) }
        })
    }

    /// One `ncclBroadcast` of `n` elements from `root`'s `send` into `recv`, enqueued
    /// with its signature.
    ///
    /// # Safety
    /// `recv` must hold `n` elements, and on the root `send` too (NCCL ignores `send`
    /// on the other ranks).
    unsafe fn broadcast_call<T: GpuCommElem>(
        &self,
        comm: ncclComm_t,
        send: u64,
        recv: u64,
        n: usize,
        root: usize,
    ) -> Result<(), KernelError> {
        let sig = self.sig(comm, [send, recv, n as u64, T::NCCL as u64, root as u64]);
        step_graph::enqueue("nccl_broadcast", &sig, || {
            let (s, r, stream) = (send as _, recv as _, self.cu_stream());
            // SAFETY: the caller's contract.
            unsafe { nccl_result::broadcast(s, r, n, T::NCCL, root as i32, comm, stream) }
                .map(|_| ())
                .map_err(nccl("ncclBroadcast"))
        })
    }

    /// Uneven all-gather: rank `r` contributes `counts[r]` values; `out` is their
    /// concatenation. NCCL has no all-gather-v: this is one grouped `ncclBroadcast` per
    /// rank, rank `r` the root of the `counts[r]` values that land at their offset of
    /// `out` — no padding, no staging buffer, no compaction copy.
    pub fn all_gather_varying<T: GpuCommElem>(
        &self,
        input: CudaView<'_, T>,
        counts: &[usize],
        mut out: CudaViewMut<'_, T>,
    ) -> Result<(), KernelError> {
        check_len("all_gather_varying counts", self.size, counts.len())?;
        check_len("all_gather_varying input", counts[self.rank], input.len())?;
        check_len("all_gather_varying output", counts.iter().sum(), out.len())?;
        let elem = std::mem::size_of::<T>() as u64;
        self.with_comm("all_gather_varying", |comm| {
            let (src, _read) = input.device_ptr(&self.stream);
            let (dst, _write) = out.device_ptr_mut(&self.stream);
            enqueue_group_start()?;
            let mut at = 0u64;
            let mut first_err = None;
            for (root, &c) in counts.iter().enumerate() {
                if c > 0 {
                    let send = if root == self.rank { src } else { 0 };
                    let recv = dst + at * elem;
                    // SAFETY: `dst + at` holds `c` elements of `out`; on the root
                    // `src` holds them.
                    let r = unsafe { self.broadcast_call::<T>(comm, send, recv, c, root) };
                    if let Err(e) = r {
                        first_err.get_or_insert(e);
                    }
                }
                at += c as u64;
            }
            // The group must be closed even after a failed enqueue.
            let end = enqueue_group_end();
            match first_err {
                Some(e) => Err(e),
                None => end,
            }
        })
    }

    /// All-to-all: chunk `s` of `input` goes to rank `s`; chunk `r` of `out` comes from
    /// rank `r`. Grouped `ncclSend`/`ncclRecv` with every peer; this rank's own chunk is
    /// a device-to-device copy on the stream.
    pub fn all_to_all<T: GpuCommElem>(
        &self,
        input: CudaView<'_, T>,
        mut out: CudaViewMut<'_, T>,
    ) -> Result<(), KernelError> {
        check_all_to_all(self.size, input.len(), out.len())?;
        let c = input.len() / self.size;
        let bytes = (c * std::mem::size_of::<T>()) as u64;
        self.with_comm("all_to_all", |comm| {
            let (src, _read) = input.device_ptr(&self.stream);
            let (dst, _write) = out.device_ptr_mut(&self.stream);
            let me = self.rank as u64;
            if c > 0 {
                let (to, from) = (dst + me * bytes, src + me * bytes);
                step_graph::enqueue("memcpy_dtod", &[to, from, bytes], || {
                    // SAFETY: chunk `rank` of both buffers, `bytes` long, inside them.
                    unsafe {
                        cudarc::driver::result::memcpy_dtod_async(
                            to,
                            from,
                            bytes as usize,
                            self.stream.cu_stream(),
                        )
                    }
                    .map_err(drv("all_to_all own chunk"))
                })?;
            }
            if c == 0 || self.size == 1 {
                return Ok(());
            }
            enqueue_group_start()?;
            let mut first_err = None;
            for peer in (0..self.size).filter(|&p| p != self.rank) {
                let p = peer as u64;
                let (send, recv) = (src + p * bytes, dst + p * bytes);
                let (n64, ty, peer64) = (c as u64, T::NCCL as u64, peer as u64);
                // One point-to-point call: `nccl_send` of chunk `peer` of the input or
                // `nccl_recv` into chunk `peer` of the output.
                let p2p = |kind: &'static str, addr: u64| {
                    step_graph::enqueue(kind, &self.sig(comm, [addr, n64, ty, peer64]), || {
                        let (stream, peer) = (self.cu_stream(), peer as i32);
                        // SAFETY: chunk `peer` of each buffer, `c` elements, inside the
                        // buffers.
                        unsafe {
                            if kind == "nccl_send" {
                                nccl_result::send(addr as _, c, T::NCCL, peer, comm, stream)
                            } else {
                                nccl_result::recv(addr as _, c, T::NCCL, peer, comm, stream)
                            }
                        }
                        .map(|_| ())
                        .map_err(nccl("ncclSend/ncclRecv"))
                    })
                };
                let sent = p2p("nccl_send", send);
                let got = p2p("nccl_recv", recv);
                if let Err(e) = sent.and(got) {
                    first_err.get_or_insert(e);
                }
            }
            let end = enqueue_group_end();
            match first_err {
                Some(e) => Err(e),
                None => end,
            }
        })
    }

    /// Breaks the group (`ncclCommAbort`): NCCL kernels waiting for a dead peer exit, and
    /// every later call of this rank fails. Call it on every rank's handle (the
    /// supervisor does, as with the in-process communicator).
    pub fn abort(&self) {
        self.aborted.store(true, Ordering::Release);
        let _call = self.wait_for_calls(ABORT_WAIT);
        let comm = self.comm.swap(std::ptr::null_mut(), Ordering::AcqRel);
        if !comm.is_null() {
            // SAFETY: a live communicator, aborted once (the swap leaves no other owner);
            // later calls find it null. When a call is still inside NCCL, this is the
            // documented way to unblock it. An error leaves nothing to do.
            let _ = unsafe { nccl_result::comm_abort(comm) };
        }
    }

    /// The call lock, if no call holds it for longer than `patience`.
    fn wait_for_calls(&self, patience: Duration) -> Option<MutexGuard<'_, ()>> {
        let start = Instant::now();
        loop {
            match self.calls.try_lock() {
                Ok(g) => return Some(g),
                Err(std::sync::TryLockError::Poisoned(p)) => return Some(p.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) if start.elapsed() < patience => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                Err(std::sync::TryLockError::WouldBlock) => return None,
            }
        }
    }
}

impl Drop for NcclCollectives {
    fn drop(&mut self) {
        let comm = std::mem::replace(self.comm.get_mut(), std::ptr::null_mut());
        if !comm.is_null() {
            let _ = self.stream.context().bind_to_thread();
            // SAFETY: a live communicator, destroyed once, after its last use (we own it).
            // Errors on the way out are not actionable.
            let _ = unsafe { nccl_result::comm_destroy(comm) };
        }
    }
}

/// `ncclGroupStart` as a step operation (a check pass skips it, like the calls inside).
fn enqueue_group_start() -> Result<(), KernelError> {
    step_graph::enqueue("nccl_group_start", &[], || {
        nccl_result::group_start()
            .map(|_| ())
            .map_err(nccl("ncclGroupStart"))
    })
}

/// `ncclGroupEnd` as a step operation.
fn enqueue_group_end() -> Result<(), KernelError> {
    step_graph::enqueue("nccl_group_end", &[], || {
        nccl_result::group_end()
            .map(|_| ())
            .map_err(nccl("ncclGroupEnd"))
    })
}

/// The two NCCL sums ([`GpuCollectives::sum_call`]).
#[derive(Clone, Copy)]
enum Sum {
    AllReduce,
    ReduceScatter,
}
