//! Where each token's KV lives under decode context parallelism. The rule has one home,
//! `dcpserve_kernels::dcp` (with the [`dcpserve_kernels::dcp::Layout`] it comes from);
//! it is re-exported here for the actors that turn plans into KV slots.

pub use dcpserve_kernels::dcp::Placement;
