//! Acceptance 7: a clean stop (SIGTERM) and a restart on the same data directory keep every
//! stream, topic, message and stored consumer offset; new sends continue the offsets. Also
//! with a tiny segment size so segments rotate, and a crash (SIGKILL) recovery check.

mod common;

use common::*;
use iggy::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::str::FromStr;

#[derive(Debug, Clone)]
struct Msg {
    id: u128,
    payload: Vec<u8>,
    headers: Vec<u8>,
    origin_timestamp: u64,
    /// The offset the send's confirmation gave it.
    offset: u64,
    /// Server timestamp as first polled (filled in by `verify`).
    timestamp: Option<u64>,
}

#[derive(Debug, Clone)]
struct TopicState {
    name: String,
    id: u32,
    partitions: Vec<Vec<Msg>>,
}

#[derive(Debug, Clone)]
struct StreamState {
    name: String,
    id: u32,
    topics: Vec<TopicState>,
}

#[derive(Debug, Clone)]
struct OffsetState {
    consumer: Consumer,
    stream: u32,
    topic: u32,
    partition: u32,
    offset: u64,
}

#[derive(Debug, Clone)]
struct State {
    streams: Vec<StreamState>,
    offsets: Vec<OffsetState>,
    next_id: u128,
}

async fn send_to(
    client: &IggyClient,
    rng: &mut StdRng,
    st: &mut State,
    si: usize,
    ti: usize,
    p: u32,
    batches: usize,
) {
    let (s, t) = (st.streams[si].id, st.streams[si].topics[ti].id);
    for _ in 0..batches {
        let n = rng.gen_range(1..=40);
        let mut msgs = Vec::new();
        for _ in 0..n {
            let id = st.next_id;
            st.next_id += 1;
            let mut payload = vec![0u8; rng.gen_range(1..=2000)];
            rng.fill(&mut payload[..]);
            let b = IggyMessage::builder().id(id).payload(bytes::Bytes::from(payload));
            let m = if rng.gen_bool(0.25) {
                let mut h = BTreeMap::new();
                h.insert(
                    HeaderKey::from_str("k").unwrap(),
                    HeaderValue::from_str(&format!("v{id}")).unwrap(),
                );
                b.user_headers(h).build().unwrap()
            } else {
                b.build().unwrap()
            };
            msgs.push(m);
        }
        let resp = client
            .send_messages(&id_num(s), &id_num(t), &Partitioning::partition_id(p), &mut msgs)
            .await
            .expect("send");
        let part = &mut st.streams[si].topics[ti].partitions[p as usize];
        let next_contiguous = part.last().map_or(0, |m| m.offset + 1);
        let base_offset = resp
            .confirmations
            .first()
            .expect("the server confirms every send")
            .base_offset;
        // Offsets have no gaps, across crashes too: an op is acknowledged only once durable.
        assert_eq!(
            base_offset, next_contiguous,
            "confirmation base_offset continues the offsets"
        );
        for (i, m) in msgs.into_iter().enumerate() {
            part.push(Msg {
                id: m.header.id,
                payload: m.payload.to_vec(),
                headers: m.user_headers.as_deref().unwrap_or(&[]).to_vec(),
                origin_timestamp: m.header.origin_timestamp,
                offset: base_offset + i as u64,
                timestamp: None,
            });
        }
    }
}

