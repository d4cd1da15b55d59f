//! Initialization, devices and their attributes, primary contexts and the per-thread
//! current context.

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicBool, Ordering};

use super::{codes, config, memory, refuse, write_out, CUdevice, CUresult, Handle};

/// The driver version reported (13.0, what cudarc's `cuda-13000` bindings expect).
pub const DRIVER_VERSION: c_int = 13000;

const CTX_TAG: usize = 0xC7;

static INITIALIZED: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// The calling thread's current context: a device ordinal, `None` if unset.
    static CURRENT: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The handle of device `d`'s primary context.
pub fn ctx_handle(device: usize) -> Handle {
    ((CTX_TAG << 32) | (device + 1)) as Handle
}

/// The device of a context handle, if it names one.
pub fn ctx_device(ctx: Handle) -> Option<usize> {
    let v = ctx as usize;
    let d = (v & 0xffff_ffff).checked_sub(1)?;
    (v >> 32 == CTX_TAG && d < config::get().devices).then_some(d)
}

/// The device of the calling thread's current context, or the refusal to return.
pub fn current_device(op: &str) -> Result<usize, CUresult> {
    if !INITIALIZED.load(Ordering::Acquire) {
        return Err(refuse(codes::NOT_INITIALIZED, op, "cuInit was not called"));
    }
    CURRENT.with(Cell::get).ok_or_else(|| {
        refuse(
            codes::INVALID_CONTEXT,
            op,
            "no current context on this thread",
        )
    })
}

/// Checks a device ordinal.
pub fn check_device(dev: CUdevice, op: &str) -> Result<usize, CUresult> {
    if !INITIALIZED.load(Ordering::Acquire) {
        return Err(refuse(codes::NOT_INITIALIZED, op, "cuInit was not called"));
    }
    let n = config::get().devices;
    usize::try_from(dev).ok().filter(|d| *d < n).ok_or_else(|| {
        refuse(
            codes::INVALID_DEVICE,
            op,
            format!("device {dev} (there are {n})"),
        )
    })
}

macro_rules! tri {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(code) => return code,
        }
    };
}
pub(crate) use tri;

