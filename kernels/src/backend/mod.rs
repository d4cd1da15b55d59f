//! The device seam: [`Backend`] owns buffers and runs every op a forward pass needs.
//!
//! In the spirit of candle's `BackendDevice` / `BackendStorage` split, the seam is a few
//! small traits, each one job, and [`Backend`] is their umbrella, the bound callers use:
//!
//! * memory ([`memory`]): [`DeviceMemory`] (f32 buffers, their views, host transfers),
//!   [`KvStorage`] (KV-cache buffers in a [`KvCacheDType`](crate::KvCacheDType)) and
//!   [`WeightStorage`] (weight matrices in any [`DType`](crate::DType), RoPE tables);
//! * queues ([`queues`]): [`StepQueues`], the micro-batch a thread's ops go to and the
//!   step graphs a device replays;
//! * ops, each trait with the vocabulary its calls are asked in: [`DenseOps`]
//!   ([`dense`]: products, norms, activations, copies, RoPE), [`AttentionOps`]
//!   ([`attention`]: KV stores, paged and latent attention over a [`PagedBatch`], the
//!   log-sum-exp merge) and [`SamplingOps`] ([`sampling`]: MoE routing, argmax,
//!   sampling).
//!
//! Shapes and step metadata (token positions, block tables, KV slots) stay host slices:
//! they are small, the scheduler produces them on the host, and a device backend uploads
//! them once per call (or per step). The host form of weights ([`WeightMatrix`]) and
//! RoPE scaling ([`RopeScalingKind`]) live here too, so that nothing below this seam is
//! needed to describe it.
//!
//! Backends:
//! * [`CpuBackend`](crate::CpuBackend) (`kernels/src/cpu/`): host memory, the buffer is
//!   a `Vec<f32>` and views are plain slices, so every op is a direct call of today's
//!   CPU kernel with no copy.
//! * [`CudaBackend`](crate::CudaBackend) (`kernels/src/cuda/`): buffers are
//!   cudarc `CudaSlice<f32>` with `CudaRef` (a `Copy` handle making `CudaView`s) /
//!   `CudaViewMut` as the view types, weights as f32 or bf16
//!   (GGML formats decoded to bf16 at upload), matmul through cuBLAS, and the
//!   remaining ops as NVRTC-compiled kernels launched on the rank's stream. Its arm
//!   of [`test_on_every_backend!`](crate::test_on_every_backend) runs every op test
//!   below where a GPU is present and prints `skipped` elsewhere.
//!
//! Collectives are not part of this seam: they belong to the
//! [`Communicator`](crate::Communicator), which an NCCL (GPU) or MPI (between
//! processes) implementation replaces.

pub mod attention;
pub mod dense;
pub mod memory;
pub mod queues;
pub mod rope;
pub mod sampling;
#[cfg(test)]
mod tests;
pub mod weights;

pub use attention::{AttentionOps, LatentAttentionParams, PagedAttentionParams, PagedBatch};
pub use dense::{DenseOps, Precision, Strided};
pub use memory::{DeviceMemory, KvStorage, WeightStorage};
pub use queues::StepQueues;
pub use rope::{yarn_mscale, RopeScalingKind, YarnParams};
pub use sampling::{Rng, RouterParams, RouterScoring, Routing, RowDraw, RowDrawn, SamplingOps};
pub use weights::{SharedBytes, WeightMatrix};

