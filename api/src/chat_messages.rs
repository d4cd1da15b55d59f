//! Chat `messages` checked and put in the shape Hugging Face chat templates read: text
//! content, assistant `tool_calls` with their arguments as JSON objects (as transformers
//! and vLLM pass them), `tool_call_id` and `name` of tool results.

use serde_json::{json, Map, Value};

use crate::errors::ApiError;

fn bad(m: String) -> ApiError {
    ApiError::invalid_param("messages", m)
}

/// Text of a `content`: a string, a list of text parts, or null (empty).
fn content_text(i: usize, v: Option<&Value>) -> Result<String, ApiError> {
    Ok(match v {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for part in parts {
                match (part.get("type").and_then(Value::as_str), part.get("text")) {
                    (Some("text"), Some(Value::String(t))) => text.push_str(t),
                    _ => {
                        return Err(bad(format!(
                            "messages[{i}].content: only text parts are supported."
                        )))
                    }
                }
            }
            text
        }
        Some(_) => {
            return Err(bad(format!(
                "messages[{i}].content must be a string or a list of text parts."
            )))
        }
    })
}

/// An assistant message's `tool_calls`, with `arguments` parsed from their JSON text.
fn tool_calls(i: usize, v: &Value) -> Result<Value, ApiError> {
    let list = v
        .as_array()
        .ok_or_else(|| bad(format!("messages[{i}].tool_calls must be a list.")))?;
    let mut out = Vec::with_capacity(list.len());
    for (j, c) in list.iter().enumerate() {
        let at = format!("messages[{i}].tool_calls[{j}]");
        let f = c
            .get("function")
            .filter(|f| f.is_object())
            .ok_or_else(|| bad(format!("{at}.function must be an object.")))?;
        let name = f
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| bad(format!("{at}.function.name must be a string.")))?;
        let arguments = match f.get("arguments") {
            None | Some(Value::Null) => json!({}),
            Some(Value::String(s)) => serde_json::from_str(s)
                .map_err(|e| bad(format!("{at}.function.arguments is not valid JSON: {e}.")))?,
            Some(obj @ Value::Object(_)) => obj.clone(),
            Some(_) => {
                return Err(bad(format!(
                    "{at}.function.arguments must be a JSON string."
                )))
            }
        };
        let mut call = Map::new();
        if let Some(id) = c.get("id").and_then(Value::as_str) {
            call.insert("id".into(), id.into());
        }
        call.insert("type".into(), "function".into());
        call.insert(
            "function".into(),
            json!({"name": name, "arguments": arguments}),
        );
        out.push(Value::Object(call));
    }
    Ok(Value::Array(out))
}

/// `messages` for the chat template: a non-empty list of `{role, content}`, assistant
/// messages possibly with `tool_calls`, tool messages with `tool_call_id`.
pub fn template_messages(v: Option<&Value>) -> Result<Vec<Value>, ApiError> {
    let list = match v {
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(Value::Array(_)) => return Err(bad("`messages` must not be empty.".into())),
        None | Some(Value::Null) => return Err(bad("`messages` is required.".into())),
        Some(_) => return Err(bad("`messages` must be a list of messages.".into())),
    };
    if list.len() > crate::limits::MAX_MESSAGES {
        return Err(bad(format!(
            "`messages` has {} messages; at most {} are accepted.",
            list.len(),
            crate::limits::MAX_MESSAGES
        )));
    }
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let role = m
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| bad(format!("messages[{i}].role must be a string.")))?;
        let mut msg = Map::new();
        msg.insert("role".into(), role.into());
        // Null content becomes "" (templates concatenate it), also beside tool calls.
        msg.insert("content".into(), content_text(i, m.get("content"))?.into());
        match m.get("tool_calls") {
            None | Some(Value::Null) => {}
            Some(calls) if role == "assistant" => {
                msg.insert("tool_calls".into(), tool_calls(i, calls)?);
            }
            Some(_) => {
                return Err(bad(format!(
                    "messages[{i}]: only assistant messages have `tool_calls`."
                )))
            }
        }
        for key in ["tool_call_id", "name"] {
            match m.get(key) {
                None | Some(Value::Null) => {}
                Some(Value::String(s)) => {
                    msg.insert(key.into(), s.clone().into());
                }
                Some(_) => return Err(bad(format!("messages[{i}].{key} must be a string."))),
            }
        }
        out.push(Value::Object(msg));
    }
    Ok(out)
}

/// The chat template's context: `messages`, `tools` when given, and the generation prompt.
pub fn template_context(messages: Vec<Value>, tools: Option<&Value>) -> Value {
    let mut ctx = json!({"messages": messages, "add_generation_prompt": true});
    if let Some(t) = tools {
        ctx["tools"] = t.clone();
    }
    ctx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn too_many_messages_is_a_400() {
        let m = json!({"role": "user", "content": "hi"});
        let max = crate::limits::MAX_MESSAGES;
        let e = template_messages(Some(&json!(vec![m.clone(); max + 1]))).unwrap_err();
        assert_eq!(
            (e.status.as_u16(), e.param.as_deref()),
            (400, Some("messages"))
        );
        assert!(e.message.contains(&max.to_string()), "{}", e.message);
        assert_eq!(
            template_messages(Some(&json!(vec![m; max]))).unwrap().len(),
            max
        );
    }

    #[test]
    fn a_tool_round_trip() {
        let m = template_messages(Some(&json!([
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}
            ]},
            {"role": "tool", "tool_call_id": "call_1", "content": "22 C, sunny"},
        ])))
        .unwrap();
        assert_eq!(m[1]["content"], "");
        assert_eq!(
            m[1]["tool_calls"][0]["function"]["arguments"]["city"],
            "Paris"
        );
        assert_eq!(m[2]["tool_call_id"], "call_1");
        assert_eq!(m[2]["content"], "22 C, sunny");
    }

    #[test]
    fn content_of_every_shape() {
        let m = template_messages(Some(&json!([
            {"role": "system", "content": "s"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": null}
        ])))
        .unwrap();
        assert_eq!(m[0]["content"], "s");
        assert_eq!(m[1]["content"], "ab");
        assert_eq!(m[2]["content"], "");
    }

    #[test]
    fn bad_messages() {
        for bad in [
            json!([]),
            json!([{"content": "x"}]),
            json!([{"role": "user", "content": 5}]),
            json!([{"role": "user", "content": "x", "tool_calls": []}]),
            json!([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}]),
            json!([{"role": "assistant", "tool_calls": [{"type": "function"}]}]),
            json!([{"role": "tool", "tool_call_id": 3, "content": "x"}]),
        ] {
            let e = template_messages(Some(&bad)).unwrap_err();
            assert_eq!(e.status, 400, "{bad}");
            assert_eq!(e.param.as_deref(), Some("messages"));
        }
    }
}
