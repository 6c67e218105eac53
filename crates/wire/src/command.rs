//! Requests: one [`Command`] enum decoded from (operation, code, body).
//!
//! The header decides *which* command (operation byte, and for operation 2 the code at
//! 196..200); the body carries its arguments. Decoding never panics and never allocates more
//! than the body length.

use crate::codes;
use crate::frame::operation;
use crate::reader::{Reader, option_block};
use crate::types::{Consumer, Identifier, OptionEntry, Partitioning, Permissions, PollingStrategy};

/// Why a request body could not be decoded. Every variant maps to one Iggy status code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The body is shorter/longer than its fields say, or a field is out of range.
    /// Status 4 (InvalidFormat).
    #[error("malformed request body: {0}")]
    Malformed(&'static str),
    /// An identifier with a bad kind or length. Status 6 (InvalidIdentifier).
    #[error("invalid identifier")]
    InvalidIdentifier,
    /// Operation/code pair this dialect does not define, or a retired code. Status 3.
    #[error("unknown command (operation {operation}, code {code})")]
    UnknownCommand { operation: u8, code: u32 },
    /// An option key the server does not support (status 4041). The decoder itself never
    /// returns this: it keeps option entries raw and refuses only a badly shaped block, as
    /// Malformed. The server raises it while applying the entries.
    #[error("unsupported option key {0}")]
    UnsupportedOptionKey(String),
    /// An option value of the wrong kind or out of range (status 4042); raised by the server,
    /// like [`DecodeError::UnsupportedOptionKey`].
    #[error("invalid option value for {0}")]
    InvalidOptionValue(String),
}

impl DecodeError {
    /// The Iggy status code to answer with.
    pub fn status(&self) -> u32 {
        match self {
            DecodeError::Malformed(_) => codes::INVALID_FORMAT,
            DecodeError::InvalidIdentifier => codes::INVALID_IDENTIFIER,
            DecodeError::UnknownCommand { .. } => codes::INVALID_COMMAND,
            DecodeError::UnsupportedOptionKey(_) => codes::UNSUPPORTED_OPTION_KEY,
            DecodeError::InvalidOptionValue(_) => codes::INVALID_OPTION_VALUE,
        }
    }
}

/// Login with username and password (code 40) or a personal access token (code 45).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientVersionInfo {
    pub protocol_version: u32,
    pub sdk_name: String,
    pub sdk_version: String,
}

