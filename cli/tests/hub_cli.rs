//! The `dcpserve` binary on a model named by a Hugging Face repo id, offline
//! (`HF_HUB_OFFLINE=1`) from a hub cache built from the fixtures: it starts and generates
//! without the network, a missing model's error names what was searched, and its logs on
//! a pipe carry no colour codes, as text or as JSON lines (`--log-format json`).

#[path = "../../tests/hub/cache_layout.rs"]
mod cache_layout;

use std::path::PathBuf;
use std::process::{Command, Output};

use cache_layout::{folder_files, FakeCache, COMMIT_A};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures")
        .join(name)
}

/// `dcpserve generate` on `model`, offline against `cache`, stderr on a pipe.
fn generate(cache: &FakeCache, model: &str, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dcpserve"))
        .args([
            "generate",
            "--model",
            model,
            "--prompt",
            "Hello",
            "--max-tokens",
            "4",
        ])
        .args([
            "--dtype",
            "float32",
            "--threads",
            "2",
            "--kv-cache-memory-bytes",
            "16777216",
        ])
        .args(extra)
        .env("HF_HUB_OFFLINE", "1")
        .env("HF_HUB_CACHE", &cache.root)
        .env("RUST_LOG", "info")
        .output()
        .expect("the dcpserve binary runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn generate_starts_offline_from_the_cache_and_logs_without_colours() {
    let cache = FakeCache::new("cli");
    cache.add_snapshot(
        "test-org/tiny",
        COMMIT_A,
        &folder_files(&fixture("tiny-llama")),
        &["main"],
    );

    let out = generate(&cache, "test-org/tiny", &[]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(!stdout.trim().is_empty(), "generated text on stdout");
    assert!(stderr.contains("from the Hugging Face cache"), "{stderr}");
    assert!(
        stderr.contains(COMMIT_A),
        "the snapshot's path is logged: {stderr}"
    );
    assert!(
        !stderr.contains('\u{1b}'),
        "no ANSI codes on a pipe: {stderr:?}"
    );

    let out = generate(&cache, "test-org/tiny", &["--log-format", "json"]);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(text(&out.stdout), stdout, "the same greedy text");
    let lines: Vec<serde_json::Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let hub_line = lines
        .iter()
        .find(|l| l["message"] == "from the Hugging Face cache")
        .unwrap_or_else(|| panic!("no cache line in {stderr}"));
    assert_eq!(hub_line["level"], "INFO");
    assert_eq!(hub_line["repo"], "test-org/tiny");
    assert!(hub_line["timestamp"].is_string(), "{hub_line}");
}

#[test]
fn a_model_missing_offline_fails_with_what_was_searched() {
    let cache = FakeCache::new("cli-missing");
    let out = generate(&cache, "test-org/absent", &["--log-format", "json"]);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    let last: serde_json::Value = serde_json::from_str(stderr.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("the failure is a JSON line too ({e}): {stderr}"));
    assert_eq!(last["level"], "ERROR");
    let message = last["message"].as_str().unwrap_or_default();
    for needle in [
        "test-org/absent",
        "models--test-org--absent",
        "HF_HUB_OFFLINE",
        "config.json",
    ] {
        assert!(message.contains(needle), "{needle} missing from: {message}");
    }
    assert!(
        message.contains(&*cache.root.to_string_lossy()),
        "{message}"
    );
}
