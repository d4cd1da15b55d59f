//! Paged KV-block allocation with reference counts, an LRU free queue and prefix caching
//! by chained block hashes (the design of vLLM v1's `BlockPool` / `KVCacheManager`).
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
//! let mut seq = SeqBlocks::new();
//! let hit = kv.find_cached_prefix(&mut seq, &prompt);
//! assert_eq!(hit.num_tokens, 0);
//! let chunk = prompt.len() - hit.num_tokens; // at most the token budget
//! assert!(kv.allocate(&mut seq, &hit, hit.num_tokens + chunk));
//! let mut num_computed = hit.num_tokens;
//! // ... the step runs; then:
//! num_computed += chunk;
//! kv.commit_full_blocks(&mut seq, &prompt, num_computed);
//! // A second request with the same prompt hits the two full blocks.
//! let mut other = SeqBlocks::new();
//! let hit2 = kv.find_cached_prefix(&mut other, &prompt);
//! assert_eq!(hit2.num_tokens, 8);
//! assert!(kv.allocate(&mut other, &hit2, prompt.len()));
//! assert_eq!(&other.table()[..2], &seq.table()[..2]);
//! // Finish / preemption:
//! kv.release(&mut seq);
//! kv.release(&mut other);
//! assert_eq!(kv.num_free(), 8);
//! ```

use std::collections::HashMap;

/// A chained 64-bit hash of a full block's token ids and everything before it.
pub type BlockHash = u64;

const NIL: u32 = u32::MAX;
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

/// The KV blocks of one sequence: its block table and the hash chain of its full blocks.
///
/// The hash chain is a pure function of the sequence's tokens, so it survives
/// [`KvBlockManager::release`] (a preempted sequence re-finds its own blocks if they have
/// not been evicted). A `SeqBlocks` must only ever be used with one token stream that
/// only grows.
#[derive(Debug, Clone, Default)]
pub struct SeqBlocks {
    table: Vec<u32>,
    /// Hashes of the first `hashes.len()` full blocks of the token stream.
    hashes: Vec<BlockHash>,
    /// Leading blocks of `table` that are committed (cached or already considered).
    num_committed: usize,
}

impl SeqBlocks {
    pub fn new() -> Self {
        Self::default()
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

    /// Extends the hash chain over the full blocks of `tokens`, up to `max_blocks`.
    fn hash_up_to(&mut self, tokens: &[u32], tpb: usize, max_blocks: usize) {
        let full = (tokens.len() / tpb).min(max_blocks);
        while self.hashes.len() < full {
            let i = self.hashes.len();
            let parent = i.checked_sub(1).map(|p| self.hashes[p]);
            self.hashes
                .push(hash_block(parent, &tokens[i * tpb..(i + 1) * tpb]));
        }
    }
}

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

/// Allocates KV blocks to sequences; see the module documentation.
#[derive(Debug)]
pub struct KvBlockManager {
    tokens_per_block: usize,
    caching: bool,
    ref_counts: Vec<u32>,
    block_hash: Vec<Option<BlockHash>>,
    prev: Vec<u32>,
    next: Vec<u32>,
    head: u32,
    tail: u32,
    num_free: usize,
    cached: HashMap<BlockHash, u32>,
    stats: PrefixCacheStats,
}

impl KvBlockManager {
    /// `num_blocks` virtual blocks of `tokens_per_block` tokens (block size × dcp), all
    /// free; the lowest ids are handed out first.
    pub fn new(num_blocks: usize, tokens_per_block: usize, enable_prefix_caching: bool) -> Self {
        assert!(tokens_per_block > 0, "tokens_per_block must be positive");
        assert!(num_blocks < NIL as usize, "too many blocks");
        let n = num_blocks as u32;
        Self {
            tokens_per_block,
            caching: enable_prefix_caching,
            ref_counts: vec![0; num_blocks],
            block_hash: vec![None; num_blocks],
            prev: (0..n).map(|i| if i == 0 { NIL } else { i - 1 }).collect(),
            next: (0..n)
                .map(|i| if i + 1 == n { NIL } else { i + 1 })
                .collect(),
            head: if n == 0 { NIL } else { 0 },
            tail: if n == 0 { NIL } else { n - 1 },
            num_free: num_blocks,
            cached: HashMap::new(),
            stats: PrefixCacheStats::default(),
        }
    }

    pub fn num_blocks(&self) -> usize {
        self.ref_counts.len()
    }

    pub fn tokens_per_block(&self) -> usize {
        self.tokens_per_block
    }

    pub fn prefix_caching_enabled(&self) -> bool {
        self.caching
    }

    /// Blocks not referenced by any sequence (cached ones included: they are evictable).
    pub fn num_free(&self) -> usize {
        self.num_free
    }

    /// Fraction of blocks referenced by at least one sequence.
    pub fn usage(&self) -> f64 {
        if self.num_blocks() == 0 {
            0.0
        } else {
            1.0 - self.num_free as f64 / self.num_blocks() as f64
        }
    }

