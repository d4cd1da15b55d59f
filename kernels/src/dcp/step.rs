//! The one DCP attention step, for every attention kind (GQA heads, MLA's absorbed
//! latent queries): gather the DCP group's queries, let the caller attend them to its
//! local KV shard (output + LSE), exchange the partials, merge them by log-sum-exp, and
//! leave each rank its own heads (vLLM's `cp_lse_ag_out_rs`, with the exchange batched).

use serde::{Deserialize, Serialize};

use super::merge::{merge_rows, merged_lse, shard_weight};
use crate::comm::Communicator;
use crate::error::KernelError;

/// How the partial outputs and their LSEs travel between the ranks of a DCP group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MergeExchange {
    /// One all-to-all: rank r sends rank s the partial outputs of s's heads together
    /// with their LSEs, and every rank merges its own heads locally.
    #[default]
    AllToAll,
    /// The earlier two calls, kept to measure against (`bench-dcp --section merge`): an
    /// all-gather of the LSEs, then a reduce-scatter of the weighted partial outputs.
    AllGatherReduceScatter,
}

/// The shape of one DCP attention call, from this rank's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DcpShape {
    /// Tokens in the batch.
    pub tokens: usize,
    /// This rank's query heads (the group attends `group size × heads`).
    pub heads: usize,
    /// Values per query head.
    pub q_dim: usize,
    /// Values per output head.
    pub v_dim: usize,
}

/// Buffers of the DCP attention step, reused across layers and steps.
#[derive(Default)]
pub struct DcpAttention {
    exchange: MergeExchange,
    gathered: Vec<f32>,
    q_all: Vec<f32>,
    out_all: Vec<f32>,
    lse_all: Vec<f32>,
    send: Vec<f32>,
    recv: Vec<f32>,
    lse_mine: Vec<f32>,
}

fn resize(v: &mut Vec<f32>, len: usize) {
    v.clear();
    v.resize(len, 0.0);
}

impl DcpAttention {
    /// A step whose partials travel by `exchange`.
    pub fn new(exchange: MergeExchange) -> Self {
        Self {
            exchange,
            ..Self::default()
        }
    }

