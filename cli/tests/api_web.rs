//! `GET /v1/engine/status` against the tiny fixture model at tp=4 dcp=2 (interleave 2):
//! the API key is required, every documented field is there, and each running sequence's
//! KV splits over the DCP ranks as the placement rule says (counted here position by
//! position). And the web page at `GET /`: public, and gone with `--no-web-ui`.

mod api_util;

use std::sync::Arc;

use api_util::*;
use dcpserve::{Engine, EngineConfig};
use dcpserve_api::{AppState, ModelRouter, ModelSlot, SamplingDefaults};
use dcpserve_cli::serve::EngineBackend;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const KEY: &str = "web-secret";
const TP: usize = 4;
const DCP: usize = 2;
const INTERLEAVE: usize = 2;

async fn dcp_engine() -> Engine {
    let mut cfg = EngineConfig {
        dtype: dcpserve::DType::Float32,
        num_threads: Some(2),
        kv_cache_memory_bytes: Some(16 << 20),
        block_size: 4,
        ..Default::default()
    };
    cfg.parallel.tensor_parallel_size = TP;
    cfg.parallel.decode_context_parallel_size = DCP;
    cfg.parallel.cp_kv_cache_interleave_size = INTERLEAVE;
    Engine::builder(tiny_path())
        .name("tiny-dcp")
        .config(cfg)
        .build()
        .await
        .expect("tiny-llama loads at tp=4 dcp=2")
}

async fn start_with(engine: &Engine, api_key: Option<&str>, web_ui: bool) -> std::net::SocketAddr {
    let mut router = ModelRouter::new();
    router
        .add(ModelSlot::new(
            "tiny-dcp",
            Arc::new(EngineBackend::new(
                engine.clone(),
                TP,
                "fixtures/tiny-llama",
            )),
            SamplingDefaults::default(),
            16,
        ))
        .unwrap();
    let state = AppState::new(router, api_key.map(str::to_string)).with_web_ui(web_ui);
    let (addr, server) = dcpserve_api::serve(
        "127.0.0.1:0".parse().unwrap(),
        state,
        std::future::pending(),
    )
    .await
    .expect("bind");
    tokio::spawn(server);
    addr
}

