//! Where a model's files come from when it is named by a Hugging Face repo id rather than
//! a path: [`ModelSourceFlags`], flattened into the engine subcommands and `serve` on the
//! command line and into a `[[models]]` entry of the TOML file under the same names
//! (`--gguf-file Q4_K_M` is `gguf_file = "Q4_K_M"`). The id itself is resolved by
//! `dcpserve::hub`; a local path ignores these flags.

use std::path::PathBuf;

use serde::Deserialize;

/// The flags of a model named by a Hugging Face repo id (`Qwen/Qwen3-0.6B`), as vLLM
/// names them.
///
/// ```
/// use dcpserve_config::ModelSourceFlags;
/// let flags: ModelSourceFlags = toml::from_str("revision = \"v1.0\"\ngguf_file = \"Q4_K_M\"").unwrap();
/// assert_eq!(flags.revision.as_deref(), Some("v1.0"));
/// assert_eq!(flags.gguf_file.as_deref(), Some("Q4_K_M"));
/// assert_eq!(flags.download_dir, None);
/// ```
#[derive(clap::Args, Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct ModelSourceFlags {
    /// With a Hugging Face model id: the branch, tag or commit to load [default: main]
    #[arg(long)]
    pub revision: Option<String>,
    /// With a GGUF repo id: which .gguf file to load, by quantization (Q4_K_M) or file
    /// name; the same as ID:Q4_K_M [default: the repo's only .gguf file, else its Q4_K_M]
    #[arg(long)]
    pub gguf_file: Option<String>,
    /// The Hugging Face cache folder (the hub's layout: models--ORG--NAME/...) to look in
    /// and download into [default: $HF_HUB_CACHE, else $HF_HOME/hub, else
    /// ~/.cache/huggingface/hub]
    #[arg(long)]
    pub download_dir: Option<PathBuf>,
}
