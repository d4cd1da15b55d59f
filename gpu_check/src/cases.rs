//! The op cases [`compare_with_cpu`](crate::compare_with_cpu) runs: each a [`HostOp`]
//! from host inputs to host outputs, so the same case runs on both backends.

use dcpserve_kernels::row_sampling::RowDraw;
use dcpserve_kernels::{
    Backend, KernelError, KvCacheDType, LatentAttentionParams, PagedAttentionParams, PagedBatch,
    Precision, RopeScalingKind, RouterParams, SamplingParams, Strided, WeightMatrix,
};

/// One op run on a backend from host inputs to host outputs, so the same closure runs
/// on both backends.
pub(crate) trait HostOp {
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

pub(crate) struct Matmul {
    pub(crate) w: WeightMatrix,
    pub(crate) x: Vec<f32>,
    pub(crate) m: usize,
    pub(crate) precision: Precision,
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
pub(crate) struct Elementwise {
    pub(crate) x: Vec<f32>,
    pub(crate) y: Vec<f32>,
    pub(crate) weight: Vec<f32>,
    pub(crate) table: WeightMatrix,
    pub(crate) positions: Vec<usize>,
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
pub(crate) struct Paged {
    pub(crate) dtype: KvCacheDType,
    pub(crate) lens: Vec<usize>,
    pub(crate) k: Vec<f32>,
    pub(crate) v: Vec<f32>,
    pub(crate) q: Vec<f32>,
}

pub(crate) const NQ: usize = 8;
pub(crate) const NKV: usize = 2;
pub(crate) const HD: usize = 64;
pub(crate) const BS: usize = 16;

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
        let mut kc = dev.kv_zeros(self.dtype, n_blocks * BS * row, HD)?;
        let mut vc = dev.kv_zeros(self.dtype, n_blocks * BS * row, HD)?;
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
            scale: 1.0 / (HD as f32).sqrt(),
            batch: PagedBatch {
                block_size: BS,
                token_seq: &token_seq,
                token_kv_len: &token_kv_len,
                block_tables: &table_refs,
            },
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
pub(crate) struct Latent {
    pub(crate) dtype: KvCacheDType,
    pub(crate) len: usize,
    pub(crate) rows: Vec<f32>,
    pub(crate) q: Vec<f32>,
}

pub(crate) const LAT_DIM: usize = 576;
pub(crate) const LAT_V: usize = 512;
pub(crate) const LAT_HEADS: usize = 4;

impl HostOp for Latent {
    fn run<B: Backend>(&self, dev: &B) -> Result<Vec<Vec<f32>>, KernelError> {
        let n_blocks = self.len.div_ceil(BS);
        let table: Vec<u32> = (0..n_blocks as u32).rev().collect();
        let mut cache = dev.kv_zeros(self.dtype, n_blocks * BS * LAT_DIM, LAT_DIM)?;
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
            scale: 1.0 / (192f32).sqrt(),
            batch: PagedBatch {
                block_size: BS,
                token_seq: &[0, 0],
                token_kv_len: &[self.len as u32 - 1, self.len as u32],
                block_tables: &tables,
            },
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
pub(crate) struct Route {
    pub(crate) p: RouterParams,
    pub(crate) logits: Vec<f32>,
    pub(crate) bias: Option<Vec<f32>>,
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
pub(crate) struct SampleRows {
    pub(crate) logits: Vec<f32>,
    pub(crate) vocab: usize,
    pub(crate) params: Vec<SamplingParams>,
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
