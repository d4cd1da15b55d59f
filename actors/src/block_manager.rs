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
mod tests {
    use super::*;

    /// Admission as the scheduler does it: find, then allocate `chunk` more tokens.
    fn admit(
        m: &mut KvBlockManager,
        seq: &mut SeqBlocks,
        tokens: &[u32],
        chunk: usize,
    ) -> Option<usize> {
        let hit = m.find_cached_prefix(seq, tokens);
        let n = (tokens.len() - hit.num_tokens).min(chunk);
        m.allocate(seq, &hit, hit.num_tokens + n)
            .then_some(hit.num_tokens)
    }

    fn toks(r: std::ops::Range<u32>) -> Vec<u32> {
        r.collect()
    }

    #[test]
    fn allocates_and_frees() {
        let mut m = KvBlockManager::new(4, 16, false);
        let mut a = SeqBlocks::new();
        assert!(m.allocate(&mut a, &PrefixHit::none(), 33));
        assert_eq!(a.table(), &[0, 1, 2]);
        assert!(
            m.allocate(&mut a, &PrefixHit::none(), 48),
            "no growth needed"
        );
        assert_eq!(a.len(), 3);
        let mut b = SeqBlocks::new();
        assert!(
            !m.allocate(&mut b, &PrefixHit::none(), 17),
            "only one block left"
        );
        assert!(b.is_empty());
        assert_eq!(m.num_free(), 1);
        assert!(m.allocate(&mut b, &PrefixHit::none(), 16));
        assert_eq!(m.num_free(), 0);
        assert_eq!(m.usage(), 1.0);
        m.release(&mut a);
        assert_eq!(m.num_free(), 3);
        assert!(a.is_empty());
        assert!(m.allocate(&mut b, &PrefixHit::none(), 64));
        assert_eq!(b.len(), 4);
        m.check_invariants();
        m.release(&mut b);
        assert_eq!(m.usage(), 0.0);
        m.check_invariants();
    }

    #[test]
    fn exhaustion_changes_nothing() {
        let mut m = KvBlockManager::new(4, 4, true);
        let p = toks(0..12);
        let mut a = SeqBlocks::new();
        assert_eq!(admit(&mut m, &mut a, &p, 100), Some(0));
        m.commit_full_blocks(&mut a, &p, 12);
        let free_before = m.free_queue();
        let mut b = SeqBlocks::new();
        // Hits 2 blocks (cap: 11 tokens → 2 blocks), needs 2 more; only 1 free.
        let q: Vec<u32> = toks(0..8).into_iter().chain(100..110).collect();
        assert_eq!(admit(&mut m, &mut b, &q, 100), None);
        assert!(b.is_empty());
        assert_eq!(m.free_queue(), free_before);
        assert_eq!(
            m.prefix_cache_stats().requests,
            1,
            "failed admission not counted"
        );
        m.check_invariants();
        // Growing a running sequence past the pool also fails cleanly.
        assert!(!m.allocate(&mut a, &PrefixHit::none(), 100));
        assert_eq!(a.len(), 3);
        assert_eq!(m.free_queue(), free_before);
        m.check_invariants();
    }

    #[test]
    fn prefix_hit_on_second_sequence_only_full_blocks() {
        let mut m = KvBlockManager::new(16, 4, true);
        let p = toks(0..10); // 2 full blocks + 2 tokens
        let mut a = SeqBlocks::new();
        assert_eq!(admit(&mut m, &mut a, &p, 100), Some(0));
        m.commit_full_blocks(&mut a, &p, 10);
        assert_eq!(m.num_cached_blocks(), 2, "the partial block is not cached");
        // Same 10 tokens, then more.
        let q: Vec<u32> = toks(0..10).into_iter().chain([50, 51, 52]).collect();
        let mut b = SeqBlocks::new();
        let hit = m.find_cached_prefix(&mut b, &q);
        assert_eq!(hit.num_tokens, 8);
        assert_eq!(hit.blocks, a.table()[..2].to_vec());
        assert!(m.allocate(&mut b, &hit, q.len()));
        assert_eq!(b.len(), 4);
        assert_eq!(&b.table()[..2], &a.table()[..2]);
        assert_ne!(b.table()[2], a.table()[2], "partial block is never shared");
        let s = m.prefix_cache_stats();
        assert_eq!((s.requests, s.queries, s.hits), (2, 23, 8));
        assert!((s.hit_rate() - 8.0 / 23.0).abs() < 1e-12);
        m.check_invariants();
    }

