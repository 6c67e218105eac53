//! The replica's durable VSR state, the superblock (design: `docs/replication.md`, "Durable state
//! (the superblock)").
//!
//! This module is pure: it turns a [`DurableState`] into the bytes of one copy, chooses the state
//! to boot from among the copies the shell read, and plans the next write. The shell owns the
//! storage. It reads and writes [`SUPERBLOCK_COPIES`] copies of [`COPY_SIZE`] bytes each, and it
//! places each copy in its own sector, so that a torn sector write or a latent sector error
//! damages one copy, never two.
//!
//! # Writing: every copy, one at a time
//!
//! Every write writes the same bytes, with the sequence incremented, to every copy, in the order
//! `0..SUPERBLOCK_COPIES`. Each copy is synced before the next is written. The write is complete
//! when the last copy is synced, and only then may the replica act on it (send a message that
//! depends on it). [`plan_write`] returns those bytes.
//!
//! The one-at-a-time rule is what bounds the damage of a crash. If the shell wrote all copies and
//! then synced once, the disk could persist any part of any of them, and a crash could tear all
//! four. Written one at a time, a crash can tear only the copy being written: the copies before
//! it hold the new sequence, and the copies after it still hold the previous one. The fixed order
//! is not needed for soundness, but it makes the shell and the simulator's fault model agree.
//!
//! A shell that coalesces the superblock writes of many groups (design, "Many groups per node")
//! does so copy by copy: copy 0 of every group, one sync, then copy 1 of every group, one sync,
//! and so on. That is four syncs per batch however many groups it holds, never one.
//!
//! # Reading: the highest sequence among the copies that verify
//!
//! [`choose`] decodes every copy and takes the highest sequence among the copies that verify.
//! Suppose every copy held sequence `s` when a write began. That holds after a complete write,
//! and after a complete repair (below). The write replaces copies only with `s + 1`, so after a
//! crash every copy holds `s` or `s + 1`, or is torn. At most one copy is torn, and with at most
//! one more copy flipped, at least two of the four copies verify. Each of them holds `s` or more,
//! so the choice is never older than the last complete write. A bit flip never makes a copy
//! verify with another sequence, because the checksum covers the sequence.
//!
//! More precisely, the choice is never older than the last complete write however many copies
//! are damaged, as long as one verifies. If none verifies, `choose` refuses. So safety (no
//! rollback) needs no fault budget at all, and availability needs one copy that verifies: per
//! write, three damaged copies of four are survived, for example one torn and two flipped.
//! Beyond that the replica refuses to start rather than roll back. Across repeated crashes
//! during repair (below), a torn repair only ever damages a copy that was useless already, so
//! any number of them is survived as long as at most one flipped copy is unrepaired at a time.
//! That is why there are four copies: two would refuse after one torn write and one flip, and
//! three would be left with a single good copy.
//!
//! The choice may be newer than the last complete write: it may be the write that was in
//! progress at the crash. Adopting it is safe, because nothing that depended on it was sent (a
//! write is acted on only when complete), and every durable field is monotone.
//!
//! # Repair before acting
//!
//! An adopted in-progress write is not complete: some copies still hold the previous sequence or
//! are damaged. If the replica acted on it as it is, a later crash and one bit flip on its copies
//! could bring back the previous state, which the replica has already acted past (see the test
//! `acting_before_repair_can_roll_back`). So after [`choose`] returns
//! [`Chosen::Formatted`] with `copies_valid < SUPERBLOCK_COPIES`, the shell writes
//! `encode_copy(&state, sequence)` (the chosen copy's bytes) to every copy marked in
//! `copies_to_repair`, in ascending order, each synced before the next. Only when the last is
//! synced does the replica start. Repair rewrites only copies that do not already hold the chosen
//! bytes, so a crash during repair can tear only a copy that was useless anyway, and the copies
//! that hold the chosen sequence survive it. After repair, every copy holds the chosen sequence,
//! which is the precondition of the next [`plan_write`].
//!
//! # Blank copies: wiped, formatted, or refused
//!
//! - Every copy blank (all zero) or unreadable: the replica's storage was wiped. [`choose`]
//!   returns [`Chosen::Wiped`], and the replica boots as *wiped*, never as a fresh member.
//! - Some copies blank and some valid: a format or a write was interrupted by a crash. The
//!   replica boots from the valid copies, after repair.
//! - No copy valid and at least one not blank: refused ([`DurableRefusal::AllCopiesCorrupt`]).
//!   This includes a crash during the first copy of a format. The format is an operator's step
//!   that is complete only when every copy is synced, so the operator runs it again.
//!
//! # Invariants
//!
//! Checked by [`plan_write`] before every write, and by [`choose`] again after every read:
//! - [`DurableState::check`]: `1 ≤ replica_count ≤ REPLICAS_MAX`, `replica < replica_count`,
//!   `log_view ≤ view`, `checkpoint_op ≤ commit_max`, and at most
//!   `min(LOG_SUFFIX_MAX, log_head_op − 1)` suffix checksums;
//! - `cluster`, `replica` and `replica_count` never change;
//! - `view`, `log_view`, `commit_max` and `checkpoint_op` never decrease;
//! - `checkpoint_checksum` changes only when `checkpoint_op` does: one op has one checkpoint;
//! - `sequence` increases by exactly one per write, and a repair keeps it.
//!
//! [`choose`] checks the monotone relations between copies of different sequences, and refuses
//! two copies of one sequence that differ. Neither can happen under the fault model, so either
//! one means a bug or a disk that returns data nobody wrote there.
//!
//! # Layout of one copy (little-endian)
//!
//! | off | size | field | fault it detects |
//! |---:|---:|---|---|
//! | 0 | 4 | `magic` = `"CVSB"` | not a superblock copy at all: a wrong file or offset, another format |
//! | 4 | 2 | `version` = 2 | another format, whose checksum and fields this build cannot locate |
//! | 6 | 2 | reserved, zero | a writer that used the bytes without a version bump, or a writer bug |
//! | 8 | 8 | `sequence` | a stale copy, left at the previous write by a crash |
//! | 16 | 16 | `cluster` | a superblock of another cluster: a disk or directory moved between clusters |
//! | 32 | 16 | `checkpoint_checksum` | a checkpoint that is not the one this state names: stale or foreign |
//! | 48 | 8 | `commit_max` | (state) |
//! | 56 | 8 | `checkpoint_op` | (state) |
//! | 64 | 4 | `view` | (state) |
//! | 68 | 4 | `log_view` | (state) |
//! | 72 | 1 | `replica` | another replica's superblock: directories swapped between replicas |
//! | 73 | 1 | `replica_count` | a state formatted for another group size |
//! | 74 | 6 | reserved, zero | as above; room for fields without a format break |
//! | 80 | 8 | `log_head_op` | (state) |
//! | 88 | 2 | `log_suffix` length `n` | (state; at most [`LOG_SUFFIX_MAX`]) |
//! | 90 | 6 | reserved, zero | as above |
//! | 96 | 16 | `log_head_checksum` | (state) |
//! | 112 | 16 × 24 | `log_suffix`: `n` checksums, then zeros | (state) |
//! | 496 | 16 | `checksum` | bit flips and torn writes anywhere in bytes 0..496: XXH3-128 of them |
//!
//! A copy is one 512-byte sector: a device writes it whole or not at all, and a shell that
//! places copy `i` at `i × COPY_SIZE` gives each copy a sector of its own.
//!
//! **Version 1** (until 2026-12-02) was the first 112 bytes of this layout with bytes 88..96
//! reserved (no suffix), and its checksum at 112, in 128-byte copies. [`decode_copy`] still
//! reads a version-1 copy handed over as [`COPY_SIZE_V1`] bytes (as a state with an empty
//! suffix), so a shell can migrate a superblock written before; it writes only version 2.
//!
//! Every field is naturally aligned and no byte is unaccounted for (both asserted at compile
//! time). The state fields are checked by [`DurableState::check`]. A copy that verifies but fails
//! it was written by a buggy writer, since [`plan_write`] never writes one.

use crate::constants::{REPLICAS_MAX, SUPERBLOCK_COPIES};
use std::mem::size_of;
use xxhash_rust::xxh3::xxh3_128;

/// Bytes in one copy of the superblock: one sector.
pub const COPY_SIZE: usize = 512;

/// Bytes in one copy of a version-1 superblock (read for migration only).
pub const COPY_SIZE_V1: usize = 128;

/// Checksums a durable state keeps of the installed log below its head (see
/// [`DurableState::log_suffix`]). A group's shape must fit its view-change suffix in it
/// (`Shape::check`).
pub const LOG_SUFFIX_MAX: usize = 24;

