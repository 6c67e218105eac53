//! Consumer groups: the catalog commands (602/600/601/603), membership (604/605/606), the
//! group poll fences (5006/5009), group offsets, and three SDK `IggyConsumer`s sharing a
//! 12-partition topic with every message consumed exactly once.

mod common;

use common::*;
use futures_util::StreamExt;
use iggy::prelude::*;
use std::collections::HashSet;
use std::time::Duration;

const GROUP_POLL: u32 = 100;
const JOIN: u32 = 604;
const LEAVE: u32 = 605;
const SYNC: u32 = 606;
const GET_GROUP: u32 = 600;
const STORE_OFFSET: u32 = 121;
const GET_OFFSET: u32 = 120;

fn group_target(stream: u32, topic: u32, group: u32) -> Vec<u8> {
    let mut b = enc::stream_topic(stream, topic);
    enc::id_num(&mut b, group);
    b
}

/// A PollMessages body for consumer kind 2 (group `group`), strategy Next.
fn group_poll(group: u32, stream: u32, topic: u32, partition: Option<u32>) -> Vec<u8> {
    let mut b = Vec::new();
    enc::consumer(&mut b, 2, group);
    enc::id_num(&mut b, stream);
    enc::id_num(&mut b, topic);
    enc::opt_part(&mut b, partition);
    b.push(5); // Next
    b.extend_from_slice(&0u64.to_le_bytes());
    b.extend_from_slice(&10u32.to_le_bytes());
    b.push(1); // auto_commit
    b
}

/// Decode a 606 reply: `None` for the empty (non-member) body.
fn sync_reply(payload: &[u8]) -> Option<(u64, Vec<u32>)> {
    if payload.is_empty() {
        return None;
    }
    assert!(payload.len() >= 12, "sync reply too short: {payload:?}");
    let generation = u64::from_le_bytes(payload[0..8].try_into().unwrap());
    let count = u32::from_le_bytes(payload[8..12].try_into().unwrap()) as usize;
    assert_eq!(payload.len(), 12 + 4 * count, "sync reply length");
    let partitions = (0..count)
        .map(|i| u32::from_le_bytes(payload[12 + 4 * i..16 + 4 * i].try_into().unwrap()))
        .collect();
    Some((generation, partitions))
}

async fn sync(conn: &mut RawConn, stream: u32, topic: u32, group: u32) -> Option<(u64, Vec<u32>)> {
    let f = conn.call(SYNC, &group_target(stream, topic, group)).await;
    sync_reply(f.ok_payload())
}

