//! One forward step over a continuous batch of tokens.

use std::sync::Arc;

use dcpserve_kernels::dcp::{DcpAttention, DcpShape, MergeExchange};
use dcpserve_kernels::{
    add_bias, add_inplace, matmul, paged_attention, rms_norm, silu_mul, write_kv, AttentionBatch,
    Communicator, InProcessComm, RopeScalingKind, RopeTable, ThreadPool, WeightMatrix,
};

use super::cache_access::{read_in_pieces, CacheAccess};
use super::kv_cache::KvCache;
use super::weights::{split_range, DecoderWeights, HeadLayout, TpShard, WeightPrecision};
use crate::config::{ModelConfig, RopeScaling};
use crate::error::ModelError;
use crate::tensors::TensorSource;

/// The tokens of one step, flattened over all scheduled sequences.
pub struct BatchInput<'a> {
    /// Token ids.
    pub tokens: &'a [u32],
    /// Absolute position of each token in its sequence.
    pub positions: &'a [usize],
    /// Index into `block_tables` of each token's sequence.
    pub token_seq: &'a [u32],
    /// KV-cache slot each token's K/V is written to (`usize::MAX`: not stored on this rank).
    pub slots: &'a [usize],
    /// Number of cached tokens each token attends to, itself included (the causal mask).
    pub kv_lens: &'a [u32],
    /// Block table of each sequence.
    pub block_tables: &'a [&'a [u32]],
    /// Tokens whose next-token logits are wanted, in output order.
    pub logits_for: &'a [usize],
}

impl BatchInput<'_> {
    /// The number of tokens, once every per-token array is checked to have that length.
    pub fn checked_len(&self) -> Result<usize, ModelError> {
        let n = self.tokens.len();
        let lens = [
            self.positions.len(),
            self.token_seq.len(),
            self.slots.len(),
            self.kv_lens.len(),
        ];
        if lens.iter().any(|&l| l != n) {
            return Err(ModelError::Invalid(format!(
                "batch arrays disagree in length: {n} tokens but {lens:?}"
            )));
        }
        Ok(n)
    }

    /// The tokens' embeddings (`[n, hidden]`), refusing ids outside the vocabulary.
    pub(crate) fn embed(
        &self,
        table: &dcpserve_kernels::WeightMatrix,
        vocab: usize,
        hidden: usize,
    ) -> Result<Vec<f32>, ModelError> {
        let mut x = vec![0.0f32; self.tokens.len() * hidden];
        for (i, &t) in self.tokens.iter().enumerate() {
            if t as usize >= vocab {
                return Err(ModelError::Invalid(format!(
                    "token id {t} is outside the vocabulary ({vocab})"
                )));
            }
            table.dequantize_row(t as usize, &mut x[i * hidden..(i + 1) * hidden])?;
        }
        Ok(x)
    }
}

/// Logits of the requested tokens, row-major `[logits_for.len(), vocab]`.
pub struct ForwardOutput {
    pub logits: Vec<f32>,
    pub vocab_size: usize,
}

/// The communicators one rank computes with: its tensor-parallel group (all ranks of
/// the model) and its decode-context-parallel group (a contiguous block of `dcp` ranks),
/// and how the DCP group exchanges attention partials.
#[derive(Clone)]
pub struct RankComms {
    pub world: Arc<dyn Communicator>,
    pub dcp: Arc<dyn Communicator>,
    pub dcp_merge: MergeExchange,
}

impl RankComms {
    /// The communicators of a model served by one rank (every collective is a no-op).
    pub fn single() -> Self {
        let world: Arc<dyn Communicator> = Arc::new(InProcessComm::group(1).remove(0));
        Self {
            dcp: world.clone(),
            world,
            dcp_merge: MergeExchange::default(),
        }
    }
}

/// One rank's share of a decoder: its weight shard, head layout and RoPE table.
pub struct DecoderModel {
    pub config: ModelConfig,
    pub weights: DecoderWeights,
    pub shard: TpShard,
    pub heads: HeadLayout,
    rope: RopeTable,
}

fn rope_kind(s: &Option<RopeScaling>) -> RopeScalingKind {
    match s {
        None => RopeScalingKind::None,
        Some(RopeScaling::Linear { factor }) => RopeScalingKind::Linear { factor: *factor },
        Some(RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        }) => RopeScalingKind::Llama3 {
            factor: *factor,
            low_freq_factor: *low_freq_factor,
            high_freq_factor: *high_freq_factor,
            original_max_position_embeddings: *original_max_position_embeddings,
        },
    }
}

impl DecoderModel {
    /// Loads the whole model (one rank).
    pub fn load(
        config: ModelConfig,
        tensors: &dyn TensorSource,
        precision: WeightPrecision,
    ) -> Result<Self, ModelError> {
        Self::load_shard(config, tensors, precision, TpShard::single())
    }

