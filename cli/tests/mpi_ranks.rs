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

/// A rank process killed (SIGKILL) or stopped (SIGSTOP, a hang) mid-generation: the
/// in-flight request ends with an error within seconds, new requests are refused with
/// the reason, `/health` answers 503 naming the lost process and its host, and process
/// 0 goes on answering.
fn lost_rank_process(name: &str, signal: &str) {
    as_child(|| async {
        let model = fixture("tiny-llama");
        let cfg = mpi(cfg(layout(2, 1, 1), 128, 64 << 20));
        let engine = Engine::builder(&model)
            .config(cfg)
            .build()
            .await
            .expect("MPI engine");
        let addr = api_util::start(api_util::router_for(&engine, 64), None).await;
        assert_eq!(api_util::get(addr, "/health").await.status, 200);
        let cluster = dcpserve_actors::remote::Cluster::global().expect("cluster");
        let pid = cluster.pid(1).to_string();
        use futures::StreamExt;
        let mut s = engine
            .generate(dcpserve::Prompt::Tokens(vec![5; 20]), greedy(1_000_000))
            .unwrap();
        for _ in 0..5 {
            assert!(matches!(
                s.next().await,
                Some(Ok(dcpserve::GenerationEvent::Token { .. }))
            ));
        }
        let status = Command::new("kill").args([signal, &pid]).status().unwrap();
        assert!(status.success());
        let t0 = Instant::now();
        let error = loop {
            match tokio::time::timeout(Duration::from_secs(30), s.next())
                .await
                .expect("the in-flight request must not hang")
            {
                Some(Ok(_)) => continue,
                Some(Err(e)) => break e.to_string(),
                None => panic!("the in-flight request must end with an error"),
            }
        };
        let ended_after = t0.elapsed();
        assert!(ended_after < Duration::from_secs(10), "{ended_after:?}");
        assert!(error.contains("MPI process 1 on host"), "{error}");
        // The model reports itself unavailable, with the reason, once the restart fails.
        let mut health = api_util::get(addr, "/health").await;
        let deadline = Instant::now() + Duration::from_secs(20);
        while health.status == 200 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            health = api_util::get(addr, "/health").await;
        }
        assert_eq!(health.status, 503, "{}", health.body);
        assert!(
            health.body.contains("MPI process 1 on host"),
            "{}",
            health.body
        );
        let refused = engine
            .complete(dcpserve::Prompt::Tokens(vec![5; 4]), greedy(4))
            .await
            .expect_err("a model without its ranks refuses requests");
        assert!(refused.to_string().contains("MPI process 1"), "{refused}");
        // Process 0 still answers.
        assert_eq!(api_util::get(addr, "/v1/models").await.status, 200);
        println!(
            "{name}: checked: request ended {:.2} s after `kill {signal}` with: {error}",
            ended_after.as_secs_f64()
        );
        if signal == "-STOP" {
            let _ = Command::new("kill").args(["-KILL", &pid]).status();
        }
    });
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
