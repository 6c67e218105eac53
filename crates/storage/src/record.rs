//! The record envelope around every stored batch, and the pure recovery scan.
//!
//! A `.log` file is a sequence of records, back to back, with no file header:
//!
//! ```text
//! [record header, 64 B][stamped batch, batch_length B][record header][batch]...
//! ```
//!
//! The batch bytes are the client batch after [`cairn_wire::batch::stamp`], byte for byte
//! (256-byte batch header + frames), so a whole batch can be served to a poll without
//! re-encoding. The envelope carries what the batch itself cannot prove: that the bytes are
//! whole, that they belong to this partition, and that no record before them went missing.
//!
//! # Record header (little-endian, 64 bytes, no padding)
//!
//! | Off | Size | Field             | Fault it detects |
//! |-----|------|-------------------|------------------|
//! | 0   | 4    | `magic` = `"CRNR"`| a position that is not a record start (misdirected read, garbage, zeros) |
//! | 4   | 1    | `version` = 1     | a file written by an incompatible format version |
//! | 5   | 1    | `kind`            | an unknown record kind: 1 = batch, 2 = gap, 3 = op (see below) |
//! | 6   | 2    | reserved, zero    | garbage in the header; room for later flags |
//! | 8   | 8    | `checksum`        | torn write and bit flips anywhere in header bytes 16..64 or the batch: XXH3-64 (seed 0) over header bytes 16..64, then the batch bytes |
//! | 16  | 8    | `parent_checksum` | a lost, duplicated or reordered record: the `checksum` of the previous record of this partition (0 before the first record; across segments, the last checksum of the previous segment) |
//! | 24  | 8    | `op`              | a lost or replayed record: per-partition record sequence number, 1 for the first record, +1 per record; in a journal log, the VSR op (see "Journal logs") |
//! | 32  | 4    | `view`            | (replication) the view of the prepare the record belongs to; 0 outside a journal log |
//! | 36  | 4    | `partition_id`    | a foreign record: a checksum-valid record of another partition (misdirected write, files copied between directories) |
//! | 40  | 8    | `base_offset`     | a lost or reordered record: must equal the previous record's `base_offset + message_count` |
//! | 48  | 4    | `message_count`   | offset continuity (with `base_offset`); must match the batch header; 0 exactly for a gap |
//! | 52  | 4    | `batch_length`    | where the record ends; bounded by the remaining bytes and [`BATCH_BYTES_MAX`] before use (exactly [`GAP_BODY_SIZE`] for a gap) |
//! | 56  | 8    | `timestamp_us`    | must match the batch's stamped `base_timestamp`; serves timestamp lookups |
//!
//! Bytes 0..8 are not covered by the checksum, so each is checked against its only legal value.
//!
//! # Gap records (kind 2)
//!
//! After an unclean stop, minting resumes at the durable offset reservation, which may lie
//! above the recovered end of the log (durability contract, guarantees 2 and 5). The skipped
//! range is recorded durably by a *gap record*: the same 64-byte envelope with `kind` = 2,
//! `message_count` = 0, `base_offset` = the offset minting resumes at (strictly above the
//! previous end), and a [`GAP_BODY_SIZE`]-byte body instead of a batch:
//!
//! | Off | Size | Field                  | Fault it detects |
//! |-----|------|------------------------|------------------|
//! | 0   | 8    | `previous_end_offset`  | a gap that does not start where the log ended (must equal the chain's next offset) |
//! | 8   | 8    | reserved, zero         | garbage; room for later fields |
//!
//! A gap record is chained like any record (parent checksum, op) and *seals* its segment: it
//! is the last record of its `.log`, and the next segment's base offset is the gap's
//! `base_offset`. So offsets stay contiguous inside every segment, and the segment-chain check
//! (next base = previous chain end) tells an intended gap (a verified gap record says so) from
//! a lost segment (nothing does). A checksum-valid record after a gap in the same segment is
//! damage.
//!
//! # Journal logs and op records (kind 3)
//!
//! A partition group's segment log is its VSR journal ([`OpRule::PerPrepare`]): `op` is the
//! VSR op of the prepare a record belongs to. Every op begins with one *op record*: `kind` =
//! 3, `message_count` = the number of batch records of its op that follow it (0 for an op
//! that is not an append; 0 too in journals written before the count was recorded, which is
//! why only an open that keeps unsynced ops relies on it), `base_offset` = the chain's next
//! offset, or above it for an op that skips offsets (see below), `timestamp_us` = the
//! prepare's timestamp, and a payload the journal's writer defines (at
//! most [`BATCH_BYTES_MAX`] bytes; the partition shell puts the prepare's VSR header there,
//! and the body of any op that is not an append). An append's batches follow it as batch
//! records with the same op. The op rule becomes: an op record carries the chain's next op (a
//! new prepare), a batch record the op of the record before it. Polls and the index skip op
//! records. A record log ([`OpRule::PerRecord`], every log written before replication) holds
//! no op records: one there is damage.
//!
//! An op record whose `base_offset` lies above the chain's next offset *skips* the offsets
//! between: the journal's deliberate gap (after an unclean stop in `relaxed` mode, minting
//! resumes at the durable reservation, guarantees 2 and 5). It is chained and verified like
//! any record, so an intended gap is told from a lost record by the record that says so; the
//! journal seals the segment after it, so the offsets of a segment's batches stay contiguous.
//!
//! # Scan classification
//!
//! [`scan`] walks records from the start of a `.log` and verifies each one: header shape,
//! bounds, checksum, then the chain (partition, offset continuity, parent checksum, op, batch
//! header agreement). The valid prefix is every record up to the first one that fails. What
//! follows the valid prefix is classified by this rule:
//!
//! 1. **Clean**: the valid prefix is the whole input.
//! 2. **Damaged**: the first failing record *verifies* (its checksum matches) but breaks the
//!    chain: a foreign partition, a non-continuing offset, a wrong parent or op, a batch header
//!    that disagrees with the envelope. A whole, checksum-valid record is never the product of a
//!    torn write, so it is never adopted and never cut away.
//! 3. **Damaged**: the first failing record does not verify, and a *probe* of the bytes after it
//!    finds a record that does verify and could belong after the valid prefix (this partition,
//!    `base_offset >=` the next expected offset). A torn write only ever leaves one partial record
//!    at the very end, so a whole record after the failure means damage in the middle (a bit
//!    flip, a lost range), not a torn tail.
//! 4. **Damaged**: the probe ran out of its hashing budget before deciding (adversarial residue).
//!    A probe that cannot decide refuses; it never truncates.
//! 5. **TornTail** otherwise: the failing record (a partial header, a length that overruns the
//!    input, a checksum mismatch) has nothing verifiable after it.
//!
//! With a durable frontier ([`scan_from`] with `durable_len_bytes` > 0), every byte below the
//! frontier was covered by a successful barrier before it was published, so a crash cannot
//! have torn it: any failure that starts below the frontier, a record straddling it, or an
//! input that ends before it is **Damaged**. Rules 1-5 apply from the frontier on.
//!
//! # Cost
//!
//! Recovery is linear in the input. The walk hashes every byte at most once. The probe tests
//! every byte position after the failure with constant-time checks (magic, shape, partition,
//! offset, a length bounded by the remaining bytes and by [`BATCH_BYTES_MAX`]); only candidates
//! that pass are hashed, and the total hashed bytes are capped by [`probe_budget_bytes`]. A length
//! field is never used before it is bounded, so header-shaped residue claiming huge sizes costs a
//! few comparisons per byte.
//!
//! Known limits of the rule:
//! - Above the durable frontier, a bit flip in the *last* record of a log is
//!   indistinguishable from a torn write and is classified TornTail (durability contract,
//!   scenario 8). Below the frontier it is Damaged.
//! - The rule assumes unsynced writes to one file reach the disk in issue order (a prefix
//!   survives a power loss). A device that persisted a later unsynced record but not an earlier
//!   one would be classified Damaged: a false refusal, never a false truncation.
//! - A torn record whose payload happens to embed a whole, valid record of this partition with
//!   a future offset is classified Damaged: a false refusal, never a false truncation.

use cairn_wire::batch::{self, BATCH_HEADER_SIZE};
use std::fmt;
use xxhash_rust::xxh3::Xxh3;

pub const RECORD_HEADER_SIZE: usize = 64;
pub const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"CRNR");
pub const RECORD_VERSION: u8 = 1;
/// The record holds one stamped message batch.
pub const RECORD_KIND_BATCH: u8 = 1;
/// The record declares an intended offset gap and seals its segment (see the module doc).
pub const RECORD_KIND_GAP: u8 = 2;
/// The record holds one VSR op's body that is not an append (journal logs only).
pub const RECORD_KIND_OP: u8 = 3;
/// Size of a gap record's body: `previous_end_offset u64`, 8 reserved zero bytes.
pub const GAP_BODY_SIZE: usize = 16;

/// Plausibility ceiling on a stored batch (header + frames). Recovery never trusts a larger
/// `batch_length`, and `append` refuses larger batches so that everything written can be
/// recovered. The server's admission limit (`BatchLimits::batch_bytes_max`) must not exceed it.
pub const BATCH_BYTES_MAX: u32 = 256 * 1024 * 1024;

