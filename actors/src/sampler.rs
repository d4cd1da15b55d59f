//! Turning a sequence's logits into its next tokens, on the rank that holds the logits:
//! penalties, stop masks, sampling, verification of drafts, and log-probabilities.
//!
//! Each sequence's sampler lives with the rank's per-sequence state (`SeqStates`, which
//! depends on this module, not the other way round); its random stream starts where the
//! scheduler says (the request's seed, or where the stream stood before a preemption), so
//! the same request draws the same tokens whichever way it is batched.

use std::sync::Arc;

use dcpserve_kernels::row_sampling::RowDrawn;
use dcpserve_kernels::sampling::{apply_penalties, token_logprobs};
use dcpserve_kernels::spec_sampling::{verify_draft, Verdict};
use dcpserve_kernels::{sample, OutputConstraint, Rng, SamplingParams};
use dcpserve_model::{GrammarCompiler, GrammarMatcher, TokenMask};

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

/// Where the sampling rank gets its grammar engine (built on the first constrained request).
pub type GrammarSource = Arc<dyn Fn() -> Result<Arc<GrammarCompiler>, String> + Send + Sync>;

/// A constrained sequence's grammar state on the sampling rank.
///
/// The matcher lives here, with the sampler, rather than in the scheduler: the sampling
/// rank learns each token first (it samples it), so it can compute the next step's masks
/// as soon as that step's plan arrives, on a helper thread while the rank runs its share
/// of the forward pass (as vLLM overlaps its grammar bitmask with the model), without a
/// round trip to the scheduler and without sending vocabulary-sized bitmasks in plans
/// (which stay small and serializable: they carry the constraint as text). Draft tokens
/// are checked here too, where they are verified. After a preemption or a restart the
/// plan's `SamplerInit` carries every token so far, and the matcher is rebuilt from them.
struct SeqGrammar {
    constraint: OutputConstraint,
    /// The token a sequence whose grammar cannot be built is ended with.
    eos: u32,
    /// Built on first use (on the mask thread) from the constraint and `replay`.
    matcher: Option<GrammarMatcher>,
    /// Output tokens the matcher has yet to consume when it is built.
    replay: Vec<u32>,
    /// The masks of the coming step: `masks[i]` for the token after `draft[..i]`.
    masks: Vec<TokenMask>,
    /// Where the matcher's compiler comes from.
    source: Option<GrammarSource>,
}

impl SeqGrammar {
    /// Builds the matcher if needed and computes the masks along `draft` (see
    /// [`GrammarMatcher::masks_along`]).
    fn prepare(&mut self, draft: &[u32]) {
        match self.matcher() {
            Some(m) => self.masks = m.masks_along(draft),
            // The sequence is made to stop (only end-of-sequence is allowed).
            None => self.masks = vec![TokenMask::from_tokens(self.eos as usize + 1, &[self.eos])],
        }
    }

    /// The matcher, built on first use; `None` when it cannot be built.
    fn matcher(&mut self) -> Option<&mut GrammarMatcher> {
        if self.matcher.is_none() {
            let built = self
                .source
                .as_ref()
                .ok_or_else(|| "this rank has no grammar engine".to_string())
                .and_then(|s| s())
                .and_then(|c| {
                    let mut m = c.matcher(&self.constraint)?;
                    m.consume(&self.replay)?;
                    Ok(m)
                });
            match built {
                Ok(m) => self.matcher = Some(m),
                Err(e) => {
                    // The HTTP layer compiled this constraint already: this is not expected.
                    tracing::error!(
                        "structured output constraint failed on the sampling rank: {e}"
                    );
                    return None;
                }
            }
            self.replay.clear();
        }
        self.matcher.as_mut()
    }
}

/// One sequence's sampling state on the sampling rank.
pub struct SeqSampler {
    params: SamplingParams,
    grammar: Option<SeqGrammar>,
    /// Every known token: prompt, then output.
    tokens: Vec<u32>,
    prompt_len: usize,
    rng: Rng,
    eos_token_ids: Vec<u32>,
    max_model_len: usize,
}

