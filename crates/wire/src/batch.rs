//! Message batches (protocol reference §7.2-§7.4).
//!
//! A batch = 256-byte batch header + `message_count` frames (48-byte frame header, payload,
//! user headers). The server validates a batch on send ([`validate`]), stamps partition,
//! base offset and append timestamp ([`stamp`]), and on poll takes whole batches as stored or
//! a sub-range with a recomputed header ([`plan_take`], then [`slice_into`] or
//! [`cut_in_place`]). Frames are never modified.

use crate::codes;
use bytes::Bytes;
use xxhash_rust::xxh3;

/// A client batch in the buffer it arrived in, with the number of bytes in front of it in
/// that same buffer that the server may overwrite (`headroom`: the request's metadata,
/// already decoded). A shell can put an append request's prefix there and hand the batch on
/// without copying it. Dereferences to the batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivedBatch {
    /// Invariant: `headroom <= buffer.len()`.
    buffer: Bytes,
    headroom: usize,
}

impl ReceivedBatch {
    /// `buffer[headroom..]` is the batch; the bytes before it are free to overwrite.
    pub fn with_headroom(buffer: Bytes, headroom: usize) -> ReceivedBatch {
        assert!(headroom <= buffer.len(), "the headroom lies inside the buffer");
        ReceivedBatch { buffer, headroom }
    }

    /// How many bytes in front of the batch may be overwritten.
    pub fn headroom(&self) -> usize {
        self.headroom
    }

    /// The whole buffer and the headroom (the batch starts there).
    pub fn into_buffer(self) -> (Bytes, usize) {
        (self.buffer, self.headroom)
    }
}

impl From<Bytes> for ReceivedBatch {
    /// A batch with no room in front of it.
    fn from(batch: Bytes) -> ReceivedBatch {
        ReceivedBatch::with_headroom(batch, 0)
    }
}

impl From<Vec<u8>> for ReceivedBatch {
    fn from(batch: Vec<u8>) -> ReceivedBatch {
        ReceivedBatch::from(Bytes::from(batch))
    }
}

impl std::ops::Deref for ReceivedBatch {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.buffer[self.headroom..]
    }
}

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
    /// The Iggy status code to answer the send with.
    pub fn status(&self) -> u32 {
        match self {
            BatchError::InvalidMessageChecksum { .. } => codes::INVALID_MESSAGE_CHECKSUM,
            BatchError::InvalidBatchChecksum => codes::INVALID_BATCH_CHECKSUM,
            BatchError::InvalidMessagesCount(_) => codes::INVALID_MESSAGES_COUNT,
            BatchError::EmptyPayload { .. } => codes::EMPTY_MESSAGE_PAYLOAD,
            BatchError::PayloadTooBig { .. } => codes::TOO_BIG_MESSAGE_PAYLOAD,
            BatchError::UserHeadersTooBig { .. } => codes::TOO_BIG_USER_HEADERS,
            BatchError::BatchTooBig { .. } => codes::INVALID_MESSAGES_SIZE,
            BatchError::TooManyMessages { .. } => codes::TOO_MANY_MESSAGES,
            BatchError::InvalidReservedField => codes::INVALID_RESERVED_FIELD,
            BatchError::Malformed(_) => codes::INVALID_FORMAT,
        }
    }
}

/// Batch header field offsets (§7.2).
const PARTITION_ID_AT: usize = 0;
const BASE_OFFSET_AT: usize = 8;
const BASE_TIMESTAMP_AT: usize = 16;
const ORIGIN_TIMESTAMP_AT: usize = 24;
const BATCH_LENGTH_AT: usize = 32;
const BATCH_CHECKSUM_AT: usize = 40;
const MESSAGE_COUNT_AT: usize = 48;
const BATCH_RESERVED_AT: usize = 52;

/// Frame header field offsets (§7.3).
const FRAME_CHECKSUM_LEN: usize = 8;
const OFFSET_DELTA_AT: usize = 24;
const USER_HEADERS_LENGTH_AT: usize = 32;
const PAYLOAD_LENGTH_AT: usize = 36;
const FRAME_RESERVED_AT: usize = 40;

