//! A partition as a deterministic state machine: appends, consumer offsets, purges and
//! retention are ops applied in order (`docs/replication.md`, "The partition group").
//!
//! The machine holds what a partition's checkpoint (its manifest) records, never the data:
//! the next offset, the first retained offset, the purge generation, the stored consumer
//! offsets, and a digest chained over every committed stamped batch (so two replicas whose
//! logs differ by a byte disagree). The batches themselves live in the segment log, which is
//! the group's journal.
//!
//! Offsets are minted in [`StateMachine::prepare`], on the primary only, from the cursor of
//! the op before (the prepared head, not the commit point): each batch of an append is
//! stamped with its base offset and the append timestamp, and the cursor moves past its
//! messages. Apply then checks that every batch continues exactly where the committed log
//! ends; one that does not was minted twice (or skipped), which only a bug can do: it is
//! refused, changes nothing, and is recorded as the machine's fault.
//!
//! Encodings (little-endian; every count and length bounded by the bytes present before
//! use):
//!
//! | operation | request body | prepare body | reply |
//! |---|---|---|---|
//! | [`OPERATION_APPEND`] | `timestamp_us u64, count u32, (len u32, batch)*` | the same, each batch stamped | `status u32, count u32, base_offset u64 *` |
//! | [`OPERATION_STORE_OFFSET`] | owner, `offset u64` | the same | `status u32` |
//! | [`OPERATION_DELETE_OFFSET`] | owner | the same | `status u32` |
//! | [`OPERATION_PURGE`] | empty | the same | `status u32` |
//! | [`OPERATION_TRIM`] | `below_offset u64` | the same | `status u32` |
//!
//! An owner is `kind u8` (0 consumer id, 1 consumer name, 2 consumer group), then `id u32`,
//! or for a name `len u8` (1..=255) and its UTF-8 bytes.

use cairn_vsr::replica::StateMachine;
use cairn_wire::batch::{self, BATCH_HEADER_SIZE};
use cairn_wire::codes;
use std::collections::BTreeMap;
use std::sync::Arc;
use xxhash_rust::xxh3::Xxh3;

/// Append batches (a group of sends: one prepare, one barrier, one acknowledgement round).
pub const OPERATION_APPEND: u8 = 1;
/// Store a consumer's (or consumer group's) offset.
pub const OPERATION_STORE_OFFSET: u8 = 2;
/// Delete a stored offset.
pub const OPERATION_DELETE_OFFSET: u8 = 3;
/// Purge: every message so far leaves, offsets keep counting, stored offsets are cleared.
pub const OPERATION_PURGE: u8 = 4;
/// Retention: messages below an offset leave (the shell deletes the sealed segments).
pub const OPERATION_TRIM: u8 = 5;

/// The reply status of an op that was applied.
pub const STATUS_OK: u32 = 0;

/// Most batches one append may carry (bounds the reply and the work of one op).
pub const APPEND_BATCHES_MAX: usize = 4096;

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
    /// XXH3-128 chained over every committed stamped batch: the previous digest, then the
    /// batch's bytes.
    pub data_digest: u128,
    pub offsets: BTreeMap<Owner, u64>,
}

/// The partition machine of one partition.
#[derive(Debug, Clone, Default)]
pub struct PartitionMachine {
    partition_id: u32,
    state: PartitionState,
    /// The first op that continued the log elsewhere than it ended (never cleared).
    fault: Option<String>,
}

impl PartitionMachine {
    pub fn new(partition_id: u32) -> PartitionMachine {
        PartitionMachine {
            partition_id,
            state: PartitionState::default(),
            fault: None,
        }
    }

    pub fn state(&self) -> &PartitionState {
        &self.state
    }

