//! The node simulator: three replicas of one group, each the server's own [`LocalGroup`] in a
//! directory of its own (a partition over its journal, the segment log, or the metadata
//! group over its ring journal),
//! connected through the [`Transport`] and [`Clock`] the server's replica network provides,
//! here a simulated one. Time is virtual: a replica that waits for its peers' answers (a
//! request on its lanes) runs the rest of the world through its clock (messages delivered
//! after a seeded latency, other replicas served when a message arrives or a tick is due),
//! so a run takes no wall time beyond the work itself, and a seed replays its run (a state
//! transfer's verification runs on a thread of its own, so its finish is the one thing
//! real time can move).
//!
//! Faults, drawn from the seed: replicas killed (dropped with no close, as SIGKILL leaves
//! their files) and restarted from their files, directories of stopped replicas wiped
//! (rejoining as wiped replicas, by state transfer when their peers trimmed the log they
//! lack), one-way cuts between replicas, lost and delayed messages, and retention trims that
//! make the shell remove segments as the server's does. Requests go to whichever replica
//! takes them, and time out there as in the server (outcome unknown).
//!
//! The checkers, after the faults heal: every replica applies the same ops and (a partition)
//! serves the same log; every acknowledged append is served at the offsets it was
//! acknowledged with, by every replica (unless trimmed), and every acknowledged metadata
//! change is applied once; no offset is handed out twice; no message is stored twice;
//! nothing answered not taken is ever applied; and the fate `LocalGroup::fate` tells of a
//! request of unknown outcome, during the run (as a client's replay asks) and after it,
//! matches what the replicas hold.
//!
//! `CAIRN_NODE_SIM_SEEDS=<n>` runs seeds `0..n` (default 32); `CAIRN_NODE_SIM_SEED=<s>`
//! replays one; `CAIRN_NODE_SIM_STEPS=<n>` sets the steps of a run (default 300).

use super::{
    Clock, Fate, GroupError, GroupJournal, Inbox, LocalGroup, Peers, RingJournal, Ticket, TransferPace,
    Transport,
};
use crate::partition_group::{self, JournalOptions, LogJournal, LogParams, PartitionError};
use crate::test_support::client_batch_from;
use cairn_machine::metadata::{MetadataMachine, MetadataOp, OPERATION_METADATA};
use cairn_machine::partition::PartitionMachine;
use cairn_storage::sim_disk::SimRng;
use cairn_vsr::header::Message;
use cairn_vsr::journal::BodyRule;
use cairn_vsr::replica::StateMachine;
use cairn_wire::batch;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

type PartitionGroup = LocalGroup<PartitionMachine, LogJournal>;
type MetadataGroup = LocalGroup<MetadataMachine, RingJournal>;
/// Opens a replica's group from its directory, with its peers.
type Open<S, J> = fn(&Path, Peers) -> Result<LocalGroup<S, J>, GroupError>;

const REPLICAS: usize = 3;
const CLUSTER: u128 = 0x51_c1a5_0de5;
const GROUP: u64 = 0x5eed;
const PARTITION: u32 = 4;
/// The server's tick and request timeout.
const TICK: Duration = Duration::from_millis(10);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Small segments, so that logs span several and trims release some.
const SEGMENT_SIZE_BYTES: u64 = 4 * 1024;
/// How long the healed world gets to agree again.
const SETTLE_WITHIN: Duration = Duration::from_secs(300);

/// The simulated replica network: messages in flight by delivery time, and the faults.
struct Net {
    rng: SimRng,
    /// By (delivery time in µs of virtual time, sequence): (to, message).
    in_flight: BTreeMap<(u64, u64), (usize, Message)>,
    sequence: u64,
    /// `cut[from][to]`: what `from` sends to `to` is lost.
    cut: [[bool; REPLICAS]; REPLICAS],
    down: [bool; REPLICAS],
    /// Messages lost on the way, per thousand.
    loss_per_mille: u64,
    sent: u64,
    lost: u64,
}

