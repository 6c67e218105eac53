use super::{B, version_prefix};
use crate::command::{ClientVersionInfo, Command, DecodeError};
use crate::reply;
use crate::types::{
    self, Consumer, GlobalPermissions, Identifier, OptionEntry, Partitioning, Permissions, PollingStrategy,
    StreamPermissions, TopicPermissions,
};
use xxhash_rust::xxh3::xxh3_64;

fn op2(code: u32, body: B) -> Result<Command, DecodeError> {
    Command::decode(2, code, body.bytes())
}

fn op(operation: u8, body: B) -> Result<Command, DecodeError> {
    Command::decode(operation, 0, body.bytes())
}

fn malformed<T: std::fmt::Debug>(r: Result<T, DecodeError>) {
    assert!(
        matches!(r, Err(DecodeError::Malformed(_))),
        "expected Malformed, got {r:?}"
    );
}

fn sdk_version() -> ClientVersionInfo {
    ClientVersionInfo {
        protocol_version: 0x2C00,
        sdk_name: "rust-sdk".into(),
        sdk_version: "0.11.0".into(),
    }
}

fn num(v: u32) -> Identifier {
    Identifier::Numeric(v)
}

fn named(v: &str) -> Identifier {
    Identifier::Name(v.into())
}

// ---------------------------------------------------------------- login / logout

#[test]
fn password_login_matches_the_mock_run() {
    let body = version_prefix().name("iggy").name("iggy").u32(0);
    assert_eq!(body.0.len(), 34);
    assert_eq!(
        &xxh3_64(&body.0).to_le_bytes(),
        &[0x95, 0x80, 0x3f, 0x2a, 0x3c, 0x20, 0xde, 0x8f]
    );
    assert_eq!(
        Command::decode(1, 0, body.bytes()).unwrap(),
        Command::LoginUser {
            version: sdk_version(),
            username: "iggy".into(),
            password: "iggy".into()
        }
    );
}

#[test]
fn token_login_is_told_apart_by_parsing() {
    let body = version_prefix().name("tokn").u32(0);
    assert_eq!(
        Command::decode(1, 0, body.bytes()).unwrap(),
        Command::LoginWithToken {
            version: sdk_version(),
            token: "tokn".into()
        }
    );
    // A long token too.
    let token = "t".repeat(200);
    let body = version_prefix().name(&token).u32(0);
    assert_eq!(
        Command::decode(1, 0, body.bytes()).unwrap(),
        Command::LoginWithToken {
            version: sdk_version(),
            token
        }
    );
}

#[test]
fn login_context_is_read_and_dropped() {
    let body = version_prefix().name("iggy").name("secret").lstr("ctx");
    assert!(matches!(
        Command::decode(1, 0, body.bytes()),
        Ok(Command::LoginUser { .. })
    ));
    let body = version_prefix().name("tok").lstr("ctx");
    assert!(matches!(
        Command::decode(1, 0, body.bytes()),
        Ok(Command::LoginWithToken { .. })
    ));
}

#[test]
fn bad_logins_are_malformed() {
    malformed(Command::decode(1, 0, B::new().bytes()));
    malformed(Command::decode(1, 0, version_prefix().bytes()));
    malformed(Command::decode(
        1,
        0,
        version_prefix().name("iggy").name("iggy").u32(0).u8(0).bytes(),
    ));
    malformed(Command::decode(
        1,
        0,
        version_prefix().name("iggy").name("iggy").u32(5).bytes(),
    ));
    // Empty sdk name.
    malformed(Command::decode(
        1,
        0,
        B::new().u32(0x2C00).u8(0).name("0.11.0").name("t").u32(0).bytes(),
    ));
    // Non-UTF-8 password and token.
    malformed(Command::decode(
        1,
        0,
        version_prefix().u8(2).raw(&[0xff, 0xfe]).u32(0).bytes(),
    ));
}

