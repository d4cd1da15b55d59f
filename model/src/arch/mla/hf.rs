//! The MLA / MoE part of a DeepSeek-V2/V3 (Kimi K2) `config.json`, and the tensors it implies.

use std::path::Path;

use serde_json::{Map, Value};

use crate::config::{MlaConfig, ModelConfig, MoeConfig, MoeScoring, YarnScaling};
use crate::config_keys::ConfigKeys;
use crate::error::ModelError;

/// True for DeepSeek-V2 configurations (softmax routing, always-interleaved RoPE).
fn is_v2(obj: &Map<String, Value>) -> bool {
    let named_v2 = obj
        .get("architectures")
        .and_then(Value::as_array)
        .is_some_and(|a| a.iter().any(|x| x == "DeepseekV2ForCausalLM"));
    named_v2 || obj.get("model_type").and_then(Value::as_str) == Some("deepseek_v2")
}

/// YaRN from one `rope_scaling` / `rope_parameters` object (`ty` is its scaling type);
/// `max_position_embeddings` gives the factor when the object has none.
fn yarn(
    k: &ConfigKeys,
    ty: &str,
    max_position_embeddings: Option<usize>,
) -> Result<Option<YarnScaling>, ModelError> {
    let path = k.path;
    match ty {
        "default" => Ok(None),
        "yarn" => {
            let original = k.usize("original_max_position_embeddings")?;
            let factor = match k.f32_opt("factor")? {
                Some(f) => f,
                // transformers: the ratio of the context lengths when no factor is given.
                None => {
                    let max_pos = max_position_embeddings.ok_or_else(|| {
                        ModelError::config(
                            path,
                            "yarn without factor needs max_position_embeddings",
                        )
                    })?;
                    max_pos as f32 / original.max(1) as f32
                }
            };
            if !(factor.is_finite() && factor > 0.0) || original == 0 {
                return Err(ModelError::config(
                    path,
                    format!("yarn factor {factor} and original_max_position_embeddings {original} must be positive"),
                ));
            }
            Ok(Some(YarnScaling {
                factor,
                original_max_position_embeddings: original,
                beta_fast: k
                    .f32_opt("beta_fast")?
                    .filter(|&b| b != 0.0)
                    .unwrap_or(32.0),
                beta_slow: k.f32_opt("beta_slow")?.filter(|&b| b != 0.0).unwrap_or(1.0),
                mscale: k.f32_opt("mscale")?,
                mscale_all_dim: k.f32_opt("mscale_all_dim")?,
                attention_factor: k.f32_opt("attention_factor")?,
                truncate: k.bool_or("truncate", true)?,
            }))
        }
        other => Err(ModelError::unsupported(
            path,
            format!("rope scaling type {other:?} for DeepSeek models (supported: yarn)"),
        )),
    }
}

