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
//!   resume with their memory intact;
//! - replicas crash: memory is lost, and every write not yet synced is lost, made durable or
//!   torn (`sim/storage.rs`). After a random span the replica restarts from what its disk
//!   holds (`Replica::recover`), in status recovering. At most `f` replicas are crashed or
//!   recovering at once, so a quorum can always form a view and answer their probes.
//! - Network faults and pauses may hit any number of replicas at once: safety must hold
//!   whatever the network does. Liveness is checked only after the final heal.
//!
//! Every replica writes real bytes: prepares and their redundant headers to the journal
//! rings, each superblock copy in turn (each synced before the next, so a crash can leave the
//! copies at two sequences), checkpoints to two alternating slots. State transfer copies a
//! reachable peer's durable checkpoint bytes.
//!
//! Checkers (a violation ends the run with [`Violation`]):
//! - one canonical committed log: the first replica to commit an op fixes its checksum; every
//!   replica's committed prefix must match it op by op;
//! - a replica's commit point never moves back, and its view never decreases, except across a
//!   restart: then its durable view must not be below any durable view it had, and its
//!   commit point restarts at its checkpoint, whose prepare must be the canonical one;
//! - the state machine's state after op `o` is the same on every replica that applied (or
//!   restored, or state-transferred) up to `o`;
//! - every reply a client accepted names an op whose canonical checksum is the prepare it
//!   answers;
//! - liveness: after the final heal, every client's request completes within
//!   [`SimOptions::liveness_ticks_max`];
//! - a run in which nothing committed fails: an empty comparison is not a pass.

use super::log_store::{Opened, SimLog};
use super::network::{Endpoint, Network, NetworkOptions};
use super::prng::{PPM, Prng, Streams, stream_names};
use super::storage::{Storage, StorageLayout, StorageOptions, Zone};
use super::trace::TraceHash;
use crate::checkpoint::Checkpoint;
use crate::constants::{OPERATION_REGISTER, SUPERBLOCK_COPIES, Shape};
use crate::durable::{self, COPY_SIZE, Chosen, DurableState};
use crate::header::{Command, Header, Message};
use crate::journal::{SlotState, classify_slot, read_back, slot_of};
use crate::replica::{Bugs, Config, Destination, Output, Recovered, Replica, StateMachine, TransferredLog};
use bytes::Bytes;
use std::collections::{BTreeMap, BinaryHeap};
use xxhash_rust::xxh3::xxh3_64;

/// The cluster id of simulated runs.
pub const SIM_CLUSTER: u128 = 0x5EED_C1A5_7E70;
pub const SIM_GROUP: u64 = 1;
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
    /// Per tick and replica: chance that it crashes (within the fault budget).
    pub crash_ppm: u32,
    pub crash_down_ticks_mean: u64,
    /// What a crash does to unsynced writes.
    pub storage: StorageOptions,
    /// Per tick and replica: chance that its next sync fails (within the fault budget). A
    /// failed sync is fatal: the replica crashes at once, and the crash decides what became
    /// of every write the sync covered.
    pub sync_fail_ppm: u32,
    /// Per tick, while no replica is faulty: chance that every replica crashes at once (a
    /// power loss). Only unsynced writes suffer; no disk is wiped or flipped with it.
    pub power_loss_ppm: u32,
    /// Per crash: chance that the disk is replaced by a blank one (the replica restarts
    /// wiped).
    pub wipe_ppm: u32,
    /// Per crash: chance that a bit flips in one journal slot (prepare or redundant header),
    /// drawn again for a second and third slot; and that one superblock copy gets a flip.
    pub journal_flip_ppm: u32,
    pub superblock_flip_ppm: u32,
    /// Ticks a client waits for a reply before sending the request again.
    pub client_retry_ticks: u64,
    /// Protocol bugs to inject (mutation tests only).
    pub bugs: Bugs,
    /// The group's shape (journal, pipeline, checkpoint interval, client table).
    pub shape: Shape,
    /// Log journal: complete each replica's prepare writes in the order asked, as a log's
    /// writer does. On for even seeds: the odd ones keep exploring completions in any order,
    /// which the core must handle too. (Seed 5 021 537 with it on found the view change's
    /// nack-cut liveness gap, fixed by the durable log suffix.)
    pub log_writes_in_order: bool,
    /// Per tick and replica: chance that the shell asks for a checkpoint now
    /// (`Replica::checkpoint_now`), off the interval. Drawn for groups of one, which is where
    /// the partition shell asks for them; 0 with peers, where replicas' checkpoints would
    /// then stop being at the same ops, and a whole-cluster power loss can leave a replica
    /// whose state transfer discards the log above the installed checkpoint while that log
    /// holds committed ops the others lack (seed 29 737 with 2 399 ppm stalls its view change
    /// that way; see `docs/replication.md`, "Where it stands").
    pub forced_checkpoint_ppm: u32,
    /// Mutation test of the poll checker (a caller's log only): a replica serves polls from
    /// its log up to its head, not only up to its commit point.
    pub poll_above_commit_point: bool,
    /// A caller's log: per state transfer, chance that the offer is stale or forked (the
    /// segments up to an older op, or from another replica's log), which the receiver must
    /// refuse by checking the offer against the checkpoint it installs.
    pub stale_offer_ppm: u32,
}

impl SimOptions {
    /// The options a seed runs with: the shape and fault rates are drawn from the seed too
    /// (swarm testing), so seeds differ in kind as well as in detail.
    pub fn from_seed(seed: u64) -> SimOptions {
        let mut prng = Streams::new(seed).stream("options");
        let replica_count = if prng.chance_ppm(PPM / 4) { 5 } else { 3 };
        let endpoint_count = u16::from(replica_count) + 3;
        // Disk-fault rates draw from a stream of their own, so adding them left every other
        // option of a seed as it was.
        let mut disk = Streams::new(seed).stream("disk_fault_options");
        SimOptions {
            replica_count,
            client_count: CLIENTS_PER_RUN as u16,
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
            crash_ppm: prng.below(u64::from(PPM / 400)) as u32,
            crash_down_ticks_mean: prng.range_inclusive(5, 300),
            storage: StorageOptions::default(),
            sync_fail_ppm: prng.below(u64::from(PPM / 1_000)) as u32,
            power_loss_ppm: disk.below(u64::from(PPM / 2_000)) as u32,
            wipe_ppm: disk.below(u64::from(PPM / 8)) as u32,
            journal_flip_ppm: disk.below(u64::from(PPM / 2)) as u32,
            superblock_flip_ppm: disk.below(u64::from(PPM / 3)) as u32,
            client_retry_ticks: 60,
            bugs: Bugs::default(),
            shape: shape_from_seed(seed),
            log_writes_in_order: seed.is_multiple_of(2),
            // With peers, checkpoints off the interval are not used yet (see
            // `forced_checkpoint_ppm`).
            forced_checkpoint_ppm: 0,
            poll_above_commit_point: false,
            stale_offer_ppm: 0,
        }
    }
}

/// The group shape a seed runs: half of the seeds the metadata group's, the other half one
/// drawn from the ranges the protocol allows (small journals that wrap often, checkpoints
/// every op or rarely, pipelines of one to a dozen prepares, client tables just large enough
/// for the workload). A stream of its own, so every other option of a seed is as it was.
fn shape_from_seed(seed: u64) -> Shape {
    let mut prng = Streams::new(seed).stream("shape_options");
    if prng.chance_ppm(PPM / 2) {
        return Shape::METADATA;
    }
    let pipeline_prepares_max = prng.range_inclusive(1, 12) as usize;
    let checkpoint_interval_ops = prng.range_inclusive(1, 48);
    let journal_floor = checkpoint_interval_ops as usize + 2 * pipeline_prepares_max + 1;
    let journal_slots = journal_floor + prng.range_inclusive(0, 64) as usize;
    let shape = Shape {
        message_size_max: Shape::METADATA.message_size_max,
        journal_slots,
        pipeline_prepares_max,
        checkpoint_interval_ops,
        // The workload's clients each keep a session; fewer entries would have them evict
        // each other without end.
        clients_max: CLIENTS_PER_RUN + prng.range_inclusive(0, 4) as usize,
        // Half of the drawn shapes journal to a log, as a partition group does.
        log_journal: prng.chance_ppm(PPM / 2),
    };
    debug_assert_eq!(shape.check(), Ok(()));
    shape
}

/// Clients of one simulated run (`SimOptions::client_count` is never more).
const CLIENTS_PER_RUN: usize = 3;

