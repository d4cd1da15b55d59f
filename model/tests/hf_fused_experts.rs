//! Mixture-of-experts weights as transformers 5 stores them (`mlp.experts.gate_up_proj`
//! `[experts, 2·inter, hidden]`, `mlp.experts.down_proj` `[experts, hidden, inter]`) load as
//! the per-expert layout of the published DeepSeek-V3 / Kimi K2 checkpoints.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use dcpserve_model::config::Architecture;
use dcpserve_model::ModelFiles;
use safetensors::tensor::TensorView;
use safetensors::{serialize_to_file, Dtype, SafeTensors};
use serde_json::json;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures")
        .join(name)
}

/// Every tensor of a safetensors file: name → (dtype, shape, bytes).
fn read_all(path: &Path) -> BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(n, v)| (n, (v.dtype(), v.shape().to_vec(), v.data().to_vec())))
        .collect()
}

fn write(path: &Path, tensors: &BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)>) {
    let views: Vec<(String, TensorView)> = tensors
        .iter()
        .map(|(n, (d, s, b))| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    serialize_to_file(views, None, path).unwrap();
}

/// A folder with tiny-deepseek's config and tokenizer files (and no weights yet).
fn folder_like_tiny_deepseek(name: &str) -> PathBuf {
    let dir = common::temp_dir(name);
    for f in [
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        std::fs::copy(fixture("tiny-deepseek").join(f), dir.join(f)).unwrap();
    }
    dir
}

/// tiny-deepseek's per-expert weights rewritten in transformers 5's fused layout.
fn fused_copy() -> BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)> {
    let mut tensors = read_all(&fixture("tiny-deepseek").join("model.safetensors"));
    for layer in 1..3 {
        let p = format!("model.layers.{layer}.mlp.experts");
        let (mut gate_up, mut down) = (Vec::new(), Vec::new());
        let mut e = 0;
        while let Some((dtype, shape, gate)) = tensors.remove(&format!("{p}.{e}.gate_proj.weight"))
        {
            let (_, _, up) = tensors.remove(&format!("{p}.{e}.up_proj.weight")).unwrap();
            let (_, down_shape, d) = tensors
                .remove(&format!("{p}.{e}.down_proj.weight"))
                .unwrap();
            gate_up.extend(gate);
            gate_up.extend(up);
            down.extend(d);
            e += 1;
            if e == 8 {
                let gu_shape = vec![e, 2 * shape[0], shape[1]];
                tensors.insert(format!("{p}.gate_up_proj"), (dtype, gu_shape, gate_up));
                let d_shape = vec![e, down_shape[0], down_shape[1]];
                tensors.insert(format!("{p}.down_proj"), (dtype, d_shape, down));
                break;
            }
        }
        assert_eq!(e, 8, "tiny-deepseek has 8 experts in layer {layer}");
    }
    tensors
}

