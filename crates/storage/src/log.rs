//! One partition's log: record-framed batches in segment files, with open-time recovery.
//!
//! # Directory layout
//!
//! ```text
//! <dir>/00000000000000000000.log     records (see `record`), base offset 0
//! <dir>/00000000000000000000.index   16-byte entries, one per record (see `index`)
//! <dir>/00000000000000001234.log     next segment: base offset 1234 = end of the previous one
//! <dir>/00000000000000001234.index
//! <dir>/start.meta                   only after a purge (atomic file, see below)
//! ```
//!
//! A segment is named by its base offset, 20 zero-padded digits, so names sort in offset
//! order. Only the last segment is written to (the *active* segment); it may be empty (a fresh
//! log, right after a rotation or a purge), and an empty segment named `N` alone means "no
//! retained messages, the next offset is N".
//!
//! `start.meta` (written with [`crate::atomic_file`], 24 bytes of contents: `start_offset u64`,
//! `parent_checksum u64`, `next_op u64`, little-endian) records where the retained log begins
//! after a purge: every segment below `start_offset` is purged data (deleted at open if a purge
//! was interrupted), the first retained segment must be named `start_offset`, and its first
//! record must continue the stored chain. Without it the log begins at offset 0 with the
//! genesis chain (parent 0, op 1).
//!
//! # Recovery (open)
//!
//! 1. Read only: list the directory, read `start.meta`, read and [`record::scan`] every
//!    retained segment in order, checking that segment N+1 starts where segment N ends and that
//!    its first record continues N's checksum chain. Only the last segment may end in a torn
//!    tail; a torn tail anywhere else, any damage, a missing first segment, an orphan `.index`
//!    or an empty segment before the last refuses the open with [`StorageError::Damaged`] before
//!    a single byte is changed.
//! 2. Write: finish an interrupted purge, truncate the last segment's torn tail (and sync it),
//!    rebuild every `.index` that differs from what the verified log implies (staging file,
//!    fsync, rename), remove stale staging files, then sync the directory.
//!
//! Only then does the log accept writes, positioned at the recovered length (a writer never
//! trusts a raw file length).
//!
//! # Appends
//!
//! One record = one positional write of header + batch into the active `.log`, then the index
//! entry, then (in [`SyncMode::EveryAppend`]) an fdatasync of the `.log` (the index may lag; it
//! is rebuilt at open). A segment is sealed (fdatasync'ed) before the next one is created, so a
//! torn write can only ever be at the end of the last segment.
//!
//! A failed data barrier stops the log: nothing it covered is reported appended, and every later
//! write fails until the log is reopened (durability contract, guarantee 8).

use crate::StorageError;
use crate::atomic_file;
use crate::index::{self, INDEX_ENTRY_SIZE, IndexEntry, SegmentIndex};
use crate::io::{Disk, RealDisk, WriteFile, parent_dir};
use crate::record::{self, BATCH_BYTES_MAX, Chain, RECORD_HEADER_SIZE, RecordHeader, Tail};
use cairn_wire::batch;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How appends reach stable storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncMode {
    /// fdatasync after every append, before `append` returns.
    EveryAppend,
    /// Leave it to the OS (and to explicit `flush` calls).
    Os,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogConfig {
    /// A segment is closed and a new one started once its `.log` reaches this size.
    /// Must be <= u32::MAX (index positions are u32).
    pub segment_size_bytes: u64,
    pub sync: SyncMode,
}

/// Summary numbers for replies and stats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LogStats {
    pub segments_count: u32,
    pub messages_count: u64,
    pub size_bytes: u64,
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
    Other,
}

