//! [`HubSettings`]: the flags of a hub model and the `HF_*` environment variables, read in
//! one place with the precedence `huggingface_hub` (and so vLLM) gives them.

use std::path::PathBuf;

use dcpserve_config::ModelSourceFlags;

/// How a hub model is looked up and fetched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubSettings {
    /// The hub cache root (`models--ORG--NAME/` folders live in it).
    pub cache_dir: PathBuf,
    /// Branch, tag or commit (`main` by default).
    pub revision: String,
    /// `--gguf-file`.
    pub gguf_file: Option<String>,
    /// `HF_HUB_OFFLINE`: the cache only, the network never.
    pub offline: bool,
    /// `HF_TOKEN`, else the token file `huggingface-cli login` writes.
    pub token: Option<String>,
    /// `HF_ENDPOINT` (default: the public hub).
    pub endpoint: Option<String>,
}

impl HubSettings {
    /// The settings from `flags` and this process's environment.
    ///
    /// ```
    /// use dcpserve::hub::{HubSettings, ModelSourceFlags};
    /// let flags = ModelSourceFlags { download_dir: Some("/data/hf".into()), ..Default::default() };
    /// let s = HubSettings::from_env(&flags);
    /// assert_eq!(s.cache_dir, std::path::Path::new("/data/hf"));
    /// assert_eq!(s.revision, "main");
    /// ```
    pub fn from_env(flags: &ModelSourceFlags) -> Self {
        Self::from_lookup(flags, |key| {
            std::env::var(key).ok().filter(|v| !v.trim().is_empty())
        })
    }

    /// The settings from `flags` and the variables `lookup` returns (tests pass their own).
    ///
    /// The cache is `--download-dir`, else `HF_HUB_CACHE` (or its old name
    /// `HUGGINGFACE_HUB_CACHE`), else `HF_HOME/hub`, else `XDG_CACHE_HOME/huggingface/hub`,
    /// else `~/.cache/huggingface/hub`.
    pub fn from_lookup(flags: &ModelSourceFlags, lookup: impl Fn(&str) -> Option<String>) -> Self {
        let home = || {
            lookup("HF_HOME").map(PathBuf::from).unwrap_or_else(|| {
                let cache = lookup("XDG_CACHE_HOME")
                    .map(PathBuf::from)
                    .unwrap_or_else(|| {
                        PathBuf::from(lookup("HOME").unwrap_or_else(|| ".".into())).join(".cache")
                    });
                cache.join("huggingface")
            })
        };
        let cache_dir = flags
            .download_dir
            .clone()
            .or_else(|| lookup("HF_HUB_CACHE").map(PathBuf::from))
            .or_else(|| lookup("HUGGINGFACE_HUB_CACHE").map(PathBuf::from))
            .unwrap_or_else(|| home().join("hub"));
        let truthy = |key: &str| {
            lookup(key).is_some_and(|v| {
                matches!(
                    v.trim().to_ascii_lowercase().as_str(),
                    "1" | "true" | "yes" | "on"
                )
            })
        };
        let token = lookup("HF_TOKEN")
            .or_else(|| lookup("HUGGING_FACE_HUB_TOKEN"))
            .or_else(|| {
                let file = lookup("HF_TOKEN_PATH")
                    .map(PathBuf::from)
                    .unwrap_or_else(|| home().join("token"));
                let text = std::fs::read_to_string(file).ok()?;
                Some(text.trim().to_string()).filter(|t| !t.is_empty())
            });
        Self {
            cache_dir,
            revision: flags.revision.clone().unwrap_or_else(|| "main".into()),
            gguf_file: flags.gguf_file.clone(),
            offline: truthy("HF_HUB_OFFLINE") || truthy("TRANSFORMERS_OFFLINE"),
            token,
            endpoint: lookup("HF_ENDPOINT"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(flags: &ModelSourceFlags, vars: &[(&str, &str)]) -> HubSettings {
        HubSettings::from_lookup(flags, |k| {
            vars.iter()
                .find(|(key, _)| *key == k)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn the_cache_folder_follows_huggingface_hub_s_precedence() {
        let none = ModelSourceFlags::default();
        let dir = |s: HubSettings| s.cache_dir;
        assert_eq!(
            dir(settings(&none, &[("HOME", "/home/u")])),
            PathBuf::from("/home/u/.cache/huggingface/hub")
        );
        assert_eq!(
            dir(settings(
                &none,
                &[("HOME", "/home/u"), ("XDG_CACHE_HOME", "/x")]
            )),
            PathBuf::from("/x/huggingface/hub")
        );
        assert_eq!(
            dir(settings(&none, &[("HOME", "/home/u"), ("HF_HOME", "/hf")])),
            PathBuf::from("/hf/hub")
        );
        let both = [("HF_HOME", "/hf"), ("HF_HUB_CACHE", "/cache")];
        assert_eq!(dir(settings(&none, &both)), PathBuf::from("/cache"));
        let flag = ModelSourceFlags {
            download_dir: Some("/flag".into()),
            ..Default::default()
        };
        assert_eq!(dir(settings(&flag, &both)), PathBuf::from("/flag"));
    }

    #[test]
    fn offline_revision_token_and_endpoint() {
        let none = ModelSourceFlags::default();
        let s = settings(&none, &[("HF_HOME", "/nonexistent-hf-home")]);
        assert!(!s.offline);
        assert_eq!(s.revision, "main");
        assert_eq!(s.token, None);
        assert_eq!(s.endpoint, None);
        for v in ["1", "true", "YES", "on"] {
            assert!(settings(&none, &[("HF_HUB_OFFLINE", v)]).offline, "{v}");
        }
        for v in ["0", "false", "no"] {
            assert!(!settings(&none, &[("HF_HUB_OFFLINE", v)]).offline, "{v}");
        }
        let flags = ModelSourceFlags {
            revision: Some("v2".into()),
            ..Default::default()
        };
        let s = settings(
            &flags,
            &[("HF_TOKEN", "hf_x"), ("HF_ENDPOINT", "http://127.0.0.1:9")],
        );
        assert_eq!(s.revision, "v2");
        assert_eq!(s.token.as_deref(), Some("hf_x"));
        assert_eq!(s.endpoint.as_deref(), Some("http://127.0.0.1:9"));
    }

    #[test]
    fn the_token_file_is_read_when_hf_token_is_unset() {
        let home = std::env::temp_dir().join(format!("dcpserve-hf-home-{}", std::process::id()));
        std::fs::create_dir_all(&home).unwrap();
        std::fs::write(home.join("token"), "hf_file\n").unwrap();
        let s = settings(
            &ModelSourceFlags::default(),
            &[("HF_HOME", home.to_str().unwrap())],
        );
        std::fs::remove_dir_all(&home).unwrap();
        assert_eq!(s.token.as_deref(), Some("hf_file"));
    }
}
