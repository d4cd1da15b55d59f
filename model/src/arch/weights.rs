//! Loading a decoder's weights from any [`TensorSource`] into kernel-ready matrices.

use dcpserve_kernels::WeightMatrix;

use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::tensors::{DType, RawTensor, TensorSource};

/// The precision weights are kept in: a loading policy, not an element type. It picks
/// each tensor's [`DType`] (`Auto` keeps quantized tensors as they are). The user's
/// `--dtype` (`dcpserve_config::DType`) spells the same choice; it is converted at the
/// engine boundary because this crate does not depend on the config crate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
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
    fn target(self, source: DType) -> DType {
        match self {
            WeightPrecision::F32 => DType::F32,
            WeightPrecision::BF16 => DType::BF16,
            WeightPrecision::Auto => match source {
                DType::F32 | DType::F16 | DType::BF16 => DType::BF16,
                quantized => quantized,
            },
        }
    }
}

/// Which tensor-parallel rank's slice of the weights to load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TpShard {
    pub rank: usize,
    pub size: usize,
}

impl TpShard {
    /// The whole model on one rank.
    pub fn single() -> Self {
        Self { rank: 0, size: 1 }
    }

    /// This rank's part of `total` items split as evenly as possible (the first
    /// `total % size` ranks get one more), so widths the rank count does not divide
    /// (MLP 1536 or vocabulary 49152 at tp=9) still split.
    pub fn split(&self, total: usize) -> std::ops::Range<usize> {
        split_range(total, self.size, self.rank)
    }
}

/// Part `idx` of `total` items split into `parts` nearly equal contiguous ranges.
pub fn split_range(total: usize, parts: usize, idx: usize) -> std::ops::Range<usize> {
    let base = total / parts;
    let extra = total % parts;
    let start = idx * base + idx.min(extra);
    let len = base + usize::from(idx < extra);
    start..start + len
}

/// How attention heads are laid out on one rank (vLLM's rules).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadLayout {
    /// Query heads on this rank (`num_attention_heads / tp`).
    pub q_heads: usize,
    /// First query head of this rank.
    pub q_start: usize,
    /// KV heads on this rank: split when tp ≤ KV heads, else one replicated head.
    pub kv_heads: usize,
    /// First KV head of this rank.
    pub kv_start: usize,
}

