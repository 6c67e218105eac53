//! A whole simulated cluster: replicas, clients, a faulty network, storage latency, pauses,
//! and the checkers (`docs/replication.md`, "Simulator").
//!
//! One run is a pure function of its seed and [`SimOptions`]. Time is a tick counter. Every
//! random choice draws from a named stream ([`super::prng::stream_names`]), so a change in
//! how one part draws never shifts another.
//!
//! Fault model of this harness, so far:
//! - the network delays, reorders, drops and duplicates messages, and partitions replicas
//!   (symmetric or one way) for random spans;
//! - replicas pause for random spans: they take no input and their writes stall, and they
//!   resume with their memory intact. Crashes with restart from storage, torn writes, bit
//!   flips and failing syncs need the replica's recovery path, which is not built yet.
//! - Network faults and pauses may hit any number of replicas at once: safety must hold
//!   whatever the network does. Liveness is checked only after the final heal.
//!
//! Checkers (a violation ends the run with [`Violation`]):
//! - one canonical committed log: the first replica to commit an op fixes its checksum; every
//!   replica's committed prefix must match it op by op;
//! - a replica's commit point never moves back, and its view never decreases;
//! - every reply a client accepted names an op whose canonical checksum is the prepare it
//!   answers;
//! - liveness: after the final heal, every client's request completes within
//!   [`SimOptions::liveness_ticks_max`];
//! - a run in which nothing committed fails: an empty comparison is not a pass.

use super::network::{Endpoint, Network, NetworkOptions};
use super::prng::{PPM, Prng, Streams, stream_names};
use super::trace::TraceHash;
use crate::constants::OPERATION_REGISTER;
use crate::header::{Command, Header, Message};
use crate::replica::{Bugs, Config, Destination, Output, Replica, StateMachine};
use std::collections::{BTreeMap, BinaryHeap};
use std::sync::Arc;
use xxhash_rust::xxh3::xxh3_64;

/// The cluster id of simulated runs.
pub const SIM_CLUSTER: u128 = 0x5EED_C1A5_7E70;
const SIM_GROUP: u64 = 1;
/// Client ids are `CLIENT_ID_BASE + index + k * CLIENT_ID_STRIDE` (k: times evicted).
const CLIENT_ID_BASE: u128 = 1_000;
const CLIENT_ID_STRIDE: u128 = 1_000;

/// One run's shape and fault rates.
#[derive(Debug, Clone)]
pub struct SimOptions {
    pub replica_count: u8,
    pub client_count: u16,
    /// Ticks with faults, before the final heal.
    pub fault_ticks: u64,
    /// Ticks allowed after the final heal for every request to complete.
    pub liveness_ticks_max: u64,
    pub network: NetworkOptions,
    /// Per tick: chance that a partition starts (when none is active).
    pub partition_ppm: u32,
    pub partition_ticks_mean: u64,
    /// Per tick and replica: chance that it pauses.
    pub pause_ppm: u32,
    pub pause_ticks_mean: u64,
    /// Storage write latency.
    pub write_ticks_mean: u64,
    /// Ticks a client waits for a reply before sending the request again.
    pub client_retry_ticks: u64,
    /// Protocol bugs to inject (mutation tests only).
    pub bugs: Bugs,
}

impl SimOptions {
    /// The options a seed runs with: the shape and fault rates are drawn from the seed too
    /// (swarm testing), so seeds differ in kind as well as in detail.
    pub fn from_seed(seed: u64) -> SimOptions {
        let mut prng = Streams::new(seed).stream("options");
        let replica_count = if prng.chance_ppm(PPM / 4) { 5 } else { 3 };
        let endpoint_count = u16::from(replica_count) + 3;
        SimOptions {
            replica_count,
            client_count: 3,
            fault_ticks: prng.range_inclusive(500, 2_000),
            liveness_ticks_max: 2_000,
            network: NetworkOptions {
                endpoint_count,
                capacity_messages: 4_096,
                delay_ticks_min: 1,
                delay_ticks_mean: prng.range_inclusive(0, 5),
                drop_ppm: prng.below(u64::from(PPM / 10)) as u32,
                duplicate_ppm: prng.below(u64::from(PPM / 20)) as u32,
            },
            partition_ppm: prng.below(u64::from(PPM / 50)) as u32,
            partition_ticks_mean: prng.range_inclusive(10, 200),
            pause_ppm: prng.below(u64::from(PPM / 200)) as u32,
            pause_ticks_mean: prng.range_inclusive(10, 200),
            write_ticks_mean: prng.range_inclusive(0, 3),
            client_retry_ticks: 60,
            bugs: Bugs::default(),
        }
    }
}

