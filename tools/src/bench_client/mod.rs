//! `dcpserve bench`: a serving benchmark client for OpenAI-compatible servers (ours,
//! vLLM, llama.cpp's llama-server), with flags named as `vllm bench serve` names them.
//!
//! A run sweeps concurrency limits and/or request rates over one workload (random,
//! agentic multi-turn sessions, or a JSONL trace), streams every request to time TTFT, TPOT
//! and ITL, scrapes the server's `/metrics` for KV usage and preemptions, prints a table,
//! and with `--result-dir` writes the run as JSON and redraws the PNG plots of every run in
//! that folder.
//!
//! Modules: [`args`] (flags), [`dataset`] (workloads), [`sse`] and [`payload`] (the wire
//! format), [`http`] (client and request timing), [`runner`] (one sweep point),
//! [`stats`] (percentiles and summaries), [`scrape`] (`/metrics`), [`report`] (JSON and
//! tables), [`plot`] (PNG charts).

pub mod args;
pub mod dataset;
pub mod http;
pub mod payload;
pub mod plot;
pub mod report;
pub mod runner;
pub mod scrape;
pub mod sse;
pub mod stats;

use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::ValueEnum;

pub use args::BenchServeArgs;
use http::HttpClient;
use payload::PayloadOptions;
use report::{PointResult, RunResult, Workload, KEPT_ERRORS};
use runner::RunContext;

/// The model to ask for: `--model`, else the first one the server lists.
async fn resolve_model(client: &HttpClient, given: Option<&str>) -> Result<String> {
    if let Some(m) = given {
        return Ok(m.to_string());
    }
    let (status, body) = client
        .get("/v1/models")
        .await
        .context("is the server up?")?;
    if status != 200 {
        bail!("GET /v1/models answered {status}: {body}");
    }
    let v: serde_json::Value = serde_json::from_str(&body).context("/v1/models: not JSON")?;
    v["data"][0]["id"]
        .as_str()
        .map(str::to_string)
        .context("/v1/models lists no model; pass --model")
}

/// Ranks serving the model: `--num-ranks`, else the `rank` labels of the server's KV-usage
/// series, else 1.
async fn resolve_ranks(client: &HttpClient, given: Option<usize>, model: &str) -> usize {
    if let Some(n) = given {
        return n.max(1);
    }
    match client.get("/metrics").await {
        Ok((200, text)) => {
            let snap = scrape::snapshot(&scrape::parse_exposition(&text), model);
            snap.kv_usage.len().max(1)
        }
        _ => 1,
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Draws the plots of every run in `dir` and prints their paths.
fn replot(dir: &std::path::Path) -> Result<()> {
    let runs = report::load_runs(dir)?;
    if runs.is_empty() {
        bail!("no runs in {}", dir.display());
    }
    for png in plot::plot_runs(dir, &runs)? {
        println!("plot: {}", png.display());
    }
    Ok(())
}

/// Runs the benchmark.
pub async fn run(args: BenchServeArgs) -> Result<()> {
    args.validate()?;
    if args.replot {
        let dir = args
            .result_dir
            .as_deref()
            .context("--replot needs --result-dir")?;
        return replot(dir);
    }
    let client = HttpClient::new(&args.base_url, args.api_key.clone())?;
    let model = resolve_model(&client, args.model.as_deref()).await?;
    let num_ranks = resolve_ranks(&client, args.num_ranks, &model).await;
    let jobs = dataset::build(&args)?;
    let label = args
        .label
        .clone()
        .unwrap_or_else(|| report::default_label(&args, &model));
    let ctx = RunContext {
        client,
        endpoint: args.endpoint.clone(),
        payload: PayloadOptions {
            model: model.clone(),
            chat: args.is_chat(),
            text_prompts: args.text_prompts,
            temperature: args.temperature,
            ignore_eos: args.ignore_eos,
            response_format: args
                .json_schema
                .as_deref()
                .map(payload::json_schema_format)
                .transpose()?,
        },
        timeout: Duration::from_secs_f64(args.request_timeout),
        seed: args.seed,
        metrics_interval: Duration::from_secs_f64(args.metrics_interval),
        progress: !args.disable_tqdm,
    };
    println!(
        "{label}: {} {} at {}, {} dataset, {num_ranks} rank(s)",
        model,
        args.endpoint,
        args.base_url,
        args.dataset_name
            .to_possible_value()
            .map_or("?".into(), |v| v.get_name().to_string()),
    );
    println!("{}", report::table_header());
    let mut run = RunResult {
        label,
        base_url: args.base_url.clone(),
        model,
        endpoint: args.endpoint.clone(),
        num_ranks,
        started_at: unix_now(),
        workload: Workload::from_args(&args),
        points: Vec::new(),
    };
    for point in args.sweep()? {
        if args.num_warmups > 0 {
            runner::warm_up(&ctx, &jobs, args.num_warmups).await;
        }
        let name = format!(
            "c={}",
            point
                .max_concurrency
                .map_or("inf".into(), |c| c.to_string())
        );
        // More requests at higher concurrency when asked (same seed: a longer workload
        // starting with the same requests).
        let point_jobs = match args.prompts_for(point.max_concurrency) {
            n if n == args.num_prompts => jobs.clone(),
            n => dataset::build(&BenchServeArgs {
                num_prompts: n,
                ..args.clone()
            })?,
        };
        let out = runner::run_point(&ctx, &point_jobs, point, &name).await;
        let errors: Vec<&String> = out
            .records
            .iter()
            .filter_map(|r| r.error.as_ref())
            .collect();
        let p = PointResult {
            max_concurrency: point.max_concurrency,
            request_rate: point.request_rate.is_finite().then_some(point.request_rate),
            max_in_flight: out.max_in_flight,
            summary: stats::summarize(&out.records, out.duration_s, num_ranks),
            server: out.server,
            error_count: errors.len(),
            errors: errors
                .iter()
                .take(KEPT_ERRORS)
                .map(|e| e.to_string())
                .collect(),
        };
        println!("{}", report::table_row(&p));
        for e in &p.errors {
            println!("    error: {e}");
        }
        if p.summary.completed > 0 && p.summary.usage_reported < p.summary.completed {
            println!(
                "    note: {} of {} requests had no usage in the stream; their tokens are counted chunks",
                p.summary.completed - p.summary.usage_reported,
                p.summary.completed
            );
        }
        run.points.push(p);
    }
    if let Some(dir) = &args.result_dir {
        let path = report::write_run(dir, &run)?;
        println!("result: {}", path.display());
        if !args.no_plots {
            replot(dir)?;
        }
    }
    Ok(())
}

/// Flags as the command line would give them (tests).
#[cfg(test)]
pub(crate) fn test_args(extra: &[&str]) -> BenchServeArgs {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: BenchServeArgs,
    }
    let mut argv = vec!["bench"];
    argv.extend_from_slice(extra);
    Cli::try_parse_from(argv).expect("flags parse").args
}