/// Every request the 0.11 dialect can carry. Field names follow the protocol reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    // ---- operation 1 (Register) ----
    LoginUser {
        version: ClientVersionInfo,
        username: String,
        password: String,
    },
    LoginWithToken {
        version: ClientVersionInfo,
        token: String,
    },
    // ---- operation 3 ----
    Logout,
    // ---- operation 2 (code at 196..200) ----
    Ping,
    GetStats,
    GetSnapshot {
        compression: u8,
        snapshot_types: Vec<u8>,
    },
    GetClusterMetadata,
    DescribeOptions {
        scope: u8,
    },
    GetMe,
    GetClient {
        client_id: u32,
    },
    GetClients,
    GetUser {
        user: Identifier,
    },
    GetUsers,
    GetPersonalAccessTokens,
    GetStream {
        stream: Identifier,
    },
    GetStreams,
    GetTopic {
        stream: Identifier,
        topic: Identifier,
    },
    GetTopics {
        stream: Identifier,
    },
    PollMessages {
        consumer: Consumer,
        stream: Identifier,
        topic: Identifier,
        /// `None` when the OptPart flag is 0.
        partition_id: Option<u32>,
        strategy: PollingStrategy,
        count: u32,
        auto_commit: bool,
    },
    FlushUnsavedBuffer {
        stream: Identifier,
        topic: Identifier,
        partition_id: u32,
        fsync: bool,
    },
    GetConsumerOffset {
        consumer: Consumer,
        stream: Identifier,
        topic: Identifier,
        partition_id: Option<u32>,
    },
    /// 103 (with more than one node): where to poll. The body is a PollMessages body; only
    /// what names the partition matters.
    GetPollRouting {
        consumer: Consumer,
        stream: Identifier,
        topic: Identifier,
        partition_id: Option<u32>,
    },
    /// 123 (with more than one node): where to write an offset. The body is a
    /// GetConsumerOffset body.
    GetConsumerOffsetRouting {
        consumer: Consumer,
        stream: Identifier,
        topic: Identifier,
        partition_id: Option<u32>,
    },
    /// 14: bind this (data) connection to the consumer of the coordinator connection the
    /// routing reply named.
    AttachConsumerSession {
        client: u128,
        session: u64,
        metadata_watermark: u64,
    },
    GetConsumerGroup {
        stream: Identifier,
        topic: Identifier,
        group: Identifier,
    },
    GetConsumerGroups {
        stream: Identifier,
        topic: Identifier,
    },
    SyncConsumerGroup {
        stream: Identifier,
        topic: Identifier,
        group: Identifier,
    },
    // ---- replicated operations (128..=162) ----
    CreateStream {
        name: String,
        options: Vec<OptionEntry>,
    },
    UpdateStream {
        stream: Identifier,
        name: String,
        options: Vec<OptionEntry>,
    },
    DeleteStream {
        stream: Identifier,
    },
    PurgeStream {
        stream: Identifier,
    },
    CreateTopic {
        stream: Identifier,
        partitions_count: u32,
        name: String,
        options: Vec<OptionEntry>,
    },
    UpdateTopic {
        stream: Identifier,
        topic: Identifier,
        name: String,
        options: Vec<OptionEntry>,
    },
    DeleteTopic {
        stream: Identifier,
        topic: Identifier,
    },
    PurgeTopic {
        stream: Identifier,
        topic: Identifier,
    },
    CreatePartitions {
        stream: Identifier,
        topic: Identifier,
        partitions_count: u32,
    },
    DeletePartitions {
        stream: Identifier,
        topic: Identifier,
        partitions_count: u32,
    },
    DeleteSegments {
        stream: Identifier,
        topic: Identifier,
        partition_id: u32,
        segments_count: u32,
    },
    CreateConsumerGroup {
        stream: Identifier,
        topic: Identifier,
        name: String,
    },
    DeleteConsumerGroup {
        stream: Identifier,
        topic: Identifier,
        group: Identifier,
    },
    JoinConsumerGroup {
        stream: Identifier,
        topic: Identifier,
        group: Identifier,
    },
    LeaveConsumerGroup {
        stream: Identifier,
        topic: Identifier,
        group: Identifier,
    },
    CreateUser {
        username: String,
        password: String,
        status: u8,
        permissions: Option<Permissions>,
    },
    UpdateUser {
        user: Identifier,
        username: Option<String>,
        status: Option<u8>,
    },
    DeleteUser {
        user: Identifier,
    },
    ChangePassword {
        user: Identifier,
        current_password: String,
        new_password: String,
    },
    UpdatePermissions {
        user: Identifier,
        permissions: Option<Permissions>,
    },
    CreatePersonalAccessToken {
        name: String,
        expiry: u64,
    },
    DeletePersonalAccessToken {
        name: String,
    },
    SendMessages {
        stream: Identifier,
        topic: Identifier,
        partitioning: Partitioning,
        /// messages_count from the metadata section (must equal the batch header's count).
        messages_count: u32,
        /// The raw batch: 256-byte header + frames, exactly as sent, in the buffer it came
        /// in. Validate with [`crate::batch::validate`] before use.
        batch: crate::batch::ReceivedBatch,
    },
    StoreConsumerOffset {
        consumer: Consumer,
        stream: Identifier,
        topic: Identifier,
        partition_id: Option<u32>,
        offset: u64,
    },
    DeleteConsumerOffset {
        consumer: Consumer,
        stream: Identifier,
        topic: Identifier,
        partition_id: Option<u32>,
    },
}

