//! [`ModelConfig`] from a Hugging Face folder: `config.json`, with BOS/EOS ids completed from
//! `generation_config.json`.

use std::path::Path;

use serde_json::{Map, Value};

use crate::config::{Architecture, ModelConfig, RopeScaling};
use crate::config_keys::ConfigKeys;
use crate::error::ModelError;
use crate::hf_rope;
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

/// The `model_type` of each causal-LM class this engine runs.
fn model_type_of_class(class: &str) -> Option<&'static str> {
    match class {
        "LlamaForCausalLM" => Some("llama"),
        "Qwen2ForCausalLM" => Some("qwen2"),
        "Qwen3ForCausalLM" => Some("qwen3"),
        "DeepseekV2ForCausalLM" => Some("deepseek_v2"),
        "DeepseekV3ForCausalLM" => Some("deepseek_v3"),
        _ => None,
    }
}

/// The architecture of a `model_type` (Kimi K2 publishes its DeepSeek-V3 model as `kimi_k2`).
fn architecture_of_model_type(model_type: &str) -> Option<Architecture> {
    match model_type {
        "llama" => Some(Architecture::Llama),
        "qwen2" => Some(Architecture::Qwen2),
        "qwen3" => Some(Architecture::Qwen3),
        "deepseek_v2" | "deepseek_v3" | "kimi_k2" => Some(Architecture::DeepseekV3),
        _ => None,
    }
}

/// The architecture from `architectures` (the class to instantiate) and `model_type`.
/// transformers 5 writes `"architectures": null` for a config saved on its own: then
/// `model_type` decides. A named class that is not a supported causal LM is refused even when
/// `model_type` is known (a `LlamaForSequenceClassification` head is no causal LM), and a
/// known `model_type` that contradicts the class is an error rather than a guess.
fn architecture(path: &Path, obj: &Map<String, Value>) -> Result<Architecture, ModelError> {
    let archs: Vec<&str> = match obj.get("architectures") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
        Some(v) => {
            return Err(ModelError::config(
                path,
                format!("architectures should be a list of class names, found {v}"),
            ))
        }
    };
    let model_type = obj.get("model_type").and_then(Value::as_str);
    let unsupported = |arch: String| ModelError::UnsupportedArchitecture {
        path: path.to_path_buf(),
        arch,
    };
    let Some(class) = archs.iter().find(|a| model_type_of_class(a).is_some()) else {
        if !archs.is_empty() {
            return Err(unsupported(archs.join(", ")));
        }
        let model_type = model_type.unwrap_or("<none given>");
        return architecture_of_model_type(model_type)
            .ok_or_else(|| unsupported(format!("model_type {model_type}")));
    };
    let class_type = model_type_of_class(class).unwrap_or_default();
    let canonical = |t: &'static str| if t == "kimi_k2" { "deepseek_v3" } else { t };
    let contradiction = |other: &str| {
        ModelError::config(
            path,
            format!("architectures names {class} (model type {class_type}) but also {other}"),
        )
    };
    if let Some(other) = archs
        .iter()
        .filter_map(|a| model_type_of_class(a))
        .find(|&t| t != class_type)
    {
        return Err(contradiction(&format!("a {other} class")));
    }
    if let Some(mt) = model_type {
        // A model_type this engine does not know is left to the class (fine-tunes rename it).
        let known = [
            "llama",
            "qwen2",
            "qwen3",
            "deepseek_v2",
            "deepseek_v3",
            "kimi_k2",
        ];
        if let Some(&t) = known.iter().find(|&&t| t == mt) {
            if canonical(t) != class_type {
                return Err(contradiction(&format!("model_type {mt:?}")));
            }
        }
    }
    architecture_of_model_type(class_type).ok_or_else(|| unsupported(class.to_string()))
}

