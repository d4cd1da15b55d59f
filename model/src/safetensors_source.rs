//! Weights of a Hugging Face folder: `model.safetensors`, or shards listed in
//! `model.safetensors.index.json`, each memory-mapped. Experts stored fused (transformers 5)
//! are served under per-expert names ([`fused_experts`]).

mod fused_experts;

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use safetensors::{Dtype, SafeTensors};

use crate::error::ModelError;
use crate::json_file::read_json;
use crate::tensors::{DType, RawTensor, TensorBytes, TensorSource};

/// Where one tensor lives.
#[derive(Debug, Clone)]
struct Entry {
    shard: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    /// Absolute offset in the shard file.
    offset: usize,
    len: usize,
}

struct Shard {
    path: PathBuf,
    data: TensorBytes,
}

/// Memory-mapped safetensors weights under their own (Hugging Face) names.
pub struct SafetensorsSource {
    shards: Vec<Shard>,
    entries: HashMap<String, Entry>,
}

impl std::fmt::Debug for SafetensorsSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SafetensorsSource")
            .field(
                "shards",
                &self.shards.iter().map(|s| &s.path).collect::<Vec<_>>(),
            )
            .field("tensors", &self.entries.len())
            .finish()
    }
}

fn map_file(path: &Path) -> Result<TensorBytes, ModelError> {
    let file = File::open(path).map_err(|e| ModelError::io(path, e))?;
    // SAFETY: read-only map; the file must not be truncated while open (as for any mmap loader).
    let mmap = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| ModelError::io(path, e))?;
    Ok(Arc::new(mmap))
}

fn dtype_of(dtype: Dtype) -> Option<DType> {
    match dtype {
        Dtype::F32 => Some(DType::F32),
        Dtype::F16 => Some(DType::F16),
        Dtype::BF16 => Some(DType::BF16),
        _ => None,
    }
}

impl SafetensorsSource {
    /// Opens the weights of the folder `dir`: `model.safetensors.index.json` when present,
    /// else `model.safetensors`.
    pub fn open_dir(dir: &Path) -> Result<Self, ModelError> {
        let index = dir.join("model.safetensors.index.json");
        if index.is_file() {
            return Self::open_index(&index);
        }
        let single = dir.join("model.safetensors");
        if single.is_file() {
            return Self::open_files(&[single]);
        }
        Err(ModelError::MissingFile {
            path: single,
            what: "no model.safetensors or model.safetensors.index.json in the model folder".into(),
        })
    }

    /// Opens the shards named by a `model.safetensors.index.json`, checking that every tensor
    /// its `weight_map` lists is in the shard it names.
    pub fn open_index(index: &Path) -> Result<Self, ModelError> {
        let json = read_json(index)?;
        Self::from_index_json(index, &json, map_file)
    }

