//! MLA attention under decode context parallelism: the latent cache is sharded by
//! position over the DCP group, so each rank attends the absorbed queries of the whole
//! group to its shard and the partials are merged by log-sum-exp (vLLM's
//! `cp_lse_ag_out_rs`, the same math as the dense path's `DcpScratch`).

use dcpserve_kernels::{Communicator, ThreadPool};

use super::attention::{latent_attention, LatentBatch};
use crate::error::ModelError;

/// Buffers reused across layers.
#[derive(Default)]
pub struct LatentDcp {
    q_gathered: Vec<f32>,
    q_all: Vec<f32>,
    out_all: Vec<f32>,
    lse_all: Vec<f32>,
    lse_gathered: Vec<f32>,
    scattered: Vec<f32>,
}

fn resize(v: &mut Vec<f32>, len: usize) {
    v.clear();
    v.resize(len, 0.0);
}

fn comm_err(e: impl std::fmt::Display) -> ModelError {
    ModelError::Invalid(format!("DCP collective: {e}"))
}

impl LatentDcp {
    /// All-gathers the group's absorbed queries (`[token, rank·head, dim]`), attends them
    /// to the local latent shard (output + LSE), all-gathers the LSEs, scales each local
    /// partial by `exp(LSE_i − LSE)` and reduce-scatters over heads, so `out`
    /// (`[tokens, local heads, v_dim]`) receives this rank's heads merged over all shards.
    /// Empty shards have LSE = −inf and weight 0.
    pub fn attention(
        &mut self,
        pool: &ThreadPool,
        group: &dyn Communicator,
        local: LatentBatch,
        cache: &[f32],
        out: &mut [f32],
    ) -> Result<(), ModelError> {
        let ranks = group.size();
        let n = local.token_seq.len();
        let (h, d, vd) = (local.n_heads, local.dim, local.v_dim);
        let all_h = ranks * h;
        resize(&mut self.q_gathered, ranks * n * h * d);
        group
            .all_gather(local.q, &mut self.q_gathered)
            .map_err(comm_err)?;
        // [rank, token, head, d] → [token, rank·head, d]
        resize(&mut self.q_all, n * all_h * d);
        for r in 0..ranks {
            for t in 0..n {
                let src = &self.q_gathered[(r * n + t) * h * d..(r * n + t + 1) * h * d];
                self.q_all[(t * all_h + r * h) * d..(t * all_h + (r + 1) * h) * d]
                    .copy_from_slice(src);
            }
        }
        resize(&mut self.out_all, n * all_h * vd);
        resize(&mut self.lse_all, n * all_h);
        let batch = LatentBatch {
            q: &self.q_all,
            n_heads: all_h,
            ..local
        };
        latent_attention(pool, &batch, cache, &mut self.out_all, &mut self.lse_all)?;
        resize(&mut self.lse_gathered, ranks * n * all_h);
        group
            .all_gather(&self.lse_all, &mut self.lse_gathered)
            .map_err(comm_err)?;
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
        group
            .reduce_scatter_sum(&self.scattered, out)
            .map_err(comm_err)?;
        Ok(())
    }
}