impl SimOptions {
    /// A cluster of one (what a server without cluster configuration runs), from a seed's
    /// options. With f = 0 its only crash is a whole-cluster power loss, and nothing could
    /// repair a flipped bit or a wiped disk, so those are off; partitions need two replicas.
    /// Every other fault stays, with power losses at least 1 in 2 000 ticks.
    pub fn one_replica(seed: u64) -> SimOptions {
        let mut options = SimOptions::from_seed(seed);
        options.replica_count = 1;
        options.network.endpoint_count = 1 + options.client_count;
        options.wipe_ppm = 0;
        options.journal_flip_ppm = 0;
        options.superblock_flip_ppm = 0;
        options.partition_ppm = 0;
        options.power_loss_ppm = options.power_loss_ppm.max(PPM / 2_000);
        // Its own stream, so adding it left every other option of a seed as it was. Off for
        // half the seeds.
        let mut checkpoints = Streams::new(seed).stream("checkpoint_options");
        if checkpoints.chance_ppm(PPM / 2) {
            options.forced_checkpoint_ppm = checkpoints.below(20_000) as u32;
        }
        options
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
    /// Replica crashes (each followed by a restart from storage).
    pub crashes: u64,
    /// Power losses: every replica crashed at once (each counted in `crashes` too).
    pub power_losses: u64,
    /// Syncs that failed (each crashed its replica; counted in `crashes` too).
    pub syncs_failed: u64,
    /// Crashes after which the replica restarted on a blank disk.
    pub wipes: u64,
    /// Bits flipped in journal slots and superblock copies of crashed replicas (or in a
    /// caller's log files).
    pub bits_flipped: u64,
    /// Caller's logs refused for damage at a restart and set aside whole: the replica was
    /// rebuilt from its peers.
    pub quarantines: u64,
    /// Checkpoints made durable, summed over replicas (state transfers included).
    pub checkpoints: u64,
    /// Checkpoints installed from a peer.
    pub state_transfers: u64,
    /// Of those, by a log journal that kept its own log (it held the checkpoint's op).
    pub state_transfers_keeping_log: u64,
    /// Prepares read back from a journal (applied bodies leave memory; peers' repairs and
    /// retransmissions read them).
    pub prepare_reads: u64,
    /// Each replica's commit point at the end of the run (a caller's checkers compare what
    /// its logs hold up to them).
    pub commit_points: Vec<u64>,
    /// Log journal: each replica's `Replica::log_written_end` at the end of the run.
    pub log_written_ends: Vec<u64>,
    /// Log journals cut by a write at or below their end (`Shape::log_journal`).
    pub log_truncations: u64,
    /// Unsynced writes a crash lost, summed over replicas.
    pub writes_lost: u64,
    /// Unsynced writes a crash tore (some sectors landed, some not), summed over replicas.
    pub writes_torn: u64,
}

/// The state machine replicas run in the simulator: a hash chain of every applied op, so two
/// replicas that applied different ops (or the same ops differently) disagree.
///
/// It also mints ids the way a partition mints offsets: the primary's `prepare` takes one to
/// four ids from the cursor and writes the range in front of the body. Applied ops must
/// continue exactly where the previous one ended, or an id was minted twice (or skipped)
/// among committed ops: [`SimMachine::fault`] says so.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChainMachine {
    pub state: u64,
    pub applied: u64,
    /// The next id an applied op must start at.
    pub next_id: u64,
    /// The first minting fault seen (never cleared; not part of the snapshot).
    pub minting_fault: Option<String>,
}

/// Bytes a minted range takes in front of a `ChainMachine` prepare's body.
const MINTED_RANGE_SIZE: usize = 16;

/// A state machine the simulator can run: what its clients send, and a digest of its state
/// that the checkers compare across replicas after every applied op.
pub trait SimMachine: StateMachine + Default {
    /// Equal for equal states; differs (with overwhelming likelihood) otherwise.
    fn digest(&self) -> u64;

    /// A client's next request: its operation (not `OPERATION_REGISTER`) and body, at most
    /// `body_max` bytes, drawn from `prng` only (so a seed replays). `request` is the client's
    /// request number.
    fn request(prng: &mut Prng, request: u64, body_max: usize) -> (u8, Vec<u8>);

    /// A rule the machine saw broken while applying (an id minted twice), if any.
    fn fault(&self) -> Option<&str> {
        None
    }
}

impl SimMachine for ChainMachine {
    fn digest(&self) -> u64 {
        self.state
    }

    fn fault(&self) -> Option<&str> {
        self.minting_fault.as_deref()
    }

    fn request(prng: &mut Prng, request: u64, body_max: usize) -> (u8, Vec<u8>) {
        // Mostly small; a quarter large enough that the prepare spans two sectors, so a
        // crash can tear it (a one-sector write is atomic).
        let body_len = if prng.chance_ppm(PPM / 4) {
            prng.range_inclusive(300, body_max as u64) as usize
        } else {
            prng.below(64) as usize
        };
        let body = (0..body_len).map(|i| (i as u8) ^ (request as u8)).collect();
        (1, body)
    }
}

impl StateMachine for ChainMachine {
    fn prepare(
        &self,
        _op: u64,
        _timestamp: u64,
        _operation: u8,
        input: Bytes,
        cursor: u128,
    ) -> (Bytes, u128) {
        let count = 1 + (input.len() % 4) as u64;
        let mut body = Vec::with_capacity(MINTED_RANGE_SIZE + input.len());
        let cursor = cursor as u64;
        body.extend_from_slice(&cursor.to_le_bytes());
        body.extend_from_slice(&count.to_le_bytes());
        body.extend_from_slice(&input);
        (Bytes::from(body), u128::from(cursor + count))
    }

    fn apply(&mut self, op: u64, _timestamp: u64, operation: u8, input: &[u8]) -> Vec<u8> {
        match (input.get(0..8), input.get(8..MINTED_RANGE_SIZE)) {
            (Some(first), Some(count)) => {
                let first = u64::from_le_bytes(first.try_into().expect("8 bytes"));
                let count = u64::from_le_bytes(count.try_into().expect("8 bytes"));
                if first != self.next_id && self.minting_fault.is_none() {
                    self.minting_fault = Some(format!(
                        "op {op} applies ids from {first}, but the ops before it ended at {}: minted twice or skipped",
                        self.next_id
                    ));
                }
                self.next_id = first + count;
            }
            _ => {
                if self.minting_fault.is_none() {
                    self.minting_fault = Some(format!("op {op} carries no minted range"));
                }
            }
        }
        let mut bytes = Vec::with_capacity(input.len() + 25);
        bytes.extend_from_slice(&self.state.to_le_bytes());
        bytes.extend_from_slice(&op.to_le_bytes());
        bytes.push(operation);
        bytes.extend_from_slice(input);
        self.state = xxh3_64(&bytes);
        self.applied += 1;
        self.state.to_le_bytes().to_vec()
    }

    fn snapshot(&self) -> Vec<u8> {
        let mut bytes = self.state.to_le_bytes().to_vec();
        bytes.extend_from_slice(&self.applied.to_le_bytes());
        bytes.extend_from_slice(&self.next_id.to_le_bytes());
        bytes
    }

    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String> {
        if snapshot.len() != 24 {
            return Err(format!("a chain snapshot is 24 bytes, not {}", snapshot.len()));
        }
        let word = |at: usize| u64::from_le_bytes(snapshot[at..at + 8].try_into().expect("8 bytes"));
        self.state = word(0);
        self.applied = word(8);
        self.next_id = word(16);
        Ok(())
    }
}

/// Largest prepare the simulated clients produce, rounded up to whole sectors.
const PREPARE_SLOT_BYTES: u32 = 1024;
/// Largest request body the simulated clients send: a prepare of it fills most of a slot.
const PREPARE_BODY_MAX: usize = 744;
/// Most bytes a simulated machine's `prepare` adds to a request's body (a minted range).
const PREPARE_GROWTH_MAX: usize = MINTED_RANGE_SIZE;
const _: () = assert!(
    crate::constants::HEADER_SIZE + PREPARE_BODY_MAX + PREPARE_GROWTH_MAX <= PREPARE_SLOT_BYTES as usize
);
/// Largest checkpoint of a simulated replica: a header, the chain snapshot and a client table
/// of a few small replies.
const CHECKPOINT_SLOT_BYTES: u32 = 64 * 1024;

