//! Mixture-of-experts weights in the fused layout of transformers 5, served under the
//! per-expert names of the published DeepSeek-V3 / Kimi K2 checkpoints.
//!
//! transformers 5 keeps each MoE layer's routed experts as two 3-D parameters (and
//! `save_pretrained(..., save_original_format=False)` writes them so):
//! - `….mlp.experts.gate_up_proj` `[n_expert, 2·moe_inter, hidden]`: expert `e`'s
//!   `gate_proj` rows, then its `up_proj` rows (`gate, up = linear(x, w[e]).chunk(2)`);
//! - `….mlp.experts.down_proj` `[n_expert, hidden, moe_inter]`.
//!
//! Every per-expert matrix is a contiguous window of the fused tensor, so each becomes an
//! entry of its own (`….mlp.experts.{e}.{gate,up,down}_proj.weight`) pointing into the
//! same mapping: nothing is copied, and the rest of the loader only sees per-expert names.

use std::collections::HashMap;
use std::path::Path;

use super::{Entry, Shard};
use crate::error::ModelError;

/// Name suffix of the fused gate and up projections.
const GATE_UP: &str = ".mlp.experts.gate_up_proj";
/// Name suffix of the fused down projections.
const DOWN: &str = ".mlp.experts.down_proj";

/// Replaces every fused expert tensor in `entries` by per-expert entries. A checkpoint that
/// holds both forms for the same expert, or a fused tensor of the wrong shape, is an error
/// naming the shard and the tensor.
pub(super) fn split_fused_experts(
    shards: &[Shard],
    entries: &mut HashMap<String, Entry>,
) -> Result<(), ModelError> {
    let mut fused: Vec<String> = entries
        .keys()
        .filter(|n| n.ends_with(GATE_UP) || n.ends_with(DOWN))
        .cloned()
        .collect();
    fused.sort();
    for name in fused {
        let Some(entry) = entries.remove(&name) else {
            continue;
        };
        let path = shards.get(entry.shard).map_or(Path::new(""), |s| &s.path);
        let (experts_prefix, projections): (&str, &[&str]) =
            match name.strip_suffix(".gate_up_proj") {
                Some(p) => (p, &["gate_proj", "up_proj"]),
                None => (
                    name.strip_suffix(".down_proj").unwrap_or(&name),
                    &["down_proj"],
                ),
            };
        for (key, value) in per_expert_entries(path, &name, &entry, experts_prefix, projections)? {
            if entries.contains_key(&key) {
                return Err(ModelError::corrupt(
                    path,
                    format!("{key:?} is stored both on its own and inside the fused {name:?}"),
                ));
            }
            entries.insert(key, value);
        }
    }
    Ok(())
}

/// The windows of one fused tensor `[n_expert, rows, cols]`: each expert's slab split into
/// `projections.len()` equal row blocks, named `{experts_prefix}.{e}.{projection}.weight`.
fn per_expert_entries(
    path: &Path,
    name: &str,
    entry: &Entry,
    experts_prefix: &str,
    projections: &[&str],
) -> Result<Vec<(String, Entry)>, ModelError> {
    let bad = |reason: String| {
        ModelError::corrupt(path, format!("fused expert tensor {name:?} {reason}"))
    };
    let &[n_expert, rows, cols] = entry.shape.as_slice() else {
        return Err(bad(format!(
            "has shape {:?}, expected [n_expert, rows, cols]",
            entry.shape
        )));
    };
    let parts = projections.len();
    if !rows.is_multiple_of(parts) {
        return Err(bad(format!(
            "has {rows} rows per expert, not {parts} equal projections"
        )));
    }
    let bits = entry.dtype.bitsize();
    if !bits.is_multiple_of(8) {
        return Err(ModelError::UnsupportedTensorType {
            path: path.to_path_buf(),
            tensor: name.to_string(),
            dtype: format!("{:?}", entry.dtype),
        });
    }
    let part_rows = rows / parts;
    let part_len = part_rows
        .checked_mul(cols)
        .and_then(|n| n.checked_mul(bits / 8))
        .ok_or_else(|| bad("is implausibly large".into()))?;
    if n_expert.checked_mul(parts * part_len) != Some(entry.len) {
        return Err(bad(format!(
            "holds {} bytes, not {n_expert} experts of {parts}×{part_len}",
            entry.len
        )));
    }
    let mut out = Vec::with_capacity(n_expert * parts);
    for e in 0..n_expert {
        for (j, projection) in projections.iter().enumerate() {
            out.push((
                format!("{experts_prefix}.{e}.{projection}.weight"),
                Entry {
                    shard: entry.shard,
                    dtype: entry.dtype,
                    shape: vec![part_rows, cols],
                    offset: entry.offset + (e * parts + j) * part_len,
                    len: part_len,
                },
            ));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use safetensors::Dtype;
    use std::sync::Arc;

    fn shards() -> Vec<Shard> {
        vec![Shard {
            path: "model.safetensors".into(),
            data: Arc::new(Vec::<u8>::new()),
        }]
    }

    fn entry(shape: &[usize], dtype: Dtype) -> Entry {
        let bytes = dtype.bitsize() / 8;
        Entry {
            shard: 0,
            dtype,
            shape: shape.to_vec(),
            offset: 100,
            len: shape.iter().product::<usize>() * bytes,
        }
    }

    #[test]
    fn splits_gate_up_and_down_into_per_expert_windows() {
        let p = "model.layers.1.mlp.experts";
        let mut entries = HashMap::from([
            (format!("{p}.gate_up_proj"), entry(&[3, 8, 5], Dtype::BF16)),
            (format!("{p}.down_proj"), entry(&[3, 5, 4], Dtype::BF16)),
        ]);
        split_fused_experts(&shards(), &mut entries).unwrap();
        assert_eq!(entries.len(), 9);
        let at = |n: &str| {
            let e = &entries[&format!("{p}.{n}.weight")];
            (e.shape.clone(), e.offset, e.len)
        };
        // Expert 2's gate starts after two experts of 8×5 bf16; its up rows follow.
        assert_eq!(at("2.gate_proj"), (vec![4, 5], 100 + 2 * 80, 40));
        assert_eq!(at("2.up_proj"), (vec![4, 5], 100 + 2 * 80 + 40, 40));
        assert_eq!(at("1.down_proj"), (vec![5, 4], 100 + 40, 40));
    }

    #[test]
    fn fused_and_per_expert_together_or_bad_shapes_are_errors() {
        let p = "model.layers.1.mlp.experts";
        let mut both = HashMap::from([
            (format!("{p}.down_proj"), entry(&[2, 5, 4], Dtype::F32)),
            (
                format!("{p}.1.down_proj.weight"),
                entry(&[5, 4], Dtype::F32),
            ),
        ]);
        let e = split_fused_experts(&shards(), &mut both).unwrap_err();
        assert!(e.to_string().contains("both"), "{e}");
        for bad in [
            entry(&[2, 7, 4], Dtype::F32), // odd gate+up rows
            entry(&[14, 4], Dtype::F32),   // not 3-D
        ] {
            let mut m = HashMap::from([(format!("{p}.gate_up_proj"), bad)]);
            let e = split_fused_experts(&shards(), &mut m).unwrap_err();
            assert!(e.to_string().contains("gate_up_proj"), "{e}");
        }
    }
}
