//! Checkpoints: the replicated state at one committed op, as bytes (`docs/replication.md`,
//! "Checkpoints").
//!
//! A checkpoint holds the header of the prepare it was taken after (its op and checksum anchor
//! the hash chain that continues above it), the state machine's snapshot and the client table.
//! Its checksum is what the superblock records as `checkpoint_checksum`, so a replica that
//! reads a checkpoint back knows it is the one its durable state names.
//!
//! Layout (little-endian): `magic u64`, `size u32` (the whole encoding), `reserved u32 = 0`,
//! the 256-byte prepare header, `state_machine_len u32`, the snapshot, `client_table_len u32`,
//! the client table. The checksum is XXH3-128 of those bytes; it is stored beside them (in
//! the superblock), never inside, so a torn or flipped checkpoint simply fails to match.
//!
//! Pure: the replica encodes and decodes; the shell stores the bytes.

#[cfg(test)]
use crate::constants::CHECKPOINT_SIZE_MAX;
use crate::constants::HEADER_SIZE;
use crate::header::{Command, Header, HeaderFault};
use xxhash_rust::xxh3::xxh3_128;

const MAGIC: u64 = u64::from_le_bytes(*b"cairnckp");
const PREFIX_SIZE: usize = 8 + 4 + 4;

/// The replicated state after applying op `header.op`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// The header of the prepare at the checkpoint's op. Its `checksum` is what op
    /// `header.op + 1` names as its parent.
    pub header: Header,
    pub state_machine: Vec<u8>,
    pub client_table: Vec<u8>,
}

/// Why bytes are not a checkpoint of this group.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointFault {
    #[error("the bytes do not start with a checkpoint's magic")]
    Magic,
    #[error("the encoding is {found} bytes, outside what its size field and the limit allow")]
    Length { found: usize },
    #[error("the checksum does not match the one the superblock recorded")]
    Checksum,
    #[error("the prepare header does not verify: {0}")]
    Header(HeaderFault),
    #[error("the prepare header belongs to another cluster, group or command")]
    Foreign,
    #[error("reserved bytes are not zero")]
    Reserved,
}

impl Checkpoint {
    pub fn op(&self) -> u64 {
        self.header.op
    }

