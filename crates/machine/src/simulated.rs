//! The metadata machine as the VSR simulator runs it (`cairn_vsr::sim::cluster::Sim`): the
//! ops its clients send, drawn from the run's seed, and the digest the checkers compare.
//!
//! The ops come from a small alphabet of names and ids, so that many collide and are refused
//! (a refusal must be refused identically everywhere) and the state stays small enough for
//! the simulator's checkpoint slots. A quarter carry a long name, so their prepares span two
//! sectors and a crash can tear them.

use crate::metadata::{MetadataMachine, MetadataOp, OPERATION_METADATA, PurgeMark, TopicSettings};
use cairn_vsr::sim::cluster::SimMachine;
use cairn_vsr::sim::prng::{PPM, Prng};

const NAMES: [&str; 4] = ["a", "b", "c", "d"];

fn name(prng: &mut Prng) -> String {
    let short = NAMES[prng.below(NAMES.len() as u64) as usize];
    if prng.chance_ppm(PPM / 4) {
        // Long enough that the prepare spans two 512-byte sectors.
        format!("{short}-{}", "x".repeat(300))
    } else {
        short.to_string()
    }
}

fn id(prng: &mut Prng) -> u32 {
    prng.below(4) as u32
}

fn draw(prng: &mut Prng) -> MetadataOp {
    match prng.below(14) {
        0 | 1 => MetadataOp::CreateStream {
            name: name(prng),
            created_at_us: prng.below(1_000_000),
        },
        2 => MetadataOp::UpdateStream {
            stream_id: id(prng),
            name: name(prng),
        },
        3 => MetadataOp::DeleteStream { stream_id: id(prng) },
        4 | 5 => MetadataOp::CreateTopic {
            stream_id: id(prng),
            name: name(prng),
            created_at_us: prng.below(1_000_000),
            partitions_count: prng.below(3) as u32,
            settings: TopicSettings {
                message_expiry_us: prng.chance_ppm(PPM / 2).then(|| prng.below(10_000_000)),
                ..TopicSettings::default()
            },
        },
        6 => MetadataOp::DeleteTopic {
            stream_id: id(prng),
            topic_id: id(prng),
        },
        7 => MetadataOp::CreatePartitions {
            stream_id: id(prng),
            topic_id: id(prng),
            count: 1 + prng.below(2) as u32,
            created_at_us: prng.below(1_000_000),
        },
        8 => MetadataOp::DeletePartitions {
            stream_id: id(prng),
            topic_id: id(prng),
            count: 1 + prng.below(2) as u32,
        },
        9 => MetadataOp::CreateGroup {
            stream_id: id(prng),
            topic_id: id(prng),
            name: name(prng),
        },
        10 => MetadataOp::CreateUser {
            username: format!("user-{}", NAMES[prng.below(NAMES.len() as u64) as usize]),
            password_hash: format!("hash-{}", prng.below(1_000)),
            status: 1 + prng.below(2) as u8,
            permissions: None,
            created_at_us: prng.below(1_000_000),
        },
        11 => MetadataOp::DeleteUser {
            user_id: 1 + id(prng),
        },
        12 => MetadataOp::CreateToken {
            user_id: 1 + id(prng),
            token_id: prng.below(64),
            name: format!("token-{}", NAMES[prng.below(NAMES.len() as u64) as usize]),
            token_hash: format!("hash-{}", prng.below(1_000)),
            expiry_at_us: 0,
        },
        _ => MetadataOp::MarkPurge {
            stream_id: id(prng),
            marks: vec![PurgeMark {
                topic_id: id(prng),
                partition_id: prng.below(3) as u32,
                target: prng.below(1_000),
            }],
        },
    }
}

impl SimMachine for MetadataMachine {
    fn digest(&self) -> u64 {
        xxhash_rust::xxh3::xxh3_64(&self.state.snapshot())
    }

    fn request(prng: &mut Prng, _request: u64, body_max: usize) -> (u8, Vec<u8>) {
        let mut body = draw(prng).encode();
        if body.len() > body_max {
            body = MetadataOp::DeleteStream { stream_id: 0 }.encode();
        }
        (OPERATION_METADATA, body)
    }
}

