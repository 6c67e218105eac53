//! A partition group's segment log as its VSR journal: records written once, by op, cut back
//! at an op when a view change replaces a prepare (design: `docs/replication.md`, "The
//! partition group: the plan").
//!
//! # What it is
//!
//! Record-framed segment files ([`crate::record`]), read as a *journal log*
//! ([`OpRule::PerPrepare`]): every record carries the VSR op of its prepare and that
//! prepare's view. An op is one op record, whose payload its writer defines (the partition
//! shell: the prepare's VSR header, and the body of an op that is not an append), then, for
//! an append, one batch record per batch, stamped here with the chain's offsets and the
//! prepare's timestamp (so every replica writes the same bytes for the same op). Ops are
//! written in op order with no gap, which is what the core's log journal asks of its shell
//! (`Shape::log_journal`).
//!
//! # Directory layout
//!
//! ```text
//! <dir>/journal.start               where the journal begins (atomic file, the layout of
//!                                   `log`'s `start.meta`): next_offset, parent_checksum,
//!                                   next_op (u64 each, little-endian)
//! <dir>/00000000000000000001.log    records, named by the op of their first record
//! <dir>/state                       the durable frontier (see `state`; its reservation is
//!                                   the frontier itself: a journal mints no offsets)
//! ```
//!
//! A segment is started at the first op boundary once the active one is full, so an op never
//! spans two segments, and a partition that only stores offsets rotates like one that
//! receives messages. Segments are named by op, not offset, for that reason: op records move
//! no offset, so several segments may begin at the same offset.
//!
//! The frontier lies in the segment that holds its last op (the first segment when it
//! covers none); a cut at a segment's first op removes that segment too, so no frontier
//! ever lies at the very start of a segment other than the first. The state file's segment
//! field holds that segment's start offset, which the open checks.
//!
//! # Retention
//!
//! [`JournalLog::remove_oldest_segments`] removes whole segments from the front once the
//! caller no longer needs their ops (below its checkpoint) or their messages (below its
//! start offset): it publishes the new `journal.start` first, then removes the files; an open
//! removes what a crash left below the start.
//!
//! # Durability
//!
//! [`JournalLog::write_op`] writes without a barrier; [`JournalLog::sync`] issues one
//! fdatasync of the active segment and publishes the frontier, and returns the op it covers:
//! only then may the core count those ops durable (and acknowledge them). At open, everything
//! below the frontier must verify (damage is refused, never cut), and everything above it is
//! dropped: it was never reported durable, and it may hold an op only partly written (its
//! records are one write, and a crash can keep a prefix of it). What the open takes from
//! segment summaries instead of reading it is verified later: a sealed segment when read (and
//! by the caller's scrub), the summarised prefix of the frontier's segment before the journal
//! writes anything ([`JournalLog::unverified_prefix`]). A failed write is cut back
//! (and a segment it left empty removed), and the journal goes on; if that undo fails, or a
//! barrier fails, the journal stops until it is reopened.
//!
//! # Relaxed mode (`JournalConfig::relaxed`)
//!
//! The caller acknowledges an op once it is written, before a barrier covers it (a flush on
//! a timer calls `sync`). Two things keep the durability contract:
//! - **Nothing acknowledged is dropped at a process crash.** Before the first such write the
//!   state file says so (`unsynced_acknowledged`); an open that reads it keeps every *whole*
//!   op above the frontier (its op record, then as many batch records as the op record
//!   names, all verifying in the chain) and ends the log at the first record that is not
//!   part of one: after a SIGKILL the page cache holds everything written; after a power
//!   loss a torn tail is truncated as usual. So that the unsynced part is at most one
//!   segment's tail and the next segment, sealing a segment publishes the frontier at its
//!   end. The open then syncs what it kept and publishes the frontier above it.
//! - **No offset is handed out twice.** Before a batch reaching past the durable offset
//!   reservation is written, the reservation is raised by [`OFFSET_LEASE_MESSAGES`] (one
//!   state-file barrier). An open reports the reservation it found above the log's end as
//!   [`JournalLog::resume_offset`]: offsets below it may have been acknowledged and lost with
//!   a power loss, so the caller's next op skips to it ([`JournalLog::write_skip_op`], an op
//!   record whose base offset jumps, after which the segment is sealed: offsets stay
//!   contiguous inside a segment). [`JournalLog::sync_for_stop`] collapses the reservation
//!   to the log's end at a clean stop, so a clean restart leaves no gap.
//!
//! A cut first publishes the frontier at the cut with `unsynced_acknowledged` cleared (after
//! syncing what lies below the cut, when the frontier was lower): the ops it removes were
//! never committed, so never acknowledged, and a crash before its truncation is durable
//! must not keep them.
//!
//! # Cutting back (a view change replaced a prepare)
//!
//! [`JournalLog::cut`] removes an op and everything after it. Order, so that a crash at any
//! point leaves a log recovery accepts: publish the lower frontier first (a frontier beyond
//! the log is damage), then remove the segments above the cut (newest first), then truncate
//! the cut segment and sync it, then sync the directory. A crash before the truncation is
//! durable leaves the cut records above the frontier, and the next open drops them. The core
//! never cuts an applied op; the journal refuses a cut below its start.

use crate::StorageError;
use crate::atomic_file;
use crate::io::{Disk, ReadFile, WriteFile};
use crate::read::{self, CachedReader, PollRead, ReadOutcome, ReadPart};
use crate::record::{
    self, BATCH_BYTES_MAX, Chain, OpRule, RECORD_HEADER_SIZE, RecordHeader, RecordKind, ScanResult, Tail,
};
use crate::state::{self, Frontier, PartitionState, STATE_FILE_NAME, STATE_FILE_SIZE_BYTES, StateFile};
use cairn_wire::batch::{self, BATCH_HEADER_SIZE};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The most bytes a journal segment may hold: the largest segment size, then one op that
/// began below it (an op record and batches of up to twice [`BATCH_BYTES_MAX`] in all; a
/// larger op there is refused rather than written).
pub const SEGMENT_BYTES_MAX: u64 = u32::MAX as u64 + 2 * (RECORD_HEADER_SIZE as u64 + BATCH_BYTES_MAX as u64);

/// Offsets a `relaxed` journal reserves ahead of the batches it writes (see the module doc):
/// one state-file barrier per this many messages, and at most this many offsets skipped
/// beyond the last one handed out after an unclean stop.
pub const OFFSET_LEASE_MESSAGES: u64 = 65_536;

/// Writeback pacing granularity of a `relaxed` journal (see `JournalLog::pace_writeback`).
pub const WRITEBACK_CHUNK_BYTES: u64 = 4 * 1024 * 1024;

/// How far the durable part of the segment being written grows past its last summary before
/// [`JournalLog::summarise_progress`] writes another (the caller passes it; tests pass less):
/// what a start after a crash reads at most of that segment.
pub const PREFIX_SUMMARY_STEP_BYTES: u64 = 64 * 1024 * 1024;

/// A summary of the segment being written is written only once the segment has grown by at
/// least this many times the summary's size since the last one (the caller passes it), so
/// summaries never add more than a sixteenth to the bytes a segment costs (segments of many
/// small ops have large summaries).
pub const PREFIX_SUMMARY_GROWTH_PER_BYTE: u64 = 16;

/// The most bytes one state-transfer chunk carries ([`JournalLog::read_segment_range`]).
pub const TRANSFER_CHUNK_BYTES_MAX: u64 = 8 * 1024 * 1024;

/// The clean bytes just below the end of the segment being written that stay in the page
/// cache (see `JournalLog::release_cache`): a consumer reading close behind the producers
/// reads them from memory.
pub const CACHE_KEPT_BEHIND_BYTES: u64 = 8 * 1024 * 1024;

/// The page cache of a segment is released in steps of at least this many bytes (one
/// `posix_fadvise` per step).
const CACHE_RELEASE_STEP_BYTES: u64 = 4 * 1024 * 1024;

/// The range of a file whose page cache to release now, as `(position, len)`, when its first
/// `clean_len_bytes` are on the device and its first `released_bytes` were released before:
/// all but the last [`CACHE_KEPT_BEHIND_BYTES`], once that is a step more. The journal's rule
/// for a segment, public so that the bench's ceilings follow the same one.
pub fn cache_release_range(released_bytes: u64, clean_len_bytes: u64) -> Option<(u64, u64)> {
    let release_to = clean_len_bytes.saturating_sub(CACHE_KEPT_BEHIND_BYTES);
    (release_to >= released_bytes.saturating_add(CACHE_RELEASE_STEP_BYTES))
        .then(|| (released_bytes, release_to - released_bytes))
}

/// How far writeback of the active segment was started and waited for (pacing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Writeback {
    segment_first_op: u64,
    started_bytes: u64,
    waited_bytes: u64,
}

/// Name of the file that marks a journal log and says where it begins.
pub const JOURNAL_START_FILE: &str = "journal.start";

/// Bytes of `journal.start`'s contents: next_offset, parent_checksum, next_op.
const START_CONTENTS_SIZE: usize = 24;

/// A segment's file name: `<first op, 20 digits>.log`.
pub fn segment_log_name(first_op: u64) -> String {
    format!("{first_op:020}.log")
}

/// The first op a segment file name says (`None` for any other name).
fn segment_first_op(name: &str) -> Option<u64> {
    op_named(name, ".log")
}

/// The op a file name `<20 digits><suffix>` says (`None` for any other name).
fn op_named(name: &str, suffix: &str) -> Option<u64> {
    let stem = name.strip_suffix(suffix)?;
    (stem.len() == 20 && stem.bytes().all(|b| b.is_ascii_digit()))
        .then(|| stem.parse().ok())
        .flatten()
}

fn encode_start(start: &Chain) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(START_CONTENTS_SIZE);
    bytes.extend_from_slice(&start.next_offset.to_le_bytes());
    bytes.extend_from_slice(&start.parent_checksum.to_le_bytes());
    bytes.extend_from_slice(&start.next_op.to_le_bytes());
    debug_assert_eq!(bytes.len(), START_CONTENTS_SIZE);
    bytes
}

fn decode_start(bytes: &[u8], partition_id: u32) -> Option<Chain> {
    if bytes.len() != START_CONTENTS_SIZE {
        return None;
    }
    let field =
        |at: usize| -> Option<u64> { Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?)) };
    let chain = Chain {
        partition_id,
        next_offset: field(0)?,
        parent_checksum: field(8)?,
        next_op: field(16)?,
    };
    (chain.next_op >= 1).then_some(chain)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalConfig {
    /// A new segment is started at the first op boundary once the active one reaches this.
    pub segment_size_bytes: u64,
    /// `relaxed` mode: the caller acknowledges ops before a barrier covers them (see the
    /// module doc). An open keeps whole unsynced ops whenever the state file says they may
    /// have been acknowledged, whatever this says now.
    pub relaxed: bool,
}

/// Where one op's records lie, and the chain before them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpExtent {
    pub op: u64,
    pub view: u32,
    pub timestamp_us: u64,
    /// Batch records after the op record (0 for an op that is not an append).
    pub batch_count: u32,
    /// The segment holding the op, by its first op (its file name).
    pub segment_first_op: u64,
    pub position_bytes: u64,
    pub len_bytes: u64,
    /// The chain at the op's first record: where a cut at this op leaves the log.
    pub chain_before: Chain,
    /// Messages the op appended (0 for an op record).
    pub message_count: u64,
}

/// One op read back: the bytes of its records, verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredOp {
    pub op: u64,
    pub view: u32,
    pub timestamp_us: u64,
    /// The op record's payload.
    pub op_payload: Vec<u8>,
    /// Each stamped batch of an append, in order.
    pub batches: Vec<Vec<u8>>,
}

/// Where one batch record of an append lies: the journal's index for polls, in offset
/// order. The segment holding it is the last one whose start offset is at or below its base
/// offset (see [`JournalLog::segment_of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct BatchEntry {
    base_offset: u64,
    position_bytes: u64,
    /// Header and batch (at most `RECORD_HEADER_SIZE + BATCH_BYTES_MAX`).
    len_bytes: u32,
    message_count: u32,
    /// The append's timestamp, raised to the one before it if lower (lookups binary-search;
    /// the partition machine never stamps one lower).
    timestamp_us: u64,
}

impl BatchEntry {
    /// The offset after its last message.
    fn end_offset(&self) -> u64 {
        self.base_offset + u64::from(self.message_count)
    }
}

/// A segment of the journal, for retention and stats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalSegment {
    /// The op of its first record (its file name).
    pub first_op: u64,
    /// The chain's offset where it begins (its first message's, if it holds one).
    pub base_offset: u64,
    /// The offset after its last message.
    pub end_offset: u64,
    pub size_bytes: u64,
    /// The timestamp of its last message, if it holds one.
    pub newest_timestamp_us: Option<u64>,
}

/// A segment as a state transfer sends it: the chain its first record continues (its first
/// op names it) and the bytes sent (up to the end of the transferred checkpoint's op).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransferSegment {
    pub start: Chain,
    pub len_bytes: u64,
}

impl TransferSegment {
    pub fn first_op(&self) -> u64 {
        self.start.next_op
    }
}

/// A sealed segment as a scrub verifies it: its file, the chain its first record continues
/// and the chain its last one ends with (the next segment's start), and its length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealedSegment {
    pub first_op: u64,
    pub path: PathBuf,
    pub start: Chain,
    pub end: Chain,
    pub len_bytes: u64,
}

/// Remove, durably, the summary of the journal segment at `segment_path` (damage was found
/// in it after an open took it from its summary): every later open then reads the segment
/// and refuses what it holds. `Ok` when it has none, or the path names no journal segment.
pub fn forget_summary(disk: &dyn Disk, segment_path: &Path) -> Result<(), StorageError> {
    let name = segment_path
        .file_name()
        .and_then(|name| name.to_str())
        .unwrap_or_default();
    let (Some(first_op), Some(dir)) = (segment_first_op(name), segment_path.parent()) else {
        return Ok(());
    };
    if disk.remove_file(&dir.join(summary_name(first_op)))? {
        disk.sync_dir(dir)?;
    }
    Ok(())
}

/// Verify a sealed segment in full, as an open that reads it would: every record verifies
/// and continues the chain from its start, and it ends exactly with the chain the next
/// segment begins with. Reads the file in pieces (no lock needed: a sealed segment's bytes do
/// not change; the caller checks it is still in the journal before acting on a verdict).
pub fn verify_sealed(disk: &dyn Disk, segment: &SealedSegment) -> Result<(), StorageError> {
    verify_extent(disk, segment, true)
}

/// [`verify_sealed`] (`sealed`: the file holds exactly the segment), or the verification of
/// an unverified prefix ([`JournalLog::verify_unverified_prefix`]: the file may be longer).
fn verify_extent(disk: &dyn Disk, segment: &SealedSegment, sealed: bool) -> Result<(), StorageError> {
    let damaged = |position: u64, reason: String| StorageError::Damaged {
        path: segment.path.clone(),
        position,
        reason,
    };
    let len = disk.file_len(&segment.path)?.unwrap_or(0);
    if len < segment.len_bytes || (sealed && len != segment.len_bytes) {
        return Err(damaged(
            len.min(segment.len_bytes),
            format!(
                "the {} holds {len} bytes, the journal {}",
                if sealed { "sealed segment" } else { "segment" },
                segment.len_bytes
            ),
        ));
    }
    let scanned = scan_durable(
        disk,
        &segment.path,
        segment.start,
        0,
        segment.len_bytes,
        OPEN_CHUNK_BYTES,
    )?;
    match scanned.tail {
        Tail::Clean => {}
        Tail::Torn { fault } => {
            return Err(damaged(
                scanned.valid_len_bytes,
                format!("below the frontier: {fault}"),
            ));
        }
        Tail::Damaged {
            position_bytes,
            reason,
        } => return Err(damaged(position_bytes, reason)),
    }
    if scanned.gap.is_some() {
        return Err(damaged(
            0,
            "a gap record in a journal log (a journal mints no offsets)".into(),
        ));
    }
    if scanned.end != segment.end {
        return Err(damaged(
            segment.len_bytes,
            if sealed {
                "the sealed segment does not end with the chain the next segment begins with".into()
            } else {
                "the segment's summarised prefix does not end with the chain its summary says".into()
            },
        ));
    }
    Ok(())
}