/// Create a stream and a topic through the SDK; returns their ids.
async fn stream_and_topic(client: &IggyClient, stream: &str, topic: &str, partitions: u32) -> (u32, u32) {
    let s = client.create_stream(stream).await.expect("create stream");
    let t = client
        .create_topic(&id_num(s.id), topic, &topic_opts(partitions))
        .await
        .expect("create topic");
    (s.id, t.id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_get_list_delete_and_duplicate() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let client = root_client(server.addr()).await;
    let (s, t) = stream_and_topic(&client, "cg-admin", "t", 4).await;
    let (sid, tid) = (id_num(s), id_num(t));

    let g = client
        .create_consumer_group(&sid, &tid, "g")
        .await
        .expect("create g");
    assert_eq!(
        (g.id, g.name.as_str(), g.partitions_count, g.members_count),
        (0, "g", 4, 0)
    );
    assert_code(client.create_consumer_group(&sid, &tid, "g").await, 5004);
    let h = client
        .create_consumer_group(&sid, &tid, "h")
        .await
        .expect("create h");
    assert_eq!(h.id, 1);

    let got = client
        .get_consumer_group(&sid, &tid, &id_name("g"))
        .await
        .expect("get g")
        .expect("g exists");
    assert_eq!((got.id, got.name.as_str()), (0, "g"));
    assert!(
        client
            .get_consumer_group(&sid, &tid, &id_name("missing"))
            .await
            .expect("get missing")
            .is_none()
    );
    let names: Vec<String> = client
        .get_consumer_groups(&sid, &tid)
        .await
        .expect("list")
        .into_iter()
        .map(|g| g.name)
        .collect();
    assert_eq!(names, ["g", "h"]);

    // h's stored offset goes with it.
    client
        .store_consumer_offset(&Consumer::group(id_name("h")), &sid, &tid, Some(0), 0)
        .await
        .expect("store h's offset");
    let stored = client
        .get_consumer_offset(&Consumer::group(id_name("h")), &sid, &tid, Some(0))
        .await
        .expect("get h's offset")
        .expect("h has a stored offset");
    assert_eq!(stored.stored_offset, 0);
    client
        .delete_consumer_group(&sid, &tid, &id_num(1))
        .await
        .expect("delete h");
    // (The partition's group deletes h's stored offset with it: an op of its log; group ids
    // are never reused, so no later request can see it either way.)
    assert_code(client.delete_consumer_group(&sid, &tid, &id_num(1)).await, 5000);
    assert_code(
        client.delete_consumer_group(&sid, &tid, &id_name("h")).await,
        5003,
    );
    // A kind-2 offset request for a missing group.
    assert_code(
        client
            .get_consumer_offset(&Consumer::group(id_name("h")), &sid, &tid, Some(0))
            .await,
        5003,
    );
    drop(client);
    server.stop();

    // Groups are persisted in the metadata document; ids keep counting.
    let server = TestServer::start(dir.path());
    let client = root_client(server.addr()).await;
    let groups = client
        .get_consumer_groups(&sid, &tid)
        .await
        .expect("list after restart");
    assert_eq!(groups.len(), 1);
    assert_eq!((groups[0].id, groups[0].name.as_str()), (0, "g"));
    let next = client
        .create_consumer_group(&sid, &tid, "k")
        .await
        .expect("create k");
    assert_eq!(next.id, 2, "group ids are not reused");
    drop(client);
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_sync_fences_and_leave() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let addr = server.addr();
    let client = root_client(addr).await;
    let (s, t) = stream_and_topic(&client, "cg-raw", "t", 3).await;
    let g = client
        .create_consumer_group(&id_num(s), &id_num(t), "g")
        .await
        .expect("create group")
        .id;
    // One message per partition.
    for p in 0..3u32 {
        let mut msgs = vec![sdk_message(u128::from(p) + 1, vec![p as u8; 8])];
        client
            .send_messages(&id_num(s), &id_num(t), &Partitioning::partition_id(p), &mut msgs)
            .await
            .expect("send");
    }

    let mut a = RawConn::connect(addr).await;
    a.login_root().await;
    let mut b = RawConn::connect(addr).await;
    b.login_root().await;

    // Not a member: empty sync, and a group poll fails with 5006.
    assert_eq!(sync(&mut a, s, t, g).await, None);
    a.call(GROUP_POLL, &group_poll(g, s, t, Some(0)))
        .await
        .assert_error(5006);

    a.call(JOIN, &group_target(s, t, g)).await.ok_payload();
    assert_eq!(sync(&mut a, s, t, g).await, Some((1, vec![0, 1, 2])));
    assert_eq!(sync(&mut b, s, t, g).await, None);
    b.call(GROUP_POLL, &group_poll(g, s, t, Some(1)))
        .await
        .assert_error(5006);

    b.call(JOIN, &group_target(s, t, g)).await.ok_payload();
    assert_eq!(sync(&mut a, s, t, g).await, Some((2, vec![0, 2])));
    assert_eq!(sync(&mut b, s, t, g).await, Some((2, vec![1])));

    // A partition assigned to someone else: 5009.
    a.call(GROUP_POLL, &group_poll(g, s, t, Some(1)))
        .await
        .assert_error(5009);
    // An assigned partition: served, and auto-commit stores the GROUP's offset.
    let f = a.call(GROUP_POLL, &group_poll(g, s, t, Some(2))).await;
    let head = f.ok_payload();
    assert_eq!(u32::from_le_bytes(head[0..4].try_into().unwrap()), 2);
    assert_eq!(u32::from_le_bytes(head[12..16].try_into().unwrap()), 1);
    let stored = client
        .get_consumer_offset(&Consumer::group(id_num(g)), &id_num(s), &id_num(t), Some(2))
        .await
        .expect("group offset")
        .expect("stored by auto-commit");
    assert_eq!(stored.stored_offset, 0);
    // The group's offset is shared: b (not a) cannot read partition 2, but a second poll of
    // it by a gets nothing new.
    let f = a.call(GROUP_POLL, &group_poll(g, s, t, Some(2))).await;
    assert_eq!(u32::from_le_bytes(f.ok_payload()[12..16].try_into().unwrap()), 0);
    // No partition: the member's assigned partition is served.
    let f = b.call(GROUP_POLL, &group_poll(g, s, t, None)).await;
    assert_eq!(u32::from_le_bytes(f.ok_payload()[0..4].try_into().unwrap()), 1);

    // Kind-2 offsets through the raw protocol.
    let mut store = Vec::new();
    enc::consumer(&mut store, 2, g);
    store.extend_from_slice(&enc::stream_topic(s, t));
    enc::opt_part(&mut store, Some(0));
    store.extend_from_slice(&0u64.to_le_bytes());
    store.push(1);
    b.call(STORE_OFFSET, &store).await.ok_payload();
    let mut get = Vec::new();
    enc::consumer(&mut get, 2, g);
    get.extend_from_slice(&enc::stream_topic(s, t));
    enc::opt_part(&mut get, Some(0));
    let f = a.call(GET_OFFSET, &get).await;
    assert_eq!(
        f.ok_payload().len(),
        20,
        "the group's stored offset is visible to any member"
    );
    let mut missing = Vec::new();
    enc::consumer(&mut missing, 2, 77);
    missing.extend_from_slice(&enc::stream_topic(s, t));
    enc::opt_part(&mut missing, Some(0));
    a.call(GET_OFFSET, &missing).await.assert_error(5000);

    // Group details list both members with their partitions.
    let f = a.call(GET_GROUP, &group_target(s, t, g)).await;
    let p = f.ok_payload();
    assert_eq!(
        u32::from_le_bytes(p[8..12].try_into().unwrap()),
        2,
        "members_count"
    );

    // Leave: sync empty afterwards, a gets everything, generation bumped.
    b.call(LEAVE, &group_target(s, t, g)).await.ok_payload();
    assert_eq!(sync(&mut b, s, t, g).await, None);
    assert_eq!(sync(&mut a, s, t, g).await, Some((3, vec![0, 1, 2])));
    b.call(LEAVE, &group_target(s, t, g)).await.assert_error(5006);

    // A member with no partitions polls with flag 0: empty head, partition u32::MAX.
    b.call(JOIN, &group_target(s, t, g)).await.ok_payload();
    let mut c = RawConn::connect(addr).await;
    c.login_root().await;
    c.call(JOIN, &group_target(s, t, g)).await.ok_payload();
    let mut d = RawConn::connect(addr).await;
    d.login_root().await;
    d.call(JOIN, &group_target(s, t, g)).await.ok_payload();
    assert_eq!(sync(&mut d, s, t, g).await, Some((6, vec![])));
    let f = d.call(GROUP_POLL, &group_poll(g, s, t, None)).await;
    let head = f.ok_payload();
    assert_eq!(head.len(), 16);
    assert_eq!(u32::from_le_bytes(head[0..4].try_into().unwrap()), u32::MAX);

    // Logout ends membership.
    d.call(code::LOGOUT, &[]).await;
    d.login_root().await;
    assert_eq!(sync(&mut d, s, t, g).await, None);
    assert_eq!(sync(&mut a, s, t, g).await, Some((7, vec![0])));

    // Connection close ends membership: wait (bounded) until the server has seen b and c go.
    drop(b);
    drop(c);
    let mut members = 3;
    for _ in 0..200 {
        let details = client
            .get_consumer_group(&id_num(s), &id_num(t), &id_num(g))
            .await
            .expect("get group")
            .expect("group exists");
        members = details.members_count;
        if members == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(members, 1, "closed connections left the group");
    let (generation, assigned) = sync(&mut a, s, t, g).await.expect("a still a member");
    assert_eq!(assigned, vec![0, 1, 2]);
    // A partition-count change is a rebalance: new generation, new partition assigned.
    client
        .create_partitions(&id_num(s), &id_num(t), 1)
        .await
        .expect("add a partition");
    assert_eq!(
        sync(&mut a, s, t, g).await,
        Some((generation + 1, vec![0, 1, 2, 3]))
    );
    drop(client);
    server.stop();
}

const STREAM: &str = "cg-stream";
const TOPIC: &str = "cg-topic";
const PARTITIONS: u32 = 12;
const TOTAL: u64 = 300_000;
const CHUNK: u64 = 500;
/// The killed-connection variant runs a smaller load: the killed member commits every message
/// it hands over, and the point is the takeover, not volume.
const KILL_TOTAL: u64 = 120_000;
/// Commit with the poll itself: what a consumer received is the group's position at once, so
/// a rebalance never hands it to another member.
const POLL_COMMIT: AutoCommit = AutoCommit::When(AutoCommitWhen::PollingMessages);

async fn create_topic(admin: &IggyClient) {
    admin.create_stream(STREAM).await.expect("stream");
    admin
        .create_topic(&id_name(STREAM), TOPIC, &topic_opts(PARTITIONS))
        .await
        .expect("topic");
}

/// Produce ids 1..=total, balanced over the partitions.
fn spawn_producer(producer_client: IggyClient, total: u64) -> tokio::task::JoinHandle<IggyClient> {
    tokio::spawn(async move {
        for chunk in 0..total / CHUNK {
            let mut messages: Vec<IggyMessage> = (chunk * CHUNK..(chunk + 1) * CHUNK)
                .map(|i| sdk_message(u128::from(i) + 1, format!("m{i}").into_bytes()))
                .collect();
            producer_client
                .send_messages(
                    &id_name(STREAM),
                    &id_name(TOPIC),
                    &Partitioning::balanced(),
                    &mut messages,
                )
                .await
                .expect("send");
        }
        producer_client
    })
}

async fn members_count(admin: &IggyClient) -> u32 {
    admin
        .get_consumer_group(&id_name(STREAM), &id_name(TOPIC), &id_name("g"))
        .await
        .expect("get group")
        .expect("group exists")
        .members_count
}

/// Start one group consumer in its own task; it forwards message ids until `stop` flips, then
/// shuts down (flushes its commits and leaves the group).
async fn spawn_member(
    addr: std::net::SocketAddr,
    auto_commit: AutoCommit,
    ids: tokio::sync::mpsc::UnboundedSender<(u128, u32)>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<IggyClient> {
    let client = root_client(addr).await;
    let mut consumer = client
        .consumer_group("g", STREAM, TOPIC)
        .expect("consumer_group builder")
        .polling_strategy(PollingStrategy::next())
        .auto_commit(auto_commit)
        .batch_length(100)
        .poll_interval(IggyDuration::from(Duration::from_millis(1)))
        .init_retries(30, NonZeroIggyDuration::new(Duration::from_millis(100)).unwrap())
        .build();
    consumer.init().await.expect("group consumer init");
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = stop.changed() => break,
                item = consumer.next() => match item {
                    Some(Ok(m)) => {
                        if ids.send((m.message.header.id, m.partition_id)).is_err() {
                            break;
                        }
                    }
                    Some(Err(e)) => eprintln!("group consumer error: {e}"),
                    None => break,
                },
            }
        }
        consumer.shutdown().await.expect("consumer shutdown");
        drop(consumer);
        client
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_sdk_consumers_share_a_topic_exactly_once() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let addr = server.addr();
    let outcome = tokio::time::timeout(Duration::from_secs(90), async move {
        let admin = root_client(addr).await;
        create_topic(&admin).await;

        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let mut members = Vec::new();
        for _ in 0..3 {
            members.push(spawn_member(addr, POLL_COMMIT, tx.clone(), stop_rx.clone()).await);
        }
        drop(tx);
        let details = admin
            .get_consumer_group(&id_name(STREAM), &id_name(TOPIC), &id_name("g"))
            .await
            .expect("get group")
            .expect("the consumers created the group");
        assert_eq!(details.members_count, 3);
        for member in &details.members {
            assert_eq!(member.partitions.len(), 4, "12 partitions over 3 members");
        }

        // Produce concurrently, balanced over the 12 partitions.
        let producer = spawn_producer(root_client(addr).await, TOTAL);

        let mut seen: HashSet<u128> = HashSet::with_capacity(TOTAL as usize);
        let mut partitions_seen = HashSet::new();
        while (seen.len() as u64) < TOTAL {
            let (id, partition) = rx.recv().await.expect("a consumer ended early");
            assert!(id >= 1 && id <= u128::from(TOTAL), "unexpected id {id}");
            assert!(seen.insert(id), "message {id} consumed twice");
            partitions_seen.insert(partition);
        }
        assert_eq!(partitions_seen.len(), PARTITIONS as usize);
        let producer_client = producer.await.expect("producer task");
        stop_tx.send(true).expect("stop members");
        for member in members {
            let _client = member.await.expect("member task");
        }
        // Every sender is gone with its task: whatever is left was delivered beyond TOTAL.
        if let Some((id, _)) = rx.recv().await {
            panic!("message {id} delivered after all {TOTAL} were seen");
        }

        // Every partition's group offset is at its last message.
        let topic = admin
            .get_topic(&id_name(STREAM), &id_name(TOPIC))
            .await
            .expect("topic")
            .expect("exists");
        assert_eq!(topic.messages_count, TOTAL);
        for p in &topic.partitions {
            let stored = admin
                .get_consumer_offset(
                    &Consumer::group(id_name("g")),
                    &id_name(STREAM),
                    &id_name(TOPIC),
                    Some(p.id),
                )
                .await
                .expect("group offset")
                .expect("stored");
            assert_eq!(stored.stored_offset, p.current_offset, "partition {}", p.id);
        }
        // The members left on shutdown.
        let details = admin
            .get_consumer_group(&id_name(STREAM), &id_name(TOPIC), &id_name("g"))
            .await
            .expect("get group")
            .expect("exists");
        assert_eq!(details.members_count, 0);
        drop(producer_client);
    })
    .await;
    assert!(outcome.is_ok(), "consumer group test exceeded 90 s");
    server.stop();
}

/// One of three members shuts down (flushes its commits, leaves) a third of the way through;
/// the other two take over its partitions from the group's stored offsets: nothing is lost and
/// nothing is consumed twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_leaves_and_the_rest_continue_from_the_group_offsets() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let addr = server.addr();
    let outcome = tokio::time::timeout(Duration::from_secs(90), async move {
        let admin = root_client(addr).await;
        create_topic(&admin).await;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let (leave_tx, leave_rx) = tokio::sync::watch::channel(false);
        let survivors = vec![
            spawn_member(addr, POLL_COMMIT, tx.clone(), stop_rx.clone()).await,
            spawn_member(addr, POLL_COMMIT, tx.clone(), stop_rx.clone()).await,
        ];
        // The leaver commits each message as it is handed over (not with the poll), so what it
        // had buffered but not handed over when it left stays for the others.
        let leaver = spawn_member(
            addr,
            AutoCommit::When(AutoCommitWhen::ConsumingEachMessage),
            tx.clone(),
            leave_rx,
        )
        .await;
        drop(tx);
        assert_eq!(members_count(&admin).await, 3);
        let producer = spawn_producer(root_client(addr).await, TOTAL);

        let mut seen: HashSet<u128> = HashSet::with_capacity(TOTAL as usize);
        let mut leaver = Some(leaver);
        while (seen.len() as u64) < TOTAL {
            let (id, _) = rx.recv().await.expect("a consumer ended early");
            assert!(id >= 1 && id <= u128::from(TOTAL), "unexpected id {id}");
            assert!(seen.insert(id), "message {id} consumed twice");
            if seen.len() as u64 >= TOTAL / 3
                && let Some(task) = leaver.take()
            {
                leave_tx.send(true).expect("stop the leaver");
                // Its task ends after shutdown: commits flushed, group left. The channel keeps
                // what it forwarded before.
                let _client = task.await.expect("leaver task");
                assert_eq!(members_count(&admin).await, 2, "the leaver left the group");
            }
        }
        assert!(leaver.is_none(), "the leaver was stopped");
        let _producer_client = producer.await.expect("producer task");
        stop_tx.send(true).expect("stop survivors");
        for member in survivors {
            let _client = member.await.expect("member task");
        }
        // Every sender is gone with its task: whatever is left was delivered beyond TOTAL.
        if let Some((id, _)) = rx.recv().await {
            panic!("message {id} delivered after all {TOTAL} were seen");
        }
        assert_eq!(members_count(&admin).await, 0);
    })
    .await;
    assert!(outcome.is_ok(), "leave test exceeded 90 s");
    server.stop();
}

