//! A partition as a deterministic state machine: appends, consumer offsets, purges and
//! retention are ops applied in order (`docs/replication.md`, "The partition group").
//!
//! The machine holds what a partition's checkpoint (its manifest) records, never the data:
//! the next offset, the first retained offset, the purge generation, the stored consumer
//! offsets, and a digest chained over every committed stamped batch's header (whose batch
//! checksum covers every frame's checksum, so two replicas whose logs differ by a byte
//! disagree). The batches themselves live in the segment log, which is
//! the group's journal.
//!
//! Offsets are minted in [`StateMachine::prepare`], on the primary only, from the cursor of
//! the op before (the prepared head, not the commit point). The cursor holds the next offset
//! (low 64 bits) and the last stamped timestamp (high 64 bits): each batch of an append is
//! stamped with its base offset and the append timestamp, raised to the last one if lower
//! (requests from several lanes may be prepared out of their clock order, and timestamp
//! lookups need a monotonic log), and the cursor moves past its messages. Apply then checks
//! that every batch continues exactly where the committed log ends, at a timestamp not below
//! the last; one that does not was minted twice (or skipped), which only a bug can do: it is
//! refused, changes nothing, and is recorded as the machine's fault, which the shell must
//! treat as fatal for the partition (later appends are refused the same way).
//!
//! The session layer validates every batch (`cairn_wire::batch::validate`: checksums,
//! offset deltas, limits) before it submits an append; the machine re-checks only the layout
//! it relies on.
//!
//! Encodings (little-endian; every count and length bounded by the bytes present before
//! use):
//!
//! | operation | request body | prepare body | reply |
//! |---|---|---|---|
//! | [`OPERATION_APPEND`] | `timestamp_us u64, count u32, (len u32, batch)*` | the same, each batch stamped | `status u32, count u32, base_offset u64 *` |
//! | [`OPERATION_STORE_OFFSET`] | owner, `offset u64` | the same | `status u32` |
//! | [`OPERATION_DELETE_OFFSET`] | owner | the same | `status u32` |
//! | [`OPERATION_PURGE`] | `target u64` (the end offset to purge up to) | the same | `status u32` |
//! | [`OPERATION_TRIM`] | `below_offset u64` | the same | `status u32` |
//! | [`OPERATION_SKIP`] | `to_offset u64` | the same | `status u32` |
//!
//! An owner is `kind u8` (0 consumer id, 1 consumer name, 2 consumer group), then `id u32`,
//! or for a name `len u8` (1..=255) and its UTF-8 bytes.
//!
//! The snapshot: `magic "CRNP"`, `version u16`, `partition_id u32`, `next_offset u64`,
//! `start_offset u64`, `purge_generation u64`, `last_timestamp_us u64`, `data_digest u128`,
//! `count u32`, then `count` × (owner, `offset u64`) in owner order.

use bytes::{Bytes, BytesMut};
use cairn_vsr::replica::StateMachine;
use cairn_wire::batch::{self, BATCH_HEADER_SIZE};
use cairn_wire::codes;
use std::collections::{BTreeMap, HashMap, VecDeque};
use xxhash_rust::xxh3::Xxh3;

/// Append batches (a group of sends: one prepare, one barrier, one acknowledgement round).
pub const OPERATION_APPEND: u8 = 1;
/// Store a consumer's (or consumer group's) offset.
pub const OPERATION_STORE_OFFSET: u8 = 2;
/// Delete a stored offset.
pub const OPERATION_DELETE_OFFSET: u8 = 3;
/// Purge up to a target offset: the messages below it leave, offsets keep counting, stored
/// offsets are cleared. A purge whose target the log already starts at does nothing (a
/// retried purge never deletes what was appended after it).
pub const OPERATION_PURGE: u8 = 4;
/// Retention: messages below an offset leave (the shell deletes the sealed segments).
pub const OPERATION_TRIM: u8 = 5;
/// Skip offsets: minting resumes at a target above the log's end (at most [`OFFSET_LIMIT`]).
/// After an unclean stop in `relaxed` mode, offsets below the journal's durable reservation
/// may have been acknowledged and then lost with unsynced data; none of them may be handed
/// out again (durability contract, guarantee 2). A target at or below the end does nothing.
pub const OPERATION_SKIP: u8 = 6;

/// The reply status of an op that was applied.
pub const STATUS_OK: u32 = 0;

/// Most batches one append may carry (bounds the reply and the work of one op).
pub const APPEND_BATCHES_MAX: usize = 4096;

/// Most stored offsets one partition keeps (consumers, named consumers and groups together):
/// bounds the snapshot (at most 265 bytes an entry, about 17 MiB, well under the core's
/// snapshot limit). A store for a new owner beyond it is refused.
pub const OFFSETS_MAX: usize = 65_536;

/// The offsets, and purge generations, a partition may reach: far beyond any real log, and far
/// enough from `u64::MAX` that no sum of an offset and a batch's count overflows.
pub const OFFSET_LIMIT: u64 = 1 << 62;

const SNAPSHOT_MAGIC: u32 = u32::from_le_bytes(*b"CRNP");
const SNAPSHOT_VERSION: u16 = 1;

/// Whose offset.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Owner {
    Consumer(u32),
    /// 1..=255 bytes of UTF-8.
    ConsumerName(String),
    Group(u32),
}

/// What the machine holds: a partition's manifest without its segment list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PartitionState {
    /// Offsets below it are minted and committed.
    pub next_offset: u64,
    /// The first offset still retained (a purge or a trim moves it up).
    pub start_offset: u64,
    /// Purges so far: a transferred state with a lower one would bring purged messages back.
    pub purge_generation: u64,
    /// The timestamp of the last committed batch (append timestamps never go back).
    pub last_timestamp_us: u64,
    /// XXH3-128 chained over every committed stamped batch: the previous digest, then the
    /// batch's 256-byte header (its batch checksum covers every frame's checksum, and each
    /// frame's checksum its payload, all verified before the batch was taken in), so a
    /// payload is not hashed once more.
    pub data_digest: u128,
    pub offsets: BTreeMap<Owner, u64>,
}

impl PartitionState {
    /// What storing `offset` as `owner`'s would do: `Ok(true)` when it changes the state,
    /// `Ok(false)` when `owner` holds that offset already, `Err(status)` when the machine
    /// refuses it. As Iggy: an offset past the last message is refused (offset 0 of an empty
    /// partition is allowed); a new owner beyond [`OFFSETS_MAX`] is refused too. The one
    /// rule for the op's apply and for a shell that answers without an op.
    pub fn offset_store(&self, owner: &Owner, offset: u64) -> Result<bool, u32> {
        if offset > self.next_offset.saturating_sub(1) {
            return Err(codes::INVALID_OFFSET);
        }
        match self.offsets.get(owner) {
            Some(&stored) => Ok(stored != offset),
            None if self.offsets.len() >= OFFSETS_MAX => Err(codes::INVALID_COMMAND),
            None => Ok(true),
        }
    }

