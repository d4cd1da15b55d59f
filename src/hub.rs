//! Models named by a Hugging Face repo id (`Qwen/Qwen3-0.6B`, `org/name-GGUF:Q4_K_M`)
//! rather than a path, resolved as vLLM resolves them: from the local Hugging Face cache
//! (`--download-dir`, `HF_HUB_CACHE`, `HF_HOME`), downloading into it through the `hf-hub`
//! crate when the hub is reachable, at `--revision`, with `HF_TOKEN`. With
//! `HF_HUB_OFFLINE=1` the network is never touched. A local path that exists always wins
//! over an id.
//!
//! [`resolve_model`] is the one place an id becomes a path: [`EngineBuilder::build`]
//! calls it (for the model and a draft model), so `serve`, a TOML entry and an embedding
//! program all resolve ids alike.
//!
//! ```no_run
//! use dcpserve::hub::{resolve_model, ModelSourceFlags};
//! let path = resolve_model("Qwen/Qwen3-0.6B".as_ref(), &ModelSourceFlags::default())?;
//! assert!(path.join("config.json").is_file());
//! # Ok::<(), dcpserve::Error>(())
//! ```
//!
//! [`EngineBuilder::build`]: crate::EngineBuilder::build

mod cache;
mod download;
mod files;
mod settings;

use std::path::{Path, PathBuf};

pub use dcpserve_config::ModelSourceFlags;
pub use settings::HubSettings;

use crate::error::{Error, Result};
use files::Selection;

/// What a model argument names: a local file or folder, or a repo on the hub.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSpec {
    /// A path that exists (or that cannot be an id: it is reported missing).
    Local(PathBuf),
    /// A Hugging Face repo id, with the GGUF file selector written after a colon.
    Hub(HubModelId),
}

/// A Hugging Face model repo id and the file of a GGUF repo to load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubModelId {
    /// `org/name`.
    pub repo: String,
    /// What follows `:` in `org/name:Q4_K_M` (a quantization or a `.gguf` file name).
    pub file: Option<String>,
}

impl ModelSpec {
    /// Reads a model argument: a path that exists is local; otherwise a string of the
    /// form `org/name[:FILE]` is a hub id, and anything else a (missing) local path.
    ///
    /// ```
    /// use dcpserve::hub::{HubModelId, ModelSpec};
    /// let id = ModelSpec::parse("unsloth/Qwen3-0.6B-GGUF:Q4_K_M".as_ref());
    /// assert_eq!(id, ModelSpec::Hub(HubModelId { repo: "unsloth/Qwen3-0.6B-GGUF".into(), file: Some("Q4_K_M".into()) }));
    /// assert!(matches!(ModelSpec::parse("no/such.gguf".as_ref()), ModelSpec::Local(_)));
    /// ```
    pub fn parse(spec: &Path) -> Self {
        if spec.exists() || !dcpserve_config::serve_file::looks_like_hub_id(spec) {
            return ModelSpec::Local(spec.to_path_buf());
        }
        let s = spec.to_str().unwrap_or_default();
        let (repo, file) = match s.split_once(':') {
            Some((repo, file)) => (repo, Some(file.to_string())),
            None => (s, None),
        };
        ModelSpec::Hub(HubModelId {
            repo: repo.to_string(),
            file,
        })
    }
}

/// The name a model is served under when none is given: a hub id as written
/// (`Qwen/Qwen3-0.6B`, as vLLM), else the file or folder name without `.gguf`.
///
/// ```
/// use dcpserve::hub::served_name;
/// assert_eq!(served_name("Qwen/Qwen3-0.6B".as_ref()), "Qwen/Qwen3-0.6B");
/// assert_eq!(served_name("models/SmolLM2.Q4_1.gguf".as_ref()), "SmolLM2.Q4_1");
/// assert_eq!(served_name("/data/Qwen2.5-0.5B".as_ref()), "Qwen2.5-0.5B");
/// ```
pub fn served_name(spec: &Path) -> String {
    if let ModelSpec::Hub(_) = ModelSpec::parse(spec) {
        return spec.to_string_lossy().into_owned();
    }
    let file = spec
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into());
    file.strip_suffix(".gguf")
        .map(str::to_string)
        .unwrap_or(file)
}

/// The local file or folder of the model `spec` names, with the hub's settings taken from
/// `flags` and the environment ([`HubSettings::from_env`]). A local path is returned as it
/// is (or refused when it does not exist); a hub id is looked up in the cache and
/// downloaded into it when needed (blocking: call it off async threads).
pub fn resolve_model(spec: &Path, flags: &ModelSourceFlags) -> Result<PathBuf> {
    match ModelSpec::parse(spec) {
        ModelSpec::Local(path) => {
            if path.exists() {
                Ok(path)
            } else {
                Err(Error::ModelLoading(format!(
                    "Model path {} does not exist.",
                    path.display()
                )))
            }
        }
        ModelSpec::Hub(id) => resolve_hub_model(&id, &HubSettings::from_env(flags)),
    }
}

