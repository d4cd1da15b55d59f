//! A rank group: one collective actor and `tp` rank actors laid out by a [`Layout`],
//! brought up together and torn down together. The target model's group (owned by the
//! model supervisor) and a draft model's group (owned by its proposer) are both built
//! here, linked to the supervisor, so the two cannot drift apart.
//!
//! One dead rank breaks the group's collectives, so a group is never repaired: it is
//! torn down (its collectives aborted first, so survivors blocked in one fail instead of
//! waiting) and a new generation is started in its place.

use std::sync::Arc;

use dcpserve_config::{MergeExchange, RankSettings};
use dcpserve_kernels::dcp::Layout;
use dcpserve_kernels::{KvCacheDType, LinkModel};
use dcpserve_model::arch::WeightPrecision;
use dcpserve_model::ModelFiles;
use ractor::{Actor, ActorCell, ActorId, ActorProcessingErr, ActorRef};
use tokio::sync::mpsc::UnboundedSender;

use crate::collective::{CollectiveActor, CollectiveArgs, CollectiveMsg, GroupLayout};
use crate::process_map::ProcessMap;
use crate::rank::{RankActor, RankMsg, StepReport, StepSink};
use crate::remote::messages::RankSpec;

/// Where a rank group's ranks run.
#[derive(Clone, Default)]
pub enum Executor {
    /// Every rank is a thread of this process.
    #[default]
    InProcess,
    /// The ranks are split evenly over the processes of an MPI job; this is process 0.
    #[cfg(feature = "mpi")]
    Mpi(Arc<crate::remote::Cluster>),
}

impl Executor {
    /// Which process hosts which of `tp` ranks (checks that the processes divide them).
    pub fn process_map(&self, world: usize) -> Result<ProcessMap, String> {
        match self {
            Executor::InProcess => Ok(ProcessMap::single(world)),
            #[cfg(feature = "mpi")]
            Executor::Mpi(c) => ProcessMap::new(world, c.processes()),
        }
    }
}

/// What every generation of a rank group is built from.
#[derive(Clone)]
pub struct RankGroupSpec {
    pub files: Arc<ModelFiles>,
    pub precision: WeightPrecision,
    /// What every rank builds its backend from (`--device` and the matmul and CUDA
    /// graph modes).
    pub rank_settings: RankSettings,
    pub layout: Layout,
    /// KV blocks per rank.
    pub num_blocks: usize,
    /// How the ranks' KV caches store values.
    pub kv_cache_dtype: KvCacheDType,
    /// The most tokens one step computes (the ranks reserve their workspaces for it).
    pub max_step_tokens: usize,
    pub threads_per_rank: usize,
    /// Whether `threads_per_rank` was asked for (else a rank process splits its own
    /// host's cores over its ranks).
    pub explicit_threads: bool,
    /// A modeled interconnect every collective also waits for (benchmarks).
    pub link: Option<LinkModel>,
    pub dcp_merge: MergeExchange,
    /// Load the model's MTP layer (speculative method `mtp`).
    pub mtp: bool,
    /// Encode every report as bytes and back (checks that it can cross a process).
    pub serialize_reports: bool,
    /// Threads of this process, or the processes of an MPI job.
    pub executor: Executor,
}

/// A running rank group.
pub struct RankGroup {
    generation: u64,
    ranks: Vec<ActorRef<RankMsg>>,
    collective: ActorRef<CollectiveMsg>,
    executor: Executor,
}

