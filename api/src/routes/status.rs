//! `GET /v1/engine/status` (see [`crate::engine_status`] for the JSON).

use std::time::Instant;

use warp::reply::Response;

use super::json;
use crate::backend::BackendStats;
use crate::engine_status::{model_status, EngineStatus};
use crate::state::AppState;

/// Every model's engine status; a model that cannot answer is listed as unavailable.
pub async fn engine_status(state: &AppState) -> Response {
    let now = Instant::now();
    let mut models = Vec::with_capacity(state.router.models().len());
    for slot in state.router.models() {
        let (stats, kv) = futures::join!(slot.backend.stats(), slot.backend.kv_status());
        let stats = stats.unwrap_or_else(|| BackendStats {
            unavailable: Some("the model is not running".into()),
            ..Default::default()
        });
        let rate = kv.as_ref().and_then(|k| {
            state
                .token_rate
                .observe(&slot.name, now, k.generated_tokens)
        });
        models.push(model_status(
            &slot.name,
            &stats,
            kv.as_ref(),
            slot.outstanding(),
            rate,
        ));
    }
    json(&EngineStatus {
        object: "engine.status",
        models,
    })
}
