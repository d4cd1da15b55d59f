//! Paged KV-block allocation with reference counts.
//!
//! Blocks are counted in virtual blocks (block size × dcp tokens); the same block id is
//! used on every rank that holds a shard of the block.

/// Allocates KV blocks to sequences.
#[derive(Debug)]
pub struct KvBlockManager {
    num_blocks: usize,
    free: Vec<u32>,
    ref_counts: Vec<u32>,
}

impl KvBlockManager {
    /// A manager of `num_blocks` blocks, all free.
    pub fn new(num_blocks: usize) -> Self {
        Self {
            num_blocks,
            // Pop from the end: lowest ids are handed out first.
            free: (0..num_blocks as u32).rev().collect(),
            ref_counts: vec![0; num_blocks],
        }
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    /// Fraction of blocks in use.
    pub fn usage(&self) -> f64 {
        if self.num_blocks == 0 {
            0.0
        } else {
            1.0 - self.free.len() as f64 / self.num_blocks as f64
        }
    }

    /// Grows `table` so it covers `n_tokens` tokens of `tokens_per_block`; on shortage
    /// leaves it unchanged and returns false.
    pub fn ensure(
        &mut self,
        table: &mut Vec<u32>,
        n_tokens: usize,
        tokens_per_block: usize,
    ) -> bool {
        let needed = n_tokens.div_ceil(tokens_per_block);
        if needed <= table.len() {
            return true;
        }
        let extra = needed - table.len();
        if extra > self.free.len() {
            return false;
        }
        for _ in 0..extra {
            let b = self.free.pop().expect("checked above");
            self.ref_counts[b as usize] = 1;
            table.push(b);
        }
        true
    }

    /// Releases every block of `table` (and empties it).
    pub fn release(&mut self, table: &mut Vec<u32>) {
        for b in table.drain(..).rev() {
            let rc = &mut self.ref_counts[b as usize];
            debug_assert!(*rc > 0, "double free of block {b}");
            *rc = rc.saturating_sub(1);
            if *rc == 0 {
                self.free.push(b);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocates_and_frees() {
        let mut m = KvBlockManager::new(4);
        let mut a = Vec::new();
        assert!(m.ensure(&mut a, 33, 16));
        assert_eq!(a, vec![0, 1, 2]);
        let mut b = Vec::new();
        assert!(!m.ensure(&mut b, 17, 16), "only one block left");
        assert!(b.is_empty());
        assert!(m.ensure(&mut b, 16, 16));
        assert_eq!(m.num_free(), 0);
        m.release(&mut a);
        assert_eq!(m.num_free(), 3);
        assert!(a.is_empty());
        assert!(m.ensure(&mut b, 64, 16));
        assert_eq!(b.len(), 4);
    }
}