impl SeqSampler {
    pub fn new(init: &SamplerInit) -> Self {
        let grammar = init.params.constraint.clone().map(|constraint| SeqGrammar {
            constraint,
            eos: init.eos_token_ids.first().copied().unwrap_or(0),
            matcher: None,
            replay: init.tokens[init.prompt_len.min(init.tokens.len())..].to_vec(),
            masks: Vec::new(),
            source: None,
        });
        Self {
            params: init.params.clone(),
            grammar,
            tokens: init.tokens.clone(),
            prompt_len: init.prompt_len,
            rng: init.rng.clone(),
            eos_token_ids: init.eos_token_ids.clone(),
            max_model_len: init.max_model_len,
        }
    }

    /// Whether the output is constrained by a grammar.
    pub fn is_constrained(&self) -> bool {
        self.grammar.is_some()
    }

    /// Gives a constrained sequence its grammar engine (without one, a constrained
    /// sequence can only end).
    pub fn with_grammar(mut self, source: Option<GrammarSource>) -> Self {
        if let Some(g) = &mut self.grammar {
            g.source = source;
        }
        self
    }

    /// Computes the grammar masks of the coming step (the next token and each position of
    /// `draft`), building the matcher on first use. Meant to run while the rank computes
    /// the step's logits; [`SeqSampler::decide`] computes them itself when this was not
    /// called. Does nothing for an unconstrained sequence.
    pub fn prepare_masks(&mut self, draft: &[u32]) {
        let token_first = draft.is_empty() && self.checks_token_first();
        if let Some(g) = &mut self.grammar {
            if token_first {
                // Only the matcher: `decide` asks it about one token, and computes the
                // mask only if the grammar rejects that token.
                g.matcher();
            } else {
                g.prepare(draft);
            }
        }
    }

    /// Whether a constrained step can take the unconstrained choice when the grammar
    /// allows it: greedy without log-probabilities, where the argmax of the raw logits,
    /// if allowed, is the argmax of the masked ones too (masking only removes tokens).
    /// Checking one token costs far less than the vocabulary-wide mask (~0.35 ms per
    /// sequence and step on the default model), which on a busy CPU competes with the
    /// forward pass.
    fn checks_token_first(&self) -> bool {
        self.grammar.is_some() && self.params.is_greedy() && self.params.logprobs.is_none()
    }

    /// The greedy token of `logits` if the grammar allows it (see
    /// [`SeqSampler::checks_token_first`]), recorded as decided; `None` when the mask must
    /// decide (the grammar rejects it, it is a stop token, or the masks are computed
    /// already).
    fn decide_unmasked(&mut self, logits: &[f32]) -> Option<TokenOutput> {
        if !self.checks_token_first() || self.grammar.as_ref().is_some_and(|g| !g.masks.is_empty())
        {
            return None;
        }
        let rng = self.rng.clone();
        let (token, _) = self.next_token(logits, None, None);
        // Greedy takes no random number; the stream stays where it is all the same.
        self.rng = rng;
        if self.is_stop(token) {
            return None;
        }
        let allowed = self
            .grammar
            .as_mut()
            .and_then(|g| g.matcher())
            .is_some_and(|m| m.allows_next(token));
        if !allowed {
            return None;
        }
        self.push_token(token);
        Some(self.token_output(logits, token))
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
        if let ([logits], []) = (rows, draft) {
            if let Some(out) = self.decide_unmasked(logits) {
                return (vec![out], 0);
            }
        }
        // Masks are normally ready (computed during the forward pass); if not, now.
        if let Some(g) = &mut self.grammar {
            if g.masks.is_empty() {
                g.prepare(draft);
            }
        }
        let masks = self.grammar.as_mut().map(|g| std::mem::take(&mut g.masks));
        let mut out = Vec::new();
        let mut accepted = 0;
        for (i, logits) in rows.iter().enumerate() {
            let d = draft
                .get(i)
                .map(|&t| (t, draft_probs.map(|p| p[i].as_slice())));
            // A draft position past the grammar's look-ahead is never reached: the look-ahead
            // stops at the first draft token the grammar rejects, which is rejected here.
            let mask = masks.as_ref().map(|m| m.get(i).or(m.last()));
            let (token, was_draft, output) = match mask {
                Some(Some(mask)) => {
                    let mut masked = logits.to_vec();
                    mask.apply(&mut masked);
                    let (token, was_draft) = self.next_token(&masked, d, Some(mask));
                    (token, was_draft, self.token_output(&masked, token))
                }
                Some(None) => {
                    // No mask could be computed: end the sequence.
                    let token = self.eos_token_ids.first().copied().unwrap_or(0);
                    (token, false, self.token_output(logits, token))
                }
                None => {
                    let (token, was_draft) = self.next_token(logits, d, None);
                    (token, was_draft, self.token_output(logits, token))
                }
            };
            self.push_token(token);
            out.push(output);
            accepted += was_draft as usize;
            if self.ended() || !was_draft {
                break;
            }
        }
        (out, accepted)
    }

