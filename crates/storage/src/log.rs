//! One partition's log: record-framed batches in segment files, with open-time recovery, a
//! durable frontier and an offset reservation.
//!
//! # Directory layout
//!
//! ```text
//! <dir>/00000000000000000000.log     records (see `record`), base offset 0
//! <dir>/00000000000000000000.index   16-byte entries, one per batch record (see `index`)
//! <dir>/00000000000000001234.log     next segment: base offset 1234 = end of the previous one
//! <dir>/00000000000000001234.index
//! <dir>/state                        frontier + offset reservation (see `state`)
//! <dir>/start.meta                   only after a purge or a retention deletion (atomic file)
//! ```
//!
//! A segment is named by its base offset, 20 zero-padded digits, so names sort in offset
//! order. Only the last segment is written to (the *active* segment); it may be empty (a fresh
//! log, right after a rotation, a gap or a purge), and an empty segment named `N` alone means
//! "no retained messages, the next offset is N". A segment may end with a gap record (see
//! `record`): then the next segment starts at the gap's target instead of the segment's end.
//!
//! `start.meta` (written with [`crate::atomic_file`], 24 bytes of contents: `start_offset u64`,
//! `parent_checksum u64`, `next_op u64`, little-endian) records where the retained log begins
//! after a purge or after [`PartitionLog::delete_oldest_segments`] (retention): every segment
//! below `start_offset` is deleted data (removed at open if a purge or deletion was
//! interrupted), the first retained segment must be named `start_offset`, and its first
//! record must continue the stored chain. Without it the log begins at offset 0 with the
//! genesis chain (parent 0, op 1).
//!
//! # Offsets: the three counters
//!
//! | Name (accessor)                       | Meaning |
//! |---------------------------------------|---------|
//! | append counter ([`PartitionLog::next_offset`]) | the offset the next `append` mints; data below it is written to the OS |
//! | durable frontier ([`PartitionLog::durable_next_offset`]) | data below it is on stable storage and published in `state` |
//! | visible end ([`PartitionLog::visible_next_offset`]) | what polls may see: the frontier in durable modes, the counter in [`SyncMode::Os`] |
//!
//! Invariants: `durable ≤ visible ≤ counter ≤ offset_reserved` (the reservation of `state`).
//! In durable modes a poll never returns data that a crash could take back and re-mint.
//!
//! # Commit (group commit)
//!
//! In [`SyncMode::GroupCommit`] `append` writes a record with no barrier. [`PartitionLog::commit`]
//! then issues one fdatasync of the active `.log` covering every append so far, and publishes
//! the frontier in place (one slot write + fdatasync of `state`); only after it returns `Ok`
//! may the caller acknowledge those appends. Neither path creates, renames or removes a file,
//! nor syncs a directory; that belongs to rotation and open. A failed barrier stops the log:
//! nothing it covered is reported durable, and every later write fails until the log is
//! reopened (durability contract, guarantee 8).
//!
//! # Offset reservation (durability contract, guarantee 2)
//!
//! Before a record whose offsets reach `offset_reserved` is written, `append` raises the
//! reservation durably to the record's end plus [`LogConfig::offset_lease_block_count`]. So no
//! offset at or above the durable ceiling ever exists, in any file or reply. After an unclean
//! stop, minting resumes at `max(recovered end, offset_reserved, boot_floor)`; if that is
//! above the recovered end, a gap record seals the last segment and a new segment starts at
//! it (guarantee 5). Then the log *arms*: it publishes `clean_stop = false`,
//! `boot_floor = next` before accepting writes. [`PartitionLog::close`] (a clean stop) commits,
//! then collapses the reservation to `max(counter, boot_floor, frontier)` with
//! `clean_stop = true`, so a clean restart leaves no gap.
//!
//! # Recovery (open)
//!
//! 1. Read only: list the directory, read `start.meta` and `state` (the valid slot with the
//!    highest sequence; neither valid is damage), read and [`record::scan_from`] every
//!    retained segment in order, checking that segment N+1 starts where segment N's chain ends
//!    (its end offset, or its gap's target) and that its first record continues N's checksum
//!    chain. In the segment holding the frontier, everything below the frontier must verify
//!    and end exactly at the frontier's chain; a frontier beyond the recovered log is damage.
//!    Only the last segment may end in a torn tail (above the frontier); a torn tail anywhere
//!    else, any damage, a missing first segment, an orphan `.index` or an empty segment before
//!    the last refuses the open with [`StorageError::Damaged`] before a single byte is changed.
//! 2. Write: finish an interrupted purge, truncate the last segment's torn tail (and sync it),
//!    rebuild every `.index` that differs from what the verified log implies (staging file,
//!    fsync, rename), remove stale staging files, then sync the directory.
//! 3. Re-stabilize: rewrite the last segment's bytes above the stored frontier and fdatasync
//!    them. After a failed fdatasync the kernel may keep pages that read back fine but were
//!    marked clean and never reach the disk; a bare barrier would bless them.
//! 4. Gap (after an unclean stop, if the reservation is above the recovered end), then arm.
//!
//! Only then does the log accept writes, positioned at the recovered length (a writer never
//! trusts a raw file length).
//!
//! # Appends
//!
//! One record = one positional write of header + batch into the active `.log`, then the index
//! entry (the index may lag; it is rebuilt at open). A segment is sealed (fdatasync'ed) before
//! the next one is created, so a torn write can only ever be at the end of the last segment.

use crate::StorageError;
use crate::atomic_file;
use crate::index::{self, INDEX_ENTRY_SIZE, IndexEntry, SegmentIndex};
use crate::io::{Disk, RealDisk, WriteFile, parent_dir};
use crate::read::{self, CachedReader, PollRead};
pub use crate::read::{ReadOutcome, ReadPart};
use crate::record::{
    self, BATCH_BYTES_MAX, Chain, GAP_BODY_SIZE, RECORD_HEADER_SIZE, RecordHeader, RecordKind, Tail,
};
use crate::state::{self, Frontier, PartitionState, STATE_FILE_NAME, STATE_FILE_SIZE_BYTES, StateFile};
use cairn_wire::batch::{self, BATCH_HEADER_SIZE};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// How appends reach stable storage, and what readers may see.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncMode {
    /// Durable, one barrier per append: `append` commits (fdatasync + frontier) before it
    /// returns. Reads see committed data only (= everything appended).
    EveryAppend,
    /// Durable, group commit (the server's `durable` mode): `append` writes without a barrier;
    /// [`PartitionLog::commit`] makes every append so far durable with one data barrier and
    /// publishes the frontier. Reads see committed data only.
    GroupCommit,
    /// Relaxed: leave it to the OS (and to explicit `commit`/`flush` calls). Reads see data as
    /// soon as it is appended.
    Os,
}

impl SyncMode {
    /// Whether reads are bounded by the durable frontier (and ACKs must wait for `commit`).
    pub fn is_durable(self) -> bool {
        match self {
            SyncMode::EveryAppend | SyncMode::GroupCommit => true,
            SyncMode::Os => false,
        }
    }
}

/// Default of [`LogConfig::offset_lease_block_count`].
pub const OFFSET_LEASE_BLOCK_COUNT_DEFAULT: u64 = 65_536;

/// Writeback pacing granularity (see `PartitionLog::pace_writeback`): each partition starts
/// writing its newest data to the device every 4 MiB and keeps at most about twice that
/// unwritten in the page cache.
pub const WRITEBACK_CHUNK_BYTES: u64 = 4 * 1024 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogConfig {
    /// A segment is closed and a new one started once its `.log` reaches this size.
    /// Must be <= u32::MAX (index positions are u32).
    pub segment_size_bytes: u64,
    pub sync: SyncMode,
    /// How far past the append counter the durable offset reservation is raised when an append
    /// reaches it (one `state` publish per block). Larger blocks mean fewer publishes and a
    /// larger offset gap after an unclean stop.
    /// Default [`OFFSET_LEASE_BLOCK_COUNT_DEFAULT`].
    pub offset_lease_block_count: u64,
}

impl LogConfig {
    /// A configuration with the default offset lease block.
    pub fn new(segment_size_bytes: u64, sync: SyncMode) -> LogConfig {
        LogConfig {
            segment_size_bytes,
            sync,
            offset_lease_block_count: OFFSET_LEASE_BLOCK_COUNT_DEFAULT,
        }
    }
}

/// Summary numbers for replies and stats (visible data only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LogStats {
    pub segments_count: u32,
    pub messages_count: u64,
    pub size_bytes: u64,
}

/// Facts about one segment, for retention (no file is read to produce them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentInfo {
    pub base_offset: u64,
    /// One past its last message (`base_offset` when it holds none).
    pub end_offset: u64,
    /// Messages it holds (offsets are contiguous inside a segment).
    pub messages_count: u64,
    /// Size of its `.log` (records, including a gap record).
    pub size_bytes: u64,
    /// Append timestamp of its newest message (from the index); `None` when it holds none.
    pub newest_timestamp_us: Option<u64>,
}

/// What a [`PartitionLog::commit`] made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommitInfo {
    /// Every message below this offset is on stable storage (the published frontier); every
    /// append that returned before the commit is below it.
    pub durable_next_offset: u64,
    /// fdatasync calls issued: 0 (nothing new), or 2 (the `.log` data, then the `state` slot).
    pub barriers: u32,
}

