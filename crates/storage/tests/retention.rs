//! Deleting the oldest sealed segments (retention, DeleteSegments): what stays readable, what
//! open and `check` make of the result, and a crash between the marker and the deletion.

mod common;

use cairn_storage::check::{self, Verdict};
use cairn_storage::log::{LogConfig, PartitionLog, SyncMode, segment_log_name};
use common::*;
use std::path::Path;

const PARTITION: u32 = 5;

/// Append batches of 3 reference messages until `messages` are stored; the timestamp of the
/// batch starting at offset `o` is `1_000 + o`.
fn fill(log: &mut PartitionLog, messages: u64) {
    while log.next_offset() < messages {
        let count = 3.min(messages - log.next_offset()) as u32;
        let batch = reference_batch(log.next_offset(), count);
        log.append(&batch, 1_000 + log.next_offset()).unwrap();
    }
    log.commit().unwrap();
    assert!(log.check_invariants());
}

fn read_all(log: &PartitionLog, from_offset: u64) -> Vec<Message> {
    let mut out = Vec::new();
    let count = log.read(from_offset, u32::MAX, &mut out).unwrap();
    let messages = decode_batches(&out);
    assert_eq!(messages.len(), count as usize);
    messages
}

fn assert_reference(messages: &[Message], first_offset: u64, end_offset: u64) {
    assert_eq!(messages.len() as u64, end_offset - first_offset);
    for (i, message) in messages.iter().enumerate() {
        let offset = first_offset + i as u64;
        assert_eq!(message.offset, offset);
        assert_eq!(message.payload, payload_for(offset), "payload at {offset}");
    }
}

fn durable(segment_size_bytes: u64) -> LogConfig {
    LogConfig::new(segment_size_bytes, SyncMode::GroupCommit)
}

fn open(dir: &Path) -> PartitionLog {
    PartitionLog::open(dir, PARTITION, durable(2_000)).unwrap()
}

fn assert_healthy(dir: &Path) {
    // A partition directory of the server also holds its consumer offsets.
    std::fs::create_dir_all(dir.join("offsets")).unwrap();
    let report = check::check_partition(dir, PARTITION).unwrap();
    assert_eq!(report.verdict(), Verdict::Healthy, "{report}");
}

#[test]
fn deletes_the_oldest_sealed_segments_and_never_the_active_one() {
    let tmp = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::create(tmp.path(), PARTITION, durable(2_000)).unwrap();
    fill(&mut log, 200);
    let sealed = log.sealed_segments();
    assert!(sealed.len() >= 4, "{sealed:?}");
    assert_eq!(sealed[0].base_offset, 0);
    for pair in sealed.windows(2) {
        assert_eq!(pair[0].end_offset, pair[1].base_offset);
    }
    for info in &sealed {
        assert_eq!(info.messages_count, info.end_offset - info.base_offset);
        // The newest message of a segment is in its last batch (1..=3 messages).
        let newest = info.newest_timestamp_us.unwrap();
        assert!(newest >= 1_000 + info.end_offset - 3 && newest < 1_000 + info.end_offset);
        let file_len = std::fs::metadata(tmp.path().join(segment_log_name(info.base_offset)))
            .unwrap()
            .len();
        assert_eq!(info.size_bytes, file_len);
    }
    let size_before = log.stats().size_bytes;

    let deleted = log.delete_oldest_segments(2).unwrap();
    assert_eq!(deleted, sealed[..2].to_vec());
    let start = sealed[2].base_offset;
    assert_eq!(log.start_offset(), start);
    assert_eq!(log.first_offset(), Some(start));
    assert_eq!(
        log.stats().size_bytes,
        size_before - sealed[0].size_bytes - sealed[1].size_bytes
    );
    assert_eq!(log.stats().messages_count, 200 - start);
    // A read below the retained start starts at the first retained message.
    assert_reference(&read_all(&log, 0), start, 200);
    assert_eq!(log.offset_at_timestamp(0).unwrap(), Some(start));
    assert!(!tmp.path().join(segment_log_name(0)).exists());

    // More than are sealed: every sealed one goes, the active one stays.
    let remaining = log.sealed_segments();
    let deleted = log.delete_oldest_segments(1_000).unwrap();
    assert_eq!(deleted, remaining);
    assert!(log.sealed_segments().is_empty());
    assert_eq!(log.stats().segments_count, 1);
    assert_eq!(log.delete_oldest_segments(1).unwrap(), Vec::new());
    let active_start = log.start_offset();
    assert_reference(&read_all(&log, 0), active_start, 200);
    fill(&mut log, 230);
    log.close().unwrap();
    assert_healthy(tmp.path());

    let mut log = open(tmp.path());
    assert_eq!(log.start_offset(), active_start);
    assert_eq!(log.next_offset(), 230);
    assert_reference(&read_all(&log, 0), active_start, 230);
    fill(&mut log, 300);
    log.delete_oldest_segments(1).unwrap();
    drop(log); // a crash
    let log = open(tmp.path());
    assert!(log.start_offset() > active_start);
    let start = log.start_offset();
    assert_reference(&read_all(&log, 0), start, log.next_offset().min(300));
    log.close().unwrap();
    assert_healthy(tmp.path());
}

