//! Endpoint handlers. Each takes the parsed request and returns a response or an
//! [`ApiError`](crate::errors::ApiError); none panics on user input.

pub mod chat;
pub mod completions;
pub mod misc;
pub mod status;

use serde::Serialize;
use warp::http::HeaderValue;
use warp::reply::Response;

use crate::backend::ModelBackend;
use crate::errors::ApiError;
use crate::request_fields::{reject_unknown, KnownFields};

/// A 200 JSON response.
pub fn json<T: Serialize>(value: &T) -> Response {
    match serde_json::to_vec(value) {
        Ok(body) => {
            let mut r = Response::new(body.into());
            r.headers_mut()
                .insert("content-type", HeaderValue::from_static("application/json"));
            r
        }
        Err(e) => ApiError::internal(format!("Cannot encode the response: {e}")).into_response(),
    }
}

/// Parses a JSON body into `T`, answering 400 with serde's explanation (wrong types,
/// missing fields, malformed JSON), or naming a field `T` does not read
/// ([`reject_unknown`]).
pub fn parse_body<T: serde::de::DeserializeOwned + KnownFields>(
    body: &[u8],
) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request(
            "The request body is empty: send a JSON object.",
        ));
    }
    let invalid =
        |e: serde_json::Error| ApiError::bad_request(format!("Invalid request body: {e}"));
    let value: serde_json::Value = serde_json::from_slice(body).map_err(invalid)?;
    reject_unknown::<T>(&value)?;
    serde_json::from_value(value).map_err(invalid)
}

/// The text of one token as logprobs show it (`token_id:{id}` when the request asked for
/// ids, which also names tokens whose text is not valid UTF-8 on its own).
pub fn token_text(backend: &dyn ModelBackend, id: u32, as_id: bool) -> String {
    if as_id {
        return format!("token_id:{id}");
    }
    backend.decode(&[id], false).unwrap_or_default()
}

/// A log-probability as a JSON number, written with f32's shortest digits (not the long
/// expansion an f32 → f64 cast would print).
pub fn lp_value(lp: f32) -> serde_json::Value {
    let x: f64 = finite(lp).to_string().parse().unwrap_or(-9999.0);
    serde_json::Number::from_f64(x).map_or(serde_json::Value::Null, Into::into)
}

/// JSON has no -inf: vLLM's stand-in for impossible tokens.
pub fn finite(lp: f32) -> f32 {
    if lp.is_finite() {
        lp
    } else {
        -9999.0
    }
}
