//! Message batches (protocol reference §7.2-§7.4).
//!
//! A batch = 256-byte batch header + `message_count` frames (48-byte frame header, payload,
//! user headers). The server validates a batch on send ([`validate`]), stamps partition,
//! base offset and append timestamp ([`stamp`]), and on poll copies whole batches or a
//! sub-range ([`slice_into`]) with a recomputed header. Frames are never modified.

pub const BATCH_HEADER_SIZE: usize = 256;
pub const FRAME_HEADER_SIZE: usize = 48;

/// Admission limits, checked before anything is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchLimits {
    /// Max payload bytes per message (>= 1).
    pub message_payload_bytes_max: u32,
    /// Max user-header bytes per message.
    pub user_headers_bytes_max: u32,
    /// Max batch bytes (header + frames).
    pub batch_bytes_max: u32,
    /// Max messages per batch.
    pub batch_messages_max: u32,
}

/// Parsed batch header fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    pub partition_id: u64,
    pub base_offset: u64,
    pub base_timestamp: u64,
    pub origin_timestamp: u64,
    pub batch_length: u64,
    pub batch_checksum: u64,
    pub message_count: u32,
}

/// A send that fails validation. Each maps to one Iggy status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    /// 4027
    #[error("message {index}: checksum mismatch")]
    InvalidMessageChecksum { index: u32 },
    /// 4039
    #[error("batch checksum mismatch")]
    InvalidBatchChecksum,
    /// 4009: frames do not tile the batch, or their number differs from the counts.
    #[error("invalid messages count or layout: {0}")]
    InvalidMessagesCount(&'static str),
    /// 4024
    #[error("message {index}: empty payload")]
    EmptyPayload { index: u32 },
    /// 4022
    #[error("message {index}: payload of {bytes} bytes exceeds the limit of {max}")]
    PayloadTooBig { index: u32, bytes: u32, max: u32 },
    /// 4017
    #[error("message {index}: user headers of {bytes} bytes exceed the limit of {max}")]
    UserHeadersTooBig { index: u32, bytes: u32, max: u32 },
    /// 4036: batch longer than the limit.
    #[error("batch of {bytes} bytes exceeds the limit of {max}")]
    BatchTooBig { bytes: u64, max: u32 },
    /// 4023
    #[error("batch of {count} messages exceeds the limit of {max}")]
    TooManyMessages { count: u32, max: u32 },
    /// 4101: non-zero reserved bytes in the batch header or a frame header.
    #[error("non-zero reserved field")]
    InvalidReservedField,
    /// 4: the batch is shorter than its header, or lengths overflow.
    #[error("malformed batch: {0}")]
    Malformed(&'static str),
}

impl BatchError {
    pub fn status(&self) -> u32 {
        todo!()
    }
}

/// Read the batch header (no checks beyond length >= 256).
pub fn header(batch: &[u8]) -> Option<BatchHeader> {
    let _ = batch;
    todo!()
}

/// Fully validate a batch as received from a client: lengths, tiling, counts (both the
/// header's and `expected_count` from the request metadata), reserved bytes, limits, every
/// frame checksum, and the batch checksum (computed with the first three fields as sent).
pub fn validate(batch: &[u8], expected_count: u32, limits: &BatchLimits) -> Result<BatchHeader, BatchError> {
    let _ = (batch, expected_count, limits);
    todo!()
}

/// Stamp partition id, base offset and append timestamp into a validated batch and recompute
/// the batch checksum.
pub fn stamp(batch: &mut [u8], partition_id: u64, base_offset: u64, base_timestamp: u64) {
    let _ = (batch, partition_id, base_offset, base_timestamp);
    todo!()
}

/// The batch checksum over the header fields and every frame's 8-byte checksum (§7.3).
/// `batch` must have passed layout validation.
pub fn compute_checksum(batch: &[u8]) -> u64 {
    let _ = batch;
    todo!()
}

/// Append to `out` the messages of the stored (stamped) `batch` with offset >= `from_offset`,
/// at most `max_messages`. A whole batch is copied as is; a sub-range keeps base_offset,
/// base_timestamp and origin_timestamp, copies the chosen frames byte for byte and gets a new
/// message_count, batch_length and batch checksum. Returns the number of messages appended
/// (0 appends nothing).
pub fn slice_into(batch: &[u8], from_offset: u64, max_messages: u32, out: &mut Vec<u8>) -> u32 {
    let _ = (batch, from_offset, max_messages, out);
    todo!()
}
