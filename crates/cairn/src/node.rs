//! A replication group of one replica over real files: the shell that runs a
//! `cairn_vsr::replica::Replica` for the node's metadata (a cluster of one, `docs/replication.md`).
//!
//! The replica decides; this shell performs its IO and reports the completions:
//!
//! ```text
//! <group dir>/cluster       the group's cluster id (atomic file, written once at format)
//!            /superblock    SUPERBLOCK_COPIES copies of the durable state, COPY_SIZE bytes each
//!            /headers       journal_slots redundant prepare headers, HEADER_SIZE bytes each
//!            /prepares      journal_slots prepares, one message_size_max slot each (sparse)
//!            /checkpoints   two checkpoint slots, checkpoint_size_max bytes each (sparse)
//! ```
//!
//! in the group's shape ([`SHAPE`], the metadata shape: 1 MiB messages, 64 slots).
//!
//! Write order, as the replica requires: a prepare is synced before its redundant header is
//! written (and synced) and only then reported written; superblock copies are written and
//! synced one after another; a checkpoint slot is synced before it is reported. A failed write
//! stops the group: the replica waits for a completion that will never come, so every later
//! request is refused until the process restarts and recovers from what the disk holds.
//!
//! The shell is synchronous: [`LocalGroup::submit`] hands the replica a request and performs
//! the IO it asks for until the reply comes back (a one-replica primary commits as soon as
//! its own prepare is durable). At boot, [`LocalGroup::open`] formats a new group or recovers
//! one from its files, then ticks the replica until it has installed a view and applied every
//! op its log holds.

use bytes::Bytes;
use cairn_storage::transfer::{CheckpointId, ChunkRequest, TransferChunk};
use cairn_vsr::checkpoint::Checkpoint;
use cairn_vsr::constants::{
    HEADER_SIZE, OPERATION_REGISTER, OPERATION_SESSION_EVICTED, SUPERBLOCK_COPIES, Shape,
};
use cairn_vsr::durable::{self, COPY_SIZE, COPY_SIZE_V1, Chosen, DurableState};
use cairn_vsr::header::{Command, Header, Message};
use cairn_vsr::journal::{BodyRule, SlotState, classify_slot, read_back, slot_of};
use cairn_vsr::replica::{Bugs, Config, Destination, Output, Recovered, Replica, StateMachine, Status};
use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

#[cfg(test)]
mod sim;
mod transfer;
pub use transfer::{TransferPace, TransferProgress};

const CLUSTER_FILE: &str = "cluster";
const SUPERBLOCK_FILE: &str = "superblock";
/// The superblock of a group being formatted: renamed to [`SUPERBLOCK_FILE`] once every copy
/// is synced, so a crash during the format leaves no half-formatted group.
const SUPERBLOCK_FORMAT_FILE: &str = "superblock.format";
const HEADERS_FILE: &str = "headers";
const PREPARES_FILE: &str = "prepares";
const CHECKPOINTS_FILE: &str = "checkpoints";
/// Made by a wiped replica's open (`LocalGroup::rejoin_wiped`) before its blank superblock,
/// removed once its first durable state is written: a blank superblock beside it is that
/// open's, not damage, so a later open may start the directory over.
const REJOINING_FILE: &str = "rejoining";

/// Ticks a restarted group may take to come back: probe rounds nobody answers, then the
/// fallback election (a few hundred ticks). Far more means a bug or damage that blocks it.
const RECOVERY_TICKS_MAX: u64 = 20_000;
/// Ticks a request may wait for its reply once the group is up. A one-replica primary in
/// status normal answers without any.
const REQUEST_TICKS_MAX: u64 = 20_000;
/// Most ticks a group with peers takes at once when it was served late.
const TICKS_CATCH_UP_MAX: u32 = 10;

/// With peers, ticks between handing a request that has no reply to the replica again.
const REQUEST_RESEND_TICKS: u32 = 10;

/// Why a group cannot open or answer.
#[derive(Debug, thiserror::Error)]
pub enum GroupError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    /// What the files hold cannot be booted from; they are left as they are.
    #[error("{}: {reason}", dir.display())]
    Refused { dir: PathBuf, reason: String },
    /// Like `Refused`, for damage: bytes that fail verification where nothing may be cut
    /// away (a journal below its durable frontier, every superblock copy, the named
    /// checkpoint). A group of one refuses; a replica with peers sets the files aside and
    /// rejoins wiped.
    #[error("{}: {reason}", dir.display())]
    Damaged { dir: PathBuf, reason: String },
    /// An earlier write failed; nothing more is taken until a restart.
    #[error("the replicated log in {} stopped after a failed write ({reason}); restart the server", dir.display())]
    Stopped { dir: PathBuf, reason: String },
    #[error("a request of {len} bytes exceeds the replicated log's limit of {max} bytes")]
    TooLarge { len: usize, max: usize },
    /// The request was not taken (`reason`): nothing of it was written; later requests go on.
    #[error("{}: the request was not taken ({reason}); nothing of it was stored", dir.display())]
    NotTaken { dir: PathBuf, reason: String },
    /// Writing a prepare failed and the journal undid the write (no space left, say): the op
    /// was not taken, and the group restarted from its files, so later requests go on.
    #[error("{}: a write failed and was undone, the request was not taken: {reason}", dir.display())]
    WriteUndone { dir: PathBuf, reason: String },
    /// A group with peers gave no reply in time: the op may yet commit, or may never.
    #[error("{}: no reply to the request ({reason}); it may or may not have been applied", dir.display())]
    OutcomeUnknown { dir: PathBuf, reason: String },
}

impl GroupError {
    /// `Damaged` when the storage error is damage, `Refused` otherwise, with `reason`.
    pub fn refused_for(error: &cairn_storage::StorageError, dir: &Path, reason: String) -> GroupError {
        let dir = dir.to_path_buf();
        match error {
            cairn_storage::StorageError::Damaged { .. } => GroupError::Damaged { dir, reason },
            _ => GroupError::Refused { dir, reason },
        }
    }

    /// The same failure for another request of the same batch (the error is not `Clone`): an
    /// undone write or a request not taken stays one (nothing was taken), a stop stays that
    /// stop, anything else becomes a stop of the group in `dir` saying what happened.
    pub fn like(&self, dir: &Path) -> GroupError {
        match self {
            GroupError::WriteUndone { dir, reason } => GroupError::WriteUndone {
                dir: dir.clone(),
                reason: reason.clone(),
            },
            GroupError::NotTaken { dir, reason } => GroupError::NotTaken {
                dir: dir.clone(),
                reason: reason.clone(),
            },
            GroupError::Stopped { dir, reason } => GroupError::Stopped {
                dir: dir.clone(),
                reason: reason.clone(),
            },
            GroupError::OutcomeUnknown { dir, reason } => GroupError::OutcomeUnknown {
                dir: dir.clone(),
                reason: reason.clone(),
            },
            other => GroupError::Stopped {
                dir: dir.to_path_buf(),
                reason: other.to_string(),
            },
        }
    }
}

/// The shape of a group this shell runs: the metadata group's (the ring journal of whole
/// prepares suits a log of small ops; a partition's journal is its segment log).
pub const SHAPE: Shape = Shape::METADATA;

/// The group's files besides its journal, each a zone of fixed-size slots.
#[derive(Clone, Copy, Debug)]
enum Zone {
    /// `SUPERBLOCK_COPIES` copies of `COPY_SIZE` bytes.
    Superblock,
    /// Two checkpoints of up to `checkpoint_size_max` bytes.
    Checkpoints,
}

impl Zone {
    fn file_name(self) -> &'static str {
        match self {
            Zone::Superblock => SUPERBLOCK_FILE,
            Zone::Checkpoints => CHECKPOINTS_FILE,
        }
    }
}

struct Files {
    dir: PathBuf,
    /// By zone: the superblock, then the checkpoints.
    files: [File; 2],
    /// Bytes of one checkpoint slot (the group's shape's `checkpoint_size_max`).
    checkpoint_slot_bytes: u64,
    /// Opened for reading only: writes are skipped (the offline checker recovers in memory).
    read_only: bool,
}

impl Files {
    /// The files of a formatted group (never created here: a missing one is an error), for
    /// writing unless `read_only`.
    fn open(dir: &Path, shape: &Shape, read_only: bool) -> Result<Files, GroupError> {
        Ok(Files {
            dir: dir.to_path_buf(),
            files: [
                open_file(&dir.join(SUPERBLOCK_FILE), read_only)?,
                open_file(&dir.join(CHECKPOINTS_FILE), read_only)?,
            ],
            checkpoint_slot_bytes: shape.checkpoint_size_max() as u64,
            read_only,
        })
    }

    fn slot_size(&self, zone: Zone) -> u64 {
        match zone {
            Zone::Superblock => COPY_SIZE as u64,
            Zone::Checkpoints => self.checkpoint_slot_bytes,
        }
    }

    fn io_error(&self, zone: Zone, source: std::io::Error) -> GroupError {
        GroupError::Io {
            path: self.dir.join(zone.file_name()),
            source,
        }
    }

    /// The first `len` bytes of slot `slot` of `zone` (a sparse or short file reads as zeros
    /// past its end, like a never-written slot).
    fn read(&self, zone: Zone, slot: usize, len: usize) -> Result<Vec<u8>, GroupError> {
        debug_assert!(len as u64 <= self.slot_size(zone));
        self.read_at(zone, slot as u64 * self.slot_size(zone), len)
    }

    /// `len` bytes of `zone`'s file at `offset`, zeros past its end.
    fn read_at(&self, zone: Zone, offset: u64, len: usize) -> Result<Vec<u8>, GroupError> {
        read_file_at(&self.files[zone as usize], offset, len).map_err(|error| self.io_error(zone, error))
    }

    /// Write `bytes` at the start of slot `slot` of `zone` and sync; nothing when read-only.
    fn write_synced(&self, zone: Zone, slot: usize, bytes: &[u8]) -> Result<(), GroupError> {
        debug_assert!(bytes.len() as u64 <= self.slot_size(zone));
        if self.read_only {
            return Ok(());
        }
        write_file_synced(
            &self.files[zone as usize],
            zone.file_name(),
            slot as u64 * self.slot_size(zone),
            bytes,
        )
        .map_err(|error| self.io_error(zone, error))
    }

    /// Every superblock copy, in order, each synced before the next.
    fn write_superblock(&self, bytes: &[u8; COPY_SIZE]) -> Result<(), GroupError> {
        for copy in 0..SUPERBLOCK_COPIES {
            self.write_synced(Zone::Superblock, copy, bytes)?;
        }
        Ok(())
    }
}

fn open_file(path: &Path, read_only: bool) -> Result<File, GroupError> {
    OpenOptions::new()
        .read(true)
        .write(!read_only)
        .open(path)
        .map_err(|source| GroupError::Io {
            path: path.to_path_buf(),
            source,
        })
}

