//! The metadata state machine: streams, topics, partition counts, consumer-group
//! definitions, users, permissions and personal access tokens.
//!
//! A change is a [`MetadataOp`]: everything that is not a pure function of the state (wall
//! clock, argon2 hashes with their salts, token ids embedded in raw tokens) is decided once by
//! whoever prepares the op and carried in it. [`Metadata::apply`] is deterministic: the same
//! ops applied in the same order to the same state give the same state (and the same
//! [`Metadata::snapshot`] bytes) everywhere. It either applies an op whole or refuses it with
//! an Iggy status and changes nothing.
//!
//! What the state machine cannot do itself (create a partition's files, remove a deleted
//! topic's directory) comes back as [`Effect`]s for the shell, which performs them around
//! making the op durable (`crates/cairn/src/catalog.rs`).

use crate::permissions::PermissionsDoc;
use crate::users::{
    PersonalAccessToken, ROOT_USER_ID, ROOT_USERNAME, TOKEN_NAME_LEN, TOKENS_PER_USER_MAX,
    USER_STATUS_ACTIVE, USER_STATUS_INACTIVE, USERNAME_LEN, USERS_MAX, User,
};
use cairn_wire::codes;
use cairn_wire::types::Identifier;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// Most partitions one topic may have (the SDK's validators use the same bound).
pub const PARTITIONS_PER_TOPIC_MAX: u32 = 1000;

/// Longest stream, topic or consumer-group name (bytes).
pub const NAME_LEN_MAX: usize = 255;

/// The `format_version` of [`MetadataDoc`].
pub const METADATA_FORMAT_VERSION: u32 = 1;

/// Most bytes an encoded op or snapshot may have before decoding is refused.
pub const ENCODED_BYTES_MAX: usize = 64 * 1024 * 1024;

/// Persisted form of the metadata (the snapshot; `<data_dir>/metadata` holds it).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
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

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StreamDoc {
    pub id: u32,
    pub name: String,
    pub created_at_us: u64,
    pub next_topic_id: u32,
    pub topics: Vec<TopicDoc>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
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
    /// The size at which this topic's partitions start a new segment; 0 = the server's
    /// `storage.segment_size_bytes` (absent in metadata written before topics had their own).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub segment_size_bytes: u64,
    /// Partition ids are 0..partitions.len(), in order.
    pub partitions: Vec<PartitionDoc>,
    /// Consumer groups of this topic (membership is run-time only, kept by the server).
    /// Absent in metadata written before groups existed.
    #[serde(default)]
    pub consumer_groups: Vec<GroupDoc>,
    /// The id the next consumer group of this topic gets (ids start at 0 per topic).
    #[serde(default)]
    pub next_group_id: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct GroupDoc {
    pub id: u32,
    pub name: String,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
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

/// A stream in the state: its topics by id.
#[derive(Debug, Clone, PartialEq)]
pub struct Stream {
    pub id: u32,
    pub name: String,
    pub created_at_us: u64,
    pub next_topic_id: u32,
    pub topics: BTreeMap<u32, TopicDoc>,
}

/// The metadata state.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metadata {
    pub next_stream_id: u32,
    pub streams: BTreeMap<u32, Stream>,
    pub next_user_id: u32,
    pub users: Vec<User>,
    pub next_token_id: u64,
    pub tokens: Vec<PersonalAccessToken>,
}

/// Topic settings an op sets; `None` leaves a setting as it is (on create: the default).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TopicSettings {
    pub message_expiry_us: Option<u64>,
    pub compression: Option<u8>,
    pub max_topic_size_bytes: Option<u64>,
    /// Only on create: a topic's segment size is fixed for its life.
    pub segment_size_bytes: Option<u64>,
}

/// One purge mark: offsets of `partition_id` below `target` are purged.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PurgeMark {
    pub topic_id: u32,
    pub partition_id: u32,
    pub target: u64,
}

