//! PartitionLog over real files: round trips, rotation, recovery, refusal, purge.

mod common;

use cairn_storage::StorageError;
use cairn_storage::io::{Disk, ReadFile, RealDisk, WriteFile};
use cairn_storage::log::{LogConfig, PartitionLog, ReadPart, SyncMode, segment_index_name, segment_log_name};
use cairn_storage::record::{self, Chain, RECORD_HEADER_SIZE, RecordHeader, RecordKind};
use common::*;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

const PARTITION: u32 = 3;

/// Append batches of 1..=5 reference messages until `messages` are stored.
/// Timestamps: 1000 * (batch number + 1).
fn fill(log: &mut PartitionLog, messages: u64) {
    let mut batch_number = 0u64;
    while log.next_offset() < messages {
        let count = (1 + batch_number % 5).min(messages - log.next_offset()) as u32;
        let batch = reference_batch(log.next_offset(), count);
        let expected_base = log.next_offset();
        let base = log.append(&batch, 1_000 * (batch_number + 1)).unwrap();
        assert_eq!(base, expected_base);
        batch_number += 1;
    }
    assert!(log.check_invariants());
}

/// Reads twice: into an empty buffer (the first record through a scratch buffer) and behind a
/// reply-sized prefix (every record read in place over the bytes before it); both must give
/// the same batches, leave the prefix intact and report the last offset.
fn read_all(log: &PartitionLog, from_offset: u64, max_messages: u32) -> Vec<Message> {
    let mut out = Vec::new();
    let count = log.read(from_offset, max_messages, &mut out).unwrap();
    let messages = decode_batches(&out);
    assert_eq!(messages.len(), count as usize);

    let prefix: Vec<u8> = (0..272u32).map(|i| (i % 251) as u8).collect();
    let mut prefixed = prefix.clone();
    let outcome = log.read_into(from_offset, max_messages, &mut prefixed).unwrap();
    assert_eq!(outcome.messages_count, count);
    assert_eq!(&prefixed[..prefix.len()], &prefix[..], "prefix kept");
    assert_eq!(&prefixed[prefix.len()..], &out[..], "same batches in place");
    assert_eq!(outcome.last_offset, messages.last().map(|message| message.offset));

    // As parts: whole batches as file ranges, cut ones in the buffer; the same bytes in order.
    let mut buffer = prefix.clone();
    let mut parts = Vec::new();
    let outcome = log
        .read_parts(from_offset, max_messages, &mut buffer, &mut parts)
        .unwrap();
    assert_eq!(outcome.messages_count, count);
    assert_eq!(&buffer[..prefix.len()], &prefix[..]);
    let mut joined = Vec::new();
    for part in &parts {
        assert!(!part.is_empty());
        match part {
            ReadPart::Buffer(range) => joined.extend_from_slice(&buffer[range.clone()]),
            ReadPart::File {
                file,
                position_bytes,
                len,
            } => {
                assert!(file.as_file().is_some());
                let at = joined.len();
                file.read_exact_at_into(*position_bytes, *len, &mut joined, at)
                    .unwrap();
            }
        }
    }
    assert_eq!(joined, out, "same batches as parts");
    messages
}

fn assert_reference(messages: &[Message], first_offset: u64, count: u64) {
    assert_eq!(messages.len() as u64, count, "message count from {first_offset}");
    for (i, message) in messages.iter().enumerate() {
        let offset = first_offset + i as u64;
        assert_eq!(message.offset, offset);
        assert_eq!(message.payload, payload_for(offset), "payload at {offset}");
    }
}

fn new_log(dir: &Path, segment_size_bytes: u64, messages: u64) -> PartitionLog {
    let mut log = PartitionLog::create(dir, PARTITION, config(segment_size_bytes)).unwrap();
    fill(&mut log, messages);
    log
}

fn open(dir: &Path) -> Result<PartitionLog, StorageError> {
    PartitionLog::open(dir, PARTITION, config(2_000))
}

#[test]
fn round_trip_across_rotations() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("p3");
    let log = new_log(&dir, 2_000, 300);
    assert_eq!(log.next_offset(), 300);
    assert_eq!(log.first_offset(), Some(0));
    let stats = log.stats();
    assert!(stats.segments_count >= 5, "{stats:?}");
    assert_eq!(stats.messages_count, 300);
    let log_bytes: u64 = log_files(&dir)
        .iter()
        .map(|path| std::fs::metadata(path).unwrap().len())
        .sum();
    assert_eq!(stats.size_bytes, log_bytes);
    assert_eq!(log_files(&dir).len() as u32, stats.segments_count);
    for path in log_files(&dir) {
        assert!(std::fs::metadata(&path).unwrap().len() <= 2_000);
    }
    let messages = read_all(&log, 0, u32::MAX);
    assert_reference(&messages, 0, 300);
    // Every message of a batch reports the batch's append timestamp; timestamps never decrease.
    assert!(
        messages
            .windows(2)
            .all(|pair| pair[0].timestamp_us <= pair[1].timestamp_us)
    );
    assert_eq!(messages[0].timestamp_us, 1_000);
}

#[test]
fn sub_ranges() {
    let tmp = tempfile::tempdir().unwrap();
    let log = new_log(tmp.path(), 1_500, 120);
    for from_offset in 0..125u64 {
        for max_messages in [1u32, 2, 3, 7, 40, 1_000] {
            let messages = read_all(&log, from_offset, max_messages);
            let expected = 120u64.saturating_sub(from_offset).min(u64::from(max_messages));
            assert_reference(&messages, from_offset, expected);
        }
    }
    assert_eq!(log.read(0, 0, &mut Vec::new()).unwrap(), 0);
    assert_eq!(log.read(u64::MAX, 10, &mut Vec::new()).unwrap(), 0);
}

#[test]
fn a_record_damaged_after_open_fails_the_read_and_keeps_the_prefix() {
    let tmp = tempfile::tempdir().unwrap();
    let log = new_log(tmp.path(), 1_000_000, 20);
    let path = log_files(tmp.path()).remove(0);
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    let prefix = vec![0xA5u8; 300];
    let mut out = prefix.clone();
    let error = log.read_into(0, 1_000, &mut out).unwrap_err();
    assert!(matches!(error, StorageError::Damaged { .. }), "{error}");
    assert_eq!(&out[..prefix.len()], &prefix[..]);
    // The records before the damaged one are whole batches.
    decode_batches(&out[prefix.len()..]);
}

