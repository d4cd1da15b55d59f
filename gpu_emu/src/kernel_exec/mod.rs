//! Loads a module image produced by the emulated NVRTC and runs kernels of it.
//!
//! The contract between the emulated NVRTC (`nvrtc`) / this module (the kernel side) and
//! [`crate::driver`] (the API side) is the following; the driver only uses these items:
//!
//! ```ignore
//! pub struct Module;                       // a loaded image; Send + Sync
//! impl Module {
//!     /// `image`: the pointer cuModuleLoadData receives (the bytes nvrtcGetCUBIN gave).
//!     pub unsafe fn load(image: *const std::ffi::c_void) -> Result<Module, String>;
//!     pub fn function(&self, name: &str) -> Option<Kernel>;
//! }
//! #[derive(Clone)] pub struct Kernel;      // Send + Sync
//! impl Kernel {
//!     pub fn name(&self) -> &str;
//!     /// Size in bytes and pointer-ness of each parameter, from the kernel's signature.
//!     pub fn params(&self) -> &[ParamInfo];
//!     /// Static `__shared__` bytes, max threads per block (for cuFuncGetAttribute).
//!     pub fn static_shared_bytes(&self) -> usize;
//!     pub fn max_threads_per_block(&self) -> u32;
//!     /// Runs the whole grid on the calling thread; returns when it has finished.
//!     pub unsafe fn launch(&self, dims: &LaunchDims,
//!                          params: *mut *mut std::ffi::c_void) -> Result<(), String>;
//! }
//! pub struct ParamInfo { pub size: usize, pub is_pointer: bool }
//! pub struct LaunchDims { pub grid: [u32; 3], pub block: [u32; 3], pub dynamic_shared_bytes: u32 }
//! ```
//!
//! Parameters: the launch passes only `void**`, with no count, so (as on a GPU) the
//! module's own signature decides how many are read and how large each is; a missing
//! one reads past the caller's array. The unpacking is a C++ trampoline generated per
//! kernel from its real signature, so sizes always match the kernel. A null parameter
//! pointer is refused; [`Kernel::launch_counted`] also checks the count where the caller
//! knows it.
//!
//! Beyond the contract: [`Kernel::launch_detailed`] (the error with its class, for
//! the CUDA error code), [`Kernel::launch_counted`] (the count checked too),
//! [`with_settings`] (schedule and block threads for one OS thread's launches, for tests)
//! and [`Module::kernels`]. A launch error names the kernel, block and thread: a barrier
//! that would hang, a misused warp collective, `__trap()` or a failed `assert`, and a
//! fault in kernel code (an illegal address or a thread's stack overflow), which does
//! not take the process down. `gpu_emu/NOTES.md` lists what is checked and what is not.
//!
//! Environment: `DCPEMU_SCHEDULE` (see [`Schedule`]) and `DCPEMU_BLOCK_THREADS` (OS
//! threads running blocks in parallel, default 1).

mod block;
#[cfg(test)]
mod engine_tests;
mod error;
mod fault;
mod fiber;
mod grid;
pub mod image;
mod schedule;
mod shared_poison;
#[cfg(test)]
mod tests;

use std::ffi::{c_char, c_void, CStr, CString};
use std::sync::{Arc, Mutex, OnceLock};

pub use error::{LaunchError, LaunchErrorKind};
pub use schedule::Schedule;

use block::Entry;

/// Layout version of `include/dcpemu.h`'s `dcpemu_thread` / `dcpemu_kernel_info`.
pub(crate) const ABI_VERSION: u32 = 3;

/// Static shared memory a kernel may declare (ptxas refuses more).
pub const SHARED_LIMIT: usize = 48 * 1024;
/// Static + dynamic shared memory of one block at most (an H100/H200's 227 KiB). The
/// default 48 KiB limit of dynamic shared memory without
/// `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES` is the driver's to enforce.
pub const MAX_SHARED_PER_BLOCK: usize = 227 * 1024;

/// One kernel parameter: its size in bytes and whether it is a pointer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParamInfo {
    pub size: usize,
    pub is_pointer: bool,
}

