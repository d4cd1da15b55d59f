//! Re-quantizing a GGUF file to another type or llama.cpp-style mix
//! (`dcpserve quantize IN.gguf OUT.gguf --type Q4_K_M`).
//!
//! Every matrix (a tensor of two or more dimensions) is decoded to f32 and encoded
//! again; 1-D tensors (norms, biases) are copied unchanged. The type of each matrix:
//!
//! * a plain type (`Q8_0`, `Q5_0`, `Q4_K`, `Q6_K`, `IQ4_XS`, …): every matrix;
//! * `Q4_K_M` / `Q5_K_M` (llama.cpp's rules, simplified): base `Q4_K` / `Q5_K`;
//!   `attn_v` and `ffn_down` get `Q6_K` in the layers llama.cpp gives more bits (the
//!   first and last eighth of the layers and every third one between); the output
//!   head (or the token embedding when the head is tied to it) gets `Q6_K`;
//! * `Q4_K_S` / `Q5_K_S`: the base type everywhere but the output head (`Q6_K`).
//!
//! A matrix whose rows are not whole 256-element super-blocks cannot hold a K-quant
//! or IQ4_XS; it falls back as llama.cpp's does: Q2_K/Q3_K/IQ4_XS → IQ4_NL,
//! Q4_K → Q5_0, Q5_K → Q5_1, Q6_K → Q8_0 (SmolLM2-135M's hidden size 576 is such a
//! case: in its Q4_K_M file only `ffn_down`, 1536 columns, is a K-quant).

use super::*;
use dcpserve_kernels::quantize;

/// What `dcpserve quantize --type` asks for: one type for every matrix, or a mix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantTarget {
    /// Every matrix in this type (with the K-quant fallbacks).
    Plain(DType),
    /// llama.cpp's `*_K_M` mix on this base type (Q4_K or Q5_K).
    Medium(DType),
    /// llama.cpp's `*_K_S` mix on this base type (Q4_K or Q5_K).
    Small(DType),
}

impl std::str::FromStr for QuantTarget {
    type Err = String;

    /// ```
    /// use dcpserve_model::gguf::QuantTarget;
    /// use dcpserve_model::DType;
    /// assert_eq!("Q4_K_M".parse(), Ok(QuantTarget::Medium(DType::Q4_K)));
    /// assert_eq!("q6_k".parse(), Ok(QuantTarget::Plain(DType::Q6_K)));
    /// assert!("Q1_X".parse::<QuantTarget>().is_err());
    /// ```
    fn from_str(s: &str) -> Result<Self, String> {
        let up = s.trim().to_ascii_uppercase();
        let plain = |name: &str| {
            (0..40)
                .find(|&id| ggml_type_name(id) == name)
                .and_then(dtype_from_ggml)
        };
        let target = match up.as_str() {
            "Q4_K_M" => QuantTarget::Medium(DType::Q4_K),
            "Q5_K_M" => QuantTarget::Medium(DType::Q5_K),
            "Q4_K_S" => QuantTarget::Small(DType::Q4_K),
            "Q5_K_S" => QuantTarget::Small(DType::Q5_K),
            "Q8_K" => {
                return Err(
                    "Q8_K is an activation format: llama.cpp cannot use Q8_K weights".into(),
                )
            }
            name => match plain(name) {
                Some(d) => QuantTarget::Plain(d),
                None => {
                    return Err(format!(
                        "unknown quantization type `{s}` (expected Q4_K_M, Q5_K_M, Q4_K_S, Q5_K_S, \
                         or one of F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, \
                         Q5_K, Q6_K, IQ4_NL, IQ4_XS)"
                    ))
                }
            },
        };
        Ok(target)
    }
}

impl QuantTarget {
    /// llama.cpp's `general.file_type` value for this target, when it has one.
    fn file_type(self) -> Option<u32> {
        Some(match self {
            QuantTarget::Plain(d) => match d {
                DType::F32 => 0,
                DType::F16 => 1,
                DType::Q4_0 => 2,
                DType::Q4_1 => 3,
                DType::Q8_0 => 7,
                DType::Q5_0 => 8,
                DType::Q5_1 => 9,
                DType::Q2_K => 10,
                DType::Q6_K => 18,
                DType::IQ4_NL => 25,
                DType::IQ4_XS => 30,
                DType::BF16 => 32,
                _ => return None,
            },
            QuantTarget::Medium(DType::Q4_K) => 15,
            QuantTarget::Medium(_) => 17,
            QuantTarget::Small(DType::Q4_K) => 14,
            QuantTarget::Small(_) => 16,
        })
    }