/// Three replicas, their network and the virtual time.
struct World<S: StateMachine, J: GroupJournal> {
    base: Instant,
    now_us: AtomicU64,
    net: Mutex<Net>,
    inboxes: Vec<Arc<Inbox>>,
    /// `None` while a replica is down.
    groups: Vec<Mutex<Option<LocalGroup<S, J>>>>,
    /// What the bus checks a prepare's body with.
    prepare_rule: BodyRule,
    /// When each replica wants serving next (its next tick).
    next_serve: Mutex<[Instant; REPLICAS]>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl<S: StateMachine + Send + 'static, J: GroupJournal + Send + 'static> World<S, J> {
    fn now(&self) -> Instant {
        self.base + Duration::from_micros(self.now_us.load(Ordering::Acquire))
    }

    fn us_of(&self, instant: Instant) -> u64 {
        // Rounded up, so that what is due at `instant` is due at the time it becomes.
        let nanos = instant.saturating_duration_since(self.base).as_nanos();
        u64::try_from(nanos.div_ceil(1000)).unwrap_or(u64::MAX)
    }

    /// A message on the replica network: checked as the bus's receiver checks its bytes,
    /// then lost or delivered after a latency, as the seed says.
    fn send(&self, from: usize, to: usize, message: Message) {
        let message = super::as_carried(CLUSTER, from as u8, self.prepare_rule, message);
        let now_us = self.now_us.load(Ordering::Acquire);
        let mut net = lock(&self.net);
        net.sent += 1;
        let loss = net.loss_per_mille;
        if net.down[from] || net.down[to] || net.cut[from][to] || net.rng.chance(loss, 1000) {
            net.lost += 1;
            return;
        }
        let latency_us = net.rng.range_inclusive(50, 3_000);
        net.sequence += 1;
        let key = (now_us + latency_us, net.sequence);
        net.in_flight.insert(key, (to, message));
    }

    /// Run the world until `until`, or until replica `waiting`'s inbox holds a message
    /// (`waiting` is the replica whose request is waiting: its caller holds it).
    fn run(&self, until: Instant, waiting: Option<usize>) {
        loop {
            self.deliver_due();
            self.serve_due(waiting);
            if waiting.is_some_and(|replica| !self.inboxes[replica].is_empty()) {
                return;
            }
            let now_us = self.now_us.load(Ordering::Acquire);
            let until_us = self.us_of(until);
            if now_us >= until_us {
                return;
            }
            let mut next_us = until_us;
            if let Some(&(at_us, _)) = lock(&self.net).in_flight.keys().next() {
                next_us = next_us.min(at_us);
            }
            let next_serve = *lock(&self.next_serve);
            for (replica, at) in next_serve.iter().enumerate() {
                if Some(replica) != waiting {
                    next_us = next_us.min(self.us_of(*at));
                }
            }
            self.now_us.store(next_us.max(now_us + 1), Ordering::Release);
        }
    }

    /// Every message whose time has come into its replica's inbox (a full inbox drops it,
    /// as the server's does).
    fn deliver_due(&self) {
        let now_us = self.now_us.load(Ordering::Acquire);
        let mut net = lock(&self.net);
        while let Some(entry) = net.in_flight.first_entry() {
            if entry.key().0 > now_us {
                break;
            }
            let (to, message) = entry.remove();
            if net.down[to] {
                net.lost += 1;
            } else {
                let _ = self.inboxes[to].push(message);
            }
        }
    }

    /// What a node's worker does: serve each running replica with messages waiting or a
    /// tick due (all but the one whose request waits: its caller holds it).
    fn serve_due(&self, waiting: Option<usize>) {
        let now = self.now();
        for replica in (0..REPLICAS).filter(|&replica| Some(replica) != waiting) {
            let due = lock(&self.next_serve)[replica] <= now;
            if !due && self.inboxes[replica].is_empty() {
                continue;
            }
            let Ok(mut group) = self.groups[replica].try_lock() else {
                continue;
            };
            let Some(group) = group.as_mut() else {
                lock(&self.next_serve)[replica] = now + Duration::from_secs(3600);
                continue;
            };
            match group.serve_inbox() {
                Ok(next) => lock(&self.next_serve)[replica] = next,
                Err(error) => panic!("replica {replica} stopped: {error}"),
            }
        }
    }
}

/// A replica's view of the world's time; its waits run the world.
struct SimClock<S: StateMachine, J: GroupJournal> {
    world: Weak<World<S, J>>,
    replica: usize,
}

impl<S: StateMachine + Send + 'static, J: GroupJournal + Send + 'static> Clock for SimClock<S, J> {
    fn now(&self) -> Instant {
        self.world
            .upgrade()
            .expect("the world outlives its replicas")
            .now()
    }

    fn take_until(&self, inbox: &Inbox, until: Instant) -> Vec<Message> {
        if let Some(world) = self.world.upgrade() {
            world.run(until, Some(self.replica));
        }
        inbox.take_now()
    }
}

struct SimTransport<S: StateMachine, J: GroupJournal> {
    world: Weak<World<S, J>>,
    from: usize,
}

impl<S: StateMachine + Send + 'static, J: GroupJournal + Send + 'static> Transport for SimTransport<S, J> {
    fn send(&self, to: u8, message: Message) {
        if let Some(world) = self.world.upgrade() {
            world.send(self.from, usize::from(to), message);
        }
    }
}

/// An append's outcome, for the checkers: the message ids it carried and, when it was
/// acknowledged, the offsets it got.
struct Sent {
    ids: Vec<u128>,
    offsets: Option<Vec<u64>>,
    /// Answered not taken: it must never be stored.
    not_taken: bool,
    /// Its outcome was unknown: what the group kept to tell its fate later, and the replica
    /// that issued it (the one that tells it, while not restarted).
    ticket: Option<(Ticket, usize)>,
    /// The first fate a replica told of it while the run went on (dropped: never stored).
    told_dropped: bool,
}

/// Three replicas of one group in a simulated world, and the faults done to them: what the
/// partition and metadata runs share.
struct Cluster<S: StateMachine, J: GroupJournal> {
    seed: u64,
    rng: SimRng,
    world: Arc<World<S, J>>,
    dirs: Vec<PathBuf>,
    open: Open<S, J>,
    /// A replica wiped and not yet current again: no other may be wiped meanwhile (two
    /// wiped replicas of three may both have held an acknowledged op's only copies).
    wiped: Option<usize>,
    /// Per replica: a state transfer was under way at the last look.
    transferring: [bool; REPLICAS],
    counts: BTreeMap<&'static str, u64>,
}

impl<S: StateMachine + Send + 'static, J: GroupJournal + Send + 'static> Cluster<S, J> {
    fn new(seed: u64, root: &Path, open: Open<S, J>, prepare_rule: BodyRule) -> Cluster<S, J> {
        let world = Arc::new(World {
            base: Instant::now(),
            now_us: AtomicU64::new(0),
            net: Mutex::new(Net {
                rng: SimRng::new(seed ^ 0x006e_6574_776f_726b),
                in_flight: BTreeMap::new(),
                sequence: 0,
                cut: [[false; REPLICAS]; REPLICAS],
                down: [false; REPLICAS],
                loss_per_mille: 0,
                sent: 0,
                lost: 0,
            }),
            inboxes: (0..REPLICAS).map(|_| Arc::new(Inbox::default())).collect(),
            groups: (0..REPLICAS).map(|_| Mutex::new(None)).collect(),
            prepare_rule,
            next_serve: Mutex::new([Instant::now(); REPLICAS]),
        });
        let mut cluster = Cluster {
            seed,
            rng: SimRng::new(seed),
            world,
            dirs: (0..REPLICAS)
                .map(|replica| root.join(format!("replica-{replica}")))
                .collect(),
            open,
            wiped: None,
            transferring: [false; REPLICAS],
            counts: BTreeMap::new(),
        };
        lock(&cluster.world.net).loss_per_mille = cluster.rng.below(30);
        for replica in 0..REPLICAS {
            cluster.start(replica, true);
        }
        cluster
    }

