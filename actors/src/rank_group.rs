//! A rank group: one collective actor and `tp` rank actors laid out by a [`Layout`],
//! brought up together and torn down together. The target model's group (owned by the
//! model supervisor) and a draft model's group (owned by its proposer) are both built
//! here, linked to the supervisor, so the two cannot drift apart.
//!
//! One dead rank breaks the group's collectives, so a group is never repaired: it is
//! torn down (its collectives aborted first, so survivors blocked in one fail instead of
//! waiting) and a new generation is started in its place.

use std::sync::Arc;

use dcpserve_config::MergeExchange;
use dcpserve_kernels::dcp::Layout;
use dcpserve_kernels::{CpuMatmul, KvCacheDType, LinkModel};
use dcpserve_model::arch::WeightPrecision;
use dcpserve_model::ModelFiles;
use ractor::{Actor, ActorCell, ActorId, ActorProcessingErr, ActorRef};
use tokio::sync::mpsc::UnboundedSender;

use crate::collective::{CollectiveActor, CollectiveArgs, CollectiveMsg};
use crate::rank::{RankActor, RankArgs, RankMsg, StepReport, StepSink};

/// What every generation of a rank group is built from.
#[derive(Clone)]
pub struct RankGroupSpec {
    pub files: Arc<ModelFiles>,
    pub precision: WeightPrecision,
    /// How the ranks' CPU backends multiply by quantized weights.
    pub cpu_matmul: CpuMatmul,
    pub layout: Layout,
    /// KV blocks per rank.
    pub num_blocks: usize,
    /// How the ranks' KV caches store values.
    pub kv_cache_dtype: KvCacheDType,
    /// The most tokens one step computes (the ranks reserve their workspaces for it).
    pub max_step_tokens: usize,
    pub threads_per_rank: usize,
    /// A modeled interconnect every collective also waits for (benchmarks).
    pub link: Option<LinkModel>,
    pub dcp_merge: MergeExchange,
    /// Load the model's MTP layer (speculative method `mtp`).
    pub mtp: bool,
    /// Encode every report as bytes and back (checks that it can cross a process).
    pub serialize_reports: bool,
}

/// A running rank group.
pub struct RankGroup {
    generation: u64,
    ranks: Vec<ActorRef<RankMsg>>,
    collective: ActorRef<CollectiveMsg>,
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
        let tp = layout.tp();
        let args = CollectiveArgs {
            layout,
            link: spec.link,
            dcp_merge: spec.dcp_merge,
        };
        let (collective, _) =
            Actor::spawn_linked(None, CollectiveActor, args, supervisor.clone()).await?;
        let mut spawns = Vec::with_capacity(tp);
        for rank in 0..tp {
            let comm_specs = match ractor::call!(collective, CollectiveMsg::Comms, rank) {
                Ok(specs) => specs,
                Err(e) => {
                    collective.stop(None);
                    return Err(e.into());
                }
            };
            let args = RankArgs {
                rank,
                tp_size: tp,
                generation,
                comm_specs,
                files: spec.files.clone(),
                precision: spec.precision,
                cpu_matmul: spec.cpu_matmul,
                placement: layout.placement(rank),
                num_blocks: spec.num_blocks,
                kv_cache_dtype: spec.kv_cache_dtype,
                max_step_tokens: spec.max_step_tokens,
                threads: spec.threads_per_rank,
                reports: StepSink::new(reports.clone(), spec.serialize_reports),
                mtp: spec.mtp,
            };
            spawns.push(Actor::spawn_linked(
                None,
                RankActor,
                args,
                supervisor.clone(),
            ));
        }
        let mut ranks = Vec::with_capacity(tp);
        let mut failure = None;
        for r in futures::future::join_all(spawns).await {
            match r {
                Ok((r, _)) => ranks.push(r),
                Err(err) => failure = Some(err),
            }
        }
        if let Some(err) = failure {
            for r in ranks {
                r.stop(None);
            }
            collective.stop(None);
            return Err(err.into());
        }
        Ok(Self {
            generation,
            ranks,
            collective,
        })
    }

    /// Which generation of the group this is (restarts so far).
    pub fn generation(&self) -> u64 {
        self.generation
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
        self.collective.stop(Some(reason.into()));
        for r in self.ranks {
            r.stop(Some(reason.into()));
        }
    }
}
