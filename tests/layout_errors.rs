//! `EngineBuilder::build` rejects every impossible layout of the tiny GQA model
//! (8 query heads, 2 KV heads, block size 16) with vLLM's exact message, and does so
//! before reading any weight.

mod common;

use std::path::{Path, PathBuf};

use common::equivalence::layout;
use common::*;
use dcpserve::{Engine, EngineConfig, ParallelConfig};

/// Each layout the tiny GQA model cannot run, with the message the engine must give.
fn bad_layouts() -> Vec<(ParallelConfig, &'static str)> {
    vec![
        // tp % dcp != 0
        (
            layout(4, 3, 1),
            "tp_size=4 must be divisible by dcp_size=3.",
        ),
        (
            layout(8, 3, 1),
            "tp_size=8 must be divisible by dcp_size=3.",
        ),
        // dcp > 1 with tp <= KV heads
        (
            layout(2, 2, 1),
            "Decode context parallelism for GQA/MQA requires `--tensor-parallel-size` (2) to be greater than the model's total number of KV heads (2). Increase `--tensor-parallel-size` or set `--decode-context-parallel-size 1`.",
        ),
        // dcp > tp / KV heads
        (
            layout(4, 4, 1),
            "`--decode-context-parallel-size` (4) exceeds the maximum supported value (2) for `--tensor-parallel-size` (4) and 2 model KV heads.",
        ),
        (
            layout(8, 8, 1),
            "`--decode-context-parallel-size` (8) exceeds the maximum supported value (4) for `--tensor-parallel-size` (8) and 2 model KV heads.",
        ),
        // interleave vs block size 16: not a divisor, and larger than the block
        (
            layout(4, 2, 3),
            "Block_size(16) should be greater than or equal to and divisible by cp_kv_cache_interleave_size (3).",
        ),
        (
            layout(8, 4, 32),
            "Block_size(16) should be greater than or equal to and divisible by cp_kv_cache_interleave_size (32).",
        ),
        // query heads % tp != 0
        (
            layout(3, 1, 1),
            "Total number of attention heads (8) must be divisible by tensor parallel size (3).",
        ),
        (
            layout(16, 1, 1),
            "Total number of attention heads (8) must be divisible by tensor parallel size (16).",
        ),
    ]
}

fn config(p: ParallelConfig) -> EngineConfig {
    EngineConfig {
        parallel: p,
        ..f32_config()
    }
}

async fn layout_error(model: &Path, p: ParallelConfig) -> String {
    match Engine::builder(model).config(config(p)).build().await {
        Ok(_) => panic!("{p:?} on {}: expected a layout error", model.display()),
        Err(e) => e.to_string(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiny_gqa_bad_layouts_give_exact_messages() {
    let model = fixture("tiny-llama");
    for (p, want) in bad_layouts() {
        assert_eq!(layout_error(&model, p).await, want, "{p:?}");
    }
}

/// A copy of `tiny-llama` in the temp folder, with `model.safetensors` replaced.
struct BrokenCopy(PathBuf);

impl BrokenCopy {
    fn new(tag: &str, weights: &[u8]) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "dcpserve-layout-errors-{tag}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let src = fixture("tiny-llama");
        for entry in std::fs::read_dir(&src).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name();
            if name != "model.safetensors" && name != "reference.json" {
                std::fs::copy(entry.path(), dir.join(&name)).unwrap();
            }
        }
        std::fs::write(dir.join("model.safetensors"), weights).unwrap();
        BrokenCopy(dir)
    }
}

impl Drop for BrokenCopy {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Layout errors come before the weights are touched: with `model.safetensors`
/// truncated to garbage, the layout error is still the one reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layout_is_checked_before_weights_are_read() {
    let garbage: Vec<u8> = (0..64u32).map(|i| (i * 37 + 11) as u8).collect();
    let copy = BrokenCopy::new("garbage", &garbage);
    // The copy really is unloadable with a valid layout ...
    let ok_layout = Engine::builder(&copy.0)
        .config(config(layout(1, 1, 1)))
        .build()
        .await;
    assert!(ok_layout.is_err(), "garbage weights loaded");
    // ... yet each bad layout reports its own message.
    for (p, want) in bad_layouts() {
        assert_eq!(
            layout_error(&copy.0, p).await,
            want,
            "{p:?} (garbage weights)"
        );
    }
}

/// The same with the real header kept and the tensor data cut off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layout_is_checked_before_truncated_weights_are_read() {
    let real = std::fs::read(fixture("tiny-llama").join("model.safetensors")).unwrap();
    let header_len = u64::from_le_bytes(real[..8].try_into().unwrap()) as usize;
    let cut = &real[..8 + header_len + 100];
    let copy = BrokenCopy::new("truncated", cut);
    let ok_layout = Engine::builder(&copy.0)
        .config(config(layout(1, 1, 1)))
        .build()
        .await;
    assert!(ok_layout.is_err(), "truncated weights loaded");
    for (p, want) in bad_layouts() {
        assert_eq!(
            layout_error(&copy.0, p).await,
            want,
            "{p:?} (truncated weights)"
        );
    }
}
