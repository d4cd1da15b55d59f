//! The sampler under a grammar: masks applied before sampling, drafts checked against the
//! grammar, the matcher rebuilt from a preempted sequence's tokens.

use std::sync::Arc;

use dcpserve_kernels::{OutputConstraint, Rng, SamplingParams};
use dcpserve_model::GrammarCompiler;

use super::{GrammarSource, SamplerInit, SeqSampler};

/// Token ids 0..128 are the ASCII bytes; then a few words; the last id is end-of-sequence.
fn vocab() -> Vec<Vec<u8>> {
    let mut words: Vec<Vec<u8>> = (0u8..128).map(|b| vec![b]).collect();
    for w in [
        "red", "green", "blue", "re", "gr", "{\"", "\": ", "true", "false", "\"}", "}",
    ] {
        words.push(w.as_bytes().to_vec());
    }
    words.push(b"\xFF</s>".to_vec());
    words
}

fn eos() -> u32 {
    vocab().len() as u32 - 1
}

fn id(w: &str) -> u32 {
    vocab().iter().position(|x| x == w.as_bytes()).unwrap() as u32
}

fn source() -> GrammarSource {
    let c = Arc::new(GrammarCompiler::from_token_bytes(vocab(), vocab().len(), &[eos()]).unwrap());
    Arc::new(move || Ok(c.clone()))
}

fn sampler(
    constraint: OutputConstraint,
    temperature: f32,
    seed: u64,
    output: &[u32],
) -> SeqSampler {
    let mut tokens = vec![b'Q' as u32, b'?' as u32];
    tokens.extend_from_slice(output);
    let init = SamplerInit {
        params: SamplingParams {
            temperature,
            max_tokens: 64,
            logprobs: Some(2),
            constraint: Some(constraint),
            ..Default::default()
        },
        tokens,
        prompt_len: 2,
        rng: Rng::new(seed),
        eos_token_ids: vec![eos()],
        max_model_len: 256,
    };
    SeqSampler::new(&init).with_grammar(Some(source()))
}

fn text(tokens: &[u32]) -> String {
    let v = vocab();
    let bytes: Vec<u8> = tokens
        .iter()
        .filter(|&&t| t != eos())
        .flat_map(|&t| v[t as usize].clone())
        .collect();
    String::from_utf8(bytes).unwrap()
}

/// Logits that favour `favourite` strongly, with noise from `rng` elsewhere.
fn logits(rng: &mut Rng, favourite: Option<u32>) -> Vec<f32> {
    let mut l: Vec<f32> = (0..vocab().len())
        .map(|_| rng.next_f64() as f32 * 4.0)
        .collect();
    if let Some(f) = favourite {
        l[f as usize] = 50.0;
    }
    l
}

/// Generates until the sequence ends, with `draft` proposing each step (no drafts if it
/// gives none). Returns the tokens and how many drafts were accepted.
fn generate(
    s: &mut SeqSampler,
    seed: u64,
    mut draft: impl FnMut(usize) -> Vec<u32>,
) -> (Vec<u32>, usize) {
    let mut rng = Rng::new(seed);
    let mut out = Vec::new();
    let mut accepted = 0;
    for step in 0..64 {
        let d = draft(step);
        s.prepare_masks(&d);
        let rows: Vec<Vec<f32>> = (0..=d.len()).map(|_| logits(&mut rng, None)).collect();
        let refs: Vec<&[f32]> = rows.iter().map(|r| r.as_slice()).collect();
        let (tokens, a) = s.decide(&refs, &d, None);
        accepted += a;
        out.extend(tokens.iter().map(|t| t.token_id));
        if out.last() == Some(&eos()) {
            return (out, accepted);
        }
    }
    panic!("no end after 64 steps: {:?}", text(&out));
}

#[test]
fn sampled_outputs_stay_in_the_grammar_and_end() {
    let choices = ["red", "green", "blue"];
    let c = OutputConstraint::Choice(choices.iter().map(|s| s.to_string()).collect());
    let mut seen = std::collections::HashSet::new();
    for seed in 0..40 {
        let mut s = sampler(c.clone(), 1.0, seed, &[]);
        let (out, _) = generate(&mut s, seed + 100, |_| Vec::new());
        let t = text(&out);
        assert!(choices.contains(&t.as_str()), "{t:?}");
        seen.insert(t);
    }
    assert!(seen.len() > 1, "temperature 1 draws different choices");
}

#[test]
fn greedy_takes_the_best_allowed_token_and_logprobs_are_masked() {
    let mut s = sampler(OutputConstraint::Regex("[0-9]+".into()), 0.0, 1, &[]);
    s.prepare_masks(&[]);
    let mut l = vec![0.0f32; vocab().len()];
    l[b'a' as usize] = 9.0; // the model's favourite, which the grammar forbids
    l[b'7' as usize] = 3.0;
    l[b'5' as usize] = 2.0;
    let (out, _) = s.decide(&[&l], &[], None);
    assert_eq!(out[0].token_id, b'7' as u32);
    let top: Vec<u32> = out[0].top_logprobs.iter().map(|(t, _)| *t).collect();
    assert_eq!(
        top,
        vec![b'7' as u32, b'5' as u32],
        "alternatives from the masked logits"
    );
    assert!(out[0].logprob.unwrap() > -1.0);
}

