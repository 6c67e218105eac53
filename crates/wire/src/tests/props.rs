//! Property tests: no input makes the codec panic, and slicing keeps the batch invariants.

use super::{B, Msg, client_batch, golden_messages, send_body, version_prefix};
use crate::batch::{self, BatchLimits};
use crate::command::Command;
use crate::frame::{HEADER_SIZE, RequestHeader};
use proptest::prelude::*;

const LIMITS: BatchLimits = BatchLimits {
    message_payload_bytes_max: 1_000_000,
    user_headers_bytes_max: 100_000,
    batch_bytes_max: 10_000_000,
    batch_messages_max: 10_000,
};

/// Every op-2 code the decoder knows, plus the retired routing codes.
const KNOWN_CODES: &[u32] = &[
    1, 10, 11, 12, 13, 14, 20, 21, 22, 31, 32, 41, 100, 102, 103, 104, 120, 123, 200, 201, 300, 301, 600,
    601, 606,
];

/// One valid body per command shape, used as seeds for mutation.
fn valid_requests() -> Vec<(u8, u32, Vec<u8>)> {
    let perms = {
        let mut out = Vec::new();
        crate::reply::permissions(
            &mut out,
            &crate::types::Permissions {
                streams: vec![(
                    1,
                    crate::types::StreamPermissions {
                        topics: vec![(2, Default::default()), (3, Default::default())],
                        ..Default::default()
                    },
                )],
                ..Default::default()
            },
        );
        out
    };
    let consumer = || B::new().u8(1).id_num(0);
    let st = || B::new().id_str("stream").id_num(1);
    vec![
        (1, 0, version_prefix().name("iggy").name("iggy").u32(0).0),
        (1, 0, version_prefix().name("token-token").u32(0).0),
        (3, 0, vec![]),
        (2, 11, B::new().u8(1).u8(2).u8(1).u8(100).0),
        (2, 13, B::new().u8(1).0),
        (2, 21, B::new().u32(1).0),
        (2, 31, B::new().id_str("user").0),
        (
            2,
            100,
            consumer().raw(&st().0).u8(1).u32(0).u8(1).u64(3).u32(10).u8(1).0,
        ),
        (2, 102, st().u32(0).u8(1).0),
        (2, 120, consumer().raw(&st().0).u8(0).u32(0).0),
        (2, 300, st().0),
        (2, 606, st().id_num(0).0),
        (128, 0, B::new().name("s").opt("k", 2, b"v").0),
        (129, 0, B::new().id_num(1).name("s").0),
        (
            132,
            0,
            B::new()
                .id_num(1)
                .u32(2)
                .name("t")
                .opt("durability", 2, b"replicated")
                .opt("x", 12, &[0; 8])
                .0,
        ),
        (133, 0, st().name("t").opt("message_expiry", 2, b"7 days").0),
        (136, 0, st().u32(2).0),
        (138, 0, st().u32(0).u32(1).0),
        (139, 0, st().name("g").0),
        (
            141,
            0,
            B::new()
                .name("u")
                .name("p")
                .u8(1)
                .u8(1)
                .u32(perms.len() as u32)
                .raw(&perms)
                .0,
        ),
        (142, 0, B::new().id_num(1).u8(1).name("n").u8(1).u8(2).0),
        (144, 0, B::new().id_num(1).name("a").name("b").0),
        (
            145,
            0,
            B::new().id_num(1).u8(1).u32(perms.len() as u32).raw(&perms).0,
        ),
        (146, 0, B::new().name("pat").u64(0).0),
        (148, 0, st().id_str("g").0),
        (
            160,
            0,
            send_body(
                B::new().id_str("s").id_num(0).u8(3).name("key"),
                2,
                &client_batch(&golden_messages()),
            ),
        ),
        (161, 0, consumer().raw(&st().0).u8(1).u32(0).u64(5).u8(1).0),
        (162, 0, consumer().raw(&st().0).u8(0).u32(0).u8(1).0),
    ]
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip { at: usize, xor: u8 },
    Truncate { at: usize },
    Insert { at: usize, byte: u8 },
    Remove { at: usize },
    PutU32 { at: usize, value: u32 },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 1..=255u8).prop_map(|(at, xor)| Mutation::Flip { at, xor }),
        any::<usize>().prop_map(|at| Mutation::Truncate { at }),
        (any::<usize>(), any::<u8>()).prop_map(|(at, byte)| Mutation::Insert { at, byte }),
        any::<usize>().prop_map(|at| Mutation::Remove { at }),
        (
            any::<usize>(),
            prop_oneof![Just(0u32), Just(u32::MAX), Just(256), any::<u32>()]
        )
            .prop_map(|(at, value)| Mutation::PutU32 { at, value }),
    ]
}

fn apply(bytes: &mut Vec<u8>, mutations: &[Mutation]) {
    for m in mutations {
        let len = bytes.len();
        match *m {
            Mutation::Flip { at, xor } if len > 0 => bytes[at % len] ^= xor,
            Mutation::Truncate { at } => bytes.truncate(at % (len + 1)),
            Mutation::Insert { at, byte } => bytes.insert(at % (len + 1), byte),
            Mutation::Remove { at } if len > 0 => {
                bytes.remove(at % len);
            }
            Mutation::PutU32 { at, value } if len >= 4 => {
                let at = at % (len - 3);
                bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
            }
            _ => {}
        }
    }
}

