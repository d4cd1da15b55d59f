//! The embedded engine: one served model behind an async API.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use dcpserve_actors::{
    FinishReason, GenerationRequest, ModelInfo, ModelSupervisor, RequestEvent, SamplingParams,
    SchedulerMsg, SupervisorArgs, SupervisorMsg, TokenOutput, ValidPrompt, ValidRequest,
};
use dcpserve_config::{DType, EngineConfig};
use dcpserve_model::arch::WeightPrecision;
use dcpserve_model::{ChatMessage, IncrementalDecoder, ModelFiles, Tokenizer};
use futures::Stream;
use ractor::ActorRef;
use tokio::sync::mpsc;

use crate::blocking::blocking;
use crate::error::{Error, Result};

/// What to generate from.
#[derive(Debug, Clone)]
pub enum Prompt {
    /// Raw text, tokenized with the model's special-token rules (BOS when the model adds one).
    Text(String),
    /// Token ids as they are.
    Tokens(Vec<u32>),
    /// A conversation rendered through the model's chat template with a generation prompt.
    Chat(Vec<ChatMessage>),
}

/// One step of a generation stream.
#[derive(Debug, Clone, PartialEq)]
pub enum GenerationEvent {
    /// A new token and the text it completes (may be empty while a UTF-8 character is
    /// still incomplete).
    Token { token: TokenOutput, text: String },
    /// The end, with token counts.
    Finished {
        reason: FinishReason,
        prompt_tokens: usize,
        completion_tokens: usize,
    },
}

/// A finished generation.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    pub text: String,
    pub token_ids: Vec<u32>,
    pub finish_reason: FinishReason,
    pub prompt_tokens: usize,
}

/// An LLM served by an actor system (supervisor, scheduler, rank actors). Build one with
/// [`Engine::builder`] (the only way to start one).
///
/// ```no_run
/// # async fn demo() -> dcpserve::Result<()> {
/// use dcpserve::{Engine, Prompt, SamplingParams};
/// let engine = Engine::builder(dcpserve::default_model_path()).build().await?;
/// let mut params = SamplingParams::default();
/// params.max_tokens = 16;
/// params.temperature = 0.0;
/// let done = engine.complete(Prompt::Text("The capital of France is".into()), params).await?;
/// println!("{}", done.text);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

struct Inner {
    name: String,
    files: Arc<ModelFiles>,
    info: ModelInfo,
    supervisor: ActorRef<SupervisorMsg>,
    next_id: AtomicU64,
    speculates: bool,
    layout: dcpserve_kernels::dcp::Layout,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.supervisor.stop(Some("engine dropped".into()));
    }
}

fn precision(d: DType) -> WeightPrecision {
    match d {
        DType::Auto => WeightPrecision::Auto,
        DType::Float32 => WeightPrecision::F32,
        DType::Bfloat16 => WeightPrecision::BF16,
    }
}

impl Engine {
    /// Starts the engine a builder describes.
    pub(crate) async fn start(
        name: String,
        path: std::path::PathBuf,
        config: EngineConfig,
    ) -> Result<Self> {
        config.validate_limits()?;
        // A missing GPU driver is told before the model's files are opened.
        crate::device_check::check_device(config.rank_settings.device)?;
        // vLLM's defaults (e.g. n-gram sizes) are filled in once, here.
        let mut config = config;
        config.speculative = config.speculative.map(|s| s.normalized()).transpose()?;
        // The layout is checked against the model's shape before any weight is read.
        let config_path = path.clone();
        let mc = blocking(move || ModelFiles::read_config(&config_path))
            .await?
            .map_err(|e| Error::ModelLoading(e.to_string()))?;
        let layout = config.resolve_layout(mc.attention_kind())?;
        let draft = crate::speculation::open_draft_model(&config, &mc).await?;
        let files = blocking(move || ModelFiles::open(&path))
            .await?
            .map_err(|e| Error::ModelLoading(e.to_string()))?;
        let files = Arc::new(files);
        let speculates = config.speculative.is_some();
        let args = SupervisorArgs {
            name: name.clone(),
            files: files.clone(),
            precision: precision(config.dtype),
            engine: config,
            draft,
        };
        let (supervisor, _) = ractor::Actor::spawn(None, ModelSupervisor, args)
            .await
            .map_err(|e| Error::ModelLoading(spawn_error_text(e)))?;
        let info = ractor::call!(supervisor, SupervisorMsg::Info)
            .map_err(|e| Error::EngineStopped(format!("model supervisor: {e}")))?;
        Ok(Self {
            inner: Arc::new(Inner {
                name,
                files,
                info,
                supervisor,
                next_id: AtomicU64::new(1),
                speculates,
                layout,
            }),
        })
    }

