//! Who may do what: the permission rules, as pure functions (no locks, no IO).
//!
//! `authorize` decides one command for one user, given the stream/topic/user ids the command
//! names *as resolved by the caller* (under the catalog lock). The rules follow the
//! `iggy_common` 0.11 permission documentation:
//!
//! - root (user 0) may do everything; its permissions cannot be changed.
//! - Always allowed to a logged-in user: Ping, Logout, GetClusterMetadata (the SDK sends it
//!   right after login), GetMe, DescribeOptions, their own personal access tokens, their own
//!   user record (GetUser), and changing their own password.
//! - `manage_servers` ⊇ `read_servers`: GetStats, GetClients, GetClient need `read_servers`;
//!   GetSnapshot needs `manage_servers`.
//! - `manage_users` ⊇ `read_users`: GetUser (of others) and GetUsers need `read_users`;
//!   CreateUser, UpdateUser, DeleteUser, UpdatePermissions, ChangePassword (of others) need
//!   `manage_users`. Nobody but root changes root's password.
//! - Streams and topics, with global permissions extended (never narrowed) per stream and per
//!   topic: manage ⊇ read at every level; global `manage_streams` / stream `manage_stream` ⊇
//!   `manage_topics` of that stream; `read_streams` / `read_stream` ⊇ `read_topics`;
//!   `manage_topics` ⊇ `manage_topic` of each topic; `read_topics` ⊇ `read_topic` ⊇
//!   `poll_messages`. `send_messages` is never implied: only an explicit `send_messages`
//!   (global, stream or topic) allows sends and FlushUnsavedBuffer.
//! - CreateStream: global `manage_streams`. Update/Delete/PurgeStream: manage the stream.
//!   CreateTopic: manage the stream's topics. Update/Delete/PurgeTopic, Create/
//!   DeletePartitions, DeleteSegments: manage the topic.
//! - Metadata: GetStream and GetTopics need read on the stream or any grant inside it (a
//!   topic's poll or send included); GetStreams lists only those streams. GetTopic needs read,
//!   poll or send on the topic. Why: the SDK's `IggyProducer`/`IggyConsumer` look up the
//!   stream and topic before they send or poll, so a send-only user must see them.
//! - Polls, consumer offsets and Join/Leave/SyncConsumerGroup: `poll_messages` on the topic.
//!   Get/Create/DeleteConsumerGroup(s): read the topic (iggy_common: "read_topics allows to
//!   read the topics, manage consumer groups").
//!
//! A name or id that does not resolve is judged with the permissions that do not depend on it
//! (a missing stream: global permissions only; a missing topic: global and stream ones). A
//! user allowed that class of command everywhere then gets the command's own not-found
//! answer; anyone else gets 41, exactly as for an existing stream they may not see, so a
//! refusal never reveals whether a stream or topic exists.

