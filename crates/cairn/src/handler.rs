//! Applying a decoded [`Command`] to the server state: the one place request semantics live.
//!
//! `Server::handle` is synchronous: the TCP shell runs it on a blocking thread, so file IO
//! and argon2 never stall the async reactor. It returns the reply payload (without the result
//! section, which the shell adds for result-framed operations) or an Iggy status code, except
//! for a send: that is validated and resolved here, then handed back as a [`PreparedSend`]
//! whose `complete` the shell awaits. A send waits for its partition's writer (group commit,
//! `writer`) without holding a thread: the writer itself needs a blocking thread for its IO, so
//! handlers parked in the blocking pool waiting for it could exhaust the pool and deadlock.

use crate::auth;
use crate::catalog::{self, Catalog, Topic};
use crate::config::Config;
use crate::partition::{FlushError, PartitionData, PartitionState, lock, serving};
use crate::writer;
use cairn_machine::metadata::{self, GroupDoc, MetadataOp, Outcome, PurgeMark, Stream};
use cairn_machine::partition::Owner;
use cairn_storage::read::ReadPart;
use cairn_wire::batch::{self, BatchLimits};
use cairn_wire::codes;
use cairn_wire::command::Command;
use cairn_wire::reply;
use cairn_wire::types::{Consumer, Identifier, OptionEntry, Partitioning, PollingStrategy};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

mod users;
pub use users::{TRANSPORT_HTTP, TRANSPORT_TCP};

mod typed;
pub use typed::{
    ConsumerOffset, GroupAssignment, StreamDetails, TokenEntry, TopicDetails, Typed, UserDetails,
};

/// A reply: values for the transport to encode ([`Typed`]), or an Iggy status code with no
/// body.
pub type Reply = Result<Typed, u32>;

/// What [`Server::handle`] produced.
pub enum Handled {
    /// The reply is ready.
    Done(Reply),
    /// The reply is ready, built behind room for the shell's framing (polls).
    Prefixed(Result<PrefixedPayload, u32>),
    /// A validated send for the shell to complete with [`PreparedSend::complete`].
    Send(PreparedSend),
}

/// A reply payload built behind [`PrefixedPayload::PREFIX_BYTES`] reserved bytes, so the TCP
/// shell can write its reply header (and result section) in place and send the frame without
/// copying the payload. A poll's batches are [`ReadPart`]s: whole stored batches stay in their
/// segment files (verified; the shell sends them with `sendfile`), cut ones are in the buffer.
pub struct PrefixedPayload {
    /// Invariant: `buffer.len() >= parts_start >= PREFIX_BYTES`.
    buffer: Vec<u8>,
    /// The payload is `buffer[PREFIX_BYTES..parts_start]` followed by `parts`; every
    /// [`ReadPart::Buffer`] range lies in `buffer[parts_start..]`.
    parts_start: usize,
    parts: Vec<ReadPart>,
    /// What `buffer[PREFIX_BYTES..parts_start]` encodes.
    head: PollHead,
}

/// The head of a poll reply as values: what HTTP renders and TCP sends as its 16 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PollHead {
    pub partition_id: u32,
    pub current_offset: u64,
    pub messages_count: u32,
}

impl PrefixedPayload {
    /// Room for the 256-byte reply header and a 4-byte result section.
    pub const PREFIX_BYTES: usize = cairn_wire::frame::HEADER_SIZE + 4;

    /// A poll reply with `head` encoded behind the prefix and no batches yet.
    fn with_head(head: PollHead) -> PrefixedPayload {
        let mut buffer = vec![0; Self::PREFIX_BYTES];
        reply::poll_head(
            &mut buffer,
            head.partition_id,
            head.current_offset,
            head.messages_count,
        );
        PrefixedPayload {
            parts_start: buffer.len(),
            buffer,
            parts: Vec::new(),
            head,
        }
    }

    /// The head's values.
    pub fn head(&self) -> PollHead {
        self.head
    }

    /// Set the head's message count (values and encoded bytes alike).
    fn set_messages_count(&mut self, messages_count: u32) {
        self.head.messages_count = messages_count;
        let count_at = Self::PREFIX_BYTES + 12;
        self.buffer[count_at..count_at + 4].copy_from_slice(&messages_count.to_le_bytes());
    }

    /// The payload's length in bytes.
    pub fn payload_len(&self) -> usize {
        self.parts_start - Self::PREFIX_BYTES + self.batches_len()
    }

    fn batches_len(&self) -> usize {
        self.parts.iter().map(ReadPart::len).sum::<usize>()
    }

    /// The whole buffer (prefix first, for the shell to fill), where the parts start in it,
    /// and the parts.
    pub fn split_mut(&mut self) -> (&mut [u8], usize, &[ReadPart]) {
        (&mut self.buffer, self.parts_start, &self.parts)
    }

    /// The stored batches after the head, as one buffer (file parts are read in).
    pub fn into_batches(self) -> Result<Vec<u8>, cairn_storage::StorageError> {
        let mut batches = Vec::with_capacity(self.batches_len());
        for part in &self.parts {
            match part {
                ReadPart::Buffer(range) => batches.extend_from_slice(&self.buffer[range.clone()]),
                ReadPart::File {
                    file,
                    position_bytes,
                    len,
                } => {
                    let at = batches.len();
                    file.read_exact_at_into(*position_bytes, *len, &mut batches, at)?;
                }
            }
        }
        Ok(batches)
    }
}

/// A send that passed every admission check (`cairn_wire::batch::validate`) and whose
/// partition is resolved; nothing is stored yet.
pub struct PreparedSend {
    stream_id: u32,
    topic_id: u32,
    partition: Arc<catalog::Partition>,
    /// The client's batch as received (in the request body's buffer, not a copy).
    batch: batch::ReceivedBatch,
    messages_count: u32,
    received_at_us: u64,
}

impl PreparedSend {
    /// Queue the send on its partition's writer (waiting while the queue is full) and wait
    /// until its group is written and, in durable mode, made stable. Then encode the
    /// confirmation.
    ///
    /// With peers, a send whose partition's primary this node's replica sees on another
    /// node is forwarded there (`forward.rs`), so a client sending here needs no error to
    /// find it.
    pub async fn complete(self) -> Reply {
        let base_offset = match self.partition.forward_route() {
            Some((forwarder, to, group)) => {
                let keyed = batch::content_key(&self.batch).is_some();
                forwarder
                    .send(to, group, self.batch, self.messages_count, keyed)
                    .await?
            }
            None => writer::submit(self.partition.writer_queue(), self.batch, self.received_at_us).await?,
        };
        Ok(Typed::Sent(reply::SendConfirmation {
            stream_id: self.stream_id,
            topic_id: self.topic_id,
            partition_id: self.partition.id,
            base_offset,
        }))
    }
}

/// Wall-clock time, injected so tests and a simulator can control it.
pub trait Clock: Send + Sync {
    /// Microseconds since the Unix epoch.
    fn now_us(&self) -> u64;
}

pub struct SystemClock;

impl Clock for SystemClock {
    fn now_us(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0)
    }
}

/// Per-connection state the handler reads and changes.
#[derive(Debug, Clone)]
pub struct Session {
    /// Server-assigned connection id (GetMe / GetClients).
    pub client_id: u32,
    pub address: String,
    /// 1 TCP, 3 HTTP (the Client record's transport).
    pub transport: u8,
    /// Set by a successful login, cleared by Logout.
    pub user_id: Option<u32>,
    /// The session value handed out at login (> 0); 0 before login.
    pub session_id: u64,
    /// The client id the SDK puts in its request headers (its VSR client id), as of the
    /// last request (set by the TCP shell). A routing reply names it.
    pub vsr_client: u128,
    /// The connection whose consumer this one acts for (consumer-group membership): set by
    /// AttachConsumerSession on a data connection the SDK opened to a partition's primary.
    pub consumer_of: Option<u32>,
}

