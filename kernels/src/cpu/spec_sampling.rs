//! Verification of draft tokens by rejection sampling, so that speculative decoding
//! draws every token from exactly the distribution plain sampling would (Leviathan et
//! al. 2023; Chen et al. 2023): accept draft `d` with probability `min(1, p(d)/q(d))`,
//! else draw from `max(0, p − q)` renormalized. Greedy requests accept a draft exactly
//! when it is the argmax, which keeps greedy output identical.

use crate::backend::Rng;
use crate::sampling::{draw_weighted, support, Support};
use crate::sampling_params::SamplingParams;

/// What verification made of one draft token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The draft token stands.
    Accepted,
    /// The draft token is replaced by this one, and later drafts are discarded.
    Rejected(u32),
}

/// Verifies draft token `draft` against the target's (already penalized) `logits`.
///
/// `draft_probs` is the draft model's distribution at this position (the one `draft`
/// was drawn from); `None` means a deterministic proposer (n-gram lookup), i.e. q = δ(draft).
///
/// ```
/// use dcpserve_kernels::spec_sampling::{verify_draft, Verdict};
/// use dcpserve_kernels::{Rng, SamplingParams};
/// let greedy = SamplingParams { temperature: 0.0, ..Default::default() };
/// let mut rng = Rng::new(0);
/// assert_eq!(verify_draft(&[0.0, 3.0, 1.0], &greedy, 1, None, &mut rng), Verdict::Accepted);
/// assert_eq!(verify_draft(&[0.0, 3.0, 1.0], &greedy, 2, None, &mut rng), Verdict::Rejected(1));
/// ```
pub fn verify_draft(
    logits: &[f32],
    params: &SamplingParams,
    draft: u32,
    draft_probs: Option<&[f32]>,
    rng: &mut Rng,
) -> Verdict {
    let p = match target_probs(logits, params) {
        TargetProbs::Greedy(t) if t == draft => return Verdict::Accepted,
        TargetProbs::Greedy(t) => return Verdict::Rejected(t),
        TargetProbs::Dense(p) => p,
    };
    let d = draft as usize;
    let p_d = p.get(d).copied().unwrap_or(0.0);
    let q_d = match draft_probs {
        Some(q) => q.get(d).map_or(0.0, |&x| x as f64),
        None => 1.0,
    };
    let accept = if q_d <= 0.0 {
        p_d > 0.0
    } else {
        rng.next_f64() < (p_d / q_d).min(1.0)
    };
    if accept {
        return Verdict::Accepted;
    }
    // Residual distribution max(0, p − q).
    let q_at = |i: usize| -> f64 {
        match draft_probs {
            Some(q) => q.get(i).map_or(0.0, |&x| x as f64),
            None => (i == d) as u8 as f64,
        }
    };
    let residual: Vec<f64> = p
        .iter()
        .enumerate()
        .map(|(i, &pi)| (pi - q_at(i)).max(0.0))
        .collect();
    let total: f64 = residual.iter().sum();
    let weights = if total > 0.0 { &residual } else { &p };
    let total = if total > 0.0 { total } else { 1.0 };
    let ids = weights.iter().enumerate().map(|(i, &w)| (i as u32, w));
    Verdict::Rejected(draw_weighted(ids, total, rng).unwrap_or(draft))
}

/// The target distribution sampling with `params` draws from.
pub enum TargetProbs {
    /// Deterministic: this token.
    Greedy(u32),
    /// Probabilities over the whole vocabulary (zero outside the filtered support).
    Dense(Vec<f64>),
}

/// The distribution [`crate::sample`] draws from for `logits` and `params`.
pub fn target_probs(logits: &[f32], params: &SamplingParams) -> TargetProbs {
    let mut p = vec![0.0f64; logits.len()];
    match support(logits, params) {
        Support::Greedy(t) => return TargetProbs::Greedy(t),
        Support::All { max, inv_t } => {
            for (pi, &l) in p.iter_mut().zip(logits) {
                *pi = Support::weight(max, inv_t, l) as f64;
            }
        }
        Support::Filtered { cand, max, inv_t } => {
            for (l, i) in cand {
                p[i as usize] = Support::weight(max, inv_t, l) as f64;
            }
        }
    }
    let total: f64 = p.iter().sum();
    p.iter_mut().for_each(|x| *x /= total);
    TargetProbs::Dense(p)
}

#[cfg(test)]
mod tests;
