//! What a token costs in the KV cache and how many tokens a budget holds: the one
//! formula the engine's sizing, its caches' diagnostics and the planner all read.

use super::constraints::AttentionKind;
use super::layout::Layout;
use crate::kv_dtype::KvCacheDType;

/// KV-cache bytes one token costs on one rank: `rows_per_layer` rows (K and V of each
/// of the rank's KV heads, or MLA's one latent row) of `row_len` values per cached
/// layer, each row stored as `dtype` stores it ([`KvCacheDType::row_bytes`]: the
/// values, and FP8's one-byte scale per row).
///
/// ```
/// use dcpserve_kernels::{dcp::kv_bytes_per_token, KvCacheDType};
/// // 2 layers, K and V of one head of 64 values, in bf16.
/// assert_eq!(kv_bytes_per_token(2, 2, 64, KvCacheDType::BF16), 512);
/// // In FP8: 64 one-byte values and a scale byte per row.
/// assert_eq!(kv_bytes_per_token(2, 2, 64, KvCacheDType::Fp8E4M3), 4 * 65);
/// ```
pub fn kv_bytes_per_token(
    layers: usize,
    rows_per_layer: usize,
    row_len: usize,
    dtype: KvCacheDType,
) -> usize {
    layers * rows_per_layer * dtype.row_bytes(row_len)
}

/// The shape of a model's KV cache, as its sizing needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvShape {
    pub attention: AttentionKind,
    /// Cached layers (an MTP layer that runs adds one).
    pub num_layers: usize,
    /// Values per cached row: `head_dim` for GQA's K and V heads, `kv_lora_rank +
    /// qk_rope_head_dim` for MLA's latent row.
    pub row_len: usize,
}

impl KvShape {
    /// Rows one token stores per layer on one of `tp` ranks: K and V of the rank's KV
    /// heads (split while tp ≤ KV heads, else one replicated head), or MLA's one latent
    /// row, replicated on every rank.
    pub fn rows_per_layer(&self, tp: usize) -> usize {
        match self.attention {
            AttentionKind::Mla { .. } => 1,
            AttentionKind::Gqa {
                num_key_value_heads: kv,
                ..
            } => {
                let tp = tp.max(1);
                2 * if tp <= kv { kv / tp } else { 1 }
            }
        }
    }

    /// KV-cache bytes one token costs on one of `tp` ranks, stored as `dtype`.
    ///
    /// ```
    /// use dcpserve_kernels::dcp::{AttentionKind, KvShape};
    /// use dcpserve_kernels::KvCacheDType;
    /// let gqa = KvShape {
    ///     attention: AttentionKind::Gqa { num_attention_heads: 8, num_key_value_heads: 2 },
    ///     num_layers: 2,
    ///     row_len: 16,
    /// };
    /// assert_eq!(gqa.bytes_per_token_per_rank(1, KvCacheDType::F32), 2 * 2 * 2 * 16 * 4);
    /// // Beyond 2 ranks each rank keeps one replicated KV head.
    /// assert_eq!(gqa.bytes_per_token_per_rank(4, KvCacheDType::F32), 2 * 2 * 16 * 4);
    /// ```
    pub fn bytes_per_token_per_rank(&self, tp: usize, dtype: KvCacheDType) -> usize {
        kv_bytes_per_token(
            self.num_layers,
            self.rows_per_layer(tp),
            self.row_len,
            dtype,
        )
    }
}

/// How many tokens a KV budget holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvCapacity {
    /// Bytes one token costs on each rank that stores it.
    pub bytes_per_token_per_rank: usize,
    /// Blocks of `block_size` tokens each rank allocates.
    pub num_blocks: usize,
    /// Token slots on one rank.
    pub tokens_per_rank: usize,
    /// Distinct tokens the model holds: each DCP rank stores a different 1/dcp of every
    /// sequence, so `tokens_per_rank × dcp`.
    pub tokens_total: usize,
}

impl Layout {
    /// The engine's KV sizing: `budget_per_rank` bytes on each rank, whole blocks of
    /// [`block_size`](Layout::block_size) tokens (at least one), each token costing
    /// `bytes_per_token_per_rank` on the one rank of its DCP group that stores it.
    ///
    /// ```
    /// use dcpserve_kernels::dcp::Layout;
    /// let cap = Layout::new(4, 2, 1, 16, 1).unwrap().kv_capacity(100, 10_000);
    /// assert_eq!((cap.num_blocks, cap.tokens_per_rank, cap.tokens_total), (6, 96, 192));
    /// ```
    pub fn kv_capacity(&self, bytes_per_token_per_rank: usize, budget_per_rank: u64) -> KvCapacity {
        let per_token = bytes_per_token_per_rank.max(1);
        let block_bytes = (per_token as u64).saturating_mul(self.block_size() as u64);
        let num_blocks = usize::try_from(budget_per_rank / block_bytes)
            .unwrap_or(usize::MAX)
            .max(1);
        let tokens_per_rank = num_blocks.saturating_mul(self.block_size());
        KvCapacity {
            bytes_per_token_per_rank: per_token,
            num_blocks,
            tokens_per_rank,
            tokens_total: self.tokens_total(tokens_per_rank),
        }
    }
}