/// `"CVSB"` (Cairn VSR superblock) read as a little-endian `u32`.
pub const MAGIC: u32 = u32::from_le_bytes(*b"CVSB");

/// The copy format this build writes and reads. Any other value is refused.
pub const VERSION: u16 = 2;

/// The format before the log suffix; [`decode_copy`] reads it for migration.
pub const VERSION_V1: u16 = 1;

/// The sequence of a format's write (and of a wiped replica's first write): the first write.
pub const SEQUENCE_FORMATTED: u64 = 1;

const MAGIC_OFFSET: usize = 0;
const VERSION_OFFSET: usize = 4;
const RESERVED_HEAD_OFFSET: usize = 6;
const RESERVED_HEAD_SIZE: usize = 2;
const SEQUENCE_OFFSET: usize = 8;
const CLUSTER_OFFSET: usize = 16;
const CHECKPOINT_CHECKSUM_OFFSET: usize = 32;
const COMMIT_MAX_OFFSET: usize = 48;
const CHECKPOINT_OP_OFFSET: usize = 56;
const VIEW_OFFSET: usize = 64;
const LOG_VIEW_OFFSET: usize = 68;
const REPLICA_OFFSET: usize = 72;
const REPLICA_COUNT_OFFSET: usize = 73;
const RESERVED_TAIL_OFFSET: usize = 74;
const RESERVED_TAIL_SIZE: usize = 6;
const LOG_HEAD_OP_OFFSET: usize = 80;
const LOG_SUFFIX_LEN_OFFSET: usize = 88;
const RESERVED_MIDDLE_OFFSET: usize = 90;
const RESERVED_MIDDLE_SIZE: usize = 6;
const LOG_HEAD_CHECKSUM_OFFSET: usize = 96;
const LOG_SUFFIX_OFFSET: usize = 112;
const LOG_SUFFIX_SIZE: usize = LOG_SUFFIX_MAX * size_of::<u128>();
const CHECKSUM_OFFSET: usize = LOG_SUFFIX_OFFSET + LOG_SUFFIX_SIZE;
/// Where a version-1 copy keeps its checksum (of the bytes before it).
const CHECKSUM_OFFSET_V1: usize = 112;
const CHECKSUM_SIZE: usize = size_of::<u128>();

/// Every region of a copy in order, as (offset, size, is a field). The const block below asserts
/// that they tile the copy exactly, so a field moved in one place and not the other fails to
/// compile, and that every field (reserved regions excepted) is naturally aligned.
const LAYOUT: [(usize, usize, bool); 19] = [
    (MAGIC_OFFSET, size_of::<u32>(), true),
    (VERSION_OFFSET, size_of::<u16>(), true),
    (RESERVED_HEAD_OFFSET, RESERVED_HEAD_SIZE, false),
    (SEQUENCE_OFFSET, size_of::<u64>(), true),
    (CLUSTER_OFFSET, size_of::<u128>(), true),
    (CHECKPOINT_CHECKSUM_OFFSET, size_of::<u128>(), true),
    (COMMIT_MAX_OFFSET, size_of::<u64>(), true),
    (CHECKPOINT_OP_OFFSET, size_of::<u64>(), true),
    (VIEW_OFFSET, size_of::<u32>(), true),
    (LOG_VIEW_OFFSET, size_of::<u32>(), true),
    (REPLICA_OFFSET, size_of::<u8>(), true),
    (REPLICA_COUNT_OFFSET, size_of::<u8>(), true),
    (RESERVED_TAIL_OFFSET, RESERVED_TAIL_SIZE, false),
    (LOG_HEAD_OP_OFFSET, size_of::<u64>(), true),
    (LOG_SUFFIX_LEN_OFFSET, size_of::<u16>(), true),
    (RESERVED_MIDDLE_OFFSET, RESERVED_MIDDLE_SIZE, false),
    (LOG_HEAD_CHECKSUM_OFFSET, size_of::<u128>(), true),
    // An array of u128, aligned like one.
    (LOG_SUFFIX_OFFSET, LOG_SUFFIX_SIZE, false),
    (CHECKSUM_OFFSET, CHECKSUM_SIZE, true),
];

const _: () = {
    let mut end = 0;
    let mut index = 0;
    while index < LAYOUT.len() {
        let (offset, size, is_field) = LAYOUT[index];
        assert!(offset == end);
        assert!(size > 0);
        assert!(!is_field || offset % size == 0);
        end += size;
        index += 1;
    }
    assert!(end == COPY_SIZE);
    // The checksum is last and covers everything before it.
    assert!(CHECKSUM_OFFSET + CHECKSUM_SIZE == COPY_SIZE);
    // A copy fits the smallest sector, so the shell can give each copy a sector of its own,
    // and a crash never tears a copy within itself.
    assert!(COPY_SIZE <= 512);
    assert!(LOG_SUFFIX_OFFSET.is_multiple_of(size_of::<u128>()));
    assert!(LOG_SUFFIX_MAX <= u16::MAX as usize);
    // Version 1 is this layout's first 112 bytes, then its checksum.
    assert!(CHECKSUM_OFFSET_V1 == LOG_SUFFIX_OFFSET);
    assert!(CHECKSUM_OFFSET_V1 + CHECKSUM_SIZE == COPY_SIZE_V1);
    // Four copies: one torn by a crash and one flipped still leave two that verify.
    assert!(SUPERBLOCK_COPIES >= 4);
    assert!(REPLICAS_MAX <= u8::MAX as usize);
};

/// The replica's durable VSR state. It reaches the disk only through [`plan_format`],
/// [`plan_write`] and the repair after [`choose`], and comes back only through [`choose`].
///
/// Invariants (see [`DurableState::check`] and the module documentation): the ones on each
/// field, and across writes the monotone relations that [`plan_write`] enforces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DurableState {
    /// The cluster this replica was formatted for. It never changes.
    pub cluster: u128,
    /// This replica's index in the group. It never changes.
    /// Invariant: `replica < replica_count`.
    pub replica: u8,
    /// Replicas in the group, fixed at format time (there is no reconfiguration). It never
    /// changes. Invariant: `1 ≤ replica_count ≤ REPLICAS_MAX`.
    pub replica_count: u8,
    /// The highest view this replica has joined. It never decreases. A view-scoped message for
    /// view `v` is sent only once a write with `view ≥ v` is complete (persist before send).
    pub view: u32,
    /// The latest view in which this replica's log was installed as canonical. It never
    /// decreases. Invariant: `log_view ≤ view`.
    pub log_view: u32,
    /// A lower bound on the highest op committed in the cluster. It never decreases.
    /// Invariant: `checkpoint_op ≤ commit_max`.
    pub commit_max: u64,
    /// The op of the latest durable checkpoint. It never decreases.
    /// Invariant: `checkpoint_op ≤ commit_max`.
    pub checkpoint_op: u64,
    /// The checksum of the checkpoint at `checkpoint_op`. It changes only when `checkpoint_op`
    /// does, since one op has exactly one checkpoint.
    pub checkpoint_checksum: u128,
    /// The head of the log this replica last installed (op and prepare checksum; op 0 is the
    /// root, checksum 0). Every op of the `log_view` log above it was prepared in `log_view`,
    /// so after a restart a slot above it holding a prepare of an older view is known stale.
    /// It is the latest install's, so it is not monotone.
    pub log_head_op: u64,
    pub log_head_checksum: u128,
    /// The installed log below its head: `log_suffix[i]` is the checksum of op
    /// `log_head_op − 1 − i` in the `log_view` log, as the install named it (a prepare's
    /// header, or a hole's checksum), contiguous from the head down, at most
    /// [`LOG_SUFFIX_MAX`] and never below op 1. A restart uses it to tell the `log_view`
    /// log's copies from stale ones below the head, and to name the ops it lacks there, so its
    /// DoViewChange can vouch for them whatever the disk kept. Invariant:
    /// `log_suffix.len() ≤ min(LOG_SUFFIX_MAX, log_head_op − 1)`.
    pub log_suffix: Vec<u128>,
}

impl DurableState {
    /// The state a cluster is formatted with (view 0, everything 0). It passes [`Self::check`]
    /// only when `replica < replica_count ≤ REPLICAS_MAX`; [`plan_format`] checks that.
    pub fn formatted(cluster: u128, replica: u8, replica_count: u8) -> DurableState {
        DurableState {
            cluster,
            replica,
            replica_count,
            view: 0,
            log_view: 0,
            commit_max: 0,
            checkpoint_op: 0,
            checkpoint_checksum: 0,
            log_head_op: 0,
            log_head_checksum: 0,
            log_suffix: Vec::new(),
        }
    }