    fn count(&mut self, what: &'static str) {
        *self.counts.entry(what).or_default() += 1;
    }

    fn peers(&self, replica: usize, format_if_missing: bool) -> Peers {
        Peers {
            replica: replica as u8,
            replica_count: REPLICAS as u8,
            cluster: CLUSTER,
            transport: Arc::new(SimTransport {
                world: Arc::downgrade(&self.world),
                from: replica,
            }),
            inbox: self.world.inboxes[replica].clone(),
            tick: TICK,
            request_timeout: REQUEST_TIMEOUT,
            format_if_missing,
            transfer_pace: Arc::new(TransferPace::new(1 << 30)),
            abdicating: Arc::default(),
            primary_seen: Arc::default(),
            clock: Arc::new(SimClock {
                world: Arc::downgrade(&self.world),
                replica,
            }),
        }
    }

    /// Open replica `replica` from its directory, as a node's start does.
    fn start(&mut self, replica: usize, format_if_missing: bool) {
        let peers = self.peers(replica, format_if_missing);
        let group = (self.open)(&self.dirs[replica], peers)
            .unwrap_or_else(|error| panic!("seed {}: replica {replica} does not open: {error}", self.seed));
        lock(&self.world.net).down[replica] = false;
        *lock(&self.world.groups[replica]) = Some(group);
        lock(&self.world.next_serve)[replica] = self.world.now();
    }

    /// SIGKILL: the replica is dropped as it stands, and what was on its way to it is lost.
    fn kill(&mut self, replica: usize) {
        lock(&self.world.net).down[replica] = true;
        lock(&self.world.groups[replica]).take();
        let _ = self.world.inboxes[replica].take_now();
    }

    fn is_up(&self, replica: usize) -> bool {
        lock(&self.world.groups[replica]).is_some()
    }

    fn with<T>(&self, replica: usize, f: impl FnOnce(&mut LocalGroup<S, J>) -> T) -> Option<T> {
        lock(&self.world.groups[replica]).as_mut().map(f)
    }

    /// The replica taking requests now, if one is.
    fn primary(&self) -> Option<usize> {
        (0..REPLICAS).find(|&replica| self.with(replica, |group| group.takes_requests()) == Some(true))
    }

    /// The replica a client reaches: the one that takes requests (the SDK finds the
    /// leader), else, and now and then anyway, any running one.
    fn taker(&mut self) -> Option<usize> {
        let up: Vec<usize> = (0..REPLICAS).filter(|&replica| self.is_up(replica)).collect();
        if up.is_empty() {
            return None;
        }
        match self.primary() {
            Some(primary) if !self.rng.chance(1, 10) => Some(primary),
            _ => Some(up[self.rng.below(up.len() as u64) as usize]),
        }
    }

