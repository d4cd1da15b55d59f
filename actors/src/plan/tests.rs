//! Every step message through bytes and back.

use dcpserve_kernels::{OutputConstraint, Rng, SamplingParams};

use super::*;

pub(crate) fn sampler_init() -> SamplerInit {
    let mut rng = Rng::new(42);
    rng.next_u64(); // a stream that has moved on, as after a preemption
    SamplerInit {
        params: SamplingParams {
            temperature: 0.7,
            top_k: 5,
            top_p: 0.9,
            min_p: 0.05,
            presence_penalty: 0.25,
            frequency_penalty: -0.5,
            repetition_penalty: 1.1,
            seed: Some(7),
            max_tokens: 9,
            min_tokens: 2,
            stop_token_ids: vec![4, 8],
            ignore_eos: true,
            logprobs: Some(3),
            prompt_logprobs: Some(1),
            constraint: Some(OutputConstraint::JsonSchema(r#"{"type":"object"}"#.into())),
        },
        tokens: vec![3, 4, 5, 6, 7],
        prompt_len: 4,
        rng,
        eos_token_ids: vec![2],
        max_model_len: 64,
    }
}

/// A plan with a new sequence (with its sampler), a cached one with a draft to verify
/// and its distribution, a prompt-scoring task, and released sequences.
pub(crate) fn plan() -> StepPlan {
    StepPlan {
        step_id: 12,
        micro_batch: 1,
        finished: vec![3, 9],
        seqs: vec![
            ScheduledSeq {
                id: 5,
                update: SeqUpdate::New(NewSeq {
                    block_table: vec![0, 7, 2],
                    sampler: Some(Box::new(sampler_init())),
                }),
                sample: Some(SampleTask {
                    logits_row: None,
                    prompt_rows: Some(PromptRows {
                        first_row: 0,
                        first_pos: 0,
                        rows: 3,
                    }),
                    ..Default::default()
                }),
            },
            ScheduledSeq {
                id: 6,
                update: SeqUpdate::Cached(CachedSeq {
                    kept_blocks: 1,
                    new_blocks: vec![11],
                }),
                sample: Some(SampleTask {
                    logits_row: Some(3),
                    draft: vec![17, 0],
                    draft_probs: Some(vec![vec![0.25, 0.75, 1e-30], vec![1.0, 0.0, 0.0]]),
                    prompt_rows: None,
                }),
            },
        ],
        tokens: vec![3, 4, 5, 6, 9, 17, 0],
        positions: vec![0, 1, 2, 3, 20, 21, 22],
        token_seq: vec![0, 0, 0, 0, 1, 1, 1],
        logits_for: vec![0, 1, 2, 4, 5, 6],
        output: OutputKind::Sampled,
    }
}

fn token(id: u32) -> TokenOutput {
    TokenOutput {
        token_id: id,
        logprob: Some(-0.125 - id as f32 * 1e-7),
        top_logprobs: vec![(id, -0.125), (1, -3.5)],
        prompt_logprobs: None,
    }
}

fn round_trip<T>(msg: &T)
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let bytes = wire::encode(msg).expect("encodes");
    let back: T = wire::decode(&bytes).expect("decodes");
    assert_eq!(&back, msg);
}

#[test]
fn every_step_message_round_trips_through_bytes() {
    round_trip(&plan());
    round_trip(&StepPlan {
        output: OutputKind::Logits,
        ..plan()
    });
    let sampled = StepOutput {
        step_id: 12,
        result: StepResult::Sampled(vec![
            SeqSampled {
                id: 5,
                tokens: Vec::new(),
                accepted: 0,
                prompt_logprobs: vec![token(4), token(5), token(6)],
                rng: Rng::new(1),
            },
            SeqSampled {
                id: 6,
                tokens: vec![token(17), token(23)],
                accepted: 1,
                prompt_logprobs: Vec::new(),
                rng: Rng::new(2),
            },
        ]),
    };
    round_trip(&sampled);
    let logits = StepOutput {
        step_id: 3,
        result: StepResult::Logits {
            logits: vec![0.1, -2.5e-8, 3.4e38, -1.0],
            vocab_size: 2,
        },
    };
    round_trip(&logits);
    round_trip(&StepReport::Done(Box::new(sampled)));
    round_trip(&StepReport::Failed {
        generation: 2,
        error: "rank 1: injected fault".into(),
    });
    round_trip(&MtpPlan {
        rows: StepBatch {
            step_id: 4,
            tokens: vec![8, 9],
            positions: vec![5, 6],
            token_seq: vec![0, 0],
            block_tables: vec![vec![1, 2]],
            logits_for: vec![1],
            seq_ids: vec![6],
        },
        chain: true,
    });
    round_trip(&MtpOutput {
        served: vec![6],
        logits: vec![0.5, -0.5],
        vocab_size: 2,
    });
}

#[test]
fn the_random_stream_continues_after_a_round_trip() {
    let mut rng = Rng::new(9);
    rng.next_u64();
    let mut back: Rng = wire::round_trip(&rng).unwrap();
    assert_eq!(back.next_u64(), rng.next_u64());
}
