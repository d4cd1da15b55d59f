//! Error type shared by all kernels.

use crate::dtype::DType;

/// Errors reported by kernel entry points on malformed input.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum KernelError {
    /// A collective could not complete (a rank of the group failed, or buffers disagree).
    #[error("collective: {0}")]
    Comm(String),
    /// A buffer has the wrong number of elements or bytes.
    #[error("length mismatch for {what}: expected {expected}, got {got}")]
    Length {
        /// Which argument was wrong.
        what: &'static str,
        /// The length the shapes require.
        expected: usize,
        /// The length that was passed.
        got: usize,
    },
    /// Shapes or parameters are inconsistent with each other.
    #[error("invalid shape: {0}")]
    Shape(String),
    /// A block-quantized format needs the row length to be a multiple of its block size.
    #[error("{format:?} needs a row length that is a multiple of {block}, got {cols}")]
    BlockAlignment {
        /// The quantized format.
        format: DType,
        /// Its block size in elements.
        block: usize,
        /// The offending row length.
        cols: usize,
    },
    /// A device backend cannot run on this machine: no driver, no device, or a device
    /// library (NVRTC, cuBLAS) that could not be loaded. Tests skip on it.
    #[error("device unavailable: {0}")]
    Unavailable(String),
    /// The device, its driver or a device library reported an error.
    #[error("device error: {0}")]
    Device(String),
    /// An index or range lies outside the valid bounds.
    #[error("{what} out of range: {value} (limit {limit})")]
    OutOfRange {
        /// What was being indexed.
        what: &'static str,
        /// The offending value.
        value: usize,
        /// The exclusive upper bound.
        limit: usize,
    },
}

/// Returns `Err(KernelError::Length)` unless `got == expected`.
pub(crate) fn check_len(
    what: &'static str,
    expected: usize,
    got: usize,
) -> Result<(), KernelError> {
    if expected == got {
        Ok(())
    } else {
        Err(KernelError::Length {
            what,
            expected,
            got,
        })
    }
}

// `DType`'s fallible check lives here, next to the error it returns, so that `dtype` does not
// depend on `error` (which names `DType` in `BlockAlignment`).
impl DType {
    /// Checks that `n_elems` is a whole number of blocks.
    pub fn check_elems(self, n_elems: usize) -> Result<(), KernelError> {
        if n_elems.is_multiple_of(self.block_elems()) {
            Ok(())
        } else {
            Err(KernelError::BlockAlignment {
                format: self,
                block: self.block_elems(),
                cols: n_elems,
            })
        }
    }
}
