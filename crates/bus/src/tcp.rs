//! The TCP shell of the replica network: one authenticated connection per node pair, bounded
//! per-peer queues, reconnection with backoff.
//!
//! - **Who dials.** The node with the lower id dials each higher one and accepts from each
//!   lower one, so a pair never races two connections. A new connection from a peer replaces
//!   its old one only once it has authenticated ([`crate::handshake`]).
//! - **Sending never blocks.** [`Bus::send`] queues the message on the peer's queue and
//!   returns. A full queue (by messages or bytes) drops the newest message, which VSR
//!   survives as it survives a lost packet (prepares are retransmitted, view changes and
//!   heartbeats repeat, repair asks again). Control messages (everything but prepares) go
//!   ahead of queued prepares. Bodies are shared `Bytes`, never copied into the queue.
//! - **Receiving** checks every message before anything is allocated from it
//!   ([`crate::frame`]) and hands it to one bounded channel; a slow consumer slows the
//!   readers, and TCP slows the peers.
//! - **Reconnection.** A dialler that fails, or whose connection ends, dials again after a
//!   backoff drawn uniformly from zero to `backoff_min · 2^attempt` (at most `backoff_max`);
//!   a completed handshake resets the attempt count. TCP keepalive and `TCP_USER_TIMEOUT`
//!   notice a peer that vanished without closing within seconds.
//!
//! The shell trusts the network after the handshake (checksums are not MACs): the replica
//! network belongs on a private network, or behind TLS.

use crate::frame::{FrameError, MessageCheck, PrepareRule, assert_sendable, encode_header};
use crate::handshake::{Acceptor, Authenticated, ClusterKey, Dialler, FRAME_SIZE, HandshakeError};
use bytes::BytesMut;
use cairn_vsr::constants::HEADER_SIZE;
use cairn_vsr::header::{Command, Message};
use std::collections::HashMap;
use std::collections::VecDeque;
use std::io::IoSlice;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore, mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};

/// A Hello must arrive within this of the connection (or the handshake timeout, if shorter).
const HELLO_TIMEOUT: Duration = Duration::from_secs(1);

/// The largest count a tokio semaphore holds: bounds given in bytes stay below it.
const MAX_PERMITS: usize = Semaphore::MAX_PERMITS;

/// One node as the bus knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeAddress {
    pub id: u32,
    /// `host:port` of its replica listener.
    pub replica: String,
}

/// What a bus is started with.
#[derive(Clone)]
pub struct BusConfig {
    /// Every message of the connection must carry it; part of every handshake MAC.
    pub cluster: u128,
    pub node_id: u32,
    /// Every node, this one too, sorted by id: a node's replica index is its position.
    pub nodes: Vec<NodeAddress>,
    pub key: ClusterKey,
    /// How a group's prepare bodies verify.
    pub prepare_rule: PrepareRule,
    /// Largest message taken from a peer (header and body).
    pub message_size_max: usize,
    /// Bounds of each peer's send queue; at least one largest message fits.
    pub queue_messages_max: usize,
    pub queue_bytes_max: usize,
    /// Messages received and not yet taken by the node, across all peers.
    pub inbound_messages_max: usize,
    /// Bytes of the messages received and not yet dropped by the node, across all peers
    /// (each [`Received`] holds its share until dropped); at least one largest message.
    pub inbound_bytes_max: usize,
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// A connection must complete its handshake within this.
    pub handshake_timeout: Duration,
    /// Handshakes in progress on the accepting side at once; a connection beyond that is
    /// closed at once (its dialler retries).
    pub handshakes_max: usize,
    /// Handshakes in progress from one IP address at once, so one host cannot take every
    /// slot from the others.
    pub handshakes_per_ip_max: usize,
    /// Whether this node holds data of the cluster (its membership record): said in every
    /// handshake, so a node starting without data tells a cluster being formed from one
    /// whose data it lost. The node sets it once it has recorded its membership.
    pub holds_data: Arc<AtomicBool>,
}

