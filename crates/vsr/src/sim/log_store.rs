//! A log journal's storage supplied by the harness's caller ([`SimLog`]), in place of the log
//! zone of the simulated disk (`Shape::log_journal`): a partition's segment log over the
//! storage crate's simulated disk, say. The cluster drives it as a partition's shell drives
//! its journal: prepares written in op order (a rewrite cuts first), one barrier before a
//! write is reported, reads back by op, an open after every restart, and state transfer as
//! segments (an offer, checksummed chunks, a staged log made live by the superblock write
//! that names the transferred checkpoint).

use crate::header::Message;
use crate::journal::SlotState;

/// A chunk of a state transfer: the bytes and their checksum (transport only).
pub type Chunk = (Vec<u8>, u64);

/// What [`SimLog::recover`] found.
#[derive(Debug)]
pub enum Opened {
    /// The log, one state per slot of the ring.
    Log(Vec<SlotState>),
    /// The log was refused for damage and its shell set the whole group aside (quarantine,
    /// every byte kept): the replica starts again on a blank disk, its superblock gone with
    /// the rest, and is rebuilt from its peers as a wiped replica is. Says what was found.
    Quarantined(String),
}

/// The storage of one replica's log journal (see the module doc). Every method is called on
/// the simulation's thread, in its order: a run stays a function of its seed.
pub trait SimLog {
    /// Write prepare `message` after the log's end, or at or below it (a rewrite: the log is
    /// cut there first). Durable only after [`SimLog::sync`]. `Err`: the journal stopped
    /// (the replica crashes).
    fn write(&mut self, message: &Message) -> Result<(), String>;

    /// One barrier over everything written. `Err`: a failed barrier (the replica crashes).
    fn sync(&mut self) -> Result<(), String>;

    /// Prepare `op` read back, if the log holds it with `checksum`.
    fn read(&mut self, op: u64, checksum: u128) -> Option<Message>;

    /// A power loss: what was not synced is lost or torn, as `seed` decides. The log is
    /// unusable until [`SimLog::recover`].
    fn crash(&mut self, seed: u64);

    /// The disk replaced by a blank one.
    fn wipe(&mut self);

    /// Open the log after a restart, given the checkpoint the superblock names as (op,
    /// checkpoint checksum, checksum of the prepare at the op), `None` for a wiped replica,
    /// whose log starts empty: one state per slot of a ring of `journal_slots` (op `o` at slot
    /// `o % journal_slots`). `Opened::Quarantined`: refused for damage [`SimLog::flip`] did,
    /// and set aside. `Err`: the log refuses to open for any other reason (a violation).
    fn recover(
        &mut self,
        checkpoint: Option<(u64, u128, u128)>,
        journal_slots: usize,
    ) -> Result<Opened, String>;

    /// A bit flips somewhere in the log's files while its replica is down (after
    /// [`SimLog::crash`]), as `seed` decides. `false` if there was nothing to flip.
    fn flip(&mut self, seed: u64) -> bool;

    /// Whether the log holds op `op` with prepare checksum `checksum` durably: a state
    /// transfer then keeps the log (`TransferredLog::Kept`). A shell that queues writes
    /// judges this after every write asked before it (a queued rewrite at or below `op`
    /// would cut it).
    fn holds_durably(&self, op: u64, checksum: u128) -> bool;

    /// What a peer is offered to transfer this log up to the durable checkpoint the
    /// superblock names (`checkpoint_op`, `checkpoint_checksum`, its bytes): a manifest.
    /// `None` if this log cannot offer it. (The stale-offer fault asks for an op below the
    /// checkpoint's, or asks another replica than the checkpoint's.)
    fn offer(&self, checkpoint_op: u64, checkpoint_checksum: u128, checkpoint: &[u8]) -> Option<Vec<u8>>;

    /// `len` bytes at `position` of the segment named `segment`, for an offer's receiver.
    fn chunk(&self, segment: u64, position: u64, len: u64) -> Option<Chunk>;

    /// Stage the log `offer` describes beside this one, its chunks fetched through `fetch`
    /// (segment, position, length), for the checkpoint `checkpoint` (its bytes and checksum,
    /// which the offer must match) while this replica's machine is `own_state` (its
    /// snapshot: an offer below it is stale). It is not live until [`SimLog::commit_staged`];
    /// an open before that keeps the old log unless the superblock names the offer's
    /// checkpoint. `Err`: refused (nothing staged).
    fn stage(
        &mut self,
        offer: &[u8],
        checkpoint: (&[u8], u128),
        own_state: &[u8],
        fetch: &mut dyn FnMut(u64, u64, u64) -> Option<Chunk>,
    ) -> Result<(), String>;

    /// The superblock naming the staged log's checkpoint is durable: make the staged log
    /// live. `Err`: the install failed (the replica crashes; the open rolls it forward).
    fn commit_staged(&mut self) -> Result<(), String>;

    /// Drop what [`SimLog::stage`] staged: the core did not take the checkpoint.
    fn abandon_staged(&mut self);

    /// The superblock naming checkpoint `checkpoint_op` (`checkpoint_checksum`, its bytes
    /// `checkpoint`) is durable: release what the log no longer needs, as retention does
    /// (whole oldest segments whose ops are all at or below the checkpoint and whose messages
    /// all lie below the checkpoint's start offset). `Err`: the log refused (a violation).
    fn release(
        &mut self,
        checkpoint_op: u64,
        checkpoint_checksum: u128,
        checkpoint: &[u8],
    ) -> Result<(), String>;

    /// The first op the log holds; those below it were released (no poll serves them).
    fn first_op(&self) -> u64;

    /// A digest of what a poll serves of op `op` (its messages as stored), or `None` if the
    /// log does not hold it. The cluster checks every op a replica may serve (up to its
    /// commit point) against what was served of it anywhere before.
    fn served(&mut self, op: u64) -> Option<u64>;
}
