//! `cairn repair --accept-loss`: an operator's repair of a partition refused for damage, on a
//! node whose partition groups have no peer to rebuild them from (the durability contract,
//! guarantee 4: "an explicit operator command can accept the loss (truncate at the damage)").
//!
//! Offline, with the data directory locked:
//! 1. The damaged group is read without trusting it: the machine snapshot of its durable
//!    checkpoint (when the superblock and the checkpoint verify), and the salvage of its
//!    journal, every whole, verifying op from the journal's start up to the damage
//!    (`JournalLog::open_salvage_on`). Everything from the damage on is what is lost.
//! 2. The partition's state at the end of that prefix is computed by the machine itself: the
//!    checkpoint's state with the prefix's later ops applied. When the damage lies below the
//!    checkpoint, the checkpoint's state is newer than anything the prefix holds, and is used.
//! 3. A new group is formatted in `<dir>.repair/`, and the prefix is appended to it again, op
//!    by op, each append with its original timestamp, so every kept message keeps its offset
//!    and its bytes (skips are replayed too). Then: a skip to the highest offset that may have
//!    been handed out (the old state's next offset, the journal's frontier and reservation,
//!    and every record from the damage on that still verifies; two leases more when the
//!    state file did not verify whole), so no offset is ever handed out twice; the state's
//!    retention start (a trim); and every stored consumer offset. The new journal is written
//!    in relaxed mode and made durable by its clean close (one barrier, not one per op).
//! 4. The new group is closed cleanly, `<dir>.repair.done` is written, the damaged directory
//!    is set aside whole (`<dir>.quarantine.<n>`, never deleted: `transfer::quarantine`), and
//!    the new one takes its name. A crash before the marker leaves the old directory serving
//!    nothing new (the next run starts again); after it, either the old directory or none is
//!    in place, and with none the server refuses the partition as unformatted until the repair
//!    is run again, which finishes the move.

use crate::node::GroupError;
use crate::partition_group::{self, JournalOptions, LogJournal, LogParams, PartitionError, PartitionGroup};
use cairn_machine::partition::{self, PartitionMachine, PartitionState};
use cairn_storage::StorageError;
use cairn_storage::io::{Disk, RealDisk};
use cairn_storage::journal::{JournalConfig, JournalLog, StoredOp};
use cairn_storage::transfer;
use cairn_vsr::replica::StateMachine;
use cairn_wire::batch;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Why a repair did not happen (nothing was changed, unless the error says otherwise).
#[derive(Debug, thiserror::Error)]
pub enum RepairError {
    /// The partition opens: there is nothing to repair.
    #[error("the partition is not damaged: {0}; nothing was changed")]
    NotDamaged(String),
    /// The partition cannot be repaired this way.
    #[error("{0}; nothing was changed")]
    Unsupported(String),
    #[error("{0}")]
    Storage(#[from] StorageError),
    #[error("{0}")]
    Group(#[from] GroupError),
    /// Building the new group failed: the damaged directory is untouched, and what was
    /// built is left in `<dir>.repair/` (the next run removes it).
    #[error("rebuilding the partition failed: {0}; the damaged directory was not changed")]
    Rebuild(String),
    /// The damaged directory was set aside, and putting the repaired one in its place failed:
    /// the server refuses the partition (no directory) until the repair is run again.
    #[error(
        "the damaged directory was moved to {quarantined}, and putting the repaired one in its place failed: {error}; run the repair again to finish"
    )]
    Interrupted {
        quarantined: String,
        error: StorageError,
    },
}

