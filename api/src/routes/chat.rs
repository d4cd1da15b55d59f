//! `POST /v1/chat/completions`: messages (and tools) rendered with the model's chat
//! template; outputs read for reasoning and tool calls as the model's settings and the
//! request's `tool_choice` say (see [`crate::tools`], [`crate::chat_output`]).

use std::sync::Arc;
use std::time::Instant;

use dcpserve_actors::{TokenOutput, ValidRequest};
use warp::reply::Response;

use super::{finite, parse_body, token_text};
use crate::backend::ModelBackend;
use crate::chat_messages;
use crate::chat_output::{OutputMode, OutputParser};
use crate::errors::ApiError;
use crate::generation::{self, ChoiceEvent, ChoiceSpec};
use crate::reasoning::ReasoningParser;
use crate::sse::{self, ChunkFormatter};
use crate::state::AppState;
use crate::tools;
use crate::types::{
    new_id, unix_now, ChatChoice, ChatChunkChoice, ChatCompletionChunk, ChatCompletionRequest,
    ChatCompletionResponse, ChatDelta, ChatLogprobs, ChatMessageOut, ChatTokenLogprob,
    ChatTopLogprob, Skip, Usage,
};
use crate::validation;

/// Handles a chat completions request.
pub async fn handle(state: &AppState, body: &[u8]) -> Result<Response, ApiError> {
    let arrival = Instant::now();
    let req: ChatCompletionRequest = parse_body(body)?;
    let slot = state.router.get(req.model.as_deref())?;
    let backend = slot.backend.as_ref();
    let common = validation::common_with_constraint(&req.sampling, &slot.defaults, backend)?;
    let want_logprobs = req.logprobs.unwrap_or(false);
    let top = match req.top_logprobs {
        Some(k) if !want_logprobs && k > 0 => {
            return Err(ApiError::invalid_param(
                "top_logprobs",
                "when using `top_logprobs`, `logprobs` must be set to true.",
            ))
        }
        Some(k) => validation::check_logprobs("top_logprobs", k)?,
        None => 0,
    };
    let messages = chat_messages::template_messages(req.messages.as_ref())?;
    let plan = tools::plan(req.tools.as_ref(), req.tool_choice.as_ref(), &slot.chat)?;
    if let Some(c) = &plan.constraint {
        if common.params.constraint.is_some() {
            return Err(ApiError::invalid_param(
                "tool_choice",
                "A forced `tool_choice` (\"required\" or a named function) cannot be combined with `response_format` or `guided_*` constraints.",
            ));
        }
        if common.params.ignore_eos {
            return Err(ApiError::invalid_param(
                "ignore_eos",
                "`ignore_eos` cannot be combined with a forced `tool_choice`: the output ends when the call is complete.",
            ));
        }
        // The tools' schemas compile with the model's grammar engine, or 400 with its message.
        backend
            .check_constraint(c)
            .map_err(|e| ApiError::invalid_param("tools", e))?;
    }
    let context = chat_messages::template_context(messages, plan.template_tools.as_ref());
    let text = backend
        .render_chat_context(&context)
        .map_err(|e| ApiError::invalid_param("messages", e))?;
    let mode = OutputMode {
        reasoning: slot
            .chat
            .reasoning_parser
            .filter(|_| !plan.forced)
            .map(|p| (p, ReasoningParser::prompt_opens_thinking(&text))),
        tools: plan.parser.clone(),
    };
    let ids = backend
        .encode(&text, false)
        .map_err(ApiError::bad_request)?;
    let prompt = validation::valid_prompt(ids, backend)?;
    let max_tokens = validation::resolve_max_tokens(
        req.max_completion_tokens.or(req.max_tokens),
        prompt.len(),
        backend,
        &slot.defaults,
        common.params.min_tokens,
    )?;

    let n = common.n;
    let permit = slot.admit(n)?;
    let prompt_tokens = prompt.len();
    let specs = (0..n)
        .map(|i| {
            let mut params = common.params.clone();
            params.max_tokens = max_tokens;
            params.logprobs = want_logprobs.then_some(top);
            params.seed = params.seed.map(|s| s.wrapping_add(i as u64));
            if plan.constraint.is_some() {
                params.constraint = plan.constraint.clone();
            }
            ChoiceSpec {
                index: i,
                prompt: 0,
                request: ValidRequest::new(prompt.clone(), params),
            }
        })
        .collect();
    let events = generation::start(&slot, specs, common.stop.clone(), arrival, permit)?;
    let mut fmt = Formatter {
        id: new_id("chatcmpl"),
        created: unix_now(),
        model: slot.name.clone(),
        backend: slot.backend.clone(),
        logprobs: want_logprobs,
        started: vec![false; n],
        parsers: (0..n).map(|_| OutputParser::new(mode.clone())).collect(),
        prompt_tokens,
        completion_tokens: 0,
        include_usage: common.include_usage,
        as_ids: req.return_tokens_as_token_ids.unwrap_or(false),
    };
    if common.stream {
        return Ok(sse::response(events, fmt));
    }
    let results = generation::collect(events, n).await?;
    let choices = results
        .into_iter()
        .enumerate()
        .map(|(index, r)| {
            fmt.completion_tokens += r.finish.completion_tokens;
            let mut parser = OutputParser::new(mode.clone());
            parser.push(&r.text, true);
            let m = parser.finish();
            let finish_reason = finish_reason(r.finish.reason, !m.tool_calls.is_empty());
            ChatChoice {
                index,
                message: ChatMessageOut {
                    role: "assistant",
                    content: m.content,
                    reasoning_content: m.reasoning,
                    tool_calls: m.tool_calls,
                },
                logprobs: want_logprobs.then(|| ChatLogprobs {
                    content: r.tokens.iter().map(|t| fmt.entry(t)).collect(),
                }),
                finish_reason: Some(finish_reason),
            }
        })
        .collect();
    Ok(super::json(&ChatCompletionResponse {
        id: fmt.id.clone(),
        object: "chat.completion",
        created: fmt.created,
        model: fmt.model.clone(),
        choices,
        usage: Usage::new(prompt_tokens, fmt.completion_tokens),
    }))
}

