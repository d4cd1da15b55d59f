//! Ranks in other processes (`--distributed-executor-backend mpi`): the engine split over
//! the processes of `mpirun -np P` gives the in-process engine's outputs (greedy tokens
//! equal, log-probabilities within 1e-4), with chunked prefill, prefix-cache hits and
//! forced preemption; and a rank process that dies or hangs ends the model's requests
//! with an error within seconds, `/health` says why, and process 0 stays up.
//!
//! Each test starts `mpirun` on this test binary, running only itself: in the child
//! processes (`DCPSERVE_MPI_CHILD` set) process 0 runs the engines and the checks, the
//! others serve their ranks inside `dcpserve::distributed::init` and exit there.
#![cfg(feature = "mpi")]

mod api_util;
#[path = "../../tests/common/mod.rs"]
mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::equivalence::*;
use common::*;
use dcpserve::{DistributedBackend, Engine, EngineConfig};

const CHILD: &str = "DCPSERVE_MPI_CHILD";

/// How a test's MPI job is launched.
#[derive(Clone, Copy, PartialEq)]
enum Launch {
    /// Processes on this host (shared memory between them).
    Local,
    /// Processes on this host, one of which the test kills: mpirun keeps process 0
    /// running (`--enable-recovery`) and may exit non-zero.
    Killed,
    /// One process in each of two network namespaces joined by a veth pair
    /// (`scripts/netns-two-hosts.sh`), Open MPI's TCP transport between them.
    TwoHosts,
}

/// Removes the two-host namespaces when the test ends, however it ends.
struct Namespaces;

impl Drop for Namespaces {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(repo_root().join("scripts/netns-two-hosts.sh"))
            .arg("down")
            .status();
    }
}

