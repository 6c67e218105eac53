//! The partition state file: the durable frontier and the offset reservation of one partition,
//! published in place in two alternating fixed slots.
//!
//! # Why
//!
//! - The **frontier** says where the data known to be stable ends. Recovery refuses (Damaged)
//!   anything below it that fails verification, instead of cutting it away as a torn tail, and
//!   refuses a log that ends before it (durability contract, guarantees 3 and 4).
//! - The **offset reservation** (`offset_reserved`) is a ceiling no minted offset may reach
//!   before the ceiling is raised durably. After an unclean stop minting resumes at the
//!   ceiling, so an offset that escaped (ACKed in `relaxed` mode, or seen by a reader) and was
//!   then lost with its data is never minted again (guarantee 2). A clean stop collapses the
//!   ceiling, so a clean restart leaves no gap.
//!
//! Publishing is one positional write and one fdatasync: no create, rename or directory sync,
//! so it can sit on the ACK path (group commit).
//!
//! A journal log (`crate::journal`) keeps the same file with other rules: it mints no
//! offsets, so its reservation is always its frontier; and a cut lowers the frontier (and
//! with it the reservation), because the ops it removes were never committed. Which rules
//! apply is the directory's kind: a journal directory has a `journal.start` file.
//!
//! # File layout
//!
//! `<partition dir>/state`, exactly [`STATE_FILE_SIZE_BYTES`] long: slot 0 at byte 0, slot 1 at
//! byte [`STATE_SLOT_STRIDE_BYTES`] (separate 4 KiB pages/sectors, so a torn write of one slot
//! cannot reach the other), zeros elsewhere. The state with sequence `n` is written to slot
//! `n % 2`, so each publish overwrites the *older* slot and a torn publish leaves the newer,
//! still valid one. Load takes the valid slot with the highest sequence.
//!
//! # Slot layout (little-endian, [`STATE_SLOT_SIZE`] bytes, no padding)
//!
//! | Off | Size | Field                      | Fault it detects / role |
//! |-----|------|----------------------------|-------------------------|
//! | 0   | 4    | `magic` = `"CRNS"`         | not a state slot (zeros, garbage, wrong file) |
//! | 4   | 2    | `version` = 1              | an incompatible format version |
//! | 6   | 2    | reserved, zero             | garbage; room for flags |
//! | 8   | 8    | `checksum`                 | torn slot write, bit flips: XXH3-64 (seed 0) over bytes 16..128 |
//! | 16  | 8    | `sequence`                 | which slot is newer; a misdirected write (`sequence % 2` must equal the slot index) |
//! | 24  | 4    | `partition_id`             | a state file of another partition |
//! | 28  | 4    | `flags` (bit 0 = clean stop, bit 1 = unsynced acknowledged) | whether the last stop collapsed the reservation; whether ops above the frontier may have been acknowledged (a journal in `relaxed` mode: an open keeps the whole ones); other bits must be zero |
//! | 32  | 8    | `frontier_segment_base`    | the segment holding the frontier |
//! | 40  | 8    | `frontier_segment_len_bytes` | bytes of that segment's `.log` below the frontier (a record boundary) |
//! | 48  | 8    | `frontier_next_offset`     | the next offset after the durable data |
//! | 56  | 8    | `frontier_parent_checksum` | checksum of the last durable record (0 at genesis): the bytes below the frontier must end with it |
//! | 64  | 8    | `frontier_next_op`         | op of the next record (≥ 1) |
//! | 72  | 8    | `offset_reserved`          | ceiling: no offset ≥ it was minted |
//! | 80  | 8    | `boot_floor`               | the next offset armed at the last open (or 0 at creation) |
//! | 88  | 40   | reserved, zero             | room for later fields |
//!
//! Invariants of a loaded or published [`PartitionState`] (checked on load; a checksum-valid
//! slot breaking them is damage):
//! - `frontier.segment_base_offset ≤ frontier.chain.next_offset ≤ offset_reserved`
//! - `boot_floor ≤ offset_reserved`
//! - `frontier.chain.next_op ≥ 1`
//! - `sequence` strictly increases with every publish while the file exists.

use crate::StorageError;
use crate::io::{Disk, WriteFile};
use crate::record::Chain;
use std::path::{Path, PathBuf};
use xxhash_rust::xxh3::xxh3_64;