impl Session {
    /// The client id consumer-group membership knows this connection by: its own, or the
    /// coordinator connection's it was attached to.
    pub fn member_id(&self) -> u32 {
        self.consumer_of.unwrap_or(self.client_id)
    }
}

pub struct Server {
    pub config: Config,
    /// Shared with the node's replica workers in a cluster (they serve the metadata group).
    pub catalog: Arc<RwLock<Catalog>>,
    pub clock: Box<dyn Clock>,
    /// This node's part of a cluster of several nodes.
    pub cluster: Option<Arc<crate::cluster::Cluster>>,
    pub limits: BatchLimits,
    pub started_at_us: u64,
    next_session_id: AtomicU64,
    next_client_id: AtomicU32,
    pub clients_connected: AtomicU32,
    /// The port the TCP listener bound (differs from the config when it asked for port 0).
    pub bound_port: AtomicU32,
    /// The port the HTTP listener bound; 0 while HTTP is off (cluster metadata reports it).
    pub http_bound_port: AtomicU32,
    /// Live clients by client id (GetClients): TCP connections and HTTP logins.
    clients: Mutex<BTreeMap<u32, users::ClientEntry>>,
}

/// Reported as the server version in login replies and stats.
const SERVER_VERSION: &str = env!("CARGO_PKG_VERSION");

impl Server {
    pub fn new(
        config: Config,
        catalog: Arc<RwLock<Catalog>>,
        clock: Box<dyn Clock>,
        cluster: Option<Arc<crate::cluster::Cluster>>,
    ) -> Server {
        let limits = BatchLimits {
            message_payload_bytes_max: config.message_payload_bytes_max,
            user_headers_bytes_max: config.user_headers_bytes_max,
            batch_bytes_max: config.batch_bytes_max,
            batch_messages_max: config.batch_messages_max,
        };
        let started_at_us = clock.now_us();
        if let Some(cluster) = &cluster {
            cluster.replicas.forwarder().set_limits(limits);
        }
        // Session ids start at a random point so ids from before a restart are not reused.
        let session_base = rand::random::<u32>() as u64 + 1;
        Server {
            config,
            catalog,
            clock,
            cluster,
            limits,
            started_at_us,
            next_session_id: AtomicU64::new(session_base << 16),
            next_client_id: AtomicU32::new(1),
            clients_connected: AtomicU32::new(0),
            bound_port: AtomicU32::new(0),
            http_bound_port: AtomicU32::new(0),
            clients: Mutex::new(BTreeMap::new()),
        }
    }

    /// A new, unauthenticated session. It is listed by GetClients once the shell registers
    /// it ([`Server::register_client`]).
    pub fn new_session(&self, address: String, transport: u8) -> Session {
        Session {
            client_id: self.next_client_id.fetch_add(1, Ordering::Relaxed),
            address,
            transport,
            user_id: None,
            session_id: 0,
            vsr_client: 0,
            consumer_of: None,
        }
    }

