//! The catalog: the committed metadata and the run-time parts of every topic (partition
//! logs, writers, balanced-send cursors, consumer-group membership).
//!
//! The metadata is the state machine of the metadata's replication group (`node.rs`,
//! `<data_dir>/vsr/metadata/`): it changes only through [`Catalog::commit`], which decides an
//! op on a copy of the state, submits it, and finishes its effects once the log entry is
//! durable and applied. Memory is never ahead of the disk: an op whose log write fails is not
//! applied, and nothing of it is visible. Message data lives in the partitions' own
//! directories: `<data_dir>/streams/<stream id>/topics/<topic id>/partitions/<partition id>/`.
//!
//! Ordering rules that keep the two consistent across a crash:
//! - create: partition directories first (not serving yet), the log entry second, then they
//!   serve. A crash or a failed log write in between leaves directories that the metadata may
//!   not name; boot removes those it does not (nothing in them was ever acknowledged).
//! - delete: metadata first, directories second. A crash in between leaves an orphan directory,
//!   removed at boot, so deleted data never comes back.

use crate::node::{Fate, GroupError, Inbox, LocalGroup, Peers, PrimarySeen, Ticket};
use crate::partition::{
    OpenError, PartitionData, PartitionIds, PartitionPeers, PartitionState, lock, remove_dir,
};
use crate::partition_group::{self, JournalOptions};
use crate::replicas::{Pending, Replicas, Served};
use crate::writer::{CommitCounters, WriterContext, WriterHandle};
use cairn_machine::metadata::{
    Applied, Effect, Metadata, MetadataMachine, MetadataOp, OPERATION_METADATA, PartitionDoc, Stream,
    TopicDoc,
};
use cairn_machine::partition::Owner;
use cairn_storage::StorageError;
use cairn_vsr::journal::BodyRule;
use cairn_vsr::replica::StateMachine;
use cairn_wire::codes;
use cairn_wire::types::Identifier;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

/// A partition at run time. Its log and offsets sit behind one mutex; sends reach the log only
/// through the partition's writer (group commit, see `writer`).
pub struct Partition {
    pub id: u32,
    pub created_at_us: u64,
    pub dir: PathBuf,
    /// Shared with the writer task (not the whole `Partition`: the partition owns the writer's
    /// queue, so the writer holding the partition would keep both alive forever).
    pub state: Arc<Mutex<PartitionState>>,
    /// The writer's queue; `None` once a clean stop closed it. A std mutex: held only to clone
    /// or take the handle, never across an `.await`.
    writer: Mutex<Option<WriterHandle>>,
    /// Group-commit counters of this partition.
    pub counters: Arc<CommitCounters>,
    /// In a cluster of several nodes: the node's replica network, which routes the
    /// partition group's messages here until the partition is deleted.
    hosted: Option<Hosted>,
}

/// A partition group hosted on the replica network.
struct Hosted {
    replicas: Arc<Replicas>,
    group: u64,
    /// The group's primary as this node's replica last saw it.
    primary_seen: Arc<PrimarySeen>,
    /// Set to the partition's state once it exists, so the node's workers serve it.
    pending: Arc<Pending>,
}

/// The run-time parts of one topic (its metadata is a `TopicDoc` in the committed state).
#[derive(Default)]
pub struct TopicRuntime {
    /// By partition id: exactly the partitions the topic's metadata lists.
    pub partitions: Vec<Arc<Partition>>,
    /// Round-robin cursor for balanced sends that the server resolves itself.
    pub balanced_cursor: AtomicU32,
    /// When the topic was created: a topic deleted and created again with the same ids is
    /// another topic (a cluster's backups follow the metadata by comparing it).
    pub created_at_us: u64,
    /// Run-time membership of this topic's consumer groups, by group id (never persisted:
    /// membership belongs to client sessions).
    pub members: Mutex<BTreeMap<u32, Membership>>,
}

/// A topic as requests see it: its committed metadata and its run-time parts.
#[derive(Clone, Copy)]
pub struct Topic<'a> {
    pub stream_id: u32,
    pub doc: &'a TopicDoc,
    pub partitions: &'a [Arc<Partition>],
    pub balanced_cursor: &'a AtomicU32,
    pub members: &'a Mutex<BTreeMap<u32, Membership>>,
}

/// The members of one consumer group, in join order, and the assignment generation.
#[derive(Debug, Default)]
pub struct Membership {
    /// Bumped on every join, leave and partition-count change.
    pub generation: u64,
    pub members: Vec<Member>,
}

#[derive(Debug)]
pub struct Member {
    /// The member's client (connection) id.
    pub client_id: u32,
    /// Round-robin cursor over the assigned partitions, for polls without a partition.
    pub cursor: usize,
    /// The partition most recently served to this member (offset commands without one).
    pub last_served: Option<u32>,
}

impl Membership {
    /// Position of `client_id` in join order.
    pub fn position(&self, client_id: u32) -> Option<usize> {
        self.members.iter().position(|m| m.client_id == client_id)
    }

    /// Partitions assigned to the member at `index`: partition i goes to member (i mod n).
    pub fn assigned(&self, index: usize, partitions_count: u32) -> Vec<u32> {
        let n = self.members.len();
        if n == 0 {
            return Vec::new();
        }
        (0..partitions_count)
            .filter(|p| *p as usize % n == index)
            .collect()
    }

    /// Add a member (no-op if present). Returns whether it was added.
    pub fn join(&mut self, client_id: u32) -> bool {
        if self.position(client_id).is_some() {
            return false;
        }
        self.members.push(Member {
            client_id,
            cursor: 0,
            last_served: None,
        });
        self.generation += 1;
        true
    }

    /// Remove a member. Returns whether it was one.
    pub fn leave(&mut self, client_id: u32) -> bool {
        let Some(index) = self.position(client_id) else {
            return false;
        };
        self.members.remove(index);
        self.generation += 1;
        true
    }

    /// The next assigned partition of the member at `index`, round robin; `None` if it has none.
    pub fn next_partition(&mut self, index: usize, partitions_count: u32) -> Option<u32> {
        let assigned = self.assigned(index, partitions_count);
        let member = self.members.get_mut(index)?;
        if assigned.is_empty() {
            return None;
        }
        let partition = assigned[member.cursor % assigned.len()];
        member.cursor = member.cursor.wrapping_add(1);
        Some(partition)
    }
}

/// How the catalog's groups reach their peers, on a node of a cluster of several nodes.
#[derive(Clone)]
pub struct ClusterSeat {
    pub replicas: Arc<Replicas>,
    /// This node's replica index, and how many replicas every group has.
    pub replica: u8,
    pub replica_count: u8,
    /// The cluster id every group carries.
    pub cluster: u128,
    pub tick: Duration,
    /// How long a request waits for a quorum before its outcome is given up as unknown.
    pub request_timeout: Duration,
    /// Whether this start formats the metadata group when it has none: only when the node
    /// forms the cluster (every node empty), never for a node that lost its files.
    pub forming: bool,
    /// Set while this node rejoins after losing its data (`Membership::rejoining`): a
    /// partition the metadata names and this node has no files of opens as a wiped replica,
    /// never a new one. Cleared once the metadata caught up and every partition it names
    /// has a replica here.
    pub rejoining: Arc<AtomicBool>,
    /// What this node's handshakes say: it holds the cluster's data (its metadata formatted,
    /// and not rejoining). Set once it has rejoined.
    pub holds_data: Arc<AtomicBool>,
    /// Set while this node's metadata replica is the primary (the leader clients are sent
    /// to): the partitions' replicas here then take their groups' primaries over.
    pub leads_metadata: Arc<AtomicBool>,
}

impl ClusterSeat {
    /// The peers of this node's replica of a group whose messages arrive in `inbox`.
    fn peers(&self, inbox: Arc<Inbox>, format_if_missing: bool, primary_seen: Arc<PrimarySeen>) -> Peers {
        Peers {
            replica: self.replica,
            replica_count: self.replica_count,
            cluster: self.cluster,
            transport: self.replicas.transport(),
            inbox,
            tick: self.tick,
            request_timeout: self.request_timeout,
            format_if_missing,
            transfer_pace: self.replicas.transfer_pace(),
            abdicating: self.replicas.abdicating(),
            primary_seen,
            clock: Arc::new(crate::node::WallClock),
        }
    }

