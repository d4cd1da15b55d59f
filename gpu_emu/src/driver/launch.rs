//! Modules, functions and `cuLaunchKernel`.
//!
//! A launch copies its parameters before returning (as CUDA does), using the kernel's
//! signature ([`Kernel::params`]) for each one's size. A pointer parameter is a device
//! address: it is checked when the launch is issued, and translated to the host address of
//! its allocation when the stream runs the kernel, so the kernel reads and writes the
//! emulated device memory directly. (An access past the end of the allocation a pointer
//! points into cannot be seen from here: the kernel runs as native code.)

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

use super::context::tri;
use super::memory::{describe, resolve, Fault};
use super::registry::Registry;
use super::stream::lookup;
use super::{codes, refuse, write_out, CUdeviceptr, CUresult, Handle};
use crate::kernel_exec::{Kernel, LaunchDims, LaunchError, LaunchErrorKind, Module};

/// Shared memory a block may use without opting in (`cuFuncSetAttribute`).
const DEFAULT_DYNAMIC_SHARED_LIMIT: usize = 48 * 1024;
/// The opt-in maximum per block (an H100/H200's 227 KiB).
const MAX_SHARED_PER_BLOCK: usize = 227 * 1024;

pub struct Function {
    pub kernel: Kernel,
    /// `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`.
    max_dynamic_shared: AtomicI32,
}

pub static MODULES: Registry<Module> = Registry::new(0x30D);
pub static FUNCTIONS: Registry<Function> = Registry::new(0xF1);

#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(out: *mut Handle, image: *const c_void) -> CUresult {
    if image.is_null() {
        return refuse(codes::INVALID_VALUE, "cuModuleLoadData", "null image");
    }
    match Module::load(image) {
        Ok(m) => write_out(out, MODULES.insert(Arc::new(m)), "cuModuleLoadData"),
        Err(e) => refuse(codes::INVALID_IMAGE, "cuModuleLoadData", e),
    }
}

