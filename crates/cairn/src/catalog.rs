//! The catalog: streams, topics, partitions, users and tokens, and their persistence.
//!
//! The catalog's metadata (names, ids, settings) lives in one checksummed document,
//! `<data_dir>/metadata`, replaced atomically on every change (`cairn_storage::atomic_file`).
//! Message data lives in the partitions' own directories:
//! `<data_dir>/streams/<stream id>/topics/<topic id>/partitions/<partition id>/`.
//!
//! Ordering rules that keep the two consistent across a crash:
//! - create: partition directories first, metadata second. A crash in between leaves an orphan
//!   directory that no metadata names; the next create of that id clears it (nothing in it was
//!   ever acknowledged).
//! - delete: metadata first, directories second. A crash in between leaves an orphan directory,
//!   removed at boot, so deleted data never comes back.

use crate::auth::{PersonalAccessToken, User};
use crate::writer::{CommitCounters, WriterContext, WriterHandle};
use cairn_storage::StorageError;
use cairn_storage::log::{LogConfig, PartitionLog};
use cairn_storage::offsets::{ConsumerOffsets, OffsetOwner};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

/// Most partitions one topic may have (the SDK's validators use the same bound).
pub const PARTITIONS_PER_TOPIC_MAX: u32 = 1000;

/// Persisted form of the catalog (the `metadata` document).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetadataDoc {
    pub format_version: u32,
    pub next_stream_id: u32,
    pub streams: Vec<StreamDoc>,
    pub next_user_id: u32,
    pub users: Vec<User>,
    pub next_token_id: u64,
    pub tokens: Vec<PersonalAccessToken>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamDoc {
    pub id: u32,
    pub name: String,
    pub created_at_us: u64,
    pub next_topic_id: u32,
    pub topics: Vec<TopicDoc>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicDoc {
    pub id: u32,
    pub name: String,
    pub created_at_us: u64,
    /// µs; 0 = never.
    pub message_expiry_us: u64,
    /// 1 none, 2 gzip (stored as sent; Cairn does not compress).
    pub compression: u8,
    /// 0 = server default, u64::MAX = unlimited.
    pub max_topic_size_bytes: u64,
    /// Partition ids are 0..partitions.len(), in order.
    pub partitions: Vec<PartitionDoc>,
    /// Consumer groups of this topic (membership is run-time only, see [`Topic::members`]).
    /// Absent in metadata written before groups existed.
    #[serde(default)]
    pub consumer_groups: Vec<GroupDoc>,
    /// The id the next consumer group of this topic gets (ids start at 0 per topic).
    #[serde(default)]
    pub next_group_id: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupDoc {
    pub id: u32,
    pub name: String,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartitionDoc {
    pub id: u32,
    pub created_at_us: u64,
    /// The topic-level purge marker: the partition's append counter when the last purge of
    /// its topic or stream was decided (recorded here, durably, before any partition is
    /// purged). Every offset below it is purged: a partition whose retained log starts below
    /// it at boot finishes the purge before serving. 0 = never purged (absent in metadata
    /// written before purge markers existed).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub purge_target: u64,
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

pub const METADATA_FORMAT_VERSION: u32 = 1;

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
}

pub enum PartitionState {
    Serving(Box<PartitionData>),
    /// Open failed (damage or IO): every request to it gets the refusal status; files are
    /// left as they were.
    Refused {
        reason: String,
    },
    /// Deleted or its topic/stream deleted: late holders of the `Arc` must not write.
    Deleted,
    /// The log was closed at a clean stop; nothing may use it any more.
    Closed,
}

pub struct PartitionData {
    pub log: PartitionLog,
    pub offsets: ConsumerOffsets,
}

pub struct Topic {
    pub doc: TopicDoc,
    pub partitions: Vec<Arc<Partition>>,
    /// Round-robin cursor for balanced sends that the server resolves itself.
    pub balanced_cursor: AtomicU32,
    /// Run-time membership of this topic's consumer groups, by group id (never persisted:
    /// membership belongs to client sessions).
    pub members: Mutex<BTreeMap<u32, Membership>>,
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

pub struct Stream {
    pub id: u32,
    pub name: String,
    pub created_at_us: u64,
    pub next_topic_id: u32,
    pub topics: BTreeMap<u32, Topic>,
}

/// The whole catalog. Guarded by one `RwLock` in the server; partitions have their own locks.
pub struct Catalog {
    pub data_dir: PathBuf,
    pub log_config: LogConfig,
    /// Starts each partition's writer when the partition is opened or created.
    pub writers: WriterContext,
    pub next_stream_id: u32,
    pub streams: BTreeMap<u32, Stream>,
    pub next_user_id: u32,
    pub users: Vec<User>,
    pub next_token_id: u64,
    pub tokens: Vec<PersonalAccessToken>,
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

fn offsets_dir(partition_dir: &Path) -> PathBuf {
    partition_dir.join("offsets")
}

/// Errors from catalog changes, mapped to statuses by the handler.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("metadata encoding failed: {0}")]
    Encode(String),
}

impl Partition {
    /// The run-time partition around `state`, with its writer started.
    fn assemble(
        dir: PathBuf,
        doc: PartitionDoc,
        state: PartitionState,
        writers: &WriterContext,
    ) -> Partition {
        let state = Arc::new(Mutex::new(state));
        let counters = Arc::new(CommitCounters::default());
        let writer = writers.spawn(state.clone(), dir.clone(), counters.clone());
        Partition {
            id: doc.id,
            created_at_us: doc.created_at_us,
            dir,
            state,
            writer: Mutex::new(Some(writer)),
            counters,
        }
    }

    /// A sender to this partition's writer queue, or `None` once the writer is closed.
    pub fn writer_queue(&self) -> Option<tokio::sync::mpsc::Sender<crate::writer::PendingSend>> {
        lock(&self.writer).as_ref().map(WriterHandle::queue)
    }

    /// Take the writer handle (clean stop): later sends are refused, queued ones still complete.
    pub fn take_writer(&self) -> Option<WriterHandle> {
        lock(&self.writer).take()
    }

    fn open(dir: PathBuf, doc: PartitionDoc, log_config: LogConfig, writers: &WriterContext) -> Partition {
        let state = match Self::open_data(&dir, doc, log_config) {
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
        };
        Partition::assemble(dir, doc, state, writers)
    }

    fn open_data(
        dir: &Path,
        doc: PartitionDoc,
        log_config: LogConfig,
    ) -> Result<PartitionData, StorageError> {
        let mut log = PartitionLog::open(dir, doc.id, log_config)?;
        let mut offsets = ConsumerOffsets::open(&offsets_dir(dir))?;
        finish_purge(dir, doc.purge_target, &mut log, &mut offsets)?;
        Ok(PartitionData { log, offsets })
    }

    /// Create the files of a new partition. An orphan directory left by an interrupted
    /// create (never named by metadata, never acknowledged) is cleared first.
    fn create(
        dir: PathBuf,
        doc: PartitionDoc,
        log_config: LogConfig,
        writers: &WriterContext,
    ) -> Result<Partition, StorageError> {
        if dir.exists() {
            tracing::warn!(partition_dir = %dir.display(), "removing orphan partition directory left by an interrupted create");
            remove_dir(&dir)?;
        }
        let log = PartitionLog::create(&dir, doc.id, log_config)?;
        let offsets = ConsumerOffsets::open(&offsets_dir(&dir))?;
        let state = PartitionState::Serving(Box::new(PartitionData { log, offsets }));
        Ok(Partition::assemble(dir, doc, state, writers))
    }

    /// Mark deleted (late writers see it) and remove the files.
    fn destroy(&self) -> Result<(), StorageError> {
        let mut state = lock(&self.state);
        *state = PartitionState::Deleted;
        drop(state);
        remove_dir(&self.dir)
    }
}

/// At boot: if the metadata's purge marker says offsets below `purge_target` are purged but
/// the log still starts below it (a purge interrupted before it reached this partition),
/// purge now, before the partition serves: consumer offsets first, then the log.
pub fn finish_purge(
    dir: &Path,
    purge_target: u64,
    log: &mut PartitionLog,
    offsets: &mut ConsumerOffsets,
) -> Result<(), StorageError> {
    if log.start_offset() >= purge_target {
        return Ok(());
    }
    if log.next_offset() < purge_target {
        // The target was this log's append counter, and the counter never goes back (the
        // offset reservation is durable): a log ending below it lost data.
        return Err(StorageError::Damaged {
            path: dir.to_path_buf(),
            position: 0,
            reason: format!(
                "the log ends at offset {}, below the purge target {purge_target} recorded in the metadata (lost data)",
                log.next_offset()
            ),
        });
    }
    tracing::info!(
        partition_dir = %dir.display(),
        retained_start_offset = log.start_offset(),
        purge_target,
        next_offset = log.next_offset(),
        "finishing an interrupted purge recorded in the metadata: purging the partition and its consumer offsets"
    );
    offsets.clear()?;
    log.purge()?;
    debug_assert!(log.start_offset() >= purge_target);
    Ok(())
}

/// Lock a std mutex; a poisoned lock means a writer panicked mid-update, which is a bug:
/// carrying on could publish half-applied state, so the poison propagates as a panic.
pub fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => panic!("partition lock poisoned by an earlier panic: {poisoned}"),
    }
}

fn remove_dir(dir: &Path) -> Result<(), StorageError> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(StorageError::Io {
            path: dir.to_path_buf(),
            source,
        }),
    }
}

