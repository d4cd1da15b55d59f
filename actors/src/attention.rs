//! The attention shape of a model, as the layout rules of `dcpserve_config` see it.

use dcpserve_config::AttentionKind;
use dcpserve_model::ModelConfig;

/// The attention shape that decides which (tp, dcp) layouts a model allows; the engine
/// and the capacity planner both check layouts through it.
pub fn attention_kind(mc: &ModelConfig) -> AttentionKind {
    // MLA's one latent "head" is shared by all query heads: only tp % dcp matters.
    if mc.mla.is_some() {
        AttentionKind::Mla {
            num_attention_heads: mc.num_attention_heads,
        }
    } else {
        AttentionKind::Gqa {
            num_attention_heads: mc.num_attention_heads,
            num_key_value_heads: mc.num_key_value_heads,
        }
    }
}