/// Parses the MLA and MoE settings of a DeepSeek-V2/V3 `config.json` object.
pub fn mla_moe_from_json(
    path: &Path,
    obj: &Map<String, Value>,
) -> Result<(MlaConfig, MoeConfig), ModelError> {
    let k = ConfigKeys { path, obj };
    let v2 = is_v2(obj);
    if k.bool_or("attention_bias", false)? {
        return Err(ModelError::unsupported(
            path,
            "attention_bias=true for MLA projections",
        ));
    }
    if let Some(act) = k.str_opt("hidden_act") {
        if act != "silu" {
            return Err(ModelError::unsupported(
                path,
                format!("hidden_act {act:?} (supported: silu)"),
            ));
        }
    }
    let mla = MlaConfig {
        q_lora_rank: k.usize_opt("q_lora_rank")?,
        kv_lora_rank: k.usize("kv_lora_rank")?,
        qk_nope_head_dim: k.usize("qk_nope_head_dim")?,
        qk_rope_head_dim: k.usize("qk_rope_head_dim")?,
        v_head_dim: k.usize("v_head_dim")?,
        // V2 rotates complex pairs (2i, 2i+1), V3 does when `rope_interleave` (its default).
        rope_interleave: v2 || k.bool_or("rope_interleave", true)?,
        // YaRN from `rope_scaling` (older configs) or `rope_parameters` (transformers 5).
        yarn: {
            let max_pos = k.usize_opt("max_position_embeddings")?;
            crate::hf_rope::rope_scaling(path, obj, |keys, ty| yarn(keys, ty, max_pos))?.flatten()
        },
    };
    let topk_method = k.str_opt("topk_method");
    let (scoring, group_limited, correction_bias, norm_topk_prob) = if v2 {
        let scoring = k.str_opt("scoring_func").unwrap_or("softmax");
        if scoring != "softmax" {
            return Err(ModelError::unsupported(
                path,
                format!("DeepSeek-V2 scoring_func {scoring:?} (supported: softmax)"),
            ));
        }
        let grouped = match topk_method.unwrap_or("greedy") {
            "greedy" => false,
            "group_limited_greedy" => true,
            other => {
                return Err(ModelError::unsupported(
                    path,
                    format!(
                    "DeepSeek-V2 topk_method {other:?} (supported: greedy, group_limited_greedy)"
                ),
                ))
            }
        };
        // transformers' V2 router never renormalizes the top-k weights.
        (MoeScoring::Softmax, grouped, false, false)
    } else {
        // Only V3's router (sigmoid scores, bias-corrected grouped top-k) is implemented:
        // refuse other settings rather than route differently from the checkpoint.
        let scoring = k.str_opt("scoring_func").unwrap_or("sigmoid");
        let method = topk_method.unwrap_or("noaux_tc");
        if scoring != "sigmoid" || method != "noaux_tc" {
            return Err(ModelError::unsupported(
                path,
                format!("DeepSeek-V3 routing scoring_func {scoring:?} / topk_method {method:?} (supported: sigmoid / noaux_tc)"),
            ));
        }
        (
            MoeScoring::Sigmoid,
            true,
            true,
            k.bool_or("norm_topk_prob", true)?,
        )
    };
    let moe = MoeConfig {
        n_routed_experts: k.usize("n_routed_experts")?,
        num_experts_per_tok: k.usize("num_experts_per_tok")?,
        moe_intermediate_size: k.usize("moe_intermediate_size")?,
        n_shared_experts: k.usize_opt("n_shared_experts")?.unwrap_or(0),
        n_group: k.usize_opt("n_group")?.unwrap_or(1),
        topk_group: k.usize_opt("topk_group")?.unwrap_or(1),
        routed_scaling_factor: k.f32_opt("routed_scaling_factor")?.unwrap_or(1.0),
        norm_topk_prob,
        first_k_dense_replace: k.usize_opt("first_k_dense_replace")?.unwrap_or(0),
        scoring,
        group_limited,
        correction_bias,
    };
    Ok((mla, moe))
}

/// Rejects MLA / MoE shapes the forward pass cannot run (zero sizes, groups that do not
/// divide the experts, more experts per token than the groups allow, odd RoPE width).
pub fn check_mla_config(path: &Path, c: &ModelConfig) -> Result<(), ModelError> {
    let (Some(mla), Some(moe)) = (&c.mla, &c.moe) else {
        return Err(ModelError::config(
            path,
            "a DeepSeek model needs both its MLA and MoE settings",
        ));
    };
    let bad = |reason: String| Err(ModelError::config(path, reason));
    let sizes = [
        ("kv_lora_rank", mla.kv_lora_rank),
        ("qk_nope_head_dim", mla.qk_nope_head_dim),
        ("qk_rope_head_dim", mla.qk_rope_head_dim),
        ("v_head_dim", mla.v_head_dim),
        ("q_lora_rank", mla.q_lora_rank.unwrap_or(1)),
        ("moe_intermediate_size", moe.moe_intermediate_size),
        ("n_group", moe.n_group),
        ("topk_group", moe.topk_group),
        ("num_experts_per_tok", moe.num_experts_per_tok),
    ];
    if let Some((name, _)) = sizes.iter().find(|(_, v)| *v == 0) {
        return bad(format!("{name} must be positive"));
    }
    if !mla.qk_rope_head_dim.is_multiple_of(2) {
        return bad(format!(
            "qk_rope_head_dim {} must be even",
            mla.qk_rope_head_dim
        ));
    }
    let dims = [
        mla.kv_lora_rank,
        mla.qk_nope_head_dim,
        mla.qk_rope_head_dim,
        mla.v_head_dim,
        mla.q_lora_rank.unwrap_or(0),
        moe.moe_intermediate_size,
        moe.n_routed_experts,
        moe.n_shared_experts,
    ];
    // Every tensor stays far below the address space (and the head dimension products too).
    if dims.iter().any(|&d| d > 1 << 20) || c.num_attention_heads > 1 << 16 {
        return bad("MLA / MoE dimensions are implausibly large".into());
    }
    if moe.first_k_dense_replace < c.num_hidden_layers {
        if moe.n_routed_experts == 0 || !moe.n_routed_experts.is_multiple_of(moe.n_group) {
            return bad(format!(
                "n_routed_experts {} must be a positive multiple of n_group {}",
                moe.n_routed_experts, moe.n_group
            ));
        }
        let per_group = moe.n_routed_experts / moe.n_group;
        if moe.topk_group > moe.n_group
            || moe.num_experts_per_tok > moe.topk_group * per_group
            || (moe.scoring == MoeScoring::Sigmoid && moe.n_group > 1 && per_group < 2)
        {
            return bad(format!(
                "cannot route {} experts per token from {} of {} groups of {per_group} experts",
                moe.num_experts_per_tok, moe.topk_group, moe.n_group
            ));
        }
    }
    Ok(())
}