/// Name of the state file inside a partition directory.
pub const STATE_FILE_NAME: &str = "state";
pub const STATE_MAGIC: u32 = u32::from_le_bytes(*b"CRNS");
pub const STATE_VERSION: u16 = 1;
pub const STATE_SLOT_SIZE: usize = 128;
/// Distance between the two slots: one 4 KiB page/sector each.
pub const STATE_SLOT_STRIDE_BYTES: u64 = 4096;
pub const STATE_FILE_SIZE_BYTES: u64 = 2 * STATE_SLOT_STRIDE_BYTES;

const OFFSET_MAGIC: usize = 0;
const OFFSET_VERSION: usize = 4;
const OFFSET_RESERVED_HEADER: usize = 6;
const OFFSET_CHECKSUM: usize = 8;
const OFFSET_SEQUENCE: usize = 16;
const OFFSET_PARTITION_ID: usize = 24;
const OFFSET_FLAGS: usize = 28;
const OFFSET_FRONTIER_SEGMENT_BASE: usize = 32;
const OFFSET_FRONTIER_SEGMENT_LEN: usize = 40;
const OFFSET_FRONTIER_NEXT_OFFSET: usize = 48;
const OFFSET_FRONTIER_PARENT_CHECKSUM: usize = 56;
const OFFSET_FRONTIER_NEXT_OP: usize = 64;
const OFFSET_OFFSET_RESERVED: usize = 72;
const OFFSET_BOOT_FLOOR: usize = 80;
const OFFSET_RESERVED_TAIL: usize = 88;
const CHECKSUM_COVERAGE_START: usize = OFFSET_CHECKSUM + 8;
const FLAG_CLEAN_STOP: u32 = 1;
const FLAG_UNSYNCED_ACKNOWLEDGED: u32 = 2;

const _: () = assert!(OFFSET_VERSION == OFFSET_MAGIC + 4);
const _: () = assert!(OFFSET_RESERVED_HEADER == OFFSET_VERSION + 2);
const _: () = assert!(OFFSET_CHECKSUM == OFFSET_RESERVED_HEADER + 2);
const _: () = assert!(OFFSET_SEQUENCE == OFFSET_CHECKSUM + 8);
const _: () = assert!(OFFSET_PARTITION_ID == OFFSET_SEQUENCE + 8);
const _: () = assert!(OFFSET_FLAGS == OFFSET_PARTITION_ID + 4);
const _: () = assert!(OFFSET_FRONTIER_SEGMENT_BASE == OFFSET_FLAGS + 4);
const _: () = assert!(OFFSET_FRONTIER_SEGMENT_LEN == OFFSET_FRONTIER_SEGMENT_BASE + 8);
const _: () = assert!(OFFSET_FRONTIER_NEXT_OFFSET == OFFSET_FRONTIER_SEGMENT_LEN + 8);
const _: () = assert!(OFFSET_FRONTIER_PARENT_CHECKSUM == OFFSET_FRONTIER_NEXT_OFFSET + 8);
const _: () = assert!(OFFSET_FRONTIER_NEXT_OP == OFFSET_FRONTIER_PARENT_CHECKSUM + 8);
const _: () = assert!(OFFSET_OFFSET_RESERVED == OFFSET_FRONTIER_NEXT_OP + 8);
const _: () = assert!(OFFSET_BOOT_FLOOR == OFFSET_OFFSET_RESERVED + 8);
const _: () = assert!(OFFSET_RESERVED_TAIL == OFFSET_BOOT_FLOOR + 8);
const _: () = assert!(OFFSET_RESERVED_TAIL + 40 == STATE_SLOT_SIZE);
const _: () = assert!(STATE_SLOT_SIZE as u64 <= STATE_SLOT_STRIDE_BYTES);

/// The end of the durable data: what recovery must find, verified, in the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frontier {
    /// Base offset of the segment holding the frontier.
    pub segment_base_offset: u64,
    /// Bytes of that segment's `.log` below the frontier (a record boundary).
    pub segment_len_bytes: u64,
    /// The chain after the last durable record (`next_offset` is the durable end).
    pub chain: Chain,
}

impl Frontier {
    /// The frontier of a log that has never held a record.
    pub fn genesis(partition_id: u32) -> Frontier {
        Frontier {
            segment_base_offset: 0,
            segment_len_bytes: 0,
            chain: Chain::genesis(partition_id),
        }
    }

    pub fn next_offset(&self) -> u64 {
        self.chain.next_offset
    }
}

