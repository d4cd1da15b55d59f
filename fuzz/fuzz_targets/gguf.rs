#![no_main]
//! Fuzz target `gguf`: see `dcpserve_model::fuzzing::gguf`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| dcpserve_fuzz::run(data, dcpserve_model::fuzzing::gguf));
