//! The model a rank runs, whatever its attention: standard (Llama family, K/V cache) or
//! multi-head latent attention (DeepSeek family, latent cache), and what its cache holds
//! (what a token costs is `dcpserve_kernels::dcp::KvShape`'s, from
//! [`ModelConfig::kv_shape`]).

use std::sync::Mutex;

use dcpserve_kernels::{Backend, CpuBackend, KvCacheDType};

use super::cache_access::{lock, SharedCache};

use super::batch_input::BatchInput;
use super::forward::{no_mtp, DecoderModel};
use super::kv_cache::KvCache;
use super::mla::{LatentCache, MlaModel};
use super::rank_io::{ForwardOptions, ForwardOutput, RankComms};
use super::weights::{TpShard, WeightPrecision};
use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::tensors::TensorSource;

/// One rank's model, computing on backend `B`.
pub enum RankModel<B: Backend = CpuBackend> {
    /// Llama / Qwen2 / Qwen3.
    Dense(Box<DecoderModel<B>>),
    /// DeepSeek-V2 / V3, Kimi K2.
    Mla(Box<MlaModel<B>>),
}

/// One rank's KV storage, matching its [`RankModel`]. Each kind sits behind a mutex so
/// the rank's two micro-batch threads can share it ([`RankModel::forward_rank_shared`]);
/// a step that owns the cache (`&mut`) never locks.
pub enum RankCache<B: Backend = CpuBackend> {
    Dense(Mutex<KvCache<B>>),
    Latent(Mutex<LatentCache<B>>),
}

impl<B: Backend> RankCache<B> {
    /// Number of token slots.
    pub fn capacity_tokens(&self) -> usize {
        match self {
            RankCache::Dense(c) => lock(c).capacity_tokens(),
            RankCache::Latent(c) => lock(c).capacity_tokens(),
        }
    }

    /// What this rank's cache holds (diagnostic, for memory tests).
    pub fn storage(&self) -> KvStorage {
        match self {
            RankCache::Dense(c) => {
                let c = lock(c);
                KvStorage {
                    tokens_written_per_layer: None,
                    bytes_per_token: c.bytes_per_token(),
                    capacity_tokens: c.capacity_tokens(),
                }
            }
            RankCache::Latent(c) => {
                let c = lock(c);
                KvStorage {
                    tokens_written_per_layer: Some(c.tokens_written().to_vec()),
                    bytes_per_token: c.bytes_per_token(),
                    capacity_tokens: c.capacity_tokens(),
                }
            }
        }
    }
}

/// What one rank's KV cache stores: a diagnostic of how DCP spread the tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvStorage {
    /// Token rows written to each layer since allocation (latent caches; `None` for dense
    /// K/V caches, whose writes are not counted).
    pub tokens_written_per_layer: Option<Vec<usize>>,
    /// Bytes one token occupies on this rank, all layers together.
    pub bytes_per_token: usize,
    /// Token slots allocated on this rank.
    pub capacity_tokens: usize,
}

impl<B: Backend> RankModel<B> {
    /// Loads tensor-parallel rank `shard.rank`'s slice of whichever architecture `config`
    /// names, to compute on `backend` (the rank's device and threads).
    pub fn load_shard(
        backend: B,
        config: ModelConfig,
        tensors: &dyn TensorSource,
        precision: WeightPrecision,
        shard: TpShard,
    ) -> Result<Self, ModelError> {
        if config.mla.is_some() {
            Ok(RankModel::Mla(Box::new(MlaModel::load_shard(
                backend, config, tensors, precision, shard,
            )?)))
        } else {
            Ok(RankModel::Dense(Box::new(DecoderModel::load_shard(
                backend, config, tensors, precision, shard,
            )?)))
        }
    }

    /// Loads the whole model on one rank.
    pub fn load(
        backend: B,
        config: ModelConfig,
        tensors: &dyn TensorSource,
        precision: WeightPrecision,
    ) -> Result<Self, ModelError> {
        Self::load_shard(backend, config, tensors, precision, TpShard::single())
    }

    /// The backend the model computes on.
    pub fn backend(&self) -> &B {
        match self {
            RankModel::Dense(m) => m.backend(),
            RankModel::Mla(m) => m.backend(),
        }
    }

    /// The configuration the model was loaded with.
    pub fn config(&self) -> &ModelConfig {
        match self {
            RankModel::Dense(m) => &m.shell.config,
            RankModel::Mla(m) => &m.shell.config,
        }
    }