/// A change of the metadata, with everything decided that is not a function of the state.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum MetadataOp {
    /// First start: the root user with the configured or generated password's hash.
    CreateRoot {
        password_hash: String,
        created_at_us: u64,
    },
    CreateStream {
        name: String,
        created_at_us: u64,
    },
    UpdateStream {
        stream_id: u32,
        name: String,
    },
    DeleteStream {
        stream_id: u32,
    },
    CreateTopic {
        stream_id: u32,
        name: String,
        created_at_us: u64,
        partitions_count: u32,
        settings: TopicSettings,
    },
    UpdateTopic {
        stream_id: u32,
        topic_id: u32,
        name: String,
        settings: TopicSettings,
    },
    DeleteTopic {
        stream_id: u32,
        topic_id: u32,
    },
    CreatePartitions {
        stream_id: u32,
        topic_id: u32,
        count: u32,
        created_at_us: u64,
    },
    /// Remove the last `count` partitions.
    DeletePartitions {
        stream_id: u32,
        topic_id: u32,
        count: u32,
    },
    CreateGroup {
        stream_id: u32,
        topic_id: u32,
        name: String,
    },
    DeleteGroup {
        stream_id: u32,
        topic_id: u32,
        group_id: u32,
    },
    CreateUser {
        username: String,
        password_hash: String,
        status: u8,
        permissions: Option<PermissionsDoc>,
        created_at_us: u64,
    },
    UpdateUser {
        user_id: u32,
        username: Option<String>,
        status: Option<u8>,
    },
    /// Deletes the user's tokens too.
    DeleteUser {
        user_id: u32,
    },
    /// Refused with 42 unless the stored hash is still `expected_hash` (the one the preparer
    /// verified the current password against): a concurrent change wins.
    ChangePassword {
        user_id: u32,
        expected_hash: String,
        new_hash: String,
    },
    UpdatePermissions {
        user_id: u32,
        permissions: Option<PermissionsDoc>,
    },
    /// `token_id` is embedded in the raw token the preparer hands out, so it is decided
    /// there: at least `next_token_id`.
    CreateToken {
        user_id: u32,
        token_id: u64,
        name: String,
        token_hash: String,
        expiry_at_us: u64,
    },
    DeleteToken {
        user_id: u32,
        name: String,
    },
    /// Record purge targets (a topic's or a whole stream's partitions) before any partition
    /// is purged.
    MarkPurge {
        stream_id: u32,
        marks: Vec<PurgeMark>,
    },
    /// The first op of a log formatted over a data directory whose metadata was a document
    /// (written before metadata was replicated): the whole document becomes the state. Only
    /// an empty state takes it.
    Migrate {
        doc: MetadataDoc,
    },
}

/// What an applied op created, for the reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    Done,
    Stream(u32),
    Topic {
        stream_id: u32,
        topic_id: u32,
    },
    Group {
        stream_id: u32,
        topic_id: u32,
        group_id: u32,
    },
    User(u32),
    Token(u64),
}

/// Work outside the state machine that an applied op calls for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Effect {
    /// A new stream: no directory of that id may be left from an interrupted create.
    CreateStream {
        stream_id: u32,
    },
    /// A new topic (its partitions follow as [`Effect::CreatePartitions`]).
    CreateTopic {
        stream_id: u32,
        topic_id: u32,
    },
    /// Partitions `first..first + count` of the topic are new: create their logs.
    CreatePartitions {
        stream_id: u32,
        topic_id: u32,
        first: u32,
        count: u32,
    },
    /// Partitions from `first` on are gone: remove their files.
    DeletePartitions {
        stream_id: u32,
        topic_id: u32,
        first: u32,
    },
    DeleteTopic {
        stream_id: u32,
        topic_id: u32,
    },
    DeleteStream {
        stream_id: u32,
    },
    /// The group is gone: its stored offsets go (group ids are never reused, so a leftover
    /// offset is inert).
    DeleteGroup {
        stream_id: u32,
        topic_id: u32,
        group_id: u32,
    },
}

/// An applied op: what it created and what the shell has to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    pub outcome: Outcome,
    pub effects: Vec<Effect>,
}

impl Applied {
    fn done() -> Applied {
        Applied {
            outcome: Outcome::Done,
            effects: Vec::new(),
        }
    }
}

/// Why bytes do not decode as an op or a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError(pub String);

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DecodeError {}

impl MetadataOp {
    /// The op as bytes (a journal entry's body).
    pub fn encode(&self) -> Vec<u8> {
        // Serializing plain structs, strings and integers cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub fn decode(bytes: &[u8]) -> Result<MetadataOp, DecodeError> {
        if bytes.len() > ENCODED_BYTES_MAX {
            return Err(DecodeError(format!(
                "an encoded metadata op of {} bytes exceeds {ENCODED_BYTES_MAX}",
                bytes.len()
            )));
        }
        serde_json::from_slice(bytes).map_err(|e| DecodeError(format!("metadata op does not decode: {e}")))
    }
}