/// A launch's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchDims {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub dynamic_shared_bytes: u32,
}

/// A loaded module: the kernels of one compiled source.
#[derive(Debug)]
pub struct Module {
    kernels: Vec<Kernel>,
}

/// One kernel of a module.
#[derive(Debug, Clone)]
pub struct Kernel {
    inner: Arc<KernelInfo>,
}

#[derive(Debug)]
struct KernelInfo {
    name: String,
    entry: Entry,
    params: Vec<ParamInfo>,
    static_shared_bytes: usize,
    max_threads_per_block: u32,
    shared_tls: Option<shared_poison::TlsBlock>,
}

/// `dcpemu_kernel_info` of the header.
#[repr(C)]
struct RawKernelInfo {
    name: *const c_char,
    entry: Entry,
    n_params: u32,
    param_sizes: *const u32,
    param_is_pointer: *const u8,
    static_shared_bytes: u64,
    max_threads_per_block: u32,
}

fn dl_error() -> String {
    // SAFETY: dlerror returns null or a C string valid until the next dl call.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown dlopen error".into()
    } else {
        // SAFETY: as above.
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

impl Module {
    /// Loads an image of the emulated NVRTC (see [`image`]).
    ///
    /// The shared object stays loaded for the life of the process (kernels may still
    /// run on other threads when a module is dropped; unloading buys nothing here).
    ///
    /// # Safety
    /// `image` points to an image (or to readable bytes that differ from one early).
    pub unsafe fn load(image: *const c_void) -> Result<Module, String> {
        // SAFETY: the caller's contract.
        let path = match unsafe { image::decode(image.cast()) }? {
            image::Source::Path(p) => p,
            image::Source::Elf(bytes) => {
                // Content-addressed, so loading one image again opens the same object.
                let dir = crate::cache::cache_dir();
                std::fs::create_dir_all(&dir)
                    .map_err(|e| format!("creating {}: {e}", dir.display()))?;
                let name = format!("image-{}.so", crate::cache::hash_hex(&[bytes]));
                let p = dir.join(name);
                crate::cache::write_once(&p, bytes)?;
                p.to_str().ok_or("cache path is not UTF-8")?.to_owned()
            }
        };
        let c_path =
            CString::new(path.clone()).map_err(|_| "module path holds a NUL".to_owned())?;
        // SAFETY: a C string path; RTLD_LOCAL keeps each module's symbols to itself.
        let handle = unsafe { libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(format!("loading module {path}: {}", dl_error()));
        }
        let sym = |name: &CStr| {
            // SAFETY: a live handle and a C string.
            let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
            if p.is_null() {
                Err(format!("module {path} lacks {}", name.to_string_lossy()))
            } else {
                Ok(p)
            }
        };
        // SAFETY: the symbol is a `const unsigned int` of the generated code.
        let version = unsafe { *sym(c"dcpemu_abi_version")?.cast::<u32>() };
        if version != ABI_VERSION {
            return Err(format!(
                "module {path} was built for emulator ABI {version}, this one is {ABI_VERSION} (stale cache?)"
            ));
        }
        // SAFETY: as above, `dcpemu_kernel_count` entries of `dcpemu_kernels`.
        let count = unsafe { *sym(c"dcpemu_kernel_count")?.cast::<u32>() } as usize;
        let table = sym(c"dcpemu_kernels")?.cast::<RawKernelInfo>();
        // SAFETY: a live handle of c_path.
        let shared_tls = unsafe { shared_poison::TlsBlock::of(handle, &c_path) };
        let mut kernels = Vec::with_capacity(count);
        for i in 0..count {
            // SAFETY: the table has `count` entries, each with arrays of n_params.
            let raw = unsafe { &*table.add(i) };
            // SAFETY: as above.
            let name = unsafe { CStr::from_ptr(raw.name) }
                .to_string_lossy()
                .into_owned();
            let params = (0..raw.n_params as usize)
                // SAFETY: as above.
                .map(|p| unsafe {
                    ParamInfo {
                        size: *raw.param_sizes.add(p) as usize,
                        is_pointer: *raw.param_is_pointer.add(p) != 0,
                    }
                })
                .collect();
            kernels.push(Kernel {
                inner: Arc::new(KernelInfo {
                    name,
                    entry: raw.entry,
                    params,
                    static_shared_bytes: raw.static_shared_bytes as usize,
                    max_threads_per_block: raw.max_threads_per_block,
                    shared_tls,
                }),
            });
        }
        Ok(Module { kernels })
    }

    /// The kernel `name` (an `extern "C"` name), if the module defines it.
    pub fn function(&self, name: &str) -> Option<Kernel> {
        self.kernels.iter().find(|k| k.name() == name).cloned()
    }

    /// Every kernel of the module.
    pub fn kernels(&self) -> &[Kernel] {
        &self.kernels
    }
}

/// `DCPEMU_BLOCK_THREADS` (default 1; an invalid value is reported and ignored).
fn block_threads() -> usize {
    static N: OnceLock<usize> = OnceLock::new();
    *N.get_or_init(|| match std::env::var("DCPEMU_BLOCK_THREADS") {
        Err(_) => 1,
        Ok(v) => v
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|&n| (1..=256).contains(&n))
            .unwrap_or_else(|| {
                eprintln!("dcpemu: DCPEMU_BLOCK_THREADS={v:?} is not a count in 1..=256; using 1");
                1
            }),
    })
}