#[test]
fn reopen_returns_the_same_data_and_continues() {
    let tmp = tempfile::tempdir().unwrap();
    let log = new_log(tmp.path(), 2_000, 200);
    let before = read_all(&log, 0, u32::MAX);
    let stats = log.stats();
    log.close().unwrap();

    // A clean stop collapsed the offset reservation: the reopened log continues without a gap.
    let mut log = open(tmp.path()).unwrap();
    assert_eq!(log.next_offset(), 200);
    assert_eq!(log.stats(), stats);
    assert_eq!(read_all(&log, 0, u32::MAX), before);
    fill(&mut log, 260);
    log.close().unwrap();

    // The chain continued across the reopen: the next open verifies it end to end.
    let log = open(tmp.path()).unwrap();
    assert_eq!(log.next_offset(), 260);
    assert_reference(&read_all(&log, 0, u32::MAX), 0, 260);
}

#[test]
fn every_append_sync_mode_and_a_batch_larger_than_a_segment() {
    let tmp = tempfile::tempdir().unwrap();
    let config = LogConfig::new(1_000, SyncMode::EveryAppend);
    let mut log = PartitionLog::create(tmp.path(), PARTITION, config).unwrap();
    fill(&mut log, 10);
    let segments_before = log.stats().segments_count;
    let big = reference_batch(10, 40);
    assert!(big.len() > 1_000);
    assert_eq!(log.append(&big, 5).unwrap(), 10);
    let small = reference_batch(50, 1);
    assert_eq!(log.append(&small, 5).unwrap(), 50);
    // The big batch went alone into a fresh segment, and the next one into another.
    assert_eq!(log.stats().segments_count, segments_before + 2);
    log.flush().unwrap();
    drop(log);
    let log = PartitionLog::open(tmp.path(), PARTITION, config).unwrap();
    assert_reference(&read_all(&log, 0, u32::MAX), 0, 51);
}

/// Size of a gap record (64-byte envelope + 16-byte body).
const GAP_RECORD_SIZE: u64 = (RECORD_HEADER_SIZE + record::GAP_BODY_SIZE) as u64;

/// A snapshot without the state file (which every open rewrites: it arms the log).
fn without_state(
    mut files: std::collections::BTreeMap<String, Vec<u8>>,
) -> std::collections::BTreeMap<String, Vec<u8>> {
    files.remove("state");
    files
}

fn last_log_file(dir: &Path) -> std::path::PathBuf {
    log_files(dir).pop().unwrap()
}

/// Record boundaries of a `.log` (via the pure scan, starting anywhere in the chain).
fn record_ends(bytes: &[u8]) -> Vec<u64> {
    let mut ends = Vec::new();
    let mut position = 0usize;
    while position < bytes.len() {
        let header = record::decode(&bytes[position..]).unwrap();
        position += header.record_size_bytes() as usize;
        ends.push(position as u64);
    }
    ends
}

