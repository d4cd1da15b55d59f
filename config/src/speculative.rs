//! Speculative decoding settings, spelled as vLLM's `--speculative-config` spells them.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::parallel::{ConfigError, ParallelConfig};

/// Where draft tokens come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpeculativeMethod {
    /// Prompt lookup: the tokens that followed an earlier occurrence of the context's
    /// last n tokens.
    Ngram,
    /// A smaller model with the same tokenizer, on its own rank group and KV cache.
    DraftModel,
    /// DeepSeek-V3's multi-token-prediction module, on the target's rank group.
    Mtp,
}

/// Most draft tokens per step: each costs a query row in the verification step.
pub const MAX_SPECULATIVE_TOKENS: usize = 16;

/// `--speculative-config`, e.g. `{"method": "ngram", "num_speculative_tokens": 4,
/// "prompt_lookup_max": 4}`.
///
/// ```
/// use dcpserve_config::{SpeculativeConfig, SpeculativeMethod};
/// let c = SpeculativeConfig::from_json(r#"{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}"#).unwrap();
/// assert_eq!(c.method, SpeculativeMethod::Ngram);
/// assert_eq!((c.prompt_lookup_min, c.prompt_lookup_max), (Some(4), Some(4)));
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpeculativeConfig {
    pub method: SpeculativeMethod,
    /// Draft tokens proposed per step (the most; the scheduler adapts it per request).
    pub num_speculative_tokens: usize,
    /// Shortest n-gram matched (ngram).
    #[serde(default)]
    pub prompt_lookup_min: Option<usize>,
    /// Longest n-gram matched (ngram).
    #[serde(default)]
    pub prompt_lookup_max: Option<usize>,
    /// The draft model: a GGUF file or a Hugging Face folder (draft_model).
    #[serde(default)]
    pub model: Option<PathBuf>,
    /// Ranks of the draft model's own group (draft_model; default 1).
    #[serde(default)]
    pub draft_tensor_parallel_size: Option<usize>,
    /// DCP size of the draft model's group (draft_model; default 1).
    #[serde(default)]
    pub draft_decode_context_parallel_size: Option<usize>,
    /// Adapt each request's draft length to its recent acceptance (default true): drafts
    /// that keep being rejected cost verification work for nothing.
    #[serde(default)]
    pub adaptive: Option<bool>,
}

impl SpeculativeConfig {
    /// Parses the JSON of `--speculative-config` and fills in vLLM's defaults.
    pub fn from_json(text: &str) -> Result<Self, ConfigError> {
        let c: SpeculativeConfig = serde_json::from_str(text)
            .map_err(|e| ConfigError(format!("Invalid --speculative-config: {e}")))?;
        c.normalized()
    }

    /// Fills in defaults (ngram lookup sizes as vLLM does) and checks the values.
    pub fn normalized(mut self) -> Result<Self, ConfigError> {
        let k = self.num_speculative_tokens;
        if k == 0 || k > MAX_SPECULATIVE_TOKENS {
            return Err(ConfigError(format!(
                "num_speculative_tokens must be between 1 and {MAX_SPECULATIVE_TOKENS}, got {k}."
            )));
        }
        match self.method {
            SpeculativeMethod::Ngram => {
                let (min, max) = match (self.prompt_lookup_min, self.prompt_lookup_max) {
                    (None, None) => (5, 5),
                    (Some(n), None) | (None, Some(n)) => (n, n),
                    (Some(a), Some(b)) => (a, b),
                };
                if min < 1 {
                    return Err(ConfigError(format!("prompt_lookup_min={min} must be > 0")));
                }
                if min > max {
                    return Err(ConfigError(format!(
                        "prompt_lookup_min={min} must be <= prompt_lookup_max={max}"
                    )));
                }
                self.prompt_lookup_min = Some(min);
                self.prompt_lookup_max = Some(max);
            }
            SpeculativeMethod::DraftModel => {
                if self.model.is_none() {
                    return Err(ConfigError(
                        "The draft_model method needs \"model\": the path of the draft model."
                            .into(),
                    ));
                }
                for (name, v) in [
                    (
                        "draft_tensor_parallel_size",
                        self.draft_tensor_parallel_size,
                    ),
                    (
                        "draft_decode_context_parallel_size",
                        self.draft_decode_context_parallel_size,
                    ),
                ] {
                    if v == Some(0) {
                        return Err(ConfigError(format!("{name} must be at least 1.")));
                    }
                }
            }
            SpeculativeMethod::Mtp => {}
        }
        Ok(self)
    }

    /// The draft model's own layout (draft_model): `draft_tensor_parallel_size` ranks in
    /// DCP groups of `draft_decode_context_parallel_size` (both default 1), one position
    /// per DCP rank at a time.
    ///
    /// ```
    /// use dcpserve_config::SpeculativeConfig;
    /// let c = SpeculativeConfig::from_json(r#"{"method": "draft_model", "num_speculative_tokens": 2, "model": "d.gguf", "draft_tensor_parallel_size": 2}"#).unwrap();
    /// assert_eq!(c.draft_parallel().tensor_parallel_size, 2);
    /// assert_eq!(c.draft_parallel().decode_context_parallel_size, 1);
    /// ```
    pub fn draft_parallel(&self) -> ParallelConfig {
        ParallelConfig {
            tensor_parallel_size: self.draft_tensor_parallel_size.unwrap_or(1),
            decode_context_parallel_size: self.draft_decode_context_parallel_size.unwrap_or(1),
            ..Default::default()
        }
    }

    /// Whether the draft length adapts to acceptance.
    pub fn is_adaptive(&self) -> bool {
        self.adaptive.unwrap_or(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ngram_defaults_follow_vllm() {
        let c = SpeculativeConfig::from_json(r#"{"method":"ngram","num_speculative_tokens":3}"#)
            .unwrap();
        assert_eq!(
            (c.prompt_lookup_min, c.prompt_lookup_max),
            (Some(5), Some(5))
        );
        let c = SpeculativeConfig::from_json(
            r#"{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_min":2}"#,
        )
        .unwrap();
        assert_eq!(
            (c.prompt_lookup_min, c.prompt_lookup_max),
            (Some(2), Some(2))
        );
    }

    #[test]
    fn bad_configs_are_refused_with_a_reason() {
        let cases = [
            (
                r#"{"method":"ngram","num_speculative_tokens":0}"#,
                "between 1 and",
            ),
            (
                r#"{"method":"ngram","num_speculative_tokens":2,"prompt_lookup_min":4,"prompt_lookup_max":2}"#,
                "prompt_lookup_min=4 must be <= prompt_lookup_max=2",
            ),
            (
                r#"{"method":"draft_model","num_speculative_tokens":2}"#,
                "needs \"model\"",
            ),
            (
                r#"{"method":"eagle","num_speculative_tokens":2}"#,
                "unknown variant",
            ),
            (
                r#"{"method":"ngram","num_speculative_tokens":2,"bogus":1}"#,
                "unknown field",
            ),
        ];
        for (json, want) in cases {
            let e = SpeculativeConfig::from_json(json).unwrap_err().0;
            assert!(e.contains(want), "{json}: {e}");
        }
    }
}