/// What the harness keeps of one replica besides the replica itself: its disk and where its
/// superblock stands.
struct Host {
    storage: Storage,
    /// The durable state and sequence every superblock copy holds (after the last complete
    /// write or the boot repair); `None` while the copies are blank.
    superblock: Option<(DurableState, u64)>,
    /// A superblock write in progress: the state, its sequence and the bytes of each copy.
    superblock_writing: Option<(DurableState, u64, Box<[u8; COPY_SIZE]>)>,
    /// Bumped at every crash: completions scheduled before it are dropped.
    epoch: u64,
    /// Crashed: takes no input until this tick, then restarts from its disk.
    down_until: Option<u64>,
    /// Its next sync will fail (it counts against the fault budget from now on).
    sync_failure_armed: bool,
    /// The highest durable view it ever had (views must not go back across restarts).
    durable_view_max: u32,
    /// Log journal (`Shape::log_journal`): the op at the end of the prepares log as written
    /// (pending writes included). A write at or below it cuts the log there first; a write
    /// above the next op would leave a gap no log can have, and is a violation.
    log_end: u64,
    /// Log journal: when its last prepare write is due. Later ones are due no earlier, so
    /// completions come in the order asked, as a log's writer reports them.
    log_write_due: u64,
    /// Log journal kept by the caller's [`SimLog`] (a partition's segment log) instead of
    /// the disk's log zone.
    log: Option<Box<dyn SimLog>>,
    /// A state transfer's staged log waiting for the superblock naming its checkpoint (op,
    /// checkpoint checksum); the write that names it makes the staged log live.
    install_pending: Option<(u64, u128)>,
}

impl Host {
    /// The zone storage replaced by a blank disk (a wipe, or a caller's log that set its whole
    /// group aside): no superblock, no log, no durable view to hold the replica to.
    fn forget_durable_state(&mut self) {
        self.storage.wipe();
        self.superblock = None;
        self.log_end = 0;
        self.durable_view_max = 0;
    }