    /// Loads tensor-parallel rank `shard.rank`'s slice of the model.
    pub fn load_shard(
        config: ModelConfig,
        tensors: &dyn TensorSource,
        precision: WeightPrecision,
        shard: TpShard,
    ) -> Result<Self, ModelError> {
        let weights = DecoderWeights::load(&config, tensors, precision, shard)?;
        let heads = HeadLayout::new(&config, shard);
        let rope = RopeTable::new(
            config.head_dim,
            config.rope_theta,
            rope_kind(&config.rope_scaling),
            config.max_position_embeddings.clamp(1, 1 << 16),
        );
        Ok(Self {
            config,
            weights,
            shard,
            heads,
            rope,
        })
    }

    /// A KV cache shaped for this rank with `num_blocks` blocks of `block_size` tokens.
    pub fn new_kv_cache(&self, num_blocks: usize, block_size: usize) -> KvCache {
        KvCache::new(
            self.config.num_hidden_layers,
            num_blocks,
            block_size,
            self.heads.kv_heads,
            self.config.head_dim,
        )
    }

    /// Runs one step on a model served by a single rank.
    pub fn forward(
        &self,
        pool: &ThreadPool,
        input: &BatchInput,
        cache: &mut KvCache,
    ) -> Result<ForwardOutput, ModelError> {
        self.forward_rank(pool, &RankComms::single(), input, cache)
    }

    /// Runs all layers for the batch on this rank, writing its K/V shard into `cache`,
    /// and returns the logits of the tokens listed in `input.logits_for` (complete on
    /// every rank). Every rank of the group must call it with the same plan.
    pub fn forward_rank(
        &self,
        pool: &ThreadPool,
        comms: &RankComms,
        input: &BatchInput,
        cache: &mut KvCache,
    ) -> Result<ForwardOutput, ModelError> {
        self.forward_rank_with(pool, comms, input, cache)
    }

    /// [`DecoderModel::forward_rank`] with the cache reached through `cache` (borrowed, or
    /// shared with the rank's other micro-batch thread).
    pub fn forward_rank_with(
        &self,
        pool: &ThreadPool,
        comms: &RankComms,
        input: &BatchInput,
        mut cache: impl CacheAccess<KvCache>,
    ) -> Result<ForwardOutput, ModelError> {
        let cfg = &self.config;
        let n = input.checked_len()?;
        let (h, hd) = (cfg.hidden_size, cfg.head_dim);
        let (nq, nkv) = (self.heads.q_heads, self.heads.kv_heads);
        let q_dim = nq * hd;
        let kv_dim = nkv * hd;
        let w = &self.weights;

        let mut x = input.embed(&w.embed_tokens, cfg.vocab_size, h)?;

        let mut normed = vec![0.0f32; n * h];
        let mut q = vec![0.0f32; n * q_dim];
        let mut k = vec![0.0f32; n * kv_dim];
        let mut v = vec![0.0f32; n * kv_dim];
        let mut attn = vec![0.0f32; n * q_dim];
        let mut proj = vec![0.0f32; n * h];
        let inter = self
            .weights
            .layers
            .first()
            .map_or(0, |l| l.gate_proj.rows());
        let mut dcp = DcpAttention::new(comms.dcp_merge);
        let mut gate = vec![0.0f32; n * inter];
        let mut up = vec![0.0f32; n * inter];
        let mut act = vec![0.0f32; n * inter];
        let scale = 1.0 / (hd as f32).sqrt();
        let block_size = cache.with(|c| c.block_size);

        for (li, lw) in w.layers.iter().enumerate() {
            rms_norm(&x, &lw.input_norm, cfg.rms_norm_eps, &mut normed)?;
            matmul(pool, &normed, n, &lw.q_proj, &mut q)?;
            matmul(pool, &normed, n, &lw.k_proj, &mut k)?;
            matmul(pool, &normed, n, &lw.v_proj, &mut v)?;
            if let (Some(qb), Some(kb), Some(vb)) = (&lw.q_bias, &lw.k_bias, &lw.v_bias) {
                add_bias(&mut q, qb)?;
                add_bias(&mut k, kb)?;
                add_bias(&mut v, vb)?;
            }
            if let (Some(qn), Some(kn)) = (&lw.q_norm, &lw.k_norm) {
                rms_norm_heads(&mut q, qn, cfg.rms_norm_eps)?;
                rms_norm_heads(&mut k, kn, cfg.rms_norm_eps)?;
            }
            for (i, &pos) in input.positions.iter().enumerate() {
                self.rope.apply(
                    &mut q[i * q_dim..(i + 1) * q_dim],
                    nq,
                    pos,
                    cfg.rope_interleaved,
                )?;
                self.rope.apply(
                    &mut k[i * kv_dim..(i + 1) * kv_dim],
                    nkv,
                    pos,
                    cfg.rope_interleaved,
                )?;
            }
            cache.with(|c| {
                let (kc, vc) = c.layer_mut(li);
                write_kv(kc, vc, nkv, hd, input.slots, &k, &v)
            })?;
            let batch = AttentionBatch {
                q: &q,
                n_q_heads: nq,
                n_kv_heads: nkv,
                head_dim: hd,
                block_size,
                scale,
                token_seq: input.token_seq,
                token_kv_len: input.kv_lens,
                block_tables: input.block_tables,
            };
            // The cache is only touched inside `with`, never across a collective.
            let mut attend = |b: &AttentionBatch, out: &mut [f32], lse: &mut [f32]| {
                let shape = (b.n_q_heads * b.head_dim, b.n_q_heads);
                read_in_pieces(
                    &mut cache,
                    b.token_seq.len(),
                    shape,
                    out,
                    lse,
                    |c, r, o, l| {
                        let (kc, vc) = c.layer(li);
                        paged_attention(pool, &b.tokens(r), kc, vc, o, l)
                    },
                )
            };
            let shape = DcpShape {
                tokens: n,
                heads: nq,
                q_dim: hd,
                v_dim: hd,
            };
            dcp.run(
                comms.dcp.as_ref(),
                &q,
                shape,
                &mut attn,
                |q, heads, o, l| {
                    let group = AttentionBatch {
                        q,
                        n_q_heads: heads,
                        ..batch
                    };
                    attend(&group, o, l)
                },
            )?;
            matmul(pool, &attn, n, &lw.o_proj, &mut proj)?;
            comms.world.all_reduce_sum(&mut proj)?;
            add_inplace(&mut x, &proj)?;

            rms_norm(&x, &lw.post_attention_norm, cfg.rms_norm_eps, &mut normed)?;
            matmul(pool, &normed, n, &lw.gate_proj, &mut gate)?;
            matmul(pool, &normed, n, &lw.up_proj, &mut up)?;
            silu_mul(&gate, &up, &mut act)?;
            matmul(pool, &act, n, &lw.down_proj, &mut proj)?;
            comms.world.all_reduce_sum(&mut proj)?;
            add_inplace(&mut x, &proj)?;
        }

        head_logits(
            pool,
            comms,
            &x,
            h,
            input.logits_for,
            &w.norm,
            cfg.rms_norm_eps,
            w.output_head(),
            cfg.vocab_size,
        )
    }
}

