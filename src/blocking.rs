//! Blocking file work (reading a model's config and weights) run off the async threads,
//! for the engine and the draft model alike.

use crate::error::{Error, Result};

/// Runs `f` on tokio's blocking pool and returns what it returns.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Internal(format!("a loading task failed: {e}")))
}
