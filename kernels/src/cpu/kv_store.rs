//! The CPU's KV-cache storage: elements in a [`KvCacheDType`], and views that convert
//! rows to f32 where a kernel reads them ([`KvRef::decode`]) and from f32 where one
//! stores them ([`KvMut::encode`]). Attention kernels decode only the rows of the keys
//! they are about to use, into a scratch of a few rows, so a narrow cache is streamed
//! from memory in its narrow form. FP8 buffers keep one scale byte per row of
//! `row_len` values beside the codes (see [`crate::kv_dtype`]).

use std::ops::Range;
use std::sync::OnceLock;

use crate::error::KernelError;
use crate::kv_dtype::{bf16_to_f32, f32_to_bf16, fp8_scale_value, KvCacheDType};
use crate::shape_checks::{check_fp8_rows, check_row_aligned};

/// An owned KV-cache buffer (the CPU backend's [`KvStorage::KvBuffer`](crate::KvStorage::KvBuffer)).
///
/// ```
/// use dcpserve_kernels::cpu::kv_store::KvStore;
/// use dcpserve_kernels::KvCacheDType;
/// let mut s = KvStore::zeros(KvCacheDType::BF16, 4, 2).unwrap();
/// s.view_mut(0..4).encode(2, &[1.5, -2.0]);
/// let mut back = [9.0; 4];
/// s.view(0..4).decode(0, &mut back);
/// assert_eq!(back, [0.0, 0.0, 1.5, -2.0]);
/// assert_eq!(s.bytes(), 8);
/// // FP8 rows carry a scale: 2⁻¹⁰ would be a subnormal at scale 1, here it is exact.
/// let mut s = KvStore::zeros(KvCacheDType::Fp8E4M3, 4, 2).unwrap();
/// s.view_mut(0..4).encode(0, &[2f32.powi(-10), 0.003]);
/// s.view(0..4).decode(0, &mut back);
/// assert_eq!(back[0], 2f32.powi(-10));
/// assert_eq!(s.bytes(), 4 + 2); // codes and a scale byte per row
/// ```
#[derive(Debug, Clone)]
pub struct KvStore {
    dtype: KvCacheDType,
    /// Values per row (one FP8 scale each).
    row_len: usize,
    data: KvData,
}

#[derive(Debug, Clone)]
enum KvData {
    F32(Vec<f32>),
    Bf16(Vec<u16>),
    /// Codes, and the E8M0 scale byte of each row of `row_len` codes.
    Fp8 {
        codes: Vec<u8>,
        scales: Vec<u8>,
    },
}