use crate::users::ROOT_USER_ID;
use cairn_wire::codes;
use cairn_wire::command::Command;
use cairn_wire::types::{self, Identifier, Permissions};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Stored form of a user's permissions (in the metadata document).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PermissionsDoc {
    pub global: GlobalDoc,
    pub streams: BTreeMap<u32, StreamDoc>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct GlobalDoc {
    pub manage_servers: bool,
    pub read_servers: bool,
    pub manage_users: bool,
    pub read_users: bool,
    pub manage_streams: bool,
    pub read_streams: bool,
    pub manage_topics: bool,
    pub read_topics: bool,
    pub poll_messages: bool,
    pub send_messages: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct StreamDoc {
    pub manage_stream: bool,
    pub read_stream: bool,
    pub manage_topics: bool,
    pub read_topics: bool,
    pub poll_messages: bool,
    pub send_messages: bool,
    /// `null` for "no topic entries", as the SDK's JSON writes it (the metadata document uses
    /// the same form).
    #[serde(deserialize_with = "null_as_empty", serialize_with = "empty_as_null")]
    pub topics: BTreeMap<u32, TopicDoc>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct TopicDoc {
    pub manage_topic: bool,
    pub read_topic: bool,
    pub poll_messages: bool,
    pub send_messages: bool,
}

fn empty_as_null<S: serde::Serializer>(
    topics: &BTreeMap<u32, TopicDoc>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    if topics.is_empty() {
        serializer.serialize_none()
    } else {
        serializer.serialize_some(topics)
    }
}

fn null_as_empty<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<BTreeMap<u32, TopicDoc>, D::Error> {
    Ok(Option::<BTreeMap<u32, TopicDoc>>::deserialize(deserializer)?.unwrap_or_default())
}

impl GlobalDoc {
    /// Every global permission: what root has.
    pub const ALL: GlobalDoc = GlobalDoc {
        manage_servers: true,
        read_servers: true,
        manage_users: true,
        read_users: true,
        manage_streams: true,
        read_streams: true,
        manage_topics: true,
        read_topics: true,
        poll_messages: true,
        send_messages: true,
    };
}

impl PermissionsDoc {
    /// From the wire form. A stream or topic listed twice keeps its last entry.
    pub fn from_wire(p: &Permissions) -> PermissionsDoc {
        let g = &p.global;
        PermissionsDoc {
            global: GlobalDoc {
                manage_servers: g.manage_servers,
                read_servers: g.read_servers,
                manage_users: g.manage_users,
                read_users: g.read_users,
                manage_streams: g.manage_streams,
                read_streams: g.read_streams,
                manage_topics: g.manage_topics,
                read_topics: g.read_topics,
                poll_messages: g.poll_messages,
                send_messages: g.send_messages,
            },
            streams: p
                .streams
                .iter()
                .map(|(id, s)| {
                    let topics = s
                        .topics
                        .iter()
                        .map(|(tid, t)| {
                            let doc = TopicDoc {
                                manage_topic: t.manage_topic,
                                read_topic: t.read_topic,
                                poll_messages: t.poll_messages,
                                send_messages: t.send_messages,
                            };
                            (*tid, doc)
                        })
                        .collect();
                    let doc = StreamDoc {
                        manage_stream: s.manage_stream,
                        read_stream: s.read_stream,
                        manage_topics: s.manage_topics,
                        read_topics: s.read_topics,
                        poll_messages: s.poll_messages,
                        send_messages: s.send_messages,
                        topics,
                    };
                    (*id, doc)
                })
                .collect(),
        }
    }

    /// The wire form (for UserDetails replies).
    pub fn to_wire(&self) -> Permissions {
        let g = &self.global;
        Permissions {
            global: types::GlobalPermissions {
                manage_servers: g.manage_servers,
                read_servers: g.read_servers,
                manage_users: g.manage_users,
                read_users: g.read_users,
                manage_streams: g.manage_streams,
                read_streams: g.read_streams,
                manage_topics: g.manage_topics,
                read_topics: g.read_topics,
                poll_messages: g.poll_messages,
                send_messages: g.send_messages,
            },
            streams: self
                .streams
                .iter()
                .map(|(id, s)| {
                    let topics = s
                        .topics
                        .iter()
                        .map(|(tid, t)| {
                            let wire = types::TopicPermissions {
                                manage_topic: t.manage_topic,
                                read_topic: t.read_topic,
                                poll_messages: t.poll_messages,
                                send_messages: t.send_messages,
                            };
                            (*tid, wire)
                        })
                        .collect();
                    let wire = types::StreamPermissions {
                        manage_stream: s.manage_stream,
                        read_stream: s.read_stream,
                        manage_topics: s.manage_topics,
                        read_topics: s.read_topics,
                        poll_messages: s.poll_messages,
                        send_messages: s.send_messages,
                        topics,
                    };
                    (*id, wire)
                })
                .collect(),
        }
    }

    /// Root's permissions as reported by GetUser.
    pub fn root() -> PermissionsDoc {
        PermissionsDoc {
            global: GlobalDoc::ALL,
            streams: BTreeMap::new(),
        }
    }
}

/// One user's rights: root, or a user with its stored permissions (`None`: none at all).
#[derive(Debug, Clone, Copy)]
pub struct UserPermissionsView<'a> {
    pub user_id: u32,
    pub permissions: Option<&'a PermissionsDoc>,
}

static NO_STREAM: StreamDoc = StreamDoc {
    manage_stream: false,
    read_stream: false,
    manage_topics: false,
    read_topics: false,
    poll_messages: false,
    send_messages: false,
    topics: BTreeMap::new(),
};

const NO_TOPIC: TopicDoc = TopicDoc {
    manage_topic: false,
    read_topic: false,
    poll_messages: false,
    send_messages: false,
};

impl UserPermissionsView<'_> {
    fn global(&self) -> GlobalDoc {
        if self.user_id == ROOT_USER_ID {
            return GlobalDoc::ALL;
        }
        self.permissions.map(|p| p.global).unwrap_or_default()
    }

    /// The stream's own grants (none when the stream is unresolved or not listed).
    fn stream(&self, stream: Option<u32>) -> &StreamDoc {
        match (self.permissions, stream) {
            (Some(p), Some(s)) => p.streams.get(&s).unwrap_or(&NO_STREAM),
            _ => &NO_STREAM,
        }
    }

    fn topic(&self, stream: Option<u32>, topic: Option<u32>) -> TopicDoc {
        match topic {
            Some(t) => self.stream(stream).topics.get(&t).copied().unwrap_or(NO_TOPIC),
            None => NO_TOPIC,
        }
    }

    pub fn read_servers(&self) -> bool {
        let g = self.global();
        g.manage_servers || g.read_servers
    }

    pub fn manage_servers(&self) -> bool {
        self.global().manage_servers
    }

    pub fn read_users(&self) -> bool {
        let g = self.global();
        g.manage_users || g.read_users
    }

    pub fn manage_users(&self) -> bool {
        self.global().manage_users
    }

    pub fn create_streams(&self) -> bool {
        self.global().manage_streams
    }

    pub fn manage_stream(&self, stream: Option<u32>) -> bool {
        self.global().manage_streams || self.stream(stream).manage_stream
    }

    pub fn read_stream(&self, stream: Option<u32>) -> bool {
        self.manage_stream(stream) || self.global().read_streams || self.stream(stream).read_stream
    }

    pub fn manage_topics(&self, stream: Option<u32>) -> bool {
        self.manage_stream(stream) || self.global().manage_topics || self.stream(stream).manage_topics
    }

    pub fn read_topics(&self, stream: Option<u32>) -> bool {
        self.read_stream(stream)
            || self.manage_topics(stream)
            || self.global().read_topics
            || self.stream(stream).read_topics
    }

    pub fn manage_topic(&self, stream: Option<u32>, topic: Option<u32>) -> bool {
        self.manage_topics(stream) || self.topic(stream, topic).manage_topic
    }

    pub fn read_topic(&self, stream: Option<u32>, topic: Option<u32>) -> bool {
        self.read_topics(stream) || self.manage_topic(stream, topic) || self.topic(stream, topic).read_topic
    }

    pub fn poll(&self, stream: Option<u32>, topic: Option<u32>) -> bool {
        self.read_topic(stream, topic)
            || self.global().poll_messages
            || self.stream(stream).poll_messages
            || self.topic(stream, topic).poll_messages
    }

    /// May see the stream's metadata (GetStream, GetStreams, GetTopics): read it, or hold
    /// any grant inside it, since the SDK's producer and consumer look the stream up before
    /// they send or poll.
    pub fn see_stream(&self, stream: Option<u32>) -> bool {
        let g = self.global();
        let s = self.stream(stream);
        self.read_stream(stream)
            || self.read_topics(stream)
            || g.poll_messages
            || g.send_messages
            || s.poll_messages
            || s.send_messages
            || s.topics
                .values()
                .any(|t| t.manage_topic || t.read_topic || t.poll_messages || t.send_messages)
    }

    /// May see the topic's metadata (GetTopic): read it, or poll from or send to it (the SDK
    /// looks the topic up for its partition count before sending or polling).
    pub fn see_topic(&self, stream: Option<u32>, topic: Option<u32>) -> bool {
        self.read_topic(stream, topic) || self.poll(stream, topic) || self.send(stream, topic)
    }

    pub fn send(&self, stream: Option<u32>, topic: Option<u32>) -> bool {
        self.global().send_messages
            || self.stream(stream).send_messages
            || self.topic(stream, topic).send_messages
    }
}

