//! Typed access to the keys of a `config.json` object, with errors that name the file
//! and the key. A JSON `null` counts as absent (transformers writes `null` for unset keys).

use std::path::Path;

use serde_json::{Map, Value};

use crate::error::ModelError;

/// One JSON object of a config file.
pub(crate) struct ConfigKeys<'a> {
    pub path: &'a Path,
    pub obj: &'a Map<String, Value>,
}

impl ConfigKeys<'_> {
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.obj.get(key).filter(|v| !v.is_null())
    }

    pub fn usize_opt(&self, key: &str) -> Result<Option<usize>, ModelError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| {
                    ModelError::config(
                        self.path,
                        format!("{key} should be a non-negative integer, found {v}"),
                    )
                }),
        }
    }

    pub fn usize(&self, key: &str) -> Result<usize, ModelError> {
        self.usize_opt(key)?
            .ok_or_else(|| ModelError::config(self.path, format!("missing {key}")))
    }

    pub fn f64_opt(&self, key: &str) -> Result<Option<f64>, ModelError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| {
                ModelError::config(self.path, format!("{key} should be a number, found {v}"))
            }),
        }
    }

    pub fn f32_opt(&self, key: &str) -> Result<Option<f32>, ModelError> {
        Ok(self.f64_opt(key)?.map(|x| x as f32))
    }

    pub fn bool_or(&self, key: &str, default: bool) -> Result<bool, ModelError> {
        match self.get(key) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => Err(ModelError::config(
                self.path,
                format!("{key} should be a bool, found {v}"),
            )),
        }
    }

    pub fn str_opt(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Value::as_str)
    }
}
