//! A partition's mutable state as every module sees it: serving (its log and stored consumer
//! offsets), refused at boot, deleted, or closed. One mutex guards it; the writer, the
//! handler, retention and the clean stop take it for each change.
//!
//! `PartitionData`'s methods are what the request handler asks of a serving partition
//! (polls, stored offsets, stats, flush, purge): the handler never reaches into the log or
//! the offsets store itself, so what backs a partition can change behind them.
//!
//! This module sits below the catalog, the writer and retention, and imports none of them.

use cairn_storage::StorageError;
use cairn_storage::log::{LogConfig, LogStats, PartitionLog, SegmentInfo};
use cairn_storage::offsets::{ConsumerOffsets, OffsetOwner};
use cairn_storage::read::{ReadOutcome, ReadPart};
use cairn_wire::codes;
use cairn_wire::types::PollingStrategy;
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

/// Why a client's flush did not happen.
#[derive(Debug)]
pub enum FlushError {
    /// The partition stopped taking writes earlier (a failed barrier).
    Stopped,
    /// This barrier failed: the partition stops taking writes until a restart.
    BarrierFailed(StorageError),
}

impl PartitionData {
    /// Open the partition in `dir`: recover its log and stored offsets, and finish a purge
    /// the metadata recorded up to `purge_target` that did not reach it.
    pub fn open(
        dir: &Path,
        partition_id: u32,
        purge_target: u64,
        log_config: LogConfig,
    ) -> Result<PartitionData, StorageError> {
        let mut log = PartitionLog::open(dir, partition_id, log_config)?;
        let mut offsets = ConsumerOffsets::open(&offsets_dir(dir))?;
        finish_purge(dir, purge_target, &mut log, &mut offsets)?;
        Ok(PartitionData { log, offsets })
    }

    /// Create the files of a new, empty partition in `dir`.
    pub fn create(
        dir: &Path,
        partition_id: u32,
        log_config: LogConfig,
    ) -> Result<PartitionData, StorageError> {
        let log = PartitionLog::create(dir, partition_id, log_config)?;
        let offsets = ConsumerOffsets::open(&offsets_dir(dir))?;
        Ok(PartitionData { log, offsets })
    }

    /// Why the partition takes no more writes, if it stopped.
    pub fn stopped_reason(&self) -> Option<&str> {
        self.log.stopped_reason()
    }

    /// The offset of the newest message polls may see, 0 when none: `current_offset` in
    /// replies (offsets of a gap hold no message).
    pub fn current_offset(&self) -> u64 {
        self.log.last_offset().unwrap_or(0)
    }

    /// Segment count, message count and bytes, for stats and listings.
    pub fn stats(&self) -> LogStats {
        self.log.stats()
    }

    /// Poll for `owner`: resolve `strategy` against what polls may see (in durable mode the
    /// committed frontier, so a poll never returns a message a crash could take back), append
    /// the batches of at most `count` messages (`read_parts`), and with `auto_commit` store
    /// the last offset returned as `owner`'s.
    pub fn poll(
        &mut self,
        owner: &OffsetOwner,
        strategy: PollingStrategy,
        count: u32,
        auto_commit: bool,
        out: &mut Vec<u8>,
        parts: &mut Vec<ReadPart>,
    ) -> Result<ReadOutcome, u32> {
        let next_offset = self.log.visible_next_offset();
        let Some(first_offset) = self.log.first_offset() else {
            return Ok(ReadOutcome::NOTHING);
        };
        let start = match strategy {
            PollingStrategy::Offset(value) => Some(value),
            PollingStrategy::First => Some(first_offset),
            // The last `count` offsets up to the newest message. (Across an offset gap left
            // by an unclean stop this returns fewer than `count` messages: gap offsets hold
            // none.)
            PollingStrategy::Last => Some(self.log.last_offset().map_or(first_offset, |last| {
                (last + 1).saturating_sub(u64::from(count)).max(first_offset)
            })),
            PollingStrategy::Next => Some(
                self.offsets
                    .get(owner)
                    .map(|stored| stored.saturating_add(1))
                    .unwrap_or(first_offset),
            ),
            PollingStrategy::Timestamp(t) => self.log.offset_at_timestamp(t).map_err(storage_status)?,
        };
        let Some(start) = start.filter(|&start| count > 0 && start < next_offset) else {
            return Ok(ReadOutcome::NOTHING);
        };
        let first_returned = start.max(first_offset);
        let read = self
            .log
            .read_parts(first_returned, count, out, parts)
            .map_err(storage_status)?;
        if auto_commit && read.messages_count > 0 {
            // The last returned offset comes from the batches themselves: offsets may skip a
            // gap (an unclean stop's reservation), so the count alone does not give it.
            let Some(last) = read.last_offset else {
                tracing::error!(partition_dir = %self.log.dir().display(), "poll read batches without a last offset");
                return Err(codes::ERROR);
            };
            debug_assert!(last >= first_returned && last < next_offset);
            self.offsets.store(owner, last).map_err(storage_status)?;
        }
        Ok(read)
    }