/// Name of the purge marker (see the module doc).
pub const START_FILE_NAME: &str = "start.meta";
const START_CONTENTS_SIZE: usize = 24;
const INDEX_STAGING_SUFFIX: &str = ".index.tmp";

/// The largest `.log` recovery will read: a record may start at any u32 position and be as
/// large as a batch may be. Anything larger is not a file this engine wrote.
pub const SEGMENT_LOG_BYTES_MAX: u64 = u32::MAX as u64 + RECORD_HEADER_SIZE as u64 + BATCH_BYTES_MAX as u64;

/// `<base, 20 digits>.log`
pub fn segment_log_name(base_offset: u64) -> String {
    format!("{base_offset:020}.log")
}

/// `<base, 20 digits>.index`
pub fn segment_index_name(base_offset: u64) -> String {
    format!("{base_offset:020}.index")
}

/// What a directory entry of a partition log is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryName {
    Log(u64),
    Index(u64),
    /// A `.index` rebuild that did not reach its rename.
    IndexStaging(u64),
    Start,
    /// A `start.meta` write that did not reach its rename.
    StartStaging,
    /// The partition state file.
    State,
    Other,
}

/// Classify a directory entry name (pure).
pub fn parse_entry_name(name: &str) -> EntryName {
    if name == START_FILE_NAME {
        return EntryName::Start;
    }
    if name == STATE_FILE_NAME {
        return EntryName::State;
    }
    if name.strip_suffix(".tmp") == Some(START_FILE_NAME) {
        return EntryName::StartStaging;
    }
    let base = |stem: &str| -> Option<u64> {
        (stem.len() == 20 && stem.bytes().all(|b| b.is_ascii_digit()))
            .then(|| stem.parse().ok())
            .flatten()
    };
    let classified = if let Some(stem) = name.strip_suffix(INDEX_STAGING_SUFFIX) {
        base(stem).map(EntryName::IndexStaging)
    } else if let Some(stem) = name.strip_suffix(".index") {
        base(stem).map(EntryName::Index)
    } else if let Some(stem) = name.strip_suffix(".log") {
        base(stem).map(EntryName::Log)
    } else {
        None
    };
    classified.unwrap_or(EntryName::Other)
}

/// Whether a record of `record_size_bytes` holding `record_messages` must go into a new segment
/// (pure). An empty segment takes any record, so a batch larger than a segment is stored alone.
/// Otherwise rotate when the segment would outgrow `segment_size_bytes_max`, or when the
/// record's offset delta would not fit the index's u32.
pub fn rotation_needed(
    segment_size_bytes: u64,
    segment_messages_count: u64,
    record_size_bytes: u64,
    segment_size_bytes_max: u64,
) -> bool {
    if segment_size_bytes == 0 {
        return false;
    }
    segment_size_bytes + record_size_bytes > segment_size_bytes_max
        || segment_messages_count > u64::from(u32::MAX)
}

/// One segment's in-memory state. (Crate-visible so that `check` can report a recovery plan.)
#[derive(Debug)]
pub(crate) struct Segment {
    pub(crate) base_offset: u64,
    /// Invariant: `end_offset = base_offset + Σ message_count` of its batch records.
    pub(crate) end_offset: u64,
    /// Invariant: the recovered/written length of the `.log`; every byte below it verified.
    pub(crate) size_bytes: u64,
    /// Invariant: one entry per batch record, in order.
    pub(crate) index: SegmentIndex,
    /// The gap record sealing this segment, if any. Invariant: only a non-active segment has
    /// one, and it is the last record (`position_bytes + size = size_bytes`).
    pub(crate) gap: Option<SegmentGap>,
    /// The chain its first record continues (`start_chain.next_offset == base_offset`): what
    /// `start.meta` must hold when this segment becomes the first retained one.
    pub(crate) start_chain: Chain,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct SegmentGap {
    pub(crate) position_bytes: u64,
    /// The next segment's base offset.
    pub(crate) next_offset: u64,
}

impl Segment {
    fn empty(start_chain: Chain) -> Segment {
        Segment {
            base_offset: start_chain.next_offset,
            end_offset: start_chain.next_offset,
            size_bytes: 0,
            index: SegmentIndex::default(),
            gap: None,
            start_chain,
        }
    }

    fn info(&self) -> SegmentInfo {
        SegmentInfo {
            base_offset: self.base_offset,
            end_offset: self.end_offset,
            messages_count: self.end_offset - self.base_offset,
            size_bytes: self.size_bytes,
            newest_timestamp_us: self.index.entries().last().map(|entry| entry.timestamp_us),
        }
    }

    /// End of the last batch record (where a gap record, if any, starts).
    fn batches_end_bytes(&self) -> u64 {
        self.gap.map_or(self.size_bytes, |gap| gap.position_bytes)
    }

    /// Base offset of the segment that follows this one.
    fn next_base_offset(&self) -> u64 {
        self.gap.map_or(self.end_offset, |gap| gap.next_offset)
    }
}

/// Write handles of the active segment.
#[derive(Debug)]
struct ActiveFiles {
    log: Box<dyn WriteFile>,
    index: Box<dyn WriteFile>,
    /// False after an index write failed: later entries are not written (the file would have
    /// a hole); the index is rebuilt from the log at the next open.
    index_writable: bool,
    /// Invariant: `≤` the active segment's `size_bytes`; bytes below it were covered by a
    /// successful fdatasync of `log`.
    synced_len_bytes: u64,
    /// Writeback pacing ([`WRITEBACK_CHUNK_BYTES`]): writeback of `log` was started for the
    /// bytes below this mark, and waited for below `writeback_waited_bytes`. Hints only: they
    /// imply nothing about durability (only `synced_len_bytes` does).
    writeback_started_bytes: u64,
    writeback_waited_bytes: u64,
}

#[derive(Debug)]
pub struct PartitionLog {
    disk: Arc<dyn Disk>,
    dir: PathBuf,
    partition_id: u32,
    config: LogConfig,
    /// Invariants: non-empty; `segments[i + 1].base_offset == segments[i].next_base_offset()`;
    /// every segment but the last holds at least one record (batch or gap); only the last one
    /// is written (the active segment) and it has no gap.
    segments: Vec<Segment>,
    active: ActiveFiles,
    /// The append counter. Invariants: `chain.next_offset == segments.last().end_offset`;
    /// `chain.partition_id == partition_id`; `chain.parent_checksum` = checksum of the last
    /// record written.
    chain: Chain,
    /// The last state durably published. Invariants (while not stopped):
    /// `state.frontier.next_offset() ≤ chain.next_offset ≤ state.offset_reserved`;
    /// `state.boot_floor ≤ chain.next_offset`; the frontier lies in a retained segment, at a
    /// record boundary below which everything was covered by a successful barrier;
    /// `state.clean_stop == false`.
    state: StateFile,
    /// Invariant: >= every stored record's timestamp (append timestamps are clamped to it so
    /// that timestamp lookups can binary-search).
    last_timestamp_us: u64,
    /// Set when a write failed in a way that leaves the on-disk state unknown (a failed barrier):
    /// every later write is refused until the log is reopened.
    stopped: Option<String>,
    /// The read handle of the segment polls read last (see [`PartitionLog::read_into`]).
    /// Dropped when segments are deleted, so a deleted file's space is not held.
    read_cache: Mutex<Option<CachedReader>>,
}

impl PartitionLog {
    /// Create a new, empty partition log in `dir` (created if missing; must be empty).
    pub fn create(dir: &Path, partition_id: u32, config: LogConfig) -> Result<PartitionLog, StorageError> {
        PartitionLog::create_on(Arc::new(RealDisk), dir, partition_id, config)
    }

    /// Open an existing log: recover (truncate a torn tail, rebuild a missing or torn index,
    /// skip to the offset reservation after an unclean stop), or fail with `Damaged` leaving
    /// files untouched.
    pub fn open(dir: &Path, partition_id: u32, config: LogConfig) -> Result<PartitionLog, StorageError> {
        PartitionLog::open_on(Arc::new(RealDisk), dir, partition_id, config)
    }

    /// [`PartitionLog::create`] on a given disk.
    pub fn create_on(
        disk: Arc<dyn Disk>,
        dir: &Path,
        partition_id: u32,
        config: LogConfig,
    ) -> Result<PartitionLog, StorageError> {
        validate_config(&config)?;
        disk.create_dir_all(dir)?;
        for name in disk.list_dir(dir)? {
            if parse_entry_name(&name) != EntryName::Other {
                return Err(StorageError::Invalid(format!(
                    "{} already holds partition log files ({name})",
                    dir.display()
                )));
            }
        }
        // Segment first, state second: a directory holding a state file always holds the
        // segment files that state describes (creation order = durable order for a journaled
        // directory).
        let active = create_segment_files(disk.as_ref(), dir, 0)?;
        let state = StateFile::create(
            disk.as_ref(),
            &dir.join(STATE_FILE_NAME),
            PartitionState::initial(partition_id),
        )?;
        disk.sync_dir(dir)?;
        // The partition directory itself may be new: make its entry durable too.
        disk.sync_dir(parent_dir(dir))?;
        let log = PartitionLog {
            disk,
            dir: dir.to_path_buf(),
            partition_id,
            config,
            segments: vec![Segment::empty(Chain::genesis(partition_id))],
            active,
            chain: Chain::genesis(partition_id),
            state,
            last_timestamp_us: 0,
            stopped: None,
            read_cache: Mutex::new(None),
        };
        log.assert_invariants();
        Ok(log)
    }