    #[test]
    fn chained_hashes_do_not_hit_after_different_prefix() {
        let mut m = KvBlockManager::new(16, 4, true);
        let p = vec![1, 2, 3, 4, 9, 9, 9, 9, 0];
        let mut a = SeqBlocks::new();
        admit(&mut m, &mut a, &p, 100).unwrap();
        m.commit_full_blocks(&mut a, &p, p.len());
        // Second block has the same content, first differs.
        let q = vec![5, 6, 7, 8, 9, 9, 9, 9, 0];
        let mut b = SeqBlocks::new();
        assert_eq!(m.find_cached_prefix(&mut b, &q).num_tokens, 0);
        // The hash function is deterministic and depends on the parent.
        assert_eq!(hash_block(None, &[1, 2]), hash_block(None, &[1, 2]));
        assert_ne!(hash_block(Some(1), &[1, 2]), hash_block(Some(2), &[1, 2]));
        assert_ne!(hash_block(None, &[1, 2]), hash_block(None, &[2, 1]));
    }

    #[test]
    fn hit_is_capped_below_the_prompt_length() {
        let mut m = KvBlockManager::new(16, 4, true);
        let p = toks(0..8); // exactly 2 blocks
        let mut a = SeqBlocks::new();
        admit(&mut m, &mut a, &p, 100).unwrap();
        m.commit_full_blocks(&mut a, &p, 8);
        assert_eq!(m.num_cached_blocks(), 2);
        let mut b = SeqBlocks::new();
        let hit = m.find_cached_prefix(&mut b, &p);
        assert_eq!(
            hit.num_tokens, 4,
            "≤ len−1 = 7, rounded down to whole blocks"
        );
        let mut c = SeqBlocks::new();
        assert_eq!(m.find_cached_prefix(&mut c, &toks(0..9)).num_tokens, 8);
        let mut d = SeqBlocks::new();
        assert_eq!(m.find_cached_prefix(&mut d, &toks(0..1)).num_tokens, 0);
    }

    #[test]
    fn lru_eviction_order() {
        let mut m = KvBlockManager::new(8, 2, true);
        let pa = vec![1, 1, 2, 2, 3, 3];
        let pb = vec![7, 7, 8, 8, 9];
        let mut a = SeqBlocks::new();
        let mut b = SeqBlocks::new();
        admit(&mut m, &mut a, &pa, 100).unwrap();
        m.commit_full_blocks(&mut a, &pa, 6);
        admit(&mut m, &mut b, &pb, 100).unwrap();
        m.commit_full_blocks(&mut b, &pb, 5);
        assert_eq!(a.table(), &[0, 1, 2]);
        assert_eq!(b.table(), &[3, 4, 5]);
        m.release(&mut a); // cached: 2, 1, 0 to the tail
        m.release(&mut b); // 5 is partial (uncached) → head; 4, 3 to the tail
        assert_eq!(m.free_queue(), vec![5, 6, 7, 2, 1, 0, 4, 3]);
        m.check_invariants();
        // Allocate 5 blocks: 5, 6, 7 (nothing cached), then evict a's tail blocks 2, 1.
        let mut c = SeqBlocks::new();
        assert!(m.allocate(&mut c, &PrefixHit::none(), 10));
        assert_eq!(c.table(), &[5, 6, 7, 2, 1]);
        assert_eq!(m.num_cached_blocks(), 3, "hashes of 2 and 1 evicted");
        // a's first block is still hittable; its second is gone.
        let mut a2 = SeqBlocks::new();
        let hit = m.find_cached_prefix(&mut a2, &pa);
        assert_eq!(hit.blocks, vec![0]);
        // b's blocks are both still there; hitting takes them out of the queue.
        let mut b2 = SeqBlocks::new();
        let hit = m.find_cached_prefix(&mut b2, &pb);
        assert_eq!(hit.blocks, vec![3, 4]);
        assert!(m.allocate(&mut b2, &hit, 5));
        assert_eq!(
            b2.table(),
            &[3, 4, 0],
            "third block evicts a's last cached block"
        );
        assert_eq!(m.num_free(), 0);
        m.check_invariants();
    }

