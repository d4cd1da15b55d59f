//! Reading the hub cache as `huggingface_hub` and the `hf-hub` crate lay it out:
//!
//! ```text
//! CACHE/models--ORG--NAME/refs/main            the commit of branch or tag `main`
//!                        /snapshots/COMMIT/... the repo's files at COMMIT (links into blobs/)
//!                        /blobs/ETAG           the files' contents
//! ```

use std::path::{Path, PathBuf};

/// `CACHE/models--ORG--NAME`, named by the `hf-hub` crate's own rule.
pub(super) fn repo_dir(cache: &Path, repo: &str) -> PathBuf {
    cache.join(hf_hub::Repo::model(repo.to_string()).folder_name())
}

/// The snapshot folder of `revision`: the commit its ref names, or the revision itself
/// when it is a commit; `Err` says what is missing.
pub(super) fn snapshot(repo_dir: &Path, revision: &str) -> Result<PathBuf, String> {
    if !repo_dir.is_dir() {
        return Err(format!("no folder {}", repo_dir.display()));
    }
    let snapshots = repo_dir.join("snapshots");
    let ref_file = repo_dir.join("refs").join(revision);
    if let Ok(commit) = std::fs::read_to_string(&ref_file) {
        let dir = snapshots.join(commit.trim());
        return if dir.is_dir() {
            Ok(dir)
        } else {
            Err(format!(
                "{} names commit {}, whose snapshot is missing",
                ref_file.display(),
                commit.trim()
            ))
        };
    }
    let dir = snapshots.join(revision);
    if is_commit(revision) && dir.is_dir() {
        return Ok(dir);
    }
    Err(format!(
        "no {} and no snapshot of that name",
        ref_file.display()
    ))
}

/// Whether `revision` is a full commit hash (the hub's snapshot folder names).
fn is_commit(revision: &str) -> bool {
    revision.len() == 40 && revision.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The files of a snapshot (links followed), as paths relative to it with `/`, two
/// folder levels deep at most (GGUF repos put quantizations in subfolders).
pub(super) fn list_files(snapshot: &Path) -> Vec<String> {
    let mut out = Vec::new();
    walk(snapshot, "", 0, &mut out);
    out.sort();
    out
}

fn walk(dir: &Path, prefix: &str, depth: usize, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        let rel = format!("{prefix}{name}");
        if path.is_file() {
            out.push(rel);
        } else if path.is_dir() && depth < 2 {
            walk(&path, &format!("{rel}/"), depth + 1, out);
        }
    }
}