impl Command {
    /// Decode a request. `operation` is header byte 176, `code` the u32 at 196..200 (only
    /// meaningful for operation 2), `body` the bytes after the 256-byte header.
    /// `body` is a `Bytes` so a SendMessages batch can be kept without a copy.
    pub fn decode(operation: u8, code: u32, body: bytes::Bytes) -> Result<Command, DecodeError> {
        match operation {
            operation::REGISTER => decode_register(&body),
            operation::NON_REPLICATED => decode_non_replicated(code, &body),
            operation::LOGOUT => {
                Reader::new(&body).finish()?;
                Ok(Command::Logout)
            }
            operation::SEND_MESSAGES => decode_send_messages(body),
            // The replicated operations carry no code (0); the operation byte alone names
            // the command.
            128..=162 => decode_replicated(operation, code, &body),
            // 0, the internal 64..=68 and every undefined byte.
            _ => Err(DecodeError::UnknownCommand { operation, code }),
        }
    }

    /// A short name for logs ("SendMessages", "CreateTopic", ...).
    pub fn name(&self) -> &'static str {
        match self {
            Command::LoginUser { .. } => "LoginUser",
            Command::LoginWithToken { .. } => "LoginWithToken",
            Command::Logout => "Logout",
            Command::Ping => "Ping",
            Command::GetStats => "GetStats",
            Command::GetSnapshot { .. } => "GetSnapshot",
            Command::GetClusterMetadata => "GetClusterMetadata",
            Command::DescribeOptions { .. } => "DescribeOptions",
            Command::GetMe => "GetMe",
            Command::GetClient { .. } => "GetClient",
            Command::GetClients => "GetClients",
            Command::GetUser { .. } => "GetUser",
            Command::GetUsers => "GetUsers",
            Command::GetPersonalAccessTokens => "GetPersonalAccessTokens",
            Command::GetStream { .. } => "GetStream",
            Command::GetStreams => "GetStreams",
            Command::GetTopic { .. } => "GetTopic",
            Command::GetTopics { .. } => "GetTopics",
            Command::PollMessages { .. } => "PollMessages",
            Command::FlushUnsavedBuffer { .. } => "FlushUnsavedBuffer",
            Command::GetConsumerOffset { .. } => "GetConsumerOffset",
            Command::GetPollRouting { .. } => "GetPollRouting",
            Command::GetConsumerOffsetRouting { .. } => "GetConsumerOffsetRouting",
            Command::AttachConsumerSession { .. } => "AttachConsumerSession",
            Command::GetConsumerGroup { .. } => "GetConsumerGroup",
            Command::GetConsumerGroups { .. } => "GetConsumerGroups",
            Command::SyncConsumerGroup { .. } => "SyncConsumerGroup",
            Command::CreateStream { .. } => "CreateStream",
            Command::UpdateStream { .. } => "UpdateStream",
            Command::DeleteStream { .. } => "DeleteStream",
            Command::PurgeStream { .. } => "PurgeStream",
            Command::CreateTopic { .. } => "CreateTopic",
            Command::UpdateTopic { .. } => "UpdateTopic",
            Command::DeleteTopic { .. } => "DeleteTopic",
            Command::PurgeTopic { .. } => "PurgeTopic",
            Command::CreatePartitions { .. } => "CreatePartitions",
            Command::DeletePartitions { .. } => "DeletePartitions",
            Command::DeleteSegments { .. } => "DeleteSegments",
            Command::CreateConsumerGroup { .. } => "CreateConsumerGroup",
            Command::DeleteConsumerGroup { .. } => "DeleteConsumerGroup",
            Command::JoinConsumerGroup { .. } => "JoinConsumerGroup",
            Command::LeaveConsumerGroup { .. } => "LeaveConsumerGroup",
            Command::CreateUser { .. } => "CreateUser",
            Command::UpdateUser { .. } => "UpdateUser",
            Command::DeleteUser { .. } => "DeleteUser",
            Command::ChangePassword { .. } => "ChangePassword",
            Command::UpdatePermissions { .. } => "UpdatePermissions",
            Command::CreatePersonalAccessToken { .. } => "CreatePersonalAccessToken",
            Command::DeletePersonalAccessToken { .. } => "DeletePersonalAccessToken",
            Command::SendMessages { .. } => "SendMessages",
            Command::StoreConsumerOffset { .. } => "StoreConsumerOffset",
            Command::DeleteConsumerOffset { .. } => "DeleteConsumerOffset",
        }
    }
}

