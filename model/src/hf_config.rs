//! [`ModelConfig`] from a Hugging Face folder: `config.json`, with BOS/EOS ids completed from
//! `generation_config.json`.

use std::path::Path;

use serde_json::{Map, Value};

use crate::config::{Architecture, ModelConfig, RopeScaling};
use crate::config_keys::ConfigKeys;
use crate::error::ModelError;
use crate::json_file::{read_json, read_json_opt};

/// Token ids given as an int or a list of ints (`eos_token_id` may be either).
pub(crate) fn token_ids(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .into_iter()
            .collect(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_u64().and_then(|n| u32::try_from(n).ok()))
            .collect(),
        _ => Vec::new(),
    }
}

fn architecture(path: &Path, obj: &Map<String, Value>) -> Result<Architecture, ModelError> {
    let archs: Vec<&str> = obj
        .get("architectures")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    for a in &archs {
        match *a {
            "LlamaForCausalLM" => return Ok(Architecture::Llama),
            "Qwen2ForCausalLM" => return Ok(Architecture::Qwen2),
            "Qwen3ForCausalLM" => return Ok(Architecture::Qwen3),
            "DeepseekV2ForCausalLM" | "DeepseekV3ForCausalLM" => {
                return Ok(Architecture::DeepseekV3)
            }
            _ => {}
        }
    }
    let model_type = obj.get("model_type").and_then(Value::as_str);
    match model_type {
        // Only trust model_type when no (other) architecture is named: e.g. a
        // `LlamaForSequenceClassification` head must not load as a causal LM.
        Some("llama") if archs.is_empty() => Ok(Architecture::Llama),
        Some("qwen2") if archs.is_empty() => Ok(Architecture::Qwen2),
        Some("qwen3") if archs.is_empty() => Ok(Architecture::Qwen3),
        Some("deepseek_v2" | "deepseek_v3" | "kimi_k2") if archs.is_empty() => {
            Ok(Architecture::DeepseekV3)
        }
        _ => Err(ModelError::UnsupportedArchitecture {
            path: path.to_path_buf(),
            arch: if archs.is_empty() {
                model_type.unwrap_or("<none given>").to_string()
            } else {
                archs.join(", ")
            },
        }),
    }
}

