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
/// [`KvCacheDType`] as raw bytes in rows of `row_len`, and for FP8 the E8M0 scale byte
/// of each row beside them (like the CPU's `KvStore`).
#[derive(Debug)]
pub struct CudaKvBuffer {
    pub(crate) bytes: CudaSlice<u8>,
    /// FP8: one byte per row (one byte, unused, for the other types).
    pub(crate) scales: CudaSlice<u8>,
    pub(crate) len: usize,
    pub(crate) row_len: usize,
    pub(crate) dtype: KvCacheDType,
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
        check_kv_range(buf, &range)?;
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

    /// Values per scaled row for FP8 (`None` for the other types).
    pub fn fp8_row_len(&self) -> Option<usize> {
        self.buf.dtype.is_fp8().then_some(self.buf.row_len)
    }

    /// The FP8 scale bytes of the window's rows (a placeholder byte for the other
    /// types, which kernels do not read).
    pub fn scales(&self) -> CudaView<'a, u8> {
        if !self.buf.dtype.is_fp8() {
            return self.buf.scales.slice(0..1);
        }
        let r = self.buf.row_len;
        self.buf
            .scales
            .slice(self.start / r..(self.start + self.len) / r)
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
    /// FP8: the window's row scales (a placeholder byte for the other types).
    pub(crate) scales: CudaViewMut<'a, u8>,
    pub(crate) len: usize,
    pub(crate) row_len: usize,
    pub(crate) dtype: KvCacheDType,
}

impl<'a> CudaKvMut<'a> {
    pub(crate) fn new(buf: &'a mut CudaKvBuffer, range: Range<usize>) -> Result<Self, KernelError> {
        check_kv_range(buf, &range)?;
        let b = buf.dtype.bytes();
        let r = buf.row_len;
        let scales = if buf.dtype.is_fp8() {
            buf.scales.slice_mut(range.start / r..range.end / r)
        } else {
            buf.scales.slice_mut(0..1)
        };
        Ok(CudaKvMut {
            len: range.end - range.start,
            row_len: r,
            dtype: buf.dtype,
            scales,
            bytes: buf.bytes.slice_mut(range.start * b..range.end * b),
        })
    }

    /// Values per scaled row for FP8 (`None` for the other types).
    pub fn fp8_row_len(&self) -> Option<usize> {
        self.dtype.is_fp8().then_some(self.row_len)
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

/// A KV view's range: inside the buffer and, for FP8, whole rows (as the CPU's).
fn check_kv_range(buf: &CudaKvBuffer, range: &Range<usize>) -> Result<(), KernelError> {
    check_range("KV-cache view", range, buf.len)?;
    if buf.dtype.is_fp8() {
        crate::shape_checks::check_row_aligned("KV-cache view", range, buf.row_len)?;
    }
    Ok(())
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
