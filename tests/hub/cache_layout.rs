//! A Hugging Face cache folder built from the fixtures, laid out as the hub's clients
//! (`huggingface_hub`, the `hf-hub` crate) lay it out:
//!
//! ```text
//! ROOT/models--ORG--NAME/blobs/ETAG                      the contents
//!                       /snapshots/COMMIT/FILE -> ../../blobs/ETAG
//!                       /refs/REVISION                   the COMMIT (no newline)
//! ```
//! Shared by the engine's tests (tests/hub_cache.rs) and the command line's.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// A cache root in a temporary folder, removed when dropped.
pub struct FakeCache {
    pub root: PathBuf,
}

impl FakeCache {
    /// An empty cache folder named after `tag` (unique per test and process).
    pub fn new(tag: &str) -> Self {
        let root = std::env::temp_dir().join(format!("dcpserve-hf-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        Self { root }
    }

    /// The folder of `repo` (`models--ORG--NAME`).
    pub fn repo_dir(&self, repo: &str) -> PathBuf {
        self.root
            .join(format!("models--{}", repo.replace('/', "--")))
    }

    /// Adds the snapshot `commit` of `repo` holding `files` (name in the repo, fixture
    /// file), with `refs` pointing at it.
    pub fn add_snapshot(&self, repo: &str, commit: &str, files: &[(&str, PathBuf)], refs: &[&str]) {
        let dir = self.repo_dir(repo);
        let blobs = dir.join("blobs");
        std::fs::create_dir_all(&blobs).unwrap();
        for (name, source) in files {
            let bytes = std::fs::read(source)
                .unwrap_or_else(|e| panic!("fixture {}: {e}", source.display()));
            let etag = etag(&bytes);
            std::fs::write(blobs.join(&etag), &bytes).unwrap();
            let link = dir.join("snapshots").join(commit).join(name);
            std::fs::create_dir_all(link.parent().unwrap()).unwrap();
            // Relative, as the clients write them: up to the repo folder, then blobs/.
            let up = "../".repeat(name.matches('/').count() + 2);
            std::os::unix::fs::symlink(format!("{up}blobs/{etag}"), &link).unwrap();
        }
        for r in refs {
            let file = dir.join("refs").join(r);
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(file, commit).unwrap();
        }
    }
}

impl Drop for FakeCache {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// A stand-in for the hub's etag (a content hash): 64 hex digits of FNV-1a.
pub fn etag(bytes: &[u8]) -> String {
    let mut out = String::new();
    for seed in 0..4u64 {
        let mut h: u64 = 0xcbf29ce484222325 ^ seed;
        for b in bytes {
            h ^= *b as u64;
            h = h.wrapping_mul(0x100000001b3);
        }
        out.push_str(&format!("{h:016x}"));
    }
    out
}

/// The files of a fixture's Hugging Face folder as the hub holds them.
pub fn folder_files(fixture: &Path) -> Vec<(&'static str, PathBuf)> {
    [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    .into_iter()
    .map(|f| (f, fixture.join(f)))
    .collect()
}

/// Two 40-digit commit hashes.
pub const COMMIT_A: &str = "0123456789abcdef0123456789abcdef01234567";
pub const COMMIT_B: &str = "fedcba9876543210fedcba9876543210fedcba98";