    fn read(&self) -> RwLockReadGuard<'_, Catalog> {
        match self.catalog.read() {
            Ok(guard) => guard,
            Err(poisoned) => panic!("catalog lock poisoned by an earlier panic: {poisoned}"),
        }
    }

    fn write(&self) -> RwLockWriteGuard<'_, Catalog> {
        match self.catalog.write() {
            Ok(guard) => guard,
            Err(poisoned) => panic!("catalog lock poisoned by an earlier panic: {poisoned}"),
        }
    }

    /// A refusal of the SDK's replay of a metadata change answered 57 whose change has since
    /// applied (its own effect made the handler's lookup fail: a delete's stream is gone, a
    /// rename's old name): answered with the change's outcome instead, an empty success
    /// (every change whose lookup its own effect can break replies with nothing).
    pub fn settle_replayed_change(&self, handled: Handled) -> Handled {
        if !matches!(handled, Handled::Done(Err(_)))
            || !crate::catalog::handling_a_client_request()
            || !self.read().awaits_replay()
        {
            return handled;
        }
        match self.write().settle_replayed_change() {
            Some(Ok(())) => Handled::Done(Ok(Typed::Empty)),
            Some(Err(status)) => Handled::Done(Err(status)),
            None => handled,
        }
    }

    /// Apply one command for `session`. A send comes back as [`Handled::Send`] for the shell
    /// to complete; everything else is done.
    pub fn handle(&self, session: &mut Session, command: Command) -> Handled {
        // Every command of a logged-in session passes the permission check first
        // (`permissions`), against the user as it is now.
        if session.user_id.is_some()
            && !matches!(
                command,
                Command::Ping | Command::LoginUser { .. } | Command::LoginWithToken { .. }
            )
            && let Err(status) = self.authorize(session, &command)
        {
            return Handled::Done(Err(status));
        }
        match command {
            Command::Ping => Handled::Done(Ok(Typed::Empty)),
            Command::LoginUser {
                version,
                username,
                password,
            } => Handled::Done(
                check_protocol(version.protocol_version)
                    .and_then(|()| self.login_password(session, &username, &password)),
            ),
            Command::LoginWithToken { version, token } => Handled::Done(
                check_protocol(version.protocol_version).and_then(|()| self.login_token(session, &token)),
            ),
            _ if session.user_id.is_none() => Handled::Done(Err(codes::UNAUTHENTICATED)),
            Command::SendMessages {
                stream,
                topic,
                partitioning,
                messages_count,
                batch,
            } => match self.prepare_send(&stream, &topic, &partitioning, messages_count, batch) {
                Ok(send) => Handled::Send(send),
                Err(status) => Handled::Done(Err(status)),
            },
            Command::PollMessages {
                consumer,
                stream,
                topic,
                partition_id,
                strategy,
                count,
                auto_commit,
            } => Handled::Prefixed(self.poll_messages(
                session,
                &consumer,
                &stream,
                &topic,
                partition_id,
                strategy,
                count,
                auto_commit,
            )),
            command => Handled::Done(self.handle_authenticated(session, command)),
        }
    }

    fn handle_authenticated(&self, session: &mut Session, command: Command) -> Reply {
        match command {
            Command::Logout => {
                self.end_login(session);
                Ok(Typed::Empty)
            }
            Command::GetStats => Ok(Typed::Stats(Box::new(self.stats()))),
            Command::GetClusterMetadata => Ok(self.cluster_metadata()),
            Command::GetPollRouting {
                consumer,
                stream,
                topic,
                partition_id,
            }
            | Command::GetConsumerOffsetRouting {
                consumer,
                stream,
                topic,
                partition_id,
            } => {
                // A plain consumer naming no partition polls and stores on partition 0 (as
                // the poll itself resolves it); a group's partition is picked where its
                // membership is.
                let partition_id = partition_id.or(matches!(consumer, Consumer::Consumer(_)).then_some(0));
                self.route(session, &stream, &topic, partition_id)
            }
            Command::AttachConsumerSession {
                session: attached, ..
            } => self.attach_consumer(session, attached),
            Command::GetMe => Ok(Typed::Client(Some(self.client_record(session)))),
            Command::GetStream { stream } => {
                let view = {
                    let catalog = self.read();
                    find_stream(&catalog, &stream)
                        .ok()
                        .map(|stream| StreamView::of(&catalog, stream))
                };
                Ok(Typed::Stream(view.map(StreamView::details)))
            }
            Command::GetStreams => {
                let views: Vec<StreamView> = {
                    let catalog = self.read();
                    catalog
                        .meta()
                        .streams
                        .values()
                        .filter(|s| self.may_read_stream(&catalog, session, s.id))
                        .map(|stream| StreamView::of(&catalog, stream))
                        .collect()
                };
                Ok(Typed::Streams(
                    views.into_iter().map(StreamView::record).collect(),
                ))
            }
            Command::CreateStream { name, options } => self.create_stream(name, &options),
            Command::UpdateStream {
                stream,
                name,
                options,
            } => {
                refuse_options(&options)?;
                metadata::check_name(&name, codes::INVALID_STREAM_NAME)?;
                let mut catalog = self.write();
                let stream_id = find_stream(&catalog, &stream)?.id;
                catalog.commit(&MetadataOp::UpdateStream { stream_id, name })?;
                Ok(Typed::Empty)
            }
            Command::DeleteStream { stream } => {
                let mut catalog = self.write();
                let stream_id = find_stream(&catalog, &stream)?.id;
                catalog.commit(&MetadataOp::DeleteStream { stream_id })?;
                Ok(Typed::Empty)
            }
            Command::PurgeStream { stream } => self.purge(&stream, None),
            Command::GetTopic { stream, topic } => {
                let view = {
                    let catalog = self.read();
                    find_topic(&catalog, &stream, &topic)
                        .ok()
                        .map(|topic| TopicView::of(&topic))
                };
                Ok(Typed::Topic(view.map(TopicView::details)))
            }
            Command::GetTopics { stream } => {
                let views: Vec<TopicView> = {
                    let catalog = self.read();
                    let stream = find_stream(&catalog, &stream)?;
                    catalog.topics_of(stream).map(|t| TopicView::of(&t)).collect()
                };
                Ok(Typed::Topics(views.into_iter().map(TopicView::record).collect()))
            }
            Command::CreateTopic {
                stream,
                partitions_count,
                name,
                options,
            } => self.create_topic(&stream, partitions_count, name, &options),
            Command::UpdateTopic {
                stream,
                topic,
                name,
                options,
            } => self.update_topic(&stream, &topic, name, &options),
            Command::DeleteTopic { stream, topic } => {
                let mut catalog = self.write();
                let (stream_id, topic_id) = topic_ids(&catalog, &stream, &topic)?;
                catalog.commit(&MetadataOp::DeleteTopic { stream_id, topic_id })?;
                Ok(Typed::Empty)
            }
            Command::PurgeTopic { stream, topic } => self.purge(&stream, Some(&topic)),
            Command::CreatePartitions {
                stream,
                topic,
                partitions_count,
            } => {
                let created_at_us = self.clock.now_us();
                let mut catalog = self.write();
                let (stream_id, topic_id) = topic_ids(&catalog, &stream, &topic)?;
                catalog.commit(&MetadataOp::CreatePartitions {
                    stream_id,
                    topic_id,
                    count: partitions_count,
                    created_at_us,
                })?;
                Ok(Typed::Empty)
            }
            Command::DeletePartitions {
                stream,
                topic,
                partitions_count,
            } => {
                let mut catalog = self.write();
                let (stream_id, topic_id) = topic_ids(&catalog, &stream, &topic)?;
                catalog.commit(&MetadataOp::DeletePartitions {
                    stream_id,
                    topic_id,
                    count: partitions_count,
                })?;
                Ok(Typed::Empty)
            }
            Command::DeleteSegments {
                stream,
                topic,
                partition_id,
                segments_count,
            } => {
                // The oldest `segments_count` sealed segments; never the active one.
                let partition = self.partition(&stream, &topic, partition_id)?;
                let count = usize::try_from(segments_count).unwrap_or(usize::MAX);
                crate::retention::delete_segments(
                    &partition,
                    crate::retention::Selection::Oldest(count),
                    crate::retention::Reason::Request,
                )?;
                Ok(Typed::Empty)
            }
            Command::FlushUnsavedBuffer {
                stream,
                topic,
                partition_id,
                fsync: _,
            } => {
                // In durable mode every acknowledged send is durable already; in relaxed mode
                // this syncs what the timer has not yet (with or without `fsync`). Either way
                // it tells a client whether the partition still takes writes.
                let partition = self.partition(&stream, &topic, partition_id)?;
                let mut state = lock(&partition.state);
                match serving(&mut state)?.flush() {
                    Ok(()) => Ok(Typed::Empty),
                    Err(FlushError::Stopped) => Err(writer::PARTITION_STOPPED_STATUS),
                }
            }
            Command::GetConsumerOffset {
                consumer,
                stream,
                topic,
                partition_id,
            } => self.with_consumer_offsets(
                session,
                &consumer,
                &stream,
                &topic,
                partition_id,
                |owner, partition_id, data| {
                    Ok(Typed::ConsumerOffset(data.stored_offset(owner).map(|stored| {
                        ConsumerOffset {
                            partition_id,
                            current_offset: data.current_offset(),
                            stored_offset: stored,
                        }
                    })))
                },
            ),
            Command::StoreConsumerOffset {
                consumer,
                stream,
                topic,
                partition_id,
                offset,
            } => self.with_consumer_offsets(
                session,
                &consumer,
                &stream,
                &topic,
                partition_id,
                |owner, _, data| {
                    data.store_offset(owner, offset)?;
                    Ok(Typed::Empty)
                },
            ),
            Command::DeleteConsumerOffset {
                consumer,
                stream,
                topic,
                partition_id,
            } => self.with_consumer_offsets(
                session,
                &consumer,
                &stream,
                &topic,
                partition_id,
                |owner, _, data| {
                    data.delete_offset(owner)?;
                    Ok(Typed::Empty)
                },
            ),
            Command::CreatePersonalAccessToken { name, expiry } => self.create_token(session, name, expiry),
            Command::GetPersonalAccessTokens => {
                let catalog = self.read();
                let tokens = catalog
                    .meta()
                    .tokens
                    .iter()
                    .filter(|t| Some(t.user_id) == session.user_id)
                    .map(|token| TokenEntry {
                        name: token.name.clone(),
                        expiry_at_us: token.expiry_at_us,
                    })
                    .collect();
                Ok(Typed::Tokens(tokens))
            }
            Command::DeletePersonalAccessToken { name } => {
                let user_id = session.user_id.ok_or(codes::UNAUTHENTICATED)?;
                self.write().commit(&MetadataOp::DeleteToken { user_id, name })?;
                Ok(Typed::Empty)
            }
            Command::GetClient { client_id } => self.get_client(client_id),
            Command::GetClients => self.get_clients(),
            Command::GetUser { user } => self.get_user(&user),
            Command::GetUsers => self.get_users(),
            Command::CreateUser {
                username,
                password,
                status,
                permissions,
            } => self.create_user(username, &password, status, permissions.as_ref()),
            Command::UpdateUser {
                user,
                username,
                status,
            } => self.update_user(&user, username, status),
            Command::DeleteUser { user } => self.delete_user(&user),
            Command::ChangePassword {
                user,
                current_password,
                new_password,
            } => self.change_password(session, &user, &current_password, &new_password),
            Command::UpdatePermissions { user, permissions } => {
                self.update_permissions(&user, permissions.as_ref())
            }
            Command::GetConsumerGroup { stream, topic, group } => {
                let catalog = self.read();
                let topic = find_topic(&catalog, &stream, &topic)?;
                let group = topic.doc.find_group(&group).ok();
                Ok(Typed::Group(group.map(|group| group_record(&topic, group))))
            }
            Command::GetConsumerGroups { stream, topic } => {
                let catalog = self.read();
                let topic = find_topic(&catalog, &stream, &topic)?;
                Ok(Typed::Groups(
                    topic
                        .doc
                        .consumer_groups
                        .iter()
                        .map(|group| group_record(&topic, group))
                        .collect(),
                ))
            }
            Command::CreateConsumerGroup { stream, topic, name } => {
                metadata::check_name(&name, codes::INVALID_CONSUMER_GROUP_NAME)?;
                let mut catalog = self.write();
                let (stream_id, topic_id) = topic_ids(&catalog, &stream, &topic)?;
                let outcome = catalog
                    .commit(&MetadataOp::CreateGroup {
                        stream_id,
                        topic_id,
                        name,
                    })?
                    .outcome;
                let mut created = None;
                if let Outcome::Group { group_id, .. } = outcome
                    && let Some(topic) = catalog.topic(stream_id, topic_id)
                    && let Some(group) = topic.doc.consumer_groups.iter().find(|g| g.id == group_id)
                {
                    created = Some(group_record(&topic, group));
                }
                Ok(Typed::Group(created))
            }
            Command::DeleteConsumerGroup { stream, topic, group } => {
                let offsets = {
                    let mut catalog = self.write();
                    let topic = find_topic(&catalog, &stream, &topic)?;
                    let (stream_id, topic_id, group_id) =
                        (topic.stream_id, topic.doc.id, topic.doc.find_group(&group)?.id);
                    catalog.commit(&MetadataOp::DeleteGroup {
                        stream_id,
                        topic_id,
                        group_id,
                    })?;
                    catalog.take_offsets_of_deleted_groups()
                };
                crate::catalog::delete_group_offsets(offsets);
                Ok(Typed::Empty)
            }
            Command::JoinConsumerGroup { stream, topic, group } => {
                let catalog = self.read();
                let topic = find_topic(&catalog, &stream, &topic)?;
                let group_id = topic.doc.find_group(&group)?.id;
                lock(topic.members)
                    .entry(group_id)
                    .or_default()
                    .join(session.client_id);
                Ok(Typed::Empty)
            }
            Command::LeaveConsumerGroup { stream, topic, group } => {
                let catalog = self.read();
                let topic = find_topic(&catalog, &stream, &topic)?;
                let group_id = topic.doc.find_group(&group)?.id;
                let left = lock(topic.members)
                    .get_mut(&group_id)
                    .is_some_and(|m| m.leave(session.client_id));
                if left {
                    Ok(Typed::Empty)
                } else {
                    Err(codes::CONSUMER_GROUP_MEMBER_NOT_FOUND)
                }
            }
            Command::SyncConsumerGroup { stream, topic, group } => {
                let catalog = self.read();
                let topic = find_topic(&catalog, &stream, &topic)?;
                let group_id = topic.doc.find_group(&group)?.id;
                let members = lock(topic.members);
                let mut assignment = None;
                if let Some(membership) = members.get(&group_id)
                    && let Some(index) = membership.position(session.client_id)
                {
                    assignment = Some(GroupAssignment {
                        generation: membership.generation,
                        partitions: membership.assigned(index, topic.partitions_count()),
                    });
                }
                Ok(Typed::GroupAssignment(assignment))
            }
            // Snapshots and option descriptions arrive with a later issue.
            Command::GetSnapshot { .. } | Command::DescribeOptions { .. } => Err(codes::FEATURE_UNAVAILABLE),
            Command::Ping | Command::LoginUser { .. } | Command::LoginWithToken { .. } => {
                unreachable!("handled before authentication")
            }
            Command::SendMessages { .. } => unreachable!("sends are prepared by `handle`"),
            Command::PollMessages { .. } => unreachable!("polls are answered by `handle`"),
        }
    }

    // ---- login ----

    fn login_password(&self, session: &mut Session, username: &str, password: &str) -> Reply {
        let (user, metadata_current) = {
            let catalog = self.read();
            let user = catalog
                .meta()
                .users
                .iter()
                .find(|u| u.username == username)
                .cloned();
            (user, catalog.metadata_current())
        };
        // Always run one argon2 verification so a missing user costs the same as a wrong
        // password (no user enumeration by timing).
        let hash = user
            .as_ref()
            .map(|u| u.password_hash.as_str())
            .unwrap_or_else(|| dummy_hash());
        let verified = auth::verify_secret(password, hash);
        let Some(user) = user.filter(|_| verified) else {
            return Err(refused_login(metadata_current, codes::INVALID_CREDENTIALS));
        };
        if user.status != auth::USER_STATUS_ACTIVE {
            return Err(codes::USER_INACTIVE);
        }
        Ok(self.start_session(session, user.id))
    }

    fn login_token(&self, session: &mut Session, token: &str) -> Reply {
        let Some(token_id) = auth::token_id(token) else {
            return Err(codes::INVALID_PAT);
        };
        let (found, metadata_current) = {
            let catalog = self.read();
            let found = catalog.meta().tokens.iter().find(|t| t.id == token_id).cloned();
            (found, catalog.metadata_current())
        };
        let Some(found) = found.filter(|t| auth::verify_secret(token, &t.token_hash)) else {
            return Err(refused_login(metadata_current, codes::INVALID_PAT));
        };
        if found.expiry_at_us != 0 && found.expiry_at_us <= self.clock.now_us() {
            return Err(codes::PAT_EXPIRED);
        }
        // A token logs in as its user, so it is refused like that user's password would be.
        let status = {
            let catalog = self.read();
            catalog.meta().user(found.user_id).map(|u| u.status)
        };
        match status {
            None => return Err(codes::INVALID_PAT),
            Some(status) if status != auth::USER_STATUS_ACTIVE => return Err(codes::USER_INACTIVE),
            Some(_) => {}
        }
        Ok(self.start_session(session, found.user_id))
    }

    fn start_session(&self, session: &mut Session, user_id: u32) -> Typed {
        session.user_id = Some(user_id);
        session.consumer_of = None;
        session.session_id = self.next_session_id.fetch_add(1, Ordering::Relaxed);
        debug_assert!(session.session_id > 0);
        self.note_user(session);
        Typed::LoggedIn {
            user_id,
            session_id: session.session_id,
            server_version: SERVER_VERSION,
        }
    }

    fn create_token(&self, session: &Session, name: String, expiry: u64) -> Reply {
        let Some(user_id) = session.user_id else {
            return Err(codes::UNAUTHENTICATED);
        };
        if !auth::TOKEN_NAME_LEN.contains(&name.len()) {
            return Err(codes::INVALID_PAT_NAME);
        }
        let now_us = self.clock.now_us();
        let mut catalog = self.write();
        // The id is embedded in the raw token, so it is decided here, under the write lock
        // that the commit below holds too.
        let token_id = catalog.meta().next_token_id;
        let raw = auth::new_token(token_id);
        let token_hash = auth::hash_secret(&raw).map_err(|e| {
            tracing::error!(error = %e, "hashing a token failed");
            codes::ERROR
        })?;
        let expiry_at_us = match expiry {
            0 | u64::MAX => 0,
            duration_us => now_us.saturating_add(duration_us),
        };
        catalog.commit(&MetadataOp::CreateToken {
            user_id,
            token_id,
            name,
            token_hash,
            expiry_at_us,
        })?;
        Ok(Typed::Token(raw))
    }

    // ---- system ----

    fn cluster_metadata(&self) -> Typed {
        if let Some(cluster) = &self.cluster {
            let metadata_primary = self.read().metadata_primary();
            return Typed::ClusterMetadata {
                name: "cairn".to_string(),
                nodes: cluster.roster(metadata_primary),
            };
        }
        Typed::ClusterMetadata {
            name: "cairn".to_string(),
            nodes: vec![self.single_node_record()],
        }
    }

    /// A node of one: this one, Leader and Healthy. A `[cluster]` of one reports its entry of
    /// the node list (the addresses clients are to use), under its id.
    fn single_node_record(&self) -> reply::ClusterNode {
        match &self.config.cluster {
            None => reply::ClusterNode {
                name: "cairn".to_string(),
                ip: self.config.tcp_address.ip().to_string(),
                tcp_port: self.tcp_port(),
                quic_port: 0,
                http_port: self.http_bound_port.load(Ordering::Relaxed) as u16,
                websocket_port: 0,
                role: crate::cluster::ROLE_LEADER,
                status: crate::cluster::STATUS_HEALTHY,
            },
            Some(cluster) => crate::cluster::node_record(
                cluster.this_node(),
                crate::cluster::ROLE_LEADER,
                crate::cluster::STATUS_HEALTHY,
            ),
        }
    }

    /// Commands 103 and 123: the node holding the primary of the partition a poll or an
    /// offset write names (the metadata primary's node when it names none: a consumer
    /// group's partition is picked where the poll is served), and the coordinator
    /// connection's identity for the data connection to attach (14). 58 when no primary is
    /// known now (a view change): the SDK asks again.
    fn route(
        &self,
        session: &Session,
        stream: &Identifier,
        topic: &Identifier,
        partition_id: Option<u32>,
    ) -> Reply {
        let (partition, metadata_primary) = {
            let catalog = self.read();
            let topic = find_topic(&catalog, stream, topic)?;
            let partition = match partition_id {
                Some(id) => Some(
                    topic
                        .partitions
                        .get(id as usize)
                        .cloned()
                        .ok_or(codes::PARTITION_NOT_FOUND)?,
                ),
                None => None,
            };
            (partition, catalog.metadata_primary())
        };
        let primary = match partition {
            Some(partition) => match &*lock(&partition.state) {
                PartitionState::Serving(data) => data.primary(),
                _ => None,
            },
            None => metadata_primary,
        };
        let node = match &self.cluster {
            Some(cluster) => {
                let index = primary.ok_or(codes::TRANSIENT_NOT_ACCEPTED)?;
                cluster
                    .roster(metadata_primary)
                    .into_iter()
                    .nth(usize::from(index))
                    .ok_or(codes::TRANSIENT_NOT_ACCEPTED)?
            }
            None => self.single_node_record(),
        };
        Ok(Typed::PollRoute {
            client: session.vsr_client,
            session: session.session_id,
            // Cairn's reply headers carry commit 0, so the client's watermark stays 0.
            metadata_watermark: 0,
            primary: node,
        })
    }

    /// Command 14 on a data connection: act for the consumer of the coordinator connection
    /// whose login session the routing reply named, when it is this node's and the same
    /// user's (its consumer-group membership then counts here). A session of another node
    /// leaves this connection acting for itself.
    fn attach_consumer(&self, session: &mut Session, attached: u64) -> Reply {
        match self.client_of_session(attached) {
            Some((client_id, user_id)) if user_id == session.user_id => {
                session.consumer_of = Some(client_id);
                Ok(Typed::Empty)
            }
            Some(_) => Err(codes::UNAUTHORIZED),
            None => {
                session.consumer_of = None;
                Ok(Typed::Empty)
            }
        }
    }

    fn tcp_port(&self) -> u16 {
        // The configured port, or the one the listener actually bound (port 0 configs).
        match self.bound_port.load(Ordering::Relaxed) {
            0 => self.config.tcp_address.port(),
            port => port as u16,
        }
    }

    fn stats(&self) -> reply::Stats {
        let run_time_us = self.clock.now_us().saturating_sub(self.started_at_us);
        let machine = crate::stats::machine(run_time_us);
        let (free_disk_space, total_disk_space) = crate::stats::disk_space(&self.config.data_dir);
        let catalog = self.read();
        let mut s = reply::Stats {
            process_id: std::process::id(),
            cpu_usage: machine.cpu_usage,
            total_cpu_usage: machine.total_cpu_usage,
            memory_usage: machine.memory_usage,
            total_memory: machine.total_memory,
            available_memory: machine.available_memory,
            run_time_us,
            start_time_us: self.started_at_us,
            read_bytes: crate::stats::read_bytes(),
            written_bytes: crate::stats::written_bytes(),
            free_disk_space,
            total_disk_space,
            streams_count: catalog.meta().streams.len() as u32,
            clients_count: self.clients_connected.load(Ordering::Relaxed),
            hostname: read_trimmed("/proc/sys/kernel/hostname"),
            os_name: std::env::consts::OS.to_string(),
            os_version: read_trimmed("/proc/sys/kernel/version"),
            kernel_version: read_trimmed("/proc/sys/kernel/osrelease"),
            server_version: SERVER_VERSION.to_string(),
            threads_count: std::thread::available_parallelism()
                .map(|n| n.get() as u32)
                .unwrap_or(1),
            ..reply::Stats::default()
        };
        let mut partitions = Vec::new();
        for topic in catalog.all_topics() {
            s.topics_count += 1;
            s.partitions_count += topic.partitions_count();
            s.consumer_groups_count += topic.doc.consumer_groups.len() as u32;
            partitions.extend(topic.partitions.iter().cloned());
        }
        // The partitions' locks are taken after the catalog's is released: a partition's may
        // be held while its request waits for a quorum, and the catalog's must stay free
        // meanwhile (a cluster's metadata group is served under it).
        drop(catalog);
        for partition in partitions {
            if let PartitionState::Serving(data) = &*lock(&partition.state) {
                let log_stats = data.stats();
                s.segments_count += log_stats.segments_count;
                s.messages_count += log_stats.messages_count;
                s.messages_size_bytes += log_stats.size_bytes;
            }
        }
        s
    }

    // ---- streams and topics ----

    fn create_stream(&self, name: String, options: &[OptionEntry]) -> Reply {
        refuse_options(options)?;
        metadata::check_name(&name, codes::INVALID_STREAM_NAME)?;
        let created_at_us = self.clock.now_us();
        let created = {
            let mut catalog = self.write();
            let outcome = catalog
                .commit(&MetadataOp::CreateStream { name, created_at_us })?
                .outcome;
            match outcome {
                Outcome::Stream(id) => catalog
                    .meta()
                    .streams
                    .get(&id)
                    .map(|s| StreamView::of(&catalog, s)),
                _ => None,
            }
        };
        Ok(Typed::Stream(created.map(StreamView::details)))
    }

    fn create_topic(
        &self,
        stream: &Identifier,
        partitions_count: u32,
        name: String,
        options: &[OptionEntry],
    ) -> Reply {
        metadata::check_name(&name, codes::INVALID_TOPIC_NAME)?;
        if partitions_count > metadata::PARTITIONS_PER_TOPIC_MAX {
            return Err(codes::INVALID_PARTITIONS_COUNT);
        }
        let settings = topic_settings(options, true)?;
        let created_at_us = self.clock.now_us();
        let created = {
            let mut catalog = self.write();
            let stream_id = find_stream(&catalog, stream)?.id;
            let outcome = catalog
                .commit(&MetadataOp::CreateTopic {
                    stream_id,
                    name,
                    created_at_us,
                    partitions_count,
                    settings,
                })?
                .outcome;
            match outcome {
                Outcome::Topic { stream_id, topic_id } => {
                    catalog.topic(stream_id, topic_id).map(|t| TopicView::of(&t))
                }
                _ => None,
            }
        };
        Ok(Typed::Topic(created.map(TopicView::details)))
    }

    fn update_topic(
        &self,
        stream: &Identifier,
        topic: &Identifier,
        name: String,
        options: &[OptionEntry],
    ) -> Reply {
        metadata::check_name(&name, codes::INVALID_TOPIC_NAME)?;
        let settings = topic_settings(options, false)?;
        let mut catalog = self.write();
        let (stream_id, topic_id) = topic_ids(&catalog, stream, topic)?;
        catalog.commit(&MetadataOp::UpdateTopic {
            stream_id,
            topic_id,
            name,
            settings,
        })?;
        Ok(Typed::Empty)
    }

    /// The prelude of the consumer-offset commands: resolve whose offset it is and the
    /// partition (a kind-1 consumer without a partition means partition 0), lock the serving
    /// partition, and run `apply` with the owner, the partition id and its data.
    fn with_consumer_offsets(
        &self,
        session: &Session,
        consumer: &Consumer,
        stream: &Identifier,
        topic: &Identifier,
        partition_id: Option<u32>,
        apply: impl FnOnce(&Owner, u32, &mut PartitionData) -> Reply,
    ) -> Reply {
        let (owner, partition_id) = match consumer {
            Consumer::Consumer(id) => (consumer_owner(id), partition_id.unwrap_or(0)),
            Consumer::Group(group) => {
                let catalog = self.read();
                let topic = find_topic(&catalog, stream, topic)?;
                let group_id = topic.doc.find_group(group)?.id;
                let partition_id = match partition_id {
                    Some(p) => p,
                    // "Resolved server-side for consumer groups": the partition last served
                    // to this member, else its first assigned one.
                    None => {
                        let members = lock(topic.members);
                        members
                            .get(&group_id)
                            .and_then(|m| {
                                let index = m.position(session.member_id())?;
                                m.members
                                    .get(index)
                                    .and_then(|member| member.last_served)
                                    .or_else(|| m.assigned(index, topic.partitions_count()).first().copied())
                            })
                            .ok_or(codes::PARTITION_NOT_FOUND)?
                    }
                };
                (Owner::Group(group_id), partition_id)
            }
        };
        let partition = self.partition(stream, topic, partition_id)?;
        let mut state = lock(&partition.state);
        let data = serving(&mut state)?;
        apply(&owner, partition.id, data)
    }

    /// The group offset owner and the partition a kind-2 poll reads: the caller must be a
    /// member (5006) and an explicit partition must be assigned to it (5009); without one the
    /// member's assigned partitions are served round robin. `None`: it has no partitions.
    fn group_poll_partition(
        &self,
        session: &Session,
        group: &Identifier,
        stream: &Identifier,
        topic: &Identifier,
        partition_id: Option<u32>,
    ) -> Result<Option<(Owner, u32)>, u32> {
        let catalog = self.read();
        let topic = find_topic(&catalog, stream, topic)?;
        let group_id = topic.doc.find_group(group)?.id;
        let partitions_count = topic.partitions_count();
        let mut members = lock(topic.members);
        let Some(membership) = members.get_mut(&group_id) else {
            return Err(codes::CONSUMER_GROUP_MEMBER_NOT_FOUND);
        };
        let Some(index) = membership.position(session.member_id()) else {
            return Err(codes::CONSUMER_GROUP_MEMBER_NOT_FOUND);
        };
        let partition_id = match partition_id {
            Some(p) if membership.assigned(index, partitions_count).contains(&p) => p,
            Some(_) => return Err(codes::CONSUMER_GROUP_PARTITION_NOT_OWNED),
            None => match membership.next_partition(index, partitions_count) {
                Some(p) => p,
                None => return Ok(None),
            },
        };
        if let Some(member) = membership.members.get_mut(index) {
            member.last_served = Some(partition_id);
        }
        Ok(Some((Owner::Group(group_id), partition_id)))
    }

    /// Remove `client_id` from every consumer group (Logout, connection close).
    pub fn drop_memberships(&self, client_id: u32) {
        let catalog = self.read();
        for topic in catalog.all_topics() {
            for membership in lock(topic.members).values_mut() {
                membership.leave(client_id);
            }
        }
    }

    /// The client record of `session`, with the groups it is a member of.
    fn client_record(&self, session: &Session) -> reply::ClientRecord {
        let mut consumer_groups = Vec::new();
        let catalog = self.read();
        for topic in catalog.all_topics() {
            for (group_id, membership) in lock(topic.members).iter() {
                if membership.position(session.client_id).is_some() {
                    consumer_groups.push((topic.stream_id, topic.doc.id, *group_id));
                }
            }
        }
        reply::ClientRecord {
            client_id: session.client_id,
            user_id: session.user_id,
            transport: session.transport,
            address: session.address.clone(),
            consumer_groups,
        }
    }

    /// Resolve a partition of a topic to its shared handle (catalog lock released after).
    fn partition(
        &self,
        stream: &Identifier,
        topic: &Identifier,
        partition_id: u32,
    ) -> Result<Arc<catalog::Partition>, u32> {
        let catalog = self.read();
        let topic = find_topic(&catalog, stream, topic)?;
        topic
            .partitions
            .get(partition_id as usize)
            .cloned()
            .ok_or(codes::PARTITION_NOT_FOUND)
    }

    // ---- messages ----

    /// Validate a send and resolve its partition. Every limit is checked here, before the send
    /// is queued, so nothing invalid ever reaches a writer.
    fn prepare_send(
        &self,
        stream: &Identifier,
        topic: &Identifier,
        partitioning: &Partitioning,
        messages_count: u32,
        batch: batch::ReceivedBatch,
    ) -> Result<PreparedSend, u32> {
        batch::validate(&batch, messages_count, &self.limits).map_err(|e| e.status())?;
        let (stream_id, topic_id, partition) = {
            let catalog = self.read();
            let topic = find_topic(&catalog, stream, topic)?;
            let partition_id = resolve_partition(&topic, partitioning)?;
            let partition = topic
                .partitions
                .get(partition_id as usize)
                .cloned()
                .ok_or(codes::PARTITION_NOT_FOUND)?;
            (topic.stream_id, topic.doc.id, partition)
        };
        Ok(PreparedSend {
            stream_id,
            topic_id,
            partition,
            batch,
            messages_count,
            received_at_us: self.clock.now_us(),
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn poll_messages(
        &self,
        session: &Session,
        consumer: &Consumer,
        stream: &Identifier,
        topic: &Identifier,
        partition_id: Option<u32>,
        strategy: PollingStrategy,
        count: u32,
        auto_commit: bool,
    ) -> Result<PrefixedPayload, u32> {
        let (owner, partition_id) = match consumer {
            // A kind-1 consumer without a partition reads partition 0 (what the SDK documents).
            Consumer::Consumer(id) => (consumer_owner(id), partition_id.unwrap_or(0)),
            Consumer::Group(group) => {
                match self.group_poll_partition(session, group, stream, topic, partition_id)? {
                    Some(pair) => pair,
                    None => {
                        // A member with no partitions: the empty head with partition u32::MAX
                        // makes the 0.11 client re-sync.
                        return Ok(PrefixedPayload::with_head(PollHead {
                            partition_id: u32::MAX,
                            current_offset: 0,
                            messages_count: 0,
                        }));
                    }
                }
            }
        };
        let partition = self.partition(stream, topic, partition_id)?;
        let mut state = lock(&partition.state);
        let data = serving(&mut state)?;
        if data.has_peers() && !data.is_current() {
            // A replica in a view change, recovering, or rebuilding from its peers would
            // answer from a log that may lack committed messages (a wiped one holds none):
            // retryable, nothing read.
            return Err(codes::TRANSIENT_NOT_ACCEPTED);
        }
        // The reply is built in one buffer: prefix, poll head (count patched below), then the
        // batches, read straight from the segment files behind the head.
        let mut out = PrefixedPayload::with_head(PollHead {
            partition_id: partition.id,
            current_offset: data.current_offset(),
            messages_count: 0,
        });
        let read = data.poll(
            &owner,
            strategy,
            count,
            auto_commit,
            &mut out.buffer,
            &mut out.parts,
        );
        if let Some(damage) = data.take_found_damage() {
            crate::partition::refuse_for_damage(&mut state, &partition.dir, &damage, "a poll");
        }
        let read = read?;
        crate::stats::record_read(out.batches_len());
        out.set_messages_count(read.messages_count);
        Ok(out)
    }
}

/// Argon2 hash of a random secret, verified against when a username does not exist.
fn dummy_hash() -> &'static str {
    static HASH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HASH.get_or_init(|| auth::hash_secret(&auth::random_secret(32)).unwrap_or_default())
}

fn check_protocol(version: u32) -> Result<(), u32> {
    if (cairn_wire::frame::PROTOCOL_VERSION_MIN..=cairn_wire::frame::PROTOCOL_VERSION_MAX).contains(&version)
    {
        Ok(())
    } else {
        // The shell turns this into an Eviction with reason 14 before replying.
        Err(INCOMPATIBLE_PROTOCOL_STATUS)
    }
}

/// Internal marker status: the shell answers it with an IncompatibleProtocol eviction.
pub const INCOMPATIBLE_PROTOCOL_STATUS: u32 = codes::INCOMPATIBLE_PROTOCOL_MARKER;

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

impl Server {
    /// Purge a topic (or every topic of a stream): delete every message and stored consumer
    /// offset; offsets keep counting (an offset is never handed out twice).
    ///
    /// Durable across a crash at any point: under the catalog write lock and every affected
    /// partition's lock (so no send slips in between), the purge target of each partition (its
    /// next offset) is recorded in the metadata first; then each partition's group commits a
    /// PURGE op (messages and consumer offsets at once). A boot finds any partition that still
    /// starts below its target and finishes the purge before serving
    /// (`PartitionData::open`). Refused before anything changes if a partition does not serve.
    fn purge(&self, stream: &Identifier, topic: Option<&Identifier>) -> Reply {
        let mut catalog = self.write();
        // With peers, every applied op is reflected before partition locks are taken: a
        // delete reflected inside the commit below would lock a partition held here.
        catalog.reconcile();
        let stream = find_stream(&catalog, stream)?;
        let stream_id = stream.id;
        let topics: Vec<Topic<'_>> = match topic {
            Some(topic) => vec![catalog.find_topic(stream, topic)?],
            None => catalog.topics_of(stream).collect(),
        };
        // (topic id, partition) in catalog order; locked in that order (only a purge holds
        // more than one partition lock, and only under the catalog write lock).
        let partitions: Vec<(u32, Arc<catalog::Partition>)> = topics
            .iter()
            .flat_map(|t| t.partitions.iter().map(|p| (t.doc.id, p.clone())))
            .collect();
        let mut guards: Vec<_> = partitions.iter().map(|(_, p)| lock(&p.state)).collect();
        let mut marks = Vec::with_capacity(guards.len());
        for ((topic_id, partition), guard) in partitions.iter().zip(guards.iter_mut()) {
            let data = serving(guard)?;
            if data.stopped_reason().is_some() {
                // Refused before anything changes: a purge must not stop half-way.
                return Err(writer::PARTITION_STOPPED_STATUS);
            }
            marks.push(PurgeMark {
                topic_id: *topic_id,
                partition_id: partition.id,
                target: data.purge_target(),
            });
        }
        // Nothing is purged unless the marks are durable; a refused commit changed nothing.
        catalog.commit(&MetadataOp::MarkPurge {
            stream_id,
            marks: marks.clone(),
        })?;
        crate::faults::crash_point("purge-after-marker");
        for (((_, partition), guard), mark) in partitions.iter().zip(guards.iter_mut()).zip(marks) {
            let target = mark.target;
            serving(guard)?.purge(target)?;
            tracing::info!(partition_dir = %partition.dir.display(), purged_below = target, "purged partition");
            crate::faults::crash_point("purge-after-first-partition");
        }
        Ok(Typed::Empty)
    }
}

