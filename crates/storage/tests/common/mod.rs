//! Test helpers: client batches built per protocol §7.2/§7.3, and a decoder for read output.

#![allow(dead_code)]

use cairn_wire::batch::{self, BATCH_HEADER_SIZE, FRAME_HEADER_SIZE};
use std::collections::BTreeMap;
use std::path::Path;
use xxhash_rust::xxh3::xxh3_64;

/// A client batch (as sent: partition, base offset and base timestamp zero) holding `payloads`,
/// with valid frame checksums and batch checksum.
pub fn client_batch(payloads: &[Vec<u8>]) -> Vec<u8> {
    let origin_timestamp_us: u64 = 1_000_000;
    let mut batch = vec![0u8; BATCH_HEADER_SIZE];
    for (index, payload) in payloads.iter().enumerate() {
        let mut frame = vec![0u8; FRAME_HEADER_SIZE];
        frame[8..24].copy_from_slice(&(index as u128 + 1).to_le_bytes());
        frame[24..28].copy_from_slice(&(index as u32).to_le_bytes());
        frame[28..32].copy_from_slice(&(index as u32).to_le_bytes());
        frame[32..36].copy_from_slice(&0u32.to_le_bytes());
        frame[36..40].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        frame.extend_from_slice(payload);
        let checksum = xxh3_64(&frame[8..]);
        frame[0..8].copy_from_slice(&checksum.to_le_bytes());
        batch.extend_from_slice(&frame);
    }
    let length = batch.len() as u64;
    batch[24..32].copy_from_slice(&origin_timestamp_us.to_le_bytes());
    batch[32..40].copy_from_slice(&length.to_le_bytes());
    batch[48..52].copy_from_slice(&(payloads.len() as u32).to_le_bytes());
    let checksum = batch::compute_checksum(&batch);
    batch[40..48].copy_from_slice(&checksum.to_le_bytes());
    batch
}

/// The payload of message `offset` in the reference workloads: recognisable and of varying size.
pub fn payload_for(offset: u64) -> Vec<u8> {
    let mut payload = format!("message-{offset}-").into_bytes();
    payload.resize(payload.len() + (offset % 37) as usize, b'a' + (offset % 26) as u8);
    payload
}

/// A batch of `count` reference messages starting at `first_offset`.
pub fn reference_batch(first_offset: u64, count: u32) -> Vec<u8> {
    let payloads: Vec<Vec<u8>> = (0..u64::from(count))
        .map(|i| payload_for(first_offset + i))
        .collect();
    client_batch(&payloads)
}

/// A message as the client derives it from a poll reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub offset: u64,
    pub timestamp_us: u64,
    pub payload: Vec<u8>,
}

/// Decode read output (whole batches back to back) the way a strict client does, checking the
/// layout and both checksums.
pub fn decode_batches(mut bytes: &[u8]) -> Vec<Message> {
    let mut messages = Vec::new();
    while !bytes.is_empty() {
        let header = batch::header(bytes).expect("batch header");
        let length = header.batch_length as usize;
        assert!(
            length >= BATCH_HEADER_SIZE && length <= bytes.len(),
            "batch length {length}"
        );
        let (one, rest) = bytes.split_at(length);
        assert_eq!(
            batch::compute_checksum(one),
            header.batch_checksum,
            "batch checksum"
        );
        assert!(
            one[52..BATCH_HEADER_SIZE].iter().all(|&b| b == 0),
            "reserved bytes"
        );
        let mut frames = &one[BATCH_HEADER_SIZE..];
        let mut count = 0u32;
        while !frames.is_empty() {
            let u32_at = |at: usize| u32::from_le_bytes(frames[at..at + 4].try_into().unwrap());
            let offset_delta = u32_at(24);
            let user_headers_length = u32_at(32) as usize;
            let payload_length = u32_at(36) as usize;
            let frame_length = FRAME_HEADER_SIZE + payload_length + user_headers_length;
            assert!(frame_length <= frames.len());
            let checksum = u64::from_le_bytes(frames[0..8].try_into().unwrap());
            assert_eq!(xxh3_64(&frames[8..frame_length]), checksum, "frame checksum");
            messages.push(Message {
                offset: header.base_offset + u64::from(offset_delta),
                timestamp_us: header.base_timestamp,
                payload: frames[FRAME_HEADER_SIZE..FRAME_HEADER_SIZE + payload_length].to_vec(),
            });
            frames = &frames[frame_length..];
            count += 1;
        }
        assert_eq!(count, header.message_count, "message count");
        bytes = rest;
    }
    messages
}

/// Every file of `dir` with its bytes (to prove a refused open changed nothing).
pub fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| {
            let entry = entry.unwrap();
            (
                entry.file_name().into_string().unwrap(),
                std::fs::read(entry.path()).unwrap(),
            )
        })
        .collect()
}

/// The segment `.log` files of `dir`, in offset order.
pub fn log_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "log"))
        .collect();
    files.sort();
    files
}
