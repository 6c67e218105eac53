//! The replica: a deterministic VSR state machine (`docs/replication.md`).
//!
//! A [`Replica`] is driven by four inputs: [`Replica::on_message`], [`Replica::on_tick`],
//! [`Replica::on_prepare_written`] and [`Replica::on_durable_written`]. Each returns nothing;
//! what the replica wants done accumulates in its outbox ([`Replica::take_outputs`]): messages
//! to send, prepares to write, durable state to write. The shell performs them and reports
//! completions back. Nothing here blocks, sleeps, reads a clock or draws randomness.
//!
//! This first part covers normal operation: requests, pipelined prepares, acknowledgements
//! after the journal write is durable, commits in op order, replies, the client table,
//! commit heartbeats and prepare retransmission. View changes, restarts and repair follow
//! (issue 6), so a backup that times out here only records that it would start a view change.

use crate::client_table::{Admission, ClientTable};
use crate::constants::{
    CLIENTS_MAX, COMMIT_INTERVAL_TICKS, JOURNAL_SLOTS, NORMAL_TIMEOUT_TICKS, OPERATION_REGISTER,
    OPERATION_SESSION_EVICTED, PIPELINE_PREPARES_MAX, PREPARE_TIMEOUT_TICKS, REPLICAS_MAX,
};
use crate::header::{Command, Header, Message, root_checksum};
use crate::journal::slot_of;
use std::collections::VecDeque;
use std::sync::Arc;

/// The replicated state machine. `apply` must be deterministic: every replica applies the
/// same ops in the same order and must produce the same replies.
pub trait StateMachine {
    /// Apply committed op `op` (`operation`, `input`, prepared at `timestamp`); the reply body.
    fn apply(&mut self, op: u64, timestamp: u64, operation: u8, input: &[u8]) -> Vec<u8>;
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
    /// [`Replica::on_prepare_written`].
    WritePrepare {
        message: Message,
    },
}

/// Where the replica stands in the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Normal,
    /// A view change is due (normal timeout expired). The view change itself is not built
    /// yet: the replica stops acting as a backup of the old view.
    ViewChange,
}

/// Fixed identity of a replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    pub cluster: u128,
    pub group: u64,
    pub replica: u8,
    pub replica_count: u8,
}

impl Config {
    /// Replicas whose acknowledgements commit an op (classic majority).
    pub fn quorum(&self) -> usize {
        usize::from(self.replica_count) / 2 + 1
    }

    pub fn primary_of(&self, view: u32) -> u8 {
        (view % u32::from(self.replica_count)) as u8
    }
}

/// One journal slot as the replica holds it: the prepare, and whether its write is durable.
#[derive(Debug, Clone)]
struct JournalEntry {
    message: Message,
    /// The shell reported the prepare and its redundant header synced.
    durable: bool,
}

/// A prepare the primary has sent and not yet committed.
#[derive(Debug, Clone)]
struct Prepared {
    message: Message,
    /// Replicas (bit per index) whose acknowledgement arrived, this replica's own included
    /// once its write is durable.
    oks: u8,
}

pub struct Replica<S: StateMachine> {
    config: Config,
    status: Status,
    /// Invariant: `log_view <= view`. (View changes are not built yet: both stay 0.)
    view: u32,
    /// The head: the highest op in the journal.
    /// Invariant: `commit_min <= op`; every op in `commit_min + 1 ..= op` is in `journal`.
    op: u64,
    /// The highest op applied to the state machine. Invariant: `commit_min <= commit_max`.
    commit_min: u64,
    /// The highest op known committed in the cluster.
    commit_max: u64,
    /// Checksum of the prepare at `op` (the root's when `op` is 0).
    head_checksum: u128,
    /// Checksum of the prepare at `commit_min` (the root's when it is 0).
    commit_min_checksum: u128,
    /// By slot (`op % JOURNAL_SLOTS`).
    journal: Vec<Option<JournalEntry>>,
    /// Primary only: uncommitted prepares in op order, `commit_max + 1 ..= op`.
    pipeline: VecDeque<Prepared>,
    state_machine: S,
    client_table: ClientTable<Message>,
    /// Logical time: ticks since the replica started.
    ticks: u64,
    /// Tick of the last message from the primary of the view (backups).
    primary_heard_tick: u64,
    /// Tick of the last commit heartbeat sent (primary).
    heartbeat_sent_tick: u64,
    /// Tick of the last prepare (re)transmission (primary).
    prepare_sent_tick: u64,
    outbox: Vec<Output>,
}