/// Read the batch header (no checks beyond length >= 256).
pub fn header(batch: &[u8]) -> Option<BatchHeader> {
    if batch.len() < BATCH_HEADER_SIZE {
        return None;
    }
    Some(BatchHeader {
        partition_id: read_u64(batch, PARTITION_ID_AT)?,
        base_offset: read_u64(batch, BASE_OFFSET_AT)?,
        base_timestamp: read_u64(batch, BASE_TIMESTAMP_AT)?,
        origin_timestamp: read_u64(batch, ORIGIN_TIMESTAMP_AT)?,
        batch_length: read_u64(batch, BATCH_LENGTH_AT)?,
        batch_checksum: read_u64(batch, BATCH_CHECKSUM_AT)?,
        message_count: read_u32(batch, MESSAGE_COUNT_AT)?,
    })
}

/// Fully validate a batch as received from a client: lengths, tiling, counts (both the
/// header's and `expected_count` from the request metadata), reserved bytes, limits, every
/// frame checksum, and the batch checksum (computed with the first three fields as sent).
///
/// The cheap checks (sizes, counts, reserved bytes, frame layout) all run before any byte is
/// hashed, so an oversized or badly laid out batch costs no hashing. Each frame's
/// `offset_delta` must equal its index: stored offsets are `base_offset + offset_delta`, and
/// the checksum forbids the server from rewriting a frame, so a batch with other deltas could
/// never be served with the offsets the server assigns.
pub fn validate(batch: &[u8], expected_count: u32, limits: &BatchLimits) -> Result<BatchHeader, BatchError> {
    let head = header(batch).ok_or(BatchError::Malformed("batch is shorter than its 256-byte header"))?;
    if batch.len() as u64 > u64::from(limits.batch_bytes_max) {
        return Err(BatchError::BatchTooBig {
            bytes: batch.len() as u64,
            max: limits.batch_bytes_max,
        });
    }
    if head.batch_length != batch.len() as u64 {
        return Err(BatchError::Malformed(
            "batch_length does not match the batch size",
        ));
    }
    if head.message_count > limits.batch_messages_max {
        return Err(BatchError::TooManyMessages {
            count: head.message_count,
            max: limits.batch_messages_max,
        });
    }
    if head.message_count != expected_count {
        return Err(BatchError::InvalidMessagesCount(
            "batch header and request metadata disagree on the count",
        ));
    }
    if head.message_count == 0 {
        return Err(BatchError::InvalidMessagesCount(
            "a batch must carry at least one message",
        ));
    }
    if !header_reserved_is_zero(batch) {
        return Err(BatchError::InvalidReservedField);
    }

    // Pass 1, no hashing: the frames must tile the batch and obey the limits.
    let mut frames_count = 0u32;
    let mut walker = FrameWalker::new(batch);
    for frame in walker.by_ref() {
        let index = frames_count;
        if index >= head.message_count {
            return Err(BatchError::InvalidMessagesCount("more frames than message_count"));
        }
        if !frame.reserved_is_zero {
            return Err(BatchError::InvalidReservedField);
        }
        if frame.payload_length == 0 {
            return Err(BatchError::EmptyPayload { index });
        }
        if frame.payload_length > limits.message_payload_bytes_max {
            return Err(BatchError::PayloadTooBig {
                index,
                bytes: frame.payload_length,
                max: limits.message_payload_bytes_max,
            });
        }
        if frame.user_headers_length > limits.user_headers_bytes_max {
            return Err(BatchError::UserHeadersTooBig {
                index,
                bytes: frame.user_headers_length,
                max: limits.user_headers_bytes_max,
            });
        }
        if frame.offset_delta != index {
            return Err(BatchError::InvalidMessagesCount(
                "offset_delta must equal the frame index",
            ));
        }
        // Cannot overflow: index < message_count <= u32::MAX.
        frames_count = index + 1;
    }
    if walker.overran {
        return Err(BatchError::InvalidMessagesCount(
            "a frame runs past the end of the batch",
        ));
    }
    if frames_count != head.message_count {
        return Err(BatchError::InvalidMessagesCount(
            "fewer frames than message_count",
        ));
    }

    // Pass 2: every frame checksum, feeding the batch checksum on the way (one walk, no
    // allocation; the layout is known good).
    let mut batch_hasher = BatchChecksum::new(batch);
    for (index, frame) in (0u32..).zip(FrameWalker::new(batch)) {
        let computed = batch
            .get(frame.start + FRAME_CHECKSUM_LEN..frame.end)
            .map(xxh3::xxh3_64);
        if computed.is_none() || computed != read_u64(batch, frame.start) {
            return Err(BatchError::InvalidMessageChecksum { index });
        }
        batch_hasher.add_frame(batch, &frame);
    }
    if batch_hasher.digest() != head.batch_checksum {
        return Err(BatchError::InvalidBatchChecksum);
    }
    Ok(head)
}

