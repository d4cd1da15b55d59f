//! Unit tests.
use super::writer::encode_value;
use super::*;

#[test]
fn maps_llama_cpp_names() {
    let cases = [
        ("token_embd.weight", "model.embed_tokens.weight"),
        ("output_norm.weight", "model.norm.weight"),
        ("output.weight", "lm_head.weight"),
        (
            "blk.3.attn_norm.weight",
            "model.layers.3.input_layernorm.weight",
        ),
        (
            "blk.12.attn_q.bias",
            "model.layers.12.self_attn.q_proj.bias",
        ),
        (
            "blk.0.attn_output.weight",
            "model.layers.0.self_attn.o_proj.weight",
        ),
        (
            "blk.0.attn_k_norm.weight",
            "model.layers.0.self_attn.k_norm.weight",
        ),
        (
            "blk.0.ffn_norm.weight",
            "model.layers.0.post_attention_layernorm.weight",
        ),
        (
            "blk.1.ffn_down.weight",
            "model.layers.1.mlp.down_proj.weight",
        ),
    ];
    for (g, hf) in cases {
        assert_eq!(hf_name_for_gguf(g).as_deref(), Some(hf), "{g}");
    }
    assert_eq!(hf_name_for_gguf("rope_freqs.weight"), None);
    assert_eq!(hf_name_for_gguf("blk.x.attn_q.weight"), None);
}

#[test]
fn round_trips_all_value_types() {
    let meta: Vec<(String, GgufValue)> = vec![
        ("a.u8".into(), GgufValue::U8(7)),
        ("a.i8".into(), GgufValue::I8(-7)),
        ("a.u16".into(), GgufValue::U16(700)),
        ("a.i16".into(), GgufValue::I16(-700)),
        ("a.u32".into(), GgufValue::U32(70000)),
        ("a.i32".into(), GgufValue::I32(-70000)),
        ("a.f32".into(), GgufValue::F32(1.5)),
        ("a.bool".into(), GgufValue::Bool(true)),
        ("a.str".into(), GgufValue::String("héllo".into())),
        ("a.u64".into(), GgufValue::U64(1 << 40)),
        ("a.i64".into(), GgufValue::I64(-(1 << 40))),
        ("a.f64".into(), GgufValue::F64(0.25)),
        (
            "a.nested".into(),
            GgufValue::Array(vec![
                GgufValue::Array(vec![GgufValue::I32(1), GgufValue::I32(2)]),
                GgufValue::Array(vec![]),
            ]),
        ),
        ("general.alignment".into(), GgufValue::U32(64)),
    ];
    let tensors = vec![
        GgufTensorSpec {
            name: "blk.0.attn_q.weight".into(),
            ggml_type: 0,
            shape: vec![2, 3],
            data: (0..6).flat_map(|i| (i as f32).to_le_bytes()).collect(),
        },
        GgufTensorSpec {
            name: "odd.weight".into(),
            ggml_type: 16, // IQ2_XXS: not supported
            shape: vec![1, 256],
            data: vec![0; 144],
        },
    ];
    let bytes = encode_gguf(&meta, &tensors);
    let f = GgufFile::from_bytes("mem.gguf", Arc::new(bytes)).unwrap();
    assert_eq!(f.alignment(), 64);
    assert_eq!(f.data_offset() % 64, 0);
    for (k, v) in &meta {
        assert_eq!(f.get(k), Some(v), "{k}");
    }
    let src = GgufTensorSource::new(Arc::new(f)).unwrap();
    let t = src.get("model.layers.0.self_attn.q_proj.weight").unwrap();
    assert_eq!(t.shape, vec![2, 3]);
    assert_eq!(t.to_f32_vec().unwrap(), vec![0., 1., 2., 3., 4., 5.]);
    let err = src.get("odd.weight").unwrap_err().to_string();
    assert!(
        err.contains("IQ2_XXS") && err.contains("odd.weight"),
        "{err}"
    );
    assert!(matches!(
        src.get("nope"),
        Err(ModelError::MissingTensor { .. })
    ));
}

#[test]
fn rejects_big_endian_and_bad_versions() {
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_be_bytes());
    b.extend([0u8; 16]);
    let e = GgufFile::from_bytes("be.gguf", Arc::new(b))
        .unwrap_err()
        .to_string();
    assert!(e.contains("big-endian") && e.contains("be.gguf"), "{e}");
    let mut b = b"GGUF".to_vec();
    b.extend(1u32.to_le_bytes());
    b.extend([0u8; 16]);
    let e = GgufFile::from_bytes("v1.gguf", Arc::new(b))
        .unwrap_err()
        .to_string();
    assert!(e.contains("version 1"), "{e}");
}

