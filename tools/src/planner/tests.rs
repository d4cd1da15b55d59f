//! Unit tests of the planner. Expected values are worked out by hand from the shapes
//! (or taken from the model crate's own tensor list), never from the planner's output.

use std::path::{Path, PathBuf};

use dcpserve_config::{resolve, KvSizing, ParallelConfig};
use dcpserve_kernels::dcp::KvCapacity;
use dcpserve_model::source::expected_tensors;
use dcpserve_model::ModelConfig;

use super::hardware::{Hardware, HardwareOverrides, HardwarePreset, KvBudgetRule};
use super::layouts::{candidate_layouts, check_layout, Layout};
use super::model_shape::{load_model_config, rank_params, routed_fraction_touched};
use super::plan::{plan_layouts, weight_bytes_per_rank, PlanOptions};
use super::roofline::{collective_traffic, decode_step, RankWeightBytes, StepInputs};
use super::table::thousands;
use super::workload::{kv_fraction_used, max_concurrency, Workload};
use super::{KvDtype, WeightDtype};

/// The workspace root (this crate is one folder below it).
fn root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

fn fixture(name: &str) -> ModelConfig {
    load_model_config(&root().join("fixtures").join(name).join("config.json")).unwrap()
}

fn kimi() -> ModelConfig {
    load_model_config(&root().join("examples/configs/kimi-k2-config.json")).unwrap()
}

/// KV bytes one token costs on one of `tp` ranks in `kv`, as the planner resolves it
/// (the engine's [`resolve`]).
fn kv_bytes_per_token_per_rank(cfg: &ModelConfig, tp: usize, kv: KvDtype) -> usize {
    kv_capacity_in(cfg, tp, 1, 16, 1 << 20, kv).bytes_per_token_per_rank
}

/// What `budget_per_rank` bytes hold at (tp, dcp), as the planner resolves it.
fn kv_capacity_in(
    cfg: &ModelConfig,
    tp: usize,
    dcp: usize,
    block_size: usize,
    budget_per_rank: u64,
    kv: KvDtype,
) -> KvCapacity {
    let parallel = ParallelConfig {
        tensor_parallel_size: tp,
        decode_context_parallel_size: dcp,
        cp_kv_cache_interleave_size: 1,
        ..Default::default()
    };
    let sizing = KvSizing {
        block_size,
        micro_batches: 1,
        dtype: kv.explicit().unwrap(),
        budget_per_rank,
    };
    resolve(&parallel, &cfg.kv_shape(), sizing)
        .unwrap()
        .capacity
}

fn options(weights: WeightDtype, kv: KvDtype, workload: Workload) -> PlanOptions {
    PlanOptions {
        weight_dtype: weights,
        attention_dtype: weights,
        kv_dtype: kv,
        block_size: 16,
        interleave: 1,
        max_num_seqs: 1024,
        workload,
        concurrency: None,
    }
}

/// Round figures so the roofline can be checked by hand: 1 GB/s, 1 GB/s links, no
/// latency, compute that never binds.
fn unit_hardware(ranks: usize) -> Hardware {
    let mut hw = Hardware::new(
        HardwarePreset::Cpu,
        &HardwareOverrides {
            ranks: Some(ranks),
            mem_bw_gbs: Some(1.0),
            link_bw_gbs: Some(1.0),
            peak_tflops: Some(1e9),
            collective_latency_us: Some(0.0),
            kv_cache_memory_bytes: Some(1 << 20),
            ..Default::default()
        },
    );
    hw.mem_per_rank_bytes = 1e9;
    hw
}

#[test]
fn rank_params_at_tp1_equal_the_model_crates_tensor_list() {
    for cfg in [
        fixture("tiny-llama"),
        fixture("tiny-qwen2"),
        fixture("tiny-qwen3"),
        fixture("tiny-deepseek"),
        fixture("tiny-deepseek-noq"),
        kimi(),
    ] {
        let expected: u64 = expected_tensors(&cfg)
            .iter()
            .map(|(_, shape)| shape.iter().product::<usize>() as u64)
            .sum();
        assert_eq!(
            rank_params(&cfg, 1).total(),
            expected,
            "{:?}",
            cfg.architecture
        );
    }
}