    /// Field invariants: `replica_count` in `1..=REPLICAS_MAX`, `replica < replica_count`,
    /// `log_view ≤ view`, `checkpoint_op ≤ commit_max`, `log_suffix.len() ≤
    /// min(LOG_SUFFIX_MAX, log_head_op − 1)`.
    pub fn check(&self) -> Result<(), DurableError> {
        if self.replica_count == 0 || usize::from(self.replica_count) > REPLICAS_MAX {
            return Err(DurableError::ReplicaCountInvalid {
                replica_count: self.replica_count,
            });
        }
        if self.replica >= self.replica_count {
            return Err(DurableError::ReplicaInvalid {
                replica: self.replica,
                replica_count: self.replica_count,
            });
        }
        if self.log_view > self.view {
            return Err(DurableError::LogViewAheadOfView {
                log_view: self.log_view,
                view: self.view,
            });
        }
        if self.checkpoint_op > self.commit_max {
            return Err(DurableError::CheckpointAheadOfCommit {
                checkpoint_op: self.checkpoint_op,
                commit_max: self.commit_max,
            });
        }
        if self.log_suffix.len() > LOG_SUFFIX_MAX
            || self.log_suffix.len() as u64 > self.log_head_op.saturating_sub(1)
        {
            return Err(DurableError::LogSuffixTooLong {
                len: self.log_suffix.len(),
                log_head_op: self.log_head_op,
            });
        }
        Ok(())
    }

    /// Whether `next` may follow `self` in a later write: the identity fields are equal, the
    /// monotone fields do not decrease, and the checkpoint checksum changes only with its op.
    /// It does not run [`Self::check`] on either.
    fn check_successor(&self, next: &DurableState) -> Result<(), DurableError> {
        if next.cluster != self.cluster {
            return Err(DurableError::ClusterChanged);
        }
        if next.replica != self.replica {
            return Err(DurableError::ReplicaChanged {
                current: self.replica,
                next: next.replica,
            });
        }
        if next.replica_count != self.replica_count {
            return Err(DurableError::ReplicaCountChanged {
                current: self.replica_count,
                next: next.replica_count,
            });
        }
        if next.view < self.view {
            return Err(DurableError::ViewRegressed {
                current: self.view,
                next: next.view,
            });
        }
        if next.log_view < self.log_view {
            return Err(DurableError::LogViewRegressed {
                current: self.log_view,
                next: next.log_view,
            });
        }
        if next.commit_max < self.commit_max {
            return Err(DurableError::CommitMaxRegressed {
                current: self.commit_max,
                next: next.commit_max,
            });
        }
        if next.checkpoint_op < self.checkpoint_op {
            return Err(DurableError::CheckpointOpRegressed {
                current: self.checkpoint_op,
                next: next.checkpoint_op,
            });
        }
        if next.checkpoint_op == self.checkpoint_op && next.checkpoint_checksum != self.checkpoint_checksum {
            return Err(DurableError::CheckpointChecksumChanged {
                checkpoint_op: self.checkpoint_op,
            });
        }
        Ok(())
    }
}

/// A durable state, or a transition between two, that breaks an invariant. From [`plan_write`]
/// it is a programmer error in the caller, which asserts; from [`decode_copy`] it means the copy
/// verified but was written by a buggy writer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DurableError {
    #[error("replica_count {replica_count} is outside 1..={REPLICAS_MAX}")]
    ReplicaCountInvalid { replica_count: u8 },
    #[error("replica {replica} is not below replica_count {replica_count}")]
    ReplicaInvalid { replica: u8, replica_count: u8 },
    #[error("log_view {log_view} is ahead of view {view}")]
    LogViewAheadOfView { log_view: u32, view: u32 },
    #[error("checkpoint_op {checkpoint_op} is ahead of commit_max {commit_max}")]
    CheckpointAheadOfCommit { checkpoint_op: u64, commit_max: u64 },
    /// Carries no ids, so that every error (and [`DurableRefusal`], which holds four) stays
    /// small; the caller holds both states.
    #[error("cluster would change")]
    ClusterChanged,
    #[error("replica would change from {current} to {next}")]
    ReplicaChanged { current: u8, next: u8 },
    #[error("replica_count would change from {current} to {next}")]
    ReplicaCountChanged { current: u8, next: u8 },
    #[error("view would decrease from {current} to {next}")]
    ViewRegressed { current: u32, next: u32 },
    #[error("log_view would decrease from {current} to {next}")]
    LogViewRegressed { current: u32, next: u32 },
    #[error("commit_max would decrease from {current} to {next}")]
    CommitMaxRegressed { current: u64, next: u64 },
    #[error("checkpoint_op would decrease from {current} to {next}")]
    CheckpointOpRegressed { current: u64, next: u64 },
    #[error("checkpoint_checksum would change while checkpoint_op stays {checkpoint_op}")]
    CheckpointChecksumChanged { checkpoint_op: u64 },
    #[error(
        "the log suffix holds {len} checksums, more than {LOG_SUFFIX_MAX} or than ops below head {log_head_op}"
    )]
    LogSuffixTooLong { len: usize, log_head_op: u64 },
    #[error("the sequence is at its maximum and cannot be incremented")]
    SequenceExhausted,
}

/// Why one copy does not verify. Checked in this order: size, blank, magic, version (these say
/// whether the rest can be interpreted at all, and where the checksum is), checksum, reserved
/// bytes, state invariants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CopyFault {
    /// Every byte is zero: never written, or wiped.
    #[error("the copy is blank (all zero)")]
    Blank,
    /// The shell handed over a slice that is not [`COPY_SIZE`] bytes: a short read.
    #[error("the copy is {size_bytes} bytes, not {COPY_SIZE}")]
    WrongSize { size_bytes: usize },
    #[error("the copy's magic is {magic:#010x}, not \"CVSB\"")]
    BadMagic { magic: u32 },
    #[error("the copy's format version is {version}, not {VERSION}")]
    BadVersion { version: u16 },
    /// A bit flip or a torn write.
    #[error("the copy's checksum does not match its contents")]
    ChecksumMismatch,
    /// The checksum verified, so a writer put something in bytes this format reserves.
    #[error("the copy's reserved bytes are not zero")]
    NonZeroReserved,
    /// The checksum verified, but the state breaks an invariant.
    #[error("the copy verifies but its state is invalid: {0}")]
    Invalid(DurableError),
}

/// The state to boot from, as chosen by [`choose`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Chosen {
    /// At least one copy verifies.
    Formatted {
        /// The state of the copies with the highest sequence that verify.
        state: DurableState,
        /// The highest sequence among the copies that verify.
        sequence: u64,
        /// Copies that verify and hold `sequence` (and so `encode_copy(&state, sequence)`
        /// exactly). Invariant: `1 ≤ copies_valid ≤ SUPERBLOCK_COPIES`, and it equals the
        /// number of `false` in `copies_to_repair`.
        copies_valid: usize,
        /// Copies that do not hold `encode_copy(&state, sequence)`: stale, damaged, blank or
        /// unreadable. The shell rewrites them, in ascending order and each synced before the
        /// next, before the replica acts on `state` (see the module documentation).
        copies_to_repair: [bool; SUPERBLOCK_COPIES],
    },
    /// Every copy is blank or unreadable: the replica's storage was wiped. The replica boots as
    /// wiped, never as a fresh member.
    Wiped,
}

/// Why [`choose`] refuses to boot the replica. Each needs an operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DurableRefusal {
    /// A copy verifies but names another cluster or replica: this is not our superblock.
    #[error("copy {copy} belongs to cluster {cluster:#034x} replica {replica}")]
    Foreign { copy: usize, cluster: u128, replica: u8 },
    /// Two copies verify with the same sequence but different states. Every copy of one
    /// sequence is written with the same bytes, so one of them was written by something else.
    #[error("copies {copy_a} and {copy_b} both hold sequence {sequence} with different states")]
    Conflict {
        sequence: u64,
        copy_a: usize,
        copy_b: usize,
    },
    /// The copy with the higher sequence could not have been written after the other.
    #[error("copy {copy_newer} cannot follow copy {copy_older}: {error}")]
    NotMonotone {
        copy_older: usize,
        copy_newer: usize,
        error: DurableError,
    },
    /// No copy verifies, and at least one is not blank. The replica never boots as fresh from
    /// this. `faults[i]` is copy `i`'s fault, or `None` when it could not be read.
    #[error("no superblock copy verifies: {faults:?}")]
    AllCopiesCorrupt {
        faults: [Option<CopyFault>; SUPERBLOCK_COPIES],
    },
}