    /// Log journal: cut the prepares log so it ends at `from_op - 1` (truncate, synced, and
    /// the cut slots zeroed: `Storage::truncate_log`).
    fn cut_log(&mut self, from_op: u64, journal_slots: usize) {
        if self.log.is_some() {
            // The caller's log cuts itself when the next op is written at or below its end.
            self.log_end = from_op - 1;
            return;
        }
        let cut: Vec<u32> = (from_op..=self.log_end.min(from_op + journal_slots as u64 - 1))
            .map(|op| slot_of(op, journal_slots) as u32)
            .collect();
        self.storage.truncate_log(&cut);
        self.log_end = from_op - 1;
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
    /// The replica's epoch when it was scheduled; a crash since drops it.
    epoch: u64,
    kind: WriteKind,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum WriteKind {
    /// The prepare and its header are in the page cache: sync, then report.
    Prepare { op: u64, checksum: u128 },
    /// Write superblock copy `copy` of the write in progress and sync it.
    DurableCopy { copy: usize },
    /// The checkpoint is in the page cache: sync, then report.
    Checkpoint { op: u64, checksum: u128 },
    /// Fetch a peer's checkpoint above `above_op`.
    StateTransfer { above_op: u64, commit_max: u64 },
    /// Read a prepare back from the journal (what is there when the read completes).
    ReadPrepare {
        op: u64,
        checksum: u128,
        for_replica: Option<u8>,
    },
}

/// The simulator with the hash-chain machine (what the protocol tests run).
pub type Simulation = Sim<ChainMachine>;

/// A whole simulated cluster running state machine `M`.
pub struct Sim<M: SimMachine> {
    options: SimOptions,
    replicas: Vec<Replica<M>>,
    hosts: Vec<Host>,
    crashes: Prng,
    nonces: Prng,
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
    /// When the shell asks a replica for a checkpoint off the interval.
    forced_checkpoints: Prng,
    now: u64,
    trace: TraceHash,
    /// The canonical committed log: op → prepare checksum.
    canonical: BTreeMap<u64, u128>,
    /// The state machine's state after each committed op, as the first replica to reach it
    /// had it.
    canonical_state: BTreeMap<u64, u64>,
    /// Per replica: how far its committed prefix was checked, and its last view.
    checked_commit: Vec<u64>,
    /// A caller's log: per replica, the last op whose polls were checked, and what a poll
    /// served of each op first (every later serve of the op, on any replica, must match).
    served_through: Vec<u64>,
    canonical_served: BTreeMap<u64, u64>,
    last_view: Vec<u32>,
    replies: u64,
    /// Replies whose op was not yet in the canonical log when they arrived.
    unconfirmed_replies: Vec<(u64, u128)>,
    /// After the final heal: clients finish what they started (and register if they must) but
    /// start no new requests, so "everything completed" is a state the run can reach.
    draining: bool,
    /// The first violation found between ticks; reported at the end of the tick.
    found: Option<Violation>,
    crash_count: u64,
    power_loss_count: u64,
    sync_failure_count: u64,
    /// Per replica, since its last restart.
    sent: Vec<Sent>,
    state_transfers_by: Vec<u64>,
    wipe_count: u64,
    flip_count: u64,
    quarantine_count: u64,
    checkpoint_count: u64,
    state_transfer_count: u64,
    /// State transfers of a log journal that kept the replica's log (it held the op).
    state_transfers_keeping_log: u64,
    /// Log journals cut by a write at or below their end.
    log_truncations: u64,
    prepare_reads: u64,
}

impl<M: SimMachine> Sim<M> {
    pub fn new(seed: u64, options: SimOptions) -> Sim<M> {
        Sim::build(seed, options, None)
    }

    /// A cluster whose replicas keep their log journal in the logs `make_log` gives (one per
    /// replica, by index), in place of the disk's log zone (`Shape::log_journal` only).
    pub fn with_logs(seed: u64, options: SimOptions, make_log: &dyn Fn(u8) -> Box<dyn SimLog>) -> Sim<M> {
        assert!(options.shape.log_journal, "a caller's log serves a log journal");
        Sim::build(seed, options, Some(make_log))
    }

    fn build(seed: u64, options: SimOptions, make_log: Option<&dyn Fn(u8) -> Box<dyn SimLog>>) -> Sim<M> {
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
                    shape: options.shape,
                    bugs: options.bugs,
                };
                Replica::new(config, M::default())
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
        let layout = StorageLayout::journal(
            options.shape.journal_slots,
            COPY_SIZE as u32,
            PREPARE_SLOT_BYTES,
            CHECKPOINT_SLOT_BYTES,
        );
        let hosts = (0..replica_count)
            .map(|replica| {
                let mut storage = Storage::new(
                    layout,
                    options.storage,
                    streams.stream_indexed(stream_names::STORAGE_FAULTS, u64::from(replica)),
                );
                // Format: sequence 1 of the formatted state in every copy.
                let state = DurableState::formatted(SIM_CLUSTER, replica, replica_count);
                let (sequence, bytes) = durable::plan_format(&state).expect("a valid formatted state");
                for copy in 0..SUPERBLOCK_COPIES {
                    storage.write(Zone::Superblock, copy as u32, &bytes);
                    storage.sync().expect("formatting syncs never fail");
                }
                if options.shape.log_journal {
                    storage.set_log_zone(Zone::Prepares);
                }
                Host {
                    storage,
                    superblock: Some((state, sequence)),
                    superblock_writing: None,
                    epoch: 0,
                    down_until: None,
                    sync_failure_armed: false,
                    durable_view_max: 0,
                    log_end: 0,
                    log_write_due: 0,
                    log: make_log.map(|make_log| make_log(replica)),
                    install_pending: None,
                }
            })
            .collect();
        Sim {
            hosts,
            crashes: streams.stream("crash_faults"),
            nonces: streams.stream("nonces"),
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
            forced_checkpoints: streams.stream("forced_checkpoints"),
            now: 0,
            trace: TraceHash::new(),
            canonical: BTreeMap::new(),
            checked_commit: vec![0; n],
            served_through: vec![0; n],
            canonical_served: BTreeMap::new(),
            last_view: vec![0; n],
            replies: 0,
            unconfirmed_replies: Vec::new(),
            canonical_state: BTreeMap::new(),
            draining: false,
            found: None,
            crash_count: 0,
            power_loss_count: 0,
            sync_failure_count: 0,
            sent: vec![Sent::default(); n],
            state_transfers_by: vec![0; n],
            wipe_count: 0,
            flip_count: 0,
            quarantine_count: 0,
            checkpoint_count: 0,
            state_transfer_count: 0,
            state_transfers_keeping_log: 0,
            log_truncations: 0,
            prepare_reads: 0,
        }
    }

    /// Run the seed to the end: faults, the final heal, the liveness window.
    pub fn run(mut self) -> Result<Outcome, Violation> {
        while self.now < self.options.fault_ticks {
            self.inject_faults();
            self.step()?;
        }
        self.finish()
    }

    /// The end of a run: the final heal (every replica up and connected, no more faults),
    /// the liveness window, and the checks that need the whole run.
    pub fn finish(mut self) -> Result<Outcome, Violation> {
        for replica in 0..self.replicas.len() {
            if self.hosts[replica].down_until.is_some() {
                self.restart(replica)?;
            }
        }
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
            crashes: self.crash_count,
            power_losses: self.power_loss_count,
            syncs_failed: self.sync_failure_count,
            wipes: self.wipe_count,
            bits_flipped: self.flip_count,
            quarantines: self.quarantine_count,
            checkpoints: self.checkpoint_count,
            state_transfers: self.state_transfer_count,
            state_transfers_keeping_log: self.state_transfers_keeping_log,
            prepare_reads: self.prepare_reads,
            commit_points: self.replicas.iter().map(Replica::commit_min).collect(),
            log_written_ends: self.replicas.iter().map(Replica::log_written_end).collect(),
            log_truncations: self.log_truncations,
            writes_lost: self
                .hosts
                .iter()
                .map(|host| host.storage.counters().crash_writes_lost)
                .sum(),
            writes_torn: self
                .hosts
                .iter()
                .map(|host| host.storage.counters().crash_writes_torn)
                .sum(),
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
        if self.crashes.chance_ppm(self.options.power_loss_ppm) && self.faulty_count() == 0 {
            // Beyond the budget on purpose: every replica restarts recovering, nobody answers
            // a probe, and only the fallback election brings the group back.
            for replica in 0..replica_count {
                let span = 1 + self.crashes.exponential_ticks(self.options.crash_down_ticks_mean);
                self.crash(replica, span, false);
            }
            self.power_loss_count += 1;
            self.trace.record_str("power loss");
        }
        for replica in 0..replica_count {
            let f = (replica_count - 1) / 2;
            if self.crashes.chance_ppm(self.options.sync_fail_ppm)
                && self.hosts[replica].down_until.is_none()
                && !self.hosts[replica].sync_failure_armed
                && self.faulty_count() < f
            {
                self.hosts[replica].storage.fail_next_sync();
                self.hosts[replica].sync_failure_armed = true;
            }
            if self.crashes.chance_ppm(self.options.crash_ppm) && self.hosts[replica].down_until.is_none() {
                // Within the budget: at most f replicas crashed or recovering at once, so the
                // others can always form a view and answer the recovering replicas' probes.
                let f = (replica_count - 1) / 2;
                if self.faulty_count() < f {
                    let span = 1 + self.crashes.exponential_ticks(self.options.crash_down_ticks_mean);
                    self.crash(replica, span, true);
                }
            }
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
            if self.hosts[replica]
                .down_until
                .is_some_and(|until| until <= self.now)
            {
                self.restart(replica)?;
            }
            if !self.is_paused(replica) {
                if self.options.forced_checkpoint_ppm > 0
                    && self
                        .forced_checkpoints
                        .chance_ppm(self.options.forced_checkpoint_ppm)
                {
                    self.replicas[replica].checkpoint_now();
                }
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

    /// Paused, or crashed: it takes no input.
    fn is_paused(&self, replica: usize) -> bool {
        self.paused_until[replica] > self.now || self.hosts[replica].down_until.is_some()
    }

    /// Replicas that count against the fault budget: crashed, recovering, or still without
    /// durable copies of ops a flipped bit or a wipe destroyed.
    fn faulty_count(&self) -> usize {
        (0..self.replicas.len())
            .filter(|&replica| {
                let host = &self.hosts[replica];
                host.down_until.is_some() || host.sync_failure_armed || self.replicas[replica].is_repairing()
            })
            .count()
    }

    /// Crash `replica` for `span` ticks: its memory is gone, and every unsynced write is lost,
    /// durable or torn.
    fn crash(&mut self, replica: usize, span: u64, disk_faults: bool) {
        let host = &mut self.hosts[replica];
        host.storage.crash(&mut self.crashes);
        host.install_pending = None;
        if let Some(log) = host.log.as_mut() {
            log.crash(self.crashes.next_u64());
        }
        // Faults a crashed replica's disk may take while it is down. They count against the
        // budget like the crash itself: the replica is faulty until it recovers, and it
        // recovers only once it has installed a view and repaired its log.
        if !disk_faults {
            // Only the crash itself: unsynced writes lost, durable or torn.
        } else if self.crashes.chance_ppm(self.options.wipe_ppm) {
            host.forget_durable_state();
            if let Some(log) = host.log.as_mut() {
                log.wipe();
            }
            self.served_through[replica] = 0;
            self.wipe_count += 1;
            self.trace.record_str("wipe");
        } else if let Some(log) = host.log.as_mut() {
            // A caller's log: a bit flips in its files. Damage its open (or the scrub's pass
            // at the open) refuses sets the group aside, and the replica is rebuilt from its
            // peers (see `restart`).
            if self.crashes.chance_ppm(self.options.journal_flip_ppm) && log.flip(self.crashes.next_u64()) {
                self.flip_count += 1;
                self.trace.record_str("log flip");
            }
        } else {
            for _ in 0..3 {
                if self.crashes.chance_ppm(self.options.journal_flip_ppm) {
                    let zone = if self.crashes.chance_ppm(PPM / 2) {
                        Zone::Prepares
                    } else {
                        Zone::Headers
                    };
                    let slot = self.crashes.below(self.options.shape.journal_slots as u64) as u32;
                    host.storage.corrupt(zone, slot, &mut self.crashes);
                    self.flip_count += 1;
                }
            }
            // Never on blank copies: one flipped bit on a blank superblock is indistinguishable
            // from a damaged one, and the replica rightly refuses to boot.
            if self.crashes.chance_ppm(self.options.superblock_flip_ppm) && host.superblock.is_some() {
                let copy = self.crashes.below(SUPERBLOCK_COPIES as u64) as u32;
                host.storage.corrupt(Zone::Superblock, copy, &mut self.crashes);
                self.flip_count += 1;
            }
        }
        host.epoch += 1;
        host.superblock_writing = None;
        host.down_until = Some(self.now + span);
        self.crash_count += 1;
        self.trace.record_str("crash");
        self.trace.record_u64(replica as u64);
    }

    /// Restart `replica` from its disk, as a real boot would: choose the superblock and repair
    /// its copies first, find the checkpoint it names, classify every journal slot.
    fn restart(&mut self, replica: usize) -> Result<(), Violation> {
        let replica_u8 = replica as u8;
        let host = &mut self.hosts[replica];
        host.down_until = None;
        let copies: Vec<Vec<u8>> = (0..SUPERBLOCK_COPIES)
            .map(|copy| host.storage.read(Zone::Superblock, copy as u32))
            .collect();
        let copy_refs: [Option<&[u8]>; SUPERBLOCK_COPIES] =
            std::array::from_fn(|copy| Some(&copies[copy][..COPY_SIZE]));
        let chosen = durable::choose(&copy_refs, SIM_CLUSTER, replica_u8);
        let durable_state = match chosen {
            Ok(Chosen::Formatted {
                state,
                sequence,
                copies_to_repair,
                ..
            }) => {
                let bytes = durable::encode_copy(&state, sequence);
                for (copy, repair) in copies_to_repair.iter().enumerate() {
                    if *repair {
                        host.storage.write(Zone::Superblock, copy as u32, &bytes);
                        if host.storage.sync().is_err() {
                            // The boot fails; the replica stays down and boots again later.
                            host.sync_failure_armed = false;
                            host.storage.crash(&mut self.crashes);
                            if let Some(log) = host.log.as_mut() {
                                log.crash(self.crashes.next_u64());
                            }
                            host.down_until = Some(self.now + 1 + self.options.crash_down_ticks_mean);
                            self.sync_failure_count += 1;
                            self.trace.record_str("boot sync failed");
                            return Ok(());
                        }
                    }
                }
                host.superblock = Some((state.clone(), sequence));
                Some(state)
            }
            Ok(Chosen::Wiped) => {
                host.superblock = None;
                None
            }
            Err(refusal) => {
                return Err(self.violation(format!("replica {replica} refused to boot: {refusal}")));
            }
        };
        let checkpoint = durable_state
            .as_ref()
            .filter(|state| state.checkpoint_op > 0)
            .and_then(|state| named_checkpoint(&host.storage, state))
            .map(|(checkpoint, slot, _)| (checkpoint, slot));
        let journal_slots = self.options.shape.journal_slots;
        let prepare_checksum = checkpoint
            .as_ref()
            .map_or(0, |(checkpoint, _)| checkpoint.header.checksum);
        let named = durable_state
            .as_ref()
            .map(|state| (state.checkpoint_op, state.checkpoint_checksum, prepare_checksum));
        let mut durable_state = durable_state;
        let mut checkpoint = checkpoint;
        let opened = host.log.as_mut().map(|log| log.recover(named, journal_slots));
        let journal: Vec<SlotState> = if let Some(opened) = opened {
            match opened {
                // A wiped replica's log starts empty, as its journal does.
                Ok(Opened::Log(_)) if durable_state.is_none() => Vec::new(),
                Ok(Opened::Log(slots)) => slots,
                Ok(Opened::Quarantined(reason)) => {
                    // The group was set aside whole, superblock included: from here the replica
                    // is a wiped one, and the checkers take it as such.
                    host.forget_durable_state();
                    self.served_through[replica] = 0;
                    self.quarantine_count += 1;
                    self.trace.record_str("quarantine");
                    durable_state = None;
                    checkpoint = None;
                    let log = host.log.as_mut().expect("a caller's log");
                    match log.recover(None, journal_slots) {
                        Ok(Opened::Log(_)) => Vec::new(),
                        other => {
                            return Err(self.violation(format!(
                                "replica {replica} quarantined its log ({reason}), then could not start a blank one: {other:?}"
                            )));
                        }
                    }
                }
                Err(reason) => {
                    return Err(
                        self.violation(format!("replica {replica} refused to open its log: {reason}"))
                    );
                }
            }
        } else if durable_state.is_some() {
            (0..journal_slots)
                .map(|slot| {
                    let prepare = host.storage.read(Zone::Prepares, slot as u32);
                    let header = host.storage.read(Zone::Headers, slot as u32);
                    classify_slot(
                        slot,
                        journal_slots,
                        &prepare,
                        &header,
                        SIM_CLUSTER,
                        SIM_GROUP,
                        M::body_verifies,
                    )
                })
                .collect()
        } else {
            Vec::new()
        };
        // A log journal's shell may hand a whole prepare over as its header only, leaving the
        // body on disk to be read back (a partition recovers this way, to keep batches out of
        // memory): half of them here, chosen by the seed.
        let journal: Vec<SlotState> = if self.options.shape.log_journal {
            journal
                .into_iter()
                .map(|state| match state {
                    SlotState::Clean(prepare) if self.crashes.below(2) == 0 => {
                        SlotState::Durable(prepare.header)
                    }
                    other => other,
                })
                .collect()
        } else {
            journal
        };
        // A log ends at its last whole prepare (a torn tail is cut by the scan).
        host.log_end = journal
            .iter()
            .filter_map(|state| match state {
                SlotState::Clean(prepare) => Some(prepare.header.op),
                SlotState::Durable(header) => Some(header.op),
                _ => None,
            })
            .max()
            .unwrap_or(0)
            .max(durable_state.as_ref().map_or(0, |state| state.checkpoint_op));
        let nonce = u128::from(self.nonces.next_u64()) << 64 | 1;
        let config = *self.replicas[replica].config();
        let recovered = Recovered {
            durable: durable_state,
            checkpoint,
            journal,
            nonce,
        };
        let restarted = match Replica::recover(config, M::default(), recovered) {
            Ok(restarted) => restarted,
            Err(error) => {
                return Err(self.violation(format!("replica {replica} could not recover: {error}")));
            }
        };
        self.replicas[replica] = restarted;
        self.sent[replica] = Sent::default();
        self.trace.record_str("restart");
        self.trace.record_u64(replica as u64);
        // The checkers start again from what it recovered.
        let durable_view = self.replicas[replica].durable().view;
        if durable_view < self.hosts[replica].durable_view_max {
            return Err(self.violation(format!(
                "replica {replica}'s durable view went back across a restart, from {} to {durable_view}",
                self.hosts[replica].durable_view_max
            )));
        }
        self.last_view[replica] = self.replicas[replica].view();
        let commit_min = self.replicas[replica].commit_min();
        self.checked_commit[replica] = commit_min;
        if commit_min > 0 {
            let header = self.replicas[replica].committed_header(commit_min);
            match (header, self.canonical.get(&commit_min)) {
                (Some(header), Some(&canonical)) if header.checksum == canonical => {}
                (header, canonical) => {
                    return Err(self.violation(format!(
                        "replica {replica} restarted from a checkpoint at op {commit_min} that is not the canonical prepare: {:?} against {canonical:?}; {}",
                        header.map(|header| header.checksum),
                        self.replicas[replica].describe()
                    )));
                }
            }
            self.check_state(replica)?;
        }
        self.collect(replica);
        Ok(())
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
            // Drawn for a register too (its body is ignored), so the draws do not depend on
            // whether a client has a session.
            let (operation, body) = M::request(&mut self.clients_prng, client.request, PREPARE_BODY_MAX);
            debug_assert!(body.len() <= PREPARE_BODY_MAX);
            header.operation = if client.session.is_some() {
                operation
            } else {
                OPERATION_REGISTER
            };
            header.context = u128::from(client.session.unwrap_or(0));
            let message = Message::new(header, Bytes::from(body));
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
                // A paused replica's messages are lost; a crashed one's socket is closed.
                return Ok(());
            }
            self.replicas[replica].on_message(message);
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
                    if let Destination::Replica(_) = to {
                        if self.found.is_none()
                            && let Err(violation) = self.check_persisted_before_send(replica, &message.header)
                        {
                            self.found = Some(violation);
                        }
                        let sent = &mut self.sent[replica];
                        match message.header.command {
                            Command::PrepareOk => sent.prepare_oks += 1,
                            Command::StartViewChange => sent.start_view_changes += 1,
                            Command::DoViewChange => sent.do_view_changes += 1,
                            _ => {}
                        }
                    }
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
                    // The prepare into the page cache now, durable at the completion's sync;
                    // only then its redundant header, with a sync of its own. So a durable
                    // header implies a durable prepare, and a faulty slot whose header names
                    // an op is a damaged prepare, never merely an unfinished write.
                    let journal_slots = self.options.shape.journal_slots;
                    let op = message.header.op;
                    let slot = slot_of(op, journal_slots) as u32;
                    if self.options.shape.log_journal {
                        let host = &mut self.hosts[replica];
                        if op <= host.log_end {
                            // Truncate, then append: the log ends below `op` first.
                            host.cut_log(op, journal_slots);
                            self.log_truncations += 1;
                            self.trace.record_str("log cut");
                            self.trace.record_u64(op);
                        } else if op > host.log_end + 1 {
                            panic!(
                                "replica {replica} wrote op {op} to its log, whose end is op {}: a gap",
                                host.log_end
                            );
                        }
                        self.hosts[replica].log_end = op;
                    }
                    if let Some(log) = self.hosts[replica].log.as_mut() {
                        // Into the caller's log (a rewrite cuts it there first); the barrier
                        // comes with the completion.
                        // The caller's log takes no injected write faults: a refused write is
                        // the shell's or the core's bug (a gap, a write into a log being
                        // replaced).
                        if let Err(reason) = log.write(&message) {
                            self.found_between_ticks(format!(
                                "replica {replica} could not write op {op} to its log: {reason}"
                            ));
                            return;
                        }
                    } else {
                        self.hosts[replica]
                            .storage
                            .write(Zone::Prepares, slot, &message.encode());
                    }
                    let kind = WriteKind::Prepare {
                        op: message.header.op,
                        checksum: message.header.checksum,
                    };
                    self.schedule_write(replica, kind);
                }
                Output::WriteDurable { state } => {
                    let host = &mut self.hosts[replica];
                    assert!(
                        host.superblock_writing.is_none(),
                        "one superblock write at a time"
                    );
                    let planned = match &host.superblock {
                        Some((current, sequence)) => durable::plan_write(current, *sequence, &state),
                        None => durable::plan_format(&state),
                    };
                    let (sequence, bytes) = planned.expect("the replica asks only for valid successors");
                    host.superblock_writing = Some((state, sequence, Box::new(bytes)));
                    self.schedule_write(replica, WriteKind::DurableCopy { copy: 0 });
                }
                Output::WriteCheckpoint {
                    slot,
                    op,
                    checksum,
                    bytes,
                } => {
                    // A log journal's checkpoint stands for the log below it.
                    assert!(
                        !self.options.shape.log_journal || self.hosts[replica].log_end >= op,
                        "replica {replica} checkpoints op {op} with its log written to op {} only",
                        self.hosts[replica].log_end
                    );
                    self.hosts[replica]
                        .storage
                        .write(Zone::Checkpoints, u32::from(slot), &bytes);
                    self.schedule_write(replica, WriteKind::Checkpoint { op, checksum });
                }
                Output::StateTransfer { above_op, commit_max } => {
                    self.schedule_write(replica, WriteKind::StateTransfer { above_op, commit_max });
                }
                Output::ReadPrepare {
                    op,
                    checksum,
                    for_replica,
                } => {
                    self.schedule_write(
                        replica,
                        WriteKind::ReadPrepare {
                            op,
                            checksum,
                            for_replica,
                        },
                    );
                }
            }
        }
    }