#[test]
fn torn_tails_are_truncated_and_the_log_continues() {
    let tmp = tempfile::tempdir().unwrap();
    let reference = tmp.path().join("reference");
    let log = new_log(&reference, 3_000, 60);
    let reserved = log.offset_reserved();
    assert!(reserved > 60);
    drop(log);
    let last = last_log_file(&reference);
    let last_bytes = std::fs::read(&last).unwrap();
    let ends = record_ends(&last_bytes);
    assert!(ends.len() >= 3);
    let last_record_start = ends[ends.len() - 2];
    let last_record_size = last_bytes.len() as u64 - last_record_start;
    let lost_messages = u64::from(
        record::decode(&last_bytes[last_record_start as usize..])
            .unwrap()
            .message_count,
    );

    type Damage = Box<dyn Fn(&[u8]) -> (Vec<u8>, u64)>;
    let whole = last_bytes.len() as u64;
    let cases: Vec<(&str, Damage)> = vec![
        (
            "cut in the header",
            Box::new(move |b| (b[..last_record_start as usize + 10].to_vec(), lost_messages)),
        ),
        (
            "cut in the batch",
            Box::new(move |b| {
                (
                    b[..(last_record_start + last_record_size / 2) as usize].to_vec(),
                    lost_messages,
                )
            }),
        ),
        (
            "cut one byte short",
            Box::new(move |b| (b[..whole as usize - 1].to_vec(), lost_messages)),
        ),
        (
            "half a record appended",
            Box::new(move |b| {
                let mut v = b.to_vec();
                v.extend_from_slice(&b[last_record_start as usize..][..(last_record_size / 2) as usize]);
                (v, 0)
            }),
        ),
        (
            "garbage appended",
            Box::new(|b| {
                let mut v = b.to_vec();
                v.extend((0..5_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8));
                (v, 0)
            }),
        ),
        (
            "zeros appended",
            Box::new(|b| {
                let mut v = b.to_vec();
                v.extend(std::iter::repeat_n(0u8, 4_096));
                (v, 0)
            }),
        ),
        (
            "bit flip in the offset field of the last record",
            Box::new(move |b| {
                let mut v = b.to_vec();
                v[last_record_start as usize + 40] ^= 0x04;
                (v, lost_messages)
            }),
        ),
        (
            "bit flip in the batch of the last record",
            Box::new(move |b| {
                let mut v = b.to_vec();
                v[(last_record_start + RECORD_HEADER_SIZE as u64 + 300) as usize] ^= 0x01;
                (v, lost_messages)
            }),
        ),
    ];
    for (name, damage) in cases {
        let dir = tmp.path().join(name.replace(' ', "_"));
        std::fs::create_dir(&dir).unwrap();
        for (file, bytes) in snapshot(&reference) {
            std::fs::write(dir.join(file), bytes).unwrap();
        }
        let (torn, lost) = damage(&last_bytes);
        let torn_file = last_log_file(&dir);
        std::fs::write(&torn_file, &torn).unwrap();

        // The reference log was dropped without `close` (an unclean stop) and never committed:
        // every byte lies above the frontier, so a failure is a torn tail. Minting resumes at
        // the offset reservation, behind a gap record sealing the truncated segment.
        let mut log = open(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
        let recovered_end = 60 - lost;
        assert_eq!(log.next_offset(), reserved, "{name}");
        let expected_len = if lost == 0 { whole } else { last_record_start };
        assert_eq!(
            std::fs::metadata(&torn_file).unwrap().len(),
            expected_len + GAP_RECORD_SIZE,
            "{name}"
        );
        assert_reference(&read_all(&log, 0, u32::MAX), 0, recovered_end);
        let batch = reference_batch(reserved, 3);
        assert_eq!(log.append(&batch, 1).unwrap(), reserved);
        log.close().unwrap();
        let log = open(&dir).unwrap();
        assert_eq!(
            log.next_offset(),
            reserved + 3,
            "{name}: no gap after a clean stop"
        );
        assert_reference(
            &read_all(&log, 0, u32::MAX)[..recovered_end as usize],
            0,
            recovered_end,
        );
        assert_reference(&read_all(&log, recovered_end, u32::MAX), reserved, 3);
    }
}

#[test]
fn missing_empty_torn_or_wrong_indexes_are_rebuilt() {
    let tmp = tempfile::tempdir().unwrap();
    let reference = tmp.path().join("reference");
    new_log(&reference, 2_000, 100).close().unwrap();
    let full = snapshot(&reference);
    let good = without_state(full.clone());
    let first_index = segment_index_name(0);
    let last_index = {
        let last = last_log_file(&reference);
        last.with_extension("index")
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .to_string()
    };
    type Damage = Box<dyn Fn(&Path)>;
    let cases: Vec<(&str, Damage)> = vec![
        (
            "missing",
            Box::new({
                let f = first_index.clone();
                move |d| std::fs::remove_file(d.join(&f)).unwrap()
            }),
        ),
        (
            "missing last",
            Box::new({
                let f = last_index.clone();
                move |d| std::fs::remove_file(d.join(&f)).unwrap()
            }),
        ),
        (
            "empty",
            Box::new({
                let f = first_index.clone();
                move |d| std::fs::write(d.join(&f), b"").unwrap()
            }),
        ),
        (
            "torn",
            Box::new({
                let f = first_index.clone();
                move |d| {
                    let bytes = std::fs::read(d.join(&f)).unwrap();
                    std::fs::write(d.join(&f), &bytes[..bytes.len() - 7]).unwrap();
                }
            }),
        ),
        (
            "zeroed",
            Box::new({
                let f = last_index.clone();
                move |d| {
                    let len = std::fs::metadata(d.join(&f)).unwrap().len() as usize;
                    std::fs::write(d.join(&f), vec![0u8; len]).unwrap();
                }
            }),
        ),
        (
            "too long",
            Box::new({
                let f = last_index.clone();
                move |d| {
                    let mut bytes = std::fs::read(d.join(&f)).unwrap();
                    bytes.extend_from_slice(&[1u8; 32]);
                    std::fs::write(d.join(&f), bytes).unwrap();
                }
            }),
        ),
        (
            "stale staging file",
            Box::new(|d| std::fs::write(d.join("00000000000000000000.index.tmp"), b"x").unwrap()),
        ),
    ];
    for (name, damage) in cases {
        let dir = tmp.path().join(name.replace(' ', "_"));
        std::fs::create_dir(&dir).unwrap();
        for (file, bytes) in &full {
            std::fs::write(dir.join(file), bytes).unwrap();
        }
        damage(&dir);
        let log = open(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(log.next_offset(), 100, "{name}");
        assert_reference(&read_all(&log, 37, u32::MAX), 37, 63);
        assert_eq!(log.offset_at_timestamp(0).unwrap(), Some(0));
        drop(log);
        assert_eq!(
            without_state(snapshot(&dir)),
            good,
            "{name}: rebuilt index identical to the original"
        );
    }
}

fn assert_refused(dir: &Path, expected_path: &Path, expected_position: Option<u64>) {
    let before = snapshot(dir);
    for _ in 0..2 {
        match open(dir) {
            Err(StorageError::Damaged {
                path,
                position,
                reason,
            }) => {
                assert_eq!(path, expected_path, "{reason}");
                if let Some(expected_position) = expected_position {
                    assert_eq!(position, expected_position, "{reason}");
                }
            }
            Err(other) => panic!("expected Damaged, got {other}"),
            Ok(log) => panic!("expected Damaged, opened at next offset {}", log.next_offset()),
        }
        assert_eq!(snapshot(dir), before, "a refused open changes nothing");
    }
}

#[test]
fn bit_flip_in_the_middle_is_refused_and_files_are_untouched() {
    for segment_choice in ["first", "last"] {
        let tmp = tempfile::tempdir().unwrap();
        let mut log = new_log(tmp.path(), 3_000, 80);
        // Make sure the last segment holds at least three records too.
        while record_ends(&std::fs::read(last_log_file(tmp.path())).unwrap()).len() < 3 {
            let batch = reference_batch(log.next_offset(), 1);
            log.append(&batch, 1).unwrap();
        }
        drop(log);
        let files = log_files(tmp.path());
        let target = if segment_choice == "first" {
            files[0].clone()
        } else {
            files[files.len() - 1].clone()
        };
        let mut bytes = std::fs::read(&target).unwrap();
        let ends = record_ends(&bytes);
        assert!(ends.len() >= 3);
        let middle_start = ends[0];
        bytes[(middle_start + 100) as usize] ^= 0x20;
        std::fs::write(&target, &bytes).unwrap();
        assert_refused(tmp.path(), &target, Some(middle_start));
    }
}

/// A checksum-valid record continuing (or deliberately not continuing) the chain at the end of
/// the last segment.
fn forged_record(dir: &Path, tweak: impl Fn(&mut Chain), timestamp_us: u64) -> Vec<u8> {
    let files = log_files(dir);
    // Walk the whole log to learn the chain at its end.
    let mut chain = Chain::genesis(PARTITION);
    for path in &files {
        let result = record::scan(&std::fs::read(path).unwrap(), chain);
        chain = result.end;
    }
    tweak(&mut chain);
    let mut batch = reference_batch(chain.next_offset, 2);
    cairn_wire::batch::stamp(
        &mut batch,
        u64::from(chain.partition_id),
        chain.next_offset,
        timestamp_us,
    );
    let mut header = RecordHeader {
        kind: RecordKind::Batch,
        checksum: 0,
        parent_checksum: chain.parent_checksum,
        op: chain.next_op,
        view: 0,
        partition_id: chain.partition_id,
        base_offset: chain.next_offset,
        message_count: 2,
        batch_length_bytes: batch.len() as u32,
        timestamp_us,
    };
    let mut record = header.seal(&batch).to_vec();
    record.extend_from_slice(&batch);
    record
}

#[test]
fn checksum_valid_foreign_or_non_continuing_records_are_refused() {
    type Tweak = fn(&mut Chain);
    let tweaks: Vec<(&str, Tweak)> = vec![
        ("control: a proper continuation", |_| {}),
        ("foreign partition", |c| c.partition_id += 1),
        ("offset gap", |c| c.next_offset += 5),
        ("offset overlap", |c| c.next_offset -= 1),
        ("wrong parent", |c| c.parent_checksum ^= 0xff),
        ("wrong op", |c| c.next_op += 1),
        ("timestamp back in time", |_| {}),
    ];
    for (name, tweak) in tweaks {
        let tmp = tempfile::tempdir().unwrap();
        let log = new_log(tmp.path(), 3_000, 40);
        let reserved = log.offset_reserved();
        drop(log);
        let timestamp_us = if name.contains("timestamp") { 1 } else { 99_999_999 };
        let record = forged_record(tmp.path(), tweak, timestamp_us);
        let last = last_log_file(tmp.path());
        let mut bytes = std::fs::read(&last).unwrap();
        let position = bytes.len() as u64;
        bytes.extend_from_slice(&record);
        std::fs::write(&last, &bytes).unwrap();
        if name.starts_with("control") {
            // The forging helper itself is right: a proper continuation is adopted.
            let log = open(tmp.path()).unwrap();
            assert_reference(&read_all(&log, 0, u32::MAX)[..40], 0, 40);
            assert_eq!(read_all(&log, 40, u32::MAX).len(), 2);
            assert_eq!(
                log.next_offset(),
                reserved,
                "an unclean stop resumes at the reservation"
            );
        } else {
            assert_refused(tmp.path(), &last, Some(position));
        }
    }
}

/// After a clean stop the reservation is collapsed to the log end, so a checksum-valid record
/// that continues the chain was not written by this partition's writer: refused, and the
/// refusal names the record's file and byte position (not the state file).
#[test]
fn a_continuing_record_beyond_the_reservation_after_a_clean_stop_is_refused_at_its_position() {
    let tmp = tempfile::tempdir().unwrap();
    new_log(tmp.path(), 3_000, 40).close().unwrap();
    let record = forged_record(tmp.path(), |_| {}, 99_999_999);
    let last = last_log_file(tmp.path());
    let mut bytes = std::fs::read(&last).unwrap();
    let position = bytes.len() as u64;
    bytes.extend_from_slice(&record);
    std::fs::write(&last, &bytes).unwrap();
    assert_refused(tmp.path(), &last, Some(position));
}

#[test]
fn adversarial_residue_at_the_tail_is_truncated() {
    let tmp = tempfile::tempdir().unwrap();
    new_log(tmp.path(), 1 << 20, 50).close().unwrap();
    let last = last_log_file(tmp.path());
    let mut bytes = std::fs::read(&last).unwrap();
    let valid_len = bytes.len() as u64;
    let chain = {
        let result = record::scan(&bytes, Chain::genesis(PARTITION));
        result.end
    };
    // 16 MiB of record headers of this partition, continuing offsets, claiming sizes up to the
    // ceiling: each must be rejected by its bounds, not hashed.
    let region_bytes = 16 * 1024 * 1024;
    let mut i = 0u64;
    while (bytes.len() as u64) < valid_len + region_bytes {
        let header = RecordHeader {
            kind: RecordKind::Batch,
            checksum: i,
            parent_checksum: chain.parent_checksum,
            op: chain.next_op,
            view: 0,
            partition_id: PARTITION,
            base_offset: chain.next_offset,
            message_count: 1,
            batch_length_bytes: record::BATCH_BYTES_MAX - (i as u32 % 1_000),
            timestamp_us: 0,
        };
        bytes.extend_from_slice(&header.encode());
        i += 1;
    }
    std::fs::write(&last, &bytes).unwrap();
    let mut log = open(tmp.path()).unwrap();
    assert_eq!(log.next_offset(), 50);
    assert_eq!(std::fs::metadata(&last).unwrap().len(), valid_len);
    fill(&mut log, 55);
    assert_reference(&read_all(&log, 0, u32::MAX), 0, 55);
}

#[test]
fn torn_tail_in_a_non_last_segment_and_lost_segments_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let reference = tmp.path().join("reference");
    drop(new_log(&reference, 2_000, 150));
    let good = snapshot(&reference);
    let copy = |name: &str| {
        let dir = tmp.path().join(name);
        std::fs::create_dir(&dir).unwrap();
        for (file, bytes) in &good {
            std::fs::write(dir.join(file), bytes).unwrap();
        }
        dir
    };
    let files = log_files(&reference);
    assert!(files.len() >= 4);
    let file_name = |i: usize| files[i].file_name().unwrap().to_owned();

    let torn_middle = copy("torn_middle");
    let target = torn_middle.join(file_name(1));
    let len = std::fs::metadata(&target).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&target)
        .unwrap()
        .set_len(len - 10)
        .unwrap();
    assert_refused(&torn_middle, &target, None);

    let lost_middle = copy("lost_middle");
    std::fs::remove_file(lost_middle.join(file_name(2))).unwrap();
    std::fs::remove_file(lost_middle.join(file_name(2)).with_extension("index")).unwrap();
    assert_refused(&lost_middle, &lost_middle.join(file_name(3)), Some(0));

    let lost_first = copy("lost_first");
    std::fs::remove_file(lost_first.join(file_name(0))).unwrap();
    std::fs::remove_file(lost_first.join(file_name(0)).with_extension("index")).unwrap();
    assert_refused(&lost_first, &lost_first.join(file_name(1)), Some(0));

    let lost_log_only = copy("lost_log_only");
    std::fs::remove_file(lost_log_only.join(file_name(2))).unwrap();
    assert_refused(
        &lost_log_only,
        &lost_log_only.join(file_name(2)).with_extension("index"),
        Some(0),
    );

    // A refused open leaves even staging files alone.
    std::fs::write(lost_first.join("start.meta.tmp"), b"torn").unwrap();
    std::fs::write(lost_first.join("00000000000000000000.index.tmp"), b"torn").unwrap();
    assert_refused(&lost_first, &lost_first.join(file_name(1)), Some(0));

    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    assert_refused(&empty, &empty, Some(0));
}

