use super::{B, Msg, client_batch, golden_messages, send_body};
use crate::batch::{self, BatchError, BatchLimits};
use crate::codes;
use crate::command::Command;
use crate::types::{Identifier, Partitioning};
use xxhash_rust::{xxh3::xxh3_64, xxh32::xxh32};

const LIMITS: BatchLimits = BatchLimits {
    message_payload_bytes_max: 64_000_000,
    user_headers_bytes_max: 100_000,
    batch_bytes_max: 100_000_000,
    batch_messages_max: 100_000,
};

fn golden_body() -> Vec<u8> {
    let metadata = B::new().id_str("s").id_num(0).u8(2).u8(4).u32(0);
    send_body(metadata, 2, &client_batch(&golden_messages()))
}

fn golden_batch() -> Vec<u8> {
    client_batch(&golden_messages())
}

fn read_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

#[test]
fn golden_vector_send_body() {
    let body = golden_body();
    assert_eq!(body.len(), 386);
    assert_eq!(&body[..4], &0x13u32.to_le_bytes());
    let Command::SendMessages {
        stream,
        topic,
        partitioning,
        messages_count,
        batch,
    } = Command::decode(160, 0, body.into()).unwrap()
    else {
        panic!("not a send");
    };
    assert_eq!(stream, Identifier::Name("s".into()));
    assert_eq!(topic, Identifier::Numeric(0));
    assert_eq!(partitioning, Partitioning::PartitionId(0));
    assert_eq!(messages_count, 2);
    assert_eq!(batch.len(), 363);

    let header = batch::validate(&batch, messages_count, &LIMITS).unwrap();
    assert_eq!(header.batch_length, 363);
    assert_eq!(header.message_count, 2);
    assert_eq!(header.origin_timestamp, 1_000_000);
    assert_eq!(header.batch_checksum, 0xaf72_022a_1dc7_1b41);
    assert_eq!(batch::compute_checksum(&batch), 0xaf72_022a_1dc7_1b41);

    let mut stored = batch.to_vec();
    batch::stamp(&mut stored, 0, 10, 2_000_000);
    let stamped = batch::header(&stored).unwrap();
    assert_eq!(stamped.partition_id, 0);
    assert_eq!(stamped.base_offset, 10);
    assert_eq!(stamped.base_timestamp, 2_000_000);
    assert_eq!(stamped.batch_checksum, 0x8288_986d_1504_33f0);
    // Stamping touches bytes 0..24 and 40..48 only; frames are never modified.
    assert_eq!(&stored[24..40], &batch[24..40]);
    assert_eq!(&stored[48..], &batch[48..]);
    // A stamped batch is still a valid batch (its checksum was recomputed).
    batch::validate(&stored, 2, &LIMITS).unwrap();
}

#[test]
fn stamped_header_is_the_header_stamp_writes_and_leaves_the_batch_alone() {
    let batch = golden_batch();
    let before = batch.clone();
    let head = batch::stamped_header(&batch, 3, 10, 2_000_000).unwrap();
    assert_eq!(batch, before, "stamped_header must not modify the batch");
    let mut stamped = batch.clone();
    batch::stamp(&mut stamped, 3, 10, 2_000_000);
    assert_eq!(&head[..], &stamped[..batch::BATCH_HEADER_SIZE]);
    // Header copy + frames as received is the stamped batch, and it validates.
    let joined = [&head[..], &batch[batch::BATCH_HEADER_SIZE..]].concat();
    assert_eq!(joined, stamped);
    batch::validate(&joined, 2, &LIMITS).unwrap();
    assert_eq!(batch::stamped_header(&batch[..100], 0, 0, 0), None);
}

fn batch_of(ids: &[u128], payload: &[u8]) -> Vec<u8> {
    let messages: Vec<batch::MessageIn<'_>> = ids
        .iter()
        .map(|&id| batch::MessageIn {
            id,
            origin_timestamp: 7,
            payload,
            user_headers: &[],
        })
        .collect();
    batch::encode(&messages).unwrap()
}

