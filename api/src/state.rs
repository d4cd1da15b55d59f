//! [`AppState`]: what the server (`http`) hands every endpoint handler (`routes`); its
//! own module so that neither of the two imports the other for it.

use crate::engine_status::TokenRate;
use crate::router::ModelRouter;

/// What every handler can see.
pub struct AppState {
    pub router: ModelRouter,
    /// When set, `/v1/*` requires `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// Whether `GET /` serves the web page (`--no-web-ui` turns it off: 404).
    pub web_ui: bool,
    /// Token counters seen by `/v1/engine/status`, for its rates.
    pub token_rate: TokenRate,
}

impl AppState {
    /// State serving `router`, with an optional API key and the web page on.
    pub fn new(router: ModelRouter, api_key: Option<String>) -> Self {
        Self {
            router,
            api_key,
            web_ui: true,
            token_rate: TokenRate::default(),
        }
    }

    /// The same state with the web page on or off.
    pub fn with_web_ui(mut self, on: bool) -> Self {
        self.web_ui = on;
        self
    }
}
