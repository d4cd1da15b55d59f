//! Structured outputs through the grammar engine `llguidance` (the one vLLM, SGLang and
//! llama.cpp use): a [`GrammarCompiler`] turns an [`OutputConstraint`] into a
//! [`GrammarMatcher`] over the model's vocabulary, and the matcher says, token by token,
//! which tokens may come next (a bitmask the sampler applies to the logits).
//!
//! The compiler is built once per tokenizer (the token trie and llguidance's lexer slices
//! take a while on a large vocabulary) and shared: the HTTP layer compiles each request's
//! constraint to answer a 400 with the engine's message, and the sampling rank compiles it
//! again for the sequence it samples (plans carry the constraint as text, not a matcher).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use dcpserve_kernels::OutputConstraint;
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, SimpleVob, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};

use crate::tokenizer::Tokenizer;

/// How JSON is spelled when a schema does not say (llguidance's `x-guidance` options):
/// one space after `,` and `:` (as Python's `json.dumps`), no other whitespace. Free
/// whitespace would let a sampled model wander through blanks instead of finishing.
fn default_json_options() -> Value {
    json!({"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": false})
}

/// Compiles constraints over one tokenizer's vocabulary.
pub struct GrammarCompiler {
    factory: ParserFactory,
    /// Ids below this have a byte string in the trie; the mask allows no id at or above it.
    vocab_size: usize,
    eos_token_ids: Vec<u32>,
}

impl std::fmt::Debug for GrammarCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarCompiler")
            .field("vocab_size", &self.vocab_size)
            .field("eos_token_ids", &self.eos_token_ids)
            .finish()
    }
}

impl GrammarCompiler {
    /// Builds the token trie of `tokenizer` (the bytes of every token: byte-level BPE
    /// tokens are mapped back from their printable spelling, SentencePiece's `<0xNN>` and
    /// `▁` too; special tokens are marked so that grammars never produce them as text) and
    /// llguidance's parser factory over it. The tokenizer needs an end-of-sequence token:
    /// a finished grammar allows only that.
    pub fn new(tokenizer: &Tokenizer) -> Result<Self, String> {
        let eos_token_ids = tokenizer.eos_token_ids().to_vec();
        let Some(&eos) = eos_token_ids.first() else {
            return Err("structured outputs need a model with an end-of-sequence token".into());
        };
        let text = tokenizer
            .inner()
            .to_string(false)
            .map_err(|e| format!("cannot serialize the tokenizer: {e}"))?;
        let json: Value = serde_json::from_str(&text)
            .map_err(|e| format!("cannot read the tokenizer's JSON: {e}"))?;
        // llguidance asserts on token spellings it does not expect: a panic is an error here.
        let words = catch_unwind(AssertUnwindSafe(|| {
            llguidance::token_bytes_from_tokenizer_json(&json)
        }))
        .map_err(|_| "the grammar engine cannot read this tokenizer's vocabulary".to_string())?
        .map_err(|e| format!("the grammar engine cannot read this tokenizer's vocabulary: {e}"))?;
        Self::from_token_bytes(words, tokenizer.vocab_size(), &eos_token_ids).map(|mut c| {
            c.eos_token_ids = eos_token_ids.clone();
            debug_assert_eq!(c.eos_token_ids.first(), Some(&eos));
            c
        })
    }

    /// Builds the compiler from the bytes of every token (index = token id; a special
    /// token starts with `TokTrie::SPECIAL_TOKEN_MARKER`), padded to `vocab_size` ids.
    pub fn from_token_bytes(
        mut words: Vec<Vec<u8>>,
        vocab_size: usize,
        eos_token_ids: &[u32],
    ) -> Result<Self, String> {
        let Some(&eos) = eos_token_ids.first() else {
            return Err("structured outputs need a model with an end-of-sequence token".into());
        };
        let vocab_size = vocab_size.max(words.len()).max(eos as usize + 1);
        words.resize(vocab_size, Vec::new());
        let info = TokRxInfo::new(vocab_size as u32, eos);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(eos_token_ids);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
        factory.quiet();
        Ok(Self {
            factory,
            vocab_size,
            eos_token_ids: eos_token_ids.to_vec(),
        })
    }