// The refusal travels in a `Result` through the shell's boot path: keep it small enough to
// return by value (clippy's `result_large_err` draws the line at 128 bytes).
const _: () = assert!(size_of::<DurableRefusal>() <= 128);
const _: () = assert!(size_of::<CopyFault>() <= 32);

/// The bytes of one copy of `state` at `sequence`. The same bytes go to every copy.
///
/// Panics if `state` breaks an invariant: writing it would be a programmer error, and the
/// writers ([`plan_write`], [`plan_format`]) check before they call this.
pub fn encode_copy(state: &DurableState, sequence: u64) -> [u8; COPY_SIZE] {
    assert_eq!(state.check(), Ok(()));

    let mut bytes = [0u8; COPY_SIZE];
    put(&mut bytes, MAGIC_OFFSET, MAGIC.to_le_bytes());
    put(&mut bytes, VERSION_OFFSET, VERSION.to_le_bytes());
    put(&mut bytes, SEQUENCE_OFFSET, sequence.to_le_bytes());
    put_state(&mut bytes, state);
    seal(&mut bytes);

    assert!(reserved_zero(&bytes));
    assert_ne!(bytes, [0u8; COPY_SIZE]);
    bytes
}

/// Write every field of `state` at its offset (magic, version, sequence and checksum are the
/// caller's). The one place that knows where each state field goes.
fn put_state(bytes: &mut [u8; COPY_SIZE], state: &DurableState) {
    put(bytes, CLUSTER_OFFSET, state.cluster.to_le_bytes());
    put(
        bytes,
        CHECKPOINT_CHECKSUM_OFFSET,
        state.checkpoint_checksum.to_le_bytes(),
    );
    put(bytes, COMMIT_MAX_OFFSET, state.commit_max.to_le_bytes());
    put(bytes, CHECKPOINT_OP_OFFSET, state.checkpoint_op.to_le_bytes());
    put(bytes, VIEW_OFFSET, state.view.to_le_bytes());
    put(bytes, LOG_VIEW_OFFSET, state.log_view.to_le_bytes());
    put(bytes, REPLICA_OFFSET, [state.replica]);
    put(bytes, REPLICA_COUNT_OFFSET, [state.replica_count]);
    put(bytes, LOG_HEAD_OP_OFFSET, state.log_head_op.to_le_bytes());
    put(
        bytes,
        LOG_HEAD_CHECKSUM_OFFSET,
        state.log_head_checksum.to_le_bytes(),
    );
    let len = u16::try_from(state.log_suffix.len()).expect("checked: at most LOG_SUFFIX_MAX");
    put(bytes, LOG_SUFFIX_LEN_OFFSET, len.to_le_bytes());
    for (index, checksum) in state.log_suffix.iter().enumerate() {
        put(
            bytes,
            LOG_SUFFIX_OFFSET + index * size_of::<u128>(),
            checksum.to_le_bytes(),
        );
    }
}

/// Decode and verify one copy. Never panics on any input, and reads no byte outside `bytes`.
///
/// `bytes` is a version-2 copy of [`COPY_SIZE`] bytes, or a version-1 copy of
/// [`COPY_SIZE_V1`] bytes (read for migration: its state has an empty `log_suffix`).
pub fn decode_copy(bytes: &[u8]) -> Result<(DurableState, u64), CopyFault> {
    if bytes.len() == COPY_SIZE_V1 {
        return decode_copy_v1(bytes);
    }
    let Ok(bytes) = <&[u8; COPY_SIZE]>::try_from(bytes) else {
        return Err(CopyFault::WrongSize {
            size_bytes: bytes.len(),
        });
    };
    if bytes.iter().all(|&byte| byte == 0) {
        return Err(CopyFault::Blank);
    }
    let magic = u32::from_le_bytes(get(bytes, MAGIC_OFFSET));
    if magic != MAGIC {
        return Err(CopyFault::BadMagic { magic });
    }
    let version = u16::from_le_bytes(get(bytes, VERSION_OFFSET));
    if version != VERSION {
        return Err(CopyFault::BadVersion { version });
    }
    let checksum = u128::from_le_bytes(get(bytes, CHECKSUM_OFFSET));
    if checksum != xxh3_128(&bytes[..CHECKSUM_OFFSET]) {
        return Err(CopyFault::ChecksumMismatch);
    }
    decode_fields(bytes)
}

/// A version-1 copy: the first 112 bytes of today's layout (bytes 88..96 reserved), then the
/// checksum of those bytes.
fn decode_copy_v1(bytes: &[u8]) -> Result<(DurableState, u64), CopyFault> {
    debug_assert_eq!(bytes.len(), COPY_SIZE_V1);
    if bytes.iter().all(|&byte| byte == 0) {
        return Err(CopyFault::Blank);
    }
    // Version 1's fields sit where version 2's do: decode them from a version-2 image whose
    // suffix is empty.
    let mut image = [0u8; COPY_SIZE];
    image[..CHECKSUM_OFFSET_V1].copy_from_slice(&bytes[..CHECKSUM_OFFSET_V1]);
    let magic = u32::from_le_bytes(get(&image, MAGIC_OFFSET));
    if magic != MAGIC {
        return Err(CopyFault::BadMagic { magic });
    }
    let version = u16::from_le_bytes(get(&image, VERSION_OFFSET));
    if version != VERSION_V1 {
        return Err(CopyFault::BadVersion { version });
    }
    let mut checksum = [0u8; CHECKSUM_SIZE];
    checksum.copy_from_slice(&bytes[CHECKSUM_OFFSET_V1..COPY_SIZE_V1]);
    if u128::from_le_bytes(checksum) != xxh3_128(&bytes[..CHECKSUM_OFFSET_V1]) {
        return Err(CopyFault::ChecksumMismatch);
    }
    // Version 1 reserved all of bytes 88..96, where version 2 keeps the suffix length.
    if image[LOG_SUFFIX_LEN_OFFSET..LOG_SUFFIX_LEN_OFFSET + size_of::<u16>()]
        .iter()
        .any(|&byte| byte != 0)
    {
        return Err(CopyFault::NonZeroReserved);
    }
    decode_fields(&image)
}

/// The state and sequence of a copy whose magic, version and checksum verified.
fn decode_fields(bytes: &[u8; COPY_SIZE]) -> Result<(DurableState, u64), CopyFault> {
    if !reserved_zero(bytes) {
        return Err(CopyFault::NonZeroReserved);
    }
    let sequence = u64::from_le_bytes(get(bytes, SEQUENCE_OFFSET));
    let log_head_op = u64::from_le_bytes(get(bytes, LOG_HEAD_OP_OFFSET));
    let suffix_len = usize::from(u16::from_le_bytes(get(bytes, LOG_SUFFIX_LEN_OFFSET)));
    if suffix_len > LOG_SUFFIX_MAX {
        return Err(CopyFault::Invalid(DurableError::LogSuffixTooLong {
            len: suffix_len,
            log_head_op,
        }));
    }
    let suffix_bytes = &bytes[LOG_SUFFIX_OFFSET..LOG_SUFFIX_OFFSET + LOG_SUFFIX_SIZE];
    let (used, unused) = suffix_bytes.split_at(suffix_len * size_of::<u128>());
    if unused.iter().any(|&byte| byte != 0) {
        return Err(CopyFault::NonZeroReserved);
    }
    let log_suffix = used
        .chunks_exact(size_of::<u128>())
        .map(|chunk| {
            let mut checksum = [0u8; size_of::<u128>()];
            checksum.copy_from_slice(chunk);
            u128::from_le_bytes(checksum)
        })
        .collect();
    let state = DurableState {
        cluster: u128::from_le_bytes(get(bytes, CLUSTER_OFFSET)),
        replica: u8::from_le_bytes(get(bytes, REPLICA_OFFSET)),
        replica_count: u8::from_le_bytes(get(bytes, REPLICA_COUNT_OFFSET)),
        view: u32::from_le_bytes(get(bytes, VIEW_OFFSET)),
        log_view: u32::from_le_bytes(get(bytes, LOG_VIEW_OFFSET)),
        commit_max: u64::from_le_bytes(get(bytes, COMMIT_MAX_OFFSET)),
        checkpoint_op: u64::from_le_bytes(get(bytes, CHECKPOINT_OP_OFFSET)),
        checkpoint_checksum: u128::from_le_bytes(get(bytes, CHECKPOINT_CHECKSUM_OFFSET)),
        log_head_op,
        log_head_checksum: u128::from_le_bytes(get(bytes, LOG_HEAD_CHECKSUM_OFFSET)),
        log_suffix,
    };
    state.check().map_err(CopyFault::Invalid)?;
    Ok((state, sequence))
}