    /// A fault, or time passing, as `roll` (0 to 99) picks; rolls below 45 are the
    /// workload's, and pass time here.
    fn fault(&mut self, roll: u64) {
        tracing::debug!(seed = self.seed, now_ms = self.world.now_us.load(Ordering::Acquire) / 1000, state = %self.describe(), "step");
        match roll {
            45..60 => {
                let ms = self.rng.range_inclusive(1, 300);
                self.advance(ms);
            }
            60..65 => {
                let replica = self.rng.below(REPLICAS as u64) as usize;
                if self.is_up(replica) {
                    tracing::debug!(replica, "kill");
                    self.count("kills");
                    self.kill(replica);
                }
            }
            65..75 => {
                let down: Vec<usize> = (0..REPLICAS).filter(|&replica| !self.is_up(replica)).collect();
                if !down.is_empty() {
                    let replica = down[self.rng.below(down.len() as u64) as usize];
                    tracing::debug!(replica, "restart");
                    self.count("restarts");
                    self.start(replica, false);
                }
            }
            75..77 => self.wipe(),
            77..81 => {
                let from = self.rng.below(REPLICAS as u64) as usize;
                let to = (from + 1 + self.rng.below(REPLICAS as u64 - 1) as usize) % REPLICAS;
                tracing::debug!(from, to, "cut");
                self.count("cuts");
                lock(&self.world.net).cut[from][to] = true;
            }
            81..86 => lock(&self.world.net).cut = [[false; REPLICAS]; REPLICAS],
            _ => {
                let ms = self.rng.range_inclusive(1, 30);
                self.advance(ms);
            }
        }
    }

    /// Let `ms` of virtual time pass.
    fn advance(&self, ms: u64) {
        let until = self.world.now() + Duration::from_millis(ms);
        self.world.run(until, None);
    }

    /// Wipe a stopped replica's directory (its disk lost), when its peers hold every
    /// acknowledged op: both running, current, and no other replica wiped and catching up.
    fn wipe(&mut self) {
        let replica = self.rng.below(REPLICAS as u64) as usize;
        if self.is_up(replica) || self.wiped.is_some() {
            return;
        }
        let others_current = (0..REPLICAS)
            .filter(|&other| other != replica)
            .all(|other| self.with(other, |group| group.is_current()) == Some(true));
        if !others_current {
            return;
        }
        tracing::debug!(replica, "wipe");
        self.count("wipes");
        std::fs::remove_dir_all(&self.dirs[replica]).expect("wipe");
        self.wiped = Some(replica);
        self.start(replica, false);
    }

    /// Note state transfers starting, and a wiped replica current again.
    fn note_progress(&mut self) {
        for replica in 0..REPLICAS {
            let transferring = self
                .with(replica, |group| group.replica_status().transfer.is_some())
                .unwrap_or(false);
            if transferring && !self.transferring[replica] {
                self.count("state transfers");
            }
            self.transferring[replica] = transferring;
        }
        if let Some(replica) = self.wiped
            && self.with(replica, |group| group.is_current()) == Some(true)
        {
            self.wiped = None;
        }
    }

    /// Heal every fault and run until the replicas agree: all running and current, at the
    /// same commit, one of them primary. `upkeep` is the shell's work between steps.
    fn settle(&mut self, upkeep: &mut dyn FnMut(&mut Cluster<S, J>)) {
        lock(&self.world.net).cut = [[false; REPLICAS]; REPLICAS];
        lock(&self.world.net).loss_per_mille = 0;
        for replica in 0..REPLICAS {
            if !self.is_up(replica) {
                self.start(replica, false);
            }
        }
        let deadline = self.world.now() + SETTLE_WITHIN;
        loop {
            self.advance(100);
            upkeep(self);
            let commits: Vec<Option<u64>> = (0..REPLICAS)
                .map(|replica| {
                    self.with(replica, |group| group.is_current().then(|| group.commit_op()))
                        .flatten()
                })
                .collect();
            let agreed = commits
                .iter()
                .all(|commit| commit.is_some() && *commit == commits[0]);
            let primary =
                (0..REPLICAS).any(|replica| self.with(replica, |group| group.is_caught_up()) == Some(true));
            if agreed && primary {
                break;
            }
            assert!(
                self.world.now() < deadline,
                "seed {}: the healed replicas did not agree within {SETTLE_WITHIN:?}: {}",
                self.seed,
                self.describe()
            );
        }
    }

    fn describe(&self) -> String {
        (0..REPLICAS)
            .map(
                |replica| match self.with(replica, |group| group.replica_status()) {
                    Some(status) => format!(
                        "replica {replica}: {} view {} commit {} op {} transfer wanted {}",
                        status.role, status.view, status.commit, status.op, status.transfer_wanted
                    ),
                    None => format!("replica {replica}: down"),
                },
            )
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// Add this run's counts to `totals`, and stop every replica.
    fn finish(mut self, totals: &mut BTreeMap<&'static str, u64>) {
        let net = lock(&self.world.net);
        let (sent, lost) = (net.sent, net.lost);
        drop(net);
        self.counts.insert("messages sent", sent);
        self.counts.insert("messages lost", lost);
        self.counts.insert(
            "virtual seconds",
            self.world.now_us.load(Ordering::Acquire) / 1_000_000,
        );
        for (what, count) in &self.counts {
            *totals.entry(what).or_default() += count;
        }
        for replica in 0..REPLICAS {
            self.kill(replica);
        }
    }
}

/// The partition workload: appends, retention trims, and the fates of appends of unknown
/// outcome asked as a client's replay would.
struct PartitionRun {
    cluster: Cluster<PartitionMachine, LogJournal>,
    sent: Vec<Sent>,
    next_id: u128,
}

fn open_partition(dir: &Path, peers: Peers) -> Result<PartitionGroup, GroupError> {
    let params = LogParams::new(
        PARTITION,
        JournalOptions {
            segment_size_bytes: SEGMENT_SIZE_BYTES,
            relaxed: false,
        },
    );
    partition_group::open_with_peers(dir, GROUP, params, peers)
}

impl PartitionRun {
    fn new(seed: u64, root: &Path) -> PartitionRun {
        PartitionRun {
            cluster: Cluster::new(seed, root, open_partition, PartitionMachine::body_verifies),
            sent: Vec::new(),
            next_id: 1,
        }
    }

