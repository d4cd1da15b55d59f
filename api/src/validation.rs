//! Checks a request's fields and turns them into engine parameters, answering 400 with
//! vLLM's wording (where vLLM has one) for anything out of range. Prompts come out as
//! [`ValidPrompt`]s, and each choice is handed to the backend as a [`ValidRequest`]
//! (see [`crate::generation::ChoiceSpec`]): the engine does not check them again.

use dcpserve_actors::{SamplingParams, ValidPrompt};
use dcpserve_config::SamplingDefaults;
use serde_json::Value;

use crate::backend::ModelBackend;
use crate::errors::ApiError;
use crate::types::SamplingFields;

/// Most alternatives per token a request may ask for (vLLM's default `max_logprobs`).
pub const MAX_LOGPROBS: i64 = 20;

/// The validated fields both endpoints share.
#[derive(Debug, Clone)]
pub struct Common {
    /// Sampling and stopping; `max_tokens` is set per prompt by [`resolve_max_tokens`].
    pub params: SamplingParams,
    /// Choices per prompt.
    pub n: usize,
    /// Stop strings (handled in the HTTP layer: the output is cut before them).
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
}

fn range(name: &str, v: f64, ok: bool, want: &str) -> Result<(), ApiError> {
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid_param(
            name,
            format!("{name} must be {want}, got {v}."),
        ))
    }
}

/// Validates the shared sampling fields and the output constraint (compiled by the
/// backend's grammar engine), filling what the request leaves out from the model's
/// defaults.
pub fn common_with_constraint(
    f: &SamplingFields,
    d: &SamplingDefaults,
    backend: &dyn ModelBackend,
) -> Result<Common, ApiError> {
    let mut c = common(f, d)?;
    c.params.constraint = crate::structured::constraint(&f.constraint, backend)?;
    if c.params.constraint.is_some() && c.params.ignore_eos {
        return Err(ApiError::invalid_param(
            "ignore_eos",
            "`ignore_eos` cannot be combined with a structured output constraint: the output ends when its grammar is complete.",
        ));
    }
    Ok(c)
}

