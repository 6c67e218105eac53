//! Offline verification and the explicit accept-loss repair (the operator tools `cairn check`
//! and `cairn repair --accept-loss`, durability contract guarantee 4).
//!
//! # Check (read-only)
//!
//! [`check_partition`] runs the very recovery planning phase that `PartitionLog::open` runs
//! (`log::plan_recovery`: list, read, verify, decide) and reports what open would do, without
//! doing it: every call on the [`Disk`] is a read. The verdict is
//! - [`Verdict::Healthy`]: open has nothing to repair;
//! - [`Verdict::Recoverable`]: open fixes it by itself (torn tail, index rebuild, interrupted
//!   purge, a gap after an unclean stop, stale staging files), each listed as a [`BootAction`];
//! - [`Verdict::Damaged`]: open refuses the partition (file, byte position, reason).
//!
//! [`check_data_dir`] walks `<data_dir>/streams/*/topics/*/partitions/*` and compares what it
//! finds with the metadata document.
//!
//! # Repair (explicit loss)
//!
//! [`repair_accept_loss`] makes a refused partition open again by cutting the log at its first
//! damage. The cut is planned, then proven, on a read-only *view* of the directory
//! ([`Overlay`]): the same `plan_recovery` runs on the view, each refusal it reports becomes a
//! cut (truncate the segment at the damage, hide every later segment), until the view opens;
//! then a new `state` is put into the view and the view must open once more. Only then is
//! anything written. Nothing is deleted: the cut bytes and every later file are moved into
//! `<partition dir>/quarantine-<n>/` with a `REPAIR.txt` manifest.
//!
//! Offsets are never re-issued: the new `state` keeps the old offset reservation (or, if the
//! state itself was lost, rebuilds one above every offset seen plus a lease block), never lower
//! than the end of any checksum-valid record found in the quarantined bytes, and is marked not
//! cleanly stopped, so the next open resumes minting at the reservation behind a recorded gap.
//!
//! Repair must never run against a partition a live server uses: stop the server first. The
//! CLI takes the data directory lock ([`crate::lock::DataDirLock`]) before calling it.
//!
//! Layout knowledge mirrored from the server's catalog (`crates/cairn/src/catalog.rs`): the
//! metadata document `<data_dir>/metadata`, partition directories
//! `<data_dir>/streams/<s>/topics/<t>/partitions/<p>/` named by their numeric ids, and the
//! consumer offsets directory `offsets/` inside a partition directory.

use crate::StorageError;
use crate::atomic_file;
use crate::io::{Disk, ReadFile, RealDisk, WriteFile};
use crate::lock::DataDirLock;
use crate::log::{
    self, EntryName, OFFSET_LEASE_BLOCK_COUNT_DEFAULT, RecoveryPlan, START_FILE_NAME, next_offset_after_open,
    parse_entry_name, segment_index_name, segment_log_name,
};
use crate::offsets::{ConsumerOffsets, OffsetsCheck};
use crate::record::{self, Chain, RECORD_HEADER_SIZE, RecordKind};
use crate::state::{self, Frontier, PartitionState, STATE_FILE_NAME, STATE_FILE_SIZE_BYTES};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

/// The consumer offsets directory inside a partition directory (catalog.rs `offsets_dir`).
pub const OFFSETS_DIR_NAME: &str = "offsets";
/// The metadata document inside a data directory (catalog.rs `metadata_path`).
pub const METADATA_FILE_NAME: &str = "metadata";
/// The metadata format version the server reads (catalog.rs `METADATA_FORMAT_VERSION`).
pub const METADATA_FORMAT_VERSION: u64 = 1;
/// Prefix of the folders repair moves cut data into (`quarantine-<n>`).
pub const QUARANTINE_PREFIX: &str = "quarantine-";
/// The manifest repair writes into each quarantine folder.
pub const REPAIR_MANIFEST_NAME: &str = "REPAIR.txt";
/// Staging name of the state file repair writes (then renames over `state`).
pub const STATE_REPAIR_STAGING_NAME: &str = "state.repair.tmp";

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

/// Something open repairs by itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BootAction {
    /// Delete the segments of a purge that was interrupted (everything below `start.meta`).
    FinishPurge { base_offsets: Vec<u64> },
    /// The metadata records a topic or stream purge up to `purge_target` that did not reach
    /// this partition (its log starts at `start_offset`): the server purges it (messages and
    /// stored consumer offsets) before serving.
    FinishMetadataPurge { purge_target: u64, start_offset: u64 },
    /// Delete a staging file of an interrupted index rebuild or `start.meta` write.
    RemoveStaging { path: PathBuf },
    /// Truncate the torn tail of the last segment.
    TruncateTornTail {
        path: PathBuf,
        valid_len_bytes: u64,
        file_len_bytes: u64,
        fault: String,
    },
    /// Rebuild a missing, torn or stale `.index` from the verified log.
    RebuildIndex { path: PathBuf },
    /// Create the empty active segment (after a purge, or a crash after a gap record).
    CreateSegment { path: PathBuf },
    /// After an unclean stop: seal the log with a gap record and resume minting at the
    /// reservation.
    Gap {
        recovered_end_offset: u64,
        resume_offset: u64,
    },
    /// Delete the staging file of an interrupted consumer offset store.
    RemoveOffsetStaging { path: PathBuf },
    /// Create the missing consumer offsets directory.
    CreateOffsetsDir { path: PathBuf },
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
            BootAction::FinishPurge { base_offsets } => {
                write!(f, "finish an interrupted purge: delete segments {base_offsets:?}")
            }
            BootAction::FinishMetadataPurge {
                purge_target,
                start_offset,
            } => write!(
                f,
                "finish a purge recorded in the metadata: delete every message below offset {purge_target} \
                 (the log starts at {start_offset}) and the stored consumer offsets"
            ),
            BootAction::RemoveStaging { path } => write!(f, "remove stale staging file {}", path.display()),
            BootAction::TruncateTornTail {
                path,
                valid_len_bytes,
                file_len_bytes,
                fault,
            } => write!(
                f,
                "truncate the torn tail of {} at byte {valid_len_bytes} (file is {file_len_bytes} bytes; {fault})",
                path.display()
            ),
            BootAction::RebuildIndex { path } => write!(f, "rebuild index {}", path.display()),
            BootAction::CreateSegment { path } => {
                write!(f, "create the empty active segment {}", path.display())
            }
            BootAction::Gap {
                recovered_end_offset,
                resume_offset,
            } => write!(
                f,
                "not stopped cleanly: record a gap {recovered_end_offset}..{resume_offset} and resume minting at {resume_offset}"
            ),
            BootAction::RemoveOffsetStaging { path } => {
                write!(f, "remove stale consumer offset staging file {}", path.display())
            }
            BootAction::CreateOffsetsDir { path } => {
                write!(
                    f,
                    "create the missing consumer offsets directory {}",
                    path.display()
                )
            }
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
    pub gap_records: u64,
    pub messages: u64,
    pub verified_bytes: u64,
    /// The offset the log starts at (0, or the purge point).
    pub start_offset: u64,
    /// The offset after the last verified record.
    pub end_offset: u64,
}

