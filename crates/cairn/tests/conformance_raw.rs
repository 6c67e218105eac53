//! §11 conformance items whose wire details the SDK hides, checked byte by byte over a raw
//! connection: 2, 10-15, 17, 18, 20, 23-26, 41, 42, plus the frame-size limit.

mod common;

use common::*;
use iggy::prelude::*;
use std::time::Duration;

/// Our batch encoder matches the golden vector of §7.5 (guards the helpers themselves).
#[test]
fn golden_vector_batch_encoding() {
    let msgs = [
        batch::RawMessage {
            id: 1,
            origin_timestamp: 1_000_000,
            payload: b"hello".to_vec(),
            headers: vec![],
        },
        batch::RawMessage {
            id: 2,
            origin_timestamp: 1_000_010,
            payload: b"world!".to_vec(),
            headers: vec![],
        },
    ];
    let b = batch::encode(&msgs);
    let mut s = Vec::new();
    enc::id_str(&mut s, "s");
    let mut t = Vec::new();
    enc::id_num(&mut t, 0);
    let body = enc::send_messages_with_ids(&s, &t, 0, 2, &b.bytes);
    assert_eq!(body.len(), 386);
    assert_eq!(u32::from_le_bytes(body[0..4].try_into().unwrap()), 0x13);
    assert_eq!(b.bytes.len(), 363);
    assert_eq!(batch::checksum(&b.bytes), 0xaf72_022a_1dc7_1b41);
    let mut stamped = b.bytes.clone();
    stamped[8..16].copy_from_slice(&10u64.to_le_bytes());
    stamped[16..24].copy_from_slice(&2_000_000u64.to_le_bytes());
    assert_eq!(batch::checksum(&stamped), 0x8288_986d_1504_33f0);
    assert_eq!(xxh3(&[]), 0x2d06_8005_38d3_94c2);
}

async fn raw_setup(server: &TestServer, stream: &str, partitions: u32) -> (RawConn, u32, u32) {
    let mut raw = RawConn::connect(server.addr()).await;
    raw.login_root().await;
    let f = raw.call(code::CREATE_STREAM, &enc::create_stream(stream)).await;
    let (s, _) = rec::stream_details(f.ok_payload());
    let f = raw
        .call(code::CREATE_TOPIC, &enc::create_topic(s.id, partitions, "t"))
        .await;
    let (t, _) = rec::topic_details(f.ok_payload());
    (raw, s.id, t.id)
}

/// Item 2: reply command 8, size, status, operation / request / client / checksum echoes.
#[tokio::test]
async fn item02_reply_header_echoes() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let mut raw = RawConn::connect(server.addr()).await;

    // Ping (op 2).
    let client = random_client_id();
    let h = ReqHeader::new(client, op::NON_REPLICATED, code::PING, 1, 0);
    raw.send_frame(&h, &[]).await.unwrap();
    let f = raw.read_frame().await;
    assert_eq!(f.command(), CMD_REPLY);
    assert_eq!(f.size(), 256);
    assert_eq!(f.status(), 0);
    assert_eq!(f.operation(), op::NON_REPLICATED);
    assert_eq!(f.request(), 1);
    assert_eq!(f.client(), client);
    assert_eq!(f.request_checksum(), 0);

    // A replicated op with a real checksum, after login.
    raw.login_root().await;
    let body = enc::create_stream("echo");
    let mut h = ReqHeader::new(raw.client, op::CREATE_STREAM, 0, 1, raw.session);
    h.request_checksum = request_checksum_for(op::CREATE_STREAM, &body);
    assert_ne!(h.request_checksum, 0);
    raw.send_frame(&h, &body).await.unwrap();
    let f = raw.read_frame().await;
    assert_eq!(f.command(), CMD_REPLY);
    assert_eq!(f.status(), 0);
    assert_eq!(f.size() as usize, 256 + f.body.len());
    assert_eq!(f.operation(), op::CREATE_STREAM);
    assert_eq!(f.request(), 1);
    assert_eq!(f.client(), raw.client);
    assert_eq!(f.request_checksum(), h.request_checksum);

    // A read after it carries the current counter (2) and is echoed too.
    let mut h = ReqHeader::new(raw.client, op::NON_REPLICATED, code::GET_STREAMS, 2, raw.session);
    h.request_checksum = 0;
    raw.send_frame(&h, &[]).await.unwrap();
    let f = raw.read_frame().await;
    assert_eq!(f.operation(), op::NON_REPLICATED);
    assert_eq!(f.request(), 2);
    assert_eq!(f.client(), raw.client);
    // Error replies echo too and have an empty body.
    let mut h = ReqHeader::new(
        raw.client,
        op::NON_REPLICATED,
        code::POLL_MESSAGES,
        2,
        raw.session,
    );
    h.request_checksum = 0;
    let poll_body = enc::poll(1, 777, 0, None, (3, 0), 1, false);
    raw.send_frame(&h, &poll_body).await.unwrap();
    let f = raw.read_frame().await;
    assert_eq!(f.command(), CMD_REPLY);
    assert_eq!(f.status(), 1009, "poll of a missing numeric stream");
    assert!(f.body.is_empty());
    assert_eq!(f.size(), 256);
    assert_eq!(f.operation(), op::NON_REPLICATED);
    assert_eq!(f.request(), 2);
    assert_eq!(f.client(), raw.client);
    server.stop();
}

