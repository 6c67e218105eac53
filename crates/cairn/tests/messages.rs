//! Acceptance 4: sending and polling messages through the SDK (30 000 messages of mixed sizes,
//! user headers, partition id / balanced / key partitioning, every polling strategy), the
//! empty-payload refusal, and §11 items 21, 22, 26.

mod common;

use common::*;
use iggy::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::str::FromStr;

const PARTITIONS: u32 = 3;
const TOTAL: usize = 30_000;
const ONE_MIB: usize = 1024 * 1024;

#[derive(Debug, Clone)]
struct Expected {
    id: u128,
    payload: Vec<u8>,
    headers: Vec<u8>,
    origin_timestamp: u64,
    /// (before send, after send) in µs: the server's append timestamp must fall inside.
    window: (u64, u64),
}

#[derive(Debug, Clone, Copy)]
enum Mode {
    Partition(u32),
    Balanced,
    Key(u64),
}

fn user_headers(rng: &mut StdRng, i: u64) -> BTreeMap<HeaderKey, HeaderValue> {
    let mut m = BTreeMap::new();
    m.insert(
        HeaderKey::from_str("trace-id").unwrap(),
        HeaderValue::from_str(&format!("trace-{i}")).unwrap(),
    );
    m.insert(HeaderKey::from_str("seq").unwrap(), HeaderValue::from(i));
    if rng.gen_bool(0.5) {
        m.insert(
            HeaderKey::from_str("flag").unwrap(),
            HeaderValue::from(rng.gen_bool(0.5)),
        );
    }
    m
}

