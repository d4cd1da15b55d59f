//! MLA attention under decode context parallelism: the latent cache is sharded by
//! position over the DCP group, so each rank attends the absorbed queries of the whole
//! group to its shard and the partials are merged by log-sum-exp (vLLM's
//! `cp_lse_ag_out_rs`, the same math as the dense path's `DcpScratch`).

use dcpserve_kernels::Communicator;

use super::attention::LatentBatch;
use crate::arch::dcp::{GroupQueries, ShardMerge};
use crate::error::ModelError;

/// Buffers reused across layers.
#[derive(Default)]
pub struct LatentDcp {
    queries: GroupQueries,
    merge: ShardMerge,
}

impl LatentDcp {
    /// All-gathers the group's absorbed queries (`[token, rank·head, dim]`), attends them
    /// to the local latent shard (output + LSE), then merges the shards' partials and
    /// reduce-scatters over heads, so `out` (`[tokens, local heads, v_dim]`) receives this
    /// rank's heads merged over all shards. Empty shards have LSE = −inf and weight 0.
    pub fn attention(
        &mut self,
        group: &dyn Communicator,
        local: LatentBatch,
        out: &mut [f32],
        attend: impl FnOnce(&LatentBatch, &mut [f32], &mut [f32]) -> Result<(), ModelError>,
    ) -> Result<(), ModelError> {
        let n = local.token_seq.len();
        let (h, d, vd) = (local.n_heads, local.dim, local.v_dim);
        let all_h = group.size() * h;
        let q_all = self.queries.gather(group, local.q, n, h, d)?;
        let batch = LatentBatch {
            q: q_all,
            n_heads: all_h,
            ..local
        };
        let (out_all, lse_all) = self.merge.partials(n, all_h, vd);
        attend(&batch, out_all, lse_all)?;
        self.merge.merge_into(group, n, h, vd, out)
    }
}