/// A read-only window of a [`KvStore`] (or of f32 host memory).
#[derive(Debug, Clone, Copy)]
pub enum KvRef<'a> {
    /// f32 elements.
    F32(&'a [f32]),
    /// bf16 bits.
    Bf16(&'a [u16]),
    /// FP8 codes of `dtype` in whole rows of `row_len`: element `i` is
    /// `code · fp8_scale_value(scales[i / row_len])`.
    Fp8 {
        codes: &'a [u8],
        scales: &'a [u8],
        row_len: usize,
        dtype: KvCacheDType,
    },
}

/// A writable window of a [`KvStore`] (or of f32 host memory).
#[derive(Debug)]
pub enum KvMut<'a> {
    /// f32 elements.
    F32(&'a mut [f32]),
    /// bf16 bits.
    Bf16(&'a mut [u16]),
    /// FP8 codes of `dtype` in whole rows of `row_len`, each row with its scale byte
    /// (written with the row).
    Fp8 {
        codes: &'a mut [u8],
        scales: &'a mut [u8],
        row_len: usize,
        dtype: KvCacheDType,
    },
}

impl KvStore {
    /// `len` zero elements of `dtype` (zeroed pages: untouched ones cost no RAM), in rows
    /// of `row_len` values (`head_dim`, or MLA's latent width): FP8 keeps one scale per
    /// row, so for FP8 `row_len` must be positive and divide `len`.
    pub fn zeros(dtype: KvCacheDType, len: usize, row_len: usize) -> Result<Self, KernelError> {
        let data = match dtype {
            KvCacheDType::F32 => KvData::F32(vec![0.0; len]),
            KvCacheDType::BF16 => KvData::Bf16(vec![0; len]),
            KvCacheDType::Fp8E4M3 | KvCacheDType::Fp8E5M2 => {
                check_fp8_rows(len, row_len)?;
                KvData::Fp8 {
                    codes: vec![0; len],
                    scales: vec![0; len / row_len],
                }
            }
        };
        Ok(KvStore {
            dtype,
            row_len,
            data,
        })
    }

    /// The element type.
    pub fn dtype(&self) -> KvCacheDType {
        self.dtype
    }

    /// Values per row (one FP8 scale each).
    pub fn row_len(&self) -> usize {
        self.row_len
    }

    /// Elements held.
    pub fn len(&self) -> usize {
        match &self.data {
            KvData::F32(v) => v.len(),
            KvData::Bf16(v) => v.len(),
            KvData::Fp8 { codes, .. } => codes.len(),
        }
    }

    /// True when the buffer holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of storage (FP8: codes and row scales).
    pub fn bytes(&self) -> usize {
        match &self.data {
            KvData::Fp8 { codes, scales } => codes.len() + scales.len(),
            _ => self.len() * self.dtype.bytes(),
        }
    }

    /// Elements `range`, read-only. Panics when out of bounds, or (FP8) not whole rows
    /// (see [`KvStore::checked_view`]).
    pub fn view(&self, range: Range<usize>) -> KvRef<'_> {
        match &self.data {
            KvData::F32(v) => KvRef::F32(&v[range]),
            KvData::Bf16(v) => KvRef::Bf16(&v[range]),
            KvData::Fp8 { codes, scales } => {
                let rows = whole_rows(&range, self.row_len);
                KvRef::Fp8 {
                    codes: &codes[range],
                    scales: &scales[rows],
                    row_len: self.row_len,
                    dtype: self.dtype,
                }
            }
        }
    }

    /// Elements `range`, writable. Panics when out of bounds, or (FP8) not whole rows.
    pub fn view_mut(&mut self, range: Range<usize>) -> KvMut<'_> {
        match &mut self.data {
            KvData::F32(v) => KvMut::F32(&mut v[range]),
            KvData::Bf16(v) => KvMut::Bf16(&mut v[range]),
            KvData::Fp8 { codes, scales } => {
                let rows = whole_rows(&range, self.row_len);
                KvMut::Fp8 {
                    codes: &mut codes[range],
                    scales: &mut scales[rows],
                    row_len: self.row_len,
                    dtype: self.dtype,
                }
            }
        }
    }

    /// [`KvStore::view`], or an error when `range` is outside the buffer or (FP8) not
    /// whole rows.
    pub fn checked_view(&self, range: Range<usize>) -> Result<KvRef<'_>, KernelError> {
        self.check_view(&range)?;
        Ok(self.view(range))
    }

    /// [`KvStore::view_mut`], or an error when `range` is outside the buffer or (FP8)
    /// not whole rows.
    pub fn checked_view_mut(&mut self, range: Range<usize>) -> Result<KvMut<'_>, KernelError> {
        self.check_view(&range)?;
        Ok(self.view_mut(range))
    }

    fn check_view(&self, range: &Range<usize>) -> Result<(), KernelError> {
        check_range(range, self.len())?;
        if self.dtype.is_fp8() {
            check_row_aligned("KV-cache view", range, self.row_len)?;
        }
        Ok(())
    }
}

