//! GGUF (v2 and v3, little-endian) reader over a memory map, the llama.cpp → Hugging Face
//! tensor-name mapping, and a small writer for tests and tiny fixtures.
//!
//! Every count, length and offset read from the file is bounds-checked before use: a truncated
//! or corrupt file yields [`ModelError::Truncated`] / [`ModelError::Corrupt`], never a panic or
//! a huge allocation.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::ModelError;
use crate::tensors::{DType, RawTensor, TensorBytes, TensorSource};

const MAGIC: &[u8; 4] = b"GGUF";
/// Default data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: usize = 32;
/// ggml's `GGML_MAX_DIMS`.
const MAX_DIMS: u32 = 4;
/// Arrays of arrays are legal but never deep in practice; the cap stops a crafted file from
/// overflowing the stack through recursion.
const MAX_ARRAY_NESTING: usize = 8;
/// Most tensors a GGUF file may declare (the largest published models have a few thousand).
pub const MAX_TENSORS: u64 = 1 << 20;
/// Most metadata entries a GGUF file may declare.
pub const MAX_METADATA_ENTRIES: u64 = 1 << 16;
/// Longest metadata string or tensor name, in bytes (chat templates are the longest real
/// strings, at tens of kilobytes).
pub const MAX_STRING_BYTES: u64 = 16 << 20;
/// Most elements of one metadata array (vocabularies and merge lists have a few hundred
/// thousand).
pub const MAX_ARRAY_LEN: u64 = 1 << 24;

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<GgufValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl GgufValue {
    /// GGUF's type id of this value (`GGUF_TYPE_*`).
    pub fn type_id(&self) -> u32 {
        match self {
            GgufValue::U8(_) => 0,
            GgufValue::I8(_) => 1,
            GgufValue::U16(_) => 2,
            GgufValue::I16(_) => 3,
            GgufValue::U32(_) => 4,
            GgufValue::I32(_) => 5,
            GgufValue::F32(_) => 6,
            GgufValue::Bool(_) => 7,
            GgufValue::String(_) => 8,
            GgufValue::Array(_) => 9,
            GgufValue::U64(_) => 10,
            GgufValue::I64(_) => 11,
            GgufValue::F64(_) => 12,
        }
    }

    /// The value as a signed integer, for any integer type that fits.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            GgufValue::U8(v) => Some(v.into()),
            GgufValue::I8(v) => Some(v.into()),
            GgufValue::U16(v) => Some(v.into()),
            GgufValue::I16(v) => Some(v.into()),
            GgufValue::U32(v) => Some(v.into()),
            GgufValue::I32(v) => Some(v.into()),
            GgufValue::U64(v) => i64::try_from(v).ok(),
            GgufValue::I64(v) => Some(v),
            _ => None,
        }
    }

    /// The value as an unsigned integer, for any non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U64(v) => Some(v),
            _ => self.as_i64().and_then(|v| u64::try_from(v).ok()),
        }
    }

    /// The value as a float, for any numeric type.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v.into()),
            GgufValue::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    /// The value if it is a bool.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// The value if it is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The elements if the value is an array.
    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// ggml's name for a tensor type id, for error messages.
pub fn ggml_type_name(id: u32) -> &'static str {
    const NAMES: [&str; 40] = [
        "F32",
        "F16",
        "Q4_0",
        "Q4_1",
        "Q4_2",
        "Q4_3",
        "Q5_0",
        "Q5_1",
        "Q8_0",
        "Q8_1",
        "Q2_K",
        "Q3_K",
        "Q4_K",
        "Q5_K",
        "Q6_K",
        "Q8_K",
        "IQ2_XXS",
        "IQ2_XS",
        "IQ3_XXS",
        "IQ1_S",
        "IQ4_NL",
        "IQ3_S",
        "IQ2_S",
        "IQ4_XS",
        "I8",
        "I16",
        "I32",
        "I64",
        "F64",
        "IQ1_M",
        "BF16",
        "Q4_0_4_4",
        "Q4_0_4_8",
        "Q4_0_8_8",
        "TQ1_0",
        "TQ2_0",
        "IQ4_NL_4_4",
        "IQ4_NL_4_8",
        "IQ4_NL_8_8",
        "MXFP4",
    ];
    NAMES.get(id as usize).copied().unwrap_or("unknown")
}

