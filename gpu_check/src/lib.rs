//! Every [`Backend`] op on one backend against the same op on the [`CpuBackend`], on
//! random inputs: the kernel half of `dcpserve gpu-check`, which prints one line per op
//! with the largest absolute and relative differences.
//!
//! The inputs are the shapes a decoder layer uses (a few tokens, GQA heads, paged
//! caches with shuffled block tables, an MLA latent cache), small enough to run in a
//! second. Relative differences are taken against the largest magnitude of the CPU
//! result, so a near-zero element does not make the figure meaningless.
//!
//! A crate of its own rather than a module of `dcpserve-kernels`: it is a diagnostic
//! that drives the backends through their public API only, and only the
//! `dcpserve gpu-check` command runs it.

mod cases;
mod diff;

use dcpserve_kernels::{
    Backend, CpuBackend, DType, KernelError, KvCacheDType, Precision, RouterParams, RouterScoring,
    SamplingParams, WeightMatrix,
};

use cases::{
    Elementwise, HostOp, Latent, Matmul, Paged, Route, SampleRows, HD, LAT_DIM, LAT_HEADS, NKV, NQ,
};
use diff::diff;
pub use diff::OpDiff;

/// Deterministic uniform values in `[-1, 1)`: the cases' inputs.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next()).collect()
    }
}

fn compare_op<B: Backend, O: HostOp>(
    dev: &B,
    cpu: &CpuBackend,
    op: &O,
    names: &[&str],
    out: &mut Vec<OpDiff>,
) -> Result<(), KernelError> {
    let got = op.run(dev)?;
    let want = op.run(cpu)?;
    for ((g, w), name) in got.iter().zip(&want).zip(names) {
        out.push(diff(*name, g, w)?);
    }
    Ok(())
}