impl Topic {
    pub fn partitions_count(&self) -> u32 {
        self.partitions.len() as u32
    }

    /// Bump every group's generation (the partition count changed: assignments change).
    pub fn bump_generations(&self) {
        for membership in lock(&self.members).values_mut() {
            membership.generation += 1;
        }
    }
}

impl Catalog {
    /// Load the catalog from `data_dir` (or start empty), opening every partition.
    /// Returns `Ok(None)` for the metadata when none existed (first start).
    pub fn load(
        data_dir: &Path,
        log_config: LogConfig,
        writers: WriterContext,
    ) -> Result<(Catalog, bool), CatalogError> {
        std::fs::create_dir_all(data_dir).map_err(|source| StorageError::Io {
            path: data_dir.to_path_buf(),
            source,
        })?;
        let (doc, first_start) = match cairn_storage::atomic_file::read(&metadata_path(data_dir))? {
            Some(bytes) => {
                let doc: MetadataDoc = serde_json::from_slice(&bytes).map_err(|e| StorageError::Damaged {
                    path: metadata_path(data_dir),
                    position: e.column() as u64,
                    reason: format!("metadata document does not decode: {e}"),
                })?;
                if doc.format_version != METADATA_FORMAT_VERSION {
                    return Err(StorageError::Damaged {
                        path: metadata_path(data_dir),
                        position: 0,
                        reason: format!("unsupported metadata format version {}", doc.format_version),
                    }
                    .into());
                }
                (doc, false)
            }
            None => (
                MetadataDoc {
                    format_version: METADATA_FORMAT_VERSION,
                    ..MetadataDoc::default()
                },
                true,
            ),
        };
        let mut streams = BTreeMap::new();
        for stream_doc in doc.streams {
            let mut topics = BTreeMap::new();
            for topic_doc in stream_doc.topics {
                let partitions = topic_doc
                    .partitions
                    .iter()
                    .map(|p| {
                        let dir = partition_dir(data_dir, stream_doc.id, topic_doc.id, p.id);
                        Arc::new(Partition::open(dir, *p, log_config, &writers))
                    })
                    .collect();
                topics.insert(
                    topic_doc.id,
                    Topic {
                        doc: topic_doc,
                        partitions,
                        balanced_cursor: AtomicU32::new(0),
                        members: Mutex::new(BTreeMap::new()),
                    },
                );
            }
            streams.insert(
                stream_doc.id,
                Stream {
                    id: stream_doc.id,
                    name: stream_doc.name,
                    created_at_us: stream_doc.created_at_us,
                    next_topic_id: stream_doc.next_topic_id,
                    topics,
                },
            );
        }
        let catalog = Catalog {
            data_dir: data_dir.to_path_buf(),
            log_config,
            writers,
            next_stream_id: doc.next_stream_id,
            streams,
            next_user_id: doc.next_user_id,
            users: doc.users,
            next_token_id: doc.next_token_id,
            tokens: doc.tokens,
        };
        catalog.remove_orphans()?;
        Ok((catalog, first_start))
    }

