//! Asking the hub for a revision's files and downloading what the cache lacks, through the
//! `hf-hub` crate's blocking client (which writes the cache in the hub's own layout).

use std::io::IsTerminal;
use std::path::PathBuf;

use hf_hub::api::sync::{ApiBuilder, ApiError};
use hf_hub::{Cache, Repo, RepoType};

use super::files::{self, Selection};
use super::{cache, HubSettings};
use crate::error::Error;

/// Why the hub did not give the model.
pub(super) enum FetchError {
    /// The hub answered, and the answer ends the attempt (no such repo, a gated repo
    /// without a token, no loadable file, a cache that cannot be written).
    Fatal(Error),
    /// The hub could not be reached (no network, DNS, a server error): the cache is
    /// looked at instead.
    Unreachable(String),
}

/// The local path of `repo` at the settings' revision, downloading the files its cached
/// snapshot lacks.
pub(super) fn fetch(
    repo: &str,
    selector: Option<&str>,
    s: &HubSettings,
) -> Result<PathBuf, FetchError> {
    let mut builder = ApiBuilder::from_cache(Cache::new(s.cache_dir.clone()))
        .with_token(s.token.clone())
        .with_progress(std::io::stderr().is_terminal());
    if let Some(endpoint) = &s.endpoint {
        builder = builder.with_endpoint(endpoint.clone());
    }
    let api = builder.build().map_err(|e| classify(e, repo, s))?;
    let hub_repo = Repo::with_revision(repo.to_string(), RepoType::Model, s.revision.clone());
    let api_repo = api.repo(hub_repo.clone());
    let info = api_repo.info().map_err(|e| classify(e, repo, s))?;
    let listing: Vec<String> = info.siblings.iter().map(|f| f.rfilename.clone()).collect();
    let selection = files::select(&listing, selector).map_err(|why| {
        FetchError::Fatal(Error::ModelLoading(format!(
            "The Hugging Face repo `{repo}` (revision {}) has no model dcpserve can load: {why}.",
            s.revision
        )))
    })?;
    let snapshot = cache::repo_dir(&s.cache_dir, repo)
        .join("snapshots")
        .join(&info.sha);
    let wanted = match &selection {
        Selection::Folder(files) => files.clone(),
        Selection::Gguf(file) => vec![file.clone()],
    };
    for file in &wanted {
        if snapshot.join(file).is_file() {
            continue;
        }
        tracing::info!(repo, file, revision = %s.revision, "downloading from the Hugging Face hub");
        api_repo.download(file).map_err(|e| classify(e, repo, s))?;
        // `download` asks for the revision again: had the branch moved meanwhile, the
        // file would sit in another snapshot than the others.
        if !snapshot.join(file).is_file() {
            return Err(FetchError::Fatal(Error::ModelLoading(format!(
                "The revision {} of `{repo}` changed while it was downloaded: run again.",
                s.revision
            ))));
        }
    }
    if s.revision != info.sha {
        Cache::new(s.cache_dir.clone())
            .repo(hub_repo)
            .create_ref(&info.sha)
            .map_err(|e| {
                FetchError::Fatal(Error::ModelLoading(format!(
                    "Cannot write the ref of `{repo}` into the Hugging Face cache {}: {e}",
                    s.cache_dir.display()
                )))
            })?;
    }
    Ok(match selection {
        Selection::Folder(_) => snapshot,
        Selection::Gguf(file) => snapshot.join(file),
    })
}

/// Sorts the client's errors into those that end the attempt and those that send it to
/// the cache.
fn classify(e: ApiError, repo: &str, s: &HubSettings) -> FetchError {
    match e {
        ApiError::RequestError(e) => match *e {
            ureq::Error::Status(code @ (401 | 403 | 404), _) => {
                FetchError::Fatal(Error::ModelLoading(format!(
                    "The Hugging Face hub has no model `{repo}` at revision {} that this client may \
                     read (HTTP {code}): check the id and --revision; a private or gated repo needs \
                     HF_TOKEN (and its terms accepted on the hub).",
                    s.revision
                )))
            }
            ureq::Error::Status(code, _) => FetchError::Unreachable(format!("HTTP {code}")),
            ureq::Error::Transport(t) => FetchError::Unreachable(t.to_string()),
        },
        ApiError::TooManyRetries(inner) => FetchError::Unreachable(inner.to_string()),
        ApiError::IoError(io) => FetchError::Fatal(Error::ModelLoading(format!(
            "Cannot download `{repo}` into the Hugging Face cache {}: {io}",
            s.cache_dir.display()
        ))),
        other => FetchError::Fatal(Error::ModelLoading(format!(
            "Downloading `{repo}` from the Hugging Face hub failed: {other}"
        ))),
    }
}
