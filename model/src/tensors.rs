//! Format-independent view of one stored weight tensor, and the trait every weight source
//! (GGUF file, safetensors folder) implements.

use std::fmt;
use std::sync::Arc;

use half::{bf16, f16};

use crate::error::ModelError;

/// Storage types the engine computes with. Mirrors `dcpserve_kernels::WeightFormat`; kept
/// separate so that this crate does not depend on the kernels' API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TensorDType {
    F32,
    F16,
    BF16,
    /// ggml Q8_0: blocks of 32 values, an f16 scale then 32 `i8`.
    Q8_0,
    /// ggml Q4_0: blocks of 32 values, an f16 scale then 16 bytes of 4-bit values (offset 8).
    Q4_0,
    /// ggml Q4_1: blocks of 32 values, f16 scale and f16 minimum then 16 bytes of 4-bit values.
    Q4_1,
}

impl TensorDType {
    /// Number of values in one storage block (1 for plain floats).
    pub fn block_len(self) -> usize {
        match self {
            TensorDType::F32 | TensorDType::F16 | TensorDType::BF16 => 1,
            TensorDType::Q8_0 | TensorDType::Q4_0 | TensorDType::Q4_1 => 32,
        }
    }

    /// Bytes of one storage block.
    pub fn block_bytes(self) -> usize {
        match self {
            TensorDType::F32 => 4,
            TensorDType::F16 | TensorDType::BF16 => 2,
            TensorDType::Q8_0 => 34,
            TensorDType::Q4_0 => 18,
            TensorDType::Q4_1 => 20,
        }
    }

    /// True for the ggml block-quantized types.
    pub fn is_quantized(self) -> bool {
        self.block_len() > 1
    }

    /// Bytes needed to store a tensor of this shape (row-major, outermost first), or `None` when
    /// the size overflows or the rows are not a whole number of blocks (quantized types are
    /// blocked along the innermost dimension).
    pub fn storage_bytes(self, shape: &[usize]) -> Option<usize> {
        let inner = shape.last().copied().unwrap_or(1);
        if !inner.is_multiple_of(self.block_len()) {
            return None;
        }
        let numel = shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))?;
        (numel / self.block_len()).checked_mul(self.block_bytes())
    }
}

impl fmt::Display for TensorDType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Shared, immutable backing bytes of tensors: in practice a memory map of the whole file.
pub type TensorBytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// One tensor as stored: type, row-major shape (outermost first) and a window into the
/// memory-mapped file. Cloning is cheap (the mapping is shared).
#[derive(Clone)]
pub struct RawTensor {
    /// Hugging Face name, e.g. `model.layers.0.self_attn.q_proj.weight`.
    pub name: String,
    pub dtype: TensorDType,
    /// Row-major, outermost dimension first (a `[out, in]` matrix for linear weights).
    pub shape: Vec<usize>,
    /// The whole backing buffer; the tensor is `data[offset..offset + len]`.
    pub data: TensorBytes,
    pub offset: usize,
    pub len: usize,
}

impl fmt::Debug for RawTensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RawTensor")
            .field("name", &self.name)
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish()
    }
}

impl RawTensor {
    /// The tensor's stored bytes. Sources validate the window when they build a `RawTensor`;
    /// should the public fields have been altered to point outside the buffer, this returns an
    /// empty slice rather than panicking.
    pub fn bytes(&self) -> &[u8] {
        let buf = (*self.data).as_ref();
        self.offset
            .checked_add(self.len)
            .and_then(|end| buf.get(self.offset..end))
            .unwrap_or(&[])
    }

