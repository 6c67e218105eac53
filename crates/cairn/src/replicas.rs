//! The groups with peers on one node, driven over the replica network (`docs/cluster.md`,
//! "The node shell"): the link between `cairn_bus::Bus` and each group's [`LocalGroup`].
//!
//! - **Receiving.** One task reads the bus's channel and pushes each message into its
//!   group's [`Inbox`] (by the header's group id; a message for a group this node does not
//!   host, or no longer hosts, is dropped: VSR repeats it), then schedules the group.
//! - **Workers.** A few threads take scheduled groups and serve them ([`Served::serve`]: a
//!   group's `serve_inbox` under its lock). A group whose lock a request holds is skipped: the
//!   request takes the inbox itself while it waits, and its next message or the next round
//!   of scheduling serves it again.
//! - **Ticks.** Every few ticks every group is scheduled and takes the ticks due since, so
//!   each replica ticks by wall time.
//! - **Sending.** [`Replicas::transport`] hands a group's messages to the bus, except its
//!   `Commit` heartbeats: those of every group are gathered per peer and sent at each tick
//!   as one `Heartbeats` message (`cairn_vsr::node`), which the receiving node splits back
//!   into each group's `Commit`. So an idle node pair exchanges at most one message per
//!   tick each way, however many groups they share.
//!
//! - **Abdication.** Every tick each node sends every peer its `Heartbeats` message, empty
//!   when it has no primaries, so a node hears each live peer every tick. A node that has
//!   not heard from a quorum of the nodes (itself included) for [`ABDICATE_AFTER_TICKS`]
//!   abdicates: its primaries' heartbeats and prepares are no longer sent, so their backups
//!   stop hearing them and elect others (a one-way cut that keeps its peers' messages from it
//!   would otherwise leave a primary that heartbeats but can commit nothing), and its
//!   replicas' StartViewChange and DoViewChange are withheld too (hearing no primary, they
//!   would otherwise pull the groups its peers run into one view change after another). It
//!   resumes as soon as it hears a quorum again; a new view's StartView makes its replicas
//!   backups.
//!
//! A group is scheduled at most once at a time (a flag set when queued, cleared when a worker
//! takes it), so a busy group costs one slot in the queue however many messages it gets.

use crate::forward::Forwarder;
use crate::node::{GroupJournal, Inbox, LocalGroup, Pushed, TransferPace, Transport};
use crate::partition::{PartitionState, lock};
use cairn_bus::{Bus, Received};
use cairn_vsr::header::{Command, Message};
use cairn_vsr::node::{heartbeat_commits, heartbeat_messages, push_heartbeat_entry};
use cairn_vsr::replica::StateMachine;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, RwLock, Weak};
use std::time::{Duration, Instant};

/// Every group is served every this many ticks, taking the ticks due since (a group with
/// messages is served as they arrive, and a request ticks its group itself): an idle group
/// costs a fifth of serving it every tick, and its timeouts keep their length.
const SCHEDULE_ALL_EVERY_TICKS: u64 = 5;

/// Ticks a node may go without hearing from a quorum of the nodes before it abdicates (see
/// the module doc): as long as a backup waits for its primary before it starts a view change.
const ABDICATE_AFTER_TICKS: u32 = 50;

/// When each node was last heard from (any message on the replica network): for abdication,
/// and so a send is forwarded only to a node this one hears (`forward.rs`).
pub struct PeersHeard {
    started: Instant,
    /// By replica index: milliseconds since `started`.
    heard_ms: Vec<AtomicU64>,
    /// By replica index: whether that node's last `Heartbeats` said it hears this one.
    hears_us: Vec<AtomicBool>,
}

/// A node hears a peer while a message of it arrived within this (each node sends each peer
/// a `Heartbeats` message every 10 ms tick).
pub const HEARING_WINDOW: Duration = Duration::from_millis(250);

impl PeersHeard {
    pub fn new(node_count: usize) -> PeersHeard {
        PeersHeard {
            started: Instant::now(),
            heard_ms: (0..node_count).map(|_| AtomicU64::new(0)).collect(),
            hears_us: (0..node_count).map(|_| AtomicBool::new(false)).collect(),
        }
    }

    fn note_heard_by(&self, peer: u8, hears_us: bool) {
        if let Some(flag) = self.hears_us.get(usize::from(peer)) {
            flag.store(hears_us, Ordering::Release);
        }
    }

    /// The nodes heard within [`HEARING_WINDOW`], a bit per replica index (`me` included).
    fn hearing_mask(&self, me: u8) -> u128 {
        (0..self.heard_ms.len() as u8)
            .filter(|&peer| peer == me || self.silent_for(peer) <= HEARING_WINDOW)
            .fold(0u128, |mask, peer| mask | (1 << peer))
    }

    /// Whether messages pass both ways between this node and `peer` now: this node heard it
    /// within [`HEARING_WINDOW`], and its last `Heartbeats` said it hears this node.
    pub fn both_ways(&self, peer: u8) -> bool {
        self.silent_for(peer) <= HEARING_WINDOW
            && self
                .hears_us
                .get(usize::from(peer))
                .is_some_and(|flag| flag.load(Ordering::Acquire))
    }

    fn note(&self, from: u8) {
        if let Some(heard) = self.heard_ms.get(usize::from(from)) {
            heard.store(self.started.elapsed().as_millis() as u64, Ordering::Release);
        }
    }

    /// How long since `peer` was last heard (since this node started, if never).
    pub fn silent_for(&self, peer: u8) -> Duration {
        let now_ms = self.started.elapsed().as_millis() as u64;
        let heard_ms = self
            .heard_ms
            .get(usize::from(peer))
            .map_or(0, |heard| heard.load(Ordering::Acquire));
        Duration::from_millis(now_ms.saturating_sub(heard_ms))
    }
}

/// How a worker serves a group.
pub trait Served: Send + Sync {
    /// Deliver the group's inbox and tick it if due, unless its lock is taken (then the
    /// holder serves it). Runs on a worker thread.
    fn serve(&self);
}

/// A group of this node behind a mutex: the worker takes the lock only if it is free.
impl<S, J> Served for Mutex<Option<LocalGroup<S, J>>>
where
    S: StateMachine + Send,
    J: GroupJournal + Send,
{
    fn serve(&self) {
        let Ok(mut guard) = self.try_lock() else {
            return;
        };
        if let Some(group) = guard.as_mut()
            && let Err(error) = group.serve_inbox()
        {
            tracing::error!(%error, "a replicated group stopped while serving its peers' messages");
        }
    }
}