/// Item 10: op-2 requests are never deduplicated by request id.
#[tokio::test]
async fn item10_reads_are_not_deduplicated() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let mut raw = RawConn::connect(server.addr()).await;
    raw.login_root().await;
    // Three reads with request id 1 (the current counter), then the first write with id 1.
    for _ in 0..3 {
        let f = raw.call(code::GET_STREAMS, &[]).await;
        assert!(f.ok_payload().is_empty());
        assert_eq!(f.request(), 1);
    }
    let f = raw.call(code::CREATE_STREAM, &enc::create_stream("s1")).await;
    let _ = f.ok_payload();
    // Reads now carry 2, repeatedly, and each sees the current state.
    for _ in 0..3 {
        let f = raw.call(code::GET_STREAMS, &[]).await;
        let body = f.ok_payload().to_vec();
        let mut c = rec::Cursor::new(&body);
        let s = rec::stream(&mut c);
        assert_eq!(s.name, "s1");
        assert_eq!(c.remaining(), 0);
        assert_eq!(f.request(), 2);
    }
    let f = raw.call(code::CREATE_STREAM, &enc::create_stream("s2")).await;
    let _ = f.ok_payload();
    let f = raw.call(code::GET_STREAMS, &[]).await;
    let body = f.ok_payload().to_vec();
    let mut c = rec::Cursor::new(&body);
    rec::stream(&mut c);
    rec::stream(&mut c);
    assert_eq!(c.remaining(), 0);
    // Identical pings back to back.
    for _ in 0..5 {
        let f = raw.call(code::PING, &[]).await;
        assert_eq!(f.status(), 0);
        assert!(f.body.is_empty());
    }
    server.stop();
}

/// Items 11, 13, 14, 15, 42: create / list replies and their exact record layouts.
#[tokio::test]
async fn items11_to_15_stream_and_topic_records() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let mut raw = RawConn::connect(server.addr()).await;
    raw.login_root().await;

    // 13: no streams → empty body.
    let f = raw.call(code::GET_STREAMS, &[]).await;
    assert!(
        f.ok_payload().is_empty(),
        "GetStreams with no streams must be empty"
    );

    // 11: CreateStream → [0u32] + StreamDetails (topics_count 0, one option block).
    let f = raw.call(code::CREATE_STREAM, &enc::create_stream("first")).await;
    assert_eq!(f.operation(), op::CREATE_STREAM);
    assert_eq!(&f.body[..4], &[0, 0, 0, 0], "empty result section");
    let (s1, topics) = rec::stream_details(f.ok_payload());
    assert_eq!(s1.name, "first");
    assert_eq!(s1.topics_count, 0);
    assert!(topics.is_empty());
    let f = raw.call(code::CREATE_STREAM, &enc::create_stream("second")).await;
    let (s2, _) = rec::stream_details(f.ok_payload());
    assert_ne!(s1.id, s2.id);

    // 15: CreateTopic with the durability options → [0u32] + TopicDetails, compression none.
    let f = raw
        .call(code::CREATE_TOPIC, &enc::create_topic(s1.id, 3, "events"))
        .await;
    assert_eq!(f.operation(), op::CREATE_TOPIC);
    let (t, parts) = rec::topic_details(f.ok_payload());
    assert_eq!(t.name, "events");
    assert_eq!(t.partitions_count, 3);
    assert_eq!(t.compression, 1, "compression none = 1");
    assert_eq!(parts.iter().map(|p| p.id).collect::<Vec<_>>(), vec![0, 1, 2]);
    let f = raw
        .call(code::CREATE_TOPIC, &enc::create_topic(s1.id, 1, "other"))
        .await;
    let (t2, _) = rec::topic_details(f.ok_payload());
    assert_ne!(t.id, t2.id);

    // 13: streams back to back, no count.
    let f = raw.call(code::GET_STREAMS, &[]).await;
    let body = f.ok_payload().to_vec();
    let mut c = rec::Cursor::new(&body);
    let mut names = vec![rec::stream(&mut c).name, rec::stream(&mut c).name];
    assert_eq!(c.remaining(), 0, "exactly two stream records");
    names.sort();
    assert_eq!(names, vec!["first".to_string(), "second".to_string()]);

    // 14: GetStream contains exactly topics_count topic headers.
    let mut b = Vec::new();
    enc::id_num(&mut b, s1.id);
    let f = raw.call(code::GET_STREAM, &b).await;
    let (s, topics) = rec::stream_details(f.ok_payload());
    assert_eq!(s.topics_count, 2);
    let mut tn: Vec<String> = topics.iter().map(|t| t.name.clone()).collect();
    tn.sort();
    assert_eq!(tn, vec!["events".to_string(), "other".to_string()]);
    // GetTopics → [count u32] + headers.
    let f = raw.call(code::GET_TOPICS, &b).await;
    let body = f.ok_payload().to_vec();
    let mut c = rec::Cursor::new(&body);
    assert_eq!(c.u32(), 2, "GetTopics count");
    rec::topic_header(&mut c);
    rec::topic_header(&mut c);
    assert_eq!(c.remaining(), 0);
    // GetTopic → header + partitions_count 40-byte records, ids 0..n-1.
    let f = raw.call(code::GET_TOPIC, &enc::stream_topic(s1.id, t.id)).await;
    let (tt, parts) = rec::topic_details(f.ok_payload());
    assert_eq!(tt.partitions_count, 3);
    assert_eq!(parts.iter().map(|p| p.id).collect::<Vec<_>>(), vec![0, 1, 2]);
    // By name as well.
    let mut b = Vec::new();
    enc::id_str(&mut b, "first");
    enc::id_str(&mut b, "events");
    let f = raw.call(code::GET_TOPIC, &b).await;
    let (tt, _) = rec::topic_details(f.ok_payload());
    assert_eq!(tt.id, t.id);

    // 16 (raw): duplicates.
    let f = raw.call(code::CREATE_STREAM, &enc::create_stream("first")).await;
    f.assert_error(1012);
    let f = raw
        .call(code::CREATE_TOPIC, &enc::create_topic(s1.id, 1, "events"))
        .await;
    f.assert_error(2013);
    server.stop();
}