pub fn check_name(name: &str, status: u32) -> Result<(), u32> {
    if name.is_empty() || name.len() > NAME_LEN_MAX {
        Err(status)
    } else {
        Ok(())
    }
}

pub fn check_user_status(status: u8) -> Result<(), u32> {
    if status == USER_STATUS_ACTIVE || status == USER_STATUS_INACTIVE {
        Ok(())
    } else {
        Err(codes::INVALID_USER_STATUS)
    }
}

pub fn check_username(name: &str) -> Result<(), u32> {
    if USERNAME_LEN.contains(&name.len()) {
        Ok(())
    } else {
        Err(codes::INVALID_USERNAME)
    }
}

impl Metadata {
    /// Apply one op. `Err(status)`: refused, and nothing changed.
    pub fn apply(&mut self, op: &MetadataOp) -> Result<Applied, u32> {
        match op {
            MetadataOp::CreateRoot {
                password_hash,
                created_at_us,
            } => {
                if self
                    .users
                    .iter()
                    .any(|u| u.id == ROOT_USER_ID || u.username == ROOT_USERNAME)
                {
                    return Err(codes::USER_ALREADY_EXISTS);
                }
                self.users.push(User {
                    id: ROOT_USER_ID,
                    username: ROOT_USERNAME.to_string(),
                    password_hash: password_hash.clone(),
                    status: USER_STATUS_ACTIVE,
                    created_at_us: *created_at_us,
                    permissions: None,
                });
                self.next_user_id = self.next_user_id.max(ROOT_USER_ID + 1);
                Ok(Applied {
                    outcome: Outcome::User(ROOT_USER_ID),
                    effects: Vec::new(),
                })
            }
            MetadataOp::CreateStream { name, created_at_us } => {
                check_name(name, codes::INVALID_STREAM_NAME)?;
                if self.stream_by_name(name).is_some() {
                    return Err(codes::STREAM_NAME_ALREADY_EXISTS);
                }
                let id = self.next_stream_id;
                let next = id.checked_add(1).ok_or(codes::INVALID_STREAM_ID)?;
                debug_assert!(!self.streams.contains_key(&id), "stream ids are never reused");
                self.next_stream_id = next;
                self.streams.insert(
                    id,
                    Stream {
                        id,
                        name: name.clone(),
                        created_at_us: *created_at_us,
                        next_topic_id: 0,
                        topics: BTreeMap::new(),
                    },
                );
                Ok(Applied {
                    outcome: Outcome::Stream(id),
                    effects: vec![Effect::CreateStream { stream_id: id }],
                })
            }
            MetadataOp::UpdateStream { stream_id, name } => {
                check_name(name, codes::INVALID_STREAM_NAME)?;
                if self
                    .streams
                    .values()
                    .any(|s| &s.name == name && s.id != *stream_id)
                {
                    return Err(codes::STREAM_NAME_ALREADY_EXISTS);
                }
                let stream = self
                    .streams
                    .get_mut(stream_id)
                    .ok_or(codes::STREAM_ID_NOT_FOUND)?;
                stream.name = name.clone();
                Ok(Applied::done())
            }
            MetadataOp::DeleteStream { stream_id } => {
                self.streams.remove(stream_id).ok_or(codes::STREAM_ID_NOT_FOUND)?;
                Ok(Applied {
                    outcome: Outcome::Done,
                    effects: vec![Effect::DeleteStream {
                        stream_id: *stream_id,
                    }],
                })
            }
            MetadataOp::CreateTopic {
                stream_id,
                name,
                created_at_us,
                partitions_count,
                settings,
            } => {
                check_name(name, codes::INVALID_TOPIC_NAME)?;
                if *partitions_count > PARTITIONS_PER_TOPIC_MAX {
                    return Err(codes::INVALID_PARTITIONS_COUNT);
                }
                let stream = self
                    .streams
                    .get_mut(stream_id)
                    .ok_or(codes::STREAM_ID_NOT_FOUND)?;
                if stream.topics.values().any(|t| &t.name == name) {
                    return Err(codes::TOPIC_NAME_ALREADY_EXISTS);
                }
                let topic_id = stream.next_topic_id;
                let next = topic_id.checked_add(1).ok_or(codes::INVALID_TOPIC_ID)?;
                stream.next_topic_id = next;
                let doc = TopicDoc {
                    id: topic_id,
                    name: name.clone(),
                    created_at_us: *created_at_us,
                    message_expiry_us: settings.message_expiry_us.unwrap_or(0),
                    compression: settings.compression.unwrap_or(1),
                    max_topic_size_bytes: settings.max_topic_size_bytes.unwrap_or(0),
                    segment_size_bytes: settings.segment_size_bytes.unwrap_or(0),
                    partitions: (0..*partitions_count)
                        .map(|id| PartitionDoc {
                            id,
                            created_at_us: *created_at_us,
                            purge_target: 0,
                        })
                        .collect(),
                    consumer_groups: Vec::new(),
                    next_group_id: 0,
                };
                stream.topics.insert(topic_id, doc);
                let mut effects = vec![Effect::CreateTopic {
                    stream_id: *stream_id,
                    topic_id,
                }];
                if *partitions_count > 0 {
                    effects.push(Effect::CreatePartitions {
                        stream_id: *stream_id,
                        topic_id,
                        first: 0,
                        count: *partitions_count,
                    });
                }
                Ok(Applied {
                    outcome: Outcome::Topic {
                        stream_id: *stream_id,
                        topic_id,
                    },
                    effects,
                })
            }
            MetadataOp::UpdateTopic {
                stream_id,
                topic_id,
                name,
                settings,
            } => {
                check_name(name, codes::INVALID_TOPIC_NAME)?;
                if settings.segment_size_bytes.is_some() {
                    return Err(codes::UNSUPPORTED_OPTION_KEY);
                }
                let stream = self
                    .streams
                    .get_mut(stream_id)
                    .ok_or(codes::STREAM_ID_NOT_FOUND)?;
                if stream
                    .topics
                    .values()
                    .any(|t| &t.name == name && t.id != *topic_id)
                {
                    return Err(codes::TOPIC_NAME_ALREADY_EXISTS);
                }
                let topic = stream.topics.get_mut(topic_id).ok_or(codes::TOPIC_ID_NOT_FOUND)?;
                topic.name = name.clone();
                if let Some(expiry) = settings.message_expiry_us {
                    topic.message_expiry_us = expiry;
                }
                if let Some(compression) = settings.compression {
                    topic.compression = compression;
                }
                if let Some(size) = settings.max_topic_size_bytes {
                    topic.max_topic_size_bytes = size;
                }
                Ok(Applied::done())
            }
            MetadataOp::DeleteTopic { stream_id, topic_id } => {
                let stream = self
                    .streams
                    .get_mut(stream_id)
                    .ok_or(codes::STREAM_ID_NOT_FOUND)?;
                stream.topics.remove(topic_id).ok_or(codes::TOPIC_ID_NOT_FOUND)?;
                Ok(Applied {
                    outcome: Outcome::Done,
                    effects: vec![Effect::DeleteTopic {
                        stream_id: *stream_id,
                        topic_id: *topic_id,
                    }],
                })
            }
            MetadataOp::CreatePartitions {
                stream_id,
                topic_id,
                count,
                created_at_us,
            } => {
                let topic = self.topic_mut(*stream_id, *topic_id)?;
                let first = topic.partitions.len() as u32;
                if *count == 0 || first.saturating_add(*count) > PARTITIONS_PER_TOPIC_MAX {
                    return Err(codes::INVALID_PARTITIONS_COUNT);
                }
                topic
                    .partitions
                    .extend((first..first + count).map(|id| PartitionDoc {
                        id,
                        created_at_us: *created_at_us,
                        purge_target: 0,
                    }));
                Ok(Applied {
                    outcome: Outcome::Done,
                    effects: vec![Effect::CreatePartitions {
                        stream_id: *stream_id,
                        topic_id: *topic_id,
                        first,
                        count: *count,
                    }],
                })
            }
            MetadataOp::DeletePartitions {
                stream_id,
                topic_id,
                count,
            } => {
                let topic = self.topic_mut(*stream_id, *topic_id)?;
                let current = topic.partitions.len() as u32;
                if *count == 0 || *count > current {
                    return Err(codes::INVALID_PARTITIONS_COUNT);
                }
                let keep = current - count;
                topic.partitions.truncate(keep as usize);
                Ok(Applied {
                    outcome: Outcome::Done,
                    effects: vec![Effect::DeletePartitions {
                        stream_id: *stream_id,
                        topic_id: *topic_id,
                        first: keep,
                    }],
                })
            }
            MetadataOp::CreateGroup {
                stream_id,
                topic_id,
                name,
            } => {
                check_name(name, codes::INVALID_CONSUMER_GROUP_NAME)?;
                let topic = self.topic_mut(*stream_id, *topic_id)?;
                if topic.consumer_groups.iter().any(|g| &g.name == name) {
                    return Err(codes::CONSUMER_GROUP_NAME_ALREADY_EXISTS);
                }
                let group_id = topic.next_group_id;
                topic.next_group_id = group_id.checked_add(1).ok_or(codes::INVALID_IDENTIFIER)?;
                topic.consumer_groups.push(GroupDoc {
                    id: group_id,
                    name: name.clone(),
                });
                Ok(Applied {
                    outcome: Outcome::Group {
                        stream_id: *stream_id,
                        topic_id: *topic_id,
                        group_id,
                    },
                    effects: Vec::new(),
                })
            }
            MetadataOp::DeleteGroup {
                stream_id,
                topic_id,
                group_id,
            } => {
                let topic = self.topic_mut(*stream_id, *topic_id)?;
                let index = topic
                    .consumer_groups
                    .iter()
                    .position(|g| g.id == *group_id)
                    .ok_or(codes::CONSUMER_GROUP_ID_NOT_FOUND)?;
                topic.consumer_groups.remove(index);
                Ok(Applied {
                    outcome: Outcome::Done,
                    effects: vec![Effect::DeleteGroup {
                        stream_id: *stream_id,
                        topic_id: *topic_id,
                        group_id: *group_id,
                    }],
                })
            }
            MetadataOp::CreateUser {
                username,
                password_hash,
                status,
                permissions,
                created_at_us,
            } => {
                check_username(username)?;
                check_user_status(*status)?;
                if self.users.iter().any(|u| &u.username == username) {
                    return Err(codes::USER_ALREADY_EXISTS);
                }
                if self.users.len() >= USERS_MAX {
                    return Err(codes::USERS_LIMIT_REACHED);
                }
                // Id 0 is root's, even before root exists.
                let id = self.next_user_id.max(ROOT_USER_ID + 1);
                self.next_user_id = id.checked_add(1).ok_or(codes::USERS_LIMIT_REACHED)?;
                self.users.push(User {
                    id,
                    username: username.clone(),
                    password_hash: password_hash.clone(),
                    status: *status,
                    created_at_us: *created_at_us,
                    permissions: permissions.clone(),
                });
                Ok(Applied {
                    outcome: Outcome::User(id),
                    effects: Vec::new(),
                })
            }
            MetadataOp::UpdateUser {
                user_id,
                username,
                status,
            } => {
                if let Some(name) = username {
                    check_username(name)?;
                }
                if let Some(status) = status {
                    check_user_status(*status)?;
                }
                if !self.users.iter().any(|u| u.id == *user_id) {
                    return Err(codes::RESOURCE_NOT_FOUND);
                }
                if *user_id == ROOT_USER_ID && status.is_some_and(|s| s != USER_STATUS_ACTIVE) {
                    return Err(codes::CANNOT_CHANGE_PERMISSIONS);
                }
                if let Some(name) = username
                    && self.users.iter().any(|u| &u.username == name && u.id != *user_id)
                {
                    return Err(codes::USER_ALREADY_EXISTS);
                }
                let user = self.user_mut(*user_id)?;
                if let Some(name) = username {
                    user.username = name.clone();
                }
                if let Some(status) = status {
                    user.status = *status;
                }
                Ok(Applied::done())
            }
            MetadataOp::DeleteUser { user_id } => {
                if *user_id == ROOT_USER_ID {
                    return Err(codes::CANNOT_DELETE_USER);
                }
                let index = self
                    .users
                    .iter()
                    .position(|u| u.id == *user_id)
                    .ok_or(codes::RESOURCE_NOT_FOUND)?;
                self.users.remove(index);
                self.tokens.retain(|t| t.user_id != *user_id);
                Ok(Applied::done())
            }
            MetadataOp::ChangePassword {
                user_id,
                expected_hash,
                new_hash,
            } => {
                let user = self.user_mut(*user_id)?;
                if &user.password_hash != expected_hash {
                    return Err(codes::INVALID_CREDENTIALS);
                }
                user.password_hash = new_hash.clone();
                Ok(Applied::done())
            }
            MetadataOp::UpdatePermissions { user_id, permissions } => {
                if *user_id == ROOT_USER_ID {
                    return Err(codes::CANNOT_CHANGE_PERMISSIONS);
                }
                self.user_mut(*user_id)?.permissions = permissions.clone();
                Ok(Applied::done())
            }
            MetadataOp::CreateToken {
                user_id,
                token_id,
                name,
                token_hash,
                expiry_at_us,
            } => {
                if !TOKEN_NAME_LEN.contains(&name.len()) {
                    return Err(codes::INVALID_PAT_NAME);
                }
                if !self.users.iter().any(|u| u.id == *user_id) {
                    return Err(codes::RESOURCE_NOT_FOUND);
                }
                let owned = self.tokens.iter().filter(|t| t.user_id == *user_id);
                if owned.clone().any(|t| &t.name == name) {
                    return Err(codes::PAT_ALREADY_EXISTS);
                }
                if owned.count() >= TOKENS_PER_USER_MAX {
                    return Err(codes::PAT_LIMIT_REACHED);
                }
                // Token ids are never reused: a raw token handed out once must never name
                // another token.
                if *token_id < self.next_token_id {
                    return Err(codes::INVALID_PAT);
                }
                self.next_token_id = token_id.checked_add(1).ok_or(codes::INVALID_PAT)?;
                self.tokens.push(PersonalAccessToken {
                    id: *token_id,
                    user_id: *user_id,
                    name: name.clone(),
                    token_hash: token_hash.clone(),
                    expiry_at_us: *expiry_at_us,
                });
                Ok(Applied {
                    outcome: Outcome::Token(*token_id),
                    effects: Vec::new(),
                })
            }
            MetadataOp::DeleteToken { user_id, name } => {
                let index = self
                    .tokens
                    .iter()
                    .position(|t| t.user_id == *user_id && &t.name == name)
                    .ok_or(codes::RESOURCE_NOT_FOUND)?;
                self.tokens.remove(index);
                Ok(Applied::done())
            }
            MetadataOp::Migrate { doc } => {
                if *self != Metadata::default() {
                    return Err(codes::INVALID_COMMAND);
                }
                *self = Metadata::from_doc(doc.clone()).map_err(|_| codes::INVALID_FORMAT)?;
                Ok(Applied::done())
            }
            MetadataOp::MarkPurge { stream_id, marks } => {
                let stream = self.streams.get(stream_id).ok_or(codes::STREAM_ID_NOT_FOUND)?;
                for mark in marks {
                    let topic = stream
                        .topics
                        .get(&mark.topic_id)
                        .ok_or(codes::TOPIC_ID_NOT_FOUND)?;
                    let partition = topic
                        .partitions
                        .get(mark.partition_id as usize)
                        .ok_or(codes::PARTITION_NOT_FOUND)?;
                    // The target is an append counter, and those never go back.
                    if mark.target < partition.purge_target {
                        return Err(codes::INVALID_OFFSET);
                    }
                }
                let Some(stream) = self.streams.get_mut(stream_id) else {
                    return Err(codes::STREAM_ID_NOT_FOUND);
                };
                for mark in marks {
                    if let Some(partition) = stream
                        .topics
                        .get_mut(&mark.topic_id)
                        .and_then(|t| t.partitions.get_mut(mark.partition_id as usize))
                    {
                        partition.purge_target = mark.target;
                    }
                }
                Ok(Applied::done())
            }
        }
    }