    fn step(&mut self) {
        let roll = self.cluster.rng.below(100);
        match roll {
            0..45 => self.append(),
            86..89 => self.trim(),
            89..92 => self.ask_fates(),
            _ => self.cluster.fault(roll),
        }
        Self::upkeep(&mut self.cluster);
    }

    /// Ask a running replica the fate of every append of unknown outcome not yet told
    /// dropped, as a client's replay would; one told dropped must never be stored.
    fn ask_fates(&mut self) {
        for sent in self.sent.iter_mut().filter(|sent| !sent.told_dropped) {
            let Some((ticket, issuer)) = &sent.ticket else {
                continue;
            };
            if self.cluster.with(*issuer, |group| group.fate(ticket)) == Some(Fate::Dropped) {
                sent.told_dropped = true;
                *self
                    .cluster
                    .counts
                    .entry("unknown appends told dropped during the run")
                    .or_default() += 1;
            }
        }
    }

    /// One to three appends at once, on the lanes of the replica a client reached.
    fn append(&mut self) {
        let cluster = &mut self.cluster;
        let Some(replica) = cluster.taker() else {
            return;
        };
        let appends: Vec<(u64, Vec<u8>, Vec<u128>)> = (0..cluster.rng.range_inclusive(1, 3))
            .map(|_| {
                let count = cluster.rng.range_inclusive(1, 4) as u32;
                let first_id = self.next_id;
                self.next_id += u128::from(count);
                let payload_bytes = cluster.rng.range_inclusive(8, 600) as usize;
                let batch = client_batch_from(first_id, count, payload_bytes, first_id as u8);
                let ids = (first_id..first_id + u128::from(count)).collect();
                (cluster.world.us_of(cluster.world.now()).max(1), batch, ids)
            })
            .collect();
        let borrowed: Vec<(u64, Vec<&[u8]>)> = appends
            .iter()
            .map(|(timestamp, batch, _)| (*timestamp, vec![&batch[..]]))
            .collect();
        let borrowed: Vec<(u64, &[&[u8]])> = borrowed
            .iter()
            .map(|(timestamp, batches)| (*timestamp, &batches[..]))
            .collect();
        let Some((results, tickets)) = cluster.with(replica, |group| {
            let results = group.append_copies(&borrowed);
            (results, group.take_unknown_tickets())
        }) else {
            return;
        };
        // One ticket per append of unknown outcome, in order.
        let mut tickets = tickets.into_iter();
        let mut refused = false;
        for ((_, _, ids), result) in appends.into_iter().zip(results) {
            let not_taken = matches!(result, Err(PartitionError::Group(GroupError::NotTaken { .. })));
            let ticket = matches!(
                result,
                Err(PartitionError::Group(GroupError::OutcomeUnknown { .. }))
            )
            .then(|| {
                (
                    tickets.next().expect("a ticket per append of unknown outcome"),
                    replica,
                )
            });
            let offsets = match result {
                Ok(offsets) => {
                    cluster.count("appends acknowledged");
                    assert_eq!(
                        offsets.len(),
                        1,
                        "seed {}: one batch, one base offset",
                        cluster.seed
                    );
                    Some(offsets)
                }
                Err(PartitionError::Group(error)) => {
                    count_refusal(cluster, &error, "appends");
                    refused |= not_taken;
                    None
                }
                Err(error) => panic!("seed {}: an append failed: {error}", cluster.seed),
            };
            self.sent.push(Sent {
                ids,
                offsets,
                not_taken,
                ticket,
                told_dropped: false,
            });
        }
        if refused {
            // A client told to go elsewhere looks the leader up again, which takes a while.
            let ms = cluster.rng.range_inclusive(5, 50);
            cluster.advance(ms);
        }
    }

    /// Retention on the primary: the oldest messages leave (an op every replica applies).
    fn trim(&mut self) {
        let cluster = &mut self.cluster;
        let Some(replica) = cluster.primary() else {
            return;
        };
        let fraction = cluster.rng.range_inclusive(1, 3);
        let trimmed = cluster.with(replica, |group| {
            let below = group.start_offset() + (group.next_offset() - group.start_offset()) * fraction / 10;
            group.trim(below)
        });
        match trimmed {
            Some(Ok(())) => cluster.count("trims"),
            Some(Err(PartitionError::Group(_))) | None => {}
            Some(Err(error)) => panic!("seed {}: a trim failed: {error}", cluster.seed),
        }
    }

    /// What the server's partition shell does between requests: remove the segments a
    /// checkpoint or a trim released.
    fn upkeep(cluster: &mut Cluster<PartitionMachine, LogJournal>) {
        for replica in 0..REPLICAS {
            let removed = cluster.with(replica, |group| {
                if group.takes_requests() || group.is_current() {
                    group.remove_released_segments().map(|removed| removed.len())
                } else {
                    Ok(0)
                }
            });
            match removed {
                Some(Ok(removed)) => {
                    if removed > 0 {
                        cluster.count("segments removed");
                    }
                }
                Some(Err(PartitionError::Group(_))) | None => {}
                Some(Err(error)) => panic!("seed {}: removing segments failed: {error}", cluster.seed),
            }
        }
        cluster.note_progress();
    }

