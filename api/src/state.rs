//! [`AppState`]: what the server (`http`) hands every endpoint handler (`routes`); its
//! own module so that neither of the two imports the other for it.

use crate::router::ModelRouter;

/// What every handler can see.
pub struct AppState {
    pub router: ModelRouter,
    /// When set, `/v1/*` requires `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
}

impl AppState {
    /// State serving `router`, with an optional API key.
    pub fn new(router: ModelRouter, api_key: Option<String>) -> Self {
        Self { router, api_key }
    }
}
