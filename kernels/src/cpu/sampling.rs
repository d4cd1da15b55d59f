//! Token sampling: temperature, top-k, top-p (nucleus), min-p, with a seeded PRNG.

use std::cmp::Ordering;

use crate::backend::Rng;
use crate::ops::log_softmax;
pub use crate::sampling_params::SamplingParams;

/// Index of the largest value (lowest index on ties; NaN never wins; 0 if empty).
pub fn argmax(x: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut bv = f32::NEG_INFINITY;
    for (i, &v) in x.iter().enumerate() {
        if v > bv {
            bv = v;
            best = i;
        }
    }
    best as u32
}

/// Descending by logit, ascending index on ties.
fn desc(a: &(f32, u32), b: &(f32, u32)) -> Ordering {
    b.0.partial_cmp(&a.0)
        .unwrap_or(Ordering::Equal)
        .then(a.1.cmp(&b.1))
}

/// The tokens sampling may draw, after temperature → top-k → top-p → min-p.
pub(crate) enum Support {
    /// Only one token can come out (greedy, top-k 1, or degenerate logits).
    Greedy(u32),
    /// Every token, weighted by `exp((l - max) / t)`.
    All { max: f32, inv_t: f32 },
    /// These `(logit, id)` candidates, weighted the same way.
    Filtered {
        cand: Vec<(f32, u32)>,
        max: f32,
        inv_t: f32,
    },
}

impl Support {
    /// Unnormalized weight of a logit under this support's temperature. A −∞ logit has
    /// weight 0 at every temperature, also at +∞ (`inv_t` 0), where `−∞ · 0` would be NaN:
    /// there the draw is uniform over the tokens of finite logit, the limit of the finite
    /// temperatures (the device sampler computes the same).
    pub(crate) fn weight(max: f32, inv_t: f32, l: f32) -> f32 {
        if l == f32::NEG_INFINITY {
            return 0.0;
        }
        ((l - max) * inv_t).exp()
    }
}

/// Draws an id with probability proportional to its weight (`total` is their sum); on
/// rounding past the end, the last id of positive weight; `None` when there is none.
/// Takes one number from `rng`, always.
pub(crate) fn draw_weighted(
    weights: impl Iterator<Item = (u32, f64)>,
    total: f64,
    rng: &mut Rng,
) -> Option<u32> {
    draw_weighted_at(weights, total, rng.next_f64())
}

/// [`draw_weighted`] with the uniform number `uniform` in `[0, 1)` given: walks the ids
/// in their order until the running sum of weights passes `uniform · total`.
fn draw_weighted_at(
    weights: impl Iterator<Item = (u32, f64)>,
    total: f64,
    uniform: f64,
) -> Option<u32> {
    let u = uniform * total;
    let mut acc = 0.0f64;
    let mut last = None;
    for (i, w) in weights {
        if w > 0.0 {
            acc += w;
            last = Some(i);
            if u < acc {
                return Some(i);
            }
        }
    }
    last
}

/// Applies the sampling filters of `params` to `logits`.
pub(crate) fn support(logits: &[f32], params: &SamplingParams) -> Support {
    let t = params.temperature;
    if logits.is_empty() || t.is_nan() || t < 1e-5 || params.top_k == 1 {
        return Support::Greedy(argmax(logits));
    }
    let inv_t = 1.0 / t;
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY || max.is_nan() {
        return Support::Greedy(argmax(logits));
    }
    let weight = |l: f32| Support::weight(max, inv_t, l);
    let v = logits.len();
    let top_k = if params.top_k == 0 {
        v
    } else {
        params.top_k.min(v)
    };
    let top_p = if params.top_p.is_nan() {
        1.0
    } else {
        params.top_p
    };
    if top_k == v && top_p >= 1.0 && params.min_p <= 0.0 {
        return Support::All { max, inv_t };
    }
    let mut cand: Vec<(f32, u32)> = logits
        .iter()
        .enumerate()
        .filter(|(_, l)| **l > f32::NEG_INFINITY)
        .map(|(i, &l)| (l, i as u32))
        .collect();
    if top_k < cand.len() {
        cand.select_nth_unstable_by(top_k - 1, desc);
        cand.truncate(top_k);
        // A canonical order (most likely first, ties by lower id) rather than whatever
        // order the selection left: the draw walks the candidates in this order, and a
        // device sampler (`SamplingOps::sample_rows`) reproduces it by sorting.
        cand.sort_unstable_by(desc);
    }
    if top_p < 1.0 {
        let z: f64 = cand.iter().map(|c| weight(c.0) as f64).sum();
        // Sort only as large a prefix as the nucleus needs.
        let mut c = 64.min(cand.len());
        loop {
            if c < cand.len() {
                cand.select_nth_unstable_by(c - 1, desc);
            }
            cand[..c].sort_unstable_by(desc);
            let mut cum = 0.0f64;
            let mut keep = None;
            for (i, x) in cand[..c].iter().enumerate() {
                if cum >= top_p as f64 * z && i > 0 {
                    keep = Some(i);
                    break;
                }
                cum += weight(x.0) as f64;
            }
            if keep.is_none() && cum >= top_p as f64 * z {
                keep = Some(c);
            }
            match keep {
                Some(n) => {
                    cand.truncate(n);
                    break;
                }
                None if c == cand.len() => break,
                None => c = (c * 4).min(cand.len()),
            }
        }
    }
    if params.min_p > 0.0 {
        // The top token has weight 1 (max logit), so the threshold is min_p itself.
        let top = cand.iter().map(|c| weight(c.0)).fold(0.0f32, f32::max);
        let thr = params.min_p * top;
        cand.retain(|c| weight(c.0) >= thr);
    }
    if cand.is_empty() {
        return Support::Greedy(argmax(logits));
    }
    Support::Filtered { cand, max, inv_t }
}