    fn topic_mut(&mut self, stream_id: u32, topic_id: u32) -> Result<&mut TopicDoc, u32> {
        self.streams
            .get_mut(&stream_id)
            .ok_or(codes::STREAM_ID_NOT_FOUND)?
            .topics
            .get_mut(&topic_id)
            .ok_or(codes::TOPIC_ID_NOT_FOUND)
    }

    fn user_mut(&mut self, user_id: u32) -> Result<&mut User, u32> {
        self.users
            .iter_mut()
            .find(|u| u.id == user_id)
            .ok_or(codes::RESOURCE_NOT_FOUND)
    }

    // ---- lookups ----

    pub fn stream_by_name(&self, name: &str) -> Option<&Stream> {
        self.streams.values().find(|s| s.name == name)
    }

    /// The stream an identifier names, or the not-found status for its kind.
    pub fn find_stream(&self, id: &Identifier) -> Result<&Stream, u32> {
        match id {
            Identifier::Numeric(n) => self.streams.get(n).ok_or(codes::STREAM_ID_NOT_FOUND),
            Identifier::Name(name) => self.stream_by_name(name).ok_or(codes::STREAM_NAME_NOT_FOUND),
        }
    }

    /// The stream and topic two identifiers name.
    pub fn find_topic(&self, stream: &Identifier, topic: &Identifier) -> Result<(&Stream, &TopicDoc), u32> {
        let stream = self.find_stream(stream)?;
        Ok((stream, stream.find_topic(topic)?))
    }

