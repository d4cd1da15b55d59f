//! The rank's side of micro-batch overlap on the CPU: its two micro-batch threads share
//! the cores through a compute baton (`dcpserve_kernels::overlap`), and the model hands
//! over at the [`TurnPoints`] of a forward that this module supplies. The model only
//! knows the hook; on a GPU the same overlap is two streams and events instead.

use dcpserve_kernels::BatonTurn;
use dcpserve_model::arch::TurnPoints;

/// Pieces of a long cache read (attention) when another micro-batch may be waiting.
const PIECES_PER_LONG_READ: usize = 16;

/// A micro-batch's held turn of the rank's compute baton, as the model's turn points:
/// every cache access is a turn boundary, and a long read yields to a waiting
/// micro-batch between its pieces. Dropping it frees the baton.
pub(crate) struct BatonTurns(pub BatonTurn);

impl TurnPoints for BatonTurns {
    fn before_access(&self, in_long: bool) {
        self.0.yield_to_waiter(in_long);
    }

    fn begin_long(&self) {
        self.0.begin_long();
    }

    fn long_read_pieces(&self) -> usize {
        PIECES_PER_LONG_READ
    }
}
