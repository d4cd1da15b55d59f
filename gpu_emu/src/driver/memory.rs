//! Device memory: device addresses that are host addresses of pages this module maps, in
//! one checked table.
//!
//! Kernels dereference device pointers they find in device memory (pointer tables), so a
//! device address must be usable by them as it is: device `d`'s allocations are mapped in a
//! range reserved for it (`DEVICE_BASE + d << 40`), never reusing an address, each followed
//! by an unmapped gap, and each placed at the end of its pages (like an electric fence): a
//! kernel that reads or writes past the end of an allocation (beyond its 256-byte rounding)
//! or into a freed one (its pages are unmapped again) faults at once instead of touching
//! another buffer. Copies, memsets, GEMM operands, collective buffers and kernel pointer
//! parameters are checked against the table, and refused with a message naming the
//! operation.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::{codes, config, CUdeviceptr, CUresult};

/// First address of device 0's range (16 TiB, far below where Linux puts mappings).
pub const DEVICE_BASE: u64 = 0x1000_0000_0000;
/// Address space per device.
const DEVICE_SPAN: u64 = 1 << 40;
/// Alignment of every allocation (cudaMalloc guarantees at least 256 bytes).
pub const ALIGN: usize = 256;
const PAGE: u64 = 4096;
/// Unmapped bytes after each allocation's pages.
const GUARD: u64 = 64 * 1024;
const MAX_DEVICES: usize = 64;

/// Where a checked access failed, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    pub code: CUresult,
    pub msg: String,
}

impl Fault {
    pub fn new(code: CUresult, msg: impl Into<String>) -> Fault {
        Fault {
            code,
            msg: msg.into(),
        }
    }
}

/// One allocation: its size, device, pages, and whether it was freed (and by what).
struct Region {
    size: usize,
    device: usize,
    /// The mapped pages holding it: `[map_start, map_start + map_len)`.
    map_start: u64,
    map_len: u64,
    freed_by: Option<&'static str>,
}

static TABLE: RwLock<BTreeMap<u64, Region>> = RwLock::new(BTreeMap::new());
static NEXT: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];
static USED: [AtomicUsize; MAX_DEVICES] = [const { AtomicUsize::new(0) }; MAX_DEVICES];
static RESERVED: Mutex<[bool; MAX_DEVICES]> = Mutex::new([false; MAX_DEVICES]);

fn read() -> RwLockReadGuard<'static, BTreeMap<u64, Region>> {
    TABLE.read().unwrap_or_else(|p| p.into_inner())
}

fn write() -> RwLockWriteGuard<'static, BTreeMap<u64, Region>> {
    TABLE.write().unwrap_or_else(|p| p.into_inner())
}

fn device_base(device: usize) -> u64 {
    DEVICE_BASE + device as u64 * DEVICE_SPAN
}

/// Maps `[addr, addr + len)` with `prot` over whatever is there (inside our reservation).
fn map_fixed(addr: u64, len: u64, prot: i32) -> bool {
    // SAFETY: the range lies in this module's reservation, which nothing else maps.
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len as usize,
            prot,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    p as u64 == addr
}

