//! Requests checked once, where they enter the engine, into types that the layers below
//! trust: a [`ValidPrompt`] can only be built by checking its token ids against the
//! model's vocabulary, and a [`ValidRequest`] only from a `ValidPrompt`.

use dcpserve_kernels::SamplingParams;

/// Why a prompt was refused. The messages are the ones the HTTP API answers with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PromptError {
    #[error("The prompt is empty.")]
    Empty,
    #[error("Token id {token} is out of vocabulary (size {vocab_size}).")]
    OutOfVocabulary { token: u32, vocab_size: usize },
}

/// Prompt token ids that are not empty and all below the model's vocabulary size.
///
/// ```
/// use dcpserve_actors::{PromptError, ValidPrompt};
/// assert!(ValidPrompt::new(vec![1, 2, 3], 10).is_ok());
/// assert_eq!(ValidPrompt::new(vec![], 10).unwrap_err(), PromptError::Empty);
/// assert_eq!(
///     ValidPrompt::new(vec![1, 10], 10).unwrap_err().to_string(),
///     "Token id 10 is out of vocabulary (size 10)."
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidPrompt(Vec<u32>);

impl ValidPrompt {
    /// Checks `ids` against a vocabulary of `vocab_size` tokens.
    pub fn new(ids: Vec<u32>, vocab_size: usize) -> Result<Self, PromptError> {
        if ids.is_empty() {
            return Err(PromptError::Empty);
        }
        if let Some(&token) = ids.iter().find(|&&t| t as usize >= vocab_size) {
            return Err(PromptError::OutOfVocabulary { token, vocab_size });
        }
        Ok(Self(ids))
    }

    /// The token ids.
    pub fn ids(&self) -> &[u32] {
        &self.0
    }

    /// Number of tokens (never zero).
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Always false: a valid prompt has at least one token.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The token ids, owned.
    pub fn into_ids(self) -> Vec<u32> {
        self.0
    }
}

/// A generation request whose prompt was checked against the model it is sent to. The
/// scheduler still refuses at admission what can never fit in its KV cache.
#[derive(Debug, Clone)]
pub struct ValidRequest {
    prompt: ValidPrompt,
    params: SamplingParams,
}

impl ValidRequest {
    /// A request of a checked prompt with its generation settings.
    pub fn new(prompt: ValidPrompt, params: SamplingParams) -> Self {
        Self { prompt, params }
    }

    /// The prompt.
    pub fn prompt(&self) -> &ValidPrompt {
        &self.prompt
    }

    /// The generation settings.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Prompt token ids and settings, to hand to the scheduler.
    pub fn into_parts(self) -> (Vec<u32>, SamplingParams) {
        (self.prompt.into_ids(), self.params)
    }
}
