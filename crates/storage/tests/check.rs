//! The offline checker and the accept-loss repair over real files.

mod common;

use cairn_storage::atomic_file;
use cairn_storage::check::{
    self, BootAction, Cut, PartitionStatus, QUARANTINE_PREFIX, REPAIR_MANIFEST_NAME, RepairError, Verdict,
};
use cairn_storage::log::{LogConfig, PartitionLog, SyncMode, segment_index_name};
use cairn_storage::offsets::{ConsumerKey, ConsumerOffsets, OffsetOwner};
use cairn_storage::record;
use common::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const PARTITION: u32 = 3;

fn fill(log: &mut PartitionLog, messages: u64) {
    let mut batch_number = 0u64;
    while log.next_offset() < messages {
        let count = (1 + batch_number % 5).min(messages - log.next_offset()) as u32;
        let batch = reference_batch(log.next_offset(), count);
        log.append(&batch, 1_000 * (batch_number + 1)).unwrap();
        batch_number += 1;
    }
}

/// A partition directory as the server lays it out: the log plus `offsets/` with one stored
/// consumer offset.
fn new_partition(dir: &Path, config: LogConfig, messages: u64) -> PartitionLog {
    let mut log = PartitionLog::create(dir, PARTITION, config).unwrap();
    fill(&mut log, messages);
    log.commit().unwrap();
    let mut offsets = ConsumerOffsets::open(&dir.join(check::OFFSETS_DIR_NAME)).unwrap();
    offsets
        .store(&OffsetOwner::Consumer(ConsumerKey::Id(1)), 7)
        .unwrap();
    log
}

fn open(dir: &Path) -> PartitionLog {
    PartitionLog::open(dir, PARTITION, config(3_000)).unwrap()
}

/// Every file under `dir`, recursively, with its bytes.
fn tree(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(next) = pending.pop() {
        for entry in std::fs::read_dir(&next).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else {
                files.insert(
                    path.strip_prefix(dir).unwrap().to_path_buf(),
                    std::fs::read(&path).unwrap(),
                );
            }
        }
    }
    files
}

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

fn read_all(log: &PartitionLog) -> Vec<Message> {
    let mut out = Vec::new();
    log.read(0, u32::MAX, &mut out).unwrap();
    decode_batches(&out)
}

fn assert_reference(messages: &[Message], count: u64) {
    assert_eq!(messages.len() as u64, count);
    for (i, message) in messages.iter().enumerate() {
        assert_eq!(message.offset, i as u64);
        assert_eq!(message.payload, payload_for(i as u64));
    }
}

fn quarantine_dirs(dir: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| {
            path.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with(QUARANTINE_PREFIX)
        })
        .collect();
    dirs.sort();
    dirs
}

#[test]
fn a_cleanly_stopped_partition_is_healthy() {
    let tmp = tempfile::tempdir().unwrap();
    let log = new_partition(tmp.path(), config(3_000), 80);
    log.close().unwrap();
    let before = tree(tmp.path());
    let report = check::check_partition(tmp.path(), PARTITION).unwrap();
    assert_eq!(report.verdict(), Verdict::Healthy, "{report}");
    let log = report.log.unwrap();
    assert!(log.segments_count > 1);
    assert_eq!(log.messages, 80);
    assert_eq!((log.start_offset, log.end_offset), (0, 80));
    let state = report.state.clone().unwrap().unwrap();
    assert!(state.clean_stop);
    assert_eq!(state.frontier.next_offset(), 80);
    assert_eq!(state.offset_reserved, 80);
    assert_eq!(report.resume_offset, Some(80));
    assert_eq!(report.offsets.stored_count, 1);
    assert!(report.index_rebuilds.is_empty());
    assert_eq!(tree(tmp.path()), before, "check changes nothing");
}

