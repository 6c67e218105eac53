//! A bounds-checked cursor over a request body.
//!
//! Every read checks the remaining length first and reports a [`DecodeError`] instead of
//! panicking, so a hostile or truncated body can never index out of range. Shared wire shapes
//! (Name, Identifier, Consumer, OptPart, Strategy, Partitioning, Permissions, option blocks)
//! are read here so every command decodes them the same way.

use crate::command::DecodeError;
use crate::types::{
    Consumer, GlobalPermissions, Identifier, OptionEntry, Partitioning, Permissions, PollingStrategy,
    StreamPermissions, TopicPermissions,
};

/// Longest Name / string identifier / TLV field the dialect allows.
const MAX_SHORT_FIELD: usize = 255;
/// Option block limits (§6.0): at most this many key/value pairs ...
pub(crate) const MAX_OPTION_PAIRS: usize = 1024;
/// ... and at most this many bytes.
pub(crate) const MAX_OPTION_BLOCK_BYTES: usize = 100_000;
/// TLV kinds defined by the dialect (1 Raw ..= 15 Float64).
const TLV_KIND_MAX: u8 = 15;
const TLV_KIND_STRING: u8 = 2;

pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    /// Bytes consumed so far.
    pub(crate) fn position(&self) -> usize {
        self.pos
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    /// Take `n` bytes, or fail without moving if fewer remain.
    pub(crate) fn bytes(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        let end = self.pos.checked_add(n).ok_or(DecodeError::Malformed(what))?;
        let slice = self.buf.get(self.pos..end).ok_or(DecodeError::Malformed(what))?;
        self.pos = end;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], DecodeError> {
        let slice = self.bytes(N, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(slice);
        Ok(out)
    }

    pub(crate) fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        Ok(self.array::<1>(what)?[0])
    }

    pub(crate) fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn u64(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn u128(&mut self, what: &'static str) -> Result<u128, DecodeError> {
        Ok(u128::from_le_bytes(self.array(what)?))
    }

    /// Everything left in the body (option blocks run to the end).
    pub(crate) fn rest(&mut self) -> &'a [u8] {
        let rest = self.buf.get(self.pos..).unwrap_or(&[]);
        self.pos = self.buf.len();
        rest
    }

    /// A fixed-layout body must be consumed exactly: trailing bytes mean the client and the
    /// server disagree about the layout, which is safer to refuse than to guess at.
    pub(crate) fn finish(&self) -> Result<(), DecodeError> {
        if self.remaining() == 0 {
            Ok(())
        } else {
            Err(DecodeError::Malformed("trailing bytes after the request body"))
        }
    }

    /// A 0/1 presence flag. Anything else is a layout error, not "present".
    pub(crate) fn flag(&mut self, what: &'static str) -> Result<bool, DecodeError> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(DecodeError::Malformed(what)),
        }
    }

    /// `[len u8][utf-8]` with len 0 allowed (passwords, tokens: their content rules belong to
    /// the server, the decoder only checks the layout).
    pub(crate) fn short_str(&mut self, what: &'static str) -> Result<String, DecodeError> {
        let len = usize::from(self.u8(what)?);
        let raw = self.bytes(len, what)?;
        utf8(raw, what)
    }

    /// `[len u32][utf-8]`.
    pub(crate) fn long_str(&mut self, what: &'static str) -> Result<String, DecodeError> {
        let len = usize::try_from(self.u32(what)?).map_err(|_| DecodeError::Malformed(what))?;
        let raw = self.bytes(len, what)?;
        utf8(raw, what)
    }

    /// `Name` = `[len u8][utf-8]`, len 1..=255.
    pub(crate) fn name(&mut self, what: &'static str) -> Result<String, DecodeError> {
        let len = usize::from(self.u8(what)?);
        if len == 0 {
            return Err(DecodeError::Malformed(what));
        }
        let raw = self.bytes(len, what)?;
        utf8(raw, what)
    }

    /// `Id` = `[kind u8][len u8][value]`. A truncated identifier is Malformed; a complete one
    /// with a bad kind, length or encoding is InvalidIdentifier (status 6).
    pub(crate) fn identifier(&mut self) -> Result<Identifier, DecodeError> {
        let kind = self.u8("identifier kind")?;
        let len = usize::from(self.u8("identifier length")?);
        let value = self.bytes(len, "identifier value")?;
        match kind {
            1 => {
                let raw: [u8; 4] = value.try_into().map_err(|_| DecodeError::InvalidIdentifier)?;
                Ok(Identifier::Numeric(u32::from_le_bytes(raw)))
            }
            2 if (1..=MAX_SHORT_FIELD).contains(&len) => std::str::from_utf8(value)
                .map(|s| Identifier::Name(s.to_owned()))
                .map_err(|_| DecodeError::InvalidIdentifier),
            _ => Err(DecodeError::InvalidIdentifier),
        }
    }

    /// `Consumer` = `[kind u8][Id]`, kind 1 consumer, 2 group.
    pub(crate) fn consumer(&mut self) -> Result<Consumer, DecodeError> {
        let kind = self.u8("consumer kind")?;
        let id = self.identifier()?;
        match kind {
            1 => Ok(Consumer::Consumer(id)),
            2 => Ok(Consumer::Group(id)),
            _ => Err(DecodeError::Malformed("consumer kind must be 1 or 2")),
        }
    }

    /// `OptPart` = `[flag u8][partition u32]`, always 5 bytes. With flag 0 the value is
    /// ignored (the client sends zeros there).
    pub(crate) fn optional_partition(&mut self) -> Result<Option<u32>, DecodeError> {
        let present = self.flag("partition flag must be 0 or 1")?;
        let partition_id = self.u32("partition id")?;
        Ok(present.then_some(partition_id))
    }

    /// `Strategy` = `[kind u8][value u64]`; the value only matters for Offset and Timestamp.
    pub(crate) fn polling_strategy(&mut self) -> Result<PollingStrategy, DecodeError> {
        let kind = self.u8("polling strategy kind")?;
        let value = self.u64("polling strategy value")?;
        match kind {
            1 => Ok(PollingStrategy::Offset(value)),
            2 => Ok(PollingStrategy::Timestamp(value)),
            3 => Ok(PollingStrategy::First),
            4 => Ok(PollingStrategy::Last),
            5 => Ok(PollingStrategy::Next),
            _ => Err(DecodeError::Malformed("polling strategy kind must be 1..=5")),
        }
    }

    /// `Partitioning` = `[kind u8][len u8][value]`: 1 balanced (len 0), 2 partition id
    /// (len 4), 3 messages key (len 1..=255).
    pub(crate) fn partitioning(&mut self) -> Result<Partitioning, DecodeError> {
        let kind = self.u8("partitioning kind")?;
        let len = usize::from(self.u8("partitioning length")?);
        let value = self.bytes(len, "partitioning value")?;
        match (kind, len) {
            (1, 0) => Ok(Partitioning::Balanced),
            (2, 4) => {
                let raw: [u8; 4] = value
                    .try_into()
                    .map_err(|_| DecodeError::Malformed("partition id must be 4 bytes"))?;
                Ok(Partitioning::PartitionId(u32::from_le_bytes(raw)))
            }
            (3, 1..) => Ok(Partitioning::MessagesKey(value.to_vec())),
            _ => Err(DecodeError::Malformed("invalid partitioning kind or length")),
        }
    }

    /// Permissions (§6.0), linked-list style: each stream and topic entry is followed by a
    /// "has next" byte. A bool is any non-zero byte, as in the SDK's decoder.
    pub(crate) fn permissions(&mut self) -> Result<Permissions, DecodeError> {
        const WHAT: &str = "truncated permissions";
        let g = self.array::<10>(WHAT)?;
        let global = GlobalPermissions {
            manage_servers: g[0] != 0,
            read_servers: g[1] != 0,
            manage_users: g[2] != 0,
            read_users: g[3] != 0,
            manage_streams: g[4] != 0,
            read_streams: g[5] != 0,
            manage_topics: g[6] != 0,
            read_topics: g[7] != 0,
            poll_messages: g[8] != 0,
            send_messages: g[9] != 0,
        };
        let mut streams = Vec::new();
        // Every loop iteration consumes bytes, so the body length bounds the work.
        let mut more_streams = self.u8(WHAT)? != 0;
        while more_streams {
            let stream_id = self.u32(WHAT)?;
            let s = self.array::<6>(WHAT)?;
            let mut topics = Vec::new();
            let mut more_topics = self.u8(WHAT)? != 0;
            while more_topics {
                let topic_id = self.u32(WHAT)?;
                let t = self.array::<4>(WHAT)?;
                topics.push((
                    topic_id,
                    TopicPermissions {
                        manage_topic: t[0] != 0,
                        read_topic: t[1] != 0,
                        poll_messages: t[2] != 0,
                        send_messages: t[3] != 0,
                    },
                ));
                more_topics = self.u8(WHAT)? != 0;
            }
            streams.push((
                stream_id,
                StreamPermissions {
                    manage_stream: s[0] != 0,
                    read_stream: s[1] != 0,
                    manage_topics: s[2] != 0,
                    read_topics: s[3] != 0,
                    poll_messages: s[4] != 0,
                    send_messages: s[5] != 0,
                    topics,
                },
            ));
            more_streams = self.u8(WHAT)? != 0;
        }
        Ok(Permissions { global, streams })
    }

    /// `[0]` (none) or `[1][len u32][Permissions]` where the permissions must fill `len`
    /// exactly: a length that disagrees with the content is a layout error.
    pub(crate) fn optional_permissions(&mut self) -> Result<Option<Permissions>, DecodeError> {
        if !self.flag("permissions flag must be 0 or 1")? {
            return Ok(None);
        }
        let len = usize::try_from(self.u32("permissions length")?)
            .map_err(|_| DecodeError::Malformed("permissions length"))?;
        let block = self.bytes(len, "permissions length exceeds the body")?;
        let mut inner = Reader::new(block);
        let permissions = inner.permissions()?;
        inner
            .finish()
            .map_err(|_| DecodeError::Malformed("permissions length does not match content"))?;
        Ok(Some(permissions))
    }
}