impl BusConfig {
    /// A configuration with the default bounds and timings.
    pub fn new(
        cluster: u128,
        node_id: u32,
        nodes: Vec<NodeAddress>,
        key: ClusterKey,
        prepare_rule: PrepareRule,
        message_size_max: usize,
    ) -> BusConfig {
        BusConfig {
            cluster,
            node_id,
            nodes,
            key,
            prepare_rule,
            message_size_max,
            queue_messages_max: 1024,
            queue_bytes_max: 2 * message_size_max,
            inbound_messages_max: 4096,
            inbound_bytes_max: 4 * message_size_max,
            backoff_min: Duration::from_millis(50),
            backoff_max: Duration::from_secs(2),
            handshake_timeout: Duration::from_secs(5),
            handshakes_max: 16,
            handshakes_per_ip_max: 4,
            holds_data: Arc::new(AtomicBool::new(false)),
        }
    }
}

/// A message from a peer, checked. It holds its bytes' share of the inbound budget
/// ([`BusConfig::inbound_bytes_max`]) until dropped.
#[derive(Debug)]
pub struct Received {
    /// The sender's replica index (authenticated by the handshake).
    pub from: u8,
    pub message: Message,
    _budget: tokio::sync::OwnedSemaphorePermit,
}

/// What [`Bus::send`] did with a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    Queued,
    /// The peer's queue was full: the message was dropped.
    DroppedFull,
}

/// Counts since the bus started, for status and tests.
#[derive(Debug, Default)]
pub struct Counters {
    pub messages_sent: AtomicU64,
    pub bytes_sent: AtomicU64,
    pub messages_dropped: AtomicU64,
    pub messages_received: AtomicU64,
    pub bytes_received: AtomicU64,
    pub connections_established: AtomicU64,
    /// Handshakes refused (either side): a frame that is not a handshake, another cluster
    /// or version, a node id not in the list, a MAC that does not verify.
    pub handshakes_refused: AtomicU64,
    /// Handshakes that ended without a refusal: the connection closed or failed, or the
    /// deadline passed; and connections closed because every handshake slot was taken.
    pub handshakes_failed: AtomicU64,
    /// Connections closed for a message that failed its checks.
    pub messages_refused: AtomicU64,
}

/// Why a bus could not start.
#[derive(Debug, thiserror::Error)]
pub enum BusError {
    #[error("node {0} is not in the bus's node list")]
    NotInList(u32),
    #[error("the node list is not sorted by id with unique ids")]
    Unsorted,
    #[error("the node list has {0} nodes; a group has at most {max}", max = cairn_vsr::constants::REPLICAS_MAX)]
    TooMany(usize),
    #[error("a bound of {name} = {value} cannot hold one message of {message_size_max} bytes")]
    BoundTooSmall {
        name: &'static str,
        value: usize,
        message_size_max: usize,
    },
    #[error("cannot read the replica listener's address: {0}")]
    Listener(std::io::Error),
}

