//! The engine embedded in a program, without HTTP: stream one generation token by token,
//! then get a whole chat answer at once.
//!
//! ```sh
//! scripts/fetch-default-model.sh && cargo run --release --example embedded
//! ```

use std::io::Write;

use dcpserve::{ChatMessage, Engine, GenerationEvent, Prompt, SamplingParams};
use futures::StreamExt;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    // A model path (GGUF file or Hugging Face folder) and the engine's limits.
    let engine = Engine::builder(dcpserve::default_model_path())
        .kv_cache_memory_bytes(256 << 20)
        .max_model_len(2048)
        .build()
        .await?;

    // Streaming: each event carries a token and the text it completes (never half a
    // UTF-8 character). Dropping the stream early would abort the request and free its
    // KV blocks at once.
    let mut params = SamplingParams {
        max_tokens: 32,
        ..Default::default()
    };
    params.temperature = 0.0;
    let mut stream = engine.generate(Prompt::Text("Once upon a time".into()), params.clone())?;
    let mut out = std::io::stdout().lock();
    while let Some(event) = stream.next().await {
        match event? {
            GenerationEvent::Token { text, .. } => {
                out.write_all(text.as_bytes())?;
                out.flush()?;
            }
            GenerationEvent::Finished {
                reason,
                completion_tokens,
                ..
            } => writeln!(
                out,
                "\n[{} after {completion_tokens} tokens]",
                reason.as_str()
            )?,
        }
    }
    drop(out);

    // The whole answer at once, through the model's chat template.
    let question = vec![ChatMessage::new("user", "What is the capital of France?")];
    let done = engine.complete(Prompt::Chat(question), params).await?;
    println!("{} ({})", done.text, done.finish_reason.as_str());
    Ok(())
}