/// Operation 1 carries no code: the two login shapes are told apart by parsing (§4.2). The
/// password shape must consume the body exactly; a PAT body is always one byte too short for
/// it, so falling back to the PAT shape is unambiguous.
fn decode_register(body: &[u8]) -> Result<Command, DecodeError> {
    decode_password_login(body).or_else(|_| decode_token_login(body))
}

/// Code 40: `[version][username Name][password_len u8][password][context_len u32][context]`.
fn decode_password_login(body: &[u8]) -> Result<Command, DecodeError> {
    let mut r = Reader::new(body);
    let version = client_version_info(&mut r)?;
    let username = r.name("username")?;
    let password = r.short_str("password")?;
    login_context(&mut r)?;
    r.finish()?;
    Ok(Command::LoginUser {
        version,
        username,
        password,
    })
}

/// Code 45: `[version][token_len u8][token][context_len u32][context]`.
fn decode_token_login(body: &[u8]) -> Result<Command, DecodeError> {
    let mut r = Reader::new(body);
    let version = client_version_info(&mut r)?;
    let token = r.short_str("token")?;
    login_context(&mut r)?;
    r.finish()?;
    Ok(Command::LoginWithToken { version, token })
}

/// `[protocol_version u32][sdk_name Name][sdk_version Name]`.
fn client_version_info(r: &mut Reader<'_>) -> Result<ClientVersionInfo, DecodeError> {
    Ok(ClientVersionInfo {
        protocol_version: r.u32("protocol version")?,
        sdk_name: r.name("sdk name")?,
        sdk_version: r.name("sdk version")?,
    })
}

/// `[context_len u32][context]`: always empty from 0.11.0 and unused by the server, so it is
/// only checked for layout and discarded.
fn login_context(r: &mut Reader<'_>) -> Result<(), DecodeError> {
    r.long_str("login context").map(drop)
}

/// Operation 2: the code at 196..200 names the command.
fn decode_non_replicated(code: u32, body: &[u8]) -> Result<Command, DecodeError> {
    let mut r = Reader::new(body);
    let command = match code {
        1 => Command::Ping,
        10 => Command::GetStats,
        11 => {
            let compression = r.u8("snapshot compression")?;
            let count = usize::from(r.u8("snapshot types count")?);
            let snapshot_types = r.bytes(count, "snapshot types")?.to_vec();
            Command::GetSnapshot {
                compression,
                snapshot_types,
            }
        }
        12 => Command::GetClusterMetadata,
        13 => {
            let scope = r.u8("options scope")?;
            if !(1..=3).contains(&scope) {
                return Err(DecodeError::Malformed("options scope must be 1..=3"));
            }
            Command::DescribeOptions { scope }
        }
        20 => Command::GetMe,
        21 => Command::GetClient {
            client_id: r.u32("client id")?,
        },
        22 => Command::GetClients,
        31 => Command::GetUser {
            user: r.identifier()?,
        },
        32 => Command::GetUsers,
        41 => Command::GetPersonalAccessTokens,
        14 => Command::AttachConsumerSession {
            client: r.u128("attached client id")?,
            session: r.u64("attached session")?,
            metadata_watermark: r.u64("metadata watermark")?,
        },
        // 104 (PollMessagesOnPrimary) is a poll sent to the partition's primary: the same body
        // and the same reply.
        100 | 104 => Command::PollMessages {
            consumer: r.consumer()?,
            stream: r.identifier()?,
            topic: r.identifier()?,
            partition_id: r.optional_partition()?,
            strategy: r.polling_strategy()?,
            count: r.u32("poll count")?,
            auto_commit: r.u8("auto commit")? != 0,
        },
        102 => Command::FlushUnsavedBuffer {
            stream: r.identifier()?,
            topic: r.identifier()?,
            partition_id: r.u32("partition id")?,
            fsync: r.u8("fsync")? != 0,
        },
        103 => {
            let routed = Command::GetPollRouting {
                consumer: r.consumer()?,
                stream: r.identifier()?,
                topic: r.identifier()?,
                partition_id: r.optional_partition()?,
            };
            // The rest of the poll: checked, and not needed to route it.
            r.polling_strategy()?;
            r.u32("poll count")?;
            r.u8("auto commit")?;
            routed
        }
        120 => Command::GetConsumerOffset {
            consumer: r.consumer()?,
            stream: r.identifier()?,
            topic: r.identifier()?,
            partition_id: r.optional_partition()?,
        },
        123 => Command::GetConsumerOffsetRouting {
            consumer: r.consumer()?,
            stream: r.identifier()?,
            topic: r.identifier()?,
            partition_id: r.optional_partition()?,
        },
        200 => Command::GetStream {
            stream: r.identifier()?,
        },
        201 => Command::GetStreams,
        300 => Command::GetTopic {
            stream: r.identifier()?,
            topic: r.identifier()?,
        },
        301 => Command::GetTopics {
            stream: r.identifier()?,
        },
        600 => Command::GetConsumerGroup {
            stream: r.identifier()?,
            topic: r.identifier()?,
            group: r.identifier()?,
        },
        601 => Command::GetConsumerGroups {
            stream: r.identifier()?,
            topic: r.identifier()?,
        },
        606 => Command::SyncConsumerGroup {
            stream: r.identifier()?,
            topic: r.identifier()?,
            group: r.identifier()?,
        },
        _ => {
            return Err(DecodeError::UnknownCommand {
                operation: operation::NON_REPLICATED,
                code,
            });
        }
    };
    r.finish()?;
    Ok(command)
}

