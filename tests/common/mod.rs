//! Helpers shared by the integration tests: fixture paths and reference files.
#![allow(dead_code)]

use std::path::PathBuf;

use serde_json::Value;

pub mod equivalence;
pub mod prefill;
pub mod reference;

/// The repository's root, where `fixtures/` is: the package of these tests is the root
/// package or `cli/` (whose tests include this module by path).
pub fn repo_root() -> PathBuf {
    let package = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    package
        .ancestors()
        .find(|dir| dir.join("fixtures").is_dir())
        .unwrap_or(package)
        .to_path_buf()
}

pub fn fixture(rel: &str) -> PathBuf {
    repo_root().join("fixtures").join(rel)
}

pub fn read_json(path: PathBuf) -> Value {
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read fixture {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("bad JSON in {}: {e}", path.display()))
}

/// The default model; a missing file fails the test with the command that fetches it.
pub fn default_model() -> PathBuf {
    let p = dcpserve::default_model_path();
    assert!(
        p.exists(),
        "default model missing at {}: run scripts/fetch-default-model.sh",
        p.display()
    );
    p
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("array of ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

pub fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("array of numbers")
        .iter()
        .map(|x| x.as_f64().expect("number") as f32)
        .collect()
}

pub fn greedy(max_tokens: usize) -> dcpserve::SamplingParams {
    let mut p = dcpserve::SamplingParams {
        max_tokens,
        ignore_eos: true,
        ..Default::default()
    };
    p.temperature = 0.0;
    p
}

pub fn f32_config() -> dcpserve::EngineConfig {
    dcpserve::EngineConfig {
        dtype: dcpserve::DType::Float32,
        kv_cache_memory_bytes: Some(64 << 20),
        num_threads: Some(2),
        ..Default::default()
    }
}

/// Waits (up to 2 s) until no sequence runs and every KV block is free again.
pub async fn all_blocks_freed(engine: &dcpserve::Engine) -> bool {
    for _ in 0..200 {
        let st = engine.stats().await.unwrap();
        if st.free_blocks == st.total_blocks && st.running == 0 {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    false
}

/// Starts a long greedy generation of `prompt`, waits for its first `tokens` tokens,
/// makes rank `rank` fail, and returns the error the in-flight request ends with (it must
/// end, within 30 s, not hang).
pub async fn fail_rank_during_generation(
    engine: &dcpserve::Engine,
    prompt: Vec<u32>,
    tokens: usize,
    rank: usize,
) -> String {
    use futures::StreamExt;
    let mut s = engine
        .generate(dcpserve::Prompt::Tokens(prompt), greedy(100_000))
        .unwrap();
    for _ in 0..tokens {
        assert!(matches!(
            s.next().await,
            Some(Ok(dcpserve::GenerationEvent::Token { .. }))
        ));
    }
    engine.inject_rank_fault(rank).unwrap();
    while let Some(ev) = tokio::time::timeout(std::time::Duration::from_secs(30), s.next())
        .await
        .expect("the in-flight request must not hang")
    {
        if let Err(e) = ev {
            assert!(matches!(e, dcpserve::Error::RankFailure(_)), "{e:?}");
            return e.to_string();
        }
    }
    panic!("the in-flight request must end with an error");
}