/// Streams have no option keys in this dialect.
fn refuse_options(options: &[OptionEntry]) -> Result<(), u32> {
    match options.first() {
        Some(_) => Err(codes::UNSUPPORTED_OPTION_KEY),
        None => Ok(()),
    }
}

fn group_record(topic: &Topic<'_>, group: &GroupDoc) -> reply::GroupRecord {
    let partitions_count = topic.partitions_count();
    let members = lock(topic.members);
    let members = members
        .get(&group.id)
        .map(|m| {
            m.members
                .iter()
                .enumerate()
                .map(|(index, member)| (member.client_id, m.assigned(index, partitions_count)))
                .collect()
        })
        .unwrap_or_default();
    reply::GroupRecord {
        id: group.id,
        partitions_count,
        name: group.name.clone(),
        members,
    }
}

/// The offset owner a single consumer's identifier names: consumer 5 and consumer "5" are
/// different owners.
fn consumer_owner(id: &Identifier) -> Owner {
    match id {
        Identifier::Numeric(n) => Owner::Consumer(*n),
        Identifier::Name(name) => Owner::ConsumerName(name.clone()),
    }
}

fn find_stream<'a>(catalog: &'a Catalog, id: &Identifier) -> Result<&'a Stream, u32> {
    catalog.meta().find_stream(id)
}

