//! Entry points of the fuzz targets in `fuzz/` for what clients and models send this layer:
//! request bodies (through the whole HTTP dispatch, with a stand-in model that has the tiny
//! fixture's real tokenizer, chat template and grammar engine) and model outputs read by
//! the tool-call and reasoning parsers. The unit tests below replay every input the
//! fuzzers ever found (`fuzz/regressions/<target>/`) in a plain `cargo test`.
//!
//! A malformed request must get a 4xx, never a panic or a 5xx; a parser must read any
//! output and keep its streaming promise (each snapshot extends the previous one).
//!
//! ```
//! dcpserve_api::fuzzing::request(b"\x00{\"messages\": 3}");
//! dcpserve_api::fuzzing::tool_output(b"\x00\x01<tool_call>{\"name\"");
//! ```

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use dcpserve_actors::{FinishReason, OutputConstraint, TokenOutput, ValidRequest};
use dcpserve_model::{ChatMessage, ChatTemplate, GrammarCompiler, Tokenizer};
use futures::future::BoxFuture;
use futures::StreamExt;
use warp::http::{HeaderMap, Method};

use crate::backend::{BackendError, BackendEvent, BackendStats, EventStream, ModelBackend};
use crate::chat_output::{OutputMode, OutputParser};
use crate::reasoning::{ReasoningParser, Split};
use crate::router::{ModelRouter, ModelSlot};
use crate::state::AppState;
use crate::tool_parsers::{assert_extends, Parsed, ToolParserKind};
use crate::tools::ChatSettings;

/// The tiny models' fixture folder (byte-level BPE of 384 tokens, ChatML template).
fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures/tiny-llama")
}

/// A stand-in model: real tokenizer, chat template and grammar engine; its "generation"
/// echoes the end of the prompt, so that the output parsers read request-controlled text.
struct EchoBackend {
    tokenizer: Tokenizer,
    template: ChatTemplate,
    grammar: GrammarCompiler,
}

impl ModelBackend for EchoBackend {
    fn max_model_len(&self) -> usize {
        512
    }
    fn vocab_size(&self) -> usize {
        self.tokenizer.vocab_size()
    }
    fn kv_capacity_tokens(&self) -> usize {
        4096
    }
    fn root(&self) -> String {
        "fuzz".into()
    }
    fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, String> {
        self.tokenizer
            .encode(text, add_special_tokens)
            .map_err(|e| e.to_string())
    }
    fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, String> {
        self.tokenizer
            .decode(ids, skip_special_tokens)
            .map_err(|e| e.to_string())
    }
    fn render_chat(&self, messages: &[ChatMessage]) -> Result<String, String> {
        self.template
            .render(messages, true)
            .map_err(|e| e.to_string())
    }
    fn render_chat_context(&self, context: &serde_json::Value) -> Result<String, String> {
        self.template
            .render_json(context)
            .map_err(|e| e.to_string())
    }
    fn check_constraint(&self, constraint: &OutputConstraint) -> Result<(), String> {
        self.grammar.check(constraint)
    }
    fn generate(&self, request: ValidRequest) -> Result<EventStream, BackendError> {
        let ids = request.prompt().ids();
        let max = request.params().max_tokens.min(24);
        let echo = &ids[ids.len().saturating_sub(max)..];
        let mut events: Vec<Result<BackendEvent, BackendError>> = echo
            .iter()
            .map(|&id| {
                Ok(BackendEvent::Token {
                    token: TokenOutput {
                        token_id: id,
                        logprob: Some(-1.0),
                        top_logprobs: vec![(id, -1.0)],
                        prompt_logprobs: None,
                    },
                    text: self.tokenizer.decode(&[id], false).unwrap_or_default(),
                })
            })
            .collect();
        events.push(Ok(BackendEvent::Finished {
            reason: if echo.len() == max {
                FinishReason::Length
            } else {
                FinishReason::Stop
            },
            prompt_tokens: ids.len(),
            completion_tokens: echo.len(),
        }));
        Ok(futures::stream::iter(events).boxed())
    }
    fn stats(&self) -> BoxFuture<'static, Option<BackendStats>> {
        Box::pin(async { Some(BackendStats::default()) })
    }
}

/// One server per chat setting: plain, and each tool-call parser with a reasoning parser.
fn states() -> &'static [Arc<AppState>] {
    static STATES: OnceLock<Vec<Arc<AppState>>> = OnceLock::new();
    STATES.get_or_init(|| {
        let dir = fixture_dir();
        let tokenizer = Tokenizer::from_hf_dir(&dir).expect("fixture tokenizer");
        let template =
            ChatTemplate::from_hf_dir(&dir, tokenizer.bos_token(), tokenizer.eos_token())
                .expect("fixture chat template")
                .expect("the fixture has a chat template");
        let grammar = GrammarCompiler::new(&tokenizer).expect("fixture grammar");
        let backend: Arc<dyn ModelBackend> = Arc::new(EchoBackend {
            tokenizer,
            template,
            grammar,
        });
        let settings = [
            Ok(ChatSettings::default()),
            ChatSettings::from_names(Some("hermes"), true, Some("qwen3")),
            ChatSettings::from_names(Some("llama3_json"), true, None),
            ChatSettings::from_names(Some("deepseek_v3"), true, Some("deepseek_r1")),
        ];
        settings
            .into_iter()
            .map(|s| {
                let mut router = ModelRouter::new();
                let slot = ModelSlot::new("fuzz", backend.clone(), Default::default(), 1 << 16)
                    .with_chat_settings(s.expect("known parser names"));
                router.add(slot).expect("one model");
                Arc::new(AppState::new(router, None))
            })
            .collect()
    })
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime")
    })
}

