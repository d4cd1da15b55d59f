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
        let parsed = parse(&path, (*data).as_ref())?;
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

struct Parsed {
    version: u32,
    metadata: Vec<(String, GgufValue)>,
    tensors: Vec<GgufTensorInfo>,
    alignment: usize,
    data_offset: usize,
}

/// A bounds-checked little-endian cursor.
struct Reader<'a> {
    path: &'a Path,
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8], ModelError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        match end {
            Some(end) => {
                let s = &self.buf[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => Err(truncated(
                self.path,
                format!(
                    "{} needs {n} bytes at offset {}, file has {}",
                    what(),
                    self.pos,
                    self.buf.len()
                ),
            )),
        }
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], ModelError> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, ModelError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, ModelError> {
        self.array(what).map(u64::from_le_bytes)
    }

    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, ModelError> {
        let len = self.u64(what)?;
        if len > MAX_STRING_BYTES {
            return Err(ModelError::corrupt(
                self.path,
                format!(
                    "{} is a string of {len} bytes, more than the {MAX_STRING_BYTES} allowed",
                    what()
                ),
            ));
        }
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|e| {
            ModelError::corrupt(self.path, format!("{} is not valid UTF-8: {e}", what()))
        })
    }

    fn value(
        &mut self,
        ty: u32,
        depth: usize,
        what: &dyn Fn() -> String,
    ) -> Result<GgufValue, ModelError> {
        Ok(match ty {
            0 => GgufValue::U8(u8::from_le_bytes(self.array(what)?)),
            1 => GgufValue::I8(i8::from_le_bytes(self.array(what)?)),
            2 => GgufValue::U16(u16::from_le_bytes(self.array(what)?)),
            3 => GgufValue::I16(i16::from_le_bytes(self.array(what)?)),
            4 => GgufValue::U32(self.u32(what)?),
            5 => GgufValue::I32(i32::from_le_bytes(self.array(what)?)),
            6 => GgufValue::F32(f32::from_le_bytes(self.array(what)?)),
            7 => match self.array::<1>(what)?[0] {
                0 => GgufValue::Bool(false),
                1 => GgufValue::Bool(true),
                b => {
                    return Err(ModelError::corrupt(
                        self.path,
                        format!("{} is a bool with byte value {b}", what()),
                    ))
                }
            },
            8 => GgufValue::String(self.string(what)?),
            9 => {
                if depth >= MAX_ARRAY_NESTING {
                    return Err(ModelError::corrupt(
                        self.path,
                        format!("{} nests arrays deeper than {MAX_ARRAY_NESTING}", what()),
                    ));
                }
                let elem_ty = self.u32(what)?;
                let count = self.u64(what)?;
                if count > MAX_ARRAY_LEN {
                    return Err(ModelError::corrupt(
                        self.path,
                        format!(
                            "{} is an array of {count} elements, more than the {MAX_ARRAY_LEN} allowed",
                            what()
                        ),
                    ));
                }
                // Every element takes at least this many bytes, so a count the rest of the file
                // cannot hold is rejected before anything is allocated for it.
                let min_size: u64 = match elem_ty {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    8 | 10..=12 => 8,
                    9 => 12,
                    t => {
                        return Err(ModelError::corrupt(
                            self.path,
                            format!("{} is an array of unknown value type {t}", what()),
                        ))
                    }
                };
                if count.saturating_mul(min_size) > self.remaining() as u64 {
                    return Err(truncated(
                        self.path,
                        format!(
                            "{} declares {count} array elements, more than the {} bytes left can hold",
                            what(),
                            self.remaining()
                        ),
                    ));
                }
                let mut items = Vec::with_capacity(count as usize);
                for i in 0..count {
                    let item_what = || format!("{}[{i}]", what());
                    items.push(self.value(elem_ty, depth + 1, &item_what)?);
                }
                GgufValue::Array(items)
            }
            10 => GgufValue::U64(self.u64(what)?),
            11 => GgufValue::I64(i64::from_le_bytes(self.array(what)?)),
            12 => GgufValue::F64(f64::from_le_bytes(self.array(what)?)),
            t => {
                return Err(ModelError::corrupt(
                    self.path,
                    format!("{} has unknown value type {t}", what()),
                ))
            }
        })
    }
}

