//! Settings read once from the environment (`DCPEMU_*`).

use std::sync::OnceLock;
use std::time::Duration;

/// The emulator's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// `DCPEMU_DEVICES` (default 1): how many devices `cuDeviceGetCount` reports.
    pub devices: usize,
    /// `DCPEMU_MEMORY_MIB` (default 4096): each device's memory; allocations beyond it fail
    /// with `CUDA_ERROR_OUT_OF_MEMORY`.
    pub memory_bytes: usize,
    /// `DCPEMU_POISON=1`: new allocations are filled with 0xFF bytes (NaN as f32 and bf16)
    /// instead of zeros, so reads of never-written memory show up.
    pub poison: bool,
    /// `DCPEMU_RANDOM_DELAY_US=N`: every stream item waits a random 0..=N µs first, so work
    /// on streams that are not ordered by events interleaves differently from run to run.
    pub random_delay_us: u64,
}

fn parse<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v.trim().parse().unwrap_or_else(|_| {
            eprintln!("dcpemu: {name}={v:?} is not a number; using the default");
            default
        }),
        Err(_) => default,
    }
}

/// The settings of this process.
pub fn get() -> &'static Config {
    static CONFIG: OnceLock<Config> = OnceLock::new();
    CONFIG.get_or_init(|| Config {
        devices: parse("DCPEMU_DEVICES", 1usize).clamp(1, 64),
        memory_bytes: parse("DCPEMU_MEMORY_MIB", 4096usize) << 20,
        poison: parse("DCPEMU_POISON", 0u32) != 0,
        random_delay_us: parse("DCPEMU_RANDOM_DELAY_US", 0u64),
    })
}

/// A random delay of up to `DCPEMU_RANDOM_DELAY_US` (xorshift on a per-thread seed).
pub fn random_delay() -> Option<Duration> {
    let max = get().random_delay_us;
    if max == 0 {
        return None;
    }
    thread_local! {
        static SEED: std::cell::Cell<u64> = std::cell::Cell::new({
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64);
            let here = &t as *const u64 as u64;
            (t ^ here.rotate_left(32)) | 1
        });
    }
    let r = SEED.with(|s| {
        let mut x = s.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.set(x);
        x
    });
    Some(Duration::from_micros(r % (max + 1)))
}
