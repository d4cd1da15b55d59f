//! Where each token's KV lives under decode context parallelism (vLLM's placement).
//!
//! Token position `p` lives on DCP rank `floor(p / I) mod N`. A virtual block holds
//! `V = B·N` positions; with `v = p mod V`, the token's offset inside its rank's physical
//! block is `floor(v / (N·I))·I + (v mod I)`, and its slot is
//! `block_table[floor(p / V)]·B + offset`. Local token `j` of a rank therefore lives at
//! `block_table[j / B]·B + j mod B`, which is how attention walks the local shard.

/// The placement rule seen from one DCP rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Placement {
    /// Tokens per physical block on one rank (B).
    pub block_size: usize,
    /// DCP group size (N).
    pub dcp_size: usize,
    /// Interleave size (I).
    pub interleave: usize,
    /// This rank's index in its DCP group.
    pub dcp_rank: usize,
}

impl Placement {
    /// The single-rank placement.
    pub fn single(block_size: usize) -> Self {
        Self {
            block_size,
            dcp_size: 1,
            interleave: 1,
            dcp_rank: 0,
        }
    }

    /// Tokens per virtual block (B·N), the unit the scheduler allocates in.
    pub fn virtual_block_size(&self) -> usize {
        self.block_size * self.dcp_size
    }

    /// The DCP rank that stores position `p`.
    pub fn owner(&self, p: usize) -> usize {
        (p / self.interleave) % self.dcp_size
    }

    /// Physical slot of position `p` on this rank, or `None` when another rank owns it.
    pub fn slot(&self, p: usize, block_table: &[u32]) -> Option<usize> {
        if self.owner(p) != self.dcp_rank {
            return None;
        }
        let vbs = self.virtual_block_size();
        let v = p % vbs;
        let offset =
            (v / (self.dcp_size * self.interleave)) * self.interleave + v % self.interleave;
        block_table
            .get(p / vbs)
            .map(|&b| b as usize * self.block_size + offset)
    }

    /// How many of the first `len` positions of a sequence this rank stores.
    pub fn local_len(&self, len: usize) -> usize {
        let (n, i) = (self.dcp_size, self.interleave);
        let base = (len / i / n) * i;
        let rest = len as i64 - (base * n) as i64 - (self.dcp_rank * i) as i64;
        base + rest.clamp(0, i as i64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every position lands on exactly one rank, at a distinct slot, in local order,
    /// and local lengths add up — for many (N, I, B).
    #[test]
    fn placement_is_a_partition() {
        for n in [1, 2, 3, 4] {
            for i in [1, 2, 4] {
                for b in [4, 8, 16] {
                    if b % i != 0 {
                        continue;
                    }
                    let table: Vec<u32> = (0..64).map(|x| (x * 7 % 64) as u32).collect();
                    let ranks: Vec<Placement> = (0..n)
                        .map(|r| Placement {
                            block_size: b,
                            dcp_size: n,
                            interleave: i,
                            dcp_rank: r,
                        })
                        .collect();
                    let len = 3 * b * n + 5;
                    let mut seen = std::collections::HashSet::new();
                    let mut next_local = vec![0usize; n];
                    for p in 0..len {
                        let owners: Vec<usize> = ranks
                            .iter()
                            .filter(|pl| pl.slot(p, &table).is_some())
                            .map(|pl| pl.dcp_rank)
                            .collect();
                        assert_eq!(owners.len(), 1);
                        let r = owners[0];
                        let slot = ranks[r].slot(p, &table).unwrap();
                        assert!(seen.insert((r, slot)));
                        let j = next_local[r];
                        let expect = table[j / b] as usize * b + j % b;
                        assert_eq!(slot, expect, "n={n} i={i} b={b} p={p}");
                        next_local[r] += 1;
                        for (rr, pl) in ranks.iter().enumerate() {
                            assert_eq!(pl.local_len(p + 1), next_local[rr]);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn single_rank_is_identity_paging() {
        let pl = Placement::single(16);
        let table = [5u32, 2];
        assert_eq!(pl.slot(0, &table), Some(80));
        assert_eq!(pl.slot(17, &table), Some(33));
        assert_eq!(pl.slot(32, &table), None);
        assert_eq!(pl.local_len(20), 20);
    }
}
