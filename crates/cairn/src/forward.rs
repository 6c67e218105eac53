//! Sends forwarded to the node of a partition's primary (`docs/replication.md`, "Who takes
//! requests").
//!
//! A client's send reaches some node; only the node whose replica is the partition's primary
//! can append it. The SDK follows the metadata leader, and the partitions' primaries follow
//! the leader too, but not at once: after a leader change a partition's primary may sit on
//! another node for half a second, a primary may stay elsewhere while the leader's replica
//! catches up, and a client that does not follow the leader (HTTP, a raw transport) may
//! send anywhere. Such a send is forwarded, once, over the replica network:
//!
//! - **Forwarding side.** [`Forwarder::send`] puts the batch in a `ForwardSend` message to
//!   the node its replica last saw as the primary (`Partition::remote_primary`), and waits
//!   for the `ForwardReply`. Only while messages pass both ways between the two nodes
//!   (`PeersHeard::both_ways`: this node heard the peer within 250 ms, and the peer's last
//!   `Heartbeats` said it hears this node), so a one-way cut does not hold a send for the
//!   whole timeout. Not forwarded (58, nothing sent, the client sends again): the peer is not
//!   connected or not heard both ways, its queue is full, or too many forwards wait. Sent but
//!   no reply (the peer's connection went down, messages stopped passing both ways, or
//!   nothing came within [`FORWARD_TIMEOUT`]): the
//!   outcome is unknown, answered 57 for a batch with a content key (a resend of a batch
//!   that did commit is recognised by the primary) and a plain error otherwise, as a send
//!   whose quorum reply was lost locally.
//! - **Primary side.** [`Forwarder::on_message`] checks the batch as a client's send is
//!   checked, queues it on the partition's writer like any send (so it is grouped,
//!   recognised as a resend, refused 58 by a replica that is not the primary: never
//!   forwarded again), and answers with the outcome.
//!
//! Each side bounds what it holds: [`FORWARDS_WAITING_MAX`] sends waiting for replies, and
//! [`FORWARDS_SERVED_BYTES_MAX`] bytes of forwarded batches in progress; beyond that a send
//! is answered 58. Forwarded batches share a peer's send queue with the groups' own messages,
//! so at most [`FORWARDS_OUTSTANDING_BYTES_MAX`] of them are sent and unanswered at once (or a
//! single larger one): the prepares, acknowledgements and heartbeats always find room.
//!
//! A forward left in a peer's send queue when the connection dropped is delivered when it
//! comes back. Its forwarding node answered its client 57 long ago, and the client may have
//! resent the batch elsewhere: the primary drops a forward stamped more than
//! [`FORWARD_TIMEOUT`] ago (by the sender's clock), well inside the window in which a resend
//! is recognised by its content (2 minutes), so either copy that arrives second is
//! recognised. (This takes the nodes' clocks to agree within seconds; a primary whose clock
//! runs ahead by more drops every forward, and their senders answer 57.)

use crate::replicas::{PeersHeard, read, write};
use crate::writer::{PendingSend, SendOutcome};
use bytes::Bytes;
use cairn_bus::{Bus, Sent};
use cairn_vsr::constants::{HEADER_SIZE, Shape};
use cairn_vsr::header::{Command, Header, Message};
use cairn_wire::batch::{self, BatchLimits, ReceivedBatch};
use cairn_wire::codes;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;
use tokio::sync::{Semaphore, mpsc, oneshot};

/// How long a forwarded send waits for its reply: the primary answers within its own
/// request timeout (57 when its quorum does not answer), so this is that and some slack.
pub const FORWARD_TIMEOUT: Duration =
    Duration::from_millis(crate::cluster::REQUEST_TIMEOUT.as_millis() as u64 + 2_000);

/// Bytes of forwarded batches sent and not yet answered, across peers (a single batch larger
/// than this is sent when nothing else is outstanding).
pub const FORWARDS_OUTSTANDING_BYTES_MAX: usize = 16 * 1024 * 1024;

/// Forwarded sends this node waits on at once.
pub const FORWARDS_WAITING_MAX: usize = 4096;

/// Bytes of the batches forwarded to this node in progress at once (more than the largest
/// batch).
pub const FORWARDS_SERVED_BYTES_MAX: usize = 256 * 1024 * 1024;

/// How often a waiting forward checks that its peer is still connected and heard.
const CONNECTION_CHECK_INTERVAL: Duration = Duration::from_millis(50);

/// A forward waiting for its reply.
struct Waiting {
    /// The node it was sent to: only that node's reply completes it.
    to: u8,
    /// Its batch's bytes (counted in `Outstanding::bytes` until it ends).
    bytes: usize,
    reply: oneshot::Sender<SendOutcome>,
}

