//! GGUF tensors under Hugging Face names.

use super::mla_tensors::{composite_entries, expert_window, kv_b_from_split, Entry};
use super::*;

/// Maps a llama.cpp tensor name to its Hugging Face name; `None` for names without one.
pub fn hf_name_for_gguf(name: &str) -> Option<String> {
    let (stem, suffix) = name.rsplit_once('.')?;
    if suffix != "weight" && suffix != "bias" {
        return None;
    }
    // DeepSeek-V2/V3 (`deepseek2`): the router's correction bias has no `.weight` / `.bias`
    // suffix on the Hugging Face side.
    if let Some(layer) = stem
        .strip_prefix("blk.")
        .and_then(|r| r.strip_suffix(".exp_probs_b"))
    {
        let layer: usize = layer.parse().ok()?;
        return Some(format!(
            "model.layers.{layer}.mlp.gate.e_score_correction_bias"
        ));
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
        // deepseek2: multi-head latent attention and mixture-of-experts MLPs.
        "attn_q_a" => "self_attn.q_a_proj",
        "attn_q_a_norm" => "self_attn.q_a_layernorm",
        "attn_q_b" => "self_attn.q_b_proj",
        "attn_kv_a_mqa" => "self_attn.kv_a_proj_with_mqa",
        "attn_kv_a_norm" => "self_attn.kv_a_layernorm",
        "attn_kv_b" => "self_attn.kv_b_proj",
        "ffn_gate_inp" => "mlp.gate",
        "ffn_gate_shexp" => "mlp.shared_experts.gate_proj",
        "ffn_up_shexp" => "mlp.shared_experts.up_proj",
        "ffn_down_shexp" => "mlp.shared_experts.down_proj",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf}.{suffix}"))
}

/// A GGUF file as a [`TensorSource`] under Hugging Face names.
///
/// The q/k weights keep llama.cpp's layout: for `llama` files the converter permuted their rows
/// for interleaved RoPE, which the forward pass handles (`ModelConfig::rope_interleaved`)
/// instead of un-permuting here. Tensors without a Hugging Face name (e.g.
/// `rope_freqs.weight`) are listed under their GGUF name. `deepseek2` files also serve
/// per-expert windows of stacked expert tensors and a `kv_b_proj` rebuilt from split
/// `attn_k_b` / `attn_v_b` (module `gguf::mla_tensors`).
#[derive(Debug, Clone)]
pub struct GgufTensorSource {
    file: Arc<GgufFile>,
    /// Hugging Face (or unmapped GGUF) name → where its data is.
    names: HashMap<String, Entry>,
}

impl GgufTensorSource {
    /// Indexes `file`'s tensors under Hugging Face names; fails if two map to one name.
    pub fn new(file: Arc<GgufFile>) -> Result<Self, ModelError> {
        let mut names = HashMap::new();
        for info in file.tensor_infos() {
            let entries = composite_entries(info).unwrap_or_else(|| {
                let hf = hf_name_for_gguf(&info.name).unwrap_or_else(|| info.name.clone());
                vec![(hf, Entry::Whole(info.name.clone()))]
            });
            for (hf, entry) in entries {
                if let Some(other) = names.insert(hf.clone(), entry) {
                    return Err(ModelError::corrupt(
                        file.path(),
                        format!("tensors {other:?} and {:?} both map to {hf:?}", info.name),
                    ));
                }
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
        let missing = |tensor: &str| ModelError::MissingTensor {
            path: self.file.path().to_path_buf(),
            tensor: tensor.to_string(),
        };
        let gguf = |g: &str| {
            let info = self.file.tensor_info(g).ok_or_else(|| missing(g))?;
            self.file.raw_tensor(info, name)
        };
        match self.names.get(name).ok_or_else(|| missing(name))? {
            Entry::Whole(g) => gguf(g),
            Entry::Expert { stacked, index } => Ok(expert_window(gguf(stacked)?, *index, name)),
            Entry::KvB { k_b, v_b } => {
                kv_b_from_split(self.file.path(), &gguf(k_b)?, &gguf(v_b)?, name)
            }
        }
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
