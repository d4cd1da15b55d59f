//! The collective actor: lays out the communicator groups of one rank group.
//!
//! It creates the groups (the tensor-parallel world and the contiguous DCP groups of
//! the [`Layout`], one set per micro-batch) before the ranks start and hands each rank
//! plain, serializable [`RankCommSpecs`]; a rank builds its communicators from them
//! through the bootstrap ([`RankCommSpecs::connect`]). The actor keeps the groups'
//! [`GroupOwner`]s: it reports the time ranks spend inside collectives, and aborts the
//! groups when a rank dies so the survivors' pending collectives fail fast instead of
//! waiting forever. The collectives themselves run rank-to-rank (shared memory today):
//! one fixed order per step and micro-batch (the forward pass's), never a mailbox hop
//! per layer.
//!
//! With two micro-batches, each has its own groups (their collectives never interleave)
//! and each rank gets a [`ComputeBaton`] its two micro-batch threads share: the handles
//! lend it out while a collective waits, so one micro-batch's communication overlaps the
//! other's compute (see `dcpserve_kernels::overlap`).

use std::sync::Arc;

use dcpserve_kernels::comm::{connect, CommGroupSpec, GroupOwner, Transport};
use dcpserve_kernels::dcp::{Layout, MergeExchange};
use dcpserve_kernels::{
    BatonComm, Communicator, ComputeBaton, HostCollectives, KernelError, LinkModel, ModeledLink,
};
use dcpserve_model::arch::RankComms;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde::{Deserialize, Serialize};

/// Messages the collective actor understands.
pub enum CollectiveMsg {
    /// The group specs TP rank `n` connects with.
    Comms(usize, RpcReplyPort<RankCommSpecs>),
    /// Seconds each rank has spent in collectives so far (all micro-batches).
    SecondsInCollectives(RpcReplyPort<Vec<f64>>),
    /// A rank failed: make every pending and future collective of this group fail. The
    /// reply comes once the groups are aborted (ask before stopping the actor: a stop
    /// overtakes queued messages).
    Poison(RpcReplyPort<()>),
}

/// The groups of one micro-batch, as one rank sees them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MicroBatchSpecs {
    /// The tensor-parallel world (all ranks of the model).
    pub world: CommGroupSpec,
    /// The rank's DCP group (a contiguous block of `dcp` ranks).
    pub dcp: CommGroupSpec,
}

/// Everything one rank needs to build its communicators: plain data that could travel
/// to a rank in another process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankCommSpecs {
    /// The rank's global (TP) rank.
    pub rank: usize,
    /// One set of groups per micro-batch.
    pub micro_batches: Vec<MicroBatchSpecs>,
    /// A modeled interconnect every collective also waits for (benchmarks).
    pub link: Option<LinkModel>,
    /// How the DCP group exchanges attention partials.
    pub dcp_merge: MergeExchange,
}

impl RankCommSpecs {
    /// Connects to every group through the bootstrap and wraps the handles: through
    /// the modeled link if any, lending the rank's (new) baton with two micro-batches.
    pub fn connect(&self) -> Result<RankChannels, KernelError> {
        let baton = (self.micro_batches.len() > 1).then(ComputeBaton::new);
        let handle = |spec: &CommGroupSpec| -> Result<Arc<dyn Communicator>, KernelError> {
            let mut c = connect(spec, self.rank)?;
            if let Some(link) = self.link {
                c = Arc::new(ModeledLink::new(c, link));
            }
            if let Some(b) = &baton {
                c = Arc::new(BatonComm::new(c, b.clone()));
            }
            Ok(c)
        };
        let micro_batches = self
            .micro_batches
            .iter()
            .map(|mb| {
                Ok(RankComms {
                    world: Arc::new(HostCollectives::new(handle(&mb.world)?)),
                    dcp: Arc::new(HostCollectives::new(handle(&mb.dcp)?)),
                    dcp_merge: self.dcp_merge,
                })
            })
            .collect::<Result<_, KernelError>>()?;
        Ok(RankChannels {
            micro_batches,
            baton,
        })
    }
}

