use dcpserve_kernels::{CpuBackend, Rng, SamplingParams};

use super::*;
use crate::plan::{CachedSeq, NewSeq, PromptRows, SampleTask, ScheduledSeq, SeqUpdate};
use crate::sampler::SamplerInit;

const VOCAB: usize = 300;

fn init(params: SamplingParams, seed: u64) -> SamplerInit {
    SamplerInit {
        params,
        tokens: vec![5, 6, 7],
        prompt_len: 3,
        rng: Rng::new(seed),
        eos_token_ids: vec![1],
        max_model_len: 10_000,
    }
}

/// Sequences sampled every step (their parameters cover every kind of draw), and one
/// (id 99) whose prompt is still being prefilled (a task without a logits row).
fn sequences() -> Vec<(u64, SamplingParams)> {
    let p = SamplingParams {
        max_tokens: 1000,
        ..Default::default()
    };
    vec![
        (
            1,
            SamplingParams {
                temperature: 0.0,
                logprobs: Some(4),
                ..p.clone()
            },
        ),
        (2, p.clone()),
        (
            3,
            SamplingParams {
                temperature: 0.8,
                top_k: 20,
                logprobs: Some(0),
                ..p.clone()
            },
        ),
        (
            4,
            SamplingParams {
                top_p: 0.8,
                min_p: 0.02,
                logprobs: Some(2),
                ..p.clone()
            },
        ),
        (
            5,
            SamplingParams {
                min_p: 0.3,
                temperature: 1.3,
                ..p.clone()
            },
        ),
        (
            6,
            SamplingParams {
                top_k: 7,
                top_p: 0.5,
                min_tokens: 3,
                ..p.clone()
            },
        ),
        (99, p),
    ]
}

/// Step `step` of the run: every sequence new at step 0, cached afterwards.
fn step_plan(step: u64, seqs: &[(u64, SamplingParams)]) -> StepPlan {
    let mut rows = 0;
    let seqs = seqs
        .iter()
        .map(|(id, params)| {
            let update = if step == 0 {
                SeqUpdate::New(NewSeq {
                    block_table: vec![0],
                    sampler: Some(Box::new(init(params.clone(), 1000 + id))),
                })
            } else {
                SeqUpdate::Cached(CachedSeq {
                    kept_blocks: 1,
                    new_blocks: Vec::new(),
                })
            };
            let logits_row = (*id != 99).then(|| {
                rows += 1;
                rows - 1
            });
            ScheduledSeq {
                id: *id,
                update,
                sample: Some(SampleTask {
                    logits_row,
                    ..Default::default()
                }),
            }
        })
        .collect();
    StepPlan {
        step_id: step,
        seqs,
        ..Default::default()
    }
}

/// Random logits with ties and -inf entries.
fn logits(rows: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    (0..rows * VOCAB)
        .map(|i| match i % 97 {
            0 => f32::NEG_INFINITY,
            1 | 2 => 2.5,
            _ => rng.next_f32() * 6.0 - 3.0,
        })
        .collect()
}

#[test]
fn device_draws_match_the_host_sampler_step_after_step() {
    let seqs = sequences();
    let cpu = CpuBackend::new(1);
    let (mut host, mut dev) = (SeqStates::new(true), SeqStates::new(true));
    let mut drawn_steps = 0;
    for step in 0..25 {
        let plan = step_plan(step, &seqs);
        host.apply(&plan).unwrap();
        dev.apply(&plan).unwrap();
        let l = logits(seqs.len() - 1, step);
        let want = host.sample(&plan, &l, VOCAB).unwrap();
        // Sequence 6 holds stop tokens back for its first 3 tokens: the host samples.
        assert_eq!(dev.rows_drawable(&plan), step >= 3, "step {step}");
        let got = if dev.rows_drawable(&plan) {
            drawn_steps += 1;
            dev.sample_rows(&plan, &cpu, &l, VOCAB).unwrap()
        } else {
            dev.sample(&plan, &l, VOCAB).unwrap()
        };
        assert_eq!(got, want, "step {step}");
    }
    assert_eq!(drawn_steps, 22);
}

