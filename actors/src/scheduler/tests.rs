//! The scheduler against the real KV-block manager and a stand-in rank that records
//! plans and answers only when told, so the order of events is fixed.

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::mpsc;

use super::*;
use crate::kv_manager_actor::{KvManagerActor, KvManagerArgs};
use crate::plan::SharedPlan;
use crate::plan::StepResult;
use dcpserve_kernels::SamplingParams;

/// A rank that forwards the plans it receives.
struct RecordingRank;

impl Actor for RecordingRank {
    type Msg = RankMsg;
    type State = mpsc::UnboundedSender<SharedPlan>;
    type Arguments = mpsc::UnboundedSender<SharedPlan>;

    async fn pre_start(
        &self,
        _myself: ActorRef<RankMsg>,
        plans: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(plans)
    }

    async fn handle(
        &self,
        _myself: ActorRef<RankMsg>,
        msg: RankMsg,
        plans: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        if let RankMsg::Execute(plan) = msg {
            let _ = plans.send(plan);
        }
        Ok(())
    }
}

const BLOCKS: usize = 8;

async fn setup(
    overlap: bool,
) -> (
    ActorRef<SchedulerMsg>,
    mpsc::UnboundedReceiver<SharedPlan>,
    Vec<mpsc::UnboundedReceiver<RequestEvent>>,
) {
    let (kv, _) = Actor::spawn(
        None,
        KvManagerActor,
        KvManagerArgs {
            num_blocks: BLOCKS,
            tokens_per_block: 4,
            enable_prefix_caching: false,
        },
    )
    .await
    .unwrap();
    let config = SchedulerConfig {
        tokens_per_block: 4,
        num_blocks: BLOCKS,
        max_num_seqs: 8,
        max_num_batched_tokens: 64,
        max_model_len: 32,
        eos_token_ids: Vec::new(),
        seed: 0,
        enable_prefix_caching: false,
        overlap_micro_batches: overlap,
        speculation: None,
        serialize_plans: false,
    };
    let (sched, _) = Actor::spawn(
        None,
        Scheduler,
        SchedulerArgs {
            config,
            reports: mpsc::unbounded_channel().1,
            kv,
            draft: None,
        },
    )
    .await
    .unwrap();
    let (tx, plans) = mpsc::unbounded_channel();
    let (rank, _) = Actor::spawn(None, RecordingRank, tx).await.unwrap();
    sched
        .send_message(SchedulerMsg::SetRanks(0, vec![rank]))
        .unwrap();
    let mut events = Vec::new();
    for id in [1, 2] {
        let (etx, erx) = mpsc::unbounded_channel();
        let request = GenerationRequest {
            id,
            prompt_ids: vec![3, 4, 5, 6, 7],
            params: SamplingParams {
                max_tokens: 8,
                ..Default::default()
            },
        };
        sched
            .send_message(SchedulerMsg::Submit {
                request,
                events: etx,
            })
            .unwrap();
        events.push(erx);
    }
    (sched, plans, events)
}

async fn free_blocks(sched: &ActorRef<SchedulerMsg>) -> usize {
    ractor::call!(sched, SchedulerMsg::Stats)
        .unwrap()
        .free_blocks
}

#[tokio::test]
async fn an_abort_during_an_overlapped_step_frees_its_blocks_when_the_step_ends() {
    let (sched, mut plans, _events) = setup(true).await;
    // One step per micro-batch is in flight, one sequence (2 blocks of 4) in each.
    let first = plans.recv().await.unwrap();
    let second = plans.recv().await.unwrap();
    assert_eq!((first.micro_batch, second.micro_batch), (0, 1));
    assert_eq!(free_blocks(&sched).await, BLOCKS - 4);
    let aborted = first.seqs[0].id;
    sched.send_message(SchedulerMsg::Abort(aborted)).unwrap();
    // The ranks may still be writing its blocks: the other micro-batch must not get them.
    assert_eq!(free_blocks(&sched).await, BLOCKS - 4);
    sched
        .send_message(SchedulerMsg::StepDone(Box::new(StepOutput {
            step_id: first.step_id,
            result: StepResult::Sampled(Vec::new()),
        })))
        .unwrap();
    assert_eq!(free_blocks(&sched).await, BLOCKS - 2);
}

#[tokio::test]
async fn an_abort_frees_blocks_at_once_one_step_at_a_time() {
    let (sched, mut plans, _events) = setup(false).await;
    // The first request's step is in flight; the second waits for it.
    let first = plans.recv().await.unwrap();
    assert_eq!(first.seqs.iter().map(|s| s.id).collect::<Vec<_>>(), vec![1]);
    assert_eq!(free_blocks(&sched).await, BLOCKS - 2);
    sched.send_message(SchedulerMsg::Abort(1)).unwrap();
    assert_eq!(free_blocks(&sched).await, BLOCKS);
}