/// Item 12: single-object reads of missing objects are OK with an empty body.
#[tokio::test]
async fn item12_missing_objects_are_empty_ok_replies() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let (mut raw, s, t) = raw_setup(&server, "present", 1).await;

    let mut cases: Vec<(&str, u32, Vec<u8>)> = Vec::new();
    let mut b = Vec::new();
    enc::id_num(&mut b, 9999);
    cases.push(("GetStream numeric", code::GET_STREAM, b));
    let mut b = Vec::new();
    enc::id_str(&mut b, "absent");
    cases.push(("GetStream named", code::GET_STREAM, b));
    cases.push(("GetTopic", code::GET_TOPIC, enc::stream_topic(s, 9999)));
    let mut b = Vec::new();
    enc::id_num(&mut b, 9999);
    cases.push(("GetUser", code::GET_USER, b));
    cases.push(("GetClient", code::GET_CLIENT, 999_999u32.to_le_bytes().to_vec()));
    let mut b = enc::stream_topic(s, t);
    enc::id_num(&mut b, 9999);
    cases.push(("GetConsumerGroup", code::GET_CONSUMER_GROUP, b));
    cases.push((
        "GetConsumerOffset",
        code::GET_CONSUMER_OFFSET,
        enc::consumer_offset_target(12345, s, t, None),
    ));
    for (what, c, body) in cases {
        let f = raw.call(c, &body).await;
        assert!(f.is_reply(), "{what}: not a reply");
        assert_eq!(f.status(), 0, "{what}: status");
        assert!(
            f.body.is_empty(),
            "{what}: body must be empty, got {} bytes",
            f.body.len()
        );
    }
    server.stop();
}