/// What one rank computes with.
#[derive(Clone)]
pub struct RankChannels {
    /// One set of communicators per micro-batch.
    pub micro_batches: Vec<RankComms>,
    /// Shared by the rank's micro-batch threads when there are two.
    pub baton: Option<Arc<ComputeBaton>>,
}

/// How the collective actor lays out its groups.
#[derive(Debug, Clone, Copy)]
pub struct CollectiveArgs {
    /// The rank group's layout (tp, DCP groups, micro-batches).
    pub layout: Layout,
    /// A modeled interconnect every collective also waits for (benchmarks).
    pub link: Option<LinkModel>,
    /// How DCP groups exchange attention partials.
    pub dcp_merge: MergeExchange,
}

impl CollectiveArgs {
    /// Shared-memory collectives, the default merge exchange.
    pub fn new(layout: Layout) -> Self {
        Self {
            layout,
            link: None,
            dcp_merge: MergeExchange::default(),
        }
    }
}

pub struct CollectiveActor;

/// The groups of one micro-batch.
struct GroupSet {
    world: GroupOwner,
    /// One per DCP group, in group order.
    dcp: Vec<GroupOwner>,
}

impl GroupSet {
    fn new(layout: &Layout) -> Result<Self, KernelError> {
        let world = GroupOwner::create((0..layout.tp()).collect(), Transport::SharedMemory)?;
        let dcp = (0..layout.num_dcp_groups())
            .map(|g| {
                GroupOwner::create(layout.dcp_group_ranks(g).collect(), Transport::SharedMemory)
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { world, dcp })
    }

    fn abort(&self) {
        self.world.abort();
        self.dcp.iter().for_each(GroupOwner::abort);
    }
}

pub struct CollectiveState {
    args: CollectiveArgs,
    sets: Vec<GroupSet>,
}

impl Actor for CollectiveActor {
    type Msg = CollectiveMsg;
    type State = CollectiveState;
    type Arguments = CollectiveArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<CollectiveMsg>,
        args: CollectiveArgs,
    ) -> Result<CollectiveState, ActorProcessingErr> {
        let sets = (0..args.layout.micro_batches())
            .map(|_| GroupSet::new(&args.layout))
            .collect::<Result<_, _>>()?;
        Ok(CollectiveState { args, sets })
    }

    async fn handle(
        &self,
        _myself: ActorRef<CollectiveMsg>,
        msg: CollectiveMsg,
        st: &mut CollectiveState,
    ) -> Result<(), ActorProcessingErr> {
        let layout = st.args.layout;
        match msg {
            CollectiveMsg::Comms(rank, port) => {
                if rank < layout.tp() {
                    let micro_batches = st
                        .sets
                        .iter()
                        .map(|set| MicroBatchSpecs {
                            world: set.world.spec().clone(),
                            dcp: set.dcp[layout.dcp_group_of(rank)].spec().clone(),
                        })
                        .collect();
                    let _ = port.send(RankCommSpecs {
                        rank,
                        micro_batches,
                        link: st.args.link,
                        dcp_merge: st.args.dcp_merge,
                    });
                }
            }
            CollectiveMsg::SecondsInCollectives(port) => {
                let secs = (0..layout.tp())
                    .map(|r| {
                        st.sets
                            .iter()
                            .map(|s| {
                                s.world.seconds_in_collectives(r)
                                    + s.dcp[layout.dcp_group_of(r)]
                                        .seconds_in_collectives(layout.dcp_rank(r))
                            })
                            .sum()
                    })
                    .collect();
                let _ = port.send(secs);
            }
            CollectiveMsg::Poison(port) => {
                st.sets.iter().for_each(GroupSet::abort);
                let _ = port.send(());
            }
        }
        Ok(())
    }
}