    /// [`ClusterSeat::host`] on a node of a cluster; nothing on a node of one.
    fn host_on(
        seat: Option<&ClusterSeat>,
        ids: PartitionIds,
        doc: PartitionDoc,
        format_if_missing: bool,
    ) -> (Option<PartitionPeers>, Option<Hosted>) {
        match seat {
            Some(seat) => {
                let (peers, hosted) = seat.host(ids, doc, format_if_missing);
                (Some(peers), Some(hosted))
            }
            None => (None, None),
        }
    }

    /// Host partition `ids` (created as `doc` says) on the replica network: the peers its
    /// replica opens with, and the hosting (served once the partition exists).
    fn host(
        &self,
        ids: PartitionIds,
        doc: PartitionDoc,
        format_if_missing: bool,
    ) -> (PartitionPeers, Hosted) {
        let group = partition_group::cluster_group_id(
            ids.stream_id,
            ids.topic_id,
            ids.partition_id,
            doc.created_at_us,
        );
        let pending = Arc::new(Pending::default());
        let inbox = self.replicas.add_group(group, pending.clone());
        let primary_seen = Arc::new(PrimarySeen::default());
        let peers = PartitionPeers {
            peers: self.peers(inbox, format_if_missing, primary_seen.clone()),
            group,
            leads_metadata: self.leads_metadata.clone(),
            missing_is_wiped: self.rejoining.load(Ordering::Acquire),
        };
        let hosted = Hosted {
            replicas: self.replicas.clone(),
            group,
            primary_seen,
            pending,
        };
        (peers, hosted)
    }
}

/// The whole catalog. Guarded by one `RwLock` in the server; partitions have their own locks.
pub struct Catalog {
    pub data_dir: PathBuf,
    /// The server's segment size (`storage.segment_size_bytes`); a topic may set its own.
    pub segment_size_bytes: u64,
    /// `storage.durability = relaxed` (every partition's journal).
    pub relaxed: bool,
    /// Starts each partition's writer when the partition is opened or created.
    pub writers: WriterContext,
    /// The replicated metadata log; its state machine holds the committed metadata, changed
    /// only by [`Catalog::commit`].
    group: LocalGroup<MetadataMachine>,
    /// Run-time parts by (stream id, topic id): exactly the topics `meta` holds.
    runtime: BTreeMap<(u32, u32), TopicRuntime>,
    /// In a cluster of several nodes: how the groups reach their peers.
    seat: Option<ClusterSeat>,
    /// The metadata op the run-time parts reflect (with peers, a backup applies ops the
    /// catalog did not make, and the run-time parts follow: [`Catalog::reconcile`]).
    reflected_op: u64,
    /// Served by the node's workers once the catalog is shared ([`Catalog::share`]).
    pending: Option<Arc<Pending>>,
    /// With peers: partitions made for metadata ops whose outcome was unknown (no quorum
    /// reply in time). Adopted if the op commits; removed once it cannot.
    staged_unknown: Vec<Staged>,
    /// The stored offsets of consumer groups deleted by ops this catalog applied, to delete
    /// outside its lock ([`Catalog::take_offsets_of_deleted_groups`]).
    offsets_of_deleted_groups: Vec<(Arc<Partition>, u32)>,
    /// With peers: metadata changes answered 57, by the SDK request that asked for them
    /// (client id, request id), with their tickets and when they were answered.
    unknown_changes: BTreeMap<(u128, u64), (Ticket, std::time::Instant)>,
}

/// How long a metadata change answered 57 stays recognisable: the SDK replays a 57 for at
/// most 30 s.
const UNKNOWN_CHANGE_KEPT: Duration = Duration::from_secs(60);
/// Most metadata changes answered 57 kept at once (the oldest goes first).
const UNKNOWN_CHANGES_MAX: usize = 1024;

thread_local! {
    /// The SDK request (its client id and request id) this thread handles now.
    static CLIENT_REQUEST: std::cell::Cell<Option<(u128, u64)>> = const { std::cell::Cell::new(None) };
}

/// Run `handle` as the handling of the SDK request with client id and request id
/// `client_request` (TCP: the frame header's; `None` where a request has no identity, as over
/// HTTP). A metadata change whose outcome is unknown is then answered 57, and the client's
/// replay of the same request is recognised ([`Catalog::commit`]): answered from the
/// outcome, never applied twice.
pub fn handling_client_request<T>(client_request: Option<(u128, u64)>, handle: impl FnOnce() -> T) -> T {
    struct Reset(Option<(u128, u64)>);
    impl Drop for Reset {
        fn drop(&mut self) {
            CLIENT_REQUEST.with(|current| current.set(self.0));
        }
    }
    let _reset = Reset(CLIENT_REQUEST.with(|current| current.replace(client_request)));
    handle()
}

fn client_request() -> Option<(u128, u64)> {
    CLIENT_REQUEST.with(std::cell::Cell::get)
}

/// Whether this thread handles an SDK request with an identity now.
pub fn handling_a_client_request() -> bool {
    client_request().is_some()
}

/// Delete the stored offsets of deleted consumer groups, each partition under its own lock
/// (never the catalog's: a delete waits for the partition's quorum). Only a partition
/// holding the group's offset is verified (`serving`) and written; an offset that cannot be
/// deleted stays on disk, inert (group ids are never reused).
pub fn delete_group_offsets(offsets: Vec<(Arc<Partition>, u32)>) {
    for (partition, group_id) in offsets {
        let owner = Owner::Group(group_id);
        let mut state = lock(&partition.state);
        if matches!(&*state, PartitionState::Serving(data) if data.stored_offset(&owner).is_some())
            && let Ok(data) = crate::partition::serving(&mut state)
            && let Err(status) = data.delete_offset(&owner)
            && status != codes::CONSUMER_OFFSET_NOT_FOUND
        {
            tracing::warn!(status, partition_dir = %partition.dir.display(), group_id, "cannot delete a deleted group's stored offset; it stays on disk, inert (group ids are never reused)");
        }
    }
}

pub fn metadata_path(data_dir: &Path) -> PathBuf {
    data_dir.join("metadata")
}

pub fn stream_dir(data_dir: &Path, stream_id: u32) -> PathBuf {
    data_dir.join("streams").join(stream_id.to_string())
}

pub fn topic_dir(data_dir: &Path, stream_id: u32, topic_id: u32) -> PathBuf {
    stream_dir(data_dir, stream_id)
        .join("topics")
        .join(topic_id.to_string())
}

pub fn partition_dir(data_dir: &Path, stream_id: u32, topic_id: u32, partition_id: u32) -> PathBuf {
    topic_dir(data_dir, stream_id, topic_id)
        .join("partitions")
        .join(partition_id.to_string())
}

/// Errors from catalog changes, mapped to statuses by the handler.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("the replicated metadata log: {0}")]
    Group(GroupError),
    #[error("a partition's replicated log: {0}")]
    Partition(GroupError),
}

impl Partition {
    /// The run-time partition around `state`, with its writer started.
    fn assemble(
        dir: PathBuf,
        doc: PartitionDoc,
        state: PartitionState,
        writers: &WriterContext,
        hosted: Option<Hosted>,
    ) -> Partition {
        let state = Arc::new(Mutex::new(state));
        let counters = Arc::new(CommitCounters::default());
        let writer = writers.spawn(state.clone(), dir.clone(), counters.clone());
        if let Some(hosted) = &hosted {
            let served: Weak<dyn Served> = Arc::downgrade(&state) as Weak<Mutex<PartitionState>>;
            hosted.pending.set(served);
            hosted
                .replicas
                .forwarder()
                .register(hosted.group, &writer.queue());
        }
        Partition {
            id: doc.id,
            created_at_us: doc.created_at_us,
            dir,
            state,
            writer: Mutex::new(Some(writer)),
            counters,
            hosted,
        }
    }

    /// With peers, where a send goes that this node's replica cannot take: the node its
    /// replica last saw as the partition's primary, when that is another node, with the
    /// forwarder and the partition's group id (`forward.rs`). `None` sends it to the local
    /// writer (a node of one, this replica the primary, or no primary known now).
    pub fn forward_route(&self) -> Option<(Arc<crate::forward::Forwarder>, u8, u64)> {
        let hosted = self.hosted.as_ref()?;
        let primary = hosted.primary_seen.get()?;
        (primary != hosted.replicas.index())
            .then(|| (hosted.replicas.forwarder().clone(), primary, hosted.group))
    }

