//! A dense decoder's weights placed on the rank's backend: matrices in their
//! [`DType`](dcpserve_kernels::DType), norms and biases as f32 buffers.

use dcpserve_kernels::{Backend, CpuBackend, WeightMatrix};

use super::weights::{DecoderWeights, LayerWeights};
use crate::error::ModelError;

/// One decoder layer's weights on the backend.
pub struct DeviceLayer<B: Backend = CpuBackend> {
    pub input_norm: B::Buffer,
    pub q_proj: B::Matrix,
    pub k_proj: B::Matrix,
    pub v_proj: B::Matrix,
    pub o_proj: B::Matrix,
    pub q_bias: Option<B::Buffer>,
    pub k_bias: Option<B::Buffer>,
    pub v_bias: Option<B::Buffer>,
    pub q_norm: Option<B::Buffer>,
    pub k_norm: Option<B::Buffer>,
    pub post_attention_norm: B::Buffer,
    pub gate_proj: B::Matrix,
    pub up_proj: B::Matrix,
    pub down_proj: B::Matrix,
}

/// A decoder's weights on the backend, whatever its layers `L` (dense [`DeviceLayer`]s
/// here, MLA layers in [`mla`](super::mla)); see [`DecoderWeights`] for the host form.
pub struct DeviceWeights<B: Backend = CpuBackend, L = DeviceLayer<B>> {
    pub embed_tokens: B::Matrix,
    pub layers: Vec<L>,
    pub norm: B::Buffer,
    /// This rank's vocabulary slice of the output head (`None`: tied to the embedding).
    pub lm_head: Option<B::Matrix>,
}

fn opt<B: Backend>(dev: &B, v: &Option<Vec<f32>>) -> Result<Option<B::Buffer>, ModelError> {
    v.as_deref()
        .map(|v| dev.upload(v))
        .transpose()
        .map_err(Into::into)
}

impl<B: Backend> DeviceLayer<B> {
    fn upload(dev: &B, l: &LayerWeights) -> Result<Self, ModelError> {
        Ok(Self {
            input_norm: dev.upload(&l.input_norm)?,
            q_proj: dev.upload_matrix(&l.q_proj)?,
            k_proj: dev.upload_matrix(&l.k_proj)?,
            v_proj: dev.upload_matrix(&l.v_proj)?,
            o_proj: dev.upload_matrix(&l.o_proj)?,
            q_bias: opt(dev, &l.q_bias)?,
            k_bias: opt(dev, &l.k_bias)?,
            v_bias: opt(dev, &l.v_bias)?,
            q_norm: opt(dev, &l.q_norm)?,
            k_norm: opt(dev, &l.k_norm)?,
            post_attention_norm: dev.upload(&l.post_attention_norm)?,
            gate_proj: dev.upload_matrix(&l.gate_proj)?,
            up_proj: dev.upload_matrix(&l.up_proj)?,
            down_proj: dev.upload_matrix(&l.down_proj)?,
        })
    }
}

impl<B: Backend, L> DeviceWeights<B, L> {
    /// Places the parts every decoder has on `dev`, each host layer through `layer`.
    pub(crate) fn upload_parts<H>(
        dev: &B,
        (embed_tokens, norm, lm_head): (&WeightMatrix, &[f32], Option<&WeightMatrix>),
        layers: &[H],
        layer: impl Fn(&B, &H) -> Result<L, ModelError>,
    ) -> Result<Self, ModelError> {
        Ok(Self {
            embed_tokens: dev.upload_matrix(embed_tokens)?,
            layers: layers
                .iter()
                .map(|l| layer(dev, l))
                .collect::<Result<_, _>>()?,
            norm: dev.upload(norm)?,
            lm_head: lm_head.map(|m| dev.upload_matrix(m)).transpose()?,
        })
    }

    /// This rank's output projection (the embedding, or its vocabulary slice, when tied).
    pub fn output_head(&self) -> &B::Matrix {
        self.lm_head.as_ref().unwrap_or(&self.embed_tokens)
    }
}

impl<B: Backend> DeviceWeights<B> {
    /// Places `w` on `dev` (on the CPU the matrices share the host storage).
    pub fn upload(dev: &B, w: &DecoderWeights) -> Result<Self, ModelError> {
        let parts = (&w.embed_tokens, &w.norm[..], w.lm_head.as_ref());
        Self::upload_parts(dev, parts, &w.layers, DeviceLayer::upload)
    }
}
