use super::B;
use crate::reply::{self, *};
use crate::types::{GlobalPermissions, Permissions, StreamPermissions, TopicPermissions};

fn enc(f: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut out = Vec::new();
    f(&mut out);
    out
}

fn stream_rec() -> StreamRecord {
    StreamRecord {
        id: 1,
        created_at: 2,
        topics_count: 0,
        size_bytes: 3,
        messages_count: 4,
        name: "orders".into(),
    }
}

fn topic_rec(partitions_count: u32) -> TopicRecord {
    TopicRecord {
        id: 5,
        created_at: 6,
        partitions_count,
        message_expiry: u64::MAX,
        compression: 1,
        max_topic_size: 0,
        size_bytes: 7,
        messages_count: 8,
        name: "events".into(),
    }
}

fn topic_bytes(partitions_count: u32) -> Vec<u8> {
    B::new()
        .u32(5)
        .u64(6)
        .u32(partitions_count)
        .u64(u64::MAX)
        .u8(1)
        .u64(0)
        .u64(7)
        .u64(8)
        .name("events")
        .u32(0)
        .u32(0)
        .0
}

#[test]
fn result_sections() {
    assert_eq!(enc(ok_result_section), vec![0, 0, 0, 0]);
    assert_eq!(
        enc(|o| rejected_result_section(o, 57)),
        B::new().u32(1).u32(0).u32(57).0
    );
}

#[test]
fn stream_record_has_one_option_block() {
    let bytes = enc(|o| stream(o, &stream_rec()));
    assert_eq!(
        bytes,
        B::new()
            .u32(1)
            .u64(2)
            .u32(0)
            .u64(3)
            .u64(4)
            .name("orders")
            .u32(0)
            .0
    );
    assert_eq!(bytes.len(), 33 + 6 + 4);
}

#[test]
fn stream_details_carry_topics() {
    let s = StreamRecord {
        topics_count: 2,
        ..stream_rec()
    };
    let bytes = enc(|o| stream_details(o, &s, &[topic_rec(1), topic_rec(1)]));
    let mut expected = B::new()
        .u32(1)
        .u64(2)
        .u32(2)
        .u64(3)
        .u64(4)
        .name("orders")
        .u32(0)
        .0;
    expected.extend(topic_bytes(1));
    expected.extend(topic_bytes(1));
    assert_eq!(bytes, expected);
}

#[test]
fn topic_header_has_two_option_blocks() {
    let bytes = enc(|o| topic_header(o, &topic_rec(3)));
    assert_eq!(bytes, topic_bytes(3));
    assert_eq!(bytes.len(), 50 + 6 + 8);
    // Field offsets from §6.0.
    assert_eq!(bytes[24], 1);
    assert_eq!(bytes[49], 6);
}

#[test]
fn topic_details_and_list() {
    let partitions = [
        PartitionRecord {
            id: 0,
            created_at: 1,
            segments_count: 2,
            current_offset: 3,
            size_bytes: 4,
            messages_count: 5,
        },
        PartitionRecord {
            id: 1,
            created_at: 1,
            segments_count: 1,
            current_offset: 0,
            size_bytes: 0,
            messages_count: 0,
        },
    ];
    let bytes = enc(|o| topic_details(o, &topic_rec(2), &partitions));
    let mut expected = topic_bytes(2);
    expected.extend(B::new().u32(0).u64(1).u32(2).u64(3).u64(4).u64(5).0);
    expected.extend(B::new().u32(1).u64(1).u32(1).u64(0).u64(0).u64(0).0);
    assert_eq!(bytes, expected);
    assert_eq!(bytes.len(), topic_bytes(2).len() + 80);

    let list = enc(|o| topics_list(o, &[topic_rec(1), topic_rec(2)]));
    let mut expected = B::new().u32(2).0;
    expected.extend(topic_bytes(1));
    expected.extend(topic_bytes(2));
    assert_eq!(list, expected);
    assert_eq!(enc(|o| topics_list(o, &[])), vec![0, 0, 0, 0]);
}

