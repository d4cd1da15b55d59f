//! What a chat choice's output becomes: plain `content`, or `reasoning_content`, `content`
//! and `tool_calls` as the request's tool choice and the model's parsers read it.
//!
//! [`OutputParser`] keeps a choice's text; streaming turns each new piece into a
//! [`StreamDelta`] (the difference between consecutive parser snapshots, see
//! [`crate::tool_parsers`]), and [`OutputParser::finish`] gives the whole message.

use std::sync::Arc;

use crate::reasoning::ReasoningParser;
use crate::tool_parsers::{new_call_id, ToolCallParser};
use crate::types::{FunctionCallOut, FunctionDelta, ToolCallDelta, ToolCallOut};

/// How a request's outputs are read.
#[derive(Clone, Default)]
pub struct OutputMode {
    /// Splits off `<think>` reasoning, and whether the prompt opened `<think>`.
    pub reasoning: Option<(ReasoningParser, bool)>,
    /// Reads tool calls in the content.
    pub tools: Option<Arc<dyn ToolCallParser>>,
}

impl OutputMode {
    /// Neither reasoning nor tool calls: the text is the content, as it comes.
    pub fn is_plain(&self) -> bool {
        self.reasoning.is_none() && self.tools.is_none()
    }
}

/// New output of a streamed choice.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StreamDelta {
    pub reasoning: String,
    pub content: String,
    pub tool_calls: Vec<ToolCallDelta>,
}

impl StreamDelta {
    pub fn is_empty(&self) -> bool {
        self.reasoning.is_empty() && self.content.is_empty() && self.tool_calls.is_empty()
    }
}

/// The message of a finished choice.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FinalMessage {
    pub reasoning: Option<String>,
    /// `None` when the output was only tool calls.
    pub content: Option<String>,
    pub tool_calls: Vec<ToolCallOut>,
}

#[derive(Default)]
struct Snapshot {
    reasoning: String,
    content: String,
    calls: Vec<(Option<String>, String)>,
}

/// One choice's output, read as it grows.
pub struct OutputParser {
    mode: OutputMode,
    text: String,
    sent: Snapshot,
    /// Ids of the calls whose names were sent.
    ids: Vec<String>,
}

/// The part of `new` past `old`, when `new` extends it (a malformed output can make a
/// snapshot disagree with what was streamed: nothing more is sent for that field then).
fn extension<'a>(old: &str, new: &'a str) -> &'a str {
    if new.len() > old.len() && new.starts_with(old) {
        &new[old.len()..]
    } else {
        ""
    }
}

impl OutputParser {
    pub fn new(mode: OutputMode) -> Self {
        Self {
            mode,
            text: String::new(),
            sent: Snapshot::default(),
            ids: Vec::new(),
        }
    }

    /// Whether the output passes through as plain content.
    pub fn is_plain(&self) -> bool {
        self.mode.is_plain()
    }

    /// Whether any tool call was read (its name sent, when streaming).
    pub fn called_tools(&self) -> bool {
        !self.ids.is_empty()
    }

    fn snapshot(&self, done: bool) -> Snapshot {
        let (reasoning, content) = match self.mode.reasoning {
            Some((p, in_thinking)) => {
                let s = p.split(&self.text, in_thinking, done);
                (s.reasoning, s.content)
            }
            None => (String::new(), self.text.clone()),
        };
        match &self.mode.tools {
            Some(t) => {
                let parsed = t.parse(&content, done);
                Snapshot {
                    reasoning,
                    content: parsed.content,
                    calls: parsed
                        .calls
                        .into_iter()
                        .map(|c| (c.name, c.arguments))
                        .collect(),
                }
            }
            None => Snapshot {
                reasoning,
                content,
                calls: Vec::new(),
            },
        }
    }

    /// Adds `text` to the output (`done`: it is the last piece) and returns what is new.
    pub fn push(&mut self, text: &str, done: bool) -> StreamDelta {
        self.text.push_str(text);
        if self.mode.is_plain() {
            return StreamDelta {
                content: text.to_string(),
                ..Default::default()
            };
        }
        let snap = self.snapshot(done);
        let mut delta = StreamDelta {
            reasoning: extension(&self.sent.reasoning, &snap.reasoning).to_string(),
            content: extension(&self.sent.content, &snap.content).to_string(),
            tool_calls: Vec::new(),
        };
        if !delta.reasoning.is_empty() {
            self.sent.reasoning = snap.reasoning;
        }
        if !delta.content.is_empty() {
            self.sent.content = snap.content;
        }
        for (index, (name, args)) in snap.calls.into_iter().enumerate() {
            if index == self.ids.len() {
                // A call starts with its id and name, once the name is known.
                let Some(name) = name else { break };
                let id = new_call_id();
                self.ids.push(id.clone());
                self.sent.calls.push((Some(name.clone()), String::new()));
                delta.tool_calls.push(ToolCallDelta {
                    index,
                    id: Some(id),
                    kind: Some("function"),
                    function: FunctionDelta {
                        name: Some(name),
                        arguments: Some(String::new()),
                    },
                });
            }
            let sent_args = &mut self.sent.calls[index].1;
            let more = extension(sent_args, &args);
            if more.is_empty() {
                continue;
            }
            let more = more.to_string();
            *sent_args = args;
            match delta.tool_calls.last_mut() {
                Some(d) if d.index == index => d.function.arguments = Some(more),
                _ => delta.tool_calls.push(ToolCallDelta {
                    index,
                    id: None,
                    kind: None,
                    function: FunctionDelta {
                        name: None,
                        arguments: Some(more),
                    },
                }),
            }
        }
        delta
    }

