//! The shape of one rank group, computed once: everything else reads it.

use std::ops::Range;

use super::constraints::{check_interleave, check_model_layout, check_tp_divisible, AttentionKind};
use super::placement::Placement;
use super::prefill_split::PrefillSplit;
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
/// assert_eq!(layout.cp_group_ranks(1), [2, 3]);
/// assert_eq!(layout.placement(3).dcp_rank, 1);
/// assert_eq!(layout.tokens_total(1000), 2000);
/// ```
///
/// With prefill context parallelism ([`Layout::with_pcp`]) the world is `pcp` copies of
/// the TP group: global rank `r` is TP rank `r % tp` of prefill-context-parallel rank
/// `r / tp` (vLLM's order, TP innermost). The KV cache is then sharded over the
/// *context-parallel group* of `pcp·dcp` ranks, the DCP groups of the same heads in every
/// copy: context-parallel rank `pcp_rank·dcp + dcp_rank` (see [`Layout::cp_group_ranks`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    tp: usize,
    pcp: usize,
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
            pcp: 1,
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

    /// The same layout with `pcp` prefill-context-parallel copies of the TP group
    /// (`--prefill-context-parallel-size`); 1 is the layout itself.
    ///
    /// ```
    /// use dcpserve_kernels::dcp::Layout;
    /// let l = Layout::new(2, 2, 1, 16, 1).unwrap().with_pcp(2).unwrap();
    /// assert_eq!((l.world(), l.cp_size(), l.virtual_block_size()), (4, 4, 64));
    /// assert_eq!(l.cp_group_ranks(0), [0, 1, 2, 3]);
    /// assert_eq!((l.tp_rank(3), l.pcp_rank(3), l.placement(3).dcp_rank), (1, 1, 3));
    /// ```
    pub fn with_pcp(self, pcp: usize) -> Result<Self, KernelError> {
        if pcp == 0 {
            return Err(KernelError::Shape(format!(
                "prefill_context_parallel_size ({pcp}) must be at least 1."
            )));
        }
        Ok(Self { pcp, ..self })
    }

    /// Tensor-parallel ranks (one copy of the model's weights).
    pub fn tp(&self) -> usize {
        self.tp
    }

    /// Prefill-context-parallel copies of the TP group.
    pub fn pcp(&self) -> usize {
        self.pcp
    }

    /// Every rank of the group: `tp · pcp`.
    pub fn world(&self) -> usize {
        self.tp * self.pcp
    }

    /// Ranks sharing one KV cache by position: `pcp · dcp`.
    pub fn cp_size(&self) -> usize {
        self.pcp * self.dcp
    }

    /// The TP rank of global rank `rank` (its weight shard).
    pub fn tp_rank(&self, rank: usize) -> usize {
        rank % self.tp
    }

    /// The prefill-context-parallel rank of global rank `rank` (its TP group's copy).
    pub fn pcp_rank(&self, rank: usize) -> usize {
        rank / self.tp
    }

    /// How global rank `rank` splits a step's tokens with the other copies.
    pub fn prefill_split(&self, rank: usize) -> PrefillSplit {
        PrefillSplit {
            pcp: self.pcp,
            pcp_rank: self.pcp_rank(rank),
            dcp: self.dcp,
            interleave: self.interleave,
        }
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

    /// Tokens per virtual block (B·pcp·dcp): the unit the scheduler and the prefix cache
    /// count in; the same logical block id is used on every context-parallel rank.
    pub fn virtual_block_size(&self) -> usize {
        self.block_size * self.cp_size()
    }

    /// The DCP rank of global rank `rank` ([`dcp_rank_of`] of its TP rank).
    pub fn dcp_rank(&self, rank: usize) -> usize {
        dcp_rank_of(self.tp_rank(rank), self.dcp)
    }

    /// The context-parallel rank of global rank `rank`: `pcp_rank · dcp + dcp_rank`.
    pub fn cp_rank(&self, rank: usize) -> usize {
        self.pcp_rank(rank) * self.dcp + self.dcp_rank(rank)
    }

    /// The DCP group (the heads) global rank `rank` belongs to.
    pub fn dcp_group_of(&self, rank: usize) -> usize {
        self.tp_rank(rank) / self.dcp
    }

    /// Number of DCP groups per TP group (and of context-parallel groups).
    pub fn num_dcp_groups(&self) -> usize {
        self.tp / self.dcp
    }

    /// The global ranks of the TP group of copy `pcp_rank`.
    pub fn tp_group_ranks(&self, pcp_rank: usize) -> Range<usize> {
        pcp_rank * self.tp..(pcp_rank + 1) * self.tp
    }

    /// The global ranks of context-parallel group `group` (DCP group `group` of every
    /// copy), in context-parallel-rank order; without pcp, the DCP group's TP ranks.
    pub fn cp_group_ranks(&self, group: usize) -> Vec<usize> {
        (0..self.pcp)
            .flat_map(|p| (0..self.dcp).map(move |d| p * self.tp + group * self.dcp + d))
            .collect()
    }

    /// The placement rule as global rank `rank` sees it (over its context-parallel group).
    pub fn placement(&self, rank: usize) -> Placement {
        Placement {
            block_size: self.block_size,
            dcp_size: self.cp_size(),
            interleave: self.interleave,
            dcp_rank: self.cp_rank(rank),
        }
    }

    /// Tokens a context-parallel group holds when each of its ranks holds
    /// `tokens_per_rank`.
    pub fn tokens_total(&self, tokens_per_rank: usize) -> usize {
        tokens_per_rank.saturating_mul(self.cp_size())
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
                for (i, r) in l.cp_group_ranks(g).into_iter().enumerate() {
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
    fn pcp_copies_partition_the_world_into_tp_and_cp_groups() {
        for (tp, dcp, pcp) in [(2, 1, 2), (4, 2, 2), (1, 1, 4), (4, 1, 3), (8, 2, 2)] {
            let l = Layout::new(tp, dcp, 2, 16, 1)
                .unwrap()
                .with_pcp(pcp)
                .unwrap();
            assert_eq!(l.world(), tp * pcp);
            let mut in_tp = vec![0; l.world()];
            for p in 0..pcp {
                for r in l.tp_group_ranks(p) {
                    in_tp[r] += 1;
                    assert_eq!((l.pcp_rank(r), l.tp_rank(r)), (p, r - p * tp));
                }
            }
            assert!(in_tp.iter().all(|&c| c == 1));
            let mut in_cp = vec![0; l.world()];
            for g in 0..l.num_dcp_groups() {
                let ranks = l.cp_group_ranks(g);
                assert_eq!(ranks.len(), pcp * dcp);
                for (c, &r) in ranks.iter().enumerate() {
                    in_cp[r] += 1;
                    assert_eq!(l.cp_rank(r), c);
                    assert_eq!(l.dcp_group_of(r), g);
                    assert_eq!(l.placement(r).dcp_rank, c);
                    assert_eq!(l.placement(r).dcp_size, pcp * dcp);
                    // A copy computes exactly the positions its ranks store.
                    let split = l.prefill_split(r);
                    for pos in 0..200 {
                        let stored_here = l.placement(r).owner(pos) / dcp == l.pcp_rank(r);
                        assert_eq!(split.computes(pos), stored_here);
                    }
                }
            }
            assert!(in_cp.iter().all(|&c| c == 1));
            assert_eq!(l.virtual_block_size(), 16 * pcp * dcp);
        }
        assert!(Layout::new(2, 1, 1, 16, 1).unwrap().with_pcp(0).is_err());
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
