//! The HTTP layer against the tiny fixture model: every endpoint, every request shape, and
//! every error case, answered in OpenAI's shape without ever a 500 for user input.

mod api_util;

use api_util::*;
use serde_json::{json, Value};

async fn server() -> (std::net::SocketAddr, dcpserve::Engine) {
    let engine = tiny_engine().await;
    let addr = start(router_for(&engine, 64), None).await;
    (addr, engine)
}

fn greedy(extra: Value) -> Value {
    let mut v = json!({"model": "tiny", "temperature": 0, "max_tokens": 8, "ignore_eos": true});
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn info_endpoints() {
    let (addr, _e) = server().await;
    let r = get(addr, "/v1/models").await;
    assert_eq!(r.status, 200);
    let m = r.json();
    assert_eq!(m["object"], "list");
    assert_eq!(m["data"][0]["id"], "tiny");
    assert_eq!(m["data"][0]["max_model_len"], 4096);
    assert_eq!(get(addr, "/health").await.status, 200);
    assert_eq!(
        get(addr, "/version").await.json()["version"],
        env!("CARGO_PKG_VERSION")
    );

    let t = post(
        addr,
        "/tokenize",
        &json!({"model": "tiny", "prompt": "hello world"}),
    )
    .await;
    assert_eq!(t.status, 200, "{}", t.body);
    let t = t.json();
    let ids = t["tokens"].clone();
    assert_eq!(t["count"], ids.as_array().unwrap().len());
    assert_eq!(t["max_model_len"], 4096);
    let d = post(
        addr,
        "/detokenize",
        &json!({"model": "tiny", "tokens": ids}),
    )
    .await;
    assert!(
        d.json()["prompt"].as_str().unwrap().contains("hello world"),
        "{}",
        d.body
    );
    let chat = post(
        addr,
        "/tokenize",
        &json!({"messages": [{"role": "user", "content": "hi"}], "return_token_strs": true}),
    )
    .await
    .json();
    assert!(chat["count"].as_u64().unwrap() > 3);
    assert_eq!(
        chat["token_strs"].as_array().unwrap().len() as u64,
        chat["count"].as_u64().unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_match_the_engine() {
    let (addr, engine) = server().await;
    let r = post(
        addr,
        "/v1/completions",
        &greedy(json!({"prompt": "Once upon a time"})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "text_completion");
    assert!(v["id"].as_str().unwrap().starts_with("cmpl-"));
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "length");
    let mut p = dcpserve::SamplingParams {
        max_tokens: 8,
        ignore_eos: true,
        ..Default::default()
    };
    p.temperature = 0.0;
    let want = engine
        .complete(dcpserve::Prompt::Text("Once upon a time".into()), p)
        .await
        .unwrap();
    assert_eq!(choice["text"], want.text);
    assert_eq!(v["usage"]["completion_tokens"], 8);
    assert_eq!(v["usage"]["prompt_tokens"], want.prompt_tokens);
    assert_eq!(v["usage"]["total_tokens"], want.prompt_tokens + 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_shapes_n_and_seeds() {
    let (addr, _e) = server().await;
    let a = post(
        addr,
        "/v1/completions",
        &greedy(json!({"prompt": ["a b", "c d e"]})),
    )
    .await
    .json();
    assert_eq!(a["choices"].as_array().unwrap().len(), 2);
    let ids = post(
        addr,
        "/v1/completions",
        &greedy(json!({"prompt": [5, 6, 7]})),
    )
    .await
    .json();
    assert_eq!(ids["usage"]["prompt_tokens"], 3);
    let nested = post(
        addr,
        "/v1/completions",
        &greedy(json!({"prompt": [[5, 6, 7], [8, 9]]})),
    )
    .await
    .json();
    assert_eq!(nested["usage"]["prompt_tokens"], 5);
    assert_eq!(nested["choices"][0]["text"], ids["choices"][0]["text"]);

    // n > 1 with a seed: n distinct-index choices, reproducible.
    let body = json!({"model": "tiny", "prompt": "x", "n": 3, "seed": 7, "max_tokens": 6, "temperature": 1.0, "ignore_eos": true});
    let one = post(addr, "/v1/completions", &body).await.json();
    let two = post(addr, "/v1/completions", &body).await.json();
    let idx: Vec<u64> = one["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["index"].as_u64().unwrap())
        .collect();
    assert_eq!(idx, vec![0, 1, 2]);
    assert_eq!(one["choices"], two["choices"]);
    assert_eq!(one["usage"]["completion_tokens"], 18);
    // Penalties, min_tokens and min_p are accepted.
    let r = post(
        addr,
        "/v1/completions",
        &greedy(
            json!({"prompt": "x", "presence_penalty": 0.5, "frequency_penalty": 0.5,
            "repetition_penalty": 1.3, "min_tokens": 2, "min_p": 0.1, "top_k": 5}),
        ),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_returns_prompt_logprobs_consistent_with_generation() {
    let (addr, _e) = server().await;
    // The greedy next token after [5, 6, 7] and its logprob.
    let g = post(addr, "/v1/completions", &greedy(json!({"prompt": [5, 6, 7], "max_tokens": 1, "logprobs": 0, "return_tokens_as_token_ids": true}))).await.json();
    let lp = g["choices"][0]["logprobs"]["token_logprobs"][0]
        .as_f64()
        .unwrap();
    let tok = g["choices"][0]["logprobs"]["tokens"][0]
        .as_str()
        .unwrap()
        .to_string();
    let next: Vec<u32> = vec![tok.strip_prefix("token_id:").unwrap().parse().unwrap()];
    // Scoring the prompt [5, 6, 7, next] gives the same logprob for its last token.
    let e = post(
        addr,
        "/v1/completions",
        &greedy(
            json!({"prompt": [5, 6, 7, next[0]], "max_tokens": 1, "echo": true, "logprobs": 2}),
        ),
    )
    .await;
    assert_eq!(e.status, 200, "{}", e.body);
    let e = e.json();
    let l = &e["choices"][0]["logprobs"];
    let toks = l["token_logprobs"].as_array().unwrap();
    assert_eq!(toks.len(), 5, "4 prompt tokens + 1 generated: {l}");
    assert!(toks[0].is_null());
    assert!(l["top_logprobs"][0].is_null());
    assert!(
        (toks[3].as_f64().unwrap() - lp).abs() < 1e-3,
        "{} vs {lp}",
        toks[3]
    );
    assert!(!l["top_logprobs"][3].as_object().unwrap().is_empty());
    let offsets: Vec<u64> = l["text_offset"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    assert!(offsets.windows(2).all(|w| w[0] <= w[1]));
    assert!(
        e["choices"][0]["text"].as_str().unwrap().len()
            > g["choices"][0]["text"].as_str().unwrap().len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_with_logprobs_and_stop_strings() {
    let (addr, _e) = server().await;
    let msgs =
        json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]);
    let r = post(
        addr,
        "/v1/chat/completions",
        &greedy(json!({"messages": msgs, "max_tokens": 12, "logprobs": true, "top_logprobs": 3})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 12);
    assert_eq!(content[0]["top_logprobs"].as_array().unwrap().len(), 3);
    let text = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let joined: String = content
        .iter()
        .map(|c| c["token"].as_str().unwrap())
        .collect();
    assert_eq!(joined.trim(), text.trim());

    // max_completion_tokens wins over max_tokens.
    let r = post(
        addr,
        "/v1/chat/completions",
        &greedy(json!({"messages": msgs, "max_tokens": 12, "max_completion_tokens": 3})),
    )
    .await
    .json();
    assert_eq!(r["usage"]["completion_tokens"], 3);

    // A stop string cuts the output before it, with finish_reason "stop".
    let chars: Vec<char> = text.chars().collect();
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 2].iter().collect();
    let cut = &text[..text.find(&stop).unwrap()];
    let r = post(
        addr,
        "/v1/chat/completions",
        &greedy(json!({"messages": msgs, "max_tokens": 12, "stop": [stop]})),
    )
    .await
    .json();
    assert_eq!(r["choices"][0]["message"]["content"], cut);
    assert_eq!(r["choices"][0]["finish_reason"], "stop");
    let r = post(
        addr,
        "/v1/completions",
        &greedy(json!({"prompt": "abc", "max_tokens": 12})),
    )
    .await
    .json();
    let full = r["choices"][0]["text"].as_str().unwrap().to_string();
    let stop: String = full.chars().skip(3).take(2).collect();
    let r = post(
        addr,
        "/v1/completions",
        &greedy(json!({"prompt": "abc", "max_tokens": 12, "stop": stop})),
    )
    .await
    .json();
    assert_eq!(
        r["choices"][0]["text"].as_str().unwrap(),
        &full[..full.find(&stop).unwrap()]
    );
}

fn assert_error(r: &Resp, status: u16, needle: &str) {
    assert_eq!(r.status, status, "{}", r.body);
    let v = r.json();
    let e = &v["error"];
    assert!(
        e["message"].as_str().unwrap().contains(needle),
        "{needle:?} not in {}",
        r.body
    );
    for k in ["type", "param", "code"] {
        assert!(e.get(k).is_some(), "{k} missing in {}", r.body);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_case() {
    let (addr, _e) = server().await;
    let c = "/v1/completions";
    let bad = send(addr, "POST", c, &[], "{not json").await;
    assert_error(&bad, 400, "Invalid request body");
    assert_error(&send(addr, "POST", c, &[], "").await, 400, "empty");
    assert_error(
        &send(addr, "POST", c, &[], "[1,2]").await,
        400,
        "Invalid request body",
    );
    assert_error(
        &post(addr, c, &json!({"prompt": "x", "max_tokens": "ten"})).await,
        400,
        "invalid type",
    );
    assert_error(
        &post(addr, c, &json!({"prompt": 5})).await,
        400,
        "`prompt` must be",
    );
    assert_error(
        &post(addr, c, &json!({"max_tokens": 5})).await,
        400,
        "`prompt` is required",
    );
    assert_error(&post(addr, c, &json!({"prompt": ""})).await, 400, "empty");
    assert_error(&post(addr, c, &json!({"prompt": []})).await, 400, "empty");
    assert_error(
        &post(addr, c, &json!({"prompt": [1, 99999]})).await,
        400,
        "out of vocabulary",
    );
    assert_error(
        &post(addr, c, &json!({"prompt": [1, 2, 3], "max_tokens": 4094})).await,
        400,
        "This model's maximum context length is 4096 tokens. However, you requested 4097 tokens (3 in the messages, 4094 in the completion). Please reduce the length of the messages or completion.",
    );
    assert_error(
        &post(addr, c, &json!({"prompt": "x", "logprobs": 21})).await,
        400,
        "greater than max allowed: 20",
    );
    assert_error(
        &post(addr, c, &json!({"prompt": "x", "n": 0})).await,
        400,
        "n must be at least 1, got 0.",
    );
    assert_error(
        &post(addr, c, &json!({"prompt": "x", "temperature": -1})).await,
        400,
        "temperature must be non-negative",
    );
    assert_error(
        &post(addr, c, &json!({"prompt": "x", "top_p": 0})).await,
        400,
        "top_p must be in (0, 1]",
    );
    assert_error(
        &post(addr, c, &json!({"prompt": "x", "max_tokens": 0})).await,
        400,
        "max_tokens must be at least 1",
    );
    assert_error(
        &post(addr, c, &json!({"prompt": "x", "stop": 3})).await,
        400,
        "`stop` must be",
    );
    assert_error(
        &post(
            addr,
            c,
            &json!({"prompt": "x", "min_tokens": 9, "max_tokens": 2}),
        )
        .await,
        400,
        "min_tokens must be less than or equal to max_tokens=2",
    );
    let nf = post(addr, c, &json!({"model": "nope", "prompt": "x"})).await;
    assert_error(&nf, 404, "The model `nope` does not exist.");
    assert_eq!(nf.json()["error"]["code"], "model_not_found");

    let ch = "/v1/chat/completions";
    assert_error(
        &post(addr, ch, &json!({"messages": []})).await,
        400,
        "must not be empty",
    );
    assert_error(
        &post(addr, ch, &json!({"messages": "hi"})).await,
        400,
        "list of messages",
    );
    assert_error(
        &post(addr, ch, &json!({"messages": [{"content": "x"}]})).await,
        400,
        "role",
    );
    assert_error(
        &post(
            addr,
            ch,
            &json!({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}),
        )
        .await,
        400,
        "`logprobs` must be set to true",
    );
    assert_error(&post(addr, ch, &json!({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 50})).await, 400, "max allowed");

    assert_error(&get(addr, "/v1/nothing").await, 404, "No route");
    assert_error(&get(addr, c).await, 405, "not allowed");
    assert_error(
        &post(addr, "/detokenize", &json!({"tokens": [-1]})).await,
        400,
        "out of vocabulary",
    );
    assert_error(
        &post(addr, "/tokenize", &json!({})).await,
        400,
        "exactly one",
    );

    // Still serving.
    assert_eq!(
        post(addr, c, &greedy(json!({"prompt": "x"}))).await.status,
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_is_required_when_set() {
    let engine = tiny_engine().await;
    let addr = start(router_for(&engine, 8), Some("sekrit")).await;
    let body = greedy(json!({"prompt": "x"})).to_string();
    let none = send(addr, "POST", "/v1/completions", &[], &body).await;
    assert_error(&none, 401, "API key");
    let wrong = send(
        addr,
        "POST",
        "/v1/completions",
        &[("Authorization", "Bearer nope")],
        &body,
    )
    .await;
    assert_eq!(wrong.status, 401);
    let ok = send(
        addr,
        "POST",
        "/v1/completions",
        &[("Authorization", "Bearer sekrit")],
        &body,
    )
    .await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    // Health and metrics stay open (as in vLLM).
    assert_eq!(get(addr, "/health").await.status, 200);
}

/// The value of the series `name{labels}` in a Prometheus text exposition (0 when absent).
fn series_value(body: &str, series: &str) -> f64 {
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_after_a_short_load() {
    // The recorder is global to the test process: a model name of its own keeps this test's
    // counters apart from the other tests' requests.
    let engine = tiny_engine().await;
    let mut router = dcpserve_api::ModelRouter::new();
    router
        .add(dcpserve_api::ModelSlot::new(
            "tiny-metrics",
            std::sync::Arc::new(dcpserve_cli::serve::EngineBackend::new(
                engine.clone(),
                1,
                "fixtures/tiny-llama",
            )),
            dcpserve_api::SamplingDefaults::default(),
            64,
        ))
        .unwrap();
    let addr = start(router, None).await;
    let body = |extra: Value| {
        let mut v = greedy(extra);
        v["model"] = json!("tiny-metrics");
        v
    };
    let prompt_series = "dcpserve:prompt_tokens_total{model_name=\"tiny-metrics\"}";
    let success_series =
        "dcpserve:request_success_total{model_name=\"tiny-metrics\",finished_reason=\"length\"}";
    let generation_series = "dcpserve:generation_tokens_total{model_name=\"tiny-metrics\"}";

    for i in 0..3 {
        let r = post(
            addr,
            "/v1/completions",
            &body(json!({"prompt": format!("load {i}")})),
        )
        .await;
        assert_eq!(r.status, 200);
    }
    let before = get(addr, "/metrics").await.body;

    // One request with two choices: its prompt and itself count once, its tokens twice.
    let r = post(
        addr,
        "/v1/completions",
        &body(json!({"prompt": "Once upon a time", "n": 2})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let usage = r.json()["usage"].clone();
    let prompt_tokens = usage["prompt_tokens"].as_f64().unwrap();
    assert_eq!(usage["completion_tokens"], 16);

    let m = get(addr, "/metrics").await;
    assert_eq!(m.status, 200);
    let delta = |series: &str| series_value(&m.body, series) - series_value(&before, series);
    assert_eq!(delta(prompt_series), prompt_tokens, "{}", m.body);
    assert_eq!(delta(success_series), 1.0, "{}", m.body);
    assert_eq!(delta(generation_series), 16.0, "{}", m.body);
    assert_eq!(
        series_value(&m.body, success_series),
        4.0,
        "three requests, then one with n=2:\n{}",
        m.body
    );

    for needle in [
        success_series,
        prompt_series,
        generation_series,
        "dcpserve:time_to_first_token_seconds_bucket{model_name=\"tiny-metrics\"",
        "dcpserve:inter_token_latency_seconds_bucket{model_name=\"tiny-metrics\"",
        "dcpserve:e2e_request_latency_seconds_count{model_name=\"tiny-metrics\"} 4",
        "dcpserve:kv_cache_usage_perc{model_name=\"tiny-metrics\",rank=\"0\"}",
        "dcpserve:num_requests_running{model_name=\"tiny-metrics\"}",
        "dcpserve:num_requests_waiting{model_name=\"tiny-metrics\"}",
        "dcpserve:num_preemptions_total{model_name=\"tiny-metrics\"}",
        "dcpserve:prefix_cache_hit_rate{model_name=\"tiny-metrics\"}",
        "dcpserve:time_in_collectives_seconds{model_name=\"tiny-metrics\",rank=\"0\"}",
    ] {
        assert!(m.body.contains(needle), "{needle} missing:\n{}", m.body);
    }
}
