//! Every [`Backend`] op on one backend against the same op on the [`CpuBackend`], on
//! random inputs: the kernel half of `dcpserve gpu-check`, which prints one line per op
//! with the largest absolute and relative differences.
//!
//! The inputs are the shapes a decoder layer uses (a few tokens, GQA heads, paged
//! caches with shuffled block tables, an MLA latent cache), small enough to run in a
//! second. Relative differences are taken against the largest magnitude of the CPU
//! result, so a near-zero element does not make the figure meaningless.

use crate::backend::{Backend, LatentAttentionParams, PagedAttentionParams, Strided};
use crate::cpu::CpuBackend;
use crate::dtype::DType;
use crate::error::KernelError;
use crate::kv_dtype::KvCacheDType;
use crate::matmul::Precision;
use crate::moe_routing::{RouterParams, RouterScoring};
use crate::ops::RopeScalingKind;
use crate::row_sampling::RowDraw;
use crate::sampling_params::SamplingParams;
use crate::weights::WeightMatrix;

/// How far one op's result on the checked backend is from the CPU's.
#[derive(Debug, Clone, PartialEq)]
pub struct OpDiff {
    /// The op and its case (`"matmul Q4_1 m=1"`).
    pub op: String,
    /// Largest `|device − cpu|` over the result's elements.
    pub max_abs: f64,
    /// `max_abs` divided by the largest `|cpu|` (0 when the result is all zeros).
    pub max_rel: f64,
    /// Elements compared.
    pub elements: usize,
}

impl std::fmt::Display for OpDiff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:<36} max abs {:.3e}  max rel {:.3e}  ({} values)",
            self.op, self.max_abs, self.max_rel, self.elements
        )
    }
}

fn diff(op: impl Into<String>, got: &[f32], want: &[f32]) -> Result<OpDiff, KernelError> {
    if got.len() != want.len() {
        return Err(KernelError::Shape(format!(
            "compare: {} values against {}",
            got.len(),
            want.len()
        )));
    }
    let mut max_abs = 0.0f64;
    let mut scale = 0.0f64;
    for (&g, &w) in got.iter().zip(want) {
        let (g, w) = (g as f64, w as f64);
        if w.is_infinite() || g.is_infinite() {
            // -inf log-sum-exp of an empty shard must match exactly.
            if g != w {
                max_abs = f64::INFINITY;
            }
            continue;
        }
        max_abs = max_abs.max((g - w).abs());
        scale = scale.max(w.abs());
    }
    Ok(OpDiff {
        op: op.into(),
        max_abs,
        max_rel: if scale > 0.0 { max_abs / scale } else { 0.0 },
        elements: got.len(),
    })
}

/// Deterministic uniform values in `[-1, 1)` (also the op tests' inputs).
pub(crate) struct Lcg(pub(crate) u64);

impl Lcg {
    pub(crate) fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    pub(crate) fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next()).collect()
    }
}

/// One op run on a backend from host inputs to host outputs, so the same closure runs
/// on both backends.
trait HostOp {
    fn run<B: Backend>(&self, dev: &B) -> Result<Vec<Vec<f32>>, KernelError>;
}

fn download<B: Backend>(dev: &B, buf: &B::Buffer) -> Result<Vec<f32>, KernelError> {
    let mut h = vec![0.0; dev.len(buf)];
    dev.download(dev.view(buf, 0..h.len())?, &mut h)?;
    Ok(h)
}

fn whole<'a, B: Backend>(dev: &B, buf: &'a B::Buffer) -> Result<B::View<'a>, KernelError> {
    dev.view(buf, 0..dev.len(buf))
}

fn whole_mut<'a, B: Backend>(
    dev: &B,
    buf: &'a mut B::Buffer,
) -> Result<B::ViewMut<'a>, KernelError> {
    let n = dev.len(buf);
    dev.view_mut(buf, 0..n)
}

struct Matmul {
    w: WeightMatrix,
    x: Vec<f32>,
    m: usize,
    precision: Precision,
}

impl HostOp for Matmul {
    fn run<B: Backend>(&self, dev: &B) -> Result<Vec<Vec<f32>>, KernelError> {
        let w = dev.upload_matrix(&self.w)?;
        let x = dev.upload(&self.x)?;
        let mut out = dev.zeros(self.m * self.w.rows())?;
        dev.matmul(
            whole(dev, &x)?,
            self.m,
            &w,
            whole_mut(dev, &mut out)?,
            self.precision,
        )?;
        Ok(vec![download(dev, &out)?])
    }
}

