//! Step metadata staging: one arena per lane (stream), so uploading positions, slots,
//! block tables and token maps costs no host wait and no device allocation per op.
//!
//! An op stages all of its metadata in one call ([`MetaArena::stage`]): the parts are
//! written, 16-byte aligned, into a pinned host arena and one async host-to-device
//! copy per part moves them to the same offsets of a device arena; the op launches its
//! kernel with the device addresses. Offsets only grow within a step, so no part
//! overwrites another while its kernel may still read it.
//!
//! Reuse across steps ([`MetaArena::begin_step`]): the device arena is rewritten by
//! copies on the same stream, which run after the previous step's kernels (stream
//! order). The pinned side is written by the host, so it has two halves used by
//! alternate steps: before a step writes a half, the host waits for an event recorded
//! when the step before last ended (its copies long done, so usually no real wait).
//!
//! A step whose metadata outgrows the arena (or ops called without step boundaries,
//! as tests do) wraps: the host waits for the stream, every earlier part is then
//! consumed, and the arena starts over at offset 0 — larger, up to [`MAX_BYTES`], so
//! the next such step fits. An op's parts never straddle a wrap.

use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, DevicePtr, PinnedHostSlice};

use crate::cuda::device::driver_err;
use crate::error::KernelError;
use crate::step_graph;

/// Alignment of every staged part (the widest element staged is 8 bytes).
const ALIGN: usize = 16;
/// First size of each arena (a decode step of a few hundred tokens needs far less).
const INITIAL_BYTES: usize = 1 << 20;
/// Largest size a wrap grows an arena to; bigger steps wrap (and wait) more often.
pub(crate) const MAX_BYTES: usize = 64 << 20;

/// Element types staged as metadata: plain numbers, no padding, every bit pattern
/// valid, so their bytes can be copied as they are.
pub(crate) trait MetaElem: Copy {}
impl MetaElem for u32 {}
impl MetaElem for u64 {}
impl MetaElem for f32 {}

/// The bytes of a slice of metadata.
pub(crate) fn bytes_of<T: MetaElem>(s: &[T]) -> &[u8] {
    // SAFETY: `MetaElem` types are plain numbers without padding; the byte view
    // covers exactly the slice and borrows it.
    unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<u8>(), std::mem::size_of_val(s)) }
}

/// One lane's pinned host halves and device arena (see the module docs).
pub(crate) struct MetaArena {
    stream: Arc<CudaStream>,
    /// Two pinned halves of `cap` bytes, used by alternate steps.
    host: [PinnedHostSlice<u8>; 2],
    /// Their addresses (taken once: `PinnedHostSlice`'s accessors wait on its event).
    host_addr: [usize; 2],
    dev: CudaSlice<u8>,
    cap: usize,
    /// The half the current step writes.
    half: usize,
    /// Bytes of the current half (and the device arena) in use this step.
    used: usize,
    /// Recorded on the stream when the step that wrote half `i` ended.
    fence: [CudaEvent; 2],
}

impl MetaArena {
    /// Arenas of [`INITIAL_BYTES`] for `stream`.
    pub(crate) fn new(stream: &Arc<CudaStream>) -> Result<MetaArena, KernelError> {
        let ctx = stream.context();
        let event = || {
            ctx.new_event(None)
                .map_err(|e| driver_err("creating a staging event", e))
        };
        let fence = [event()?, event()?];
        let (host, host_addr, dev) = alloc(stream, INITIAL_BYTES)?;
        Ok(MetaArena {
            stream: stream.clone(),
            host,
            host_addr,
            dev,
            cap: INITIAL_BYTES,
            half: 0,
            used: 0,
            fence,
        })
    }

    /// Starts a step: fences the half the last step wrote, switches to the other one
    /// and waits (on the host) until the copies of the step that last wrote it are
    /// done (the step before last: normally long finished).
    pub(crate) fn begin_step(&mut self) -> Result<(), KernelError> {
        let what = "fencing step metadata";
        self.fence[self.half]
            .record(&self.stream)
            .map_err(|e| driver_err(what, e))?;
        self.half ^= 1;
        // An event never recorded (the first steps) completes at once.
        self.fence[self.half]
            .synchronize()
            .map_err(|e| driver_err("waiting for an old step's metadata copies", e))?;
        self.used = 0;
        Ok(())
    }

    /// The current step's fill mark (bytes of its half in use).
    pub(crate) fn mark(&self) -> usize {
        self.used
    }

    /// Rewinds the current step to `mark` (taken in this step, before any wrap), so a
    /// step run again (a CUDA graph's check pass, then its capture) stages its parts at
    /// the same addresses: the pinned bytes there are rewritten with the same values.
    pub(crate) fn reset_to(&mut self, mark: usize) -> Result<(), KernelError> {
        if mark > self.cap {
            return Err(KernelError::Shape(format!(
                "staging mark {mark} beyond the arena ({} bytes)",
                self.cap
            )));
        }
        self.used = mark;
        Ok(())
    }