/// The ids a command names, resolved by the caller; `None` when it names none or the name
/// does not resolve.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Resolved {
    pub stream: Option<u32>,
    pub topic: Option<u32>,
    pub user: Option<u32>,
}

/// The stream and topic a command names (in that order), for the caller to resolve.
pub fn target_of(command: &Command) -> (Option<&Identifier>, Option<&Identifier>) {
    use Command::*;
    match command {
        GetStream { stream }
        | GetTopics { stream }
        | UpdateStream { stream, .. }
        | DeleteStream { stream }
        | PurgeStream { stream }
        | CreateTopic { stream, .. } => (Some(stream), None),
        GetTopic { stream, topic }
        | PollMessages { stream, topic, .. }
        | FlushUnsavedBuffer { stream, topic, .. }
        | GetConsumerOffset { stream, topic, .. }
        | GetPollRouting { stream, topic, .. }
        | GetConsumerOffsetRouting { stream, topic, .. }
        | StoreConsumerOffset { stream, topic, .. }
        | DeleteConsumerOffset { stream, topic, .. }
        | GetConsumerGroup { stream, topic, .. }
        | GetConsumerGroups { stream, topic }
        | SyncConsumerGroup { stream, topic, .. }
        | UpdateTopic { stream, topic, .. }
        | DeleteTopic { stream, topic }
        | PurgeTopic { stream, topic }
        | CreatePartitions { stream, topic, .. }
        | DeletePartitions { stream, topic, .. }
        | DeleteSegments { stream, topic, .. }
        | CreateConsumerGroup { stream, topic, .. }
        | DeleteConsumerGroup { stream, topic, .. }
        | JoinConsumerGroup { stream, topic, .. }
        | LeaveConsumerGroup { stream, topic, .. }
        | SendMessages { stream, topic, .. } => (Some(stream), Some(topic)),
        _ => (None, None),
    }
}

