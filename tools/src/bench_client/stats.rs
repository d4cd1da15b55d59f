//! Percentiles and the summary of one benchmark point (vLLM's definitions: TTFT from
//! sending to the first generated text, TPOT = (e2e − TTFT) / (output tokens − 1) per
//! request, ITL = every gap between two chunks of text).

use serde::{Deserialize, Serialize};

use super::http::RequestRecord;

/// Percentile `p` (0..=100) of sorted values, interpolating linearly between the two
/// nearest ranks (numpy's default).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    assert!(!sorted.is_empty(), "percentile of nothing");
    let rank = (p / 100.0).clamp(0.0, 1.0) * (sorted.len() - 1) as f64;
    let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64)
}

/// Mean and percentiles of a latency, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Distribution {
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

/// The distribution of `seconds`, in milliseconds (all zero when there are none).
pub fn distribution_ms(seconds: &[f64]) -> Distribution {
    if seconds.is_empty() {
        return Distribution::default();
    }
    let mut v: Vec<f64> = seconds.iter().map(|s| s * 1e3).collect();
    v.sort_by(f64::total_cmp);
    Distribution {
        mean: v.iter().sum::<f64>() / v.len() as f64,
        p50: percentile(&v, 50.0),
        p90: percentile(&v, 90.0),
        p99: percentile(&v, 99.0),
        max: v[v.len() - 1],
    }
}

/// Throughput and latency of one point.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    pub completed: usize,
    pub failed: usize,
    /// Wall time of the point (seconds).
    pub duration_s: f64,
    pub total_input_tokens: usize,
    pub total_output_tokens: usize,
    /// Requests whose token count came from the server's usage rather than counted chunks.
    pub usage_reported: usize,
    pub request_throughput: f64,
    /// Generated tokens per second, all requests together.
    pub output_throughput: f64,
    /// Prompt and generated tokens per second.
    pub total_token_throughput: f64,
    /// `output_throughput` divided by the ranks serving the model.
    pub output_throughput_per_rank: f64,
    /// Interactivity: generated tokens per second seen by one user (1000 / mean TPOT ms).
    pub tok_s_per_user: f64,
    pub ttft_ms: Distribution,
    pub tpot_ms: Distribution,
    pub itl_ms: Distribution,
    pub e2el_ms: Distribution,
}

/// Summarizes the records of one point that took `duration_s`, served by `ranks` ranks.
pub fn summarize(records: &[RequestRecord], duration_s: f64, ranks: usize) -> LatencySummary {
    let ok: Vec<&RequestRecord> = records.iter().filter(|r| r.error.is_none()).collect();
    let total_input_tokens = ok.iter().map(|r| r.prompt_tokens).sum();
    let total_output_tokens: usize = ok.iter().map(|r| r.output_tokens).sum();
    let ttft: Vec<f64> = ok.iter().filter_map(|r| r.ttft).collect();
    let tpot: Vec<f64> = ok
        .iter()
        .filter(|r| r.output_tokens > 1)
        .filter_map(|r| r.ttft.map(|t| (r.e2e - t) / (r.output_tokens - 1) as f64))
        .collect();
    let itl: Vec<f64> = ok.iter().flat_map(|r| r.itl.iter().copied()).collect();
    let e2el: Vec<f64> = ok.iter().map(|r| r.e2e).collect();
    let per_s = |x: f64| {
        if duration_s > 0.0 {
            x / duration_s
        } else {
            0.0
        }
    };
    let output_throughput = per_s(total_output_tokens as f64);
    let tpot_ms = distribution_ms(&tpot);
    LatencySummary {
        completed: ok.len(),
        failed: records.len() - ok.len(),
        duration_s,
        total_input_tokens,
        total_output_tokens,
        usage_reported: ok.iter().filter(|r| r.usage_reported).count(),
        request_throughput: per_s(ok.len() as f64),
        output_throughput,
        total_token_throughput: per_s((total_input_tokens + total_output_tokens) as f64),
        output_throughput_per_rank: output_throughput / ranks.max(1) as f64,
        tok_s_per_user: if tpot_ms.mean > 0.0 {
            1000.0 / tpot_ms.mean
        } else {
            0.0
        },
        ttft_ms: distribution_ms(&ttft),
        tpot_ms,
        itl_ms: distribution_ms(&itl),
        e2el_ms: distribution_ms(&e2el),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn percentiles_interpolate_between_ranks() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert!(close(percentile(&v, 50.0), 2.5));
        assert!(close(percentile(&v, 90.0), 3.7)); // rank 2.7
        assert!(close(percentile(&v, 99.0), 3.97));
        assert!(close(percentile(&v, 0.0), 1.0));
        assert!(close(percentile(&v, 100.0), 4.0));
        assert!(close(percentile(&[7.0], 99.0), 7.0));
        let hundred: Vec<f64> = (1..=101).map(f64::from).collect();
        assert!(close(percentile(&hundred, 99.0), 100.0));
    }

    #[test]
    fn distribution_sorts_and_converts_to_ms() {
        let d = distribution_ms(&[0.003, 0.001, 0.002]);
        assert!(close(d.mean, 2.0) && close(d.p50, 2.0) && close(d.max, 3.0));
        assert_eq!(distribution_ms(&[]), Distribution::default());
    }

    fn rec(ttft: f64, e2e: f64, out: usize, itl: Vec<f64>) -> RequestRecord {
        RequestRecord {
            ttft: Some(ttft),
            e2e,
            prompt_tokens: 10,
            output_tokens: out,
            itl,
            ..Default::default()
        }
    }

    #[test]
    fn summary_of_two_requests_and_a_failure() {
        let records = vec![
            // TPOT (1.1 − 0.1) / 4 = 0.25 s
            rec(0.1, 1.1, 5, vec![0.2, 0.3]),
            // TPOT (0.5 − 0.3) / 2 = 0.1 s
            rec(0.3, 0.5, 3, vec![0.1]),
            RequestRecord {
                error: Some("HTTP 500".into()),
                output_tokens: 99,
                ..Default::default()
            },
        ];
        let s = summarize(&records, 2.0, 2);
        assert_eq!((s.completed, s.failed), (2, 1));
        assert_eq!((s.total_input_tokens, s.total_output_tokens), (20, 8));
        assert!(close(s.output_throughput, 4.0));
        assert!(close(s.output_throughput_per_rank, 2.0));
        assert!(close(s.total_token_throughput, 14.0));
        assert!(close(s.request_throughput, 1.0));
        assert!(close(s.ttft_ms.mean, 200.0));
        assert!(close(s.tpot_ms.mean, 175.0));
        assert!(close(s.tok_s_per_user, 1000.0 / 175.0));
        assert!(close(s.itl_ms.p50, 200.0));
        assert!(close(s.e2el_ms.max, 1100.0));
    }
}
