//! Kernel launches that know their own arguments: [`KernelLaunch`] keeps every
//! argument's value, so one list both launches the kernel and forms its signature for
//! [`step_graph::enqueue`] (a graph is replayed only for a step whose launches have the
//! same signatures, so an argument missing from the signature would be a bug; here it
//! cannot be, since the launch reads the same list).
//!
//! Arguments are kept as 64-bit words; a 4-byte argument (`u32`, `i32`, `f32`) sits in
//! the word's low bytes, where the kernel reads it on a little-endian host (the only
//! kind CUDA supports). A struct of 8-byte fields passed by value takes several
//! consecutive words ([`KernelLaunch::words`]).

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
    /// Where each parameter starts in `words` (one word each, except a struct passed
    /// by value).
    starts: Vec<usize>,
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
            starts: Vec::with_capacity(24),
        }
    }

    /// One parameter of one word.
    fn push(&mut self, w: u64) -> &mut Self {
        self.starts.push(self.words.len());
        self.words.push(w);
        self
    }

    /// A device buffer the kernel reads (its address).
    pub(crate) fn ptr<T>(&mut self, buf: &impl DevicePtr<T>) -> &mut Self {
        let (p, _sync) = buf.device_ptr(self.stream);
        self.push(p)
    }

    /// A device buffer the kernel writes (its address).
    pub(crate) fn ptr_mut<T>(&mut self, buf: &mut impl DevicePtrMut<T>) -> &mut Self {
        let (p, _sync) = buf.device_ptr_mut(self.stream);
        self.push(p)
    }

    /// A device address or any 8-byte integer argument.
    pub(crate) fn u64(&mut self, v: u64) -> &mut Self {
        self.push(v)
    }

    /// A 4-byte unsigned argument.
    pub(crate) fn u32(&mut self, v: u32) -> &mut Self {
        self.push(u64::from(v))
    }

    /// A 4-byte signed argument.
    pub(crate) fn i32(&mut self, v: i32) -> &mut Self {
        self.push(u64::from(v as u32))
    }

    /// A 4-byte float argument.
    pub(crate) fn f32(&mut self, v: f32) -> &mut Self {
        self.push(u64::from(v.to_bits()))
    }

    /// One parameter that is a struct of 8-byte fields passed by value (e.g. an array
    /// of device addresses, `DcpSources` of `cuda_comm/sum.cu`): its words in order,
    /// at least one. The kernel reads them contiguously from the first.
    pub(crate) fn words(&mut self, block: &[u64]) -> &mut Self {
        debug_assert!(!block.is_empty(), "a by-value struct of no words");
        self.starts.push(self.words.len());
        self.words.extend_from_slice(block);
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
        let (words, starts) = (&mut self.words, &self.starts);
        step_graph::enqueue(name, &sig, || {
            stream
                .context()
                .bind_to_thread()
                .map_err(|e| launch_err(name, e))?;
            let base = words.as_mut_ptr();
            // SAFETY: every start is an index into `words` (pushed with its word).
            let mut params: Vec<*mut c_void> = starts
                .iter()
                .map(|&i| unsafe { base.add(i) }.cast::<c_void>())
                .collect();
            // SAFETY: the caller's contract; `params` point into `words`, alive and
            // not moved for the call (the driver copies the values at launch).
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
