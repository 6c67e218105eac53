//! Helpers shared by the crate's unit tests.

use cairn_wire::batch::{self, BATCH_HEADER_SIZE, BatchLimits, FRAME_HEADER_SIZE};

/// A valid client batch (what `batch::validate` accepts) of `count` messages of
/// `payload_bytes` bytes each; message `i`'s payload bytes are all `fill + i`.
pub fn client_batch(count: u32, payload_bytes: usize, fill: u8) -> Vec<u8> {
    let frame_bytes = FRAME_HEADER_SIZE + payload_bytes;
    let length = BATCH_HEADER_SIZE + frame_bytes * count as usize;
    let mut batch = vec![0u8; length];
    batch[32..40].copy_from_slice(&(length as u64).to_le_bytes());
    batch[48..52].copy_from_slice(&count.to_le_bytes());
    for index in 0..count {
        let start = BATCH_HEADER_SIZE + frame_bytes * index as usize;
        let frame = &mut batch[start..start + frame_bytes];
        frame[8..24].copy_from_slice(&u128::from(index + 1).to_le_bytes());
        frame[24..28].copy_from_slice(&index.to_le_bytes());
        frame[36..40].copy_from_slice(&(payload_bytes as u32).to_le_bytes());
        frame[FRAME_HEADER_SIZE..].fill(fill.wrapping_add(index as u8));
        let checksum = xxhash_rust::xxh3::xxh3_64(&frame[8..]);
        frame[0..8].copy_from_slice(&checksum.to_le_bytes());
    }
    let checksum = batch::compute_checksum(&batch);
    batch[40..48].copy_from_slice(&checksum.to_le_bytes());
    let limits = BatchLimits {
        message_payload_bytes_max: 1 << 20,
        user_headers_bytes_max: 0,
        batch_bytes_max: 1 << 24,
        batch_messages_max: 1000,
    };
    assert!(batch::validate(&batch, count, &limits).is_ok());
    batch
}
