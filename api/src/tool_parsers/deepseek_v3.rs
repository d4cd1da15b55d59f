//! `deepseek_v3`: DeepSeek-V3 (and R1-0528) write calls between special tokens, as their
//! chat template renders them:
//!
//! ```text
//! <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
//! ```json
//! {"location": "Tokyo"}
//! ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>
//! ```
//!
//! These tokens are not "special" in DeepSeek's tokenizer, so they reach the text.

use super::json_scan::settled;
use super::{finish_content, Parsed, PartialCall, ToolCallParser};

const CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
const CALLS_END: &str = "<｜tool▁calls▁end｜>";
const CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
const CALL_END: &str = "<｜tool▁call▁end｜>";
const SEP: &str = "<｜tool▁sep｜>";
const FENCE: &str = "```json\n";
const FENCE_END: &str = "\n```";

/// The `deepseek_v3` parser.
#[derive(Debug, Clone, Copy, Default)]
pub struct DeepSeekV3;

/// One call from the text after `<｜tool▁call▁begin｜>` up to its end token (or up to the
/// end of the output when `complete` is false). `None`: not a call of this format. While
/// streaming (`complete` false) a call that has gone wrong still reads as far as it was
/// right, so no snapshot takes back what an earlier one showed; the end decides (a
/// malformed block makes the whole output content).
fn read_call(body: &str, complete: bool) -> Option<PartialCall> {
    let Some(sep) = body.find(SEP) else {
        return (!complete).then(PartialCall::default);
    };
    let after = &body[sep + SEP.len()..];
    let Some(nl) = after.find('\n') else {
        return (!complete).then(PartialCall::default);
    };
    let name = after[..nl].trim().to_string();
    if name.is_empty() {
        return (!complete).then(PartialCall::default);
    }
    let fenced = &after[nl + 1..];
    let args = match fenced.strip_prefix(FENCE) {
        Some(args) => args,
        None if !complete => "",
        None => return None,
    };
    let arguments = match args.find(FENCE_END) {
        Some(k) => &args[..k],
        None if complete => return None,
        None => settled(args, FENCE_END, false),
    };
    if complete && serde_json::from_str::<serde_json::Value>(arguments).is_err() {
        return None;
    }
    Some(PartialCall {
        name: Some(name),
        arguments: arguments.to_string(),
    })
}

impl ToolCallParser for DeepSeekV3 {
    fn parse(&self, text: &str, done: bool) -> Parsed {
        let Some(k) = text.find(CALLS_BEGIN) else {
            return Parsed {
                content: finish_content(settled(text, CALLS_BEGIN, done).to_string(), &[], done),
                calls: Vec::new(),
            };
        };
        let mut content = text[..k].to_string();
        let mut calls = Vec::new();
        let mut rest = &text[k + CALLS_BEGIN.len()..];
        loop {
            let trimmed = rest.trim_start();
            if let Some(after) = trimmed.strip_prefix(CALLS_END) {
                content.push_str(after);
                break;
            }
            let Some(body) = trimmed.strip_prefix(CALL_BEGIN) else {
                // At the end, calls whose closing token never came still count; anything
                // else is not this format. While streaming, wait.
                if done && (calls.is_empty() || !trimmed.is_empty()) {
                    return Parsed::content_only(text);
                }
                break;
            };
            match body.find(CALL_END) {
                Some(e) => match read_call(&body[..e], true) {
                    Some(c) => {
                        calls.push(c);
                        rest = &body[e + CALL_END.len()..];
                    }
                    None if done => return Parsed::content_only(text),
                    None => {
                        // Malformed (e.g. its arguments are not JSON): keep it as streamed.
                        calls.extend(read_call(&body[..e], false));
                        break;
                    }
                },
                None => {
                    // While streaming, a tail that may begin the call's end token is held
                    // back (at the end an unclosed call is not a call).
                    match read_call(settled(body, CALL_END, done), false) {
                        Some(c) if !done => calls.push(c),
                        _ => return Parsed::content_only(text),
                    }
                    break;
                }
            }
        }
        calls.retain(|c| c.name.is_some() || !done);
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

    /// DeepSeek-V3-0324 asked for the weather in two cities (its template's call format).
    const TWO_CALLS: &str = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"location\": \"Tokyo\", \"unit\": \"celsius\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"location\": \"Paris\", \"unit\": \"celsius\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";

    #[test]
    fn two_calls() {
        let p = DeepSeekV3.parse(TWO_CALLS, true);
        assert_eq!(p.content, "");
        assert_eq!(
            calls(&p),
            vec![
                (
                    "get_weather".to_string(),
                    r#"{"location": "Tokyo", "unit": "celsius"}"#.to_string()
                ),
                (
                    "get_weather".to_string(),
                    r#"{"location": "Paris", "unit": "celsius"}"#.to_string()
                ),
            ]
        );
        assert_streams_consistently(&DeepSeekV3, TWO_CALLS);
    }

    #[test]
    fn content_before_and_pretty_printed_arguments() {
        let out = "Let me search for that.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>web_search\n```json\n{\n  \"query\": \"rust ```fences```\",\n  \"top_k\": 5\n}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
        let p = DeepSeekV3.parse(out, true);
        assert_eq!(p.content, "Let me search for that.");
        assert_eq!(
            calls(&p),
            vec![(
                "web_search".to_string(),
                "{\n  \"query\": \"rust ```fences```\",\n  \"top_k\": 5\n}".to_string()
            )]
        );
        assert_streams_consistently(&DeepSeekV3, out);
    }

    #[test]
    fn plain_answers_stay_content() {
        for out in ["Tokyo is 9 hours ahead of UTC.", "<｜tool", ""] {
            assert_eq!(DeepSeekV3.parse(out, true), Parsed::content_only(out));
            assert_streams_consistently(&DeepSeekV3, out);
        }
    }

    #[test]
    fn malformed_calls_make_everything_content() {
        for out in [
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\": \n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n{}<｜tool▁call▁end｜>",
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{}",
            "<｜tool▁calls▁begin｜>garbage",
        ] {
            assert_eq!(DeepSeekV3.parse(out, true), Parsed::content_only(out), "{out}");
            // While streaming, a block that goes wrong never takes back a call already
            // shown (the tool_output fuzzer's find): only the end falls back.
            let mut last = Parsed::default();
            for c in (1..out.len()).filter(|&c| out.is_char_boundary(c)) {
                let snap = DeepSeekV3.parse(&out[..c], false);
                super::super::assert_extends(&last, &snap, &out[..c]);
                last = snap;
            }
        }
    }
}