    /// The type of the matrix `name` (llama.cpp name) with rows of `cols` elements, in
    /// layer `layer` of `n_layers`; `tied_head` says the token embedding is the head.
    pub fn type_for(
        self,
        name: &str,
        cols: usize,
        layer: Option<usize>,
        n_layers: usize,
        tied_head: bool,
    ) -> DType {
        let is_head = name == "output.weight" || (tied_head && name == "token_embd.weight");
        let wanted = match self {
            QuantTarget::Plain(d) => d,
            QuantTarget::Small(base) => {
                if is_head {
                    DType::Q6_K
                } else {
                    base
                }
            }
            QuantTarget::Medium(base) => {
                let more_bits = layer.is_some_and(|i| {
                    // llama.cpp's `use_more_bits`.
                    i < n_layers / 8 || i >= 7 * n_layers / 8 || (i - n_layers / 8) % 3 == 2
                });
                let bumped = name.ends_with("attn_v.weight") || name.ends_with("ffn_down.weight");
                if is_head || (bumped && more_bits) {
                    DType::Q6_K
                } else {
                    base
                }
            }
        };
        fallback_for_cols(wanted, cols)
    }
}

/// llama.cpp's replacement when rows are not whole super-blocks of `wanted` (F16 when
/// no quantized type fits).
fn fallback_for_cols(wanted: DType, cols: usize) -> DType {
    let fits = |d: DType| cols.is_multiple_of(d.block_elems());
    if fits(wanted) {
        return wanted;
    }
    let alt = match wanted {
        DType::Q2_K | DType::Q3_K | DType::IQ4_XS => DType::IQ4_NL,
        DType::Q4_K => DType::Q5_0,
        DType::Q5_K => DType::Q5_1,
        DType::Q6_K => DType::Q8_0,
        _ => DType::F16,
    };
    if fits(alt) {
        alt
    } else {
        DType::F16
    }
}

/// What [`quantize_gguf`] did: one line per tensor type, for the log.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QuantReport {
    /// (type, number of tensors, bytes) per output type, sorted by type name.
    pub by_type: Vec<(DType, usize, usize)>,
}