impl<S: StateMachine> Replica<S> {
    /// A replica of a freshly formatted group: view 0, empty journal.
    pub fn new(config: Config, state_machine: S) -> Replica<S> {
        assert!(config.replica_count >= 1 && usize::from(config.replica_count) <= REPLICAS_MAX);
        assert!(config.replica < config.replica_count);
        let root = root_checksum(config.cluster);
        Replica {
            config,
            status: Status::Normal,
            view: 0,
            op: 0,
            commit_min: 0,
            commit_max: 0,
            head_checksum: root,
            commit_min_checksum: root,
            journal: vec![None; JOURNAL_SLOTS],
            pipeline: VecDeque::new(),
            state_machine,
            client_table: ClientTable::new(CLIENTS_MAX),
            ticks: 0,
            primary_heard_tick: 0,
            heartbeat_sent_tick: 0,
            prepare_sent_tick: 0,
            outbox: Vec::new(),
        }
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn status(&self) -> Status {
        self.status
    }

    pub fn view(&self) -> u32 {
        self.view
    }

    pub fn op(&self) -> u64 {
        self.op
    }

    pub fn commit_min(&self) -> u64 {
        self.commit_min
    }

    pub fn commit_max(&self) -> u64 {
        self.commit_max
    }

    pub fn state_machine(&self) -> &S {
        &self.state_machine
    }

    pub fn is_primary(&self) -> bool {
        self.config.primary_of(self.view) == self.config.replica
    }

    /// The header of the committed op `op`, if this replica still holds it.
    pub fn committed_header(&self, op: u64) -> Option<Header> {
        if op == 0 || op > self.commit_min {
            return None;
        }
        self.entry(op).map(|entry| entry.message.header)
    }

    /// Everything the replica asked for since the last call, in order.
    pub fn take_outputs(&mut self) -> Vec<Output> {
        std::mem::take(&mut self.outbox)
    }

    /// One tick of logical time.
    pub fn on_tick(&mut self) {
        self.ticks += 1;
        if self.status != Status::Normal {
            return;
        }
        if self.is_primary() {
            if self.ticks - self.heartbeat_sent_tick >= COMMIT_INTERVAL_TICKS {
                self.send_commit_heartbeat();
            }
            if !self.pipeline.is_empty() && self.ticks - self.prepare_sent_tick >= PREPARE_TIMEOUT_TICKS {
                self.retransmit_prepares();
            }
        } else if self.ticks - self.primary_heard_tick >= NORMAL_TIMEOUT_TICKS {
            self.status = Status::ViewChange;
        }
        self.check_invariants();
    }

    /// A message from the network (any sender; the replica filters).
    pub fn on_message(&mut self, message: &Message) {
        let header = &message.header;
        if header.cluster != self.config.cluster || header.group != self.config.group {
            return;
        }
        match header.command {
            Command::Request => self.on_request(message),
            Command::Prepare => self.on_prepare(message),
            Command::PrepareOk => self.on_prepare_ok(header),
            Command::Commit => self.on_commit(header),
            _ => {}
        }
        self.check_invariants();
    }

    /// The shell wrote and synced the prepare `op` with checksum `checksum`.
    pub fn on_prepare_written(&mut self, op: u64, checksum: u128) {
        let Some(entry) = self.entry_mut(op) else {
            return;
        };
        if entry.message.header.checksum != checksum {
            // The slot was overwritten since (a later lap): this completion is stale.
            return;
        }
        entry.durable = true;
        if self.status != Status::Normal {
            return;
        }
        if self.is_primary() {
            let replica = self.config.replica;
            self.record_ok(replica, op, checksum);
            self.commit_pipeline();
        } else {
            self.send_prepare_ok(op, checksum);
        }
        self.check_invariants();
    }

    fn on_request(&mut self, message: &Message) {
        if self.status != Status::Normal || !self.is_primary() {
            return;
        }
        let header = &message.header;
        let session = header.context as u64;
        if header.operation != OPERATION_REGISTER {
            match self.client_table.admit(header.client, session, header.request) {
                Admission::Execute => {}
                Admission::ReplyCached(reply) => {
                    self.send(Destination::Client(header.client), reply);
                    return;
                }
                Admission::Drop => return,
                Admission::SessionEvicted | Admission::NotRegistered => {
                    self.send_session_evicted(header);
                    return;
                }
            }
        }
        let in_pipeline = self.pipeline.iter().any(|prepared| {
            let prepare = &prepared.message.header;
            prepare.client == header.client && prepare.request == header.request
        });
        if in_pipeline || self.pipeline.len() >= PIPELINE_PREPARES_MAX {
            // The reply follows the commit; or the client retries once there is room.
            return;
        }
        let mut prepare = Header::new(Command::Prepare, self.config.cluster);
        prepare.group = self.config.group;
        prepare.replica = self.config.replica;
        prepare.view = self.view;
        prepare.op = self.op + 1;
        prepare.commit = self.commit_max;
        prepare.timestamp = self.ticks;
        prepare.parent = self.head_checksum;
        prepare.client = header.client;
        prepare.request = header.request;
        prepare.operation = header.operation;
        prepare.context = header.context;
        let prepare = Message::new(prepare, Arc::clone(&message.body));
        self.append(prepare.clone());
        self.pipeline.push_back(Prepared {
            message: prepare.clone(),
            oks: 0,
        });
        self.broadcast(&prepare);
        self.prepare_sent_tick = self.ticks;
    }

    fn on_prepare(&mut self, message: &Message) {
        let header = &message.header;
        if self.status != Status::Normal || self.is_primary() || header.view != self.view {
            return;
        }
        if header.replica != self.config.primary_of(self.view) {
            return;
        }
        self.primary_heard_tick = self.ticks;
        if header.op <= self.op {
            // A retransmission: acknowledge again if it is ours and durable (the primary
            // may have lost the first acknowledgement).
            let durable_same = self
                .entry(header.op)
                .is_some_and(|entry| entry.durable && entry.message.header.checksum == header.checksum);
            if durable_same {
                self.send_prepare_ok(header.op, header.checksum);
            }
        } else if header.op == self.op + 1 && header.parent == self.head_checksum {
            self.append(message.clone());
        }
        // A prepare beyond the head is dropped: the primary resends unacknowledged prepares
        // in op order, so the gap closes without repair while the view lasts.
        self.advance_commit_max(header.commit);
        self.commit_journal();
    }

    fn on_prepare_ok(&mut self, header: &Header) {
        if self.status != Status::Normal || !self.is_primary() || header.view != self.view {
            return;
        }
        if header.replica >= self.config.replica_count || header.replica == self.config.replica {
            return;
        }
        self.record_ok(header.replica, header.op, header.context);
        self.commit_pipeline();
    }

    fn on_commit(&mut self, header: &Header) {
        if self.status != Status::Normal || self.is_primary() || header.view != self.view {
            return;
        }
        if header.replica != self.config.primary_of(self.view) {
            return;
        }
        self.primary_heard_tick = self.ticks;
        self.advance_commit_max(header.commit);
        self.commit_journal();
    }

    /// Put `prepare` at the head of the journal and ask for its write.
    fn append(&mut self, prepare: Message) {
        let header = prepare.header;
        assert_eq!(header.op, self.op + 1, "the journal grows by one op at a time");
        assert_eq!(header.parent, self.head_checksum, "the hash chain is unbroken");
        // The slot's previous occupant must be committed and applied: the pipeline bound
        // keeps the head within the journal ahead of commit_min.
        assert!(header.op - self.commit_min <= JOURNAL_SLOTS as u64);
        self.op = header.op;
        self.head_checksum = header.checksum;
        self.journal[slot_of(header.op)] = Some(JournalEntry {
            message: prepare.clone(),
            durable: false,
        });
        self.outbox.push(Output::WritePrepare { message: prepare });
    }

    fn record_ok(&mut self, replica: u8, op: u64, checksum: u128) {
        if let Some(prepared) = self
            .pipeline
            .iter_mut()
            .find(|prepared| prepared.message.header.op == op)
            && prepared.message.header.checksum == checksum
        {
            prepared.oks |= 1 << replica;
        }
    }

    /// Commit the pipeline's front while it has a quorum of durable acknowledgements.
    fn commit_pipeline(&mut self) {
        let quorum = self.config.quorum();
        while let Some(front) = self.pipeline.front() {
            if (front.oks.count_ones() as usize) < quorum {
                break;
            }
            let op = front.message.header.op;
            debug_assert_eq!(op, self.commit_max + 1);
            self.pipeline.pop_front();
            self.commit_max = op;
            self.commit_journal();
        }
    }

    fn advance_commit_max(&mut self, commit: u64) {
        self.commit_max = self.commit_max.max(commit);
    }

    /// Apply every op up to `commit_max` that the journal holds contiguously.
    fn commit_journal(&mut self) {
        while self.commit_min < self.commit_max && self.commit_min < self.op {
            let op = self.commit_min + 1;
            let Some(entry) = self.entry(op) else {
                break;
            };
            let prepare = entry.message.clone();
            assert_eq!(
                prepare.header.parent, self.commit_min_checksum,
                "commits follow the chain"
            );
            self.apply(&prepare);
            self.commit_min = op;
            self.commit_min_checksum = prepare.header.checksum;
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
        let mut reply = Header::new(Command::Reply, self.config.cluster);
        reply.group = self.config.group;
        reply.replica = self.config.replica;
        reply.view = self.view;
        reply.op = header.op;
        reply.commit = header.op;
        reply.timestamp = header.timestamp;
        reply.client = header.client;
        reply.request = header.request;
        reply.operation = header.operation;
        reply.context = header.checksum;
        let reply = Message::new(reply, Arc::from(reply_body));
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

    fn send_prepare_ok(&mut self, op: u64, checksum: u128) {
        let mut ok = Header::new(Command::PrepareOk, self.config.cluster);
        ok.group = self.config.group;
        ok.replica = self.config.replica;
        ok.view = self.view;
        ok.op = op;
        ok.commit = self.commit_max;
        ok.context = checksum;
        let primary = self.config.primary_of(self.view);
        self.send(
            Destination::Replica(primary),
            Message::new(ok, Arc::from(&[][..])),
        );
    }

    fn send_commit_heartbeat(&mut self) {
        let mut commit = Header::new(Command::Commit, self.config.cluster);
        commit.group = self.config.group;
        commit.replica = self.config.replica;
        commit.view = self.view;
        commit.commit = self.commit_max;
        commit.context = self.commit_min_checksum;
        let commit = Message::new(commit, Arc::from(&[][..]));
        self.broadcast(&commit);
        self.heartbeat_sent_tick = self.ticks;
    }

    fn retransmit_prepares(&mut self) {
        let replica_count = self.config.replica_count;
        let resend: Vec<(u8, Message)> = self
            .pipeline
            .iter()
            .flat_map(|prepared| {
                (0..replica_count)
                    .filter(move |&replica| prepared.oks & (1 << replica) == 0)
                    .map(move |replica| (replica, prepared.message.clone()))
            })
            .filter(|(replica, _)| *replica != self.config.replica)
            .collect();
        for (replica, message) in resend {
            self.send(Destination::Replica(replica), message);
        }
        self.prepare_sent_tick = self.ticks;
    }

    fn send_session_evicted(&mut self, request: &Header) {
        let mut reply = Header::new(Command::Reply, self.config.cluster);
        reply.group = self.config.group;
        reply.replica = self.config.replica;
        reply.view = self.view;
        reply.client = request.client;
        reply.request = request.request;
        reply.operation = OPERATION_SESSION_EVICTED;
        reply.context = request.checksum;
        self.send(
            Destination::Client(request.client),
            Message::new(reply, Arc::from(&[][..])),
        );
    }

    fn broadcast(&mut self, message: &Message) {
        for replica in 0..self.config.replica_count {
            if replica != self.config.replica {
                self.send(Destination::Replica(replica), message.clone());
            }
        }
    }

    fn send(&mut self, to: Destination, message: Message) {
        self.outbox.push(Output::Send { to, message });
    }

    fn entry(&self, op: u64) -> Option<&JournalEntry> {
        self.journal[slot_of(op)]
            .as_ref()
            .filter(|entry| entry.message.header.op == op)
    }

    fn entry_mut(&mut self, op: u64) -> Option<&mut JournalEntry> {
        self.journal[slot_of(op)]
            .as_mut()
            .filter(|entry| entry.message.header.op == op)
    }

    /// Cross-field invariants; cheap enough to run after every input.
    fn check_invariants(&self) {
        assert!(
            self.commit_min <= self.commit_max,
            "applied beyond the commit point"
        );
        assert!(self.commit_min <= self.op, "applied beyond the head");
        if self.is_primary() && self.status == Status::Normal {
            assert!(self.pipeline.len() <= PIPELINE_PREPARES_MAX);
            assert_eq!(self.commit_max + self.pipeline.len() as u64, self.op);
        }
    }
}
