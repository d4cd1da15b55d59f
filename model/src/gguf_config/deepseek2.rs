//! The MLA / MoE part of a `deepseek2` GGUF (DeepSeek-V2/V3, Kimi K2), read the way
//! llama.cpp's `llama_model_deepseek2` reads it, into the same [`MlaConfig`] / [`MoeConfig`]
//! a Hugging Face `config.json` gives.

use super::Meta;
use crate::config::{MlaConfig, ModelConfig, MoeConfig, MoeScoring, YarnScaling};
use crate::error::ModelError;

/// llama.cpp's `LLAMA_EXPERT_GATING_FUNC_TYPE_*` values.
const GATING_SOFTMAX: u64 = 1;
const GATING_SIGMOID: u64 = 2;

/// Fills in `config.mla` / `config.moe` and the attention shape fields from the
/// `deepseek2.*` keys.
///
/// The converter describes MLA to llama.cpp as one KV head (`head_count_kv = 1`) of width
/// `kv_lora_rank + qk_rope` (`key_length`); the per-head sizes of the decompressed
/// attention are `key_length_mla` / `value_length_mla` when present (newer converters,
/// which also split `kv_b_proj`), else `key_length` / `value_length` (older files).
pub(super) fn apply(meta: &Meta<'_>, config: &mut ModelConfig) -> Result<(), ModelError> {
    let path = meta.file.path();
    let bad = |reason: String| ModelError::config(path, reason);
    let qk_rope_head_dim = meta.usize_req("rope.dimension_count")?;
    let key_length = match meta.usize_opt("attention.key_length_mla")? {
        Some(k) => k,
        None => meta.usize_req("attention.key_length")?,
    };
    let v_head_dim = match meta.usize_opt("attention.value_length_mla")? {
        Some(v) => v,
        None => meta.usize_req("attention.value_length")?,
    };
    if key_length <= qk_rope_head_dim {
        return Err(bad(format!(
            "MLA key length {key_length} leaves no room beside rope.dimension_count {qk_rope_head_dim}"
        )));
    }
    let mla = MlaConfig {
        // llama.cpp writes 0 / nothing for models with a plain q projection.
        q_lora_rank: meta.usize_opt("attention.q_lora_rank")?.filter(|&r| r > 0),
        kv_lora_rank: meta.usize_req("attention.kv_lora_rank")?,
        qk_nope_head_dim: key_length - qk_rope_head_dim,
        qk_rope_head_dim,
        v_head_dim,
        // The converter copies the q / kv_a rows as they are and llama.cpp rotates adjacent
        // pairs: DeepSeek's own (interleaved) layout.
        rope_interleave: true,
        yarn: yarn(meta)?,
    };
    let moe = moe(meta, config.num_hidden_layers)?;
    // As transformers' DeepseekV3Config: every head has its own (decompressed) K and V.
    config.num_key_value_heads = config.num_attention_heads;
    config.head_dim = qk_rope_head_dim;
    config.mla = Some(mla);
    config.moe = Some(moe);
    Ok(())
}