    /// Records a decided token: the sequence grows by it and the grammar (if any)
    /// consumes it.
    fn push_token(&mut self, token: u32) {
        self.tokens.push(token);
        if let Some(m) = self.grammar.as_mut().and_then(|g| g.matcher.as_mut()) {
            if let Err(e) = m.consume(&[token]) {
                tracing::warn!("grammar matcher refused token {token}: {e}");
            }
        }
    }

    /// What a [`RowDraw`](dcpserve_kernels::row_sampling::RowDraw) of this sequence's next token needs, when the token can be
    /// drawn from the raw logits row: no grammar, no penalties, no stop tokens held back
    /// by `min_tokens` (the host path changes the logits for those, so they are drawn
    /// there). Returns the uniform number the host path would take from the stream (a
    /// copy of it: [`SeqSampler::accept_drawn`] advances the stream itself, only when
    /// the number was used) and the top log-probabilities asked for.
    pub fn device_draw(&self) -> Option<(Option<f64>, Option<usize>)> {
        let p = &self.params;
        if self.grammar.is_some() || p.penalized() || self.output_len() < p.min_tokens {
            return None;
        }
        let uniform = (!p.is_greedy()).then(|| self.rng.clone().next_f64());
        Some((uniform, p.logprobs))
    }

    /// The sampling parameters.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Takes the answer to this sequence's [`SeqSampler::device_draw`] as
    /// [`SeqSampler::decide`] takes a token it sampled from one row without drafts: the
    /// stream moves on by the number the draw used (if it used it), the token is
    /// recorded, and its output carries the log-probabilities asked for.
    pub fn accept_drawn(&mut self, drawn: RowDrawn) -> TokenOutput {
        if drawn.used_uniform {
            self.rng.next_f64();
        }
        self.push_token(drawn.token);
        TokenOutput {
            token_id: drawn.token,
            logprob: drawn.logprob,
            top_logprobs: drawn.top_logprobs,
            prompt_logprobs: None,
        }
    }

    /// Samples the next token (or verifies draft `d` by rejection sampling, which draws
    /// from the same distribution). Returns the token and whether it is the draft token.
    /// With a grammar `mask`, `logits` are already masked: the draft is verified against
    /// the masked distribution (a token the grammar rejects has probability 0), and the
    /// token is never one the mask rejects.
    fn next_token(
        &mut self,
        logits: &[f32],
        d: Option<(u32, Option<&[f32]>)>,
        mask: Option<&TokenMask>,
    ) -> (u32, bool) {
        let p = &self.params;
        let penalized = p.penalized();
        // min_tokens holds stop tokens back, unless the grammar allows nothing else.
        let mask_stops = self.output_len() < p.min_tokens
            && mask.is_none_or(|m| {
                logits
                    .iter()
                    .enumerate()
                    .any(|(t, l)| l.is_finite() && !self.is_stop(t as u32) && m.allows(t as u32))
            });
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
        let (token, was_draft) = match d {
            None => (sample(logits, &self.params, &mut self.rng), false),
            Some((d, q)) => match verify_draft(logits, &self.params, d, q, &mut self.rng) {
                Verdict::Accepted => (d, true),
                Verdict::Rejected(t) => (t, false),
            },
        };
        match mask {
            // Verification's last resort is the draft token itself: never one the grammar
            // rejects.
            Some(m) if !m.allows(token) => (sample(logits, &self.params, &mut self.rng), false),
            _ => (token, was_draft),
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
    let (logprob, top_logprobs) = token_logprobs(logits, token, k);
    TokenOutput {
        token_id: token,
        logprob,
        top_logprobs,
        prompt_logprobs: None,
    }
}

#[cfg(test)]
#[path = "sampler_grammar_tests.rs"]
mod grammar_tests;