/// Reserves device `device`'s address range (inaccessible until allocations map pages).
fn reserve(device: usize) -> Result<(), Fault> {
    let mut done = RESERVED.lock().unwrap_or_else(|p| p.into_inner());
    if done[device] {
        return Ok(());
    }
    let base = device_base(device);
    // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping.
    let p = unsafe {
        libc::mmap(
            base as *mut libc::c_void,
            DEVICE_SPAN as usize,
            libc::PROT_NONE,
            libc::MAP_PRIVATE
                | libc::MAP_ANONYMOUS
                | libc::MAP_NORESERVE
                | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    if p as u64 != base {
        return Err(Fault::new(
            codes::OUT_OF_MEMORY,
            format!(
                "reserving device {device}'s address range at {base:#x}: {}",
                std::io::Error::last_os_error()
            ),
        ));
    }
    done[device] = true;
    Ok(())
}

/// Bytes allocated (and not freed) on `device`.
pub fn used_bytes(device: usize) -> usize {
    USED[device].load(Ordering::Relaxed)
}

/// Allocates `size` bytes on `device`, zeroed (0xFF-filled with `DCPEMU_POISON=1`).
/// Zero bytes are refused unless `allow_empty` (stream-ordered allocation, which cudarc
/// uses for empty slices, gives an empty range with an address of its own).
pub fn allocate(
    device: usize,
    size: usize,
    allow_empty: bool,
    op: &str,
) -> Result<CUdeviceptr, Fault> {
    if size == 0 && !allow_empty {
        return Err(Fault::new(
            codes::INVALID_VALUE,
            format!("{op}: zero bytes requested"),
        ));
    }
    reserve(device).map_err(|f| Fault::new(f.code, format!("{op}: {}", f.msg)))?;
    let limit = config::get().memory_bytes;
    let prev = USED[device].fetch_add(size, Ordering::Relaxed);
    if prev + size > limit {
        USED[device].fetch_sub(size, Ordering::Relaxed);
        return Err(Fault::new(
            codes::OUT_OF_MEMORY,
            format!(
                "{op}: {size} bytes on device {device}, which has {} of {limit} bytes free \
                 (DCPEMU_MEMORY_MIB)",
                limit - prev.min(limit)
            ),
        ));
    }
    let map_len = (size as u64).div_ceil(PAGE) * PAGE;
    let offset = NEXT[device].fetch_add(map_len + GUARD, Ordering::Relaxed);
    if offset + map_len + GUARD > DEVICE_SPAN {
        USED[device].fetch_sub(size, Ordering::Relaxed);
        return Err(Fault::new(
            codes::OUT_OF_MEMORY,
            format!(
                "{op}: device {device}'s address range is used up (addresses are never reused)"
            ),
        ));
    }
    let map_start = device_base(device) + offset;
    if map_len > 0 && !map_fixed(map_start, map_len, libc::PROT_READ | libc::PROT_WRITE) {
        USED[device].fetch_sub(size, Ordering::Relaxed);
        return Err(Fault::new(
            codes::OUT_OF_MEMORY,
            format!(
                "{op}: mapping {size} bytes: {}",
                std::io::Error::last_os_error()
            ),
        ));
    }
    // At the end of its pages, so the first byte past its 256-byte rounding is unmapped.
    let base = map_start + map_len - (size as u64).div_ceil(ALIGN as u64) * ALIGN as u64;
    if config::get().poison && size > 0 {
        // SAFETY: freshly mapped, writable.
        unsafe { std::ptr::write_bytes(base as *mut u8, 0xFF, size) };
    }
    write().insert(
        base,
        Region {
            size,
            device,
            map_start,
            map_len,
            freed_by: None,
        },
    );
    Ok(base)
}

/// Frees the allocation starting at `addr` (which must be an allocation's first byte).
pub fn free(addr: CUdeviceptr, op: &'static str) -> Result<(), Fault> {
    let mut table = write();
    let Some(region) = table.get_mut(&addr) else {
        return Err(Fault::new(
            codes::INVALID_VALUE,
            format!("{op}: {}", describe_locked(&table, addr)),
        ));
    };
    if let Some(by) = region.freed_by {
        return Err(Fault::new(
            codes::INVALID_VALUE,
            format!("{op}: {addr:#x} was already freed (by {by})"),
        ));
    }
    // Unmapped again: a kernel still using it faults instead of reading stale data.
    if region.map_len > 0 && !map_fixed(region.map_start, region.map_len, libc::PROT_NONE) {
        eprintln!(
            "dcpemu: {op}: unmapping {addr:#x}: {}",
            std::io::Error::last_os_error()
        );
    }
    region.freed_by = Some(op);
    USED[region.device].fetch_sub(region.size, Ordering::Relaxed);
    Ok(())
}

/// Why `addr` is not the start of a live allocation.
fn describe_locked(table: &BTreeMap<u64, Region>, addr: u64) -> String {
    match table.range(..=addr).next_back() {
        Some((base, r)) if addr < base + r.size as u64 => {
            format!(
                "{addr:#x} is {} bytes into the {}-byte allocation at {base:#x}",
                addr - base,
                r.size
            )
        }
        _ => format!("{addr:#x} is not the start of an allocation"),
    }
}

/// The host address of `len` bytes at device address `addr`, and its device; refuses
/// unless the whole range lies in one live allocation (`len` 0 may point one past the end).
pub fn resolve(addr: CUdeviceptr, len: usize, op: &str) -> Result<(*mut u8, usize), Fault> {
    let table = read();
    let Some((base, region)) = table.range(..=addr).next_back() else {
        return Err(not_device(addr, len, op));
    };
    let end = base + region.size as u64;
    if addr > end || (addr == end && len > 0) {
        // Past this allocation: in its guard gap, or not an address of any device.
        if addr < end + GUARD {
            return Err(Fault::new(
                codes::ILLEGAL_ADDRESS,
                format!(
                    "{op}: {len} bytes at {addr:#x} start {} bytes past the end of the \
                     {}-byte allocation at {base:#x} (device {})",
                    addr - end,
                    region.size,
                    region.device
                ),
            ));
        }
        return Err(not_device(addr, len, op));
    }
    if let Some(by) = region.freed_by {
        return Err(Fault::new(
            codes::ILLEGAL_ADDRESS,
            format!(
                "{op}: {len} bytes at {addr:#x} are in the {}-byte allocation at {base:#x} \
                 (device {}), freed by {by}",
                region.size, region.device
            ),
        ));
    }
    if (len as u64) > end - addr {
        return Err(Fault::new(
            codes::ILLEGAL_ADDRESS,
            format!(
                "{op}: {len} bytes at {addr:#x} (offset {}) overrun the {}-byte allocation at \
                 {base:#x} (device {}) by {} bytes",
                addr - base,
                region.size,
                region.device,
                len as u64 - (end - addr)
            ),
        ));
    }
    // Device addresses are host addresses (see the module's note).
    Ok((addr as *mut u8, region.device))
}

/// Zeroes `len` bytes at `p`, a range of one allocation. Whole pages are handed back to the
/// kernel instead (they read as zeros again), so zeroing a large buffer, such as a KV cache
/// at start-up, costs no host memory.
///
/// # Safety
/// `[p, p + len)` lies in one live allocation.
pub unsafe fn zero(p: *mut u8, len: usize) {
    let (start, end) = (p as u64, p as u64 + len as u64);
    let (first_page, last_page) = (start.div_ceil(PAGE) * PAGE, end / PAGE * PAGE);
    if last_page <= first_page {
        std::ptr::write_bytes(p, 0, len);
        return;
    }
    std::ptr::write_bytes(p, 0, (first_page - start) as usize);
    std::ptr::write_bytes(last_page as *mut u8, 0, (end - last_page) as usize);
    // Private anonymous pages read as zeros after MADV_DONTNEED.
    if libc::madvise(
        first_page as *mut libc::c_void,
        (last_page - first_page) as usize,
        libc::MADV_DONTNEED,
    ) != 0
    {
        std::ptr::write_bytes(first_page as *mut u8, 0, (last_page - first_page) as usize);
    }
}

/// Where `addr` lies relative to the emulated allocations, for a kernel's fault message:
/// past the end of one (in its guard), or inside a freed one. `None` if it is nowhere near.
pub fn describe(addr: u64) -> Option<String> {
    let table = read();
    let (base, r) = table.range(..=addr).next_back()?;
    let end = base + r.size as u64;
    if addr < end {
        return r.freed_by.map(|by| {
            format!(
                "{} bytes into the {}-byte allocation at {base:#x} (device {}), freed by {by}",
                addr - base,
                r.size,
                r.device
            )
        });
    }
    (addr < r.map_start + r.map_len + GUARD).then(|| {
        format!(
            "{} bytes past the end of the {}-byte allocation at {base:#x} (device {}{})",
            addr - end,
            r.size,
            r.device,
            if r.freed_by.is_some() { ", freed" } else { "" }
        )
    })
}

fn not_device(addr: u64, len: usize, op: &str) -> Fault {
    Fault::new(
        codes::ILLEGAL_ADDRESS,
        format!("{op}: {len} bytes at {addr:#x}: not an address of any emulated allocation"),
    )
}

fn layout(size: usize) -> std::alloc::Layout {
    std::alloc::Layout::from_size_align(size.max(1), ALIGN)
        .expect("allocation size overflows a Layout")
}

/// Host ("pinned") allocations from `cuMemHostAlloc`: real host memory, remembered so
/// asynchronous copies can tell them from pageable memory (which CUDA copies before the
/// call returns).
static PINNED: RwLock<BTreeMap<usize, usize>> = RwLock::new(BTreeMap::new());

/// Allocates `size` bytes of page-locked (here: ordinary) host memory.
pub fn host_alloc(size: usize) -> *mut u8 {
    // SAFETY: a non-zero-sized layout.
    let p = unsafe { std::alloc::alloc_zeroed(layout(size)) };
    if !p.is_null() {
        PINNED
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(p as usize, size);
    }
    p
}

/// Frees memory from [`host_alloc`]; false if `p` is not such an allocation.
///
/// # Safety
/// No one uses the memory at `p` any more.
pub unsafe fn host_free(p: *mut u8) -> bool {
    let size = PINNED
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&(p as usize));
    match size {
        Some(size) => {
            // SAFETY: allocated by `host_alloc` with this layout, removed from the table once.
            unsafe { std::alloc::dealloc(p, layout(size)) };
            true
        }
        None => false,
    }
}

/// Whether `[p, p + len)` lies in one pinned host allocation.
pub fn is_pinned(p: *const u8, len: usize) -> bool {
    let table = PINNED.read().unwrap_or_else(|e| e.into_inner());
    let a = p as usize;
    table
        .range(..=a)
        .next_back()
        .is_some_and(|(base, size)| a + len <= base + size)
}