impl LogSummary {
    fn of(plan: &RecoveryPlan) -> LogSummary {
        let mut summary = LogSummary {
            segments_count: plan.segments.len(),
            start_offset: plan.segments.first().map_or(0, |segment| segment.base_offset),
            end_offset: plan.chain.next_offset,
            ..LogSummary::default()
        };
        for segment in &plan.segments {
            summary.batch_records += segment.index.len() as u64;
            summary.gap_records += u64::from(segment.gap.is_some());
            summary.messages += segment.end_offset - segment.base_offset;
            summary.verified_bytes += segment.size_bytes;
        }
        summary
    }
}

impl fmt::Display for LogSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} segment(s), {} batch record(s)",
            self.segments_count, self.batch_records
        )?;
        if self.gap_records > 0 {
            write!(f, " + {} gap record(s)", self.gap_records)?;
        }
        write!(
            f,
            ", {} message(s) (offsets {}..{}), {} bytes verified",
            self.messages, self.start_offset, self.end_offset, self.verified_bytes
        )
    }
}

/// The report of [`check_partition`].
#[derive(Debug, Clone)]
pub struct PartitionReport {
    pub dir: PathBuf,
    pub partition_id: u32,
    /// `.log` files in the directory.
    pub segment_files: usize,
    /// What open would keep: the whole verified log, or for a damaged partition the verified
    /// prefix before the first damage (`None` if even that could not be determined).
    pub log: Option<LogSummary>,
    /// The state file as open loads it, or why it does not load.
    pub state: Option<Result<PartitionState, String>>,
    /// Where minting resumes at the next open (`None` when open refuses).
    pub resume_offset: Option<u64>,
    /// Segments whose `.index` open rebuilds.
    pub index_rebuilds: Vec<PathBuf>,
    pub offsets: OffsetsCheck,
    /// What open repairs by itself.
    pub actions: Vec<BootAction>,
    /// Why open refuses (log or state damage first, then damaged consumer offset files).
    pub damage: Vec<Damage>,
    /// For a damaged partition: what `repair --accept-loss` would do, or why it cannot.
    pub repair: Option<Result<RepairPreview, String>>,
    /// Things open ignores (unknown files, quarantine folders of earlier repairs).
    pub notes: Vec<String>,
}