/// Whether a stored batch is whole: a header whose `batch_length` is its size, frames that
/// tile it `message_count` times, each frame's checksum that of its bytes, and the header's
/// batch checksum that of its fields and the frames' checksums. What ties a batch header to
/// every byte of its batch (a prepare's body checksum derived from batch headers relies on
/// it wherever the bytes have no checksum of their own).
pub fn frames_verify(batch: &[u8]) -> bool {
    let Some(head) = header(batch) else {
        return false;
    };
    if head.batch_length != batch.len() as u64 {
        return false;
    }
    let mut hasher = BatchChecksum::new(batch);
    let mut walker = FrameWalker::new(batch);
    let mut frames = 0u64;
    for frame in walker.by_ref() {
        let computed = batch
            .get(frame.start + FRAME_CHECKSUM_LEN..frame.end)
            .map(xxh3::xxh3_64);
        if computed.is_none() || computed != read_u64(batch, frame.start) {
            return false;
        }
        hasher.add_frame(batch, &frame);
        frames += 1;
    }
    !walker.overran && frames == u64::from(head.message_count) && hasher.digest() == head.batch_checksum
}

/// One message to encode into a client-format batch with [`encode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageIn<'a> {
    /// Kept as given (the server's callers mint a random id for 0 first, as the binary SDK does).
    pub id: u128,
    pub origin_timestamp: u64,
    pub payload: &'a [u8],
    pub user_headers: &'a [u8],
}

/// Encode messages as a client-format batch exactly as a 0.11 binary client would (§7.2-§7.3):
/// zero partition/offset/timestamp fields, `offset_delta` = index, frame checksums and the
/// batch checksum filled in. Used by transports that receive messages in another form (HTTP)
/// so their sends pass through the same [`validate`] as binary ones. No limit is checked here
/// (that is [`validate`]'s job); `None` only if a length or timestamp delta does not fit its
/// field, which no batch within the u32-bounded limits can reach.
pub fn encode(messages: &[MessageIn<'_>]) -> Option<Vec<u8>> {
    let origin = messages.iter().map(|m| m.origin_timestamp).min().unwrap_or(0);
    let total: usize = messages
        .iter()
        .map(|m| FRAME_HEADER_SIZE + m.payload.len() + m.user_headers.len())
        .sum();
    let mut bytes = vec![0u8; BATCH_HEADER_SIZE];
    bytes.reserve(total);
    for (index, m) in messages.iter().enumerate() {
        let start = bytes.len();
        bytes.extend_from_slice(&0u64.to_le_bytes());
        bytes.extend_from_slice(&m.id.to_le_bytes());
        bytes.extend_from_slice(&u32::try_from(index).ok()?.to_le_bytes());
        let delta = u32::try_from(m.origin_timestamp - origin).ok()?;
        bytes.extend_from_slice(&delta.to_le_bytes());
        bytes.extend_from_slice(&u32::try_from(m.user_headers.len()).ok()?.to_le_bytes());
        bytes.extend_from_slice(&u32::try_from(m.payload.len()).ok()?.to_le_bytes());
        bytes.extend_from_slice(&0u64.to_le_bytes());
        bytes.extend_from_slice(m.payload);
        bytes.extend_from_slice(m.user_headers);
        let checksum = xxh3::xxh3_64(&bytes[start + FRAME_CHECKSUM_LEN..]);
        write_u64(&mut bytes, start, checksum);
    }
    let batch_length = bytes.len() as u64;
    write_u64(&mut bytes, ORIGIN_TIMESTAMP_AT, origin);
    write_u64(&mut bytes, BATCH_LENGTH_AT, batch_length);
    let count = u32::try_from(messages.len()).ok()?;
    bytes[MESSAGE_COUNT_AT..MESSAGE_COUNT_AT + 4].copy_from_slice(&count.to_le_bytes());
    let checksum = compute_checksum(&bytes);
    write_u64(&mut bytes, BATCH_CHECKSUM_AT, checksum);
    Some(bytes)
}

/// One message of a stored or polled batch, as [`messages`] yields it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageOut<'a> {
    pub checksum: u64,
    pub id: u128,
    /// `base_offset + offset_delta`.
    pub offset: u64,
    /// The batch's append timestamp.
    pub timestamp: u64,
    /// `origin_timestamp + timestamp_delta`.
    pub origin_timestamp: u64,
    pub payload: &'a [u8],
    pub user_headers: &'a [u8],
}

