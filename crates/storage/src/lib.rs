//! cairn-storage: the partition journal engine and the small durable files around it.
//!
//! Layout:
//! - [`journal`]: [`journal::JournalLog`], a partition group's segment log as its VSR journal:
//!   records by VSR op, written in op order, cut back at an op, recovered op by op, with
//!   open-time recovery (torn tail truncated, damage refused).
//! - [`transfer`]: state transfer of a journal: a manifest, checksummed chunks, a staged
//!   generation made live with one commit point.
//! - [`record`]: the on-disk record envelope around each batch and op, and the pure recovery
//!   scan that decides where the valid data in a segment ends (no file calls).
//! - [`read`]: reading batches back for a poll (verified, then sent whole from the file or
//!   cut).
//! - [`state`]: the journal's state file: durable frontier and offset reservation, published
//!   in place in two alternating checksummed slots.
//! - [`atomic_file`]: checksummed whole-file writes (temp + fsync + rename + dir fsync) for
//!   metadata.
//! - [`io`]: the only module that calls the filesystem: the [`io::Disk`] trait and its
//!   `std::fs` implementation. Everything takes any `Disk`, so tests inject faults (failed
//!   barriers, lost unsynced writes).
//! - [`check`]: offline verification of a data directory (read-only): the walk behind
//!   `cairn check`, with the server's checker for each partition.
//! - [`lock`]: the data directory lock (`<data_dir>/.lock`, `flock`). It calls `std::fs`
//!   directly: a lock is not data.
//! - [`sim_disk`]: an in-memory [`io::Disk`] that models power loss (unsynced writes lost or
//!   torn, unsynced directory operations lost, failing barriers), for simulation tests here
//!   and in the server.
//!
//! Architecture invariant: no sockets, no clocks (timestamps are passed in), no tokio.
//! One writer per partition: `JournalLog` takes `&mut self` for every write.
//! Decisions are pure and tested without files: [`record::scan`] (where valid data ends and
//! whether the rest is a torn tail or damage); the code around them only reads, then applies.
//!
//! Limits: [`record::BATCH_BYTES_MAX`] is the plausibility ceiling recovery applies to a
//! stored batch; the server's admission limit must not exceed it.

pub mod atomic_file;
pub mod check;
pub mod io;
pub mod journal;
pub mod lock;
pub mod read;
pub mod record;
pub mod sim_disk;
pub mod state;
pub mod transfer;

/// Storage failures. IO errors carry the path they happened on.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("io error on {path}: {source}")]
    Io {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    /// Verification failed below what recovery may truncate: the partition must be refused,
    /// its files are left untouched.
    #[error("damaged data in {path} at byte {position}: {reason}")]
    Damaged {
        path: std::path::PathBuf,
        position: u64,
        reason: String,
    },
    /// A caller-side precondition failed (e.g. batch larger than a segment may hold).
    #[error("invalid argument: {0}")]
    Invalid(String),
}