    /// Number of values.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Dequantizes / widens the tensor to `f32`, row-major. Meant for small tensors (norms,
    /// biases) and tests; the forward pass uses the stored format directly.
    pub fn to_f32_vec(&self) -> Result<Vec<f32>, ModelError> {
        let bytes = self.bytes();
        let expected = self.dtype.storage_bytes(&self.shape);
        if expected != Some(bytes.len()) {
            return Err(ModelError::Corrupt {
                path: Default::default(),
                reason: format!(
                    "tensor {:?}: {} bytes for {} of shape {:?} (expected {:?})",
                    self.name,
                    bytes.len(),
                    self.dtype,
                    self.shape,
                    expected
                ),
            });
        }
        let mut out = Vec::with_capacity(self.numel());
        match self.dtype {
            TensorDType::F32 => out.extend(
                bytes
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            ),
            TensorDType::F16 => out.extend(
                bytes
                    .chunks_exact(2)
                    .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()),
            ),
            TensorDType::BF16 => out.extend(
                bytes
                    .chunks_exact(2)
                    .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32()),
            ),
            TensorDType::Q8_0 => {
                for block in bytes.chunks_exact(34) {
                    let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
                    out.extend(block[2..].iter().map(|&q| f32::from(q as i8) * d));
                }
            }
            TensorDType::Q4_0 => {
                for block in bytes.chunks_exact(18) {
                    let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
                    let qs = &block[2..];
                    // ggml packs value j in the low nibble and value j + 16 in the high nibble.
                    out.extend(qs.iter().map(|&q| (f32::from(q & 0x0f) - 8.0) * d));
                    out.extend(qs.iter().map(|&q| (f32::from(q >> 4) - 8.0) * d));
                }
            }
            TensorDType::Q4_1 => {
                for block in bytes.chunks_exact(20) {
                    let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
                    let m = f16::from_le_bytes([block[2], block[3]]).to_f32();
                    let qs = &block[4..];
                    out.extend(qs.iter().map(|&q| f32::from(q & 0x0f) * d + m));
                    out.extend(qs.iter().map(|&q| f32::from(q >> 4) * d + m));
                }
            }
        }
        Ok(out)
    }
}

/// A set of named weight tensors. Names are always Hugging Face names
/// (`model.embed_tokens.weight`, `model.layers.{i}.self_attn.q_proj.weight`, `lm_head.weight`,
/// ...), whatever the file format.
pub trait TensorSource: Send + Sync {
    /// The tensor called `name`, or [`ModelError::MissingTensor`] /
    /// [`ModelError::UnsupportedTensorType`].
    fn get(&self, name: &str) -> Result<RawTensor, ModelError>;
    /// Whether a tensor called `name` exists (whatever its type).
    fn contains(&self, name: &str) -> bool;
    /// All tensor names, sorted.
    fn names(&self) -> Vec<String>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(dtype: TensorDType, shape: Vec<usize>, bytes: Vec<u8>) -> RawTensor {
        let len = bytes.len();
        RawTensor {
            name: "t".into(),
            dtype,
            shape,
            data: Arc::new(bytes),
            offset: 0,
            len,
        }
    }

    #[test]
    fn storage_sizes() {
        assert_eq!(TensorDType::Q4_1.storage_bytes(&[3, 64]), Some(3 * 2 * 20));
        assert_eq!(TensorDType::Q8_0.storage_bytes(&[3, 33]), None);
        assert_eq!(TensorDType::F16.storage_bytes(&[5]), Some(10));
        assert_eq!(TensorDType::F32.storage_bytes(&[usize::MAX, 2]), None);
    }

    #[test]
    fn dequantizes_q4_blocks() {
        let mut b = Vec::new();
        b.extend(f16::from_f32(0.5).to_le_bytes());
        b.extend(f16::from_f32(-1.0).to_le_bytes());
        b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let v = raw(TensorDType::Q4_1, vec![32], b).to_f32_vec().unwrap();
        assert_eq!(v[0], -1.0);
        assert_eq!(v[15], 6.5);
        assert_eq!(v[16], 6.5);
        assert_eq!(v[31], -1.0);

        let mut b = Vec::new();
        b.extend(f16::from_f32(2.0).to_le_bytes());
        b.extend([0x8fu8; 16]);
        let v = raw(TensorDType::Q4_0, vec![32], b).to_f32_vec().unwrap();
        assert_eq!((v[0], v[16]), (14.0, 0.0));
    }

    #[test]
    fn out_of_range_window_is_empty_not_a_panic() {
        let mut t = raw(TensorDType::F32, vec![1], vec![0; 4]);
        t.offset = usize::MAX;
        assert!(t.bytes().is_empty());
        assert!(t.to_f32_vec().is_err());
    }
}
