//! One rank's DeepSeek-V2/V3 forward step: MLA with weight absorption over the latent
//! cache (decode and prefill alike), then a dense or mixture-of-experts MLP.

use dcpserve_kernels::dcp::{DcpAttention, DcpShape};
use dcpserve_kernels::{
    add_inplace, matmul, rms_norm, rms_norm_inplace, Backend, CpuBackend, ThreadPool, WeightMatrix,
};

use super::attention::{latent_attention, LatentBatch};
use super::cache::LatentCache;
use super::moe::{mlp_forward, moe_forward};
use super::mtp::MtpLayer;
use super::rope::{softmax_scale, MlaRope};
use super::weights::{FeedForward, MlaLayer, MlaWeights};
use crate::arch::cache_access::{read_in_pieces, CacheAccess};
use crate::arch::forward::BatchInput;
use crate::arch::head::{head_logits, pick_normed};
use crate::arch::rank_io::{ForwardOutput, RankComms};
use crate::arch::weights::{TpShard, WeightPrecision};
use crate::arch::workspace::HeadBuffers;
use crate::config::{MlaConfig, ModelConfig, MoeConfig};
use crate::error::ModelError;
use crate::tensors::TensorSource;

/// The CPU backend's buffer: the MLA forward's activations and norms are host vectors.
type CpuBuffer = <CpuBackend as Backend>::Buffer;

/// transformers builds `q_a_layernorm` / `kv_a_layernorm` with the default epsilon, not
/// the configured `rms_norm_eps`.
const LORA_NORM_EPS: f32 = 1e-6;

/// One rank's share of an MLA model: its heads, its MLP slices, the RoPE table.
pub struct MlaModel {
    pub config: ModelConfig,
    pub weights: MlaWeights,
    pub shard: TpShard,
    mla: MlaConfig,
    moe: MoeConfig,
    /// Attention heads on this rank.
    local_heads: usize,
    rope: MlaRope,
    scale: f32,
    /// The multi-token-prediction layer, when loaded ([`MlaModel::load_mtp`]).
    pub mtp: Option<MtpLayer>,
    /// The rank's backend: the final norm and output head compute through it (the
    /// shared [`head_logits`]); the rest of the MLA forward still takes a pool.
    backend: CpuBackend,
}

/// Per-step buffers.
pub(super) struct Buffers {
    normed: Vec<f32>,
    qa: Vec<f32>,
    q: Vec<f32>,
    kv: Vec<f32>,
    q_abs: Vec<f32>,
    lat_out: Vec<f32>,
    head_in: Vec<f32>,
    head_out: Vec<f32>,
    attn: Vec<f32>,
    proj: Vec<f32>,
}

impl MlaModel {
    /// Loads tensor-parallel rank `shard.rank`'s slice of the model, to run on `backend`.
    pub fn load_shard(
        backend: CpuBackend,
        config: ModelConfig,
        tensors: &dyn TensorSource,
        precision: WeightPrecision,
        shard: TpShard,
    ) -> Result<Self, ModelError> {
        let (Some(mla), Some(moe)) = (config.mla.clone(), config.moe.clone()) else {
            return Err(ModelError::Invalid(format!(
                "{:?} model without MLA / MoE configuration",
                config.architecture
            )));
        };
        let weights = MlaWeights::load(&config, tensors, precision, shard)?;
        let rope = MlaRope::new(
            &mla,
            config.rope_theta,
            config.max_position_embeddings.clamp(1, 1 << 16),
        );
        Ok(Self {
            local_heads: config.num_attention_heads / shard.size,
            scale: softmax_scale(&mla),
            weights,
            shard,
            rope,
            mla,
            moe,
            config,
            mtp: None,
            backend,
        })
    }

    /// The backend the model was loaded for.
    pub fn backend(&self) -> &CpuBackend {
        &self.backend
    }

