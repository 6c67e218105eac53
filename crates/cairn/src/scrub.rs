//! The scrub: a background pass that reads every sealed segment of every serving partition
//! in full and verifies it, on a timer (`storage.scrub_interval_ms`).
//!
//! A start takes sealed segments from their summaries without reading them (boot cost does
//! not grow with the retained data), and polls verify every record they read; the scrub is
//! what finds damage in data nobody reads. It refuses damage the way a start does: the
//! partition stops serving (every request gets 3003), its files are left as they are, and
//! the damaged segment's summary is removed, so every later start reads that segment again
//! and refuses the partition too, until an operator acts.
//!
//! A segment is read without the partition's lock (a sealed segment's bytes do not change);
//! the lock is taken only to list the segments and, on a finding, to check the segment is
//! still the one that was read before refusing.

use crate::catalog::{Catalog, Partition};
use crate::partition::{PartitionState, lock, serving};
use cairn_storage::StorageError;
use cairn_storage::journal::{self, SealedSegment};
use std::sync::RwLock;

/// What one pass did, for the log line and the tests.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ScrubTotals {
    pub segments_verified: u64,
    pub bytes_verified: u64,
    /// Segments that could not be read (an IO error, or removed while read): the next pass
    /// reads them again.
    pub segments_unread: u64,
    pub partitions_refused: u64,
    /// The pass stopped early (the server is stopping).
    pub interrupted: bool,
}

/// One pass over every serving partition; `stopping` is asked between segments, and a
/// pass that sees it stops there (a stop must not wait for a pass over every byte).
pub fn scrub(catalog: &RwLock<Catalog>, stopping: &dyn Fn() -> bool) -> ScrubTotals {
    let partitions = crate::catalog::all_partitions(catalog);
    let mut totals = ScrubTotals::default();
    for partition in &partitions {
        scrub_partition(partition, &mut totals, stopping);
        if totals.interrupted {
            break;
        }
    }
    totals
}

fn scrub_partition(partition: &Partition, totals: &mut ScrubTotals, stopping: &dyn Fn() -> bool) {
    let (disk, segments) = {
        let mut state = lock(&partition.state);
        let Ok(data) = serving(&mut state) else {
            return;
        };
        data.sealed_segments()
    };
    for segment in segments {
        if stopping() {
            totals.interrupted = true;
            return;
        }
        match journal::verify_sealed(disk.as_ref(), &segment) {
            Ok(()) => {
                totals.segments_verified += 1;
                totals.bytes_verified += segment.len_bytes;
            }
            Err(error @ StorageError::Damaged { .. }) => {
                if refuse(partition, &segment, &error) {
                    totals.partitions_refused += 1;
                    return;
                }
            }
            Err(error) => {
                // Not a verdict on the bytes (removed by retention while it was read, or an
                // IO error): the next pass reads it again; a start takes it from its summary
                // meanwhile, and a poll that cannot read it fails.
                totals.segments_unread += 1;
                tracing::warn!(partition_dir = %partition.dir.display(), %error, "scrub could not read a sealed segment; the next pass tries again");
            }
        }
    }
}

/// Refuse `partition` for damage found in `segment`, if the segment is still the one read.
fn refuse(partition: &Partition, segment: &SealedSegment, error: &StorageError) -> bool {
    let mut state = lock(&partition.state);
    let still_held = matches!(&*state, PartitionState::Serving(data) if data.holds_sealed(segment));
    if still_held {
        crate::partition::refuse_for_damage(&mut state, &partition.dir, error, "the scrub");
    }
    still_held
}
