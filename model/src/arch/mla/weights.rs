//! One tensor-parallel rank's share of a DeepSeek-V2/V3 model's weights.
//!
//! Attention heads are split across ranks (rows of `q_b_proj` / `q_proj` and `kv_b_proj`,
//! columns of `o_proj`); the down-projections to the latents (`q_a_proj`,
//! `kv_a_proj_with_mqa`) are replicated. `kv_b_proj` is kept only as the per-head
//! absorption matrices (W_UKᵀ and W_UV), in f32. Every MLP — dense, shared expert and each
//! routed expert — is split along its intermediate dimension like the dense models', and
//! the router is replicated so every rank routes identically.

use dcpserve_kernels::WeightMatrix;

use crate::arch::weights::{embedding_and_head, matrix, vector, TpShard, WeightPrecision};
use crate::config::{MlaConfig, ModelConfig, MoeConfig};
use crate::error::ModelError;
use crate::tensors::TensorSource;

/// A SiLU-gated MLP's slice on this rank (`None` when the rank got no columns).
pub struct MlpShard {
    pub gate: WeightMatrix,
    pub up: WeightMatrix,
    pub down: WeightMatrix,
}

/// Attention weights of one layer on this rank.
pub struct MlaAttention {
    /// `q_a_proj` (replicated) and `q_a_layernorm`, when queries are low-rank.
    pub q_a: Option<(WeightMatrix, Vec<f32>)>,
    /// `q_b_proj` (or `q_proj`) rows of this rank's heads: `[heads·(nope+rope), in]`.
    pub q: WeightMatrix,
    /// `kv_a_proj_with_mqa` (replicated): `[kv_lora_rank + rope, hidden]`.
    pub kv_a: WeightMatrix,
    pub kv_a_norm: Vec<f32>,
    /// Per local head, W_UKᵀ `[kv_lora_rank, nope]`: absorbs a query's no-rope part into
    /// latent space.
    pub w_uk_t: Vec<WeightMatrix>,
    /// Per local head, W_UV `[v_head_dim, kv_lora_rank]`: turns attended latents into values.
    pub w_uv: Vec<WeightMatrix>,
    /// `o_proj` columns of this rank's heads.
    pub o_proj: WeightMatrix,
}

/// Routed + shared experts of one layer on this rank.
pub struct MoeShard {
    /// Router `[n_routed_experts, hidden]`, f32, replicated.
    pub router: WeightMatrix,
    pub correction_bias: Option<Vec<f32>>,
    pub experts: Vec<Option<MlpShard>>,
    pub shared: Option<MlpShard>,
}

/// The MLP of one layer.
pub enum FeedForward {
    Dense(Option<MlpShard>),
    Moe(MoeShard),
}

/// One decoder layer.
pub struct MlaLayer {
    pub input_norm: Vec<f32>,
    pub post_attention_norm: Vec<f32>,
    pub attn: MlaAttention,
    pub ffn: FeedForward,
}

impl MlaLayer {
    /// Reads decoder layer `i` (`model.layers.{i}.*`): dense MLP below
    /// `first_k_dense_replace`, mixture of experts from there on.
    pub fn load(
        cfg: &ModelConfig,
        src: &dyn TensorSource,
        i: usize,
        precision: WeightPrecision,
        shard: TpShard,
    ) -> Result<Self, ModelError> {
        let (Some(mla), Some(moe)) = (&cfg.mla, &cfg.moe) else {
            return Err(ModelError::Invalid(
                "an MLA layer needs its MLA and MoE configuration".into(),
            ));
        };
        let h = cfg.hidden_size;
        let p = format!("model.layers.{i}");
        let ffn = if i < moe.first_k_dense_replace {
            FeedForward::Dense(mlp(
                src,
                &format!("{p}.mlp"),
                h,
                cfg.intermediate_size,
                precision,
                shard,
            )?)
        } else {
            FeedForward::Moe(moe_shard(src, &p, h, moe, precision, shard)?)
        };
        Ok(MlaLayer {
            input_norm: vector(src, &format!("{p}.input_layernorm.weight"), h)?,
            post_attention_norm: vector(src, &format!("{p}.post_attention_layernorm.weight"), h)?,
            attn: attention(src, &p, cfg, mla, precision, shard)?,
            ffn,
        })
    }
}

/// All weights of this rank.
pub struct MlaWeights {
    pub embed_tokens: WeightMatrix,
    pub layers: Vec<MlaLayer>,
    pub norm: Vec<f32>,
    /// This rank's vocabulary slice of the output head (`None`: the whole embedding).
    pub lm_head: Option<WeightMatrix>,
}

impl MlaWeights {
    /// The output projection of this rank.
    pub fn output_head(&self) -> &WeightMatrix {
        self.lm_head.as_ref().unwrap_or(&self.embed_tokens)
    }

    /// Reads and checks every tensor, keeping `shard`'s slice.
    pub fn load(
        cfg: &ModelConfig,
        src: &dyn TensorSource,
        precision: WeightPrecision,
        shard: TpShard,
    ) -> Result<Self, ModelError> {
        if cfg.mla.is_none() || cfg.moe.is_none() {
            return Err(ModelError::Invalid(
                "an MLA model needs its MLA and MoE configuration".into(),
            ));
        }
        if !cfg.num_attention_heads.is_multiple_of(shard.size) {
            return Err(ModelError::Invalid(format!(
                "{} attention heads do not split over {} ranks",
                cfg.num_attention_heads, shard.size
            )));
        }
        let h = cfg.hidden_size;
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| MlaLayer::load(cfg, src, i, precision, shard))
            .collect::<Result<Vec<_>, _>>()?;
        let (embed_tokens, lm_head) = embedding_and_head(cfg, src, precision, shard)?;
        Ok(Self {
            embed_tokens,
            layers,
            norm: vector(src, "model.norm.weight", h)?,
            lm_head,
        })
    }
}

