//! The GPU collectives as the rank-side [`Collectives`] of the CUDA backend: one
//! forwarding call per method, on f32 views. The collectives enqueue on the stream
//! they were built with, which is the stream of the micro-batch whose thread calls them
//! (checked in debug builds), so the backend handle itself is not needed.

use std::sync::Arc;

use super::GpuCollectives;
use crate::comm::Collectives;
use crate::cuda::{CudaBackend, CudaRef};
use crate::error::KernelError;
use cudarc::driver::CudaViewMut;

/// Checks that the collective runs on the stream of the calling thread's ops; in a
/// graph pass a collective on another stream would not be captured, so it refuses.
fn same_stream(dev: &CudaBackend, c: &GpuCollectives) -> Result<(), KernelError> {
    if Arc::ptr_eq(dev.stream(), c.stream()) {
        return Ok(());
    }
    debug_assert!(
        false,
        "GPU collectives built on another stream than the rank backend's"
    );
    crate::step_graph::refuse("runs a collective on another stream")
}

impl Collectives<CudaBackend> for GpuCollectives {
    fn rank(&self) -> usize {
        GpuCollectives::rank(self)
    }
    fn size(&self) -> usize {
        GpuCollectives::size(self)
    }
    fn group_start(&self) {
        GpuCollectives::group_start(self)
    }
    fn group_end(&self) -> Result<(), KernelError> {
        GpuCollectives::group_end(self)
    }
    fn all_gather(
        &self,
        dev: &CudaBackend,
        input: CudaRef<'_>,
        out: CudaViewMut<'_, f32>,
    ) -> Result<(), KernelError> {
        same_stream(dev, self)?;
        GpuCollectives::all_gather::<f32>(self, input.cuda(), out)
    }
    fn all_reduce_sum(
        &self,
        dev: &CudaBackend,
        data: CudaViewMut<'_, f32>,
    ) -> Result<(), KernelError> {
        same_stream(dev, self)?;
        GpuCollectives::all_reduce_sum::<f32>(self, data)
    }
    fn reduce_scatter_sum(
        &self,
        dev: &CudaBackend,
        input: CudaRef<'_>,
        out: CudaViewMut<'_, f32>,
    ) -> Result<(), KernelError> {
        same_stream(dev, self)?;
        GpuCollectives::reduce_scatter_sum::<f32>(self, input.cuda(), out)
    }
    fn all_gather_varying(
        &self,
        dev: &CudaBackend,
        input: CudaRef<'_>,
        counts: &[usize],
        out: CudaViewMut<'_, f32>,
    ) -> Result<(), KernelError> {
        same_stream(dev, self)?;
        GpuCollectives::all_gather_varying::<f32>(self, input.cuda(), counts, out)
    }
    fn all_to_all(
        &self,
        dev: &CudaBackend,
        input: CudaRef<'_>,
        out: CudaViewMut<'_, f32>,
    ) -> Result<(), KernelError> {
        same_stream(dev, self)?;
        GpuCollectives::all_to_all::<f32>(self, input.cuda(), out)
    }
    fn abort(&self) {
        GpuCollectives::abort(self)
    }
}
