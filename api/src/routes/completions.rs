//! `POST /v1/completions`.

use std::sync::Arc;
use std::time::Instant;

use dcpserve_actors::{TokenOutput, ValidRequest};
use serde_json::{Map, Value};
use warp::reply::Response;

use super::{finite, lp_value, parse_body, token_text};
use crate::backend::ModelBackend;
use crate::errors::ApiError;
use crate::generation::{self, ChoiceEvent, ChoiceSpec};
use crate::sse::{self, ChunkFormatter};
use crate::state::AppState;
use crate::types::{
    new_id, unix_now, CompletionChoice, CompletionLogprobs, CompletionRequest, CompletionResponse,
    Skip, Usage,
};
use crate::validation::{self, PromptInput};

/// Handles a completions request.
pub async fn handle(state: &AppState, body: &[u8]) -> Result<Response, ApiError> {
    let arrival = Instant::now();
    let req: CompletionRequest = parse_body(body)?;
    let slot = state.router.get(req.model.as_deref())?;
    let backend = slot.backend.as_ref();
    let common = validation::common_with_constraint(&req.sampling, &slot.defaults, backend)?;
    let logprobs = req
        .logprobs
        .map(|k| validation::check_logprobs("logprobs", k))
        .transpose()?;
    let echo = req.echo.unwrap_or(false);

    // Tokenize and size every prompt before admitting anything.
    let mut prompts = Vec::new();
    for p in validation::parse_prompt(req.prompt.as_ref())? {
        let (prompt, text) = match p {
            PromptInput::Text(s) => {
                if s.is_empty() {
                    return Err(ApiError::invalid_param("prompt", "The prompt is empty."));
                }
                let ids = backend.encode(&s, true).map_err(ApiError::bad_request)?;
                (validation::valid_prompt(ids, backend)?, s)
            }
            PromptInput::Tokens(ids) => {
                let prompt = validation::valid_prompt(ids, backend)?;
                let text = if echo {
                    backend
                        .decode(prompt.ids(), false)
                        .map_err(ApiError::bad_request)?
                } else {
                    String::new()
                };
                (prompt, text)
            }
        };
        let max_tokens = validation::resolve_max_tokens(
            req.max_tokens,
            prompt.len(),
            backend,
            &slot.defaults,
            common.params.min_tokens,
        )?;
        prompts.push((prompt, text, max_tokens));
    }

    let n = common.n;
    let permit = slot.admit(n * prompts.len())?;
    let mut specs = Vec::new();
    for (p, (prompt, _, max_tokens)) in prompts.iter().enumerate() {
        for i in 0..n {
            let mut params = common.params.clone();
            params.max_tokens = *max_tokens;
            params.logprobs = logprobs;
            // Choices of one seeded request differ from each other but are reproducible.
            params.seed = params.seed.map(|s| s.wrapping_add(i as u64));
            if echo && logprobs.is_some() {
                params.prompt_logprobs = logprobs;
            }
            specs.push(ChoiceSpec {
                index: p * n + i,
                prompt: p,
                request: ValidRequest::new(prompt.clone(), params),
            });
        }
    }
    let count = specs.len();
    let events = generation::start(&slot, specs, common.stop.clone(), arrival, permit)?;
    let mut fmt = Formatter {
        id: new_id("cmpl"),
        created: unix_now(),
        model: slot.name.clone(),
        backend: slot.backend.clone(),
        n,
        echo,
        logprobs,
        prompts: prompts
            .into_iter()
            .map(|(prompt, text, _)| (prompt.into_ids(), text))
            .collect(),
        started: vec![false; count],
        offsets: vec![0; count],
        completion_tokens: 0,
        include_usage: common.include_usage,
        as_ids: req.return_tokens_as_token_ids.unwrap_or(false),
    };
    if common.stream {
        return Ok(sse::response(events, fmt));
    }
    let results = generation::collect(events, count).await?;
    let mut choices = Vec::with_capacity(count);
    for (index, r) in results.into_iter().enumerate() {
        fmt.completion_tokens += r.finish.completion_tokens;
        let mut text = String::new();
        let mut lp = fmt.logprobs.map(|_| CompletionLogprobs::default());
        if echo {
            let first = r.tokens.first().and_then(|t| t.prompt_logprobs.as_ref());
            fmt.push_prompt(index, first, &mut text, lp.as_mut());
        }
        text.push_str(&r.text);
        if let Some(lp) = lp.as_mut() {
            for t in &r.tokens {
                fmt.push_token(index, t, lp);
            }
        }
        choices.push(CompletionChoice {
            index,
            text,
            logprobs: lp,
            finish_reason: Some(r.finish.reason),
        });
    }
    Ok(super::json(&CompletionResponse {
        id: fmt.id.clone(),
        object: "text_completion",
        created: fmt.created,
        model: fmt.model.clone(),
        choices,
        usage: Skip::Some(fmt.usage()),
    }))
}