/// A verified record of either kind, as recovery groups them into ops.
struct ListedRecord {
    position_bytes: u64,
    op: u64,
    size_bytes: u64,
    view: u32,
    timestamp_us: u64,
    is_batch: bool,
    message_count: u64,
    checksum: u64,
    /// A batch's first offset; for an op record, the offset after it (above the chain's for
    /// a skip).
    base_offset: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Segment {
    /// The chain its first record continues: what `journal.start` holds when it becomes the
    /// first segment.
    start: Chain,
    len_bytes: u64,
}

impl Segment {
    /// The op of its first record: its name.
    fn first_op(&self) -> u64 {
        self.start.next_op
    }

    fn path(&self, dir: &Path) -> PathBuf {
        dir.join(segment_log_name(self.first_op()))
    }
}

/// One partition's journal log (see the module doc). One writer: every write takes `&mut self`.
#[derive(Debug)]
pub struct JournalLog {
    disk: Arc<dyn Disk>,
    dir: PathBuf,
    partition_id: u32,
    config: JournalConfig,
    /// Where the journal begins: ops from `start.next_op` on are in it.
    start: Chain,
    /// Invariant: at least one; first ops strictly increasing, start offsets non-decreasing;
    /// every one but the last (the active one) holds an op.
    segments: Vec<Segment>,
    /// The write handle of the last segment; `None` in a read-only journal (which is
    /// stopped, so no write path reaches it).
    active: Option<Box<dyn WriteFile>>,
    /// The chain after the last record written.
    chain: Chain,
    /// Every op in the journal, by op. Invariant: contiguous from `start.next_op` to
    /// `chain.next_op - 1`.
    ops: BTreeMap<u64, OpExtent>,
    /// Every batch record, in offset order. Invariant: contiguous offsets from
    /// `start.next_offset` to `chain.next_offset`.
    batches: Vec<BatchEntry>,
    /// The read handle of the segment read last (polls and ops read back). Emptied whenever
    /// a segment is removed ([`JournalLog::forget_read_handle`]): a removed segment's name
    /// may be started again.
    read_cache: Mutex<Option<CachedReader>>,
    /// The state file; `None` in a read-only journal.
    state: Option<StateFile>,
    /// The frontier last published (or loaded).
    frontier: Frontier,
    /// Set by a failed write or barrier: nothing more is written until a reopen.
    stopped: Option<String>,
    /// The prefix of the frontier's segment the open took from the segment's summary without
    /// reading it (see [`JournalLog::unverified_prefix`]), until it is verified. Nothing is
    /// written to the journal while it is set: a write verifies it first.
    unverified_prefix: Option<SealedSegment>,
    /// Bytes of the segment being written that the summary beside it describes (0: none).
    summarised_len: u64,
    /// Whether that summary was written with a barrier (a clean stop's is; a progress
    /// summary, or one an open found, may not be durable).
    summary_synced: bool,
    /// [`JournalLog::summarise_progress`] writes nothing before the frontier's length in the
    /// segment being written reaches this (a failed write, or a summary too large to write).
    summary_retry_len: u64,
    /// fdatasync calls [`JournalLog::sync`] issued (statistics).
    fdatasyncs: u64,
    /// The durable offset reservation (last published or loaded): no batch reaching past it
    /// is written in `relaxed` mode before it is raised. A durable journal keeps it at its
    /// frontier (or the resume floor, until the log reaches it).
    offset_reserved: u64,
    /// What the state file says of the ops above the frontier: they may have been
    /// acknowledged.
    unsynced_acknowledged: bool,
    /// The reservation an open found beyond the log's end (0 if none): the next offset
    /// minted must not be below it (see [`JournalLog::resume_offset`]).
    resume_floor: u64,
    /// Writeback pacing of the active segment (`relaxed` mode); another segment's is stale.
    writeback: Option<Writeback>,
    /// The active segment's bytes whose page cache was released, by the segment's first
    /// op; another segment's is stale.
    cache_released: Option<(u64, u64)>,
}

/// What [`JournalLog::inspect_on`] found, writing nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalInspection {
    pub first_op: u64,
    /// The last op below the frontier (what an open keeps).
    pub last_op: u64,
    pub durable_op: u64,
    /// The offset after the last message kept.
    pub next_offset: u64,
    /// Bytes an open would drop: everything above the frontier it does not keep.
    pub bytes_above_frontier: u64,
    /// Whole ops above the frontier an open would keep (they may have been acknowledged:
    /// `relaxed` mode, or a state slot failed verification).
    pub unsynced_ops_kept: u64,
    /// Segments below the start an open would remove (left by an interrupted removal of the
    /// oldest segments; their messages were already given up).
    pub segments_below_start: u32,
}

/// Where a damaged journal's salvageable prefix ends ([`JournalLog::open_salvage_on`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Salvage {
    /// The segment file and byte position of the first byte that is not part of a whole,
    /// verifying op, and why; `None` when every segment verified to its end.
    pub damage: Option<(PathBuf, u64, String)>,
    /// The highest offset end any verifying record from the damage on names (batch records:
    /// base offset plus messages; op records: base offset), read past what does not verify:
    /// those offsets may have been handed out.
    pub highest_offset_after_damage: Option<u64>,
    /// From the state file, when a slot of it verifies: the higher of its frontier offset and
    /// its offset reservation (offsets below it may have been handed out), and whether both
    /// slots verified (if not, the lost slot may have named a higher one).
    pub handed_out: Option<(u64, bool)>,
}

/// What [`JournalLog::open_on`] found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalRecovery {
    /// Bytes above the durable frontier that were dropped: never reported durable (an
    /// unsynced write, a partly written op, or what a cut had removed), or, after a power
    /// loss in `relaxed` mode, what followed the last whole op (see
    /// `unsynced_may_be_acknowledged`).
    pub dropped_bytes: u64,
    /// The last op at or below the published frontier (`start.next_op - 1` if none), after
    /// the open (which syncs what it kept above the frontier it found).
    pub durable_op: u64,
    /// Whole ops above the frontier the open kept, because they may have been acknowledged
    /// (`relaxed` mode, or a state slot failed verification), and their bytes.
    pub unsynced_ops_kept: u64,
    pub unsynced_bytes_kept: u64,
    /// Whether the state file said ops above the frontier may have been acknowledged
    /// (`relaxed` mode): then dropped bytes may have held acknowledged messages (lost with
    /// unsynced data), whose offsets [`JournalLog::resume_offset`] keeps from being minted.
    pub unsynced_may_be_acknowledged: bool,
    /// One slot of the state file failed verification: a publish torn by a crash, or a bit
    /// flip. The other slot's frontier was used, and the whole ops above it kept (after a flip
    /// of the newest slot they were reported durable).
    pub state_slot_damaged: bool,
}

impl JournalLog {
    /// Create an empty journal in `dir` beginning at `start` (the chain after the checkpoint
    /// it continues; [`Chain::genesis`] for a new partition).
    pub fn create_on(
        disk: Arc<dyn Disk>,
        dir: &Path,
        partition_id: u32,
        config: JournalConfig,
        start: Chain,
    ) -> Result<JournalLog, StorageError> {
        check_config(&config)?;
        assert_eq!(start.partition_id, partition_id);
        disk.create_dir_all(dir)?;
        atomic_file::write_on(
            disk.as_ref(),
            &dir.join(JOURNAL_START_FILE),
            &encode_start(&start),
        )?;
        let segment = Segment { start, len_bytes: 0 };
        let active = disk.create_new(&segment.path(dir))?;
        let frontier = frontier_at(&segment, start);
        let state = StateFile::create(
            disk.as_ref(),
            &dir.join(STATE_FILE_NAME),
            journal_state(frontier, start.next_offset, false),
        )?;
        disk.sync_dir(dir)?;
        Ok(JournalLog {
            disk,
            dir: dir.to_path_buf(),
            partition_id,
            config,
            start,
            segments: vec![segment],
            active: Some(active),
            chain: start,
            ops: BTreeMap::new(),
            batches: Vec::new(),
            read_cache: Mutex::new(None),
            state: Some(state),
            frontier,
            stopped: None,
            unverified_prefix: None,
            summarised_len: 0,
            summary_synced: false,
            summary_retry_len: 0,
            fdatasyncs: 0,
            offset_reserved: start.next_offset,
            unsynced_acknowledged: false,
            resume_floor: 0,
            writeback: None,
            cache_released: None,
        })
    }

    /// Open the journal in `dir`: verify everything below the durable frontier that it reads
    /// (damage there is refused before a byte changes; what it takes from summaries unread is
    /// verified later, see the module doc), drop everything above it (but the whole ops that
    /// may have been acknowledged, see the module doc), and index every op.
    pub fn open_on(
        disk: Arc<dyn Disk>,
        dir: &Path,
        partition_id: u32,
        config: JournalConfig,
    ) -> Result<(JournalLog, JournalRecovery), StorageError> {
        check_config(&config)?;
        let plan = plan_open(disk.as_ref(), dir, partition_id, true)?;
        // Only now, with everything read verified: finish a removal of the oldest segments
        // that a crash interrupted, and drop what lies above the frontier. (Neither touches
        // a byte below the frontier, so they may come before a prefix taken unread is
        // verified.)
        for &first_op in &plan.below_start {
            disk.remove_file(&dir.join(segment_log_name(first_op)))?;
        }
        let mut dropped_bytes = plan.dropped_bytes;
        for &(first_op, len) in plan.above.iter().rev() {
            dropped_bytes += len;
            disk.remove_file(&dir.join(segment_log_name(first_op)))?;
        }
        // Summaries of segments that are gone or written again from now on (the frontier's
        // segment is the one written next), and summaries a crash left half-written.
        let frontier_first_op = plan.segments.last().expect("the frontier's segment").first_op();
        let mut summaries_removed = false;
        for &first_op in &plan.summaries {
            // Kept only for a sealed segment this open took from it: one that did not match
            // would make every open read the segment anyway.
            // The segment written next keeps the summary of a prefix the open took from it:
            // it still describes that prefix (nothing below the frontier changes, and
            // whatever changes or removes the prefix removes the summary first), so a later
            // open takes it again, until a rotation replaces it with the whole segment's.
            let kept_sealed = first_op >= plan.start.next_op
                && first_op < frontier_first_op
                && plan.adopted.contains(&first_op);
            let kept_prefix = first_op == frontier_first_op
                && plan
                    .unverified_prefix
                    .as_ref()
                    .is_some_and(|prefix| prefix.first_op == first_op);
            if !(kept_sealed || kept_prefix) {
                summaries_removed |= disk.remove_file(&dir.join(summary_name(first_op)))?;
            }
        }
        for name in &plan.summary_staging {
            summaries_removed |= disk.remove_file(&dir.join(name))?;
        }
        let last_kept = *plan.segments.last().expect("the frontier's segment");
        let mut active = disk.open_write(&last_kept.path(dir))?;
        if plan.dropped_bytes > 0 {
            active.set_len(last_kept.len_bytes)?;
            active.sync_data()?;
        }
        // Even an empty segment's removal is made durable: a stale segment coming back under a
        // name at or below a later frontier's op would be taken for the frontier's segment.
        if dropped_bytes > 0 || !plan.above.is_empty() || !plan.below_start.is_empty() || summaries_removed {
            disk.sync_dir(dir)?;
        }
        let state = StateFile::open(disk.as_ref(), &dir.join(STATE_FILE_NAME), plan.loaded)?;
        let (unsynced_ops_kept, unsynced_bytes_kept) = (plan.unsynced_ops_kept, plan.unsynced_bytes_kept);
        let unsynced_may_be_acknowledged = plan.loaded.unsynced_acknowledged;
        let state_slot_damaged = plan.state_slot_damaged;
        let mut journal = JournalLog::from_plan(disk, dir, partition_id, config, plan, Some((active, state)));
        if unsynced_ops_kept > 0 {
            // What was kept is made durable and put below the frontier at once: from here on
            // it is an ordinary part of the log.
            journal.sync()?;
        }
        let durable_op = journal.durable_op();
        Ok((
            journal,
            JournalRecovery {
                dropped_bytes,
                durable_op,
                unsynced_ops_kept,
                unsynced_bytes_kept,
                unsynced_may_be_acknowledged,
                state_slot_damaged,
            },
        ))
    }

    /// What [`JournalLog::open_on`] would find in `dir`, reading only: the verdict on what
    /// lies below the frontier (damage is an `Err`, as at open) and what the open would
    /// drop. For the offline checker; it writes nothing.
    pub fn inspect_on(
        disk: &dyn Disk,
        dir: &Path,
        partition_id: u32,
    ) -> Result<JournalInspection, StorageError> {
        let plan = plan_open(disk, dir, partition_id, false)?;
        Ok(inspection_of(&plan))
    }

    /// The journal in `dir` as [`JournalLog::open_on`] would keep it, writing nothing (the
    /// offline checker): ops and polls read what lies below the durable frontier (and the
    /// whole ops above it an open would keep); every write is refused. Also says what an open
    /// would do.
    pub fn open_read_only_on(
        disk: Arc<dyn Disk>,
        dir: &Path,
        partition_id: u32,
        config: JournalConfig,
    ) -> Result<(JournalLog, JournalInspection), StorageError> {
        check_config(&config)?;
        // The checker trusts no summary: it reads and verifies every segment.
        let plan = plan_open(disk.as_ref(), dir, partition_id, false)?;
        let inspection = inspection_of(&plan);
        Ok((
            JournalLog::from_plan(disk, dir, partition_id, config, plan, None),
            inspection,
        ))
    }

