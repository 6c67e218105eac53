//! Requests: one [`Command`] enum decoded from (operation, code, body).
//!
//! The header decides *which* command (operation byte, and for operation 2 the code at
//! 196..200); the body carries its arguments. Decoding never panics and never allocates more
//! than the body length.

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
    /// Option block problems: status 4041 / 4042 / 4043.
    #[error("unsupported option key {0}")]
    UnsupportedOptionKey(String),
    #[error("invalid option value for {0}")]
    InvalidOptionValue(String),
}

impl DecodeError {
    /// The Iggy status code to answer with.
    pub fn status(&self) -> u32 {
        todo!()
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
    LoginUser { version: ClientVersionInfo, username: String, password: String },
    LoginWithToken { version: ClientVersionInfo, token: String },
    // ---- operation 3 ----
    Logout,
    // ---- operation 2 (code at 196..200) ----
    Ping,
    GetStats,
    GetSnapshot { compression: u8, snapshot_types: Vec<u8> },
    GetClusterMetadata,
    DescribeOptions { scope: u8 },
    GetMe,
    GetClient { client_id: u32 },
    GetClients,
    GetUser { user: Identifier },
    GetUsers,
    GetPersonalAccessTokens,
    GetStream { stream: Identifier },
    GetStreams,
    GetTopic { stream: Identifier, topic: Identifier },
    GetTopics { stream: Identifier },
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
    FlushUnsavedBuffer { stream: Identifier, topic: Identifier, partition_id: u32, fsync: bool },
    GetConsumerOffset { consumer: Consumer, stream: Identifier, topic: Identifier, partition_id: Option<u32> },
    GetConsumerGroup { stream: Identifier, topic: Identifier, group: Identifier },
    GetConsumerGroups { stream: Identifier, topic: Identifier },
    SyncConsumerGroup { stream: Identifier, topic: Identifier, group: Identifier },
    // ---- replicated operations (128..=162) ----
    CreateStream { name: String, options: Vec<OptionEntry> },
    UpdateStream { stream: Identifier, name: String, options: Vec<OptionEntry> },
    DeleteStream { stream: Identifier },
    PurgeStream { stream: Identifier },
    CreateTopic { stream: Identifier, partitions_count: u32, name: String, options: Vec<OptionEntry> },
    UpdateTopic { stream: Identifier, topic: Identifier, name: String, options: Vec<OptionEntry> },
    DeleteTopic { stream: Identifier, topic: Identifier },
    PurgeTopic { stream: Identifier, topic: Identifier },
    CreatePartitions { stream: Identifier, topic: Identifier, partitions_count: u32 },
    DeletePartitions { stream: Identifier, topic: Identifier, partitions_count: u32 },
    DeleteSegments { stream: Identifier, topic: Identifier, partition_id: u32, segments_count: u32 },
    CreateConsumerGroup { stream: Identifier, topic: Identifier, name: String },
    DeleteConsumerGroup { stream: Identifier, topic: Identifier, group: Identifier },
    JoinConsumerGroup { stream: Identifier, topic: Identifier, group: Identifier },
    LeaveConsumerGroup { stream: Identifier, topic: Identifier, group: Identifier },
    CreateUser { username: String, password: String, status: u8, permissions: Option<Permissions> },
    UpdateUser { user: Identifier, username: Option<String>, status: Option<u8> },
    DeleteUser { user: Identifier },
    ChangePassword { user: Identifier, current_password: String, new_password: String },
    UpdatePermissions { user: Identifier, permissions: Option<Permissions> },
    CreatePersonalAccessToken { name: String, expiry: u64 },
    DeletePersonalAccessToken { name: String },
    SendMessages {
        stream: Identifier,
        topic: Identifier,
        partitioning: Partitioning,
        /// messages_count from the metadata section (must equal the batch header's count).
        messages_count: u32,
        /// The raw batch: 256-byte header + frames, exactly as sent. Validate with
        /// [`crate::batch::validate`] before use.
        batch: bytes::Bytes,
    },
    StoreConsumerOffset { consumer: Consumer, stream: Identifier, topic: Identifier, partition_id: Option<u32>, offset: u64 },
    DeleteConsumerOffset { consumer: Consumer, stream: Identifier, topic: Identifier, partition_id: Option<u32> },
}

impl Command {
    /// Decode a request. `operation` is header byte 176, `code` the u32 at 196..200 (only
    /// meaningful for operation 2), `body` the bytes after the 256-byte header.
    /// `body` is a `Bytes` so a SendMessages batch can be kept without a copy.
    pub fn decode(operation: u8, code: u32, body: bytes::Bytes) -> Result<Command, DecodeError> {
        let _ = (operation, code, body);
        todo!()
    }

    /// A short name for logs ("SendMessages", "CreateTopic", ...).
    pub fn name(&self) -> &'static str {
        todo!()
    }
}
