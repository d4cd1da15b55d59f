//! Structured-output fields of completions and chat completions: OpenAI's
//! `response_format`, vLLM's `guided_json` / `guided_regex` / `guided_choice` /
//! `guided_grammar`, and vLLM's newer `structured_outputs` object. At most one constraint
//! per request; it is compiled here, at the edge, so that a schema or grammar the engine
//! cannot compile is a 400 carrying the engine's message.

use dcpserve_actors::OutputConstraint;
use serde::Deserialize;
use serde_json::Value;

use crate::backend::ModelBackend;
use crate::errors::ApiError;

/// The request fields that constrain the output (all optional; `null` is absent).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ConstraintFields {
    /// `{"type": "text" | "json_object" | "json_schema", "json_schema": {...}}`.
    pub response_format: Option<Value>,
    /// A JSON schema, as an object or as its JSON text.
    pub guided_json: Option<Value>,
    pub guided_regex: Option<Value>,
    pub guided_choice: Option<Value>,
    /// A Lark grammar (llguidance's dialect).
    pub guided_grammar: Option<Value>,
    /// `{"json" | "regex" | "choice" | "grammar" | "json_object": ...}`.
    pub structured_outputs: Option<Value>,
}

/// `structured_outputs` keys that change nothing here: whitespace is never free in our
/// JSON (one space after `,` and `:`), and there is no fallback engine to disable.
const HARMLESS_KEYS: [&str; 2] = ["disable_fallback", "disable_any_whitespace"];

fn bad(param: &str, message: impl Into<String>) -> ApiError {
    ApiError::invalid_param(param, message)
}

fn string(param: &str, v: &Value) -> Result<String, ApiError> {
    v.as_str()
        .map(str::to_string)
        .ok_or_else(|| bad(param, format!("`{param}` must be a string.")))
}

/// A JSON schema given as an object (or boolean) or as its JSON text.
fn schema(param: &str, v: &Value) -> Result<OutputConstraint, ApiError> {
    let text = match v {
        Value::String(s) => s.clone(),
        Value::Object(_) | Value::Bool(_) => v.to_string(),
        _ => {
            return Err(bad(
                param,
                format!("`{param}` must be a JSON schema (an object or its JSON text)."),
            ))
        }
    };
    Ok(OutputConstraint::JsonSchema(text))
}

fn choice(param: &str, v: &Value) -> Result<OutputConstraint, ApiError> {
    let list = v.as_array().filter(|a| !a.is_empty()).ok_or_else(|| {
        bad(
            param,
            format!("`{param}` must be a non-empty list of strings."),
        )
    })?;
    let choices = list
        .iter()
        .map(|c| {
            c.as_str()
                .map(str::to_string)
                .ok_or_else(|| bad(param, format!("`{param}` must be a list of strings.")))
        })
        .collect::<Result<_, _>>()?;
    Ok(OutputConstraint::Choice(choices))
}

fn response_format(v: &Value) -> Result<Option<OutputConstraint>, ApiError> {
    const P: &str = "response_format";
    let kind = v.get("type").and_then(Value::as_str).ok_or_else(|| {
        bad(
            P,
            "`response_format` must be an object with a string `type`.",
        )
    })?;
    match kind {
        "text" => Ok(None),
        "json_object" => Ok(Some(OutputConstraint::JsonObject)),
        "json_schema" => {
            let js = v.get("json_schema").filter(|x| x.is_object()).ok_or_else(|| {
                bad(
                    P,
                    "`response_format.json_schema` is required when `type` is `json_schema`.",
                )
            })?;
            match js.get("schema") {
                None | Some(Value::Null) => Err(bad(
                    P,
                    "`response_format.json_schema.schema` is required.",
                )),
                Some(s) => schema(P, s).map(Some),
            }
        }
        other => Err(bad(
            P,
            format!(
                "`response_format.type` must be `text`, `json_object` or `json_schema`, got `{other}`."
            ),
        )),
    }
}

fn structured_outputs(v: &Value) -> Result<Vec<OutputConstraint>, ApiError> {
    const P: &str = "structured_outputs";
    let obj = v
        .as_object()
        .ok_or_else(|| bad(P, "`structured_outputs` must be an object."))?;
    let mut out = Vec::new();
    for (key, value) in obj {
        if value.is_null() {
            continue;
        }
        let param = format!("{P}.{key}");
        match key.as_str() {
            "json" => out.push(schema(&param, value)?),
            "regex" => out.push(OutputConstraint::Regex(string(&param, value)?)),
            "choice" => out.push(choice(&param, value)?),
            "grammar" => out.push(OutputConstraint::Lark(string(&param, value)?)),
            "json_object" => match value {
                Value::Bool(true) => out.push(OutputConstraint::JsonObject),
                Value::Bool(false) => {}
                _ => return Err(bad(&param, format!("`{param}` must be a boolean."))),
            },
            k if HARMLESS_KEYS.contains(&k) => {}
            _ => {
                return Err(bad(
                    &param,
                    format!("`{param}` is not supported by this server."),
                ))
            }
        }
    }
    Ok(out)
}