/// Choose the state to boot from, among the copies the shell read. `copies[i]` is `None` when
/// copy `i` could not be read at all; it counts as blank.
///
/// Takes the highest sequence among the copies that verify (see the module documentation for
/// why that is sound, and for the repair the shell must do before the replica acts on the
/// result). Refuses, in this order of precedence: a copy of another cluster or replica, two
/// differing copies of one sequence, copies that are not monotone in their sequence order, and
/// no valid copy when at least one is not blank.
///
/// The result depends only on the set of copies, never on which position holds which.
pub fn choose(
    copies: &[Option<&[u8]>; SUPERBLOCK_COPIES],
    cluster: u128,
    replica: u8,
) -> Result<Chosen, DurableRefusal> {
    let decoded: [Option<Result<(DurableState, u64), CopyFault>>; SUPERBLOCK_COPIES] =
        std::array::from_fn(|copy| copies[copy].map(decode_copy));
    let valid: [Option<(DurableState, u64)>; SUPERBLOCK_COPIES] =
        std::array::from_fn(|copy| decoded[copy].clone().and_then(Result::ok));

    for (copy, valid_copy) in valid.iter().enumerate() {
        let Some((state, _)) = valid_copy else {
            continue;
        };
        if state.cluster != cluster || state.replica != replica {
            return Err(DurableRefusal::Foreign {
                copy,
                cluster: state.cluster,
                replica: state.replica,
            });
        }
    }

    let Some(sequence) = valid.iter().flatten().map(|&(_, sequence)| sequence).max() else {
        let blank_count = decoded
            .iter()
            .filter(|read| matches!(read, None | Some(Err(CopyFault::Blank))))
            .count();
        if blank_count == SUPERBLOCK_COPIES {
            return Ok(Chosen::Wiped);
        }
        assert!(blank_count < SUPERBLOCK_COPIES);
        let faults = std::array::from_fn(|copy| {
            decoded[copy]
                .as_ref()
                .map(|read| *read.as_ref().expect_err("no copy is valid"))
        });
        return Err(DurableRefusal::AllCopiesCorrupt { faults });
    };

    // Every pair of valid copies: equal sequences must hold equal states, and the state of the
    // higher sequence must be a possible successor of the other. At most 4 · 3 / 2 = 6 pairs.
    for copy_a in 0..SUPERBLOCK_COPIES {
        let Some((state_a, sequence_a)) = &valid[copy_a] else {
            continue;
        };
        for (copy_b, valid_b) in valid.iter().enumerate().skip(copy_a + 1) {
            let Some((state_b, sequence_b)) = valid_b else {
                continue;
            };
            if sequence_a == sequence_b {
                if state_a != state_b {
                    return Err(DurableRefusal::Conflict {
                        sequence: *sequence_a,
                        copy_a,
                        copy_b,
                    });
                }
                continue;
            }
            let (copy_older, state_older, copy_newer, state_newer) = if sequence_a < sequence_b {
                (copy_a, state_a, copy_b, state_b)
            } else {
                (copy_b, state_b, copy_a, state_a)
            };
            state_older
                .check_successor(state_newer)
                .map_err(|error| DurableRefusal::NotMonotone {
                    copy_older,
                    copy_newer,
                    error,
                })?;
        }
    }

    let state = valid
        .iter()
        .flatten()
        .find(|&&(_, copy_sequence)| copy_sequence == sequence)
        .map(|(state, _)| state.clone())
        .expect("the maximum is the sequence of some valid copy");
    let copies_to_repair: [bool; SUPERBLOCK_COPIES] = std::array::from_fn(
        |copy| !matches!(valid[copy], Some((_, copy_sequence)) if copy_sequence == sequence),
    );
    let copies_valid = copies_to_repair.iter().filter(|&&repair| !repair).count();

    assert_eq!(state.check(), Ok(()));
    assert_eq!(state.cluster, cluster);
    assert_eq!(state.replica, replica);
    assert!(copies_valid >= 1);
    assert!(copies_valid <= SUPERBLOCK_COPIES);
    Ok(Chosen::Formatted {
        state,
        sequence,
        copies_valid,
        copies_to_repair,
    })
}

/// Plan the next write: check that `next` may follow `current`, and return the new sequence
/// (`current_sequence + 1`) and the bytes to write to every copy.
///
/// The shell must write the bytes to every copy, in the order `0..SUPERBLOCK_COPIES`, and sync
/// each copy before it writes the next. The write is complete when the last copy is synced, and
/// only then may the replica act on `next`. That bounds a crash to tearing one copy, which is
/// what makes [`choose`] sound (see the module documentation).
///
/// Precondition: every copy holds `current` at `current_sequence`, which holds after a complete
/// write, and after the repair that follows [`choose`].
///
/// An `Err` is a programmer error in the caller, which asserts on it. `next` may equal
/// `current`: that rewrites the same state at a new sequence.
pub fn plan_write(
    current: &DurableState,
    current_sequence: u64,
    next: &DurableState,
) -> Result<(u64, [u8; COPY_SIZE]), DurableError> {
    current.check()?;
    next.check()?;
    current.check_successor(next)?;
    let sequence = current_sequence
        .checked_add(1)
        .ok_or(DurableError::SequenceExhausted)?;

    let bytes = encode_copy(next, sequence);
    // Paired with the checks above: what the shell will write reads back as what was planned.
    assert_eq!(decode_copy(&bytes), Ok((next.clone(), sequence)));
    assert!(sequence > current_sequence);
    Ok((sequence, bytes))
}

/// Plan the first write to blank copies, at [`SEQUENCE_FORMATTED`]: formatting a replica with
/// [`DurableState::formatted`], or a wiped replica's first durable state. The shell writes and
/// syncs the copies exactly as for [`plan_write`].
///
/// Precondition: every copy is blank ([`choose`] returned [`Chosen::Wiped`]). Formatting over an
/// older superblock is refused by the caller: a crash partway would leave older copies with
/// higher sequences, and [`choose`] would take those.
pub fn plan_format(state: &DurableState) -> Result<(u64, [u8; COPY_SIZE]), DurableError> {
    state.check()?;
    let bytes = encode_copy(state, SEQUENCE_FORMATTED);
    assert_eq!(decode_copy(&bytes), Ok((state.clone(), SEQUENCE_FORMATTED)));
    Ok((SEQUENCE_FORMATTED, bytes))
}

/// Write `value` at `offset`. The offsets are constants that the layout assertions place within
/// the copy, so the slice is always in bounds.
fn put<const N: usize>(bytes: &mut [u8; COPY_SIZE], offset: usize, value: [u8; N]) {
    bytes[offset..offset + N].copy_from_slice(&value);
}

/// Read `N` bytes at `offset`; in bounds for the same reason as [`put`].
fn get<const N: usize>(bytes: &[u8; COPY_SIZE], offset: usize) -> [u8; N] {
    let mut value = [0u8; N];
    value.copy_from_slice(&bytes[offset..offset + N]);
    value
}

/// Write the checksum of everything before it.
fn seal(bytes: &mut [u8; COPY_SIZE]) {
    let checksum = xxh3_128(&bytes[..CHECKSUM_OFFSET]);
    put(bytes, CHECKSUM_OFFSET, checksum.to_le_bytes());
}