#[no_mangle]
pub unsafe extern "C" fn cuInit(flags: c_uint) -> CUresult {
    if flags != 0 {
        return refuse(codes::INVALID_VALUE, "cuInit", "flags must be 0");
    }
    INITIALIZED.store(true, Ordering::Release);
    codes::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CUresult {
    write_out(version, DRIVER_VERSION, "cuDriverGetVersion")
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    if !INITIALIZED.load(Ordering::Acquire) {
        return refuse(
            codes::NOT_INITIALIZED,
            "cuDeviceGetCount",
            "cuInit was not called",
        );
    }
    write_out(count, config::get().devices as c_int, "cuDeviceGetCount")
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> CUresult {
    let d = tri!(check_device(ordinal, "cuDeviceGet"));
    write_out(device, d as CUdevice, "cuDeviceGet")
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    let d = tri!(check_device(dev, "cuDeviceGetName"));
    if name.is_null() || len <= 0 {
        return refuse(
            codes::INVALID_VALUE,
            "cuDeviceGetName",
            "null or empty buffer",
        );
    }
    let text = format!("dcpemu emulated CUDA device {d}");
    let n = text.len().min(len as usize - 1);
    std::ptr::copy_nonoverlapping(text.as_ptr(), name.cast::<u8>(), n);
    *name.add(n) = 0;
    codes::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    tri!(check_device(dev, "cuDeviceTotalMem"));
    write_out(bytes, config::get().memory_bytes, "cuDeviceTotalMem")
}

/// `CUuuid`: 16 bytes.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut [u8; 16], dev: CUdevice) -> CUresult {
    let d = tri!(check_device(dev, "cuDeviceGetUuid"));
    let mut bytes = *b"dcpemu-device-\0\0";
    bytes[14] = (d >> 8) as u8;
    bytes[15] = d as u8;
    write_out(uuid, bytes, "cuDeviceGetUuid")
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid: *mut [u8; 16], dev: CUdevice) -> CUresult {
    cuDeviceGetUuid_v2(uuid, dev)
}

/// The attributes of an H200-like device (compute capability 9.0) that callers ask for.
fn attribute(attr: u32) -> Option<c_int> {
    Some(match attr {
        1 => 1024,              // MAX_THREADS_PER_BLOCK
        2 | 3 => 1024,          // MAX_BLOCK_DIM_X / Y
        4 => 64,                // MAX_BLOCK_DIM_Z
        5 => i32::MAX,          // MAX_GRID_DIM_X
        6 | 7 => 65535,         // MAX_GRID_DIM_Y / Z
        8 => 48 * 1024,         // MAX_SHARED_MEMORY_PER_BLOCK
        9 => 65536,             // TOTAL_CONSTANT_MEMORY
        10 => 32,               // WARP_SIZE
        12 => 65536,            // MAX_REGISTERS_PER_BLOCK
        13 => 1_980_000,        // CLOCK_RATE (kHz)
        14 => 512,              // TEXTURE_ALIGNMENT
        16 => 132,              // MULTIPROCESSOR_COUNT
        19 => 0,                // INTEGRATED
        20 => 1,                // CAN_MAP_HOST_MEMORY
        33 => 0,                // PCI_BUS_ID
        34 => 0,                // PCI_DEVICE_ID
        36 => 2_619_000,        // MEMORY_CLOCK_RATE
        37 => 6144,             // GLOBAL_MEMORY_BUS_WIDTH
        38 => 50 * 1024 * 1024, // L2_CACHE_SIZE
        39 => 2048,             // MAX_THREADS_PER_MULTIPROCESSOR
        41 => 1,                // UNIFIED_ADDRESSING
        75 => 9,                // COMPUTE_CAPABILITY_MAJOR
        76 => 0,                // COMPUTE_CAPABILITY_MINOR
        81 => 228 * 1024,       // MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
        82 => 65536,            // MAX_REGISTERS_PER_MULTIPROCESSOR
        83 => 1,                // MANAGED_MEMORY
        95 => 1,                // COOPERATIVE_LAUNCH
        97 => 227 * 1024,       // MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
        106 => 32,              // MAX_BLOCKS_PER_MULTIPROCESSOR
        115 => 1,               // MEMORY_POOLS_SUPPORTED
        _ => return None,
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(
    value: *mut c_int,
    attr: u32,
    dev: CUdevice,
) -> CUresult {
    tri!(check_device(dev, "cuDeviceGetAttribute"));
    match attribute(attr) {
        Some(v) => write_out(value, v, "cuDeviceGetAttribute"),
        None => refuse(
            codes::NOT_SUPPORTED,
            "cuDeviceGetAttribute",
            format!("attribute {attr} is not emulated"),
        ),
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(ctx: *mut Handle, dev: CUdevice) -> CUresult {
    let d = tri!(check_device(dev, "cuDevicePrimaryCtxRetain"));
    write_out(ctx, ctx_handle(d), "cuDevicePrimaryCtxRetain")
}

/// The primary context lives as long as the process (its memory is not reclaimed).
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    tri!(check_device(dev, "cuDevicePrimaryCtxRelease"));
    codes::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSetCurrent(ctx: Handle) -> CUresult {
    if ctx.is_null() {
        CURRENT.with(|c| c.set(None));
        return codes::SUCCESS;
    }
    match ctx_device(ctx) {
        Some(d) => {
            CURRENT.with(|c| c.set(Some(d)));
            codes::SUCCESS
        }
        None => refuse(
            codes::INVALID_CONTEXT,
            "cuCtxSetCurrent",
            format!("{ctx:?} is not a context"),
        ),
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(ctx: *mut Handle) -> CUresult {
    let h = CURRENT
        .with(Cell::get)
        .map_or(std::ptr::null_mut(), ctx_handle);
    write_out(ctx, h, "cuCtxGetCurrent")
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice(dev: *mut CUdevice) -> CUresult {
    let d = tri!(current_device("cuCtxGetDevice"));
    write_out(dev, d as CUdevice, "cuCtxGetDevice")
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    let d = tri!(current_device("cuMemGetInfo"));
    let total_bytes = config::get().memory_bytes;
    let used = memory::used_bytes(d);
    tri!(Ok::<_, CUresult>(write_out(
        free,
        total_bytes.saturating_sub(used),
        "cuMemGetInfo"
    )));
    write_out(total, total_bytes, "cuMemGetInfo")
}

/// Memory pools: each device has one default pool; its attributes are accepted and
/// ignored (stream-ordered allocations are served by the same checked table).
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(pool: *mut Handle, dev: CUdevice) -> CUresult {
    let d = tri!(check_device(dev, "cuDeviceGetDefaultMemPool"));
    write_out(
        pool,
        ((0x9001usize << 32) | (d + 1)) as Handle,
        "cuDeviceGetDefaultMemPool",
    )
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolSetAttribute(
    pool: Handle,
    _attr: u32,
    value: *mut c_void,
) -> CUresult {
    if (pool as usize) >> 32 != 0x9001 || value.is_null() {
        return refuse(
            codes::INVALID_VALUE,
            "cuMemPoolSetAttribute",
            "not a pool, or a null value",
        );
    }
    codes::SUCCESS
}

/// Cache configuration and limits have no effect on the emulator; accepted.
#[no_mangle]
pub unsafe extern "C" fn cuCtxSetCacheConfig(_config: u32) -> CUresult {
    codes::SUCCESS
}
