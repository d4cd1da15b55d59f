//! Per-lane device scratch for the temporaries of one op (attention's split partials,
//! bf16 copies of GEMM activations): grown when an op needs more, otherwise reused, so
//! ops do not allocate and free device memory on every call (and a step's ops enqueue
//! no allocation, which a CUDA graph capture would refuse).
//!
//! Reuse is safe because a lane is one stream: the next op's writes run after this
//! op's kernels. A grown buffer replaces the old one, whose stream-ordered free runs
//! after every kernel already enqueued. Each op takes its scratch in one call
//! ([`Scratch::f32s`] / [`Scratch::u16s`]) and splits it itself, so a growth never
//! frees memory an op has already been handed.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};

use crate::cuda::device::driver_err;
use crate::error::KernelError;
use crate::step_graph;

/// One lane's scratch buffers, by element type.
pub(crate) struct Scratch {
    stream: Arc<CudaStream>,
    f32s: Option<CudaSlice<f32>>,
    u16s: Option<CudaSlice<u16>>,
}

impl Scratch {
    /// Empty scratch for `stream` (allocated on first use).
    pub(crate) fn new(stream: &Arc<CudaStream>) -> Scratch {
        Scratch {
            stream: stream.clone(),
            f32s: None,
            u16s: None,
        }
    }

    /// The device address of at least `n` f32s, for kernels of the current op on the
    /// lane's stream (until the lane's next op asks for scratch).
    pub(crate) fn f32s(&mut self, n: usize) -> Result<u64, KernelError> {
        take(&self.stream, &mut self.f32s, n)
    }

    /// The device address of at least `n` u16s (bf16 values); as [`Scratch::f32s`].
    pub(crate) fn u16s(&mut self, n: usize) -> Result<u64, KernelError> {
        take(&self.stream, &mut self.u16s, n)
    }
}

/// `buf`'s address after growing it to at least `n` elements (a little more than asked
/// when it grows, so slowly rising sizes do not reallocate every step).
fn take<T: cudarc::driver::DeviceRepr>(
    stream: &Arc<CudaStream>,
    buf: &mut Option<CudaSlice<T>>,
    n: usize,
) -> Result<u64, KernelError> {
    let n = n.max(1);
    if buf.as_ref().is_none_or(|b| b.len() < n) {
        // Reusing scratch is fine in a graph; growing it allocates (and frees).
        step_graph::refuse_for_now("allocates device scratch")?;
        let len = n.checked_add(n / 4).unwrap_or(n);
        // SAFETY: scratch is written by an op's kernel before it reads it. The old
        // buffer (dropped by the assignment) is freed in stream order, after the
        // kernels already enqueued that used it.
        let fresh =
            unsafe { stream.alloc::<T>(len) }.map_err(|e| driver_err("allocating scratch", e))?;
        *buf = Some(fresh);
    }
    let b = buf.as_ref().expect("allocated above");
    Ok(b.device_ptr(stream).0)
}