/// Operations 128..=162 except SendMessages (160), which keeps its batch as `Bytes`.
fn decode_replicated(operation: u8, code: u32, body: &[u8]) -> Result<Command, DecodeError> {
    let mut r = Reader::new(body);
    let command = match operation {
        128 => {
            let name = r.name("stream name")?;
            let options = option_block(r.rest())?;
            Command::CreateStream { name, options }
        }
        129 => {
            let stream = r.identifier()?;
            let name = r.name("stream name")?;
            let options = option_block(r.rest())?;
            Command::UpdateStream {
                stream,
                name,
                options,
            }
        }
        130 => Command::DeleteStream {
            stream: r.identifier()?,
        },
        131 => Command::PurgeStream {
            stream: r.identifier()?,
        },
        132 => {
            let stream = r.identifier()?;
            let partitions_count = r.u32("partitions count")?;
            let name = r.name("topic name")?;
            let options = option_block(r.rest())?;
            Command::CreateTopic {
                stream,
                partitions_count,
                name,
                options,
            }
        }
        133 => {
            let stream = r.identifier()?;
            let topic = r.identifier()?;
            let name = r.name("topic name")?;
            let options = option_block(r.rest())?;
            Command::UpdateTopic {
                stream,
                topic,
                name,
                options,
            }
        }
        134 => Command::DeleteTopic {
            stream: r.identifier()?,
            topic: r.identifier()?,
        },
        135 => Command::PurgeTopic {
            stream: r.identifier()?,
            topic: r.identifier()?,
        },
        136 => Command::CreatePartitions {
            stream: r.identifier()?,
            topic: r.identifier()?,
            partitions_count: r.u32("partitions count")?,
        },
        137 => Command::DeletePartitions {
            stream: r.identifier()?,
            topic: r.identifier()?,
            partitions_count: r.u32("partitions count")?,
        },
        138 => Command::DeleteSegments {
            stream: r.identifier()?,
            topic: r.identifier()?,
            partition_id: r.u32("partition id")?,
            segments_count: r.u32("segments count")?,
        },
        139 => Command::CreateConsumerGroup {
            stream: r.identifier()?,
            topic: r.identifier()?,
            name: r.name("consumer group name")?,
        },
        140 => Command::DeleteConsumerGroup {
            stream: r.identifier()?,
            topic: r.identifier()?,
            group: r.identifier()?,
        },
        141 => {
            let username = r.name("username")?;
            let password = r.short_str("password")?;
            let status = r.u8("user status")?;
            let permissions = r.optional_permissions()?;
            // Users have no option keys yet; the block is checked for shape and dropped.
            option_block(r.rest())?;
            Command::CreateUser {
                username,
                password,
                status,
                permissions,
            }
        }
        142 => {
            let user = r.identifier()?;
            let username = if r.flag("username flag must be 0 or 1")? {
                Some(r.name("username")?)
            } else {
                None
            };
            let status = if r.flag("status flag must be 0 or 1")? {
                Some(r.u8("user status")?)
            } else {
                None
            };
            option_block(r.rest())?;
            Command::UpdateUser {
                user,
                username,
                status,
            }
        }
        143 => Command::DeleteUser {
            user: r.identifier()?,
        },
        144 => Command::ChangePassword {
            user: r.identifier()?,
            current_password: r.short_str("current password")?,
            new_password: r.short_str("new password")?,
        },
        145 => Command::UpdatePermissions {
            user: r.identifier()?,
            permissions: r.optional_permissions()?,
        },
        146 => Command::CreatePersonalAccessToken {
            name: r.name("token name")?,
            expiry: r.u64("token expiry")?,
        },
        147 => Command::DeletePersonalAccessToken {
            name: r.name("token name")?,
        },
        148 => Command::JoinConsumerGroup {
            stream: r.identifier()?,
            topic: r.identifier()?,
            group: r.identifier()?,
        },
        149 => Command::LeaveConsumerGroup {
            stream: r.identifier()?,
            topic: r.identifier()?,
            group: r.identifier()?,
        },
        161 => {
            let consumer = r.consumer()?;
            let stream = r.identifier()?;
            let topic = r.identifier()?;
            let partition_id = r.optional_partition()?;
            let offset = r.u64("offset")?;
            ack_level(&mut r)?;
            Command::StoreConsumerOffset {
                consumer,
                stream,
                topic,
                partition_id,
                offset,
            }
        }
        162 => {
            let consumer = r.consumer()?;
            let stream = r.identifier()?;
            let topic = r.identifier()?;
            let partition_id = r.optional_partition()?;
            ack_level(&mut r)?;
            Command::DeleteConsumerOffset {
                consumer,
                stream,
                topic,
                partition_id,
            }
        }
        // 150..=159: no such operation in this dialect.
        _ => return Err(DecodeError::UnknownCommand { operation, code }),
    };
    r.finish()?;
    Ok(command)
}