/// The messages of a run of whole batches back to back (a poll reply body after its 16-byte
/// head), as a client derives them (§7.4). `None` if a batch or frame runs past the end.
pub fn messages(batches: &[u8]) -> Option<Vec<MessageOut<'_>>> {
    let mut out = Vec::new();
    let mut rest = batches;
    while !rest.is_empty() {
        let head = header(rest)?;
        let length = usize::try_from(head.batch_length).ok()?;
        let batch = rest.get(..length)?;
        let mut walker = FrameWalker::new(batch);
        for frame in walker.by_ref() {
            let payload_start = frame.start + FRAME_HEADER_SIZE;
            let payload_end = payload_start + frame.payload_length as usize;
            let id_bytes: [u8; 16] = batch.get(frame.start + 8..frame.start + 24)?.try_into().ok()?;
            let timestamp_delta = read_u32(batch, frame.start + 28)?;
            out.push(MessageOut {
                checksum: read_u64(batch, frame.start)?,
                id: u128::from_le_bytes(id_bytes),
                offset: head.base_offset.checked_add(u64::from(frame.offset_delta))?,
                timestamp: head.base_timestamp,
                origin_timestamp: head.origin_timestamp.saturating_add(u64::from(timestamp_delta)),
                payload: batch.get(payload_start..payload_end)?,
                user_headers: batch.get(payload_end..frame.end)?,
            });
        }
        if walker.overran {
            return None;
        }
        rest = &rest[length..];
    }
    Some(out)
}

/// Check the layout a reader relies on, without hashing: a full header, `batch_length` equal
/// to the slice length, zero reserved bytes (header and frames), and frames that tile the batch
/// exactly `message_count` times. This is what a strict client applies to a poll reply (§7.4),
/// so it is the invariant every stored and sliced batch keeps.
pub fn check_layout(batch: &[u8]) -> Result<BatchHeader, BatchError> {
    let head = header(batch).ok_or(BatchError::Malformed("batch is shorter than its 256-byte header"))?;
    if head.batch_length != batch.len() as u64 {
        return Err(BatchError::Malformed(
            "batch_length does not match the batch size",
        ));
    }
    if !header_reserved_is_zero(batch) {
        return Err(BatchError::InvalidReservedField);
    }
    let mut walker = FrameWalker::new(batch);
    let mut count: u64 = 0;
    for frame in walker.by_ref() {
        if !frame.reserved_is_zero {
            return Err(BatchError::InvalidReservedField);
        }
        count += 1;
    }
    if walker.overran {
        return Err(BatchError::InvalidMessagesCount(
            "a frame runs past the end of the batch",
        ));
    }
    if count != u64::from(head.message_count) {
        return Err(BatchError::InvalidMessagesCount(
            "frame count differs from message_count",
        ));
    }
    Ok(head)
}

/// What identifies a batch's messages across attempts to send it: XXH3-128 over its message
/// count and each frame's stored checksum, which covers the message's id, offset delta,
/// timestamp delta, user headers and payload (not the batch header, which the server stamps,
/// and which holds the origin timestamp the deltas count from). The
/// SDK's producer resends a batch whose reply it lost unchanged (ids are minted once, on the
/// client, before the first attempt), so a resend has the same key. `None` when a message has
/// id 0 (the client gave it no identity, so nothing may be taken for a resend of it) or the
/// frames do not tile `batch` (it must have passed layout validation).
pub fn content_key(batch: &[u8]) -> Option<u128> {
    let count = read_u32(batch, MESSAGE_COUNT_AT)?;
    let mut hasher = xxh3::Xxh3Default::new();
    hasher.update(&count.to_le_bytes());
    let mut walker = FrameWalker::new(batch);
    let mut frames = 0u32;
    for frame in walker.by_ref() {
        // The message id lies between the frame's checksum and its offset delta.
        let id = batch.get(frame.start + FRAME_CHECKSUM_LEN..frame.start + OFFSET_DELTA_AT)?;
        if id.iter().all(|&byte| byte == 0) {
            return None;
        }
        hasher.update(batch.get(frame.start..frame.start + FRAME_CHECKSUM_LEN)?);
        frames += 1;
    }
    (!walker.overran && frames == count && frames > 0).then(|| hasher.digest128())
}