/// The local path of the hub model `id` under `settings`: the cached snapshot when the
/// hub is not to be (or cannot be) reached, else the hub's current files of the revision,
/// downloading what the cache lacks.
pub fn resolve_hub_model(id: &HubModelId, settings: &HubSettings) -> Result<PathBuf> {
    let selector = match (&id.file, &settings.gguf_file) {
        (Some(a), Some(b)) if a != b => {
            return Err(Error::Config(format!(
            "The model `{}:{a}` names a GGUF file and --gguf-file names another ({b}): give one.",
            id.repo
        )))
        }
        (Some(f), _) | (None, Some(f)) => Some(f.as_str()),
        (None, None) => None,
    };
    let hub_error = if settings.offline {
        "HF_HUB_OFFLINE is set, so it is not downloaded".to_string()
    } else {
        match download::fetch(&id.repo, selector, settings) {
            Ok(path) => return Ok(path),
            Err(download::FetchError::Fatal(e)) => return Err(e),
            Err(download::FetchError::Unreachable(why)) => {
                tracing::warn!(repo = %id.repo, "the Hugging Face hub cannot be reached ({why}); looking in the cache");
                format!("the Hugging Face hub cannot be reached ({why})")
            }
        }
    };
    from_cache(id, selector, settings, &hub_error)
}

/// The model's path in the cache, or the error saying what was searched and missed.
fn from_cache(
    id: &HubModelId,
    selector: Option<&str>,
    settings: &HubSettings,
    hub_error: &str,
) -> Result<PathBuf> {
    let repo_dir = cache::repo_dir(&settings.cache_dir, &id.repo);
    let missing = match cache::snapshot(&repo_dir, &settings.revision) {
        Err(why) => why,
        Ok(snapshot) => {
            let listing = cache::list_files(&snapshot);
            match files::select(&listing, selector) {
                Ok(Selection::Gguf(file)) => {
                    tracing::info!(repo = %id.repo, path = %snapshot.join(&file).display(), "from the Hugging Face cache");
                    return Ok(snapshot.join(file));
                }
                Ok(Selection::Folder(mut needed)) => {
                    // An interrupted download leaves the index without all its shards.
                    needed.extend(index_shards(&snapshot));
                    let absent: Vec<&String> = needed
                        .iter()
                        .filter(|f| !snapshot.join(f).is_file())
                        .collect();
                    if absent.is_empty() {
                        tracing::info!(repo = %id.repo, path = %snapshot.display(), "from the Hugging Face cache");
                        return Ok(snapshot);
                    }
                    format!(
                        "its snapshot {} lacks {}",
                        snapshot.display(),
                        join(absent.iter().map(|s| s.as_str()))
                    )
                }
                Err(why) => format!("in its snapshot {}: {why}", snapshot.display()),
            }
        }
    };
    let wanted = match selector {
        Some(f) => format!("the .gguf file matching `{f}`"),
        None => {
            "config.json, tokenizer.json and the *.safetensors weights (or a single .gguf file)"
                .to_string()
        }
    };
    Err(Error::ModelLoading(format!(
        "The model `{repo}` (revision {rev}) is not a local path, and it is not in the Hugging Face cache \
         {cache} ({missing}); {hub_error}. It needs {wanted}. Download it where the hub is reachable \
         (`huggingface-cli download {repo}`), or point HF_HUB_CACHE, HF_HOME or --download-dir at the \
         cache that holds it.",
        repo = id.repo,
        rev = settings.revision,
        cache = settings.cache_dir.display(),
    )))
}

/// The shard files a snapshot's `model.safetensors.index.json` names (none without one).
fn index_shards(snapshot: &Path) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(snapshot.join("model.safetensors.index.json")) else {
        return Vec::new();
    };
    let Ok(index) = serde_json::from_str::<serde_json::Value>(&text) else {
        return Vec::new();
    };
    let mut shards: Vec<String> = index["weight_map"]
        .as_object()
        .map(|m| {
            m.values()
                .filter_map(|v| v.as_str())
                .filter(|f| !f.contains('/'))
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    shards.sort();
    shards.dedup();
    shards
}

fn join<'a>(items: impl Iterator<Item = &'a str>) -> String {
    items.collect::<Vec<_>>().join(", ")
}