#[test]
fn a_crash_with_a_torn_tail_is_recoverable_and_names_the_cut() {
    let tmp = tempfile::tempdir().unwrap();
    let mut log = new_partition(tmp.path(), config(3_000), 40);
    fill(&mut log, 45);
    drop(log);
    let last = log_files(tmp.path()).pop().unwrap();
    let valid_len = std::fs::metadata(&last).unwrap().len();
    let half = reference_batch(45, 3);
    let mut bytes = std::fs::read(&last).unwrap();
    bytes.extend_from_slice(&[0x5a; record::RECORD_HEADER_SIZE]);
    bytes.extend_from_slice(&half[..half.len() / 2]);
    std::fs::write(&last, &bytes).unwrap();
    std::fs::remove_file(tmp.path().join(segment_index_name(0))).unwrap();
    let before = tree(tmp.path());

    let report = check::check_partition(tmp.path(), PARTITION).unwrap();
    assert_eq!(report.verdict(), Verdict::Recoverable, "{report}");
    assert!(report.actions.contains(&BootAction::TruncateTornTail {
        path: last.clone(),
        valid_len_bytes: valid_len,
        file_len_bytes: bytes.len() as u64,
        fault: "bad record magic".into(),
    }));
    assert_eq!(
        report.index_rebuilds,
        vec![tmp.path().join(segment_index_name(0))]
    );
    let resume_offset = report.resume_offset.unwrap();
    assert!(resume_offset >= 45);
    assert!(report.actions.iter().any(|action| matches!(
        action,
        BootAction::Gap {
            recovered_end_offset: 45,
            ..
        }
    )));
    assert_eq!(tree(tmp.path()), before, "check changes nothing");
    let text = report.to_string();
    assert!(text.contains(&format!("at byte {valid_len}")), "{text}");

    let log = open(tmp.path());
    assert_eq!(log.next_offset(), resume_offset, "boot does what check said");
}

/// A partition with a bit flip in the second record of its first segment (valid records after
/// it), stopped cleanly or not. Returns the damaged file and the damage position.
fn damaged_partition(dir: &Path, clean_stop: bool) -> (PathBuf, u64, u64) {
    let mut log = new_partition(dir, config(3_000), 80);
    // What the state file holds: a clean stop collapses the reservation to the log's end.
    let reserved = if clean_stop {
        log.next_offset()
    } else {
        log.offset_reserved()
    };
    if clean_stop {
        log.close().unwrap();
    } else {
        log.commit().unwrap();
        drop(log);
    }
    let target = log_files(dir)[0].clone();
    let mut bytes = std::fs::read(&target).unwrap();
    let ends = record_ends(&bytes);
    assert!(ends.len() >= 3);
    bytes[(ends[0] + 100) as usize] ^= 0x20;
    std::fs::write(&target, &bytes).unwrap();
    (target, ends[0], reserved)
}

#[test]
fn a_bit_flip_in_the_middle_is_damage_and_check_leaves_the_files_as_they_are() {
    let tmp = tempfile::tempdir().unwrap();
    let (target, position, _) = damaged_partition(tmp.path(), true);
    let before = tree(tmp.path());
    let report = check::check_partition(tmp.path(), PARTITION).unwrap();
    assert_eq!(report.verdict(), Verdict::Damaged, "{report}");
    assert_eq!(report.damage[0].path, target);
    assert_eq!(report.damage[0].position, position);
    assert!(
        report.damage[0].reason.contains("checksum"),
        "{}",
        report.damage[0].reason
    );
    let verified = report.log.unwrap();
    assert_eq!(verified.batch_records, 1, "one record verifies before the damage");
    let preview = report.repair.clone().unwrap().unwrap();
    assert_eq!(preview.lost_end_offset, 80);
    assert!(matches!(&preview.cuts[0], Cut::Truncate { at_bytes, .. } if *at_bytes == position));
    assert_eq!(tree(tmp.path()), before, "check changes nothing");
    assert_eq!(tree(tmp.path()), before, "check changes nothing, twice");
}

#[test]
fn repair_cuts_at_the_damage_quarantines_the_rest_and_never_reissues_an_offset() {
    for clean_stop in [true, false] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let (target, position, reserved_before) = damaged_partition(dir, clean_stop);
        let before = tree(dir);
        let original = std::fs::read(&target).unwrap();

        let report = check::repair_accept_loss(dir, PARTITION).unwrap();
        let text = report.to_string();
        let quarantine = quarantine_dirs(dir);
        assert_eq!(quarantine, vec![dir.join("quarantine-1")], "{text}");
        let quarantine = &quarantine[0];
        // The cut bytes and every later segment file are in quarantine, byte for byte.
        let cut_name = format!(
            "{}.cut-at-{position}",
            target.file_name().unwrap().to_str().unwrap()
        );
        assert_eq!(
            std::fs::read(quarantine.join(&cut_name)).unwrap(),
            original[position as usize..],
            "{text}"
        );
        assert!(quarantine.join(REPAIR_MANIFEST_NAME).exists());
        for (name, bytes) in &before {
            let name_str = name.to_str().unwrap();
            if name_str.ends_with(".log") && dir.join(name) != target {
                assert_eq!(
                    &std::fs::read(quarantine.join(name)).unwrap(),
                    bytes,
                    "{name_str}"
                );
                assert!(!dir.join(name).exists());
            }
        }
        assert_eq!(std::fs::metadata(&target).unwrap().len(), position);
        assert_eq!(report.lost_end_offset, 80, "{text}");
        assert!(
            report.resume_offset >= 80 && report.resume_offset >= reserved_before,
            "{text}"
        );

        // The partition opens again: everything before the damage, at the same offsets.
        let mut log = open(dir);
        let kept = report.kept_end_offset;
        assert!(kept > 0);
        assert_reference(&read_all(&log), kept);
        let next = log.next_offset();
        assert_eq!(next, report.resume_offset);
        assert!(
            next >= 80 && next >= reserved_before,
            "above every offset that ever existed"
        );
        let batch = reference_batch(next, 2);
        assert_eq!(log.append(&batch, 1).unwrap(), next);
        log.commit().unwrap();
        log.close().unwrap();
        let log = open(dir);
        assert_eq!(log.next_offset(), next + 2);
        drop(log);

        // Idempotent: a second repair refuses and changes nothing.
        let after = tree(dir);
        assert!(matches!(
            check::repair_accept_loss(dir, PARTITION),
            Err(RepairError::NotDamaged(_))
        ));
        assert_eq!(tree(dir), after);
    }
}

