//! Unit tests of the `deepseek2` GGUF naming, composite tensors and metadata.
use super::*;
use crate::config::MoeScoring;
use crate::gguf_config::config_from_gguf;

fn f32_bytes(v: impl IntoIterator<Item = f32>) -> Vec<u8> {
    v.into_iter().flat_map(f32::to_le_bytes).collect()
}

fn spec(name: &str, ggml_type: u32, shape: Vec<usize>, data: Vec<u8>) -> GgufTensorSpec {
    GgufTensorSpec {
        name: name.into(),
        ggml_type,
        shape,
        data,
    }
}

fn source(tensors: &[GgufTensorSpec]) -> GgufTensorSource {
    let bytes = encode_gguf(&[], tensors);
    GgufTensorSource::new(Arc::new(
        GgufFile::from_bytes("mem.gguf", Arc::new(bytes)).unwrap(),
    ))
    .unwrap()
}

#[test]
fn maps_deepseek2_names() {
    let cases = [
        (
            "blk.0.attn_q_a.weight",
            "model.layers.0.self_attn.q_a_proj.weight",
        ),
        (
            "blk.0.attn_q_a_norm.weight",
            "model.layers.0.self_attn.q_a_layernorm.weight",
        ),
        (
            "blk.0.attn_q_b.weight",
            "model.layers.0.self_attn.q_b_proj.weight",
        ),
        (
            "blk.2.attn_kv_a_mqa.weight",
            "model.layers.2.self_attn.kv_a_proj_with_mqa.weight",
        ),
        (
            "blk.2.attn_kv_a_norm.weight",
            "model.layers.2.self_attn.kv_a_layernorm.weight",
        ),
        (
            "blk.2.attn_kv_b.weight",
            "model.layers.2.self_attn.kv_b_proj.weight",
        ),
        (
            "blk.5.ffn_gate_inp.weight",
            "model.layers.5.mlp.gate.weight",
        ),
        (
            "blk.5.exp_probs_b.bias",
            "model.layers.5.mlp.gate.e_score_correction_bias",
        ),
        (
            "blk.5.ffn_up_shexp.weight",
            "model.layers.5.mlp.shared_experts.up_proj.weight",
        ),
        (
            "blk.5.ffn_down_shexp.weight",
            "model.layers.5.mlp.shared_experts.down_proj.weight",
        ),
    ];
    for (g, hf) in cases {
        assert_eq!(hf_name_for_gguf(g).as_deref(), Some(hf), "{g}");
    }
    assert_eq!(hf_name_for_gguf("blk.x.exp_probs_b.bias"), None);
}

/// Expert e of `ffn_*_exps` ([n_expert, rows, cols]) is its e-th slab, f32 or quantized.
#[test]
fn serves_each_expert_of_a_stacked_tensor() {
    let gate: Vec<f32> = (0..3 * 2 * 4).map(|i| i as f32).collect();
    // Q8_0: per expert one row of one block (f16 scale 1.0, then 32 i8 values = expert id).
    let mut down = Vec::new();
    for e in 0..2u8 {
        down.extend(half::f16::from_f32(1.0).to_le_bytes());
        down.extend([e + 1; 32]);
    }
    let src = source(&[
        spec(
            "blk.1.ffn_gate_exps.weight",
            0,
            vec![3, 2, 4],
            f32_bytes(gate),
        ),
        spec("blk.1.ffn_down_exps.weight", 8, vec![2, 1, 32], down),
    ]);
    for e in 0..3 {
        let t = src
            .get(&format!("model.layers.1.mlp.experts.{e}.gate_proj.weight"))
            .unwrap();
        assert_eq!(t.shape, vec![2, 4]);
        let want: Vec<f32> = (e * 8..e * 8 + 8).map(|i| i as f32).collect();
        assert_eq!(t.to_f32_vec().unwrap(), want, "expert {e}");
    }
    assert!(!src.contains("model.layers.1.mlp.experts.3.gate_proj.weight"));
    let t = src
        .get("model.layers.1.mlp.experts.1.down_proj.weight")
        .unwrap();
    assert_eq!((t.dtype, t.shape.clone()), (DType::Q8_0, vec![1, 32]));
    assert_eq!(t.to_f32_vec().unwrap(), vec![2.0; 32]);
}