    /// Whether a purge up to `target` changes the state: messages to purge below it, or
    /// stored offsets to clear.
    pub fn purge_changes(&self, target: u64) -> bool {
        self.start_offset < target.min(self.next_offset) || !self.offsets.is_empty()
    }
}

/// How many of its newest batches a partition remembers by content ([`RecentBatches`]).
pub const RECENT_BATCHES_MAX: usize = 4096;

/// How long after its commit a batch sent again unchanged counts as a resend
/// ([`RecentBatches`]): far beyond the SDK producer's retries (three: at once, then a second
/// apart) and a reconnection, yet short enough that an application sending the same messages
/// again later stores them.
pub const RESEND_WINDOW_US: u64 = 120_000_000;

/// The content keys ([`batch::content_key`]) of a partition's newest committed batches, with
/// the base offset and append timestamp each got: what the primary checks a send against
/// before preparing it, so a resend of a batch that committed (its reply lost with a
/// connection, or in a failover) is answered with the offset it got instead of being stored a
/// second time. Every replica keeps it in memory as it applies appends, bounded to the newest
/// [`RECENT_BATCHES_MAX`]. It is not part of the snapshot: a reopened replica's shell reads
/// its newest committed batches back from its log
/// ([`PartitionMachine::remember_committed_batches`]), and one that installed a transferred
/// checkpoint does not know the batches the checkpoint covers.
#[derive(Debug, Clone, Default)]
pub struct RecentBatches {
    /// Keys in the order they were committed, oldest first.
    order: VecDeque<u128>,
    /// Per key: the base offset and the append timestamp (µs) of its batch.
    committed: HashMap<u128, (u64, u64)>,
}

impl RecentBatches {
    fn insert(&mut self, key: u128, base_offset: u64, timestamp_us: u64) {
        if let Some(entry) = self.committed.get_mut(&key) {
            // The same messages committed again (sent twice, the second before the first
            // committed, or after the window): the key keeps its place, with the newer batch.
            *entry = (base_offset, timestamp_us);
            return;
        }
        if self.order.len() >= RECENT_BATCHES_MAX
            && let Some(oldest) = self.order.pop_front()
        {
            self.committed.remove(&oldest);
        }
        self.order.push_back(key);
        self.committed.insert(key, (base_offset, timestamp_us));
        debug_assert_eq!(self.order.len(), self.committed.len());
        debug_assert!(self.order.len() <= RECENT_BATCHES_MAX);
    }

    /// The base offset the batch with content key `key` got, if it is among the newest and
    /// was committed at most [`RESEND_WINDOW_US`] before `now_us` (by the clock that stamps
    /// appends).
    pub fn base_offset(&self, key: u128, now_us: u64) -> Option<u64> {
        let &(base_offset, committed_at_us) = self.committed.get(&key)?;
        (now_us.saturating_sub(committed_at_us) <= RESEND_WINDOW_US).then_some(base_offset)
    }
}

/// The partition machine of one partition.
#[derive(Debug, Clone, Default)]
pub struct PartitionMachine {
    partition_id: u32,
    state: PartitionState,
    /// The first op that continued the log elsewhere than it ended (never cleared).
    fault: Option<String>,
    recent: RecentBatches,
}

impl PartitionMachine {
    pub fn new(partition_id: u32) -> PartitionMachine {
        PartitionMachine {
            partition_id,
            state: PartitionState::default(),
            fault: None,
            recent: RecentBatches::default(),
        }
    }

    pub fn state(&self) -> &PartitionState {
        &self.state
    }

    /// An op whose batches did not continue the committed log (a minting bug), if any.
    pub fn fault(&self) -> Option<&str> {
        self.fault.as_deref()
    }

    /// The newest batches this replica applied, by content.
    pub fn recent_batches(&self) -> &RecentBatches {
        &self.recent
    }

    /// Start [`RecentBatches`] over from `batches`: (content key, base offset, append
    /// timestamp) of batches the group committed, oldest first, as a reopened replica reads
    /// them back from its log. Only committed batches may be given: a batch taken for one
    /// is never stored again.
    pub fn remember_committed_batches(&mut self, batches: impl IntoIterator<Item = (u128, u64, u64)>) {
        let mut recent = RecentBatches::default();
        for (key, base_offset, timestamp_us) in batches {
            recent.insert(key, base_offset, timestamp_us);
        }
        self.recent = recent;
    }
}

/// How many bytes an append request of exactly one batch puts in front of it.
pub const APPEND_ONE_PREFIX_BYTES: usize = 16;

/// The bytes an append request of exactly one batch of `batch_len` bytes puts in front of it
/// ([`encode_append`]'s layout): a shell with room in front of a received batch writes them
/// there and hands the batch on without copying it.
pub fn append_one_prefix(timestamp_us: u64, batch_len: usize) -> [u8; APPEND_ONE_PREFIX_BYTES] {
    let batch_len = u32::try_from(batch_len).expect("a batch is bounded by limits.batch_bytes_max (u32)");
    let mut prefix = [0u8; APPEND_ONE_PREFIX_BYTES];
    prefix[..8].copy_from_slice(&timestamp_us.to_le_bytes());
    prefix[8..12].copy_from_slice(&1u32.to_le_bytes());
    prefix[12..].copy_from_slice(&batch_len.to_le_bytes());
    prefix
}

/// An append request: the batches of several sends, as the node's session layer validated
/// them, and the timestamp it stamps them with.
pub fn encode_append(timestamp_us: u64, batches: &[&[u8]]) -> Vec<u8> {
    assert!(batches.len() <= APPEND_BATCHES_MAX);
    let mut body = Vec::with_capacity(12 + batches.iter().map(|b| 4 + b.len()).sum::<usize>());
    body.extend_from_slice(&timestamp_us.to_le_bytes());
    body.extend_from_slice(&(batches.len() as u32).to_le_bytes());
    for batch in batches {
        let len = u32::try_from(batch.len()).expect("a batch is bounded by limits.batch_bytes_max (u32)");
        body.extend_from_slice(&len.to_le_bytes());
        body.extend_from_slice(batch);
    }
    body
}

