//! The bounds-checked parse of a GGUF file's header, metadata and tensor infos: every
//! count, length and offset is checked against the bytes left before it is used.

use std::collections::HashMap;
use std::path::Path;

use super::{
    tensor_window, truncated, GgufTensorInfo, GgufValue, DEFAULT_ALIGNMENT, MAGIC, MAX_ARRAY_LEN,
    MAX_ARRAY_NESTING, MAX_DIMS, MAX_METADATA_ENTRIES, MAX_STRING_BYTES, MAX_TENSORS,
};
use crate::error::ModelError;

/// What the header, metadata and tensor infos of a file say.
pub(super) struct Parsed {
    pub(super) version: u32,
    pub(super) metadata: Vec<(String, GgufValue)>,
    pub(super) tensors: Vec<GgufTensorInfo>,
    pub(super) alignment: usize,
    pub(super) data_offset: usize,
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

pub(super) fn parse(path: &Path, buf: &[u8]) -> Result<Parsed, ModelError> {
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
