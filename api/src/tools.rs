//! `tools` and `tool_choice` of a chat request, checked at the edge as vLLM checks them,
//! and what they make of the request: the tools the chat template sees, the JSON-schema
//! constraint of a forced choice, and how the output is read.
//!
//! | `tool_choice` | output | read by |
//! |---|---|---|
//! | `"none"` | free text (tools still rendered in the prompt, as vLLM does by default) | nothing |
//! | `"auto"` (default with tools) | free text | the model's `--tool-call-parser`; needs `--enable-auto-tool-choice` |
//! | `{"type": "function", "function": {"name": f}}` | JSON valid against `f`'s `parameters` | [`forced::Named`] |
//! | `"required"` | a non-empty JSON array of `{"name", "parameters"}`, one schema per tool | [`forced::Required`] |

use std::sync::Arc;

use dcpserve_actors::OutputConstraint;
use serde_json::{json, Value};

use crate::errors::ApiError;
use crate::reasoning::ReasoningParser;
use crate::tool_parsers::{forced, ToolCallParser, ToolParserKind};

/// A served model's tool and reasoning settings (`--tool-call-parser`,
/// `--enable-auto-tool-choice`, `--reasoning-parser`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChatSettings {
    pub tool_call_parser: Option<ToolParserKind>,
    pub enable_auto_tool_choice: bool,
    pub reasoning_parser: Option<ReasoningParser>,
}

impl ChatSettings {
    /// Settings from parser names (`None`: off), or a message naming an unknown parser.
    pub fn from_names(
        tool_call_parser: Option<&str>,
        enable_auto_tool_choice: bool,
        reasoning_parser: Option<&str>,
    ) -> Result<Self, String> {
        let settings = ChatSettings {
            tool_call_parser: tool_call_parser
                .map(ToolParserKind::from_name)
                .transpose()?,
            enable_auto_tool_choice,
            reasoning_parser: reasoning_parser
                .map(ReasoningParser::from_name)
                .transpose()?,
        };
        if enable_auto_tool_choice && settings.tool_call_parser.is_none() {
            return Err("--enable-auto-tool-choice needs --tool-call-parser.".into());
        }
        Ok(settings)
    }
}

/// A request's `tool_choice`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    None,
    Auto,
    Required,
    Named(String),
}

/// What `tools` / `tool_choice` make of a request.
#[derive(Clone, Default)]
pub struct ToolPlan {
    /// The tools for the chat template's `tools` variable.
    pub template_tools: Option<Value>,
    /// The constraint of a forced choice.
    pub constraint: Option<OutputConstraint>,
    /// How the output is read for tool calls (`None`: not at all).
    pub parser: Option<Arc<dyn ToolCallParser>>,
    /// The output is a forced call (no reasoning is read then: it is JSON from the start).
    pub forced: bool,
}

fn bad_tools(msg: impl Into<String>) -> ApiError {
    ApiError::invalid_param("tools", msg)
}

fn bad_choice(msg: impl Into<String>) -> ApiError {
    ApiError::invalid_param("tool_choice", msg)
}

/// A checked function definition: name and parameter schema.
struct Function {
    name: String,
    parameters: Value,
}

/// Checks `tools`: a non-empty list of `{"type": "function", "function": {"name", ...}}`.
fn parse_tools(v: &Value) -> Result<Vec<Function>, ApiError> {
    let list = match v {
        Value::Array(a) if a.is_empty() => {
            return Err(bad_tools(
                "`tools` must not be empty; leave it out for no tools.",
            ))
        }
        Value::Array(a) => a,
        _ => return Err(bad_tools("`tools` must be a list of tools.")),
    };
    if list.len() > crate::limits::MAX_TOOLS {
        return Err(bad_tools(format!(
            "`tools` has {} tools; at most {} are accepted.",
            list.len(),
            crate::limits::MAX_TOOLS
        )));
    }
    let mut out = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        if !t.is_object() {
            return Err(bad_tools(format!("tools[{i}] must be an object.")));
        }
        match t.get("type") {
            None => {}
            Some(Value::String(s)) if s == "function" => {}
            Some(other) => {
                return Err(bad_tools(format!(
                    "tools[{i}].type must be \"function\", got {other}."
                )))
            }
        }
        let f = t
            .get("function")
            .filter(|f| f.is_object())
            .ok_or_else(|| bad_tools(format!("tools[{i}].function must be an object.")))?;
        let name = match f.get("name") {
            Some(Value::String(n)) if !n.is_empty() => n.clone(),
            _ => {
                return Err(bad_tools(format!(
                    "tools[{i}].function.name must be a non-empty string."
                )))
            }
        };
        if !matches!(
            f.get("description"),
            None | Some(Value::Null | Value::String(_))
        ) {
            return Err(bad_tools(format!(
                "tools[{i}].function.description must be a string."
            )));
        }
        let parameters = match f.get("parameters") {
            None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
            Some(p @ Value::Object(_)) => p.clone(),
            Some(_) => {
                return Err(bad_tools(format!(
                    "tools[{i}].function.parameters must be a JSON schema object."
                )))
            }
        };
        out.push(Function { name, parameters });
    }
    Ok(out)
}

