//! Reading JSON side files (`config.json`, `tokenizer_config.json`, index files, ...).
//!
//! A leaf module so that every loader can read JSON without depending on another loader.

use std::path::Path;

use serde_json::Value;

use crate::error::ModelError;

/// Reads and parses a JSON file, mapping every failure to an error naming it.
pub(crate) fn read_json(path: &Path) -> Result<Value, ModelError> {
    let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| ModelError::corrupt(path, format!("invalid JSON: {e}")))
}

/// Like [`read_json`], but `Ok(None)` when the file does not exist.
pub(crate) fn read_json_opt(path: &Path) -> Result<Option<Value>, ModelError> {
    if path.is_file() {
        read_json(path).map(Some)
    } else {
        Ok(None)
    }
}