fn payload_len(rng: &mut StdRng) -> usize {
    match rng.gen_range(0..100) {
        0..=9 => 1,
        10..=84 => rng.gen_range(1..=200),
        _ => rng.gen_range(200..=4096),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_and_poll_30000_messages() {
    let seed: u64 = std::env::var("CAIRN_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("send_and_poll_30000_messages seed = {seed} (set CAIRN_TEST_SEED to replay)");
    let mut rng = StdRng::seed_from_u64(seed);

    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let client = root_client(server.addr()).await;
    let (s, t) = create_stream_topic(&client, "bulk", "mixed", PARTITIONS).await;
    let (sid, tid) = (id_num(s), id_num(t));

    let mut expected: Vec<Vec<Expected>> = vec![Vec::new(); PARTITIONS as usize];
    let mut next_id: u128 = 1;
    let mut balanced_counter: u32 = 0;
    let mut sent = 0usize;
    let mut big_left = 4usize;
    let mut batch_no = 0u64;
    let mut confirmations_seen = 0usize;

    while sent < TOTAL {
        batch_no += 1;
        // A handful of 1 MiB messages, each in a batch of its own.
        let big = big_left > 0 && batch_no % 7 == 3;
        let n = if big {
            1
        } else {
            rng.gen_range(1..=500).min(TOTAL - sent)
        };
        let mode = match batch_no % 3 {
            0 => Mode::Partition(rng.gen_range(0..PARTITIONS)),
            1 => Mode::Balanced,
            _ => Mode::Key(rng.gen_range(0..50)),
        };
        let mut msgs = Vec::with_capacity(n);
        for _ in 0..n {
            let len = if big { ONE_MIB } else { payload_len(&mut rng) };
            let mut payload = vec![0u8; len];
            rng.fill(&mut payload[..]);
            let id = next_id;
            next_id += 1;
            let builder = IggyMessage::builder().id(id).payload(bytes::Bytes::from(payload));
            let msg = if rng.gen_bool(0.3) {
                builder
                    .user_headers(user_headers(&mut rng, id as u64))
                    .build()
                    .unwrap()
            } else {
                builder.build().unwrap()
            };
            msgs.push(msg);
        }
        if big {
            big_left -= 1;
        }
        let (partitioning, partition) = match mode {
            Mode::Partition(p) => (Partitioning::partition_id(p), p),
            Mode::Balanced => {
                let p = balanced_counter % PARTITIONS;
                balanced_counter += 1;
                (Partitioning::balanced(), p)
            }
            Mode::Key(k) => {
                let key = k.to_le_bytes();
                let p = xxhash_rust::xxh32::xxh32(&key, 0) % PARTITIONS;
                (Partitioning::messages_key(&key).unwrap(), p)
            }
        };
        let before = now_micros();
        let resp = client
            .send_messages(&sid, &tid, &partitioning, &mut msgs)
            .await
            .unwrap_or_else(|e| panic!("send batch {batch_no} ({n} msgs, {mode:?}): {e:?}"));
        let after = now_micros();
        let base = expected[partition as usize].len() as u64;
        if !resp.confirmations.is_empty() {
            confirmations_seen += 1;
            assert_eq!(resp.confirmations.len(), 1, "one confirmation per batch");
            let c = &resp.confirmations[0];
            assert_eq!(c.partition_id, partition, "confirmation partition ({mode:?})");
            assert_eq!(c.base_offset, base, "confirmation base_offset");
            assert_eq!(c.stream_id, s);
            assert_eq!(c.topic_id, t);
        }
        for m in &msgs {
            expected[partition as usize].push(Expected {
                id: m.header.id,
                payload: m.payload.to_vec(),
                headers: m.user_headers.as_deref().unwrap_or(&[]).to_vec(),
                origin_timestamp: m.header.origin_timestamp,
                window: (before, after),
            });
        }
        sent += n;
    }
    assert_eq!(big_left, 0, "all 1 MiB messages were sent");
    eprintln!("sent {sent} messages in {batch_no} batches; {confirmations_seen} confirmations");

    // Partition stats.
    let topic = client.get_topic(&sid, &tid).await.unwrap().unwrap();
    assert_eq!(topic.messages_count, TOTAL as u64, "topic messages_count");
    for p in &topic.partitions {
        let n = expected[p.id as usize].len() as u64;
        assert_eq!(p.messages_count, n, "partition {} messages_count", p.id);
        if n > 0 {
            assert_eq!(p.current_offset, n - 1, "partition {} current_offset", p.id);
        }
    }

    // Poll everything back with Offset and compare.
    let mut polled_all: Vec<Vec<IggyMessage>> = Vec::new();
    for p in 0..PARTITIONS {
        let exp = &expected[p as usize];
        let got = poll_all(&client, s, t, p, 1000, TOTAL).await;
        assert_eq!(got.len(), exp.len(), "partition {p}: message count");
        let mut last_ts = 0;
        for (i, (g, e)) in got.iter().zip(exp.iter()).enumerate() {
            assert_eq!(
                g.header.offset, i as u64,
                "partition {p}: offsets contiguous from 0"
            );
            assert_eq!(g.header.id, e.id, "partition {p} offset {i}: id");
            assert_eq!(
                g.payload.len(),
                e.payload.len(),
                "partition {p} offset {i}: payload length"
            );
            assert!(
                g.payload[..] == e.payload[..],
                "partition {p} offset {i}: payload bytes"
            );
            assert_eq!(
                g.user_headers.as_deref().unwrap_or(&[]),
                &e.headers[..],
                "partition {p} offset {i}: user headers"
            );
            assert_eq!(
                g.header.origin_timestamp, e.origin_timestamp,
                "partition {p} offset {i}: origin timestamp"
            );
            assert!(
                g.header.timestamp >= e.window.0 && g.header.timestamp <= e.window.1,
                "partition {p} offset {i}: timestamp {} outside the send window {:?}",
                g.header.timestamp,
                e.window
            );
            assert!(g.header.timestamp >= last_ts, "timestamps go backwards");
            last_ts = g.header.timestamp;
            if !e.headers.is_empty() {
                let map = g.user_headers_map().unwrap().expect("headers decode");
                assert!(map.contains_key(&HeaderKey::from_str("trace-id").unwrap()));
            }
        }
        polled_all.push(got);
    }

    // Other strategies, on every partition that has enough messages.
    let consumer = Consumer::new(id_num(77));
    for p in 0..PARTITIONS {
        let all = &polled_all[p as usize];
        let n = all.len() as u64;
        assert!(
            n > 20,
            "partition {p} got too few messages for the strategy checks"
        );

        let first = client
            .poll_messages(
                &sid,
                &tid,
                Some(p),
                &consumer,
                &PollingStrategy::first(),
                10,
                false,
            )
            .await
            .unwrap();
        assert_eq!(offsets(&first), (0..10).collect::<Vec<_>>(), "First(10)");
        assert_eq!(first.partition_id, p);
        assert_eq!(first.current_offset, n - 1, "current_offset in poll reply");

        let last = client
            .poll_messages(
                &sid,
                &tid,
                Some(p),
                &consumer,
                &PollingStrategy::last(),
                10,
                false,
            )
            .await
            .unwrap();
        assert_eq!(offsets(&last), (n - 10..n).collect::<Vec<_>>(), "Last(10)");
        assert_eq!(
            last.messages.last().unwrap().header.id,
            all.last().unwrap().header.id
        );

        // Next with nothing stored and no auto-commit: from the first message, twice.
        for _ in 0..2 {
            let next = client
                .poll_messages(&sid, &tid, Some(p), &consumer, &PollingStrategy::next(), 5, false)
                .await
                .unwrap();
            assert_eq!(
                offsets(&next),
                vec![0, 1, 2, 3, 4],
                "Next without a stored offset"
            );
        }

        // Offset in the middle, spanning batches.
        let mid = n / 2;
        let from_mid = client
            .poll_messages(
                &sid,
                &tid,
                Some(p),
                &consumer,
                &PollingStrategy::offset(mid),
                600,
                false,
            )
            .await
            .unwrap();
        let want: Vec<u64> = (mid..(mid + 600).min(n)).collect();
        assert_eq!(offsets(&from_mid), want, "Offset({mid}) x600");

        // Timestamp: from the first message whose append timestamp >= t.
        let target = &all[(n * 2 / 3) as usize];
        let ts = target.header.timestamp;
        let first_at = all.iter().position(|m| m.header.timestamp >= ts).unwrap() as u64;
        let by_ts = client
            .poll_messages(
                &sid,
                &tid,
                Some(p),
                &consumer,
                &PollingStrategy::timestamp(IggyTimestamp::from(ts)),
                5,
                false,
            )
            .await
            .unwrap();
        let want: Vec<u64> = (first_at..(first_at + 5).min(n)).collect();
        assert_eq!(offsets(&by_ts), want, "Timestamp({ts})");
        // A timestamp after the last message → nothing.
        let late = client
            .poll_messages(
                &sid,
                &tid,
                Some(p),
                &consumer,
                &PollingStrategy::timestamp(IggyTimestamp::from(all.last().unwrap().header.timestamp + 1)),
                5,
                false,
            )
            .await
            .unwrap();
        assert!(
            late.messages.is_empty(),
            "Timestamp after the end returns nothing"
        );

        // Past the end → empty.
        let past = client
            .poll_messages(
                &sid,
                &tid,
                Some(p),
                &consumer,
                &PollingStrategy::offset(n),
                10,
                false,
            )
            .await
            .unwrap();
        assert!(past.messages.is_empty(), "Offset(end) must be empty");
        assert_eq!(past.current_offset, n - 1);
    }

    // Omitted partition with a kind-1 consumer = partition 0 (§8).
    let none = client
        .poll_messages(&sid, &tid, None, &consumer, &PollingStrategy::offset(0), 3, false)
        .await
        .unwrap();
    assert_eq!(none.partition_id, 0);
    let ids: Vec<u128> = none.messages.iter().map(|m| m.header.id).collect();
    let want: Vec<u128> = expected[0][..3].iter().map(|e| e.id).collect();
    assert_eq!(ids, want, "no partition → partition 0");
    server.stop();
}

fn offsets(p: &PolledMessages) -> Vec<u64> {
    p.messages.iter().map(|m| m.header.offset).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_payload_is_refused() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let client = root_client(server.addr()).await;
    let (s, t) = create_stream_topic(&client, "empty", "t", 1).await;
    let (sid, tid) = (id_num(s), id_num(t));

    // The SDK's builder refuses a 0-byte payload client-side.
    let built = IggyMessage::builder().payload(bytes::Bytes::new()).build();
    assert_code(built, 4025);

    // A hand-made message bypasses the builder: the server must refuse it (4024).
    let empty = IggyMessage {
        header: IggyMessageHeader {
            id: 77,
            origin_timestamp: now_micros(),
            ..Default::default()
        },
        payload: bytes::Bytes::new(),
        user_headers: None,
    };
    let mut msgs = vec![sdk_message(1, b"fine".to_vec()), empty];
    assert_code(
        client
            .send_messages(&sid, &tid, &Partitioning::partition_id(0), &mut msgs)
            .await,
        4024,
    );

    // Raw: a batch whose only message has a 0-byte payload.
    let mut raw = RawConn::connect(server.addr()).await;
    raw.login_root().await;
    let b = batch::encode(&[batch::simple(5, b"")]);
    let f = raw
        .call(code::SEND_MESSAGES, &enc::send_messages(s, t, 0, &b))
        .await;
    assert_eq!(f.operation(), op::SEND_MESSAGES);
    f.assert_error(4024);
    // And a batch where the second of three is empty.
    let b = batch::encode(&[
        batch::simple(6, b"a"),
        batch::simple(7, b""),
        batch::simple(8, b"c"),
    ]);
    let f = raw
        .call(code::SEND_MESSAGES, &enc::send_messages(s, t, 0, &b))
        .await;
    f.assert_error(4024);

    // Nothing at all was stored (batches are all-or-nothing).
    let polled = client
        .poll_messages(
            &sid,
            &tid,
            Some(0),
            &Consumer::new(id_num(1)),
            &PollingStrategy::first(),
            10,
            false,
        )
        .await
        .unwrap();
    assert!(
        polled.messages.is_empty(),
        "a refused batch must not store anything"
    );

    // 1 byte and 1 MiB are accepted.
    let mut ok = vec![sdk_message(100, vec![9]), sdk_message(101, vec![3; ONE_MIB])];
    client
        .send_messages(&sid, &tid, &Partitioning::partition_id(0), &mut ok)
        .await
        .expect("1 B and 1 MiB payloads");
    let polled = client
        .poll_messages(
            &sid,
            &tid,
            Some(0),
            &Consumer::new(id_num(1)),
            &PollingStrategy::first(),
            10,
            false,
        )
        .await
        .unwrap();
    assert_eq!(polled.messages.len(), 2);
    assert_eq!(polled.messages[0].payload.len(), 1);
    assert_eq!(polled.messages[1].payload.len(), ONE_MIB);
    assert_eq!(offsets(&polled), vec![0, 1]);
    server.stop();
}

/// §11 item 22 plus missing stream/topic targets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_to_missing_targets() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let client = root_client(server.addr()).await;
    let (s, t) = create_stream_topic(&client, "targets", "t", 3).await;

    let mut m = vec![sdk_message(1, b"x".to_vec())];
    assert_code(
        client
            .send_messages(&id_num(s), &id_num(t), &Partitioning::partition_id(3), &mut m)
            .await,
        3007,
    );
    assert_code(
        client
            .send_messages(&id_num(s), &id_num(t), &Partitioning::partition_id(1000), &mut m)
            .await,
        3007,
    );
    assert_code(
        client
            .send_messages(&id_num(9999), &id_num(t), &Partitioning::partition_id(0), &mut m)
            .await,
        1009,
    );
    assert_code(
        client
            .send_messages(
                &id_name("no-stream"),
                &id_num(t),
                &Partitioning::partition_id(0),
                &mut m,
            )
            .await,
        1010,
    );
    assert_code(
        client
            .send_messages(&id_num(s), &id_num(9999), &Partitioning::partition_id(0), &mut m)
            .await,
        2010,
    );
    assert_code(
        client
            .send_messages(
                &id_num(s),
                &id_name("no-topic"),
                &Partitioning::partition_id(0),
                &mut m,
            )
            .await,
        2011,
    );
    // Poll of a missing partition → 3007 too.
    assert_code(
        client
            .poll_messages(
                &id_num(s),
                &id_num(t),
                Some(3),
                &Consumer::new(id_num(1)),
                &PollingStrategy::first(),
                1,
                false,
            )
            .await,
        3007,
    );
    // Raw.
    let mut raw = RawConn::connect(server.addr()).await;
    raw.login_root().await;
    let b = batch::encode(&[batch::simple(1, b"x")]);
    let f = raw
        .call(code::SEND_MESSAGES, &enc::send_messages(s, t, 3, &b))
        .await;
    f.assert_error(3007);
    server.stop();
}

/// §11 item 21: balanced sends go 0, 1, 0, 1 …; keyed sends go to XXH32(key) % n; sending by
/// name works too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn balanced_and_keyed_partitioning() {
    assert_eq!(
        xxhash_rust::xxh32::xxh32(b"key", 0),
        3_017_358_048,
        "golden XXH32"
    );
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let client = root_client(server.addr()).await;
    let (s, t) = create_stream_topic(&client, "bal", "two", 2).await;
    for i in 0..4u128 {
        let mut m = vec![sdk_message(i + 1, format!("b{i}").into_bytes())];
        client
            .send_messages(
                &id_name("bal"),
                &id_name("two"),
                &Partitioning::balanced(),
                &mut m,
            )
            .await
            .unwrap();
    }
    let p0 = poll_all(&client, s, t, 0, 10, 10).await;
    let p1 = poll_all(&client, s, t, 1, 10, 10).await;
    assert_eq!(p0.iter().map(|m| m.header.id).collect::<Vec<_>>(), vec![1, 3]);
    assert_eq!(p1.iter().map(|m| m.header.id).collect::<Vec<_>>(), vec![2, 4]);

    let t3 = client
        .create_topic(&id_num(s), "three", &topic_opts(3))
        .await
        .unwrap()
        .id;
    let keys: [&[u8]; 5] = [b"key", b"alpha", b"beta", b"gamma", b"delta"];
    let mut want: Vec<Vec<u128>> = vec![Vec::new(); 3];
    for (i, k) in keys.iter().enumerate() {
        let id = 100 + i as u128;
        let mut m = vec![sdk_message(id, k.to_vec())];
        client
            .send_messages(
                &id_num(s),
                &id_num(t3),
                &Partitioning::messages_key(k).unwrap(),
                &mut m,
            )
            .await
            .unwrap();
        want[(xxhash_rust::xxh32::xxh32(k, 0) % 3) as usize].push(id);
    }
    assert_eq!(want[0].first(), Some(&100), "\"key\" goes to partition 0");
    for p in 0..3u32 {
        let got = poll_all(&client, s, t3, p, 10, 10).await;
        assert_eq!(
            got.iter().map(|m| m.header.id).collect::<Vec<_>>(),
            want[p as usize],
            "keyed partition {p}"
        );
    }
    server.stop();
}

/// Several clients sending to the same partition at once: offsets stay unique and contiguous,
/// every message is stored exactly once, and each client's messages keep their send order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_producers_on_one_partition() {
    const CLIENTS: u128 = 4;
    const BATCHES: u128 = 40;
    const PER_BATCH: u128 = 25;
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let addr = server.addr();
    let client = root_client(addr).await;
    let (s, t) = create_stream_topic(&client, "concurrent", "t", 2).await;

    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        tasks.push(tokio::spawn(async move {
            let client = root_client(addr).await;
            let mut confirmed = Vec::new();
            for b in 0..BATCHES {
                let mut msgs: Vec<IggyMessage> = (0..PER_BATCH)
                    .map(|i| {
                        let id = c * 1_000_000 + b * PER_BATCH + i + 1;
                        sdk_message(id, format!("c{c}-{id}").into_bytes())
                    })
                    .collect();
                let resp = client
                    .send_messages(&id_num(s), &id_num(t), &Partitioning::partition_id(1), &mut msgs)
                    .await
                    .expect("concurrent send");
                if let Some(conf) = resp.confirmations.first() {
                    confirmed.push(conf.base_offset);
                }
            }
            confirmed
        }));
    }
    let mut bases = Vec::new();
    for task in tasks {
        bases.extend(task.await.expect("sender task"));
    }
    let total = (CLIENTS * BATCHES * PER_BATCH) as usize;
    let all = poll_all(&client, s, t, 1, 1000, total).await;
    assert_eq!(all.len(), total);
    let mut seen = std::collections::HashSet::new();
    let mut last_per_client = vec![0u128; CLIENTS as usize];
    for (i, m) in all.iter().enumerate() {
        assert_eq!(m.header.offset, i as u64, "contiguous offsets");
        assert!(seen.insert(m.header.id), "id {} stored twice", m.header.id);
        let c = (m.header.id / 1_000_000) as usize;
        assert!(m.header.id > last_per_client[c], "client {c} order broken");
        last_per_client[c] = m.header.id;
        assert_eq!(m.payload.as_ref(), format!("c{c}-{}", m.header.id).as_bytes());
    }
    // Confirmed base offsets (if reported) are distinct batch starts.
    if !bases.is_empty() {
        bases.sort_unstable();
        bases.dedup();
        assert_eq!(bases.len() as u128, CLIENTS * BATCHES, "distinct base offsets");
        for b in &bases {
            assert_eq!(b % PER_BATCH as u64, 0, "a batch is stored contiguously");
        }
    }
    drop(client);
    server.stop();
}

