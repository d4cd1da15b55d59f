//! Collectives of GPU ranks that are threads of one process, some of them sharing a GPU:
//! device-to-device copies and a fixed-order sum kernel between the ranks' streams, no
//! NCCL (which refuses two ranks of one communicator on one device). Ranks on one GPU
//! read each other's buffers directly; a peer on another GPU is reached by a peer copy
//! (`cuMemcpyPeerAsync`, which needs no peer access to be enabled), and the values a sum
//! needs from such peers are copied next to the summing rank first.
//!
//! One call, on rank `r` of `n`:
//!
//! 1. `ready[r]` is recorded on rank `r`'s stream (its buffer is written), and the
//!    buffer's pointer is published; host barrier A.
//! 2. Rank `r`'s stream waits on the peers' `ready` events (`cuStreamWaitEvent`: a
//!    device-side wait, the host does not block) and runs the copies / the sum kernel,
//!    reading the buffers of peers on its GPU directly (one context: one address space)
//!    and copying those of peers on other GPUs.
//! 3. `done[r]` is recorded; host barrier B; rank `r`'s stream waits on every peer's
//!    `done`, so no rank overwrites its buffer while a peer still reads it.
//!
//! The host only meets the other ranks' threads to swap pointers; it never waits for the
//! GPU. Events are reused from call to call: a wait captures the event's state when it is
//! enqueued, and barrier A of the next call comes after every wait of this one.
//!
//! The meeting on the host cannot be part of a CUDA graph: every call refuses a graph
//! pass ([`crate::step_graph::refuse`]) before it does anything, so a step with one runs
//! eagerly on every rank.
//!
//! Sums run in rank order (`((x0 + x1) + x2) + …`, f32 accumulation, bf16 rounded once),
//! and every rank runs the same kernel on the same inputs: identical bits on every rank.
//! Ranks must be threads of one process (no CUDA IPC between processes here) whose
//! streams live in their device's primary context (`CudaContext::new(ordinal)`, as every
//! rank backend makes it): a kernel may read the peers' buffers only within one context.
//! Events recorded on one GPU's stream may be waited on by another GPU's stream.

use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::{
    CudaContext, CudaEvent, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut,
};

use super::elem::{drv, GpuCommElem};
use super::probe::{check_driver, check_lib, CudaLib};
use super::rendezvous::{Published, Rendezvous};
use super::sum_kernel::{SumKernels, MAX_SOURCES};
use crate::comm::elems::check_all_to_all;
use crate::error::{check_len, KernelError};
use crate::step_graph;

/// Why a device-local collective refuses a graph pass.
const MEETS_ON_HOST: &str = "device-local collectives meet on the host";

/// State shared by the ranks of one group.
struct Shared {
    meet: Rendezvous,
    /// `ready[r]`: rank `r`'s buffer is written. `done[r]`: rank `r` has read its peers'.
    ready: Vec<CudaEvent>,
    done: Vec<CudaEvent>,
    /// Each rank's GPU and context (`CUcontext` as an address), for peer copies.
    places: Vec<(usize, usize)>,
}

/// One rank's handle on a group of ranks sharing one GPU.
pub struct DeviceLocalCollectives {
    shared: Arc<Shared>,
    rank: usize,
    stream: Arc<CudaStream>,
    sums: SumKernels,
    /// The all-reduce's result before it replaces the input (grows, never shrinks).
    scratch: Mutex<Option<CudaSlice<u8>>>,
    /// Copies of the summands of peers on other GPUs (grows, never shrinks).
    staging: Mutex<Option<CudaSlice<u8>>>,
}

/// Checks that the CUDA driver and NVRTC (for the sum kernel) can be loaded.
pub fn device_local_preflight() -> Result<(), KernelError> {
    check_driver()?;
    check_lib(CudaLib::Nvrtc)
}

impl DeviceLocalCollectives {
    /// The handles of a group whose rank `i` enqueues on `streams[i]` (each rank's
    /// backend stream; all on one GPU). Compiles the sum kernel (once per process) and
    /// loads it for every rank.
    pub fn group(streams: &[Arc<CudaStream>]) -> Result<Vec<DeviceLocalCollectives>, KernelError> {
        device_local_preflight()?;
        let n = streams.len();
        if n == 0 || n > MAX_SOURCES {
            return Err(KernelError::Comm(format!(
                "a device-local group has 1..={MAX_SOURCES} ranks, not {n}"
            )));
        }
        let places: Vec<(usize, usize)> = streams
            .iter()
            .map(|s| (s.context().ordinal(), s.context().cu_ctx() as usize))
            .collect();
        for &(ordinal, ctx) in &places {
            if places.iter().any(|&(o, c)| o == ordinal && c != ctx) {
                return Err(KernelError::Comm(format!(
                    "device-local ranks on GPU {ordinal} must share its primary context (CudaContext::new)"
                )));
            }
        }
        let event = |s: &Arc<CudaStream>| {
            s.context()
                .new_event(None)
                .map_err(drv("creating an event"))
        };
        let shared = Arc::new(Shared {
            meet: Rendezvous::new(n),
            ready: streams.iter().map(event).collect::<Result<_, _>>()?,
            done: streams.iter().map(event).collect::<Result<_, _>>()?,
            places,
        });
        streams
            .iter()
            .enumerate()
            .map(|(rank, stream)| {
                Ok(DeviceLocalCollectives {
                    shared: shared.clone(),
                    rank,
                    stream: stream.clone(),
                    sums: SumKernels::load(stream)?,
                    scratch: Mutex::new(None),
                    staging: Mutex::new(None),
                })
            })
            .collect()
    }

