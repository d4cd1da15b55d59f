//! `hermes`: Qwen2.5/Qwen3 and Hermes models write each call as
//! `<tool_call>\n{"name": "f", "arguments": {..}}\n</tool_call>` (their chat templates'
//! instructions), possibly several, possibly after some text.

use super::json_scan::{scan_call, settled};
use super::{finish_content, Parsed, PartialCall, ToolCallParser};

const START: &str = "<tool_call>";
const END: &str = "</tool_call>";
const ARG_KEYS: &[&str] = &["arguments", "parameters"];

/// The `hermes` parser.
#[derive(Debug, Clone, Copy, Default)]
pub struct Hermes;

/// One call body (the text between the tags): the call, or `None` when it is not a valid
/// call object (checked only when the body is complete).
fn read_call(body: &str, complete: bool) -> Option<PartialCall> {
    let scan = scan_call(body, 0, ARG_KEYS);
    if complete {
        let value: serde_json::Value = serde_json::from_str(body.trim()).ok()?;
        value.get("name")?.as_str()?;
        if scan.invalid || scan.end.is_none() {
            return None;
        }
        let arguments = match scan.args_prefix(body) {
            "" => "{}".to_string(),
            a => a.to_string(),
        };
        return Some(PartialCall {
            name: scan.name,
            arguments,
        });
    }
    Some(PartialCall {
        arguments: if scan.name.is_some() {
            scan.args_prefix(body).to_string()
        } else {
            String::new()
        },
        name: scan.name,
    })
}

impl ToolCallParser for Hermes {
    fn parse(&self, text: &str, done: bool) -> Parsed {
        let mut content = String::new();
        let mut calls = Vec::new();
        let mut pos = 0;
        loop {
            let rest = &text[pos..];
            let Some(k) = rest.find(START) else {
                content.push_str(settled(rest, START, done));
                break;
            };
            content.push_str(&rest[..k]);
            let body_start = pos + k + START.len();
            match text[body_start..].find(END) {
                Some(e) => {
                    let body = &text[body_start..body_start + e];
                    match read_call(body, true) {
                        Some(c) => calls.push(c),
                        None if done => return Parsed::content_only(text),
                        // A bad call is reported whole at the end; meanwhile the stream
                        // stays where it was (the call as read while open, nothing more),
                        // so no snapshot takes back what an earlier one sent.
                        None => {
                            calls.extend(read_call(body, false));
                            break;
                        }
                    }
                    pos = body_start + e + END.len();
                }
                None => {
                    // While streaming, a tail that may begin the closing tag is held back.
                    let body = settled(&text[body_start..], END, done);
                    // A last call whose closing tag never came is read as complete.
                    match read_call(body, done) {
                        Some(c) => calls.push(c),
                        None => return Parsed::content_only(text),
                    }
                    break;
                }
            }
        }
        Parsed {
            content: finish_content(content, &calls, done),
            calls,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_streams_consistently, calls};
    use super::*;

    /// What Qwen2.5-7B-Instruct writes for "What's the weather in Paris and in Rome?" with a
    /// `get_weather` tool (its template asks for one `<tool_call>` block per call).
    const TWO_CALLS: &str = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\", \"unit\": \"celsius\"}}\n</tool_call>";

    #[test]
    fn two_calls() {
        let p = Hermes.parse(TWO_CALLS, true);
        assert_eq!(p.content, "");
        assert_eq!(
            calls(&p),
            vec![
                (
                    "get_weather".to_string(),
                    r#"{"city": "Paris", "unit": "celsius"}"#.to_string()
                ),
                (
                    "get_weather".to_string(),
                    r#"{"city": "Rome", "unit": "celsius"}"#.to_string()
                ),
            ]
        );
        assert_streams_consistently(&Hermes, TWO_CALLS);
    }

    #[test]
    fn text_before_the_call_is_content() {
        // Qwen3 often says what it is about to do first.
        let out = "I'll look up the current time in Tokyo.\n\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"timezone\": \"Asia/Tokyo\"}}\n</tool_call>";
        let p = Hermes.parse(out, true);
        assert_eq!(p.content, "I'll look up the current time in Tokyo.");
        assert_eq!(
            calls(&p),
            vec![(
                "get_time".to_string(),
                r#"{"timezone": "Asia/Tokyo"}"#.to_string()
            )]
        );
        assert_streams_consistently(&Hermes, out);
    }

    #[test]
    fn nested_arguments_and_unicode() {
        let out = "<tool_call>\n{\"name\": \"book\", \"arguments\": {\"guests\": [{\"name\": \"Zoë\", \"age\": 31}], \"note\": \"window }\"}}\n</tool_call>";
        let p = Hermes.parse(out, true);
        assert_eq!(
            p.calls[0].arguments,
            r#"{"guests": [{"name": "Zoë", "age": 31}], "note": "window }"}"#
        );
        assert_streams_consistently(&Hermes, out);
    }

    #[test]
    fn plain_answers_stay_content() {
        for out in ["The capital of France is Paris.  \n", "a < b and <tool", ""] {
            let p = Hermes.parse(out, true);
            assert_eq!(p, Parsed::content_only(out));
            assert_streams_consistently(&Hermes, out);
        }
    }

    #[test]
    fn an_unclosed_last_call_still_counts() {
        let out = "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}";
        assert_eq!(
            calls(&Hermes.parse(out, true)),
            vec![("f".into(), "{}".into())]
        );
    }

    #[test]
    fn malformed_calls_make_everything_content() {
        for out in [
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }\n</tool_call>",
            "<tool_call>\nnot json\n</tool_call>",
            "<tool_call>{\"arguments\": {}}</tool_call>",
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1",
        ] {
            assert_eq!(Hermes.parse(out, true), Parsed::content_only(out), "{out}");
        }
    }
}
