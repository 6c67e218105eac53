//! Acceptance 5: purged messages never come back, after a clean purge and a crash, and after
//! a crash in the middle of a purge (the topic-level marker in the metadata is finished at
//! boot). Offsets keep counting after a purge (an offset is never handed out twice) and stored
//! consumer offsets are cleared.

mod common;

use common::*;
use iggy::prelude::*;
use std::time::Duration;

const PAYLOAD_BYTES: usize = 64;
const CONSUMER: u32 = 42;

async fn send_n(client: &IggyClient, s: u32, t: u32, p: u32, first_id: u128, n: u128) {
    let batch: Vec<(u128, Vec<u8>)> = (first_id..first_id + n)
        .map(|id| (id, payload_for(id, PAYLOAD_BYTES)))
        .collect();
    send_batch(client, s, t, p, &batch).await.expect("send");
}

/// Fill `partitions` partitions of (s, t) with `per_partition` messages each (small segments
/// so several exist), and store consumer CONSUMER's offset in the middle of each.
async fn fill(
    client: &IggyClient,
    s: u32,
    t: u32,
    partitions: u32,
    per_partition: u128,
    first_id: u128,
) -> u128 {
    let mut id = first_id;
    for p in 0..partitions {
        for _ in 0..per_partition / 10 {
            send_n(client, s, t, p, id, 10).await;
            id += 10;
        }
        client
            .store_consumer_offset(
                &Consumer::new(id_num(CONSUMER)),
                &id_num(s),
                &id_num(t),
                Some(p),
                (per_partition / 2) as u64,
            )
            .await
            .expect("store_consumer_offset");
    }
    id
}

/// Every way of reading a partition returns nothing below `purged_below`, and the messages
/// it returns are exactly the `expected` ids, in order.
async fn assert_nothing_purged_returns(
    client: &IggyClient,
    s: u32,
    t: u32,
    p: u32,
    purged_below: u64,
    expected: &[u128],
) {
    let strategies = [
        PollingStrategy::offset(0),
        PollingStrategy::timestamp(0.into()),
        PollingStrategy::first(),
    ];
    for strategy in strategies {
        let polled = poll_from(client, s, t, p, strategy, 10_000).await.expect("poll");
        let offsets: Vec<u64> = polled.messages.iter().map(|m| m.header.offset).collect();
        assert!(
            offsets.iter().all(|&o| o >= purged_below),
            "partition {p}: {strategy:?} returned purged offsets {offsets:?}"
        );
        let ids: Vec<u128> = polled.messages.iter().map(|m| m.header.id).collect();
        assert_eq!(ids, expected, "partition {p}: {strategy:?}");
    }
    // Next with the consumer whose offset was stored before the purge.
    let polled = client
        .poll_messages(
            &id_num(s),
            &id_num(t),
            Some(p),
            &Consumer::new(id_num(CONSUMER)),
            &PollingStrategy::next(),
            10_000,
            false,
        )
        .await
        .expect("poll next");
    let ids: Vec<u128> = polled.messages.iter().map(|m| m.header.id).collect();
    assert_eq!(ids, expected, "partition {p}: Next");
}

async fn stored_offset(client: &IggyClient, s: u32, t: u32, p: u32) -> Option<u64> {
    client
        .get_consumer_offset(&Consumer::new(id_num(CONSUMER)), &id_num(s), &id_num(t), Some(p))
        .await
        .expect("get_consumer_offset")
        .map(|info| info.stored_offset)
}