    fn schedule_write(&mut self, replica: usize, kind: WriteKind) {
        let latency = self
            .storage_latency
            .exponential_ticks(self.options.write_ticks_mean);
        let mut due = self.now + latency;
        if self.options.log_writes_in_order
            && self.options.shape.log_journal
            && matches!(kind, WriteKind::Prepare { .. })
        {
            let host = &mut self.hosts[replica];
            due = due.max(host.log_write_due);
            host.log_write_due = due;
        }
        self.write_sequence += 1;
        self.writes.push(PendingWrite {
            due: std::cmp::Reverse((due, self.write_sequence)),
            replica: replica as u8,
            epoch: self.hosts[replica].epoch,
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
        if write.epoch != self.hosts[replica].epoch {
            // Scheduled before a crash: the crash already decided what reached the disk.
            return true;
        }
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
                if !self.sync_or_crash(replica) {
                    return true;
                }
                if let Some(log) = self.hosts[replica].log.as_mut() {
                    // One barrier over the log; a log's writer reports every write it was
                    // asked for, in order (the replica knows which a cut made dead).
                    // Failed barriers are injected through the disk's sync above; the log's own
                    // never fails unless the shell broke it.
                    if let Err(reason) = log.sync() {
                        self.found_between_ticks(format!("replica {replica}'s log barrier failed: {reason}"));
                        return true;
                    }
                    self.replicas[replica].on_prepare_written(op, checksum);
                    self.collect(replica);
                    return true;
                }
                let slot = slot_of(op, self.options.shape.journal_slots) as u32;
                let prepare = self.hosts[replica].storage.read(Zone::Prepares, slot);
                // Still this prepare? A later one may have replaced it in the slot since, and
                // its own completion writes its header.
                if Header::decode(&prepare).is_ok_and(|header| header.checksum == checksum) {
                    self.hosts[replica].storage.write(
                        Zone::Headers,
                        slot,
                        &prepare[..crate::constants::HEADER_SIZE],
                    );
                    if !self.sync_or_crash(replica) {
                        return true;
                    }
                    self.replicas[replica].on_prepare_written(op, checksum);
                } else if self.options.shape.log_journal {
                    // A log's writer reports every write it was asked for, in order, also one
                    // a later cut discarded (the replica knows it is dead).
                    self.replicas[replica].on_prepare_written(op, checksum);
                }
            }
            WriteKind::DurableCopy { copy } => {
                let host = &mut self.hosts[replica];
                let (_, _, bytes) = host
                    .superblock_writing
                    .as_ref()
                    .expect("a superblock write in progress");
                // Each copy is written and synced before the next: a crash tears at most one.
                host.storage.write(Zone::Superblock, copy as u32, &bytes[..]);
                if !self.sync_or_crash(replica) {
                    return true;
                }
                let host = &mut self.hosts[replica];
                if copy + 1 < SUPERBLOCK_COPIES {
                    self.schedule_write(replica, WriteKind::DurableCopy { copy: copy + 1 });
                } else {
                    let (state, sequence, _) = host
                        .superblock_writing
                        .take()
                        .expect("a superblock write in progress");
                    if host
                        .superblock
                        .as_ref()
                        .is_some_and(|(previous, _)| previous.checkpoint_op < state.checkpoint_op)
                    {
                        self.checkpoint_count += 1;
                    }
                    host.superblock = Some((state.clone(), sequence));
                    host.durable_view_max = host.durable_view_max.max(state.view);
                    self.trace.record_u64(u64::from(state.view));
                    if host.install_pending == Some((state.checkpoint_op, state.checkpoint_checksum)) {
                        // The commit point of a state transfer's install: its log goes live
                        // before the replica writes anything after the checkpoint.
                        host.install_pending = None;
                        let installed = host.log.as_mut().map_or(Ok(()), |log| log.commit_staged());
                        if let Err(reason) = installed {
                            self.found_between_ticks(format!(
                                "replica {replica} could not make its transferred log live: {reason}"
                            ));
                            return true;
                        }
                        self.trace.record_str("install committed");
                        // Its log is another now: every op it serves is checked again.
                        self.served_through[replica] = 0;
                    }
                    // Retention: the durable checkpoint lets the shell release the oldest
                    // segments (ops it never reads again, messages purged or trimmed).
                    let host = &mut self.hosts[replica];
                    if let Some(log) = host.log.as_mut()
                        && state.checkpoint_op > 0
                        && let Some((_, _, bytes)) = named_checkpoint(&host.storage, &state)
                        && let Err(reason) =
                            log.release(state.checkpoint_op, state.checkpoint_checksum, &bytes)
                    {
                        self.found_between_ticks(format!(
                            "replica {replica} could not release its log's oldest segments: {reason}"
                        ));
                        return true;
                    }
                    self.replicas[replica].on_durable_written(state);
                }
            }
            WriteKind::Checkpoint { op, checksum } => {
                self.trace.record_u64(op);
                if !self.sync_or_crash(replica) {
                    return true;
                }
                self.replicas[replica].on_checkpoint_written(op, checksum);
            }
            WriteKind::ReadPrepare {
                op,
                checksum,
                for_replica,
            } => {
                self.trace.record_u64(op);
                self.prepare_reads += 1;
                let slot = slot_of(op, self.options.shape.journal_slots) as u32;
                // What is there when the read completes: a slot reused since (a later lap, a
                // view change) answers `None`.
                let prepare = match self.hosts[replica].log.as_mut() {
                    Some(log) => log.read(op, checksum),
                    None => read_back(
                        &self.hosts[replica].storage.read(Zone::Prepares, slot),
                        op,
                        checksum,
                        M::body_verifies,
                    ),
                };
                self.replicas[replica].on_prepare_read(op, checksum, prepare, for_replica);
            }
            WriteKind::StateTransfer { above_op, commit_max } => {
                if let Some((peer, checkpoint, bytes, checksum)) =
                    self.peer_checkpoint(replica, above_op, commit_max)
                {
                    self.trace.record_str("state transfer");
                    // A log journal keeps its log when it already holds the checkpoint's op
                    // durably (its redundant header written after the prepare's sync);
                    // otherwise the peer's log, ending exactly at the checkpoint, replaces it
                    // (a partition receives the segments).
                    let log =
                        match self.log_holds_prepare(replica, checkpoint.op(), checkpoint.header.checksum) {
                            true => TransferredLog::Kept,
                            false => TransferredLog::Replaced,
                        };
                    let staged = log == TransferredLog::Replaced && self.hosts[replica].log.is_some();
                    // A shell stages only what the core can take: a checkpoint above what it
                    // applied (a marked staging whose checkpoint the replica reaches on its
                    // own must never be mistaken for one its superblock committed).
                    let takes = checkpoint.op() > self.replicas[replica].commit_min();
                    if staged
                        && !(takes && self.stage_peer_log(replica, peer, checkpoint.op(), &bytes, checksum))
                    {
                        // Nothing staged (the peer could not offer it, or the staging was
                        // refused): the replica asks again later.
                        self.collect(replica);
                        return true;
                    }
                    let installed = self.replicas[replica].on_state_transferred(&bytes, checksum, log);
                    if installed {
                        self.state_transfer_count += 1;
                        self.state_transfers_by[replica] += 1;
                        // The checkpoint's op (the replica may have applied ops above it
                        // from memory since).
                        let checkpoint_op = self.replicas[replica].durable_checkpoint_target();
                        if self.options.shape.log_journal && log == TransferredLog::Replaced {
                            self.hosts[replica].cut_log(checkpoint_op + 1, self.options.shape.journal_slots);
                            if staged {
                                self.hosts[replica].install_pending = Some((checkpoint_op, checksum));
                            }
                        } else if self.options.shape.log_journal {
                            // The log holds the checkpoint's op: it ends at or above it.
                            let host = &mut self.hosts[replica];
                            host.log_end = host.log_end.max(checkpoint_op);
                            self.state_transfers_keeping_log += 1;
                            self.trace.record_str("log kept");
                        }
                    } else if staged && let Some(log) = self.hosts[replica].log.as_mut() {
                        log.abandon_staged();
                    }
                }
            }
        }
        self.collect(replica);
        true
    }