async fn status(addr: std::net::SocketAddr) -> Value {
    let auth = format!("Bearer {KEY}");
    let r = send(
        addr,
        "GET",
        "/v1/engine/status",
        &[("Authorization", &auth)],
        "",
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

/// Opens a long streamed chat (kept open by the returned socket) once its first frame
/// has arrived.
async fn long_stream(addr: std::net::SocketAddr) -> TcpStream {
    let body = json!({
        "model": "tiny-dcp", "stream": true, "max_tokens": 3000, "ignore_eos": true,
        "temperature": 0, "messages": [{"role": "user", "content": "count for a long time"}],
    })
    .to_string();
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {KEY}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(req.as_bytes()).await.unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("data: ") {
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0, "stream closed: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    s
}

fn usize_at(v: &Value, key: &str) -> usize {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("`{key}` is not a count in {v}")) as usize
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_status_reports_the_kv_placement() {
    let engine = dcp_engine().await;
    let addr = start_with(&engine, Some(KEY), true).await;

    // Like every /v1 route, it needs the key.
    let r = get(addr, "/v1/engine/status").await;
    assert_eq!(r.status, 401, "{}", r.body);
    assert!(r.json()["error"]["message"].is_string());
    let wrong = send(
        addr,
        "GET",
        "/v1/engine/status",
        &[("Authorization", "Bearer nope")],
        "",
    )
    .await;
    assert_eq!(wrong.status, 401);

    let idle = status(addr).await;
    assert_eq!(idle["object"], "engine.status");
    let m = &idle["models"][0];
    assert_eq!(m["model"], "tiny-dcp");
    assert_eq!(m["available"], true);
    let layout = &m["layout"];
    assert_eq!(layout["tensor_parallel_size"], TP);
    assert_eq!(layout["decode_context_parallel_size"], DCP);
    assert_eq!(layout["cp_kv_cache_interleave_size"], INTERLEAVE);
    assert_eq!(layout["block_size"], 4);
    assert_eq!(layout["tokens_per_virtual_block"], 4 * DCP);
    for key in ["running", "waiting", "admitted"] {
        assert_eq!(m["requests"][key], 0, "{key} when idle: {m}");
    }
    for key in ["preemptions", "generated_tokens"] {
        assert!(m[key].is_u64(), "{key}: {m}");
    }
    let total = usize_at(&m["kv"], "blocks_total");
    assert!(total > 0);
    assert_eq!(usize_at(&m["kv"], "blocks_free"), total);
    assert_eq!(usize_at(&m["kv"], "tokens_capacity"), total * 4 * DCP);
    assert_eq!(m["ranks"].as_array().unwrap().len(), TP);
    assert_eq!(m["sequences"].as_array().unwrap().len(), 0);

    let _stream = long_stream(addr).await;
    // Read until the running sequence has grown between two reads.
    let mut last_kv = None;
    let mut grew = false;
    let mut rate_seen = false;
    for _ in 0..400 {
        let s = status(addr).await;
        let m = &s["models"][0];
        let seqs = m["sequences"].as_array().unwrap();
        let Some(seq) = seqs.iter().find(|s| s["state"] == "running") else {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            continue;
        };
        let kv_tokens = usize_at(seq, "kv_tokens");
        let kv_blocks = usize_at(seq, "kv_blocks");
        // The split, counted position by position: p lives on DCP rank (p / I) mod N.
        let mut want = vec![0usize; DCP];
        for p in 0..kv_tokens {
            want[(p / INTERLEAVE) % DCP] += 1;
        }
        let got: Vec<usize> = seq["dcp_tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_u64().unwrap() as usize)
            .collect();
        assert_eq!(got, want, "{seq}");
        assert_eq!(got.iter().sum::<usize>(), kv_tokens);
        // Its blocks hold its tokens (one more block may be allocated ahead).
        assert!(kv_blocks * 4 * DCP >= kv_tokens, "{seq}");
        assert!(kv_blocks <= kv_tokens.div_ceil(4 * DCP) + 1, "{seq}");
        assert!(usize_at(seq, "prompt_tokens") > 0);
        // Every rank of the layout stores its DCP rank's share; blocks are global.
        let used = usize_at(&m["kv"], "blocks_used");
        assert!(used >= kv_blocks, "{m}");
        assert_eq!(used + usize_at(&m["kv"], "blocks_free"), total);
        for rank in m["ranks"].as_array().unwrap() {
            let r = usize_at(rank, "rank");
            assert_eq!(usize_at(rank, "dcp_rank"), r % DCP);
            assert_eq!(usize_at(rank, "blocks_used"), used);
            assert_eq!(usize_at(rank, "tokens_stored"), want[r % DCP], "{rank}");
            assert_eq!(usize_at(rank, "tokens_capacity"), total * 4);
        }
        assert!(m["requests"]["admitted"].as_u64().unwrap() >= 1);
        if m["tokens_per_second"].as_f64().is_some_and(|r| r > 0.0) {
            rate_seen = true;
        }
        if last_kv.is_some_and(|k| kv_tokens > k) && rate_seen {
            grew = true;
            break;
        }
        last_kv = Some(kv_tokens);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(grew, "the running sequence never grew (last {last_kv:?})");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_page_is_public_and_can_be_turned_off() {
    let engine = tiny_engine().await;
    let on = start(router_for(&engine, 4), Some(KEY)).await;
    // The page holds no data: it is served without the key (its API calls need it).
    let page = get(on, "/").await;
    assert_eq!(page.status, 200);
    assert_eq!(
        page.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    assert!(page.body.contains("/web/app.js") && page.body.contains("/web/app.css"));
    // Nothing from another origin.
    assert!(!page.body.contains("http://") && !page.body.contains("https://"));
    assert!(page
        .header("content-security-policy")
        .is_some_and(|c| c.starts_with("default-src 'self'")));
    let js = get(on, "/web/app.js").await;
    assert_eq!(js.status, 200);
    assert!(js.body.contains("/v1/engine/status"));
    assert_eq!(get(on, "/web/app.css").await.status, 200);
    assert_eq!(get(on, "/index.html").await.status, 200);
    assert_eq!(get(on, "/web/missing.js").await.status, 404);
    assert_eq!(send(on, "POST", "/", &[], "").await.status, 405);

    let mut router = ModelRouter::new();
    router
        .add(ModelSlot::new(
            "tiny",
            Arc::new(EngineBackend::new(engine.clone(), 1, "fixtures/tiny-llama")),
            SamplingDefaults::default(),
            4,
        ))
        .unwrap();
    let state = AppState::new(router, None).with_web_ui(false);
    let (off, server) = dcpserve_api::serve(
        "127.0.0.1:0".parse().unwrap(),
        state,
        std::future::pending(),
    )
    .await
    .unwrap();
    tokio::spawn(server);
    for path in ["/", "/index.html", "/web/app.js", "/web/app.css"] {
        let r = get(off, path).await;
        assert_eq!(r.status, 404, "{path}: {}", r.body);
        assert!(r.json()["error"]["message"].is_string());
    }
    // The API is unchanged.
    assert_eq!(get(off, "/v1/models").await.status, 200);
    assert_eq!(get(off, "/v1/engine/status").await.status, 200);
}