    #[test]
    fn shared_prefix_ref_counts() {
        let mut m = KvBlockManager::new(8, 4, true);
        let p = toks(0..9);
        let mut a = SeqBlocks::new();
        admit(&mut m, &mut a, &p, 100).unwrap();
        m.commit_full_blocks(&mut a, &p, 9);
        let mut b = SeqBlocks::new();
        assert_eq!(admit(&mut m, &mut b, &p, 100), Some(8));
        assert_eq!(m.ref_counts[a.table()[0] as usize], 2);
        assert_eq!(m.ref_counts[a.table()[1] as usize], 2);
        assert_eq!(m.num_free(), 4, "2 shared + 2 partial blocks in use");
        m.release(&mut a);
        assert_eq!(m.num_free(), 5, "only a's partial block was freed");
        assert_eq!(m.ref_counts[b.table()[0] as usize], 1);
        m.check_invariants();
        // b keeps decoding into its own partial block, then finishes.
        let mut q = p.clone();
        q.extend([100, 101, 102, 103]);
        assert!(m.allocate(&mut b, &PrefixHit::none(), 13));
        m.commit_full_blocks(&mut b, &q, 12);
        assert_eq!(m.num_cached_blocks(), 3);
        m.release(&mut b);
        assert_eq!(m.num_free(), 8);
        m.check_invariants();
        // A preempted-and-readmitted sequence re-finds its own blocks via its kept hashes.
        let hit = m.find_cached_prefix(&mut b, &q);
        assert_eq!(hit.num_tokens, 12);
        assert!(m.reset_prefix_cache());
        assert_eq!(m.num_cached_blocks(), 0);
        assert_eq!(m.find_cached_prefix(&mut b, &q).num_tokens, 0);
        m.check_invariants();
    }

    #[test]
    fn reset_refused_while_blocks_in_use() {
        let mut m = KvBlockManager::new(4, 4, true);
        let mut a = SeqBlocks::new();
        assert!(m.allocate(&mut a, &PrefixHit::none(), 4));
        assert!(!m.reset_prefix_cache());
    }

    #[test]
    fn disabled_caching_is_pure_allocation() {
        let mut m = KvBlockManager::new(8, 4, false);
        let p = toks(0..9);
        let mut a = SeqBlocks::new();
        assert_eq!(admit(&mut m, &mut a, &p, 100), Some(0));
        m.commit_full_blocks(&mut a, &p, 9);
        let mut b = SeqBlocks::new();
        assert_eq!(admit(&mut m, &mut b, &p, 100), Some(0));
        assert_eq!(m.num_cached_blocks(), 0);
        assert_eq!(m.prefix_cache_stats(), PrefixCacheStats::default());
        assert!(a.table().iter().all(|x| !b.table().contains(x)));
        m.check_invariants();
    }

    #[test]
    fn duplicate_content_stays_uncached() {
        let mut m = KvBlockManager::new(8, 4, true);
        let p = toks(0..5);
        // Two sequences admitted before either commits: both compute the same block.
        let mut a = SeqBlocks::new();
        let mut b = SeqBlocks::new();
        admit(&mut m, &mut a, &p, 100).unwrap();
        admit(&mut m, &mut b, &p, 100).unwrap();
        m.commit_full_blocks(&mut a, &p, 5);
        m.commit_full_blocks(&mut b, &p, 5);
        assert_eq!(m.num_cached_blocks(), 1);
        let bt = b.table().to_vec();
        assert_eq!(bt, vec![2, 3]);
        m.release(&mut b);
        assert_eq!(
            m.free_queue()[..2],
            [2, 3],
            "uncached blocks are reused first"
        );
        m.check_invariants();
    }

    /// Tiny deterministic RNG for the stress test.
    struct XorShift(u64);
    impl XorShift {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    struct ModelSeq {
        kv: SeqBlocks,
        tokens: Vec<u32>,
        num_computed: usize,
        running: bool,
    }