/// Stamp partition id, base offset and append timestamp into a validated batch and recompute
/// the batch checksum.
pub fn stamp(batch: &mut [u8], partition_id: u64, base_offset: u64, base_timestamp: u64) {
    if let Some(head) = stamped_header(batch, partition_id, base_offset, base_timestamp) {
        batch[..BATCH_HEADER_SIZE].copy_from_slice(&head);
    }
}

/// The header [`stamp`] would give `batch`, without touching `batch`: partition id, base
/// offset and append timestamp written, the batch checksum recomputed over the new header
/// fields and the frames' stored checksums. The frames after the header are stored as they
/// are, so a writer can send this header and `batch[BATCH_HEADER_SIZE..]` to disk side by
/// side. `None` if `batch` is shorter than a header.
pub fn stamped_header(
    batch: &[u8],
    partition_id: u64,
    base_offset: u64,
    base_timestamp: u64,
) -> Option<[u8; BATCH_HEADER_SIZE]> {
    let mut head: [u8; BATCH_HEADER_SIZE] = batch.get(..BATCH_HEADER_SIZE)?.try_into().ok()?;
    write_u64(&mut head, PARTITION_ID_AT, partition_id);
    write_u64(&mut head, BASE_OFFSET_AT, base_offset);
    write_u64(&mut head, BASE_TIMESTAMP_AT, base_timestamp);
    let mut hasher = BatchChecksum::new(&head);
    for frame in FrameWalker::new(batch) {
        hasher.add_frame(batch, &frame);
    }
    write_u64(&mut head, BATCH_CHECKSUM_AT, hasher.digest());
    Some(head)
}

/// The batch checksum over the header fields and every frame's 8-byte checksum (§7.3).
/// `batch` must have passed layout validation.
pub fn compute_checksum(batch: &[u8]) -> u64 {
    let mut hasher = BatchChecksum::new(batch);
    for frame in FrameWalker::new(batch) {
        hasher.add_frame(batch, &frame);
    }
    hasher.digest()
}

/// What a poll takes from one stored batch: see [`plan_take`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Take {
    /// No message qualifies, or the batch is unreadable.
    Nothing,
    /// Every message: the batch goes out byte for byte.
    Whole { count: u32, last_offset: u64 },
    /// A run of frames (`frames`: byte range within the batch, contiguous) that needs a
    /// recomputed header ([`slice_into`], [`cut_in_place`]).
    Part {
        frames: std::ops::Range<usize>,
        count: u32,
        last_offset: u64,
    },
}

impl Take {
    /// Messages taken.
    pub fn count(&self) -> u32 {
        match self {
            Take::Nothing => 0,
            Take::Whole { count, .. } | Take::Part { count, .. } => *count,
        }
    }

    /// Offset of the last message taken.
    pub fn last_offset(&self) -> Option<u64> {
        match self {
            Take::Nothing => None,
            Take::Whole { last_offset, .. } | Take::Part { last_offset, .. } => Some(*last_offset),
        }
    }
}

/// Which messages of the stored (stamped) `batch` a poll takes: those with offset >=
/// `from_offset`, at most `max_messages`. One walk over the frame headers, no allocation.
///
/// A batch whose frames do not tile it exactly, whose frame count differs from its header, or
/// whose offsets do not increase is unreadable ([`Take::Nothing`]), so a damaged stored batch
/// can never produce a reply the client would reject.
pub fn plan_take(batch: &[u8], from_offset: u64, max_messages: u32) -> Take {
    let Some(head) = header(batch) else {
        return Take::Nothing;
    };
    if max_messages == 0 {
        return Take::Nothing;
    }
    let mut walker = FrameWalker::new(batch);
    let mut frames_count: u64 = 0;
    let mut count: u32 = 0;
    let mut first_start = 0;
    let mut chosen_end = 0;
    let mut last_offset = 0;
    let mut previous_offset = None;
    for frame in walker.by_ref() {
        frames_count += 1;
        let offset = head.base_offset.saturating_add(u64::from(frame.offset_delta));
        if previous_offset.is_some_and(|previous| offset <= previous) {
            return Take::Nothing;
        }
        previous_offset = Some(offset);
        if offset >= from_offset && count < max_messages {
            if count == 0 {
                first_start = frame.start;
            }
            count += 1;
            chosen_end = frame.end;
            last_offset = offset;
        }
    }
    if walker.overran || frames_count != u64::from(head.message_count) || count == 0 {
        return Take::Nothing;
    }
    if count == head.message_count {
        Take::Whole { count, last_offset }
    } else {
        Take::Part {
            frames: first_start..chosen_end,
            count,
            last_offset,
        }
    }
}