    /// Latent-cache layers: the decoder layers, plus the MTP layer when loaded (it attends
    /// over its own latents, at the same slots as the target's).
    pub fn cache_layers(&self) -> usize {
        self.config.num_hidden_layers + usize::from(self.mtp.is_some())
    }

    /// A latent cache for this rank: `num_blocks` blocks of `block_size` tokens.
    pub fn new_kv_cache(&self, num_blocks: usize, block_size: usize) -> LatentCache {
        LatentCache::new(
            self.cache_layers(),
            num_blocks,
            block_size,
            self.mla.latent_dim(),
        )
    }

    /// Runs all layers for the batch on this rank, storing its latent shard in `cache`,
    /// and returns the logits of `input.logits_for` (complete on every rank). Every rank
    /// of the group must call it with the same plan.
    pub fn forward_rank(
        &self,
        pool: &ThreadPool,
        comms: &RankComms,
        input: &BatchInput,
        cache: &mut LatentCache,
    ) -> Result<ForwardOutput, ModelError> {
        Ok(self.forward_rank_hidden(pool, comms, input, cache, &[])?.0)
    }

    /// [`MlaModel::forward_rank`], also returning the final-normed hidden states
    /// (`[hidden_for.len(), hidden_size]`, the same on every rank) of the tokens
    /// `hidden_for` — what the MTP layer takes as its previous hidden states.
    pub fn forward_rank_hidden(
        &self,
        pool: &ThreadPool,
        comms: &RankComms,
        input: &BatchInput,
        cache: &mut LatentCache,
        hidden_for: &[usize],
    ) -> Result<(ForwardOutput, Vec<f32>), ModelError> {
        self.forward_rank_with(pool, comms, input, cache, hidden_for)
    }

    /// [`MlaModel::forward_rank_hidden`] with the cache reached through `cache` (borrowed,
    /// or shared with the rank's other micro-batch thread).
    pub fn forward_rank_with(
        &self,
        pool: &ThreadPool,
        comms: &RankComms,
        input: &BatchInput,
        mut cache: impl CacheAccess<LatentCache>,
        hidden_for: &[usize],
    ) -> Result<(ForwardOutput, Vec<f32>), ModelError> {
        let cfg = &self.config;
        let n = input.checked_len()?;
        cache.with(|c| self.check_cache(c))?;
        let h = cfg.hidden_size;
        let mut x = input.embed(&self.weights.embed_tokens, cfg.vocab_size, h)?;
        let mut b = self.buffers(n);
        let mut dcp = DcpAttention::new(comms.dcp_merge);
        for (li, lw) in self.weights.layers.iter().enumerate() {
            self.layer(
                pool,
                comms,
                input,
                &mut cache,
                (li, lw),
                &mut x,
                &mut b,
                &mut dcp,
            )?;
        }
        let out = self.logits(
            comms,
            &x,
            input.logits_for,
            &self.weights.norm,
            self.weights.output_head(),
        )?;
        let mut picked = HeadBuffers::new(&self.backend)?;
        let norm = &self.weights.norm;
        let n_x = x.len() / h.max(1);
        let eps = cfg.rms_norm_eps;
        pick_normed(
            &self.backend,
            &x,
            n_x,
            h,
            hidden_for,
            norm,
            eps,
            &mut picked,
        )?;
        let mut hidden = picked.normed;
        hidden.truncate(hidden_for.len() * h);
        Ok((out, hidden))
    }

    pub(super) fn check_cache(&self, cache: &LatentCache) -> Result<(), ModelError> {
        if cache.latent_dim != self.mla.latent_dim() || cache.num_layers() != self.cache_layers() {
            return Err(ModelError::Invalid(
                "the latent cache was not made for this model".into(),
            ));
        }
        Ok(())
    }

