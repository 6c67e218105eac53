//! The administrative HTTP routes, driven by the published 0.11 SDK (an `IggyClient` on the
//! HTTP transport): stream/topic updates and purges, partitions and segments, consumer-offset
//! deletion, flushing, consumer groups, stats and cluster metadata. Every SDK call here fails
//! with `InvalidJsonResponse` if a reply's JSON does not match the SDK's serde types.

mod common;

use common::*;
use iggy::prelude::*;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Bound for every single HTTP call in these tests.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// An `IggyClient` on the HTTP transport, logged in as root; also returns the bearer token
/// for the raw requests some tests make.
async fn http_client(server: &TestServer) -> (IggyClient, String) {
    let http = HttpClient::create(Arc::new(HttpClientConfig {
        api_url: format!("http://{}", server.http_addr()),
        // A retry would hide what the server answered first.
        retries: 0,
        ..Default::default()
    }))
    .expect("http client");
    let client = IggyClient::new(ClientWrapper::Http(http));
    let identity = tokio::time::timeout(CALL_TIMEOUT, client.login_user(ROOT_USER, ROOT_PASSWORD))
        .await
        .expect("login timed out")
        .expect("login over HTTP");
    let token = identity.access_token.expect("HTTP login returns a token").token;
    (client, token)
}

/// A stream and a topic with `partitions` partitions; returns their ids.
async fn stream_and_topic(client: &IggyClient, name: &str, partitions: u32) -> (u32, u32) {
    let stream = client.create_stream(name).await.expect("create stream").id;
    let topic = client
        .create_topic(&id_num(stream), "t", &topic_opts(partitions))
        .await
        .expect("create topic")
        .id;
    (stream, topic)
}

async fn send(client: &IggyClient, stream: u32, topic: u32, partition: u32, count: u128) {
    let mut messages: Vec<IggyMessage> = (1..=count)
        .map(|id| sdk_message(id, format!("m-{id}").into_bytes()))
        .collect();
    client
        .send_messages(
            &id_num(stream),
            &id_num(topic),
            &Partitioning::partition_id(partition),
            &mut messages,
        )
        .await
        .expect("send over HTTP");
}

async fn poll_count(client: &IggyClient, stream: u32, topic: u32, partition: u32) -> usize {
    client
        .poll_messages(
            &id_num(stream),
            &id_num(topic),
            Some(partition),
            &Consumer::new(id_num(1)),
            &PollingStrategy::offset(0),
            100,
            false,
        )
        .await
        .expect("poll over HTTP")
        .messages
        .len()
}

async fn topic_details(client: &IggyClient, stream: u32, topic: u32) -> TopicDetails {
    client
        .get_topic(&id_num(stream), &id_num(topic))
        .await
        .expect("get_topic")
        .expect("topic exists")
}