#[test]
fn logout_has_an_empty_body() {
    assert_eq!(Command::decode(3, 0, B::new().bytes()), Ok(Command::Logout));
    malformed(Command::decode(3, 0, B::new().u8(0).bytes()));
}

// ---------------------------------------------------------------- op 2

#[test]
fn empty_body_reads() {
    let cases = [
        (1, Command::Ping),
        (10, Command::GetStats),
        (12, Command::GetClusterMetadata),
        (20, Command::GetMe),
        (22, Command::GetClients),
        (32, Command::GetUsers),
        (41, Command::GetPersonalAccessTokens),
        (201, Command::GetStreams),
    ];
    for (code, expected) in cases {
        assert_eq!(op2(code, B::new()), Ok(expected), "code {code}");
        malformed(op2(code, B::new().u8(0)));
    }
}

#[test]
fn system_reads_with_bodies() {
    assert_eq!(
        op2(11, B::new().u8(2).u8(2).u8(1).u8(100)),
        Ok(Command::GetSnapshot {
            compression: 2,
            snapshot_types: vec![1, 100]
        })
    );
    malformed(op2(11, B::new().u8(2).u8(3).u8(1)));
    malformed(op2(11, B::new().u8(2).u8(0).u8(1)));
    assert_eq!(op2(13, B::new().u8(1)), Ok(Command::DescribeOptions { scope: 1 }));
    assert_eq!(op2(13, B::new().u8(3)), Ok(Command::DescribeOptions { scope: 3 }));
    malformed(op2(13, B::new().u8(4)));
    malformed(op2(13, B::new().u8(0)));
    malformed(op2(13, B::new()));
    assert_eq!(
        op2(21, B::new().u32(77)),
        Ok(Command::GetClient { client_id: 77 })
    );
    malformed(op2(21, B::new().u16(1)));
    assert_eq!(
        op2(31, B::new().id_str("bob")),
        Ok(Command::GetUser { user: named("bob") })
    );
}

#[test]
fn stream_topic_group_reads() {
    assert_eq!(
        op2(200, B::new().id_num(3)),
        Ok(Command::GetStream { stream: num(3) })
    );
    assert_eq!(
        op2(300, B::new().id_num(3).id_str("t")),
        Ok(Command::GetTopic {
            stream: num(3),
            topic: named("t")
        })
    );
    assert_eq!(
        op2(301, B::new().id_str("s")),
        Ok(Command::GetTopics { stream: named("s") })
    );
    assert_eq!(
        op2(600, B::new().id_num(1).id_num(2).id_str("g")),
        Ok(Command::GetConsumerGroup {
            stream: num(1),
            topic: num(2),
            group: named("g")
        })
    );
    assert_eq!(
        op2(601, B::new().id_num(1).id_num(2)),
        Ok(Command::GetConsumerGroups {
            stream: num(1),
            topic: num(2)
        })
    );
    assert_eq!(
        op2(606, B::new().id_num(1).id_num(2).id_num(0)),
        Ok(Command::SyncConsumerGroup {
            stream: num(1),
            topic: num(2),
            group: num(0)
        })
    );
    malformed(op2(606, B::new().id_num(1).id_num(2).id_num(0).u8(9)));
    malformed(op2(600, B::new().id_num(1).id_num(2)));
}

