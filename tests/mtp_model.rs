//! The DeepSeek-V3 multi-token-prediction layer on one rank against the torch reference of
//! scripts/make_mtp_reference.py (fixtures/tiny-deepseek-mtp): the draft logprobs at every
//! position, computed over a paged, shuffled latent cache in chunks, and one chained draft.

mod common;

use common::{fixture, floats, ids, read_json};
use std::sync::Arc;

use dcpserve_actors::placement::Placement;
use dcpserve_actors::plan::{LocalBatch, StepBatch};
use dcpserve_kernels::{log_softmax, CpuBackend, HostCollectives, InProcessComm, KvCacheDType};
use dcpserve_model::arch::mla::{LatentCache, MlaModel, MtpLayer};
use dcpserve_model::arch::{
    BatchInput, ForwardOptions, ForwardOutput, RankComms, RankModel, TpShard, WeightPrecision,
};
use dcpserve_model::ModelFiles;

const MODEL: &str = "tiny-deepseek-mtp";
const BLOCK: usize = 4;

fn load(name: &str) -> (ModelFiles, MlaModel) {
    let files = ModelFiles::open(fixture(name)).unwrap();
    let model = RankModel::load(
        CpuBackend::new(2),
        files.config.clone(),
        files.tensors.as_ref(),
        WeightPrecision::F32,
    )
    .unwrap();
    let RankModel::Mla(model) = model else {
        panic!("{name} is not an MLA model")
    };
    (files, *model)
}

/// A block table covering `len` positions (reversed, odd blocks of a cache of twice as
/// many), and each position's slot.
fn paging(len: usize) -> (Vec<u32>, Vec<usize>) {
    let n_blocks = len.div_ceil(BLOCK) as u32;
    let table: Vec<u32> = (0..n_blocks).map(|b| (n_blocks - 1 - b) * 2 + 1).collect();
    let slots = (0..len)
        .map(|p| table[p / BLOCK] as usize * BLOCK + p % BLOCK)
        .collect();
    (table, slots)
}

/// What one chunk of rows runs with: tokens, positions `start..end`, their slots.
struct Rows<'a> {
    tokens: &'a [u32],
    start: usize,
    table: &'a [u32],
    slots: &'a [usize],
}

impl Rows<'_> {
    fn with_input<R>(&self, f: impl FnOnce(&BatchInput) -> R) -> R {
        let n = self.tokens.len();
        let positions: Vec<usize> = (self.start..self.start + n).collect();
        let kv_lens: Vec<u32> = positions.iter().map(|&p| p as u32 + 1).collect();
        let token_seq = vec![0u32; n];
        let tables = [self.table];
        let logits_for: Vec<usize> = (0..n).collect();
        f(&BatchInput {
            tokens: self.tokens,
            positions: &positions,
            token_seq: &token_seq,
            slots: &self.slots[self.start..self.start + n],
            kv_lens: &kv_lens,
            block_tables: &tables,
            logits_for: &logits_for,
        })
    }
}

fn rows_logprobs(logits: &[f32], vocab: usize) -> Vec<Vec<f32>> {
    logits.chunks(vocab).map(log_softmax).collect()
}

fn max_delta(want: &serde_json::Value, got: &[f32]) -> f32 {
    floats(want)
        .iter()
        .zip(got)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max)
}

/// The model's step over `input`, with the final-normed hidden states of `hidden_for`.
fn forward_hidden(
    model: &MlaModel,
    comms: &RankComms,
    input: &BatchInput,
    cache: &mut LatentCache,
    hidden_for: &[usize],
) -> (ForwardOutput, Vec<f32>) {
    let opts = ForwardOptions {
        hidden_for,
        ..Default::default()
    };
    let mut out = model.forward(comms, input, cache, &opts).unwrap();
    let hidden = out.hidden.take().unwrap_or_default();
    (out, hidden)
}