    /// A sender to this partition's writer queue, or `None` once the writer is closed.
    pub fn writer_queue(&self) -> Option<tokio::sync::mpsc::Sender<crate::writer::PendingSend>> {
        lock(&self.writer).as_ref().map(WriterHandle::queue)
    }

    /// Take the writer handle (clean stop): later sends are refused, queued ones still complete.
    /// Sends forwarded from peers are refused from now on too (58): each holds a sender of
    /// the writer's queue while it runs, and the writer ends only when every sender is gone.
    pub fn take_writer(&self) -> Option<WriterHandle> {
        if let Some(hosted) = &self.hosted {
            hosted.replicas.forwarder().unregister(hosted.group);
        }
        lock(&self.writer).take()
    }

    /// Recover the partition in `dir` (its writer is started by [`Partition::assemble`]):
    /// serving, or refused with the reason logged.
    fn open_state(
        dir: &Path,
        ids: PartitionIds,
        doc: PartitionDoc,
        options: JournalOptions,
        peers: Option<PartitionPeers>,
    ) -> PartitionState {
        debug_assert_eq!(ids.partition_id, doc.id);
        let opened = match peers {
            // A replica whose directory is missing on a node that rejoins after losing its
            // data: a wiped replica (it may have acknowledged ops before).
            Some(peers) if !dir.exists() && peers.missing_is_wiped => {
                tracing::warn!(partition_dir = %dir.display(), "this node rejoins after losing its data and holds no files of this partition: its replica rejoins as a wiped one and catches up from its peers");
                PartitionData::create(dir, ids, options, Some(peers)).map_err(OpenError::from)
            }
            // Otherwise the node stopped between applying the create and making its files
            // (or joined after it): nothing of it was ever acknowledged here, so it starts as
            // a new replica and catches up from its peers (a directory whose files went to
            // quarantine rejoins wiped instead: `LocalGroup::open_with_peers`).
            Some(peers) if !dir.exists() => {
                tracing::info!(partition_dir = %dir.display(), "the metadata names a partition this node holds no files of (it stopped after applying the create and before making them): formatting a new replica, which catches up from its peers");
                let peers = PartitionPeers {
                    peers: Peers {
                        format_if_missing: true,
                        ..peers.peers
                    },
                    ..peers
                };
                PartitionData::create(dir, ids, options, Some(peers)).map_err(OpenError::from)
            }
            peers => PartitionData::open(dir, ids, doc.purge_target, options, peers),
        };
        match opened {
            Ok(data) => PartitionState::Serving(Box::new(data)),
            Err(error) => {
                tracing::error!(
                    partition_dir = %dir.display(),
                    %error,
                    "partition refused: it will not serve reads or writes; its files are left untouched"
                );
                PartitionState::Refused {
                    reason: error.to_string(),
                }
            }
        }
    }

    /// Create the files of a new partition. An orphan directory left by an interrupted
    /// create (never named by metadata, never acknowledged) is cleared first.
    fn create(
        dir: PathBuf,
        doc: PartitionDoc,
        ids: PartitionIds,
        options: JournalOptions,
        writers: &WriterContext,
        seat: Option<&ClusterSeat>,
    ) -> Result<Partition, CatalogError> {
        if dir.exists() {
            tracing::warn!(partition_dir = %dir.display(), "removing orphan partition directory left by an interrupted create");
            remove_dir(&dir)?;
        }
        let (peers, hosted) = ClusterSeat::host_on(seat, ids, doc, true);
        let data = match PartitionData::create(&dir, ids, options, peers) {
            Ok(data) => data,
            Err(error) => {
                if let Some(hosted) = &hosted {
                    hosted.replicas.remove_group(hosted.group);
                }
                return Err(CatalogError::Partition(error));
            }
        };
        let state = PartitionState::Serving(Box::new(data));
        Ok(Partition::assemble(dir, doc, state, writers, hosted))
    }

    /// Mark deleted (late writers see it) and remove the files.
    fn destroy(&self) -> Result<(), StorageError> {
        if let Some(hosted) = &self.hosted {
            hosted.replicas.remove_group(hosted.group);
        }
        let mut state = lock(&self.state);
        *state = PartitionState::Deleted;
        drop(state);
        remove_dir(&self.dir)
    }
}

impl Topic<'_> {
    pub fn partitions_count(&self) -> u32 {
        self.partitions.len() as u32
    }
}

impl TopicRuntime {
    /// The run-time parts of a topic created at `created_at_us`, with no partitions yet.
    fn new(created_at_us: u64) -> TopicRuntime {
        TopicRuntime {
            created_at_us,
            ..TopicRuntime::default()
        }
    }

    /// Bump every group's generation (the partition count changed: assignments change).
    fn bump_generations(&self) {
        for membership in lock(&self.members).values_mut() {
            membership.generation += 1;
        }
    }
}

/// The partitions whose files were created for an op that is not durable yet.
struct Staged {
    stream_id: u32,
    topic_id: u32,
    partitions: Vec<Arc<Partition>>,
}

impl Catalog {
    /// Load the catalog from `data_dir` (or start empty), opening every partition.
    /// The flag is true when no metadata existed (first start).
    ///
    /// With a `seat` (a node of a cluster of several), the metadata group and every
    /// partition are this node's replicas of the cluster's groups: they come up as their
    /// files say and reach a view with their peers; the catalog follows what the metadata
    /// group applies ([`Catalog::reconcile`]).
    pub fn load(
        data_dir: &Path,
        segment_size_bytes: u64,
        relaxed: bool,
        writers: WriterContext,
        seat: Option<ClusterSeat>,
    ) -> Result<(Catalog, bool), CatalogError> {
        std::fs::create_dir_all(data_dir).map_err(|source| StorageError::Io {
            path: data_dir.to_path_buf(),
            source,
        })?;
        let group_dir = metadata_group_dir(data_dir);
        let (group, first_start, pending) = match &seat {
            None => {
                let mut group = LocalGroup::open(&group_dir, METADATA_GROUP, MetadataMachine::default)
                    .map_err(CatalogError::Group)?;
                let legacy = migrate_document(data_dir, &mut group)?;
                let first_start = !legacy && group.commit_op() == 0;
                (group, first_start, None)
            }
            Some(seat) => {
                // A cluster's nodes never held a single node's data (`membership.rs`): there
                // is no metadata document to migrate.
                let pending = Arc::new(Pending::default());
                let inbox = seat.replicas.add_group(METADATA_GROUP, pending.clone());
                let group = LocalGroup::open_with_peers(
                    &group_dir,
                    METADATA_GROUP,
                    &(MetadataMachine::body_verifies as BodyRule),
                    MetadataMachine::default,
                    Some(seat.peers(inbox, seat.forming, Arc::default())),
                )
                .map_err(CatalogError::Group)?;
                let first_start = group.commit_op() == 0;
                (group, first_start, Some(pending))
            }
        };
        let meta = &group.state_machine().state;
        let mut runtime = BTreeMap::new();
        // Every partition the metadata names, in (stream, topic, partition) order.
        let mut to_open: Vec<ToOpen> = Vec::new();
        for stream in meta.streams.values() {
            for topic in stream.topics.values() {
                let options = JournalOptions {
                    segment_size_bytes: topic_segment_size(segment_size_bytes, topic),
                    relaxed,
                };
                for p in &topic.partitions {
                    let ids = PartitionIds {
                        stream_id: stream.id,
                        topic_id: topic.id,
                        partition_id: p.id,
                    };
                    let dir = replica_dir(data_dir, seat.as_ref(), ids, p);
                    let (peers, hosted) = ClusterSeat::host_on(seat.as_ref(), ids, *p, false);
                    to_open.push(ToOpen {
                        dir,
                        ids,
                        doc: *p,
                        options,
                        peers,
                        hosted,
                    });
                }
                runtime.insert((stream.id, topic.id), TopicRuntime::new(topic.created_at_us));
            }
        }
        // Recovery reads and verifies each partition's log: spread over the cores.
        let states = open_all(&to_open);
        for (opened, state) in to_open.into_iter().zip(states) {
            let ids = opened.ids;
            let partition = Arc::new(Partition::assemble(
                opened.dir,
                opened.doc,
                state,
                &writers,
                opened.hosted,
            ));
            if let Some(topic) = runtime.get_mut(&(ids.stream_id, ids.topic_id)) {
                topic.partitions.push(partition);
            }
        }
        let reflected_op = group.commit_op();
        let catalog = Catalog {
            data_dir: data_dir.to_path_buf(),
            segment_size_bytes,
            relaxed,
            writers,
            group,
            runtime,
            seat,
            reflected_op,
            pending,
            staged_unknown: Vec::new(),
            unknown_changes: BTreeMap::new(),
            offsets_of_deleted_groups: Vec::new(),
        };
        // With peers the metadata comes up at its checkpoint, possibly below ops this node
        // applied before it stopped: a directory it does not name yet may be a partition it
        // replicated, so only streams and topics whose delete is certain go (ids are never
        // reused); deletes remove what they delete.
        match &catalog.seat {
            None => catalog.remove_orphans()?,
            Some(_) => {
                let meta = catalog.meta().clone();
                catalog.remove_deleted_dirs(&meta);
            }
        }
        Ok((catalog, first_start))
    }