fn utf8(raw: &[u8], what: &'static str) -> Result<String, DecodeError> {
    std::str::from_utf8(raw)
        .map(str::to_owned)
        .map_err(|_| DecodeError::Malformed(what))
}

/// Decode a request option block (the bytes that run to the end of the body) into raw
/// key/value entries. Only the block's *shape* is checked here (§6.0): kinds 1..=15, field
/// lengths 1..=255, an even entry count, string keys in UTF-8, no duplicates, and the pair and
/// byte limits. Whether a key is supported is the server's decision, not the codec's.
pub(crate) fn option_block(block: &[u8]) -> Result<Vec<OptionEntry>, DecodeError> {
    if block.len() > MAX_OPTION_BLOCK_BYTES {
        return Err(DecodeError::Malformed("option block exceeds 100000 bytes"));
    }
    let mut reader = Reader::new(block);
    let mut entries: Vec<OptionEntry> = Vec::new();
    while reader.remaining() > 0 {
        if entries.len() >= MAX_OPTION_PAIRS {
            return Err(DecodeError::Malformed("option block exceeds 1024 pairs"));
        }
        let (key_kind, key) = tlv_field(&mut reader)?;
        if reader.remaining() == 0 {
            return Err(DecodeError::Malformed("option block has an odd number of fields"));
        }
        let (value_kind, value) = tlv_field(&mut reader)?;
        if key_kind != TLV_KIND_STRING {
            return Err(DecodeError::Malformed("option key must be a string"));
        }
        let key = utf8(key, "option key is not UTF-8")?;
        if entries.iter().any(|entry| entry.key == key) {
            return Err(DecodeError::Malformed("duplicate option key"));
        }
        entries.push(OptionEntry {
            key,
            value_kind,
            value: value.to_vec(),
        });
    }
    Ok(entries)
}

/// One `[kind u8][len u32][bytes]` field of a TLV block.
fn tlv_field<'a>(reader: &mut Reader<'a>) -> Result<(u8, &'a [u8]), DecodeError> {
    const WHAT: &str = "truncated option block";
    let kind = reader.u8(WHAT)?;
    if kind == 0 || kind > TLV_KIND_MAX {
        return Err(DecodeError::Malformed("option field kind must be 1..=15"));
    }
    let len = reader.u32(WHAT)?;
    let len = usize::try_from(len).map_err(|_| DecodeError::Malformed(WHAT))?;
    if !(1..=MAX_SHORT_FIELD).contains(&len) {
        return Err(DecodeError::Malformed("option field length must be 1..=255"));
    }
    Ok((kind, reader.bytes(len, WHAT)?))
}

impl Permissions {
    /// Decode one complete Permissions record (§6.0), as user requests and UserDetails replies
    /// carry it; bytes left after the record are an error.
    pub fn decode(bytes: &[u8]) -> Result<Permissions, DecodeError> {
        let mut reader = Reader::new(bytes);
        let permissions = reader.permissions()?;
        if reader.remaining() != 0 {
            return Err(DecodeError::Malformed("bytes after the permissions record"));
        }
        Ok(permissions)
    }
}
