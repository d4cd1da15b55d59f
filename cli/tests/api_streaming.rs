//! Streaming over SSE, client disconnects, stop strings while streaming, the bounded queue
//! (429), and two models behind one server.

mod api_util;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use api_util::*;
use dcpserve_api::{ModelRouter, ModelSlot, SamplingDefaults};
use serde_json::{json, Value};

fn chunks(r: &Resp) -> Vec<Value> {
    let data = r.sse();
    assert_eq!(
        data.last().map(String::as_str),
        Some("[DONE]"),
        "{}",
        r.body
    );
    data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_text_equals_the_whole_response() {
    let engine = tiny_engine().await;
    let addr = start(router_for(&engine, 64), None).await;
    let body = json!({"model": "tiny", "prompt": "stream me", "temperature": 0, "max_tokens": 10, "ignore_eos": true});
    let whole = post(addr, "/v1/completions", &body).await.json();
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    sbody["stream_options"] = json!({"include_usage": true});
    let r = post(addr, "/v1/completions", &sbody).await;
    assert_eq!(r.status, 200);
    assert!(r
        .header("content-type")
        .unwrap()
        .starts_with("text/event-stream"));
    let cs = chunks(&r);
    let text: String = cs
        .iter()
        .flat_map(|c| c["choices"].as_array().unwrap().iter())
        .map(|c| c["text"].as_str().unwrap())
        .collect();
    assert_eq!(text, whole["choices"][0]["text"].as_str().unwrap());
    let last = cs.last().unwrap();
    assert!(last["choices"].as_array().unwrap().is_empty());
    assert_eq!(last["usage"], whole["usage"]);
    let finish: Vec<&Value> = cs
        .iter()
        .flat_map(|c| c["choices"].as_array().unwrap().iter())
        .map(|c| &c["finish_reason"])
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(finish, vec![&json!("length")]);

    // Chat: role first, then content, n = 2 interleaved choices, each finishing once.
    let chat = json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "temperature": 0,
        "max_tokens": 6, "ignore_eos": true, "n": 2, "stream": true, "logprobs": true});
    let cs = chunks(&post(addr, "/v1/chat/completions", &chat).await);
    assert_eq!(cs[0]["object"], "chat.completion.chunk");
    assert_eq!(cs[0]["choices"][0]["delta"]["role"], "assistant");
    let mut texts = [String::new(), String::new()];
    let mut finished = [0, 0];
    let mut lps = [0, 0];
    for c in &cs {
        assert!(c.get("usage").is_none(), "usage only when asked: {c}");
        for ch in c["choices"].as_array().unwrap() {
            let i = ch["index"].as_u64().unwrap() as usize;
            if let Some(t) = ch["delta"]["content"].as_str() {
                texts[i].push_str(t);
            }
            if !ch["finish_reason"].is_null() {
                finished[i] += 1;
            }
            lps[i] += ch["logprobs"]["content"].as_array().map_or(0, |a| a.len());
        }
    }
    assert_eq!(finished, [1, 1]);
    assert_eq!(lps, [6, 6]);
    assert_eq!(texts[0], texts[1], "greedy choices agree");

    // A stop string while streaming: the output ends right before it.
    let full = whole["choices"][0]["text"].as_str().unwrap();
    let stop: String = full.chars().skip(4).take(3).collect();
    let mut stopped = sbody.clone();
    stopped["stop"] = json!([stop]);
    let cs = chunks(&post(addr, "/v1/completions", &stopped).await);
    let text: String = cs
        .iter()
        .flat_map(|c| c["choices"].as_array().unwrap().iter())
        .map(|c| c["text"].as_str().unwrap())
        .collect();
    assert_eq!(text, &full[..full.find(&stop).unwrap()]);
    assert!(cs
        .iter()
        .any(|c| c["choices"][0]["finish_reason"] == "stop"));
    // The stopped request was aborted in the engine: every block is free again.
    assert!(all_blocks_free(&engine).await, "{:?}", engine.stats().await);
}