impl HeadLayout {
    pub fn new(cfg: &ModelConfig, shard: TpShard) -> Self {
        let (nq, nkv, tp) = (cfg.num_attention_heads, cfg.num_key_value_heads, shard.size);
        let q_heads = nq / tp;
        let (kv_heads, kv_start) = if tp <= nkv {
            (nkv / tp, shard.rank * (nkv / tp))
        } else {
            (1, shard.rank / (tp / nkv))
        };
        Self {
            q_heads,
            q_start: shard.rank * q_heads,
            kv_heads,
            kv_start,
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

fn shape_error(t: &RawTensor, expected: &[usize]) -> ModelError {
    ModelError::ShapeMismatch {
        path: std::path::PathBuf::new(),
        tensor: t.name.clone(),
        expected: expected.to_vec(),
        found: t.shape.clone(),
    }
}

/// The token embedding (whole on every rank) and this rank's vocabulary rows of the output
/// head: `None` on a single rank when the head is the embedding (tied, or no `lm_head`).
pub(super) fn embedding_and_head(
    cfg: &ModelConfig,
    src: &dyn TensorSource,
    precision: WeightPrecision,
    shard: TpShard,
) -> Result<(WeightMatrix, Option<WeightMatrix>), ModelError> {
    let h = cfg.hidden_size;
    let vocab = shard.split(cfg.vocab_size);
    let embed_tokens = matrix(
        src,
        "model.embed_tokens.weight",
        (cfg.vocab_size, h),
        0..cfg.vocab_size,
        0..h,
        precision,
    )?;
    let lm_head = if cfg.tie_word_embeddings || !src.contains("lm_head.weight") {
        if shard.size == 1 {
            None
        } else {
            Some(embed_tokens.slice_rows(vocab.start, vocab.end)?)
        }
    } else {
        Some(matrix(
            src,
            "lm_head.weight",
            (cfg.vocab_size, h),
            vocab,
            0..h,
            precision,
        )?)
    };
    Ok((embed_tokens, lm_head))
}

/// Loads `name` ([rows, cols]) and keeps rows `r` and columns `c` of it.
pub(super) fn matrix(
    src: &dyn TensorSource,
    name: &str,
    (rows, cols): (usize, usize),
    r: std::ops::Range<usize>,
    c: std::ops::Range<usize>,
    precision: WeightPrecision,
) -> Result<WeightMatrix, ModelError> {
    let t = src.get(name)?;
    if t.shape != [rows, cols] {
        return Err(shape_error(&t, &[rows, cols]));
    }
    let format = t.dtype;
    let full = WeightMatrix::from_bytes(format, rows, cols, t.data.clone(), t.offset, t.len)
        .map_err(|e| ModelError::Invalid(format!("tensor {name}: {e}")))?;
    let mut m = if r == (0..rows) {
        full
    } else {
        full.slice_rows(r.start, r.end)?
    };
    if c != (0..cols) {
        m = m.slice_cols(c.start, c.end)?;
    }
    let format = m.format();
    let target = precision.target(format);
    if target == format {
        Ok(m)
    } else {
        m.to_format(target)
            .map_err(|e| ModelError::Invalid(format!("tensor {name}: {e}")))
    }
}

pub(super) fn vector(
    src: &dyn TensorSource,
    name: &str,
    len: usize,
) -> Result<Vec<f32>, ModelError> {
    let t = src.get(name)?;
    if t.shape.iter().product::<usize>() != len || t.shape.len() != 1 {
        return Err(shape_error(&t, &[len]));
    }
    t.to_f32_vec()
}

fn vector_part(
    src: &dyn TensorSource,
    name: &str,
    len: usize,
    part: std::ops::Range<usize>,
) -> Result<Vec<f32>, ModelError> {
    Ok(vector(src, name, len)?[part].to_vec())
}

impl DecoderWeights {
    /// Reads and checks every tensor the architecture needs, keeping `shard`'s slice:
    /// query heads split; KV heads split or replicated; MLP column/row split; the
    /// embedding replicated and the output head split by vocabulary.
    pub fn load(
        cfg: &ModelConfig,
        src: &dyn TensorSource,
        precision: WeightPrecision,
        shard: TpShard,
    ) -> Result<Self, ModelError> {
        let h = cfg.hidden_size;
        let hd = cfg.head_dim;
        let q_dim = cfg.num_attention_heads * hd;
        let kv_dim = cfg.num_key_value_heads * hd;
        let inter = cfg.intermediate_size;
        let heads = HeadLayout::new(cfg, shard);
        let q_rows = heads.q_start * hd..(heads.q_start + heads.q_heads) * hd;
        let kv_rows = heads.kv_start * hd..(heads.kv_start + heads.kv_heads) * hd;
        let mlp = shard.split(inter);
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let bias = |name: &str,
                        len: usize,
                        part: &std::ops::Range<usize>|
             -> Result<Option<Vec<f32>>, ModelError> {
                if cfg.attention_bias {
                    Ok(Some(vector_part(
                        src,
                        &format!("{p}.self_attn.{name}.bias"),
                        len,
                        part.clone(),
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
                        hd,
                    )?))
                } else {
                    Ok(None)
                }
            };
            let all_h = 0..h;
            layers.push(LayerWeights {
                input_norm: vector(src, &format!("{p}.input_layernorm.weight"), h)?,
                q_proj: matrix(
                    src,
                    &format!("{p}.self_attn.q_proj.weight"),
                    (q_dim, h),
                    q_rows.clone(),
                    all_h.clone(),
                    precision,
                )?,
                k_proj: matrix(
                    src,
                    &format!("{p}.self_attn.k_proj.weight"),
                    (kv_dim, h),
                    kv_rows.clone(),
                    all_h.clone(),
                    precision,
                )?,
                v_proj: matrix(
                    src,
                    &format!("{p}.self_attn.v_proj.weight"),
                    (kv_dim, h),
                    kv_rows.clone(),
                    all_h.clone(),
                    precision,
                )?,
                o_proj: matrix(
                    src,
                    &format!("{p}.self_attn.o_proj.weight"),
                    (h, q_dim),
                    all_h.clone(),
                    q_rows.clone(),
                    precision,
                )?,
                q_bias: bias("q_proj", q_dim, &q_rows)?,
                k_bias: bias("k_proj", kv_dim, &kv_rows)?,
                v_bias: bias("v_proj", kv_dim, &kv_rows)?,
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
                    (inter, h),
                    mlp.clone(),
                    all_h.clone(),
                    precision,
                )?,
                up_proj: matrix(
                    src,
                    &format!("{p}.mlp.up_proj.weight"),
                    (inter, h),
                    mlp.clone(),
                    all_h.clone(),
                    precision,
                )?,
                down_proj: matrix(
                    src,
                    &format!("{p}.mlp.down_proj.weight"),
                    (h, inter),
                    all_h.clone(),
                    mlp.clone(),
                    precision,
                )?,
            });
        }
        let (embed_tokens, lm_head) = embedding_and_head(cfg, src, precision, shard)?;
        Ok(Self {
            embed_tokens,
            layers,
            norm: vector(src, "model.norm.weight", h)?,
            lm_head,
        })
    }

    /// This rank's output projection (the embedding, or its vocabulary slice, when tied).
    pub fn output_head(&self) -> &WeightMatrix {
        self.lm_head.as_ref().unwrap_or(&self.embed_tokens)
    }
}