    /// A group of `ranks` ranks on GPU `ordinal`, each on a new stream of the device's
    /// primary context: for tests and device checks.
    pub fn on_device(
        ordinal: usize,
        ranks: usize,
    ) -> Result<Vec<DeviceLocalCollectives>, KernelError> {
        device_local_preflight()?;
        let ctx = CudaContext::new(ordinal).map_err(drv("opening the GPU"))?;
        let streams = (0..ranks)
            .map(|_| ctx.new_stream().map_err(drv("creating a stream")))
            .collect::<Result<Vec<_>, _>>()?;
        Self::group(&streams)
    }

    /// This rank's index in the group.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the group.
    pub fn size(&self) -> usize {
        self.shared.ready.len()
    }

    /// The stream every call enqueues on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Opens a group of calls: nothing to fuse here (each call is its own exchange).
    pub fn group_start(&self) {}

    /// Closes a group of calls.
    pub fn group_end(&self) -> Result<(), KernelError> {
        Ok(())
    }

    /// Steps 1–3 of the module doc around `body`, which gets the peers' published
    /// buffers (by rank) once their `ready` events are waited on.
    fn exchange<T: GpuCommElem>(
        &self,
        what: &str,
        mine: Published,
        body: impl FnOnce(&[Published]) -> Result<(), KernelError>,
    ) -> Result<(), KernelError> {
        let sh = &*self.shared;
        let n = self.size();
        let started = self
            .stream
            .context()
            .bind_to_thread()
            .and_then(|()| sh.ready[self.rank].record(&self.stream));
        if let Err(e) = started {
            // The peers would wait at barrier A forever: break the group instead.
            sh.meet.break_group();
            return Err(drv(what)(e));
        }
        sh.meet.publish(self.rank, mine);
        sh.meet.wait()?;
        let peers: Vec<Published> = (0..n).map(|r| sh.meet.slot(r)).collect();
        let elem = std::mem::size_of::<T>();
        let mut result = match peers.iter().position(|p| p.elem_bytes != elem) {
            Some(r) => Err(KernelError::Shape(format!(
                "{what}: rank {r} moves {}-byte elements, rank {} {elem}-byte ones",
                peers[r].elem_bytes, self.rank
            ))),
            None => Ok(()),
        };
        if result.is_ok() {
            result = (0..n)
                .filter(|&r| r != self.rank)
                .try_for_each(|r| self.stream.wait(&sh.ready[r]).map_err(drv(what)));
        }
        if result.is_ok() {
            result = body(&peers);
        }
        // Step 3 runs even after a failed body: the peers are waiting at barrier B.
        let recorded = sh.done[self.rank].record(&self.stream).map_err(drv(what));
        sh.meet.wait()?;
        let waited = (0..n)
            .filter(|&r| r != self.rank)
            .try_for_each(|r| self.stream.wait(&sh.done[r]).map_err(drv(what)));
        result.and(recorded).and(waited)
    }

    /// Enqueues a copy of `bytes` bytes on this rank's stream, into this rank's `dst`
    /// from `src` in rank `from`'s memory (a peer copy when `from` is on another GPU).
    fn copy(&self, dst: u64, from: usize, src: u64, bytes: usize) -> Result<(), KernelError> {
        if bytes == 0 {
            return Ok(());
        }
        let (mine, theirs) = (self.shared.places[self.rank], self.shared.places[from]);
        let peer = mine.0 != theirs.0;
        let kind = if peer { "memcpy_peer" } else { "memcpy_dtod" };
        step_graph::enqueue(kind, &[dst, src, bytes as u64], || {
            // SAFETY: callers pass ranges inside live buffers whose producers were waited
            // on (the `ready` events); the contexts are the ranks' live primary contexts.
            unsafe {
                if !peer {
                    cudarc::driver::result::memcpy_dtod_async(
                        dst,
                        src,
                        bytes,
                        self.stream.cu_stream(),
                    )
                } else {
                    cudarc::driver::sys::cuMemcpyPeerAsync(
                        dst,
                        mine.1 as cudarc::driver::sys::CUcontext,
                        src,
                        theirs.1 as cudarc::driver::sys::CUcontext,
                        bytes,
                        self.stream.cu_stream(),
                    )
                    .result()
                }
            }
            .map_err(drv("device-local copy"))
        })
    }