/// The storage type for a ggml type id, if the engine supports it.
pub fn dtype_from_ggml(id: u32) -> Option<DType> {
    Some(match id {
        0 => DType::F32,
        1 => DType::F16,
        2 => DType::Q4_0,
        3 => DType::Q4_1,
        6 => DType::Q5_0,
        7 => DType::Q5_1,
        8 => DType::Q8_0,
        10 => DType::Q2_K,
        11 => DType::Q3_K,
        12 => DType::Q4_K,
        13 => DType::Q5_K,
        14 => DType::Q6_K,
        15 => DType::Q8_K,
        20 => DType::IQ4_NL,
        23 => DType::IQ4_XS,
        30 => DType::BF16,
        _ => return None,
    })
}

/// The ggml type id of a storage type.
pub fn ggml_from_dtype(dtype: DType) -> u32 {
    match dtype {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::Q4_0 => 2,
        DType::Q4_1 => 3,
        DType::Q5_0 => 6,
        DType::Q5_1 => 7,
        DType::Q8_0 => 8,
        DType::Q2_K => 10,
        DType::Q3_K => 11,
        DType::Q4_K => 12,
        DType::Q5_K => 13,
        DType::Q6_K => 14,
        DType::Q8_K => 15,
        DType::IQ4_NL => 20,
        DType::IQ4_XS => 23,
        DType::BF16 => 30,
    }
}

/// One entry of the tensor-info table, as the file names it.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufTensorInfo {
    /// The llama.cpp name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Row-major shape, outermost first (GGUF stores dims innermost first; this is reversed).
    pub shape: Vec<usize>,
    /// ggml type id.
    pub ggml_type: u32,
    /// Offset relative to the start of the data section.
    pub offset: u64,
}

impl GgufTensorInfo {
    /// The engine's storage type, or `None` when the ggml type is unsupported.
    pub fn dtype(&self) -> Option<DType> {
        dtype_from_ggml(self.ggml_type)
    }
}

/// An open, memory-mapped GGUF file.
pub struct GgufFile {
    path: PathBuf,
    data: TensorBytes,
    version: u32,
    metadata: Vec<(String, GgufValue)>,
    metadata_index: HashMap<String, usize>,
    tensors: Vec<GgufTensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: usize,
    data_offset: usize,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata_keys", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .field("alignment", &self.alignment)
            .finish()
    }
}