#[test]
fn purge_keeps_counting_across_reopen() {
    let tmp = tempfile::tempdir().unwrap();
    let mut log = new_log(tmp.path(), 2_000, 90);
    log.purge().unwrap();
    assert_eq!(log.next_offset(), 90);
    assert_eq!(log.first_offset(), None);
    assert_eq!(log.stats().messages_count, 0);
    assert_eq!(log.stats().segments_count, 1);
    assert_eq!(log.read(0, 100, &mut Vec::new()).unwrap(), 0);
    assert_eq!(log.offset_at_timestamp(0).unwrap(), None);
    log.close().unwrap();

    let mut log = open(tmp.path()).unwrap();
    assert_eq!(log.next_offset(), 90);
    assert_eq!(log.first_offset(), None);
    fill(&mut log, 130);
    assert_eq!(log.first_offset(), Some(90));
    assert_reference(&read_all(&log, 0, u32::MAX), 90, 40);
    // A second purge right away, and one of an already empty log.
    log.purge().unwrap();
    log.purge().unwrap();
    log.close().unwrap();
    let mut log = open(tmp.path()).unwrap();
    assert_eq!(log.next_offset(), 130);
    fill(&mut log, 140);
    log.close().unwrap();
    let log = open(tmp.path()).unwrap();
    assert_reference(&read_all(&log, 0, u32::MAX), 130, 10);
    assert_eq!(log_files(tmp.path()).len() as u32, log.stats().segments_count);
}