/// Polls the engine for up to two seconds until nothing runs and every block is free.
async fn all_blocks_free(engine: &dcpserve::Engine) -> bool {
    for _ in 0..100 {
        let s = engine.stats().await.unwrap();
        if s.running == 0 && s.waiting == 0 && s.free_blocks == s.total_blocks {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disconnected_client_aborts_and_frees_kv_blocks() {
    let engine = tiny_engine().await;
    let addr = start(router_for(&engine, 64), None).await;
    let body = json!({"model": "tiny", "prompt": "a long story", "max_tokens": 4000, "ignore_eos": true, "stream": true});
    let (sock, seen) = open_stream(addr, "/v1/completions", &body, 3).await;
    assert!(seen.starts_with("HTTP/1.1 200"), "{seen}");
    drop(sock);
    assert!(all_blocks_free(&engine).await, "{:?}", engine.stats().await);
    let m = get(addr, "/metrics").await.body;
    assert!(
        m.contains("dcpserve:request_success_total{model_name=\"tiny\",finished_reason=\"abort\"}"),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_429_and_recovers() {
    let live = Arc::new(AtomicUsize::new(0));
    let mut router = ModelRouter::new();
    let backend = StallingBackend { live: live.clone() };
    router
        .add(ModelSlot::new(
            "stall",
            Arc::new(backend),
            SamplingDefaults::default(),
            2,
        ))
        .unwrap();
    let addr = start(router, None).await;
    let body = json!({"prompt": "hello", "max_tokens": 5, "stream": true});
    let (a, _) = open_stream(addr, "/v1/completions", &body, 1).await;
    let (b, _) = open_stream(addr, "/v1/completions", &body, 1).await;
    assert_eq!(live.load(Ordering::SeqCst), 2);
    let full = post(
        addr,
        "/v1/completions",
        &json!({"prompt": "hello", "max_tokens": 5}),
    )
    .await;
    assert_eq!(full.status, 429, "{}", full.body);
    assert_eq!(full.json()["error"]["code"], "rate_limit_exceeded");
    drop(a);
    drop(b);
    assert!(
        eventually(|| live.load(Ordering::SeqCst) == 0).await,
        "streams dropped"
    );
    let (c, _) = open_stream(addr, "/v1/completions", &body, 1).await;
    assert_eq!(live.load(Ordering::SeqCst), 1);
    drop(c);
    // n = 3 never fits in two slots, even when idle: a 400, not a 429 to retry forever.
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": "hello", "max_tokens": 5, "n": 3}),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["error"]["param"], "n");
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("admits at most 2 at once"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_models_are_routed_by_name() {
    let engine = tiny_engine().await;
    let mut router = router_for(&engine, 8);
    let live = Arc::new(AtomicUsize::new(0));
    router
        .add(ModelSlot::new(
            "stall",
            Arc::new(StallingBackend { live }),
            SamplingDefaults {
                max_tokens: Some(3),
                ..Default::default()
            },
            4,
        ))
        .unwrap();
    let addr = start(router, None).await;
    let ids: Vec<String> = get(addr, "/v1/models").await.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids, vec!["tiny", "stall"]);
    let t = post(
        addr,
        "/v1/completions",
        &json!({"model": "tiny", "prompt": "x", "max_tokens": 2}),
    )
    .await;
    assert_eq!(t.json()["model"], "tiny");
    // The stalling model streams its first token, proving the request went there.
    let (_s, seen) = open_stream(
        addr,
        "/v1/completions",
        &json!({"model": "stall", "prompt": "x", "stream": true}),
        1,
    )
    .await;
    assert!(seen.contains("\"model\":\"stall\""), "{seen}");
    assert!(seen.contains("\"text\":\"x\""), "{seen}");
    let tok = post(
        addr,
        "/tokenize",
        &json!({"model": "stall", "prompt": "ab"}),
    )
    .await
    .json();
    assert_eq!(tok["tokens"], json!([97, 98]));
}