    /// Sync `replica`'s disk; a failed sync crashes it on the spot (carrying on after one is
    /// the bug the storage model exists to catch). Whether the sync succeeded.
    fn sync_or_crash(&mut self, replica: usize) -> bool {
        if self.hosts[replica].storage.sync().is_ok() {
            return true;
        }
        self.hosts[replica].sync_failure_armed = false;
        self.sync_failure_count += 1;
        self.trace.record_str("sync failed");
        let span = 1 + self.crashes.exponential_ticks(self.options.crash_down_ticks_mean);
        self.crash(replica, span, true);
        false
    }

    /// Stage `peer`'s log up to its checkpoint at `checkpoint_op` (`bytes`, `checksum`) in
    /// `replica`'s caller-supplied log, chunk by chunk from the peer's. Whether a log was
    /// staged.
    fn stage_peer_log(
        &mut self,
        replica: usize,
        peer: usize,
        checkpoint_op: u64,
        bytes: &[u8],
        checksum: u128,
    ) -> bool {
        // A stale or forked offer (the fault): the segments come from any replica's log, up
        // to an op below the checkpoint's (a replayed offer of an older state) or up to its
        // op (another replica's log may hold another prepare there). The receiver's check of
        // the offer against the checkpoint refuses what is not the checkpoint's.
        let mut source_of_offer = peer;
        let mut offered_op = checkpoint_op;
        if self.crashes.chance_ppm(self.options.stale_offer_ppm) {
            let other = self.crashes.below(self.replicas.len() as u64) as usize;
            if other != replica && self.hosts[other].down_until.is_none() {
                source_of_offer = other;
            }
            let commit_min = self.replicas[replica].commit_min();
            if checkpoint_op > commit_min + 1 && self.crashes.chance_ppm(PPM / 2) {
                offered_op = self.crashes.range_inclusive(commit_min + 1, checkpoint_op - 1);
            }
            self.trace.record_str("stale offer");
        }
        let Some(offer) = self.hosts[source_of_offer]
            .log
            .as_ref()
            .and_then(|log| log.offer(offered_op, checksum, bytes))
        else {
            self.trace.record_str("no offer");
            return false;
        };
        let Some(mut target) = self.hosts[replica].log.take() else {
            return false;
        };
        let own_state = self.replicas[replica].state_machine().snapshot();
        let source = self.hosts[source_of_offer].log.as_ref();
        let staged = target.stage(
            &offer,
            (bytes, checksum),
            &own_state,
            &mut |segment, position, len| source.and_then(|source| source.chunk(segment, position, len)),
        );
        self.hosts[replica].log = Some(target);
        match staged {
            Ok(()) => {
                self.trace.record_str("log staged");
                true
            }
            Err(_) => {
                self.trace.record_str("staging refused");
                false
            }
        }
    }

