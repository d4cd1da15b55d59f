//! Which files of a hub repo make the model: a Hugging Face folder's config, tokenizer
//! and safetensors weights, or one `.gguf` file chosen by a selector (`Q4_K_M` or a file
//! name), as llama.cpp's `-hf repo:QUANT` chooses.

/// What to load from a repo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Selection {
    /// The snapshot folder, with these files (relative paths).
    Folder(Vec<String>),
    /// This `.gguf` file (a relative path).
    Gguf(String),
}

/// The quantization a GGUF repo of several files loads when none is named (llama.cpp's).
const DEFAULT_QUANT: &str = "Q4_K_M";

/// Folder files read when the repo has them (besides the required ones).
const OPTIONAL: [&str; 5] = [
    "tokenizer_config.json",
    "generation_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
];

/// Chooses the model's files among `listing` (the repo's files, relative paths), with the
/// GGUF `selector` if one was given; `Err` says why none fit.
pub(super) fn select(listing: &[String], selector: Option<&str>) -> Result<Selection, String> {
    let has = |name: &str| listing.iter().any(|f| f == name);
    if selector.is_none() && has("config.json") {
        return folder(listing).map(Selection::Folder);
    }
    let ggufs: Vec<&String> = listing
        .iter()
        .filter(|f| f.to_ascii_lowercase().ends_with(".gguf"))
        .collect();
    if ggufs.is_empty() {
        return Err(match selector {
            Some(s) => format!("no .gguf file to match `{s}` (the repo has no .gguf file)"),
            None => "neither config.json (a Hugging Face model) nor a .gguf file".to_string(),
        });
    }
    gguf(&ggufs, selector).map(Selection::Gguf)
}

fn folder(listing: &[String]) -> Result<Vec<String>, String> {
    let top_level_weights: Vec<String> = listing
        .iter()
        .filter(|f| !f.contains('/') && f.ends_with(".safetensors"))
        .cloned()
        .collect();
    // Mistral's repos carry their own-format `consolidated.safetensors` beside the
    // transformers weights: only the latter load.
    let transformers: Vec<String> = top_level_weights
        .iter()
        .filter(|f| !f.starts_with("consolidated"))
        .cloned()
        .collect();
    if transformers.is_empty() {
        return Err(
            "no *.safetensors weights beside config.json (dcpserve loads safetensors and GGUF, \
             not PyTorch .bin files)"
                .into(),
        );
    }
    if !listing.iter().any(|f| f == "tokenizer.json") {
        return Err(
            "no tokenizer.json beside config.json (dcpserve reads a Hugging Face folder's \
             tokenizer from tokenizer.json)"
                .into(),
        );
    }
    let mut files = vec!["config.json".to_string(), "tokenizer.json".to_string()];
    files.extend(
        OPTIONAL
            .iter()
            .chain(["model.safetensors.index.json"].iter())
            .filter(|name| listing.iter().any(|f| f == *name))
            .map(|s| s.to_string()),
    );
    files.extend(transformers);
    Ok(files)
}

