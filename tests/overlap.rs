//! Two micro-batches in ping-pong (`overlap_micro_batches`): each rank computes them on
//! two threads that take turns at collectives, over one shared KV cache. Outputs must
//! equal the single-rank engine's (greedy tokens equal, log-probabilities within 1e-4)
//! with DCP, chunked prefill, preemption and aborts of sequences whose step is in flight.

mod common;

use common::equivalence::*;
use common::*;
use dcpserve::{Engine, EngineConfig, GenerationEvent, Prompt};
use futures::StreamExt;

fn overlapped(tp: usize, dcp: usize, i: usize, batched: usize, kv: u64) -> EngineConfig {
    EngineConfig {
        overlap_micro_batches: true,
        ..cfg(layout(tp, dcp, i), batched, kv)
    }
}

/// Prompts of several lengths, one of them longer than the token budget (chunked).
fn mixed_prompts(n: usize) -> Vec<Vec<u32>> {
    (0..n)
        .map(|i| {
            let len = [3usize, 20, 61, 150, 700][i % 5] + i;
            (0..len)
                .map(|j| ((j * 37 + i * 11) % 380) as u32 + 3)
                .collect()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapped_micro_batches_equal_single_rank() {
    let model = fixture("tiny-llama");
    let prompts = mixed_prompts(8);
    let big = 64 << 20;
    let base = run(&model, cfg(layout(1, 1, 1), 256, big), &prompts, 16).await;
    for (tp, dcp, i) in [(1, 1, 1), (2, 1, 1), (4, 2, 16), (8, 4, 2)] {
        let got = run(&model, overlapped(tp, dcp, i, 256, big), &prompts, 16).await;
        assert_same(&base, &got, &format!("overlapped tp={tp} dcp={dcp} I={i}"));
    }
    // Per rank at tp=4: 2 layers × 1 KV head × 8 dims × 4 bytes × 2 (K, V) = 128 bytes
    // per token; 40 blocks of 16 tokens hold 1,280 tokens under dcp=2: not all at once.
    let (got, stats) = run_stats(
        &model,
        overlapped(4, 2, 2, 256, 128 * 16 * 40),
        &prompts,
        16,
    )
    .await;
    assert!(stats.preemptions > 0, "expected preemptions: {stats:?}");
    assert_same(&base, &got, "overlapped tp=4 dcp=2 I=2 with preemption");
    assert_eq!(stats.free_blocks, stats.total_blocks, "all blocks freed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapped_mla_equals_single_rank() {
    let model = fixture("tiny-deepseek");
    let prompts = mixed_prompts(6);
    let big = 64 << 20;
    let base = run(&model, cfg(layout(1, 1, 1), 256, big), &prompts, 12).await;
    for (tp, dcp, i) in [(2, 2, 1), (4, 2, 2)] {
        let got = run(&model, overlapped(tp, dcp, i, 256, big), &prompts, 12).await;
        assert_same(
            &base,
            &got,
            &format!("overlapped MLA tp={tp} dcp={dcp} I={i}"),
        );
    }
}

/// Aborting sequences while their micro-batch's step is computing must neither hand
/// their blocks to the other micro-batch before that step ends (a rank would still be
/// writing them) nor disturb the surviving requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aborts_during_overlapped_steps_spare_the_other_requests() {
    let model = fixture("tiny-llama");
    let prompts = mixed_prompts(10);
    let base = run(&model, cfg(layout(1, 1, 1), 256, 64 << 20), &prompts, 24).await;
    // Tight KV so that freed blocks are reused at once by waiting requests.
    let engine = Engine::builder(&model)
        .config(overlapped(4, 2, 1, 64, 128 * 16 * 48))
        .build()
        .await
        .unwrap();
    let streams: Vec<_> = prompts
        .iter()
        .map(|p| {
            engine
                .generate(Prompt::Tokens(p.clone()), greedy(24))
                .unwrap()
        })
        .collect();
    let tasks: Vec<_> = streams
        .into_iter()
        .enumerate()
        .map(|(k, mut s)| {
            tokio::spawn(async move {
                let mut tokens = Vec::new();
                while let Some(ev) = s.next().await {
                    match ev.expect("no error") {
                        GenerationEvent::Token { token, .. } => tokens.push(token.token_id),
                        GenerationEvent::Finished { .. } => break,
                    }
                    // Every third request is dropped (aborted) after a few tokens.
                    if k % 3 == 1 && tokens.len() == 3 {
                        return None;
                    }
                }
                Some(tokens)
            })
        })
        .collect();
    for (k, t) in tasks.into_iter().enumerate() {
        let got = t.await.unwrap();
        if k % 3 == 1 {
            assert!(got.is_none());
            continue;
        }
        let want: Vec<u32> = base[k].iter().map(|t| t.token_id).collect();
        assert_eq!(got.unwrap(), want, "request {k}");
    }
    assert!(
        all_blocks_freed(&engine).await,
        "blocks still held after the abort"
    );
}