/// Samples a token id: temperature → top-k → top-p → min-p → renormalize → draw.
///
/// Takes one number from `rng` exactly when the filtered support has more than one
/// possible token (none for greedy parameters or degenerate logits).
///
/// ```
/// use dcpserve_kernels::{sample, Rng, SamplingParams};
/// let mut rng = Rng::new(42);
/// let greedy = SamplingParams { temperature: 0.0, ..Default::default() };
/// assert_eq!(sample(&[0.1, 2.0, -1.0], &greedy, &mut rng), 1);
/// ```
pub fn sample(logits: &[f32], params: &SamplingParams, rng: &mut Rng) -> u32 {
    sample_by(logits, params, || rng.next_f64())
}

/// [`sample`] with its uniform number given instead of a generator: returns the token
/// and whether the draw used `uniform` (exactly when [`sample`] would have taken a number
/// from its generator), so a caller can draw from a copy of its stream first and advance
/// the stream only when the number was used.
///
/// ```
/// use dcpserve_kernels::sampling::sample_with_uniform;
/// use dcpserve_kernels::{sample, Rng, SamplingParams};
/// let p = SamplingParams::default();
/// let logits = [0.5, 0.1, 0.4];
/// let mut rng = Rng::new(9);
/// let u = rng.clone().next_f64();
/// assert_eq!(sample_with_uniform(&logits, &p, u), (sample(&logits, &p, &mut rng), true));
/// let greedy = SamplingParams { temperature: 0.0, ..p };
/// assert_eq!(sample_with_uniform(&logits, &greedy, u), (0, false));
/// ```
pub fn sample_with_uniform(logits: &[f32], params: &SamplingParams, uniform: f64) -> (u32, bool) {
    let mut used = false;
    let token = sample_by(logits, params, || {
        used = true;
        uniform
    });
    (token, used)
}

/// The draw of [`sample`], calling `uniform` (for a number in `[0, 1)`) at most once:
/// exactly when the support leaves more than one token.
fn sample_by(logits: &[f32], params: &SamplingParams, uniform: impl FnOnce() -> f64) -> u32 {
    match support(logits, params) {
        Support::Greedy(t) => t,
        Support::All { max, inv_t } => {
            // No filtering: draw directly, no sort.
            let weights = logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (i as u32, Support::weight(max, inv_t, l) as f64));
            let total: f64 = weights.clone().map(|(_, w)| w).sum();
            draw_weighted_at(weights, total, uniform()).unwrap_or_else(|| argmax(logits))
        }
        Support::Filtered { cand, max, inv_t } => {
            let weight = |l: f32| Support::weight(max, inv_t, l);
            let total: f64 = cand.iter().map(|c| weight(c.0) as f64).sum();
            let u = uniform() * total;
            let mut acc = 0.0f64;
            for c in &cand {
                acc += weight(c.0) as f64;
                if u < acc {
                    return c.1;
                }
            }
            cand.iter()
                .min_by(|a, b| desc(a, b))
                .map_or(argmax(logits), |c| c.1)
        }
    }
}