    /// What survives in a journal refused for damage, for an operator's repair that accepts
    /// the loss (writing nothing): a read-only journal of every whole, verifying op from the
    /// journal's start up to the first byte that is not part of one (each op's records all
    /// verify and continue the chain), ignoring the state file's frontier; and where the
    /// damage begins. `Err` when not even the start can be read (`journal.start`).
    pub fn open_salvage_on(
        disk: Arc<dyn Disk>,
        dir: &Path,
        partition_id: u32,
        config: JournalConfig,
    ) -> Result<(JournalLog, Salvage), StorageError> {
        check_config(&config)?;
        let start = read_start(disk.as_ref(), dir, partition_id)?;
        // What the state file says was handed out, if a slot of it verifies.
        let state_path = dir.join(STATE_FILE_NAME);
        let handed_out = disk
            .read_all(&state_path, STATE_FILE_SIZE_BYTES)
            .ok()
            .flatten()
            .and_then(|bytes| state::load_noting_damage(&bytes, partition_id).ok())
            .map(|(loaded, slot_damaged)| {
                (
                    loaded.frontier.chain.next_offset.max(loaded.offset_reserved),
                    !slot_damaged,
                )
            });
        let mut names: Vec<u64> = disk
            .list_dir(dir)?
            .iter()
            .filter_map(|name| segment_first_op(name))
            .filter(|&first_op| first_op >= start.next_op)
            .collect();
        names.sort_unstable();
        let mut chain = start;
        let mut segments: Vec<Segment> = Vec::new();
        let mut ops: BTreeMap<u64, OpExtent> = BTreeMap::new();
        let mut batches: Vec<BatchEntry> = Vec::new();
        let mut damage = None;
        for (index, &first_op) in names.iter().enumerate() {
            let path = dir.join(segment_log_name(first_op));
            if first_op != chain.next_op {
                damage = Some((
                    path,
                    0,
                    format!(
                        "the segment is named for op {first_op}, the ops before it end at op {}",
                        chain.next_op - 1
                    ),
                ));
                break;
            }
            let segment_start = chain;
            // A segment that cannot be read (or whose verified records do not index) is
            // where the damage is: the prefix ends before it.
            let mut segment_ops = BTreeMap::new();
            let mut segment_batches = Vec::new();
            let scanned = disk
                .file_len(&path)
                .map(|len| len.unwrap_or(0).min(SEGMENT_BYTES_MAX))
                .and_then(|len| {
                    let (listed, end, end_chain) = scan_whole_ops(disk.as_ref(), &path, 0, len, chain)?;
                    index_records(
                        listed,
                        first_op,
                        &path,
                        chain,
                        &mut segment_ops,
                        &mut segment_batches,
                    )?;
                    Ok((len, end, end_chain))
                });
            let (len, end, end_chain) = match scanned {
                Ok(scanned) => scanned,
                Err(error) => {
                    damage = Some((path, 0, format!("the segment cannot be read whole: {error}")));
                    break;
                }
            };
            ops.extend(segment_ops);
            for mut entry in segment_batches {
                // As one index over the whole log: timestamps never go back.
                if let Some(last) = batches.last() {
                    entry.timestamp_us = entry.timestamp_us.max(last.timestamp_us);
                }
                batches.push(entry);
            }
            chain = end_chain;
            segments.push(Segment {
                start: segment_start,
                len_bytes: end,
            });
            if end < len {
                damage = Some((
                    path,
                    end,
                    "the first byte that is not part of a whole, verifying op".into(),
                ));
                break;
            }
            if end == 0 && index + 1 < names.len() {
                // An empty segment ends the log: what follows cannot continue it.
                damage = Some((path, 0, "an empty segment with segments after it".into()));
                break;
            }
        }
        if segments.is_empty() {
            segments.push(Segment { start, len_bytes: 0 });
        }
        // What the bytes from the damage on say was handed out.
        let mut highest_offset_after_damage = None;
        if let Some((damaged_path, position, _)) = &damage {
            for &first_op in &names {
                let path = dir.join(segment_log_name(first_op));
                let from = match path.cmp(damaged_path) {
                    std::cmp::Ordering::Less => continue,
                    std::cmp::Ordering::Equal => *position,
                    std::cmp::Ordering::Greater => 0,
                };
                let highest = highest_offset_in(disk.as_ref(), &path, from, partition_id);
                highest_offset_after_damage = highest_offset_after_damage.max(highest);
            }
        }
        let last = *segments.last().expect("one segment");
        let loaded = journal_state(frontier_at(&last, chain), chain.next_offset, false);
        let plan = OpenPlan {
            start,
            loaded,
            state_slot_damaged: false,
            segments,
            ops,
            batches,
            chain,
            above: Vec::new(),
            below_start: Vec::new(),
            unsynced_ops_kept: 0,
            unsynced_bytes_kept: 0,
            dropped_bytes: 0,
            summaries: BTreeSet::new(),
            adopted: BTreeSet::new(),
            unverified_prefix: None,
            summary_staging: Vec::new(),
        };
        let journal = JournalLog::from_plan(disk, dir, partition_id, config, plan, None);
        Ok((
            journal,
            Salvage {
                damage,
                highest_offset_after_damage,
                handed_out,
            },
        ))
    }

    /// The journal an open's plan describes, with the write handles of the active segment and
    /// the state file; without them it is read-only (stopped, so every write is refused).
    fn from_plan(
        disk: Arc<dyn Disk>,
        dir: &Path,
        partition_id: u32,
        config: JournalConfig,
        plan: OpenPlan,
        writable: Option<(Box<dyn WriteFile>, StateFile)>,
    ) -> JournalLog {
        let stopped = writable.is_none().then(|| "opened read-only".to_string());
        // The summary of a prefix stays only while its segment is the one written (see
        // `open_on`).
        let summarised_len = plan
            .unverified_prefix
            .as_ref()
            .filter(|prefix| Some(prefix.first_op) == plan.segments.last().map(Segment::first_op))
            .map_or(0, |prefix| prefix.len_bytes);
        let (active, state) = writable.unzip();
        let loaded = plan.loaded;
        let journal = JournalLog {
            disk,
            dir: dir.to_path_buf(),
            partition_id,
            config,
            start: plan.start,
            segments: plan.segments,
            active,
            chain: plan.chain,
            ops: plan.ops,
            batches: plan.batches,
            read_cache: Mutex::new(None),
            state,
            frontier: loaded.frontier,
            stopped,
            summarised_len,
            summary_synced: false,
            summary_retry_len: 0,
            unverified_prefix: plan.unverified_prefix,
            fdatasyncs: 0,
            offset_reserved: loaded.offset_reserved,
            unsynced_acknowledged: loaded.unsynced_acknowledged,
            // Only a reservation beyond what the log holds binds minting: one a `relaxed`
            // journal took ahead (a durable one never reserves past its frontier).
            resume_floor: if loaded.offset_reserved > plan.chain.next_offset {
                loaded.offset_reserved
            } else {
                0
            },
            writeback: None,
            cache_released: None,
        };
        journal.check_invariants();
        journal
    }

    /// The segment being written: a caller may sync it on a handle of its own first, so the
    /// bulk of a [`JournalLog::sync`] (the dirty pages) happens outside its own lock.
    pub fn active_segment_path(&self) -> PathBuf {
        self.segments.last().expect("one segment").path(&self.dir)
    }

    /// Whether it runs in `relaxed` mode (see the module doc).
    pub fn relaxed(&self) -> bool {
        self.config.relaxed
    }

    /// The op of the last record, or `start.next_op - 1` when the journal holds none.
    pub fn last_op(&self) -> u64 {
        self.chain.next_op - 1
    }

    /// The first op the journal can hold.
    pub fn first_op(&self) -> u64 {
        self.start.next_op
    }

    /// The last op at or below the published frontier.
    pub fn durable_op(&self) -> u64 {
        let frontier = &self.frontier;
        frontier.chain.next_op - 1
    }

    /// The chain after the last record.
    pub fn chain(&self) -> Chain {
        self.chain
    }

    /// The durable offset reservation: in `relaxed` mode no batch reaching past it has been
    /// written.
    pub fn offset_reserved(&self) -> u64 {
        self.offset_reserved
    }

    /// Where minting must resume, when that is above the log's end: the reservation the open
    /// found. Offsets below it may have been acknowledged before an unclean stop (`relaxed`
    /// mode) and lost with unsynced data, so none of them may be handed out again; the
    /// caller's next op is a skip to it ([`JournalLog::write_skip_op`]). `None` once the log
    /// reaches it (always after a clean stop).
    pub fn resume_offset(&self) -> Option<u64> {
        (self.resume_floor > self.chain.next_offset).then_some(self.resume_floor)
    }

    pub fn extent(&self, op: u64) -> Option<&OpExtent> {
        self.ops.get(&op)
    }

    /// Every op in the journal, in order.
    pub fn extents(&self) -> impl DoubleEndedIterator<Item = &OpExtent> {
        self.ops.values()
    }

    pub fn stopped_reason(&self) -> Option<&str> {
        self.stopped.as_deref()
    }

    /// The offset of the first message the journal can hold (its start).
    pub fn first_offset(&self) -> u64 {
        self.start.next_offset
    }

    /// Append to `out` the client-format batches holding messages with offset >= `from_offset`
    /// and below `end_offset`, at most `max_messages` in all: whole stored batches as stored,
    /// a partial first or last batch cut to the messages taken. `end_offset` is where the
    /// caller's visibility ends (the group's commit point); a batch reaching past it is not
    /// served, nor is anything after it. Each record read is verified again; a mismatch is
    /// `Damaged`. On `Err`, `out` holds its original bytes and possibly some of the batches.
    ///
    /// Records are read straight into `out` with no copy: a record's 64-byte header lands on
    /// the last 64 bytes already in `out` (saved and put back after verification), so the
    /// batch behind it ends up in place. Give `out` at least `RECORD_HEADER_SIZE` bytes of
    /// prefix (a reply's headers) to get that; with less, the first record goes through a
    /// scratch buffer.
    pub fn read_into(
        &self,
        from_offset: u64,
        max_messages: u32,
        end_offset: u64,
        out: &mut Vec<u8>,
    ) -> Result<ReadOutcome, StorageError> {
        self.read_impl(from_offset, max_messages, end_offset, out, None)
    }

    /// [`JournalLog::read_into`] for a sender that can send file bytes directly: the batches
    /// are described by `parts`, in order. Each record is still read and verified (into a
    /// reused per-thread buffer); a whole batch is then given as a [`ReadPart::File`] range
    /// instead of being copied, so the reply's bytes go from the page cache to the socket
    /// (`sendfile`). Cut batches, and everything from files that are not OS files, are
    /// appended to `out` and given as [`ReadPart::Buffer`]. On `Err`, `parts` may hold some of
    /// the batches.
    pub fn read_parts(
        &self,
        from_offset: u64,
        max_messages: u32,
        end_offset: u64,
        out: &mut Vec<u8>,
        parts: &mut Vec<ReadPart>,
    ) -> Result<ReadOutcome, StorageError> {
        self.read_impl(from_offset, max_messages, end_offset, out, Some(parts))
    }

    fn read_impl(
        &self,
        from_offset: u64,
        max_messages: u32,
        end_offset: u64,
        out: &mut Vec<u8>,
        parts: Option<&mut Vec<ReadPart>>,
    ) -> Result<ReadOutcome, StorageError> {
        let end_offset = end_offset.min(self.chain.next_offset);
        let start_offset = from_offset.max(self.start.next_offset);
        if start_offset >= end_offset {
            return Ok(ReadOutcome::NOTHING);
        }
        PollRead::run(
            self.partition_id,
            start_offset,
            max_messages,
            out,
            parts,
            |read| self.walk_batches(read, end_offset),
        )
    }

    /// Hand every batch record holding messages from the poll's start offset on, and wholly
    /// below `end_offset`, to `read`, until it takes no more.
    fn walk_batches(&self, read: &mut PollRead<'_>, end_offset: u64) -> Result<(), StorageError> {
        let start_offset = read.start_offset();
        let first = self
            .batches
            .partition_point(|entry| entry.end_offset() <= start_offset);
        let mut cache = self
            .read_cache
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        for entry in &self.batches[first..] {
            if entry.end_offset() > end_offset {
                break;
            }
            let segment = self.segment_of(entry.base_offset);
            let path = segment.path(&self.dir);
            let file = read::cached_file(&mut cache, self.disk.as_ref(), &path, segment.first_op())?;
            read.take_record(
                &path,
                file,
                entry.position_bytes,
                entry.len_bytes as usize,
                entry.base_offset,
            )?;
            if read.remaining() == 0 {
                break;
            }
        }
        Ok(())
    }

    /// The segment holding the batch at `base_offset`: the last one beginning at or below it
    /// (segments beginning at the same offset before it hold no batch).
    fn segment_of(&self, base_offset: u64) -> &Segment {
        let after = self
            .segments
            .partition_point(|segment| segment.start.next_offset <= base_offset);
        &self.segments[after.saturating_sub(1)]
    }

    /// The offset of the first message below `end_offset` whose append timestamp is at or
    /// above `timestamp_us`, if any.
    pub fn offset_at_timestamp(&self, timestamp_us: u64, end_offset: u64) -> Option<u64> {
        let found = self
            .batches
            .partition_point(|entry| entry.timestamp_us < timestamp_us);
        self.batches
            .get(found)
            .filter(|entry| entry.end_offset() <= end_offset)
            .map(|entry| entry.base_offset)
    }

    /// Segment `index`'s end offset (the next one's start, or the log's end) and its newest
    /// batch, if it holds any.
    fn segment_end(&self, index: usize) -> (u64, Option<BatchEntry>) {
        let segment = &self.segments[index];
        let end_offset = self
            .segments
            .get(index + 1)
            .map_or(self.chain.next_offset, |next| next.start.next_offset);
        let newest = self
            .batches
            .partition_point(|entry| entry.base_offset < end_offset)
            .checked_sub(1)
            .map(|last| self.batches[last])
            .filter(|entry| entry.base_offset >= segment.start.next_offset);
        (end_offset, newest)
    }

    /// The journal's segments, oldest first (the last is the one written).
    pub fn segments(&self) -> Vec<JournalSegment> {
        self.segments
            .iter()
            .enumerate()
            .map(|(index, segment)| {
                let (end_offset, newest) = self.segment_end(index);
                JournalSegment {
                    first_op: segment.first_op(),
                    base_offset: segment.start.next_offset,
                    end_offset,
                    size_bytes: segment.len_bytes,
                    newest_timestamp_us: newest.map(|entry| entry.timestamp_us),
                }
            })
            .collect()
    }

    /// The offset of the first message at or above `offset`, if the journal holds one.
    pub fn first_message_from(&self, offset: u64) -> Option<u64> {
        let first = self.batches.partition_point(|entry| entry.end_offset() <= offset);
        self.batches.get(first).map(|entry| entry.base_offset.max(offset))
    }

    /// The offset after the newest message, if the journal holds any.
    pub fn messages_end(&self) -> Option<u64> {
        self.batches.last().map(BatchEntry::end_offset)
    }

    /// Offsets at or above `from_offset` that hold no message because a skip passed them. A
    /// skip seals its segment, so they lie at the ends of segments: between a segment's last
    /// message and the next segment's (or the log's) start offset. Costs one lookup per
    /// segment.
    pub fn offsets_skipped_from(&self, from_offset: u64) -> u64 {
        self.segments
            .iter()
            .enumerate()
            .map(|(index, segment)| {
                let (end_offset, newest) = self.segment_end(index);
                let messages_end = newest.map_or(segment.start.next_offset, |entry| entry.end_offset());
                end_offset.saturating_sub(messages_end.max(from_offset))
            })
            .sum()
    }

    /// Batch records in the journal.
    pub fn batch_count(&self) -> usize {
        self.batches.len()
    }

    /// Bytes in the journal's segments.
    pub fn size_bytes(&self) -> u64 {
        self.segments.iter().map(|segment| segment.len_bytes).sum()
    }

    /// Remove the oldest segments the caller no longer needs, and return them: a segment goes
    /// when it is not the active one, every op in it is below `below_op` (the caller's
    /// checkpoint: it never reads those ops again) and the frontier lies beyond it, and every
    /// message in it is below `below_offset` (the caller's start offset: no poll reaches
    /// them). Stops at the first segment that must stay.
    ///
    /// Order: `journal.start` is published first (from then on the messages are given up),
    /// then the files are removed, oldest first, then the directory is synced. A crash or a
    /// failed removal after the start is published leaves segments below the start, which the
    /// next open removes; a failure to publish the start stops the journal.
    pub fn remove_oldest_segments(
        &mut self,
        below_op: u64,
        below_offset: u64,
    ) -> Result<Vec<JournalSegment>, StorageError> {
        self.check_not_stopped()?;
        // The segment the frontier lies in stays (and with it every segment after it).
        let frontier_segment = frontier_segment_name(
            self.segments.iter().map(Segment::first_op),
            self.start.next_op,
            self.durable_op() + 1,
        );
        let count = self
            .segments
            .windows(2)
            .take_while(|pair| {
                let next = &pair[1];
                next.first_op() <= below_op
                    && next.first_op() <= frontier_segment
                    && next.start.next_offset <= below_offset
            })
            .count();
        if count == 0 {
            return Ok(Vec::new());
        }
        self.verify_unverified_prefix()?;
        let removed: Vec<JournalSegment> = self.segments().into_iter().take(count).collect();
        let new_start = self.segments[count].start;
        if let Err(error) = atomic_file::write_on(
            self.disk.as_ref(),
            &self.dir.join(JOURNAL_START_FILE),
            &encode_start(&new_start),
        ) {
            self.stopped = Some(format!("publishing a new journal start failed: {error}"));
            return Err(error);
        }
        // The disk now says the segments are gone: memory follows at once.
        let gone: Vec<Segment> = self.segments.drain(..count).collect();
        self.start = new_start;
        self.ops = self.ops.split_off(&new_start.next_op);
        let first_kept = self
            .batches
            .partition_point(|entry| entry.base_offset < new_start.next_offset);
        self.batches.drain(..first_kept);
        self.forget_read_handle();
        self.check_invariants();
        for segment in &gone {
            self.disk.remove_file(&segment.path(&self.dir))?;
            self.disk
                .remove_file(&self.dir.join(summary_name(segment.first_op())))?;
        }
        self.disk.sync_dir(&self.dir)?;
        Ok(removed)
    }

