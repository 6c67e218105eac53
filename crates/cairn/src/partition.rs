//! A partition's mutable state as every module sees it: serving (its log and stored consumer
//! offsets), refused at boot, deleted, or closed. One mutex guards it; the writer, the
//! handler, retention and the clean stop take it for each change.
//!
//! This module sits below the catalog, the writer and retention, and imports none of them.

use cairn_storage::StorageError;
use cairn_storage::log::PartitionLog;
use cairn_storage::offsets::ConsumerOffsets;
use cairn_wire::codes;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Status answered for every request to a partition that failed to open (damage or IO
/// error at boot). 3003 CannotOpenPartitionLogFile: the 0.11 SDK does not retry it.
pub const PARTITION_REFUSED_STATUS: u32 = codes::CANNOT_OPEN_PARTITION_LOG_FILE;

pub enum PartitionState {
    Serving(Box<PartitionData>),
    /// Open failed (damage or IO): every request to it gets the refusal status; files are
    /// left as they were.
    Refused {
        reason: String,
    },
    /// Deleted or its topic/stream deleted: late holders of the `Arc` must not write.
    Deleted,
    /// The log was closed at a clean stop; nothing may use it any more.
    Closed,
}

pub struct PartitionData {
    pub log: PartitionLog,
    pub offsets: ConsumerOffsets,
}

/// The data of a serving partition, or the status for one that is not.
pub fn serving(state: &mut PartitionState) -> Result<&mut PartitionData, u32> {
    match state {
        PartitionState::Serving(data) => Ok(data),
        PartitionState::Refused { reason } => {
            tracing::debug!(%reason, "request to a refused partition");
            Err(PARTITION_REFUSED_STATUS)
        }
        PartitionState::Deleted => Err(codes::PARTITION_NOT_FOUND),
        // Only after the shell stopped taking requests; a straggler gets a plain error.
        PartitionState::Closed => Err(codes::ERROR),
    }
}

/// At boot: if the metadata's purge marker says offsets below `purge_target` are purged but
/// the log still starts below it (a purge interrupted before it reached this partition),
/// purge now, before the partition serves: consumer offsets first, then the log.
pub fn finish_purge(
    dir: &Path,
    purge_target: u64,
    log: &mut PartitionLog,
    offsets: &mut ConsumerOffsets,
) -> Result<(), StorageError> {
    if log.start_offset() >= purge_target {
        return Ok(());
    }
    if log.next_offset() < purge_target {
        // The target was this log's append counter, and the counter never goes back (the
        // offset reservation is durable): a log ending below it lost data.
        return Err(StorageError::Damaged {
            path: dir.to_path_buf(),
            position: 0,
            reason: format!(
                "the log ends at offset {}, below the purge target {purge_target} recorded in the metadata (lost data)",
                log.next_offset()
            ),
        });
    }
    tracing::info!(
        partition_dir = %dir.display(),
        retained_start_offset = log.start_offset(),
        purge_target,
        next_offset = log.next_offset(),
        "finishing an interrupted purge recorded in the metadata: purging the partition and its consumer offsets"
    );
    offsets.clear()?;
    log.purge()?;
    debug_assert!(log.start_offset() >= purge_target);
    Ok(())
}

/// Lock a std mutex; a poisoned lock means a writer panicked mid-update, which is a bug:
/// carrying on could publish half-applied state, so the poison propagates as a panic.
pub fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => panic!("partition lock poisoned by an earlier panic: {poisoned}"),
    }
}

pub fn remove_dir(dir: &Path) -> Result<(), StorageError> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(StorageError::Io {
            path: dir.to_path_buf(),
            source,
        }),
    }
}

pub fn offsets_dir(partition_dir: &Path) -> PathBuf {
    partition_dir.join("offsets")
}