#[test]
fn a_batch_keeps_its_content_key_when_stamped_and_only_the_same_messages_share_it() {
    let batch = batch_of(&[11, 12, 13], b"payload");
    let key = batch::content_key(&batch).expect("every message has an id");
    let mut stamped = batch.clone();
    batch::stamp(&mut stamped, 3, 10, 2_000_000);
    assert_eq!(
        batch::content_key(&stamped),
        Some(key),
        "stamping leaves the messages alone"
    );
    assert_eq!(
        batch::content_key(&batch_of(&[11, 12, 13], b"payload")),
        Some(key)
    );
    // Another id, another payload, fewer messages: another key.
    for other in [
        batch_of(&[11, 12, 14], b"payload"),
        batch_of(&[11, 12, 13], b"payloaD"),
        batch_of(&[11, 12], b"payload"),
    ] {
        assert_ne!(batch::content_key(&other), Some(key));
    }
    // A message without an id gives the batch no identity; nor does a cut batch.
    assert_eq!(batch::content_key(&batch_of(&[11, 0, 13], b"payload")), None);
    assert_eq!(batch::content_key(&batch[..batch.len() - 1]), None);
    assert_eq!(batch::content_key(&batch[..100]), None);
}

#[test]
fn frames_verify_ties_a_stamped_header_to_every_byte() {
    let mut stamped = golden_batch();
    batch::stamp(&mut stamped, 3, 10, 2_000_000);
    assert!(batch::frames_verify(&stamped));
    assert!(batch::frames_verify(&golden_batch()));
    // Any byte after the header, the batch checksum, a count or a cut: refused.
    for at in [256 + 8, stamped.len() - 1] {
        let mut flipped = stamped.clone();
        flipped[at] ^= 1;
        assert!(!batch::frames_verify(&flipped), "byte {at}");
    }
    let mut flipped = stamped.clone();
    flipped[40] ^= 1;
    assert!(!batch::frames_verify(&flipped));
    let mut flipped = stamped.clone();
    flipped[48] ^= 1;
    assert!(!batch::frames_verify(&flipped));
    assert!(!batch::frames_verify(&stamped[..stamped.len() - 1]));
    assert!(!batch::frames_verify(&stamped[..100]));
}

#[test]
fn golden_hashes() {
    assert_eq!(xxh3_64(&[]), 0x2d06_8005_38d3_94c2);
    assert_eq!(xxh32(b"key", 0), 3_017_358_048);
    assert_eq!(xxh32(b"key", 0) % 3, 0);
}

#[test]
fn header_needs_256_bytes() {
    assert_eq!(batch::header(&[0u8; 255]), None);
    let h = batch::header(&golden_batch()).unwrap();
    assert_eq!(h.partition_id, 0);
    assert_eq!(h.base_offset, 0);
    assert_eq!(h.base_timestamp, 0);
}

#[test]
fn corrupted_frame_byte_is_a_message_checksum_error() {
    let mut b = golden_batch();
    // Last payload byte of the second frame.
    let last = b.len() - 1;
    b[last] ^= 0xff;
    let err = batch::validate(&b, 2, &LIMITS).unwrap_err();
    assert_eq!(err, BatchError::InvalidMessageChecksum { index: 1 });
    assert_eq!(err.status(), 4027);

    let mut b = golden_batch();
    b[256 + 8] ^= 1; // id of the first frame
    assert_eq!(
        batch::validate(&b, 2, &LIMITS),
        Err(BatchError::InvalidMessageChecksum { index: 0 })
    );
}

#[test]
fn wrong_batch_checksum() {
    let mut b = golden_batch();
    b[40] ^= 1;
    let err = batch::validate(&b, 2, &LIMITS).unwrap_err();
    assert_eq!(err, BatchError::InvalidBatchChecksum);
    assert_eq!(err.status(), 4039);
    // A stamped field changes the batch checksum too.
    let mut b = golden_batch();
    b[8] = 1;
    assert_eq!(
        batch::validate(&b, 2, &LIMITS),
        Err(BatchError::InvalidBatchChecksum)
    );
}

#[test]
fn counts_must_agree() {
    let b = golden_batch();
    let err = batch::validate(&b, 3, &LIMITS).unwrap_err();
    assert!(matches!(err, BatchError::InvalidMessagesCount(_)));
    assert_eq!(err.status(), 4009);

    // Header says 3, metadata says 3, but only two frames tile the batch.
    let mut b = golden_batch();
    b[48..52].copy_from_slice(&3u32.to_le_bytes());
    assert!(matches!(
        batch::validate(&b, 3, &LIMITS),
        Err(BatchError::InvalidMessagesCount(_))
    ));

    // Header says 1: the second frame is one too many.
    let mut b = golden_batch();
    b[48..52].copy_from_slice(&1u32.to_le_bytes());
    assert!(matches!(
        batch::validate(&b, 1, &LIMITS),
        Err(BatchError::InvalidMessagesCount(_))
    ));

    // Zero messages.
    let mut b = vec![0u8; 256];
    b[32..40].copy_from_slice(&256u64.to_le_bytes());
    assert!(matches!(
        batch::validate(&b, 0, &LIMITS),
        Err(BatchError::InvalidMessagesCount(_))
    ));
}

