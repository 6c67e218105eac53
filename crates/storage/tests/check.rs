//! The offline data-directory check over real directories, with a stub partition checker
//! (the server's checker recovers partition groups; `crates/cairn/tests` runs it for real).

use cairn_storage::atomic_file;
use cairn_storage::check::{self, Damage, PartitionReport, PartitionStatus, Verdict};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Every file under `dir` with its bytes (to prove a check changed nothing).
fn tree(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else {
                files.insert(path.clone(), std::fs::read(&path).unwrap());
            }
        }
    }
    files
}

/// A checker that calls a partition directory holding a file `DAMAGED` damaged, and healthy
/// otherwise.
fn stub(dir: &Path, (_, _, partition_id): (u32, u32, u32)) -> PartitionReport {
    let mut report = PartitionReport::empty(dir, partition_id);
    if dir.join("DAMAGED").exists() {
        report.damage.push(Damage {
            path: dir.join("DAMAGED"),
            position: 7,
            reason: "a flipped bit".into(),
        });
    }
    report
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
        std::fs::create_dir_all(partition_dir(partition)).unwrap();
        std::fs::write(partition_dir(partition).join("superblock"), b"stub").unwrap();
    }
    std::fs::write(partition_dir(1).join("DAMAGED"), b"").unwrap();
    let before = tree(data_dir);

    let report = check::check_data_dir_with(data_dir, None, &stub).unwrap();
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
        text.contains(&format!(
            "{} at byte 7: a flipped bit",
            partition_dir(1).join("DAMAGED").display()
        )),
        "{text}"
    );

    // Metadata missing while partitions exist: boot would delete them, so it is damage.
    std::fs::remove_file(data_dir.join(check::METADATA_FILE_NAME)).unwrap();
    let report = check::check_data_dir_with(data_dir, None, &stub).unwrap();
    assert_eq!(report.metadata.verdict, Verdict::Damaged, "{report}");
    // A missing data directory is an error, not a verdict.
    assert!(check::check_data_dir_with(&data_dir.join("nope"), None, &stub).is_err());
}

#[test]
fn a_data_dir_lock_in_use_is_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let _lock = cairn_storage::lock::DataDirLock::acquire(tmp.path()).unwrap();
    let report = check::check_data_dir_with(tmp.path(), None, &stub).unwrap();
    assert!(report.in_use);
    assert_eq!(report.verdict(), Verdict::Healthy);
}