    /// [`PartitionLog::open`] on a given disk.
    pub fn open_on(
        disk: Arc<dyn Disk>,
        dir: &Path,
        partition_id: u32,
        config: LogConfig,
    ) -> Result<PartitionLog, StorageError> {
        validate_config(&config)?;
        let plan = plan_recovery(disk.as_ref(), dir, partition_id)?;
        apply_recovery(disk.as_ref(), dir, &plan)?;
        let active_base = plan
            .segments
            .last()
            .map(|segment| segment.base_offset)
            .expect("recovery yields at least one segment");
        let mut active = ActiveFiles {
            log: disk.open_write(&dir.join(segment_log_name(active_base)))?,
            index: disk.open_write(&dir.join(segment_index_name(active_base)))?,
            index_writable: true,
            synced_len_bytes: 0,
            writeback_started_bytes: 0,
            writeback_waited_bytes: 0,
        };
        let last_timestamp_us = plan
            .segments
            .iter()
            .rev()
            .find_map(|segment| segment.index.entries().last())
            .map_or(0, |entry| entry.timestamp_us);
        let loaded = plan.state;
        let state = StateFile::open(disk.as_ref(), &dir.join(STATE_FILE_NAME), loaded)?;

        // Re-stabilize what lies above the stored frontier in the active segment: rewrite it,
        // then one barrier (see the module doc, recovery step 3).
        let active_segment = plan
            .segments
            .last()
            .expect("recovery yields at least one segment");
        let unsynced_from_bytes = if loaded.frontier.segment_base_offset == active_base {
            loaded.frontier.segment_len_bytes.min(active_segment.size_bytes)
        } else {
            0
        };
        rewrite_range(
            disk.as_ref(),
            dir,
            active.log.as_mut(),
            active_base,
            unsynced_from_bytes,
            active_segment.size_bytes,
        )?;
        active.log.sync_data()?;
        active.synced_len_bytes = active_segment.size_bytes;

        let mut log = PartitionLog {
            disk,
            dir: dir.to_path_buf(),
            partition_id,
            config,
            segments: plan.segments,
            active,
            chain: plan.chain,
            state,
            last_timestamp_us,
            stopped: None,
            read_cache: Mutex::new(None),
        };
        let recovered_end_offset = log.chain.next_offset;
        let next_offset = next_offset_after_open(recovered_end_offset, &loaded);
        if !loaded.clean_stop {
            tracing::info!(
                dir = %log.dir.display(),
                recovered_end_offset,
                offset_reserved = loaded.offset_reserved,
                boot_floor = loaded.boot_floor,
                next_offset,
                "partition log was not stopped cleanly; minting resumes at the reservation"
            );
        }
        if next_offset > recovered_end_offset {
            log.seal_with_gap(next_offset)?;
        }
        debug_assert_eq!(log.chain.next_offset, next_offset);
        log.arm()?;
        log.assert_invariants();
        Ok(log)
    }

    /// Append one validated client batch (256-byte header + frames): assigns the next
    /// offsets, stamps partition id, base offset and `timestamp_us` into a copy of the batch
    /// header (recomputing the batch checksum via `cairn_wire::batch::stamped_header`), writes
    /// record header, stamped batch header and the frames as given with one vectored write,
    /// rotates the segment when full. `batch` itself is not modified. Returns the base offset.
    ///
    /// Durability per [`SyncMode`]: in `GroupCommit` the record is written with no barrier and
    /// is neither durable nor visible to reads until [`PartitionLog::commit`] returns `Ok`; in
    /// `EveryAppend` it is committed before `append` returns; in `Os` it is visible at once.
    /// If the record's offsets reach the durable offset reservation, the reservation is raised
    /// (one `state` publish) before the record is written.
    ///
    /// `timestamp_us` is raised to the last stored timestamp if it is lower, so timestamps
    /// never go backwards within a partition (a clock step back must not break lookups).
    pub fn append(&mut self, batch: &[u8], timestamp_us: u64) -> Result<u64, StorageError> {
        self.check_not_stopped()?;
        let batch_header = batch::header(batch)
            .ok_or_else(|| StorageError::Invalid("batch shorter than its header".into()))?;
        if batch_header.batch_length != batch.len() as u64 {
            return Err(StorageError::Invalid(format!(
                "batch_length {} differs from the {} bytes given",
                batch_header.batch_length,
                batch.len()
            )));
        }
        if batch.len() as u64 > u64::from(BATCH_BYTES_MAX) {
            return Err(StorageError::Invalid(format!(
                "batch of {} bytes exceeds the storage limit of {BATCH_BYTES_MAX}",
                batch.len()
            )));
        }
        let message_count = batch_header.message_count;
        if message_count == 0 {
            return Err(StorageError::Invalid("batch holds no messages".into()));
        }
        let Some(end_offset) = self.chain.next_offset.checked_add(u64::from(message_count)) else {
            return Err(StorageError::Invalid("offsets exhausted".into()));
        };
        let timestamp_us = timestamp_us.max(self.last_timestamp_us);
        let record_size_bytes = RECORD_HEADER_SIZE as u64 + batch.len() as u64;

        let active = self.active_segment();
        if rotation_needed(
            active.size_bytes,
            active.end_offset - active.base_offset,
            record_size_bytes,
            self.config.segment_size_bytes,
        ) {
            self.rotate()?;
        }
        // Offsets in [next_offset, end_offset) are about to exist in a file: the durable
        // ceiling must lie above them first (guarantee 2).
        if end_offset > self.state.current().offset_reserved {
            self.raise_reservation(end_offset)?;
        }

        let base_offset = self.chain.next_offset;
        // The client's frames go to disk as received; only the 256-byte batch header is
        // stamped, in a copy (no copy of the whole batch on the write path).
        let stamped_head =
            batch::stamped_header(batch, u64::from(self.partition_id), base_offset, timestamp_us)
                .ok_or_else(|| StorageError::Invalid("batch shorter than its header".into()))?;
        let frames = batch
            .get(BATCH_HEADER_SIZE..)
            .ok_or_else(|| StorageError::Invalid("batch shorter than its header".into()))?;
        let mut header = RecordHeader {
            kind: RecordKind::Batch,
            checksum: 0,
            parent_checksum: self.chain.parent_checksum,
            op: self.chain.next_op,
            view: 0,
            partition_id: self.partition_id,
            base_offset,
            message_count,
            batch_length_bytes: batch.len() as u32,
            timestamp_us,
        };
        let header_bytes = header.seal_parts(&[&stamped_head, frames]);
        #[cfg(debug_assertions)]
        {
            let record_bytes = [&header_bytes[..], &stamped_head, frames].concat();
            debug_assert_eq!(record::verify(&record_bytes, &self.chain), Ok(header));
        }

        let segment = self.segments.last().expect("invariant: at least one segment");
        let position_bytes = segment.size_bytes;
        let entry = IndexEntry {
            offset_delta: u32::try_from(base_offset - segment.base_offset)
                .expect("rotation keeps offset deltas within u32"),
            position_bytes: u32::try_from(position_bytes).expect("rotation keeps positions within u32"),
            timestamp_us,
        };
        let index_position_bytes = (segment.index.len() * INDEX_ENTRY_SIZE) as u64;

        if let Err(error) = self
            .active
            .log
            .write_all_vectored_at(position_bytes, &[&header_bytes[..], &stamped_head[..], frames])
        {
            // Cut a partial write back, so the file again ends at the last whole record and a
            // retry (e.g. once disk space returns) starts clean.
            if let Err(cut_error) = self.active.log.set_len(position_bytes) {
                self.stop(format!("cannot cut back a failed write: {cut_error}"));
            }
            return Err(error);
        }
        if self.active.index_writable
            && let Err(error) = self
                .active
                .index
                .write_all_at(index_position_bytes, &entry.encode())
        {
            tracing::warn!(dir = %self.dir.display(), %error, "index write failed; it will be rebuilt at open");
            self.active.index_writable = false;
        }
        // A failed wait stops the log: nothing of this record counts as appended.
        self.pace_writeback(position_bytes + record_size_bytes)?;
        if self.config.sync == SyncMode::EveryAppend
            && let Err(error) = self.active.log.sync_data()
        {
            // Nothing the failed barrier covered counts as appended.
            self.stop(format!("fdatasync failed: {error}"));
            return Err(error);
        }

        let segment = self.segments.last_mut().expect("invariant: at least one segment");
        segment.index.push(entry);
        segment.size_bytes += record_size_bytes;
        segment.end_offset = end_offset;
        self.chain = self.chain.advance(&header);
        self.last_timestamp_us = timestamp_us;
        debug_assert_eq!(self.chain.next_offset, segment.end_offset);
        if self.config.sync == SyncMode::EveryAppend {
            self.active.synced_len_bytes = segment.size_bytes;
            self.commit()?;
        }
        // O(1) checks only on the append path (the full check is O(records)).
        debug_assert!(self.chain.next_offset <= self.state.current().offset_reserved);
        debug_assert!(self.state.current().frontier.next_offset() <= self.chain.next_offset);
        Ok(base_offset)
    }