impl PartitionReport {
    /// A report with nothing found yet (for a checker of another layout to fill in).
    pub fn empty(dir: &Path, partition_id: u32) -> PartitionReport {
        PartitionReport {
            dir: dir.to_path_buf(),
            partition_id,
            segment_files: 0,
            log: None,
            state: None,
            resume_offset: None,
            index_rebuilds: Vec::new(),
            offsets: OffsetsCheck::default(),
            actions: Vec::new(),
            damage: Vec::new(),
            repair: None,
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
        match &self.state {
            Some(Ok(state)) => writeln!(
                f,
                "  state: frontier at offset {} ({} byte {}), offset reservation {}, boot floor {}, clean stop {}",
                state.frontier.next_offset(),
                segment_log_name(state.frontier.segment_base_offset),
                state.frontier.segment_len_bytes,
                state.offset_reserved,
                state.boot_floor,
                if state.clean_stop { "yes" } else { "no" }
            )?,
            Some(Err(reason)) => writeln!(f, "  state: unusable ({reason})")?,
            None => writeln!(f, "  state: missing")?,
        }
        if let Some(resume_offset) = self.resume_offset {
            writeln!(f, "  next open mints from offset {resume_offset}")?;
        }
        if self.index_rebuilds.is_empty() {
            if !damaged {
                writeln!(f, "  indexes: consistent")?;
            }
        } else {
            writeln!(f, "  indexes: {} to rebuild", self.index_rebuilds.len())?;
        }
        let offsets = &self.offsets;
        if offsets.dir_missing {
            writeln!(f, "  consumer offsets: directory missing")?;
        } else {
            writeln!(
                f,
                "  consumer offsets: {} stored, {} damaged",
                offsets.stored_count,
                offsets.damaged.len()
            )?;
        }
        for action in &self.actions {
            writeln!(f, "  boot will: {action}")?;
        }
        match &self.repair {
            Some(Ok(preview)) => writeln!(f, "  repair --accept-loss would: {preview}")?,
            Some(Err(reason)) => writeln!(f, "  repair --accept-loss cannot fix this: {reason}")?,
            None => {}
        }
        for note in &self.notes {
            writeln!(f, "  note: {note}")?;
        }
        Ok(())
    }
}

/// Verify one partition directory without changing anything. `Err` only for failures to read
/// the directory itself; everything open would refuse is reported as damage.
pub fn check_partition(dir: &Path, partition_id: u32) -> Result<PartitionReport, StorageError> {
    check_partition_on(&RealDisk, dir, partition_id)
}

/// [`check_partition`] through `disk` (only its read calls are used).
pub fn check_partition_on(
    disk: &dyn Disk,
    dir: &Path,
    partition_id: u32,
) -> Result<PartitionReport, StorageError> {
    let mut report = PartitionReport::empty(dir, partition_id);
    if disk.file_len(dir)?.is_none() {
        report.damage.push(Damage {
            path: dir.to_path_buf(),
            position: 0,
            reason: "partition directory missing".into(),
        });
        return Ok(report);
    }
    for name in disk.list_dir(dir)? {
        match parse_entry_name(&name) {
            EntryName::Log(_) => report.segment_files += 1,
            EntryName::Other if name == OFFSETS_DIR_NAME => {}
            EntryName::Other if name.starts_with(QUARANTINE_PREFIX) => {
                report
                    .notes
                    .push(format!("{name}/ holds data cut by an earlier repair"));
            }
            EntryName::Other => report
                .notes
                .push(format!("unknown file {name} (ignored by open)")),
            _ => {}
        }
    }
    report.state = load_state(disk, dir, partition_id)?;

    match quietly(|| log::plan_recovery(disk, dir, partition_id)) {
        Ok(plan) => describe_plan(disk, dir, &plan, &mut report)?,
        Err(StorageError::Damaged {
            path,
            position,
            reason,
        }) => {
            report.damage.push(Damage {
                path,
                position,
                reason,
            });
            report.repair = Some(match plan_salvage(disk, dir, partition_id) {
                Ok(salvage) => {
                    report.log = Some(LogSummary::of(&salvage.plan));
                    Ok(salvage.preview())
                }
                Err(error) => Err(error.to_string()),
            });
        }
        // Open refuses on any failure (the server marks the partition refused), so an
        // unreadable partition is reported as damage rather than aborting the whole check.
        Err(error) => report.damage.push(Damage {
            path: dir.to_path_buf(),
            position: 0,
            reason: format!("cannot be read: {error}"),
        }),
    }

    let offsets_dir = dir.join(OFFSETS_DIR_NAME);
    report.offsets = ConsumerOffsets::check_on(disk, &offsets_dir)?;
    if report.offsets.dir_missing {
        report.actions.push(BootAction::CreateOffsetsDir {
            path: offsets_dir.clone(),
        });
    }
    for name in &report.offsets.stale_staging {
        report.actions.push(BootAction::RemoveOffsetStaging {
            path: offsets_dir.join(name),
        });
    }
    for (name, position, reason) in &report.offsets.damaged {
        report.damage.push(Damage {
            path: offsets_dir.join(name),
            position: *position,
            reason: reason.clone(),
        });
    }
    for name in &report.offsets.unknown {
        report.notes.push(format!(
            "unknown file {OFFSETS_DIR_NAME}/{name} (ignored by open)"
        ));
    }
    if report.repair.is_none() && !report.offsets.damaged.is_empty() {
        report.repair = Some(Ok(RepairPreview {
            damaged_offset_files: report.offsets.damaged.len(),
            ..RepairPreview::default()
        }));
    }
    Ok(report)
}

/// The state as open would load it: `None` if missing, `Err(reason)` if unusable.
fn load_state(
    disk: &dyn Disk,
    dir: &Path,
    partition_id: u32,
) -> Result<Option<Result<PartitionState, String>>, StorageError> {
    match disk.read_all(&dir.join(STATE_FILE_NAME), STATE_FILE_SIZE_BYTES) {
        Ok(None) => Ok(None),
        Ok(Some(bytes)) => Ok(Some(
            state::load(&bytes, partition_id).map_err(|(_, reason)| reason),
        )),
        Err(StorageError::Damaged { reason, .. }) => Ok(Some(Err(reason))),
        Err(error) => Err(error),
    }
}

/// Fill `report` from a successful plan: what open keeps and what it repairs.
fn describe_plan(
    disk: &dyn Disk,
    dir: &Path,
    plan: &RecoveryPlan,
    report: &mut PartitionReport,
) -> Result<(), StorageError> {
    report.log = Some(LogSummary::of(plan));
    for name in &plan.stale_staging {
        report
            .actions
            .push(BootAction::RemoveStaging { path: dir.join(name) });
    }
    if !plan.purged_bases.is_empty() {
        report.actions.push(BootAction::FinishPurge {
            base_offsets: plan.purged_bases.clone(),
        });
    }
    if let Some((base, valid_len_bytes)) = plan.truncate_last {
        let path = dir.join(segment_log_name(base));
        report.actions.push(BootAction::TruncateTornTail {
            file_len_bytes: disk.file_len(&path)?.unwrap_or(0),
            path,
            valid_len_bytes,
            fault: plan.torn_tail_fault.clone().unwrap_or_default(),
        });
    }
    for &base in &plan.rebuild_index_bases {
        let path = dir.join(segment_index_name(base));
        report.index_rebuilds.push(path.clone());
        report.actions.push(BootAction::RebuildIndex { path });
    }
    if plan.create_empty_segment
        && disk
            .file_len(&dir.join(segment_log_name(plan.chain.next_offset)))?
            .is_none()
    {
        report.actions.push(BootAction::CreateSegment {
            path: dir.join(segment_log_name(plan.chain.next_offset)),
        });
    }
    let resume_offset = next_offset_after_open(plan.chain.next_offset, &plan.state);
    report.resume_offset = Some(resume_offset);
    if resume_offset > plan.chain.next_offset {
        report.actions.push(BootAction::Gap {
            recovered_end_offset: plan.chain.next_offset,
            resume_offset,
        });
    }
    Ok(())
}

/// Run `f` with log events discarded: the planning phase logs refusals ("refusing it") that
/// are the server's words, not the checker's, and a salvage plan provokes several on purpose.
fn quietly<T>(f: impl FnOnce() -> T) -> T {
    tracing::subscriber::with_default(tracing::subscriber::NoSubscriber::default(), f)
}

// ---------------------------------------------------------------------------------------------
// Salvage planning (read-only)
// ---------------------------------------------------------------------------------------------

/// A read-only view of a partition directory with some entries hidden, truncated or replaced:
/// what the directory would look like after a repair. `plan_recovery` runs on it unchanged.
#[derive(Debug)]
struct Overlay<'a> {
    disk: &'a dyn Disk,
    dir: PathBuf,
    hidden: BTreeSet<String>,
    truncated: BTreeMap<String, u64>,
    replaced: BTreeMap<String, Vec<u8>>,
}

impl<'a> Overlay<'a> {
    fn new(disk: &'a dyn Disk, dir: &Path) -> Overlay<'a> {
        Overlay {
            disk,
            dir: dir.to_path_buf(),
            hidden: BTreeSet::new(),
            truncated: BTreeMap::new(),
            replaced: BTreeMap::new(),
        }
    }

    /// The entry name of `path` if it lies directly in the partition directory.
    fn name_of(&self, path: &Path) -> Option<String> {
        (path.parent() == Some(self.dir.as_path()))
            .then(|| path.file_name()?.to_str().map(str::to_string))
            .flatten()
    }

    fn read_only(&self) -> StorageError {
        StorageError::Invalid("the repair planning view is read-only".into())
    }
}

impl Disk for Overlay<'_> {
    fn create_dir_all(&self, _dir: &Path) -> Result<(), StorageError> {
        Err(self.read_only())
    }