    /// Ids the masks cover (the tokenizer's; ids above are never allowed).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Compiles `constraint` into a fresh matcher at the start of the output, or the
    /// grammar engine's message when it cannot (a bad schema, regex or grammar).
    pub fn matcher(&self, constraint: &OutputConstraint) -> Result<GrammarMatcher, String> {
        let grammar = top_level_grammar(constraint)?;
        let parser = catch_unwind(AssertUnwindSafe(|| self.factory.create_parser(grammar)))
            .map_err(|_| "the grammar engine failed on this constraint".to_string())?
            .map_err(|e| e.to_string())?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(e);
        }
        Ok(GrammarMatcher {
            matcher,
            eos: self.eos_token_ids[0],
        })
    }

    /// Whether `constraint` compiles; `Err` carries the grammar engine's message.
    pub fn check(&self, constraint: &OutputConstraint) -> Result<(), String> {
        self.matcher(constraint).map(|_| ())
    }
}

/// llguidance's grammar for a constraint.
fn top_level_grammar(constraint: &OutputConstraint) -> Result<TopLevelGrammar, String> {
    Ok(match constraint {
        OutputConstraint::JsonObject => {
            let mut schema = json!({"type": "object"});
            schema["x-guidance"] = default_json_options();
            TopLevelGrammar::from_json_schema(schema)
        }
        OutputConstraint::JsonSchema(text) => {
            let mut schema: Value = serde_json::from_str(text)
                .map_err(|e| format!("the JSON schema is not valid JSON: {e}"))?;
            match &mut schema {
                Value::Object(o) => {
                    o.entry("x-guidance").or_insert_with(default_json_options);
                }
                Value::Bool(_) => {}
                _ => return Err("a JSON schema must be an object or a boolean".into()),
            }
            TopLevelGrammar::from_json_schema(schema)
        }
        OutputConstraint::Regex(rx) => {
            // Reject what llguidance's regex dialect cannot read before it gets there.
            regex_syntax::Parser::new()
                .parse(rx)
                .map_err(|e| format!("invalid regular expression: {e}"))?;
            TopLevelGrammar::from_regex(rx)
        }
        OutputConstraint::Choice(choices) => {
            if choices.is_empty() {
                return Err("a choice constraint needs at least one choice".into());
            }
            let alternatives: Vec<String> =
                choices.iter().map(|c| regex_syntax::escape(c)).collect();
            TopLevelGrammar::from_regex(&format!("({})", alternatives.join("|")))
        }
        OutputConstraint::Lark(grammar) => {
            if grammar.trim().is_empty() {
                return Err("the grammar is empty".into());
            }
            TopLevelGrammar::from_lark(grammar.clone())
        }
    })
}

/// One sequence's position in its grammar: which tokens may come next.
///
/// A matcher in an error state (which the engine reaches only on its own limits, since
/// every sampled token is one the mask allowed) and a finished one both allow only the
/// end-of-sequence token, so the sequence stops.
pub struct GrammarMatcher {
    matcher: Matcher,
    eos: u32,
}

/// The tokens allowed at one position: bit `t % 32` of word `t / 32` is token `t`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenMask {
    words: Vec<u32>,
}

impl TokenMask {
    /// A mask allowing exactly `tokens` among `vocab_size` ids.
    pub fn from_tokens(vocab_size: usize, tokens: &[u32]) -> Self {
        let mut words = vec![0u32; vocab_size.div_ceil(32)];
        for &t in tokens {
            if let Some(w) = words.get_mut(t as usize / 32) {
                *w |= 1 << (t % 32);
            }
        }
        Self { words }
    }

    fn from_vob(v: &SimpleVob) -> Self {
        Self {
            words: v.as_slice().to_vec(),
        }
    }

    /// Whether `token` is allowed.
    pub fn allows(&self, token: u32) -> bool {
        self.words
            .get(token as usize / 32)
            .is_some_and(|w| w >> (token % 32) & 1 == 1)
    }

