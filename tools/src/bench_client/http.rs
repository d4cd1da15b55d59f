//! The HTTP/1.1 client (hyper-util's pooled client, plain http only) and the timing of one
//! streamed request.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

use super::payload::parse_chunk;
use super::sse::{SseData, SseParser};

/// A client bound to one server.
#[derive(Clone)]
pub struct HttpClient {
    client: Client<HttpConnector, Full<Bytes>>,
    base: String,
    api_key: Option<String>,
}

/// Timing and token counts of one request.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RequestRecord {
    /// Seconds from the start of the point to sending the request.
    pub start: f64,
    /// Time to the first generated text (seconds).
    pub ttft: Option<f64>,
    /// Gaps between consecutive chunks of generated text (seconds).
    pub itl: Vec<f64>,
    /// Seconds from sending to the end of the stream.
    pub e2e: f64,
    /// Prompt tokens (the server's count when it sent usage, else the planned length).
    pub prompt_tokens: usize,
    /// Generated tokens (the server's usage when sent, else the text chunks counted).
    pub output_tokens: usize,
    /// Whether `output_tokens` came from the server's usage.
    pub usage_reported: bool,
    /// Why the request failed, if it did.
    pub error: Option<String>,
}

impl HttpClient {
    /// A client for `base_url` (`http://host:port`, an optional path prefix allowed).
    pub fn new(base_url: &str, api_key: Option<String>) -> Result<Self> {
        if !base_url.starts_with("http://") {
            bail!("--base-url must start with http:// (no TLS support), got {base_url}");
        }
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        // No connection reuse: a pooled keep-alive connection that the server closes while
        // the next request is being sent fails that request ("connection closed before
        // message completed"; seen with llama-server), which would count as a server error.
        // A fresh local connection per request costs far less than a generation.
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(0)
            .build(connector);
        Ok(Self {
            client,
            base: base_url.trim_end_matches('/').to_string(),
            api_key,
        })
    }

    fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Request<Full<Bytes>>> {
        let url = format!("{}{}", self.base, path);
        let mut b = Request::builder().method(method).uri(&url);
        if let Some(k) = &self.api_key {
            b = b.header("authorization", format!("Bearer {k}"));
        }
        let bytes = match body {
            Some(v) => {
                b = b.header("content-type", "application/json");
                Bytes::from(serde_json::to_vec(v)?)
            }
            None => Bytes::new(),
        };
        b.body(Full::new(bytes))
            .with_context(|| format!("bad URL {url}"))
    }

    /// GETs `path`; returns the status and the body.
    pub async fn get(&self, path: &str) -> Result<(u16, String)> {
        let req = self.request(Method::GET, path, None)?;
        let resp = self
            .client
            .request(req)
            .await
            .with_context(|| format!("GET {}{path}", self.base))?;
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await?.to_bytes();
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    }

    /// POSTs a streaming request and times it; failures end up in the record's `error`.
    pub async fn stream(
        &self,
        path: &str,
        body: &Value,
        planned_prompt_tokens: usize,
        timeout: Duration,
    ) -> RequestRecord {
        let sent = Instant::now();
        let mut rec = RequestRecord {
            prompt_tokens: planned_prompt_tokens,
            ..Default::default()
        };
        let timed = tokio::time::timeout(timeout, self.stream_into(path, body, sent, &mut rec));
        let outcome = match timed.await {
            Ok(r) => r,
            Err(_) => Err(anyhow::anyhow!(
                "timed out after {:.0} s",
                timeout.as_secs_f64()
            )),
        };
        rec.e2e = sent.elapsed().as_secs_f64();
        if let Err(e) = outcome {
            rec.error = Some(format!("{e:#}"));
        }
        rec
    }

    async fn stream_into(
        &self,
        path: &str,
        body: &Value,
        sent: Instant,
        rec: &mut RequestRecord,
    ) -> Result<()> {
        let req = self.request(Method::POST, path, Some(body))?;
        let resp = self.client.request(req).await.context("connection")?;
        let status = resp.status();
        let mut body = resp.into_body();
        if status != StatusCode::OK {
            let bytes = body
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            let text = String::from_utf8_lossy(&bytes);
            bail!(
                "HTTP {}: {}",
                status.as_u16(),
                text.chars().take(300).collect::<String>()
            );
        }
        let mut parser = SseParser::default();
        let mut last_token: Option<Instant> = None;
        let mut text_chunks = 0usize;
        let mut done = false;
        while !done {
            let events = match body.frame().await {
                Some(frame) => match frame.context("reading the stream")?.into_data() {
                    Ok(data) => parser.push(&data),
                    Err(_) => continue, // trailers
                },
                None => {
                    done = true;
                    parser.finish()
                }
            };
            let now = Instant::now();
            for ev in events {
                let data = match ev {
                    SseData::Done => {
                        done = true;
                        continue;
                    }
                    SseData::Chunk(d) => d,
                };
                let chunk = parse_chunk(&data).map_err(anyhow::Error::msg)?;
                if let Some(e) = chunk.error {
                    bail!("server error in stream: {e}");
                }
                if let Some((p, c)) = chunk.usage {
                    if p > 0 {
                        rec.prompt_tokens = p;
                    }
                    rec.output_tokens = c;
                    rec.usage_reported = true;
                }
                if !chunk.text.is_empty() {
                    text_chunks += 1;
                    match last_token {
                        None => rec.ttft = Some((now - sent).as_secs_f64()),
                        Some(prev) => rec.itl.push((now - prev).as_secs_f64()),
                    }
                    last_token = Some(now);
                }
            }
        }
        if !rec.usage_reported {
            rec.output_tokens = text_chunks;
        }
        Ok(())
    }
}
