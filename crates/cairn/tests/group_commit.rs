//! Group commit: many concurrent SDK clients sending to ONE partition share data barriers,
//! every message comes back exactly once at contiguous offsets, and the server's own counters
//! (logged at clean stop) show more than one send per barrier. Also: relaxed durability keeps
//! every acknowledged message across a process crash (SIGKILL).

mod common;

use common::*;
use iggy::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

const CLIENTS: u32 = 16;
const SENDS_PER_CLIENT: u32 = 40;
const SEND_TIMEOUT: Duration = Duration::from_secs(60);

/// Message id: client in the high bits, send and position below, so each id is unique and
/// names its sender.
fn message_id(client: u32, send: u32, position: u32) -> u128 {
    (u128::from(client) << 64) | (u128::from(send) << 32) | u128::from(position) | (1 << 120)
}

fn payload(id: u128) -> Vec<u8> {
    let len = (id % 97) as usize + 1;
    (0..len).map(|i| (id as usize).wrapping_add(i) as u8).collect()
}

/// Send from `CLIENTS` clients at once (each in lockstep, 1..=3 messages per send) to partition
/// 0. Returns the ids each client sent, in its send order.
async fn send_concurrently(server: &TestServer, stream: u32, topic: u32) -> Vec<Vec<u128>> {
    // Every client logs in first (argon2 is slow); the barrier then releases them together so
    // their sends really overlap.
    let start = Arc::new(tokio::sync::Barrier::new(CLIENTS as usize));
    let mut tasks = tokio::task::JoinSet::new();
    for client_index in 0..CLIENTS {
        let addr = server.addr();
        let start = start.clone();
        tasks.spawn(async move {
            let client = root_client(addr).await;
            start.wait().await;
            let mut sent = Vec::new();
            for send in 0..SENDS_PER_CLIENT {
                let count = send % 3 + 1;
                let ids: Vec<u128> = (0..count).map(|p| message_id(client_index, send, p)).collect();
                let mut messages: Vec<IggyMessage> =
                    ids.iter().map(|&id| sdk_message(id, payload(id))).collect();
                tokio::time::timeout(
                    SEND_TIMEOUT,
                    client.send_messages(
                        &id_num(stream),
                        &id_num(topic),
                        &Partitioning::partition_id(0),
                        &mut messages,
                    ),
                )
                .await
                .expect("send timed out")
                .unwrap_or_else(|e| panic!("client {client_index} send {send} failed: {e}"));
                sent.extend(ids);
            }
            (client_index, sent)
        });
    }
    let mut by_client = vec![Vec::new(); CLIENTS as usize];
    while let Some(joined) = tasks.join_next().await {
        let (client_index, sent) = joined.expect("client task panicked");
        by_client[client_index as usize] = sent;
    }
    by_client
}

/// Poll partition 0 and check: offsets 0..n contiguous, no duplicate, exactly the ids sent,
/// identical payloads, and each client's messages in its own send order.
async fn check_partition(client: &IggyClient, stream: u32, topic: u32, by_client: &[Vec<u128>]) {
    let expected_total: usize = by_client.iter().map(Vec::len).sum();
    let polled = poll_all(client, stream, topic, 0, 500, expected_total).await;
    assert_eq!(polled.len(), expected_total, "every acknowledged message is back");
    let mut seen = BTreeSet::new();
    let mut offset_of: BTreeMap<u128, u64> = BTreeMap::new();
    for (position, message) in polled.iter().enumerate() {
        assert_eq!(
            message.header.offset, position as u64,
            "offsets are contiguous from 0"
        );
        let id = message.header.id;
        assert!(seen.insert(id), "message {id:#x} returned twice");
        assert_eq!(
            message.payload.as_ref(),
            payload(id).as_slice(),
            "payload of {id:#x}"
        );
        offset_of.insert(id, message.header.offset);
    }
    for (client_index, ids) in by_client.iter().enumerate() {
        let offsets: Vec<u64> = ids
            .iter()
            .map(|id| {
                *offset_of
                    .get(id)
                    .unwrap_or_else(|| panic!("client {client_index}: message {id:#x} missing"))
            })
            .collect();
        assert!(
            offsets.windows(2).all(|pair| pair[0] < pair[1]),
            "client {client_index}: its messages are stored in its send order"
        );
    }
}

