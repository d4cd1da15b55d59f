//! The draft actor: owns a proposer and answers the scheduler's per-step requests.

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use super::{Draft, DraftProposer, DraftRequest};

/// Messages the draft actor understands.
pub enum DraftMsg {
    /// Drafts for this step's decoding sequences (an empty draft for any it cannot serve).
    Propose(Vec<DraftRequest>, RpcReplyPort<Vec<Draft>>),
    /// The sequence ended or was preempted.
    Release(u64),
    /// The target's rank group (re)started (see [`DraftProposer::set_ranks`]).
    SetRanks(u64, Vec<ractor::ActorRef<crate::rank::RankMsg>>),
    /// Test hook: make rank `n` of the proposer's own rank group fail on its next step.
    #[cfg(feature = "test-hooks")]
    InjectFault(usize),
}

pub struct DraftActor;

pub struct DraftState {
    proposer: Box<dyn DraftProposer>,
    /// Set when the proposer failed: speculation stops, decoding goes on without it.
    broken: Option<String>,
}

impl Actor for DraftActor {
    type Msg = DraftMsg;
    type State = DraftState;
    type Arguments = Box<dyn DraftProposer>;

    async fn pre_start(
        &self,
        _myself: ActorRef<DraftMsg>,
        proposer: Box<dyn DraftProposer>,
    ) -> Result<DraftState, ActorProcessingErr> {
        Ok(DraftState {
            proposer,
            broken: None,
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<DraftMsg>,
        msg: DraftMsg,
        st: &mut DraftState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            DraftMsg::Propose(batch, port) => {
                let empty = || Draft::none_for(&batch);
                let was_broken = st.broken.is_some();
                let drafts = if was_broken {
                    empty()
                } else {
                    match st.proposer.propose(&batch).await {
                        Ok(d) if d.len() == batch.len() => d,
                        Ok(d) => {
                            st.broken = Some(format!(
                                "{} proposer answered {} drafts for {} requests",
                                st.proposer.method(),
                                d.len(),
                                batch.len()
                            ));
                            empty()
                        }
                        Err(e) => {
                            st.broken = Some(e);
                            empty()
                        }
                    }
                };
                if let Some(why) = st.broken.as_ref().filter(|_| !was_broken) {
                    tracing::error!(
                        "speculative decoding ({}) disabled: {why}",
                        st.proposer.method()
                    );
                }
                let _ = port.send(drafts);
            }
            DraftMsg::Release(seq) => st.proposer.release(seq),
            DraftMsg::SetRanks(generation, ranks) => st.proposer.set_ranks(generation, ranks),
            #[cfg(feature = "test-hooks")]
            DraftMsg::InjectFault(n) => st.proposer.inject_fault(n),
        }
        Ok(())
    }
}