/// The MTP layer's step over `input` (`prev_hidden`: the previous hidden states), with
/// its output hidden states.
fn forward_mtp(
    model: &MlaModel,
    comms: &RankComms,
    input: &BatchInput,
    prev_hidden: &[f32],
    cache: &mut LatentCache,
) -> (ForwardOutput, Vec<f32>) {
    let opts = ForwardOptions {
        mtp_prev_hidden: Some(prev_hidden),
        ..Default::default()
    };
    let mut out = model.forward(comms, input, cache, &opts).unwrap();
    let hidden = out
        .hidden
        .take()
        .expect("an MTP step returns its hidden states");
    (out, hidden)
}

/// The main model over the prompt in chunks: (logprobs, final-normed hidden states).
fn main_pass(
    model: &MlaModel,
    cache: &mut LatentCache,
    ids: &[u32],
    paging: &(Vec<u32>, Vec<usize>),
    chunk: usize,
) -> (Vec<Vec<f32>>, Vec<f32>) {
    let comms = RankComms::single();
    let (mut lps, mut hidden) = (Vec::new(), Vec::new());
    for start in (0..ids.len()).step_by(chunk) {
        let end = (start + chunk).min(ids.len());
        let rows = Rows {
            tokens: &ids[start..end],
            start,
            table: &paging.0,
            slots: &paging.1,
        };
        let all: Vec<usize> = (0..end - start).collect();
        let (out, h) = rows.with_input(|input| forward_hidden(model, &comms, input, cache, &all));
        lps.extend(rows_logprobs(&out.logits, out.vocab_size));
        hidden.extend(h);
    }
    (lps, hidden)
}

/// The MTP layer over positions `0..tokens.len()` in chunks: (draft logprobs, MTP outputs).
fn mtp_pass(
    model: &MlaModel,
    cache: &mut LatentCache,
    tokens: &[u32],
    prev_hidden: &[f32],
    paging: &(Vec<u32>, Vec<usize>),
    chunk: usize,
) -> (Vec<Vec<f32>>, Vec<f32>) {
    let comms = RankComms::single();
    let h = model.shell.config.hidden_size;
    let (mut lps, mut ys) = (Vec::new(), Vec::new());
    for start in (0..tokens.len()).step_by(chunk) {
        let end = (start + chunk).min(tokens.len());
        let rows = Rows {
            tokens: &tokens[start..end],
            start,
            table: &paging.0,
            slots: &paging.1,
        };
        let (out, y) = rows.with_input(|input| {
            forward_mtp(
                model,
                &comms,
                input,
                &prev_hidden[start * h..end * h],
                cache,
            )
        });
        lps.extend(rows_logprobs(&out.logits, out.vocab_size));
        ys.extend(y);
    }
    (lps, ys)
}