    /// Every message replica `replica` serves from offset 0: (offset, id), and its state.
    fn served(&self, replica: usize) -> (Vec<(u64, u128)>, Vec<u8>) {
        self.cluster
            .with(replica, |group| {
                let mut out = vec![0u8; 64];
                group.read_into(0, u32::MAX, &mut out).expect("poll");
                let messages = batch::messages(&out[64..])
                    .expect("whole batches")
                    .iter()
                    .map(|message| (message.offset, message.id))
                    .collect();
                let stats = group.stats();
                let mut state = group.state_machine().snapshot();
                state.extend_from_slice(&stats.messages_count.to_le_bytes());
                state.extend_from_slice(&group.start_offset().to_le_bytes());
                (messages, state)
            })
            .expect("running")
    }

    /// Heal, commit a last append, settle, and check every replica's log.
    fn check(&mut self) {
        self.cluster.settle(&mut Self::upkeep);
        let deadline = self.cluster.world.now() + SETTLE_WITHIN;
        loop {
            let before = self.sent.len();
            self.append();
            if self.sent[before..].iter().any(|sent| sent.offsets.is_some()) {
                break;
            }
            assert!(
                self.cluster.world.now() < deadline,
                "seed {}: no append committed after the faults healed: {}",
                self.cluster.seed,
                self.cluster.describe()
            );
            self.cluster.advance(50);
        }
        self.cluster.settle(&mut Self::upkeep);
        let seed = self.cluster.seed;
        let (served, state) = self.served(0);
        for replica in 1..REPLICAS {
            let (other_served, other_state) = self.served(replica);
            assert!(
                other_state == state,
                "seed {seed}: replica {replica} applied other ops than replica 0"
            );
            assert!(
                other_served == served,
                "seed {seed}: replica {replica} serves another log than replica 0"
            );
        }
        let start_offset = self
            .cluster
            .with(0, |group| group.start_offset())
            .expect("running");
        let by_offset: HashMap<u64, u128> = served.iter().copied().collect();
        assert_eq!(
            by_offset.len(),
            served.len(),
            "seed {seed}: an offset served twice"
        );
        let mut stored: HashMap<u128, u64> = HashMap::new();
        for &(offset, id) in &served {
            if let Some(first) = stored.insert(id, offset) {
                panic!("seed {seed}: message {id} stored twice, at offsets {first} and {offset}");
            }
        }
        // The fate of every append of unknown outcome, as the replicas tell it now, matches
        // the log: applied at the offsets its reply gives, or dropped and stored nowhere.
        for sent in &self.sent {
            let Some((ticket, issuer)) = &sent.ticket else {
                continue;
            };
            let fate = self.cluster.with(*issuer, |group| group.fate(ticket));
            let what = match fate.expect("running") {
                Fate::Applied(reply) => {
                    let offsets = cairn_machine::partition::decode_append_reply(&reply)
                        .unwrap_or_else(|status| panic!("seed {seed}: an applied append refused ({status})"));
                    for (index, id) in sent.ids.iter().enumerate() {
                        let offset = offsets[0] + index as u64;
                        if offset >= start_offset {
                            assert_eq!(
                                by_offset.get(&offset),
                                Some(id),
                                "seed {seed}: an append told applied is not served at its offsets"
                            );
                        }
                    }
                    "unknown appends found applied"
                }
                Fate::Dropped => {
                    for id in &sent.ids {
                        assert!(
                            !stored.contains_key(id),
                            "seed {seed}: message {id} was told dropped, and is stored"
                        );
                    }
                    "unknown appends found dropped"
                }
                Fate::Unknown => "unknown appends still unknown",
            };
            *self.cluster.counts.entry(what).or_default() += 1;
        }
        let mut minted: HashMap<u64, u128> = HashMap::new();
        for sent in &self.sent {
            if sent.not_taken || sent.told_dropped {
                for id in &sent.ids {
                    assert!(
                        !stored.contains_key(id),
                        "seed {seed}: message {id} was answered not taken or told dropped, and stored"
                    );
                }
            }
            let Some(offsets) = &sent.offsets else {
                continue;
            };
            for (index, &id) in sent.ids.iter().enumerate() {
                let offset = offsets[0] + index as u64;
                if let Some(other) = minted.insert(offset, id) {
                    panic!("seed {seed}: offset {offset} acknowledged for messages {other} and {id}");
                }
                if offset >= start_offset {
                    assert_eq!(
                        by_offset.get(&offset),
                        Some(&id),
                        "seed {seed}: acknowledged message {id} is not served at its offset {offset}"
                    );
                }
            }
        }
    }
}

/// Count a request the group did not answer with a reply (`what`: "appends", "changes").
fn count_refusal<S: StateMachine + Send + 'static, J: GroupJournal + Send + 'static>(
    cluster: &mut Cluster<S, J>,
    error: &GroupError,
    what: &'static str,
) {
    let kind = match error {
        GroupError::NotTaken { reason, .. } if reason == super::DROPPED_BY_A_VIEW_CHANGE => {
            "dropped by a view change"
        }
        GroupError::NotTaken { .. } => "not taken",
        GroupError::OutcomeUnknown { .. } => "of unknown outcome",
        _ => panic!("seed {}: a request failed: {error}", cluster.seed),
    };
    let key: &'static str = match (what, kind) {
        ("appends", "dropped by a view change") => "appends dropped by a view change (not taken)",
        ("appends", "not taken") => "appends not taken",
        ("appends", _) => "appends of unknown outcome",
        (_, "dropped by a view change") => "changes dropped by a view change (not taken)",
        (_, "not taken") => "changes not taken",
        _ => "changes of unknown outcome",
    };
    cluster.count(key);
}

/// A metadata change's outcome, for the checkers.
struct Change {
    /// The stream it creates (each change a name of its own).
    name: String,
    acknowledged: bool,
    /// Answered not taken: it must never be applied.
    not_taken: bool,
    /// Its outcome was unknown: what the group kept to tell its fate later, and the replica
    /// that issued it (the one that tells it, while not restarted).
    ticket: Option<(Ticket, usize)>,
    /// A replica told it dropped while the run went on: it must never be applied.
    told_dropped: bool,
}

/// The metadata workload: streams created, each name once (the metadata group over its
/// ring journal, as the catalog drives it), and the fates of changes of unknown outcome.
struct MetadataRun {
    cluster: Cluster<MetadataMachine, RingJournal>,
    changes: Vec<Change>,
}

fn open_metadata(dir: &Path, peers: Peers) -> Result<MetadataGroup, GroupError> {
    LocalGroup::open_with_peers(
        dir,
        GROUP,
        &(MetadataMachine::body_verifies as BodyRule),
        MetadataMachine::default,
        Some(peers),
    )
}

impl MetadataRun {
    fn create(&mut self) {
        let cluster = &mut self.cluster;
        let Some(replica) = cluster.taker() else {
            return;
        };
        let name = format!("stream-{}", self.changes.len());
        let op = MetadataOp::CreateStream {
            name: name.clone(),
            created_at_us: 1,
        };
        let Some((result, tickets)) = cluster.with(replica, |group| {
            let result = group.submit(OPERATION_METADATA, &op.encode());
            (result, group.take_unknown_tickets())
        }) else {
            return;
        };
        let mut change = Change {
            name,
            acknowledged: false,
            not_taken: false,
            ticket: None,
            told_dropped: false,
        };
        match result {
            Ok(reply) => {
                let applied = MetadataMachine::decode_reply(&reply);
                assert!(
                    matches!(applied, Ok(Ok(_))),
                    "seed {}: a create of a new name refused: {applied:?}",
                    cluster.seed
                );
                cluster.count("changes acknowledged");
                change.acknowledged = true;
            }
            Err(error) => {
                change.not_taken = matches!(error, GroupError::NotTaken { .. });
                if matches!(error, GroupError::OutcomeUnknown { .. }) {
                    change.ticket = tickets.into_iter().next().map(|ticket| (ticket, replica));
                    assert!(
                        change.ticket.is_some(),
                        "a ticket for a change of unknown outcome"
                    );
                }
                count_refusal(cluster, &error, "changes");
                if change.not_taken {
                    let ms = cluster.rng.range_inclusive(5, 50);
                    cluster.advance(ms);
                }
            }
        }
        self.changes.push(change);
    }