/// `len` bytes of `file` at `offset` (a sparse or short file reads as zeros past its end).
fn read_file_at(file: &File, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
    let mut bytes = vec![0u8; len];
    let mut filled = 0;
    while filled < len {
        match file.read_at(&mut bytes[filled..], offset + filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(bytes)
}

/// Write `bytes` at `offset` of `file` (named `name` for fault injection) and sync it.
fn write_file_synced(file: &File, name: &str, offset: u64, bytes: &[u8]) -> std::io::Result<()> {
    crate::faults::fail_point(&format!("group-write-{name}"))?;
    file.write_all_at(bytes, offset)?;
    file.sync_data()
}

/// The checkpoint the superblock names, as a journal's open needs it (a partition's resolves
/// a state transfer's install with it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamedCheckpoint {
    pub id: CheckpointId,
    /// The checksum of the prepare at its op (the checkpoint's header); 0 without one.
    pub prepare_checksum: u128,
}

/// Where a group keeps its prepares: the ring files of the metadata group ([`RingJournal`]),
/// or a partition's segment log (`crate::partition_group::LogJournal`). The shell around it
/// (superblock, checkpoints, the replica's loop) is the same.
pub trait GroupJournal: Sized {
    /// The shape of the groups that keep their prepares this way.
    const SHAPE: Shape;
    /// What the journal needs besides its directory.
    type Params: Clone + Send + Sync + 'static;
    /// Create an empty journal in `dir`, at format, for group `ids` (cluster, group).
    fn create(dir: &Path, params: &Self::Params, ids: (u128, u64)) -> Result<Self, GroupError>;
    /// Open the journal in `dir` and say what it holds: one state per slot of the shape's
    /// ring (op `o` at slot `o % journal_slots`), and each damaged entry that may hold an
    /// acknowledged prepare, described for an operator. `checkpoint` is the one the
    /// superblock names (a journal a state transfer staged for it is made live first).
    #[allow(clippy::type_complexity)]
    fn open(
        dir: &Path,
        params: &Self::Params,
        read_only: bool,
        ids: (u128, u64),
        checkpoint: NamedCheckpoint,
    ) -> Result<(Self, Vec<SlotState>, Vec<String>), GroupError>;
    /// Write `message`. It counts as written (the replica is told) only after the next
    /// [`GroupJournal::prepares_barrier`], which covers every prepare written since the last.
    fn write_prepare(&mut self, message: &Message) -> Result<(), GroupError>;
    /// Make every prepare written since the last call durable: one barrier for all of them
    /// (group commit across ops). A journal that makes each prepare durable as it writes it,
    /// or that runs `relaxed` (acknowledged once written), does nothing here.
    fn prepares_barrier(&mut self) -> Result<(), GroupError> {
        Ok(())
    }
    /// Make every prepare written so far durable. Called before anything durable may name
    /// them (a checkpoint, the superblock) and on a timer; a no-op for a journal that makes
    /// each prepare durable as it writes it.
    fn flush(&mut self) -> Result<(), GroupError> {
        Ok(())
    }
    /// [`GroupJournal::flush`] at a clean stop: a `relaxed` journal also gives back the
    /// offsets it reserved ahead, so the next start leaves no gap.
    fn flush_for_stop(&mut self) -> Result<(), GroupError> {
        self.flush()
    }
    /// Read prepare `op` back; `None` when the journal no longer holds it whole (logged).
    fn read_prepare(&mut self, op: u64, checksum: u128) -> Option<Message>;
    /// The file or directory a damage report names.
    fn location(&self) -> PathBuf;

    // ----- state transfer (`node::transfer`) -----

    /// Whether a state transfer moves this journal's log with the checkpoint (a partition's
    /// segments). A journal that does not keeps its own and repairs what lies above the
    /// checkpoint from its peers.
    const TRANSFERS_LOG: bool = false;
    /// What this journal offers a peer with its durable checkpoint `checkpoint` (whose state
    /// machine snapshot is `machine`): a log's manifest, or nothing. `Err`: it cannot.
    fn offer(&self, _checkpoint: CheckpointId, _machine: &[u8]) -> Result<Vec<u8>, String> {
        Ok(Vec::new())
    }
    /// Bytes of this journal's log a peer's transfer asks for.
    fn read_chunk(&self, _request: ChunkRequest) -> Result<TransferChunk, String> {
        Err("this journal moves no log".into())
    }
    /// Whether the journal holds op `op` durably as the prepare `checksum`: a transfer of
    /// the checkpoint at that op then keeps the log.
    fn holds_prepare_durably(&self, _op: u64, _checksum: u128) -> bool {
        false
    }
    /// Begin staging the log `offer` describes beside this one, for `checkpoint` (verified,
    /// with checksum `checksum`) while the replica's machine is `own_state`: the offer is
    /// checked against both first. Returns the bytes to fetch.
    fn stage_begin(
        &mut self,
        _offer: &[u8],
        _checkpoint: &Checkpoint,
        _checksum: u128,
        _own_state: &[u8],
    ) -> Result<u64, String> {
        Err("this journal moves no log".into())
    }
    /// The bytes the staging needs next; `None` once it has them all (or none runs).
    fn stage_next(&self) -> Option<ChunkRequest> {
        None
    }
    /// Write a chunk the staging asked for.
    fn stage_chunk(&mut self, _chunk: &TransferChunk) -> Result<(), String> {
        Err("no staging".into())
    }
    /// Start verifying the complete staging whole against its checkpoint, away from the
    /// calling thread (a multi-GB log takes seconds to read back, and the replica worker
    /// that calls this serves many groups). [`GroupJournal::stage_verified`] says when it
    /// is done; then it waits for the commit.
    fn stage_verify(&mut self) -> Result<(), String> {
        Err("no staging".into())
    }
    /// `None` while [`GroupJournal::stage_verify`]'s verification runs; its outcome once
    /// done (`Err`: the staging is not the checkpoint's, or could not be read).
    fn stage_verified(&mut self) -> Option<Result<(), String>> {
        Some(Err("no staging".into()))
    }
    /// Wait for a running [`GroupJournal::stage_verify`] to end, keeping what it staged:
    /// before the group's files are reopened or set aside, nothing else may write there.
    fn stage_settle(&mut self) {}
    /// Remove what was staged (the core did not take it, or it failed). `Err`: it could not
    /// be removed (the group must stop: nothing may name its checkpoint).
    fn stage_abandon(&mut self) -> Result<(), String> {
        Ok(())
    }
    /// The superblock names the staged log's checkpoint: make the staged log live.
    fn stage_commit(&mut self, _checkpoint: NamedCheckpoint) -> Result<(), GroupError> {
        Ok(())
    }
}

/// The metadata group's journal: `journal_slots` prepares in a sparse file of fixed slots,
/// each followed (once synced) by its redundant header in a second file.
pub struct RingJournal {
    dir: PathBuf,
    headers: File,
    prepares: File,
    read_only: bool,
    /// How a slot's prepare body is verified: the group's state machine's rule
    /// (`StateMachine::body_verifies`), every byte checked (a slot has no checksum of its own).
    body_rule: BodyRule,
}

impl RingJournal {
    /// The bytes of prepare slot `slot`: its header, and as much after it as the header's
    /// size says (bounded by the slot) when that size verifies; classification decides what
    /// they are.
    fn read_prepare_slot(&self, slot: usize) -> std::io::Result<Vec<u8>> {
        let slot_bytes = SHAPE.message_size_max as u64;
        let prepare = read_file_at(&self.prepares, slot as u64 * slot_bytes, HEADER_SIZE)?;
        match Header::peek_size(&prepare) {
            Some(Ok(size)) if size > HEADER_SIZE && size <= SHAPE.message_size_max => {
                read_file_at(&self.prepares, slot as u64 * slot_bytes, size)
            }
            _ => Ok(prepare),
        }
    }

    fn io_error(&self, name: &str, source: std::io::Error) -> GroupError {
        GroupError::Io {
            path: self.dir.join(name),
            source,
        }
    }
}

impl GroupJournal for RingJournal {
    const SHAPE: Shape = SHAPE;
    /// The group's state machine's body rule.
    type Params = BodyRule;

    fn create(dir: &Path, body_rule: &BodyRule, _ids: (u128, u64)) -> Result<RingJournal, GroupError> {
        // Empty: nothing of an interrupted earlier format was ever used.
        for name in [HEADERS_FILE, PREPARES_FILE] {
            let path = dir.join(name);
            File::create(&path)
                .and_then(|f| f.sync_all())
                .map_err(|source| GroupError::Io { path, source })?;
        }
        Ok(RingJournal {
            dir: dir.to_path_buf(),
            headers: open_file(&dir.join(HEADERS_FILE), false)?,
            prepares: open_file(&dir.join(PREPARES_FILE), false)?,
            read_only: false,
            body_rule: *body_rule,
        })
    }

    fn open(
        dir: &Path,
        body_rule: &BodyRule,
        read_only: bool,
        (cluster, group): (u128, u64),
        _checkpoint: NamedCheckpoint,
    ) -> Result<(RingJournal, Vec<SlotState>, Vec<String>), GroupError> {
        let journal = RingJournal {
            dir: dir.to_path_buf(),
            headers: open_file(&dir.join(HEADERS_FILE), read_only)?,
            prepares: open_file(&dir.join(PREPARES_FILE), read_only)?,
            read_only,
            body_rule: *body_rule,
        };
        let mut slots = Vec::with_capacity(SHAPE.journal_slots);
        for slot in 0..SHAPE.journal_slots {
            let header = read_file_at(&journal.headers, (slot * HEADER_SIZE) as u64, HEADER_SIZE)
                .map_err(|error| journal.io_error(HEADERS_FILE, error))?;
            let prepare = journal
                .read_prepare_slot(slot)
                .map_err(|error| journal.io_error(PREPARES_FILE, error))?;
            slots.push(classify_slot(
                slot,
                SHAPE.journal_slots,
                &prepare,
                &header,
                cluster,
                group,
                journal.body_rule,
            ));
        }
        // Said up front: with no peer to repair them from, such slots keep the group down.
        let damaged = slots
            .iter()
            .enumerate()
            .filter_map(|(slot, state)| match state {
                SlotState::Faulty { header: Some(header) } => Some(format!("slot {slot} (op {})", header.op)),
                SlotState::Faulty { header: None } => Some(format!("slot {slot} (op unknown)")),
                _ => None,
            })
            .collect();
        Ok((journal, slots, damaged))
    }

    fn write_prepare(&mut self, message: &Message) -> Result<(), GroupError> {
        debug_assert!(!self.read_only, "a read-only group takes no requests");
        let slot = slot_of(message.header.op, SHAPE.journal_slots);
        write_file_synced(
            &self.prepares,
            PREPARES_FILE,
            (slot * SHAPE.message_size_max) as u64,
            &message.encode(),
        )
        .map_err(|error| self.io_error(PREPARES_FILE, error))?;
        write_file_synced(
            &self.headers,
            HEADERS_FILE,
            (slot * HEADER_SIZE) as u64,
            &message.header.encode(),
        )
        .map_err(|error| self.io_error(HEADERS_FILE, error))
    }

    fn read_prepare(&mut self, op: u64, checksum: u128) -> Option<Message> {
        // A group of one reads back only to apply a prepare recovered as a header (this
        // journal recovers whole prepares, so never today); peers' repairs come with the
        // replica network.
        let slot = slot_of(op, SHAPE.journal_slots);
        match self.read_prepare_slot(slot) {
            Ok(bytes) => {
                let prepare = read_back(&bytes, op, checksum, self.body_rule);
                if prepare.is_none() {
                    tracing::error!(
                        dir = %self.dir.display(),
                        op,
                        "the journal no longer holds a prepare it synced; the replica treats its copy as lost (kept on disk as found)"
                    );
                }
                prepare
            }
            Err(error) => {
                tracing::error!(
                    dir = %self.dir.display(),
                    op,
                    "reading a synced prepare back failed ({error}); the replica treats its copy as lost"
                );
                None
            }
        }
    }

    fn location(&self) -> PathBuf {
        self.dir.join(PREPARES_FILE)
    }
}

/// Make `dir`'s superblock file hold `bytes` in every copy, all at once: the copies go to a
/// staging file, which is synced, then renamed over [`SUPERBLOCK_FILE`], the directory
/// synced before and after. A crash leaves the old file (or none) or the new one. Formatting
/// a group and migrating a format-1 superblock both write it this way.
fn install_superblock_file(dir: &Path, bytes: &[u8; COPY_SIZE]) -> Result<(), GroupError> {
    let staging = dir.join(SUPERBLOCK_FORMAT_FILE);
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| GroupError::Io { path, source }
    };
    let file = File::create(&staging).map_err(io(&staging))?;
    for copy in 0..SUPERBLOCK_COPIES {
        file.write_all_at(bytes, (copy * COPY_SIZE) as u64)
            .map_err(io(&staging))?;
    }
    file.sync_all().map_err(io(&staging))?;
    drop(file);
    File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))?;
    std::fs::rename(&staging, dir.join(SUPERBLOCK_FILE)).map_err(io(&staging))?;
    File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))
}

/// Whether `dir`'s superblock file is there, whole, and every byte of it is zero: a wiped
/// replica's (or a durable state lost whole).
fn superblock_is_blank(dir: &Path) -> bool {
    std::fs::read(dir.join(SUPERBLOCK_FILE)).is_ok_and(|bytes| {
        bytes.len() == SUPERBLOCK_COPIES * COPY_SIZE && bytes.iter().all(|&byte| byte == 0)
    })
}

/// Remove a wiped replica's marker from `dir`, if it is there (durably: the directory is
/// synced).
fn remove_rejoining_marker(dir: &Path) -> Result<(), GroupError> {
    let marker = dir.join(REJOINING_FILE);
    if !marker.exists() {
        return Ok(());
    }
    std::fs::remove_file(&marker)
        .and_then(|()| File::open(dir)?.sync_all())
        .map_err(|source| GroupError::Io { path: marker, source })
}

/// Whether a replica with peers in `dir` is mid-rejoin: its files were set aside beside it
/// (a quarantine sibling), or a wiped open began there (its marker) and stopped before the
/// blank superblock. Such a replica is never formatted as a new one.
pub fn rejoin_pending(dir: &Path) -> bool {
    dir.join(REJOINING_FILE).exists() || has_quarantine_sibling(dir)
}

/// Whether the files of a group directory named as `dir` were set aside beside it
/// (`transfer::quarantine`): a missing `dir` then lost them, and its replica is never new.
fn has_quarantine_sibling(dir: &Path) -> bool {
    let (Some(parent), Some(name)) = (dir.parent(), dir.file_name().and_then(|name| name.to_str())) else {
        return false;
    };
    let prefix = format!("{name}.quarantine.");
    std::fs::read_dir(parent).is_ok_and(|entries| {
        entries.flatten().any(|entry| {
            entry
                .file_name()
                .to_str()
                .is_some_and(|found| found.starts_with(&prefix))
        })
    })
}

/// Whether the group in `dir` is gone: no superblock, or a blank one (a node's record says
/// it was formatted, so the node lost it).
pub fn lost_group(dir: &Path) -> bool {
    !is_formatted(dir) || superblock_is_blank(dir)
}

/// Whether `dir` holds a formatted group (its superblock file, written last at format, is
/// there).
pub fn is_formatted(dir: &Path) -> bool {
    dir.join(SUPERBLOCK_FILE).exists()
}

/// Replace a format-1 superblock file by one holding `bytes` (today's format) in every copy
/// (see [`install_superblock_file`]), and reopen it.
fn migrate_superblock(files: &mut Files, bytes: &[u8; COPY_SIZE]) -> Result<(), GroupError> {
    install_superblock_file(&files.dir, bytes)?;
    files.files[Zone::Superblock as usize] = open_file(&files.dir.join(SUPERBLOCK_FILE), false)?;
    Ok(())
}

/// Create `dir` and every missing ancestor, and make their entries durable: each new
/// directory's parent is synced, so a power loss cannot take away a directory whose files a
/// later barrier made durable (a group's acknowledged ops live in it).
fn create_dir_durably(dir: &Path) -> Result<(), GroupError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| GroupError::Io { path, source }
    };
    let mut missing: Vec<&Path> = Vec::new();
    let mut probe = Some(dir);
    while let Some(path) = probe.filter(|path| !path.as_os_str().is_empty() && !path.exists()) {
        missing.push(path);
        probe = path.parent();
    }
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    for created in missing {
        let parent = match created.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => Path::new("."),
        };
        File::open(parent)
            .and_then(|d| d.sync_all())
            .map_err(io(parent))?;
    }
    Ok(())
}

/// Where a group's messages to its other replicas go: the replica network, or a test's or
/// the simulator's network. Never blocks; may drop (VSR repeats what is lost).
pub trait Transport: Send + Sync {
    /// Queue `message` for replica `to` of the same group (`to` is never the sender).
    fn send(&self, to: u8, message: Message);
}

/// Where a group with peers reads the time and waits for its peers' messages: wall time and
/// the inbox's condition variable in the server ([`WallClock`]); virtual time in the
/// simulator (`node::sim`), whose clock runs the other replicas of its world while one
/// waits. Nothing else in [`LocalGroup`] reads a clock, so the simulator runs the server's
/// node code as it is.
pub trait Clock: Send + Sync {
    fn now(&self) -> Instant;
    /// Every message waiting in `inbox`, after waiting until `until` for one if none is.
    fn take_until(&self, inbox: &Inbox, until: Instant) -> Vec<Message>;
}

/// `message` as the replica network carries it from replica `from` of `cluster`: encoded,
/// and checked as the bus's receiver checks its bytes, so nothing sealed for this process
/// only passes (tests' and the simulator's networks).
#[cfg(test)]
pub(crate) fn as_carried(cluster: u128, from: u8, prepare_rule: BodyRule, message: Message) -> Message {
    let check = cairn_bus::MessageCheck::new(cluster, from, 64 << 20, Arc::new(move |_| prepare_rule));
    let header = check
        .header(&cairn_bus::frame::encode_header(&message))
        .expect("a header the replica network takes");
    check
        .body(header, message.body)
        .expect("a body the replica network takes")
}

/// The server's clock: wall time, and waits on the inbox.
pub struct WallClock;

impl Clock for WallClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn take_until(&self, inbox: &Inbox, until: Instant) -> Vec<Message> {
        inbox.take_until(until)
    }
}

/// Messages from peers waiting for their group: the node's receiving side pushes, and
/// whoever holds the group takes them (a waiting request, or a worker). Bounded by
/// [`INBOX_MESSAGES_MAX`] and [`INBOX_BYTES_MAX`]: a group that falls behind drops the newest
/// messages, as the replica network's queues do, and VSR repeats them.
#[derive(Default)]
pub struct Inbox {
    messages: Mutex<InboxQueue>,
    arrived: Condvar,
}

#[derive(Default)]
struct InboxQueue {
    messages: VecDeque<Message>,
    bytes: usize,
    /// Messages dropped because the inbox was full.
    dropped: u64,
    /// Threads waiting in [`Inbox::take_until`] (only the group's holder waits there).
    waiting: usize,
}

/// What [`Inbox::push`] did with a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushed {
    /// Queued; nobody waits for it, so whoever serves the group must be told.
    Queued,
    /// Queued while the group's holder waits in [`Inbox::take_until`]: it is woken and takes
    /// this message with whatever else waits, so nobody else needs telling.
    ToWaiter,
    /// The inbox was full: dropped (and counted).
    Dropped,
}

/// Most messages one group's inbox holds.
pub const INBOX_MESSAGES_MAX: usize = 1024;
/// Most bytes one group's inbox holds: a few of the largest prepares.
pub const INBOX_BYTES_MAX: usize = 4 * Shape::PARTITION.message_size_max;

impl Inbox {
    /// Queue `message` (dropped when the inbox is full), waking a waiting holder.
    pub fn push(&self, message: Message) -> Pushed {
        let mut queue = self.queue();
        let size = message.header.size as usize;
        if queue.messages.len() >= INBOX_MESSAGES_MAX || queue.bytes + size > INBOX_BYTES_MAX {
            queue.dropped += 1;
            return Pushed::Dropped;
        }
        queue.bytes += size;
        queue.messages.push_back(message);
        // A notify is a system call even with nobody waiting: only when someone is.
        if queue.waiting == 0 {
            return Pushed::Queued;
        }
        self.arrived.notify_all();
        Pushed::ToWaiter
    }

    /// Messages dropped so far because the inbox was full.
    #[cfg(test)]
    pub fn dropped(&self) -> u64 {
        self.queue().dropped
    }

    /// Wait until a message is waiting or `until` passes, taking nothing.
    #[cfg(test)]
    pub fn wait_until(&self, until: Instant) {
        drop(self.wait_for_messages(until));
    }

    /// Every message waiting, after waiting for one until `until` if none is.
    pub fn take_until(&self, until: Instant) -> Vec<Message> {
        let mut queue = self.wait_for_messages(until);
        queue.bytes = 0;
        queue.messages.drain(..).collect()
    }

    /// Every message waiting, without waiting.
    pub fn take_now(&self) -> Vec<Message> {
        let mut queue = self.queue();
        queue.bytes = 0;
        queue.messages.drain(..).collect()
    }