/// Checks `tool_choice` (`None`: the request left it out).
fn parse_choice(v: Option<&Value>, have_tools: bool) -> Result<ToolChoice, ApiError> {
    let choice = match v {
        None | Some(Value::Null) => {
            return Ok(if have_tools {
                ToolChoice::Auto
            } else {
                ToolChoice::None
            })
        }
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            _ => {
                return Err(bad_choice(format!(
                    "`tool_choice` must be \"none\", \"auto\", \"required\" or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got \"{s}\"."
                )))
            }
        },
        Some(Value::Object(o)) => {
            if o.get("type").and_then(Value::as_str) != Some("function") {
                return Err(bad_choice(
                    "A named `tool_choice` must have \"type\": \"function\".",
                ));
            }
            match o.get("function").and_then(|f| f.get("name")) {
                Some(Value::String(n)) if !n.is_empty() => ToolChoice::Named(n.clone()),
                _ => {
                    return Err(bad_choice(
                        "A named `tool_choice` must name the function: {\"type\": \"function\", \"function\": {\"name\": ...}}.",
                    ))
                }
            }
        }
        Some(_) => {
            return Err(bad_choice(
                "`tool_choice` must be a string or a named function object.",
            ))
        }
    };
    if !have_tools && choice != ToolChoice::None {
        return Err(bad_choice("When using `tool_choice`, `tools` must be set."));
    }
    Ok(choice)
}

/// The schema `tool_choice: "required"` generates under (vLLM's): a non-empty array of
/// calls, each `{"name": one of the tools, "parameters": that tool's schema}`.
pub fn required_schema(functions: &[(&str, &Value)]) -> Value {
    let any_of: Vec<Value> = functions
        .iter()
        .map(|(name, parameters)| {
            json!({
                "type": "object",
                "properties": {
                    "name": {"type": "string", "enum": [name]},
                    "parameters": parameters,
                },
                "required": ["name", "parameters"],
                "additionalProperties": false,
            })
        })
        .collect();
    json!({"type": "array", "minItems": 1, "items": {"anyOf": any_of}})
}