    /// Like [`SafetensorsSource::open_index`] with the index already parsed and each shard
    /// obtained from `load` (given the shard's path next to `index`): for images already
    /// in memory, and for tests and fuzzing. `index` only names the files in errors.
    ///
    /// ```
    /// use std::path::Path;
    /// use std::sync::Arc;
    /// use dcpserve_model::{tensors::TensorBytes, SafetensorsSource, TensorSource};
    /// let header = br#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
    /// let mut shard = (header.len() as u64).to_le_bytes().to_vec();
    /// shard.extend_from_slice(header);
    /// shard.extend_from_slice(&1.5f32.to_le_bytes());
    /// let index = serde_json::json!({"weight_map": {"w": "a.safetensors"}});
    /// let src = SafetensorsSource::from_index_json(Path::new("m/index.json"), &index, |_| {
    ///     Ok(Arc::new(shard.clone()) as TensorBytes)
    /// })
    /// .unwrap();
    /// assert_eq!(src.get("w").unwrap().to_f32_vec().unwrap(), [1.5]);
    /// ```
    pub fn from_index_json(
        index: &Path,
        json: &serde_json::Value,
        mut load: impl FnMut(&Path) -> Result<TensorBytes, ModelError>,
    ) -> Result<Self, ModelError> {
        let map = json
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| ModelError::corrupt(index, "no \"weight_map\" object"))?;
        let dir = index.parent().unwrap_or(Path::new("."));
        let mut files = BTreeSet::new();
        for (name, file) in map {
            let file = file.as_str().ok_or_else(|| {
                ModelError::corrupt(
                    index,
                    format!("weight_map entry {name:?} is not a file name"),
                )
            })?;
            // Shards live next to the index; refuse paths that would leave the folder.
            if file.contains('/') || file.contains('\\') || file == ".." {
                return Err(ModelError::corrupt(
                    index,
                    format!("shard name {file:?} is not a plain file name"),
                ));
            }
            files.insert(file.to_string());
        }
        let mut buffers = Vec::with_capacity(files.len());
        for f in &files {
            let path = dir.join(f);
            let data = load(&path)?;
            buffers.push((path, data));
        }
        let mut source = Self::index_buffers(buffers)?;
        for (name, file) in map {
            let found = source
                .entries
                .get(name)
                .map(|e| &source.shards[e.shard].path);
            if found != Some(&dir.join(file.as_str().unwrap_or_default())) {
                return Err(ModelError::MissingTensor {
                    path: dir.join(file.as_str().unwrap_or_default()),
                    tensor: name.clone(),
                });
            }
        }
        fused_experts::split_fused_experts(&source.shards, &mut source.entries)?;
        Ok(source)
    }

    /// Opens the given safetensors files as one set of tensors.
    pub fn open_files(paths: &[PathBuf]) -> Result<Self, ModelError> {
        let mut buffers = Vec::with_capacity(paths.len());
        for path in paths {
            buffers.push((path.clone(), map_file(path)?));
        }
        Self::from_buffers(buffers)
    }

    /// Safetensors images already in memory, as one set of tensors; each path only names
    /// its image in errors.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use dcpserve_model::{tensors::TensorBytes, SafetensorsSource};
    /// let garbage: TensorBytes = Arc::new(vec![0xffu8; 16]);
    /// assert!(SafetensorsSource::from_buffers(vec![("x.safetensors".into(), garbage)]).is_err());
    /// ```
    pub fn from_buffers(files: Vec<(PathBuf, TensorBytes)>) -> Result<Self, ModelError> {
        let mut source = Self::index_buffers(files)?;
        fused_experts::split_fused_experts(&source.shards, &mut source.entries)?;
        Ok(source)
    }

    /// Indexes the tensors of the images under their stored names.
    fn index_buffers(files: Vec<(PathBuf, TensorBytes)>) -> Result<Self, ModelError> {
        let mut shards = Vec::new();
        let mut entries: HashMap<String, Entry> = HashMap::new();
        for (path, data) in files {
            let path = &path;
            let buf = (*data).as_ref();
            let (header_len, metadata) = SafeTensors::read_metadata(buf)
                .map_err(|e| ModelError::corrupt(path, format!("invalid safetensors file: {e}")))?;
            // read_metadata validated the offsets against the buffer; the arithmetic is checked
            // again here so that a bug there cannot turn into an out-of-bounds window.
            let base = header_len
                .checked_add(8)
                .ok_or_else(|| ModelError::corrupt(path, "header length overflows"))?;
            let shard = shards.len();
            for (name, info) in metadata.tensors() {
                let (start, end) = info.data_offsets;
                let offset = base.checked_add(start);
                let len = end.checked_sub(start);
                let (Some(offset), Some(len)) = (offset, len) else {
                    return Err(ModelError::corrupt(
                        path,
                        format!("tensor {name:?} has invalid offsets"),
                    ));
                };
                if offset.checked_add(len).is_none_or(|e| e > buf.len()) {
                    return Err(ModelError::Truncated {
                        path: path.clone(),
                        reason: format!("tensor {name:?} runs past the end of the file"),
                    });
                }
                let entry = Entry {
                    shard,
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                    offset,
                    len,
                };
                if let Some(prev) = entries.insert(name.clone(), entry) {
                    return Err(ModelError::corrupt(
                        path,
                        format!(
                            "tensor {name:?} is also in {}",
                            shards
                                .get(prev.shard)
                                .map_or(path, |s: &Shard| &s.path)
                                .display()
                        ),
                    ));
                }
            }
            shards.push(Shard {
                path: path.clone(),
                data,
            });
        }
        Ok(SafetensorsSource { shards, entries })
    }
}

impl TensorSource for SafetensorsSource {
    fn get(&self, name: &str) -> Result<RawTensor, ModelError> {
        let entry = self
            .entries
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor {
                path: self
                    .shards
                    .first()
                    .map(|s| s.path.clone())
                    .unwrap_or_default(),
                tensor: name.to_string(),
            })?;
        let shard = &self.shards[entry.shard];
        let dtype = dtype_of(entry.dtype).ok_or_else(|| ModelError::UnsupportedTensorType {
            path: shard.path.clone(),
            tensor: name.to_string(),
            dtype: format!("{:?}", entry.dtype),
        })?;
        Ok(RawTensor {
            name: name.to_string(),
            dtype,
            shape: entry.shape.clone(),
            data: shard.data.clone(),
            offset: entry.offset,
            len: entry.len,
        })
    }

    fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.entries.keys().cloned().collect();
        v.sort();
        v
    }
}
