//! Tensor-parallel and decode-context-parallel layout, with vLLM's constraints.

pub use dcpserve_kernels::dcp::AttentionKind;
use dcpserve_kernels::dcp::Layout;
use dcpserve_kernels::KernelError;
use serde::{Deserialize, Serialize};

/// A layout or engine setting that cannot work, with a message meant for the user.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

impl From<KernelError> for ConfigError {
    fn from(e: KernelError) -> Self {
        match e {
            KernelError::Shape(m) => ConfigError(m),
            other => ConfigError(other.to_string()),
        }
    }
}

/// How the ranks of one model are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParallelConfig {
    /// Number of ranks (world size); query heads are split across them.
    #[serde(default = "one")]
    pub tensor_parallel_size: usize,
    /// Ranks (inside the TP group) that shard the KV cache by sequence position.
    #[serde(default = "one")]
    pub decode_context_parallel_size: usize,
    /// Copies of the TP group that split each prefill's tokens (world = tp × pcp); the
    /// KV cache is sharded by position over the `pcp × dcp` ranks of each head group.
    #[serde(default = "one")]
    pub prefill_context_parallel_size: usize,
    /// Consecutive tokens placed on one DCP rank before moving to the next.
    #[serde(default = "one")]
    pub cp_kv_cache_interleave_size: usize,
}

fn one() -> usize {
    1
}

impl Default for ParallelConfig {
    fn default() -> Self {
        Self {
            tensor_parallel_size: 1,
            decode_context_parallel_size: 1,
            prefill_context_parallel_size: 1,
            cp_kv_cache_interleave_size: 1,
        }
    }
}

impl ParallelConfig {
    /// Checks the layout against the model's attention and the KV block size.
    /// Returns the first violated constraint with vLLM's message.
    pub fn validate(&self, attention: AttentionKind, block_size: usize) -> Result<(), ConfigError> {
        self.layout_for(attention, block_size, 1).map(drop)
    }

