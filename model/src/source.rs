//! One entry point for every supported model layout: [`ModelFiles::open`].

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use crate::chat_template::ChatTemplate;
use crate::config::ModelConfig;
use crate::config_check::check_config;
use crate::error::ModelError;
use crate::gguf::{GgufFile, GgufTensorSource};
use crate::gguf_config::config_from_gguf;
use crate::gguf_tokenizer::tokenizer_from_gguf;
use crate::grammar::GrammarCompiler;
use crate::hf_config::load_hf_config;
use crate::safetensors_source::SafetensorsSource;
use crate::tensors::TensorSource;
use crate::tokenizer::Tokenizer;

/// Everything loaded from a model's files: configuration, weights (memory-mapped, not yet
/// converted), tokenizer and chat template.
pub struct ModelFiles {
    pub config: ModelConfig,
    pub tensors: Box<dyn TensorSource>,
    pub tokenizer: Tokenizer,
    pub chat_template: Option<ChatTemplate>,
    /// The file or folder the model was opened from.
    pub path: PathBuf,
    /// The grammar engine over the tokenizer's vocabulary, built on first use.
    grammar: OnceLock<Result<Arc<GrammarCompiler>, String>>,
}

impl std::fmt::Debug for ModelFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelFiles")
            .field("path", &self.path)
            .field("config", &self.config)
            .field("tokenizer", &self.tokenizer)
            .field("chat_template", &self.chat_template.is_some())
            .finish()
    }
}

impl ModelFiles {
    /// The grammar engine (structured outputs) over this model's tokenizer, built on first
    /// use and shared; `Err` when the tokenizer's vocabulary cannot be read as bytes or
    /// the model has no end-of-sequence token.
    pub fn grammar(&self) -> Result<Arc<GrammarCompiler>, String> {
        self.grammar
            .get_or_init(|| GrammarCompiler::new(&self.tokenizer).map(Arc::new))
            .clone()
    }

    /// Opens a model from
    /// - a Hugging Face folder (`config.json`, `tokenizer.json`, safetensors weights),
    /// - a `.gguf` file, or
    /// - a folder holding exactly one `.gguf` file (and no `config.json`).
    ///
    /// The weights' names and shapes are checked against the configuration.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, ModelError> {
        let path = path.as_ref();
        if !path.exists() {
            return Err(ModelError::MissingFile {
                path: path.to_path_buf(),
                what: "no such model file or folder".into(),
            });
        }
        let files = if path.is_dir() {
            if path.join("config.json").is_file() {
                Self::open_hf_dir(path)?
            } else {
                Self::open_gguf(&single_gguf_in(path)?)?
            }
        } else if path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
        {
            Self::open_gguf(path)?
        } else {
            return Err(ModelError::unsupported(
                path,
                "expected a .gguf file or a Hugging Face model folder (with config.json)",
            ));
        };
        validate_tensors(&files.config, files.tensors.as_ref(), &files.path)?;
        Ok(files)
    }

    /// Reads only the model's configuration (`config.json`, or a GGUF header's metadata),
    /// so a serving layout can be checked before any weight is read.
    pub fn read_config(path: impl AsRef<Path>) -> Result<ModelConfig, ModelError> {
        let path = path.as_ref();
        if path.is_dir() && path.join("config.json").is_file() {
            return load_hf_config(path);
        }
        let gguf = if path.is_dir() {
            single_gguf_in(path)?
        } else {
            path.to_path_buf()
        };
        if !gguf.exists() {
            return Err(ModelError::MissingFile {
                path: gguf,
                what: "no such model file or folder".into(),
            });
        }
        crate::gguf_config::config_from_gguf(&crate::gguf::GgufFile::open(&gguf)?)
    }

    fn open_hf_dir(dir: &Path) -> Result<Self, ModelError> {
        let mut config = load_hf_config(dir)?;
        let tensors = SafetensorsSource::open_dir(dir)?;
        let mut tokenizer = Tokenizer::from_hf_dir(dir)?;
        if config.bos_token_id.is_none() {
            config.bos_token_id = tokenizer.bos_token_id();
        }
        reconcile_eos(&mut config, &mut tokenizer);
        let chat_template =
            ChatTemplate::from_hf_dir(dir, tokenizer.bos_token(), tokenizer.eos_token())?;
        Ok(ModelFiles {
            config,
            tensors: Box::new(tensors),
            tokenizer,
            chat_template,
            path: dir.to_path_buf(),
            grammar: OnceLock::new(),
        })
    }

    fn open_gguf(path: &Path) -> Result<Self, ModelError> {
        let file = Arc::new(GgufFile::open(path)?);
        let mut config = config_from_gguf(&file)?;
        let mut tokenizer = tokenizer_from_gguf(&file)?;
        reconcile_eos(&mut config, &mut tokenizer);
        let chat_template =
            ChatTemplate::from_gguf(&file, tokenizer.bos_token(), tokenizer.eos_token())?;
        let tensors = GgufTensorSource::new(file)?;
        Ok(ModelFiles {
            config,
            tensors: Box::new(tensors),
            tokenizer,
            chat_template,
            path: path.to_path_buf(),
            grammar: OnceLock::new(),
        })
    }
}

