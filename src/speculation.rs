//! Checking `--speculative-config` against the target model and opening a draft model,
//! before any weight is read.

use std::sync::Arc;

use dcpserve_config::{EngineConfig, SpeculativeMethod};
use dcpserve_model::{ModelConfig, ModelFiles};

use crate::blocking::blocking;
use crate::error::{Error, Result};

/// The draft model's files when the config asks for `draft_model`; `None` otherwise.
/// Refuses methods and draft models that cannot work with this target.
pub(crate) async fn open_draft_model(
    config: &EngineConfig,
    target: &ModelConfig,
) -> Result<Option<Arc<ModelFiles>>> {
    let Some(spec) = &config.speculative else {
        return Ok(None);
    };
    match spec.method {
        // `mtp` runs the target's own MTP layer; the supervisor checks that it has one.
        SpeculativeMethod::Ngram | SpeculativeMethod::Mtp => Ok(None),
        SpeculativeMethod::DraftModel => {
            let path = spec
                .model
                .clone()
                .expect("normalized draft_model has a model");
            let p = path.clone();
            let draft = blocking(move || ModelFiles::read_config(&p))
                .await?
                .map_err(|e| Error::ModelLoading(format!("draft model: {e}")))?;
            if draft.vocab_size != target.vocab_size {
                return Err(Error::Config(format!(
                    "The draft model's vocabulary ({} tokens) differs from the target model's ({} tokens): draft_model needs the same tokenizer.",
                    draft.vocab_size,
                    target.vocab_size
                )));
            }
            spec.draft_parallel()
                .validate(draft.attention_kind(), config.block_size)
                .map_err(|e| Error::Config(format!("draft model: {e}")))?;
            let files = blocking(move || ModelFiles::open(&path))
                .await?
                .map_err(|e| Error::ModelLoading(format!("draft model: {e}")))?;
            Ok(Some(Arc::new(files)))
        }
    }
}