#[test]
fn an_empty_active_segment_becomes_the_start() {
    // Rotation happens at the next append: after filling exactly, deleting every sealed
    // segment can leave the active segment as the only one, holding messages.
    let tmp = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::create(tmp.path(), PARTITION, durable(2_000)).unwrap();
    fill(&mut log, 100);
    log.delete_oldest_segments(usize::MAX).unwrap();
    log.purge().unwrap();
    fill(&mut log, 150);
    log.delete_oldest_segments(usize::MAX).unwrap();
    let start = log.start_offset();
    assert!(start > 100);
    log.close().unwrap();
    assert_healthy(tmp.path());
    let log = open(tmp.path());
    assert_reference(&read_all(&log, 0), start, 150);
}

#[test]
fn a_crash_between_the_marker_and_the_deletion_is_finished_at_open() {
    let tmp = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::create(tmp.path(), PARTITION, durable(2_000)).unwrap();
    fill(&mut log, 200);
    log.close().unwrap();
    let mut log = open(tmp.path());
    let before = snapshot(tmp.path());
    let sealed = log.sealed_segments();
    log.delete_oldest_segments(3).unwrap();
    drop(log);
    // The marker reached the disk, but none of the deletions did: put the old segment files
    // back (everything but `start.meta` and `state`, which the deletion wrote).
    for (file, bytes) in &before {
        if file.ends_with(".log") || file.ends_with(".index") {
            std::fs::write(tmp.path().join(file), bytes).unwrap();
        }
    }
    assert!(tmp.path().join(segment_log_name(0)).exists());
    let report = check::check_partition(tmp.path(), PARTITION).unwrap();
    assert_ne!(report.verdict(), Verdict::Damaged, "{report}");

    let log = open(tmp.path());
    let start = sealed[3].base_offset;
    assert_eq!(log.start_offset(), start);
    assert_reference(&read_all(&log, 0), start, 200);
    for info in &sealed[..3] {
        assert!(!tmp.path().join(segment_log_name(info.base_offset)).exists());
    }
    log.close().unwrap();
    assert_healthy(tmp.path());
}

#[test]
fn the_frontier_segment_is_committed_before_it_is_deleted() {
    // Relaxed mode: appends are not committed, so the frontier lags in an old segment.
    let tmp = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::create(tmp.path(), PARTITION, LogConfig::new(2_000, SyncMode::Os)).unwrap();
    log.commit().unwrap();
    while log.next_offset() < 150 {
        let batch = reference_batch(log.next_offset(), 3);
        log.append(&batch, 1_000 + log.next_offset()).unwrap();
    }
    assert_eq!(log.durable_next_offset(), 0);
    let sealed = log.sealed_segments();
    assert_eq!(log.delete_oldest_segments(2).unwrap(), sealed[..2].to_vec());
    assert_eq!(log.durable_next_offset(), 150);
    drop(log);
    let log = PartitionLog::open(tmp.path(), PARTITION, LogConfig::new(2_000, SyncMode::Os)).unwrap();
    assert_eq!(log.start_offset(), sealed[2].base_offset);
    assert_reference(&read_all(&log, 0), sealed[2].base_offset, 150);
}
