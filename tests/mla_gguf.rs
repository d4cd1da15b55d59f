//! DeepSeek GGUFs (`general.architecture = deepseek2`) written by llama.cpp's own converter
//! from the tiny DeepSeek fixtures (scripts/reference/gguf_deepseek.py; provenance in
//! fixtures/tiny-deepseek*/model.gguf.json): the configuration read from the GGUF
//! metadata, logprobs against the same transformers reference as the Hugging Face folders,
//! and the engine on the GGUF against the engine on the folder, at tp=1 and under DCP.
//!
//! Before conversion each fixture was rewritten into an equivalent checkpoint in the form
//! llama.cpp's deepseek2 assumes (and transformers checked it against the reference):
//! tiny-deepseek's YaRN cos/sin factor is folded into its rope rows (mscale :=
//! mscale_all_dim), tiny-deepseek-noq's rotate-half rope rows are permuted to pairs.

mod common;

use common::equivalence::*;
use common::reference::check_logprobs_of;
use common::*;
use dcpserve_model::config::MoeScoring;
use dcpserve_model::ModelFiles;

const FIXTURES: [&str; 2] = ["tiny-deepseek", "tiny-deepseek-noq"];

fn gguf(name: &str) -> std::path::PathBuf {
    fixture(name).join("model.gguf")
}

#[test]
fn deepseek2_gguf_config_equals_the_folder_config() {
    for name in FIXTURES {
        let hf = ModelFiles::read_config(fixture(name)).unwrap();
        let g = ModelFiles::read_config(gguf(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(g.architecture, hf.architecture, "{name}");
        let same = |a: usize, b: usize, what: &str| assert_eq!(a, b, "{name}: {what}");
        same(g.hidden_size, hf.hidden_size, "hidden_size");
        same(
            g.intermediate_size,
            hf.intermediate_size,
            "intermediate_size",
        );
        same(g.num_hidden_layers, hf.num_hidden_layers, "layers");
        same(g.num_attention_heads, hf.num_attention_heads, "heads");
        same(g.num_key_value_heads, hf.num_key_value_heads, "kv heads");
        same(g.head_dim, hf.head_dim, "head_dim");
        same(g.vocab_size, hf.vocab_size, "vocab");
        same(
            g.max_position_embeddings,
            hf.max_position_embeddings,
            "context",
        );
        assert_eq!(g.tie_word_embeddings, hf.tie_word_embeddings, "{name}");
        assert!((g.rms_norm_eps - hf.rms_norm_eps).abs() < 1e-12, "{name}");
        assert_eq!(g.rope_theta, hf.rope_theta, "{name}");
        assert_eq!(g.moe, hf.moe, "{name}: MoE settings");
        let (gm, hm) = (g.mla.unwrap(), hf.mla.unwrap());
        assert_eq!(
            (gm.q_lora_rank, gm.kv_lora_rank, gm.qk_nope_head_dim),
            (hm.q_lora_rank, hm.kv_lora_rank, hm.qk_nope_head_dim),
            "{name}"
        );
        assert_eq!(
            (gm.qk_rope_head_dim, gm.v_head_dim),
            (hm.qk_rope_head_dim, hm.v_head_dim),
            "{name}"
        );
        // llama.cpp's deepseek2 always rotates adjacent pairs.
        assert!(gm.rope_interleave, "{name}");
        match (gm.yarn, hm.yarn) {
            (None, None) => {}
            (Some(gy), Some(hy)) => {
                assert_eq!(gy.factor, hy.factor, "{name}");
                assert_eq!(
                    gy.original_max_position_embeddings,
                    hy.original_max_position_embeddings
                );
                assert_eq!((gy.beta_fast, gy.beta_slow), (hy.beta_fast, hy.beta_slow));
                // yarn_log_multiplier = 0.1 · mscale_all_dim, and mscale == mscale_all_dim.
                let all = hy.mscale_all_dim.unwrap();
                for m in [gy.mscale_all_dim, gy.mscale] {
                    assert!((m.unwrap() - all).abs() < 1e-6, "{name}: {m:?} vs {all}");
                }
            }
            other => panic!("{name}: yarn differs: {other:?}"),
        }
    }
    // Spot values, so that the comparison above cannot pass on two equal misreadings.
    let g = ModelFiles::read_config(gguf("tiny-deepseek")).unwrap();
    let moe = g.moe.unwrap();
    assert_eq!(moe.scoring, MoeScoring::Sigmoid);
    assert_eq!(
        (moe.n_routed_experts, moe.n_group, moe.topk_group),
        (8, 2, 1)
    );
    assert!(moe.correction_bias && moe.norm_topk_prob);
    assert_eq!(moe.routed_scaling_factor, 2.5);
    assert_eq!(g.mla.unwrap().latent_dim(), 40);
}

#[test]
fn deepseek2_gguf_matches_transformers() {
    for name in FIXTURES {
        let worst = check_logprobs_of(name, &gguf(name));
        eprintln!("{name} GGUF vs transformers: max |Δ logprob| {worst:.2e}");
    }
}

/// The engine on the GGUF equals the engine on the Hugging Face folder (within the layout
/// tolerance, 1e-4), single-rank and with the latent cache sharded by DCP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deepseek2_gguf_equals_folder_load_at_every_layout() {
    let prompts = prompts(384, 300);
    for name in FIXTURES {
        let base = run(
            &fixture(name),
            cfg(layout(1, 1, 1), 128, 16 << 20),
            &prompts,
            6,
        )
        .await;
        for (tp, dcp, i) in [(1, 1, 1), (2, 2, 1), (4, 2, 2)] {
            let got = run(
                &gguf(name),
                cfg(layout(tp, dcp, i), 128, 16 << 20),
                &prompts,
                6,
            )
            .await;
            assert_same(&base, &got, &format!("{name} GGUF tp={tp} dcp={dcp} I={i}"));
        }
    }
}