/// A partition of this node: its worker serves it only while it is serving and its lock is
/// free (a request holding it takes the inbox itself).
impl Served for Mutex<PartitionState> {
    fn serve(&self) {
        let Ok(mut state) = self.try_lock() else {
            return;
        };
        if let PartitionState::Serving(data) = &mut *state {
            data.serve_peers();
        }
    }
}

/// A group whose holder is made after its inbox (the replica opens with the inbox): served
/// once [`Pending::set`] names the holder, and never after the holder is dropped.
#[derive(Default)]
pub struct Pending(OnceLock<Weak<dyn Served>>);

impl Pending {
    pub fn set(&self, served: Weak<dyn Served>) {
        let _ = self.0.set(served);
    }
}

impl Served for Pending {
    fn serve(&self) {
        if let Some(served) = self.0.get().and_then(Weak::upgrade) {
            served.serve();
        }
    }
}

/// One hosted group.
struct Entry {
    inbox: Arc<Inbox>,
    served: Arc<dyn Served>,
    /// Set while the group waits in the run queue.
    scheduled: AtomicBool,
}

/// Groups waiting for a worker, and the workers waiting for a group.
#[derive(Default)]
struct RunQueue {
    entries: VecDeque<Arc<Entry>>,
    idle_workers: usize,
}

/// The groups with peers on this node.
pub struct Replicas {
    bus: Arc<Bus>,
    cluster: u128,
    /// `Commit` heartbeats gathered since the last tick, by peer.
    heartbeats: Arc<Mutex<BTreeMap<u8, Vec<u8>>>>,
    groups: RwLock<HashMap<u64, Arc<Entry>>>,
    run_queue: Mutex<RunQueue>,
    runnable: Condvar,
    stopping: AtomicBool,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// The pace every group's incoming state transfers share.
    transfer_pace: Arc<TransferPace>,
    /// When each peer was last heard (any message).
    heard: Arc<PeersHeard>,
    /// Set while this node abdicates (see the module doc).
    abdicating: Arc<AtomicBool>,
    tick: Duration,
    /// Sends forwarded to and from the nodes of partitions' primaries (`forward.rs`).
    forwarder: Arc<Forwarder>,
}