impl GgufFile {
    /// Memory-maps and parses `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, ModelError> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|e| ModelError::io(path, e))?;
        // SAFETY: the map is read-only. As with every memory-mapped model loader, the file must
        // not be truncated by another process while it is open.
        let mmap = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| ModelError::io(path, e))?;
        Self::from_bytes(path, Arc::new(mmap))
    }

    /// Parses a GGUF image already in memory; `path` is only used in error messages.
    pub fn from_bytes(path: impl Into<PathBuf>, data: TensorBytes) -> Result<Self, ModelError> {
        let path = path.into();
        let parsed = reader::parse(&path, (*data).as_ref())?;
        Ok(GgufFile {
            path,
            data,
            version: parsed.version,
            metadata_index: parsed
                .metadata
                .iter()
                .enumerate()
                .map(|(i, (k, _))| (k.clone(), i))
                .collect(),
            metadata: parsed.metadata,
            tensor_index: parsed
                .tensors
                .iter()
                .enumerate()
                .map(|(i, t)| (t.name.clone(), i))
                .collect(),
            tensors: parsed.tensors,
            alignment: parsed.alignment,
            data_offset: parsed.data_offset,
        })
    }

    /// The path the file was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Alignment of the data section and of every tensor in it.
    pub fn alignment(&self) -> usize {
        self.alignment
    }

    /// Absolute file offset of the data section.
    pub fn data_offset(&self) -> usize {
        self.data_offset
    }

    /// All metadata, in file order.
    pub fn metadata(&self) -> &[(String, GgufValue)] {
        &self.metadata
    }

    /// The metadata value under `key`.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata_index.get(key).map(|&i| &self.metadata[i].1)
    }

    fn wrong_type(&self, key: &str, want: &str) -> ModelError {
        let found = self.get(key).map(GgufValue::type_id).unwrap_or(u32::MAX);
        ModelError::corrupt(
            &self.path,
            format!("metadata {key:?} should be {want}, found GGUF value type {found}"),
        )
    }

    /// `key` as an unsigned integer; `Ok(None)` when absent, an error when of another type.
    pub fn get_u64(&self, key: &str) -> Result<Option<u64>, ModelError> {
        self.get(key)
            .map(|v| {
                v.as_u64()
                    .ok_or_else(|| self.wrong_type(key, "a non-negative integer"))
            })
            .transpose()
    }

    /// `key` as a float (any numeric type); `Ok(None)` when absent.
    pub fn get_f64(&self, key: &str) -> Result<Option<f64>, ModelError> {
        self.get(key)
            .map(|v| v.as_f64().ok_or_else(|| self.wrong_type(key, "a number")))
            .transpose()
    }

    /// `key` as a string; `Ok(None)` when absent.
    pub fn get_str(&self, key: &str) -> Result<Option<&str>, ModelError> {
        self.get(key)
            .map(|v| v.as_str().ok_or_else(|| self.wrong_type(key, "a string")))
            .transpose()
    }

    /// `key` as a bool; `Ok(None)` when absent.
    pub fn get_bool(&self, key: &str) -> Result<Option<bool>, ModelError> {
        self.get(key)
            .map(|v| v.as_bool().ok_or_else(|| self.wrong_type(key, "a bool")))
            .transpose()
    }

    /// `key` as an array; `Ok(None)` when absent.
    pub fn get_array(&self, key: &str) -> Result<Option<&[GgufValue]>, ModelError> {
        self.get(key)
            .map(|v| v.as_array().ok_or_else(|| self.wrong_type(key, "an array")))
            .transpose()
    }

    /// The tensor-info table, in file order.
    pub fn tensor_infos(&self) -> &[GgufTensorInfo] {
        &self.tensors
    }

    /// The info of the tensor the file calls `name`.
    pub fn tensor_info(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The tensor the file calls `name` (llama.cpp name), reported under that same name.
    pub fn tensor(&self, name: &str) -> Result<RawTensor, ModelError> {
        let info = self
            .tensor_info(name)
            .ok_or_else(|| ModelError::MissingTensor {
                path: self.path.clone(),
                tensor: name.to_string(),
            })?;
        self.raw_tensor(info, name)
    }

    fn raw_tensor(
        &self,
        info: &GgufTensorInfo,
        report_name: &str,
    ) -> Result<RawTensor, ModelError> {
        let dtype = info
            .dtype()
            .ok_or_else(|| ModelError::UnsupportedTensorType {
                path: self.path.clone(),
                tensor: info.name.clone(),
                dtype: format!(
                    "ggml type {} ({})",
                    info.ggml_type,
                    ggml_type_name(info.ggml_type)
                ),
            })?;
        // Re-derive the window (cheap) rather than trusting state: `parse` checked it already.
        let (offset, len) = tensor_window(&self.path, info, dtype, self.data_offset)?;
        if offset
            .checked_add(len)
            .is_none_or(|end| end > (*self.data).as_ref().len())
        {
            return Err(truncated(
                &self.path,
                format!(
                    "data of tensor {:?} runs past the end of the file",
                    info.name
                ),
            ));
        }
        Ok(RawTensor {
            name: report_name.to_string(),
            dtype,
            shape: info.shape.clone(),
            data: self.data.clone(),
            offset,
            len,
        })
    }
}

fn truncated(path: &Path, reason: impl Into<String>) -> ModelError {
    ModelError::Truncated {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// Absolute `(offset, len)` of a tensor's data.
fn tensor_window(
    path: &Path,
    info: &GgufTensorInfo,
    dtype: DType,
    data_offset: usize,
) -> Result<(usize, usize), ModelError> {
    let len = dtype.storage_bytes(&info.shape).ok_or_else(|| {
        ModelError::corrupt(
            path,
            format!(
                "tensor {:?}: shape {:?} is not a whole number of {} blocks or overflows",
                info.name, info.shape, dtype
            ),
        )
    })?;
    let offset = usize::try_from(info.offset)
        .ok()
        .and_then(|o| o.checked_add(data_offset))
        .ok_or_else(|| {
            ModelError::corrupt(path, format!("tensor {:?}: offset overflows", info.name))
        })?;
    Ok((offset, len))
}

mod mla_tensors;
mod quantize;
mod reader;
mod tensor_source;
mod writer;

pub use quantize::{quantize_gguf, QuantReport, QuantTarget};
pub use tensor_source::{hf_name_for_gguf, GgufTensorSource};
pub use writer::{encode_gguf, GgufTensorSpec};

#[cfg(test)]
mod mla_tests;
#[cfg(test)]
mod tests;
