//! A CUDA backend's lanes: one stream (with its own cuBLAS handle) per micro-batch of
//! the rank, and the thread-local choice of the lane a thread's ops go to.
//!
//! A rank with two micro-batches runs one compute thread per micro-batch on one
//! backend. Each thread binds its micro-batch ([`StepQueues::bind_micro_batch`]), and from
//! then on every op it calls is enqueued on that micro-batch's stream: micro-batch 0's
//! collectives (NCCL or device-local copies, built on the same stream) overlap
//! micro-batch 1's kernels on the GPU with no host wait between them. A thread that
//! bound nothing (loading, tests, a one-micro-batch rank) uses lane 0.
//!
//! [`StepQueues::bind_micro_batch`]: crate::StepQueues::bind_micro_batch

use std::cell::Cell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::cublas::{sys as blas_sys, CudaBlas};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};

use crate::cuda::device::driver_err;
use crate::cuda::scratch::Scratch;
use crate::cuda::staging::MetaArena;
use crate::error::KernelError;

/// One micro-batch's stream and what is tied to a stream.
pub(crate) struct Lane {
    pub(crate) stream: Arc<CudaStream>,
    /// cuBLAS handles are not safe to use from two threads at once, and one handle
    /// switched between streams would share its workspace between them: one handle per
    /// lane, locked per GEMM (uncontended: one thread per lane).
    pub(crate) blas: Mutex<CudaBlas>,
    /// The cuBLAS handle's workspace ([`BLAS_WORKSPACE`] bytes), set once at creation.
    /// Declared after `blas`, so it is freed after the handle is destroyed.
    _blas_workspace: CudaSlice<u8>,
    /// The lane's step-metadata staging (pinned host and device arenas).
    pub(crate) meta: Mutex<MetaArena>,
    /// The lane's scratch for op temporaries.
    pub(crate) scratch: Mutex<Scratch>,
}

impl Lane {
    /// A new stream on `ctx` with its cuBLAS handle, metadata arenas and scratch.
    pub(crate) fn new(ctx: &Arc<CudaContext>) -> Result<Lane, KernelError> {
        let stream = ctx
            .new_stream()
            .map_err(|e| driver_err("creating a stream", e))?;
        let blas = CudaBlas::new(stream.clone())
            .map_err(|e| KernelError::Device(format!("creating a cuBLAS handle: {e:?}")))?;
        // The handle's workspace, given to it now: without one, cuBLAS allocates its
        // workspace on first use, which inside a stream capture (a CUDA graph step)
        // would fail. The handle's stream is never changed afterwards:
        // `cublasSetStream` would reset the workspace to cuBLAS's own.
        // SAFETY: cuBLAS's scratch; it writes before it reads.
        let workspace = unsafe { stream.alloc::<u8>(BLAS_WORKSPACE) }
            .map_err(|e| driver_err("allocating the cuBLAS workspace", e))?;
        let status = {
            let (ptr, _sync) = workspace.device_ptr(&stream);
            // SAFETY: a live handle (created above, on this thread's bound context) and
            // a device buffer of `BLAS_WORKSPACE` bytes that outlives it (`Lane` field
            // order).
            unsafe {
                blas_sys::cublasSetWorkspace_v2(
                    *blas.handle(),
                    ptr as usize as *mut c_void,
                    BLAS_WORKSPACE,
                )
            }
        };
        if status != blas_sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Err(KernelError::Device(format!(
                "setting the cuBLAS workspace: {status:?}"
            )));
        }
        Ok(Lane {
            meta: Mutex::new(MetaArena::new(&stream)?),
            scratch: Mutex::new(Scratch::new(&stream)),
            blas: Mutex::new(blas),
            _blas_workspace: workspace,
            stream,
        })
    }
}

/// Bytes of each lane's cuBLAS workspace (what cuBLAS recommends for Hopper GPUs).
const BLAS_WORKSPACE: usize = 32 << 20;

/// Locks `m`, recovering the data of a poisoned lock (a panicking op leaves the lane's
/// state consistent: every field is updated by whole assignments).
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

thread_local! {
    /// `(backend id, lane)` this thread's ops go to; other backends use lane 0.
    static BOUND: Cell<(u64, usize)> = const { Cell::new((0, 0)) };
}

/// Backend ids start at 1, so the unbound `(0, 0)` matches no backend.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A process-unique id for a new backend (its thread-local lane binding is keyed by it).
pub(crate) fn new_backend_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// Sends this thread's later ops of backend `id` to lane `lane`.
pub(crate) fn bind(id: u64, lane: usize) {
    BOUND.with(|b| b.set((id, lane)));
}

/// The lane this thread's ops of backend `id` go to (0 when it bound none).
pub(crate) fn bound(id: u64) -> usize {
    BOUND.with(|b| {
        let (bid, lane) = b.get();
        if bid == id {
            lane
        } else {
            0
        }
    })
}

/// Orders `lanes[lane]` after everything enqueued so far on the other lanes (weights,
/// KV cache and workspaces are written on lane 0 while loading): an event recorded on
/// each other stream and waited for on the device, no host wait.
pub(crate) fn order_after_others(lanes: &[Lane], lane: usize) -> Result<(), KernelError> {
    let me = &lanes[lane].stream;
    for (i, other) in lanes.iter().enumerate() {
        if i != lane {
            me.join(&other.stream)
                .map_err(|e| driver_err("ordering a micro-batch stream", e))?;
        }
    }
    Ok(())
}
