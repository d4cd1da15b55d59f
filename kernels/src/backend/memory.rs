//! The device's memory: f32 buffers and views of them ([`DeviceMemory`]), KV-cache
//! buffers in a [`KvCacheDType`] ([`KvStorage`]), and the read-only data a model uploads
//! once, weight matrices and RoPE tables ([`WeightStorage`]).

use std::ops::Range;

use super::rope::RopeScalingKind;
use super::weights::WeightMatrix;
use crate::dtype::DType;
use crate::error::KernelError;
use crate::kv_dtype::KvCacheDType;

/// Buffers of f32 elements (activations, norms' weights) and the views ops work on.
///
/// A buffer is addressed through views ([`DeviceMemory::view`],
/// [`DeviceMemory::view_mut`]) so an op can work on part of one.
///
/// ```
/// use dcpserve_kernels::{CpuBackend, DeviceMemory};
/// let dev = CpuBackend::new(1);
/// let b = dev.upload(&[1.0, 2.0, 3.0]).unwrap();
/// let mut host = [0.0; 2];
/// dev.download(dev.view(&b, 1..3).unwrap(), &mut host).unwrap();
/// assert_eq!(host, [2.0, 3.0]);
/// ```
pub trait DeviceMemory: Send + Sync {
    /// An owned device buffer of f32 elements.
    type Buffer: Send + Sync;
    /// A read-only window of a buffer.
    type View<'a>: Copy
    where
        Self: 'a;
    /// A writable window of a buffer.
    type ViewMut<'a>
    where
        Self: 'a;

    /// Short name for logs and test names (`"cpu"`, `"cuda"`).
    fn name(&self) -> &'static str;
    /// A buffer of `len` zeros.
    fn zeros(&self, len: usize) -> Result<Self::Buffer, KernelError>;
    /// A buffer of `len` elements whose contents are unspecified (the caller writes
    /// before it reads; a device backend skips the clearing).
    fn alloc(&self, len: usize) -> Result<Self::Buffer, KernelError>;
    /// A buffer holding a copy of `host`.
    fn upload(&self, host: &[f32]) -> Result<Self::Buffer, KernelError>;
    /// Copies `src` into `host` (`host.len()` must equal the view's length).
    fn download(&self, src: Self::View<'_>, host: &mut [f32]) -> Result<(), KernelError>;
    /// Elements in `buf`.
    fn len(&self, buf: &Self::Buffer) -> usize;
    /// Elements in a view.
    fn view_len(&self, v: Self::View<'_>) -> usize;
    /// Elements `range` of `buf`, read-only.
    fn view<'a>(
        &self,
        buf: &'a Self::Buffer,
        range: Range<usize>,
    ) -> Result<Self::View<'a>, KernelError>;
    /// Elements `range` of `buf`, writable.
    fn view_mut<'a>(
        &self,
        buf: &'a mut Self::Buffer,
        range: Range<usize>,
    ) -> Result<Self::ViewMut<'a>, KernelError>;
}

/// KV-cache buffers: elements stored in a chosen [`KvCacheDType`] (f32, bf16 or FP8 with
/// a scale per row), converted by the attention ops on store and on read.
pub trait KvStorage: DeviceMemory {
    /// An owned KV-cache buffer.
    type KvBuffer: Send + Sync;
    /// A read-only window of a KV-cache buffer.
    type KvView<'a>: Copy
    where
        Self: 'a;
    /// A writable window of a KV-cache buffer.
    type KvViewMut<'a>
    where
        Self: 'a;

    /// A KV-cache buffer of `len` zero elements of `dtype`, in rows of `row_len` values
    /// (one KV head's `head_dim`, or MLA's latent width): FP8 keeps one scale per row
    /// beside the codes, so for FP8 `row_len` must divide `len`, views must cover whole
    /// rows, and attention must read rows of exactly `row_len`.
    fn kv_zeros(
        &self,
        dtype: KvCacheDType,
        len: usize,
        row_len: usize,
    ) -> Result<Self::KvBuffer, KernelError>;
    /// Elements in a KV-cache buffer.
    fn kv_len(&self, buf: &Self::KvBuffer) -> usize;
    /// Elements `range` of a KV-cache buffer, read-only.
    fn kv_view<'a>(
        &self,
        buf: &'a Self::KvBuffer,
        range: Range<usize>,
    ) -> Result<Self::KvView<'a>, KernelError>;
    /// Elements `range` of a KV-cache buffer, writable.
    fn kv_view_mut<'a>(
        &self,
        buf: &'a mut Self::KvBuffer,
        range: Range<usize>,
    ) -> Result<Self::KvViewMut<'a>, KernelError>;
    /// Copies a KV-cache view into `host`, converted to f32 (tests and diagnostics).
    fn kv_download(&self, src: Self::KvView<'_>, host: &mut [f32]) -> Result<(), KernelError>;
}

/// The read-only data a model places on the device once: weight matrices in any
/// [`DType`] and RoPE tables.
pub trait WeightStorage: DeviceMemory {
    /// A weight matrix `[rows, cols]` in device memory, stored in its [`DType`].
    type Matrix: Send + Sync;
    /// RoPE cos/sin tables in device memory.
    type Rope: Send + Sync;

    /// Places a host weight matrix on the device, keeping its [`DType`].
    fn upload_matrix(&self, w: &WeightMatrix) -> Result<Self::Matrix, KernelError>;
    /// `(rows, cols, dtype)` of a device matrix, `dtype` being the host format it was
    /// uploaded from.
    fn matrix_shape(&self, w: &Self::Matrix) -> (usize, usize, DType);
    /// The element type the device keeps a matrix in, whose values products and
    /// gathers use: the uploaded format on the CPU; `F32` or `BF16` on CUDA, which
    /// decodes every other format to bf16 at upload.
    fn matrix_storage(&self, w: &Self::Matrix) -> DType {
        self.matrix_shape(w).2
    }
    /// RoPE tables for `head_dim`-wide vectors (Hugging Face `rope_theta` and
    /// `rope_scaling`, incl. YaRN), precomputed for positions `0..max_positions`.
    fn rope_table(
        &self,
        head_dim: usize,
        theta: f32,
        scaling: RopeScalingKind,
        max_positions: usize,
    ) -> Result<Self::Rope, KernelError>;
}