/// One published state (a slot's decoded contents).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionState {
    /// Invariant: strictly increasing per publish; written to slot `sequence % 2`.
    pub sequence: u64,
    pub frontier: Frontier,
    /// Invariant: `≥ frontier.next_offset()`, `≥ boot_floor`, and (while a log is open)
    /// `≥` every offset minted. Raised in lease blocks before an offset beyond it is minted;
    /// collapsed only by a clean stop.
    pub offset_reserved: u64,
    /// The next offset armed at the last open (0 at creation). Invariant: `≤ offset_reserved`.
    pub boot_floor: u64,
    /// Whether the last stop was clean (the reservation was collapsed after a final commit).
    pub clean_stop: bool,
    /// Whether what lies above the frontier may have been acknowledged before a barrier
    /// covered it (a journal in `relaxed` mode): an open then keeps the whole, verified ops
    /// there instead of dropping them. Never set by a record log.
    pub unsynced_acknowledged: bool,
}

impl PartitionState {
    /// The state written at partition creation.
    pub fn initial(partition_id: u32) -> PartitionState {
        PartitionState {
            sequence: 1,
            frontier: Frontier::genesis(partition_id),
            offset_reserved: 0,
            boot_floor: 0,
            clean_stop: false,
            unsynced_acknowledged: false,
        }
    }

    /// The relations every state obeys (see the module doc). `Err` names the first broken one.
    pub fn check(&self) -> Result<(), String> {
        let frontier = &self.frontier;
        if frontier.segment_base_offset > frontier.chain.next_offset {
            return Err(format!(
                "frontier segment base {} above the frontier {}",
                frontier.segment_base_offset, frontier.chain.next_offset
            ));
        }
        if frontier.chain.next_offset > self.offset_reserved {
            return Err(format!(
                "frontier {} above the offset reservation {}",
                frontier.chain.next_offset, self.offset_reserved
            ));
        }
        if self.boot_floor > self.offset_reserved {
            return Err(format!(
                "boot floor {} above the offset reservation {}",
                self.boot_floor, self.offset_reserved
            ));
        }
        if frontier.chain.next_op == 0 {
            return Err("frontier op 0".into());
        }
        Ok(())
    }
}

/// Byte position of the slot that state `sequence` is written to.
pub fn slot_position_bytes(sequence: u64) -> u64 {
    (sequence % 2) * STATE_SLOT_STRIDE_BYTES
}

/// Encode `state` as a slot (pure).
pub fn encode_slot(state: &PartitionState) -> [u8; STATE_SLOT_SIZE] {
    let mut bytes = [0u8; STATE_SLOT_SIZE];
    put(&mut bytes, OFFSET_MAGIC, &STATE_MAGIC.to_le_bytes());
    put(&mut bytes, OFFSET_VERSION, &STATE_VERSION.to_le_bytes());
    put(&mut bytes, OFFSET_SEQUENCE, &state.sequence.to_le_bytes());
    put(
        &mut bytes,
        OFFSET_PARTITION_ID,
        &state.frontier.chain.partition_id.to_le_bytes(),
    );
    let flags = if state.clean_stop { FLAG_CLEAN_STOP } else { 0 }
        | if state.unsynced_acknowledged {
            FLAG_UNSYNCED_ACKNOWLEDGED
        } else {
            0
        };
    put(&mut bytes, OFFSET_FLAGS, &flags.to_le_bytes());
    let frontier = &state.frontier;
    put(
        &mut bytes,
        OFFSET_FRONTIER_SEGMENT_BASE,
        &frontier.segment_base_offset.to_le_bytes(),
    );
    put(
        &mut bytes,
        OFFSET_FRONTIER_SEGMENT_LEN,
        &frontier.segment_len_bytes.to_le_bytes(),
    );
    put(
        &mut bytes,
        OFFSET_FRONTIER_NEXT_OFFSET,
        &frontier.chain.next_offset.to_le_bytes(),
    );
    put(
        &mut bytes,
        OFFSET_FRONTIER_PARENT_CHECKSUM,
        &frontier.chain.parent_checksum.to_le_bytes(),
    );
    put(
        &mut bytes,
        OFFSET_FRONTIER_NEXT_OP,
        &frontier.chain.next_op.to_le_bytes(),
    );
    put(
        &mut bytes,
        OFFSET_OFFSET_RESERVED,
        &state.offset_reserved.to_le_bytes(),
    );
    put(&mut bytes, OFFSET_BOOT_FLOOR, &state.boot_floor.to_le_bytes());
    let checksum = xxh3_64(&bytes[CHECKSUM_COVERAGE_START..]);
    put(&mut bytes, OFFSET_CHECKSUM, &checksum.to_le_bytes());
    bytes
}

