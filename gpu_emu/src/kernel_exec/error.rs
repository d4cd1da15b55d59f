//! Why a launch failed, in the classes CUDA's error codes draw (the driver half maps
//! each to its `CUresult`).

use std::fmt;

/// The class of a launch failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaunchErrorKind {
    /// A launch the device refuses before running it: zero or oversized dimensions, a
    /// null or missing parameter (`CUDA_ERROR_INVALID_VALUE`).
    InvalidValue,
    /// More threads per block than the kernel allows, or more shared memory than a
    /// block has (`CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES`).
    OutOfResources,
    /// Kernel code touched memory it may not: a fault, or a thread's stack overflowing
    /// (`CUDA_ERROR_ILLEGAL_ADDRESS`).
    IllegalAddress,
    /// A device-side `assert` failed (`CUDA_ERROR_ASSERT`).
    Assert,
    /// Anything else that stops a grid: `__trap()`, a barrier or warp collective that
    /// would hang or is misused (`CUDA_ERROR_LAUNCH_FAILED`).
    Failed,
}

/// A launch failure: its class and what happened, naming kernel, block and thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchError {
    pub kind: LaunchErrorKind,
    pub message: String,
}

impl LaunchError {
    pub(crate) fn new(kind: LaunchErrorKind, message: impl Into<String>) -> LaunchError {
        LaunchError {
            kind,
            message: message.into(),
        }
    }

    /// The same error with `prefix: ` before its message.
    pub(crate) fn context(self, prefix: impl fmt::Display) -> LaunchError {
        LaunchError {
            kind: self.kind,
            message: format!("{prefix}: {}", self.message),
        }
    }
}

impl fmt::Display for LaunchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for LaunchError {}

/// The message prefix with which the header reports a failed `assert`.
pub(crate) const ASSERT_PREFIX: &str = "device-side assert triggered";
