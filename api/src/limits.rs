//! Request limits shared by the HTTP layer and its error answers.
//!
//! A leaf module so that `errors` can name a limit without depending on `http`, which
//! itself depends on `errors`.

/// Largest request body accepted.
pub const MAX_BODY_BYTES: usize = 32 << 20;
/// Most `messages` in one chat request.
pub const MAX_MESSAGES: usize = 4096;
/// Most `tools` in one chat request.
pub const MAX_TOOLS: usize = 512;
/// Most `stop` strings in one request.
pub const MAX_STOP_STRINGS: usize = 64;
/// Most prompts in one completions request (`prompt` as a list).
pub const MAX_PROMPTS: usize = 1024;