/// Decode and verify slot `slot_index` (0 or 1) of a partition (pure). `Err` says why it is
/// not a valid slot (torn, zeros, flipped bits, misdirected, foreign).
pub fn decode_slot(bytes: &[u8], slot_index: u64, partition_id: u32) -> Result<PartitionState, String> {
    let Some(bytes) = bytes.get(..STATE_SLOT_SIZE) else {
        return Err("short slot".into());
    };
    if get_u32(bytes, OFFSET_MAGIC) != STATE_MAGIC {
        return Err("bad magic".into());
    }
    if get_u16(bytes, OFFSET_VERSION) != STATE_VERSION {
        return Err(format!("unknown version {}", get_u16(bytes, OFFSET_VERSION)));
    }
    if xxh3_64(&bytes[CHECKSUM_COVERAGE_START..]) != get_u64(bytes, OFFSET_CHECKSUM) {
        return Err("checksum mismatch".into());
    }
    // Checksum-valid from here: what follows is not a torn write.
    if bytes[OFFSET_RESERVED_HEADER..OFFSET_CHECKSUM] != [0, 0]
        || bytes[OFFSET_RESERVED_TAIL..].iter().any(|&byte| byte != 0)
    {
        return Err("non-zero reserved bytes".into());
    }
    let sequence = get_u64(bytes, OFFSET_SEQUENCE);
    if sequence % 2 != slot_index {
        return Err(format!(
            "sequence {sequence} in slot {slot_index} (misdirected write)"
        ));
    }
    let found_partition = get_u32(bytes, OFFSET_PARTITION_ID);
    if found_partition != partition_id {
        return Err(format!(
            "state of partition {found_partition}, expected {partition_id}"
        ));
    }
    let flags = get_u32(bytes, OFFSET_FLAGS);
    if flags & !(FLAG_CLEAN_STOP | FLAG_UNSYNCED_ACKNOWLEDGED) != 0 {
        return Err(format!("unknown flags {flags:#x}"));
    }
    let state = PartitionState {
        sequence,
        frontier: Frontier {
            segment_base_offset: get_u64(bytes, OFFSET_FRONTIER_SEGMENT_BASE),
            segment_len_bytes: get_u64(bytes, OFFSET_FRONTIER_SEGMENT_LEN),
            chain: Chain {
                partition_id,
                next_offset: get_u64(bytes, OFFSET_FRONTIER_NEXT_OFFSET),
                parent_checksum: get_u64(bytes, OFFSET_FRONTIER_PARENT_CHECKSUM),
                next_op: get_u64(bytes, OFFSET_FRONTIER_NEXT_OP),
            },
        },
        offset_reserved: get_u64(bytes, OFFSET_OFFSET_RESERVED),
        boot_floor: get_u64(bytes, OFFSET_BOOT_FLOOR),
        clean_stop: flags & FLAG_CLEAN_STOP != 0,
        unsynced_acknowledged: flags & FLAG_UNSYNCED_ACKNOWLEDGED != 0,
    };
    state.check()?;
    Ok(state)
}

/// Pick the state of a whole state file (pure): the valid slot with the highest sequence.
/// `Err((position_bytes, reason))` if the file has the wrong size or neither slot is valid.
pub fn load(file_bytes: &[u8], partition_id: u32) -> Result<PartitionState, (u64, String)> {
    load_noting_damage(file_bytes, partition_id).map(|(state, _)| state)
}

