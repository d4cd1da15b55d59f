//! Model loading for dcpserve: weights (GGUF, safetensors), model configuration, tokenizer
//! and chat templates. [`ModelFiles::open`] is the one-call entry point.

pub mod arch;
pub mod chat_template;
pub mod config;
mod config_check;
mod config_keys;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
pub mod gguf;
pub mod gguf_config;
pub mod gguf_tokenizer;
pub mod grammar;
pub mod hf_config;
mod hf_rope;
mod json_file;
pub mod safetensors_source;
pub mod source;
pub mod tensors;
pub mod tokenizer;

pub use chat_template::{ChatMessage, ChatTemplate};
pub use config::{Architecture, ModelConfig, RopeScaling};
pub use error::ModelError;
pub use gguf::{GgufFile, GgufTensorSource};
pub use grammar::{GrammarCompiler, GrammarMatcher, TokenMask};
pub use safetensors_source::SafetensorsSource;
pub use source::ModelFiles;
pub use tensors::{DType, RawTensor, TensorSource};
pub use tokenizer::{IncrementalDecoder, Tokenizer};

/// Shorthand for results of this crate.
pub type Result<T, E = ModelError> = std::result::Result<T, E>;
