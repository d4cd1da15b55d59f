//! Helpers of the HTTP tests: an in-process server on 127.0.0.1:0, a minimal HTTP/1.1
//! client over a tokio `TcpStream` (no client crate), SSE parsing, and a stand-in model
//! whose generations never end (for queue and disconnect tests).
#![allow(dead_code)]

pub mod dashboard;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use dcpserve::{Engine, EngineConfig, TokenOutput, ValidRequest};
use dcpserve_api::{
    AppState, BackendError, BackendEvent, BackendStats, EventStream, ModelBackend, ModelRouter,
    ModelSlot, SamplingDefaults,
};
use dcpserve_cli::serve::EngineBackend;
use dcpserve_model::ChatMessage;
use futures::future::BoxFuture;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub fn tiny_path() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures/tiny-llama")
}

/// The tiny fixture model in float32 with a small KV budget and two threads.
pub async fn tiny_engine() -> Engine {
    let cfg = EngineConfig {
        dtype: dcpserve::DType::Float32,
        num_threads: Some(2),
        kv_cache_memory_bytes: Some(16 << 20),
        ..Default::default()
    };
    Engine::builder(tiny_path())
        .name("tiny")
        .config(cfg)
        .build()
        .await
        .expect("tiny-llama loads")
}

/// A router serving `engine` as `tiny` with room for `max_outstanding` sequences.
pub fn router_for(engine: &Engine, max_outstanding: usize) -> ModelRouter {
    let mut r = ModelRouter::new();
    let backend = EngineBackend::new(engine.clone(), 1, "fixtures/tiny-llama");
    r.add(ModelSlot::new(
        "tiny",
        Arc::new(backend),
        SamplingDefaults::default(),
        max_outstanding,
    ))
    .unwrap();
    r
}

/// Starts a server in this process and returns its address.
pub async fn start(router: ModelRouter, api_key: Option<&str>) -> SocketAddr {
    let state = AppState::new(router, api_key.map(str::to_string));
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

/// A parsed response.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Resp {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The `data:` payloads of an SSE body.
    pub fn sse(&self) -> Vec<String> {
        sse_data(&self.body)
    }
}

pub fn sse_data(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|frame| frame.strip_prefix("data: "))
        .map(str::to_string)
        .collect()
}

fn raw_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> String {
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    req
}

/// Sends one request and reads the whole response.
pub async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Resp {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(raw_request(addr, method, path, headers, body).as_bytes())
        .await
        .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.expect("read");
    parse_response(&raw)
}

pub async fn post(addr: SocketAddr, path: &str, body: &Value) -> Resp {
    send(
        addr,
        "POST",
        path,
        &[("Content-Type", "application/json")],
        &body.to_string(),
    )
    .await
}

pub async fn get(addr: SocketAddr, path: &str) -> Resp {
    send(addr, "GET", path, &[], "").await
}

fn parse_response(raw: &[u8]) -> Resp {
    let text = String::from_utf8_lossy(raw);
    let (head, rest) = text.split_once("\r\n\r\n").expect("header end");
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .expect("status line");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    let body = if chunked {
        dechunk(rest)
    } else {
        rest.to_string()
    };
    Resp {
        status,
        headers,
        body,
    }
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].strip_prefix("\r\n").unwrap_or(&rest[n..]);
    }
    out
}

/// Opens a streaming request and returns the socket after the first `frames` SSE frames
/// have arrived (so the caller can drop it mid-stream).
pub async fn open_stream(
    addr: SocketAddr,
    path: &str,
    body: &Value,
    frames: usize,
) -> (TcpStream, String) {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let req = raw_request(
        addr,
        "POST",
        path,
        &[("Content-Type", "application/json")],
        &body.to_string(),
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = s.read(&mut buf).await.expect("read");
        assert!(
            n > 0,
            "stream closed early: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buf[..n]);
        if String::from_utf8_lossy(&seen).matches("data: ").count() >= frames {
            return (s, String::from_utf8_lossy(&seen).into_owned());
        }
    }
}

/// A model whose generations emit one token and then wait forever; counts live streams.
pub struct StallingBackend {
    pub live: Arc<AtomicUsize>,
}

struct LiveGuard(Arc<AtomicUsize>);

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl ModelBackend for StallingBackend {
    fn max_model_len(&self) -> usize {
        64
    }
    fn vocab_size(&self) -> usize {
        256
    }
    fn kv_capacity_tokens(&self) -> usize {
        1024
    }
    fn root(&self) -> String {
        "stall".into()
    }
    fn encode(&self, text: &str, _: bool) -> Result<Vec<u32>, String> {
        Ok(text.bytes().map(u32::from).collect())
    }
    fn decode(&self, ids: &[u32], _: bool) -> Result<String, String> {
        Ok(ids.iter().map(|&i| char::from(i as u8)).collect())
    }
    fn render_chat(&self, m: &[ChatMessage]) -> Result<String, String> {
        Ok(m.iter().map(|m| m.content.clone()).collect())
    }
    fn generate(&self, _: ValidRequest) -> Result<EventStream, BackendError> {
        self.live.fetch_add(1, Ordering::SeqCst);
        let guard = LiveGuard(self.live.clone());
        let first = BackendEvent::Token {
            token: TokenOutput {
                token_id: b'x' as u32,
                logprob: None,
                top_logprobs: Vec::new(),
                prompt_logprobs: None,
            },
            text: "x".into(),
        };
        let s = futures::stream::iter([Ok(first)]).chain(futures::stream::pending());
        use futures::StreamExt;
        Ok(s.map(move |e| {
            let _g = &guard;
            e
        })
        .boxed())
    }
    fn stats(&self) -> BoxFuture<'static, Option<BackendStats>> {
        Box::pin(async { Some(BackendStats::default()) })
    }
}

/// Polls `cond` for up to five seconds.
pub async fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    for _ in 0..100 {
        if cond() {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    cond()
}