/// What rank 0 would answer for `plan`: token `token` for every sequence that samples.
fn answer(plan: &crate::plan::StepPlan, token: u32) -> SchedulerMsg {
    let sampled = plan
        .seqs
        .iter()
        .filter(|s| s.sample.as_ref().is_some_and(|t| t.logits_row.is_some()))
        .map(|s| crate::plan::SeqSampled {
            id: s.id,
            tokens: vec![TokenOutput {
                token_id: token,
                logprob: None,
                top_logprobs: Vec::new(),
                prompt_logprobs: None,
            }],
            accepted: 0,
            prompt_logprobs: Vec::new(),
            rng: dcpserve_kernels::Rng::new(s.id),
        })
        .collect();
    SchedulerMsg::StepDone(Box::new(StepOutput {
        step_id: plan.step_id,
        result: StepResult::Sampled(sampled),
    }))
}

#[tokio::test]
async fn a_sequence_is_sent_whole_once_then_as_diffs() {
    use crate::plan::{CachedSeq, SeqUpdate};
    let (sched, mut plans, _events) = setup(false).await;
    let first = plans.recv().await.unwrap();
    // Five prompt tokens and room for the next: two blocks of four, with the sampler.
    let SeqUpdate::New(new) = &first.seqs[0].update else {
        panic!("first step of a request must carry it whole: {first:?}");
    };
    assert_eq!(new.block_table.len(), 2);
    let init = new
        .sampler
        .as_ref()
        .expect("the sampling rank needs the sampler");
    assert_eq!(init.tokens, vec![3, 4, 5, 6, 7]);
    assert_eq!(init.params.max_tokens, 8);
    sched.send_message(answer(&first, 9)).unwrap();

    // Request 1 decodes within its blocks (a diff with nothing new); request 2 is new.
    let second = plans.recv().await.unwrap();
    let ids: Vec<u64> = second.seqs.iter().map(|s| s.id).collect();
    assert_eq!(ids, vec![1, 2]);
    assert_eq!(
        second.seqs[0].update,
        SeqUpdate::Cached(CachedSeq {
            kept_blocks: 2,
            new_blocks: Vec::new(),
        })
    );
    assert!(matches!(second.seqs[1].update, SeqUpdate::New(_)));
    assert_eq!(second.tokens[0], 9, "the sampled token is fed back");
    assert!(second.finished.is_empty());

    // Request 1 crosses into a third block at position 8: only that block travels.
    let mut plan = second;
    let mut token = 10;
    let crossing = loop {
        sched.send_message(answer(&plan, token)).unwrap();
        token += 1;
        plan = plans.recv().await.unwrap();
        let SeqUpdate::Cached(diff) = &plan.seqs[0].update else {
            panic!("a running sequence travels as a diff: {plan:?}");
        };
        if plan.positions[0] < 8 {
            assert!(diff.new_blocks.is_empty(), "{plan:?}");
            continue;
        }
        assert_eq!((diff.kept_blocks, diff.new_blocks.len()), (2, 1));
        break plan;
    };
    assert_eq!(crossing.positions[0], 8);

    // An abort reaches the ranks with the next plan of the sequence's micro-batch.
    sched.send_message(SchedulerMsg::Abort(2)).unwrap();
    sched.send_message(answer(&crossing, token)).unwrap();
    let next = plans.recv().await.unwrap();
    assert_eq!(next.finished, vec![2]);
    assert_eq!(next.seqs.iter().map(|s| s.id).collect::<Vec<_>>(), vec![1]);
}

#[tokio::test]
async fn sequences_report_their_kv_and_generated_tokens_count() {
    let (sched, mut plans, _events) = setup(false).await;
    let first = plans.recv().await.unwrap();
    // Request 1 is being computed (its blocks allocated, no KV stored yet); 2 waits.
    let seqs = ractor::call!(sched, SchedulerMsg::Sequences).unwrap();
    let kv = |id, running, output_tokens, kv_tokens, kv_blocks| SequenceKv {
        id,
        running,
        prompt_tokens: 5,
        output_tokens,
        kv_tokens,
        kv_blocks,
    };
    assert_eq!(seqs, vec![kv(1, true, 0, 0, 2), kv(2, false, 0, 0, 0)]);
    sched.send_message(answer(&first, 9)).unwrap();
    let _second = plans.recv().await.unwrap();
    // Its prompt's KV is stored and one token was generated; 2 is admitted beside it.
    let seqs = ractor::call!(sched, SchedulerMsg::Sequences).unwrap();
    assert_eq!(seqs, vec![kv(1, true, 1, 5, 2), kv(2, true, 0, 0, 2)]);
    let stats = ractor::call!(sched, SchedulerMsg::Stats).unwrap();
    assert_eq!(stats.generated_tokens, 1);
}
