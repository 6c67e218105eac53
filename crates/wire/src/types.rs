//! Value types shared by requests and replies.

/// A stream/topic/group/user reference: numeric id or name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Identifier {
    /// Wire kind 1, value length 4.
    Numeric(u32),
    /// Wire kind 2, 1..=255 bytes of UTF-8.
    Name(String),
}

/// Who polls / owns an offset. Wire: `[kind u8][Identifier]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Consumer {
    /// Kind 1.
    Consumer(Identifier),
    /// Kind 2.
    Group(Identifier),
}

/// Poll strategy. Wire: `[kind u8][value u64]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PollingStrategy {
    Offset(u64),
    /// Append timestamp in µs since the Unix epoch.
    Timestamp(u64),
    First,
    Last,
    Next,
}

/// How a send picks its partition. Wire: `[kind u8][len u8][value]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Partitioning {
    Balanced,
    PartitionId(u32),
    /// 1..=255 bytes.
    MessagesKey(Vec<u8>),
}

/// One key/value entry of an option block (request side), values kept raw with their kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionEntry {
    pub key: String,
    /// TLV kind of the value (1..=15).
    pub value_kind: u8,
    pub value: Vec<u8>,
}

/// User permissions as on the wire (§6.0 Permissions).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Permissions {
    pub global: GlobalPermissions,
    pub streams: Vec<(u32, StreamPermissions)>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GlobalPermissions {
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

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamPermissions {
    pub manage_stream: bool,
    pub read_stream: bool,
    pub manage_topics: bool,
    pub read_topics: bool,
    pub poll_messages: bool,
    pub send_messages: bool,
    pub topics: Vec<(u32, TopicPermissions)>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopicPermissions {
    pub manage_topic: bool,
    pub read_topic: bool,
    pub poll_messages: bool,
    pub send_messages: bool,
}

impl std::fmt::Display for Identifier {
    /// The numeric id or the name, as the HTTP API and logs show it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Identifier::Numeric(id) => write!(f, "{id}"),
            Identifier::Name(name) => f.write_str(name),
        }
    }
}

/// TLV value kinds (§6.0) that option values use.
pub mod value_kind {
    pub const RAW: u8 = 1;
    pub const STRING: u8 = 2;
    pub const BOOL: u8 = 3;
    pub const UINT32: u8 = 11;
    pub const UINT64: u8 = 12;
}

/// The value of a String-kind option entry, or `None` for any other kind. Option values are
/// kept raw by the decoder; these helpers are how the server reads the kinds it supports.
pub fn option_str(entry: &OptionEntry) -> Option<&str> {
    (entry.value_kind == value_kind::STRING)
        .then(|| std::str::from_utf8(&entry.value).ok())
        .flatten()
}

/// The value of a Uint64-kind option entry (8 bytes, little-endian).
pub fn option_u64(entry: &OptionEntry) -> Option<u64> {
    if entry.value_kind != value_kind::UINT64 {
        return None;
    }
    entry.value.as_slice().try_into().ok().map(u64::from_le_bytes)
}

/// The value of a Uint32-kind option entry (4 bytes, little-endian).
pub fn option_u32(entry: &OptionEntry) -> Option<u32> {
    if entry.value_kind != value_kind::UINT32 {
        return None;
    }
    entry.value.as_slice().try_into().ok().map(u32::from_le_bytes)
}

/// The value of a Bool-kind option entry (one byte, any non-zero value is true).
pub fn option_bool(entry: &OptionEntry) -> Option<bool> {
    match (entry.value_kind, entry.value.as_slice()) {
        (value_kind::BOOL, [byte]) => Some(*byte != 0),
        _ => None,
    }
}
