//! A model's layout and KV cache, resolved in one place: the layout checked against the
//! model with vLLM's messages, the KV element type, the budget and what it holds. The
//! engine, the supervisor, the draft model and the planner all go through here.

use dcpserve_kernels::dcp::{AttentionKind, KvCapacity, KvShape, Layout};
use dcpserve_kernels::KvCacheDType;

use crate::engine::EngineConfig;
use crate::parallel::{ConfigError, ParallelConfig};

/// How a layout's KV cache is sized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvSizing {
    /// Tokens per KV block on one rank.
    pub block_size: usize,
    /// Micro-batches in ping-pong (1 or 2).
    pub micro_batches: usize,
    /// How the cache stores values.
    pub dtype: KvCacheDType,
    /// KV-cache bytes of each rank.
    pub budget_per_rank: u64,
}

/// A model's layout and KV cache, resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResolvedLayout {
    /// The rank group's shape.
    pub layout: Layout,
    /// How the KV cache stores values.
    pub kv_dtype: KvCacheDType,
    /// KV-cache bytes of each rank.
    pub budget_per_rank: u64,
    /// What the budget holds (bytes per token per rank, blocks, tokens per rank and
    /// in total).
    pub capacity: KvCapacity,
}

/// Checks `parallel` against the model (vLLM's constraints and messages) and sizes its
/// KV cache: the one resolution every caller shares.
///
/// ```
/// use dcpserve_config::{resolve, KvSizing, ParallelConfig};
/// use dcpserve_kernels::dcp::{AttentionKind, KvShape};
/// use dcpserve_kernels::KvCacheDType;
/// let model = KvShape {
///     attention: AttentionKind::Gqa { num_attention_heads: 8, num_key_value_heads: 2 },
///     num_layers: 2,
///     row_len: 16,
/// };
/// let p = ParallelConfig { tensor_parallel_size: 4, decode_context_parallel_size: 2, ..Default::default() };
/// let sizing = KvSizing { block_size: 16, micro_batches: 1, dtype: KvCacheDType::F32, budget_per_rank: 1 << 20 };
/// let r = resolve(&p, &model, sizing).unwrap();
/// // One replicated KV head per rank: 2 layers × (K + V) × 16 values × 4 bytes.
/// assert_eq!(r.capacity.bytes_per_token_per_rank, 256);
/// assert_eq!(r.capacity.tokens_total, 2 * r.capacity.tokens_per_rank);
/// ```
pub fn resolve(
    parallel: &ParallelConfig,
    model: &KvShape,
    kv: KvSizing,
) -> Result<ResolvedLayout, ConfigError> {
    let layout = parallel.layout_for(model.attention, kv.block_size, kv.micro_batches)?;
    let per_token = model.bytes_per_token_per_rank(layout.tp(), kv.dtype);
    Ok(ResolvedLayout {
        layout,
        kv_dtype: kv.dtype,
        budget_per_rank: kv.budget_per_rank,
        capacity: layout.kv_capacity(per_token, kv.budget_per_rank),
    })
}

impl EngineConfig {
    /// Micro-batches in ping-pong: 2 with `overlap_micro_batches`, else 1.
    pub fn micro_batches(&self) -> usize {
        if self.overlap_micro_batches {
            2
        } else {
            1
        }
    }

    /// The layout of this config for a model with `attention`, checked with vLLM's
    /// messages: the first step of [`EngineConfig::resolve`], on its own for callers
    /// that check a layout before any budget is known (before the weights are read).
    pub fn resolve_layout(&self, attention: AttentionKind) -> Result<Layout, ConfigError> {
        self.parallel
            .layout_for(attention, self.block_size, self.micro_batches())
    }

    /// This config's layout and KV cache for `model` at `budget_per_rank` bytes per rank
    /// ([`resolve`]), the KV element type resolved as [`EngineConfig::kv_cache_dtype`].
    pub fn resolve(
        &self,
        model: &KvShape,
        budget_per_rank: u64,
    ) -> Result<ResolvedLayout, ConfigError> {
        resolve(
            &self.parallel,
            model,
            KvSizing {
                block_size: self.block_size,
                micro_batches: self.micro_batches(),
                dtype: self.kv_cache_dtype(),
                budget_per_rank,
            },
        )
    }
}