    /// Make every append so far durable and visible: one fdatasync of the active `.log` (earlier
    /// segments were sealed by rotation), then publish the frontier in place (one slot write +
    /// fdatasync of `state`). No file is created, renamed or removed and no directory synced.
    ///
    /// Only after `Ok` may the caller acknowledge the appends made before the call. On `Err`
    /// nothing new is durable as far as the caller may assume, the log is stopped (every later
    /// write fails; reopen to recover) and the barrier is never retried on the same descriptor.
    pub fn commit(&mut self) -> Result<CommitInfo, StorageError> {
        self.check_not_stopped()?;
        let frontier_before = self.state.current().frontier;
        if frontier_before.chain == self.chain {
            return Ok(CommitInfo {
                durable_next_offset: frontier_before.next_offset(),
                barriers: 0,
            });
        }
        let active_size_bytes = self.active_segment().size_bytes;
        let mut barriers = 0u32;
        if self.active.synced_len_bytes < active_size_bytes {
            barriers += 1;
            if let Err(error) = self.active.log.sync_data() {
                self.stop(format!("fdatasync failed: {error}"));
                return Err(error);
            }
            self.active.synced_len_bytes = active_size_bytes;
        }
        let frontier = Frontier {
            segment_base_offset: self.active_segment().base_offset,
            segment_len_bytes: active_size_bytes,
            chain: self.chain,
        };
        barriers += 1;
        self.publish(PartitionState {
            frontier,
            ..*self.state.current()
        })?;
        debug_assert_eq!(self.durable_next_offset(), self.chain.next_offset);
        debug_assert!(self.active.synced_len_bytes == self.active_segment().size_bytes);
        Ok(CommitInfo {
            durable_next_offset: frontier.next_offset(),
            barriers,
        })
    }

    /// [`PartitionLog::commit`], discarding what it reports.
    pub fn flush(&mut self) -> Result<(), StorageError> {
        self.commit().map(|_| ())
    }

    /// Stop cleanly: a final commit, then collapse the offset reservation to the highest of
    /// the append counter, the armed boot floor and the stored frontier, marked
    /// `clean_stop = true`. A log reopened after `close` continues at exactly its counter (no
    /// gap). On `Err` the stop counts as unclean (the next open skips to the reservation).
    pub fn close(mut self) -> Result<(), StorageError> {
        self.commit()?;
        let current = *self.state.current();
        let ceiling = self
            .chain
            .next_offset
            .max(current.boot_floor)
            .max(current.frontier.next_offset());
        debug_assert_eq!(current.frontier.chain, self.chain);
        debug_assert!(ceiling <= current.offset_reserved);
        self.publish(PartitionState {
            offset_reserved: ceiling,
            clean_stop: true,
            ..current
        })
    }

    /// Append to `out` the client-format batches holding messages with offset >= `from_offset`
    /// and below [`PartitionLog::visible_next_offset`], at most `max_messages` in all. Returns
    /// the number of messages appended. See [`PartitionLog::read_into`].
    pub fn read(&self, from_offset: u64, max_messages: u32, out: &mut Vec<u8>) -> Result<u32, StorageError> {
        self.read_into(from_offset, max_messages, out)
            .map(|outcome| outcome.messages_count)
    }

    /// Append to `out` the client-format batches holding messages with offset >= `from_offset`
    /// and below [`PartitionLog::visible_next_offset`], at most `max_messages` in all: whole
    /// stored batches as stored, a partial first or last batch cut to the messages taken
    /// (`cairn_wire::batch::plan_take`).
    ///
    /// Each record read is verified again (checksum, offset, partition); a mismatch is
    /// `Damaged`.
    ///
    /// Records are read straight into `out` with no copy: a record's 64-byte header lands on
    /// the last 64 bytes already in `out` (saved and put back after verification), so the batch
    /// behind it ends up in place. Give `out` at least `RECORD_HEADER_SIZE` bytes of prefix (a
    /// reply's headers) to get that; with less, the first record goes through a scratch buffer.
    /// On `Err`, `out` holds its original bytes and possibly some of the batches.
    pub fn read_into(
        &self,
        from_offset: u64,
        max_messages: u32,
        out: &mut Vec<u8>,
    ) -> Result<ReadOutcome, StorageError> {
        self.read_impl(from_offset, max_messages, out, None)
    }

    /// [`PartitionLog::read_into`] for a sender that can send file bytes directly: the batches
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
        out: &mut Vec<u8>,
        parts: &mut Vec<ReadPart>,
    ) -> Result<ReadOutcome, StorageError> {
        self.read_impl(from_offset, max_messages, out, Some(parts))
    }

    fn read_impl(
        &self,
        from_offset: u64,
        max_messages: u32,
        out: &mut Vec<u8>,
        parts: Option<&mut Vec<ReadPart>>,
    ) -> Result<ReadOutcome, StorageError> {
        let visible_end_offset = self.visible_next_offset();
        let start_offset = from_offset.max(self.first_offset().unwrap_or(visible_end_offset));
        if start_offset >= visible_end_offset {
            return Ok(ReadOutcome::NOTHING);
        }
        PollRead::run(
            self.partition_id,
            start_offset,
            max_messages,
            out,
            parts,
            |read| self.walk_records(read, visible_end_offset),
        )
    }