    /// Write op `op` (with its prepare's `view` and `timestamp_us`) after the last one: its op
    /// record holding `op_payload`, then one batch record per client batch of `batches` (each
    /// its 256-byte header and frames, stamped here). An op at or below the last is a
    /// rewrite: the journal is cut there first. No barrier: see [`JournalLog::sync`].
    pub fn write_op(
        &mut self,
        op: u64,
        view: u32,
        timestamp_us: u64,
        op_payload: &[u8],
        batches: &[&[u8]],
    ) -> Result<(), StorageError> {
        self.write_op_at(op, view, timestamp_us, op_payload, batches, None)
    }

    /// Write op `op` as [`JournalLog::write_op`] does an op without batches, its op record
    /// skipping the offsets from the log's end to `to_offset` (the journal's deliberate gap:
    /// see [`JournalLog::resume_offset`]). The segment is sealed after it, so the next batch
    /// begins a segment.
    pub fn write_skip_op(
        &mut self,
        op: u64,
        view: u32,
        timestamp_us: u64,
        op_payload: &[u8],
        to_offset: u64,
    ) -> Result<(), StorageError> {
        self.write_op_at(op, view, timestamp_us, op_payload, &[], Some(to_offset))
    }

    fn write_op_at(
        &mut self,
        op: u64,
        view: u32,
        timestamp_us: u64,
        op_payload: &[u8],
        batches: &[&[u8]],
        skip_to: Option<u64>,
    ) -> Result<(), StorageError> {
        self.check_not_stopped()?;
        // Nothing is added to a log before what lies below its frontier is verified.
        self.verify_unverified_prefix()?;
        if op < self.start.next_op || op > self.chain.next_op {
            return Err(StorageError::Invalid(format!(
                "op {op} is outside the journal's next writable range {}..={}",
                self.start.next_op, self.chain.next_op
            )));
        }
        check_content(op_payload, batches)?;
        if op < self.chain.next_op {
            self.cut(op)?;
        }
        debug_assert_eq!(op, self.chain.next_op);
        if skip_to.is_none()
            && !batches.is_empty()
            && let Some(resume) = self.resume_offset()
        {
            return Err(StorageError::Invalid(format!(
                "op {op} would mint offsets from {}, but minting resumes at {resume} (offsets below it may have been handed out before an unclean stop): skip to it first",
                self.chain.next_offset
            )));
        }
        if let Some(to_offset) = skip_to
            && to_offset < self.chain.next_offset
        {
            return Err(StorageError::Invalid(format!(
                "op {op} would skip back to offset {to_offset}, below the log's end at {}",
                self.chain.next_offset
            )));
        }
        self.rotate_if_full()?;
        let segment_first_op = self.segments.last().expect("one segment").first_op();
        let position_bytes = self.segments.last().expect("one segment").len_bytes;
        let op_bytes = RECORD_HEADER_SIZE as u64
            + op_payload.len() as u64
            + batches
                .iter()
                .map(|batch| RECORD_HEADER_SIZE as u64 + batch.len() as u64)
                .sum::<u64>();
        if position_bytes + op_bytes > SEGMENT_BYTES_MAX {
            return Err(StorageError::Invalid(format!(
                "op {op} of {op_bytes} bytes would take segment {segment_first_op} past {SEGMENT_BYTES_MAX} bytes"
            )));
        }
        let op_base_offset = skip_to.unwrap_or(self.chain.next_offset);
        if self.config.relaxed {
            // This op may be acknowledged before a barrier covers it: the state file must say
            // so, and reserve every offset it hands out, first.
            let messages: u64 = batches
                .iter()
                .map(|batch| batch::header(batch).map_or(0, |header| u64::from(header.message_count)))
                .sum();
            let end_offset = op_base_offset.saturating_add(messages);
            if !self.unsynced_acknowledged || end_offset > self.offset_reserved {
                let reserved = self
                    .offset_reserved
                    .max(end_offset.saturating_add(OFFSET_LEASE_MESSAGES));
                let frontier = self.frontier;
                if let Err(error) = self.publish_state(frontier, reserved, true) {
                    self.stopped = Some(format!("publishing the offset reservation failed: {error}"));
                    return Err(error);
                }
            }
        }
        let chain_before = self.chain;
        let mut chain = self.chain;
        // The small parts (record headers, stamped batch headers) are built first; the
        // payloads go to the vectored write as they are, never copied into one buffer.
        let mut record_headers: Vec<[u8; RECORD_HEADER_SIZE]> = Vec::with_capacity(1 + batches.len());
        let mut stamped_heads: Vec<[u8; BATCH_HEADER_SIZE]> = Vec::with_capacity(batches.len());
        let mut header = RecordHeader {
            kind: RecordKind::Op,
            checksum: 0,
            parent_checksum: chain.parent_checksum,
            op,
            view,
            partition_id: self.partition_id,
            base_offset: op_base_offset,
            message_count: batches.len() as u32,
            batch_length_bytes: op_payload.len() as u32,
            timestamp_us,
        };
        let header_bytes = header.seal(op_payload);
        debug_assert_eq!(
            record::verify_with(
                &[&header_bytes[..], op_payload].concat(),
                &chain,
                OpRule::PerPrepare
            ),
            Ok(header)
        );
        chain = chain.advance_by(&header, OpRule::PerPrepare);
        record_headers.push(header_bytes);
        let mut message_count = 0u64;
        let mut batch_entries = Vec::with_capacity(batches.len());
        let mut record_position = position_bytes + RECORD_HEADER_SIZE as u64 + op_payload.len() as u64;
        let index_timestamp_us = self
            .batches
            .last()
            .map_or(timestamp_us, |last| timestamp_us.max(last.timestamp_us));
        for batch in batches {
            let count = batch::header(batch).map_or(0, |header| header.message_count);
            let record_len = RECORD_HEADER_SIZE + batch.len();
            batch_entries.push(BatchEntry {
                base_offset: chain.next_offset,
                position_bytes: record_position,
                len_bytes: u32::try_from(record_len).expect("bounded by check_content"),
                message_count: count,
                timestamp_us: index_timestamp_us,
            });
            record_position += record_len as u64;
            let stamped_head = batch::stamped_header(
                batch,
                u64::from(self.partition_id),
                chain.next_offset,
                timestamp_us,
            )
            .ok_or_else(|| StorageError::Invalid("batch shorter than its header".into()))?;
            let frames = &batch[BATCH_HEADER_SIZE..];
            let mut header = RecordHeader {
                kind: RecordKind::Batch,
                checksum: 0,
                parent_checksum: chain.parent_checksum,
                op,
                view,
                partition_id: self.partition_id,
                base_offset: chain.next_offset,
                message_count: count,
                batch_length_bytes: batch.len() as u32,
                timestamp_us,
            };
            let header_bytes = header.seal_parts(&[&stamped_head, frames]);
            debug_assert_eq!(
                record::verify_with(
                    &[&header_bytes[..], &stamped_head[..], frames].concat(),
                    &chain,
                    OpRule::PerPrepare
                ),
                Ok(header)
            );
            chain = chain.advance_by(&header, OpRule::PerPrepare);
            message_count += u64::from(count);
            record_headers.push(header_bytes);
            stamped_heads.push(stamped_head);
        }
        let mut parts: Vec<&[u8]> = Vec::with_capacity(2 + 3 * batches.len());
        parts.push(&record_headers[0]);
        parts.push(op_payload);
        for ((header_bytes, stamped_head), batch) in
            record_headers[1..].iter().zip(&stamped_heads).zip(batches)
        {
            parts.push(header_bytes);
            parts.push(stamped_head);
            parts.push(&batch[BATCH_HEADER_SIZE..]);
        }
        let len_bytes: u64 = parts.iter().map(|part| part.len() as u64).sum();
        if let Err(error) = self.active_file().write_all_vectored_at(position_bytes, &parts) {
            // Cut a partial write back so the file ends at the last whole op again.
            if let Err(cut_error) = self.active_file().set_len(position_bytes) {
                self.stopped = Some(format!("cannot cut back a failed write: {cut_error}"));
            } else if position_bytes == 0
                && self.segments.len() > 1
                && let Err(undo_error) = self.drop_empty_active_segment()
            {
                self.stopped = Some(format!(
                    "cannot remove the segment a failed write left empty: {undo_error}"
                ));
            }
            return Err(error);
        }
        debug_assert_eq!(record_position, position_bytes + len_bytes);
        self.segments.last_mut().expect("one segment").len_bytes += len_bytes;
        self.chain = chain;
        self.batches.extend(batch_entries);
        self.ops.insert(
            op,
            OpExtent {
                op,
                view,
                timestamp_us,
                batch_count: batches.len() as u32,
                segment_first_op,
                position_bytes,
                len_bytes,
                chain_before,
                message_count,
            },
        );
        self.check_invariants();
        if self.config.relaxed {
            self.pace_writeback()?;
        }
        Ok(())
    }

    /// Writeback pacing (`relaxed` mode, where no barrier follows each op): once
    /// [`WRITEBACK_CHUNK_BYTES`] of the active segment are written but not yet handed to the
    /// device, start their writeback (no waiting), then wait for the writeback started one
    /// chunk earlier. The page cache then holds at most about two chunks of this partition's
    /// unwritten data: the device works steadily instead of in bursts, the flush finds little
    /// left to write, and the kernel's dirty-page throttling never steps in. Durability is
    /// still decided by [`JournalLog::sync`] alone. A failed wait is a failed write of data
    /// the OS held (Linux reports it once per open file, so a later fdatasync might not): it
    /// stops the journal like a failed barrier.
    fn pace_writeback(&mut self) -> Result<(), StorageError> {
        let active = *self.segments.last().expect("one segment");
        let synced = if self.durable_op() >= active.first_op() {
            self.frontier.segment_len_bytes
        } else {
            0
        };
        let (started, waited) = match self.writeback {
            Some(writeback) if writeback.segment_first_op == active.first_op() => (
                writeback.started_bytes.min(active.len_bytes),
                writeback.waited_bytes.min(active.len_bytes),
            ),
            _ => (0, 0),
        };
        let (started, waited) = (started.max(synced), waited.max(synced));
        let written = active.len_bytes;
        if written < started.saturating_add(WRITEBACK_CHUNK_BYTES) {
            return Ok(());
        }
        let paced = self
            .active_file()
            .start_writeback(started, written - started)
            .and_then(|()| {
                if started > waited {
                    self.active_file().wait_writeback(waited, started - waited)
                } else {
                    Ok(())
                }
            });
        if let Err(error) = paced {
            self.stopped = Some(format!("writeback of written ops failed: {error}"));
            return Err(error);
        }
        self.writeback = Some(Writeback {
            segment_first_op: active.first_op(),
            started_bytes: written,
            waited_bytes: started,
        });
        // The wait covered everything below `started`: those bytes are on the device.
        self.release_cache(started);
        Ok(())
    }

    /// Release the page cache of the active segment's bytes below `clean_len_bytes` (bytes
    /// on the device: after a barrier, or a finished writeback) except the last
    /// [`CACHE_KEPT_BEHIND_BYTES`]. Polls of older bytes read them from the device.
    ///
    /// Why: a page the cache takes for a write is a page of memory the process touches for
    /// the first time, which on a virtual machine whose host reclaims free guest memory (free
    /// page reporting) costs a host fault per page; on this project's machine it made the
    /// copy into the page cache most of a node's CPU. Released pages are reused by the next
    /// writes, so a partition's writes keep cycling through the same few megabytes. Advice
    /// only: no byte of the file changes, whatever the OS does with it.
    fn release_cache(&mut self, clean_len_bytes: u64) {
        let active = *self.segments.last().expect("one segment");
        let released = match self.cache_released {
            Some((segment_first_op, bytes)) if segment_first_op == active.first_op() => {
                bytes.min(active.len_bytes)
            }
            _ => 0,
        };
        if let Some((position_bytes, len_bytes)) = cache_release_range(released, clean_len_bytes) {
            self.active_file().release_cache(position_bytes, len_bytes);
            self.cache_released = Some((active.first_op(), position_bytes + len_bytes));
        }
    }

    /// Make every op written so far durable: one fdatasync of the active segment, then the
    /// frontier published. Returns the last op it covers.
    pub fn sync(&mut self) -> Result<u64, StorageError> {
        self.check_not_stopped()?;
        let segment = *self.segments.last().expect("one segment");
        let frontier = frontier_at(&segment, self.chain);
        if self.frontier == frontier {
            return Ok(self.last_op());
        }
        if let Err(error) = self.active_file().sync_data() {
            self.stopped = Some(format!("a data barrier failed: {error}"));
            return Err(error);
        }
        self.fdatasyncs += 1;
        self.release_cache(segment.len_bytes);
        if let Err(error) = self.publish(frontier) {
            self.stopped = Some(format!("publishing the frontier failed: {error}"));
            return Err(error);
        }
        self.fdatasyncs += 1;
        Ok(self.last_op())
    }

    /// [`JournalLog::sync`] at a clean stop, then the offset reservation collapsed to the
    /// log's end (never below where an open said minting must resume): everything written is
    /// durable, so a clean restart skips nothing. Returns the last op it covers.
    pub fn sync_for_stop(&mut self) -> Result<u64, StorageError> {
        let last_op = self.sync()?;
        // The summary of the segment being written, now all below the frontier, so that the
        // next open takes it without reading it (best effort, as at a rotation: without one
        // the open reads it). Not while a prefix is unverified: the summary the open took
        // it from is still there (nothing was written since), and no summary is written
        // from bytes nobody verified.
        let active = self.segments.len() - 1;
        let len_bytes = self.segments[active].len_bytes;
        let summarised = len_bytes == self.summarised_len && self.summary_synced;
        if self.unverified_prefix.is_none() && len_bytes > 0 && !summarised {
            debug_assert_eq!(self.frontier.segment_len_bytes, len_bytes);
            if self.write_summary(active).is_ok() {
                self.summarised_len = len_bytes;
                self.summary_synced = true;
            }
        }
        let collapsed = self.chain.next_offset.max(self.resume_floor);
        if self.offset_reserved > collapsed {
            let frontier = self.frontier;
            let unsynced_acknowledged = self.unsynced_acknowledged;
            if let Err(error) = self.publish_state(frontier, collapsed, unsynced_acknowledged) {
                self.stopped = Some(format!("collapsing the offset reservation failed: {error}"));
                return Err(error);
            }
        }
        Ok(last_op)
    }

    /// What a state transfer sends of this journal up to `through_op` (an op at or below the
    /// durable frontier, or the op before the journal's first): every segment holding an op
    /// up to it, oldest first, by its first op with its length up to the end of
    /// `through_op`'s records, and the chain after `through_op`. When `through_op` precedes
    /// every op, that is the first segment with no bytes. Each segment comes with the chain
    /// its first record continues. The caller (the group's shell)
    /// never cuts at or below `through_op` (a checkpoint's op: committed), so those bytes do
    /// not change while their segment exists; retention may remove a segment meanwhile (a
    /// read of it then fails and the transfer starts over).
    pub fn transfer_extent(&self, through_op: u64) -> Result<(Vec<TransferSegment>, Chain), StorageError> {
        if through_op + 1 < self.start.next_op || through_op > self.durable_op() {
            return Err(StorageError::Invalid(format!(
                "op {through_op} cannot be transferred: the journal holds {}..={} durably",
                self.start.next_op,
                self.durable_op()
            )));
        }
        let Some(last) = self.ops.get(&through_op).copied() else {
            let first = self.segments.first().expect("one segment");
            return Ok((
                vec![TransferSegment {
                    start: first.start,
                    len_bytes: 0,
                }],
                self.start,
            ));
        };
        let end = self
            .ops
            .get(&(through_op + 1))
            .map_or(self.chain, |next| next.chain_before);
        let segments = self
            .segments
            .iter()
            .take_while(|segment| segment.first_op() <= last.segment_first_op)
            .map(|segment| {
                let len = if segment.first_op() == last.segment_first_op {
                    last.position_bytes + last.len_bytes
                } else {
                    segment.len_bytes
                };
                TransferSegment {
                    start: segment.start,
                    len_bytes: len,
                }
            })
            .collect();
        Ok((segments, end))
    }