/// [`load`], and whether one slot failed verification. A torn publish and a bit flip in the
/// newest slot look alike: either way the other slot is in charge, but after a flip the
/// publish it lost was reported durable, so the data above the frontier it names may have
/// been acknowledged (a journal's open then keeps the whole ops there).
pub fn load_noting_damage(
    file_bytes: &[u8],
    partition_id: u32,
) -> Result<(PartitionState, bool), (u64, String)> {
    if file_bytes.len() as u64 != STATE_FILE_SIZE_BYTES {
        return Err((
            0,
            format!(
                "state file of {} bytes, expected {STATE_FILE_SIZE_BYTES}",
                file_bytes.len()
            ),
        ));
    }
    let slot = |slot_index: u64| {
        let position = (slot_index * STATE_SLOT_STRIDE_BYTES) as usize;
        decode_slot(&file_bytes[position..], slot_index, partition_id)
    };
    match (slot(0), slot(1)) {
        (Ok(first), Ok(second)) => Ok((
            if first.sequence > second.sequence {
                first
            } else {
                second
            },
            false,
        )),
        (Ok(only), Err(_)) | (Err(_), Ok(only)) => Ok((only, true)),
        (Err(first), Err(second)) => Err((
            0,
            format!("no valid state slot (slot 0: {first}; slot 1: {second})"),
        )),
    }
}

/// The whole initial file: `initial` in its slot and the same contents, one sequence lower, in
/// the other, so both slots are valid from the start.
pub(crate) fn initial_file_bytes(initial: &PartitionState) -> Vec<u8> {
    debug_assert!(initial.sequence >= 1);
    let mut bytes = vec![0u8; STATE_FILE_SIZE_BYTES as usize];
    for sequence in [initial.sequence - 1, initial.sequence] {
        let slot = encode_slot(&PartitionState { sequence, ..*initial });
        let position = slot_position_bytes(sequence) as usize;
        bytes[position..position + STATE_SLOT_SIZE].copy_from_slice(&slot);
    }
    bytes
}

/// An open state file and the last state it durably holds.
#[derive(Debug)]
pub struct StateFile {
    path: PathBuf,
    file: Box<dyn WriteFile>,
    /// Invariant: the state with the highest sequence that is durably in the file (as far as
    /// this process knows: the last publish that returned `Ok`, or what was loaded).
    current: PartitionState,
}

impl StateFile {
    /// Create `path` holding `initial` in both slots and sync its data. The caller syncs the
    /// directory.
    pub fn create(disk: &dyn Disk, path: &Path, initial: PartitionState) -> Result<StateFile, StorageError> {
        assert!(initial.check().is_ok(), "initial state breaks its invariants");
        let mut file = disk.create_new(path)?;
        file.write_all_at(0, &initial_file_bytes(&initial))?;
        file.sync_data()?;
        Ok(StateFile {
            path: path.to_path_buf(),
            file,
            current: initial,
        })
    }

    /// Open `path` for publishing after recovery loaded `loaded` from it.
    pub fn open(disk: &dyn Disk, path: &Path, loaded: PartitionState) -> Result<StateFile, StorageError> {
        Ok(StateFile {
            path: path.to_path_buf(),
            file: disk.open_write(path)?,
            current: loaded,
        })
    }

