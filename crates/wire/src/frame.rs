//! The 256-byte frame headers (protocol reference §2).
//!
//! Every frame = 256-byte header + body, `size` (u32 at 48) = 256 + body length.
//! [`RequestHeader::parse`] is the cheap check that runs before a body is read: it bounds
//! `size` against the configured maximum so an oversized frame is refused before any
//! allocation.

pub const HEADER_SIZE: usize = 256;
/// Header byte 60 values.
pub const COMMAND_REQUEST: u8 = 5;
pub const COMMAND_REPLY: u8 = 8;
pub const COMMAND_EVICTION: u8 = 13;

/// Operation bytes (header byte 176 in requests, echoed at 208 in replies).
pub mod operation {
    pub const REGISTER: u8 = 1;
    pub const NON_REPLICATED: u8 = 2;
    pub const LOGOUT: u8 = 3;
    pub const DELETE_SEGMENTS: u8 = 138;
    pub const SEND_MESSAGES: u8 = 160;
}

/// Protocol versions this server accepts in a login (any 0.11.x).
pub const PROTOCOL_VERSION_MIN: u32 = 0x2C00;
pub const PROTOCOL_VERSION_MAX: u32 = 0x2FFF;
/// What the server reports as its own protocol version.
pub const SERVER_PROTOCOL_VERSION: u32 = 0x2C00;

/// Eviction reasons (byte 255 of an eviction frame).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum EvictionReason {
    NoSession = 1,
    InvalidRequestOperation = 4,
    InvalidRequestBody = 5,
    InvalidRequestBodySize = 6,
    InvalidCredentials = 9,
    InvalidToken = 10,
    UserInactive = 11,
    IncompatibleProtocol = 14,
    MalformedLogin = 15,
}

/// The fields of a request header the server uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    /// 128..144, echoed in replies at 160.
    pub client: u128,
    /// 144..160, echoed in replies at 128.
    pub request_checksum: u128,
    /// 168..176, echoed in replies at 200.
    pub request: u64,
    /// 176.
    pub operation: u8,
    /// 184..192.
    pub session: u64,
    /// 196..200, meaningful only for operation 2.
    pub code: u32,
    /// 48..52: 256 + body length.
    pub size: u32,
}

/// Why a header was refused. The connection answers with an eviction or closes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("frame size {size} is smaller than the 256-byte header")]
    SizeTooSmall { size: u32 },
    #[error("frame size {size} exceeds the limit of {max} bytes")]
    SizeTooLarge { size: u32, max: u32 },
    #[error("header command byte {command} is not a request (5)")]
    NotARequest { command: u8 },
    #[error("invalid header: {0}")]
    Invalid(&'static str),
}

impl RequestHeader {
    /// Parse and check a request header. `max_frame_bytes` bounds `size` (header included).
    /// Applies the codec's rules: client != 0, operation != 0, Register needs session 0 and
    /// request 0, operations other than 1 and 2 need session > 0 and request > 0.
    pub fn parse(header: &[u8; HEADER_SIZE], max_frame_bytes: u32) -> Result<RequestHeader, HeaderError> {
        let _ = (header, max_frame_bytes);
        todo!()
    }

    /// Body length = size - 256.
    pub fn body_len(&self) -> usize {
        self.size as usize - HEADER_SIZE
    }
}

/// Build the reply header for `request` with the given status and body length.
/// Echoes request_checksum, client, request and operation; command = 8.
pub fn reply_header(request: &RequestHeader, status: u32, body_len: u32) -> [u8; HEADER_SIZE] {
    let _ = (request, status, body_len);
    todo!()
}

/// Build an eviction frame (header only). `versions` = (max, min) only for reason 14.
pub fn eviction(client: u128, reason: EvictionReason, versions: Option<(u32, u32)>) -> [u8; HEADER_SIZE] {
    let _ = (client, reason, versions);
    todo!()
}

/// Does a successful reply to `operation` start with a result section (§5)?
/// Operation 1 only when the body is non-empty (the caller always sends a body for login).
pub fn is_result_framed(operation: u8) -> bool {
    let _ = operation;
    todo!()
}