/// Hashing allowance of a probe beyond twice the probed region (see [`probe_budget_bytes`]).
pub const PROBE_BUDGET_SLACK_BYTES: u64 = 1024 * 1024;

const OFFSET_MAGIC: usize = 0;
const OFFSET_VERSION: usize = 4;
const OFFSET_KIND: usize = 5;
const OFFSET_RESERVED: usize = 6;
const OFFSET_CHECKSUM: usize = 8;
const OFFSET_PARENT_CHECKSUM: usize = 16;
const OFFSET_OP: usize = 24;
const OFFSET_VIEW: usize = 32;
const OFFSET_PARTITION_ID: usize = 36;
const OFFSET_BASE_OFFSET: usize = 40;
const OFFSET_MESSAGE_COUNT: usize = 48;
const OFFSET_BATCH_LENGTH: usize = 52;
const OFFSET_TIMESTAMP: usize = 56;
/// The checksum covers the header from here on (everything after the checksum field).
const CHECKSUM_COVERAGE_START: usize = OFFSET_CHECKSUM + 8;

// The layout tiles the header exactly: each field starts where the previous one ends.
const _: () = assert!(OFFSET_VERSION == OFFSET_MAGIC + 4);
const _: () = assert!(OFFSET_KIND == OFFSET_VERSION + 1);
const _: () = assert!(OFFSET_RESERVED == OFFSET_KIND + 1);
const _: () = assert!(OFFSET_CHECKSUM == OFFSET_RESERVED + 2);
const _: () = assert!(OFFSET_PARENT_CHECKSUM == OFFSET_CHECKSUM + 8);
const _: () = assert!(OFFSET_OP == OFFSET_PARENT_CHECKSUM + 8);
const _: () = assert!(OFFSET_VIEW == OFFSET_OP + 8);
const _: () = assert!(OFFSET_PARTITION_ID == OFFSET_VIEW + 4);
const _: () = assert!(OFFSET_BASE_OFFSET == OFFSET_PARTITION_ID + 4);
const _: () = assert!(OFFSET_MESSAGE_COUNT == OFFSET_BASE_OFFSET + 8);
const _: () = assert!(OFFSET_BATCH_LENGTH == OFFSET_MESSAGE_COUNT + 4);
const _: () = assert!(OFFSET_TIMESTAMP == OFFSET_BATCH_LENGTH + 4);
const _: () = assert!(OFFSET_TIMESTAMP + 8 == RECORD_HEADER_SIZE);
// Every record fits a u32 index position when it starts a segment.
const _: () = assert!((RECORD_HEADER_SIZE as u64) + (BATCH_BYTES_MAX as u64) <= u32::MAX as u64);
const _: () = assert!(BATCH_HEADER_SIZE as u64 <= BATCH_BYTES_MAX as u64);
// A gap body can never be mistaken for a batch length and vice versa.
const _: () = assert!(GAP_BODY_SIZE < BATCH_HEADER_SIZE);

/// What a record holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordKind {
    /// One stamped message batch (`message_count` > 0).
    Batch,
    /// An intended offset gap (`message_count` = 0); seals its segment.
    Gap,
    /// A VSR op's body that is not an append (`message_count` = 0; journal logs only).
    Op,
}

/// What the `op` field of a log's records counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpRule {
    /// Records: +1 per record (every log written before replication).
    PerRecord,
    /// VSR ops: a new prepare's records carry the next op, its later batches the same op.
    PerPrepare,
}

impl RecordKind {
    pub fn to_byte(self) -> u8 {
        match self {
            RecordKind::Batch => RECORD_KIND_BATCH,
            RecordKind::Gap => RECORD_KIND_GAP,
            RecordKind::Op => RECORD_KIND_OP,
        }
    }

    pub fn from_byte(byte: u8) -> Option<RecordKind> {
        match byte {
            RECORD_KIND_BATCH => Some(RecordKind::Batch),
            RECORD_KIND_GAP => Some(RecordKind::Gap),
            RECORD_KIND_OP => Some(RecordKind::Op),
            _ => None,
        }
    }
}

/// The body of a gap record that continues a log ending at `previous_end_offset`.
pub fn gap_body(previous_end_offset: u64) -> [u8; GAP_BODY_SIZE] {
    let mut body = [0u8; GAP_BODY_SIZE];
    body[..8].copy_from_slice(&previous_end_offset.to_le_bytes());
    body
}

/// `previous_end_offset` of a gap body, or `None` if the body is malformed.
pub fn decode_gap_body(body: &[u8]) -> Option<u64> {
    if body.len() != GAP_BODY_SIZE || body[8..].iter().any(|&byte| byte != 0) {
        return None;
    }
    Some(get_u64(body, 0))
}

/// The decoded fields of a record header (magic, version and reserved bytes have a single
/// legal value each and are not stored).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    pub kind: RecordKind,
    pub checksum: u64,
    pub parent_checksum: u64,
    pub op: u64,
    pub view: u32,
    pub partition_id: u32,
    pub base_offset: u64,
    pub message_count: u32,
    pub batch_length_bytes: u32,
    pub timestamp_us: u64,
}

impl RecordHeader {
    /// The encoded header, `checksum` written as is.
    pub fn encode(&self) -> [u8; RECORD_HEADER_SIZE] {
        let mut bytes = [0u8; RECORD_HEADER_SIZE];
        put_u32(&mut bytes, OFFSET_MAGIC, RECORD_MAGIC);
        bytes[OFFSET_VERSION] = RECORD_VERSION;
        bytes[OFFSET_KIND] = self.kind.to_byte();
        put_u64(&mut bytes, OFFSET_CHECKSUM, self.checksum);
        put_u64(&mut bytes, OFFSET_PARENT_CHECKSUM, self.parent_checksum);
        put_u64(&mut bytes, OFFSET_OP, self.op);
        put_u32(&mut bytes, OFFSET_VIEW, self.view);
        put_u32(&mut bytes, OFFSET_PARTITION_ID, self.partition_id);
        put_u64(&mut bytes, OFFSET_BASE_OFFSET, self.base_offset);
        put_u32(&mut bytes, OFFSET_MESSAGE_COUNT, self.message_count);
        put_u32(&mut bytes, OFFSET_BATCH_LENGTH, self.batch_length_bytes);
        put_u64(&mut bytes, OFFSET_TIMESTAMP, self.timestamp_us);
        bytes
    }

    /// Compute the checksum over `self` and `batch`, store it, and return the encoded header.
    pub fn seal(&mut self, batch: &[u8]) -> [u8; RECORD_HEADER_SIZE] {
        self.seal_parts(&[batch])
    }

    /// [`RecordHeader::seal`] for a batch given in pieces that follow each other on disk
    /// (e.g. a stamped batch header and the client's frames), so the batch never has to be
    /// copied into one buffer to be sealed.
    pub fn seal_parts(&mut self, batch_parts: &[&[u8]]) -> [u8; RECORD_HEADER_SIZE] {
        debug_assert_eq!(
            batch_parts.iter().map(|part| part.len() as u64).sum::<u64>(),
            u64::from(self.batch_length_bytes)
        );
        let mut bytes = self.encode();
        let mut hasher = Xxh3::new();
        hasher.update(&bytes[CHECKSUM_COVERAGE_START..]);
        for part in batch_parts {
            hasher.update(part);
        }
        self.checksum = hasher.digest();
        put_u64(&mut bytes, OFFSET_CHECKSUM, self.checksum);
        debug_assert_eq!(decode(&bytes), Ok(*self));
        bytes
    }

    /// Size of the whole record (header + batch).
    pub fn record_size_bytes(&self) -> u64 {
        RECORD_HEADER_SIZE as u64 + u64::from(self.batch_length_bytes)
    }
}

/// Decode a header, checking the fields that have a single legal value. Does not verify the
/// checksum (that needs the batch bytes) nor bound `batch_length_bytes`.
pub fn decode(bytes: &[u8]) -> Result<RecordHeader, Fault> {
    let Some(bytes) = bytes.get(..RECORD_HEADER_SIZE) else {
        return Err(Fault::ShortHeader);
    };
    if get_u32(bytes, OFFSET_MAGIC) != RECORD_MAGIC {
        return Err(Fault::BadMagic);
    }
    if bytes[OFFSET_VERSION] != RECORD_VERSION {
        return Err(Fault::BadVersion(bytes[OFFSET_VERSION]));
    }
    let Some(kind) = RecordKind::from_byte(bytes[OFFSET_KIND]) else {
        return Err(Fault::BadKind(bytes[OFFSET_KIND]));
    };
    if bytes[OFFSET_RESERVED..OFFSET_CHECKSUM] != [0, 0] {
        return Err(Fault::NonZeroReserved);
    }
    Ok(RecordHeader {
        kind,
        checksum: get_u64(bytes, OFFSET_CHECKSUM),
        parent_checksum: get_u64(bytes, OFFSET_PARENT_CHECKSUM),
        op: get_u64(bytes, OFFSET_OP),
        view: get_u32(bytes, OFFSET_VIEW),
        partition_id: get_u32(bytes, OFFSET_PARTITION_ID),
        base_offset: get_u64(bytes, OFFSET_BASE_OFFSET),
        message_count: get_u32(bytes, OFFSET_MESSAGE_COUNT),
        batch_length_bytes: get_u32(bytes, OFFSET_BATCH_LENGTH),
        timestamp_us: get_u64(bytes, OFFSET_TIMESTAMP),
    })
}