    fn remove_dir(&self, _dir: &Path) -> Result<bool, StorageError> {
        Err(self.read_only())
    }

    fn list_dir(&self, dir: &Path) -> Result<Vec<String>, StorageError> {
        let mut names = self.disk.list_dir(dir)?;
        if dir == self.dir {
            names.retain(|name| !self.hidden.contains(name));
            names.extend(self.replaced.keys().cloned());
            names.sort();
            names.dedup();
        }
        Ok(names)
    }

    fn file_len(&self, path: &Path) -> Result<Option<u64>, StorageError> {
        let name = self.name_of(path);
        if let Some(name) = &name {
            if self.hidden.contains(name) {
                return Ok(None);
            }
            if let Some(bytes) = self.replaced.get(name) {
                return Ok(Some(bytes.len() as u64));
            }
        }
        let len = self.disk.file_len(path)?;
        Ok(match name.and_then(|name| self.truncated.get(&name).copied()) {
            Some(cut) => len.map(|len| len.min(cut)),
            None => len,
        })
    }

    fn read_all(&self, path: &Path, len_bytes_max: u64) -> Result<Option<Vec<u8>>, StorageError> {
        let Some(name) = self.name_of(path) else {
            return self.disk.read_all(path, len_bytes_max);
        };
        if self.hidden.contains(&name) {
            return Ok(None);
        }
        if let Some(bytes) = self.replaced.get(&name) {
            return Ok(Some(bytes.clone()));
        }
        let Some(&cut) = self.truncated.get(&name) else {
            return self.disk.read_all(path, len_bytes_max);
        };
        // Read only the kept prefix: the file may be larger than any plausible segment (that
        // may be the very damage that was cut).
        let Some(len) = self.disk.file_len(path)? else {
            return Ok(None);
        };
        let kept = len.min(cut);
        if kept > len_bytes_max {
            return Err(StorageError::Damaged {
                path: path.to_path_buf(),
                position: len_bytes_max,
                reason: format!("file of {kept} bytes exceeds the plausible maximum of {len_bytes_max}"),
            });
        }
        let mut bytes =
            vec![0u8; usize::try_from(kept).map_err(|_| StorageError::Invalid("file too large".into()))?];
        self.disk.open_read(path)?.read_exact_at(0, &mut bytes)?;
        Ok(Some(bytes))
    }

    fn open_read(&self, path: &Path) -> Result<Box<dyn ReadFile>, StorageError> {
        self.disk.open_read(path)
    }

    fn create_new(&self, _path: &Path) -> Result<Box<dyn WriteFile>, StorageError> {
        Err(self.read_only())
    }

    fn open_write(&self, _path: &Path) -> Result<Box<dyn WriteFile>, StorageError> {
        Err(self.read_only())
    }

    fn write_synced(&self, _path: &Path, _bytes: &[u8]) -> Result<(), StorageError> {
        Err(self.read_only())
    }

    fn rename(&self, _from: &Path, _to: &Path) -> Result<(), StorageError> {
        Err(self.read_only())
    }

    fn remove_file(&self, _path: &Path) -> Result<bool, StorageError> {
        Err(self.read_only())
    }

    fn sync_dir(&self, _dir: &Path) -> Result<(), StorageError> {
        Err(self.read_only())
    }
}

/// One change a repair makes to a partition directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cut {
    /// Keep bytes `..at_bytes` of the file; the rest moves to the quarantine folder.
    Truncate {
        name: String,
        at_bytes: u64,
        file_len_bytes: u64,
    },
    /// The whole file moves to the quarantine folder.
    Move { name: String },
}

/// Why a repair refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum RepairError {
    /// The partition opens as it is (nothing was changed).
    #[error("partition is {0}, not damaged: nothing to repair (nothing was changed)")]
    NotDamaged(Verdict),
    /// The damage is of a kind repair does not cut automatically (nothing was changed).
    #[error("{0} (nothing was changed)")]
    Unsupported(String),
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// What a repair would do (for the check report).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RepairPreview {
    pub cuts: Vec<Cut>,
    pub create_segment: Option<u64>,
    pub rewrite_state: bool,
    pub kept_end_offset: u64,
    /// Offsets `kept_end_offset..lost_end_offset` existed (at most) and are lost.
    pub lost_end_offset: u64,
    pub resume_offset: u64,
    pub damaged_offset_files: usize,
}

impl fmt::Display for RepairPreview {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.rewrite_state && self.cuts.is_empty() {
            return write!(
                f,
                "move {} damaged consumer offset file(s) to quarantine (the log is intact)",
                self.damaged_offset_files
            );
        }
        let mut parts = Vec::new();
        let mut moved = Vec::new();
        for cut in &self.cuts {
            match cut {
                Cut::Truncate {
                    name,
                    at_bytes,
                    file_len_bytes,
                } => parts.push(format!(
                    "cut {name} at byte {at_bytes} ({} bytes to quarantine)",
                    file_len_bytes.saturating_sub(*at_bytes)
                )),
                Cut::Move { name } => moved.push(name.as_str()),
            }
        }
        match moved.as_slice() {
            [] => {}
            [only] => parts.push(format!("move {only} to quarantine")),
            [first, .., last] => parts.push(format!(
                "move {} segment files ({first} .. {last}) to quarantine",
                moved.len()
            )),
        }
        if let Some(base) = self.create_segment {
            parts.push(format!("create empty segment {}", segment_log_name(base)));
        }
        if self.damaged_offset_files > 0 {
            parts.push(format!(
                "move {} damaged consumer offset file(s) to quarantine",
                self.damaged_offset_files
            ));
        }
        parts.push(if self.lost_end_offset > self.kept_end_offset {
            format!(
                "keep offsets below {}, lose offsets {}..{}",
                self.kept_end_offset, self.kept_end_offset, self.lost_end_offset
            )
        } else {
            format!("keep every offset below {}", self.kept_end_offset)
        });
        parts.push(format!("rewrite state, resume minting at {}", self.resume_offset));
        f.write_str(&parts.join("; "))
    }
}

