//! One sequence's side of KV-block management: its block table and the chained hashes
//! of its full blocks, fed with the sequence's tokens as they arrive. The chain keeps
//! only the tokens of its last, not yet full block: the token stream itself is the
//! scheduler's, never mirrored here.

use std::sync::{Arc, Mutex};

/// A chained 64-bit hash of a full block's token ids and everything before it.
pub type BlockHash = u64;

/// The "parent hash" of the first block of every sequence.
const ROOT_HASH: u64 = 0x6463_7073_6572_7665; // "dcpserve"

/// SplitMix64's finaliser: a bijective, well-avalanching 64-bit mix.
#[inline]
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `H(parent, tokens)`: deterministic across processes and platforms.
pub fn hash_block(parent: Option<BlockHash>, tokens: &[u32]) -> BlockHash {
    let mut h = mix64(parent.unwrap_or(ROOT_HASH) ^ 0x9e37_79b9_7f4a_7c15);
    for &t in tokens {
        h = mix64(h.wrapping_add(t as u64).wrapping_add(0x632b_e59b_d9b4_e019));
    }
    mix64(h ^ tokens.len() as u64)
}

/// Blocks of dropped chains, waiting for their manager to take them back (in the order
/// they are to be freed).
pub(super) type ReturnedBlocks = Arc<Mutex<Vec<u32>>>;

/// The KV blocks of one sequence: its block table and the hash chain of its full blocks.
///
/// Feed it the sequence's tokens with [`SeqBlocks::push_tokens`] as they become known
/// (the prompt, then each accepted output token). The hash chain is a pure function of
/// those tokens, so it survives [`KvBlockManager::release`](super::KvBlockManager::release)
/// (a preempted sequence re-finds its own blocks if they have not been evicted).
///
/// A chain dropped while it still holds blocks gives them back to the manager that
/// handed them out (they count as free again after that manager's next operation), so a
/// forgotten release never leaks KV memory.
#[derive(Debug, Default)]
pub struct SeqBlocks {
    pub(super) table: Vec<u32>,
    /// Hashes of the first `hashes.len()` full blocks of the token stream.
    pub(super) hashes: Vec<BlockHash>,
    /// Tokens after the hashed blocks (fewer than a block once hashed).
    unhashed: Vec<u32>,
    num_tokens: usize,
    /// Leading blocks of `table` that are committed (cached or already considered).
    pub(super) num_committed: usize,
    /// Where the blocks go when the chain is dropped; set by the first allocation.
    pub(super) returns: Option<ReturnedBlocks>,
}

impl SeqBlocks {
    /// An empty chain with no tokens and no blocks.
    pub fn new() -> Self {
        Self::default()
    }

    /// A chain fed with `tokens`.
    pub fn with_tokens(tokens: &[u32]) -> Self {
        let mut s = Self::new();
        s.push_tokens(tokens);
        s
    }

    /// Appends tokens of the sequence (they are hashed once their block is full).
    pub fn push_tokens(&mut self, tokens: &[u32]) {
        self.unhashed.extend_from_slice(tokens);
        self.num_tokens += tokens.len();
    }

    /// Tokens fed so far.
    pub fn num_tokens(&self) -> usize {
        self.num_tokens
    }

    /// The block table (virtual block ids, one per `tokens_per_block` tokens).
    pub fn table(&self) -> &[u32] {
        &self.table
    }

    /// Number of blocks held.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    #[cfg(test)]
    pub(super) fn unhashed_len(&self) -> usize {
        self.unhashed.len()
    }

    /// Hashes every full block of the tokens fed so far.
    pub(super) fn hash_full_blocks(&mut self, tpb: usize) {
        let full = self.unhashed.len() / tpb;
        for chunk in self.unhashed[..full * tpb].chunks_exact(tpb) {
            let h = hash_block(self.hashes.last().copied(), chunk);
            self.hashes.push(h);
        }
        self.unhashed.drain(..full * tpb);
    }
}

impl Drop for SeqBlocks {
    fn drop(&mut self) {
        if self.table.is_empty() {
            return;
        }
        if let Some(returns) = &self.returns {
            // Freed in reverse order, as `release` does; a poisoned lock only means
            // another thread panicked mid-push, the list itself is still valid.
            let mut list = returns.lock().unwrap_or_else(|e| e.into_inner());
            list.extend(self.table.drain(..).rev());
        }
    }
}
