#![no_main]
//! Fuzz target `tool_output`: see `dcpserve_api::fuzzing::tool_output`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| dcpserve_fuzz::run(data, dcpserve_api::fuzzing::tool_output));
