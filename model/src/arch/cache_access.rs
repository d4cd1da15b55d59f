//! How a forward pass reaches its rank's KV cache: borrowed for the whole step, or shared
//! with the rank's other micro-batch thread. A forward only touches the cache inside
//! [`CacheAccess::with`], never across a collective, so a shared cache is locked for
//! cache reads and writes alone and the other micro-batch can use it while this one
//! waits for its peers. When the micro-batches hand over to each other is the rank's
//! business ([`TurnPoints`], which the rank supplies), not the model's.

use std::ops::Range;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// The points of a forward where the rank may hand its compute to another micro-batch:
/// supplied by the rank (on the CPU, the turn of its compute baton that the rank actor
/// holds) and called by the model at every cache access. On a GPU the same overlap is
/// two streams and events, and no hook is needed.
pub trait TurnPoints {
    /// A cache access is about to happen (inside a long read when `in_long`): the other
    /// micro-batch may compute first.
    fn before_access(&self, in_long: bool);
    /// A long cache read (attention) begins.
    fn begin_long(&self);
    /// Into how many pieces a long cache read is split, so the other micro-batch gets
    /// turns in between.
    fn long_read_pieces(&self) -> usize;
}

/// Scoped access to a KV cache of type `C`.
pub trait CacheAccess<C> {
    /// Runs `f` with the cache.
    fn with<R>(&mut self, f: impl FnOnce(&mut C) -> R) -> R;

    /// How many pieces a long cache read (attention) should be split into, so another
    /// micro-batch waiting to compute gets its turn in between.
    fn turns(&self) -> usize {
        1
    }

    /// Runs `f`, a long computation made of several [`CacheAccess::with`] calls (the
    /// attention, split into [`CacheAccess::turns`] pieces).
    fn long<R>(&mut self, f: impl FnOnce(&mut Self) -> R) -> R
    where
        Self: Sized,
    {
        f(self)
    }
}

impl<C> CacheAccess<C> for &mut C {
    fn with<R>(&mut self, f: impl FnOnce(&mut C) -> R) -> R {
        f(self)
    }
}

/// A cache shared by a rank's micro-batch threads. The micro-batches write disjoint
/// slots (their sequences, and so their blocks, are disjoint), but Rust wants one
/// `&mut` at a time: each access locks. Each access is also one of the rank's
/// [`TurnPoints`], when it supplied them.
pub struct SharedCache<'a, C> {
    pub cache: &'a Mutex<C>,
    pub turns: Option<&'a dyn TurnPoints>,
    /// Inside [`CacheAccess::long`].
    pub in_long: bool,
}

impl<'a, C> SharedCache<'a, C> {
    pub fn new(cache: &'a Mutex<C>, turns: Option<&'a dyn TurnPoints>) -> Self {
        Self {
            cache,
            turns,
            in_long: false,
        }
    }
}

impl<C> CacheAccess<C> for SharedCache<'_, C> {
    fn with<R>(&mut self, f: impl FnOnce(&mut C) -> R) -> R {
        if let Some(t) = self.turns {
            t.before_access(self.in_long);
        }
        f(&mut lock(self.cache))
    }

    fn long<R>(&mut self, f: impl FnOnce(&mut Self) -> R) -> R {
        if let Some(t) = self.turns {
            t.begin_long();
        }
        self.in_long = true;
        let r = f(self);
        self.in_long = false;
        r
    }

    fn turns(&self) -> usize {
        self.turns.map_or(1, |t| t.long_read_pieces())
    }
}

/// Locks `m`; a thread that panicked while holding it fails its rank group anyway.
pub fn lock<C>(m: &Mutex<C>) -> MutexGuard<'_, C> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The token ranges of `n` tokens split into at most `turns` pieces.
fn pieces(n: usize, turns: usize) -> impl Iterator<Item = Range<usize>> {
    let per = n.div_ceil(turns.max(1)).max(1);
    (0..n).step_by(per).map(move |s| s..(s + per).min(n))
}

/// A long cache read (attention) over `n` tokens, as one [`CacheAccess::long`] in
/// [`CacheAccess::turns`] pieces: `read(cache, tokens)` per piece of the tokens (the
/// caller cuts its output buffers to the piece's rows).
pub(crate) fn read_in_pieces<C, A: CacheAccess<C>, E>(
    cache: &mut A,
    n: usize,
    mut read: impl FnMut(&mut C, Range<usize>) -> Result<(), E>,
) -> Result<(), E> {
    let turns = cache.turns();
    cache.long(|cache| {
        for r in pieces(n, turns) {
            cache.with(|c| read(c, r.clone()))?;
        }
        Ok(())
    })
}