#[test]
fn poll_messages() {
    let body = B::new()
        .u8(1)
        .id_num(0)
        .id_str("s")
        .id_num(1)
        .u8(0)
        .u32(0)
        .u8(1)
        .u64(5)
        .u32(10)
        .u8(0);
    assert_eq!(
        op2(100, body),
        Ok(Command::PollMessages {
            consumer: Consumer::Consumer(num(0)),
            stream: named("s"),
            topic: num(1),
            partition_id: None,
            strategy: PollingStrategy::Offset(5),
            count: 10,
            auto_commit: false,
        })
    );
    let strategies = [
        (2, PollingStrategy::Timestamp(99)),
        (3, PollingStrategy::First),
        (4, PollingStrategy::Last),
        (5, PollingStrategy::Next),
    ];
    for (kind, expected) in strategies {
        let value = if kind == 2 { 99 } else { 0 };
        let body = B::new()
            .u8(2)
            .id_str("grp")
            .id_num(1)
            .id_num(2)
            .u8(1)
            .u32(3)
            .u8(kind)
            .u64(value)
            .u32(1)
            .u8(1);
        assert_eq!(
            op2(100, body),
            Ok(Command::PollMessages {
                consumer: Consumer::Group(named("grp")),
                stream: num(1),
                topic: num(2),
                partition_id: Some(3),
                strategy: expected,
                count: 1,
                auto_commit: true,
            })
        );
    }
    let base = |consumer_kind: u8, flag: u8, strategy: u8| {
        B::new()
            .u8(consumer_kind)
            .id_num(0)
            .id_num(1)
            .id_num(1)
            .u8(flag)
            .u32(0)
            .u8(strategy)
            .u64(0)
            .u32(1)
            .u8(0)
    };
    malformed(op2(100, base(3, 0, 1)));
    malformed(op2(100, base(1, 2, 1)));
    malformed(op2(100, base(1, 0, 6)));
    malformed(op2(100, base(1, 0, 0)));
    malformed(op2(100, base(1, 0, 1).u8(0)));
    let mut short = base(1, 0, 1);
    short.0.pop();
    malformed(op2(100, short));
}

#[test]
fn flush_and_offsets() {
    assert_eq!(
        op2(102, B::new().id_num(1).id_num(2).u32(0).u8(1)),
        Ok(Command::FlushUnsavedBuffer {
            stream: num(1),
            topic: num(2),
            partition_id: 0,
            fsync: true
        })
    );
    assert_eq!(
        op2(120, B::new().u8(1).id_num(7).id_num(1).id_num(2).u8(1).u32(4)),
        Ok(Command::GetConsumerOffset {
            consumer: Consumer::Consumer(num(7)),
            stream: num(1),
            topic: num(2),
            partition_id: Some(4),
        })
    );
    assert_eq!(
        op(
            161,
            B::new()
                .u8(2)
                .id_num(7)
                .id_num(1)
                .id_num(2)
                .u8(0)
                .u32(0)
                .u64(42)
                .u8(1)
        ),
        Ok(Command::StoreConsumerOffset {
            consumer: Consumer::Group(num(7)),
            stream: num(1),
            topic: num(2),
            partition_id: None,
            offset: 42,
        })
    );
    malformed(op(
        161,
        B::new()
            .u8(2)
            .id_num(7)
            .id_num(1)
            .id_num(2)
            .u8(0)
            .u32(0)
            .u64(42)
            .u8(2),
    ));
    assert_eq!(
        op(
            162,
            B::new().u8(1).id_num(7).id_num(1).id_num(2).u8(1).u32(1).u8(0)
        ),
        Ok(Command::DeleteConsumerOffset {
            consumer: Consumer::Consumer(num(7)),
            stream: num(1),
            topic: num(2),
            partition_id: Some(1),
        })
    );
    malformed(op(162, B::new().u8(1).id_num(7).id_num(1).id_num(2).u8(1).u32(1)));
}

#[test]
fn unknown_op2_codes() {
    for code in [0, 2, 38, 39, 40, 44, 45, 101, 121, 202, 503, 999, u32::MAX] {
        let err = op2(code, B::new()).unwrap_err();
        assert_eq!(err, DecodeError::UnknownCommand { operation: 2, code });
        assert_eq!(err.status(), 3);
    }
}

