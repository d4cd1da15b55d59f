//! The shape of one rank group, computed once: everything else reads it.

use std::ops::Range;

use super::constraints::{check_interleave, check_model_layout, check_tp_divisible, AttentionKind};
use super::placement::Placement;
use crate::error::KernelError;

/// The DCP group rule: DCP groups are contiguous blocks of `dcp` TP ranks, so TP rank
/// `tp_rank` is DCP rank `tp_rank % dcp` of group `tp_rank / dcp` (vLLM's layout).
///
/// ```
/// use dcpserve_kernels::dcp::dcp_rank_of;
/// assert_eq!((0..6).map(|r| dcp_rank_of(r, 3)).collect::<Vec<_>>(), [0, 1, 2, 0, 1, 2]);
/// ```
pub fn dcp_rank_of(tp_rank: usize, dcp: usize) -> usize {
    tp_rank % dcp.max(1)
}

/// How a model's ranks are laid out: tensor parallelism `tp`, DCP groups of `dcp`
/// ranks, `interleave` consecutive positions per DCP rank, `block_size` tokens per
/// physical block on one rank, and 1 or 2 micro-batches in ping-pong.
///
/// ```
/// use dcpserve_kernels::dcp::Layout;
/// let layout = Layout::new(4, 2, 1, 16, 1).unwrap();
/// assert_eq!(layout.virtual_block_size(), 32);
/// assert_eq!(layout.dcp_group_of(3), 1);
/// assert_eq!(layout.dcp_group_ranks(1), 2..4);
/// assert_eq!(layout.placement(3).dcp_rank, 1);
/// assert_eq!(layout.tokens_total(1000), 2000);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    tp: usize,
    dcp: usize,
    interleave: usize,
    block_size: usize,
    micro_batches: usize,
}

impl Layout {
    /// Checks the numbers that every layout must satisfy, whatever the model
    /// ([`Layout::for_model`] adds the checks that depend on its attention).
    pub fn new(
        tp: usize,
        dcp: usize,
        interleave: usize,
        block_size: usize,
        micro_batches: usize,
    ) -> Result<Self, KernelError> {
        let bad = |m: String| Err(KernelError::Shape(m));
        if tp == 0 || dcp == 0 || interleave == 0 || block_size == 0 {
            return bad(format!(
                "tp ({tp}), dcp ({dcp}), interleave ({interleave}) and block size ({block_size}) must be at least 1."
            ));
        }
        check_tp_divisible(tp, dcp).map_err(KernelError::Shape)?;
        check_interleave(block_size, interleave).map_err(KernelError::Shape)?;
        if !(1..=2).contains(&micro_batches) {
            return bad(format!(
                "{micro_batches} micro-batches requested; 1 or 2 are supported."
            ));
        }
        Ok(Self {
            tp,
            dcp,
            interleave,
            block_size,
            micro_batches,
        })
    }

    /// The layout of a model with `attention`, checked with vLLM's constraints and
    /// messages in vLLM's order: sizes of at least 1, `tp % dcp`, the heads, then the
    /// interleave against the block size (and 1 or 2 micro-batches, as [`Layout::new`]).
    ///
    /// ```
    /// use dcpserve_kernels::dcp::{AttentionKind, Layout};
    /// let gqa = AttentionKind::Gqa { num_attention_heads: 8, num_key_value_heads: 2 };
    /// assert_eq!(Layout::for_model(gqa, 4, 2, 1, 16, 1).unwrap().virtual_block_size(), 32);
    /// let err = Layout::for_model(gqa, 2, 2, 1, 16, 1).unwrap_err().to_string();
    /// assert!(err.contains("greater than the model's total number of KV heads (2)"));
    /// ```
    pub fn for_model(
        attention: AttentionKind,
        tp: usize,
        dcp: usize,
        interleave: usize,
        block_size: usize,
        micro_batches: usize,
    ) -> Result<Self, KernelError> {
        check_model_layout(attention, tp, dcp, interleave, block_size)
            .map_err(KernelError::Shape)?;
        Self::new(tp, dcp, interleave, block_size, micro_batches)
    }

    /// Tensor-parallel ranks (the world of the rank group).
    pub fn tp(&self) -> usize {
        self.tp
    }

    /// Ranks per DCP group.
    pub fn dcp(&self) -> usize {
        self.dcp
    }

    /// Consecutive positions placed on one DCP rank.
    pub fn interleave(&self) -> usize {
        self.interleave
    }

    /// Tokens per physical block on one rank (B).
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Micro-batches in ping-pong (1 or 2).
    pub fn micro_batches(&self) -> usize {
        self.micro_batches
    }

    /// Tokens per virtual block (B·dcp): the unit the scheduler and the prefix cache
    /// count in; the same logical block id is used on every DCP rank.
    pub fn virtual_block_size(&self) -> usize {
        self.block_size * self.dcp
    }

    /// The DCP rank of TP rank `tp_rank` ([`dcp_rank_of`]).
    pub fn dcp_rank(&self, tp_rank: usize) -> usize {
        dcp_rank_of(tp_rank, self.dcp)
    }

    /// The DCP group TP rank `tp_rank` belongs to.
    pub fn dcp_group_of(&self, tp_rank: usize) -> usize {
        tp_rank / self.dcp
    }

    /// Number of DCP groups.
    pub fn num_dcp_groups(&self) -> usize {
        self.tp / self.dcp
    }

    /// The TP ranks of DCP group `group`, in DCP-rank order.
    pub fn dcp_group_ranks(&self, group: usize) -> Range<usize> {
        group * self.dcp..(group + 1) * self.dcp
    }

    /// The placement rule as TP rank `tp_rank` sees it.
    pub fn placement(&self, tp_rank: usize) -> Placement {
        Placement {
            block_size: self.block_size,
            dcp_size: self.dcp,
            interleave: self.interleave,
            dcp_rank: self.dcp_rank(tp_rank),
        }
    }

    /// Tokens a DCP group holds when each of its ranks holds `tokens_per_rank`.
    pub fn tokens_total(&self, tokens_per_rank: usize) -> usize {
        tokens_per_rank.saturating_mul(self.dcp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_partition_the_ranks_and_agree_with_the_placement() {
        for (tp, dcp) in [(1, 1), (4, 1), (4, 2), (4, 4), (6, 3), (8, 2)] {
            let l = Layout::new(tp, dcp, 1, 16, 1).unwrap();
            let mut seen = vec![false; tp];
            for g in 0..l.num_dcp_groups() {
                for (i, r) in l.dcp_group_ranks(g).enumerate() {
                    assert!(!std::mem::replace(&mut seen[r], true));
                    assert_eq!(l.dcp_group_of(r), g);
                    assert_eq!(l.dcp_rank(r), i);
                    assert_eq!(l.placement(r).dcp_rank, i);
                    assert_eq!(l.placement(r).virtual_block_size(), 16 * dcp);
                }
            }
            assert!(seen.iter().all(|&s| s));
        }
    }

    #[test]
    fn impossible_layouts_are_refused() {
        let msg = |r: Result<Layout, KernelError>| r.unwrap_err().to_string();
        assert!(
            msg(Layout::new(4, 3, 1, 16, 1)).contains("tp_size=4 must be divisible by dcp_size=3.")
        );
        assert!(msg(Layout::new(4, 2, 3, 16, 1)).contains("Block_size(16)"));
        assert!(msg(Layout::new(4, 2, 1, 16, 3)).contains("1 or 2"));
        assert!(Layout::new(0, 1, 1, 16, 1).is_err());
    }
}
