//! OpenAI-compatible request and response bodies.
//!
//! Requests keep fields that take several shapes (`prompt`, `stop`, `messages`) as raw JSON
//! so that the `validation` module can answer precise messages instead of serde's "did not
//! match any variant". A field no type here reads is refused by name (the
//! `request_fields` module, which lists each type's fields), as OpenAI's own server does.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Sampling fields shared by completions and chat completions.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SamplingFields {
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub n: Option<i64>,
    pub stop: Option<Value>,
    pub stop_token_ids: Option<Vec<i64>>,
    pub seed: Option<i64>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub ignore_eos: Option<bool>,
    pub min_tokens: Option<i64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub repetition_penalty: Option<f64>,
    /// Structured outputs (`response_format`, `guided_*`, `structured_outputs`).
    #[serde(flatten)]
    pub constraint: crate::structured::ConstraintFields,
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct CompletionRequest {
    pub model: Option<String>,
    /// string, [string], [int] or [[int]].
    pub prompt: Option<Value>,
    pub max_tokens: Option<i64>,
    /// Number of top alternatives to return with each token (at most 20).
    pub logprobs: Option<i64>,
    pub echo: Option<bool>,
    /// vLLM's option: logprob tokens as `token_id:{id}` instead of text.
    pub return_tokens_as_token_ids: Option<bool>,
    #[serde(flatten)]
    pub sampling: SamplingFields,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ChatCompletionRequest {
    pub model: Option<String>,
    pub messages: Option<Value>,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<i64>,
    /// vLLM's option: logprob tokens as `token_id:{id}` instead of text.
    pub return_tokens_as_token_ids: Option<bool>,
    /// Function definitions `[{"type": "function", "function": {name, description,
    /// parameters}}]` (checked by `crate::tools`).
    pub tools: Option<Value>,
    /// `"none"`, `"auto"`, `"required"` or `{"type": "function", "function": {"name": ..}}`.
    pub tool_choice: Option<Value>,
    #[serde(flatten)]
    pub sampling: SamplingFields,
}

/// Token counts of a response.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
}

impl Usage {
    pub fn new(prompt_tokens: usize, completion_tokens: usize) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
        }
    }
}

/// Legacy completions' logprobs (parallel arrays).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct CompletionLogprobs {
    pub text_offset: Vec<usize>,
    pub token_logprobs: Vec<Option<f32>>,
    pub tokens: Vec<String>,
    pub top_logprobs: Vec<Option<serde_json::Map<String, Value>>>,
}

/// One choice of a completion (or a chunk of one).
#[derive(Debug, Clone, Serialize)]
pub struct CompletionChoice {
    pub index: usize,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: Option<&'static str>,
}

/// A completion response or stream chunk (`object` tells which).
#[derive(Debug, Clone, Serialize)]
pub struct CompletionResponse {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    #[serde(skip_serializing_if = "Skip::is_skipped")]
    pub usage: Skip<Usage>,
}

/// A field that is absent, `null`, or set (OpenAI's chunks carry `"usage": null` only
/// when usage was asked for).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub enum Skip<T> {
    #[default]
    Absent,
    Null,
    Some(T),
}

impl<T> Skip<T> {
    pub fn is_skipped(&self) -> bool {
        matches!(self, Skip::Absent)
    }
}

impl<T: Serialize> Serialize for Skip<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Skip::Some(v) => v.serialize(s),
            _ => s.serialize_none(),
        }
    }
}

/// One alternative in chat logprobs.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ChatTopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

/// One generated token in chat logprobs.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ChatTokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<ChatTopLogprob>,
}

/// Chat logprobs of a choice.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct ChatLogprobs {
    pub content: Vec<ChatTokenLogprob>,
}

/// The assistant's message.
#[derive(Debug, Clone, Serialize)]
pub struct ChatMessageOut {
    pub role: &'static str,
    /// `null` when the answer is only tool calls.
    pub content: Option<String>,
    /// The model's `<think>` reasoning, with `--reasoning-parser`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallOut>,
}

/// A tool call in a message.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ToolCallOut {
    /// `call_` and 24 random characters.
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionCallOut,
}

/// The function a tool call calls.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct FunctionCallOut {
    pub name: String,
    /// The arguments as JSON text.
    pub arguments: String,
}

/// A piece of a streamed tool call: the first carries `id`, `type` and the name; later ones
/// only pieces of `arguments`. Clients join them by `index`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ToolCallDelta {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    pub function: FunctionDelta,
}

/// The function part of a [`ToolCallDelta`].
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct FunctionDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}

/// One choice of a chat completion.
#[derive(Debug, Clone, Serialize)]
pub struct ChatChoice {
    pub index: usize,
    pub message: ChatMessageOut,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
}

/// A chat completion.
#[derive(Debug, Clone, Serialize)]
pub struct ChatCompletionResponse {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
}

/// What changed in a streamed chat choice.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ChatDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

/// One choice of a chat stream chunk.
#[derive(Debug, Clone, Serialize)]
pub struct ChatChunkChoice {
    pub index: usize,
    pub delta: ChatDelta,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
}

/// A chat stream chunk.
#[derive(Debug, Clone, Serialize)]
pub struct ChatCompletionChunk {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChunkChoice>,
    #[serde(skip_serializing_if = "Skip::is_skipped")]
    pub usage: Skip<Usage>,
}

/// `GET /v1/models` entry.
#[derive(Debug, Clone, Serialize)]
pub struct ModelCard {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
    pub root: String,
    pub parent: Option<String>,
    pub max_model_len: usize,
}

/// `GET /v1/models`.
#[derive(Debug, Clone, Serialize)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<ModelCard>,
}

/// `POST /tokenize` (vLLM): either `prompt` or `messages`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct TokenizeRequest {
    pub model: Option<String>,
    pub prompt: Option<String>,
    pub messages: Option<Value>,
    /// Tools for the chat template, with `messages`.
    pub tools: Option<Value>,
    pub add_special_tokens: Option<bool>,
    pub return_token_strs: Option<bool>,
}

/// `POST /tokenize` answer.
#[derive(Debug, Clone, Serialize)]
pub struct TokenizeResponse {
    pub count: usize,
    pub max_model_len: usize,
    pub tokens: Vec<u32>,
    pub token_strs: Option<Vec<String>>,
}

/// `POST /detokenize` (vLLM).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct DetokenizeRequest {
    pub model: Option<String>,
    pub tokens: Vec<i64>,
}

/// `POST /detokenize` answer.
#[derive(Debug, Clone, Serialize)]
pub struct DetokenizeResponse {
    pub prompt: String,
}

/// Seconds since the Unix epoch (OpenAI's `created`).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A response id: `prefix-` + time + a process-wide counter (unique without a uuid crate).
pub fn new_id(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0);
    format!("{prefix}-{t:x}{n:06x}")
}