    /// Attention with the KV cache sharded by position over `group`.
    ///
    /// `q` is this rank's `[tokens, heads, q_dim]` queries. `attend(q_all, heads_all,
    /// out, lse)` must attend `q_all` (`[tokens, heads_all, q_dim]`, rank r's heads at
    /// `r·heads..(r+1)·heads`) to the local shard, writing `out` (`[tokens, heads_all,
    /// v_dim]`) and `lse` (`[tokens, heads_all]`, −inf where the shard holds nothing).
    /// `out` (`[tokens, heads, v_dim]`) then receives this rank's heads merged over all
    /// shards. With a group of one, `attend` sees `q` itself and writes `out` directly.
    ///
    /// `attend` is the only place the caller may touch its KV cache: no collective runs
    /// while it does (micro-batch overlap relies on it).
    ///
    /// ```
    /// use dcpserve_kernels::dcp::{DcpAttention, DcpShape, MergeExchange};
    /// use dcpserve_kernels::{Communicator, InProcessComm, KernelError};
    /// // Two ranks, one head each, one token; rank r's shard holds one key whose
    /// // value is r + 1 and whose score is 0 for every query: the merged output is
    /// // the mean, 1.5, on both ranks.
    /// let comms = InProcessComm::group(2);
    /// std::thread::scope(|s| {
    ///     for c in &comms {
    ///         s.spawn(move || {
    ///             let shape = DcpShape { tokens: 1, heads: 1, q_dim: 1, v_dim: 1 };
    ///             let mut step = DcpAttention::new(MergeExchange::AllToAll);
    ///             let mut out = [0.0];
    ///             step.run(c, &[1.0], shape, &mut out, |q_all, heads_all, o, lse| {
    ///                 assert_eq!((q_all.len(), heads_all), (2, 2));
    ///                 o.fill(c.rank() as f32 + 1.0);
    ///                 lse.fill(0.0);
    ///                 Ok::<(), KernelError>(())
    ///             })
    ///             .unwrap();
    ///             assert_eq!(out, [1.5]);
    ///         });
    ///     }
    /// });
    /// ```
    pub fn run<E: From<KernelError>>(
        &mut self,
        group: &dyn Communicator,
        q: &[f32],
        shape: DcpShape,
        out: &mut [f32],
        attend: impl FnOnce(&[f32], usize, &mut [f32], &mut [f32]) -> Result<(), E>,
    ) -> Result<(), E> {
        let DcpShape {
            tokens: n,
            heads: h,
            q_dim,
            v_dim,
        } = shape;
        let ranks = group.size();
        let all_h = ranks * h;
        let check = |what: &'static str, want: usize, got: usize| {
            crate::error::check_len(what, want, got).map_err(E::from)
        };
        check("dcp attention queries", n * h * q_dim, q.len())?;
        check("dcp attention output", n * h * v_dim, out.len())?;
        resize(&mut self.lse_all, n * all_h);
        if ranks == 1 {
            return attend(q, h, out, &mut self.lse_all);
        }
        self.gather_queries(group, q, n, h, q_dim)?;
        resize(&mut self.out_all, n * all_h * v_dim);
        attend(&self.q_all, all_h, &mut self.out_all, &mut self.lse_all)?;
        match self.exchange {
            MergeExchange::AllToAll => self.merge_all_to_all(group, n, h, v_dim, out),
            MergeExchange::AllGatherReduceScatter => {
                self.merge_gather_scatter(group, n, h, v_dim, out)
            }
        }
        .map_err(E::from)
    }

    /// All-gathers every rank's `[n, h, d]` queries into `q_all` as `[n, ranks·h, d]`.
    fn gather_queries(
        &mut self,
        group: &dyn Communicator,
        q: &[f32],
        n: usize,
        h: usize,
        d: usize,
    ) -> Result<(), KernelError> {
        let ranks = group.size();
        let all_h = ranks * h;
        let row = h * d;
        resize(&mut self.gathered, ranks * n * row);
        group.all_gather(q, &mut self.gathered)?;
        resize(&mut self.q_all, n * all_h * d);
        for r in 0..ranks {
            for t in 0..n {
                let src = &self.gathered[(r * n + t) * row..(r * n + t + 1) * row];
                self.q_all[(t * all_h + r * h) * d..(t * all_h + (r + 1) * h) * d]
                    .copy_from_slice(src);
            }
        }
        Ok(())
    }

    /// One all-to-all: chunk s of the send buffer is `[n, h, vd]` partial outputs of
    /// rank s's heads followed by their `[n, h]` LSEs; each rank merges what it receives.
    fn merge_all_to_all(
        &mut self,
        group: &dyn Communicator,
        n: usize,
        h: usize,
        vd: usize,
        out: &mut [f32],
    ) -> Result<(), KernelError> {
        let ranks = group.size();
        let all_h = ranks * h;
        let (outs, chunk) = (n * h * vd, n * h * (vd + 1));
        resize(&mut self.send, ranks * chunk);
        for s in 0..ranks {
            let dst = &mut self.send[s * chunk..(s + 1) * chunk];
            let (dst_out, dst_lse) = dst.split_at_mut(outs);
            for t in 0..n {
                let heads = t * all_h + s * h;
                dst_out[t * h * vd..(t + 1) * h * vd]
                    .copy_from_slice(&self.out_all[heads * vd..(heads + h) * vd]);
                dst_lse[t * h..(t + 1) * h].copy_from_slice(&self.lse_all[heads..heads + h]);
            }
        }
        resize(&mut self.recv, ranks * chunk);
        group.all_to_all(&self.send, &mut self.recv)?;
        resize(&mut self.lse_mine, n * h);
        let recv = &self.recv;
        merge_rows(
            ranks,
            |r| &recv[r * chunk..r * chunk + outs],
            |r| &recv[r * chunk + outs..(r + 1) * chunk],
            n * h,
            vd,
            out,
            &mut self.lse_mine,
        );
        Ok(())
    }

    /// The earlier form: all-gather the LSEs, weight each local partial by its share of
    /// the merged LSE, and reduce-scatter over heads.
    fn merge_gather_scatter(
        &mut self,
        group: &dyn Communicator,
        n: usize,
        h: usize,
        vd: usize,
        out: &mut [f32],
    ) -> Result<(), KernelError> {
        let ranks = group.size();
        let all_h = ranks * h;
        resize(&mut self.recv, ranks * n * all_h);
        group.all_gather(&self.lse_all, &mut self.recv)?;
        // Weighted partials laid out [rank, token, head, v] so the reduce-scatter hands
        // each rank its own heads.
        resize(&mut self.send, ranks * n * h * vd);
        let stride = n * all_h;
        for t in 0..n {
            for j in 0..all_h {
                let idx = t * all_h + j;
                let lse = merged_lse((0..ranks).map(|r| self.recv[r * stride + idx]));
                let weight = shard_weight(self.lse_all[idx], lse);
                let (r, jj) = (j / h, j % h);
                let dst = ((r * n + t) * h + jj) * vd;
                let src = &self.out_all[idx * vd..(idx + 1) * vd];
                for (o, &x) in self.send[dst..dst + vd].iter_mut().zip(src) {
                    *o = x * weight;
                }
            }
        }
        group.reduce_scatter_sum(&self.send, out)
    }
}

#[cfg(test)]
mod tests;