/// The replica network of one node.
pub struct Bus {
    index: u8,
    /// By replica index; `None` for this node.
    peers: Vec<Option<Arc<Peer>>>,
    local_addr: SocketAddr,
    counters: Arc<Counters>,
    shutdown: watch::Sender<bool>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl Bus {
    /// Start the bus on `listener` (bound by the caller, so its address is known before the
    /// readiness line): accept from lower ids, dial higher ones. Received messages arrive on
    /// the returned channel.
    pub fn start(
        config: BusConfig,
        listener: TcpListener,
    ) -> Result<(Bus, mpsc::Receiver<Received>), BusError> {
        let ids: Vec<u32> = config.nodes.iter().map(|node| node.id).collect();
        if ids.windows(2).any(|pair| pair[0] >= pair[1]) {
            return Err(BusError::Unsorted);
        }
        if ids.len() > cairn_vsr::constants::REPLICAS_MAX {
            return Err(BusError::TooMany(ids.len()));
        }
        let index = ids
            .iter()
            .position(|&id| id == config.node_id)
            .ok_or(BusError::NotInList(config.node_id))? as u8;
        for (name, value, needed) in [
            ("message_size_max", config.message_size_max, HEADER_SIZE),
            ("queue_bytes_max", config.queue_bytes_max, config.message_size_max),
            (
                "inbound_bytes_max",
                config.inbound_bytes_max,
                config.message_size_max,
            ),
            ("queue_messages_max", config.queue_messages_max, 1),
            ("inbound_messages_max", config.inbound_messages_max, 1),
            ("handshakes_max", config.handshakes_max, 1),
            ("handshakes_per_ip_max", config.handshakes_per_ip_max, 1),
        ] {
            if value < needed || value > MAX_PERMITS {
                return Err(BusError::BoundTooSmall {
                    name,
                    value,
                    message_size_max: config.message_size_max,
                });
            }
        }
        let local_addr = listener.local_addr().map_err(BusError::Listener)?;
        let (inbound, received) = mpsc::channel(config.inbound_messages_max);
        let inbound_budget = Arc::new(Semaphore::new(config.inbound_bytes_max));
        let (shutdown, shutdown_rx) = watch::channel(false);
        let counters = Arc::new(Counters::default());
        let peers: Vec<Option<Arc<Peer>>> = config
            .nodes
            .iter()
            .enumerate()
            .map(|(peer_index, node)| {
                (peer_index != usize::from(index)).then(|| {
                    Arc::new(Peer {
                        id: node.id,
                        index: peer_index as u8,
                        address: node.replica.clone(),
                        queue: Mutex::new(Queue::default()),
                        wake: Notify::new(),
                        live_connections: AtomicUsize::new(0),
                        generation: watch::Sender::new(0),
                        holds_data: AtomicU8::new(HOLDS_DATA_UNKNOWN),
                        queue_messages_max: config.queue_messages_max,
                        queue_bytes_max: config.queue_bytes_max,
                    })
                })
            })
            .collect();
        let shared = Arc::new(Shared {
            config,
            ids,
            inbound,
            inbound_budget,
            counters: counters.clone(),
            shutdown: shutdown_rx,
        });
        let mut tasks = vec![tokio::spawn(accept_loop(shared.clone(), peers.clone(), listener))];
        for peer in peers.iter().flatten() {
            if peer.id > shared.config.node_id {
                tasks.push(tokio::spawn(dial_loop(shared.clone(), peer.clone())));
            }
        }
        tracing::info!(
            node_id = shared.config.node_id,
            replica_index = index,
            %local_addr,
            peers = peers.iter().flatten().count(),
            "replica network listening"
        );
        Ok((
            Bus {
                index,
                peers,
                local_addr,
                counters,
                shutdown,
                tasks: Mutex::new(tasks),
            },
            received,
        ))
    }

    /// This node's replica index.
    pub fn index(&self) -> u8 {
        self.index
    }

    /// How many nodes the list holds, this one included.
    pub fn node_count(&self) -> usize {
        self.peers.len()
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Whether replica `to` said, in its last completed handshake with this node, that it
    /// holds data of the cluster; `None` before any handshake completed.
    pub fn peer_holds_data(&self, to: u8) -> Option<bool> {
        match self.peer(to)?.holds_data.load(Ordering::Acquire) {
            HOLDS_DATA_YES => Some(true),
            HOLDS_DATA_NO => Some(false),
            _ => None,
        }
    }

    /// Whether an authenticated connection to replica `to` is up now.
    pub fn is_connected(&self, to: u8) -> bool {
        self.peer(to)
            .is_some_and(|peer| peer.live_connections.load(Ordering::Acquire) > 0)
    }

    /// Queue `message` for replica `to`; never blocks. A message to this node or to an index
    /// outside the list is a caller's bug: it panics.
    pub fn send(&self, to: u8, message: Message) -> Sent {
        let Some(peer) = self.peer(to) else {
            panic!("no peer with replica index {to} (this node is {})", self.index);
        };
        // Checked here, where the caller's bug is, and not in the writer task.
        assert_sendable(&message);
        let sent = peer.push(message);
        match sent {
            Sent::Queued => peer.wake.notify_one(),
            Sent::DroppedFull => {
                self.counters.messages_dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
        sent
    }

    /// Close every connection and wait for the bus's tasks to end. Queued messages are
    /// dropped; later sends are queued and never sent.
    pub async fn shutdown(&self) {
        let _ = self.shutdown.send(true);
        let tasks = std::mem::take(&mut *lock(&self.tasks));
        for task in tasks {
            let _ = task.await;
        }
    }

    fn peer(&self, to: u8) -> Option<&Arc<Peer>> {
        self.peers.get(usize::from(to)).and_then(Option::as_ref)
    }
}

/// What every task of the bus shares.
struct Shared {
    config: BusConfig,
    ids: Vec<u32>,
    inbound: mpsc::Sender<Received>,
    /// Bytes of received messages not yet dropped by the node.
    inbound_budget: Arc<Semaphore>,
    counters: Arc<Counters>,
    shutdown: watch::Receiver<bool>,
}

const HOLDS_DATA_UNKNOWN: u8 = 0;
const HOLDS_DATA_NO: u8 = 1;
const HOLDS_DATA_YES: u8 = 2;

fn holds_data_code(holds_data: bool) -> u8 {
    if holds_data { HOLDS_DATA_YES } else { HOLDS_DATA_NO }
}

/// One peer: its send queue and its connection's state.
struct Peer {
    id: u32,
    index: u8,
    address: String,
    queue: Mutex<Queue>,
    /// Woken when a message is queued (a permit is kept when the writer is not waiting).
    wake: Notify,
    /// Connections of this peer running now (a replaced one may linger for a moment).
    live_connections: AtomicUsize,
    /// Counts the peer's authenticated connections: a connection ends once a newer one
    /// has taken its place.
    generation: watch::Sender<u64>,
    /// What the peer said in its last handshake: whether it holds data of the cluster
    /// ([`HOLDS_DATA_UNKNOWN`] before any).
    holds_data: AtomicU8,
    queue_messages_max: usize,
    queue_bytes_max: usize,
}

#[derive(Default)]
struct Queue {
    /// Everything but prepares: small, and what keeps views and commits moving.
    control: VecDeque<Message>,
    prepares: VecDeque<Message>,
    bytes: usize,
}

impl Peer {
    fn push(&self, message: Message) -> Sent {
        let size = message.header.size as usize;
        let mut queue = lock(&self.queue);
        let count = queue.control.len() + queue.prepares.len();
        if count >= self.queue_messages_max || queue.bytes + size > self.queue_bytes_max {
            return Sent::DroppedFull;
        }
        queue.bytes += size;
        if message.header.command == Command::Prepare {
            queue.prepares.push_back(message);
        } else {
            queue.control.push_back(message);
        }
        Sent::Queued
    }

    /// The next message to write: control messages first.
    fn pop(&self) -> Option<Message> {
        let mut queue = lock(&self.queue);
        let message = match queue.control.pop_front() {
            Some(message) => message,
            None => queue.prepares.pop_front()?,
        };
        queue.bytes -= message.header.size as usize;
        Some(message)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The queue's state is a pair of deques and a count, valid after any panic.
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Counts a peer's live connection while it runs.
struct LiveConnection<'a>(&'a Peer);

impl<'a> LiveConnection<'a> {
    fn new(peer: &'a Peer) -> LiveConnection<'a> {
        peer.live_connections.fetch_add(1, Ordering::AcqRel);
        LiveConnection(peer)
    }
}

impl Drop for LiveConnection<'_> {
    fn drop(&mut self) {
        self.0.live_connections.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Why a connection ended.
#[derive(Debug, thiserror::Error)]
enum ConnectionEnd {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("refused a message: {0}")]
    Refused(#[from] FrameError),
    #[error("the node stops")]
    Shutdown,
    #[error("the node no longer takes messages")]
    InboundClosed,
    #[error("a newer connection of the same peer took its place")]
    Replaced,
}

/// Why a handshake failed.
#[derive(Debug, thiserror::Error)]
enum DialError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Handshake(#[from] HandshakeError),
    #[error("the handshake did not finish within {0:?}")]
    Timeout(Duration),
    #[error("node {0} is not in this node's list")]
    Unknown(u32),
    #[error("the node stops")]
    Shutdown,
}

fn configure(stream: &TcpStream) {
    // Best effort: a socket without these options still works, only slower to notice a
    // vanished peer or to deliver a small message.
    let _ = stream.set_nodelay(true);
    let socket = socket2::SockRef::from(stream);
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(5))
        .with_interval(Duration::from_secs(1))
        .with_retries(3);
    let _ = socket.set_tcp_keepalive(&keepalive);
    // Unacknowledged data older than this fails the connection. Kept well above a pause of
    // a busy receiver (its window closed while its node catches up), which is not a failure.
    #[cfg(target_os = "linux")]
    let _ = socket.set_tcp_user_timeout(Some(Duration::from_secs(30)));
}

/// Dial `peer` until the bus stops, one connection at a time.
async fn dial_loop(shared: Arc<Shared>, peer: Arc<Peer>) {
    let mut shutdown = shared.shutdown.clone();
    let mut attempt: u32 = 0;
    let mut failing_since_logged = false;
    loop {
        if *shutdown.borrow() {
            return;
        }
        match dial(&shared, &peer).await {
            Ok(stream) => {
                attempt = 0;
                failing_since_logged = false;
                shared
                    .counters
                    .connections_established
                    .fetch_add(1, Ordering::Relaxed);
                tracing::info!(peer_id = peer.id, address = %peer.address, "replica connection up (dialled)");
                let end = run_connection(&shared, &peer, stream).await;
                log_end(&peer, &end);
                if matches!(end, ConnectionEnd::Shutdown | ConnectionEnd::InboundClosed) {
                    return;
                }
            }
            Err(error) => {
                if let DialError::Shutdown = error {
                    return;
                }
                if let DialError::Handshake(_) = error {
                    shared.counters.handshakes_refused.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(peer_id = peer.id, address = %peer.address, %error, "replica handshake refused");
                } else if !failing_since_logged {
                    tracing::info!(peer_id = peer.id, address = %peer.address, %error, "cannot reach a replica; retrying with backoff");
                } else {
                    tracing::debug!(peer_id = peer.id, address = %peer.address, %error, "cannot reach a replica");
                }
                failing_since_logged = true;
            }
        }
        let delay = backoff(&shared.config, attempt);
        attempt = attempt.saturating_add(1);
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// Uniform in `0 ..= min(backoff_max, backoff_min · 2^attempt)` (full jitter).
fn backoff(config: &BusConfig, attempt: u32) -> Duration {
    let ceiling = config
        .backoff_min
        .saturating_mul(1u32 << attempt.min(16))
        .min(config.backoff_max);
    let millis = ceiling.as_millis() as u64;
    Duration::from_millis(rand::random::<u64>() % (millis + 1))
}

async fn dial(shared: &Shared, peer: &Peer) -> Result<TcpStream, DialError> {
    let timeout = shared.config.handshake_timeout;
    let handshake = async {
        let mut stream = TcpStream::connect(peer.address.as_str()).await?;
        configure(&stream);
        let (dialler, hello) = Dialler::start(
            &shared.config.key,
            shared.config.cluster,
            shared.config.node_id,
            peer.id,
            rand::random(),
            shared.config.holds_data.load(Ordering::Acquire),
        );
        stream.write_all(&hello).await?;
        let mut challenge = [0u8; FRAME_SIZE];
        stream.read_exact(&mut challenge).await?;
        let finished = dialler.on_challenge(&challenge)?;
        stream.write_all(&finished.frame).await?;
        peer.holds_data
            .store(holds_data_code(finished.peer_holds_data), Ordering::Release);
        Ok::<TcpStream, DialError>(stream)
    };
    let mut shutdown = shared.shutdown.clone();
    tokio::select! {
        outcome = tokio::time::timeout(timeout, handshake) => outcome.map_err(|_| DialError::Timeout(timeout))?,
        _ = shutdown.changed() => Err(DialError::Shutdown),
    }
}

/// Accept connections from lower ids until the bus stops; each authenticated one replaces
/// its peer's earlier connection.
async fn accept_loop(shared: Arc<Shared>, peers: Vec<Option<Arc<Peer>>>, listener: TcpListener) {
    let mut shutdown = shared.shutdown.clone();
    let handshakes = Arc::new(Semaphore::new(shared.config.handshakes_max));
    let per_ip: Arc<Mutex<HashMap<IpAddr, usize>>> = Arc::default();
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.changed() => break,
        };
        // Reap finished connection tasks so the set stays small.
        while connections.try_join_next().is_some() {}
        let (stream, address) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of file descriptors, say: wait a little rather than spin.
                tracing::warn!(%error, "cannot accept a replica connection");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(100)) => continue,
                    _ = shutdown.changed() => break,
                }
            }
        };
        // Slots are taken, never waited for: a dialler that finds none retries with backoff,
        // and idle connections cannot queue real peers behind them.
        let slot = match handshakes.clone().try_acquire_owned() {
            Ok(slot)
                if lock(&per_ip).get(&address.ip()).copied().unwrap_or(0)
                    < shared.config.handshakes_per_ip_max =>
            {
                slot
            }
            _ => {
                shared.counters.handshakes_failed.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(%address, "closed a replica connection: every handshake slot is taken");
                continue;
            }
        };
        *lock(&per_ip).entry(address.ip()).or_default() += 1;
        let slot = HandshakeSlot {
            _slot: slot,
            per_ip: per_ip.clone(),
            ip: address.ip(),
        };
        let (shared, peers) = (shared.clone(), peers.clone());
        connections.spawn(async move {
            let authenticated = accept_handshake(&shared, stream).await;
            drop(slot);
            let (authenticated, stream) = match authenticated {
                Ok(authenticated) => authenticated,
                Err(DialError::Handshake(error)) => {
                    shared.counters.handshakes_refused.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%address, %error, "refused a replica connection");
                    return;
                }
                Err(error) => {
                    shared.counters.handshakes_failed.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(%address, %error, "a replica connection ended before its handshake finished");
                    return;
                }
            };
            let peer_id = authenticated.peer;
            let Some(peer) = peers.iter().flatten().find(|peer| peer.id == peer_id).cloned() else {
                return;
            };
            peer.holds_data
                .store(holds_data_code(authenticated.peer_holds_data), Ordering::Release);
            shared.counters.connections_established.fetch_add(1, Ordering::Relaxed);
            tracing::info!(peer_id, %address, "replica connection up (accepted)");
            let end = run_connection(&shared, &peer, stream).await;
            log_end(&peer, &end);
        });
    }
    connections.shutdown().await;
}

/// A handshake slot, and its count against its IP address, held until dropped.
struct HandshakeSlot {
    _slot: tokio::sync::OwnedSemaphorePermit,
    per_ip: Arc<Mutex<HashMap<IpAddr, usize>>>,
    ip: IpAddr,
}

impl Drop for HandshakeSlot {
    fn drop(&mut self) {
        let mut per_ip = lock(&self.per_ip);
        if let Some(count) = per_ip.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                per_ip.remove(&self.ip);
            }
        }
    }
}