/// Runs test `name` of this binary in `np` MPI processes and fails with their output
/// unless process 0 reached the end of its checks and mpirun exits within `limit`, with
/// status 0 unless a process is killed on purpose.
fn under_mpirun(name: &str, np: usize, launch: Launch, limit: Duration) {
    let exe = std::env::current_exe().expect("test binary");
    let mut _namespaces = None;
    let mut cmd = match launch {
        Launch::TwoHosts => {
            let up = Command::new("bash")
                .arg(repo_root().join("scripts/netns-two-hosts.sh"))
                .arg("up")
                .output()
                .expect("bash");
            assert!(
                up.status.success(),
                "creating the two network namespaces needs root and iproute2: {}",
                String::from_utf8_lossy(&up.stderr)
            );
            _namespaces = Some(Namespaces);
            let mut c = Command::new("ip");
            c.args(["netns", "exec", "dcpserve-10.231.7.1", "mpirun"]);
            c.arg("--mca")
                .arg("plm_rsh_agent")
                .arg(repo_root().join("scripts/netns-rsh.sh"));
            c.args([
                "--host",
                "10.231.7.1,10.231.7.2",
                "--mca",
                "btl",
                "tcp,self",
                "--mca",
                "btl_tcp_if_include",
                "10.231.7.0/24",
                "--mca",
                "oob_tcp_if_include",
                "10.231.7.0/24",
            ]);
            c
        }
        Launch::Local | Launch::Killed => Command::new("mpirun"),
    };
    cmd.args([
        "--allow-run-as-root",
        "--oversubscribe",
        "-np",
        &np.to_string(),
    ]);
    if launch == Launch::Killed {
        cmd.arg("--enable-recovery");
    }
    cmd.args(["-x", CHILD])
        .arg(exe)
        .args(["--exact", name, "--nocapture", "--test-threads", "1"])
        .env(CHILD, "1");
    let killed = launch == Launch::Killed;
    let mut child = match cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => panic!(
            "cannot run mpirun ({e}): install Open MPI (`apt-get install openmpi-bin libopenmpi-dev`; scripts/test.sh does)"
        ),
    };
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("mpirun") {
            let out = child.wait_with_output().expect("mpirun output");
            let text = format!(
                "{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            // The child's own report (its measured figures) shows in the test's output.
            println!("{text}");
            assert!(
                status.success() || killed,
                "{name} under mpirun -np {np} failed:\n{text}"
            );
            assert!(!text.contains("panicked"), "{name}:\n{text}");
            assert!(
                text.contains(&format!("{name}: checked")),
                "{name}: process 0 never reached its checks:\n{text}"
            );
            return;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().expect("mpirun output");
            panic!(
                "{name} under mpirun -np {np} ran past {limit:?}:\n{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn is_child() -> bool {
    std::env::var_os(CHILD).is_some()
}

/// In a child: joins the MPI job (processes other than 0 serve ranks and exit inside),
/// runs `body` in process 0, and leaves the job.
fn as_child<F: std::future::Future<Output = ()>>(body: impl FnOnce() -> F) {
    // The engine's log (lost processes, restarts) goes with the test's output.
    let _ = tracing_subscriber::fmt()
        .with_env_filter("info")
        .with_writer(std::io::stderr)
        .try_init();
    dcpserve::distributed::init().expect("joining the MPI job");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(body());
    // A rank thread of a lost group may be stuck in MPI for good: don't wait for it.
    rt.shutdown_timeout(Duration::from_secs(2));
    dcpserve::distributed::shutdown();
}

fn mpi(cfg: EngineConfig) -> EngineConfig {
    EngineConfig {
        distributed_executor_backend: DistributedBackend::Mpi,
        ..cfg
    }
}

/// The largest |Δ logprob| between two runs.
fn max_diff(a: &Run, b: &Run) -> f32 {
    a.iter()
        .flatten()
        .zip(b.iter().flatten())
        .filter_map(|(x, y)| Some((x.logprob? - y.logprob?).abs()))
        .fold(0.0, f32::max)
}

/// Runs the prompts in process and over MPI with the same layout, twice on each engine
/// (the second round hits the prefix cache), and checks every round equal.
async fn assert_mpi_equals_in_process(
    name: &str,
    model: &std::path::Path,
    cfg: EngineConfig,
    prompts: &[Vec<u32>],
    n: usize,
) {
    let local = Engine::builder(model)
        .config(cfg.clone())
        .build()
        .await
        .expect("engine");
    let remote = Engine::builder(model)
        .config(mpi(cfg))
        .build()
        .await
        .expect("MPI engine");
    let mut worst = 0f32;
    for round in 0..2 {
        let base = generate_all(&local, prompts, n).await;
        let got = generate_all(&remote, prompts, n).await;
        assert_same(&base, &got, &format!("{name} round {round}"));
        worst = worst.max(max_diff(&base, &got));
    }
    let stats = remote.stats().await.expect("stats");
    assert!(
        stats.prefix_cache_hits > 0,
        "{name}: the second round hits the prefix cache"
    );
    println!(
        "{name}: checked: greedy tokens equal, max |Δ logprob| {worst:.2e}, {} preemptions, {} prefix-cache hits",
        stats.preemptions, stats.prefix_cache_hits
    );
}

/// tp=2 dcp=2 over two processes (one rank each), on the MLA fixture (GQA needs more
/// ranks than KV heads for DCP): long prompts prefilled in chunks of 128, prefix hits on
/// the second round.
#[test]
fn np2_tp2_dcp2_equals_in_process() {
    const NAME: &str = "np2_tp2_dcp2_equals_in_process";
    if !is_child() {
        return under_mpirun(NAME, 2, Launch::Local, Duration::from_secs(240));
    }
    as_child(|| async {
        let model = fixture("tiny-deepseek");
        let prompts = prompts(384, 700);
        let cfg = cfg(layout(2, 2, 1), 128, 64 << 20);
        assert_mpi_equals_in_process(NAME, &model, cfg, &prompts, 10).await;
    });
}

/// tp=2 dcp=2 across two hosts: one process in each of two network namespaces, the
/// collectives over TCP.
#[test]
fn two_hosts_tp2_dcp2_equals_in_process() {
    const NAME: &str = "two_hosts_tp2_dcp2_equals_in_process";
    if !is_child() {
        return under_mpirun(NAME, 2, Launch::TwoHosts, Duration::from_secs(240));
    }
    as_child(|| async {
        let model = fixture("tiny-deepseek");
        let prompts = prompts(384, 300);
        let cfg = cfg(layout(2, 2, 1), 128, 64 << 20);
        assert_mpi_equals_in_process(NAME, &model, cfg, &prompts, 8).await;
    });
}

/// Prefill context parallelism across processes: pcp=2 (tp=1), one rank per process, so
/// every attention exchange of a 3,100-token prompt's prefill crosses MPI; prefix hits on
/// the second round.
#[test]
fn np2_pcp2_equals_in_process() {
    const NAME: &str = "np2_pcp2_equals_in_process";
    if !is_child() {
        return under_mpirun(NAME, 2, Launch::Local, Duration::from_secs(240));
    }
    as_child(|| async {
        let model = fixture("tiny-llama");
        let prompts = prompts(384, 3100);
        let cfg = cfg(pcp_layout(1, 2, 1, 1), 512, 64 << 20);
        assert_mpi_equals_in_process(NAME, &model, cfg, &prompts, 8).await;
    });
}

/// GQA tp=4 dcp=2 I=16 over two processes (two ranks each: shared memory inside a
/// process, MPI between), with a KV cache small enough to force preemption.
#[test]
fn np2_gqa_tp4_dcp2_i16_with_preemption_equals_in_process() {
    const NAME: &str = "np2_gqa_tp4_dcp2_i16_with_preemption_equals_in_process";
    if !is_child() {
        return under_mpirun(NAME, 2, Launch::Local, Duration::from_secs(240));
    }
    as_child(|| async {
        let model = fixture("tiny-llama");
        let prompts = preemption_prompts();
        // 128 bytes per token per rank (2 layers × 1 KV head × 8 dims × f32 × K and V);
        // 20 blocks of 16 tokens per rank: 640 tokens under dcp=2, less than the six
        // sequences grow to together.
        let cfg = cfg(layout(4, 2, 16), 256, 128 * 16 * 20);
        let local = Engine::builder(&model)
            .config(cfg.clone())
            .build()
            .await
            .expect("engine");
        let remote = Engine::builder(&model)
            .config(mpi(cfg))
            .build()
            .await
            .expect("MPI engine");
        let base = generate_all(&local, &prompts, 40).await;
        let got = generate_all(&remote, &prompts, 40).await;
        assert_same(&base, &got, NAME);
        let stats = remote.stats().await.expect("stats");
        assert!(
            stats.preemptions > 0,
            "{NAME}: the small cache forces preemption"
        );
        println!(
            "{NAME}: checked: greedy tokens equal, max |Δ logprob| {:.2e}, {} preemptions",
            max_diff(&base, &got),
            stats.preemptions
        );
    });
}

/// MLA (tiny DeepSeek-V3) tp=4 dcp=4 over four processes.
#[test]
fn np4_mla_tp4_dcp4_equals_in_process() {
    const NAME: &str = "np4_mla_tp4_dcp4_equals_in_process";
    if !is_child() {
        return under_mpirun(NAME, 4, Launch::Local, Duration::from_secs(300));
    }
    as_child(|| async {
        let model = fixture("tiny-deepseek");
        let prompts = prompts(384, 300);
        let cfg = cfg(layout(4, 4, 1), 128, 64 << 20);
        assert_mpi_equals_in_process(NAME, &model, cfg, &prompts, 8).await;
    });
}

/// The deadline every request has, counted from the kill or stop of a rank process:
/// detection after [`dcpserve_actors::remote::LOST_AFTER`] (3 s) plus one heartbeat
/// period, then every request of the model is answered at once.
const ANSWERED_WITHIN: Duration = Duration::from_secs(5);

/// How one request around the fault ended.
struct Ending {
    case: String,
    /// Seconds after the signal (negative: before it).
    at: f64,
    /// The HTTP status, and the response or stream body.
    status: u16,
    body: String,
}

/// Sends a non-streaming completion at once and returns how it ended (or `None` past the
/// deadline).
fn complete_later(
    addr: std::net::SocketAddr,
    case: &str,
    t0: std::sync::Arc<std::sync::OnceLock<Instant>>,
) -> tokio::task::JoinHandle<Option<Ending>> {
    let case = case.to_string();
    tokio::spawn(async move {
        let body = serde_json::json!({"model": "tiny", "prompt": "once upon a time",
            "max_tokens": 4000, "ignore_eos": true});
        let r = tokio::time::timeout(
            Duration::from_secs(60),
            api_util::post(addr, "/v1/completions", &body),
        )
        .await
        .ok()?;
        let now = Instant::now();
        let t0 = *t0.get().expect("the signal was sent");
        let at = match now.checked_duration_since(t0) {
            Some(d) => d.as_secs_f64(),
            None => -t0.duration_since(now).as_secs_f64(),
        };
        Some(Ending {
            case,
            at,
            status: r.status,
            body: r.body,
        })
    })
}

/// A rank process killed (SIGKILL) or stopped (SIGSTOP, a hang) while requests are in
/// every state: (a) two streams generating, (b) two requests queued behind them
/// (`--max-num-seqs 2`), (c) requests sent right after the signal, before the loss can
/// be detected, and (d) a request sent after detection. Every one ends within
/// [`ANSWERED_WITHIN`] of the signal (a stream with an error frame and `[DONE]`, a plain
/// request with a 503) naming the lost process, `/health` answers 503 with the reason,
/// and process 0 goes on answering.
fn lost_rank_process(name: &str, signal: &str) {
    as_child(|| async {
        use std::sync::{Arc, OnceLock};
        use tokio::io::AsyncReadExt;
        let model = fixture("tiny-llama");
        let mut cfg = mpi(cfg(layout(2, 1, 1), 128, 64 << 20));
        cfg.max_num_seqs = 2;
        let engine = Engine::builder(&model)
            .config(cfg)
            .build()
            .await
            .expect("MPI engine");
        let addr = api_util::start(api_util::router_for(&engine, 64), None).await;
        assert_eq!(api_util::get(addr, "/health").await.status, 200);
        let cluster = dcpserve_actors::remote::Cluster::global().expect("cluster");
        let pid = cluster.pid(1).to_string();
        // However the checks end, nothing stays stopped (mpirun would wait for it).
        let _resume = Resume(pid.clone());
        let t0 = Arc::new(OnceLock::new());
        // (a) in flight: two long streams, generating.
        let stream_body = serde_json::json!({"model": "tiny", "prompt": "a long story",
            "max_tokens": 4000, "ignore_eos": true, "stream": true});
        let mut streams = Vec::new();
        for i in 0..2 {
            let (mut sock, seen) =
                api_util::open_stream(addr, "/v1/completions", &stream_body, 3).await;
            let t0 = t0.clone();
            streams.push(tokio::spawn(async move {
                let mut rest = Vec::new();
                tokio::time::timeout(Duration::from_secs(60), sock.read_to_end(&mut rest))
                    .await
                    .ok()?
                    .ok()?;
                let t0: Instant = *t0.get().expect("the signal was sent");
                Some(Ending {
                    case: format!("(a) in flight, stream {i}"),
                    at: t0.elapsed().as_secs_f64(),
                    status: 200,
                    body: seen + &String::from_utf8_lossy(&rest),
                })
            }));
        }
        // (b) queued behind them.
        let mut plain = Vec::new();
        for i in 0..2 {
            plain.push(complete_later(addr, &format!("(b) queued {i}"), t0.clone()));
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while engine.stats().await.expect("stats").waiting < 2 {
            assert!(
                Instant::now() < deadline,
                "the queued requests never queued"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let status = Command::new("kill").args([signal, &pid]).status().unwrap();
        assert!(status.success());
        let _ = t0.set(Instant::now());
        let t0 = *t0.get().unwrap();
        // (c) in the detection window: at once, and 1 s and 2 s after the signal.
        plain.push(complete_later(
            addr,
            "(c) at +0 s",
            Arc::new(OnceLock::from(t0)),
        ));
        for s in [1, 2] {
            tokio::time::sleep_until((t0 + Duration::from_secs(s)).into()).await;
            plain.push(complete_later(
                addr,
                &format!("(c) at +{s} s"),
                Arc::new(OnceLock::from(t0)),
            ));
        }
        // Detection: /health turns 503 with the reason.
        let mut health = api_util::get(addr, "/health").await;
        while health.status == 200 && t0.elapsed() < ANSWERED_WITHIN {
            tokio::time::sleep(Duration::from_millis(50)).await;
            health = api_util::get(addr, "/health").await;
        }
        let detected = t0.elapsed().as_secs_f64();
        assert_eq!(health.status, 503, "{}", health.body);
        assert!(
            health.body.contains("MPI process 1 on host"),
            "{}",
            health.body
        );
        // (d) after detection.
        plain.push(complete_later(
            addr,
            "(d) after detection",
            Arc::new(OnceLock::from(t0)),
        ));
        let mut report = Vec::new();
        for h in streams {
            let e = h.await.unwrap().expect("an in-flight stream must end");
            assert!(
                e.body.contains("\"error\"") && e.body.contains("MPI process 1 on host"),
                "{}: the stream must end with an error frame naming the lost process: {}",
                e.case,
                e.body
            );
            assert!(e.body.contains("data: [DONE]"), "{}: {}", e.case, e.body);
            report.push(e);
        }
        for h in plain {
            let e = h.await.unwrap().expect("a request must be answered");
            assert!(
                e.status == 503 && e.body.contains("MPI process 1 on host"),
                "{}: a 503 naming the lost process, got {} {}",
                e.case,
                e.status,
                e.body
            );
            report.push(e);
        }
        for e in &report {
            assert!(
                e.at < ANSWERED_WITHIN.as_secs_f64(),
                "{} was answered {:.2} s after `kill {signal}`, past {ANSWERED_WITHIN:?}: {}",
                e.case,
                e.at,
                e.body
            );
        }
        // Process 0 still answers, and the model keeps saying why it cannot serve.
        assert_eq!(api_util::get(addr, "/v1/models").await.status, 200);
        assert_eq!(api_util::get(addr, "/health").await.status, 503);
        let refused = engine
            .complete(dcpserve::Prompt::Tokens(vec![5; 4]), greedy(4))
            .await
            .expect_err("a model without its ranks refuses requests");
        assert!(refused.to_string().contains("MPI process 1"), "{refused}");
        let times: Vec<String> = report
            .iter()
            .map(|e| format!("{} {:.2} s ({})", e.case, e.at, e.status))
            .collect();
        // The distinct messages, without the common reason (`MPI process 1 ... lost`).
        let mut errors: Vec<&str> = report
            .iter()
            .filter_map(|e| e.body.split("\"message\":\"").nth(1))
            .filter_map(|m| m.split("MPI process").next())
            .collect();
        errors.dedup();
        println!(
            "{name}: checked: /health 503 {detected:.2} s after `kill {signal}`; answered: {}; answers: {}",
            times.join(", "),
            errors.join(" | ")
        );
    });
}

/// A rank process killed or stopped while the model is idle, then requests with long
/// prompts in the detection window: their first step's plan (a whole prompt, above MPI's
/// eager limit) goes to a process that will never take it, and each still ends within
/// [`ANSWERED_WITHIN`] of the signal naming the lost process.
fn lost_while_idle(name: &str, signal: &str) {
    as_child(|| async {
        use std::sync::{Arc, OnceLock};
        let model = fixture("tiny-llama");
        // Whole 2000-token prompts in one step: 8 KB of token ids in one plan.
        let engine = Engine::builder(&model)
            .config(mpi(cfg(layout(2, 1, 1), 4096, 64 << 20)))
            .build()
            .await
            .expect("MPI engine");
        let addr = api_util::start(api_util::router_for(&engine, 64), None).await;
        assert_eq!(api_util::get(addr, "/health").await.status, 200);
        let cluster = dcpserve_actors::remote::Cluster::global().expect("cluster");
        let pid = cluster.pid(1).to_string();
        let _resume = Resume(pid.clone());
        let status = Command::new("kill").args([signal, &pid]).status().unwrap();
        assert!(status.success());
        let t0 = Instant::now();
        let prompt: Vec<u32> = (0..2000).map(|i| 4 + i % 300).collect();
        let mut sent = Vec::new();
        for s in [0, 1] {
            tokio::time::sleep_until((t0 + Duration::from_millis(500 + 1000 * s)).into()).await;
            let body = serde_json::json!({"model": "tiny", "prompt": prompt, "max_tokens": 16});
            let case = format!("(c) idle, at +{}.5 s", s);
            let t0 = Arc::new(OnceLock::from(t0));
            sent.push(tokio::spawn(async move {
                let r = tokio::time::timeout(
                    Duration::from_secs(60),
                    api_util::post(addr, "/v1/completions", &body),
                )
                .await
                .ok()?;
                Some(Ending {
                    case,
                    at: t0.get().unwrap().elapsed().as_secs_f64(),
                    status: r.status,
                    body: r.body,
                })
            }));
        }
        let mut times = Vec::new();
        for h in sent {
            let e = h.await.unwrap().expect("a request must be answered");
            assert!(
                e.status == 503 && e.body.contains("MPI process 1 on host"),
                "{}: a 503 naming the lost process, got {} {}",
                e.case,
                e.status,
                e.body
            );
            assert!(
                e.at < ANSWERED_WITHIN.as_secs_f64(),
                "{} was answered {:.2} s after `kill {signal}`: {}",
                e.case,
                e.at,
                e.body
            );
            times.push(format!("{} {:.2} s ({})", e.case, e.at, e.status));
        }
        let health = api_util::get(addr, "/health").await;
        assert_eq!(health.status, 503, "{}", health.body);
        assert_eq!(api_util::get(addr, "/v1/models").await.status, 200);
        println!("{name}: checked: answered: {}", times.join(", "));
    });
}

/// Resumes and kills the signalled rank process when dropped.
struct Resume(String);

impl Drop for Resume {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-CONT", &self.0]).status();
        let _ = Command::new("kill").args(["-KILL", &self.0]).status();
    }
}

#[test]
fn np2_killed_rank_process_ends_requests_and_health_says_why() {
    const NAME: &str = "np2_killed_rank_process_ends_requests_and_health_says_why";
    if !is_child() {
        return under_mpirun(NAME, 2, Launch::Killed, Duration::from_secs(120));
    }
    lost_rank_process(NAME, "-KILL");
}

#[test]
fn np2_hung_rank_process_ends_requests_and_health_says_why() {
    const NAME: &str = "np2_hung_rank_process_ends_requests_and_health_says_why";
    if !is_child() {
        return under_mpirun(NAME, 2, Launch::Killed, Duration::from_secs(120));
    }
    lost_rank_process(NAME, "-STOP");
}

#[test]
fn np2_rank_process_killed_while_idle_ends_requests_in_the_detection_window() {
    const NAME: &str = "np2_rank_process_killed_while_idle_ends_requests_in_the_detection_window";
    if !is_child() {
        return under_mpirun(NAME, 2, Launch::Killed, Duration::from_secs(120));
    }
    lost_while_idle(NAME, "-KILL");
}

#[test]
fn np2_rank_process_stopped_while_idle_ends_requests_in_the_detection_window() {
    const NAME: &str = "np2_rank_process_stopped_while_idle_ends_requests_in_the_detection_window";
    if !is_child() {
        return under_mpirun(NAME, 2, Launch::Killed, Duration::from_secs(120));
    }
    lost_while_idle(NAME, "-STOP");
}