/// A TCP relay in front of the server whose connections can be cut at once, the way the kernel
/// closes the sockets of a client process killed with SIGKILL. After the cut it accepts nothing
/// more, so the SDK's reconnect attempts fail instead of rejoining.
struct CuttableRelay {
    addr: std::net::SocketAddr,
    cut: tokio::sync::watch::Sender<bool>,
    accept_task: tokio::task::JoinHandle<()>,
}

impl CuttableRelay {
    async fn start(target: std::net::SocketAddr) -> CuttableRelay {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("relay bind");
        let addr = listener.local_addr().expect("relay addr");
        let (cut, cut_rx) = tokio::sync::watch::channel(false);
        let accept_task = tokio::spawn(async move {
            let mut accept_cut = cut_rx.clone();
            loop {
                let (mut client_side, _) = tokio::select! {
                    _ = accept_cut.changed() => return,
                    accepted = listener.accept() => match accepted {
                        Ok(pair) => pair,
                        Err(_) => return,
                    },
                };
                let mut connection_cut = cut_rx.clone();
                tokio::spawn(async move {
                    let Ok(mut server_side) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = connection_cut.changed() => {}
                        _ = tokio::io::copy_bidirectional(&mut client_side, &mut server_side) => {}
                    }
                    // Both sockets drop here: the server sees the connection end with no leave.
                });
            }
        });
        CuttableRelay {
            addr,
            cut,
            accept_task,
        }
    }

    async fn cut(self) {
        self.cut.send(true).expect("relay tasks listen");
        self.accept_task.await.expect("relay accept task");
    }
}

