//! Finding the CUDA libraries before touching them, and the device queries.
//!
//! cudarc loads libcuda, NVRTC and cuBLAS lazily and *panics* when one is missing, so
//! every entry point of the backend first checks here that the library loads and turns
//! its absence into [`KernelError::Unavailable`] with a hint. Libraries installed
//! outside the loader's search path (the `nvidia-*` Python wheels) are found through
//! [`NVRTC_LIB_DIR_ENV`] and [`CUDA_LIB_DIR_ENV`]: they are opened by full path once,
//! after which cudarc's own load by name finds them already loaded (the dynamic loader
//! matches a library's soname).

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use cudarc::driver::{sys::cudaError_enum, CudaContext, DriverError};

use crate::error::KernelError;

/// Directory (or `:`-separated directories) holding `libnvrtc.so.13` and
/// `libnvrtc-builtins.so.13.*`, e.g. what `scripts/install-nvrtc.sh` prints.
pub const NVRTC_LIB_DIR_ENV: &str = "DCPSERVE_NVRTC_LIB_DIR";

/// Directory (or `:`-separated directories) holding other CUDA libraries
/// (`libcublas.so.13`, `libcublasLt.so.13`, and NVRTC too), e.g. a Python
/// environment's `site-packages/nvidia/cu13/lib`.
pub const CUDA_LIB_DIR_ENV: &str = "DCPSERVE_CUDA_LIB_DIR";

/// File name prefixes opened from those directories, dependencies first (NVRTC loads
/// its builtins by name at compile time, cuBLAS needs cuBLASLt).
const PRELOAD: [&str; 4] = [
    "libnvrtc-builtins.so",
    "libnvrtc.so",
    "libcublasLt.so",
    "libcublas.so",
];

/// Opens the libraries found in the directories the environment names (then in the
/// usual places of the `nvidia-*` wheels and of `scripts/install-nvrtc.sh`), once per
/// process: each library from the first directory that has it, so no two copies are
/// loaded. Handles are kept open for the life of the process on purpose.
fn preload_from_env() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        let mut dirs: Vec<PathBuf> = [NVRTC_LIB_DIR_ENV, CUDA_LIB_DIR_ENV]
            .iter()
            .filter_map(|v| std::env::var(v).ok())
            .flat_map(|v| v.split(':').map(PathBuf::from).collect::<Vec<_>>())
            .filter(|d| !d.as_os_str().is_empty())
            .collect();
        dirs.extend(default_dirs());
        for prefix in PRELOAD {
            if let Some(path) = dirs.iter().find_map(|d| find_lib(d, prefix)) {
                dlopen_global(&path);
            }
        }
    });
}

/// Where CUDA 13 libraries usually are when the loader does not know them: the
/// `nvidia/cu13/lib` directory of Python's `nvidia-*` wheels (system, user and conda
/// site-packages) and the cache `scripts/install-nvrtc.sh` installs into.
fn default_dirs() -> Vec<PathBuf> {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let mut bases = vec![
        PathBuf::from("/usr/local/lib"),
        PathBuf::from("/usr/lib"),
        PathBuf::from("/opt/conda/lib"),
    ];
    if let Some(h) = &home {
        bases.push(h.join(".local/lib"));
    }
    let mut out = Vec::new();
    for base in bases {
        let Ok(entries) = std::fs::read_dir(&base) else {
            continue;
        };
        for e in entries.filter_map(|e| e.ok()) {
            if e.file_name().to_string_lossy().starts_with("python3") {
                for pkgs in ["site-packages", "dist-packages"] {
                    out.push(e.path().join(pkgs).join("nvidia/cu13/lib"));
                }
            }
        }
    }
    if let Some(h) = &home {
        if let Ok(entries) = std::fs::read_dir(h.join(".cache/dcpserve-nvrtc")) {
            out.extend(
                entries
                    .filter_map(|e| e.ok())
                    .map(|e| e.path().join("nvidia/cu13/lib")),
            );
        }
    }
    out
}

/// The first file in `dir` named `prefix*` (sorted, so `.so.13` before `.so.13.x`).
fn find_lib(dir: &Path, prefix: &str) -> Option<std::path::PathBuf> {
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix))
        })
        .collect();
    names.sort();
    names.into_iter().next()
}

fn dlopen_global(path: &Path) {
    let Some(c) = path.to_str().and_then(|s| CString::new(s).ok()) else {
        return;
    };
    // SAFETY: a NUL-terminated path; the handle is deliberately never closed. A failure
    // is reported later, by the presence check of the library that needed it.
    unsafe {
        libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL);
    }
}

/// Checks that the CUDA driver library loads.
pub(crate) fn require_driver() -> Result<(), KernelError> {
    preload_from_env();
    // SAFETY: only tries to open the library.
    if unsafe { cudarc::driver::sys::is_culib_present() } {
        return Ok(());
    }
    Err(KernelError::Unavailable(
        "no CUDA driver found (libcuda.so.1 could not be loaded): --device cuda needs an \
         NVIDIA GPU and its driver"
            .into(),
    ))
}