/// The rows `rows` of `x` (`[n, h]`), RMS-normalized with `norm`.
pub(crate) fn pick_normed(
    x: &[f32],
    h: usize,
    rows: &[usize],
    norm: &[f32],
    eps: f32,
) -> Result<Vec<f32>, ModelError> {
    let n = x.len() / h.max(1);
    let mut picked = vec![0.0f32; rows.len() * h];
    for (j, &t) in rows.iter().enumerate() {
        if t >= n {
            return Err(ModelError::Invalid(format!(
                "row {t} requested of a {n}-token batch"
            )));
        }
        picked[j * h..(j + 1) * h].copy_from_slice(&x[t * h..(t + 1) * h]);
    }
    let mut normed = vec![0.0f32; rows.len() * h];
    rms_norm(&picked, norm, eps, &mut normed)?;
    Ok(normed)
}

/// The final `norm`, then the output `head` (this rank's vocabulary slice), for the tokens
/// `rows` of `x` (`[n, h]`); the logits are gathered over the vocabulary across ranks.
#[allow(clippy::too_many_arguments)]
pub(crate) fn head_logits(
    pool: &ThreadPool,
    comms: &RankComms,
    x: &[f32],
    h: usize,
    rows: &[usize],
    norm: &[f32],
    eps: f32,
    head: &WeightMatrix,
    vocab: usize,
) -> Result<ForwardOutput, ModelError> {
    let m = rows.len();
    let normed = pick_normed(x, h, rows, norm, eps)?;
    let mut local = vec![0.0f32; m * head.rows()];
    if m > 0 {
        matmul(pool, &normed, m, head, &mut local)?;
    }
    let logits = if comms.world.size() == 1 {
        local
    } else {
        gather_vocab(comms.world.as_ref(), &local, m, vocab)?
    };
    Ok(ForwardOutput {
        logits,
        vocab_size: vocab,
    })
}

/// Reassembles `[m, vocab]` logits from every rank's `[m, vocab slice]`.
pub(super) fn gather_vocab(
    world: &dyn Communicator,
    local: &[f32],
    m: usize,
    vocab: usize,
) -> Result<Vec<f32>, ModelError> {
    let tp = world.size();
    let parts: Vec<std::ops::Range<usize>> = (0..tp).map(|r| split_range(vocab, tp, r)).collect();
    let counts: Vec<usize> = parts.iter().map(|p| p.len() * m).collect();
    let mut gathered = vec![0.0f32; m * vocab];
    world.all_gather_varying(local, &counts, &mut gathered)?;
    let mut logits = vec![0.0f32; m * vocab];
    let mut at = 0;
    for p in &parts {
        let w = p.len();
        for row in 0..m {
            logits[row * vocab + p.start..row * vocab + p.end]
                .copy_from_slice(&gathered[at + row * w..at + (row + 1) * w]);
        }
        at += w * m;
    }
    Ok(logits)
}

/// RMSNorm applied to every head vector (Qwen3's q/k norm).
fn rms_norm_heads(x: &mut [f32], weight: &[f32], eps: f32) -> Result<(), ModelError> {
    dcpserve_kernels::rms_norm_inplace(x, weight, eps)?;
    Ok(())
}