/// Append to `out` the messages of the stored (stamped) `batch` with offset >= `from_offset`,
/// at most `max_messages`. A whole batch is copied as is; a sub-range keeps base_offset,
/// base_timestamp and origin_timestamp, copies the chosen frames byte for byte and gets a new
/// message_count, batch_length and batch checksum. Returns the number of messages appended
/// (0 appends nothing). Unreadable batches append nothing (see [`plan_take`]).
pub fn slice_into(batch: &[u8], from_offset: u64, max_messages: u32, out: &mut Vec<u8>) -> u32 {
    match plan_take(batch, from_offset, max_messages) {
        Take::Nothing => 0,
        Take::Whole { count, .. } => {
            out.extend_from_slice(batch);
            count
        }
        Take::Part { frames, count, .. } => {
            let start = out.len();
            out.extend_from_slice(&batch[..BATCH_HEADER_SIZE]);
            out.extend_from_slice(&batch[frames]);
            finish_sliced_header(&mut out[start..], count);
            count
        }
    }
}

/// Apply `take` to the stored batch that is the tail of `buffer` from `batch_start` on, in
/// place: [`Take::Whole`] leaves it, [`Take::Nothing`] removes it, [`Take::Part`] moves the
/// chosen frames behind the header and recomputes the header as [`slice_into`] does. `take`
/// must come from [`plan_take`] on exactly that batch.
pub fn cut_in_place(buffer: &mut Vec<u8>, batch_start: usize, take: &Take) {
    match take {
        Take::Whole { .. } => {}
        Take::Nothing => buffer.truncate(batch_start),
        Take::Part { frames, count, .. } => {
            let frames_start = batch_start + frames.start;
            let frames_end = batch_start + frames.end;
            let header_end = batch_start + BATCH_HEADER_SIZE;
            buffer.copy_within(frames_start..frames_end, header_end);
            buffer.truncate(header_end + (frames_end - frames_start));
            finish_sliced_header(&mut buffer[batch_start..], *count);
        }
    }
}

/// Recompute the header of a sub-range batch (header + chosen frames, exactly `sliced`):
/// reserved bytes, batch_length, message_count and the batch checksum.
fn finish_sliced_header(sliced: &mut [u8], count: u32) {
    if sliced.len() < BATCH_HEADER_SIZE {
        return;
    }
    sliced[BATCH_RESERVED_AT..BATCH_HEADER_SIZE].fill(0);
    write_u64(sliced, BATCH_LENGTH_AT, sliced.len() as u64);
    sliced[MESSAGE_COUNT_AT..MESSAGE_COUNT_AT + 4].copy_from_slice(&count.to_le_bytes());
    let checksum = compute_checksum(sliced);
    write_u64(sliced, BATCH_CHECKSUM_AT, checksum);
}

/// Where one frame sits in its batch, and the header fields validation needs.
#[derive(Debug, Clone, Copy)]
struct Frame {
    /// Offset of the frame's first byte (its checksum) within the batch.
    start: usize,
    /// One past its last byte.
    end: usize,
    offset_delta: u32,
    user_headers_length: u32,
    payload_length: u32,
    reserved_is_zero: bool,
}

/// The offset of the last message in `batches`, a run of whole batches back to back (a poll
/// reply body after its 16-byte head). `None` if there is no message or a batch runs past the
/// end. Offsets are `base_offset + offset_delta`, so this is exact even when the run spans an
/// offset gap (the count of messages alone would not be).
pub fn last_offset(batches: &[u8]) -> Option<u64> {
    let mut rest = batches;
    let mut last = None;
    while !rest.is_empty() {
        let header = header(rest)?;
        let length = usize::try_from(header.batch_length).ok()?;
        let batch = rest.get(..length)?;
        if let Some(frame) = FrameWalker::new(batch).last() {
            last = Some(header.base_offset.checked_add(u64::from(frame.offset_delta))?);
        }
        rest = &rest[length..];
    }
    last
}