    /// The parallel layout the model runs in: TP and DCP sizes, interleave, block size
    /// (which DCP rank stores each position: [`dcpserve_kernels::dcp::Layout::placement`]).
    pub fn layout(&self) -> &dcpserve_kernels::dcp::Layout {
        &self.inner.layout
    }

    /// Whether this engine decodes speculatively (`--speculative-config`).
    pub fn speculates(&self) -> bool {
        self.inner.speculates
    }

    /// The served model's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The model's tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.inner.files.tokenizer
    }

    /// The loaded model's files (config, tokenizer, chat template).
    pub fn files(&self) -> &ModelFiles {
        &self.inner.files
    }

    /// Longest prompt + output the engine accepts.
    pub fn max_model_len(&self) -> usize {
        self.inner.info.max_model_len
    }

    /// KV-cache capacity in tokens, per rank and in total.
    pub fn kv_capacity(&self) -> (usize, usize) {
        (
            self.inner.info.kv_tokens_per_rank,
            self.inner.info.kv_tokens_total,
        )
    }

    /// Renders a conversation with the model's chat template.
    pub fn render_chat(&self, messages: &[ChatMessage]) -> Result<String> {
        let t = self
            .inner
            .files
            .chat_template
            .as_ref()
            .ok_or_else(|| Error::InvalidRequest("This model has no chat template.".into()))?;
        t.render(messages, true)
            .map_err(|e| Error::InvalidRequest(e.to_string()))
    }

    /// Renders a chat-template context given as JSON (`messages` with tool calls, `tools`,
    /// `add_generation_prompt`, ...).
    pub fn render_chat_context(&self, context: &serde_json::Value) -> Result<String> {
        let t = self
            .inner
            .files
            .chat_template
            .as_ref()
            .ok_or_else(|| Error::InvalidRequest("This model has no chat template.".into()))?;
        t.render_json(context)
            .map_err(|e| Error::InvalidRequest(e.to_string()))
    }

    /// Token ids of a prompt.
    pub fn encode_prompt(&self, prompt: &Prompt) -> Result<Vec<u32>> {
        let tok = self.tokenizer();
        match prompt {
            Prompt::Tokens(t) => Ok(t.clone()),
            Prompt::Text(s) => tok
                .encode(s, true)
                .map_err(|e| Error::InvalidRequest(e.to_string())),
            // The template already writes the special tokens it wants.
            Prompt::Chat(m) => tok
                .encode(&self.render_chat(m)?, false)
                .map_err(|e| Error::InvalidRequest(e.to_string())),
        }
    }

    /// Starts a generation; dropping the stream aborts it and frees its KV blocks.
    pub fn generate(&self, prompt: Prompt, params: SamplingParams) -> Result<GenerationStream> {
        let ids = self.encode_prompt(&prompt)?;
        self.generate_ids(ids, params)
    }

    /// Starts a generation from token ids, checking them first.
    pub fn generate_ids(
        &self,
        prompt_ids: Vec<u32>,
        params: SamplingParams,
    ) -> Result<GenerationStream> {
        let prompt = self.validate_prompt(prompt_ids)?;
        self.generate_valid(ValidRequest::new(prompt, params))
    }

    /// Checks prompt token ids against this engine's model (not empty, in vocabulary).
    pub fn validate_prompt(&self, prompt_ids: Vec<u32>) -> Result<ValidPrompt> {
        Ok(ValidPrompt::new(
            prompt_ids,
            self.inner.files.config.vocab_size,
        )?)
    }

    /// Starts a generation of a request checked at the edge (the HTTP layer, or
    /// [`Engine::validate_prompt`]); its prompt is not checked again.
    pub fn generate_valid(&self, request: ValidRequest) -> Result<GenerationStream> {
        let (prompt_ids, params) = request.into_parts();
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::unbounded_channel();
        self.inner
            .info
            .scheduler
            .send_message(SchedulerMsg::Submit {
                request: GenerationRequest {
                    id,
                    prompt_ids: prompt_ids.clone(),
                    params,
                },
                events: tx,
            })
            .map_err(|_| {
                Error::EngineStopped(format!("The model `{}` is not running.", self.inner.name))
            })?;
        Ok(GenerationStream {
            id,
            rx,
            scheduler: self.inner.info.scheduler.clone(),
            decoder: IncrementalDecoder::with_prompt(&prompt_ids, true),
            files: self.inner.files.clone(),
            done: false,
        })
    }

    /// Generates to the end and returns the whole output.
    pub async fn complete(&self, prompt: Prompt, params: SamplingParams) -> Result<Completion> {
        use futures::StreamExt;
        let mut stream = self.generate(prompt, params)?;
        let mut text = String::new();
        let mut token_ids = Vec::new();
        while let Some(ev) = stream.next().await {
            match ev? {
                GenerationEvent::Token { token, text: t } => {
                    token_ids.push(token.token_id);
                    text.push_str(&t);
                }
                GenerationEvent::Finished {
                    reason,
                    prompt_tokens,
                    ..
                } => {
                    return Ok(Completion {
                        text,
                        token_ids,
                        finish_reason: reason,
                        prompt_tokens,
                    })
                }
            }
        }
        Err(Error::EngineStopped(
            "The generation ended without finishing.".into(),
        ))
    }

    /// Scheduler counters (running, waiting, free blocks, preemptions).
    pub async fn stats(&self) -> Result<dcpserve_actors::SchedulerStats> {
        ractor::call!(self.inner.info.scheduler, SchedulerMsg::Stats).map_err(stopped)
    }

    /// The sequences the scheduler holds and the KV each has stored, running ones first.
    /// Cheap: the scheduler answers from its own state between steps.
    pub async fn sequences(&self) -> Result<Vec<dcpserve_actors::SequenceKv>> {
        ractor::call!(self.inner.info.scheduler, SchedulerMsg::Sequences).map_err(stopped)
    }

    /// Seconds each rank of the current group has spent inside collectives (waiting
    /// for its peers included) since the group started.
    pub async fn seconds_in_collectives(&self) -> Result<Vec<f64>> {
        ractor::call!(self.inner.supervisor, SupervisorMsg::SecondsInCollectives).map_err(stopped)
    }

    /// Diagnostic: what each rank's KV cache has stored since the rank group started, in
    /// rank order (token rows written per layer — latent caches only — and bytes per
    /// token). Under DCP each rank of a group holds only its share of every sequence.
    pub async fn kv_storage_per_rank(&self) -> Result<Vec<dcpserve_model::arch::KvStorage>> {
        ractor::call!(self.inner.supervisor, SupervisorMsg::KvStorage).map_err(stopped)
    }

    /// Test hook: makes rank `n` fail on its next step (the supervisor restarts the group).
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn inject_rank_fault(&self, n: usize) -> Result<()> {
        self.inner
            .supervisor
            .send_message(SupervisorMsg::InjectFault(n))
            .map_err(stopped)
    }

    /// Test hook: makes rank `n` of the draft model's rank group fail on its next step
    /// (the draft proposer restarts its group; decoding goes on).
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn inject_draft_rank_fault(&self, n: usize) -> Result<()> {
        self.inner
            .supervisor
            .send_message(SupervisorMsg::InjectDraftFault(n))
            .map_err(stopped)
    }
}