/// The SDK's routing commands, on one node (the SDK sends them only to a cluster of
/// several, but a node answers them alike): 103 and 123 hand back this connection's client
/// id and login session and name this node as the partition's primary; a partition that
/// does not exist is not routed; 14 attaches; 104 is answered as a poll.
#[tokio::test]
async fn routing_commands_on_one_node_name_this_node() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let (mut raw, s, t) = raw_setup(&server, "route", 1).await;
    let le_u64 = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
    let le_u32 = |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"));
    let routes = [
        (103u32, enc::poll(1, s, t, Some(0), (1, 0), 10, false)),
        (123, enc::consumer_offset_target(1, s, t, Some(0))),
    ];
    for (code, body) in routes {
        let f = raw.call(code, &body).await;
        assert_eq!(f.status(), 0, "code {code}");
        assert_eq!(f.operation(), op::NON_REPLICATED);
        let body = &f.body;
        assert_eq!(
            u128::from_le_bytes(body[..16].try_into().expect("16 bytes")),
            raw.client
        );
        assert_eq!(le_u64(body, 16), raw.session);
        assert_eq!(le_u64(body, 24), 0, "metadata watermark");
        let name_len = le_u32(body, 32) as usize;
        assert_eq!(&body[36..36 + name_len], b"cairn");
        let ip_at = 36 + name_len;
        let ip_len = le_u32(body, ip_at) as usize;
        assert_eq!(&body[ip_at + 4..ip_at + 4 + ip_len], b"127.0.0.1");
        let ports_at = ip_at + 4 + ip_len;
        let tcp_port = u16::from_le_bytes([body[ports_at], body[ports_at + 1]]);
        assert_eq!(tcp_port, server.addr().port());
        assert_eq!(body.len(), ports_at + 8 + 2, "four ports, role, status");
        assert_eq!(body[ports_at + 8], 0, "leader");
    }
    let f = raw
        .call(123, &enc::consumer_offset_target(1, s, t, Some(5)))
        .await;
    assert_eq!(f.status(), 3007, "PartitionNotFound");
    let mut attach = raw.client.to_le_bytes().to_vec();
    attach.extend_from_slice(&raw.session.to_le_bytes());
    attach.extend_from_slice(&0u64.to_le_bytes());
    let f = raw.call(14, &attach).await;
    assert_eq!(f.status(), 0);
    assert!(f.body.is_empty());
    let f = raw
        .call(104, &enc::poll(1, s, t, Some(0), (1, 0), 10, false))
        .await;
    assert_eq!(f.status(), 0, "answered as a poll of an empty partition");
}

/// Item 17: unknown op-2 code → status 3; the SDK reports InvalidCommand. The cluster
/// routing codes (14, 103, 104, 123) decode their bodies.
/// Item 18: DeleteSegments (op 138) → empty body, no result section.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn items17_18_unknown_code_and_delete_segments() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let (mut raw, s, t) = raw_setup(&server, "segs", 1).await;

    for unknown in [9999u32, 7, 150] {
        let f = raw.call(unknown, &[1, 2, 3]).await;
        assert!(f.is_reply(), "code {unknown}: expected a reply");
        assert_eq!(f.status(), 3, "code {unknown}: InvalidCommand");
        assert!(f.body.is_empty());
        assert_eq!(f.operation(), op::NON_REPLICATED);
    }
    // The cluster routing codes are known: a body that is not theirs is InvalidFormat (4).
    for routing in [14u32, 103, 104, 123] {
        let f = raw.call(routing, &[1, 2, 3]).await;
        assert!(f.is_reply(), "code {routing}: expected a reply");
        assert_eq!(f.status(), 4, "code {routing}: InvalidFormat");
        assert!(f.body.is_empty());
    }
    // The connection still works afterwards.
    let f = raw.call(code::PING, &[]).await;
    assert_eq!(f.status(), 0);

    let b = batch::encode(&[batch::simple(1, b"x")]);
    let f = raw
        .call(code::SEND_MESSAGES, &enc::send_messages(s, t, 0, &b))
        .await;
    let _ = f.ok_payload();
    let mut body = enc::stream_topic(s, t);
    body.extend_from_slice(&0u32.to_le_bytes());
    body.extend_from_slice(&1u32.to_le_bytes());
    let f = raw.call(code::DELETE_SEGMENTS, &body).await;
    assert!(f.is_reply());
    assert_eq!(f.status(), 0, "DeleteSegments status");
    assert_eq!(f.operation(), op::DELETE_SEGMENTS);
    assert!(
        f.body.is_empty(),
        "DeleteSegments reply must be empty (no result section)"
    );

    // Through the SDK.
    let client = root_client(server.addr()).await;
    let err = client
        .send_binary_request(9999, bytes::Bytes::new())
        .await
        .expect_err("unknown code must fail");
    assert_eq!(err.as_code(), 3);
    let reply = client
        .send_binary_request(503, bytes::Bytes::from(body))
        .await
        .expect("DeleteSegments via send_binary_request");
    assert!(reply.is_empty());
    client
        .delete_segments(&id_num(s), &id_num(t), 0, 1)
        .await
        .expect("delete_segments");
    server.stop();
}