    /// `len` bytes of the segment named `first_op` from `position_bytes`, as they are on disk
    /// (a state transfer's chunk; the receiver verifies the whole log it rebuilt). Only bytes
    /// the segment holds; `Invalid` for a segment no longer in the journal.
    pub fn read_segment_range(
        &self,
        first_op: u64,
        position_bytes: u64,
        len: u64,
    ) -> Result<Vec<u8>, StorageError> {
        let Some(segment) = self
            .segments
            .iter()
            .find(|segment| segment.first_op() == first_op)
        else {
            return Err(StorageError::Invalid(format!(
                "segment {first_op} is not in the journal (removed by retention?)"
            )));
        };
        if len > TRANSFER_CHUNK_BYTES_MAX || position_bytes.saturating_add(len) > segment.len_bytes {
            return Err(StorageError::Invalid(format!(
                "{len} bytes at {position_bytes} of segment {first_op}: outside its {} bytes or over {TRANSFER_CHUNK_BYTES_MAX}",
                segment.len_bytes
            )));
        }
        let mut bytes = vec![0u8; len as usize];
        self.disk
            .open_read(&segment.path(&self.dir))?
            .read_exact_at(position_bytes, &mut bytes)?;
        Ok(bytes)
    }

    /// Write the files that make `dir` (holding the segments a state transfer wrote, the
    /// first beginning at `start`, the last being `last_segment`) a journal whose durable
    /// frontier is `end`, the chain after its last op: `journal.start`, then the state file.
    /// The caller synced the segments and syncs the directory, then verifies the whole with a
    /// read-only open.
    pub(crate) fn write_transferred_files(
        disk: &dyn Disk,
        dir: &Path,
        start: Chain,
        end: Chain,
        last_segment: TransferSegment,
    ) -> Result<(), StorageError> {
        debug_assert_eq!(start.partition_id, end.partition_id);
        atomic_file::write_on(disk, &dir.join(JOURNAL_START_FILE), &encode_start(&start))?;
        let segment = Segment {
            start: last_segment.start,
            len_bytes: last_segment.len_bytes,
        };
        let frontier = frontier_at(&segment, end);
        StateFile::create(
            disk,
            &dir.join(STATE_FILE_NAME),
            journal_state(frontier, end.next_offset, false),
        )?;
        Ok(())
    }

    /// The prefix of the segment being written that the open took from the segment's summary
    /// (written at the last clean stop) without reading it, while it is unverified. Polls
    /// verify every record they read; the caller verifies the prefix
    /// ([`JournalLog::verify_unverified_prefix`]) before it trusts the partition to serve,
    /// and the journal verifies it before it writes anything, so that nothing is added to a
    /// log with damage below its frontier.
    pub fn unverified_prefix(&self) -> Option<&SealedSegment> {
        self.unverified_prefix.as_ref()
    }

    /// Read and verify the unverified prefix, if there is one, as an open that read it would
    /// have (records verify and continue the chain; it ends with its summary's chain). Damage
    /// there stops the journal and removes the summary, so every later open reads the prefix
    /// and refuses it; the error says where. Any other error (an IO error) leaves the prefix
    /// unverified, for a later try.
    pub fn verify_unverified_prefix(&mut self) -> Result<(), StorageError> {
        let Some(prefix) = self.unverified_prefix.clone() else {
            return Ok(());
        };
        match verify_extent(self.disk.as_ref(), &prefix, false) {
            Ok(()) => {
                self.unverified_prefix = None;
                Ok(())
            }
            Err(damage @ StorageError::Damaged { .. }) => {
                self.stopped = Some(format!("damage below the frontier: {damage}"));
                // Best effort: the caller refusing the partition removes it too.
                let _ = forget_summary(self.disk.as_ref(), &prefix.path);
                Err(damage)
            }
            Err(error) => Err(error),
        }
    }

    /// The sealed segments (every one but the active), oldest first, for a scrub.
    pub fn sealed_segments(&self) -> Vec<SealedSegment> {
        self.segments
            .windows(2)
            .map(|pair| SealedSegment {
                first_op: pair[0].first_op(),
                path: pair[0].path(&self.dir),
                start: pair[0].start,
                end: pair[1].start,
                len_bytes: pair[0].len_bytes,
            })
            .collect()
    }

    /// The disk the journal's files are on (a scrub reads sealed segments through it).
    pub fn disk(&self) -> Arc<dyn Disk> {
        Arc::clone(&self.disk)
    }

    /// fdatasync calls [`JournalLog::sync`] and segment rotation have issued since the journal
    /// opened: two each (the data, then the frontier's slot). Reservation publishes and cuts
    /// are not counted (statistics).
    pub fn fdatasyncs(&self) -> u64 {
        self.fdatasyncs
    }

    /// Remove op `op` and every op after it (see the module doc for the order of the steps).
    pub fn cut(&mut self, op: u64) -> Result<(), StorageError> {
        self.check_not_stopped()?;
        self.verify_unverified_prefix()?;
        let Some(extent) = self.ops.get(&op).copied() else {
            return Err(StorageError::Invalid(format!(
                "no op {op} to cut at (the journal holds {}..={})",
                self.start.next_op,
                self.last_op()
            )));
        };
        let result = self.cut_steps(&extent);
        if let Err(error) = &result {
            self.stopped = Some(format!("a cut at op {op} failed: {error}"));
        }
        result
    }

    fn cut_steps(&mut self, extent: &OpExtent) -> Result<(), StorageError> {
        let op_segment = self
            .segments
            .iter()
            .position(|segment| segment.first_op() == extent.segment_first_op)
            .expect("an op's segment is in the journal");
        // A cut at a segment's first op removes that segment too: the log then ends with the
        // one before, whole (the frontier never lies at the start of a segment but the first).
        let (segment_index, cut_segment) = if extent.position_bytes == 0 && op_segment > 0 {
            (op_segment - 1, self.segments[op_segment - 1])
        } else {
            let segment = Segment {
                len_bytes: extent.position_bytes,
                ..self.segments[op_segment]
            };
            (op_segment, segment)
        };
        // 0. No summary may describe a segment the cut changes or removes.
        self.remove_summaries_from(cut_segment.first_op())?;
        self.forget_active_summary();
        // Polls stop seeing the cut batches before any file changes (on a failure the
        // journal stops, and what it holds is then settled by a reopen).
        let kept = self
            .batches
            .partition_point(|entry| entry.base_offset < extent.chain_before.next_offset);
        self.batches.truncate(kept);
        self.forget_read_handle();
        // 1. The frontier first, if the cut reaches below it; and in any case the state file
        //    must stop saying that ops above the frontier may be acknowledged (the cut ones
        //    never were), so first everything below the cut is made durable.
        if self.durable_op() >= extent.op || self.unsynced_acknowledged {
            if self.durable_op() < extent.op {
                self.active_file().sync_data()?;
            }
            let reserved = self.reservation_kept();
            self.publish_state(frontier_at(&cut_segment, extent.chain_before), reserved, false)?;
        }
        // 2. Segments above the cut, newest first.
        let removed_any = segment_index + 1 < self.segments.len();
        while self.segments.len() > segment_index + 1 {
            let segment = self.segments.pop().expect("above the cut");
            self.disk.remove_file(&segment.path(&self.dir))?;
        }
        // 3. Truncate the cut segment and sync it.
        if removed_any {
            self.active = Some(self.disk.open_write(&cut_segment.path(&self.dir))?);
        }
        self.active_file().set_len(cut_segment.len_bytes)?;
        self.active_file().sync_data()?;
        if removed_any {
            self.disk.sync_dir(&self.dir)?;
        }
        *self.segments.last_mut().expect("the cut segment") = cut_segment;
        self.writeback = None;
        self.cache_released = None;
        self.chain = extent.chain_before;
        self.ops.split_off(&extent.op);
        self.check_invariants();
        Ok(())
    }

    /// Read op `op` back, verifying every record against the chain before it.
    pub fn read_op(&self, op: u64) -> Result<StoredOp, StorageError> {
        let extent = self
            .ops
            .get(&op)
            .ok_or_else(|| StorageError::Invalid(format!("no op {op} in the journal")))?;
        let (path, file) = self.segment_reader(extent.segment_first_op)?;
        let mut bytes = vec![0u8; extent.len_bytes as usize];
        file.read_exact_at(extent.position_bytes, &mut bytes)?;
        let mut chain = extent.chain_before;
        let mut op_payload = None;
        let mut batches = Vec::with_capacity(extent.batch_count as usize);
        let mut position = 0usize;
        while position < bytes.len() {
            let at = extent.position_bytes + position as u64;
            let header =
                record::verify_with(&bytes[position..], &chain, OpRule::PerPrepare).map_err(|fault| {
                    StorageError::Damaged {
                        path: path.clone(),
                        position: at,
                        reason: format!("op {op} does not verify on read: {fault}"),
                    }
                })?;
            if header.op != op {
                return Err(StorageError::Damaged {
                    path,
                    position: at,
                    reason: format!("op {op}'s extent holds a record of op {}", header.op),
                });
            }
            let size = header.record_size_bytes() as usize;
            let payload = bytes[position + RECORD_HEADER_SIZE..position + size].to_vec();
            match header.kind {
                RecordKind::Op => op_payload = Some(payload),
                _ => batches.push(payload),
            }
            chain = chain.advance_by(&header, OpRule::PerPrepare);
            position += size;
        }
        let op_payload = op_payload.ok_or_else(|| StorageError::Damaged {
            path,
            position: extent.position_bytes,
            reason: format!("op {op} has no op record"),
        })?;
        Ok(StoredOp {
            op,
            view: extent.view,
            timestamp_us: extent.timestamp_us,
            op_payload,
            batches,
        })
    }

    /// Op `op`'s op record payload alone (the batches after it are not read), verified.
    pub fn read_op_record(&self, op: u64) -> Result<Vec<u8>, StorageError> {
        let extent = self
            .ops
            .get(&op)
            .ok_or_else(|| StorageError::Invalid(format!("no op {op} in the journal")))?;
        let (path, file) = self.segment_reader(extent.segment_first_op)?;
        let mut head = [0u8; RECORD_HEADER_SIZE];
        file.read_exact_at(extent.position_bytes, &mut head)?;
        let damaged = |reason: String| StorageError::Damaged {
            path: path.clone(),
            position: extent.position_bytes,
            reason,
        };
        let header =
            record::decode(&head).map_err(|fault| damaged(format!("op {op}'s op record: {fault}")))?;
        if header.kind != RecordKind::Op || header.op != op || header.record_size_bytes() > extent.len_bytes {
            return Err(damaged(format!(
                "op {op}'s extent does not begin with its op record"
            )));
        }
        let mut record = vec![0u8; header.record_size_bytes() as usize];
        file.read_exact_at(extent.position_bytes, &mut record)?;
        record::verify_with(&record, &extent.chain_before, OpRule::PerPrepare)
            .map_err(|fault| damaged(format!("op {op}'s op record does not verify on read: {fault}")))?;
        record.drain(..RECORD_HEADER_SIZE);
        Ok(record)
    }

    /// The path and the read handle of the segment named `first_op`, through the cache polls
    /// use too: recovery reads the op records of a whole window, and the replica reads bodies
    /// back op by op, mostly from one segment.
    fn segment_reader(&self, first_op: u64) -> Result<(PathBuf, Arc<dyn ReadFile>), StorageError> {
        let path = self.dir.join(segment_log_name(first_op));
        let mut cache = self
            .read_cache
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let file = Arc::clone(read::cached_file(
            &mut cache,
            self.disk.as_ref(),
            &path,
            first_op,
        )?);
        Ok((path, file))
    }

    /// Drop the cached read handle: a segment is being removed, and its name may be started
    /// again (a stale handle would serve the removed file's records).
    fn forget_read_handle(&mut self) {
        *self
            .read_cache
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = None;
    }

    /// Undo a rotation whose first write failed: remove the empty segment it started, so the
    /// frontier never lies at the start of a segment but the first (a sync now would put it
    /// there, and an open looks for it in the segment of its last op), and write to the
    /// previous segment again.
    fn drop_empty_active_segment(&mut self) -> Result<(), StorageError> {
        debug_assert!(self.segments.len() > 1);
        debug_assert_eq!(self.segments.last().map(|segment| segment.len_bytes), Some(0));
        let previous = self.segments[self.segments.len() - 2];
        // The previous segment is written again: its summary goes first.
        self.remove_summaries_from(previous.first_op())?;
        self.forget_active_summary();
        self.active = Some(self.disk.open_write(&previous.path(&self.dir))?);
        let empty = self.segments.pop().expect("more than one segment");
        // Its name is started again by the next rotation.
        self.forget_read_handle();
        self.disk.remove_file(&empty.path(&self.dir))?;
        self.disk.sync_dir(&self.dir)
    }

    /// Write the summary of the active segment, which is being sealed (its bytes are
    /// durable). Best effort: without a summary an open reads the segment, as it always may.
    fn write_summary_of_active(&self) {
        let _ = self.write_summary(self.segments.len() - 1);
    }

    /// Write the summary of every sealed segment (a journal a state transfer brought, which
    /// no rotation sealed here), so that opens take them from their summaries.
    pub(crate) fn write_summaries_of_sealed(&self) -> Result<(), StorageError> {
        for index in 0..self.segments.len() - 1 {
            self.write_summary(index)?;
        }
        Ok(())
    }

    /// Write the summary of segment `index`: sealed, or the active one being sealed or at a
    /// clean stop (its bytes durable, its end the chain's).
    fn write_summary(&self, index: usize) -> Result<(), StorageError> {
        let segment = self.segments[index];
        let next = self.segments.get(index + 1);
        let end = next.map_or(self.chain, |next| next.start);
        let encoded = self.summary_of(index, end, segment.len_bytes);
        atomic_file::write_on(
            self.disk.as_ref(),
            &self.dir.join(summary_name(segment.first_op())),
            &encoded,
        )
    }

    /// The encoded summary of the first `len_bytes` of segment `index`, which end with the
    /// chain `end` (at an op boundary).
    fn summary_of(&self, index: usize, end: Chain, len_bytes: u64) -> Vec<u8> {
        let segment = Segment {
            len_bytes,
            ..self.segments[index]
        };
        let first_batch = self
            .batches
            .partition_point(|entry| entry.base_offset < segment.start.next_offset);
        let end_batch = self
            .batches
            .partition_point(|entry| entry.base_offset < end.next_offset);
        let summary = SegmentSummary {
            start: segment.start,
            end,
            len_bytes: segment.len_bytes,
            ops: self
                .ops
                .range(segment.first_op()..end.next_op)
                .map(|(_, extent)| *extent)
                .collect(),
            batches: self.batches[first_batch..end_batch].to_vec(),
        };
        let encoded = summary.encode();
        debug_assert_eq!(
            SegmentSummary::decode(&encoded, self.partition_id, segment.first_op()).as_ref(),
            Some(&summary),
            "a summary decodes to what it was written from"
        );
        encoded
    }

    /// The segment being written has no summary (started, or its summary removed).
    fn forget_active_summary(&mut self) {
        self.summarised_len = 0;
        self.summary_synced = false;
        self.summary_retry_len = 0;
    }