#[test]
fn kimi_k2_has_about_1t_parameters_and_32b_active() {
    // Moonshot's model card: 1T total parameters, 32B activated.
    let cfg = kimi();
    let p = rank_params(&cfg, 1);
    let total = p.total() as f64;
    assert!((1.0e12..1.05e12).contains(&total), "{total}");
    let active = total - p.routed_experts as f64 * (1.0 - 8.0 / 384.0);
    assert!((31e9..34e9).contains(&active), "{active}");
    // Routed experts by hand: 60 MoE layers × 384 experts × 3 matrices of 7168 × 2048.
    assert_eq!(p.routed_experts, 60 * 384 * 3 * 7168 * 2048);
}

#[test]
fn tensor_parallel_split_of_a_gqa_model() {
    // tiny-llama: hidden 64, 8 heads, 2 KV heads of 8, MLP 160, vocab 384, 2 layers.
    let cfg = fixture("tiny-llama");
    let p = rank_params(&cfg, 4);
    // q, o: 2 heads × 8 × 64 each; k, v: 2 KV heads over 4 ranks → one replicated head.
    assert_eq!(p.attention, 2 * (2 * 16 * 64 + 2 * 8 * 64));
    assert_eq!(p.dense_mlp, 2 * 3 * 64 * 40);
    // Embedding and head split by vocabulary (96 rows each), final norm, 2 norms per layer.
    assert_eq!(p.unquantized, 2 * 96 * 64 + 64 + 2 * 2 * 64);
}

#[test]
fn weight_formats_cost_their_bits_with_scales() {
    assert_eq!(WeightDtype::Nvfp4.bits_per_param(), 4.5);
    assert_eq!(WeightDtype::Mxfp4.bits_per_param(), 4.25);
    assert_eq!(WeightDtype::Q4_1.bits_per_param(), 5.0); // 20 bytes per 32
    assert_eq!(WeightDtype::Q8_0.bits_per_param(), 8.5); // 34 bytes per 32
    assert_eq!(WeightDtype::Bf16.bytes(1000), 2000.0);
}

#[test]
fn kimi_nvfp4_weights_per_gpu_at_tp8() {
    let cfg = kimi();
    let o = options(WeightDtype::Nvfp4, KvDtype::Fp8, Workload::fixed(1000, 0));
    let w = weight_bytes_per_rank(&cfg, 8, &o);
    // Routed experts: 60 layers × 384 × 3 × 7168 × (2048 / 8) weights at 4.5 bits.
    let routed = 60.0 * 384.0 * 3.0 * 7168.0 * 256.0 * 4.5 / 8.0;
    assert_eq!(w.routed_experts, routed);
    // The rest (attention, shared experts, dense layer, embeddings) is a few GB more.
    assert!(
        w.total > routed + 1e9 && w.total < routed + 8e9,
        "{}",
        w.total
    );
}

#[test]
fn kv_bytes_per_token_scale_from_the_engines_f32() {
    let cfg = fixture("tiny-llama");
    // 2 layers × K and V × 2 KV heads × 8 dims × 4 bytes.
    assert_eq!(kv_bytes_per_token_per_rank(&cfg, 1, KvDtype::F32), 256);
    assert_eq!(
        kv_bytes_per_token_per_rank(&cfg, 1, KvDtype::F32),
        cfg.kv_shape()
            .bytes_per_token_per_rank(1, dcpserve_kernels::KvCacheDType::F32)
    );
    assert_eq!(kv_bytes_per_token_per_rank(&cfg, 1, KvDtype::Bf16), 128);
    // tp=4 > 2 KV heads: one replicated head per rank; FP8 adds a scale byte per row.
    assert_eq!(
        kv_bytes_per_token_per_rank(&cfg, 4, KvDtype::Fp8),
        2 * 2 * (8 + 1)
    );
    // MLA: one latent row of 512 + 64 per layer, whatever tp.
    let k = kimi();
    assert_eq!(kv_bytes_per_token_per_rank(&k, 8, KvDtype::Fp8), 61 * 577);
    assert_eq!(
        kv_bytes_per_token_per_rank(&k, 8, KvDtype::Bf16),
        61 * 576 * 2
    );
}