/// The request's output constraint, if any: parses the fields (400 for a malformed one,
/// or for more than one constraint) and compiles the constraint with the model's grammar
/// engine (400 with the engine's message when it cannot).
pub fn constraint(
    f: &ConstraintFields,
    backend: &dyn ModelBackend,
) -> Result<Option<OutputConstraint>, ApiError> {
    let present = |v: &Option<Value>| v.as_ref().filter(|x| !x.is_null()).cloned();
    let mut found: Vec<(&str, OutputConstraint)> = Vec::new();
    if let Some(v) = present(&f.response_format) {
        if let Some(c) = response_format(&v)? {
            found.push(("response_format", c));
        }
    }
    if let Some(v) = present(&f.guided_json) {
        found.push(("guided_json", schema("guided_json", &v)?));
    }
    if let Some(v) = present(&f.guided_regex) {
        found.push((
            "guided_regex",
            OutputConstraint::Regex(string("guided_regex", &v)?),
        ));
    }
    if let Some(v) = present(&f.guided_choice) {
        found.push(("guided_choice", choice("guided_choice", &v)?));
    }
    if let Some(v) = present(&f.guided_grammar) {
        found.push((
            "guided_grammar",
            OutputConstraint::Lark(string("guided_grammar", &v)?),
        ));
    }
    if let Some(v) = present(&f.structured_outputs) {
        for c in structured_outputs(&v)? {
            found.push(("structured_outputs", c));
        }
    }
    let (param, c) = match found.len() {
        0 => return Ok(None),
        1 => found.pop().expect("one"),
        _ => {
            let names: Vec<&str> = found.iter().map(|(p, _)| *p).collect();
            return Err(ApiError::bad_request(format!(
                "Only one kind of structured output constraint is allowed per request, got several ({}).",
                names.join(", ")
            )));
        }
    };
    backend.check_constraint(&c).map_err(|e| {
        bad(
            param,
            format!("The {param} constraint cannot be compiled: {e}"),
        )
    })?;
    Ok(Some(c))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fields(v: Value) -> ConstraintFields {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn every_field_shape() {
        let ok = |v: Value| -> Vec<OutputConstraint> {
            let f = fields(v);
            let mut all = Vec::new();
            if let Some(r) = &f.response_format {
                all.extend(response_format(r).unwrap());
            }
            if let Some(s) = &f.structured_outputs {
                all.extend(structured_outputs(s).unwrap());
            }
            all
        };
        assert!(ok(json!({"response_format": {"type": "text"}})).is_empty());
        assert_eq!(
            ok(json!({"response_format": {"type": "json_object"}})),
            vec![OutputConstraint::JsonObject]
        );
        assert_eq!(
            ok(
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer"}}}})
            ),
            vec![OutputConstraint::JsonSchema(r#"{"type":"integer"}"#.into())]
        );
        assert_eq!(
            ok(json!({"structured_outputs": {"choice": ["a", "b"], "disable_fallback": true}})),
            vec![OutputConstraint::Choice(vec!["a".into(), "b".into()])]
        );
        assert_eq!(
            schema("guided_json", &json!("{\"type\": \"string\"}")).unwrap(),
            OutputConstraint::JsonSchema("{\"type\": \"string\"}".into())
        );
        for bad in [
            json!({"type": "json_schema"}),
            json!({"type": "json_schema", "json_schema": {"name": "x"}}),
            json!({"type": "xml"}),
            json!("json"),
        ] {
            assert_eq!(response_format(&bad).unwrap_err().status, 400, "{bad}");
        }
        for bad in [
            json!({"structural_tag": "x"}),
            json!({"regex": 5}),
            json!({"choice": []}),
            json!([1]),
        ] {
            assert_eq!(structured_outputs(&bad).unwrap_err().status, 400, "{bad}");
        }
        assert!(choice("guided_choice", &json!(["a", 1])).is_err());
        assert!(schema("guided_json", &json!(3)).is_err());
    }
}