    /// The addresses the sum kernel reads: the peers' `ptr + offset` (`bytes` long), those
    /// of peers on other GPUs first copied into this rank's staging buffer.
    fn summands(
        &self,
        peers: &[Published],
        offset: u64,
        bytes: usize,
    ) -> Result<Vec<u64>, KernelError> {
        let here = self.shared.places[self.rank].0;
        let remote = (0..peers.len())
            .filter(|&r| self.shared.places[r].0 != here)
            .count();
        if remote == 0 {
            return Ok(peers.iter().map(|p| p.ptr + offset).collect());
        }
        let mut staging = self.staging.lock().unwrap_or_else(PoisonError::into_inner);
        if staging.as_ref().is_none_or(|s| s.len() < remote * bytes) {
            // SAFETY: uninitialized bytes, written by the copies below before the sum.
            *staging = Some(
                unsafe { self.stream.alloc::<u8>(remote * bytes) }
                    .map_err(drv("device-local staging"))?,
            );
        }
        let Some(staging) = staging.as_mut() else {
            return Err(KernelError::Comm("device-local staging missing".into()));
        };
        let (base, _guard) = staging.device_ptr_mut(&self.stream);
        let mut next = base;
        let mut srcs = Vec::with_capacity(peers.len());
        for (r, p) in peers.iter().enumerate() {
            if self.shared.places[r].0 == here {
                srcs.push(p.ptr + offset);
            } else {
                self.copy(next, r, p.ptr + offset, bytes)?;
                srcs.push(next);
                next += bytes as u64;
            }
        }
        Ok(srcs)
    }

    /// `out` = every rank's `input`, concatenated in rank order.
    pub fn all_gather<T: GpuCommElem>(
        &self,
        input: CudaView<'_, T>,
        mut out: CudaViewMut<'_, T>,
    ) -> Result<(), KernelError> {
        step_graph::refuse(MEETS_ON_HOST)?;
        let c = input.len();
        check_len("all_gather output", self.size() * c, out.len())?;
        let es = std::mem::size_of::<T>();
        let (src, _read) = input.device_ptr(&self.stream);
        let (dst, _write) = out.device_ptr_mut(&self.stream);
        let mine = Published {
            ptr: src,
            len: c,
            elem_bytes: es,
        };
        self.exchange::<T>("all_gather", mine, |peers| {
            for (r, p) in peers.iter().enumerate() {
                check_len("all_gather peer input", c, p.len)?;
                self.copy(dst + (r * c * es) as u64, r, p.ptr, c * es)?;
            }
            Ok(())
        })
    }

    /// Element-wise sum over ranks, in place; identical bits on every rank.
    pub fn all_reduce_sum<T: GpuCommElem>(
        &self,
        mut data: CudaViewMut<'_, T>,
    ) -> Result<(), KernelError> {
        step_graph::refuse(MEETS_ON_HOST)?;
        let n = data.len();
        let es = std::mem::size_of::<T>();
        let mut scratch = self.scratch.lock().unwrap_or_else(PoisonError::into_inner);
        if scratch.as_ref().is_none_or(|s| s.len() < n * es) {
            // SAFETY: uninitialized bytes, fully written by the sum before being read.
            *scratch = Some(
                unsafe { self.stream.alloc::<u8>(n * es) }.map_err(drv("all_reduce scratch"))?,
            );
        }
        let Some(scratch) = scratch.as_mut() else {
            return Err(KernelError::Comm("all_reduce scratch missing".into()));
        };
        let (tmp, _tmp_guard) = scratch.device_ptr_mut(&self.stream);
        let (ptr, _write) = data.device_ptr_mut(&self.stream);
        let mine = Published {
            ptr,
            len: n,
            elem_bytes: es,
        };
        // The sum goes to scratch first: the peers still read `data` until barrier B.
        self.exchange::<T>("all_reduce_sum", mine, |peers| {
            for p in peers {
                check_len("all_reduce peer data", n, p.len)?;
            }
            let srcs = self.summands(peers, 0, n * es)?;
            // SAFETY: `tmp` holds n·es bytes, each source n elements, all waited on.
            unsafe { self.sums.launch::<T>(&self.stream, tmp, &srcs, n) }
        })?;
        // After every peer's `done`: nobody reads `data` any more.
        self.copy(ptr, self.rank, tmp, n * es)
    }

