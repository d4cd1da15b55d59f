//! The multi-model config file of `dcpserve serve --config FILE` (TOML):
//!
//! ```toml
//! [server]
//! host = "127.0.0.1"
//! port = 8000
//! api_key = "secret"            # optional: require `Authorization: Bearer secret` on /v1
//! max_waiting_requests = 256    # per model, beyond max_num_seqs; more get 429
//! web_ui = true                 # false: no web page at `GET /` (as --no-web-ui)
//!
//! [[models]]
//! name = "smollm2"              # what clients put in `model`
//! path = "models/SmolLM2-135M-Instruct.Q4_1.gguf"   # or model = "Qwen/Qwen3-0.6B" (a hub id)
//! tensor_parallel_size = 1
//! decode_context_parallel_size = 1
//! prefill_context_parallel_size = 1   # copies of the TP group splitting each prefill
//! kv_cache_memory_bytes = 268435456
//! max_model_len = 2048
//! # optional, as vLLM's --speculative-config (a draft model path is relative to this file)
//! speculative_config = { method = "ngram", num_speculative_tokens = 4, prompt_lookup_max = 4 }
//! # optional, as vLLM's --tool-call-parser / --enable-auto-tool-choice / --reasoning-parser
//! tool_call_parser = "hermes"
//! enable_auto_tool_choice = true
//! reasoning_parser = "deepseek_r1"
//!
//! [models.sampling]             # defaults for fields a request leaves out
//! temperature = 0.7
//! max_tokens = 256
//! ```
//!
//! Relative model paths are resolved against the config file's folder. `model` is another
//! name of `path`; it may be a Hugging Face repo id (`Qwen/Qwen3-0.6B`, or
//! `org/name-GGUF:Q4_K_M` for one file of a GGUF repo), with `revision`, `gguf_file` and
//! `download_dir` as their flags (see [`ModelSourceFlags`]): a path that exists wins over
//! an id.

use std::path::{Path, PathBuf};

use crate::{
    ConfigError, DType, EngineConfig, ModelSourceFlags, ParallelConfig, RankSettingsFlags,
    SpeculativeConfig,
};
use serde::Deserialize;

/// Default port, as vLLM's.
pub const DEFAULT_PORT: u16 = 8000;
/// Default host: loopback, so that a server is not exposed by accident.
pub const DEFAULT_HOST: &str = "127.0.0.1";
/// Default bound on requests waiting beyond the running batch, per model.
pub const DEFAULT_MAX_WAITING_REQUESTS: usize = 256;

/// The whole file.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeConfig {
    #[serde(default)]
    pub server: ServerSection,
    #[serde(default)]
    pub models: Vec<ModelEntry>,
}

/// `[server]`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSection {
    pub host: Option<String>,
    pub port: Option<u16>,
    pub api_key: Option<String>,
    pub max_waiting_requests: Option<usize>,
    /// Whether `GET /` serves the web page (default true; `--no-web-ui` sets false).
    pub web_ui: Option<bool>,
}

/// One `[[models]]` entry: a model with its own supervisor and rank group.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelEntry {
    /// Served name (default: the file or folder name without extension).
    pub name: Option<String>,
    /// GGUF file, Hugging Face folder or Hugging Face repo id (default: the default
    /// model); `model` in the file is the same key.
    #[serde(alias = "model")]
    pub path: Option<PathBuf>,
    /// `revision`, `gguf_file` and `download_dir`, as their flags: where a model named by a
    /// Hugging Face repo id comes from.
    #[serde(flatten)]
    pub model_source: ModelSourceFlags,
    pub tensor_parallel_size: Option<usize>,
    pub decode_context_parallel_size: Option<usize>,
    pub prefill_context_parallel_size: Option<usize>,
    pub cp_kv_cache_interleave_size: Option<usize>,
    pub kv_cache_memory_bytes: Option<u64>,
    pub max_model_len: Option<usize>,
    pub max_num_seqs: Option<usize>,
    pub max_num_batched_tokens: Option<usize>,
    pub block_size: Option<usize>,
    pub dtype: Option<String>,
    /// `device`, `cpu_matmul`, `gpu_matmul` and `cuda_graphs`, as their flags
    /// (`cpu`, `auto`, `bf16` and `on` when left out).
    #[serde(flatten)]
    pub rank_settings: RankSettingsFlags,
    /// Share of each GPU's memory to use, as `--gpu-memory-utilization` (default 0.9).
    pub gpu_memory_utilization: Option<f64>,
    /// `auto`, `float32`, `bfloat16`, `fp8` (= `fp8_e4m3`) or `fp8_e5m2`, as vLLM's
    /// `--kv-cache-dtype` (see `EngineConfig::kv_cache_dtype`).
    pub kv_cache_dtype: Option<String>,
    pub enable_prefix_caching: Option<bool>,
    pub seed: Option<u64>,
    /// Compute threads of this model (default: all cores).
    pub threads: Option<usize>,
    /// Speculative decoding, as vLLM's `--speculative-config`.
    pub speculative_config: Option<SpeculativeConfig>,
    /// Two micro-batches in ping-pong, one's collectives overlapping the other's compute
    /// (default off).
    pub overlap_micro_batches: Option<bool>,
    /// Where the rank actors run, as vLLM's `--distributed-executor-backend`: `mp`
    /// (threads of this process, the default) or `mpi` (the processes of an MPI job).
    pub distributed_executor_backend: Option<String>,
    /// How the model writes tool calls, as vLLM's `--tool-call-parser`: `hermes`,
    /// `llama3_json` or `deepseek_v3`.
    pub tool_call_parser: Option<String>,
    /// Let requests use `tool_choice: "auto"` (needs `tool_call_parser`), as vLLM's
    /// `--enable-auto-tool-choice`.
    pub enable_auto_tool_choice: Option<bool>,
    /// Split `<think>` reasoning into `reasoning_content`: `deepseek_r1` or `qwen3`.
    pub reasoning_parser: Option<String>,
    #[serde(default)]
    pub sampling: SamplingDefaults,
}

