//! Runs the choices of one request: starts a generation per choice, cuts each output at its
//! first stop string (dropping the generation so the engine aborts it and frees its KV
//! blocks), and merges the choices into one stream of events.

use std::sync::Arc;
use std::time::Instant;

use dcpserve_actors::{FinishReason, TokenOutput, ValidRequest};
use futures::stream::{BoxStream, StreamExt};

use crate::backend::{BackendEvent, EventStream};
use crate::errors::ApiError;
use crate::metrics::{RequestTimer, SequenceTimer};
use crate::router::{ModelSlot, Permit};

/// One choice to generate.
pub struct ChoiceSpec {
    /// Index of the choice in the response.
    pub index: usize,
    /// Which prompt of the request this choice continues: the choices of one prompt are
    /// accounted (prompt tokens, finished requests) as one request.
    pub prompt: usize,
    /// The prompt (checked against the model) and this choice's settings.
    pub request: ValidRequest,
}

/// How a choice ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Finish {
    /// `stop` or `length` (`abort` only when the engine aborted on its own).
    pub reason: &'static str,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
}

/// New output of one choice.
#[derive(Debug, Clone, PartialEq)]
pub struct ChoiceEvent {
    pub index: usize,
    /// Text safe to show now (held back while it could still begin a stop string).
    pub text: String,
    /// The token that produced this event, if any.
    pub token: Option<TokenOutput>,
    pub finish: Option<Finish>,
}

/// The merged events of all choices; holds the admission permit until dropped.
pub type ChoiceStream = BoxStream<'static, Result<ChoiceEvent, ApiError>>;

/// Starts every choice (failing before anything is streamed if one cannot start).
pub fn start(
    slot: &ModelSlot,
    specs: Vec<ChoiceSpec>,
    stop: Vec<String>,
    arrival: Instant,
    permit: Permit,
) -> Result<ChoiceStream, ApiError> {
    let stop = Arc::new(stop);
    let hold = stop.iter().map(|s| s.len()).max().unwrap_or(1) - 1;
    let mut runners = Vec::with_capacity(specs.len());
    let mut requests: Vec<(usize, Arc<RequestTimer>)> = Vec::new();
    for spec in specs {
        let prompt_len = spec.request.prompt().len();
        let request = match requests.iter().find(|(p, _)| *p == spec.prompt) {
            Some((_, r)) => r.clone(),
            None => {
                let r = RequestTimer::new(&slot.name, arrival, prompt_len);
                requests.push((spec.prompt, r.clone()));
                r
            }
        };
        let inner = slot
            .backend
            .generate(spec.request)
            .map_err(ApiError::from_backend)?;
        runners.push(Runner {
            index: spec.index,
            inner: Some(inner),
            stop: stop.clone(),
            hold,
            output: String::new(),
            emitted: 0,
            tokens: 0,
            prompt_len,
            timer: SequenceTimer::new(request),
            done: false,
        });
    }
    let streams = runners.into_iter().map(|r| {
        futures::stream::unfold(r, |mut r| async move {
            let item = r.next().await?;
            Some((item, r))
        })
        .boxed()
    });
    let merged = futures::stream::select_all(streams);
    // The permit lives as long as the stream: dropping the stream releases the admission.
    Ok(merged
        .map(move |item| {
            let _keep = &permit;
            item
        })
        .boxed())
}

/// Everything one choice produced, for non-streaming responses.
#[derive(Debug, Clone)]
pub struct ChoiceResult {
    pub text: String,
    pub tokens: Vec<TokenOutput>,
    pub finish: Finish,
}

/// Drains the stream into `count` choice results (indexed by choice index).
pub async fn collect(
    mut stream: ChoiceStream,
    count: usize,
) -> Result<Vec<ChoiceResult>, ApiError> {
    let mut out: Vec<Option<ChoiceResult>> = vec![None; count];
    let mut texts = vec![String::new(); count];
    let mut tokens: Vec<Vec<TokenOutput>> = vec![Vec::new(); count];
    while let Some(ev) = stream.next().await {
        let ev = ev?;
        let i = ev.index;
        if i >= count {
            continue;
        }
        texts[i].push_str(&ev.text);
        if let Some(t) = ev.token {
            tokens[i].push(t);
        }
        if let Some(f) = ev.finish {
            out[i] = Some(ChoiceResult {
                text: std::mem::take(&mut texts[i]),
                tokens: std::mem::take(&mut tokens[i]),
                finish: f,
            });
        }
    }
    out.into_iter()
        .map(|c| c.ok_or_else(|| ApiError::internal("A choice ended without finishing.")))
        .collect()
}

struct Runner {
    index: usize,
    /// Dropping it aborts the engine's request.
    inner: Option<EventStream>,
    stop: Arc<Vec<String>>,
    /// Bytes held back at the end of the output: the longest stop string minus one.
    hold: usize,
    output: String,
    emitted: usize,
    tokens: usize,
    prompt_len: usize,
    timer: SequenceTimer,
    done: bool,
}

impl Drop for Runner {
    fn drop(&mut self) {
        if !self.done {
            // The client went away (or another choice failed) before this one finished.
            self.timer.finish("abort");
        }
    }
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

impl Runner {
    fn end(&mut self, reason: &'static str) -> Finish {
        self.done = true;
        self.inner = None;
        self.timer.finish(reason);
        Finish {
            reason,
            prompt_tokens: self.prompt_len,
            completion_tokens: self.tokens,
        }
    }

    /// Earliest stop string in the not yet emitted output. A match always starts at or
    /// after `emitted`: text is held back as long as it could begin one.
    fn find_stop(&self) -> Option<usize> {
        let tail = &self.output[self.emitted..];
        self.stop
            .iter()
            .filter_map(|s| tail.find(s.as_str()))
            .min()
            .map(|p| self.emitted + p)
    }

    async fn next(&mut self) -> Option<Result<ChoiceEvent, ApiError>> {
        if self.done {
            return None;
        }
        let ev = self.inner.as_mut()?.next().await;
        match ev {
            None => {
                self.end("error");
                Some(Err(ApiError::internal(
                    "The generation ended without finishing.",
                )))
            }
            Some(Err(e)) => {
                self.end("error");
                Some(Err(ApiError::from_backend(e)))
            }
            Some(Ok(BackendEvent::Token { token, text })) => {
                self.timer.token();
                self.tokens += 1;
                self.output.push_str(&text);
                if let Some(pos) = self.find_stop() {
                    self.output.truncate(pos);
                    let text = self.output[self.emitted..].to_string();
                    self.emitted = pos;
                    let finish = self.end("stop");
                    return Some(Ok(ChoiceEvent {
                        index: self.index,
                        text,
                        token: Some(token),
                        finish: Some(finish),
                    }));
                }
                let safe =
                    floor_char_boundary(&self.output, self.output.len().saturating_sub(self.hold))
                        .max(self.emitted);
                let text = self.output[self.emitted..safe].to_string();
                self.emitted = safe;
                Some(Ok(ChoiceEvent {
                    index: self.index,
                    text,
                    token: Some(token),
                    finish: None,
                }))
            }
            Some(Ok(BackendEvent::Finished { reason, .. })) => {
                let text = self.output[self.emitted..].to_string();
                self.emitted = self.output.len();
                let reason = match reason {
                    FinishReason::Stop => "stop",
                    FinishReason::Length => "length",
                    FinishReason::Abort => "abort",
                };
                let finish = self.end(reason);
                Some(Ok(ChoiceEvent {
                    index: self.index,
                    text,
                    token: None,
                    finish: Some(finish),
                }))
            }
        }
    }
}