/// kv_b_proj rebuilt from the converter's split: `attn_k_b[h] = W_UK[h]ᵀ` ([rank, nope]) and
/// `attn_v_b[h] = W_UV[h]` ([v_dim, rank]); kv_b_proj stacks W_UK[h] then W_UV[h] per head.
#[test]
fn rebuilds_kv_b_from_split_k_b_and_v_b() {
    let (heads, rank, nope, v_dim) = (2, 3, 2, 1);
    let k_b = |h: usize, r: usize, j: usize| (100 * h + 10 * r + j) as f32;
    let v_b = |h: usize, i: usize, r: usize| (1000 + 100 * h + 10 * i + r) as f32;
    let mut kd = Vec::new();
    for h in 0..heads {
        for r in 0..rank {
            kd.extend((0..nope).map(|j| k_b(h, r, j)));
        }
    }
    let mut vd = Vec::new();
    for h in 0..heads {
        for i in 0..v_dim {
            vd.extend((0..rank).map(|r| v_b(h, i, r)));
        }
    }
    let src = source(&[
        spec(
            "blk.0.attn_k_b.weight",
            0,
            vec![heads, rank, nope],
            f32_bytes(kd),
        ),
        spec(
            "blk.0.attn_v_b.weight",
            0,
            vec![heads, v_dim, rank],
            f32_bytes(vd),
        ),
    ]);
    let t = src
        .get("model.layers.0.self_attn.kv_b_proj.weight")
        .unwrap();
    assert_eq!(t.shape, vec![heads * (nope + v_dim), rank]);
    let mut want = Vec::new();
    for h in 0..heads {
        for j in 0..nope {
            want.extend((0..rank).map(|r| k_b(h, r, j)));
        }
        for i in 0..v_dim {
            want.extend((0..rank).map(|r| v_b(h, i, r)));
        }
    }
    assert_eq!(t.to_f32_vec().unwrap(), want);
}

/// A deepseek2 header: 4 heads, kv_lora 32, nope 16, rope 8, v 16, 4 experts in 2 groups.
fn deepseek2_meta(extra: &[(&str, GgufValue)]) -> Vec<(String, GgufValue)> {
    let mut m: Vec<(String, GgufValue)> = vec![
        (
            "general.architecture".into(),
            GgufValue::String("deepseek2".into()),
        ),
        (
            "tokenizer.ggml.tokens".into(),
            GgufValue::Array(vec![GgufValue::String("a".into()); 8]),
        ),
    ];
    let u = |v: u32| GgufValue::U32(v);
    for (k, v) in [
        ("block_count", u(3)),
        ("embedding_length", u(64)),
        ("feed_forward_length", u(96)),
        ("attention.head_count", u(4)),
        ("attention.head_count_kv", u(1)),
        ("attention.kv_lora_rank", u(32)),
        ("rope.dimension_count", u(8)),
        ("expert_count", u(4)),
        ("expert_used_count", u(2)),
        ("expert_feed_forward_length", u(32)),
        ("leading_dense_block_count", u(1)),
        ("expert_group_count", u(2)),
        ("expert_group_used_count", u(1)),
        ("attention.layer_norm_rms_epsilon", GgufValue::F32(1e-6)),
    ] {
        m.push((format!("deepseek2.{k}"), v));
    }
    // Later entries replace earlier ones (a GGUF may not repeat a key).
    for (k, v) in extra {
        let k = format!("deepseek2.{k}");
        m.retain(|(have, _)| *have != k);
        m.push((k, v.clone()));
    }
    m
}

fn config_of(meta: &[(String, GgufValue)]) -> Result<crate::ModelConfig, ModelError> {
    let bytes = encode_gguf(meta, &[]);
    config_from_gguf(&GgufFile::from_bytes("ds.gguf", Arc::new(bytes)).unwrap())
}

/// Older files: head sizes in key_length / value_length, no gating key (llama.cpp then uses
/// softmax), YaRN without yarn_log_multiplier (ggml's own 1 + 0.1·ln f cos/sin factor).
#[test]
fn reads_legacy_deepseek2_metadata_with_llama_cpp_defaults() {
    let c = config_of(&deepseek2_meta(&[
        ("attention.key_length", GgufValue::U32(24)),
        ("attention.value_length", GgufValue::U32(16)),
        ("rope.scaling.type", GgufValue::String("yarn".into())),
        ("rope.scaling.factor", GgufValue::F32(4.0)),
        ("rope.scaling.original_context_length", GgufValue::U32(512)),
    ]))
    .unwrap();
    let mla = c.mla.unwrap();
    assert_eq!(
        (mla.qk_nope_head_dim, mla.v_head_dim, mla.q_lora_rank),
        (16, 16, None)
    );
    assert!(mla.rope_interleave);
    let y = mla.yarn.unwrap();
    assert_eq!((y.factor, y.original_max_position_embeddings), (4.0, 512));
    assert_eq!((y.mscale, y.mscale_all_dim), (None, Some(1.0)));
    assert!((y.attention_factor.unwrap() - (1.0 + 0.1 * 4f32.ln())).abs() < 1e-6);
    let moe = c.moe.unwrap();
    assert_eq!(moe.scoring, MoeScoring::Softmax);
    assert!(!moe.norm_topk_prob && !moe.correction_bias && moe.group_limited);
    assert_eq!((moe.routed_scaling_factor, moe.n_shared_experts), (1.0, 0));
    assert_eq!((c.num_key_value_heads, c.head_dim), (4, 8));
    assert_eq!(c.rope_scaling, None);
}