fn find_topic<'a>(catalog: &'a Catalog, stream: &Identifier, topic: &Identifier) -> Result<Topic<'a>, u32> {
    catalog.find_topic(find_stream(catalog, stream)?, topic)
}

/// The (stream id, topic id) two identifiers name.
fn topic_ids(catalog: &Catalog, stream: &Identifier, topic: &Identifier) -> Result<(u32, u32), u32> {
    let (stream, topic) = catalog.meta().find_topic(stream, topic)?;
    Ok((stream.id, topic.id))
}

fn resolve_partition(topic: &Topic<'_>, partitioning: &Partitioning) -> Result<u32, u32> {
    let count = topic.partitions_count();
    if count == 0 {
        return Err(codes::NO_PARTITIONS);
    }
    match partitioning {
        Partitioning::PartitionId(id) if *id < count => Ok(*id),
        Partitioning::PartitionId(_) => Err(codes::PARTITION_NOT_FOUND),
        Partitioning::Balanced => catalog::next_balanced(topic).ok_or(codes::NO_PARTITIONS),
        Partitioning::MessagesKey(key) => Ok(xxhash_rust::xxh32::xxh32(key, 0) % count),
    }
}

/// A stream as the catalog names it, taken under the catalog's lock; its figures (sizes,
/// message counts) are read from the partitions after that lock is released
/// ([`StreamView::record`]), since a partition's lock may be held while its request waits
/// for a quorum, and the catalog's must stay free meanwhile: a cluster's metadata group is
/// served under it, and a backup that stops hearing its primary starts a view change.
struct StreamView {
    record: reply::StreamRecord,
    topics: Vec<TopicView>,
}

