//! Rebuilds a byte-level BPE tokenizer (`tokenizer.ggml.model == "gpt2"`) from GGUF metadata,
//! the way Hugging Face transformers' GGUF loader does (`integrations/gguf/
//! gguf_tokenizer_mapping.py`: a `GPT2Tokenizer` over the file's vocabulary and merges, control
//! tokens made special, and the split regex chosen from `tokenizer.ggml.pre`), so that ids
//! match transformers exactly — except for `smollm`/`starcoder`, where digits are isolated
//! as in the models' own tokenizer.json and llama.cpp (see [`isolates_digits`]).

use std::collections::HashSet;

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

use crate::error::ModelError;
use crate::gguf::GgufFile;
use crate::tokenizer::Tokenizer;

/// llama.cpp token type of control tokens (`<|endoftext|>`, `<|im_start|>`).
const TOKEN_TYPE_CONTROL: i64 = 3;
/// llama.cpp token type of user-defined added tokens (e.g. `<think>`).
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const TEKKEN_SPLIT: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT4O_SPLIT: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN35_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The split regex for a `tokenizer.ggml.pre` value, as transformers'
/// `GGUF_PRE_TOKENIZER_SPLITS` maps it. `None` means GPT-2's own regex (ByteLevel with
/// `use_regex`), which transformers uses for every other value: `default`, `gpt2`, `smollm`,
/// `deepseek-llm`, ... (see [`isolates_digits`] for the one deliberate deviation).
pub fn split_regex_for_pre(pre: &str) -> Option<&'static str> {
    Some(match pre {
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "jina-v5-nano" | "dbrx" | "smaug-bpe" => LLAMA3_SPLIT,
        "tekken" => TEKKEN_SPLIT,
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "megrez" => QWEN2_SPLIT,
        "qwen35" => QWEN35_SPLIT,
        "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => GPT4O_SPLIT,
        _ => return None,
    })
}

/// Whether a `tokenizer.ggml.pre` value first splits off every `\p{N}` character (tokenizers'
/// `Digits(individual_digits)`) before the GPT-2 regex.
///
/// This deliberately deviates from transformers' GGUF converter, which drops that step: the
/// models' own `tokenizer.json` (SmolLM/SmolLM2, StarCoder) and llama.cpp's `smollm` /
/// `starcoder` pre-tokenizers have it, and the project's reference fixture
/// (`fixtures/smollm2/tokenizer_cases.json`, see scripts/make_references.py) follows them.
/// The two differ only for a numeral glued to a preceding space or symbol (`" ½"`).
pub fn isolates_digits(pre: &str) -> bool {
    matches!(pre, "smollm" | "starcoder")
}

/// GPT-2's byte → printable character table (`bytes_to_unicode`).
fn bytes_to_unicode() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        table[b as usize] = if printable {
            char::from(b)
        } else {
            let c = char::from_u32(next).unwrap_or('\u{FFFD}');
            next += 1;
            c
        };
    }
    table
}

