//! [`SamplingOps::sample_rows`] on every backend against the host sampler: tokens as
//! [`sample`](crate::sample) draws them from the same stream, the stream moved exactly
//! when `sample` moves it, log-probabilities as
//! [`token_logprobs`](crate::sampling::token_logprobs) computes them.

use super::*;
use crate::row_sampling::{RowDraw, RowDrawn};
use crate::sampling::{sample, token_logprobs};

const VOCAB: usize = 3000;

/// Rows of every kind a draw meets (see the comments).
fn rows() -> Vec<Vec<f32>> {
    let mut rng = Lcg(77);
    let mut rows = Vec::new();
    // 0: peaked; 1: flat (a top-p nucleus of most of the vocabulary).
    rows.push(rng.vec(VOCAB).iter().map(|x| x * 8.0).collect());
    rows.push(rng.vec(VOCAB).iter().map(|x| x * 0.5).collect());
    // 2: ties (quarter steps) and -inf every 13th token.
    rows.push(
        rng.vec(VOCAB)
            .iter()
            .enumerate()
            .map(|(i, x)| {
                if i % 13 == 0 {
                    f32::NEG_INFINITY
                } else {
                    (x * 12.0).round() / 4.0
                }
            })
            .collect(),
    );
    // 3: a NaN (a device may leave it to the host).
    let mut nan = rng.vec(VOCAB);
    nan[17] = f32::NAN;
    rows.push(nan);
    // 4: nothing finite.
    rows.push(vec![f32::NEG_INFINITY; VOCAB]);
    // 5: ten finite tokens.
    rows.push(
        (0..VOCAB)
            .map(|i| {
                if i % 300 == 7 {
                    rng.next()
                } else {
                    f32::NEG_INFINITY
                }
            })
            .collect(),
    );
    // 6: the largest logits are zeros of both signs (equal to `sample`, unequal to
    // `total_cmp`).
    rows.push(
        rng.vec(VOCAB)
            .iter()
            .enumerate()
            .map(|(i, x)| match i % 50 {
                3 => -0.0,
                9 => 0.0,
                _ => -1.0 - x.abs() * 4.0,
            })
            .collect(),
    );
    rows
}

/// Parameter sets, and whether a device may leave a draw with them to the host (a top-k
/// above 2048 candidates, too many top log-probabilities).
fn cases() -> Vec<(SamplingParams, bool)> {
    let p = SamplingParams::default();
    let with = |f: &dyn Fn(&mut SamplingParams)| {
        let mut q = p.clone();
        f(&mut q);
        q
    };
    vec![
        (
            with(&|q| {
                q.temperature = 0.0;
                q.logprobs = Some(5);
            }),
            false,
        ),
        (with(&|q| q.top_k = 1), false),
        (with(&|q| q.logprobs = Some(1)), false),
        (with(&|q| q.temperature = 0.7), false),
        (
            with(&|q| {
                q.top_k = 40;
                q.temperature = 0.9;
            }),
            false,
        ),
        (with(&|q| q.top_k = 2048), false),
        (with(&|q| q.top_k = 2049), true),
        (with(&|q| q.top_p = 0.9), false),
        (
            with(&|q| {
                q.top_p = 0.9;
                q.top_k = 100;
                q.logprobs = Some(0);
            }),
            false,
        ),
        (with(&|q| q.min_p = 0.1), false),
        (with(&|q| q.min_p = 1.5), false),
        (
            with(&|q| {
                q.top_k = 50;
                q.top_p = 0.8;
                q.min_p = 0.05;
                q.temperature = 1.4;
                q.logprobs = Some(20);
            }),
            false,
        ),
        (
            with(&|q| {
                q.top_p = f32::NAN;
                q.min_p = f32::NAN;
            }),
            false,
        ),
        (with(&|q| q.top_p = 0.0), false),
        // +inf: uniform over the finite logits (row 5 has −inf ones), whichever filter.
        (with(&|q| q.temperature = f32::INFINITY), false),
        (
            with(&|q| {
                q.temperature = f32::INFINITY;
                q.top_k = 40;
            }),
            false,
        ),
        (with(&|q| q.logprobs = Some(5000)), true),
    ]
}

/// The host's answer, from `sample` and `token_logprobs` on their own.
fn reference(row: &[f32], p: &SamplingParams, rng: &Rng) -> RowDrawn {
    let mut r = rng.clone();
    let token = sample(row, p, &mut r);
    let used_uniform = r != *rng;
    let (logprob, top_logprobs) = match p.logprobs {
        Some(k) => token_logprobs(row, token, k),
        None => (None, Vec::new()),
    };
    RowDrawn {
        token,
        used_uniform,
        logprob,
        top_logprobs,
    }
}

