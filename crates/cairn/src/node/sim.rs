//! The node simulator: three replicas of one partition group, each the server's own
//! [`LocalGroup`] over a partition journal (its segment log) in a directory of its own,
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
//! The checkers, after the faults heal: every replica applies the same ops and serves the
//! same log; every acknowledged append is served at the offsets it was acknowledged with, by
//! every replica (unless trimmed); no offset is handed out twice; no message is stored twice.
//!
//! `CAIRN_NODE_SIM_SEEDS=<n>` runs seeds `0..n` (default 32); `CAIRN_NODE_SIM_SEED=<s>`
//! replays one; `CAIRN_NODE_SIM_STEPS=<n>` sets the steps of a run (default 300).

use super::{Clock, Inbox, LocalGroup, Peers, TransferPace, Transport};
use crate::partition_group::{self, JournalOptions, LogJournal, LogParams, PartitionError};
use crate::test_support::client_batch_from;
use cairn_machine::partition::PartitionMachine;
use cairn_storage::sim_disk::SimRng;
use cairn_vsr::header::Message;
use cairn_vsr::replica::StateMachine;
use cairn_wire::batch;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

type Group = LocalGroup<PartitionMachine, LogJournal>;

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
struct World {
    base: Instant,
    now_us: AtomicU64,
    net: Mutex<Net>,
    inboxes: Vec<Arc<Inbox>>,
    /// `None` while a replica is down.
    groups: Vec<Mutex<Option<Group>>>,
    /// When each replica wants serving next (its next tick).
    next_serve: Mutex<[Instant; REPLICAS]>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl World {
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
        let message = super::as_carried(CLUSTER, from as u8, PartitionMachine::body_verifies, message);
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
struct SimClock {
    world: Weak<World>,
    replica: usize,
}

impl Clock for SimClock {
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

struct SimTransport {
    world: Weak<World>,
    from: usize,
}

impl Transport for SimTransport {
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
    /// Its outcome was unknown: what the group kept to tell its fate later.
    ticket: Option<super::Ticket>,
    /// The first fate a replica told of it while the run went on (dropped: never stored).
    told_dropped: bool,
}

struct Run {
    seed: u64,
    rng: SimRng,
    world: Arc<World>,
    dirs: Vec<PathBuf>,
    /// A replica wiped and not yet current again: no other may be wiped meanwhile (two
    /// wiped replicas of three may both have held an acknowledged op's only copies).
    wiped: Option<usize>,
    sent: Vec<Sent>,
    /// Per replica: a state transfer was under way at the last upkeep.
    transferring: [bool; REPLICAS],
    next_id: u128,
    counts: HashMap<&'static str, u64>,
}

impl Run {
    fn new(seed: u64, root: &Path) -> Run {
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
            next_serve: Mutex::new([Instant::now(); REPLICAS]),
        });
        let mut run = Run {
            seed,
            rng: SimRng::new(seed),
            world,
            dirs: (0..REPLICAS)
                .map(|replica| root.join(format!("replica-{replica}")))
                .collect(),
            wiped: None,
            sent: Vec::new(),
            transferring: [false; REPLICAS],
            next_id: 1,
            counts: HashMap::new(),
        };
        lock(&run.world.net).loss_per_mille = run.rng.below(30);
        for replica in 0..REPLICAS {
            run.start(replica, true);
        }
        run
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
        let params = LogParams::new(
            PARTITION,
            JournalOptions {
                segment_size_bytes: SEGMENT_SIZE_BYTES,
                relaxed: false,
            },
        );
        let peers = self.peers(replica, format_if_missing);
        let group = partition_group::open_with_peers(&self.dirs[replica], GROUP, params, peers)
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

    fn with<T>(&self, replica: usize, f: impl FnOnce(&mut Group) -> T) -> Option<T> {
        lock(&self.world.groups[replica]).as_mut().map(f)
    }

    /// The replica that takes requests (a client's SDK finds the leader), else any running.
    fn taker(&mut self) -> Option<usize> {
        let up: Vec<usize> = (0..REPLICAS).filter(|&replica| self.is_up(replica)).collect();
        if up.is_empty() {
            return None;
        }
        let primary = up
            .iter()
            .copied()
            .find(|&replica| self.with(replica, |group| group.takes_requests()) == Some(true));
        match primary {
            Some(primary) if !self.rng.chance(1, 10) => Some(primary),
            _ => Some(up[self.rng.below(up.len() as u64) as usize]),
        }
    }

    fn step(&mut self) {
        tracing::debug!(seed = self.seed, now_ms = self.world.now_us.load(Ordering::Acquire) / 1000, state = %self.describe(), "step");
        match self.rng.below(100) {
            0..45 => self.append(),
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
            86..89 => self.trim(),
            89..92 => self.ask_fates(),
            _ => {
                let ms = self.rng.range_inclusive(1, 30);
                self.advance(ms);
            }
        }
        self.shell_upkeep();
    }

    /// Ask a running replica the fate of every append of unknown outcome not yet told
    /// dropped, as a client's replay would; one told dropped must never be stored.
    fn ask_fates(&mut self) {
        let replica = self.rng.below(REPLICAS as u64) as usize;
        let mut sent = std::mem::take(&mut self.sent);
        for sent in sent.iter_mut().filter(|sent| !sent.told_dropped) {
            let Some(ticket) = &sent.ticket else {
                continue;
            };
            if self.with(replica, |group| group.fate(ticket)) == Some(super::Fate::Dropped) {
                self.count("unknown appends told dropped during the run");
                sent.told_dropped = true;
            }
        }
        self.sent = sent;
    }

    /// Let `ms` of virtual time pass.
    fn advance(&self, ms: u64) {
        let until = self.world.now() + Duration::from_millis(ms);
        self.world.run(until, None);
    }

    /// One to three appends at once, on the lanes of the replica a client reached.
    fn append(&mut self) {
        let Some(replica) = self.taker() else {
            return;
        };
        let appends: Vec<(u64, Vec<u8>, Vec<u128>)> = (0..self.rng.range_inclusive(1, 3))
            .map(|_| {
                let count = self.rng.range_inclusive(1, 4) as u32;
                let first_id = self.next_id;
                self.next_id += u128::from(count);
                let payload_bytes = self.rng.range_inclusive(8, 600) as usize;
                let batch = client_batch_from(first_id, count, payload_bytes, first_id as u8);
                let ids = (first_id..first_id + u128::from(count)).collect();
                (self.world.us_of(self.world.now()).max(1), batch, ids)
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
        let Some((results, tickets)) = self.with(replica, |group| {
            let results = group.append_copies(&borrowed);
            (results, group.take_unknown_tickets())
        }) else {
            return;
        };
        // One ticket per append of unknown outcome, in order.
        let mut tickets = tickets.into_iter();
        let mut refused = false;
        for ((_, _, ids), result) in appends.into_iter().zip(results) {
            let not_taken = matches!(
                result,
                Err(PartitionError::Group(super::GroupError::NotTaken { .. }))
            );
            let ticket = matches!(
                result,
                Err(PartitionError::Group(super::GroupError::OutcomeUnknown { .. }))
            )
            .then(|| tickets.next().expect("a ticket per append of unknown outcome"));
            let offsets = match result {
                Ok(offsets) => {
                    self.count("appends acknowledged");
                    assert_eq!(offsets.len(), 1, "seed {}: one batch, one base offset", self.seed);
                    Some(offsets)
                }
                Err(PartitionError::Group(error)) => {
                    if let super::GroupError::NotTaken { reason, .. } = &error
                        && reason.starts_with("a view change dropped")
                    {
                        self.count("appends dropped by a view change");
                    }
                    self.count(match error {
                        super::GroupError::NotTaken { .. } => {
                            refused = true;
                            "appends not taken"
                        }
                        super::GroupError::OutcomeUnknown { .. } => "appends of unknown outcome",
                        _ => panic!("seed {}: an append failed: {error}", self.seed),
                    });
                    None
                }
                Err(error) => panic!("seed {}: an append failed: {error}", self.seed),
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
            let ms = self.rng.range_inclusive(5, 50);
            self.advance(ms);
        }
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

    /// Retention on the primary: the oldest messages leave (an op every replica applies).
    fn trim(&mut self) {
        let Some(replica) =
            (0..REPLICAS).find(|&replica| self.with(replica, |group| group.takes_requests()) == Some(true))
        else {
            return;
        };
        let fraction = self.rng.range_inclusive(1, 3);
        let trimmed = self.with(replica, |group| {
            let below = group.start_offset() + (group.next_offset() - group.start_offset()) * fraction / 10;
            group.trim(below)
        });
        match trimmed {
            Some(Ok(())) => self.count("trims"),
            Some(Err(PartitionError::Group(_))) | None => {}
            Some(Err(error)) => panic!("seed {}: a trim failed: {error}", self.seed),
        }
    }

    /// What the server's partition shell does between requests: remove the segments a
    /// checkpoint or a trim released; and note a wiped replica current again.
    fn shell_upkeep(&mut self) {
        for replica in 0..REPLICAS {
            let removed = self.with(replica, |group| {
                if group.takes_requests() || group.is_current() {
                    group.remove_released_segments().map(|removed| removed.len())
                } else {
                    Ok(0)
                }
            });
            match removed {
                Some(Ok(removed)) => {
                    if removed > 0 {
                        self.count("segments removed");
                    }
                }
                Some(Err(PartitionError::Group(_))) | None => {}
                Some(Err(error)) => panic!("seed {}: removing segments failed: {error}", self.seed),
            }
        }
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
    /// same commit, one of them primary. A last append then commits on all three.
    fn settle(&mut self) {
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
            self.shell_upkeep();
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

    /// Every message replica `replica` serves from offset 0: (offset, id), and its state.
    fn served(&self, replica: usize) -> (Vec<(u64, u128)>, Vec<u8>) {
        self.with(replica, |group| {
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

    fn check(&mut self) {
        // A last append commits once everything healed.
        let deadline = self.world.now() + SETTLE_WITHIN;
        loop {
            let before = self.sent.len();
            self.append();
            if self.sent[before..].iter().any(|sent| sent.offsets.is_some()) {
                break;
            }
            assert!(
                self.world.now() < deadline,
                "seed {}: no append committed after the faults healed: {}",
                self.seed,
                self.describe()
            );
            self.advance(50);
        }
        self.settle();
        let (served, state) = self.served(0);
        for replica in 1..REPLICAS {
            let (other_served, other_state) = self.served(replica);
            assert!(
                other_state == state,
                "seed {}: replica {replica} applied other ops than replica 0",
                self.seed
            );
            assert!(
                other_served == served,
                "seed {}: replica {replica} serves another log than replica 0",
                self.seed
            );
        }
        let start_offset = self.with(0, |group| group.start_offset()).expect("running");
        let by_offset: HashMap<u64, u128> = served.iter().copied().collect();
        assert_eq!(
            by_offset.len(),
            served.len(),
            "seed {}: an offset served twice",
            self.seed
        );
        let mut stored: HashMap<u128, u64> = HashMap::new();
        for &(offset, id) in &served {
            if let Some(first) = stored.insert(id, offset) {
                panic!(
                    "seed {}: message {id} stored twice, at offsets {first} and {offset}",
                    self.seed
                );
            }
        }
        // The fate of every append of unknown outcome, as the replicas tell it now, matches
        // the log: applied at the offsets its reply gives, or dropped and stored nowhere.
        let mut fates: BTreeMap<&'static str, u64> = BTreeMap::new();
        for (index, sent) in self.sent.iter().enumerate() {
            let Some(ticket) = &sent.ticket else {
                continue;
            };
            let fate = self.with(index % REPLICAS, |group| group.fate(ticket));
            match fate.expect("running") {
                super::Fate::Applied(reply) => {
                    *fates.entry("unknown appends found applied").or_default() += 1;
                    let offsets =
                        cairn_machine::partition::decode_append_reply(&reply).unwrap_or_else(|status| {
                            panic!("seed {}: an applied append refused ({status})", self.seed)
                        });
                    for (index, id) in sent.ids.iter().enumerate() {
                        let offset = offsets[0] + index as u64;
                        if offset >= start_offset {
                            assert_eq!(
                                by_offset.get(&offset),
                                Some(id),
                                "seed {}: an append told applied is not served at its offsets",
                                self.seed
                            );
                        }
                    }
                }
                super::Fate::Dropped => {
                    *fates.entry("unknown appends found dropped").or_default() += 1;
                    for id in &sent.ids {
                        assert!(
                            !stored.contains_key(id),
                            "seed {}: message {id} was told dropped, and is stored",
                            self.seed
                        );
                    }
                }
                super::Fate::Unknown => *fates.entry("unknown appends still unknown").or_default() += 1,
            }
        }
        for (what, count) in fates {
            *self.counts.entry(what).or_default() += count;
        }
        let mut minted: HashMap<u64, u128> = HashMap::new();
        for sent in &self.sent {
            if sent.not_taken || sent.told_dropped {
                for id in &sent.ids {
                    assert!(
                        !stored.contains_key(id),
                        "seed {}: message {id} was answered not taken or told dropped, and stored",
                        self.seed
                    );
                }
            }
            let Some(offsets) = &sent.offsets else {
                continue;
            };
            for (index, &id) in sent.ids.iter().enumerate() {
                let offset = offsets[0] + index as u64;
                if let Some(other) = minted.insert(offset, id) {
                    panic!(
                        "seed {}: offset {offset} acknowledged for messages {other} and {id}",
                        self.seed
                    );
                }
                if offset >= start_offset {
                    assert_eq!(
                        by_offset.get(&offset),
                        Some(&id),
                        "seed {}: acknowledged message {id} is not served at its offset {offset}",
                        self.seed
                    );
                }
            }
        }
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

/// The server's replica code, three replicas of a partition group through crashes,
/// restarts, wiped disks, one-way cuts, lost messages and trims: nothing acknowledged lost,
/// no offset handed out twice, every replica serving the same log at the end.
#[test]
fn simulated_partition_replicas_keep_every_acknowledged_append() {
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
        let mut run = Run::new(seed, temp.path());
        for _ in 0..steps {
            run.step();
        }
        run.settle();
        run.check();
        for (what, count) in &run.counts {
            *totals.entry(what).or_default() += count;
        }
        let net = lock(&run.world.net);
        *totals.entry("messages sent").or_default() += net.sent;
        *totals.entry("messages lost").or_default() += net.lost;
        *totals.entry("virtual seconds").or_default() += run.world.now_us.load(Ordering::Acquire) / 1_000_000;
        drop(net);
        for replica in 0..REPLICAS {
            run.kill(replica);
        }
    }
    eprintln!("node simulator: {totals:?}");
    for what in [
        "appends acknowledged",
        "kills",
        "restarts",
        "wipes",
        "trims",
        "state transfers",
    ] {
        assert!(
            totals.get(what).copied().unwrap_or(0) > 0,
            "the runs exercised no {what}: {totals:?}"
        );
    }
}