/// Items 20, 24, 41: the send reply, stamping, and the poll reply batch layout.
#[tokio::test]
async fn items20_24_send_reply_and_stamped_batches() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let (mut raw, s, t) = raw_setup(&server, "stamp", 2).await;

    let mut sent_frames: Vec<Vec<u8>> = Vec::new();
    let mut expected_base = 0u64;
    for round in 0..3u64 {
        let msgs: Vec<batch::RawMessage> = (0..4)
            .map(|i| batch::RawMessage {
                id: u128::from(round * 10 + i + 1),
                origin_timestamp: now_micros() + i * 3,
                payload: format!("r{round}-m{i}").into_bytes(),
                headers: {
                    let mut h = Vec::new();
                    enc::tlv_str(&mut h, "key");
                    enc::tlv_str(&mut h, &format!("val{i}"));
                    h
                },
            })
            .collect();
        let b = batch::encode(&msgs);
        for r in &b.frames {
            sent_frames.push(b.bytes[r.clone()].to_vec());
        }
        let before = now_micros();
        let f = raw
            .call(code::SEND_MESSAGES, &enc::send_messages(s, t, 1, &b))
            .await;
        let after = now_micros();
        assert_eq!(f.operation(), op::SEND_MESSAGES);
        let body = f.ok_payload();
        // Item 41: empty, or exactly [count][stream][topic][partition][base_offset].
        if !body.is_empty() {
            assert_eq!(body.len(), 4 + 20, "send confirmation layout");
            let mut c = rec::Cursor::new(body);
            assert_eq!(c.u32(), 1);
            assert_eq!(c.u32(), s);
            assert_eq!(c.u32(), t);
            assert_eq!(c.u32(), 1);
            assert_eq!(c.u64(), expected_base);
        }
        // The poll shows the stamped batch.
        let f = raw
            .call(
                code::POLL_MESSAGES,
                &enc::poll(1, s, t, Some(1), (1, expected_base), 100, false),
            )
            .await;
        let r = poll::decode(f.ok_payload());
        assert_eq!(r.partition_id, 1);
        assert_eq!(r.batches.len(), 1, "one stored batch returned whole");
        let pb = &r.batches[0];
        assert_eq!(pb.partition_id, 1, "batch partition stamped");
        assert_eq!(pb.base_offset, expected_base, "batch base_offset stamped");
        assert!(
            pb.base_timestamp >= before && pb.base_timestamp <= after,
            "base_timestamp"
        );
        assert_eq!(pb.message_count, 4);
        assert_eq!(
            pb.origin_timestamp,
            msgs.iter().map(|m| m.origin_timestamp).min().unwrap()
        );
        // Frames are byte-identical to what was sent.
        for (i, m) in pb.messages.iter().enumerate() {
            assert_eq!(m.frame, b.bytes[b.frames[i].clone()], "frame {i} modified");
        }
        expected_base += 4;
    }
    // Item 24: a kind-1 consumer with flag 0 reads partition 0 (which is empty here).
    let f = raw
        .call(code::POLL_MESSAGES, &enc::poll(1, s, t, None, (1, 0), 100, false))
        .await;
    let r = poll::decode(f.ok_payload());
    assert_eq!(r.partition_id, 0);
    assert_eq!(r.messages_count, 0);
    assert!(r.batches.is_empty());
    // A message sent to partition 0 is what flag 0 returns.
    let b = batch::encode(&[batch::simple(500, b"on-zero")]);
    let _ = raw
        .call(code::SEND_MESSAGES, &enc::send_messages(s, t, 0, &b))
        .await
        .ok_payload()
        .to_vec();
    let f = raw
        .call(code::POLL_MESSAGES, &enc::poll(1, s, t, None, (1, 0), 100, false))
        .await;
    let r = poll::decode(f.ok_payload());
    assert_eq!(r.offsets(), vec![0]);
    assert_eq!(r.messages().next().unwrap().payload, b"on-zero");

    // Full read of partition 1: 12 messages in 3 batches, frames identical.
    let f = raw
        .call(
            code::POLL_MESSAGES,
            &enc::poll(1, s, t, Some(1), (3, 0), 100, false),
        )
        .await;
    let r = poll::decode(f.ok_payload());
    assert_eq!(r.offsets(), (0..12).collect::<Vec<_>>());
    assert_eq!(r.current_offset, 11);
    let frames: Vec<Vec<u8>> = r.messages().map(|m| m.frame.clone()).collect();
    assert_eq!(frames, sent_frames);
    server.stop();
}