/// Issue 13, point 4: a send of a batch near `limits.batch_bytes_max` (64 MiB) is one op of
/// its partition's group: acknowledged, stored as one batch record, and polled back whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_almost_64_mib_is_one_op_and_comes_back_whole() {
    const MESSAGES: usize = 60;
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let client = root_client(server.addr()).await;
    let (s, t) = create_stream_topic(&client, "big", "t", 1).await;
    let (sid, tid) = (id_num(s), id_num(t));
    let payload = |i: usize| vec![(i % 251) as u8; ONE_MIB];
    let mut batch: Vec<IggyMessage> = (0..MESSAGES)
        .map(|i| sdk_message(1_000 + i as u128, payload(i)))
        .collect();
    client
        .send_messages(&sid, &tid, &Partitioning::partition_id(0), &mut batch)
        .await
        .expect("a 60 MiB batch is acknowledged");
    let got = poll_all(&client, s, t, 0, 10, MESSAGES).await;
    assert_eq!(got.len(), MESSAGES, "every message polled back");
    for (i, message) in got.iter().enumerate() {
        assert_eq!(message.header.offset, i as u64);
        assert!(message.payload.as_ref() == payload(i).as_slice(), "message {i}");
    }
    drop(client);
    server.stop();
    let log = last_segment_log(&partition_dir(dir.path(), s, t, 0));
    let bytes = std::fs::read(&log).expect("segment");
    let (records, _) = parse_records(&bytes);
    let batches: Vec<&DiskRecord> = records.iter().filter(|r| r.kind == RECORD_KIND_BATCH).collect();
    assert_eq!(batches.len(), 1, "one stored batch");
    assert_eq!(batches[0].message_count as usize, MESSAGES);
}