    pub fn find_user(&self, id: &Identifier) -> Option<&User> {
        match id {
            Identifier::Numeric(n) => self.users.iter().find(|u| u.id == *n),
            Identifier::Name(name) => self.users.iter().find(|u| &u.username == name),
        }
    }

    pub fn user(&self, user_id: u32) -> Option<&User> {
        self.users.iter().find(|u| u.id == user_id)
    }

    // ---- snapshot ----

    /// The persisted form.
    pub fn to_doc(&self) -> MetadataDoc {
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
                    topics: s.topics.values().cloned().collect(),
                })
                .collect(),
            next_user_id: self.next_user_id,
            users: self.users.clone(),
            next_token_id: self.next_token_id,
            tokens: self.tokens.clone(),
        }
    }

    /// The state from its persisted form, after checking the invariants `apply` keeps: a
    /// document that breaks one was not written by it and is refused, never half-used.
    pub fn from_doc(doc: MetadataDoc) -> Result<Metadata, DecodeError> {
        let refuse = |reason: String| Err(DecodeError(reason));
        if doc.format_version != METADATA_FORMAT_VERSION {
            return refuse(format!(
                "unsupported metadata format version {}",
                doc.format_version
            ));
        }
        let mut streams = BTreeMap::new();
        for stream in doc.streams {
            if stream.id >= doc.next_stream_id {
                return refuse(format!(
                    "stream {} is not below the next stream id {}",
                    stream.id, doc.next_stream_id
                ));
            }
            let mut topics = BTreeMap::new();
            for topic in stream.topics {
                if topic.id >= stream.next_topic_id {
                    return refuse(format!(
                        "topic {} of stream {} is not below the next topic id {}",
                        topic.id, stream.id, stream.next_topic_id
                    ));
                }
                if let Some((index, p)) = topic
                    .partitions
                    .iter()
                    .enumerate()
                    .find(|(index, p)| p.id as usize != *index)
                {
                    return refuse(format!(
                        "topic {} of stream {} lists partition {} at position {index}",
                        topic.id, stream.id, p.id
                    ));
                }
                let group_ids: BTreeSet<u32> = topic.consumer_groups.iter().map(|g| g.id).collect();
                if group_ids.len() != topic.consumer_groups.len() {
                    return refuse(format!(
                        "topic {} of stream {} lists a consumer group id twice",
                        topic.id, stream.id
                    ));
                }
                let topic_id = topic.id;
                if topics.insert(topic_id, topic).is_some() {
                    return refuse(format!("stream {} lists topic {topic_id} twice", stream.id));
                }
            }
            let stream_id = stream.id;
            let previous = streams.insert(
                stream_id,
                Stream {
                    id: stream.id,
                    name: stream.name,
                    created_at_us: stream.created_at_us,
                    next_topic_id: stream.next_topic_id,
                    topics,
                },
            );
            if previous.is_some() {
                return refuse(format!("stream {stream_id} is listed twice"));
            }
        }
        let user_ids: BTreeSet<u32> = doc.users.iter().map(|u| u.id).collect();
        if user_ids.len() != doc.users.len() {
            return refuse("a user id is listed twice".to_string());
        }
        let token_ids: BTreeSet<u64> = doc.tokens.iter().map(|t| t.id).collect();
        if token_ids.len() != doc.tokens.len() {
            return refuse("a token id is listed twice".to_string());
        }
        if let Some(token) = doc.tokens.iter().find(|t| t.id >= doc.next_token_id) {
            return refuse(format!(
                "token {} is not below the next token id {}",
                token.id, doc.next_token_id
            ));
        }
        Ok(Metadata {
            next_stream_id: doc.next_stream_id,
            streams,
            next_user_id: doc.next_user_id,
            users: doc.users,
            next_token_id: doc.next_token_id,
            tokens: doc.tokens,
        })
    }

    /// The whole state as bytes: equal states give equal bytes.
    pub fn snapshot(&self) -> Vec<u8> {
        // Plain structs, strings and integers always serialize.
        serde_json::to_vec_pretty(&self.to_doc()).unwrap_or_default()
    }

    pub fn restore(bytes: &[u8]) -> Result<Metadata, DecodeError> {
        if bytes.len() > ENCODED_BYTES_MAX {
            return Err(DecodeError(format!(
                "a metadata snapshot of {} bytes exceeds {ENCODED_BYTES_MAX}",
                bytes.len()
            )));
        }
        let doc: MetadataDoc = serde_json::from_slice(bytes)
            .map_err(|e| DecodeError(format!("metadata document does not decode: {e}")))?;
        Metadata::from_doc(doc)
    }
}