#[test]
fn an_interrupted_purge_is_finished_at_open() {
    let tmp = tempfile::tempdir().unwrap();
    new_log(tmp.path(), 2_000, 90).close().unwrap();
    // Reopened after a clean stop: armed at 90 with the reservation at 90, so the restored
    // pre-purge state below implies no gap.
    let mut log = open(tmp.path()).unwrap();
    let before = snapshot(tmp.path());
    log.purge().unwrap();
    drop(log);
    // The purge got as far as its marker (and maybe the new segment), but no old segment was
    // deleted yet.
    for (file, bytes) in &before {
        std::fs::write(tmp.path().join(file), bytes).unwrap();
    }
    // And a later marker write that crashed before its rename.
    std::fs::write(tmp.path().join("start.meta.tmp"), b"torn").unwrap();
    let log = open(tmp.path()).unwrap();
    assert_eq!(log.next_offset(), 90);
    assert_eq!(log.first_offset(), None);
    assert_eq!(log.read(0, 1_000, &mut Vec::new()).unwrap(), 0);
    drop(log);
    assert_eq!(log_files(tmp.path()), vec![tmp.path().join(segment_log_name(90))]);
    assert!(!tmp.path().join("start.meta.tmp").exists());
}

#[test]
fn offset_at_timestamp() {
    let tmp = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::create(tmp.path(), PARTITION, config(1_500)).unwrap();
    assert_eq!(log.offset_at_timestamp(0).unwrap(), None);
    let mut bases = Vec::new();
    for i in 0..40u64 {
        let batch = reference_batch(log.next_offset(), 3);
        bases.push(log.append(&batch, 100 * (i + 1)).unwrap());
    }
    assert!(log.stats().segments_count > 3);
    assert_eq!(log.offset_at_timestamp(0).unwrap(), Some(0));
    assert_eq!(log.offset_at_timestamp(100).unwrap(), Some(0));
    assert_eq!(log.offset_at_timestamp(101).unwrap(), Some(3));
    for (i, &base) in bases.iter().enumerate() {
        assert_eq!(log.offset_at_timestamp(100 * (i as u64 + 1)).unwrap(), Some(base));
        assert_eq!(
            log.offset_at_timestamp(100 * (i as u64 + 1) - 50).unwrap(),
            Some(base)
        );
    }
    assert_eq!(log.offset_at_timestamp(4_001).unwrap(), None);
    // A clock stepping back is clamped: the batch is stamped with the last timestamp.
    let batch = reference_batch(log.next_offset(), 1);
    let base = log.append(&batch, 5).unwrap();
    let messages = read_all(&log, base, 1);
    assert_eq!(messages[0].timestamp_us, 4_000);
    drop(log);
    let log = open(tmp.path()).unwrap();
    assert_eq!(log.offset_at_timestamp(3_950).unwrap(), Some(bases[39]));
}

#[test]
fn create_refuses_an_existing_log_and_rejects_bad_input() {
    let tmp = tempfile::tempdir().unwrap();
    let mut log = new_log(tmp.path(), 2_000, 5);
    assert!(matches!(
        PartitionLog::create(tmp.path(), PARTITION, config(2_000)),
        Err(StorageError::Invalid(_))
    ));
    assert!(matches!(
        PartitionLog::create(&tmp.path().join("x"), PARTITION, config(u64::from(u32::MAX) + 1)),
        Err(StorageError::Invalid(_))
    ));
    assert!(matches!(
        log.append(&[0u8; 100], 1),
        Err(StorageError::Invalid(_))
    ));
    let empty = client_batch(&[]);
    assert!(matches!(log.append(&empty, 1), Err(StorageError::Invalid(_))));
    let mut wrong_length = reference_batch(5, 2);
    wrong_length.pop();
    assert!(matches!(
        log.append(&wrong_length, 1),
        Err(StorageError::Invalid(_))
    ));
    assert_eq!(log.next_offset(), 5);
}

/// A disk whose data barriers (and writeback waits) can be made to fail; it counts the
/// writeback waits it forwards.
#[derive(Debug, Default)]
struct FlakyDisk {
    fail_sync: Arc<AtomicBool>,
    writeback_waits: Arc<AtomicU64>,
}

#[derive(Debug)]
struct FlakyFile {
    inner: Box<dyn WriteFile>,
    fail_sync: Arc<AtomicBool>,
    writeback_waits: Arc<AtomicU64>,
}

impl FlakyFile {
    fn injected_failure(&self) -> Result<(), StorageError> {
        if self.fail_sync.load(Ordering::SeqCst) {
            return Err(StorageError::Io {
                path: "flaky".into(),
                source: std::io::Error::other("injected EIO"),
            });
        }
        Ok(())
    }
}

impl WriteFile for FlakyFile {
    fn write_all_at(&mut self, position_bytes: u64, bytes: &[u8]) -> Result<(), StorageError> {
        self.inner.write_all_at(position_bytes, bytes)
    }
    fn set_len(&mut self, len_bytes: u64) -> Result<(), StorageError> {
        self.inner.set_len(len_bytes)
    }
    fn sync_data(&mut self) -> Result<(), StorageError> {
        self.injected_failure()?;
        self.inner.sync_data()
    }
    fn start_writeback(&mut self, position_bytes: u64, len_bytes: u64) -> Result<(), StorageError> {
        self.inner.start_writeback(position_bytes, len_bytes)
    }
    fn wait_writeback(&mut self, position_bytes: u64, len_bytes: u64) -> Result<(), StorageError> {
        self.writeback_waits.fetch_add(1, Ordering::SeqCst);
        self.injected_failure()?;
        self.inner.wait_writeback(position_bytes, len_bytes)
    }
}