impl RankGroup {
    /// Spawns the collective actor and the ranks (loading their shards in parallel), all
    /// linked to `supervisor`; every rank answers into `reports`. On any failure, what
    /// was already spawned is stopped and the error returned.
    pub async fn start(
        spec: &RankGroupSpec,
        generation: u64,
        reports: UnboundedSender<StepReport>,
        supervisor: ActorCell,
    ) -> Result<Self, ActorProcessingErr> {
        let layout = spec.layout;
        let world = layout.world();
        let processes = spec.executor.process_map(world)?;
        // A lost process never comes back (and creating an MPI group with it would wait
        // forever).
        #[cfg(feature = "mpi")]
        if let Executor::Mpi(cluster) = &spec.executor {
            if let Some(why) = cluster.lost() {
                return Err(why.into());
            }
        }
        let groups = GroupLayout::new(&layout, &processes)?;
        // Ranks in other processes start first: process 0 registers its part of the MPI
        // groups (below, in the collective actor) while they register theirs.
        #[cfg(feature = "mpi")]
        let remote_started = match &spec.executor {
            Executor::Mpi(cluster) => {
                let sink = StepSink::new(reports.clone(), spec.serialize_reports);
                (1..processes.processes)
                    .map(|p| {
                        let ranks = processes
                            .ranks_of(p)
                            .map(|rank| rank_spec(spec, &groups, rank, generation))
                            .collect();
                        (
                            p,
                            cluster.start_ranks(p, generation, &groups, ranks, sink.clone()),
                        )
                    })
                    .collect::<Vec<_>>()
            }
            Executor::InProcess => Vec::new(),
        };
        let args = CollectiveArgs {
            layout,
            groups: groups.clone(),
            local_ranks: processes.ranks_of(0),
            link: spec.link,
            dcp_merge: spec.dcp_merge,
        };
        let (collective, _) =
            Actor::spawn_linked(None, CollectiveActor, args, supervisor.clone()).await?;
        let mut spawns = Vec::with_capacity(world);
        for rank in processes.ranks_of(0) {
            let args = rank_spec(spec, &groups, rank, generation).into_rank_args(
                spec.files.clone(),
                StepSink::new(reports.clone(), spec.serialize_reports),
                spec.threads_per_rank,
            );
            spawns.push(Actor::spawn_linked(
                None,
                RankActor,
                args,
                supervisor.clone(),
            ));
        }
        let mut ranks = Vec::with_capacity(world);
        let mut failure: Option<ActorProcessingErr> = None;
        for r in futures::future::join_all(spawns).await {
            match r {
                Ok((r, _)) => ranks.push(r),
                Err(err) => failure = Some(err.into()),
            }
        }
        #[cfg(feature = "mpi")]
        if let Executor::Mpi(cluster) = &spec.executor {
            for (p, started) in remote_started {
                let result = started
                    .await
                    .unwrap_or_else(|_| Err(format!("MPI process {p} never answered")));
                if let Err(e) = result {
                    failure.get_or_insert(e.into());
                    continue;
                }
                let mut proxies = Vec::new();
                for rank in processes.ranks_of(p) {
                    let state = crate::remote::proxy::RemoteRankState {
                        rank,
                        process: p,
                        cluster: cluster.clone(),
                    };
                    match Actor::spawn_linked(
                        None,
                        crate::remote::proxy::RemoteRank,
                        state,
                        supervisor.clone(),
                    )
                    .await
                    {
                        Ok((r, _)) => {
                            proxies.push(r.clone());
                            ranks.push(r);
                        }
                        Err(e) => {
                            failure.get_or_insert(e.into());
                        }
                    }
                }
                cluster.set_proxies(p, generation, proxies);
            }
        }
        let group = Self {
            generation,
            ranks,
            collective,
            executor: spec.executor.clone(),
        };
        if let Some(err) = failure {
            group.tear_down("a rank failed to start").await;
            return Err(err);
        }
        Ok(group)
    }

    /// Which generation of the group this is (restarts so far).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Where the group's ranks run.
    pub fn executor(&self) -> &Executor {
        &self.executor
    }

    /// The rank actors, in TP-rank order.
    pub fn ranks(&self) -> &[ActorRef<RankMsg>] {
        &self.ranks
    }

    /// The group's collective actor.
    pub fn collective(&self) -> &ActorRef<CollectiveMsg> {
        &self.collective
    }

    /// Whether `id` is one of this group's actors (a rank or its collective actor).
    pub fn contains(&self, id: ActorId) -> bool {
        self.collective.get_id() == id || self.ranks.iter().any(|r| r.get_id() == id)
    }

    /// Aborts the group's collectives (survivors blocked in one fail at once), then stops
    /// every actor of the group.
    pub async fn tear_down(self, reason: &str) {
        if let Err(e) = ractor::call!(self.collective, CollectiveMsg::Poison) {
            tracing::error!("could not abort the failed group's collectives: {e}");
        }
        #[cfg(feature = "mpi")]
        if let Executor::Mpi(cluster) = &self.executor {
            cluster.tear_down(self.generation);
        }
        self.collective.stop(Some(reason.into()));
        for r in self.ranks {
            r.stop(Some(reason.into()));
        }
    }
}

/// What rank `rank` is started from, in this process or another.
fn rank_spec(spec: &RankGroupSpec, groups: &GroupLayout, rank: usize, generation: u64) -> RankSpec {
    let layout = spec.layout;
    RankSpec {
        rank,
        tp_size: layout.tp(),
        generation,
        comm_specs: groups.rank_specs(&layout, rank, spec.link, spec.dcp_merge),
        model: spec.files.path.clone(),
        precision: spec.precision,
        rank_settings: spec.rank_settings.clone(),
        placement: layout.placement(rank),
        num_blocks: spec.num_blocks,
        kv_cache_dtype: spec.kv_cache_dtype,
        max_step_tokens: spec.max_step_tokens,
        threads: spec.explicit_threads.then_some(spec.threads_per_rank),
        mtp: spec.mtp,
    }
}
