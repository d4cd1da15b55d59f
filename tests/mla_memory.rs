//! What each rank's latent cache actually stores after a real run under DCP (not just the
//! placement arithmetic): with dcp=N every rank of a group writes only its share of each
//! sequence's tokens — ARCHITECTURE.md's local length, ≈ 1/N — at
//! layers × (kv_lora_rank + qk_rope_head_dim) × 4 bytes per token, and the startup log
//! states the capacity.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};

use common::equivalence::*;
use common::fixture;

/// Tracing output of this test process (the supervisor logs the KV-cache line at startup).
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

fn logs() -> &'static Captured {
    static LOGS: OnceLock<Captured> = OnceLock::new();
    LOGS.get_or_init(|| {
        let c = Captured::default();
        tracing_subscriber::fmt()
            .with_writer(c.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .try_init()
            .expect("tracing subscriber");
        c
    })
}

fn count_in_logs(needle: &str) -> usize {
    String::from_utf8_lossy(&logs().0.lock().unwrap())
        .matches(needle)
        .count()
}

/// ARCHITECTURE.md's local length of a sequence of `len` tokens on DCP rank `r` of `n`
/// with interleave `i`: base = ⌊⌊L/I⌋/N⌋·I, local = base + clamp(L − base·N − r·I, 0, I).
fn local_len(len: usize, n: usize, i: usize, r: usize) -> usize {
    let base = (len / i) / n * i;
    let rest = len as isize - (base * n) as isize - (r * i) as isize;
    base + rest.clamp(0, i as isize) as usize
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_dcp_rank_stores_its_share_of_the_latent_tokens() {
    logs();
    // 3 layers × (kv_lora_rank 32 + qk_rope_head_dim 8) × 4 bytes (f32).
    let bytes_per_token = 3 * (32 + 8) * 4;
    let new_tokens = 5;
    let lens = [1usize, 17, 100, 301];
    let prompts: Vec<Vec<u32>> = lens
        .iter()
        .enumerate()
        .map(|(s, &n)| {
            (0..n)
                .map(|j| ((j * 31 + s * 7) % 380) as u32 + 3)
                .collect()
        })
        .collect();
    // Positions that went through the model: the prompt and every generated token but the
    // last (sampled after the final step).
    let stored: Vec<usize> = lens.iter().map(|l| l + new_tokens - 1).collect();
    let layouts = [
        (2, 1, 1),
        (2, 2, 1),
        (2, 2, 4),
        (4, 1, 1),
        (4, 2, 1),
        (4, 4, 1),
        (4, 4, 2),
        (4, 2, 16),
    ];
    for (tp, dcp, i) in layouts {
        let what = format!("tp={tp} dcp={dcp} I={i}");
        let mut config = cfg(layout(tp, dcp, i), 256, 16 << 20);
        config.enable_prefix_caching = false; // every token computed, none reused
        let line_before = count_in_logs(" tokens per rank, ");
        let engine = dcpserve::Engine::builder(fixture("tiny-deepseek"))
            .config(config)
            .build()
            .await
            .expect("engine");
        let (per_rank, total) = engine.kv_capacity();
        assert_eq!(total, per_rank * dcp, "{what}");
        // The f32 config keeps a float32 cache (`auto` under `--dtype float32`).
        let line = format!("KV cache (float32): {per_rank} tokens per rank, {total} tokens total");
        assert!(
            count_in_logs(&line) >= 1,
            "{what}: no startup line {line:?}"
        );
        assert_eq!(
            count_in_logs(" tokens per rank, "),
            line_before + 1,
            "{what}"
        );

        generate_all(&engine, &prompts, new_tokens).await;
        let stats = engine.stats().await.unwrap();
        assert_eq!(
            stats.preemptions, 0,
            "{what}: a recompute would store twice"
        );
        let storage = engine.kv_storage_per_rank().await.unwrap();
        assert_eq!(storage.len(), tp, "{what}");
        let mut per_group_total = vec![0usize; tp / dcp];
        for (rank, s) in storage.iter().enumerate() {
            let dcp_rank = rank % dcp;
            let want: usize = stored.iter().map(|&l| local_len(l, dcp, i, dcp_rank)).sum();
            let written = s.tokens_written_per_layer.as_ref().expect("latent cache");
            assert_eq!(written.len(), 3, "{what}");
            assert!(
                written.iter().all(|&w| w == want),
                "{what}: rank {rank} (dcp rank {dcp_rank}) wrote {written:?}, expected {want} per layer"
            );
            // About 1/N of everything: never more than the interleave-rounded share.
            let share: usize = stored.iter().map(|l| l.div_ceil(dcp * i) * i).sum();
            assert!(want <= share, "{what}: rank {rank} holds {want} > {share}");
            assert_eq!(s.bytes_per_token, bytes_per_token, "{what}: rank {rank}");
            assert_eq!(s.capacity_tokens, per_rank, "{what}: rank {rank}");
            per_group_total[rank / dcp] += written[0];
        }
        // Each DCP group holds every token exactly once.
        let all: usize = stored.iter().sum();
        assert!(
            per_group_total.iter().all(|&t| t == all),
            "{what}: groups hold {per_group_total:?}, the sequences have {all} tokens"
        );
    }
}
