//! A rank joins its GPU group on its own thread: the per-rank connect of GPU ranks that
//! are threads of one process.
//!
//! Each rank builds its backend (and so its stream) on its own compute thread, but
//! `ncclCommInitAll` and [`DeviceLocalCollectives::group`] want every rank's stream at
//! once. [`join_gpu_group`] is the meeting point: ranks register their stream under the
//! group's key (a `GroupId`), the last to arrive picks the transport
//! ([`choose_gpu_collectives`]) and builds every member's handle, and each rank leaves
//! with its own. Ranks in other processes join an NCCL group with
//! [`NcclCollectives::from_unique_id`] instead.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use cudarc::driver::{CudaStream, CudaView, CudaViewMut};

use super::choose::{choose_gpu_collectives, GpuCommKind};
use super::device_local::DeviceLocalCollectives;
use super::elem::GpuCommElem;
use super::nccl::NcclCollectives;
use crate::error::KernelError;

/// One rank's GPU collectives, whichever transport its group got.
pub enum GpuCollectives {
    /// Ranks on distinct GPUs.
    Nccl(NcclCollectives),
    /// Ranks that are threads of this process, some sharing a GPU.
    DeviceLocal(DeviceLocalCollectives),
}

/// Forwards a method to whichever transport `self` holds.
macro_rules! forward {
    ($self:ident, $c:ident => $call:expr) => {
        match $self {
            GpuCollectives::Nccl($c) => $call,
            GpuCollectives::DeviceLocal($c) => $call,
        }
    };
}

impl GpuCollectives {
    /// This rank's index in the group.
    pub fn rank(&self) -> usize {
        forward!(self, c => c.rank())
    }
    /// Ranks in the group.
    pub fn size(&self) -> usize {
        forward!(self, c => c.size())
    }
    /// The stream every call enqueues on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        forward!(self, c => c.stream())
    }
    /// Opens a group of calls (`ncclGroupStart`).
    pub fn group_start(&self) {
        forward!(self, c => c.group_start())
    }
    /// Closes the group of calls (`ncclGroupEnd`).
    pub fn group_end(&self) -> Result<(), KernelError> {
        forward!(self, c => c.group_end())
    }
    /// See [`NcclCollectives::all_gather`].
    pub fn all_gather<T: GpuCommElem>(
        &self,
        input: CudaView<'_, T>,
        out: CudaViewMut<'_, T>,
    ) -> Result<(), KernelError> {
        forward!(self, c => c.all_gather(input, out))
    }
    /// See [`NcclCollectives::all_reduce_sum`].
    pub fn all_reduce_sum<T: GpuCommElem>(
        &self,
        data: CudaViewMut<'_, T>,
    ) -> Result<(), KernelError> {
        forward!(self, c => c.all_reduce_sum(data))
    }
    /// See [`NcclCollectives::reduce_scatter_sum`].
    pub fn reduce_scatter_sum<T: GpuCommElem>(
        &self,
        input: CudaView<'_, T>,
        out: CudaViewMut<'_, T>,
    ) -> Result<(), KernelError> {
        forward!(self, c => c.reduce_scatter_sum(input, out))
    }
    /// See [`NcclCollectives::broadcast`].
    pub fn broadcast<T: GpuCommElem>(
        &self,
        data: CudaViewMut<'_, T>,
        root: usize,
    ) -> Result<(), KernelError> {
        forward!(self, c => c.broadcast(data, root))
    }
    /// See [`NcclCollectives::all_gather_varying`].
    pub fn all_gather_varying<T: GpuCommElem>(
        &self,
        input: CudaView<'_, T>,
        counts: &[usize],
        out: CudaViewMut<'_, T>,
    ) -> Result<(), KernelError> {
        forward!(self, c => c.all_gather_varying(input, counts, out))
    }
    /// See [`NcclCollectives::all_to_all`].
    pub fn all_to_all<T: GpuCommElem>(
        &self,
        input: CudaView<'_, T>,
        out: CudaViewMut<'_, T>,
    ) -> Result<(), KernelError> {
        forward!(self, c => c.all_to_all(input, out))
    }
    /// Breaks the group (every rank's waiting and later calls fail).
    pub fn abort(&self) {
        forward!(self, c => c.abort())
    }
}

/// A group whose ranks are arriving.
struct Pending {
    streams: Vec<Option<Arc<CudaStream>>>,
    /// Set once the last rank has built the group: each rank takes its handle.
    built: Option<Result<Vec<Option<GpuCollectives>>, String>>,
    /// The transport chosen, for every member to report.
    kind: Option<GpuCommKind>,
    taken: usize,
}