/// A call to an actor that is gone.
fn stopped(e: impl std::fmt::Display) -> Error {
    Error::EngineStopped(e.to_string())
}

fn spawn_error_text(e: ractor::SpawnErr) -> String {
    match e {
        ractor::SpawnErr::StartupFailed(inner) => inner.to_string(),
        other => other.to_string(),
    }
}

/// Tokens of one generation as they are produced. Dropping it aborts the request.
pub struct GenerationStream {
    id: u64,
    rx: mpsc::UnboundedReceiver<RequestEvent>,
    scheduler: ActorRef<SchedulerMsg>,
    decoder: IncrementalDecoder,
    files: Arc<ModelFiles>,
    done: bool,
}

impl GenerationStream {
    /// The request id the scheduler knows this generation by.
    pub fn request_id(&self) -> u64 {
        self.id
    }
}

impl Stream for GenerationStream {
    type Item = Result<GenerationEvent>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        match self.rx.poll_recv(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(None) => {
                self.done = true;
                Poll::Ready(Some(Err(Error::EngineStopped(
                    "The model stopped before finishing this request.".into(),
                ))))
            }
            Poll::Ready(Some(ev)) => Poll::Ready(Some(match ev {
                RequestEvent::Token(token) => {
                    let this = &mut *self;
                    let text = this
                        .decoder
                        .push(&this.files.tokenizer, &[token.token_id])
                        .unwrap_or_default();
                    Ok(GenerationEvent::Token { token, text })
                }
                RequestEvent::Finished {
                    reason,
                    prompt_tokens,
                    completion_tokens,
                } => {
                    self.done = true;
                    Ok(GenerationEvent::Finished {
                        reason,
                        prompt_tokens,
                        completion_tokens,
                    })
                }
                RequestEvent::Error(e) => {
                    self.done = true;
                    Err(Error::from_scheduler(e))
                }
            })),
        }
    }
}

impl Drop for GenerationStream {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.scheduler.send_message(SchedulerMsg::Abort(self.id));
        }
    }
}
