//! Paged KV-block allocation with reference counts, an LRU free queue and prefix caching
//! by chained block hashes (the design of vLLM v1's `BlockPool` / `KVCacheManager`).
//!
//! Three parts, one job each: the block pool (reference counts, the hash each block
//! carries, the LRU free queue), the prefix cache (hash → block, hit counters) and each
//! sequence's block chain ([`SeqBlocks`]: its table and hash chain). [`KvBlockManager`]
//! composes them.
//!
//! # Virtual blocks
//!
//! Every block id handed out here is a *virtual* block of `tokens_per_block` tokens, where
//! `tokens_per_block` = per-rank block size × dcp. The same id is used on every DCP rank;
//! each rank stores only its own slice of the block (see [`crate::placement`]). Nothing in
//! this module depends on dcp: the manager, its hashes and its prefix cache all count in
//! virtual blocks.
//!
//! # Blocks and the free queue
//!
//! Each block has a reference count (the number of sequences whose table holds it) and an
//! optional content hash. A block whose count is zero sits in the free queue exactly once;
//! a block in use is never in it. The queue is a doubly linked list over block ids
//! (`prev`/`next` arrays), so every operation is O(1):
//!
//! - allocation pops from the head (least recently freed first); if the popped block still
//!   carries a hash, that hash leaves the prefix cache ("eviction");
//! - a freed block that carries a hash goes to the tail (it stays hittable until it
//!   reaches the head); a freed block without a hash holds nothing reusable and goes to the
//!   head, so it is reused before any cached block;
//! - a sequence's blocks are freed in reverse order, so its tail blocks (the least likely
//!   to be shared) are evicted before its head blocks;
//! - a prefix hit on a free block takes it out of the queue wherever it is.
//!
//! # Prefix caching
//!
//! Only *full* blocks whose KV has been computed are cached. The hash of block `i` of a
//! sequence is `H(hash of block i-1, token ids of block i)` (a fixed, process-independent
//! 64-bit mix), so equal block contents after different prefixes get different hashes.
//! The per-sequence chain lives in [`SeqBlocks`] and is computed once per block. 64-bit
//! hashes make a false hit a ~n²/2⁶⁵ event for n cached blocks; block contents are not
//! compared. If the KV memory is lost (a rank group restarts), call
//! [`KvBlockManager::reset_prefix_cache`] once every sequence has been released.
//!
//! # Use by the scheduler
//!
//! ```
//! use dcpserve_actors::block_manager::{KvBlockManager, SeqBlocks};
//! let mut kv = KvBlockManager::new(8, 4, true);
//! let prompt = [1u32, 2, 3, 4, 5, 6, 7, 8, 9];
//! // Admission: look up the cached prefix, then allocate for this step's chunk.
//! let mut seq = SeqBlocks::with_tokens(&prompt);
//! let hit = kv.find_cached_prefix(&mut seq);
//! assert_eq!(hit.num_tokens, 0);
//! let chunk = prompt.len() - hit.num_tokens; // at most the token budget
//! assert!(kv.allocate(&mut seq, &hit, hit.num_tokens + chunk));
//! let mut num_computed = hit.num_tokens;
//! // ... the step runs; then:
//! num_computed += chunk;
//! kv.commit_full_blocks(&mut seq, num_computed);
//! // A second request with the same prompt hits the two full blocks.
//! let mut other = SeqBlocks::with_tokens(&prompt);
//! let hit2 = kv.find_cached_prefix(&mut other);
//! assert_eq!(hit2.num_tokens, 8);
//! assert!(kv.allocate(&mut other, &hit2, prompt.len()));
//! assert_eq!(&other.table()[..2], &seq.table()[..2]);
//! // Finish / preemption:
//! kv.release(&mut seq);
//! assert_eq!(kv.num_free(), 5); // the two shared blocks are still the other's
//! // A chain dropped without release gives its blocks back all the same.
//! drop(other);
//! kv.reclaim_dropped();
//! assert_eq!(kv.num_free(), 8);
//! ```

mod block_pool;
mod prefix_cache;
mod seq_blocks;

use std::sync::Arc;

use block_pool::BlockPool;
use prefix_cache::PrefixCache;
pub use prefix_cache::PrefixCacheStats;
use seq_blocks::ReturnedBlocks;
pub use seq_blocks::{hash_block, BlockHash, SeqBlocks};

/// The result of [`KvBlockManager::find_cached_prefix`], to pass to
/// [`KvBlockManager::allocate`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrefixHit {
    /// Cached blocks covering the first `num_tokens` tokens, in order.
    pub blocks: Vec<u32>,
    /// Tokens whose KV is already cached: a whole number of blocks, and at most
    /// `len − 1` so at least one token is computed (its logits are needed).
    pub num_tokens: usize,
    /// Tokens looked up (for the hit-rate counters).
    query_tokens: usize,
}

