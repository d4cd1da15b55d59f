//! Entry points of the fuzz targets in `fuzz/` for the untrusted files a model loader
//! reads (GGUF, safetensors, `config.json`, chat templates), kept in the crate so that the
//! unit tests below replay every input the fuzzers ever found (`fuzz/regressions/<target>/`)
//! in a plain `cargo test`, without the fuzzer.
//!
//! Each function reads arbitrary bytes the way the loader does and returns; rejecting them
//! with an error is fine, a panic, an unbounded allocation or an endless loop is a bug.
//!
//! ```
//! dcpserve_model::fuzzing::gguf(b"GGUF\x03\0\0\0garbage");
//! ```

use std::path::Path;
use std::sync::Arc;

use dcpserve_kernels::{dequantize, matmul, DType, ThreadPool, WeightMatrix};

use crate::chat_template::{ChatTemplate, RenderLimits};
use crate::gguf::{GgufFile, GgufTensorSource};
use crate::gguf_config::config_from_gguf;
use crate::gguf_tokenizer::tokenizer_from_gguf;
use crate::hf_config::config_from_json;
use crate::safetensors_source::SafetensorsSource;
use crate::tensors::{TensorBytes, TensorSource};

/// Every storage type, indexed by the fuzz input.
const DTYPES: [DType; 16] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::Q8_0,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q2_K,
    DType::Q3_K,
    DType::Q4_K,
    DType::Q5_K,
    DType::Q6_K,
    DType::Q8_K,
    DType::IQ4_NL,
    DType::IQ4_XS,
];

/// Decodes every tensor of `source` (their sizes are bounded by the bytes behind them).
fn decode_all(source: &dyn TensorSource) {
    for name in source.names() {
        if let Ok(t) = source.get(&name) {
            let _ = t.to_f32_vec();
        }
    }
}

/// A GGUF file: header, metadata, tensor infos, the configuration, tokenizer and chat
/// template read from the metadata, and every tensor decoded from its blocks.
pub fn gguf(data: &[u8]) {
    let bytes: TensorBytes = Arc::new(data.to_vec());
    let Ok(file) = GgufFile::from_bytes("fuzz.gguf", bytes) else {
        return;
    };
    let file = Arc::new(file);
    let config = config_from_gguf(&file);
    if let Ok(tokenizer) = tokenizer_from_gguf(&file) {
        let _ = tokenizer.encode("Hello <s> wörld 123", true);
    }
    let _ = ChatTemplate::from_gguf(&file, None, None);
    if let Ok(source) = GgufTensorSource::new(file) {
        if let Ok(config) = config {
            let _ = crate::source::validate_tensors(&config, &source, Path::new("fuzz.gguf"));
        }
        decode_all(&source);
    }
}

/// Quantized blocks: `data[0]` picks the type, `data[1..9]` and `data[9..17]` a row and
/// column count (any `u64`s), the rest are the blocks, decoded on their own and as a weight
/// matrix of that shape (rows decoded one by one, and multiplied by a vector).
pub fn quant_blocks(data: &[u8]) {
    let (Some(&t), Some(rows), Some(cols)) = (data.first(), data.get(1..9), data.get(9..17)) else {
        return;
    };
    let dtype = DTYPES[t as usize % DTYPES.len()];
    let rows = u64::from_le_bytes(rows.try_into().unwrap_or_default()) as usize;
    let cols = u64::from_le_bytes(cols.try_into().unwrap_or_default()) as usize;
    let blocks = &data[17..];
    let elems = blocks.len() / dtype.block_bytes() * dtype.block_elems();
    let mut out = vec![0f32; elems];
    let _ = dequantize(dtype, blocks, &mut out);
    // A wrong element count is an error, not a read past the end.
    let mut more = vec![0f32; elems + dtype.block_elems()];
    assert!(dequantize(dtype, blocks, &mut more).is_err());

    let shared: TensorBytes = Arc::new(blocks.to_vec());
    let Ok(w) = WeightMatrix::from_bytes(dtype, rows, cols, shared, 0, blocks.len()) else {
        return;
    };
    if w.cols() == 0 {
        return; // any number of empty rows fits in no bytes
    }
    // Accepted: the shape holds exactly the given bytes, so these sizes are bounded.
    assert!(w.rows().saturating_mul(w.cols()) <= elems.max(blocks.len()));
    let mut row = vec![0f32; w.cols()];
    for r in 0..w.rows() {
        w.dequantize_row(r, &mut row).unwrap();
    }
    let x = vec![1f32; w.cols()];
    let mut y = vec![0f32; w.rows()];
    let _ = matmul(&ThreadPool::new(1), &x, 1, &w, &mut y);
}

