//! Acceptance 3 (streams and topics through the SDK) and §11 items 8, 11-16, 34, 38.

mod common;

use common::*;
use iggy::prelude::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_stream_and_topic_with_three_partitions() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let client = root_client(server.addr()).await;

    assert!(
        client.get_streams().await.unwrap().is_empty(),
        "no streams at start"
    );

    let stream = client.create_stream("orders").await.expect("create_stream");
    assert_eq!(stream.name, "orders");
    assert_eq!(stream.topics_count, 0);
    assert!(stream.topics.is_empty());
    assert_eq!(stream.messages_count, 0);

    let topic = client
        .create_topic(&id_num(stream.id), "events", &topic_opts(3))
        .await
        .expect("create_topic");
    assert_eq!(topic.name, "events");
    assert_eq!(topic.partitions_count, 3);
    assert_eq!(topic.partitions.len(), 3);
    assert_eq!(topic.compression_algorithm, CompressionAlgorithm::None);
    let ids: Vec<u32> = topic.partitions.iter().map(|p| p.id).collect();
    assert_eq!(ids, vec![0, 1, 2], "partition ids are 0..n-1");
    for p in &topic.partitions {
        assert_eq!(p.messages_count, 0);
        assert_eq!(p.current_offset, 0);
    }

    // Lookups by id and by name.
    for sid in [id_num(stream.id), id_name("orders")] {
        let s = client.get_stream(&sid).await.unwrap().expect("stream exists");
        assert_eq!(s.id, stream.id);
        assert_eq!(s.name, "orders");
        assert_eq!(s.topics_count, 1);
        assert_eq!(s.topics.len(), 1);
        assert_eq!(s.topics[0].name, "events");
        assert_eq!(s.topics[0].partitions_count, 3);
    }
    for tid in [id_num(topic.id), id_name("events")] {
        let t = client
            .get_topic(&id_name("orders"), &tid)
            .await
            .unwrap()
            .expect("topic exists");
        assert_eq!(t.id, topic.id);
        assert_eq!(t.partitions_count, 3);
        assert_eq!(t.partitions.len(), 3);
    }
    let topics = client.get_topics(&id_num(stream.id)).await.unwrap();
    assert_eq!(topics.len(), 1);
    assert_eq!(topics[0].name, "events");

    let streams = client.get_streams().await.unwrap();
    assert_eq!(streams.len(), 1);
    assert_eq!(streams[0].name, "orders");
    assert_eq!(streams[0].topics_count, 1);

    // A second stream gets a distinct id.
    let other = client.create_stream("payments").await.unwrap();
    assert_ne!(other.id, stream.id);
    let mut names: Vec<String> = client
        .get_streams()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    names.sort();
    assert_eq!(names, vec!["orders".to_string(), "payments".to_string()]);
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_names_are_rejected() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let client = root_client(server.addr()).await;
    let (s, _t) = create_stream_topic(&client, "dup-stream", "dup-topic", 3).await;

    assert_code(client.create_stream("dup-stream").await, 1012);
    assert_code(
        client.create_topic(&id_num(s), "dup-topic", &topic_opts(1)).await,
        2013,
    );
    // Nothing was changed by the refused requests.
    assert_eq!(client.get_streams().await.unwrap().len(), 1);
    let st = client.get_stream(&id_num(s)).await.unwrap().unwrap();
    assert_eq!(st.topics_count, 1);
    // The same topic name in another stream is fine.
    let s2 = client.create_stream("dup-stream-2").await.unwrap();
    client
        .create_topic(&id_num(s2.id), "dup-topic", &topic_opts(1))
        .await
        .expect("same topic name in another stream");
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_stream_and_topic_are_none() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let client = root_client(server.addr()).await;

    assert!(client.get_stream(&id_num(4242)).await.unwrap().is_none());
    assert!(client.get_stream(&id_name("nope")).await.unwrap().is_none());
    let (s, _) = create_stream_topic(&client, "present", "t", 1).await;
    assert!(
        client
            .get_topic(&id_num(s), &id_num(4242))
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        client
            .get_topic(&id_num(s), &id_name("nope"))
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        client
            .get_topic(&id_name("nope"), &id_name("t"))
            .await
            .unwrap()
            .is_none()
    );
    server.stop();
}