    /// Blocks whose hash is registered (in use or free-but-hittable).
    pub fn num_cached_blocks(&self) -> usize {
        self.cached.len()
    }

    pub fn prefix_cache_stats(&self) -> PrefixCacheStats {
        self.stats
    }

    /// Tokens looked up in the prefix cache so far.
    pub fn queries(&self) -> u64 {
        self.stats.queries
    }

    /// Tokens found in the prefix cache so far.
    pub fn hits(&self) -> u64 {
        self.stats.hits
    }

    /// Blocks needed to hold `num_tokens` tokens.
    pub fn blocks_for(&self, num_tokens: usize) -> usize {
        num_tokens.div_ceil(self.tokens_per_block)
    }

    /// The longest run of cached full blocks at the start of `tokens`, capped so that at
    /// least one token remains to compute. Changes nothing in the manager (the hit is
    /// only taken by [`allocate`](Self::allocate)); extends `seq`'s hash chain. Returns
    /// no hit when caching is disabled or `seq` already holds blocks.
    pub fn find_cached_prefix(&self, seq: &mut SeqBlocks, tokens: &[u32]) -> PrefixHit {
        if !self.caching || !seq.table.is_empty() || tokens.is_empty() {
            return PrefixHit::none();
        }
        let tpb = self.tokens_per_block;
        let max_blocks = (tokens.len() - 1) / tpb;
        seq.hash_up_to(tokens, tpb, max_blocks);
        let mut blocks = Vec::new();
        for h in &seq.hashes[..max_blocks] {
            match self.cached.get(h) {
                Some(&b) => blocks.push(b),
                None => break,
            }
        }
        PrefixHit {
            num_tokens: blocks.len() * tpb,
            blocks,
            query_tokens: tokens.len(),
        }
    }

    /// Grows `seq`'s table to cover `num_tokens` tokens (the computed tokens after this
    /// step), first taking the cached blocks of `hit` when `seq` holds none. On shortage
    /// changes nothing and returns false. `hit` must come from
    /// [`find_cached_prefix`](Self::find_cached_prefix) for this `seq`, with no other
    /// mutation of the manager in between (or be [`PrefixHit::none`]).
    pub fn allocate(&mut self, seq: &mut SeqBlocks, hit: &PrefixHit, num_tokens: usize) -> bool {
        let first = seq.table.is_empty();
        let taking_hit = first && !hit.blocks.is_empty();
        let hit_blocks: &[u32] = if taking_hit { &hit.blocks } else { &[] };
        let have = seq.table.len() + hit_blocks.len();
        let needed = self.blocks_for(num_tokens);
        // Hit blocks that are free leave the free queue too.
        let hit_free = hit_blocks
            .iter()
            .filter(|&&b| self.ref_counts[b as usize] == 0)
            .count();
        let new = needed.saturating_sub(have);
        if new + hit_free > self.num_free {
            return false;
        }
        if taking_hit {
            // A stale hit would map this sequence onto foreign KV.
            let stale = hit_blocks
                .iter()
                .zip(&seq.hashes)
                .any(|(&b, &h)| self.block_hash[b as usize] != Some(h))
                || seq.hashes.len() < hit_blocks.len();
            debug_assert!(!stale, "stale prefix hit passed to allocate");
            if stale {
                return false;
            }
            for &b in hit_blocks {
                self.touch(b);
                seq.table.push(b);
            }
            seq.num_committed = hit_blocks.len();
        }
        if first && hit.query_tokens > 0 {
            // Counted once per successful admission, not per attempt.
            self.stats.requests += 1;
            self.stats.queries += hit.query_tokens as u64;
            self.stats.hits += (hit_blocks.len() * self.tokens_per_block) as u64;
        }
        for _ in 0..new {
            let b = self.pop_free();
            seq.table.push(b);
        }
        true
    }

    /// Registers the blocks of `seq` that became full with the first `num_computed`
    /// tokens of `tokens`, so that later requests can hit them. Call after every step for
    /// every sequence that computed tokens (cheap when no block filled).
    pub fn commit_full_blocks(&mut self, seq: &mut SeqBlocks, tokens: &[u32], num_computed: usize) {
        if !self.caching {
            return;
        }
        let tpb = self.tokens_per_block;
        debug_assert!(num_computed <= tokens.len());
        let full = (num_computed.min(tokens.len()) / tpb).min(seq.table.len());
        if full <= seq.num_committed {
            return;
        }
        seq.hash_up_to(tokens, tpb, full);
        for i in seq.num_committed..full {
            let b = seq.table[i];
            let h = seq.hashes[i];
            if self.block_hash[b as usize].is_none() && !self.cached.contains_key(&h) {
                self.block_hash[b as usize] = Some(h);
                self.cached.insert(h, b);
            }
            // Otherwise another block already holds this content (computed twice
            // concurrently): this one stays uncached and is reused first once freed.
        }
        seq.num_committed = full;
    }