/// Item 25: a poll starting inside a stored batch and spanning batches keeps the original
/// base fields and copies frames byte for byte. Item 26: strategies and empty results.
#[tokio::test]
async fn items25_26_sub_range_polls_and_strategies() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let (mut raw, s, t) = raw_setup(&server, "range", 1).await;

    // Three batches of five: offsets 0-4, 5-9, 10-14.
    for bi in 0..3u128 {
        let msgs: Vec<batch::RawMessage> = (0..5u128)
            .map(|i| batch::simple(bi * 5 + i + 1, format!("m{}", bi * 5 + i).as_bytes()))
            .collect();
        let b = batch::encode(&msgs);
        let _ = raw
            .call(code::SEND_MESSAGES, &enc::send_messages(s, t, 0, &b))
            .await
            .ok_payload()
            .to_vec();
    }
    let full = poll::decode(
        raw.call(code::POLL_MESSAGES, &enc::poll(1, s, t, None, (3, 0), 100, false))
            .await
            .ok_payload(),
    );
    assert_eq!(full.batches.len(), 3);
    let stored: Vec<(u64, u64, u64)> = full
        .batches
        .iter()
        .map(|b| (b.base_offset, b.base_timestamp, b.origin_timestamp))
        .collect();
    let frame_of = |o: u64| full.messages().find(|m| m.offset == o).unwrap().frame.clone();

    // Offset(3) x9 → 3..=11 across the three batches.
    let r = poll::decode(
        raw.call(code::POLL_MESSAGES, &enc::poll(1, s, t, None, (1, 3), 9, false))
            .await
            .ok_payload(),
    );
    assert_eq!(r.offsets(), (3..12).collect::<Vec<_>>());
    assert_eq!(r.messages_count, 9);
    assert_eq!(r.batches.len(), 3);
    for b in &r.batches {
        let orig = stored
            .iter()
            .find(|x| x.0 == b.base_offset)
            .expect("original base kept");
        assert_eq!(b.base_timestamp, orig.1, "base_timestamp kept");
        assert_eq!(b.origin_timestamp, orig.2, "origin_timestamp kept");
    }
    assert_eq!(r.batches[0].base_offset, 0);
    assert_eq!(
        r.batches[0]
            .messages
            .iter()
            .map(|m| m.offset_delta)
            .collect::<Vec<_>>(),
        vec![3, 4]
    );
    for m in r.messages() {
        assert_eq!(
            m.frame,
            frame_of(m.offset),
            "frame {} not byte-identical",
            m.offset
        );
    }

    let offsets = |raw_reply: &Frame| poll::decode(raw_reply.ok_payload()).offsets();
    // First(4).
    let f = raw
        .call(code::POLL_MESSAGES, &enc::poll(1, s, t, None, (3, 0), 4, false))
        .await;
    assert_eq!(offsets(&f), vec![0, 1, 2, 3]);
    // Last(4).
    let f = raw
        .call(code::POLL_MESSAGES, &enc::poll(1, s, t, None, (4, 0), 4, false))
        .await;
    assert_eq!(offsets(&f), vec![11, 12, 13, 14]);
    // Last(100) → everything.
    let f = raw
        .call(code::POLL_MESSAGES, &enc::poll(1, s, t, None, (4, 0), 100, false))
        .await;
    assert_eq!(offsets(&f), (0..15).collect::<Vec<_>>());
    // Timestamp(base of batch 2) → from offset 5.
    let ts = stored[1].1;
    let f = raw
        .call(code::POLL_MESSAGES, &enc::poll(1, s, t, None, (2, ts), 3, false))
        .await;
    let got = offsets(&f);
    let first_ge = full.messages().find(|m| m.timestamp >= ts).unwrap().offset;
    assert_eq!(got, (first_ge..first_ge + 3).collect::<Vec<_>>());
    // Timestamp(0) → from the start.
    let f = raw
        .call(code::POLL_MESSAGES, &enc::poll(1, s, t, None, (2, 0), 2, false))
        .await;
    assert_eq!(offsets(&f), vec![0, 1]);
    // Next with nothing stored → from the first message.
    let f = raw
        .call(code::POLL_MESSAGES, &enc::poll(9, s, t, None, (5, 0), 2, false))
        .await;
    assert_eq!(offsets(&f), vec![0, 1]);
    // count 0 → 16-byte head with messages_count 0.
    let f = raw
        .call(code::POLL_MESSAGES, &enc::poll(1, s, t, None, (1, 0), 0, false))
        .await;
    let body = f.ok_payload();
    assert_eq!(body.len(), 16, "count 0 → head only");
    let r = poll::decode(body);
    assert_eq!(r.messages_count, 0);
    assert_eq!(r.current_offset, 14);
    // Offset past the end → head only.
    let f = raw
        .call(code::POLL_MESSAGES, &enc::poll(1, s, t, None, (1, 15), 10, false))
        .await;
    assert_eq!(f.ok_payload().len(), 16);
    let f = raw
        .call(
            code::POLL_MESSAGES,
            &enc::poll(1, s, t, None, (1, 1_000_000), 10, false),
        )
        .await;
    assert_eq!(f.ok_payload().len(), 16);
    // Empty partition: current_offset 0, nothing.
    let f = raw
        .call(code::CREATE_TOPIC, &enc::create_topic(s, 1, "empty"))
        .await;
    let (et, _) = rec::topic_details(f.ok_payload());
    let f = raw
        .call(
            code::POLL_MESSAGES,
            &enc::poll(1, s, et.id, None, (3, 0), 10, false),
        )
        .await;
    let r = poll::decode(f.ok_payload());
    assert_eq!((r.messages_count, r.current_offset), (0, 0));
    server.stop();
}

