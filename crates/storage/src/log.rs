//! One partition's log.

use crate::StorageError;
use std::path::Path;

/// How appends reach stable storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncMode {
    /// fdatasync after every append, before `append` returns.
    EveryAppend,
    /// Leave it to the OS (and to explicit `flush` calls).
    Os,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogConfig {
    /// A segment is closed and a new one started once its `.log` reaches this size.
    /// Must be <= u32::MAX (index positions are u32).
    pub segment_size_bytes: u64,
    pub sync: SyncMode,
}

/// Summary numbers for replies and stats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LogStats {
    pub segments_count: u32,
    pub messages_count: u64,
    pub size_bytes: u64,
}

pub struct PartitionLog {
    // implementation-defined
}

impl PartitionLog {
    /// Create a new, empty partition log in `dir` (created if missing; must be empty).
    pub fn create(dir: &Path, partition_id: u32, config: LogConfig) -> Result<PartitionLog, StorageError> {
        let _ = (dir, partition_id, config);
        todo!()
    }

    /// Open an existing log: recover (truncate a torn tail, rebuild a missing or torn index),
    /// or fail with `Damaged` leaving files untouched.
    pub fn open(dir: &Path, partition_id: u32, config: LogConfig) -> Result<PartitionLog, StorageError> {
        let _ = (dir, partition_id, config);
        todo!()
    }

    /// Append one validated client batch (256-byte header + frames): assigns the next
    /// offsets, stamps partition id, base offset and `timestamp_us` (recomputing the batch
    /// checksum via `cairn_wire::batch::stamp`), writes it, syncs per `SyncMode`, rotates
    /// the segment when full. Returns the base offset.
    pub fn append(&mut self, batch: &mut [u8], timestamp_us: u64) -> Result<u64, StorageError> {
        let _ = (batch, timestamp_us);
        todo!()
    }

    /// Make everything appended so far stable (fdatasync).
    pub fn flush(&mut self) -> Result<(), StorageError> {
        todo!()
    }

    /// Append to `out` the client-format batches holding messages with offset >= `from_offset`,
    /// at most `max_messages` in all (sub-ranges via `cairn_wire::batch::slice_into`).
    /// Returns the number of messages appended.
    pub fn read(&self, from_offset: u64, max_messages: u32, out: &mut Vec<u8>) -> Result<u32, StorageError> {
        let _ = (from_offset, max_messages, out);
        todo!()
    }

    /// The offset of the first message whose append timestamp >= `timestamp_us`, if any.
    pub fn offset_at_timestamp(&self, timestamp_us: u64) -> Result<Option<u64>, StorageError> {
        let _ = timestamp_us;
        todo!()
    }

    /// The oldest retained offset, or None if no message is retained.
    pub fn first_offset(&self) -> Option<u64> {
        todo!()
    }

    /// The offset the next appended message will get.
    pub fn next_offset(&self) -> u64 {
        todo!()
    }

    pub fn stats(&self) -> LogStats {
        todo!()
    }

    /// Delete every segment; offsets keep counting from `next_offset` (a purge never re-issues
    /// an offset).
    pub fn purge(&mut self) -> Result<(), StorageError> {
        todo!()
    }
}
