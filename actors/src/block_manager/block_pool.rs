//! The physical side of KV-block management: reference counts, the content hash each
//! block carries, and the LRU free queue. Knows nothing of sequences or of the prefix
//! cache's lookup table (the `prefix_cache` module, which builds on this one).
//!
//! A block whose count is zero sits in the free queue exactly once; a block in use is
//! never in it. The queue is a doubly linked list over block ids (`prev`/`next` arrays),
//! so every operation is O(1).

use super::seq_blocks::BlockHash;

const NIL: u32 = u32::MAX;

/// Reference-counted blocks and their free queue.
#[derive(Debug)]
pub(super) struct BlockPool {
    ref_counts: Vec<u32>,
    block_hash: Vec<Option<BlockHash>>,
    prev: Vec<u32>,
    next: Vec<u32>,
    head: u32,
    tail: u32,
    num_free: usize,
}

impl BlockPool {
    /// `num_blocks` free blocks, queued in id order (the lowest ids are handed out first).
    pub(super) fn new(num_blocks: usize) -> Self {
        assert!(num_blocks < NIL as usize, "too many blocks");
        let n = num_blocks as u32;
        Self {
            ref_counts: vec![0; num_blocks],
            block_hash: vec![None; num_blocks],
            prev: (0..n).map(|i| if i == 0 { NIL } else { i - 1 }).collect(),
            next: (0..n)
                .map(|i| if i + 1 == n { NIL } else { i + 1 })
                .collect(),
            head: if n == 0 { NIL } else { 0 },
            tail: if n == 0 { NIL } else { n - 1 },
            num_free: num_blocks,
        }
    }

    pub(super) fn num_blocks(&self) -> usize {
        self.ref_counts.len()
    }

    pub(super) fn num_free(&self) -> usize {
        self.num_free
    }

    pub(super) fn is_free(&self, b: u32) -> bool {
        self.ref_counts[b as usize] == 0
    }

    /// The content hash `b` carries (set once its KV was computed and cached).
    pub(super) fn hash_of(&self, b: u32) -> Option<BlockHash> {
        self.block_hash[b as usize]
    }

    pub(super) fn set_hash(&mut self, b: u32, h: BlockHash) {
        self.block_hash[b as usize] = Some(h);
    }

    /// Forgets every block's hash (the KV memory was lost).
    pub(super) fn clear_hashes(&mut self) {
        self.block_hash.iter_mut().for_each(|h| *h = None);
    }

    /// Takes a reference on `b`, removing it from the free queue if it was free.
    pub(super) fn take(&mut self, b: u32) {
        if self.ref_counts[b as usize] == 0 {
            self.unlink(b);
        }
        self.ref_counts[b as usize] += 1;
    }

    /// Pops the least recently freed block with one reference on it, and the hash it
    /// carried (which the caller evicts from the prefix cache).
    pub(super) fn pop_free(&mut self) -> (u32, Option<BlockHash>) {
        let b = self.head;
        assert!(b != NIL, "free queue empty");
        self.unlink(b);
        self.ref_counts[b as usize] = 1;
        (b, self.block_hash[b as usize].take())
    }

    /// Drops one reference on `b`. A block that becomes free goes to the tail of the
    /// queue when it carries a hash (it stays hittable until it reaches the head) and to
    /// the head otherwise (it holds nothing reusable, so it is reused first) — unless
    /// `reuse_first`, which sends it to the head either way.
    pub(super) fn unref(&mut self, b: u32, reuse_first: bool) {
        let rc = &mut self.ref_counts[b as usize];
        assert!(*rc > 0, "double free of block {b}");
        *rc -= 1;
        if *rc == 0 {
            if !reuse_first && self.block_hash[b as usize].is_some() {
                self.push_back(b);
            } else {
                self.push_front(b);
            }
        }
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

    #[cfg(test)]
    pub(super) fn ref_counts(&self) -> &[u32] {
        &self.ref_counts
    }

    #[cfg(test)]
    pub(super) fn hashes(&self) -> &[Option<BlockHash>] {
        &self.block_hash
    }

    /// The free queue from head (next evicted) to tail.
    #[cfg(test)]
    pub(super) fn free_queue(&self) -> Vec<u32> {
        let mut v = Vec::new();
        let mut b = self.head;
        while b != NIL {
            v.push(b);
            assert!(v.len() <= self.num_blocks(), "cycle in free queue");
            b = self.next[b as usize];
        }
        v
    }

    /// Checks the queue's structure and that it holds exactly the unreferenced blocks.
    #[cfg(test)]
    pub(super) fn check_invariants(&self) {
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
        }
    }
}