/// Re-encodes `src` for `target`; returns the new file's bytes and a summary.
///
/// Errors: a matrix whose stored type the engine cannot decode.
pub fn quantize_gguf(
    src: &GgufFile,
    target: QuantTarget,
) -> Result<(Vec<u8>, QuantReport), ModelError> {
    let infos = src.tensor_infos();
    let layer_of = |name: &str| -> Option<usize> {
        name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
    };
    let n_layers = infos
        .iter()
        .filter_map(|t| layer_of(&t.name))
        .max()
        .map_or(0, |m| m + 1);
    let tied_head = !infos.iter().any(|t| t.name == "output.weight");
    let mut tensors = Vec::with_capacity(infos.len());
    let mut counts: HashMap<DType, (usize, usize)> = HashMap::new();
    for info in infos {
        let raw = src.tensor(&info.name)?;
        let (ggml_type, data, dtype) = if raw.shape.len() < 2 {
            (info.ggml_type, raw.bytes().to_vec(), raw.dtype)
        } else {
            let cols = *raw.shape.last().unwrap_or(&1);
            let dtype =
                target.type_for(&info.name, cols, layer_of(&info.name), n_layers, tied_head);
            let data = if dtype == raw.dtype {
                raw.bytes().to_vec()
            } else {
                let values = raw.to_f32_vec()?;
                let mut data = Vec::with_capacity(dtype.bytes_for(values.len()));
                quantize(dtype, &values, &mut data).map_err(|e| {
                    ModelError::corrupt(src.path(), format!("quantizing {:?}: {e}", info.name))
                })?;
                data
            };
            (ggml_from_dtype(dtype), data, dtype)
        };
        let c = counts.entry(dtype).or_default();
        c.0 += 1;
        c.1 += data.len();
        tensors.push(GgufTensorSpec {
            name: info.name.clone(),
            ggml_type,
            shape: raw.shape.clone(),
            data,
        });
    }
    let mut metadata: Vec<(String, GgufValue)> = src
        .metadata()
        .iter()
        .filter(|(k, _)| k != "general.file_type")
        .cloned()
        .collect();
    if let Some(ft) = target.file_type() {
        metadata.push(("general.file_type".into(), GgufValue::U32(ft)));
    }
    let mut by_type: Vec<(DType, usize, usize)> =
        counts.into_iter().map(|(d, (n, b))| (d, n, b)).collect();
    by_type.sort_by_key(|(d, _, _)| d.to_string());
    Ok((encode_gguf(&metadata, &tensors), QuantReport { by_type }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mix_rules_and_fallbacks() {
        let q4km = QuantTarget::Medium(DType::Q4_K);
        // 30 layers: more bits in 0..3, 26..30 and every third layer from 3 (5, 8, …).
        let down = |i| q4km.type_for("blk.x.ffn_down.weight", 1536, Some(i), 30, true);
        let bumped: Vec<usize> = (0..30).filter(|&i| down(i) == DType::Q6_K).collect();
        assert_eq!(bumped, [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 26, 27, 28, 29]);
        assert_eq!(down(3), DType::Q4_K);
        // 576 columns are not whole super-blocks: llama.cpp's fallbacks.
        let q = |t: QuantTarget, name: &str, layer| t.type_for(name, 576, Some(layer), 30, true);
        assert_eq!(q(q4km, "blk.3.attn_q.weight", 3), DType::Q5_0);
        assert_eq!(q(q4km, "blk.0.attn_v.weight", 0), DType::Q8_0);
        assert_eq!(
            q(QuantTarget::Medium(DType::Q5_K), "blk.3.attn_q.weight", 3),
            DType::Q5_1
        );
        assert_eq!(
            q(QuantTarget::Plain(DType::IQ4_XS), "blk.3.attn_q.weight", 3),
            DType::IQ4_NL
        );
        assert_eq!(
            q(QuantTarget::Plain(DType::Q2_K), "blk.3.attn_q.weight", 3),
            DType::IQ4_NL
        );
        // The tied embedding is the head: Q6_K, falling back to Q8_0.
        assert_eq!(
            q4km.type_for("token_embd.weight", 576, None, 30, true),
            DType::Q8_0
        );
        assert_eq!(
            q4km.type_for("token_embd.weight", 512, None, 30, true),
            DType::Q6_K
        );
        assert_eq!(
            q4km.type_for("token_embd.weight", 512, None, 30, false),
            DType::Q4_K
        );
        let q4ks = QuantTarget::Small(DType::Q4_K);
        assert_eq!(
            q4ks.type_for("output.weight", 512, None, 30, false),
            DType::Q6_K
        );
        assert_eq!(
            q4ks.type_for("blk.0.ffn_down.weight", 512, Some(0), 30, false),
            DType::Q4_K
        );
        // Nothing quantized fits 100 columns.
        assert_eq!(
            QuantTarget::Plain(DType::Q8_0).type_for("w", 100, None, 1, true),
            DType::F16
        );
        assert!("Q8_K"
            .parse::<QuantTarget>()
            .unwrap_err()
            .contains("activation"));
        assert_eq!("iq4_xs".parse(), Ok(QuantTarget::Plain(DType::IQ4_XS)));
    }

    #[test]
    fn requantized_file_reads_back() {
        // Two layers of a 512-wide matrix plus a norm, re-quantized to Q4_K_M.
        let values: Vec<f32> = (0..2 * 512)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 500.0)
            .collect();
        let f32_bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let tensors: Vec<GgufTensorSpec> = (0..2)
            .map(|i| GgufTensorSpec {
                name: format!("blk.{i}.ffn_down.weight"),
                ggml_type: 0,
                shape: vec![2, 512],
                data: f32_bytes(&values),
            })
            .chain(std::iter::once(GgufTensorSpec {
                name: "output_norm.weight".into(),
                ggml_type: 0,
                shape: vec![512],
                data: f32_bytes(&values[..512]),
            }))
            .collect();
        let src = GgufFile::from_bytes("in.gguf", Arc::new(encode_gguf(&[], &tensors))).unwrap();
        let (bytes, report) = quantize_gguf(&src, "Q4_K_M".parse().unwrap()).unwrap();
        let out = GgufFile::from_bytes("out.gguf", Arc::new(bytes)).unwrap();
        assert_eq!(out.get("general.file_type"), Some(&GgufValue::U32(15)));
        let types: Vec<u32> = out.tensor_infos().iter().map(|t| t.ggml_type).collect();
        // Of 2 layers only the last gets more bits (7·2/8 = 1); the norm stays f32.
        assert_eq!(types, [12, 14, 0]);
        assert_eq!(
            report.by_type,
            [
                (DType::F32, 1, 2048),
                (DType::Q4_K, 1, 2 * 288),
                (DType::Q6_K, 1, 2 * 420)
            ]
        );
        let back = out
            .tensor("blk.1.ffn_down.weight")
            .unwrap()
            .to_f32_vec()
            .unwrap();
        let err = back
            .iter()
            .zip(&values)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(err < 0.004, "{err}");
        assert_eq!(
            out.tensor("output_norm.weight")
                .unwrap()
                .to_f32_vec()
                .unwrap(),
            values[..512]
        );
    }
}