impl Replicas {
    /// Start serving groups over `bus`: the receiving task on the current tokio runtime,
    /// `workers` worker threads and a ticker every `tick`. Incoming state transfers move at
    /// most `transfer_bytes_per_second` in all.
    pub fn start(
        bus: Arc<Bus>,
        cluster: u128,
        mut received: tokio::sync::mpsc::Receiver<Received>,
        workers: usize,
        tick: Duration,
        transfer_bytes_per_second: u64,
    ) -> Arc<Replicas> {
        let heard = Arc::new(PeersHeard::new(bus.node_count()));
        let replicas = Arc::new(Replicas {
            cluster,
            heartbeats: Arc::default(),
            groups: RwLock::new(HashMap::new()),
            run_queue: Mutex::new(RunQueue::default()),
            runnable: Condvar::new(),
            stopping: AtomicBool::new(false),
            threads: Mutex::new(Vec::new()),
            transfer_pace: Arc::new(TransferPace::new(transfer_bytes_per_second)),
            heard: heard.clone(),
            abdicating: Arc::default(),
            tick,
            forwarder: Arc::new(Forwarder::new(bus.clone(), cluster, heard)),
            bus,
        });
        {
            let replicas = replicas.clone();
            tokio::spawn(async move {
                while let Some(Received { message, from, .. }) = received.recv().await {
                    if replicas.stopping.load(Ordering::Acquire) {
                        return;
                    }
                    replicas.heard.note(from);
                    if message.header.command == Command::Heartbeats {
                        let me = replicas.bus.index();
                        replicas
                            .heard
                            .note_heard_by(from, message.header.context & (1 << me) != 0);
                    }
                    replicas.deliver(message);
                }
            });
        }
        let mut threads = Vec::new();
        for worker in 0..workers.max(1) {
            let replicas = replicas.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("cairn-replica-{worker}"))
                .spawn(move || replicas.work());
            match spawned {
                Ok(thread) => threads.push(thread),
                Err(error) => tracing::error!(%error, "cannot start a replica worker thread"),
            }
        }
        {
            let replicas = replicas.clone();
            let spawned = std::thread::Builder::new()
                .name("cairn-replica-ticks".to_string())
                .spawn(move || {
                    let mut next = Instant::now();
                    let mut ticks = 0u64;
                    while !replicas.stopping.load(Ordering::Acquire) {
                        next += tick;
                        let now = Instant::now();
                        if next > now {
                            std::thread::sleep(next - now);
                        } else {
                            // Behind (a stalled machine): tick once and catch up.
                            next = now;
                        }
                        replicas.check_quorum_heard();
                        replicas.send_heartbeats();
                        ticks += 1;
                        if ticks.is_multiple_of(SCHEDULE_ALL_EVERY_TICKS) {
                            replicas.schedule_all();
                        }
                    }
                });
            match spawned {
                Ok(thread) => threads.push(thread),
                Err(error) => tracing::error!(%error, "cannot start the replica tick thread"),
            }
        }
        *lock(&replicas.threads) = threads;
        replicas
    }

    /// Host group `group`: its messages go to the returned inbox, and `served` is served
    /// when they arrive and every few ticks (`SCHEDULE_ALL_EVERY_TICKS`).
    pub fn add_group(&self, group: u64, served: Arc<dyn Served>) -> Arc<Inbox> {
        let inbox = Arc::new(Inbox::default());
        let entry = Arc::new(Entry {
            inbox: inbox.clone(),
            served,
            scheduled: AtomicBool::new(false),
        });
        let previous = write(&self.groups).insert(group, entry);
        debug_assert!(previous.is_none(), "group {group} hosted twice");
        inbox
    }

    /// Stop hosting `group` (deleted): its messages are dropped from now on, and sends
    /// forwarded for it refused.
    pub fn remove_group(&self, group: u64) {
        write(&self.groups).remove(&group);
        self.forwarder.unregister(group);
    }

    /// Sends forwarded between this node and the nodes of partitions' primaries.
    pub fn forwarder(&self) -> &Arc<Forwarder> {
        &self.forwarder
    }

    /// This node's replica index.
    pub fn index(&self) -> u8 {
        self.bus.index()
    }

    /// Set while this node abdicates (see the module doc).
    pub fn abdicating(&self) -> Arc<AtomicBool> {
        self.abdicating.clone()
    }

    /// The pace of this node's incoming state transfers.
    pub fn transfer_pace(&self) -> Arc<TransferPace> {
        self.transfer_pace.clone()
    }

    /// How a group's replica sends to its peers.
    pub fn transport(&self) -> Arc<dyn Transport> {
        Arc::new(BusTransport {
            bus: self.bus.clone(),
            heartbeats: self.heartbeats.clone(),
            abdicating: self.abdicating.clone(),
        })
    }

    /// Send the heartbeats gathered since the last tick: one message per peer.
    fn send_heartbeats(&self) {
        let mut batches = std::mem::take(&mut *lock(&self.heartbeats));
        let me = self.bus.index();
        // Which nodes this one hears now, in every `Heartbeats` message's `context`: a peer
        // forwards sends here only while this node hears it (`forward.rs`).
        let hearing = self.heard.hearing_mask(me);
        for to in (0..self.bus.node_count() as u8).filter(|&to| to != me) {
            let batch = batches.remove(&to).unwrap_or_default();
            let messages = heartbeat_messages(self.cluster, me, hearing, &batch);
            if messages.is_empty() {
                // No primary here: an empty one, so the peer hears this node every tick.
                let mut header = cairn_vsr::header::Header::new(Command::Heartbeats, self.cluster);
                header.replica = me;
                header.context = hearing;
                let _ = self.bus.send(to, Message::new(header, bytes::Bytes::new()));
            }
            for message in messages {
                let _ = self.bus.send(to, message);
            }
        }
    }

    /// Abdicate while this node has not heard from a quorum of the nodes for
    /// [`ABDICATE_AFTER_TICKS`]; resume once it has (see the module doc).
    fn check_quorum_heard(&self) {
        let nodes = self.bus.node_count();
        if nodes < 2 {
            return;
        }
        let window = self.tick * ABDICATE_AFTER_TICKS;
        if self.heard.started.elapsed() < window {
            return;
        }
        let window_ms = window.as_millis();
        let me = self.bus.index();
        let heard = 1
            + (0..nodes as u8)
                .filter(|&peer| peer != me && self.heard.silent_for(peer) <= window)
                .count();
        let abdicate = heard < nodes / 2 + 1;
        if self.abdicating.swap(abdicate, Ordering::AcqRel) != abdicate {
            if abdicate {
                tracing::warn!(
                    heard_nodes = heard,
                    nodes,
                    "this node has not heard from a quorum of the nodes for {window_ms} ms: it abdicates until it hears a quorum again (its primaries' heartbeats and prepares and its replicas' view-change votes are withheld, so their groups elect primaries elsewhere; its primaries refuse requests)"
                );
            } else {
                tracing::info!(
                    heard_nodes = heard,
                    nodes,
                    "this node hears a quorum of the nodes again: it no longer abdicates"
                );
            }
        }
    }

    /// Stop the workers and the ticker (the bus is the caller's to shut down).
    pub fn stop(&self) {
        {
            // Under the queue's lock: a worker between its check and its wait cannot miss it.
            let _queue = lock(&self.run_queue);
            self.stopping.store(true, Ordering::Release);
            self.runnable.notify_all();
        }
        for thread in std::mem::take(&mut *lock(&self.threads)) {
            let _ = thread.join();
        }
    }

    fn deliver(&self, message: Message) {
        if matches!(
            message.header.command,
            Command::ForwardSend | Command::ForwardReply
        ) {
            self.forwarder.on_message(message);
            return;
        }
        if message.header.command == Command::Heartbeats {
            for commit in heartbeat_commits(&message) {
                self.deliver(commit);
            }
            return;
        }
        let entry = read(&self.groups).get(&message.header.group).cloned();
        if let Some(entry) = entry {
            // A full inbox drops the message (counted there): the group is behind, and VSR
            // repeats what it needs. One its holder waits for is the holder's to take: a
            // worker woken for it would find the group's lock taken.
            match entry.inbox.push(message) {
                Pushed::Queued | Pushed::Dropped => self.schedule(&entry),
                Pushed::ToWaiter => {}
            }
        }
    }

    fn schedule(&self, entry: &Arc<Entry>) {
        if !entry.scheduled.swap(true, Ordering::AcqRel) {
            let mut queue = lock(&self.run_queue);
            queue.entries.push_back(entry.clone());
            // A notify is a system call even with nobody waiting: only when a worker is.
            if queue.idle_workers > 0 {
                self.runnable.notify_one();
            }
        }
    }

    fn schedule_all(&self) {
        let entries: Vec<Arc<Entry>> = read(&self.groups).values().cloned().collect();
        for entry in &entries {
            self.schedule(entry);
        }
    }

    fn work(&self) {
        loop {
            let entry = {
                let mut queue = lock(&self.run_queue);
                loop {
                    if self.stopping.load(Ordering::Acquire) {
                        return;
                    }
                    if let Some(entry) = queue.entries.pop_front() {
                        break entry;
                    }
                    queue.idle_workers += 1;
                    queue = match self.runnable.wait(queue) {
                        Ok(queue) => queue,
                        Err(poisoned) => poisoned.into_inner(),
                    };
                    queue.idle_workers -= 1;
                }
            };
            // Cleared first: a message that arrives while the group is served schedules it
            // again.
            entry.scheduled.store(false, Ordering::Release);
            entry.served.serve();
        }
    }
}

/// A group's sends to its peers, on the bus; its heartbeats to the node's batch. A full
/// queue drops the message (counted by the bus): VSR repeats what is lost.
struct BusTransport {
    bus: Arc<Bus>,
    heartbeats: Arc<Mutex<BTreeMap<u8, Vec<u8>>>>,
    abdicating: Arc<AtomicBool>,
}