    /// Share the catalog: with peers, the node's workers serve the metadata group (its
    /// peers' messages and ticks) through it from now on.
    pub fn share(catalog: Catalog) -> Arc<RwLock<Catalog>> {
        let pending = catalog.pending.clone();
        let shared = Arc::new(RwLock::new(catalog));
        if let Some(pending) = pending {
            let served: Weak<dyn Served> = Arc::downgrade(&shared) as Weak<RwLock<Catalog>>;
            pending.set(served);
        }
        shared
    }

    /// Serve the metadata group's peers' messages and tick it (a worker of the node), then
    /// follow what it applied.
    fn serve_peers(&mut self) {
        if self.group.stopped_reason().is_some() {
            return;
        }
        keep_serving(self.seat.as_ref(), &mut self.group);
        self.reconcile();
    }

    /// The replica index of the metadata group's primary as this node sees it (`None`
    /// during a view change); a node of one is always its own.
    pub fn metadata_primary(&self) -> Option<u8> {
        match &self.seat {
            None => Some(0),
            Some(_) => self.group.primary(),
        }
    }

    /// Whether the metadata this node holds is the cluster's: always for a node of one; with
    /// peers, once its replica is in a view and applied everything that view committed (a
    /// restarted node recovers from its checkpoint and learns the commit point from its
    /// peers, so until then it may lack users, streams or topics the cluster has).
    pub fn metadata_current(&self) -> bool {
        self.seat.is_none() || self.group.is_current()
    }

    /// With peers: remove the directories of streams and topics the metadata deleted while
    /// this node did not follow (it was down, or behind). Ids are never reused, so a
    /// directory whose id lies below the next id the metadata hands out, and which the
    /// metadata does not name, belongs to a deleted stream or topic. One at or above it may
    /// belong to a create this node's metadata has not reached yet (it may have replicated
    /// its partitions before a restart), and stays.
    fn remove_deleted_dirs(&self, meta: &Metadata) {
        let Ok(streams) = read_numeric_dirs(&self.data_dir.join("streams")) else {
            return;
        };
        for (stream_id, stream_dir) in streams {
            let Some(stream) = meta.streams.get(&stream_id) else {
                if stream_id < meta.next_stream_id {
                    tracing::info!(dir = %stream_dir.display(), "removing the files of a stream deleted while this node did not follow");
                    remove_dir_logged(&stream_dir);
                }
                continue;
            };
            let Ok(topics) = read_numeric_dirs(&stream_dir.join("topics")) else {
                continue;
            };
            for (topic_id, topic_dir) in topics {
                if topic_id < stream.next_topic_id && !stream.topics.contains_key(&topic_id) {
                    tracing::info!(dir = %topic_dir.display(), "removing the files of a topic deleted while this node did not follow");
                    remove_dir_logged(&topic_dir);
                }
            }
        }
    }

    /// How the catalog's groups reach their peers, in a cluster of several nodes.
    pub fn seat(&self) -> Option<&ClusterSeat> {
        self.seat.as_ref()
    }

    /// With peers: make the run-time parts follow the committed metadata, after this node's
    /// replica applied ops the catalog did not make (as a backup, or committed from an
    /// earlier primary). Topics and partitions the metadata no longer names (or names as
    /// created anew) go with their files, since their delete is committed; those it names and
    /// the catalog lacks are opened: from their files when this node has them (it may have
    /// replicated them before a restart brought its metadata back below their create), else
    /// as new replicas, which catch up from their peers. A caller that takes partition locks
    /// across a commit (a purge) calls it first, so no delete is reflected, and no partition
    /// lock taken, while it holds some.
    pub fn reconcile(&mut self) {
        let caught_up = self.group.is_current();
        self.reconcile_pass();
        if caught_up {
            self.finish_rejoin();
        }
    }

    /// A node rejoining after losing its data has rejoined once its metadata replica caught
    /// up with its peers, a pass of [`Catalog::reconcile`] over that metadata gave every
    /// partition a replica here, and each of those is in a view and caught up too (until
    /// then a wiped replica cannot stand in for a peer that fails): the record notes it, and
    /// groups new to this node are formatted as new replicas again.
    fn finish_rejoin(&self) {
        let Some(seat) = &self.seat else {
            return;
        };
        if !seat.rejoining.load(Ordering::Acquire) {
            return;
        }
        let partitions_current = self
            .runtime
            .values()
            .flat_map(|runtime| runtime.partitions.iter())
            .all(|partition| match partition.state.try_lock() {
                Ok(state) => matches!(&*state, PartitionState::Serving(data) if data.is_current()),
                Err(_) => false,
            });
        if !partitions_current {
            return;
        }
        match crate::membership::note_rejoined(&self.data_dir) {
            Ok(()) => {
                seat.rejoining.store(false, Ordering::Release);
                seat.holds_data.store(true, Ordering::Release);
                tracing::info!(
                    applied_op = self.group.commit_op(),
                    "this node has rejoined the cluster: its metadata and every partition's replica caught up with their peers"
                );
            }
            Err(error) => {
                tracing::error!(%error, "cannot note in the membership record that this node has rejoined; it tries again");
            }
        }
    }

    fn reconcile_pass(&mut self) {
        let Some(seat) = self.seat.clone() else {
            return;
        };
        if self.group.commit_op() == self.reflected_op {
            return;
        }
        self.reflected_op = self.group.commit_op();
        let meta = self.meta().clone();
        let topic_of =
            |(stream_id, topic_id): (u32, u32)| meta.streams.get(&stream_id)?.topics.get(&topic_id);
        let gone: Vec<(u32, u32)> = self
            .runtime
            .iter()
            .filter(|(key, runtime)| {
                topic_of(**key).is_none_or(|topic| topic.created_at_us != runtime.created_at_us)
            })
            .map(|(key, _)| *key)
            .collect();
        for key @ (stream_id, topic_id) in gone {
            if let Some(runtime) = self.runtime.remove(&key) {
                destroy_all(&runtime.partitions);
            }
            remove_dir_logged(&topic_dir(&self.data_dir, stream_id, topic_id));
        }
        self.remove_deleted_dirs(&meta);
        for stream in meta.streams.values() {
            for topic in stream.topics.values() {
                let options = JournalOptions {
                    segment_size_bytes: topic_segment_size(self.segment_size_bytes, topic),
                    relaxed: self.relaxed,
                };
                let runtime = self
                    .runtime
                    .entry((stream.id, topic.id))
                    .or_insert_with(|| TopicRuntime::new(topic.created_at_us));
                let kept = runtime
                    .partitions
                    .iter()
                    .zip(&topic.partitions)
                    .take_while(|(partition, doc)| {
                        partition.id == doc.id && partition.created_at_us == doc.created_at_us
                    })
                    .count();
                let mut changed = false;
                if kept < runtime.partitions.len() {
                    let removed: Vec<_> = runtime.partitions.drain(kept..).collect();
                    destroy_all(&removed);
                    changed = true;
                }
                for doc in &topic.partitions[kept..] {
                    let ids = PartitionIds {
                        stream_id: stream.id,
                        topic_id: topic.id,
                        partition_id: doc.id,
                    };
                    let dir = replica_dir(&self.data_dir, Some(&seat), ids, doc);
                    if let Some(adopted) = take_staged(&mut self.staged_unknown, ids, doc) {
                        runtime.partitions.push(adopted);
                        changed = true;
                        continue;
                    }
                    let partition = if dir.exists() || seat.rejoining.load(Ordering::Acquire) {
                        // Replicated here before a restart brought the metadata back below
                        // its create: its files are this replica. On a node that rejoins
                        // after losing its data, a missing one is a wiped replica.
                        let (peers, hosted) = seat.host(ids, *doc, false);
                        let state = Partition::open_state(&dir, ids, *doc, options, Some(peers));
                        Partition::assemble(dir, *doc, state, &self.writers, Some(hosted))
                    } else {
                        match Partition::create(dir.clone(), *doc, ids, options, &self.writers, Some(&seat)) {
                            Ok(partition) => partition,
                            Err(error) => {
                                tracing::error!(partition_dir = %dir.display(), %error, "cannot create this node's replica of a new partition: it is refused on this node, which takes no part in its group (the other nodes go on with it); what was written of it is left as it is");
                                let state = PartitionState::Refused {
                                    reason: error.to_string(),
                                };
                                Partition::assemble(dir, *doc, state, &self.writers, None)
                            }
                        }
                    };
                    runtime.partitions.push(Arc::new(partition));
                    changed = true;
                    keep_serving(Some(&seat), &mut self.group);
                }
                if changed {
                    runtime.bump_generations();
                }
            }
        }
    }