/// What a repair did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepairReport {
    pub dir: PathBuf,
    /// Where the damaged directory went, whole.
    pub quarantined: Option<PathBuf>,
    /// The damage: file, byte position, reason (`None`: the journal verified to its end; the
    /// damage was elsewhere, in the superblock or a checkpoint).
    pub damage: Option<(PathBuf, u64, String)>,
    /// Ops kept (the journal's first op through the last whole op before the damage).
    pub ops_kept: (u64, u64),
    /// Offsets of the messages kept: from the journal's start to the end of the prefix.
    pub offsets_kept: (u64, u64),
    /// Where minting resumes: offsets from the end of the prefix up to here are lost (or were
    /// never handed out).
    pub resume_offset: u64,
    /// The journal's state file did not verify whole, so what it last said was handed out is
    /// not known: minting resumes a margin above everything known.
    pub margin_added: bool,
    pub start_offset: u64,
    pub consumer_offsets: usize,
    /// How the state was known (from the checkpoint, and how many ops after it).
    pub state_from: String,
    /// A repair interrupted after its new group was complete, finished now.
    pub finished_interrupted: bool,
}

impl fmt::Display for RepairReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "partition {}", self.dir.display())?;
        if self.finished_interrupted {
            writeln!(
                f,
                "  finished a repair that was interrupted after its new log was complete"
            )?;
            return Ok(());
        }
        match &self.damage {
            Some((path, position, reason)) => {
                writeln!(f, "  damage: {} at byte {position}: {reason}", path.display())?
            }
            None => writeln!(
                f,
                "  every whole op of the journal verified (the refusal was elsewhere: its state file, superblock or checkpoint, or segments missing at its end)"
            )?,
        }
        writeln!(
            f,
            "  kept: ops {}..={}, messages at offsets {}..{} (offsets and bytes unchanged)",
            self.ops_kept.0, self.ops_kept.1, self.offsets_kept.0, self.offsets_kept.1
        )?;
        writeln!(
            f,
            "  lost: everything from the damage on (offsets {}..{}); new messages get offsets from {}, so none is handed out twice",
            self.offsets_kept.1, self.resume_offset, self.resume_offset
        )?;
        if self.margin_added {
            writeln!(
                f,
                "  (the journal's state file did not verify whole: new offsets start {} above the highest offset found, in case a lost record or reservation named one higher)",
                RESUME_MARGIN_OFFSETS
            )?;
        }
        writeln!(
            f,
            "  state: {}; retained from offset {}; {} stored consumer offset(s) kept",
            self.state_from, self.start_offset, self.consumer_offsets
        )?;
        if let Some(quarantined) = &self.quarantined {
            writeln!(
                f,
                "  the damaged files were moved, whole, to {} (never deleted: remove them once examined)",
                quarantined.display()
            )?;
        }
        Ok(())
    }
}

/// The segment size a repaired journal is written with when its topic sets none (the
/// server's default; a server with another reopens it with its own, which affects only later
/// writes).
const SEGMENT_SIZE_DEFAULT_BYTES: u64 = 1 << 30;

/// How far above every offset found minting resumes when the journal's state file did not
/// verify whole (its lost slot may have named a reservation up to one lease higher, and a
/// damaged last record names nothing): two leases.
const RESUME_MARGIN_OFFSETS: u64 = 2 * cairn_storage::journal::OFFSET_LEASE_MESSAGES;

/// A progress line on stderr every this many ops rewritten.
const PROGRESS_EVERY_OPS: u64 = 50_000;

fn repair_dir(dir: &Path) -> PathBuf {
    sibling(dir, "repair")
}

fn done_marker(dir: &Path) -> PathBuf {
    sibling(dir, "repair.done")
}

fn sibling(dir: &Path, suffix: &str) -> PathBuf {
    let name = dir
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    dir.with_file_name(format!("{name}.{suffix}"))
}

