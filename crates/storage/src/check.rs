//! Offline verification of a data directory (the operator tool `cairn check`, durability
//! contract guarantee 4): read-only, it reports what boot would do with every partition,
//! without doing it.
//!
//! [`check_data_dir_with`] walks `<data_dir>/streams/*/topics/*/partitions/*`, compares what
//! it finds with what the metadata names (the caller's verdict on its replicated metadata log,
//! or the metadata document of an earlier release), and asks the caller's checker for each
//! partition directory (the server recovers a partition group read-only, as boot would). The
//! verdict per partition is
//! - [`Verdict::Healthy`]: boot has nothing to repair;
//! - [`Verdict::Recoverable`]: boot fixes it by itself (a torn tail, an interrupted segment
//!   removal, a purge the metadata recorded), each listed as a [`BootAction`];
//! - [`Verdict::Damaged`]: boot refuses the partition (file, byte position, reason).
//!
//! Layout knowledge mirrored from the server's catalog (`crates/cairn/src/catalog.rs`): the
//! metadata document `<data_dir>/metadata` of earlier releases, and partition directories
//! `<data_dir>/streams/<s>/topics/<t>/partitions/<p>/` named by their numeric ids.

use crate::StorageError;
use crate::atomic_file;
use crate::io::{Disk, RealDisk};
use crate::lock::DataDirLock;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

/// The metadata document inside a data directory (catalog.rs `metadata_path`).
pub const METADATA_FILE_NAME: &str = "metadata";
/// The metadata format version the server reads (catalog.rs `METADATA_FORMAT_VERSION`).
pub const METADATA_FORMAT_VERSION: u64 = 1;

/// What open would do with a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verdict {
    Healthy,
    Recoverable,
    Damaged,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verdict::Healthy => "healthy",
            Verdict::Recoverable => "recoverable",
            Verdict::Damaged => "DAMAGED",
        })
    }
}

/// Why open refuses: the file, the byte position, the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    pub path: PathBuf,
    pub position: u64,
    pub reason: String,
}

impl fmt::Display for Damage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} at byte {}: {}",
            self.path.display(),
            self.position,
            self.reason
        )
    }
}

/// Something boot repairs by itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BootAction {
    /// The metadata records a topic or stream purge up to `purge_target` that did not reach
    /// this partition (its log starts at `start_offset`): the server purges it (messages and
    /// stored consumer offsets) before serving.
    FinishMetadataPurge { purge_target: u64, start_offset: u64 },
    /// A partition group's journal: drop what lies above its durable frontier (writes never
    /// reported durable: unsynced, partly written, or what a cut had removed).
    DropAboveFrontier { path: PathBuf, bytes: u64 },
    /// A partition group's journal: remove segments an interrupted removal left below its
    /// start (their messages were already given up).
    FinishSegmentRemoval { path: PathBuf, segments: u32 },
}

impl fmt::Display for BootAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BootAction::FinishMetadataPurge {
                purge_target,
                start_offset,
            } => write!(
                f,
                "finish a purge recorded in the metadata: delete every message below offset {purge_target} \
                 (the log starts at {start_offset}) and the stored consumer offsets"
            ),
            BootAction::DropAboveFrontier { path, bytes } => write!(
                f,
                "drop {bytes} bytes of {} above its durable frontier (writes never reported durable)",
                path.display()
            ),
            BootAction::FinishSegmentRemoval { path, segments } => write!(
                f,
                "remove {segments} segment(s) of {} left below its start by an interrupted removal",
                path.display()
            ),
        }
    }
}

/// The verified log (all of it, or for a damaged partition the prefix before the damage).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LogSummary {
    pub segments_count: usize,
    pub batch_records: u64,
    pub messages: u64,
    pub verified_bytes: u64,
    /// The offset the log starts at (0, or the purge point).
    pub start_offset: u64,
    /// The offset after the last verified record.
    pub end_offset: u64,
}

impl fmt::Display for LogSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} segment(s), {} batch record(s), {} message(s) (offsets {}..{}), {} bytes verified",
            self.segments_count,
            self.batch_records,
            self.messages,
            self.start_offset,
            self.end_offset,
            self.verified_bytes
        )
    }
}

