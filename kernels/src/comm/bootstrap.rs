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
    /// and one of them speaks MPI for the process (hierarchical collectives,
    /// `comm::mpi::HierarchicalComm`; needs the `mpi` feature). Each process's
    /// members must be contiguous in group order.
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

/// A group's members in this process, waiting for (or held by) their ranks.
struct Entry {
    /// By group rank; `None` for a member another process hosts (MPI).
    handles: Vec<Option<Arc<dyn Communicator>>>,
    connected: Vec<bool>,
}

fn registry() -> std::sync::MutexGuard<'static, HashMap<GroupId, Entry>> {
    static REGISTRY: OnceLock<Mutex<HashMap<GroupId, Entry>>> = OnceLock::new();
    REGISTRY
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

/// Why this build cannot serve `transport`, if it cannot.
fn unsupported(transport: &Transport) -> Option<KernelError> {
    match transport {
        Transport::SharedMemory => None,
        Transport::Nccl { .. } => Some(KernelError::Comm(
            "the NCCL transport is not implemented in this build (shared memory between ranks of one process is, and MPI with the `mpi` feature)".into(),
        )),
        #[cfg(feature = "mpi")]
        Transport::Mpi { .. } => None,
        #[cfg(not(feature = "mpi"))]
        Transport::Mpi { .. } => Some(KernelError::Comm(
            "the MPI transport needs dcpserve-kernels built with the `mpi` feature, and this build lacks it".into(),
        )),
    }
}

/// This process's members of the group `spec` lays out, by group rank.
fn local_members(spec: &CommGroupSpec) -> Result<Vec<Option<Arc<dyn Communicator>>>, KernelError> {
    if let Some(e) = unsupported(&spec.transport) {
        return Err(e);
    }
    match &spec.transport {
        #[cfg(feature = "mpi")]
        Transport::Mpi { processes } => super::mpi::hierarchical::adopt(spec, processes),
        _ => Ok(InProcessComm::group(spec.ranks.len())
            .into_iter()
            .map(|h| Some(Arc::new(h) as Arc<dyn Communicator>))
            .collect()),
    }
}

/// The creator's side of a group: registers it, hands out its [`CommGroupSpec`], and can
/// abort it or read its members' time in collectives. Dropping the owner unregisters
/// the group (connected members keep working).
pub struct GroupOwner {
    spec: CommGroupSpec,
    /// By group rank; `None` for members of other processes.
    members: Vec<Option<Arc<dyn Communicator>>>,
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
    ///
    /// For [`Transport::Mpi`] (feature `mpi`, after `MpiEnv::init`):
    /// registers the members this process hosts and creates the MPI communicator between
    /// the group's processes. Every process of the group must adopt the group, and all of
    /// them must adopt their groups in the same order: this blocks until every process of
    /// the group has adopted it.
    pub fn adopt(spec: CommGroupSpec) -> Result<Self, KernelError> {
        if registry().contains_key(&spec.id) {
            return Err(KernelError::Comm(format!(
                "group {:?} is already registered in this process",
                spec.id
            )));
        }
        // Outside the registry's lock: an MPI group's creation waits for other processes.
        let handles = local_members(&spec)?;
        let members = handles.clone();
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
    /// For an MPI group: the members of this process.
    pub fn abort(&self) {
        for m in self.members.iter().flatten() {
            m.abort();
        }
    }

    /// Seconds group rank `group_rank` has spent in collectives so far (0 for a member
    /// another process hosts).
    pub fn seconds_in_collectives(&self, group_rank: usize) -> f64 {
        self.members
            .get(group_rank)
            .and_then(Option::as_ref)
            .map_or(0.0, |m| m.seconds_in_collectives())
    }
}

impl Drop for GroupOwner {
    fn drop(&mut self) {
        registry().remove(&self.spec.id);
    }
}

/// Global rank `global_rank`'s communicator in the group `spec` describes. Each member
/// connects once, in the process that adopted its part of the group; the group must
/// still be registered (its owner alive).
pub fn connect(
    spec: &CommGroupSpec,
    global_rank: usize,
) -> Result<Arc<dyn Communicator>, KernelError> {
    if let Some(e) = unsupported(&spec.transport) {
        return Err(e);
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
    if entry.connected[group_rank] {
        return Err(KernelError::Comm(format!(
            "rank {global_rank} already connected to group {:?}",
            spec.id
        )));
    }
    let Some(handle) = entry.handles[group_rank].clone() else {
        let host = match &spec.transport {
            Transport::Mpi { processes } => {
                format!(" (it is hosted by MPI process {})", processes[group_rank])
            }
            _ => String::new(),
        };
        return Err(KernelError::Comm(format!(
            "rank {global_rank} of group {:?} is not a member of this process{host}",
            spec.id
        )));
    };
    entry.connected[group_rank] = true;
    Ok(handle)
}
