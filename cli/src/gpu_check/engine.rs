//! The engine on the test fixtures under a checked configuration (a device, a
//! layout) against the CPU engine at one rank: greedy tokens and their log-probs.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use dcpserve::{DType, Engine, EngineConfig, GenerationEvent, ParallelConfig, Prompt};
use futures::StreamExt;

/// One checked case: a fixture, a layout and a weight precision.
#[derive(Debug, Clone)]
pub struct EngineCase {
    /// Fixture folder under `fixtures/`.
    pub fixture: &'static str,
    /// Tensor-parallel size.
    pub tp: usize,
    /// Prefill-context-parallel size (copies of the TP group).
    pub pcp: usize,
    /// Decode-context-parallel size.
    pub dcp: usize,
    /// `cp_kv_cache_interleave_size`.
    pub interleave: usize,
    /// Weight and activation precision of both engines.
    pub dtype: DType,
    /// Two micro-batches per rank (`overlap_micro_batches`; on a GPU, one stream each).
    pub overlap: bool,
}

impl EngineCase {
    /// Largest |Δ log-prob| accepted: float32 differs from the CPU only by summation
    /// order; in bfloat16 a device may also round activations to bf16 before a GEMM
    /// (2⁻⁹ relative per value), which over a few layers moves log-probs by a few
    /// hundredths, and a near-tie may pick another greedy token (reported, and only
    /// a failure in float32).
    pub fn tolerance(&self) -> f32 {
        match self.dtype {
            DType::Float32 => 1e-3,
            _ => 0.15,
        }
    }

    fn name(&self) -> String {
        format!(
            "{} tp={}{} dcp={} I={} {:?}{}",
            self.fixture,
            self.tp,
            if self.pcp > 1 {
                format!(" pcp={}", self.pcp)
            } else {
                String::new()
            },
            self.dcp,
            self.interleave,
            self.dtype,
            if self.overlap { " 2mb" } else { "" }
        )
    }
}

/// One rank, tp=2 dcp=2, tp=4 dcp=2 with an interleave of 16 (on one GPU, ranks
/// sharing the device), and MLA at tp=4 dcp=4; each in float32 and bfloat16. Prefill
/// context parallelism at tp=2 pcp=2 (GQA) and pcp=2 (MLA), float32. Then two
/// of the multi-rank layouts again with two micro-batches (float32, so tokens must
/// match): on a GPU each micro-batch computes and communicates on its own stream.
pub fn default_cases() -> Vec<EngineCase> {
    let mut v = Vec::new();
    for dtype in [DType::Float32, DType::Bfloat16] {
        for (fixture, tp, dcp, interleave) in [
            ("tiny-llama", 1, 1, 1),
            // GQA needs more ranks than KV heads (tiny-llama has 2) for dcp: tp=2 dcp=2
            // runs on the MLA fixture.
            ("tiny-deepseek", 2, 2, 1),
            ("tiny-llama", 4, 2, 16),
            ("tiny-deepseek", 4, 4, 1),
        ] {
            v.push(EngineCase {
                fixture,
                tp,
                pcp: 1,
                dcp,
                interleave,
                dtype,
                overlap: false,
            });
        }
    }
    // Prefill context parallelism: two copies of the TP group split every step's tokens.
    for (fixture, tp, pcp, dcp) in [("tiny-llama", 2, 2, 1), ("tiny-deepseek", 1, 2, 1)] {
        v.push(EngineCase {
            fixture,
            tp,
            pcp,
            dcp,
            interleave: 1,
            dtype: DType::Float32,
            overlap: false,
        });
    }
    for (fixture, tp, dcp, interleave) in [("tiny-deepseek", 2, 2, 1), ("tiny-llama", 4, 2, 16)] {
        v.push(EngineCase {
            fixture,
            tp,
            pcp: 1,
            dcp,
            interleave,
            dtype: DType::Float32,
            overlap: true,
        });
    }
    v
}

/// Prompts of 1 to 150 tokens (ids avoid the special tokens 0..3), long enough that
/// prefill spans several KV blocks and chunked-prefill steps.
fn prompts(vocab: u32) -> Vec<Vec<u32>> {
    [1usize, 9, 40, 150]
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            (0..n)
                .map(|j| ((j * 131 + i * 71) as u32 % (vocab - 3)) + 3)
                .collect()
        })
        .collect()
}

type Run = Vec<Vec<(u32, f32)>>;

