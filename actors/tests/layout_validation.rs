//! A supervisor started directly — the model embedded through `dcpserve-actors`, without
//! the engine facade — refuses every impossible layout with vLLM's exact message, as
//! `Engine::from_path` does (`tests/layout_errors.rs`).

use std::path::PathBuf;
use std::sync::Arc;

use dcpserve_actors::{ModelSupervisor, SupervisorArgs};
use dcpserve_config::{DType, EngineConfig, ParallelConfig};
use dcpserve_model::ModelFiles;

/// The tiny GQA model: 8 query heads, 2 KV heads.
fn tiny_llama() -> Arc<ModelFiles> {
    let path = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../fixtures/tiny-llama"
    ));
    Arc::new(ModelFiles::open(&path).unwrap())
}

fn layout(tp: usize, dcp: usize, interleave: usize) -> ParallelConfig {
    ParallelConfig {
        tensor_parallel_size: tp,
        decode_context_parallel_size: dcp,
        cp_kv_cache_interleave_size: interleave,
        ..Default::default()
    }
}

async fn start_error(files: &Arc<ModelFiles>, parallel: ParallelConfig) -> String {
    let args = SupervisorArgs {
        name: "tiny-llama".into(),
        files: files.clone(),
        engine: EngineConfig {
            parallel,
            dtype: DType::Float32,
            kv_cache_memory_bytes: Some(1 << 20),
            num_threads: Some(1),
            ..Default::default()
        },
        precision: Default::default(),
        draft: None,
    };
    match ractor::Actor::spawn(None, ModelSupervisor, args).await {
        Ok((sup, handle)) => {
            sup.stop(None);
            let _ = handle.await;
            panic!("{parallel:?}: expected a layout error")
        }
        Err(ractor::SpawnErr::StartupFailed(inner)) => inner.to_string(),
        Err(other) => other.to_string(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_supervisor_started_directly_gives_vllms_layout_messages() {
    let files = tiny_llama();
    let cases = [
        (layout(4, 3, 1), "tp_size=4 must be divisible by dcp_size=3."),
        (
            layout(2, 2, 1),
            "Decode context parallelism for GQA/MQA requires `--tensor-parallel-size` (2) to be greater than the model's total number of KV heads (2). Increase `--tensor-parallel-size` or set `--decode-context-parallel-size 1`.",
        ),
        (
            layout(4, 4, 1),
            "`--decode-context-parallel-size` (4) exceeds the maximum supported value (2) for `--tensor-parallel-size` (4) and 2 model KV heads.",
        ),
        (
            layout(4, 2, 3),
            "Block_size(16) should be greater than or equal to and divisible by cp_kv_cache_interleave_size (3).",
        ),
        (
            layout(3, 1, 1),
            "Total number of attention heads (8) must be divisible by tensor parallel size (3).",
        ),
    ];
    for (parallel, want) in cases {
        assert_eq!(start_error(&files, parallel).await, want, "{parallel:?}");
    }
}