/// One raw HTTP/1.1 request with the bearer token; returns the status code and the text.
async fn raw_request(server: &TestServer, token: &str, method: &str, path: &str) -> (u16, String) {
    let mut socket = tokio::net::TcpStream::connect(server.http_addr())
        .await
        .expect("connect");
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: cairn\r\nAuthorization: Bearer {token}\r\n\
         Connection: close\r\nContent-Length: 0\r\n\r\n"
    );
    socket.write_all(request.as_bytes()).await.expect("write");
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), socket.read_to_end(&mut response))
        .await
        .expect("the server did not answer promptly")
        .expect("read");
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text
        .get(9..12)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line in: {text}"));
    (status, text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn updated_stream_and_topic_read_back_with_the_new_values() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let (client, _) = http_client(&server).await;
    let (stream, topic) = stream_and_topic(&client, "before", 1).await;

    client
        .update_stream(&id_num(stream), "after", &StreamUpdateOptions::default())
        .await
        .expect("update stream");
    let details = client
        .get_stream(&id_name("after"))
        .await
        .expect("get stream")
        .expect("renamed stream found by its new name");
    assert_eq!(details.id, stream);
    assert!(
        client
            .get_stream(&id_name("before"))
            .await
            .expect("get")
            .is_none(),
        "the old name is gone"
    );

    let expiry = IggyExpiry::ExpireDuration(IggyDuration::from(Duration::from_secs(3600)));
    let max_size = MaxTopicSize::Custom(IggyByteSize::from(10_000_000u64));
    let options = TopicUpdateOptions {
        compression_algorithm: Some(CompressionAlgorithm::Gzip),
        message_expiry: Some(expiry),
        max_topic_size: Some(max_size),
        ..Default::default()
    };
    client
        .update_topic(&id_num(stream), &id_num(topic), "t2", &options)
        .await
        .expect("update topic");
    let details = topic_details(&client, stream, topic).await;
    assert_eq!(details.name, "t2");
    assert_eq!(details.compression_algorithm, CompressionAlgorithm::Gzip);
    assert_eq!(details.message_expiry, expiry);
    assert_eq!(details.max_topic_size, max_size);

    // Absent fields leave the topic's values alone; only the name changes.
    client
        .update_topic(
            &id_num(stream),
            &id_num(topic),
            "t3",
            &TopicUpdateOptions::default(),
        )
        .await
        .expect("rename only");
    let details = topic_details(&client, stream, topic).await;
    assert_eq!(details.name, "t3");
    assert_eq!(details.compression_algorithm, CompressionAlgorithm::Gzip);
    assert_eq!(details.message_expiry, expiry);

    // Streams have no option keys: one sent is refused as over TCP, nothing changes.
    let mut refused = StreamUpdateOptions::default();
    refused.raw.insert("no_such_key".to_string(), "1".to_string());
    let result = client.update_stream(&id_num(stream), "other", &refused).await;
    assert!(result.is_err(), "unknown stream option refused: {result:?}");
    assert!(client.get_stream(&id_name("after")).await.expect("get").is_some());
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn created_and_deleted_partitions_change_the_partitions_count() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let (client, token) = http_client(&server).await;
    let (stream, topic) = stream_and_topic(&client, "parts", 1).await;

    client
        .create_partitions(&id_num(stream), &id_num(topic), 3)
        .await
        .expect("create partitions");
    let details = topic_details(&client, stream, topic).await;
    assert_eq!(details.partitions_count, 4);
    assert_eq!(details.partitions.len(), 4);
    send(&client, stream, topic, 3, 2).await;
    assert_eq!(poll_count(&client, stream, topic, 3).await, 2);

    client
        .delete_partitions(&id_num(stream), &id_num(topic), 2)
        .await
        .expect("delete partitions");
    let details = topic_details(&client, stream, topic).await;
    assert_eq!(details.partitions_count, 2);
    assert_eq!(details.partitions.len(), 2);

    // More than there are, and zero, are refused by the handler; a non-u32 by the shell.
    assert!(
        client
            .delete_partitions(&id_num(stream), &id_num(topic), 5)
            .await
            .is_err()
    );
    assert!(
        client
            .create_partitions(&id_num(stream), &id_num(topic), 0)
            .await
            .is_err()
    );
    let path = format!("/streams/{stream}/topics/{topic}/partitions?partitions_count=-1");
    let (status, text) = raw_request(&server, &token, "DELETE", &path).await;
    assert_eq!(status, 400, "{text}");
    assert!(
        text.contains("partitions_count"),
        "the reason names the field: {text}"
    );
    let path = format!("/streams/{stream}/topics/{topic}/partitions");
    let (status, text) = raw_request(&server, &token, "DELETE", &path).await;
    assert_eq!(status, 400, "a missing count is refused: {text}");
    assert_eq!(topic_details(&client, stream, topic).await.partitions_count, 2);
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purged_topic_and_stream_poll_nothing() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let (client, _) = http_client(&server).await;
    let stream = client.create_stream("purge").await.expect("stream").id;
    let mut topics = Vec::new();
    for name in ["a", "b"] {
        let topic = client
            .create_topic(&id_num(stream), name, &topic_opts(2))
            .await
            .expect("topic")
            .id;
        send(&client, stream, topic, 0, 3).await;
        send(&client, stream, topic, 1, 2).await;
        topics.push(topic);
    }
    let (a, b) = (topics[0], topics[1]);

    client
        .purge_topic(&id_num(stream), &id_num(a))
        .await
        .expect("purge topic");
    assert_eq!(poll_count(&client, stream, a, 0).await, 0);
    assert_eq!(poll_count(&client, stream, a, 1).await, 0);
    assert_eq!(
        poll_count(&client, stream, b, 0).await,
        3,
        "other topic untouched"
    );

    client.purge_stream(&id_num(stream)).await.expect("purge stream");
    for topic in [a, b] {
        for partition in [0, 1] {
            assert_eq!(poll_count(&client, stream, topic, partition).await, 0);
        }
    }
    // The topics themselves remain and keep taking messages.
    send(&client, stream, b, 0, 1).await;
    assert_eq!(poll_count(&client, stream, b, 0).await, 1);
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_consumer_offset_is_no_longer_returned() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let (client, token) = http_client(&server).await;
    let (stream, topic) = stream_and_topic(&client, "offsets", 2).await;
    send(&client, stream, topic, 1, 5).await;
    let consumer = Consumer::new(id_num(42));

    for partition in [0u32, 1] {
        client
            .store_consumer_offset(&consumer, &id_num(stream), &id_num(topic), Some(partition), 0)
            .await
            .expect("store offset");
    }
    client
        .delete_consumer_offset(&consumer, &id_num(stream), &id_num(topic), Some(1))
        .await
        .expect("delete offset on partition 1");
    let offset = client
        .get_consumer_offset(&consumer, &id_num(stream), &id_num(topic), Some(1))
        .await
        .expect("get offset");
    assert!(offset.is_none(), "deleted offset is gone: {offset:?}");
    let kept = client
        .get_consumer_offset(&consumer, &id_num(stream), &id_num(topic), Some(0))
        .await
        .expect("get offset");
    assert!(kept.is_some(), "the other partition's offset stays");

    // Without a partition id a plain consumer means partition 0.
    client
        .delete_consumer_offset(&consumer, &id_num(stream), &id_num(topic), None)
        .await
        .expect("delete offset on partition 0");
    assert!(
        client
            .get_consumer_offset(&consumer, &id_num(stream), &id_num(topic), Some(0))
            .await
            .expect("get offset")
            .is_none()
    );
    // Deleting again: nothing stored any more.
    assert!(
        client
            .delete_consumer_offset(&consumer, &id_num(stream), &id_num(topic), Some(1))
            .await
            .is_err()
    );
    let path = format!("/streams/{stream}/topics/{topic}/consumer-offsets/42?partition_id=x");
    let (status, text) = raw_request(&server, &token, "DELETE", &path).await;
    assert_eq!(status, 400, "{text}");
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flush_unsaved_buffer_succeeds_with_and_without_fsync() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let (client, token) = http_client(&server).await;
    let (stream, topic) = stream_and_topic(&client, "flush", 1).await;
    send(&client, stream, topic, 0, 3).await;

    for fsync in [false, true] {
        client
            .flush_unsaved_buffer(&id_num(stream), &id_num(topic), 0, fsync)
            .await
            .expect("flush");
    }
    assert!(
        client
            .flush_unsaved_buffer(&id_num(stream), &id_num(topic), 9, true)
            .await
            .is_err(),
        "a missing partition is an error"
    );
    let path = format!("/streams/{stream}/topics/{topic}/messages/flush/0/fsync=maybe");
    let (status, text) = raw_request(&server, &token, "GET", &path).await;
    assert_eq!(status, 400, "{text}");
    assert_eq!(poll_count(&client, stream, topic, 0).await, 3);
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_groups_are_created_listed_read_and_deleted() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let (client, _) = http_client(&server).await;
    let (stream, topic) = stream_and_topic(&client, "groups", 3).await;
    let (s, t) = (id_num(stream), id_num(topic));

    let created = client
        .create_consumer_group(&s, &t, "g1")
        .await
        .expect("create group");
    assert_eq!(created.name, "g1");
    assert_eq!(created.partitions_count, 3);
    assert_eq!(created.members_count, 0);
    assert!(created.members.is_empty());
    let second = client
        .create_consumer_group(&s, &t, "g2")
        .await
        .expect("create second group");
    assert!(
        client.create_consumer_group(&s, &t, "g1").await.is_err(),
        "a duplicate name is refused"
    );

    let groups = client.get_consumer_groups(&s, &t).await.expect("list groups");
    let mut names: Vec<_> = groups.iter().map(|g| g.name.clone()).collect();
    names.sort();
    assert_eq!(names, ["g1", "g2"]);

    let by_id = client
        .get_consumer_group(&s, &t, &id_num(created.id))
        .await
        .expect("get group")
        .expect("group exists");
    assert_eq!(by_id.name, "g1");
    let by_name = client
        .get_consumer_group(&s, &t, &id_name("g2"))
        .await
        .expect("get group")
        .expect("group exists");
    assert_eq!(by_name.id, second.id);

    client
        .delete_consumer_group(&s, &t, &id_num(created.id))
        .await
        .expect("delete group");
    let missing = client
        .get_consumer_group(&s, &t, &id_num(created.id))
        .await
        .expect("get of a missing group is not an error");
    assert!(missing.is_none());
    assert!(
        client
            .get_consumer_group(&s, &t, &id_name("never-created"))
            .await
            .expect("get")
            .is_none()
    );
    let groups = client.get_consumer_groups(&s, &t).await.expect("list groups");
    assert_eq!(groups.len(), 1);
    assert!(
        client
            .delete_consumer_group(&s, &t, &id_num(created.id))
            .await
            .is_err(),
        "deleting a missing group fails"
    );
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_count_what_was_created() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let (client, _) = http_client(&server).await;
    let (stream, topic) = stream_and_topic(&client, "stats-1", 2).await;
    let other = client.create_stream("stats-2").await.expect("stream").id;
    client
        .create_topic(&id_num(other), "t", &topic_opts(3))
        .await
        .expect("topic");
    send(&client, stream, topic, 0, 4).await;
    send(&client, stream, topic, 1, 3).await;

    let stats = client.get_stats().await.expect("get_stats");
    assert_eq!(stats.streams_count, 2);
    assert_eq!(stats.topics_count, 2);
    assert_eq!(stats.partitions_count, 5);
    assert_eq!(stats.messages_count, 7);
    assert!(stats.segments_count > 0, "the written partitions have segments");
    assert!(stats.messages_size_bytes.as_bytes_u64() > 0);
    assert_eq!(stats.process_id, server.pid());
    assert!(!stats.iggy_server_version.is_empty());
    assert!(stats.start_time.as_micros() > 0);
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_metadata_lists_one_healthy_leader() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let (client, _) = http_client(&server).await;

    let metadata = client.get_cluster_metadata().await.expect("cluster metadata");
    assert_eq!(metadata.nodes.len(), 1);
    let node = &metadata.nodes[0];
    assert_eq!(node.role, ClusterNodeRole::Leader);
    assert_eq!(node.status, ClusterNodeStatus::Healthy);
    assert_eq!(node.endpoints.tcp, server.addr().port());
    assert_eq!(node.endpoints.http, server.http_addr().port());
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_segments_succeeds_and_the_partition_still_serves() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let (client, token) = http_client(&server).await;
    let (stream, topic) = stream_and_topic(&client, "segments", 1).await;
    send(&client, stream, topic, 0, 2).await;

    client
        .delete_segments(&id_num(stream), &id_num(topic), 0, 1)
        .await
        .expect("delete segments");
    send(&client, stream, topic, 0, 1).await;
    assert!(
        poll_count(&client, stream, topic, 0).await > 0,
        "the partition still serves"
    );
    assert!(
        client
            .delete_segments(&id_num(stream), &id_num(topic), 7, 1)
            .await
            .is_err(),
        "a missing partition is an error"
    );
    let path = format!("/streams/{stream}/topics/{topic}/partitions/0?segments_count=99999999999");
    let (status, text) = raw_request(&server, &token, "DELETE", &path).await;
    assert_eq!(status, 400, "{text}");
    let path = format!("/streams/{stream}/topics/{topic}/partitions/zero?segments_count=1");
    let (status, text) = raw_request(&server, &token, "DELETE", &path).await;
    assert_eq!(status, 400, "{text}");
    assert!(
        text.contains("partition_id"),
        "the reason names the field: {text}"
    );
    server.stop();
}
