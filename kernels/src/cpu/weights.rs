//! Weight matrices in any [`WeightFormat`], owned or borrowed from a memory map.

use crate::error::{check_len, KernelError};
use crate::quant::{dequantize_unchecked, quantize, WeightFormat};
use std::sync::Arc;

/// Shared read-only bytes, e.g. a whole GGUF/safetensors memory map.
pub type SharedBytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// Owned f32 storage exposed as bytes (x86/ARM are little endian, so the in-memory
/// representation is exactly the `F32` format).
struct F32Storage(Vec<f32>);

impl AsRef<[u8]> for F32Storage {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: any f32 bit pattern is valid bytes; u8 has alignment 1.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr() as *const u8, self.0.len() * 4) }
    }
}

/// A row-major `[rows, cols]` matrix (`rows` = output features, `cols` = input
/// features) stored in any [`WeightFormat`]. Cloning and row slicing share storage.
///
/// ```
/// use dcpserve_kernels::{WeightMatrix, WeightFormat};
/// let w = WeightMatrix::from_f32(2, 32, vec![0.5; 64]).unwrap();
/// let q = w.to_format(WeightFormat::Q8_0).unwrap();
/// let mut row = vec![0.0; 32];
/// q.dequantize_row(1, &mut row).unwrap();
/// assert!((row[0] - 0.5).abs() < 1e-3);
/// ```
#[derive(Clone)]
pub struct WeightMatrix {
    format: WeightFormat,
    rows: usize,
    cols: usize,
    data: SharedBytes,
    offset: usize,
    row_stride: usize,
}

impl std::fmt::Debug for WeightMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WeightMatrix")
            .field("format", &self.format)
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .finish()
    }
}

impl WeightMatrix {
    /// Wraps an owned f32 matrix (`data.len() == rows * cols`).
    pub fn from_f32(rows: usize, cols: usize, data: Vec<f32>) -> Result<Self, KernelError> {
        check_len("f32 weight data", rows * cols, data.len())?;
        Ok(WeightMatrix {
            format: WeightFormat::F32,
            rows,
            cols,
            data: Arc::new(F32Storage(data)),
            offset: 0,
            row_stride: cols * 4,
        })
    }

    /// Wraps owned encoded bytes (exactly `rows * format.bytes_for(cols)` of them).
    pub fn from_vec(
        format: WeightFormat,
        rows: usize,
        cols: usize,
        bytes: Vec<u8>,
    ) -> Result<Self, KernelError> {
        let len = bytes.len();
        Self::from_bytes(format, rows, cols, Arc::new(bytes), 0, len)
    }

    /// Borrows `len` bytes at `offset` of shared storage (typically a memory map).
    /// Validates that the range exists, that `len` matches the shape and that quantized
    /// formats have `cols % 32 == 0`.
    pub fn from_bytes(
        format: WeightFormat,
        rows: usize,
        cols: usize,
        data: SharedBytes,
        offset: usize,
        len: usize,
    ) -> Result<Self, KernelError> {
        format.check_elems(cols)?;
        let row_stride = format.bytes_for(cols);
        check_len("weight bytes", rows * row_stride, len)?;
        let avail = (*data).as_ref().len();
        if offset.checked_add(len).is_none_or(|end| end > avail) {
            return Err(KernelError::OutOfRange {
                what: "weight byte range end",
                value: offset.saturating_add(len),
                limit: avail,
            });
        }
        Ok(WeightMatrix {
            format,
            rows,
            cols,
            data,
            offset,
            row_stride,
        })
    }

    /// Output features.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input features.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Element format.
    pub fn format(&self) -> WeightFormat {
        self.format
    }

    /// Bytes between the starts of consecutive rows.
    pub fn row_stride(&self) -> usize {
        self.row_stride
    }

    /// Encoded bytes of one row (`None` when `r` is out of range).
    pub fn row_bytes(&self, r: usize) -> Option<&[u8]> {
        (r < self.rows).then(|| {
            let start = self.offset + r * self.row_stride;
            &(*self.data).as_ref()[start..start + self.format.bytes_for(self.cols)]
        })
    }

    /// Pointer to the first byte of row 0; rows follow at `row_stride()` bytes.
    pub(crate) fn base_ptr(&self) -> *const u8 {
        // SAFETY: offset is within the storage (checked at construction).
        unsafe { (*self.data).as_ref().as_ptr().add(self.offset) }
    }