    /// The message of the whole output (for non-streaming responses).
    pub fn finish(&mut self) -> FinalMessage {
        if self.mode.is_plain() {
            return FinalMessage {
                reasoning: None,
                content: Some(self.text.clone()),
                tool_calls: Vec::new(),
            };
        }
        let snap = self.snapshot(true);
        let tool_calls: Vec<ToolCallOut> = snap
            .calls
            .into_iter()
            .filter_map(|(name, arguments)| {
                Some(ToolCallOut {
                    id: new_call_id(),
                    kind: "function",
                    function: FunctionCallOut {
                        name: name?,
                        arguments,
                    },
                })
            })
            .collect();
        self.ids = tool_calls.iter().map(|c| c.id.clone()).collect();
        let content = if tool_calls.is_empty() || !snap.content.is_empty() {
            Some(snap.content)
        } else {
            None
        };
        FinalMessage {
            reasoning: (self.mode.reasoning.is_some() && !snap.reasoning.is_empty())
                .then_some(snap.reasoning),
            content,
            tool_calls,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tool_parsers::forced::Required;
    use crate::tool_parsers::ToolParserKind;

    /// Streams `text` in `chunk`-byte pieces and reassembles the deltas as a client does.
    fn reassemble(mode: &OutputMode, text: &str, chunk: usize) -> FinalMessage {
        let mut p = OutputParser::new(mode.clone());
        let mut out = FinalMessage::default();
        let (mut reasoning, mut content) = (String::new(), String::new());
        let mut i = 0;
        while i < text.len() {
            let mut j = (i + chunk).min(text.len());
            while !text.is_char_boundary(j) {
                j += 1;
            }
            let d = p.push(&text[i..j], j == text.len());
            reasoning.push_str(&d.reasoning);
            content.push_str(&d.content);
            for c in d.tool_calls {
                if let Some(id) = c.id {
                    assert_eq!(c.index, out.tool_calls.len());
                    out.tool_calls.push(ToolCallOut {
                        id,
                        kind: "function",
                        function: FunctionCallOut {
                            name: c.function.name.expect("a call starts with its name"),
                            arguments: String::new(),
                        },
                    });
                }
                let call = &mut out.tool_calls[c.index];
                call.function.arguments += c.function.arguments.as_deref().unwrap_or("");
            }
            i = j;
        }
        out.reasoning = (!reasoning.is_empty()).then_some(reasoning);
        out.content = (out.tool_calls.is_empty() || !content.is_empty()).then_some(content);
        out
    }

    fn without_ids(mut m: FinalMessage) -> FinalMessage {
        for c in &mut m.tool_calls {
            c.id.clear();
        }
        m
    }

    #[test]
    fn streamed_deltas_reassemble_to_the_whole_message() {
        let hermes = OutputMode {
            reasoning: Some((ReasoningParser::Qwen3, false)),
            tools: Some(Arc::from(ToolParserKind::Hermes.parser())),
        };
        let out = "<think>\nThe user wants the weather; call the tool.\n</think>\n\nChecking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}\n</tool_call>";
        let whole = OutputParser::new(hermes.clone()).finish();
        let mut p = OutputParser::new(hermes.clone());
        p.push(out, true);
        let whole_msg = p.finish();
        assert!(whole.tool_calls.is_empty());
        assert_eq!(
            whole_msg.reasoning.as_deref(),
            Some("\nThe user wants the weather; call the tool.\n")
        );
        assert_eq!(whole_msg.content.as_deref(), Some("\n\nChecking."));
        assert_eq!(whole_msg.tool_calls.len(), 2);
        assert_eq!(whole_msg.tool_calls[1].function.name, "get_time");
        for chunk in [1, 2, 3, 5, 8, 13, 1000] {
            assert_eq!(
                without_ids(reassemble(&hermes, out, chunk)),
                without_ids(whole_msg.clone()),
                "chunks of {chunk}"
            );
        }
        let required = OutputMode {
            reasoning: None,
            tools: Some(Arc::new(Required)),
        };
        let out =
            r#"[{"name": "a", "parameters": {"x": [1, 2]}}, {"name": "b", "parameters": {}}]"#;
        let mut p = OutputParser::new(required.clone());
        p.push(out, true);
        let whole = p.finish();
        assert_eq!(whole.content, None);
        for chunk in [1, 4, 9] {
            assert_eq!(
                without_ids(reassemble(&required, out, chunk)),
                without_ids(whole.clone())
            );
        }
    }

    #[test]
    fn plain_text_passes_through() {
        let mut p = OutputParser::new(OutputMode::default());
        assert_eq!(p.push("  a ", false).content, "  a ");
        assert_eq!(p.push("b", true).content, "b");
        assert_eq!(p.finish().content.as_deref(), Some("  a b"));
    }
}
