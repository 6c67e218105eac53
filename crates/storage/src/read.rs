//! Reading stored batches back for a poll ([`crate::journal::JournalLog`]).
//!
//! The journal walks its segments and in-memory index and hands every batch record the poll
//! reaches to [`PollRead::take_record`]: the record is read, verified again (checksum, kind,
//! size, offset, partition; a mismatch is `Damaged`), and either given whole as a file range
//! (the `sendfile` path) or cut to the messages the poll takes
//! (`cairn_wire::batch::plan_take`) into the caller's buffer.

use crate::StorageError;
use crate::io::{Disk, ReadFile};
use crate::record::{self, RECORD_HEADER_SIZE, RecordHeader, RecordKind};
use cairn_wire::batch::{self, BATCH_HEADER_SIZE};
use std::path::Path;
use std::sync::Arc;

/// One piece of a poll's batches, in order (see [`crate::journal::JournalLog::read_parts`]).
#[derive(Debug, Clone)]
pub enum ReadPart {
    /// Bytes of the caller's buffer (a batch cut to the messages taken, or batches read
    /// where the file cannot be sent directly).
    Buffer(std::ops::Range<usize>),
    /// A whole stored batch, verified, to be sent from the segment file as it is stored: `len`
    /// bytes from `position_bytes`. The handle keeps the file readable even if the segment is
    /// deleted after the read (the bytes were verified and chosen under the caller's lock).
    File {
        file: Arc<dyn ReadFile>,
        position_bytes: u64,
        len: usize,
    },
}

impl ReadPart {
    /// Bytes this part stands for.
    pub fn len(&self) -> usize {
        match self {
            ReadPart::Buffer(range) => range.len(),
            ReadPart::File { len, .. } => *len,
        }
    }

    /// Whether the part stands for no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What a poll's read appended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadOutcome {
    /// Messages appended.
    pub messages_count: u32,
    /// Offset of the last message appended (offsets may skip a gap, so the count alone does
    /// not give it).
    pub last_offset: Option<u64>,
}

impl ReadOutcome {
    /// A read that appended nothing.
    pub const NOTHING: ReadOutcome = ReadOutcome {
        messages_count: 0,
        last_offset: None,
    };
}

/// A segment's `.log` open for reads, kept across polls (consumers mostly read on in the
/// segment they read last). Keyed by the number in the segment's name; a log that removes a
/// segment whose name a later one may take again empties the cache.
#[derive(Debug)]
pub(crate) struct CachedReader {
    base_offset: u64,
    file: Arc<dyn ReadFile>,
}

/// The read handle of segment `base_offset` at `path`: the cached one, or a new one that
/// replaces it in the cache.
pub(crate) fn cached_file<'c>(
    cache: &'c mut Option<CachedReader>,
    disk: &dyn Disk,
    path: &Path,
    base_offset: u64,
) -> Result<&'c Arc<dyn ReadFile>, StorageError> {
    if cache
        .as_ref()
        .is_some_and(|cached| cached.base_offset == base_offset)
    {
        return Ok(&cache.as_ref().expect("checked above").file);
    }
    *cache = None;
    let file: Arc<dyn ReadFile> = Arc::from(disk.open_read(path)?);
    Ok(&cache.insert(CachedReader { base_offset, file }).file)
}

/// Largest verification buffer a thread keeps between polls (bigger records use a one-off).
const VERIFY_SCRATCH_KEEP_BYTES_MAX: usize = 4 << 20;

/// A record a poll sends whole is read and hashed in pieces of this size, so each piece is
/// hashed while it is still in the CPU's L2 cache. Reading a 1 MB record whole and then
/// hashing it cost about a fifth more CPU on this project's machine (`cairn bench
/// serve-ceiling`, which verifies the same way).
const VERIFY_PIECE_BYTES: usize = 64 * 1024;

thread_local! {
    /// Where a `read_parts` poll reads a record to verify it before the file's bytes are
    /// sent: reused, so it stays allocated and warm in cache.
    static VERIFY_SCRATCH: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Where the batches of a `read_parts` poll go, and its verification buffer.
struct ToParts<'a> {
    parts: &'a mut Vec<ReadPart>,
    scratch: Vec<u8>,
}

/// One poll's read in progress: what it still takes and where the batches go.
pub(crate) struct PollRead<'a> {
    partition_id: u32,
    /// The first offset the poll takes (at or above the log's first message).
    start_offset: u64,
    remaining: u32,
    last_offset: Option<u64>,
    out: &'a mut Vec<u8>,
    /// `Some` for a sender that can send file ranges (`read_parts`).
    to_parts: Option<ToParts<'a>>,
    /// Bytes of `out` from here on are not yet named by a part.
    unnamed_from: usize,
}