/// Functions of an unloaded module stay usable by handle: the module code lives as long as
/// any of its kernels (`Kernel` holds what it needs).
#[no_mangle]
pub unsafe extern "C" fn cuModuleUnload(m: Handle) -> CUresult {
    match MODULES.remove(m) {
        Some(_) => codes::SUCCESS,
        None => refuse(
            codes::INVALID_HANDLE,
            "cuModuleUnload",
            format!("{m:?} is not a live module"),
        ),
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunction(
    out: *mut Handle,
    m: Handle,
    name: *const c_char,
) -> CUresult {
    let op = "cuModuleGetFunction";
    let Some(module) = MODULES.get(m) else {
        return refuse(
            codes::INVALID_HANDLE,
            op,
            format!("{m:?} is not a live module"),
        );
    };
    if name.is_null() {
        return refuse(codes::INVALID_VALUE, op, "null name");
    }
    let name = CStr::from_ptr(name).to_string_lossy();
    match module.function(&name) {
        Some(kernel) => {
            let f = Function {
                kernel,
                max_dynamic_shared: AtomicI32::new(DEFAULT_DYNAMIC_SHARED_LIMIT as i32),
            };
            write_out(out, FUNCTIONS.insert(Arc::new(f)), op)
        }
        None => refuse(
            codes::NOT_FOUND,
            op,
            format!("no kernel `{name}` in the module"),
        ),
    }
}

fn function(f: Handle, op: &str) -> Result<Arc<Function>, CUresult> {
    FUNCTIONS.get(f).ok_or_else(|| {
        refuse(
            codes::INVALID_HANDLE,
            op,
            format!("{f:?} is not a function"),
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncGetAttribute(value: *mut c_int, attr: u32, f: Handle) -> CUresult {
    let op = "cuFuncGetAttribute";
    let func = tri!(function(f, op));
    let k = &func.kernel;
    let v = match attr {
        0 => k.max_threads_per_block() as c_int, // MAX_THREADS_PER_BLOCK
        1 => k.static_shared_bytes() as c_int,   // SHARED_SIZE_BYTES
        2 | 3 => 0,                              // CONST / LOCAL_SIZE_BYTES
        4 => 32,                                 // NUM_REGS
        5 | 6 => 90,                             // PTX / BINARY_VERSION
        7 => 0,                                  // CACHE_MODE_CA
        8 => func.max_dynamic_shared.load(Ordering::Relaxed), // MAX_DYNAMIC_SHARED_SIZE_BYTES
        9 => -1,                                 // PREFERRED_SHARED_MEMORY_CARVEOUT
        _ => {
            return refuse(
                codes::NOT_SUPPORTED,
                op,
                format!("attribute {attr} is not emulated"),
            )
        }
    };
    write_out(value, v, op)
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncSetAttribute(f: Handle, attr: u32, value: c_int) -> CUresult {
    let op = "cuFuncSetAttribute";
    let func = tri!(function(f, op));
    match attr {
        8 => {
            let limit = MAX_SHARED_PER_BLOCK.saturating_sub(func.kernel.static_shared_bytes());
            if value < 0 || value as usize > limit {
                return refuse(
                    codes::INVALID_VALUE,
                    op,
                    format!(
                        "{} may use at most {limit} dynamic shared bytes, not {value}",
                        func.kernel.name()
                    ),
                );
            }
            func.max_dynamic_shared.store(value, Ordering::Relaxed);
            codes::SUCCESS
        }
        9 => codes::SUCCESS,
        _ => refuse(
            codes::NOT_SUPPORTED,
            op,
            format!("attribute {attr} is not emulated"),
        ),
    }
}

/// Cache preferences do not apply to the emulator.
#[no_mangle]
pub unsafe extern "C" fn cuFuncSetCacheConfig(f: Handle, _config: u32) -> CUresult {
    tri!(function(f, "cuFuncSetCacheConfig"));
    codes::SUCCESS
}

/// Checks the launch configuration against the device's limits and the function's.
fn check_dims(func: &Function, dims: &LaunchDims) -> Result<(), String> {
    let [bx, by, bz] = dims.block;
    let threads = bx as u64 * by as u64 * bz as u64;
    if dims.grid.contains(&0) || threads == 0 {
        return Err(format!(
            "empty grid {:?} or block {:?}",
            dims.grid, dims.block
        ));
    }
    if bx > 1024 || by > 1024 || bz > 64 || threads > func.kernel.max_threads_per_block() as u64 {
        return Err(format!(
            "block {:?} ({threads} threads) exceeds the limit of {} threads",
            dims.block,
            func.kernel.max_threads_per_block()
        ));
    }
    if dims.grid[1] > 65535 || dims.grid[2] > 65535 || dims.grid[0] > i32::MAX as u32 {
        return Err(format!("grid {:?} exceeds the device's limits", dims.grid));
    }
    let allowed = func.max_dynamic_shared.load(Ordering::Relaxed) as usize;
    if dims.dynamic_shared_bytes as usize > allowed {
        return Err(format!(
            "{} dynamic shared bytes, more than the {allowed} allowed (raise \
             CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)",
            dims.dynamic_shared_bytes
        ));
    }
    Ok(())
}

/// The launch's parameter values, copied; `pointers[i]` when parameter `i` is a pointer.
struct Params {
    bytes: Vec<Vec<u8>>,
    pointer: Vec<bool>,
}

impl Params {
    /// Builds the `void**` a kernel receives, with device addresses translated to host ones.
    fn translated(&self, what: &str) -> Result<Vec<Vec<u64>>, Fault> {
        let mut out = Vec::with_capacity(self.bytes.len());
        for (i, (b, is_ptr)) in self.bytes.iter().zip(&self.pointer).enumerate() {
            // u64 storage keeps every parameter 8-byte aligned.
            let mut v = vec![0u64; b.len().div_ceil(8).max(1)];
            if *is_ptr && b.len() == 8 {
                let addr = CUdeviceptr::from_ne_bytes(b[..8].try_into().expect("8 bytes"));
                v[0] = if addr == 0 {
                    0
                } else {
                    let (host, _) = resolve(addr, 0, &format!("{what}, pointer parameter {i}"))?;
                    host as u64
                };
            } else {
                // SAFETY: `v` has at least `b.len()` bytes.
                unsafe {
                    std::ptr::copy_nonoverlapping(b.as_ptr(), v.as_mut_ptr().cast::<u8>(), b.len())
                };
            }
            out.push(v);
        }
        Ok(out)
    }
}

/// A kernel's failure as a fault with CUDA's code for its class; an invalid access that
/// hit emulated device memory (a guard gap, a freed allocation) also says which allocation,
/// as `compute-sanitizer` would.
fn launch_fault(what: &str, e: LaunchError) -> Fault {
    let code = match e.kind {
        LaunchErrorKind::InvalidValue => codes::INVALID_VALUE,
        LaunchErrorKind::OutOfResources => codes::LAUNCH_OUT_OF_RESOURCES,
        LaunchErrorKind::IllegalAddress => codes::ILLEGAL_ADDRESS,
        LaunchErrorKind::Assert => codes::ASSERT,
        LaunchErrorKind::Failed => codes::LAUNCH_FAILED,
    };
    const MARK: &str = "invalid memory access at 0x";
    let m = &e.message;
    let place = m
        .find(MARK)
        .and_then(|i| {
            let hex: String = m[i + MARK.len()..]
                .chars()
                .take_while(char::is_ascii_hexdigit)
                .collect();
            u64::from_str_radix(&hex, 16).ok()
        })
        .and_then(describe);
    match place {
        Some(d) => Fault::new(code, format!("{what}: {m}: {d}")),
        None => Fault::new(code, format!("{what}: {m}")),
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernel(
    f: Handle,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    shared_bytes: c_uint,
    h: Handle,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    let op = "cuLaunchKernel";
    let func = tri!(function(f, op));
    let s = tri!(lookup(h, op));
    let name = func.kernel.name().to_string();
    let what = format!("cuLaunchKernel({name})");
    if !extra.is_null() {
        return refuse(
            codes::NOT_SUPPORTED,
            &what,
            "the `extra` parameter form is not emulated",
        );
    }
    let dims = LaunchDims {
        grid: [grid_x, grid_y, grid_z],
        block: [block_x, block_y, block_z],
        dynamic_shared_bytes: shared_bytes,
    };
    if let Err(why) = check_dims(&func, &dims) {
        return refuse(codes::INVALID_VALUE, &what, why);
    }
    let infos = func.kernel.params();
    if !infos.is_empty() && params.is_null() {
        return refuse(
            codes::INVALID_VALUE,
            &what,
            format!("{} parameters expected, kernelParams is null", infos.len()),
        );
    }
    let mut p = Params {
        bytes: Vec::with_capacity(infos.len()),
        pointer: Vec::with_capacity(infos.len()),
    };
    for (i, info) in infos.iter().enumerate() {
        let src = *params.add(i) as *const u8;
        if src.is_null() {
            return refuse(
                codes::INVALID_VALUE,
                &what,
                format!("kernelParams[{i}] is null"),
            );
        }
        p.bytes
            .push(std::slice::from_raw_parts(src, info.size).to_vec());
        p.pointer.push(info.is_pointer);
    }
    if let Err(f) = p.translated(&what) {
        return refuse(f.code, &what, f.msg);
    }
    let kernel = func.kernel.clone();
    s.submit(
        what.clone(),
        Arc::new(move || {
            let mut values = p.translated(&what)?;
            let mut ptrs: Vec<*mut c_void> =
                values.iter_mut().map(|v| v.as_mut_ptr().cast()).collect();
            // SAFETY: one pointer per parameter of the kernel's signature, each to a copy of
            // the value with device addresses translated to live host buffers.
            unsafe { kernel.launch_detailed(&dims, ptrs.as_mut_ptr()) }
                .map_err(|e| launch_fault(&what, e))
        }),
    );
    codes::SUCCESS
}