/// The log-probability of `token` under `logits` (`None` when `token` is out of range)
/// and the `k` most likely tokens with theirs, most likely first, ties by lower id (the
/// OpenAI `logprobs` / `top_logprobs` of a token).
///
/// ```
/// use dcpserve_kernels::{log_softmax, sampling::token_logprobs};
/// let logits = [0.0, 1.0, 1.0];
/// let all = log_softmax(&logits);
/// let (lp, top) = token_logprobs(&logits, 0, 2);
/// assert_eq!(lp, Some(all[0]));
/// assert_eq!(top, vec![(1, all[1]), (2, all[2])]);
/// ```
pub fn token_logprobs(logits: &[f32], token: u32, k: usize) -> (Option<f32>, Vec<(u32, f32)>) {
    let lp = log_softmax(logits);
    let k = k.min(lp.len());
    let mut top: Vec<(u32, f32)> = Vec::new();
    if k > 0 {
        let mut idx: Vec<u32> = (0..lp.len() as u32).collect();
        // Ties by lower id in the selection too: the same tokens whatever the
        // selection's arrangement (and as a device backend ranks them).
        let order = |&a: &u32, &b: &u32| lp[b as usize].total_cmp(&lp[a as usize]).then(a.cmp(&b));
        idx.select_nth_unstable_by(k - 1, order);
        idx.truncate(k);
        idx.sort_by(order);
        top = idx.into_iter().map(|i| (i, lp[i as usize])).collect();
    }
    (lp.get(token as usize).copied(), top)
}