/// Newer files: the `_mla` lengths win over the MQA view's key_length (kv_lora + rope).
#[test]
fn reads_current_deepseek2_metadata() {
    let c = config_of(&deepseek2_meta(&[
        ("attention.key_length", GgufValue::U32(40)),
        ("attention.value_length", GgufValue::U32(32)),
        ("attention.key_length_mla", GgufValue::U32(24)),
        ("attention.value_length_mla", GgufValue::U32(16)),
        ("attention.q_lora_rank", GgufValue::U32(24)),
        ("expert_gating_func", GgufValue::U32(2)),
        ("expert_weights_norm", GgufValue::Bool(true)),
        ("expert_weights_scale", GgufValue::F32(2.5)),
        ("expert_shared_count", GgufValue::U32(1)),
        ("rope.scaling.type", GgufValue::String("yarn".into())),
        ("rope.scaling.factor", GgufValue::F32(40.0)),
        ("rope.scaling.original_context_length", GgufValue::U32(4096)),
        ("rope.scaling.yarn_log_multiplier", GgufValue::F32(0.1)),
    ]))
    .unwrap();
    let mla = c.mla.unwrap();
    assert_eq!(
        (mla.qk_nope_head_dim, mla.v_head_dim, mla.q_lora_rank),
        (16, 16, Some(24))
    );
    let y = mla.yarn.unwrap();
    assert_eq!(
        (y.mscale, y.mscale_all_dim, y.attention_factor),
        (Some(1.0), Some(1.0), None)
    );
    let moe = c.moe.unwrap();
    assert_eq!(moe.scoring, MoeScoring::Sigmoid);
    assert!(moe.norm_topk_prob);
    assert_eq!((moe.routed_scaling_factor, moe.n_shared_experts), (2.5, 1));
}

#[test]
fn rejects_deepseek2_settings_it_cannot_run() {
    let base = [
        ("attention.key_length", GgufValue::U32(24)),
        ("attention.value_length", GgufValue::U32(16)),
    ];
    let with = |extra: &[(&str, GgufValue)]| {
        let mut all = base.to_vec();
        all.extend_from_slice(extra);
        config_of(&deepseek2_meta(&all))
    };
    assert!(with(&[]).is_ok());
    for bad in [
        ("expert_gating_func", GgufValue::U32(3)),
        ("rope.scaling.type", GgufValue::String("linear".into())),
        ("rope.dimension_count", GgufValue::U32(24)),
    ] {
        assert!(
            with(std::slice::from_ref(&bad)).is_err(),
            "{bad:?} accepted"
        );
    }
    let yarn = |k: &str, v: f32| {
        with(&[
            ("rope.scaling.type", GgufValue::String("yarn".into())),
            ("rope.scaling.factor", GgufValue::F32(4.0)),
            ("rope.scaling.original_context_length", GgufValue::U32(512)),
            (k, GgufValue::F32(v)),
        ])
    };
    assert!(yarn("rope.scaling.attn_factor", 1.0).is_ok());
    assert!(yarn("rope.scaling.attn_factor", 2.0).is_err());
}

/// A split with an empty dimension holds no data whatever its head count claims: refused
/// (it once looped over 2⁴⁰ claimed heads).
#[test]
fn a_split_with_an_empty_dimension_is_refused() {
    let heads = 1usize << 40;
    let src = source(&[
        spec("blk.0.attn_k_b.weight", 0, vec![heads, 0, 2], Vec::new()),
        spec("blk.0.attn_v_b.weight", 0, vec![heads, 1, 0], Vec::new()),
    ]);
    let e = src
        .get("model.layers.0.self_attn.kv_b_proj.weight")
        .unwrap_err();
    assert!(e.to_string().contains("empty dimension"), "{e}");
}