    /// One decoder layer `lw` on the residual stream `x`, its latents in cache layer `li`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn layer(
        &self,
        pool: &ThreadPool,
        comms: &RankComms,
        input: &BatchInput,
        cache: &mut impl CacheAccess<LatentCache>,
        (li, lw): (usize, &MlaLayer),
        x: &mut [f32],
        b: &mut Buffers,
        dcp: &mut DcpAttention,
    ) -> Result<(), ModelError> {
        let cfg = &self.config;
        let (n, h) = (input.tokens.len(), cfg.hidden_size);
        self.attention(pool, comms, input, cache, (li, lw), x, b, dcp)?;
        comms.world.all_reduce_sum(&mut b.proj)?;
        add_inplace(x, &b.proj)?;

        rms_norm(x, &lw.post_attention_norm, cfg.rms_norm_eps, &mut b.normed)?;
        match &lw.ffn {
            FeedForward::Dense(Some(m)) => mlp_forward(pool, m, &b.normed, n, &mut b.proj)?,
            FeedForward::Dense(None) => b.proj.fill(0.0),
            FeedForward::Moe(m) => moe_forward(pool, &self.moe, m, &b.normed, n, h, &mut b.proj)?,
        }
        comms.world.all_reduce_sum(&mut b.proj)?;
        add_inplace(x, &b.proj)?;
        Ok(())
    }

    pub(super) fn buffers(&self, n: usize) -> Buffers {
        let m = &self.mla;
        let hl = self.local_heads;
        let (r, d, qk) = (
            m.kv_lora_rank,
            m.latent_dim(),
            m.qk_nope_head_dim + m.qk_rope_head_dim,
        );
        let width = r.max(m.qk_nope_head_dim);
        Buffers {
            normed: vec![0.0; n * self.config.hidden_size],
            qa: vec![0.0; n * m.q_lora_rank.unwrap_or(0)],
            q: vec![0.0; n * hl * qk],
            kv: vec![0.0; n * d],
            q_abs: vec![0.0; n * hl * d],
            lat_out: vec![0.0; n * hl * r],
            head_in: vec![0.0; n * width],
            head_out: vec![0.0; n * width.max(m.v_head_dim)],
            attn: vec![0.0; n * hl * m.v_head_dim],
            proj: vec![0.0; n * self.config.hidden_size],
        }
    }

    /// Layer `layer`'s attention (latents in cache layer `li`): leaves this rank's partial
    /// `o_proj` output in `b.proj`.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        pool: &ThreadPool,
        comms: &RankComms,
        input: &BatchInput,
        cache: &mut impl CacheAccess<LatentCache>,
        (li, layer): (usize, &MlaLayer),
        x: &[f32],
        b: &mut Buffers,
        dcp: &mut DcpAttention,
    ) -> Result<(), ModelError> {
        let cfg = &self.config;
        let m = &self.mla;
        let lw = &layer.attn;
        let n = input.tokens.len();
        let hl = self.local_heads;
        let (r, dn, dv) = (m.kv_lora_rank, m.qk_nope_head_dim, m.v_head_dim);
        let (d, qk) = (m.latent_dim(), dn + m.qk_rope_head_dim);

        rms_norm(x, &layer.input_norm, cfg.rms_norm_eps, &mut b.normed)?;
        match &lw.q_a {
            Some((q_a, norm)) => {
                matmul(pool, &b.normed, n, q_a, &mut b.qa)?;
                rms_norm_inplace(&mut b.qa, norm, LORA_NORM_EPS)?;
                matmul(pool, &b.qa, n, &lw.q, &mut b.q)?;
            }
            None => matmul(pool, &b.normed, n, &lw.q, &mut b.q)?,
        }
        // The latent row of each new token: [normalized c_kv, roped k_pe].
        matmul(pool, &b.normed, n, &lw.kv_a, &mut b.kv)?;
        for (t, &pos) in input.positions.iter().enumerate() {
            let row = &mut b.kv[t * d..(t + 1) * d];
            rms_norm_inplace(&mut row[..r], &lw.kv_a_norm, LORA_NORM_EPS)?;
            self.rope.apply(row, d, r, pos)?;
            self.rope
                .apply(&mut b.q[t * hl * qk..(t + 1) * hl * qk], qk, dn, pos)?;
        }
        let block_size = cache.with(|c| {
            c.write(li, input.slots, &b.kv)?;
            Ok::<_, ModelError>(c.block_size)
        })?;

        // Absorb W_UK: q_lat = W_UKᵀ·q_nope per head; the rope part is used as is.
        for hh in 0..hl {
            for t in 0..n {
                let src = &b.q[(t * hl + hh) * qk..(t * hl + hh) * qk + dn];
                b.head_in[t * dn..(t + 1) * dn].copy_from_slice(src);
            }
            matmul(
                pool,
                &b.head_in[..n * dn],
                n,
                &lw.w_uk_t[hh],
                &mut b.head_out[..n * r],
            )?;
            for t in 0..n {
                let dst = &mut b.q_abs[(t * hl + hh) * d..(t * hl + hh + 1) * d];
                dst[..r].copy_from_slice(&b.head_out[t * r..(t + 1) * r]);
                dst[r..].copy_from_slice(&b.q[(t * hl + hh) * qk + dn..(t * hl + hh + 1) * qk]);
            }
        }
        let batch = LatentBatch {
            q: &b.q_abs,
            n_heads: hl,
            dim: d,
            v_dim: r,
            block_size,
            scale: self.scale,
            token_seq: input.token_seq,
            token_kv_len: input.kv_lens,
            block_tables: input.block_tables,
        };
        // The cache is only touched inside `with`, never across a collective.
        let mut attend = |q: &LatentBatch, out: &mut [f32], lse: &mut [f32]| {
            let shape = (q.n_heads * q.v_dim, q.n_heads);
            read_in_pieces(cache, q.token_seq.len(), shape, out, lse, |c, r, o, l| {
                Ok::<_, ModelError>(latent_attention(pool, &q.tokens(r), c.layer(li), o, l)?)
            })
        };
        let shape = DcpShape {
            tokens: n,
            heads: hl,
            q_dim: d,
            v_dim: r,
        };
        dcp.run(
            comms.dcp.as_ref(),
            &b.q_abs,
            shape,
            &mut b.lat_out,
            |q, heads, o, l| {
                let group = LatentBatch {
                    q,
                    n_heads: heads,
                    ..batch
                };
                attend(&group, o, l)
            },
        )?;
        // W_UV per head turns the attended latents into values; then o_proj.
        for hh in 0..hl {
            for t in 0..n {
                b.head_in[t * r..(t + 1) * r]
                    .copy_from_slice(&b.lat_out[(t * hl + hh) * r..(t * hl + hh + 1) * r]);
            }
            matmul(
                pool,
                &b.head_in[..n * r],
                n,
                &lw.w_uv[hh],
                &mut b.head_out[..n * dv],
            )?;
            for t in 0..n {
                b.attn[(t * hl + hh) * dv..(t * hl + hh + 1) * dv]
                    .copy_from_slice(&b.head_out[t * dv..(t + 1) * dv]);
            }
        }
        matmul(pool, &b.attn, n, &lw.o_proj, &mut b.proj)?;
        Ok(())
    }

    /// `norm` then the output `head` (this rank's vocabulary slice) for the tokens
    /// `logits_for` of `x`, gathered over the vocabulary.
    pub(super) fn logits(
        &self,
        comms: &RankComms,
        x: &CpuBuffer,
        logits_for: &[usize],
        norm: &CpuBuffer,
        head: &WeightMatrix,
    ) -> Result<ForwardOutput, ModelError> {
        let cfg = &self.config;
        let h = cfg.hidden_size;
        head_logits(
            &self.backend,
            comms,
            x,
            (x.len() / h.max(1), h),
            logits_for,
            (norm, cfg.rms_norm_eps),
            head,
            cfg.vocab_size,
            &mut HeadBuffers::new(&self.backend)?,
        )
    }
}