    /// Stages `parts` (all of one op, so they never straddle a wrap) and enqueues
    /// their copies to the device on the lane's stream; returns each part's device
    /// address, valid for kernels enqueued on that stream until the next step or wrap.
    pub(crate) fn stage<const N: usize>(
        &mut self,
        parts: [&[u8]; N],
    ) -> Result<[u64; N], KernelError> {
        let lens = parts.map(<[u8]>::len);
        let (mut offsets, mut end) = layout(self.used, lens);
        if end > self.cap {
            (offsets, end) = layout(0, lens);
            self.wrap(end)?;
        }
        let (base, _guard) = self.dev.device_ptr(&self.stream);
        for (&off, part) in offsets.iter().zip(parts) {
            if part.is_empty() {
                continue;
            }
            // SAFETY: `off + len <= end <= cap` (checked above, or grown by the wrap);
            // the half is not read by a pending copy (begin_step / wrap waited for
            // those); the pinned bytes stay allocated until the copy has run (dropped
            // only after a wait for the stream).
            let host = unsafe {
                let dst = (self.host_addr[self.half] as *mut u8).add(off);
                std::ptr::copy_nonoverlapping(part.as_ptr(), dst, part.len());
                std::slice::from_raw_parts(dst as *const u8, part.len())
            };
            let dst = base + off as u64;
            let args = [dst, host.as_ptr() as usize as u64, host.len() as u64];
            step_graph::enqueue("memcpy_htod", &args, || {
                // SAFETY: the device range `[off, off + len)` lies in the arena; pinned
                // source, so the copy is asynchronous (no host wait).
                unsafe {
                    cudarc::driver::result::memcpy_htod_async(dst, host, self.stream.cu_stream())
                }
                .map_err(|e| driver_err("staging metadata", e))
            })?;
        }
        self.used = end;
        Ok(offsets.map(|off| base + off as u64))
    }

    /// Makes room for `need` bytes mid-step: waits for the stream (every earlier part
    /// consumed, both halves idle), grows the arenas when `need` or a busy step calls
    /// for it, and starts over at offset 0.
    fn wrap(&mut self, need: usize) -> Result<(), KernelError> {
        // A graph would replay copies from pinned memory this reuses (and the wait
        // cannot be captured).
        step_graph::refuse_for_now("staged step metadata outgrew its arena")?;
        self.stream
            .synchronize()
            .map_err(|e| driver_err("waiting for the stream to reuse staged metadata", e))?;
        // A step that filled the arena would have fit in one twice as large.
        let grown = (self.cap * 2).min(MAX_BYTES).max(need);
        if grown > self.cap {
            // Nothing in flight refers to the old buffers any more (waited above).
            let (host, host_addr, dev) = alloc(&self.stream, grown)?;
            self.host = host;
            self.host_addr = host_addr;
            self.dev = dev;
            self.cap = grown;
        }
        self.used = 0;
        Ok(())
    }
}

impl Drop for MetaArena {
    fn drop(&mut self) {
        // Copies may still read the pinned halves, which are freed right after this:
        // wait for them (an error here was already reported by the op that caused it).
        let _ = self.stream.synchronize();
    }
}

/// Where parts of `lens` bytes go after `used` bytes of an arena: each at the next
/// [`ALIGN`]ed offset after the previous one; returns the offsets and the end of the
/// last part.
fn layout<const N: usize>(used: usize, lens: [usize; N]) -> ([usize; N], usize) {
    let mut end = used;
    let offsets = lens.map(|len| {
        let off = end.next_multiple_of(ALIGN);
        end = off + len;
        off
    });
    (offsets, end)
}

/// Two pinned halves and a device arena of `bytes` bytes each.
#[allow(clippy::type_complexity)]
fn alloc(
    stream: &Arc<CudaStream>,
    bytes: usize,
) -> Result<([PinnedHostSlice<u8>; 2], [usize; 2], CudaSlice<u8>), KernelError> {
    let ctx = stream.context();
    let pinned = || {
        // SAFETY: u8 has no invalid bit patterns; bytes are written before a copy
        // reads them.
        let mut p = unsafe { ctx.alloc_pinned::<u8>(bytes) }
            .map_err(|e| driver_err("allocating pinned staging memory", e))?;
        // Its event was never recorded: no wait.
        let addr =
            p.as_mut_ptr()
                .map_err(|e| driver_err("reading pinned staging memory", e))? as usize;
        Ok::<_, KernelError>((p, addr))
    };
    let (h0, a0) = pinned()?;
    let (h1, a1) = pinned()?;
    // SAFETY: the device arena is only read where a copy wrote first.
    let dev = unsafe { stream.alloc::<u8>(bytes) }
        .map_err(|e| driver_err("allocating the metadata arena", e))?;
    Ok(([h0, h1], [a0, a1], dev))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_aligned_disjoint_and_in_order() {
        let (offs, end) = layout(5, [3, 0, 17, 8]);
        assert_eq!(offs, [16, 32, 32, 64]);
        assert_eq!(end, 72);
        assert!(offs.iter().all(|o| o % ALIGN == 0));
        // A fresh arena starts at 0; nothing staged leaves it as it was.
        assert_eq!(layout(0, [4]), ([0], 4));
        assert_eq!(layout(9, []), ([], 9));
    }

    #[test]
    fn metadata_bytes_are_the_values_bytes() {
        assert_eq!(bytes_of(&[1u32, 2]), &[1, 0, 0, 0, 2, 0, 0, 0]);
        assert_eq!(bytes_of(&[1.0f32]), &1.0f32.to_ne_bytes());
        assert_eq!(bytes_of::<u64>(&[]).len(), 0);
    }
}
