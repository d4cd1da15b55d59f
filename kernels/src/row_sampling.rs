//! What [`SamplingOps::sample_rows`](crate::SamplingOps::sample_rows) is asked and answers: one
//! draw per row of a step's logits, so that a device backend returns only the chosen
//! tokens and the log-probabilities asked for instead of the whole logits matrix.
//!
//! The random number of each draw is given ([`RowDraw::uniform`]) rather than a
//! generator: the caller draws it from a copy of the sequence's stream and advances the
//! stream only when the answer says the number was used ([`RowDrawn::used_uniform`]),
//! so the stream moves exactly as [`sample`](crate::sample) would have moved it.
//! [`draw_row_on_host`] is the reference every backend's answer is held to (the CPU
//! backend's implementation is that function).

use crate::error::KernelError;
use crate::sampling::{sample_with_uniform, token_logprobs};

pub use crate::backend::sampling::{RowDraw, RowDrawn};

/// The reference answer to `draw` for its row `logits`: [`sample_with_uniform`] and
/// [`token_logprobs`], exactly the host sampler's computation.
///
/// ```
/// use dcpserve_kernels::row_sampling::{draw_row_on_host, RowDraw};
/// use dcpserve_kernels::SamplingParams;
/// let greedy = SamplingParams { temperature: 0.0, ..Default::default() };
/// let draw = RowDraw { row: 0, params: &greedy, uniform: None, top_logprobs: Some(1) };
/// let got = draw_row_on_host(&[0.5, 2.0, 1.0], &draw);
/// assert_eq!((got.token, got.used_uniform), (1, false));
/// assert_eq!(got.top_logprobs[0].0, 1);
/// assert_eq!(got.logprob, Some(got.top_logprobs[0].1));
/// ```
pub fn draw_row_on_host(logits: &[f32], draw: &RowDraw<'_>) -> RowDrawn {
    let (token, used_uniform) = match draw.uniform {
        Some(u) => sample_with_uniform(logits, draw.params, u),
        // Greedy parameters (checked by `check_draws`): no number is used.
        None => sample_with_uniform(logits, draw.params, 0.0),
    };
    let (logprob, top_logprobs) = match draw.top_logprobs {
        Some(k) => token_logprobs(logits, token, k),
        None => (None, Vec::new()),
    };
    RowDrawn {
        token,
        used_uniform,
        logprob,
        top_logprobs,
    }
}

/// Checks a [`SamplingOps::sample_rows`](crate::SamplingOps::sample_rows) call: `vocab > 0`,
/// `len` whole rows of it, every row in range, a uniform number in `[0, 1)` for every
/// draw whose parameters are not greedy. Returns the number of rows.
pub(crate) fn check_draws(
    len: usize,
    vocab: usize,
    draws: &[RowDraw<'_>],
) -> Result<usize, KernelError> {
    if vocab == 0 || !len.is_multiple_of(vocab) {
        return Err(KernelError::Shape(format!(
            "sample_rows: {len} logits are not rows of {vocab}"
        )));
    }
    let rows = len / vocab;
    for (i, d) in draws.iter().enumerate() {
        if d.row >= rows {
            return Err(KernelError::Shape(format!(
                "sample_rows: draw {i} asks for row {} of {rows}",
                d.row
            )));
        }
        match d.uniform {
            Some(u) if !(0.0..1.0).contains(&u) => {
                return Err(KernelError::Shape(format!(
                    "sample_rows: draw {i}'s uniform number {u} is not in [0, 1)"
                )));
            }
            None if !d.params.is_greedy() => {
                return Err(KernelError::Shape(format!(
                    "sample_rows: draw {i} samples (temperature {}, top-k {}) without a \
                     uniform number",
                    d.params.temperature, d.params.top_k
                )));
            }
            _ => {}
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Rng;
    use crate::sampling::sample;
    use crate::sampling_params::SamplingParams;

    #[test]
    fn the_host_draw_is_sample_and_moves_the_stream_alike() {
        let logits: Vec<f32> = (0..300).map(|i| ((i * 37) % 101) as f32 * 0.05).collect();
        let cases = [
            SamplingParams::default(),
            SamplingParams {
                temperature: 0.0,
                ..Default::default()
            },
            SamplingParams {
                top_k: 5,
                top_p: 0.8,
                min_p: 0.1,
                temperature: 0.7,
                ..Default::default()
            },
        ];
        for p in &cases {
            let mut rng = Rng::new(5);
            for _ in 0..20 {
                let mut peek = rng.clone();
                let u = (!p.is_greedy()).then(|| peek.next_f64());
                let d = RowDraw {
                    row: 0,
                    params: p,
                    uniform: u,
                    top_logprobs: None,
                };
                let got = draw_row_on_host(&logits, &d);
                let want = sample(&logits, p, &mut rng);
                assert_eq!(got.token, want);
                if got.used_uniform {
                    assert_eq!(peek, rng, "used: the stream took one number");
                } else {
                    assert_eq!(u, None);
                }
            }
        }
    }

    #[test]
    fn bad_calls_are_errors() {
        let p = SamplingParams::default();
        let g = SamplingParams {
            temperature: 0.0,
            ..Default::default()
        };
        let d = |row, params, uniform| RowDraw {
            row,
            params,
            uniform,
            top_logprobs: None,
        };
        assert_eq!(check_draws(12, 4, &[d(2, &p, Some(0.5))]).unwrap(), 3);
        assert!(check_draws(12, 4, &[d(3, &p, Some(0.5))]).is_err());
        assert!(check_draws(12, 5, &[]).is_err());
        assert!(check_draws(12, 0, &[]).is_err());
        assert!(check_draws(12, 4, &[d(0, &p, None)]).is_err());
        assert!(check_draws(12, 4, &[d(0, &p, Some(1.0))]).is_err());
        assert!(check_draws(12, 4, &[d(0, &g, None)]).is_ok());
    }
}