/// The tensors layer `i` of a DeepSeek model reads, with their row-major shapes.
pub fn mla_layer_tensors(c: &ModelConfig, i: usize) -> Vec<(String, Vec<usize>)> {
    let (Some(mla), Some(moe)) = (&c.mla, &c.moe) else {
        return Vec::new();
    };
    let h = c.hidden_size;
    let heads = c.num_attention_heads;
    let qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim;
    let p = format!("model.layers.{i}");
    let mut v = Vec::new();
    let mut push = |n: String, s: Vec<usize>| v.push((format!("{p}.{n}"), s));
    push("input_layernorm.weight".into(), vec![h]);
    push("post_attention_layernorm.weight".into(), vec![h]);
    match mla.q_lora_rank {
        Some(r) => {
            push("self_attn.q_a_proj.weight".into(), vec![r, h]);
            push("self_attn.q_a_layernorm.weight".into(), vec![r]);
            push("self_attn.q_b_proj.weight".into(), vec![heads * qk, r]);
        }
        None => push("self_attn.q_proj.weight".into(), vec![heads * qk, h]),
    }
    push(
        "self_attn.kv_a_proj_with_mqa.weight".into(),
        vec![mla.latent_dim(), h],
    );
    push(
        "self_attn.kv_a_layernorm.weight".into(),
        vec![mla.kv_lora_rank],
    );
    push(
        "self_attn.kv_b_proj.weight".into(),
        vec![
            heads * (mla.qk_nope_head_dim + mla.v_head_dim),
            mla.kv_lora_rank,
        ],
    );
    push(
        "self_attn.o_proj.weight".into(),
        vec![h, heads * mla.v_head_dim],
    );
    let mlp = |prefix: &str, inter: usize| {
        [
            (format!("{p}.{prefix}.gate_proj.weight"), vec![inter, h]),
            (format!("{p}.{prefix}.up_proj.weight"), vec![inter, h]),
            (format!("{p}.{prefix}.down_proj.weight"), vec![h, inter]),
        ]
    };
    if i < moe.first_k_dense_replace {
        v.extend(mlp("mlp", c.intermediate_size));
    } else {
        for e in 0..moe.n_routed_experts {
            v.extend(mlp(&format!("mlp.experts.{e}"), moe.moe_intermediate_size));
        }
        if moe.n_shared_experts > 0 {
            v.extend(mlp(
                "mlp.shared_experts",
                moe.moe_intermediate_size * moe.n_shared_experts,
            ));
        }
        v.push((
            format!("{p}.mlp.gate.weight"),
            vec![moe.n_routed_experts, h],
        ));
        if moe.correction_bias {
            v.push((
                format!("{p}.mlp.gate.e_score_correction_bias"),
                vec![moe.n_routed_experts],
            ));
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use crate::config::{Architecture, MoeScoring};
    use crate::hf_config::config_from_json;
    use std::path::Path;

    /// Kimi K2's published config.json (the keys that matter), in the pre-transformers-5
    /// layout with `rope_scaling`.
    fn kimi_k2_json() -> serde_json::Value {
        serde_json::json!({
            "architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2",
            "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
            "num_hidden_layers": 61, "num_attention_heads": 64, "num_key_value_heads": 64,
            "n_shared_experts": 1, "n_routed_experts": 384, "routed_scaling_factor": 2.827,
            "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
            "v_head_dim": 128, "qk_nope_head_dim": 128, "topk_method": "noaux_tc",
            "n_group": 1, "topk_group": 1, "num_experts_per_tok": 8,
            "first_k_dense_replace": 1, "norm_topk_prob": true, "scoring_func": "sigmoid",
            "hidden_act": "silu", "max_position_embeddings": 131072, "rms_norm_eps": 1e-6,
            "rope_theta": 50000.0, "vocab_size": 163840, "tie_word_embeddings": false,
            "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 32.0,
                "mscale": 1.0, "mscale_all_dim": 1.0,
                "original_max_position_embeddings": 4096, "type": "yarn"},
            "bos_token_id": 163584, "eos_token_id": 163585
        })
    }

    #[test]
    fn parses_kimi_k2() {
        let c = config_from_json(Path::new("config.json"), &kimi_k2_json()).unwrap();
        assert_eq!(c.architecture, Architecture::DeepseekV3);
        let mla = c.mla.as_ref().unwrap();
        assert_eq!(mla.latent_dim(), 576);
        assert_eq!(mla.q_lora_rank, Some(1536));
        assert!(mla.rope_interleave);
        let y = mla.yarn.as_ref().unwrap();
        assert_eq!((y.factor, y.original_max_position_embeddings), (32.0, 4096));
        let moe = c.moe.as_ref().unwrap();
        assert_eq!(moe.n_routed_experts, 384);
        assert_eq!(moe.scoring, MoeScoring::Sigmoid);
        assert!(moe.correction_bias && moe.norm_topk_prob);
        assert_eq!(c.rope_scaling, None);
    }

    #[test]
    fn parses_deepseek_v2_lite_routing() {
        let mut j = kimi_k2_json();
        let o = j.as_object_mut().unwrap();
        o.insert(
            "architectures".into(),
            serde_json::json!(["DeepseekV2ForCausalLM"]),
        );
        o.insert("model_type".into(), "deepseek_v2".into());
        o.insert("topk_method".into(), "greedy".into());
        o.insert("scoring_func".into(), "softmax".into());
        o.insert("q_lora_rank".into(), serde_json::Value::Null);
        let c = config_from_json(Path::new("config.json"), &j).unwrap();
        let moe = c.moe.as_ref().unwrap();
        assert_eq!(moe.scoring, MoeScoring::Softmax);
        assert!(!moe.group_limited && !moe.correction_bias && !moe.norm_topk_prob);
        assert_eq!(c.mla.as_ref().unwrap().q_lora_rank, None);
    }

    /// Kimi K2's config as transformers 5 writes it: `rope_parameters` instead of
    /// `rope_theta` + `rope_scaling`, and no class named (`"architectures": null`).
    #[test]
    fn parses_kimi_k2_in_transformers5_form() {
        let classic = kimi_k2_json();
        let mut native = classic.clone();
        let o = native.as_object_mut().unwrap();
        let mut params = o.remove("rope_scaling").unwrap();
        params["rope_theta"] = o.remove("rope_theta").unwrap();
        params["rope_type"] = params["type"].clone();
        params.as_object_mut().unwrap().remove("type");
        o.insert("rope_parameters".into(), params);
        o.insert("architectures".into(), serde_json::Value::Null);
        let path = Path::new("config.json");
        assert_eq!(
            config_from_json(path, &native).unwrap(),
            config_from_json(path, &classic).unwrap()
        );
        // A DeepSeek-V2 class with a V3 model_type is a contradiction, not a guess.
        let mut v2 = classic;
        v2["architectures"] = serde_json::json!(["DeepseekV2ForCausalLM"]);
        let e = config_from_json(path, &v2).unwrap_err().to_string();
        assert!(
            e.contains("DeepseekV2ForCausalLM") && e.contains("kimi_k2"),
            "{e}"
        );
    }

    #[test]
    fn rejects_bad_shapes_with_errors() {
        for (key, value) in [
            ("n_group", serde_json::json!(5)),
            ("kv_lora_rank", serde_json::json!(0)),
            ("qk_rope_head_dim", serde_json::json!(63)),
            ("num_experts_per_tok", serde_json::json!(1000)),
            ("kv_lora_rank", serde_json::json!("big")),
        ] {
            let mut j = kimi_k2_json();
            j.as_object_mut().unwrap().insert(key.into(), value);
            let e = config_from_json(Path::new("config.json"), &j);
            assert!(e.is_err(), "{key} accepted");
        }
        let mut j = kimi_k2_json();
        j["rope_scaling"]["type"] = "longrope".into();
        assert!(config_from_json(Path::new("config.json"), &j).is_err());
    }
}
