//! The one error type of this crate. Every variant names the file (and tensor, where there is
//! one) so that a user can tell which of their files is at fault without a debugger.

use std::path::PathBuf;

/// Everything that can go wrong while loading a model's files.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// An I/O error while opening or mapping a file.
    #[error("{}: {source}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A file the model needs does not exist.
    #[error("{}: missing file ({what})", .path.display())]
    MissingFile { path: PathBuf, what: String },
    /// The model's architecture is not one this engine runs.
    #[error("{}: unsupported architecture {arch:?} (supported: Llama, Qwen2, Qwen3, DeepSeek-V2/V3)", .path.display())]
    UnsupportedArchitecture { path: PathBuf, arch: String },
    /// A tensor is stored in a type the engine cannot compute with.
    #[error("{}: tensor {tensor:?} has unsupported type {dtype} (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, IQ4_NL, IQ4_XS)", .path.display())]
    UnsupportedTensorType {
        path: PathBuf,
        tensor: String,
        /// The type as the file names it, e.g. `ggml type 12 (Q4_K)` or `I64`.
        dtype: String,
    },
    /// A tensor's shape disagrees with the model configuration.
    #[error("{}: tensor {tensor:?} has shape {found:?}, expected {expected:?}", .path.display())]
    ShapeMismatch {
        path: PathBuf,
        tensor: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    /// A tensor the model needs is not in the file(s).
    #[error("{}: tensor {tensor:?} not found", .path.display())]
    MissingTensor { path: PathBuf, tensor: String },
    /// The file ends before a structure it declares.
    #[error("{}: truncated file: {reason}", .path.display())]
    Truncated { path: PathBuf, reason: String },
    /// The file's contents are malformed.
    #[error("{}: corrupt file: {reason}", .path.display())]
    Corrupt { path: PathBuf, reason: String },
    /// A configuration value is missing or invalid.
    #[error("{}: invalid model configuration: {reason}", .path.display())]
    Config { path: PathBuf, reason: String },
    /// A well-formed file uses a feature this engine does not implement.
    #[error("{}: unsupported: {reason}", .path.display())]
    Unsupported { path: PathBuf, reason: String },
    /// Building, encoding or decoding with the tokenizer failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// Parsing or rendering a chat template failed.
    #[error("chat template: {0}")]
    ChatTemplate(String),
    /// A forward-pass input that cannot be computed (bad token id, inconsistent batch).
    #[error("invalid input: {0}")]
    Invalid(String),
    /// A kernel rejected its arguments (a bug in the caller's shapes, or bad weights).
    #[error("kernel: {0}")]
    Kernel(#[from] dcpserve_kernels::KernelError),
}

impl ModelError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        if source.kind() == std::io::ErrorKind::NotFound {
            return ModelError::MissingFile {
                path: path.into(),
                what: source.to_string(),
            };
        }
        ModelError::Io {
            path: path.into(),
            source,
        }
    }

    pub(crate) fn corrupt(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        ModelError::Corrupt {
            path: path.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn config(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        ModelError::Config {
            path: path.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn unsupported(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        ModelError::Unsupported {
            path: path.into(),
            reason: reason.into(),
        }
    }
}