/// Checks `tools` and `tool_choice` against the model's settings. The constraint of a
/// forced choice is compiled by the caller (with the model's grammar engine).
pub fn plan(
    tools: Option<&Value>,
    tool_choice: Option<&Value>,
    settings: &ChatSettings,
) -> Result<ToolPlan, ApiError> {
    let functions = match tools {
        None | Some(Value::Null) => Vec::new(),
        Some(v) => parse_tools(v)?,
    };
    let choice = parse_choice(tool_choice, !functions.is_empty())?;
    let mut out = ToolPlan {
        template_tools: tools.filter(|t| !t.is_null()).cloned(),
        ..Default::default()
    };
    match choice {
        ToolChoice::None => {}
        ToolChoice::Auto => match settings.tool_call_parser {
            Some(kind) if settings.enable_auto_tool_choice => {
                out.parser = Some(Arc::from(kind.parser()));
            }
            _ => {
                return Err(bad_choice(
                    "\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set",
                ))
            }
        },
        ToolChoice::Named(name) => {
            let f = functions.iter().find(|f| f.name == name).ok_or_else(|| {
                bad_choice(format!(
                    "The function `{name}` named in `tool_choice` is not in `tools`."
                ))
            })?;
            out.constraint = Some(OutputConstraint::JsonSchema(f.parameters.to_string()));
            out.parser = Some(Arc::new(forced::Named { name }));
            out.forced = true;
        }
        ToolChoice::Required => {
            let pairs: Vec<(&str, &Value)> = functions
                .iter()
                .map(|f| (f.name.as_str(), &f.parameters))
                .collect();
            out.constraint = Some(OutputConstraint::JsonSchema(
                required_schema(&pairs).to_string(),
            ));
            out.parser = Some(Arc::new(forced::Required));
            out.forced = true;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Value {
        json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])
    }

    fn auto() -> ChatSettings {
        ChatSettings::from_names(Some("hermes"), true, None).unwrap()
    }

    #[test]
    fn too_many_tools_is_a_400() {
        let max = crate::limits::MAX_TOOLS;
        let tool = |i: usize| json!({"type": "function", "function": {"name": format!("f{i}")}});
        let many: Vec<Value> = (0..=max).map(tool).collect();
        let Err(e) = parse_tools(&Value::Array(many)) else {
            panic!("{} tools accepted", max + 1)
        };
        assert_eq!(
            (e.status.as_u16(), e.param.as_deref()),
            (400, Some("tools"))
        );
        assert!(e.message.contains(&max.to_string()), "{}", e.message);
        let ok: Vec<Value> = (0..max).map(tool).collect();
        assert_eq!(parse_tools(&Value::Array(ok)).unwrap().len(), max);
    }

    #[test]
    fn choices() {
        let t = weather();
        let p = plan(Some(&t), None, &auto()).unwrap();
        assert!(p.parser.is_some() && p.constraint.is_none() && !p.forced);
        let p = plan(Some(&t), Some(&json!("none")), &ChatSettings::default()).unwrap();
        assert!(p.parser.is_none() && p.template_tools.is_some());
        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        let p = plan(Some(&t), Some(&named), &ChatSettings::default()).unwrap();
        let Some(OutputConstraint::JsonSchema(s)) = p.constraint else {
            panic!("a schema")
        };
        assert_eq!(
            serde_json::from_str::<Value>(&s).unwrap(),
            t[0]["function"]["parameters"]
        );
        let p = plan(Some(&t), Some(&json!("required")), &ChatSettings::default()).unwrap();
        let Some(OutputConstraint::JsonSchema(s)) = p.constraint else {
            panic!("a schema")
        };
        let s: Value = serde_json::from_str(&s).unwrap();
        assert_eq!(s["minItems"], 1);
        assert_eq!(
            s["items"]["anyOf"][0]["properties"]["name"]["enum"][0],
            "get_weather"
        );
        assert!(plan(None, None, &ChatSettings::default())
            .unwrap()
            .parser
            .is_none());
    }

    #[test]
    fn bad_requests_name_the_field() {
        let t = weather();
        let cases = [
            (
                Some(t.clone()),
                Some(json!("auto")),
                "tool_choice",
                "--enable-auto-tool-choice",
            ),
            (
                Some(t.clone()),
                None,
                "tool_choice",
                "--enable-auto-tool-choice",
            ),
            (
                None,
                Some(json!("required")),
                "tool_choice",
                "`tools` must be set",
            ),
            (
                Some(t.clone()),
                Some(json!("sometimes")),
                "tool_choice",
                "must be",
            ),
            (
                Some(t.clone()),
                Some(json!({"type": "function", "function": {"name": "nope"}})),
                "tool_choice",
                "`nope`",
            ),
            (
                Some(t.clone()),
                Some(json!({"function": {"name": "get_weather"}})),
                "tool_choice",
                "type",
            ),
            (Some(json!({"a": 1})), None, "tools", "list"),
            (Some(json!([])), None, "tools", "empty"),
            (
                Some(json!([{"type": "function"}])),
                None,
                "tools",
                "function",
            ),
            (
                Some(json!([{"function": {"name": ""}}])),
                None,
                "tools",
                "name",
            ),
            (
                Some(json!([{"function": {"name": "f", "parameters": "x"}}])),
                None,
                "tools",
                "parameters",
            ),
            (
                Some(json!([{"type": "retrieval", "function": {"name": "f"}}])),
                None,
                "tools",
                "type",
            ),
        ];
        for (tools, choice, param, needle) in cases {
            let e = plan(tools.as_ref(), choice.as_ref(), &ChatSettings::default())
                .err()
                .unwrap_or_else(|| panic!("{tools:?} {choice:?} should fail"));
            assert_eq!(e.status, 400);
            assert_eq!(e.param.as_deref(), Some(param), "{}", e.message);
            assert!(e.message.contains(needle), "{}", e.message);
        }
    }

    #[test]
    fn settings() {
        assert!(ChatSettings::from_names(None, true, None).is_err());
        assert!(ChatSettings::from_names(Some("bogus"), false, None).is_err());
        assert!(ChatSettings::from_names(None, false, Some("deepseek_r1")).is_ok());
    }
}
