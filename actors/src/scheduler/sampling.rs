//! Turning a step's logits into the next token: penalties, stop masks, sampling and
//! log-probabilities.

use dcpserve_kernels::sampling::apply_penalties;
use dcpserve_kernels::spec_sampling::{verify_draft, Verdict};
use dcpserve_kernels::{log_softmax, sample};

use super::{SchedulerConfig, Sequence};
use crate::request::{FinishReason, TokenOutput};

/// A draft token to verify at this position, and the draft distribution it came from
/// (`None` for deterministic proposers).
pub(super) type DraftToken<'a> = (u32, Option<&'a [f32]>);

/// Samples the next token (or verifies `draft` by rejection sampling, which draws from the
/// same distribution) and decides whether the sequence ends with it. Returns the token,
/// whether it is the draft token, and the finish reason.
pub(super) fn next_token(
    seq: &mut Sequence,
    logits: &[f32],
    cfg: &SchedulerConfig,
    draft: Option<DraftToken<'_>>,
) -> (u32, bool, Option<FinishReason>) {
    let p = &seq.request.params;
    let is_stop =
        |t: u32| (!p.ignore_eos && cfg.eos_token_ids.contains(&t)) || p.stop_token_ids.contains(&t);
    let penalized =
        p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 || p.repetition_penalty != 1.0;
    let mask_stops = seq.output_len() < p.min_tokens;
    let masked;
    let logits = if penalized || mask_stops {
        let mut m = logits.to_vec();
        if penalized {
            let (prompt, output) = seq.tokens.split_at(seq.prompt_len);
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
                if is_stop(t as u32) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        masked = m;
        &masked[..]
    } else {
        logits
    };
    let (token, accepted) = match draft {
        None => (sample(logits, &p.sampling, &mut seq.rng), false),
        Some((d, q)) => match verify_draft(logits, &p.sampling, d, q, &mut seq.rng) {
            Verdict::Accepted => (d, true),
            Verdict::Rejected(t) => (t, false),
        },
    };
    let out_len = seq.output_len() + 1;
    let reason = if is_stop(token) {
        Some(FinishReason::Stop)
    } else if out_len >= p.max_tokens || seq.tokens.len() + 1 >= cfg.max_model_len {
        Some(FinishReason::Length)
    } else {
        None
    };
    (token, accepted, reason)
}

pub(super) fn token_output(seq: &mut Sequence, logits: &[f32], token: u32) -> TokenOutput {
    // Prompt scores travel once, with the first token.
    let prompt_logprobs = seq.prompt_logprobs.take();
    let Some(k) = seq.request.params.logprobs else {
        return TokenOutput {
            token_id: token,
            logprob: None,
            top_logprobs: Vec::new(),
            prompt_logprobs,
        };
    };
    TokenOutput {
        prompt_logprobs,
        ..logprobs_of(logits, token, k)
    }
}

/// The log-probability of `token` under `logits` and the `k` most likely alternatives.
pub(super) fn logprobs_of(logits: &[f32], token: u32, k: usize) -> TokenOutput {
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
