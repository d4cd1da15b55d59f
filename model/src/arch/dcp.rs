//! The communication half of decode-context-parallel attention, shared by every
//! attention kind (GQA heads, MLA's absorbed latent queries): gather the DCP group's
//! queries, then merge the per-shard partial outputs by their log-sum-exp and
//! reduce-scatter over heads (vLLM's `cp_lse_ag_out_rs`). The attention itself, against
//! the local KV shard, happens in between and is the caller's.

use dcpserve_kernels::Communicator;

use crate::error::ModelError;

fn resize(v: &mut Vec<f32>, len: usize) {
    v.clear();
    v.resize(len, 0.0);
}

/// Gathered queries of a DCP group, reused across layers.
#[derive(Default)]
pub struct GroupQueries {
    gathered: Vec<f32>,
    all: Vec<f32>,
}

impl GroupQueries {
    /// All-gathers every rank's `[n, h, d]` queries and returns them as
    /// `[n, ranks·h, d]` (rank r's heads at `r·h..(r+1)·h`).
    pub fn gather(
        &mut self,
        group: &dyn Communicator,
        q: &[f32],
        n: usize,
        h: usize,
        d: usize,
    ) -> Result<&[f32], ModelError> {
        let ranks = group.size();
        let all_h = ranks * h;
        let row = h * d;
        resize(&mut self.gathered, ranks * n * row);
        group.all_gather(q, &mut self.gathered)?;
        resize(&mut self.all, n * all_h * d);
        for r in 0..ranks {
            for t in 0..n {
                let src = &self.gathered[(r * n + t) * row..(r * n + t + 1) * row];
                self.all[(t * all_h + r * h) * d..(t * all_h + (r + 1) * h) * d]
                    .copy_from_slice(src);
            }
        }
        Ok(&self.all)
    }
}

/// Partial outputs of the local shard and their merge, reused across layers.
#[derive(Default)]
pub struct ShardMerge {
    out_all: Vec<f32>,
    lse_all: Vec<f32>,
    lse_gathered: Vec<f32>,
    scattered: Vec<f32>,
}

impl ShardMerge {
    /// Buffers for the local attention's output `[n, heads, vd]` and LSE `[n, heads]`.
    pub fn partials(&mut self, n: usize, heads: usize, vd: usize) -> (&mut [f32], &mut [f32]) {
        resize(&mut self.out_all, n * heads * vd);
        resize(&mut self.lse_all, n * heads);
        (&mut self.out_all, &mut self.lse_all)
    }

    /// All-gathers the LSEs, weights each local partial by `exp(LSE_i − LSE)` (0 for an
    /// empty shard, whose LSE is −inf: never NaN) and reduce-scatters over heads, so
    /// `out` (`[n, h, vd]`) receives this rank's `h` heads merged over all shards.
    pub fn merge_into(
        &mut self,
        group: &dyn Communicator,
        n: usize,
        h: usize,
        vd: usize,
        out: &mut [f32],
    ) -> Result<(), ModelError> {
        let ranks = group.size();
        let all_h = ranks * h;
        resize(&mut self.lse_gathered, ranks * n * all_h);
        group.all_gather(&self.lse_all, &mut self.lse_gathered)?;
        // Weighted partials laid out [rank, token, head, v] so the reduce-scatter hands
        // each rank its own heads.
        resize(&mut self.scattered, ranks * n * h * vd);
        let stride = n * all_h;
        for t in 0..n {
            for j in 0..all_h {
                let idx = t * all_h + j;
                let mine = self.lse_all[idx];
                let max = (0..ranks)
                    .map(|r| self.lse_gathered[r * stride + idx])
                    .fold(f32::NEG_INFINITY, f32::max);
                let weight = if mine == f32::NEG_INFINITY || max == f32::NEG_INFINITY {
                    0.0
                } else {
                    let sum: f32 = (0..ranks)
                        .map(|r| (self.lse_gathered[r * stride + idx] - max).exp())
                        .sum();
                    (mine - (max + sum.ln())).exp()
                };
                let (r, jj) = (j / h, j % h);
                let dst = ((r * n + t) * h + jj) * vd;
                let src = &self.out_all[idx * vd..(idx + 1) * vd];
                for (o, &x) in self.scattered[dst..dst + vd].iter_mut().zip(src) {
                    *o = x * weight;
                }
            }
        }
        group.reduce_scatter_sum(&self.scattered, out)?;
        Ok(())
    }
}