/// The trailing ack byte of offset writes: 0 NoAck, 1 Quorum. A single node has nothing to
/// wait for either way, so the value is checked and dropped.
fn ack_level(r: &mut Reader<'_>) -> Result<(), DecodeError> {
    match r.u8("ack level")? {
        0 | 1 => Ok(()),
        _ => Err(DecodeError::Malformed("ack level must be 0 or 1")),
    }
}

/// SendMessages (§7.1): `[metadata_len u32][stream Id][topic Id][Partitioning]
/// [messages_count u32]` then one batch, kept in the body without a copy, the decoded bytes
/// in front of it as its headroom (at least 16: four for the length, three per identifier,
/// two for the partitioning, four for the count). The batch itself is checked by
/// [`crate::batch::validate`].
fn decode_send_messages(body: bytes::Bytes) -> Result<Command, DecodeError> {
    let mut r = Reader::new(&body);
    let metadata_len = r.u32("metadata length")?;
    let metadata_start = r.position();
    let stream = r.identifier()?;
    let topic = r.identifier()?;
    let partitioning = r.partitioning()?;
    let messages_count = r.u32("messages count")?;
    let metadata_end = r.position();
    if u64::from(metadata_len) != (metadata_end - metadata_start) as u64 {
        return Err(DecodeError::Malformed(
            "metadata length does not match its fields",
        ));
    }
    let batch = crate::batch::ReceivedBatch::with_headroom(body, metadata_end);
    Ok(Command::SendMessages {
        stream,
        topic,
        partitioning,
        messages_count,
        batch,
    })
}
