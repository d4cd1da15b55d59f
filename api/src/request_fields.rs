//! The fields each request body may carry, so that a field the server would not honour
//! is refused (400 naming it) instead of silently ignored.
//!
//! OpenAI's own API refuses unknown arguments; vLLM ignores them with a warning. Ignoring
//! is the worse choice for a field that changes the answer (`logit_bias`, `best_of`,
//! `suffix`, `parallel_tool_calls`, …): the client would get an answer to a different
//! question without knowing. Only fields that change no output by definition are accepted
//! without being read ([`INERT_FIELDS`]).

use serde_json::Value;

use crate::errors::ApiError;

/// Accepted and without effect: OpenAI's `user` is an end-user id for abuse monitoring.
pub const INERT_FIELDS: &[&str] = &["user"];

/// The sampling and structured-output fields both generation endpoints read
/// (`types::SamplingFields`, `structured::ConstraintFields`).
const SAMPLING: &[&str] = &[
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "n",
    "stop",
    "stop_token_ids",
    "seed",
    "stream",
    "stream_options",
    "ignore_eos",
    "min_tokens",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "response_format",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "structured_outputs",
];

/// A request body type and the top-level fields it reads.
pub trait KnownFields {
    /// The fields read besides [`KnownFields::SAMPLING`]'s.
    const OWN: &'static [&'static str];
    /// Whether the sampling fields are read too.
    const SAMPLING: bool;

    /// Whether `field` is read (or inert).
    fn knows(field: &str) -> bool {
        Self::OWN.contains(&field)
            || (Self::SAMPLING && SAMPLING.contains(&field))
            || INERT_FIELDS.contains(&field)
    }
}

impl KnownFields for crate::types::CompletionRequest {
    const OWN: &'static [&'static str] = &[
        "model",
        "prompt",
        "max_tokens",
        "logprobs",
        "echo",
        "return_tokens_as_token_ids",
    ];
    const SAMPLING: bool = true;
}

impl KnownFields for crate::types::ChatCompletionRequest {
    const OWN: &'static [&'static str] = &[
        "model",
        "messages",
        "max_tokens",
        "max_completion_tokens",
        "logprobs",
        "top_logprobs",
        "return_tokens_as_token_ids",
        "tools",
        "tool_choice",
    ];
    const SAMPLING: bool = true;
}

impl KnownFields for crate::types::TokenizeRequest {
    const OWN: &'static [&'static str] = &[
        "model",
        "prompt",
        "messages",
        "tools",
        "add_special_tokens",
        "return_token_strs",
    ];
    const SAMPLING: bool = false;
}

impl KnownFields for crate::types::DetokenizeRequest {
    const OWN: &'static [&'static str] = &["model", "tokens"];
    const SAMPLING: bool = false;
}

/// 400 for the first field of `body` (a JSON object) that `T` does not read; a body that
/// is not an object passes (serde then explains what it expected).
///
/// ```
/// use dcpserve_api::request_fields::reject_unknown;
/// use dcpserve_api::types::CompletionRequest;
/// let ok = serde_json::json!({"prompt": "a", "user": "u-1"});
/// assert!(reject_unknown::<CompletionRequest>(&ok).is_ok());
/// let e = reject_unknown::<CompletionRequest>(&serde_json::json!({"best_of": 2})).unwrap_err();
/// assert_eq!(e.param.as_deref(), Some("best_of"));
/// ```
pub fn reject_unknown<T: KnownFields>(body: &Value) -> Result<(), ApiError> {
    let Some(map) = body.as_object() else {
        return Ok(());
    };
    // Sorted, so the same body always names the same field.
    let mut unknown: Vec<&String> = map.keys().filter(|k| !T::knows(k)).collect();
    unknown.sort();
    match unknown.first() {
        None => Ok(()),
        Some(field) => {
            // A hostile body may use a megabyte-long key: name at most 64 characters of it.
            let name: String = field.chars().take(64).collect();
            Err(ApiError::invalid_param(
                &name,
                format!(
                    "Unsupported field `{name}`: this server does not implement it, and does \
                     not ignore it silently (the answer would not be what was asked for)."
                ),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{
        ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest,
    };
    use serde::de::DeserializeOwned;

    /// Fields whose type is raw JSON (any value deserializes): checked through the
    /// parsed struct instead of a type error.
    const RAW: &[&str] = &[
        "prompt",
        "messages",
        "tools",
        "tool_choice",
        "stop",
        "response_format",
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
        "structured_outputs",
    ];

    /// Every listed field is really read by the type: a value of the wrong type in it
    /// makes serde fail (a field serde skipped would deserialize fine).
    fn every_listed_field_is_read<T: KnownFields + DeserializeOwned>() {
        let fields = T::OWN
            .iter()
            .chain(if T::SAMPLING { SAMPLING } else { &[] });
        for f in fields {
            if RAW.contains(f) {
                continue;
            }
            // An object is the wrong type for a scalar, string or list; a string is
            // the wrong type for a nested object.
            let refused = |probe: Value| serde_json::from_value::<T>(probe).is_err();
            assert!(
                refused(serde_json::json!({ *f: {"probe": [1, 2]} }))
                    || refused(serde_json::json!({ *f: "probe" })),
                "`{f}` is listed but the type does not read it"
            );
        }
    }

    #[test]
    fn the_lists_match_the_types() {
        every_listed_field_is_read::<CompletionRequest>();
        every_listed_field_is_read::<ChatCompletionRequest>();
        every_listed_field_is_read::<TokenizeRequest>();
        every_listed_field_is_read::<DetokenizeRequest>();
        // The raw ones, through the parsed values.
        let probe = serde_json::json!({"prompt": 1, "stop": 2, "response_format": 3,
            "guided_json": 4, "guided_regex": 5, "guided_choice": 6, "guided_grammar": 7,
            "structured_outputs": 8});
        let c: CompletionRequest = serde_json::from_value(probe).unwrap();
        let k = &c.sampling.constraint;
        assert!(c.prompt.is_some() && c.sampling.stop.is_some());
        assert!(k.response_format.is_some() && k.guided_json.is_some());
        assert!(k.guided_regex.is_some() && k.guided_choice.is_some());
        assert!(k.guided_grammar.is_some() && k.structured_outputs.is_some());
        let probe = serde_json::json!({"messages": 1, "tools": 2, "tool_choice": 3});
        let c: ChatCompletionRequest = serde_json::from_value(probe).unwrap();
        assert!(c.messages.is_some() && c.tools.is_some() && c.tool_choice.is_some());
    }

    #[test]
    fn fields_that_would_change_the_answer_are_refused_by_name() {
        for f in [
            "best_of",
            "logit_bias",
            "suffix",
            "parallel_tool_calls",
            "functions",
            "foo",
        ] {
            let body = serde_json::json!({"messages": [], f: 1});
            let e = reject_unknown::<ChatCompletionRequest>(&body).unwrap_err();
            assert_eq!(e.status, 400);
            assert_eq!(e.param.as_deref(), Some(f));
            assert!(e.message.contains(&format!("`{f}`")), "{}", e.message);
        }
        let e = reject_unknown::<CompletionRequest>(&serde_json::json!({"z": 1, "a_x": 2}))
            .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("a_x"), "the first in sorted order");
        assert!(reject_unknown::<CompletionRequest>(&serde_json::json!({"user": "u"})).is_ok());
        assert!(reject_unknown::<CompletionRequest>(&serde_json::json!([1])).is_ok());
        // The generation fields are not tokenize's.
        let e = reject_unknown::<TokenizeRequest>(&serde_json::json!({"temperature": 0}));
        assert!(e.is_err());
    }
}