    /// Remove stream/topic/partition directories that metadata no longer names (a delete
    /// interrupted after its metadata was saved). Deleted data must never come back.
    fn remove_orphans(&self) -> Result<(), StorageError> {
        let streams_dir = self.data_dir.join("streams");
        for stream_entry in read_numeric_dirs(&streams_dir)? {
            let Some(stream) = self.meta().streams.get(&stream_entry.0) else {
                tracing::warn!(dir = %stream_entry.1.display(), "removing directory of a deleted stream");
                remove_dir(&stream_entry.1)?;
                continue;
            };
            for topic_entry in read_numeric_dirs(&stream_entry.1.join("topics"))? {
                let Some(topic) = stream.topics.get(&topic_entry.0) else {
                    tracing::warn!(dir = %topic_entry.1.display(), "removing directory of a deleted topic");
                    remove_dir(&topic_entry.1)?;
                    continue;
                };
                for partition_entry in read_numeric_dirs(&topic_entry.1.join("partitions"))? {
                    if partition_entry.0 >= topic.partitions_count() {
                        tracing::warn!(dir = %partition_entry.1.display(), "removing directory of a deleted partition");
                        remove_dir(&partition_entry.1)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// The committed metadata.
    pub fn meta(&self) -> &Metadata {
        &self.group.state_machine().state
    }

    /// Apply a metadata op through the replicated metadata log: decide it on a copy of the
    /// state (a refusal goes no further), create what must exist before it is durable (new
    /// partitions' files, not serving yet), replicate it (durable in the log, then applied by
    /// the group's state machine), and only then finish its effects (new partitions serve,
    /// deleted ones' files go). `Err(status)`: refused or not durable, and nothing of it is
    /// visible.
    ///
    /// With peers, only the metadata group's primary takes the op (`Err(58)` elsewhere:
    /// nothing of it was kept, and the client may send it again to the primary); ops the
    /// group commits meanwhile from an earlier primary are reflected first.
    pub fn commit(&mut self, op: &MetadataOp) -> Result<Applied, u32> {
        if self.seat.is_some() {
            if let Some(replayed) = self.replayed_change(op) {
                return replayed;
            }
            // Decided on the whole committed state: a new primary first commits what earlier
            // views prepared (the catalog reflects it, below), so no op applies before this
            // one, and a directory this op would create that exists holds nothing committed.
            if !self.group.is_caught_up() {
                return Err(codes::TRANSIENT_NOT_ACCEPTED);
            }
            self.reconcile();
            // Ops whose outcome was unknown and that this view's log does not hold never
            // commit now: their new partitions go.
            for created in std::mem::take(&mut self.staged_unknown) {
                destroy_all(&created.partitions);
            }
        }
        let reflected_before = self.group.commit_op();
        let mut next = self.meta().clone();
        let applied = next.apply(op)?;
        let staged = match self.stage(&next, &applied.effects) {
            Ok(staged) => staged,
            Err(error) => {
                tracing::error!(%error, op = ?op_name(op), "creating files for a metadata change failed: the change is refused and nothing of it was kept");
                return Err(codes::ERROR);
            }
        };
        let replicated = match self.group.submit(OPERATION_METADATA, &op.encode()) {
            Ok(bytes) => MetadataMachine::decode_reply(&bytes),
            Err(error @ GroupError::TooLarge { .. }) => {
                tracing::warn!(%error, op = ?op_name(op), "metadata change refused: too large for one entry of the metadata log; nothing of it was kept");
                self.unstage(&applied.effects, staged);
                return Err(codes::INVALID_FORMAT);
            }
            Err(error @ GroupError::NotTaken { .. }) => {
                // With peers: this node's replica is not the metadata group's primary (any
                // more); the client may send the change again to the one that is.
                tracing::debug!(%error, op = ?op_name(op), "metadata change not taken by the metadata log; nothing of it was kept");
                self.unstage(&applied.effects, staged);
                return Err(codes::TRANSIENT_NOT_ACCEPTED);
            }
            Err(error @ GroupError::OutcomeUnknown { .. }) => {
                // The op may still commit (in another view, with this node's staged replicas
                // taking part): they stay, adopted when it applies (`reconcile`), removed
                // once a caught-up primary's log shows it never will.
                self.staged_unknown.extend(staged);
                let ticket = self.group.take_unknown_tickets().pop();
                let (Some(client_request), Some(ticket)) = (client_request(), ticket) else {
                    tracing::warn!(%error, op = ?op_name(op), "metadata change got no reply from a quorum in time: it may or may not be applied; answered with an error");
                    return Err(codes::ERROR);
                };
                tracing::warn!(%error, op = ?op_name(op), "metadata change got no reply from a quorum in time: it may or may not be applied; answered 57 (the client sends the same request again, and is answered with the change's outcome once it is known, never applying it twice)");
                let now = std::time::Instant::now();
                self.unknown_changes
                    .retain(|_, (_, answered)| now.duration_since(*answered) < UNKNOWN_CHANGE_KEPT);
                while self.unknown_changes.len() >= UNKNOWN_CHANGES_MAX {
                    let oldest = self
                        .unknown_changes
                        .iter()
                        .min_by_key(|(_, (_, answered))| *answered)
                        .map(|(key, _)| *key);
                    if let Some(oldest) = oldest {
                        self.unknown_changes.remove(&oldest);
                    }
                }
                self.unknown_changes.insert(client_request, (ticket, now));
                return Err(codes::TRANSIENT_NOT_COMMITTED);
            }
            Err(error) => {
                // New partitions' files stay: if the entry did reach the disk, the next start
                // applies it and they are its partitions; if not, they are orphans it removes.
                tracing::error!(
                    %error,
                    op = ?op_name(op),
                    "writing the metadata log failed: the change is not applied, and metadata changes are refused until \
                     the server restarts; after the restart the change is there only if its entry reached the disk"
                );
                return Err(codes::ERROR);
            }
        };
        match replicated {
            Ok(Ok(replicated)) if self.seat.is_some() => {
                // With peers the replica may have lost its view while the request waited and
                // applied another primary's ops before this one (the op then applied to a
                // later state than the copy's). What is not this op's own effect, the
                // node's workers reflect (`reconcile`); nothing here takes partition locks
                // but this op's own effects, since the caller may hold some (a purge).
                if replicated == applied {
                    self.finish(&replicated.effects, staged);
                    if self.group.commit_op() == reflected_before + 1 && self.reflected_op == reflected_before
                    {
                        self.reflected_op = self.group.commit_op();
                    }
                } else {
                    self.unstage(&applied.effects, staged);
                }
                Ok(replicated)
            }
            Ok(Err(status)) if self.seat.is_some() => {
                // Refused by the state it applied to (another primary's ops came first).
                self.unstage(&applied.effects, staged);
                Err(status)
            }
            Ok(Ok(replicated)) => {
                debug_assert_eq!(replicated, applied, "the group applied the op as the copy did");
                debug_assert!(*self.meta() == next, "the group's state is the copy's");
                self.finish(&replicated.effects, staged);
                Ok(replicated)
            }
            Ok(Err(status)) => {
                // The same state refused what the copy accepted: apply is not deterministic.
                tracing::error!(status, op = ?op_name(op), "the metadata log refused a change its copy accepted (a bug); nothing of it was applied");
                debug_assert!(false, "the metadata group refused an op the copy applied");
                self.unstage(&applied.effects, staged);
                Err(status)
            }
            Err(error) => {
                tracing::error!(%error, op = ?op_name(op), "the metadata log's reply does not decode (a bug); the change is applied");
                debug_assert!(false, "undecodable metadata reply");
                self.finish(&applied.effects, staged);
                Ok(applied)
            }
        }
    }

    /// The SDK's replay of a metadata change answered 57 ([`handling_client_request`]):
    /// answered from the change's fate (its outcome once applied; 57 again while unknown),
    /// or `None` to apply it now (it was dropped and never applies, or it is no replay).
    fn replayed_change(&mut self, op: &MetadataOp) -> Option<Result<Applied, u32>> {
        let outcome = self.replay_fate()?;
        if outcome.is_none() {
            tracing::info!(op = ?op_name(op), "a metadata change answered 57 was never applied (a view change dropped it): the client's replay applies it now");
        }
        outcome
    }

    /// Whether the request this thread handles replays a change answered 57.
    pub fn awaits_replay(&self) -> bool {
        client_request().is_some_and(|client_request| self.unknown_changes.contains_key(&client_request))
    }

    /// After a handler refused the SDK's replay of a change answered 57 before reaching
    /// [`Catalog::commit`] (a lookup its own effect broke): the change's outcome once it
    /// applied (`Ok` for a success), 57 while unknown, `None` when there is no such change
    /// or it never applied (the refusal stands).
    pub fn settle_replayed_change(&mut self) -> Option<Result<(), u32>> {
        self.replay_fate()?.map(|outcome| outcome.map(|_| ()))
    }

    /// The fate of the change answered 57 that this thread's request replays: `None` when
    /// it replays none; `Some(None)` when it was dropped (forgotten: the replay is a new
    /// request now); its outcome once applied (forgotten too, its effects reflected as those
    /// of any op this node did not wait for); 57 while unknown.
    fn replay_fate(&mut self) -> Option<Option<Result<Applied, u32>>> {
        let client_request = client_request()?;
        let (ticket, _) = self.unknown_changes.get(&client_request)?;
        match self.group.fate(ticket) {
            Fate::Unknown => Some(Some(Err(codes::TRANSIENT_NOT_COMMITTED))),
            Fate::Dropped => {
                self.unknown_changes.remove(&client_request);
                Some(None)
            }
            Fate::Applied(reply) => {
                self.unknown_changes.remove(&client_request);
                self.reconcile();
                let outcome = match MetadataMachine::decode_reply(&reply) {
                    Ok(outcome) => outcome,
                    Err(error) => {
                        tracing::error!(%error, "the metadata log's reply to a change answered 57 does not decode (a bug); the change is applied, and its replay answered with an error");
                        Err(codes::ERROR)
                    }
                };
                tracing::info!(
                    refused = outcome.as_ref().err(),
                    "a metadata change answered 57 was applied: the client's replay is answered with its outcome"
                );
                Some(Some(outcome))
            }
        }
    }

    /// The part of an op's effects that comes before it is durable.
    fn stage(&mut self, next: &Metadata, effects: &[Effect]) -> Result<Vec<Staged>, CatalogError> {
        let mut staged: Vec<Staged> = Vec::new();
        for effect in effects {
            let result = match *effect {
                Effect::CreateStream { stream_id } => {
                    clear_orphan(&stream_dir(&self.data_dir, stream_id), "stream")
                        .map(|()| None)
                        .map_err(CatalogError::from)
                }
                Effect::CreateTopic { stream_id, topic_id } => {
                    clear_orphan(&topic_dir(&self.data_dir, stream_id, topic_id), "topic")
                        .map(|()| None)
                        .map_err(CatalogError::from)
                }
                Effect::CreatePartitions {
                    stream_id,
                    topic_id,
                    first,
                    count,
                } => self
                    .create_partitions(next, stream_id, topic_id, first, count)
                    .map(Some),
                _ => Ok(None),
            };
            match result {
                Ok(Some(created)) => staged.push(created),
                Ok(None) => {}
                Err(error) => {
                    for created in staged {
                        destroy_all(&created.partitions);
                    }
                    return Err(error);
                }
            }
        }
        Ok(staged)
    }

    /// Undo [`Catalog::stage`] for an op that did not become durable: its new directories
    /// go (nothing in them was ever acknowledged). What cannot be removed now is an orphan
    /// the next start removes.
    fn unstage(&self, effects: &[Effect], staged: Vec<Staged>) {
        for created in staged {
            destroy_all(&created.partitions);
        }
        for effect in effects {
            match *effect {
                Effect::CreateStream { stream_id } => {
                    remove_dir_logged(&stream_dir(&self.data_dir, stream_id))
                }
                Effect::CreateTopic { stream_id, topic_id } => {
                    remove_dir_logged(&topic_dir(&self.data_dir, stream_id, topic_id))
                }
                _ => {}
            }
        }
    }

    fn create_partitions(
        &mut self,
        next: &Metadata,
        stream_id: u32,
        topic_id: u32,
        first: u32,
        count: u32,
    ) -> Result<Staged, CatalogError> {
        let Some(topic) = next.streams.get(&stream_id).and_then(|s| s.topics.get(&topic_id)) else {
            return Err(CatalogError::Storage(StorageError::Invalid(format!(
                "new partitions of topic {stream_id}/{topic_id}, which the metadata does not hold"
            ))));
        };
        let options = JournalOptions {
            segment_size_bytes: topic_segment_size(self.segment_size_bytes, topic),
            relaxed: self.relaxed,
        };
        let mut partitions = Vec::with_capacity(count as usize);
        for doc in topic.partitions.iter().skip(first as usize).take(count as usize) {
            let ids = PartitionIds {
                stream_id,
                topic_id,
                partition_id: doc.id,
            };
            let dir = replica_dir(&self.data_dir, self.seat.as_ref(), ids, doc);
            match Partition::create(dir, *doc, ids, options, &self.writers, self.seat.as_ref()) {
                Ok(partition) => {
                    partitions.push(Arc::new(partition));
                    keep_serving(self.seat.as_ref(), &mut self.group);
                }
                Err(error) => {
                    destroy_all(&partitions);
                    return Err(error);
                }
            }
        }
        debug_assert_eq!(partitions.len(), count as usize);
        Ok(Staged {
            stream_id,
            topic_id,
            partitions,
        })
    }

    /// The part of an op's effects after it is durable. A file that cannot be removed is
    /// an orphan that the next start removes (the metadata no longer names it).
    fn finish(&mut self, effects: &[Effect], staged: Vec<Staged>) {
        let mut staged = staged.into_iter();
        for effect in effects {
            match *effect {
                Effect::CreateStream { .. } => {}
                Effect::CreateTopic { stream_id, topic_id } => {
                    let created_at_us = self
                        .meta()
                        .streams
                        .get(&stream_id)
                        .and_then(|stream| stream.topics.get(&topic_id))
                        .map_or(0, |topic| topic.created_at_us);
                    self.runtime
                        .insert((stream_id, topic_id), TopicRuntime::new(created_at_us));
                }
                Effect::CreatePartitions {
                    stream_id, topic_id, ..
                } => {
                    let Some(created) = staged.next() else {
                        debug_assert!(false, "every partition creation was staged");
                        continue;
                    };
                    debug_assert_eq!((created.stream_id, created.topic_id), (stream_id, topic_id));
                    let runtime = self.runtime.entry((stream_id, topic_id)).or_default();
                    runtime.partitions.extend(created.partitions);
                    runtime.bump_generations();
                }
                Effect::DeletePartitions {
                    stream_id,
                    topic_id,
                    first,
                } => {
                    if let Some(runtime) = self.runtime.get_mut(&(stream_id, topic_id)) {
                        let removed: Vec<_> = runtime.partitions.drain(first as usize..).collect();
                        runtime.bump_generations();
                        destroy_all(&removed);
                    }
                }
                Effect::DeleteTopic { stream_id, topic_id } => {
                    if let Some(runtime) = self.runtime.remove(&(stream_id, topic_id)) {
                        destroy_all(&runtime.partitions);
                    }
                    remove_dir_logged(&topic_dir(&self.data_dir, stream_id, topic_id));
                }
                Effect::DeleteStream { stream_id } => {
                    let keys: Vec<_> = self
                        .runtime
                        .range((stream_id, 0)..=(stream_id, u32::MAX))
                        .map(|(key, _)| *key)
                        .collect();
                    for key in keys {
                        if let Some(runtime) = self.runtime.remove(&key) {
                            destroy_all(&runtime.partitions);
                        }
                    }
                    remove_dir_logged(&stream_dir(&self.data_dir, stream_id));
                }
                Effect::DeleteGroup {
                    stream_id,
                    topic_id,
                    group_id,
                } => {
                    let Some(runtime) = self.runtime.get(&(stream_id, topic_id)) else {
                        continue;
                    };
                    lock(&runtime.members).remove(&group_id);
                    // Deleting an offset is a partition op that waits for its quorum: done
                    // once the catalog's lock is released (`delete_group_offsets`), never
                    // under it.
                    self.offsets_of_deleted_groups.extend(
                        runtime
                            .partitions
                            .iter()
                            .map(|partition| (partition.clone(), group_id)),
                    );
                }
            }
        }
        debug_assert!(staged.next().is_none(), "every staged partition was published");
    }

    /// The stored offsets of consumer groups deleted since the last call, for
    /// [`delete_group_offsets`] once the catalog's lock is released.
    pub fn take_offsets_of_deleted_groups(&mut self) -> Vec<(Arc<Partition>, u32)> {
        std::mem::take(&mut self.offsets_of_deleted_groups)
    }

    // ---- lookups ----

    /// The topic `(stream_id, topic_id)` with its run-time parts.
    pub fn topic(&self, stream_id: u32, topic_id: u32) -> Option<Topic<'_>> {
        let doc = self.meta().streams.get(&stream_id)?.topics.get(&topic_id)?;
        self.topic_of(stream_id, doc)
    }

    fn topic_of<'a>(&'a self, stream_id: u32, doc: &'a TopicDoc) -> Option<Topic<'a>> {
        let runtime = self.runtime.get(&(stream_id, doc.id));
        // With peers the metadata replica may have applied a create the catalog follows at
        // its next reconcile; until then the topic is not found here.
        debug_assert!(
            runtime.is_some() || self.seat.is_some(),
            "every committed topic has its run-time parts"
        );
        let runtime = runtime?;
        Some(Topic {
            stream_id,
            doc,
            partitions: &runtime.partitions,
            balanced_cursor: &runtime.balanced_cursor,
            members: &runtime.members,
        })
    }

    /// The topic an identifier names in `stream`.
    pub fn find_topic<'a>(&'a self, stream: &'a Stream, id: &Identifier) -> Result<Topic<'a>, u32> {
        let doc = stream.find_topic(id)?;
        self.topic_of(stream.id, doc).ok_or(codes::TOPIC_ID_NOT_FOUND)
    }

    /// Every topic of `stream`, in id order.
    pub fn topics_of<'a>(&'a self, stream: &'a Stream) -> impl Iterator<Item = Topic<'a>> + 'a {
        stream
            .topics
            .values()
            .filter_map(move |doc| self.topic_of(stream.id, doc))
    }

    /// Every topic, in (stream, topic) order.
    pub fn all_topics(&self) -> impl Iterator<Item = Topic<'_>> + '_ {
        self.meta()
            .streams
            .values()
            .flat_map(|stream| self.topics_of(stream))
    }
}

/// With peers: deliver the metadata group's messages and tick it, and note whether this
/// node leads. The workers do it (`serve_peers`, which then reconciles), and so does a long
/// partition creation under the catalog's lock between partitions (each is formatted with
/// its barriers), so a primary goes on heartbeating and its backups do not start a view
/// change meanwhile; what that applies is reconciled by the next `serve_peers`.
fn keep_serving(seat: Option<&ClusterSeat>, group: &mut LocalGroup<MetadataMachine>) {
    let Some(seat) = seat else {
        return;
    };
    if group.stopped_reason().is_some() {
        return;
    }
    if let Err(error) = group.serve_inbox() {
        tracing::error!(%error, "the metadata group's replica stopped while serving its peers' messages; metadata changes are refused until a restart");
    }
    seat.leads_metadata
        .store(group.takes_requests(), Ordering::Release);
}

/// The metadata group of a node of a cluster: served by a worker when no request holds the
/// catalog (a request holding it takes the group's inbox itself while it waits).
impl Served for RwLock<Catalog> {
    fn serve(&self) {
        if let Ok(mut catalog) = self.try_write() {
            catalog.serve_peers();
        }
    }
}

/// Every group's replica on this node, for `cairn status`: the metadata group, then each
/// partition (`stream/topic/partition`) in catalog order. A partition whose lock a request
/// holds (it waits for a quorum) is reported without positions rather than waited for.
pub fn replica_statuses(catalog: &RwLock<Catalog>) -> Vec<(String, Option<crate::node::ReplicaStatus>)> {
    let (metadata, partitions) = {
        // Not waited for: a metadata change holds the lock while it waits for a quorum, and
        // that is when an operator asks.
        let catalog = match catalog.try_read() {
            Ok(guard) => guard,
            Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return vec![("metadata".to_string(), None)],
        };
        let partitions: Vec<(String, Arc<Partition>)> = catalog
            .all_topics()
            .flat_map(|topic| {
                topic.partitions.iter().map(move |partition| {
                    (
                        format!("{}/{}/{}", topic.stream_id, topic.doc.id, partition.id),
                        partition.clone(),
                    )
                })
            })
            .collect();
        (catalog.group.replica_status(), partitions)
    };
    let mut statuses = vec![("metadata".to_string(), Some(metadata))];
    for (name, partition) in partitions {
        let status = match partition.state.try_lock() {
            Ok(state) => match &*state {
                PartitionState::Serving(data) => Some(data.replica_status()),
                _ => None,
            },
            Err(_) => None,
        };
        statuses.push((name, status));
    }
    statuses
}

/// Every partition of the catalog now, in (stream, topic, partition) order, for a pass over
/// them that takes each one's own lock (the catalog's is held only to list them).
pub fn all_partitions(catalog: &RwLock<Catalog>) -> Vec<Arc<Partition>> {
    let catalog = match catalog.read() {
        Ok(guard) => guard,
        Err(poisoned) => panic!("catalog lock poisoned by an earlier panic: {poisoned}"),
    };
    catalog
        .all_topics()
        .flat_map(|topic| topic.partitions.iter().cloned())
        .collect()
}

/// Where partition `ids` (created as `doc` says) keeps its files: `partitions/<id>`, and in a
/// cluster of several nodes `partitions/<id>-<created_at_us>`, so a partition deleted and
/// created again with the same id never shares a directory with its earlier incarnation (a
/// node that restarts below the delete must neither take one's files for the other's nor
/// remove the later one's when it replays the delete).
fn replica_dir(
    data_dir: &Path,
    seat: Option<&ClusterSeat>,
    ids: PartitionIds,
    doc: &PartitionDoc,
) -> PathBuf {
    let dir = partition_dir(data_dir, ids.stream_id, ids.topic_id, ids.partition_id);
    match seat {
        None => dir,
        Some(_) => dir.with_file_name(format!("{}-{}", ids.partition_id, doc.created_at_us)),
    }
}

/// The partition staged for `ids` created as `doc`, taken out of `staged`, if there is one.
fn take_staged(staged: &mut Vec<Staged>, ids: PartitionIds, doc: &PartitionDoc) -> Option<Arc<Partition>> {
    for created in staged.iter_mut() {
        if (created.stream_id, created.topic_id) != (ids.stream_id, ids.topic_id) {
            continue;
        }
        if let Some(position) = created
            .partitions
            .iter()
            .position(|partition| partition.id == doc.id && partition.created_at_us == doc.created_at_us)
        {
            let partition = created.partitions.remove(position);
            staged.retain(|created| !created.partitions.is_empty());
            return Some(partition);
        }
    }
    None
}

/// A partition to open at boot.
struct ToOpen {
    dir: PathBuf,
    ids: PartitionIds,
    doc: PartitionDoc,
    options: JournalOptions,
    peers: Option<PartitionPeers>,
    hosted: Option<Hosted>,
}

/// [`Partition::open_state`] of every partition in `to_open`, on up to as many threads as
/// there are cores; the states in the same order.
fn open_all(to_open: &[ToOpen]) -> Vec<PartitionState> {
    let threads = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .clamp(1, 8)
        .min(to_open.len().max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let opened: Mutex<Vec<Option<PartitionState>>> = Mutex::new((0..to_open.len()).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                loop {
                    let index = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(opening) = to_open.get(index) else {
                        break;
                    };
                    let state = Partition::open_state(
                        &opening.dir,
                        opening.ids,
                        opening.doc,
                        opening.options,
                        opening.peers.clone(),
                    );
                    lock(&opened)[index] = Some(state);
                }
            });
        }
    });
    let opened = match opened.into_inner() {
        Ok(opened) => opened,
        Err(poisoned) => panic!("a partition open panicked: {poisoned}"),
    };
    opened
        .into_iter()
        .map(|state| state.expect("every partition was opened by a worker"))
        .collect()
}