/// Walks the frames after the batch header. It stops at the end of the batch, or at the first
/// frame that would run past it (setting `overran`), so no frame it yields is out of bounds.
struct FrameWalker<'a> {
    batch: &'a [u8],
    position: usize,
    overran: bool,
}

impl<'a> FrameWalker<'a> {
    fn new(batch: &'a [u8]) -> Self {
        FrameWalker {
            batch,
            position: BATCH_HEADER_SIZE,
            overran: false,
        }
    }

    fn read_frame(&self) -> Option<Frame> {
        let start = self.position;
        let header = self.batch.get(start..start.checked_add(FRAME_HEADER_SIZE)?)?;
        let user_headers_length = read_u32(header, USER_HEADERS_LENGTH_AT)?;
        let payload_length = read_u32(header, PAYLOAD_LENGTH_AT)?;
        let body_len = u64::from(user_headers_length) + u64::from(payload_length);
        let end = usize::try_from(body_len)
            .ok()?
            .checked_add(start + FRAME_HEADER_SIZE)?;
        if end > self.batch.len() {
            return None;
        }
        Some(Frame {
            start,
            end,
            offset_delta: read_u32(header, OFFSET_DELTA_AT)?,
            user_headers_length,
            payload_length,
            reserved_is_zero: read_u64(header, FRAME_RESERVED_AT)? == 0,
        })
    }
}

impl Iterator for FrameWalker<'_> {
    type Item = Frame;

    fn next(&mut self) -> Option<Frame> {
        if self.overran || self.position >= self.batch.len() {
            return None;
        }
        match self.read_frame() {
            Some(frame) => {
                self.position = frame.end;
                Some(frame)
            }
            None => {
                self.overran = true;
                None
            }
        }
    }
}

/// Streaming XXH3-64 over batch bytes 0..40 (partition_id, base_offset, base_timestamp,
/// origin_timestamp, batch_length: consecutive u64 LE fields), message_count, then each
/// frame's stored checksum in order.
struct BatchChecksum {
    hasher: xxh3::Xxh3Default,
}

impl BatchChecksum {
    /// Start with the header fields of `head` (a batch, or just its header).
    fn new(head: &[u8]) -> BatchChecksum {
        let mut hasher = xxh3::Xxh3Default::new();
        hasher.update(head.get(..BATCH_CHECKSUM_AT).unwrap_or(&[]));
        hasher.update(head.get(MESSAGE_COUNT_AT..MESSAGE_COUNT_AT + 4).unwrap_or(&[]));
        BatchChecksum { hasher }
    }

    /// Add the stored checksum of `frame`, a frame of `batch`.
    fn add_frame(&mut self, batch: &[u8], frame: &Frame) {
        self.hasher.update(
            batch
                .get(frame.start..frame.start + FRAME_CHECKSUM_LEN)
                .unwrap_or(&[]),
        );
    }

    fn digest(&self) -> u64 {
        self.hasher.digest()
    }
}

/// Bytes 52..256 of the batch header: the client's decoder rejects anything but zeros.
fn header_reserved_is_zero(batch: &[u8]) -> bool {
    batch
        .get(BATCH_RESERVED_AT..BATCH_HEADER_SIZE)
        .is_some_and(|reserved| reserved.iter().all(|&b| b == 0))
}

fn read_u32(bytes: &[u8], at: usize) -> Option<u32> {
    let raw: [u8; 4] = bytes.get(at..at.checked_add(4)?)?.try_into().ok()?;
    Some(u32::from_le_bytes(raw))
}

fn read_u64(bytes: &[u8], at: usize) -> Option<u64> {
    let raw: [u8; 8] = bytes.get(at..at.checked_add(8)?)?.try_into().ok()?;
    Some(u64::from_le_bytes(raw))
}

/// Callers only write header fields after checking the batch holds a full header.
fn write_u64(bytes: &mut [u8], at: usize, value: u64) {
    if let Some(slot) = bytes.get_mut(at..at + 8) {
        slot.copy_from_slice(&value.to_le_bytes());
    }
}