    /// Write a summary of the durable part of the segment being written once it has grown
    /// by `step_bytes`, and by `growth_per_summary_byte` times the summary's size, since the
    /// segment's last summary ([`PREFIX_SUMMARY_STEP_BYTES`] and
    /// [`PREFIX_SUMMARY_GROWTH_PER_BYTE`] in the server), so that a start after a crash takes
    /// that part from it and reads only what follows. Returns whether it wrote one. Called
    /// after every commit: what is not due returns before the summary's size is counted.
    /// The summary is written with no barrier ([`atomic_file::write_unsynced_on`]): it
    /// describes only bytes the frontier already covers, and one lost or torn in a crash is
    /// no summary, so the start reads more. Not while the journal holds a prefix unverified
    /// (no summary is written from bytes nobody verified). Best effort: a failure to write
    /// it costs only that read.
    pub fn summarise_progress(&mut self, step_bytes: u64, growth_per_summary_byte: u64) -> bool {
        if self.stopped.is_some() || self.unverified_prefix.is_some() {
            return false;
        }
        let index = self.segments.len() - 1;
        let active = self.segments[index];
        let end = self.frontier.chain;
        // The frontier lies in the segment being written once it covers an op there.
        if end.next_op <= active.first_op() {
            return false;
        }
        let len_bytes = self.frontier.segment_len_bytes;
        debug_assert!(len_bytes <= active.len_bytes && len_bytes >= self.summarised_len);
        if len_bytes < self.summary_retry_len {
            return false;
        }
        let grown = len_bytes.saturating_sub(self.summarised_len);
        if grown == 0 || grown < step_bytes {
            return false;
        }
        let ops = end.next_op - active.first_op();
        let batches = self
            .batches
            .partition_point(|entry| entry.base_offset < end.next_offset)
            - self
                .batches
                .partition_point(|entry| entry.base_offset < active.start.next_offset);
        let summary_bytes = (ops as usize * SUMMARY_OP_BYTES + batches * SUMMARY_BATCH_BYTES) as u64;
        if grown < summary_bytes.saturating_mul(growth_per_summary_byte) {
            return false;
        }
        if SUMMARY_HEAD_BYTES as u64 + summary_bytes > atomic_file::ATOMIC_FILE_CONTENTS_BYTES_MAX {
            // Summaries only grow with the segment: none is tried again in this one.
            self.summary_retry_len = u64::MAX;
            return false;
        }
        let encoded = self.summary_of(index, end, len_bytes);
        let written = atomic_file::write_unsynced_on(
            self.disk.as_ref(),
            &self.dir.join(summary_name(active.first_op())),
            &encoded,
        );
        match written {
            Ok(()) => {
                self.summarised_len = len_bytes;
                self.summary_synced = false;
            }
            Err(_) => self.summary_retry_len = len_bytes.saturating_add(step_bytes.max(1)),
        }
        written.is_ok()
    }

    /// Remove the summaries of the segments from `first_op` on (they are about to change or
    /// go), durably if there were any: no summary may outlive the bytes it describes.
    fn remove_summaries_from(&self, first_op: u64) -> Result<(), StorageError> {
        let mut removed = false;
        for segment in self
            .segments
            .iter()
            .filter(|segment| segment.first_op() >= first_op)
        {
            removed |= self
                .disk
                .remove_file(&self.dir.join(summary_name(segment.first_op())))?;
        }
        if removed {
            self.disk.sync_dir(&self.dir)?;
        }
        Ok(())
    }

    fn rotate_if_full(&mut self) -> Result<(), StorageError> {
        let active = *self.segments.last().expect("one segment");
        // A skip seals its segment, so that a segment's batches hold contiguous offsets.
        let sealed_by_skip = self.ops.values().next_back().is_some_and(|last| {
            last.segment_first_op == active.first_op()
                && last.batch_count == 0
                && last.chain_before.next_offset < self.chain.next_offset
        });
        if active.len_bytes < self.config.segment_size_bytes && !sealed_by_skip {
            return Ok(());
        }
        debug_assert!(
            self.chain.next_op > active.first_op(),
            "a full segment holds an op"
        );
        // Seal the full segment and publish the frontier at its end (so that what lies above
        // the frontier is never more than the next segment), then start the next one at the
        // chain's next offset.
        if let Err(error) = self.active_file().sync_data() {
            self.stopped = Some(format!("sealing a segment failed: {error}"));
            return Err(error);
        }
        self.fdatasyncs += 1;
        self.release_cache(active.len_bytes);
        if let Err(error) = self.publish(frontier_at(&active, self.chain)) {
            self.stopped = Some(format!(
                "publishing the frontier of a sealed segment failed: {error}"
            ));
            return Err(error);
        }
        self.fdatasyncs += 1;
        self.write_summary_of_active();
        let segment = Segment {
            start: self.chain,
            len_bytes: 0,
        };
        // A summary under the new segment's name would describe bytes of an earlier life of
        // that name (every path that ends one removes it; this keeps it so).
        let stale_summary = self
            .disk
            .remove_file(&self.dir.join(summary_name(segment.first_op())));
        let created = stale_summary
            .and_then(|_| self.disk.create_new(&segment.path(&self.dir)))
            .and_then(|file| self.disk.sync_dir(&self.dir).map(|()| file));
        match created {
            Ok(file) => {
                self.active = Some(file);
                self.segments.push(segment);
                self.forget_active_summary();
                Ok(())
            }
            Err(error) => {
                self.stopped = Some(format!("starting a segment failed: {error}"));
                Err(error)
            }
        }
    }

    /// Publish `frontier` in the state file, with the reservation kept (at least the
    /// frontier's offset) and, in `relaxed` mode, saying that ops above it may be
    /// acknowledged.
    fn publish(&mut self, frontier: Frontier) -> Result<(), StorageError> {
        let reserved = self.reservation_kept();
        self.publish_state(frontier, reserved, self.config.relaxed)
    }

    /// The reservation a publish keeps (`publish_state` raises it to the frontier): a
    /// `relaxed` journal never lowers it but at a clean stop; a durable one needs none beyond
    /// its frontier, but keeps a resume floor an open found until the log reaches it.
    fn reservation_kept(&self) -> u64 {
        if self.config.relaxed {
            self.offset_reserved
        } else {
            self.resume_floor
        }
    }

    fn publish_state(
        &mut self,
        frontier: Frontier,
        offset_reserved: u64,
        unsynced_acknowledged: bool,
    ) -> Result<(), StorageError> {
        let offset_reserved = offset_reserved.max(frontier.chain.next_offset);
        self.state
            .as_mut()
            .expect("a journal that is not stopped was opened for writing")
            .publish(journal_state(frontier, offset_reserved, unsynced_acknowledged))?;
        self.frontier = frontier;
        self.offset_reserved = offset_reserved;
        self.unsynced_acknowledged = unsynced_acknowledged;
        Ok(())
    }

    /// The active segment's write handle. Only write paths call it, after
    /// `check_not_stopped`, which a read-only journal never passes.
    fn active_file(&mut self) -> &mut Box<dyn WriteFile> {
        self.active
            .as_mut()
            .expect("a journal that is not stopped was opened for writing")
    }

    fn check_not_stopped(&self) -> Result<(), StorageError> {
        match &self.stopped {
            Some(reason) => Err(StorageError::Invalid(format!(
                "the journal in {} stopped after a failed write ({reason}); reopen it",
                self.dir.display()
            ))),
            None => Ok(()),
        }
    }

    fn check_invariants(&self) {
        debug_assert!(!self.segments.is_empty());
        debug_assert!(
            self.segments
                .windows(2)
                .all(|pair| pair[0].first_op() < pair[1].first_op()
                    && pair[0].start.next_offset <= pair[1].start.next_offset)
        );
        debug_assert_eq!(
            self.ops.keys().next().copied().unwrap_or(self.chain.next_op),
            if self.ops.is_empty() {
                self.chain.next_op
            } else {
                self.start.next_op
            }
        );
        debug_assert!(
            self.ops
                .keys()
                .zip(self.ops.keys().skip(1))
                .all(|(a, b)| a + 1 == *b)
        );
        debug_assert!(
            self.ops
                .keys()
                .next_back()
                .is_none_or(|&last| last + 1 == self.chain.next_op)
        );
        debug_assert!(self.durable_op() <= self.last_op());
        // Batches are in offset order, never overlapping, within the journal's offsets (a
        // skip leaves offsets no batch holds).
        debug_assert!(
            self.batches
                .first()
                .is_none_or(|first| first.base_offset >= self.start.next_offset)
        );
        debug_assert!(
            self.batches
                .windows(2)
                .all(|pair| pair[0].end_offset() <= pair[1].base_offset)
        );
        debug_assert!(
            self.batches
                .last()
                .is_none_or(|last| last.end_offset() <= self.chain.next_offset)
        );
        debug_assert!(self.frontier.chain.next_offset <= self.offset_reserved);
    }
}

/// The highest offset end a verifying record of partition `partition_id` in segment `path`
/// names from byte `from` on (see [`Salvage::highest_offset_after_damage`]), stepping a byte
/// at a time past what does not verify. `None` if none verifies or the file cannot be read.
fn highest_offset_in(disk: &dyn Disk, path: &Path, from: u64, partition_id: u32) -> Option<u64> {
    let bytes = disk.read_all(path, SEGMENT_BYTES_MAX).ok()??;
    let mut position = usize::try_from(from).ok()?;
    let mut highest = None;
    while position + RECORD_HEADER_SIZE <= bytes.len() {
        match record::verify_envelope(&bytes[position..]) {
            Ok(header) if header.partition_id == partition_id => {
                let end = match header.kind {
                    RecordKind::Batch => header.base_offset.saturating_add(u64::from(header.message_count)),
                    _ => header.base_offset,
                };
                highest = highest.max(Some(end));
                position += usize::try_from(header.record_size_bytes()).ok()?;
            }
            _ => position += 1,
        }
    }
    highest
}

/// The chain the journal in `dir` starts from (`journal.start`, verified).
fn read_start(disk: &dyn Disk, dir: &Path, partition_id: u32) -> Result<Chain, StorageError> {
    let path = dir.join(JOURNAL_START_FILE);
    let damaged = |reason: &str| StorageError::Damaged {
        path: path.clone(),
        position: 0,
        reason: reason.to_string(),
    };
    let bytes = atomic_file::read_verified_on(disk, &path)?
        .ok_or_else(|| damaged("the journal start file is missing"))?;
    decode_start(&bytes, partition_id).ok_or_else(|| damaged("the journal start file is malformed"))
}

/// What an open found, before it changes anything (see [`JournalLog::open_on`]).
struct OpenPlan {
    start: Chain,
    loaded: PartitionState,
    /// One slot of the state file failed verification (see `state::load_noting_damage`).
    state_slot_damaged: bool,
    /// The segments kept, each cut at the frontier if it holds it.
    segments: Vec<Segment>,
    ops: BTreeMap<u64, OpExtent>,
    batches: Vec<BatchEntry>,
    /// The chain at the frontier.
    chain: Chain,
    /// Segments wholly above the frontier (by first op), with their lengths: dropped.
    above: Vec<(u64, u64)>,
    /// Segments below the journal's start (by first op): a removal's leftovers, removed.
    below_start: Vec<u64>,
    /// Whole ops above the frontier kept (they may have been acknowledged), and their bytes.
    unsynced_ops_kept: u64,
    unsynced_bytes_kept: u64,
    /// Bytes above the frontier in the segments kept (the frontier's, and the one after it
    /// when whole ops there were kept): dropped. All lie in the last kept segment.
    dropped_bytes: u64,
    /// Segments that have a summary (by first op), and summaries a crash left half-written.
    summaries: BTreeSet<u64>,
    /// Sealed segments taken from their summaries.
    adopted: BTreeSet<u64>,
    /// The prefix of the frontier's segment taken from its summary, unread.
    unverified_prefix: Option<SealedSegment>,
    summary_staging: Vec<String>,
}