/// Validates the shared sampling fields, filling what the request leaves out from the
/// model's defaults.
pub fn common(f: &SamplingFields, d: &SamplingDefaults) -> Result<Common, ApiError> {
    let mut p = SamplingParams::default();
    let t = f
        .temperature
        .or(d.temperature.map(f64::from))
        .unwrap_or(1.0);
    // Checked as the f32 the sampler gets: a finite f64 above f32::MAX would become +inf.
    range(
        "temperature",
        t,
        t >= 0.0 && (t as f32).is_finite(),
        "non-negative and at most 3.4e38",
    )?;
    let top_p = f.top_p.or(d.top_p.map(f64::from)).unwrap_or(1.0);
    range("top_p", top_p, top_p > 0.0 && top_p <= 1.0, "in (0, 1]")?;
    let top_k = f.top_k.or(d.top_k).unwrap_or(0);
    if top_k < -1 {
        return Err(ApiError::invalid_param(
            "top_k",
            format!("top_k must be -1 (disable), or at least 1, got {top_k}."),
        ));
    }
    let min_p = f.min_p.or(d.min_p.map(f64::from)).unwrap_or(0.0);
    range("min_p", min_p, (0.0..=1.0).contains(&min_p), "in [0, 1]")?;
    let n = f.n.unwrap_or(1);
    if n < 1 {
        return Err(ApiError::invalid_param(
            "n",
            format!("n must be at least 1, got {n}."),
        ));
    }
    if n > 128 {
        return Err(ApiError::invalid_param(
            "n",
            format!("n must be at most 128, got {n}."),
        ));
    }
    let pres = f.presence_penalty.unwrap_or(0.0);
    range(
        "presence_penalty",
        pres,
        (-2.0..=2.0).contains(&pres),
        "in [-2, 2]",
    )?;
    let freq = f.frequency_penalty.unwrap_or(0.0);
    range(
        "frequency_penalty",
        freq,
        (-2.0..=2.0).contains(&freq),
        "in [-2, 2]",
    )?;
    let rep = f.repetition_penalty.unwrap_or(1.0);
    range(
        "repetition_penalty",
        rep,
        (rep as f32) > 0.0 && (rep as f32).is_finite(),
        "greater than zero (as a 32-bit float) and finite",
    )?;
    let min_tokens = f.min_tokens.unwrap_or(0);
    if min_tokens < 0 {
        return Err(ApiError::invalid_param(
            "min_tokens",
            format!("min_tokens must be greater than or equal to 0, got {min_tokens}."),
        ));
    }
    let mut stop_token_ids = Vec::new();
    for &t in f.stop_token_ids.iter().flatten() {
        let id = u32::try_from(t).map_err(|_| {
            ApiError::invalid_param("stop_token_ids", format!("Invalid stop token id {t}."))
        })?;
        stop_token_ids.push(id);
    }
    p.temperature = t as f32;
    p.top_p = top_p as f32;
    p.top_k = top_k.max(0) as usize;
    p.min_p = min_p as f32;
    p.seed = f.seed.map(|s| s as u64);
    p.ignore_eos = f.ignore_eos.unwrap_or(false);
    p.min_tokens = min_tokens as usize;
    p.presence_penalty = pres as f32;
    p.frequency_penalty = freq as f32;
    p.repetition_penalty = rep as f32;
    p.stop_token_ids = stop_token_ids;
    let stream = f.stream.unwrap_or(false);
    let include_usage = f
        .stream_options
        .as_ref()
        .and_then(|o| o.include_usage)
        .unwrap_or(false);
    if f.stream_options.is_some() && !stream {
        return Err(ApiError::invalid_param(
            "stream_options",
            "Stream options can only be defined when `stream=True`.",
        ));
    }
    Ok(Common {
        params: p,
        n: n as usize,
        stop: parse_stop(f.stop.as_ref())?,
        stream,
        include_usage,
    })
}

/// `stop`: a string or a list of strings (empty strings are ignored).
pub fn parse_stop(v: Option<&Value>) -> Result<Vec<String>, ApiError> {
    let bad = || ApiError::invalid_param("stop", "`stop` must be a string or a list of strings.");
    let out = match v {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| x.as_str().map(str::to_string).ok_or_else(bad))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(bad()),
    };
    if out.len() > crate::limits::MAX_STOP_STRINGS {
        return Err(ApiError::invalid_param(
            "stop",
            format!(
                "`stop` has {} strings; at most {} are accepted.",
                out.len(),
                crate::limits::MAX_STOP_STRINGS
            ),
        ));
    }
    Ok(out.into_iter().filter(|s| !s.is_empty()).collect())
}

/// `logprobs` of the completions API / `top_logprobs` of chat: 0..=20.
pub fn check_logprobs(name: &str, k: i64) -> Result<usize, ApiError> {
    if k < 0 {
        return Err(ApiError::invalid_param(
            name,
            format!("`{name}` must be a non-negative value."),
        ));
    }
    if k > MAX_LOGPROBS {
        return Err(ApiError::invalid_param(
            name,
            format!(
                "Requested sample logprobs of {k}, which is greater than max allowed: {MAX_LOGPROBS}"
            ),
        ));
    }
    Ok(k as usize)
}

/// One prompt of a completions request.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    Text(String),
    Tokens(Vec<u32>),
}

