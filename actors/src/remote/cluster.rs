//! Process 0's side of an MPI job: the control channel to the rank processes, the
//! routing of their reports to the rank groups, and the heartbeats that tell a lost
//! process from a slow one.
//!
//! Messages to a rank process leave through that process's outbox ([`Outbox`]), on a
//! thread of its own: `MPI_Send` of a message above the transport's eager limit waits
//! until the receiver takes it, forever if the receiver is stopped (SIGSTOP), and no
//! actor (a rank proxy that must still hear of the loss) or the control thread (the
//! heartbeats that detect it) may wait with it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use dcpserve_kernels::comm::mpi::{ControlChannel, MpiEnv};
use ractor::ActorRef;
use tokio::sync::oneshot;

use super::messages::{decode, encode, FromRankProcess, RankSpec, ToRankProcess};
use super::{HEARTBEAT_EVERY, LOST_AFTER};
use crate::collective::GroupLayout;
use crate::plan::StepReport;
use crate::rank::{RankMsg, StepSink};

/// The rank processes of this MPI job, seen from process 0.
pub struct Cluster {
    control: Arc<ControlChannel>,
    /// One per process (none for process 0).
    outboxes: Vec<Option<Outbox>>,
    hosts: Vec<String>,
    pids: Vec<u32>,
    state: Mutex<ClusterState>,
    stopping: AtomicBool,
    /// The control thread, joined before MPI is finalized (no MPI call may follow).
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// Where one rank process's reports go, for its current rank group.
struct Route {
    generation: u64,
    /// The global ranks the process hosts.
    ranks: Vec<usize>,
    reports: StepSink,
    proxies: Vec<ActorRef<RankMsg>>,
    /// Answered when the process says its ranks are up.
    started: Option<oneshot::Sender<Result<(), String>>>,
}

#[derive(Default)]
struct ClusterState {
    last_seen: Vec<Option<Instant>>,
    /// Why the job cannot serve any more (a process was lost).
    lost: Option<String>,
    routes: HashMap<usize, Route>,
}

/// The messages on their way to one rank process, sent in order by a thread of their
/// own. A thread stuck in `MPI_Send` to a stopped process holds up only that process's
/// messages, and it is lost anyway: nothing more is queued for it once it is.
struct Outbox {
    queue: Mutex<Option<mpsc::Sender<Vec<u8>>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Outbox {
    fn start(control: Arc<ControlChannel>, to: usize) -> Result<Self, String> {
        let (tx, rx) = mpsc::channel::<Vec<u8>>();
        let thread = std::thread::Builder::new()
            .name(format!("dcpserve-mpi-send-{to}"))
            .spawn(move || {
                while let Ok(bytes) = rx.recv() {
                    control.send(to, &bytes);
                }
            })
            .map_err(|e| format!("sender thread for MPI process {to}: {e}"))?;
        Ok(Self {
            queue: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
        })
    }

    fn push(&self, bytes: Vec<u8>) {
        if let Some(q) = &*self.queue.lock().unwrap_or_else(PoisonError::into_inner) {
            let _ = q.send(bytes);
        }
    }

    /// Stops taking messages; with `wait`, returns once those queued are sent (a lost
    /// process's thread may never return from MPI: it is left behind).
    fn close(&self, wait: bool) {
        self.queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let thread = self
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let (true, Some(t)) = (wait, thread) {
            let _ = t.join();
        }
    }
}

static CLUSTER: OnceLock<Arc<Cluster>> = OnceLock::new();

fn lock(m: &Mutex<ClusterState>) -> std::sync::MutexGuard<'_, ClusterState> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Cluster {
    /// Connects process 0 to the job's rank processes (each runs [`super::host::run`]):
    /// creates the control channel (collective), waits for every process's hello, and
    /// starts the thread that routes their messages and watches their heartbeats. The
    /// cluster is then [`Cluster::global`].
    pub fn start(env: &'static MpiEnv) -> Result<Arc<Cluster>, String> {
        if env.world_rank() != 0 {
            return Err("only MPI process 0 hosts the engine".into());
        }
        let control = Arc::new(ControlChannel::new(env));
        super::warn_if_bound(0);
        let size = control.size();
        let mut hosts = vec![String::new(); size];
        let mut pids = vec![0; size];
        hosts[0] = env.host().to_string();
        pids[0] = std::process::id();
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut missing = size - 1;
        while missing > 0 {
            if Instant::now() > deadline {
                return Err(format!(
                    "{missing} of the job's {size} MPI processes never said hello (are they running `dcpserve` too?)"
                ));
            }
            match control.try_recv() {
                Some((from, bytes)) => {
                    if let Ok((FromRankProcess::Hello { host, pid }, _)) = decode(&bytes) {
                        if hosts[from].is_empty() {
                            missing -= 1;
                        }
                        hosts[from] = host;
                        pids[from] = pid;
                    }
                }
                None => std::thread::sleep(Duration::from_millis(1)),
            }
        }
        let now = Instant::now();
        let outboxes = (0..size)
            .map(|p| {
                (p > 0)
                    .then(|| Outbox::start(control.clone(), p))
                    .transpose()
            })
            .collect::<Result<_, _>>()?;
        let cluster = Arc::new(Cluster {
            control,
            outboxes,
            state: Mutex::new(ClusterState {
                last_seen: (0..size).map(|p| (p > 0).then_some(now)).collect(),
                ..Default::default()
            }),
            hosts,
            pids,
            stopping: AtomicBool::new(false),
            thread: Mutex::new(None),
        });
        tracing::info!("MPI job: {size} processes on {}", cluster.hosts.join(", "));
        let c = cluster.clone();
        let thread = std::thread::Builder::new()
            .name("dcpserve-mpi-control".into())
            .spawn(move || c.serve())
            .map_err(|e| format!("control thread: {e}"))?;
        *cluster
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(thread);
        CLUSTER
            .set(cluster.clone())
            .map_err(|_| "the MPI cluster was already started")?;
        Ok(cluster)
    }

