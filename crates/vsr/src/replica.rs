//! The replica: a deterministic VSR state machine (`docs/replication.md`).
//!
//! A [`Replica`] is driven by its inputs: [`Replica::on_message`], [`Replica::on_tick`],
//! [`Replica::on_prepare_written`], [`Replica::on_durable_written`],
//! [`Replica::on_checkpoint_written`] and [`Replica::on_state_transferred`]. What it wants
//! done accumulates in its outbox ([`Replica::take_outputs`]): messages to send, prepares,
//! durable state and checkpoints to write, state to fetch. The shell performs them and
//! reports completions back. A replica starts fresh ([`Replica::new`]) or from what its
//! storage holds ([`Replica::recover`]). Nothing here blocks, sleeps, reads a clock or draws
//! randomness.
//!
//! It covers normal operation (requests, pipelined prepares, acknowledgements only after the
//! journal write is durable, commits in op order, replies, the client table, heartbeats,
//! retransmission), the view change (persist before send, DoViewChange records with nacks,
//! nack-quorum truncation, repair by op and checksum), checkpoints, restart recovery
//! (probes with a nonce, the log rebuilt against the persisted log head, the fallback
//! election), wiped disks (a quorum of recovery responses) and the state-transfer hook.

use crate::checkpoint::Checkpoint;
use crate::client_table::{Admission, ClientTable, TableFault};
use crate::constants::{
    COMMIT_INTERVAL_TICKS, HEADER_SIZE, NORMAL_TIMEOUT_TICKS, OPERATION_REGISTER, OPERATION_SESSION_EVICTED,
    PREPARE_TIMEOUT_TICKS, PROBE_ATTEMPTS_MAX, PROBE_INTERVAL_TICKS, REPLICAS_MAX, REPLY_SIZE_MAX,
    STATE_MACHINE_SNAPSHOT_MAX, STATE_TRANSFER_TIMEOUT_TICKS, Shape, TIMEOUT_JITTER_TICKS_MAX,
    VIEW_CHANGE_RETRY_TICKS, VIEW_CHANGE_TIMEOUT_TICKS,
};
use crate::durable::{DurableState, LOG_SUFFIX_MAX};
use crate::header::{Command, Header, Message, root_checksum};
use crate::journal::{SlotState, slot_of};
use bytes::Bytes;
use std::collections::VecDeque;
use std::sync::Arc;

/// The replicated state machine. `apply` must be deterministic: every replica applies the
/// same ops in the same order and must produce the same replies.
pub trait StateMachine {
    /// Primary only, as it turns a request into prepare `op`: the prepare's body and the
    /// cursor after it, given `cursor`, the cursor after the op before it (its prepare
    /// header's; 0 at the root). What this decides is decided once, here, and replicated as
    /// the prepare: backups and later replays never call it, so it need not be a function of
    /// anything but what it is given. A partition mints a batch's offsets here, from the
    /// cursor, and a new primary continues from the head of its log, never from its commit
    /// point: offsets of uncommitted ops it keeps are never minted again. The cursor's 16
    /// bytes are the machine's to define (a partition: next offset and last timestamp). The
    /// body must fit the group's messages. The request's body is handed over: when nothing
    /// else holds it (`Bytes::try_into_mut`), the machine may turn it into the prepare's body in
    /// place rather than copy it; the bytes it returns must not depend on which it did. The
    /// default keeps the request's body and the cursor.
    fn prepare(&self, op: u64, timestamp: u64, operation: u8, input: Bytes, cursor: u128) -> (Bytes, u128) {
        let _ = (op, timestamp, operation);
        (input, cursor)
    }

    /// The checksum a prepare of `operation` carries for its prepared `body`
    /// ([`crate::header::Header::checksum_body`]). By default the XXH3-128 of the body, which
    /// [`Message::decode`] verifies. A machine whose bodies commit to their own bytes (a
    /// partition's stamped batch headers cover every message's checksum) may derive it from
    /// fewer bytes, saving a pass over megabytes; it must then verify its prepares itself
    /// wherever they are read back or received (the frames against their checksums, or the
    /// storage's record checksums).
    fn body_checksum(&self, operation: u8, body: &[u8]) -> u128 {
        let _ = operation;
        xxhash_rust::xxh3::xxh3_128(body)
    }

    /// Whether `body` is the body of a prepare of `operation` sealed with `checksum_body` by
    /// [`StateMachine::body_checksum`], checking every byte of it: what a shell reading a
    /// prepare back from storage without checksums of its own (a ring journal's slot) passes
    /// to [`crate::journal::read_back`]. Must accept what `body_checksum` produced for it.
    fn body_verifies(operation: u8, body: &[u8], checksum_body: u128) -> bool
    where
        Self: Sized,
    {
        crate::journal::plain_body(operation, body, checksum_body)
    }

    /// Apply committed op `op` (`operation`, `input`, prepared at `timestamp`); the reply body.
    fn apply(&mut self, op: u64, timestamp: u64, operation: u8, input: &[u8]) -> Vec<u8>;

    /// The whole state as bytes, for a checkpoint: equal states give equal bytes, at most
    /// [`STATE_MACHINE_SNAPSHOT_MAX`].
    fn snapshot(&self) -> Vec<u8>;

    /// Replace the whole state with a snapshot's (from a checkpoint or state transfer). An
    /// `Err` leaves the state as it was; the text says why the bytes were refused.
    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String>;
}

/// Who a message goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Destination {
    Replica(u8),
    Client(u128),
}

/// What the replica asks its shell to do, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    Send {
        to: Destination,
        message: Message,
    },
    /// Write the prepare to its journal slot, then its redundant header, sync, and report
    /// [`Replica::on_prepare_written`]. With a log journal (`Shape::log_journal`) the writes
    /// come in op order, and a write at or below the end of the shell's log first discards
    /// everything the log holds from that op up (truncate, then append); completions are
    /// reported in the order asked.
    WritePrepare {
        message: Message,
    },
    /// Write the durable state to every superblock copy (each synced before the next), then
    /// report [`Replica::on_durable_written`] with this state.
    WriteDurable {
        state: DurableState,
    },
    /// Write the checkpoint `bytes` to checkpoint slot `slot` (0 or 1), sync, and report
    /// [`Replica::on_checkpoint_written`]. The other slot holds the checkpoint the durable
    /// state names, and is never written while it does.
    WriteCheckpoint {
        slot: u8,
        op: u64,
        checksum: u128,
        bytes: Arc<[u8]>,
    },
    /// Read prepare `op` (whose checksum must be `checksum`) back from the journal, verify it,
    /// and report [`Replica::on_prepare_read`] with it, or with `None` if the bytes there are
    /// not that prepare. `for_replica` goes back with it: the peer that asked for it, or
    /// `None` when the replica itself needs the body to apply the op.
    ReadPrepare {
        op: u64,
        checksum: u128,
        for_replica: Option<u8>,
    },
    /// Fetch a peer's latest durable checkpoint above op `above_op` and hand it to
    /// [`Replica::on_state_transferred`]; ask a peer whose `commit_max` is at least
    /// `commit_max` (Iggy trap 9: never take state from a replica that knows less). No answer
    /// is fine: the replica asks again later.
    StateTransfer {
        above_op: u64,
        commit_max: u64,
    },
}

/// Where the replica stands in the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Normal,
    /// Electing the primary of `view`, or installing its log.
    ViewChange,
    /// Restarted from storage (or with a wiped disk): it probes for the current view and
    /// casts no vote and sends no acknowledgement until a StartView it may trust arrives.
    Recovering,
}

/// What a restarted replica read back from its storage (the shell reads; `journal::classify_slot`
/// and `durable::choose` decide what the bytes mean).
#[derive(Debug, Clone)]
pub struct Recovered {
    /// The superblock's state after the shell repaired its copies; `None` if every copy was
    /// blank (a wiped disk).
    pub durable: Option<DurableState>,
    /// The checkpoint the durable state names and the slot it was found in; `None` exactly
    /// when `durable.checkpoint_op` is 0 (or the disk was wiped).
    pub checkpoint: Option<(Checkpoint, u8)>,
    /// Every journal slot, by index (`shape.journal_slots` of them; empty for a wiped disk).
    pub journal: Vec<SlotState>,
    /// Fresh for every boot (the shell draws it): a StartView echoing it was made after this
    /// boot, so it cannot be a stale answer older than what this replica acknowledged.
    pub nonce: u128,
}

/// Why a replica refuses to start from what its storage holds. Each needs an operator: the
/// bytes are kept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecoveryError {
    #[error("the durable state names checkpoint op {op}, but no checkpoint slot holds it")]
    CheckpointMissing { op: u64 },
    #[error("the durable state names no checkpoint, but one was handed over")]
    CheckpointUnexpected,
    #[error("the checkpoint is at op {found}, the durable state names op {expected}")]
    CheckpointOp { found: u64, expected: u64 },
    #[error("the checkpoint's state machine snapshot was refused: {0}")]
    StateMachine(String),
    #[error("the checkpoint's client table was refused: {0}")]
    ClientTable(TableFault),
    #[error("the recovered journal has {found} slots, not {expected}")]
    JournalShape { found: usize, expected: usize },
    #[error("the durable state belongs to another replica or cluster")]
    Foreign,
}

/// A restarted replica's probe: until a StartView it may trust arrives.
#[derive(Debug, Clone, Copy)]
struct Recovery {
    nonce: u128,
    /// The durable `view` at boot. A PrepareOk of view `v` leaves only once `v` is durable,
    /// so this replica acknowledged nothing in any higher view: a StartView of one cannot be
    /// older than an acknowledgement it gave, and is trusted without the nonce.
    boot_view: u32,
    /// The disk was wiped: everything it acknowledged before is gone, so only a StartView
    /// echoing the nonce is trusted, and it never votes until installed.
    wiped: bool,
    probe_sent_tick: u64,
    /// Probe rounds sent this boot.
    probes_sent: u64,
    /// By replica: the highest view it reported in answer to this boot's probes (a
    /// RecoveryResponse or a StartView echoing the nonce).
    responses: [Option<u32>; REPLICAS_MAX],
}

/// What a faulty slot may have held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FaultyOp {
    /// The redundant header verifies and names this op.
    Op(u64),
    /// Nothing readable says which op it was.
    Any,
}

impl FaultyOp {
    fn covers(self, op: u64) -> bool {
        match self {
            FaultyOp::Op(faulty) => faulty == op,
            FaultyOp::Any => true,
        }
    }
}

/// A checkpoint on its way to durability: written to `slot`, then named by the durable state.
#[derive(Debug, Clone, Copy)]
struct CheckpointCycle {
    op: u64,
    checksum: u128,
    slot: u8,
    /// The shell reported the checkpoint bytes synced; the durable state may name it.
    written: bool,
    /// Log journal: the checkpoint came by state transfer with a log the shell staged in
    /// place of its own ([`TransferredLog::Replaced`]). The staged log becomes the shell's
    /// live one when the durable state names the checkpoint, so no prepare is written until
    /// then: op `op + 1` would land in the log being replaced.
    replaces_log: bool,
}

/// What the shell of a log journal (`Shape::log_journal`) did with its log for a checkpoint
/// it got by state transfer (see [`Replica::on_state_transferred`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransferredLog {
    /// Its log already holds the checkpoint's op, with the checksum of the checkpoint's
    /// header, durably: the log stays, with whatever it holds above that op.
    Kept,
    /// It staged the peer's log, which ends exactly at the checkpoint's op; it replaces the
    /// shell's own once the durable state names the checkpoint (the install's commit point).
    Replaced,
}

/// Fixed identity of a replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    pub cluster: u128,
    pub group: u64,
    pub replica: u8,
    pub replica_count: u8,
    /// The group's sizes (message, journal, pipeline, checkpoint interval, client table).
    /// Every replica of a group runs the same shape.
    pub shape: Shape,
    /// Deliberate protocol bugs, for the simulator's mutation tests only. All off in any
    /// real replica.
    pub bugs: Bugs,
}

/// One switch per protocol rule the mutation tests break, to prove the simulator's checkers
/// notice (`docs/replication.md`, "Mutation tests"). Never set outside tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Bugs {
    /// The primary commits an op on its own acknowledgement alone, without a quorum.
    pub commit_without_quorum: bool,
    /// The new primary adopts the longest log of the DoViewChange quorum, whatever its
    /// `log_view` (an old primary's uncommitted tail can then replace committed ops).
    pub merge_ignores_log_view: bool,
    /// The new primary truncates the canonical log at an op one DoViewChange sender nacks,
    /// not a quorum.
    pub truncate_without_nack_quorum: bool,
    /// StartViewChange, DoViewChange and StartView leave before the view is durable (and
    /// the persist-before-send assertion is off).
    pub send_before_view_persist: bool,
    /// A restarted replica trusts every clean journal slot as part of its log, ignoring the
    /// persisted log head (stale prepares of older views then count as its log).
    pub recovery_ignores_log_head: bool,
    /// The primary prepares from the cursor of its commit point, not of its log's head:
    /// prepares in flight mint the same offsets again.
    pub prepare_from_commit_point: bool,
    /// A log journal's cut leaves the ops above it counted durable, and the log's end moves
    /// over them without writing them again, although the shell discards them at the next
    /// write below: acknowledged (even committed) ops vanish from the log.
    pub log_cut_keeps_durable: bool,
}

impl Config {
    /// Replicas whose durable acknowledgements commit an op, and whose votes elect a primary
    /// (classic majority).
    pub fn quorum(&self) -> usize {
        usize::from(self.replica_count) / 2 + 1
    }

    pub fn primary_of(&self, view: u32) -> u8 {
        (view % u32::from(self.replica_count)) as u8
    }
}

/// One journal slot: the op it holds, the checksum that op must have, and what of it the
/// replica has. A slot that is neither in memory nor durable is a hole to repair: the
/// checksum came from a view change's headers or from the hash chain.
///
/// Memory holds headers; a body stays only until it is applied and durable. After that the
/// shell's journal has it ([`Output::ReadPrepare`] brings it back to repair a peer), so a
/// group whose prepares carry whole batches keeps only its unapplied ops' bodies (at most
/// its journal window of them).
#[derive(Debug, Clone)]
struct Slot {
    op: u64,
    checksum: u128,
    /// The prepare's header, once known (the parent link lives here).
    header: Option<Header>,
    /// The whole prepare, while the replica needs it in memory: until applied and durable.
    message: Option<Message>,
    /// The shell reported the prepare and its redundant header synced. A durable prepare can
    /// be read back whether or not `message` still holds it.
    durable: bool,
    /// The op is on the canonical chain of this replica's view: it came from the current
    /// primary in the current view, or its checksum came from a StartView / merged log or from
    /// a verified successor's parent link. Only verified ops are applied, so a stale op left
    /// from an older view can never be applied as committed, even when it chains onto the
    /// committed prefix.
    verified: bool,
}

