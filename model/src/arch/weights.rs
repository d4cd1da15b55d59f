//! Loading a decoder's weights from any [`TensorSource`] into kernel-ready matrices.

use dcpserve_kernels::{WeightFormat, WeightMatrix};

use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::tensors::{RawTensor, TensorDType, TensorSource};

/// The precision weights are kept in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WeightPrecision {
    /// Floating-point checkpoints in bf16, quantized ones as they are.
    #[default]
    Auto,
    /// Everything dequantized to f32 (reference precision).
    F32,
    /// Everything in bf16.
    BF16,
}

impl WeightPrecision {
    fn target(self, source: WeightFormat) -> WeightFormat {
        match self {
            WeightPrecision::F32 => WeightFormat::F32,
            WeightPrecision::BF16 => WeightFormat::BF16,
            WeightPrecision::Auto => match source {
                WeightFormat::F32 | WeightFormat::F16 | WeightFormat::BF16 => WeightFormat::BF16,
                quantized => quantized,
            },
        }
    }
}

/// Weights of one decoder layer.
pub struct LayerWeights {
    pub input_norm: Vec<f32>,
    pub q_proj: WeightMatrix,
    pub k_proj: WeightMatrix,
    pub v_proj: WeightMatrix,
    pub o_proj: WeightMatrix,
    pub q_bias: Option<Vec<f32>>,
    pub k_bias: Option<Vec<f32>>,
    pub v_bias: Option<Vec<f32>>,
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    pub post_attention_norm: Vec<f32>,
    pub gate_proj: WeightMatrix,
    pub up_proj: WeightMatrix,
    pub down_proj: WeightMatrix,
}

/// All weights of a decoder-only model.
pub struct DecoderWeights {
    pub embed_tokens: WeightMatrix,
    pub layers: Vec<LayerWeights>,
    pub norm: Vec<f32>,
    /// `None` when the output head is tied to the embedding.
    pub lm_head: Option<WeightMatrix>,
}

pub(crate) fn weight_format(dtype: TensorDType) -> WeightFormat {
    match dtype {
        TensorDType::F32 => WeightFormat::F32,
        TensorDType::F16 => WeightFormat::F16,
        TensorDType::BF16 => WeightFormat::BF16,
        TensorDType::Q8_0 => WeightFormat::Q8_0,
        TensorDType::Q4_0 => WeightFormat::Q4_0,
        TensorDType::Q4_1 => WeightFormat::Q4_1,
    }
}

fn shape_error(t: &RawTensor, expected: &[usize]) -> ModelError {
    ModelError::ShapeMismatch {
        path: std::path::PathBuf::new(),
        tensor: t.name.clone(),
        expected: expected.to_vec(),
        found: t.shape.clone(),
    }
}

fn matrix(
    src: &dyn TensorSource,
    name: &str,
    rows: usize,
    cols: usize,
    precision: WeightPrecision,
) -> Result<WeightMatrix, ModelError> {
    let t = src.get(name)?;
    if t.shape != [rows, cols] {
        return Err(shape_error(&t, &[rows, cols]));
    }
    let format = weight_format(t.dtype);
    let m = WeightMatrix::from_bytes(format, rows, cols, t.data.clone(), t.offset, t.len)
        .map_err(|e| ModelError::Invalid(format!("tensor {name}: {e}")))?;
    let target = precision.target(format);
    if target == format {
        Ok(m)
    } else {
        m.to_format(target)
            .map_err(|e| ModelError::Invalid(format!("tensor {name}: {e}")))
    }
}

fn vector(src: &dyn TensorSource, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
    let t = src.get(name)?;
    if t.shape.iter().product::<usize>() != len || t.shape.len() != 1 {
        return Err(shape_error(&t, &[len]));
    }
    t.to_f32_vec()
}

impl DecoderWeights {
    /// Reads and checks every tensor the architecture needs.
    pub fn load(
        cfg: &ModelConfig,
        src: &dyn TensorSource,
        precision: WeightPrecision,
    ) -> Result<Self, ModelError> {
        let h = cfg.hidden_size;
        let q_dim = cfg.num_attention_heads * cfg.head_dim;
        let kv_dim = cfg.num_key_value_heads * cfg.head_dim;
        let inter = cfg.intermediate_size;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let bias = |name: &str, len: usize| -> Result<Option<Vec<f32>>, ModelError> {
                if cfg.attention_bias {
                    Ok(Some(vector(
                        src,
                        &format!("{p}.self_attn.{name}.bias"),
                        len,
                    )?))
                } else {
                    Ok(None)
                }
            };
            let qk_norm = |name: &str| -> Result<Option<Vec<f32>>, ModelError> {
                if cfg.qk_norm {
                    Ok(Some(vector(
                        src,
                        &format!("{p}.self_attn.{name}.weight"),
                        cfg.head_dim,
                    )?))
                } else {
                    Ok(None)
                }
            };
            layers.push(LayerWeights {
                input_norm: vector(src, &format!("{p}.input_layernorm.weight"), h)?,
                q_proj: matrix(
                    src,
                    &format!("{p}.self_attn.q_proj.weight"),
                    q_dim,
                    h,
                    precision,
                )?,
                k_proj: matrix(
                    src,
                    &format!("{p}.self_attn.k_proj.weight"),
                    kv_dim,
                    h,
                    precision,
                )?,
                v_proj: matrix(
                    src,
                    &format!("{p}.self_attn.v_proj.weight"),
                    kv_dim,
                    h,
                    precision,
                )?,
                o_proj: matrix(
                    src,
                    &format!("{p}.self_attn.o_proj.weight"),
                    h,
                    q_dim,
                    precision,
                )?,
                q_bias: bias("q_proj", q_dim)?,
                k_bias: bias("k_proj", kv_dim)?,
                v_bias: bias("v_proj", kv_dim)?,
                q_norm: qk_norm("q_norm")?,
                k_norm: qk_norm("k_norm")?,
                post_attention_norm: vector(
                    src,
                    &format!("{p}.post_attention_layernorm.weight"),
                    h,
                )?,
                gate_proj: matrix(
                    src,
                    &format!("{p}.mlp.gate_proj.weight"),
                    inter,
                    h,
                    precision,
                )?,
                up_proj: matrix(src, &format!("{p}.mlp.up_proj.weight"), inter, h, precision)?,
                down_proj: matrix(
                    src,
                    &format!("{p}.mlp.down_proj.weight"),
                    h,
                    inter,
                    precision,
                )?,
            });
        }
        let embed_tokens = matrix(
            src,
            "model.embed_tokens.weight",
            cfg.vocab_size,
            h,
            precision,
        )?;
        let lm_head = if cfg.tie_word_embeddings || !src.contains("lm_head.weight") {
            None
        } else {
            Some(matrix(src, "lm_head.weight", cfg.vocab_size, h, precision)?)
        };
        Ok(Self {
            embed_tokens,
            layers,
            norm: vector(src, "model.norm.weight", h)?,
            lm_head,
        })
    }

    /// The output projection (the embedding when tied).
    pub fn output_head(&self) -> &WeightMatrix {
        self.lm_head.as_ref().unwrap_or(&self.embed_tokens)
    }
}
