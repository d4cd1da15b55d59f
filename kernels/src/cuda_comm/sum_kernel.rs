//! The device-local sum kernel (`sum.cu`): compiled once per process by NVRTC, loaded
//! once per rank's context, launched on the rank's stream.

use std::sync::{Arc, OnceLock};

use cudarc::driver::{CudaFunction, CudaStream, LaunchConfig};
use cudarc::nvrtc::Ptx;

use super::elem::{drv, GpuCommElem};
use super::probe::{check_lib, CudaLib};
use crate::cuda::KernelLaunch;
use crate::error::KernelError;

/// The kernel source, kept in its own file so it can be compiled and read as CUDA C.
pub const SUM_SOURCE: &str = include_str!("sum.cu");

/// Sources one launch sums (`DCP_MAX_SOURCES` in `sum.cu`): ranks sharing one GPU.
pub const MAX_SOURCES: usize = 16;

/// NVRTC's PTX of [`SUM_SOURCE`], compiled on first use (a failure is kept: it will not
/// succeed on a second try in the same process). Needs NVRTC only, no driver or GPU.
pub(crate) fn ptx() -> Result<&'static Ptx, KernelError> {
    static PTX: OnceLock<Result<Ptx, String>> = OnceLock::new();
    PTX.get_or_init(|| {
        check_lib(CudaLib::Nvrtc).map_err(|e| e.to_string())?;
        cudarc::nvrtc::compile_ptx(SUM_SOURCE).map_err(|e| format!("NVRTC compiling sum.cu: {e:?}"))
    })
    .as_ref()
    .map_err(|e| KernelError::Comm(e.clone()))
}

/// The sum kernels, loaded into one rank's context.
pub(crate) struct SumKernels {
    f32: CudaFunction,
    bf16: CudaFunction,
}

impl SumKernels {
    /// Loads the module into `stream`'s context.
    pub(crate) fn load(stream: &Arc<CudaStream>) -> Result<Self, KernelError> {
        let module = stream
            .context()
            .load_module(ptx()?.clone())
            .map_err(drv("loading the sum kernel"))?;
        Ok(Self {
            f32: module
                .load_function(<f32 as GpuCommElem>::SUM_KERNEL)
                .map_err(drv("dcp_sum_f32"))?,
            bf16: module
                .load_function(<half::bf16 as GpuCommElem>::SUM_KERNEL)
                .map_err(drv("dcp_sum_bf16"))?,
        })
    }

    /// Enqueues `out[i] = Σ_s srcs[s][i]` (in the order of `srcs`) for `n` elements of `T`
    /// on `stream`.
    ///
    /// # Safety
    /// `out` and every `srcs[s]` must be device pointers of this context holding `n`
    /// elements of `T`, alive and not written by other work until the launch completes.
    pub(crate) unsafe fn launch<T: GpuCommElem>(
        &self,
        stream: &Arc<CudaStream>,
        out: u64,
        srcs: &[u64],
        n: usize,
    ) -> Result<(), KernelError> {
        if srcs.is_empty() || srcs.len() > MAX_SOURCES {
            return Err(KernelError::Comm(format!(
                "device-local sum of {} sources (1..={MAX_SOURCES} supported)",
                srcs.len()
            )));
        }
        if n == 0 {
            return Ok(());
        }
        // `DcpSources` of `sum.cu`: the sources' device pointers, passed by value as
        // one kernel parameter of MAX_SOURCES words (128 bytes, well under the 4 KiB
        // parameter limit).
        let mut sources = [0u64; MAX_SOURCES];
        sources[..srcs.len()].copy_from_slice(srcs);
        let func = if T::SUM_KERNEL == <f32 as GpuCommElem>::SUM_KERNEL {
            &self.f32
        } else {
            &self.bf16
        };
        let n_src = srcs.len() as i32;
        let n64 = n as u64;
        // A grid-stride loop: 1024 blocks of 256 threads cover any size.
        let blocks = n.div_ceil(256).clamp(1, 1024) as u32;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut launch = KernelLaunch::new(T::SUM_KERNEL, func, stream);
        launch.u64(out).words(&sources).i32(n_src).u64(n64);
        // SAFETY: argument types and order match the kernel's signature; the caller
        // vouches for the pointers.
        unsafe { launch.launch(cfg) }
    }
}
