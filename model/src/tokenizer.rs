//! The engine's tokenizer: a `tokenizers::Tokenizer` plus the special tokens the engine needs,
//! and an incremental detokenizer for streaming.

use std::path::Path;

use serde_json::Value;

use crate::error::ModelError;
use crate::json_file::read_json_opt;

fn tok_err(e: impl std::fmt::Display) -> ModelError {
    ModelError::Tokenizer(e.to_string())
}

/// A tokenizer with its BOS/EOS tokens.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    bos_token: Option<String>,
    eos_token: Option<String>,
    eos_token_ids: Vec<u32>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .field("eos_token_ids", &self.eos_token_ids)
            .finish()
    }
}

/// A special token as `tokenizer_config.json` writes it: a string or `{"content": ...}`.
fn special_token(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

impl Tokenizer {
    /// Wraps a built tokenizer. `bos_token` / `eos_token` are token strings; EOS ids start as
    /// the id of `eos_token` (if it is in the vocabulary).
    pub fn new(
        inner: tokenizers::Tokenizer,
        bos_token: Option<String>,
        eos_token: Option<String>,
    ) -> Self {
        let eos_token_ids = eos_token
            .as_deref()
            .and_then(|t| inner.token_to_id(t))
            .into_iter()
            .collect();
        Tokenizer {
            inner,
            bos_token,
            eos_token,
            eos_token_ids,
        }
    }

    /// Loads `dir/tokenizer.json`, with BOS/EOS from `dir/tokenizer_config.json` when present.
    pub fn from_hf_dir(dir: &Path) -> Result<Self, ModelError> {
        let path = dir.join("tokenizer.json");
        if !path.is_file() {
            return Err(ModelError::MissingFile {
                path,
                what: "a Hugging Face model folder needs tokenizer.json".into(),
            });
        }
        let inner = tokenizers::Tokenizer::from_file(&path)
            .map_err(|e| ModelError::corrupt(&path, format!("cannot load tokenizer: {e}")))?;
        let config = read_json_opt(&dir.join("tokenizer_config.json"))?;
        let bos = special_token(config.as_ref().and_then(|c| c.get("bos_token")));
        let eos = special_token(config.as_ref().and_then(|c| c.get("eos_token")));
        Ok(Self::new(inner, bos, eos))
    }

    /// The wrapped `tokenizers` tokenizer.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// Token ids of `text`; `add_special_tokens` applies the post-processor (e.g. adds BOS).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, ModelError> {
        let enc = self
            .inner
            .encode_fast(text, add_special_tokens)
            .map_err(tok_err)?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text of `ids`.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, ModelError> {
        self.inner.decode(ids, skip_special_tokens).map_err(tok_err)
    }

    /// The token string of `id` (in the model's spelling, e.g. `Ġthe`).
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The id of the token string `token`.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Number of ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The BOS token string, if the tokenizer has one.
    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    /// The EOS token string, if the tokenizer has one.
    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// The id of the BOS token.
    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos_token.as_deref().and_then(|t| self.token_to_id(t))
    }

    /// The id of the EOS token (see also [`Tokenizer::eos_token_ids`]).
    pub fn eos_token_id(&self) -> Option<u32> {
        self.eos_token.as_deref().and_then(|t| self.token_to_id(t))
    }

    /// Every id that ends generation: the EOS token's plus any added with
    /// [`Tokenizer::add_eos_token_ids`].
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_token_ids
    }

    /// Adds ids that also end generation (e.g. from `generation_config.json`), without
    /// duplicates.
    pub fn add_eos_token_ids(&mut self, ids: &[u32]) {
        for &id in ids {
            if !self.eos_token_ids.contains(&id) {
                self.eos_token_ids.push(id);
            }
        }
    }

    /// A fresh streaming detokenizer.
    pub fn incremental_decoder(&self, skip_special_tokens: bool) -> IncrementalDecoder {
        IncrementalDecoder::new(skip_special_tokens)
    }
}

/// Streaming detokenizer: feed it generated ids, get back only newly completed text.
///
/// Uses the prefix-offset / read-offset technique of vLLM and TGI: decode a short window of
/// already-emitted tokens with and without the new ones and emit the difference. The window
/// keeps context-dependent decoding (leading-space stripping, multi-token UTF-8 characters)
/// identical to decoding the whole sequence; a result ending in U+FFFD means a character is
/// still incomplete, so nothing is emitted until a later token completes it.
#[derive(Debug, Clone)]
pub struct IncrementalDecoder {
    ids: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
    skip_special_tokens: bool,
}

impl IncrementalDecoder {
    /// An empty decoder; `skip_special_tokens` drops special tokens from the text.
    pub fn new(skip_special_tokens: bool) -> Self {
        IncrementalDecoder {
            ids: Vec::new(),
            prefix_offset: 0,
            read_offset: 0,
            skip_special_tokens,
        }
    }

    /// Seeds the decoder with prompt ids whose text is not to be emitted, so that the first
    /// generated token decodes in context (e.g. keeps its leading space).
    pub fn with_prompt(prompt: &[u32], skip_special_tokens: bool) -> Self {
        // A few tokens of context are enough; more only costs decode time.
        let start = prompt.len().saturating_sub(6);
        let ids = prompt[start..].to_vec();
        IncrementalDecoder {
            read_offset: ids.len(),
            ids,
            prefix_offset: 0,
            skip_special_tokens,
        }
    }

    /// Appends `new_ids` and returns the text they complete (possibly empty).
    pub fn push(&mut self, tokenizer: &Tokenizer, new_ids: &[u32]) -> Result<String, ModelError> {
        self.ids.extend_from_slice(new_ids);
        let prefix = tokenizer.decode(
            &self.ids[self.prefix_offset..self.read_offset],
            self.skip_special_tokens,
        )?;
        let full = tokenizer.decode(&self.ids[self.prefix_offset..], self.skip_special_tokens)?;
        if full.len() <= prefix.len() || full.ends_with('\u{FFFD}') {
            return Ok(String::new());
        }
        let delta = text_after(&full, &prefix);
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        self.compact();
        Ok(delta)
    }

    /// Returns whatever is still held back (e.g. a trailing incomplete character, as U+FFFD),
    /// for the end of a stream.
    pub fn flush(&mut self, tokenizer: &Tokenizer) -> Result<String, ModelError> {
        let prefix = tokenizer.decode(
            &self.ids[self.prefix_offset..self.read_offset],
            self.skip_special_tokens,
        )?;
        let full = tokenizer.decode(&self.ids[self.prefix_offset..], self.skip_special_tokens)?;
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        self.compact();
        Ok(if full.len() > prefix.len() {
            text_after(&full, &prefix)
        } else {
            String::new()
        })
    }

    /// Drops ids before the window so memory stays bounded on long generations.
    fn compact(&mut self) {
        if self.prefix_offset > 0 {
            self.ids.drain(..self.prefix_offset);
            self.read_offset -= self.prefix_offset;
            self.prefix_offset = 0;
        }
    }
}

/// `full` minus the leading `prefix`. Decoders normally extend the prefix text; if one does
/// not, skip as many characters as the prefix has rather than slicing mid-character.
fn text_after(full: &str, prefix: &str) -> String {
    match full.strip_prefix(prefix) {
        Some(rest) => rest.to_string(),
        None => full.chars().skip(prefix.chars().count()).collect(),
    }
}