impl PrefixHit {
    /// No cached prefix (caching disabled, or a sequence that already holds blocks).
    pub fn none() -> Self {
        Self::default()
    }
}

/// Allocates KV blocks to sequences; see the module documentation.
#[derive(Debug)]
pub struct KvBlockManager {
    tokens_per_block: usize,
    caching: bool,
    pool: BlockPool,
    cache: PrefixCache,
    /// Blocks of chains dropped without a release, taken back before every change.
    returned: ReturnedBlocks,
}

impl KvBlockManager {
    /// `num_blocks` virtual blocks of `tokens_per_block` tokens (block size × dcp), all
    /// free; the lowest ids are handed out first.
    pub fn new(num_blocks: usize, tokens_per_block: usize, enable_prefix_caching: bool) -> Self {
        assert!(tokens_per_block > 0, "tokens_per_block must be positive");
        Self {
            tokens_per_block,
            caching: enable_prefix_caching,
            pool: BlockPool::new(num_blocks),
            cache: PrefixCache::default(),
            returned: Arc::default(),
        }
    }

    pub fn num_blocks(&self) -> usize {
        self.pool.num_blocks()
    }

    pub fn tokens_per_block(&self) -> usize {
        self.tokens_per_block
    }

    pub fn prefix_caching_enabled(&self) -> bool {
        self.caching
    }

    /// Blocks not referenced by any sequence (cached ones included: they are evictable).
    /// Blocks of dropped chains count once taken back (by the next change, or
    /// [`reclaim_dropped`](Self::reclaim_dropped)).
    pub fn num_free(&self) -> usize {
        self.pool.num_free()
    }

    /// Fraction of blocks referenced by at least one sequence.
    pub fn usage(&self) -> f64 {
        if self.num_blocks() == 0 {
            0.0
        } else {
            1.0 - self.num_free() as f64 / self.num_blocks() as f64
        }
    }

    /// Blocks whose hash is registered (in use or free-but-hittable).
    pub fn num_cached_blocks(&self) -> usize {
        self.cache.len()
    }

    pub fn prefix_cache_stats(&self) -> PrefixCacheStats {
        self.cache.stats()
    }

    /// Tokens looked up in the prefix cache so far.
    pub fn queries(&self) -> u64 {
        self.cache.stats().queries
    }

    /// Tokens found in the prefix cache so far.
    pub fn hits(&self) -> u64 {
        self.cache.stats().hits
    }

    /// Blocks needed to hold `num_tokens` tokens.
    pub fn blocks_for(&self, num_tokens: usize) -> usize {
        num_tokens.div_ceil(self.tokens_per_block)
    }

    /// The longest run of cached full blocks at the start of `seq`'s tokens, capped so
    /// that at least one token remains to compute. Changes nothing in the manager (the
    /// hit is only taken by [`allocate`](Self::allocate)); extends `seq`'s hash chain.
    /// Returns no hit when caching is disabled or `seq` already holds blocks.
    pub fn find_cached_prefix(&self, seq: &mut SeqBlocks) -> PrefixHit {
        let len = seq.num_tokens();
        if !self.caching || !seq.table.is_empty() || len == 0 {
            return PrefixHit::none();
        }
        let tpb = self.tokens_per_block;
        let max_blocks = (len - 1) / tpb;
        seq.hash_full_blocks(tpb);
        let blocks = self.cache.longest_prefix(&seq.hashes[..max_blocks]);
        PrefixHit {
            num_tokens: blocks.len() * tpb,
            blocks,
            query_tokens: len,
        }
    }