#[test]
fn huge_counts_fail_without_allocating() {
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend(0u64.to_le_bytes());
    b.extend(1u64.to_le_bytes());
    encode_value(&mut b, &GgufValue::String("k".into()));
    b.extend(9u32.to_le_bytes());
    b.extend(8u32.to_le_bytes());
    b.extend(u64::MAX.to_le_bytes());
    let e = GgufFile::from_bytes("big.gguf", Arc::new(b)).unwrap_err();
    // Refused by the array length limit (MAX_ARRAY_LEN) before any allocation.
    assert!(matches!(e, ModelError::Corrupt { .. }), "{e}");
}

#[test]
fn deep_nesting_is_rejected() {
    let mut v = GgufValue::Array(vec![GgufValue::U8(1)]);
    for _ in 0..20 {
        v = GgufValue::Array(vec![v]);
    }
    let bytes = encode_gguf(&[("deep".into(), v)], &[]);
    let e = GgufFile::from_bytes("deep.gguf", Arc::new(bytes)).unwrap_err();
    assert!(e.to_string().contains("nests arrays"), "{e}");
}

#[test]
fn k_quant_and_5_bit_types_load() {
    for dtype in DType::EXTRA_QUANTS {
        let id = ggml_from_dtype(dtype);
        assert_eq!(dtype_from_ggml(id), Some(dtype));
        assert_eq!(ggml_type_name(id), dtype.to_string());
    }
    // One Q4_K block: d = 1, dmin = 0, every 6-bit scale 1, codes 0..16 repeating.
    let mut block = half::f16::from_f32(1.0).to_le_bytes().to_vec();
    block.extend(half::f16::from_f32(0.0).to_le_bytes());
    block.extend([1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1]);
    block.extend((0..128).map(|i| (i % 16) as u8 | (((i % 16) as u8) << 4)));
    let tensors = vec![GgufTensorSpec {
        name: "blk.0.ffn_down.weight".into(),
        ggml_type: 12,
        shape: vec![1, 256],
        data: block,
    }];
    let f = GgufFile::from_bytes("q4k.gguf", Arc::new(encode_gguf(&[], &tensors))).unwrap();
    let t = GgufTensorSource::new(Arc::new(f))
        .unwrap()
        .get("model.layers.0.mlp.down_proj.weight")
        .unwrap();
    assert_eq!(t.dtype, DType::Q4_K);
    let v = t.to_f32_vec().unwrap();
    assert_eq!(v.len(), 256);
    assert!(v
        .iter()
        .enumerate()
        .all(|(i, &x)| x == ((i % 32) % 16) as f32));
}

/// A header (magic, version 3, counts) followed by `rest`.
fn header(n_tensors: u64, n_kv: u64, rest: &[u8]) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend(n_tensors.to_le_bytes());
    b.extend(n_kv.to_le_bytes());
    b.extend(rest);
    b
}

#[test]
fn counts_and_lengths_past_the_stated_limits_are_refused() {
    let open = |b: Vec<u8>| {
        GgufFile::from_bytes("x.gguf", Arc::new(b))
            .unwrap_err()
            .to_string()
    };
    // Past the limits even when the file were large enough (here it is padded to be).
    let pad = vec![0u8; 64];
    let e = open(header(MAX_TENSORS + 1, 0, &pad));
    assert!(
        e.contains("at most") && e.contains(&MAX_TENSORS.to_string()),
        "{e}"
    );
    let e = open(header(0, MAX_METADATA_ENTRIES + 1, &pad));
    assert!(e.contains(&MAX_METADATA_ENTRIES.to_string()), "{e}");

    // One metadata entry: key "k", then a string value longer than allowed.
    let mut kv = Vec::new();
    encode_value(&mut kv, &GgufValue::String("k".into()));
    kv.extend(8u32.to_le_bytes());
    kv.extend((MAX_STRING_BYTES + 1).to_le_bytes());
    let e = open(header(0, 1, &kv));
    assert!(e.contains("string of") && e.contains("allowed"), "{e}");

    // ... or an array with more elements than allowed.
    let mut kv = Vec::new();
    encode_value(&mut kv, &GgufValue::String("k".into()));
    kv.extend(9u32.to_le_bytes());
    kv.extend(0u32.to_le_bytes());
    kv.extend((MAX_ARRAY_LEN + 1).to_le_bytes());
    let e = open(header(0, 1, &kv));
    assert!(e.contains("array of") && e.contains("allowed"), "{e}");
}
