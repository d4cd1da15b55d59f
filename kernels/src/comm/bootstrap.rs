//! From a plain group spec to a rank's communicator.
//!
//! Whoever lays out a rank group (the collective actor) creates each group once, as a
//! [`GroupOwner`], and hands every member the group's [`CommGroupSpec`]: plain,
//! serializable data (which ranks, which group id, which transport). A rank then builds
//! its communicator with [`connect`]. For [`Transport::SharedMemory`] the groups live in
//! a registry of this process keyed by [`GroupId`]; the owner keeps the group's handles
//! to abort it when a rank fails and to read the time ranks spend in collectives.
//!
//! A group whose members live in another process is laid out here ([`CommGroupSpec::new`])
//! and registered there: the process that hosts its members calls [`GroupOwner::adopt`]
//! with the spec it received. Ranks of different processes connect through another
//! transport: MPI ([`Transport::Mpi`], feature `mpi`), or an NCCL unique id (created by
//! the owner, sent in the spec, `ncclCommInitRank` on each rank; not in this build).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use serde::{Deserialize, Serialize};

use super::{Communicator, InProcessComm};
use crate::error::KernelError;

/// Identifies one communicator group (unique within the process that created it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GroupId(pub u64);

/// How the ranks of a group reach each other.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Transport {
    /// Threads of this process, through shared memory ([`InProcessComm`]).
    SharedMemory,
    /// NCCL (GPU ranks, in this or other processes): the owner's `ncclGetUniqueId`
    /// travels in the spec and each rank calls `ncclCommInitRank` with it. Not
    /// implemented in this build: [`connect`] refuses it.
    Nccl { unique_id: Vec<u8> },
    /// MPI (CPU ranks in several processes): `processes[i]` is the MPI world rank of the
    /// process that hosts member `i`. Members of one process reduce through shared memory
    /// and one of them speaks MPI for the process (hierarchical collectives).
    Mpi { processes: Vec<usize> },
}

/// Everything a rank needs to join a communicator group: plain data that can be sent
/// to another process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommGroupSpec {
    pub id: GroupId,
    /// Global ranks of the members in group-rank order: `ranks[i]` is group rank `i`.
    pub ranks: Vec<usize>,
    pub transport: Transport,
}

impl CommGroupSpec {
    /// Lays out a group of the global ranks `ranks` (in group-rank order) with a new id,
    /// registering nothing: the process hosting the members adopts it
    /// ([`GroupOwner::adopt`]).
    pub fn new(ranks: Vec<usize>, transport: Transport) -> Result<Self, KernelError> {
        if ranks.is_empty() {
            return Err(KernelError::Comm("a group needs at least one rank".into()));
        }
        let mut sorted = ranks.clone();
        sorted.sort_unstable();
        if sorted.windows(2).any(|w| w[0] == w[1]) {
            return Err(KernelError::Comm(format!(
                "group ranks {ranks:?} name a rank twice"
            )));
        }
        if let Transport::Mpi { processes } = &transport {
            if processes.len() != ranks.len() {
                return Err(KernelError::Comm(format!(
                    "an MPI group of {} ranks names {} processes",
                    ranks.len(),
                    processes.len()
                )));
            }
        }
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        let id = GroupId(NEXT_ID.fetch_add(1, Ordering::Relaxed));
        Ok(Self {
            id,
            ranks,
            transport,
        })
    }

    /// The group rank of global rank `global_rank`, if it is a member.
    pub fn group_rank(&self, global_rank: usize) -> Option<usize> {
        self.ranks.iter().position(|&r| r == global_rank)
    }
}

/// A shared-memory group waiting for (or holding) its members.
struct Entry {
    handles: Vec<Arc<InProcessComm>>,
    connected: Vec<bool>,
}

fn registry() -> std::sync::MutexGuard<'static, HashMap<GroupId, Entry>> {
    static REGISTRY: OnceLock<Mutex<HashMap<GroupId, Entry>>> = OnceLock::new();
    REGISTRY
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

fn not_in_this_build(transport: &Transport) -> KernelError {
    let name = match transport {
        Transport::SharedMemory => "shared memory",
        Transport::Nccl { .. } => "NCCL",
        Transport::Mpi { .. } => "MPI",
    };
    KernelError::Comm(format!(
        "the {name} transport is not implemented in this build (only shared memory between ranks of one process is)"
    ))
}

