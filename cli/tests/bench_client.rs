//! `dcpserve bench` end to end against an in-process server on the tiny fixture model:
//! every request completes with exactly the asked-for tokens (ignore_eos), the server's
//! /metrics is scraped, and the run is written as JSON next to its plots.

mod api_util;

use std::path::Path;

use api_util::*;
use clap::Parser;
use dcpserve_tools::bench_client::{report, BenchServeArgs};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: BenchServeArgs,
}

fn args(base_url: &str, dir: &Path, extra: &[&str]) -> BenchServeArgs {
    let mut argv = vec![
        "bench".to_string(),
        "--base-url".into(),
        base_url.into(),
        "--result-dir".into(),
        dir.display().to_string(),
        "--disable-tqdm".into(),
        "--ignore-eos".into(),
        // The tiny tokenizer has 384 ids.
        "--token-id-min".into(),
        "3".into(),
        "--token-id-max".into(),
        "384".into(),
        "--metrics-interval".into(),
        "0.05".into(),
    ];
    argv.extend(extra.iter().map(|s| s.to_string()));
    Cli::try_parse_from(argv).expect("flags").args
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_and_agentic_runs_against_our_server() {
    let engine = tiny_engine().await;
    let addr = start(router_for(&engine, 64), None).await;
    let base = format!("http://{addr}");
    let dir = std::env::temp_dir().join(format!("bench-client-e2e-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);

    let random = [
        "--label",
        "random",
        "--max-concurrency",
        "1,4",
        "--num-prompts",
        "6",
        "--random-input-len",
        "20",
        "--random-output-len",
        "9",
    ];
    dcpserve_tools::bench_client::run(args(&base, &dir, &random))
        .await
        .unwrap();
    let agentic = [
        "--label",
        "agentic",
        "--dataset-name",
        "agentic",
        "--max-concurrency",
        "2",
        "--num-prompts",
        "4",
        "--agentic-turns",
        "2",
        "--agentic-context-len",
        "40",
        "--random-input-len",
        "5",
        "--random-output-len",
        "3",
    ];
    dcpserve_tools::bench_client::run(args(&base, &dir, &agentic))
        .await
        .unwrap();

    let runs = report::load_runs(&dir).unwrap();
    assert_eq!(runs.len(), 2);
    let (agentic, random) = (&runs[0], &runs[1]);
    assert_eq!(random.model, "tiny");
    assert_eq!(random.num_ranks, 1);
    assert_eq!(random.points.len(), 2);
    for p in &random.points {
        let s = &p.summary;
        assert_eq!((s.completed, p.error_count), (6, 0), "{:?}", p.errors);
        assert_eq!(s.total_output_tokens, 6 * 9);
        assert_eq!(s.total_input_tokens, 6 * 20);
        assert_eq!(s.usage_reported, 6);
        assert!(s.ttft_ms.p50 > 0.0 && s.tpot_ms.p50 > 0.0);
        assert!(s.output_throughput > 0.0);
        assert!(p.server.scrapes >= 2);
        assert_eq!(p.server.ranks, Some(1));
        assert!(p.server.kv_usage_max.is_some());
        assert_eq!(p.server.preemptions, Some(0.0));
    }
    assert_eq!(random.points[0].max_in_flight, 1);
    assert!(random.points[1].max_in_flight <= 4);

    let p = &agentic.points[0];
    assert_eq!(
        (p.summary.completed, p.error_count),
        (4, 0),
        "{:?}",
        p.errors
    );
    // Two sessions of two turns: turn 1 is 40 + 5, turn 2 adds 3 + 5.
    assert_eq!(p.summary.total_input_tokens, 2 * (45 + 53));
    assert_eq!(p.summary.total_output_tokens, 4 * 3);

    for png in [
        "throughput_vs_concurrency.png",
        "frontier.png",
        "kv_usage_vs_concurrency.png",
        "running_vs_concurrency.png",
    ] {
        let bytes = std::fs::read(dir.join(png)).unwrap();
        assert!(bytes.starts_with(b"\x89PNG"), "{png}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_requests_are_counted_as_errors() {
    let engine = tiny_engine().await;
    let addr = start(router_for(&engine, 64), None).await;
    let dir = std::env::temp_dir().join(format!("bench-client-err-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // Prompts beyond the model's context are refused with 400.
    let a = args(
        &format!("http://{addr}"),
        &dir,
        &[
            "--label",
            "err",
            "--num-prompts",
            "3",
            "--random-input-len",
            "100000",
            "--no-plots",
        ],
    );
    dcpserve_tools::bench_client::run(a).await.unwrap();
    let runs = report::load_runs(&dir).unwrap();
    let p = &runs[0].points[0];
    assert_eq!((p.summary.completed, p.error_count), (0, 3));
    assert!(p.errors[0].starts_with("HTTP 400"), "{:?}", p.errors);
    std::fs::remove_dir_all(&dir).ok();
}