#[test]
fn repair_refuses_a_healthy_or_recoverable_partition_and_changes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let log = new_partition(tmp.path(), config(3_000), 30);
    log.close().unwrap();
    let before = tree(tmp.path());
    assert!(matches!(
        check::repair_accept_loss(tmp.path(), PARTITION),
        Err(RepairError::NotDamaged(Verdict::Healthy))
    ));
    assert_eq!(tree(tmp.path()), before);
    std::fs::remove_file(tmp.path().join(segment_index_name(0))).unwrap();
    let before = tree(tmp.path());
    assert!(matches!(
        check::repair_accept_loss(tmp.path(), PARTITION),
        Err(RepairError::NotDamaged(Verdict::Recoverable))
    ));
    assert_eq!(tree(tmp.path()), before);
}

#[test]
fn repair_rebuilds_a_damaged_state_file_above_every_offset() {
    for clean_stop in [true, false] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let config = LogConfig {
            offset_lease_block_count: 1_000,
            ..LogConfig::new(3_000, SyncMode::GroupCommit)
        };
        let log = new_partition(dir, config, 50);
        let reserved_before = log.offset_reserved();
        if clean_stop {
            log.close().unwrap();
        } else {
            drop(log);
        }
        let state_path = dir.join("state");
        let mut state = std::fs::read(&state_path).unwrap();
        state[30] ^= 1;
        state[cairn_storage::state::STATE_SLOT_STRIDE_BYTES as usize + 30] ^= 1;
        std::fs::write(&state_path, &state).unwrap();
        let report = check::check_partition(dir, PARTITION).unwrap();
        assert_eq!(report.verdict(), Verdict::Damaged);
        assert_eq!(report.damage[0].path, state_path);

        let repaired = check::repair_accept_loss(dir, PARTITION).unwrap();
        let text = repaired.to_string();
        assert!(repaired.state.is_some(), "{text}");
        assert_eq!(repaired.kept_end_offset, 50, "{text}");
        assert!(repaired.resume_offset >= reserved_before, "{text}");
        // The damaged state file is kept in quarantine; the log is untouched.
        assert_eq!(
            std::fs::read(repaired.state_copy.clone().unwrap()).unwrap(),
            state
        );
        let log = PartitionLog::open(dir, PARTITION, config).unwrap();
        assert_reference(&read_all(&log), 50);
        assert!(log.next_offset() >= reserved_before);
        assert_eq!(log.next_offset(), repaired.resume_offset);
    }
}

#[test]
fn a_lost_middle_segment_is_cut_there() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let log = new_partition(dir, config(2_000), 120);
    log.close().unwrap();
    let files = log_files(dir);
    assert!(files.len() >= 4);
    // The second segment's log vanished; its index stayed (an orphan index).
    std::fs::remove_file(&files[1]).unwrap();
    let report = check::check_partition(dir, PARTITION).unwrap();
    assert_eq!(report.verdict(), Verdict::Damaged, "{report}");
    let repaired = check::repair_accept_loss(dir, PARTITION).unwrap();
    let text = repaired.to_string();
    let second_base: u64 = files[1].file_stem().unwrap().to_str().unwrap().parse().unwrap();
    assert_eq!(repaired.kept_end_offset, second_base, "{text}");
    assert!(repaired.truncated.is_empty(), "{text}");
    assert!(
        repaired
            .moved
            .iter()
            .any(|(from, _)| *from == dir.join(segment_index_name(second_base)))
    );
    let log = open(dir);
    assert_reference(&read_all(&log), second_base);
    assert!(log.next_offset() >= 120);
}