/// One of three members loses its connection (the relay in front of it cuts every socket, as a
/// SIGKILL of its process would) once it has consumed 2 000 messages. The server drops it from the
/// group, the two others take over its partitions from the group's stored offsets, and every
/// message is consumed. The cut member committed each message as it handed it over, so the
/// only messages delivered twice are ones it handed over whose commit never reached the server;
/// the survivors, which commit with each poll, never see a message twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_connection_is_killed_is_replaced_without_loss() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let addr = server.addr();
    let outcome = tokio::time::timeout(Duration::from_secs(90), async move {
        let admin = root_client(addr).await;
        create_topic(&admin).await;
        let (survivor_tx, mut survivor_rx) = tokio::sync::mpsc::unbounded_channel();
        let (victim_tx, mut victim_rx) = tokio::sync::mpsc::unbounded_channel();
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let survivors = vec![
            spawn_member(addr, POLL_COMMIT, survivor_tx.clone(), stop_rx.clone()).await,
            spawn_member(addr, POLL_COMMIT, survivor_tx.clone(), stop_rx.clone()).await,
        ];
        drop(survivor_tx);
        let relay = CuttableRelay::start(addr).await;
        let (_victim_stop_tx, victim_stop_rx) = tokio::sync::watch::channel(false);
        let victim = spawn_member(
            relay.addr,
            AutoCommit::When(AutoCommitWhen::ConsumingEachMessage),
            victim_tx,
            victim_stop_rx,
        )
        .await;
        assert_eq!(members_count(&admin).await, 3);
        let producer = spawn_producer(root_client(addr).await, KILL_TOTAL);

        let mut from_victim: HashSet<u128> = HashSet::new();
        let mut from_survivors: HashSet<u128> = HashSet::with_capacity(KILL_TOTAL as usize);
        let mut victim = Some((victim, relay));
        let covered = |a: &HashSet<u128>, b: &HashSet<u128>| a.union(b).count() as u64;
        while covered(&from_victim, &from_survivors) < KILL_TOTAL {
            let id = if victim.is_some() {
                tokio::select! {
                    Some((id, _)) = victim_rx.recv() => {
                        assert!(from_victim.insert(id), "the cut member got message {id} twice");
                        id
                    }
                    Some((id, _)) = survivor_rx.recv() => {
                        assert!(from_survivors.insert(id), "message {id} consumed twice by survivors");
                        id
                    }
                }
            } else {
                let (id, _) = survivor_rx.recv().await.expect("a survivor ended early");
                assert!(
                    from_survivors.insert(id),
                    "message {id} consumed twice by survivors"
                );
                id
            };
            assert!(id >= 1 && id <= u128::from(KILL_TOTAL), "unexpected id {id}");
            // The cut member commits every message it hands over (one offset store each), so
            // it is the slow one: cut it once it has shown it consumes, not at a share of KILL_TOTAL.
            if from_victim.len() >= 2_000
                && let Some((task, relay)) = victim.take()
            {
                relay.cut().await;
                // The member's process is gone as far as the server knows; stop its task
                // without a shutdown (which would leave the group politely).
                task.abort();
                let _ = task.await;
                // Whatever it forwarded before the cut still counts as consumed.
                while let Ok((id, _)) = victim_rx.try_recv() {
                    from_victim.insert(id);
                }
                let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
                while members_count(&admin).await != 2 {
                    assert!(
                        tokio::time::Instant::now() < deadline,
                        "the server never dropped the cut member from the group"
                    );
                    tokio::task::yield_now().await;
                }
            }
        }
        assert!(victim.is_none(), "the member was cut");
        let _producer_client = producer.await.expect("producer task");
        stop_tx.send(true).expect("stop survivors");
        for member in survivors {
            let _client = member.await.expect("member task");
        }
        // Every sender is gone with its task: anything left must still be new to the survivors.
        while let Some((id, _)) = survivor_rx.recv().await {
            assert!(
                from_survivors.insert(id),
                "message {id} consumed twice by survivors"
            );
        }
        // Redeliveries are only of messages the cut member handed over without a commit
        // reaching the server: a bounded tail per partition it held, never a survivor's message.
        let redelivered = from_victim.intersection(&from_survivors).count();
        assert!(
            redelivered <= 4 * 100,
            "{redelivered} messages redelivered: more than one poll batch per partition of the cut member"
        );
        assert_eq!(members_count(&admin).await, 0);
    })
    .await;
    assert!(outcome.is_ok(), "kill test exceeded 90 s");
    server.stop();
}