/// `[models.sampling]`: values used when a request leaves the field out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SamplingDefaults {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub max_tokens: Option<usize>,
}

impl ModelEntry {
    /// The engine settings of this entry (defaults for what it leaves out).
    pub fn engine_config(&self) -> Result<EngineConfig, ConfigError> {
        let d = EngineConfig::default();
        let cfg = EngineConfig {
            parallel: ParallelConfig {
                tensor_parallel_size: self.tensor_parallel_size.unwrap_or(1),
                decode_context_parallel_size: self.decode_context_parallel_size.unwrap_or(1),
                prefill_context_parallel_size: self.prefill_context_parallel_size.unwrap_or(1),
                cp_kv_cache_interleave_size: self.cp_kv_cache_interleave_size.unwrap_or(1),
            },
            dtype: match &self.dtype {
                Some(s) => s.parse::<DType>()?,
                None => DType::Auto,
            },
            rank_settings: self.rank_settings.rank_settings()?,
            gpu_memory_utilization: self
                .gpu_memory_utilization
                .unwrap_or(d.gpu_memory_utilization),
            kv_cache_dtype: match &self.kv_cache_dtype {
                Some(s) => crate::engine::parse_kv_cache_dtype(s)?,
                None => None,
            },
            block_size: self.block_size.unwrap_or(d.block_size),
            kv_cache_memory_bytes: self.kv_cache_memory_bytes,
            max_model_len: self.max_model_len,
            max_num_seqs: self.max_num_seqs.unwrap_or(d.max_num_seqs),
            max_num_batched_tokens: self
                .max_num_batched_tokens
                .unwrap_or(d.max_num_batched_tokens),
            enable_prefix_caching: self
                .enable_prefix_caching
                .unwrap_or(d.enable_prefix_caching),
            num_threads: self.threads,
            seed: self.seed.unwrap_or(d.seed),
            overlap_micro_batches: self
                .overlap_micro_batches
                .unwrap_or(d.overlap_micro_batches),
            distributed_executor_backend: match &self.distributed_executor_backend {
                Some(s) => s.parse()?,
                None => d.distributed_executor_backend,
            },
            speculative: self
                .speculative_config
                .clone()
                .map(SpeculativeConfig::normalized)
                .transpose()?,
            ..d
        };
        cfg.validate_limits()?;
        Ok(cfg)
    }
}