/// Norms, activations, residuals, RoPE (NeoX and interleaved, YaRN-free), the
/// embedding gather and the row movers.
struct Elementwise {
    x: Vec<f32>,
    y: Vec<f32>,
    weight: Vec<f32>,
    table: WeightMatrix,
    positions: Vec<usize>,
}

impl HostOp for Elementwise {
    fn run<B: Backend>(&self, dev: &B) -> Result<Vec<Vec<f32>>, KernelError> {
        let width = self.weight.len();
        let x = dev.upload(&self.x)?;
        let y = dev.upload(&self.y)?;
        let wt = dev.upload(&self.weight)?;
        let n = self.x.len();
        let mut outs = Vec::new();

        let mut o = dev.zeros(n)?;
        dev.rms_norm(
            whole(dev, &x)?,
            whole(dev, &wt)?,
            1e-5,
            whole_mut(dev, &mut o)?,
        )?;
        outs.push(download(dev, &o)?);

        dev.silu_mul(whole(dev, &x)?, whole(dev, &y)?, whole_mut(dev, &mut o)?)?;
        outs.push(download(dev, &o)?);

        let mut a = dev.upload(&self.x)?;
        dev.add(whole_mut(dev, &mut a)?, whole(dev, &y)?)?;
        dev.add_bias(whole_mut(dev, &mut a)?, whole(dev, &wt)?)?;
        outs.push(download(dev, &a)?);

        for interleaved in [false, true] {
            let head_dim = 64;
            let table = dev.rope_table(head_dim, 10000.0, RopeScalingKind::None, 4096)?;
            let mut r = dev.upload(&self.x)?;
            dev.rope(
                &table,
                whole_mut(dev, &mut r)?,
                &self.positions,
                head_dim,
                0,
                interleaved,
            )?;
            outs.push(download(dev, &r)?);
        }

        let table = dev.upload_matrix(&self.table)?;
        let ids: Vec<u32> = (0..self.positions.len() as u32)
            .map(|i| (i * 37) % self.table.rows() as u32)
            .collect();
        let mut e = dev.zeros(ids.len() * self.table.cols())?;
        dev.embedding(&table, &ids, whole_mut(dev, &mut e)?)?;
        outs.push(download(dev, &e)?);

        let rows = n / width;
        let pick: Vec<usize> = (0..rows).rev().step_by(2).collect();
        let mut g = dev.zeros(pick.len() * width)?;
        dev.gather_rows(whole(dev, &x)?, width, &pick, whole_mut(dev, &mut g)?)?;
        outs.push(download(dev, &g)?);
        let scales: Vec<f32> = (0..pick.len()).map(|j| 0.5 + j as f32 * 0.25).collect();
        let mut s = dev.upload(&self.y)?;
        dev.scatter_add_rows(
            whole(dev, &g)?,
            width,
            &pick,
            &scales,
            whole_mut(dev, &mut s)?,
        )?;
        outs.push(download(dev, &s)?);

        let half = width / 2;
        let mut c = dev.zeros(rows * half)?;
        dev.copy_strided(
            (whole(dev, &x)?, Strided::new(width, half / 2)),
            (whole_mut(dev, &mut c)?, Strided::packed(half)),
            rows,
            half,
        )?;
        outs.push(download(dev, &c)?);
        Ok(outs)
    }
}

/// Paged GQA attention after `write_kv` over shuffled blocks: decode tokens of a long
/// and a short sequence plus a causal prefill chunk, in the given cache dtype.
struct Paged {
    dtype: KvCacheDType,
    lens: Vec<usize>,
    k: Vec<f32>,
    v: Vec<f32>,
    q: Vec<f32>,
}

const NQ: usize = 8;
const NKV: usize = 2;
const HD: usize = 64;
const BS: usize = 16;

impl Paged {
    fn tables(&self) -> Vec<Vec<u32>> {
        // Sequence s's blocks interleave with the others' (block ids s, s + n, …).
        let n = self.lens.len();
        self.lens
            .iter()
            .enumerate()
            .map(|(s, &l)| (0..l.div_ceil(BS)).map(|b| (s + b * n) as u32).collect())
            .collect()
    }
}

