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
//! The same module holds the pass started at boot over the log prefixes a start took from
//! segment summaries unread ([`verify_prefixes`]).
//!
//! The scrub reads a segment without the partition's lock (a sealed segment's bytes do not
//! change); the lock is taken only to list the segments and, on a finding, to check the
//! segment is still the one that was read before refusing. A partition whose log prefix is
//! still unverified is left to the boot pass. The boot pass reads under the lock (see
//! [`verify_prefixes`]).

use crate::catalog::{Catalog, Partition};
use crate::partition::{PartitionState, lock, serving, serving_verified};
use cairn_storage::StorageError;
use cairn_storage::journal::{self, SealedSegment};
use std::sync::RwLock;
use std::time::Duration;

/// What one pass did, for the log line and the tests.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ScrubTotals {
    pub segments_verified: u64,
    pub bytes_verified: u64,
    /// Segments that could not be read (an IO error, or removed while read): the next pass
    /// reads them again.
    pub segments_unread: u64,
    /// Partitions found damaged: refused on a node of one, set aside and rebuilt from their
    /// peers on a node of a cluster (`partition::refuse_for_damage`).
    pub partitions_damaged: u64,
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
        let Some(data) = serving_verified(&mut state) else {
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
                    totals.partitions_damaged += 1;
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

/// What the boot pass over unverified log prefixes did, for its log line.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PrefixTotals {
    pub partitions_verified: u64,
    pub bytes_verified: u64,
    pub partitions_refused: u64,
    /// The pass stopped early (the server is stopping).
    pub interrupted: bool,
}

/// The pass started at boot: a start takes the prefix of the segment each partition is
/// writing from the summary last written of it (at a clean stop, or as it grew), without
/// reading it, and a partition verifies that prefix before it serves its first request
/// ([`serving`]). This pass verifies them all in the background, one partition at a time
/// under its lock (a request meanwhile would have to verify the same bytes), so that damage
/// there is refused soon after the start whatever requests come, and the first requests find
/// the work done. `stopping` is asked between partitions.
pub fn verify_prefixes(catalog: &RwLock<Catalog>, stopping: &dyn Fn() -> bool) -> PrefixTotals {
    let mut totals = PrefixTotals::default();
    for partition in crate::catalog::all_partitions(catalog) {
        if stopping() {
            totals.interrupted = true;
            break;
        }
        let mut state = lock(&partition.state);
        let Some(bytes) = (match &*state {
            PartitionState::Serving(data) => data.unverified_prefix_bytes(),
            _ => None,
        }) else {
            continue;
        };
        let verified = serving(&mut state).is_ok();
        if verified {
            totals.partitions_verified += 1;
            totals.bytes_verified += bytes;
        } else if matches!(&*state, PartitionState::Refused { .. }) {
            // Damage, or an error reading the prefix: logged by `serving`.
            totals.partitions_refused += 1;
        }
    }
    totals
}

/// The log line of [`verify_prefixes`].
pub fn log_prefixes_verified(totals: PrefixTotals, took: Duration) {
    if totals == PrefixTotals::default() {
        return;
    }
    tracing::info!(
        partitions_verified = totals.partitions_verified,
        bytes_verified = totals.bytes_verified,
        partitions_refused = totals.partitions_refused,
        interrupted = totals.interrupted,
        took_ms = took.as_millis() as u64,
        "verified the log prefixes the start took from segment summaries"
    );
}