#[test]
fn login() {
    let bytes = enc(|o| login_response(o, 1, 99, "0.11.0"));
    assert_eq!(bytes, B::new().u32(1).u64(99).u32(0x2C00).name("0.11.0").0);
}

#[test]
fn cluster() {
    let node = ClusterNode {
        name: "cairn".into(),
        ip: "127.0.0.1".into(),
        tcp_port: 8090,
        quic_port: 0,
        http_port: 3000,
        websocket_port: 0,
        role: 0,
        status: 0,
    };
    let bytes = enc(|o| cluster_metadata(o, "cairn-cluster", std::slice::from_ref(&node)));
    let expected = B::new()
        .lstr("cairn-cluster")
        .u32(1)
        .lstr("cairn")
        .lstr("127.0.0.1")
        .u16(8090)
        .u16(0)
        .u16(3000)
        .u16(0)
        .u8(0)
        .u8(0)
        .0;
    assert_eq!(bytes, expected);
}

#[test]
fn stats_layout() {
    let s = Stats {
        process_id: 7,
        cpu_usage: 1.5,
        streams_count: 3,
        messages_count: 11,
        consumer_groups_count: 2,
        hostname: "h".into(),
        server_version: "0.1.0".into(),
        server_semver: 100,
        threads_count: 4,
        total_disk_space: 9,
        ..Default::default()
    };
    let bytes = enc(|o| stats(o, &s));
    assert_eq!(&bytes[0..4], &7u32.to_le_bytes());
    assert_eq!(&bytes[4..8], &1.5f32.to_le_bytes());
    assert_eq!(&bytes[76..80], &3u32.to_le_bytes());
    assert_eq!(&bytes[92..100], &11u64.to_le_bytes());
    assert_eq!(&bytes[104..108], &2u32.to_le_bytes());
    let tail = B::new()
        .lstr("h")
        .lstr("")
        .lstr("")
        .lstr("")
        .lstr("0.1.0")
        .u32(100)
        .u32(0)
        .u32(4)
        .u64(0)
        .u64(9)
        .0;
    assert_eq!(&bytes[108..], &tail[..]);
}

#[test]
fn clients() {
    let c = ClientRecord {
        client_id: 3,
        user_id: None,
        transport: 1,
        address: "1.2.3.4:5".into(),
        consumer_groups: vec![(1, 2, 3), (4, 5, 6)],
    };
    let record = B::new().u32(3).u32(u32::MAX).u8(1).lstr("1.2.3.4:5").u32(2).0;
    assert_eq!(enc(|o| client(o, &c)), record);
    let mut details = record.clone();
    details.extend(B::new().u32(1).u32(2).u32(3).u32(4).u32(5).u32(6).0);
    assert_eq!(enc(|o| client_details(o, &c)), details);
    let c = ClientRecord {
        user_id: Some(1),
        consumer_groups: vec![],
        ..c
    };
    assert_eq!(
        enc(|o| client_details(o, &c)),
        B::new().u32(3).u32(1).u8(1).lstr("1.2.3.4:5").u32(0).0
    );
}

#[test]
fn offsets_confirmations_poll_head() {
    assert_eq!(
        enc(|o| consumer_offset(o, 1, 2, 3)),
        B::new().u32(1).u64(2).u64(3).0
    );
    let confirmations = [SendConfirmation {
        stream_id: 1,
        topic_id: 2,
        partition_id: 3,
        base_offset: 4,
    }];
    assert_eq!(
        enc(|o| send_confirmations(o, &confirmations)),
        B::new().u32(1).u32(1).u32(2).u32(3).u64(4).0
    );
    let head = enc(|o| poll_head(o, u32::MAX, 10, 0));
    assert_eq!(head.len(), 16);
    assert_eq!(head, B::new().u32(u32::MAX).u64(10).u32(0).0);
}

fn user_rec() -> UserRecord {
    UserRecord {
        id: 1,
        created_at: 2,
        status: 1,
        username: "iggy".into(),
    }
}