/// A compute device: its memory, its queues and the ops of a transformer forward pass.
/// Every backend gets it from implementing the parts; generic code bounds on it
/// (`B: Backend`) and calls any part's methods.
///
/// Every op validates its arguments and returns [`KernelError`](crate::KernelError) on a
/// mismatch rather than panicking. Code naming a concrete backend (`CpuBackend`) calls
/// a part's methods with that part in scope (`use dcpserve_kernels::DeviceMemory`).
///
/// ```
/// use dcpserve_kernels::{Backend, CpuBackend, Precision, WeightMatrix};
/// // Generic over the device, as the model is.
/// fn project<B: Backend>(dev: &B, w: &WeightMatrix, x: &[f32]) -> Vec<f32> {
///     let w = dev.upload_matrix(w).unwrap();
///     let x = dev.upload(x).unwrap();
///     let mut y = dev.zeros(2).unwrap();
///     dev.matmul(dev.view(&x, 0..2).unwrap(), 1, &w, dev.view_mut(&mut y, 0..2).unwrap(),
///         Precision::Exact).unwrap();
///     let mut host = vec![0.0; 2];
///     dev.download(dev.view(&y, 0..2).unwrap(), &mut host).unwrap();
///     host
/// }
/// let w = WeightMatrix::from_f32(2, 2, vec![1.0, 0.0, 1.0, 1.0]).unwrap();
/// assert_eq!(project(&CpuBackend::new(1), &w, &[3.0, 4.0]), [3.0, 7.0]);
/// ```
pub trait Backend:
    DeviceMemory + KvStorage + WeightStorage + StepQueues + DenseOps + AttentionOps + SamplingOps
{
}

impl<T> Backend for T where
    T: DeviceMemory
        + KvStorage
        + WeightStorage
        + StepQueues
        + DenseOps
        + AttentionOps
        + SamplingOps
{
}

/// A backend whose views are host memory, so a host
/// [`Communicator`](crate::Communicator) (shared memory, MPI) can move its buffers:
/// [`HostCollectives`](crate::HostCollectives) relies on it. A CUDA backend does not
/// implement it; its collectives (NCCL) take device views directly.
pub trait HostViews: Backend {
    /// The host slice behind a view.
    fn host<'a>(v: Self::View<'a>) -> &'a [f32]
    where
        Self: 'a;
    /// The writable host slice behind a view.
    fn host_mut<'a>(v: Self::ViewMut<'a>) -> &'a mut [f32]
    where
        Self: 'a;
    /// A host slice as a view.
    fn of_host<'a>(s: &'a [f32]) -> Self::View<'a>
    where
        Self: 'a;
    /// A writable host slice as a view.
    fn of_host_mut<'a>(s: &'a mut [f32]) -> Self::ViewMut<'a>
    where
        Self: 'a;
}

/// Runs generic test bodies on every backend present: for each `name`, a module `name`
/// with one `#[test]` per backend calling `name(&backend)`, where `name` is a
/// `fn<B: Backend>(&B)` in the invoking module. CPU always; CUDA on device 0 where a
/// driver and a GPU are present, otherwise its test prints
/// `skipped: no CUDA device (<reason>)` to stderr and passes.
///
/// ```
/// use dcpserve_kernels::{test_on_every_backend, Backend, CpuBackend};
/// fn zeros_are_zero<B: Backend>(dev: &B) {
///     let b = dev.zeros(3).unwrap();
///     let mut host = [1.0; 3];
///     dev.download(dev.view(&b, 0..3).unwrap(), &mut host).unwrap();
///     assert_eq!(host, [0.0; 3]);
/// }
/// test_on_every_backend!(zeros_are_zero); // in a test build: `zeros_are_zero::cpu`
/// fn main() {
///     zeros_are_zero(&CpuBackend::new(1));
/// }
/// ```
#[macro_export]
macro_rules! test_on_every_backend {
    ($($name:ident),+ $(,)?) => {
        $(
            #[allow(non_snake_case)]
            mod $name {
                #[test]
                fn cpu() {
                    super::$name(&$crate::CpuBackend::new(2));
                }

                #[test]
                fn cuda() {
                    // Exact products, so `Precision::Exact` means what it does on the CPU.
                    match $crate::cuda::CudaBackend::new(0)
                        .map(|d| d.with_gpu_matmul($crate::GpuMatmul::Exact))
                    {
                        Ok(dev) => super::$name(&dev),
                        Err($crate::KernelError::Unavailable(why)) => {
                            // Straight to stderr, past the harness's capture.
                            use ::std::io::Write as _;
                            let _ = ::std::writeln!(
                                ::std::io::stderr(),
                                "skipped: no CUDA device ({why})"
                            );
                        }
                        Err(e) => panic!("CUDA backend failed to start: {e}"),
                    }
                }
            }
        )+
    };
}