/// The segment size of a topic's partitions: the topic's own when it has one, else the
/// server's.
fn topic_segment_size(server: u64, topic: &TopicDoc) -> u64 {
    match topic.segment_size_bytes {
        0 => server,
        segment_size_bytes => segment_size_bytes,
    }
}

fn destroy_all(partitions: &[Arc<Partition>]) {
    for partition in partitions {
        match partition.destroy() {
            Ok(()) => {}
            // With peers a start removes no partition directory (the metadata comes up
            // below ops this node applied, so it cannot tell a deleted one).
            Err(error) if partition.hosted.is_some() => {
                tracing::warn!(%error, partition_dir = %partition.dir.display(), "cannot remove a deleted partition's files; they stay until removed by hand (the partition is deleted)")
            }
            Err(error) => {
                tracing::warn!(%error, partition_dir = %partition.dir.display(), "cannot remove a deleted partition's files; they are removed at the next start")
            }
        }
    }
}

fn remove_dir_logged(dir: &Path) {
    if let Err(error) = remove_dir(dir) {
        tracing::warn!(%error, dir = %dir.display(), "cannot remove a deleted directory; it is removed at the next start");
    }
}

/// Remove a directory left by an interrupted create of the same id (never acknowledged).
fn clear_orphan(dir: &Path, what: &str) -> Result<(), StorageError> {
    if dir.exists() {
        tracing::warn!(dir = %dir.display(), "removing orphan {what} directory left by an interrupted create");
        remove_dir(dir)?;
    }
    Ok(())
}