    /// [`PartitionRun::ask_fates`] for the changes.
    fn ask_fates(&mut self) {
        for change in self.changes.iter_mut().filter(|change| !change.told_dropped) {
            let Some((ticket, issuer)) = &change.ticket else {
                continue;
            };
            if self.cluster.with(*issuer, |group| group.fate(ticket)) == Some(Fate::Dropped) {
                change.told_dropped = true;
                *self
                    .cluster
                    .counts
                    .entry("unknown changes told dropped during the run")
                    .or_default() += 1;
            }
        }
    }

    /// The streams replica `replica` applied, by name (how many of each), and its state.
    fn applied(&self, replica: usize) -> (BTreeMap<String, usize>, Vec<u8>) {
        self.cluster
            .with(replica, |group| {
                let mut names: BTreeMap<String, usize> = BTreeMap::new();
                for stream in group.state_machine().state.streams.values() {
                    *names.entry(stream.name.clone()).or_default() += 1;
                }
                (names, group.state_machine().snapshot())
            })
            .expect("running")
    }
}

/// A workload the simulator runs on a cluster of three replicas.
trait Workload: Sized {
    fn new(seed: u64, root: &Path) -> Self;
    fn step(&mut self);
    /// Heal, let the replicas agree, and check what they hold.
    fn check(&mut self);
    fn finish(self, totals: &mut BTreeMap<&'static str, u64>);
}

impl Workload for PartitionRun {
    fn new(seed: u64, root: &Path) -> PartitionRun {
        PartitionRun::new(seed, root)
    }

    fn step(&mut self) {
        PartitionRun::step(self);
    }

    fn check(&mut self) {
        PartitionRun::check(self);
    }