async fn populate(client: &IggyClient, rng: &mut StdRng) -> State {
    let mut st = State {
        streams: Vec::new(),
        offsets: Vec::new(),
        next_id: 1,
    };
    for (sname, topics) in [
        ("alpha", vec![("t3", 3u32), ("t1", 1)]),
        ("beta", vec![("tb", 2u32)]),
    ] {
        let s = client.create_stream(sname).await.expect("create_stream");
        let mut ts = Vec::new();
        for (tname, parts) in topics {
            let t = client
                .create_topic(&id_num(s.id), tname, &topic_opts(parts))
                .await
                .expect("create_topic");
            ts.push(TopicState {
                name: tname.to_string(),
                id: t.id,
                partitions: vec![Vec::new(); parts as usize],
            });
        }
        st.streams.push(StreamState {
            name: sname.to_string(),
            id: s.id,
            topics: ts,
        });
    }
    for si in 0..st.streams.len() {
        for ti in 0..st.streams[si].topics.len() {
            for p in 0..st.streams[si].topics[ti].partitions.len() {
                send_to(client, rng, &mut st, si, ti, p as u32, 8).await;
            }
        }
    }
    // One message larger than a small segment (64 KiB vs 4-8 KiB).
    {
        let (beta, tb) = (st.streams[1].id, st.streams[1].topics[0].id);
        let id = st.next_id;
        st.next_id += 1;
        let payload: Vec<u8> = (0..65_536u32).map(|i| (i % 251) as u8).collect();
        let mut m = vec![sdk_message(id, payload.clone())];
        let resp = client
            .send_messages(&id_num(beta), &id_num(tb), &Partitioning::partition_id(1), &mut m)
            .await
            .expect("send 64 KiB message");
        let part = &mut st.streams[1].topics[0].partitions[1];
        let offset = resp
            .confirmations
            .first()
            .expect("the server confirms every send")
            .base_offset;
        assert_eq!(
            offset,
            part.last().map_or(0, |m| m.offset + 1),
            "64 KiB message offset"
        );
        part.push(Msg {
            id,
            payload,
            headers: Vec::new(),
            origin_timestamp: m[0].header.origin_timestamp,
            offset,
            timestamp: None,
        });
    }
    // Stored consumer offsets: explicit stores and an auto-commit poll.
    let alpha = st.streams[0].id;
    let (t3, t1) = (st.streams[0].topics[0].id, st.streams[0].topics[1].id);
    let beta = st.streams[1].id;
    let tb = st.streams[1].topics[0].id;
    for (consumer, s, t, p, off) in [
        (Consumer::new(id_num(1)), alpha, t3, 1u32, 42u64),
        (Consumer::new(id_name("named-c")), beta, tb, 0, 7),
        (Consumer::new(id_num(2)), alpha, t3, 2, 0),
    ] {
        client
            .store_consumer_offset(&consumer, &id_num(s), &id_num(t), Some(p), off)
            .await
            .expect("store offset");
        st.offsets.push(OffsetState {
            consumer,
            stream: s,
            topic: t,
            partition: p,
            offset: off,
        });
    }
    let c3 = Consumer::new(id_num(3));
    let polled = client
        .poll_messages(
            &id_num(alpha),
            &id_num(t1),
            Some(0),
            &c3,
            &PollingStrategy::next(),
            10,
            true,
        )
        .await
        .unwrap();
    assert_eq!(polled.messages.len(), 10);
    st.offsets.push(OffsetState {
        consumer: c3,
        stream: alpha,
        topic: t1,
        partition: 0,
        offset: 9,
    });
    st
}

