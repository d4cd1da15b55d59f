//! Compiles every CUDA kernel source of the CUDA backend with NVRTC, on any machine:
//! PTX for `compute_90` and a CUBIN for `sm_90` (the H200), checking that each kernel
//! the backend loads is defined. Needs only NVRTC, no driver and no GPU.
//!
//! NVRTC comes from `scripts/install-nvrtc.sh` (PyPI's `nvidia-cuda-nvrtc`), found
//! through `DCPSERVE_NVRTC_LIB_DIR` or the loader path. Without it the test fails when
//! `CI` is set, and otherwise prints a visible `skipped` line and passes.

use std::io::Write;

use dcpserve_kernels::cuda::{compile_kernels, SOURCES};
use dcpserve_kernels::KernelError;

/// `None` (after saying so) when NVRTC is missing outside CI.
fn compile_or_skip(arch: &str) -> Option<Vec<dcpserve_kernels::cuda::CompiledSource>> {
    match compile_kernels(arch) {
        Ok(all) => Some(all),
        Err(KernelError::Unavailable(why)) if std::env::var_os("CI").is_none() => {
            // Straight to stderr, past the test harness's capture, so it is seen.
            let _ = writeln!(
                std::io::stderr(),
                "skipped: NVRTC not found, run scripts/install-nvrtc.sh and set \
                 DCPSERVE_NVRTC_LIB_DIR to the directory it prints ({why})"
            );
            None
        }
        Err(e) => panic!("compiling the CUDA kernels for {arch}: {e}"),
    }
}

#[test]
fn every_kernel_compiles_to_ptx_for_compute_90() {
    let Some(all) = compile_or_skip("compute_90") else {
        return;
    };
    assert_eq!(all.len(), SOURCES.len());
    for c in &all {
        let ptx = String::from_utf8_lossy(&c.image);
        assert!(
            ptx.contains(".target sm_90"),
            "{}: {ptx:.200}",
            c.source.name
        );
        for f in c.source.functions {
            assert!(
                ptx.contains(&format!(".entry {f}(")),
                "{}.cu defines no kernel {f}",
                c.source.name
            );
        }
        eprintln!(
            "compiled {}.cu to PTX ({} bytes): {}",
            c.source.name,
            c.image.len(),
            c.source.functions.join(", ")
        );
    }
}

#[test]
fn every_kernel_compiles_to_a_cubin_for_sm_90() {
    let Some(all) = compile_or_skip("sm_90") else {
        return;
    };
    for c in &all {
        // An ELF image, as the driver loads it without JIT.
        assert_eq!(&c.image[..4], b"\x7fELF", "{}", c.source.name);
        eprintln!(
            "compiled {}.cu to an sm_90 CUBIN ({} bytes)",
            c.source.name,
            c.image.len()
        );
    }
}
