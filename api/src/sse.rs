//! Server-sent events in OpenAI's format: `data: {json}` frames ending with `data: [DONE]`.
//! An error after the stream started is sent as a `data: {"error": ...}` frame.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};

use futures::stream::{BoxStream, Stream, StreamExt};
use serde::Serialize;
use warp::http::HeaderValue;
use warp::reply::Response;
use warp::Reply;

use crate::generation::{ChoiceEvent, ChoiceStream};

/// Turns choice events into frames for one endpoint's chunk format.
pub trait ChunkFormatter: Send + 'static {
    /// Frames for one event (possibly none).
    fn frames(&mut self, event: ChoiceEvent, out: &mut String);
    /// Frames after the last event (the usage chunk), before `[DONE]`.
    fn finish(&mut self, out: &mut String);
}

/// Appends `data: {json}\n\n`.
pub fn push_frame<T: Serialize>(out: &mut String, value: &T) {
    out.push_str("data: ");
    out.push_str(&serde_json::to_string(value).unwrap_or_else(|_| "{}".into()));
    out.push_str("\n\n");
}

const DONE: &str = "data: [DONE]\n\n";

/// The SSE response for a running request; dropping it (client gone) drops the choices,
/// which aborts their generations.
pub fn response<F: ChunkFormatter>(events: ChoiceStream, fmt: F) -> Response {
    let frames = futures::stream::unfold(Some((events, fmt)), |state| async move {
        let (mut events, mut fmt) = state?;
        loop {
            let mut out = String::new();
            match events.next().await {
                Some(Ok(ev)) => {
                    fmt.frames(ev, &mut out);
                    if !out.is_empty() {
                        return Some((out, Some((events, fmt))));
                    }
                }
                Some(Err(e)) => {
                    out.push_str("data: ");
                    out.push_str(&e.body_json());
                    out.push_str("\n\n");
                    out.push_str(DONE);
                    return Some((out, None));
                }
                None => {
                    fmt.finish(&mut out);
                    out.push_str(DONE);
                    return Some((out, None));
                }
            }
        }
    })
    .map(|s| Ok::<_, Infallible>(bytes::Bytes::from(s)));
    let body = SyncStream(Mutex::new(frames.boxed()));
    let mut r = warp::reply::stream(body).into_response();
    let h = r.headers_mut();
    h.insert(
        "content-type",
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert("cache-control", HeaderValue::from_static("no-cache"));
    r
}

/// Makes a `Send` stream `Sync` (warp's body wants both) without `unsafe`: polling takes
/// `&mut self`, so the mutex is never contended and `get_mut` needs no locking.
struct SyncStream<T>(Mutex<BoxStream<'static, T>>);

impl<T> Stream for SyncStream<T> {
    type Item = T;
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let inner = self
            .get_mut()
            .0
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        inner.as_mut().poll_next(cx)
    }
}