/// The numbers of the `group commit totals:` line the server logs at clean stop.
fn logged_totals(logs: &str) -> (u64, u64) {
    let line = logs
        .lines()
        .rev()
        .find(|line| line.contains("group commit totals:") && !line.contains("of the partition"))
        .unwrap_or_else(|| panic!("no group commit totals line in the server log:\n{logs}"));
    let field = |name: &str| -> u64 {
        let start = line
            .find(&format!(" {name}="))
            .unwrap_or_else(|| panic!("no {name}= in {line:?}"))
            + name.len()
            + 2;
        line[start..]
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .and_then(|digits| digits.parse().ok())
            .unwrap_or_else(|| panic!("{name}= is not a number in {line:?}"))
    };
    (field("barriers"), field("sends"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_sends_share_barriers_and_keep_offsets_contiguous() {
    let dir = temp_dir();
    let mut server = TestServer::start(dir.path());
    let admin = root_client(server.addr()).await;
    let (stream, topic) = create_stream_topic(&admin, "group-commit", "one-partition", 1).await;

    let by_client = send_concurrently(&server, stream, topic).await;
    check_partition(&admin, stream, topic, &by_client).await;

    // The counters are logged at clean stop; read them after the process exited.
    let status = server.terminate();
    assert!(
        status.success(),
        "clean stop failed: {status:?}\n{}",
        server.logs()
    );
    let (barriers, sends) = logged_totals(&server.logs());
    let sends_expected = u64::from(CLIENTS * SENDS_PER_CLIENT);
    assert_eq!(sends, sends_expected, "every send was acknowledged exactly once");
    assert!(barriers >= 1, "durable mode issued barriers");
    assert!(
        barriers < sends,
        "{CLIENTS} concurrent clients shared barriers: {sends} sends, {barriers} barriers"
    );

    // Across a restart the same messages are back, still contiguous.
    let server = TestServer::start(dir.path());
    let admin = root_client(server.addr()).await;
    check_partition(&admin, stream, topic, &by_client).await;
    server.stop();
}

/// Send one message to partition 0 and return the offset it got (read back by polling).
async fn send_one_and_read_its_offset(
    client: &IggyClient,
    stream: u32,
    topic: u32,
    id: u128,
    expected_total: usize,
) -> u64 {
    let mut messages = vec![sdk_message(id, payload(id))];
    client
        .send_messages(
            &id_num(stream),
            &id_num(topic),
            &Partitioning::partition_id(0),
            &mut messages,
        )
        .await
        .expect("send after the restart");
    let polled = poll_all(client, stream, topic, 0, 500, expected_total).await;
    polled
        .iter()
        .find(|message| message.header.id == id)
        .unwrap_or_else(|| panic!("message {id:#x} not found after its send"))
        .header
        .offset
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relaxed_mode_keeps_acknowledged_messages_across_a_process_crash() {
    let dir = temp_dir();
    // No flush runs within the test: every acknowledged op is only in the page cache when
    // the process is killed.
    let args = [
        "--durability",
        "relaxed",
        "--set",
        "storage.flush_interval_ms=3600000",
    ];
    let server = TestServer::start_with(dir.path(), &args, &[]);
    assert!(
        server
            .logs()
            .contains("storage.durability = relaxed: sends are acknowledged once written, before a barrier"),
        "no start-up warning for relaxed mode:\n{}",
        server.logs()
    );
    let admin = root_client(server.addr()).await;
    let (stream, topic) = create_stream_topic(&admin, "relaxed", "one-partition", 1).await;

    let by_client = send_concurrently(&server, stream, topic).await;
    check_partition(&admin, stream, topic, &by_client).await;
    let sent: usize = by_client.iter().map(Vec::len).sum();

    // SIGKILL: the acknowledged ops were never synced, but the page cache keeps them and the
    // start keeps every whole op above the durable frontier.
    server.kill();
    let mut server = TestServer::start_with(dir.path(), &args, &[]);
    assert!(
        server
            .logs()
            .contains("kept the whole ops written above the journal's durable frontier"),
        "the start did not keep the unsynced ops:\n{}",
        server.logs()
    );
    let admin = root_client(server.addr()).await;
    check_partition(&admin, stream, topic, &by_client).await;
    // After an unclean stop minting resumes above the durable reservation: offsets that may
    // have been acknowledged and lost with a power loss are never handed out again.
    let after_kill = send_one_and_read_its_offset(&admin, stream, topic, 1 << 121, sent + 1).await;
    assert!(
        after_kill > sent as u64,
        "the first offset after the kill ({after_kill}) skips past the reservation, above every acknowledged offset"
    );
    assert!(
        server
            .logs()
            .contains("offsets skipped after an unclean stop in relaxed mode"),
        "no log line for the skip:\n{}",
        server.logs()
    );

    // A clean stop gives the reservation back: the next start skips nothing.
    let status = server.terminate();
    assert!(
        status.success(),
        "clean stop failed: {status:?}\n{}",
        server.logs()
    );
    let server = TestServer::start_with(dir.path(), &args, &[]);
    let admin = root_client(server.addr()).await;
    check_partition_prefix(&admin, stream, topic, &by_client).await;
    let after_stop = send_one_and_read_its_offset(&admin, stream, topic, 1 << 122, sent + 2).await;
    assert_eq!(after_stop, after_kill + 1, "no gap after a clean stop");
    server.stop();
}

/// [`check_partition`] of the first messages only (one more was sent after a gap).
async fn check_partition_prefix(client: &IggyClient, stream: u32, topic: u32, by_client: &[Vec<u128>]) {
    let expected_total: usize = by_client.iter().map(Vec::len).sum();
    let polled = poll_all(client, stream, topic, 0, 500, expected_total + 1).await;
    assert!(polled.len() >= expected_total);
    for (position, message) in polled.iter().take(expected_total).enumerate() {
        assert_eq!(
            message.header.offset, position as u64,
            "offsets are contiguous from 0"
        );
        assert_eq!(message.payload.as_ref(), payload(message.header.id).as_slice());
    }
}
