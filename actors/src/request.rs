//! What a client asks of a model and what it gets back, token by token.

use dcpserve_kernels::SamplingParams;
use serde::{Deserialize, Serialize};

/// Why a sequence stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence or stop token was produced (or a stop string matched upstream).
    Stop,
    /// `max_tokens` or the model length was reached.
    Length,
    /// The client went away or asked to stop.
    Abort,
}

impl FinishReason {
    /// OpenAI's spelling.
    pub fn as_str(&self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
        }
    }
}

/// A request as the scheduler receives it.
#[derive(Debug, Clone)]
pub struct GenerationRequest {
    pub id: u64,
    pub prompt_ids: Vec<u32>,
    /// Every sampling setting of the request, how many tokens to generate included.
    pub params: SamplingParams,
}

/// One generated token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenOutput {
    pub token_id: u32,
    /// Log-probability of the token under the model (before sampling filters), when asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprob: Option<f32>,
    /// Most likely alternatives with their log-probabilities, when asked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub top_logprobs: Vec<(u32, f32)>,
    /// On the first token of a request that set `prompt_logprobs`: entry `i` scores prompt
    /// token `i + 1` given the tokens before it (the first prompt token has no score).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<Vec<TokenOutput>>,
}

/// What the scheduler streams back for a request.
#[derive(Debug, Clone, PartialEq)]
pub enum RequestEvent {
    Token(TokenOutput),
    Finished {
        reason: FinishReason,
        prompt_tokens: usize,
        completion_tokens: usize,
    },
    /// The request could not be served (rejected, or its rank group failed).
    Error(String),
}