    /// Grows `seq`'s table to cover `num_tokens` tokens (the computed tokens after this
    /// step), first taking the cached blocks of `hit` when `seq` holds none. On shortage
    /// changes nothing and returns false. `hit` must come from
    /// [`find_cached_prefix`](Self::find_cached_prefix) for this `seq`, with no other
    /// mutation of the manager in between (or be [`PrefixHit::none`]).
    pub fn allocate(&mut self, seq: &mut SeqBlocks, hit: &PrefixHit, num_tokens: usize) -> bool {
        self.reclaim_dropped();
        let first = seq.table.is_empty();
        let taking_hit = first && !hit.blocks.is_empty();
        let hit_blocks: &[u32] = if taking_hit { &hit.blocks } else { &[] };
        let have = seq.table.len() + hit_blocks.len();
        let needed = self.blocks_for(num_tokens);
        // Hit blocks that are free leave the free queue too.
        let hit_free = hit_blocks.iter().filter(|&&b| self.pool.is_free(b)).count();
        let new = needed.saturating_sub(have);
        if new + hit_free > self.num_free() {
            return false;
        }
        if taking_hit {
            // A stale hit would map this sequence onto foreign KV.
            let stale = hit_blocks
                .iter()
                .zip(&seq.hashes)
                .any(|(&b, &h)| self.pool.hash_of(b) != Some(h))
                || seq.hashes.len() < hit_blocks.len();
            debug_assert!(!stale, "stale prefix hit passed to allocate");
            if stale {
                return false;
            }
            for &b in hit_blocks {
                self.pool.take(b);
                seq.table.push(b);
            }
            seq.num_committed = hit_blocks.len();
        }
        if first && hit.query_tokens > 0 {
            // Counted once per successful admission, not per attempt.
            self.cache
                .record(hit.query_tokens, hit_blocks.len() * self.tokens_per_block);
        }
        for _ in 0..new {
            let (b, evicted) = self.pool.pop_free();
            if let Some(h) = evicted {
                self.cache.evict(h, b);
            }
            seq.table.push(b);
        }
        if !seq.table.is_empty() && seq.returns.is_none() {
            seq.returns = Some(self.returned.clone());
        }
        true
    }

    /// Registers the blocks of `seq` that became full with its first `num_computed`
    /// tokens, so that later requests can hit them. Call after every step for every
    /// sequence that computed tokens (cheap when no block filled).
    pub fn commit_full_blocks(&mut self, seq: &mut SeqBlocks, num_computed: usize) {
        self.reclaim_dropped();
        if !self.caching {
            return;
        }
        let tpb = self.tokens_per_block;
        debug_assert!(num_computed <= seq.num_tokens());
        let full = (num_computed.min(seq.num_tokens()) / tpb).min(seq.table.len());
        if full <= seq.num_committed {
            return;
        }
        seq.hash_full_blocks(tpb);
        for i in seq.num_committed..full {
            let b = seq.table[i];
            let h = seq.hashes[i];
            if self.pool.hash_of(b).is_none() && !self.cache.contains(&h) {
                self.pool.set_hash(b, h);
                self.cache.insert(h, b);
            }
            // Otherwise another block already holds this content (computed twice
            // concurrently): this one stays uncached and is reused first once freed.
        }
        seq.num_committed = full;
    }

    /// Frees the blocks of `seq` past those that `num_tokens` tokens need (never a
    /// committed one): speculative decoding grows a table for drafts that may be rejected.
    pub fn truncate(&mut self, seq: &mut SeqBlocks, num_tokens: usize) {
        self.reclaim_dropped();
        let keep = self.blocks_for(num_tokens).max(seq.num_committed);
        while seq.table.len() > keep {
            let b = seq.table.pop().expect("len > keep");
            self.pool.unref(b, true);
        }
    }

    /// Releases every block of `seq` (in reverse order) and empties its table; blocks
    /// no longer referenced go to the free queue, cached ones stay hittable.
    pub fn release(&mut self, seq: &mut SeqBlocks) {
        self.reclaim_dropped();
        for b in seq.table.drain(..).rev() {
            self.pool.unref(b, false);
        }
        seq.num_committed = 0;
    }

    /// Takes back the blocks of chains dropped without a release (as if released).
    /// Every changing operation does this first.
    pub fn reclaim_dropped(&mut self) {
        let dropped = std::mem::take(
            &mut *self
                .returned
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        );
        for b in dropped {
            self.pool.unref(b, false);
        }
    }

    /// Forgets every cached hash. Only possible while no block is referenced (returns
    /// false otherwise): use it when the KV memory was lost, after releasing everything.
    pub fn reset_prefix_cache(&mut self) -> bool {
        self.reclaim_dropped();
        if self.num_free() != self.num_blocks() {
            return false;
        }
        self.cache.clear();
        self.pool.clear_hashes();
        true
    }

    /// The free queue from head (next evicted) to tail (tests only).
    #[cfg(test)]
    fn free_queue(&self) -> Vec<u32> {
        self.pool.free_queue()
    }

    /// Checks every structural invariant (tests only).
    #[cfg(test)]
    fn check_invariants(&self) {
        self.pool.check_invariants();
        for (b, h) in self.pool.hashes().iter().enumerate() {
            if let Some(h) = h {
                assert_eq!(self.cache.get(h), Some(b as u32));
            }
        }
        for (&h, &b) in self.cache.iter() {
            assert_eq!(self.pool.hash_of(b), Some(h));
        }
        if !self.caching {
            assert_eq!(self.cache.len(), 0);
        }
    }
}

#[cfg(test)]
mod tests;
