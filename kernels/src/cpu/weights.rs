//! Decoding [`WeightMatrix`] rows to f32 and re-encoding them, through the CPU codec
//! ([`crate::quant`]); the matrix itself (storage, shape, row views) is host data shared
//! by every backend, in [`crate::backend::weights`].

use crate::error::{check_len, KernelError};
use crate::quant::{dequantize_unchecked, quantize, WeightFormat};

pub use crate::backend::weights::{SharedBytes, WeightMatrix};

impl WeightMatrix {
    /// Decodes row `r` into `out` (`out.len() == cols`), e.g. for embedding lookups.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) -> Result<(), KernelError> {
        check_len("dequantize_row output", self.cols(), out.len())?;
        let bytes = self.row_bytes(r).ok_or(KernelError::OutOfRange {
            what: "row",
            value: r,
            limit: self.rows(),
        })?;
        dequantize_unchecked(self.format(), bytes, out, crate::cpu::isa());
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
        check_len("gather_rows output", ids.len() * self.cols(), out.len())?;
        if self.cols() == 0 {
            return Ok(());
        }
        for (&id, row) in ids.iter().zip(out.chunks_exact_mut(self.cols())) {
            self.dequantize_row(id as usize, row)?;
        }
        Ok(())
    }

    /// The whole matrix decoded to f32, row-major.
    pub fn to_f32_vec(&self) -> Vec<f32> {
        let mut out = vec![0.0f32; self.rows() * self.cols()];
        if self.cols() > 0 {
            let isa = crate::cpu::isa();
            for (r, o) in out.chunks_exact_mut(self.cols()).enumerate() {
                let bytes = self.row_bytes(r).unwrap_or_default();
                dequantize_unchecked(self.format(), bytes, o, isa);
            }
        }
        out
    }

    /// Converts to another format (float formats always work; quantized targets need
    /// `cols % 32 == 0`). Converting to the same format is a cheap clone.
    pub fn to_format(&self, format: WeightFormat) -> Result<WeightMatrix, KernelError> {
        if format == self.format() {
            return Ok(self.clone());
        }
        format.check_elems(self.cols())?;
        let f = self.to_f32_vec();
        if format == WeightFormat::F32 {
            return Self::from_f32(self.rows(), self.cols(), f);
        }
        let mut bytes = Vec::with_capacity(self.rows() * format.bytes_for(self.cols()));
        if self.cols() > 0 {
            for row in f.chunks_exact(self.cols()) {
                quantize(format, row, &mut bytes)?;
            }
        }
        Self::from_vec(format, self.rows(), self.cols(), bytes)
    }

    /// Columns `start..end` (input features; tensor-parallel row-parallel splits).
    /// Block-aligned cuts are views sharing storage; unaligned cuts of quantized
    /// matrices are decoded to an owned `F32` matrix, so any split (e.g. 1536/9) works.
    pub fn slice_cols(&self, start: usize, end: usize) -> Result<WeightMatrix, KernelError> {
        if start > end || end > self.cols() {
            return Err(KernelError::OutOfRange {
                what: "column slice end",
                value: end.max(start),
                limit: self.cols() + 1,
            });
        }
        if let Some(view) = self.block_aligned_cols(start, end) {
            return Ok(view);
        }
        let n = end - start;
        let mut out = Vec::with_capacity(self.rows() * n);
        let mut row = vec![0.0f32; self.cols()];
        for r in 0..self.rows() {
            self.dequantize_row(r, &mut row)?;
            out.extend_from_slice(&row[start..end]);
        }
        Self::from_f32(self.rows(), n, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

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
        // Shapes whose byte size overflows: (2⁶²+1)·4 wraps to 4, which the 4 bytes
        // given would otherwise match.
        let four: SharedBytes = Arc::new(vec![0u8; 4]);
        let rows = (1usize << 62) + 1;
        assert!(WeightMatrix::from_bytes(WeightFormat::F32, rows, 1, four.clone(), 0, 4).is_err());
        assert!(
            WeightMatrix::from_bytes(WeightFormat::F32, 1, usize::MAX / 2, four.clone(), 0, 4)
                .is_err()
        );
        // No rows means no bytes, so only the column bound stops a claimed 2⁶⁰-wide row
        // (the quant_blocks fuzzer's input: every user of the matrix allocates a row).
        let none: SharedBytes = Arc::new(Vec::new());
        assert!(
            WeightMatrix::from_bytes(WeightFormat::F32, 0, 1 << 60, none.clone(), 0, 0).is_err()
        );
        // Nor may a matrix with no rows claim any width at all (the fuzzer's next input:
        // 0 × 16.7M, under the column bound, allocated a 64 MB row), nor one with no columns
        // any height; the empty matrix is still a matrix.
        assert!(WeightMatrix::from_bytes(WeightFormat::F32, 0, 64, none.clone(), 0, 0).is_err());
        assert!(
            WeightMatrix::from_bytes(WeightFormat::F32, 1 << 40, 0, none.clone(), 0, 0).is_err()
        );
        assert!(WeightMatrix::from_bytes(WeightFormat::F32, 0, 0, none, 0, 0).is_ok());
    }
}
