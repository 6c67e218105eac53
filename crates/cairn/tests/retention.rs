//! Acceptance 4 (retention) and GetStats: message_expiry and max_topic_size delete whole
//! sealed segments on schedule while traffic runs, DeleteSegments removes exactly the oldest
//! sealed segments, polls below the retained start begin at the first retained message, and
//! GetStats / GetTopic report true counts and sizes. Every clean stop runs `cairn check`.

mod common;

use common::*;
use iggy::prelude::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const SEGMENT_BYTES: u64 = 4096;
const PAYLOAD_BYTES: usize = 200;

fn retention_args() -> Vec<&'static str> {
    vec![
        "--segment-size-bytes",
        "4096",
        "--set",
        "storage.retention_interval_ms=100",
    ]
}

async fn get_topic(client: &IggyClient, s: u32, t: u32) -> TopicDetails {
    client
        .get_topic(&id_num(s), &id_num(t))
        .await
        .expect("get_topic")
        .expect("topic exists")
}

/// Wait (bounded) until `condition` holds for the topic's details; returns them.
async fn wait_topic(
    client: &IggyClient,
    s: u32,
    t: u32,
    what: &str,
    timeout: Duration,
    condition: impl Fn(&TopicDetails) -> bool,
) -> TopicDetails {
    let deadline = Instant::now() + timeout;
    loop {
        let topic = get_topic(client, s, t).await;
        if condition(&topic) {
            return topic;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {topic:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The offset of the first message a poll from offset 0 returns.
async fn first_polled_offset(client: &IggyClient, s: u32, t: u32, p: u32) -> Option<u64> {
    poll_from(client, s, t, p, PollingStrategy::offset(0), 1)
        .await
        .expect("poll from 0")
        .messages
        .first()
        .map(|m| m.header.offset)
}

async fn send_n(client: &IggyClient, s: u32, t: u32, p: u32, first_id: u128, n: u128) {
    let batch: Vec<(u128, Vec<u8>)> = (first_id..first_id + n)
        .map(|id| (id, payload_for(id, PAYLOAD_BYTES)))
        .collect();
    send_batch(client, s, t, p, &batch).await.expect("send");
}

/// Expiry while a producer and a consumer keep running: old segments disappear, the consumer
/// never sees an offset twice, and afterwards a poll by offset 0 starts at the first
/// retained message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_expiry_deletes_old_segments_while_traffic_runs() {
    let dir = temp_dir();
    let server = TestServer::start_with(dir.path(), &retention_args(), &[]);
    let client = Arc::new(root_client(server.addr()).await);
    let s = client.create_stream("ret").await.expect("create_stream").id;
    let options = TopicCreateOptions {
        partitions_count: Some(1),
        message_expiry: Some(IggyExpiry::ExpireDuration(IggyDuration::from(
            Duration::from_secs(2),
        ))),
        ..Default::default()
    };
    let t = client
        .create_topic(&id_num(s), "expiring", &options)
        .await
        .expect("create_topic")
        .id;

    let producing = Arc::new(AtomicBool::new(true));
    // Set by the producer once its last send is acknowledged: the flag above only asks it to
    // stop, and a send may still be in flight when it is cleared.
    let produced_all = Arc::new(AtomicBool::new(false));
    let producer = {
        let client = client.clone();
        let producing = producing.clone();
        let produced_all = produced_all.clone();
        tokio::spawn(async move {
            let mut id = 1u128;
            // Bounded: at most 4000 batches (~30 s at the pace below).
            for _ in 0..4_000 {
                if !producing.load(Ordering::Relaxed) {
                    break;
                }
                send_n(&client, s, t, 0, id, 4).await;
                id += 4;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            produced_all.store(true, Ordering::Release);
            id - 1
        })
    };
    let consumer = {
        let addr = server.addr();
        let produced_all = produced_all.clone();
        tokio::spawn(async move {
            let client = root_client(addr).await;
            let consumer = Consumer::new(id_num(42));
            let mut seen: Vec<u64> = Vec::new();
            // Bounded by time: polls may be much faster than sends.
            let deadline = Instant::now() + Duration::from_secs(60);
            while Instant::now() < deadline {
                // Read before the poll: a poll that starts after the last send was
                // acknowledged sees it (polls serve everything acknowledged).
                let producer_finished = produced_all.load(Ordering::Acquire);
                let polled = client
                    .poll_messages(
                        &id_num(s),
                        &id_num(t),
                        Some(0),
                        &consumer,
                        &PollingStrategy::next(),
                        50,
                        true,
                    )
                    .await
                    .expect("consumer poll");
                seen.extend(polled.messages.iter().map(|m| m.header.offset));
                if polled.messages.is_empty() {
                    // Nothing new after the last acknowledged send: the consumer is at the end.
                    if producer_finished {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
            seen
        })
    };

    // Segments older than the expiry disappear while the producer keeps writing.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(first) = first_polled_offset(&client, s, t, 0).await
            && first > 0
        {
            break;
        }
        assert!(Instant::now() < deadline, "no segment expired within 30 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Keep producing past one more expiry period, then stop.
    tokio::time::sleep(Duration::from_millis(500)).await;
    producing.store(false, Ordering::Relaxed);
    let last_id = producer.await.expect("producer");
    let seen = consumer.await.expect("consumer");
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "consumer saw offsets out of order or twice"
    );
    assert_eq!(
        seen.last().copied(),
        Some(last_id as u64 - 1),
        "consumer reached the end"
    );

    // With no more writes, every sealed segment expires; the one holding the newest
    // messages stays (and the segments of later ops alone, such as the trims themselves).
    let pdir = partition_dir(dir.path(), s, t, 0);
    let topic = wait_topic(
        &client,
        s,
        t,
        "only the newest messages' segment left",
        Duration::from_secs(20),
        |_| message_segments(&pdir).len() == 1,
    )
    .await;
    let first = first_polled_offset(&client, s, t, 0)
        .await
        .expect("the active segment holds messages");
    assert!(first > 0);
    let retained = poll_all(&client, s, t, 0, 1000, 100_000).await;
    assert_eq!(retained.first().map(|m| m.header.offset), Some(first));
    assert_eq!(retained.last().map(|m| m.header.offset), Some(last_id as u64 - 1));
    for (i, m) in retained.iter().enumerate() {
        assert_eq!(
            m.header.offset,
            first + i as u64,
            "retained offsets are contiguous"
        );
        assert_eq!(
            m.payload.to_vec(),
            payload_for(m.header.offset as u128 + 1, PAYLOAD_BYTES)
        );
    }
    assert_eq!(topic.messages_count, retained.len() as u64);
    assert_eq!(topic.partitions[0].messages_count, retained.len() as u64);
    // Timestamp 0 and First begin at the first retained message too.
    for strategy in [PollingStrategy::timestamp(0.into()), PollingStrategy::first()] {
        let polled = poll_from(&client, s, t, 0, strategy, 1).await.expect("poll");
        assert_eq!(polled.messages[0].header.offset, first);
    }
    assert!(server.logs().contains("deleted segment"), "deletions are logged");
    server.stop();
}

/// max_topic_size: the oldest sealed segments go until the topic is within the limit plus
/// its active segments.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_topic_size_keeps_the_topic_within_the_limit() {
    let dir = temp_dir();
    let server = TestServer::start_with(dir.path(), &retention_args(), &[]);
    let client = root_client(server.addr()).await;
    let s = client.create_stream("size").await.expect("create_stream").id;
    const LIMIT: u64 = 20_000;
    let options = TopicCreateOptions {
        partitions_count: Some(2),
        max_topic_size: Some(MaxTopicSize::Custom(IggyByteSize::from(LIMIT))),
        ..Default::default()
    };
    let t = client
        .create_topic(&id_num(s), "capped", &options)
        .await
        .expect("create_topic")
        .id;
    // What retention never deletes, per partition: the segment holding the newest messages
    // (a segment's worth plus one op), and after it at most one segment of later ops alone
    // (trims, offset stores: a segment's worth plus one small op).
    let active_bound = 2 * (2 * SEGMENT_BYTES + 4 * (PAYLOAD_BYTES as u64 + 200) + 1024);
    let pdir = |p: u32| partition_dir(dir.path(), s, t, p);
    let mut id = 1u128;
    for round in 0..200 {
        send_n(&client, s, t, round % 2, id, 4).await;
        id += 4;
    }
    let sent_bytes_bound = 200 * 4 * PAYLOAD_BYTES as u64;
    assert!(
        sent_bytes_bound > 3 * LIMIT,
        "the test writes well past the limit"
    );
    // Wait for the steady state, not only for the bound: retention deletes while the topic is
    // above its limit and a sealed segment is left, so until then a pass may delete another
    // segment between the two polls below.
    let topic = wait_topic(
        &client,
        s,
        t,
        "the topic within its limit, with nothing left to delete",
        Duration::from_secs(20),
        |topic| {
            let size = topic.size.as_bytes_u64();
            size <= LIMIT + active_bound
                && (size <= LIMIT || (0..2).all(|p| message_segments(&pdir(p)).len() == 1))
        },
    )
    .await;
    assert!(topic.size.as_bytes_u64() > 0);
    for p in 0..2 {
        let first = first_polled_offset(&client, s, t, p)
            .await
            .expect("messages retained");
        assert!(first > 0, "partition {p} lost its oldest segments");
        let retained = poll_all(&client, s, t, p, 1000, 10_000).await;
        assert_eq!(retained.first().map(|m| m.header.offset), Some(first));
    }
    // Stays within the limit as more is written.
    for round in 0..100 {
        send_n(&client, s, t, round % 2, id, 4).await;
        id += 4;
    }
    wait_topic(
        &client,
        s,
        t,
        "the topic within its limit again",
        Duration::from_secs(20),
        |topic| topic.size.as_bytes_u64() <= LIMIT + active_bound,
    )
    .await;
    server.stop();
}

/// DeleteSegments removes exactly the oldest N sealed segments, and never the active one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_segments_removes_exactly_the_oldest_sealed_ones() {
    let dir = temp_dir();
    let server = TestServer::start_with(dir.path(), &retention_args(), &[]);
    let client = root_client(server.addr()).await;
    let (s, t) = create_stream_topic(&client, "del", "segs", 1).await;
    let mut id = 1u128;
    for _ in 0..60 {
        send_n(&client, s, t, 0, id, 4).await;
        id += 4;
    }
    let last_offset = id as u64 - 2;
    let pdir = partition_dir(dir.path(), s, t, 0);
    let before = message_segments(&pdir);
    assert!(before.len() >= 5, "{before:?}");
    let topic = get_topic(&client, s, t).await;
    assert_eq!(
        topic.partitions[0].segments_count as usize,
        segment_logs(&pdir).len()
    );
    let size_before = topic.size.as_bytes_u64();

    client
        .delete_segments(&id_num(s), &id_num(t), 0, 2)
        .await
        .expect("delete_segments");
    let after = message_segments(&pdir);
    assert_eq!(after, before[2..].to_vec());
    let topic = get_topic(&client, s, t).await;
    // (The trim is an op: it may start a segment of its own after the newest messages.)
    assert_eq!(
        topic.partitions[0].segments_count as usize,
        segment_logs(&pdir).len()
    );
    assert!(segment_logs(&pdir).len() < before.len());
    assert!(topic.size.as_bytes_u64() < size_before);
    assert_eq!(topic.messages_count, last_offset + 1 - before[2]);
    assert_eq!(topic.partitions[0].current_offset, last_offset);
    assert_eq!(first_polled_offset(&client, s, t, 0).await, Some(before[2]));

    // More than are sealed: all sealed ones go, the active one stays with its messages.
    client
        .delete_segments(&id_num(s), &id_num(t), 0, 1_000)
        .await
        .expect("delete_segments");
    let after = message_segments(&pdir);
    assert_eq!(after, vec![*before.last().unwrap()]);
    let segments_left = segment_logs(&pdir).len();
    assert!(
        segments_left <= 2,
        "the newest messages' segment, and perhaps the trims' own"
    );
    assert_eq!(
        get_topic(&client, s, t).await.partitions[0].segments_count as usize,
        segments_left
    );
    let retained = poll_all(&client, s, t, 0, 100, 1000).await;
    assert_eq!(retained.first().map(|m| m.header.offset), after.first().copied());
    assert_eq!(retained.last().map(|m| m.header.offset), Some(last_offset));
    // Nothing sealed: nothing to delete, still OK.
    client
        .delete_segments(&id_num(s), &id_num(t), 0, 1)
        .await
        .expect("delete_segments with no sealed segment");
    assert_eq!(
        segment_logs(&pdir).len(),
        segments_left,
        "nothing deleted, no op added"
    );
    // The partition keeps taking writes, offsets continue.
    send_n(&client, s, t, 0, id, 4).await;
    let retained = poll_all(&client, s, t, 0, 100, 1000).await;
    assert_eq!(retained.last().map(|m| m.header.offset), Some(last_offset + 4));
    // A consumer whose stored offset lies below the retained start continues at the first
    // retained message.
    let consumer = Consumer::new(id_num(9));
    client
        .store_consumer_offset(&consumer, &id_num(s), &id_num(t), Some(0), 3)
        .await
        .expect("store_consumer_offset");
    let polled = client
        .poll_messages(
            &id_num(s),
            &id_num(t),
            Some(0),
            &consumer,
            &PollingStrategy::next(),
            1,
            false,
        )
        .await
        .expect("poll next");
    assert_eq!(polled.messages[0].header.offset, after[0]);
    // A missing partition is an error.
    assert!(
        client
            .delete_segments(&id_num(s), &id_num(t), 7, 1)
            .await
            .is_err()
    );

    // Crash and restart: the retained start holds.
    server.kill();
    let server = TestServer::start_with(dir.path(), &retention_args(), &[]);
    let client = root_client(server.addr()).await;
    assert_eq!(
        first_polled_offset(&client, s, t, 0).await,
        after.first().copied()
    );
    server.stop();
}

/// GetStats and GetStream/GetTopic report true counts and sizes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_report_true_counts_and_sizes() {
    let dir = temp_dir();
    let server = TestServer::start_with(dir.path(), &retention_args(), &[]);
    let client = root_client(server.addr()).await;
    let (s, t) = create_stream_topic(&client, "st", "a", 2).await;
    let t2 = client
        .create_topic(&id_num(s), "b", &topic_opts(1))
        .await
        .expect("create_topic")
        .id;
    client
        .create_consumer_group(&id_num(s), &id_num(t), "g1")
        .await
        .expect("create_consumer_group");
    let mut id = 1u128;
    for _ in 0..30 {
        send_n(&client, s, t, 0, id, 5).await;
        id += 5;
    }
    send_n(&client, s, t, 1, id, 7).await;
    id += 7;
    send_n(&client, s, t2, 0, id, 3).await;
    let pdir = |topic: u32, p: u32| partition_dir(dir.path(), s, topic, p);
    let disk_bytes = |topic: u32, p: u32| -> u64 {
        segment_logs(&pdir(topic, p))
            .iter()
            .map(|(_, path)| std::fs::metadata(path).unwrap().len())
            .sum()
    };
    let segments =
        segment_logs(&pdir(t, 0)).len() + segment_logs(&pdir(t, 1)).len() + segment_logs(&pdir(t2, 0)).len();
    let total_bytes = disk_bytes(t, 0) + disk_bytes(t, 1) + disk_bytes(t2, 0);

    let topic = get_topic(&client, s, t).await;
    assert_eq!(topic.messages_count, 157);
    assert_eq!(topic.size.as_bytes_u64(), disk_bytes(t, 0) + disk_bytes(t, 1));
    assert_eq!(topic.partitions[0].messages_count, 150);
    assert_eq!(topic.partitions[1].messages_count, 7);
    let stream = client.get_stream(&id_num(s)).await.unwrap().unwrap();
    assert_eq!(stream.messages_count, 160);
    assert_eq!(stream.size.as_bytes_u64(), total_bytes);

    // Something was polled, so read bytes are counted.
    let polled = poll_from(&client, s, t, 0, PollingStrategy::offset(0), 10)
        .await
        .unwrap();
    assert_eq!(polled.messages.len(), 10);
    let stats = client.get_stats().await.expect("get_stats");
    assert_eq!(stats.streams_count, 1);
    assert_eq!(stats.topics_count, 2);
    assert_eq!(stats.partitions_count, 3);
    assert_eq!(stats.segments_count as usize, segments);
    assert_eq!(stats.messages_count, 160);
    assert_eq!(stats.messages_size_bytes.as_bytes_u64(), total_bytes);
    assert_eq!(stats.consumer_groups_count, 1);
    assert!(stats.clients_count >= 1);
    assert_eq!(stats.process_id, server.pid());
    assert!(stats.memory_usage.as_bytes_u64() > 0);
    assert!(stats.total_memory.as_bytes_u64() >= stats.memory_usage.as_bytes_u64());
    assert!(stats.available_memory.as_bytes_u64() > 0);
    assert!(stats.total_disk_space.as_bytes_u64() > 0);
    assert!(stats.free_disk_space.as_bytes_u64() > 0);
    assert!(stats.free_disk_space.as_bytes_u64() <= stats.total_disk_space.as_bytes_u64());
    assert!(stats.written_bytes.as_bytes_u64() >= 160 * PAYLOAD_BYTES as u64);
    assert!(stats.read_bytes.as_bytes_u64() >= 10 * PAYLOAD_BYTES as u64);
    assert!(stats.start_time.as_micros() > 0);
    server.stop();
}

/// A topic's own options apply: with 1 MiB segments (the server's default is 1 GiB), a 2 s
/// expiry and a size cap, its partitions rotate at 1 MiB and retention finds sealed
/// segments to delete, while a topic created without a segment size keeps the server's.
/// The options show in topic details, and a restart keeps them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_topic_segment_size_expiry_and_size_cap_apply() {
    const MIB: u64 = 1024 * 1024;
    let dir = temp_dir();
    let args = ["--set", "storage.retention_interval_ms=100"];
    let server = TestServer::start_with(dir.path(), &args, &[]);
    let client = root_client(server.addr()).await;
    let s = client.create_stream("options").await.expect("create_stream").id;
    let topic_with = |expiry: IggyExpiry, cap: MaxTopicSize| TopicCreateOptions {
        partitions_count: Some(1),
        segment_size: Some(IggyByteSize::from(MIB)),
        message_expiry: Some(expiry),
        max_topic_size: Some(cap),
        ..Default::default()
    };
    let expiring = client
        .create_topic(
            &id_num(s),
            "expiring",
            &topic_with(
                IggyExpiry::ExpireDuration(IggyDuration::from(Duration::from_secs(2))),
                MaxTopicSize::Unlimited,
            ),
        )
        .await
        .expect("create expiring topic");
    let capped = client
        .create_topic(
            &id_num(s),
            "capped",
            &topic_with(
                IggyExpiry::NeverExpire,
                MaxTopicSize::Custom(IggyByteSize::from(3 * MIB)),
            ),
        )
        .await
        .expect("create capped topic");
    let plain = client
        .create_topic(&id_num(s), "plain", &topic_opts(1))
        .await
        .expect("create plain topic")
        .id;
    assert_eq!(
        expiring.message_expiry,
        IggyExpiry::ExpireDuration(IggyDuration::from(Duration::from_secs(2)))
    );
    assert_eq!(
        capped.max_topic_size,
        MaxTopicSize::Custom(IggyByteSize::from(3 * MIB))
    );

    // 8 MiB into each: 32 batches of 16 messages of 16 KiB.
    let payload = 16 * 1024;
    // Batch `batch`: 16 messages of 16 KiB with ids that continue from the batch before.
    let sixteen = |batch: u128| -> Vec<(u128, Vec<u8>)> {
        (0..16u128)
            .map(|i| {
                let id = batch * 16 + i + 1;
                (id, payload_for(id, payload))
            })
            .collect()
    };
    for batch in 0..32u128 {
        let messages = sixteen(batch);
        for t in [expiring.id, capped.id, plain] {
            send_batch(&client, s, t, 0, &messages).await.expect("send");
        }
    }
    assert_eq!(
        get_topic(&client, s, plain).await.partitions[0].segments_count,
        1,
        "a topic without its own segment size uses the server's (1 GiB)"
    );
    // The cap leaves at most 3 MiB of sealed segments plus the active one, oldest first.
    let capped_now = wait_topic(
        &client,
        s,
        capped.id,
        "the size cap deleting old segments",
        Duration::from_secs(20),
        |topic| topic.size.as_bytes_u64() <= 4 * MIB,
    )
    .await;
    assert!(capped_now.partitions[0].segments_count >= 3, "{capped_now:?}");
    assert!(
        first_polled_offset(&client, s, capped.id, 0)
            .await
            .expect("retained")
            > 0
    );
    // Expiry: every sealed segment goes once its newest message is 2 s old.
    wait_topic(
        &client,
        s,
        expiring.id,
        "every sealed segment expiring",
        Duration::from_secs(20),
        |topic| {
            message_segments(&partition_dir(dir.path(), s, expiring.id, 0)).len() == 1
                && topic.size.as_bytes_u64() <= 2 * MIB
        },
    )
    .await;

    server.stop();
    let server = TestServer::start_with(dir.path(), &args, &[]);
    let client = root_client(server.addr()).await;
    let capped_after = get_topic(&client, s, capped.id).await;
    assert_eq!(
        capped_after.max_topic_size,
        MaxTopicSize::Custom(IggyByteSize::from(3 * MIB))
    );
    // The segment size survived the restart: 4 MiB more still rotate at 1 MiB, so the cap
    // can bring the topic back under 4 MiB (one 1 GiB segment would hold all of it).
    for batch in 32..48u128 {
        send_batch(&client, s, capped.id, 0, &sixteen(batch))
            .await
            .expect("send");
    }
    wait_topic(
        &client,
        s,
        capped.id,
        "the size cap after a restart",
        Duration::from_secs(20),
        |topic| topic.size.as_bytes_u64() <= 4 * MIB && topic.partitions[0].segments_count >= 3,
    )
    .await;
    server.stop();
}
