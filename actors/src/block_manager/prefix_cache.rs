//! The prefix cache's lookup side: which block holds the KV of a given chained block
//! hash, and the hit counters. The blocks themselves (reference counts, eviction order)
//! are the block pool's (`block_pool`, which knows nothing of this table).

use std::collections::HashMap;

use super::seq_blocks::BlockHash;

/// Prefix-cache counters, in tokens, counted once per admitted sequence.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    /// Admissions that looked up the cache.
    pub requests: u64,
    /// Prompt tokens looked up.
    pub queries: u64,
    /// Tokens found cached.
    pub hits: u64,
}

impl PrefixCacheStats {
    pub fn hit_rate(&self) -> f64 {
        if self.queries == 0 {
            0.0
        } else {
            self.hits as f64 / self.queries as f64
        }
    }
}

/// Hash → block of every cached block, and the counters.
#[derive(Debug, Default)]
pub(super) struct PrefixCache {
    blocks: HashMap<BlockHash, u32>,
    stats: PrefixCacheStats,
}

impl PrefixCache {
    pub(super) fn len(&self) -> usize {
        self.blocks.len()
    }

    pub(super) fn stats(&self) -> PrefixCacheStats {
        self.stats
    }

    pub(super) fn get(&self, h: &BlockHash) -> Option<u32> {
        self.blocks.get(h).copied()
    }

    pub(super) fn contains(&self, h: &BlockHash) -> bool {
        self.blocks.contains_key(h)
    }

    /// The blocks of the longest run of leading `hashes` that are all cached.
    pub(super) fn longest_prefix(&self, hashes: &[BlockHash]) -> Vec<u32> {
        hashes.iter().map_while(|h| self.get(h)).collect()
    }

    pub(super) fn insert(&mut self, h: BlockHash, b: u32) {
        self.blocks.insert(h, b);
    }

    /// Evicts `h`, which block `b` held.
    pub(super) fn evict(&mut self, h: BlockHash, b: u32) {
        let removed = self.blocks.remove(&h);
        debug_assert_eq!(removed, Some(b));
    }

    pub(super) fn clear(&mut self) {
        self.blocks.clear();
    }

    /// Counts one admission that looked up `queried` tokens and found `hit` of them.
    pub(super) fn record(&mut self, queried: usize, hit: usize) {
        self.stats.requests += 1;
        self.stats.queries += queried as u64;
        self.stats.hits += hit as u64;
    }

    #[cfg(test)]
    pub(super) fn iter(&self) -> impl Iterator<Item = (&BlockHash, &u32)> {
        self.blocks.iter()
    }
}
