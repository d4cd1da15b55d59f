//! Statistical checks: speculative sampling must draw from the plain sampler's distribution.

use super::*;
use crate::sample;

const LOGITS: [f32; 8] = [1.0, 2.5, 0.3, 2.0, -1.0, 1.7, 0.0, 2.2];
const TRIALS: usize = 200_000;

/// Pearson's chi-square of observed counts against expected probabilities (cells with
/// zero expectation must be empty, else the statistic is infinite).
fn chi_square(counts: &[usize], p: &[f64], n: usize) -> f64 {
    let mut chi = 0.0;
    for (&c, &pi) in counts.iter().zip(p) {
        let e = pi * n as f64;
        if e == 0.0 {
            if c > 0 {
                return f64::INFINITY;
            }
            continue;
        }
        chi += (c as f64 - e).powi(2) / e;
    }
    chi
}

/// 0.1% critical value of chi-square with 7 degrees of freedom (8 tokens): 24.32.
const CHI2_CRIT_7DF: f64 = 24.32;

fn dense(params: &SamplingParams) -> Vec<f64> {
    match target_probs(&LOGITS, params) {
        TargetProbs::Dense(p) => p,
        TargetProbs::Greedy(_) => panic!("expected a stochastic distribution"),
    }
}

/// One speculative token: a deterministic draft `d`, verified, as the engine emits it.
fn speculative_token(params: &SamplingParams, d: u32, q: Option<&[f32]>, rng: &mut Rng) -> u32 {
    match verify_draft(&LOGITS, params, d, q, rng) {
        Verdict::Accepted => d,
        Verdict::Rejected(t) => t,
    }
}

fn settings() -> Vec<SamplingParams> {
    vec![
        SamplingParams {
            temperature: 0.8,
            ..Default::default()
        },
        SamplingParams {
            temperature: 1.3,
            top_k: 5,
            ..Default::default()
        },
        SamplingParams {
            temperature: 1.0,
            top_p: 0.8,
            ..Default::default()
        },
        SamplingParams {
            temperature: 0.7,
            min_p: 0.2,
            ..Default::default()
        },
    ]
}

#[test]
fn target_probs_match_the_plain_sampler() {
    for params in settings() {
        let p = dense(&params);
        assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-9);
        let mut rng = Rng::new(7);
        let mut counts = [0usize; 8];
        for _ in 0..TRIALS {
            counts[sample(&LOGITS, &params, &mut rng) as usize] += 1;
        }
        let chi = chi_square(&counts, &p, TRIALS);
        assert!(chi < CHI2_CRIT_7DF, "{params:?}: chi2 {chi}");
    }
}

#[test]
fn deterministic_drafts_keep_the_distribution() {
    for params in settings() {
        let p = dense(&params);
        // A likely draft, an unlikely one, and one outside top-k/top-p support.
        for d in [1u32, 4, 6] {
            let mut rng = Rng::new(11 + d as u64);
            let mut counts = [0usize; 8];
            for _ in 0..TRIALS {
                counts[speculative_token(&params, d, None, &mut rng) as usize] += 1;
            }
            let chi = chi_square(&counts, &p, TRIALS);
            assert!(chi < CHI2_CRIT_7DF, "{params:?} draft {d}: chi2 {chi}");
        }
    }
}

#[test]
fn drafts_drawn_from_a_draft_model_keep_the_distribution() {
    // A draft distribution that disagrees with the target.
    let q: [f32; 8] = [0.05, 0.05, 0.4, 0.1, 0.2, 0.05, 0.1, 0.05];
    for params in settings() {
        let p = dense(&params);
        let mut rng = Rng::new(23);
        let mut counts = [0usize; 8];
        for _ in 0..TRIALS {
            let u = rng.next_f64();
            let mut acc = 0.0;
            let mut d = 7u32;
            for (i, &qi) in q.iter().enumerate() {
                acc += qi as f64;
                if u < acc {
                    d = i as u32;
                    break;
                }
            }
            counts[speculative_token(&params, d, Some(&q), &mut rng) as usize] += 1;
        }
        let chi = chi_square(&counts, &p, TRIALS);
        assert!(chi < CHI2_CRIT_7DF, "{params:?}: chi2 {chi}");
    }
}

#[test]
fn the_test_detects_a_biased_verifier() {
    // Control: accepting a deterministic draft with probability p(d) but then drawing the
    // replacement from p itself (no residual) over-weights d; the chi-square must see it.
    let params = SamplingParams {
        temperature: 0.8,
        ..Default::default()
    };
    let p = dense(&params);
    let mut rng = Rng::new(5);
    let mut counts = [0usize; 8];
    for _ in 0..TRIALS {
        let t = if rng.next_f64() < p[1] {
            1
        } else {
            sample(&LOGITS, &params, &mut rng)
        };
        counts[t as usize] += 1;
    }
    assert!(chi_square(&counts, &p, TRIALS) > 10.0 * CHI2_CRIT_7DF);
}

#[test]
fn greedy_accepts_exactly_the_argmax() {
    let greedy = SamplingParams {
        temperature: 0.0,
        ..Default::default()
    };
    let mut rng = Rng::new(1);
    for d in 0..8u32 {
        let v = verify_draft(&LOGITS, &greedy, d, None, &mut rng);
        if d == 1 {
            assert_eq!(v, Verdict::Accepted);
        } else {
            assert_eq!(v, Verdict::Rejected(1));
        }
    }
}