/// Classify a directory entry name (pure).
pub fn parse_entry_name(name: &str) -> EntryName {
    if name == START_FILE_NAME {
        return EntryName::Start;
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

/// One segment's in-memory state.
#[derive(Debug)]
struct Segment {
    base_offset: u64,
    /// Invariant: `end_offset = base_offset + Σ message_count` of its records.
    end_offset: u64,
    /// Invariant: the recovered/written length of the `.log`; every byte below it verified.
    size_bytes: u64,
    /// Invariant: one entry per record, in order.
    index: SegmentIndex,
}

impl Segment {
    fn empty(base_offset: u64) -> Segment {
        Segment {
            base_offset,
            end_offset: base_offset,
            size_bytes: 0,
            index: SegmentIndex::default(),
        }
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
}

#[derive(Debug)]
pub struct PartitionLog {
    disk: Arc<dyn Disk>,
    dir: PathBuf,
    partition_id: u32,
    config: LogConfig,
    /// Invariants: non-empty; `segments[i + 1].base_offset == segments[i].end_offset`; only the
    /// last segment may be empty; the last one is the active segment.
    segments: Vec<Segment>,
    active: ActiveFiles,
    /// Invariants: `chain.next_offset == segments.last().end_offset`; `chain.partition_id ==
    /// partition_id`; `chain.parent_checksum` = checksum of the last record written.
    chain: Chain,
    /// Invariant: >= every stored record's timestamp (append timestamps are clamped to it so
    /// that timestamp lookups can binary-search).
    last_timestamp_us: u64,
    /// Set when a write failed in a way that leaves the on-disk state unknown (a failed barrier):
    /// every later write is refused until the log is reopened.
    stopped: Option<String>,
    /// Reused buffer holding header + batch for the single write of a record.
    record_buffer: Vec<u8>,
}

impl PartitionLog {
    /// Create a new, empty partition log in `dir` (created if missing; must be empty).
    pub fn create(dir: &Path, partition_id: u32, config: LogConfig) -> Result<PartitionLog, StorageError> {
        PartitionLog::create_on(Arc::new(RealDisk), dir, partition_id, config)
    }

    /// Open an existing log: recover (truncate a torn tail, rebuild a missing or torn index),
    /// or fail with `Damaged` leaving files untouched.
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
        let active = create_segment_files(disk.as_ref(), dir, 0)?;
        disk.sync_dir(dir)?;
        // The partition directory itself may be new: make its entry durable too.
        disk.sync_dir(parent_dir(dir))?;
        let log = PartitionLog {
            disk,
            dir: dir.to_path_buf(),
            partition_id,
            config,
            segments: vec![Segment::empty(0)],
            active,
            chain: Chain::genesis(partition_id),
            last_timestamp_us: 0,
            stopped: None,
            record_buffer: Vec::new(),
        };
        debug_assert!(log.check_invariants());
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
            .unwrap_or(plan.chain.next_offset);
        let active = ActiveFiles {
            log: disk.open_write(&dir.join(segment_log_name(active_base)))?,
            index: disk.open_write(&dir.join(segment_index_name(active_base)))?,
            index_writable: true,
        };
        let last_timestamp_us = plan
            .segments
            .iter()
            .rev()
            .find_map(|segment| segment.index.entries().last())
            .map_or(0, |entry| entry.timestamp_us);
        let log = PartitionLog {
            disk,
            dir: dir.to_path_buf(),
            partition_id,
            config,
            segments: plan.segments,
            active,
            chain: plan.chain,
            last_timestamp_us,
            stopped: None,
            record_buffer: Vec::new(),
        };
        if !log.check_invariants() {
            // Recovery only builds verified state; failing here is a bug, not bad data.
            panic!(
                "partition log {} violates its invariants after recovery",
                dir.display()
            );
        }
        Ok(log)
    }

    /// Append one validated client batch (256-byte header + frames): assigns the next
    /// offsets, stamps partition id, base offset and `timestamp_us` (recomputing the batch
    /// checksum via `cairn_wire::batch::stamp`), writes it, syncs per `SyncMode`, rotates
    /// the segment when full. Returns the base offset.
    ///
    /// `timestamp_us` is raised to the last stored timestamp if it is lower, so timestamps
    /// never go backwards within a partition (a clock step back must not break lookups).
    pub fn append(&mut self, batch: &mut [u8], timestamp_us: u64) -> Result<u64, StorageError> {
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
        if self
            .chain
            .next_offset
            .checked_add(u64::from(message_count))
            .is_none()
        {
            return Err(StorageError::Invalid("offsets exhausted".into()));
        }
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

        let base_offset = self.chain.next_offset;
        batch::stamp(batch, u64::from(self.partition_id), base_offset, timestamp_us);
        let mut header = RecordHeader {
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
        let header_bytes = header.seal(batch);
        self.record_buffer.clear();
        self.record_buffer.extend_from_slice(&header_bytes);
        self.record_buffer.extend_from_slice(batch);
        debug_assert_eq!(record::verify(&self.record_buffer, &self.chain), Ok(header));

        let segment = self.segments.last().expect("invariant: at least one segment");
        let position_bytes = segment.size_bytes;
        let entry = IndexEntry {
            offset_delta: u32::try_from(base_offset - segment.base_offset)
                .expect("rotation keeps offset deltas within u32"),
            position_bytes: u32::try_from(position_bytes).expect("rotation keeps positions within u32"),
            timestamp_us,
        };
        let index_position_bytes = (segment.index.len() * INDEX_ENTRY_SIZE) as u64;

        if let Err(error) = self.active.log.write_all_at(position_bytes, &self.record_buffer) {
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
        if self.config.sync == SyncMode::EveryAppend
            && let Err(error) = self.active.log.sync_data()
        {
            self.stop(format!("fdatasync failed: {error}"));
            return Err(error);
        }

        let segment = self.segments.last_mut().expect("invariant: at least one segment");
        segment.index.push(entry);
        segment.size_bytes += record_size_bytes;
        segment.end_offset += u64::from(message_count);
        self.chain = self.chain.advance(&header);
        self.last_timestamp_us = timestamp_us;
        debug_assert_eq!(self.chain.next_offset, segment.end_offset);
        Ok(base_offset)
    }

    /// Make everything appended so far stable (fdatasync).
    pub fn flush(&mut self) -> Result<(), StorageError> {
        self.check_not_stopped()?;
        if let Err(error) = self.active.log.sync_data() {
            self.stop(format!("fdatasync failed: {error}"));
            return Err(error);
        }
        Ok(())
    }

    /// Append to `out` the client-format batches holding messages with offset >= `from_offset`,
    /// at most `max_messages` in all (sub-ranges via `cairn_wire::batch::slice_into`).
    /// Returns the number of messages appended.
    ///
    /// Each record read is verified again (checksum, offset, partition); a mismatch is
    /// `Damaged`.
    pub fn read(&self, from_offset: u64, max_messages: u32, out: &mut Vec<u8>) -> Result<u32, StorageError> {
        let Some(first_offset) = self.first_offset() else {
            return Ok(0);
        };
        let start_offset = from_offset.max(first_offset);
        if max_messages == 0 || start_offset >= self.chain.next_offset {
            return Ok(0);
        }
        let mut remaining = max_messages;
        let first_segment = self
            .segments
            .partition_point(|segment| segment.base_offset <= start_offset)
            .saturating_sub(1);
        let mut record_bytes = Vec::new();
        for segment in &self.segments[first_segment..] {
            if remaining == 0 {
                break;
            }
            let Some(first_entry) = segment
                .index
                .find_offset(start_offset.saturating_sub(segment.base_offset))
            else {
                continue;
            };
            let path = self.dir.join(segment_log_name(segment.base_offset));
            let file = self.disk.open_read(&path)?;
            let entries = segment.index.entries();
            for (entry_index, entry) in entries.iter().enumerate().skip(first_entry) {
                let position_bytes = u64::from(entry.position_bytes);
                let end_bytes = entries
                    .get(entry_index + 1)
                    .map_or(segment.size_bytes, |next| u64::from(next.position_bytes));
                debug_assert!(end_bytes > position_bytes);
                record_bytes.resize((end_bytes - position_bytes) as usize, 0);
                file.read_exact_at(position_bytes, &mut record_bytes)?;
                let expected_offset = segment.base_offset + u64::from(entry.offset_delta);
                self.verify_stored(&record_bytes, expected_offset)
                    .map_err(|reason| StorageError::Damaged {
                        path: path.clone(),
                        position: position_bytes,
                        reason,
                    })?;
                let appended =
                    batch::slice_into(&record_bytes[RECORD_HEADER_SIZE..], start_offset, remaining, out);
                debug_assert!(appended <= remaining);
                remaining -= appended;
                if remaining == 0 {
                    break;
                }
            }
        }
        Ok(max_messages - remaining)
    }

    /// The offset of the first message whose append timestamp >= `timestamp_us`, if any.
    pub fn offset_at_timestamp(&self, timestamp_us: u64) -> Result<Option<u64>, StorageError> {
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
            return Ok(found);
        }
        Ok(None)
    }

    /// The oldest retained offset, or None if no message is retained.
    pub fn first_offset(&self) -> Option<u64> {
        self.segments
            .iter()
            .find(|segment| !segment.index.is_empty())
            .map(|segment| segment.base_offset)
    }

    /// The offset the next appended message will get.
    pub fn next_offset(&self) -> u64 {
        self.chain.next_offset
    }

    pub fn stats(&self) -> LogStats {
        LogStats {
            segments_count: u32::try_from(self.segments.len()).unwrap_or(u32::MAX),
            messages_count: self
                .first_offset()
                .map_or(0, |first| self.chain.next_offset - first),
            size_bytes: self.segments.iter().map(|segment| segment.size_bytes).sum(),
        }
    }

    /// Delete every segment; offsets keep counting from `next_offset` (a purge never re-issues
    /// an offset).
    ///
    /// Order: first `start.meta` durably says "everything below next_offset is purged", then
    /// the new empty segment is created, then the old segments are deleted. A crash anywhere
    /// is finished by the next open, and purged data never comes back.
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
        debug_assert!(self.check_invariants());
        Ok(())
    }

    fn purge_after_marker(&mut self, start: Chain) -> Result<(), StorageError> {
        let active = self.active_segment();
        let reuse_active = active.base_offset == start.next_offset && active.index.is_empty();
        if !reuse_active {
            self.active = create_segment_files(self.disk.as_ref(), &self.dir, start.next_offset)?;
            self.segments.push(Segment::empty(start.next_offset));
            self.disk.sync_dir(&self.dir)?;
        }
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

    /// The directory holding this log.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn partition_id(&self) -> u32 {
        self.partition_id
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
            pair[1].base_offset == pair[0].end_offset && !pair[0].index.is_empty() && pair[0].size_bytes > 0
        });
        let each_ok = self.segments.iter().all(|segment| {
            segment.index.check_invariants()
                && segment.index.is_empty() == (segment.size_bytes == 0)
                && segment.index.is_empty() == (segment.end_offset == segment.base_offset)
                && segment.end_offset >= segment.base_offset
        });
        segments_ok
            && each_ok
            && self.chain.next_offset == last.end_offset
            && self.chain.partition_id == self.partition_id
            && self.chain.next_op >= 1
    }

    fn active_segment(&self) -> &Segment {
        self.segments.last().expect("invariant: at least one segment")
    }

    /// Seal the active segment and start a new one at the next offset.
    fn rotate(&mut self) -> Result<(), StorageError> {
        // The sealed segment must be stable before a later segment exists: recovery treats a
        // torn tail anywhere but in the last segment as damage.
        if let Err(error) = self.active.log.sync_data() {
            self.stop(format!("fdatasync failed while sealing a segment: {error}"));
            return Err(error);
        }
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
        self.segments.push(Segment::empty(base_offset));
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

    /// Re-verify a record read back for a poll: the same envelope checks as recovery, plus its
    /// place (offset, partition) and exact size.
    fn verify_stored(&self, record_bytes: &[u8], expected_offset: u64) -> Result<(), String> {
        let header = record::verify_envelope(record_bytes).map_err(|fault| fault.to_string())?;
        if header.record_size_bytes() != record_bytes.len() as u64 {
            return Err(format!(
                "record of {} bytes where the index implies {}",
                header.record_size_bytes(),
                record_bytes.len()
            ));
        }
        if header.base_offset != expected_offset {
            return Err(format!(
                "record base offset {}, index says {expected_offset}",
                header.base_offset
            ));
        }
        if header.partition_id != self.partition_id {
            return Err(format!("record of partition {}", header.partition_id));
        }
        Ok(())
    }
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
    })
}

