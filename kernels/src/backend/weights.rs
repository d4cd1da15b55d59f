//! The host form of a weight matrix ([`WeightMatrix`]): rows of encoded bytes in any
//! [`DType`], owned or borrowed from a memory map, which a backend's
//! [`upload_matrix`](super::WeightStorage::upload_matrix) places on its device. Decoding
//! rows to f32 (and re-encoding) is the CPU codec's, in `cpu::weights`.

use crate::dtype::DType;
use crate::error::{check_len, KernelError};
use std::sync::Arc;

/// The most input features a weight matrix may have: 16M, far above any model's widest
/// dimension (about 50k today), far below a row whose allocation fails.
pub const MAX_COLS: usize = 1 << 24;

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
/// features) stored in any [`DType`]. Cloning and row slicing share storage.
///
/// ```
/// use dcpserve_kernels::{WeightMatrix, DType};
/// let w = WeightMatrix::from_f32(2, 32, vec![0.5; 64]).unwrap();
/// let q = w.to_format(DType::Q8_0).unwrap();
/// let mut row = vec![0.0; 32];
/// q.dequantize_row(1, &mut row).unwrap();
/// assert!((row[0] - 0.5).abs() < 1e-3);
/// ```
#[derive(Clone)]
pub struct WeightMatrix {
    format: DType,
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
            format: DType::F32,
            rows,
            cols,
            data: Arc::new(F32Storage(data)),
            offset: 0,
            row_stride: cols * 4,
        })
    }

    /// Wraps owned encoded bytes (exactly `rows * format.bytes_for(cols)` of them).
    pub fn from_vec(
        format: DType,
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
        format: DType,
        rows: usize,
        cols: usize,
        data: SharedBytes,
        offset: usize,
        len: usize,
    ) -> Result<Self, KernelError> {
        format.check_elems(cols)?;
        // Every consumer allocates a row of `cols` values (activations, dequantized rows),
        // even for a matrix with no rows and so no bytes to check the claim against.
        if cols > MAX_COLS {
            return Err(KernelError::OutOfRange {
                what: "weight matrix columns",
                value: cols,
                limit: MAX_COLS + 1,
            });
        }
        // A matrix with no rows (or no columns) takes no bytes, so its other dimension
        // could claim anything, and every consumer allocates a row of `cols` (or an output
        // of `rows`) values: such a shape is refused, whatever the bound above allows.
        if (rows == 0) != (cols == 0) {
            return Err(KernelError::Shape(format!(
                "weight matrix of {rows} × {cols} values holds no weights: one dimension is \
                 zero and the other is not"
            )));
        }
        // A lying header may claim a shape whose size overflows: never let it wrap into
        // a length that happens to match.
        let size = cols
            .div_ceil(format.block_elems())
            .checked_mul(format.block_bytes())
            .and_then(|row| Some((row, rows.checked_mul(row)?)));
        let Some((row_stride, total)) = size else {
            return Err(KernelError::Shape(format!(
                "weight matrix of {rows} × {cols} {format:?} values: its size overflows"
            )));
        };
        check_len("weight bytes", total, len)?;
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
    pub fn format(&self) -> DType {
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

    /// Columns `start..end` as a view sharing storage, when both cuts fall on block
    /// boundaries of the format (`None` otherwise; the caller checked the range).
    pub(crate) fn block_aligned_cols(&self, start: usize, end: usize) -> Option<WeightMatrix> {
        let be = self.format.block_elems();
        (start.is_multiple_of(be) && end.is_multiple_of(be)).then(|| WeightMatrix {
            cols: end - start,
            offset: self.offset + self.format.bytes_for(start),
            data: Arc::clone(&self.data),
            ..*self
        })
    }
}