impl Disk for FlakyDisk {
    fn create_dir_all(&self, dir: &Path) -> Result<(), StorageError> {
        RealDisk.create_dir_all(dir)
    }
    fn list_dir(&self, dir: &Path) -> Result<Vec<String>, StorageError> {
        RealDisk.list_dir(dir)
    }
    fn file_len(&self, path: &Path) -> Result<Option<u64>, StorageError> {
        RealDisk.file_len(path)
    }
    fn read_all(&self, path: &Path, len_bytes_max: u64) -> Result<Option<Vec<u8>>, StorageError> {
        RealDisk.read_all(path, len_bytes_max)
    }
    fn open_read(&self, path: &Path) -> Result<Box<dyn ReadFile>, StorageError> {
        RealDisk.open_read(path)
    }
    fn create_new(&self, path: &Path) -> Result<Box<dyn WriteFile>, StorageError> {
        Ok(Box::new(FlakyFile {
            inner: RealDisk.create_new(path)?,
            fail_sync: self.fail_sync.clone(),
            writeback_waits: self.writeback_waits.clone(),
        }))
    }
    fn open_write(&self, path: &Path) -> Result<Box<dyn WriteFile>, StorageError> {
        Ok(Box::new(FlakyFile {
            inner: RealDisk.open_write(path)?,
            fail_sync: self.fail_sync.clone(),
            writeback_waits: self.writeback_waits.clone(),
        }))
    }
    fn write_synced(&self, path: &Path, bytes: &[u8]) -> Result<(), StorageError> {
        RealDisk.write_synced(path, bytes)
    }
    fn rename(&self, from: &Path, to: &Path) -> Result<(), StorageError> {
        RealDisk.rename(from, to)
    }
    fn remove_file(&self, path: &Path) -> Result<bool, StorageError> {
        RealDisk.remove_file(path)
    }
    fn sync_dir(&self, dir: &Path) -> Result<(), StorageError> {
        RealDisk.sync_dir(dir)
    }
    fn remove_dir(&self, dir: &Path) -> Result<bool, StorageError> {
        RealDisk.remove_dir(dir)
    }
}

#[test]
fn a_failed_barrier_stops_the_log_until_reopen() {
    let tmp = tempfile::tempdir().unwrap();
    let fail_sync = Arc::new(AtomicBool::new(false));
    let disk = Arc::new(FlakyDisk {
        fail_sync: fail_sync.clone(),
        ..FlakyDisk::default()
    });
    let config = LogConfig::new(2_000, SyncMode::EveryAppend);
    let mut log = PartitionLog::create_on(disk.clone(), tmp.path(), PARTITION, config).unwrap();
    fill(&mut log, 20);
    let reserved = log.offset_reserved();
    fail_sync.store(true, Ordering::SeqCst);
    let batch = reference_batch(20, 2);
    assert!(log.append(&batch, 1).is_err());
    assert_eq!(
        log.next_offset(),
        20,
        "nothing the failed barrier covered counts as appended"
    );
    assert_reference(&read_all(&log, 0, u32::MAX), 0, 20);
    fail_sync.store(false, Ordering::SeqCst);
    let batch = reference_batch(20, 2);
    assert!(log.append(&batch, 1).is_err(), "no retry on the same descriptor");
    assert!(log.flush().is_err());
    assert!(log.stopped_reason().is_some());
    drop(log);

    // The unsynced record may or may not survive a crash; here it did (no crash), and it was
    // never reported appended, so adopting it re-issues nothing that was acknowledged. The
    // stop was unclean: minting resumes at the offset reservation.
    let mut log = PartitionLog::open_on(disk, tmp.path(), PARTITION, config).unwrap();
    assert_reference(&read_all(&log, 0, 20), 0, 20);
    assert_eq!(log.next_offset(), reserved);
    let next = log.next_offset();
    let batch = reference_batch(next, 1);
    assert_eq!(log.append(&batch, 1).unwrap(), next);
}

/// Big batches: 64 messages of 64 KiB, about 4 MiB a batch.
fn big_batch(first_offset: u64) -> Vec<u8> {
    let payloads: Vec<Vec<u8>> = (0..64u64)
        .map(|i| vec![(first_offset + i) as u8; 64 * 1024])
        .collect();
    client_batch(&payloads)
}

/// `read_parts` over `[from_offset, +max_messages)`: the error, if any.
fn read_parts_error(log: &PartitionLog, from_offset: u64, max_messages: u32) -> Option<StorageError> {
    log.read_parts(from_offset, max_messages, &mut Vec::new(), &mut Vec::new())
        .err()
}

#[test]
fn records_sent_whole_are_verified_in_pieces_and_a_flip_in_any_piece_is_damage() {
    let tmp = tempfile::tempdir().unwrap();
    let config = LogConfig::new(64 << 20, SyncMode::EveryAppend);
    let mut log = PartitionLog::create(tmp.path(), PARTITION, config).unwrap();
    for first_offset in [0, 64, 128] {
        assert_eq!(log.append(&big_batch(first_offset), 1_000).unwrap(), first_offset);
    }
    // Whole records (read and hashed in pieces) and cut ones, the same bytes as `read`.
    for (from_offset, max_messages) in [(0, u32::MAX), (64, 64), (10, 100), (0, 70), (127, 2)] {
        let messages = read_all(&log, from_offset, max_messages);
        assert_eq!(messages.first().map(|m| m.offset), Some(from_offset));
    }
    let mut parts = Vec::new();
    log.read_parts(0, u32::MAX, &mut Vec::new(), &mut parts).unwrap();
    assert_eq!(parts.len(), 3);
    assert!(parts.iter().all(|part| matches!(part, ReadPart::File { .. })));

    // A flip in the first piece, a middle piece and the last byte of the middle record.
    let path = log_files(tmp.path()).remove(0);
    let original = std::fs::read(&path).unwrap();
    let ends = record_ends(&original);
    let (start, end) = (ends[0], ends[1]);
    for at in [start + 100, start + 3 * 64 * 1024 + 5, end - 1] {
        let mut bytes = original.clone();
        bytes[at as usize] ^= 0x04;
        std::fs::write(&path, &bytes).unwrap();
        for (from_offset, max_messages) in [(0, u32::MAX), (64, 64), (70, 10)] {
            match read_parts_error(&log, from_offset, max_messages) {
                Some(StorageError::Damaged { position, .. }) => assert_eq!(position, start, "byte {at}"),
                other => panic!("byte {at}, poll from {from_offset}: {other:?}"),
            }
        }
        // The records around it still serve.
        assert!(read_parts_error(&log, 0, 64).is_none());
        assert!(read_parts_error(&log, 128, 64).is_none());
    }
    std::fs::write(&path, &original).unwrap();
    assert!(read_parts_error(&log, 0, u32::MAX).is_none());
}