impl Transport for BusTransport {
    fn send(&self, to: u8, message: Message) {
        let withheld = match message.header.command {
            // Its backups must stop hearing this node's primaries.
            Command::Commit => true,
            Command::Prepare => message.header.replica == self.bus.index(),
            // Its replicas, which hear no primary, must not pull the groups its peers run
            // into one view change after another.
            Command::StartViewChange | Command::DoViewChange => true,
            _ => false,
        };
        if withheld && self.abdicating.load(Ordering::Acquire) {
            return;
        }
        if message.header.command == Command::Commit {
            push_heartbeat_entry(lock(&self.heartbeats).entry(to).or_default(), &message.header);
        } else {
            let _ = self.bus.send(to, message);
        }
    }
}

pub(crate) fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub(crate) fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::{GroupError, Peers};
    use crate::partition_group::{JournalOptions, LogJournal, LogParams};
    use crate::test_support::client_batch;
    use cairn_bus::{BusConfig, ClusterKey, NodeAddress};
    use cairn_machine::metadata::{MetadataMachine, MetadataOp, OPERATION_METADATA};
    use cairn_machine::partition::PartitionMachine;
    use cairn_vsr::journal::BodyRule;
    use std::path::Path;

    const CLUSTER: u128 = 0xb05_c1a5;
    const METADATA_GROUP: u64 = 0;
    const PARTITION_GROUP: u64 = 9 | 1 << 63;
    const WITHIN: Duration = Duration::from_secs(30);

    type Metadata = Arc<Mutex<Option<LocalGroup<MetadataMachine>>>>;
    type Partition = Arc<Mutex<Option<LocalGroup<PartitionMachine, LogJournal>>>>;

    /// One node: its bus, its replicas, and its replica of a metadata and a partition group.
    struct TestNode {
        bus: Arc<Bus>,
        replicas: Arc<Replicas>,
        metadata: Metadata,
        partition: Partition,
    }

    fn prepare_rule(group: u64) -> BodyRule {
        if group == METADATA_GROUP {
            MetadataMachine::body_verifies
        } else {
            PartitionMachine::body_verifies
        }
    }

    /// A node's bus and replicas on `listener`, as node `index` of `addresses`.
    fn start_bus(
        index: u8,
        listener: tokio::net::TcpListener,
        addresses: &[std::net::SocketAddr],
    ) -> (Arc<Bus>, Arc<Replicas>) {
        let nodes = addresses
            .iter()
            .enumerate()
            .map(|(i, address)| NodeAddress {
                id: i as u32 + 1,
                replica: address.to_string(),
            })
            .collect();
        let mut config = BusConfig::new(
            CLUSTER,
            u32::from(index) + 1,
            nodes,
            ClusterKey::derive(b"the test cluster's secret"),
            Arc::new(prepare_rule),
            cairn_vsr::constants::Shape::PARTITION.message_size_max,
        );
        config.backoff_max = Duration::from_millis(200);
        let (bus, received) = Bus::start(config, listener).expect("bus");
        let bus = Arc::new(bus);
        let replicas = Replicas::start(
            bus.clone(),
            CLUSTER,
            received,
            2,
            Duration::from_millis(10),
            64 << 20,
        );
        (bus, replicas)
    }

    fn peers(replicas: &Replicas, index: u8, inbox: Arc<Inbox>) -> Peers {
        Peers {
            replica: index,
            replica_count: 3,
            cluster: CLUSTER,
            transport: replicas.transport(),
            inbox,
            tick: Duration::from_millis(10),
            request_timeout: Duration::from_secs(20),
            format_if_missing: true,
            transfer_pace: replicas.transfer_pace(),
            abdicating: replicas.abdicating(),
            primary_seen: Arc::default(),
            clock: Arc::new(crate::node::WallClock),
        }
    }

    /// Open (format) node `index`'s replica of metadata-shaped group `group` in `dir`.
    async fn open_metadata(replicas: &Replicas, dir: &Path, index: u8, group: u64) -> Metadata {
        open_metadata_with(replicas, dir, index, group, true).await
    }

    async fn open_metadata_with(
        replicas: &Replicas,
        dir: &Path,
        index: u8,
        group: u64,
        format_if_missing: bool,
    ) -> Metadata {
        let metadata: Metadata = Arc::new(Mutex::new(None));
        let peers = Peers {
            format_if_missing,
            ..peers(replicas, index, replicas.add_group(group, metadata.clone()))
        };
        let dir = dir.to_path_buf();
        let opened = blocking(move || {
            LocalGroup::open_with_peers(
                &dir,
                group,
                &(MetadataMachine::body_verifies as BodyRule),
                MetadataMachine::default,
                Some(peers),
            )
        })
        .await
        .expect("open a metadata-shaped group");
        *metadata.lock().expect("lock") = Some(opened);
        metadata
    }

    async fn start_node(
        dir: &Path,
        index: u8,
        listener: tokio::net::TcpListener,
        addresses: &[std::net::SocketAddr],
    ) -> TestNode {
        start_node_with(dir, index, listener, addresses, true).await
    }

    /// [`start_node`]; `format_if_missing: false` for a node whose groups existed before (a
    /// missing directory is then a wiped replica).
    async fn start_node_with(
        dir: &Path,
        index: u8,
        listener: tokio::net::TcpListener,
        addresses: &[std::net::SocketAddr],
        format_if_missing: bool,
    ) -> TestNode {
        let (bus, replicas) = start_bus(index, listener, addresses);
        let metadata = open_metadata_with(
            &replicas,
            &dir.join("metadata"),
            index,
            METADATA_GROUP,
            format_if_missing,
        )
        .await;
        let partition: Partition = Arc::new(Mutex::new(None));
        let inbox = replicas.add_group(PARTITION_GROUP, partition.clone());
        let peers_p = Peers {
            format_if_missing,
            ..peers(&replicas, index, inbox)
        };
        let dir = dir.to_path_buf();
        let params = LogParams::new(
            3,
            JournalOptions {
                segment_size_bytes: 64 * 1024,
                relaxed: false,
            },
        );
        let group = tokio::task::spawn_blocking(move || {
            LocalGroup::open_with_peers(
                &dir.join("partition"),
                PARTITION_GROUP,
                &params,
                || PartitionMachine::new(3),
                Some(peers_p),
            )
        })
        .await
        .expect("join")
        .expect("open the partition group");
        *partition.lock().expect("lock") = Some(group);
        TestNode {
            bus,
            replicas,
            metadata,
            partition,
        }
    }

    impl TestNode {
        /// SIGKILL, as far as one process can: the node stops serving and sending, and its
        /// groups are dropped without a close.
        async fn crash(self) {
            self.bus.shutdown().await;
            let replicas = self.replicas.clone();
            tokio::task::spawn_blocking(move || replicas.stop())
                .await
                .expect("join");
            self.metadata.lock().expect("lock").take();
            self.partition.lock().expect("lock").take();
        }
    }

    /// Three listeners on loopback and their addresses (node `i` listens on the `i`th).
    async fn bind_three() -> (Vec<tokio::net::TcpListener>, Vec<std::net::SocketAddr>) {
        let mut listeners = Vec::new();
        for _ in 0..3 {
            listeners.push(tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind"));
        }
        let addresses = listeners
            .iter()
            .map(|listener| listener.local_addr().expect("address"))
            .collect();
        (listeners, addresses)
    }

    async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        tokio::task::spawn_blocking(f).await.expect("join")
    }

    async fn eventually(what: &str, condition: impl Fn() -> bool) {
        let deadline = Instant::now() + WITHIN;
        while !condition() {
            assert!(
                Instant::now() < deadline,
                "{what} did not happen within {WITHIN:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Three nodes under `dir` (`node-<index>`), each with a metadata and a partition group,
    /// and their replica addresses.
    async fn start_three(dir: &Path) -> (Vec<Option<TestNode>>, Vec<std::net::SocketAddr>) {
        let (listeners, addresses) = bind_three().await;
        let mut nodes = Vec::new();
        for (index, listener) in listeners.into_iter().enumerate() {
            let dir = dir.join(format!("node-{index}"));
            nodes.push(Some(start_node(&dir, index as u8, listener, &addresses).await));
        }
        (nodes, addresses)
    }

    /// Wait until the nodes still up hold a primary of both groups (after a node crashed).
    async fn new_primaries(nodes: &[Option<TestNode>]) {
        eventually("new primaries for both groups on the nodes left", || {
            nodes.iter().flatten().any(|node| takes(&node.metadata))
                && nodes.iter().flatten().any(|node| takes(&node.partition))
        })
        .await;
    }

    fn takes<T: StateMachine, J: GroupJournal>(group: &Mutex<Option<LocalGroup<T, J>>>) -> bool {
        group
            .lock()
            .expect("lock")
            .as_ref()
            .is_some_and(|group| group.takes_requests())
    }

    fn streams(group: &Metadata) -> usize {
        group
            .lock()
            .expect("lock")
            .as_ref()
            .map_or(0, |group| group.state_machine().state.streams.len())
    }

    fn next_offset(group: &Partition) -> u64 {
        group
            .lock()
            .expect("lock")
            .as_ref()
            .map_or(0, |group| group.state_machine().state().next_offset)
    }

    fn create_stream(group: &Metadata, n: u32) -> Result<Vec<u8>, GroupError> {
        let op = MetadataOp::CreateStream {
            name: format!("s{n}"),
            created_at_us: 1,
        };
        let mut guard = group.lock().expect("lock");
        guard
            .as_mut()
            .expect("up")
            .submit(OPERATION_METADATA, &op.encode())
    }

    fn append(group: &Partition, n: u8) -> Result<Vec<u64>, String> {
        let batch = client_batch(10, 1000, n);
        let mut guard = group.lock().expect("lock");
        guard
            .as_mut()
            .expect("up")
            .append(1_000, &[&batch[..]])
            .map_err(|error| format!("{error:?}"))
    }

    /// Three nodes, each with its bus, its workers and two groups (metadata and a
    /// partition), over TCP on loopback: both groups commit through one connection per node
    /// pair; the node hosting both primaries dies; the other two elect new primaries for both
    /// groups, which commit again with offsets that continue.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn groups_replicate_over_the_bus_and_fail_over_when_a_node_dies() {
        let temp = tempfile::tempdir().expect("tempdir");
        let (mut nodes, _) = start_three(temp.path()).await;
        let first = nodes[0].as_ref().expect("up");
        assert!(
            takes(&first.metadata) && takes(&first.partition),
            "view 0: node 0 is primary of both"
        );
        for n in 0..3 {
            let metadata = first.metadata.clone();
            blocking(move || create_stream(&metadata, n))
                .await
                .expect("metadata committed");
            let partition = first.partition.clone();
            let offsets = blocking(move || append(&partition, n as u8))
                .await
                .expect("append committed");
            assert_eq!(offsets[0], u64::from(n) * 10);
        }
        for node in nodes.iter().flatten() {
            eventually("every node applies both groups' ops", || {
                streams(&node.metadata) == 3 && next_offset(&node.partition) == 30
            })
            .await;
        }
        assert!(
            nodes[0]
                .as_ref()
                .expect("up")
                .bus
                .counters()
                .messages_sent
                .load(Ordering::Relaxed)
                > 0
        );

        nodes[0].take().expect("up").crash().await;
        new_primaries(&nodes).await;
        let metadata_primary = nodes
            .iter()
            .flatten()
            .find(|node| takes(&node.metadata))
            .expect("primary");
        let metadata = metadata_primary.metadata.clone();
        blocking(move || create_stream(&metadata, 100))
            .await
            .expect("committed after failover");
        let partition_primary = nodes
            .iter()
            .flatten()
            .find(|node| takes(&node.partition))
            .expect("primary");
        let partition = partition_primary.partition.clone();
        let offsets = blocking(move || append(&partition, 100))
            .await
            .expect("committed after failover");
        assert_eq!(
            offsets[0], 30,
            "offsets continue after the failover, none handed out twice"
        );
        for node in nodes.into_iter().flatten() {
            node.crash().await;
        }
    }

    /// Append `ops` small ops (one batch of one message each) to `group`, eight per round.
    fn append_many(group: &Partition, ops: usize) {
        let batch = client_batch(1, 100, 7);
        let mut guard = group.lock().expect("lock");
        let group = guard.as_mut().expect("up");
        for round in 0..ops.div_ceil(8) {
            let count = 8.min(ops - round * 8);
            let batches = [&batch[..]];
            let appends: Vec<(u64, &[&[u8]])> = (0..count).map(|_| (1_000, &batches[..])).collect();
            for result in group.append_copies(&appends) {
                result.expect("append committed");
            }
        }
    }

    /// A replica stopped while its peers ran past its journal's window catches up by state
    /// transfer over the bus: the metadata-shaped group takes a peer's checkpoint and keeps
    /// its ring journal; the partition fetches the peer's log as segments, verified, and
    /// makes it its live journal. Afterwards its log holds exactly the primary's ops.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_replica_behind_its_peers_journals_catches_up_by_state_transfer() {
        const STREAMS: u32 = 100;
        const APPENDS: usize = 1_300;
        let temp = tempfile::tempdir().expect("tempdir");
        let (mut nodes, addresses) = start_three(temp.path()).await;
        let first = nodes[0].as_ref().expect("up");
        let (metadata, partition) = (first.metadata.clone(), first.partition.clone());
        blocking(move || create_stream(&metadata, 0))
            .await
            .expect("committed");
        blocking(move || append_many(&partition, 3)).await;
        eventually("node 2 applies the first ops", || {
            let node = nodes[2].as_ref().expect("up");
            streams(&node.metadata) == 1 && next_offset(&node.partition) == 3
        })
        .await;
        nodes[2].take().expect("up").crash().await;

        // Beyond both journals' windows (64 metadata slots, 1 024 partition slots).
        let first = nodes[0].as_ref().expect("up");
        let (metadata, partition) = (first.metadata.clone(), first.partition.clone());
        blocking(move || {
            for n in 1..STREAMS {
                create_stream(&metadata, n).expect("committed");
            }
        })
        .await;
        blocking(move || append_many(&partition, APPENDS)).await;
        let expected_offset = 3 + APPENDS as u64;

        let listener = tokio::net::TcpListener::bind(addresses[2]).await.expect("rebind");
        let dir = temp.path().join("node-2");
        nodes[2] = Some(start_node(&dir, 2, listener, &addresses).await);
        let back = nodes[2].as_ref().expect("up");
        eventually("the restarted node catches up with both groups", || {
            streams(&back.metadata) == STREAMS as usize && next_offset(&back.partition) == expected_offset
        })
        .await;

        // The partition caught up by a transfer: its live journal is one a transfer brought,
        // and it holds the primary's ops, op for op, from where it begins.
        let generation =
            cairn_storage::transfer::live_generation(&cairn_storage::io::RealDisk, &dir.join("partition"))
                .expect("live generation");
        assert!(
            generation >= 1,
            "the partition's live journal came by state transfer"
        );
        let (primary, caught_up) = (nodes[0].as_ref().expect("up"), back);
        {
            let primary_guard = primary.partition.lock().expect("lock");
            let back_guard = caught_up.partition.lock().expect("lock");
            let (primary_log, back_log) = (
                primary_guard.as_ref().expect("up").log(),
                back_guard.as_ref().expect("up").log(),
            );
            assert_eq!(back_log.first_op(), primary_log.first_op());
            let last = back_log.last_op();
            assert!(last >= APPENDS as u64, "the caught-up log ends at op {last}");
            for op in back_log.first_op()..=last {
                assert_eq!(
                    back_log.read_op(op).expect("read the caught-up log"),
                    primary_log.read_op(op).expect("read the primary's log"),
                    "op {op}"
                );
            }
        }

        // Wiped: node 2 stops, loses every file, and the others go on past both windows. It
        // rejoins as a wiped replica of both groups, by state transfer.
        nodes[2].take().expect("up").crash().await;
        std::fs::remove_dir_all(&dir).expect("wipe node 2");
        let first = nodes[0].as_ref().expect("up");
        let (metadata, partition) = (first.metadata.clone(), first.partition.clone());
        blocking(move || {
            for n in STREAMS..2 * STREAMS {
                create_stream(&metadata, n).expect("committed");
            }
        })
        .await;
        blocking(move || append_many(&partition, APPENDS)).await;
        let expected_offset = 3 + 2 * APPENDS as u64;
        let listener = tokio::net::TcpListener::bind(addresses[2]).await.expect("rebind");
        nodes[2] = Some(start_node_with(&dir, 2, listener, &addresses, false).await);
        let back = nodes[2].as_ref().expect("up");
        eventually("the wiped node catches up with both groups", || {
            streams(&back.metadata) == 2 * STREAMS as usize && next_offset(&back.partition) == expected_offset
        })
        .await;
        assert!(
            cairn_storage::transfer::live_generation(&cairn_storage::io::RealDisk, &dir.join("partition"))
                .expect("live generation")
                >= 1,
            "the wiped partition's journal came by state transfer"
        );

        // Damaged: every superblock copy of node 2's partition replica fails verification.
        // Restarted, the replica's files go to quarantine whole and it rejoins wiped.
        nodes[2].take().expect("up").crash().await;
        let superblock = dir.join("partition").join("superblock");
        let mut bytes = std::fs::read(&superblock).expect("read the superblock");
        for copy in bytes.chunks_mut(cairn_vsr::durable::COPY_SIZE) {
            copy[100] ^= 0x40;
        }
        std::fs::write(&superblock, &bytes).expect("damage the superblock");
        let listener = tokio::net::TcpListener::bind(addresses[2]).await.expect("rebind");
        nodes[2] = Some(start_node_with(&dir, 2, listener, &addresses, false).await);
        let back = nodes[2].as_ref().expect("up");
        eventually("the damaged replica is rebuilt from its peers", || {
            next_offset(&back.partition) == expected_offset
                && takes(&nodes[0].as_ref().expect("up").partition)
        })
        .await;
        assert_eq!(
            std::fs::read(dir.join("partition.quarantine.0").join("superblock")).expect("kept"),
            bytes,
            "the damaged files are kept, byte for byte"
        );

        // It is a member again: with the primary of both groups gone, node 1 and the
        // rejoined node 2 elect new primaries, which commit with offsets that continue.
        nodes[0].take().expect("up").crash().await;
        new_primaries(&nodes).await;
        let partition = nodes
            .iter()
            .flatten()
            .find(|node| takes(&node.partition))
            .expect("primary")
            .partition
            .clone();
        let offsets = blocking(move || append(&partition, 1)).await.expect("committed");
        assert_eq!(
            offsets[0], expected_offset,
            "offsets continue, none handed out twice"
        );
        for node in nodes.into_iter().flatten() {
            node.crash().await;
        }
    }

    /// Many idle groups on three nodes: their `Commit` heartbeats travel as one message per
    /// node pair and tick, and every backup keeps hearing its primary (no view change).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn idle_groups_share_one_heartbeat_message_per_peer_and_tick() {
        const GROUPS: u64 = 40;
        let temp = tempfile::tempdir().expect("tempdir");
        let (listeners, addresses) = bind_three().await;
        let mut nodes = Vec::new();
        for (index, listener) in listeners.into_iter().enumerate() {
            let (bus, replicas) = start_bus(index as u8, listener, &addresses);
            let mut groups = Vec::new();
            for group in 1..=GROUPS {
                let dir = temp
                    .path()
                    .join(format!("node-{index}"))
                    .join(format!("group-{group}"));
                groups.push(open_metadata(&replicas, &dir, index as u8, group).await);
            }
            nodes.push((bus, replicas, groups));
        }
        // Every group has its primary on node 0 (view 0) and stays so while idle.
        let primaries_on_first = |nodes: &[(Arc<Bus>, Arc<Replicas>, Vec<Metadata>)]| {
            nodes[0].2.iter().all(|group| takes(group))
                && nodes[1..]
                    .iter()
                    .all(|(_, _, groups)| groups.iter().all(|group| !takes(group)))
        };
        assert!(primaries_on_first(&nodes));
        // Let connections settle, then count what node 0 sends over many heartbeat intervals.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let sent = |nodes: &[(Arc<Bus>, Arc<Replicas>, Vec<Metadata>)]| {
            nodes[0].0.counters().messages_sent.load(Ordering::Relaxed)
        };
        let (before, started) = (sent(&nodes), Instant::now());
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let (messages, ticks) = (sent(&nodes) - before, started.elapsed().as_millis() as u64 / 10);
        eprintln!("node 0 sent {messages} messages in about {ticks} ticks to 2 peers, for {GROUPS} groups");
        // Unbatched, 40 primaries would send 40 × 2 Commits per 10 ticks: 8 per tick.
        assert!(
            messages <= 2 * (ticks + 2),
            "{messages} messages from node 0 in about {ticks} ticks: more than one per peer and tick"
        );
        assert!(messages > 0, "heartbeats were sent");
        assert!(
            primaries_on_first(&nodes),
            "no backup lost its primary while idle"
        );
        for (bus, replicas, _) in nodes {
            bus.shutdown().await;
            blocking(move || replicas.stop()).await;
        }
    }

    // ---- catalogs of a cluster ----

    type SharedCatalog = Arc<RwLock<crate::catalog::Catalog>>;

    /// The ids the first stream and its first topic get.
    const STREAM: u32 = 0;
    const TOPIC: u32 = 0;
    const DOOMED: u32 = 1;

    /// One node's catalog with peers: its metadata group and partitions over its bus.
    struct CatalogNode {
        bus: Arc<Bus>,
        replicas: Arc<Replicas>,
        catalog: SharedCatalog,
    }

    async fn start_catalog(
        dir: &Path,
        index: u8,
        listener: tokio::net::TcpListener,
        addresses: &[std::net::SocketAddr],
        forming: bool,
    ) -> CatalogNode {
        let (bus, replicas) = start_bus(index, listener, addresses);
        let seat = crate::catalog::ClusterSeat {
            replicas: replicas.clone(),
            replica: index,
            replica_count: 3,
            cluster: CLUSTER,
            tick: Duration::from_millis(10),
            request_timeout: Duration::from_secs(20),
            forming,
            rejoining: Arc::default(),
            holds_data: Arc::default(),
            leads_metadata: Arc::default(),
        };
        let writers = crate::writer::WriterContext::new(tokio::runtime::Handle::current());
        let dir = dir.to_path_buf();
        let (catalog, _) =
            blocking(move || crate::catalog::Catalog::load(&dir, 64 * 1024, false, writers, Some(seat)))
                .await
                .expect("load the catalog");
        CatalogNode {
            bus,
            replicas,
            catalog: crate::catalog::Catalog::share(catalog),
        }
    }

    impl CatalogNode {
        /// As close to SIGKILL as one process gets: nothing more is served or sent, and every
        /// group is dropped without a close.
        async fn crash(self) {
            self.bus.shutdown().await;
            let replicas = self.replicas.clone();
            blocking(move || replicas.stop()).await;
            for partition in crate::catalog::all_partitions(&self.catalog) {
                *lock(&partition.state) = PartitionState::Closed;
                if let Some(writer) = partition.take_writer() {
                    writer.close().await;
                }
            }
        }

        fn topic_partitions(&self, stream_id: u32, topic_id: u32) -> Option<usize> {
            let catalog = self.catalog.read().expect("catalog");
            catalog
                .topic(stream_id, topic_id)
                .map(|topic| topic.partitions.len())
        }

        fn leads_metadata(&self) -> bool {
            let catalog = self.catalog.read().expect("catalog");
            catalog.metadata_primary() == Some(self.bus.index())
        }

        fn partition(&self, partition_id: usize) -> Arc<crate::catalog::Partition> {
            let catalog = self.catalog.read().expect("catalog");
            catalog.topic(STREAM, TOPIC).expect("topic").partitions[partition_id].clone()
        }

        fn partition_takes_requests(&self, partition_id: usize) -> bool {
            match &*lock(&self.partition(partition_id).state) {
                PartitionState::Serving(data) => data.takes_requests(),
                _ => false,
            }
        }

        /// The next offset of partition `partition_id` of the test's topic, if it serves.
        fn next_offset(&self, partition_id: usize) -> Option<u64> {
            let partition = {
                let catalog = self.catalog.read().expect("catalog");
                catalog
                    .topic(STREAM, TOPIC)?
                    .partitions
                    .get(partition_id)?
                    .clone()
            };
            let state = lock(&partition.state);
            match &*state {
                PartitionState::Serving(data) => Some(data.stats().messages_count),
                _ => None,
            }
        }
    }

    /// Commit `op` on `node`, retrying while its replica is not (yet) the primary (58).
    async fn commit_eventually(node: &CatalogNode, op: MetadataOp) -> cairn_machine::metadata::Applied {
        let deadline = Instant::now() + WITHIN;
        loop {
            let (catalog, op) = (node.catalog.clone(), op.clone());
            match blocking(move || catalog.write().expect("catalog").commit(&op)).await {
                Ok(applied) => return applied,
                Err(cairn_wire::codes::TRANSIENT_NOT_ACCEPTED) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(status) => panic!("the metadata change was refused with status {status}"),
            }
        }
    }

    /// Append a batch of 10 to partition `partition_id` of the test's topic on `node`, retrying
    /// while its replica is not (yet) the partition's primary.
    async fn append_eventually(node: &CatalogNode, partition_id: usize, fill: u8) -> u64 {
        let partition = {
            let catalog = node.catalog.read().expect("catalog");
            catalog.topic(STREAM, TOPIC).expect("topic").partitions[partition_id].clone()
        };
        let deadline = Instant::now() + WITHIN;
        loop {
            let partition = partition.clone();
            let appended = blocking(move || {
                let batch = client_batch(10, 100, fill);
                let mut state = lock(&partition.state);
                let data =
                    crate::partition::serving(&mut state).map_err(|status| format!("status {status}"))?;
                data.append(1_000, &[&batch[..]]).map_err(|error| match error {
                    crate::partition_group::PartitionError::Group(GroupError::NotTaken { .. }) => {
                        "not taken".to_string()
                    }
                    error => format!("{error:?}"),
                })
            })
            .await;
            match appended {
                Ok(offsets) => return offsets[0],
                Err(error) if error == "not taken" && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(20)).await
                }
                Err(error) => panic!("the append failed: {error}"),
            }
        }
    }

    /// Three nodes' catalogs, each with its metadata group and partitions replicated over
    /// the bus: metadata changes made on the primary reach the backups, whose catalogs make
    /// the new partitions' replicas; appends replicate; when the node holding the primaries
    /// dies, the others take over both the metadata and the partition, offsets continue;
    /// a delete made meanwhile removes the topic's files on the backup; and the dead node,
    /// restarted from its files (its metadata comes up below both), removes the deleted
    /// topic's files and catches its partition up from where its files end.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn catalogs_follow_the_metadata_and_replicate_partitions_across_nodes() {
        let temp = tempfile::tempdir().expect("tempdir");
        let (listeners, addresses) = bind_three().await;
        let mut nodes = Vec::new();
        let mut listeners = listeners.into_iter();
        for index in 0..3u8 {
            let dir = temp.path().join(format!("node-{index}"));
            let listener = listeners.next().expect("listener");
            nodes.push(Some(start_catalog(&dir, index, listener, &addresses, true).await));
        }
        let first = nodes[0].as_ref().expect("up");
        let created_at_us = 1_700_000_000_000_000;
        let applied = commit_eventually(
            first,
            MetadataOp::CreateStream {
                name: "orders".to_string(),
                created_at_us,
            },
        )
        .await;
        assert_eq!(
            applied.effects,
            [cairn_machine::metadata::Effect::CreateStream { stream_id: STREAM }]
        );
        commit_eventually(
            first,
            MetadataOp::CreateTopic {
                stream_id: STREAM,
                name: "created".to_string(),
                created_at_us,
                partitions_count: 2,
                settings: Default::default(),
            },
        )
        .await;
        commit_eventually(
            first,
            MetadataOp::CreateTopic {
                stream_id: STREAM,
                name: "doomed".to_string(),
                created_at_us,
                partitions_count: 1,
                settings: Default::default(),
            },
        )
        .await;
        for node in nodes.iter().flatten() {
            eventually("every node's catalog holds the new topics' partitions", || {
                node.topic_partitions(STREAM, TOPIC) == Some(2)
                    && node.topic_partitions(STREAM, DOOMED) == Some(1)
            })
            .await;
        }
        for fill in 0..3u8 {
            let offset = append_eventually(nodes[0].as_ref().expect("up"), 0, fill).await;
            assert_eq!(offset, u64::from(fill) * 10);
        }
        for node in nodes.iter().flatten() {
            eventually("every replica of partition 0 holds the appends", || {
                node.next_offset(0) == Some(30)
            })
            .await;
        }

        nodes[0].take().expect("up").crash().await;
        let second = nodes[1].as_ref().expect("up");
        let survivor = nodes[2].as_ref().expect("up");
        // Whichever of the two became primary takes the appends; the other answers 58.
        let offset = tokio::select! {
            offset = append_eventually(second, 0, 7) => offset,
            offset = append_eventually(survivor, 0, 7) => offset,
        };
        assert_eq!(offset, 30, "offsets continue after the failover");

        // The partition's primary moved to the node that does not lead the metadata: the
        // leader's replica takes it back (clients send to the leader).
        eventually("one survivor leads the metadata", || {
            second.leads_metadata() || survivor.leads_metadata()
        })
        .await;
        let (leader, other) = if second.leads_metadata() {
            (second, survivor)
        } else {
            (survivor, second)
        };
        let moved = {
            let other = other.partition(0);
            blocking(move || match &mut *lock(&other.state) {
                PartitionState::Serving(data) => data.lead(),
                _ => false,
            })
            .await
        };
        if moved {
            eventually(
                "the partition's primary moves to the node leading the metadata",
                || leader.partition_takes_requests(0),
            )
            .await;
        }
        assert_eq!(
            append_eventually(leader, 0, 8).await,
            40,
            "the leader's node takes sends again"
        );
        let applied = tokio::select! {
            applied = commit_eventually(second, MetadataOp::DeleteTopic { stream_id: STREAM, topic_id: DOOMED }) => applied,
            applied = commit_eventually(survivor, MetadataOp::DeleteTopic { stream_id: STREAM, topic_id: DOOMED }) => applied,
        };
        assert!(!applied.effects.is_empty());
        let topic_dir = |index: usize| {
            crate::catalog::topic_dir(&temp.path().join(format!("node-{index}")), STREAM, DOOMED)
        };
        for (index, node) in nodes.iter().enumerate() {
            if let Some(node) = node {
                eventually("the backups drop the deleted topic and its files", || {
                    node.topic_partitions(STREAM, DOOMED).is_none() && !topic_dir(index).exists()
                })
                .await;
            }
        }
        assert!(
            topic_dir(0).exists(),
            "the dead node still holds the topic's files"
        );

        let listener = tokio::net::TcpListener::bind(addresses[0]).await.expect("rebind");
        let restarted = start_catalog(&temp.path().join("node-0"), 0, listener, &addresses, false).await;
        eventually(
            "the restarted node follows the delete it missed and catches up its partition from its files",
            || {
                restarted.topic_partitions(STREAM, DOOMED).is_none()
                    && !topic_dir(0).exists()
                    && restarted.next_offset(0) == Some(50)
            },
        )
        .await;
        restarted.crash().await;
        for node in nodes.into_iter().flatten() {
            node.crash().await;
        }
    }
}