impl HostOp for Paged {
    fn run<B: Backend>(&self, dev: &B) -> Result<Vec<Vec<f32>>, KernelError> {
        let tables = self.tables();
        let n_blocks = tables.iter().flatten().max().map_or(0, |&b| b as usize + 1);
        let row = NKV * HD;
        let mut kc = dev.kv_zeros(self.dtype, n_blocks * BS * row)?;
        let mut vc = dev.kv_zeros(self.dtype, n_blocks * BS * row)?;
        let mut slots = Vec::new();
        for (s, &l) in self.lens.iter().enumerate() {
            for j in 0..l {
                slots.push(tables[s][j / BS] as usize * BS + j % BS);
            }
        }
        let (k, v) = (dev.upload(&self.k)?, dev.upload(&self.v)?);
        let (kn, vn) = (dev.kv_len(&kc), dev.kv_len(&vc));
        dev.write_kv(
            dev.kv_view_mut(&mut kc, 0..kn)?,
            dev.kv_view_mut(&mut vc, 0..vn)?,
            NKV,
            HD,
            &slots,
            whole(dev, &k)?,
            whole(dev, &v)?,
        )?;
        // One decode token per sequence, then the last 5 positions of sequence 0 as a
        // causal prefill chunk.
        let mut token_seq: Vec<u32> = (0..self.lens.len() as u32).collect();
        let mut token_kv_len: Vec<u32> = self.lens.iter().map(|&l| l as u32).collect();
        for t in 0..5u32 {
            token_seq.push(0);
            token_kv_len.push(self.lens[0] as u32 - 4 + t);
        }
        let table_refs: Vec<&[u32]> = tables.iter().map(|t| t.as_slice()).collect();
        let p = PagedAttentionParams {
            n_q_heads: NQ,
            n_kv_heads: NKV,
            head_dim: HD,
            block_size: BS,
            scale: 1.0 / (HD as f32).sqrt(),
            token_seq: &token_seq,
            token_kv_len: &token_kv_len,
            block_tables: &table_refs,
        };
        let nt = token_seq.len();
        let q = dev.upload(&self.q[..nt * NQ * HD])?;
        let mut out = dev.zeros(nt * NQ * HD)?;
        let mut lse = dev.zeros(nt * NQ)?;
        dev.paged_attention(
            whole(dev, &q)?,
            &p,
            dev.kv_view(&kc, 0..kn)?,
            dev.kv_view(&vc, 0..vn)?,
            whole_mut(dev, &mut out)?,
            whole_mut(dev, &mut lse)?,
        )?;
        let (out_h, lse_h) = (download(dev, &out)?, download(dev, &lse)?);

        // The DCP merge of two halves of the heads' rows as if they were two shards.
        let rows = nt * NQ;
        let half = rows / 2;
        let a = dev.upload(&out_h[..half * HD])?;
        let b = dev.upload(&out_h[half * HD..2 * half * HD])?;
        let la = dev.upload(&lse_h[..half])?;
        let lb = dev.upload(&lse_h[half..2 * half])?;
        let mut mo = dev.zeros(half * HD)?;
        let mut ml = dev.zeros(half)?;
        dev.merge_lse(
            &[whole(dev, &a)?, whole(dev, &b)?],
            &[whole(dev, &la)?, whole(dev, &lb)?],
            half,
            HD,
            whole_mut(dev, &mut mo)?,
            whole_mut(dev, &mut ml)?,
        )?;
        let mut scaled = dev.upload(&out_h[..half * HD])?;
        let all_lse = dev.upload(&lse_h[..2 * half])?;
        dev.scale_by_lse_share(
            whole_mut(dev, &mut scaled)?,
            whole(dev, &la)?,
            whole(dev, &all_lse)?,
            2,
            HD,
        )?;
        Ok(vec![
            out_h,
            lse_h,
            download(dev, &mo)?,
            download(dev, &ml)?,
            download(dev, &scaled)?,
        ])
    }
}

/// MLA latent attention (absorbed queries, one latent head) after `write_rows`.
struct Latent {
    dtype: KvCacheDType,
    len: usize,
    rows: Vec<f32>,
    q: Vec<f32>,
}

const LAT_DIM: usize = 576;
const LAT_V: usize = 512;
const LAT_HEADS: usize = 4;

