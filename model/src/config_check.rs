//! Sanity checks of a parsed [`ModelConfig`], shared by every config reader (Hugging Face,
//! GGUF) and by tensor validation.
//!
//! A leaf module below both the readers and the `source` entry point (which both call it),
//! so that the readers do not depend on the entry point that calls them.

use std::path::Path;

use crate::config::{Architecture, ModelConfig};
use crate::error::ModelError;

/// Rejects configurations whose sizes are zero or whose products overflow, so that code
/// sizing buffers from them cannot panic.
pub(crate) fn check_config(path: &Path, c: &ModelConfig) -> Result<(), ModelError> {
    let positive = [
        ("hidden_size", c.hidden_size),
        ("intermediate_size", c.intermediate_size),
        ("num_hidden_layers", c.num_hidden_layers),
        ("num_attention_heads", c.num_attention_heads),
        ("num_key_value_heads", c.num_key_value_heads),
        ("head_dim", c.head_dim),
        ("vocab_size", c.vocab_size),
    ];
    if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
        return Err(ModelError::config(path, format!("{name} must be positive")));
    }
    if c.architecture == Architecture::DeepseekV3 || c.mla.is_some() {
        crate::arch::check_mla_config(path, c)?;
    }
    if !c.num_attention_heads.is_multiple_of(c.num_key_value_heads) {
        return Err(ModelError::config(
            path,
            format!(
                "{} attention heads are not a multiple of {} KV heads",
                c.num_attention_heads, c.num_key_value_heads
            ),
        ));
    }
    let products = [
        c.num_attention_heads
            .checked_mul(c.head_dim)
            .and_then(|q| q.checked_mul(c.hidden_size)),
        c.intermediate_size.checked_mul(c.hidden_size),
        c.vocab_size.checked_mul(c.hidden_size),
    ];
    // No tensor can be larger than the address space; this also bounds the layer count.
    if products
        .iter()
        .any(|p| p.is_none_or(|p| p > isize::MAX as usize))
        || c.num_hidden_layers > 1 << 16
    {
        return Err(ModelError::config(
            path,
            "model dimensions are implausibly large",
        ));
    }
    Ok(())
}
