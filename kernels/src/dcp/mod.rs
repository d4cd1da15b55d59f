//! Decode context parallelism (DCP), in one place.
//!
//! The KV cache of a rank group is sharded by sequence position over each DCP group
//! (a contiguous block of `dcp` tensor-parallel ranks). This module holds every rule
//! that follows from it, so the rest of the engine reads them instead of restating them:
//!
//! - [`Layout`]: the rank group's shape, computed once from the parallel config: the DCP
//!   group rule, the virtual block size, each rank's [`Placement`], token capacities.
//! - [`constraints`]: vLLM's layout constraints and messages ([`Layout::for_model`]).
//! - [`kv_size`]: what a token costs in the KV cache ([`KvShape`]) and what a budget
//!   holds ([`Layout::kv_capacity`]).
//! - [`Placement`]: which DCP rank stores a position, at which local slot, and how many
//!   positions of a sequence a rank stores.
//! - [`merge`]: the one log-sum-exp merge of attention partials over disjoint KV shards.
//! - [`PrefillSplit`]: with prefill context parallelism (`pcp` copies of the TP group,
//!   sharing one context-parallel KV placement over `pcp·dcp` ranks), which copy computes
//!   which tokens of a step: the copy that stores them.
//! - [`DcpAttention`]: the one DCP attention step (gather the group's queries, attend the
//!   local shard, exchange the partials, merge), used by GQA and MLA alike.

pub mod constraints;
pub mod kv_size;
pub mod layout;
pub mod merge;
pub mod placement;
pub mod prefill_split;
pub mod step;

pub use constraints::AttentionKind;
pub use kv_size::{kv_bytes_per_token, KvCapacity, KvShape};
pub use layout::{dcp_rank_of, Layout};
pub use merge::merge_partials;
pub use placement::Placement;
pub use prefill_split::PrefillSplit;
pub use step::{DcpAttention, DcpShape, MergeExchange};