    /// The last state durably published (or loaded).
    pub fn current(&self) -> &PartitionState {
        &self.current
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Publish `next` (its `sequence` is ignored and set to the next one): one positional write
    /// over the older slot, then fdatasync. On `Err` the new state may or may not be durable;
    /// the caller must stop writing (a failed barrier is final).
    pub fn publish(&mut self, next: PartitionState) -> Result<(), StorageError> {
        let next = PartitionState {
            sequence: self.current.sequence + 1,
            ..next
        };
        assert!(
            next.check().is_ok(),
            "published state breaks its invariants: {next:?}"
        );
        assert!(
            next.frontier.chain.partition_id == self.current.frontier.chain.partition_id,
            "state of another partition"
        );
        let slot = encode_slot(&next);
        debug_assert_eq!(
            decode_slot(&slot, next.sequence % 2, next.frontier.chain.partition_id),
            Ok(next)
        );
        self.file
            .write_all_at(slot_position_bytes(next.sequence), &slot)?;
        self.file.sync_data()?;
        self.current = next;
        Ok(())
    }
}

fn put(bytes: &mut [u8], at: usize, value: &[u8]) {
    bytes[at..at + value.len()].copy_from_slice(value);
}

/// Callers pass slices of at least `STATE_SLOT_SIZE` bytes and in-slot offsets.
fn get_u16(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([bytes[at], bytes[at + 1]])
}

fn get_u32(bytes: &[u8], at: usize) -> u32 {
    let mut raw = [0u8; 4];
    raw.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(raw)
}

fn get_u64(bytes: &[u8], at: usize) -> u64 {
    let mut raw = [0u8; 8];
    raw.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(raw)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(sequence: u64) -> PartitionState {
        PartitionState {
            sequence,
            frontier: Frontier {
                segment_base_offset: 100,
                segment_len_bytes: 4_321,
                chain: Chain {
                    partition_id: 9,
                    next_offset: 150,
                    parent_checksum: 0xdead_beef,
                    next_op: 40,
                },
            },
            offset_reserved: 65_686,
            boot_floor: 120,
            clean_stop: sequence.is_multiple_of(3),
            unsynced_acknowledged: sequence.is_multiple_of(2),
        }
    }

    fn file_with(first: &PartitionState, second: &PartitionState) -> Vec<u8> {
        let mut bytes = vec![0u8; STATE_FILE_SIZE_BYTES as usize];
        for state in [first, second] {
            let position = slot_position_bytes(state.sequence) as usize;
            bytes[position..position + STATE_SLOT_SIZE].copy_from_slice(&encode_slot(state));
        }
        bytes
    }

    #[test]
    fn slot_round_trip_and_highest_sequence_wins() {
        for sequence in 0..6 {
            let state = sample(sequence);
            assert_eq!(decode_slot(&encode_slot(&state), sequence % 2, 9), Ok(state));
            assert!(decode_slot(&encode_slot(&state), 1 - sequence % 2, 9).is_err());
            assert!(decode_slot(&encode_slot(&state), sequence % 2, 8).is_err());
        }
        let bytes = file_with(&sample(4), &sample(5));
        assert_eq!(load(&bytes, 9), Ok(sample(5)));
        let bytes = file_with(&sample(7), &sample(6));
        assert_eq!(load(&bytes, 9), Ok(sample(7)));
        let initial = PartitionState::initial(9);
        assert_eq!(load(&initial_file_bytes(&initial), 9), Ok(initial));
    }

    #[test]
    fn a_torn_slot_write_falls_back_to_the_other_slot() {
        let older = sample(4);
        let newer = sample(5);
        let good = file_with(&older, &newer);
        let newer_position = slot_position_bytes(5) as usize;
        // Writing sequence 6 over slot 0 (the older one) tears at every possible length. The
        // new state differs from the old one up to its boot floor, so only a prefix reaching
        // past the last differing byte is a whole write.
        let next_state = PartitionState {
            boot_floor: 121,
            ..sample(6)
        };
        let next = encode_slot(&next_state);
        let old_slot = encode_slot(&older);
        let whole_from_len = 1
            + (0..STATE_SLOT_SIZE)
                .rev()
                .find(|&byte| next[byte] != old_slot[byte])
                .unwrap();
        assert!(whole_from_len > OFFSET_BOOT_FLOOR);
        for torn_len in 0..=STATE_SLOT_SIZE {
            let mut bytes = good.clone();
            let position = slot_position_bytes(6) as usize;
            bytes[position..position + torn_len].copy_from_slice(&next[..torn_len]);
            let expected = if torn_len >= whole_from_len {
                next_state
            } else {
                newer
            };
            assert_eq!(load(&bytes, 9), Ok(expected), "torn at {torn_len}");
        }
        // Every single bit flip in one slot leaves the other one in charge, and says so.
        assert_eq!(load_noting_damage(&good, 9), Ok((newer, false)));
        for byte in 0..STATE_SLOT_SIZE {
            let mut bytes = good.clone();
            bytes[newer_position + byte] ^= 0x40;
            assert_eq!(load(&bytes, 9), Ok(older), "flip at {byte}");
            assert_eq!(load_noting_damage(&bytes, 9), Ok((older, true)), "flip at {byte}");
        }
    }

    #[test]
    fn both_slots_bad_or_wrong_size_is_refused() {
        let good = file_with(&sample(4), &sample(5));
        let mut bytes = good.clone();
        bytes[3] ^= 1;
        bytes[STATE_SLOT_STRIDE_BYTES as usize + 20] ^= 1;
        assert!(load(&bytes, 9).is_err());
        assert!(load(&vec![0u8; STATE_FILE_SIZE_BYTES as usize], 9).is_err());
        assert!(load(&good[..good.len() - 1], 9).is_err());
        assert!(load(&[], 9).is_err());
        // A checksum-valid slot breaking the invariants is not a state.
        let broken = PartitionState {
            offset_reserved: 10,
            ..sample(5)
        };
        assert!(decode_slot(&encode_slot(&broken), 1, 9).is_err());
    }
}
