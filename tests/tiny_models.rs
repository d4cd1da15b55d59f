//! Tiny random Llama / Qwen2 / Qwen3 models against Hugging Face transformers' logits
//! (fixtures made by scripts/make_references.py), in float32.

mod common;

use common::reference::{check_logprobs, check_logprobs_of};
use common::*;
use dcpserve::{Engine, Prompt};
use dcpserve_model::ModelFiles;

#[test]
fn tiny_llama_matches_transformers() {
    check_logprobs("tiny-llama");
}

#[test]
fn tiny_qwen2_matches_transformers() {
    check_logprobs("tiny-qwen2");
}

#[test]
fn tiny_qwen3_matches_transformers() {
    check_logprobs("tiny-qwen3");
}

/// Each fixture with config.json as transformers 5 writes it natively (`rope_parameters`
/// only: no `rope_theta`, `rope_scaling` or `torch_dtype`) and `"architectures": null`, and
/// with only the classic keys (no `rope_parameters`): the same configuration as the fixture's
/// own (which has both), and the native one matches the transformers reference.
#[test]
fn tiny_models_with_either_rope_spelling() {
    for name in ["tiny-llama", "tiny-qwen2", "tiny-qwen3"] {
        let want = ModelFiles::read_config(fixture(name)).unwrap();
        let config = read_json(fixture(name).join("config.json"));
        for native in [true, false] {
            let dir = std::env::temp_dir().join(format!(
                "dcpserve-rope-{}-{name}-{native}",
                std::process::id()
            ));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let mut c = config.clone();
            let o = c.as_object_mut().unwrap();
            let removed: &[&str] = if native {
                o.insert("architectures".into(), serde_json::Value::Null);
                &["rope_theta", "rope_scaling", "torch_dtype"]
            } else {
                &["rope_parameters"]
            };
            for key in removed {
                assert!(o.remove(*key).is_some(), "{name} has no {key}");
            }
            std::fs::write(dir.join("config.json"), c.to_string()).unwrap();
            for f in [
                "model.safetensors",
                "tokenizer.json",
                "tokenizer_config.json",
                "generation_config.json",
            ] {
                std::fs::copy(fixture(name).join(f), dir.join(f)).unwrap();
            }
            assert_eq!(
                ModelFiles::read_config(&dir).unwrap(),
                want,
                "{name} {native}"
            );
            if native {
                check_logprobs_of(name, &dir);
            }
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

/// Greedy continuations of all prompts, served concurrently through the actor path,
/// equal transformers' up to the first near-tie in the reference.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiny_models_greedy_through_the_engine() {
    for name in ["tiny-llama", "tiny-qwen2", "tiny-qwen3"] {
        let reference = read_json(fixture(name).join("reference.json"));
        let engine = Engine::builder(fixture(name))
            .config(f32_config())
            .build()
            .await
            .expect(name);
        let prompts = reference["prompts"].as_array().unwrap();
        let mut streams = Vec::new();
        for p in prompts {
            let want = ids(&p["greedy"]);
            let fut = engine.complete(Prompt::Tokens(ids(&p["ids"])), greedy(want.len()));
            streams.push(fut);
        }
        let outs = futures::future::join_all(streams).await;
        for (p, out) in prompts.iter().zip(outs) {
            let got = out.expect("completion").token_ids;
            let want = ids(&p["greedy"]);
            let margins = floats(&p["greedy_margin"]);
            let trusted = margins.iter().position(|&m| m < 1e-3).unwrap_or(want.len());
            assert_eq!(
                got[..trusted],
                want[..trusted],
                "{name} prompt {}: greedy continuation differs",
                p["name"]
            );
            assert_eq!(got.len(), want.len());
        }
    }
}