#[test]
fn kv_capacity_in_a_narrow_format_counts_whole_blocks() {
    let cfg = fixture("tiny-llama");
    // bf16 at tp=1: 128 bytes per token, 2048 per block of 16; 100,000 bytes hold 48 blocks.
    let cap = kv_capacity_in(&cfg, 1, 1, 16, 100_000, KvDtype::Bf16);
    assert_eq!(
        (cap.num_blocks, cap.tokens_per_rank, cap.tokens_total),
        (48, 768, 768)
    );
    assert_eq!(cap.bytes_per_token_per_rank, 128);
    // tp=8, dcp=4: 128 bytes per token (f32, one replicated head), 2048 per block: 48 blocks
    // per rank, and the 4 DCP ranks hold different tokens.
    let cap = kv_capacity_in(&cfg, 8, 4, 16, 100_000, KvDtype::F32);
    assert_eq!(
        (cap.num_blocks, cap.tokens_per_rank, cap.tokens_total),
        (48, 768, 3072)
    );
}

#[test]
fn kimi_tp8_holds_a_full_latent_copy_per_gpu_and_dcp8_eight_times_the_tokens() {
    let cfg = kimi();
    let hw = Hardware::new(HardwarePreset::B200, &HardwareOverrides::default());
    let o = options(
        WeightDtype::Nvfp4,
        KvDtype::Fp8,
        Workload::fixed(67_000, 1_000),
    );
    let rows = plan_layouts(&cfg, &hw, &o);
    let get = |dcp| {
        rows.iter()
            .find(|r| r.layout == Layout { tp: 8, dcp })
            .and_then(|r| r.outcome.clone().ok())
            .unwrap()
    };
    let (tp8, dcp8) = (get(1), get(8));
    // Every GPU stores the whole 576-value latent row of every layer for each token at
    // dcp=1: its tokens are all the tokens there are.
    // (576 FP8 values and the row's scale byte.)
    assert_eq!(tp8.capacity.bytes_per_token_per_rank, 61 * 577);
    assert_eq!(tp8.capacity.tokens_total, tp8.capacity.tokens_per_rank);
    // Same memory per GPU, each GPU a different eighth of every sequence.
    assert_eq!(dcp8.capacity.tokens_per_rank, tp8.capacity.tokens_per_rank);
    assert_eq!(dcp8.capacity.tokens_total, 8 * tp8.capacity.tokens_total);
    // The budget by hand: 180 GB × 0.9 − weights − 4 GiB, in blocks of 16 × 35,197 bytes.
    let budget = 180e9 * 0.9 - tp8.weight_bytes_per_rank - 4.0 * (1u64 << 30) as f64;
    assert_eq!(
        tp8.capacity.num_blocks,
        (budget as u64 / (16 * 61 * 577)) as usize
    );
    // 68,000-token requests: 4,250 blocks each at dcp=1, 532 (of 128 tokens) at dcp=8.
    assert_eq!(tp8.max_concurrency, tp8.capacity.num_blocks / 4250);
    assert_eq!(dcp8.max_concurrency, dcp8.capacity.num_blocks / 532);
    assert!(dcp8.max_concurrency >= 7 * tp8.max_concurrency);
}