#[test]
fn writeback_is_paced_and_a_failed_wait_stops_the_log_like_a_failed_barrier() {
    let tmp = tempfile::tempdir().unwrap();
    let disk = Arc::new(FlakyDisk::default());
    let config = LogConfig::new(1 << 30, SyncMode::GroupCommit);
    let mut log = PartitionLog::create_on(disk.clone(), tmp.path(), PARTITION, config).unwrap();
    // ~4 MiB per append without a barrier: from the second chunk on, every append waits for
    // the writeback started one chunk earlier.
    for batch_index in 0..4u64 {
        log.append(&big_batch(batch_index * 64), 1).unwrap();
    }
    assert!(
        disk.writeback_waits.load(Ordering::SeqCst) >= 2,
        "16 MiB appended without a barrier must wait for earlier writeback"
    );
    log.commit().unwrap();
    let committed = log.next_offset();

    // A writeback error is reported once per open file: a failed wait must stop the log, or
    // the next fdatasync could succeed over lost data.
    disk.fail_sync.store(true, Ordering::SeqCst);
    let mut failed = false;
    for batch_index in 0..3u64 {
        if log.append(&big_batch(committed + batch_index * 64), 1).is_err() {
            failed = true;
            break;
        }
    }
    assert!(failed, "an append that waits on failed writeback must fail");
    assert!(
        log.stopped_reason()
            .is_some_and(|reason| reason.contains("writeback"))
    );
    disk.fail_sync.store(false, Ordering::SeqCst);
    assert!(log.commit().is_err(), "nothing is made durable after the stop");
    assert!(log.append(&reference_batch(log.next_offset(), 1), 1).is_err());
}

#[test]
fn handles_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<PartitionLog>();
    assert_send_sync::<cairn_storage::offsets::ConsumerOffsets>();
}

fn group_commit(segment_size_bytes: u64, offset_lease_block_count: u64) -> LogConfig {
    LogConfig {
        segment_size_bytes,
        sync: SyncMode::GroupCommit,
        offset_lease_block_count,
    }
}

/// Append batches of 1..=3 reference messages until the counter reaches `until` (no commit).
fn append_until(log: &mut PartitionLog, until: u64) {
    let mut i = 0u64;
    while log.next_offset() < until {
        let count = (1 + i % 3).min(until - log.next_offset()) as u32;
        let batch = reference_batch(log.next_offset(), count);
        log.append(&batch, 1_000 + i).unwrap();
        i += 1;
    }
}

fn segment_bases(dir: &Path) -> Vec<u64> {
    log_files(dir)
        .iter()
        .map(|path| path.file_stem().unwrap().to_str().unwrap().parse().unwrap())
        .collect()
}

#[test]
fn group_commit_hides_uncommitted_appends_and_costs_no_directory_work() {
    let tmp = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::create(tmp.path(), PARTITION, group_commit(100_000, 1_000)).unwrap();
    append_until(&mut log, 10);
    assert_eq!(log.next_offset(), 10);
    assert_eq!(log.visible_next_offset(), 0, "nothing visible before a commit");
    assert_eq!(log.read(0, 100, &mut Vec::new()).unwrap(), 0);
    assert_eq!(log.offset_at_timestamp(0).unwrap(), None);
    assert_eq!(log.stats().messages_count, 0);
    let files_before = snapshot(tmp.path()).into_keys().collect::<Vec<_>>();
    let info = log.commit().unwrap();
    assert_eq!(info.durable_next_offset, 10);
    assert_eq!(info.barriers, 2);
    assert_eq!(snapshot(tmp.path()).into_keys().collect::<Vec<_>>(), files_before);
    assert_eq!(log.visible_next_offset(), 10);
    assert_reference(&read_all(&log, 0, u32::MAX), 0, 10);
    append_until(&mut log, 14);
    assert_reference(&read_all(&log, 0, u32::MAX), 0, 10);
    assert_eq!(log.stats().messages_count, 10);
    log.flush().unwrap();
    assert_reference(&read_all(&log, 0, u32::MAX), 0, 14);
    assert_eq!(log.commit().unwrap().barriers, 0);
}

#[test]
fn close_then_reopen_leaves_no_gap_and_a_crash_skips_to_the_reservation() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let config = group_commit(1_500, 100);
    let mut log = PartitionLog::create(dir, PARTITION, config).unwrap();
    append_until(&mut log, 10);
    log.commit().unwrap();
    log.close().unwrap();

    // Clean stop: the ceiling collapsed to the counter.
    let mut log = PartitionLog::open(dir, PARTITION, config).unwrap();
    assert_eq!(log.next_offset(), 10);
    assert_eq!(log.offset_reserved(), 10);
    append_until(&mut log, 15);
    log.commit().unwrap();
    let reserved = log.offset_reserved();
    // The first append after the clean restart (offset 10, one message) reached the ceiling
    // and raised it one lease block past its end.
    assert_eq!(reserved, 11 + 100);
    drop(log); // an unclean stop

    // Crash: minting resumes at the reservation, behind a gap record; the chain verifies.
    let mut log = PartitionLog::open(dir, PARTITION, config).unwrap();
    assert_eq!(log.next_offset(), reserved);
    assert_reference(&read_all(&log, 0, u32::MAX), 0, 15);
    assert_eq!(*segment_bases(dir).last().unwrap(), reserved);
    append_until(&mut log, reserved + 4);
    log.close().unwrap();
    let log = PartitionLog::open(dir, PARTITION, config).unwrap();
    assert_eq!(
        log.next_offset(),
        reserved + 4,
        "a clean stop after a gap leaves no new gap"
    );
    let messages = read_all(&log, 0, u32::MAX);
    assert_reference(&messages[..15], 0, 15);
    assert_reference(&messages[15..], reserved, 4);

    // Crash, restart, clean stop, restart: the clean stop keeps the protection (scenario 2).
    let mut log = log;
    append_until(&mut log, reserved + 6);
    log.commit().unwrap();
    let acked_end = log.next_offset();
    let reserved = log.offset_reserved();
    drop(log);
    let log = PartitionLog::open(dir, PARTITION, config).unwrap();
    assert_eq!(log.next_offset(), reserved);
    log.close().unwrap();
    let log = PartitionLog::open(dir, PARTITION, config).unwrap();
    assert!(log.next_offset() >= acked_end);
    assert_eq!(log.next_offset(), reserved);

    // Four crash cycles with traffic, then four without: every boot serves, offsets only grow,
    // and a crash with no traffic since the last boot adds no gap.
    let mut log = log;
    let mut last_next = log.next_offset();
    for cycle in 0..8 {
        if cycle < 4 {
            append_until(&mut log, last_next + 2);
            log.commit().unwrap();
        }
        let before = log.next_offset();
        let reserved = log.offset_reserved();
        drop(log);
        log = PartitionLog::open(dir, PARTITION, config).unwrap();
        assert!(log.next_offset() >= before);
        if cycle < 4 {
            assert_eq!(log.next_offset(), reserved);
        } else {
            assert_eq!(log.next_offset(), before, "cycle {cycle}: no traffic, no gap");
        }
        last_next = log.next_offset();
    }
    log.close().unwrap();
    let bases = segment_bases(dir);
    assert!(bases.windows(2).all(|pair| pair[0] < pair[1]));
    PartitionLog::open(dir, PARTITION, config).unwrap();
}