#[test]
fn frames_must_tile_the_batch() {
    // A frame whose payload length runs past the end.
    let mut b = golden_batch();
    let second = 256 + 53;
    b[second + 36..second + 40].copy_from_slice(&7u32.to_le_bytes());
    assert!(matches!(
        batch::validate(&b, 2, &LIMITS),
        Err(BatchError::InvalidMessagesCount(_))
    ));

    // Trailing bytes after the last frame (batch_length adjusted to match).
    let mut b = golden_batch();
    b.extend_from_slice(&[0u8; 10]);
    let len = b.len() as u64;
    b[32..40].copy_from_slice(&len.to_le_bytes());
    assert!(matches!(
        batch::validate(&b, 2, &LIMITS),
        Err(BatchError::InvalidMessagesCount(_))
    ));
}

#[test]
fn offset_deltas_must_be_indexes() {
    let mut b = golden_batch();
    let second = 256 + 53;
    b[second + 24..second + 28].copy_from_slice(&5u32.to_le_bytes());
    assert!(matches!(
        batch::validate(&b, 2, &LIMITS),
        Err(BatchError::InvalidMessagesCount(_))
    ));
}

#[test]
fn batch_length_and_size() {
    let err = batch::validate(&[0u8; 100], 1, &LIMITS).unwrap_err();
    assert!(matches!(err, BatchError::Malformed(_)));
    assert_eq!(err.status(), 4);

    let mut b = golden_batch();
    b[32..40].copy_from_slice(&364u64.to_le_bytes());
    assert!(matches!(
        batch::validate(&b, 2, &LIMITS),
        Err(BatchError::Malformed(_))
    ));

    let small = BatchLimits {
        batch_bytes_max: 362,
        ..LIMITS
    };
    let err = batch::validate(&golden_batch(), 2, &small).unwrap_err();
    assert_eq!(err, BatchError::BatchTooBig { bytes: 363, max: 362 });
    assert_eq!(err.status(), codes::INVALID_MESSAGES_SIZE);

    let few = BatchLimits {
        batch_messages_max: 1,
        ..LIMITS
    };
    let err = batch::validate(&golden_batch(), 2, &few).unwrap_err();
    assert_eq!(err, BatchError::TooManyMessages { count: 2, max: 1 });
    assert_eq!(err.status(), codes::TOO_MANY_MESSAGES);
}

#[test]
fn reserved_bytes_must_be_zero() {
    let mut b = golden_batch();
    b[255] = 1;
    let err = batch::validate(&b, 2, &LIMITS).unwrap_err();
    assert_eq!(err, BatchError::InvalidReservedField);
    assert_eq!(err.status(), 4101);

    let mut b = golden_batch();
    b[52] = 1;
    assert_eq!(
        batch::validate(&b, 2, &LIMITS),
        Err(BatchError::InvalidReservedField)
    );

    // Frame reserved bytes 40..48 (checked before the frame checksum).
    let mut b = golden_batch();
    b[256 + 47] = 1;
    assert_eq!(
        batch::validate(&b, 2, &LIMITS),
        Err(BatchError::InvalidReservedField)
    );
}

#[test]
fn per_message_limits() {
    let msgs = vec![
        Msg {
            id: 1,
            origin_timestamp: 5,
            payload: b"abcdef".to_vec(),
            user_headers: vec![],
        },
        Msg {
            id: 2,
            origin_timestamp: 5,
            payload: vec![],
            user_headers: vec![],
        },
    ];
    let b = client_batch(&msgs);
    let err = batch::validate(&b, 2, &LIMITS).unwrap_err();
    assert_eq!(err, BatchError::EmptyPayload { index: 1 });
    assert_eq!(err.status(), 4024);

    let tight = BatchLimits {
        message_payload_bytes_max: 5,
        ..LIMITS
    };
    let err = batch::validate(&b, 2, &tight).unwrap_err();
    assert_eq!(
        err,
        BatchError::PayloadTooBig {
            index: 0,
            bytes: 6,
            max: 5
        }
    );
    assert_eq!(err.status(), 4022);

    let headers = B::new().tlv(2, b"k").tlv(2, b"v").0;
    let msgs = vec![Msg {
        id: 1,
        origin_timestamp: 5,
        payload: b"x".to_vec(),
        user_headers: headers.clone(),
    }];
    let b = client_batch(&msgs);
    batch::validate(&b, 1, &LIMITS).unwrap();
    let tight = BatchLimits {
        user_headers_bytes_max: headers.len() as u32 - 1,
        ..LIMITS
    };
    let err = batch::validate(&b, 1, &tight).unwrap_err();
    assert!(matches!(err, BatchError::UserHeadersTooBig { index: 0, .. }));
    assert_eq!(err.status(), 4017);
}