/// The forwards waiting for replies, and their batches' bytes.
#[derive(Default)]
struct Outstanding {
    by_id: HashMap<u128, Waiting>,
    bytes: usize,
}

impl Outstanding {
    fn remove(&mut self, id: u128) -> Option<Waiting> {
        let waiting = self.by_id.remove(&id)?;
        self.bytes -= waiting.bytes;
        Some(waiting)
    }
}

/// Removes its forward from the waiting ones when the send ends, however it ends (its
/// caller's future may be dropped: an HTTP client that went away).
struct WaitingEntry<'a> {
    forwarder: &'a Forwarder,
    id: u128,
}

impl Drop for WaitingEntry<'_> {
    fn drop(&mut self) {
        lock(&self.forwarder.waiting).remove(self.id);
    }
}

/// The forwarding of sends between this node and its peers.
pub struct Forwarder {
    bus: Arc<Bus>,
    heard: Arc<PeersHeard>,
    cluster: u128,
    /// The admission limits of a client's batch (the server's), checked again here.
    limits: OnceLock<BatchLimits>,
    /// Each hosted partition's writer queue, by group id (weak: a writer closes when its
    /// partition's senders are gone).
    targets: RwLock<HashMap<u64, mpsc::WeakSender<PendingSend>>>,
    waiting: Mutex<Outstanding>,
    /// Forward ids: this process's random base and a counter.
    id_base: u128,
    next_id: AtomicU64,
    /// Bytes of forwarded batches in progress here ([`FORWARDS_SERVED_BYTES_MAX`]).
    serving: Arc<Semaphore>,
}

impl Forwarder {
    pub fn new(bus: Arc<Bus>, cluster: u128, heard: Arc<PeersHeard>) -> Forwarder {
        Forwarder {
            bus,
            heard,
            cluster,
            limits: OnceLock::new(),
            targets: RwLock::default(),
            waiting: Mutex::default(),
            id_base: rand::random::<u128>() & !u128::from(u64::MAX),
            next_id: AtomicU64::new(1),
            serving: Arc::new(Semaphore::new(FORWARDS_SERVED_BYTES_MAX)),
        }
    }

    /// The server's batch limits; forwarded sends are refused until set.
    pub fn set_limits(&self, limits: BatchLimits) {
        let _ = self.limits.set(limits);
    }

    /// Take sends forwarded for partition `group` on its writer's `queue`.
    pub fn register(&self, group: u64, queue: &mpsc::Sender<PendingSend>) {
        write(&self.targets).insert(group, queue.downgrade());
    }

    /// Stop taking forwarded sends for `group` (its partition is gone).
    pub fn unregister(&self, group: u64) {
        write(&self.targets).remove(&group);
    }

    /// Forward a send of `batch` (`messages_count` messages, checked by the caller) for
    /// partition `group` to node `to`, and wait for its outcome (see the module doc).
    /// `keyed`: the batch has a content key, so a resend of it is recognised.
    pub async fn send(
        &self,
        to: u8,
        group: u64,
        batch: ReceivedBatch,
        messages_count: u32,
        keyed: bool,
    ) -> SendOutcome {
        debug_assert_ne!(to, self.bus.index());
        if HEADER_SIZE + batch.len() > Shape::PARTITION.message_size_max
            || !self.bus.is_connected(to)
            || !self.heard.both_ways(to)
        {
            return Err(codes::TRANSIENT_NOT_ACCEPTED);
        }
        let id = self.id_base | u128::from(self.next_id.fetch_add(1, Ordering::Relaxed));
        let (reply, outcome) = oneshot::channel();
        let bytes = batch.len();
        {
            let mut waiting = lock(&self.waiting);
            let crowded = !waiting.by_id.is_empty() && waiting.bytes + bytes > FORWARDS_OUTSTANDING_BYTES_MAX;
            if waiting.by_id.len() >= FORWARDS_WAITING_MAX || crowded {
                return Err(codes::TRANSIENT_NOT_ACCEPTED);
            }
            waiting.by_id.insert(id, Waiting { to, bytes, reply });
            waiting.bytes += bytes;
        }
        let _entry = WaitingEntry { forwarder: self, id };
        let (buffer, headroom) = batch.into_buffer();
        let mut header = Header::new(Command::ForwardSend, self.cluster);
        header.replica = self.bus.index();
        header.group = group;
        header.client = id;
        header.request = u64::from(messages_count);
        header.timestamp = crate::handler::Clock::now_us(&crate::handler::SystemClock);
        let body = buffer.slice(headroom..);
        if self.bus.send(to, Message::new(header, body)) == Sent::DroppedFull {
            return Err(codes::TRANSIENT_NOT_ACCEPTED);
        }
        let started = tokio::time::Instant::now();
        let mut outcome = outcome;
        let unknown = loop {
            tokio::select! {
                answered = &mut outcome => match answered {
                    Ok(answered) => {
                        tracing::debug!(peer = to, group, outcome = ?answered, "a send forwarded to the partition's primary was answered");
                        return answered;
                    }
                    // Dropped unanswered: only if the entry was removed, which only this
                    // function does; kept as unknown for safety.
                    Err(_) => break "its reply was lost",
                },
                () = tokio::time::sleep(CONNECTION_CHECK_INTERVAL) => {
                    if !self.bus.is_connected(to) {
                        break "the connection to that node went down";
                    }
                    if !self.heard.both_ways(to) {
                        break "messages stopped passing both ways between this node and that one";
                    }
                    if started.elapsed() >= FORWARD_TIMEOUT {
                        break "no reply came in time";
                    }
                }
            }
        };
        tracing::warn!(
            peer = to,
            group,
            reason = unknown,
            "a send forwarded to the partition's primary got no reply: it may or may not be stored; answered {}",
            if keyed {
                "57 (the client resends; a resend of a committed batch is recognised)"
            } else {
                "with an error (its batch has a message of id 0, so a resend would not be recognised)"
            }
        );
        Err(if keyed {
            codes::TRANSIENT_NOT_COMMITTED
        } else {
            codes::ERROR
        })
    }

