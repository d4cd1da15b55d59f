//! OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}` with the HTTP
//! status that goes with them, and the mapping of warp's own rejections onto that shape.

use std::convert::Infallible;

use serde::Serialize;
use warp::http::StatusCode;
use warp::reply::Response;
use warp::{Rejection, Reply};

/// An error answered to the client.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's `type`: `invalid_request_error`, `authentication_error`, ...
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

#[derive(Serialize)]
struct Body<'a> {
    error: Inner<'a>,
}

#[derive(Serialize)]
struct Inner<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

impl ApiError {
    /// 400: the request is malformed or asks for something impossible.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: None,
        }
    }

    /// 400 naming the offending parameter.
    pub fn invalid_param(param: &str, message: impl Into<String>) -> Self {
        Self {
            param: Some(param.to_string()),
            ..Self::bad_request(message)
        }
    }

    /// 401: a key is required and was missing or wrong.
    pub fn unauthorized() -> Self {
        Self {
            status: StatusCode::UNAUTHORIZED,
            message: "Incorrect or missing API key: send `Authorization: Bearer <key>`.".into(),
            kind: "authentication_error",
            param: None,
            code: Some("invalid_api_key"),
        }
    }

    /// 404 for a model that is not served, in vLLM's words.
    pub fn model_not_found(name: &str) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: format!("The model `{name}` does not exist."),
            kind: "invalid_request_error",
            param: Some("model".into()),
            code: Some("model_not_found"),
        }
    }

    /// 404 for an unknown route.
    pub fn route_not_found(path: &str) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: format!("No route for `{path}`."),
            kind: "invalid_request_error",
            param: None,
            code: Some("not_found"),
        }
    }

    /// 405 for a known route with the wrong method.
    pub fn method_not_allowed(method: &str, path: &str) -> Self {
        Self {
            status: StatusCode::METHOD_NOT_ALLOWED,
            message: format!("Method {method} is not allowed on `{path}`."),
            kind: "invalid_request_error",
            param: None,
            code: Some("method_not_allowed"),
        }
    }

    /// 413 for a body over the size limit.
    pub fn payload_too_large(limit: usize) -> Self {
        Self {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            message: format!("The request body is larger than {limit} bytes."),
            kind: "invalid_request_error",
            param: None,
            code: None,
        }
    }

    /// 429: the model's bounded queue is full; the client should retry later.
    pub fn overloaded(model: &str) -> Self {
        Self {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: format!("The model `{model}` has too many requests waiting; retry later."),
            kind: "rate_limit_error",
            param: None,
            code: Some("rate_limit_exceeded"),
        }
    }

    /// 500: the engine failed (never caused by user input alone).
    pub fn internal(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
        }
    }

    /// 503: the model cannot serve now (its ranks were lost or are restarting).
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: Some("service_unavailable"),
        }
    }

    /// The answer to a generation the backend refused or ended with an error.
    pub fn from_backend(e: crate::backend::BackendError) -> Self {
        use crate::backend::BackendErrorKind as Kind;
        match e.kind {
            Kind::InvalidRequest => Self::bad_request(e.message),
            Kind::Unavailable => Self::unavailable(e.message),
            Kind::Failed => Self::internal(e.message),
        }
    }

    /// The JSON body (also used inside a stream as an error event).
    pub fn body_json(&self) -> String {
        serde_json::to_string(&Body {
            error: Inner {
                message: &self.message,
                kind: self.kind,
                param: self.param.as_deref(),
                code: self.code,
            },
        })
        .unwrap_or_else(|_| "{\"error\":{}}".into())
    }

    /// The HTTP response.
    pub fn into_response(self) -> Response {
        let mut r = warp::http::Response::new(self.body_json().into());
        *r.status_mut() = self.status;
        r.headers_mut().insert(
            warp::http::header::CONTENT_TYPE,
            warp::http::HeaderValue::from_static("application/json"),
        );
        r
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ApiError {}

/// Maps any rejection warp produces on its own onto an OpenAI-style body, so that no
/// request, however malformed, gets warp's plain-text answers.
pub async fn handle_rejection(err: Rejection) -> Result<Response, Infallible> {
    let e = if err.is_not_found() {
        ApiError::route_not_found("")
    } else if err.find::<warp::reject::MethodNotAllowed>().is_some() {
        ApiError::method_not_allowed("", "")
    } else if err.find::<warp::reject::PayloadTooLarge>().is_some() {
        ApiError::payload_too_large(crate::limits::MAX_BODY_BYTES)
    } else if let Some(e) = err.find::<warp::filters::body::BodyDeserializeError>() {
        ApiError::bad_request(format!("Invalid JSON body: {e}"))
    } else {
        ApiError::bad_request(format!("Invalid request: {err:?}"))
    };
    Ok(e.into_response())
}

/// `ApiError` as a reply, for handlers that return `Result<_, ApiError>`.
impl Reply for ApiError {
    fn into_response(self) -> Response {
        ApiError::into_response(self)
    }
}
