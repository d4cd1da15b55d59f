//! What a model backend reports about its KV cache for `GET /v1/engine/status`: the
//! layout and the sequences it holds (the JSON is built by the engine-status module).

use serde::Serialize;

pub use dcpserve_actors::SequenceKv;

/// The parallel layout of a model's KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct KvLayout {
    /// Ranks of the model (TP).
    pub tensor_parallel_size: usize,
    /// Ranks sharing one sequence's KV by position (DCP); TP ranks `r` with the same
    /// `r mod dcp` hold the same positions (for different heads).
    pub decode_context_parallel_size: usize,
    /// Copies of the TP group splitting each prefill (pcp): the KV cache is sharded over
    /// `pcp × dcp` context-parallel ranks, global rank `r` being context-parallel rank
    /// `(r / tp) · dcp + r mod dcp`.
    pub prefill_context_parallel_size: usize,
    /// Consecutive positions stored on one DCP rank before the next rank takes over.
    pub cp_kv_cache_interleave_size: usize,
    /// Positions per physical KV block on one rank.
    pub block_size: usize,
}

impl KvLayout {
    /// Ranks sharing one sequence's KV by position: `pcp × dcp`.
    pub fn cp_size(&self) -> usize {
        self.decode_context_parallel_size.max(1) * self.prefill_context_parallel_size.max(1)
    }

    /// The context-parallel rank of global rank `rank`.
    pub fn cp_rank(&self, rank: usize) -> usize {
        let (tp, dcp) = (
            self.tensor_parallel_size.max(1),
            self.decode_context_parallel_size.max(1),
        );
        (rank / tp) * dcp + rank % dcp
    }

    /// Positions per virtual block (the unit blocks are allocated in): block size × pcp ×
    /// DCP.
    pub fn tokens_per_virtual_block(&self) -> usize {
        self.block_size * self.cp_size()
    }

    /// How many of the first `len` positions of a sequence each context-parallel rank
    /// stores.
    pub fn split(&self, len: usize) -> Vec<usize> {
        let n = self.cp_size();
        (0..n)
            .map(|dcp_rank| {
                dcpserve_actors::Placement {
                    block_size: self.block_size,
                    dcp_size: n,
                    interleave: self.cp_kv_cache_interleave_size.max(1),
                    dcp_rank,
                }
                .local_len(len)
            })
            .collect()
    }
}

/// What a backend reports for the status endpoint besides [`BackendStats`].
#[derive(Debug, Clone, PartialEq)]
pub struct KvStatus {
    pub layout: KvLayout,
    /// Virtual KV blocks in all, and free ones (block tables are global: each virtual
    /// block is one physical block on every rank).
    pub total_blocks: usize,
    pub free_blocks: usize,
    /// Tokens generated since start (the rate is computed from successive reads).
    pub generated_tokens: u64,
    /// The sequences the engine holds, running ones first.
    pub sequences: Vec<SequenceKv>,
}