/// Encode an owner, then `offset` if given: a store or delete request.
pub fn encode_offset_op(owner: &Owner, offset: Option<u64>) -> Vec<u8> {
    let mut body = Vec::new();
    match owner {
        Owner::Consumer(id) => {
            body.push(0);
            body.extend_from_slice(&id.to_le_bytes());
        }
        Owner::ConsumerName(name) => {
            body.push(1);
            let len = u8::try_from(name.len()).expect("a consumer name is 1..=255 bytes");
            body.push(len);
            body.extend_from_slice(name.as_bytes());
        }
        Owner::Group(id) => {
            body.push(2);
            body.extend_from_slice(&id.to_le_bytes());
        }
    }
    if let Some(offset) = offset {
        body.extend_from_slice(&offset.to_le_bytes());
    }
    body
}

/// A trim request: messages below `below_offset` leave.
pub fn encode_trim(below_offset: u64) -> Vec<u8> {
    below_offset.to_le_bytes().to_vec()
}

/// A skip request: minting resumes at `to_offset` if that is above the log's end.
pub fn encode_skip(to_offset: u64) -> Vec<u8> {
    to_offset.to_le_bytes().to_vec()
}

/// The offset a skip request or prepare names, if its body is one.
pub fn skip_target(body: &[u8]) -> Option<u64> {
    let mut reader = Reader::new(body);
    reader
        .u64()
        .filter(|_| reader.is_empty())
        .map(|to| to.min(OFFSET_LIMIT))
}

/// A purge request: messages below `target` (the end of the log when the purge was asked)
/// leave.
pub fn encode_purge(target: u64) -> Vec<u8> {
    target.to_le_bytes().to_vec()
}

/// The cursor a prepare carries: next offset (low 64 bits), last timestamp (high 64 bits).
pub fn cursor(next_offset: u64, last_timestamp_us: u64) -> u128 {
    u128::from(last_timestamp_us) << 64 | u128::from(next_offset)
}

/// The next offset and last timestamp of a cursor.
pub fn cursor_parts(cursor: u128) -> (u64, u64) {
    (cursor as u64, (cursor >> 64) as u64)
}

/// The base offsets of an applied append's batches, or its refusal status.
pub fn decode_append_reply(reply: &[u8]) -> Result<Vec<u64>, u32> {
    let mut reader = Reader::new(reply);
    let status = reader.u32().ok_or(codes::INVALID_FORMAT)?;
    if status != STATUS_OK {
        return Err(status);
    }
    let count = reader.u32().ok_or(codes::INVALID_FORMAT)? as usize;
    if count > APPEND_BATCHES_MAX {
        return Err(codes::INVALID_FORMAT);
    }
    (0..count)
        .map(|_| reader.u64().ok_or(codes::INVALID_FORMAT))
        .collect()
}

/// A reply's status.
pub fn reply_status(reply: &[u8]) -> u32 {
    Reader::new(reply).u32().unwrap_or(codes::INVALID_FORMAT)
}

/// A bounds-checked little-endian reader.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { bytes }
    }

    fn take(&mut self, len: usize) -> Option<&'a [u8]> {
        if len > self.bytes.len() {
            return None;
        }
        let (head, rest) = self.bytes.split_at(len);
        self.bytes = rest;
        Some(head)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|bytes| bytes[0])
    }

    fn u32(&mut self) -> Option<u32> {
        self.take(4)?.try_into().ok().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Option<u64> {
        self.take(8)?.try_into().ok().map(u64::from_le_bytes)
    }

    fn u128(&mut self) -> Option<u128> {
        self.take(16)?.try_into().ok().map(u128::from_le_bytes)
    }

    fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    fn owner(&mut self) -> Option<Owner> {
        match self.u8()? {
            0 => Some(Owner::Consumer(self.u32()?)),
            1 => {
                let len = usize::from(self.u8()?);
                if len == 0 {
                    return None;
                }
                let name = std::str::from_utf8(self.take(len)?).ok()?;
                Some(Owner::ConsumerName(name.to_string()))
            }
            2 => Some(Owner::Group(self.u32()?)),
            _ => None,
        }
    }
}

/// An append's batches, each checked for the layout the machine relies on (a whole header,
/// `batch_length` equal to its bytes, frames that tile it `message_count` times).
struct Append<'a> {
    timestamp_us: u64,
    batches: Vec<(&'a [u8], batch::BatchHeader)>,
}

/// An append prepare's timestamp and batches, if its body is an append the machine accepts
/// the layout of (what a log journal writes as batch records; anything else it journals
/// whole). [`encode_append`] of the same parts gives the body back.
pub fn append_parts(body: &[u8]) -> Option<(u64, Vec<&[u8]>)> {
    let append = decode_append(body)?;
    Some((
        append.timestamp_us,
        append.batches.iter().map(|(bytes, _)| *bytes).collect(),
    ))
}

/// What [`append_body_checksum`] hashes first, so its digest is never that of another rule.
const APPEND_CHECKSUM_DOMAIN: &[u8; 16] = b"cairn-append-v1\0";

/// The body checksum of an append prepare (`checksum_body`): XXH3-128 over a domain tag, the
/// body's timestamp and batch count, and each batch's length and 256-byte header, not its
/// messages. `None` when the body does not have that shape (such a prepare carries the plain
/// XXH3-128 of its body).
///
/// Why the headers stand for the whole body: a batch header's `batch_checksum` covers the
/// checksum of every message in it, and each message's checksum covers that message's bytes.
/// On the primary the messages were verified against their checksums when the send was
/// admitted (`cairn_wire::batch::validate`), so this costs no pass over them. Read back from
/// a segment log, each batch's bytes are those written because its record's checksum
/// verified; received from elsewhere, the messages must be verified against their checksums
/// before the prepare is trusted.
pub fn append_body_checksum(body: &[u8]) -> Option<u128> {
    let batches = append_batch_slices(body)?;
    let mut hasher = Xxh3::new();
    hasher.update(APPEND_CHECKSUM_DOMAIN);
    hasher.update(&body[..12]);
    for batch in batches {
        hasher.update(&(batch.len() as u32).to_le_bytes());
        hasher.update(batch.get(..BATCH_HEADER_SIZE)?);
    }
    Some(hasher.digest128())
}

/// An append body's batches by its length fields only (no look inside them): the prefix,
/// then exactly the batches it counts, each at least a header long, and nothing after them.
fn append_batch_slices(body: &[u8]) -> Option<Vec<&[u8]>> {
    let mut reader = Reader::new(body);
    let _timestamp_us = reader.u64()?;
    let count = reader.u32()? as usize;
    if count > APPEND_BATCHES_MAX || count > reader.bytes.len() / (4 + BATCH_HEADER_SIZE) {
        return None;
    }
    let mut batches = Vec::with_capacity(count);
    for _ in 0..count {
        let len = reader.u32()? as usize;
        let batch = reader.take(len)?;
        if batch.len() < BATCH_HEADER_SIZE {
            return None;
        }
        batches.push(batch);
    }
    reader.is_empty().then_some(batches)
}

