//! `dcpserve gpu-check`: its dry run on the CPU backend (every check's code path, the
//! report it writes) and its refusal of a device this machine does not have.

use std::process::Command;

#[path = "../../tests/common/mod.rs"]
mod common;

/// A fresh report folder for one test.
fn report_dir(name: &str) -> std::path::PathBuf {
    let dir =
        std::env::temp_dir().join(format!("dcpserve-gpu-check-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn gpu_check(device: &str, report: &std::path::Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_dcpserve"))
        .args(["gpu-check", "--device", device, "--report"])
        .arg(report)
        .arg("--fixtures")
        .arg(common::repo_root().join("fixtures"))
        .args(["--contexts", "1024,2048", "--copy-mib", "16"])
        .output()
        .expect("run dcpserve")
}

#[test]
fn the_dry_run_on_the_cpu_writes_a_passing_report() {
    let dir = report_dir("cpu");
    let out = gpu_check("cpu", &dir);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "gpu-check failed: {stderr}");
    let report = std::fs::read_to_string(dir.join("gpu-check.txt")).unwrap();
    for section in [
        "## ops against the CPU backend (random inputs) — passed",
        "## decode attention bandwidth — passed",
        "## engine on the fixtures against the CPU engine at one rank — passed",
        "paged_attention out (bfloat16)",
        "latent_attention out (fp8_e4m3)",
        "decode attention, 1 sequence of 2048 tokens",
        "tiny-deepseek tp=4 dcp=4 I=1 Float32",
        "tiny-llama tp=4 dcp=2 I=16 Bfloat16",
        // Two micro-batches per rank (one CUDA stream each on a GPU).
        "tiny-llama tp=4 dcp=2 I=16 Float32 2mb",
        "tiny-deepseek tp=2 dcp=2 I=1 Float32 2mb",
        // Graph replay against eager launches (both eager on the CPU: the code path).
        "## decode steps from CUDA graphs against eager launches — passed",
        "40 decode steps (4 then 3 sequences, contexts 2..640): 0 step(s) with logits differing",
    ] {
        assert!(
            report.contains(section),
            "missing {section:?} in:\n{report}"
        );
    }
    assert!(!report.contains("FAILED"), "{report}");
}

#[test]
fn cuda_without_a_driver_fails_with_a_message_and_no_panic() {
    if std::path::Path::new("/dev/nvidia0").exists() {
        eprintln!("skipped: this machine has an NVIDIA device");
        return;
    }
    let out = gpu_check("cuda", &report_dir("cuda"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("gpu-check --device cuda"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
