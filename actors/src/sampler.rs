//! Turning a sequence's logits into its next tokens, on the rank that holds the logits:
//! penalties, stop masks, sampling, verification of drafts, and log-probabilities.
//!
//! Each sequence's sampler lives with the rank's per-sequence state (`SeqStates`, which
//! depends on this module, not the other way round); its random stream starts where the
//! scheduler says (the request's seed, or where the stream stood before a preemption), so
//! the same request draws the same tokens whichever way it is batched.

use dcpserve_kernels::sampling::apply_penalties;
use dcpserve_kernels::spec_sampling::{verify_draft, Verdict};
use dcpserve_kernels::{log_softmax, sample, Rng, SamplingParams};

use serde::{Deserialize, Serialize};

use crate::request::TokenOutput;

/// A sequence's sampling state, sent once to the rank that samples.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SamplerInit {
    pub params: SamplingParams,
    /// Every known token (prompt and output so far): penalties, stop rules and prompt
    /// log-probabilities read them; sampled tokens are appended on the rank.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    /// The request's random stream where the last sample left it.
    pub rng: Rng,
    /// The model's end-of-sequence tokens (stop unless `ignore_eos`).
    pub eos_token_ids: Vec<u32>,
    /// No sequence grows past this many tokens.
    pub max_model_len: usize,
}

/// One sequence's sampling state on the sampling rank.
pub struct SeqSampler {
    params: SamplingParams,
    /// Every known token: prompt, then output.
    tokens: Vec<u32>,
    prompt_len: usize,
    rng: Rng,
    eos_token_ids: Vec<u32>,
    max_model_len: usize,
}

impl SeqSampler {
    pub fn new(init: &SamplerInit) -> Self {
        Self {
            params: init.params.clone(),
            tokens: init.tokens.clone(),
            prompt_len: init.prompt_len,
            rng: init.rng.clone(),
            eos_token_ids: init.eos_token_ids.clone(),
            max_model_len: init.max_model_len,
        }
    }

    /// The random stream where the last draw left it.
    pub fn rng(&self) -> &Rng {
        &self.rng
    }

    fn output_len(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    fn is_stop(&self, t: u32) -> bool {
        (!self.params.ignore_eos && self.eos_token_ids.contains(&t))
            || self.params.stop_token_ids.contains(&t)
    }

    /// Whether the sequence ends with its latest token (the scheduler applies the same rule).
    fn ended(&self) -> bool {
        let last = *self.tokens.last().expect("a token was just appended");
        self.is_stop(last)
            || self.output_len() >= self.params.max_tokens
            || self.tokens.len() >= self.max_model_len
    }

    /// Decides the next tokens from `rows` (the last known token's logits, then one row per
    /// draft token): each draft stands or is replaced by rejection sampling (greedy:
    /// the argmax), until the first replaced draft or a token that ends the sequence; if
    /// every draft stands, the last row gives one more token. Returns the tokens (with the
    /// log-probabilities asked for) and how many of them are drafts that stood.
    pub fn decide(
        &mut self,
        rows: &[&[f32]],
        draft: &[u32],
        draft_probs: Option<&[Vec<f32>]>,
    ) -> (Vec<TokenOutput>, usize) {
        let mut out = Vec::new();
        let mut accepted = 0;
        for (i, logits) in rows.iter().enumerate() {
            let d = draft
                .get(i)
                .map(|&t| (t, draft_probs.map(|p| p[i].as_slice())));
            let (token, was_draft) = self.next_token(logits, d);
            self.tokens.push(token);
            out.push(self.token_output(logits, token));
            accepted += was_draft as usize;
            if self.ended() || !was_draft {
                break;
            }
        }
        (out, accepted)
    }

    /// Samples the next token (or verifies draft `d` by rejection sampling, which draws
    /// from the same distribution). Returns the token and whether it is the draft token.
    fn next_token(&mut self, logits: &[f32], d: Option<(u32, Option<&[f32]>)>) -> (u32, bool) {
        let p = &self.params;
        let penalized = p.penalized();
        let mask_stops = self.output_len() < p.min_tokens;
        let masked;
        let logits = if penalized || mask_stops {
            let mut m = logits.to_vec();
            if penalized {
                let (prompt, output) = self.tokens.split_at(self.prompt_len);
                apply_penalties(
                    &mut m,
                    prompt,
                    output,
                    p.presence_penalty,
                    p.frequency_penalty,
                    p.repetition_penalty,
                );
            }
            if mask_stops {
                for (t, l) in m.iter_mut().enumerate() {
                    if self.is_stop(t as u32) {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
            masked = m;
            &masked[..]
        } else {
            logits
        };
        match d {
            None => (sample(logits, &self.params, &mut self.rng), false),
            Some((d, q)) => match verify_draft(logits, &self.params, d, q, &mut self.rng) {
                Verdict::Accepted => (d, true),
                Verdict::Rejected(t) => (t, false),
            },
        }
    }

    fn token_output(&self, logits: &[f32], token: u32) -> TokenOutput {
        match self.params.logprobs {
            Some(k) => logprobs_of(logits, token, k),
            None => TokenOutput {
                token_id: token,
                logprob: None,
                top_logprobs: Vec::new(),
                prompt_logprobs: None,
            },
        }
    }

    /// The score of the prompt token after position `pos` under `logits` (that position's
    /// row), with the alternatives `prompt_logprobs` asks for.
    pub fn prompt_logprob(&self, logits: &[f32], pos: usize) -> TokenOutput {
        let k = self.params.prompt_logprobs.unwrap_or(0);
        logprobs_of(logits, self.tokens[pos + 1], k)
    }
}

/// The log-probability of `token` under `logits` and the `k` most likely alternatives.
pub fn logprobs_of(logits: &[f32], token: u32, k: usize) -> TokenOutput {
    let lp = log_softmax(logits);
    let mut top: Vec<(u32, f32)> = Vec::new();
    if k > 0 {
        let mut idx: Vec<u32> = (0..lp.len() as u32).collect();
        let k = k.min(idx.len());
        idx.select_nth_unstable_by(k - 1, |&a, &b| lp[b as usize].total_cmp(&lp[a as usize]));
        idx.truncate(k);
        idx.sort_by(|&a, &b| lp[b as usize].total_cmp(&lp[a as usize]).then(a.cmp(&b)));
        top = idx.into_iter().map(|i| (i, lp[i as usize])).collect();
    }
    TokenOutput {
        token_id: token,
        logprob: lp.get(token as usize).copied(),
        top_logprobs: top,
        prompt_logprobs: None,
    }
}
