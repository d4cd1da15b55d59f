#![no_main]
//! Fuzz target `safetensors`: see `dcpserve_model::fuzzing::safetensors`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| dcpserve_fuzz::run(data, dcpserve_model::fuzzing::safetensors));