/// Makes the configuration and the tokenizer agree on which ids end generation.
fn reconcile_eos(config: &mut ModelConfig, tokenizer: &mut Tokenizer) {
    if config.eos_token_ids.is_empty() {
        config.eos_token_ids = tokenizer.eos_token_ids().to_vec();
    }
    tokenizer.add_eos_token_ids(&config.eos_token_ids);
}

fn single_gguf_in(dir: &Path) -> Result<PathBuf, ModelError> {
    let entries = std::fs::read_dir(dir).map_err(|e| ModelError::io(dir, e))?;
    let mut ggufs = Vec::new();
    for entry in entries {
        let p = entry.map_err(|e| ModelError::io(dir, e))?.path();
        if p.is_file()
            && p.extension()
                .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
        {
            ggufs.push(p);
        }
    }
    match ggufs.len() {
        1 => Ok(ggufs.remove(0)),
        0 => Err(ModelError::MissingFile {
            path: dir.join("config.json"),
            what: "the folder has neither config.json (Hugging Face layout) nor a .gguf file"
                .into(),
        }),
        n => {
            ggufs.sort();
            Err(ModelError::unsupported(
                dir,
                format!(
                    "{n} .gguf files ({}); pass the path of the one to load",
                    ggufs
                        .iter()
                        .filter_map(|p| p.file_name()?.to_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ))
        }
    }
}

fn layer_tensors(config: &ModelConfig, i: usize) -> Vec<(String, Vec<usize>)> {
    if config.mla.is_some() {
        return crate::arch::mla_layer_tensors(config, i);
    }
    let h = config.hidden_size;
    let q = config.num_attention_heads * config.head_dim;
    let kv = config.num_key_value_heads * config.head_dim;
    let p = format!("model.layers.{i}");
    let mut v = Vec::new();
    let mut push = |n: &str, s: Vec<usize>| v.push((format!("{p}.{n}"), s));
    push("input_layernorm.weight", vec![h]);
    push("post_attention_layernorm.weight", vec![h]);
    push("self_attn.q_proj.weight", vec![q, h]);
    push("self_attn.k_proj.weight", vec![kv, h]);
    push("self_attn.v_proj.weight", vec![kv, h]);
    push("self_attn.o_proj.weight", vec![h, q]);
    push("mlp.gate_proj.weight", vec![config.intermediate_size, h]);
    push("mlp.up_proj.weight", vec![config.intermediate_size, h]);
    push("mlp.down_proj.weight", vec![h, config.intermediate_size]);
    if config.attention_bias {
        push("self_attn.q_proj.bias", vec![q]);
        push("self_attn.k_proj.bias", vec![kv]);
        push("self_attn.v_proj.bias", vec![kv]);
    }
    if config.qk_norm {
        push("self_attn.q_norm.weight", vec![config.head_dim]);
        push("self_attn.k_norm.weight", vec![config.head_dim]);
    }
    v
}

/// The tensors the forward pass reads, with their expected row-major shapes.
pub fn expected_tensors(config: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let h = config.hidden_size;
    let mut v = vec![
        (
            "model.embed_tokens.weight".to_string(),
            vec![config.vocab_size, h],
        ),
        ("model.norm.weight".to_string(), vec![h]),
    ];
    if !config.tie_word_embeddings {
        v.push(("lm_head.weight".to_string(), vec![config.vocab_size, h]));
    }
    for i in 0..config.num_hidden_layers {
        v.extend(layer_tensors(config, i));
    }
    v
}

/// Checks that every tensor the configuration implies exists, has a supported type and the
/// expected shape.
pub fn validate_tensors(
    config: &ModelConfig,
    tensors: &dyn TensorSource,
    path: &Path,
) -> Result<(), ModelError> {
    check_config(path, config)?;
    let check = |name: String, shape: Vec<usize>| -> Result<(), ModelError> {
        if !tensors.contains(&name) {
            return Err(ModelError::MissingTensor {
                path: path.to_path_buf(),
                tensor: name,
            });
        }
        let t = tensors.get(&name)?;
        if t.shape != shape {
            return Err(ModelError::ShapeMismatch {
                path: path.to_path_buf(),
                tensor: name,
                expected: shape,
                found: t.shape,
            });
        }
        Ok(())
    };
    // Layer by layer, so that a corrupt layer count fails at the first missing layer instead
    // of first listing billions of names.
    let h = config.hidden_size;
    check(
        "model.embed_tokens.weight".into(),
        vec![config.vocab_size, h],
    )?;
    check("model.norm.weight".into(), vec![h])?;
    if !config.tie_word_embeddings {
        check("lm_head.weight".into(), vec![config.vocab_size, h])?;
    }
    for i in 0..config.num_hidden_layers {
        for (name, shape) in layer_tensors(config, i) {
            check(name, shape)?;
        }
    }
    Ok(())
}
