//! A rank in another process, as the scheduler sees it: an actor in process 0 that takes
//! the rank's messages and forwards them over the job's control channel.

use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef};

use super::messages::ToRankProcess;
use super::Cluster;
use crate::plan::wire;
use crate::rank::RankMsg;

/// The proxy of one remote rank.
pub struct RemoteRank;

/// Which rank it stands for, and where that rank lives.
pub struct RemoteRankState {
    pub rank: usize,
    pub process: usize,
    pub cluster: Arc<Cluster>,
}

impl Actor for RemoteRank {
    type Msg = RankMsg;
    type State = RemoteRankState;
    type Arguments = RemoteRankState;

    async fn pre_start(
        &self,
        _myself: ActorRef<RankMsg>,
        args: RemoteRankState,
    ) -> Result<RemoteRankState, ActorProcessingErr> {
        Ok(args)
    }

    async fn handle(
        &self,
        _myself: ActorRef<RankMsg>,
        msg: RankMsg,
        st: &mut RemoteRankState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            RankMsg::Execute(plan) => {
                let bytes = wire::encode(&*plan)?;
                st.cluster.send_plan(st.process, st.rank, &bytes);
            }
            RankMsg::ExecuteEncoded(bytes) => st.cluster.send_plan(st.process, st.rank, &bytes),
            RankMsg::Mtp(plan, reply) => {
                if let Some(reply) = reply {
                    // Only rank 0 answers MTP steps, and rank 0 is in process 0.
                    let _ = reply.send(Err(format!(
                        "rank {} is in another process and does not answer MTP steps",
                        st.rank
                    )));
                }
                st.cluster.send_to(
                    st.process,
                    &ToRankProcess::Mtp {
                        rank: st.rank,
                        plan: (*plan).clone(),
                    },
                );
            }
            #[cfg(feature = "test-hooks")]
            RankMsg::InjectFault => st
                .cluster
                .send_to(st.process, &ToRankProcess::InjectFault { rank: st.rank }),
            RankMsg::ComputeFailed(e) => return Err(format!("rank {}: {e}", st.rank).into()),
            RankMsg::KvStorage(port) => {
                // Diagnostics of a remote rank's cache are not carried over MPI: dropping
                // the port answers the caller with an error.
                tracing::warn!(
                    rank = st.rank,
                    "KV storage diagnostics are not available for a rank in another process"
                );
                drop(port);
            }
        }
        Ok(())
    }
}