    /// `owner`'s stored offset, if any.
    pub fn stored_offset(&self, owner: &OffsetOwner) -> Option<u64> {
        self.offsets.get(owner)
    }

    pub fn store_offset(&mut self, owner: &OffsetOwner, offset: u64) -> Result<(), u32> {
        self.offsets.store(owner, offset).map_err(storage_status)
    }

    /// Delete `owner`'s stored offset (`CONSUMER_OFFSET_NOT_FOUND` when none).
    pub fn delete_offset(&mut self, owner: &OffsetOwner) -> Result<(), u32> {
        if self.offsets.delete(owner).map_err(storage_status)? {
            Ok(())
        } else {
            Err(codes::CONSUMER_OFFSET_NOT_FOUND)
        }
    }

    /// A client's flush: refused once the partition stopped; with `fsync`, a barrier over
    /// everything written (in durable mode everything acknowledged is stable already; this
    /// covers relaxed-mode writes the background barrier has not reached yet).
    pub fn flush(&mut self, fsync: bool) -> Result<(), FlushError> {
        if self.log.stopped_reason().is_some() {
            return Err(FlushError::Stopped);
        }
        if fsync {
            self.log.commit().map_err(FlushError::BarrierFailed)?;
        }
        Ok(())
    }

    /// The oldest sealed segment retention may delete, if any (never the one written).
    pub fn oldest_sealed_segment(&self) -> Option<SegmentInfo> {
        self.log.oldest_sealed_segment()
    }

    /// Delete the oldest `count` sealed segments (fewer if fewer are sealed), oldest first.
    pub fn delete_oldest_segments(&mut self, count: usize) -> Result<Vec<SegmentInfo>, StorageError> {
        self.log.delete_oldest_segments(count)
    }

    /// The first offset still retained.
    pub fn start_offset(&self) -> u64 {
        self.log.start_offset()
    }

    /// The clean stop: everything made stable, so the next start continues without a gap.
    pub fn close(self) -> Result<(), StorageError> {
        self.log.close()
    }

    /// The offset a purge of the partition now would purge up to: its append counter.
    pub fn purge_target(&self) -> u64 {
        self.log.next_offset()
    }

    /// Purge every message below `target` (the [`PartitionData::purge_target`] the metadata
    /// recorded) and every stored offset: offsets first, so a crash after them is finished at
    /// boot (the log still starts below the target) and no stored offset outlives its purge.
    pub fn purge(&mut self, target: u64) -> Result<(), u32> {
        self.offsets.clear().map_err(storage_status)?;
        self.log.purge().map_err(storage_status)?;
        debug_assert_eq!(self.log.start_offset(), target);
        Ok(())
    }
}

/// A storage failure as a client sees it (logged here with its cause).
pub fn storage_status(error: impl std::fmt::Display) -> u32 {
    tracing::error!(%error, "storage operation failed");
    codes::ERROR
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