/// The SDK's routing commands with more than one node (docs/cluster.md): 103 carries a
/// whole poll and routes by its partition, 123 a GetConsumerOffset body, 104 is a poll, 14
/// is exactly 32 bytes.
#[test]
fn cluster_routing_commands() {
    let poll = || {
        B::new()
            .u8(1)
            .id_num(7)
            .id_num(1)
            .id_num(2)
            .u8(1)
            .u32(3)
            .u8(5)
            .u64(0)
            .u32(10)
            .u8(1)
    };
    assert_eq!(
        op2(103, poll()),
        Ok(Command::GetPollRouting {
            consumer: Consumer::Consumer(num(7)),
            stream: num(1),
            topic: num(2),
            partition_id: Some(3),
        })
    );
    assert_eq!(
        op2(104, poll()),
        Ok(Command::PollMessages {
            consumer: Consumer::Consumer(num(7)),
            stream: num(1),
            topic: num(2),
            partition_id: Some(3),
            strategy: PollingStrategy::Next,
            count: 10,
            auto_commit: true,
        })
    );
    assert_eq!(
        op2(123, B::new().u8(2).id_str("g").id_num(1).id_num(2).u8(0).u32(0)),
        Ok(Command::GetConsumerOffsetRouting {
            consumer: Consumer::Group(named("g")),
            stream: num(1),
            topic: num(2),
            partition_id: None,
        })
    );
    assert_eq!(
        op2(14, B::new().u128(9).u64(4).u64(2)),
        Ok(Command::AttachConsumerSession {
            client: 9,
            session: 4,
            metadata_watermark: 2,
        })
    );
    malformed(op2(14, B::new().u128(9).u64(4)));
    malformed(op2(14, B::new().u128(9).u64(4).u64(2).u8(0)));
    // A routing request whose poll part is cut short is refused like the poll.
    malformed(op2(
        103,
        B::new().u8(1).id_num(7).id_num(1).id_num(2).u8(1).u32(3),
    ));
}

#[test]
fn unknown_operations() {
    let mut unknown: Vec<u8> = vec![
        0, 4, 63, 64, 65, 66, 67, 68, 69, 127, 150, 155, 159, 163, 200, 255,
    ];
    unknown.extend(150..=159);
    for operation in unknown {
        let err = Command::decode(operation, 5, B::new().u8(1).bytes()).unwrap_err();
        assert_eq!(err, DecodeError::UnknownCommand { operation, code: 5 });
    }
}

// ---------------------------------------------------------------- streams / topics

#[test]
fn streams() {
    assert_eq!(
        op(128, B::new().name("orders")),
        Ok(Command::CreateStream {
            name: "orders".into(),
            options: vec![]
        })
    );
    malformed(op(128, B::new().u8(0)));
    malformed(op(128, B::new()));
    assert_eq!(
        op(129, B::new().id_num(1).name("renamed")),
        Ok(Command::UpdateStream {
            stream: num(1),
            name: "renamed".into(),
            options: vec![]
        })
    );
    assert_eq!(
        op(130, B::new().id_num(1)),
        Ok(Command::DeleteStream { stream: num(1) })
    );
    assert_eq!(
        op(131, B::new().id_str("x")),
        Ok(Command::PurgeStream { stream: named("x") })
    );
    malformed(op(131, B::new().id_str("x").u8(0)));
}

#[test]
fn create_topic_with_the_sdk_option_block() {
    let body = B::new()
        .id_num(1)
        .u32(3)
        .name("events")
        .opt("consumer_offset_durability", 2, b"replicated")
        .opt("durability", 2, b"replicated");
    // The observed block layout (§6.5).
    let block = &body.0[1 + 1 + 4 + 4 + 7..];
    assert_eq!(&block[..5], &[2, 0x1a, 0, 0, 0]);
    let Command::CreateTopic {
        stream,
        partitions_count,
        name,
        options,
    } = op(132, body).unwrap()
    else {
        panic!("not CreateTopic");
    };
    assert_eq!((stream, partitions_count, name.as_str()), (num(1), 3, "events"));
    assert_eq!(
        options,
        vec![
            OptionEntry {
                key: "consumer_offset_durability".into(),
                value_kind: 2,
                value: b"replicated".to_vec()
            },
            OptionEntry {
                key: "durability".into(),
                value_kind: 2,
                value: b"replicated".to_vec()
            },
        ]
    );
    assert_eq!(types::option_str(&options[1]), Some("replicated"));
}