/// The read-only half of an open: read and verify everything below the frontier (but what it
/// takes from summaries when `trust_summaries`), and list what lies above it. Damage below
/// the frontier is an `Err`.
fn plan_open(
    disk: &dyn Disk,
    dir: &Path,
    partition_id: u32,
    trust_summaries: bool,
) -> Result<OpenPlan, StorageError> {
    let damaged = |path: PathBuf, position: u64, reason: String| StorageError::Damaged {
        path,
        position,
        reason,
    };
    let start = read_start(disk, dir, partition_id)?;
    let state_path = dir.join(STATE_FILE_NAME);
    let state_bytes = disk
        .read_all(&state_path, STATE_FILE_SIZE_BYTES)?
        .ok_or_else(|| damaged(state_path.clone(), 0, "the state file is missing".into()))?;
    let (mut loaded, state_slot_damaged) = state::load_noting_damage(&state_bytes, partition_id)
        .map_err(|(position, reason)| damaged(state_path.clone(), position, reason))?;
    let behind_start = loaded.frontier.chain.next_op < start.next_op
        || (loaded.frontier.chain.next_op == start.next_op
            && loaded.frontier.segment_base_offset != start.next_offset);
    if state_slot_damaged && behind_start {
        // The valid slot is older than a removal of the oldest segments: its frontier lies in
        // a segment that removal took (only segments wholly below the frontier of their day
        // go). Everything up to the start was durable then: the frontier is the start, and
        // the whole ops above it are kept as for any damaged slot.
        loaded.frontier = Frontier {
            segment_base_offset: start.next_offset,
            segment_len_bytes: 0,
            chain: start,
        };
        loaded.offset_reserved = loaded.offset_reserved.max(start.next_offset);
    }
    let frontier = loaded.frontier;

    // Segments are named by their first op.
    let mut names: Vec<u64> = Vec::new();
    let mut summaries: BTreeSet<u64> = BTreeSet::new();
    let mut summary_staging: Vec<String> = Vec::new();
    for name in disk.list_dir(dir)? {
        if let Some(first_op) = segment_first_op(&name) {
            names.push(first_op);
        } else if let Some(first_op) = summary_first_op(&name) {
            summaries.insert(first_op);
        } else if name.strip_suffix(".tmp").and_then(summary_first_op).is_some() {
            summary_staging.push(name);
        }
    }
    names.sort_unstable();
    // Segments below the start are what a crash left of a removal of the oldest segments
    // (the start is published first): the open removes them.
    let below_start: Vec<u64> = names
        .iter()
        .copied()
        .filter(|&first_op| first_op < start.next_op)
        .collect();
    names.retain(|&first_op| first_op >= start.next_op);
    if names.first() != Some(&start.next_op) {
        return Err(damaged(
            dir.to_path_buf(),
            0,
            format!(
                "the journal's first segment must be named {} (its start op), found {:?}",
                start.next_op,
                names.first()
            ),
        ));
    }
    if frontier.chain.next_op < start.next_op {
        return Err(damaged(
            state_path,
            0,
            format!(
                "the frontier ends at op {}, below the journal's start at op {}",
                frontier.chain.next_op - 1,
                start.next_op
            ),
        ));
    }
    let frontier_name = frontier_segment_name(names.iter().copied(), start.next_op, frontier.chain.next_op);

    // Everything above the frontier was never reported durable (a sync publishes the
    // frontier only after its data barrier): it is dropped, whatever it holds. That covers
    // an op whose records were only partly written, segments started after the last sync,
    // and ops a cut had removed before its truncation was durable.
    let kept: Vec<u64> = names
        .iter()
        .copied()
        .filter(|&first_op| first_op <= frontier_name)
        .collect();
    let above: Vec<u64> = names
        .iter()
        .copied()
        .filter(|&first_op| first_op > frontier_name)
        .collect();
    let mut chain = start;
    let mut adopted: BTreeSet<u64> = BTreeSet::new();
    let mut unverified_prefix: Option<SealedSegment> = None;
    let mut segments = Vec::with_capacity(kept.len());
    let mut ops: BTreeMap<u64, OpExtent> = BTreeMap::new();
    let mut batches: Vec<BatchEntry> = Vec::new();
    let mut dropped_bytes = 0u64;
    for &first_op in &kept {
        let path = dir.join(segment_log_name(first_op));
        if first_op != chain.next_op {
            return Err(damaged(
                path,
                0,
                format!(
                    "the segment is named for op {first_op}, the chain before it ends at op {}",
                    chain.next_op - 1
                ),
            ));
        }
        let segment_start = chain;
        // Bounded before it is read: no journal segment grows past the largest segment size
        // plus one op's records (see `SEGMENT_BYTES_MAX`).
        let len = disk.file_len(&path)?.unwrap_or(0);
        if len > SEGMENT_BYTES_MAX {
            return Err(damaged(
                path,
                0,
                format!(
                    "the segment holds {len} bytes, more than a journal segment ever may ({SEGMENT_BYTES_MAX})"
                ),
            ));
        }
        let durable_len = if first_op == frontier_name {
            if segment_start.next_offset != frontier.segment_base_offset {
                return Err(damaged(
                    state_path.clone(),
                    0,
                    format!(
                        "the frontier's segment begins at offset {}, the state file says {}",
                        segment_start.next_offset, frontier.segment_base_offset
                    ),
                ));
            }
            frontier.segment_len_bytes
        } else {
            len
        };
        if len < durable_len {
            return Err(damaged(
                path,
                len,
                format!("the segment ends at byte {len}, below its durable frontier at byte {durable_len}"),
            ));
        }
        dropped_bytes += len - durable_len;
        // A sealed segment below the frontier's, whose summary matches it: taken without
        // reading it (its records are verified when read).
        if trust_summaries
            && first_op != frontier_name
            && summaries.contains(&first_op)
            && let Some(summary) = read_summary(disk, dir, partition_id, first_op)
            && summary.start == chain
            && summary.len_bytes == len
            && summary_ends_hold(disk, &path, &summary)
        {
            adopted.insert(first_op);
            chain = summary.adopt_into(&mut ops, &mut batches);
            segments.push(Segment {
                start: segment_start,
                len_bytes: len,
            });
            continue;
        }
        // The frontier's segment, when a summary (written at a clean stop, or as the segment
        // grew: `JournalLog::summarise_progress`) covers a prefix of its durable bytes: that
        // prefix is taken from the summary without reading it, and stays unverified until
        // the journal reads it (before its first write, or when the caller verifies it:
        // `JournalLog::unverified_prefix`). Only the bytes from there to the frontier are
        // read now.
        let mut scan_from = 0;
        if trust_summaries
            && first_op == frontier_name
            && summaries.contains(&first_op)
            && let Some(summary) = read_summary(disk, dir, partition_id, first_op)
            && summary.start == chain
            && summary.len_bytes > 0
            && summary.len_bytes <= durable_len
            && summary_ends_hold(disk, &path, &summary)
        {
            scan_from = summary.len_bytes;
            unverified_prefix = Some(SealedSegment {
                first_op,
                path: path.clone(),
                start: summary.start,
                end: summary.end,
                len_bytes: summary.len_bytes,
            });
            chain = summary.adopt_into(&mut ops, &mut batches);
        }
        let scanned = scan_durable(disk, &path, chain, scan_from, durable_len, OPEN_CHUNK_BYTES)?;
        match &scanned.tail {
            Tail::Clean => {}
            Tail::Torn { fault } => {
                return Err(damaged(
                    path,
                    scanned.valid_len_bytes,
                    format!("below the frontier: {fault}"),
                ));
            }
            Tail::Damaged {
                position_bytes,
                reason,
            } => return Err(damaged(path, *position_bytes, reason.clone())),
        }
        if scanned.gap.is_some() {
            return Err(damaged(
                path,
                0,
                "a gap record in a journal log (a journal mints no offsets)".into(),
            ));
        }
        // Group the records by op, in log order.
        let mut listed: Vec<ListedRecord> = scanned
            .records
            .iter()
            .map(|r| ListedRecord {
                position_bytes: r.position_bytes,
                op: r.op,
                size_bytes: r.size_bytes,
                view: r.view,
                timestamp_us: r.timestamp_us,
                is_batch: true,
                message_count: u64::from(r.message_count),
                checksum: r.checksum,
                base_offset: r.base_offset,
            })
            .chain(scanned.op_records.iter().map(|r| ListedRecord {
                position_bytes: r.position_bytes,
                op: r.op,
                size_bytes: r.size_bytes,
                view: r.view,
                timestamp_us: r.timestamp_us,
                is_batch: false,
                message_count: 0,
                checksum: r.checksum,
                base_offset: r.base_offset,
            }))
            .collect();
        listed.sort_unstable_by_key(|record| record.position_bytes);
        let walk = index_records(listed, first_op, &path, chain, &mut ops, &mut batches)?;
        debug_assert_eq!(walk, scanned.end);
        chain = scanned.end;
        segments.push(Segment {
            start: segment_start,
            len_bytes: durable_len,
        });
    }
    if chain != frontier.chain {
        return Err(damaged(
            dir.join(segment_log_name(frontier_name)),
            frontier.segment_len_bytes,
            "the log below the frontier does not end with the frontier's chain".into(),
        ));
    }
    // Above the frontier: the whole ops are kept when they may have been acknowledged
    // (`relaxed` mode; or one state slot failed verification, and it may have been the
    // newest, a publish reported durable then hit by a bit flip), first in the frontier's
    // segment, then, if that one ends with a whole op, in the segment after it (sealing a
    // segment publishes the frontier at its end, so nothing further can hold an
    // acknowledged op).
    let mut above = above;
    let mut unsynced_ops_kept = 0u64;
    let mut unsynced_bytes_kept = 0u64;
    if loaded.unsynced_acknowledged || state_slot_damaged {
        let mut segment = *segments.last().expect("the frontier's segment");
        let mut len = disk.file_len(&segment.path(dir))?.unwrap_or(0);
        loop {
            let path = segment.path(dir);
            let (listed, end, end_chain) = scan_whole_ops(disk, &path, segment.len_bytes, len, chain)?;
            let kept_bytes = end - segment.len_bytes;
            if kept_bytes > 0 {
                if segment.len_bytes == 0
                    && segments.last().map(Segment::first_op) != Some(segment.first_op())
                {
                    // The segment after the frontier's holds kept ops: it is the journal's
                    // now (named for the chain's next op, checked below).
                    above.retain(|&first_op| first_op != segment.first_op());
                    dropped_bytes += len;
                    segments.push(segment);
                }
                unsynced_ops_kept += listed.iter().filter(|record| !record.is_batch).count() as u64;
                unsynced_bytes_kept += kept_bytes;
                dropped_bytes -= kept_bytes;
                let walk = index_records(listed, segment.first_op(), &path, chain, &mut ops, &mut batches)?;
                debug_assert_eq!(walk, end_chain);
                chain = end_chain;
                segments.last_mut().expect("a kept segment").len_bytes = end;
            }
            // The next segment continues only one kept to its end, and must be named for the
            // chain's next op.
            if end < len || kept_bytes == 0 && segment.len_bytes == 0 {
                break;
            }
            let Some(&next_first_op) = above.first() else {
                break;
            };
            if next_first_op != chain.next_op {
                break;
            }
            let next_len = disk
                .file_len(&dir.join(segment_log_name(next_first_op)))?
                .unwrap_or(0);
            if next_len > SEGMENT_BYTES_MAX {
                break;
            }
            // The frontier's segment is sealed: its summary (written when it was sealed)
            // stays if it describes the bytes just scanned, or every later open reads it.
            if summaries.contains(&segment.first_op())
                && let Some(summary) = read_summary(disk, dir, partition_id, segment.first_op())
                && summary.start == segment.start
                && summary.len_bytes == len
                && summary.end == chain
            {
                adopted.insert(segment.first_op());
            }
            segment = Segment {
                start: chain,
                len_bytes: 0,
            };
            debug_assert_eq!(segment.first_op(), next_first_op);
            len = next_len;
        }
    }
    let mut above_lens = Vec::with_capacity(above.len());
    for first_op in above {
        above_lens.push((
            first_op,
            disk.file_len(&dir.join(segment_log_name(first_op)))?.unwrap_or(0),
        ));
    }
    Ok(OpenPlan {
        start,
        loaded,
        state_slot_damaged,
        segments,
        ops,
        batches,
        chain,
        above: above_lens,
        below_start,
        unsynced_ops_kept,
        unsynced_bytes_kept,
        dropped_bytes,
        summaries,
        adopted,
        unverified_prefix,
        summary_staging,
    })
}

/// Index the verified records of segment `first_op` (at `path`), in log order, continuing
/// `chain`: each op record begins an op in `ops`, each batch record extends its op and is
/// added to `batches`. Returns the chain after them.
fn index_records(
    listed: Vec<ListedRecord>,
    first_op: u64,
    path: &Path,
    chain: Chain,
    ops: &mut BTreeMap<u64, OpExtent>,
    batches: &mut Vec<BatchEntry>,
) -> Result<Chain, StorageError> {
    let damaged = |position: u64, reason: String| StorageError::Damaged {
        path: path.to_path_buf(),
        position,
        reason,
    };
    let mut walk = chain;
    for ListedRecord {
        position_bytes,
        op,
        size_bytes,
        view,
        timestamp_us,
        is_batch,
        message_count,
        checksum,
        base_offset,
    } in listed
    {
        match ops.get_mut(&op) {
            Some(extent) if is_batch => {
                // The op's next batch (the scan's op rule keeps batches after their op
                // record; rotation never splits an op).
                if extent.segment_first_op != first_op {
                    return Err(damaged(
                        position_bytes,
                        format!("op {op} continues from an earlier segment"),
                    ));
                }
                extent.len_bytes += size_bytes;
                extent.message_count += message_count;
                extent.batch_count += 1;
                let timestamp_us = batches
                    .last()
                    .map_or(timestamp_us, |last| timestamp_us.max(last.timestamp_us));
                batches.push(BatchEntry {
                    base_offset: walk.next_offset,
                    position_bytes,
                    len_bytes: u32::try_from(size_bytes)
                        .map_err(|_| damaged(position_bytes, "a batch record past 4 GiB".into()))?,
                    message_count: u32::try_from(message_count).expect("a record's count is a u32"),
                    timestamp_us,
                });
            }
            Some(_) => {
                return Err(damaged(position_bytes, format!("a second op record of op {op}")));
            }
            None => {
                if is_batch {
                    return Err(damaged(
                        position_bytes,
                        format!("op {op} begins with a batch, not its op record"),
                    ));
                }
                ops.insert(
                    op,
                    OpExtent {
                        op,
                        view,
                        timestamp_us,
                        batch_count: 0,
                        segment_first_op: first_op,
                        position_bytes,
                        len_bytes: size_bytes,
                        chain_before: Chain { next_op: op, ..walk },
                        message_count: 0,
                    },
                );
            }
        }
        debug_assert!(base_offset >= walk.next_offset);
        walk = Chain {
            partition_id: walk.partition_id,
            next_offset: if is_batch {
                walk.next_offset + message_count
            } else {
                base_offset
            },
            parent_checksum: checksum,
            next_op: op + 1,
        };
    }
    Ok(walk)
}

/// The whole ops in bytes `from..len` of the segment at `path`, continuing `chain`: each
/// an op record, then as many batch records of its op as the op record names, every record
/// verifying in the chain. Stops before the first record that does not, or the first op not
/// whole: what follows was never covered by a barrier, so it is a torn tail. Records are read
/// one at a time (each bounded before it is read), so memory stays at one record.
fn scan_whole_ops(
    disk: &dyn Disk,
    path: &Path,
    from: u64,
    len: u64,
    chain: Chain,
) -> Result<(Vec<ListedRecord>, u64, Chain), StorageError> {
    let mut kept: Vec<ListedRecord> = Vec::new();
    let mut kept_end = from;
    let mut kept_chain = chain;
    if from >= len {
        return Ok((kept, kept_end, kept_chain));
    }
    let file = disk.open_read(path)?;
    let mut position = from;
    let mut walk = chain;
    let mut op_records: Vec<ListedRecord> = Vec::new();
    let mut batches_left = 0u32;
    let mut head = [0u8; RECORD_HEADER_SIZE];
    let mut record = Vec::new();
    while position + RECORD_HEADER_SIZE as u64 <= len {
        file.read_exact_at(position, &mut head)?;
        let Ok(header) = record::decode(&head) else {
            break;
        };
        let size = header.record_size_bytes();
        if size > len - position || size > RECORD_HEADER_SIZE as u64 + u64::from(BATCH_BYTES_MAX) {
            break;
        }
        record.resize(size as usize, 0);
        file.read_exact_at(position, &mut record)?;
        let Ok(header) = record::verify_with(&record, &walk, OpRule::PerPrepare) else {
            break;
        };
        let is_batch = header.kind == RecordKind::Batch;
        // An op record while a batch is owed, a batch no op record announced, or a gap
        // record (a journal holds none): not a whole op.
        if is_batch != (batches_left > 0) || (!is_batch && header.kind != RecordKind::Op) {
            break;
        }
        if is_batch {
            batches_left -= 1;
        } else {
            batches_left = header.message_count;
        }
        op_records.push(ListedRecord {
            position_bytes: position,
            op: header.op,
            size_bytes: size,
            view: header.view,
            timestamp_us: header.timestamp_us,
            is_batch,
            message_count: if is_batch {
                u64::from(header.message_count)
            } else {
                0
            },
            checksum: header.checksum,
            base_offset: header.base_offset,
        });
        walk = walk.advance_by(&header, OpRule::PerPrepare);
        position += size;
        if batches_left == 0 {
            // The op is whole: keep it.
            kept.append(&mut op_records);
            kept_end = position;
            kept_chain = walk;
        }
    }
    Ok((kept, kept_end, kept_chain))
}

// ---- segment summaries ----

/// What a segment holds, written beside it when it is sealed, and for the segment being
/// written at a clean stop (`<first op>.summary`, an atomic file): its start and end chains,
/// its length, and the extents of its ops and batches, so that an open can take the segment
/// (or, for the frontier's segment, that prefix of it) without reading it. The segment's
/// bytes are verified when read (every poll and op read verifies its records) and by
/// `cairn check`, which never trusts a summary; a sealed segment's by the scrub, and the
/// frontier segment's prefix before the journal writes anything (`unverified_prefix`).
///
/// A summary describes the first `len_bytes` of one file, all below the frontier: a cut into
/// them, or reopening a sealed segment for writes, removes the summary before the file
/// changes. An open uses it for a segment below the frontier's whose length it matches, or
/// for a prefix of the frontier's segment, and scans otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SegmentSummary {
    start: Chain,
    end: Chain,
    len_bytes: u64,
    ops: Vec<OpExtent>,
    batches: Vec<BatchEntry>,
}

const SUMMARY_VERSION: u32 = 1;
const SUMMARY_SUFFIX: &str = ".summary";
/// Bytes of a summary's fixed part and of each op and batch entry.
const SUMMARY_HEAD_BYTES: usize = 4 + 4 + 3 * 8 + 3 * 8 + 8 + 4 + 4;
const SUMMARY_OP_BYTES: usize = 8 + 4 + 8 + 4 + 8 + 8 + 8 + 8 + 8;
const SUMMARY_BATCH_BYTES: usize = 8 + 8 + 4 + 4 + 8;

fn summary_name(first_op: u64) -> String {
    format!("{first_op:020}{SUMMARY_SUFFIX}")
}

/// The first op a summary file (or its staging file) is named for.
fn summary_first_op(name: &str) -> Option<u64> {
    op_named(name, SUMMARY_SUFFIX)
}