/// `prompt`: a string, a list of strings, a list of token ids, or a list of such lists.
pub fn parse_prompt(v: Option<&Value>) -> Result<Vec<PromptInput>, ApiError> {
    let bad = || {
        ApiError::invalid_param(
            "prompt",
            "`prompt` must be a string, a list of strings, a list of token ids, or a list of lists of token ids.",
        )
    };
    let ids = |a: &[Value]| -> Result<Vec<u32>, ApiError> {
        a.iter()
            .map(|x| {
                x.as_u64()
                    .and_then(|t| u32::try_from(t).ok())
                    .ok_or_else(bad)
            })
            .collect()
    };
    let out = match v {
        None | Some(Value::Null) => {
            return Err(ApiError::invalid_param("prompt", "`prompt` is required."))
        }
        Some(Value::String(s)) => vec![PromptInput::Text(s.clone())],
        Some(Value::Array(a)) if a.is_empty() => {
            return Err(ApiError::invalid_param("prompt", "The prompt is empty."))
        }
        Some(Value::Array(a)) if a.len() > crate::limits::MAX_PROMPTS && !a[0].is_number() => {
            return Err(ApiError::invalid_param(
                "prompt",
                format!(
                    "`prompt` lists {} prompts; at most {} are accepted.",
                    a.len(),
                    crate::limits::MAX_PROMPTS
                ),
            ))
        }
        Some(Value::Array(a)) => match &a[0] {
            Value::String(_) => a
                .iter()
                .map(|x| {
                    x.as_str()
                        .map(|s| PromptInput::Text(s.to_string()))
                        .ok_or_else(bad)
                })
                .collect::<Result<_, _>>()?,
            Value::Number(_) => vec![PromptInput::Tokens(ids(a)?)],
            Value::Array(_) => a
                .iter()
                .map(|x| match x {
                    Value::Array(inner) => ids(inner).map(PromptInput::Tokens),
                    _ => Err(bad()),
                })
                .collect::<Result<_, _>>()?,
            _ => return Err(bad()),
        },
        Some(_) => return Err(bad()),
    };
    Ok(out)
}

/// Checks token ids against the vocabulary (not empty, every id below its size).
pub fn valid_prompt(ids: Vec<u32>, backend: &dyn ModelBackend) -> Result<ValidPrompt, ApiError> {
    ValidPrompt::new(ids, backend.vocab_size())
        .map_err(|e| ApiError::invalid_param("prompt", e.to_string()))
}