thread_local! {
    static OVERRIDE: std::cell::RefCell<Option<(Schedule, usize)>> = const { std::cell::RefCell::new(None) };
}

/// Runs `f` with launches made by this OS thread using `schedule` and `block_threads`
/// instead of `DCPEMU_SCHEDULE` / `DCPEMU_BLOCK_THREADS` (for tests).
pub fn with_settings<R>(schedule: Schedule, block_threads: usize, f: impl FnOnce() -> R) -> R {
    let old = OVERRIDE.with(|o| o.replace(Some((schedule, block_threads.max(1)))));
    let r = f();
    OVERRIDE.with(|o| *o.borrow_mut() = old);
    r
}

fn schedule() -> &'static Mutex<Schedule> {
    static S: OnceLock<Mutex<Schedule>> = OnceLock::new();
    S.get_or_init(|| Mutex::new(Schedule::from_env()))
}

impl Kernel {
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Size in bytes and pointer-ness of each parameter, from the kernel's signature.
    pub fn params(&self) -> &[ParamInfo] {
        &self.inner.params
    }

    /// Bytes of the `__shared__` variables declared in the kernel's body.
    pub fn static_shared_bytes(&self) -> usize {
        self.inner.static_shared_bytes
    }

    /// 1024, or the kernel's `__launch_bounds__`.
    pub fn max_threads_per_block(&self) -> u32 {
        self.inner.max_threads_per_block
    }

    /// What a GPU would refuse about `dims` before running anything.
    fn check_dims(&self, dims: &LaunchDims) -> Result<(), LaunchError> {
        use LaunchErrorKind::{InvalidValue, OutOfResources};
        let [bx, by, bz] = dims.block;
        let [gx, gy, gz] = dims.grid;
        let name = self.name();
        if dims.block.contains(&0) || dims.grid.contains(&0) {
            return Err(LaunchError::new(
                InvalidValue,
                format!(
                    "launch of {name} with a zero dimension: grid {:?}, block {:?}",
                    dims.grid, dims.block
                ),
            ));
        }
        if bx > 1024 || by > 1024 || bz > 64 || gx > i32::MAX as u32 || gy > 65535 || gz > 65535 {
            return Err(LaunchError::new(
                InvalidValue,
                format!(
                    "launch of {name}: grid {:?} / block {:?} exceed the device's limits",
                    dims.grid, dims.block
                ),
            ));
        }
        let threads = u64::from(bx) * u64::from(by) * u64::from(bz);
        if threads > u64::from(self.max_threads_per_block()) {
            return Err(LaunchError::new(
                OutOfResources,
                format!(
                    "launch of {name}: {threads} threads per block, more than its maximum {} (too many resources requested for launch)",
                    self.max_threads_per_block()
                ),
            ));
        }
        let shared = self.static_shared_bytes() + dims.dynamic_shared_bytes as usize;
        if shared > MAX_SHARED_PER_BLOCK {
            return Err(LaunchError::new(
                OutOfResources,
                format!(
                    "launch of {name}: {} bytes of static and {} of dynamic shared memory exceed the device's {MAX_SHARED_PER_BLOCK} per block",
                    self.static_shared_bytes(),
                    dims.dynamic_shared_bytes
                ),
            ));
        }
        Ok(())
    }