/// What the check found in one partition directory.
#[derive(Debug, Clone)]
pub struct PartitionReport {
    pub dir: PathBuf,
    pub partition_id: u32,
    /// Segment files in the journal.
    pub segment_files: usize,
    /// What boot would keep (`None` if it could not be determined).
    pub log: Option<LogSummary>,
    /// Where minting resumes at the next boot (`None` when boot refuses).
    pub resume_offset: Option<u64>,
    /// What boot repairs by itself.
    pub actions: Vec<BootAction>,
    /// Why boot refuses.
    pub damage: Vec<Damage>,
    /// Things boot ignores, and what the partition is.
    pub notes: Vec<String>,
}

impl PartitionReport {
    /// A report with nothing found yet (for a partition checker to fill in).
    pub fn empty(dir: &Path, partition_id: u32) -> PartitionReport {
        PartitionReport {
            dir: dir.to_path_buf(),
            partition_id,
            segment_files: 0,
            log: None,
            resume_offset: None,
            actions: Vec::new(),
            damage: Vec::new(),
            notes: Vec::new(),
        }
    }

    pub fn verdict(&self) -> Verdict {
        if !self.damage.is_empty() {
            Verdict::Damaged
        } else if !self.actions.is_empty() {
            Verdict::Recoverable
        } else {
            Verdict::Healthy
        }
    }
}

impl fmt::Display for PartitionReport {
    /// Indented detail lines (the caller prints the heading with the verdict).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let damaged = self.verdict() == Verdict::Damaged;
        for damage in &self.damage {
            writeln!(f, "  damage: {damage}")?;
        }
        match &self.log {
            Some(log) if damaged => writeln!(f, "  verified before the damage: {log}")?,
            Some(log) => writeln!(f, "  log: {log}")?,
            None => writeln!(f, "  log: not verified ({} segment file(s))", self.segment_files)?,
        }
        if let Some(resume_offset) = self.resume_offset {
            writeln!(f, "  next open mints from offset {resume_offset}")?;
        }
        for action in &self.actions {
            writeln!(f, "  boot will: {action}")?;
        }
        for note in &self.notes {
            writeln!(f, "  note: {note}")?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Data directory
// ---------------------------------------------------------------------------------------------

/// A partition found on disk or named by the metadata.
#[derive(Debug, Clone)]
pub enum PartitionStatus {
    Checked(Box<PartitionReport>),
    /// Named by the metadata, no directory: open refuses it.
    Missing {
        dir: PathBuf,
    },
    /// A directory the metadata does not name: boot deletes it (a delete interrupted after
    /// its metadata was saved).
    Orphan {
        dir: PathBuf,
    },
}

#[derive(Debug, Clone)]
pub struct PartitionEntry {
    pub stream_id: u32,
    pub topic_id: u32,
    pub partition_id: u32,
    pub status: PartitionStatus,
}

impl PartitionEntry {
    pub fn verdict(&self) -> Verdict {
        match &self.status {
            PartitionStatus::Checked(report) => report.verdict(),
            PartitionStatus::Missing { .. } => Verdict::Damaged,
            PartitionStatus::Orphan { .. } => Verdict::Recoverable,
        }
    }
}

/// The metadata document's verification.
#[derive(Debug, Clone)]
pub struct MetadataReport {
    pub verdict: Verdict,
    pub detail: String,
    /// `(stream, topic, partition)` ids it names, when it is readable.
    pub named: Option<BTreeSet<(u32, u32, u32)>>,
    /// Purge targets the metadata records (`PartitionDoc::purge_target`, absent = 0), by
    /// `(stream, topic, partition)`.
    pub purge_targets: BTreeMap<(u32, u32, u32), u64>,
}

/// The report of [`check_data_dir`].
#[derive(Debug, Clone)]
pub struct DataDirReport {
    pub data_dir: PathBuf,
    /// Another process holds the data directory lock (a running server): results may include
    /// writes in flight.
    pub in_use: bool,
    pub metadata: MetadataReport,
    pub partitions: Vec<PartitionEntry>,
}

impl DataDirReport {
    /// `(healthy, recoverable, damaged)` partition counts.
    pub fn counts(&self) -> (usize, usize, usize) {
        let count = |verdict| {
            self.partitions
                .iter()
                .filter(|entry| entry.verdict() == verdict)
                .count()
        };
        (
            count(Verdict::Healthy),
            count(Verdict::Recoverable),
            count(Verdict::Damaged),
        )
    }

    /// Healthy only when the metadata and every partition are.
    pub fn verdict(&self) -> Verdict {
        self.partitions
            .iter()
            .map(PartitionEntry::verdict)
            .fold(self.metadata.verdict, Verdict::max)
    }
}

impl fmt::Display for DataDirReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "data dir {}", self.data_dir.display())?;
        if self.in_use {
            writeln!(
                f,
                "warning: another process (a running server?) holds the data directory lock; in-flight writes may show as torn tails"
            )?;
        }
        writeln!(
            f,
            "metadata: {} ({})",
            self.metadata.verdict, self.metadata.detail
        )?;
        for entry in &self.partitions {
            write!(
                f,
                "stream {} / topic {} / partition {}: {}",
                entry.stream_id,
                entry.topic_id,
                entry.partition_id,
                entry.verdict()
            )?;
            match &entry.status {
                PartitionStatus::Checked(report) => write!(f, "\n{report}")?,
                PartitionStatus::Missing { dir } => writeln!(
                    f,
                    "\n  damage: {} at byte 0: partition named by the metadata has no directory",
                    dir.display()
                )?,
                PartitionStatus::Orphan { dir } => writeln!(
                    f,
                    "\n  boot will: delete {} (not named by the metadata: a deleted partition)",
                    dir.display()
                )?,
            }
        }
        let (healthy, recoverable, damaged) = self.counts();
        writeln!(
            f,
            "{} partitions: {healthy} healthy, {recoverable} recoverable, {damaged} damaged",
            self.partitions.len()
        )
    }
}