/// The accepting side's handshake: the authenticated peer's id and the stream.
async fn accept_handshake(
    shared: &Shared,
    mut stream: TcpStream,
) -> Result<(Authenticated, TcpStream), DialError> {
    let timeout = shared.config.handshake_timeout;
    let hello_timeout = timeout.min(HELLO_TIMEOUT);
    let handshake = async {
        configure(&stream);
        let mut hello = [0u8; FRAME_SIZE];
        // A peer sends its Hello as soon as it connects: a connection that does not gives
        // its slot back early.
        tokio::time::timeout(hello_timeout, stream.read_exact(&mut hello))
            .await
            .map_err(|_| DialError::Timeout(hello_timeout))??;
        let (acceptor, challenge) = Acceptor::on_hello(
            &shared.config.key,
            shared.config.cluster,
            shared.config.node_id,
            &shared.ids,
            &hello,
            rand::random(),
            shared.config.holds_data.load(Ordering::Acquire),
        )?;
        stream.write_all(&challenge).await?;
        let mut finish = [0u8; FRAME_SIZE];
        stream.read_exact(&mut finish).await?;
        let authenticated = acceptor.on_finish(&finish)?;
        Ok::<(Authenticated, TcpStream), DialError>((authenticated, stream))
    };
    let mut shutdown = shared.shutdown.clone();
    let (authenticated, stream) = tokio::select! {
        outcome = tokio::time::timeout(timeout, handshake) => outcome.map_err(|_| DialError::Timeout(timeout))??,
        _ = shutdown.changed() => return Err(DialError::Shutdown),
    };
    let peer = authenticated.peer;
    if !shared.ids.contains(&peer) {
        return Err(DialError::Unknown(peer));
    }
    Ok((authenticated, stream))
}

