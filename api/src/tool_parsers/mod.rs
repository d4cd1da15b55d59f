//! Tool-call parsers: turn a model's tool-call syntax into OpenAI `tool_calls`, as vLLM's
//! `--tool-call-parser` does.
//!
//! Every parser maps the output text so far to a [`Parsed`] snapshot: the content outside
//! the calls and the calls as far as they go. A snapshot of a longer text extends the
//! snapshot of a shorter one (text that could still turn into a call marker is held back,
//! an argument scalar is held until complete), so streaming emits the difference between
//! consecutive snapshots and ends where the non-streaming parse of the whole output does,
//! however the output was split into chunks. `done` marks the whole output: held text is
//! released and the calls are checked; a malformed call makes the whole output content, as
//! in vLLM.
//!
//! | name | models | syntax |
//! |---|---|---|
//! | `hermes` | Qwen2.5/3, Hermes | `<tool_call>\n{"name": .., "arguments": {..}}\n</tool_call>` |
//! | `llama3_json` | Llama 3.1/3.2/3.3 | `{"name": .., "parameters": {..}}` (optional `<\|python_tag\|>`, `; ` between calls) |
//! | `deepseek_v3` | DeepSeek-V3, R1-0528 | `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{..}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>` |
//!
//! [`forced`] parses what a forced tool choice (a named function, or `required`) makes the
//! model write under its JSON-schema constraint.

pub mod deepseek_v3;
pub mod forced;
pub mod hermes;
pub mod json_scan;
pub mod llama3_json;

/// A tool call as far as the output goes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PartialCall {
    /// The function name, once complete.
    pub name: Option<String>,
    /// The arguments' JSON text so far (a prefix of the final arguments).
    pub arguments: String,
}

/// What a parser reads in the output so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Parsed {
    /// Text outside the calls.
    pub content: String,
    pub calls: Vec<PartialCall>,
}

impl Parsed {
    /// The whole output as content, without calls.
    pub fn content_only(text: &str) -> Self {
        Parsed {
            content: text.to_string(),
            calls: Vec::new(),
        }
    }
}

/// A tool-call syntax.
pub trait ToolCallParser: Send + Sync {
    /// Reads `text`, the output so far (`done`: the whole output).
    fn parse(&self, text: &str, done: bool) -> Parsed;
}

/// The parsers `--tool-call-parser` accepts.
pub const PARSER_NAMES: [&str; 3] = ["hermes", "llama3_json", "deepseek_v3"];

/// A parser chosen by `--tool-call-parser`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolParserKind {
    Hermes,
    Llama3Json,
    DeepSeekV3,
}

impl ToolParserKind {
    /// The parser named `name` (vLLM's names), or a message listing the known ones.
    pub fn from_name(name: &str) -> Result<Self, String> {
        match name {
            "hermes" => Ok(Self::Hermes),
            "llama3_json" => Ok(Self::Llama3Json),
            "deepseek_v3" => Ok(Self::DeepSeekV3),
            _ => Err(format!(
                "Unknown tool call parser `{name}`; known parsers: {}.",
                PARSER_NAMES.join(", ")
            )),
        }
    }

    /// An instance of the parser.
    pub fn parser(self) -> Box<dyn ToolCallParser> {
        match self {
            Self::Hermes => Box::new(hermes::Hermes),
            Self::Llama3Json => Box::new(llama3_json::Llama3Json),
            Self::DeepSeekV3 => Box::new(deepseek_v3::DeepSeekV3),
        }
    }
}

/// A tool-call id as OpenAI writes them: `call_` and 24 random letters and digits.
pub fn new_call_id() -> String {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut id = String::from("call_");
    for part in 0..2u64 {
        // RandomState is seeded randomly per process (and per instance).
        let mut h = RandomState::new().build_hasher();
        h.write_u64(n);
        h.write_u64(part);
        let mut x = h.finish();
        for _ in 0..12 {
            id.push(ALPHABET[(x % ALPHABET.len() as u64) as usize] as char);
            x /= ALPHABET.len() as u64;
        }
    }
    id
}

/// Content outside calls: trailing whitespace is held while the output grows and dropped
/// at the end when there are calls; with no calls the whole output is kept as it is.
pub(crate) fn finish_content(content: String, calls: &[PartialCall], done: bool) -> String {
    if done && calls.is_empty() {
        content
    } else {
        let n = content.trim_end().len();
        let mut content = content;
        content.truncate(n);
        content
    }
}

/// Panics unless `b` extends `a` as a parser's streaming snapshots must: longer content,
/// more calls, names fixed once known, longer arguments (the unit tests and the
/// `tool_output` fuzz target check it).
pub fn assert_extends(a: &Parsed, b: &Parsed, at: &str) {
    assert!(
        b.content.starts_with(&a.content),
        "content {:?} -> {:?} at {at:?}",
        a.content,
        b.content
    );
    assert!(b.calls.len() >= a.calls.len(), "calls shrank at {at:?}");
    for (x, y) in a.calls.iter().zip(&b.calls) {
        if x.name.is_some() {
            assert_eq!(x.name, y.name, "name changed at {at:?}");
        }
        assert!(
            y.arguments.starts_with(&x.arguments),
            "arguments {:?} -> {:?} at {at:?}",
            x.arguments,
            y.arguments
        );
    }
}

#[cfg(test)]
pub(crate) mod test_util {
    use super::*;

    /// Checks that every way of streaming `text` in chunks (all two-way splits, and
    /// chunks of 1, 2, 3 and 7 bytes) gives snapshots that extend each other and end with
    /// the whole-output parse.
    pub fn assert_streams_consistently(p: &dyn ToolCallParser, text: &str) {
        let whole = p.parse(text, true);
        let mut plans: Vec<Vec<usize>> = (1..text.len())
            .filter(|&k| text.is_char_boundary(k))
            .map(|k| vec![k])
            .collect();
        for step in [1, 2, 3, 7] {
            plans.push((1..text.len()).step_by(step).collect());
        }
        for cuts in plans {
            let mut last = Parsed::default();
            for &c in &cuts {
                if !text.is_char_boundary(c) {
                    continue;
                }
                let snap = p.parse(&text[..c], false);
                assert_extends(&last, &snap, &text[..c]);
                last = snap;
            }
            assert_extends(&last, &whole, text);
        }
    }

    /// The calls of a whole output as (name, arguments).
    pub fn calls(p: &Parsed) -> Vec<(String, String)> {
        p.calls
            .iter()
            .map(|c| (c.name.clone().unwrap_or_default(), c.arguments.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_look_like_openai_ids() {
        let a = new_call_id();
        let b = new_call_id();
        assert_ne!(a, b);
        assert_eq!(a.len(), 29);
        assert!(a.starts_with("call_") && a[5..].chars().all(|c| c.is_ascii_alphanumeric()));
    }

    #[test]
    fn names() {
        for n in PARSER_NAMES {
            assert!(ToolParserKind::from_name(n).is_ok());
        }
        assert!(ToolParserKind::from_name("mistral")
            .unwrap_err()
            .contains("hermes, llama3_json, deepseek_v3"));
    }
}