#[test]
fn mtp_layer_matches_the_torch_reference() {
    let (files, mut model) = load(MODEL);
    assert!(MtpLayer::present(&files.config, files.tensors.as_ref()));
    model
        .load_mtp(files.tensors.as_ref(), WeightPrecision::F32)
        .unwrap();
    assert_eq!(
        model.cache_layers(),
        model.shell.config.num_hidden_layers + 1
    );
    let h = model.shell.config.hidden_size;
    let reference = read_json(fixture(MODEL).join("reference.json"));
    for prompt in reference["prompts"].as_array().unwrap() {
        let name = prompt["name"].as_str().unwrap();
        let ids = ids(&prompt["ids"]);
        let n = ids.len();
        let positions = ids_usize(&prompt["mtp_positions"]);
        for chunk in [n, 7] {
            let paging = paging(n + 1);
            let mut cache = model
                .new_kv_cache(paging.0.len() * 2, BLOCK, KvCacheDType::F32)
                .unwrap();
            let (main_lp, hidden) = main_pass(&model, &mut cache, &ids, &paging, chunk);
            let worst_main = positions
                .iter()
                .zip(prompt["main_logprobs"].as_array().unwrap())
                .map(|(&p, row)| max_delta(row, &main_lp[p]))
                .fold(0.0, f32::max);
            assert!(worst_main <= 1e-3, "{name}: main |Δ| {worst_main}");

            // Draft at position i: the token after it and the main hidden state at i.
            let (lp, ys) = mtp_pass(
                &model,
                &mut cache,
                &ids[1..],
                &hidden[..(n - 1) * h],
                &paging,
                chunk,
            );
            let worst = positions
                .iter()
                .zip(prompt["mtp_logprobs"].as_array().unwrap())
                .map(|(&p, row)| max_delta(row, &lp[p]))
                .fold(0.0, f32::max);
            eprintln!(
                "{name} chunk {chunk}: MTP max |Δ logprob| {worst:.2e} (main {worst_main:.2e})"
            );
            assert!(worst <= 1e-3, "{name} chunk {chunk}: MTP |Δ| {worst}");

            // The chained second draft at position `after`, over MTP latents of 0..after.
            let chain = &prompt["chain"];
            let c = chain["after"].as_u64().unwrap() as usize;
            let d1 = chain["first_draft"].as_u64().unwrap() as u32;
            let argmax = (0..lp[c - 1].len())
                .max_by(|&a, &b| lp[c - 1][a].total_cmp(&lp[c - 1][b]))
                .unwrap();
            assert_eq!(argmax as u32, d1, "{name}: first draft");
            let mut fresh = model
                .new_kv_cache(paging.0.len() * 2, BLOCK, KvCacheDType::F32)
                .unwrap();
            let _ = mtp_pass(
                &model,
                &mut fresh,
                &ids[1..=c],
                &hidden[..c * h],
                &paging,
                c,
            );
            let rows = Rows {
                tokens: &[d1],
                start: c,
                table: &paging.0,
                slots: &paging.1,
            };
            let (out, _) = rows.with_input(|input| {
                let prev = &ys[(c - 1) * h..c * h];
                forward_mtp(&model, &RankComms::single(), input, prev, &mut fresh)
            });
            let worst = max_delta(&chain["logprobs"], &log_softmax(&out.logits));
            eprintln!("{name} chunk {chunk}: chained draft max |Δ logprob| {worst:.2e}");
            assert!(worst <= 1e-3, "{name}: chained |Δ| {worst}");
        }
    }
}

/// A checkpoint without MTP tensors (tiny-deepseek's config still declares
/// `num_nextn_predict_layers: 1`, as transformers writes it) refuses to load one.
#[test]
fn model_without_mtp_weights_refuses_to_load_one() {
    let (files, mut model) = load("tiny-deepseek");
    assert!(!MtpLayer::present(&files.config, files.tensors.as_ref()));
    let err = model
        .load_mtp(files.tensors.as_ref(), WeightPrecision::F32)
        .expect_err("no MTP layer to load");
    assert!(
        err.to_string().contains("no multi-token-prediction layer"),
        "{err}"
    );
    assert_eq!(model.cache_layers(), model.shell.config.num_hidden_layers);
}

