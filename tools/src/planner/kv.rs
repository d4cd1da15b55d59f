//! KV-cache capacity in a chosen storage format, through the engine's own sizing.

use dcpserve_model::arch::{kv_bytes_per_token, kv_capacity, KvCapacity};
use dcpserve_model::ModelConfig;

use super::dtype::KvDtype;

/// KV bytes one token costs on one rank at tensor-parallel size `tp`, in `dtype`: the
/// engine's own figure ([`kv_bytes_per_token`]).
pub fn kv_bytes_per_token_per_rank(cfg: &ModelConfig, tp: usize, dtype: KvDtype) -> usize {
    kv_bytes_per_token(cfg, tp, dtype.storage())
}

/// How many tokens `budget_per_rank` bytes per rank hold, exactly as the engine sizes
/// its cache of that element type ([`kv_capacity`]: whole blocks of `block_size`
/// tokens, each token on one rank of its DCP group).
pub fn kv_capacity_in(
    cfg: &ModelConfig,
    tp: usize,
    dcp: usize,
    block_size: usize,
    budget_per_rank: u64,
    dtype: KvDtype,
) -> KvCapacity {
    kv_capacity(cfg, tp, dcp, block_size, budget_per_rank, dtype.storage())
}