    /// Runs the whole grid on the calling thread (and `DCPEMU_BLOCK_THREADS - 1` more);
    /// returns when it has finished. An error names the kernel, block and thread.
    ///
    /// # Safety
    /// `params` holds one pointer per kernel parameter, each to a value of the
    /// parameter's size; every device pointer among them must be valid for what the
    /// kernel accesses (an access outside mapped memory fails the launch, see
    /// [`LaunchErrorKind::IllegalAddress`]).
    pub unsafe fn launch(&self, dims: &LaunchDims, params: *mut *mut c_void) -> Result<(), String> {
        // SAFETY: the caller's contract.
        unsafe { self.launch_detailed(dims, params) }.map_err(|e| e.message)
    }

    /// [`Kernel::launch`] with the error's class, for the driver's error code.
    ///
    /// # Safety
    /// As [`Kernel::launch`].
    pub unsafe fn launch_detailed(
        &self,
        dims: &LaunchDims,
        params: *mut *mut c_void,
    ) -> Result<(), LaunchError> {
        self.check_dims(dims)?;
        let n = self.params().len();
        if n > 0 && params.is_null() {
            return Err(LaunchError::new(
                LaunchErrorKind::InvalidValue,
                format!(
                    "launch of {}: no parameters given, the kernel takes {n}",
                    self.name()
                ),
            ));
        }
        for i in 0..n {
            // SAFETY: the caller's contract (one pointer per parameter).
            if unsafe { *params.add(i) }.is_null() {
                return Err(LaunchError::new(
                    LaunchErrorKind::InvalidValue,
                    format!(
                        "launch of {}: parameter {i} (of {n}) is a null pointer (fewer arguments than parameters?)",
                        self.name()
                    ),
                ));
            }
        }
        let over = OVERRIDE.with(|o| o.borrow().clone());
        let global = over.is_none();
        let (base, threads) = over.unwrap_or_else(|| {
            (
                schedule().lock().unwrap_or_else(|p| p.into_inner()).clone(),
                block_threads(),
            )
        });
        let info = &self.inner;
        let job = grid::Grid::new(info.entry, params, *dims, info.shared_tls, base.clone());
        let result = grid::run(Arc::new(job), threads);
        if let (true, Schedule::Random(_)) = (global, &base) {
            // Advance the shared seed so that the next launch draws other orders.
            *schedule().lock().unwrap_or_else(|p| p.into_inner()) = base.for_worker(0x5EED);
        }
        result.map_err(|e| e.context(format_args!("kernel {}", self.name())))
    }

    /// [`Kernel::launch`] with the parameter count checked: `params` must hold exactly
    /// one pointer per parameter (for callers that know how many they pass).
    ///
    /// # Safety
    /// As [`Kernel::launch`].
    pub unsafe fn launch_counted(
        &self,
        dims: &LaunchDims,
        params: &mut [*mut c_void],
    ) -> Result<(), String> {
        let want = self.params();
        if params.len() != want.len() {
            let sizes: Vec<String> = want.iter().map(|p| p.size.to_string()).collect();
            return Err(format!(
                "launch of {}: {} arguments given, the kernel takes {} (parameter sizes {})",
                self.name(),
                params.len(),
                want.len(),
                sizes.join(", ")
            ));
        }
        // SAFETY: the caller's contract; the count now matches.
        unsafe { self.launch(dims, params.as_mut_ptr()) }
    }
}