/// The replication group id of the metadata.
pub const METADATA_GROUP: u64 = 0;

/// Where the metadata's replicated log lives.
pub fn metadata_group_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("vsr").join("metadata")
}

/// Where a migrated metadata document is kept (never deleted).
pub fn migrated_document_path(data_dir: &Path) -> PathBuf {
    data_dir.join("metadata.migrated")
}

/// A data directory written before metadata was replicated holds the catalog in the document
/// `<data_dir>/metadata`. Its whole contents become the first op of the new log (`Migrate`);
/// once that is durable the document is renamed to `metadata.migrated` and never read again.
/// A crash before the rename repeats nothing: the log already holds ops, and only the rename
/// is left. Returns whether a document was found.
fn migrate_document(data_dir: &Path, group: &mut LocalGroup<MetadataMachine>) -> Result<bool, CatalogError> {
    let path = metadata_path(data_dir);
    let Some(bytes) = cairn_storage::atomic_file::read(&path)? else {
        return Ok(false);
    };
    let damaged = |reason: String| StorageError::Damaged {
        path: path.clone(),
        position: 0,
        reason,
    };
    let doc = Metadata::restore(&bytes)
        .map_err(|e| damaged(e.to_string()))?
        .to_doc();
    if group.commit_op() == 0 {
        let op = MetadataOp::Migrate { doc };
        let reply = group.submit(OPERATION_METADATA, &op.encode()).map_err(|error| match error {
            GroupError::TooLarge { len, max } => damaged(format!(
                "the metadata document is {len} bytes as one entry of the replicated metadata log, above its {max}-byte \
                 limit: it cannot be migrated by this release; it was left as it is"
            )),
            error => damaged(format!("migrating it into the replicated metadata log failed: {error}; it was left as it is")),
        })?;
        match MetadataMachine::decode_reply(&reply) {
            Ok(Ok(_)) => {}
            Ok(Err(status)) => {
                return Err(damaged(format!(
                    "the metadata log refused it (status {status}); it was left as it is"
                ))
                .into());
            }
            Err(error) => return Err(damaged(format!("{error}; it was left as it is")).into()),
        }
        tracing::info!(
            document = %path.display(),
            log = %metadata_group_dir(data_dir).display(),
            "migrated the metadata document into the replicated metadata log; the document is kept as metadata.migrated"
        );
    } else {
        tracing::warn!(
            document = %path.display(),
            "a metadata document next to a replicated metadata log that already holds ops: left by a migration \
             interrupted before its rename; the log is what counts, the document is kept as metadata.migrated"
        );
    }
    let migrated = migrated_document_path(data_dir);
    std::fs::rename(&path, &migrated).map_err(|source| StorageError::Io {
        path: path.clone(),
        source,
    })?;
    std::fs::File::open(data_dir)
        .and_then(|dir| dir.sync_all())
        .map_err(|source| StorageError::Io {
            path: data_dir.to_path_buf(),
            source,
        })?;
    Ok(true)
}

