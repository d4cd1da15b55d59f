//! KV-cache capacity in a chosen storage format, through the engine's own sizing.

use dcpserve_model::arch::{kv_bytes_per_token, kv_capacity, KvCapacity};
use dcpserve_model::ModelConfig;

use super::dtype::KvDtype;

/// KV bytes one token costs on one rank at tensor-parallel size `tp`, in `dtype`: the
/// engine's f32 figure ([`kv_bytes_per_token`]) scaled to the format's width.
pub fn kv_bytes_per_token_per_rank(cfg: &ModelConfig, tp: usize, dtype: KvDtype) -> usize {
    kv_bytes_per_token(cfg, tp) / 4 * dtype.bytes()
}

/// How many tokens `budget_per_rank` bytes per rank hold, as the engine sizes its cache
/// ([`kv_capacity`]: whole blocks of `block_size` tokens, each token on one rank of its
/// DCP group). With `KvDtype::F32` it is exactly what the engine allocates; a narrower
/// format fits `4 / bytes` times as many values in the same budget, so the engine's
/// function runs on the budget scaled by that (exact, as 4 / bytes is 1, 2 or 4).
pub fn kv_capacity_in(
    cfg: &ModelConfig,
    tp: usize,
    dcp: usize,
    block_size: usize,
    budget_per_rank: u64,
    dtype: KvDtype,
) -> KvCapacity {
    let widen = (4 / dtype.bytes()) as u64;
    let mut cap = kv_capacity(
        cfg,
        tp,
        dcp,
        block_size,
        budget_per_rank.saturating_mul(widen),
    );
    cap.bytes_per_token_per_rank = kv_bytes_per_token_per_rank(cfg, tp, dtype);
    cap
}