fn strings<'a>(file: &'a GgufFile, key: &str) -> Result<Option<Vec<&'a str>>, ModelError> {
    let Some(items) = file.get_array(key)? else {
        return Ok(None);
    };
    items
        .iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_str().ok_or_else(|| {
                ModelError::corrupt(file.path(), format!("{key}[{i}] is not a string"))
            })
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// Builds the tokenizer a GGUF file describes.
pub fn tokenizer_from_gguf(file: &GgufFile) -> Result<Tokenizer, ModelError> {
    let path = file.path();
    let model = file.get_str("tokenizer.ggml.model")?.ok_or_else(|| {
        ModelError::config(
            path,
            "no tokenizer in the file (missing tokenizer.ggml.model)",
        )
    })?;
    match model {
        "gpt2" => {}
        "llama" => return Err(ModelError::unsupported(
            path,
            "SentencePiece GGUF tokenizers (tokenizer.ggml.model = \"llama\") are not supported; \
                 use the model's Hugging Face folder (tokenizer.json) instead",
        )),
        other => {
            return Err(ModelError::unsupported(
                path,
                format!("GGUF tokenizer model {other:?} (supported: \"gpt2\" byte-level BPE)"),
            ))
        }
    }

    let tokens = strings(file, "tokenizer.ggml.tokens")?
        .ok_or_else(|| ModelError::config(path, "missing tokenizer.ggml.tokens"))?;
    if tokens.len() > u32::MAX as usize {
        return Err(ModelError::corrupt(path, "more than 2^32 tokens"));
    }
    let merges = strings(file, "tokenizer.ggml.merges")?.ok_or_else(|| {
        ModelError::config(
            path,
            "missing tokenizer.ggml.merges (required for gpt2 BPE)",
        )
    })?;
    let token_types: Vec<i64> = match file.get_array("tokenizer.ggml.token_type")? {
        Some(a) => a.iter().map(|v| v.as_i64().unwrap_or(0)).collect(),
        None => Vec::new(),
    };

    // The vocabulary as transformers spells it: a token already written in the byte alphabet
    // stays; any other (e.g. a control token with a space) is re-spelled from its UTF-8 bytes.
    let table = bytes_to_unicode();
    let alphabet: HashSet<char> = table.iter().copied().collect();
    let in_alphabet = |t: &str| t.chars().all(|c| alphabet.contains(&c));
    let vocab: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(id, &t)| {
            let spelled = if in_alphabet(t) {
                t.to_string()
            } else {
                t.bytes().map(|b| table[b as usize]).collect()
            };
            (spelled, id as u32)
        })
        .collect();
    let merges = merges
        .iter()
        .enumerate()
        .map(|(i, m)| {
            m.split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .ok_or_else(|| {
                    ModelError::corrupt(
                        path,
                        format!("tokenizer.ggml.merges[{i}] {m:?} is not \"a b\""),
                    )
                })
        })
        .collect::<Result<Vec<_>, _>>()?;

    let bpe = BPE::builder()
        .vocab_and_merges(vocab.clone(), merges)
        .build()
        .map_err(|e| {
            ModelError::corrupt(
                path,
                format!("cannot build BPE from the GGUF vocabulary: {e}"),
            )
        })?;
    let mut inner = tokenizers::Tokenizer::new(bpe);

    let pre = file.get_str("tokenizer.ggml.pre")?.unwrap_or("default");
    let pre_tokenizer: PreTokenizerWrapper = match split_regex_for_pre(pre) {
        Some(regex) => {
            let split = Split::new(
                SplitPattern::Regex(regex.to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| ModelError::Tokenizer(format!("split regex for {pre:?}: {e}")))?;
            Sequence::new(vec![
                split.into(),
                ByteLevel::new(false, true, false).into(),
            ])
            .into()
        }
        None if isolates_digits(pre) => Sequence::new(vec![
            Digits::new(true).into(),
            ByteLevel::new(false, true, true).into(),
        ])
        .into(),
        None => ByteLevel::new(false, true, true).into(),
    };
    inner.with_pre_tokenizer(Some(pre_tokenizer));
    inner.with_decoder(Some(ByteLevelDecoder::default()));

    let id_token = |key: &str| -> Result<Option<(u32, String)>, ModelError> {
        match file.get_u64(key)? {
            None => Ok(None),
            Some(id) => tokens
                .get(id as usize)
                .map(|t| Some((id as u32, t.to_string())))
                .ok_or_else(|| {
                    ModelError::corrupt(path, format!("{key} = {id} is outside the vocabulary"))
                }),
        }
    };
    let bos = id_token("tokenizer.ggml.bos_token_id")?;
    let eos = id_token("tokenizer.ggml.eos_token_id")?;
    let unk = id_token("tokenizer.ggml.unknown_token_id")?;
    let pad = id_token("tokenizer.ggml.padding_token_id")?;

    // Control tokens become special added tokens (matched whole, skippable on decode). One
    // spelled outside the byte alphabet is a llama.cpp mislabel, which transformers skips.
    let mut special: Vec<AddedToken> = tokens
        .iter()
        .zip(&token_types)
        .filter(|(t, &ty)| ty == TOKEN_TYPE_CONTROL && in_alphabet(t))
        .map(|(t, _)| AddedToken::from(t.to_string(), true).normalized(false))
        .collect();
    // transformers also registers its named special tokens; only ones already in the
    // vocabulary, since a new id would not exist in the model.
    for (_, t) in [&bos, &eos, &unk, &pad].into_iter().flatten() {
        if vocab.contains_key(t) {
            special.push(AddedToken::from(t.clone(), true).normalized(false));
        }
    }
    inner.add_special_tokens(&special);
    let user_defined: Vec<AddedToken> = tokens
        .iter()
        .zip(&token_types)
        .filter(|(t, &ty)| ty == TOKEN_TYPE_USER_DEFINED && vocab.contains_key(**t))
        .map(|(t, _)| AddedToken::from(t.to_string(), false).normalized(false))
        .collect();
    inner.add_tokens(&user_defined);

    // BOS/EOS are added on encode only when the file asks (transformers' update_post_processor).
    let add_bos = file
        .get_bool("tokenizer.ggml.add_bos_token")?
        .unwrap_or(false)
        && bos.is_some();
    let add_eos = file
        .get_bool("tokenizer.ggml.add_eos_token")?
        .unwrap_or(false)
        && eos.is_some();
    if add_bos || add_eos {
        let mut single = String::new();
        let mut pair_tail = String::new();
        let mut specials = Vec::new();
        if let (true, Some((id, t))) = (add_bos, &bos) {
            single.push_str(&format!("{t}:0 "));
            pair_tail.push_str(&format!(" {t}:1"));
            specials.push((t.clone(), *id));
        }
        single.push_str("$A:0");
        pair_tail.push_str(" $B:1");
        if let (true, Some((id, t))) = (add_eos, &eos) {
            single.push_str(&format!(" {t}:0"));
            pair_tail.push_str(&format!(" {t}:1"));
            if !specials.iter().any(|(s, _)| s == t) {
                specials.push((t.clone(), *id));
            }
        }
        let pair = format!("{single}{pair_tail}");
        let post = TemplateProcessing::builder()
            .try_single(single.as_str())
            .and_then(|b| b.try_pair(pair.as_str()))
            .map_err(|e| ModelError::Tokenizer(format!("post-processor template: {e}")))?
            .special_tokens(specials)
            .build()
            .map_err(|e| ModelError::Tokenizer(format!("post-processor: {e}")))?;
        inner.with_post_processor(Some(post));
    }

    let mut tokenizer = Tokenizer::new(inner, bos.map(|b| b.1), eos.map(|e| e.1));
    let mut extra_eos = Vec::new();
    for key in ["tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
        extra_eos.extend(file.get_u64(key)?.and_then(|v| u32::try_from(v).ok()));
    }
    if let Some(ids) = file.get_array("tokenizer.ggml.eos_token_ids")? {
        extra_eos.extend(
            ids.iter()
                .filter_map(|v| v.as_u64())
                .filter_map(|v| u32::try_from(v).ok()),
        );
    }
    tokenizer.add_eos_token_ids(&extra_eos);
    Ok(tokenizer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_table_matches_gpt2() {
        let t = bytes_to_unicode();
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[b'a' as usize], 'a');
        assert_eq!(t[0xAD], 'Ń');
        let distinct: HashSet<char> = t.iter().copied().collect();
        assert_eq!(distinct.len(), 256);
    }

    #[test]
    fn pre_tokenizer_choice() {
        assert_eq!(split_regex_for_pre("smollm"), None);
        assert_eq!(split_regex_for_pre("llama-bpe"), Some(LLAMA3_SPLIT));
        assert_eq!(split_regex_for_pre("qwen2"), Some(QWEN2_SPLIT));
        assert_eq!(split_regex_for_pre("deepseek-llm"), None);
    }
}