    fn finish(self, totals: &mut BTreeMap<&'static str, u64>) {
        self.cluster.finish(totals);
    }
}

impl Workload for MetadataRun {
    fn new(seed: u64, root: &Path) -> MetadataRun {
        MetadataRun {
            cluster: Cluster::new(seed, root, open_metadata, MetadataMachine::body_verifies),
            changes: Vec::new(),
        }
    }

    fn step(&mut self) {
        let roll = self.cluster.rng.below(100);
        match roll {
            0..45 => self.create(),
            89..92 => self.ask_fates(),
            _ => self.cluster.fault(roll),
        }
        self.cluster.note_progress();
    }

    fn check(&mut self) {
        self.cluster.settle(&mut Cluster::note_progress);
        let deadline = self.cluster.world.now() + SETTLE_WITHIN;
        loop {
            let before = self.changes.len();
            self.create();
            if self.changes[before..].iter().any(|change| change.acknowledged) {
                break;
            }
            assert!(
                self.cluster.world.now() < deadline,
                "seed {}: no change committed after the faults healed: {}",
                self.cluster.seed,
                self.cluster.describe()
            );
            self.cluster.advance(50);
        }
        self.cluster.settle(&mut Cluster::note_progress);
        let seed = self.cluster.seed;
        let (names, state) = self.applied(0);
        for replica in 1..REPLICAS {
            assert!(
                self.applied(replica).1 == state,
                "seed {seed}: replica {replica} applied other ops than replica 0"
            );
        }
        if let Some((name, count)) = names.iter().find(|(_, count)| **count > 1) {
            panic!("seed {seed}: stream {name} created {count} times");
        }
        for change in &self.changes {
            let present = names.contains_key(&change.name);
            let name = &change.name;
            if change.acknowledged {
                assert!(present, "seed {seed}: acknowledged stream {name} is not there");
            }
            if change.not_taken || change.told_dropped {
                assert!(
                    !present,
                    "seed {seed}: stream {name} was answered not taken or told dropped, and applied"
                );
            }
            let Some((ticket, issuer)) = &change.ticket else {
                continue;
            };
            let what = match self
                .cluster
                .with(*issuer, |group| group.fate(ticket))
                .expect("running")
            {
                Fate::Applied(_) => {
                    assert!(present, "seed {seed}: stream {name} told applied is not there");
                    "unknown changes found applied"
                }
                Fate::Dropped => {
                    assert!(!present, "seed {seed}: stream {name} told dropped is there");
                    "unknown changes found dropped"
                }
                Fate::Unknown => "unknown changes still unknown",
            };
            *self.cluster.counts.entry(what).or_default() += 1;
        }
    }

    fn finish(self, totals: &mut BTreeMap<&'static str, u64>) {
        self.cluster.finish(totals);
    }
}

fn seeds() -> Vec<u64> {
    if let Ok(seed) = std::env::var("CAIRN_NODE_SIM_SEED") {
        return vec![seed.parse().expect("CAIRN_NODE_SIM_SEED is a number")];
    }
    let count = std::env::var("CAIRN_NODE_SIM_SEEDS")
        .ok()
        .and_then(|count| count.parse().ok())
        .unwrap_or(32);
    (0..count).collect()
}

/// Run workload `W` for every seed; the counts of all runs.
fn simulate<W: Workload>(name: &str) -> BTreeMap<&'static str, u64> {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
    }
    let steps: usize = std::env::var("CAIRN_NODE_SIM_STEPS")
        .ok()
        .and_then(|steps| steps.parse().ok())
        .unwrap_or(300);
    let mut totals: BTreeMap<&'static str, u64> = BTreeMap::new();
    for seed in seeds() {
        let temp = tempfile::tempdir().expect("tempdir");
        let mut run = W::new(seed, temp.path());
        for _ in 0..steps {
            run.step();
        }
        run.check();
        run.finish(&mut totals);
    }
    eprintln!("node simulator, {name}: {totals:?}");
    for what in ["kills", "restarts", "wipes", "cuts"] {
        assert!(
            totals.get(what).copied().unwrap_or(0) > 0,
            "the runs exercised no {what}: {totals:?}"
        );
    }
    totals
}

/// The server's replica code, three replicas of a partition group through crashes,
/// restarts, wiped disks, one-way cuts, lost messages and trims: nothing acknowledged lost,
/// no offset handed out twice, every replica serving the same log at the end.
#[test]
fn simulated_partition_replicas_keep_every_acknowledged_append() {
    let totals = simulate::<PartitionRun>("partition");
    for what in ["appends acknowledged", "trims", "state transfers"] {
        assert!(
            totals.get(what).copied().unwrap_or(0) > 0,
            "the runs exercised no {what}: {totals:?}"
        );
    }
}

/// The same for three replicas of the metadata group (its ring journal and machine): every
/// acknowledged change applied once on every replica, nothing answered not taken or told
/// dropped ever applied.
#[test]
fn simulated_metadata_replicas_apply_every_acknowledged_change_once() {
    let totals = simulate::<MetadataRun>("metadata");
    assert!(
        totals.get("changes acknowledged").copied().unwrap_or(0) > 0,
        "the runs acknowledged no change: {totals:?}"
    );
}
