//! `DCPEMU_SCHEDULE`: the order in which the runnable threads of a block run between
//! barriers (`forward`, `reverse`, or `random[:SEED]`), to expose kernels whose result
//! depends on an order the device does not promise.

/// How the threads of a block take turns.
#[derive(Debug, Clone)]
pub enum Schedule {
    /// Thread 0 first.
    Forward,
    /// The last thread first.
    Reverse,
    /// A fresh random permutation at every round (xorshift from the seed).
    Random(std::cell::Cell<u64>),
}

// Cell<u64> is only touched by the OS thread that owns a clone (see `for_worker`).
impl Schedule {
    /// Parses `DCPEMU_SCHEDULE` (unset: forward). An unknown value is reported once on
    /// stderr and runs forward.
    pub fn from_env() -> Schedule {
        let v = std::env::var("DCPEMU_SCHEDULE").unwrap_or_default();
        Schedule::parse(&v).unwrap_or_else(|e| {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| eprintln!("dcpemu: {e}; running threads in forward order"));
            Schedule::Forward
        })
    }

    /// `forward`, `reverse`, `random` or `random:SEED` (empty: forward).
    pub fn parse(v: &str) -> Result<Schedule, String> {
        match v.trim() {
            "" | "forward" => Ok(Schedule::Forward),
            "reverse" => Ok(Schedule::Reverse),
            "random" => Ok(Schedule::Random(std::cell::Cell::new(
                0x9E37_79B9_7F4A_7C15,
            ))),
            s => match s.strip_prefix("random:").map(str::parse::<u64>) {
                Some(Ok(seed)) => Ok(Schedule::Random(std::cell::Cell::new(
                    (seed ^ 0x9E37_79B9_7F4A_7C15) | 1,
                ))),
                _ => Err(format!(
                    "DCPEMU_SCHEDULE={s:?} is not forward, reverse, random or random:SEED"
                )),
            },
        }
    }

    /// A copy for one worker thread; `worker` varies a random seed per worker.
    pub(crate) fn for_worker(&self, worker: u64) -> Schedule {
        match self {
            Schedule::Random(s) => Schedule::Random(std::cell::Cell::new(
                (s.get() ^ worker.wrapping_mul(0xD1B5_4A32_D192_ED03)) | 1,
            )),
            other => other.clone(),
        }
    }

    /// Fills `order` with the indices 0..n in this round's order.
    pub(crate) fn order(&self, n: usize, order: &mut Vec<u32>) {
        order.clear();
        match self {
            Schedule::Forward => order.extend(0..n as u32),
            Schedule::Reverse => order.extend((0..n as u32).rev()),
            Schedule::Random(state) => {
                order.extend(0..n as u32);
                let mut x = state.get();
                for i in (1..n).rev() {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    order.swap(i, (x % (i as u64 + 1)) as usize);
                }
                state.set(x);
            }
        }
    }
}
