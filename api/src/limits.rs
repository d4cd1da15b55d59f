//! Request limits shared by the HTTP layer and its error answers.
//!
//! A leaf module so that `errors` can name a limit without depending on `http`, which
//! itself depends on `errors`.

/// Largest request body accepted.
pub const MAX_BODY_BYTES: usize = 32 << 20;