impl HostOp for Latent {
    fn run<B: Backend>(&self, dev: &B) -> Result<Vec<Vec<f32>>, KernelError> {
        let n_blocks = self.len.div_ceil(BS);
        let table: Vec<u32> = (0..n_blocks as u32).rev().collect();
        let mut cache = dev.kv_zeros(self.dtype, n_blocks * BS * LAT_DIM)?;
        let slots: Vec<usize> = (0..self.len)
            .map(|j| table[j / BS] as usize * BS + j % BS)
            .collect();
        let rows = dev.upload(&self.rows)?;
        let cn = dev.kv_len(&cache);
        dev.write_rows(
            dev.kv_view_mut(&mut cache, 0..cn)?,
            LAT_DIM,
            &slots,
            whole(dev, &rows)?,
        )?;
        let tables = [table.as_slice()];
        let p = LatentAttentionParams {
            n_heads: LAT_HEADS,
            dim: LAT_DIM,
            v_dim: LAT_V,
            block_size: BS,
            scale: 1.0 / (192f32).sqrt(),
            token_seq: &[0, 0],
            token_kv_len: &[self.len as u32 - 1, self.len as u32],
            block_tables: &tables,
        };
        let q = dev.upload(&self.q)?;
        let mut out = dev.zeros(2 * LAT_HEADS * LAT_V)?;
        let mut lse = dev.zeros(2 * LAT_HEADS)?;
        dev.latent_attention(
            whole(dev, &q)?,
            &p,
            dev.kv_view(&cache, 0..cn)?,
            whole_mut(dev, &mut out)?,
            whole_mut(dev, &mut lse)?,
        )?;
        let logits = download(dev, &out)?;
        let vocab = LAT_V;
        let am = dev.argmax(whole(dev, &out)?, vocab)?;
        let am: Vec<f32> = am
            .iter()
            .enumerate()
            .map(|(r, &i)| logits[r * vocab + i as usize])
            .collect();
        Ok(vec![logits, download(dev, &lse)?, am])
    }
}

/// MoE routing of a batch of tokens: the chosen expert ids (as f32, so any different
/// choice shows as a difference) and their weights.
struct Route {
    p: RouterParams,
    logits: Vec<f32>,
    bias: Option<Vec<f32>>,
}

impl HostOp for Route {
    fn run<B: Backend>(&self, dev: &B) -> Result<Vec<Vec<f32>>, KernelError> {
        let logits = dev.upload(&self.logits)?;
        let bias = self.bias.as_ref().map(|b| dev.upload(b)).transpose()?;
        let bias = bias.as_ref().map(|b| whole(dev, b)).transpose()?;
        let r = dev.route_experts(whole(dev, &logits)?, &self.p, bias)?;
        let ids = r.experts.iter().map(|&e| e as f32).collect();
        Ok(vec![ids, r.weights])
    }
}

/// `sample_rows` over rows of random logits with every kind of draw (greedy,
/// temperature, top-k, top-p, min-p, log-probabilities), each from a fixed uniform
/// number: tokens (−1 for a row left to the host), whether the number was used, the
/// chosen token's log-probability, and the top ids and log-probabilities.
struct SampleRows {
    logits: Vec<f32>,
    vocab: usize,
    params: Vec<SamplingParams>,
}

impl HostOp for SampleRows {
    fn run<B: Backend>(&self, dev: &B) -> Result<Vec<Vec<f32>>, KernelError> {
        let buf = dev.upload(&self.logits)?;
        let rows = self.logits.len() / self.vocab;
        let mut draws = Vec::new();
        for r in 0..rows {
            for (c, p) in self.params.iter().enumerate() {
                let uniform = ((r * 7 + c * 3) % 19) as f64 / 19.0 + 0.013;
                draws.push(RowDraw {
                    row: r,
                    params: p,
                    uniform: (!p.is_greedy()).then_some(uniform),
                    top_logprobs: p.logprobs,
                });
            }
        }
        let got = dev.sample_rows(whole(dev, &buf)?, self.vocab, &draws)?;
        let mut out = vec![Vec::new(); 5];
        for (g, d) in got.iter().zip(&draws) {
            let k = d.top_logprobs.unwrap_or(0);
            match g {
                Some(g) => {
                    out[0].push(g.token as f32);
                    out[1].push(g.used_uniform as u8 as f32);
                    out[2].push(g.logprob.unwrap_or(0.0));
                    for i in 0..k {
                        let (id, lp) = g.top_logprobs.get(i).copied().unwrap_or((0, 0.0));
                        out[3].push(id as f32);
                        out[4].push(lp);
                    }
                }
                None => {
                    out[0].push(-1.0);
                    out[1].push(-1.0);
                    out[2].push(0.0);
                    out[3].extend(std::iter::repeat_n(-1.0, k));
                    out[4].extend(std::iter::repeat_n(0.0, k));
                }
            }
        }
        Ok(out)
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
/// use dcpserve_kernels::backend::compare::compare_with_cpu;
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

    #[test]
    fn diff_reports_the_largest_error_relative_to_the_reference_scale() {
        let d = diff(
            "x",
            &[1.0, 2.5, f32::NEG_INFINITY],
            &[1.0, 2.0, f32::NEG_INFINITY],
        )
        .unwrap();
        assert_eq!(d.max_abs, 0.5);
        assert_eq!(d.max_rel, 0.25);
        let d = diff("x", &[0.0], &[f32::NEG_INFINITY]).unwrap();
        assert!(d.max_abs.is_infinite());
        assert!(diff("x", &[0.0], &[]).is_err());
    }
}