    /// An op whose batches did not continue the committed log (a minting bug), if any.
    pub fn fault(&self) -> Option<&str> {
        self.fault.as_deref()
    }
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

fn decode_append(body: &[u8]) -> Option<Append<'_>> {
    let mut reader = Reader::new(body);
    let timestamp_us = reader.u64()?;
    let count = reader.u32()? as usize;
    if count == 0 || count > APPEND_BATCHES_MAX {
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
    fn prepare(
        &self,
        _op: u64,
        _timestamp: u64,
        operation: u8,
        input: &Arc<[u8]>,
        cursor: u64,
    ) -> (Arc<[u8]>, u64) {
        if operation != OPERATION_APPEND {
            return (Arc::clone(input), cursor);
        }
        let Some(append) = decode_append(input) else {
            // Apply refuses it the same way on every replica; nothing is minted.
            return (Arc::clone(input), cursor);
        };
        let partition_id = u64::from(self.partition_id);
        let mut body = input.to_vec();
        let mut at = 12;
        let mut next = cursor;
        for (bytes, header) in &append.batches {
            at += 4;
            let stamped = batch::stamped_header(bytes, partition_id, next, append.timestamp_us)
                .expect("a batch that passed check_layout has a whole header");
            body[at..at + BATCH_HEADER_SIZE].copy_from_slice(&stamped);
            at += bytes.len();
            next += u64::from(header.message_count);
        }
        debug_assert_eq!(at, body.len());
        (Arc::from(body), next)
    }

    fn apply(&mut self, op: u64, _timestamp: u64, operation: u8, input: &[u8]) -> Vec<u8> {
        match operation {
            OPERATION_APPEND => {
                let Some(append) = decode_append(input) else {
                    return status_reply(codes::INVALID_FORMAT);
                };
                let mut expected = self.state.next_offset;
                for (_, header) in &append.batches {
                    if header.base_offset != expected || header.partition_id != u64::from(self.partition_id) {
                        let fault = format!(
                            "op {op} appends a batch at offset {} of partition {}, but the committed log of partition {} continues at {expected}: minted twice or skipped",
                            header.base_offset, header.partition_id, self.partition_id
                        );
                        self.fault.get_or_insert(fault);
                        return status_reply(codes::INVALID_COMMAND);
                    }
                    expected += u64::from(header.message_count);
                }
                let mut reply = Vec::with_capacity(8 + 8 * append.batches.len());
                reply.extend_from_slice(&STATUS_OK.to_le_bytes());
                reply.extend_from_slice(&(append.batches.len() as u32).to_le_bytes());
                for (bytes, header) in &append.batches {
                    let mut hasher = Xxh3::new();
                    hasher.update(&self.state.data_digest.to_le_bytes());
                    hasher.update(bytes);
                    self.state.data_digest = hasher.digest128();
                    reply.extend_from_slice(&header.base_offset.to_le_bytes());
                }
                self.state.next_offset = expected;
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
                if !input.is_empty() {
                    return status_reply(codes::INVALID_FORMAT);
                }
                self.state.start_offset = self.state.next_offset;
                self.state.purge_generation += 1;
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
            _ => status_reply(codes::INVALID_COMMAND),
        }
    }

    fn snapshot(&self) -> Vec<u8> {
        let state = &self.state;
        let mut bytes = Vec::with_capacity(64 + 16 * state.offsets.len());
        bytes.extend_from_slice(&self.partition_id.to_le_bytes());
        bytes.extend_from_slice(&state.next_offset.to_le_bytes());
        bytes.extend_from_slice(&state.start_offset.to_le_bytes());
        bytes.extend_from_slice(&state.purge_generation.to_le_bytes());
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
        let partition_id = reader.u32().ok_or_else(short)?;
        let next_offset = reader.u64().ok_or_else(short)?;
        let start_offset = reader.u64().ok_or_else(short)?;
        let purge_generation = reader.u64().ok_or_else(short)?;
        let data_digest = reader.u128().ok_or_else(short)?;
        let count = reader.u32().ok_or_else(short)?;
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

    /// Prepare on a primary at `cursor`, then apply on `machine`: the reply and the cursor after.
    fn append(machine: &mut PartitionMachine, op: u64, cursor: u64, batches: &[&[u8]]) -> (Vec<u8>, u64) {
        let request: Arc<[u8]> = Arc::from(encode_append(1_000, batches));
        let (prepared, cursor) = machine.prepare(op, 0, OPERATION_APPEND, &request, cursor);
        (machine.apply(op, 0, OPERATION_APPEND, &prepared), cursor)
    }

    #[test]
    fn appends_mint_contiguous_offsets_from_the_cursor_and_stamp_the_batches() {
        let mut machine = PartitionMachine::new(3);
        let (three, two) = (client_batch(3), client_batch(2));
        let (reply, cursor) = append(&mut machine, 1, 0, &[&three, &two]);
        assert_eq!(decode_append_reply(&reply), Ok(vec![0, 3]));
        assert_eq!(cursor, 5);
        let (reply, cursor) = append(&mut machine, 2, cursor, &[&two]);
        assert_eq!(decode_append_reply(&reply), Ok(vec![5]));
        assert_eq!(cursor, 7);
        assert_eq!(machine.state().next_offset, 7);
        assert_eq!(machine.fault(), None);
        // The prepared body carries stamped batches: partition, base offset, timestamp.
        let request: Arc<[u8]> = Arc::from(encode_append(1_000, &[&two]));
        let (prepared, _) = machine.prepare(3, 0, OPERATION_APPEND, &request, 7);
        let stamped = batch::header(&prepared[16..]).expect("a header");
        assert_eq!(
            (stamped.partition_id, stamped.base_offset, stamped.base_timestamp),
            (3, 7, 1_000)
        );
        assert_eq!(batch::compute_checksum(&prepared[16..]), stamped.batch_checksum);
    }

    #[test]
    fn an_append_that_does_not_continue_the_committed_log_is_refused_and_recorded() {
        let mut machine = PartitionMachine::new(0);
        let batch = client_batch(2);
        let (_, cursor) = append(&mut machine, 1, 0, &[&batch]);
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
        assert_eq!(cursor, 2);
    }

    #[test]
    fn malformed_ops_are_refused_identically_and_change_nothing() {
        let mut machine = PartitionMachine::new(0);
        let before = machine.state().clone();
        let garbage: Arc<[u8]> = Arc::from(&[1u8, 2, 3][..]);
        for operation in [
            OPERATION_APPEND,
            OPERATION_STORE_OFFSET,
            OPERATION_DELETE_OFFSET,
            OPERATION_PURGE,
            OPERATION_TRIM,
            99,
        ] {
            let (prepared, cursor) = machine.prepare(1, 0, operation, &garbage, 4);
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
        assert_eq!(machine.state(), &before);
        assert_eq!(machine.fault(), None);
    }

    #[test]
    fn offsets_purges_and_trims() {
        let mut machine = PartitionMachine::new(0);
        let batch = client_batch(4);
        append(&mut machine, 1, 0, &[&batch]);
        let named = Owner::ConsumerName("reader".to_string());
        for owner in [Owner::Consumer(1), named.clone(), Owner::Group(1)] {
            let reply = machine.apply(2, 0, OPERATION_STORE_OFFSET, &encode_offset_op(&owner, Some(2)));
            assert_eq!(reply_status(&reply), STATUS_OK);
        }
        let delete = encode_offset_op(&named, None);
        assert_eq!(
            reply_status(&machine.apply(3, 0, OPERATION_DELETE_OFFSET, &delete)),
            STATUS_OK
        );
        assert_eq!(
            reply_status(&machine.apply(4, 0, OPERATION_DELETE_OFFSET, &delete)),
            codes::CONSUMER_OFFSET_NOT_FOUND
        );
        machine.apply(5, 0, OPERATION_TRIM, &encode_trim(3));
        assert_eq!(machine.state().start_offset, 3);
        machine.apply(6, 0, OPERATION_TRIM, &encode_trim(1));
        assert_eq!(machine.state().start_offset, 3, "a trim never goes back");
        machine.apply(7, 0, OPERATION_TRIM, &encode_trim(100));
        assert_eq!(machine.state().start_offset, 4, "nor past the end");
        machine.apply(8, 0, OPERATION_PURGE, &[]);
        let state = machine.state();
        assert_eq!(
            (state.start_offset, state.next_offset, state.purge_generation),
            (4, 4, 1)
        );
        assert!(state.offsets.is_empty(), "a purge clears stored offsets");
        // Offsets keep counting after a purge.
        let (reply, _) = append(&mut machine, 9, 4, &[&batch]);
        assert_eq!(decode_append_reply(&reply), Ok(vec![4]));
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
        machine.apply(3, 0, OPERATION_PURGE, &[]);
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
    }
}
