//! Retention: deleting whole sealed segments by age (`message_expiry`) and by topic size
//! (`max_topic_size`), on a timer, plus the DeleteSegments request's deletion.
//!
//! Only sealed segments are ever deleted (never a partition's active segment), always the
//! oldest first, through [`crate::partition::PartitionData::delete_oldest_segments`] (the
//! log advances `start.meta` before removing files). Each deletion takes the partition lock for one
//! segment only, so sends to the partition wait at most one deletion (one `start.meta` write
//! and two unlinks).
//!
//! Rules (checked every `storage.retention_interval_ms`, with the server's clock):
//! - `message_expiry` (µs; 0 and `u64::MAX` = never): a sealed segment whose newest message's
//!   append timestamp is older than `now - message_expiry` is deleted (a sealed segment with
//!   no message, sealed by an offset gap, counts as expired).
//! - `max_topic_size` (bytes; 0 = server default = unlimited, `u64::MAX` = unlimited): while
//!   the topic's stored size (every segment's `.log`) exceeds it, the sealed segment with the
//!   oldest newest-message among the topic's partitions is deleted. The active segments are
//!   never deleted, so a topic can stay above its limit by up to their size.

use crate::catalog::{Catalog, Partition};
use crate::partition::{lock, serving};
use cairn_storage::log::SegmentInfo;
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

/// Delete the oldest `count` sealed segments of `partition` (fewer if fewer are sealed), one
/// lock hold for all of them, and log each. Errors are Iggy statuses.
pub fn delete_segments(partition: &Partition, count: usize, reason: Reason) -> Result<Vec<SegmentInfo>, u32> {
    let mut state = lock(&partition.state);
    let data = serving(&mut state)?;
    let deleted = data.delete_oldest_segments(count).map_err(|error| {
        tracing::error!(
            partition_dir = %partition.dir.display(),
            %error,
            reason = reason.as_str(),
            "deleting segments failed: the segments are still served; if the new start marker reached the disk \
             before the failure, the next start removes them"
        );
        cairn_wire::codes::ERROR
    })?;
    let start_offset = data.start_offset();
    drop(state);
    for info in &deleted {
        tracing::info!(
            partition_dir = %partition.dir.display(),
            segment_base_offset = info.base_offset,
            segment_end_offset = info.end_offset,
            messages = info.messages_count,
            bytes = info.size_bytes,
            reason = reason.as_str(),
            retained_start_offset = start_offset,
            "deleted segment"
        );
    }
    Ok(deleted)
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

/// Delete the partition's oldest sealed segments while their newest message is older than
/// `cutoff_us`, one lock hold per segment.
fn expire(partition: &Partition, cutoff_us: u64) {
    loop {
        let expired = {
            let mut state = lock(&partition.state);
            let Ok(data) = serving(&mut state) else {
                return;
            };
            data.oldest_sealed_segment()
                .is_some_and(|oldest| oldest.newest_timestamp_us.is_none_or(|t| t < cutoff_us))
        };
        // A send may seal another segment in between; deleting the oldest one is still right
        // (it is older than the one just checked, or the same one).
        if !expired || !matches!(delete_segments(partition, 1, Reason::MessageExpiry), Ok(d) if !d.is_empty())
        {
            return;
        }
    }
}

/// Delete the topic's oldest sealed segments (by newest message, across partitions) until its
/// size is within `max_size_bytes` or no sealed segment is left.
fn shrink(partitions: &[Arc<Partition>], max_size_bytes: u64) {
    loop {
        let mut size_bytes = 0u64;
        let mut oldest: Option<(usize, u64)> = None;
        for (position, partition) in partitions.iter().enumerate() {
            let mut state = lock(&partition.state);
            let Ok(data) = serving(&mut state) else {
                continue;
            };
            size_bytes = size_bytes.saturating_add(data.stats().size_bytes);
            if let Some(segment) = data.oldest_sealed_segment() {
                let newest_us = segment.newest_timestamp_us.unwrap_or(0);
                if oldest.is_none_or(|(_, best_us)| newest_us < best_us) {
                    oldest = Some((position, newest_us));
                }
            }
        }
        if size_bytes <= max_size_bytes {
            return;
        }
        let Some((position, _)) = oldest else {
            return;
        };
        if !matches!(delete_segments(&partitions[position], 1, Reason::MaxTopicSize), Ok(d) if !d.is_empty())
        {
            return;
        }
    }
}
