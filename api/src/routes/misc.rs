//! `GET /v1/models`, `POST /tokenize`, `POST /detokenize`, `GET /version`, `GET /health`.

use warp::reply::Response;

use super::{json, parse_body, token_text};
use crate::errors::ApiError;
use crate::state::AppState;
use crate::types::{
    DetokenizeRequest, DetokenizeResponse, ModelCard, ModelList, TokenizeRequest, TokenizeResponse,
};

/// The served models.
pub fn models(state: &AppState) -> Response {
    let data = state
        .router
        .models()
        .iter()
        .map(|m| ModelCard {
            id: m.name.clone(),
            object: "model",
            created: m.created,
            owned_by: "dcpserve",
            root: m.backend.root(),
            parent: None,
            max_model_len: m.backend.max_model_len(),
        })
        .collect();
    json(&ModelList {
        object: "list",
        data,
    })
}

/// vLLM's `/tokenize`: a `prompt`, or `messages` (and `tools`) rendered with the chat
/// template as chat completions render them.
pub fn tokenize(state: &AppState, body: &[u8]) -> Result<Response, ApiError> {
    let req: TokenizeRequest = parse_body(body)?;
    let slot = state.router.get(req.model.as_deref())?;
    let b = slot.backend.as_ref();
    let tokens = match (&req.prompt, &req.messages) {
        (Some(p), None) => b
            .encode(p, req.add_special_tokens.unwrap_or(true))
            .map_err(ApiError::bad_request)?,
        (None, Some(m)) => {
            let messages = crate::chat_messages::template_messages(Some(m))?;
            let tools = req.tools.as_ref().filter(|t| !t.is_null());
            let context = crate::chat_messages::template_context(messages, tools);
            let text = b
                .render_chat_context(&context)
                .map_err(|e| ApiError::invalid_param("messages", e))?;
            b.encode(&text, req.add_special_tokens.unwrap_or(false))
                .map_err(ApiError::bad_request)?
        }
        _ => {
            return Err(ApiError::bad_request(
                "Send exactly one of `prompt` or `messages`.",
            ))
        }
    };
    let token_strs = req
        .return_token_strs
        .unwrap_or(false)
        .then(|| tokens.iter().map(|&t| token_text(b, t, false)).collect());
    Ok(json(&TokenizeResponse {
        count: tokens.len(),
        max_model_len: b.max_model_len(),
        tokens,
        token_strs,
    }))
}

/// vLLM's `/detokenize`.
pub fn detokenize(state: &AppState, body: &[u8]) -> Result<Response, ApiError> {
    let req: DetokenizeRequest = parse_body(body)?;
    let slot = state.router.get(req.model.as_deref())?;
    let b = slot.backend.as_ref();
    let vocab = b.vocab_size();
    let ids = req
        .tokens
        .iter()
        .map(|&t| {
            u32::try_from(t)
                .ok()
                .filter(|&id| (id as usize) < vocab)
                .ok_or_else(|| {
                    ApiError::invalid_param(
                        "tokens",
                        format!("Token id {t} is out of vocabulary (size {vocab})."),
                    )
                })
        })
        .collect::<Result<Vec<u32>, _>>()?;
    let prompt = b.decode(&ids, false).map_err(ApiError::bad_request)?;
    Ok(json(&DetokenizeResponse { prompt }))
}

/// `{"version": ...}`.
pub fn version() -> Response {
    json(&serde_json::json!({ "version": env!("CARGO_PKG_VERSION") }))
}
