//! Structured outputs in the engine: a JSON-schema constraint holds on tiny-llama at
//! every layout (prefill context parallelism included), with n-gram speculation (drafts checked against the grammar) and under
//! preemption (the matcher rebuilt from the sequence's tokens); greedy constrained output
//! is the same with and without drafts.

mod common;

use common::equivalence::{cfg, layout, pcp_layout, preemption_prompts};
use common::*;
use dcpserve::SpeculativeConfig;
use dcpserve::{Completion, Engine, EngineConfig, FinishReason, Prompt, SamplingParams};
use dcpserve_actors::OutputConstraint;
use dcpserve_actors::SchedulerStats;
use serde_json::Value;

const SCHEMA: &str = r#"{
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "role": {"enum": ["admin", "user", "guest"]},
    "verified": {"type": "boolean"}
  },
  "required": ["name", "age", "role", "verified"],
  "additionalProperties": false
}"#;

/// Checks `text` against [`SCHEMA`] by hand (the Python tests use `jsonschema`).
fn assert_valid(text: &str, what: &str) {
    let v: Value =
        serde_json::from_str(text).unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {text:?}"));
    let o = v
        .as_object()
        .unwrap_or_else(|| panic!("{what}: not an object: {text}"));
    let mut keys: Vec<&str> = o.keys().map(String::as_str).collect();
    keys.sort();
    assert_eq!(keys, ["age", "name", "role", "verified"], "{what}: {text}");
    let name = o["name"]
        .as_str()
        .unwrap_or_else(|| panic!("{what}: name: {text}"));
    assert!(name.chars().count() <= 12, "{what}: name too long: {text}");
    let age = o["age"]
        .as_i64()
        .unwrap_or_else(|| panic!("{what}: age: {text}"));
    assert!((0..=120).contains(&age), "{what}: age out of range: {text}");
    let role = o["role"]
        .as_str()
        .unwrap_or_else(|| panic!("{what}: role: {text}"));
    assert!(["admin", "user", "guest"].contains(&role), "{what}: {text}");
    assert!(o["verified"].is_boolean(), "{what}: {text}");
}

fn params(temperature: f32, seed: u64) -> SamplingParams {
    SamplingParams {
        temperature,
        seed: Some(seed),
        max_tokens: 300,
        constraint: Some(OutputConstraint::JsonSchema(SCHEMA.into())),
        ..Default::default()
    }
}

/// Prompts that contain JSON in the schema's shape (as tokens of the tiny vocabulary),
/// so that n-gram lookup proposes drafts, some of which the grammar rejects.
fn json_prompts(engine: &Engine, count: usize) -> Vec<Vec<u32>> {
    let tok = engine.tokenizer();
    (0..count)
        .map(|i| {
            let text = format!(
                r#"{{"name": "ann{i}", "age": {}, "role": "user", "verified": true}} {{"name": "#,
                20 + i
            );
            tok.encode(&text, false).expect("encode")
        })
        .collect()
}

async fn complete_all(engine: &Engine, prompts: &[Vec<u32>], temperature: f32) -> Vec<Completion> {
    let futures = prompts.iter().enumerate().map(|(i, p)| {
        engine.complete(Prompt::Tokens(p.clone()), params(temperature, i as u64 + 1))
    });
    futures::future::join_all(futures)
        .await
        .into_iter()
        .map(|c| c.expect("completion"))
        .collect()
}

fn ngram() -> SpeculativeConfig {
    SpeculativeConfig::from_json(
        r#"{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}"#,
    )
    .unwrap()
}

async fn run(c: EngineConfig, temperature: f32, count: usize) -> (Vec<Completion>, SchedulerStats) {
    let engine = Engine::builder(fixture("tiny-llama"))
        .config(c)
        .build()
        .await
        .expect("engine");
    let prompts = json_prompts(&engine, count);
    let out = complete_all(&engine, &prompts, temperature).await;
    (out, engine.stats().await.expect("stats"))
}

fn assert_all_valid(out: &[Completion], what: &str) {
    for (i, c) in out.iter().enumerate() {
        assert_eq!(
            c.finish_reason,
            FinishReason::Stop,
            "{what} #{i}: {:?}",
            c.text
        );
        assert_valid(&c.text, &format!("{what} #{i}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_holds_at_every_layout_with_and_without_ngram_drafts() {
    let kv = 32 << 20;
    let (base, _) = run(cfg(layout(1, 1, 1), 64, kv), 0.0, 4).await;
    assert_all_valid(&base, "greedy tp=1");
    // The last: prefill context parallelism (two copies of tp=2 split each step's tokens).
    let layouts = [
        (4, 1, 2, false),
        (1, 1, 1, true),
        (4, 1, 2, true),
        (2, 2, 1, true),
    ];
    for (tp, pcp, dcp, spec) in layouts {
        let mut c = cfg(pcp_layout(tp, pcp, dcp, 1), 64, kv);
        if spec {
            c.speculative = Some(ngram());
        }
        let what = format!("tp={tp} pcp={pcp} dcp={dcp} ngram={spec}");
        let (greedy, stats) = run(c.clone(), 0.0, 4).await;
        assert_all_valid(&greedy, &format!("greedy {what}"));
        let texts = |v: &[Completion]| v.iter().map(|c| c.text.clone()).collect::<Vec<_>>();
        assert_eq!(
            texts(&greedy),
            texts(&base),
            "greedy {what} differs from tp=1"
        );
        if spec {
            assert!(
                stats.speculation.num_draft_tokens > 0,
                "{what}: nothing drafted"
            );
        }
        let (sampled, _) = run(c, 1.0, 12).await;
        assert_all_valid(&sampled, &format!("sampled {what}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_holds_under_preemption() {
    // The KV cache of `ngram_greedy_equals_plain_decoding_under_preemption`: too small for
    // every sequence at once, so running sequences are preempted and recomputed (their
    // matchers rebuilt from their tokens).
    let mut c = cfg(layout(4, 2, 1), 64, 128 * 16 * 24);
    c.speculative = Some(ngram());
    let engine = Engine::builder(fixture("tiny-llama"))
        .config(c)
        .build()
        .await
        .expect("engine");
    let prompts = preemption_prompts();
    let out = complete_all(&engine, &prompts, 1.0).await;
    let stats = engine.stats().await.expect("stats");
    assert!(stats.preemptions > 0, "no preemption happened");
    assert_all_valid(&out, "preempted");
}
