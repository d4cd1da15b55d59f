//! OpenAI-compatible request bodies and what a streamed chunk says.

use serde_json::{json, Map, Value};

use super::dataset::{Content, RequestSpec, Role};

/// What every request body shares.
#[derive(Debug, Clone)]
pub struct PayloadOptions {
    pub model: String,
    /// Chat API (`messages`) instead of completions (`prompt`).
    pub chat: bool,
    /// Send completions prompts as text even when they are token ids.
    pub text_prompts: bool,
    pub temperature: f64,
    pub ignore_eos: bool,
    /// A `response_format` sent with every request (structured outputs).
    pub response_format: Option<Value>,
}

/// The `response_format` constraining output to `schema` (JSON text, or `@PATH`).
pub fn json_schema_format(schema: &str) -> anyhow::Result<Value> {
    let text = match schema.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("--json-schema: cannot read {path}: {e}"))?,
        None => schema.to_string(),
    };
    let schema: Value = serde_json::from_str(&text)
        .map_err(|e| anyhow::anyhow!("--json-schema is not JSON: {e}"))?;
    Ok(json!({"type": "json_schema", "json_schema": {"name": "bench", "schema": schema}}))
}

fn role_name(r: Role) -> &'static str {
    match r {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
    }
}

/// The JSON body of one streamed request.
pub fn request_body(spec: &RequestSpec, o: &PayloadOptions) -> Value {
    let mut body = Map::new();
    body.insert("model".into(), json!(o.model));
    if o.chat {
        body.insert("messages".into(), Value::Array(messages(spec)));
    } else {
        body.insert("prompt".into(), prompt(spec, o.text_prompts));
    }
    // `max_tokens` is understood by both APIs on every server we compare.
    body.insert("max_tokens".into(), json!(spec.output_len));
    body.insert("temperature".into(), json!(o.temperature));
    body.insert("stream".into(), json!(true));
    body.insert("stream_options".into(), json!({"include_usage": true}));
    if o.ignore_eos {
        body.insert("ignore_eos".into(), json!(true));
    }
    if let Some(f) = &o.response_format {
        body.insert("response_format".into(), f.clone());
    }
    Value::Object(body)
}

/// A completions prompt: token ids when every segment is ids, else text.
fn prompt(spec: &RequestSpec, text: bool) -> Value {
    let all_ids = spec
        .segments
        .iter()
        .all(|s| matches!(s.content, Content::Ids(_)));
    if all_ids && !text {
        let ids: Vec<u32> = spec
            .segments
            .iter()
            .flat_map(|s| match &s.content {
                Content::Ids(v) => v.clone(),
                Content::Text(_) => Vec::new(),
            })
            .collect();
        return json!(ids);
    }
    let parts: Vec<String> = spec
        .segments
        .iter()
        .map(|s| s.content.to_text())
        .filter(|t| !t.is_empty())
        .collect();
    json!(parts.join("\n"))
}

/// Chat messages: consecutive segments of one role become one message.
fn messages(spec: &RequestSpec) -> Vec<Value> {
    let mut out: Vec<(Role, String)> = Vec::new();
    for s in &spec.segments {
        let text = s.content.to_text();
        if text.is_empty() {
            continue;
        }
        match out.last_mut() {
            Some((role, acc)) if *role == s.role => {
                acc.push('\n');
                acc.push_str(&text);
            }
            _ => out.push((s.role, text)),
        }
    }
    out.into_iter()
        .map(|(r, t)| json!({"role": role_name(r), "content": t}))
        .collect()
}

/// What one streamed chunk carries.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChunkInfo {
    /// New generated text (completions `text`, chat `delta.content`), possibly empty.
    pub text: String,
    /// `usage`: (prompt tokens, completion tokens), when the server sent it.
    pub usage: Option<(usize, usize)>,
    /// An error the server reported inside the stream.
    pub error: Option<String>,
}