impl StreamView {
    fn of(catalog: &Catalog, stream: &Stream) -> StreamView {
        StreamView {
            record: reply::StreamRecord {
                id: stream.id,
                created_at: stream.created_at_us,
                topics_count: stream.topics.len() as u32,
                size_bytes: 0,
                messages_count: 0,
                name: stream.name.clone(),
            },
            topics: catalog.topics_of(stream).map(|t| TopicView::of(&t)).collect(),
        }
    }

    /// The stream's record and its topics' (taking each partition's lock in turn).
    fn records(self) -> (reply::StreamRecord, Vec<reply::TopicRecord>) {
        let mut record = self.record;
        let topics: Vec<reply::TopicRecord> = self.topics.into_iter().map(TopicView::record).collect();
        for topic in &topics {
            record.size_bytes += topic.size_bytes;
            record.messages_count += topic.messages_count;
        }
        (record, topics)
    }

    fn record(self) -> reply::StreamRecord {
        self.records().0
    }

    fn details(self) -> Box<StreamDetails> {
        let (stream, topics) = self.records();
        Box::new(StreamDetails { stream, topics })
    }
}

/// A topic as the catalog names it, with its partitions, whose figures are read after the
/// catalog's lock is released (see [`StreamView`]).
struct TopicView {
    record: reply::TopicRecord,
    partitions: Vec<Arc<catalog::Partition>>,
}