/// Parses one `rope_scaling` / `rope_parameters` object of a Llama / Qwen config. Types
/// without scaling (`default`) give `None`; types the engine does not implement give an error.
fn dense_rope_scaling(f: &ConfigKeys, ty: &str) -> Result<Option<RopeScaling>, ModelError> {
    let factor = || {
        f.f64_opt("factor")?.map(|x| x as f32).ok_or_else(|| {
            ModelError::config(f.path, format!("rope scaling {ty:?} without factor"))
        })
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
            f.path,
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
    // have top-level `rope_theta` and `rope_scaling` (see `hf_rope`).
    let rope_theta = hf_rope::rope_theta(path, obj)?;
    // DeepSeek's YaRN lives in its MLA configuration (it also scales the softmax).
    let rope_scaling = if architecture == Architecture::DeepseekV3 {
        None
    } else {
        hf_rope::rope_scaling(path, obj, dense_rope_scaling)?.flatten()
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

    /// `rope_parameters` as transformers 5.23.0 writes it (checked by saving configs with it)
    /// parses to the same configuration as the classic `rope_theta` + `rope_scaling`, for
    /// every architecture and scaling type; both present and disagreeing is an error.
    #[test]
    fn rope_parameters_equal_the_classic_keys() {
        let llama3 = json!({"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192});
        let yarn = json!({"factor": 32.0, "original_max_position_embeddings": 4096,
            "beta_fast": 1.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0});
        let deepseek = json!({
            "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
            "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32,
            "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100,
            "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
            "v_head_dim": 16, "n_routed_experts": 4, "num_experts_per_tok": 2});
        let cases = [
            ("LlamaForCausalLM", base(), Some(("llama3", llama3.clone()))),
            (
                "Qwen2ForCausalLM",
                base(),
                Some(("linear", json!({"factor": 2.0}))),
            ),
            ("Qwen3ForCausalLM", base(), None),
            (
                "DeepseekV3ForCausalLM",
                deepseek.clone(),
                Some(("yarn", yarn)),
            ),
            ("DeepseekV3ForCausalLM", deepseek, None),
        ];
        for (arch, mut classic, scaling) in cases {
            classic["architectures"] = json!([arch]);
            classic["rope_theta"] = json!(50000.0);
            let mut params = json!({"rope_theta": 50000.0, "rope_type": "default"});
            match &scaling {
                Some((ty, fields)) => {
                    // Older configs spell the type `type`.
                    let mut legacy = fields.clone();
                    legacy["type"] = json!(ty);
                    classic["rope_scaling"] = legacy;
                    for (k, x) in fields.as_object().unwrap() {
                        params[k] = x.clone();
                    }
                    params["rope_type"] = json!(ty);
                }
                None => classic["rope_scaling"] = Value::Null,
            }
            let want = config_from_json(Path::new("c.json"), &classic).unwrap();
            assert_eq!(want.rope_theta, 50000.0, "{arch}");
            let mut native = classic.clone();
            let o = native.as_object_mut().unwrap();
            o.remove("rope_theta");
            o.remove("rope_scaling");
            o.insert("rope_parameters".into(), params.clone());
            let got = config_from_json(Path::new("c.json"), &native).unwrap();
            assert_eq!(got, want, "{arch} {scaling:?}");
            // Both spellings at once (a config re-saved across versions): fine when they agree.
            classic["rope_parameters"] = params.clone();
            assert_eq!(
                config_from_json(Path::new("c.json"), &classic).unwrap(),
                want
            );
            if scaling.is_some() {
                classic["rope_parameters"]["factor"] = json!(3.0);
                let e = config_from_json(Path::new("c.json"), &classic).unwrap_err();
                assert!(e.to_string().contains("disagree"), "{arch}: {e}");
            }
        }
    }

    /// `"architectures": null` (or absent) leaves the choice to `model_type`; a known
    /// `model_type` contradicting the named class, or two different classes, is an error.
    #[test]
    fn architecture_from_model_type_and_contradictions() {
        for (model_type, want) in [
            ("llama", Architecture::Llama),
            ("qwen2", Architecture::Qwen2),
            ("qwen3", Architecture::Qwen3),
        ] {
            let mut v = base();
            v["architectures"] = Value::Null;
            v["model_type"] = json!(model_type);
            let c = config_from_json(Path::new("c.json"), &v).unwrap();
            assert_eq!(c.architecture, want);
        }
        let mut v = base();
        v["architectures"] = Value::Null;
        let e = config_from_json(Path::new("c.json"), &v).unwrap_err();
        assert!(e.to_string().contains("<none given>"), "{e}");
        v["model_type"] = json!("mamba");
        let e = config_from_json(Path::new("c.json"), &v).unwrap_err();
        assert!(
            matches!(e, ModelError::UnsupportedArchitecture { ref arch, .. } if arch.contains("mamba"))
        );

        let mut v = base();
        v["model_type"] = json!("qwen2");
        let e = config_from_json(Path::new("c.json"), &v)
            .unwrap_err()
            .to_string();
        assert!(e.contains("LlamaForCausalLM") && e.contains("qwen2"), "{e}");
        v["model_type"] = json!("llama");
        v["architectures"] = json!(["LlamaForCausalLM", "Qwen3ForCausalLM"]);
        let e = config_from_json(Path::new("c.json"), &v)
            .unwrap_err()
            .to_string();
        assert!(e.contains("qwen3"), "{e}");
        v["architectures"] = json!("LlamaForCausalLM");
        let e = config_from_json(Path::new("c.json"), &v)
            .unwrap_err()
            .to_string();
        assert!(e.contains("architectures should be a list"), "{e}");
        // A fine-tune's own model_type is left to the class it names.
        v["architectures"] = json!(["LlamaForCausalLM"]);
        v["model_type"] = json!("my_llama");
        assert_eq!(
            config_from_json(Path::new("c.json"), &v)
                .unwrap()
                .architecture,
            Architecture::Llama
        );
    }
}