    /// The rank group's [`Layout`] for a model with `attention`, checked with vLLM's
    /// constraints and messages ([`Layout::for_model`]): what the engine, the supervisor
    /// and the planner all resolve a layout with.
    ///
    /// ```
    /// use dcpserve_config::{AttentionKind, ParallelConfig};
    /// let p = ParallelConfig { tensor_parallel_size: 4, decode_context_parallel_size: 2, ..Default::default() };
    /// let gqa = AttentionKind::Gqa { num_attention_heads: 8, num_key_value_heads: 2 };
    /// assert_eq!(p.layout_for(gqa, 16, 1).unwrap().virtual_block_size(), 32);
    /// ```
    pub fn layout_for(
        &self,
        attention: AttentionKind,
        block_size: usize,
        micro_batches: usize,
    ) -> Result<Layout, ConfigError> {
        Ok(Layout::for_model(
            attention,
            self.tensor_parallel_size,
            self.decode_context_parallel_size,
            self.cp_kv_cache_interleave_size,
            block_size,
            micro_batches,
        )?
        .with_pcp(self.prefill_context_parallel_size)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gqa(q: usize, kv: usize) -> AttentionKind {
        AttentionKind::Gqa {
            num_attention_heads: q,
            num_key_value_heads: kv,
        }
    }

    fn layout(tp: usize, dcp: usize, i: usize) -> ParallelConfig {
        ParallelConfig {
            tensor_parallel_size: tp,
            decode_context_parallel_size: dcp,
            cp_kv_cache_interleave_size: i,
            ..Default::default()
        }
    }

    #[test]
    fn tp_not_divisible_by_dcp() {
        let e = layout(4, 3, 1).validate(gqa(12, 1), 16).unwrap_err();
        assert_eq!(e.0, "tp_size=4 must be divisible by dcp_size=3.");
    }

    #[test]
    fn gqa_needs_tp_above_kv_heads() {
        let e = layout(2, 2, 1).validate(gqa(8, 2), 16).unwrap_err();
        assert_eq!(
            e.0,
            "Decode context parallelism for GQA/MQA requires `--tensor-parallel-size` (2) to be greater than the model's total number of KV heads (2). Increase `--tensor-parallel-size` or set `--decode-context-parallel-size 1`."
        );
    }

    #[test]
    fn gqa_dcp_above_maximum() {
        let e = layout(4, 4, 1).validate(gqa(8, 2), 16).unwrap_err();
        assert_eq!(
            e.0,
            "`--decode-context-parallel-size` (4) exceeds the maximum supported value (2) for `--tensor-parallel-size` (4) and 2 model KV heads."
        );
    }

    #[test]
    fn gqa_query_heads_per_kv_head() {
        // 24 query heads / 8 KV heads = 3 per KV head; tp=24 allows dcp up to 3, but 3 % 2 != 0.
        let e = layout(24, 2, 1).validate(gqa(24, 8), 16).unwrap_err();
        assert_eq!(
            e.0,
            "The model's number of query heads per KV head (3) must be divisible by `--decode-context-parallel-size` (2) for GQA/MQA."
        );
    }

    #[test]
    fn interleave_must_divide_block_size() {
        let e = layout(1, 1, 3).validate(gqa(8, 2), 16).unwrap_err();
        assert_eq!(
            e.0,
            "Block_size(16) should be greater than or equal to and divisible by cp_kv_cache_interleave_size (3)."
        );
        let e = layout(1, 1, 32).validate(gqa(8, 2), 16).unwrap_err();
        assert!(e.0.starts_with("Block_size(16)"));
    }

    #[test]
    fn kv_heads_must_split_or_replicate_evenly() {
        let e = layout(2, 1, 1).validate(gqa(6, 3), 16).unwrap_err();
        assert_eq!(
            e.0,
            "Total number of KV heads (3) must be divisible by tensor parallel size (2)."
        );
        let e = layout(6, 1, 1).validate(gqa(12, 4), 16).unwrap_err();
        assert!(e.0.starts_with(
            "Tensor parallel size (6) must be divisible by the total number of KV heads (4)"
        ));
    }

    #[test]
    fn query_heads_must_divide_by_tp() {
        let e = layout(2, 1, 1).validate(gqa(9, 3), 16).unwrap_err();
        assert_eq!(
            e.0,
            "Total number of attention heads (9) must be divisible by tensor parallel size (2)."
        );
    }

    #[test]
    fn allowed_layouts() {
        for (tp, dcp) in [(1, 1), (2, 1), (4, 1), (4, 2), (8, 1), (8, 2), (8, 4)] {
            layout(tp, dcp, 1).validate(gqa(8, 2), 16).unwrap();
        }
        layout(9, 3, 1).validate(gqa(9, 3), 16).unwrap();
        layout(9, 1, 1).validate(gqa(9, 3), 16).unwrap();
        layout(8, 8, 16)
            .validate(
                AttentionKind::Mla {
                    num_attention_heads: 16,
                },
                16,
            )
            .unwrap();
    }

    #[test]
    fn gqa_dcp_group_must_not_span_two_kv_heads() {
        // 12 query heads / 2 KV heads: tp=6 gives 6 / 2 = 3 ranks per KV head; dcp=2 passes
        // every earlier check (6 % 2 == 0, 2 <= 3, 6 query heads per KV head % 2 == 0)
        // but a group of 2 ranks cannot tile 3 ranks per KV head.
        let e = layout(6, 2, 1).validate(gqa(12, 2), 16).unwrap_err();
        assert_eq!(
            e.0,
            "`--tensor-parallel-size` (6) // KV heads (2) = 3 must be divisible by `--decode-context-parallel-size` (2) so that a DCP group never spans two KV heads."
        );
        // The same model with tp=4 (2 ranks per KV head) is fine.
        layout(4, 2, 1).validate(gqa(12, 2), 16).unwrap();
    }

    fn mla(q: usize) -> AttentionKind {
        AttentionKind::Mla {
            num_attention_heads: q,
        }
    }

    #[test]
    fn mla_query_heads_must_divide_by_tp() {
        let e = layout(3, 1, 1).validate(mla(16), 16).unwrap_err();
        assert_eq!(
            e.0,
            "Total number of attention heads (16) must be divisible by tensor parallel size (3)."
        );
        // With dcp the head check still applies (tp % dcp passes first).
        let e = layout(6, 3, 1).validate(mla(4), 16).unwrap_err();
        assert_eq!(
            e.0,
            "Total number of attention heads (4) must be divisible by tensor parallel size (6)."
        );
    }

    #[test]
    fn mla_only_needs_tp_divisible_by_dcp() {
        // No KV-head limits: dcp may be as large as tp.
        for (tp, dcp, i) in [
            (1, 1, 1),
            (8, 1, 1),
            (8, 2, 1),
            (8, 4, 2),
            (8, 8, 1),
            (8, 8, 16),
        ] {
            layout(tp, dcp, i).validate(mla(16), 16).unwrap();
        }
        let e = layout(8, 3, 1).validate(mla(16), 16).unwrap_err();
        assert_eq!(e.0, "tp_size=8 must be divisible by dcp_size=3.");
        // The block-size constraint applies to MLA too.
        let e = layout(8, 8, 32).validate(mla(16), 16).unwrap_err();
        assert_eq!(
            e.0,
            "Block_size(16) should be greater than or equal to and divisible by cp_kv_cache_interleave_size (32)."
        );
    }

    #[test]
    fn pcp_multiplies_the_world_and_must_be_at_least_one() {
        let mut p = layout(4, 2, 1);
        p.prefill_context_parallel_size = 2;
        let l = p.layout_for(gqa(8, 2), 16, 1).unwrap();
        assert_eq!((l.world(), l.cp_size(), l.virtual_block_size()), (8, 4, 64));
        p.prefill_context_parallel_size = 0;
        let e = p.validate(gqa(8, 2), 16).unwrap_err();
        assert_eq!(e.0, "prefill_context_parallel_size (0) must be at least 1.");
        // The DCP constraints are unchanged by pcp.
        p.prefill_context_parallel_size = 2;
        p.tensor_parallel_size = 2;
        assert!(p
            .validate(gqa(8, 2), 16)
            .unwrap_err()
            .0
            .contains("greater than the model's total number of KV heads"));
    }

    #[test]
    fn zero_sizes_are_rejected() {
        let msg = "tensor_parallel_size, decode_context_parallel_size and cp_kv_cache_interleave_size must be at least 1.";
        for (tp, dcp, i) in [(0, 1, 1), (1, 0, 1), (1, 1, 0)] {
            let e = layout(tp, dcp, i).validate(gqa(8, 2), 16).unwrap_err();
            assert_eq!(e.0, msg, "tp={tp} dcp={dcp} I={i}");
            let e = layout(tp, dcp, i).validate(mla(16), 16).unwrap_err();
            assert_eq!(e.0, msg, "MLA tp={tp} dcp={dcp} I={i}");
        }
    }

    #[test]
    fn dcp_rank_is_tp_rank_mod_dcp() {
        let l = layout(8, 4, 1).layout_for(gqa(8, 2), 16, 1).unwrap();
        let ranks: Vec<usize> = (0..8).map(|r| l.dcp_rank(r)).collect();
        assert_eq!(ranks, vec![0, 1, 2, 3, 0, 1, 2, 3]);
    }
}