    /// Frees the blocks of `seq` past those that `num_tokens` tokens need (never a
    /// committed one): speculative decoding grows a table for drafts that may be rejected.
    pub fn truncate(&mut self, seq: &mut SeqBlocks, num_tokens: usize) {
        let keep = self.blocks_for(num_tokens).max(seq.num_committed);
        while seq.table.len() > keep {
            let b = seq.table.pop().expect("len > keep");
            let rc = &mut self.ref_counts[b as usize];
            assert!(*rc > 0, "double free of block {b}");
            *rc -= 1;
            if *rc == 0 {
                self.push_front(b);
            }
        }
    }

    /// Releases every block of `seq` (in reverse order) and empties its table; blocks
    /// no longer referenced go to the free queue, cached ones stay hittable.
    pub fn release(&mut self, seq: &mut SeqBlocks) {
        for b in seq.table.drain(..).rev() {
            let rc = &mut self.ref_counts[b as usize];
            assert!(*rc > 0, "double free of block {b}");
            *rc -= 1;
            if *rc == 0 {
                if self.block_hash[b as usize].is_some() {
                    self.push_back(b);
                } else {
                    self.push_front(b);
                }
            }
        }
        seq.num_committed = 0;
    }

    /// Forgets every cached hash. Only possible while no block is referenced (returns
    /// false otherwise): use it when the KV memory was lost, after releasing everything.
    pub fn reset_prefix_cache(&mut self) -> bool {
        if self.num_free != self.num_blocks() {
            return false;
        }
        self.cached.clear();
        self.block_hash.iter_mut().for_each(|h| *h = None);
        true
    }

    // ---- internals ----

    /// Takes a reference on `b`, removing it from the free queue if it was free.
    fn touch(&mut self, b: u32) {
        if self.ref_counts[b as usize] == 0 {
            self.unlink(b);
        }
        self.ref_counts[b as usize] += 1;
    }

    /// Pops the least recently freed block, evicting its hash.
    fn pop_free(&mut self) -> u32 {
        let b = self.head;
        assert!(b != NIL, "free queue empty");
        self.unlink(b);
        if let Some(h) = self.block_hash[b as usize].take() {
            let removed = self.cached.remove(&h);
            debug_assert_eq!(removed, Some(b));
        }
        self.ref_counts[b as usize] = 1;
        b
    }

    fn unlink(&mut self, b: u32) {
        let (p, n) = (self.prev[b as usize], self.next[b as usize]);
        if p == NIL {
            self.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.prev[b as usize] = NIL;
        self.next[b as usize] = NIL;
        self.num_free -= 1;
    }

    fn push_back(&mut self, b: u32) {
        self.prev[b as usize] = self.tail;
        self.next[b as usize] = NIL;
        if self.tail == NIL {
            self.head = b;
        } else {
            self.next[self.tail as usize] = b;
        }
        self.tail = b;
        self.num_free += 1;
    }

    fn push_front(&mut self, b: u32) {
        self.next[b as usize] = self.head;
        self.prev[b as usize] = NIL;
        if self.head == NIL {
            self.tail = b;
        } else {
            self.prev[self.head as usize] = b;
        }
        self.head = b;
        self.num_free += 1;
    }

    /// The free queue from head (next evicted) to tail.
    #[cfg(test)]
    fn free_queue(&self) -> Vec<u32> {
        let mut v = Vec::new();
        let mut b = self.head;
        while b != NIL {
            v.push(b);
            assert!(v.len() <= self.num_blocks(), "cycle in free queue");
            b = self.next[b as usize];
        }
        v
    }

    /// Checks every structural invariant (tests only).
    #[cfg(test)]
    fn check_invariants(&self) {
        let q = self.free_queue();
        assert_eq!(q.len(), self.num_free);
        let mut in_q = vec![false; self.num_blocks()];
        for (i, &b) in q.iter().enumerate() {
            assert!(!in_q[b as usize], "block {b} twice in free queue");
            in_q[b as usize] = true;
            let expect_prev = if i == 0 { NIL } else { q[i - 1] };
            assert_eq!(self.prev[b as usize], expect_prev);
        }
        assert_eq!(self.tail, q.last().copied().unwrap_or(NIL));
        for (b, &queued) in in_q.iter().enumerate() {
            assert_eq!(
                queued,
                self.ref_counts[b] == 0,
                "block {b}: free-queue membership vs ref count {}",
                self.ref_counts[b]
            );
            if let Some(h) = self.block_hash[b] {
                assert_eq!(self.cached.get(&h), Some(&(b as u32)));
            }
        }
        for (&h, &b) in &self.cached {
            assert_eq!(self.block_hash[b as usize], Some(h));
        }
        if !self.caching {
            assert!(self.cached.is_empty());
        }
    }
}

#[cfg(test)]
mod tests;
