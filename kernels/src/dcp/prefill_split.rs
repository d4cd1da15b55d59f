//! Prefill context parallelism: which copy of the TP group computes which tokens of a
//! step.
//!
//! The KV cache is placed over the context-parallel group (`pcp·dcp` ranks) by the one
//! placement rule ([`Placement`](super::Placement)): position `p` lives on
//! context-parallel rank `c = floor(p / I) mod (pcp·dcp)`, that is on copy `c / dcp`.
//! A token is computed by the copy that will store it, so no K/V ever moves between
//! copies: not after a prefill (decode reads it where it was written) and not during one
//! (each copy writes its own tokens' K/V before attention). The placement is striped, so
//! every copy gets the same share of any run of positions (within `I·dcp` tokens), early
//! and late positions alike, which is what balances causal attention (ring attention's
//! head-and-tail chunks serve the same end for a contiguous split).

/// How one rank's copy of the TP group splits a step's tokens with the other copies.
///
/// ```
/// use dcpserve_kernels::dcp::PrefillSplit;
/// // pcp=2, dcp=1, interleave 2: positions 0,1 | 2,3 | 4,5 ... alternate between copies.
/// let split = PrefillSplit { pcp: 2, pcp_rank: 1, dcp: 1, interleave: 2 };
/// assert_eq!((0..8).filter(|&p| split.computes(p)).collect::<Vec<_>>(), [2, 3, 6, 7]);
/// assert_eq!(split.owner(4), 0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PrefillSplit {
    /// Copies of the TP group (`--prefill-context-parallel-size`).
    pub pcp: usize,
    /// This rank's copy.
    pub pcp_rank: usize,
    /// DCP group size inside a copy.
    pub dcp: usize,
    /// Interleave size (I).
    pub interleave: usize,
}

impl PrefillSplit {
    /// No prefill context parallelism: the one copy computes every token.
    pub fn single() -> Self {
        Self {
            pcp: 1,
            pcp_rank: 0,
            dcp: 1,
            interleave: 1,
        }
    }

    /// Whether the tokens are split at all.
    pub fn is_split(&self) -> bool {
        self.pcp > 1
    }

    /// The copy that computes (and stores) position `p`.
    pub fn owner(&self, p: usize) -> usize {
        let cp = (self.pcp * self.dcp).max(1);
        ((p / self.interleave.max(1)) % cp) / self.dcp.max(1)
    }

    /// Whether this rank's copy computes position `p`.
    pub fn computes(&self, p: usize) -> bool {
        self.owner(p) == self.pcp_rank
    }

    /// Splits a step's `positions` over the copies: for each copy, the indices of the
    /// tokens it computes, in step order.
    pub fn assign(&self, positions: &[usize]) -> Vec<Vec<usize>> {
        let mut parts = vec![Vec::new(); self.pcp.max(1)];
        for (i, &p) in positions.iter().enumerate() {
            parts[self.owner(p)].push(i);
        }
        parts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_copy_gets_an_even_share_of_any_long_run() {
        for (pcp, dcp, i) in [(2, 1, 1), (2, 2, 16), (4, 1, 1), (3, 2, 4)] {
            let split = PrefillSplit {
                pcp,
                pcp_rank: 0,
                dcp,
                interleave: i,
            };
            let positions: Vec<usize> = (100..100 + 24 * pcp * dcp * i).collect();
            let parts = split.assign(&positions);
            let total: usize = parts.iter().map(Vec::len).sum();
            assert_eq!(total, positions.len());
            for part in &parts {
                assert_eq!(
                    part.len(),
                    positions.len() / pcp,
                    "pcp={pcp} dcp={dcp} i={i}"
                );
            }
            // Causal balance: the attention work (sum of positions) differs by less than
            // one stripe's worth of tokens.
            let work: Vec<usize> = parts
                .iter()
                .map(|p| p.iter().map(|&j| positions[j]).sum())
                .collect();
            let (lo, hi) = (work.iter().min().unwrap(), work.iter().max().unwrap());
            assert!(hi - lo <= positions.len() * dcp * i, "{work:?}");
        }
    }
}