fn log_end(peer: &Peer, end: &ConnectionEnd) {
    match end {
        ConnectionEnd::Refused(_) => {
            tracing::warn!(peer_id = peer.id, reason = %end, "closed a replica connection")
        }
        ConnectionEnd::Shutdown | ConnectionEnd::InboundClosed => {
            tracing::debug!(peer_id = peer.id, reason = %end, "closed a replica connection")
        }
        ConnectionEnd::Io(_) | ConnectionEnd::Replaced => {
            tracing::info!(peer_id = peer.id, reason = %end, "replica connection down")
        }
    }
}

/// Run an authenticated connection until it fails or the bus stops: its reader hands
/// checked messages to the node, its writer drains the peer's queue. A newer connection of
/// the same peer ends this one.
async fn run_connection(shared: &Shared, peer: &Peer, stream: TcpStream) -> ConnectionEnd {
    // This connection is the peer's now: an older one ends.
    let mut mine = 0;
    peer.generation.send_modify(|generation| {
        *generation += 1;
        mine = *generation;
    });
    let mut generation = peer.generation.subscribe();
    let _live = LiveConnection::new(peer);
    let mut shutdown = shared.shutdown.clone();
    let (read, write) = stream.into_split();
    let check = MessageCheck::new(
        shared.config.cluster,
        peer.index,
        shared.config.message_size_max,
        shared.config.prepare_rule.clone(),
    );
    let end = tokio::select! {
        end = read_loop(shared, peer.index, check, read) => end,
        end = write_loop(shared, peer, write, (generation.clone(), mine)) => end,
        _ = generation.wait_for(|&current| current != mine) => ConnectionEnd::Replaced,
        _ = shutdown.changed() => ConnectionEnd::Shutdown,
    };
    if let ConnectionEnd::Refused(_) = end {
        shared.counters.messages_refused.fetch_add(1, Ordering::Relaxed);
    }
    end
}