/// The caller's checker of one partition directory (the server's: a partition group
/// recovered read-only, as boot would): given the directory and the `(stream, topic,
/// partition)` ids, its report. A directory it cannot read is damage in the report.
pub type PartitionCheck<'a> = &'a dyn Fn(&Path, (u32, u32, u32)) -> PartitionReport;

/// Verify a whole data directory without changing anything: the metadata (its verdict given
/// by the caller, who reads the replicated metadata log this crate does not know; `None`
/// reads the metadata document `<data_dir>/metadata` of an earlier release) and every
/// partition directory, named or not, through `check_partition`. `Err` if the data directory
/// cannot be read at all.
pub fn check_data_dir_with(
    data_dir: &Path,
    metadata: Option<MetadataReport>,
    check_partition: PartitionCheck<'_>,
) -> Result<DataDirReport, StorageError> {
    let disk = RealDisk;
    // Listing fails with an IO error (path included) for a missing or unreadable directory.
    disk.list_dir(data_dir)?;
    let in_use = DataDirLock::is_held(data_dir)?;
    let mut on_disk: BTreeMap<(u32, u32, u32), PathBuf> = BTreeMap::new();
    let streams_dir = data_dir.join("streams");
    for (stream_id, stream_dir) in numeric_dirs(&disk, &streams_dir)? {
        for (topic_id, topic_dir) in numeric_dirs(&disk, &stream_dir.join("topics"))? {
            for (partition_id, partition_dir) in numeric_dirs(&disk, &topic_dir.join("partitions"))? {
                on_disk.insert((stream_id, topic_id, partition_id), partition_dir);
            }
        }
    }
    let metadata = match metadata {
        Some(metadata) => metadata,
        None => check_metadata(&disk, data_dir, on_disk.len())?,
    };
    let mut ids: BTreeSet<(u32, u32, u32)> = on_disk.keys().copied().collect();
    if let Some(named) = &metadata.named {
        ids.extend(named.iter().copied());
    }
    let mut partitions = Vec::with_capacity(ids.len());
    for id @ (stream_id, topic_id, partition_id) in ids {
        let named = metadata.named.as_ref().map(|named| named.contains(&id));
        let status = match (on_disk.get(&id), named) {
            (Some(dir), Some(false)) => PartitionStatus::Orphan { dir: dir.clone() },
            (Some(dir), _) => {
                let mut report = check_partition(dir, id);
                if let Some(&purge_target) = metadata.purge_targets.get(&id) {
                    apply_purge_target(&mut report, purge_target);
                }
                PartitionStatus::Checked(Box::new(report))
            }
            (None, _) => PartitionStatus::Missing {
                dir: streams_dir
                    .join(stream_id.to_string())
                    .join("topics")
                    .join(topic_id.to_string())
                    .join("partitions")
                    .join(partition_id.to_string()),
            },
        };
        partitions.push(PartitionEntry {
            stream_id,
            topic_id,
            partition_id,
            status,
        });
    }
    Ok(DataDirReport {
        data_dir: data_dir.to_path_buf(),
        in_use,
        metadata,
        partitions,
    })
}

