//! The one DCP attention step, for every attention kind (GQA heads, MLA's absorbed
//! latent queries): gather the DCP group's queries, let the caller attend them to its
//! local KV shard (output + LSE), exchange the partials, merge them by log-sum-exp, and
//! leave each rank its own heads (vLLM's `cp_lse_ag_out_rs`, with the exchange batched).

use serde::{Deserialize, Serialize};

use crate::backend::{Backend, Strided};
use crate::comm::Collectives;
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
    /// Blocks of ranks that hold different tokens (prefill context parallelism: the
    /// group is `token_parts` blocks of `size / token_parts` ranks; a block's ranks hold
    /// different heads of the same `tokens` tokens, padded alike in every block). 1
    /// without it: every rank of the group holds the same tokens.
    pub token_parts: usize,
}

impl DcpShape {
    /// Ranks per token block of a group of `ranks` (the ranks that split the heads).
    fn head_ranks(&self, ranks: usize) -> usize {
        ranks / self.token_parts.max(1)
    }

    /// Tokens the group attends: every block's.
    pub fn group_tokens(&self) -> usize {
        self.tokens * self.token_parts.max(1)
    }
}

/// A buffer of the DCP step, grown to the largest call seen (never per call).
struct Scratch<B: Backend>(Option<B::Buffer>);

impl<B: Backend> Scratch<B> {
    fn grow(&mut self, dev: &B, len: usize) -> Result<&mut B::Buffer, KernelError> {
        if self.0.as_ref().is_none_or(|b| dev.len(b) < len) {
            self.0 = Some(dev.zeros(len)?);
        }
        self.0
            .as_mut()
            .ok_or_else(|| KernelError::Shape("dcp scratch buffer missing".into()))
    }
}

impl<B: Backend> Default for Scratch<B> {
    fn default() -> Self {
        Self(None)
    }
}

/// Buffers of the DCP attention step (on the rank's backend), reused across layers
/// and steps.
pub struct DcpAttention<B: Backend> {
    exchange: MergeExchange,
    gathered: Scratch<B>,
    q_all: Scratch<B>,
    out_all: Scratch<B>,
    lse_all: Scratch<B>,
    send: Scratch<B>,
    recv: Scratch<B>,
    lse_mine: Scratch<B>,
}

impl<B: Backend> DcpAttention<B> {
    /// A step whose partials travel by `exchange`.
    pub fn new(exchange: MergeExchange) -> Self {
        Self {
            exchange,
            gathered: Scratch::default(),
            q_all: Scratch::default(),
            out_all: Scratch::default(),
            lse_all: Scratch::default(),
            send: Scratch::default(),
            recv: Scratch::default(),
            lse_mine: Scratch::default(),
        }
    }

    /// How this step's partials travel.
    pub fn exchange(&self) -> MergeExchange {
        self.exchange
    }