async fn read_loop(
    shared: &Shared,
    from: u8,
    check: MessageCheck,
    read: tokio::net::tcp::OwnedReadHalf,
) -> ConnectionEnd {
    let mut reader = BufReader::with_capacity(64 * 1024, read);
    loop {
        let mut header_bytes = [0u8; HEADER_SIZE];
        if let Err(error) = reader.read_exact(&mut header_bytes).await {
            return error.into();
        }
        let header = match check.header(&header_bytes) {
            Ok(header) => header,
            Err(error) => return error.into(),
        };
        // Bounded by the check above, and by what the node has not yet taken.
        let Ok(budget) = shared
            .inbound_budget
            .clone()
            .acquire_many_owned(header.size)
            .await
        else {
            return ConnectionEnd::InboundClosed;
        };
        // Read into spare capacity: no zero-fill of up to a prepare's worth of memory that
        // is about to be overwritten.
        let body_len = header.body_len();
        let mut body = BytesMut::with_capacity(body_len);
        let mut limited = (&mut reader).take(body_len as u64);
        while body.len() < body_len {
            match limited.read_buf(&mut body).await {
                Ok(0) => return std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into(),
                Ok(_) => {}
                Err(error) => return error.into(),
            }
        }
        let message = match check.body(header, body.freeze()) {
            Ok(message) => message,
            Err(error) => return error.into(),
        };
        shared.counters.messages_received.fetch_add(1, Ordering::Relaxed);
        shared
            .counters
            .bytes_received
            .fetch_add(u64::from(message.header.size), Ordering::Relaxed);
        let received = Received {
            from,
            message,
            _budget: budget,
        };
        if shared.inbound.send(received).await.is_err() {
            return ConnectionEnd::InboundClosed;
        }
    }
}

