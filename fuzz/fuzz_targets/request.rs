#![no_main]
//! Fuzz target `request`: see `dcpserve_api::fuzzing::request`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| dcpserve_fuzz::run(data, dcpserve_api::fuzzing::request));