/// Reads one chunk's JSON; a chunk that is not JSON is an error.
pub fn parse_chunk(data: &str) -> Result<ChunkInfo, String> {
    let v: Value = serde_json::from_str(data).map_err(|e| format!("bad chunk ({e}): {data}"))?;
    let mut info = ChunkInfo::default();
    if let Some(e) = v.get("error") {
        let msg = e
            .get("message")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| e.to_string());
        info.error = Some(msg);
    }
    if let Some(choice) = v.get("choices").and_then(|c| c.get(0)) {
        let text = choice
            .get("text")
            .or_else(|| choice.get("delta").and_then(|d| d.get("content")))
            .and_then(Value::as_str);
        info.text = text.unwrap_or_default().to_string();
    }
    if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
        let n = |k: &str| u.get(k).and_then(Value::as_u64).map(|x| x as usize);
        if let Some(c) = n("completion_tokens") {
            info.usage = Some((n("prompt_tokens").unwrap_or(0), c));
        }
    }
    Ok(info)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench_client::dataset::Segment;

    fn spec(segments: Vec<(Role, Content)>) -> RequestSpec {
        RequestSpec {
            segments: segments
                .into_iter()
                .map(|(role, content)| Segment { role, content })
                .collect(),
            input_len: 0,
            output_len: 7,
        }
    }

    fn opts(chat: bool) -> PayloadOptions {
        PayloadOptions {
            model: "m".into(),
            chat,
            text_prompts: false,
            temperature: 0.0,
            ignore_eos: true,
            response_format: Some(json_schema_format(r#"{"type": "integer"}"#).unwrap()),
        }
    }

    #[test]
    fn completions_send_token_ids() {
        let s = spec(vec![
            (Role::System, Content::Ids(vec![5, 6])),
            (Role::User, Content::Ids(vec![7])),
        ]);
        let b = request_body(&s, &opts(false));
        assert_eq!(b["prompt"], json!([5, 6, 7]));
        assert_eq!(b["max_tokens"], json!(7));
        assert_eq!(b["stream"], json!(true));
        assert_eq!(b["stream_options"]["include_usage"], json!(true));
        assert_eq!(b["ignore_eos"], json!(true));
        assert_eq!(
            b["response_format"]["json_schema"]["schema"],
            json!({"type": "integer"})
        );
        assert_eq!(b["model"], json!("m"));
    }

    #[test]
    fn text_segments_make_a_text_prompt() {
        let s = spec(vec![
            (Role::System, Content::Ids(vec![0, 1])),
            (Role::User, Content::Text("hi".into())),
        ]);
        let b = request_body(&s, &opts(false));
        assert_eq!(b["prompt"], json!("the of\nhi"));
    }

    #[test]
    fn chat_merges_roles() {
        let s = spec(vec![
            (Role::System, Content::Ids(vec![])),
            (Role::System, Content::Ids(vec![2])),
            (Role::System, Content::Ids(vec![3])),
            (Role::User, Content::Text("q".into())),
            (Role::Assistant, Content::Text("a".into())),
        ]);
        let b = request_body(&s, &opts(true));
        assert_eq!(
            b["messages"],
            json!([
                {"role": "system", "content": "and\nto"},
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "a"},
            ])
        );
        assert!(b.get("prompt").is_none());
    }

    #[test]
    fn chunks() {
        let c = parse_chunk(r#"{"choices":[{"index":0,"text":"ab","finish_reason":null}]}"#);
        assert_eq!(c.unwrap().text, "ab");
        let c = parse_chunk(r#"{"choices":[{"delta":{"content":"x"}}],"usage":null}"#).unwrap();
        assert_eq!((c.text.as_str(), c.usage), ("x", None));
        let c = parse_chunk(r#"{"choices":[{"delta":{"role":"assistant"}}]}"#).unwrap();
        assert_eq!(c.text, "");
        let c = parse_chunk(
            r#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":9,"total_tokens":12}}"#,
        )
        .unwrap();
        assert_eq!(c.usage, Some((3, 9)));
        let c = parse_chunk(r#"{"error":{"message":"boom","code":500}}"#).unwrap();
        assert_eq!(c.error.as_deref(), Some("boom"));
        assert!(parse_chunk("nope").is_err());
    }
}