    /// Log journal: whether `replica`'s log holds op `op` durably with prepare checksum
    /// `prepare_checksum` (a shell decides so from its own log).
    fn log_holds_prepare(&self, replica: usize, op: u64, prepare_checksum: u128) -> bool {
        if !self.options.shape.log_journal {
            return false;
        }
        let host = &self.hosts[replica];
        if let Some(log) = host.log.as_ref() {
            return log.holds_durably(op, prepare_checksum);
        }
        if op > host.log_end {
            return false;
        }
        let slot = slot_of(op, self.options.shape.journal_slots) as u32;
        [Zone::Prepares, Zone::Headers].into_iter().all(|zone| {
            Header::decode(&host.storage.read(zone, slot))
                .is_ok_and(|header| header.op == op && header.checksum == prepare_checksum)
        })
    }

    /// The newest durable checkpoint above `above_op` among the peers `replica` can reach,
    /// from a peer whose `commit_max` is at least `commit_max` (Iggy trap 9). A real peer
    /// would say its commit point in its answer, so this asks the running replica, not its
    /// superblock (which records `commit_max` only as a lower bound).
    fn peer_checkpoint(
        &self,
        replica: usize,
        above_op: u64,
        commit_max: u64,
    ) -> Option<(usize, Checkpoint, Vec<u8>, u128)> {
        let me = Endpoint(replica as u16);
        (0..self.replicas.len())
            .filter(|&peer| peer != replica && self.hosts[peer].down_until.is_none())
            .filter(|&peer| !self.network.is_cut(Endpoint(peer as u16), me))
            .filter_map(|peer| {
                let (state, _) = self.hosts[peer].superblock.clone()?;
                let peer_commit_max = self.replicas[peer].commit_max();
                (state.checkpoint_op > above_op && peer_commit_max >= commit_max).then_some((peer, state))
            })
            .max_by_key(|(peer, state)| (state.checkpoint_op, std::cmp::Reverse(*peer)))
            .and_then(|(peer, state)| {
                named_checkpoint(&self.hosts[peer].storage, &state)
                    .map(|(checkpoint, _, bytes)| (peer, checkpoint, bytes, state.checkpoint_checksum))
            })
    }

    /// Persist before send, checked against the disk: a replica sends a message of view `v`
    /// that votes or acknowledges (StartViewChange, DoViewChange, StartView, PrepareOk) only
    /// once its superblock holds a view of at least `v`, and a DoViewChange or StartView only
    /// once it holds the log_view the message claims.
    fn check_persisted_before_send(&self, replica: usize, header: &Header) -> Result<(), Violation> {
        let claimed_log_view = match header.command {
            Command::StartViewChange | Command::PrepareOk => None,
            Command::DoViewChange => Some(header.log_view),
            Command::StartView => Some(header.view),
            _ => return Ok(()),
        };
        let (disk_view, disk_log_view) = self.hosts[replica]
            .superblock
            .as_ref()
            .map_or((0, 0), |(state, _)| (state.view, state.log_view));
        if disk_view < header.view || claimed_log_view.is_some_and(|log_view| disk_log_view < log_view) {
            return Err(self.violation(format!(
                "replica {replica} sent a {:?} of view {} (log_view {:?}) while its superblock holds view {disk_view}, log_view {disk_log_view}",
                header.command, header.view, claimed_log_view
            )));
        }
        Ok(())
    }

    /// The state machine of `replica` after its commit point must be the canonical state
    /// there.
    fn check_state(&mut self, replica: usize) -> Result<(), Violation> {
        let commit_min = self.replicas[replica].commit_min();
        if commit_min == 0 {
            return Ok(());
        }
        if let Some(fault) = self.replicas[replica].state_machine().fault() {
            return Err(self.violation(format!("replica {replica}'s state machine: {fault}")));
        }
        let state = self.replicas[replica].state_machine().digest();
        match self.canonical_state.get(&commit_min) {
            Some(&canonical) if canonical != state => Err(self.violation(format!(
                "replica {replica}'s state after op {commit_min} differs from the canonical state"
            ))),
            Some(_) => Ok(()),
            None => {
                self.canonical_state.insert(commit_min, state);
                Ok(())
            }
        }
    }

    /// The per-tick checkers.
    fn check(&mut self) -> Result<(), Violation> {
        if let Some(violation) = self.found.take() {
            return Err(violation);
        }
        for replica in 0..self.replicas.len() {
            if self.hosts[replica].down_until.is_none() {
                // A crashed replica's memory is gone; it is checked again from its restart.
                self.check_replica(replica)?;
            }
        }
        Ok(())
    }