fn gguf(ggufs: &[&String], selector: Option<&str>) -> Result<String, String> {
    let all = || {
        ggufs
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let Some(wanted) = selector else {
        // Vision projectors are no language model.
        let models: Vec<&&String> = ggufs
            .iter()
            .filter(|f| !basename(f).to_ascii_lowercase().starts_with("mmproj"))
            .collect();
        if let [only] = models.as_slice() {
            return Ok(only.to_string());
        }
        return match matching(ggufs, DEFAULT_QUANT).as_slice() {
            [only] => Ok(only.to_string()),
            _ => Err(format!(
                "{} .gguf files and none is {DEFAULT_QUANT}: name one as ID:QUANT or with --gguf-file ({})",
                ggufs.len(),
                all()
            )),
        };
    };
    match matching(ggufs, wanted).as_slice() {
        [only] => Ok(only.to_string()),
        [] => Err(format!(
            "no .gguf file matches `{wanted}`; the repo has {}",
            all()
        )),
        several => Err(format!(
            "several .gguf files match `{wanted}` ({}): name the file with --gguf-file",
            several.join(", ")
        )),
    }
}

/// The files `wanted` selects: a file name (or relative path) ending in `.gguf`, else a
/// quantization the file name ends with (`Q4_K_M` selects `Qwen3-0.6B-Q4_K_M.gguf`, not
/// `…-Q4_K_S.gguf`), case-insensitive.
fn matching(ggufs: &[&String], wanted: &str) -> Vec<String> {
    let w = wanted.to_ascii_lowercase();
    if w.ends_with(".gguf") {
        return ggufs
            .iter()
            .filter(|f| f.to_ascii_lowercase() == w || basename(f).to_ascii_lowercase() == w)
            .map(|s| s.to_string())
            .collect();
    }
    ggufs
        .iter()
        .filter(|f| {
            let name = basename(f).to_ascii_lowercase();
            let stem = &name[..name.len() - ".gguf".len()];
            stem == w
                || stem
                    .strip_suffix(w.as_str())
                    .is_some_and(|head| head.ends_with(['-', '.']))
        })
        .map(|s| s.to_string())
        .collect()
}

fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_transformers_repo_is_its_folder_with_its_weights() {
        let repo = list(&[
            ".gitattributes",
            "README.md",
            "config.json",
            "generation_config.json",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "model.safetensors.index.json",
            "original/consolidated.pth",
            "tokenizer.json",
            "tokenizer_config.json",
        ]);
        let Selection::Folder(files) = select(&repo, None).unwrap() else {
            panic!("a folder")
        };
        assert_eq!(
            files,
            list(&[
                "config.json",
                "tokenizer.json",
                "tokenizer_config.json",
                "generation_config.json",
                "model.safetensors.index.json",
                "model-00001-of-00002.safetensors",
                "model-00002-of-00002.safetensors",
            ])
        );
        let e = select(&list(&["config.json", "pytorch_model.bin"]), None).unwrap_err();
        assert!(e.contains("safetensors"), "{e}");
        let e = select(&list(&["config.json", "model.safetensors"]), None).unwrap_err();
        assert!(e.contains("no tokenizer.json"), "{e}");
        let mistral = list(&[
            "config.json",
            "consolidated.safetensors",
            "model.safetensors",
            "tokenizer.json",
        ]);
        let Selection::Folder(files) = select(&mistral, None).unwrap() else {
            panic!("a folder")
        };
        assert!(!files.contains(&"consolidated.safetensors".to_string()));
    }

    #[test]
    fn a_gguf_selector_picks_one_quantization() {
        let repo = list(&[
            "README.md",
            "Qwen3-0.6B-Q4_K_M.gguf",
            "Qwen3-0.6B-Q4_K_S.gguf",
            "Qwen3-0.6B-Q8_0.gguf",
            "Qwen3-0.6B-BF16.gguf",
            "mmproj-F16.gguf",
        ]);
        let pick = |s: Option<&str>| select(&repo, s);
        assert_eq!(
            pick(Some("Q8_0")).unwrap(),
            Selection::Gguf("Qwen3-0.6B-Q8_0.gguf".into())
        );
        assert_eq!(
            pick(Some("q4_k_m")).unwrap(),
            Selection::Gguf("Qwen3-0.6B-Q4_K_M.gguf".into()),
            "case does not matter, and Q4_K_M is not Q4_K_S"
        );
        assert_eq!(
            pick(Some("Qwen3-0.6B-BF16.gguf")).unwrap(),
            Selection::Gguf("Qwen3-0.6B-BF16.gguf".into())
        );
        // Without a selector, llama.cpp's default quantization.
        assert_eq!(
            pick(None).unwrap(),
            Selection::Gguf("Qwen3-0.6B-Q4_K_M.gguf".into())
        );
        let e = pick(Some("Q2_K")).unwrap_err();
        assert!(
            e.contains("Q2_K") && e.contains("Qwen3-0.6B-Q8_0.gguf"),
            "{e}"
        );
        let e = pick(Some("K_M")).unwrap_err();
        assert!(e.contains("no .gguf file matches"), "{e}");
        // A single model file (beside a projector) needs no selector.
        let one = list(&["m-Q6_K.gguf", "mmproj-F16.gguf"]);
        assert_eq!(
            select(&one, None).unwrap(),
            Selection::Gguf("m-Q6_K.gguf".into())
        );
        let two = list(&["a-Q6_K.gguf", "a-Q8_0.gguf"]);
        let e = select(&two, None).unwrap_err();
        assert!(
            e.contains("--gguf-file") && e.contains("a-Q8_0.gguf"),
            "{e}"
        );
        let sub = list(&["Q4_K_M/m-Q4_K_M.gguf", "Q8_0/m-Q8_0.gguf"]);
        assert_eq!(
            select(&sub, Some("Q8_0")).unwrap(),
            Selection::Gguf("Q8_0/m-Q8_0.gguf".into())
        );
        let e = select(&list(&["config.json"]), Some("Q8_0")).unwrap_err();
        assert!(e.contains("no .gguf file"), "{e}");
        let e = select(&list(&["README.md"]), None).unwrap_err();
        assert!(e.contains("neither config.json"), "{e}");
    }
}
