//! A rank process of an MPI job (every MPI process but 0): hosts its share of each
//! model's ranks as [`RankActor`]s, driven by process 0 over the control channel.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dcpserve_kernels::comm::mpi::{ControlChannel, MpiEnv};
use dcpserve_kernels::comm::{GroupId, GroupOwner};
use dcpserve_model::ModelFiles;
use ractor::{Actor, ActorRef};

use super::messages::{decode, encode, FromRankProcess, RankSpec, ToRankProcess};
use super::{HEARTBEAT_EVERY, LOST_AFTER};
use crate::plan::StepReport;
use crate::rank::{RankActor, RankMsg, StepSink};

/// One generation of this process's ranks.
struct Generation {
    owners: HashMap<GroupId, GroupOwner>,
    ranks: HashMap<usize, ActorRef<RankMsg>>,
}

/// Serves process 0 until it says to stop (then returns 0, the exit code) or is lost
/// (returns 1). Call it instead of the engine in every MPI process but 0, after
/// [`MpiEnv::init`].
pub fn run(env: &'static MpiEnv) -> i32 {
    let control = Arc::new(ControlChannel::new(env));
    let me = env.world_rank();
    super::warn_if_bound(me);
    let send = {
        let control = control.clone();
        move |msg: &FromRankProcess| control.send(0, &encode(msg, &[]))
    };
    send(&FromRankProcess::Hello {
        host: env.host().to_string(),
        pid: std::process::id(),
    });
    // Heartbeats from their own thread: loading a large shard must not look like a hang.
    let beating = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let heartbeat = {
        let send = send.clone();
        let beating = beating.clone();
        std::thread::Builder::new()
            .name("dcpserve-mpi-heartbeat".into())
            .spawn(move || {
                while beating.load(std::sync::atomic::Ordering::SeqCst) {
                    send(&FromRankProcess::Heartbeat);
                    std::thread::sleep(HEARTBEAT_EVERY);
                }
            })
            .ok()
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("MPI process {me}: tokio runtime: {e}");
            return 1;
        }
    };
    // The ranks' reports (their failures) go back to process 0.
    let (reports_tx, mut reports_rx) = tokio::sync::mpsc::unbounded_channel::<StepReport>();
    {
        let send = send.clone();
        rt.spawn(async move {
            while let Some(report) = reports_rx.recv().await {
                send(&FromRankProcess::Report { report });
            }
        });
    }
    let mut files: HashMap<PathBuf, Arc<ModelFiles>> = HashMap::new();
    let mut generations: HashMap<u64, Generation> = HashMap::new();
    let mut last_heard = Instant::now();
    let mut idle = 0u32;
    tracing::info!(
        "MPI process {me} (pid {}) on {}: serving ranks for process 0",
        std::process::id(),
        env.host()
    );
    let code = loop {
        let Some((_, bytes)) = control.try_recv() else {
            if last_heard.elapsed() > LOST_AFTER {
                tracing::error!(
                    "MPI process {me}: process 0 is silent for {:.1} s; leaving",
                    last_heard.elapsed().as_secs_f64()
                );
                break 1;
            }
            idle = idle.saturating_add(1);
            if idle > 64 {
                std::thread::sleep(Duration::from_micros(100));
            } else {
                std::thread::yield_now();
            }
            continue;
        };
        idle = 0;
        last_heard = Instant::now();
        let (msg, payload) = match decode::<ToRankProcess>(&bytes) {
            Ok(m) => m,
            Err(e) => {
                tracing::error!("MPI process {me}: {e}");
                continue;
            }
        };
        let rank_of = |gens: &HashMap<u64, Generation>, rank: usize| {
            gens.values().find_map(|g| g.ranks.get(&rank).cloned())
        };
        match msg {
            ToRankProcess::Heartbeat => {}
            ToRankProcess::Start {
                generation,
                groups,
                ranks,
            } => {
                let result = start(&rt, &mut files, &groups, ranks, &reports_tx, me).map(|g| {
                    generations.insert(generation, g);
                });
                send(&FromRankProcess::Started { generation, result });
                // Loading may have taken long: process 0's heartbeats are queued.
                last_heard = Instant::now();
            }
            ToRankProcess::Plan { rank } => {
                if let Some(r) = rank_of(&generations, rank) {
                    let _ = r.send_message(RankMsg::ExecuteEncoded(Arc::new(payload.to_vec())));
                }
            }
            ToRankProcess::Mtp { rank, plan } => {
                if let Some(r) = rank_of(&generations, rank) {
                    let _ = r.send_message(RankMsg::Mtp(Arc::new(plan), None));
                }
            }
            ToRankProcess::InjectFault { rank } => {
                #[cfg(feature = "test-hooks")]
                if let Some(r) = rank_of(&generations, rank) {
                    let _ = r.send_message(RankMsg::InjectFault);
                }
                #[cfg(not(feature = "test-hooks"))]
                tracing::warn!("rank {rank}: fault injection needs the test-hooks feature");
            }
            ToRankProcess::TearDown { generation } => {
                if let Some(g) = generations.remove(&generation) {
                    for r in tear_down(g) {
                        r.stop(Some("rank group torn down".into()));
                    }
                }
            }
            ToRankProcess::Shutdown => break 0,
        }
    };
    for (_, g) in generations.drain() {
        for r in tear_down(g) {
            // Ranks must be gone before MPI is: their communicators are freed as they stop.
            let _ = rt.block_on(r.stop_and_wait(None, Some(Duration::from_secs(10))));
        }
    }
    rt.shutdown_timeout(Duration::from_secs(5));
    // No MPI call may follow finalize: the heartbeat thread ends first.
    beating.store(false, std::sync::atomic::Ordering::SeqCst);
    if let Some(h) = heartbeat {
        let _ = h.join();
    }
    drop(send);
    drop(control);
    if code == 0 {
        env.finalize();
    }
    code
}