/// XXH3-64 over the header bytes after the checksum field, then the batch bytes.
pub fn compute_checksum(header: &[u8; RECORD_HEADER_SIZE], batch: &[u8]) -> u64 {
    let mut hasher = Xxh3::new();
    hasher.update(&header[CHECKSUM_COVERAGE_START..]);
    hasher.update(batch);
    hasher.digest()
}

/// Where a partition's record chain stands: what the next record must carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chain {
    pub partition_id: u32,
    /// `base_offset` of the next record.
    pub next_offset: u64,
    /// `parent_checksum` of the next record (the previous record's checksum, 0 at the start).
    pub parent_checksum: u64,
    /// `op` of the next record (>= 1).
    pub next_op: u64,
}

impl Chain {
    /// The chain of a partition that has never held a record.
    pub fn genesis(partition_id: u32) -> Chain {
        Chain {
            partition_id,
            next_offset: 0,
            parent_checksum: 0,
            next_op: 1,
        }
    }

    /// The chain after `header` was appended. `header` must continue `self`: a batch at
    /// `next_offset`, or a gap that jumps `next_offset` forward to its `base_offset`.
    pub fn advance(&self, header: &RecordHeader) -> Chain {
        debug_assert_eq!(header.op, self.next_op);
        self.advance_by(header, OpRule::PerRecord)
    }

    /// [`Chain::advance`] under `rule`: in a journal log the next op is the record's op + 1.
    pub fn advance_by(&self, header: &RecordHeader, rule: OpRule) -> Chain {
        debug_assert!(self.op_fits(header, rule));
        let next_offset = match header.kind {
            RecordKind::Batch => {
                debug_assert_eq!(header.base_offset, self.next_offset);
                debug_assert!(header.message_count > 0);
                self.next_offset + u64::from(header.message_count)
            }
            RecordKind::Gap => {
                debug_assert!(header.base_offset > self.next_offset);
                debug_assert_eq!(header.message_count, 0);
                header.base_offset
            }
            // An op record moves no offset, or skips to its base offset.
            RecordKind::Op => {
                debug_assert!(header.base_offset >= self.next_offset);
                header.base_offset
            }
        };
        let next_op = match rule {
            OpRule::PerRecord => self.next_op + 1,
            OpRule::PerPrepare => header.op + 1,
        };
        Chain {
            partition_id: self.partition_id,
            next_offset,
            parent_checksum: header.checksum,
            next_op,
        }
    }

    /// Whether `header`'s op may follow this chain under `rule` (see the module doc).
    pub fn op_fits(&self, header: &RecordHeader, rule: OpRule) -> bool {
        match rule {
            OpRule::PerRecord => header.op == self.next_op,
            OpRule::PerPrepare => match header.kind {
                // A batch continues the op its op record began.
                RecordKind::Batch => header.op >= 1 && header.op + 1 == self.next_op,
                RecordKind::Op | RecordKind::Gap => header.op == self.next_op,
            },
        }
    }
}

/// Why a record failed verification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Fewer than 64 bytes left.
    ShortHeader,
    BadMagic,
    BadVersion(u8),
    BadKind(u8),
    NonZeroReserved,
    /// `batch_length` below the batch header size or above [`BATCH_BYTES_MAX`].
    ImplausibleLength(u32),
    /// The record claims more bytes than remain.
    Overrun {
        record_size_bytes: u64,
        remaining_bytes: u64,
    },
    ChecksumMismatch,
    // The faults below belong to checksum-valid records: never a torn write.
    ForeignPartition {
        found: u32,
        expected: u32,
    },
    OffsetDiscontinuity {
        found: u64,
        expected: u64,
    },
    ParentMismatch {
        found: u64,
        expected: u64,
    },
    OpMismatch {
        found: u64,
        expected: u64,
    },
    EmptyRecord,
    OffsetOverflow,
    BatchHeaderMismatch(&'static str),
    /// A gap record whose `base_offset` does not lie above the chain's next offset.
    GapNotForward {
        found: u64,
        next_offset: u64,
    },
    /// A gap record whose body does not start where the chain ends (or is malformed).
    GapBodyMismatch,
    /// A gap record that claims messages.
    GapWithMessages,
    /// A checksum-valid record after the gap record that sealed its segment.
    RecordAfterGap,
    /// A checksum-valid op record that does not continue the chain where it stands (it must
    /// not move the offset), or one in a log that is not a journal.
    OpRecordMisplaced,
    /// Below the durable frontier the input ends, or a record straddles the frontier.
    FrontierBoundary,
}

impl Fault {
    /// Whether the record verified (checksum matched) and only its place in the chain is wrong.
    pub fn record_verified(&self) -> bool {
        matches!(
            self,
            Fault::ForeignPartition { .. }
                | Fault::OffsetDiscontinuity { .. }
                | Fault::ParentMismatch { .. }
                | Fault::OpMismatch { .. }
                | Fault::EmptyRecord
                | Fault::OffsetOverflow
                | Fault::BatchHeaderMismatch(_)
                | Fault::GapNotForward { .. }
                | Fault::GapBodyMismatch
                | Fault::GapWithMessages
                | Fault::RecordAfterGap
                | Fault::OpRecordMisplaced
        )
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::ShortHeader => write!(f, "partial record header"),
            Fault::BadMagic => write!(f, "bad record magic"),
            Fault::BadVersion(v) => write!(f, "unknown record version {v}"),
            Fault::BadKind(k) => write!(f, "unknown record kind {k}"),
            Fault::NonZeroReserved => write!(f, "non-zero reserved header bytes"),
            Fault::ImplausibleLength(len) => write!(f, "implausible batch length {len}"),
            Fault::Overrun {
                record_size_bytes,
                remaining_bytes,
            } => {
                write!(
                    f,
                    "record of {record_size_bytes} bytes overruns the {remaining_bytes} remaining"
                )
            }
            Fault::ChecksumMismatch => write!(f, "record checksum mismatch"),
            Fault::ForeignPartition { found, expected } => {
                write!(f, "record of partition {found} in partition {expected}")
            }
            Fault::OffsetDiscontinuity { found, expected } => {
                write!(f, "record base offset {found}, expected {expected}")
            }
            Fault::ParentMismatch { found, expected } => {
                write!(
                    f,
                    "record parent checksum {found:#018x}, expected {expected:#018x}"
                )
            }
            Fault::OpMismatch { found, expected } => write!(f, "record op {found}, expected {expected}"),
            Fault::EmptyRecord => write!(f, "record holds no messages"),
            Fault::OffsetOverflow => write!(f, "record offsets overflow u64"),
            Fault::BatchHeaderMismatch(field) => {
                write!(f, "batch header {field} disagrees with the record header")
            }
            Fault::GapNotForward { found, next_offset } => {
                write!(f, "gap record to offset {found} does not lie above {next_offset}")
            }
            Fault::GapBodyMismatch => write!(f, "gap record body does not continue the log"),
            Fault::GapWithMessages => write!(f, "gap record claims messages"),
            Fault::RecordAfterGap => write!(f, "record after the gap record that sealed its segment"),
            Fault::FrontierBoundary => write!(f, "record boundary does not meet the durable frontier"),
            Fault::OpRecordMisplaced => write!(
                f,
                "op record out of place (in a record log, or moving the offset)"
            ),
        }
    }
}

/// One verified batch record, as found by [`scan`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScannedRecord {
    /// Byte position of the record header in the scanned input.
    pub position_bytes: u64,
    pub base_offset: u64,
    pub message_count: u32,
    pub timestamp_us: u64,
    /// Header + batch.
    pub size_bytes: u64,
    /// The record's op: its sequence number in a record log, its VSR op in a journal log.
    pub op: u64,
    /// The view of the record's prepare (journal logs; 0 otherwise).
    pub view: u32,
    /// The record's checksum: the next record's parent.
    pub checksum: u64,
}

/// One verified op record (journal logs), as found by [`scan`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScannedOpRecord {
    /// Byte position of the record header in the scanned input.
    pub position_bytes: u64,
    pub op: u64,
    pub view: u32,
    pub timestamp_us: u64,
    /// Header + body.
    pub size_bytes: u64,
    /// The record's checksum: the next record's parent.
    pub checksum: u64,
    /// The offset after it: the chain's next offset, or above it for a skip.
    pub base_offset: u64,
    /// Batch records of its op that follow it (its `message_count`; see the module doc).
    pub batch_count: u32,
}

/// The verified gap record that sealed the scanned segment, as found by [`scan`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScannedGap {
    /// Byte position of the gap record in the scanned input.
    pub position_bytes: u64,
    /// Where the log ended before the gap.
    pub previous_end_offset: u64,
    /// Where minting resumes (the next segment's base offset).
    pub next_offset: u64,
    /// Header + body.
    pub size_bytes: u64,
}