/// Remove a segment: the index first, so an orphan `.index` never exists (it would read as a
/// lost `.log`).
fn remove_segment_files(disk: &dyn Disk, dir: &Path, base_offset: u64) -> Result<(), StorageError> {
    disk.remove_file(&dir.join(segment_index_name(base_offset)))?;
    disk.remove_file(&dir.join(segment_log_name(base_offset)))?;
    Ok(())
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

/// Everything recovery decided, before it changes anything.
#[derive(Debug)]
struct RecoveryPlan {
    /// The retained segments, verified, with their recovered lengths and indexes.
    segments: Vec<Segment>,
    /// The chain after the last verified record.
    chain: Chain,
    /// Segments below the purge marker (an interrupted purge), to delete.
    purged_bases: Vec<u64>,
    /// Staging files of interrupted index rebuilds and `start.meta` writes, to delete.
    stale_staging: Vec<String>,
    /// The last segment's torn tail: truncate its `.log` to this length.
    truncate_last_to_bytes: Option<u64>,
    /// Segments whose `.index` differs from the verified log.
    rebuild_index_bases: Vec<u64>,
    /// No retained segment exists (after a purge): create an empty one at `chain.next_offset`.
    create_empty_segment: bool,
}

/// Phase 1 of recovery: read and verify, decide. Changes nothing on disk.
fn plan_recovery(disk: &dyn Disk, dir: &Path, partition_id: u32) -> Result<RecoveryPlan, StorageError> {
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
            EntryName::Start => {}
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

    let mut plan = RecoveryPlan {
        segments: Vec::with_capacity(retained.len()),
        chain: start,
        purged_bases,
        stale_staging,
        truncate_last_to_bytes: None,
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
        let scanned = record::scan(&bytes, plan.chain);
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
                plan.truncate_last_to_bytes = Some(scanned.valid_len_bytes);
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
        if scanned.records.is_empty() && !is_last {
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
        plan.segments.push(Segment {
            base_offset,
            end_offset: scanned.end.next_offset,
            size_bytes: scanned.valid_len_bytes,
            index: SegmentIndex::new(entries),
        });
        plan.chain = scanned.end;
    }
    if plan.create_empty_segment {
        plan.segments.push(Segment::empty(plan.chain.next_offset));
    }
    Ok(plan)
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
    if let (Some(len_bytes), Some(last)) = (plan.truncate_last_to_bytes, plan.segments.last()) {
        let mut file = disk.open_write(&dir.join(segment_log_name(last.base_offset)))?;
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
