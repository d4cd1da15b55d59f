//! Prompt-lookup drafting: find an earlier occurrence of the context's last n tokens and
//! propose what followed it.

use futures::future::BoxFuture;

use super::{Draft, DraftProposer, DraftRequest};

/// Proposes the tokens that followed the most recent earlier occurrence of the longest
/// suffix of `prompt_lookup_min..=prompt_lookup_max` tokens.
#[derive(Debug, Clone)]
pub struct NgramProposer {
    min_n: usize,
    max_n: usize,
}

impl NgramProposer {
    pub fn new(prompt_lookup_min: usize, prompt_lookup_max: usize) -> Self {
        let min_n = prompt_lookup_min.max(1);
        Self {
            min_n,
            max_n: prompt_lookup_max.max(min_n),
        }
    }

    /// The draft for one context.
    pub fn lookup(&self, tokens: &[u32], k: usize) -> Vec<u32> {
        if k == 0 {
            return Vec::new();
        }
        let len = tokens.len();
        for n in (self.min_n..=self.max_n.min(len.saturating_sub(1))).rev() {
            let suffix = &tokens[len - n..];
            // Most recent earlier occurrence: its continuation is what repeats next in
            // edited code and quoted text. `start + n < len` keeps at least one token after.
            let found = (0..len - n)
                .rev()
                .find(|&start| &tokens[start..start + n] == suffix);
            if let Some(start) = found {
                let from = start + n;
                let to = (from + k).min(len);
                return tokens[from..to].to_vec();
            }
        }
        Vec::new()
    }
}

impl DraftProposer for NgramProposer {
    fn propose<'a>(
        &'a mut self,
        batch: &'a [DraftRequest],
    ) -> BoxFuture<'a, Result<Vec<Draft>, String>> {
        let drafts = batch
            .iter()
            .map(|r| Draft {
                seq: r.seq,
                tokens: self.lookup(&r.tokens, r.num_tokens),
                probs: None,
            })
            .collect();
        Box::pin(async move { Ok(drafts) })
    }

    fn method(&self) -> &'static str {
        "ngram"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_suffix_and_most_recent_occurrence_win() {
        let p = NgramProposer::new(1, 3);
        // "1 2 3" occurs at 0 and at 5; the most recent one (followed by 8 9) wins.
        let t = [1, 2, 3, 4, 5, 1, 2, 3, 8, 9, 0, 1, 2, 3];
        assert_eq!(p.lookup(&t, 2), vec![8, 9]);
        // Continuations stop at the end of the context.
        assert_eq!(p.lookup(&t, 10), vec![8, 9, 0, 1, 2, 3]);
        // With min = max = 3, a 2-token suffix match is not enough.
        let p3 = NgramProposer::new(3, 3);
        assert_eq!(p3.lookup(&[7, 8, 1, 7, 8], 3), Vec::<u32>::new());
        // A 1-gram falls back when longer ones do not match.
        assert_eq!(p.lookup(&[4, 6, 9, 4], 2), vec![6, 9]);
    }

    #[test]
    fn nothing_to_match_means_no_draft() {
        let p = NgramProposer::new(1, 4);
        assert!(p.lookup(&[1, 2, 3, 4], 3).is_empty());
        assert!(p.lookup(&[5], 3).is_empty());
        assert!(p.lookup(&[], 3).is_empty());
        assert!(p.lookup(&[1, 1], 0).is_empty());
    }
}
