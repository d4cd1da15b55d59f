//! Writing GGUF files (tests and tiny synthetic models).

use super::*;

/// A tensor to write with [`encode_gguf`].
#[derive(Debug, Clone)]
pub struct GgufTensorSpec {
    pub name: String,
    pub ggml_type: u32,
    /// Row-major shape, outermost first.
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

pub(super) fn encode_value(out: &mut Vec<u8>, v: &GgufValue) {
    match v {
        GgufValue::U8(x) => out.extend(x.to_le_bytes()),
        GgufValue::I8(x) => out.extend(x.to_le_bytes()),
        GgufValue::U16(x) => out.extend(x.to_le_bytes()),
        GgufValue::I16(x) => out.extend(x.to_le_bytes()),
        GgufValue::U32(x) => out.extend(x.to_le_bytes()),
        GgufValue::I32(x) => out.extend(x.to_le_bytes()),
        GgufValue::F32(x) => out.extend(x.to_le_bytes()),
        GgufValue::Bool(x) => out.push(u8::from(*x)),
        GgufValue::String(s) => {
            out.extend((s.len() as u64).to_le_bytes());
            out.extend(s.as_bytes());
        }
        GgufValue::Array(items) => {
            // An empty array's element type is not recorded in the value; u8 is as good as any.
            let ty = items.first().map(GgufValue::type_id).unwrap_or(0);
            out.extend(ty.to_le_bytes());
            out.extend((items.len() as u64).to_le_bytes());
            for item in items {
                encode_value(out, item);
            }
        }
        GgufValue::U64(x) => out.extend(x.to_le_bytes()),
        GgufValue::I64(x) => out.extend(x.to_le_bytes()),
        GgufValue::F64(x) => out.extend(x.to_le_bytes()),
    }
}

/// Serializes a GGUF v3 image (little-endian, alignment from `general.alignment` or 32). For
/// tests and tiny synthetic models; arrays must be homogeneous.
pub fn encode_gguf(metadata: &[(String, GgufValue)], tensors: &[GgufTensorSpec]) -> Vec<u8> {
    let alignment = metadata
        .iter()
        .find(|(k, _)| k == "general.alignment")
        .and_then(|(_, v)| v.as_u64())
        .filter(|a| a.is_power_of_two())
        .unwrap_or(DEFAULT_ALIGNMENT as u64) as usize;
    let mut out = Vec::new();
    out.extend(MAGIC);
    out.extend(3u32.to_le_bytes());
    out.extend((tensors.len() as u64).to_le_bytes());
    out.extend((metadata.len() as u64).to_le_bytes());
    for (k, v) in metadata {
        encode_value(&mut out, &GgufValue::String(k.clone()));
        out.extend(v.type_id().to_le_bytes());
        encode_value(&mut out, v);
    }
    let mut offset = 0usize;
    let mut offsets = Vec::new();
    for t in tensors {
        encode_value(&mut out, &GgufValue::String(t.name.clone()));
        out.extend((t.shape.len() as u32).to_le_bytes());
        for &d in t.shape.iter().rev() {
            out.extend((d as u64).to_le_bytes());
        }
        out.extend(t.ggml_type.to_le_bytes());
        out.extend((offset as u64).to_le_bytes());
        offsets.push(offset);
        offset = (offset + t.data.len()).next_multiple_of(alignment);
    }
    out.resize(out.len().next_multiple_of(alignment), 0);
    let data_start = out.len();
    for (t, off) in tensors.iter().zip(offsets) {
        out.resize(data_start + off, 0);
        out.extend(&t.data);
    }
    out
}