#[test]
fn update_topic_and_other_topic_ops() {
    let body = B::new()
        .id_num(1)
        .id_str("t")
        .name("t2")
        .opt("message_expiry", 12, &7u64.to_le_bytes());
    let Command::UpdateTopic {
        stream,
        topic,
        name,
        options,
    } = op(133, body).unwrap()
    else {
        panic!("not UpdateTopic");
    };
    assert_eq!((stream, topic, name.as_str()), (num(1), named("t"), "t2"));
    assert_eq!(types::option_u64(&options[0]), Some(7));
    assert_eq!(
        op(134, B::new().id_num(1).id_num(2)),
        Ok(Command::DeleteTopic {
            stream: num(1),
            topic: num(2)
        })
    );
    assert_eq!(
        op(135, B::new().id_num(1).id_num(2)),
        Ok(Command::PurgeTopic {
            stream: num(1),
            topic: num(2)
        })
    );
    assert_eq!(
        op(136, B::new().id_num(1).id_num(2).u32(4)),
        Ok(Command::CreatePartitions {
            stream: num(1),
            topic: num(2),
            partitions_count: 4
        })
    );
    assert_eq!(
        op(137, B::new().id_num(1).id_num(2).u32(1)),
        Ok(Command::DeletePartitions {
            stream: num(1),
            topic: num(2),
            partitions_count: 1
        })
    );
    assert_eq!(
        op(138, B::new().id_num(1).id_num(2).u32(0).u32(5)),
        Ok(Command::DeleteSegments {
            stream: num(1),
            topic: num(2),
            partition_id: 0,
            segments_count: 5
        })
    );
    malformed(op(138, B::new().id_num(1).id_num(2).u32(0)));
}

#[test]
fn option_block_shape_errors() {
    let create = |block: B| op(128, B::new().name("s").raw(&block.0));
    // Odd number of fields.
    malformed(create(B::new().tlv(2, b"k")));
    // Key not a string.
    malformed(create(B::new().tlv(12, &[1; 8]).tlv(2, b"v")));
    // Field lengths 0 and 256.
    malformed(create(B::new().tlv(2, b"k").tlv(2, b"")));
    malformed(create(B::new().tlv(2, &[b'k'; 256]).tlv(2, b"v")));
    // Kinds 0 and 16.
    malformed(create(B::new().tlv(2, b"k").tlv(0, b"v")));
    malformed(create(B::new().tlv(2, b"k").tlv(16, b"v")));
    // Non-UTF-8 key.
    malformed(create(B::new().tlv(2, &[0xff]).tlv(2, b"v")));
    // Duplicate key.
    malformed(create(B::new().opt("a", 2, b"1").opt("a", 2, b"2")));
    // Truncated.
    let mut truncated = B::new().opt("a", 2, b"1");
    truncated.0.pop();
    malformed(create(truncated));
    malformed(create(B::new().u8(2).u8(1)));
    // Lengths 1 and 255 are fine; any value kind 1..=15 is kept raw.
    let ok = create(B::new().opt(&"k".repeat(255), 15, &[0; 255]).opt("x", 1, &[9])).unwrap();
    let Command::CreateStream { options, .. } = ok else {
        panic!()
    };
    assert_eq!(options.len(), 2);
    assert_eq!(
        options[1],
        OptionEntry {
            key: "x".into(),
            value_kind: 1,
            value: vec![9]
        }
    );
}

#[test]
fn option_block_limits() {
    let create = |block: &B| op(128, B::new().name("s").raw(&block.0));
    let mut pairs = B::new();
    for i in 0..1024 {
        pairs = pairs.opt(&format!("k{i}"), 2, b"v");
    }
    let Command::CreateStream { options, .. } = create(&pairs).unwrap() else {
        panic!()
    };
    assert_eq!(options.len(), 1024);
    malformed(create(&pairs.clone().opt("one-more", 2, b"v")));

    // 200 pairs of 255-byte keys and values: 103 000 bytes > 100 000.
    let mut big = B::new();
    for i in 0..200 {
        big = big.opt(&format!("{i:0>255}"), 2, &[b'v'; 255]);
    }
    assert!(big.0.len() > 100_000);
    malformed(create(&big));
}