#[test]
fn users() {
    let record = B::new().u32(1).u64(2).u8(1).name("iggy").u32(0).0;
    assert_eq!(enc(|o| user(o, &user_rec())), record);
    // Without permissions: 4 zero bytes.
    let mut expected = record.clone();
    expected.extend([0, 0, 0, 0]);
    assert_eq!(enc(|o| user_details(o, &user_rec(), None)), expected);
    // With: [1][len u32][Permissions].
    let p = Permissions::default();
    let mut expected = record.clone();
    expected.extend(B::new().u8(1).u32(11).raw(&[0; 11]).0);
    assert_eq!(enc(|o| user_details(o, &user_rec(), Some(&p))), expected);
}

#[test]
fn permissions_linked_list_layout() {
    let p = Permissions {
        global: GlobalPermissions {
            manage_servers: true,
            send_messages: true,
            ..Default::default()
        },
        streams: vec![
            (
                5,
                StreamPermissions {
                    read_stream: true,
                    topics: vec![
                        (
                            7,
                            TopicPermissions {
                                poll_messages: true,
                                ..Default::default()
                            },
                        ),
                        (
                            8,
                            TopicPermissions {
                                manage_topic: true,
                                ..Default::default()
                            },
                        ),
                    ],
                    ..Default::default()
                },
            ),
            (
                6,
                StreamPermissions {
                    send_messages: true,
                    ..Default::default()
                },
            ),
        ],
    };
    let expected = B::new()
        .raw(&[1, 0, 0, 0, 0, 0, 0, 0, 0, 1])
        .u8(1) // has streams
        .u32(5)
        .raw(&[0, 1, 0, 0, 0, 0])
        .u8(1) // has topics
        .u32(7)
        .raw(&[0, 0, 1, 0])
        .u8(1) // next topic
        .u32(8)
        .raw(&[1, 0, 0, 0])
        .u8(0) // last topic
        .u8(1) // next stream
        .u32(6)
        .raw(&[0, 0, 0, 0, 0, 1])
        .u8(0) // no topics
        .u8(0) // last stream
        .0;
    assert_eq!(enc(|o| reply::permissions(o, &p)), expected);
}

#[test]
fn groups() {
    let g = GroupRecord {
        id: 1,
        partitions_count: 3,
        name: "g".into(),
        members: vec![(10, vec![0, 2]), (11, vec![1])],
    };
    let record = B::new().u32(1).u32(3).u32(2).name("g").0;
    assert_eq!(enc(|o| group(o, &g)), record);
    let mut details = record.clone();
    details.extend(B::new().u32(10).u32(2).u32(0).u32(2).u32(11).u32(1).u32(1).0);
    assert_eq!(enc(|o| group_details(o, &g)), details);
    assert_eq!(
        enc(|o| group_sync(o, 4, &[0, 2])),
        B::new().u64(4).u32(2).u32(0).u32(2).0
    );
    assert_eq!(enc(|o| group_sync(o, 4, &[])), B::new().u64(4).u32(0).0);
}

#[test]
fn pats_and_options() {
    assert_eq!(enc(|o| pat_token(o, "abc")), B::new().name("abc").0);
    assert_eq!(enc(|o| pat_entry(o, "ci", 0)), B::new().name("ci").u64(0).0);
    let d = OptionDescriptor {
        key: "durability".into(),
        kind: 2,
        default_value: b"replicated".to_vec(),
        description: "d".into(),
    };
    assert_eq!(
        enc(|o| describe_options(o, std::slice::from_ref(&d))),
        B::new()
            .u32(1)
            .name("durability")
            .u8(2)
            .lstr("replicated")
            .lstr("d")
            .0
    );
    assert_eq!(enc(|o| describe_options(o, &[])), vec![0, 0, 0, 0]);
}

#[test]
fn overlong_names_stay_decodable() {
    let long = "é".repeat(200); // 400 bytes
    let bytes = enc(|o| pat_token(o, &long));
    let len = bytes[0] as usize;
    assert_eq!(bytes.len(), 1 + len);
    assert!(len <= 255);
    assert!(std::str::from_utf8(&bytes[1..]).is_ok());
}
