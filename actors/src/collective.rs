//! The collective actor: owns the communicators of one rank group.
//!
//! It builds the groups (the tensor-parallel world and the contiguous DCP groups, one
//! set per micro-batch) before the ranks start, hands each rank its handles, reports the
//! time ranks spend inside collectives, and poisons the groups when a rank dies so the
//! survivors' pending collectives fail fast instead of waiting forever. The collectives
//! themselves run rank-to-rank through shared memory: one fixed order per step and
//! micro-batch (the forward pass's), never a mailbox hop per layer.
//!
//! With two micro-batches, each has its own groups (their collectives never interleave)
//! and each rank gets a [`ComputeBaton`] its two micro-batch threads share: the handles
//! lend it out while a collective waits, so one micro-batch's communication overlaps the
//! other's compute (see `dcpserve_kernels::overlap`).

use std::sync::Arc;

use dcpserve_kernels::{
    BatonComm, Communicator, ComputeBaton, InProcessComm, LinkModel, ModeledLink,
};
use dcpserve_model::arch::RankComms;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

/// Messages the collective actor understands.
pub enum CollectiveMsg {
    /// The communicators of TP rank `n`.
    Comms(usize, RpcReplyPort<RankChannels>),
    /// Seconds each rank has spent in collectives so far (all micro-batches).
    SecondsInCollectives(RpcReplyPort<Vec<f64>>),
    /// A rank failed: make every pending and future collective of this group fail. The
    /// reply comes once the group is poisoned (ask before stopping the actor: a stop
    /// overtakes queued messages).
    Poison(RpcReplyPort<()>),
}

/// What one rank computes with.
#[derive(Clone)]
pub struct RankChannels {
    /// One set of communicators per micro-batch.
    pub micro_batches: Vec<RankComms>,
    /// Shared by the rank's micro-batch threads when there are two.
    pub baton: Option<Arc<ComputeBaton>>,
}

/// How a rank group is laid out.
#[derive(Debug, Clone, Copy)]
pub struct GroupSpec {
    pub tp: usize,
    pub dcp: usize,
    /// 1, or 2 for micro-batches in ping-pong.
    pub micro_batches: usize,
    /// A modeled interconnect every collective also waits for (benchmarks).
    pub link: Option<LinkModel>,
}

impl GroupSpec {
    /// One micro-batch, shared-memory collectives.
    pub fn new(tp: usize, dcp: usize) -> Self {
        Self {
            tp,
            dcp,
            micro_batches: 1,
            link: None,
        }
    }
}

pub struct CollectiveActor;

/// The raw groups of one micro-batch, indexed by TP rank.
struct GroupSet {
    world: Vec<Arc<InProcessComm>>,
    dcp: Vec<Arc<InProcessComm>>,
}

impl GroupSet {
    fn new(tp: usize, dcp: usize) -> Self {
        let world = InProcessComm::group(tp).into_iter().map(Arc::new).collect();
        // DCP groups are contiguous blocks of `dcp` TP ranks: dcp_rank = tp_rank % dcp.
        let dcp = (0..tp / dcp)
            .flat_map(|_| InProcessComm::group(dcp))
            .map(Arc::new)
            .collect();
        Self { world, dcp }
    }
}

pub struct CollectiveState {
    spec: GroupSpec,
    sets: Vec<GroupSet>,
    batons: Vec<Arc<ComputeBaton>>,
}

impl CollectiveState {
    /// Rank `rank`'s handle on `comm`: through the modeled link if any, lending the
    /// rank's baton if it has two micro-batches.
    fn handle(&self, rank: usize, comm: &Arc<InProcessComm>) -> Arc<dyn Communicator> {
        let mut c: Arc<dyn Communicator> = comm.clone();
        if let Some(link) = self.spec.link {
            c = Arc::new(ModeledLink::new(c, link));
        }
        if self.spec.micro_batches > 1 {
            c = Arc::new(BatonComm::new(c, self.batons[rank].clone()));
        }
        c
    }
}

impl Actor for CollectiveActor {
    type Msg = CollectiveMsg;
    type State = CollectiveState;
    type Arguments = GroupSpec;

    async fn pre_start(
        &self,
        _myself: ActorRef<CollectiveMsg>,
        spec: GroupSpec,
    ) -> Result<CollectiveState, ActorProcessingErr> {
        let (tp, dcp) = (spec.tp, spec.dcp);
        if tp == 0 || dcp == 0 || tp % dcp != 0 {
            return Err(format!("tp_size={tp} must be divisible by dcp_size={dcp}.").into());
        }
        if !(1..=2).contains(&spec.micro_batches) {
            return Err(format!(
                "{} micro-batches requested; 1 or 2 are supported.",
                spec.micro_batches
            )
            .into());
        }
        Ok(CollectiveState {
            spec,
            sets: (0..spec.micro_batches)
                .map(|_| GroupSet::new(tp, dcp))
                .collect(),
            batons: (0..tp).map(|_| ComputeBaton::new()).collect(),
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<CollectiveMsg>,
        msg: CollectiveMsg,
        st: &mut CollectiveState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            CollectiveMsg::Comms(rank, port) => {
                if rank < st.spec.tp {
                    let micro_batches = st
                        .sets
                        .iter()
                        .map(|set| RankComms {
                            world: st.handle(rank, &set.world[rank]),
                            dcp: st.handle(rank, &set.dcp[rank]),
                        })
                        .collect();
                    let _ = port.send(RankChannels {
                        micro_batches,
                        baton: (st.spec.micro_batches > 1).then(|| st.batons[rank].clone()),
                    });
                }
            }
            CollectiveMsg::SecondsInCollectives(port) => {
                let secs = (0..st.spec.tp)
                    .map(|r| {
                        st.sets
                            .iter()
                            .map(|s| {
                                s.world[r].seconds_in_collectives()
                                    + s.dcp[r].seconds_in_collectives()
                            })
                            .sum()
                    })
                    .collect();
                let _ = port.send(secs);
            }
            CollectiveMsg::Poison(port) => {
                for set in &st.sets {
                    for c in set.world.iter().chain(&set.dcp) {
                        c.poison();
                    }
                }
                let _ = port.send(());
            }
        }
        Ok(())
    }
}