/// A broken rule, with the tick it was found at.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tick {tick}: {what}")]
pub struct Violation {
    pub tick: u64,
    pub what: String,
}

/// What a run that broke no rule did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The event-trace hash: equal for two runs of one seed, or determinism is broken.
    pub trace_hash: u64,
    pub ticks: u64,
    /// Ops in the canonical committed log.
    pub committed_ops: u64,
    /// Requests acknowledged to clients.
    pub replies: u64,
    pub highest_view: u32,
}

/// The state machine replicas run in the simulator: a hash chain of every applied op, so two
/// replicas that applied different ops (or the same ops differently) disagree.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChainMachine {
    pub state: u64,
    pub applied: u64,
}

impl StateMachine for ChainMachine {
    fn apply(&mut self, op: u64, _timestamp: u64, operation: u8, input: &[u8]) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(input.len() + 25);
        bytes.extend_from_slice(&self.state.to_le_bytes());
        bytes.extend_from_slice(&op.to_le_bytes());
        bytes.push(operation);
        bytes.extend_from_slice(input);
        self.state = xxh3_64(&bytes);
        self.applied += 1;
        self.state.to_le_bytes().to_vec()
    }
}

/// A client: registers, then sends numbered requests one at a time, retrying on timeout.
#[derive(Debug, Clone)]
struct Client {
    id: u128,
    session: Option<u64>,
    /// The request in flight (0 = the register) and when it was last sent.
    request: u64,
    sent_tick: u64,
    /// Whether a request is outstanding.
    waiting: bool,
}

/// A storage write the simulated disk completes later.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct PendingWrite {
    /// Reversed ordering key for the min-heap: (due tick, sequence).
    due: std::cmp::Reverse<(u64, u64)>,
    replica: u8,
    kind: WriteKind,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum WriteKind {
    Prepare {
        op: u64,
        checksum: u128,
    },
    Durable {
        view: u32,
        log_view: u32,
        commit_max: u64,
    },
}

pub struct Simulation {
    options: SimOptions,
    replicas: Vec<Replica<ChainMachine>>,
    network: Network<Message>,
    clients: Vec<Client>,
    writes: BinaryHeap<PendingWrite>,
    write_sequence: u64,
    /// Per replica: paused until this tick.
    paused_until: Vec<u64>,
    partition_until: Option<u64>,
    faults: Prng,
    partitions: Prng,
    clients_prng: Prng,
    storage_latency: Prng,
    now: u64,
    trace: TraceHash,
    /// The canonical committed log: op → prepare checksum.
    canonical: BTreeMap<u64, u128>,
    /// Per replica: how far its committed prefix was checked, and its last view.
    checked_commit: Vec<u64>,
    last_view: Vec<u32>,
    replies: u64,
    /// Replies whose op was not yet in the canonical log when they arrived.
    unconfirmed_replies: Vec<(u64, u128)>,
    durable_pending: Vec<Option<crate::durable::DurableState>>,
    /// After the final heal: clients finish what they started (and register if they must) but
    /// start no new requests, so "everything completed" is a state the run can reach.
    draining: bool,
    /// The first violation found between ticks; reported at the end of the tick.
    found: Option<Violation>,
}

impl Simulation {
    pub fn new(seed: u64, options: SimOptions) -> Simulation {
        let streams = Streams::new(seed);
        let replica_count = options.replica_count;
        assert!(options.network.endpoint_count >= u16::from(replica_count) + options.client_count);
        let replicas = (0..replica_count)
            .map(|replica| {
                let config = Config {
                    cluster: SIM_CLUSTER,
                    group: SIM_GROUP,
                    replica,
                    replica_count,
                    bugs: options.bugs,
                };
                Replica::new(config, ChainMachine::default())
            })
            .collect();
        let clients = (0..options.client_count)
            .map(|index| Client {
                id: CLIENT_ID_BASE + u128::from(index),
                session: None,
                request: 0,
                sent_tick: 0,
                waiting: false,
            })
            .collect();
        let n = usize::from(replica_count);
        Simulation {
            network: Network::new(options.network.clone(), streams.stream(stream_names::NETWORK)),
            options,
            replicas,
            clients,
            writes: BinaryHeap::new(),
            write_sequence: 0,
            paused_until: vec![0; n],
            partition_until: None,
            faults: streams.stream(stream_names::CRASHES),
            partitions: streams.stream(stream_names::PARTITIONS),
            clients_prng: streams.stream(stream_names::CLIENTS),
            storage_latency: streams.stream(stream_names::STORAGE_FAULTS),
            now: 0,
            trace: TraceHash::new(),
            canonical: BTreeMap::new(),
            checked_commit: vec![0; n],
            last_view: vec![0; n],
            replies: 0,
            unconfirmed_replies: Vec::new(),
            durable_pending: vec![None; n],
            draining: false,
            found: None,
        }
    }