    /// A `ForwardSend` or `ForwardReply` from peer `message.header.replica` (the bus checked
    /// it names its connection's peer). Runs on the bus's receiving task; a forwarded send's
    /// work goes to a task of its own.
    pub fn on_message(self: &Arc<Self>, message: Message) {
        let header = message.header;
        match header.command {
            Command::ForwardReply => {
                let mut waiting = lock(&self.waiting);
                if waiting
                    .by_id
                    .get(&header.client)
                    .is_some_and(|entry| entry.to == header.replica)
                    && let Some(entry) = waiting.remove(header.client)
                {
                    let outcome = match u32::try_from(header.request) {
                        Ok(0) => Ok(header.op),
                        Ok(status) => Err(status),
                        Err(_) => Err(codes::ERROR),
                    };
                    let _ = entry.reply.send(outcome);
                }
            }
            Command::ForwardSend => {
                let forwarder = self.clone();
                let received_at_us = crate::handler::Clock::now_us(&crate::handler::SystemClock);
                if received_at_us.saturating_sub(header.timestamp) > FORWARD_TIMEOUT.as_micros() as u64 {
                    // Its sender gave it up (answered its client 57): see the module doc.
                    tracing::debug!(
                        peer = header.replica,
                        group = header.group,
                        "dropped a forwarded send its sender gave up on (it was queued while the connection was down)"
                    );
                    return;
                }
                let bytes = u32::try_from(message.body.len().max(1)).unwrap_or(u32::MAX);
                let Ok(permit) = self.serving.clone().try_acquire_many_owned(bytes) else {
                    self.answer(&header, Err(codes::TRANSIENT_NOT_ACCEPTED));
                    return;
                };
                let Some(queue) = read(&self.targets)
                    .get(&header.group)
                    .and_then(mpsc::WeakSender::upgrade)
                else {
                    self.answer(&header, Err(codes::TRANSIENT_NOT_ACCEPTED));
                    return;
                };
                // Checked and queued off the bus's receiving task (a batch is up to tens of
                // megabytes, and every group's messages wait behind this task).
                tokio::spawn(async move {
                    let outcome = match forwarder.check(&header, &message.body) {
                        Err(status) => Err(status),
                        Ok(()) => {
                            let batch = ReceivedBatch::from(message.body);
                            crate::writer::submit(Some(queue), batch, received_at_us).await
                        }
                    };
                    forwarder.answer(&header, outcome);
                    drop(permit);
                });
            }
            _ => debug_assert!(false, "not a forwarding message: {:?}", header.command),
        }
    }

    /// Check a forwarded batch as the handler checks a client's.
    fn check(&self, header: &Header, body: &Bytes) -> Result<(), u32> {
        let limits = self.limits.get().ok_or(codes::TRANSIENT_NOT_ACCEPTED)?;
        let count = u32::try_from(header.request).map_err(|_| codes::INVALID_MESSAGES_COUNT)?;
        batch::validate(body, count, limits).map_err(|error| error.status())?;
        Ok(())
    }

    fn answer(&self, send: &Header, outcome: SendOutcome) {
        let mut header = Header::new(Command::ForwardReply, self.cluster);
        header.replica = self.bus.index();
        header.group = send.group;
        header.client = send.client;
        match outcome {
            Ok(base_offset) => header.op = base_offset,
            Err(status) => header.request = u64::from(status.max(1)),
        }
        // A full queue loses the reply: the forwarding node answers its client 57.
        let _ = self.bus.send(send.replica, Message::new(header, Bytes::new()));
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
