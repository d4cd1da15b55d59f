//! Step messages as bytes, the way they cross a process boundary.
//!
//! The encoding is JSON (`serde_json`, already a workspace dependency): no binary format
//! crate is needed for messages this size (a plan diff is a few hundred bytes; logits never
//! travel in the scheduler's steps), and floats round-trip exactly (shortest
//! representation that parses back to the same bits). JSON has no NaN or infinity: the
//! messages carry none (temperatures are validated, log-probabilities come from finite
//! logits).
//!
//! ```
//! use dcpserve_actors::plan::{wire, StepPlan};
//! let plan = StepPlan { step_id: 7, tokens: vec![1, 2], positions: vec![0, 1], ..Default::default() };
//! let bytes = wire::encode(&plan).unwrap();
//! assert_eq!(wire::decode::<StepPlan>(&bytes).unwrap(), plan);
//! ```

use serde::de::DeserializeOwned;
use serde::Serialize;

/// The bytes of `msg`.
pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, String> {
    serde_json::to_vec(msg).map_err(|e| format!("encoding a step message: {e}"))
}

/// The message in `bytes`.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    serde_json::from_slice(bytes).map_err(|e| format!("decoding a step message: {e}"))
}

/// `msg` after a trip through bytes, as a rank in another process would see it.
pub fn round_trip<T: Serialize + DeserializeOwned>(msg: &T) -> Result<T, String> {
    decode(&encode(msg)?)
}
