//! An MLA model (tiny DeepSeek-V3) served through the HTTP API next to a GQA model, from
//! one multi-model config: routed by name, and answering as the embedded engine does.

mod api_util;

use api_util::*;
use dcpserve::{Engine, EngineConfig, Prompt};
use serde_json::json;

fn fixture(name: &str) -> String {
    format!("{}/../fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mla_model_in_a_multi_model_config() {
    let toml = format!(
        r#"
        [[models]]
        name = "llama"
        path = "{}"
        dtype = "float32"
        kv_cache_memory_bytes = 8388608
        threads = 1

        [[models]]
        name = "deepseek"
        path = "{}"
        dtype = "float32"
        tensor_parallel_size = 2
        decode_context_parallel_size = 2
        kv_cache_memory_bytes = 8388608
        threads = 1
        "#,
        fixture("tiny-llama"),
        fixture("tiny-deepseek")
    );
    let cfg = dcpserve_api::ServeConfig::from_toml(&toml).unwrap();
    let router = dcpserve_cli::serve::build_router(&cfg)
        .await
        .expect("both models load");
    let addr = start(router, None).await;

    let models = get(addr, "/v1/models").await.json();
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["llama", "deepseek"]);

    let prompt: Vec<u32> = (0..40u32).map(|j| (j * 131) % 381 + 3).collect();
    let body = |model: &str| {
        json!({"model": model, "prompt": prompt, "temperature": 0, "max_tokens": 12,
               "ignore_eos": true})
    };
    let r = post(addr, "/v1/completions", &body("deepseek")).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let served = r.json()["choices"][0]["text"].as_str().unwrap().to_string();
    assert_eq!(r.json()["usage"]["completion_tokens"], 12);
    let r = post(addr, "/v1/completions", &body("llama")).await;
    assert_eq!(r.status, 200, "{}", r.body);

    // The same request through the embedded engine, on one rank.
    let engine = Engine::builder(fixture("tiny-deepseek"))
        .config(EngineConfig {
            dtype: dcpserve::DType::Float32,
            num_threads: Some(1),
            kv_cache_memory_bytes: Some(8 << 20),
            ..Default::default()
        })
        .build()
        .await
        .unwrap();
    let mut p = dcpserve::SamplingParams {
        max_tokens: 12,
        ignore_eos: true,
        ..Default::default()
    };
    p.temperature = 0.0;
    let direct = engine
        .complete(Prompt::Tokens(prompt.clone()), p)
        .await
        .unwrap();
    assert!(!served.is_empty());
    assert_eq!(served, direct.text);
}