/// Check the server holds exactly `st`. Fills in / compares server timestamps.
async fn verify(client: &IggyClient, st: &mut State) {
    let streams = client.get_streams().await.expect("get_streams");
    let mut got: Vec<(u32, String)> = streams.iter().map(|s| (s.id, s.name.clone())).collect();
    got.sort();
    let mut want: Vec<(u32, String)> = st.streams.iter().map(|s| (s.id, s.name.clone())).collect();
    want.sort();
    assert_eq!(got, want, "streams (id, name)");

    for s in st.streams.iter_mut() {
        let sd = client
            .get_stream(&id_num(s.id))
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("stream {} missing", s.name));
        assert_eq!(sd.name, s.name);
        assert_eq!(
            sd.topics_count as usize,
            s.topics.len(),
            "topics_count of {}",
            s.name
        );
        for t in s.topics.iter_mut() {
            let td = client
                .get_topic(&id_num(s.id), &id_num(t.id))
                .await
                .unwrap()
                .unwrap_or_else(|| panic!("topic {}/{} missing", s.name, t.name));
            assert_eq!(td.name, t.name);
            assert_eq!(td.partitions_count as usize, t.partitions.len());
            let total: usize = t.partitions.iter().map(|p| p.len()).sum();
            assert_eq!(td.messages_count, total as u64, "messages_count of {}", t.name);
            for (p, msgs) in t.partitions.iter_mut().enumerate() {
                let pd = &td.partitions[p];
                assert_eq!(pd.id as usize, p);
                assert_eq!(pd.messages_count, msgs.len() as u64);
                let polled = poll_all(client, s.id, t.id, p as u32, 97, msgs.len()).await;
                assert_eq!(
                    polled.len(),
                    msgs.len(),
                    "{}/{}/{p}: message count",
                    s.name,
                    t.name
                );
                for (i, (g, e)) in polled.iter().zip(msgs.iter_mut()).enumerate() {
                    let at = format!("{}/{}/{p} offset {i}", s.name, t.name);
                    assert_eq!(g.header.offset, e.offset, "{at}: offset");
                    assert_eq!(g.header.id, e.id, "{at}: id");
                    assert!(g.payload[..] == e.payload[..], "{at}: payload");
                    assert_eq!(
                        g.user_headers.as_deref().unwrap_or(&[]),
                        &e.headers[..],
                        "{at}: headers"
                    );
                    assert_eq!(g.header.origin_timestamp, e.origin_timestamp, "{at}: origin ts");
                    match e.timestamp {
                        None => e.timestamp = Some(g.header.timestamp),
                        Some(ts) => assert_eq!(g.header.timestamp, ts, "{at}: timestamp changed"),
                    }
                }
                assert_eq!(
                    pd.current_offset,
                    msgs.last().map_or(0, |m| m.offset),
                    "{}/{}/{p}: partition current_offset (GetTopic)",
                    s.name,
                    t.name
                );
            }
        }
    }
    for o in &st.offsets {
        let info = client
            .get_consumer_offset(
                &o.consumer,
                &id_num(o.stream),
                &id_num(o.topic),
                Some(o.partition),
            )
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("consumer offset {o:?} missing"));
        assert_eq!(info.stored_offset, o.offset, "stored offset for {o:?}");
        assert_eq!(info.partition_id, o.partition);
    }
}

async fn assert_segments_rotated(client: &IggyClient, st: &State) {
    for s in &st.streams {
        for t in &s.topics {
            let td = client
                .get_topic(&id_num(s.id), &id_num(t.id))
                .await
                .unwrap()
                .unwrap();
            for p in &td.partitions {
                assert!(
                    p.segments_count > 1,
                    "{}/{}/{}: expected several segments with a 4 KiB segment size, got {}",
                    s.name,
                    t.name,
                    p.id,
                    p.segments_count
                );
            }
        }
    }
}