fn parse(path: &Path, buf: &[u8]) -> Result<Parsed, ModelError> {
    let mut r = Reader { path, buf, pos: 0 };
    let magic = r.take(4, &|| "the GGUF magic".into())?;
    if magic != MAGIC {
        return Err(ModelError::corrupt(
            path,
            format!("not a GGUF file (magic {magic:02x?}, expected \"GGUF\")"),
        ));
    }
    let version = r.u32(&|| "the version".into())?;
    // A big-endian file stores e.g. 3 as 0x03000000: the low 16 bits are zero (llama.cpp's test).
    if version & 0xffff == 0 && version != 0 {
        return Err(ModelError::unsupported(
            path,
            format!(
                "big-endian GGUF (version reads as {version:#x}); only little-endian files are supported"
            ),
        ));
    }
    if version != 2 && version != 3 {
        return Err(ModelError::unsupported(
            path,
            format!("GGUF version {version} (supported: 2 and 3)"),
        ));
    }
    let n_tensors = r.u64(&|| "the tensor count".into())?;
    let n_kv = r.u64(&|| "the metadata count".into())?;
    if n_tensors > MAX_TENSORS || n_kv > MAX_METADATA_ENTRIES {
        return Err(ModelError::corrupt(
            path,
            format!(
                "header declares {n_kv} metadata entries and {n_tensors} tensors (at most \
                 {MAX_METADATA_ENTRIES} and {MAX_TENSORS} are allowed)"
            ),
        ));
    }
    // A metadata entry takes at least 12 bytes and a tensor info at least 24.
    if n_kv
        .saturating_mul(12)
        .saturating_add(n_tensors.saturating_mul(24))
        > r.remaining() as u64
    {
        return Err(truncated(
            path,
            format!(
                "header declares {n_kv} metadata entries and {n_tensors} tensors, more than the file can hold"
            ),
        ));
    }

    let mut metadata = Vec::with_capacity(n_kv as usize);
    let mut seen = HashMap::new();
    for i in 0..n_kv {
        let key = r.string(&|| format!("metadata key #{i}"))?;
        let ty = r.u32(&|| format!("the type of metadata {key:?}"))?;
        let value = r.value(ty, 0, &|| format!("metadata {key:?}"))?;
        if seen.insert(key.clone(), ()).is_some() {
            return Err(ModelError::corrupt(
                path,
                format!("duplicate metadata key {key:?}"),
            ));
        }
        metadata.push((key, value));
    }

    let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some((_, v)) => match v.as_u64() {
            Some(a) if a > 0 && a.is_power_of_two() && a <= 1 << 30 => a as usize,
            _ => {
                return Err(ModelError::corrupt(
                    path,
                    format!("general.alignment {v:?} is not a power of two"),
                ))
            }
        },
    };

    let mut tensors = Vec::with_capacity(n_tensors as usize);
    let mut names = HashMap::new();
    for i in 0..n_tensors {
        let name = r.string(&|| format!("the name of tensor #{i}"))?;
        let what = || format!("tensor info of {name:?}");
        let n_dims = r.u32(&what)?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(ModelError::corrupt(
                path,
                format!("tensor {name:?} has {n_dims} dimensions (1 to {MAX_DIMS} allowed)"),
            ));
        }
        let mut shape = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            let d = r.u64(&what)?;
            let d = usize::try_from(d)
                .ok()
                .filter(|&d| d <= i64::MAX as usize)
                .ok_or_else(|| {
                    ModelError::corrupt(path, format!("tensor {name:?} has dimension {d}"))
                })?;
            shape.push(d);
        }
        // GGUF lists ne[0] (the contiguous, innermost dimension) first.
        shape.reverse();
        if shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .is_none()
        {
            return Err(ModelError::corrupt(
                path,
                format!("tensor {name:?}: element count of {shape:?} overflows"),
            ));
        }
        let ggml_type = r.u32(&what)?;
        let offset = r.u64(&what)?;
        if !offset.is_multiple_of(alignment as u64) {
            return Err(ModelError::corrupt(
                path,
                format!("tensor {name:?}: offset {offset} is not a multiple of the alignment {alignment}"),
            ));
        }
        if names.insert(name.clone(), ()).is_some() {
            return Err(ModelError::corrupt(
                path,
                format!("duplicate tensor {name:?}"),
            ));
        }
        tensors.push(GgufTensorInfo {
            name,
            shape,
            ggml_type,
            offset,
        });
    }

    let data_offset = r
        .pos
        .checked_next_multiple_of(alignment)
        .filter(|&o| o <= buf.len() || tensors.is_empty())
        .ok_or_else(|| truncated(path, "the data section starts past the end of the file"))?;

    // Check every supported tensor's data now, so that a truncated download fails at open with
    // the first tensor it cuts off, not later in the middle of loading.
    for info in &tensors {
        let Some(dtype) = info.dtype() else { continue };
        let (offset, len) = tensor_window(path, info, dtype, data_offset)?;
        if offset.checked_add(len).is_none_or(|end| end > buf.len()) {
            return Err(truncated(
                path,
                format!(
                    "tensor {:?} ({} bytes at offset {offset}) runs past the end of the file ({} bytes)",
                    info.name,
                    len,
                    buf.len()
                ),
            ));
        }
    }

    Ok(Parsed {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}

mod mla_tensors;
mod quantize;
mod tensor_source;
mod writer;

pub use quantize::{quantize_gguf, QuantReport, QuantTarget};
pub use tensor_source::{hf_name_for_gguf, GgufTensorSource};
pub use writer::{encode_gguf, GgufTensorSpec};

#[cfg(test)]
mod mla_tests;
#[cfg(test)]
mod tests;