/// §11 item 38: Create/DeletePartitions change partitions_count; purge empties partitions;
/// delete removes resources.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_purge_and_delete() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let client = root_client(server.addr()).await;
    let (s, t) = create_stream_topic(&client, "ps", "pt", 3).await;
    let (sid, tid) = (id_num(s), id_num(t));

    client
        .create_partitions(&sid, &tid, 2)
        .await
        .expect("create_partitions");
    let topic = client.get_topic(&sid, &tid).await.unwrap().unwrap();
    assert_eq!(topic.partitions_count, 5);
    assert_eq!(
        topic.partitions.iter().map(|p| p.id).collect::<Vec<_>>(),
        vec![0, 1, 2, 3, 4]
    );
    client
        .delete_partitions(&sid, &tid, 1)
        .await
        .expect("delete_partitions");
    let topic = client.get_topic(&sid, &tid).await.unwrap().unwrap();
    assert_eq!(topic.partitions_count, 4);
    assert_eq!(
        topic.partitions.iter().map(|p| p.id).collect::<Vec<_>>(),
        vec![0, 1, 2, 3]
    );

    // Fill two partitions, then purge the topic.
    for p in [0u32, 3] {
        let mut msgs: Vec<IggyMessage> = (0..10)
            .map(|i| sdk_message(u128::from(p) * 1000 + i + 1, vec![b'a'; 16]))
            .collect();
        client
            .send_messages(&sid, &tid, &Partitioning::partition_id(p), &mut msgs)
            .await
            .expect("send");
    }
    let consumer = Consumer::new(id_num(1));
    let polled = client
        .poll_messages(
            &sid,
            &tid,
            Some(3),
            &consumer,
            &PollingStrategy::first(),
            100,
            false,
        )
        .await
        .unwrap();
    assert_eq!(polled.messages.len(), 10);
    client.purge_topic(&sid, &tid).await.expect("purge_topic");
    for p in [0u32, 3] {
        let polled = client
            .poll_messages(
                &sid,
                &tid,
                Some(p),
                &consumer,
                &PollingStrategy::first(),
                100,
                false,
            )
            .await
            .unwrap();
        assert!(
            polled.messages.is_empty(),
            "partition {p} not empty after purge_topic"
        );
    }

    // Purge stream.
    let mut msgs: Vec<IggyMessage> = (0..5).map(|i| sdk_message(500 + i, vec![1, 2, 3])).collect();
    client
        .send_messages(&sid, &tid, &Partitioning::partition_id(1), &mut msgs)
        .await
        .unwrap();
    client.purge_stream(&sid).await.expect("purge_stream");
    let polled = client
        .poll_messages(
            &sid,
            &tid,
            Some(1),
            &consumer,
            &PollingStrategy::first(),
            100,
            false,
        )
        .await
        .unwrap();
    assert!(polled.messages.is_empty(), "not empty after purge_stream");

    // Delete topic, then stream.
    client.delete_topic(&sid, &tid).await.expect("delete_topic");
    assert!(client.get_topic(&sid, &tid).await.unwrap().is_none());
    client.delete_stream(&sid).await.expect("delete_stream");
    assert!(client.get_stream(&sid).await.unwrap().is_none());
    assert!(client.get_streams().await.unwrap().is_empty());
    // The name can be reused.
    client.create_stream("ps").await.expect("recreate stream");
    server.stop();
}

/// §11 item 8: GetClusterMetadata returns exactly one healthy leader with the TCP port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_metadata_single_node() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let client = root_client(server.addr()).await;
    let md = client.get_cluster_metadata().await.expect("get_cluster_metadata");
    assert_eq!(md.nodes.len(), 1, "exactly one node");
    let node = &md.nodes[0];
    assert_eq!(node.role, ClusterNodeRole::Leader);
    assert_eq!(node.status, ClusterNodeStatus::Healthy);
    assert_ne!(node.endpoints.tcp, 0, "tcp port must be non-zero");
    assert_eq!(
        node.endpoints.tcp,
        server.addr().port(),
        "tcp port is the listening port"
    );

    // Raw: the exact layout (no replica id).
    let mut raw = RawConn::connect(server.addr()).await;
    raw.login_root().await;
    let f = raw.call(code::GET_CLUSTER_METADATA, &[]).await;
    let body = f.ok_payload().to_vec();
    let mut c = rec::Cursor::new(&body);
    let _cluster_name = c.lstr();
    assert_eq!(c.u32(), 1, "nodes_count");
    let _name = c.lstr();
    let _ip = c.lstr();
    assert_eq!(c.u16(), server.addr().port());
    let _quic = c.u16();
    let _http = c.u16();
    let _ws = c.u16();
    assert_eq!(c.u8(), 0, "role leader");
    assert_eq!(c.u8(), 0, "status healthy");
    assert_eq!(c.remaining(), 0, "no trailing bytes (no replica_id)");
    server.stop();
}

/// §11 item 34: GetStats decodes (full 0.11 layout) and counts resources.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_report_counts() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let client = root_client(server.addr()).await;
    let stats = client.get_stats().await.expect("get_stats (empty server)");
    assert_eq!(stats.streams_count, 0);
    assert_eq!(stats.topics_count, 0);

    let (s, t) = create_stream_topic(&client, "stats-a", "t1", 3).await;
    client
        .create_topic(&id_num(s), "t2", &topic_opts(2))
        .await
        .unwrap();
    create_stream_topic(&client, "stats-b", "t3", 1).await;
    let mut msgs: Vec<IggyMessage> = (0..7).map(|i| sdk_message(i + 1, vec![7; 10])).collect();
    client
        .send_messages(&id_num(s), &id_num(t), &Partitioning::partition_id(1), &mut msgs)
        .await
        .unwrap();

    let stats = client.get_stats().await.expect("get_stats");
    assert_eq!(stats.streams_count, 2);
    assert_eq!(stats.topics_count, 3);
    assert_eq!(stats.partitions_count, 6);
    assert_eq!(stats.messages_count, 7);
    assert!(!stats.iggy_server_version.is_empty(), "server version reported");
    assert!(stats.clients_count >= 1, "at least this client is connected");
    server.stop();
}