impl SegmentSummary {
    /// Put the summarised ops and batches in an open's index (after those of the segments
    /// before it; a batch's timestamp is kept at least its predecessor's, as a scan keeps
    /// it). Returns the chain at the summary's end.
    fn adopt_into(self, ops: &mut BTreeMap<u64, OpExtent>, batches: &mut Vec<BatchEntry>) -> Chain {
        for extent in self.ops {
            ops.insert(extent.op, extent);
        }
        for entry in self.batches {
            let timestamp_us = batches.last().map_or(entry.timestamp_us, |last| {
                entry.timestamp_us.max(last.timestamp_us)
            });
            batches.push(BatchEntry {
                timestamp_us,
                ..entry
            });
        }
        self.end
    }

    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(
            SUMMARY_HEAD_BYTES + self.ops.len() * SUMMARY_OP_BYTES + self.batches.len() * SUMMARY_BATCH_BYTES,
        );
        out.extend_from_slice(&SUMMARY_VERSION.to_le_bytes());
        out.extend_from_slice(&self.start.partition_id.to_le_bytes());
        for chain in [self.start, self.end] {
            out.extend_from_slice(&chain.next_offset.to_le_bytes());
            out.extend_from_slice(&chain.parent_checksum.to_le_bytes());
            out.extend_from_slice(&chain.next_op.to_le_bytes());
        }
        out.extend_from_slice(&self.len_bytes.to_le_bytes());
        out.extend_from_slice(&(self.ops.len() as u32).to_le_bytes());
        out.extend_from_slice(&(self.batches.len() as u32).to_le_bytes());
        for extent in &self.ops {
            out.extend_from_slice(&extent.op.to_le_bytes());
            out.extend_from_slice(&extent.view.to_le_bytes());
            out.extend_from_slice(&extent.timestamp_us.to_le_bytes());
            out.extend_from_slice(&extent.batch_count.to_le_bytes());
            out.extend_from_slice(&extent.position_bytes.to_le_bytes());
            out.extend_from_slice(&extent.len_bytes.to_le_bytes());
            out.extend_from_slice(&extent.chain_before.next_offset.to_le_bytes());
            out.extend_from_slice(&extent.chain_before.parent_checksum.to_le_bytes());
            out.extend_from_slice(&extent.message_count.to_le_bytes());
        }
        for entry in &self.batches {
            out.extend_from_slice(&entry.base_offset.to_le_bytes());
            out.extend_from_slice(&entry.position_bytes.to_le_bytes());
            out.extend_from_slice(&entry.len_bytes.to_le_bytes());
            out.extend_from_slice(&entry.message_count.to_le_bytes());
            out.extend_from_slice(&entry.timestamp_us.to_le_bytes());
        }
        out
    }

    /// The summary `bytes` hold for the segment named `first_op` of `partition_id`, if they
    /// are one and it is consistent (ops consecutive from its start to its end, each within
    /// the segment, batches in offset order and adding up to its end): otherwise `None`, and
    /// the open scans the segment instead.
    fn decode(bytes: &[u8], partition_id: u32, first_op: u64) -> Option<SegmentSummary> {
        let mut reader = SummaryReader { bytes };
        if reader.u32()? != SUMMARY_VERSION || reader.u32()? != partition_id {
            return None;
        }
        let mut chain = || -> Option<Chain> {
            Some(Chain {
                partition_id,
                next_offset: reader.u64()?,
                parent_checksum: reader.u64()?,
                next_op: reader.u64()?,
            })
        };
        let (start, end) = (chain()?, chain()?);
        let len_bytes = reader.u64()?;
        let (op_count, batch_count) = (reader.u32()? as usize, reader.u32()? as usize);
        if start.next_op != first_op
            || end.next_op < start.next_op
            || end.next_offset < start.next_offset
            || len_bytes > SEGMENT_BYTES_MAX
            || reader.bytes.len() != op_count * SUMMARY_OP_BYTES + batch_count * SUMMARY_BATCH_BYTES
            || op_count as u64 != end.next_op - start.next_op
        {
            return None;
        }
        let mut ops = Vec::with_capacity(op_count);
        let mut position = 0u64;
        let mut next_offset = start.next_offset;
        for index in 0..op_count {
            let extent = OpExtent {
                op: reader.u64()?,
                view: reader.u32()?,
                timestamp_us: reader.u64()?,
                batch_count: reader.u32()?,
                segment_first_op: first_op,
                position_bytes: reader.u64()?,
                len_bytes: reader.u64()?,
                chain_before: Chain {
                    partition_id,
                    next_offset: reader.u64()?,
                    parent_checksum: reader.u64()?,
                    next_op: 0,
                },
                message_count: reader.u64()?,
            };
            let extent = OpExtent {
                chain_before: Chain {
                    next_op: extent.op,
                    ..extent.chain_before
                },
                ..extent
            };
            if extent.op != first_op + index as u64
                || extent.position_bytes != position
                || extent.chain_before.next_offset != next_offset
                || (index == 0 && extent.chain_before != start)
            {
                return None;
            }
            position = position.checked_add(extent.len_bytes)?;
            next_offset = next_offset.checked_add(extent.message_count)?;
            ops.push(extent);
        }
        // Offsets run on from op to op; only a skip (an op without batches, which seals its
        // segment, so the last) may end the segment above where its messages end.
        let skips_at_end = ops.last().is_some_and(|last| last.batch_count == 0);
        let ends_at = |offset: u64| offset == end.next_offset || (skips_at_end && offset < end.next_offset);
        if position != len_bytes || !ends_at(next_offset) {
            return None;
        }
        let mut batches: Vec<BatchEntry> = Vec::with_capacity(batch_count);
        let mut expected_offset = start.next_offset;
        for _ in 0..batch_count {
            let entry = BatchEntry {
                base_offset: reader.u64()?,
                position_bytes: reader.u64()?,
                len_bytes: reader.u32()?,
                message_count: reader.u32()?,
                timestamp_us: reader.u64()?,
            };
            if entry.base_offset != expected_offset
                || entry.message_count == 0
                || entry
                    .position_bytes
                    .checked_add(u64::from(entry.len_bytes))
                    .is_none_or(|entry_end| entry_end > len_bytes)
                || batches
                    .last()
                    .is_some_and(|last| last.timestamp_us > entry.timestamp_us)
            {
                return None;
            }
            expected_offset = entry.base_offset.checked_add(u64::from(entry.message_count))?;
            batches.push(entry);
        }
        ends_at(expected_offset).then_some(SegmentSummary {
            start,
            end,
            len_bytes,
            ops,
            batches,
        })
    }
}

/// Whether the segment at `path` begins and ends with the records `summary` says: its first
/// record continues the summary's start chain and its last one ends with its end chain (two
/// header reads). A summary that says otherwise is not taken; the segment is scanned.
fn summary_ends_hold(disk: &dyn Disk, path: &Path, summary: &SegmentSummary) -> bool {
    let Some(last_op) = summary.ops.last() else {
        return false;
    };
    let last_position = match summary.batches.last() {
        Some(batch) if batch.position_bytes >= last_op.position_bytes => batch.position_bytes,
        _ => last_op.position_bytes,
    };
    let Ok(file) = disk.open_read(path) else {
        return false;
    };
    let header_at = |position: u64| -> Option<RecordHeader> {
        let mut bytes = [0u8; RECORD_HEADER_SIZE];
        file.read_exact_at(position, &mut bytes).ok()?;
        record::decode(&bytes).ok()
    };
    let (Some(first), Some(last)) = (header_at(0), header_at(last_position)) else {
        return false;
    };
    first.op == summary.start.next_op
        && first.parent_checksum == summary.start.parent_checksum
        && last.checksum == summary.end.parent_checksum
        && last.op + 1 == summary.end.next_op
        && last_position + last.record_size_bytes() == summary.len_bytes
}

/// The summary of segment `first_op` in `dir`, if it can be read and is one (a damaged or
/// inconsistent summary is no summary: the open scans the segment).
fn read_summary(disk: &dyn Disk, dir: &Path, partition_id: u32, first_op: u64) -> Option<SegmentSummary> {
    let bytes = atomic_file::read_verified_on(disk, &dir.join(summary_name(first_op))).ok()??;
    SegmentSummary::decode(&bytes, partition_id, first_op)
}

struct SummaryReader<'a> {
    bytes: &'a [u8],
}

impl SummaryReader<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.bytes.split_first_chunk::<N>()?;
        self.bytes = rest;
        Some(*head)
    }

    fn u32(&mut self) -> Option<u32> {
        self.take::<4>().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Option<u64> {
        self.take::<8>().map(u64::from_le_bytes)
    }
}

/// Bytes an open reads at a time while it verifies a segment below its frontier (more only
/// for a record larger than this): what bounds an open's memory, whatever the segment size.
const OPEN_CHUNK_BYTES: u64 = 16 * 1024 * 1024;

/// [`record::scan_with`] over bytes `from..durable_len` of the segment at `path` (all below
/// the frontier, so any fault is damage; `from` is where a record continuing `start`
/// begins), read in pieces of whole records of about [`OPEN_CHUNK_BYTES`]: the same verdict
/// as one scan of the whole range, positions in the file, without holding the segment in
/// memory.
fn scan_durable(
    disk: &dyn Disk,
    path: &Path,
    start: Chain,
    from: u64,
    durable_len: u64,
    chunk_bytes: u64,
) -> Result<ScanResult, StorageError> {
    debug_assert!(from <= durable_len);
    let mut result = ScanResult {
        valid_len_bytes: from,
        records: Vec::new(),
        op_records: Vec::new(),
        gap: None,
        end: start,
        durable_end: None,
        tail: Tail::Clean,
    };
    if durable_len == from {
        result.durable_end = Some(start);
        return Ok(result);
    }
    let file = disk.open_read(path)?;
    let mut buffer: Vec<u8> = Vec::new();
    let mut position = from;
    while position < durable_len {
        let available = durable_len - position;
        // At least a record header, so the first record's size can be read.
        let chunk_len = available.min(chunk_bytes.max(RECORD_HEADER_SIZE as u64));
        file.read_exact_at_into(position, chunk_len as usize, &mut buffer, 0)?;
        // The whole records the chunk holds, by their headers' sizes (unverified here: the
        // scan verifies every one).
        let mut piece_len = 0u64;
        while let Ok(header) = record::decode(&buffer[piece_len as usize..]) {
            let end = piece_len + header.record_size_bytes();
            if end > chunk_len {
                break;
            }
            piece_len = end;
        }
        if piece_len == 0 {
            // The first record is larger than a chunk: read it whole when its header claims
            // a size the durable bytes can hold (at most the largest record); otherwise the
            // scan of the chunk reports what is wrong with it.
            let claimed = record::decode(&buffer).map_or(0, |header| header.record_size_bytes());
            if claimed > chunk_len
                && claimed <= available
                && claimed <= RECORD_HEADER_SIZE as u64 + u64::from(BATCH_BYTES_MAX)
            {
                file.read_exact_at_into(position, claimed as usize, &mut buffer, 0)?;
                piece_len = claimed;
            } else {
                piece_len = chunk_len;
            }
        }
        let piece = &buffer[..piece_len as usize];
        let scanned = record::scan_with(piece, result.end, piece_len, OpRule::PerPrepare);
        result
            .records
            .extend(scanned.records.into_iter().map(|mut record| {
                record.position_bytes += position;
                record
            }));
        result
            .op_records
            .extend(scanned.op_records.into_iter().map(|mut record| {
                record.position_bytes += position;
                record
            }));
        result.end = scanned.end;
        let stop =
            scanned.valid_len_bytes < piece_len || scanned.gap.is_some() || scanned.tail != Tail::Clean;
        if let Some(mut gap) = scanned.gap {
            gap.position_bytes += position;
            result.gap = Some(gap);
        }
        result.tail = match scanned.tail {
            Tail::Damaged {
                position_bytes,
                reason,
            } => Tail::Damaged {
                position_bytes: position_bytes + position,
                // The scan names the frontier it was given: the piece's end, not the file's.
                reason: reason.replacen(
                    &format!("durable frontier (byte {piece_len})"),
                    &format!("durable frontier (byte {durable_len})"),
                    1,
                ),
            },
            tail => tail,
        };
        position += scanned.valid_len_bytes;
        if stop {
            break;
        }
    }
    result.valid_len_bytes = position;
    if position == durable_len {
        result.durable_end = Some(result.end);
    }
    Ok(result)
}

/// What an open would find and do, from its plan.
fn inspection_of(plan: &OpenPlan) -> JournalInspection {
    JournalInspection {
        first_op: plan.start.next_op,
        last_op: plan.chain.next_op - 1,
        durable_op: plan.loaded.frontier.chain.next_op - 1,
        next_offset: plan.chain.next_offset,
        bytes_above_frontier: plan.dropped_bytes + plan.above.iter().map(|&(_, len)| len).sum::<u64>(),
        unsynced_ops_kept: plan.unsynced_ops_kept,
        segments_below_start: u32::try_from(plan.below_start.len()).unwrap_or(u32::MAX),
    }
}

/// The name (first op) of the segment a frontier lies in: the one holding its last op
/// (`frontier_next_op - 1`), or the first segment when it covers no op. `names` in order.
fn frontier_segment_name(names: impl Iterator<Item = u64>, start_op: u64, frontier_next_op: u64) -> u64 {
    let last_op = frontier_next_op.saturating_sub(1).max(start_op);
    names
        .take_while(|&first_op| first_op <= last_op)
        .last()
        .unwrap_or(start_op)
}

fn check_config(config: &JournalConfig) -> Result<(), StorageError> {
    if config.segment_size_bytes == 0 || config.segment_size_bytes > u64::from(u32::MAX) {
        return Err(StorageError::Invalid(format!(
            "segment size {} outside 1..={}",
            config.segment_size_bytes,
            u32::MAX
        )));
    }
    Ok(())
}

/// Bounds on what one op may write, checked before a byte is written.
fn check_content(op_payload: &[u8], batches: &[&[u8]]) -> Result<(), StorageError> {
    if op_payload.len() as u64 > u64::from(BATCH_BYTES_MAX) {
        return Err(StorageError::Invalid(format!(
            "op record payload of {} bytes exceeds {BATCH_BYTES_MAX}",
            op_payload.len()
        )));
    }
    if batches.len() > u32::MAX as usize {
        return Err(StorageError::Invalid("too many batches in one op".into()));
    }
    for batch in batches {
        let header = batch::header(batch)
            .ok_or_else(|| StorageError::Invalid("batch shorter than its header".into()))?;
        if header.batch_length != batch.len() as u64 || batch.len() as u64 > u64::from(BATCH_BYTES_MAX) {
            return Err(StorageError::Invalid(format!(
                "batch of {} bytes (header says {}, limit {BATCH_BYTES_MAX})",
                batch.len(),
                header.batch_length
            )));
        }
        if header.message_count == 0 {
            return Err(StorageError::Invalid("batch holds no messages".into()));
        }
    }
    Ok(())
}

/// The frontier at the end of `segment`, with the chain there.
fn frontier_at(segment: &Segment, chain: Chain) -> Frontier {
    debug_assert!(chain.next_op > segment.first_op() || segment.start == chain);
    Frontier {
        segment_base_offset: segment.start.next_offset,
        segment_len_bytes: segment.len_bytes,
        chain,
    }
}

/// A journal's state: its frontier, its offset reservation (the frontier's offset unless a
/// `relaxed` journal reserved ahead) and whether ops above the frontier may be acknowledged.
fn journal_state(frontier: Frontier, offset_reserved: u64, unsynced_acknowledged: bool) -> PartitionState {
    debug_assert!(offset_reserved >= frontier.chain.next_offset);
    PartitionState {
        sequence: 1,
        frontier,
        offset_reserved,
        boot_floor: 0,
        clean_stop: false,
        unsynced_acknowledged,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim_disk::SimDisk;

    /// The open's scan in pieces gives the verdict of one scan of the whole durable prefix
    /// (records, end chain, damage position), whatever the piece size: smaller than a record,
    /// a few records, or the whole segment.
    #[test]
    fn a_scan_in_pieces_is_a_scan_of_the_whole() {
        let disk = Arc::new(SimDisk::new());
        let dir = PathBuf::from("/journal");
        let genesis = Chain::genesis(3);
        let mut journal = JournalLog::create_on(
            disk.clone(),
            &dir,
            3,
            JournalConfig {
                segment_size_bytes: 1 << 20,
                relaxed: false,
            },
            genesis,
        )
        .expect("create");
        for op in 1..=40u64 {
            let payload = vec![op as u8; 50 + (op as usize * 37) % 900];
            journal.write_op(op, 1, 1_000 + op, &payload, &[]).expect("write");
        }
        journal.sync().expect("sync");
        drop(journal);
        let path = dir.join(segment_log_name(1));
        let mut bytes = disk.read_all(&path, u64::MAX).expect("read").expect("segment");
        let len = bytes.len() as u64;
        for damage in [None, Some(bytes.len() / 2), Some(bytes.len() - 3)] {
            if let Some(at) = damage {
                bytes[at] ^= 0x20;
                disk.write_synced(&path, &bytes).expect("damage");
            }
            let whole = record::scan_with(&bytes, genesis, len, OpRule::PerPrepare);
            for chunk in [1, 64, 100, 333, 1_000, 4_096, len, 1 << 24] {
                let pieces = scan_durable(disk.as_ref(), &path, genesis, 0, len, chunk).expect("scan");
                assert_eq!(pieces, whole, "damage {damage:?}, pieces of {chunk} bytes");
            }
            if let Some(at) = damage {
                bytes[at] ^= 0x20;
            }
        }
    }
}
