//! Decode steps replayed from device graphs against the same steps launched one by
//! one: a replayed graph holds exactly the launches the step would make, so the logits
//! must be bit-identical, step after step, while batch sizes and context buckets
//! change (new graphs are captured) and stay (graphs are replayed).

use std::path::Path;

use anyhow::{Context, Result};
use dcpserve_kernels::{Backend, KvCacheDType};
use dcpserve_model::arch::{BatchInput, DecoderModel, ForwardOptions, RankComms, WeightPrecision};
use dcpserve_model::ModelFiles;

/// Tokens per KV block of the check.
const BLOCK: usize = 16;
/// Prompt lengths of the check's sequences: the 600-token one makes attention split its
/// keys (partials in scratch, then the LSE merge) inside the graphs.
const PROMPTS: [usize; 4] = [5, 17, 600, 2];
/// Decode steps: all sequences for the first half, one fewer after.
const STEPS: usize = 40;

/// Every step's logits, row-major `[sequences, vocab]`.
type Logits = Vec<Vec<f32>>;

/// The sequences' state: tokens so far and block tables.
struct Seqs {
    tokens: Vec<Vec<u32>>,
    tables: Vec<Vec<u32>>,
    next_block: u32,
}

impl Seqs {
    /// The slot of position `pos` of sequence `s`, growing its table when needed.
    fn slot(&mut self, s: usize, pos: usize) -> usize {
        while self.tables[s].len() * BLOCK <= pos {
            self.tables[s].push(self.next_block);
            self.next_block += 1;
        }
        self.tables[s][pos / BLOCK] as usize * BLOCK + pos % BLOCK
    }
}

/// A token id for sequence `s` at position `pos` that does not depend on the logits
/// (both runs feed the same tokens whatever they compute), avoiding ids 0..3.
fn token(vocab: usize, s: usize, pos: usize) -> u32 {
    ((s * 7919 + pos * 131) % (vocab - 3) + 3) as u32
}

/// Prefills every prompt, then runs [`STEPS`] decode steps over the sequences still
/// active; returns every decode step's logits.
fn decode_run<B: Backend>(model: &DecoderModel<B>) -> Result<Logits> {
    let dev = model.backend();
    let vocab = model.shell.config.vocab_size;
    let blocks = PROMPTS.iter().map(|p| (p + STEPS).div_ceil(BLOCK)).sum();
    let mut cache = model.new_kv_cache(blocks, BLOCK, KvCacheDType::BF16)?;
    let mut seqs = Seqs {
        tokens: PROMPTS
            .iter()
            .enumerate()
            .map(|(s, &n)| (0..n).map(|p| token(vocab, s, p)).collect())
            .collect(),
        tables: vec![Vec::new(); PROMPTS.len()],
        next_block: 0,
    };
    for s in 0..PROMPTS.len() {
        let ids = seqs.tokens[s].clone();
        let n = ids.len();
        let positions: Vec<usize> = (0..n).collect();
        let slots: Vec<usize> = positions.iter().map(|&p| seqs.slot(s, p)).collect();
        let kv_lens: Vec<u32> = (1..=n as u32).collect();
        let table = seqs.tables[s].clone();
        dev.begin_step()?;
        model.forward(
            &RankComms::single(),
            &BatchInput {
                tokens: &ids,
                positions: &positions,
                token_seq: &vec![0; n],
                slots: &slots,
                kv_lens: &kv_lens,
                block_tables: &[table.as_slice()],
                logits_for: &[n - 1],
            },
            &mut cache,
            &ForwardOptions::default(),
        )?;
    }
    let mut out = Vec::new();
    for step in 0..STEPS {
        let active = if step < STEPS / 2 {
            PROMPTS.len()
        } else {
            PROMPTS.len() - 1
        };
        let mut ids = Vec::new();
        let mut positions = Vec::new();
        let mut slots = Vec::new();
        for s in 0..active {
            let pos = seqs.tokens[s].len();
            let t = token(vocab, s, pos);
            seqs.tokens[s].push(t);
            ids.push(t);
            positions.push(pos);
            slots.push(seqs.slot(s, pos));
        }
        let kv_lens: Vec<u32> = positions.iter().map(|&p| p as u32 + 1).collect();
        let tables: Vec<&[u32]> = seqs.tables[..active].iter().map(Vec::as_slice).collect();
        let token_seq: Vec<u32> = (0..active as u32).collect();
        let rows: Vec<usize> = (0..active).collect();
        dev.begin_step()?;
        let o = model.forward(
            &RankComms::single(),
            &BatchInput {
                tokens: &ids,
                positions: &positions,
                token_seq: &token_seq,
                slots: &slots,
                kv_lens: &kv_lens,
                block_tables: &tables,
                logits_for: &rows,
            },
            &mut cache,
            &ForwardOptions::default(),
        )?;
        let mut host = vec![0.0; active * vocab];
        dev.download(dev.view(&o.logits, 0..active * vocab)?, &mut host)?;
        out.push(host);
    }
    Ok(out)
}

/// Loads the dense `fixture` on `with_graphs` and `eager` (the same device, graphs on
/// and off), runs the decode steps on both and compares their logits bit for bit;
/// `stats` describes how `with_graphs` ran its steps. Returns the report lines and
/// whether the logits were identical (and, when `must_replay`, graphs were replayed:
/// `stats` returns the replayed count).
pub fn report<B: Backend>(
    fixture: &Path,
    with_graphs: B,
    eager: B,
    stats: &dyn Fn(&B) -> (u64, String),
    must_replay: bool,
) -> Result<(String, bool)> {
    let files =
        ModelFiles::open(fixture).with_context(|| format!("opening {}", fixture.display()))?;
    let load = |dev: B| {
        DecoderModel::load(
            dev,
            files.config.clone(),
            files.tensors.as_ref(),
            WeightPrecision::BF16,
        )
        .with_context(|| format!("loading {}", fixture.display()))
    };
    let graphed = load(with_graphs)?;
    let plain = load(eager)?;
    let got = decode_run(&graphed)?;
    let want = decode_run(&plain)?;
    let mut differing = 0;
    let mut worst = 0.0f32;
    for (g, w) in got.iter().zip(&want) {
        let bits_differ =
            g.len() != w.len() || g.iter().zip(w).any(|(a, b)| a.to_bits() != b.to_bits());
        if bits_differ {
            differing += 1;
            for (a, b) in g.iter().zip(w) {
                worst = worst.max((a - b).abs());
            }
        }
    }
    let (replayed, line) = stats(graphed.backend());
    let passed = differing == 0 && got.len() == STEPS && (!must_replay || replayed > 0);
    let body = format!(
        "{} decode steps ({} then {} sequences, contexts {}..{}): {} step(s) with logits \
         differing from eager launches (max |Δ| {:.2e})  {}\n{}\n",
        STEPS,
        PROMPTS.len(),
        PROMPTS.len() - 1,
        PROMPTS.iter().min().unwrap_or(&0),
        PROMPTS.iter().max().unwrap_or(&0) + STEPS,
        differing,
        worst,
        if passed { "ok" } else { "FAILED" },
        line
    );
    Ok((body, passed))
}