    /// The checkers for one replica, run after every input it takes: a slot it applied can be
    /// reused by a later op in the next input, so commits are checked before that can happen.
    /// Polls (a caller's log): what `replica` serves of each op up to its commit point (and
    /// its log's written end) must be what every replica serves of it. A poll above the
    /// commit point (the mutation) serves an op a view change may still replace.
    fn check_polls(&mut self, replica: usize) -> Result<(), Violation> {
        if self.hosts[replica].log.is_none() || self.hosts[replica].down_until.is_some() {
            return Ok(());
        }
        let core = &self.replicas[replica];
        let bound = if self.options.poll_above_commit_point {
            core.op()
        } else {
            core.commit_min().min(core.log_written_end())
        };
        let log = self.hosts[replica].log.as_mut().expect("checked");
        let mut mismatch = None;
        while self.served_through[replica] < bound {
            let op = self.served_through[replica] + 1;
            if op < log.first_op() {
                // Released by retention: every message of it lies below the start offset, so
                // no poll serves it (the shell checks that as it releases).
                self.served_through[replica] = op;
                continue;
            }
            let Some(served) = log.served(op) else {
                // Committed and in its log as it stands, yet not there to serve.
                mismatch = Some(op);
                break;
            };
            match self.canonical_served.get(&op) {
                Some(&canonical) if canonical != served => {
                    mismatch = Some(op);
                    break;
                }
                Some(_) => {}
                None => {
                    self.canonical_served.insert(op, served);
                }
            }
            self.served_through[replica] = op;
        }
        match mismatch {
            Some(op) => Err(self.violation(format!(
                "replica {replica} served op {op}'s messages differently from what was served of it before, or could not serve it (commit point {}, log written to {}): {}",
                self.replicas[replica].commit_min(),
                self.replicas[replica].log_written_end(),
                self.replicas[replica].describe()
            ))),
            None => Ok(()),
        }
    }

    fn check_replica(&mut self, replica: usize) -> Result<(), Violation> {
        self.check_polls(replica)?;
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
        let advanced = commit_min > self.checked_commit[replica];
        for op in self.checked_commit[replica] + 1..=commit_min {
            let Some(header) = self.replicas[replica].committed_header(op) else {
                if op < commit_min {
                    // Passed by state transfer: the checkpoint vouches for these ops, and the
                    // state check below compares what it installed.
                    continue;
                }
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
        let durable_view = self.replicas[replica].durable().view;
        self.hosts[replica].durable_view_max = self.hosts[replica].durable_view_max.max(durable_view);
        if advanced {
            self.check_state(replica)?;
        }
        Ok(())
    }

    /// Record `what` as the violation of this tick, unless one was found already.
    fn found_between_ticks(&mut self, what: String) {
        if self.found.is_none() {
            self.found = Some(self.violation(what));
        }
    }

    fn violation(&self, what: String) -> Violation {
        Violation { tick: self.now, what }
    }

    fn replica_summary(&self) -> String {
        let writes: Vec<(u8, u64)> = self
            .writes
            .iter()
            .map(|write| (write.replica, write.due.0.0))
            .collect();
        let replicas = self
            .replicas
            .iter()
            .enumerate()
            .map(|(index, replica)| {
                format!(
                    "[{}; paused until {}, down until {:?}, superblock write {}]",
                    replica.describe(),
                    self.paused_until[index],
                    self.hosts[index].down_until,
                    self.hosts[index].superblock_writing.is_some()
                )
            })
            .collect::<Vec<_>>()
            .join(" ");
        format!("{replicas}; pending storage work (replica, due) {writes:?}")
    }
}

/// The checkpoint `state` names, as found in one of the two checkpoint slots of `storage`:
/// the checkpoint, its slot and the slot's bytes.
fn named_checkpoint(storage: &Storage, state: &DurableState) -> Option<(Checkpoint, u8, Vec<u8>)> {
    (0..2u8).find_map(|slot| {
        let bytes = storage.read(Zone::Checkpoints, u32::from(slot));
        Checkpoint::decode(
            &bytes,
            CHECKPOINT_SLOT_BYTES as usize,
            state.checkpoint_checksum,
            SIM_CLUSTER,
            SIM_GROUP,
        )
        .ok()
        .map(|checkpoint| (checkpoint, slot, bytes))
    })
}

/// What a replica sent to other replicas since it last (re)started: its votes and
/// acknowledgements.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sent {
    pub prepare_oks: u64,
    pub start_view_changes: u64,
    pub do_view_changes: u64,
}

/// Scripted scenarios: a quiet cluster (reliable network, no random faults) that a test
/// drives tick by tick and breaks on purpose, with every checker running.
impl<M: SimMachine> Sim<M> {
    /// A cluster of `replica_count` replicas and 3 clients with no random faults.
    pub fn scripted(seed: u64, replica_count: u8) -> Sim<M> {
        let mut options = SimOptions::from_seed(seed);
        options.replica_count = replica_count;
        options.network = NetworkOptions::reliable(u16::from(replica_count) + 3, 1);
        options.partition_ppm = 0;
        options.pause_ppm = 0;
        options.crash_ppm = 0;
        options.sync_fail_ppm = 0;
        options.power_loss_ppm = 0;
        options.wipe_ppm = 0;
        options.journal_flip_ppm = 0;
        options.superblock_flip_ppm = 0;
        options.write_ticks_mean = 1;
        // Scripts count slots and checkpoints of the metadata shape.
        options.shape = Shape::METADATA;
        Sim::new(seed, options)
    }

    /// One tick, with the checkers (no random faults are injected).
    pub fn tick(&mut self) -> Result<(), Violation> {
        self.step()
    }

    /// Tick until `condition` holds, at most `ticks_max` ticks; whether it held.
    pub fn run_until(
        &mut self,
        ticks_max: u64,
        condition: impl Fn(&Sim<M>) -> bool,
    ) -> Result<bool, Violation> {
        for _ in 0..ticks_max {
            if condition(self) {
                return Ok(true);
            }
            self.step()?;
        }
        Ok(condition(self))
    }

    /// Crash `replica` until [`Simulation::restart_replica`]: unsynced writes are lost,
    /// durable or torn as the storage options draw.
    pub fn crash_replica(&mut self, replica: usize) {
        assert!(
            self.hosts[replica].down_until.is_none(),
            "replica {replica} is already down"
        );
        self.crash(replica, u64::MAX - self.now, false);
    }

    /// Restart a crashed replica from its disk.
    pub fn restart_replica(&mut self, replica: usize) -> Result<(), Violation> {
        assert!(
            self.hosts[replica].down_until.is_some(),
            "replica {replica} is running"
        );
        self.restart(replica)
    }

    /// Replace a crashed replica's disk with a blank one.
    pub fn wipe_disk(&mut self, replica: usize) {
        assert!(
            self.hosts[replica].down_until.is_some(),
            "wipe a crashed replica's disk"
        );
        self.hosts[replica].forget_durable_state();
        self.wipe_count += 1;
    }

    /// Flip a bit in the durable bytes of one slot of a crashed replica's disk.
    pub fn flip_bit(&mut self, replica: usize, zone: Zone, slot: u32) {
        assert!(
            self.hosts[replica].down_until.is_some(),
            "flip bits on a crashed replica's disk"
        );
        self.hosts[replica].storage.corrupt(zone, slot, &mut self.crashes);
        self.flip_count += 1;
    }

    /// Whether `replica`'s superblock write is in progress: a crash now may leave its copies
    /// at two sequences.
    pub fn superblock_writing(&self, replica: usize) -> bool {
        self.hosts[replica].superblock_writing.is_some()
    }

    pub fn replica(&self, replica: usize) -> &Replica<M> {
        &self.replicas[replica]
    }

    pub fn storage(&self, replica: usize) -> &Storage {
        &self.hosts[replica].storage
    }

    pub fn is_down(&self, replica: usize) -> bool {
        self.hosts[replica].down_until.is_some()
    }

    /// What `replica` sent since it last (re)started.
    pub fn sent(&self, replica: usize) -> Sent {
        self.sent[replica]
    }

    /// State transfers `replica` completed (checkpoints it installed from a peer).
    pub fn state_transfers_of(&self, replica: usize) -> u64 {
        self.state_transfers_by[replica]
    }

    /// Ops in the canonical committed log so far.
    pub fn committed_ops(&self) -> u64 {
        self.canonical.len() as u64
    }
}

/// Run seed `seed` with the options it draws.
/// Run one seed with `options`, the way tests run many: a panic inside the run (a replica's
/// assertion) is a violation too, reported with its message, so one bad seed does not end
/// the test before the others are counted.
pub fn run_catching<M: SimMachine>(seed: u64, options: SimOptions) -> Result<Outcome, Violation> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        Sim::<M>::new(seed, options).run()
    })) {
        Ok(result) => result,
        Err(panic) => Err(Violation {
            tick: 0,
            what: format!(
                "a replica's assertion failed: {}",
                panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|text| text.to_string()))
                    .unwrap_or_default()
            ),
        }),
    }
}

pub fn run_seed(seed: u64) -> Result<Outcome, Violation> {
    Simulation::new(seed, SimOptions::from_seed(seed)).run()
}