/// Runs every op on `dev` and on `cpu` and returns their differences, one entry per
/// op and case. The CPU is the reference; `dev` is usually a GPU backend, and a CPU
/// backend against itself gives zeros (which the tests check).
///
/// ```
/// use dcpserve_gpu_check::compare_with_cpu;
/// use dcpserve_kernels::CpuBackend;
/// let diffs = compare_with_cpu(&CpuBackend::new(1), &CpuBackend::new(1)).unwrap();
/// assert!(diffs.iter().all(|d| d.max_abs == 0.0));
/// ```
pub fn compare_with_cpu<B: Backend>(dev: &B, cpu: &CpuBackend) -> Result<Vec<OpDiff>, KernelError> {
    let mut out = Vec::new();
    let mut rng = Lcg(0x5eed);
    for dtype in [
        DType::F32,
        DType::BF16,
        DType::Q8_0,
        DType::Q4_1,
        DType::Q4_K,
    ] {
        let (n, k) = (96, 256);
        let w = WeightMatrix::from_f32(n, k, rng.vec(n * k))?.to_format(dtype)?;
        // `Fast` lets both sides round activations to bf16 for bf16 weights (a GPU's
        // tensor cores, the CPU's `vdpbf16ps`).
        for (m, precision) in [
            (1, Precision::Exact),
            (37, Precision::Exact),
            (37, Precision::Fast),
        ] {
            let op = Matmul {
                w: w.clone(),
                x: rng.vec(m * k),
                m,
                precision,
            };
            let name = format!("matmul {dtype:?} m={m} {precision:?}");
            compare_op(dev, cpu, &op, &[&name], &mut out)?;
        }
    }
    let (tokens, width) = (6, 576);
    let el = Elementwise {
        x: rng.vec(tokens * width),
        y: rng.vec(tokens * width),
        weight: rng.vec(width),
        table: WeightMatrix::from_f32(50, width, rng.vec(50 * width))?.to_format(DType::Q8_0)?,
        positions: vec![0, 1, 7, 100, 2047, 4095],
    };
    compare_op(
        dev,
        cpu,
        &el,
        &[
            "rms_norm",
            "silu_mul",
            "add + add_bias",
            "rope (neox)",
            "rope (interleaved)",
            "embedding (Q8_0 table)",
            "gather_rows",
            "scatter_add_rows",
            "copy_strided",
        ],
        &mut out,
    )?;
    for dtype in [KvCacheDType::F32, KvCacheDType::BF16, KvCacheDType::Fp8E4M3] {
        let lens = vec![700, 33, 1];
        let total: usize = lens.iter().sum();
        let op = Paged {
            dtype,
            k: rng.vec(total * NKV * HD),
            v: rng.vec(total * NKV * HD),
            q: rng.vec((lens.len() + 5) * NQ * HD),
            lens,
        };
        let n = |s: &str| format!("{s} ({})", dtype.name());
        compare_op(
            dev,
            cpu,
            &op,
            &[
                &n("paged_attention out"),
                &n("paged_attention lse"),
                &n("merge_lse out"),
                &n("merge_lse lse"),
                &n("scale_by_lse_share"),
            ],
            &mut out,
        )?;
        let len = 300;
        let op = Latent {
            dtype,
            len,
            rows: rng.vec(len * LAT_DIM),
            q: rng.vec(2 * LAT_HEADS * LAT_DIM),
        };
        compare_op(
            dev,
            cpu,
            &op,
            &[
                &n("latent_attention out"),
                &n("latent_attention lse"),
                &n("argmax (value at index)"),
            ],
            &mut out,
        )?;
    }
    // DeepSeek-V3's routing (sigmoid, 8 groups of 32, the best 4, 8 per token, bias)
    // and V2's (softmax, 8 groups of 20, the best 3, 6 per token).
    let tokens = 37;
    let v3 = RouterParams {
        n_experts: 256,
        experts_per_token: 8,
        n_group: 8,
        topk_group: 4,
        group_limited: true,
        scoring: RouterScoring::Sigmoid,
        norm_topk_prob: true,
        routed_scaling_factor: 2.5,
    };
    let v2 = RouterParams {
        n_experts: 160,
        experts_per_token: 6,
        topk_group: 3,
        scoring: RouterScoring::Softmax,
        norm_topk_prob: false,
        routed_scaling_factor: 16.0,
        ..v3
    };
    for (name, p, bias) in [("V3", v3, true), ("V2", v2, false)] {
        let e = p.n_experts;
        let op = Route {
            p,
            logits: rng.vec(tokens * e).iter().map(|v| 4.0 * v).collect(),
            bias: bias.then(|| rng.vec(e).iter().map(|v| 0.1 * v).collect()),
        };
        let (ids, weights) = (
            format!("route_experts {name} experts"),
            format!("route_experts {name} weights"),
        );
        compare_op(dev, cpu, &op, &[&ids, &weights], &mut out)?;
    }
    let vocab = 4096;
    let with = |f: &dyn Fn(&mut SamplingParams)| {
        let mut p = SamplingParams::default();
        f(&mut p);
        p
    };
    let op = SampleRows {
        // Logits spread as a model's are (a few likely tokens, a long tail).
        logits: rng.vec(6 * vocab).iter().map(|x| x * 6.0).collect(),
        vocab,
        params: vec![
            with(&|p| {
                p.temperature = 0.0;
                p.logprobs = Some(5);
            }),
            with(&|p| p.logprobs = Some(1)),
            with(&|p| p.temperature = 0.7),
            with(&|p| {
                p.top_k = 40;
                p.logprobs = Some(0);
            }),
            with(&|p| p.top_p = 0.9),
            with(&|p| {
                p.top_k = 200;
                p.top_p = 0.8;
                p.min_p = 0.02;
                p.logprobs = Some(20);
            }),
            with(&|p| p.min_p = 0.1),
        ],
    };
    compare_op(
        dev,
        cpu,
        &op,
        &[
            "sample_rows tokens",
            "sample_rows used uniform",
            "sample_rows logprob",
            "sample_rows top ids",
            "sample_rows top logprobs",
        ],
        &mut out,
    )?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_against_itself_is_exact() {
        let diffs = compare_with_cpu(&CpuBackend::new(2), &CpuBackend::new(2)).unwrap();
        assert!(diffs.len() > 30, "{} ops compared", diffs.len());
        for d in &diffs {
            assert!(d.elements > 0, "{d}");
            assert_eq!(d.max_abs, 0.0, "{d}");
        }
    }
}