async fn restart_cycle(extra_args: &[&str], small_segments: bool) {
    let seed: u64 = rand::random();
    eprintln!("restart seed = {seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = temp_dir();

    // Run 1: populate, verify, stop cleanly.
    let server = TestServer::start_with(dir.path(), extra_args, &[]);
    let client = root_client(server.addr()).await;
    let mut st = populate(&client, &mut rng).await;
    verify(&client, &mut st).await;
    if small_segments {
        assert_segments_rotated(&client, &st).await;
    }
    drop(client);
    server.stop();

    // Run 2: same data dir; everything is still there; new sends continue the offsets.
    let server = TestServer::start_with(dir.path(), extra_args, &[]);
    let client = root_client(server.addr()).await;
    verify(&client, &mut st).await;
    if small_segments {
        assert_segments_rotated(&client, &st).await;
    }
    // Auto-committed position survives: Next continues at 10.
    let c3 = Consumer::new(id_num(3));
    let (alpha, t1) = (st.streams[0].id, st.streams[0].topics[1].id);
    let polled = client
        .poll_messages(
            &id_num(alpha),
            &id_num(t1),
            Some(0),
            &c3,
            &PollingStrategy::next(),
            5,
            false,
        )
        .await
        .unwrap();
    assert_eq!(polled.messages[0].header.offset, 10, "Next after restart");

    for si in 0..st.streams.len() {
        for ti in 0..st.streams[si].topics.len() {
            for p in 0..st.streams[si].topics[ti].partitions.len() {
                let before = st.streams[si].topics[ti].partitions[p].len() as u64;
                send_to(&client, &mut rng, &mut st, si, ti, p as u32, 2).await;
                let polled = client
                    .poll_messages(
                        &id_num(st.streams[si].id),
                        &id_num(st.streams[si].topics[ti].id),
                        Some(p as u32),
                        &Consumer::new(id_num(500)),
                        &PollingStrategy::offset(before),
                        1,
                        false,
                    )
                    .await
                    .unwrap();
                assert_eq!(polled.messages.len(), 1);
                assert_eq!(polled.messages[0].header.offset, before, "offsets continue");
                assert_eq!(
                    polled.messages[0].header.id,
                    st.streams[si].topics[ti].partitions[p][before as usize].id
                );
            }
        }
    }
    // A new stream gets an id that does not collide with the recovered ones.
    let gamma = client.create_stream("gamma").await.expect("create after restart");
    assert!(st.streams.iter().all(|s| s.id != gamma.id), "stream id reused");
    assert_code(client.create_stream("alpha").await, 1012);
    st.streams.push(StreamState {
        name: "gamma".into(),
        id: gamma.id,
        topics: Vec::new(),
    });
    client
        .store_consumer_offset(
            &Consumer::new(id_num(1)),
            &id_num(st.streams[0].id),
            &id_num(st.streams[0].topics[0].id),
            Some(1),
            43,
        )
        .await
        .unwrap();
    st.offsets[0].offset = 43;
    verify(&client, &mut st).await;
    drop(client);
    server.stop();

    // Run 3: the writes made after the first restart survived too.
    let server = TestServer::start_with(dir.path(), extra_args, &[]);
    let client = root_client(server.addr()).await;
    verify(&client, &mut st).await;
    drop(client);
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clean_restart_preserves_everything() {
    restart_cycle(&[], false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clean_restart_with_small_segments() {
    restart_cycle(&["--segment-size-bytes", "4096"], true).await;
}

/// SIGKILL: with the default `durable` storage mode a send is acknowledged only after
/// fdatasync, so after a crash every acknowledged message, stream, topic and stored offset is
/// still there, and new sends continue the offsets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_recovery_keeps_every_acknowledged_write() {
    let seed: u64 = rand::random();
    eprintln!("crash seed = {seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = temp_dir();
    let args = ["--segment-size-bytes", "8192"];

    let server = TestServer::start_with(dir.path(), &args, &[]);
    let client = root_client(server.addr()).await;
    let mut st = populate(&client, &mut rng).await;
    let (alpha, t3) = (st.streams[0].id, st.streams[0].topics[0].id);
    client
        .flush_unsaved_buffer(&id_num(alpha), &id_num(t3), 0, true)
        .await
        .expect("flush_unsaved_buffer with fsync");
    verify(&client, &mut st).await;
    drop(client);
    server.kill();

    let server = TestServer::start_with(dir.path(), &args, &[]);
    let client = root_client(server.addr()).await;
    verify(&client, &mut st).await;
    for si in 0..st.streams.len() {
        for ti in 0..st.streams[si].topics.len() {
            for p in 0..st.streams[si].topics[ti].partitions.len() {
                send_to(&client, &mut rng, &mut st, si, ti, p as u32, 1).await;
            }
        }
    }
    verify(&client, &mut st).await;
    next_with_auto_commit_walks_each_message_once(&client, &st).await;
    drop(client);
    // A crash right after recovery, then a clean cycle: every restart continues the offsets
    // with no gap and no offset handed out twice.
    server.kill();
    let server = TestServer::start_with(dir.path(), &args, &[]);
    let client = root_client(server.addr()).await;
    verify(&client, &mut st).await;
    drop(client);
    server.stop();
    for _ in 0..2 {
        let server = TestServer::start_with(dir.path(), &args, &[]);
        let client = root_client(server.addr()).await;
        verify(&client, &mut st).await;
        for si in 0..st.streams.len() {
            for ti in 0..st.streams[si].topics.len() {
                for p in 0..st.streams[si].topics[ti].partitions.len() {
                    send_to(&client, &mut rng, &mut st, si, ti, p as u32, 1).await;
                }
            }
        }
        verify(&client, &mut st).await;
        drop(client);
        server.stop();
    }
}

/// A Next + auto-commit walk over every partition with small pages, so pages span crashes
/// and segment boundaries: every message is returned exactly once, in offset order.
async fn next_with_auto_commit_walks_each_message_once(client: &IggyClient, st: &State) {
    let consumer = Consumer::new(id_num(424_242));
    for s in &st.streams {
        for t in &s.topics {
            for (p, msgs) in t.partitions.iter().enumerate() {
                let want: Vec<u64> = msgs.iter().map(|m| m.offset).collect();
                let mut got = Vec::new();
                // Bounded: each round returns at least one message until the end.
                for _ in 0..=want.len() {
                    let polled = client
                        .poll_messages(
                            &id_num(s.id),
                            &id_num(t.id),
                            Some(p as u32),
                            &consumer,
                            &PollingStrategy::next(),
                            3,
                            true,
                        )
                        .await
                        .expect("poll next");
                    if polled.messages.is_empty() {
                        break;
                    }
                    got.extend(polled.messages.iter().map(|m| m.header.offset));
                }
                assert_eq!(got, want, "{}/{}/{p}: Next + auto-commit walk", s.name, t.name);
            }
        }
    }
}

/// SIGTERM while a producer is sending: the server still exits 0, and after a restart every
/// acknowledged batch is there, in order, with contiguous offsets (at most the one batch in
/// flight at the stop may additionally be present).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_keeps_acknowledged_batches() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    const PER_BATCH: usize = 20;
    let dir = temp_dir();
    let mut server = TestServer::start(dir.path());
    let addr = server.addr();
    let setup = root_client(addr).await;
    let (s, t) = create_stream_topic(&setup, "load", "t", 1).await;
    drop(setup);

    let acked = Arc::new(AtomicUsize::new(0));
    let acked_in_task = acked.clone();
    let sender = tokio::spawn(async move {
        let client = root_client(addr).await;
        // Bounded: stops at the first failure (the server going away) or after 100 000 batches.
        for b in 0..100_000usize {
            let mut msgs: Vec<IggyMessage> = (0..PER_BATCH)
                .map(|i| {
                    let n = b * PER_BATCH + i;
                    sdk_message(n as u128 + 1, format!("load-{n}").into_bytes())
                })
                .collect();
            let sent = tokio::time::timeout(
                std::time::Duration::from_secs(30),
                client.send_messages(&id_num(s), &id_num(t), &Partitioning::partition_id(0), &mut msgs),
            )
            .await;
            match sent {
                Ok(Ok(_)) => {
                    acked_in_task.store(b + 1, Ordering::SeqCst);
                }
                _ => break,
            }
        }
    });
    // Wait (bounded) until a good number of batches has been acknowledged.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while acked.load(Ordering::SeqCst) < 50 {
        assert!(std::time::Instant::now() < deadline, "producer made no progress");
        assert!(!sender.is_finished(), "producer stopped early");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let status = server.terminate();
    assert!(
        status.success(),
        "exit status under load: {status:?}\n{}",
        server.logs()
    );
    tokio::time::timeout(std::time::Duration::from_secs(60), sender)
        .await
        .expect("producer did not notice the stop")
        .expect("producer task");
    let acked_batches = acked.load(Ordering::SeqCst);

    let server = TestServer::start(dir.path());
    let client = root_client(server.addr()).await;
    let all = poll_all(&client, s, t, 0, 1000, (acked_batches + 1) * PER_BATCH).await;
    assert!(
        all.len() == acked_batches * PER_BATCH || all.len() == (acked_batches + 1) * PER_BATCH,
        "stored {} messages, acknowledged {} (± the batch in flight)",
        all.len(),
        acked_batches * PER_BATCH
    );
    for (i, m) in all.iter().enumerate() {
        assert_eq!(m.header.offset, i as u64);
        assert_eq!(m.header.id, i as u128 + 1);
        assert_eq!(m.payload.as_ref(), format!("load-{i}").as_bytes());
    }
    drop(client);
    server.stop();
}