#[test]
fn max_concurrency_counts_blocks_at_the_final_length() {
    let w = Workload::fixed(100, 60);
    // 160 tokens: 10 blocks of 16, so 40 blocks hold 4; 5 blocks of 32 (dcp=2) hold 8.
    assert_eq!(max_concurrency(&w, 40, 16, 256), 4);
    assert_eq!(max_concurrency(&w, 40, 32, 256), 8);
    assert_eq!(max_concurrency(&w, 40, 32, 3), 3);
    assert_eq!(kv_fraction_used(&w, 2, 40, 16), 0.5);
    assert_eq!(kv_fraction_used(&w, 8, 40, 16), 2.0);
}

#[test]
fn synthetic_workloads_have_the_asked_shape() {
    let w = Workload::lognormal(10_000, 0.5, 100);
    let median = w.median_input() as f64;
    assert!((median / 10_000.0 - 1.0).abs() < 0.05, "{median}");
    // A log-normal's mean is median × e^(σ²/2) = 1.133 × the median.
    let mean = w.requests.iter().map(|r| r.input as f64).sum::<f64>() / w.requests.len() as f64;
    assert!((mean / 11_331.0 - 1.0).abs() < 0.05, "{mean}");
    let u = Workload::uniform(1000, 3000, 0);
    assert!((u.mean_decode_context() - 2000.0).abs() < 1.0);
    assert_eq!(Workload::fixed(500, 100).mean_decode_context(), 550.0);
}