/// YaRN as llama.cpp applies it to `deepseek2`: it reads `yarn_log_multiplier`
/// (= 0.1 · mscale_all_dim, [TAG_DEEPSEEK2_YARN_LOG_MUL_FIX]) and assumes
/// mscale == mscale_all_dim, so the cos/sin factor is 1 and the softmax scale gains
/// mscale(factor, mscale_all_dim)². Without the multiplier llama.cpp keeps ggml's own cos/sin
/// factor 1 + 0.1·ln(factor) and applies its square to the softmax scale as well.
fn yarn(meta: &Meta<'_>) -> Result<Option<YarnScaling>, ModelError> {
    let path = meta.file.path();
    match meta.file.get_str(&meta.key("rope.scaling.type"))? {
        None | Some("none") => return Ok(None),
        Some("yarn") => {}
        Some(other) => {
            return Err(ModelError::unsupported(
                path,
                format!("rope scaling type {other:?} for deepseek2 (supported: yarn)"),
            ))
        }
    }
    let req = |k: &str| -> Result<f64, ModelError> {
        meta.f64_opt(k)?
            .ok_or_else(|| ModelError::config(path, format!("yarn without {}", meta.key(k))))
    };
    let factor = req("rope.scaling.factor")? as f32;
    let original = meta.usize_req("rope.scaling.original_context_length")?;
    if !(factor.is_finite() && factor > 0.0) || original == 0 {
        return Err(ModelError::config(
            path,
            format!("yarn factor {factor} and original context {original} must be positive"),
        ));
    }
    // Factors llama.cpp would apply on top, which the Hugging Face form has no room for.
    for (k, neutral) in [
        ("rope.scaling.attn_factor", 1.0),
        ("rope.scaling.yarn_ext_factor", 1.0),
    ] {
        if let Some(v) = meta.f64_opt(k)? {
            if v != neutral {
                return Err(ModelError::unsupported(
                    path,
                    format!("{} = {v} (only {neutral} is supported)", meta.key(k)),
                ));
            }
        }
    }
    let (mscale, mscale_all_dim, attention_factor) =
        match meta.f64_opt("rope.scaling.yarn_log_multiplier")? {
            Some(log_mul) => {
                let m = (log_mul / 0.1) as f32;
                (Some(m), Some(m), None)
            }
            None => {
                let ggml_factor = if factor > 1.0 {
                    1.0 + 0.1 * factor.ln()
                } else {
                    1.0
                };
                (None, Some(1.0), Some(ggml_factor))
            }
        };
    Ok(Some(YarnScaling {
        factor,
        original_max_position_embeddings: original,
        beta_fast: meta.f64_opt("rope.scaling.yarn_beta_fast")?.unwrap_or(32.0) as f32,
        beta_slow: meta.f64_opt("rope.scaling.yarn_beta_slow")?.unwrap_or(1.0) as f32,
        mscale,
        mscale_all_dim,
        attention_factor,
        // ggml rounds the correction range to whole dimensions (floor / ceil).
        truncate: true,
    }))
}

/// Routing and expert shapes. llama.cpp's defaults: softmax gating when
/// `expert_gating_func` is absent (DeepSeek-V2 files predate the key), no renormalization,
/// scale 1, no groups. Groups limit the choice whenever there is more than one; the
/// router's correction bias is on when the first MoE layer has `exp_probs_b`. (llama.cpp
/// ranks groups by their top-2 sum under either gating; for softmax the forward pass ranks
/// them by their best score, as DeepSeek-V2 itself does.)
fn moe(meta: &Meta<'_>, layers: usize) -> Result<MoeConfig, ModelError> {
    let path = meta.file.path();
    let scoring = match meta.usize_opt("expert_gating_func")?.map(|g| g as u64) {
        None | Some(0) | Some(GATING_SOFTMAX) => MoeScoring::Softmax,
        Some(GATING_SIGMOID) => MoeScoring::Sigmoid,
        Some(other) => {
            return Err(ModelError::unsupported(
                path,
                format!(
                    "{} = {other} (supported: 1 softmax, 2 sigmoid)",
                    meta.key("expert_gating_func")
                ),
            ))
        }
    };
    let n_group = meta.usize_opt("expert_group_count")?.unwrap_or(1).max(1);
    let topk_group = match meta.usize_opt("expert_group_used_count")? {
        Some(t) => t,
        None if n_group == 1 => 1,
        None => {
            return Err(ModelError::config(
                path,
                format!(
                    "{} = {n_group} without {}",
                    meta.key("expert_group_count"),
                    meta.key("expert_group_used_count")
                ),
            ))
        }
    };
    let first_k_dense_replace = meta.usize_opt("leading_dense_block_count")?.unwrap_or(0);
    let bias = format!("blk.{first_k_dense_replace}.exp_probs_b.bias");
    let norm = meta
        .file
        .get_bool(&meta.key("expert_weights_norm"))?
        .unwrap_or(false);
    Ok(MoeConfig {
        n_routed_experts: meta.usize_req("expert_count")?,
        num_experts_per_tok: meta.usize_req("expert_used_count")?,
        moe_intermediate_size: meta.usize_req("expert_feed_forward_length")?,
        n_shared_experts: meta.usize_opt("expert_shared_count")?.unwrap_or(0),
        n_group,
        topk_group,
        routed_scaling_factor: meta.f64_opt("expert_weights_scale")?.unwrap_or(1.0) as f32,
        norm_topk_prob: norm,
        first_k_dense_replace,
        scoring,
        group_limited: n_group > 1,
        correction_bias: first_k_dense_replace < layers && meta.file.tensor_info(&bias).is_some(),
    })
}