/// Item 23: corrupted frame → 4027; wrong batch checksum → 4039; count mismatch → 4009;
/// non-zero reserved bytes are refused. Nothing is stored by a refused send.
#[tokio::test]
async fn item23_send_validation() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let (mut raw, s, t) = raw_setup(&server, "validate", 1).await;
    let msgs: Vec<batch::RawMessage> = (0..3).map(|i| batch::simple(i + 1, b"payload-bytes")).collect();
    let good = batch::encode(&msgs);

    // Corrupt a payload byte of frame 1 (its checksum no longer matches).
    let mut b = good.clone();
    let at = b.frames[1].start + 48 + 2;
    b.bytes[at] ^= 0xff;
    let f = raw
        .call(code::SEND_MESSAGES, &enc::send_messages(s, t, 0, &b))
        .await;
    f.assert_error(4027);

    // Frames fine, batch checksum wrong.
    let mut b = good.clone();
    b.bytes[40] ^= 0x01;
    let f = raw
        .call(code::SEND_MESSAGES, &enc::send_messages(s, t, 0, &b))
        .await;
    f.assert_error(4039);

    // Metadata messages_count ≠ frames.
    let mut sid = Vec::new();
    enc::id_num(&mut sid, s);
    let mut tid = Vec::new();
    enc::id_num(&mut tid, t);
    let body = enc::send_messages_with_ids(&sid, &tid, 0, 4, &good.bytes);
    let f = raw.call(code::SEND_MESSAGES, &body).await;
    f.assert_error(4009);

    // Batch header message_count ≠ frames (checksum recomputed so only the count is wrong).
    let mut b = good.clone();
    b.bytes[48..52].copy_from_slice(&2u32.to_le_bytes());
    let body = enc::send_messages_with_ids(&sid, &tid, 0, 2, &b.bytes);
    let f = raw.call(code::SEND_MESSAGES, &body).await;
    assert!(f.is_reply());
    assert_ne!(f.status(), 0, "frames not tiling message_count must be refused");
    assert!(f.body.is_empty());

    // Non-zero reserved byte in the batch header (checksum does not cover it).
    let mut b = good.clone();
    b.bytes[100] = 1;
    let f = raw
        .call(code::SEND_MESSAGES, &enc::send_messages(s, t, 0, &b))
        .await;
    assert_ne!(f.status(), 0, "non-zero batch reserved bytes must be refused");

    // Nothing was stored.
    let f = raw
        .call(code::POLL_MESSAGES, &enc::poll(1, s, t, None, (3, 0), 10, false))
        .await;
    assert_eq!(poll::decode(f.ok_payload()).messages_count, 0);

    // The good batch is still accepted on the same connection.
    let f = raw
        .call(code::SEND_MESSAGES, &enc::send_messages(s, t, 0, &good))
        .await;
    let _ = f.ok_payload();
    let f = raw
        .call(code::POLL_MESSAGES, &enc::poll(1, s, t, None, (3, 0), 10, false))
        .await;
    assert_eq!(poll::decode(f.ok_payload()).offsets(), vec![0, 1, 2]);
    server.stop();
}

/// §7.1/§7.6: a server also accepts kind-3 (messages key) partitioning from other SDKs and
/// routes it to XXH32(key) % partitions.
#[tokio::test]
async fn keyed_partitioning_resolved_server_side() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let (mut raw, s, t) = raw_setup(&server, "keyed", 3).await;
    for (i, key) in [&b"key"[..], b"alpha", b"beta", b"gamma"].iter().enumerate() {
        let b = batch::encode(&[batch::simple(i as u128 + 1, key)]);
        let mut meta = Vec::new();
        enc::id_num(&mut meta, s);
        enc::id_num(&mut meta, t);
        meta.push(3);
        meta.push(key.len() as u8);
        meta.extend_from_slice(key);
        meta.extend_from_slice(&1u32.to_le_bytes());
        let mut body = (meta.len() as u32).to_le_bytes().to_vec();
        body.extend_from_slice(&meta);
        body.extend_from_slice(&b.bytes);
        let f = raw.call(code::SEND_MESSAGES, &body).await;
        let _ = f.ok_payload();
        let p = xxhash_rust::xxh32::xxh32(key, 0) % 3;
        let f = raw
            .call(
                code::POLL_MESSAGES,
                &enc::poll(1, s, t, Some(p), (4, 0), 1, false),
            )
            .await;
        let r = poll::decode(f.ok_payload());
        assert_eq!(
            r.messages().next().map(|m| m.id),
            Some(i as u128 + 1),
            "key {:?} should land in partition {p}",
            String::from_utf8_lossy(key)
        );
    }
    server.stop();
}

