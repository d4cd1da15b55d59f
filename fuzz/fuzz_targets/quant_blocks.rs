#![no_main]
//! Fuzz target `quant_blocks`: see `dcpserve_model::fuzzing::quant_blocks`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| dcpserve_fuzz::run(data, dcpserve_model::fuzzing::quant_blocks));
