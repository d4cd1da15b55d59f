//! Outputs of forced tool choices. The engine generates them under a JSON-schema
//! constraint (built by the `tools` module), so they are JSON by construction:
//!
//! - a named function (`tool_choice: {"type": "function", "function": {"name": "f"}}`): the
//!   output is the arguments object;
//! - `required`: the output is a non-empty array `[{"name": "f", "parameters": {..}}, ..]`.

use super::json_scan::{scan_call, skip_ws};
use super::{Parsed, PartialCall, ToolCallParser};

/// The output of a named function choice: one call of `name`, the output its arguments.
#[derive(Debug, Clone)]
pub struct Named {
    pub name: String,
}

impl ToolCallParser for Named {
    fn parse(&self, text: &str, _done: bool) -> Parsed {
        // Whitespace around the object is not part of the arguments (held while streaming).
        Parsed {
            content: String::new(),
            calls: vec![PartialCall {
                name: Some(self.name.clone()),
                arguments: text.trim().to_string(),
            }],
        }
    }
}

/// The output of `tool_choice: "required"`: an array of calls.
#[derive(Debug, Clone, Copy, Default)]
pub struct Required;

impl ToolCallParser for Required {
    fn parse(&self, text: &str, done: bool) -> Parsed {
        let b = text.as_bytes();
        let mut calls = Vec::new();
        let mut i = skip_ws(b, 0);
        if b.get(i) != Some(&b'[') {
            return Parsed::default();
        }
        i += 1;
        loop {
            i = skip_ws(b, i);
            if matches!(b.get(i), None | Some(b']')) {
                break;
            }
            let scan = scan_call(text, i, &["parameters"]);
            if scan.invalid {
                break;
            }
            let arguments = if scan.name.is_none() {
                String::new()
            } else if done && scan.args.is_some_and(|(_, end)| end.is_none()) {
                // Cut short (max_tokens): what there is (as streamed, trailing space too).
                text[scan.args.unwrap().0..].to_string()
            } else {
                scan.args_prefix(text).to_string()
            };
            calls.push(PartialCall {
                name: scan.name.clone(),
                arguments,
            });
            let Some(end) = scan.end else {
                break;
            };
            i = skip_ws(b, end);
            if b.get(i) != Some(&b',') {
                break;
            }
            i += 1;
        }
        if done {
            calls.retain(|c| c.name.is_some());
        }
        Parsed {
            content: String::new(),
            calls,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_streams_consistently, calls};
    use super::*;

    #[test]
    fn named_output_is_the_arguments() {
        let p = Named { name: "f".into() };
        let out = "{\"city\": \"Paris\", \"days\": 2} \n";
        assert_eq!(
            calls(&p.parse(out, true)),
            vec![("f".into(), r#"{"city": "Paris", "days": 2}"#.into())]
        );
        assert_streams_consistently(&p, out);
    }

    #[test]
    fn required_output_is_a_list_of_calls() {
        let out = r#"[{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "get_time", "parameters": {"tz": "CET", "h24": true}}]"#;
        let p = Required.parse(out, true);
        assert_eq!(
            calls(&p),
            vec![
                ("get_weather".into(), r#"{"city": "Paris"}"#.into()),
                ("get_time".into(), r#"{"tz": "CET", "h24": true}"#.into()),
            ]
        );
        assert_eq!(p.content, "");
        assert_streams_consistently(&Required, out);
        let pretty =
            "[\n  {\n    \"name\": \"f\",\n    \"parameters\": {\n      \"x\": 1\n    }\n  }\n]";
        assert_eq!(
            calls(&Required.parse(pretty, true)),
            vec![("f".into(), "{\n      \"x\": 1\n    }".into())]
        );
        assert_streams_consistently(&Required, pretty);
    }

    #[test]
    fn cut_short() {
        // A cut after a space inside the arguments streams the space; the whole parse too.
        assert_streams_consistently(&Required, r#"[{"name": "f", "parameters": {"a": "#);
        let out = r#"[{"name": "f", "parameters": {"city": "Par"#;
        assert_eq!(
            calls(&Required.parse(out, true)),
            vec![("f".into(), r#"{"city": "Par"#.into())]
        );
        assert!(Required.parse("[{\"na", true).calls.is_empty());
    }
}
