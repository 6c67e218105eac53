//! The per-segment index: offset and timestamp -> byte position of the record in the `.log`.
//!
//! # `.index` file format
//!
//! No file header; one fixed 16-byte entry per record of the segment's `.log`, in log order
//! (little-endian):
//!
//! | Off | Size | Field            | Meaning |
//! |-----|------|------------------|---------|
//! | 0   | 4    | `offset_delta`   | record `base_offset` − segment base offset |
//! | 4   | 4    | `position_bytes` | byte position of the record header in the `.log` |
//! | 8   | 8    | `timestamp_us`   | the record's append timestamp |
//!
//! The index is derived data. The log is the truth: at open the index is recomputed from the
//! verified log, and a `.index` that is missing, short, long, torn or different is rebuilt
//! (staging file, fsync, rename, directory fsync; never patched in place). Appends write the
//! entry after the record, so the file may lag the log after a crash; that is repaired the
//! same way.
//!
//! Invariants of [`SegmentIndex`] entries: `offset_delta` strictly increasing, `position_bytes`
//! strictly increasing, `timestamp_us` non-decreasing (the log clamps append timestamps).

use crate::record::ScannedRecord;

pub const INDEX_ENTRY_SIZE: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    pub offset_delta: u32,
    pub position_bytes: u32,
    pub timestamp_us: u64,
}

impl IndexEntry {
    pub fn encode(&self) -> [u8; INDEX_ENTRY_SIZE] {
        let mut bytes = [0u8; INDEX_ENTRY_SIZE];
        bytes[0..4].copy_from_slice(&self.offset_delta.to_le_bytes());
        bytes[4..8].copy_from_slice(&self.position_bytes.to_le_bytes());
        bytes[8..16].copy_from_slice(&self.timestamp_us.to_le_bytes());
        bytes
    }

    /// The entry of a scanned record of the segment based at `segment_base_offset`, or `None`
    /// if the delta or position does not fit 32 bits (not a segment this engine wrote).
    pub fn from_record(segment_base_offset: u64, record: &ScannedRecord) -> Option<IndexEntry> {
        let delta = record.base_offset.checked_sub(segment_base_offset)?;
        Some(IndexEntry {
            offset_delta: u32::try_from(delta).ok()?,
            position_bytes: u32::try_from(record.position_bytes).ok()?,
            timestamp_us: record.timestamp_us,
        })
    }
}

/// Encode entries back to back, as the `.index` file holds them.
pub fn encode_all(entries: &[IndexEntry]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(entries.len() * INDEX_ENTRY_SIZE);
    for entry in entries {
        bytes.extend_from_slice(&entry.encode());
    }
    bytes
}

/// The in-memory index of one segment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SegmentIndex {
    entries: Vec<IndexEntry>,
}

impl SegmentIndex {
    pub fn new(entries: Vec<IndexEntry>) -> SegmentIndex {
        let index = SegmentIndex { entries };
        debug_assert!(index.check_invariants());
        index
    }

    pub fn entries(&self) -> &[IndexEntry] {
        &self.entries
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn push(&mut self, entry: IndexEntry) {
        if let Some(last) = self.entries.last() {
            debug_assert!(entry.offset_delta > last.offset_delta);
            debug_assert!(entry.position_bytes > last.position_bytes);
            debug_assert!(entry.timestamp_us >= last.timestamp_us);
        }
        self.entries.push(entry);
    }

    /// The entry of the record holding `offset_delta`: the last entry whose delta is <= it
    /// (entry 0 when `offset_delta` precedes every entry). `None` if empty.
    pub fn find_offset(&self, offset_delta: u64) -> Option<usize> {
        if self.entries.is_empty() {
            return None;
        }
        let after = self
            .entries
            .partition_point(|entry| u64::from(entry.offset_delta) <= offset_delta);
        Some(after.saturating_sub(1))
    }

    /// The first entry with `timestamp_us >= timestamp_us`, if any.
    pub fn find_timestamp(&self, timestamp_us: u64) -> Option<usize> {
        let index = self
            .entries
            .partition_point(|entry| entry.timestamp_us < timestamp_us);
        (index < self.entries.len()).then_some(index)
    }

    /// O(n): the ordering invariants (for asserts and tests).
    pub fn check_invariants(&self) -> bool {
        self.entries.windows(2).all(|pair| {
            pair[1].offset_delta > pair[0].offset_delta
                && pair[1].position_bytes > pair[0].position_bytes
                && pair[1].timestamp_us >= pair[0].timestamp_us
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(offset_delta: u32, position_bytes: u32, timestamp_us: u64) -> IndexEntry {
        IndexEntry {
            offset_delta,
            position_bytes,
            timestamp_us,
        }
    }

    #[test]
    fn lookups() {
        let index = SegmentIndex::new(vec![
            entry(0, 0, 10),
            entry(3, 100, 20),
            entry(5, 300, 20),
            entry(9, 400, 30),
        ]);
        assert_eq!(index.find_offset(0), Some(0));
        assert_eq!(index.find_offset(2), Some(0));
        assert_eq!(index.find_offset(3), Some(1));
        assert_eq!(index.find_offset(8), Some(2));
        assert_eq!(index.find_offset(1_000), Some(3));
        assert_eq!(index.find_timestamp(0), Some(0));
        assert_eq!(index.find_timestamp(11), Some(1));
        assert_eq!(index.find_timestamp(20), Some(1));
        assert_eq!(index.find_timestamp(30), Some(3));
        assert_eq!(index.find_timestamp(31), None);
        assert_eq!(SegmentIndex::default().find_offset(0), None);
        assert_eq!(encode_all(index.entries()).len(), 4 * INDEX_ENTRY_SIZE);
        assert!(index.check_invariants());
    }
}