#[test]
fn layout_is_checked_before_hashing() {
    // A corrupted checksum *and* a too-big payload: the limit wins, no hashing needed.
    let mut b = golden_batch();
    b[256] ^= 1;
    let tight = BatchLimits {
        message_payload_bytes_max: 1,
        ..LIMITS
    };
    assert!(matches!(
        batch::validate(&b, 2, &tight),
        Err(BatchError::PayloadTooBig { .. })
    ));
}

#[test]
fn check_layout_accepts_valid_and_refuses_broken() {
    let b = golden_batch();
    batch::check_layout(&b).unwrap();
    let mut broken = b.clone();
    broken[48] = 3;
    assert!(batch::check_layout(&broken).is_err());
    assert!(batch::check_layout(&b[..300]).is_err());
    let mut reserved = b.clone();
    reserved[100] = 1;
    assert_eq!(
        batch::check_layout(&reserved),
        Err(BatchError::InvalidReservedField)
    );
}

fn stamped_golden() -> Vec<u8> {
    let mut b = golden_batch();
    batch::stamp(&mut b, 0, 10, 2_000_000);
    b
}

#[test]
fn slice_whole_batch_copies_it_unchanged() {
    let b = stamped_golden();
    let mut out = vec![9u8; 3];
    assert_eq!(batch::slice_into(&b, 0, 100, &mut out), 2);
    assert_eq!(&out[..3], &[9, 9, 9]);
    assert_eq!(&out[3..], &b[..]);
    let mut out = Vec::new();
    assert_eq!(batch::slice_into(&b, 10, 2, &mut out), 2);
    assert_eq!(out, b);
}

#[test]
fn slice_sub_range_keeps_base_fields() {
    let b = stamped_golden();
    // From offset 11: only the second message.
    let mut out = Vec::new();
    assert_eq!(batch::slice_into(&b, 11, 100, &mut out), 1);
    let h = batch::check_layout(&out).unwrap();
    assert_eq!(h.base_offset, 10);
    assert_eq!(h.base_timestamp, 2_000_000);
    assert_eq!(h.origin_timestamp, 1_000_000);
    assert_eq!(h.message_count, 1);
    assert_eq!(h.batch_length, 256 + 54);
    assert_eq!(h.batch_checksum, batch::compute_checksum(&out));
    assert_eq!(&out[256..], &b[256 + 53..]);
    // offset_delta of the copied frame is still 1: offset = 10 + 1.
    assert_eq!(u32::from_le_bytes(out[256 + 24..256 + 28].try_into().unwrap()), 1);

    // At most one message from the start: the first frame only.
    let mut out = Vec::new();
    assert_eq!(batch::slice_into(&b, 0, 1, &mut out), 1);
    assert_eq!(batch::check_layout(&out).unwrap().batch_length, 256 + 53);
    assert_eq!(&out[256..], &b[256..256 + 53]);
    assert_eq!(read_u64(&out, 40), batch::compute_checksum(&out));
}

#[test]
fn slice_nothing() {
    let b = stamped_golden();
    let mut out = Vec::new();
    assert_eq!(batch::slice_into(&b, 12, 100, &mut out), 0);
    assert_eq!(batch::slice_into(&b, 0, 0, &mut out), 0);
    assert_eq!(batch::slice_into(&b[..100], 0, 10, &mut out), 0);
    assert_eq!(batch::slice_into(&b[..300], 0, 10, &mut out), 0);
    assert!(out.is_empty());
}

