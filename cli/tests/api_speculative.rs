//! A speculating model behind the HTTP API: the same completion as without speculation,
//! and the drafted / accepted counters on `/metrics`.

mod api_util;

use api_util::*;
use dcpserve::{Engine, EngineConfig, SpeculativeConfig};
use serde_json::json;

async fn engine(speculative: Option<SpeculativeConfig>) -> Engine {
    let cfg = EngineConfig {
        dtype: dcpserve::DType::Float32,
        num_threads: Some(2),
        kv_cache_memory_bytes: Some(16 << 20),
        speculative,
        ..Default::default()
    };
    Engine::builder(tiny_path())
        .name("tiny")
        .config(cfg)
        .build()
        .await
        .expect("tiny-llama loads")
}

/// The value of a series in a Prometheus text exposition.
fn series(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn speculating_server_answers_the_same_and_counts_drafts() {
    let spec = SpeculativeConfig::from_json(
        r#"{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}"#,
    )
    .unwrap();
    // A prompt that repeats itself (token ids), so that lookup finds drafts.
    let prompt: Vec<u32> = (0..12u32)
        .map(|j| j * 29 % 380 + 3)
        .cycle()
        .take(48)
        .collect();
    let body = json!({"model": "tiny", "prompt": prompt, "temperature": 0, "max_tokens": 32,
                      "ignore_eos": true, "logprobs": 1});

    let plain = start(router_for(&engine(None).await, 8), None).await;
    let want = post(plain, "/v1/completions", &body).await;
    assert_eq!(want.status, 200, "{}", want.body);

    let fast = start(router_for(&engine(Some(spec)).await, 8), None).await;
    let got = post(fast, "/v1/completions", &body).await;
    assert_eq!(got.status, 200, "{}", got.body);
    let text = |r: &Resp| r.json()["choices"][0]["text"].clone();
    let tokens = |r: &Resp| r.json()["choices"][0]["logprobs"]["tokens"].clone();
    assert_eq!(text(&want), text(&got));
    assert_eq!(tokens(&want), tokens(&got));

    let m = get(fast, "/metrics").await.body;
    let label = "{model_name=\"tiny\"}";
    let drafts = series(&m, &format!("dcpserve:spec_decode_num_drafts_total{label}"))
        .expect("drafts series");
    let drafted = series(
        &m,
        &format!("dcpserve:spec_decode_num_draft_tokens_total{label}"),
    )
    .expect("draft tokens series");
    let accepted = series(
        &m,
        &format!("dcpserve:spec_decode_num_accepted_tokens_total{label}"),
    )
    .expect("accepted tokens series");
    assert!(
        drafts > 0.0 && drafted >= drafts && accepted <= drafted,
        "{m}"
    );
    // The acceptance histogram counts every draft once.
    let by_accepted: f64 = m
        .lines()
        .filter(|l| {
            l.starts_with("dcpserve:spec_decode_drafts_by_accepted_tokens_total{")
                && l.contains("model_name=\"tiny\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(by_accepted, drafts, "{m}");

    // The Grafana dashboard reads only what this server exports (a speculating server
    // after finished requests exports every series the dashboard uses), among them the
    // per-rank KV usage and time in collectives.
    let queried = dashboard::assert_dashboard_is_exported(&m);
    for name in [
        "dcpserve:kv_cache_usage_perc",
        "dcpserve:time_in_collectives_seconds",
        "dcpserve:time_to_first_token_seconds_bucket",
        "dcpserve:spec_decode_num_accepted_tokens_total",
    ] {
        assert!(queried.contains(name), "the dashboard lacks {name}");
    }
}

/// The dashboard check itself: names are read from PromQL as Prometheus spells them, and
/// a metric the exposition lacks is reported.
#[test]
fn the_dashboard_check_reads_promql_and_finds_missing_metrics() {
    let names = dashboard::metric_names(
        "histogram_quantile(0.99, sum by (le) (rate(dcpserve:time_to_first_token_seconds_bucket{model_name=~\"$m\"}[5m]))) / dcpserve:num_requests_running",
    );
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        [
            "dcpserve:num_requests_running",
            "dcpserve:time_to_first_token_seconds_bucket"
        ]
    );
    let exposition = "# TYPE dcpserve:num_requests_running gauge\ndcpserve:num_requests_running{model_name=\"a\"} 1\n";
    assert_eq!(
        dashboard::exported_names(exposition)
            .into_iter()
            .collect::<Vec<_>>(),
        ["dcpserve:num_requests_running"]
    );
    let caught = std::panic::catch_unwind(|| dashboard::assert_dashboard_is_exported(exposition));
    let message = caught.unwrap_err();
    let text = message
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default();
    assert!(text.contains("dcpserve:kv_cache_usage_perc"), "{text}");
}
