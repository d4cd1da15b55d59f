//! The requests a layout is planned for, and how many of them fit in a KV cache at once.

use std::path::Path;

use anyhow::{bail, Context, Result};
use serde_json::Value;

/// One request's prompt and generated lengths, in tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestShape {
    pub input: usize,
    pub output: usize,
}

impl RequestShape {
    /// Tokens in the KV cache when the request finishes.
    pub fn final_len(&self) -> usize {
        self.input + self.output
    }
}

/// A sample of request shapes standing for the workload.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    pub requests: Vec<RequestShape>,
    /// How the sample was made, for the table's header.
    pub description: String,
}

/// Sample size of the synthetic distributions.
const SAMPLES: usize = 4096;

/// A deterministic generator (splitmix64), so a plan prints the same numbers every run.
struct SplitMix(u64);

impl SplitMix {
    fn next_unit(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        // 53 random bits in (0, 1].
        ((z >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }
}

impl Workload {
    /// Every request has `input` prompt tokens and generates `output`.
    pub fn fixed(input: usize, output: usize) -> Self {
        Workload {
            requests: vec![RequestShape { input, output }],
            description: format!("every request {input} prompt + {output} generated tokens"),
        }
    }

    /// Prompt lengths log-normally distributed around `median` (σ = `sigma` of the
    /// log), each request generating `output` tokens.
    pub fn lognormal(median: usize, sigma: f64, output: usize) -> Self {
        let mut rng = SplitMix(0x5EED);
        let requests = (0..SAMPLES)
            .map(|_| {
                // Box–Muller: a standard normal from two uniforms.
                let (u1, u2) = (rng.next_unit(), rng.next_unit());
                let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
                let input = (median as f64 * (sigma * z).exp()).round().max(1.0) as usize;
                RequestShape { input, output }
            })
            .collect();
        Workload {
            requests,
            description: format!(
                "prompts log-normal around a median of {median} tokens (σ {sigma}), {output} generated tokens each"
            ),
        }
    }

    /// Prompt lengths uniform in `lo..=hi`, each request generating `output` tokens.
    pub fn uniform(lo: usize, hi: usize, output: usize) -> Self {
        let (lo, hi) = (lo.min(hi), lo.max(hi));
        let requests = (0..SAMPLES)
            .map(|i| RequestShape {
                input: lo + ((hi - lo) as f64 * (i as f64 + 0.5) / SAMPLES as f64) as usize,
                output,
            })
            .collect();
        Workload {
            requests,
            description: format!(
                "prompts uniform in {lo}..={hi} tokens, {output} generated tokens each"
            ),
        }
    }

    /// A JSON-lines trace, one request per line with its prompt length (`input_len`,
    /// `input_length`, `prompt_len` or `prompt_tokens`) and optionally its output length
    /// (`output_len`, `output_length`, `output_tokens`, `completion_tokens` or
    /// `max_tokens`; else `default_output`).
    pub fn from_trace(path: &Path, default_output: usize) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the trace {}", path.display()))?;
        let field = |v: &Value, keys: &[&str]| keys.iter().find_map(|k| v.get(k)?.as_u64());
        let mut requests = Vec::new();
        for (i, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            let v: Value = serde_json::from_str(line)
                .with_context(|| format!("{} line {}: not JSON", path.display(), i + 1))?;
            let Some(input) = field(
                &v,
                &["input_len", "input_length", "prompt_len", "prompt_tokens"],
            ) else {
                bail!("{} line {}: no input_len", path.display(), i + 1);
            };
            let output = field(
                &v,
                &[
                    "output_len",
                    "output_length",
                    "output_tokens",
                    "completion_tokens",
                    "max_tokens",
                ],
            )
            .map_or(default_output, |o| o as usize);
            requests.push(RequestShape {
                input: input as usize,
                output,
            });
        }
        if requests.is_empty() {
            bail!("the trace {} holds no request", path.display());
        }
        let description = format!("{} requests from {}", requests.len(), path.display());
        Ok(Workload {
            requests,
            description,
        })
    }

    /// Mean KV blocks a request holds when it finishes, with `tokens_per_block` tokens
    /// per block (the engine's virtual block: block size × dcp).
    pub fn mean_blocks(&self, tokens_per_block: usize) -> f64 {
        let sum: usize = self
            .requests
            .iter()
            .map(|r| r.final_len().div_ceil(tokens_per_block.max(1)))
            .sum();
        sum as f64 / self.requests.len().max(1) as f64
    }

    /// Mean tokens a request attends to during its decode (prompt + half its output).
    pub fn mean_decode_context(&self) -> f64 {
        let sum: f64 = self
            .requests
            .iter()
            .map(|r| r.input as f64 + r.output as f64 / 2.0)
            .sum();
        sum / self.requests.len().max(1) as f64
    }

    /// Median prompt length of the sample.
    pub fn median_input(&self) -> usize {
        let mut inputs: Vec<usize> = self.requests.iter().map(|r| r.input).collect();
        inputs.sort_unstable();
        inputs.get(inputs.len() / 2).copied().unwrap_or(0)
    }
}

/// How many requests of `workload` run at once without preemption: as many as the KV
/// cache of `num_blocks` blocks holds at their final lengths (on average over the
/// sample), at most `max_num_seqs`.
pub fn max_concurrency(
    workload: &Workload,
    num_blocks: usize,
    tokens_per_block: usize,
    max_num_seqs: usize,
) -> usize {
    let per_request = workload.mean_blocks(tokens_per_block);
    if per_request <= 0.0 {
        return max_num_seqs;
    }
    ((num_blocks as f64 / per_request).floor() as usize).min(max_num_seqs)
}

/// Fraction of the KV cache `concurrency` requests of `workload` occupy at their final
/// lengths (above 1 when they do not fit).
pub fn kv_fraction_used(
    workload: &Workload,
    concurrency: usize,
    num_blocks: usize,
    tokens_per_block: usize,
) -> f64 {
    concurrency as f64 * workload.mean_blocks(tokens_per_block) / num_blocks.max(1) as f64
}