#[test]
fn a_bit_flip_in_the_last_record_is_damage_below_the_frontier_and_a_torn_tail_above_it() {
    let tmp = tempfile::tempdir().unwrap();
    let reference = tmp.path().join("reference");
    let config = group_commit(100_000, 1_000);
    let mut log = PartitionLog::create(&reference, PARTITION, config).unwrap();
    append_until(&mut log, 12);
    log.commit().unwrap();
    let reserved = log.offset_reserved();
    drop(log);
    let good = snapshot(&reference);
    let last = segment_log_name(0);
    let ends = record_ends(&good[&last]);
    let last_start = ends[ends.len() - 2] as usize;
    let copy = |name: &str| {
        let dir = tmp.path().join(name);
        std::fs::create_dir(&dir).unwrap();
        for (file, bytes) in &good {
            std::fs::write(dir.join(file), bytes).unwrap();
        }
        dir
    };

    // Below the frontier (the last record was committed): refused, files untouched.
    let below = copy("below");
    let mut bytes = good[&last].clone();
    bytes[last_start + RECORD_HEADER_SIZE + 40] ^= 0x02;
    std::fs::write(below.join(&last), &bytes).unwrap();
    assert_refused(&below, &below.join(&last), Some(last_start as u64));

    // The same flip above the frontier (an uncommitted record): a torn tail, cut away.
    let above = copy("above");
    let mut log = PartitionLog::open(&above, PARTITION, config).unwrap();
    assert_eq!(log.next_offset(), reserved);
    let reserved = log.offset_reserved();
    let batch = reference_batch(reserved, 2);
    log.append(&batch, 9_999).unwrap();
    drop(log);
    let active = above.join(segment_log_name(reserved));
    let mut bytes = std::fs::read(&active).unwrap();
    let flipped_at = RECORD_HEADER_SIZE + 100;
    bytes[flipped_at] ^= 0x02;
    std::fs::write(&active, &bytes).unwrap();
    let log = PartitionLog::open(&above, PARTITION, config).unwrap();
    assert_eq!(
        std::fs::metadata(&active).unwrap().len(),
        GAP_RECORD_SIZE,
        "the torn record is gone; only the gap sealing the segment remains"
    );
    assert_reference(&read_all(&log, 0, u32::MAX), 0, 12);

    // A log that lost bytes below its frontier (the last committed record) is refused too.
    let lost = copy("lost");
    std::fs::write(lost.join(&last), &good[&last][..last_start]).unwrap();
    assert_refused(&lost, &lost.join(&last), Some(last_start as u64));
}

#[test]
fn state_file_faults() {
    let tmp = tempfile::tempdir().unwrap();
    let reference = tmp.path().join("reference");
    let config = group_commit(100_000, 1_000);
    let mut log = PartitionLog::create(&reference, PARTITION, config).unwrap();
    append_until(&mut log, 5);
    log.commit().unwrap();
    log.close().unwrap();
    let good = snapshot(&reference);
    let copy = |name: &str| {
        let dir = tmp.path().join(name);
        std::fs::create_dir(&dir).unwrap();
        for (file, bytes) in &good {
            std::fs::write(dir.join(file), bytes).unwrap();
        }
        dir
    };
    let slot = |index: usize| index * cairn_storage::state::STATE_SLOT_STRIDE_BYTES as usize;

    // One slot torn (zeroed halfway): the other one takes over.
    for index in 0..2 {
        let dir = copy(&format!("one_bad_{index}"));
        let mut state = good["state"].clone();
        state[slot(index) + 20..slot(index) + 128].fill(0);
        std::fs::write(dir.join("state"), &state).unwrap();
        let log = PartitionLog::open(&dir, PARTITION, config).unwrap();
        assert_reference(&read_all(&log, 0, u32::MAX), 0, 5);
    }
    // Both slots bad, a missing file, a short file: refused, untouched.
    let dir = copy("both_bad");
    let mut state = good["state"].clone();
    state[slot(0) + 30] ^= 1;
    state[slot(1) + 30] ^= 1;
    std::fs::write(dir.join("state"), &state).unwrap();
    assert_refused(&dir, &dir.join("state"), None);
    let dir = copy("missing");
    std::fs::remove_file(dir.join("state")).unwrap();
    assert_refused(&dir, &dir.join("state"), Some(0));
    let dir = copy("short");
    std::fs::write(dir.join("state"), &good["state"][..100]).unwrap();
    assert_refused(&dir, &dir.join("state"), None);
    // A state file of another partition.
    let other = tmp.path().join("other");
    PartitionLog::create(&other, PARTITION + 1, config)
        .unwrap()
        .close()
        .unwrap();
    let dir = copy("foreign");
    std::fs::copy(other.join("state"), dir.join("state")).unwrap();
    assert_refused(&dir, &dir.join("state"), None);
}

#[test]
fn a_failed_commit_acknowledges_nothing_and_stops_the_log() {
    let tmp = tempfile::tempdir().unwrap();
    let fail_sync = Arc::new(AtomicBool::new(false));
    let disk = Arc::new(FlakyDisk {
        fail_sync: fail_sync.clone(),
        ..FlakyDisk::default()
    });
    let config = group_commit(2_000, 1_000);
    let mut log = PartitionLog::create_on(disk.clone(), tmp.path(), PARTITION, config).unwrap();
    append_until(&mut log, 6);
    log.commit().unwrap();
    append_until(&mut log, 9);
    fail_sync.store(true, Ordering::SeqCst);
    assert!(log.commit().is_err());
    assert_eq!(
        log.visible_next_offset(),
        6,
        "nothing the failed barrier covered is visible"
    );
    assert_reference(&read_all(&log, 0, u32::MAX), 0, 6);
    fail_sync.store(false, Ordering::SeqCst);
    assert!(log.commit().is_err(), "no retry on the same descriptor");
    assert!(log.append(&reference_batch(9, 1), 1).is_err());
    assert!(log.stopped_reason().is_some());
    let reserved = log.offset_reserved();
    drop(log);
    let log = PartitionLog::open_on(disk, tmp.path(), PARTITION, config).unwrap();
    assert_reference(&read_all(&log, 0, 6), 0, 6);
    assert_eq!(log.next_offset(), reserved);
}
