//! Routing by `model` and admission control: every served model has a bounded number of
//! outstanding sequences; a request that would exceed it is refused (429) up front instead
//! of queueing without bound.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::backend::ModelBackend;
use crate::errors::ApiError;
use crate::metrics::ModelSample;
use crate::tools::ChatSettings;
use dcpserve_config::SamplingDefaults;

/// One served model.
pub struct ModelSlot {
    /// The name clients put in `model`.
    pub name: String,
    pub backend: Arc<dyn ModelBackend>,
    /// Values for sampling fields a request leaves out.
    pub defaults: SamplingDefaults,
    /// Most sequences (running + waiting) admitted at once.
    pub max_outstanding: usize,
    /// When the model was loaded (`created` in `/v1/models`).
    pub created: u64,
    /// Tool-call and reasoning parsers of the model.
    pub chat: ChatSettings,
    outstanding: AtomicUsize,
}

impl ModelSlot {
    /// A slot that admits at most `max_outstanding` sequences at once.
    pub fn new(
        name: impl Into<String>,
        backend: Arc<dyn ModelBackend>,
        defaults: SamplingDefaults,
        max_outstanding: usize,
    ) -> Self {
        Self {
            name: name.into(),
            backend,
            defaults,
            max_outstanding,
            created: crate::types::unix_now(),
            chat: ChatSettings::default(),
            outstanding: AtomicUsize::new(0),
        }
    }

    /// The slot with these tool-call and reasoning settings.
    pub fn with_chat_settings(mut self, chat: ChatSettings) -> Self {
        self.chat = chat;
        self
    }

    /// Sequences admitted and not yet finished.
    pub fn outstanding(&self) -> usize {
        self.outstanding.load(Ordering::Relaxed)
    }

    /// Reserves room for `n` sequences, or answers 429 when the model is full (400 when
    /// `n` could never fit, so that a client does not retry forever).
    pub fn admit(self: &Arc<Self>, n: usize) -> Result<Permit, ApiError> {
        if n > self.max_outstanding {
            return Err(ApiError::invalid_param(
                "n",
                format!(
                    "The request asks for {n} sequences, but the model `{}` admits at most {} at once.",
                    self.name, self.max_outstanding
                ),
            ));
        }
        let mut cur = self.outstanding.load(Ordering::Relaxed);
        loop {
            if cur + n > self.max_outstanding {
                crate::metrics::rejected(&self.name);
                return Err(ApiError::overloaded(&self.name));
            }
            match self.outstanding.compare_exchange_weak(
                cur,
                cur + n,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(now) => cur = now,
            }
        }
        crate::metrics::set_outstanding(&self.name, cur + n);
        Ok(Permit {
            slot: self.clone(),
            n,
        })
    }
}

/// Room for some sequences of one model; released when dropped (response sent, stream
/// finished, or client gone).
pub struct Permit {
    slot: Arc<ModelSlot>,
    n: usize,
}

impl Drop for Permit {
    fn drop(&mut self) {
        let before = self.slot.outstanding.fetch_sub(self.n, Ordering::AcqRel);
        crate::metrics::set_outstanding(&self.slot.name, before.saturating_sub(self.n));
    }
}

/// The served models, in the order they were configured (the first is the default).
#[derive(Clone, Default)]
pub struct ModelRouter {
    models: Vec<Arc<ModelSlot>>,
}

impl ModelRouter {
    /// An empty router.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a model; names must be unique.
    pub fn add(&mut self, slot: ModelSlot) -> Result<(), String> {
        if self.models.iter().any(|m| m.name == slot.name) {
            return Err(format!("The model name `{}` is used twice.", slot.name));
        }
        self.models.push(Arc::new(slot));
        Ok(())
    }

    /// All models.
    pub fn models(&self) -> &[Arc<ModelSlot>] {
        &self.models
    }

    /// Every model's counters for `/metrics`; a model whose backend reports none is left out.
    pub async fn metrics_samples(&self) -> Vec<ModelSample> {
        let mut samples = Vec::with_capacity(self.models.len());
        for slot in &self.models {
            let Some(stats) = slot.backend.stats().await else {
                continue;
            };
            samples.push(ModelSample {
                name: slot.name.clone(),
                stats,
                outstanding: slot.outstanding(),
            });
        }
        samples
    }

    /// The model named `name`, or the first model when the request names none.
    pub fn get(&self, name: Option<&str>) -> Result<Arc<ModelSlot>, ApiError> {
        match name {
            None | Some("") => self
                .models
                .first()
                .cloned()
                .ok_or_else(|| ApiError::model_not_found("")),
            Some(n) => self
                .models
                .iter()
                .find(|m| m.name == n)
                .cloned()
                .ok_or_else(|| ApiError::model_not_found(n)),
        }
    }
}