    #[test]
    fn randomized_against_a_model() {
        for (seed, caching) in [(1u64, true), (2, true), (3, false), (4, true)] {
            let mut rng = XorShift(0x1234_5678 ^ seed.wrapping_mul(0x9e37_79b9));
            let tpb = 1 + rng.below(4);
            let nb = 8 + rng.below(40);
            let mut m = KvBlockManager::new(nb, tpb, caching);
            // What each block holds: the full token prefix up to its end, once computed.
            let mut content: Vec<Option<Vec<u32>>> = vec![None; nb];
            let mut seqs: Vec<ModelSeq> = Vec::new();
            let prefixes: Vec<Vec<u32>> = (0..4)
                .map(|_| (0..rng.below(12)).map(|_| rng.below(3) as u32).collect())
                .collect();
            for _ in 0..4000 {
                match rng.below(10) {
                    // New sequence: a shared prefix plus a random tail.
                    0 | 1 if seqs.len() < 12 => {
                        let mut t = prefixes[rng.below(prefixes.len())].clone();
                        t.extend((0..1 + rng.below(10)).map(|_| rng.below(3) as u32));
                        seqs.push(ModelSeq {
                            kv: SeqBlocks::new(),
                            tokens: t,
                            num_computed: 0,
                            running: false,
                        });
                    }
                    // Schedule a step for one sequence (admission or continuation).
                    2..=6 if !seqs.is_empty() => {
                        let i = rng.below(seqs.len());
                        let s = &mut seqs[i];
                        if !s.running {
                            let hit = m.find_cached_prefix(&mut s.kv, &s.tokens);
                            assert!(hit.num_tokens < s.tokens.len());
                            assert_eq!(hit.num_tokens % tpb, 0);
                            for (j, &b) in hit.blocks.iter().enumerate() {
                                assert_eq!(
                                    content[b as usize].as_deref(),
                                    Some(&s.tokens[..(j + 1) * tpb]),
                                    "hit on a block with other content"
                                );
                            }
                            let free_before = m.num_free();
                            let n = 1 + rng.below(s.tokens.len() - hit.num_tokens);
                            if !m.allocate(&mut s.kv, &hit, hit.num_tokens + n) {
                                assert!(s.kv.is_empty());
                                assert_eq!(m.num_free(), free_before);
                                m.check_invariants();
                                continue;
                            }
                            s.running = true;
                            s.num_computed = hit.num_tokens;
                            for &b in &s.kv.table()[hit.blocks.len()..] {
                                content[b as usize] = None; // fresh: garbage until computed
                            }
                            s.num_computed += n;
                        } else {
                            if s.num_computed == s.tokens.len() {
                                s.tokens.push(rng.below(3) as u32); // "sampled"
                            }
                            let n = 1 + rng.below(s.tokens.len() - s.num_computed);
                            let old_len = s.kv.len();
                            if !m.allocate(&mut s.kv, &PrefixHit::none(), s.num_computed + n) {
                                assert_eq!(s.kv.len(), old_len);
                                m.check_invariants();
                                continue;
                            }
                            for &b in &s.kv.table()[old_len..] {
                                content[b as usize] = None;
                            }
                            s.num_computed += n;
                        }
                        assert!(s.kv.len() * tpb >= s.num_computed);
                        // The step ran: blocks that are full now hold their prefix.
                        for j in 0..s.num_computed / tpb {
                            let b = s.kv.table()[j] as usize;
                            let want = &s.tokens[..(j + 1) * tpb];
                            if let Some(c) = &content[b] {
                                assert_eq!(c.as_slice(), want, "shared block rewritten");
                            }
                            content[b] = Some(want.to_vec());
                        }
                        m.commit_full_blocks(&mut s.kv, &s.tokens, s.num_computed);
                    }
                    // Preempt (keep the sequence) or finish (drop it).
                    7 | 8 if !seqs.is_empty() => {
                        let i = rng.below(seqs.len());
                        m.release(&mut seqs[i].kv);
                        seqs[i].running = false;
                        seqs[i].num_computed = 0;
                        if rng.below(2) == 0 {
                            seqs.swap_remove(i);
                        }
                    }
                    _ => {}
                }
                m.check_invariants();
                // Reference counts match the tables exactly.
                let mut refs = vec![0u32; nb];
                for s in &seqs {
                    for &b in s.kv.table() {
                        refs[b as usize] += 1;
                    }
                }
                assert_eq!(refs, m.ref_counts);
                // Every cached block holds exactly the content its hash names.
                for (b, h) in m.block_hash.iter().enumerate() {
                    if let Some(h) = h {
                        let c = content[b].as_ref().expect("cached block was computed");
                        let mut ph = None;
                        for blk in c.chunks(tpb) {
                            ph = Some(hash_block(ph, blk));
                        }
                        assert_eq!(ph, Some(*h));
                    }
                }
            }
            if caching {
                assert!(m.hits() > 0, "stress test never hit the cache");
            }
            for s in &mut seqs {
                m.release(&mut s.kv);
            }
            assert_eq!(m.num_free(), nb);
            m.check_invariants();
        }
    }
}