impl ServeConfig {
    /// Parses a config from TOML text (paths are left as written).
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let cfg: ServeConfig =
            toml::from_str(text).map_err(|e| ConfigError(format!("Invalid config: {e}")))?;
        cfg.check()?;
        Ok(cfg)
    }

    /// Reads a config file; relative model paths become relative to its folder (unless
    /// nothing is there and the path reads as a Hugging Face repo id), and so does a
    /// relative `download_dir`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError(format!("Cannot read {}: {e}", path.display())))?;
        let mut cfg =
            Self::from_toml(&text).map_err(|e| ConfigError(format!("{}: {e}", path.display())))?;
        let base = path.parent().unwrap_or(Path::new("."));
        for m in &mut cfg.models {
            if let Some(p) = &m.path {
                let local = base.join(p);
                if p.is_relative() && (local.exists() || !looks_like_hub_id(p)) {
                    m.path = Some(local);
                }
            }
            if let Some(dir) = m.model_source.download_dir.as_mut() {
                if dir.is_relative() {
                    *dir = base.join(&*dir);
                }
            }
            if let Some(draft) = m.speculative_config.as_mut().and_then(|s| s.model.as_mut()) {
                let local = base.join(&*draft);
                if draft.is_relative() && (local.exists() || !looks_like_hub_id(draft)) {
                    *draft = local;
                }
            }
        }
        Ok(cfg)
    }

    fn check(&self) -> Result<(), ConfigError> {
        if self.models.is_empty() {
            return Err(ConfigError(
                "The config lists no model: add at least one [[models]] entry.".into(),
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for m in &self.models {
            if let Some(n) = &m.name {
                if n.is_empty() {
                    return Err(ConfigError("A model name must not be empty.".into()));
                }
                if !seen.insert(n.clone()) {
                    return Err(ConfigError(format!("The model name `{n}` is used twice.")));
                }
            }
            m.engine_config()?;
        }
        Ok(())
    }
}

/// Whether `path` has the form of a Hugging Face repo id: `org/name`, optionally followed
/// by `:FILE` (a GGUF selector), with no path syntax (`./`, `../`, a root, `~`) and no
/// model-file extension. `dcpserve::hub` resolves such ids; a path that exists wins.
///
/// ```
/// use dcpserve_config::serve_file::looks_like_hub_id;
/// use std::path::Path;
/// assert!(looks_like_hub_id(Path::new("Qwen/Qwen3-0.6B")));
/// assert!(looks_like_hub_id(Path::new("unsloth/Qwen3-0.6B-GGUF:Q4_K_M")));
/// assert!(!looks_like_hub_id(Path::new("models/tiny.gguf")));
/// assert!(!looks_like_hub_id(Path::new("./org/name")));
/// assert!(!looks_like_hub_id(Path::new("fixtures")));
/// ```
pub fn looks_like_hub_id(path: &Path) -> bool {
    let Some(s) = path.to_str() else {
        return false;
    };
    let repo = match s.split_once(':') {
        Some((repo, file)) if !file.is_empty() && !file.contains('/') => repo,
        Some(_) => return false,
        None => s,
    };
    let Some((org, name)) = repo.split_once('/') else {
        return false;
    };
    let part_ok = |p: &str| {
        !p.is_empty()
            && !p.starts_with(['.', '-'])
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    let lower = name.to_ascii_lowercase();
    part_ok(org)
        && part_ok(name)
        && !lower.ends_with(".gguf")
        && !lower.ends_with(".safetensors")
        && !lower.ends_with(".json")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn speculative_config_in_a_model_entry() {
        let cfg = ServeConfig::from_toml(
            r#"
            [[models]]
            name = "a"
            speculative_config = { method = "ngram", num_speculative_tokens = 3, prompt_lookup_max = 2 }
            "#,
        )
        .unwrap();
        let spec = cfg.models[0].engine_config().unwrap().speculative.unwrap();
        assert_eq!(spec.num_speculative_tokens, 3);
        // vLLM's rule: a missing bound takes the other's value.
        assert_eq!(
            (spec.prompt_lookup_min, spec.prompt_lookup_max),
            (Some(2), Some(2))
        );
        let bad = ServeConfig::from_toml(
            r#"
            [[models]]
            speculative_config = { method = "ngram", num_speculative_tokens = 0 }
            "#,
        )
        .unwrap_err();
        assert!(bad.0.contains("num_speculative_tokens"), "{bad}");
    }

    #[test]
    fn parses_the_documented_shape() {
        let cfg = ServeConfig::from_toml(
            r#"
            [server]
            port = 9000
            api_key = "k"
            max_waiting_requests = 4

            [[models]]
            name = "a"
            path = "a.gguf"
            tensor_parallel_size = 2
            decode_context_parallel_size = 2
            prefill_context_parallel_size = 2
            dtype = "float32"
            kv_cache_dtype = "fp8"
            device = "cuda"
            gpu_memory_utilization = 0.8
            gpu_matmul = "exact"
            cuda_graphs = "off"
            [models.sampling]
            temperature = 0.5
            max_tokens = 12

            [[models]]
            name = "b"
            "#,
        )
        .unwrap();
        assert_eq!(cfg.server.port, Some(9000));
        assert_eq!(cfg.models.len(), 2);
        let e = cfg.models[0].engine_config().unwrap();
        assert_eq!(e.parallel.tensor_parallel_size, 2);
        assert_eq!(e.parallel.prefill_context_parallel_size, 2);
        assert_eq!(e.dtype, DType::Float32);
        assert_eq!(e.kv_cache_dtype(), dcpserve_kernels::KvCacheDType::Fp8E4M3);
        assert_eq!(e.gpu_memory_utilization, 0.8);
        assert_eq!(
            e.rank_settings.gpu_matmul,
            dcpserve_kernels::GpuMatmul::Exact
        );
        assert_eq!(
            e.rank_settings.cuda_graphs,
            dcpserve_kernels::CudaGraphs::Off
        );
        let b = cfg.models[1].engine_config().unwrap();
        assert_eq!(b.kv_cache_dtype, None, "auto when left out");
        assert_eq!(
            b.gpu_memory_utilization, 0.9,
            "vLLM's default when left out"
        );
        assert_eq!(
            b.rank_settings.gpu_matmul,
            dcpserve_kernels::GpuMatmul::Bf16
        );
        assert_eq!(
            b.rank_settings.cuda_graphs,
            dcpserve_kernels::CudaGraphs::On,
            "on when left out"
        );
        assert_eq!(e.rank_settings.device, dcpserve_kernels::Device::Cuda);
        assert_eq!(
            b.rank_settings.device,
            dcpserve_kernels::Device::Cpu,
            "cpu when left out"
        );
        assert_eq!(cfg.models[0].sampling.max_tokens, Some(12));
    }

    #[test]
    fn a_model_key_may_name_a_hub_id_with_its_source_flags() {
        let dir = std::env::temp_dir().join(format!("dcpserve-serve-file-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("local/tiny")).unwrap();
        let file = dir.join("serve.toml");
        std::fs::write(
            &file,
            r#"
            [[models]]
            name = "hub"
            model = "Qwen/Qwen3-0.6B"
            revision = "v2"
            download_dir = "hf-cache"

            [[models]]
            name = "gguf"
            model = "unsloth/Qwen3-0.6B-GGUF:Q4_K_M"

            [[models]]
            name = "local"
            model = "local/tiny"

            [[models]]
            name = "missing"
            path = "missing.gguf"
            "#,
        )
        .unwrap();
        let cfg = ServeConfig::load(&file).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let m = &cfg.models;
        // An id stays an id; its flags are read; a relative download_dir follows the file.
        assert_eq!(m[0].path.as_deref(), Some(Path::new("Qwen/Qwen3-0.6B")));
        assert_eq!(m[0].model_source.revision.as_deref(), Some("v2"));
        assert_eq!(m[0].model_source.download_dir, Some(dir.join("hf-cache")));
        assert_eq!(
            m[1].path.as_deref(),
            Some(Path::new("unsloth/Qwen3-0.6B-GGUF:Q4_K_M"))
        );
        // A folder that exists next to the file wins over the id it could also be.
        assert_eq!(m[2].path, Some(dir.join("local/tiny")));
        // A path that is no id is relative to the file, as before.
        assert_eq!(m[3].path, Some(dir.join("missing.gguf")));
        let e = ServeConfig::from_toml("[[models]]\nmodel='a/b'\npath='c/d'").unwrap_err();
        assert!(e.0.contains("path") || e.0.contains("model"), "{e}");
    }

    #[test]
    fn rejects_bad_files() {
        assert!(ServeConfig::from_toml("")
            .unwrap_err()
            .0
            .contains("no model"));
        let e = ServeConfig::from_toml("[[models]]\nname='a'\n[[models]]\nname='a'").unwrap_err();
        assert!(e.0.contains("used twice"), "{e}");
        let e = ServeConfig::from_toml("[[models]]\nbogus=1").unwrap_err();
        assert!(e.0.contains("bogus"), "{e}");
        let e = ServeConfig::from_toml("[[models]]\ndtype='int3'").unwrap_err();
        assert!(e.0.contains("int3"), "{e}");
        let e = ServeConfig::from_toml("[[models]]\nkv_cache_dtype='int4'").unwrap_err();
        assert!(e.0.contains("int4"), "{e}");
        let e = ServeConfig::from_toml("[[models]]\ndevice='gpu'").unwrap_err();
        assert!(e.0.contains("gpu") && e.0.contains("cuda"), "{e}");
        let e = ServeConfig::from_toml("[[models]]\ngpu_matmul='fp4'").unwrap_err();
        assert!(e.0.contains("fp4") && e.0.contains("exact"), "{e}");
        let e = ServeConfig::from_toml("[[models]]\ncuda_graphs='eager'").unwrap_err();
        assert!(
            e.0.contains("eager") && e.0.contains("on") && e.0.contains("off"),
            "{e}"
        );
        // A boolean is not one of the two words.
        let e = ServeConfig::from_toml("[[models]]\ncuda_graphs=true").unwrap_err();
        assert!(e.0.contains("cuda_graphs"), "{e}");
    }
}
