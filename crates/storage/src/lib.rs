//! cairn-storage: the partition log engine and the small durable files around it.
//!
//! Layout:
//! - [`log`]: [`log::PartitionLog`], one partition's append-only log of record-framed batches in
//!   segment files (`<base offset, 20 digits>.log` + `.index`), with open-time recovery.
//! - [`journal`]: [`journal::JournalLog`], a partition group's segment log as its VSR journal:
//!   records by VSR op, written in op order, cut back at an op, recovered op by op.
//! - [`record`]: the on-disk record envelope around each batch and the pure recovery scan that
//!   decides where the valid data in a `.log` ends (no file calls).
//! - [`index`]: the per-segment index (offset/timestamp -> file position).
//! - [`read`]: reading batches back for a poll (verified, then sent whole from the file or
//!   cut), shared by both logs.
//! - [`state`]: the partition state file: durable frontier and offset reservation, published
//!   in place in two alternating checksummed slots.
//! - [`offsets`]: stored consumer offsets of one partition.
//! - [`atomic_file`]: checksummed whole-file writes (temp + fsync + rename + dir fsync) for
//!   metadata.
//! - [`io`]: the only module that calls the filesystem: the [`io::Disk`] trait and its
//!   `std::fs` implementation. `PartitionLog::open_on` / `ConsumerOffsets::open_on` take any
//!   `Disk`, so tests can inject faults (failed barriers, lost unsynced writes).
//! - [`check`]: offline verification of partitions and data directories (read-only, on the
//!   same recovery planning phase `open` runs) and the explicit `repair --accept-loss` that
//!   cuts a refused partition at its damage, moving the cut data into a quarantine folder.
//! - [`lock`]: the data directory lock (`<data_dir>/.lock`, `flock`), so a repair never runs
//!   against a live server. It calls `std::fs` directly: a lock is not data.
//! - [`sim_disk`]: an in-memory [`io::Disk`] that models power loss (unsynced writes lost or
//!   torn, unsynced directory operations lost, failing barriers), for simulation tests here
//!   and in the server.
//!
//! Architecture invariant: no sockets, no clocks (timestamps are passed in), no tokio.
//! One writer per partition: `PartitionLog` takes `&mut self` for every write.
//! Decisions are pure and tested without files: [`record::scan`] (where valid data ends and
//! whether the rest is a torn tail or damage), [`log::rotation_needed`],
//! [`log::parse_entry_name`]; the code around them only reads, then applies.
//!
//! Limits: [`record::BATCH_BYTES_MAX`] is the plausibility ceiling recovery applies to a
//! stored batch; the server's admission limit must not exceed it.

pub mod atomic_file;
pub mod check;
pub mod index;
pub mod io;
pub mod journal;
pub mod lock;
pub mod log;
pub mod offsets;
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