    /// Attention with the KV cache sharded by position over `group`, on `dev`'s buffers.
    ///
    /// `q` holds this rank's `[tokens, heads, q_dim]` queries (in its prefix). `attend(
    /// q_all, heads_all, out, lse)` must attend the prefix of `q_all` (`[group_tokens,
    /// heads_all, q_dim]`: token block p's tokens at rows `p·tokens..(p+1)·tokens`, and
    /// within a block rank d's heads at `d·heads..(d+1)·heads`) to the local shard,
    /// writing the prefixes of `out` (`[group_tokens, heads_all, v_dim]`) and `lse`
    /// (`[group_tokens, heads_all]`, −inf where the shard holds nothing). The prefix of
    /// `out` (`[tokens, heads, v_dim]`) then receives this rank's tokens and heads merged
    /// over all shards. With a group of one, `attend` sees `q` itself and writes `out`
    /// directly.
    ///
    /// `attend` is the only place the caller may touch its KV cache: no collective runs
    /// while it does (micro-batch overlap relies on it).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use dcpserve_kernels::dcp::{DcpAttention, DcpShape, MergeExchange};
    /// use dcpserve_kernels::{
    ///     Collectives, CpuBackend, DeviceMemory, HostCollectives, InProcessComm, KernelError,
    /// };
    /// // Two ranks, one head each, one token; rank r's shard holds one key whose
    /// // value is r + 1 and whose score is 0 for every query: the merged output is
    /// // the mean, 1.5, on both ranks.
    /// let dev = CpuBackend::new(1);
    /// let groups: Vec<_> =
    ///     InProcessComm::group(2).into_iter().map(|c| HostCollectives::new(Arc::new(c))).collect();
    /// std::thread::scope(|s| {
    ///     for g in &groups {
    ///         let dev = &dev;
    ///         s.spawn(move || {
    ///             let rank = Collectives::<CpuBackend>::rank(g);
    ///             let shape = DcpShape { tokens: 1, heads: 1, q_dim: 1, v_dim: 1, token_parts: 1 };
    ///             let mut step = DcpAttention::new(MergeExchange::AllToAll);
    ///             let q = dev.upload(&[1.0]).unwrap();
    ///             let mut out = dev.zeros(1).unwrap();
    ///             step.run(dev, g, &q, shape, &mut out, |_q_all, heads_all, o, lse| {
    ///                 assert_eq!(heads_all, 2);
    ///                 o[..2].fill(rank as f32 + 1.0);
    ///                 lse[..2].fill(0.0);
    ///                 Ok::<(), KernelError>(())
    ///             })
    ///             .unwrap();
    ///             assert_eq!(out, [1.5]);
    ///         });
    ///     }
    /// });
    /// ```
    #[allow(clippy::too_many_arguments)]
    pub fn run<E: From<KernelError>>(
        &mut self,
        dev: &B,
        group: &dyn Collectives<B>,
        q: &B::Buffer,
        shape: DcpShape,
        out: &mut B::Buffer,
        attend: impl FnOnce(&B::Buffer, usize, &mut B::Buffer, &mut B::Buffer) -> Result<(), E>,
    ) -> Result<(), E> {
        let DcpShape {
            tokens: n,
            heads: h,
            q_dim,
            v_dim,
            token_parts,
        } = shape;
        let ranks = group.size();
        if token_parts == 0 || !ranks.is_multiple_of(token_parts) {
            return Err(E::from(KernelError::Shape(format!(
                "dcp attention: {token_parts} token blocks do not tile a group of {ranks}"
            ))));
        }
        let all_h = shape.head_ranks(ranks) * h;
        let gn = shape.group_tokens();
        let at_least = |what: &str, want: usize, got: usize| {
            if got < want {
                Err(E::from(KernelError::Shape(format!(
                    "dcp attention {what}: {got} values, need {want}"
                ))))
            } else {
                Ok(())
            }
        };
        at_least("queries", n * h * q_dim, dev.len(q))?;
        at_least("output", n * h * v_dim, dev.len(out))?;
        let lse_all = self.lse_all.grow(dev, gn * all_h)?;
        if ranks == 1 {
            return attend(q, h, out, lse_all);
        }
        let q_all = gather_queries(dev, group, &mut self.gathered, &mut self.q_all, q, shape)?;
        let out_all = self.out_all.grow(dev, gn * all_h * v_dim)?;
        attend(q_all, all_h, out_all, lse_all)?;
        let parts = Partials {
            out: out_all,
            lse: lse_all,
            shape,
            ranks,
        };
        match self.exchange {
            MergeExchange::AllToAll => parts.merge_all_to_all(
                dev,
                group,
                (&mut self.send, &mut self.recv, &mut self.lse_mine),
                out,
            ),
            MergeExchange::AllGatherReduceScatter if token_parts > 1 => Err(KernelError::Shape(
                "the all-gather + reduce-scatter merge is not implemented for token blocks \
                     (prefill context parallelism); use the all-to-all exchange"
                    .into(),
            )),
            MergeExchange::AllGatherReduceScatter => {
                let mut parts = parts;
                parts.merge_gather_scatter(dev, group, (&mut self.send, &mut self.recv), out)
            }
        }
        .map_err(E::from)
    }
}

/// All-gathers every rank's `[n, h, d]` queries and lays them out as `[parts·n,
/// (ranks/parts)·h, d]` in `q_all` (rank `p·(ranks/parts) + r` at token block p, heads r).
fn gather_queries<'a, B: Backend>(
    dev: &B,
    group: &dyn Collectives<B>,
    gathered: &mut Scratch<B>,
    q_all: &'a mut Scratch<B>,
    q: &B::Buffer,
    shape: DcpShape,
) -> Result<&'a B::Buffer, KernelError> {
    let (n, h, d) = (shape.tokens, shape.heads, shape.q_dim);
    let ranks = group.size();
    let head_ranks = shape.head_ranks(ranks);
    let (row, all_row) = (h * d, head_ranks * h * d);
    let gathered = gathered.grow(dev, ranks * n * row)?;
    group.all_gather(
        dev,
        dev.view(q, 0..n * row)?,
        dev.view_mut(gathered, 0..ranks * n * row)?,
    )?;
    let q_all = q_all.grow(dev, shape.group_tokens() * all_row)?;
    for c in 0..ranks {
        let (p, r) = (c / head_ranks, c % head_ranks);
        let src = dev.view(gathered, c * n * row..(c + 1) * n * row)?;
        let dst = dev.view_mut(q_all, p * n * all_row..(p + 1) * n * all_row)?;
        let (src, dst) = (
            (src, Strided::packed(row)),
            (dst, Strided::new(all_row, r * row)),
        );
        dev.copy_strided(src, dst, n, row)?;
    }
    Ok(q_all)
}

/// The local partials of the whole group's tokens and heads, `[parts·n, (ranks/parts)·h,
/// v_dim]`, and their LSEs.
struct Partials<'a, B: Backend> {
    out: &'a mut B::Buffer,
    lse: &'a B::Buffer,
    shape: DcpShape,
    ranks: usize,
}