    /// Run the seed to the end: faults, the final heal, the liveness window.
    pub fn run(mut self) -> Result<Outcome, Violation> {
        while self.now < self.options.fault_ticks {
            self.inject_faults();
            self.step()?;
        }
        // The final heal: every replica up and connected, no more faults.
        self.network.heal_all();
        self.partition_until = None;
        self.paused_until.fill(0);
        let heal_tick = self.now;
        self.draining = true;
        let mut quiet_options = self.network.options().clone();
        quiet_options.drop_ppm = 0;
        quiet_options.duplicate_ppm = 0;
        self.network.set_options(quiet_options);
        loop {
            self.step()?;
            let done = self
                .clients
                .iter()
                .all(|client| client.session.is_some() && !client.waiting);
            if done && self.now > heal_tick {
                break;
            }
            if self.now - heal_tick > self.options.liveness_ticks_max {
                let stuck: Vec<String> = self
                    .clients
                    .iter()
                    .filter(|client| client.waiting || client.session.is_none())
                    .map(|client| format!("client {} request {}", client.id, client.request))
                    .collect();
                return Err(self.violation(format!(
                    "liveness: {} ticks after the final heal, still waiting: {}; replicas: {}; network: {:?}, {} in flight",
                    self.options.liveness_ticks_max,
                    stuck.join(", "),
                    self.replica_summary(),
                    self.network.counters(),
                    self.network.in_flight_count()
                )));
            }
        }
        for (op, checksum) in std::mem::take(&mut self.unconfirmed_replies) {
            self.check_reply(op, checksum)?;
        }
        if self.canonical.is_empty() || self.replies == 0 {
            return Err(self.violation("nothing committed: the checkers compared nothing".to_string()));
        }
        Ok(Outcome {
            trace_hash: self.trace.finish(),
            ticks: self.now,
            committed_ops: self.canonical.len() as u64,
            replies: self.replies,
            highest_view: self
                .replicas
                .iter()
                .map(|replica| replica.view())
                .max()
                .unwrap_or(0),
        })
    }

    fn inject_faults(&mut self) {
        let replica_count = self.replicas.len();
        match self.partition_until {
            Some(until) if self.now >= until => {
                self.network.heal_all();
                self.partition_until = None;
                self.trace.record_str("heal");
            }
            None if self.partitions.chance_ppm(self.options.partition_ppm) => {
                let endpoints: Vec<Endpoint> = (0..replica_count as u16).map(Endpoint).collect();
                let partition = self.network.random_partition(&mut self.partitions, &endpoints);
                let span = 1 + self
                    .partitions
                    .exponential_ticks(self.options.partition_ticks_mean);
                self.partition_until = Some(self.now + span);
                self.trace.record_str("partition");
                self.trace.record_u64(partition.side_a.len() as u64);
            }
            _ => {}
        }
        for replica in 0..replica_count {
            if self.paused_until[replica] <= self.now && self.faults.chance_ppm(self.options.pause_ppm) {
                let span = 1 + self.faults.exponential_ticks(self.options.pause_ticks_mean);
                self.paused_until[replica] = self.now + span;
                self.trace.record_str("pause");
                self.trace.record_u64(replica as u64);
            }
        }
    }

    /// One tick: clients act, replicas tick, messages and writes due now are delivered, and
    /// the checkers run.
    fn step(&mut self) -> Result<(), Violation> {
        self.now += 1;
        self.drive_clients();
        for replica in 0..self.replicas.len() {
            if !self.is_paused(replica) {
                self.replicas[replica].on_tick();
                self.collect(replica);
            }
        }
        loop {
            if let Some(delivery) = self.network.deliver_next(self.now) {
                self.deliver(delivery.from, delivery.to, delivery.message)?;
                continue;
            }
            if self.complete_due_write() {
                continue;
            }
            break;
        }
        self.check()
    }

