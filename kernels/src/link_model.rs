//! A modeled interconnect for benchmarks: collectives of CPU ranks in one process cost a
//! memory copy, far less than between GPUs or hosts, so there is little communication to
//! hide. [`ModeledLink`] makes each collective also wait, without using a core, for the
//! time a link of a given latency and bandwidth would take, so the effect of overlapping
//! communication with compute can be measured on CPU.

use std::sync::Arc;
use std::time::Duration;

use crate::comm::{Communicator, Elems, ElemsMut};
use crate::error::KernelError;

/// Latency and bandwidth of a modeled link (ring algorithms: an all-reduce moves
/// `2·(n−1)/n` of its data per rank, a reduce-scatter, all-gather or all-to-all `(n−1)/n`).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LinkModel {
    /// Fixed cost of one collective.
    pub latency: Duration,
    /// Bytes per second each rank sends.
    pub bytes_per_second: f64,
}

impl LinkModel {
    /// The time a collective that moves `bytes` per rank takes on this link.
    ///
    /// ```
    /// use std::time::Duration;
    /// use dcpserve_kernels::LinkModel;
    /// let link = LinkModel { latency: Duration::from_micros(20), bytes_per_second: 1e9 };
    /// assert_eq!(link.transfer_time(1000), Duration::from_micros(21));
    /// ```
    pub fn transfer_time(&self, bytes: usize) -> Duration {
        let secs = bytes as f64 / self.bytes_per_second.max(1.0);
        self.latency + Duration::from_secs_f64(secs)
    }
}

/// A communicator that runs `inner`'s collectives, then sleeps for the time `link` would
/// have taken to move the same data.
pub struct ModeledLink {
    inner: Arc<dyn Communicator>,
    link: LinkModel,
}

impl ModeledLink {
    pub fn new(inner: Arc<dyn Communicator>, link: LinkModel) -> Self {
        Self { inner, link }
    }

    /// Runs `f`, then waits out the link's time for `bytes` sent by this rank.
    fn after<T>(&self, bytes: usize, f: impl FnOnce(&dyn Communicator) -> T) -> T {
        let out = f(self.inner.as_ref());
        if self.inner.size() > 1 {
            std::thread::sleep(self.link.transfer_time(bytes));
        }
        out
    }

    /// Bytes one rank sends when `values` elements of `elem_bytes` each are spread over
    /// the group (ring; an all-to-all sends the same share).
    fn ring_share(&self, values: usize, elem_bytes: usize) -> usize {
        let n = self.inner.size().max(1);
        values * elem_bytes * (n - 1) / n
    }
}

impl Communicator for ModeledLink {
    fn group_start(&self) {
        self.inner.group_start()
    }
    fn group_end(&self) -> Result<(), KernelError> {
        self.inner.group_end()
    }
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn all_gather_elems(&self, input: Elems<'_>, out: ElemsMut<'_>) -> Result<(), KernelError> {
        let bytes = self.ring_share(out.len(), out.dtype().bytes_for(1));
        self.after(bytes, |c| c.all_gather_elems(input, out))
    }
    fn all_reduce_sum_elems(&self, data: ElemsMut<'_>) -> Result<(), KernelError> {
        let bytes = 2 * self.ring_share(data.len(), data.dtype().bytes_for(1));
        self.after(bytes, |c| c.all_reduce_sum_elems(data))
    }
    fn reduce_scatter_sum_elems(
        &self,
        input: Elems<'_>,
        out: ElemsMut<'_>,
    ) -> Result<(), KernelError> {
        let bytes = self.ring_share(input.len(), input.dtype().bytes_for(1));
        self.after(bytes, |c| c.reduce_scatter_sum_elems(input, out))
    }
    fn broadcast_elems(&self, data: ElemsMut<'_>, root: usize) -> Result<(), KernelError> {
        let bytes = data.len() * data.dtype().bytes_for(1);
        self.after(bytes, |c| c.broadcast_elems(data, root))
    }
    fn all_gather_varying_elems(
        &self,
        input: Elems<'_>,
        counts: &[usize],
        out: ElemsMut<'_>,
    ) -> Result<(), KernelError> {
        let bytes = self.ring_share(out.len(), out.dtype().bytes_for(1));
        self.after(bytes, |c| c.all_gather_varying_elems(input, counts, out))
    }
    fn all_to_all_elems(&self, input: Elems<'_>, out: ElemsMut<'_>) -> Result<(), KernelError> {
        // Every chunk but this rank's own leaves it.
        let bytes = self.ring_share(input.len(), input.dtype().bytes_for(1));
        self.after(bytes, |c| c.all_to_all_elems(input, out))
    }
    fn abort(&self) {
        self.inner.abort()
    }
    fn seconds_in_collectives(&self) -> f64 {
        self.inner.seconds_in_collectives()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::InProcessComm;
    use std::time::Instant;

    #[test]
    fn collectives_are_unchanged_and_take_the_links_time() {
        let link = LinkModel {
            latency: Duration::from_millis(3),
            bytes_per_second: 1e6,
        };
        let comms: Vec<ModeledLink> = InProcessComm::group(2)
            .into_iter()
            .map(|c| ModeledLink::new(Arc::new(c), link))
            .collect();
        std::thread::scope(|s| {
            for c in &comms {
                s.spawn(move || {
                    let t = Instant::now();
                    // 2000 values: a ring all-reduce sends 2·(1/2)·8000 bytes = 8 ms at 1 MB/s.
                    let mut x = vec![c.rank() as f32 + 1.0; 2000];
                    c.all_reduce_sum(&mut x).unwrap();
                    assert!(x.iter().all(|&v| v == 3.0));
                    let took = t.elapsed();
                    assert!(took >= Duration::from_millis(11), "took {took:?}");
                    let mut g = vec![0.0; 4];
                    c.all_gather(&[c.rank() as f32; 2], &mut g).unwrap();
                    assert_eq!(g, vec![0.0, 0.0, 1.0, 1.0]);
                });
            }
        });
        // A group of one never waits.
        let solo = ModeledLink::new(Arc::new(InProcessComm::group(1).remove(0)), link);
        let t = Instant::now();
        solo.all_reduce_sum(&mut [1.0; 100]).unwrap();
        assert!(t.elapsed() < Duration::from_millis(3));
    }
}
