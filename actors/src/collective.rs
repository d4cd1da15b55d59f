//! The collective actor: owns the communicators of one rank group.
//!
//! It builds the groups (the tensor-parallel world and the contiguous DCP groups) before
//! the ranks start, hands each rank its handles, reports the time ranks spend inside
//! collectives, and poisons the groups when a rank dies so the survivors' pending
//! collectives fail fast instead of waiting forever. The collectives themselves run
//! rank-to-rank through shared memory: one fixed order per step (the forward pass's),
//! never a mailbox hop per layer.

use std::sync::Arc;

use dcpserve_kernels::{Communicator, InProcessComm};
use dcpserve_model::arch::RankComms;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

/// Messages the collective actor understands.
pub enum CollectiveMsg {
    /// The communicators of TP rank `n`.
    Comms(usize, RpcReplyPort<RankComms>),
    /// Seconds each rank has spent in collectives so far.
    SecondsInCollectives(RpcReplyPort<Vec<f64>>),
    /// A rank failed: make every pending and future collective of this group fail. The
    /// reply comes once the group is poisoned (ask before stopping the actor: a stop
    /// overtakes queued messages).
    Poison(RpcReplyPort<()>),
}

pub struct CollectiveActor;

pub struct CollectiveState {
    world: Vec<Arc<InProcessComm>>,
    dcp: Vec<Arc<InProcessComm>>,
}

/// Group sizes: (tensor-parallel size, decode-context-parallel size).
pub type GroupShape = (usize, usize);

impl Actor for CollectiveActor {
    type Msg = CollectiveMsg;
    type State = CollectiveState;
    type Arguments = GroupShape;

    async fn pre_start(
        &self,
        _myself: ActorRef<CollectiveMsg>,
        (tp, dcp): GroupShape,
    ) -> Result<CollectiveState, ActorProcessingErr> {
        if tp == 0 || dcp == 0 || tp % dcp != 0 {
            return Err(format!("tp_size={tp} must be divisible by dcp_size={dcp}.").into());
        }
        let world = InProcessComm::group(tp).into_iter().map(Arc::new).collect();
        // DCP groups are contiguous blocks of `dcp` TP ranks: dcp_rank = tp_rank % dcp.
        let dcp_handles = (0..tp / dcp)
            .flat_map(|_| InProcessComm::group(dcp))
            .map(Arc::new)
            .collect();
        Ok(CollectiveState {
            world,
            dcp: dcp_handles,
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
                if let (Some(w), Some(d)) = (st.world.get(rank), st.dcp.get(rank)) {
                    let _ = port.send(RankComms {
                        world: w.clone() as Arc<dyn Communicator>,
                        dcp: d.clone() as Arc<dyn Communicator>,
                    });
                }
            }
            CollectiveMsg::SecondsInCollectives(port) => {
                let secs = st
                    .world
                    .iter()
                    .zip(&st.dcp)
                    .map(|(w, d)| w.seconds_in_collectives() + d.seconds_in_collectives())
                    .collect();
                let _ = port.send(secs);
            }
            CollectiveMsg::Poison(port) => {
                for c in st.world.iter().chain(&st.dcp) {
                    c.poison();
                }
                let _ = port.send(());
            }
        }
        Ok(())
    }
}
