//! Kernel launches that know their own arguments: [`KernelLaunch`] keeps every
//! argument's value, so one list both launches the kernel and forms its signature for
//! [`step_graph::enqueue`] (a graph is replayed only for a step whose launches have the
//! same signatures, so an argument missing from the signature would be a bug; here it
//! cannot be, since the launch reads the same list).
//!
//! Arguments are kept as 64-bit words; a 4-byte argument (`u32`, `i32`, `f32`) sits in
//! the word's low bytes, where the kernel reads it on a little-endian host (the only
//! kind CUDA supports).

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig};

use crate::cuda::launch_err;
use crate::error::KernelError;
use crate::step_graph;

/// One kernel launch being assembled: its function, stream and argument words.
pub(crate) struct KernelLaunch<'a> {
    name: &'static str,
    func: &'a CudaFunction,
    stream: &'a Arc<CudaStream>,
    words: Vec<u64>,
}

impl<'a> KernelLaunch<'a> {
    /// A launch of `func` (kernel `name`) on `stream`, no arguments yet.
    pub(crate) fn new(
        name: &'static str,
        func: &'a CudaFunction,
        stream: &'a Arc<CudaStream>,
    ) -> Self {
        KernelLaunch {
            name,
            func,
            stream,
            words: Vec::with_capacity(24),
        }
    }

    /// A device buffer the kernel reads (its address).
    pub(crate) fn ptr<T>(&mut self, buf: &impl DevicePtr<T>) -> &mut Self {
        let (p, _sync) = buf.device_ptr(self.stream);
        self.words.push(p);
        self
    }

    /// A device buffer the kernel writes (its address).
    pub(crate) fn ptr_mut<T>(&mut self, buf: &mut impl DevicePtrMut<T>) -> &mut Self {
        let (p, _sync) = buf.device_ptr_mut(self.stream);
        self.words.push(p);
        self
    }

    /// A device address or any 8-byte integer argument.
    pub(crate) fn u64(&mut self, v: u64) -> &mut Self {
        self.words.push(v);
        self
    }

    /// A 4-byte unsigned argument.
    pub(crate) fn u32(&mut self, v: u32) -> &mut Self {
        self.words.push(u64::from(v));
        self
    }

    /// A 4-byte signed argument.
    pub(crate) fn i32(&mut self, v: i32) -> &mut Self {
        self.words.push(u64::from(v as u32));
        self
    }

    /// A 4-byte float argument.
    pub(crate) fn f32(&mut self, v: f32) -> &mut Self {
        self.words.push(u64::from(v.to_bits()));
        self
    }

    /// Launches with `cfg` (or, in a graph check pass, only records the signature).
    ///
    /// # Safety
    /// The arguments must match the kernel's parameters in number, order and size, and
    /// the buffers must hold what the kernel reads and writes for `cfg`.
    pub(crate) unsafe fn launch(&mut self, cfg: LaunchConfig) -> Result<(), KernelError> {
        let (g, b) = (cfg.grid_dim, cfg.block_dim);
        let mut sig = self.words.clone();
        sig.extend([g.0, g.1, g.2, b.0, b.1, b.2, cfg.shared_mem_bytes].map(u64::from));
        let (name, func, stream) = (self.name, self.func, self.stream);
        let words = &mut self.words;
        step_graph::enqueue(name, &sig, || {
            stream
                .context()
                .bind_to_thread()
                .map_err(|e| launch_err(name, e))?;
            let mut params: Vec<*mut c_void> = words
                .iter_mut()
                .map(|w| (w as *mut u64).cast::<c_void>())
                .collect();
            // SAFETY: the caller's contract; `params` point into `words`, alive for
            // the call (the driver copies the values at launch).
            unsafe {
                cudarc::driver::result::launch_kernel(
                    func.cu_function(),
                    cfg.grid_dim,
                    cfg.block_dim,
                    cfg.shared_mem_bytes,
                    stream.cu_stream(),
                    &mut params,
                )
            }
            .map_err(|e| launch_err(name, e))
        })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn four_byte_arguments_sit_in_the_low_bytes() {
        // What the kernel reads through a pointer to the word: its first 4 bytes.
        let w = u64::from(1.5f32.to_bits());
        let first = u32::from_ne_bytes(w.to_ne_bytes()[..4].try_into().unwrap());
        assert_eq!(f32::from_bits(first), 1.5);
        let w = u64::from(-3i32 as u32);
        let first = u32::from_ne_bytes(w.to_ne_bytes()[..4].try_into().unwrap());
        assert_eq!(first as i32, -3);
    }
}