/// A proven repair plan (see the module doc).
#[derive(Debug)]
struct Salvage {
    /// The plan of the repaired view, before the new state.
    plan: RecoveryPlan,
    cuts: Vec<Cut>,
    create_segment: Option<u64>,
    /// The state to write; `None` when the log opens as it is (only offset files are damaged).
    new_state: Option<PartitionState>,
    old_state: Option<PartitionState>,
    kept_end_offset: u64,
    lost_end_offset: u64,
    resume_offset: u64,
    damaged_offset_files: Vec<String>,
}

impl Salvage {
    fn preview(&self) -> RepairPreview {
        RepairPreview {
            cuts: self.cuts.clone(),
            create_segment: self.create_segment,
            rewrite_state: self.new_state.is_some(),
            kept_end_offset: self.kept_end_offset,
            lost_end_offset: self.lost_end_offset,
            resume_offset: self.resume_offset,
            damaged_offset_files: self.damaged_offset_files.len(),
        }
    }
}

/// Plan a repair on a read-only view and prove it: the view with the cuts and the new state
/// must pass `plan_recovery` with no torn tail left. Reads only.
///
/// Cost: each round re-plans the retained log (linear), and every round that finds damage
/// removes bytes or files from the view, so the rounds are bounded by the number of segment
/// files plus a constant; in practice a damaged partition converges in two or three.
fn plan_salvage(disk: &dyn Disk, dir: &Path, partition_id: u32) -> Result<Salvage, RepairError> {
    let start = match atomic_file::read_verified_on(disk, &dir.join(START_FILE_NAME)) {
        Ok(None) => Chain::genesis(partition_id),
        Ok(Some(bytes)) => log::decode_start(&bytes, partition_id).ok_or_else(|| {
            RepairError::Unsupported(format!(
                "{START_FILE_NAME} (where the log begins after a purge) is unusable; restore it from a backup"
            ))
        })?,
        Err(StorageError::Damaged { reason, .. }) => {
            return Err(RepairError::Unsupported(format!(
                "{START_FILE_NAME} (where the log begins after a purge) is damaged ({reason}); restore it from a backup"
            )));
        }
        Err(error) => return Err(error.into()),
    };
    let old_state = match load_state(disk, dir, partition_id)? {
        Some(Ok(state)) => Some(state),
        _ => None,
    };
    let damaged_offset_files: Vec<String> = ConsumerOffsets::check_on(disk, &dir.join(OFFSETS_DIR_NAME))?
        .damaged
        .into_iter()
        .map(|(name, _, _)| name)
        .collect();

    // The log alone as open would see it with the real state: nothing to cut.
    if let Ok(plan) = quietly(|| log::plan_recovery(disk, dir, partition_id)) {
        let kept_end_offset = plan.chain.next_offset;
        let resume_offset = next_offset_after_open(kept_end_offset, &plan.state);
        return Ok(Salvage {
            old_state: Some(plan.state),
            plan,
            cuts: Vec::new(),
            create_segment: None,
            new_state: None,
            kept_end_offset,
            lost_end_offset: kept_end_offset,
            resume_offset,
            damaged_offset_files,
        });
    }

    // Plan the cuts against a state whose frontier sits at the start of the log: then only
    // the log's own structure decides where the verified prefix ends (the real frontier is
    // rewritten anyway), and a state that is itself the damage does not hide the log.
    let mut view = Overlay::new(disk, dir);
    let planning_state = PartitionState {
        sequence: 1,
        frontier: Frontier {
            segment_base_offset: start.next_offset,
            segment_len_bytes: 0,
            chain: start,
        },
        offset_reserved: u64::MAX,
        boot_floor: 0,
        clean_stop: false,
        unsynced_acknowledged: false,
    };
    view.replaced.insert(
        STATE_FILE_NAME.to_string(),
        state::initial_file_bytes(&planning_state),
    );
    let names = disk.list_dir(dir)?;
    let mut cuts: Vec<Cut> = Vec::new();
    let mut create_segment = None;
    let rounds_max = names.len() + 4;
    let plan = 'rounds: {
        for _ in 0..rounds_max {
            match quietly(|| log::plan_recovery(&view, dir, partition_id)) {
                Ok(plan) => match plan.truncate_last {
                    // Torn relative to the planning frontier, but below the real one these were
                    // durable bytes: cut them into quarantine rather than let open drop them.
                    Some((base, at_bytes)) => {
                        cut_segment(&mut view, &mut cuts, &names, base, Some(at_bytes))?
                    }
                    None => break 'rounds plan,
                },
                Err(StorageError::Damaged {
                    path,
                    position,
                    reason,
                }) => {
                    let name = view.name_of(&path);
                    let entry = name.as_deref().map_or(EntryName::Other, parse_entry_name);
                    match entry {
                        EntryName::Log(base) => {
                            let file_len_bytes = view.file_len(&path)?.unwrap_or(0);
                            // Cut inside the file when that removes bytes; otherwise (a wrong
                            // base, an empty segment in the middle) the whole file goes.
                            let keep = (position < file_len_bytes).then_some(position);
                            cut_segment(&mut view, &mut cuts, &names, base, keep)?;
                        }
                        EntryName::Index(base) => {
                            // An index without its log: that segment is lost, and so is the
                            // chain after it.
                            cut_segment(&mut view, &mut cuts, &names, base, None)?;
                        }
                        _ if path == dir && create_segment.is_none() => {
                            // Every segment is gone: restart the log empty where it begins.
                            let base = start.next_offset;
                            view.replaced.insert(segment_log_name(base), Vec::new());
                            view.replaced.insert(segment_index_name(base), Vec::new());
                            create_segment = Some(base);
                        }
                        _ => {
                            return Err(RepairError::Unsupported(format!(
                                "no automatic cut for damage in {} at byte {position}: {reason}",
                                path.display()
                            )));
                        }
                    }
                }
                Err(error) => return Err(error.into()),
            }
        }
        return Err(RepairError::Unsupported(
            "repair planning did not converge on an openable log".into(),
        ));
    };

    // Every offset that existed: the old durable frontier, the verified records and segment
    // names in what is cut away. None of them may be minted again.
    let kept_end_offset = plan.chain.next_offset;
    let mut lost_end_offset = kept_end_offset;
    if let Some(state) = &old_state {
        lost_end_offset = lost_end_offset.max(state.frontier.next_offset());
    }
    for cut in &cuts {
        let (name, from_bytes) = match cut {
            Cut::Truncate { name, at_bytes, .. } => (name, *at_bytes),
            Cut::Move { name } => (name, 0),
        };
        if let EntryName::Log(base) | EntryName::Index(base) = parse_entry_name(name) {
            lost_end_offset = lost_end_offset.max(base);
        }
        if let EntryName::Log(_) = parse_entry_name(name)
            && let Some(bytes) = read_lenient(disk, &dir.join(name))?
            && let Some(end) =
                highest_end_offset(bytes.get(from_bytes as usize..).unwrap_or(&[]), partition_id)
        {
            lost_end_offset = lost_end_offset.max(end);
        }
    }
    let offset_reserved = match &old_state {
        Some(state) => state.offset_reserved.max(lost_end_offset),
        // The reservation itself is lost: the old one was at most a lease block above the
        // offsets written when it was raised.
        None => lost_end_offset.saturating_add(OFFSET_LEASE_BLOCK_COUNT_DEFAULT),
    };
    let last = plan
        .segments
        .last()
        .ok_or_else(|| RepairError::Unsupported("repair planning kept no segment".into()))?;
    let new_state = PartitionState {
        // The whole file is rewritten; a sequence above the old one keeps "newer = higher".
        sequence: old_state.map_or(1, |state| state.sequence + 2),
        frontier: Frontier {
            segment_base_offset: last.base_offset,
            segment_len_bytes: last.size_bytes,
            chain: plan.chain,
        },
        offset_reserved,
        boot_floor: old_state.map_or(0, |state| state.boot_floor),
        clean_stop: false,
        unsynced_acknowledged: false,
    };
    new_state
        .check()
        .map_err(|reason| RepairError::Unsupported(format!("the rebuilt state is inconsistent: {reason}")))?;

    // The proof: the repaired view opens with the new state, with nothing left to cut.
    view.replaced
        .insert(STATE_FILE_NAME.to_string(), state::initial_file_bytes(&new_state));
    match quietly(|| log::plan_recovery(&view, dir, partition_id)) {
        Ok(proof) if proof.chain == plan.chain && proof.truncate_last.is_none() => {}
        Ok(_) => {
            return Err(RepairError::Unsupported(
                "the repaired view recovers differently than planned".into(),
            ));
        }
        Err(error) => {
            return Err(RepairError::Unsupported(format!(
                "the repaired view would still be refused: {error}"
            )));
        }
    }
    let resume_offset = next_offset_after_open(kept_end_offset, &new_state);
    Ok(Salvage {
        plan,
        cuts,
        create_segment,
        new_state: Some(new_state),
        old_state,
        kept_end_offset,
        lost_end_offset,
        resume_offset,
        damaged_offset_files,
    })
}

