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
        let command = header[offset::COMMAND];
        if command != COMMAND_REQUEST {
            return Err(HeaderError::NotARequest { command });
        }
        // The size is checked before anything else is believed: it decides how many more
        // bytes the connection will read and buffer.
        let size = read_u32(header, offset::SIZE);
        if (size as usize) < HEADER_SIZE {
            return Err(HeaderError::SizeTooSmall { size });
        }
        if size > max_frame_bytes {
            return Err(HeaderError::SizeTooLarge {
                size,
                max: max_frame_bytes,
            });
        }
        let parsed = RequestHeader {
            client: read_u128(header, offset::REQUEST_CLIENT),
            request_checksum: read_u128(header, offset::REQUEST_CHECKSUM),
            request: read_u64(header, offset::REQUEST_ID),
            operation: header[offset::REQUEST_OPERATION],
            session: read_u64(header, offset::REQUEST_SESSION),
            code: read_u32(header, offset::REQUEST_CODE),
            size,
        };
        if parsed.client == 0 {
            return Err(HeaderError::Invalid("client id is 0"));
        }
        match parsed.operation {
            0 => Err(HeaderError::Invalid("operation is 0 (reserved)")),
            operation::REGISTER if parsed.session != 0 || parsed.request != 0 => {
                Err(HeaderError::Invalid("register needs session 0 and request 0"))
            }
            // Reads may come before login (the heartbeat Ping), so no session is required.
            operation::REGISTER | operation::NON_REPLICATED => Ok(parsed),
            _ if parsed.session == 0 || parsed.request == 0 => Err(HeaderError::Invalid(
                "replicated operations need a session and a request id",
            )),
            _ => Ok(parsed),
        }
    }

    /// Body length = size - 256.
    pub fn body_len(&self) -> usize {
        // `parse` guarantees size >= 256; saturate for hand-built values.
        (self.size as usize).saturating_sub(HEADER_SIZE)
    }
}

/// Build the reply header for `request` with the given status and body length.
/// Echoes request_checksum, client, request and operation; command = 8.
pub fn reply_header(request: &RequestHeader, status: u32, body_len: u32) -> [u8; HEADER_SIZE] {
    let mut header = [0u8; HEADER_SIZE];
    // A body that cannot be described by a u32 size is a caller bug; saturating keeps the
    // header well-formed rather than wrapping to a tiny size.
    let size = body_len.saturating_add(HEADER_SIZE as u32);
    put(&mut header, offset::SIZE, &size.to_le_bytes());
    header[offset::COMMAND] = COMMAND_REPLY;
    put(
        &mut header,
        offset::REPLY_CHECKSUM,
        &request.request_checksum.to_le_bytes(),
    );
    put(&mut header, offset::REPLY_CLIENT, &request.client.to_le_bytes());
    put(
        &mut header,
        offset::REPLY_REQUEST_ID,
        &request.request.to_le_bytes(),
    );
    // The echoed operation decides whether the client expects a result section.
    header[offset::REPLY_OPERATION] = request.operation;
    put(&mut header, offset::REPLY_STATUS, &status.to_le_bytes());
    header
}

/// Build an eviction frame (header only). `versions` = (max, min) only for reason 14.
pub fn eviction(client: u128, reason: EvictionReason, versions: Option<(u32, u32)>) -> [u8; HEADER_SIZE] {
    let mut header = [0u8; HEADER_SIZE];
    put(&mut header, offset::SIZE, &(HEADER_SIZE as u32).to_le_bytes());
    header[offset::COMMAND] = COMMAND_EVICTION;
    put(&mut header, offset::EVICTION_CLIENT, &client.to_le_bytes());
    // The client only trusts the version window for reason 14; elsewhere it must stay zero.
    if let (EvictionReason::IncompatibleProtocol, Some((max, min))) = (reason, versions) {
        put(&mut header, offset::EVICTION_VERSION_MAX, &max.to_le_bytes());
        put(&mut header, offset::EVICTION_VERSION_MIN, &min.to_le_bytes());
    }
    header[offset::EVICTION_REASON] = reason as u8;
    header
}

/// Does a successful reply to `operation` start with a result section (§5)?
/// Operation 1 only when the body is non-empty (the caller always sends a body for login).
pub fn is_result_framed(operation: u8) -> bool {
    // 138 (DeleteSegments) and 160 (SendMessages) are outside the client's metadata set.
    matches!(operation, 1 | 64..=68 | 128..=137 | 139..=149 | 161 | 162)
}

/// Byte offsets inside the 256-byte headers (§2.1-§2.4).
mod offset {
    pub const SIZE: usize = 48;
    pub const COMMAND: usize = 60;
    pub const REQUEST_CLIENT: usize = 128;
    pub const REQUEST_CHECKSUM: usize = 144;
    pub const REQUEST_ID: usize = 168;
    pub const REQUEST_OPERATION: usize = 176;
    pub const REQUEST_SESSION: usize = 184;
    pub const REQUEST_CODE: usize = 196;
    pub const REPLY_CHECKSUM: usize = 128;
    pub const REPLY_CLIENT: usize = 160;
    pub const REPLY_REQUEST_ID: usize = 200;
    pub const REPLY_OPERATION: usize = 208;
    pub const REPLY_STATUS: usize = 216;
    pub const EVICTION_CLIENT: usize = 128;
    pub const EVICTION_VERSION_MAX: usize = 144;
    pub const EVICTION_VERSION_MIN: usize = 148;
    pub const EVICTION_REASON: usize = 255;
}

// The header is a fixed-size array and every offset below is a constant well inside it, so
// these reads cannot fail; they copy into fixed arrays to stay free of panicking conversions.
fn read_array<const N: usize>(header: &[u8; HEADER_SIZE], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&header[at..at + N]);
    out
}

fn read_u32(header: &[u8; HEADER_SIZE], at: usize) -> u32 {
    u32::from_le_bytes(read_array(header, at))
}

fn read_u64(header: &[u8; HEADER_SIZE], at: usize) -> u64 {
    u64::from_le_bytes(read_array(header, at))
}

fn read_u128(header: &[u8; HEADER_SIZE], at: usize) -> u128 {
    u128::from_le_bytes(read_array(header, at))
}

fn put(header: &mut [u8; HEADER_SIZE], at: usize, bytes: &[u8]) {
    header[at..at + bytes.len()].copy_from_slice(bytes);
}