/// [`StateMachine::body_verifies`] for a prepare read back from a segment log, whose batches'
/// bytes the log already verified against their records' checksums: an append's derived
/// checksum ([`append_body_checksum`]) is then checked without a second pass over the
/// messages. Otherwise the plain XXH3-128 of the body (every other op, and appends prepared
/// before the derived rule).
pub fn body_verifies_over_records(operation: u8, body: &[u8], checksum_body: u128) -> bool {
    (operation == OPERATION_APPEND && append_body_checksum(body) == Some(checksum_body))
        || xxhash_rust::xxh3::xxh3_128(body) == checksum_body
}

fn decode_append(body: &[u8]) -> Option<Append<'_>> {
    let mut reader = Reader::new(body);
    let timestamp_us = reader.u64()?;
    let count = reader.u32()? as usize;
    // Each batch takes a length and a whole header: a count the bytes cannot hold is refused
    // before anything is allocated for it.
    if count == 0 || count > APPEND_BATCHES_MAX || count > reader.bytes.len() / (4 + BATCH_HEADER_SIZE) {
        return None;
    }
    let mut batches = Vec::with_capacity(count);
    for _ in 0..count {
        let len = reader.u32()? as usize;
        let bytes = reader.take(len)?;
        let header = batch::check_layout(bytes).ok()?;
        if header.message_count == 0 {
            return None;
        }
        batches.push((bytes, header));
    }
    reader.is_empty().then_some(Append {
        timestamp_us,
        batches,
    })
}

fn status_reply(status: u32) -> Vec<u8> {
    status.to_le_bytes().to_vec()
}

impl StateMachine for PartitionMachine {
    /// An append's is derived from its batch headers ([`append_body_checksum`]) when it is
    /// an append `prepare` stamps (the layout `decode_append` accepts), whose messages the
    /// shell verified on admission (`cairn_wire::batch::validate`; asserted in debug builds,
    /// so a simulator sending unverified batches finds out). Anything else: the plain rule.
    fn body_checksum(&self, operation: u8, body: &[u8]) -> u128 {
        let derived = (operation == OPERATION_APPEND && decode_append(body).is_some())
            .then(|| append_body_checksum(body))
            .flatten();
        match derived {
            Some(checksum) => {
                debug_assert!(
                    append_batch_slices(body)
                        .is_some_and(|batches| batches.into_iter().all(batch::frames_verify)),
                    "an append reached prepare with messages that do not match their checksums"
                );
                checksum
            }
            None => xxhash_rust::xxh3::xxh3_128(body),
        }
    }

    /// An append's derived checksum holds and every batch's messages verify against their
    /// checksums (which the derived checksum covers); or the plain XXH3-128 of the body.
    fn body_verifies(operation: u8, body: &[u8], checksum_body: u128) -> bool {
        let derived = operation == OPERATION_APPEND
            && append_body_checksum(body) == Some(checksum_body)
            && append_batch_slices(body).is_some_and(|batches| batches.into_iter().all(batch::frames_verify));
        derived || xxhash_rust::xxh3::xxh3_128(body) == checksum_body
    }

    fn prepare(&self, _op: u64, _timestamp: u64, operation: u8, input: Bytes, cursor: u128) -> (Bytes, u128) {
        if operation == OPERATION_SKIP {
            // Minting continues from the target; apply moves the committed end the same way.
            let (next_offset, last_timestamp_us) = cursor_parts(cursor);
            let next = skip_target(&input).map_or(next_offset, |to| next_offset.max(to));
            return (input, self::cursor(next, last_timestamp_us));
        }
        if operation != OPERATION_APPEND {
            return (input, cursor);
        }
        let Some(append) = decode_append(&input) else {
            // Apply refuses it the same way on every replica; nothing is minted.
            return (input, cursor);
        };
        let (next_offset, last_timestamp_us) = cursor_parts(cursor);
        let messages: u64 = append
            .batches
            .iter()
            .map(|(_, header)| u64::from(header.message_count))
            .sum();
        if next_offset + messages > OFFSET_LIMIT {
            // Apply refuses it: nothing is minted.
            return (input, cursor);
        }
        let timestamp_us = append.timestamp_us.max(last_timestamp_us);
        let partition_id = u64::from(self.partition_id);
        // Every stamped header first (they are computed from the batches as received), then
        // written over the request: in place when the request is this call's alone, else
        // into one copy. Either way the bytes are the same.
        let mut stamped_headers = Vec::with_capacity(append.batches.len());
        let mut at = 12;
        let mut next = next_offset;
        for (bytes, header) in &append.batches {
            at += 4;
            let Some(stamped) = batch::stamped_header(bytes, partition_id, next, timestamp_us) else {
                // Unreachable: check_layout saw a whole header. Minting nothing is safe.
                return (input, cursor);
            };
            stamped_headers.push((at, stamped));
            at += bytes.len();
            next += u64::from(header.message_count);
        }
        debug_assert_eq!(at, input.len());
        drop(append);
        let mut body = input
            .try_into_mut()
            .unwrap_or_else(|shared| BytesMut::from(&shared[..]));
        body[..8].copy_from_slice(&timestamp_us.to_le_bytes());
        for (at, stamped) in stamped_headers {
            body[at..at + BATCH_HEADER_SIZE].copy_from_slice(&stamped);
        }
        (body.freeze(), self::cursor(next, timestamp_us))
    }