/// What the server's boot does with a purge target the metadata records for a partition that
/// opens (`catalog::finish_purge` in the server): finish the purge if the log still starts
/// below it; refuse the partition if the log ends below it (the target was its append counter).
fn apply_purge_target(report: &mut PartitionReport, purge_target: u64) {
    if report.verdict() == Verdict::Damaged {
        return;
    }
    let (Some(log), Some(resume_offset)) = (report.log, report.resume_offset) else {
        return;
    };
    if log.start_offset >= purge_target {
        return;
    }
    if resume_offset < purge_target {
        report.damage.push(Damage {
            path: report.dir.clone(),
            position: 0,
            reason: format!(
                "the log ends at offset {resume_offset}, below the purge target {purge_target} recorded in the metadata (lost data)"
            ),
        });
    } else {
        report.actions.push(BootAction::FinishMetadataPurge {
            purge_target,
            start_offset: log.start_offset,
        });
    }
}

/// Entries of `dir` whose names are numeric ids (as the catalog reads them); none if `dir`
/// does not exist.
fn numeric_dirs(disk: &dyn Disk, dir: &Path) -> Result<Vec<(u32, PathBuf)>, StorageError> {
    if disk.file_len(dir)?.is_none() {
        return Ok(Vec::new());
    }
    Ok(disk
        .list_dir(dir)?
        .into_iter()
        .filter_map(|name| Some((name.parse::<u32>().ok()?, dir.join(name))))
        .collect())
}

fn check_metadata(
    disk: &dyn Disk,
    data_dir: &Path,
    partition_dirs: usize,
) -> Result<MetadataReport, StorageError> {
    let path = data_dir.join(METADATA_FILE_NAME);
    let damaged = |detail: String| MetadataReport {
        verdict: Verdict::Damaged,
        detail,
        named: None,
        purge_targets: BTreeMap::new(),
    };
    let contents = match atomic_file::read_verified_on(disk, &path) {
        Ok(Some(contents)) => contents,
        Ok(None) if partition_dirs == 0 => {
            return Ok(MetadataReport {
                verdict: Verdict::Healthy,
                detail: "none yet (first start)".into(),
                named: None,
                purge_targets: BTreeMap::new(),
            });
        }
        Ok(None) => {
            return Ok(damaged(format!(
                "{} missing while {partition_dirs} partition directories exist: the server would start empty and delete them as orphans",
                path.display()
            )));
        }
        Err(StorageError::Damaged { position, reason, .. }) => {
            return Ok(damaged(format!(
                "{} at byte {position}: {reason}",
                path.display()
            )));
        }
        Err(error) => return Err(error),
    };
    let (named, purge_targets) = match named_partitions(&contents) {
        Ok(found) => found,
        Err(reason) => return Ok(damaged(format!("{}: {reason}", path.display()))),
    };
    let streams: BTreeSet<u32> = named.iter().map(|&(stream, _, _)| stream).collect();
    let mut detail = format!(
        "{} partition(s) named in {} stream(s) with partitions",
        named.len(),
        streams.len()
    );
    let mut verdict = Verdict::Healthy;
    let staging = atomic_file::tmp_path(&path);
    if disk.file_len(&staging)?.is_some() {
        verdict = Verdict::Recoverable;
        detail.push_str(&format!(
            "; boot will remove the stale staging file {}",
            staging.display()
        ));
    }
    Ok(MetadataReport {
        verdict,
        detail,
        named: Some(named),
        purge_targets,
    })
}