/// The partition machine as the simulator runs it: mostly appends of one or two small
/// batches (a third large enough to span two sectors, so crashes tear them; each client's
/// clock runs on its own, so requests arrive out of timestamp order), malformed appends now
/// and then (refused alike everywhere), and offset stores (some past the log's end), deletes,
/// purges, trims and skips among them. Its checkers: the manifest (digest of every
/// committed batch included) equal after every op on every replica, and every append's
/// batches continuing the committed log exactly (no offset minted twice).
mod partition_workload {
    use crate::partition::{
        OPERATION_APPEND, OPERATION_DELETE_OFFSET, OPERATION_PURGE, OPERATION_SKIP, OPERATION_STORE_OFFSET,
        OPERATION_TRIM, Owner, PartitionMachine, encode_append, encode_offset_op, encode_purge, encode_skip,
        encode_trim,
    };
    use cairn_vsr::replica::StateMachine;
    use cairn_vsr::sim::cluster::SimMachine;
    use cairn_vsr::sim::prng::{PPM, Prng};
    use cairn_wire::batch::{MessageIn, encode};

    fn owner(prng: &mut Prng) -> Owner {
        match prng.below(3) {
            0 => Owner::Consumer(prng.below(3) as u32),
            1 => Owner::ConsumerName(["x", "y"][prng.below(2) as usize].to_string()),
            _ => Owner::Group(prng.below(3) as u32),
        }
    }

    fn client_batch(prng: &mut Prng, request: u64, large: bool) -> Vec<u8> {
        let count = 1 + prng.below(2) as usize;
        let payload_len = if large { 120 } else { 1 + prng.below(16) as usize };
        let payloads: Vec<Vec<u8>> = (0..count)
            .map(|index| vec![(request as u8) ^ (index as u8); payload_len])
            .collect();
        let messages: Vec<MessageIn<'_>> = payloads
            .iter()
            .enumerate()
            .map(|(index, payload)| MessageIn {
                id: u128::from(request) << 8 | index as u128,
                origin_timestamp: request,
                payload,
                user_headers: &[],
            })
            .collect();
        encode(&messages).expect("small messages encode")
    }

    impl SimMachine for PartitionMachine {
        fn digest(&self) -> u64 {
            xxhash_rust::xxh3::xxh3_64(&self.snapshot())
        }

        fn fault(&self) -> Option<&str> {
            PartitionMachine::fault(self)
        }

        fn request(prng: &mut Prng, request: u64, body_max: usize) -> (u8, Vec<u8>) {
            let draw = prng.below(20);
            let (operation, body) = match draw {
                0..=13 => {
                    let large = prng.chance_ppm(PPM / 3);
                    let mut batches = vec![client_batch(prng, request, large)];
                    if prng.chance_ppm(PPM / 3) {
                        batches.push(client_batch(prng, request + 1, false));
                    }
                    let refs: Vec<&[u8]> = batches.iter().map(Vec::as_slice).collect();
                    let mut body = encode_append(request * 1_000, &refs);
                    if prng.chance_ppm(PPM / 20) {
                        // Cut inside the last batch: malformed, refused alike everywhere.
                        body.truncate(body.len() - 1);
                    }
                    (OPERATION_APPEND, body)
                }
                14..=16 => (
                    OPERATION_STORE_OFFSET,
                    encode_offset_op(&owner(prng), Some(prng.below(64))),
                ),
                17 => (OPERATION_DELETE_OFFSET, encode_offset_op(&owner(prng), None)),
                18 => (OPERATION_PURGE, encode_purge(prng.below(64))),
                // A skip (after an unclean relaxed stop): often a gap, sometimes nothing.
                _ if prng.chance_ppm(PPM / 4) => (OPERATION_SKIP, encode_skip(prng.below(256))),
                _ => (OPERATION_TRIM, encode_trim(prng.below(64))),
            };
            if body.len() > body_max {
                return (OPERATION_TRIM, encode_trim(prng.below(64)));
            }
            (operation, body)
        }
    }
}