/// What follows the valid prefix (see the module doc for the rule).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tail {
    /// The input ends exactly after the last valid record.
    Clean,
    /// Recoverable: the bytes from the end of the valid prefix on are a torn write.
    Torn { fault: Fault },
    /// Not recoverable by truncation: refuse, keep the bytes.
    Damaged { position_bytes: u64, reason: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanResult {
    /// Length of the valid prefix (a record boundary).
    pub valid_len_bytes: u64,
    /// Every batch record of the valid prefix, in order.
    pub records: Vec<ScannedRecord>,
    /// Every op record of the valid prefix, in order (journal logs only).
    pub op_records: Vec<ScannedOpRecord>,
    /// The gap record ending the valid prefix, if one sealed the segment.
    ///
    /// Invariant: `Some` ⇒ it is the last record of the valid prefix
    /// (`position_bytes + size_bytes == valid_len_bytes`).
    pub gap: Option<ScannedGap>,
    /// The chain after the valid prefix.
    pub end: Chain,
    /// The chain at byte `durable_len_bytes` of [`scan_from`] (a record boundary), if the valid
    /// prefix reaches it. Always `Some(start)` for a durable length of 0.
    pub durable_end: Option<Chain>,
    pub tail: Tail,
}

/// Walk the records of `bytes` (a whole `.log`), verifying each against the chain, starting
/// at `start`. Pure: no IO, linear cost, never panics on any input. No durable frontier: the
/// classification rule of the module doc applies from byte 0.
pub fn scan(bytes: &[u8], start: Chain) -> ScanResult {
    scan_from(bytes, start, 0)
}

/// [`scan`] with a durable frontier at byte `durable_len_bytes`: a failure below it (or an
/// input ending before it, or a record straddling it) is [`Tail::Damaged`], never torn.
pub fn scan_from(bytes: &[u8], start: Chain, durable_len_bytes: u64) -> ScanResult {
    scan_with(bytes, start, durable_len_bytes, OpRule::PerRecord)
}

/// [`scan_from`] under `rule`: [`OpRule::PerPrepare`] for a journal log.
pub fn scan_with(bytes: &[u8], start: Chain, durable_len_bytes: u64, rule: OpRule) -> ScanResult {
    let mut records = Vec::new();
    let mut op_records = Vec::new();
    let mut gap: Option<ScannedGap> = None;
    let mut chain = start;
    let mut durable_end = (durable_len_bytes == 0).then_some(start);
    let mut position: usize = 0;
    let below_frontier = |position: usize, fault: &dyn fmt::Display| Tail::Damaged {
        position_bytes: position as u64,
        reason: format!(
            "record below the durable frontier (byte {durable_len_bytes}) fails verification: {fault}"
        ),
    };
    let tail = loop {
        debug_assert!(position <= bytes.len());
        let rest = &bytes[position..];
        if rest.is_empty() {
            break Tail::Clean;
        }
        let verified = verify_with(rest, &chain, rule).and_then(|header| {
            // A gap seals its segment: nothing may verify after it.
            if gap.is_some() {
                Err(Fault::RecordAfterGap)
            } else {
                Ok(header)
            }
        });
        match verified {
            Ok(header) => {
                let size_bytes = header.record_size_bytes();
                let end_bytes = position as u64 + size_bytes;
                if (position as u64) < durable_len_bytes && end_bytes > durable_len_bytes {
                    break below_frontier(position, &Fault::FrontierBoundary);
                }
                match header.kind {
                    RecordKind::Batch => records.push(ScannedRecord {
                        position_bytes: position as u64,
                        base_offset: header.base_offset,
                        message_count: header.message_count,
                        timestamp_us: header.timestamp_us,
                        size_bytes,
                        op: header.op,
                        view: header.view,
                        checksum: header.checksum,
                    }),
                    RecordKind::Op => op_records.push(ScannedOpRecord {
                        position_bytes: position as u64,
                        op: header.op,
                        view: header.view,
                        timestamp_us: header.timestamp_us,
                        size_bytes,
                        checksum: header.checksum,
                        base_offset: header.base_offset,
                        batch_count: header.message_count,
                    }),
                    RecordKind::Gap => {
                        gap = Some(ScannedGap {
                            position_bytes: position as u64,
                            previous_end_offset: chain.next_offset,
                            next_offset: header.base_offset,
                            size_bytes,
                        })
                    }
                }
                chain = chain.advance_by(&header, rule);
                // `verify` bounded the record by `rest`, so this stays within `bytes`.
                position += size_bytes as usize;
                if position as u64 == durable_len_bytes {
                    durable_end = Some(chain);
                }
            }
            Err(fault) if (position as u64) < durable_len_bytes => {
                break below_frontier(position, &fault);
            }
            Err(fault) if fault.record_verified() => {
                break Tail::Damaged {
                    position_bytes: position as u64,
                    reason: format!("checksum-valid record does not continue the log: {fault}"),
                };
            }
            Err(fault) => {
                break classify_unverified(bytes, position, &chain, fault);
            }
        }
    };
    let tail = if tail == Tail::Clean && (position as u64) < durable_len_bytes {
        Tail::Damaged {
            position_bytes: position as u64,
            reason: format!(
                "log ends at byte {position}, below its durable frontier at byte {durable_len_bytes}"
            ),
        }
    } else {
        tail
    };
    debug_assert!(gap.is_none_or(|gap| gap.position_bytes + gap.size_bytes == position as u64));
    ScanResult {
        valid_len_bytes: position as u64,
        records,
        op_records,
        gap,
        end: chain,
        durable_end,
        tail,
    }
}

/// The most a probe hashes after a failure at `position` in an input of `len` bytes: twice the
/// probed region plus a constant, so recovery stays within a small factor of reading once.
pub fn probe_budget_bytes(len_bytes: u64, position_bytes: u64) -> u64 {
    debug_assert!(position_bytes <= len_bytes);
    2 * (len_bytes - position_bytes) + PROBE_BUDGET_SLACK_BYTES
}

/// Verify the record at the start of `rest` as the next record of `chain`. Returns the header;
/// the record spans `header.record_size_bytes()` bytes of `rest`.
pub fn verify(rest: &[u8], chain: &Chain) -> Result<RecordHeader, Fault> {
    verify_with(rest, chain, OpRule::PerRecord)
}

/// [`verify`] under `rule`.
pub fn verify_with(rest: &[u8], chain: &Chain, rule: OpRule) -> Result<RecordHeader, Fault> {
    let header = verify_envelope(rest)?;
    let body = &rest[RECORD_HEADER_SIZE..header.record_size_bytes() as usize];
    verify_in_chain(&header, body, chain, rule)?;
    Ok(header)
}

/// The chain checks on a record whose envelope verified: it must be the next record of
/// `chain` under `rule`.
pub fn verify_in_chain(header: &RecordHeader, body: &[u8], chain: &Chain, rule: OpRule) -> Result<(), Fault> {
    match header.kind {
        RecordKind::Batch => verify_chain(header, body, chain, rule),
        RecordKind::Gap => verify_gap(header, body, chain, rule),
        RecordKind::Op => verify_op_record(header, chain, rule),
    }
}

/// The place of a record in the chain: its partition, its parent and its op.
fn verify_link(header: &RecordHeader, chain: &Chain, rule: OpRule) -> Result<(), Fault> {
    verify_partition(header, chain)?;
    verify_parent_and_op(header, chain, rule)
}

fn verify_partition(header: &RecordHeader, chain: &Chain) -> Result<(), Fault> {
    if header.partition_id != chain.partition_id {
        return Err(Fault::ForeignPartition {
            found: header.partition_id,
            expected: chain.partition_id,
        });
    }
    Ok(())
}

fn verify_parent_and_op(header: &RecordHeader, chain: &Chain, rule: OpRule) -> Result<(), Fault> {
    if header.parent_checksum != chain.parent_checksum {
        return Err(Fault::ParentMismatch {
            found: header.parent_checksum,
            expected: chain.parent_checksum,
        });
    }
    if !chain.op_fits(header, rule) {
        return Err(Fault::OpMismatch {
            found: header.op,
            expected: chain.next_op,
        });
    }
    Ok(())
}

/// The checks on a checksum-valid op record: chained like any record, in a journal log, at the
/// chain's next offset or above it (a skip).
fn verify_op_record(header: &RecordHeader, chain: &Chain, rule: OpRule) -> Result<(), Fault> {
    debug_assert_eq!(header.kind, RecordKind::Op);
    verify_link(header, chain, rule)?;
    if rule != OpRule::PerPrepare || header.base_offset < chain.next_offset {
        return Err(Fault::OpRecordMisplaced);
    }
    Ok(())
}

/// The checks on a checksum-valid gap record: chained like any record, jumping forward from
/// exactly where the chain ends.
fn verify_gap(header: &RecordHeader, body: &[u8], chain: &Chain, rule: OpRule) -> Result<(), Fault> {
    debug_assert_eq!(header.kind, RecordKind::Gap);
    verify_link(header, chain, rule)?;
    if header.message_count != 0 {
        return Err(Fault::GapWithMessages);
    }
    if header.base_offset <= chain.next_offset {
        return Err(Fault::GapNotForward {
            found: header.base_offset,
            next_offset: chain.next_offset,
        });
    }
    if decode_gap_body(body) != Some(chain.next_offset) {
        return Err(Fault::GapBodyMismatch);
    }
    Ok(())
}

/// Shape, bounds and checksum of the record at the start of `rest` (no chain checks).
/// On success the whole record lies within `rest`.
pub fn verify_envelope(rest: &[u8]) -> Result<RecordHeader, Fault> {
    let header = decode(rest)?;
    let record_size_bytes = bounded_record_size(&header, rest.len() as u64)?;
    let header_bytes: &[u8; RECORD_HEADER_SIZE] = rest[..RECORD_HEADER_SIZE]
        .try_into()
        .map_err(|_| Fault::ShortHeader)?;
    let batch = &rest[RECORD_HEADER_SIZE..record_size_bytes as usize];
    if compute_checksum(header_bytes, batch) != header.checksum {
        return Err(Fault::ChecksumMismatch);
    }
    Ok(header)
}

/// [`verify_envelope`] for a record read in pieces, so that a large record need not be held
/// whole: [`EnvelopeInPieces::begin`] checks the header's shape and bounds, `update` takes
/// the batch bytes in order, [`EnvelopeInPieces::finish`] compares the checksum. The same
/// verdicts as [`verify_envelope`] over the whole record.
#[derive(Clone)]
pub struct EnvelopeInPieces {
    header: RecordHeader,
    hasher: Xxh3,
    batch_bytes_left: u64,
}

impl EnvelopeInPieces {
    /// `head`: the record's first bytes, at least its header; `available_bytes`: how many
    /// bytes the record may occupy from its start.
    pub fn begin(head: &[u8], available_bytes: u64) -> Result<EnvelopeInPieces, Fault> {
        let header = decode(head)?;
        bounded_record_size(&header, available_bytes)?;
        let mut hasher = Xxh3::new();
        hasher.update(&head[CHECKSUM_COVERAGE_START..RECORD_HEADER_SIZE]);
        Ok(EnvelopeInPieces {
            header,
            hasher,
            batch_bytes_left: u64::from(header.batch_length_bytes),
        })
    }

    /// The decoded header: its checksum is not yet verified.
    pub fn header(&self) -> &RecordHeader {
        &self.header
    }

    /// The next bytes of the batch, in order; never more than the header's batch length.
    pub fn update(&mut self, batch_piece: &[u8]) {
        let len = batch_piece.len() as u64;
        assert!(
            len <= self.batch_bytes_left,
            "more batch bytes than the record header declares"
        );
        self.batch_bytes_left -= len;
        self.hasher.update(batch_piece);
    }

    /// Once every batch byte was given: the header, if the checksum matches.
    pub fn finish(self) -> Result<RecordHeader, Fault> {
        assert_eq!(self.batch_bytes_left, 0, "the checksum needs every batch byte");
        if self.hasher.digest() != self.header.checksum {
            return Err(Fault::ChecksumMismatch);
        }
        Ok(self.header)
    }
}

/// The record size, once `batch_length` is known plausible and within `remaining_bytes`.
fn bounded_record_size(header: &RecordHeader, remaining_bytes: u64) -> Result<u64, Fault> {
    let batch_length = header.batch_length_bytes;
    let plausible = match header.kind {
        RecordKind::Batch => (batch_length as usize) >= BATCH_HEADER_SIZE && batch_length <= BATCH_BYTES_MAX,
        RecordKind::Gap => batch_length as usize == GAP_BODY_SIZE,
        RecordKind::Op => batch_length <= BATCH_BYTES_MAX,
    };
    if !plausible {
        return Err(Fault::ImplausibleLength(batch_length));
    }
    let record_size_bytes = header.record_size_bytes();
    if record_size_bytes > remaining_bytes {
        return Err(Fault::Overrun {
            record_size_bytes,
            remaining_bytes,
        });
    }
    Ok(record_size_bytes)
}

/// The checks on a checksum-valid record: it must be the next record of `chain`, and its batch
/// header must agree with the envelope.
fn verify_chain(header: &RecordHeader, batch_bytes: &[u8], chain: &Chain, rule: OpRule) -> Result<(), Fault> {
    debug_assert_eq!(header.kind, RecordKind::Batch);
    verify_partition(header, chain)?;
    if header.base_offset != chain.next_offset {
        return Err(Fault::OffsetDiscontinuity {
            found: header.base_offset,
            expected: chain.next_offset,
        });
    }
    verify_parent_and_op(header, chain, rule)?;
    if header.message_count == 0 {
        return Err(Fault::EmptyRecord);
    }
    if header
        .base_offset
        .checked_add(u64::from(header.message_count))
        .is_none()
    {
        return Err(Fault::OffsetOverflow);
    }
    let Some(batch_header) = batch::header(batch_bytes) else {
        return Err(Fault::BatchHeaderMismatch("length"));
    };
    if batch_header.partition_id != u64::from(header.partition_id) {
        return Err(Fault::BatchHeaderMismatch("partition_id"));
    }
    if batch_header.base_offset != header.base_offset {
        return Err(Fault::BatchHeaderMismatch("base_offset"));
    }
    if batch_header.base_timestamp != header.timestamp_us {
        return Err(Fault::BatchHeaderMismatch("base_timestamp"));
    }
    if batch_header.batch_length != u64::from(header.batch_length_bytes) {
        return Err(Fault::BatchHeaderMismatch("batch_length"));
    }
    if batch_header.message_count != header.message_count {
        return Err(Fault::BatchHeaderMismatch("message_count"));
    }
    Ok(())
}

/// Decide whether an unverifiable record at `position` is a torn tail or damage, by probing the
/// bytes after it for a record that verifies and could follow `chain`.
fn classify_unverified(bytes: &[u8], position: usize, chain: &Chain, fault: Fault) -> Tail {
    debug_assert!(!fault.record_verified());
    match probe(bytes, position, chain) {
        Probe::NothingFound => Tail::Torn { fault },
        Probe::Found { position_bytes } => Tail::Damaged {
            position_bytes: position as u64,
            reason: format!(
                "record fails verification ({fault}) and a valid record follows at byte {position_bytes}"
            ),
        },
        Probe::BudgetExhausted => Tail::Damaged {
            position_bytes: position as u64,
            reason: format!(
                "record fails verification ({fault}) and the probe for valid records after it ran out of budget"
            ),
        },
    }
}

enum Probe {
    NothingFound,
    Found { position_bytes: u64 },
    BudgetExhausted,
}

/// Look for a checksum-valid record of this partition with `base_offset >= chain.next_offset`
/// starting at any byte after `failure_position`. Every position costs O(1) until a candidate
/// passes the cheap checks; hashing is capped by [`probe_budget_bytes`].
fn probe(bytes: &[u8], failure_position: usize, chain: &Chain) -> Probe {
    let len_bytes = bytes.len() as u64;
    let budget_bytes = probe_budget_bytes(len_bytes, failure_position as u64);
    let mut hashed_bytes: u64 = 0;
    let magic = RECORD_MAGIC.to_le_bytes();
    let mut position = failure_position + 1;
    while position + RECORD_HEADER_SIZE <= bytes.len() {
        let candidate = &bytes[position..];
        if candidate[..4] == magic
            && let Some(record_size_bytes) = plausible_candidate(candidate, chain)
        {
            hashed_bytes += record_size_bytes;
            if hashed_bytes > budget_bytes {
                return Probe::BudgetExhausted;
            }
            if verify_envelope(candidate).is_ok() {
                return Probe::Found {
                    position_bytes: position as u64,
                };
            }
        }
        position += 1;
    }
    Probe::NothingFound
}

/// Constant-time filter: the size of the record a candidate claims, if it could be a record of
/// this partition that belongs after `chain` and fits in the input.
fn plausible_candidate(candidate: &[u8], chain: &Chain) -> Option<u64> {
    let header = decode(candidate).ok()?;
    let could_follow = match header.kind {
        RecordKind::Batch => header.message_count > 0,
        // An op record after a failure is damage as surely as a batch.
        RecordKind::Op => true,
        RecordKind::Gap => false,
    };
    if header.partition_id != chain.partition_id || header.base_offset < chain.next_offset || !could_follow {
        return None;
    }
    bounded_record_size(&header, candidate.len() as u64).ok()
}

fn put_u32(bytes: &mut [u8], at: usize, value: u32) {
    bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
}

fn put_u64(bytes: &mut [u8], at: usize, value: u64) {
    bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
}

/// Callers pass slices of at least `RECORD_HEADER_SIZE` bytes and in-header offsets.
fn get_u32(bytes: &[u8], at: usize) -> u32 {
    let mut raw = [0u8; 4];
    raw.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(raw)
}

fn get_u64(bytes: &[u8], at: usize) -> u64 {
    let mut raw = [0u8; 8];
    raw.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(raw)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A batch with a stamped-looking header and `count` opaque frame bytes: enough for the
    /// envelope and batch-header agreement checks, which never parse frames.
    fn fake_batch(
        partition_id: u32,
        base_offset: u64,
        count: u32,
        timestamp_us: u64,
        body_bytes: usize,
    ) -> Vec<u8> {
        let length = BATCH_HEADER_SIZE + body_bytes;
        let mut batch = vec![0u8; length];
        batch[0..8].copy_from_slice(&u64::from(partition_id).to_le_bytes());
        batch[8..16].copy_from_slice(&base_offset.to_le_bytes());
        batch[16..24].copy_from_slice(&timestamp_us.to_le_bytes());
        batch[32..40].copy_from_slice(&(length as u64).to_le_bytes());
        batch[48..52].copy_from_slice(&count.to_le_bytes());
        for (i, byte) in batch[BATCH_HEADER_SIZE..].iter_mut().enumerate() {
            *byte = (i as u8).wrapping_mul(31).wrapping_add(count as u8);
        }
        batch
    }

    fn push_record(log: &mut Vec<u8>, chain: &mut Chain, count: u32, body_bytes: usize) -> RecordHeader {
        let timestamp_us = 1_000 + chain.next_op;
        let batch = fake_batch(
            chain.partition_id,
            chain.next_offset,
            count,
            timestamp_us,
            body_bytes,
        );
        let mut header = RecordHeader {
            kind: RecordKind::Batch,
            checksum: 0,
            parent_checksum: chain.parent_checksum,
            op: chain.next_op,
            view: 0,
            partition_id: chain.partition_id,
            base_offset: chain.next_offset,
            message_count: count,
            batch_length_bytes: batch.len() as u32,
            timestamp_us,
        };
        log.extend_from_slice(&header.seal(&batch));
        log.extend_from_slice(&batch);
        *chain = chain.advance(&header);
        header
    }

    /// Append to a journal log a record of `kind` with op `op`: a batch of `count` messages, or
    /// an op record with `body`. No chain check: the scan decides.
    fn push_journal(
        log: &mut Vec<u8>,
        chain: &mut Chain,
        kind: RecordKind,
        op: u64,
        count: u32,
        body: &[u8],
    ) {
        let timestamp_us = 5_000 + op;
        let payload = match kind {
            RecordKind::Batch => fake_batch(chain.partition_id, chain.next_offset, count, timestamp_us, 10),
            _ => body.to_vec(),
        };
        let mut header = RecordHeader {
            kind,
            checksum: 0,
            parent_checksum: chain.parent_checksum,
            op,
            view: 3,
            partition_id: chain.partition_id,
            base_offset: chain.next_offset,
            message_count: if kind == RecordKind::Batch { count } else { 0 },
            batch_length_bytes: payload.len() as u32,
            timestamp_us,
        };
        log.extend_from_slice(&header.seal(&payload));
        log.extend_from_slice(&payload);
        *chain = Chain {
            partition_id: chain.partition_id,
            next_offset: chain.next_offset + u64::from(header.message_count),
            parent_checksum: header.checksum,
            next_op: op + 1,
        };
    }

    /// A journal log: op 1 an append of two batches, op 2 another op, op 3 an append of one
    /// batch, op 4 an op record with an empty payload.
    fn journal_sample() -> (Vec<u8>, Chain) {
        let mut log = Vec::new();
        let mut chain = Chain::genesis(7);
        push_journal(&mut log, &mut chain, RecordKind::Op, 1, 0, b"header 1");
        push_journal(&mut log, &mut chain, RecordKind::Batch, 1, 3, &[]);
        push_journal(&mut log, &mut chain, RecordKind::Batch, 1, 2, &[]);
        push_journal(
            &mut log,
            &mut chain,
            RecordKind::Op,
            2,
            0,
            b"header 2, store offset 4",
        );
        push_journal(&mut log, &mut chain, RecordKind::Op, 3, 0, b"header 3");
        push_journal(&mut log, &mut chain, RecordKind::Batch, 3, 1, &[]);
        push_journal(&mut log, &mut chain, RecordKind::Op, 4, 0, &[]);
        (log, chain)
    }

    #[test]
    fn a_journal_log_groups_records_by_op_and_keeps_op_records_apart() {
        let (log, end) = journal_sample();
        let result = scan_with(&log, Chain::genesis(7), 0, OpRule::PerPrepare);
        assert_eq!(result.tail, Tail::Clean);
        assert_eq!(result.end, end);
        assert_eq!(result.end.next_op, 5);
        assert_eq!(result.end.next_offset, 6);
        let batch_ops: Vec<(u64, u64, u32)> = result
            .records
            .iter()
            .map(|record| (record.op, record.base_offset, record.view))
            .collect();
        assert_eq!(batch_ops, vec![(1, 0, 3), (1, 3, 3), (3, 5, 3)]);
        let op_records: Vec<u64> = result.op_records.iter().map(|record| record.op).collect();
        assert_eq!(op_records, vec![1, 2, 3, 4]);
        // Every cut at a record boundary is a clean journal; every cut inside one is torn.
        let mut boundaries: Vec<u64> = result
            .records
            .iter()
            .map(|record| record.position_bytes)
            .chain(result.op_records.iter().map(|record| record.position_bytes))
            .collect();
        boundaries.sort_unstable();
        for cut in 1..log.len() {
            let scanned = scan_with(&log[..cut], Chain::genesis(7), 0, OpRule::PerPrepare);
            if boundaries.contains(&(cut as u64)) {
                assert_eq!(scanned.tail, Tail::Clean, "cut at {cut}");
            } else {
                assert!(
                    matches!(scanned.tail, Tail::Torn { .. }),
                    "cut at {cut}: {:?}",
                    scanned.tail
                );
            }
        }
    }

    #[test]
    fn journal_records_out_of_op_order_or_place_are_damage() {
        let damaged = |build: &dyn Fn(&mut Vec<u8>, &mut Chain)| {
            let (mut log, mut chain) = journal_sample();
            build(&mut log, &mut chain);
            scan_with(&log, Chain::genesis(7), 0, OpRule::PerPrepare).tail
        };
        let damage_at = |tail: Tail, op: &str| {
            assert!(
                matches!(tail, Tail::Damaged { ref reason, .. } if reason.contains(op)),
                "{tail:?}"
            );
        };
        // An op skipped.
        damage_at(
            damaged(&|log, chain| push_journal(log, chain, RecordKind::Op, 6, 0, b"x")),
            "record op 6",
        );
        // An op record continuing the op before it (only a batch may).
        damage_at(
            damaged(&|log, chain| push_journal(log, chain, RecordKind::Op, 4, 0, b"x")),
            "record op 4",
        );
        // A batch starting an op (an op begins with its op record).
        damage_at(
            damaged(&|log, chain| push_journal(log, chain, RecordKind::Batch, 5, 1, &[])),
            "record op 5",
        );
        // A batch going back two ops.
        damage_at(
            damaged(&|log, chain| push_journal(log, chain, RecordKind::Batch, 3, 1, &[])),
            "record op 3",
        );
        // An op record that moves the offset back.
        let tail = damaged(&|log, chain| {
            assert!(chain.next_offset > 0, "the sample holds batches");
            chain.next_offset -= 1;
            push_journal(log, chain, RecordKind::Op, 5, 0, b"x")
        });
        assert!(
            matches!(tail, Tail::Damaged { ref reason, .. } if reason.contains("op record")),
            "{tail:?}"
        );
        // One that moves it forward is a skip: the chain continues from its base offset.
        let (mut log, mut chain) = journal_sample();
        chain.next_offset += 1_000;
        push_journal(&mut log, &mut chain, RecordKind::Op, 5, 0, b"skip");
        push_journal(&mut log, &mut chain, RecordKind::Op, 6, 0, b"after");
        let scanned = scan_with(&log, Chain::genesis(7), 0, OpRule::PerPrepare);
        assert_eq!(
            (scanned.tail, scanned.end.next_offset),
            (Tail::Clean, chain.next_offset)
        );
        // A batch continuing its op is fine.
        let (mut log, mut chain) = journal_sample();
        push_journal(&mut log, &mut chain, RecordKind::Op, 5, 0, b"header 5");
        push_journal(&mut log, &mut chain, RecordKind::Batch, 5, 1, &[]);
        push_journal(&mut log, &mut chain, RecordKind::Batch, 5, 1, &[]);
        assert_eq!(
            scan_with(&log, Chain::genesis(7), 0, OpRule::PerPrepare).tail,
            Tail::Clean
        );
    }

    #[test]
    fn a_record_log_refuses_op_records_and_a_flip_before_an_op_record_is_damage() {
        let (log, _) = journal_sample();
        // Read as a record log, a journal's op records are damage, never a cut.
        assert!(matches!(scan(&log, Chain::genesis(7)).tail, Tail::Damaged { .. }));
        let mut log = Vec::new();
        let mut chain = Chain::genesis(7);
        push_record(&mut log, &mut chain, 1, 10);
        push_journal(&mut log, &mut chain, RecordKind::Op, 2, 0, b"x");
        let tail = scan(&log, Chain::genesis(7)).tail;
        assert!(
            matches!(tail, Tail::Damaged { ref reason, .. } if reason.contains("op record")),
            "{tail:?}"
        );

        // A flip in a journal's middle record, with only an op record after it: the probe finds
        // the op record, so it is damage, not a torn tail to cut.
        let mut log = Vec::new();
        let mut chain = Chain::genesis(7);
        push_journal(&mut log, &mut chain, RecordKind::Op, 1, 0, b"header 1");
        push_journal(&mut log, &mut chain, RecordKind::Batch, 1, 1, &[]);
        let middle = log.len();
        push_journal(&mut log, &mut chain, RecordKind::Op, 2, 0, b"header 2");
        push_journal(&mut log, &mut chain, RecordKind::Op, 3, 0, b"acknowledged");
        log[middle + RECORD_HEADER_SIZE + 3] ^= 0x10;
        let tail = scan_with(&log, Chain::genesis(7), 0, OpRule::PerPrepare).tail;
        assert!(matches!(tail, Tail::Damaged { .. }), "{tail:?}");
    }

    /// Feed a record to [`EnvelopeInPieces`] in pieces of `piece` bytes.
    fn verify_in_pieces(record: &[u8], piece: usize) -> Result<RecordHeader, Fault> {
        let mut check = EnvelopeInPieces::begin(&record[..RECORD_HEADER_SIZE], record.len() as u64)?;
        for batch_piece in record[RECORD_HEADER_SIZE..].chunks(piece) {
            check.update(batch_piece);
        }
        check.finish()
    }

    #[test]
    fn verifying_in_pieces_gives_the_whole_record_verdict() {
        let mut record = Vec::new();
        let mut chain = Chain::genesis(7);
        let header = push_record(&mut record, &mut chain, 3, 10_000);
        for piece in [1, 7, 64, 4096, record.len()] {
            assert_eq!(verify_in_pieces(&record, piece), Ok(header), "piece {piece}");
        }
        // A flipped bit anywhere after the checksum field fails both ways, in every piece size.
        for at in [
            CHECKSUM_COVERAGE_START,
            RECORD_HEADER_SIZE,
            RECORD_HEADER_SIZE + 5_000,
            record.len() - 1,
        ] {
            let mut damaged = record.clone();
            damaged[at] ^= 0x10;
            let whole = verify_envelope(&damaged).map(|_| ());
            assert!(whole.is_err(), "byte {at}");
            for piece in [7, 4096] {
                assert_eq!(
                    verify_in_pieces(&damaged, piece).map(|_| ()),
                    whole,
                    "byte {at}, piece {piece}"
                );
            }
        }
        // A record longer than the room it may occupy is refused before any batch byte.
        assert!(matches!(
            EnvelopeInPieces::begin(&record, record.len() as u64 - 1),
            Err(Fault::Overrun { .. })
        ));
    }

    fn sample_log(records: usize) -> (Vec<u8>, Vec<u64>, Chain) {
        let mut log = Vec::new();
        let mut chain = Chain::genesis(7);
        let mut ends = Vec::new();
        for i in 0..records {
            push_record(&mut log, &mut chain, 1 + (i as u32 % 3), 40 + i * 7);
            ends.push(log.len() as u64);
        }
        (log, ends, chain)
    }

    #[test]
    fn header_round_trip() {
        let header = RecordHeader {
            kind: RecordKind::Batch,
            checksum: 1,
            parent_checksum: 2,
            op: 3,
            view: 4,
            partition_id: 5,
            base_offset: 6,
            message_count: 7,
            batch_length_bytes: 8,
            timestamp_us: 9,
        };
        assert_eq!(decode(&header.encode()), Ok(header));
        assert_eq!(decode(&header.encode()[..63]), Err(Fault::ShortHeader));
    }

    #[test]
    fn clean_log() {
        let (log, ends, chain) = sample_log(5);
        let result = scan(&log, Chain::genesis(7));
        assert_eq!(result.tail, Tail::Clean);
        assert_eq!(result.valid_len_bytes, log.len() as u64);
        assert_eq!(result.records.len(), 5);
        assert_eq!(result.end, chain);
        assert_eq!(result.records[1].position_bytes, ends[0]);
        assert_eq!(scan(&[], Chain::genesis(7)).tail, Tail::Clean);
    }

    #[test]
    fn every_truncation_is_a_torn_tail() {
        let (log, ends, _) = sample_log(4);
        for cut in 0..log.len() {
            let result = scan(&log[..cut], Chain::genesis(7));
            let expected_valid = ends
                .iter()
                .copied()
                .filter(|&end| end <= cut as u64)
                .max()
                .unwrap_or(0);
            assert_eq!(result.valid_len_bytes, expected_valid, "cut at {cut}");
            if expected_valid == cut as u64 {
                assert_eq!(result.tail, Tail::Clean);
            } else {
                assert!(
                    matches!(result.tail, Tail::Torn { .. }),
                    "cut at {cut}: {:?}",
                    result.tail
                );
            }
        }
    }

    #[test]
    fn bit_flip_in_the_middle_is_damage_and_in_the_last_record_a_torn_tail() {
        let (log, ends, _) = sample_log(4);
        for position in 0..log.len() {
            let mut flipped = log.clone();
            flipped[position] ^= 0x10;
            let result = scan(&flipped, Chain::genesis(7));
            let record = ends.iter().position(|&end| end > position as u64).unwrap();
            let record_start = if record == 0 { 0 } else { ends[record - 1] };
            assert_eq!(result.valid_len_bytes, record_start, "flip at {position}");
            if record == ends.len() - 1 {
                assert!(
                    matches!(result.tail, Tail::Torn { .. }),
                    "flip at {position}: {:?}",
                    result.tail
                );
            } else {
                assert!(
                    matches!(result.tail, Tail::Damaged { position_bytes, .. } if position_bytes == record_start),
                    "flip at {position}: {:?}",
                    result.tail
                );
            }
        }
    }

    #[test]
    fn checksum_valid_records_that_do_not_continue_are_damage() {
        let (log, _, chain) = sample_log(3);
        let cases: Vec<Chain> = vec![
            Chain {
                partition_id: 8,
                ..chain
            },
            Chain {
                next_offset: chain.next_offset + 1,
                ..chain
            },
            Chain {
                next_offset: chain.next_offset - 1,
                ..chain
            },
            Chain {
                parent_checksum: chain.parent_checksum ^ 1,
                ..chain
            },
            Chain {
                next_op: chain.next_op + 1,
                ..chain
            },
        ];
        for mut bad_chain in cases {
            let mut tampered = log.clone();
            push_record(&mut tampered, &mut bad_chain, 2, 30);
            let result = scan(&tampered, Chain::genesis(7));
            assert_eq!(result.valid_len_bytes, log.len() as u64);
            assert!(
                matches!(result.tail, Tail::Damaged { position_bytes, .. } if position_bytes == log.len() as u64),
                "{bad_chain:?}: {:?}",
                result.tail
            );
        }
    }

    #[test]
    fn residue_claiming_huge_lengths_is_a_torn_tail() {
        let (mut log, _, chain) = sample_log(2);
        let valid = log.len() as u64;
        for i in 0..20_000u64 {
            let header = RecordHeader {
                kind: RecordKind::Batch,
                checksum: i,
                parent_checksum: chain.parent_checksum,
                op: chain.next_op,
                view: 0,
                partition_id: 7,
                base_offset: chain.next_offset + i,
                message_count: 1,
                batch_length_bytes: if i % 2 == 0 { u32::MAX } else { 100_000_000 },
                timestamp_us: 0,
            };
            log.extend_from_slice(&header.encode());
        }
        let result = scan(&log, Chain::genesis(7));
        assert_eq!(result.valid_len_bytes, valid);
        assert!(matches!(result.tail, Tail::Torn { .. }), "{:?}", result.tail);
    }

    #[test]
    fn residue_of_fitting_candidates_exhausts_the_budget_and_refuses() {
        let (mut log, _, chain) = sample_log(1);
        let valid = log.len();
        // A region of headers each claiming a batch that fits the remaining bytes: every
        // candidate must be hashed, so the probe budget (not the input) bounds the work.
        let region_bytes = 4 * 1024 * 1024;
        log.resize(valid + region_bytes, 0);
        let mut position = valid;
        while position + RECORD_HEADER_SIZE <= log.len() {
            let remaining = (log.len() - position - RECORD_HEADER_SIZE) as u32;
            let header = RecordHeader {
                kind: RecordKind::Batch,
                checksum: 0,
                parent_checksum: 0,
                op: 0,
                view: 0,
                partition_id: 7,
                base_offset: chain.next_offset,
                message_count: 1,
                batch_length_bytes: remaining.max(BATCH_HEADER_SIZE as u32),
                timestamp_us: 0,
            };
            log[position..position + RECORD_HEADER_SIZE].copy_from_slice(&header.encode());
            position += RECORD_HEADER_SIZE;
        }
        let result = scan(&log, Chain::genesis(7));
        assert_eq!(result.valid_len_bytes, valid as u64);
        assert!(matches!(result.tail, Tail::Damaged { .. }), "{:?}", result.tail);
    }

    fn push_gap(log: &mut Vec<u8>, chain: &mut Chain, next_offset: u64) -> RecordHeader {
        let body = gap_body(chain.next_offset);
        let mut header = RecordHeader {
            kind: RecordKind::Gap,
            checksum: 0,
            parent_checksum: chain.parent_checksum,
            op: chain.next_op,
            view: 0,
            partition_id: chain.partition_id,
            base_offset: next_offset,
            message_count: 0,
            batch_length_bytes: GAP_BODY_SIZE as u32,
            timestamp_us: 5_000,
        };
        log.extend_from_slice(&header.seal(&body));
        log.extend_from_slice(&body);
        *chain = chain.advance(&header);
        header
    }

    #[test]
    fn a_gap_record_seals_its_segment_and_the_next_one_continues_at_its_target() {
        let (mut log, _, before_gap) = sample_log(3);
        let mut chain = before_gap;
        let gap_position = log.len() as u64;
        push_gap(&mut log, &mut chain, before_gap.next_offset + 1_000);
        let result = scan(&log, Chain::genesis(7));
        assert_eq!(result.tail, Tail::Clean);
        assert_eq!(result.records.len(), 3, "a gap is not a batch record");
        assert_eq!(
            result.gap,
            Some(ScannedGap {
                position_bytes: gap_position,
                previous_end_offset: before_gap.next_offset,
                next_offset: before_gap.next_offset + 1_000,
                size_bytes: (RECORD_HEADER_SIZE + GAP_BODY_SIZE) as u64,
            })
        );
        assert_eq!(result.end, chain);
        assert_eq!(result.end.next_offset, before_gap.next_offset + 1_000);
        // The next segment: its first record continues the gap's chain at the target offset.
        let mut next_segment = Vec::new();
        let mut next_chain = chain;
        push_record(&mut next_segment, &mut next_chain, 2, 10);
        let next = scan(&next_segment, chain);
        assert_eq!(next.tail, Tail::Clean);
        assert_eq!(next.records[0].base_offset, before_gap.next_offset + 1_000);
        // Without the gap the same segment reads as a lost range.
        assert!(matches!(
            scan(&next_segment, before_gap).tail,
            Tail::Damaged { .. }
        ));
        // A gap alone (sealing an empty segment) is fine too.
        let mut alone = Vec::new();
        let mut alone_chain = Chain::genesis(7);
        push_gap(&mut alone, &mut alone_chain, 65_536);
        let result = scan(&alone, Chain::genesis(7));
        assert_eq!(result.tail, Tail::Clean);
        assert!(result.records.is_empty());
        assert_eq!(result.end.next_offset, 65_536);
    }

    #[test]
    fn misplaced_or_inconsistent_gap_records_are_damage_and_torn_ones_a_torn_tail() {
        let (log, _, chain) = sample_log(2);
        let damaged = |bytes: &[u8]| matches!(scan(bytes, Chain::genesis(7)).tail, Tail::Damaged { .. });
        // A record after a gap in the same segment.
        let mut after = log.clone();
        let mut after_chain = chain;
        push_gap(&mut after, &mut after_chain, chain.next_offset + 10);
        push_record(&mut after, &mut after_chain, 1, 20);
        let result = scan(&after, Chain::genesis(7));
        assert!(matches!(result.tail, Tail::Damaged { .. }), "{:?}", result.tail);
        assert!(result.gap.is_some());
        // A gap that does not go forward, or starts elsewhere than the chain's end.
        for target in [chain.next_offset, chain.next_offset - 1] {
            let mut backwards = log.clone();
            let mut fake_chain = Chain {
                next_offset: target - 1,
                ..chain
            };
            push_gap(&mut backwards, &mut fake_chain, target);
            assert!(damaged(&backwards), "gap to {target}");
        }
        let mut wrong_start = log.clone();
        let mut fake_chain = Chain {
            next_offset: chain.next_offset + 3,
            ..chain
        };
        push_gap(&mut wrong_start, &mut fake_chain, chain.next_offset + 50);
        assert!(damaged(&wrong_start));
        let mut wrong_parent = log.clone();
        let mut fake_chain = Chain {
            parent_checksum: 1,
            ..chain
        };
        push_gap(&mut wrong_parent, &mut fake_chain, chain.next_offset + 50);
        assert!(damaged(&wrong_parent));
        // Every cut of a gap record is a torn tail.
        let mut whole = log.clone();
        let mut gap_chain = chain;
        push_gap(&mut whole, &mut gap_chain, chain.next_offset + 50);
        for cut in log.len() + 1..whole.len() {
            let result = scan(&whole[..cut], Chain::genesis(7));
            assert!(
                matches!(result.tail, Tail::Torn { .. }),
                "cut at {cut}: {:?}",
                result.tail
            );
            assert_eq!(result.valid_len_bytes, log.len() as u64);
            assert_eq!(result.gap, None);
        }
    }

    #[test]
    fn below_the_durable_frontier_every_failure_is_damage() {
        let (log, ends, chain) = sample_log(4);
        let frontier = ends[2];
        let result = scan_from(&log, Chain::genesis(7), frontier);
        assert_eq!(result.tail, Tail::Clean);
        assert!(result.durable_end.is_some());
        assert_eq!(
            scan_from(&log, Chain::genesis(7), log.len() as u64).durable_end,
            Some(chain)
        );
        assert_eq!(scan(&log, Chain::genesis(7)).durable_end, Some(Chain::genesis(7)));
        for position in 0..log.len() {
            let mut flipped = log.clone();
            flipped[position] ^= 0x08;
            let result = scan_from(&flipped, Chain::genesis(7), frontier);
            if (position as u64) < frontier {
                assert!(
                    matches!(result.tail, Tail::Damaged { .. }),
                    "flip at {position} below the frontier: {:?}",
                    result.tail
                );
            } else if (position as u64) >= ends[2] && (position as u64) < ends[3] {
                // The last record, above the frontier: a torn tail.
                assert!(matches!(result.tail, Tail::Torn { .. }), "flip at {position}");
            }
        }
        // The whole last record durable: a flip in it is damage, not a torn tail.
        let mut flipped = log.clone();
        flipped[ends[2] as usize + 70] ^= 0x01;
        assert!(matches!(
            scan(&flipped, Chain::genesis(7)).tail,
            Tail::Torn { .. }
        ));
        assert!(matches!(
            scan_from(&flipped, Chain::genesis(7), log.len() as u64).tail,
            Tail::Damaged { .. }
        ));
        // A log that ends before its frontier, or a frontier inside a record.
        assert!(matches!(
            scan_from(&log[..ends[1] as usize], Chain::genesis(7), frontier).tail,
            Tail::Damaged { .. }
        ));
        let inside = scan_from(&log, Chain::genesis(7), ends[1] + 5);
        assert!(matches!(inside.tail, Tail::Damaged { .. }), "{:?}", inside.tail);
        assert_eq!(inside.durable_end, None);
    }

    proptest! {
        #[test]
        fn scan_never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let result = scan(&bytes, Chain::genesis(0));
            prop_assert!(result.valid_len_bytes <= bytes.len() as u64);
            let result = scan_with(&bytes, Chain::genesis(0), 0, OpRule::PerPrepare);
            prop_assert!(result.valid_len_bytes <= bytes.len() as u64);
        }

        #[test]
        fn a_mutated_journal_scan_accounts_for_every_valid_byte(
            cut in 0usize..1024,
            flips in proptest::collection::vec((0usize..1024, any::<u8>()), 0..4),
            garbage in proptest::collection::vec(any::<u8>(), 0..256),
        ) {
            let (mut log, _) = journal_sample();
            for (position, mask) in flips {
                let len = log.len();
                log[position % len] ^= mask;
            }
            log.truncate(cut.min(log.len()));
            log.extend_from_slice(&garbage);
            let result = scan_with(&log, Chain::genesis(7), 0, OpRule::PerPrepare);
            prop_assert!(result.valid_len_bytes <= log.len() as u64);
            let records_bytes: u64 = result.records.iter().map(|r| r.size_bytes).sum::<u64>()
                + result.op_records.iter().map(|r| r.size_bytes).sum::<u64>()
                + result.gap.map_or(0, |gap| gap.size_bytes);
            prop_assert_eq!(records_bytes, result.valid_len_bytes);
        }

        #[test]
        fn scan_never_panics_on_mutated_logs(
            cut in 0usize..4096,
            flips in proptest::collection::vec((0usize..4096, any::<u8>()), 0..4),
            garbage in proptest::collection::vec(any::<u8>(), 0..256),
        ) {
            let (mut log, _, _) = sample_log(6);
            for (position, mask) in flips {
                let len = log.len();
                log[position % len] ^= mask;
            }
            log.truncate(cut.min(log.len()));
            log.extend_from_slice(&garbage);
            let result = scan(&log, Chain::genesis(7));
            prop_assert!(result.valid_len_bytes <= log.len() as u64);
            let records_bytes: u64 = result.records.iter().map(|r| r.size_bytes).sum::<u64>()
                + result.gap.map_or(0, |gap| gap.size_bytes);
            prop_assert_eq!(records_bytes, result.valid_len_bytes);
        }
    }
}
