//! The on-disk cache the emulated NVRTC compiles into and module images are written to:
//! its folder, content-hash keys, and writes that never expose a half-written file.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// 128-bit FNV-1a (two 64-bit lanes with different offsets), enough for a cache key.
pub(crate) fn hash_hex(parts: &[&[u8]]) -> String {
    let mut a: u64 = 0xcbf2_9ce4_8422_2325;
    let mut b: u64 = 0x6c62_272e_07bb_0142;
    for p in parts {
        for &x in p.iter().chain(&(p.len() as u64).to_le_bytes()) {
            a = (a ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3);
            b = (b ^ u64::from(x)).wrapping_mul(0x0000_0100_0000_01b3 ^ 0x10);
        }
    }
    format!("{a:016x}{b:016x}")
}

/// `$DCPEMU_CACHE_DIR`, else `$TMPDIR/dcpemu-cache`, else `/tmp/dcpemu-cache`.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("DCPEMU_CACHE_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    std::env::var_os("TMPDIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp"))
        .join("dcpemu-cache")
}

/// A name suffix no other writer (thread or process) uses at the same time.
pub(crate) fn unique_suffix() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "tmp{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Writes `text` to `path` unless it is there already (via a temporary and a rename, so
/// concurrent writers of the same content never expose a half-written file).
pub(crate) fn write_once(path: &Path, text: &[u8]) -> Result<(), String> {
    if path.exists() {
        return Ok(());
    }
    let tmp = PathBuf::from(format!("{}.{}", path.display(), unique_suffix()));
    std::fs::write(&tmp, text).map_err(|e| format!("writing {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("renaming to {}: {e}", path.display()))
}