    fn apply(&mut self, op: u64, _timestamp: u64, operation: u8, input: &[u8]) -> Vec<u8> {
        match operation {
            OPERATION_APPEND => {
                let Some(append) = decode_append(input) else {
                    return status_reply(codes::INVALID_FORMAT);
                };
                let mut expected = self.state.next_offset;
                for (_, header) in &append.batches {
                    let minted_here = header.base_offset == expected
                        && header.partition_id == u64::from(self.partition_id)
                        && header.base_timestamp == append.timestamp_us
                        && append.timestamp_us >= self.state.last_timestamp_us;
                    if !minted_here {
                        let fault = format!(
                            "op {op} appends a batch at offset {} of partition {} stamped {} us, but the committed log of partition {} continues at {expected}, last stamped {} us: minted twice or skipped",
                            header.base_offset,
                            header.partition_id,
                            header.base_timestamp,
                            self.partition_id,
                            self.state.last_timestamp_us
                        );
                        self.fault.get_or_insert(fault);
                        return status_reply(codes::INVALID_COMMAND);
                    }
                    expected += u64::from(header.message_count);
                    if expected > OFFSET_LIMIT {
                        return status_reply(codes::INVALID_OFFSET);
                    }
                }
                let mut reply = Vec::with_capacity(8 + 8 * append.batches.len());
                reply.extend_from_slice(&STATUS_OK.to_le_bytes());
                reply.extend_from_slice(&(append.batches.len() as u32).to_le_bytes());
                for (bytes, header) in &append.batches {
                    let mut hasher = Xxh3::new();
                    hasher.update(&self.state.data_digest.to_le_bytes());
                    hasher.update(&bytes[..BATCH_HEADER_SIZE]);
                    self.state.data_digest = hasher.digest128();
                    reply.extend_from_slice(&header.base_offset.to_le_bytes());
                    if let Some(key) = batch::content_key(bytes) {
                        self.recent.insert(key, header.base_offset, append.timestamp_us);
                    }
                }
                self.state.next_offset = expected;
                self.state.last_timestamp_us = append.timestamp_us;
                reply
            }
            OPERATION_STORE_OFFSET => {
                let mut reader = Reader::new(input);
                let (Some(owner), Some(offset)) = (reader.owner(), reader.u64()) else {
                    return status_reply(codes::INVALID_FORMAT);
                };
                if !reader.is_empty() {
                    return status_reply(codes::INVALID_FORMAT);
                }
                if let Err(status) = self.state.offset_store(&owner, offset) {
                    return status_reply(status);
                }
                self.state.offsets.insert(owner, offset);
                status_reply(STATUS_OK)
            }
            OPERATION_DELETE_OFFSET => {
                let mut reader = Reader::new(input);
                let Some(owner) = reader.owner().filter(|_| reader.is_empty()) else {
                    return status_reply(codes::INVALID_FORMAT);
                };
                match self.state.offsets.remove(&owner) {
                    Some(_) => status_reply(STATUS_OK),
                    None => status_reply(codes::CONSUMER_OFFSET_NOT_FOUND),
                }
            }
            OPERATION_PURGE => {
                let mut reader = Reader::new(input);
                let Some(target) = reader.u64().filter(|_| reader.is_empty()) else {
                    return status_reply(codes::INVALID_FORMAT);
                };
                // Every stored offset goes; messages below the target, if any are left (a
                // purge of a partition whose messages are gone still clears its offsets).
                let target = target.min(self.state.next_offset);
                if self.state.start_offset < target {
                    self.state.start_offset = target;
                    self.state.purge_generation += 1;
                }
                self.state.offsets.clear();
                status_reply(STATUS_OK)
            }
            OPERATION_TRIM => {
                let mut reader = Reader::new(input);
                let Some(below) = reader.u64().filter(|_| reader.is_empty()) else {
                    return status_reply(codes::INVALID_FORMAT);
                };
                // Never past the end, never back.
                self.state.start_offset = self.state.start_offset.max(below.min(self.state.next_offset));
                status_reply(STATUS_OK)
            }
            OPERATION_SKIP => {
                let Some(to) = skip_target(input) else {
                    return status_reply(codes::INVALID_FORMAT);
                };
                self.state.next_offset = self.state.next_offset.max(to);
                status_reply(STATUS_OK)
            }
            _ => status_reply(codes::INVALID_COMMAND),
        }
    }