    /// Sum over ranks of `input`, of which this rank receives chunk `rank`.
    pub fn reduce_scatter_sum<T: GpuCommElem>(
        &self,
        input: CudaView<'_, T>,
        mut out: CudaViewMut<'_, T>,
    ) -> Result<(), KernelError> {
        step_graph::refuse(MEETS_ON_HOST)?;
        let c = out.len();
        check_len("reduce_scatter input", self.size() * c, input.len())?;
        let es = std::mem::size_of::<T>();
        let (src, _read) = input.device_ptr(&self.stream);
        let (dst, _write) = out.device_ptr_mut(&self.stream);
        let mine = Published {
            ptr: src,
            len: input.len(),
            elem_bytes: es,
        };
        let at = (self.rank * c * es) as u64;
        self.exchange::<T>("reduce_scatter_sum", mine, |peers| {
            for p in peers {
                check_len("reduce_scatter peer input", self.size() * c, p.len)?;
            }
            let srcs = self.summands(peers, at, c * es)?;
            // SAFETY: chunk `rank` of each peer's input and `out` hold c elements.
            unsafe { self.sums.launch::<T>(&self.stream, dst, &srcs, c) }
        })
    }

    /// Copies `root`'s `data` to every rank.
    pub fn broadcast<T: GpuCommElem>(
        &self,
        mut data: CudaViewMut<'_, T>,
        root: usize,
    ) -> Result<(), KernelError> {
        step_graph::refuse(MEETS_ON_HOST)?;
        if root >= self.size() {
            return Err(KernelError::Shape(format!(
                "broadcast root {root} out of range"
            )));
        }
        let n = data.len();
        let es = std::mem::size_of::<T>();
        let (ptr, _write) = data.device_ptr_mut(&self.stream);
        let mine = Published {
            ptr,
            len: n,
            elem_bytes: es,
        };
        self.exchange::<T>("broadcast", mine, |peers| {
            check_len("broadcast root data", n, peers[root].len)?;
            if root != self.rank {
                self.copy(ptr, root, peers[root].ptr, n * es)?;
            }
            Ok(())
        })
    }

    /// Uneven all-gather: rank `r` contributes `counts[r]` values; `out` is their
    /// concatenation (one copy per rank, straight to its offset).
    pub fn all_gather_varying<T: GpuCommElem>(
        &self,
        input: CudaView<'_, T>,
        counts: &[usize],
        mut out: CudaViewMut<'_, T>,
    ) -> Result<(), KernelError> {
        step_graph::refuse(MEETS_ON_HOST)?;
        check_len("all_gather_varying counts", self.size(), counts.len())?;
        check_len("all_gather_varying input", counts[self.rank], input.len())?;
        check_len("all_gather_varying output", counts.iter().sum(), out.len())?;
        let es = std::mem::size_of::<T>();
        let (src, _read) = input.device_ptr(&self.stream);
        let (dst, _write) = out.device_ptr_mut(&self.stream);
        let mine = Published {
            ptr: src,
            len: input.len(),
            elem_bytes: es,
        };
        self.exchange::<T>("all_gather_varying", mine, |peers| {
            let mut at = 0;
            for (r, (p, &c)) in peers.iter().zip(counts).enumerate() {
                check_len("all_gather_varying peer input", c, p.len)?;
                self.copy(dst + (at * es) as u64, r, p.ptr, c * es)?;
                at += c;
            }
            Ok(())
        })
    }

    /// All-to-all: chunk `s` of `input` goes to rank `s`; chunk `r` of `out` comes from
    /// rank `r`.
    pub fn all_to_all<T: GpuCommElem>(
        &self,
        input: CudaView<'_, T>,
        mut out: CudaViewMut<'_, T>,
    ) -> Result<(), KernelError> {
        step_graph::refuse(MEETS_ON_HOST)?;
        let n = self.size();
        check_all_to_all(n, input.len(), out.len())?;
        let c = input.len() / n;
        let es = std::mem::size_of::<T>();
        let (src, _read) = input.device_ptr(&self.stream);
        let (dst, _write) = out.device_ptr_mut(&self.stream);
        let mine = Published {
            ptr: src,
            len: input.len(),
            elem_bytes: es,
        };
        let my_chunk = (self.rank * c * es) as u64;
        self.exchange::<T>("all_to_all", mine, |peers| {
            for (r, p) in peers.iter().enumerate() {
                check_len("all_to_all peer input", n * c, p.len)?;
                self.copy(dst + (r * c * es) as u64, r, p.ptr + my_chunk, c * es)?;
            }
            Ok(())
        })
    }

    /// Breaks the group: every rank waiting in a call, or calling later, fails.
    pub fn abort(&self) {
        self.shared.meet.break_group();
    }
}
