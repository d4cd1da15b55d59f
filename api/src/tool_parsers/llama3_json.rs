//! `llama3_json`: Llama 3.1/3.2/3.3 answer a tool call with a bare JSON object
//! `{"name": "f", "parameters": {..}}` (the format their chat template asks for), sometimes
//! after `<|python_tag|>`, several separated by `; `. An output that does not begin with
//! such an object is plain content.

use super::json_scan::{scan_call, skip_ws, CallScan};
use super::{finish_content, Parsed, PartialCall, ToolCallParser};

const PYTHON_TAG: &str = "<|python_tag|>";
const ARG_KEYS: &[&str] = &["parameters", "arguments"];

/// The `llama3_json` parser.
#[derive(Debug, Clone, Copy, Default)]
pub struct Llama3Json;

impl ToolCallParser for Llama3Json {
    fn parse(&self, text: &str, done: bool) -> Parsed {
        let b = text.as_bytes();
        let mut i = skip_ws(b, 0);
        let rest = &text[i..];
        if !done && PYTHON_TAG.starts_with(rest) {
            // Whitespace, or the beginning of the tag: nothing is decided yet.
            return Parsed::default();
        }
        if let Some(r) = rest.strip_prefix(PYTHON_TAG) {
            i = skip_ws(b, text.len() - r.len());
        }
        match b.get(i) {
            Some(b'{') => {}
            None if !done => return Parsed::default(),
            _ => {
                return Parsed {
                    content: finish_content(text.to_string(), &[], done),
                    calls: Vec::new(),
                }
            }
        }
        let mut calls = Vec::new();
        let mut content = String::new();
        loop {
            let scan = scan_call(text, i, ARG_KEYS);
            if scan.invalid {
                return malformed(text, calls, &scan, done);
            }
            let Some(end) = scan.end else {
                if done {
                    // Cut short: not a call.
                    return Parsed::content_only(text);
                }
                calls.push(PartialCall {
                    arguments: if scan.name.is_some() {
                        scan.args_prefix(text).to_string()
                    } else {
                        String::new()
                    },
                    name: scan.name,
                });
                break;
            };
            let whole = &text[skip_ws(b, i)..end];
            let valid = serde_json::from_str::<serde_json::Value>(whole).is_ok();
            if !valid || scan.name.is_none() {
                return malformed(text, calls, &scan, done);
            }
            calls.push(PartialCall {
                arguments: match scan.args_prefix(text) {
                    "" => "{}".to_string(),
                    a => a.to_string(),
                },
                name: scan.name,
            });
            i = skip_ws(b, end);
            match b.get(i) {
                Some(b';') => {
                    i = skip_ws(b, i + 1);
                    match b.get(i) {
                        Some(b'{') => continue,
                        None => break,
                        Some(_) => {
                            content.push_str(&text[i..]);
                            break;
                        }
                    }
                }
                None => break,
                Some(_) => {
                    content.push_str(&text[i..]);
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

/// A call object that turned out malformed (a bad escape, arguments that are not JSON, no
/// name). At the end the whole output is content (the documented fallback, as vLLM's).
/// While streaming, what was already sent stays: the earlier calls and this call's name and
/// arguments as far as they were streamed, so no snapshot retracts a call a client was sent.
fn malformed(text: &str, mut calls: Vec<PartialCall>, scan: &CallScan, done: bool) -> Parsed {
    if done {
        return Parsed::content_only(text);
    }
    // As the open call read before it went wrong (nameless while its name was unread).
    calls.push(PartialCall {
        arguments: if scan.name.is_some() {
            scan.args_prefix(text).to_string()
        } else {
            String::new()
        },
        name: scan.name.clone(),
    });
    Parsed {
        content: String::new(),
        calls,
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_streams_consistently, calls};
    use super::*;

    #[test]
    fn one_call_as_llama_3_1_writes_it() {
        // Llama-3.1-8B-Instruct with custom tools (JSON-based tool calling in its template).
        let out = r#"{"name": "get_current_conditions", "parameters": {"location": "San Francisco, CA", "unit": "Fahrenheit"}}"#;
        let p = Llama3Json.parse(out, true);
        assert_eq!(p.content, "");
        assert_eq!(
            calls(&p),
            vec![(
                "get_current_conditions".to_string(),
                r#"{"location": "San Francisco, CA", "unit": "Fahrenheit"}"#.to_string()
            )]
        );
        assert_streams_consistently(&Llama3Json, out);
    }

    #[test]
    fn python_tag_and_several_calls() {
        let out = "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}; {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\", \"days\": 3}}";
        let p = Llama3Json.parse(out, true);
        assert_eq!(
            calls(&p),
            vec![
                ("get_weather".into(), r#"{"city": "Paris"}"#.into()),
                (
                    "get_weather".into(),
                    r#"{"city": "Rome", "days": 3}"#.into()
                ),
            ]
        );
        assert_streams_consistently(&Llama3Json, out);
    }

    #[test]
    fn arguments_key_and_no_arguments() {
        let out = "\n{\"name\": \"now\", \"arguments\": {}}";
        assert_eq!(
            calls(&Llama3Json.parse(out, true)),
            vec![("now".into(), "{}".into())]
        );
        let out = "{\"name\": \"now\"}";
        assert_eq!(
            calls(&Llama3Json.parse(out, true)),
            vec![("now".into(), "{}".into())]
        );
        assert_streams_consistently(&Llama3Json, out);
    }

    #[test]
    fn prose_is_content() {
        for out in [
            "The weather in Paris is sunny.",
            "  I can't call {tools} here",
            "",
        ] {
            assert_eq!(Llama3Json.parse(out, true), Parsed::content_only(out));
            assert_streams_consistently(&Llama3Json, out);
        }
    }

    #[test]
    fn broken_json_is_content() {
        for out in [
            "{\"name\": \"f\", \"parameters\": {\"a\": 1}",
            "{\"parameters\": {}}",
            "{\"name\": \"f\" \"parameters\": {}}",
            // An invalid escape inside a string (the tool_output fuzzer's find), in the
            // first and in the second of two calls.
            "<|python_tag|>{\"name\": \"w\", \"parameters\": {\"city\": \"Paris \\=\"x\\\" \"}}",
            "{\"name\": \"f\", \"parameters\": {}}; {\"name\": \"w\", \"parameters\": {\"c\": \"\\q\"}}",
        ] {
            assert_eq!(
                Llama3Json.parse(out, true),
                Parsed::content_only(out),
                "{out}"
            );
            // While streaming, a call that goes wrong never takes back what was shown of
            // it; only the end falls back.
            let mut last = Parsed::default();
            for c in (1..out.len()).filter(|&c| out.is_char_boundary(c)) {
                let snap = Llama3Json.parse(&out[..c], false);
                super::super::assert_extends(&last, &snap, &out[..c]);
                last = snap;
            }
        }
    }
}