/// The rows of an FP8 window (panics when it does not cover whole rows: a view that
/// splits a row would lose the row's scale).
fn whole_rows(range: &Range<usize>, row_len: usize) -> Range<usize> {
    assert!(
        range.start.is_multiple_of(row_len) && range.end.is_multiple_of(row_len),
        "FP8 KV view {range:?} splits rows of {row_len}"
    );
    range.start / row_len..range.end / row_len
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

    /// Address of element 0, for prefetching.
    pub(crate) fn byte_ptr(&self) -> *const u8 {
        match self {
            KvRef::F32(v) => v.as_ptr() as *const u8,
            KvRef::Bf16(v) => v.as_ptr() as *const u8,
            KvRef::Fp8 { codes, .. } => codes.as_ptr(),
        }
    }

    /// Values per scaled row for FP8 (`None` for the other types).
    pub fn fp8_row_len(&self) -> Option<usize> {
        match self {
            KvRef::Fp8 { row_len, .. } => Some(*row_len),
            _ => None,
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
                scales,
                row_len,
                dtype,
            } => {
                let t = fp8_table(*dtype);
                // Row by row, each with its scale (usually one row: a head's).
                let (mut i, end) = (start, start + n);
                while i < end {
                    let row = i / row_len;
                    let stop = ((row + 1) * row_len).min(end);
                    let s = fp8_scale_value(scales[row]);
                    for (d, &c) in dst[i - start..stop - start].iter_mut().zip(&codes[i..stop]) {
                        *d = t[c as usize] * s;
                    }
                    i = stop;
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

    /// Values per scaled row for FP8 (`None` for the other types).
    pub fn fp8_row_len(&self) -> Option<usize> {
        match self {
            KvMut::Fp8 { row_len, .. } => Some(*row_len),
            _ => None,
        }
    }

    /// Stores `src` at elements `start..start + src.len()`, converted to the cache's type
    /// (panics when out of bounds, or for FP8 when not whole rows: a row's scale is
    /// computed from the whole row; kernels validate their slots first).
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
                scales,
                row_len,
                dtype,
            } => {
                let rows = whole_rows(&(start..start + n), *row_len);
                let codes = codes[start..start + n].chunks_exact_mut(*row_len);
                for ((c, x), s) in codes.zip(src.chunks_exact(*row_len)).zip(&mut scales[rows]) {
                    *s = dtype.encode_fp8_row(x, c);
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
                scales,
                row_len,
                dtype,
            } => KvMut::Fp8 {
                codes,
                scales,
                row_len: *row_len,
                dtype: *dtype,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// FP8 rows keep their own scales through views at any row offset: every value
    /// reads back as the row-scaled encoding ([`KvCacheDType::encode_fp8_row`], checked
    /// against an f64 reference in `kv_dtype`), rows of very different magnitudes alike.
    #[test]
    fn fp8_rows_round_trip_with_their_scales_through_views() {
        for dt in [KvCacheDType::Fp8E4M3, KvCacheDType::Fp8E5M2] {
            let (row, rows) = (6, 5);
            let mut s = KvStore::zeros(dt, row * rows, row).unwrap();
            assert_eq!(s.bytes(), row * rows + rows);
            let x: Vec<f32> = (0..row * rows)
                .map(|i| (i as f32 - 7.5) * 10f32.powi((i / row) as i32 * 3 - 6))
                .collect();
            // Rows 1..4 through a view starting at row 1.
            s.view_mut(row..4 * row).encode(0, &x[row..4 * row]);
            s.view_mut(0..row * rows).encode(4 * row, &x[4 * row..]);
            let mut got = vec![f32::NAN; row * rows];
            s.view(0..row * rows).decode(0, &mut got);
            assert_eq!(&got[..row], &[0.0; 6], "row 0 was never written");
            for r in 1..rows {
                let mut codes = vec![0u8; row];
                let b = dt.encode_fp8_row(&x[r * row..(r + 1) * row], &mut codes);
                for (i, &c) in codes.iter().enumerate() {
                    let want = dt.decode_fp8(c) * fp8_scale_value(b);
                    assert_eq!(got[r * row + i], want, "{dt} row {r}");
                }
            }
            // A decode that starts and ends inside rows applies each row's scale.
            let mut part = vec![0.0; 8];
            s.view(2 * row..4 * row).decode(3, &mut part);
            assert_eq!(part, got[2 * row + 3..2 * row + 11]);
            // Views and buffers that split rows are refused.
            assert!(s.checked_view(1..row).is_err());
            assert!(s.checked_view_mut(row..row + 3).is_err());
            assert!(s.checked_view(row..3 * row).is_ok());
            assert!(KvStore::zeros(dt, 10, 4).is_err());
            assert!(KvStore::zeros(dt, 10, 0).is_err());
        }
        // Other types ignore the row length.
        assert!(KvStore::zeros(KvCacheDType::BF16, 10, 4).is_ok());
    }
}
