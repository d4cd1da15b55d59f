//! `--device cuda` on a machine without a CUDA driver: a clear error at engine start,
//! before any weight is read, and no panic. (Where a driver is present these tests say
//! so and return: what they check is the driver-less path.)

use std::process::Command;

use dcpserve::{Device, Engine, Error};

const NO_DRIVER: &str = "--device cuda: no CUDA driver found (libcuda.so.1 could not be loaded); this machine has no NVIDIA GPU driver";

fn has_driver(test: &str) -> bool {
    let present = dcpserve_kernels::cuda_comm::check_driver().is_ok();
    if present {
        eprintln!("{test}: skipped: this machine has a CUDA driver");
    }
    present
}

#[test]
fn generate_with_device_cuda_fails_cleanly_without_a_driver() {
    if has_driver("generate_with_device_cuda_fails_cleanly_without_a_driver") {
        return;
    }
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/tiny-llama");
    let out = Command::new(env!("CARGO_BIN_EXE_dcpserve"))
        .args(["generate", "--device", "cuda", "--model", model])
        .args(["--prompt", "Hello", "--max-tokens", "2"])
        .output()
        .expect("run dcpserve");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "exit status {:?}:\n{stderr}",
        out.status
    );
    assert!(stderr.contains(NO_DRIVER), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[tokio::test]
async fn the_driver_is_checked_before_the_model_is_opened() {
    if has_driver("the_driver_is_checked_before_the_model_is_opened") {
        return;
    }
    // The path does not exist: the device error must come first.
    let err = Engine::builder("/nonexistent/model.gguf")
        .device(Device::Cuda)
        .build()
        .await
        .err()
        .expect("no driver, no engine");
    assert!(matches!(err, Error::Config(_)), "{err:?}");
    assert_eq!(err.to_string(), NO_DRIVER);
}