/// `tool_calls` when a choice that called tools ended by itself (OpenAI's and vLLM's
/// reason), else the engine's reason (`length` stays: the call may be cut short).
fn finish_reason(reason: &'static str, called_tools: bool) -> &'static str {
    if called_tools && reason == "stop" {
        "tool_calls"
    } else {
        reason
    }
}

/// Builds chat bodies and stream chunks.
struct Formatter {
    id: String,
    created: u64,
    model: String,
    backend: Arc<dyn ModelBackend>,
    logprobs: bool,
    started: Vec<bool>,
    /// Each choice's output so far, read for reasoning and tool calls.
    parsers: Vec<OutputParser>,
    prompt_tokens: usize,
    completion_tokens: usize,
    include_usage: bool,
    as_ids: bool,
}

impl Formatter {
    fn entry(&self, t: &TokenOutput) -> ChatTokenLogprob {
        let b = self.backend.as_ref();
        let token = token_text(b, t.token_id, self.as_ids);
        ChatTokenLogprob {
            bytes: token.as_bytes().to_vec(),
            token,
            logprob: finite(t.logprob.unwrap_or(f32::NEG_INFINITY)),
            top_logprobs: t
                .top_logprobs
                .iter()
                .map(|&(id, lp)| {
                    let token = token_text(b, id, self.as_ids);
                    ChatTopLogprob {
                        bytes: token.as_bytes().to_vec(),
                        token,
                        logprob: finite(lp),
                    }
                })
                .collect(),
        }
    }

    fn chunk(&self, choices: Vec<ChatChunkChoice>, usage: Skip<Usage>) -> ChatCompletionChunk {
        ChatCompletionChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
        }
    }

    fn usage_field(&self) -> Skip<Usage> {
        if self.include_usage {
            Skip::Null
        } else {
            Skip::Absent
        }
    }
}

impl ChunkFormatter for Formatter {
    fn frames(&mut self, ev: ChoiceEvent, out: &mut String) {
        let i = ev.index;
        if !self.started[i] {
            // OpenAI opens every choice with the role.
            self.started[i] = true;
            let first = ChatChunkChoice {
                index: i,
                delta: ChatDelta {
                    role: Some("assistant"),
                    content: Some(String::new()),
                    ..Default::default()
                },
                logprobs: None,
                finish_reason: None,
            };
            sse::push_frame(out, &self.chunk(vec![first], self.usage_field()));
        }
        let logprobs = match (&ev.token, self.logprobs) {
            (Some(t), true) => Some(ChatLogprobs {
                content: vec![self.entry(t)],
            }),
            _ => None,
        };
        if let Some(f) = ev.finish {
            self.completion_tokens += f.completion_tokens;
        }
        let parser = &mut self.parsers[i];
        let plain = parser.is_plain();
        let d = parser.push(&ev.text, ev.finish.is_some());
        let finish_reason = ev
            .finish
            .map(|f| finish_reason(f.reason, parser.called_tools()));
        let delta = if plain {
            if ev.text.is_empty() && ev.finish.is_none() && logprobs.is_none() {
                return;
            }
            ChatDelta {
                content: (!ev.text.is_empty() || ev.finish.is_none()).then_some(ev.text),
                ..Default::default()
            }
        } else {
            if d.is_empty() && ev.finish.is_none() && logprobs.is_none() {
                return;
            }
            ChatDelta {
                role: None,
                content: (!d.content.is_empty()).then_some(d.content),
                reasoning_content: (!d.reasoning.is_empty()).then_some(d.reasoning),
                tool_calls: (!d.tool_calls.is_empty()).then_some(d.tool_calls),
            }
        };
        let choice = ChatChunkChoice {
            index: i,
            delta,
            logprobs,
            finish_reason,
        };
        sse::push_frame(out, &self.chunk(vec![choice], self.usage_field()));
    }

    fn finish(&mut self, out: &mut String) {
        if self.include_usage {
            let usage = Usage::new(self.prompt_tokens, self.completion_tokens);
            sse::push_frame(out, &self.chunk(Vec::new(), Skip::Some(usage)));
        }
    }
}