// ---------------------------------------------------------------- identifiers and names

#[test]
fn identifier_rules() {
    let get = |id: B| op2(200, id);
    assert_eq!(
        get(B::new().u8(1).u8(3).raw(&[1, 2, 3])),
        Err(DecodeError::InvalidIdentifier)
    );
    assert_eq!(
        get(B::new().u8(1).u8(5).raw(&[1, 2, 3, 4, 5])),
        Err(DecodeError::InvalidIdentifier)
    );
    assert_eq!(get(B::new().u8(2).u8(0)), Err(DecodeError::InvalidIdentifier));
    assert_eq!(
        get(B::new().u8(3).u8(1).u8(b'a')),
        Err(DecodeError::InvalidIdentifier)
    );
    assert_eq!(
        get(B::new().u8(0).u8(4).u32(1)),
        Err(DecodeError::InvalidIdentifier)
    );
    assert_eq!(
        get(B::new().u8(2).u8(2).raw(&[0xc3, 0x28])),
        Err(DecodeError::InvalidIdentifier)
    );
    assert_eq!(DecodeError::InvalidIdentifier.status(), 6);
    // Truncated identifiers are a layout problem.
    malformed(get(B::new().u8(1).u8(4).u16(1)));
    malformed(get(B::new().u8(1)));
    malformed(get(B::new()));
    // 255-byte names are the maximum.
    let long = "n".repeat(255);
    assert_eq!(
        get(B::new().id_str(&long)),
        Ok(Command::GetStream { stream: named(&long) })
    );
}

#[test]
fn identifier_display() {
    assert_eq!(num(7).to_string(), "7");
    assert_eq!(named("orders").to_string(), "orders");
}

// ---------------------------------------------------------------- users, PATs

fn sample_permissions() -> Permissions {
    Permissions {
        global: GlobalPermissions {
            manage_servers: true,
            read_users: true,
            send_messages: true,
            ..Default::default()
        },
        streams: vec![
            (
                1,
                StreamPermissions {
                    read_stream: true,
                    poll_messages: true,
                    topics: vec![
                        (
                            10,
                            TopicPermissions {
                                manage_topic: true,
                                ..Default::default()
                            },
                        ),
                        (
                            20,
                            TopicPermissions {
                                send_messages: true,
                                ..Default::default()
                            },
                        ),
                    ],
                    ..Default::default()
                },
            ),
            (
                2,
                StreamPermissions {
                    manage_stream: true,
                    ..Default::default()
                },
            ),
        ],
    }
}

fn encoded_permissions(p: &Permissions) -> Vec<u8> {
    let mut out = Vec::new();
    reply::permissions(&mut out, p);
    out
}

#[test]
fn create_user_without_and_with_permissions() {
    assert_eq!(
        op(141, B::new().name("alice").name("secret").u8(1).u8(0)),
        Ok(Command::CreateUser {
            username: "alice".into(),
            password: "secret".into(),
            status: 1,
            permissions: None
        })
    );
    let perms = encoded_permissions(&sample_permissions());
    let body = B::new()
        .name("alice")
        .name("secret")
        .u8(2)
        .u8(1)
        .u32(perms.len() as u32)
        .raw(&perms);
    assert_eq!(
        op(141, body),
        Ok(Command::CreateUser {
            username: "alice".into(),
            password: "secret".into(),
            status: 2,
            permissions: Some(sample_permissions()),
        })
    );
    // Options (none are defined for users) are shape-checked.
    assert!(op(141, B::new().name("a").name("p").u8(1).u8(0).opt("k", 2, b"v")).is_ok());
    malformed(op(141, B::new().name("a").name("p").u8(1).u8(0).u8(7)));
    // The permissions length must match the content exactly.
    let body = B::new()
        .name("a")
        .name("p")
        .u8(1)
        .u8(1)
        .u32(perms.len() as u32 + 1)
        .raw(&perms)
        .u8(0);
    malformed(op(141, body));
    let body = B::new()
        .name("a")
        .name("p")
        .u8(1)
        .u8(1)
        .u32(perms.len() as u32 - 1)
        .raw(&perms);
    malformed(op(141, body));
    malformed(op(141, B::new().name("a").name("p").u8(1).u8(2)));
}

