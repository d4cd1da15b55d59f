//! Reasoning parsers (`--reasoning-parser`, vLLM's names): split a thinking model's output
//! into `reasoning_content` (between `<think>` and `</think>`) and `content` (after).
//!
//! - `deepseek_r1`: DeepSeek-R1 and its distills. Their template opens `<think>` in the
//!   prompt, so the output usually holds only `</think>`; everything before it is
//!   reasoning (all of it when `</think>` never comes, e.g. cut by `max_tokens`). A leading
//!   `<think>` is dropped.
//! - `qwen3`: Qwen3, which thinks only when it opens `<think>` itself (or its template
//!   opened it in the prompt, as the Thinking-2507 models do); otherwise, as with
//!   `enable_thinking: false`, the whole output is content.
//!
//! Like the tool parsers, [`ReasoningParser::split`] maps the output so far to a snapshot
//! that later snapshots extend, so streaming and whole outputs agree.

use crate::tool_parsers::json_scan::settled;

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// The parsers `--reasoning-parser` accepts.
pub const PARSER_NAMES: [&str; 2] = ["deepseek_r1", "qwen3"];

/// A reasoning parser.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningParser {
    DeepSeekR1,
    Qwen3,
}

/// Reasoning and content of an output (so far).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Split {
    pub reasoning: String,
    pub content: String,
}

impl ReasoningParser {
    /// The parser named `name`, or a message listing the known ones.
    pub fn from_name(name: &str) -> Result<Self, String> {
        match name {
            "deepseek_r1" => Ok(Self::DeepSeekR1),
            "qwen3" => Ok(Self::Qwen3),
            _ => Err(format!(
                "Unknown reasoning parser `{name}`; known parsers: {}.",
                PARSER_NAMES.join(", ")
            )),
        }
    }

    /// Whether a rendered prompt leaves the model inside `<think>` (the template opened it).
    pub fn prompt_opens_thinking(prompt: &str) -> bool {
        prompt.trim_end().ends_with(OPEN)
    }

    /// Splits `text`, the output so far (`done`: the whole output); `in_thinking`: the
    /// prompt opened `<think>`.
    pub fn split(self, text: &str, in_thinking: bool, done: bool) -> Split {
        let lead = text.len() - text.trim_start().len();
        let body = &text[lead..];
        let thinking = match self {
            Self::DeepSeekR1 => true,
            Self::Qwen3 => {
                if !done && !in_thinking && OPEN.starts_with(body) {
                    // Nothing but (the beginning of) `<think>` yet: undecided.
                    return Split::default();
                }
                in_thinking || body.starts_with(OPEN)
            }
        };
        if !thinking {
            return Split {
                reasoning: String::new(),
                content: text.to_string(),
            };
        }
        let inner = match body.strip_prefix(OPEN) {
            Some(r) => r,
            None if !done && OPEN.starts_with(body) => return Split::default(),
            None => text,
        };
        match inner.find(CLOSE) {
            Some(k) => Split {
                reasoning: inner[..k].to_string(),
                content: inner[k + CLOSE.len()..].to_string(),
            },
            None => Split {
                reasoning: settled(inner, CLOSE, done).to_string(),
                content: String::new(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_streaming(p: ReasoningParser, text: &str, in_thinking: bool) {
        let whole = p.split(text, in_thinking, true);
        for step in [1, 2, 3, 5] {
            let mut last = Split::default();
            let cuts = (1..text.len())
                .step_by(step)
                .filter(|&c| text.is_char_boundary(c));
            for c in cuts.chain([text.len()]) {
                let s = p.split(&text[..c], in_thinking, false);
                assert!(s.reasoning.starts_with(&last.reasoning), "{:?}", &text[..c]);
                assert!(s.content.starts_with(&last.content), "{:?}", &text[..c]);
                last = s;
            }
            assert!(whole.reasoning.starts_with(&last.reasoning));
            assert!(whole.content.starts_with(&last.content));
        }
    }

    #[test]
    fn deepseek_r1_with_the_opening_tag_in_the_prompt() {
        // DeepSeek-R1-Distill-Qwen: the template ends the prompt with "<｜Assistant｜><think>\n".
        let out = "The user wants 2+3. That is 5.\n</think>\n\nThe answer is **5**.";
        let s = ReasoningParser::DeepSeekR1.split(out, true, true);
        assert_eq!(s.reasoning, "The user wants 2+3. That is 5.\n");
        assert_eq!(s.content, "\n\nThe answer is **5**.");
        check_streaming(ReasoningParser::DeepSeekR1, out, true);
    }

    #[test]
    fn deepseek_r1_opening_its_own_tag() {
        let out = "<think>\nShort.\n</think>\n\nHi!";
        let s = ReasoningParser::DeepSeekR1.split(out, false, true);
        assert_eq!(
            (s.reasoning.as_str(), s.content.as_str()),
            ("\nShort.\n", "\n\nHi!")
        );
        check_streaming(ReasoningParser::DeepSeekR1, out, false);
        // Cut by max_tokens while thinking: all reasoning.
        let s = ReasoningParser::DeepSeekR1.split("<think>\nStill going", false, true);
        assert_eq!(
            (s.reasoning.as_str(), s.content.as_str()),
            ("\nStill going", "")
        );
    }

    #[test]
    fn qwen3_thinks_only_when_it_opens_the_tag() {
        let out = "<think>\nOkay, the user greets me.\n</think>\n\nHello! How can I help?";
        let s = ReasoningParser::Qwen3.split(out, false, true);
        assert_eq!(s.reasoning, "\nOkay, the user greets me.\n");
        assert_eq!(s.content, "\n\nHello! How can I help?");
        check_streaming(ReasoningParser::Qwen3, out, false);
        let plain = "Hello! How can I help?";
        let s = ReasoningParser::Qwen3.split(plain, false, true);
        assert_eq!((s.reasoning.as_str(), s.content.as_str()), ("", plain));
        check_streaming(ReasoningParser::Qwen3, plain, false);
        // A Thinking-2507 template opened it in the prompt.
        let s = ReasoningParser::Qwen3.split("hmm</think>ok", true, true);
        assert_eq!((s.reasoning.as_str(), s.content.as_str()), ("hmm", "ok"));
        assert!(ReasoningParser::prompt_opens_thinking(
            "<|im_start|>assistant\n<think>\n"
        ));
        assert!(!ReasoningParser::prompt_opens_thinking(
            "<|im_start|>assistant\n"
        ));
    }

    #[test]
    fn names() {
        assert_eq!(
            ReasoningParser::from_name("qwen3"),
            Ok(ReasoningParser::Qwen3)
        );
        assert!(ReasoningParser::from_name("x").is_err());
    }
}
