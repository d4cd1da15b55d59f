//! The warp server: one filter that reads method, path, headers and body, and a dispatcher
//! that routes them, so that every outcome (unknown route, wrong method, missing key, bad
//! body) is answered in OpenAI's error shape.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use warp::filters::path::FullPath;
use warp::http::{HeaderMap, HeaderValue, Method};
use warp::reply::Response;
use warp::{Buf, Filter, Reply};

use crate::backend::BackendStats;
use crate::errors::{handle_rejection, ApiError};
use crate::routes;
use crate::state::AppState;

// Re-exported from its old home, where callers have found it.
pub use crate::limits::MAX_BODY_BYTES;

#[derive(Clone, Copy)]
enum Route {
    Completions,
    Chat,
    Models,
    Tokenize,
    Detokenize,
    Health,
    Metrics,
    Version,
    EngineStatus,
    /// A file of the web page (`GET /` and its script and style sheet).
    Web(&'static crate::web::Asset),
}

impl Route {
    fn parse(path: &str) -> Option<(Route, Method)> {
        let path = path.strip_suffix('/').unwrap_or(path);
        Some(match path {
            "/v1/completions" => (Route::Completions, Method::POST),
            "/v1/chat/completions" => (Route::Chat, Method::POST),
            "/v1/models" => (Route::Models, Method::GET),
            "/tokenize" => (Route::Tokenize, Method::POST),
            "/detokenize" => (Route::Detokenize, Method::POST),
            "/health" => (Route::Health, Method::GET),
            "/metrics" => (Route::Metrics, Method::GET),
            "/version" => (Route::Version, Method::GET),
            "/v1/engine/status" => (Route::EngineStatus, Method::GET),
            _ => (Route::Web(crate::web::asset(path)?), Method::GET),
        })
    }
}

/// The whole API as one warp filter.
pub fn routes(
    state: Arc<AppState>,
) -> impl Filter<Extract = (Response,), Error = std::convert::Infallible> + Clone + Send + Sync + 'static
{
    warp::method()
        .and(warp::path::full())
        .and(warp::header::headers_cloned())
        .and(warp::body::stream())
        .then(move |method, path: FullPath, headers, body| {
            let state = state.clone();
            async move { dispatch(&state, method, path.as_str(), &headers, body).await }
        })
        .recover(handle_rejection)
        .unify()
}

async fn read_body<S, B>(body: S) -> Result<Vec<u8>, ApiError>
where
    S: Stream<Item = Result<B, warp::Error>>,
    B: Buf,
{
    let mut body = std::pin::pin!(body);
    let mut out = Vec::new();
    while let Some(chunk) = body.next().await {
        let mut chunk =
            chunk.map_err(|e| ApiError::bad_request(format!("Cannot read the body: {e}")))?;
        while chunk.has_remaining() {
            let c = chunk.chunk();
            if out.len() + c.len() > MAX_BODY_BYTES {
                return Err(ApiError::payload_too_large(MAX_BODY_BYTES));
            }
            out.extend_from_slice(c);
            let n = c.len();
            chunk.advance(n);
        }
    }
    Ok(out)
}

fn authorized(state: &AppState, headers: &HeaderMap) -> bool {
    let Some(key) = &state.api_key else {
        return true;
    };
    headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|given| given.trim() == key)
}

pub(crate) async fn dispatch<S, B>(
    state: &AppState,
    method: Method,
    path: &str,
    headers: &HeaderMap,
    body: S,
) -> Response
where
    S: Stream<Item = Result<B, warp::Error>>,
    B: Buf,
{
    let result = async {
        let (route, want) = Route::parse(path)
            .filter(|(r, _)| state.web_ui || !matches!(r, Route::Web(_)))
            .ok_or_else(|| ApiError::route_not_found(path))?;
        if method != want && !(method == Method::HEAD && want == Method::GET) {
            return Err(ApiError::method_not_allowed(method.as_str(), path));
        }
        if path.starts_with("/v1/") && !authorized(state, headers) {
            return Err(ApiError::unauthorized());
        }
        let body = if want == Method::POST {
            read_body(body).await?
        } else {
            Vec::new()
        };
        match route {
            Route::Completions => routes::completions::handle(state, &body).await,
            Route::Chat => routes::chat::handle(state, &body).await,
            Route::Models => Ok(routes::misc::models(state)),
            Route::Tokenize => routes::misc::tokenize(state, &body),
            Route::Detokenize => routes::misc::detokenize(state, &body),
            Route::Version => Ok(routes::misc::version()),
            Route::Health => health(state).await,
            Route::EngineStatus => Ok(routes::status::engine_status(state).await),
            Route::Web(asset) => Ok(crate::web::response(asset)),
            Route::Metrics => {
                let samples = state.router.metrics_samples().await;
                let text = crate::metrics::render(&samples);
                let mut r = Response::new(text.into());
                r.headers_mut().insert(
                    "content-type",
                    HeaderValue::from_static("text/plain; version=0.0.4"),
                );
                Ok(r)
            }
        }
    }
    .await;
    let response = result.unwrap_or_else(|e| {
        tracing::debug!(status = %e.status, "{method} {path}: {}", e.message);
        e.into_response()
    });
    response.into_response()
}

/// 200 with an empty body while every model answers, 503 otherwise.
async fn health(state: &AppState) -> Result<Response, ApiError> {
    for m in state.router.models() {
        let reason = match m.backend.stats().await {
            None => "is not running".to_string(),
            Some(BackendStats {
                unavailable: Some(why),
                ..
            }) => format!("cannot serve: {why}"),
            Some(_) => continue,
        };
        let mut e = ApiError::internal(format!("The model `{}` {reason}", m.name));
        e.status = warp::http::StatusCode::SERVICE_UNAVAILABLE;
        return Err(e);
    }
    Ok(Response::new(Vec::<u8>::new().into()))
}

/// Binds `addr` (port 0 picks a free port) and returns the bound address and the future
/// that serves until `shutdown` resolves (in-flight requests are allowed to finish).
pub async fn serve(
    addr: SocketAddr,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<(SocketAddr, impl Future<Output = ()> + Send)> {
    crate::metrics::install();
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let server = warp::serve(routes(Arc::new(state)))
        .incoming(listener)
        .graceful(shutdown)
        .run();
    Ok((local, server))
}