/// A declared size above --max-frame-bytes is refused before the body is read (eviction or
/// close), and the server keeps serving other connections.
#[tokio::test]
async fn oversized_declared_frame_is_refused() {
    let dir = temp_dir();
    let server = TestServer::start_with(
        dir.path(),
        // The server requires max_frame_bytes >= batch_bytes_max + 1280.
        &[
            "--max-frame-bytes",
            "1048576",
            "--set",
            "limits.batch_bytes_max=1040000",
        ],
        &[],
    );
    for size in [1_048_577u32 + 256, 64 * 1024 * 1024, u32::MAX] {
        let mut raw = RawConn::connect(server.addr()).await;
        raw.login_root().await;
        let mut h = ReqHeader::new(raw.client, op::NON_REPLICATED, code::PING, 1, raw.session);
        h.size_override = Some(size);
        raw.send_frame(&h, &[]).await.unwrap();
        // No body follows: the server must not wait for it.
        match raw.read_frame_timeout(Duration::from_secs(5)).await {
            Err(RawError::Closed) | Err(RawError::Io(_)) => {}
            Ok(f) => {
                assert!(
                    f.is_eviction() || (f.is_reply() && f.status() != 0),
                    "size {size}: expected eviction / error / close, got command {} status {}",
                    f.command(),
                    f.status()
                );
                assert!(
                    raw.wait_closed(Duration::from_secs(5)).await,
                    "connection not closed"
                );
            }
            Err(RawError::Timeout) => panic!("size {size}: server neither replied nor closed"),
        }
    }
    // Frames under the limit still work on fresh connections.
    let mut raw = RawConn::connect(server.addr()).await;
    raw.login_root().await;
    let f = raw.call(code::PING, &[]).await;
    assert_eq!(f.status(), 0);
    let client = root_client(server.addr()).await;
    client.ping().await.unwrap();
    server.stop();
}

/// Malformed bodies on known codes get an error status (not a crash, not a hang) and the
/// connection stays usable.
#[tokio::test]
async fn malformed_bodies_get_error_replies() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let (mut raw, s, t) = raw_setup(&server, "malformed", 1).await;
    let cases: Vec<(u32, Vec<u8>)> = vec![
        (code::GET_STREAM, vec![]),
        (code::GET_STREAM, vec![1, 4, 0]),
        (code::GET_STREAM, vec![1, 3, 0, 0, 0]),
        (code::GET_STREAM, vec![2, 0]),
        (code::GET_STREAM, vec![9, 4, 0, 0, 0, 0]),
        (code::CREATE_STREAM, vec![0]),
        (code::CREATE_STREAM, vec![5, b'a']),
        (code::CREATE_TOPIC, vec![1, 4, 0, 0, 0, 0, 1]),
        (code::POLL_MESSAGES, vec![1, 1, 4, 0, 0]),
        (code::POLL_MESSAGES, {
            let mut b = enc::poll(1, s, t, None, (9, 0), 1, false);
            b.truncate(b.len() - 1);
            b
        }),
        (code::SEND_MESSAGES, vec![0xff, 0xff, 0xff, 0xff, 1, 2, 3]),
        (code::SEND_MESSAGES, {
            let b = batch::encode(&[batch::simple(1, b"abc")]);
            let mut body = enc::send_messages(s, t, 0, &b);
            body.truncate(body.len() - 10);
            body
        }),
        (code::STORE_CONSUMER_OFFSET, vec![1, 2, 3]),
        (code::GET_CONSUMER_OFFSET, vec![7]),
    ];
    for (c, body) in cases {
        let f = raw.call(c, &body).await;
        if f.is_eviction() {
            // Allowed for malformed input (reason 5 / 6); reconnect and continue.
            assert!(
                matches!(f.eviction_reason(), 4..=6),
                "eviction reason {}",
                f.eviction_reason()
            );
            raw = RawConn::connect(server.addr()).await;
            raw.login_root().await;
            continue;
        }
        assert!(f.is_reply());
        assert_ne!(
            f.sdk_error_code().unwrap_or(0),
            0,
            "code {c} with malformed body {body:02x?} must fail"
        );
        assert!(f.status() == 0 || f.body.is_empty());
        let p = raw.call(code::PING, &[]).await;
        assert_eq!(p.status(), 0, "connection usable after a malformed request");
    }
    // Nothing odd was created.
    let f = raw.call(code::GET_STREAMS, &[]).await;
    let body = f.ok_payload().to_vec();
    let mut c = rec::Cursor::new(&body);
    assert_eq!(rec::stream(&mut c).name, "malformed");
    assert_eq!(c.remaining(), 0);
    let client = root_client(server.addr()).await;
    let topic = client.get_topic(&id_num(s), &id_num(t)).await.unwrap().unwrap();
    assert_eq!(topic.messages_count, 0);
    server.stop();
}