impl Stream {
    pub fn find_topic(&self, id: &Identifier) -> Result<&TopicDoc, u32> {
        match id {
            Identifier::Numeric(n) => self.topics.get(n).ok_or(codes::TOPIC_ID_NOT_FOUND),
            Identifier::Name(name) => self
                .topics
                .values()
                .find(|t| &t.name == name)
                .ok_or(codes::TOPIC_NAME_NOT_FOUND),
        }
    }
}

impl TopicDoc {
    pub fn partitions_count(&self) -> u32 {
        self.partitions.len() as u32
    }

    pub fn find_group(&self, id: &Identifier) -> Result<&GroupDoc, u32> {
        match id {
            Identifier::Numeric(n) => self
                .consumer_groups
                .iter()
                .find(|g| g.id == *n)
                .ok_or(codes::CONSUMER_GROUP_ID_NOT_FOUND),
            Identifier::Name(name) => self
                .consumer_groups
                .iter()
                .find(|g| &g.name == name)
                .ok_or(codes::CONSUMER_GROUP_NAME_NOT_FOUND),
        }
    }
}

/// The VSR `operation` of a metadata op.
pub const OPERATION_METADATA: u8 = 1;

/// What the metadata group answers an op with: what it applied, or the status it refused it
/// with (a refused op changed nothing).
pub type MetadataReply = Result<Applied, u32>;

