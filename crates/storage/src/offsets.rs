//! Stored consumer offsets of one partition, one small checksummed file per consumer.

use crate::StorageError;
use std::path::Path;

/// Whose offset: a single consumer or a consumer group (their ids live in separate spaces).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OffsetOwner {
    Consumer(u32),
    Group(u32),
}

pub struct ConsumerOffsets {
    // implementation-defined
}

impl ConsumerOffsets {
    /// Load every stored offset under `dir` (created if missing).
    pub fn open(dir: &Path) -> Result<ConsumerOffsets, StorageError> {
        let _ = dir;
        todo!()
    }
    pub fn get(&self, owner: OffsetOwner) -> Option<u64> {
        let _ = owner;
        todo!()
    }
    /// Durably store (atomic replace).
    pub fn store(&mut self, owner: OffsetOwner, offset: u64) -> Result<(), StorageError> {
        let _ = (owner, offset);
        todo!()
    }
    /// Returns whether an offset was stored.
    pub fn delete(&mut self, owner: OffsetOwner) -> Result<bool, StorageError> {
        let _ = owner;
        todo!()
    }
    /// Remove every stored offset (purge).
    pub fn clear(&mut self) -> Result<(), StorageError> {
        todo!()
    }
}