/// A batch sent again unchanged (the SDK producer resends one whose reply it lost: same
/// messages, same ids) is recognised and stored once, after a restart too. A batch whose
/// messages differ, even by one payload byte, is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_sent_again_unchanged_is_stored_once() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let client = root_client(server.addr()).await;
    let (s, t) = create_stream_topic(&client, "resend", "t", 1).await;
    // The messages as built once (each carries its origin timestamp), sent as they are.
    let build = |last: &[u8]| -> Vec<IggyMessage> {
        (1..=5u128)
            .map(|id| {
                let payload = if id == 5 {
                    last.to_vec()
                } else {
                    format!("m{id}").into_bytes()
                };
                IggyMessage::builder()
                    .id(id)
                    .payload(payload.into())
                    .build()
                    .expect("a message")
            })
            .collect()
    };
    let send = |mut messages: Vec<IggyMessage>| {
        let client = &client;
        async move {
            client
                .send_messages(
                    &id_num(s),
                    &id_num(t),
                    &Partitioning::partition_id(0),
                    &mut messages,
                )
                .await
                .map(|_| messages)
        }
    };
    let sent = send(build(b"m5")).await.expect("the first send");
    send(sent).await.expect("the resend is answered");
    let mut changed = send(build(b"m5!")).await.expect("a changed batch");
    let stored = poll_all(&client, s, t, 0, 100, 100).await;
    let ids: Vec<u128> = stored.iter().map(|m| m.header.id).collect();
    assert_eq!(
        ids,
        vec![1, 2, 3, 4, 5, 1, 2, 3, 4, 5],
        "the resend is not stored"
    );
    assert_eq!(stored[9].payload.as_ref(), b"m5!");

    // After a restart the partition reads its newest batches back: still recognised.
    drop(client);
    server.stop();
    let server = TestServer::start(dir.path());
    let client = root_client(server.addr()).await;
    client
        .send_messages(
            &id_num(s),
            &id_num(t),
            &Partitioning::partition_id(0),
            &mut changed,
        )
        .await
        .expect("resent after a restart");
    assert_eq!(
        poll_all(&client, s, t, 0, 100, 100).await.len(),
        10,
        "recognised after the restart"
    );
    server.stop();
}