    /// Threads waiting in [`Inbox::take_until`] now.
    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.queue().waiting
    }

    /// Whether no message waits.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.queue().messages.is_empty()
    }

    /// The queue, locked (its counts are valid after any panic).
    fn queue(&self) -> std::sync::MutexGuard<'_, InboxQueue> {
        self.messages
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The queue, once it holds a message or `until` has passed.
    fn wait_for_messages(&self, until: Instant) -> std::sync::MutexGuard<'_, InboxQueue> {
        let mut queue = self.queue();
        while queue.messages.is_empty() {
            let now = Instant::now();
            if now >= until {
                break;
            }
            queue.waiting += 1;
            queue = match self.arrived.wait_timeout(queue, until - now) {
                Ok((queue, _)) => queue,
                Err(poisoned) => poisoned.into_inner().0,
            };
            queue.waiting -= 1;
        }
        queue
    }
}

/// A replica's role and positions (`cairn status`, `GET /cluster/status`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct ReplicaStatus {
    /// `primary`, `backup`, `view change` or `recovering`.
    pub role: &'static str,
    pub view: u32,
    /// The last op applied.
    pub commit: u64,
    /// The last op in the log.
    pub op: u64,
    /// It fell behind its peers' journals and wants a state transfer.
    pub transfer_wanted: bool,
    /// The state transfer under way, if one is.
    pub transfer: Option<TransferProgress>,
}

/// A group's replica among its peers (`None` in a [`LocalGroup`]: a group of one).
#[derive(Clone)]
pub struct Peers {
    /// This replica's index: the node's position in the cluster's node list.
    pub replica: u8,
    pub replica_count: u8,
    /// The cluster id every replica of the group shares (a group of one draws its own).
    pub cluster: u128,
    pub transport: Arc<dyn Transport>,
    pub inbox: Arc<Inbox>,
    /// Wall time of one replica tick: the core's timeouts are counted in ticks.
    pub tick: Duration,
    /// How long a request waits for its reply before its outcome is given up as unknown.
    pub request_timeout: Duration,
    /// Whether a directory without a group may be formatted: only for a group new to this
    /// node (the cluster's first start, or a group created by an op this node applied with
    /// its metadata continuous since before it). Never for a replica that lost its files.
    pub format_if_missing: bool,
    /// The node-wide pace of incoming state transfers.
    pub transfer_pace: Arc<TransferPace>,
    /// Set while the node hears no quorum of its peers (`replicas.rs`, "Abdication"): a
    /// primary takes no request then (it could commit none).
    pub abdicating: Arc<std::sync::atomic::AtomicBool>,
    /// The group's primary as this replica last saw it, for the node shell.
    pub primary_seen: Arc<PrimarySeen>,
    /// Time, and the waits for peers' messages ([`WallClock`] in the server).
    pub clock: Arc<dyn Clock>,
}

/// The primary a group's replica last saw (in status normal; none during a view change or
/// recovery), shared by every incarnation of the replica, so the node shell can tell where
/// a request this replica cannot take goes (`forward.rs`) without the group's lock.
#[derive(Debug)]
pub struct PrimarySeen(std::sync::atomic::AtomicU8);

impl Default for PrimarySeen {
    fn default() -> PrimarySeen {
        PrimarySeen(std::sync::atomic::AtomicU8::new(u8::MAX))
    }
}

impl PrimarySeen {
    pub fn get(&self) -> Option<u8> {
        match self.0.load(std::sync::atomic::Ordering::Acquire) {
            u8::MAX => None,
            replica => Some(replica),
        }
    }

    fn set(&self, primary: Option<u8>) {
        self.0
            .store(primary.unwrap_or(u8::MAX), std::sync::atomic::Ordering::Release);
    }
}

/// One replication group over the files of one directory: a group of one replica, or this
/// node's replica of a group with [`Peers`].
pub struct LocalGroup<S: StateMachine, J: GroupJournal = RingJournal> {
    replica: Replica<S>,
    files: Files,
    journal: J,
    cluster: u128,
    /// The durable state every superblock copy holds, and its sequence.
    superblock: (DurableState, u64),
    /// This process's client identities, one per lane: new for every boot, so a session of
    /// an earlier boot (restored from a checkpoint) is never mistaken for one of this boot.
    lanes: Vec<Lane>,
    /// Messages the replica sent to itself, delivered in order.
    to_self: VecDeque<Message>,
    /// Prepares written since the last barrier, in write order (ascending ops): the replica
    /// is told once the barrier covered them.
    unsynced: Vec<(u64, u128)>,
    /// Set by the first failed write that the journal could not undo.
    stopped: Option<String>,
    /// Reopens the group from its files (after a write the journal undid); `None` for a
    /// read-only group.
    reopen: Option<Reopen<S, J>>,
    /// The other replicas, when there are any.
    peers: Option<Peers>,
    /// When the replica's next tick is due (groups with peers tick by wall time).
    next_tick: Instant,
    /// The replica asked for a state transfer and has not got one yet (logged once).
    transfer_wanted: bool,
    /// The state transfer under way (`node::transfer`).
    transfer: Option<transfer::Transfer>,
    /// Which peer the next transfer asks (they take turns).
    transfer_turn: u8,
    /// A transferred log staged for this checkpoint: live once the superblock names it.
    install_pending: Option<NamedCheckpoint>,
    /// A wiped replica's superblock, blank until its first durable state (written as a
    /// format's first write).
    superblock_blank: bool,
    /// Drawn when the group is assembled: a reopen from the files (a new value) is how a
    /// round of requests learns its lanes are new.
    incarnation: u128,
    /// The replica's view and status when last noted (`note_view`); `None` until the first
    /// pump, so a reopened replica publishes its own at once.
    seen_view: Option<(u32, Status)>,
    /// The requests the last round left unknown ([`LocalGroup::take_unknown_tickets`]).
    unknown_tickets: Vec<Ticket>,
}

/// How a group reopens itself from its files; `true` after its files were set aside (a
/// replica with peers rebuilt wiped), when a missing directory is expected.
type Reopen<S, J> = Arc<dyn Fn(bool) -> Result<LocalGroup<S, J>, GroupError> + Send + Sync>;

/// Lanes of a group: client ids of this process that each carry one request at a time (the
/// core admits one request per client in its pipeline), so requests on several lanes are
/// prepared together and share one barrier. A batch must fit the pipeline (or requests beyond
/// it would wait for a reply that never comes), and a boot's lanes must leave room in the
/// client table for the dead sessions of earlier boots, so no live lane is evicted.
pub const LANES: usize = 8;
const _: () = assert!(LANES <= Shape::PARTITION.pipeline_prepares_max);
const _: () = assert!(LANES <= Shape::METADATA.pipeline_prepares_max);
const _: () = assert!(LANES <= Shape::PARTITION.clients_max / 2);
const _: () = assert!(LANES <= Shape::METADATA.clients_max / 2);

/// A request whose outcome was unknown when its wait ended ([`LocalGroup::fate`] tells it
/// later): its lane's client id and number, never used again, and the ops it could have
/// been prepared at (a prepare keeps its op through every view change).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ticket {
    client: u128,
    request: u64,
    /// Below every op it could have been prepared at.
    op_floor: u64,
    /// The highest op it could have been prepared at.
    op_ceiling: u64,
    /// The incarnation of the group that issued it: only that one's log tells its fate (a
    /// group reopened from its files may have lost the prepare its peers hold).
    incarnation: u128,
}

/// What became of a request whose outcome was unknown ([`LocalGroup::fate`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Fate {
    /// Committed and applied: the state machine's reply.
    Applied(Vec<u8>),
    /// Never applied, and never will be.
    Dropped,
    Unknown,
}

/// Why a request a view change dropped is not taken ([`LocalGroup::fate`]'s rule).
pub const DROPPED_BY_A_VIEW_CHANGE: &str = "a view change dropped its op (the log of the view that followed does not hold it): it was never applied, and never will be";

/// One lane: a client id, its session (0 before it registered) and its last request number.
struct Lane {
    client: u128,
    session: u64,
    request: u64,
    /// The reply to the lane's request in flight.
    reply: Option<Message>,
}

impl<S: StateMachine> LocalGroup<S, RingJournal> {
    /// Open the metadata-shaped group in `dir`: recover it from its files, or format it when
    /// `dir` holds no formatted group (then `fresh()` is the state it starts from).
    pub fn open(
        dir: &Path,
        group: u64,
        fresh: impl Fn() -> S + Clone + Send + Sync + 'static,
    ) -> Result<LocalGroup<S>, GroupError> {
        LocalGroup::open_with(dir, group, &(S::body_verifies as BodyRule), fresh)
    }

    /// Recover the group in `dir` in memory as [`LocalGroup::open`] would, writing nothing
    /// (the offline checker). `Ok(None)` when there is no group yet.
    pub fn open_read_only(
        dir: &Path,
        group: u64,
        fresh: impl FnOnce() -> S,
    ) -> Result<Option<LocalGroup<S>>, GroupError> {
        LocalGroup::open_read_only_with(dir, group, &(S::body_verifies as BodyRule), fresh)
    }
}

impl<S: StateMachine, J: GroupJournal> LocalGroup<S, J> {
    /// Recover the group in `dir` (journal `J`, made from `params`) in memory as
    /// [`LocalGroup::open_with`] would, writing nothing (the offline checker). `Ok(None)` when
    /// there is no group yet.
    pub fn open_read_only_with(
        dir: &Path,
        group: u64,
        params: &J::Params,
        fresh: impl FnOnce() -> S,
    ) -> Result<Option<LocalGroup<S, J>>, GroupError> {
        if !dir.join(SUPERBLOCK_FILE).exists() {
            return Ok(None);
        }
        LocalGroup::recover(dir, group, params, fresh, true, None).map(Some)
    }

    /// Open the group in `dir` with journal `J` (made from `params`): recover it from its
    /// files, or format it when `dir` holds no formatted group (then `fresh()` is the state it
    /// starts from).
    pub fn open_with(
        dir: &Path,
        group: u64,
        params: &J::Params,
        fresh: impl Fn() -> S + Clone + Send + Sync + 'static,
    ) -> Result<LocalGroup<S, J>, GroupError> {
        LocalGroup::open_with_peers(dir, group, params, fresh, None)
    }

    /// [`LocalGroup::open_with`] for this node's replica of a group with `peers` (`None`: a
    /// group of one). A replica with peers comes up in whatever status its files give it and
    /// reaches a view through messages and ticks ([`LocalGroup::serve_inbox`]); a group of one
    /// comes up serving. A replica with peers whose directory holds no group is formatted
    /// only when [`Peers::format_if_missing`] says the group is new to this node: one that
    /// lost its files is a wiped replica, never a new one (`docs/replication.md`, "A wiped
    /// replica"): it rejoins as one ([`LocalGroup::rejoin_wiped`]), as does one whose files
    /// are damaged where nothing may be cut away (set aside first).
    pub fn open_with_peers(
        dir: &Path,
        group: u64,
        params: &J::Params,
        fresh: impl Fn() -> S + Clone + Send + Sync + 'static,
        peers: Option<Peers>,
    ) -> Result<LocalGroup<S, J>, GroupError> {
        let mut opened = match &peers {
            // A replica with peers whose files are gone (or whose superblock is blank) may
            // have acknowledged ops before: it rejoins as a wiped replica, never as a new one.
            // A directory missing after its files were set aside (a crash between the
            // quarantine and the new directory) is one too.
            Some(peers)
                if superblock_is_blank(dir)
                    || (!dir.join(SUPERBLOCK_FILE).exists()
                        && (!peers.format_if_missing || rejoin_pending(dir))) =>
            {
                LocalGroup::rejoin_wiped(dir, group, params, fresh(), peers.clone(), None)?
            }
            _ if dir.join(SUPERBLOCK_FILE).exists() => {
                match LocalGroup::recover(dir, group, params, fresh.clone(), false, peers.clone()) {
                    // Damage a replica with peers cannot boot from: the files are set aside
                    // whole, and it rejoins wiped (its peers hold the group).
                    Err(GroupError::Damaged { reason, .. }) if let Some(peers) = &peers => {
                        LocalGroup::rejoin_wiped(dir, group, params, fresh(), peers.clone(), Some(&reason))?
                    }
                    opened => opened?,
                }
            }
            _ => LocalGroup::format(dir, group, params, fresh(), peers.clone())?,
        };
        let (dir, params) = (dir.to_path_buf(), params.clone());
        opened.reopen = Some(Arc::new(move |set_aside: bool| {
            // Never a format: a group reopened after an undone write must find its files
            // (formatting afresh would hand its offsets out again). One whose files were
            // set aside opens wiped (`open_with_peers` finds them in quarantine).
            if !set_aside && !dir.join(SUPERBLOCK_FILE).exists() {
                return Err(refused(
                    &dir,
                    "the superblock vanished; the group cannot reopen".into(),
                ));
            }
            LocalGroup::open_with_peers(&dir, group, &params, fresh.clone(), peers.clone())
        }));
        Ok(opened)
    }

    fn recover(
        dir: &Path,
        group: u64,
        params: &J::Params,
        fresh: impl FnOnce() -> S,
        read_only: bool,
        peers: Option<Peers>,
    ) -> Result<LocalGroup<S, J>, GroupError> {
        let seat = peers.as_ref().map_or(0, |peers| peers.replica);
        let (cluster, files, state, sequence, checkpoint) = read_durable::<J>(dir, group, read_only, seat)?;
        if let Some(peers) = &peers {
            let seat = (peers.replica, peers.replica_count);
            if peers.cluster != cluster || (state.replica, state.replica_count) != seat {
                return Err(refused(
                    dir,
                    format!(
                        "the group was formatted as replica {} of {} in cluster {cluster:032x}, and is opened as replica {} of {} in cluster {:032x}; its files are left as they are",
                        state.replica, state.replica_count, seat.0, seat.1, peers.cluster
                    ),
                ));
            }
        }
        let named = NamedCheckpoint {
            id: CheckpointId {
                op: state.checkpoint_op,
                checksum: state.checkpoint_checksum,
            },
            prepare_checksum: checkpoint
                .as_ref()
                .map_or(0, |(checkpoint, _)| checkpoint.header.checksum),
        };
        let (journal_store, journal, damaged) = J::open(dir, params, read_only, (cluster, group), named)?;
        let recovered = Recovered {
            durable: Some(state.clone()),
            checkpoint,
            journal,
            nonce: rand::random::<u128>() | 1,
        };
        let replica = Replica::recover(
            config(cluster, group, J::SHAPE, peers.as_ref()),
            fresh(),
            recovered,
        )
        .map_err(|error| refused(dir, format!("the replica cannot start from its files: {error}")))?;
        let mut opened =
            LocalGroup::assemble(replica, files, journal_store, cluster, (state, sequence), peers);
        if !read_only {
            // A wiped replica's marker left by a crash right after its first durable state:
            // the directory is a group like any other.
            remove_rejoining_marker(dir)?;
        }
        opened.come_up(&damaged)?;
        Ok(opened)
    }

    fn format(
        dir: &Path,
        group: u64,
        params: &J::Params,
        machine: S,
        peers: Option<Peers>,
    ) -> Result<LocalGroup<S, J>, GroupError> {
        create_dir_durably(dir)?;
        let cluster = match &peers {
            Some(peers) => peers.cluster,
            None => rand::random::<u128>() | 1,
        };
        let (replica, replica_count) = peers
            .as_ref()
            .map_or((0, 1), |peers| (peers.replica, peers.replica_count));
        let state = DurableState::formatted(cluster, replica, replica_count);
        let (sequence, bytes) = durable::plan_format(&state)
            .map_err(|error| refused(dir, format!("cannot format: {error:?}")))?;
        let (files, journal) = LocalGroup::<S, J>::lay_out(dir, (cluster, group), params, &bytes)?;
        tracing::info!(dir = %dir.display(), replica, replica_count, "formatted a replicated log");
        let replica = Replica::new(config(cluster, group, J::SHAPE, peers.as_ref()), machine);
        Ok(LocalGroup::assemble(
            replica,
            files,
            journal,
            cluster,
            (state, sequence),
            peers,
        ))
    }