struct Registry {
    groups: Mutex<HashMap<u64, Pending>>,
    changed: Condvar,
}

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| Registry {
        groups: Mutex::new(HashMap::new()),
        changed: Condvar::new(),
    })
}

fn lock(r: &Registry) -> MutexGuard<'_, HashMap<u64, Pending>> {
    r.groups.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Builds the handles of a group from every member's stream.
fn build(
    streams: &[Arc<CudaStream>],
) -> (GpuCommKind, Result<Vec<Option<GpuCollectives>>, String>) {
    let ordinals: Vec<usize> = streams.iter().map(|s| s.context().ordinal()).collect();
    let kind = choose_gpu_collectives(&ordinals);
    let built = match &kind {
        GpuCommKind::Nccl { .. } => NcclCollectives::group(streams).map(|v| {
            v.into_iter()
                .map(|c| Some(GpuCollectives::Nccl(c)))
                .collect()
        }),
        GpuCommKind::DeviceLocal { .. } | GpuCommKind::InProcess { .. } => {
            DeviceLocalCollectives::group(streams).map(|v| {
                v.into_iter()
                    .map(|c| Some(GpuCollectives::DeviceLocal(c)))
                    .collect()
            })
        }
    };
    (kind, built.map_err(|e| e.to_string()))
}

/// Joins rank `rank` (of `size`) to the in-process GPU group `key` with the rank's
/// stream; blocks until every member has joined (at most `patience`), then returns the
/// rank's collectives and the transport chosen, whose `Display` says which and why (log
/// it). Every member must pass the same `key` and `size`.
pub fn join_gpu_group(
    key: u64,
    rank: usize,
    size: usize,
    stream: Arc<CudaStream>,
    patience: Duration,
) -> Result<(GpuCollectives, GpuCommKind), KernelError> {
    let err = |m: String| KernelError::Comm(format!("GPU group {key}, rank {rank}: {m}"));
    if rank >= size {
        return Err(err(format!("rank outside a group of {size}")));
    }
    let reg = registry();
    let mut groups = lock(reg);
    let pending = groups.entry(key).or_insert_with(|| Pending {
        streams: vec![None; size],
        built: None,
        kind: None,
        taken: 0,
    });
    if pending.streams.len() != size {
        return Err(err(format!(
            "joined with size {size}, the group has {}",
            pending.streams.len()
        )));
    }
    if pending.streams[rank].is_some() {
        return Err(err("joined twice".into()));
    }
    if let Some(Err(e)) = &pending.built {
        // The group gave up waiting before this rank came.
        let e = e.clone();
        pending.taken += 1;
        if pending.taken == size {
            groups.remove(&key);
        }
        return Err(err(e));
    }
    pending.streams[rank] = Some(stream);
    if pending.streams.iter().all(Option::is_some) {
        let streams: Vec<Arc<CudaStream>> = pending.streams.iter().flatten().cloned().collect();
        // Building (NCCL init, NVRTC) takes a while: not under the registry's lock.
        drop(groups);
        let (kind, built) = build(&streams);
        groups = lock(reg);
        if let Some(p) = groups.get_mut(&key) {
            p.kind = Some(kind);
            p.built = Some(built);
        }
        reg.changed.notify_all();
    }
    let start = Instant::now();
    loop {
        let Some(p) = groups.get_mut(&key) else {
            return Err(err("the group was dropped while joining".into()));
        };
        match &mut p.built {
            Some(Ok(handles)) => {
                let mine = handles[rank].take();
                let kind = p.kind.clone();
                p.taken += 1;
                if p.taken == size {
                    groups.remove(&key);
                }
                return match (mine, kind) {
                    (Some(c), Some(k)) => Ok((c, k)),
                    _ => Err(err("handle already taken".into())),
                };
            }
            Some(Err(e)) => {
                let e = e.clone();
                p.taken += 1;
                if p.taken == size {
                    groups.remove(&key);
                }
                return Err(err(e));
            }
            None => {}
        }
        let waited = start.elapsed();
        if waited >= patience {
            // The late members find the error, not a half-built group.
            p.built = Some(Err(format!("not every rank joined within {patience:?}")));
            p.taken += 1;
            reg.changed.notify_all();
            return Err(err(format!("not every rank joined within {patience:?}")));
        }
        groups = reg
            .changed
            .wait_timeout(groups, patience - waited)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
}
