//! The RoPE keys of a Hugging Face `config.json`, in either spelling: the classic top-level
//! `rope_theta` and `rope_scaling`, or transformers 5's `rope_parameters` (one object with
//! `rope_type`, `rope_theta` and the scaling's own fields). Configs re-saved across versions
//! may carry both; they must then say the same thing, or loading fails naming both keys.

use std::fmt::Debug;
use std::path::Path;

use serde_json::{Map, Value};

use crate::config_keys::ConfigKeys;
use crate::error::ModelError;

/// Base period used when a config names none (transformers' default for every architecture
/// loaded here).
const DEFAULT_ROPE_THETA: f64 = 10000.0;

/// An optional object-valued key: absent or `null` is `None`, anything but an object is an
/// error.
fn object_key<'a>(
    path: &Path,
    obj: &'a Map<String, Value>,
    key: &str,
) -> Result<Option<&'a Map<String, Value>>, ModelError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(m)) => Ok(Some(m)),
        Some(v) => Err(ModelError::config(
            path,
            format!("{key} should be an object, found {v}"),
        )),
    }
}

/// `rope_parameters`, refusing the per-attention-type form (`{"full_attention": {...},
/// "sliding_attention": {...}}`) that no architecture loaded here uses, and a partial
/// rotation the forward passes do not implement.
fn rope_parameters<'a>(
    path: &Path,
    obj: &'a Map<String, Value>,
) -> Result<Option<&'a Map<String, Value>>, ModelError> {
    let Some(params) = object_key(path, obj, "rope_parameters")? else {
        return Ok(None);
    };
    let flat = ["rope_type", "type", "rope_theta"]
        .iter()
        .any(|k| params.contains_key(*k));
    if !flat && params.values().any(Value::is_object) {
        let kinds: Vec<&str> = params.keys().map(String::as_str).collect();
        return Err(ModelError::unsupported(
            path,
            format!(
                "rope_parameters per attention type ({}); expected one object with rope_type and rope_theta",
                kinds.join(", ")
            ),
        ));
    }
    let keys = ConfigKeys { path, obj: params };
    if let Some(fraction) = keys.f64_opt("partial_rotary_factor")? {
        if fraction != 1.0 {
            return Err(ModelError::unsupported(
                path,
                format!("rope_parameters.partial_rotary_factor {fraction} (only full rotation is implemented)"),
            ));
        }
    }
    Ok(Some(params))
}

/// The RoPE base period: `rope_parameters.rope_theta` or the top-level `rope_theta`
/// (10000 when neither is given). Both given and different is an error.
pub(crate) fn rope_theta(path: &Path, obj: &Map<String, Value>) -> Result<f64, ModelError> {
    let top = ConfigKeys { path, obj }.f64_opt("rope_theta")?;
    let nested = match rope_parameters(path, obj)? {
        Some(p) => ConfigKeys { path, obj: p }.f64_opt("rope_theta")?,
        None => None,
    };
    match (top, nested) {
        (Some(a), Some(b)) if a != b => Err(ModelError::config(
            path,
            format!("rope_theta {a} and rope_parameters.rope_theta {b} disagree"),
        )),
        (a, b) => Ok(b.or(a).unwrap_or(DEFAULT_ROPE_THETA)),
    }
}

/// The RoPE scaling, parsed by `parse` from the object that describes it: the classic
/// `rope_scaling`, or `rope_parameters` (`None` when there is neither). When a config has
/// both, both are parsed and must give the same result.
///
/// `parse` receives the object's keys and its scaling type (`rope_type`, or the older
/// `type`; `"default"` when absent).
pub(crate) fn rope_scaling<T: PartialEq + Debug>(
    path: &Path,
    obj: &Map<String, Value>,
    parse: impl Fn(&ConfigKeys, &str) -> Result<T, ModelError>,
) -> Result<Option<T>, ModelError> {
    let parse_object = |m: &Map<String, Value>| {
        let keys = ConfigKeys { path, obj: m };
        let ty = keys
            .str_opt("rope_type")
            .or(keys.str_opt("type"))
            .unwrap_or("default")
            .to_string();
        parse(&keys, &ty)
    };
    let legacy = object_key(path, obj, "rope_scaling")?
        .map(parse_object)
        .transpose()?;
    let current = rope_parameters(path, obj)?.map(parse_object).transpose()?;
    match (legacy, current) {
        (Some(a), Some(b)) if a != b => Err(ModelError::config(
            path,
            format!("rope_scaling ({a:?}) and rope_parameters ({b:?}) disagree"),
        )),
        (a, b) => Ok(b.or(a)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    fn ty_and_factor(k: &ConfigKeys, ty: &str) -> Result<(String, Option<f64>), ModelError> {
        Ok((ty.to_string(), k.f64_opt("factor")?))
    }

    #[test]
    fn theta_from_either_key_and_contradictions() {
        let p = Path::new("config.json");
        let theta = |v: Value| rope_theta(p, &obj(v));
        assert_eq!(theta(json!({})).unwrap(), 10000.0);
        assert_eq!(theta(json!({"rope_theta": 5e5})).unwrap(), 5e5);
        assert_eq!(
            theta(json!({"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}})).unwrap(),
            1e6
        );
        assert_eq!(
            theta(json!({"rope_theta": 1e6, "rope_parameters": {"rope_theta": 1e6}})).unwrap(),
            1e6
        );
        let e = theta(json!({"rope_theta": 1e4, "rope_parameters": {"rope_theta": 1e6}}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("disagree") && e.contains("config.json"), "{e}");
    }

    #[test]
    fn scaling_from_either_key_and_contradictions() {
        let p = Path::new("config.json");
        let scaling = |v: Value| rope_scaling(p, &obj(v), ty_and_factor);
        assert_eq!(scaling(json!({"rope_theta": 1e4})).unwrap(), None);
        let want = Some(("linear".to_string(), Some(2.0)));
        assert_eq!(
            scaling(json!({"rope_scaling": {"type": "linear", "factor": 2.0}})).unwrap(),
            want
        );
        assert_eq!(
            scaling(json!({"rope_parameters": {"rope_type": "linear", "factor": 2.0}})).unwrap(),
            want
        );
        assert_eq!(
            scaling(json!({"rope_scaling": {"type": "linear", "factor": 2.0},
                "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}))
            .unwrap(),
            want
        );
        let e = scaling(json!({"rope_scaling": {"type": "linear", "factor": 2.0},
            "rope_parameters": {"rope_type": "linear", "factor": 4.0}}))
        .unwrap_err()
        .to_string();
        assert!(e.contains("disagree"), "{e}");
    }

    #[test]
    fn refuses_nested_partial_and_non_object_parameters() {
        let p = Path::new("config.json");
        for (v, needle) in [
            (
                json!({"rope_parameters": {"full_attention": {"rope_type": "default"},
                    "sliding_attention": {"rope_type": "default"}}}),
                "per attention type",
            ),
            (
                json!({"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}}),
                "partial_rotary_factor",
            ),
            (json!({"rope_parameters": 3}), "should be an object"),
            (json!({"rope_scaling": "yarn"}), "should be an object"),
        ] {
            let o = obj(v);
            let e = rope_theta(p, &o)
                .map(|_| ())
                .and_then(|_| rope_scaling(p, &o, ty_and_factor).map(|_| ()))
                .unwrap_err()
                .to_string();
            assert!(e.contains(needle), "{e}");
        }
    }
}