    /// Open a replica with peers that lost its files as a wiped one (`docs/replication.md`,
    /// "A wiped replica"): an empty journal and a blank superblock, so a crash before its
    /// first durable state leaves it wiped again. It takes a view only from a quorum of its
    /// peers' answers and catches up from them (repairs, or a state transfer); until its
    /// first durable state is written it has acknowledged nothing.
    ///
    /// What the directory holds first is set aside in quarantine, every byte kept, unless
    /// an earlier wiped open made it (its marker is there): that one held nothing
    /// acknowledged and is started over. `damage` says why the files could not be booted
    /// from, when that is the reason.
    fn rejoin_wiped(
        dir: &Path,
        group: u64,
        params: &J::Params,
        machine: S,
        peers: Peers,
        damage: Option<&str>,
    ) -> Result<LocalGroup<S, J>, GroupError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| GroupError::Io { path, source }
        };
        if dir.join(REJOINING_FILE).exists() {
            tracing::info!(dir = %dir.display(), "an earlier rejoin of this replica stopped before its first durable state (nothing in it was acknowledged): started over");
            std::fs::remove_dir_all(dir).map_err(io(dir))?;
        } else if std::fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_some()) {
            let why = match damage {
                Some(reason) => format!("its files are damaged where nothing may be cut away ({reason})"),
                None if dir.join(SUPERBLOCK_FILE).exists() => {
                    "every copy of its superblock is blank: its durable state is gone".to_string()
                }
                None => "its directory holds no superblock".to_string(),
            };
            let aside = cairn_storage::transfer::quarantine(&cairn_storage::io::RealDisk, dir)
                .map_err(|error| refused(dir, format!("{why}; setting the files aside failed: {error}")))?;
            tracing::warn!(
                dir = %dir.display(),
                quarantine = %aside.display(),
                "the replica cannot boot from its files: {why}. They were set aside whole (every byte kept for an operator), and the replica rejoins as a wiped one, rebuilt from its peers"
            );
        }
        create_dir_durably(dir)?;
        cairn_storage::atomic_file::write(
            &dir.join(REJOINING_FILE),
            b"a wiped replica rejoining its peers\n",
        )
        .map_err(|error| refused(dir, format!("cannot mark the directory as rejoining: {error}")))?;
        let cluster = peers.cluster;
        let (files, journal) = LocalGroup::<S, J>::lay_out(dir, (cluster, group), params, &[0u8; COPY_SIZE])?;
        let config = config(cluster, group, J::SHAPE, Some(&peers));
        let recovered = Recovered {
            durable: None,
            checkpoint: None,
            journal: Vec::new(),
            nonce: rand::random::<u128>() | 1,
        };
        let replica = Replica::recover(config, machine, recovered)
            .map_err(|error| refused(dir, format!("the wiped replica cannot start: {error}")))?;
        tracing::warn!(
            dir = %dir.display(),
            replica = peers.replica,
            "this replica has no files of a group its peers hold: it rejoins as a wiped replica and catches up from them (repairs, or a state transfer of their checkpoint and log)"
        );
        let placeholder = DurableState::formatted(cluster, peers.replica, peers.replica_count);
        let mut opened =
            LocalGroup::assemble(replica, files, journal, cluster, (placeholder, 0), Some(peers));
        opened.superblock_blank = true;
        opened.come_up(&[])?;
        Ok(opened)
    }

    /// Lay out a group's files in the directory `dir` (made already) for group `ids`
    /// (cluster, group): the cluster id, an empty journal and checkpoint file (nothing an
    /// interrupted earlier layout left was ever used), and last the superblock holding `copy`
    /// in every copy, whose name is what makes the group formatted (a format's first state,
    /// or a wiped replica's blank one). Returns the open files and the journal.
    fn lay_out(
        dir: &Path,
        (cluster, group): (u128, u64),
        params: &J::Params,
        copy: &[u8; COPY_SIZE],
    ) -> Result<(Files, J), GroupError> {
        cairn_storage::atomic_file::write(&dir.join(CLUSTER_FILE), &cluster.to_le_bytes())
            .map_err(|error| refused(dir, format!("cannot write the cluster id: {error}")))?;
        let journal = J::create(dir, params, (cluster, group))?;
        let checkpoints = dir.join(CHECKPOINTS_FILE);
        File::create(&checkpoints)
            .and_then(|f| f.sync_all())
            .map_err(|source| GroupError::Io {
                path: checkpoints.clone(),
                source,
            })?;
        install_superblock_file(dir, copy)?;
        Ok((Files::open(dir, &J::SHAPE, false)?, journal))
    }

    fn assemble(
        replica: Replica<S>,
        files: Files,
        journal: J,
        cluster: u128,
        superblock: (DurableState, u64),
        peers: Option<Peers>,
    ) -> LocalGroup<S, J> {
        // Distinct, non-zero client ids (odd, differing in the bits above the lowest), the
        // top byte naming the replica, so no two nodes' lanes share an id.
        let replica_byte = u128::from(replica.config().replica) << 120;
        let base = ((rand::random::<u128>() >> 8) | 1) | replica_byte;
        LocalGroup {
            replica,
            files,
            journal,
            cluster,
            superblock,
            lanes: (0..LANES)
                .map(|lane| Lane {
                    client: base ^ ((lane as u128) << 1),
                    session: 0,
                    request: 0,
                    reply: None,
                })
                .collect(),
            to_self: VecDeque::new(),
            unsynced: Vec::new(),
            stopped: None,
            reopen: None,
            next_tick: peers
                .as_ref()
                .map_or_else(Instant::now, |peers| peers.clock.now()),
            peers,
            transfer_wanted: false,
            transfer: None,
            transfer_turn: 0,
            install_pending: None,
            superblock_blank: false,
            incarnation: rand::random(),
            seen_view: None,
            unknown_tickets: Vec::new(),
        }
    }

    /// Tick a recovering replica until it serves: a view installed and every op of its log
    /// applied.
    fn come_up(&mut self, damaged: &[String]) -> Result<(), GroupError> {
        if self.peers.is_some() {
            // Its peers bring it into a view (a probe, then their StartView), and repair
            // what its journal lost from their copies.
            if !damaged.is_empty() {
                tracing::warn!(
                    dir = %self.files.dir.display(),
                    damaged = %damaged.join(", "),
                    "damaged journal entries; the replica repairs them from its peers"
                );
            }
            return self.pump();
        }
        for _ in 0..RECOVERY_TICKS_MAX {
            self.pump()?;
            if self.replica.status() == Status::Normal
                && self.replica.is_primary()
                && self.replica.commit_min() == self.replica.op()
                && !self.replica.is_repairing()
            {
                tracing::info!(
                    dir = %self.files.dir.display(),
                    view = self.replica.view(),
                    op = self.replica.op(),
                    "replicated log recovered"
                );
                return Ok(());
            }
            self.replica.on_tick();
        }
        let reason = if damaged.is_empty() {
            format!(
                "the log did not come up from its files within {RECOVERY_TICKS_MAX} ticks (a bug: please report it \
                 with this line); the files are left as they are: {}",
                self.replica.describe()
            )
        } else {
            format!(
                "damaged journal entries that may hold acknowledged changes: {} in {}; a group of one has no peer \
                 to repair them from, so it does not start; the files are left as they are",
                damaged.join(", "),
                self.journal.location().display()
            )
        };
        Err(refused(&self.files.dir, reason))
    }

    /// The replica index of the group's primary as this replica sees it: the primary of its
    /// view when it is in status normal, `None` during a view change or a recovery.
    pub fn primary(&self) -> Option<u8> {
        (self.replica.status() == Status::Normal)
            .then(|| self.replica.config().primary_of(self.replica.view()))
    }

    /// With peers: start a view change to the next view this replica leads, when it is a
    /// backup in status normal (`Replica::lead`). Whether it started one.
    pub fn lead(&mut self) -> Result<bool, GroupError> {
        if self.peers.is_none() {
            return Ok(false);
        }
        let started = self.replica.lead();
        if started {
            self.pump()?;
        }
        Ok(started)
    }

    /// The replica's role and positions, for `cairn status`.
    pub fn replica_status(&self) -> ReplicaStatus {
        let role = match self.replica.status() {
            Status::Normal if self.replica.is_primary() => "primary",
            Status::Normal => "backup",
            Status::ViewChange => "view change",
            Status::Recovering => "recovering",
        };
        ReplicaStatus {
            role,
            view: self.replica.view(),
            commit: self.replica.commit_min(),
            op: self.replica.op(),
            transfer_wanted: self.transfer_wanted,
            transfer: self.transfer_progress(),
        }
    }

    /// Whether the replica is in status normal and has applied every op its view is known to
    /// have committed, with no state transfer wanted: one that could lead the group now.
    pub fn is_current(&self) -> bool {
        self.replica.status() == Status::Normal
            && self.replica.commit_min() >= self.replica.commit_max()
            && !self.transfer_wanted
    }

    /// Whether the replica takes requests and has applied every op its log holds: a new
    /// primary first commits what earlier views prepared, and a decision made on its state
    /// before then would miss those ops.
    pub fn is_caught_up(&self) -> bool {
        self.takes_requests() && self.replica.commit_min() == self.replica.op()
    }

    /// Whether the replica takes requests now: the group's primary, in status normal. A
    /// group of one always is once open.
    pub fn takes_requests(&self) -> bool {
        self.replica.status() == Status::Normal && self.replica.is_primary()
    }

    /// What a node's worker does for a group with peers that no request holds: deliver every
    /// message waiting in the inbox, tick the replica if a tick is due, and perform what it
    /// asks. Returns when the next tick is due. A group of one has nothing to do.
    pub fn serve_inbox(&mut self) -> Result<Instant, GroupError> {
        let Some(peers) = self.peers.clone() else {
            return Ok(Instant::now() + Duration::from_secs(3600));
        };
        self.check_not_stopped()?;
        for message in peers.inbox.take_now() {
            self.deliver(message);
        }
        self.tick_if_due(peers.clock.now(), peers.tick);
        self.continue_transfer(peers.clock.now());
        if let Err(error) = self.pump() {
            // A write the journal undid reopens the group from its files (its replica must
            // not keep an op in memory that was never written); anything else stopped it.
            return Err(self.after_failed_write(error));
        }
        Ok(self.next_tick)
    }

    /// The replicated state machine (every committed op applied).
    pub fn state_machine(&self) -> &S {
        self.replica.state_machine()
    }

    /// [`Replica::state_machine_mut`]: for what the machine keeps beside its replicated
    /// state only.
    pub fn state_machine_mut(&mut self) -> &mut S {
        self.replica.state_machine_mut()
    }

    /// The highest op the group has applied.
    pub fn commit_op(&self) -> u64 {
        self.replica.commit_min()
    }

    /// The op of the checkpoint the superblock names: the group never reads an op at or below
    /// it back from its journal again.
    pub fn checkpoint_op(&self) -> u64 {
        self.superblock.0.checkpoint_op
    }

    /// The machine snapshot of the checkpoint the superblock names (`None` before the
    /// first): what a state transfer of this replica ships.
    pub fn checkpoint_state_machine(&self) -> Result<Option<Vec<u8>>, GroupError> {
        let group = self.replica.config().group;
        Ok(
            named_checkpoint::<J>(&self.files, &self.superblock.0, self.cluster, group)?
                .map(|(checkpoint, _, _)| checkpoint.state_machine),
        )
    }

    /// Make every prepare written durable ([`GroupJournal::flush`]: a `relaxed` partition's
    /// timer). A failure stops the group, as a failed write does.
    pub fn flush(&mut self) -> Result<(), GroupError> {
        self.check_not_stopped()?;
        self.journal.flush().inspect_err(|error| {
            self.stopped = Some(error.to_string());
        })
    }

    /// A clean stop: [`GroupJournal::flush_for_stop`], then a checkpoint at the last applied
    /// op when it is ahead of the one the superblock names (so the next start applies
    /// nothing). Does nothing to a stopped group: its files are settled by the next open.
    pub fn close(&mut self) -> Result<(), GroupError> {
        if self.stopped.is_some() {
            return Ok(());
        }
        self.journal.flush_for_stop().inspect_err(|error| {
            self.stopped = Some(error.to_string());
        })?;
        if self.commit_op() > self.checkpoint_op() {
            self.checkpoint()?;
        }
        Ok(())
    }

    /// Checkpoint at the last applied op now, off the interval, and wait until the
    /// superblock names it: what lies in the journal at or below it is then never read again
    /// (a partition removes those segments). Returns the checkpoint's op.
    pub fn checkpoint(&mut self) -> Result<u64, GroupError> {
        self.check_not_stopped()?;
        self.replica.checkpoint_now();
        self.pump()?;
        Ok(self.checkpoint_op())
    }

    /// The journal, for reads (polls read a partition's log through it).
    pub fn journal(&self) -> &J {
        &self.journal
    }

    /// The journal, for the upkeep that is not an op (a partition's removal of segments its
    /// checkpoint and start offset left behind).
    pub fn journal_mut(&mut self) -> &mut J {
        &mut self.journal
    }

    /// With peers: damage was found in this replica's files while it ran (a read, the
    /// scrub). Its directory is set aside whole (`transfer::quarantine`, every byte kept) and
    /// the replica reopens as a wiped one, rebuilt from its peers. `Err` for a group of one
    /// (it has no peer to rebuild from) or when setting aside or reopening failed.
    pub fn rebuild_from_peers(&mut self, damage: &str) -> Result<PathBuf, GroupError> {
        let dir = self.files.dir.clone();
        let (Some(_), Some(reopen)) = (&self.peers, self.reopen.clone()) else {
            return Err(refused(
                &dir,
                "a group of one has no peer to rebuild from".to_string(),
            ));
        };
        self.journal.stage_settle();
        let aside = cairn_storage::transfer::quarantine(&cairn_storage::io::RealDisk, &dir)
            .map_err(|error| refused(&dir, format!("cannot set the damaged files aside: {error}")))?;
        tracing::warn!(
            dir = %dir.display(),
            quarantine = %aside.display(),
            %damage,
            "damage was found in the replica's files while it ran: they were set aside whole (every byte kept for an operator), and the replica rejoins as a wiped one, rebuilt from its peers"
        );
        // The reopen finds the directory gone beside its quarantine: a wiped replica.
        let reopened = reopen(true)?;
        *self = reopened;
        Ok(aside)
    }

    /// Why the group takes no more requests, if it stopped.
    pub fn stopped_reason(&self) -> Option<&str> {
        self.stopped.as_deref()
    }

    /// Replicate one request and return the state machine's reply to it. When this returns
    /// `Ok`, the op is durable and applied.
    pub fn submit(&mut self, operation: u8, body: &[u8]) -> Result<Vec<u8>, GroupError> {
        self.submit_batch(vec![(operation, Bytes::copy_from_slice(body))])
            .pop()
            .expect("one result per request")
    }

    /// Replicate up to [`LANES`] requests at once, one per lane: they are prepared together
    /// and one barrier covers all of them. Each result is the state machine's reply (the op
    /// durable and applied) or why that request failed; a request whose op was durable before
    /// a later one's write failed still gets its reply.
    ///
    /// Each body is handed to the replica, which may stamp it into the prepare in place (no
    /// copy of a megabyte append). So a request is sent once: one whose lane's session was
    /// evicted before it was prepared (a group of one never evicts a live lane: the core's
    /// client table holds twice the lanes; with peers every node's lanes share it) fails as
    /// not taken, and the lane registers again next time.
    pub fn submit_batch(&mut self, requests: Vec<(u8, Bytes)>) -> Vec<Result<Vec<u8>, GroupError>> {
        assert!(requests.len() <= LANES, "at most one request per lane");
        debug_assert!(!self.files.read_only, "a read-only group takes no requests");
        let count = requests.len();
        let mut results: Vec<Option<Result<Vec<u8>, GroupError>>> = (0..count).map(|_| None).collect();
        let abdicating = self
            .peers
            .as_ref()
            .is_some_and(|peers| peers.abdicating.load(std::sync::atomic::Ordering::Acquire));
        let not_primary = if !self.takes_requests() {
            Some(GroupError::NotTaken {
                dir: self.files.dir.clone(),
                reason: format!(
                    "this replica is not the group's primary in status normal ({})",
                    self.replica.describe()
                ),
            })
        } else if abdicating {
            Some(GroupError::NotTaken {
                dir: self.files.dir.clone(),
                reason: "this node hears no quorum of its peers (it abdicates): no request can commit here"
                    .to_string(),
            })
        } else {
            None
        };
        for (result, (_, body)) in results.iter_mut().zip(&requests) {
            if let Err(error) = self.check_not_stopped() {
                *result = Some(Err(error));
            } else if let Some(error) = &not_primary {
                *result = Some(Err(error.like(&self.files.dir)));
            } else if body.len() > J::SHAPE.body_size_max() {
                *result = Some(Err(GroupError::TooLarge {
                    len: body.len(),
                    max: J::SHAPE.body_size_max(),
                }));
            }
        }
        let mut requests: Vec<Option<(u8, Bytes)>> = requests.into_iter().map(Some).collect();
        // Every lane without a session registers first (all at once).
        let unregistered: Vec<usize> = (0..count)
            .filter(|&lane| results[lane].is_none() && self.lanes[lane].session == 0)
            .collect();
        if !unregistered.is_empty() {
            let calls = unregistered
                .iter()
                .map(|&lane| (lane, self.request_on(lane, OPERATION_REGISTER, Bytes::new())))
                .collect();
            let (outcomes, reopened) = self.call_round(calls);
            for (lane, outcome) in unregistered.iter().zip(outcomes) {
                match outcome {
                    // After a reopen the lanes are new: a session of the old group is not
                    // theirs.
                    Ok(reply) if !reopened => {
                        debug_assert!(reply.header.op > 0);
                        self.lanes[*lane].session = reply.header.op;
                    }
                    Ok(_) => {}
                    // The request itself was never handed to the replica: not taken.
                    Err(GroupError::OutcomeUnknown { dir, reason }) => {
                        results[*lane] = Some(Err(GroupError::NotTaken {
                            dir,
                            reason: format!(
                                "its lane's registration got no reply in time, so it was not sent ({reason})"
                            ),
                        }))
                    }
                    Err(error) => results[*lane] = Some(Err(error)),
                }
            }
            if reopened {
                self.fail_rest_as_undone(&mut results);
            }
        }
        if !self.fail_rest_if_stopped(&mut results) {
            let ready: Vec<usize> = (0..count)
                .filter(|&lane| results[lane].is_none() && self.lanes[lane].session != 0)
                .collect();
            if !ready.is_empty() {
                let calls = ready
                    .iter()
                    .map(|&lane| {
                        let (operation, body) = requests[lane].take().expect("each request is sent once");
                        (lane, self.request_on(lane, operation, body))
                    })
                    .collect();
                let (outcomes, reopened) = self.call_round(calls);
                for (lane, outcome) in ready.iter().zip(outcomes) {
                    results[*lane] = Some(match outcome {
                        Ok(reply) if reply.header.operation == OPERATION_SESSION_EVICTED => {
                            if !reopened {
                                self.lanes[*lane].session = 0;
                            }
                            Err(GroupError::NotTaken {
                                dir: self.files.dir.clone(),
                                reason: "its lane's session was evicted before it was prepared".into(),
                            })
                        }
                        Ok(reply) => Ok(reply.body.to_vec()),
                        Err(error) => Err(error),
                    });
                }
                if reopened {
                    self.fail_rest_as_undone(&mut results);
                }
            }
        }
        results
            .into_iter()
            .map(|result| {
                result.unwrap_or_else(|| {
                    Err(GroupError::NotTaken {
                        dir: self.files.dir.clone(),
                        reason: "its lane got no session to send it on".into(),
                    })
                })
            })
            .collect()
    }

    /// Once the group stopped, every request still without a result fails with it. Returns
    /// whether it stopped.
    fn fail_rest_if_stopped(&self, results: &mut [Option<Result<Vec<u8>, GroupError>>]) -> bool {
        if self.stopped.is_none() {
            return false;
        }
        for result in results.iter_mut().filter(|result| result.is_none()) {
            *result = Some(self.check_not_stopped().map(|()| Vec::new()));
        }
        true
    }

    /// After the group reopened from its files (a write the journal undid), every request
    /// still without a result was never taken.
    fn fail_rest_as_undone(&self, results: &mut [Option<Result<Vec<u8>, GroupError>>]) {
        for result in results.iter_mut().filter(|result| result.is_none()) {
            *result = Some(Err(GroupError::WriteUndone {
                dir: self.files.dir.clone(),
                reason: "a write of the same batch failed and was undone, and the group reopened from its files before this request was taken".into(),
            }));
        }
    }

    /// [`LocalGroup::call_lanes`], and whether the group reopened from its files meanwhile
    /// (its lanes are then new: no session of the old group is theirs).
    fn call_round(&mut self, calls: Vec<(usize, Message)>) -> (Vec<Result<Message, GroupError>>, bool) {
        let incarnation = self.incarnation;
        let outcomes = self.call_lanes(calls);
        (outcomes, self.incarnation != incarnation)
    }

    /// The next request of `lane` (a register restarts its request numbers).
    fn request_on(&mut self, lane: usize, operation: u8, body: Bytes) -> Message {
        let cluster = self.cluster;
        let group = self.replica.config().group;
        let lane = &mut self.lanes[lane];
        if operation == OPERATION_REGISTER {
            lane.request = 0;
            lane.session = 0;
        } else {
            lane.request += 1;
        }
        let mut header = Header::new(Command::Request, cluster);
        header.group = group;
        header.client = lane.client;
        header.request = lane.request;
        header.operation = operation;
        header.context = u128::from(lane.session);
        // The request stays in this process: its body is not hashed (the prepare's is).
        Message::in_memory(header, body)
    }

    /// Hand every request to the replica, then run it until each lane has its reply. A
    /// failed write ends the wait: lanes that have their reply keep it (their ops were
    /// durable and applied), the others get the error; a write the journal undid then
    /// reopens the group ([`LocalGroup::after_failed_write`]).
    fn call_lanes(&mut self, calls: Vec<(usize, Message)>) -> Vec<Result<Message, GroupError>> {
        let lanes: Vec<usize> = calls.iter().map(|(lane, _)| *lane).collect();
        // With peers each request is kept to hand it again (a clone shares the body).
        let mut sent: Vec<(usize, Message)> = Vec::new();
        // Per lane, the ops its request could have been prepared at (`hand_over`).
        let mut ops = [(u64::MAX, 0u64); LANES];
        let mut registers = [false; LANES];
        for (lane, message) in calls {
            self.lanes[lane].reply = None;
            registers[lane] = message.header.operation == OPERATION_REGISTER;
            if self.peers.is_some() {
                sent.push((lane, message.clone()));
            }
            self.hand_over(message, &mut ops[lane]);
        }
        self.unknown_tickets.clear();
        let mut failure = None;
        // Lanes whose request the log of a later view proved dropped: never resent.
        let mut lost = [false; LANES];
        match self.peers.clone() {
            None => {
                for _ in 0..REQUEST_TICKS_MAX {
                    if let Err(error) = self.pump() {
                        failure = Some(error);
                        break;
                    }
                    if lanes.iter().all(|&lane| self.lanes[lane].reply.is_some()) {
                        break;
                    }
                    self.replica.on_tick();
                }
            }
            Some(peers) => {
                // The peers' answers arrive in the inbox while this holds the group: take
                // them here, and tick by wall time, until every lane has its reply. A
                // request the replica dropped (a view just starting, say) is handed to it
                // again every few ticks with the same number: the client table answers a
                // duplicate from its stored reply, never applying it twice.
                let deadline = peers.clock.now() + peers.request_timeout;
                let mut ticks_since_resend = 0u32;
                loop {
                    if let Err(error) = self.pump() {
                        failure = Some(error);
                        break;
                    }
                    // A request whose replica lost its view while it waited is answered by
                    // the new view: committed and applied here, its reply is in the client
                    // table (only a primary sends replies).
                    for &lane in &lanes {
                        let Lane { client, request, .. } = self.lanes[lane];
                        if self.lanes[lane].reply.is_none()
                            && let Some(reply) = self.replica.committed_reply(client, request)
                        {
                            self.lanes[lane].reply = Some(reply.clone());
                        }
                    }
                    // A request that a view change dropped can never commit: only this
                    // replica is handed it, a backup drops requests, and it is not resent
                    // once found lost. So it is answered as not taken now (the client may
                    // send it again, to the new primary), not as unknown at the timeout.
                    if self.replica.status() == Status::Normal && !self.replica.is_primary() {
                        for &lane in &lanes {
                            let Lane { client, request, .. } = self.lanes[lane];
                            if self.lanes[lane].reply.is_none()
                                && !lost[lane]
                                && self.request_fate(client, request, ops[lane]) == Fate::Dropped
                            {
                                lost[lane] = true;
                            }
                        }
                    }
                    if lanes
                        .iter()
                        .all(|&lane| lost[lane] || self.lanes[lane].reply.is_some())
                    {
                        break;
                    }
                    let now = peers.clock.now();
                    if now >= deadline {
                        break;
                    }
                    // What arrived comes before the ticks due: several ticks taken at once
                    // (after a slow barrier, say) must not time out prepares whose
                    // acknowledgements are waiting here.
                    let arrived = peers.inbox.take_now();
                    if !arrived.is_empty() {
                        for message in arrived {
                            self.deliver(message);
                        }
                        continue;
                    }
                    if self.tick_if_due(now, peers.tick) {
                        ticks_since_resend += 1;
                        if ticks_since_resend >= REQUEST_RESEND_TICKS {
                            ticks_since_resend = 0;
                            for (lane, request) in &sent {
                                if self.lanes[*lane].reply.is_none() && !lost[*lane] {
                                    self.hand_over(request.clone(), &mut ops[*lane]);
                                }
                            }
                        }
                        continue;
                    }
                    for message in peers.clock.take_until(&peers.inbox, self.next_tick.min(deadline)) {
                        self.deliver(message);
                    }
                }
            }
        }
        let mut replies: Vec<Option<Message>> =
            lanes.iter().map(|&lane| self.lanes[lane].reply.take()).collect();
        let lost: Vec<bool> = lanes.iter().map(|&lane| lost[lane]).collect();
        let dropped = |dir: &Path| GroupError::NotTaken {
            dir: dir.to_path_buf(),
            reason: DROPPED_BY_A_VIEW_CHANGE.into(),
        };
        // A lane whose request was dropped starts over as a new client: the core admits
        // only the number after a client's last.
        for (&lane, &lost) in lanes.iter().zip(&lost) {
            if lost {
                self.renew_lane(lane);
            }
        }
        let error = match failure {
            Some(error) => self.after_failed_write(error),
            None if replies
                .iter()
                .zip(&lost)
                .all(|(reply, &lost)| reply.is_some() || lost) =>
            {
                return replies
                    .into_iter()
                    .map(|reply| reply.ok_or_else(|| dropped(&self.files.dir)))
                    .collect();
            }
            None if self.peers.is_some() => {
                // A lane whose request may still be in a pipeline cannot take the next
                // number (the core admits only the one after its last): it starts over as a
                // new client, and registers before its next request.
                // Its request is kept as a ticket, for the caller to learn its fate later
                // ([`LocalGroup::fate`]): it is never handed to the replica again.
                for (&lane, &lost) in lanes.iter().zip(&lost) {
                    if self.lanes[lane].reply.is_none() && !lost {
                        let Lane { client, request, .. } = self.lanes[lane];
                        if !registers[lane] {
                            self.unknown_tickets.push(Ticket {
                                client,
                                request,
                                op_floor: ops[lane].0,
                                op_ceiling: ops[lane].1,
                                incarnation: self.incarnation,
                            });
                        }
                        self.renew_lane(lane);
                    }
                }
                GroupError::OutcomeUnknown {
                    dir: self.files.dir.clone(),
                    reason: format!("no reply in time: {}", self.replica.describe()),
                }
            }
            None => {
                // The op may still commit later, and apply without anyone waiting for it:
                // refuse everything from now on rather than let memory and effects part ways.
                let reason = format!("a request got no reply: {}", self.replica.describe());
                self.stopped = Some(reason.clone());
                GroupError::Stopped {
                    dir: self.files.dir.clone(),
                    reason,
                }
            }
        };
        // The first lane without a reply gets the error itself, the others its like (a
        // lane whose request was dropped: not taken).
        let like = error.like(&self.files.dir);
        let mut error = Some(error);
        replies
            .iter_mut()
            .zip(lost)
            .map(|(reply, lost)| match reply.take() {
                Some(reply) => Ok(reply),
                None if lost => Err(dropped(&self.files.dir)),
                None => Err(error.take().unwrap_or_else(|| like.like(&self.files.dir))),
            })
            .collect()
    }

    /// Hand a lane's request to the replica, widening `(op_floor, op_ceiling)`, the ops it
    /// could have been prepared at: a prepare takes the op after the replica's last, so
    /// every hand-over goes through here.
    fn hand_over(&mut self, request: Message, (op_floor, op_ceiling): &mut (u64, u64)) {
        *op_floor = (*op_floor).min(self.replica.op());
        *op_ceiling = (*op_ceiling).max(self.replica.op() + 1);
        self.replica.on_message(request);
    }

    /// The tickets of the requests the last round left unknown (`OutcomeUnknown`), in lane
    /// order, taken.
    pub fn take_unknown_tickets(&mut self) -> Vec<Ticket> {
        std::mem::take(&mut self.unknown_tickets)
    }

    /// What became of a request whose outcome was unknown: applied (the reply the state
    /// machine gave, as the client table holds it), dropped (it never applied and never
    /// will), or still unknown. Only the incarnation that issued the ticket tells more than
    /// applied: another replica's log may lag behind the op the request was prepared at.
    pub fn fate(&self, ticket: &Ticket) -> Fate {
        match self.request_fate(
            ticket.client,
            ticket.request,
            (ticket.op_floor, ticket.op_ceiling),
        ) {
            Fate::Dropped if ticket.incarnation != self.incarnation => Fate::Unknown,
            fate => fate,
        }
    }

    /// [`LocalGroup::fate`] of `client`'s request `request`, which could only have been
    /// prepared at an op above `op_floor` and at most `op_ceiling`, and is never handed to
    /// the replica again. Dropped when, at each of those ops, this replica (in status
    /// normal) holds another request:
    /// - an op it applied holds another request in every view (committed ops are final),
    ///   whatever the number of replicas;
    /// - an op it has not applied (or one beyond its log, which this replica prepared the
    ///   request within) counts only in a group of at most three replicas, where its view's
    ///   log decides: the first view whose log dropped the request had no replica holding it
    ///   in its quorum (any two of three meet any quorum), so this replica, which prepared
    ///   it, held it alone, and its log no longer does. With more replicas a minority that
    ///   holds it and missed the view could bring it back in a later view.
    fn request_fate(&self, client: u128, request: u64, (op_floor, op_ceiling): (u64, u64)) -> Fate {
        const OPS_LOOKED_THROUGH_MAX: u64 = 4096;
        if let Some(reply) = self.replica.committed_reply(client, request) {
            return Fate::Applied(reply.body.to_vec());
        }
        if self.replica.status() != Status::Normal
            || op_ceiling.saturating_sub(op_floor) > OPS_LOOKED_THROUGH_MAX
        {
            return Fate::Unknown;
        }
        // Another request at `op` (a missing header, or this one with its reply gone from the
        // client table, tells nothing).
        let another = |header: Option<Header>| {
            header.is_some_and(|header| header.client != client || header.request != request)
        };
        let commit = self.replica.commit_min();
        if !(op_floor + 1..=op_ceiling.min(commit)).all(|op| another(self.replica.committed_header(op))) {
            return Fate::Unknown;
        }
        if commit >= op_ceiling {
            return Fate::Dropped;
        }
        let replica_count = self.peers.as_ref().map_or(1, |peers| peers.replica_count);
        if replica_count > 3 {
            return Fate::Unknown;
        }
        let log_end = op_ceiling.min(self.replica.op());
        if (commit.max(op_floor) + 1..=log_end).all(|op| another(self.replica.log_header(op))) {
            Fate::Dropped
        } else {
            Fate::Unknown
        }
    }

    /// Give `lane` a client id never used before, with no session.
    fn renew_lane(&mut self, lane: usize) {
        let replica_byte = u128::from(self.replica.config().replica) << 120;
        let client = loop {
            let client = ((rand::random::<u128>() >> 8) | 1) | replica_byte;
            // Another lane's id would merge two lanes' requests.
            if self.lanes.iter().all(|lane| lane.client != client) {
                break client;
            }
        };
        let lane = &mut self.lanes[lane];
        lane.client = client;
        lane.session = 0;
        lane.request = 0;
        lane.reply = None;
    }

    /// The time by the group's clock (wall time without peers).
    fn now(&self) -> Instant {
        self.peers
            .as_ref()
            .map_or_else(Instant::now, |peers| peers.clock.now())
    }

    /// Tick the replica if its tick is due at `now` (a group with peers ticks by wall time,
    /// every `tick`). Returns whether it ticked.
    fn tick_if_due(&mut self, now: Instant, tick: Duration) -> bool {
        if now < self.next_tick {
            return false;
        }
        // Every tick whose time has come, so logical time keeps pace with wall time although
        // an idle group is served only every few ticks (`replicas.rs`); a process that stalled
        // for longer catches up at most `TICKS_CATCH_UP_MAX` at once.
        let due = (now - self.next_tick).as_nanos() / tick.as_nanos().max(1) + 1;
        let ticks = due.min(TICKS_CATCH_UP_MAX as u128) as u32;
        for _ in 0..ticks {
            self.replica.on_tick();
        }
        self.next_tick = if due > u128::from(TICKS_CATCH_UP_MAX) {
            now + tick
        } else {
            self.next_tick + tick * ticks
        };
        true
    }

    /// `Stopped` once a failed write stopped the group.
    fn check_not_stopped(&self) -> Result<(), GroupError> {
        match &self.stopped {
            Some(reason) => Err(GroupError::Stopped {
                dir: self.files.dir.clone(),
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    /// A request failed on `error`. A write the journal undid leaves the files as they were
    /// before the request: the group reopens from them (as a restart would), dropping the op
    /// the replica had prepared in memory, and goes on. Anything else stops the group.
    fn after_failed_write(&mut self, error: GroupError) -> GroupError {
        if !matches!(error, GroupError::WriteUndone { .. }) {
            return error;
        }
        // Nothing was lost: make what was written durable and give back what a `relaxed`
        // journal reserved ahead, so the reopened group does not skip offsets as after an
        // unclean stop. (If this fails, the reopen sees a reservation and skips: safe.)
        let _ = self.journal.flush_for_stop();
        self.journal.stage_settle();
        let reopened = match &self.reopen {
            Some(reopen) => reopen(false),
            None => Err(refused(&self.files.dir, "a read-only group cannot reopen".into())),
        };
        match reopened {
            Ok(group) => {
                tracing::warn!(dir = %self.files.dir.display(), %error, "reopened the replicated log from its files after an undone write");
                *self = group;
                error
            }
            Err(reopen_error) => {
                let reason = format!("{error}; reopening from the files then failed: {reopen_error}");
                self.stopped = Some(reason.clone());
                GroupError::Stopped {
                    dir: self.files.dir.clone(),
                    reason,
                }
            }
        }
    }

    /// Perform what the replica asks, feeding back each completion, until it asks nothing.
    /// The prepares written in one round share one barrier ([`GroupJournal::prepares_barrier`])
    /// before the replica is told of them. After a write the journal undid, the prepares
    /// written before it are still made durable (their replies follow), nothing more is
    /// written, and the undone write's error is returned once the replica asks nothing more.
    fn pump(&mut self) -> Result<(), GroupError> {
        let mut undone: Option<GroupError> = None;
        loop {
            let outputs = self.replica.take_outputs();
            if outputs.is_empty() && self.to_self.is_empty() {
                self.note_view();
                return undone.map_or(Ok(()), Err);
            }
            for output in outputs {
                if undone.is_some() && matches!(output, Output::WritePrepare { .. }) {
                    // Never written: the reopen that follows drops it from memory.
                    continue;
                }
                if let Err(error) = self.perform(output) {
                    if !matches!(error, GroupError::WriteUndone { .. }) {
                        self.stopped = Some(error.to_string());
                        return Err(error);
                    }
                    undone = Some(error);
                }
            }
            if let Err(error) = self.settle_written() {
                self.stopped = Some(error.to_string());
                return Err(error);
            }
            while let Some(message) = self.to_self.pop_front() {
                self.replica.on_message(message);
            }
        }
    }

    /// On a change of the replica's view or status: publish the primary it now names
    /// ([`PrimarySeen`], with peers) and log the change (debug level: a node kill changes the
    /// view of every group it led).
    fn note_view(&mut self) {
        let now = (self.replica.view(), self.replica.status());
        // The first note always publishes: a reopened replica must not leave its earlier
        // incarnation's primary in place.
        let was = self.seen_view.replace(now);
        if was == Some(now) {
            return;
        }
        if let Some(peers) = &self.peers {
            peers
                .primary_seen
                .set((now.1 == Status::Normal).then(|| self.replica.config().primary_of(now.0)));
        }
        tracing::debug!(
            dir = %self.files.dir.display(),
            was = ?was,
            view = now.0,
            status = ?now.1,
            primary = self.replica.config().primary_of(now.0),
            commit = self.replica.commit_min(),
            "replica view or status changed"
        );
    }

    /// One barrier for every prepare written since the last, then tell the replica of each,
    /// in write order (ascending ops).
    fn settle_written(&mut self) -> Result<(), GroupError> {
        if self.unsynced.is_empty() {
            return Ok(());
        }
        self.journal.prepares_barrier()?;
        for (op, checksum) in std::mem::take(&mut self.unsynced) {
            self.replica.on_prepare_written(op, checksum);
        }
        Ok(())
    }

    fn perform(&mut self, output: Output) -> Result<(), GroupError> {
        match output {
            Output::Send {
                to: Destination::Replica(to),
                message,
            } => match &self.peers {
                Some(peers) if to != peers.replica => peers.transport.send(to, message),
                _ => self.to_self.push_back(message),
            },
            Output::Send {
                to: Destination::Client(client),
                message,
            } => {
                if let Some(lane) = self.lanes.iter_mut().find(|lane| lane.client == client)
                    && message.header.command == Command::Reply
                    && message.header.request == lane.request
                {
                    lane.reply = Some(message);
                }
            }
            Output::WritePrepare { message } => {
                // The prepares one barrier covers go in ascending ops. A replica with peers
                // may ask for an op at or below one still waiting (a repair, or an op
                // rewritten after a view change): the waiting ones are made durable and
                // reported first, so no report names a prepare a later write replaced.
                if self
                    .unsynced
                    .last()
                    .is_some_and(|&(last, _)| last >= message.header.op)
                {
                    debug_assert!(self.peers.is_some(), "a group of one writes its ops in order");
                    self.settle_written()?;
                }
                self.journal.write_prepare(&message)?;
                self.unsynced.push((message.header.op, message.header.checksum));
            }
            Output::ReadPrepare {
                op,
                checksum,
                for_replica,
            } => {
                let prepare = self.journal.read_prepare(op, checksum);
                self.replica.on_prepare_read(op, checksum, prepare, for_replica);
            }
            Output::WriteDurable { state } => {
                // The superblock may name ops of the journal: they are durable first.
                self.journal.flush()?;
                let (current, sequence) = &self.superblock;
                let planned = if self.superblock_blank {
                    durable::plan_format(&state)
                } else {
                    durable::plan_write(current, *sequence, &state)
                };
                let (next_sequence, bytes) = planned.map_err(|error| {
                    refused(
                        &self.files.dir,
                        format!("an invalid durable state was asked for: {error:?}"),
                    )
                })?;
                self.files.write_superblock(&bytes)?;
                self.superblock = (state.clone(), next_sequence);
                if self.superblock_blank {
                    // The wiped replica's first durable state: from now on its directory is
                    // a group like any other.
                    self.superblock_blank = false;
                    remove_rejoining_marker(&self.files.dir)?;
                }
                // A transferred log goes live before the replica writes anything above the
                // checkpoint the superblock now names.
                self.commit_install_if_named(CheckpointId {
                    op: state.checkpoint_op,
                    checksum: state.checkpoint_checksum,
                })?;
                self.replica.on_durable_written(state);
            }
            Output::WriteCheckpoint {
                slot,
                op,
                checksum,
                bytes,
            } => {
                // A checkpoint covers only a durable log.
                self.journal.flush()?;
                self.files
                    .write_synced(Zone::Checkpoints, usize::from(slot), &bytes)?;
                self.replica.on_checkpoint_written(op, checksum);
            }
            // A group of one has no peer to fetch from; it never falls behind one either. A
            // replica with peers fetches a peer's checkpoint (`node::transfer`).
            Output::StateTransfer { above_op, commit_max } => self.start_transfer(above_op, commit_max),
        }
        Ok(())
    }
}

fn config(cluster: u128, group: u64, shape: Shape, peers: Option<&Peers>) -> Config {
    Config {
        cluster,
        group,
        replica: peers.map_or(0, |peers| peers.replica),
        replica_count: peers.map_or(1, |peers| peers.replica_count),
        shape,
        bugs: Bugs::default(),
    }
}

fn refused(dir: &Path, reason: String) -> GroupError {
    GroupError::Refused {
        dir: dir.to_path_buf(),
        reason,
    }
}

/// The durable part of the group in `dir`, read before its journal: the cluster id, the open
/// files, the superblock's state (copies that are stale or damaged rewritten, and a format-1
/// superblock migrated, unless `read_only`) and the checkpoint it names.
#[allow(clippy::type_complexity)]
fn read_durable<J: GroupJournal>(
    dir: &Path,
    group: u64,
    read_only: bool,
    replica: u8,
) -> Result<(u128, Files, DurableState, u64, Option<(Checkpoint, u8)>), GroupError> {
    let cluster_bytes =
        cairn_storage::atomic_file::read_verified_on(&cairn_storage::io::RealDisk, &dir.join(CLUSTER_FILE))
            .map_err(|error| refused(dir, format!("cannot read the cluster id: {error}")))?
            .ok_or_else(|| refused(dir, "the cluster id file is missing".to_string()))?;
    let cluster = u128::from_le_bytes(cluster_bytes.as_slice().try_into().map_err(|_| {
        refused(
            dir,
            format!("the cluster id holds {} bytes, not 16", cluster_bytes.len()),
        )
    })?);
    let mut files = Files::open(dir, &J::SHAPE, read_only)?;
    // A superblock of format 1 (written before 2026-12-02) is 128-byte copies; today's
    // copies are 512 bytes, so the file's length tells the two apart.
    let superblock_len = files.files[Zone::Superblock as usize]
        .metadata()
        .map_err(|error| files.io_error(Zone::Superblock, error))?
        .len();
    let format_1 = superblock_len <= (SUPERBLOCK_COPIES * COPY_SIZE_V1) as u64;
    let copies: Vec<Vec<u8>> = (0..SUPERBLOCK_COPIES)
        .map(|copy| {
            if format_1 {
                files.read_at(Zone::Superblock, (copy * COPY_SIZE_V1) as u64, COPY_SIZE_V1)
            } else {
                files.read(Zone::Superblock, copy, COPY_SIZE)
            }
        })
        .collect::<Result<_, _>>()?;
    let copy_refs: [Option<&[u8]>; SUPERBLOCK_COPIES] =
        std::array::from_fn(|copy| Some(copies[copy].as_slice()));
    let (state, sequence) = match durable::choose(&copy_refs, cluster, replica) {
        Ok(Chosen::Formatted {
            state,
            sequence,
            copies_to_repair,
            ..
        }) => {
            let bytes = durable::encode_copy(&state, sequence);
            if format_1 {
                // Rewritten whole in today's format (the same state and sequence): a
                // new file renamed over the old one, so a crash leaves one or the other.
                if !files.read_only {
                    migrate_superblock(&mut files, &bytes)?;
                    tracing::info!(
                        dir = %dir.display(),
                        "migrated the replicated log's superblock from format 1 to format 2 (512-byte copies that also keep the installed log's suffix); nothing else changed"
                    );
                }
            } else {
                for (copy, repair) in copies_to_repair.iter().enumerate() {
                    if *repair && !files.read_only {
                        tracing::warn!(dir = %dir.display(), copy, "rewriting a superblock copy that is stale or damaged");
                        files.write_synced(Zone::Superblock, copy, &bytes)?;
                    }
                }
            }
            (state, sequence)
        }
        Ok(Chosen::Wiped) => {
            return Err(refused(
                dir,
                "every superblock copy is blank: the log's durable state is gone; a group of one has no peer to rebuild it from, so the group does not start and its files are left as they are".to_string(),
            ));
        }
        // No copy verifies: damage. A foreign or contradictory copy is not damage the fault
        // model makes (another replica's files, or a bug): refused for an operator.
        Err(refusal @ durable::DurableRefusal::AllCopiesCorrupt { .. }) => {
            return Err(GroupError::Damaged {
                dir: dir.to_path_buf(),
                reason: format!("the superblock cannot be booted from: {refusal}"),
            });
        }
        Err(refusal) => {
            return Err(refused(
                dir,
                format!("the superblock cannot be booted from: {refusal}"),
            ));
        }
    };
    let checkpoint = named_checkpoint::<J>(&files, &state, cluster, group)?
        .map(|(checkpoint, slot, _)| (checkpoint, slot));
    Ok((cluster, files, state, sequence, checkpoint))
}

/// The checkpoint `state` names, from the slot that holds it intact, with its slot and
/// bytes; `None` when it names none (op 0). Refused when no slot holds it.
fn named_checkpoint<J: GroupJournal>(
    files: &Files,
    state: &DurableState,
    cluster: u128,
    group: u64,
) -> Result<Option<(Checkpoint, u8, Vec<u8>)>, GroupError> {
    if state.checkpoint_op == 0 {
        return Ok(None);
    }
    for slot in 0..2u8 {
        let prefix = files.read(Zone::Checkpoints, usize::from(slot), 16)?;
        let size = u32::from_le_bytes([prefix[8], prefix[9], prefix[10], prefix[11]]) as usize;
        if !(16..=J::SHAPE.checkpoint_size_max()).contains(&size) {
            continue;
        }
        let bytes = files.read(Zone::Checkpoints, usize::from(slot), size)?;
        if let Ok(checkpoint) = Checkpoint::decode(
            &bytes,
            J::SHAPE.checkpoint_size_max(),
            state.checkpoint_checksum,
            cluster,
            group,
        ) {
            return Ok(Some((checkpoint, slot, bytes)));
        }
    }
    Err(GroupError::Damaged {
        dir: files.dir.clone(),
        reason: format!(
            "the superblock names checkpoint op {}, and no checkpoint slot holds it intact",
            state.checkpoint_op
        ),
    })
}

/// The machine snapshot of the durable checkpoint of the group in `dir`, read without
/// opening its journal (an operator's repair of a damaged journal): its op and bytes, or
/// `None` when the group has no checkpoint yet. Writes nothing.
pub fn durable_checkpoint<J: GroupJournal>(
    dir: &Path,
    group: u64,
) -> Result<Option<(u64, Vec<u8>)>, GroupError> {
    let (_, _, state, _, checkpoint) = read_durable::<J>(dir, group, true, 0)?;
    Ok(checkpoint.map(|(checkpoint, _)| (state.checkpoint_op, checkpoint.state_machine)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_machine::metadata::{MetadataMachine, MetadataOp, OPERATION_METADATA};

    const GROUP: u64 = 0;

    fn open(dir: &Path) -> LocalGroup<MetadataMachine> {
        LocalGroup::open(dir, GROUP, MetadataMachine::default).expect("open")
    }

    fn create_streams(group: &mut LocalGroup<MetadataMachine>, names: std::ops::Range<u32>) {
        for n in names {
            let op = MetadataOp::CreateStream {
                name: format!("s{n}"),
                created_at_us: u64::from(n),
            };
            let reply = group.submit(OPERATION_METADATA, &op.encode()).expect("submit");
            assert!(matches!(MetadataMachine::decode_reply(&reply), Ok(Ok(_))));
        }
    }

    fn file_bytes(dir: &Path) -> Vec<Vec<u8>> {
        [SUPERBLOCK_FILE, HEADERS_FILE, PREPARES_FILE, CHECKPOINTS_FILE]
            .iter()
            .map(|name| std::fs::read(dir.join(name)).expect("read"))
            .collect()
    }

    /// A request retried on its lane (the same client, session and request number: its reply
    /// was lost on the way) is answered again from the client table with the original reply,
    /// and its op is never applied twice.
    #[test]
    fn a_retried_request_is_answered_again_never_applied_twice() {
        let temp = tempfile::tempdir().expect("tempdir");
        let mut group = open(&temp.path().join("group"));
        create_streams(&mut group, 0..3);
        let op = MetadataOp::CreateStream {
            name: "retried".into(),
            created_at_us: 7,
        };
        let body = Bytes::from(op.encode());
        let request = group.request_on(0, OPERATION_METADATA, body.clone());
        let first = group.call_lanes(vec![(0, request.clone())]);
        let first = first.into_iter().next().expect("one").expect("applied");
        let (commit, streams) = (group.commit_op(), group.state_machine().clone());
        assert!(matches!(MetadataMachine::decode_reply(&first.body), Ok(Ok(_))));
        for _ in 0..3 {
            let again = group.call_lanes(vec![(0, request.clone())]);
            let again = again.into_iter().next().expect("one").expect("answered");
            assert_eq!(again.body, first.body, "the stored reply");
            assert_eq!(group.commit_op(), commit, "no op for a retry");
            assert_eq!(*group.state_machine(), streams, "applied once");
        }
        // The lane goes on with its next request number.
        create_streams(&mut group, 3..4);
        assert_eq!(group.state_machine().state.streams.len(), 5);
    }

    /// Requests on several lanes are prepared together and one barrier covers them all: a
    /// batch of five appends to a partition takes one fdatasync of its log (and one of its
    /// frontier), and their offsets follow the order given.
    #[test]
    fn a_batch_on_several_lanes_shares_one_barrier() {
        use crate::partition_group::{self, JournalOptions, LogParams};
        use crate::test_support::client_batch;
        let temp = tempfile::tempdir().expect("tempdir");
        let params = LogParams::new(
            3,
            JournalOptions {
                segment_size_bytes: 1 << 20,
                relaxed: false,
            },
        );
        let dir = temp.path().join("partition");
        let mut group = partition_group::open(&dir, 9, params.clone()).expect("format");
        // Every lane registers once (one batch of registers, one barrier).
        let batch = client_batch(2, 30, 1);
        let batches: Vec<&[u8]> = vec![&batch];
        let appends: Vec<(u64, &[&[u8]])> = (0..LANES as u64).map(|n| (100 + n, &batches[..])).collect();
        assert!(group.append_copies(&appends).iter().all(Result::is_ok));
        let before = group.log().fdatasyncs();
        let appends: Vec<(u64, &[&[u8]])> = (0..5).map(|n| (200 + n, &batches[..])).collect();
        let minted: Vec<u64> = group
            .append_copies(&appends)
            .into_iter()
            .map(|result| result.expect("appended")[0])
            .collect();
        let start = 2 * LANES as u64;
        assert_eq!(minted, (0..5).map(|n| start + 2 * n).collect::<Vec<u64>>());
        assert_eq!(group.log().fdatasyncs() - before, 2, "one barrier for five ops");
        let state = group.state_machine().state().clone();
        drop(group);
        let group = partition_group::open(&dir, 9, params).expect("reopen");
        assert_eq!(group.state_machine().state(), &state);
    }

    /// Ops across several checkpoints come back after a restart (from the checkpoint and the
    /// journal above it), the log goes on from there, and a read-only open recovers the same
    /// state without changing a byte.
    #[test]
    fn a_restart_recovers_every_applied_op() {
        let temp = tempfile::tempdir().expect("tempdir");
        let dir = temp.path().join("group");
        let mut group = open(&dir);
        create_streams(&mut group, 0..50);
        let before = group.state_machine().clone();
        drop(group);

        let mut group = open(&dir);
        assert_eq!(*group.state_machine(), before);
        assert_eq!(group.state_machine().state.streams.len(), 50);
        create_streams(&mut group, 50..60);
        let after = group.state_machine().clone();
        drop(group);

        let files = file_bytes(&dir);
        let read_only = LocalGroup::open_read_only(&dir, GROUP, MetadataMachine::default)
            .expect("read-only open")
            .expect("a group exists");
        assert_eq!(*read_only.state_machine(), after);
        drop(read_only);
        assert!(file_bytes(&dir) == files, "a read-only open wrote to the files");
        assert_eq!(open(&dir).state_machine().state.streams.len(), 60);
    }

    /// A group written before 2026-12-02 has a format-1 superblock (128-byte copies, no log
    /// suffix). It opens with every op, the file is rewritten in today's format (a read-only
    /// open leaves it alone), and it opens again from there.
    #[test]
    fn a_format_1_superblock_is_migrated() {
        let temp = tempfile::tempdir().expect("tempdir");
        let dir = temp.path().join("group");
        let mut group = open(&dir);
        create_streams(&mut group, 0..20);
        let before = group.state_machine().clone();
        drop(group);

        // Rewrite the superblock as a format-1 build wrote it: the same state without the
        // suffix, its first 112 bytes with version 1, then their checksum, four times.
        let path = dir.join(SUPERBLOCK_FILE);
        let current = std::fs::read(&path).expect("read");
        let (state, sequence) = durable::decode_copy(&current[..COPY_SIZE]).expect("a valid copy");
        let state = DurableState {
            log_suffix: Vec::new(),
            ..state
        };
        let mut v1 = durable::encode_copy(&state, sequence)[..112].to_vec();
        v1[4..6].copy_from_slice(&durable::VERSION_V1.to_le_bytes());
        let checksum = xxhash_rust::xxh3::xxh3_128(&v1);
        v1.extend_from_slice(&checksum.to_le_bytes());
        std::fs::write(&path, v1.repeat(SUPERBLOCK_COPIES)).expect("write");

        let read_only = LocalGroup::open_read_only(&dir, GROUP, MetadataMachine::default)
            .expect("read-only open")
            .expect("a group exists");
        assert_eq!(*read_only.state_machine(), before);
        drop(read_only);
        assert_eq!(
            std::fs::read(&path).expect("read").len(),
            SUPERBLOCK_COPIES * COPY_SIZE_V1
        );

        let mut group = open(&dir);
        assert_eq!(*group.state_machine(), before);
        assert_eq!(
            std::fs::read(&path).expect("read").len(),
            SUPERBLOCK_COPIES * COPY_SIZE
        );
        create_streams(&mut group, 20..25);
        drop(group);
        assert_eq!(open(&dir).state_machine().state.streams.len(), 25);
    }

    /// A torn write of an entry that was never acknowledged (its redundant header never
    /// written) is not an op: recovery goes on without it.
    #[test]
    fn an_unacknowledged_torn_entry_is_dropped() {
        let temp = tempfile::tempdir().expect("tempdir");
        let dir = temp.path().join("group");
        let mut group = open(&dir);
        create_streams(&mut group, 0..5);
        let before = group.state_machine().clone();
        let next_slot = slot_of(group.commit_op() + 1, SHAPE.journal_slots);
        drop(group);
        let prepares = OpenOptions::new()
            .write(true)
            .open(dir.join(PREPARES_FILE))
            .expect("open");
        prepares
            .write_all_at(&[0xA5; 700], (next_slot * SHAPE.message_size_max) as u64)
            .expect("tear");
        let mut group = open(&dir);
        assert_eq!(*group.state_machine(), before);
        create_streams(&mut group, 5..6);
        assert_eq!(group.state_machine().state.streams.len(), 6);
    }

    /// A flipped bit in an acknowledged entry is damage: with no peer to repair it from, the
    /// group refuses to start, and the files stay as they are.
    #[test]
    fn a_damaged_acknowledged_entry_is_refused() {
        let temp = tempfile::tempdir().expect("tempdir");
        let dir = temp.path().join("group");
        let mut group = open(&dir);
        create_streams(&mut group, 0..5);
        let damaged_op = group.commit_op();
        let damaged_slot = slot_of(damaged_op, SHAPE.journal_slots);
        drop(group);
        let prepares = OpenOptions::new()
            .read(true)
            .write(true)
            .open(dir.join(PREPARES_FILE))
            .expect("open");
        let at = (damaged_slot * SHAPE.message_size_max + HEADER_SIZE + 3) as u64;
        let mut byte = [0u8; 1];
        prepares.read_exact_at(&mut byte, at).expect("read");
        prepares.write_all_at(&[byte[0] ^ 0x10], at).expect("flip");
        let files = file_bytes(&dir);
        match LocalGroup::open(&dir, GROUP, MetadataMachine::default) {
            Err(GroupError::Refused { reason, .. }) => {
                assert!(
                    reason.contains(&format!("slot {damaged_slot} (op {damaged_op})")),
                    "the refusal does not name the damaged entry: {reason}"
                );
            }
            Err(other) => panic!("refused for another reason: {other}"),
            Ok(_) => panic!("a damaged acknowledged entry was accepted"),
        }
        assert!(file_bytes(&dir) == files, "a refused open changed the files");
    }

    /// Groups of three replicas over real files in one process, messages between them on an
    /// in-memory network that encodes and checks each one as the replica network does: the
    /// shell a cluster node runs for each group.
    mod peers {
        use super::*;
        use cairn_machine::partition::PartitionMachine;
        use std::sync::atomic::{AtomicBool, Ordering};

        const CLUSTER: u128 = 0x5eed_c1a5;
        const WITHIN: Duration = Duration::from_secs(30);

        /// Delivers to each replica's inbox unless either end is down.
        struct Net {
            inboxes: Vec<Arc<Inbox>>,
            down: Mutex<Vec<bool>>,
            prepare_rule: BodyRule,
        }

        impl Net {
            fn new(prepare_rule: BodyRule) -> Arc<Net> {
                Arc::new(Net {
                    inboxes: (0..3).map(|_| Arc::new(Inbox::default())).collect(),
                    down: Mutex::new(vec![false; 3]),
                    prepare_rule,
                })
            }

            fn set_down(&self, replica: usize, down: bool) {
                self.down.lock().expect("lock")[replica] = down;
                // What was on its way to a crashed replica is gone.
                let _ = self.inboxes[replica].take_until(Instant::now());
            }
        }

        struct NetTransport {
            net: Arc<Net>,
            from: u8,
        }

        impl Transport for NetTransport {
            fn send(&self, to: u8, message: Message) {
                let message = as_carried(CLUSTER, self.from, self.net.prepare_rule, message);
                let down = self.net.down.lock().expect("lock");
                if !down[usize::from(self.from)] && !down[usize::from(to)] {
                    let _ = self.net.inboxes[usize::from(to)].push(message);
                }
            }
        }

        fn peers(net: &Arc<Net>, replica: u8) -> Peers {
            Peers {
                replica,
                replica_count: 3,
                cluster: CLUSTER,
                transport: Arc::new(NetTransport {
                    net: net.clone(),
                    from: replica,
                }),
                inbox: net.inboxes[usize::from(replica)].clone(),
                // Long enough that a loaded CI machine's stalls start no view change.
                tick: Duration::from_millis(10),
                request_timeout: Duration::from_secs(20),
                format_if_missing: true,
                transfer_pace: Arc::new(TransferPace::new(64 << 20)),
                abdicating: Arc::default(),
                primary_seen: Arc::default(),
                clock: Arc::new(WallClock),
            }
        }

        /// One replica: its group (`None` once crashed) and the worker thread serving it.
        struct Node<S: StateMachine, J: GroupJournal> {
            group: Arc<Mutex<Option<LocalGroup<S, J>>>>,
            stop: Arc<AtomicBool>,
            worker: Option<std::thread::JoinHandle<()>>,
        }

        impl<S: StateMachine + Send + 'static, J: GroupJournal + Send + 'static> Node<S, J> {
            fn start(group: LocalGroup<S, J>, inbox: Arc<Inbox>) -> Node<S, J> {
                let group = Arc::new(Mutex::new(Some(group)));
                let stop = Arc::new(AtomicBool::new(false));
                let worker = {
                    let (group, stop) = (group.clone(), stop.clone());
                    std::thread::spawn(move || {
                        while !stop.load(Ordering::Acquire) {
                            let next_tick = match group.lock().expect("lock").as_mut() {
                                Some(group) => group.serve_inbox().expect("serve"),
                                None => return,
                            };
                            inbox.wait_until(next_tick);
                        }
                    })
                };
                Node {
                    group,
                    stop,
                    worker: Some(worker),
                }
            }

            fn with<T>(&self, f: impl FnOnce(&mut LocalGroup<S, J>) -> T) -> T {
                f(self.group.lock().expect("lock").as_mut().expect("running"))
            }

            /// SIGKILL: the worker stops and the group is dropped as it stands (no close).
            fn crash(mut self) {
                self.stop.store(true, Ordering::Release);
                if let Some(worker) = self.worker.take() {
                    worker.join().expect("worker");
                }
                self.group.lock().expect("lock").take();
            }
        }

        fn eventually(what: &str, condition: impl Fn() -> bool) {
            let deadline = Instant::now() + WITHIN;
            while !condition() {
                assert!(
                    Instant::now() < deadline,
                    "{what} did not happen within {WITHIN:?}"
                );
                std::thread::sleep(Duration::from_millis(2));
            }
        }

        /// The index of the one replica that takes requests, once there is one.
        fn primary<S, J>(nodes: &[Option<Node<S, J>>]) -> usize
        where
            S: StateMachine + Send + 'static,
            J: GroupJournal + Send + 'static,
        {
            eventually("a primary", || {
                nodes
                    .iter()
                    .flatten()
                    .any(|node| node.with(|group| group.takes_requests()))
            });
            nodes
                .iter()
                .position(|node| {
                    node.as_ref()
                        .is_some_and(|node| node.with(|group| group.takes_requests()))
                })
                .expect("a primary")
        }

        /// The common scenario, `work` taking rounds 0 to 10: it commits on the primary of
        /// view 0 and the backups apply the same state; a request to a backup is not taken; a
        /// backup crashes, the other two go on, and it restarts from its files and catches
        /// up; the primary crashes, another is elected and `work` commits there; the crashed
        /// one restarts from its files and catches up as a backup; a last `work` reaches all
        /// three.
        fn commit_fail_over_and_rejoin<S, J>(
            net: &Arc<Net>,
            open: impl Fn(u8) -> LocalGroup<S, J>,
            work: impl Fn(&mut LocalGroup<S, J>, u32),
            state: impl Fn(&LocalGroup<S, J>) -> Vec<u8>,
        ) where
            S: StateMachine + Send + 'static,
            J: GroupJournal + Send + 'static,
        {
            let mut nodes: Vec<Option<Node<S, J>>> = (0..3u8)
                .map(|i| Some(Node::start(open(i), net.inboxes[usize::from(i)].clone())))
                .collect();
            let state_of = |node: &Node<S, J>| node.with(|group| state(group));
            let caught_up = |nodes: &[Option<Node<S, J>>], from: usize| {
                let expected = state_of(nodes[from].as_ref().expect("up"));
                for (i, node) in nodes.iter().enumerate() {
                    if let Some(node) = node {
                        eventually(&format!("replica {i} applying every op"), || {
                            state_of(node) == expected
                        });
                    }
                }
            };
            // View 0: replica 0 is the primary of a freshly formatted group.
            assert_eq!(primary(&nodes), 0);
            for round in 0..5 {
                nodes[0].as_ref().expect("up").with(|group| work(group, round));
            }
            caught_up(&nodes, 0);
            // A backup takes no request: nothing of it is prepared.
            let refused = nodes[1]
                .as_ref()
                .expect("up")
                .with(|group| group.submit(200, b"not for a backup"));
            assert!(matches!(refused, Err(GroupError::NotTaken { .. })), "{refused:?}");

            // A backup crashes: the primary commits with the other; the backup restarts
            // from its files (as replica 2, not 0) and catches up.
            net.set_down(2, true);
            nodes[2].take().expect("up").crash();
            for round in 5..7 {
                nodes[0].as_ref().expect("up").with(|group| work(group, round));
            }
            net.set_down(2, false);
            nodes[2] = Some(Node::start(open(2), net.inboxes[2].clone()));
            caught_up(&nodes, 0);

            // The primary crashes: the others elect a new primary, which takes requests.
            net.set_down(0, true);
            nodes[0].take().expect("up").crash();
            let new_primary = primary(&nodes);
            assert_ne!(new_primary, 0);
            for round in 7..10 {
                nodes[new_primary]
                    .as_ref()
                    .expect("up")
                    .with(|group| work(group, round));
            }

            // The old primary restarts from its files and catches up as a backup.
            net.set_down(0, false);
            nodes[0] = Some(Node::start(open(0), net.inboxes[0].clone()));
            caught_up(&nodes, new_primary);
            assert!(
                !nodes[0]
                    .as_ref()
                    .expect("up")
                    .with(|group| group.takes_requests()),
                "it rejoined as a backup"
            );
            nodes[new_primary]
                .as_ref()
                .expect("up")
                .with(|group| work(group, 10));
            caught_up(&nodes, new_primary);
            for node in nodes.into_iter().flatten() {
                node.crash();
            }
        }

        /// Three metadata replicas in `dir` over `net`, each served by a worker, whose
        /// requests wait `request_timeout` for their quorum.
        fn metadata_nodes(
            dir: &Path,
            net: &Arc<Net>,
            request_timeout: Duration,
        ) -> Vec<Node<MetadataMachine, RingJournal>> {
            (0..3u8)
                .map(|replica| {
                    let peers = Peers {
                        request_timeout,
                        ..peers(net, replica)
                    };
                    let group = LocalGroup::open_with_peers(
                        &dir.join(format!("replica-{replica}")),
                        GROUP,
                        &(MetadataMachine::body_verifies as BodyRule),
                        MetadataMachine::default,
                        Some(peers),
                    )
                    .expect("open");
                    Node::start(group, net.inboxes[usize::from(replica)].clone())
                })
                .collect()
        }

        /// Create stream `name` through `node`'s replica.
        fn create_stream(
            node: &Node<MetadataMachine, RingJournal>,
            name: &str,
        ) -> Result<Vec<u8>, GroupError> {
            let op = MetadataOp::CreateStream {
                name: name.to_string(),
                created_at_us: 1,
            };
            node.with(|group| group.submit(OPERATION_METADATA, &op.encode()))
        }

        /// The names of the streams `node`'s replica applied, sorted.
        fn stream_names(node: &Node<MetadataMachine, RingJournal>) -> Vec<String> {
            node.with(|group| {
                let mut names: Vec<String> = group
                    .state_machine()
                    .state
                    .streams
                    .values()
                    .map(|stream| stream.name.clone())
                    .collect();
                names.sort();
                names
            })
        }

        /// A request whose quorum is cut off gets `OutcomeUnknown` after its timeout, and
        /// the group does not stop: once the network heals, later requests commit (the lane
        /// that timed out starts over as a new client), and the request whose outcome was
        /// unknown commits after all when its primary kept its view (it stayed in the
        /// pipeline and its prepare was sent again).
        #[test]
        fn a_request_without_a_quorum_has_an_unknown_outcome_and_the_group_goes_on() {
            let temp = tempfile::tempdir().expect("tempdir");
            let net = Net::new(MetadataMachine::body_verifies);
            // Shorter than a backup's view-change timeout (50 ticks of 10 ms), so the
            // primary usually keeps its view through the cut.
            let nodes = metadata_nodes(temp.path(), &net, Duration::from_millis(200));
            let create = create_stream;
            create(&nodes[0], "before").expect("committed");
            net.set_down(1, true);
            net.set_down(2, true);
            let unknown = create(&nodes[0], "maybe");
            assert!(
                matches!(unknown, Err(GroupError::OutcomeUnknown { .. })),
                "{unknown:?}"
            );
            assert!(
                nodes[0].with(|group| group.stopped_reason().is_none()),
                "the group goes on"
            );
            net.set_down(1, false);
            net.set_down(2, false);
            // Whoever is primary now takes the next request.
            let deadline = Instant::now() + WITHIN;
            loop {
                let taker = nodes
                    .iter()
                    .find(|node| node.with(|group| group.takes_requests()));
                if let Some(taker) = taker {
                    match create(taker, "after") {
                        Ok(_) => break,
                        Err(GroupError::NotTaken { .. } | GroupError::OutcomeUnknown { .. }) => {}
                        Err(other) => panic!("{other}"),
                    }
                }
                assert!(
                    Instant::now() < deadline,
                    "no request committed after the cut healed"
                );
                std::thread::sleep(Duration::from_millis(10));
            }
            let names = stream_names;
            let expected = names(&nodes[0]);
            for node in &nodes {
                eventually("every replica applies the same ops", || names(node) == expected);
            }
            assert!(expected.contains(&"before".to_string()) && expected.contains(&"after".to_string()));
            if nodes[0].with(|group| group.takes_requests()) {
                assert!(expected.contains(&"maybe".to_string()), "{expected:?}");
            }
            for node in nodes {
                node.crash();
            }
        }

        /// A primary cut off from its backups prepares a request that the view its backups
        /// elect meanwhile never sees. Once it hears the new view, its log no longer holds the
        /// request: it is answered not taken (the client may send it to the new primary),
        /// not left unknown until its timeout, and no replica ever applies it.
        #[test]
        fn a_request_a_view_change_dropped_is_not_taken() {
            let temp = tempfile::tempdir().expect("tempdir");
            let net = Net::new(MetadataMachine::body_verifies);
            // Far beyond the view change: an unknown outcome would take this long.
            let nodes = metadata_nodes(temp.path(), &net, Duration::from_secs(120));
            let create = create_stream;
            // View 0: replica 0 is the primary of a freshly formatted group.
            eventually("replica 0 primary", || {
                nodes[0].with(|group| group.takes_requests())
            });
            create(&nodes[0], "before").expect("committed");
            net.set_down(0, true);
            let dropped = std::thread::scope(|scope| {
                scope.spawn(|| {
                    // The backups elect a primary of their own; then the cut heals.
                    eventually("a new primary", || {
                        nodes[1..]
                            .iter()
                            .any(|node| node.with(|group| group.takes_requests()))
                    });
                    net.set_down(0, false);
                });
                create(&nodes[0], "dropped")
            });
            match dropped {
                Err(GroupError::NotTaken { reason, .. }) => {
                    assert!(reason.contains("view change dropped"), "{reason}")
                }
                other => panic!("not answered as not taken: {other:?}"),
            }
            let names = stream_names;
            // Sent again to the new primary, it commits once, everywhere.
            let taker = nodes
                .iter()
                .find(|node| node.with(|group| group.takes_requests()))
                .expect("a primary");
            create(taker, "dropped").expect("committed by the new primary");
            for node in &nodes {
                eventually("every replica applies the same ops", || {
                    names(node) == vec!["before".to_string(), "dropped".to_string()]
                });
            }
            for node in nodes {
                node.crash();
            }
        }

        #[test]
        fn metadata_replicas_commit_fail_over_and_rejoin() {
            let temp = tempfile::tempdir().expect("tempdir");
            let net = Net::new(MetadataMachine::body_verifies);
            let open = |replica: u8| {
                LocalGroup::open_with_peers(
                    &temp.path().join(format!("replica-{replica}")),
                    GROUP,
                    &(MetadataMachine::body_verifies as BodyRule),
                    MetadataMachine::default,
                    Some(peers(&net, replica)),
                )
                .expect("open")
            };
            let work = |group: &mut LocalGroup<MetadataMachine>, round: u32| {
                let op = MetadataOp::CreateStream {
                    name: format!("s{round}"),
                    created_at_us: 1,
                };
                let reply = group.submit(OPERATION_METADATA, &op.encode()).expect("committed");
                assert!(matches!(MetadataMachine::decode_reply(&reply), Ok(Ok(_))));
            };
            let state = |group: &LocalGroup<MetadataMachine>| group.state_machine().snapshot();
            commit_fail_over_and_rejoin(&net, open, work, state);
            // A replica's files open only in the seat they were formatted in.
            let opened: Result<LocalGroup<MetadataMachine>, _> = LocalGroup::open_with_peers(
                &temp.path().join("replica-1"),
                GROUP,
                &(MetadataMachine::body_verifies as BodyRule),
                MetadataMachine::default,
                Some(peers(&net, 2)),
            );
            match opened {
                Err(GroupError::Refused { reason, .. }) => {
                    assert!(
                        reason.contains("replica 1"),
                        "names the seat the files belong to: {reason}"
                    )
                }
                Err(other) => panic!("refused for the wrong reason: {other}"),
                Ok(_) => panic!("a replica's files opened in another seat"),
            }
        }

        /// A group's inbox keeps at most its bound and drops the newest beyond it.
        #[test]
        fn a_full_inbox_drops_the_newest_message() {
            let inbox = Inbox::default();
            let message = |op: u64| {
                let mut header = Header::new(Command::Commit, CLUSTER);
                header.op = op;
                Message::new(header, Bytes::new())
            };
            for op in 0..INBOX_MESSAGES_MAX as u64 {
                assert_eq!(inbox.push(message(op)), Pushed::Queued);
            }
            assert_eq!(inbox.push(message(u64::MAX)), Pushed::Dropped);
            assert_eq!(inbox.dropped(), 1);
            let taken = inbox.take_until(Instant::now());
            assert_eq!(taken.len(), INBOX_MESSAGES_MAX);
            assert!(
                taken
                    .iter()
                    .enumerate()
                    .all(|(op, message)| message.header.op == op as u64)
            );
            assert_eq!(inbox.push(message(7)), Pushed::Queued, "room again once taken");
        }

        /// A message pushed while the group's holder waits for its inbox is the holder's:
        /// `push` says so (so no worker is woken for it) and the waiting holder takes it.
        #[test]
        fn a_message_for_a_waiting_holder_is_handed_to_it() {
            let inbox = Arc::new(Inbox::default());
            let mut header = Header::new(Command::Commit, CLUSTER);
            header.op = 42;
            assert_eq!(inbox.push(Message::new(header, Bytes::new())), Pushed::Queued);
            assert_eq!(inbox.take_now().len(), 1);
            let holder = {
                let inbox = inbox.clone();
                std::thread::spawn(move || inbox.take_until(Instant::now() + Duration::from_secs(60)))
            };
            while inbox.waiting() == 0 {
                std::thread::yield_now();
            }
            assert_eq!(inbox.push(Message::new(header, Bytes::new())), Pushed::ToWaiter);
            let taken = holder.join().expect("the holder");
            assert_eq!(
                taken.iter().map(|message| message.header.op).collect::<Vec<_>>(),
                [42]
            );
            assert_eq!(inbox.waiting(), 0);
            assert_eq!(inbox.push(Message::new(header, Bytes::new())), Pushed::Queued);
        }

        /// A replica with peers whose directory lost its group is not formatted afresh (it
        /// may have acknowledged ops, and a new replica would vote as if it never had): it
        /// opens as a wiped replica, recovering, with a blank superblock until its first
        /// durable state. Opened again before then, it starts over; a blank superblock that
        /// no wiped open made is damage, set aside with its bytes.
        #[test]
        fn a_replica_that_lost_its_files_rejoins_as_a_wiped_one() {
            let temp = tempfile::tempdir().expect("tempdir");
            let net = Net::new(MetadataMachine::body_verifies);
            let dir = temp.path().join("wiped");
            let open_with = |format_if_missing: bool| -> LocalGroup<MetadataMachine> {
                let mut peers = peers(&net, 1);
                peers.format_if_missing = format_if_missing;
                LocalGroup::open_with_peers(
                    &dir,
                    GROUP,
                    &(MetadataMachine::body_verifies as BodyRule),
                    MetadataMachine::default,
                    Some(peers),
                )
                .expect("a wiped replica opens")
            };
            let open = || open_with(false);
            let check_wiped = |group: &LocalGroup<MetadataMachine>| {
                assert_eq!(group.replica_status().role, "recovering");
                assert!(!group.takes_requests());
                assert!(superblock_is_blank(&dir), "no durable state yet");
                assert!(dir.join(REJOINING_FILE).exists());
            };
            let group = open();
            check_wiped(&group);
            drop(group);
            // Its own blank directory: started over, nothing set aside.
            check_wiped(&open());
            assert!(!temp.path().join("wiped.quarantine.0").exists());
            // A blank superblock without the marker: the files go to quarantine, kept.
            std::fs::remove_file(dir.join(REJOINING_FILE)).expect("remove the marker");
            check_wiped(&open());
            assert!(
                temp.path()
                    .join("wiped.quarantine.0")
                    .join(SUPERBLOCK_FILE)
                    .exists()
            );
            // The directory gone after its files were set aside (a crash between the
            // quarantine and the new directory): never formatted as a new replica, even where
            // a missing group would be.
            std::fs::remove_dir_all(&dir).expect("remove the directory");
            check_wiped(&open_with(true));
            // A wiped open that stopped after its marker, before its blank superblock: wiped
            // again, never formatted as new.
            std::fs::remove_dir_all(temp.path().join("wiped.quarantine.0")).expect("remove");
            std::fs::remove_file(dir.join(SUPERBLOCK_FILE)).expect("remove the superblock");
            check_wiped(&open_with(true));
        }

        /// The partition's journal is its segment log: backups write the primary's stamped
        /// appends into their own segment logs (several segments), and offsets continue
        /// across the failover, never handed out twice.
        #[test]
        fn partition_replicas_commit_fail_over_and_rejoin() {
            use crate::partition_group::{JournalOptions, LogJournal, LogParams};
            use crate::test_support::client_batch;
            let temp = tempfile::tempdir().expect("tempdir");
            let net = Net::new(PartitionMachine::body_verifies);
            let params = LogParams::new(
                3,
                JournalOptions {
                    segment_size_bytes: 4096,
                    relaxed: false,
                },
            );
            let open = |replica: u8| {
                LocalGroup::open_with_peers(
                    &temp.path().join(format!("replica-{replica}")),
                    9,
                    &params,
                    || PartitionMachine::new(3),
                    Some(peers(&net, replica)),
                )
                .expect("open")
            };
            let minted = Mutex::new(Vec::new());
            let work = |group: &mut LocalGroup<PartitionMachine, LogJournal>, round: u32| {
                let batch = client_batch(3, 700, round as u8);
                let offsets = group
                    .append(1_000 + u64::from(round), &[&batch[..]])
                    .expect("appended");
                minted.lock().expect("lock").push(offsets[0]);
                if round == 10 {
                    assert!(group.stats().segments_count > 2, "the log spans several segments");
                }
            };
            // The machine's state (its digest chains every committed batch) and what the
            // journal serves.
            let state = |group: &LocalGroup<PartitionMachine, LogJournal>| {
                let stats = group.stats();
                let mut state = group.state_machine().snapshot();
                state.extend_from_slice(&stats.messages_count.to_le_bytes());
                state.extend_from_slice(&stats.segments_count.to_le_bytes());
                state
            };
            commit_fail_over_and_rejoin(&net, open, work, state);
            let minted = minted.into_inner().expect("lock");
            assert_eq!(
                minted,
                (0..11).map(|round| round * 3).collect::<Vec<u64>>(),
                "offsets continue"
            );
        }
    }
}
