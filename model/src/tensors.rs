//! Format-independent view of one stored weight tensor, and the trait every weight source
//! (GGUF file, safetensors folder) implements.

use std::fmt;
use std::sync::Arc;

use half::{bf16, f16};

use crate::error::ModelError;

/// Storage types of tensors: the kernels' one element type.
pub use dcpserve_kernels::DType;

/// Shared, immutable backing bytes of tensors: in practice a memory map of the whole file.
pub type TensorBytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// One tensor as stored: type, row-major shape (outermost first) and a window into the
/// memory-mapped file. Cloning is cheap (the mapping is shared).
#[derive(Clone)]
pub struct RawTensor {
    /// Hugging Face name, e.g. `model.layers.0.self_attn.q_proj.weight`.
    pub name: String,
    pub dtype: DType,
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
            DType::F32 => out.extend(
                bytes
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            ),
            DType::F16 => out.extend(
                bytes
                    .chunks_exact(2)
                    .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()),
            ),
            DType::BF16 => out.extend(
                bytes
                    .chunks_exact(2)
                    .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32()),
            ),
            DType::Q8_0 => {
                for block in bytes.chunks_exact(34) {
                    let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
                    out.extend(block[2..].iter().map(|&q| f32::from(q as i8) * d));
                }
            }
            DType::Q4_0 => {
                for block in bytes.chunks_exact(18) {
                    let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
                    let qs = &block[2..];
                    // ggml packs value j in the low nibble and value j + 16 in the high nibble.
                    out.extend(qs.iter().map(|&q| (f32::from(q & 0x0f) - 8.0) * d));
                    out.extend(qs.iter().map(|&q| (f32::from(q >> 4) - 8.0) * d));
                }
            }
            DType::Q4_1 => {
                for block in bytes.chunks_exact(20) {
                    let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
                    let m = f16::from_le_bytes([block[2], block[3]]).to_f32();
                    let qs = &block[4..];
                    out.extend(qs.iter().map(|&q| f32::from(q & 0x0f) * d + m));
                    out.extend(qs.iter().map(|&q| f32::from(q >> 4) * d + m));
                }
            }
            // The 5-bit, K-quant and IQ4 types: the kernels' decoder (checked against the
            // `gguf` Python package in the kernels' tests).
            other => {
                out.resize(self.numel(), 0.0);
                dcpserve_kernels::dequantize(other, bytes, &mut out).map_err(|e| {
                    ModelError::Corrupt {
                        path: Default::default(),
                        reason: format!("tensor {:?}: {e}", self.name),
                    }
                })?;
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

    fn raw(dtype: DType, shape: Vec<usize>, bytes: Vec<u8>) -> RawTensor {
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
        assert_eq!(DType::Q4_1.storage_bytes(&[3, 64]), Some(3 * 2 * 20));
        assert_eq!(DType::Q8_0.storage_bytes(&[3, 33]), None);
        assert_eq!(DType::F16.storage_bytes(&[5]), Some(10));
        assert_eq!(DType::F32.storage_bytes(&[usize::MAX, 2]), None);
    }

    #[test]
    fn dequantizes_q4_blocks() {
        let mut b = Vec::new();
        b.extend(f16::from_f32(0.5).to_le_bytes());
        b.extend(f16::from_f32(-1.0).to_le_bytes());
        b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let v = raw(DType::Q4_1, vec![32], b).to_f32_vec().unwrap();
        assert_eq!(v[0], -1.0);
        assert_eq!(v[15], 6.5);
        assert_eq!(v[16], 6.5);
        assert_eq!(v[31], -1.0);

        let mut b = Vec::new();
        b.extend(f16::from_f32(2.0).to_le_bytes());
        b.extend([0x8fu8; 16]);
        let v = raw(DType::Q4_0, vec![32], b).to_f32_vec().unwrap();
        assert_eq!((v[0], v[16]), (14.0, 0.0));
    }

    #[test]
    fn out_of_range_window_is_empty_not_a_panic() {
        let mut t = raw(DType::F32, vec![1], vec![0; 4]);
        t.offset = usize::MAX;
        assert!(t.bytes().is_empty());
        assert!(t.to_f32_vec().is_err());
    }
}