async fn generate(engine: &Engine, prompts: &[Vec<u32>], n: usize) -> Result<Run> {
    let mut streams = Vec::new();
    for p in prompts {
        let mut params = dcpserve::SamplingParams {
            max_tokens: n,
            ignore_eos: true,
            ..Default::default()
        };
        params.temperature = 0.0;
        params.logprobs = Some(1);
        streams.push(engine.generate(Prompt::Tokens(p.clone()), params)?);
    }
    let mut out = Vec::new();
    for mut s in streams {
        let mut toks = Vec::new();
        while let Some(ev) = s.next().await {
            match ev? {
                GenerationEvent::Token { token, .. } => {
                    toks.push((token.token_id, token.logprob.unwrap_or(f32::NAN)))
                }
                GenerationEvent::Finished { .. } => break,
            }
        }
        out.push(toks);
    }
    Ok(out)
}

fn config(case: &EngineCase, dtype: DType) -> EngineConfig {
    EngineConfig {
        overlap_micro_batches: case.overlap,
        parallel: ParallelConfig {
            tensor_parallel_size: case.tp,
            prefill_context_parallel_size: case.pcp,
            decode_context_parallel_size: case.dcp,
            cp_kv_cache_interleave_size: case.interleave,
        },
        dtype,
        kv_cache_memory_bytes: Some(64 << 20),
        max_num_batched_tokens: 128,
        num_threads: Some(2),
        ..Default::default()
    }
}

/// The result of one case.
#[derive(Debug, Clone)]
pub struct CaseResult {
    /// Case name.
    pub name: String,
    /// Greedy tokens equal to the CPU engine's, for every prompt.
    pub same_tokens: bool,
    /// Largest |Δ log-prob| over the positions where both chose the same token.
    pub max_logprob_diff: f32,
    /// The accepted difference.
    pub tolerance: f32,
    /// A float32 case (tokens must match).
    pub exact: bool,
}

impl CaseResult {
    /// Log-probs within the tolerance, and (in float32) the same tokens.
    pub fn passed(&self) -> bool {
        (self.same_tokens || !self.exact) && self.max_logprob_diff <= self.tolerance
    }
}

/// Runs `case` with `checked` applied to its configuration (e.g. the device) and the
/// CPU engine at one rank in the same precision, and compares them.
pub async fn check_case(
    fixtures: &Path,
    case: &EngineCase,
    checked: &dyn Fn(EngineConfig) -> EngineConfig,
) -> Result<CaseResult> {
    let model: PathBuf = fixtures.join(case.fixture);
    let cpu_case = EngineCase {
        tp: 1,
        pcp: 1,
        dcp: 1,
        interleave: 1,
        overlap: false,
        ..case.clone()
    };
    let reference = Engine::builder(&model)
        .config(config(&cpu_case, case.dtype))
        .build()
        .await
        .with_context(|| format!("CPU engine on {}", model.display()))?;
    let vocab = reference.tokenizer().vocab_size() as u32;
    let prompts = prompts(vocab);
    let want = generate(&reference, &prompts, 12).await?;
    drop(reference);
    let engine = Engine::builder(&model)
        .config(checked(config(case, case.dtype)))
        .build()
        .await
        .with_context(|| format!("checked engine, {}", case.name()))?;
    let got = generate(&engine, &prompts, 12).await?;
    let mut same_tokens = got.len() == want.len();
    let mut max_diff = 0.0f32;
    for (g, w) in got.iter().zip(&want) {
        same_tokens &= g.len() == w.len();
        for (&(gt, gl), &(wt, wl)) in g.iter().zip(w) {
            if gt != wt {
                same_tokens = false;
                break;
            }
            max_diff = max_diff.max((gl - wl).abs());
        }
    }
    Ok(CaseResult {
        name: case.name(),
        same_tokens,
        max_logprob_diff: max_diff,
        tolerance: case.tolerance(),
        exact: case.dtype == DType::Float32,
    })
}

/// The report's engine section: one line per case.
pub async fn report(
    fixtures: &Path,
    cases: &[EngineCase],
    checked: &dyn Fn(EngineConfig) -> EngineConfig,
) -> Result<(String, bool)> {
    let mut s = String::new();
    let mut all = true;
    for case in cases {
        let r = check_case(fixtures, case, checked).await?;
        all &= r.passed();
        s += &format!(
            "{:<44} greedy tokens {}  max |Δ logprob| {:.2e} (tolerance {})  {}\n",
            r.name,
            if r.same_tokens { "equal" } else { "DIFFER" },
            r.max_logprob_diff,
            r.tolerance,
            if r.passed() { "ok" } else { "FAILED" }
        );
    }
    Ok((s, all))
}
