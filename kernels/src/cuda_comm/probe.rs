//! Is there a CUDA driver, NVRTC and NCCL to load? Asked before cudarc is touched.
//!
//! cudarc's dynamic loading panics when a library is missing (its `culib()` ends in
//! `panic!`), so every constructor in [`crate::cuda_comm`] first asks here: each library is
//! `dlopen`ed under the very names cudarc will try ([`cudarc::get_lib_name_candidates`]),
//! and a missing one becomes a [`KernelError`] that says what is missing and what to do.

use std::ffi::CString;

use crate::error::KernelError;

/// A library cudarc loads at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CudaLib {
    /// The driver API (`libcuda.so.1`, installed with the NVIDIA driver).
    Driver,
    /// The run-time compiler (`libnvrtc.so.13`), for the device-local sum kernel.
    Nvrtc,
    /// NCCL (`libnccl.so.2`).
    Nccl,
}

impl CudaLib {
    /// cudarc's base name of the library (what it hands `get_lib_name_candidates`).
    fn base_name(self) -> &'static str {
        match self {
            CudaLib::Driver => "cuda",
            CudaLib::Nvrtc => "nvrtc",
            CudaLib::Nccl => "nccl",
        }
    }

    /// The file name users know the library by, for messages.
    pub fn usual_file(self) -> &'static str {
        match self {
            CudaLib::Driver => "libcuda.so.1",
            CudaLib::Nvrtc => "libnvrtc.so",
            CudaLib::Nccl => "libnccl.so.2",
        }
    }

    /// What to tell a user whose machine lacks the library.
    fn hint(self) -> &'static str {
        match self {
            CudaLib::Driver => "this machine has no NVIDIA GPU driver",
            CudaLib::Nvrtc => {
                "install the CUDA NVRTC library (e.g. PyPI's nvidia-cuda-nvrtc) and put its lib folder on LD_LIBRARY_PATH"
            }
            CudaLib::Nccl => {
                "install NCCL (e.g. PyPI's nvidia-nccl-cu13) and put its lib folder on LD_LIBRARY_PATH"
            }
        }
    }
}

/// Whether `dlopen` finds `name` (the handle is closed again: cudarc opens its own).
fn dlopen_ok(name: &str) -> bool {
    let Ok(c) = CString::new(name) else {
        return false;
    };
    // SAFETY: plain dlopen/dlclose of a NUL-terminated name; RTLD_LAZY so no symbol is
    // resolved eagerly, RTLD_LOCAL so nothing leaks into the global namespace.
    unsafe {
        let h = libc::dlopen(c.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL);
        if h.is_null() {
            false
        } else {
            libc::dlclose(h);
            true
        }
    }
}

/// Checks that cudarc will find `lib`: `Ok` means cudarc's loader will not panic on it.
///
/// The message of the error names the library, the names tried and a fix. A library
/// present only under its versioned name (NCCL's wheels ship `libnccl.so.2`, which
/// cudarc 0.19 does not try) is reported as such, with the symlink that fixes it.
pub fn check_lib(lib: CudaLib) -> Result<(), KernelError> {
    let candidates = cudarc::get_lib_name_candidates(lib.base_name());
    if candidates.iter().any(|c| dlopen_ok(c)) {
        return Ok(());
    }
    let usual = lib.usual_file();
    if dlopen_ok(usual) {
        return Err(KernelError::Comm(format!(
            "{usual} is installed but cudarc looks for it under other names ({}); add a symlink lib{}.so -> {usual} in a folder on LD_LIBRARY_PATH",
            candidates.join(", "),
            lib.base_name()
        )));
    }
    Err(KernelError::Comm(format!(
        "{usual} could not be loaded (tried {}); {}",
        candidates.join(", "),
        lib.hint()
    )))
}

/// Checks for the CUDA driver library without touching cudarc.
///
/// The message, on a machine without a driver, reads `no CUDA driver found (libcuda.so.1
/// could not be loaded); this machine has no NVIDIA GPU driver`.
pub fn check_driver() -> Result<(), KernelError> {
    // libcuda.so.1 is among cudarc's candidates: finding any of them is what keeps
    // cudarc's loader from panicking.
    let candidates = cudarc::get_lib_name_candidates(CudaLib::Driver.base_name());
    if candidates.iter().any(|c| dlopen_ok(c)) {
        return Ok(());
    }
    Err(KernelError::Comm(format!(
        "no CUDA driver found ({} could not be loaded); {}",
        CudaLib::Driver.usual_file(),
        CudaLib::Driver.hint()
    )))
}

/// Number of CUDA devices the driver shows this process (after `CUDA_VISIBLE_DEVICES`),
/// or an error when there is no driver or it fails to initialize (`cuInit`). Never
/// panics: the driver library is checked with `dlopen` before cudarc loads it.
pub fn visible_device_count() -> Result<usize, KernelError> {
    check_driver()?;
    let n = cudarc::driver::CudaContext::device_count().map_err(|e| {
        KernelError::Comm(format!(
            "the CUDA driver is installed but failed to start (cuInit / cuDeviceGetCount: {e:?})"
        ))
    })?;
    Ok(usize::try_from(n).unwrap_or(0))
}

/// What `--device cuda` checks at engine start, before any weight is read: the number
/// of visible GPUs (at least one), or a message fit to show a user as it is, e.g. `no
/// CUDA driver found (libcuda.so.1 could not be loaded); this machine has no NVIDIA GPU
/// driver`.
pub fn cuda_devices_for_ranks() -> Result<usize, String> {
    match visible_device_count() {
        Ok(0) => Err(
            "the CUDA driver shows no GPU to this process (check CUDA_VISIBLE_DEVICES and nvidia-smi)"
                .into(),
        ),
        Ok(n) => Ok(n),
        Err(KernelError::Comm(m)) => Err(m),
        Err(other) => Err(other.to_string()),
    }
}