/// Applies repetition, frequency and presence penalties to `logits` in place, as vLLM does
/// before temperature: the repetition penalty covers tokens of the prompt and the output
/// (dividing positive logits, multiplying negative ones); the frequency penalty subtracts
/// `frequency × count` and the presence penalty subtracts `presence` once, for tokens of
/// the output only. Ids outside `logits` are ignored.
///
/// ```
/// use dcpserve_kernels::sampling::apply_penalties;
/// let mut l = [2.0f32, -1.0, 0.5];
/// apply_penalties(&mut l, &[1], &[0, 0], 0.5, 0.25, 2.0);
/// assert_eq!(l, [2.0 / 2.0 - 0.5 - 0.5, -2.0, 0.5]);
/// ```
pub fn apply_penalties(
    logits: &mut [f32],
    prompt: &[u32],
    output: &[u32],
    presence: f32,
    frequency: f32,
    repetition: f32,
) {
    let v = logits.len();
    if repetition != 1.0 && repetition > 0.0 {
        let mut seen = vec![false; v];
        for &t in prompt.iter().chain(output) {
            if let Some(s) = seen.get_mut(t as usize) {
                *s = true;
            }
        }
        for (l, s) in logits.iter_mut().zip(seen) {
            if s {
                *l = if *l > 0.0 {
                    *l / repetition
                } else {
                    *l * repetition
                };
            }
        }
    }
    if presence != 0.0 || frequency != 0.0 {
        let mut counts = vec![0u32; v];
        for &t in output {
            if let Some(c) = counts.get_mut(t as usize) {
                *c += 1;
            }
        }
        for (l, c) in logits.iter_mut().zip(counts) {
            if c > 0 {
                *l -= frequency * c as f32 + presence;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn freqs(logits: &[f32], p: &SamplingParams, n: usize) -> Vec<f64> {
        let mut rng = Rng::new(1234);
        let mut f = vec![0.0; logits.len()];
        for _ in 0..n {
            f[sample(logits, p, &mut rng) as usize] += 1.0 / n as f64;
        }
        f
    }

    fn probs(logits: &[f32], t: f32) -> Vec<f64> {
        let w: Vec<f64> = logits.iter().map(|l| ((l / t) as f64).exp()).collect();
        let z: f64 = w.iter().sum();
        w.iter().map(|x| x / z).collect()
    }

    fn assert_close(got: &[f64], want: &[f64], n: usize) {
        for (g, w) in got.iter().zip(want) {
            let sd = (w * (1.0 - w) / n as f64).sqrt();
            assert!((g - w).abs() <= 5.0 * sd + 1e-9, "{got:?} vs {want:?}");
        }
    }

    #[test]
    fn greedy_and_ties() {
        let mut rng = Rng::new(0);
        let g = SamplingParams {
            temperature: 0.0,
            ..Default::default()
        };
        assert_eq!(sample(&[1.0, 3.0, 3.0, 2.0], &g, &mut rng), 1);
        assert_eq!(argmax(&[f32::NAN, 1.0, 1.0]), 1);
        let k1 = SamplingParams {
            top_k: 1,
            ..Default::default()
        };
        let logits: Vec<f32> = (0..1000).map(|i| ((i * 37) % 101) as f32 * 0.01).collect();
        for _ in 0..50 {
            assert_eq!(sample(&logits, &k1, &mut rng), argmax(&logits));
        }
    }

    #[test]
    fn draws_walk_a_canonical_order() {
        // Nearly equal weights: a small number picks the first candidate walked, the
        // most likely one after a top-k cut (not the lowest id).
        let p = SamplingParams {
            temperature: 1e5,
            top_k: 3,
            ..Default::default()
        };
        assert_eq!(
            sample_with_uniform(&[1.0, 3.0, 2.0, 0.0], &p, 0.1),
            (1, true)
        );
        assert_eq!(
            sample_with_uniform(&[1.0, 3.0, 2.0, 0.0], &p, 0.9),
            (0, true)
        );
        // Without filters the walk is in index order.
        let all = SamplingParams {
            temperature: 1e5,
            ..Default::default()
        };
        assert_eq!(
            sample_with_uniform(&[1.0, 3.0, 2.0, 0.0], &all, 0.1),
            (0, true)
        );
        // Log-probability ties at the cut keep the lowest ids.
        let (_, top) = token_logprobs(&[0.0; 40], 0, 3);
        assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), [0, 1, 2]);
        let (lp, top) = token_logprobs(&[f32::NEG_INFINITY; 40], 7, 2);
        assert_eq!(lp, Some(f32::NEG_INFINITY));
        assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), [0, 1]);
    }

    #[test]
    fn infinite_temperature_is_uniform_over_finite_logits() {
        // The limit of large temperatures: every token of finite logit equally likely,
        // masked (−∞) tokens never. Uniform u picks the ⌊3u⌋-th finite token walked.
        let logits = [0.5, f32::NEG_INFINITY, -3.0, f32::NEG_INFINITY, 7.0];
        for filters in [
            SamplingParams::default(),
            SamplingParams {
                top_k: 4,
                ..Default::default()
            },
        ] {
            let p = SamplingParams {
                temperature: f32::INFINITY,
                ..filters
            };
            let drawn: Vec<u32> = [0.1, 0.5, 0.9]
                .iter()
                .map(|&u| sample_with_uniform(&logits, &p, u).0)
                .collect();
            let mut sorted = drawn.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, [0, 2, 4], "{drawn:?} (top_k {})", p.top_k);
        }
    }

    #[test]
    fn same_seed_same_sequence() {
        let logits: Vec<f32> = (0..49152)
            .map(|i| ((i * 7919) % 1000) as f32 * 0.01)
            .collect();
        let p = SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.9,
            min_p: 0.05,
            ..Default::default()
        };
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        let sa: Vec<u32> = (0..20).map(|_| sample(&logits, &p, &mut a)).collect();
        let sb: Vec<u32> = (0..20).map(|_| sample(&logits, &p, &mut b)).collect();
        assert_eq!(sa, sb);
        assert!(sa.iter().any(|&x| x != sa[0]));
    }

    #[test]
    fn empirical_frequencies() {
        let logits = [2.0f32, 1.0, 0.5, 0.0, -1.0, -3.0];
        let n = 200_000;
        // Plain temperature sampling.
        let p = SamplingParams {
            temperature: 0.7,
            ..Default::default()
        };
        assert_close(&freqs(&logits, &p, n), &probs(&logits, 0.7), n);
        // top-k = 3: renormalized over the three largest.
        let p = SamplingParams {
            top_k: 3,
            ..Default::default()
        };
        let mut want = probs(&logits[..3], 1.0);
        want.extend([0.0; 3]);
        assert_close(&freqs(&logits, &p, n), &want, n);
    }

    #[test]
    fn top_p_and_min_p_filters() {
        // probs 0.5, 0.25, 0.125, 0.0625, 0.0625
        let pr = [0.5f64, 0.25, 0.125, 0.0625, 0.0625];
        let logits: Vec<f32> = pr.iter().map(|p| p.ln() as f32).collect();
        let n = 100_000;
        // top_p = 0.7: 0.5 < 0.7, 0.75 >= 0.7 -> keep first two.
        let p = SamplingParams {
            top_p: 0.7,
            ..Default::default()
        };
        assert_close(
            &freqs(&logits, &p, n),
            &[2.0 / 3.0, 1.0 / 3.0, 0.0, 0.0, 0.0],
            n,
        );
        // top_p tiny keeps exactly one.
        let p = SamplingParams {
            top_p: 0.01,
            ..Default::default()
        };
        assert_close(&freqs(&logits, &p, 1000), &[1.0, 0.0, 0.0, 0.0, 0.0], 1000);
        // min_p = 0.2: threshold 0.1 -> keep 0.5, 0.25, 0.125.
        let p = SamplingParams {
            min_p: 0.2,
            ..Default::default()
        };
        assert_close(
            &freqs(&logits, &p, n),
            &[4.0 / 7.0, 2.0 / 7.0, 1.0 / 7.0, 0.0, 0.0],
            n,
        );
        // Large vocabulary nucleus (exercises the growing prefix sort).
        let big: Vec<f32> = (0..5000).map(|i| -(i as f32) * 0.001).collect();
        let p = SamplingParams {
            top_p: 0.5,
            ..Default::default()
        };
        let mut rng = Rng::new(3);
        for _ in 0..200 {
            // Index i has prob ∝ e^{-0.001 i}; the nucleus ends well before 5000.
            assert!(sample(&big, &p, &mut rng) < 2600);
        }
    }
}
