//! The CPU's KV-cache storage: elements in a [`KvCacheDType`], and views that convert
//! rows to f32 where a kernel reads them ([`KvRef::decode`]) and from f32 where one
//! stores them ([`KvMut::encode`]). Attention kernels decode only the rows of the keys
//! they are about to use, into a scratch of a few rows, so a narrow cache is streamed
//! from memory in its narrow form.

use std::ops::Range;
use std::sync::OnceLock;

use crate::error::KernelError;
use crate::kv_dtype::{bf16_to_f32, f32_to_bf16, KvCacheDType};

/// An owned KV-cache buffer (the CPU backend's [`KvStorage::KvBuffer`](crate::KvStorage::KvBuffer)).
///
/// ```
/// use dcpserve_kernels::cpu::kv_store::KvStore;
/// use dcpserve_kernels::KvCacheDType;
/// let mut s = KvStore::zeros(KvCacheDType::BF16, 4);
/// s.view_mut(0..4).encode(1, &[1.5, -2.0]);
/// let mut back = [9.0; 4];
/// s.view(0..4).decode(0, &mut back);
/// assert_eq!(back, [0.0, 1.5, -2.0, 0.0]);
/// assert_eq!(s.bytes(), 8);
/// ```
#[derive(Debug, Clone)]
pub struct KvStore {
    dtype: KvCacheDType,
    scale: f32,
    data: KvData,
}

#[derive(Debug, Clone)]
enum KvData {
    F32(Vec<f32>),
    Bf16(Vec<u16>),
    Fp8(Vec<u8>),
}

/// A read-only window of a [`KvStore`] (or of f32 host memory).
#[derive(Debug, Clone, Copy)]
pub enum KvRef<'a> {
    /// f32 elements.
    F32(&'a [f32]),
    /// bf16 bits.
    Bf16(&'a [u16]),
    /// FP8 codes of `dtype`, value `code · scale`.
    Fp8 {
        codes: &'a [u8],
        dtype: KvCacheDType,
        scale: f32,
    },
}

/// A writable window of a [`KvStore`] (or of f32 host memory).
#[derive(Debug)]
pub enum KvMut<'a> {
    /// f32 elements.
    F32(&'a mut [f32]),
    /// bf16 bits.
    Bf16(&'a mut [u16]),
    /// FP8 codes of `dtype`, stored as `x / scale`.
    Fp8 {
        codes: &'a mut [u8],
        dtype: KvCacheDType,
        scale: f32,
    },
}

impl KvStore {
    /// `len` zero elements of `dtype` (zeroed pages: untouched ones cost no RAM), with
    /// the type's default scale.
    pub fn zeros(dtype: KvCacheDType, len: usize) -> Self {
        let data = match dtype {
            KvCacheDType::F32 => KvData::F32(vec![0.0; len]),
            KvCacheDType::BF16 => KvData::Bf16(vec![0; len]),
            KvCacheDType::Fp8E4M3 | KvCacheDType::Fp8E5M2 => KvData::Fp8(vec![0; len]),
        };
        KvStore {
            dtype,
            scale: dtype.default_scale(),
            data,
        }
    }

    /// The element type.
    pub fn dtype(&self) -> KvCacheDType {
        self.dtype
    }

    /// Elements held.
    pub fn len(&self) -> usize {
        match &self.data {
            KvData::F32(v) => v.len(),
            KvData::Bf16(v) => v.len(),
            KvData::Fp8(v) => v.len(),
        }
    }

    /// True when the buffer holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of storage.
    pub fn bytes(&self) -> usize {
        self.len() * self.dtype.bytes()
    }

    /// Elements `range`, read-only. Panics when out of bounds (see
    /// [`KvStore::checked_view`]).
    pub fn view(&self, range: Range<usize>) -> KvRef<'_> {
        match &self.data {
            KvData::F32(v) => KvRef::F32(&v[range]),
            KvData::Bf16(v) => KvRef::Bf16(&v[range]),
            KvData::Fp8(v) => KvRef::Fp8 {
                codes: &v[range],
                dtype: self.dtype,
                scale: self.scale,
            },
        }
    }

    /// Elements `range`, writable. Panics when out of bounds.
    pub fn view_mut(&mut self, range: Range<usize>) -> KvMut<'_> {
        match &mut self.data {
            KvData::F32(v) => KvMut::F32(&mut v[range]),
            KvData::Bf16(v) => KvMut::Bf16(&mut v[range]),
            KvData::Fp8(v) => KvMut::Fp8 {
                codes: &mut v[range],
                dtype: self.dtype,
                scale: self.scale,
            },
        }
    }

    /// [`KvStore::view`], or an error when `range` is outside the buffer.
    pub fn checked_view(&self, range: Range<usize>) -> Result<KvRef<'_>, KernelError> {
        check_range(&range, self.len())?;
        Ok(self.view(range))
    }

    /// [`KvStore::view_mut`], or an error when `range` is outside the buffer.
    pub fn checked_view_mut(&mut self, range: Range<usize>) -> Result<KvMut<'_>, KernelError> {
        check_range(&range, self.len())?;
        Ok(self.view_mut(range))
    }
}