impl<'a> PollRead<'a> {
    /// Run `walk` (a log's walk over its records) for a poll of at most `max_messages` from
    /// `start_offset`, into `out` and, when given, `parts`. On `Err`, `out` holds its
    /// original bytes and possibly some of the batches, and `parts` may hold some of them.
    pub(crate) fn run(
        partition_id: u32,
        start_offset: u64,
        max_messages: u32,
        out: &'a mut Vec<u8>,
        parts: Option<&'a mut Vec<ReadPart>>,
        walk: impl FnOnce(&mut PollRead<'a>) -> Result<(), StorageError>,
    ) -> Result<ReadOutcome, StorageError> {
        let unnamed_from = out.len();
        let mut read = PollRead {
            partition_id,
            start_offset,
            remaining: max_messages,
            last_offset: None,
            out,
            to_parts: parts.map(|parts| ToParts {
                parts,
                scratch: VERIFY_SCRATCH.take(),
            }),
            unnamed_from,
        };
        let result = if max_messages == 0 {
            Ok(())
        } else {
            walk(&mut read)
        };
        if let Some(to) = read.to_parts.take() {
            if read.out.len() > read.unnamed_from {
                to.parts.push(ReadPart::Buffer(read.unnamed_from..read.out.len()));
            }
            if to.scratch.capacity() <= VERIFY_SCRATCH_KEEP_BYTES_MAX {
                VERIFY_SCRATCH.set(to.scratch);
            }
        }
        result.map(|()| ReadOutcome {
            messages_count: max_messages - read.remaining,
            last_offset: read.last_offset,
        })
    }

    /// The first offset the poll takes.
    pub(crate) fn start_offset(&self) -> u64 {
        self.start_offset
    }

    /// Messages the poll still takes (the walk stops at 0).
    pub(crate) fn remaining(&self) -> u32 {
        self.remaining
    }

    /// Take the messages of the batch record at `position_bytes` of `file` (`record_len`
    /// bytes, from the log's index, which says it holds `expected_offset` on): verify it and
    /// append what the poll takes from it.
    ///
    /// Without parts, records are read straight into `out` with no copy: a record's 64-byte
    /// header lands on the last 64 bytes already in `out` (saved and put back after
    /// verification), so the batch behind it ends up in place. With less than
    /// `RECORD_HEADER_SIZE` bytes of prefix in `out`, the record goes through a scratch
    /// buffer.
    pub(crate) fn take_record(
        &mut self,
        path: &Path,
        file: &Arc<dyn ReadFile>,
        position_bytes: u64,
        record_len: usize,
        expected_offset: u64,
    ) -> Result<(), StorageError> {
        debug_assert!(self.remaining > 0);
        let damaged = |reason: String| StorageError::Damaged {
            path: path.to_path_buf(),
            position: position_bytes,
            reason,
        };
        let (start_offset, remaining, partition_id) = (self.start_offset, self.remaining, self.partition_id);
        let sendable = file.as_file().is_some();
        let take = if let Some(to) = self.to_parts.as_mut().filter(|_| sendable) {
            let taken_whole = verify_taken_whole(
                file.as_ref(),
                position_bytes,
                record_len,
                expected_offset,
                start_offset,
                remaining,
                partition_id,
                &mut to.scratch,
                &damaged,
            )?;
            if let Some(take) = taken_whole {
                if self.out.len() > self.unnamed_from {
                    to.parts.push(ReadPart::Buffer(self.unnamed_from..self.out.len()));
                }
                self.unnamed_from = self.out.len();
                to.parts.push(ReadPart::File {
                    file: Arc::clone(file),
                    position_bytes: position_bytes + RECORD_HEADER_SIZE as u64,
                    len: record_len - RECORD_HEADER_SIZE,
                });
                take
            } else {
                // Part of the record: read it whole, verify it, cut it into `out`.
                file.read_exact_at_into(position_bytes, record_len, &mut to.scratch, 0)?;
                verify_stored(&to.scratch, expected_offset, partition_id).map_err(damaged)?;
                let batch_bytes = &to.scratch[RECORD_HEADER_SIZE..];
                let take = batch::plan_take(batch_bytes, start_offset, remaining);
                let appended = batch::slice_into(batch_bytes, start_offset, remaining, self.out);
                debug_assert_eq!(appended, take.count());
                take
            }
        } else if self.out.len() >= RECORD_HEADER_SIZE {
            let out = &mut *self.out;
            let batch_start = out.len();
            let header_start = batch_start - RECORD_HEADER_SIZE;
            let mut saved = [0u8; RECORD_HEADER_SIZE];
            saved.copy_from_slice(&out[header_start..batch_start]);
            let read = file
                .read_exact_at_into(position_bytes, record_len, out, header_start)
                .and_then(|()| {
                    verify_stored(&out[header_start..], expected_offset, partition_id).map_err(damaged)
                });
            // A failed read leaves `out` cut at `header_start`.
            if out.len() < batch_start {
                out.resize(batch_start, 0);
            }
            out[header_start..batch_start].copy_from_slice(&saved);
            if let Err(error) = read {
                out.truncate(batch_start);
                return Err(error);
            }
            let take = batch::plan_take(&out[batch_start..], start_offset, remaining);
            batch::cut_in_place(out, batch_start, &take);
            take
        } else {
            let mut record_bytes = Vec::new();
            file.read_exact_at_into(position_bytes, record_len, &mut record_bytes, 0)?;
            verify_stored(&record_bytes, expected_offset, partition_id).map_err(damaged)?;
            let batch_bytes = &record_bytes[RECORD_HEADER_SIZE..];
            let take = batch::plan_take(batch_bytes, start_offset, remaining);
            let appended = batch::slice_into(batch_bytes, start_offset, remaining, self.out);
            debug_assert_eq!(appended, take.count());
            take
        };
        let appended = take.count();
        debug_assert!(appended <= self.remaining);
        self.remaining -= appended;
        self.last_offset = take.last_offset().or(self.last_offset);
        Ok(())
    }
}

/// The poll's record at `position_bytes` (`record_len` bytes, from the index), when its
/// header says the poll takes it whole: verified like [`verify_stored`], but read and hashed
/// in pieces of [`VERIFY_PIECE_BYTES`] through `scratch`, and given as a whole
/// [`batch::Take`]. `None` when the poll takes only part of the record (or the record cannot
/// hold a batch header): the caller then reads it whole, verifies it and cuts it. A
/// verification failure is `damaged(reason)`.
///
/// The frames are not walked: a record that verifies holds the bytes its log wrote, and the
/// logs only write batches whose frames `batch::validate` checked (offset deltas 0..count,
/// frames tiling the batch), so its messages are `base_offset..+count`.
#[allow(clippy::too_many_arguments)]
fn verify_taken_whole(
    file: &dyn ReadFile,
    position_bytes: u64,
    record_len: usize,
    expected_offset: u64,
    start_offset: u64,
    remaining: u32,
    partition_id: u32,
    scratch: &mut Vec<u8>,
    damaged: &dyn Fn(String) -> StorageError,
) -> Result<Option<batch::Take>, StorageError> {
    if record_len < RECORD_HEADER_SIZE + BATCH_HEADER_SIZE {
        return Ok(None);
    }
    let head_len = record_len.min(VERIFY_PIECE_BYTES);
    file.read_exact_at_into(position_bytes, head_len, scratch, 0)?;
    let mut check = record::EnvelopeInPieces::begin(scratch, record_len as u64)
        .map_err(|fault| damaged(fault.to_string()))?;
    let header = *check.header();
    let whole = header.kind == RecordKind::Batch
        && header.message_count > 0
        && header.base_offset >= start_offset
        && header.message_count <= remaining;
    if !whole {
        return Ok(None);
    }
    verify_place(&header, record_len, expected_offset, partition_id).map_err(damaged)?;
    check.update(&scratch[RECORD_HEADER_SIZE..head_len]);
    let mut position = position_bytes + head_len as u64;
    let end_bytes = position_bytes + record_len as u64;
    while position < end_bytes {
        let piece_len = usize::try_from(end_bytes - position)
            .unwrap_or(usize::MAX)
            .min(VERIFY_PIECE_BYTES);
        file.read_exact_at_into(position, piece_len, scratch, 0)?;
        check.update(&scratch[..piece_len]);
        position += piece_len as u64;
    }
    check.finish().map_err(|fault| damaged(fault.to_string()))?;
    let last_offset = header
        .base_offset
        .checked_add(u64::from(header.message_count) - 1)
        .ok_or_else(|| damaged("offsets beyond u64".to_string()))?;
    Ok(Some(batch::Take::Whole {
        count: header.message_count,
        last_offset,
    }))
}

/// Re-verify a record read back for a poll: the same envelope checks as recovery, plus its
/// place (offset, partition, kind) and exact size.
fn verify_stored(record_bytes: &[u8], expected_offset: u64, partition_id: u32) -> Result<(), String> {
    let header = record::verify_envelope(record_bytes).map_err(|fault| fault.to_string())?;
    verify_place(&header, record_bytes.len(), expected_offset, partition_id)
}

/// A read-back record's header against what the index implies: a batch, of exactly
/// `record_len` bytes, at `expected_offset`, of this partition.
fn verify_place(
    header: &RecordHeader,
    record_len: usize,
    expected_offset: u64,
    partition_id: u32,
) -> Result<(), String> {
    if header.kind != RecordKind::Batch {
        return Err(format!(
            "{:?} record where the index implies a batch",
            header.kind
        ));
    }
    if header.record_size_bytes() != record_len as u64 {
        return Err(format!(
            "record of {} bytes where the index implies {record_len}",
            header.record_size_bytes(),
        ));
    }
    if header.base_offset != expected_offset {
        return Err(format!(
            "record base offset {}, index says {expected_offset}",
            header.base_offset
        ));
    }
    if header.partition_id != partition_id {
        return Err(format!("record of partition {}", header.partition_id));
    }
    Ok(())
}