    /// Decodes row `r` into `out` (`out.len() == cols`), e.g. for embedding lookups.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) -> Result<(), KernelError> {
        check_len("dequantize_row output", self.cols, out.len())?;
        let bytes = self.row_bytes(r).ok_or(KernelError::OutOfRange {
            what: "row",
            value: r,
            limit: self.rows,
        })?;
        dequantize_unchecked(self.format, bytes, out, crate::cpu::isa());
        Ok(())
    }

    /// Embedding gather: decodes row `ids[i]` into row `i` of `out`
    /// (`out.len() == ids.len() * cols`); an id outside the matrix is an error.
    ///
    /// ```
    /// use dcpserve_kernels::WeightMatrix;
    /// let table = WeightMatrix::from_f32(3, 2, vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]).unwrap();
    /// let mut out = [0.0; 4];
    /// table.gather_rows(&[2, 0], &mut out).unwrap();
    /// assert_eq!(out, [4.0, 5.0, 0.0, 1.0]);
    /// assert!(table.gather_rows(&[3, 0], &mut out).is_err());
    /// ```
    pub fn gather_rows(&self, ids: &[u32], out: &mut [f32]) -> Result<(), KernelError> {
        check_len("gather_rows output", ids.len() * self.cols, out.len())?;
        if self.cols == 0 {
            return Ok(());
        }
        for (&id, row) in ids.iter().zip(out.chunks_exact_mut(self.cols)) {
            self.dequantize_row(id as usize, row)?;
        }
        Ok(())
    }

    /// The whole matrix decoded to f32, row-major.
    pub fn to_f32_vec(&self) -> Vec<f32> {
        let mut out = vec![0.0f32; self.rows * self.cols];
        if self.cols > 0 {
            let isa = crate::cpu::isa();
            for (r, o) in out.chunks_exact_mut(self.cols).enumerate() {
                let bytes = self.row_bytes(r).unwrap_or_default();
                dequantize_unchecked(self.format, bytes, o, isa);
            }
        }
        out
    }

    /// Converts to another format (float formats always work; quantized targets need
    /// `cols % 32 == 0`). Converting to the same format is a cheap clone.
    pub fn to_format(&self, format: WeightFormat) -> Result<WeightMatrix, KernelError> {
        if format == self.format {
            return Ok(self.clone());
        }
        format.check_elems(self.cols)?;
        let f = self.to_f32_vec();
        if format == WeightFormat::F32 {
            return Self::from_f32(self.rows, self.cols, f);
        }
        let mut bytes = Vec::with_capacity(self.rows * format.bytes_for(self.cols));
        if self.cols > 0 {
            for row in f.chunks_exact(self.cols) {
                quantize(format, row, &mut bytes)?;
            }
        }
        Self::from_vec(format, self.rows, self.cols, bytes)
    }

    /// Rows `start..end` as a view sharing storage.
    pub fn slice_rows(&self, start: usize, end: usize) -> Result<WeightMatrix, KernelError> {
        if start > end || end > self.rows {
            return Err(KernelError::OutOfRange {
                what: "row slice end",
                value: end.max(start),
                limit: self.rows + 1,
            });
        }
        Ok(WeightMatrix {
            rows: end - start,
            offset: self.offset + start * self.row_stride,
            data: Arc::clone(&self.data),
            ..*self
        })
    }

    /// Columns `start..end` (input features; tensor-parallel row-parallel splits).
    /// Block-aligned cuts are views sharing storage; unaligned cuts of quantized
    /// matrices are decoded to an owned `F32` matrix, so any split (e.g. 1536/9) works.
    pub fn slice_cols(&self, start: usize, end: usize) -> Result<WeightMatrix, KernelError> {
        if start > end || end > self.cols {
            return Err(KernelError::OutOfRange {
                what: "column slice end",
                value: end.max(start),
                limit: self.cols + 1,
            });
        }
        let be = self.format.block_elems();
        if start.is_multiple_of(be) && end.is_multiple_of(be) {
            return Ok(WeightMatrix {
                cols: end - start,
                offset: self.offset + self.format.bytes_for(start),
                data: Arc::clone(&self.data),
                ..*self
            });
        }
        let n = end - start;
        let mut out = Vec::with_capacity(self.rows * n);
        let mut row = vec![0.0f32; self.cols];
        for r in 0..self.rows {
            self.dequantize_row(r, &mut row)?;
            out.extend_from_slice(&row[start..end]);
        }
        Self::from_f32(self.rows, n, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mat(rows: usize, cols: usize) -> Vec<f32> {
        (0..rows * cols)
            .map(|i| ((i * 31 % 97) as f32 - 48.0) / 10.0)
            .collect()
    }

    #[test]
    fn slices_and_conversions() {
        let (r, c) = (5, 96);
        let src = mat(r, c);
        let w = WeightMatrix::from_f32(r, c, src.clone()).unwrap();
        for f in [
            WeightFormat::F32,
            WeightFormat::F16,
            WeightFormat::BF16,
            WeightFormat::Q8_0,
            WeightFormat::Q4_0,
            WeightFormat::Q4_1,
        ] {
            let q = w.to_format(f).unwrap();
            let full = q.to_f32_vec();
            // Aligned column cut is a view.
            let v = q.slice_cols(32, 96).unwrap();
            assert_eq!(v.format(), f);
            let vf = v.to_f32_vec();
            for rr in 0..r {
                assert_eq!(
                    &vf[rr * 64..(rr + 1) * 64],
                    &full[rr * c + 32..(rr + 1) * c]
                );
            }
            // Unaligned cut (uneven split) decodes to f32.
            let u = q.slice_cols(11, 50).unwrap();
            let uf = u.to_f32_vec();
            for rr in 0..r {
                assert_eq!(&uf[rr * 39..(rr + 1) * 39], &full[rr * c + 11..rr * c + 50]);
            }
            let s = q.slice_rows(2, 4).unwrap();
            assert_eq!(s.to_f32_vec(), full[2 * c..4 * c].to_vec());
            let mut row = vec![0.0; c];
            q.dequantize_row(4, &mut row).unwrap();
            assert_eq!(row, full[4 * c..].to_vec());
            assert!(q.dequantize_row(5, &mut row).is_err());
            assert_eq!(q.to_format(WeightFormat::F32).unwrap().to_f32_vec(), full);
        }
    }

    #[test]
    fn from_bytes_validates() {
        let bytes: SharedBytes = Arc::new(vec![0u8; 100]);
        assert!(WeightMatrix::from_bytes(WeightFormat::Q8_0, 2, 32, bytes.clone(), 0, 68).is_ok());
        assert!(
            WeightMatrix::from_bytes(WeightFormat::Q8_0, 2, 32, bytes.clone(), 40, 68).is_err()
        );
        assert!(WeightMatrix::from_bytes(WeightFormat::Q8_0, 2, 30, bytes.clone(), 0, 68).is_err());
        assert!(WeightMatrix::from_bytes(WeightFormat::F16, 2, 3, bytes, 1, 12).is_ok());
        assert!(WeightMatrix::from_f32(2, 2, vec![0.0; 3]).is_err());
    }
}