    /// A float32 KV cache of `num_blocks` blocks of `block_size` tokens for this rank
    /// (the reference precision; see [`RankModel::new_kv_cache_typed`]).
    pub fn new_kv_cache(
        &self,
        num_blocks: usize,
        block_size: usize,
    ) -> Result<RankCache<B>, ModelError> {
        self.new_kv_cache_typed(num_blocks, block_size, KvCacheDType::F32)
    }

    /// A KV cache of `num_blocks` blocks of `block_size` tokens for this rank, values
    /// stored as `dtype`.
    pub fn new_kv_cache_typed(
        &self,
        num_blocks: usize,
        block_size: usize,
        dtype: KvCacheDType,
    ) -> Result<RankCache<B>, ModelError> {
        Ok(match self {
            RankModel::Dense(m) => {
                RankCache::Dense(Mutex::new(m.new_kv_cache(num_blocks, block_size, dtype)?))
            }
            RankModel::Mla(m) => {
                RankCache::Latent(Mutex::new(m.new_kv_cache(num_blocks, block_size, dtype)?))
            }
        })
    }

    /// Allocates one forward's workspace for steps of up to `max_tokens` tokens now, so
    /// no step allocates activations; call it once per forward that may run at the same
    /// time (one per micro-batch), after [`RankModel::load_mtp`].
    pub fn reserve_workspace(&self, max_tokens: usize) -> Result<(), ModelError> {
        match self {
            RankModel::Dense(m) => m.reserve_workspace(max_tokens),
            RankModel::Mla(m) => m.reserve_workspace(max_tokens),
        }
    }

    /// Loads this rank's share of the multi-token-prediction layer (DeepSeek-V3 MTP); the
    /// KV cache made afterwards has a layer for it. Errors for models without one.
    pub fn load_mtp(
        &mut self,
        tensors: &dyn TensorSource,
        precision: WeightPrecision,
    ) -> Result<(), ModelError> {
        match self {
            RankModel::Mla(m) => m.load_mtp(tensors, precision),
            RankModel::Dense(_) => Err(no_mtp()),
        }
    }

    /// Whether the MTP layer is loaded.
    pub fn has_mtp(&self) -> bool {
        matches!(self, RankModel::Mla(m) if m.mtp.is_some())
    }
}

impl<B: Backend> RankModel<B> {
    /// One step on this rank: the model's forward pass over `input` (see
    /// [`DecoderModel::forward`] and [`MlaModel::forward`], and [`ForwardOptions`] for
    /// the hidden states and MTP steps). Every rank of the group must call it with the
    /// same plan; a model on one rank passes [`RankComms::single`].
    ///
    /// The cache may be used by another micro-batch thread of the rank at the same
    /// time: it is locked only while this step reads or writes it, never across a
    /// collective, and each access is one of `opts.turns` (where it may let the other
    /// micro-batch compute). The two threads' steps must hold disjoint sequences.
    pub fn forward(
        &self,
        comms: &RankComms<B>,
        input: &BatchInput,
        cache: &RankCache<B>,
        opts: &ForwardOptions<'_, B>,
    ) -> Result<ForwardOutput<B>, ModelError> {
        match (self, cache) {
            (RankModel::Dense(m), RankCache::Dense(c)) => {
                m.forward(comms, input, SharedCache::new(c, opts.turns), opts)
            }
            (RankModel::Mla(m), RankCache::Latent(c)) => {
                m.forward(comms, input, SharedCache::new(c, opts.turns), opts)
            }
            _ => Err(mismatch()),
        }
    }
}