#[test]
fn trace_lines_give_the_requests() {
    let dir = std::env::temp_dir().join(format!("dcpserve-plan-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("trace.jsonl");
    std::fs::write(
        &path,
        "{\"input_len\": 30, \"output_len\": 2}\n\n{\"prompt_tokens\": 15}\n",
    )
    .unwrap();
    let w = Workload::from_trace(&path, 1).unwrap();
    // 32 tokens = 2 blocks of 16; 16 tokens = 1 block.
    assert_eq!(w.requests.len(), 2);
    assert_eq!(w.mean_blocks(16), 1.5);
    std::fs::write(&path, "{\"output_len\": 2}\n").unwrap();
    assert!(Workload::from_trace(&path, 1).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn layouts_include_rejected_ones_with_vllms_messages() {
    let tps: Vec<(usize, usize)> = candidate_layouts(6).iter().map(|l| (l.tp, l.dcp)).collect();
    for want in [
        (1, 1),
        (2, 2),
        (3, 3),
        (6, 1),
        (6, 2),
        (6, 3),
        (6, 4),
        (6, 6),
    ] {
        assert!(tps.contains(&want), "{want:?} in {tps:?}");
    }
    let llama = fixture("tiny-llama");
    let err = |tp, dcp| check_layout(&llama, Layout { tp, dcp }, 1, 16).unwrap_err();
    assert_eq!(err(6, 4), "tp_size=6 must be divisible by dcp_size=4.");
    assert!(err(2, 2).contains("(2) to be greater than the model's total number of KV heads (2)"));
    assert!(check_layout(&llama, Layout { tp: 8, dcp: 4 }, 1, 16).is_ok());
    // MLA only needs tp % dcp == 0.
    assert!(check_layout(&kimi(), Layout { tp: 8, dcp: 8 }, 1, 16).is_ok());
}

#[test]
fn moe_steps_read_only_the_touched_experts() {
    let ds = fixture("tiny-deepseek"); // 2 of 8 experts per token
    assert_eq!(routed_fraction_touched(&ds, 1), 0.25);
    assert_eq!(routed_fraction_touched(&ds, 2), 1.0 - 0.75 * 0.75);
    assert_eq!(routed_fraction_touched(&fixture("tiny-llama"), 1), 1.0);
}

#[test]
fn roofline_of_a_memory_bound_step_by_hand() {
    let cfg = fixture("tiny-llama");
    let hw = unit_hardware(8);
    let weights = RankWeightBytes {
        total: 1e6,
        routed_experts: 0.0,
    };
    let step = |tp, dcp| {
        decode_step(
            &cfg,
            &hw,
            weights,
            &StepInputs {
                tp,
                dcp,
                batch: 4,
                mean_context: 1000.0,
                kv_bytes_per_token: 64,
            },
        )
    };
    // tp=1: 1 MB of weights + 4 × 1000 × 64 B of KV at 1 GB/s, no collectives.
    let s = step(1, 1);
    assert_eq!(s.kv_bytes, 256_000.0);
    assert_eq!(s.collective_bytes, 0.0);
    assert!((s.step_s - 1.256e-3).abs() < 1e-12);
    assert!((s.tokens_per_s_per_rank - 4.0 / 1.256e-3).abs() < 1e-6);
    // dcp=2 halves each rank's KV read.
    assert_eq!(step(4, 2).kv_bytes, 128_000.0);
}

#[test]
fn collective_bytes_by_hand() {
    let cfg = fixture("tiny-llama"); // 2 layers, hidden 64, 8 heads of 8, vocab 384
    let hw = unit_hardware(8); // f32 activations
    let at = |tp, dcp| {
        collective_traffic(
            &cfg,
            &hw,
            &StepInputs {
                tp,
                dcp,
                batch: 1,
                mean_context: 10.0,
                kv_bytes_per_token: 64,
            },
        )
    };
    // tp=2: 2 layers × 2 all-reduces × 2·(1/2) × 64 × 4 B, plus the logits' other half
    // (192 × 4 B): 1024 + 768.
    assert_eq!(at(2, 1), (1792.0, 5));
    // tp=4, dcp=2 adds per layer: Q gather 1 × 2 heads × 8 × 4 = 64, and the all-to-all
    // of the partials: 1 peer × 2 heads × (8 × 4 B of output + a 4 B LSE) = 72.
    let tp_only = 2.0 * 2.0 * 2.0 * 0.75 * 64.0 * 4.0 + 3.0 * 96.0 * 4.0;
    assert_eq!(at(4, 2), (tp_only + 2.0 * (64.0 + 72.0), 2 * 2 + 1 + 2 * 2));
}

#[test]
fn kv_budgets_follow_their_rules() {
    let mut hw = Hardware::new(
        HardwarePreset::H100,
        &HardwareOverrides {
            gpu_memory_utilization: 0.9,
            activation_reserve_gb: Some(2.0),
            ..Default::default()
        },
    );
    let gib = (1u64 << 30) as f64;
    assert_eq!(
        hw.kv_budget_per_rank(8, 10e9),
        (80e9 * 0.9 - 10e9 - 2.0 * gib) as u64
    );
    assert_eq!(hw.kv_budget_per_rank(8, 80e9), 0);
    hw.kv_budget = KvBudgetRule::CpuEngineDefault {
        mem_available_bytes: 16 << 30,
    };
    assert_eq!(hw.kv_budget_per_rank(2, 0.0), 2 << 30);
    hw.kv_budget = KvBudgetRule::CpuEngineDefault {
        mem_available_bytes: 100 << 30,
    };
    assert_eq!(hw.kv_budget_per_rank(1, 0.0), 8 << 30);
}

#[test]
fn numbers_print_with_thousands_separators() {
    assert_eq!(thousands(0), "0");
    assert_eq!(thousands(999), "999");
    assert_eq!(thousands(1000), "1,000");
    assert_eq!(thousands(18_685_824), "18,685,824");
}

#[test]
fn config_json_files_folders_and_gguf_headers_load() {
    let file = load_model_config(&root().join("fixtures/tiny-llama/config.json")).unwrap();
    let dir = load_model_config(&root().join("fixtures/tiny-llama")).unwrap();
    assert_eq!(file.hidden_size, dir.hidden_size);
    let gguf = dcpserve_config::default_model_path();
    if gguf.exists() {
        let c = load_model_config(&gguf).unwrap();
        assert_eq!((c.num_hidden_layers, c.num_key_value_heads), (30, 3));
    }
    assert!(load_model_config(Path::new("/nonexistent/config.json")).is_err());
}
