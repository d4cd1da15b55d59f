//! Runs one point of the sweep: jobs arrive on a schedule (all at once, Poisson, or a
//! trace's timestamps), at most `max_concurrency` of them are in flight (a job is a request,
//! or a whole session whose turns go one after the other), and `/metrics` is scraped
//! alongside.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use tokio::sync::{watch, Semaphore};

use super::args::SweepPoint;
use super::dataset::{poisson_offsets, Job};
use super::http::{HttpClient, RequestRecord};
use super::payload::{request_body, PayloadOptions};
use super::scrape::{parse_exposition, snapshot, Accumulator, ServerStats};

/// What every point of a run shares.
#[derive(Clone)]
pub struct RunContext {
    pub client: HttpClient,
    pub endpoint: String,
    pub payload: PayloadOptions,
    pub timeout: Duration,
    pub seed: u64,
    pub metrics_interval: Duration,
    pub progress: bool,
}

/// The raw outcome of one point.
pub struct PointOutcome {
    pub records: Vec<RequestRecord>,
    /// From the first send to the last answer (seconds).
    pub duration_s: f64,
    /// Most jobs in flight at once, as the client saw it.
    pub max_in_flight: usize,
    pub server: ServerStats,
}

/// Counts jobs in flight and remembers the most.
#[derive(Default)]
struct InFlight {
    now: AtomicUsize,
    max: AtomicUsize,
}

impl InFlight {
    fn enter(&self) {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(n, Ordering::SeqCst);
    }
    fn leave(&self) {
        self.now.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Start offsets of the jobs: a trace's timestamps when it has them and no rate is set,
/// else Poisson arrivals at `rate` (all at zero for `inf`).
fn offsets(jobs: &[Job], rate: f64, seed: u64) -> Vec<f64> {
    if rate.is_infinite() && jobs.iter().any(|j| j.timestamp.is_some()) {
        return jobs.iter().map(|j| j.timestamp.unwrap_or(0.0)).collect();
    }
    poisson_offsets(jobs.len(), rate, seed)
}

/// Scrapes `/metrics` every `interval` until `stop` turns true (then once more); stops
/// early if the server has no metrics endpoint.
async fn scrape_loop(
    client: HttpClient,
    model: String,
    interval: Duration,
    mut stop: watch::Receiver<bool>,
) -> ServerStats {
    let mut acc = Accumulator::default();
    loop {
        let done = *stop.borrow();
        match client.get("/metrics").await {
            Ok((200, text)) => acc.add(&snapshot(&parse_exposition(&text), &model)),
            _ => break,
        }
        if done {
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = stop.changed() => {}
        }
    }
    acc.finish()
}

fn progress_bar(total: usize, show: bool, label: &str) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total as u64);
    if let Ok(style) = ProgressStyle::with_template(
        "{prefix} [{elapsed_precise}] {wide_bar} {pos}/{len} requests ({per_sec})",
    ) {
        bar.set_style(style);
    }
    bar.set_prefix(label.to_string());
    bar
}

/// Sends `jobs` at `point` and measures them.
pub async fn run_point(
    ctx: &RunContext,
    jobs: &[Job],
    point: SweepPoint,
    label: &str,
) -> PointOutcome {
    let total: usize = jobs.iter().map(|j| j.requests.len()).sum();
    let bar = progress_bar(total, ctx.progress, label);
    let (stop_tx, stop_rx) = watch::channel(false);
    let scraper = tokio::spawn(scrape_loop(
        ctx.client.clone(),
        ctx.payload.model.clone(),
        ctx.metrics_interval,
        stop_rx,
    ));
    let permits = Arc::new(Semaphore::new(
        point.max_concurrency.unwrap_or(Semaphore::MAX_PERMITS),
    ));
    let in_flight = Arc::new(InFlight::default());
    let records = Arc::new(Mutex::new(Vec::with_capacity(total)));
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(jobs.len());
    for (job, at) in jobs.iter().zip(offsets(jobs, point.request_rate, ctx.seed)) {
        let (ctx, job, bar) = (ctx.clone(), job.clone(), bar.clone());
        let (permits, in_flight, records) = (permits.clone(), in_flight.clone(), records.clone());
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep_until((start + Duration::from_secs_f64(at)).into()).await;
            let Ok(_permit) = permits.acquire().await else {
                return;
            };
            in_flight.enter();
            for spec in &job.requests {
                let body = request_body(spec, &ctx.payload);
                let sent = start.elapsed().as_secs_f64();
                let mut rec = ctx
                    .client
                    .stream(&ctx.endpoint, &body, spec.input_len, ctx.timeout)
                    .await;
                rec.start = sent;
                records.lock().unwrap_or_else(|e| e.into_inner()).push(rec);
                bar.inc(1);
            }
            in_flight.leave();
        }));
    }
    for t in tasks {
        // A panicking task loses only its own records.
        let _ = t.await;
    }
    let duration_s = start.elapsed().as_secs_f64();
    bar.finish_and_clear();
    let _ = stop_tx.send(true);
    let server = scraper.await.unwrap_or_default();
    let mut records = std::mem::take(&mut *records.lock().unwrap_or_else(|e| e.into_inner()));
    records.sort_by(|a, b| a.start.total_cmp(&b.start));
    PointOutcome {
        records,
        duration_s,
        max_in_flight: in_flight.max.load(Ordering::SeqCst),
        server,
    }
}

/// Sends `n` requests taken from the first jobs, unmeasured, so that the server's first
/// point does not pay for cold caches.
pub async fn warm_up(ctx: &RunContext, jobs: &[Job], n: usize) {
    let specs = jobs.iter().flat_map(|j| j.requests.iter()).take(n);
    let sends = specs.map(|spec| {
        let body = request_body(spec, &ctx.payload);
        let ctx = ctx.clone();
        async move {
            ctx.client
                .stream(&ctx.endpoint, &body, spec.input_len, ctx.timeout)
                .await
        }
    });
    futures::future::join_all(sends).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(ts: Option<f64>) -> Job {
        Job {
            requests: Vec::new(),
            timestamp: ts,
        }
    }

    #[test]
    fn trace_timestamps_unless_a_rate_is_set() {
        let jobs = vec![job(Some(0.0)), job(Some(2.5))];
        assert_eq!(offsets(&jobs, f64::INFINITY, 0), vec![0.0, 2.5]);
        let rated = offsets(&jobs, 1.0, 0);
        assert_eq!(rated[0], 0.0);
        assert_ne!(rated[1], 2.5);
        assert_eq!(
            offsets(&[job(None), job(None)], f64::INFINITY, 0),
            vec![0.0, 0.0]
        );
    }

    #[test]
    fn in_flight_keeps_the_peak() {
        let f = InFlight::default();
        f.enter();
        f.enter();
        f.leave();
        f.enter();
        f.leave();
        f.leave();
        assert_eq!(f.max.load(Ordering::SeqCst), 2);
        assert_eq!(f.now.load(Ordering::SeqCst), 0);
    }
}