impl Slot {
    /// The replica can produce this prepare: in memory, or durable in its journal.
    fn held(&self) -> bool {
        self.message.is_some() || self.durable
    }

    /// Drop the body from memory once the op is applied (at or below `commit_min`) and the
    /// journal holds it durably: a peer that needs it gets it read back.
    fn release_if_applied(&mut self, commit_min: u64) {
        if self.durable && self.op <= commit_min {
            self.message = None;
        }
    }
}

/// A prepare the primary has sent and not yet committed.
#[derive(Debug, Clone)]
struct Prepared {
    op: u64,
    checksum: u128,
    /// Replicas (bit per index) whose durable acknowledgement arrived, this replica's own
    /// included.
    oks: u8,
}

/// One op of a view-change suffix: its header, or only its checksum (a hole whose checksum
/// the hash chain named, the header never having arrived).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Entry {
    Header(Header),
    Hole {
        op: u64,
        checksum: u128,
    },
    /// The sender knows nothing of this op: no slot, no checksum. It is there so the sender
    /// can nack the position and go on with verified records below.
    Unknown {
        op: u64,
    },
}

impl Entry {
    fn op(&self) -> u64 {
        match self {
            Entry::Header(header) => header.op,
            Entry::Hole { op, .. } | Entry::Unknown { op } => *op,
        }
    }

    /// The prepare's checksum; 0 when unknown.
    fn checksum(&self) -> u128 {
        match self {
            Entry::Header(header) => header.checksum,
            Entry::Hole { checksum, .. } => *checksum,
            Entry::Unknown { .. } => 0,
        }
    }
}

/// What a DoViewChange (or a StartView) said.
#[derive(Debug, Clone)]
struct DoViewChange {
    log_view: u32,
    op: u64,
    commit: u64,
    /// The suffix from `op` down, one entry per op. A StartView's entries are all headers.
    entries: Vec<Entry>,
    /// Per entry (same order): the sender provably never acknowledged that prepare. It
    /// lacks the body, the op is above its commit point, and its slot was not found faulty
    /// at recovery (a faulty slot may hide a prepare it did acknowledge: Iggy trap 15).
    /// Empty in a StartView.
    nacks: Vec<bool>,
}

pub struct Replica<S: StateMachine> {
    config: Config,
    status: Status,
    /// Invariant: `log_view <= view`. In status normal, `log_view == view`.
    view: u32,
    log_view: u32,
    /// The head: the highest op in the journal.
    /// Invariant: `commit_min <= op`; every op in `commit_min + 1 ..= op` has a slot.
    op: u64,
    /// The highest op applied to the state machine. Invariant: `commit_min <= commit_max`.
    commit_min: u64,
    /// The highest op known committed in the cluster.
    commit_max: u64,
    /// Checksum of the prepare at `commit_min` (the root's when it is 0).
    commit_min_checksum: u128,
    /// By slot (`op % shape.journal_slots`).
    journal: Vec<Option<Slot>>,
    /// Primary in status normal: uncommitted ops in order, `commit_max + 1 ..= op`.
    pipeline: VecDeque<Prepared>,
    state_machine: S,
    client_table: ClientTable<Message>,
    /// The durable state the shell last reported written. Messages of view `v` leave only
    /// when `durable.view >= v` (persist before send).
    durable: DurableState,
    /// A durable write is in flight; `durable_next` is written after it.
    durable_writing: bool,
    durable_next: Option<DurableState>,
    /// View change: replicas whose StartViewChange for `view` arrived (bit per index).
    svc_from: u8,
    /// View change: whether this replica's StartViewChange / DoViewChange for `view` left.
    svc_sent: bool,
    dvc_sent: bool,
    /// New primary: the DoViewChanges for `view`, by sender.
    dvcs: Vec<Option<DoViewChange>>,
    /// New primary: the canonical log was merged; it starts the view once holes are filled
    /// and `log_view` is durable.
    merged: bool,
    /// Primary: the head when its view started. Requests wait until everything up to it is
    /// applied: until then the client table may not yet know about requests and registers
    /// that committed in earlier views, and a request admitted now could run twice.
    view_start_op: u64,
    /// The head (op, checksum) of the log installed when `log_view` was last set: persisted
    /// with it, so a restart can tell the `log_view` log from stale slots. (0, 0) is the root.
    log_head: (u64, u128),
    /// The installed log below `log_head`, persisted with it (`DurableState::log_suffix`):
    /// checksums of ops `log_head − 1` down, as the install named them.
    log_suffix: Vec<u128>,
    /// Set while status is recovering.
    recovery: Option<Recovery>,
    /// Reads asked of the shell and not yet reported ([`Output::ReadPrepare`]), by op and
    /// the peer they are for (`None`: to apply it here). A repeated repair request for a
    /// prepare being read asks nothing more: reads are whole prepares, up to a batch each.
    reads_in_flight: std::collections::BTreeSet<(u64, Option<u8>)>,
    /// Recovery found its `log_view` log left behind by its own checkpoint: it must not vote
    /// with it, so it never falls back to an election and waits for a StartView.
    log_unsound: bool,
    /// Journal slots found faulty at recovery and not durably rewritten since. The op they
    /// held may have been acknowledged, so this replica never nacks it: `Some(op)` when the
    /// redundant header still names the op (an acknowledged prepare had its header synced
    /// with it), `None` when it does not, and then no op of that slot is nacked.
    faulty_slots: Vec<Option<FaultyOp>>,
    /// Log journal (`Shape::log_journal`): the end of the log as this replica has written
    /// it. Every op in `commit_min + 1 ..= log_end` was written, or is being written, in op
    /// order since the log was last cut, with the checksum `log_written` records; nothing
    /// above `log_end` is relied on. Unused by a ring journal.
    log_end: u64,
    /// Log journal: the checksum written at each op of `commit_min + 1 ..= log_end`.
    log_written: std::collections::BTreeMap<u64, u128>,
    /// Log journal: writes asked of the shell and not yet reported, in the order asked, as
    /// (op, checksum, live). A cut of the log marks the writes above it dead: their
    /// completion no longer makes the slot durable, since the shell discards those ops when
    /// it writes the op the log was cut to.
    log_writes: std::collections::VecDeque<(u64, u128, bool)>,
    /// The checkpoint slot (0 or 1) holding the checkpoint the durable state names.
    checkpoint_slot: u8,
    /// A checkpoint being written; one at a time, so the slot the durable state names is
    /// never overwritten.
    checkpoint_cycle: Option<CheckpointCycle>,
    /// The checkpoint cycle's bytes while not yet asked to be written: a log journal's
    /// checkpoint waits until the log is durable up to its op, since it stands for the log
    /// below it (a partition's manifest names its segments).
    checkpoint_unwritten: Option<Arc<[u8]>>,
    /// When `commit_min` last moved (or had nothing to catch up): a replica stuck below
    /// `commit_max` for [`STATE_TRANSFER_TIMEOUT_TICKS`] asks for state transfer.
    commit_progress_tick: u64,
    commit_progress_op: u64,
    state_transfer_tick: Option<u64>,
    /// Logical time: ticks since the replica started.
    ticks: u64,
    primary_heard_tick: u64,
    /// A backup behind its primary's commit point: the op and checksum of the primary's
    /// last committed op, asked for as the new head (its `Commit` named them). A backup whose
    /// primary went idle gets no prepare that would reveal its holes otherwise.
    wanted_head: Option<(u64, u128)>,
    heartbeat_sent_tick: u64,
    prepare_sent_tick: u64,
    view_change_started_tick: u64,
    view_change_sent_tick: u64,
    repair_sent_tick: u64,
    outbox: Vec<Output>,
}

impl<S: StateMachine> Replica<S> {
    /// A replica of a freshly formatted group: view 0, empty journal.
    pub fn new(config: Config, state_machine: S) -> Replica<S> {
        assert!(config.replica_count >= 1 && usize::from(config.replica_count) <= REPLICAS_MAX);
        assert!(config.replica < config.replica_count);
        if let Err(why) = config.shape.check() {
            panic!("group shape {:?} cannot run the protocol: {why}", config.shape);
        }
        let root = root_checksum(config.cluster);
        Replica {
            config,
            status: Status::Normal,
            view: 0,
            log_view: 0,
            op: 0,
            commit_min: 0,
            commit_max: 0,
            commit_min_checksum: root,
            journal: vec![None; config.shape.journal_slots],
            pipeline: VecDeque::new(),
            state_machine,
            client_table: ClientTable::new(config.shape.clients_max),
            durable: DurableState::formatted(config.cluster, config.replica, config.replica_count),
            durable_writing: false,
            durable_next: None,
            svc_from: 0,
            svc_sent: false,
            dvc_sent: false,
            dvcs: vec![None; usize::from(config.replica_count)],
            merged: false,
            view_start_op: 0,
            log_head: (0, 0),
            log_suffix: Vec::new(),
            recovery: None,
            reads_in_flight: std::collections::BTreeSet::new(),
            log_unsound: false,
            faulty_slots: vec![None; config.shape.journal_slots],
            checkpoint_slot: 1,
            log_end: 0,
            log_written: std::collections::BTreeMap::new(),
            log_writes: std::collections::VecDeque::new(),
            checkpoint_cycle: None,
            checkpoint_unwritten: None,
            commit_progress_tick: 0,
            commit_progress_op: 0,
            state_transfer_tick: None,
            ticks: 0,
            primary_heard_tick: 0,
            wanted_head: None,
            heartbeat_sent_tick: 0,
            prepare_sent_tick: 0,
            view_change_started_tick: 0,
            view_change_sent_tick: 0,
            repair_sent_tick: 0,
            outbox: Vec::new(),
        }
    }