/// The creator's side of a group: registers it, hands out its [`CommGroupSpec`], and can
/// abort it or read its members' time in collectives. Dropping the owner unregisters
/// the group (connected members keep working).
pub struct GroupOwner {
    spec: CommGroupSpec,
    members: Vec<Arc<dyn Communicator>>,
}

impl GroupOwner {
    /// Creates a group of the global ranks `ranks` (in group-rank order).
    ///
    /// ```
    /// use dcpserve_kernels::comm::{connect, GroupOwner, Transport};
    /// let owner = GroupOwner::create(vec![4, 5], Transport::SharedMemory).unwrap();
    /// // The spec is plain data: it could travel to another process as JSON.
    /// let json = serde_json::to_string(owner.spec()).unwrap();
    /// let spec = serde_json::from_str(&json).unwrap();
    /// let comms: Vec<_> = [4, 5].map(|r| connect(&spec, r).unwrap()).into();
    /// std::thread::scope(|s| {
    ///     for c in &comms {
    ///         s.spawn(move || {
    ///             let mut x = [c.rank() as f32];
    ///             c.all_reduce_sum(&mut x).unwrap();
    ///             assert_eq!(x, [1.0]);
    ///         });
    ///     }
    /// });
    /// ```
    pub fn create(ranks: Vec<usize>, transport: Transport) -> Result<Self, KernelError> {
        Self::adopt(CommGroupSpec::new(ranks, transport)?)
    }

    /// Registers this process's part of the group `spec` lays out (all of it, for shared
    /// memory), so that its members here can [`connect`].
    pub fn adopt(spec: CommGroupSpec) -> Result<Self, KernelError> {
        if spec.transport != Transport::SharedMemory {
            return Err(not_in_this_build(&spec.transport));
        }
        let handles: Vec<Arc<InProcessComm>> = InProcessComm::group(spec.ranks.len())
            .into_iter()
            .map(Arc::new)
            .collect();
        let members = handles
            .iter()
            .map(|h| h.clone() as Arc<dyn Communicator>)
            .collect();
        let mut reg = registry();
        if reg.contains_key(&spec.id) {
            return Err(KernelError::Comm(format!(
                "group {:?} is already registered in this process",
                spec.id
            )));
        }
        reg.insert(
            spec.id,
            Entry {
                connected: vec![false; handles.len()],
                handles,
            },
        );
        Ok(Self { spec, members })
    }

    /// The spec members connect with.
    pub fn spec(&self) -> &CommGroupSpec {
        &self.spec
    }

    /// Breaks the group (through [`Communicator::abort`]): every pending and later
    /// collective of every member fails fast.
    pub fn abort(&self) {
        for m in &self.members {
            m.abort();
        }
    }

    /// Seconds group rank `group_rank` has spent in collectives so far.
    pub fn seconds_in_collectives(&self, group_rank: usize) -> f64 {
        self.members
            .get(group_rank)
            .map_or(0.0, |m| m.seconds_in_collectives())
    }
}

impl Drop for GroupOwner {
    fn drop(&mut self) {
        registry().remove(&self.spec.id);
    }
}

/// Global rank `global_rank`'s communicator in the group `spec` describes. Each member
/// connects once; the group must still be registered (its owner alive).
pub fn connect(
    spec: &CommGroupSpec,
    global_rank: usize,
) -> Result<Arc<dyn Communicator>, KernelError> {
    if spec.transport != Transport::SharedMemory {
        return Err(not_in_this_build(&spec.transport));
    }
    let group_rank = spec.group_rank(global_rank).ok_or_else(|| {
        KernelError::Comm(format!(
            "rank {global_rank} is not a member of group {:?} (ranks {:?})",
            spec.id, spec.ranks
        ))
    })?;
    let mut reg = registry();
    let entry = reg.get_mut(&spec.id).ok_or_else(|| {
        KernelError::Comm(format!(
            "group {:?} is not registered in this process (its owner is gone, or the spec comes from another process)",
            spec.id
        ))
    })?;
    if entry.handles.len() != spec.ranks.len() {
        return Err(KernelError::Comm(format!(
            "group {:?} has {} ranks, the spec names {}",
            spec.id,
            entry.handles.len(),
            spec.ranks.len()
        )));
    }
    if std::mem::replace(&mut entry.connected[group_rank], true) {
        return Err(KernelError::Comm(format!(
            "rank {global_rank} already connected to group {:?}",
            spec.id
        )));
    }
    Ok(entry.handles[group_rank].clone())
}