fn same_logprob(exact: bool, got: f32, want: f32) -> bool {
    got == want
        || (got.is_nan() && want.is_nan())
        || (!exact && want.is_finite() && (got - want).abs() <= 1e-5 * want.abs().max(1.0))
}

fn sample_rows_match_the_host_sampler<B: Backend>(dev: &B) {
    let rows = rows();
    let host: Vec<f32> = rows.concat();
    let buf = dev.upload(&host).unwrap();
    let cases = cases();
    let exact = dev.name() == "cpu";
    let mut draws = Vec::new();
    let mut expected = Vec::new();
    for seed in 0..3u64 {
        for (r, row) in rows.iter().enumerate() {
            for (c, (p, may_defer)) in cases.iter().enumerate() {
                let rng = Rng::new(seed * 1000 + (r * 100 + c) as u64);
                let uniform = (!p.is_greedy()).then(|| rng.clone().next_f64());
                draws.push(RowDraw {
                    row: r,
                    params: p,
                    uniform,
                    top_logprobs: p.logprobs,
                });
                // The NaN row and the flat row's long nucleus may be left to the host too.
                let flat_nucleus = r == 1 && p.top_p < 1.0 && p.top_k == 0;
                expected.push((
                    reference(row, p, &rng),
                    *may_defer || r == 3 || flat_nucleus,
                ));
            }
        }
    }
    let got = dev.sample_rows(all(dev, &buf), VOCAB, &draws).unwrap();
    assert_eq!(got.len(), draws.len());
    let mut deferred = 0;
    for (i, (g, (want, may_defer))) in got.iter().zip(&expected).enumerate() {
        let d = &draws[i];
        let what = format!("draw {i}: row {} with {:?}", d.row, d.params);
        let Some(g) = g else {
            assert!(!exact && *may_defer, "{what}: left to the host");
            deferred += 1;
            continue;
        };
        assert_eq!(
            (g.token, g.used_uniform),
            (want.token, want.used_uniform),
            "{what}"
        );
        match (g.logprob, want.logprob) {
            (Some(a), Some(b)) => assert!(same_logprob(exact, a, b), "{what}: {a} vs {b}"),
            (a, b) => assert_eq!(a, b, "{what}"),
        }
        assert_eq!(g.top_logprobs.len(), want.top_logprobs.len(), "{what}");
        for (a, b) in g.top_logprobs.iter().zip(&want.top_logprobs) {
            assert_eq!(a.0, b.0, "{what}: top ids");
            assert!(same_logprob(exact, a.1, b.1), "{what}: {a:?} vs {b:?}");
        }
    }
    // The draws really sample (tokens vary with the stream) and really skip numbers.
    let used = got.iter().flatten().filter(|g| g.used_uniform).count();
    assert!(
        used > draws.len() / 2 && used < draws.len() - deferred,
        "{used} used"
    );
    if exact {
        assert_eq!(deferred, 0);
    }
}

fn sample_rows_check_their_arguments<B: Backend>(dev: &B) {
    let buf = dev.upload(&[0.0; 12]).unwrap();
    let p = SamplingParams::default();
    let d = |row, uniform| RowDraw {
        row,
        params: &p,
        uniform,
        top_logprobs: None,
    };
    assert!(dev.sample_rows(all(dev, &buf), 5, &[]).is_err());
    assert!(dev.sample_rows(all(dev, &buf), 0, &[]).is_err());
    assert!(dev
        .sample_rows(all(dev, &buf), 4, &[d(3, Some(0.5))])
        .is_err());
    assert!(dev.sample_rows(all(dev, &buf), 4, &[d(0, None)]).is_err());
    assert!(dev
        .sample_rows(all(dev, &buf), 4, &[d(0, Some(1.5))])
        .is_err());
    assert!(dev.sample_rows(all(dev, &buf), 4, &[]).unwrap().is_empty());
    // Equal logits: the draw walks them in index order.
    let got = dev
        .sample_rows(all(dev, &buf), 4, &[d(2, Some(0.6))])
        .unwrap();
    assert_eq!(got[0].as_ref().map(|g| g.token), Some(2));
}

test_on_every_backend!(
    sample_rows_match_the_host_sampler,
    sample_rows_check_their_arguments
);