/// The op's name for logs (not its contents: they may hold password hashes).
fn op_name(op: &MetadataOp) -> &'static str {
    match op {
        MetadataOp::CreateRoot { .. } => "create_root",
        MetadataOp::CreateStream { .. } => "create_stream",
        MetadataOp::UpdateStream { .. } => "update_stream",
        MetadataOp::DeleteStream { .. } => "delete_stream",
        MetadataOp::CreateTopic { .. } => "create_topic",
        MetadataOp::UpdateTopic { .. } => "update_topic",
        MetadataOp::DeleteTopic { .. } => "delete_topic",
        MetadataOp::CreatePartitions { .. } => "create_partitions",
        MetadataOp::DeletePartitions { .. } => "delete_partitions",
        MetadataOp::CreateGroup { .. } => "create_consumer_group",
        MetadataOp::DeleteGroup { .. } => "delete_consumer_group",
        MetadataOp::CreateUser { .. } => "create_user",
        MetadataOp::UpdateUser { .. } => "update_user",
        MetadataOp::DeleteUser { .. } => "delete_user",
        MetadataOp::ChangePassword { .. } => "change_password",
        MetadataOp::UpdatePermissions { .. } => "update_permissions",
        MetadataOp::CreateToken { .. } => "create_personal_access_token",
        MetadataOp::DeleteToken { .. } => "delete_personal_access_token",
        MetadataOp::MarkPurge { .. } => "mark_purge",
        MetadataOp::Migrate { .. } => "migrate",
    }
}

/// Subdirectories of `dir` whose names are decimal ids. A missing `dir` has none.
fn read_numeric_dirs(dir: &Path) -> Result<Vec<(u32, PathBuf)>, StorageError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(StorageError::Io {
                path: dir.to_path_buf(),
                source,
            });
        }
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| StorageError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        if let Some(id) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) {
            found.push((id, entry.path()));
        }
    }
    Ok(found)
}

/// Next round-robin partition for a balanced send resolved by the server.
pub fn next_balanced(topic: &Topic<'_>) -> Option<u32> {
    let count = topic.partitions_count();
    if count == 0 {
        return None;
    }
    Some(topic.balanced_cursor.fetch_add(1, Ordering::Relaxed) % count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assignment_is_round_robin_in_join_order() {
        let mut m = Membership::default();
        assert!(m.join(7));
        assert!(!m.join(7), "joining twice is one membership");
        assert!(m.join(9));
        assert!(m.join(8));
        assert_eq!(m.generation, 3);
        assert_eq!(m.assigned(0, 7), [0, 3, 6]);
        assert_eq!(m.assigned(1, 7), [1, 4]);
        assert_eq!(m.assigned(2, 7), [2, 5]);
        assert_eq!(m.next_partition(1, 7), Some(1));
        assert_eq!(m.next_partition(1, 7), Some(4));
        assert_eq!(m.next_partition(1, 7), Some(1));
        assert!(m.leave(9));
        assert!(!m.leave(9));
        assert_eq!(m.generation, 4);
        assert_eq!(m.assigned(1, 7), [1, 3, 5]);
        assert_eq!(m.next_partition(1, 0), None);
    }
}
