//! What can go wrong in the embedded engine's API, by cause, so that a caller can tell a
//! request it should fix from a model that did not load or an engine that went away.

use dcpserve_actors::PromptError;
use dcpserve_config::ConfigError;

/// The error of every fallible [`crate::Engine`] call. Its `Display` is the message
/// alone (what the HTTP layer and the command line show), the variant says the cause.
///
/// ```no_run
/// # async fn demo() {
/// use dcpserve::{Engine, Error, Prompt};
/// let engine = Engine::builder(dcpserve::default_model_path()).build().await.unwrap();
/// match engine.complete(Prompt::Tokens(vec![]), Default::default()).await {
///     Err(Error::InvalidRequest(why)) => eprintln!("fix the request: {why}"),
///     Err(other) => eprintln!("the engine failed: {other}"),
///     Ok(done) => println!("{}", done.text),
/// }
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The engine settings or the (tp, dcp) layout do not fit this model; checked before
    /// any weight is read.
    #[error("{0}")]
    Config(String),
    /// The model (or the draft model) could not be read, or its weights could not be
    /// brought onto the ranks.
    #[error("{0}")]
    ModelLoading(String),
    /// The request is refused as it is: empty prompt, token out of vocabulary, longer
    /// than the model or the KV cache allows, a chat without a template.
    #[error("{0}")]
    InvalidRequest(String),
    /// The engine no longer runs (its supervisor stopped), or a stream ended without an
    /// answer.
    #[error("{0}")]
    EngineStopped(String),
    /// A rank of the model's rank group failed while serving the request; the group is
    /// restarted, the request ends.
    #[error("{0}")]
    RankFailure(String),
    /// The model cannot serve now: its rank group is lost for good (a rank process of an
    /// MPI job died) and every request, queued or new, ends with this until it is restarted.
    #[error("{0}")]
    Unavailable(String),
    /// An internal call failed in a way none of the above describes.
    #[error("{0}")]
    Internal(String),
}

/// The result of the engine's API.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<ConfigError> for Error {
    fn from(e: ConfigError) -> Self {
        Error::Config(e.0)
    }
}

impl From<PromptError> for Error {
    fn from(e: PromptError) -> Self {
        Error::InvalidRequest(e.to_string())
    }
}

use dcpserve_actors::scheduler::{MODEL_CANNOT_SERVE, RANK_GROUP_FAILED};

impl Error {
    /// The error of a request the scheduler answered with `message`. The scheduler
    /// refuses requests at admission (they can never fit, or the model cannot serve) and
    /// ends running ones when their rank group fails; the latter two begin with the
    /// scheduler's fixed wording.
    pub(crate) fn from_scheduler(message: String) -> Self {
        if message.starts_with(RANK_GROUP_FAILED) {
            Error::RankFailure(message)
        } else if message.starts_with(MODEL_CANNOT_SERVE) {
            Error::Unavailable(message)
        } else {
            Error::InvalidRequest(message)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scheduler_messages_keep_their_cause() {
        let lost = format!("{MODEL_CANNOT_SERVE}: rank process 1 was lost");
        assert!(matches!(Error::from_scheduler(lost), Error::Unavailable(_)));
        let failed = format!("{RANK_GROUP_FAILED} while serving this request: rank 0 panicked");
        assert!(matches!(
            Error::from_scheduler(failed),
            Error::RankFailure(_)
        ));
        let refused = "The prompt is empty.".to_string();
        assert!(matches!(
            Error::from_scheduler(refused),
            Error::InvalidRequest(_)
        ));
    }
}
