//! Viewstamped Replication for Cairn (design: `docs/replication.md`).
//!
//! Everything here is pure: no sockets, files, clocks, threads or ambient randomness. A
//! replica consumes messages, ticks and storage completions and produces messages, storage
//! requests and replies; the shells that own real IO (the tokio server, the simulator in
//! [`sim`]) drive it.
//!
//! Layout:
//! - [`constants`]: every limit and timeout, with the relations between them asserted.
//! - [`header`]: the fixed 256-byte message header, its checksums and its codec.
//! - [`checkpoint`]: the replicated state at one op (snapshot, client table, anchor header).
//! - [`client_table`]: sessions and request numbers, for at-most-once execution.
//! - [`durable`]: the superblock, the replica's durable VSR state in four checksummed copies.
//! - [`journal`]: what a journal slot proves after a crash (clean, faulty, empty).
//! - [`node`]: the groups of one node, with heartbeats batched per peer and durable writes
//!   batched per tick.
//! - [`replica`]: the replica state machine: normal operation, view change, checkpoints,
//!   restart and wiped-disk recovery, state transfer.
//! - [`sim`]: the deterministic simulator's parts: seeded PRNG streams, a faulty network, a
//!   faulty storage model.
//!
//! Architecture invariant: this crate knows nothing of partitions, Iggy or tokio. The state
//! machine it replicates is a parameter.

pub mod checkpoint;
pub mod client_table;
pub mod constants;
pub mod durable;
pub mod header;
pub mod journal;
pub mod node;
pub mod replica;
pub mod sim;
