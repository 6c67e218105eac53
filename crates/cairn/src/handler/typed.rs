//! Every reply the handler gives, as values. The transports encode them: TCP as the Iggy
//! binary payload ([`Typed::encode`], protocol reference §4–§7), HTTP as the JSON of the 0.11
//! SDK's `HttpClient`. Neither parses the other's bytes back.
//!
//! A `Get*` of something that does not exist is `None` in its variant: the binary protocol
//! answers it with an empty payload (which the SDK reads as "not found"), HTTP with 404.

use cairn_wire::reply;
use cairn_wire::types::Permissions;

/// A reply as values. The variant names what the reply is; for TCP an empty payload is
/// [`Typed::Empty`] and every `None` below.
#[derive(Debug, Clone, PartialEq)]
pub enum Typed {
    /// No payload: a command that only changes state, or Ping.
    Empty,
    /// LoginUser / LoginWithToken (§4.2).
    LoggedIn {
        user_id: u32,
        session_id: u64,
        server_version: &'static str,
    },
    Stats(Box<reply::Stats>),
    ClusterMetadata {
        name: String,
        nodes: Vec<reply::ClusterNode>,
    },
    /// Commands 103 and 123: the coordinator connection's identity to attach with, then the
    /// partition primary's node record.
    PollRoute {
        client: u128,
        session: u64,
        metadata_watermark: u64,
        primary: reply::ClusterNode,
    },
    /// GetMe (always some), GetClient: the record with its consumer groups.
    Client(Option<reply::ClientRecord>),
    /// GetClients: records without their group entries.
    Clients(Vec<reply::ClientRecord>),
    /// GetStream, CreateStream: the stream with its topics.
    Stream(Option<Box<StreamDetails>>),
    Streams(Vec<reply::StreamRecord>),
    /// GetTopic, CreateTopic: the topic with its partitions.
    Topic(Option<Box<TopicDetails>>),
    Topics(Vec<reply::TopicRecord>),
    ConsumerOffset(Option<ConsumerOffset>),
    /// SendMessages: where the batch was stored.
    Sent(reply::SendConfirmation),
    /// CreatePersonalAccessToken: the raw token, shown once.
    Token(String),
    Tokens(Vec<TokenEntry>),
    /// GetUser, CreateUser: the user with its permissions.
    User(Option<Box<UserDetails>>),
    Users(Vec<reply::UserRecord>),
    /// GetConsumerGroup, CreateConsumerGroup: the group with its members.
    Group(Option<reply::GroupRecord>),
    /// GetConsumerGroups: records without member entries.
    Groups(Vec<reply::GroupRecord>),
    /// SyncConsumerGroup: `None` when the session is not a member.
    GroupAssignment(Option<GroupAssignment>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamDetails {
    pub stream: reply::StreamRecord,
    pub topics: Vec<reply::TopicRecord>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicDetails {
    pub topic: reply::TopicRecord,
    pub partitions: Vec<reply::PartitionRecord>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsumerOffset {
    pub partition_id: u32,
    pub current_offset: u64,
    pub stored_offset: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenEntry {
    pub name: String,
    /// µs since the epoch; 0 = never.
    pub expiry_at_us: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserDetails {
    pub user: reply::UserRecord,
    pub permissions: Option<Permissions>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupAssignment {
    pub generation: u64,
    pub partitions: Vec<u32>,
}

impl Typed {
    /// The binary reply payload.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            Typed::Empty
            | Typed::Client(None)
            | Typed::Stream(None)
            | Typed::Topic(None)
            | Typed::ConsumerOffset(None)
            | Typed::User(None)
            | Typed::Group(None)
            | Typed::GroupAssignment(None) => {}
            Typed::LoggedIn {
                user_id,
                session_id,
                server_version,
            } => reply::login_response(&mut out, *user_id, *session_id, server_version),
            Typed::Stats(stats) => reply::stats(&mut out, stats),
            Typed::ClusterMetadata { name, nodes } => reply::cluster_metadata(&mut out, name, nodes),
            Typed::PollRoute {
                client,
                session,
                metadata_watermark,
                primary,
            } => reply::poll_route(&mut out, *client, *session, *metadata_watermark, primary),
            Typed::Client(Some(client)) => reply::client_details(&mut out, client),
            Typed::Clients(clients) => {
                for client in clients {
                    reply::client(&mut out, client);
                }
            }
            Typed::Stream(Some(details)) => reply::stream_details(&mut out, &details.stream, &details.topics),
            Typed::Streams(streams) => {
                for stream in streams {
                    reply::stream(&mut out, stream);
                }
            }
            Typed::Topic(Some(details)) => {
                reply::topic_details(&mut out, &details.topic, &details.partitions)
            }
            Typed::Topics(topics) => reply::topics_list(&mut out, topics),
            Typed::ConsumerOffset(Some(offset)) => reply::consumer_offset(
                &mut out,
                offset.partition_id,
                offset.current_offset,
                offset.stored_offset,
            ),
            Typed::Sent(confirmation) => {
                reply::send_confirmations(&mut out, std::slice::from_ref(confirmation))
            }
            Typed::Token(token) => reply::pat_token(&mut out, token),
            Typed::Tokens(tokens) => {
                for token in tokens {
                    reply::pat_entry(&mut out, &token.name, token.expiry_at_us);
                }
            }
            Typed::User(Some(details)) => {
                reply::user_details(&mut out, &details.user, details.permissions.as_ref())
            }
            Typed::Users(users) => {
                for user in users {
                    reply::user(&mut out, user);
                }
            }
            Typed::Group(Some(group)) => reply::group_details(&mut out, group),
            Typed::Groups(groups) => {
                for group in groups {
                    reply::group(&mut out, group);
                }
            }
            Typed::GroupAssignment(Some(assignment)) => {
                reply::group_sync(&mut out, assignment.generation, &assignment.partitions)
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_found_is_an_empty_payload() {
        for typed in [
            Typed::Empty,
            Typed::Client(None),
            Typed::Stream(None),
            Typed::Topic(None),
            Typed::ConsumerOffset(None),
            Typed::User(None),
            Typed::Group(None),
            Typed::GroupAssignment(None),
            Typed::Streams(Vec::new()),
        ] {
            assert!(typed.encode().is_empty(), "{typed:?}");
        }
    }

    #[test]
    fn lists_are_records_back_to_back_and_topics_are_counted() {
        let token = TokenEntry {
            name: "t".to_string(),
            expiry_at_us: 5,
        };
        let one = Typed::Tokens(vec![token.clone()]).encode();
        let two = Typed::Tokens(vec![token.clone(), token]).encode();
        assert_eq!(two.len(), 2 * one.len());
        // GetTopics carries its count first, so an empty list is four zero bytes.
        assert_eq!(Typed::Topics(Vec::new()).encode(), 0u32.to_le_bytes());
    }
}