fn args() -> Vec<&'static str> {
    vec!["--segment-size-bytes", "4096"]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purged_messages_never_come_back_after_a_crash() {
    let dir = temp_dir();
    let server = TestServer::start_with(dir.path(), &args(), &[]);
    let client = root_client(server.addr()).await;
    let (s, t1) = create_stream_topic(&client, "purge", "t1", 2).await;
    let t2 = client
        .create_topic(&id_num(s), "t2", &topic_opts(1))
        .await
        .expect("create_topic")
        .id;
    let id = fill(&client, s, t1, 2, 100, 1).await;
    let id = fill(&client, s, t2, 1, 100, id).await;

    client
        .purge_topic(&id_num(s), &id_num(t1))
        .await
        .expect("purge_topic");
    for p in 0..2 {
        assert_nothing_purged_returns(&client, s, t1, p, 100, &[]).await;
        assert_eq!(
            stored_offset(&client, s, t1, p).await,
            None,
            "purge clears stored offsets"
        );
    }
    // t2 was not purged.
    assert_eq!(poll_all(&client, s, t2, 0, 1000, 1000).await.len(), 100);
    assert_eq!(stored_offset(&client, s, t2, 0).await, Some(50));

    // New messages continue the numbering: offsets are never handed out twice.
    send_n(&client, s, t1, 0, id, 5).await;
    let polled = poll_from(&client, s, t1, 0, PollingStrategy::offset(0), 100)
        .await
        .unwrap();
    assert_eq!(
        polled
            .messages
            .iter()
            .map(|m| m.header.offset)
            .collect::<Vec<_>>(),
        (100..105).collect::<Vec<u64>>()
    );
    let new_ids: Vec<u128> = (id..id + 5).collect();
    let id = id + 5;

    server.kill();
    let server = TestServer::start_with(dir.path(), &args(), &[]);
    let client = root_client(server.addr()).await;
    assert_nothing_purged_returns(&client, s, t1, 0, 100, &new_ids).await;
    assert_nothing_purged_returns(&client, s, t1, 1, 100, &[]).await;

    // Purge the whole stream, crash, restart.
    client.purge_stream(&id_num(s)).await.expect("purge_stream");
    server.kill();
    let server = TestServer::start_with(dir.path(), &args(), &[]);
    let client = root_client(server.addr()).await;
    for (t, p) in [(t1, 0), (t1, 1), (t2, 0)] {
        assert_nothing_purged_returns(&client, s, t, p, 100, &[]).await;
        assert_eq!(stored_offset(&client, s, t, p).await, None);
    }
    // After the crash the numbering resumes above everything ever handed out.
    send_n(&client, s, t2, 0, id, 3).await;
    let polled = poll_from(&client, s, t2, 0, PollingStrategy::first(), 100)
        .await
        .unwrap();
    assert_eq!(polled.messages.len(), 3);
    assert!(polled.messages[0].header.offset >= 100);
    server.stop();
}

/// A crash right after the purge marker reached the metadata (before any partition was
/// purged), and one after the first partition was purged: the boot finishes the purge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_mid_purge_is_finished_at_boot() {
    for crash_point in ["purge-after-marker", "purge-after-first-partition"] {
        let dir = temp_dir();
        let env = [("CAIRN_TEST_CRASH_AT", crash_point)];
        let mut server = TestServer::start_with(dir.path(), &args(), &env);
        let client = root_client(server.addr()).await;
        let (s, t) = create_stream_topic(&client, "crash", "t", 3).await;
        let id = fill(&client, s, t, 3, 60, 1).await;
        let purge = tokio::time::timeout(
            Duration::from_secs(30),
            client.purge_topic(&id_num(s), &id_num(t)),
        )
        .await;
        assert!(
            !matches!(purge, Ok(Ok(()))),
            "{crash_point}: the purge was acknowledged although the server aborted"
        );
        // The process is gone (aborted at the hook).
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while server.is_running() {
            assert!(
                std::time::Instant::now() < deadline,
                "{crash_point}: server did not abort"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // It aborted at the hook, not elsewhere (stderr is drained by another thread).
        while !server
            .logs()
            .contains(&format!("CAIRN_TEST_CRASH_AT={crash_point}"))
        {
            assert!(
                std::time::Instant::now() < deadline,
                "{crash_point}: no hook message:\n{}",
                server.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        server.kill();

        // `cairn check` tells what the next start will do: finish the purge.
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
            .arg("check")
            .arg(dir.path())
            .output()
            .expect("run cairn check");
        let report = String::from_utf8_lossy(&out.stdout);
        assert!(
            !out.status.success(),
            "{crash_point}: check must not say healthy:\n{report}"
        );
        assert!(
            report.contains("finish a purge recorded in the metadata") && !report.contains("DAMAGED"),
            "{crash_point}:\n{report}"
        );

        let server = TestServer::start_with(dir.path(), &args(), &[]);
        // Logged at boot, before readiness; stderr is read by another thread, so wait for it.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !server.logs().contains("finishing an interrupted purge") {
            assert!(
                std::time::Instant::now() < deadline,
                "{crash_point}: boot did not finish the purge:\n{}",
                server.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let client = root_client(server.addr()).await;
        for p in 0..3 {
            assert_nothing_purged_returns(&client, s, t, p, 60, &[]).await;
            assert_eq!(stored_offset(&client, s, t, p).await, None, "{crash_point}");
        }
        send_n(&client, s, t, 2, id, 2).await;
        let polled = poll_from(&client, s, t, 2, PollingStrategy::offset(0), 10)
            .await
            .unwrap();
        assert_eq!(polled.messages.len(), 2);
        assert!(polled.messages[0].header.offset >= 60, "{crash_point}");
        server.stop();
    }
}