/// The user a command names, for the caller to resolve.
pub fn user_of(command: &Command) -> Option<&Identifier> {
    use Command::*;
    match command {
        GetUser { user }
        | UpdateUser { user, .. }
        | DeleteUser { user }
        | ChangePassword { user, .. }
        | UpdatePermissions { user, .. } => Some(user),
        _ => None,
    }
}

/// Decide `command` for `user`: `Ok` or 41 (Unauthorized).
pub fn authorize(user: &UserPermissionsView<'_>, command: &Command, ids: &Resolved) -> Result<(), u32> {
    use Command::*;
    let (s, t) = (ids.stream, ids.topic);
    let own_user = ids.user == Some(user.user_id);
    let allowed = match command {
        Ping
        | LoginUser { .. }
        | LoginWithToken { .. }
        | Logout
        | GetClusterMetadata
        | AttachConsumerSession { .. }
        | GetMe
        | DescribeOptions { .. }
        | GetPersonalAccessTokens
        | CreatePersonalAccessToken { .. }
        | DeletePersonalAccessToken { .. } => true,
        GetStats | GetClients | GetClient { .. } => user.read_servers(),
        GetSnapshot { .. } => user.manage_servers(),
        GetUser { .. } => own_user || user.read_users(),
        GetUsers => user.read_users(),
        ChangePassword { .. } => own_user || (user.manage_users() && ids.user != Some(ROOT_USER_ID)),
        CreateUser { .. } | UpdateUser { .. } | DeleteUser { .. } | UpdatePermissions { .. } => {
            user.manage_users()
        }
        CreateStream { .. } => user.create_streams(),
        // Filtered to the readable streams by the handler.
        GetStreams => true,
        GetStream { .. } | GetTopics { .. } => user.see_stream(s),
        UpdateStream { .. } | DeleteStream { .. } | PurgeStream { .. } => user.manage_stream(s),
        CreateTopic { .. } => user.manage_topics(s),
        GetTopic { .. } => user.see_topic(s, t),
        GetConsumerGroup { .. } | GetConsumerGroups { .. } => user.read_topic(s, t),
        CreateConsumerGroup { .. } | DeleteConsumerGroup { .. } => user.read_topic(s, t),
        UpdateTopic { .. }
        | DeleteTopic { .. }
        | PurgeTopic { .. }
        | CreatePartitions { .. }
        | DeletePartitions { .. }
        | DeleteSegments { .. } => user.manage_topic(s, t),
        SendMessages { .. } | FlushUnsavedBuffer { .. } => user.send(s, t),
        PollMessages { .. }
        | GetConsumerOffset { .. }
        | GetPollRouting { .. }
        | GetConsumerOffsetRouting { .. }
        | StoreConsumerOffset { .. }
        | DeleteConsumerOffset { .. }
        | JoinConsumerGroup { .. }
        | LeaveConsumerGroup { .. }
        | SyncConsumerGroup { .. } => user.poll(s, t),
    };
    if allowed { Ok(()) } else { Err(codes::UNAUTHORIZED) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_wire::types::{Consumer, Partitioning, PollingStrategy};

    fn id(n: u32) -> Identifier {
        Identifier::Numeric(n)
    }

    fn poll() -> Command {
        Command::PollMessages {
            consumer: Consumer::Consumer(id(1)),
            stream: id(1),
            topic: id(1),
            partition_id: Some(0),
            strategy: PollingStrategy::First,
            count: 1,
            auto_commit: false,
        }
    }

    fn send() -> Command {
        Command::SendMessages {
            stream: id(1),
            topic: id(1),
            partitioning: Partitioning::Balanced,
            messages_count: 1,
            batch: bytes::Bytes::new().into(),
        }
    }

    fn at(stream: u32, topic: u32) -> Resolved {
        Resolved {
            stream: Some(stream),
            topic: Some(topic),
            user: None,
        }
    }

    fn check(p: &PermissionsDoc, command: &Command, ids: Resolved) -> bool {
        let view = UserPermissionsView {
            user_id: 7,
            permissions: Some(p),
        };
        match authorize(&view, command, &ids) {
            Ok(()) => true,
            Err(code) => {
                assert_eq!(code, codes::UNAUTHORIZED);
                false
            }
        }
    }

    fn stream_reader(stream: u32) -> PermissionsDoc {
        let mut p = PermissionsDoc::default();
        p.streams.insert(
            stream,
            StreamDoc {
                read_stream: true,
                poll_messages: true,
                ..StreamDoc::default()
            },
        );
        p
    }

    #[test]
    fn root_may_do_everything_even_without_stored_permissions() {
        let root = UserPermissionsView {
            user_id: ROOT_USER_ID,
            permissions: None,
        };
        for command in [
            send(),
            poll(),
            Command::GetUsers,
            Command::GetStats,
            Command::GetClients,
        ] {
            assert_eq!(authorize(&root, &command, &at(1, 1)), Ok(()));
        }
    }

    #[test]
    fn session_commands_are_always_allowed() {
        let nobody = PermissionsDoc::default();
        for command in [
            Command::Logout,
            Command::GetClusterMetadata,
            Command::GetMe,
            Command::GetPersonalAccessTokens,
            Command::DeletePersonalAccessToken { name: "abc".into() },
            Command::GetStreams,
        ] {
            assert!(
                check(&nobody, &command, Resolved::default()),
                "{}",
                command.name()
            );
        }
        let own = Resolved {
            user: Some(7),
            ..Resolved::default()
        };
        let change = Command::ChangePassword {
            user: id(7),
            current_password: "a".into(),
            new_password: "b".into(),
        };
        assert!(check(&nobody, &change, own));
        assert!(check(&nobody, &Command::GetUser { user: id(7) }, own));
    }

    #[test]
    fn stream_read_allows_polls_not_sends_nor_other_streams() {
        let p = stream_reader(1);
        assert!(check(&p, &poll(), at(1, 1)));
        assert!(check(&p, &Command::GetStream { stream: id(1) }, at(1, 1)));
        assert!(check(&p, &Command::GetTopics { stream: id(1) }, at(1, 1)));
        assert!(!check(&p, &send(), at(1, 1)), "read does not imply send");
        assert!(!check(&p, &poll(), at(2, 1)), "other stream");
        assert!(!check(&p, &Command::GetStream { stream: id(2) }, at(2, 0)));
        assert!(!check(&p, &Command::DeleteStream { stream: id(1) }, at(1, 0)));
        assert!(!check(
            &p,
            &Command::DeleteTopic {
                stream: id(1),
                topic: id(1)
            },
            at(1, 1)
        ));
        // An unresolved stream is judged by global permissions only.
        assert!(!check(&p, &poll(), Resolved::default()));
    }

    #[test]
    fn topic_grants_are_scoped_to_the_topic() {
        let mut p = PermissionsDoc::default();
        let mut s = StreamDoc::default();
        s.topics.insert(
            3,
            TopicDoc {
                send_messages: true,
                read_topic: true,
                ..TopicDoc::default()
            },
        );
        p.streams.insert(1, s);
        assert!(check(&p, &send(), at(1, 3)));
        assert!(check(&p, &poll(), at(1, 3)), "read_topic implies poll");
        assert!(!check(&p, &send(), at(1, 4)));
        // A grant inside a stream shows its metadata (the SDK producer looks it up)...
        assert!(check(&p, &Command::GetStream { stream: id(1) }, at(1, 3)));
        assert!(check(&p, &Command::GetTopics { stream: id(1) }, at(1, 3)));
        assert!(check(
            &p,
            &Command::GetTopic {
                stream: id(1),
                topic: id(3)
            },
            at(1, 3)
        ));
        // ...but nothing else of the stream.
        assert!(!check(
            &p,
            &Command::GetTopic {
                stream: id(1),
                topic: id(4)
            },
            at(1, 4)
        ));
        assert!(!check(&p, &Command::GetStream { stream: id(2) }, at(2, 0)));
        assert!(!check(
            &p,
            &Command::DeleteTopic {
                stream: id(1),
                topic: id(3)
            },
            at(1, 3)
        ));
        let create_group = Command::CreateConsumerGroup {
            stream: id(1),
            topic: id(3),
            name: "g".into(),
        };
        assert!(check(&p, &create_group, at(1, 3)));
    }

    #[test]
    fn global_hierarchy() {
        let mut p = PermissionsDoc::default();
        p.global.manage_streams = true;
        assert!(check(
            &p,
            &Command::CreateStream {
                name: "s".into(),
                options: vec![]
            },
            Resolved::default()
        ));
        assert!(check(
            &p,
            &Command::DeleteTopic {
                stream: id(5),
                topic: id(5)
            },
            at(5, 5)
        ));
        assert!(check(&p, &poll(), at(9, 9)), "manage_streams ⊇ read ⊇ poll");
        assert!(!check(&p, &send(), at(9, 9)), "send is never implied");
        assert!(!check(&p, &Command::GetUsers, Resolved::default()));

        let mut p = PermissionsDoc::default();
        p.global.read_topics = true;
        assert!(check(
            &p,
            &Command::GetTopic {
                stream: id(1),
                topic: id(1)
            },
            at(1, 1)
        ));
        assert!(check(&p, &poll(), at(1, 1)));
        assert!(
            check(&p, &Command::GetStream { stream: id(1) }, at(1, 1)),
            "topics are inside streams"
        );
        assert!(!check(&p, &Command::DeleteStream { stream: id(1) }, at(1, 1)));
        assert!(!check(
            &p,
            &Command::CreateTopic {
                stream: id(1),
                partitions_count: 1,
                name: "t".into(),
                options: vec![]
            },
            at(1, 0)
        ));

        let mut p = PermissionsDoc::default();
        p.global.send_messages = true;
        assert!(check(&p, &send(), at(1, 1)));
        assert!(!check(&p, &poll(), at(1, 1)));
        assert!(
            check(
                &p,
                &Command::GetTopic {
                    stream: id(1),
                    topic: id(1)
                },
                at(1, 1)
            ),
            "a producer may look up the topic it sends to"
        );
        assert!(!check(
            &p,
            &Command::GetConsumerGroups {
                stream: id(1),
                topic: id(1)
            },
            at(1, 1)
        ));
    }

    #[test]
    fn servers_and_users() {
        let mut p = PermissionsDoc::default();
        assert!(!check(&p, &Command::GetStats, Resolved::default()));
        assert!(!check(&p, &Command::GetClients, Resolved::default()));
        assert!(!check(&p, &Command::GetUsers, Resolved::default()));
        p.global.manage_servers = true;
        assert!(check(&p, &Command::GetStats, Resolved::default()));
        assert!(check(
            &p,
            &Command::GetClient { client_id: 1 },
            Resolved::default()
        ));
        p.global.read_users = true;
        let other = Resolved {
            user: Some(8),
            ..Resolved::default()
        };
        assert!(check(&p, &Command::GetUser { user: id(8) }, other));
        assert!(!check(&p, &Command::DeleteUser { user: id(8) }, other));
        p.global.manage_users = true;
        assert!(check(&p, &Command::DeleteUser { user: id(8) }, other));
        let change_root = Command::ChangePassword {
            user: id(0),
            current_password: "x".into(),
            new_password: "y".into(),
        };
        let root = Resolved {
            user: Some(ROOT_USER_ID),
            ..Resolved::default()
        };
        assert!(
            !check(&p, &change_root, root),
            "only root changes root's password"
        );
    }

    #[test]
    fn stored_form_round_trips_the_wire_form() {
        let mut p = stream_reader(4);
        p.global.read_users = true;
        if let Some(s) = p.streams.get_mut(&4) {
            s.topics.insert(
                2,
                TopicDoc {
                    send_messages: true,
                    ..TopicDoc::default()
                },
            );
        }
        assert_eq!(PermissionsDoc::from_wire(&p.to_wire()), p);
        let json = serde_json::to_string(&p).expect("encode");
        let back: PermissionsDoc = serde_json::from_str(&json).expect("decode");
        assert_eq!(back, p);
    }
}