impl TopicView {
    fn of(topic: &Topic<'_>) -> TopicView {
        TopicView {
            record: reply::TopicRecord {
                id: topic.doc.id,
                created_at: topic.doc.created_at_us,
                partitions_count: topic.partitions_count(),
                message_expiry: topic.doc.message_expiry_us,
                compression: topic.doc.compression,
                max_topic_size: topic.doc.max_topic_size_bytes,
                size_bytes: 0,
                messages_count: 0,
                name: topic.doc.name.clone(),
            },
            partitions: topic.partitions.to_vec(),
        }
    }

    /// The topic's record and its partitions' (taking each partition's lock in turn).
    fn records(self) -> (reply::TopicRecord, Vec<reply::PartitionRecord>) {
        let mut record = self.record;
        let partitions: Vec<reply::PartitionRecord> =
            self.partitions.iter().map(|p| partition_record(p)).collect();
        for partition in &partitions {
            record.size_bytes += partition.size_bytes;
            record.messages_count += partition.messages_count;
        }
        (record, partitions)
    }

    fn record(self) -> reply::TopicRecord {
        self.records().0
    }

    fn details(self) -> Box<TopicDetails> {
        let (topic, partitions) = self.records();
        Box::new(TopicDetails { topic, partitions })
    }
}

/// Takes the partition's lock: never call it holding the catalog's (see [`StreamView`]).
fn partition_record(partition: &catalog::Partition) -> reply::PartitionRecord {
    let mut record = reply::PartitionRecord {
        id: partition.id,
        created_at: partition.created_at_us,
        segments_count: 0,
        current_offset: 0,
        size_bytes: 0,
        messages_count: 0,
    };
    if let PartitionState::Serving(data) = &*lock(&partition.state) {
        let stats = data.stats();
        record.segments_count = stats.segments_count;
        record.current_offset = data.current_offset();
        record.size_bytes = stats.size_bytes;
        record.messages_count = stats.messages_count;
    }
    record
}