#[test]
fn rows_left_to_the_host_are_drawn_there_from_the_same_numbers() {
    let seqs: Vec<_> = sequences().into_iter().filter(|s| s.0 != 6).collect();
    let (mut host, mut dev) = (SeqStates::new(true), SeqStates::new(true));
    for step in 0..10 {
        let plan = step_plan(step, &seqs);
        host.apply(&plan).unwrap();
        dev.apply(&plan).unwrap();
        let l = logits(seqs.len() - 1, 50 + step);
        let want = host.sample(&plan, &l, VOCAB).unwrap();
        let mut fetched = Vec::new();
        let got = dev
            .sample_drawn(
                &plan,
                // A device that answers only every other draw.
                |draws| {
                    Ok(draws
                        .iter()
                        .enumerate()
                        .map(|(i, d)| {
                            (i % 2 == 0).then(|| {
                                draw_row_on_host(&l[d.row * VOCAB..(d.row + 1) * VOCAB], d)
                            })
                        })
                        .collect())
                },
                |r| {
                    fetched.push(r);
                    Ok(l[r * VOCAB..(r + 1) * VOCAB].to_vec())
                },
            )
            .unwrap();
        assert_eq!(got, want, "step {step}");
        assert_eq!(
            fetched,
            vec![1, 3],
            "only the unanswered rows are downloaded"
        );
    }
}

#[test]
fn a_wrong_device_answer_shows() {
    let seqs: Vec<_> = sequences().into_iter().filter(|s| s.0 != 6).collect();
    let mut dev = SeqStates::new(true);
    let mut host = SeqStates::new(true);
    let plan = step_plan(0, &seqs);
    dev.apply(&plan).unwrap();
    host.apply(&plan).unwrap();
    let l = logits(seqs.len() - 1, 3);
    let want = host.sample(&plan, &l, VOCAB).unwrap();
    let got = dev
        .sample_drawn(
            &plan,
            |draws| {
                Ok(draws
                    .iter()
                    .map(|d| {
                        let mut a = draw_row_on_host(&l[d.row * VOCAB..(d.row + 1) * VOCAB], d);
                        a.used_uniform = !a.used_uniform;
                        Some(a)
                    })
                    .collect())
            },
            |_| unreachable!("every draw answered"),
        )
        .unwrap();
    assert_ne!(got, want, "the streams moved differently");
}

#[test]
fn what_the_device_does_not_draw() {
    let base = SamplingParams::default();
    let cases = [
        SamplingParams {
            repetition_penalty: 1.2,
            ..base.clone()
        },
        SamplingParams {
            presence_penalty: 0.5,
            ..base.clone()
        },
        SamplingParams {
            min_tokens: 1,
            ..base.clone()
        },
        SamplingParams {
            constraint: Some(dcpserve_kernels::OutputConstraint::JsonObject),
            ..base.clone()
        },
    ];
    for params in cases {
        let plan = step_plan(0, &[(1, params.clone())]);
        let mut st = SeqStates::new(true);
        st.apply(&plan).unwrap();
        assert!(!st.rows_drawable(&plan), "{params:?}");
        assert!(st
            .sample_rows(&plan, &CpuBackend::new(1), &logits(1, 0), VOCAB)
            .is_err());
    }
    let plain = step_plan(0, &[(1, base)]);
    let with = |task: SampleTask| {
        let mut p = plain.clone();
        p.seqs[0].sample = Some(task);
        p
    };
    let drafts = with(SampleTask {
        logits_row: Some(0),
        draft: vec![3],
        ..Default::default()
    });
    let prompt = with(SampleTask {
        logits_row: Some(1),
        prompt_rows: Some(PromptRows {
            first_row: 0,
            first_pos: 0,
            rows: 1,
        }),
        ..Default::default()
    });
    let mut st = SeqStates::new(true);
    st.apply(&plain).unwrap();
    assert!(st.rows_drawable(&plain));
    assert!(!st.rows_drawable(&drafts));
    assert!(!st.rows_drawable(&prompt));
    // A sequence this rank does not sample for: the host path reports it.
    let unknown = step_plan(1, &[(2, SamplingParams::default())]);
    assert!(!st.rows_drawable(&unknown));
}
