//! Bad files fail with clear errors naming the file, never with a panic.

mod common;

use std::sync::Arc;

use dcpserve_model::gguf::GgufFile;
use dcpserve_model::gguf_config::config_from_gguf;
use dcpserve_model::gguf_tokenizer::tokenizer_from_gguf;
use dcpserve_model::{ChatTemplate, GgufTensorSource, ModelError, ModelFiles, TensorSource};

/// Runs everything `ModelFiles::open` does on an in-memory image; returns the first error.
fn load_all(bytes: Vec<u8>) -> Result<(), ModelError> {
    let file = Arc::new(GgufFile::from_bytes("mem.gguf", Arc::new(bytes))?);
    let config = config_from_gguf(&file)?;
    let tok = tokenizer_from_gguf(&file)?;
    let _ = tok.encode("Hello <|im_start|> there", true)?;
    ChatTemplate::from_gguf(&file, None, None)?;
    let src = GgufTensorSource::new(file)?;
    dcpserve_model::source::validate_tensors(&config, &src, "mem.gguf".as_ref())?;
    for name in src.names() {
        src.get(&name)?.to_f32_vec()?;
    }
    Ok(())
}

#[test]
fn tiny_model_loads() {
    load_all(common::tiny_llama_gguf()).unwrap();
    let dir = common::temp_dir("tiny");
    std::fs::write(dir.join("tiny.gguf"), common::tiny_llama_gguf()).unwrap();
    // A folder holding exactly one .gguf opens as that file.
    let files = ModelFiles::open(&dir).unwrap();
    assert_eq!(files.config.num_hidden_layers, 1);
    assert!(files.config.tie_word_embeddings);
    // add_bos_token is set in this file, so BOS is prepended.
    assert_eq!(files.tokenizer.encode("the", true).unwrap()[0], 1);
    assert_eq!(files.tokenizer.encode(" th", false).unwrap().len(), 1);
    std::fs::write(dir.join("second.gguf"), b"x").unwrap();
    let e = ModelFiles::open(&dir).unwrap_err().to_string();
    assert!(e.contains("2 .gguf files"), "{e}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn every_truncation_is_an_error() {
    let full = common::tiny_llama_gguf();
    for len in 0..full.len() {
        let r = GgufFile::from_bytes("cut.gguf", Arc::new(full[..len].to_vec()));
        let e = r.expect_err(&format!("truncated to {len} bytes but opened"));
        let msg = e.to_string();
        assert!(msg.contains("cut.gguf"), "{msg}");
        assert!(
            matches!(e, ModelError::Truncated { .. } | ModelError::Corrupt { .. }),
            "len {len}: {msg}"
        );
    }
}

#[test]
fn garbled_bytes_never_panic() {
    let full = common::tiny_llama_gguf();
    let mut rng = common::Rng(0x9e37_79b9_7f4a_7c15);
    let mut failures = 0;
    for round in 0..3000 {
        let mut bytes = full.clone();
        // Mostly damage the header/metadata region, where the parser lives.
        let region = if round % 4 == 0 {
            bytes.len()
        } else {
            4096.min(bytes.len())
        };
        for _ in 0..1 + rng.below(4) {
            let i = rng.below(region);
            bytes[i] = match rng.below(3) {
                0 => rng.next() as u8,
                1 => 0xff,
                _ => bytes[i] ^ (1 << rng.below(8)),
            };
        }
        if load_all(bytes).is_err() {
            failures += 1;
        }
    }
    assert!(
        failures > 100,
        "garbling should usually be detected ({failures})"
    );
}

#[test]
fn unsupported_tensor_type_is_named() {
    // Flip token_embd's ggml type from Q8_0 (8) to IQ2_XXS (16, not supported) in the
    // tensor-info table.
    let mut bytes = common::tiny_llama_gguf();
    let name = b"token_embd.weight";
    let at = bytes.windows(name.len()).position(|w| w == name).unwrap() + name.len();
    let type_at = at + 4 + 2 * 8; // n_dims, two dims
    assert_eq!(bytes[type_at], 8);
    bytes[type_at] = 16;
    let file = Arc::new(GgufFile::from_bytes("q4k.gguf", Arc::new(bytes)).unwrap());
    let e = GgufTensorSource::new(file)
        .unwrap()
        .get("model.embed_tokens.weight")
        .unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(e, ModelError::UnsupportedTensorType { .. }),
        "{msg}"
    );
    assert!(
        msg.contains("IQ2_XXS") && msg.contains("16") && msg.contains("token_embd.weight"),
        "{msg}"
    );
}

#[test]
fn unsupported_architecture_is_named() {
    let bytes = common::tiny_llama_gguf();
    let needle = b"\x05\x00\x00\x00\x00\x00\x00\x00llama";
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .unwrap();
    let mut bytes = bytes;
    bytes[at + 8..at + 13].copy_from_slice(b"mamba");
    let e = load_all(bytes).unwrap_err();
    assert!(
        matches!(e, ModelError::UnsupportedArchitecture { ref arch, .. } if arch == "mamba"),
        "{e}"
    );
}

#[test]
fn truncated_default_model_is_reported() {
    let real = std::fs::read(common::default_model()).unwrap();
    let dir = common::temp_dir("trunc");
    for (len, expect) in [
        (100_000usize, "truncated"),
        (2_000_000, "token_embd.weight"),
        (3, "truncated"),
    ] {
        let path = dir.join(format!("cut{len}.gguf"));
        std::fs::write(&path, &real[..len]).unwrap();
        let e = ModelFiles::open(&path).unwrap_err().to_string();
        assert!(
            e.contains(expect) && e.contains(&format!("cut{len}.gguf")),
            "{e}"
        );
    }
    let garbage = dir.join("garbage.gguf");
    std::fs::write(&garbage, b"this is not a model at all").unwrap();
    let e = ModelFiles::open(&garbage).unwrap_err().to_string();
    assert!(e.contains("not a GGUF file"), "{e}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn missing_paths_are_clear() {
    let dir = common::temp_dir("missing");
    let e = ModelFiles::open(dir.join("nope.gguf")).unwrap_err();
    assert!(matches!(e, ModelError::MissingFile { .. }), "{e}");
    let e = ModelFiles::open(&dir).unwrap_err().to_string();
    assert!(e.contains("config.json"), "{e}");
    std::fs::write(dir.join("weights.bin"), b"x").unwrap();
    let e = ModelFiles::open(dir.join("weights.bin"))
        .unwrap_err()
        .to_string();
    assert!(e.contains(".gguf"), "{e}");
    let _ = std::fs::remove_dir_all(dir);
}