fn mismatch() -> ModelError {
    ModelError::Invalid("the KV cache does not match the model's attention".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Architecture, MlaConfig, MoeConfig, MoeScoring, YarnScaling};
    use dcpserve_kernels::dcp::{KvCapacity, Layout};

    /// The engine's figures for `cfg`, through the model's [`ModelConfig::kv_shape`].
    fn kv_bytes_per_token(cfg: &ModelConfig, tp: usize, dtype: KvCacheDType) -> usize {
        cfg.kv_shape().bytes_per_token_per_rank(tp, dtype)
    }

    fn kv_capacity(
        cfg: &ModelConfig,
        tp: usize,
        dcp: usize,
        block_size: usize,
        budget: u64,
        dtype: KvCacheDType,
    ) -> KvCapacity {
        Layout::new(tp, dcp, 1, block_size, 1)
            .unwrap()
            .kv_capacity(kv_bytes_per_token(cfg, tp, dtype), budget)
    }

    /// Kimi K2's shapes (DeepSeek-V3 architecture, 61 layers, 64 heads, 384 experts).
    pub(crate) fn kimi_k2() -> ModelConfig {
        ModelConfig {
            architecture: Architecture::DeepseekV3,
            hidden_size: 7168,
            intermediate_size: 18432,
            num_hidden_layers: 61,
            num_attention_heads: 64,
            num_key_value_heads: 64,
            head_dim: 64,
            vocab_size: 163840,
            rms_norm_eps: 1e-6,
            rope_theta: 50000.0,
            rope_scaling: None,
            rope_interleaved: false,
            max_position_embeddings: 131072,
            tie_word_embeddings: false,
            attention_bias: false,
            qk_norm: false,
            bos_token_id: Some(163584),
            eos_token_ids: vec![163585],
            mla: Some(MlaConfig {
                q_lora_rank: Some(1536),
                kv_lora_rank: 512,
                qk_nope_head_dim: 128,
                qk_rope_head_dim: 64,
                v_head_dim: 128,
                rope_interleave: true,
                yarn: Some(YarnScaling {
                    factor: 32.0,
                    original_max_position_embeddings: 4096,
                    beta_fast: 1.0,
                    beta_slow: 1.0,
                    mscale: Some(1.0),
                    mscale_all_dim: Some(1.0),
                    attention_factor: None,
                    truncate: true,
                }),
            }),
            moe: Some(MoeConfig {
                n_routed_experts: 384,
                num_experts_per_tok: 8,
                moe_intermediate_size: 2048,
                n_shared_experts: 1,
                n_group: 1,
                topk_group: 1,
                routed_scaling_factor: 2.827,
                norm_topk_prob: true,
                first_k_dense_replace: 1,
                scoring: MoeScoring::Sigmoid,
                group_limited: true,
                correction_bias: true,
            }),
        }
    }

    /// The memory a Kimi-K2-sized model's latent cache costs per token, and what a KV
    /// budget holds with and without DCP (printed with `--nocapture`).
    #[test]
    fn kimi_k2_kv_memory_and_capacity() {
        let cfg = kimi_k2();
        let per_token = kv_bytes_per_token(&cfg, 8, KvCacheDType::F32);
        // 61 layers × (512 + 64) values × 4 bytes (f32), the same on every TP rank.
        assert_eq!(per_token, 61 * 576 * 4);
        assert_eq!(per_token, kv_bytes_per_token(&cfg, 1, KvCacheDType::F32));
        assert_eq!(
            kv_bytes_per_token(&cfg, 8, KvCacheDType::BF16),
            61 * 576 * 2
        );
        // FP8: a value byte each and one scale byte per latent row.
        assert_eq!(kv_bytes_per_token(&cfg, 8, KvCacheDType::Fp8E4M3), 61 * 577);
        let budget: u64 = 16 << 30;
        let block = 16;
        println!(
            "Kimi-K2-sized (61 layers, latent 512+64): {} bytes/token/rank in f32 ({} in bf16)",
            per_token,
            61 * 576 * 2
        );
        for (tp, dcp) in [(8, 1), (8, 2), (8, 4), (8, 8)] {
            let c = kv_capacity(&cfg, tp, dcp, block, budget, KvCacheDType::F32);
            assert_eq!(c.tokens_total, c.tokens_per_rank * dcp);
            println!(
                "tp={tp} dcp={dcp}, 16 GiB KV per rank: {} tokens per rank, {} tokens total",
                c.tokens_per_rank, c.tokens_total
            );
        }
        let without = kv_capacity(&cfg, 8, 1, block, budget, KvCacheDType::F32);
        let with = kv_capacity(&cfg, 8, 8, block, budget, KvCacheDType::F32);
        assert_eq!(with.tokens_total, 8 * without.tokens_total);
        // A narrower cache holds proportionally more (whole blocks: within one block):
        // bf16 2×, FP8 4 · 576/577× (a value byte each and a scale byte per row).
        for (dt, times) in [
            (KvCacheDType::BF16, 2.0),
            (KvCacheDType::Fp8E5M2, 4.0 * 576.0 / 577.0),
        ] {
            let c = kv_capacity(&cfg, 8, 1, block, budget, dt);
            let want = times * without.num_blocks as f64;
            assert!((c.num_blocks as f64 - want).abs() <= times, "{dt}");
        }
    }
}
