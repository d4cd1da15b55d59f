//! Loads a module image produced by the emulated NVRTC and runs kernels of it.
//!
//! The contract between [`crate::nvrtc`] / this module (the kernel side) and
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