impl<B: Backend> Partials<'_, B> {
    /// Copies rank `s`'s part of the partial outputs (its token block's rows, its
    /// heads), `[n, h, v_dim]`, into `dst`.
    fn heads_of(&self, dev: &B, s: usize, dst: B::ViewMut<'_>) -> Result<(), KernelError> {
        let DcpShape {
            tokens: n,
            heads: h,
            v_dim: vd,
            ..
        } = self.shape;
        let head_ranks = self.shape.head_ranks(self.ranks);
        let (p, r) = (s / head_ranks, s % head_ranks);
        let all_row = head_ranks * h * vd;
        let src = dev.view(&*self.out, p * n * all_row..(p + 1) * n * all_row)?;
        let (src, dst) = (
            (src, Strided::new(all_row, r * h * vd)),
            (dst, Strided::packed(h * vd)),
        );
        dev.copy_strided(src, dst, n, h * vd)
    }

    /// One all-to-all: chunk s of the send buffer is `[n, h, vd]` partial outputs of
    /// rank s's tokens and heads followed by their `[n, h]` LSEs; each rank merges what
    /// it receives.
    fn merge_all_to_all(
        &self,
        dev: &B,
        group: &dyn Collectives<B>,
        (send, recv, lse_mine): (&mut Scratch<B>, &mut Scratch<B>, &mut Scratch<B>),
        out: &mut B::Buffer,
    ) -> Result<(), KernelError> {
        let DcpShape {
            tokens: n,
            heads: h,
            v_dim: vd,
            ..
        } = self.shape;
        let ranks = self.ranks;
        let head_ranks = self.shape.head_ranks(ranks);
        let all_h = head_ranks * h;
        let (outs, chunk) = (n * h * vd, n * h * (vd + 1));
        let send = send.grow(dev, ranks * chunk)?;
        for s in 0..ranks {
            let (p, r) = (s / head_ranks, s % head_ranks);
            self.heads_of(dev, s, dev.view_mut(send, s * chunk..s * chunk + outs)?)?;
            let src = (
                dev.view(self.lse, p * n * all_h..(p + 1) * n * all_h)?,
                Strided::new(all_h, r * h),
            );
            let dst = dev.view_mut(send, s * chunk + outs..(s + 1) * chunk)?;
            dev.copy_strided(src, (dst, Strided::packed(h)), n, h)?;
        }
        let recv = recv.grow(dev, ranks * chunk)?;
        group.all_to_all(
            dev,
            dev.view(send, 0..ranks * chunk)?,
            dev.view_mut(recv, 0..ranks * chunk)?,
        )?;
        let lse_mine = lse_mine.grow(dev, n * h)?;
        let recv = &*recv;
        let part_out = (0..ranks)
            .map(|r| dev.view(recv, r * chunk..r * chunk + outs))
            .collect::<Result<Vec<_>, _>>()?;
        let part_lse = (0..ranks)
            .map(|r| dev.view(recv, r * chunk + outs..(r + 1) * chunk))
            .collect::<Result<Vec<_>, _>>()?;
        dev.merge_lse(
            &part_out,
            &part_lse,
            n * h,
            vd,
            dev.view_mut(out, 0..outs)?,
            dev.view_mut(lse_mine, 0..n * h)?,
        )
    }

    /// The earlier form: all-gather the LSEs, weight each local partial by its share of
    /// the merged LSE, and reduce-scatter over heads.
    fn merge_gather_scatter(
        &mut self,
        dev: &B,
        group: &dyn Collectives<B>,
        (send, recv): (&mut Scratch<B>, &mut Scratch<B>),
        out: &mut B::Buffer,
    ) -> Result<(), KernelError> {
        let DcpShape {
            tokens: n,
            heads: h,
            v_dim: vd,
            ..
        } = self.shape;
        let ranks = self.ranks;
        let rows = n * ranks * h;
        let recv = recv.grow(dev, ranks * rows)?;
        group.all_gather(
            dev,
            dev.view(self.lse, 0..rows)?,
            dev.view_mut(recv, 0..ranks * rows)?,
        )?;
        // Each partial scaled by its shard's share, then laid out [rank, token, head, v]
        // so the reduce-scatter hands each rank its own heads.
        dev.scale_by_lse_share(
            dev.view_mut(self.out, 0..rows * vd)?,
            dev.view(self.lse, 0..rows)?,
            dev.view(recv, 0..ranks * rows)?,
            ranks,
            vd,
        )?;
        let chunk = n * h * vd;
        let send = send.grow(dev, ranks * chunk)?;
        for r in 0..ranks {
            self.heads_of(dev, r, dev.view_mut(send, r * chunk..(r + 1) * chunk)?)?;
        }
        group.reduce_scatter_sum(
            dev,
            dev.view(send, 0..ranks * chunk)?,
            dev.view_mut(out, 0..chunk)?,
        )
    }
}

#[cfg(test)]
mod tests;
