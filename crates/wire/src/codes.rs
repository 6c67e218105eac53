//! Iggy 0.11 error codes used by Cairn (the numeric values are the wire contract).

pub const OK: u32 = 0;
pub const ERROR: u32 = 1;
pub const INVALID_CONFIGURATION: u32 = 2;
pub const INVALID_COMMAND: u32 = 3;
pub const INVALID_FORMAT: u32 = 4;
pub const FEATURE_UNAVAILABLE: u32 = 5;
pub const INVALID_IDENTIFIER: u32 = 6;
pub const RESOURCE_NOT_FOUND: u32 = 20;
pub const UNAUTHENTICATED: u32 = 40;
pub const UNAUTHORIZED: u32 = 41;
pub const INVALID_CREDENTIALS: u32 = 42;
pub const INVALID_USERNAME: u32 = 43;
pub const INVALID_PASSWORD: u32 = 44;
pub const USER_ALREADY_EXISTS: u32 = 46;
pub const USER_INACTIVE: u32 = 47;
pub const PAT_ALREADY_EXISTS: u32 = 51;
pub const INVALID_PAT: u32 = 53;
pub const PAT_EXPIRED: u32 = 54;
pub const CLIENT_NOT_FOUND: u32 = 100;
pub const STREAM_ID_NOT_FOUND: u32 = 1009;
pub const STREAM_NAME_NOT_FOUND: u32 = 1010;
pub const STREAM_NAME_ALREADY_EXISTS: u32 = 1012;
pub const INVALID_STREAM_NAME: u32 = 1013;
pub const INVALID_STREAM_ID: u32 = 1014;
pub const TOPIC_ID_NOT_FOUND: u32 = 2010;
pub const TOPIC_NAME_NOT_FOUND: u32 = 2011;
pub const TOPIC_NAME_ALREADY_EXISTS: u32 = 2013;
pub const INVALID_TOPIC_NAME: u32 = 2014;
pub const INVALID_TOPIC_ID: u32 = 2016;
pub const INVALID_PARTITIONS_COUNT: u32 = 2019;
pub const PARTITION_NOT_FOUND: u32 = 3007;
pub const NO_PARTITIONS: u32 = 3008;
pub const CONSUMER_OFFSET_NOT_FOUND: u32 = 3021;
pub const INVALID_MESSAGES_COUNT: u32 = 4009;
pub const TOO_BIG_USER_HEADERS: u32 = 4017;
pub const TOO_BIG_MESSAGE_PAYLOAD: u32 = 4022;
pub const EMPTY_MESSAGE_PAYLOAD: u32 = 4024;
pub const INVALID_MESSAGE_PAYLOAD_LENGTH: u32 = 4025;
pub const INVALID_MESSAGE_CHECKSUM: u32 = 4027;
pub const INVALID_MESSAGE_TIMESTAMP_DELTA: u32 = 4038;
pub const INVALID_BATCH_CHECKSUM: u32 = 4039;
pub const UNSUPPORTED_OPTION_KEY: u32 = 4041;
pub const INVALID_OPTION_VALUE: u32 = 4042;
pub const INVALID_OFFSET: u32 = 4100;
pub const INVALID_RESERVED_FIELD: u32 = 4101;
pub const CONSUMER_GROUP_ID_NOT_FOUND: u32 = 5000;
pub const CONSUMER_GROUP_NAME_NOT_FOUND: u32 = 5003;
pub const CONSUMER_GROUP_NAME_ALREADY_EXISTS: u32 = 5004;
pub const CONSUMER_GROUP_MEMBER_NOT_FOUND: u32 = 5006;
pub const INVALID_SESSION: u32 = 14001;
/// The request may or may not have committed: the SDK sends it again unchanged on the same
/// connection (a partition recognises the resend by its batch's content).
pub const TRANSIENT_NOT_COMMITTED: u32 = 57;
pub const TRANSIENT_NOT_ACCEPTED: u32 = 58;
pub const TOO_MANY_MESSAGES: u32 = 4023;
pub const INVALID_MESSAGES_SIZE: u32 = 4036;
pub const UNSUPPORTED_HEADER_KIND: u32 = 4040;
pub const OPTIONS_BLOCK_TOO_LARGE: u32 = 4043;
pub const INVALID_USER_STATUS: u32 = 45;
/// The root user cannot be deleted.
pub const CANNOT_DELETE_USER: u32 = 48;
/// Root's permissions and status cannot be changed.
pub const CANNOT_CHANGE_PERMISSIONS: u32 = 49;
pub const INVALID_PAT_NAME: u32 = 50;
pub const PAT_LIMIT_REACHED: u32 = 52;
pub const USERS_LIMIT_REACHED: u32 = 55;
/// `CannotOpenPartitionLogFile`: Cairn answers it for a partition refused at boot (damage)
/// or stopped after a failed barrier. The 0.11 SDK does not retry it.
pub const CANNOT_OPEN_PARTITION_LOG_FILE: u32 = 3003;
/// `CannotSaveMessagesToSegment`: a send's write failed and was cut back cleanly.
pub const CANNOT_SAVE_MESSAGES_TO_SEGMENT: u32 = 4006;
pub const INVALID_CONSUMER_GROUP_NAME: u32 = 5005;
/// The 0.11 client re-syncs (606) and retries.
pub const CONSUMER_GROUP_PARTITION_NOT_OWNED: u32 = 5009;
/// `CannotSyncFile`: a barrier failed; the send was not acknowledged.
pub const CANNOT_SYNC_FILE: u32 = 10009;
/// Not sent to clients: the handler's marker for a frame of an unsupported protocol version,
/// which the TCP shell answers with an IncompatibleProtocol eviction (reason 14).
pub const INCOMPATIBLE_PROTOCOL_MARKER: u32 = 14003;