const PATHS: [&str; 4] = [
    "/v1/chat/completions",
    "/v1/completions",
    "/tokenize",
    "/detokenize",
];

/// A request body: `data[0]` picks the server's chat settings (bits 0-1) and the endpoint
/// (bits 2-3); the rest is the body, sent through the HTTP dispatch and read to its end
/// (streams included). Anything but a 2xx or 4xx answer panics.
pub fn request(data: &[u8]) {
    let Some((&sel, body)) = data.split_first() else {
        return;
    };
    let states = states();
    let state = &states[(sel & 3) as usize % states.len()];
    let path = PATHS[(sel >> 2 & 3) as usize];
    let chunk = Ok::<_, warp::Error>(bytes::Bytes::copy_from_slice(body));
    runtime().block_on(async {
        let response = crate::http::dispatch(
            state,
            Method::POST,
            path,
            &HeaderMap::new(),
            futures::stream::iter([chunk]),
        )
        .await;
        let status = response.status();
        assert!(
            status.is_success() || status.is_client_error(),
            "{path} answered {status}"
        );
        let mut body = std::pin::pin!(response.into_body());
        while let Some(frame) =
            std::future::poll_fn(|cx| warp::hyper::body::Body::poll_frame(body.as_mut(), cx)).await
        {
            if frame.is_err() {
                break;
            }
        }
    });
}

fn assert_split_extends(a: &Split, b: &Split, at: &str) {
    assert!(
        b.reasoning.starts_with(&a.reasoning) && b.content.starts_with(&a.content),
        "{a:?} -> {b:?} at {at:?}"
    );
}

/// A model output: `data[0]` picks the tool-call parser (bits 0-1), the reasoning parser
/// (bits 2-3) and whether the prompt opened `<think>` (bit 4); `data[1]` the chunk size;
/// the rest is the text. Each parser's snapshots of growing prefixes must extend one
/// another and end with the parse of the whole (or, for a malformed call block, the
/// whole text as content); the chat output reader must take the chunks and finish.
pub fn tool_output(data: &[u8]) {
    let (Some(&sel), Some(&step)) = (data.first(), data.get(1)) else {
        return;
    };
    let text = String::from_utf8_lossy(&data[2..]);
    let step = step as usize % 16 + 1;
    let cuts: Vec<usize> = (step..text.len())
        .step_by(step)
        .filter(|&c| text.is_char_boundary(c))
        .collect();

    let kinds = [
        ToolParserKind::Hermes,
        ToolParserKind::Llama3Json,
        ToolParserKind::DeepSeekV3,
    ];
    let kind = kinds.get((sel & 3) as usize).copied();
    if let Some(kind) = kind {
        let p = kind.parser();
        let mut last = Parsed::default();
        for &c in &cuts {
            let snap = p.parse(&text[..c], false);
            assert_extends(&last, &snap, &text[..c]);
            last = snap;
        }
        // The end either extends the last snapshot or, for an output whose call block
        // turns out malformed, is the whole text as content (the documented fallback, as
        // vLLM's; the stream then sends nothing more for the fields it contradicts).
        let whole = p.parse(&text, true);
        if whole != Parsed::content_only(&text) {
            assert_extends(&last, &whole, &text);
        }
    }

    let reasoners = [ReasoningParser::DeepSeekR1, ReasoningParser::Qwen3];
    let reasoning = reasoners.get((sel >> 2 & 3) as usize).copied();
    let in_thinking = sel & 16 != 0;
    if let Some(r) = reasoning {
        let mut last = Split::default();
        for &c in &cuts {
            let snap = r.split(&text[..c], in_thinking, false);
            assert_split_extends(&last, &snap, &text[..c]);
            last = snap;
        }
        assert_split_extends(&last, &r.split(&text, in_thinking, true), &text);
    }

    let mode = OutputMode {
        reasoning: reasoning.map(|r| (r, in_thinking)),
        tools: kind.map(|k| Arc::from(k.parser())),
    };
    let mut streamed = OutputParser::new(mode);
    let mut start = 0;
    for &c in cuts.iter().chain(std::iter::once(&text.len())) {
        streamed.push(&text[start..c], c == text.len());
        start = c;
    }
    let _ = streamed.finish();
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    fn replay(target: &str, run: fn(&[u8])) {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../fuzz/regressions")
            .join(target);
        let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        paths.sort();
        for path in paths {
            eprintln!("replaying {}", path.display());
            run(&std::fs::read(&path).unwrap());
        }
    }

    #[test]
    fn request_regressions() {
        replay("request", super::request);
    }

    #[test]
    fn tool_output_regressions() {
        replay("tool_output", super::tool_output);
    }
}
