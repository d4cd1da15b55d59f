//! llama.cpp's `deepseek2` tensors that do not map one-to-one onto Hugging Face tensors:
//! experts stacked into one 3-D tensor per projection (`blk.N.ffn_{gate,up,down}_exps`),
//! and `kv_b_proj` split by newer converters into `attn_k_b` (per head, transposed) and
//! `attn_v_b` for weight absorption.
//!
//! Layouts (row-major, outermost first; GGUF lists the dimensions the other way round):
//! - `ffn_gate_exps` / `ffn_up_exps`: `[n_expert, moe_inter, hidden]`, `ffn_down_exps`:
//!   `[n_expert, hidden, moe_inter]` — expert `e` is the `e`-th contiguous slab, so it is
//!   served as a window into the file, quantized or not.
//! - `attn_k_b`: `[n_head, kv_lora_rank, qk_nope]` (each head's W_UK transposed),
//!   `attn_v_b`: `[n_head, v_head_dim, kv_lora_rank]`. Hugging Face's `kv_b_proj` is
//!   `[n_head · (qk_nope + v_head_dim), kv_lora_rank]` with each head's W_UK rows then its
//!   W_UV rows; it is rebuilt in f32 (the MLA loader keeps it in f32 anyway).

use super::*;

/// How a Hugging Face tensor name is served from a GGUF file.
#[derive(Debug, Clone)]
pub(super) enum Entry {
    /// One GGUF tensor as it is.
    Whole(String),
    /// Expert `index` of a stacked `[n_expert, rows, cols]` tensor.
    Expert { stacked: String, index: usize },
    /// `kv_b_proj` rebuilt from the split `attn_k_b` / `attn_v_b`.
    KvB { k_b: String, v_b: String },
}

/// The Hugging Face names a composite `deepseek2` tensor stands for; empty for names that are
/// not composite (those go through [`hf_name_for_gguf`](super::hf_name_for_gguf)).
/// `attn_v_b` yields nothing: it is read together with `attn_k_b`.
pub(super) fn composite_entries(info: &GgufTensorInfo) -> Option<Vec<(String, Entry)>> {
    let rest = info.name.strip_prefix("blk.")?;
    let (layer, part) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let p = format!("model.layers.{layer}");
    let proj = match part {
        "ffn_gate_exps.weight" => "gate_proj",
        "ffn_up_exps.weight" => "up_proj",
        "ffn_down_exps.weight" => "down_proj",
        "attn_k_b.weight" => {
            let entry = Entry::KvB {
                k_b: info.name.clone(),
                v_b: format!("blk.{layer}.attn_v_b.weight"),
            };
            return Some(vec![(format!("{p}.self_attn.kv_b_proj.weight"), entry)]);
        }
        "attn_v_b.weight" => return Some(Vec::new()),
        _ => return None,
    };
    // A 2-D "stack" would be a single expert's matrix: not what llama.cpp writes.
    // An empty stack holds no expert (its count could be anything, e.g. 2^62: found by the
    // gguf fuzzer, which made the loader allocate an entry per claimed expert).
    // Its expert count is bounded by the file's size only when its type is one the reader
    // checks the data of (an unsupported type, e.g. I16 claiming 2^21 experts in a 14 KB
    // file, was found by the gguf fuzzer); such a tensor stays under its GGUF name and
    // fails as an unsupported type if a model asks for it.
    info.dtype()?;
    let n_expert = match info.shape.as_slice() {
        [e, r, c] if *r > 0 && *c > 0 => *e,
        _ => return None,
    };
    Some(
        (0..n_expert)
            .map(|index| {
                let entry = Entry::Expert {
                    stacked: info.name.clone(),
                    index,
                };
                (format!("{p}.mlp.experts.{index}.{proj}.weight"), entry)
            })
            .collect(),
    )
}

/// Expert `index`'s `[rows, cols]` window of a stacked tensor.
pub(super) fn expert_window(stacked: RawTensor, index: usize, name: &str) -> RawTensor {
    let shape = stacked.shape[1..].to_vec();
    // Rows are whole blocks (the file was validated), so this cannot fail for a parsed tensor.
    let per_expert = stacked.dtype.storage_bytes(&shape).unwrap_or(0);
    RawTensor {
        name: name.to_string(),
        offset: stacked.offset + index * per_expert,
        len: per_expert,
        shape,
        ..stacked
    }
}

/// Hugging Face's `kv_b_proj` (f32) from llama.cpp's `attn_k_b` and `attn_v_b`.
pub(super) fn kv_b_from_split(
    path: &Path,
    k_b: &RawTensor,
    v_b: &RawTensor,
    name: &str,
) -> Result<RawTensor, ModelError> {
    let (&[heads, rank, nope], &[v_heads, v_dim, v_rank]) =
        (k_b.shape.as_slice(), v_b.shape.as_slice())
    else {
        return Err(ModelError::corrupt(
            path,
            format!(
                "attn_k_b {:?} and attn_v_b {:?} should both be [n_head, _, _]",
                k_b.shape, v_b.shape
            ),
        ));
    };
    // With every dimension non-zero the sizes below are those of the tensors' real data;
    // a zero one would let a lying header claim any number of heads over no data.
    if [heads, rank, nope, v_dim].contains(&0) {
        return Err(ModelError::corrupt(
            path,
            format!(
                "attn_k_b {:?} and attn_v_b {:?} have an empty dimension",
                k_b.shape, v_b.shape
            ),
        ));
    }
    if (v_heads, v_rank) != (heads, rank) {
        return Err(ModelError::corrupt(
            path,
            format!(
                "attn_k_b {:?} and attn_v_b {:?} disagree on heads or kv_lora_rank",
                k_b.shape, v_b.shape
            ),
        ));
    }
    let k = k_b.to_f32_vec()?;
    let v = v_b.to_f32_vec()?;
    let per_head = nope + v_dim;
    let mut out = vec![0f32; heads * per_head * rank];
    for h in 0..heads {
        let dst = &mut out[h * per_head * rank..(h + 1) * per_head * rank];
        // W_UK rows: row j of head h is column j of attn_k_b[h] ([rank, nope]).
        for r in 0..rank {
            for j in 0..nope {
                dst[j * rank + r] = k[(h * rank + r) * nope + j];
            }
        }
        // W_UV rows are stored as they are.
        dst[nope * rank..].copy_from_slice(&v[h * v_dim * rank..(h + 1) * v_dim * rank]);
    }
    let bytes: Vec<u8> = out.iter().flat_map(|x| x.to_le_bytes()).collect();
    let len = bytes.len();
    Ok(RawTensor {
        name: name.to_string(),
        dtype: DType::F32,
        shape: vec![heads * per_head, rank],
        data: Arc::new(bytes),
        offset: 0,
        len,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(shape: Vec<usize>, ggml_type: u32) -> GgufTensorInfo {
        GgufTensorInfo {
            name: "blk.1.ffn_gate_exps.weight".into(),
            shape,
            ggml_type,
            offset: 0,
        }
    }

    #[test]
    fn stacked_experts_of_a_checked_type_are_split() {
        // F32 (type 0): its data was checked against the file, so its count is real.
        let e = composite_entries(&info(vec![3, 16, 32], 0)).unwrap();
        assert_eq!(e.len(), 3);
        assert_eq!(e[2].0, "model.layers.1.mlp.experts.2.gate_proj.weight");
    }

    #[test]
    fn an_unsupported_type_claims_no_experts() {
        // I16 (type 25) with 2^21 "experts": the gguf fuzzer's input (an entry each).
        assert!(composite_entries(&info(vec![2_294_020, 16, 32], 25)).is_none());
    }
}
