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

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use dcpserve_kernels::comm::{connect, CommGroupSpec, GroupId, GroupOwner};
use dcpserve_kernels::dcp::{Layout, MergeExchange, PrefillSplit};
use dcpserve_kernels::{
    Backend, BatonComm, Communicator, ComputeBaton, CpuBackend, HostCollectives, KernelError,
    LinkModel, ModeledLink,
};
use dcpserve_model::arch::RankComms;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde::{Deserialize, Serialize};

use crate::process_map::ProcessMap;

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
    /// Which tokens of a step this rank's copy of the TP group computes.
    pub split: PrefillSplit,
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
                    split: self.split,
                })
            })
            .collect::<Result<_, KernelError>>()?;
        Ok(RankChannels {
            micro_batches,
            baton,
        })
    }
}

/// What one rank computes with: collectives on its backend's buffers (host
/// communicators for the CPU backend, [`RankCommSpecs::connect`]).
pub struct RankChannels<B: Backend = CpuBackend> {
    /// One set of communicators per micro-batch.
    pub micro_batches: Vec<RankComms<B>>,
    /// Shared by the rank's micro-batch threads when there are two.
    pub baton: Option<Arc<ComputeBaton>>,
}

impl<B: Backend> Clone for RankChannels<B> {
    fn clone(&self) -> Self {
        Self {
            micro_batches: self.micro_batches.clone(),
            baton: self.baton.clone(),
        }
    }
}

/// The communicator groups of one rank group, laid out before any rank starts: the
/// tensor-parallel world and the contiguous DCP groups of the [`Layout`], one set per
/// micro-batch. Plain data: the process that lays them out sends them to the rank
/// processes of an MPI job, and every process registers its part in the same order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupLayout {
    sets: Vec<GroupSet>,
}

/// The groups of one micro-batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct GroupSet {
    /// One tensor-parallel group per prefill-context-parallel copy.
    world: Vec<CommGroupSpec>,
    /// One context-parallel group per DCP group (its DCP groups in every copy), in
    /// group order.
    dcp: Vec<CommGroupSpec>,
}

impl GroupLayout {
    /// Lays out the groups of `layout` over the processes of `processes`: a group whose
    /// ranks share one process communicates through shared memory, one spanning
    /// processes through MPI.
    pub fn new(layout: &Layout, processes: &ProcessMap) -> Result<Self, KernelError> {
        let spec = |ranks: Vec<usize>| {
            let transport = processes.transport(&ranks);
            CommGroupSpec::new(ranks, transport)
        };
        let sets = (0..layout.micro_batches())
            .map(|_| {
                Ok(GroupSet {
                    world: (0..layout.pcp())
                        .map(|p| spec(layout.tp_group_ranks(p).collect()))
                        .collect::<Result<_, KernelError>>()?,
                    dcp: (0..layout.num_dcp_groups())
                        .map(|g| spec(layout.cp_group_ranks(g)))
                        .collect::<Result<_, KernelError>>()?,
                })
            })
            .collect::<Result<_, KernelError>>()?;
        Ok(Self { sets })
    }

    /// Every group, in the order every process registers them (MPI communicators are
    /// created collectively, so the order must be the same everywhere).
    pub fn in_order(&self) -> impl Iterator<Item = &CommGroupSpec> {
        self.sets.iter().flat_map(|s| s.world.iter().chain(&s.dcp))
    }

    /// Registers, in order, every group with a member among the global ranks `local`
    /// (this process's ranks): may block until the other processes of an MPI group
    /// register theirs.
    pub fn adopt(&self, local: &Range<usize>) -> Result<HashMap<GroupId, GroupOwner>, KernelError> {
        let mut owners = HashMap::new();
        for spec in self.in_order() {
            if spec.ranks.iter().any(|r| local.contains(r)) {
                owners.insert(spec.id, GroupOwner::adopt(spec.clone())?);
            }
        }
        Ok(owners)
    }

    /// What global rank `rank` connects with.
    pub fn rank_specs(
        &self,
        layout: &Layout,
        rank: usize,
        link: Option<LinkModel>,
        dcp_merge: MergeExchange,
    ) -> RankCommSpecs {
        RankCommSpecs {
            rank,
            micro_batches: self
                .sets
                .iter()
                .map(|set| MicroBatchSpecs {
                    world: set.world[layout.pcp_rank(rank)].clone(),
                    dcp: set.dcp[layout.dcp_group_of(rank)].clone(),
                })
                .collect(),
            link,
            dcp_merge,
            split: layout.prefill_split(rank),
        }
    }
}

/// How the collective actor lays out its groups.
#[derive(Debug, Clone)]
pub struct CollectiveArgs {
    /// The rank group's layout (tp, DCP groups, micro-batches).
    pub layout: Layout,
    /// The groups, laid out by whoever starts the rank group.
    pub groups: GroupLayout,
    /// The global ranks this process hosts (all of them unless ranks live in several
    /// processes): the actor registers the groups they are members of.
    pub local_ranks: Range<usize>,
    /// A modeled interconnect every collective also waits for (benchmarks).
    pub link: Option<LinkModel>,
    /// How DCP groups exchange attention partials.
    pub dcp_merge: MergeExchange,
}

impl CollectiveArgs {
    /// Shared-memory collectives between ranks of this process, the default merge exchange.
    pub fn new(layout: Layout) -> Result<Self, KernelError> {
        Ok(Self {
            groups: GroupLayout::new(&layout, &ProcessMap::single(layout.world()))?,
            local_ranks: 0..layout.world(),
            layout,
            link: None,
            dcp_merge: MergeExchange::default(),
        })
    }
}

pub struct CollectiveActor;

pub struct CollectiveState {
    args: CollectiveArgs,
    /// This process's part of every group it has members in.
    owners: HashMap<GroupId, GroupOwner>,
}

impl CollectiveState {
    /// Seconds group member `spec.group_rank(rank)` spent in collectives, if this process
    /// hosts it.
    fn seconds(&self, spec: &CommGroupSpec, rank: usize) -> f64 {
        match (self.owners.get(&spec.id), spec.group_rank(rank)) {
            (Some(owner), Some(g)) => owner.seconds_in_collectives(g),
            _ => 0.0,
        }
    }
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
        // Registering an MPI group waits for the other processes: off the async workers.
        let (groups, local) = (args.groups.clone(), args.local_ranks.clone());
        let owners = tokio::task::spawn_blocking(move || groups.adopt(&local)).await??;
        Ok(CollectiveState { args, owners })
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
                if rank < layout.world() {
                    let _ = port.send(st.args.groups.rank_specs(
                        &layout,
                        rank,
                        st.args.link,
                        st.args.dcp_merge,
                    ));
                }
            }
            CollectiveMsg::SecondsInCollectives(port) => {
                let secs = (0..layout.world())
                    .map(|r| {
                        st.args
                            .groups
                            .sets
                            .iter()
                            .map(|s| {
                                st.seconds(&s.world[layout.pcp_rank(r)], r)
                                    + st.seconds(&s.dcp[layout.dcp_group_of(r)], r)
                            })
                            .sum()
                    })
                    .collect();
                let _ = port.send(secs);
            }
            CollectiveMsg::Poison(port) => {
                st.owners.values().for_each(GroupOwner::abort);
                let _ = port.send(());
            }
        }
        Ok(())
    }
}