/// Registers this process's part of the groups and brings up its ranks.
fn start(
    rt: &tokio::runtime::Runtime,
    files: &mut HashMap<PathBuf, Arc<ModelFiles>>,
    groups: &crate::collective::GroupLayout,
    ranks: Vec<RankSpec>,
    reports: &tokio::sync::mpsc::UnboundedSender<StepReport>,
    me: usize,
) -> Result<Generation, String> {
    let (Some(first), Some(last)) = (
        ranks.iter().map(|r| r.rank).min(),
        ranks.iter().map(|r| r.rank).max(),
    ) else {
        return Err(format!("MPI process {me} was given no ranks"));
    };
    // First, in the order every process uses: process 0 waits in the same calls.
    let owners = groups
        .adopt(&(first..last + 1))
        .map_err(|e| format!("MPI process {me}: communicators: {e}"))?;
    let local = ranks.len();
    let mut spawned = HashMap::new();
    let mut failure = None;
    for args in ranks {
        let files = match files.get(&args.model) {
            Some(f) => f.clone(),
            None => {
                let f = ModelFiles::open(&args.model)
                    .map(Arc::new)
                    .map_err(|e| format!("MPI process {me}: {}: {e}", args.model.display()))?;
                files.insert(args.model.clone(), f.clone());
                f
            }
        };
        let rank = args.rank;
        let threads = (dcpserve_kernels::available_cores() / local).max(1);
        let rank_args = args.into_rank_args(files, StepSink::new(reports.clone(), false), threads);
        spawned.insert(rank, rt.spawn(Actor::spawn(None, RankActor, rank_args)));
    }
    let mut ranks = HashMap::new();
    for (rank, handle) in spawned {
        match rt.block_on(handle) {
            Ok(Ok((actor, _))) => {
                ranks.insert(rank, actor);
            }
            Ok(Err(e)) => failure = Some(format!("MPI process {me}: rank {rank}: {e}")),
            Err(e) => failure = Some(format!("MPI process {me}: rank {rank}: {e}")),
        }
    }
    let generation = Generation { owners, ranks };
    match failure {
        Some(e) => {
            for r in tear_down(generation) {
                r.stop(Some("a rank failed to start".into()));
            }
            Err(e)
        }
        None => Ok(generation),
    }
}

/// Aborts the generation's collectives (ranks blocked in one fail) and returns its ranks
/// to stop.
fn tear_down(g: Generation) -> Vec<ActorRef<RankMsg>> {
    g.owners.values().for_each(GroupOwner::abort);
    g.ranks.into_values().collect()
}