/// `(stream, topic, partition)`.
type PartitionKey = (u32, u32, u32);
/// Purge targets by partition, as read from the metadata.
type PurgeTargets = BTreeMap<PartitionKey, u64>;

/// `(stream, topic, partition)` ids named by the metadata JSON (the fields the catalog's
/// `MetadataDoc` gives them; everything else is left to the server), and the non-zero purge
/// targets among them.
fn named_partitions(contents: &[u8]) -> Result<(BTreeSet<PartitionKey>, PurgeTargets), String> {
    let doc: serde_json::Value = serde_json::from_slice(contents)
        .map_err(|error| format!("metadata document does not decode: {error}"))?;
    let version = doc.get("format_version").and_then(serde_json::Value::as_u64);
    if version != Some(METADATA_FORMAT_VERSION) {
        return Err(format!("unsupported metadata format version {version:?}"));
    }
    let array = |value: &serde_json::Value, key: &str| -> Result<Vec<serde_json::Value>, String> {
        value
            .get(key)
            .and_then(serde_json::Value::as_array)
            .cloned()
            .ok_or_else(|| format!("metadata lacks the array {key:?}"))
    };
    let id = |value: &serde_json::Value| -> Result<u32, String> {
        value
            .get("id")
            .and_then(serde_json::Value::as_u64)
            .and_then(|id| u32::try_from(id).ok())
            .ok_or_else(|| "metadata entry lacks a valid \"id\"".to_string())
    };
    let mut named = BTreeSet::new();
    let mut purge_targets = BTreeMap::new();
    for stream in array(&doc, "streams")? {
        let stream_id = id(&stream)?;
        for topic in array(&stream, "topics")? {
            let topic_id = id(&topic)?;
            for partition in array(&topic, "partitions")? {
                let key = (stream_id, topic_id, id(&partition)?);
                named.insert(key);
                match partition.get("purge_target") {
                    None => {}
                    Some(value) => {
                        let target = value.as_u64().ok_or_else(|| {
                            "metadata partition has an invalid \"purge_target\"".to_string()
                        })?;
                        if target > 0 {
                            purge_targets.insert(key, target);
                        }
                    }
                }
            }
        }
    }
    Ok((named, purge_targets))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_ids() {
        let doc = br#"{"format_version":1,"streams":[{"id":1,"topics":[{"id":2,"partitions":[{"id":0},{"id":1}]}]}]}"#;
        let (named, purge_targets) = named_partitions(doc).unwrap();
        assert_eq!(named, BTreeSet::from([(1, 2, 0), (1, 2, 1)]));
        assert!(purge_targets.is_empty());
        let doc = br#"{"format_version":1,"streams":[{"id":1,"topics":[{"id":2,"partitions":[{"id":0,"purge_target":7},{"id":1,"purge_target":0}]}]}]}"#;
        let (_, purge_targets) = named_partitions(doc).unwrap();
        assert_eq!(purge_targets, BTreeMap::from([((1, 2, 0), 7)]));
        let doc = br#"{"format_version":1,"streams":[{"id":1,"topics":[{"id":2,"partitions":[{"id":0,"purge_target":-1}]}]}]}"#;
        assert!(named_partitions(doc).is_err());
        assert!(named_partitions(br#"{"format_version":2,"streams":[]}"#).is_err());
        assert!(named_partitions(br#"{"format_version":1,"streams":[{"topics":[]}]}"#).is_err());
        assert!(named_partitions(b"not json").is_err());
    }
}
