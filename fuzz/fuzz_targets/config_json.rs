#![no_main]
//! Fuzz target `config_json`: see `dcpserve_model::fuzzing::config_json`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| dcpserve_fuzz::run(data, dcpserve_model::fuzzing::config_json));