/// Parse and check a topic's option block. `create` allows the create-only keys.
fn topic_settings(options: &[OptionEntry], create: bool) -> Result<metadata::TopicSettings, u32> {
    let mut settings = metadata::TopicSettings::default();
    for entry in options {
        let text = std::str::from_utf8(&entry.value).ok();
        let uint = || -> Option<u64> {
            match (entry.value_kind, entry.value.len()) {
                // Uint64 / Int64 little-endian, or a decimal string.
                (12 | 7, 8) => entry.value.as_slice().try_into().ok().map(u64::from_le_bytes),
                (11 | 6, 4) => entry
                    .value
                    .as_slice()
                    .try_into()
                    .ok()
                    .map(|b| u32::from_le_bytes(b) as u64),
                (2, _) => text.and_then(|t| t.trim().parse().ok()),
                _ => None,
            }
        };
        let invalid = codes::INVALID_OPTION_VALUE;
        match entry.key.as_str() {
            "compression_algorithm" => {
                settings.compression = Some(match text {
                    Some("none") => 1,
                    Some("gzip") => 2,
                    _ => return Err(invalid),
                });
            }
            "message_expiry" => {
                settings.message_expiry_us = Some(match uint().ok_or(invalid)? {
                    u64::MAX => 0,
                    v => v,
                })
            }
            "max_topic_size" => settings.max_topic_size_bytes = Some(uint().ok_or(invalid)?),
            "durability" | "consumer_offset_durability" if create => {
                // `replicated` is what the SDK sends by default: on a single node it means
                // the server's own default, never weaker. Both are accepted and the
                // server's durability mode applies.
                if !matches!(text, Some("replicated") | Some("persisted")) {
                    return Err(invalid);
                }
            }
            "segment_size" if create => {
                // The SDK sends 0 for "the server's default". Index positions are u32,
                // so a segment stays below 4 GiB.
                settings.segment_size_bytes = match uint().ok_or(invalid)? {
                    0 => None,
                    v if v < 1024 * 1024 || v % 512 != 0 || v > u64::from(u32::MAX) => {
                        return Err(invalid);
                    }
                    v => Some(v),
                };
            }
            "messages_required_to_save" if create => {
                let v = uint().ok_or(invalid)?;
                if !(1..=16 * 1024 * 1024).contains(&v) {
                    return Err(invalid);
                }
            }
            "size_of_messages_required_to_save" if create => {
                if uint().ok_or(invalid)? > 1024 * 1024 * 1024 {
                    return Err(invalid);
                }
            }
            "preallocate_segments" if create => {
                if !(entry.value_kind == 3 && entry.value.len() == 1) {
                    return Err(invalid);
                }
            }
            _ => return Err(codes::UNSUPPORTED_OPTION_KEY),
        }
    }
    Ok(settings)
}

/// The status of a login refused for `status` (an unknown user, a wrong password or token):
/// that status on a node whose metadata is the cluster's; 58 (retryable, on any node) on a
/// node still catching up with its peers, whose metadata may lack the user or token (a
/// restarted node learns the users created since its checkpoint from its peers). The SDK
/// replays a login answered 58 on the same connection, every 50 ms for up to 30 s; the answer
/// is held back a quarter second so those replays cost few password verifications.
fn refused_login(metadata_current: bool, status: u32) -> u32 {
    if metadata_current {
        return status;
    }
    tracing::info!(
        status,
        "a login this node would refuse was answered 58 (retry): its metadata is still catching up with its peers and may lack the user"
    );
    // On a blocking thread (every command is handled on one).
    std::thread::sleep(std::time::Duration::from_millis(250));
    codes::TRANSIENT_NOT_ACCEPTED
}