/// The number of tokens to generate for a prompt of `prompt_len` tokens: the request's
/// value if it fits the context (vLLM's message otherwise), else the model's default, else
/// the rest of the context.
pub fn resolve_max_tokens(
    requested: Option<i64>,
    prompt_len: usize,
    backend: &dyn ModelBackend,
    defaults: &SamplingDefaults,
    min_tokens: usize,
) -> Result<usize, ApiError> {
    let max_len = backend.max_model_len();
    if let Some(m) = requested {
        if m < 1 {
            return Err(ApiError::invalid_param(
                "max_tokens",
                format!("max_tokens must be at least 1, got {m}."),
            ));
        }
    }
    let requested = requested.map(|m| m as u64);
    if requested.is_none() && prompt_len >= max_len {
        return Err(ApiError::bad_request(format!(
            "This model's maximum context length is {max_len} tokens. However, your request has {prompt_len} input tokens. Please reduce the length of the input messages."
        )));
    }
    if let Some(m) = requested {
        let total = prompt_len as u64 + m;
        if total > max_len as u64 {
            return Err(ApiError::bad_request(format!(
                "This model's maximum context length is {max_len} tokens. However, you requested {total} tokens ({prompt_len} in the messages, {m} in the completion). Please reduce the length of the messages or completion."
            )));
        }
    }
    let room = max_len - prompt_len;
    let max_tokens = match requested {
        Some(m) => m as usize,
        None => defaults.max_tokens.map_or(room, |d| d.clamp(1, room)),
    };
    if min_tokens > max_tokens {
        return Err(ApiError::invalid_param(
            "min_tokens",
            format!("min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}."),
        ));
    }
    // A sequence that outgrows the whole KV cache could never be scheduled.
    let cap = backend.kv_capacity_tokens();
    if prompt_len + max_tokens > cap {
        return Err(ApiError::bad_request(format!(
            "The request needs up to {} tokens of KV cache ({prompt_len} in the prompt, {max_tokens} in the completion), but the cache holds {cap} tokens. Please reduce the length of the prompt or completion.",
            prompt_len + max_tokens
        )));
    }
    Ok(max_tokens)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn counts_past_the_stated_limits_are_400s() {
        use crate::limits::{MAX_PROMPTS, MAX_STOP_STRINGS};
        let stops = json!(vec!["x"; MAX_STOP_STRINGS + 1]);
        let e = parse_stop(Some(&stops)).unwrap_err();
        assert_eq!((e.status.as_u16(), e.param.as_deref()), (400, Some("stop")));
        assert!(
            e.message.contains(&MAX_STOP_STRINGS.to_string()),
            "{}",
            e.message
        );
        assert_eq!(
            parse_stop(Some(&json!(vec!["x"; MAX_STOP_STRINGS])))
                .unwrap()
                .len(),
            MAX_STOP_STRINGS
        );

        let e = parse_prompt(Some(&json!(vec!["p"; MAX_PROMPTS + 1]))).unwrap_err();
        assert!(
            e.message.contains(&MAX_PROMPTS.to_string()),
            "{}",
            e.message
        );
        assert_eq!(
            parse_prompt(Some(&json!(vec!["p"; MAX_PROMPTS])))
                .unwrap()
                .len(),
            MAX_PROMPTS
        );
        // One prompt of many token ids is one prompt, not many.
        assert_eq!(
            parse_prompt(Some(&json!(vec![1; MAX_PROMPTS + 1])))
                .unwrap()
                .len(),
            1
        );
    }

    #[test]
    fn prompts_of_every_shape() {
        assert_eq!(
            parse_prompt(Some(&json!("hi"))).unwrap(),
            vec![PromptInput::Text("hi".into())]
        );
        assert_eq!(parse_prompt(Some(&json!(["a", "b"]))).unwrap().len(), 2);
        assert_eq!(
            parse_prompt(Some(&json!([1, 2]))).unwrap(),
            vec![PromptInput::Tokens(vec![1, 2])]
        );
        assert_eq!(parse_prompt(Some(&json!([[1], [2, 3]]))).unwrap().len(), 2);
        for bad in [
            json!(1),
            json!([1, "a"]),
            json!([-1]),
            json!([[1], 2]),
            json!({}),
        ] {
            assert_eq!(parse_prompt(Some(&bad)).unwrap_err().status, 400, "{bad}");
        }
        assert!(parse_prompt(Some(&json!([])))
            .unwrap_err()
            .message
            .contains("empty"));
    }

    #[test]
    fn sampling_ranges() {
        let d = SamplingDefaults::default();
        let f = |v: Value| serde_json::from_value::<SamplingFields>(v).unwrap();
        for bad in [
            json!({"temperature": -0.5}),
            json!({"top_p": 0}),
            json!({"top_p": 1.5}),
            json!({"n": 0}),
            json!({"min_p": 2}),
            json!({"presence_penalty": 3}),
            json!({"repetition_penalty": 0}),
            // Finite as f64 but not as the f32 the sampler gets (+inf, 0).
            json!({"temperature": 1e39}),
            json!({"repetition_penalty": 1e39}),
            json!({"repetition_penalty": 1e-50}),
            json!({"min_tokens": -1}),
            json!({"stop": 3}),
            json!({"stream_options": {"include_usage": true}}),
        ] {
            let e = common(&f(bad.clone()), &d).unwrap_err();
            assert_eq!(e.status, 400, "{bad}");
        }
        let c = common(&f(json!({"stop": ["a", ""], "n": 3, "top_k": -1})), &d).unwrap();
        assert_eq!(c.stop, vec!["a".to_string()]);
        assert_eq!(c.n, 3);
        assert_eq!(c.params.top_k, 0);
        let defaults = SamplingDefaults {
            temperature: Some(0.25),
            ..Default::default()
        };
        let c = common(&f(json!({})), &defaults).unwrap();
        assert_eq!(c.params.temperature, 0.25);
        assert!(check_logprobs("logprobs", 21).is_err());
        assert_eq!(check_logprobs("logprobs", 20).unwrap(), 20);
    }
}