/// Checks that NVRTC (the runtime compiler of the kernels) loads.
pub(crate) fn require_nvrtc() -> Result<(), KernelError> {
    preload_from_env();
    // SAFETY: only tries to open the library.
    if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Ok(());
    }
    Err(KernelError::Unavailable(format!(
        "NVRTC not found (libnvrtc.so.13 could not be loaded): run scripts/install-nvrtc.sh \
         and set {NVRTC_LIB_DIR_ENV} to the directory it prints, or add the CUDA 13 NVRTC \
         library directory to LD_LIBRARY_PATH"
    )))
}

/// Checks that cuBLAS loads.
pub(crate) fn require_cublas() -> Result<(), KernelError> {
    preload_from_env();
    // SAFETY: only tries to open the library.
    if unsafe { cudarc::cublas::sys::is_culib_present() } {
        return Ok(());
    }
    Err(KernelError::Unavailable(format!(
        "cuBLAS not found (libcublas.so.13 could not be loaded): set {CUDA_LIB_DIR_ENV} to \
         the directory holding libcublas.so.13 and libcublasLt.so.13 (e.g. a Python \
         environment's site-packages/nvidia/cu13/lib), or add it to LD_LIBRARY_PATH"
    )))
}

/// Keeps memory freed to the device's default pool (stream-ordered `cuMemFreeAsync`)
/// reserved instead of returning it to the driver at every synchronization, so the
/// per-call metadata and scratch allocations reuse it. Best effort: a driver without
/// memory pools allocates synchronously and this changes nothing.
pub(crate) fn keep_pool_memory(ctx: &CudaContext) {
    use cudarc::driver::sys::{self, CUmemPool_attribute};
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    let mut threshold = u64::MAX;
    // SAFETY: valid out-pointers and a live device of a live context; errors ignored.
    unsafe {
        if sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) == sys::CUresult::CUDA_SUCCESS
            && !pool.is_null()
        {
            let _ = sys::cuMemPoolSetAttribute(
                pool,
                CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                &mut threshold as *mut u64 as *mut std::ffi::c_void,
            );
        }
    }
}

/// A driver error as a [`KernelError::Device`], saying what was being done.
pub(crate) fn driver_err(what: &str, e: DriverError) -> KernelError {
    KernelError::Device(format!("{what}: {e:?}"))
}

/// The CUDA version the installed driver supports, `(major, minor)` (e.g. `(13, 0)`).
///
/// ```
/// // Without a driver: an error, not a panic.
/// if let Ok((major, minor)) = dcpserve_kernels::cuda::cuda_driver_version() {
///     println!("driver supports CUDA {major}.{minor}");
/// }
/// ```
pub fn cuda_driver_version() -> Result<(u32, u32), KernelError> {
    require_driver()?;
    let mut v = 0i32;
    // SAFETY: a valid out-pointer; the call needs no initialization.
    unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) }
        .result()
        .map_err(|e| driver_err("reading the driver version", e))?;
    let v = v.max(0) as u32;
    Ok((v / 1000, v % 1000 / 10))
}

/// Checks that the driver runs CUDA 13 code: the kernels are CUBINs from NVRTC 13 and
/// the bindings are CUDA 13.0's.
pub(crate) fn require_cuda13() -> Result<(), KernelError> {
    let (major, minor) = cuda_driver_version()?;
    if major < 13 {
        return Err(KernelError::Unavailable(format!(
            "the NVIDIA driver supports CUDA {major}.{minor}; the CUDA backend needs a \
             driver for CUDA 13 or newer"
        )));
    }
    Ok(())
}

/// Number of CUDA devices the driver shows this process (`CUDA_VISIBLE_DEVICES`
/// applies): 0 when the driver loads but finds no device, an
/// [`KernelError::Unavailable`] error (never a panic) when there is no driver at all
/// or it cannot initialize.
///
/// ```
/// // On a machine without an NVIDIA driver this is an error, not a panic.
/// match dcpserve_kernels::cuda::cuda_device_count() {
///     Ok(n) => println!("{n} CUDA devices"),
///     Err(e) => println!("no CUDA: {e}"),
/// }
/// ```
pub fn cuda_device_count() -> Result<usize, KernelError> {
    require_driver()?;
    match CudaContext::device_count() {
        Ok(n) => Ok(n.max(0) as usize),
        Err(DriverError(cudaError_enum::CUDA_ERROR_NO_DEVICE)) => Ok(0),
        // The driver library loads but cannot start (no kernel module, a container
        // without the GPU, a driver/library mismatch): no usable device here.
        Err(e) => Err(KernelError::Unavailable(format!(
            "the CUDA driver failed to initialize ({e:?}): no usable NVIDIA GPU"
        ))),
    }
}

/// Total memory of CUDA device `ordinal` in bytes (for sizing the KV cache before any
/// rank starts), without compiling kernels or creating a stream.
pub fn cuda_total_memory(ordinal: usize) -> Result<usize, KernelError> {
    require_driver()?;
    let count = cuda_device_count()?;
    if ordinal >= count {
        return Err(KernelError::Unavailable(format!(
            "no CUDA device {ordinal}: the driver shows {count}"
        )));
    }
    let ctx = CudaContext::new(ordinal).map_err(|e| driver_err("creating a context", e))?;
    ctx.total_mem()
        .map_err(|e| driver_err("reading the device's memory", e))
}