/// One rank of a `tp`-rank group (DCP groups of `dcp`, interleave `i`, block size 16) runs
/// the long prompt through the main model and then the MTP layer over every position, both
/// in chunks, as the rank actors would from step plans. Returns the main and MTP logprobs
/// at `rows`.
#[allow(clippy::too_many_arguments)]
fn rank_pass(
    files: &ModelFiles,
    (rank, tp, dcp, i): (usize, usize, usize, usize),
    comms: RankComms,
    ids: &[u32],
    rows: &[usize],
    chunk: usize,
) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let block = 16;
    let mut model = MlaModel::load_shard(
        CpuBackend::new(1),
        files.config.clone(),
        files.tensors.as_ref(),
        WeightPrecision::F32,
        TpShard { rank, size: tp },
    )
    .unwrap();
    model
        .load_mtp(files.tensors.as_ref(), WeightPrecision::F32)
        .unwrap();
    let placement = Placement {
        block_size: block,
        dcp_size: dcp,
        interleave: i,
        dcp_rank: rank % dcp,
    };
    let n_blocks = ids.len().div_ceil(block * dcp) as u32;
    let table: Vec<u32> = (0..n_blocks).map(|b| (n_blocks - 1 - b) * 2 + 1).collect();
    let mut cache = model
        .new_kv_cache(2 * n_blocks as usize, block, KvCacheDType::F32)
        .unwrap();
    let h = model.shell.config.hidden_size;
    let plan = |tokens: &[u32], start: usize| StepBatch {
        step_id: 0,
        tokens: tokens.to_vec(),
        positions: (start..start + tokens.len()).collect(),
        token_seq: vec![0; tokens.len()],
        block_tables: vec![table.clone()],
        logits_for: (0..tokens.len()).collect(),
        ..Default::default()
    };
    let tables = [table.as_slice()];
    let (mut main, mut hidden) = (Vec::new(), Vec::new());
    for start in (0..ids.len()).step_by(chunk) {
        let p = plan(&ids[start..(start + chunk).min(ids.len())], start);
        let local = LocalBatch::new(&p, &placement);
        let input = local.input(&p, &tables);
        let (out, hid) = forward_hidden(&model, &comms, &input, &mut cache, &p.logits_for);
        main.extend(rows_logprobs(&out.logits, out.vocab_size));
        hidden.extend(hid);
    }
    let mut mtp = Vec::new();
    let next = &ids[1..];
    for start in (0..next.len()).step_by(chunk) {
        let end = (start + chunk).min(next.len());
        let p = plan(&next[start..end], start);
        let local = LocalBatch::new(&p, &placement);
        let input = local.input(&p, &tables);
        let (out, _) = forward_mtp(
            &model,
            &comms,
            &input,
            &hidden[start * h..end * h],
            &mut cache,
        );
        mtp.extend(rows_logprobs(&out.logits, out.vocab_size));
    }
    let pick = |v: &[Vec<f32>]| rows.iter().map(|&r| v[r].clone()).collect::<Vec<_>>();
    (pick(&main), pick(&mtp))
}

/// The MTP layer split over tensor-parallel ranks, its latents sharded by DCP (interleave
/// 1, 2 and the block size), equals the torch reference on every rank.
#[test]
fn mtp_layer_sharded_matches_the_torch_reference() {
    let files = ModelFiles::open(fixture(MODEL)).unwrap();
    let reference = read_json(fixture(MODEL).join("reference.json"));
    let prompt = &reference["prompts"].as_array().unwrap()[1];
    assert_eq!(prompt["name"], "long");
    let ids = ids(&prompt["ids"]);
    let rows = ids_usize(&prompt["mtp_positions"]);
    for (tp, dcp, i) in [(2, 1, 1), (2, 2, 1), (4, 2, 2), (4, 4, 1), (4, 4, 16)] {
        let world = InProcessComm::group(tp);
        let mut dcps: Vec<InProcessComm> = (0..tp / dcp)
            .flat_map(|_| InProcessComm::group(dcp))
            .collect();
        let comms: Vec<RankComms> = world
            .into_iter()
            .map(|w| RankComms {
                world: Arc::new(HostCollectives::new(Arc::new(w))),
                dcp: Arc::new(HostCollectives::new(Arc::new(dcps.remove(0)))),
                dcp_merge: Default::default(),
                split: dcpserve_kernels::dcp::PrefillSplit::single(),
            })
            .collect();
        let results: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = comms
                .into_iter()
                .enumerate()
                .map(|(rank, c)| {
                    let (files, ids, rows) = (&files, &ids, &rows);
                    s.spawn(move || rank_pass(files, (rank, tp, dcp, i), c, ids, rows, 64))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (rank, (main, mtp)) in results.iter().enumerate() {
            let worst = |want: &serde_json::Value, got: &[Vec<f32>]| {
                want.as_array()
                    .unwrap()
                    .iter()
                    .zip(got)
                    .map(|(w, g)| max_delta(w, g))
                    .fold(0.0, f32::max)
            };
            let (wm, wt) = (
                worst(&prompt["main_logprobs"], main),
                worst(&prompt["mtp_logprobs"], mtp),
            );
            eprintln!("tp={tp} dcp={dcp} I={i} rank {rank}: main {wm:.2e}, MTP {wt:.2e}");
            assert!(
                wm <= 1e-3 && wt <= 1e-3,
                "tp={tp} dcp={dcp} I={i} rank {rank}: main {wm}, MTP {wt}"
            );
        }
    }
}

fn ids_usize(v: &serde_json::Value) -> Vec<usize> {
    ids(v).into_iter().map(|x| x as usize).collect()
}
