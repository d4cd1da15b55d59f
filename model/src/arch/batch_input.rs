//! The flat batch of tokens one forward step computes, and its checks.

use crate::error::ModelError;

/// The tokens of one step, flattened over all scheduled sequences.
pub struct BatchInput<'a> {
    /// Token ids.
    pub tokens: &'a [u32],
    /// Absolute position of each token in its sequence.
    pub positions: &'a [usize],
    /// Index into `block_tables` of each token's sequence.
    pub token_seq: &'a [u32],
    /// KV-cache slot each token's K/V is written to (`usize::MAX`: not stored on this rank).
    pub slots: &'a [usize],
    /// Number of cached tokens each token attends to, itself included (the causal mask).
    pub kv_lens: &'a [u32],
    /// Block table of each sequence.
    pub block_tables: &'a [&'a [u32]],
    /// Tokens whose next-token logits are wanted, in output order.
    pub logits_for: &'a [usize],
}

impl BatchInput<'_> {
    /// The number of tokens, once every per-token array is checked to have that length.
    pub fn checked_len(&self) -> Result<usize, ModelError> {
        let n = self.tokens.len();
        let lens = [
            self.positions.len(),
            self.token_seq.len(),
            self.slots.len(),
            self.kv_lens.len(),
        ];
        if lens.iter().any(|&l| l != n) {
            return Err(ModelError::Invalid(format!(
                "batch arrays disagree in length: {n} tokens but {lens:?}"
            )));
        }
        Ok(n)
    }

    /// Whether this is a decode step: one token per sequence, each wanting its logits
    /// (what a device graph may replay; prefill chunks and draft verification are not).
    pub fn is_decode(&self) -> bool {
        let n = self.tokens.len();
        n > 0 && self.block_tables.len() == n && self.logits_for.len() == n
    }

    /// Refuses token ids outside the vocabulary.
    pub(crate) fn check_vocab(&self, vocab: usize) -> Result<(), ModelError> {
        match self.tokens.iter().find(|&&t| t as usize >= vocab) {
            Some(t) => Err(ModelError::Invalid(format!(
                "token id {t} is outside the vocabulary ({vocab})"
            ))),
            None => Ok(()),
        }
    }
}