    /// A replica restarted from what its storage holds (or from a wiped disk). It boots in
    /// status recovering: it probes for the current view with `recovered.nonce` and acts on
    /// nothing else until it installs a StartView it may trust (`docs/replication.md`,
    /// "Restart and a wiped disk"). Slots above the checkpoint are kept as unverified copies:
    /// a StartView's headers decide which belong to the log.
    pub fn recover(
        config: Config,
        state_machine: S,
        recovered: Recovered,
    ) -> Result<Replica<S>, RecoveryError> {
        assert_ne!(
            recovered.nonce, 0,
            "a recovery nonce is never 0 (0 means no probe)"
        );
        let mut replica = Replica::new(config, state_machine);
        let wiped = recovered.durable.is_none();
        if let Some(durable) = recovered.durable {
            if durable.cluster != config.cluster
                || durable.replica != config.replica
                || durable.replica_count != config.replica_count
            {
                return Err(RecoveryError::Foreign);
            }
            replica.view = durable.view;
            replica.log_view = durable.log_view;
            replica.commit_max = durable.commit_max;
            replica.durable = durable;
        }
        match (replica.durable.checkpoint_op, recovered.checkpoint) {
            (0, None) => {}
            (0, Some(_)) => return Err(RecoveryError::CheckpointUnexpected),
            (op, None) => return Err(RecoveryError::CheckpointMissing { op }),
            (op, Some((checkpoint, slot))) => {
                if checkpoint.op() != op {
                    return Err(RecoveryError::CheckpointOp {
                        found: checkpoint.op(),
                        expected: op,
                    });
                }
                replica.install_checkpoint_state(&checkpoint)?;
                replica.checkpoint_slot = slot;
            }
        }
        if !wiped && recovered.journal.len() != replica.config.shape.journal_slots {
            return Err(RecoveryError::JournalShape {
                found: recovered.journal.len(),
                expected: replica.config.shape.journal_slots,
            });
        }
        let checkpoint_op = replica.commit_min;
        let window_end = replica.journal_window_end();
        for (slot_index, state) in recovered.journal.into_iter().enumerate() {
            // Faulty slots are left out: a StartView's headers name what to repair. Clean ones
            // are copies by checksum, trusted only once the view's chain vouches for them. Ops
            // at or below the checkpoint stay only to answer peers' repair requests.
            let (header, prepare) = match state {
                SlotState::Clean(prepare) => (prepare.header, Some(prepare)),
                SlotState::Durable(header) => (header, None),
                SlotState::Empty | SlotState::Unfinished => continue,
                SlotState::Faulty { header } => {
                    replica.faulty_slots[slot_index] =
                        Some(header.map_or(FaultyOp::Any, |header| FaultyOp::Op(header.op)));
                    continue;
                }
            };
            let op = header.op;
            if op == 0 || op > window_end || op + replica.config.shape.journal_slots as u64 <= checkpoint_op {
                continue;
            }
            if op == checkpoint_op && header.checksum != replica.commit_min_checksum {
                continue;
            }
            let slot_index = replica.slot_index(op);
            replica.journal[slot_index] = Some(Slot {
                op,
                checksum: header.checksum,
                header: Some(header),
                // Applied already (the checkpoint covers it), or handed over as a header: read
                // back when needed.
                message: prepare.filter(|_| op > checkpoint_op),
                durable: true,
                verified: op == checkpoint_op,
            });
            replica.op = replica.op.max(op);
        }
        if wiped {
            // Everything this replica acknowledged before is gone: no slot may be nacked,
            // and it counts as repairing until each op of its log is durable again.
            replica.faulty_slots.fill(Some(FaultyOp::Any));
        } else {
            replica.log_head = (replica.durable.log_head_op, replica.durable.log_head_checksum);
            replica.log_suffix = replica.durable.log_suffix.clone();
            replica.rebuild_log_view_log();
        }
        replica.recover_log_end();
        replica.status = Status::Recovering;
        replica.recovery = Some(Recovery {
            nonce: recovered.nonce,
            boot_view: replica.view,
            wiped,
            probe_sent_tick: 0,
            probes_sent: 0,
            responses: [None; REPLICAS_MAX],
        });
        replica.commit_progress_op = replica.commit_min;
        replica.send_probes();
        replica.check_invariants();
        Ok(replica)
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// After a restart: decide which recovered slots belong to the `log_view` log, so this
    /// replica can vote with it. Every op of that log above the persisted log head was
    /// prepared in `log_view` (one primary per view), and the log at and below the head
    /// follows the hash chain down from the head's checksum. A slot above the head holding a
    /// prepare of an older view is stale (left on disk when a view change replaced it in
    /// memory): dropped. Ops the chain names but the disk lacks become holes with their
    /// checksum; what lies below a hole with no way to check it stays an unverified copy.
    fn rebuild_log_view_log(&mut self) {
        let (head_op, head_checksum) = self.log_head;
        let floor = self.commit_min;
        for index in 0..self.config.shape.journal_slots {
            let Some(slot) = self.journal[index].as_mut() else {
                continue;
            };
            if slot.op <= floor {
                continue;
            }
            let view = slot.header.map_or(0, |header| header.view);
            if self.config.bugs.recovery_ignores_log_head {
                slot.verified = true;
            } else if slot.op > head_op && view != self.log_view {
                self.journal[index] = None;
            } else if slot.op > head_op || (slot.op == head_op && slot.checksum == head_checksum) {
                slot.verified = true;
            }
        }
        let top = (floor + 1..=floor + self.config.shape.journal_slots as u64)
            .filter(|&op| self.slot(op).is_some_and(|slot| slot.verified))
            .max()
            .unwrap_or(floor)
            .max(head_op);
        self.op = top;
        if head_op > floor
            && self
                .slot(head_op)
                .is_none_or(|slot| slot.checksum != head_checksum)
        {
            self.set_hole(head_op, head_checksum, None);
        }
        // Below the head, the install named each op of its suffix: a copy that matches is that
        // log's; anything else there (a stale copy a view change replaced in memory only, or
        // nothing) is a hole with the named checksum. Without this, a hole low in the log
        // would leave everything below it unverified, and a view change whose nack cut lands
        // there could find no DoViewChange naming its head.
        if !self.config.bugs.recovery_ignores_log_head {
            for (index, &checksum) in self.log_suffix.clone().iter().enumerate() {
                let op = head_op - 1 - index as u64;
                if op <= floor {
                    break;
                }
                match self.slot_mut(op) {
                    Some(slot) if slot.checksum == checksum => slot.verified = true,
                    _ => self.set_hole(op, checksum, None),
                }
            }
        }
        let suffix_floor = head_op.saturating_sub(self.log_suffix.len() as u64);
        // Down the chain from the top: each verified header names its parent.
        let mut op = top;
        while op > floor + 1 {
            let parent = self
                .slot(op)
                .filter(|slot| slot.verified)
                .and_then(|slot| slot.header)
                .map(|header| header.parent);
            let below = op - 1;
            match parent {
                Some(parent) if self.slot(below).is_some_and(|slot| slot.checksum == parent) => {
                    if let Some(slot) = self.slot_mut(below) {
                        slot.verified = true;
                    }
                }
                Some(parent) => {
                    debug_assert!(
                        below < suffix_floor || below >= head_op,
                        "the chain below op {op} contradicts the persisted suffix at op {below}"
                    );
                    self.set_hole(below, parent, None);
                }
                None => {}
            }
            op = below;
        }
        if let Some(first) = self
            .slot(floor + 1)
            .filter(|slot| slot.verified)
            .and_then(|slot| slot.header)
            && first.parent != self.commit_min_checksum
        {
            // The checkpoint came by state transfer from a later view, whose committed chain
            // left this `log_view` log behind: nothing above the checkpoint is on it. The
            // replica keeps the slots as unverified copies and waits for a StartView.
            for op in floor + 1..=top {
                if let Some(slot) = self.slot_mut(op) {
                    slot.verified = false;
                }
            }
            self.log_unsound = true;
        }
    }

    /// Whether this replica may still lack durable copies of ops it once acknowledged: it is
    /// recovering, or a slot found faulty at recovery (or lost with a wiped disk) is not yet
    /// durably rewritten and may have held an op above its checkpoint. Such an op need not be
    /// in its log yet (a StartView older than the op reinstalls a shorter log). Until then it
    /// counts as faulty in a fault budget: another failure could destroy the last copy of a
    /// committed op.
    pub fn is_repairing(&self) -> bool {
        self.status == Status::Recovering || self.may_lack_acknowledged_op()
    }

    /// A slot found faulty at recovery (or lost with a wiped disk), not durably rewritten
    /// since, may have held an op above the checkpoint that this replica acknowledged.
    fn may_lack_acknowledged_op(&self) -> bool {
        self.faulty_slots.iter().flatten().any(|faulty| match faulty {
            FaultyOp::Op(op) => *op > self.durable.checkpoint_op,
            FaultyOp::Any => true,
        })
    }

    pub fn status(&self) -> Status {
        self.status
    }

    pub fn view(&self) -> u32 {
        self.view
    }

    pub fn log_view(&self) -> u32 {
        self.log_view
    }

    pub fn op(&self) -> u64 {
        self.op
    }

    pub fn commit_min(&self) -> u64 {
        self.commit_min
    }

    /// The op of the checkpoint being written, or else of the durable one: right after
    /// [`Replica::on_state_transferred`] installed one, the transferred checkpoint's op.
    pub fn durable_checkpoint_target(&self) -> u64 {
        self.checkpoint_cycle
            .map_or(self.durable.checkpoint_op, |cycle| cycle.op)
    }

    /// Log journal: the last op up to which the shell's log holds this replica's log as it
    /// stands, durably (every write up to it asked since the last cut, and completed). A
    /// backup catching up applies ops before its own writes of them complete, and its log
    /// may still hold a stale op there until they do: what it serves from its log must stay
    /// at or below this as well as its commit point. 0 while a log a state transfer brought
    /// waits to replace the shell's (`CheckpointCycle::replaces_log`): the live log is then
    /// the one being replaced.
    pub fn log_written_end(&self) -> u64 {
        if self.checkpoint_cycle.is_some_and(|cycle| cycle.replaces_log) {
            return 0;
        }
        let in_flight = self
            .log_writes
            .iter()
            .filter(|&&(_, _, live)| live)
            .map(|&(op, _, _)| op)
            .min();
        in_flight.map_or(self.log_end, |op| self.log_end.min(op - 1))
    }

    pub fn commit_max(&self) -> u64 {
        self.commit_max
    }

    pub fn durable(&self) -> &DurableState {
        &self.durable
    }

    pub fn state_machine(&self) -> &S {
        &self.state_machine
    }

    /// The state machine, for what it keeps beside its replicated state (a cache it can
    /// rebuild from committed ops, such as a partition's recent batches). Nothing done
    /// through it may change what `prepare`, `apply` or `snapshot` produce.
    pub fn state_machine_mut(&mut self) -> &mut S {
        &mut self.state_machine
    }

    pub fn is_primary(&self) -> bool {
        self.config.primary_of(self.view) == self.config.replica
    }

    /// The reply to `client`'s request `request` once it committed and applied here, as the
    /// client table holds it (replicated state: a backup has it too, so a request whose
    /// primary lost its view while the request waited learns its outcome when the new view
    /// commits it).
    pub fn committed_reply(&self, client: u128, request: u64) -> Option<&Message> {
        self.client_table
            .entry(client)
            .filter(|entry| entry.request == request)
            .map(|entry| &entry.reply)
    }

    /// The header this replica's log holds at op `op` (committed or not), if its journal
    /// still has the slot. In status normal a backup's log is its view's.
    pub fn log_header(&self, op: u64) -> Option<Header> {
        if op == 0 || op > self.op {
            return None;
        }
        self.slot(op).and_then(|slot| slot.header)
    }

    /// The header of committed op `op`, if this replica still holds it.
    pub fn committed_header(&self, op: u64) -> Option<Header> {
        if op == 0 || op > self.commit_min {
            return None;
        }
        self.slot(op).and_then(|slot| slot.header)
    }

    /// A one-line account of the replica's protocol state, for violation reports.
    pub fn describe(&self) -> String {
        let pipeline: Vec<String> = self
            .pipeline
            .iter()
            .map(|prepared| format!("{}:{:b}", prepared.op, prepared.oks))
            .collect();
        let holes: Vec<u64> = self.holes().iter().map(|(op, _)| *op).collect();
        let unverified: Vec<u64> = (self.commit_min + 1..=self.op)
            .filter(|&op| self.slot(op).is_some_and(|slot| !slot.verified))
            .collect();
        let undurable: Vec<u64> = (self.commit_min + 1..=self.op)
            .filter(|&op| self.slot(op).is_some_and(|slot| !slot.durable))
            .collect();
        let faulty: Vec<String> = self
            .faulty_slots
            .iter()
            .enumerate()
            .filter_map(|(index, faulty)| faulty.map(|faulty| format!("{index}:{faulty:?}")))
            .collect();
        format!(
            "r{} {:?} v{} lv{} dv{}/{}{} op{} c{}/{} cp{}{} pipeline {:?} holes {:?} unverified {:?} undurable {:?} faulty {:?}{}",
            self.config.replica,
            self.status,
            self.view,
            self.log_view,
            self.durable.view,
            self.durable.log_view,
            if self.durable_writing { " (writing)" } else { "" },
            self.op,
            self.commit_min,
            self.commit_max,
            self.durable.checkpoint_op,
            match self.checkpoint_cycle {
                Some(cycle) if cycle.written => format!(" (checkpoint {} written)", cycle.op),
                Some(cycle) if self.checkpoint_unwritten.is_some() => format!(
                    " (checkpoint {} waiting for the log, written to op {}, writes {:?})",
                    cycle.op, self.log_end, self.log_writes
                ),
                Some(cycle) => format!(" (checkpoint {} writing)", cycle.op),
                None => String::new(),
            },
            pipeline,
            holes,
            unverified,
            undurable,
            faulty,
            if self.log_unsound { " log unsound" } else { "" }
        )
    }

    /// Everything the replica asked for since the last call, in order.
    pub fn take_outputs(&mut self) -> Vec<Output> {
        std::mem::take(&mut self.outbox)
    }

    /// One tick of logical time.
    pub fn on_tick(&mut self) {
        self.ticks += 1;
        self.check_commit_progress();
        match self.status {
            Status::Normal if self.is_primary() => {
                if self.ticks - self.heartbeat_sent_tick >= COMMIT_INTERVAL_TICKS {
                    self.send_commit_heartbeat();
                }
                if !self.pipeline.is_empty() && self.ticks - self.prepare_sent_tick >= PREPARE_TIMEOUT_TICKS {
                    self.retransmit_prepares();
                }
            }
            Status::Normal => {
                if self.ticks - self.primary_heard_tick >= NORMAL_TIMEOUT_TICKS + self.timeout_jitter(0) {
                    self.start_view_change(self.view + 1);
                } else if self.ticks - self.repair_sent_tick >= VIEW_CHANGE_RETRY_TICKS {
                    self.request_repairs();
                }
            }
            Status::Recovering => {
                let Some(recovery) = self.recovery else {
                    unreachable!("status recovering without a recovery");
                };
                let log_sound = !self.may_lack_acknowledged_op() && !self.log_unsound;
                if !recovery.wiped && log_sound && recovery.probes_sent >= PROBE_ATTEMPTS_MAX {
                    // No primary answered: the whole cluster restarted (everyone is
                    // recovering, and recovering replicas install nothing from each other), or
                    // no view is formed. Like a backup whose primary went quiet, it starts a
                    // view change. Its durable log holds everything it ever acknowledged,
                    // rebuilt against the persisted log head, so it may vote with it; but only
                    // with no faulty slot that may hide an acknowledged op, or its log could
                    // lack a committed op.
                    self.recovery = None;
                    self.start_view_change(self.view + 1);
                } else if self.ticks - recovery.probe_sent_tick >= PROBE_INTERVAL_TICKS {
                    self.send_probes();
                }
            }
            Status::ViewChange => {
                if self.ticks - self.view_change_started_tick
                    >= VIEW_CHANGE_TIMEOUT_TICKS + self.timeout_jitter(1)
                {
                    self.start_view_change(self.view + 1);
                } else if self.ticks - self.view_change_sent_tick >= VIEW_CHANGE_RETRY_TICKS {
                    // Lost messages: say it again.
                    self.svc_sent = false;
                    self.dvc_sent = false;
                    self.view_change_sent_tick = self.ticks;
                    self.request_repairs();
                }
            }
        }
        self.progress();
    }

    /// A message from the network (any sender; the replica filters). It is handed over: a
    /// request's body becomes its prepare's without a copy when nothing else holds it.
    pub fn on_message(&mut self, message: Message) {
        let header = &message.header;
        if header.cluster != self.config.cluster || header.group != self.config.group {
            return;
        }
        if header.size as usize > self.config.shape.message_size_max {
            // Larger than any message of this group: no replica of it sends one.
            return;
        }
        let from_replica = header.command != Command::Request;
        if from_replica && header.replica >= self.config.replica_count {
            return;
        }
        // A prepare names the replica that prepared it, which may be this one in an older
        // view (a new primary resends it); every other message names its sender.
        if from_replica && header.command != Command::Prepare && header.replica == self.config.replica {
            return;
        }
        match header.command {
            Command::Request => self.on_request(message),
            Command::Prepare => self.on_prepare(&message),
            Command::PrepareOk => self.on_prepare_ok(header),
            Command::Commit => self.on_commit(header),
            Command::StartViewChange => self.on_start_view_change(header),
            Command::DoViewChange => self.on_do_view_change(&message),
            Command::StartView => self.on_start_view(&message),
            Command::RequestStartView => self.on_request_start_view(header),
            Command::RecoveryResponse => self.on_recovery_response(header),
            Command::RequestPrepare => self.on_request_prepare(header),
            _ => {}
        }
        self.progress();
    }

    /// The shell read prepare `op` back from the journal, as [`Output::ReadPrepare`] asked:
    /// the prepare, or `None` when the bytes there did not verify as the prepare with
    /// `checksum`. A prepare the replica still holds durable with that checksum and that the
    /// journal cannot produce is damage: the slot becomes a hole (repaired from a peer if the
    /// op is not applied yet) and, since it may have been acknowledged, is never nacked
    /// until it is rewritten. A read of a slot replaced since is ignored.
    pub fn on_prepare_read(
        &mut self,
        op: u64,
        checksum: u128,
        prepare: Option<Message>,
        for_replica: Option<u8>,
    ) {
        self.reads_in_flight.remove(&(op, for_replica));
        let (cluster, group) = (self.config.cluster, self.config.group);
        let commit_min = self.commit_min;
        let checkpoint_op = self.durable.checkpoint_op;
        let index = self.slot_index(op);
        let Some(slot) = self
            .slot_mut(op)
            .filter(|slot| slot.checksum == checksum && slot.durable)
        else {
            self.progress();
            return;
        };
        let prepare = prepare.filter(|prepare| {
            let header = &prepare.header;
            header.command == Command::Prepare
                && header.op == op
                && header.checksum == checksum
                && header.cluster == cluster
                && header.group == group
        });
        match (prepare, for_replica) {
            (Some(prepare), Some(replica)) => {
                if replica != self.config.replica && replica < self.config.replica_count {
                    self.send(Destination::Replica(replica), prepare);
                }
            }
            (Some(prepare), None) => {
                if op > commit_min && slot.message.is_none() {
                    slot.message = Some(prepare);
                }
            }
            (None, _) => {
                slot.message = None;
                slot.durable = false;
                if op > checkpoint_op {
                    // It may have been acknowledged, and no checkpoint covers it yet: until
                    // it is rewritten (or a checkpoint passes it) this replica counts as
                    // repairing, and never nacks it.
                    self.faulty_slots[index] = Some(FaultyOp::Op(op));
                }
                if self.config.shape.log_journal && op > commit_min {
                    // The log is damaged at `op`: cut there, so the repaired prepare and
                    // everything above it are written again in order. Damage to an applied op
                    // cannot be cut away: a partition repairs that by segment transfer.
                    self.cut_log(op);
                }
            }
        }
        self.progress();
    }

    /// The shell wrote and synced the prepare `op` with checksum `checksum`.
    pub fn on_prepare_written(&mut self, op: u64, checksum: u128) {
        if self.config.shape.log_journal {
            // The shell reports writes in the order asked, so this is the first one asked with
            // this op and checksum: the dead one, if the same prepare was cut and written again
            // (its completion then says nothing of the live one).
            let Some(position) = self
                .log_writes
                .iter()
                .position(|&(written_op, written_checksum, _)| {
                    (written_op, written_checksum) == (op, checksum)
                })
            else {
                return;
            };
            let (_, _, live) = self.log_writes[position];
            // Dead writes asked before it were reported already or never will be: forget them.
            let mut index = 0;
            self.log_writes.retain(|&(_, _, other_live)| {
                let keep = index > position || (other_live && index < position);
                index += 1;
                keep
            });
            if !live {
                // Cut from the log since it was asked: the shell discards it.
                return;
            }
        }
        let commit_min = self.commit_min;
        let Some(slot) = self.slot_mut(op) else {
            return;
        };
        if slot.checksum != checksum || !slot.held() {
            // The slot was replaced since (a view change, or a later lap): stale completion.
            return;
        }
        slot.durable = true;
        // Applied before its own write was durable (a backup catching up): memory is done
        // with it.
        slot.release_if_applied(commit_min);
        let index = self.slot_index(op);
        self.faulty_slots[index] = None;
        if self.status == Status::Normal {
            if self.is_primary() {
                let replica = self.config.replica;
                self.record_ok(replica, op, checksum);
            } else {
                self.send_prepare_ok(op, checksum);
            }
        }
        self.progress();
    }

    /// The shell wrote `state` to every superblock copy.
    pub fn on_durable_written(&mut self, state: DurableState) {
        assert!(
            self.durable_writing,
            "a durable write completed that was not asked for"
        );
        assert!(state.view >= self.durable.view && state.log_view >= self.durable.log_view);
        assert!(state.checkpoint_op >= self.durable.checkpoint_op);
        if let Some(cycle) = self.checkpoint_cycle
            && cycle.written
            && state.checkpoint_op == cycle.op
        {
            assert_eq!(state.checkpoint_checksum, cycle.checksum);
            // The durable state names the new checkpoint: journal slots at or below it may be
            // reused, and the other slot is the one the next checkpoint goes to.
            self.checkpoint_slot = cycle.slot;
            self.checkpoint_cycle = None;
        }
        self.durable = state;
        self.durable_writing = false;
        if let Some(next) = self.durable_next.take()
            && next != self.durable
        {
            self.write_durable(next);
        }
        self.progress();
    }

    /// The shell wrote and synced the checkpoint at `op` with checksum `checksum`.
    pub fn on_checkpoint_written(&mut self, op: u64, checksum: u128) {
        let Some(cycle) = self.checkpoint_cycle.as_mut() else {
            return;
        };
        if cycle.op != op || cycle.checksum != checksum || cycle.written {
            return;
        }
        cycle.written = true;
        self.want_durable();
        self.progress();
    }

    /// The shell fetched a peer's checkpoint (state transfer): `bytes` with the checksum the
    /// peer's durable state names, and for a log journal what it did with its log (a ring
    /// journal ignores `log`). It is installed only if it is above what this replica applied;
    /// everything it replaces was committed, so nothing is lost. Bytes that do not verify
    /// are ignored (the replica asks again later). Returns whether it was installed: if not,
    /// the shell discards a log it staged for it, before it writes any durable state.
    pub fn on_state_transferred(&mut self, bytes: &[u8], checksum: u128, log: TransferredLog) -> bool {
        let Ok(checkpoint) = Checkpoint::decode(
            bytes,
            self.config.shape.checkpoint_size_max(),
            checksum,
            self.config.cluster,
            self.config.group,
        ) else {
            return false;
        };
        if checkpoint.op() <= self.commit_min || self.checkpoint_cycle.is_some() {
            return false;
        }
        if self.status == Status::Normal && self.is_primary() {
            // A primary in normal status applied everything it committed; it never needs this.
            return false;
        }
        let before = self.commit_min;
        if self.install_checkpoint_state(&checkpoint).is_err() {
            return false;
        }
        debug_assert!(self.commit_min > before);
        let replaces_log = self.config.shape.log_journal && log == TransferredLog::Replaced;
        if replaces_log {
            // The shell installs the transferred log, which ends exactly at the checkpoint (a
            // partition receives the segments), in place of its own: nothing it wrote before
            // counts any more, and what lies above the checkpoint is written again in order,
            // into the new log, once the durable state names the checkpoint.
            self.cut_log(self.commit_min + 1);
            for write in self.log_writes.iter_mut() {
                write.2 = false;
            }
        } else if self.config.shape.log_journal {
            // The shell's log holds the checkpoint's op durably (perhaps among writes this
            // replica already counted as cut: a cut reaches the shell with the next write),
            // so it ends at or above it, and what it holds above is judged as always.
            self.log_end = self.log_end.max(self.commit_min);
        }
        // Slots at or below the new checkpoint hold ops this replica never needs again.
        for slot in self.journal.iter_mut() {
            if slot.as_ref().is_some_and(|slot| slot.op < checkpoint.op()) {
                *slot = None;
            }
        }
        self.commit_progress_op = self.commit_min;
        self.commit_progress_tick = self.ticks;
        self.state_transfer_tick = None;
        // Persist it like a checkpoint of its own: the slot first, then the durable state.
        let (bytes, checksum_written) = checkpoint.encode(self.config.shape.checkpoint_size_max());
        debug_assert_eq!(checksum_written, checksum);
        self.start_checkpoint_cycle(checkpoint.op(), checksum, Arc::from(bytes), replaces_log);
        self.progress();
        true
    }

    // ----- checkpoints and state transfer -----

    /// Make the replica's replicated state the checkpoint's: state machine, client table, and
    /// the commit point with the checksum the next op must name as its parent.
    fn install_checkpoint_state(&mut self, checkpoint: &Checkpoint) -> Result<(), RecoveryError> {
        if checkpoint.state_machine.len() > STATE_MACHINE_SNAPSHOT_MAX {
            return Err(RecoveryError::StateMachine(
                "snapshot larger than the limit".to_string(),
            ));
        }
        let client_table = ClientTable::decode(&checkpoint.client_table, self.config.shape.clients_max)
            .map_err(RecoveryError::ClientTable)?;
        self.state_machine
            .restore(&checkpoint.state_machine)
            .map_err(RecoveryError::StateMachine)?;
        self.client_table = client_table;
        let header = checkpoint.header;
        self.commit_min = header.op;
        self.commit_min_checksum = header.checksum;
        self.commit_max = self.commit_max.max(header.op);
        self.op = self.op.max(header.op);
        // Applied now (the checkpoint covers them): read back if a peer asks.
        for slot in self.journal.iter_mut().flatten() {
            slot.release_if_applied(header.op);
        }
        let keep = self
            .slot(header.op)
            .is_some_and(|slot| slot.checksum == header.checksum && slot.held());
        if !keep {
            // The anchor of the chain above: its header, for view changes and the chain walk.
            self.set_hole(header.op, header.checksum, Some(header));
        }
        Ok(())
    }

    /// After applying op `commit_min`: checkpoint once it is an interval past the durable one.
    fn maybe_checkpoint(&mut self) {
        if self.checkpoint_cycle.is_some()
            || self.commit_min < self.durable.checkpoint_op + self.config.shape.checkpoint_interval_ops
        {
            return;
        }
        self.checkpoint_commit_min();
    }

    /// Checkpoint at the last applied op now, without waiting for the interval: the shell's
    /// upkeep (a partition releases the segments of its log below its checkpoint). Nothing
    /// happens unless the replica is normal, no checkpoint is being written, and an op was
    /// applied since the durable checkpoint. The checkpoint is this replica's own, as the
    /// interval ones are: other replicas checkpoint where they will.
    pub fn checkpoint_now(&mut self) {
        if self.status != Status::Normal
            || self.checkpoint_cycle.is_some()
            || self.commit_min <= self.durable.checkpoint_op
        {
            return;
        }
        self.checkpoint_commit_min();
    }

    fn checkpoint_commit_min(&mut self) {
        let Some(header) = self.slot(self.commit_min).and_then(|slot| slot.header) else {
            return;
        };
        debug_assert_eq!(header.checksum, self.commit_min_checksum);
        let checkpoint = Checkpoint {
            header,
            state_machine: self.state_machine.snapshot(),
            client_table: self.client_table.encode(),
        };
        assert!(checkpoint.state_machine.len() <= STATE_MACHINE_SNAPSHOT_MAX);
        let (bytes, checksum) = checkpoint.encode(self.config.shape.checkpoint_size_max());
        self.start_checkpoint_cycle(header.op, checksum, Arc::from(bytes), false);
    }

    /// `replaces_log`: see [`CheckpointCycle::replaces_log`].
    fn start_checkpoint_cycle(&mut self, op: u64, checksum: u128, bytes: Arc<[u8]>, replaces_log: bool) {
        assert!(self.checkpoint_cycle.is_none(), "one checkpoint write at a time");
        assert!(op > self.durable.checkpoint_op);
        let slot = 1 - self.checkpoint_slot;
        self.checkpoint_cycle = Some(CheckpointCycle {
            op,
            checksum,
            slot,
            written: false,
            replaces_log,
        });
        self.checkpoint_unwritten = Some(bytes);
        self.write_checkpoint_when_ready();
    }

    /// Ask for the checkpoint cycle's write: at once with a ring journal; with a log
    /// journal once the log holds every op up to it durably (after a state transfer it
    /// does at once: the installed log ends at the checkpoint, and every earlier write is
    /// dead).
    fn write_checkpoint_when_ready(&mut self) {
        let Some(cycle) = self.checkpoint_cycle else {
            return;
        };
        let log_durable = self.log_end >= cycle.op
            && !self
                .log_writes
                .iter()
                .any(|&(op, _, live)| live && op <= cycle.op);
        if self.config.shape.log_journal && !log_durable {
            return;
        }
        let Some(bytes) = self.checkpoint_unwritten.take() else {
            return;
        };
        self.outbox.push(Output::WriteCheckpoint {
            slot: cycle.slot,
            op: cycle.op,
            checksum: cycle.checksum,
            bytes,
        });
    }

    /// A replica whose commit point has not moved for [`STATE_TRANSFER_TIMEOUT_TICKS`] while
    /// ops it knows are committed wait asks for state transfer: the prepares it needs may be
    /// gone from every peer's journal.
    fn check_commit_progress(&mut self) {
        if self.commit_min != self.commit_progress_op || self.commit_min >= self.commit_max {
            self.commit_progress_op = self.commit_min;
            self.commit_progress_tick = self.ticks;
            return;
        }
        if self.ticks - self.commit_progress_tick >= STATE_TRANSFER_TIMEOUT_TICKS {
            self.request_state_transfer();
        }
    }

    fn request_state_transfer(&mut self) {
        if self.checkpoint_cycle.is_some() || (self.status == Status::Normal && self.is_primary()) {
            return;
        }
        if self
            .state_transfer_tick
            .is_some_and(|tick| self.ticks - tick < STATE_TRANSFER_TIMEOUT_TICKS)
        {
            return;
        }
        self.state_transfer_tick = Some(self.ticks);
        self.outbox.push(Output::StateTransfer {
            above_op: self.commit_min,
            commit_max: self.commit_max,
        });
    }

    /// Ticks added to a timeout (`which`: 0 normal, 1 view change) for this group, replica
    /// and view: see [`TIMEOUT_JITTER_TICKS_MAX`]. A hash, not a random draw, so the replica
    /// stays deterministic and needs no randomness from its shell.
    fn timeout_jitter(&self, which: u8) -> u64 {
        let mut bytes = [0u8; 16 + 8 + 1 + 4 + 1];
        bytes[..16].copy_from_slice(&self.config.cluster.to_le_bytes());
        bytes[16..24].copy_from_slice(&self.config.group.to_le_bytes());
        bytes[24] = self.config.replica;
        bytes[25..29].copy_from_slice(&self.view.to_le_bytes());
        bytes[29] = which;
        xxhash_rust::xxh3::xxh3_64(&bytes) % (TIMEOUT_JITTER_TICKS_MAX + 1)
    }

    /// The highest op this replica may write to its journal: a slot is reused only once the
    /// op it held is below the durable checkpoint. The checkpoint's own slot is kept: its
    /// header anchors the chain above (view-change suffixes, the chain walk).
    fn journal_window_end(&self) -> u64 {
        self.durable.checkpoint_op + self.config.shape.journal_slots as u64 - 1
    }

    // ----- normal operation -----

    fn on_request(&mut self, message: Message) {
        if self.status != Status::Normal || !self.is_primary() {
            return;
        }
        if self.commit_min < self.view_start_op {
            // The client retries once the previous views' ops are committed here.
            return;
        }
        let header = message.header;
        let session = header.context as u64;
        let admission = if header.operation == OPERATION_REGISTER {
            self.client_table.admit_register(header.client)
        } else {
            self.client_table.admit(header.client, session, header.request)
        };
        {
            match admission {
                Admission::Execute => {}
                Admission::ReplyCached(reply) => {
                    self.send(Destination::Client(header.client), reply);
                    return;
                }
                Admission::Drop => return,
                Admission::NotRegistered if session > self.commit_min => {
                    // The session's register lies beyond what this replica applied: it is
                    // behind (an old primary cut off from the cluster), not the client. Say
                    // nothing rather than tell the client its live session is gone.
                    return;
                }
                Admission::SessionEvicted | Admission::NotRegistered => {
                    self.send_session_evicted(&header);
                    return;
                }
            }
        }
        // At most one request per client in the pipeline: a retry waits for its commit, and a
        // register can never overtake a request of the client's previous session.
        let in_pipeline = self.pipeline.iter().any(|prepared| {
            self.slot(prepared.op)
                .and_then(|slot| slot.header)
                .is_some_and(|prepare| prepare.client == header.client)
        });
        if in_pipeline
            || self.pipeline.len() >= self.config.shape.pipeline_prepares_max
            || self.op + 1 > self.journal_window_end()
        {
            // The reply follows the commit; or the client retries once there is room (in the
            // pipeline, or in the journal once the next checkpoint is durable).
            return;
        }
        let mut prepare = Header::new(Command::Prepare, self.config.cluster);
        prepare.group = self.config.group;
        prepare.replica = self.config.replica;
        prepare.view = self.view;
        prepare.op = self.op + 1;
        prepare.commit = self.commit_max;
        prepare.timestamp = self.ticks;
        prepare.parent = self.head_checksum();
        prepare.client = header.client;
        prepare.request = header.request;
        prepare.operation = header.operation;
        prepare.context = header.context;
        let cursor = if self.config.bugs.prepare_from_commit_point {
            self.cursor_after(self.commit_max)
        } else {
            self.cursor_after(self.op)
        };
        let body = if header.operation == OPERATION_REGISTER {
            prepare.cursor = cursor;
            message.body
        } else {
            let (body, cursor_after) = self.state_machine.prepare(
                prepare.op,
                prepare.timestamp,
                prepare.operation,
                message.body,
                cursor,
            );
            assert!(
                HEADER_SIZE + body.len() <= self.config.shape.message_size_max,
                "the state machine prepared {} bytes for op {}, more than a message of the group",
                body.len(),
                prepare.op
            );
            prepare.cursor = cursor_after;
            body
        };
        let checksum_body = self.state_machine.body_checksum(prepare.operation, &body);
        let prepare = Message::with_body_checksum(prepare, body, checksum_body);
        self.append(prepare.clone());
        self.pipeline.push_back(Prepared {
            op: prepare.header.op,
            checksum: prepare.header.checksum,
            oks: 0,
        });
        self.broadcast(&prepare);
        self.prepare_sent_tick = self.ticks;
    }

    fn on_prepare(&mut self, message: &Message) {
        let header = &message.header;
        // A prepare this replica is waiting for (a hole from a view change or the hash chain)
        // is taken from anyone, whatever view it was prepared in: its checksum is known.
        if header.op > self.commit_min
            && self
                .slot(header.op)
                .is_some_and(|slot| !slot.held() && slot.checksum == header.checksum)
        {
            self.fill(message.clone());
            return;
        }
        if header.view > self.view {
            if header.replica == self.config.primary_of(header.view) {
                // A primary of a view this replica missed: ask it for its StartView.
                self.send_request_start_view(header.replica);
            }
            return;
        }
        if self.status != Status::Normal || self.is_primary() {
            return;
        }
        if self.wanted_head == Some((header.op, header.checksum)) {
            self.wanted_head = None;
            if header.op > self.op && header.op <= self.journal_window_end() {
                // The primary's committed op its heartbeat named: on this view's chain,
                // whatever view it was prepared in.
                self.jump_to(message.clone());
                return;
            }
        }
        let from_primary = header.view == self.view && header.replica == self.config.primary_of(self.view);
        if from_primary {
            self.primary_heard_tick = self.ticks;
        }
        let ours = self
            .slot(header.op)
            .map(|slot| (slot.checksum, slot.durable, slot.verified));
        match ours {
            Some((checksum, durable, verified)) if checksum == header.checksum => {
                // A retransmission (the primary may have lost the acknowledgement), or an op
                // of an older view the new primary proposes again: acknowledged by checksum.
                // One its durable checkpoint covers is acknowledged whatever became of the
                // journal's copy (as below, where the slot is gone).
                if (durable && verified) || header.op <= self.durable.checkpoint_op {
                    self.send_prepare_ok(header.op, header.checksum);
                }
            }
            _ if header.op <= self.durable.checkpoint_op => {
                // Committed, applied and covered by this replica's durable checkpoint (it may
                // have come by state transfer, so the slot is gone). The primary's log holds
                // every committed op as committed, so its pipeline entry here can only be that
                // op, and an acknowledgement of any other checksum matches nothing there.
                // Without it, a primary that learned of the commit late (a re-proposed op of an
                // older view) would wait for a quorum forever.
                self.send_prepare_ok(header.op, header.checksum);
            }
            _ if !from_primary || header.op <= self.commit_min => {}
            _ if header.op > self.journal_window_end() => {
                // Beyond the journal: its slot still holds an op above the durable checkpoint.
                // The primary sends it again; by then this replica has caught up by repair and
                // checkpointed, or asked for state transfer.
            }
            _ if header.op == self.op + 1 && header.parent == self.head_checksum() => {
                self.append(message.clone());
            }
            _ if header.op > self.op => {
                // Beyond a hole (this replica fell behind): take the op as the new head and
                // repair down the chain to what it has.
                self.jump_to(message.clone());
            }
            _ => {
                // This replica's op there is not on this view's chain: replace it.
                self.place(message.clone());
            }
        }
        if from_primary {
            self.advance_commit_max(header.commit);
        }
    }

    /// Take `prepare`, from the current primary in the current view, as the head although the
    /// ops between are missing here: they become holes the chain walk names.
    fn jump_to(&mut self, prepare: Message) {
        let header = prepare.header;
        assert!(header.op > self.op);
        for op in self.op + 1..header.op {
            let slot = self.slot_index(op);
            if self.journal[slot].as_ref().is_some_and(|s| s.op != op) {
                // An older lap's op; it was applied long ago (the journal spans the pipeline).
                self.journal[slot] = None;
            }
        }
        self.op = header.op;
        self.place(prepare);
    }

    /// Put a verified prepare in its slot (replacing whatever was there), write it, and walk
    /// the chain below it.
    fn place(&mut self, prepare: Message) {
        let op = prepare.header.op;
        assert!(op > self.commit_min && op <= self.op);
        self.store(prepare);
        self.link_chain_below(op);
    }

    /// Put a prepare known to be on this view's chain in its slot, replacing whatever was
    /// there, and ask for its write.
    fn store(&mut self, prepare: Message) {
        let header = prepare.header;
        assert!(
            header.op <= self.journal_window_end(),
            "writing op {} would overwrite an op above the durable checkpoint {}",
            header.op,
            self.durable.checkpoint_op
        );
        let index = self.slot_index(header.op);
        self.journal[index] = Some(Slot {
            op: header.op,
            checksum: header.checksum,
            header: Some(header),
            message: Some(prepare.clone()),
            durable: false,
            verified: true,
        });
        if !self.config.shape.log_journal {
            self.outbox.push(Output::WritePrepare { message: prepare });
        }
    }

    fn on_prepare_ok(&mut self, header: &Header) {
        if self.status != Status::Normal || !self.is_primary() || header.view != self.view {
            return;
        }
        self.record_ok(header.replica, header.op, header.context);
    }

    fn on_commit(&mut self, header: &Header) {
        if header.view > self.view && header.replica == self.config.primary_of(header.view) {
            self.send_request_start_view(header.replica);
            return;
        }
        if self.status == Status::ViewChange
            && header.view == self.view
            && header.replica == self.config.primary_of(self.view)
        {
            // The view this replica is electing started without it (its StartView was lost):
            // the view's primary heartbeats in it. Ask for the StartView instead of timing
            // out into the next view, which would pull the whole group into another change.
            self.send_request_start_view(header.replica);
            return;
        }
        if self.status != Status::Normal || self.is_primary() || header.view != self.view {
            return;
        }
        if header.replica != self.config.primary_of(self.view) {
            return;
        }
        self.primary_heard_tick = self.ticks;
        self.advance_commit_max(header.commit);
        if header.commit > self.op && header.commit <= self.journal_window_end() && header.context != 0 {
            // Behind, and no prepare is coming that would show how far: ask the primary for
            // its last committed op (the heartbeat names its checksum), take it as the head,
            // and repair down the chain to this replica's log.
            self.wanted_head = Some((header.commit, header.context));
            let primary = header.replica;
            let mut request = self.control(Command::RequestPrepare).header;
            request.op = header.commit;
            request.context = header.context;
            self.send(Destination::Replica(primary), Message::new(request, Bytes::new()));
        }
    }

    /// Put `prepare` at the head of the journal and ask for its write.
    fn append(&mut self, prepare: Message) {
        let header = prepare.header;
        assert_eq!(header.op, self.op + 1, "the journal grows by one op at a time");
        assert_eq!(header.parent, self.head_checksum(), "the hash chain is unbroken");
        self.op = header.op;
        self.store(prepare);
    }

    /// A repaired prepare fills its hole; its parent link may reveal the next hole down.
    fn fill(&mut self, prepare: Message) {
        let header = prepare.header;
        assert!(header.op <= self.journal_window_end());
        let slot = self.slot_mut(header.op).expect("a hole to fill");
        debug_assert_eq!(slot.checksum, header.checksum);
        slot.header = Some(header);
        slot.message = Some(prepare.clone());
        slot.durable = false;
        slot.verified = true;
        if !self.config.shape.log_journal {
            self.outbox.push(Output::WritePrepare { message: prepare });
        }
        self.link_chain_below(header.op);
    }

    fn record_ok(&mut self, replica: u8, op: u64, checksum: u128) {
        if let Some(prepared) = self.pipeline.iter_mut().find(|prepared| prepared.op == op)
            && prepared.checksum == checksum
        {
            prepared.oks |= 1 << replica;
        }
    }

    /// Commit the pipeline's front while it has a quorum of durable acknowledgements.
    fn commit_pipeline(&mut self) {
        let quorum = if self.config.bugs.commit_without_quorum {
            1
        } else {
            self.config.quorum()
        };
        while let Some(front) = self.pipeline.front() {
            if (front.oks.count_ones() as usize) < quorum {
                break;
            }
            let op = front.op;
            self.pipeline.pop_front();
            self.commit_max = self.commit_max.max(op);
        }
    }

    fn advance_commit_max(&mut self, commit: u64) {
        self.commit_max = self.commit_max.max(commit);
    }

    /// Apply every op up to `commit_max` that the journal holds, in order, on the chain.
    fn commit_journal(&mut self) {
        while self.commit_min < self.commit_max && self.commit_min < self.op {
            let op = self.commit_min + 1;
            let Some(slot) = self.slot(op).filter(|slot| slot.verified) else {
                break;
            };
            let Some(prepare) = slot.message.clone() else {
                if slot.durable {
                    // In the journal, not in memory (recovered as a header): read it back.
                    let checksum = slot.checksum;
                    self.read_prepare(op, checksum, None);
                }
                break;
            };
            if prepare.header.parent != self.commit_min_checksum {
                // This op is not on the committed chain (a stale uncommitted op a view change
                // will replace); never apply it.
                break;
            }
            if self.config.shape.log_journal
                && self
                    .log_written
                    .get(&op)
                    .is_some_and(|&written| written != prepare.header.checksum)
            {
                // Replaced since it was written (a StartView in this same input): the log holds
                // the old prepare there. Cut before the op is applied, or `write_log` would see
                // the mismatch only below the commit point, where no cut may go, and the applied
                // prepare would never reach the log.
                self.cut_log(op);
            }
            self.apply(&prepare);
            self.commit_min = op;
            self.commit_min_checksum = prepare.header.checksum;
            self.slot_mut(op)
                .expect("the op just applied")
                .release_if_applied(op);
            self.maybe_checkpoint();
        }
    }

    /// Apply a committed prepare: the state machine or the client table, then the reply.
    fn apply(&mut self, prepare: &Message) {
        let header = &prepare.header;
        let session = header.context as u64;
        let reply_body = if header.operation == OPERATION_REGISTER {
            Vec::new()
        } else {
            self.state_machine
                .apply(header.op, header.timestamp, header.operation, &prepare.body)
        };
        // Replies carry outcomes, never data: the client table stores one per client in every
        // checkpoint. A larger one is a state machine bug, the same on every replica.
        assert!(
            HEADER_SIZE + reply_body.len() <= REPLY_SIZE_MAX,
            "op {} operation {} replied {} bytes, more than a stored reply may take",
            header.op,
            header.operation,
            reply_body.len()
        );
        let mut reply = self.reply_header(header.client, header.request, header.operation, header.checksum);
        reply.op = header.op;
        reply.commit = header.op;
        reply.timestamp = header.timestamp;
        let reply = Message::new(reply, Bytes::from(reply_body));
        if header.operation == OPERATION_REGISTER {
            // The session is the op the register committed at.
            self.client_table
                .commit_register(header.client, header.op, reply.clone());
        } else {
            self.client_table.commit_request(
                header.client,
                session,
                header.request,
                header.op,
                reply.clone(),
            );
        }
        if self.is_primary() && self.status == Status::Normal {
            self.send(Destination::Client(header.client), reply);
        }
    }

    // ----- view change -----

    /// A backup in status normal starts a view change to the next view it is the primary
    /// of (the shell moves a group's primary to where its clients are). As safe as any view
    /// change: the new view's log holds every committed op. Returns whether it started one.
    pub fn lead(&mut self) -> bool {
        if self.status != Status::Normal || self.is_primary() {
            return false;
        }
        let count = u32::from(self.config.replica_count);
        let replica = u32::from(self.config.replica);
        let current = self.view % count;
        let ahead = (replica + count - current) % count;
        let Some(view) = self.view.checked_add(ahead) else {
            return false;
        };
        debug_assert_eq!(self.config.primary_of(view), self.config.replica);
        self.start_view_change(view);
        self.progress();
        true
    }

    /// Move to view `view` in status view-change and persist it; StartViewChange leaves once
    /// the view is durable.
    fn start_view_change(&mut self, view: u32) {
        assert!(view > self.view || (view == self.view && self.status == Status::Normal));
        self.view = view;
        self.status = Status::ViewChange;
        self.svc_from = 1 << self.config.replica;
        self.svc_sent = false;
        self.dvc_sent = false;
        self.dvcs = vec![None; usize::from(self.config.replica_count)];
        self.merged = false;
        self.pipeline.clear();
        self.view_change_started_tick = self.ticks;
        self.view_change_sent_tick = self.ticks;
        self.want_durable();
    }

    fn on_start_view_change(&mut self, header: &Header) {
        if self.status == Status::Recovering {
            // It votes in nothing until it has installed a view.
            return;
        }
        if header.view < self.view || (header.view == self.view && self.status == Status::Normal) {
            return;
        }
        if header.view > self.view {
            self.start_view_change(header.view);
        }
        self.svc_from |= 1 << header.replica;
    }

    fn on_do_view_change(&mut self, message: &Message) {
        let header = &message.header;
        if self.status == Status::Recovering {
            return;
        }
        if header.view < self.view || (header.view == self.view && self.status == Status::Normal) {
            return;
        }
        if self.config.primary_of(header.view) != self.config.replica {
            return;
        }
        if header.view > self.view {
            self.start_view_change(header.view);
        }
        let Some(dvc) = self.decode_suffix(message, header.log_view, true) else {
            return;
        };
        self.dvcs[usize::from(header.replica)] = Some(dvc);
    }

    fn on_start_view(&mut self, message: &Message) {
        let header = &message.header;
        if header.view < self.view || header.replica != self.config.primary_of(header.view) {
            return;
        }
        if header.view == self.view && self.status == Status::Normal {
            return;
        }
        if let Some(recovery) = self.recovery {
            // A StartView made after this boot (it echoes the nonce), or of a view this
            // replica never acknowledged anything in, cannot be older than an acknowledgement
            // it gave. Any other could be a stale answer from before the restart.
            let fresh = header.nonce == recovery.nonce;
            let newer = !recovery.wiped && header.view > recovery.boot_view;
            if !fresh && !newer {
                return;
            }
            if fresh {
                self.on_recovery_response(header);
            }
            if !self.wiped_may_install(header.view) {
                return;
            }
        }
        let Some(suffix) = self.decode_suffix(message, header.view, false) else {
            return;
        };
        if header.op < self.commit_min {
            // An older StartView of this view (the primary sends one per probe, each with its
            // head then), overtaken by a state transfer: the view's log holds every committed
            // op, so a newer StartView will.
            return;
        }
        let contradicts_applied = suffix.entries.iter().any(|entry| match entry {
            Entry::Header(header) if header.op == self.commit_min + 1 => {
                header.parent != self.commit_min_checksum
            }
            _ => {
                self.commit_min > 0
                    && entry.op() == self.commit_min
                    && entry.checksum() != self.commit_min_checksum
            }
        });
        if contradicts_applied {
            // A log that does not hold what this replica applied is of a view that committed
            // state left behind (a state transfer from a later view brought this replica past
            // it; committed ops are in every later view's log): a stale answer, say from a
            // primary cut off since. A newer StartView follows.
            return;
        }
        if header.op > self.journal_window_end() {
            // The view's log runs past what this journal can hold above its checkpoint: catch
            // up by state transfer first, then take the next StartView. A replica in an older
            // view (an old primary cut off, or one installing an older view's log) leaves it
            // first: what it was doing there is moot, and the commit point it learns here
            // lies beyond that view's log.
            if self.status != Status::Recovering && header.view > self.view {
                self.start_view_change(header.view);
            } else if self.status == Status::Recovering && header.view > self.view {
                // Still recovering: remember the view, so the durable state the checkpoint
                // write brings carries it. A wiped replica that crashes again before it
                // installs a view then boots trusting only StartViews of higher views, in
                // which it never acknowledged anything.
                self.view = header.view;
            }
            self.advance_commit_max(header.commit);
            self.request_state_transfer();
            return;
        }
        self.recovery = None;
        let entries = suffix.entries;
        self.view = header.view;
        self.log_view = header.view;
        self.status = Status::ViewChange;
        self.merged = true;
        self.pipeline.clear();
        self.install_log(header.op, &entries);
        self.set_log_head(&entries);
        self.advance_commit_max(header.commit);
        self.primary_heard_tick = self.ticks;
        self.want_durable();
    }

    fn on_request_start_view(&mut self, header: &Header) {
        if self.status == Status::Normal && self.is_primary() && header.view <= self.view {
            let start_view = self.start_view_message(header.nonce);
            self.send(Destination::Replica(header.replica), start_view);
        } else if self.status != Status::Recovering && header.nonce != 0 {
            // Say which view this replica is in: a wiped replica needs a quorum of these to
            // know the view a StartView comes from is current.
            let mut response = Header::new(Command::RecoveryResponse, self.config.cluster);
            response.group = self.config.group;
            response.replica = self.config.replica;
            response.view = self.view;
            response.nonce = header.nonce;
            self.send(
                Destination::Replica(header.replica),
                Message::new(response, Bytes::new()),
            );
        }
    }

    fn on_recovery_response(&mut self, header: &Header) {
        let Some(recovery) = self.recovery.as_mut() else {
            return;
        };
        if header.nonce != recovery.nonce {
            return;
        }
        let reported = &mut recovery.responses[usize::from(header.replica)];
        *reported = Some(reported.map_or(header.view, |view| view.max(header.view)));
    }

    /// A wiped replica may install a StartView of `view` only once a quorum of the other
    /// replicas answered this boot's probes and none reported a higher view. Any view that
    /// formed before those answers had a quorum of participants, and at least one of them is
    /// among the responders (the wiped replica may have been a participant before the wipe,
    /// so it is not counted on either side). A cut-off old primary still normal in an older
    /// view answers probes too: without this, the wiped replica would follow it, and its
    /// acknowledgements would count a second time towards an old-view quorum (Iggy trap 9).
    fn wiped_may_install(&self, view: u32) -> bool {
        let Some(recovery) = self.recovery.filter(|recovery| recovery.wiped) else {
            return true;
        };
        let reported: Vec<u32> = recovery.responses.iter().flatten().copied().collect();
        reported.len() >= self.config.quorum() && reported.iter().all(|&reported| reported <= view)
    }

    fn on_request_prepare(&mut self, header: &Header) {
        let Some(slot) = self
            .slot(header.op)
            .filter(|slot| slot.checksum == header.context)
        else {
            return;
        };
        if let Some(prepare) = slot.message.clone() {
            self.send(Destination::Replica(header.replica), prepare);
        } else if slot.durable {
            self.read_prepare(header.op, header.context, Some(header.replica));
        }
    }

    /// Everything that waits on a condition (a quorum, a durable write, a filled hole) is
    /// re-checked here, after every input.
    fn progress(&mut self) {
        if self.status == Status::Normal {
            if self.is_primary() {
                self.commit_pipeline();
            }
            self.commit_journal();
        } else if self.status == Status::ViewChange {
            self.progress_view_change();
        }
        if self.config.shape.log_journal {
            self.write_log();
            self.write_checkpoint_when_ready();
        }
        self.check_invariants();
    }

    /// Log journal: cut the log where memory no longer holds what was written, then write
    /// every prepare above the log's end that memory holds, in op order, up to the first
    /// hole. A prepare beyond a hole waits in memory (every op above `commit_min` keeps its
    /// body) until the hole is repaired.
    fn write_log(&mut self) {
        debug_assert!(self.config.shape.log_journal);
        if self.checkpoint_cycle.is_some_and(|cycle| cycle.replaces_log) {
            // The shell's live log is about to be replaced (see `CheckpointCycle`).
            return;
        }
        // Applied ops are never cut (asserted in `cut_log`).
        while let Some(entry) = self.log_written.first_entry()
            && *entry.key() <= self.commit_min
        {
            entry.remove();
        }
        let cut = self
            .log_written
            .iter()
            .find(|&(&op, &checksum)| self.slot(op).is_none_or(|slot| slot.checksum != checksum))
            .map(|(&op, _)| op);
        if let Some(cut) = cut {
            self.cut_log(cut);
        }
        loop {
            let op = self.log_end + 1;
            let Some(slot) = self.slot(op) else {
                break;
            };
            let checksum = slot.checksum;
            if slot.durable && self.config.bugs.log_cut_keeps_durable {
                self.log_end = op;
                self.log_written.insert(op, checksum);
                continue;
            }
            // Nothing above the log's end counts as durable (see `cut_log` and
            // `recover_log_end`), so every op from here on is written again.
            debug_assert!(!slot.durable, "op {op} above the log's end is durable");
            let Some(message) = slot.message.clone() else {
                break;
            };
            self.outbox.push(Output::WritePrepare { message });
            self.log_writes.push_back((op, checksum, true));
            self.log_end = op;
            self.log_written.insert(op, checksum);
        }
    }

    /// Log journal: the log ends below `op` from now on. Writes at or above it still in
    /// flight are dead, and the next write (at `op`) makes the shell discard everything its
    /// log holds from `op` up.
    fn cut_log(&mut self, op: u64) {
        assert!(
            op > self.commit_min,
            "the log is never cut at or below an applied op: cut at {op}, {}",
            self.describe()
        );
        self.log_end = op - 1;
        self.log_written.retain(|&written, _| written < op);
        for write in self.log_writes.iter_mut().filter(|write| write.0 >= op) {
            write.2 = false;
        }
        self.undurable_above_log_end();
    }

    /// Log journal: a durable slot above the log's end is about to be discarded by the
    /// shell, so it counts as durable no more. It keeps its body (an op that is not durable
    /// is never released, and every op above `commit_min` has its body unless recovery handed
    /// it over as a header only), so it is applied from memory and written again in order;
    /// one recovered as a header only is faulty until repaired (below). It may hold a prepare this replica
    /// acknowledged: while the body is in memory the op is held and never nacked; after a
    /// crash, the redundant header the cut leaves on disk makes recovery call the slot
    /// faulty, so it is never nacked either. (A log whose cut removes the headers with the
    /// records, as the partition journal's does, keeps no such trace: with peers, that shell
    /// must persist one before it cuts; see `docs/replication.md`, "Where it stands".) A slot
    /// with its body is not marked faulty here: the mark covers the op, not the prepare, so a
    /// view change that puts another prepare there (one no replica holds) could never
    /// truncate it, and the view change would wait forever. A header-only slot must be
    /// marked, since nothing else holds its prepare; a view change that replaces an op below
    /// it replaces it too (its chain runs through the replaced op), so the mark only stays on
    /// canonical ops, and it clears when the op is written again.
    fn undurable_above_log_end(&mut self) {
        if self.config.bugs.log_cut_keeps_durable {
            return;
        }
        for above in self.log_end + 1..=self.op {
            let index = self.slot_index(above);
            if let Some(slot) = self.journal[index]
                .as_mut()
                .filter(|slot| slot.op == above && slot.durable)
            {
                slot.durable = false;
                if slot.message.is_none() {
                    // Handed over as a header at recovery, its body never read back: the
                    // shell is about to discard the only copy, so it is written again only
                    // once repaired. It may hold a prepare this replica acknowledged, so it
                    // counts as faulty until then, as if recovery had found it damaged.
                    self.faulty_slots[index] = Some(FaultyOp::Op(above));
                }
            }
        }
    }

    /// Log journal, after a restart: the log's durable prefix above the checkpoint is what
    /// the replica recovered clean and contiguous from `commit_min` up; the first write goes
    /// right above it, and discards anything the log still holds beyond (a damaged op and
    /// the ops after it, or stale ops a view change replaced).
    fn recover_log_end(&mut self) {
        if !self.config.shape.log_journal {
            return;
        }
        self.log_end = self.commit_min;
        while let Some(slot) = self.slot(self.log_end + 1).filter(|slot| slot.durable) {
            self.log_written.insert(slot.op, slot.checksum);
            self.log_end += 1;
        }
        // Beyond a gap (a damaged or missing op) the log is not whole: the ops there are
        // written again once the gap is repaired.
        self.undurable_above_log_end();
    }

    fn progress_view_change(&mut self) {
        debug_assert_eq!(self.status, Status::ViewChange);
        let view_durable = self.durable.view >= self.view || self.config.bugs.send_before_view_persist;
        if self.merged {
            // Installing a log (new primary after the merge, or a backup after StartView):
            // normal once every prepare of it is here and its log_view is durable.
            if self.holes().is_empty() && view_durable && self.durable.log_view >= self.view {
                self.enter_normal();
            }
            return;
        }
        if !view_durable {
            return;
        }
        if !self.svc_sent {
            let svc = self.control(Command::StartViewChange);
            self.broadcast(&svc);
            self.svc_sent = true;
        }
        if (self.svc_from.count_ones() as usize) >= self.config.quorum() && !self.dvc_sent {
            let dvc = self.do_view_change_message();
            let primary = self.config.primary_of(self.view);
            if primary == self.config.replica {
                let entries = self.suffix_entries();
                let own = DoViewChange {
                    log_view: self.log_view,
                    op: self.op,
                    commit: self.commit_max,
                    nacks: self.suffix_nacks(&entries),
                    entries,
                };
                self.dvcs[usize::from(primary)] = Some(own);
            } else {
                self.send(Destination::Replica(primary), dvc);
            }
            self.dvc_sent = true;
        }
        if self.is_primary() {
            let count = self.dvcs.iter().flatten().count();
            if count >= self.config.quorum() && self.dvcs[usize::from(self.config.replica)].is_some() {
                self.merge();
            }
        }
    }

    /// New primary: adopt the canonical log of the DoViewChange quorum.
    fn merge(&mut self) {
        let best = self
            .dvcs
            .iter()
            .flatten()
            .max_by_key(|dvc| {
                if self.config.bugs.merge_ignores_log_view {
                    (0, dvc.op)
                } else {
                    (dvc.log_view, dvc.op)
                }
            })
            .cloned()
            .expect("a quorum of DoViewChanges");
        let commit = self
            .dvcs
            .iter()
            .flatten()
            .map(|dvc| dvc.commit)
            .max()
            .unwrap_or(0);
        // Every committed op is in the canonical log (the DoViewChange quorum meets every
        // commit quorum, and the highest log_view's log holds everything committed before).
        debug_assert!(commit <= best.op.max(self.commit_min));
        let (head, entries) = self.truncate_nacked(&best, commit);
        let entries = self.canonical_entries(&best, head, entries);
        if head > self.commit_min && entries.first().map(Entry::op) != Some(head) {
            // No DoViewChange so far says which prepare the merged head is (a cut at a nacked
            // op left a head only unverified copies know). Wait for more DoViewChanges; the
            // view change moves on at its timeout otherwise.
            return;
        }
        if head > self.journal_window_end() {
            // This replica cannot hold the canonical log yet: it catches up by state transfer,
            // and the view change moves on to the next primary meanwhile.
            self.advance_commit_max(commit);
            self.request_state_transfer();
            return;
        }
        if head < self.commit_min {
            // This replica's commit point moved past the canonical log of this view's
            // DoViewChange quorum while it waited (a state transfer brought commits made in a
            // later view, which the other replicas moved on to): this view change is stale.
            // A log below what it applied is never installed; the view change moves on at its
            // timeout, or a StartView of the later view reaches it. (Real-journal simulator,
            // seed 47 950.)
            return;
        }
        self.install_log(head, &entries);
        // The journal now holds the merged log, so from here on this replica's log is this
        // view's: a later DoViewChange reads its suffix from the journal and must say so. Were
        // log_view left at the old value until the holes are filled, a view change before that
        // would send the merged log under the old log_view, where it can contradict the other
        // DoViewChanges of that log_view. A restart rebuilds the log down the chain from the
        // persisted head, as it does after a StartView, whose log_view is also set before its
        // prepares are all durable.
        self.log_view = self.view;
        self.set_log_head(&entries);
        self.want_durable();
        self.advance_commit_max(commit.min(self.op));
        self.merged = true;
        self.request_repairs();
    }

    /// The canonical log cut below its lowest op that a quorum of DoViewChange senders nack.
    /// A commit needs a quorum of durable acknowledgements, and two quorums share a replica,
    /// so a prepare nacked by a quorum was never committed, nor was anything after it: it is
    /// safe to drop, and without dropping it a view change whose only copies of that prepare
    /// were lost (never synced anywhere) would wait forever. Ops at or below `commit` are
    /// never cut.
    fn truncate_nacked(&self, best: &DoViewChange, commit: u64) -> (u64, Vec<Entry>) {
        let quorum = if self.config.bugs.truncate_without_nack_quorum {
            1
        } else {
            self.config.quorum()
        };
        // Ascending, so the lowest nacked op is found first.
        let cut = best.entries.iter().rev().find(|canonical| {
            let nacks = self
                .dvcs
                .iter()
                .flatten()
                .filter(|dvc| {
                    // A sender that knows the op committed never nacks it, whatever its log
                    // says: after a state transfer its commit point can lie above its
                    // `log_view`'s log (seed 18 003, with checkpoints off the interval, had a
                    // sender whose installed checkpoint was a prepare of a later view).
                    if dvc.commit >= canonical.op() {
                        return false;
                    }
                    // A replica acknowledges a prepare of view `v` only while normal in a view
                    // at or above `v`, so with `log_view` durable at or above `v`, and
                    // `log_view` never decreases: a sender whose log_view is lower never
                    // acknowledged it.
                    let implicit = matches!(canonical, Entry::Header(header) if dvc.log_view < header.view)
                        // In one log_view every replica's log holds the installed head's
                        // prefix, and above it grows only by prepares of that view, each
                        // acknowledged only once durable, which a restart keeps: a sender of
                        // the same log_view whose head is below the op never acknowledged it.
                        || (dvc.log_view == best.log_view && dvc.op < canonical.op());
                    // A nack says the sender holds no prepare at that op (a slot holds one op,
                    // and a faulty one is never nacked), so it counts whatever checksum the
                    // sender knew there.
                    let explicit = dvc
                        .entries
                        .iter()
                        .zip(&dvc.nacks)
                        .any(|(entry, &nack)| nack && entry.op() == canonical.op());
                    implicit || explicit
                })
                .count();
            nacks >= quorum
        });
        match cut {
            Some(cut) => {
                assert!(
                    cut.op() > commit || self.config.bugs.truncate_without_nack_quorum,
                    "a quorum nacked op {} at or below the commit point {commit}",
                    cut.op()
                );
                let head = cut.op() - 1;
                let entries = best
                    .entries
                    .iter()
                    .filter(|entry| entry.op() <= head)
                    .copied()
                    .collect();
                (head, entries)
            }
            None => (best.op, best.entries.clone()),
        }
    }

    /// The merged suffix from `head` down: `best`'s entries, continued (or upgraded from a
    /// hole to a header) from the other DoViewChanges of the same log_view. Those hold the
    /// same log, since one primary made it, so where they overlap they agree; a cut at a
    /// nacked op can leave `best` with nothing below it while another holds the rest.
    fn canonical_entries(&self, best: &DoViewChange, head: u64, entries: Vec<Entry>) -> Vec<Entry> {
        let mut by_op: std::collections::BTreeMap<u64, Entry> =
            entries.iter().map(|entry| (entry.op(), *entry)).collect();
        for dvc in self
            .dvcs
            .iter()
            .flatten()
            .filter(|dvc| dvc.log_view == best.log_view)
        {
            for entry in dvc.entries.iter().filter(|entry| entry.op() <= head) {
                if matches!(entry, Entry::Unknown { .. }) {
                    continue;
                }
                match by_op.get(&entry.op()) {
                    None | Some(Entry::Unknown { .. }) => {
                        by_op.insert(entry.op(), *entry);
                    }
                    Some(Entry::Hole { checksum, .. }) if matches!(entry, Entry::Header(_)) => {
                        if *checksum == entry.checksum() {
                            by_op.insert(entry.op(), *entry);
                        }
                    }
                    Some(known) => {
                        debug_assert_eq!(
                            known.checksum(),
                            entry.checksum(),
                            "DoViewChanges of one log_view disagree at op {}",
                            entry.op()
                        );
                    }
                }
            }
        }
        // Contiguous from the head down, each header naming the entry below as its parent.
        let mut merged: Vec<Entry> = Vec::new();
        let mut op = head;
        while op > 0 && merged.len() < self.config.shape.view_change_headers_max() {
            let Some(entry) = by_op
                .get(&op)
                .filter(|entry| !matches!(entry, Entry::Unknown { .. }))
            else {
                break;
            };
            if let Some(Entry::Header(above)) = merged.last()
                && above.parent != entry.checksum()
            {
                break;
            }
            merged.push(*entry);
            op -= 1;
        }
        merged
    }

    /// Remember the log just installed (from `entries`, head first) as the `log_view` log:
    /// its head, and the checksums it names below the head, contiguous and at most
    /// [`LOG_SUFFIX_MAX`]. Both are persisted with `log_view`, so a restart can tell that
    /// log's copies from stale ones and name the ops it lacks, all the way down the suffix.
    fn set_log_head(&mut self, entries: &[Entry]) {
        self.log_head = (self.op, self.head_checksum());
        let below_head = entries
            .iter()
            .skip_while(|entry| entry.op() >= self.op)
            .take_while(|entry| entry.op() >= 1);
        self.log_suffix.clear();
        for (index, entry) in below_head.enumerate() {
            if index == LOG_SUFFIX_MAX || entry.op() != self.op - 1 - index as u64 {
                break;
            }
            debug_assert!(!matches!(entry, Entry::Unknown { .. }));
            self.log_suffix.push(entry.checksum());
        }
    }

    /// Make the journal hold the log whose head is `head` and whose suffix is `entries`
    /// (from `head` down): keep matching slots, turn the rest into holes, drop everything
    /// above the head, and link the chain below the suffix.
    fn install_log(&mut self, head: u64, entries: &[Entry]) {
        assert!(
            head >= self.commit_min,
            "a view change never loses a commit: head {head}, {}",
            self.describe()
        );
        for op in head + 1..=self.op {
            let slot = self.slot_index(op);
            if self.journal[slot].as_ref().is_some_and(|s| s.op == op) {
                self.journal[slot] = None;
            }
        }
        self.op = head.max(self.commit_min);
        for entry in entries {
            let (op, checksum) = (entry.op(), entry.checksum());
            if op <= self.commit_min {
                // Below the commit point the slots may hold copies of other laps (after a
                // restart or state transfer); the applied op itself is known exactly.
                if op == self.commit_min {
                    assert_eq!(
                        checksum,
                        self.commit_min_checksum,
                        "the canonical log (head {head}, op {op}) agrees with what this replica applied: {}",
                        self.describe()
                    );
                }
                continue;
            }
            let header = match entry {
                Entry::Header(header) => Some(*header),
                Entry::Hole { .. } => None,
                Entry::Unknown { .. } => unreachable!("the merge installs no unknown records"),
            };
            let keep = self.slot(op).is_some_and(|slot| slot.checksum == checksum);
            if !keep {
                self.set_hole(op, checksum, header);
            } else if let Some(slot) = self.slot_mut(op) {
                if header.is_some() {
                    slot.header = header;
                }
                slot.verified = true;
            }
        }
        // Below the suffix, nothing is trusted until the chain walk confirms it.
        let lowest = entries.last().map_or(self.op + 1, Entry::op);
        for op in self.commit_min + 1..lowest.min(self.op + 1) {
            if let Some(slot) = self.slot_mut(op) {
                slot.verified = false;
            }
        }
        // The walk needs the lowest entry's header, for its parent. A hole entry this
        // replica holds the prepare of has it; otherwise the walk waits for the repair,
        // whose `fill` walks on.
        if !entries.is_empty() {
            self.link_chain_below(lowest);
        }
    }

    /// Walk down the hash chain from op `from` (whose header is known) to `commit_min`: every
    /// slot must hold the op its successor's parent names, or become a hole with that checksum.
    fn link_chain_below(&mut self, from: u64) {
        let mut op = from;
        while op > self.commit_min + 1 {
            let Some(parent) = self
                .slot(op)
                .and_then(|slot| slot.header)
                .map(|header| header.parent)
            else {
                return;
            };
            let below = op - 1;
            let matches = self.slot(below).is_some_and(|slot| slot.checksum == parent);
            if !matches {
                self.set_hole(below, parent, None);
                // Ask at once: the chain is repaired one op at a time, downwards.
                self.request_prepare(below, parent, 0);
                return;
            }
            if let Some(slot) = self.slot_mut(below) {
                slot.verified = true;
            }
            op = below;
        }
        if op == self.commit_min + 1
            && let Some(header) = self.slot(op).and_then(|slot| slot.header)
            && header.parent != self.commit_min_checksum
        {
            // The walk followed this replica's own log, and that log does not continue what it
            // applied: the applied state came by state transfer, and the view that committed
            // it left this `log_view` log behind (every committed op above the state would
            // chain to it). Nothing walked here was committed: it is never applied (only
            // verified ops on the committed chain are), and the next StartView replaces it.
            // As in `rebuild_log_view_log`, the replica must not vote with this log.
            for stale in op..=from {
                if let Some(slot) = self.slot_mut(stale) {
                    slot.verified = false;
                }
            }
            self.log_unsound = true;
        }
    }

    /// Make op `op`'s slot a hole: the op is on this view's chain with checksum `checksum`
    /// (its header too, when known), and its prepare is to be repaired.
    fn set_hole(&mut self, op: u64, checksum: u128, header: Option<Header>) {
        debug_assert!(header.is_none_or(|header| header.op == op && header.checksum == checksum));
        let index = self.slot_index(op);
        self.journal[index] = Some(Slot {
            op,
            checksum,
            header,
            message: None,
            durable: false,
            verified: true,
        });
    }

    /// Ops between `commit_min` and the head this replica cannot produce yet.
    fn holes(&self) -> Vec<(u64, u128)> {
        (self.commit_min + 1..=self.op)
            .filter_map(|op| match self.slot(op) {
                Some(slot) if slot.held() => None,
                Some(slot) => Some((op, slot.checksum)),
                None => Some((op, 0)),
            })
            .collect()
    }

    /// Ask for every hole with a known checksum: the primary first, then the others in turn.
    fn request_repairs(&mut self) {
        self.repair_sent_tick = self.ticks;
        let holes: Vec<(u64, u128)> = self
            .holes()
            .into_iter()
            .filter(|(_, checksum)| *checksum != 0)
            .collect();
        for (index, (op, checksum)) in holes.into_iter().enumerate() {
            self.request_prepare(op, checksum, index as u64);
        }
    }

    /// Ask one replica for the prepare `op` with checksum `checksum`: a backup in normal
    /// status asks its primary; otherwise the target rotates over the others with time and
    /// `spread`, so a prepare only some replicas hold is found.
    fn request_prepare(&mut self, op: u64, checksum: u128, spread: u64) {
        let mut request = self.control(Command::RequestPrepare).header;
        request.op = op;
        request.context = checksum;
        let request = Message::new(request, Bytes::new());
        let target = if self.status == Status::Normal && !self.is_primary() {
            self.config.primary_of(self.view)
        } else {
            let others = u64::from(self.config.replica_count - 1).max(1);
            let pick = (self.ticks / VIEW_CHANGE_RETRY_TICKS + spread) % others;
            let mut target = pick as u8;
            if target >= self.config.replica {
                target += 1;
            }
            target
        };
        if target != self.config.replica && target < self.config.replica_count {
            self.send(Destination::Replica(target), request);
        }
    }

    /// The view's log is installed, durable and whole: act in it.
    fn enter_normal(&mut self) {
        self.status = Status::Normal;
        self.primary_heard_tick = self.ticks;
        self.commit_journal();
        if self.is_primary() {
            self.view_start_op = self.op;
            self.pipeline = (self.commit_max + 1..=self.op)
                .map(|op| {
                    let slot = self.slot(op).expect("a whole log");
                    let own = if slot.durable { 1 << self.config.replica } else { 0 };
                    Prepared {
                        op,
                        checksum: slot.checksum,
                        oks: own,
                    }
                })
                .collect();
            let start_view = self.start_view_message(0);
            self.broadcast(&start_view);
            self.send_commit_heartbeat();
            self.retransmit_prepares();
        } else {
            let uncommitted: Vec<(u64, u128)> = (self.commit_max + 1..=self.op)
                .filter_map(|op| {
                    self.slot(op)
                        .filter(|slot| slot.durable)
                        .map(|slot| (op, slot.checksum))
                })
                .collect();
            for (op, checksum) in uncommitted {
                self.send_prepare_ok(op, checksum);
            }
        }
    }

    // ----- durable state -----

    /// Persist `view`, `log_view` and `commit_max` as they stand.
    fn want_durable(&mut self) {
        let (checkpoint_op, checkpoint_checksum) = match self.checkpoint_cycle {
            Some(cycle) if cycle.written => (cycle.op, cycle.checksum),
            _ => (self.durable.checkpoint_op, self.durable.checkpoint_checksum),
        };
        let next = DurableState {
            view: self.view,
            log_view: self.log_view,
            log_head_op: self.log_head.0,
            log_head_checksum: self.log_head.1,
            log_suffix: self.log_suffix.clone(),
            commit_max: self.commit_max.max(self.durable.commit_max).max(checkpoint_op),
            checkpoint_op,
            checkpoint_checksum,
            ..self.durable.clone()
        };
        if self.durable_writing {
            self.durable_next = Some(next);
        } else if next != self.durable {
            self.write_durable(next);
        }
    }

    fn write_durable(&mut self, state: DurableState) {
        debug_assert!(!self.durable_writing);
        debug_assert!(state.check().is_ok());
        self.durable_writing = true;
        self.outbox.push(Output::WriteDurable { state });
    }

    // ----- messages -----

    /// A header-only message of this replica's view.
    fn control(&self, command: Command) -> Message {
        let mut header = Header::new(command, self.config.cluster);
        header.group = self.config.group;
        header.replica = self.config.replica;
        header.view = self.view;
        header.log_view = self.log_view;
        header.op = self.op;
        header.commit = self.commit_max;
        Message::new(header, Bytes::new())
    }

    fn do_view_change_message(&self) -> Message {
        let mut header = self.control(Command::DoViewChange).header;
        let entries = self.suffix_entries();
        let nacks = self.suffix_nacks(&entries);
        let mut body = Vec::with_capacity(entries.len() * (HEADER_SIZE + 1));
        for entry in &entries {
            match entry {
                Entry::Header(header) => body.extend_from_slice(&header.encode()),
                Entry::Hole { op, checksum } => {
                    let mut record = [0u8; HEADER_SIZE];
                    record[..8].copy_from_slice(&op.to_le_bytes());
                    record[8..24].copy_from_slice(&checksum.to_le_bytes());
                    body.extend_from_slice(&record);
                }
                Entry::Unknown { op } => {
                    let mut record = [0u8; HEADER_SIZE];
                    record[..8].copy_from_slice(&op.to_le_bytes());
                    body.extend_from_slice(&record);
                }
            }
        }
        body.extend(entries.iter().zip(&nacks).map(|(entry, &nack)| {
            let kind = match entry {
                Entry::Header(_) => 0,
                Entry::Hole { .. } => 0b10,
                Entry::Unknown { .. } => 0b100,
            };
            u8::from(nack) | kind
        }));
        header.log_view = self.log_view;
        Message::new(header, Bytes::from(body))
    }

    /// Per suffix entry: whether this replica nacks it (see [`DoViewChange::nacks`]).
    fn suffix_nacks(&self, entries: &[Entry]) -> Vec<bool> {
        entries
            .iter()
            .map(|entry| {
                let op = entry.op();
                // Applied ops are committed: never nacked, whatever the slot holds now.
                let held = self.slot(op).is_some_and(Slot::held);
                let faulty = self.faulty_slots[self.slot_index(op)].is_some_and(|faulty| faulty.covers(op));
                op > self.commit_min && !held && !faulty
            })
            .collect()
    }

    /// A DoViewChange's suffix: from the head down, one entry per op, at most
    /// `Shape::view_change_headers_max`. An op whose header this replica lacks but whose checksum
    /// the chain named is a hole entry, so the new primary can count nacks for a prepare
    /// no survivor ever received. It stops at an op it knows nothing of, at a header that
    /// does not chain to the entry above, and, below a hole, at anything not verified on this
    /// view's chain (a hole gives no parent to check against).
    fn suffix_entries(&self) -> Vec<Entry> {
        let mut entries: Vec<Entry> = Vec::new();
        let mut op = self.op;
        while op > 0 && entries.len() < self.config.shape.view_change_headers_max() {
            let Some(slot) = self.slot(op) else {
                if op <= self.commit_min {
                    break;
                }
                // Nothing here: say so, so the position can be nacked, and go on below.
                entries.push(Entry::Unknown { op });
                op -= 1;
                continue;
            };
            let chains = match entries.last() {
                Some(Entry::Header(above)) => above.parent == slot.checksum,
                Some(Entry::Hole { .. } | Entry::Unknown { .. }) => slot.verified,
                None => true,
            };
            if !chains {
                break;
            }
            match slot.header {
                Some(header) => entries.push(Entry::Header(header)),
                None if slot.verified && op > self.commit_min => entries.push(Entry::Hole {
                    op,
                    checksum: slot.checksum,
                }),
                None => break,
            }
            op -= 1;
        }
        entries
    }

    fn start_view_message(&self, nonce: u128) -> Message {
        let mut header = self.control(Command::StartView).header;
        header.nonce = nonce;
        let body = encode_headers(&self.suffix_headers());
        Message::new(header, Bytes::from(body))
    }

    /// Headers from the head down, contiguous along the hash chain, at most
    /// `Shape::view_change_headers_max`. It stops at a hole, or at a slot that does not chain to the
    /// op above (a copy of another lap or view left below a checkpoint after a restart).
    fn suffix_headers(&self) -> Vec<Header> {
        let mut headers: Vec<Header> = Vec::new();
        let mut op = self.op;
        while op > 0 && headers.len() < self.config.shape.view_change_headers_max() {
            let Some(header) = self.slot(op).and_then(|slot| slot.header) else {
                break;
            };
            if headers
                .last()
                .is_some_and(|above| above.parent != header.checksum)
            {
                break;
            }
            headers.push(header);
            op -= 1;
        }
        headers
    }

    fn send_prepare_ok(&mut self, op: u64, checksum: u128) {
        if self.durable.view < self.view {
            return;
        }
        let mut ok = self.control(Command::PrepareOk).header;
        ok.op = op;
        ok.context = checksum;
        let primary = self.config.primary_of(self.view);
        self.send(Destination::Replica(primary), Message::new(ok, Bytes::new()));
    }

    fn send_request_start_view(&mut self, primary: u8) {
        let mut request = self.control(Command::RequestStartView).header;
        request.nonce = self.recovery.map_or(0, |recovery| recovery.nonce);
        self.send(Destination::Replica(primary), Message::new(request, Bytes::new()));
    }

    /// A recovering replica asks every replica for the current view (only that view's
    /// primary answers). One that was in a view change when it stopped also says so again
    /// with a StartViewChange of its durable view, or a cluster still in an older view would
    /// never answer it. It sends no DoViewChange: its log counts for nothing until installed.
    fn send_probes(&mut self) {
        let Some(recovery) = self.recovery.as_mut() else {
            return;
        };
        recovery.probe_sent_tick = self.ticks;
        recovery.probes_sent += 1;
        let wiped = recovery.wiped;
        for replica in 0..self.config.replica_count {
            if replica != self.config.replica {
                self.send_request_start_view(replica);
            }
        }
        if !wiped && self.view > self.log_view && self.durable.view >= self.view {
            let svc = self.control(Command::StartViewChange);
            self.broadcast(&svc);
        }
    }

    fn send_commit_heartbeat(&mut self) {
        let mut commit = self.control(Command::Commit).header;
        commit.context = self.commit_min_checksum;
        let commit = Message::new(commit, Bytes::new());
        self.broadcast(&commit);
        self.heartbeat_sent_tick = self.ticks;
    }

    fn retransmit_prepares(&mut self) {
        let replica_count = self.config.replica_count;
        let mut resend = Vec::new();
        let mut reads = Vec::new();
        for prepared in &self.pipeline {
            let Some(slot) = self.slot(prepared.op) else {
                continue;
            };
            for replica in 0..replica_count {
                if replica != self.config.replica && prepared.oks & (1 << replica) == 0 {
                    match &slot.message {
                        Some(message) => resend.push((replica, message.clone())),
                        None if slot.durable => reads.push((prepared.op, prepared.checksum, replica)),
                        None => {}
                    }
                }
            }
        }
        for (op, checksum, replica) in reads {
            self.read_prepare(op, checksum, Some(replica));
        }
        for (replica, message) in resend {
            self.send(Destination::Replica(replica), message);
        }
        self.prepare_sent_tick = self.ticks;
    }

    fn send_session_evicted(&mut self, request: &Header) {
        let reply = self.reply_header(
            request.client,
            request.request,
            OPERATION_SESSION_EVICTED,
            request.checksum,
        );
        self.send(
            Destination::Client(request.client),
            Message::new(reply, Bytes::new()),
        );
    }

    /// A reply of this replica's view to `client`'s `request`; `context` is the checksum the
    /// reply answers (the committed prepare's, or the refused request's).
    fn reply_header(&self, client: u128, request: u64, operation: u8, context: u128) -> Header {
        let mut reply = Header::new(Command::Reply, self.config.cluster);
        reply.group = self.config.group;
        reply.replica = self.config.replica;
        reply.view = self.view;
        reply.client = client;
        reply.request = request;
        reply.operation = operation;
        reply.context = context;
        reply
    }

    fn broadcast(&mut self, message: &Message) {
        for replica in 0..self.config.replica_count {
            if replica != self.config.replica {
                self.send(Destination::Replica(replica), message.clone());
            }
        }
    }

    fn send(&mut self, to: Destination, message: Message) {
        if let Destination::Replica(_) = to {
            // Persist before send: nothing of a view leaves before the view is durable.
            let view_scoped = matches!(
                message.header.command,
                Command::PrepareOk | Command::StartViewChange | Command::DoViewChange | Command::StartView
            );
            assert!(
                !view_scoped
                    || self.durable.view >= message.header.view
                    || self.config.bugs.send_before_view_persist,
                "a {:?} of view {} before the view is durable",
                message.header.command,
                message.header.view
            );
        }
        self.outbox.push(Output::Send { to, message });
    }

    // ----- journal access -----

    /// Ask the shell to read prepare `op` back, unless that read is already in flight.
    fn read_prepare(&mut self, op: u64, checksum: u128, for_replica: Option<u8>) {
        if self.reads_in_flight.insert((op, for_replica)) {
            self.outbox.push(Output::ReadPrepare {
                op,
                checksum,
                for_replica,
            });
        }
    }

    /// The state machine's cursor after op `op` (its prepare header's; 0 at the root). The
    /// primary knows the header of every op from its commit point to its head.
    fn cursor_after(&self, op: u64) -> u128 {
        if op == 0 {
            return 0;
        }
        self.slot(op)
            .and_then(|slot| slot.header)
            .map(|header| header.cursor)
            .unwrap_or_else(|| panic!("no header for op {op} to prepare from: {}", self.describe()))
    }

    fn head_checksum(&self) -> u128 {
        if self.op == 0 {
            return root_checksum(self.config.cluster);
        }
        self.slot(self.op)
            .map(|slot| slot.checksum)
            .expect("the head has a slot")
    }

    /// The journal slot index of op `op` in this group's ring.
    fn slot_index(&self, op: u64) -> usize {
        slot_of(op, self.config.shape.journal_slots)
    }

    fn slot(&self, op: u64) -> Option<&Slot> {
        self.journal[self.slot_index(op)]
            .as_ref()
            .filter(|slot| slot.op == op)
    }

    fn slot_mut(&mut self, op: u64) -> Option<&mut Slot> {
        let index = self.slot_index(op);
        self.journal[index].as_mut().filter(|slot| slot.op == op)
    }

    /// Cross-field invariants; cheap enough to run after every input.
    fn check_invariants(&self) {
        assert_eq!(self.status == Status::Recovering, self.recovery.is_some());
        assert!(
            self.durable.checkpoint_op <= self.commit_min,
            "the durable checkpoint is applied state"
        );
        assert!(
            self.commit_min <= self.commit_max,
            "applied beyond the commit point"
        );
        assert!(self.commit_min <= self.op, "applied beyond the head");
        assert!(self.log_view <= self.view);
        assert!(self.durable.view <= self.view);
        if self.status == Status::Normal {
            assert_eq!(self.log_view, self.view, "normal status in an installed view");
        }
        if self.is_primary() && self.status == Status::Normal {
            assert!(self.pipeline.len() <= self.config.shape.journal_slots);
            assert_eq!(
                self.commit_max + self.pipeline.len() as u64,
                self.op,
                "the pipeline spans commit_max to the head: {}",
                self.describe()
            );
        }
        if cfg!(debug_assertions) {
            // Memory holds bodies only until they are applied and durable: a group whose
            // prepares carry whole batches keeps at most its unapplied suffix in memory.
            for slot in self.journal.iter().flatten() {
                assert!(
                    !(slot.durable && slot.op <= self.commit_min && slot.message.is_some()),
                    "op {} is applied and durable but its body is still in memory",
                    slot.op
                );
            }
        }
    }
}

impl<S: StateMachine> Replica<S> {
    /// The log a DoViewChange or StartView describes, if it is well formed: valid prepare
    /// headers of this group (a DoViewChange may also carry hole records), descending one op
    /// at a time along the chain from the head, and not empty unless the log is.
    ///
    /// A DoViewChange body is its records, 256 bytes each, then one flag byte per record:
    /// bit 0 nack, bit 1 hole (the record then holds only the op and checksum, little-endian
    /// at offsets 0 and 8, and zeros), bit 2 unknown (only the op). A StartView body is
    /// headers only.
    fn decode_suffix(&self, message: &Message, log_view: u32, with_flags: bool) -> Option<DoViewChange> {
        let header = &message.header;
        let record_size = HEADER_SIZE + usize::from(with_flags);
        if !message.body.len().is_multiple_of(record_size)
            || message.body.len() / record_size > self.config.shape.view_change_headers_max()
        {
            return None;
        }
        let count = message.body.len() / record_size;
        let (records, flags) = message.body.split_at(count * HEADER_SIZE);
        if flags.iter().any(|&flag| flag > 0b111 || flag & 0b110 == 0b110) {
            return None;
        }
        let mut entries = Vec::with_capacity(count);
        for (index, record) in records.chunks_exact(HEADER_SIZE).enumerate() {
            let flag = flags.get(index).copied().unwrap_or(0);
            if flag & 0b100 != 0 {
                if record[8..].iter().any(|&byte| byte != 0) {
                    return None;
                }
                let op = u64::from_le_bytes(record[..8].try_into().ok()?);
                entries.push(Entry::Unknown { op });
            } else if flag & 0b10 != 0 {
                if record[24..].iter().any(|&byte| byte != 0) {
                    return None;
                }
                let op = u64::from_le_bytes(record[..8].try_into().ok()?);
                let checksum = u128::from_le_bytes(record[8..24].try_into().ok()?);
                entries.push(Entry::Hole { op, checksum });
            } else {
                let decoded = Header::decode(record).ok().filter(|h| {
                    h.command == Command::Prepare
                        && h.cluster == self.config.cluster
                        && h.group == self.config.group
                })?;
                entries.push(Entry::Header(decoded));
            }
        }
        let suffix = DoViewChange {
            log_view,
            op: header.op,
            commit: header.commit,
            entries,
            nacks: flags.iter().map(|&flag| flag & 1 == 1).collect(),
        };
        let empty_but_not_at_root = header.op > 0 && suffix.entries.is_empty();
        (!empty_but_not_at_root && dvc_is_consistent(&suffix)).then_some(suffix)
    }
}

/// Headers back to back, 256 bytes each.
fn encode_headers(headers: &[Header]) -> Vec<u8> {
    headers.iter().flat_map(|header| header.encode()).collect()
}

/// A suffix starts at its head and descends one op at a time, each header naming the entry
/// below as its parent (a hole names nothing).
fn dvc_is_consistent(dvc: &DoViewChange) -> bool {
    if let Some(first) = dvc.entries.first()
        && first.op() != dvc.op
    {
        return false;
    }
    dvc.entries.windows(2).all(|pair| {
        pair[1].op() + 1 == pair[0].op()
            && match (pair[0], pair[1]) {
                (_, Entry::Unknown { .. }) => true,
                (Entry::Header(above), below) => above.parent == below.checksum(),
                (Entry::Hole { .. } | Entry::Unknown { .. }, _) => true,
            }
    })
}