#[test]
fn update_user_and_permissions() {
    assert_eq!(
        op(142, B::new().id_num(3).u8(1).name("new").u8(1).u8(2)),
        Ok(Command::UpdateUser {
            user: num(3),
            username: Some("new".into()),
            status: Some(2)
        })
    );
    assert_eq!(
        op(142, B::new().id_num(3).u8(0).u8(0)),
        Ok(Command::UpdateUser {
            user: num(3),
            username: None,
            status: None
        })
    );
    malformed(op(142, B::new().id_num(3).u8(2).u8(0)));
    malformed(op(142, B::new().id_num(3).u8(0)));
    assert_eq!(
        op(143, B::new().id_str("bob")),
        Ok(Command::DeleteUser { user: named("bob") })
    );
    assert_eq!(
        op(144, B::new().id_num(3).name("old").name("new")),
        Ok(Command::ChangePassword {
            user: num(3),
            current_password: "old".into(),
            new_password: "new".into()
        })
    );
    malformed(op(144, B::new().id_num(3).name("old")));
    let perms = encoded_permissions(&Permissions::default());
    assert_eq!(perms.len(), 11);
    assert_eq!(
        op(145, B::new().id_num(3).u8(1).u32(11).raw(&perms)),
        Ok(Command::UpdatePermissions {
            user: num(3),
            permissions: Some(Permissions::default())
        })
    );
    assert_eq!(
        op(145, B::new().id_num(3).u8(0)),
        Ok(Command::UpdatePermissions {
            user: num(3),
            permissions: None
        })
    );
    malformed(op(145, B::new().id_num(3).u8(0).u8(0)));
}

#[test]
fn personal_access_tokens() {
    assert_eq!(
        op(146, B::new().name("ci").u64(u64::MAX)),
        Ok(Command::CreatePersonalAccessToken {
            name: "ci".into(),
            expiry: u64::MAX
        })
    );
    assert_eq!(
        op(147, B::new().name("ci")),
        Ok(Command::DeletePersonalAccessToken { name: "ci".into() })
    );
    malformed(op(146, B::new().name("ci").u32(1)));
}

#[test]
fn consumer_group_writes() {
    assert_eq!(
        op(139, B::new().id_num(1).id_num(2).name("g")),
        Ok(Command::CreateConsumerGroup {
            stream: num(1),
            topic: num(2),
            name: "g".into()
        })
    );
    assert_eq!(
        op(140, B::new().id_num(1).id_num(2).id_num(0)),
        Ok(Command::DeleteConsumerGroup {
            stream: num(1),
            topic: num(2),
            group: num(0)
        })
    );
    assert_eq!(
        op(148, B::new().id_num(1).id_num(2).id_str("g")),
        Ok(Command::JoinConsumerGroup {
            stream: num(1),
            topic: num(2),
            group: named("g")
        })
    );
    assert_eq!(
        op(149, B::new().id_num(1).id_num(2).id_str("g")),
        Ok(Command::LeaveConsumerGroup {
            stream: num(1),
            topic: num(2),
            group: named("g")
        })
    );
}

// ---------------------------------------------------------------- send