/// Repair the partition group in `dir` (of `ids` = (stream, topic, partition), whose topic
/// sets `topic_segment_size_bytes`, 0 for the server's), accepting the loss of everything
/// from its damage on. The caller holds the data directory's lock.
pub fn repair_accept_loss(
    dir: &Path,
    (stream_id, topic_id, partition_id): (u32, u32, u32),
    topic_segment_size_bytes: u64,
) -> Result<RepairReport, RepairError> {
    let disk = RealDisk;
    let parent = dir.parent().unwrap_or(Path::new("."));
    let rebuilt = repair_dir(dir);
    let marker = done_marker(dir);
    if !dir.exists() && marker.exists() && rebuilt.exists() {
        // Interrupted after the damaged directory was set aside: finish the move.
        disk.rename(&rebuilt, dir)?;
        disk.sync_dir(parent)?;
        disk.remove_file(&marker)?;
        disk.sync_dir(parent)?;
        return Ok(RepairReport {
            dir: dir.to_path_buf(),
            quarantined: None,
            damage: None,
            ops_kept: (0, 0),
            offsets_kept: (0, 0),
            resume_offset: 0,
            margin_added: false,
            start_offset: 0,
            consumer_offsets: 0,
            state_from: String::new(),
            finished_interrupted: true,
        });
    }
    if !crate::node::is_formatted(dir) {
        return Err(RepairError::Unsupported(format!(
            "{} holds no partition group (no superblock): there is nothing to rebuild it from",
            dir.display()
        )));
    }
    let ids = (stream_id, topic_id, partition_id);
    let report = partition_group::check(dir, ids);
    if report.verdict() != cairn_storage::check::Verdict::Damaged {
        return Err(RepairError::NotDamaged(format!(
            "{} opens ({:?}; `cairn check` tells what a start will do)",
            dir.display(),
            report.verdict()
        )));
    }
    let group = partition_group::group_id(stream_id, topic_id, partition_id);
    let live = transfer::live_generation(&disk, dir).map_err(|error| {
        RepairError::Unsupported(format!(
            "which journal generation is live cannot be read ({error})"
        ))
    })?;
    let journal_dir = transfer::journal_dir(dir, live);
    let config = JournalConfig {
        segment_size_bytes: SEGMENT_SIZE_DEFAULT_BYTES,
        relaxed: false,
    };
    let (prefix, salvage) =
        JournalLog::open_salvage_on(Arc::new(RealDisk), &journal_dir, partition_id, config)?;
    let checkpoint = crate::node::durable_checkpoint::<LogJournal>(dir, group)
        .ok()
        .flatten();
    let (target, state_from) = state_at_prefix_end(&prefix, group, partition_id, checkpoint)?;

    // Build the new group beside the damaged one.
    if rebuilt.exists() {
        std::fs::remove_dir_all(&rebuilt).map_err(|source| StorageError::Io {
            path: rebuilt.clone(),
            source,
        })?;
    }
    disk.remove_file(&marker)?;
    // Relaxed while rebuilding (one barrier at the clean close, not one per op): a crash before
    // the marker leaves a rebuild the next run starts again.
    let options = JournalOptions {
        segment_size_bytes: match topic_segment_size_bytes {
            0 => SEGMENT_SIZE_DEFAULT_BYTES,
            size => size,
        },
        relaxed: true,
    };
    // Every offset that may have been handed out lies below this.
    let known = [
        target.next_offset,
        prefix.chain().next_offset,
        salvage.handed_out.map_or(0, |(handed_out, _)| handed_out),
        salvage.highest_offset_after_damage.unwrap_or(0),
    ]
    .into_iter()
    .max()
    .unwrap_or(0);
    let margin_added = !matches!(salvage.handed_out, Some((_, true)));
    let resume_offset = if margin_added {
        known.saturating_add(RESUME_MARGIN_OFFSETS)
    } else {
        known
    };
    let (start_offset, consumer_offsets) = rebuild(
        &rebuilt,
        group,
        partition_id,
        options,
        &prefix,
        &target,
        resume_offset,
    )
    .map_err(RepairError::Rebuild)?;
    cairn_storage::atomic_file::write_on(&disk, &marker, b"complete")?;
    let quarantined = transfer::quarantine(&disk, dir)?;
    let interrupted = |error| RepairError::Interrupted {
        quarantined: quarantined.display().to_string(),
        error,
    };
    disk.rename(&rebuilt, dir).map_err(interrupted)?;
    disk.sync_dir(parent).map_err(interrupted)?;
    disk.remove_file(&marker).map_err(interrupted)?;
    disk.sync_dir(parent).map_err(interrupted)?;
    Ok(RepairReport {
        dir: dir.to_path_buf(),
        quarantined: Some(quarantined),
        damage: salvage.damage.clone(),
        ops_kept: (prefix.first_op(), prefix.last_op()),
        offsets_kept: (prefix.first_offset(), prefix.chain().next_offset),
        resume_offset,
        margin_added,
        start_offset,
        consumer_offsets,
        state_from,
        finished_interrupted: false,
    })
}

