//! Cairn's deterministic state machines.
//!
//! [`metadata`] holds the server's catalog: streams, topics, partition counts, consumer-group
//! definitions, users, permissions and personal access tokens, changed only by
//! [`metadata::MetadataOp`]s applied in order. [`partition`] is a partition's: appends
//! (offsets minted when the primary prepares), consumer offsets, purges and retention as
//! ops, its state the manifest a checkpoint records (`docs/replication.md`).
//!
//! Architecture invariant: nothing here does IO, reads a clock or draws randomness. The crate
//! depends on no runtime, no file system and no clock; whatever is not a pure function of
//! the state is decided by whoever prepares an op and travels inside it. That is what lets
//! every replica apply the same committed ops to the same bytes.

pub mod metadata;
pub mod partition;
pub mod permissions;
pub mod simulated;
pub mod users;

#[cfg(test)]
mod tests;