/// Cut segment `base` in the view: keep bytes `..at` of its `.log` if `keep_at = Some(at)`
/// (else the whole segment goes), and every later segment file goes.
fn cut_segment(
    view: &mut Overlay<'_>,
    cuts: &mut Vec<Cut>,
    names: &[String],
    base: u64,
    keep_at: Option<u64>,
) -> Result<(), StorageError> {
    let log_name = segment_log_name(base);
    match keep_at {
        Some(at_bytes) => {
            view.truncated.insert(log_name.clone(), at_bytes);
            // A later round may cut the same file lower: one cut per file, the lowest.
            cuts.retain(|cut| !matches!(cut, Cut::Truncate { name, .. } if *name == log_name));
            let file_len_bytes = view.disk.file_len(&view.dir.join(&log_name))?.unwrap_or(0);
            cuts.push(Cut::Truncate {
                name: log_name,
                at_bytes,
                file_len_bytes,
            });
        }
        None => hide(view, cuts, log_name)?,
    }
    for name in names {
        let goes = match parse_entry_name(name) {
            EntryName::Log(other) | EntryName::Index(other) => {
                other > base || (other == base && keep_at.is_none())
            }
            _ => false,
        };
        if goes {
            hide(view, cuts, name.clone())?;
        }
    }
    Ok(())
}

/// Move a whole file out of the view (if it exists and is not already out).
fn hide(view: &mut Overlay<'_>, cuts: &mut Vec<Cut>, name: String) -> Result<(), StorageError> {
    if view.disk.file_len(&view.dir.join(&name))?.is_none() || !view.hidden.insert(name.clone()) {
        return Ok(());
    }
    // A file that moves whole needs no partial cut.
    view.truncated.remove(&name);
    cuts.retain(|cut| !matches!(cut, Cut::Truncate { name: cut_name, .. } if *cut_name == name));
    cuts.push(Cut::Move { name });
    Ok(())
}

/// The whole file, however large (bounded by what a segment may plausibly be read as); `None`
/// if it is missing or implausibly large.
fn read_lenient(disk: &dyn Disk, path: &Path) -> Result<Option<Vec<u8>>, StorageError> {
    match disk.read_all(path, log::SEGMENT_LOG_BYTES_MAX) {
        Ok(bytes) => Ok(bytes),
        Err(StorageError::Damaged { .. }) => Ok(None),
        Err(error) => Err(error),
    }
}

/// The highest offset end (`base + count` of a batch, the target of a gap) named by a
/// checksum-valid record of `partition_id` anywhere in `bytes`, in linear time: every position
/// gets constant-time shape checks, and hashing is capped by [`record::probe_budget_bytes`]
/// (header-shaped residue claiming huge sizes cannot make it superlinear). Garbage that does
/// not verify is never believed.
pub fn highest_end_offset(bytes: &[u8], partition_id: u32) -> Option<u64> {
    let mut budget_bytes = record::probe_budget_bytes(bytes.len() as u64, 0);
    let mut highest = None;
    let mut position = 0usize;
    while position + RECORD_HEADER_SIZE <= bytes.len() {
        let rest = &bytes[position..];
        if let Ok(header) = record::decode(rest)
            && header.partition_id == partition_id
            && header.record_size_bytes() <= rest.len() as u64
        {
            let size_bytes = header.record_size_bytes();
            if size_bytes > budget_bytes {
                break;
            }
            budget_bytes -= size_bytes;
            if let Ok(header) = record::verify_envelope(rest) {
                let end = match header.kind {
                    RecordKind::Batch => header.base_offset.saturating_add(u64::from(header.message_count)),
                    RecordKind::Gap | RecordKind::Op => header.base_offset,
                };
                highest = highest.max(Some(end));
                // A verified record is whole: skip it.
                position += size_bytes as usize;
                continue;
            }
        }
        position += 1;
    }
    highest
}