/// `prefix.{gate,up,down}_proj` split along the intermediate dimension.
fn mlp(
    src: &dyn TensorSource,
    prefix: &str,
    h: usize,
    inter: usize,
    precision: WeightPrecision,
    shard: TpShard,
) -> Result<Option<MlpShard>, ModelError> {
    let part = shard.split(inter);
    if part.is_empty() {
        return Ok(None);
    }
    Ok(Some(MlpShard {
        gate: matrix(
            src,
            &format!("{prefix}.gate_proj.weight"),
            (inter, h),
            part.clone(),
            0..h,
            precision,
        )?,
        up: matrix(
            src,
            &format!("{prefix}.up_proj.weight"),
            (inter, h),
            part.clone(),
            0..h,
            precision,
        )?,
        down: matrix(
            src,
            &format!("{prefix}.down_proj.weight"),
            (h, inter),
            0..h,
            part,
            precision,
        )?,
    }))
}

fn moe_shard(
    src: &dyn TensorSource,
    p: &str,
    h: usize,
    moe: &MoeConfig,
    precision: WeightPrecision,
    shard: TpShard,
) -> Result<MoeShard, ModelError> {
    let e = moe.n_routed_experts;
    let router = matrix(
        src,
        &format!("{p}.mlp.gate.weight"),
        (e, h),
        0..e,
        0..h,
        WeightPrecision::F32,
    )?;
    let correction_bias = if moe.correction_bias {
        Some(vector(
            src,
            &format!("{p}.mlp.gate.e_score_correction_bias"),
            e,
        )?)
    } else {
        None
    };
    let experts = (0..e)
        .map(|x| {
            mlp(
                src,
                &format!("{p}.mlp.experts.{x}"),
                h,
                moe.moe_intermediate_size,
                precision,
                shard,
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    let shared = if moe.n_shared_experts > 0 {
        mlp(
            src,
            &format!("{p}.mlp.shared_experts"),
            h,
            moe.moe_intermediate_size * moe.n_shared_experts,
            precision,
            shard,
        )?
    } else {
        None
    };
    Ok(MoeShard {
        router,
        correction_bias,
        experts,
        shared,
    })
}

fn attention(
    src: &dyn TensorSource,
    p: &str,
    cfg: &ModelConfig,
    mla: &MlaConfig,
    precision: WeightPrecision,
    shard: TpShard,
) -> Result<MlaAttention, ModelError> {
    let h = cfg.hidden_size;
    let heads = cfg.num_attention_heads;
    let local = heads / shard.size;
    let first = shard.rank * local;
    let (dn, dr, dv, r) = (
        mla.qk_nope_head_dim,
        mla.qk_rope_head_dim,
        mla.v_head_dim,
        mla.kv_lora_rank,
    );
    let qk = dn + dr;
    let q_rows = first * qk..(first + local) * qk;
    let (q_a, q) = match mla.q_lora_rank {
        Some(qr) => {
            let a = matrix(
                src,
                &format!("{p}.self_attn.q_a_proj.weight"),
                (qr, h),
                0..qr,
                0..h,
                precision,
            )?;
            let norm = vector(src, &format!("{p}.self_attn.q_a_layernorm.weight"), qr)?;
            let b = matrix(
                src,
                &format!("{p}.self_attn.q_b_proj.weight"),
                (heads * qk, qr),
                q_rows,
                0..qr,
                precision,
            )?;
            (Some((a, norm)), b)
        }
        None => (
            None,
            matrix(
                src,
                &format!("{p}.self_attn.q_proj.weight"),
                (heads * qk, h),
                q_rows,
                0..h,
                precision,
            )?,
        ),
    };
    let kv_a = matrix(
        src,
        &format!("{p}.self_attn.kv_a_proj_with_mqa.weight"),
        (r + dr, h),
        0..r + dr,
        0..h,
        precision,
    )?;
    let kv_a_norm = vector(src, &format!("{p}.self_attn.kv_a_layernorm.weight"), r)?;
    // kv_b_proj rows per head: [nope rows (W_UK), value rows (W_UV)], each over the latent.
    let per_head = dn + dv;
    let kv_b = matrix(
        src,
        &format!("{p}.self_attn.kv_b_proj.weight"),
        (heads * per_head, r),
        first * per_head..(first + local) * per_head,
        0..r,
        WeightPrecision::F32,
    )?
    .to_f32_vec();
    let mut w_uk_t = Vec::with_capacity(local);
    let mut w_uv = Vec::with_capacity(local);
    for hh in 0..local {
        let base = hh * per_head * r;
        let mut t = vec![0.0f32; r * dn];
        for j in 0..dn {
            for i in 0..r {
                t[i * dn + j] = kv_b[base + j * r + i];
            }
        }
        w_uk_t.push(WeightMatrix::from_f32(r, dn, t)?);
        let uv = kv_b[base + dn * r..base + per_head * r].to_vec();
        w_uv.push(WeightMatrix::from_f32(dv, r, uv)?);
    }
    let o_proj = matrix(
        src,
        &format!("{p}.self_attn.o_proj.weight"),
        (h, heads * dv),
        0..h,
        first * dv..(first + local) * dv,
        precision,
    )?;
    Ok(MlaAttention {
        q_a,
        q,
        kv_a,
        kv_a_norm,
        w_uk_t,
        w_uv,
        o_proj,
    })
}