#[test]
fn send_messages_partitioning_kinds() {
    let batch = [0u8; 256];
    let decode = |partitioning: B| {
        let metadata = B::new().id_num(1).id_num(2).raw(&partitioning.0);
        Command::decode(160, 0, super::send_body(metadata, 1, &batch).into())
    };
    let Ok(Command::SendMessages {
        partitioning,
        batch: kept,
        messages_count,
        ..
    }) = decode(B::new().u8(1).u8(0))
    else {
        panic!()
    };
    assert_eq!(partitioning, Partitioning::Balanced);
    assert_eq!(messages_count, 1);
    assert_eq!(kept.len(), 256);
    // The decoded metadata in front of the batch is its headroom: 4 + 6 + 6 + 2 + 4 bytes.
    assert_eq!(kept.headroom(), 22);
    // The least there can be: one-byte names and balanced partitioning.
    let metadata = B::new().id_str("s").id_str("t").u8(1).u8(0);
    let Ok(Command::SendMessages { batch: least, .. }) =
        Command::decode(160, 0, super::send_body(metadata, 1, &batch).into())
    else {
        panic!()
    };
    assert_eq!((least.headroom(), least.len()), (16, 256));
    let Ok(Command::SendMessages { partitioning, .. }) = decode(B::new().u8(3).name("key")) else {
        panic!()
    };
    assert_eq!(partitioning, Partitioning::MessagesKey(b"key".to_vec()));
    malformed(decode(B::new().u8(3).u8(0)));
    malformed(decode(B::new().u8(1).u8(1).u8(0)));
    malformed(decode(B::new().u8(2).u8(3).raw(&[0, 0, 0])));
    malformed(decode(B::new().u8(4).u8(0)));
}

#[test]
fn send_messages_metadata_length_must_match() {
    let mut body = super::send_body(B::new().id_num(1).id_num(2).u8(2).u8(4).u32(0), 1, &[]);
    assert!(matches!(
        Command::decode(160, 0, body.clone().into()),
        Ok(Command::SendMessages { .. })
    ));
    body[0] += 1;
    malformed(Command::decode(160, 0, body.into()));
    malformed(Command::decode(160, 0, B::new().u32(19).bytes()));
}

// ---------------------------------------------------------------- misc

#[test]
fn decode_error_statuses() {
    assert_eq!(DecodeError::Malformed("x").status(), 4);
    assert_eq!(DecodeError::InvalidIdentifier.status(), 6);
    assert_eq!(
        DecodeError::UnknownCommand {
            operation: 2,
            code: 9
        }
        .status(),
        3
    );
    assert_eq!(DecodeError::UnsupportedOptionKey("k".into()).status(), 4041);
    assert_eq!(DecodeError::InvalidOptionValue("k".into()).status(), 4042);
}

#[test]
fn command_names() {
    assert_eq!(Command::Ping.name(), "Ping");
    assert_eq!(Command::Logout.name(), "Logout");
    assert_eq!(op(130, B::new().id_num(1)).unwrap().name(), "DeleteStream");
    assert_eq!(
        op2(606, B::new().id_num(1).id_num(2).id_num(0)).unwrap().name(),
        "SyncConsumerGroup"
    );
}

#[test]
fn option_value_helpers() {
    let entry = |kind: u8, value: &[u8]| OptionEntry {
        key: "k".into(),
        value_kind: kind,
        value: value.to_vec(),
    };
    assert_eq!(types::option_str(&entry(2, b"gzip")), Some("gzip"));
    assert_eq!(types::option_str(&entry(1, b"gzip")), None);
    assert_eq!(types::option_str(&entry(2, &[0xff])), None);
    assert_eq!(types::option_u64(&entry(12, &9u64.to_le_bytes())), Some(9));
    assert_eq!(types::option_u64(&entry(12, &[1, 2])), None);
    assert_eq!(types::option_u64(&entry(11, &9u64.to_le_bytes())), None);
    assert_eq!(types::option_u32(&entry(11, &5u32.to_le_bytes())), Some(5));
    assert_eq!(types::option_bool(&entry(3, &[1])), Some(true));
    assert_eq!(types::option_bool(&entry(3, &[0])), Some(false));
    assert_eq!(types::option_bool(&entry(3, &[0, 1])), None);
}