// ---------------------------------------------------------------------------------------------
// Repair (writes)
// ---------------------------------------------------------------------------------------------

/// What [`repair_accept_loss`] did.
#[derive(Debug, Clone)]
pub struct RepairReport {
    pub dir: PathBuf,
    /// The first damage open reported before the repair.
    pub damage: Vec<Damage>,
    pub quarantine_dir: PathBuf,
    /// `(from, to)` of every file moved whole.
    pub moved: Vec<(PathBuf, PathBuf)>,
    /// `(file, kept bytes, former length, where the cut bytes went)`.
    pub truncated: Vec<(PathBuf, u64, u64, PathBuf)>,
    pub created_segment: Option<PathBuf>,
    /// Where the replaced state file's old bytes were copied.
    pub state_copy: Option<PathBuf>,
    /// `(before, after)` when the state was rewritten.
    pub state: Option<(Option<PartitionState>, PartitionState)>,
    pub kept_end_offset: u64,
    /// Offsets `kept_end_offset..lost_end_offset` are lost (those that existed).
    pub lost_end_offset: u64,
    /// Where minting resumes at the next open.
    pub resume_offset: u64,
}

impl fmt::Display for RepairReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "repaired partition {} (loss accepted)", self.dir.display())?;
        for damage in &self.damage {
            writeln!(f, "  damage was: {damage}")?;
        }
        writeln!(f, "  quarantine: {}", self.quarantine_dir.display())?;
        for (file, kept, former, to) in &self.truncated {
            writeln!(
                f,
                "  cut {} at byte {kept} (was {former} bytes): bytes {kept}..{former} moved to {}",
                file.display(),
                to.display()
            )?;
        }
        for (from, to) in &self.moved {
            writeln!(f, "  moved {} -> {}", from.display(), to.display())?;
        }
        if let Some(path) = &self.created_segment {
            writeln!(f, "  created empty segment {}", path.display())?;
        }
        if let Some(copy) = &self.state_copy {
            writeln!(f, "  copied the old state file to {}", copy.display())?;
        }
        if let Some((before, after)) = &self.state {
            let before = before.map_or_else(
                || "unusable".to_string(),
                |state| {
                    format!(
                        "frontier {}, reservation {}",
                        state.frontier.next_offset(),
                        state.offset_reserved
                    )
                },
            );
            writeln!(
                f,
                "  state: was {before}; now frontier {} ({} byte {}), reservation {}, not cleanly stopped",
                after.frontier.next_offset(),
                segment_log_name(after.frontier.segment_base_offset),
                after.frontier.segment_len_bytes,
                after.offset_reserved
            )?;
        }
        if self.lost_end_offset > self.kept_end_offset {
            writeln!(
                f,
                "  offsets lost: {}..{} (every message below {} is kept)",
                self.kept_end_offset, self.lost_end_offset, self.kept_end_offset
            )?;
        } else {
            writeln!(
                f,
                "  offsets lost: none (every message below {} is kept)",
                self.kept_end_offset
            )?;
        }
        writeln!(f, "  minting resumes at offset {}", self.resume_offset)
    }
}

/// Make a refused partition open again by accepting the loss of everything from its first
/// damage on (see the module doc). Refuses with [`RepairError::NotDamaged`] (nothing changed)
/// when open would accept the partition. Idempotent: once repaired, the partition is no longer
/// damaged and a second run refuses; a run interrupted by a crash can simply be run again.
///
/// Precondition: no process uses the partition (stop the server; the CLI holds the data
/// directory lock).
pub fn repair_accept_loss(dir: &Path, partition_id: u32) -> Result<RepairReport, RepairError> {
    repair_accept_loss_on(&RealDisk, dir, partition_id)
}