#[test]
fn damaged_consumer_offsets_are_damage_and_repair_quarantines_them() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let log = new_partition(dir, config(3_000), 10);
    log.close().unwrap();
    let offset_file = dir.join(check::OFFSETS_DIR_NAME).join("consumer-1");
    let mut bytes = std::fs::read(&offset_file).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x80;
    std::fs::write(&offset_file, &bytes).unwrap();
    let report = check::check_partition(dir, PARTITION).unwrap();
    assert_eq!(report.verdict(), Verdict::Damaged, "{report}");
    assert_eq!(report.damage[0].path, offset_file);
    let repaired = check::repair_accept_loss(dir, PARTITION).unwrap();
    assert!(repaired.state.is_none(), "the log is not touched");
    assert!(!offset_file.exists());
    assert_eq!(
        std::fs::read(
            dir.join("quarantine-1")
                .join(check::OFFSETS_DIR_NAME)
                .join("consumer-1")
        )
        .unwrap(),
        bytes
    );
    assert_eq!(
        check::check_partition(dir, PARTITION).unwrap().verdict(),
        Verdict::Healthy
    );
}

#[test]
fn data_dir_check_compares_the_tree_with_the_metadata() {
    let tmp = tempfile::tempdir().unwrap();
    let data_dir = tmp.path();
    let partition_dir = |partition: u32| {
        data_dir
            .join("streams/1/topics/2/partitions")
            .join(partition.to_string())
    };
    let metadata = br#"{"format_version":1,"next_stream_id":2,"streams":[{"id":1,"name":"s","created_at_us":0,"next_topic_id":3,"topics":[{"id":2,"name":"t","created_at_us":0,"message_expiry_us":0,"compression":1,"max_topic_size_bytes":0,"partitions":[{"id":0,"created_at_us":0},{"id":1,"created_at_us":0},{"id":2,"created_at_us":0}]}]}],"next_user_id":1,"users":[],"next_token_id":1,"tokens":[]}"#;
    atomic_file::write(&data_dir.join(check::METADATA_FILE_NAME), metadata).unwrap();
    for partition in [0u32, 1, 3] {
        let dir = partition_dir(partition);
        let mut log = PartitionLog::create(&dir, partition, config(3_000)).unwrap();
        fill(&mut log, 20);
        ConsumerOffsets::open(&dir.join(check::OFFSETS_DIR_NAME)).unwrap();
        log.close().unwrap();
    }
    // Partition 1: a bit flip in its middle.
    let target = log_files(&partition_dir(1))[0].clone();
    let mut bytes = std::fs::read(&target).unwrap();
    let ends = record_ends(&bytes);
    bytes[(ends[0] + 100) as usize] ^= 0x20;
    std::fs::write(&target, &bytes).unwrap();
    let before = tree(data_dir);

    let report = check::check_data_dir(data_dir).unwrap();
    let text = report.to_string();
    println!("{text}");
    assert_eq!(tree(data_dir), before, "check changes nothing");
    assert_eq!(report.metadata.verdict, Verdict::Healthy);
    let verdicts: Vec<(u32, Verdict)> = report
        .partitions
        .iter()
        .map(|entry| (entry.partition_id, entry.verdict()))
        .collect();
    assert_eq!(
        verdicts,
        vec![
            (0, Verdict::Healthy),
            (1, Verdict::Damaged),
            (2, Verdict::Damaged),
            (3, Verdict::Recoverable)
        ]
    );
    assert!(matches!(
        report.partitions[2].status,
        PartitionStatus::Missing { .. }
    ));
    assert!(matches!(
        report.partitions[3].status,
        PartitionStatus::Orphan { .. }
    ));
    assert_eq!(report.verdict(), Verdict::Damaged);
    assert!(
        text.ends_with("4 partitions: 1 healthy, 1 recoverable, 2 damaged\n"),
        "{text}"
    );
    assert!(
        text.contains(&format!("{} at byte {}", target.display(), ends[0])),
        "{text}"
    );

    // Metadata missing while partitions exist: boot would delete them, so it is damage.
    std::fs::remove_file(data_dir.join(check::METADATA_FILE_NAME)).unwrap();
    let report = check::check_data_dir(data_dir).unwrap();
    assert_eq!(report.metadata.verdict, Verdict::Damaged, "{report}");
    // A missing data directory is an error, not a verdict.
    assert!(check::check_data_dir(&data_dir.join("nope")).is_err());
}

#[test]
fn a_data_dir_lock_in_use_is_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let _lock = cairn_storage::lock::DataDirLock::acquire(tmp.path()).unwrap();
    let report = check::check_data_dir(tmp.path()).unwrap();
    assert!(report.in_use);
    assert_eq!(report.verdict(), Verdict::Healthy);
}