    /// The cluster [`Cluster::start`] started in this process, if any.
    pub fn global() -> Option<Arc<Cluster>> {
        CLUSTER.get().cloned()
    }

    /// Processes in the job (process 0 included).
    pub fn processes(&self) -> usize {
        self.hosts.len()
    }

    /// The host process `p` runs on.
    pub fn host(&self, p: usize) -> &str {
        &self.hosts[p]
    }

    /// The process id of process `p` on its host.
    pub fn pid(&self, p: usize) -> u32 {
        self.pids[p]
    }

    /// Why the job cannot serve any more, once a rank process is lost.
    pub fn lost(&self) -> Option<String> {
        lock(&self.state).lost.clone()
    }

    /// Queues a message for process `p` (never blocks; dropped once `p` is lost).
    fn send(&self, p: usize, msg: &ToRankProcess, payload: &[u8]) {
        if !self.alive(p) {
            return;
        }
        if let Some(outbox) = self.outboxes.get(p).and_then(Option::as_ref) {
            outbox.push(encode(msg, payload));
        }
    }

    /// Asks process `p` to start `ranks` of `generation`; their failures go to
    /// `reports`. The answer arrives on the returned channel.
    pub(crate) fn start_ranks(
        &self,
        p: usize,
        generation: u64,
        groups: &GroupLayout,
        ranks: Vec<RankSpec>,
        reports: StepSink,
    ) -> oneshot::Receiver<Result<(), String>> {
        let (tx, rx) = oneshot::channel();
        let mut st = lock(&self.state);
        if let Some(why) = &st.lost {
            let _ = tx.send(Err(why.clone()));
            return rx;
        }
        st.routes.insert(
            p,
            Route {
                generation,
                ranks: ranks.iter().map(|r| r.rank).collect(),
                reports,
                proxies: Vec::new(),
                started: Some(tx),
            },
        );
        drop(st);
        self.send(
            p,
            &ToRankProcess::Start {
                generation,
                groups: groups.clone(),
                ranks,
            },
            &[],
        );
        rx
    }

    /// The proxies of process `p`'s ranks in `generation`: they fail when it is lost.
    pub(crate) fn set_proxies(&self, p: usize, generation: u64, proxies: Vec<ActorRef<RankMsg>>) {
        let mut st = lock(&self.state);
        match st.routes.get_mut(&p) {
            Some(r) if r.generation == generation => r.proxies = proxies,
            _ => {}
        }
    }

    /// Sends a step plan (already encoded) to rank `rank` of process `p`.
    pub(crate) fn send_plan(&self, p: usize, rank: usize, plan: &[u8]) {
        self.send(p, &ToRankProcess::Plan { rank }, plan);
    }

    /// Sends any other message to process `p`.
    pub(crate) fn send_to(&self, p: usize, msg: &ToRankProcess) {
        self.send(p, msg, &[]);
    }

    /// Stops the remote ranks of `generation` (a group torn down).
    pub(crate) fn tear_down(&self, generation: u64) {
        let mut st = lock(&self.state);
        let procs: Vec<usize> = st
            .routes
            .iter()
            .filter(|(_, r)| r.generation == generation)
            .map(|(&p, _)| p)
            .collect();
        for p in &procs {
            st.routes.remove(p);
        }
        drop(st);
        for p in procs {
            self.send_to(p, &ToRankProcess::TearDown { generation });
        }
    }