fn reserved_zero(bytes: &[u8; COPY_SIZE]) -> bool {
    let head = &bytes[RESERVED_HEAD_OFFSET..RESERVED_HEAD_OFFSET + RESERVED_HEAD_SIZE];
    let tail = &bytes[RESERVED_TAIL_OFFSET..RESERVED_TAIL_OFFSET + RESERVED_TAIL_SIZE];
    let middle = &bytes[RESERVED_MIDDLE_OFFSET..RESERVED_MIDDLE_OFFSET + RESERVED_MIDDLE_SIZE];
    head.iter().chain(tail).chain(middle).all(|&byte| byte == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLUSTER: u128 = 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210;
    const REPLICA: u8 = 1;

    fn state_example() -> DurableState {
        DurableState {
            cluster: CLUSTER,
            replica: REPLICA,
            replica_count: 3,
            view: 7,
            log_view: 5,
            commit_max: 1_000,
            checkpoint_op: 960,
            checkpoint_checksum: 0xaaaa_bbbb_cccc_dddd_eeee_ffff_0000_1111,
            log_head_op: 1_003,
            log_head_checksum: 0x1234_5678_9abc_def0_0fed_cba9_8765_4321,
            log_suffix: vec![0x0bad_cafe, 0xfeed_f00d_0000_0000_0000_0000_0000_0001],
        }
    }

    /// `state` with `sequence`, bypassing the invariant check, with a valid checksum: what a
    /// buggy writer would leave.
    fn encode_unchecked(state: &DurableState, sequence: u64) -> [u8; COPY_SIZE] {
        let mut bytes = encode_copy(&state_example(), sequence);
        put_state(&mut bytes, state);
        seal(&mut bytes);
        bytes
    }

    fn choose_from(copies: [Option<&[u8]>; SUPERBLOCK_COPIES]) -> Result<Chosen, DurableRefusal> {
        choose(&copies, CLUSTER, REPLICA)
    }

    fn formatted(chosen: Result<Chosen, DurableRefusal>) -> (DurableState, u64, usize, [bool; 4]) {
        match chosen {
            Ok(Chosen::Formatted {
                state,
                sequence,
                copies_valid,
                copies_to_repair,
            }) => (state, sequence, copies_valid, copies_to_repair),
            other => panic!("expected Formatted, got {other:?}"),
        }
    }

    #[test]
    fn round_trip() {
        let state = state_example();
        for sequence in [0, 1, 2, 0x0102_0304_0506_0708, u64::MAX] {
            let bytes = encode_copy(&state, sequence);
            assert_eq!(decode_copy(&bytes), Ok((state.clone(), sequence)));
        }
    }

    #[test]
    fn layout_is_little_endian_at_the_documented_offsets() {
        let state = state_example();
        let bytes = encode_copy(&state, 0x0102_0304_0506_0708);
        assert_eq!(&bytes[0..4], b"CVSB");
        assert_eq!(&bytes[4..6], &[2, 0]);
        assert_eq!(&bytes[6..8], &[0, 0]);
        assert_eq!(&bytes[8..16], &[8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(&bytes[16..32], &CLUSTER.to_le_bytes());
        assert_eq!(&bytes[32..48], &state.checkpoint_checksum.to_le_bytes());
        assert_eq!(&bytes[48..56], &1_000u64.to_le_bytes());
        assert_eq!(&bytes[56..64], &960u64.to_le_bytes());
        assert_eq!(&bytes[64..68], &7u32.to_le_bytes());
        assert_eq!(&bytes[68..72], &5u32.to_le_bytes());
        assert_eq!(bytes[72], REPLICA);
        assert_eq!(bytes[73], 3);
        assert!(bytes[74..80].iter().all(|&byte| byte == 0));
        assert_eq!(&bytes[80..88], &1_003u64.to_le_bytes());
        assert_eq!(&bytes[88..90], &2u16.to_le_bytes());
        assert!(bytes[90..96].iter().all(|&byte| byte == 0));
        assert_eq!(&bytes[96..112], &state.log_head_checksum.to_le_bytes());
        assert_eq!(&bytes[112..128], &state.log_suffix[0].to_le_bytes());
        assert_eq!(&bytes[128..144], &state.log_suffix[1].to_le_bytes());
        assert!(bytes[144..496].iter().all(|&byte| byte == 0));
        assert_eq!(&bytes[496..512], &xxh3_128(&bytes[..496]).to_le_bytes());
        // Pinned, so that a change to the checksum (a seed, another hash) is a deliberate
        // format change and not an accident.
        assert_eq!(u128::from_le_bytes(get(&bytes, CHECKSUM_OFFSET)), CHECKSUM_PINNED);
    }

    const CHECKSUM_PINNED: u128 = 0x4a48_3dbe_fef1_628d_aaea_0c0b_54a2_ee65;

    #[test]
    fn fault_wrong_size() {
        let bytes = encode_copy(&state_example(), 3);
        for size_bytes in [0, 1, COPY_SIZE - 1] {
            assert_eq!(
                decode_copy(&bytes[..size_bytes]),
                Err(CopyFault::WrongSize { size_bytes })
            );
        }
        let mut longer = bytes.to_vec();
        longer.push(0);
        assert_eq!(
            decode_copy(&longer),
            Err(CopyFault::WrongSize {
                size_bytes: COPY_SIZE + 1
            })
        );
        // A short read of zeros is a wrong size, not a blank copy.
        assert_eq!(
            decode_copy(&[0u8; 64]),
            Err(CopyFault::WrongSize { size_bytes: 64 })
        );
    }

    #[test]
    fn fault_blank() {
        assert_eq!(decode_copy(&[0u8; COPY_SIZE]), Err(CopyFault::Blank));
    }

    #[test]
    fn fault_bad_magic() {
        let mut bytes = encode_copy(&state_example(), 3);
        bytes[0] = b'X';
        seal(&mut bytes);
        assert!(matches!(decode_copy(&bytes), Err(CopyFault::BadMagic { .. })));
    }

    #[test]
    fn fault_bad_version() {
        let mut bytes = encode_copy(&state_example(), 3);
        put(&mut bytes, VERSION_OFFSET, 3u16.to_le_bytes());
        seal(&mut bytes);
        assert_eq!(decode_copy(&bytes), Err(CopyFault::BadVersion { version: 3 }));
        // A version-1 copy is read only at its own size, never inside a version-2 copy.
        put(&mut bytes, VERSION_OFFSET, VERSION_V1.to_le_bytes());
        seal(&mut bytes);
        assert_eq!(decode_copy(&bytes), Err(CopyFault::BadVersion { version: 1 }));
    }

    /// The version-1 bytes of `state` (whose suffix must be empty), as a build before
    /// 2026-12-02 wrote them.
    fn encode_v1(state: &DurableState, sequence: u64) -> Vec<u8> {
        assert!(state.log_suffix.is_empty());
        let bytes = encode_copy(state, sequence);
        let mut v1 = bytes[..CHECKSUM_OFFSET_V1].to_vec();
        v1[VERSION_OFFSET..VERSION_OFFSET + 2].copy_from_slice(&VERSION_V1.to_le_bytes());
        let checksum = xxh3_128(&v1);
        v1.extend_from_slice(&checksum.to_le_bytes());
        assert_eq!(v1.len(), COPY_SIZE_V1);
        v1
    }

    #[test]
    fn version_1_copies_are_read_with_an_empty_suffix() {
        let state = DurableState {
            log_suffix: Vec::new(),
            ..state_example()
        };
        let v1 = encode_v1(&state, 17);
        assert_eq!(decode_copy(&v1), Ok((state.clone(), 17)));
        // choose works on version-1 copies as on today's, so a shell can migrate them.
        let copies = [Some(&v1[..]), Some(&v1[..]), Some(&v1[..]), Some(&v1[..])];
        assert_eq!(
            formatted(choose_from(copies)),
            (state.clone(), 17, SUPERBLOCK_COPIES, [false; SUPERBLOCK_COPIES])
        );
        // Its own faults are still caught: a flip, a version-2 marker, a reserved byte.
        let mut flipped = v1.clone();
        flipped[50] ^= 1;
        assert_eq!(decode_copy(&flipped), Err(CopyFault::ChecksumMismatch));
        let mut wrong_version = v1.clone();
        wrong_version[VERSION_OFFSET] = 2;
        let checksum = xxh3_128(&wrong_version[..CHECKSUM_OFFSET_V1]);
        wrong_version[CHECKSUM_OFFSET_V1..].copy_from_slice(&checksum.to_le_bytes());
        assert_eq!(
            decode_copy(&wrong_version),
            Err(CopyFault::BadVersion { version: 2 })
        );
        let mut reserved = v1;
        reserved[LOG_SUFFIX_LEN_OFFSET] = 1;
        let checksum = xxh3_128(&reserved[..CHECKSUM_OFFSET_V1]);
        reserved[CHECKSUM_OFFSET_V1..].copy_from_slice(&checksum.to_le_bytes());
        assert_eq!(decode_copy(&reserved), Err(CopyFault::NonZeroReserved));
    }

    #[test]
    fn the_log_suffix_is_bounded_and_its_unused_room_is_zero() {
        let mut bytes = encode_copy(&state_example(), 3);
        // A checksum past the suffix's length: reserved.
        put(&mut bytes, LOG_SUFFIX_OFFSET + 5 * 16, 7u128.to_le_bytes());
        seal(&mut bytes);
        assert_eq!(decode_copy(&bytes), Err(CopyFault::NonZeroReserved));
        // A length beyond the room.
        let mut bytes = encode_copy(&state_example(), 3);
        put(
            &mut bytes,
            LOG_SUFFIX_LEN_OFFSET,
            (LOG_SUFFIX_MAX as u16 + 1).to_le_bytes(),
        );
        seal(&mut bytes);
        assert!(matches!(
            decode_copy(&bytes),
            Err(CopyFault::Invalid(DurableError::LogSuffixTooLong { .. }))
        ));
        // More checksums than ops below the head.
        let state = DurableState {
            log_head_op: 2,
            ..state_example()
        };
        assert_eq!(
            state.check(),
            Err(DurableError::LogSuffixTooLong {
                len: 2,
                log_head_op: 2
            })
        );
        // A full suffix round-trips.
        let state = DurableState {
            log_suffix: (0..LOG_SUFFIX_MAX as u128).map(|index| index * 3 + 1).collect(),
            ..state_example()
        };
        assert_eq!(decode_copy(&encode_copy(&state, 9)), Ok((state, 9)));
    }

    #[test]
    fn fault_checksum_mismatch_on_every_single_bit_flip() {
        let bytes = encode_copy(&state_example(), 3);
        for bit in 0..COPY_SIZE * 8 {
            let mut flipped = bytes;
            flipped[bit / 8] ^= 1 << (bit % 8);
            let fault = decode_copy(&flipped).expect_err("a flipped copy never verifies");
            match bit / 8 {
                0..4 => assert!(matches!(fault, CopyFault::BadMagic { .. })),
                4..6 => assert!(matches!(fault, CopyFault::BadVersion { .. })),
                _ => assert_eq!(fault, CopyFault::ChecksumMismatch),
            }
        }
    }

    #[test]
    fn fault_non_zero_reserved() {
        let reserved = (RESERVED_HEAD_OFFSET..RESERVED_HEAD_OFFSET + RESERVED_HEAD_SIZE)
            .chain(RESERVED_TAIL_OFFSET..RESERVED_TAIL_OFFSET + RESERVED_TAIL_SIZE);
        for offset in reserved {
            let mut bytes = encode_copy(&state_example(), 3);
            bytes[offset] = 0x80;
            seal(&mut bytes);
            assert_eq!(
                decode_copy(&bytes),
                Err(CopyFault::NonZeroReserved),
                "offset {offset}"
            );
        }
    }

    #[test]
    fn fault_invalid() {
        let cases = [
            (
                DurableState {
                    replica_count: 0,
                    replica: 0,
                    ..state_example()
                },
                DurableError::ReplicaCountInvalid { replica_count: 0 },
            ),
            (
                DurableState {
                    replica_count: REPLICAS_MAX as u8 + 1,
                    ..state_example()
                },
                DurableError::ReplicaCountInvalid {
                    replica_count: REPLICAS_MAX as u8 + 1,
                },
            ),
            (
                DurableState {
                    replica: 3,
                    replica_count: 3,
                    ..state_example()
                },
                DurableError::ReplicaInvalid {
                    replica: 3,
                    replica_count: 3,
                },
            ),
            (
                DurableState {
                    view: 4,
                    log_view: 5,
                    ..state_example()
                },
                DurableError::LogViewAheadOfView { log_view: 5, view: 4 },
            ),
            (
                DurableState {
                    commit_max: 959,
                    checkpoint_op: 960,
                    ..state_example()
                },
                DurableError::CheckpointAheadOfCommit {
                    checkpoint_op: 960,
                    commit_max: 959,
                },
            ),
        ];
        for (state, error) in cases {
            assert_eq!(state.check(), Err(error));
            assert_eq!(
                decode_copy(&encode_unchecked(&state, 3)),
                Err(CopyFault::Invalid(error))
            );
        }
    }

    #[test]
    fn check_accepts_the_boundaries() {
        assert_eq!(DurableState::formatted(CLUSTER, 0, 1).check(), Ok(()));
        assert_eq!(
            DurableState::formatted(CLUSTER, REPLICAS_MAX as u8 - 1, REPLICAS_MAX as u8).check(),
            Ok(())
        );
        let equal = DurableState {
            view: 5,
            log_view: 5,
            commit_max: 960,
            ..state_example()
        };
        assert_eq!(equal.check(), Ok(()));
    }

    #[test]
    #[should_panic]
    fn encode_refuses_an_invalid_state() {
        encode_copy(
            &DurableState {
                view: 4,
                log_view: 5,
                ..state_example()
            },
            3,
        );
    }

    #[test]
    fn choose_all_copies_equal() {
        let bytes = encode_copy(&state_example(), 9);
        let chosen = choose_from([Some(&bytes), Some(&bytes), Some(&bytes), Some(&bytes)]);
        assert_eq!(
            chosen,
            Ok(Chosen::Formatted {
                state: state_example(),
                sequence: 9,
                copies_valid: 4,
                copies_to_repair: [false; 4],
            })
        );
    }

    #[test]
    fn choose_wiped() {
        let blank = [0u8; COPY_SIZE];
        assert_eq!(choose_from([None, None, None, None]), Ok(Chosen::Wiped));
        assert_eq!(choose_from([Some(&blank); 4]), Ok(Chosen::Wiped));
        assert_eq!(
            choose_from([Some(&blank), None, Some(&blank), None]),
            Ok(Chosen::Wiped)
        );
    }

    #[test]
    fn choose_interrupted_format_boots_and_repairs() {
        let (sequence, bytes) = plan_format(&DurableState::formatted(CLUSTER, REPLICA, 3)).unwrap();
        let blank = [0u8; COPY_SIZE];
        let chosen = formatted(choose_from([Some(&bytes), Some(&blank), None, Some(&blank)]));
        assert_eq!(
            chosen,
            (
                DurableState::formatted(CLUSTER, REPLICA, 3),
                sequence,
                1,
                [false, true, true, true]
            )
        );
    }

    #[test]
    fn choose_all_copies_corrupt() {
        let blank = [0u8; COPY_SIZE];
        let mut torn = blank;
        let (_, bytes) = plan_format(&DurableState::formatted(CLUSTER, REPLICA, 3)).unwrap();
        torn[..40].copy_from_slice(&bytes[..40]);
        // A crash during the first copy of a format: refused, never wiped or fresh.
        assert_eq!(
            choose_from([Some(&torn), Some(&blank), Some(&blank), None]),
            Err(DurableRefusal::AllCopiesCorrupt {
                faults: [
                    Some(CopyFault::ChecksumMismatch),
                    Some(CopyFault::Blank),
                    Some(CopyFault::Blank),
                    None
                ],
            })
        );
        // One flipped bit in an otherwise blank superblock is not a wipe.
        let mut flipped = blank;
        flipped[100] = 4;
        assert!(matches!(
            choose_from([Some(&blank), Some(&blank), Some(&flipped), Some(&blank)]),
            Err(DurableRefusal::AllCopiesCorrupt { .. })
        ));
        // A short read is not blank either.
        assert!(matches!(
            choose_from([Some(&blank[..0]), None, None, None]),
            Err(DurableRefusal::AllCopiesCorrupt { .. })
        ));
    }

    #[test]
    fn choose_foreign() {
        let ours = encode_copy(&state_example(), 9);
        let other_cluster = encode_copy(
            &DurableState {
                cluster: CLUSTER + 1,
                ..state_example()
            },
            9,
        );
        let other_replica = encode_copy(
            &DurableState {
                replica: 2,
                ..state_example()
            },
            9,
        );
        assert_eq!(
            choose_from([Some(&ours), Some(&ours), Some(&other_cluster), Some(&ours)]),
            Err(DurableRefusal::Foreign {
                copy: 2,
                cluster: CLUSTER + 1,
                replica: REPLICA
            })
        );
        // Even at a lower sequence than ours.
        let other_replica_older = encode_copy(
            &DurableState {
                replica: 2,
                ..state_example()
            },
            1,
        );
        assert_eq!(
            choose_from([Some(&other_replica_older), Some(&ours), None, None]),
            Err(DurableRefusal::Foreign {
                copy: 0,
                cluster: CLUSTER,
                replica: 2
            })
        );
        // The same copy is the rightful superblock of replica 2.
        let chosen = choose(&[Some(&other_replica), None, None, None], CLUSTER, 2);
        assert!(
            matches!(chosen, Ok(Chosen::Formatted { sequence: 9, .. })),
            "{chosen:?}"
        );
    }

    #[test]
    fn choose_conflict() {
        let a = encode_copy(&state_example(), 9);
        let b = encode_copy(
            &DurableState {
                view: 8,
                ..state_example()
            },
            9,
        );
        assert_eq!(
            choose_from([Some(&a), Some(&a), Some(&b), None]),
            Err(DurableRefusal::Conflict {
                sequence: 9,
                copy_a: 0,
                copy_b: 2
            })
        );
        // A conflict below the highest sequence is refused too: it cannot happen either.
        let c = encode_copy(
            &DurableState {
                view: 9,
                ..state_example()
            },
            10,
        );
        assert_eq!(
            choose_from([Some(&c), Some(&a), Some(&b), None]),
            Err(DurableRefusal::Conflict {
                sequence: 9,
                copy_a: 1,
                copy_b: 2
            })
        );
    }

    #[test]
    fn choose_not_monotone() {
        let older = encode_copy(&state_example(), 9);
        let newer = encode_copy(
            &DurableState {
                view: 6,
                log_view: 5,
                ..state_example()
            },
            10,
        );
        assert_eq!(
            choose_from([Some(&older), Some(&newer), None, None]),
            Err(DurableRefusal::NotMonotone {
                copy_older: 0,
                copy_newer: 1,
                error: DurableError::ViewRegressed { current: 7, next: 6 },
            })
        );
    }

    #[test]
    fn choose_takes_the_highest_sequence_wherever_it_is() {
        let older = state_example();
        let newer = DurableState {
            view: 8,
            ..older.clone()
        };
        let older_bytes = encode_copy(&older, 9);
        let newer_bytes = encode_copy(&newer, 10);
        for position in 0..SUPERBLOCK_COPIES {
            let mut copies: [Option<&[u8]>; 4] = [Some(&older_bytes); 4];
            copies[position] = Some(&newer_bytes);
            let mut copies_to_repair = [true; 4];
            copies_to_repair[position] = false;
            assert_eq!(
                formatted(choose_from(copies)),
                (newer.clone(), 10, 1, copies_to_repair)
            );

            // And the other way round: one old copy among new ones.
            let mut copies: [Option<&[u8]>; 4] = [Some(&newer_bytes); 4];
            copies[position] = Some(&older_bytes);
            assert_eq!(
                formatted(choose_from(copies)),
                (newer.clone(), 10, 3, copies_to_repair.map(|r| !r))
            );
        }
    }

    #[test]
    fn choose_skips_damaged_copies() {
        let older = encode_copy(&state_example(), 9);
        let newer = encode_copy(
            &DurableState {
                view: 8,
                ..state_example()
            },
            10,
        );
        let mut flipped = newer;
        flipped[50] ^= 2;
        let mut torn = older;
        torn[..60].copy_from_slice(&newer[..60]);
        let chosen = formatted(choose_from([Some(&flipped), Some(&torn), Some(&older), None]));
        assert_eq!(chosen, (state_example(), 9, 1, [true, true, false, true]));
    }

    #[test]
    fn plan_write_increments_the_sequence_and_allows_the_same_state() {
        let current = state_example();
        let (sequence, bytes) = plan_write(&current, 41, &current).unwrap();
        assert_eq!(sequence, 42);
        assert_eq!(decode_copy(&bytes), Ok((current.clone(), 42)));

        let next = DurableState {
            view: 9,
            log_view: 9,
            commit_max: 2_000,
            checkpoint_op: 1_920,
            checkpoint_checksum: 5,
            ..current.clone()
        };
        let (sequence, bytes) = plan_write(&current, 42, &next).unwrap();
        assert_eq!(sequence, 43);
        assert_eq!(bytes, encode_copy(&next, 43));
    }

    #[test]
    fn plan_write_refuses_regressions_and_changes() {
        let current = state_example();
        let cases = [
            (
                DurableState {
                    cluster: CLUSTER ^ 1,
                    ..current.clone()
                },
                DurableError::ClusterChanged,
            ),
            (
                DurableState {
                    replica: 0,
                    ..current.clone()
                },
                DurableError::ReplicaChanged { current: 1, next: 0 },
            ),
            (
                DurableState {
                    replica_count: 5,
                    ..current.clone()
                },
                DurableError::ReplicaCountChanged { current: 3, next: 5 },
            ),
            (
                DurableState {
                    view: 6,
                    log_view: 5,
                    ..current.clone()
                },
                DurableError::ViewRegressed { current: 7, next: 6 },
            ),
            (
                DurableState {
                    log_view: 4,
                    ..current.clone()
                },
                DurableError::LogViewRegressed { current: 5, next: 4 },
            ),
            (
                DurableState {
                    commit_max: 999,
                    ..current.clone()
                },
                DurableError::CommitMaxRegressed {
                    current: 1_000,
                    next: 999,
                },
            ),
            (
                DurableState {
                    checkpoint_op: 959,
                    ..current.clone()
                },
                DurableError::CheckpointOpRegressed {
                    current: 960,
                    next: 959,
                },
            ),
            (
                DurableState {
                    checkpoint_checksum: 1,
                    ..current.clone()
                },
                DurableError::CheckpointChecksumChanged { checkpoint_op: 960 },
            ),
            // The next state's own invariants, before any transition check.
            (
                DurableState {
                    view: 8,
                    log_view: 9,
                    ..current.clone()
                },
                DurableError::LogViewAheadOfView { log_view: 9, view: 8 },
            ),
            (
                DurableState {
                    checkpoint_op: 1_001,
                    ..current.clone()
                },
                DurableError::CheckpointAheadOfCommit {
                    checkpoint_op: 1_001,
                    commit_max: 1_000,
                },
            ),
            (
                DurableState {
                    replica: 3,
                    ..current.clone()
                },
                DurableError::ReplicaInvalid {
                    replica: 3,
                    replica_count: 3,
                },
            ),
        ];
        for (next, error) in cases {
            assert_eq!(plan_write(&current, 5, &next), Err(error), "{next:?}");
        }
        assert_eq!(
            plan_write(&current, u64::MAX, &current),
            Err(DurableError::SequenceExhausted)
        );
        let invalid_current = DurableState {
            log_view: 8,
            ..current.clone()
        };
        assert_eq!(
            plan_write(&invalid_current, 5, &current),
            Err(DurableError::LogViewAheadOfView { log_view: 8, view: 7 })
        );
    }

    #[test]
    fn plan_format_checks_the_state() {
        assert_eq!(
            plan_format(&DurableState::formatted(CLUSTER, 3, 3)),
            Err(DurableError::ReplicaInvalid {
                replica: 3,
                replica_count: 3
            })
        );
        let (sequence, bytes) = plan_format(&DurableState::formatted(CLUSTER, 2, 3)).unwrap();
        assert_eq!(sequence, SEQUENCE_FORMATTED);
        assert_eq!(
            decode_copy(&bytes),
            Ok((DurableState::formatted(CLUSTER, 2, 3), SEQUENCE_FORMATTED))
        );
    }

    /// Why the shell must repair before the replica acts on an adopted in-progress write. The
    /// write of `b` crashed after copy 0. Booting adopts `b`; if the replica acted on `b` at once
    /// (say, sent a message for view 8) and the next write crashed tearing copy 0, the only copy
    /// of `b` is gone, and the replica boots from `a`, behind what it already acted on. With the
    /// repair, every copy holds `b` before the replica acts.
    #[test]
    fn acting_before_repair_can_roll_back() {
        let a = state_example();
        let b = DurableState { view: 8, ..a.clone() };
        let c = DurableState { view: 9, ..a.clone() };
        let (sequence_a, bytes_a) = plan_write(&a, 4, &a).unwrap();
        let (sequence_b, bytes_b) = plan_write(&a, sequence_a, &b).unwrap();

        let mut copies = [bytes_b, bytes_a, bytes_a, bytes_a];
        let read = |copies: &[[u8; COPY_SIZE]; 4]| choose_from(copies.each_ref().map(|copy| Some(&copy[..])));
        let (state, sequence, copies_valid, copies_to_repair) = formatted(read(&copies));
        assert_eq!((&state, sequence, copies_valid), (&b, sequence_b, 1));

        // Without repair: the next write tears copy 0 and the adopted state is lost.
        let (_, bytes_c) = plan_write(&b, sequence_b, &c).unwrap();
        let mut unrepaired = copies;
        unrepaired[0][..70].copy_from_slice(&bytes_c[..70]);
        assert_eq!(formatted(read(&unrepaired)).0, a);

        // With repair first: the same crash leaves three copies of `b`.
        let repair = encode_copy(&state, sequence);
        for (copy, bytes) in copies.iter_mut().enumerate() {
            if copies_to_repair[copy] {
                *bytes = repair;
            }
        }
        assert_eq!(formatted(read(&copies)), (b.clone(), sequence_b, 4, [false; 4]));
        copies[0][..70].copy_from_slice(&bytes_c[..70]);
        assert_eq!(
            formatted(read(&copies)),
            (b, sequence_b, 3, [true, false, false, false])
        );
    }
}
