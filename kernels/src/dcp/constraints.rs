//! vLLM's layout constraints, each message stated once: the model-independent ones that
//! every [`Layout`](super::Layout) satisfies and the ones that depend on the model's
//! attention.

/// The attention shape that decides which layouts are possible.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionKind {
    /// Multi-head, grouped-query or multi-query attention.
    Gqa {
        num_attention_heads: usize,
        num_key_value_heads: usize,
    },
    /// Multi-head latent attention: one latent KV "head" shared by all query heads.
    Mla { num_attention_heads: usize },
}

/// `tp % dcp == 0`: DCP groups tile the tensor-parallel ranks.
pub(super) fn check_tp_divisible(tp: usize, dcp: usize) -> Result<(), String> {
    if tp.is_multiple_of(dcp) {
        Ok(())
    } else {
        Err(format!("tp_size={tp} must be divisible by dcp_size={dcp}."))
    }
}

/// A physical block holds whole runs of `interleave` positions.
pub(super) fn check_interleave(block_size: usize, interleave: usize) -> Result<(), String> {
    if block_size < interleave || !block_size.is_multiple_of(interleave) {
        return Err(format!(
            "Block_size({block_size}) should be greater than or equal to and divisible by cp_kv_cache_interleave_size ({interleave})."
        ));
    }
    Ok(())
}

/// The head constraints of `attention` at tensor-parallel size `tp` and DCP size `dcp`.
fn check_heads(attention: AttentionKind, tp: usize, dcp: usize) -> Result<(), String> {
    let query_heads = |q: usize| {
        if !q.is_multiple_of(tp) {
            return Err(format!(
                "Total number of attention heads ({q}) must be divisible by tensor parallel size ({tp})."
            ));
        }
        Ok(())
    };
    match attention {
        AttentionKind::Mla {
            num_attention_heads: q,
        } => query_heads(q),
        AttentionKind::Gqa {
            num_attention_heads: q,
            num_key_value_heads: kv,
        } => {
            query_heads(q)?;
            if tp <= kv && !kv.is_multiple_of(tp) {
                return Err(format!(
                    "Total number of KV heads ({kv}) must be divisible by tensor parallel size ({tp})."
                ));
            }
            if tp > kv && !tp.is_multiple_of(kv) {
                return Err(format!(
                    "Tensor parallel size ({tp}) must be divisible by the total number of KV heads ({kv}) when it exceeds it, so each KV head is replicated on the same number of ranks."
                ));
            }
            if dcp > 1 {
                check_gqa_dcp(q, kv, tp, dcp)?;
            }
            Ok(())
        }
    }
}

/// DCP under GQA/MQA shards the copies of a replicated KV head, so it needs them.
fn check_gqa_dcp(q: usize, kv: usize, tp: usize, dcp: usize) -> Result<(), String> {
    if tp <= kv {
        return Err(format!(
            "Decode context parallelism for GQA/MQA requires `--tensor-parallel-size` ({tp}) to be greater than the model's total number of KV heads ({kv}). Increase `--tensor-parallel-size` or set `--decode-context-parallel-size 1`."
        ));
    }
    let max = tp / kv;
    if dcp > max {
        return Err(format!(
            "`--decode-context-parallel-size` ({dcp}) exceeds the maximum supported value ({max}) for `--tensor-parallel-size` ({tp}) and {kv} model KV heads."
        ));
    }
    let n = q / kv;
    if !n.is_multiple_of(dcp) {
        return Err(format!(
            "The model's number of query heads per KV head ({n}) must be divisible by `--decode-context-parallel-size` ({dcp}) for GQA/MQA."
        ));
    }
    if !max.is_multiple_of(dcp) {
        return Err(format!(
            "`--tensor-parallel-size` ({tp}) // KV heads ({kv}) = {max} must be divisible by `--decode-context-parallel-size` ({dcp}) so that a DCP group never spans two KV heads."
        ));
    }
    Ok(())
}

/// vLLM's constraints on a model with `attention`, in vLLM's order: sizes of at least 1,
/// `tp % dcp`, the heads, then the interleave against the block size.
pub(super) fn check_model_layout(
    attention: AttentionKind,
    tp: usize,
    dcp: usize,
    interleave: usize,
    block_size: usize,
) -> Result<(), String> {
    if tp == 0 || dcp == 0 || interleave == 0 {
        return Err(
            "tensor_parallel_size, decode_context_parallel_size and cp_kv_cache_interleave_size must be at least 1.".into(),
        );
    }
    check_tp_divisible(tp, dcp)?;
    check_heads(attention, tp, dcp)?;
    check_interleave(block_size, interleave)
}
