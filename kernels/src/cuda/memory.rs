//! The CUDA backend's memory types: f32 buffers and their views, and KV-cache buffers
//! of any [`KvCacheDType`].

use std::ops::Range;

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut};

use crate::error::KernelError;
use crate::kv_dtype::KvCacheDType;

/// A read-only window of a device buffer: the backend's [`DeviceMemory::View`].
///
/// cudarc's [`CudaView`] is not `Copy`, which the trait asks of views, so this holds the
/// buffer and the range and makes a [`CudaView`] on demand ([`CudaRef::cuda`]), e.g. for
/// an NCCL collective.
///
/// [`DeviceMemory::View`]: crate::DeviceMemory::View
#[derive(Debug, Clone, Copy)]
pub struct CudaRef<'a> {
    buf: &'a CudaSlice<f32>,
    start: usize,
    len: usize,
}

impl<'a> CudaRef<'a> {
    /// Elements `range` of `buf`, or an error when the range is outside it.
    pub fn new(buf: &'a CudaSlice<f32>, range: Range<usize>) -> Result<Self, KernelError> {
        check_range("view range", &range, buf.len())?;
        Ok(CudaRef {
            buf,
            start: range.start,
            len: range.end - range.start,
        })
    }

    /// Elements in the view.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the view holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The window as cudarc's view (what kernels, cuBLAS and NCCL take).
    pub fn cuda(&self) -> CudaView<'a, f32> {
        self.buf.slice(self.start..self.start + self.len)
    }
}

pub(crate) fn check_range(
    what: &'static str,
    range: &Range<usize>,
    len: usize,
) -> Result<(), KernelError> {
    if range.start > range.end || range.end > len {
        return Err(KernelError::OutOfRange {
            what,
            value: range.end.max(range.start),
            limit: len + 1,
        });
    }
    Ok(())
}

/// An owned KV-cache buffer on the device (the backend's
/// [`KvStorage::KvBuffer`](crate::KvStorage::KvBuffer)): `len` elements of a
/// [`KvCacheDType`] as raw bytes, with FP8's per-tensor scale (the type's default,
/// like the CPU's `KvStore`).
#[derive(Debug)]
pub struct CudaKvBuffer {
    pub(crate) bytes: CudaSlice<u8>,
    pub(crate) len: usize,
    pub(crate) dtype: KvCacheDType,
    pub(crate) scale: f32,
}

impl CudaKvBuffer {
    /// The element type.
    pub fn dtype(&self) -> KvCacheDType {
        self.dtype
    }

    /// Elements held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the buffer holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The raw storage (`len · dtype.bytes()` bytes).
    pub fn bytes(&self) -> &CudaSlice<u8> {
        &self.bytes
    }
}

/// A read-only window of a [`CudaKvBuffer`].
#[derive(Debug, Clone, Copy)]
pub struct CudaKvRef<'a> {
    buf: &'a CudaKvBuffer,
    start: usize,
    len: usize,
}

impl<'a> CudaKvRef<'a> {
    pub(crate) fn new(buf: &'a CudaKvBuffer, range: Range<usize>) -> Result<Self, KernelError> {
        check_range("KV-cache view", &range, buf.len)?;
        Ok(CudaKvRef {
            buf,
            start: range.start,
            len: range.end - range.start,
        })
    }

    /// Elements in the view.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the view holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The element type.
    pub fn dtype(&self) -> KvCacheDType {
        self.buf.dtype
    }

    /// The FP8 scale (1 for the other types).
    pub fn scale(&self) -> f32 {
        self.buf.scale
    }

    /// The window's bytes.
    pub fn bytes(&self) -> CudaView<'a, u8> {
        let b = self.buf.dtype.bytes();
        self.buf
            .bytes
            .slice(self.start * b..(self.start + self.len) * b)
    }
}

/// A writable window of a [`CudaKvBuffer`].
#[derive(Debug)]
pub struct CudaKvMut<'a> {
    pub(crate) bytes: CudaViewMut<'a, u8>,
    pub(crate) len: usize,
    pub(crate) dtype: KvCacheDType,
    pub(crate) scale: f32,
}

impl<'a> CudaKvMut<'a> {
    pub(crate) fn new(buf: &'a mut CudaKvBuffer, range: Range<usize>) -> Result<Self, KernelError> {
        check_range("KV-cache view", &range, buf.len)?;
        let b = buf.dtype.bytes();
        Ok(CudaKvMut {
            len: range.end - range.start,
            dtype: buf.dtype,
            scale: buf.scale,
            bytes: buf.bytes.slice_mut(range.start * b..range.end * b),
        })
    }

    /// Elements in the view.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the view holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The element type.
    pub fn dtype(&self) -> KvCacheDType {
        self.dtype
    }
}

/// The kernels' number for a KV element type (`KV_*` in `kernels/common.cu`).
pub(crate) fn dtype_code(dt: KvCacheDType) -> i32 {
    match dt {
        KvCacheDType::F32 => 0,
        KvCacheDType::BF16 => 1,
        KvCacheDType::Fp8E4M3 => 2,
        KvCacheDType::Fp8E5M2 => 3,
    }
}
