//! What the HTTP layer needs from a served model, as a trait so that the server does not
//! depend on the engine crate (which depends on this one for `dcpserve serve`) and so that
//! tests can serve stand-in models.

use std::pin::Pin;

use dcpserve_actors::{FinishReason, OutputConstraint, TokenOutput, ValidRequest};
use dcpserve_model::ChatMessage;
use futures::future::BoxFuture;
use futures::Stream;

/// One step of a generation as the backend reports it.
#[derive(Debug, Clone, PartialEq)]
pub enum BackendEvent {
    /// A new token and the text it completes (empty while a UTF-8 character is incomplete).
    Token { token: TokenOutput, text: String },
    /// The end of the generation.
    Finished {
        reason: FinishReason,
        prompt_tokens: usize,
        completion_tokens: usize,
    },
}

/// The events of one generation; dropping it must abort the generation and free its state.
pub type EventStream = Pin<Box<dyn Stream<Item = Result<BackendEvent, BackendError>> + Send>>;

/// Why a generation could not start or did not finish, with what the client should do
/// about it (the HTTP status follows from [`BackendErrorKind`]).
///
/// ```
/// use dcpserve_api::{BackendError, BackendErrorKind};
/// let e = BackendError::unavailable("The model cannot serve: rank process 1 was lost");
/// assert_eq!(e.kind, BackendErrorKind::Unavailable);
/// // A plain message is an engine failure.
/// assert_eq!(BackendError::from("boom".to_string()).kind, BackendErrorKind::Failed);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendError {
    /// What kind of failure (maps to 400, 503 or 500).
    pub kind: BackendErrorKind,
    /// The message the client reads.
    pub message: String,
}

/// The cause of a [`BackendError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendErrorKind {
    /// The request can never be served as it is (400).
    InvalidRequest,
    /// The model cannot serve now: its ranks were lost or are being restarted, or the
    /// engine stopped (503; the request may be retried, elsewhere or later).
    Unavailable,
    /// The engine failed otherwise (500).
    Failed,
}

impl BackendError {
    /// A request refused as it is.
    pub fn invalid_request(message: impl Into<String>) -> Self {
        Self {
            kind: BackendErrorKind::InvalidRequest,
            message: message.into(),
        }
    }

    /// A model that cannot serve now.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self {
            kind: BackendErrorKind::Unavailable,
            message: message.into(),
        }
    }
}

/// A bare message is an engine failure (500).
impl From<String> for BackendError {
    fn from(message: String) -> Self {
        Self {
            kind: BackendErrorKind::Failed,
            message,
        }
    }
}

impl std::fmt::Display for BackendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Counters of a served model, read when `/metrics` is rendered.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BackendStats {
    /// Why the model cannot serve (its ranks are lost for good), if so: `/health` answers
    /// 503 with it.
    pub unavailable: Option<String>,
    /// Sequences in the running batch.
    pub running: usize,
    /// Sequences waiting for admission (including preempted ones).
    pub waiting: usize,
    /// Fraction of virtual KV-cache blocks in use, in `[0, 1]`, one entry per rank (equal on
    /// all ranks when block tables are global, as in the engine).
    pub kv_cache_usage: Vec<f64>,
    /// Sequences preempted since start.
    pub preemptions: u64,
    /// Share of prompt tokens served from the prefix cache, when the engine tracks it.
    pub prefix_cache_hit_rate: Option<f64>,
    /// Seconds spent in collectives since start, per rank, when the engine tracks it.
    pub collective_seconds: Vec<f64>,
    /// Speculative decoding counters, when the model speculates.
    pub speculation: Option<SpeculationCounters>,
}

/// Drafted and accepted tokens of a speculating model, since start.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SpeculationCounters {
    /// Verification steps with at least one draft token.
    pub num_drafts: u64,
    pub num_draft_tokens: u64,
    pub num_accepted_tokens: u64,
    /// `drafts_by_accepted[a]`: drafts of which exactly `a` tokens were accepted.
    pub drafts_by_accepted: Vec<u64>,
}

/// A served model: tokenizer, chat template, limits and generation.
pub trait ModelBackend: Send + Sync + 'static {
    /// Longest prompt + output the model accepts, in tokens.
    fn max_model_len(&self) -> usize;
    /// Token ids must be below this.
    fn vocab_size(&self) -> usize;
    /// Most tokens the KV cache can hold for one sequence (prompts beyond never fit).
    fn kv_capacity_tokens(&self) -> usize;
    /// Where the model was loaded from (shown by `/v1/models`).
    fn root(&self) -> String;
    /// Tokenizes text; `add_special_tokens` adds BOS when the model wants one.
    fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, String>;
    /// Turns token ids back into text.
    fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, String>;
    /// Renders a conversation with the model's chat template and a generation prompt.
    fn render_chat(&self, messages: &[ChatMessage]) -> Result<String, String>;
    /// Renders a chat-template context: `messages` as JSON (with `tool_calls`,
    /// `tool_call_id`), `tools` when the request has them, `add_generation_prompt`. The
    /// default renders roles and text contents with [`ModelBackend::render_chat`].
    fn render_chat_context(&self, context: &serde_json::Value) -> Result<String, String> {
        let messages = context["messages"]
            .as_array()
            .map(|m| {
                m.iter()
                    .map(|m| {
                        ChatMessage::new(
                            m["role"].as_str().unwrap_or_default(),
                            m["content"].as_str().unwrap_or_default(),
                        )
                    })
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        self.render_chat(&messages)
    }
    /// Starts a generation of a request validated by the HTTP layer.
    fn generate(&self, request: ValidRequest) -> Result<EventStream, BackendError>;
    /// Compiles `constraint` with the model's grammar engine (structured outputs); `Err`
    /// carries the engine's message. A backend without a grammar engine refuses every
    /// constraint.
    fn check_constraint(&self, constraint: &OutputConstraint) -> Result<(), String> {
        let _ = constraint;
        Err("this model does not support structured outputs".into())
    }
    /// Current counters, or `None` when the model cannot answer.
    fn stats(&self) -> BoxFuture<'static, Option<BackendStats>>;
    /// The KV cache's layout, blocks and sequences for `/v1/engine/status`, or `None`
    /// when the model cannot answer. A backend without a KV cache of its own (a test
    /// stand-in) reports none, and the endpoint says so for that model.
    fn kv_status(&self) -> BoxFuture<'static, Option<crate::kv_status::KvStatus>> {
        Box::pin(async { None })
    }
}
