//! GGUF tensors under Hugging Face names.

use super::*;

/// Maps a llama.cpp tensor name to its Hugging Face name; `None` for names without one.
pub fn hf_name_for_gguf(name: &str) -> Option<String> {
    let (stem, suffix) = name.rsplit_once('.')?;
    if suffix != "weight" && suffix != "bias" {
        return None;
    }
    let global = match stem {
        "token_embd" => Some("model.embed_tokens"),
        "output_norm" => Some("model.norm"),
        "output" => Some("lm_head"),
        _ => None,
    };
    if let Some(hf) = global {
        return Some(format!("{hf}.{suffix}"));
    }
    let rest = stem.strip_prefix("blk.")?;
    let (layer, part) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let hf = match part {
        "attn_norm" => "input_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "attn_q_norm" => "self_attn.q_norm",
        "attn_k_norm" => "self_attn.k_norm",
        "ffn_norm" => "post_attention_layernorm",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf}.{suffix}"))
}

/// A GGUF file as a [`TensorSource`] under Hugging Face names.
///
/// The q/k weights keep llama.cpp's layout: for `llama` files the converter permuted their rows
/// for interleaved RoPE, which the forward pass handles (`ModelConfig::rope_interleaved`)
/// instead of un-permuting here. Tensors without a Hugging Face name (e.g.
/// `rope_freqs.weight`) are listed under their GGUF name.
#[derive(Debug, Clone)]
pub struct GgufTensorSource {
    file: Arc<GgufFile>,
    /// Hugging Face (or unmapped GGUF) name → GGUF name.
    names: HashMap<String, String>,
}

impl GgufTensorSource {
    /// Indexes `file`'s tensors under Hugging Face names; fails if two map to one name.
    pub fn new(file: Arc<GgufFile>) -> Result<Self, ModelError> {
        let mut names = HashMap::new();
        for info in file.tensor_infos() {
            let hf = hf_name_for_gguf(&info.name).unwrap_or_else(|| info.name.clone());
            if let Some(other) = names.insert(hf.clone(), info.name.clone()) {
                return Err(ModelError::corrupt(
                    file.path(),
                    format!("tensors {other:?} and {:?} both map to {hf:?}", info.name),
                ));
            }
        }
        Ok(GgufTensorSource { file, names })
    }

    /// The underlying file.
    pub fn file(&self) -> &Arc<GgufFile> {
        &self.file
    }
}

impl TensorSource for GgufTensorSource {
    fn get(&self, name: &str) -> Result<RawTensor, ModelError> {
        let info = self
            .names
            .get(name)
            .and_then(|g| self.file.tensor_info(g))
            .ok_or_else(|| ModelError::MissingTensor {
                path: self.file.path().to_path_buf(),
                tensor: name.to_string(),
            })?;
        self.file.raw_tensor(info, name)
    }

    fn contains(&self, name: &str) -> bool {
        self.names.contains_key(name)
    }

    fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.names.keys().cloned().collect();
        v.sort();
        v
    }
}
