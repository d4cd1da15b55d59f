//! Handle tables: an opaque C handle is a small tagged integer naming an `Arc<T>`.
//!
//! Each kind of handle has its own tag in the high bits, so passing a stream where an
//! event is expected, or a handle after its destroy call, is refused instead of read.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::Handle;

/// A table of live objects of one kind.
pub struct Registry<T> {
    tag: usize,
    next: AtomicUsize,
    live: Mutex<BTreeMap<usize, Arc<T>>>,
}

impl<T> Registry<T> {
    /// A table whose handles are `tag << 32 | n` for n = 1, 2, ...
    pub const fn new(tag: usize) -> Self {
        Registry {
            tag,
            next: AtomicUsize::new(1),
            live: Mutex::new(BTreeMap::new()),
        }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, BTreeMap<usize, Arc<T>>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers `value`, returning its new handle.
    pub fn insert(&self, value: Arc<T>) -> Handle {
        let id = (self.tag << 32) | self.next.fetch_add(1, Ordering::Relaxed);
        self.map().insert(id, value);
        id as Handle
    }

    /// The object named by `handle`, if it is live.
    pub fn get(&self, handle: Handle) -> Option<Arc<T>> {
        self.map().get(&(handle as usize)).cloned()
    }

    /// Every live object.
    pub fn all(&self) -> Vec<Arc<T>> {
        self.map().values().cloned().collect()
    }

    /// Unregisters `handle`, returning its object.
    pub fn remove(&self, handle: Handle) -> Option<Arc<T>> {
        self.map().remove(&(handle as usize))
    }
}