    fn snapshot(&self) -> Vec<u8> {
        let state = &self.state;
        let mut bytes = Vec::with_capacity(80 + 16 * state.offsets.len());
        bytes.extend_from_slice(&SNAPSHOT_MAGIC.to_le_bytes());
        bytes.extend_from_slice(&SNAPSHOT_VERSION.to_le_bytes());
        bytes.extend_from_slice(&self.partition_id.to_le_bytes());
        bytes.extend_from_slice(&state.next_offset.to_le_bytes());
        bytes.extend_from_slice(&state.start_offset.to_le_bytes());
        bytes.extend_from_slice(&state.purge_generation.to_le_bytes());
        bytes.extend_from_slice(&state.last_timestamp_us.to_le_bytes());
        bytes.extend_from_slice(&state.data_digest.to_le_bytes());
        bytes.extend_from_slice(&(state.offsets.len() as u32).to_le_bytes());
        for (owner, offset) in &state.offsets {
            bytes.extend_from_slice(&encode_offset_op(owner, Some(*offset)));
        }
        bytes
    }

    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String> {
        let mut reader = Reader::new(snapshot);
        let short = || "a partition snapshot ends early".to_string();
        if reader.u32() != Some(SNAPSHOT_MAGIC) {
            return Err("not a partition snapshot (magic)".to_string());
        }
        let version = reader
            .take(2)
            .map(|bytes| u16::from_le_bytes([bytes[0], bytes[1]]));
        if version != Some(SNAPSHOT_VERSION) {
            return Err(format!(
                "partition snapshot version {version:?}, this build reads {SNAPSHOT_VERSION}"
            ));
        }
        let partition_id = reader.u32().ok_or_else(short)?;
        let next_offset = reader.u64().ok_or_else(short)?;
        let start_offset = reader.u64().ok_or_else(short)?;
        let purge_generation = reader.u64().ok_or_else(short)?;
        let last_timestamp_us = reader.u64().ok_or_else(short)?;
        let data_digest = reader.u128().ok_or_else(short)?;
        let count = reader.u32().ok_or_else(short)?;
        if count as usize > OFFSETS_MAX {
            return Err(format!(
                "a partition snapshot with {count} stored offsets (at most {OFFSETS_MAX})"
            ));
        }
        if next_offset > OFFSET_LIMIT || purge_generation > OFFSET_LIMIT {
            return Err(format!(
                "a partition snapshot at offset {next_offset}, purge generation {purge_generation}: beyond {OFFSET_LIMIT}"
            ));
        }
        let mut offsets = BTreeMap::new();
        for _ in 0..count {
            let owner = reader.owner().ok_or_else(short)?;
            let offset = reader.u64().ok_or_else(short)?;
            if offsets.insert(owner, offset).is_some() {
                return Err("a partition snapshot names one owner twice".to_string());
            }
        }
        if !reader.is_empty() {
            return Err("a partition snapshot has bytes after its offsets".to_string());
        }
        if start_offset > next_offset {
            return Err(format!(
                "a partition snapshot starts at offset {start_offset}, past its end {next_offset}"
            ));
        }
        if partition_id != self.partition_id {
            return Err(format!(
                "a snapshot of partition {partition_id} offered to partition {}",
                self.partition_id
            ));
        }
        if purge_generation < self.state.purge_generation {
            // A stale offer: installing it would bring purged messages back.
            return Err(format!(
                "a snapshot of purge generation {purge_generation} offered to a partition at generation {}",
                self.state.purge_generation
            ));
        }
        self.state = PartitionState {
            next_offset,
            start_offset,
            purge_generation,
            last_timestamp_us,
            data_digest,
            offsets,
        };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_wire::batch::{MessageIn, encode};

    fn client_batch(messages: usize) -> Vec<u8> {
        let payloads: Vec<Vec<u8>> = (0..messages).map(|index| vec![index as u8; 10]).collect();
        let messages: Vec<MessageIn<'_>> = payloads
            .iter()
            .map(|payload| MessageIn {
                id: 1,
                origin_timestamp: 5,
                payload,
                user_headers: &[],
            })
            .collect();
        encode(&messages).expect("encodes")
    }

    /// Prepare on a primary at `cursor` with the node's clock at `now_us`, then apply on
    /// `machine`: the reply and the cursor after.
    fn append_at(
        machine: &mut PartitionMachine,
        op: u64,
        cursor: u128,
        now_us: u64,
        batches: &[&[u8]],
    ) -> (Vec<u8>, u128) {
        let request = Bytes::from(encode_append(now_us, batches));
        let (prepared, cursor) = machine.prepare(op, 0, OPERATION_APPEND, request, cursor);
        (machine.apply(op, 0, OPERATION_APPEND, &prepared), cursor)
    }

    fn append(machine: &mut PartitionMachine, op: u64, cursor: u128, batches: &[&[u8]]) -> (Vec<u8>, u128) {
        append_at(machine, op, cursor, 1_000, batches)
    }

    #[test]
    fn an_applied_batch_is_remembered_by_its_content_with_its_base_offset() {
        let mut machine = PartitionMachine::new(3);
        let (three, two) = (client_batch(3), client_batch(2));
        let (_, cursor) = append(&mut machine, 1, 0, &[&three, &two]);
        let key = |bytes: &[u8]| batch::content_key(bytes).expect("ids are set");
        // `append` stamps at 1 000 µs.
        let now = 1_000 + RESEND_WINDOW_US;
        assert_eq!(machine.recent_batches().base_offset(key(&three), now), Some(0));
        assert_eq!(machine.recent_batches().base_offset(key(&two), now), Some(3));
        assert_eq!(
            machine.recent_batches().base_offset(key(&two), now + 1),
            None,
            "sent again after the window: new messages"
        );
        let four = client_batch(4);
        assert_eq!(machine.recent_batches().base_offset(key(&four), now), None);
        append(&mut machine, 2, cursor, &[&four]);
        assert_eq!(machine.recent_batches().base_offset(key(&four), now), Some(5));
        // Not part of the state: a replica restored from a snapshot knows none.
        let mut restored = PartitionMachine::new(3);
        restored.restore(&machine.snapshot()).expect("restores");
        assert_eq!(restored.recent_batches().base_offset(key(&four), now), None);
    }

    #[test]
    fn recent_batches_keep_the_newest_and_a_key_committed_again_keeps_its_place() {
        let mut recent = RecentBatches::default();
        for key in 0..=RECENT_BATCHES_MAX as u128 {
            recent.insert(key, key as u64 * 10, 5);
        }
        assert_eq!(recent.base_offset(0, 5), None, "the oldest left");
        assert_eq!(recent.base_offset(1, 5), Some(10));
        recent.insert(1, 99, 5);
        assert_eq!(recent.base_offset(1, 5), Some(99));
        recent.insert(RECENT_BATCHES_MAX as u128 + 1, 7, 5);
        assert_eq!(recent.base_offset(1, 5), None, "it kept its place, the oldest");
        assert_eq!(recent.order.len(), RECENT_BATCHES_MAX);
        assert_eq!(recent.committed.len(), RECENT_BATCHES_MAX);
        assert!(
            recent.order.capacity() < 2 * RECENT_BATCHES_MAX,
            "it never grows past the bound"
        );
    }

    #[test]
    fn an_append_prepare_carries_a_checksum_of_its_batch_headers() {
        let machine = PartitionMachine::new(3);
        let (three, two) = (client_batch(3), client_batch(2));
        let request = Bytes::from(encode_append(1_000, &[&three, &two]));
        let (prepared, _) = machine.prepare(1, 0, OPERATION_APPEND, request, 0);
        let checksum = machine.body_checksum(OPERATION_APPEND, &prepared);
        assert_eq!(Some(checksum), append_body_checksum(&prepared));
        assert_ne!(checksum, xxhash_rust::xxh3::xxh3_128(&prepared));
        assert!(PartitionMachine::body_verifies(
            OPERATION_APPEND,
            &prepared,
            checksum
        ));
        assert!(body_verifies_over_records(OPERATION_APPEND, &prepared, checksum));
        // Checking every byte: a flipped message byte, prefix byte or header byte is caught.
        for at in [prepared.len() - 1, 3, 16 + 30] {
            let mut flipped = prepared.to_vec();
            flipped[at] ^= 1;
            assert!(
                !PartitionMachine::body_verifies(OPERATION_APPEND, &flipped, checksum),
                "byte {at}"
            );
        }
        // A message rewritten together with its own checksum: the batch checksum in the
        // stamped header (which the derived checksum covers) no longer matches.
        let mut rewritten = prepared.to_vec();
        let last_frame = rewritten.len() - (batch::FRAME_HEADER_SIZE + 10);
        let last = rewritten.len() - 1;
        rewritten[last] ^= 1;
        let frame_checksum = xxhash_rust::xxh3::xxh3_64(&rewritten[last_frame + 8..]);
        rewritten[last_frame..last_frame + 8].copy_from_slice(&frame_checksum.to_le_bytes());
        assert_eq!(
            append_body_checksum(&rewritten),
            Some(checksum),
            "the headers are as sealed"
        );
        assert!(!PartitionMachine::body_verifies(
            OPERATION_APPEND,
            &rewritten,
            checksum
        ));
        // Other ops, and appends sealed before the derived rule: the plain XXH3-128.
        let plain = xxhash_rust::xxh3::xxh3_128(&prepared);
        assert!(PartitionMachine::body_verifies(
            OPERATION_APPEND,
            &prepared,
            plain
        ));
        assert!(body_verifies_over_records(OPERATION_APPEND, &prepared, plain));
        let trim = encode_trim(5);
        let trim_checksum = machine.body_checksum(OPERATION_TRIM, &trim);
        assert_eq!(trim_checksum, xxhash_rust::xxh3::xxh3_128(&trim));
        assert!(PartitionMachine::body_verifies(
            OPERATION_TRIM,
            &trim,
            trim_checksum
        ));
        // A body the lengths do not describe gets the plain checksum.
        let mut cut = prepared.to_vec();
        cut.pop();
        assert_eq!(append_body_checksum(&cut), None);
        assert_eq!(
            machine.body_checksum(OPERATION_APPEND, &cut),
            xxhash_rust::xxh3::xxh3_128(&cut)
        );
    }

    #[test]
    fn the_prefix_of_a_one_batch_append_is_the_encoding_in_front_of_it() {
        let two = client_batch(2);
        let mut request = append_one_prefix(77, two.len()).to_vec();
        request.extend_from_slice(&two);
        assert_eq!(request, encode_append(77, &[&two]));
    }

    #[test]
    fn appends_mint_contiguous_offsets_from_the_cursor_and_stamp_the_batches() {
        let mut machine = PartitionMachine::new(3);
        let (three, two) = (client_batch(3), client_batch(2));
        let (reply, next) = append(&mut machine, 1, 0, &[&three, &two]);
        assert_eq!(decode_append_reply(&reply), Ok(vec![0, 3]));
        assert_eq!(cursor_parts(next), (5, 1_000));
        let (reply, next) = append(&mut machine, 2, next, &[&two]);
        assert_eq!(decode_append_reply(&reply), Ok(vec![5]));
        assert_eq!(cursor_parts(next), (7, 1_000));
        assert_eq!(machine.state().next_offset, 7);
        assert_eq!(machine.fault(), None);
        // The prepared body carries stamped batches: partition, base offset, timestamp.
        let request = Bytes::from(encode_append(2_000, &[&two]));
        let held = request.clone();
        let (prepared, _) = machine.prepare(3, 0, OPERATION_APPEND, request, next);
        let stamped = batch::header(&prepared[16..]).expect("a header");
        assert_eq!(
            (stamped.partition_id, stamped.base_offset, stamped.base_timestamp),
            (3, 7, 2_000)
        );
        assert_eq!(batch::compute_checksum(&prepared[16..]), stamped.batch_checksum);
        // A request someone else still holds is left as it was: the prepare is a copy.
        assert_eq!(&held[..], &encode_append(2_000, &[&two])[..]);
        // One nobody else holds is stamped in place, to the same bytes.
        let alone = Bytes::from(encode_append(2_000, &[&two]));
        let alone_at = alone.as_ptr();
        let (in_place, _) = machine.prepare(3, 0, OPERATION_APPEND, alone, next);
        assert_eq!(in_place.as_ptr(), alone_at, "stamped without a copy");
        assert_eq!(&in_place[..], &prepared[..]);
    }

    #[test]
    fn a_skip_moves_minting_forward_never_back() {
        let mut machine = PartitionMachine::new(3);
        let two = client_batch(2);
        let (_, next) = append(&mut machine, 1, 0, &[&two]);
        let skip = |machine: &mut PartitionMachine, op: u64, cursor: u128, to: u64| {
            let request = Bytes::from(encode_skip(to));
            let (prepared, cursor) = machine.prepare(op, 0, OPERATION_SKIP, request, cursor);
            (
                reply_status(&machine.apply(op, 0, OPERATION_SKIP, &prepared)),
                cursor,
            )
        };
        let (status, next) = skip(&mut machine, 2, next, 1_000);
        assert_eq!(
            (status, cursor_parts(next).0, machine.state().next_offset),
            (STATUS_OK, 1_000, 1_000)
        );
        // The next append continues at the target; a skip back does nothing.
        let (reply, next) = append(&mut machine, 3, next, &[&two]);
        assert_eq!(decode_append_reply(&reply), Ok(vec![1_000]));
        let (status, next) = skip(&mut machine, 4, next, 10);
        assert_eq!(
            (status, cursor_parts(next).0, machine.state().next_offset),
            (STATUS_OK, 1_002, 1_002)
        );
        assert_eq!(machine.fault(), None);
        // A malformed skip is refused and changes nothing.
        assert_eq!(
            reply_status(&machine.apply(5, 0, OPERATION_SKIP, &[1, 2, 3])),
            codes::INVALID_FORMAT
        );
        assert_eq!(machine.state().next_offset, 1_002);
    }

    #[test]
    fn timestamps_never_go_back_whatever_order_the_requests_are_prepared_in() {
        let mut machine = PartitionMachine::new(0);
        let batch = client_batch(1);
        let (_, next) = append_at(&mut machine, 1, 0, 5_000, &[&batch]);
        // A request built earlier on another lane, prepared after.
        let (reply, next) = append_at(&mut machine, 2, next, 4_000, &[&batch]);
        assert_eq!(decode_append_reply(&reply), Ok(vec![1]));
        assert_eq!(cursor_parts(next), (2, 5_000), "raised to the last timestamp");
        assert_eq!(machine.state().last_timestamp_us, 5_000);
        assert_eq!(machine.fault(), None);
    }

    #[test]
    fn an_append_that_does_not_continue_the_committed_log_is_refused_and_recorded() {
        let mut machine = PartitionMachine::new(0);
        let batch = client_batch(2);
        let (_, next) = append(&mut machine, 1, 0, &[&batch]);
        let before = machine.state().clone();
        // Minted again from 0 (a primary that forgot the op before).
        let (reply, _) = append(&mut machine, 2, 0, &[&batch]);
        assert_eq!(reply_status(&reply), codes::INVALID_COMMAND);
        assert_eq!(machine.state(), &before, "nothing changed");
        assert!(
            machine
                .fault()
                .is_some_and(|fault| fault.contains("minted twice"))
        );
        assert_eq!(cursor_parts(next).0, 2);
    }

    #[test]
    fn malformed_ops_are_refused_identically_and_change_nothing() {
        let mut machine = PartitionMachine::new(0);
        let before = machine.state().clone();
        let garbage = Bytes::from_static(&[1u8, 2, 3]);
        for operation in [
            OPERATION_APPEND,
            OPERATION_STORE_OFFSET,
            OPERATION_DELETE_OFFSET,
            OPERATION_PURGE,
            OPERATION_TRIM,
            99,
        ] {
            let (prepared, cursor) = machine.prepare(1, 0, operation, garbage.clone(), 4);
            assert_eq!((&prepared[..], cursor), (&garbage[..], 4), "nothing minted");
            assert_ne!(
                reply_status(&machine.apply(1, 0, operation, &prepared)),
                STATUS_OK
            );
        }
        // A batch whose length field lies about its bytes.
        let mut body = encode_append(1, &[&client_batch(1)]);
        body.truncate(body.len() - 1);
        assert_eq!(
            reply_status(&machine.apply(1, 0, OPERATION_APPEND, &body)),
            codes::INVALID_FORMAT
        );
        // A count of batches the bytes cannot hold.
        let mut claims_many = 7u64.to_le_bytes().to_vec();
        claims_many.extend_from_slice(&4096u32.to_le_bytes());
        assert_eq!(
            reply_status(&machine.apply(1, 0, OPERATION_APPEND, &claims_many)),
            codes::INVALID_FORMAT
        );
        assert_eq!(machine.state(), &before);
        assert_eq!(machine.fault(), None);
    }

    #[test]
    fn appends_that_would_pass_the_offset_limit_mint_nothing() {
        let machine = PartitionMachine::new(0);
        let request = Bytes::from(encode_append(1, &[&client_batch(3)]));
        let near_limit = cursor(OFFSET_LIMIT - 2, 0);
        let (prepared, after) = machine.prepare(1, 0, OPERATION_APPEND, request.clone(), near_limit);
        assert_eq!((&prepared[..], after), (&request[..], near_limit));
    }

    #[test]
    fn offsets_purges_and_trims() {
        let mut machine = PartitionMachine::new(0);
        let batch = client_batch(4);
        let named = Owner::ConsumerName("reader".to_string());
        // Nothing stored yet: only offset 0 may be stored (as Iggy).
        let above = encode_offset_op(&Owner::Consumer(1), Some(1));
        assert_eq!(
            reply_status(&machine.apply(1, 0, OPERATION_STORE_OFFSET, &above)),
            codes::INVALID_OFFSET
        );
        append(&mut machine, 2, 0, &[&batch]);
        for owner in [Owner::Consumer(1), named.clone(), Owner::Group(1)] {
            let reply = machine.apply(3, 0, OPERATION_STORE_OFFSET, &encode_offset_op(&owner, Some(3)));
            assert_eq!(reply_status(&reply), STATUS_OK);
        }
        let past_end = encode_offset_op(&Owner::Consumer(1), Some(4));
        assert_eq!(
            reply_status(&machine.apply(4, 0, OPERATION_STORE_OFFSET, &past_end)),
            codes::INVALID_OFFSET
        );
        let delete = encode_offset_op(&named, None);
        assert_eq!(
            reply_status(&machine.apply(5, 0, OPERATION_DELETE_OFFSET, &delete)),
            STATUS_OK
        );
        assert_eq!(
            reply_status(&machine.apply(6, 0, OPERATION_DELETE_OFFSET, &delete)),
            codes::CONSUMER_OFFSET_NOT_FOUND
        );
        machine.apply(7, 0, OPERATION_TRIM, &encode_trim(3));
        assert_eq!(machine.state().start_offset, 3);
        machine.apply(8, 0, OPERATION_TRIM, &encode_trim(1));
        assert_eq!(machine.state().start_offset, 3, "a trim never goes back");
        machine.apply(9, 0, OPERATION_TRIM, &encode_trim(100));
        assert_eq!(machine.state().start_offset, 4, "nor past the end");
        // Purge up to the end: the offsets keep counting, stored offsets are cleared.
        let (_, next) = append(&mut machine, 10, cursor(4, 1_000), &[&batch]);
        machine.apply(11, 0, OPERATION_PURGE, &encode_purge(8));
        let state = machine.state().clone();
        assert_eq!(
            (state.start_offset, state.next_offset, state.purge_generation),
            (8, 8, 1)
        );
        assert!(state.offsets.is_empty(), "a purge clears stored offsets");
        let (reply, _) = append(&mut machine, 12, next, &[&batch]);
        assert_eq!(decode_append_reply(&reply), Ok(vec![8]));
        // The same purge again (a retry) deletes nothing appended since.
        machine.apply(13, 0, OPERATION_PURGE, &encode_purge(8));
        assert_eq!(
            (machine.state().start_offset, machine.state().purge_generation),
            (8, 1)
        );
    }

    #[test]
    fn stored_offsets_are_bounded() {
        let mut machine = PartitionMachine::new(0);
        append(&mut machine, 1, 0, &[&client_batch(1)]);
        for id in 0..OFFSETS_MAX as u32 {
            let store = encode_offset_op(&Owner::Consumer(id), Some(0));
            assert_eq!(
                reply_status(&machine.apply(2, 0, OPERATION_STORE_OFFSET, &store)),
                STATUS_OK
            );
        }
        let one_more = encode_offset_op(&Owner::Group(1), Some(0));
        assert_eq!(
            reply_status(&machine.apply(3, 0, OPERATION_STORE_OFFSET, &one_more)),
            codes::INVALID_COMMAND
        );
        let existing = encode_offset_op(&Owner::Consumer(7), Some(0));
        assert_eq!(
            reply_status(&machine.apply(4, 0, OPERATION_STORE_OFFSET, &existing)),
            STATUS_OK
        );
        let mut restored = PartitionMachine::new(0);
        restored
            .restore(&machine.snapshot())
            .expect("a full table restores");
    }

    #[test]
    fn snapshots_restore_to_equal_state_and_stale_purge_generations_are_refused() {
        let mut machine = PartitionMachine::new(7);
        append(&mut machine, 1, 0, &[&client_batch(2)]);
        machine.apply(
            2,
            0,
            OPERATION_STORE_OFFSET,
            &encode_offset_op(&Owner::Group(4), Some(1)),
        );
        let old_snapshot = machine.snapshot();
        machine.apply(3, 0, OPERATION_PURGE, &encode_purge(2));
        let snapshot = machine.snapshot();

        let mut restored = PartitionMachine::new(7);
        restored.restore(&snapshot).expect("restores");
        assert_eq!(restored.state(), machine.state());
        assert_eq!(restored.snapshot(), snapshot);

        let refused = restored.restore(&old_snapshot).expect_err("a stale offer");
        assert!(refused.contains("purge generation"), "{refused}");
        assert_eq!(restored.state(), machine.state(), "a refusal changes nothing");
        assert!(
            PartitionMachine::new(8).restore(&snapshot).is_err(),
            "another partition's"
        );
        for len in 0..snapshot.len() {
            assert!(PartitionMachine::new(7).restore(&snapshot[..len]).is_err());
        }
        let mut other_version = snapshot.clone();
        other_version[4] ^= 1;
        assert!(PartitionMachine::new(7).restore(&other_version).is_err());
    }
}