#[test]
fn a_draft_token_the_grammar_rejects_is_never_emitted() {
    let c = OutputConstraint::Choice(vec!["green".into(), "grey".into()]);
    // Greedy, and the logits of every row favour the draft token at that row: drafts stand
    // until the first one the grammar rejects, which is replaced by an allowed token.
    let mut s = sampler(c, 0.0, 3, &[]);
    let draft = [id("gr"), b'x' as u32, b'e' as u32];
    s.prepare_masks(&draft);
    let mut rng = Rng::new(5);
    let rows: Vec<Vec<f32>> = (0..=draft.len())
        .map(|i| logits(&mut rng, draft.get(i).copied()))
        .collect();
    let refs: Vec<&[f32]> = rows.iter().map(|r| r.as_slice()).collect();
    let (out, accepted) = s.decide(&refs, &draft, None);
    let ids: Vec<u32> = out.iter().map(|t| t.token_id).collect();
    assert_eq!(accepted, 1, "`gr` stands, `x` does not");
    assert_eq!(ids.len(), 2);
    assert_eq!(ids[0], id("gr"));
    assert!(ids[1] == b'e' as u32, "the only letter after `gr`: {ids:?}");

    // Sampled verification (temperature 1) with random drafts: whatever is emitted parses.
    for seed in 0..30 {
        let c = OutputConstraint::Choice(vec!["green".into(), "grey".into(), "blue".into()]);
        let mut s = sampler(c, 1.0, seed, &[]);
        let mut draft_rng = Rng::new(seed * 7 + 1);
        let (out, _) = generate(&mut s, seed, |_| {
            (0..3)
                .map(|_| (draft_rng.next_u64() % vocab().len() as u64) as u32)
                .collect()
        });
        let t = text(&out);
        assert!(["green", "grey", "blue"].contains(&t.as_str()), "{t:?}");
    }
}

#[test]
fn drafts_the_grammar_allows_are_accepted() {
    let c = OutputConstraint::Choice(vec!["green".into()]);
    let mut s = sampler(c, 0.0, 3, &[]);
    let draft = [id("gr"), b'e' as u32, b'e' as u32, b'n' as u32];
    s.prepare_masks(&draft);
    let mut rng = Rng::new(9);
    let mut rows: Vec<Vec<f32>> = (0..=draft.len())
        .map(|i| logits(&mut rng, draft.get(i).copied()))
        .collect();
    rows[draft.len()][eos() as usize] = 60.0;
    let refs: Vec<&[f32]> = rows.iter().map(|r| r.as_slice()).collect();
    let (out, accepted) = s.decide(&refs, &draft, None);
    assert_eq!(accepted, 4);
    assert_eq!(
        out.last().unwrap().token_id,
        eos(),
        "the grammar is complete: end"
    );
}

#[test]
fn a_preempted_sequence_resumes_its_grammar_from_its_tokens() {
    let c = OutputConstraint::Choice(vec!["green".into(), "blue".into()]);
    // Resumed after `gr`: only `green` can follow, whatever the logits say.
    for seed in 0..10 {
        let mut s = sampler(c.clone(), 1.0, seed, &[id("gr")]);
        let (out, _) = generate(&mut s, seed, |_| Vec::new());
        assert_eq!(format!("gr{}", text(&out)), "green");
    }
}

#[test]
fn masks_are_computed_at_decide_time_when_not_prepared() {
    let mut s = sampler(OutputConstraint::Regex("ab".into()), 1.0, 2, &[]);
    let mut rng = Rng::new(1);
    let mut out = Vec::new();
    for _ in 0..4 {
        let l = logits(&mut rng, None);
        let (t, _) = s.decide(&[&l], &[], None);
        out.push(t[0].token_id);
        if t[0].token_id == eos() {
            break;
        }
    }
    assert_eq!(out, vec![b'a' as u32, b'b' as u32, eos()]);
}

#[test]
fn greedy_without_logprobs_checks_the_favourite_first_and_matches_the_mask() {
    // Greedy, no log-probabilities: the sampler tries the unconstrained argmax against the
    // grammar before computing a mask. Its choice must be the masked argmax at every step,
    // whether the favourite is allowed (even steps) or not (odd steps: 'x' is favoured,
    // the path's token comes second); the reference is a separate matcher's full mask.
    let schema = r#"{"type":"object","properties":{"a":{"type":"boolean"}},"required":["a"],"additionalProperties":false}"#;
    let c = OutputConstraint::JsonSchema(schema.into());
    let path = [
        id("{\""),
        b'a' as u32,
        id("\": "),
        id("true"),
        b'}' as u32,
        eos(),
    ];
    let mut s = sampler(c.clone(), 0.0, 1, &[]);
    s.params.logprobs = None;
    let compiler = source()().unwrap();
    let mut reference = compiler.matcher(&c).unwrap();
    let mut rng = Rng::new(9);
    let mut out = Vec::new();
    for (step, &next) in path.iter().enumerate() {
        let mut l = logits(
            &mut rng,
            Some(if step % 2 == 0 { next } else { b'x' as u32 }),
        );
        if step % 2 == 1 {
            l[next as usize] = 40.0;
        }
        let mut masked = l.clone();
        let mask = reference.mask();
        mask.apply(&mut masked);
        let want = dcpserve_kernels::argmax(&masked);
        assert_eq!(want, next, "step {step}: the path is allowed");
        s.prepare_masks(&[]);
        let g = s.grammar.as_ref().unwrap();
        assert!(
            g.matcher.is_some() && g.masks.is_empty(),
            "matcher only, no mask"
        );
        let (got, accepted) = s.decide(&[&l], &[], None);
        assert_eq!((got.len(), accepted), (1, 0));
        assert_eq!(got[0].token_id, want, "step {step}");
        assert!(got[0].logprob.is_none());
        out.push(want);
        reference.consume(&[want]).unwrap();
    }
    let v: serde_json::Value = serde_json::from_str(&text(&out)).unwrap();
    assert_eq!(v["a"], serde_json::Value::Bool(true));
}
