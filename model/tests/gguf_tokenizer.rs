//! The tokenizer rebuilt from the default GGUF produces exactly the reference ids: those of
//! Hugging Face transformers for the same file (`AutoTokenizer.from_pretrained(...,
//! gguf_file=...)`, `add_special_tokens=True`) with SmolLM2's own pre-tokenizer (digits
//! isolated, as in its tokenizer.json and llama.cpp's `smollm`; see
//! `gguf_tokenizer::isolates_digits`).

mod common;

use std::path::PathBuf;

use dcpserve_model::gguf::GgufFile;
use dcpserve_model::gguf_tokenizer::tokenizer_from_gguf;
use dcpserve_model::{IncrementalDecoder, Tokenizer};
use serde::Deserialize;

#[derive(Deserialize)]
struct Case {
    text: String,
    ids: Vec<u32>,
}

fn tokenizer() -> Tokenizer {
    tokenizer_from_gguf(&GgufFile::open(common::default_model()).unwrap()).unwrap()
}

fn check_cases(tok: &Tokenizer, cases: &[Case]) {
    assert!(!cases.is_empty());
    for case in cases {
        let ids = tok.encode(&case.text, true).unwrap();
        assert_eq!(ids, case.ids, "encoding {:?}", case.text);
    }
}

/// The official fixture, written by scripts/make_references.py.
#[test]
fn matches_transformers_on_reference_fixture() {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures/smollm2/tokenizer_cases.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; generate it with scripts/make_references.py",
            path.display()
        )
    });
    let cases: Vec<Case> = serde_json::from_str(&text).expect("valid fixture JSON");
    check_cases(&tokenizer(), &cases);
}

/// Cases generated with transformers 5.23 (pre-tokenizer corrected as in
/// scripts/make_references.py) while writing this crate: ASCII, accents, emoji, CJK, code,
/// numerals, runs of spaces and newlines, special tokens.
#[test]
fn matches_transformers_on_builtin_cases() {
    let cases: Vec<Case> =
        serde_json::from_str(include_str!("data/smollm2_tokenizer_cases.json")).unwrap();
    check_cases(&tokenizer(), &cases);
}

#[test]
fn special_tokens_and_decode() {
    let tok = tokenizer();
    assert_eq!(tok.token_to_id("<|im_start|>"), Some(1));
    assert_eq!(tok.id_to_token(2).as_deref(), Some("<|im_end|>"));
    assert_eq!(tok.bos_token_id(), Some(1));
    assert_eq!(tok.eos_token_id(), Some(2));
    let text = "<|im_start|>user\nCafé 😀  x<|im_end|>";
    let ids = tok.encode(text, true).unwrap();
    assert_eq!(tok.decode(&ids, false).unwrap(), text);
    assert_eq!(tok.decode(&ids, true).unwrap(), "user\nCafé 😀  x");
}

#[test]
fn incremental_decoding_matches_full_decode() {
    let tok = tokenizer();
    let cases: Vec<Case> =
        serde_json::from_str(include_str!("data/smollm2_tokenizer_cases.json")).unwrap();
    for case in &cases {
        for skip in [false, true] {
            let mut dec = IncrementalDecoder::new(skip);
            let mut streamed = String::new();
            for &id in &case.ids {
                let piece = dec.push(&tok, &[id]).unwrap();
                assert!(
                    !piece.contains('\u{FFFD}') || case.text.contains('\u{FFFD}'),
                    "{piece:?}"
                );
                streamed.push_str(&piece);
            }
            streamed.push_str(&dec.flush(&tok).unwrap());
            assert_eq!(
                streamed,
                tok.decode(&case.ids, skip).unwrap(),
                "{:?}",
                case.text
            );
        }
    }
}

#[test]
fn incremental_decoding_after_a_prompt() {
    let tok = tokenizer();
    let prompt = tok.encode("The answer is", false).unwrap();
    let answer = tok.encode(" 42 — 🎉!", false).unwrap();
    let mut dec = IncrementalDecoder::with_prompt(&prompt, true);
    let mut out = String::new();
    for &id in &answer {
        out.push_str(&dec.push(&tok, &[id]).unwrap());
    }
    out.push_str(&dec.flush(&tok).unwrap());
    assert_eq!(out, " 42 — 🎉!");
}