    /// Remove stream/topic/partition directories that metadata no longer names (a delete
    /// interrupted after its metadata was saved). Deleted data must never come back.
    fn remove_orphans(&self) -> Result<(), StorageError> {
        let streams_dir = self.data_dir.join("streams");
        for stream_entry in read_numeric_dirs(&streams_dir)? {
            let Some(stream) = self.streams.get(&stream_entry.0) else {
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

    fn doc(&self) -> MetadataDoc {
        MetadataDoc {
            format_version: METADATA_FORMAT_VERSION,
            next_stream_id: self.next_stream_id,
            streams: self
                .streams
                .values()
                .map(|s| StreamDoc {
                    id: s.id,
                    name: s.name.clone(),
                    created_at_us: s.created_at_us,
                    next_topic_id: s.next_topic_id,
                    topics: s.topics.values().map(|t| t.doc.clone()).collect(),
                })
                .collect(),
            next_user_id: self.next_user_id,
            users: self.users.clone(),
            next_token_id: self.next_token_id,
            tokens: self.tokens.clone(),
        }
    }

    /// Persist the metadata document atomically.
    pub fn save(&self) -> Result<(), CatalogError> {
        let bytes =
            serde_json::to_vec_pretty(&self.doc()).map_err(|e| CatalogError::Encode(e.to_string()))?;
        cairn_storage::atomic_file::write(&metadata_path(&self.data_dir), &bytes)?;
        Ok(())
    }

    pub fn stream_by_name(&self, name: &str) -> Option<&Stream> {
        self.streams.values().find(|s| s.name == name)
    }

    /// Create a stream; the caller has checked the name is free.
    pub fn create_stream(&mut self, name: String, now_us: u64) -> Result<u32, CatalogError> {
        let id = self.next_stream_id;
        debug_assert!(!self.streams.contains_key(&id));
        let dir = stream_dir(&self.data_dir, id);
        if dir.exists() {
            tracing::warn!(dir = %dir.display(), "removing orphan stream directory left by an interrupted create");
            remove_dir(&dir)?;
        }
        self.next_stream_id += 1;
        self.streams.insert(
            id,
            Stream {
                id,
                name,
                created_at_us: now_us,
                next_topic_id: 0,
                topics: BTreeMap::new(),
            },
        );
        self.save()?;
        Ok(id)
    }

    /// Delete a stream with all its topics: metadata first, then files.
    pub fn delete_stream(&mut self, stream_id: u32) -> Result<(), CatalogError> {
        let Some(stream) = self.streams.remove(&stream_id) else {
            return Ok(());
        };
        self.save()?;
        for topic in stream.topics.values() {
            for partition in &topic.partitions {
                partition.destroy()?;
            }
        }
        remove_dir(&stream_dir(&self.data_dir, stream_id))?;
        Ok(())
    }

    /// Create a topic with `partitions_count` partitions: files first, then metadata.
    pub fn create_topic(
        &mut self,
        stream_id: u32,
        mut doc: TopicDoc,
        partitions_count: u32,
    ) -> Result<u32, CatalogError> {
        let data_dir = self.data_dir.clone();
        let log_config = self.log_config;
        let Some(stream) = self.streams.get_mut(&stream_id) else {
            return Err(CatalogError::Encode(format!("stream {stream_id} vanished")));
        };
        let topic_id = stream.next_topic_id;
        doc.id = topic_id;
        let dir = topic_dir(&data_dir, stream_id, topic_id);
        if dir.exists() {
            tracing::warn!(dir = %dir.display(), "removing orphan topic directory left by an interrupted create");
            remove_dir(&dir)?;
        }
        let mut partitions = Vec::with_capacity(partitions_count as usize);
        for partition_id in 0..partitions_count {
            let p_doc = PartitionDoc {
                id: partition_id,
                created_at_us: doc.created_at_us,
                purge_target: 0,
            };
            let p_dir = partition_dir(&data_dir, stream_id, topic_id, partition_id);
            partitions.push(Arc::new(Partition::create(
                p_dir,
                p_doc,
                log_config,
                &self.writers,
            )?));
            doc.partitions.push(p_doc);
        }
        debug_assert_eq!(doc.partitions.len(), partitions.len());
        stream.next_topic_id += 1;
        stream.topics.insert(
            topic_id,
            Topic {
                doc,
                partitions,
                balanced_cursor: AtomicU32::new(0),
                members: Mutex::new(BTreeMap::new()),
            },
        );
        self.save()?;
        Ok(topic_id)
    }

    pub fn delete_topic(&mut self, stream_id: u32, topic_id: u32) -> Result<(), CatalogError> {
        let Some(stream) = self.streams.get_mut(&stream_id) else {
            return Ok(());
        };
        let Some(topic) = stream.topics.remove(&topic_id) else {
            return Ok(());
        };
        self.save()?;
        for partition in &topic.partitions {
            partition.destroy()?;
        }
        remove_dir(&topic_dir(&self.data_dir, stream_id, topic_id))?;
        Ok(())
    }

    fn topic_mut(&mut self, stream_id: u32, topic_id: u32) -> Option<&mut Topic> {
        self.streams
            .get_mut(&stream_id)
            .and_then(|s| s.topics.get_mut(&topic_id))
    }

    /// Create a consumer group; the caller has checked the name is free. Returns its id.
    pub fn create_group(&mut self, stream_id: u32, topic_id: u32, name: String) -> Result<u32, CatalogError> {
        let Some(topic) = self.topic_mut(stream_id, topic_id) else {
            return Err(CatalogError::Encode(format!(
                "topic {stream_id}/{topic_id} vanished"
            )));
        };
        let id = topic.doc.next_group_id;
        topic.doc.next_group_id += 1;
        topic.doc.consumer_groups.push(GroupDoc { id, name });
        self.save()?;
        Ok(id)
    }

    /// Delete a consumer group, its run-time membership and (after the metadata) its stored
    /// offsets. Group ids are never reused, so an offset left by a crash in between is inert.
    pub fn delete_group(&mut self, stream_id: u32, topic_id: u32, group_id: u32) -> Result<(), CatalogError> {
        let Some(topic) = self.topic_mut(stream_id, topic_id) else {
            return Ok(());
        };
        topic.doc.consumer_groups.retain(|g| g.id != group_id);
        lock(&topic.members).remove(&group_id);
        let partitions = topic.partitions.clone();
        self.save()?;
        let owner = OffsetOwner::Group(group_id);
        for partition in partitions {
            if let PartitionState::Serving(data) = &mut *lock(&partition.state) {
                data.offsets.delete(&owner)?;
            }
        }
        Ok(())
    }

    /// Add `count` partitions with the next ids.
    pub fn create_partitions(
        &mut self,
        stream_id: u32,
        topic_id: u32,
        count: u32,
        now_us: u64,
    ) -> Result<(), CatalogError> {
        let data_dir = self.data_dir.clone();
        let log_config = self.log_config;
        let writers = self.writers.clone();
        let Some(topic) = self
            .streams
            .get_mut(&stream_id)
            .and_then(|s| s.topics.get_mut(&topic_id))
        else {
            return Ok(());
        };
        let first = topic.partitions_count();
        for partition_id in first..first + count {
            let p_doc = PartitionDoc {
                id: partition_id,
                created_at_us: now_us,
                purge_target: 0,
            };
            let p_dir = partition_dir(&data_dir, stream_id, topic_id, partition_id);
            topic
                .partitions
                .push(Arc::new(Partition::create(p_dir, p_doc, log_config, &writers)?));
            topic.doc.partitions.push(p_doc);
        }
        topic.bump_generations();
        self.save()
    }

    /// Remove the last `count` partitions: metadata first, then files.
    pub fn delete_partitions(
        &mut self,
        stream_id: u32,
        topic_id: u32,
        count: u32,
    ) -> Result<(), CatalogError> {
        let Some(topic) = self
            .streams
            .get_mut(&stream_id)
            .and_then(|s| s.topics.get_mut(&topic_id))
        else {
            return Ok(());
        };
        let keep = topic.partitions.len().saturating_sub(count as usize);
        let removed: Vec<Arc<Partition>> = topic.partitions.drain(keep..).collect();
        topic.doc.partitions.truncate(keep);
        topic.bump_generations();
        self.save()?;
        for partition in removed {
            partition.destroy()?;
        }
        Ok(())
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
pub fn next_balanced(topic: &Topic) -> Option<u32> {
    let count = topic.partitions_count();
    if count == 0 {
        return None;
    }
    Some(topic.balanced_cursor.fetch_add(1, Ordering::Relaxed) % count)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Metadata written before consumer groups existed still loads: the new topic fields
    /// default to no groups and ids from 0.
    #[test]
    fn topic_doc_without_group_fields_loads() {
        let json = r#"{"id":3,"name":"t","created_at_us":1,"message_expiry_us":0,
            "compression":1,"max_topic_size_bytes":0,"partitions":[{"id":0,"created_at_us":1}]}"#;
        let doc: TopicDoc = serde_json::from_str(json).expect("old topic doc decodes");
        assert!(doc.consumer_groups.is_empty());
        assert_eq!(doc.next_group_id, 0);
    }

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