/// The metadata state machine as a replication group runs it: ops arrive encoded, replies
/// leave encoded, and the snapshot is the metadata document.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MetadataMachine {
    pub state: Metadata,
}

impl MetadataMachine {
    pub fn encode_reply(reply: &MetadataReply) -> Vec<u8> {
        // Plain enums and integers always serialize.
        serde_json::to_vec(reply).unwrap_or_default()
    }

    pub fn decode_reply(bytes: &[u8]) -> Result<MetadataReply, DecodeError> {
        serde_json::from_slice(bytes).map_err(|e| DecodeError(format!("metadata reply does not decode: {e}")))
    }
}

impl cairn_vsr::replica::StateMachine for MetadataMachine {
    fn apply(&mut self, _op: u64, _timestamp: u64, operation: u8, input: &[u8]) -> Vec<u8> {
        let reply = if operation != OPERATION_METADATA {
            Err(codes::INVALID_COMMAND)
        } else {
            match MetadataOp::decode(input) {
                Ok(op) => self.state.apply(&op),
                Err(_) => Err(codes::INVALID_FORMAT),
            }
        };
        MetadataMachine::encode_reply(&reply)
    }

    fn snapshot(&self) -> Vec<u8> {
        self.state.snapshot()
    }

    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String> {
        self.state = Metadata::restore(snapshot).map_err(|e| e.0)?;
        Ok(())
    }
}
