//! 1 024 SDK connections at once (the server's default `tcp.max_connections`): every one
//! logs in, sends, is listed, and is still served once all of them are connected. A
//! partition's replicated log has one client, the node itself (its writer groups the
//! sends of every connection into ops), so connections never meet the replication core's
//! client table and its 64 entries: no live connection's session can be evicted there.

mod common;

use common::*;
use iggy::prelude::*;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

const CONNECTIONS: usize = 1024;
const PARTITIONS: u32 = 4;
/// Logins in flight at once (each costs the server one argon2 check).
const LOGINS_AT_ONCE: usize = 32;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_and_twenty_four_connections_are_served_at_once() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let addr = server.addr();

    // Every connection logs in and stays open.
    let logins = Arc::new(tokio::sync::Semaphore::new(LOGINS_AT_ONCE));
    let mut connecting = tokio::task::JoinSet::new();
    for index in 0..CONNECTIONS {
        let logins = logins.clone();
        connecting.spawn(async move {
            let _permit = logins.acquire_owned().await.expect("semaphore");
            (index, root_client(addr).await)
        });
    }
    let mut clients: Vec<Option<IggyClient>> = (0..CONNECTIONS).map(|_| None).collect();
    while let Some(joined) = connecting.join_next().await {
        let (index, client) = joined.expect("login task panicked");
        clients[index] = Some(client);
    }
    let clients: Vec<Arc<IggyClient>> = clients
        .into_iter()
        .map(|client| Arc::new(client.expect("every connection logged in")))
        .collect();

    // One of them is the admin: a 1 025th connection would wait for a free slot.
    let (stream, topic) = create_stream_topic(&clients[0], "connections", "many", PARTITIONS).await;

    // Every connection sends one message, all at once.
    let mut sending = tokio::task::JoinSet::new();
    for (index, client) in clients.iter().enumerate() {
        let client = client.clone();
        sending.spawn(async move {
            let id = index as u128 + 1;
            let mut messages = vec![sdk_message(id, format!("from connection {index}").into_bytes())];
            tokio::time::timeout(
                REQUEST_TIMEOUT,
                client.send_messages(
                    &id_num(stream),
                    &id_num(topic),
                    &Partitioning::partition_id(index as u32 % PARTITIONS),
                    &mut messages,
                ),
            )
            .await
            .expect("send timed out")
            .unwrap_or_else(|error| panic!("connection {index}: send failed: {error}"));
        });
    }
    while let Some(joined) = sending.join_next().await {
        joined.expect("send task panicked");
    }

    // The server lists every connection.
    let listed = clients[0].get_clients().await.expect("get_clients");
    assert_eq!(listed.len(), CONNECTIONS, "every connection is listed");

    // Every message is stored once.
    let mut ids = BTreeSet::new();
    for partition in 0..PARTITIONS {
        for message in poll_all(&clients[0], stream, topic, partition, 500, CONNECTIONS).await {
            assert!(
                ids.insert(message.header.id),
                "message {} stored twice",
                message.header.id
            );
            let index = message.header.id as usize - 1;
            assert_eq!(
                message.payload.as_ref(),
                format!("from connection {index}").as_bytes()
            );
        }
    }
    assert_eq!(ids, (1..=CONNECTIONS as u128).collect(), "every send was stored");

    // And every connection is still served as the user it logged in as.
    let mut asking = tokio::task::JoinSet::new();
    for (index, client) in clients.iter().enumerate() {
        let client = client.clone();
        asking.spawn(async move {
            let me = tokio::time::timeout(REQUEST_TIMEOUT, client.get_me())
                .await
                .expect("get_me timed out")
                .unwrap_or_else(|error| panic!("connection {index}: get_me failed: {error}"));
            assert_eq!(
                me.user_id,
                Some(0),
                "connection {index} is still logged in as root"
            );
        });
    }
    while let Some(joined) = asking.join_next().await {
        joined.expect("get_me task panicked");
    }
    server.stop();
}