/// A safetensors file (`data[0]` even), or (`data[0]` odd) an index JSON, a NUL byte, and
/// the one shard every file name of the index loads.
pub fn safetensors(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let source = if mode % 2 == 0 {
        let bytes: TensorBytes = Arc::new(rest.to_vec());
        SafetensorsSource::from_buffers(vec![("model.safetensors".into(), bytes)])
    } else {
        let split = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        let Ok(json) = serde_json::from_slice(&rest[..split]) else {
            return;
        };
        let shard: TensorBytes = Arc::new(rest.get(split + 1..).unwrap_or_default().to_vec());
        SafetensorsSource::from_index_json(Path::new("m/index.json"), &json, |_| Ok(shard.clone()))
    };
    if let Ok(source) = source {
        decode_all(&source);
    }
}

/// A `config.json` (dense Llama / Qwen layouts and DeepSeek's MLA + MoE layout), and the
/// sizes derived from an accepted one.
pub fn config_json(data: &[u8]) {
    let Ok(json) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    if let Ok(c) = config_from_json(Path::new("config.json"), &json) {
        let _ = c.kv_shape();
        let _ = c.attention_kind();
        if let Some(mla) = &c.mla {
            let _ = mla.latent_dim();
        }
    }
}

/// Render bounds of the chat-template target: small, so that hostile loops end quickly.
pub const FUZZ_RENDER_LIMITS: RenderLimits = RenderLimits {
    fuel: 100_000,
    max_output_bytes: 1 << 20,
};

/// A chat template and its context: the template source, a NUL byte, then a JSON object
/// (or, when the rest is not JSON, its text as one user message).
pub fn chat_template(data: &[u8]) {
    let split = data.iter().position(|&b| b == 0).unwrap_or(data.len());
    let source = String::from_utf8_lossy(&data[..split]);
    let rest = data.get(split + 1..).unwrap_or_default();
    let context = match serde_json::from_slice::<serde_json::Value>(rest) {
        Ok(v) if v.is_object() => v,
        _ => serde_json::json!({
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": String::from_utf8_lossy(rest)},
            ],
            "add_generation_prompt": true,
        }),
    };
    let Ok(t) = ChatTemplate::with_limits(&source, Some("<s>"), Some("</s>"), FUZZ_RENDER_LIMITS)
    else {
        return;
    };
    if let Ok(out) = t.render_json(&context) {
        assert!(out.len() <= FUZZ_RENDER_LIMITS.max_output_bytes);
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    /// The inputs the fuzzers found for `target`, committed under `fuzz/regressions/`.
    pub(crate) fn regressions(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../fuzz/regressions")
            .join(target);
        let mut out = Vec::new();
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for e in entries.flatten() {
                let path = e.path();
                if let Ok(bytes) = std::fs::read(&path) {
                    out.push((path, bytes));
                }
            }
        }
        out.sort();
        out
    }

    fn replay(target: &str, run: fn(&[u8])) {
        for (path, bytes) in regressions(target) {
            eprintln!("replaying {}", path.display());
            run(&bytes);
        }
    }

    #[test]
    fn gguf_regressions() {
        replay("gguf", super::gguf);
    }

    #[test]
    fn quant_blocks_regressions() {
        replay("quant_blocks", super::quant_blocks);
    }

    #[test]
    fn safetensors_regressions() {
        replay("safetensors", super::safetensors);
    }

    #[test]
    fn config_json_regressions() {
        replay("config_json", super::config_json);
    }

    #[test]
    fn chat_template_regressions() {
        replay("chat_template", super::chat_template);
    }
}