/// Exercise every batch entry point on arbitrary bytes; none may panic.
fn poke_batch(bytes: &[u8], expected_count: u32) {
    let _ = batch::header(bytes);
    let _ = batch::validate(bytes, expected_count, &LIMITS);
    let _ = batch::check_layout(bytes);
    let _ = batch::compute_checksum(bytes);
    let mut out = Vec::new();
    let appended = batch::slice_into(bytes, 0, u32::MAX, &mut out);
    if appended == 0 {
        assert!(out.is_empty());
    }
    let _ = batch::slice_into(bytes, 1, 1, &mut out);
    let mut stamped = bytes.to_vec();
    batch::stamp(&mut stamped, 1, 2, 3);
    assert_eq!(stamped.len(), bytes.len());
}

fn message() -> impl Strategy<Value = Msg> {
    (
        any::<u128>(),
        0u64..1_000_000,
        prop::collection::vec(any::<u8>(), 1..40),
        prop::option::of(("[a-z]{1,8}", prop::collection::vec(any::<u8>(), 1..8))),
    )
        .prop_map(|(id, origin, payload, header)| Msg {
            id,
            origin_timestamp: 1_000_000 + origin,
            payload,
            user_headers: header
                .map(|(k, v)| B::new().tlv(2, k.as_bytes()).tlv(1, &v).0)
                .unwrap_or_default(),
        })
}

proptest! {
    #[test]
    fn decode_arbitrary_input_never_panics(
        operation in any::<u8>(),
        code in prop_oneof![prop::sample::select(KNOWN_CODES), any::<u32>()],
        body in prop::collection::vec(any::<u8>(), 0..300),
    ) {
        let _ = Command::decode(operation, code, body.into());
    }

    #[test]
    fn decode_mutated_valid_bodies_never_panics(
        index in any::<prop::sample::Index>(),
        mutations in prop::collection::vec(mutation(), 1..4),
    ) {
        let requests = valid_requests();
        let (operation, code, body) = index.get(&requests).clone();
        // The seed itself must decode.
        prop_assert!(Command::decode(operation, code, body.clone().into()).is_ok());
        let mut mutated = body;
        apply(&mut mutated, &mutations);
        let _ = Command::decode(operation, code, mutated.into());
    }

    #[test]
    fn batch_functions_never_panic_on_random_bytes(
        bytes in prop::collection::vec(any::<u8>(), 0..700),
        expected_count in 0u32..4,
    ) {
        poke_batch(&bytes, expected_count);
    }

    #[test]
    fn batch_functions_never_panic_on_mutated_batches(
        messages in prop::collection::vec(message(), 1..5),
        mutations in prop::collection::vec(mutation(), 1..4),
    ) {
        let mut bytes = client_batch(&messages);
        prop_assert!(batch::validate(&bytes, messages.len() as u32, &LIMITS).is_ok());
        apply(&mut bytes, &mutations);
        poke_batch(&bytes, messages.len() as u32);
    }

    #[test]
    fn header_parse_never_panics(
        raw in prop::collection::vec(any::<u8>(), HEADER_SIZE),
        make_request in any::<bool>(),
        max in any::<u32>(),
    ) {
        let mut header = [0u8; HEADER_SIZE];
        header.copy_from_slice(&raw);
        if make_request {
            header[60] = 5;
        }
        if let Ok(parsed) = RequestHeader::parse(&header, max) {
            prop_assert!(parsed.size as usize >= HEADER_SIZE && parsed.size <= max);
            prop_assert_eq!(parsed.body_len(), parsed.size as usize - HEADER_SIZE);
            let reply = crate::frame::reply_header(&parsed, 0, 0);
            prop_assert_eq!(reply[208], parsed.operation);
        }
    }

    #[test]
    fn slices_of_stamped_batches_keep_layout_and_offsets(
        messages in prop::collection::vec(message(), 1..8),
        base_offset in 0u64..(u64::MAX / 2),
        skip in 0u64..10,
        max_messages in 0u32..10,
    ) {
        let count = messages.len() as u64;
        let mut stored = client_batch(&messages);
        batch::validate(&stored, count as u32, &LIMITS).unwrap();
        batch::stamp(&mut stored, 3, base_offset, 42);
        batch::validate(&stored, count as u32, &LIMITS).unwrap();

        let from_offset = base_offset + skip;
        let mut out = Vec::new();
        let appended = batch::slice_into(&stored, from_offset, max_messages, &mut out);
        let expected = count.saturating_sub(skip).min(u64::from(max_messages));
        prop_assert_eq!(u64::from(appended), expected);
        if appended == 0 {
            prop_assert!(out.is_empty());
            return Ok(());
        }
        let header = batch::check_layout(&out).unwrap();
        prop_assert_eq!(header.message_count, appended);
        prop_assert_eq!(header.base_offset, base_offset);
        prop_assert_eq!(header.base_timestamp, 42);
        prop_assert_eq!(header.partition_id, 3);
        prop_assert_eq!(header.batch_checksum, batch::compute_checksum(&out));
        // Offsets the client derives: base_offset + offset_delta, consecutive from the start.
        let mut at = batch::BATCH_HEADER_SIZE;
        let mut offsets = Vec::new();
        while at < out.len() {
            let field = |o: usize| u32::from_le_bytes(out[at + o..at + o + 4].try_into().unwrap());
            offsets.push(base_offset + u64::from(field(24)));
            let frame_len = batch::FRAME_HEADER_SIZE + field(32) as usize + field(36) as usize;
            // Frames are copied byte for byte, so their checksums still hold.
            let checksum = u64::from_le_bytes(out[at..at + 8].try_into().unwrap());
            prop_assert_eq!(checksum, xxhash_rust::xxh3::xxh3_64(&out[at + 8..at + frame_len]));
            at += frame_len;
        }
        let wanted: Vec<u64> = (from_offset..from_offset + u64::from(appended)).collect();
        prop_assert_eq!(offsets, wanted);
    }
}