/// [`repair_accept_loss`] through `disk`.
pub fn repair_accept_loss_on(
    disk: &dyn Disk,
    dir: &Path,
    partition_id: u32,
) -> Result<RepairReport, RepairError> {
    let check = check_partition_on(disk, dir, partition_id)?;
    let verdict = check.verdict();
    if verdict != Verdict::Damaged {
        return Err(RepairError::NotDamaged(verdict));
    }
    if disk.file_len(dir)?.is_none() {
        return Err(RepairError::Unsupported(format!(
            "partition directory {} is missing; recreate the partition instead",
            dir.display()
        )));
    }
    let salvage = plan_salvage(disk, dir, partition_id)?;
    tracing::warn!(dir = %dir.display(), damage = ?check.damage, plan = %salvage.preview(), "repair --accept-loss: cutting a damaged partition at its damage");

    // 1. The quarantine folder, durable before anything moves into it.
    let quarantine_dir = dir.join(next_quarantine_name(disk, dir)?);
    disk.create_dir_all(&quarantine_dir)?;
    disk.sync_dir(dir)?;
    let mut report = RepairReport {
        dir: dir.to_path_buf(),
        damage: check.damage.clone(),
        quarantine_dir: quarantine_dir.clone(),
        moved: Vec::new(),
        truncated: Vec::new(),
        created_segment: None,
        state_copy: None,
        state: salvage.new_state.map(|state| (salvage.old_state, state)),
        kept_end_offset: salvage.kept_end_offset,
        lost_end_offset: salvage.lost_end_offset,
        resume_offset: salvage.resume_offset,
    };

    // 2. Copies of the bytes to cut, synced, before any file shrinks.
    for cut in &salvage.cuts {
        let Cut::Truncate {
            name,
            at_bytes,
            file_len_bytes,
        } = cut
        else {
            continue;
        };
        let path = dir.join(name);
        let to = quarantine_dir.join(format!("{name}.cut-at-{at_bytes}"));
        let len_bytes = disk.file_len(&path)?.unwrap_or(0).min(*file_len_bytes);
        let mut tail = vec![
            0u8;
            usize::try_from(len_bytes.saturating_sub(*at_bytes))
                .map_err(|_| StorageError::Invalid("cut too large".into()))?
        ];
        disk.open_read(&path)?.read_exact_at(*at_bytes, &mut tail)?;
        disk.write_synced(&to, &tail)?;
        report.truncated.push((path, *at_bytes, len_bytes, to));
    }
    // The state file is replaced below, not edited: keep the old bytes too.
    if report.state.is_some()
        && let Some(old_bytes) = read_lenient(disk, &dir.join(STATE_FILE_NAME))?
    {
        let to = quarantine_dir.join(format!("{STATE_FILE_NAME}.before-repair"));
        disk.write_synced(&to, &old_bytes)?;
        report.state_copy = Some(to);
    }
    for cut in &salvage.cuts {
        if let Cut::Move { name } = cut {
            report.moved.push((dir.join(name), quarantine_dir.join(name)));
        }
    }
    let offsets_dir = dir.join(OFFSETS_DIR_NAME);
    let offsets_quarantine = quarantine_dir.join(OFFSETS_DIR_NAME);
    for name in &salvage.damaged_offset_files {
        report
            .moved
            .push((offsets_dir.join(name), offsets_quarantine.join(name)));
    }
    if let Some(base) = salvage.create_segment {
        report.created_segment = Some(dir.join(segment_log_name(base)));
    }
    // The manifest says what is about to happen, so a crash mid-repair leaves an explanation.
    disk.write_synced(
        &quarantine_dir.join(REPAIR_MANIFEST_NAME),
        report.to_string().as_bytes(),
    )?;
    disk.sync_dir(&quarantine_dir)?;

    // 3. The new state (atomic replace): the reservation is durable before any offset's data
    //    leaves the directory, so no later step can let an offset be minted twice.
    if let Some((_, new_state)) = &report.state {
        let staging = dir.join(STATE_REPAIR_STAGING_NAME);
        disk.write_synced(&staging, &state::initial_file_bytes(new_state))?;
        disk.rename(&staging, &dir.join(STATE_FILE_NAME))?;
        disk.sync_dir(dir)?;
    }

    // 4. Moves (renames within one file system: nothing is copied, nothing destroyed).
    if !salvage.damaged_offset_files.is_empty() {
        disk.create_dir_all(&offsets_quarantine)?;
    }
    for (from, to) in &report.moved {
        disk.rename(from, to)?;
    }
    // 5. Truncations, each synced.
    for (path, kept, _, _) in &report.truncated {
        let mut file = disk.open_write(path)?;
        file.set_len(*kept)?;
        file.sync_data()?;
    }
    // 6. The empty segment a log that lost everything restarts from.
    if let Some(base) = salvage.create_segment {
        for name in [segment_log_name(base), segment_index_name(base)] {
            if disk.file_len(&dir.join(&name))?.is_none() {
                drop(disk.create_new(&dir.join(&name))?);
            }
        }
    }
    disk.sync_dir(&quarantine_dir)?;
    if !salvage.damaged_offset_files.is_empty() {
        disk.sync_dir(&offsets_quarantine)?;
        disk.sync_dir(&offsets_dir)?;
    }
    disk.sync_dir(dir)?;

    // 7. What open will say now (read-only).
    let after = check_partition_on(disk, dir, partition_id)?;
    if after.verdict() == Verdict::Damaged {
        return Err(RepairError::Unsupported(format!(
            "after the repair the partition is still refused: {}",
            after
                .damage
                .first()
                .map_or_else(String::new, |damage| damage.to_string())
        )));
    }
    tracing::warn!(dir = %dir.display(), quarantine = %quarantine_dir.display(), resume_offset = report.resume_offset, "repair --accept-loss finished");
    Ok(report)
}

/// `quarantine-<n>`, one above every existing quarantine folder (no clock in storage).
fn next_quarantine_name(disk: &dyn Disk, dir: &Path) -> Result<String, StorageError> {
    let highest = disk
        .list_dir(dir)?
        .iter()
        .filter_map(|name| name.strip_prefix(QUARANTINE_PREFIX)?.parse::<u64>().ok())
        .max()
        .unwrap_or(0);
    Ok(format!("{QUARANTINE_PREFIX}{}", highest + 1))
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

/// Verify a whole data directory without changing anything: the metadata document and every
/// partition directory, named or not. `Err` if the data directory cannot be read at all.
pub fn check_data_dir(data_dir: &Path) -> Result<DataDirReport, StorageError> {
    check_data_dir_with(data_dir, None, &|_, _| None)
}

/// A checker for partition directories of a layout this crate does not open itself (a
/// partition group: the server's shell recovers it read-only): given the directory and the
/// `(stream, topic, partition)` ids, its report, or `None` when the directory is a record
/// log, which this crate checks.
pub type OtherLayoutCheck<'a> = &'a dyn Fn(&Path, (u32, u32, u32)) -> Option<PartitionReport>;

/// [`check_data_dir`] with the metadata's verdict given by the caller (the server reads its
/// replicated metadata log, which this crate does not know; `None` reads the metadata
/// document `<data_dir>/metadata`), and a checker for partitions of another layout.
pub fn check_data_dir_with(
    data_dir: &Path,
    metadata: Option<MetadataReport>,
    other_layout: OtherLayoutCheck<'_>,
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
                // One unreadable partition must not hide the verdicts of the others: open
                // refuses it, so it is reported as damage.
                let mut report = other_layout(dir, id).unwrap_or_else(|| {
                    check_partition_on(&disk, dir, partition_id).unwrap_or_else(|error| {
                        let mut report = PartitionReport::empty(dir, partition_id);
                        report.damage.push(Damage {
                            path: dir.clone(),
                            position: 0,
                            reason: format!("cannot be read: {error}"),
                        });
                        report
                    })
                });
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

    #[test]
    fn highest_end_offset_ignores_garbage_and_is_bounded() {
        assert_eq!(highest_end_offset(&[], 1), None);
        // Header-shaped residue claiming huge sizes is skipped byte by byte.
        let mut residue = Vec::new();
        for _ in 0..1000 {
            residue.extend_from_slice(&record::RECORD_MAGIC.to_le_bytes());
            residue.extend_from_slice(&[1, 1, 0, 0]);
            residue.extend_from_slice(&[0xff; 56]);
        }
        assert_eq!(highest_end_offset(&residue, 1), None);
    }
}
