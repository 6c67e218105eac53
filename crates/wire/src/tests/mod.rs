//! Tests for the whole crate. Byte vectors are built by hand from the protocol reference so
//! the codec is checked against the spec, not against itself.

mod batch;
mod command;
mod frame;
mod props;
mod reply;

use xxhash_rust::xxh3::xxh3_64;

/// A little-endian byte builder for hand-made request bodies.
#[derive(Default, Clone)]
pub(crate) struct B(pub Vec<u8>);

impl B {
    pub fn new() -> Self {
        B(Vec::new())
    }
    pub fn u8(mut self, v: u8) -> Self {
        self.0.push(v);
        self
    }
    pub fn u16(mut self, v: u16) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u128(mut self, v: u128) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn raw(mut self, v: &[u8]) -> Self {
        self.0.extend_from_slice(v);
        self
    }
    /// `Name` / u8-prefixed string.
    pub fn name(self, v: &str) -> Self {
        self.u8(v.len() as u8).raw(v.as_bytes())
    }
    /// `LStr`.
    pub fn lstr(self, v: &str) -> Self {
        self.u32(v.len() as u32).raw(v.as_bytes())
    }
    pub fn id_num(self, v: u32) -> Self {
        self.u8(1).u8(4).u32(v)
    }
    pub fn id_str(self, v: &str) -> Self {
        self.u8(2).name(v)
    }
    /// One TLV field `[kind][len u32][bytes]`.
    pub fn tlv(self, kind: u8, v: &[u8]) -> Self {
        self.u8(kind).u32(v.len() as u32).raw(v)
    }
    /// A string-keyed option pair.
    pub fn opt(self, key: &str, value_kind: u8, value: &[u8]) -> Self {
        self.tlv(2, key.as_bytes()).tlv(value_kind, value)
    }
    pub fn bytes(self) -> bytes::Bytes {
        bytes::Bytes::from(self.0)
    }
}

/// One message to put in a client-side batch.
#[derive(Debug, Clone)]
pub(crate) struct Msg {
    pub id: u128,
    pub origin_timestamp: u64,
    pub payload: Vec<u8>,
    pub user_headers: Vec<u8>,
}

/// Build a batch the way the 0.11.0 client does (§7.2, §7.3): first three header fields zero,
/// origin_timestamp = the minimum, frames with offset_delta = index, frame checksums over bytes
/// 8..end, and the batch checksum over the header fields and frame checksums.
pub(crate) fn client_batch(messages: &[Msg]) -> Vec<u8> {
    let origin = messages.iter().map(|m| m.origin_timestamp).min().unwrap_or(0);
    let mut frames = Vec::new();
    let mut frame_checksums = Vec::new();
    for (index, m) in messages.iter().enumerate() {
        let mut frame = B::new()
            .u64(0)
            .u128(m.id)
            .u32(index as u32)
            .u32((m.origin_timestamp - origin) as u32)
            .u32(m.user_headers.len() as u32)
            .u32(m.payload.len() as u32)
            .u64(0)
            .raw(&m.payload)
            .raw(&m.user_headers)
            .0;
        let checksum = xxh3_64(&frame[8..]);
        frame[..8].copy_from_slice(&checksum.to_le_bytes());
        frame_checksums.push(checksum);
        frames.extend_from_slice(&frame);
    }
    let batch_length = (256 + frames.len()) as u64;
    let mut head = B::new()
        .u64(0)
        .u64(0)
        .u64(0)
        .u64(origin)
        .u64(batch_length)
        .u64(0)
        .u32(messages.len() as u32)
        .0;
    head.resize(256, 0);
    let mut hashed = head[..40].to_vec();
    hashed.extend_from_slice(&head[48..52]);
    for c in &frame_checksums {
        hashed.extend_from_slice(&c.to_le_bytes());
    }
    let batch_checksum = xxh3_64(&hashed);
    head[40..48].copy_from_slice(&batch_checksum.to_le_bytes());
    head.extend_from_slice(&frames);
    head
}

/// The SendMessages body around a batch (§7.1).
pub(crate) fn send_body(metadata: B, messages_count: u32, batch: &[u8]) -> Vec<u8> {
    let metadata = metadata.u32(messages_count).0;
    B::new().u32(metadata.len() as u32).raw(&metadata).raw(batch).0
}

/// The two messages of the golden vector (§7.5).
pub(crate) fn golden_messages() -> Vec<Msg> {
    vec![
        Msg {
            id: 1,
            origin_timestamp: 1_000_000,
            payload: b"hello".to_vec(),
            user_headers: vec![],
        },
        Msg {
            id: 2,
            origin_timestamp: 1_000_010,
            payload: b"world!".to_vec(),
            user_headers: vec![],
        },
    ]
}

/// `ClientVersionInfo` as the 0.11.0 SDK sends it.
pub(crate) fn version_prefix() -> B {
    B::new().u32(0x2C00).name("rust-sdk").name("0.11.0")
}