    fn is_paused(&self, replica: usize) -> bool {
        self.paused_until[replica] > self.now
    }

    fn client_endpoint(&self, index: usize) -> Endpoint {
        Endpoint(u16::from(self.options.replica_count) + index as u16)
    }

    fn drive_clients(&mut self) {
        for index in 0..self.clients.len() {
            let client = &self.clients[index];
            let due = !client.waiting || self.now - client.sent_tick >= self.options.client_retry_ticks;
            let finished = !client.waiting && client.session.is_some();
            if !due || (self.draining && finished) {
                continue;
            }
            let mut client = self.clients[index].clone();
            if !client.waiting {
                if client.session.is_some() {
                    client.request += 1;
                }
                client.waiting = true;
            }
            client.sent_tick = self.now;
            let mut header = Header::new(Command::Request, SIM_CLUSTER);
            header.group = SIM_GROUP;
            header.client = client.id;
            header.request = client.request;
            header.operation = if client.session.is_some() {
                1
            } else {
                OPERATION_REGISTER
            };
            header.context = u128::from(client.session.unwrap_or(0));
            let body_len = self.clients_prng.below(64) as usize;
            let body: Vec<u8> = (0..body_len)
                .map(|i| (i as u8) ^ (client.request as u8))
                .collect();
            let message = Message::new(header, Arc::from(body));
            // Clients do not know the primary: they send to every replica.
            let from = self.client_endpoint(index);
            for replica in 0..self.replicas.len() {
                self.network
                    .send(self.now, from, Endpoint(replica as u16), message.clone());
            }
            self.clients[index] = client;
        }
    }

    fn deliver(&mut self, from: Endpoint, to: Endpoint, message: Message) -> Result<(), Violation> {
        self.trace.record_u64(u64::from(from.0) << 16 | u64::from(to.0));
        self.trace.record_bytes(&message.header.checksum.to_le_bytes());
        let replica_count = u16::from(self.options.replica_count);
        if to.0 < replica_count {
            let replica = usize::from(to.0);
            if self.is_paused(replica) {
                return Ok(());
            }
            self.replicas[replica].on_message(&message);
            self.collect(replica);
            return Ok(());
        }
        let index = usize::from(to.0 - replica_count);
        self.on_reply(index, &message)
    }

    fn on_reply(&mut self, index: usize, reply: &Message) -> Result<(), Violation> {
        let header = reply.header;
        let client = &mut self.clients[index];
        if header.command != Command::Reply
            || header.client != client.id
            || !client.waiting
            || header.request != client.request
        {
            return Ok(());
        }
        if header.operation == crate::constants::OPERATION_SESSION_EVICTED {
            // An evicted client starts over as a new client, so no reply meant for its old
            // identity (a late register reply, say) can be mistaken for one to the new.
            client.id += CLIENT_ID_STRIDE;
            client.session = None;
            client.request = 0;
            client.waiting = false;
            return Ok(());
        }
        if client.session.is_none() {
            if header.operation != OPERATION_REGISTER {
                return Ok(());
            }
            client.session = Some(header.op);
        }
        client.waiting = false;
        self.replies += 1;
        self.trace.record_str("reply");
        self.trace.record_u64(header.op);
        self.check_reply(header.op, header.context)
    }

    /// A reply names op `op` and the prepare checksum it answers.
    fn check_reply(&mut self, op: u64, checksum: u128) -> Result<(), Violation> {
        match self.canonical.get(&op) {
            Some(&canonical) if canonical == checksum => Ok(()),
            Some(_) => Err(self.violation(format!(
                "a client was answered for op {op} with a prepare that is not the committed one"
            ))),
            None => {
                self.unconfirmed_replies.push((op, checksum));
                Ok(())
            }
        }
    }