#[test]
fn plan_take_whole_part_and_nothing() {
    let b = stamped_golden();
    assert_eq!(
        batch::plan_take(&b, 0, 100),
        batch::Take::Whole {
            count: 2,
            last_offset: 11
        }
    );
    assert_eq!(
        batch::plan_take(&b, 10, 2),
        batch::Take::Whole {
            count: 2,
            last_offset: 11
        }
    );
    // The first frame is 53 bytes, the second 54.
    assert_eq!(
        batch::plan_take(&b, 11, 100),
        batch::Take::Part {
            frames: 256 + 53..b.len(),
            count: 1,
            last_offset: 11
        }
    );
    assert_eq!(
        batch::plan_take(&b, 0, 1),
        batch::Take::Part {
            frames: 256..256 + 53,
            count: 1,
            last_offset: 10
        }
    );
    assert_eq!(batch::plan_take(&b, 12, 100), batch::Take::Nothing);
    assert_eq!(batch::plan_take(&b, 0, 0), batch::Take::Nothing);
    assert_eq!(batch::plan_take(&b[..300], 0, 10), batch::Take::Nothing);
    assert_eq!(batch::Take::Nothing.count(), 0);
    assert_eq!(batch::plan_take(&b, 11, 100).last_offset(), Some(11));
}

#[test]
fn plan_take_refuses_offsets_that_do_not_increase() {
    let mut b = stamped_golden();
    // Second frame's offset_delta 1 -> 0: same offset as the first.
    b[256 + 53 + 24..256 + 53 + 28].copy_from_slice(&0u32.to_le_bytes());
    assert_eq!(batch::plan_take(&b, 0, 100), batch::Take::Nothing);
}

#[test]
fn cut_in_place_matches_slice_into() {
    let b = stamped_golden();
    for (from, max) in [(0, 100), (10, 2), (11, 100), (0, 1), (12, 100), (0, 0)] {
        let mut expected = vec![7u8; 5];
        batch::slice_into(&b, from, max, &mut expected);
        let mut in_place = vec![7u8; 5];
        in_place.extend_from_slice(&b);
        let take = batch::plan_take(&b, from, max);
        batch::cut_in_place(&mut in_place, 5, &take);
        assert_eq!(in_place, expected, "from {from} max {max}");
    }
}

#[test]
fn stamp_ignores_short_input() {
    let mut short = vec![1u8; 10];
    batch::stamp(&mut short, 1, 2, 3);
    assert_eq!(short, vec![1u8; 10]);
}

#[test]
fn batch_error_statuses() {
    assert_eq!(BatchError::InvalidMessagesCount("x").status(), 4009);
    assert_eq!(BatchError::Malformed("x").status(), 4);
    assert_eq!(BatchError::InvalidBatchChecksum.status(), 4039);
}

#[test]
fn last_offset_reads_the_deltas_across_batches_and_gaps() {
    // Two stamped batches whose offsets are not adjacent (a gap between 11 and 70000).
    let mut run = stamped_golden();
    let mut second = golden_batch();
    batch::stamp(&mut second, 0, 70_000, 2_000_000);
    run.extend_from_slice(&second);
    assert_eq!(batch::last_offset(&stamped_golden()), Some(11));
    assert_eq!(batch::last_offset(&run), Some(70_001));
    assert_eq!(batch::last_offset(&[]), None);
    // A batch cut short is not trusted.
    assert_eq!(batch::last_offset(&run[..run.len() - 1]), None);
}

/// `encode` reproduces the protocol's golden vector (§7.5) byte for byte in the fields it
/// documents, and what it produces passes `validate` and reads back through `messages`.
#[test]
fn encode_matches_the_golden_vector_and_round_trips() {
    let messages = [
        crate::batch::MessageIn {
            id: 1,
            origin_timestamp: 1_000_000,
            payload: b"hello",
            user_headers: &[],
        },
        crate::batch::MessageIn {
            id: 2,
            origin_timestamp: 1_000_010,
            payload: b"world!",
            user_headers: &[],
        },
    ];
    let encoded = crate::batch::encode(&messages).expect("encodes");
    assert_eq!(encoded.len(), 363);
    let head = crate::batch::header(&encoded).expect("header");
    assert_eq!(head.batch_length, 363);
    assert_eq!(head.message_count, 2);
    assert_eq!(head.batch_checksum, 0xaf72022a1dc71b41);
    let limits = crate::batch::BatchLimits {
        message_payload_bytes_max: 100,
        user_headers_bytes_max: 100,
        batch_bytes_max: 1000,
        batch_messages_max: 10,
    };
    crate::batch::validate(&encoded, 2, &limits).expect("valid");
    let read = crate::batch::messages(&encoded).expect("reads back");
    assert_eq!(read.len(), 2);
    assert_eq!(
        (read[0].id, read[0].offset, read[0].payload),
        (1, 0, &b"hello"[..])
    );
    assert_eq!(
        (read[1].id, read[1].offset, read[1].origin_timestamp),
        (2, 1, 1_000_010)
    );
}
