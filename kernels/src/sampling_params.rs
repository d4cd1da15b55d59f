//! Every per-request sampling setting in one struct, as vLLM's `SamplingParams`: the
//! filters the sampler applies, the penalties and stop rules around it, the seed of the
//! request's random stream, how many tokens to generate, and which log-probabilities to
//! return. It is plain data (serde) because it travels to the rank that samples.

use serde::{Deserialize, Serialize};

/// How one request is sampled. `Default` is plain sampling at temperature 1 with no
/// filtering, no penalties, up to 256 new tokens.
///
/// ```
/// use dcpserve_kernels::SamplingParams;
/// let greedy = SamplingParams { temperature: 0.0, max_tokens: 16, ..Default::default() };
/// assert!(greedy.is_greedy());
/// assert!(!greedy.penalized());
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// Softmax temperature; `< 1e-5` means greedy argmax, `+∞` a uniform draw among the
    /// tokens whose logit is finite (the HTTP API accepts only finite f32 values).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens (0 = off).
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose mass reaches `top_p` (1 = off).
    pub top_p: f32,
    /// Drop tokens whose probability is below `min_p` × the top probability (0 = off).
    pub min_p: f32,
    /// Subtracted from the logit of every token already generated (OpenAI's `presence_penalty`).
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per time it was generated (`frequency_penalty`).
    pub frequency_penalty: f32,
    /// Divides positive (multiplies negative) logits of tokens in the prompt or output;
    /// 1 is off (vLLM's and Hugging Face's `repetition_penalty`).
    pub repetition_penalty: f32,
    /// Seed of this request's sampler; `None` takes one from the engine's seed and the
    /// request id.
    pub seed: Option<u64>,
    /// Most new tokens to generate.
    pub max_tokens: usize,
    /// No stop before this many tokens.
    pub min_tokens: usize,
    /// Extra token ids that end the sequence.
    pub stop_token_ids: Vec<u32>,
    /// Keep generating past end-of-sequence tokens.
    pub ignore_eos: bool,
    /// Return the log-probabilities of the sampled token and this many top alternatives.
    pub logprobs: Option<usize>,
    /// Return the log-probability of every prompt token after the first (given the tokens
    /// before it) with this many top alternatives, with the first generated token.
    pub prompt_logprobs: Option<usize>,
    /// Constrain the generated text to a grammar (structured outputs, forced tool calls).
    /// `None` leaves the output free.
    pub constraint: Option<OutputConstraint>,
}

/// What the generated text must match, as the grammar engine compiles it (OpenAI's
/// `response_format`, vLLM's `guided_*` / `structured_outputs` fields, and the grammar a
/// forced tool call is generated under). Schemas and grammars stay text so that this crate
/// does not parse JSON; the grammar engine does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum OutputConstraint {
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    JsonObject,
    /// JSON valid against this JSON schema (the schema's JSON text).
    JsonSchema(String),
    /// Text matching this regular expression.
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// Text in the language of this Lark grammar (llguidance's dialect).
    Lark(String),
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            seed: None,
            max_tokens: 256,
            min_tokens: 0,
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            logprobs: None,
            prompt_logprobs: None,
            constraint: None,
        }
    }
}

impl SamplingParams {
    /// Whether only the most likely token can come out (no random draw decides).
    pub fn is_greedy(&self) -> bool {
        self.temperature.is_nan() || self.temperature < 1e-5 || self.top_k == 1
    }

    /// Whether any penalty changes the logits before sampling.
    pub fn penalized(&self) -> bool {
        self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
            || self.repetition_penalty != 1.0
    }
}