/// Builds completion bodies and stream chunks (logprob arrays, echo, usage).
struct Formatter {
    id: String,
    created: u64,
    model: String,
    backend: Arc<dyn ModelBackend>,
    n: usize,
    echo: bool,
    logprobs: Option<usize>,
    /// Token ids and echo text of each prompt.
    prompts: Vec<(Vec<u32>, String)>,
    started: Vec<bool>,
    /// Characters of each choice's text so far (`text_offset`).
    offsets: Vec<usize>,
    completion_tokens: usize,
    include_usage: bool,
    as_ids: bool,
}

impl Formatter {
    fn usage(&self) -> Usage {
        let prompt: usize = self.prompts.iter().map(|p| p.0.len()).sum();
        Usage::new(prompt, self.completion_tokens)
    }

    fn top_map(&self, t: &TokenOutput) -> Map<String, Value> {
        let mut m = Map::new();
        for &(id, lp) in &t.top_logprobs {
            m.insert(
                token_text(self.backend.as_ref(), id, self.as_ids),
                lp_value(lp),
            );
        }
        // vLLM always lists the chosen token among the alternatives.
        if let Some(lp) = t.logprob {
            m.entry(token_text(self.backend.as_ref(), t.token_id, self.as_ids))
                .or_insert(lp_value(lp));
        }
        m
    }

    /// Moves choice `index`'s text offset past token `id` (shown as `shown`).
    fn advance(&mut self, index: usize, id: u32, shown: &str) {
        let chars = if self.as_ids {
            token_text(self.backend.as_ref(), id, false).chars().count()
        } else {
            shown.chars().count()
        };
        self.offsets[index] += chars;
    }

    fn push_token(&mut self, index: usize, t: &TokenOutput, lp: &mut CompletionLogprobs) {
        let s = token_text(self.backend.as_ref(), t.token_id, self.as_ids);
        lp.text_offset.push(self.offsets[index]);
        self.advance(index, t.token_id, &s);
        lp.token_logprobs.push(t.logprob.map(finite));
        lp.top_logprobs.push(Some(self.top_map(t)));
        lp.tokens.push(s);
    }

    /// The echoed prompt (and its logprobs, the first token's being null).
    fn push_prompt(
        &mut self,
        index: usize,
        scores: Option<&Vec<TokenOutput>>,
        text: &mut String,
        lp: Option<&mut CompletionLogprobs>,
    ) {
        let (ids, echo) = &self.prompts[index / self.n];
        text.push_str(echo);
        let Some(lp) = lp else { return };
        let ids = ids.clone();
        for (i, &id) in ids.iter().enumerate() {
            let s = token_text(self.backend.as_ref(), id, self.as_ids);
            lp.text_offset.push(self.offsets[index]);
            self.advance(index, id, &s);
            let score = if i == 0 {
                None
            } else {
                scores.and_then(|v| v.get(i - 1))
            };
            lp.token_logprobs
                .push(score.and_then(|t| t.logprob.map(finite)));
            lp.top_logprobs.push(score.map(|t| self.top_map(t)));
            lp.tokens.push(s);
        }
    }
}

impl ChunkFormatter for Formatter {
    fn frames(&mut self, ev: ChoiceEvent, out: &mut String) {
        let i = ev.index;
        let mut text = String::new();
        let mut lp = self.logprobs.map(|_| CompletionLogprobs::default());
        if !self.started[i] {
            self.started[i] = true;
            if self.echo {
                let scores = ev.token.as_ref().and_then(|t| t.prompt_logprobs.as_ref());
                self.push_prompt(i, scores, &mut text, lp.as_mut());
            }
        }
        text.push_str(&ev.text);
        if let (Some(lp), Some(t)) = (lp.as_mut(), ev.token.as_ref()) {
            self.push_token(i, t, lp);
        }
        if let Some(f) = ev.finish {
            self.completion_tokens += f.completion_tokens;
        }
        if text.is_empty() && ev.finish.is_none() && lp.as_ref().is_none_or(|l| l.tokens.is_empty())
        {
            return;
        }
        let chunk = CompletionResponse {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            choices: vec![CompletionChoice {
                index: i,
                text,
                logprobs: lp,
                finish_reason: ev.finish.map(|f| f.reason),
            }],
            usage: if self.include_usage {
                Skip::Null
            } else {
                Skip::Absent
            },
        };
        sse::push_frame(out, &chunk);
    }

    fn finish(&mut self, out: &mut String) {
        if self.include_usage {
            let chunk = CompletionResponse {
                id: self.id.clone(),
                object: "text_completion",
                created: self.created,
                model: self.model.clone(),
                choices: Vec::new(),
                usage: Skip::Some(self.usage()),
            };
            sse::push_frame(out, &chunk);
        }
    }
}