    /// Turn a replica's outputs into network sends and storage writes, and check it.
    fn collect(&mut self, replica: usize) {
        if self.found.is_none()
            && let Err(violation) = self.check_replica(replica)
        {
            self.found = Some(violation);
        }
        let from = Endpoint(replica as u16);
        for output in self.replicas[replica].take_outputs() {
            match output {
                Output::Send { to, message } => {
                    let to = match to {
                        Destination::Replica(to) => Endpoint(u16::from(to)),
                        Destination::Client(client) => {
                            let index = ((client - CLIENT_ID_BASE) % CLIENT_ID_STRIDE) as u16;
                            Endpoint(u16::from(self.options.replica_count) + index)
                        }
                    };
                    self.network.send(self.now, from, to, message);
                }
                Output::WritePrepare { message } => {
                    let kind = WriteKind::Prepare {
                        op: message.header.op,
                        checksum: message.header.checksum,
                    };
                    self.schedule_write(replica, kind);
                }
                Output::WriteDurable { state } => {
                    self.durable_pending[replica] = Some(state);
                    let kind = WriteKind::Durable {
                        view: state.view,
                        log_view: state.log_view,
                        commit_max: state.commit_max,
                    };
                    self.schedule_write(replica, kind);
                }
            }
        }
    }

    fn schedule_write(&mut self, replica: usize, kind: WriteKind) {
        let latency = self
            .storage_latency
            .exponential_ticks(self.options.write_ticks_mean);
        self.write_sequence += 1;
        self.writes.push(PendingWrite {
            due: std::cmp::Reverse((self.now + latency, self.write_sequence)),
            replica: replica as u8,
            kind,
        });
    }

    /// Complete the earliest write due by now on a replica that is not paused.
    fn complete_due_write(&mut self) -> bool {
        let Some(next) = self.writes.peek() else {
            return false;
        };
        let (due, _) = next.due.0;
        if due > self.now {
            return false;
        }
        let write = self.writes.pop().expect("peeked");
        let replica = usize::from(write.replica);
        if self.is_paused(replica) {
            // A paused replica's disk waits with it.
            self.write_sequence += 1;
            self.writes.push(PendingWrite {
                due: std::cmp::Reverse((self.paused_until[replica], self.write_sequence)),
                ..write
            });
            return true;
        }
        self.trace.record_u64(write.replica as u64);
        match write.kind {
            WriteKind::Prepare { op, checksum } => {
                self.trace.record_u64(op);
                self.replicas[replica].on_prepare_written(op, checksum);
            }
            WriteKind::Durable { .. } => {
                let state = self.durable_pending[replica]
                    .take()
                    .expect("a durable write in flight");
                self.trace.record_u64(u64::from(state.view));
                self.replicas[replica].on_durable_written(state);
            }
        }
        self.collect(replica);
        true
    }

    /// The per-tick checkers.
    fn check(&mut self) -> Result<(), Violation> {
        if let Some(violation) = self.found.take() {
            return Err(violation);
        }
        for replica in 0..self.replicas.len() {
            self.check_replica(replica)?;
        }
        Ok(())
    }

    /// The checkers for one replica, run after every input it takes: a slot it applied can be
    /// reused by a later op in the next input, so commits are checked before that can happen.
    fn check_replica(&mut self, replica: usize) -> Result<(), Violation> {
        let view = self.replicas[replica].view();
        if view < self.last_view[replica] {
            return Err(self.violation(format!(
                "replica {replica}'s view went back from {} to {view}",
                self.last_view[replica]
            )));
        }
        self.last_view[replica] = view;
        let commit_min = self.replicas[replica].commit_min();
        if commit_min < self.checked_commit[replica] {
            return Err(self.violation(format!(
                "replica {replica}'s commit point went back from {} to {commit_min}",
                self.checked_commit[replica]
            )));
        }
        for op in self.checked_commit[replica] + 1..=commit_min {
            let Some(header) = self.replicas[replica].committed_header(op) else {
                return Err(self.violation(format!(
                    "replica {replica} committed op {op} but holds no header for it: {}",
                    self.replicas[replica].describe()
                )));
            };
            match self.canonical.get(&op) {
                Some(&canonical) if canonical != header.checksum => {
                    return Err(self.violation(format!(
                        "replica {replica} committed op {op} with a different prepare than the canonical log"
                    )));
                }
                Some(_) => {}
                None => {
                    self.canonical.insert(op, header.checksum);
                }
            }
        }
        self.checked_commit[replica] = commit_min;
        Ok(())
    }

    fn violation(&self, what: String) -> Violation {
        Violation { tick: self.now, what }
    }

    fn replica_summary(&self) -> String {
        self.replicas
            .iter()
            .map(|replica| format!("[{}]", replica.describe()))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Run seed `seed` with the options it draws.
pub fn run_seed(seed: u64) -> Result<Outcome, Violation> {
    Simulation::new(seed, SimOptions::from_seed(seed)).run()
}
