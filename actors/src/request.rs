//! What a client asks of a model and what it gets back, token by token.

use dcpserve_kernels::SamplingParams;

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

/// Per-request generation settings.
#[derive(Debug, Clone)]
pub struct GenerationParams {
    pub sampling: SamplingParams,
    /// Most new tokens to generate.
    pub max_tokens: usize,
    /// Seed of this request's sampler; `None` takes one from the engine's seed and the request id.
    pub seed: Option<u64>,
    /// Keep generating past end-of-sequence tokens.
    pub ignore_eos: bool,
    /// Extra token ids that end the sequence.
    pub stop_token_ids: Vec<u32>,
    /// No stop before this many tokens.
    pub min_tokens: usize,
    /// Return the log-probabilities of the sampled token and this many top alternatives.
    pub logprobs: Option<usize>,
    /// Return the log-probability of every prompt token after the first (given the tokens
    /// before it) with this many top alternatives, on the first [`TokenOutput`].
    pub prompt_logprobs: Option<usize>,
    /// Subtracted from the logit of every token already generated (OpenAI's `presence_penalty`).
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per time it was generated (`frequency_penalty`).
    pub frequency_penalty: f32,
    /// Divides positive (multiplies negative) logits of tokens in the prompt or output;
    /// 1 is off (vLLM's and Hugging Face's `repetition_penalty`).
    pub repetition_penalty: f32,
}

impl Default for GenerationParams {
    fn default() -> Self {
        Self {
            sampling: SamplingParams::default(),
            max_tokens: 256,
            seed: None,
            ignore_eos: false,
            stop_token_ids: Vec::new(),
            min_tokens: 0,
            logprobs: None,
            prompt_logprobs: None,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
        }
    }
}

/// A request as the scheduler receives it.
#[derive(Debug, Clone)]
pub struct GenerationRequest {
    pub id: u64,
    pub prompt_ids: Vec<u32>,
    pub params: GenerationParams,
}

/// One generated token.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenOutput {
    pub token_id: u32,
    /// Log-probability of the token under the model (before sampling filters), when asked.
    pub logprob: Option<f32>,
    /// Most likely alternatives with their log-probabilities, when asked.
    pub top_logprobs: Vec<(u32, f32)>,
    /// On the first token of a request that set `prompt_logprobs`: entry `i` scores prompt
    /// token `i + 1` given the tokens before it (the first prompt token has no score).
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