    /// How many tokens are allowed.
    pub fn count(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Sets the logit of every token the mask does not allow to `-inf` (ids past the
    /// mask's vocabulary included).
    pub fn apply(&self, logits: &mut [f32]) {
        for (i, chunk) in logits.chunks_mut(32).enumerate() {
            let w = self.words.get(i).copied().unwrap_or(0);
            if w == u32::MAX && chunk.len() == 32 {
                continue;
            }
            for (b, l) in chunk.iter_mut().enumerate() {
                if w >> b & 1 == 0 {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
    }
}

impl GrammarMatcher {
    /// The tokens allowed next (only end-of-sequence once the grammar is finished or the
    /// matcher failed).
    pub fn mask(&mut self) -> TokenMask {
        match self.matcher.compute_mask_or_eos() {
            Ok(v) => TokenMask::from_vob(&v),
            Err(_) => self.eos_only(),
        }
    }

    fn eos_only(&self) -> TokenMask {
        let n = self
            .matcher
            .tok_env()
            .map_or(self.eos as usize + 1, |e| e.tok_trie().vocab_size());
        TokenMask::from_tokens(n, &[self.eos])
    }

    /// Whether `token` may come next: what `self.mask().allows(token)` answers, at the
    /// cost of walking one token through the grammar instead of the whole vocabulary.
    /// The end-of-sequence token and a finished or failed matcher are answered through
    /// the mask (where end-of-sequence has its own rules).
    pub fn allows_next(&mut self, token: u32) -> bool {
        if token == self.eos || self.matcher.is_stopped() {
            return self.mask().allows(token);
        }
        self.matcher.validate_tokens(&[token]).is_ok_and(|n| n == 1)
    }

    /// Advances past `tokens` (each must be allowed in turn). An end-of-sequence token
    /// finishes the grammar. On error the matcher is left failed (its masks allow only
    /// end-of-sequence) and the engine's message is returned.
    pub fn consume(&mut self, tokens: &[u32]) -> Result<(), String> {
        if self.matcher.is_stopped() {
            return Ok(());
        }
        self.matcher
            .consume_tokens(tokens)
            .map_err(|e| e.to_string())
    }

    /// Takes back the last `n` consumed tokens (after looking ahead through a draft).
    pub fn rollback(&mut self, n: usize) -> Result<(), String> {
        if n == 0 {
            return Ok(());
        }
        self.matcher.rollback(n).map_err(|e| e.to_string())
    }

    /// Whether the grammar is finished (or failed): nothing but end-of-sequence may follow.
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// The engine's error, if the matcher failed.
    pub fn error(&self) -> Option<String> {
        self.matcher.get_error()
    }

    /// The masks for the next token and for each position of `draft` after it, as long as
    /// the draft stays in the grammar: `masks[i]` is the mask at draft position `i` (after
    /// `draft[..i]`), and the list stops after the first draft token its mask rejects (so
    /// `masks.len() <= draft.len() + 1`). The matcher ends where it started.
    pub fn masks_along(&mut self, draft: &[u32]) -> Vec<TokenMask> {
        let mut masks = Vec::with_capacity(draft.len() + 1);
        let mut consumed = 0;
        loop {
            let m = self.mask();
            let next = draft.get(consumed).copied();
            let go_on = next.is_some_and(|t| m.allows(t)) && !self.matcher.is_stopped();
            masks.push(m);
            if !go_on {
                break;
            }
            let t = next.expect("checked above");
            if self.matcher.consume_tokens(&[t]).is_err() {
                break;
            }
            consumed += 1;
        }
        if consumed > 0 && self.matcher.rollback(consumed).is_err() {
            tracing::warn!("grammar matcher could not roll back a draft look-ahead");
        }
        masks
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A vocabulary of single bytes, a few words and an end-of-sequence token.
    fn compiler() -> (GrammarCompiler, Vec<Vec<u8>>) {
        let mut words: Vec<Vec<u8>> = (0u8..128).map(|b| vec![b]).collect();
        for w in ["{\"", "\": ", "true", "false", "yes", "no", "\"}"] {
            words.push(w.as_bytes().to_vec());
        }
        words.push(b"\xFF</s>".to_vec());
        let eos = words.len() as u32 - 1;
        (
            GrammarCompiler::from_token_bytes(words.clone(), words.len(), &[eos]).unwrap(),
            words,
        )
    }

    fn id(words: &[Vec<u8>], w: &str) -> u32 {
        words.iter().position(|x| x == w.as_bytes()).unwrap() as u32
    }

    #[test]
    fn choice_masks_and_finishes() {
        let (c, words) = compiler();
        let eos = words.len() as u32 - 1;
        let mut m = c
            .matcher(&OutputConstraint::Choice(vec!["yes".into(), "no".into()]))
            .unwrap();
        let mask = m.mask();
        assert!(mask.allows(id(&words, "yes")));
        assert!(mask.allows(id(&words, "no")));
        assert!(mask.allows(b'y' as u32));
        assert!(!mask.allows(b'x' as u32));
        assert!(!mask.allows(eos), "not finished yet");
        m.consume(&[id(&words, "no")]).unwrap();
        let mask = m.mask();
        assert_eq!(mask.count(), 1);
        assert!(mask.allows(eos));
        m.consume(&[eos]).unwrap();
        assert!(m.is_finished());
    }

    #[test]
    fn mask_sets_disallowed_logits_to_minus_infinity() {
        let mask = TokenMask::from_tokens(40, &[1, 33]);
        let mut logits = vec![0.5f32; 45];
        mask.apply(&mut logits);
        for (t, l) in logits.iter().enumerate() {
            assert_eq!(l.is_finite(), t == 1 || t == 33, "token {t}");
        }
    }

    #[test]
    fn draft_look_ahead_stops_at_the_first_rejected_token() {
        let (c, words) = compiler();
        let schema = r#"{"type":"object","properties":{"a":{"type":"boolean"}},"required":["a"],"additionalProperties":false}"#;
        let mut m = c
            .matcher(&OutputConstraint::JsonSchema(schema.into()))
            .unwrap();
        let good = [id(&words, "{\""), b'a' as u32, id(&words, "\": ")];
        let draft = [good[0], good[1], good[2], b'x' as u32, id(&words, "true")];
        let masks = m.masks_along(&draft);
        assert_eq!(masks.len(), 4, "three drafts stand, the fourth is rejected");
        assert!(!masks[3].allows(b'x' as u32));
        assert!(masks[3].allows(id(&words, "true")));
        // The matcher is back at the start: the first mask again.
        assert_eq!(m.mask(), masks[0]);
        m.consume(&good).unwrap();
        assert_eq!(m.mask(), masks[3]);
    }

    #[test]
    fn allows_next_answers_as_the_mask_does() {
        // Every token of the vocabulary, at every position along a schema-valid output
        // and along a choice up to after its end: the one-token check and the mask agree.
        let (c, words) = compiler();
        let eos = words.len() as u32 - 1;
        let schema = r#"{"type":"object","properties":{"a":{"type":"boolean"}},"required":["a"],"additionalProperties":false}"#;
        let cases = [
            (
                OutputConstraint::JsonSchema(schema.into()),
                vec![
                    id(&words, "{\""),
                    b'a' as u32,
                    id(&words, "\": "),
                    id(&words, "true"),
                    b'}' as u32,
                    eos,
                ],
            ),
            (
                OutputConstraint::Choice(vec!["yes".into(), "no".into()]),
                vec![b'y' as u32, b'e' as u32, b's' as u32, eos],
            ),
            (
                OutputConstraint::Regex("[0-9]+".into()),
                vec![b'4' as u32, b'2' as u32, eos],
            ),
        ];
        for (constraint, path) in cases {
            let mut m = c.matcher(&constraint).unwrap();
            let mut allowed_seen = 0;
            for step in 0..=path.len() {
                let mask = m.mask();
                for t in 0..words.len() as u32 {
                    assert_eq!(
                        m.allows_next(t),
                        mask.allows(t),
                        "{constraint:?}, step {step}, token {t} ({:?})",
                        String::from_utf8_lossy(&words[t as usize])
                    );
                }
                allowed_seen += mask.count();
                if let Some(&t) = path.get(step) {
                    m.consume(&[t]).unwrap();
                }
            }
            assert!(m.is_finished(), "{constraint:?}");
            assert!(
                allowed_seen > path.len(),
                "{constraint:?}: the masks allowed tokens"
            );
        }
    }

    #[test]
    fn bad_constraints_carry_the_engine_message() {
        let (c, _) = compiler();
        for bad in [
            OutputConstraint::JsonSchema("{not json".into()),
            OutputConstraint::JsonSchema(r#"{"type": "nonsense"}"#.into()),
            OutputConstraint::Regex("(unclosed".into()),
            OutputConstraint::Lark("start: undefined_rule".into()),
            OutputConstraint::Choice(vec![]),
        ] {
            let e = c.check(&bad).unwrap_err();
            assert!(!e.is_empty(), "{bad:?}");
        }
        c.check(&OutputConstraint::JsonObject).unwrap();
        c.check(&OutputConstraint::Lark("start: \"a\"+".into()))
            .unwrap();
    }
}