async fn write_loop(
    shared: &Shared,
    peer: &Peer,
    write: tokio::net::tcp::OwnedWriteHalf,
    (generation, mine): (watch::Receiver<u64>, u64),
) -> ConnectionEnd {
    let mut writer = BufWriter::with_capacity(64 * 1024, write);
    // Written to the buffer since the last flush: counted as sent once flushed.
    let (mut unflushed_messages, mut unflushed_bytes) = (0u64, 0u64);
    loop {
        // A replaced connection takes nothing more from the queue its successor drains.
        if *generation.borrow() != mine {
            return ConnectionEnd::Replaced;
        }
        let Some(message) = peer.pop() else {
            if let Err(error) = writer.flush().await {
                return error.into();
            }
            shared
                .counters
                .messages_sent
                .fetch_add(std::mem::take(&mut unflushed_messages), Ordering::Relaxed);
            shared
                .counters
                .bytes_sent
                .fetch_add(std::mem::take(&mut unflushed_bytes), Ordering::Relaxed);
            peer.wake.notified().await;
            continue;
        };
        let header = encode_header(&message);
        // One vectored write for header and body: a body larger than the buffer goes out
        // with its header in one system call (and one wake-up of the reader), a small
        // message is gathered in the buffer with its neighbours.
        let mut parts = [IoSlice::new(&header), IoSlice::new(&message.body)];
        let mut unwritten = &mut parts[..];
        while !unwritten.is_empty() {
            match writer.write_vectored(unwritten).await {
                Ok(0) => return std::io::Error::from(std::io::ErrorKind::WriteZero).into(),
                Ok(written) => IoSlice::advance_slices(&mut unwritten, written),
                Err(error) => return error.into(),
            }
        }
        unflushed_messages += 1;
        unflushed_bytes += u64::from(message.header.size);
    }
}
