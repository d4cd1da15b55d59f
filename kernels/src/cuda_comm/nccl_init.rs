//! Making NCCL communicators: all ranks of one process at once, one rank from a unique
//! id (ranks in several processes or threads), and the unique id sent over MPI.
//!
//! Every constructor checks first that `libcuda` and `libnccl` load ([`super::probe`]):
//! cudarc panics on a missing library, these return [`KernelError`].

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream};
use cudarc::nccl::result as nccl_result;
use cudarc::nccl::sys::{ncclComm_t, ncclUniqueId};

use super::elem::{drv, nccl};
use super::nccl::NcclCollectives;
use super::probe::{check_driver, check_lib, CudaLib};
use crate::error::KernelError;

/// Bytes of an NCCL unique id (`NCCL_UNIQUE_ID_BYTES`): what travels in
/// [`crate::comm::Transport::Nccl`]'s `unique_id`.
pub const NCCL_UNIQUE_ID_BYTES: usize = 128;

/// Checks that the CUDA driver and NCCL can be loaded, without loading them through cudarc.
pub fn nccl_preflight() -> Result<(), KernelError> {
    check_driver()?;
    check_lib(CudaLib::Nccl)
}

/// A fresh NCCL unique id (`ncclGetUniqueId`), made by one rank (or the group's owner)
/// and handed to every member, e.g. in a [`crate::comm::CommGroupSpec`].
pub fn new_nccl_unique_id() -> Result<[u8; NCCL_UNIQUE_ID_BYTES], KernelError> {
    nccl_preflight()?;
    let id = nccl_result::get_uniqueid().map_err(nccl("ncclGetUniqueId"))?;
    // c_char is i8 on x86-64 and u8 on aarch64: reinterpret, never cast.
    Ok(id.internal.map(|c| u8::from_ne_bytes(c.to_ne_bytes())))
}

impl NcclCollectives {
    /// The communicators of ranks that are threads of this process, one per stream in
    /// group-rank order (`ncclCommInitAll`). Each stream must be on a different GPU (see
    /// [`super::choose_gpu_collectives`]).
    pub fn group(streams: &[Arc<CudaStream>]) -> Result<Vec<NcclCollectives>, KernelError> {
        nccl_preflight()?;
        if streams.is_empty() {
            return Err(KernelError::Comm(
                "an NCCL group needs at least one rank".into(),
            ));
        }
        let ordinals: Vec<i32> = streams
            .iter()
            .map(|s| s.context().ordinal() as i32)
            .collect();
        let mut comms: Vec<ncclComm_t> = vec![std::ptr::null_mut(); streams.len()];
        // SAFETY: `comms` and `ordinals` hold `streams.len()` entries.
        unsafe {
            nccl_result::comm_init_all(comms.as_mut_ptr(), streams.len() as i32, ordinals.as_ptr())
        }
        .map_err(nccl("ncclCommInitAll"))?;
        let size = streams.len();
        Ok(comms
            .into_iter()
            .zip(streams)
            .enumerate()
            .map(|(rank, (comm, stream))| {
                NcclCollectives::from_raw(comm, stream.clone(), rank, size)
            })
            .collect())
    }

    /// The group's communicator of rank `rank` of `size`, joining with the group's
    /// unique id (`ncclCommInitRank`). Blocks until every rank has joined, so the ranks
    /// must call it concurrently (their own threads or processes).
    pub fn from_unique_id(
        stream: Arc<CudaStream>,
        rank: usize,
        size: usize,
        unique_id: &[u8],
    ) -> Result<NcclCollectives, KernelError> {
        nccl_preflight()?;
        if rank >= size {
            return Err(KernelError::Comm(format!(
                "NCCL rank {rank} of a group of {size}"
            )));
        }
        let bytes: [u8; NCCL_UNIQUE_ID_BYTES] = unique_id.try_into().map_err(|_| {
            KernelError::Comm(format!(
                "an NCCL unique id has {NCCL_UNIQUE_ID_BYTES} bytes, got {}",
                unique_id.len()
            ))
        })?;
        let id = ncclUniqueId {
            internal: bytes.map(|b| b as std::ffi::c_char),
        };
        // NCCL takes the device of the thread's current context.
        stream
            .context()
            .bind_to_thread()
            .map_err(drv("binding the rank's context"))?;
        let mut comm: ncclComm_t = std::ptr::null_mut();
        // SAFETY: `comm` is written by NCCL on success.
        unsafe { nccl_result::comm_init_rank(&mut comm, size as i32, id, rank as i32) }
            .map_err(nccl("ncclCommInitRank"))?;
        Ok(NcclCollectives::from_raw(comm, stream, rank, size))
    }

    /// A group of ranks on the GPUs `ordinals`, each on a new stream of the device's
    /// primary context: for tests and device checks (a rank's backend brings its own
    /// stream to [`NcclCollectives::group`]).
    pub fn on_devices(ordinals: &[usize]) -> Result<Vec<NcclCollectives>, KernelError> {
        nccl_preflight()?;
        let streams = ordinals
            .iter()
            .map(|&o| {
                CudaContext::new(o)
                    .and_then(|ctx| ctx.new_stream())
                    .map_err(drv("creating a stream"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Self::group(&streams)
    }
}

/// The NCCL unique id of a group spread over MPI processes: made by world rank `root`
/// and broadcast over `comm` to every process (collective over `comm`: every process
/// calls it, in the same order as its other collectives). Each process then joins with
/// [`NcclCollectives::from_unique_id`].
#[cfg(feature = "mpi")]
pub fn nccl_unique_id_over_mpi<C: mpi::traits::Communicator>(
    comm: &C,
    root: usize,
) -> Result<[u8; NCCL_UNIQUE_ID_BYTES], KernelError> {
    use mpi::traits::Root;
    let size = comm.size() as usize;
    if root >= size {
        return Err(KernelError::Comm(format!(
            "NCCL unique id root {root} outside an MPI communicator of {size}"
        )));
    }
    let mut id = [0u8; NCCL_UNIQUE_ID_BYTES];
    // The root's failure to make an id must not leave the others waiting in the
    // broadcast: a flag byte travels first, then the id.
    let mut ok = [1u8];
    let mut err = None;
    if comm.rank() as usize == root {
        match new_nccl_unique_id() {
            Ok(made) => id = made,
            Err(e) => {
                ok[0] = 0;
                err = Some(e);
            }
        }
    }
    let root_process = comm.process_at_rank(root as i32);
    root_process.broadcast_into(&mut ok[..]);
    if ok[0] == 0 {
        return Err(err.unwrap_or_else(|| {
            KernelError::Comm(format!(
                "MPI process {root} could not make the NCCL unique id"
            ))
        }));
    }
    root_process.broadcast_into(&mut id[..]);
    Ok(id)
}
