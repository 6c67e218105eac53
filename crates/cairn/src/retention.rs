//! Retention: deleting whole sealed segments by age (`message_expiry`) and by topic size
//! (`max_topic_size`), on a timer, plus the DeleteSegments request's deletion.
//!
//! Only sealed segments are ever deleted (never a partition's active segment), always the
//! oldest first, through [`crate::partition::PartitionData::delete_oldest_segments`]:
//! retention proposes a TRIM op to the partition's group (it commits like any op: the
//! messages below the new start offset are no longer served), and then the segment files
//! the group no longer needs are removed (after a checkpoint when the group's last one is
//! older). A pass that finds nothing to delete adds no op.
//!
//! Rules (checked every `storage.retention_interval_ms`, with the server's clock):
//! - `message_expiry` (µs; 0 and `u64::MAX` = never): a sealed segment whose newest message's
//!   append timestamp is older than `now - message_expiry` is deleted (a sealed segment with
//!   no message, sealed by an offset gap, counts as expired).
//! - `max_topic_size` (bytes; 0 = server default = unlimited, `u64::MAX` = unlimited): while
//!   the topic's stored size (every segment file, op records included) exceeds it, the sealed segment with the
//!   oldest newest-message among the topic's partitions is deleted. The active segments are
//!   never deleted, so a topic can stay above its limit by up to their size.

use crate::catalog::{Catalog, Partition};
use crate::partition::{lock, serving, serving_verified};
use cairn_storage::journal::JournalSegment;
use std::sync::{Arc, RwLock};

/// Why segments were deleted (for the log line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// A DeleteSegments request.
    Request,
    MessageExpiry,
    MaxTopicSize,
}

impl Reason {
    fn as_str(self) -> &'static str {
        match self {
            Reason::Request => "delete_segments request",
            Reason::MessageExpiry => "message_expiry",
            Reason::MaxTopicSize => "max_topic_size",
        }
    }
}

/// Which segments a deletion takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Selection {
    /// The oldest `n` sealed retained segments (fewer if fewer are sealed).
    Oldest(usize),
    /// Every segment up to the sealed retained segment ending at this offset, as a retention
    /// pass decided; nothing if no such segment is left.
    Through(u64),
}

/// Delete the segments `selection` names: one TRIM op of the partition's group releases
/// their messages, then the files the group no longer needs go; one lock hold for all of
/// it, each removed segment logged. Errors are Iggy statuses.
pub fn delete_segments(
    partition: &Partition,
    selection: Selection,
    reason: Reason,
) -> Result<Vec<JournalSegment>, u32> {
    let mut state = lock(&partition.state);
    let data = serving(&mut state)?;
    let removed = match selection {
        Selection::Oldest(count) => data.delete_oldest_segments(count),
        Selection::Through(end_offset) => data.delete_segments_through(end_offset),
    };
    let removed = removed.inspect_err(|status| {
        tracing::error!(
            partition_dir = %partition.dir.display(),
            status,
            reason = reason.as_str(),
            "deleting segments failed: if the trim was committed its messages are no longer served and the next \
             removal or start removes their files; otherwise nothing changed"
        );
    })?;
    let start_offset = data.start_offset();
    drop(state);
    for segment in &removed {
        tracing::info!(
            partition_dir = %partition.dir.display(),
            segment_first_op = segment.first_op,
            segment_base_offset = segment.base_offset,
            segment_end_offset = segment.end_offset,
            messages = segment.end_offset - segment.base_offset,
            bytes = segment.size_bytes,
            reason = reason.as_str(),
            retained_start_offset = start_offset,
            "deleted segment"
        );
    }
    Ok(removed)
}

/// Whether a topic setting means "no limit".
fn unlimited(value: u64) -> bool {
    value == 0 || value == u64::MAX
}

/// One retention pass over every topic, at `now_us`.
pub fn enforce(catalog: &RwLock<Catalog>, now_us: u64) {
    let topics: Vec<(u64, u64, Vec<Arc<Partition>>)> = {
        let catalog = match catalog.read() {
            Ok(guard) => guard,
            Err(poisoned) => panic!("catalog lock poisoned by an earlier panic: {poisoned}"),
        };
        catalog
            .all_topics()
            .filter(|topic| {
                !unlimited(topic.doc.message_expiry_us) || !unlimited(topic.doc.max_topic_size_bytes)
            })
            .map(|topic| {
                (
                    topic.doc.message_expiry_us,
                    topic.doc.max_topic_size_bytes,
                    topic.partitions.to_vec(),
                )
            })
            .collect()
    };
    for (expiry_us, max_size_bytes, partitions) in topics {
        if !unlimited(expiry_us) {
            let cutoff_us = now_us.saturating_sub(expiry_us);
            for partition in &partitions {
                expire(partition, cutoff_us);
            }
        }
        if !unlimited(max_size_bytes) {
            shrink(&partitions, max_size_bytes);
        }
    }
}

/// Delete the partition's oldest sealed segments whose newest message is older than
/// `cutoff_us` (or that hold none): one trim through the last of them.
fn expire(partition: &Partition, cutoff_us: u64) {
    let expired_through = {
        let mut state = lock(&partition.state);
        let Some(data) = serving_verified(&mut state) else {
            return;
        };
        data.sealed_retained_segments()
            .iter()
            .take_while(|segment| segment.newest_timestamp_us.is_none_or(|t| t < cutoff_us))
            .last()
            .map(|segment| segment.end_offset)
    };
    // The deletion checks again, under its own lock hold, that a segment still ends there
    // (a DeleteSegments or a purge in between makes it trim nothing more than was decided).
    if let Some(end_offset) = expired_through {
        let _ = delete_segments(partition, Selection::Through(end_offset), Reason::MessageExpiry);
    }
}

/// Delete the topic's oldest sealed segments (by newest message, across partitions) until its
/// size is within `max_size_bytes` or no sealed segment is left.
fn shrink(partitions: &[Arc<Partition>], max_size_bytes: u64) {
    loop {
        let mut size_bytes = 0u64;
        // (partition, newest timestamp, end offset) of the oldest deletable segment.
        let mut oldest: Option<(usize, u64, u64)> = None;
        for (position, partition) in partitions.iter().enumerate() {
            let mut state = lock(&partition.state);
            let Some(data) = serving_verified(&mut state) else {
                continue;
            };
            size_bytes = size_bytes.saturating_add(data.stats().size_bytes);
            if let Some(segment) = data.sealed_retained_segments().first() {
                let newest_us = segment.newest_timestamp_us.unwrap_or(0);
                if oldest.is_none_or(|(_, best_us, _)| newest_us < best_us) {
                    oldest = Some((position, newest_us, segment.end_offset));
                }
            }
        }
        if size_bytes <= max_size_bytes {
            return;
        }
        let Some((position, _, end_offset)) = oldest else {
            return;
        };
        let deleted = delete_segments(
            &partitions[position],
            Selection::Through(end_offset),
            Reason::MaxTopicSize,
        );
        if !matches!(deleted, Ok(d) if !d.is_empty()) {
            return;
        }
    }
}