fn check_range(range: &Range<usize>, len: usize) -> Result<(), KernelError> {
    if range.start > range.end || range.end > len {
        return Err(KernelError::OutOfRange {
            what: "KV-cache view",
            value: range.end.max(range.start),
            limit: len + 1,
        });
    }
    Ok(())
}

/// Decoding tables of the two FP8 formats (unscaled).
fn fp8_table(dtype: KvCacheDType) -> &'static [f32; 256] {
    static E4M3: OnceLock<[f32; 256]> = OnceLock::new();
    static E5M2: OnceLock<[f32; 256]> = OnceLock::new();
    match dtype {
        KvCacheDType::Fp8E5M2 => E5M2.get_or_init(|| dtype.fp8_table()),
        _ => E4M3.get_or_init(|| KvCacheDType::Fp8E4M3.fp8_table()),
    }
}

impl<'a> KvRef<'a> {
    /// The element type.
    pub fn dtype(&self) -> KvCacheDType {
        match self {
            KvRef::F32(_) => KvCacheDType::F32,
            KvRef::Bf16(_) => KvCacheDType::BF16,
            KvRef::Fp8 { dtype, .. } => *dtype,
        }
    }

    /// Elements in the view.
    pub fn len(&self) -> usize {
        match self {
            KvRef::F32(v) => v.len(),
            KvRef::Bf16(v) => v.len(),
            KvRef::Fp8 { codes, .. } => codes.len(),
        }
    }

    /// True when the view holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The f32 elements, when the cache stores f32 (kernels then read it in place).
    #[inline(always)]
    pub fn as_f32(&self) -> Option<&'a [f32]> {
        match self {
            KvRef::F32(v) => Some(v),
            _ => None,
        }
    }

    /// Address of element 0, for prefetching (by the AVX-512 attention only).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn byte_ptr(&self) -> *const u8 {
        match self {
            KvRef::F32(v) => v.as_ptr() as *const u8,
            KvRef::Bf16(v) => v.as_ptr() as *const u8,
            KvRef::Fp8 { codes, .. } => codes.as_ptr(),
        }
    }

    /// Writes elements `start..start + dst.len()` as f32 into `dst` (panics when out of
    /// bounds; kernels validate their slots first).
    #[inline(always)]
    pub fn decode(&self, start: usize, dst: &mut [f32]) {
        let n = dst.len();
        match self {
            KvRef::F32(v) => dst.copy_from_slice(&v[start..start + n]),
            KvRef::Bf16(v) => {
                for (d, &x) in dst.iter_mut().zip(&v[start..start + n]) {
                    *d = bf16_to_f32(x);
                }
            }
            KvRef::Fp8 {
                codes,
                dtype,
                scale,
            } => {
                let t = fp8_table(*dtype);
                for (d, &c) in dst.iter_mut().zip(&codes[start..start + n]) {
                    *d = t[c as usize] * scale;
                }
            }
        }
    }
}

impl<'a> From<&'a [f32]> for KvRef<'a> {
    fn from(v: &'a [f32]) -> Self {
        KvRef::F32(v)
    }
}

impl<'a> From<&'a mut [f32]> for KvMut<'a> {
    fn from(v: &'a mut [f32]) -> Self {
        KvMut::F32(v)
    }
}

impl KvMut<'_> {
    /// Elements in the view.
    pub fn len(&self) -> usize {
        match self {
            KvMut::F32(v) => v.len(),
            KvMut::Bf16(v) => v.len(),
            KvMut::Fp8 { codes, .. } => codes.len(),
        }
    }

    /// True when the view holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The element type.
    pub fn dtype(&self) -> KvCacheDType {
        match self {
            KvMut::F32(_) => KvCacheDType::F32,
            KvMut::Bf16(_) => KvCacheDType::BF16,
            KvMut::Fp8 { dtype, .. } => *dtype,
        }
    }

    /// Stores `src` at elements `start..start + src.len()`, converted to the cache's type
    /// (panics when out of bounds; kernels validate their slots first).
    pub fn encode(&mut self, start: usize, src: &[f32]) {
        let n = src.len();
        match self {
            KvMut::F32(v) => v[start..start + n].copy_from_slice(src),
            KvMut::Bf16(v) => {
                for (d, &x) in v[start..start + n].iter_mut().zip(src) {
                    *d = f32_to_bf16(x);
                }
            }
            KvMut::Fp8 {
                codes,
                dtype,
                scale,
            } => {
                let inv = 1.0 / *scale;
                for (d, &x) in codes[start..start + n].iter_mut().zip(src) {
                    *d = dtype.encode_fp8(x * inv);
                }
            }
        }
    }

    /// A shorter-lived view of the same elements.
    pub fn reborrow(&mut self) -> KvMut<'_> {
        match self {
            KvMut::F32(v) => KvMut::F32(v),
            KvMut::Bf16(v) => KvMut::Bf16(v),
            KvMut::Fp8 {
                codes,
                dtype,
                scale,
            } => KvMut::Fp8 {
                codes,
                dtype: *dtype,
                scale: *scale,
            },
        }
    }
}