/// The fused copy, written as two shards with an index (gate/up and down of a layer in
/// different files), serves exactly the per-expert fixture's tensors.
#[test]
fn fused_copy_serves_the_per_expert_tensors() {
    let dir = folder_like_tiny_deepseek("fused-sharded");
    let fused = fused_copy();
    assert!(fused.contains_key("model.layers.2.mlp.experts.gate_up_proj"));
    let (mut first, mut second) = (BTreeMap::new(), BTreeMap::new());
    let mut weight_map = HashMap::new();
    for (name, t) in fused {
        let shard = if name.ends_with("down_proj") {
            second.insert(name.clone(), t);
            "model-00002-of-00002.safetensors"
        } else {
            first.insert(name.clone(), t);
            "model-00001-of-00002.safetensors"
        };
        weight_map.insert(name, shard);
    }
    write(&dir.join("model-00001-of-00002.safetensors"), &first);
    write(&dir.join("model-00002-of-00002.safetensors"), &second);
    let index = json!({"metadata": {}, "weight_map": weight_map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();

    let ours = ModelFiles::open(&dir).unwrap();
    let theirs = ModelFiles::open(fixture("tiny-deepseek")).unwrap();
    let names = theirs.tensors.names();
    assert_eq!(ours.tensors.names(), names);
    assert!(names.contains(&"model.layers.2.mlp.experts.7.up_proj.weight".to_string()));
    for name in names {
        let (a, b) = (
            ours.tensors.get(&name).unwrap(),
            theirs.tensors.get(&name).unwrap(),
        );
        assert_eq!((a.dtype, &a.shape), (b.dtype, &b.shape), "{name}");
        assert!(a.bytes() == b.bytes(), "{name}: different bytes");
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// One expert stored both inside the fused tensor and on its own is refused, as is a fused
/// tensor whose gate+up rows cannot be halved.
#[test]
fn ambiguous_or_malformed_fused_experts_are_errors() {
    let dir = folder_like_tiny_deepseek("fused-bad");
    let mut both = fused_copy();
    let extra = both["model.layers.1.mlp.experts.down_proj"].clone();
    let (_, shape, bytes) = extra;
    let one = (
        Dtype::F32,
        shape[1..].to_vec(),
        bytes[..bytes.len() / 8].to_vec(),
    );
    both.insert("model.layers.1.mlp.experts.3.down_proj.weight".into(), one);
    write(&dir.join("model.safetensors"), &both);
    let e = ModelFiles::open(&dir).unwrap_err().to_string();
    assert!(
        e.contains("experts.3.down_proj") && e.contains("both") && e.contains("model.safetensors"),
        "{e}"
    );

    let mut odd = fused_copy();
    let gu = odd
        .get_mut("model.layers.1.mlp.experts.gate_up_proj")
        .unwrap();
    gu.1 = vec![16, 31, 64]; // 31 rows per expert: no gate/up halves
    gu.2.truncate(16 * 31 * 64 * 4);
    write(&dir.join("model.safetensors"), &odd);
    let e = ModelFiles::open(&dir).unwrap_err().to_string();
    assert!(e.contains("gate_up_proj") && e.contains("31"), "{e}");
    let _ = std::fs::remove_dir_all(dir);
}

/// fixtures/tiny-deepseek-fused is what transformers 5.23.0 writes natively (made by
/// scripts/make_references.py): fused experts, `rope_parameters` only, `"architectures":
/// null`. It loads as DeepSeek-V3 with its YaRN settings (its logprobs are checked against
/// transformers in tests/mla_models.rs).
#[test]
fn transformers5_native_fixture_loads() {
    let dir = fixture("tiny-deepseek-fused");
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    assert!(config["architectures"].is_null(), "{config}");
    assert!(config.get("rope_theta").is_none() && config.get("rope_scaling").is_none());
    let stored = read_all(&dir.join("model.safetensors"));
    assert_eq!(
        stored["model.layers.1.mlp.experts.gate_up_proj"].1,
        [8, 64, 64]
    );
    assert_eq!(
        stored["model.layers.1.mlp.experts.down_proj"].1,
        [8, 64, 32]
    );

    let files = ModelFiles::open(&dir).unwrap();
    let c = &files.config;
    assert_eq!(c.architecture, Architecture::DeepseekV3);
    assert_eq!(c.rope_theta, 50000.0);
    let yarn = c.mla.as_ref().unwrap().yarn.as_ref().unwrap();
    assert_eq!(
        (yarn.factor, yarn.original_max_position_embeddings),
        (4.0, 1024)
    );
    // Expert 5's up rows are the second half of its fused slab.
    let up = files
        .tensors
        .get("model.layers.1.mlp.experts.5.up_proj.weight")
        .unwrap();
    let (_, _, fused) = &stored["model.layers.1.mlp.experts.gate_up_proj"];
    let slab = 64 * 64 * 2;
    assert_eq!(up.shape, [32, 64]);
    assert!(up.bytes() == &fused[5 * slab + slab / 2..6 * slab]);
}