/// Parses a `rope_scaling` / `rope_parameters` object. Types without scaling (`default`) give
/// `None`; types the engine does not implement give an error.
fn rope_scaling(path: &Path, v: Option<&Value>) -> Result<Option<RopeScaling>, ModelError> {
    let Some(obj) = v.and_then(Value::as_object) else {
        return Ok(None);
    };
    let f = ConfigKeys { path, obj };
    let ty = obj
        .get("rope_type")
        .or_else(|| obj.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let factor = || {
        f.f64_opt("factor")?
            .map(|x| x as f32)
            .ok_or_else(|| ModelError::config(path, format!("rope scaling {ty:?} without factor")))
    };
    match ty {
        "default" => Ok(None),
        "linear" => Ok(Some(RopeScaling::Linear { factor: factor()? })),
        "llama3" => Ok(Some(RopeScaling::Llama3 {
            factor: factor()?,
            low_freq_factor: f.f64_opt("low_freq_factor")?.unwrap_or(1.0) as f32,
            high_freq_factor: f.f64_opt("high_freq_factor")?.unwrap_or(4.0) as f32,
            original_max_position_embeddings: f.usize("original_max_position_embeddings")?,
        })),
        other => Err(ModelError::unsupported(
            path,
            format!("rope scaling type {other:?} (supported: linear, llama3)"),
        )),
    }
}

/// Builds the configuration from a parsed `config.json` (`path` names it in errors).
pub fn config_from_json(path: &Path, json: &Value) -> Result<ModelConfig, ModelError> {
    let obj = json
        .as_object()
        .ok_or_else(|| ModelError::config(path, "config.json is not a JSON object"))?;
    let f = ConfigKeys { path, obj };
    let architecture = architecture(path, obj)?;

    let hidden_size = f.usize("hidden_size")?;
    let num_attention_heads = f.usize("num_attention_heads")?;
    if num_attention_heads == 0 || hidden_size == 0 {
        return Err(ModelError::config(
            path,
            "hidden_size and num_attention_heads must be positive",
        ));
    }
    let num_key_value_heads = f
        .usize_opt("num_key_value_heads")?
        .unwrap_or(num_attention_heads);
    if num_key_value_heads == 0 || !num_attention_heads.is_multiple_of(num_key_value_heads) {
        return Err(ModelError::config(
            path,
            format!("num_attention_heads {num_attention_heads} is not a multiple of num_key_value_heads {num_key_value_heads}"),
        ));
    }
    let head_dim = f
        .usize_opt("head_dim")?
        .unwrap_or(hidden_size / num_attention_heads);

    // transformers 5 moved rope_theta and the scaling into `rope_parameters`; older configs
    // have top-level `rope_theta` and `rope_scaling`.
    let rope_params = obj.get("rope_parameters").filter(|v| v.is_object());
    let rope_theta = match rope_params
        .and_then(|p| p.get("rope_theta"))
        .and_then(Value::as_f64)
    {
        Some(t) => t,
        None => f.f64_opt("rope_theta")?.unwrap_or(10000.0),
    };
    // DeepSeek's YaRN lives in its MLA configuration (it also scales the softmax).
    let rope_scaling = match obj.get("rope_scaling").filter(|v| !v.is_null()) {
        _ if architecture == Architecture::DeepseekV3 => None,
        Some(v) => rope_scaling(path, Some(v))?,
        None => rope_scaling(path, rope_params)?,
    };
    let (mla, moe) = if architecture == Architecture::DeepseekV3 {
        let (mla, moe) = crate::arch::mla_moe_from_json(path, obj)?;
        (Some(mla), Some(moe))
    } else {
        (None, None)
    };

    // Defaults are those of transformers' LlamaConfig / Qwen2Config / Qwen3Config.
    let (default_max_pos, default_eps) = match architecture {
        Architecture::Llama => (2048, 1e-6),
        Architecture::Qwen2 | Architecture::Qwen3 => (32768, 1e-6),
        Architecture::DeepseekV3 => (4096, 1e-6),
    };
    let attention_bias = match architecture {
        // Qwen2's attention hard-codes bias=True on q/k/v.
        Architecture::Qwen2 => true,
        Architecture::Llama | Architecture::Qwen3 | Architecture::DeepseekV3 => {
            f.bool_or("attention_bias", false)?
        }
    };

    let config = ModelConfig {
        architecture,
        hidden_size,
        intermediate_size: f.usize("intermediate_size")?,
        num_hidden_layers: f.usize("num_hidden_layers")?,
        num_attention_heads,
        num_key_value_heads,
        head_dim,
        vocab_size: f.usize("vocab_size")?,
        rms_norm_eps: f.f64_opt("rms_norm_eps")?.unwrap_or(default_eps) as f32,
        rope_theta: rope_theta as f32,
        rope_scaling,
        rope_interleaved: false,
        max_position_embeddings: f
            .usize_opt("max_position_embeddings")?
            .unwrap_or(default_max_pos),
        tie_word_embeddings: f.bool_or("tie_word_embeddings", false)?,
        attention_bias,
        qk_norm: architecture == Architecture::Qwen3,
        bos_token_id: token_ids(obj.get("bos_token_id")).first().copied(),
        eos_token_ids: token_ids(obj.get("eos_token_id")),
        mla,
        moe,
    };
    crate::config_check::check_config(path, &config)?;
    Ok(config)
}

/// Reads `dir/config.json`, then lets `dir/generation_config.json` (what generation actually
/// uses) override the BOS/EOS ids. Ids only named as strings in `tokenizer_config.json` are
/// resolved later, with the tokenizer (see `ModelFiles::open`).
pub fn load_hf_config(dir: &Path) -> Result<ModelConfig, ModelError> {
    let path = dir.join("config.json");
    if !path.is_file() {
        return Err(ModelError::MissingFile {
            path,
            what: "a Hugging Face model folder needs config.json".into(),
        });
    }
    let mut config = config_from_json(&path, &read_json(&path)?)?;
    if let Some(gen) = read_json_opt(&dir.join("generation_config.json"))? {
        if let Some(bos) = token_ids(gen.get("bos_token_id")).first() {
            config.bos_token_id = Some(*bos);
        }
        let eos = token_ids(gen.get("eos_token_id"));
        if !eos.is_empty() {
            config.eos_token_ids = eos;
        }
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base() -> Value {
        json!({
            "architectures": ["LlamaForCausalLM"],
            "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100,
            "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "eos_token_id": [5, 6], "bos_token_id": 1
        })
    }

    #[test]
    fn llama_defaults() {
        let c = config_from_json(Path::new("c.json"), &base()).unwrap();
        assert_eq!(c.architecture, Architecture::Llama);
        assert_eq!(c.head_dim, 16);
        assert_eq!(c.eos_token_ids, vec![5, 6]);
        assert_eq!(c.bos_token_id, Some(1));
        assert!(!c.tie_word_embeddings && !c.attention_bias && !c.qk_norm && !c.rope_interleaved);
        assert_eq!(c.rope_theta, 500000.0);
    }

    #[test]
    fn qwen_flags_and_rope_scaling() {
        let mut v = base();
        v["architectures"] = json!(["Qwen2ForCausalLM"]);
        v["rope_scaling"] = json!({"type": "linear", "factor": 2.0});
        let c = config_from_json(Path::new("c.json"), &v).unwrap();
        assert!(c.attention_bias);
        assert_eq!(c.rope_scaling, Some(RopeScaling::Linear { factor: 2.0 }));

        v["architectures"] = json!(["Qwen3ForCausalLM"]);
        v["head_dim"] = json!(32);
        v["rope_scaling"] = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
        let c = config_from_json(Path::new("c.json"), &v).unwrap();
        assert!(c.qk_norm && !c.attention_bias);
        assert_eq!(c.head_dim, 32);
        assert!(matches!(c.rope_scaling, Some(RopeScaling::Llama3 { .. })));

        v["rope_scaling"] = json!({"rope_type": "yarn", "factor": 4.0});
        let e = config_from_json(Path::new("c.json"), &v)
            .unwrap_err()
            .to_string();
        assert!(e.contains("yarn") && e.contains("c.json"), "{e}");
    }

    #[test]
    fn unknown_architecture_and_missing_fields() {
        let mut v = base();
        v["architectures"] = json!(["MambaForCausalLM"]);
        let e = config_from_json(Path::new("c.json"), &v).unwrap_err();
        assert!(
            matches!(e, ModelError::UnsupportedArchitecture { .. }),
            "{e}"
        );
        let mut v = base();
        v.as_object_mut().unwrap().remove("architectures");
        v["model_type"] = json!("qwen3");
        assert_eq!(
            config_from_json(Path::new("c.json"), &v)
                .unwrap()
                .architecture,
            Architecture::Qwen3
        );
        v.as_object_mut().unwrap().remove("hidden_size");
        let e = config_from_json(Path::new("c.json"), &v)
            .unwrap_err()
            .to_string();
        assert!(e.contains("hidden_size"), "{e}");
    }

    #[test]
    fn transformers5_rope_parameters() {
        let mut v = base();
        v.as_object_mut().unwrap().remove("rope_theta");
        v["rope_parameters"] = json!({"rope_type": "default", "rope_theta": 1e6});
        let c = config_from_json(Path::new("c.json"), &v).unwrap();
        assert_eq!((c.rope_theta, c.rope_scaling), (1e6, None));
    }
}