/// The partition's state at the end of the salvaged prefix, as the machine computes it, and
/// how it was known.
fn state_at_prefix_end(
    prefix: &JournalLog,
    group: u64,
    partition_id: u32,
    checkpoint: Option<(u64, Vec<u8>)>,
) -> Result<(PartitionState, String), RepairError> {
    let mut machine = PartitionMachine::new(partition_id);
    let (applied_through, from) = match checkpoint {
        Some((op, bytes)) => {
            machine.restore(&bytes).map_err(|reason| {
                RepairError::Unsupported(format!(
                    "the durable checkpoint's state does not restore: {reason}"
                ))
            })?;
            (op, format!("the durable checkpoint at op {op}"))
        }
        None if prefix.first_op() <= 1 => (0, "the partition's beginning".to_string()),
        None => {
            return Err(RepairError::Unsupported(format!(
                "the group's durable checkpoint cannot be read and its journal begins at op {}: the state before that op is unknown",
                prefix.first_op()
            )));
        }
    };
    if applied_through + 1 < prefix.first_op() {
        return Err(RepairError::Unsupported(format!(
            "the journal begins at op {}, above the checkpoint's op {applied_through} + 1",
            prefix.first_op()
        )));
    }
    let mut applied = 0u64;
    for op in applied_through + 1..=prefix.last_op() {
        let message = prefix
            .read_op(op)
            .map_err(|error| error.to_string())
            .and_then(|stored| checked_prepare(stored, group))
            .map_err(RepairError::Unsupported)?;
        machine.apply(
            op,
            message.header.timestamp,
            message.header.operation,
            &message.body,
        );
        applied += 1;
    }
    if let Some(fault) = machine.fault() {
        return Err(RepairError::Unsupported(format!(
            "applying the kept ops faulted: {fault}"
        )));
    }
    let from = if applied > 0 {
        format!("{from}, and the {applied} kept op(s) after it")
    } else if applied_through > prefix.last_op() {
        format!("{from} (above the damage: its state is newer than the kept messages)")
    } else {
        from
    };
    Ok((machine.state().clone(), from))
}

/// The prepare `stored` holds, which must be of group `group` (a journal found under another
/// partition's name is not adopted).
fn checked_prepare(stored: StoredOp, group: u64) -> Result<cairn_vsr::header::Message, String> {
    let op = stored.op;
    let message = partition_group::prepare_from(stored)?;
    if message.header.group != group {
        return Err(format!(
            "op {op} is a prepare of group {:#x}, not of this partition's group {group:#x}: the journal is another partition's",
            message.header.group
        ));
    }
    Ok(message)
}