    /// Hand every batch record holding messages from the poll's start offset up to
    /// `visible_end_offset` to `read`, until it takes no more.
    fn walk_records(&self, read: &mut PollRead<'_>, visible_end_offset: u64) -> Result<(), StorageError> {
        let start_offset = read.start_offset();
        let first_segment = self
            .segments
            .partition_point(|segment| segment.base_offset <= start_offset)
            .saturating_sub(1);
        let mut cache = self
            .read_cache
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        for segment in &self.segments[first_segment..] {
            if read.remaining() == 0 || segment.base_offset >= visible_end_offset {
                break;
            }
            let Some(first_entry) = segment
                .index
                .find_offset(start_offset.saturating_sub(segment.base_offset))
            else {
                continue;
            };
            let path = self.dir.join(segment_log_name(segment.base_offset));
            let file = read::cached_file(&mut cache, self.disk.as_ref(), &path, segment.base_offset)?;
            let entries = segment.index.entries();
            for (entry_index, entry) in entries.iter().enumerate().skip(first_entry) {
                let expected_offset = segment.base_offset + u64::from(entry.offset_delta);
                // The frontier lies on a record boundary: a record is visible as a whole.
                if expected_offset >= visible_end_offset {
                    return Ok(());
                }
                let position_bytes = u64::from(entry.position_bytes);
                let end_bytes = entries
                    .get(entry_index + 1)
                    .map_or(segment.batches_end_bytes(), |next| u64::from(next.position_bytes));
                debug_assert!(end_bytes > position_bytes);
                let record_len = usize::try_from(end_bytes - position_bytes)
                    .map_err(|_| StorageError::Invalid("record larger than memory".into()))?;
                read.take_record(&path, file, position_bytes, record_len, expected_offset)?;
                if read.remaining() == 0 {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// The offset of the first visible message whose append timestamp >= `timestamp_us`, if
    /// any.
    pub fn offset_at_timestamp(&self, timestamp_us: u64) -> Result<Option<u64>, StorageError> {
        let visible_end_offset = self.visible_next_offset();
        // Timestamps are non-decreasing across the whole log, so the first segment whose last
        // record reaches `timestamp_us` holds the answer.
        for segment in &self.segments {
            let Some(last) = segment.index.entries().last() else {
                continue;
            };
            if last.timestamp_us < timestamp_us {
                continue;
            }
            let found = segment.index.find_timestamp(timestamp_us).map(|entry_index| {
                segment.base_offset + u64::from(segment.index.entries()[entry_index].offset_delta)
            });
            debug_assert!(found.is_some());
            return Ok(found.filter(|&offset| offset < visible_end_offset));
        }
        Ok(None)
    }

    /// The oldest retained offset, or None if no message is retained. (May be at or above
    /// [`PartitionLog::visible_next_offset`] in durable modes before the first commit.)
    pub fn first_offset(&self) -> Option<u64> {
        self.segments
            .iter()
            .find(|segment| !segment.index.is_empty())
            .map(|segment| segment.base_offset)
    }

    /// The offset of the newest message polls may see, or None if none is visible. Below
    /// [`PartitionLog::visible_next_offset`] by more than one when a gap (an unclean stop's
    /// skipped reservation) follows the last message: gap offsets hold no message.
    pub fn last_offset(&self) -> Option<u64> {
        let visible_end_offset = self.visible_next_offset();
        self.segments.iter().rev().find_map(|segment| {
            let end_offset = segment.end_offset.min(visible_end_offset);
            (!segment.index.is_empty() && end_offset > segment.base_offset).then(|| end_offset - 1)
        })
    }

    /// The append counter: the offset the next appended message will get. Not a bound for
    /// polls in durable modes; use [`PartitionLog::visible_next_offset`] for those.
    pub fn next_offset(&self) -> u64 {
        self.chain.next_offset
    }

    /// The end of what polls may see (the `current_offset` of replies is this minus one): the
    /// durable frontier in durable modes, the append counter in [`SyncMode::Os`].
    pub fn visible_next_offset(&self) -> u64 {
        if self.config.sync.is_durable() {
            self.durable_next_offset()
        } else {
            self.chain.next_offset
        }
    }

    /// The published durable frontier: every message below it is on stable storage.
    pub fn durable_next_offset(&self) -> u64 {
        self.state.current().frontier.next_offset()
    }

    /// The durable offset reservation: no offset at or above it has been minted.
    pub fn offset_reserved(&self) -> u64 {
        self.state.current().offset_reserved
    }

    /// Segment count and the size of every `.log`, and the count of visible messages.
    pub fn stats(&self) -> LogStats {
        let visible_end_offset = self.visible_next_offset();
        LogStats {
            segments_count: u32::try_from(self.segments.len()).unwrap_or(u32::MAX),
            messages_count: self
                .segments
                .iter()
                .map(|segment| {
                    segment
                        .end_offset
                        .min(visible_end_offset)
                        .saturating_sub(segment.base_offset)
                })
                .sum(),
            size_bytes: self.segments.iter().map(|segment| segment.size_bytes).sum(),
        }
    }

    /// Delete every segment; offsets keep counting from `next_offset` (a purge never re-issues
    /// an offset).
    ///
    /// Order: first `start.meta` durably says "everything below next_offset is purged", then
    /// the new empty segment is created, then the old segments are deleted, then the frontier
    /// moves to the new segment. A crash anywhere is finished by the next open, and purged data
    /// never comes back.
    pub fn purge(&mut self) -> Result<(), StorageError> {
        self.check_not_stopped()?;
        let start = self.chain;
        atomic_file::write_on(
            self.disk.as_ref(),
            &self.dir.join(START_FILE_NAME),
            &encode_start(&start),
        )?;
        // From here the disk says "purged"; any failure leaves memory behind the disk, so stop
        // and let a reopen finish the purge.
        if let Err(error) = self.purge_after_marker(start) {
            self.stop(format!("purge interrupted: {error}"));
            return Err(error);
        }
        self.publish(PartitionState {
            frontier: Frontier {
                segment_base_offset: start.next_offset,
                segment_len_bytes: 0,
                chain: start,
            },
            ..*self.state.current()
        })?;
        debug_assert!(self.check_invariants());
        Ok(())
    }

    fn purge_after_marker(&mut self, start: Chain) -> Result<(), StorageError> {
        let active = self.active_segment();
        let reuse_active = active.base_offset == start.next_offset && active.size_bytes == 0;
        if !reuse_active {
            let mut active = create_segment_files(self.disk.as_ref(), &self.dir, start.next_offset)?;
            self.disk.sync_dir(&self.dir)?;
            active.synced_len_bytes = 0;
            self.active = active;
            self.segments.push(Segment::empty(start));
        }
        *self
            .read_cache
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = None;
        let purged: Vec<u64> = self
            .segments
            .iter()
            .map(|segment| segment.base_offset)
            .filter(|&base| base < start.next_offset)
            .collect();
        for base in purged {
            remove_segment_files(self.disk.as_ref(), &self.dir, base)?;
        }
        self.disk.sync_dir(&self.dir)?;
        self.segments
            .retain(|segment| segment.base_offset >= start.next_offset);
        debug_assert_eq!(self.segments.len(), 1);
        Ok(())
    }

    /// The sealed segments (every segment but the active one), oldest first.
    pub fn sealed_segments(&self) -> Vec<SegmentInfo> {
        let sealed = self.segments.len() - 1;
        self.segments[..sealed].iter().map(Segment::info).collect()
    }

    /// The oldest sealed segment, if any (O(1), for retention's repeated checks).
    pub fn oldest_sealed_segment(&self) -> Option<SegmentInfo> {
        (self.segments.len() > 1).then(|| self.segments[0].info())
    }

    /// Where the retained log starts: the base offset of the first retained segment (0, or
    /// the point of the last purge or retention deletion). Every offset below it is gone.
    pub fn start_offset(&self) -> u64 {
        self.segments[0].base_offset
    }

    /// Delete the oldest `count` sealed segments (fewer if fewer are sealed); the active
    /// segment is never deleted. Returns the deleted segments, oldest first.
    ///
    /// Crash-safe in the same order as a purge: first `start.meta` durably names the first
    /// retained segment and the chain its first record continues (exactly what open
    /// verifies), then the files go (index first), then the directory is synced. From the
    /// marker on, the deleted segments are gone for readers too; a crash before the files are
    /// removed is finished by the next open (it deletes every segment below `start.meta`).
    ///
    /// The segment holding the published frontier is kept; if it would be deleted the log
    /// commits first, which moves the frontier to the active segment.
    ///
    /// On `Err` nothing was deleted from the log in memory; if the error came from the marker's
    /// directory sync, the marker may still have reached the disk, and the next open then
    /// removes the segments (deleting what was asked for, nothing more).
    pub fn delete_oldest_segments(&mut self, count: usize) -> Result<Vec<SegmentInfo>, StorageError> {
        self.check_not_stopped()?;
        let sealed = self.segments.len() - 1;
        let mut delete = count.min(sealed);
        if delete == 0 {
            return Ok(Vec::new());
        }
        if self.frontier_segment_position() < delete {
            self.commit()?;
            // After a commit the frontier lies at the end of the log: in the active segment,
            // unless the active segment is empty and nothing was appended since.
            delete = delete.min(self.frontier_segment_position());
            if delete == 0 {
                return Ok(Vec::new());
            }
        }
        let start = self.segments[delete].start_chain;
        debug_assert_eq!(start.next_offset, self.segments[delete - 1].next_base_offset());
        atomic_file::write_on(
            self.disk.as_ref(),
            &self.dir.join(START_FILE_NAME),
            &encode_start(&start),
        )?;
        // From here the disk says the segments are gone: memory follows at once, whatever
        // happens to the file removals below (the next open finishes them).
        *self
            .read_cache
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = None;
        let deleted: Vec<SegmentInfo> = self
            .segments
            .drain(..delete)
            .map(|segment| segment.info())
            .collect();
        let mut removal_error = None;
        for info in &deleted {
            if let Err(error) = remove_segment_files(self.disk.as_ref(), &self.dir, info.base_offset) {
                removal_error = Some(error);
                break;
            }
        }
        if removal_error.is_none()
            && let Err(error) = self.disk.sync_dir(&self.dir)
        {
            removal_error = Some(error);
        }
        if let Some(error) = removal_error {
            tracing::warn!(
                dir = %self.dir.display(),
                %error,
                start_offset = start.next_offset,
                "segments below the retained start could not all be removed now; they are no longer \
                 part of the log and the next open removes what is left"
            );
        }
        debug_assert!(self.check_invariants());
        Ok(deleted)
    }

    /// Position in `segments` of the segment the published frontier lies in.
    fn frontier_segment_position(&self) -> usize {
        let base = self.state.current().frontier.segment_base_offset;
        let position = self
            .segments
            .iter()
            .position(|segment| segment.base_offset == base);
        debug_assert!(
            position.is_some(),
            "invariant: the frontier lies in a retained segment"
        );
        position.unwrap_or(0)
    }

    /// The directory holding this log.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn partition_id(&self) -> u32 {
        self.partition_id
    }

    pub fn config(&self) -> &LogConfig {
        &self.config
    }

    /// Why the log refuses writes, if it does (after a failed barrier; reopen to recover).
    pub fn stopped_reason(&self) -> Option<&str> {
        self.stopped.as_deref()
    }

    /// O(segments + records): every invariant of the in-memory state. For asserts and tests.
    pub fn check_invariants(&self) -> bool {
        let Some(last) = self.segments.last() else {
            return false;
        };
        let segments_ok = self.segments.windows(2).all(|pair| {
            pair[1].base_offset == pair[0].next_base_offset()
                && (!pair[0].index.is_empty() || pair[0].gap.is_some())
                && pair[0].size_bytes > 0
        });
        let each_ok = self.segments.iter().all(|segment| {
            segment.start_chain.next_offset == segment.base_offset
                && segment.start_chain.partition_id == self.partition_id
                && segment.index.check_invariants()
                && segment.index.is_empty() == (segment.batches_end_bytes() == 0)
                && segment.index.is_empty() == (segment.end_offset == segment.base_offset)
                && segment.end_offset >= segment.base_offset
                && segment.batches_end_bytes() <= segment.size_bytes
                && segment.gap.is_none_or(|gap| gap.next_offset > segment.end_offset)
        });
        let state = self.state.current();
        let counters_ok = state.frontier.next_offset() <= self.chain.next_offset
            && self.chain.next_offset <= state.offset_reserved
            && state.boot_floor <= self.chain.next_offset
            && !state.clean_stop
            && self
                .segments
                .iter()
                .any(|segment| segment.base_offset == state.frontier.segment_base_offset)
            && self.active.synced_len_bytes <= last.size_bytes;
        segments_ok
            && each_ok
            && counters_ok
            && last.gap.is_none()
            && self.chain.next_offset == last.end_offset
            && self.chain.partition_id == self.partition_id
            && self.chain.next_op >= 1
    }

    fn assert_invariants(&self) {
        if !self.check_invariants() {
            // Creation and recovery only build verified state; failing here is a bug, not bad
            // data.
            panic!(
                "partition log {} violates its invariants: {:?}",
                self.dir.display(),
                self.state.current()
            );
        }
    }

    /// Writeback pacing: once [`WRITEBACK_CHUNK_BYTES`] of the active `.log` are written
    /// but not yet handed to the device, start their writeback now (no waiting), then wait
    /// for the writeback started one chunk earlier. So the page cache holds at most about two
    /// chunks of this partition's unwritten data, the device works steadily instead of in
    /// bursts, a barrier finds little left to write (short, predictable `commit`s; in
    /// relaxed mode the periodic barrier no longer stalls appends behind hundreds of MB),
    /// and the kernel's dirty-page throttling never has to step in.
    ///
    /// Durability is still decided by `commit` alone. A failed wait is a failed write of data
    /// the OS held (and Linux reports it only once per open file, so the next fdatasync might
    /// not): it stops the log exactly like a failed barrier.
    fn pace_writeback(&mut self, written_bytes: u64) -> Result<(), StorageError> {
        let started_bytes = self
            .active
            .writeback_started_bytes
            .max(self.active.synced_len_bytes);
        if written_bytes < started_bytes.saturating_add(WRITEBACK_CHUNK_BYTES) {
            return Ok(());
        }
        let waited_bytes = self
            .active
            .writeback_waited_bytes
            .max(self.active.synced_len_bytes);
        let paced = self
            .active
            .log
            .start_writeback(started_bytes, written_bytes - started_bytes)
            .and_then(|()| {
                if started_bytes > waited_bytes {
                    self.active
                        .log
                        .wait_writeback(waited_bytes, started_bytes - waited_bytes)
                } else {
                    Ok(())
                }
            });
        if let Err(error) = paced {
            self.stop(format!("writeback failed: {error}"));
            return Err(error);
        }
        self.active.writeback_waited_bytes = started_bytes;
        self.active.writeback_started_bytes = written_bytes;
        Ok(())
    }

    fn active_segment(&self) -> &Segment {
        self.segments.last().expect("invariant: at least one segment")
    }

    /// Publish a new state (one slot write + fdatasync); a failure stops the log.
    fn publish(&mut self, next: PartitionState) -> Result<(), StorageError> {
        if let Err(error) = self.state.publish(next) {
            self.stop(format!("state publish failed: {error}"));
            return Err(error);
        }
        Ok(())
    }

    /// Raise the durable reservation above `end_offset` by a lease block.
    fn raise_reservation(&mut self, end_offset: u64) -> Result<(), StorageError> {
        let current = *self.state.current();
        debug_assert!(end_offset > current.offset_reserved);
        let offset_reserved = end_offset.saturating_add(self.config.offset_lease_block_count);
        self.publish(PartitionState {
            offset_reserved,
            ..current
        })
    }

    /// At open, after an unclean stop: seal the active segment with a gap record jumping to
    /// `next_offset`, make it durable, and start a new segment there.
    fn seal_with_gap(&mut self, next_offset: u64) -> Result<(), StorageError> {
        let previous_end_offset = self.chain.next_offset;
        assert!(next_offset > previous_end_offset);
        let body = record::gap_body(previous_end_offset);
        let mut header = RecordHeader {
            kind: RecordKind::Gap,
            checksum: 0,
            parent_checksum: self.chain.parent_checksum,
            op: self.chain.next_op,
            view: 0,
            partition_id: self.partition_id,
            base_offset: next_offset,
            message_count: 0,
            batch_length_bytes: GAP_BODY_SIZE as u32,
            timestamp_us: self.last_timestamp_us,
        };
        let header_bytes = header.seal(&body);
        let mut record_bytes = Vec::with_capacity(RECORD_HEADER_SIZE + GAP_BODY_SIZE);
        record_bytes.extend_from_slice(&header_bytes);
        record_bytes.extend_from_slice(&body);
        debug_assert_eq!(record::verify(&record_bytes, &self.chain), Ok(header));
        tracing::info!(
            dir = %self.dir.display(),
            previous_end_offset,
            next_offset,
            "recording an offset gap after an unclean stop"
        );
        let position_bytes = self.active_segment().size_bytes;
        // The gap must be durable before a segment at `next_offset` exists: otherwise a crash
        // could leave that segment with nothing explaining its base (a lost segment).
        self.active.log.write_all_at(position_bytes, &record_bytes)?;
        self.active.log.sync_data()?;
        let segment = self.segments.last_mut().expect("invariant: at least one segment");
        segment.size_bytes += record_bytes.len() as u64;
        segment.gap = Some(SegmentGap {
            position_bytes,
            next_offset,
        });
        self.chain = self.chain.advance(&header);
        let active = create_segment_files(self.disk.as_ref(), &self.dir, next_offset)?;
        self.disk.sync_dir(&self.dir)?;
        self.active = active;
        debug_assert_eq!(self.chain.next_offset, next_offset);
        self.segments.push(Segment::empty(self.chain));
        Ok(())
    }

    /// At open: publish that the log runs (not clean), where minting resumed, and a frontier
    /// covering everything recovered, before any write is accepted.
    fn arm(&mut self) -> Result<(), StorageError> {
        let active = self.active_segment();
        let frontier = Frontier {
            segment_base_offset: active.base_offset,
            segment_len_bytes: active.size_bytes,
            chain: self.chain,
        };
        let current = *self.state.current();
        self.state.publish(PartitionState {
            frontier,
            offset_reserved: current.offset_reserved.max(self.chain.next_offset),
            boot_floor: self.chain.next_offset,
            clean_stop: false,
            ..current
        })
    }

    /// Seal the active segment and start a new one at the next offset.
    fn rotate(&mut self) -> Result<(), StorageError> {
        // The sealed segment must be stable before a later segment exists: recovery treats a
        // torn tail anywhere but in the last segment as damage.
        if let Err(error) = self.active.log.sync_data() {
            self.stop(format!("fdatasync failed while sealing a segment: {error}"));
            return Err(error);
        }
        self.active.synced_len_bytes = self.active_segment().size_bytes;
        if self.active.index_writable
            && let Err(error) = self.active.index.sync_data()
        {
            tracing::warn!(dir = %self.dir.display(), %error, "index sync failed; it will be rebuilt at open");
        }
        let base_offset = self.chain.next_offset;
        let active = create_segment_files(self.disk.as_ref(), &self.dir, base_offset)?;
        if let Err(error) = self.disk.sync_dir(&self.dir) {
            // The new names may not be durable: do not put data behind them. Remove them so a
            // later rotation can try again from a clean directory.
            drop(active);
            if let Err(remove_error) = remove_segment_files(self.disk.as_ref(), &self.dir, base_offset) {
                self.stop(format!("cannot remove a half-created segment: {remove_error}"));
            }
            return Err(error);
        }
        self.active = active;
        debug_assert_eq!(self.chain.next_offset, base_offset);
        self.segments.push(Segment::empty(self.chain));
        Ok(())
    }

    fn stop(&mut self, reason: String) {
        tracing::error!(dir = %self.dir.display(), %reason, "partition log stopped taking writes");
        self.stopped.get_or_insert(reason);
    }

    fn check_not_stopped(&self) -> Result<(), StorageError> {
        match &self.stopped {
            None => Ok(()),
            Some(reason) => Err(StorageError::Io {
                path: self.dir.clone(),
                source: std::io::Error::other(format!("partition log stopped ({reason}); reopen to recover")),
            }),
        }
    }
}

/// Where minting resumes at open (pure): above everything recovered, everything reserved and
/// the floor armed at the last boot. After a clean stop the reservation was collapsed to the
/// end of the log, so this is the recovered end (no gap).
pub fn next_offset_after_open(recovered_end_offset: u64, loaded: &PartitionState) -> u64 {
    recovered_end_offset
        .max(loaded.offset_reserved)
        .max(loaded.boot_floor)
}

/// Read `[from_bytes, to_bytes)` of segment `base_offset`'s `.log` and write it back in place
/// through `file` (recovery step 3: the caller's barrier then covers bytes that a failed
/// earlier barrier may have left clean in the page cache but absent from the disk).
fn rewrite_range(
    disk: &dyn Disk,
    dir: &Path,
    file: &mut dyn WriteFile,
    base_offset: u64,
    from_bytes: u64,
    to_bytes: u64,
) -> Result<(), StorageError> {
    debug_assert!(from_bytes <= to_bytes);
    if from_bytes >= to_bytes {
        return Ok(());
    }
    /// Rewrite in chunks so memory stays bounded whatever the segment size.
    const CHUNK_BYTES: u64 = 1024 * 1024;
    let reader = disk.open_read(&dir.join(segment_log_name(base_offset)))?;
    let mut buffer = Vec::new();
    let mut position_bytes = from_bytes;
    while position_bytes < to_bytes {
        let chunk_bytes = CHUNK_BYTES.min(to_bytes - position_bytes);
        buffer.resize(chunk_bytes as usize, 0);
        reader.read_exact_at(position_bytes, &mut buffer)?;
        file.write_all_at(position_bytes, &buffer)?;
        position_bytes += chunk_bytes;
    }
    Ok(())
}

fn validate_config(config: &LogConfig) -> Result<(), StorageError> {
    if config.segment_size_bytes == 0 || config.segment_size_bytes > u64::from(u32::MAX) {
        return Err(StorageError::Invalid(format!(
            "segment_size_bytes {} must be in 1..={}",
            config.segment_size_bytes,
            u32::MAX
        )));
    }
    Ok(())
}

fn create_segment_files(disk: &dyn Disk, dir: &Path, base_offset: u64) -> Result<ActiveFiles, StorageError> {
    let log = disk.create_new(&dir.join(segment_log_name(base_offset)))?;
    let index = match disk.create_new(&dir.join(segment_index_name(base_offset))) {
        Ok(index) => index,
        Err(error) => {
            // Leave no half-created segment behind; if even that fails, the next open sees an
            // empty last segment without an index and rebuilds it.
            drop(log);
            let _ = disk.remove_file(&dir.join(segment_log_name(base_offset)));
            return Err(error);
        }
    };
    Ok(ActiveFiles {
        log,
        index,
        index_writable: true,
        synced_len_bytes: 0,
        writeback_started_bytes: 0,
        writeback_waited_bytes: 0,
    })
}

/// Remove a segment: the index first, so an orphan `.index` never exists (it would read as a
/// lost `.log`).
fn remove_segment_files(disk: &dyn Disk, dir: &Path, base_offset: u64) -> Result<(), StorageError> {
    disk.remove_file(&dir.join(segment_index_name(base_offset)))?;
    disk.remove_file(&dir.join(segment_log_name(base_offset)))?;
    Ok(())
}

pub(crate) fn encode_start(start: &Chain) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(START_CONTENTS_SIZE);
    bytes.extend_from_slice(&start.next_offset.to_le_bytes());
    bytes.extend_from_slice(&start.parent_checksum.to_le_bytes());
    bytes.extend_from_slice(&start.next_op.to_le_bytes());
    debug_assert_eq!(bytes.len(), START_CONTENTS_SIZE);
    bytes
}

pub(crate) fn decode_start(bytes: &[u8], partition_id: u32) -> Option<Chain> {
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

/// Everything recovery decided, before it changes anything. Crate-visible so that the offline
/// checker (`check`) reports exactly what open would do, from the same code.
#[derive(Debug)]
pub(crate) struct RecoveryPlan {
    /// The retained segments, verified, with their recovered lengths and indexes (plus the
    /// empty segment to create, if any).
    pub(crate) segments: Vec<Segment>,
    /// The chain after the last verified record.
    pub(crate) chain: Chain,
    /// The state loaded from `state` (the valid slot with the highest sequence).
    pub(crate) state: PartitionState,
    /// Segments below the purge marker (an interrupted purge), to delete.
    pub(crate) purged_bases: Vec<u64>,
    /// Staging files of interrupted index rebuilds and `start.meta` writes, to delete.
    pub(crate) stale_staging: Vec<String>,
    /// The last segment's torn tail: truncate the `.log` of segment `.0` to `.1` bytes.
    pub(crate) truncate_last: Option<(u64, u64)>,
    /// Why the bytes cut by `truncate_last` are a torn tail (for reports only).
    pub(crate) torn_tail_fault: Option<String>,
    /// Segments whose `.index` differs from the verified log.
    pub(crate) rebuild_index_bases: Vec<u64>,
    /// No writable segment exists (none is retained after a purge, or the last one is sealed
    /// by a gap): create an empty one at `chain.next_offset`.
    pub(crate) create_empty_segment: bool,
}

/// Phase 1 of recovery: read and verify, decide. Changes nothing on disk (only read calls on
/// `disk`), so the offline checker runs it as is.
pub(crate) fn plan_recovery(
    disk: &dyn Disk,
    dir: &Path,
    partition_id: u32,
) -> Result<RecoveryPlan, StorageError> {
    let damaged = |path: PathBuf, position: u64, reason: String| {
        tracing::error!(path = %path.display(), position, %reason, "partition log damaged; refusing it");
        StorageError::Damaged {
            path,
            position,
            reason,
        }
    };
    let start_path = dir.join(START_FILE_NAME);
    let stored_start = match atomic_file::read_verified_on(disk, &start_path)? {
        None => None,
        Some(bytes) => Some(decode_start(&bytes, partition_id).ok_or_else(|| {
            damaged(
                start_path.clone(),
                0,
                format!(
                    "{START_FILE_NAME} holds {} bytes of unusable contents",
                    bytes.len()
                ),
            )
        })?),
    };
    let start = stored_start.unwrap_or_else(|| Chain::genesis(partition_id));

    let mut log_bases = BTreeSet::new();
    let mut index_bases = BTreeSet::new();
    let mut stale_staging = Vec::new();
    for name in disk.list_dir(dir)? {
        match parse_entry_name(&name) {
            EntryName::Log(base) => {
                log_bases.insert(base);
            }
            EntryName::Index(base) => {
                index_bases.insert(base);
            }
            EntryName::IndexStaging(_) | EntryName::StartStaging => stale_staging.push(name),
            EntryName::Start | EntryName::State => {}
            // Known neighbours of the log: stored consumer offsets, and what an operator's
            // `repair --accept-loss` keeps (quarantined bytes, an interrupted state rewrite).
            EntryName::Other
                if name == "offsets"
                    || name.starts_with(crate::check::QUARANTINE_PREFIX)
                    || name == crate::check::STATE_REPAIR_STAGING_NAME => {}
            EntryName::Other => {
                tracing::warn!(dir = %dir.display(), %name, "ignoring unknown file in a partition log directory");
            }
        }
    }
    let purged_bases: Vec<u64> = log_bases
        .union(&index_bases)
        .copied()
        .filter(|&base| base < start.next_offset)
        .collect();
    if let Some(&orphan) = index_bases
        .iter()
        .find(|&&base| base >= start.next_offset && !log_bases.contains(&base))
    {
        return Err(damaged(
            dir.join(segment_index_name(orphan)),
            0,
            "segment index without its log (lost segment)".into(),
        ));
    }
    let retained: Vec<u64> = log_bases
        .iter()
        .copied()
        .filter(|&base| base >= start.next_offset)
        .collect();
    if retained.is_empty() && stored_start.is_none() {
        return Err(damaged(
            dir.to_path_buf(),
            0,
            "no segment files (lost log)".into(),
        ));
    }

    let state_path = dir.join(STATE_FILE_NAME);
    let Some(state_bytes) = disk.read_all(&state_path, STATE_FILE_SIZE_BYTES)? else {
        return Err(damaged(
            state_path,
            0,
            "partition state file missing (lost frontier and offset reservation)".into(),
        ));
    };
    let loaded = state::load(&state_bytes, partition_id)
        .map_err(|(position, reason)| damaged(state_path.clone(), position, reason))?;
    let frontier = loaded.frontier;
    // A frontier in a purged segment is satisfied by the purge marker, provided the purge
    // covered it; otherwise the frontier must be found, verified, in a retained segment.
    let frontier_purged = frontier.segment_base_offset < start.next_offset;
    if frontier_purged && frontier.next_offset() > start.next_offset {
        return Err(damaged(
            state_path,
            0,
            format!(
                "durable frontier {} in purged segment {} lies above the purge point {}",
                frontier.next_offset(),
                frontier.segment_base_offset,
                start.next_offset
            ),
        ));
    }
    let mut frontier_found = frontier_purged;

    let mut plan = RecoveryPlan {
        segments: Vec::with_capacity(retained.len() + 1),
        chain: start,
        state: loaded,
        purged_bases,
        stale_staging,
        truncate_last: None,
        torn_tail_fault: None,
        rebuild_index_bases: Vec::new(),
        create_empty_segment: retained.is_empty(),
    };
    let mut last_timestamp_us = 0u64;
    for (position_in_list, &base_offset) in retained.iter().enumerate() {
        let is_last = position_in_list + 1 == retained.len();
        let log_path = dir.join(segment_log_name(base_offset));
        if base_offset != plan.chain.next_offset {
            let reason = if position_in_list == 0 {
                format!(
                    "first segment starts at {base_offset}, the log starts at {} (lost segment)",
                    plan.chain.next_offset
                )
            } else {
                format!(
                    "segment starts at {base_offset}, the previous one ends at {} (lost or overlapping segment)",
                    plan.chain.next_offset
                )
            };
            return Err(damaged(log_path, 0, reason));
        }
        let Some(bytes) = disk.read_all(&log_path, SEGMENT_LOG_BYTES_MAX)? else {
            return Err(damaged(
                log_path,
                0,
                "segment log vanished during recovery".into(),
            ));
        };
        let holds_frontier = !frontier_purged && base_offset == frontier.segment_base_offset;
        let durable_len_bytes = if holds_frontier {
            frontier.segment_len_bytes
        } else {
            0
        };
        let scanned = record::scan_from(&bytes, plan.chain, durable_len_bytes);
        match &scanned.tail {
            Tail::Clean => {}
            Tail::Torn { fault } if is_last => {
                tracing::warn!(
                    path = %log_path.display(),
                    valid_len_bytes = scanned.valid_len_bytes,
                    file_len_bytes = bytes.len(),
                    %fault,
                    "truncating a torn tail"
                );
                plan.truncate_last = Some((base_offset, scanned.valid_len_bytes));
                plan.torn_tail_fault = Some(fault.to_string());
            }
            Tail::Torn { fault } => {
                return Err(damaged(
                    log_path,
                    scanned.valid_len_bytes,
                    format!("invalid tail in a segment that is not the last ({fault})"),
                ));
            }
            Tail::Damaged {
                position_bytes,
                reason,
            } => {
                return Err(damaged(log_path, *position_bytes, reason.clone()));
            }
        }
        if holds_frontier {
            if scanned.durable_end != Some(frontier.chain) {
                return Err(damaged(
                    log_path,
                    frontier.segment_len_bytes,
                    format!(
                        "the log below the durable frontier ends with {:?}, the state file says {:?}",
                        scanned.durable_end, frontier.chain
                    ),
                ));
            }
            frontier_found = true;
        }
        if scanned.records.is_empty() && scanned.gap.is_none() && !is_last {
            return Err(damaged(log_path, 0, "empty segment before the last one".into()));
        }
        let mut entries = Vec::with_capacity(scanned.records.len());
        for scanned_record in &scanned.records {
            // This engine clamps append timestamps, so a checksum-valid record going back in
            // time was not written by it; timestamp lookups rely on the order.
            if scanned_record.timestamp_us < last_timestamp_us {
                return Err(damaged(
                    log_path,
                    scanned_record.position_bytes,
                    format!(
                        "record timestamp {} precedes the previous record's {last_timestamp_us}",
                        scanned_record.timestamp_us
                    ),
                ));
            }
            last_timestamp_us = scanned_record.timestamp_us;
            let Some(entry) = IndexEntry::from_record(base_offset, scanned_record) else {
                return Err(damaged(
                    log_path,
                    scanned_record.position_bytes,
                    "record position or offset beyond the 32-bit index range".into(),
                ));
            };
            entries.push(entry);
        }
        let expected_index = index::encode_all(&entries);
        let index_path = dir.join(segment_index_name(base_offset));
        let index_matches = disk.file_len(&index_path)? == Some(expected_index.len() as u64)
            && disk
                .read_all(&index_path, expected_index.len() as u64)?
                .as_deref()
                == Some(&expected_index[..]);
        if !index_matches {
            plan.rebuild_index_bases.push(base_offset);
        }
        let end_offset = scanned.records.last().map_or(base_offset, |last| {
            last.base_offset + u64::from(last.message_count)
        });
        plan.segments.push(Segment {
            base_offset,
            end_offset,
            size_bytes: scanned.valid_len_bytes,
            index: SegmentIndex::new(entries),
            gap: scanned.gap.map(|gap| SegmentGap {
                position_bytes: gap.position_bytes,
                next_offset: gap.next_offset,
            }),
            start_chain: plan.chain,
        });
        plan.chain = scanned.end;
        if is_last && scanned.gap.is_some() {
            // A crash between sealing with a gap and creating the next segment.
            plan.create_empty_segment = true;
        }
    }
    if plan.create_empty_segment {
        let base_offset = plan.chain.next_offset;
        if !frontier_found
            && frontier.segment_base_offset == base_offset
            && frontier.segment_len_bytes == 0
            && frontier.chain == plan.chain
        {
            // The frontier names the empty segment about to be (re)created: nothing below it.
            frontier_found = true;
        }
        debug_assert_eq!(plan.chain.next_offset, base_offset);
        plan.segments.push(Segment::empty(plan.chain));
    }
    if !frontier_found {
        return Err(damaged(
            state_path,
            0,
            format!(
                "durable frontier {} (segment {}, byte {}) lies beyond the recovered log ending at {} (lost durable data)",
                frontier.next_offset(),
                frontier.segment_base_offset,
                frontier.segment_len_bytes,
                plan.chain.next_offset
            ),
        ));
    }
    if plan.chain.next_offset > loaded.offset_reserved {
        // The writer raises the reservation durably before a record beyond it is written, so
        // a record beyond it was not written by this engine (or the state went back in time).
        let (path, position) =
            first_record_beyond(dir, &plan.segments, loaded.offset_reserved).unwrap_or((state_path, 0));
        return Err(damaged(
            path,
            position,
            format!(
                "a record reaches beyond the durable offset reservation {} (the log ends at offset {}): \
                 it was not written by this partition's writer",
                loaded.offset_reserved, plan.chain.next_offset
            ),
        ));
    }
    Ok(plan)
}

/// The `.log` file and byte position of the first batch record holding an offset at or above
/// `offset_reserved`, for the refusal message (an operator needs the record, not the state).
fn first_record_beyond(dir: &Path, segments: &[Segment], offset_reserved: u64) -> Option<(PathBuf, u64)> {
    segments.iter().find_map(|segment| {
        let entries = segment.index.entries();
        entries.iter().enumerate().find_map(|(i, entry)| {
            let end_offset = entries.get(i + 1).map_or(segment.end_offset, |next| {
                segment.base_offset + u64::from(next.offset_delta)
            });
            (end_offset > offset_reserved).then(|| {
                (
                    dir.join(segment_log_name(segment.base_offset)),
                    u64::from(entry.position_bytes),
                )
            })
        })
    })
}

/// Phase 2 of recovery: carry out the plan (deletions, truncation, index rebuilds), then sync
/// the directory.
fn apply_recovery(disk: &dyn Disk, dir: &Path, plan: &RecoveryPlan) -> Result<(), StorageError> {
    let mut directory_changed = false;
    for name in &plan.stale_staging {
        directory_changed |= disk.remove_file(&dir.join(name))?;
    }
    for &base in &plan.purged_bases {
        tracing::info!(dir = %dir.display(), base, "finishing an interrupted purge");
        remove_segment_files(disk, dir, base)?;
        directory_changed = true;
    }
    if let Some((base, len_bytes)) = plan.truncate_last {
        let mut file = disk.open_write(&dir.join(segment_log_name(base)))?;
        file.set_len(len_bytes)?;
        file.sync_data()?;
    }
    if plan.create_empty_segment {
        let base = plan.chain.next_offset;
        let log_path = dir.join(segment_log_name(base));
        if disk.file_len(&log_path)?.is_none() {
            drop(create_segment_files(disk, dir, base)?);
            directory_changed = true;
        }
    }
    for &base in &plan.rebuild_index_bases {
        let Some(segment) = plan.segments.iter().find(|segment| segment.base_offset == base) else {
            continue;
        };
        tracing::info!(dir = %dir.display(), base, "rebuilding segment index");
        let index_path = dir.join(segment_index_name(base));
        let staging_path = dir.join(format!("{base:020}{INDEX_STAGING_SUFFIX}"));
        disk.write_synced(&staging_path, &index::encode_all(segment.index.entries()))?;
        disk.rename(&staging_path, &index_path)?;
        directory_changed = true;
    }
    if directory_changed {
        disk.sync_dir(dir)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_names() {
        assert_eq!(parse_entry_name("00000000000000000000.log"), EntryName::Log(0));
        assert_eq!(
            parse_entry_name("00000000000000001234.index"),
            EntryName::Index(1234)
        );
        assert_eq!(
            parse_entry_name("00000000000000001234.index.tmp"),
            EntryName::IndexStaging(1234)
        );
        assert_eq!(parse_entry_name(START_FILE_NAME), EntryName::Start);
        assert_eq!(parse_entry_name("0000000000000000123.log"), EntryName::Other);
        assert_eq!(parse_entry_name("99999999999999999999.log"), EntryName::Other);
        assert_eq!(parse_entry_name("0000000000000000000x.log"), EntryName::Other);
        assert_eq!(parse_entry_name("start.meta.tmp"), EntryName::StartStaging);
        assert_eq!(parse_entry_name("start.meta.tmp.tmp"), EntryName::Other);
        assert_eq!(segment_log_name(1234), "00000000000000001234.log");
    }

    #[test]
    fn rotation_rule() {
        assert!(
            !rotation_needed(0, 0, 10_000, 100),
            "an empty segment takes any record"
        );
        assert!(!rotation_needed(50, 3, 50, 100));
        assert!(rotation_needed(51, 3, 50, 100));
        assert!(rotation_needed(10, u64::from(u32::MAX) + 1, 10, 100));
        assert!(!rotation_needed(10, u64::from(u32::MAX), 10, 100));
    }

    #[test]
    fn start_contents_round_trip() {
        let chain = Chain {
            partition_id: 3,
            next_offset: 99,
            parent_checksum: 7,
            next_op: 12,
        };
        assert_eq!(decode_start(&encode_start(&chain), 3), Some(chain));
        assert_eq!(decode_start(&encode_start(&chain)[..23], 3), None);
    }
}