    /// The encoding, and its checksum (what the superblock records). `size_max` is the
    /// group's `Shape::checkpoint_size_max`; a larger encoding is a bug.
    pub fn encode(&self, size_max: usize) -> (Vec<u8>, u128) {
        let size = PREFIX_SIZE + HEADER_SIZE + 4 + self.state_machine.len() + 4 + self.client_table.len();
        assert!(
            size <= size_max && size <= u32::MAX as usize,
            "a checkpoint of {size} bytes exceeds the group's checkpoint_size_max ({size_max})"
        );
        let mut bytes = Vec::with_capacity(size);
        bytes.extend_from_slice(&MAGIC.to_le_bytes());
        bytes.extend_from_slice(&(size as u32).to_le_bytes());
        bytes.extend_from_slice(&0u32.to_le_bytes());
        bytes.extend_from_slice(&self.header.encode());
        bytes.extend_from_slice(&(self.state_machine.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&self.state_machine);
        bytes.extend_from_slice(&(self.client_table.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&self.client_table);
        debug_assert_eq!(bytes.len(), size);
        let checksum = xxh3_128(&bytes);
        (bytes, checksum)
    }

    /// Decode a checkpoint of `cluster` and `group` whose checksum must be `checksum`. `bytes`
    /// may run past the encoding (a storage slot is larger): the size field says where it ends.
    /// Every length is bounded before use, the whole encoding by `size_max` (the group's
    /// `Shape::checkpoint_size_max`).
    pub fn decode(
        bytes: &[u8],
        size_max: usize,
        checksum: u128,
        cluster: u128,
        group: u64,
    ) -> Result<Checkpoint, CheckpointFault> {
        let mut reader = Reader { bytes, at: 0 };
        if reader.u64()? != MAGIC {
            return Err(CheckpointFault::Magic);
        }
        let size = reader.u32()? as usize;
        if size > size_max || size > bytes.len() || size < PREFIX_SIZE + HEADER_SIZE + 8 {
            return Err(CheckpointFault::Length { found: size });
        }
        let encoding = &bytes[..size];
        if xxh3_128(encoding) != checksum {
            return Err(CheckpointFault::Checksum);
        }
        let mut reader = Reader {
            bytes: encoding,
            at: reader.at,
        };
        if reader.u32()? != 0 {
            return Err(CheckpointFault::Reserved);
        }
        let header = Header::decode(reader.take(HEADER_SIZE)?).map_err(CheckpointFault::Header)?;
        if header.command != Command::Prepare || header.cluster != cluster || header.group != group {
            return Err(CheckpointFault::Foreign);
        }
        let state_machine_len = reader.u32()? as usize;
        let state_machine = reader.take(state_machine_len)?.to_vec();
        let client_table_len = reader.u32()? as usize;
        let client_table = reader.take(client_table_len)?.to_vec();
        if reader.at != encoding.len() {
            return Err(CheckpointFault::Length { found: size });
        }
        Ok(Checkpoint {
            header,
            state_machine,
            client_table,
        })
    }
}

/// A bounds-checked cursor: every read past the end is a `Length` fault, never a panic.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, count: usize) -> Result<&'a [u8], CheckpointFault> {
        let end = self.at.checked_add(count).filter(|&end| end <= self.bytes.len());
        let end = end.ok_or(CheckpointFault::Length {
            found: self.bytes.len(),
        })?;
        let taken = &self.bytes[self.at..end];
        self.at = end;
        Ok(taken)
    }

    fn u32(&mut self) -> Result<u32, CheckpointFault> {
        let bytes = self.take(4)?;
        Ok(u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }

    fn u64(&mut self) -> Result<u64, CheckpointFault> {
        let mut value = [0u8; 8];
        value.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::header::Message;
    use bytes::Bytes;

    fn checkpoint() -> Checkpoint {
        let mut header = Header::new(Command::Prepare, 7);
        header.group = 3;
        header.op = 40;
        let prepare = Message::new(header, Bytes::from_static(b"body"));
        Checkpoint {
            header: prepare.header,
            state_machine: b"state".to_vec(),
            client_table: vec![1, 2, 3],
        }
    }

    #[test]
    fn round_trips_with_trailing_slot_bytes() {
        let checkpoint = checkpoint();
        let (mut bytes, checksum) = checkpoint.encode(CHECKPOINT_SIZE_MAX);
        bytes.extend_from_slice(&[0u8; 100]);
        assert_eq!(
            Checkpoint::decode(&bytes, CHECKPOINT_SIZE_MAX, checksum, 7, 3),
            Ok(checkpoint)
        );
    }

    #[test]
    fn every_flipped_bit_is_refused() {
        let (bytes, checksum) = checkpoint().encode(CHECKPOINT_SIZE_MAX);
        for bit in 0..bytes.len() * 8 {
            let mut flipped = bytes.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            assert!(
                Checkpoint::decode(&flipped, CHECKPOINT_SIZE_MAX, checksum, 7, 3).is_err(),
                "bit {bit}"
            );
        }
    }

    #[test]
    fn every_truncation_is_refused_and_foreign_groups_too() {
        let (bytes, checksum) = checkpoint().encode(CHECKPOINT_SIZE_MAX);
        for len in 0..bytes.len() {
            assert!(Checkpoint::decode(&bytes[..len], CHECKPOINT_SIZE_MAX, checksum, 7, 3).is_err());
        }
        assert_eq!(
            Checkpoint::decode(&bytes, CHECKPOINT_SIZE_MAX, checksum, 7, 4),
            Err(CheckpointFault::Foreign)
        );
    }
}