/// Format a group in `dir` and put the prefix's messages into it at their offsets, then
/// `target`'s retention start and stored offsets, with minting resuming at `resume_offset`.
/// Returns the start offset and the count of stored offsets.
fn rebuild(
    dir: &Path,
    group_id: u64,
    partition_id: u32,
    options: JournalOptions,
    prefix: &JournalLog,
    target: &PartitionState,
    resume_offset: u64,
) -> Result<(u64, usize), String> {
    let text = |error: PartitionError| error.to_string();
    let mut group: PartitionGroup =
        partition_group::open(dir, group_id, LogParams::new(partition_id, options))
            .map_err(|error| error.to_string())?;
    if prefix.first_offset() > 0 {
        group.skip_to(prefix.first_offset()).map_err(text)?;
    }
    for op in prefix.first_op()..=prefix.last_op() {
        if (op - prefix.first_op()).is_multiple_of(PROGRESS_EVERY_OPS) && op > prefix.first_op() {
            eprintln!(
                "cairn repair: {} of {} kept ops written again",
                op - prefix.first_op(),
                prefix.last_op() + 1 - prefix.first_op()
            );
        }
        // One read per op: the prepare is rebuilt from the records, and an append's body is
        // its stamped batches as stored.
        let stored = prefix.read_op(op).map_err(|error| error.to_string())?;
        let stored_as_batches = !stored.batches.is_empty();
        let message = checked_prepare(stored, group_id)?;
        match message.header.operation {
            partition::OPERATION_APPEND if stored_as_batches => {
                let (timestamp_us, batches) = partition::append_parts(&message.body)
                    .ok_or_else(|| format!("op {op}'s append body does not decode"))?;
                let append = crate::partition_group::Append {
                    timestamp_us,
                    batches: batches
                        .iter()
                        .map(|bytes| message.body.slice_ref(bytes).into())
                        .collect(),
                };
                let offsets = group
                    .append_batch(vec![append])
                    .pop()
                    .ok_or("no reply to an append")?
                    .map_err(text)?;
                let kept: Vec<u64> = batches
                    .iter()
                    .map(|bytes| batch::header(bytes).map_or(u64::MAX, |header| header.base_offset))
                    .collect();
                if offsets != kept {
                    return Err(format!(
                        "op {op}'s batches were at offsets {kept:?} and went to {offsets:?}"
                    ));
                }
            }
            partition::OPERATION_SKIP => {
                let to_offset = partition::skip_target(&message.body)
                    .ok_or_else(|| format!("op {op} is a skip without a target"))?;
                if to_offset > group.next_offset() {
                    group.skip_to(to_offset).map_err(text)?;
                }
            }
            // Stores, deletes, purges and trims: their outcome is in `target`.
            _ => {}
        }
    }
    if group.next_offset() != prefix.chain().next_offset {
        return Err(format!(
            "the kept messages end at offset {}, the rebuilt log at {}",
            prefix.chain().next_offset,
            group.next_offset()
        ));
    }
    if resume_offset > group.next_offset() {
        group.skip_to(resume_offset).map_err(text)?;
    }
    let start_offset = target.start_offset.min(group.next_offset());
    if start_offset > group.start_offset() {
        group.trim(start_offset).map_err(text)?;
    }
    for (owner, &offset) in &target.offsets {
        group.store_offset(owner, offset).map_err(text)?;
    }
    group.close().map_err(|error| error.to_string())?;
    Ok((group.start_offset(), target.offsets.len()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::client_batch;
    use cairn_machine::partition::Owner;
    use cairn_storage::read::ReadOutcome;

    const IDS: (u32, u32, u32) = (1, 2, 0);
    const SEGMENT_SIZE: u64 = 4096;

    fn params() -> LogParams {
        LogParams::new(
            IDS.2,
            JournalOptions {
                segment_size_bytes: SEGMENT_SIZE,
                relaxed: false,
            },
        )
    }

    fn group_id() -> u64 {
        partition_group::group_id(IDS.0, IDS.1, IDS.2)
    }

    /// Every message a poll from offset 0 serves: (offset, its batch bytes as stored).
    fn served(group: &PartitionGroup) -> Vec<(u64, Vec<u8>)> {
        let mut out = Vec::new();
        let mut from = 0;
        loop {
            let mut bytes = Vec::new();
            match group.read_into(from, 1, &mut bytes).expect("poll") {
                ReadOutcome {
                    last_offset: Some(offset),
                    ..
                } => {
                    out.push((offset, bytes));
                    from = offset + 1;
                }
                _ => return out,
            }
        }
    }

    /// A partition with 120 sends of small batches over 4 KiB segments, a stored offset, a
    /// trim, a checkpoint, and 30 sends and a store after it; closed cleanly (which
    /// checkpoints) or not.
    fn written(dir: &Path, clean_stop: bool) -> (PartitionState, Vec<(u64, Vec<u8>)>) {
        let mut group = partition_group::open(dir, group_id(), params()).expect("format");
        for send in 0..120u32 {
            group
                .append(
                    1_000 + u64::from(send),
                    &[&client_batch(1 + send % 3, 40, send as u8)],
                )
                .expect("append");
        }
        group.store_offset(&Owner::Consumer(7), 150).expect("store");
        group.trim(10).expect("trim");
        group.checkpoint().expect("checkpoint");
        for send in 120..150u32 {
            group
                .append(1_000 + u64::from(send), &[&client_batch(2, 40, send as u8)])
                .expect("append");
        }
        group.store_offset(&Owner::Group(3), 200).expect("store");
        let state = group.state_machine().state().clone();
        let messages = served(&group);
        if clean_stop {
            group.close().expect("close");
        }
        (state, messages)
    }

    /// The partition's journal, read-only.
    fn read_only(dir: &Path) -> JournalLog {
        JournalLog::open_read_only_on(
            Arc::new(RealDisk),
            &transfer::journal_dir(dir, 0),
            IDS.2,
            JournalConfig {
                segment_size_bytes: SEGMENT_SIZE,
                relaxed: false,
            },
        )
        .expect("open")
        .0
    }

    /// Flip a byte inside op `op`'s records.
    fn damage(dir: &Path, op: u64) {
        let log = read_only(dir);
        let extent = *log.extent(op).expect("the op");
        let path = transfer::journal_dir(dir, 0)
            .join(cairn_storage::journal::segment_log_name(extent.segment_first_op));
        let mut bytes = std::fs::read(&path).expect("segment");
        bytes[(extent.position_bytes + extent.len_bytes - 3) as usize] ^= 0x20;
        std::fs::write(&path, bytes).expect("damage");
    }

    fn repaired(dir: &Path, damaged_op: u64) -> (RepairReport, PartitionGroup) {
        damage(dir, damaged_op);
        assert_eq!(
            partition_group::check(dir, IDS).verdict(),
            cairn_storage::check::Verdict::Damaged
        );
        let report = repair_accept_loss(dir, IDS, SEGMENT_SIZE).expect("repair");
        let quarantined = report.quarantined.clone().expect("set aside");
        assert!(
            transfer::journal_dir(&quarantined, 0).is_dir(),
            "the damaged files are kept"
        );
        assert!(!repair_dir(dir).exists() && !done_marker(dir).exists());
        let group = partition_group::open(dir, group_id(), params()).expect("the repaired partition opens");
        (report, group)
    }

    /// Damage in the journal above the checkpoint: everything before it is kept at its
    /// offsets, byte for byte; the state is the checkpoint's with the kept ops after it; new
    /// messages continue above every offset handed out.
    #[test]
    fn damage_above_the_checkpoint_keeps_every_message_before_it() {
        let temp = tempfile::tempdir().expect("tempdir");
        let dir = temp.path().join("0");
        let (before, messages) = written(&dir, false);
        let damaged_op = before_last_ops(&dir, 10);
        let (report, mut group) = repaired(&dir, damaged_op);
        assert_eq!(report.ops_kept.1, damaged_op - 1, "{report}");
        assert!(report.state_from.contains("kept op"), "{report}");
        let kept = served(&group);
        assert!(!kept.is_empty() && kept.len() < messages.len());
        assert_eq!(
            kept,
            messages[..kept.len()].to_vec(),
            "the same messages at the same offsets"
        );
        assert_eq!(group.start_offset(), 10);
        assert_eq!(group.next_offset(), before.next_offset);
        assert_eq!(group.stored_offset(&Owner::Consumer(7)), Some(150));
        // Stored in an op the damage took: lost with it.
        assert_eq!(group.stored_offset(&Owner::Group(3)), None);
        let next = group
            .append(9_000, &[&client_batch(1, 10, 1)])
            .expect("a send after the repair");
        assert_eq!(next, vec![before.next_offset], "no offset handed out twice");
        println!("{report}");
    }

    /// Damage in a sealed segment below the checkpoint: the messages before it are kept, the
    /// state is the checkpoint's (newer than anything kept), and minting resumes above the
    /// old log's end.
    #[test]
    fn damage_below_the_checkpoint_keeps_the_checkpoints_state() {
        let temp = tempfile::tempdir().expect("tempdir");
        let dir = temp.path().join("0");
        let (before, messages) = written(&dir, true);
        let (report, group) = repaired(&dir, 40);
        assert_eq!(report.ops_kept.1, 39, "{report}");
        assert!(report.state_from.contains("above the damage"), "{report}");
        let kept = served(&group);
        assert_eq!(kept, messages[..kept.len()].to_vec());
        assert!(kept.len() < messages.len());
        assert_eq!(group.next_offset(), before.next_offset, "{report}");
        assert_eq!(group.stored_offset(&Owner::Consumer(7)), Some(150));
        // Stored in an op the damage took, but the clean stop's checkpoint holds it.
        assert_eq!(group.stored_offset(&Owner::Group(3)), Some(200));
    }

    /// With the journal's state file lost as well, what it last said was handed out is
    /// unknown: minting resumes a margin above every offset the records after the damage name.
    #[test]
    fn a_lost_state_file_resumes_minting_a_margin_above_every_offset_found() {
        let temp = tempfile::tempdir().expect("tempdir");
        let dir = temp.path().join("0");
        let (before, _) = written(&dir, true);
        damage(&dir, 40);
        std::fs::remove_file(transfer::journal_dir(&dir, 0).join("state")).expect("remove the state file");
        let report = repair_accept_loss(&dir, IDS, SEGMENT_SIZE).expect("repair");
        let group = partition_group::open(&dir, group_id(), params()).expect("opens");
        assert!(report.margin_added, "{report}");
        assert_eq!(
            group.next_offset(),
            before.next_offset + RESUME_MARGIN_OFFSETS,
            "{report}"
        );
    }

    /// A repair interrupted after the damaged directory was set aside (the repaired one not
    /// yet in its place) is finished by the next run; the partition then opens.
    #[test]
    fn an_interrupted_repair_is_finished_by_the_next_run() {
        let temp = tempfile::tempdir().expect("tempdir");
        let dir = temp.path().join("0");
        let (before, _) = written(&dir, true);
        let (_, group) = repaired(&dir, 40);
        drop(group);
        // As a crash right after the quarantine leaves it.
        std::fs::rename(&dir, repair_dir(&dir)).expect("rename");
        std::fs::write(done_marker(&dir), b"complete").expect("marker");
        let report = repair_accept_loss(&dir, IDS, SEGMENT_SIZE).expect("finish");
        assert!(report.finished_interrupted, "{report}");
        assert!(!done_marker(&dir).exists() && !repair_dir(&dir).exists());
        let group = partition_group::open(&dir, group_id(), params()).expect("opens");
        assert_eq!(group.next_offset(), before.next_offset);
    }

    /// A partition that opens is not repaired; without a group there is nothing to rebuild.
    #[test]
    fn a_sound_partition_is_not_repaired() {
        let temp = tempfile::tempdir().expect("tempdir");
        let dir = temp.path().join("0");
        written(&dir, true);
        assert!(matches!(
            repair_accept_loss(&dir, IDS, SEGMENT_SIZE),
            Err(RepairError::NotDamaged(_))
        ));
        assert!(matches!(
            repair_accept_loss(&temp.path().join("1"), IDS, SEGMENT_SIZE),
            Err(RepairError::Unsupported(_))
        ));
    }

    /// The op `back` ops before the journal's last.
    fn before_last_ops(dir: &Path, back: u64) -> u64 {
        read_only(dir).last_op() - back
    }
}