    fn alive(&self, p: usize) -> bool {
        lock(&self.state)
            .last_seen
            .get(p)
            .is_some_and(|s| s.is_some())
    }

    /// Tells every rank process to leave, then leaves MPI (when no process was lost:
    /// finalizing waits for every process).
    pub fn shutdown(&self) {
        if self.stopping.swap(true, Ordering::SeqCst) {
            return;
        }
        if let Some(t) = self
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            let _ = t.join();
        }
        let lost = self.lost().is_some();
        for p in 1..self.processes() {
            let alive = self.alive(p);
            self.send_to(p, &ToRankProcess::Shutdown);
            if let Some(outbox) = &self.outboxes[p] {
                // Every message to a live process leaves before MPI is finalized.
                outbox.close(alive);
            }
        }
        if !lost {
            if let Some(env) = MpiEnv::get() {
                env.finalize();
            }
        }
    }

    /// The control thread: routes the rank processes' messages, sends heartbeats, and
    /// declares a process lost after [`LOST_AFTER`] of silence.
    fn serve(&self) {
        let mut next_beat = Instant::now();
        let mut idle = 0u32;
        while !self.stopping.load(Ordering::SeqCst) {
            if let Some((from, bytes)) = self.control.try_recv() {
                idle = 0;
                self.handle(from, &bytes);
                continue;
            }
            let now = Instant::now();
            if now >= next_beat {
                next_beat = now + HEARTBEAT_EVERY;
                for p in 1..self.processes() {
                    self.send_to(p, &ToRankProcess::Heartbeat);
                }
                self.check_heartbeats(now);
            }
            // Spin briefly after a message (replies come in bursts), then sleep.
            idle = idle.saturating_add(1);
            if idle > 64 {
                std::thread::sleep(Duration::from_micros(200));
            } else {
                std::thread::yield_now();
            }
        }
    }

    fn handle(&self, from: usize, bytes: &[u8]) {
        let msg = match decode::<FromRankProcess>(bytes) {
            Ok((msg, _)) => msg,
            Err(e) => {
                tracing::error!("MPI process {from}: {e}");
                return;
            }
        };
        let mut st = lock(&self.state);
        if let Some(seen) = st.last_seen.get_mut(from) {
            if seen.is_some() {
                *seen = Some(Instant::now());
            }
        }
        match msg {
            FromRankProcess::Hello { .. } | FromRankProcess::Heartbeat => {}
            FromRankProcess::Started { generation, result } => {
                if let Some(r) = st.routes.get_mut(&from) {
                    if r.generation == generation {
                        if let Some(tx) = r.started.take() {
                            let _ = tx.send(result);
                        }
                    }
                }
            }
            FromRankProcess::Report { report } => {
                let Some(route) = st.routes.get(&from) else {
                    return;
                };
                if let StepReport::Failed { generation, error } = &report {
                    if *generation != route.generation {
                        return;
                    }
                    for p in &route.proxies {
                        let _ = p.send_message(RankMsg::ComputeFailed(error.clone()));
                    }
                }
                let _ = route.reports.send(report);
            }
        }
    }

    fn check_heartbeats(&self, now: Instant) {
        let mut st = lock(&self.state);
        let silent: Vec<(usize, Duration)> = st
            .last_seen
            .iter()
            .enumerate()
            .filter_map(|(p, s)| s.map(|s| (p, now.saturating_duration_since(s))))
            .filter(|(_, d)| *d > LOST_AFTER)
            .collect();
        for (p, silence) in silent {
            st.last_seen[p] = None;
            if let Some(outbox) = &self.outboxes[p] {
                // What is queued for it is never sent (its thread may be stuck in MPI).
                outbox.close(false);
            }
            let ranks = st
                .routes
                .get(&p)
                .map(|r| format!(" (ranks {:?} of the model)", r.ranks))
                .unwrap_or_default();
            let why = format!(
                "MPI process {p} on host {}{ranks} was lost: no heartbeat for {:.1} s (it died or hangs); relaunch the MPI job to serve again",
                self.hosts[p],
                silence.as_secs_f64()
            );
            tracing::error!("{why}");
            st.lost.get_or_insert(why.clone());
            if let Some(mut route) = st.routes.remove(&p) {
                if let Some(tx) = route.started.take() {
                    let _ = tx.send(Err(why.clone()));
                }
                let _ = route.reports.send(StepReport::Failed {
                    generation: route.generation,
                    error: why.clone(),
                });
                for proxy in &route.proxies {
                    let _ = proxy.send_message(RankMsg::ComputeFailed(why.clone()));
                }
            }
        }
    }
}
