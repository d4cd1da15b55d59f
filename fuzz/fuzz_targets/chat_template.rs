#![no_main]
//! Fuzz target `chat_template`: see `dcpserve_model::fuzzing::chat_template`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| dcpserve_fuzz::run(data, dcpserve_model::fuzzing::chat_template));
