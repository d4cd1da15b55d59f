//! An MLA model's weights placed on the rank's backend: matrices in their
//! [`DType`](dcpserve_kernels::DType), norms and the router's correction bias as f32
//! buffers (the device form of [`MlaWeights`] and [`MtpLayer`]).

use dcpserve_kernels::{Backend, CpuBackend};

use super::mtp::MtpLayer;
use super::weights::{FeedForward, MlaAttention, MlaLayer, MlaWeights, MlpShard, MoeShard};
use crate::arch::device_weights::DeviceWeights;
use crate::error::ModelError;

/// A SiLU-gated MLP's slice on the backend.
pub struct DeviceMlp<B: Backend = CpuBackend> {
    pub gate: B::Matrix,
    pub up: B::Matrix,
    pub down: B::Matrix,
}

/// One layer's attention weights on the backend (see [`MlaAttention`]).
pub struct DeviceMlaAttention<B: Backend = CpuBackend> {
    /// `q_a_proj` and `q_a_layernorm`, when queries are low-rank.
    pub q_a: Option<(B::Matrix, B::Buffer)>,
    pub q: B::Matrix,
    pub kv_a: B::Matrix,
    pub kv_a_norm: B::Buffer,
    /// Per local head, W_UKᵀ `[kv_lora_rank, nope]`.
    pub w_uk_t: Vec<B::Matrix>,
    /// Per local head, W_UV `[v_head_dim, kv_lora_rank]`.
    pub w_uv: Vec<B::Matrix>,
    pub o_proj: B::Matrix,
}

/// Routed + shared experts of one layer on the backend (see [`MoeShard`]).
pub struct DeviceMoe<B: Backend = CpuBackend> {
    pub router: B::Matrix,
    pub correction_bias: Option<B::Buffer>,
    pub experts: Vec<Option<DeviceMlp<B>>>,
    pub shared: Option<DeviceMlp<B>>,
}

/// The MLP of one layer.
pub enum DeviceFeedForward<B: Backend = CpuBackend> {
    /// A dense MLP (`None` when this rank got no columns of it).
    Dense(Option<DeviceMlp<B>>),
    Moe(DeviceMoe<B>),
}

/// One decoder layer on the backend.
pub struct DeviceMlaLayer<B: Backend = CpuBackend> {
    pub input_norm: B::Buffer,
    pub post_attention_norm: B::Buffer,
    pub attn: DeviceMlaAttention<B>,
    pub ffn: DeviceFeedForward<B>,
}

/// All weights of this rank on the backend.
pub type DeviceMlaWeights<B = CpuBackend> = DeviceWeights<B, DeviceMlaLayer<B>>;

/// The multi-token-prediction layer on the backend (see [`MtpLayer`]).
pub struct DeviceMtp<B: Backend = CpuBackend> {
    pub enorm: B::Buffer,
    pub hnorm: B::Buffer,
    pub eh_proj: B::Matrix,
    pub layer: DeviceMlaLayer<B>,
    pub head_norm: B::Buffer,
    pub head: Option<B::Matrix>,
    pub embed_tokens: Option<B::Matrix>,
}

fn mlp<B: Backend>(dev: &B, m: &MlpShard) -> Result<DeviceMlp<B>, ModelError> {
    Ok(DeviceMlp {
        gate: dev.upload_matrix(&m.gate)?,
        up: dev.upload_matrix(&m.up)?,
        down: dev.upload_matrix(&m.down)?,
    })
}

fn opt_mlp<B: Backend>(dev: &B, m: &Option<MlpShard>) -> Result<Option<DeviceMlp<B>>, ModelError> {
    m.as_ref().map(|m| mlp(dev, m)).transpose()
}

fn attention<B: Backend>(dev: &B, a: &MlaAttention) -> Result<DeviceMlaAttention<B>, ModelError> {
    let matrices = |ms: &[dcpserve_kernels::WeightMatrix]| {
        ms.iter()
            .map(|m| dev.upload_matrix(m))
            .collect::<Result<Vec<_>, _>>()
    };
    Ok(DeviceMlaAttention {
        q_a: match &a.q_a {
            Some((m, norm)) => Some((dev.upload_matrix(m)?, dev.upload(norm)?)),
            None => None,
        },
        q: dev.upload_matrix(&a.q)?,
        kv_a: dev.upload_matrix(&a.kv_a)?,
        kv_a_norm: dev.upload(&a.kv_a_norm)?,
        w_uk_t: matrices(&a.w_uk_t)?,
        w_uv: matrices(&a.w_uv)?,
        o_proj: dev.upload_matrix(&a.o_proj)?,
    })
}

fn moe<B: Backend>(dev: &B, m: &MoeShard) -> Result<DeviceMoe<B>, ModelError> {
    Ok(DeviceMoe {
        router: dev.upload_matrix(&m.router)?,
        correction_bias: m
            .correction_bias
            .as_deref()
            .map(|b| dev.upload(b))
            .transpose()?,
        experts: m
            .experts
            .iter()
            .map(|e| opt_mlp(dev, e))
            .collect::<Result<_, _>>()?,
        shared: opt_mlp(dev, &m.shared)?,
    })
}

impl<B: Backend> DeviceMlaLayer<B> {
    /// Places `l` on `dev` (on the CPU the matrices share the host storage).
    pub fn upload(dev: &B, l: &MlaLayer) -> Result<Self, ModelError> {
        Ok(Self {
            input_norm: dev.upload(&l.input_norm)?,
            post_attention_norm: dev.upload(&l.post_attention_norm)?,
            attn: attention(dev, &l.attn)?,
            ffn: match &l.ffn {
                FeedForward::Dense(m) => DeviceFeedForward::Dense(opt_mlp(dev, m)?),
                FeedForward::Moe(m) => DeviceFeedForward::Moe(moe(dev, m)?),
            },
        })
    }
}

impl<B: Backend> DeviceWeights<B, DeviceMlaLayer<B>> {
    /// Places `w` on `dev`.
    pub fn upload(dev: &B, w: &MlaWeights) -> Result<Self, ModelError> {
        let parts = (&w.embed_tokens, &w.norm[..], w.lm_head.as_ref());
        Self::upload_parts(dev, parts, &w.layers, DeviceMlaLayer::upload)
    }
}

impl<B: Backend> DeviceMtp<B> {
    /// Places `m` on `dev`.
    pub fn upload(dev: &B, m: &MtpLayer) -> Result<Self, ModelError> {
        let opt = |w: &Option<dcpserve_kernels::WeightMatrix>| {
            w.as_ref().map(|w| dev.upload_matrix(w)).transpose()
        };
        Ok(Self {
            enorm: dev.upload(&m.enorm)?,
            hnorm: dev.upload(&m.hnorm)?,
            eh_proj: dev.upload_matrix(&m.eh_proj)?,
            layer: DeviceMlaLayer::upload(dev, &m.layer)?,
            head_norm: dev.upload(&m.head_norm)?,
            head: opt(&m.head)?,
            embed_tokens: opt(&m.embed_tokens)?,
        })
    }
}
