//! The HTTP transport, driven by the published 0.11 SDK's `HttpClient`: login, streams and
//! topics, send and poll, missing resources, authentication, and durability scenario 13 over
//! HTTP (oversized message and batch refused, nothing written, server keeps serving).

mod common;

use common::*;
use iggy::prelude::*;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Bound for every single HTTP call in these tests.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

fn http_client(server: &TestServer, jwt: Option<&str>) -> HttpClient {
    HttpClient::create(Arc::new(HttpClientConfig {
        api_url: format!("http://{}", server.http_addr()),
        // A retry would hide what the server answered first.
        retries: 0,
        jwt: jwt.map(str::to_string),
        ..Default::default()
    }))
    .expect("http client")
}

async fn logged_in(server: &TestServer) -> HttpClient {
    let client = http_client(server, None);
    let identity = tokio::time::timeout(CALL_TIMEOUT, client.login_user(ROOT_USER, ROOT_PASSWORD))
        .await
        .expect("login timed out")
        .expect("login over HTTP");
    assert!(identity.access_token.is_some(), "HTTP login returns a token");
    client
}

async fn messages_count(client: &HttpClient, stream: u32, topic: u32) -> u64 {
    client
        .get_topic(&id_num(stream), &id_num(topic))
        .await
        .expect("get_topic")
        .expect("topic exists")
        .messages_count
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_http_client_creates_sends_and_polls() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let client = logged_in(&server).await;
    client.ping().await.expect("ping");

    let stream = client.create_stream("http-s").await.expect("create stream");
    let topic = client
        .create_topic(&id_num(stream.id), "http-t", &topic_opts(2))
        .await
        .expect("create topic");
    assert_eq!(topic.partitions_count, 2);
    let streams = client.get_streams().await.expect("get streams");
    assert!(streams.iter().any(|s| s.name == "http-s"));
    let details = client
        .get_stream(&id_name("http-s"))
        .await
        .expect("get stream")
        .expect("stream exists");
    assert_eq!(details.topics.len(), 1);
    assert_eq!(details.topics[0].name, "http-t");

    // Explicit ids come back as sent; id 0 gets a server-minted non-zero id.
    let mut messages: Vec<IggyMessage> = (1..=5u128)
        .map(|id| sdk_message(id, format!("payload-{id}").into_bytes()))
        .collect();
    messages.push(sdk_message(0, b"minted".to_vec()));
    client
        .send_messages(
            &id_num(stream.id),
            &id_num(topic.id),
            &Partitioning::partition_id(1),
            &mut messages,
        )
        .await
        .expect("send over HTTP");

    let polled = client
        .poll_messages(
            &id_num(stream.id),
            &id_num(topic.id),
            Some(1),
            &Consumer::new(id_num(7)),
            &PollingStrategy::offset(0),
            100,
            false,
        )
        .await
        .expect("poll over HTTP");
    assert_eq!(polled.partition_id, 1);
    assert_eq!(polled.messages.len(), 6);
    assert_eq!(polled.current_offset, 5);
    for (index, message) in polled.messages.iter().enumerate() {
        assert_eq!(message.header.offset, index as u64);
        if index < 5 {
            let id = index as u128 + 1;
            assert_eq!(message.header.id, id);
            assert_eq!(message.payload.as_ref(), format!("payload-{id}").as_bytes());
        } else {
            assert_ne!(message.header.id, 0, "id 0 is replaced by the server");
            assert_eq!(message.payload.as_ref(), b"minted");
        }
    }
    assert_eq!(messages_count(&client, stream.id, topic.id).await, 6);

    // The same messages are visible over TCP: one store behind both transports.
    let tcp = root_client(server.addr()).await;
    let via_tcp = tcp
        .poll_messages(
            &id_num(stream.id),
            &id_num(topic.id),
            Some(1),
            &Consumer::new(id_num(7)),
            &PollingStrategy::offset(0),
            100,
            false,
        )
        .await
        .expect("poll over TCP");
    let ids: Vec<u128> = via_tcp.messages.iter().map(|m| m.header.id).collect();
    let http_ids: Vec<u128> = polled.messages.iter().map(|m| m.header.id).collect();
    assert_eq!(ids, http_ids);

    // Consumer offsets round-trip.
    client
        .store_consumer_offset(
            &Consumer::new(id_num(7)),
            &id_num(stream.id),
            &id_num(topic.id),
            Some(1),
            3,
        )
        .await
        .expect("store offset");
    let offset = client
        .get_consumer_offset(
            &Consumer::new(id_num(7)),
            &id_num(stream.id),
            &id_num(topic.id),
            Some(1),
        )
        .await
        .expect("get offset")
        .expect("offset stored");
    assert_eq!(offset.stored_offset, 3);

    client.logout_user().await.expect("logout");
    drop(tcp);
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_resources_and_authentication() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let client = logged_in(&server).await;
    assert!(client.get_stream(&id_num(999)).await.expect("get").is_none());
    assert!(client.get_stream(&id_name("nope")).await.expect("get").is_none());

    // A token the server never issued: the server answers 401, the SDK says Unauthenticated.
    let forged = http_client(&server, Some("not-a-token"));
    let result = forged.get_streams().await;
    assert!(
        matches!(result, Err(IggyError::Unauthenticated)),
        "expected Unauthenticated, got {result:?}"
    );
    // A wrong password is refused too.
    let anonymous = http_client(&server, None);
    assert!(anonymous.login_user(ROOT_USER, "wrong-password").await.is_err());
    // Ping needs no login.
    anonymous.ping().await.expect("ping without login");

    // After logout the old token no longer works.
    let token = {
        let fresh = http_client(&server, None);
        let identity = fresh.login_user(ROOT_USER, ROOT_PASSWORD).await.expect("login");
        identity.access_token.expect("token").token
    };
    let holder = http_client(&server, Some(&token));
    holder.get_streams().await.expect("token works");
    holder.logout_user().await.expect("logout");
    let reused = http_client(&server, Some(&token));
    assert!(matches!(
        reused.get_streams().await,
        Err(IggyError::Unauthenticated)
    ));
    drop(client);
    server.stop();
}

fn http_error(result: Result<impl std::fmt::Debug, IggyError>) -> (u16, String) {
    match result {
        Err(IggyError::HttpResponseError(status, body)) => (status, body),
        other => panic!("expected an HTTP error response, got {other:?}"),
    }
}

/// Durability scenario 13 over HTTP: an oversized message and an oversized batch are refused
/// with a clear error, nothing is written, and the server keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_13_oversized_message_and_batch_over_http() {
    let dir = temp_dir();
    let server = TestServer::start_with(
        dir.path(),
        &[
            "--set",
            "limits.message_payload_bytes_max=4096",
            "--set",
            "limits.batch_bytes_max=65536",
            "--max-frame-bytes",
            "1048576",
        ],
        &[],
    );
    let client = logged_in(&server).await;
    let stream = client.create_stream("s13").await.expect("stream").id;
    let topic = client
        .create_topic(&id_num(stream), "t", &topic_opts(1))
        .await
        .expect("topic")
        .id;
    let mut first = vec![sdk_message(1, vec![1u8; 100])];
    client
        .send_messages(
            &id_num(stream),
            &id_num(topic),
            &Partitioning::partition_id(0),
            &mut first,
        )
        .await
        .expect("normal send");
    assert_eq!(messages_count(&client, stream, topic).await, 1);

    // One message above limits.message_payload_bytes_max: 4022 TooBigMessagePayload.
    let mut too_big = vec![sdk_message(2, vec![2u8; 4097])];
    let (status, body) = http_error(
        client
            .send_messages(
                &id_num(stream),
                &id_num(topic),
                &Partitioning::partition_id(0),
                &mut too_big,
            )
            .await,
    );
    assert_eq!(status, 400, "body: {body}");
    assert!(body.contains("\"id\":4022"), "body names 4022: {body}");
    assert!(
        body.contains("message_payload_bytes_max"),
        "body names the limit: {body}"
    );

    // Messages each within the payload limit, together above limits.batch_bytes_max: 4036.
    let mut batch: Vec<IggyMessage> = (0..20u128)
        .map(|i| sdk_message(10 + i, vec![3u8; 4000]))
        .collect();
    let (status, body) = http_error(
        client
            .send_messages(
                &id_num(stream),
                &id_num(topic),
                &Partitioning::partition_id(0),
                &mut batch,
            )
            .await,
    );
    assert_eq!(status, 400, "body: {body}");
    assert!(body.contains("\"id\":4036"), "body names 4036: {body}");
    assert!(body.contains("batch_bytes_max"), "body names the limit: {body}");

    // Nothing was written, seen over HTTP and over TCP.
    assert_eq!(messages_count(&client, stream, topic).await, 1);
    let tcp = root_client(server.addr()).await;
    let via_tcp = tcp
        .get_topic(&id_num(stream), &id_num(topic))
        .await
        .expect("get_topic over TCP")
        .expect("topic");
    assert_eq!(via_tcp.messages_count, 1);

    // The server keeps serving: a normal send right after succeeds and lands at offset 1.
    let mut after = vec![sdk_message(99, vec![9u8; 4096])];
    client
        .send_messages(
            &id_num(stream),
            &id_num(topic),
            &Partitioning::partition_id(0),
            &mut after,
        )
        .await
        .expect("send after the refusals");
    let polled = client
        .poll_messages(
            &id_num(stream),
            &id_num(topic),
            Some(0),
            &Consumer::new(id_num(1)),
            &PollingStrategy::offset(0),
            10,
            false,
        )
        .await
        .expect("poll");
    let ids: Vec<u128> = polled.messages.iter().map(|m| m.header.id).collect();
    assert_eq!(ids, vec![1, 99]);
    assert_eq!(polled.messages[1].header.offset, 1);
    drop(tcp);
    server.stop();
}

/// A body declared far above the bound is refused from its headers: the server answers at
/// once instead of waiting for (and buffering) gigabytes that never come.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_declared_body_is_refused_without_buffering() {
    let dir = temp_dir();
    let server = TestServer::start_with(
        dir.path(),
        &[
            "--set",
            "limits.batch_bytes_max=65536",
            "--max-frame-bytes",
            "1048576",
        ],
        &[],
    );
    let client = logged_in(&server).await;
    let stream = client.create_stream("big").await.expect("stream").id;
    let topic = client
        .create_topic(&id_num(stream), "t", &topic_opts(1))
        .await
        .expect("topic")
        .id;

    let mut socket = tokio::net::TcpStream::connect(server.http_addr())
        .await
        .expect("connect");
    let request = format!(
        "POST /streams/{stream}/topics/{topic}/messages HTTP/1.1\r\nHost: cairn\r\n\
         Content-Type: application/json\r\nContent-Length: 10000000000\r\n\r\n{{\"partitioning\":"
    );
    socket.write_all(request.as_bytes()).await.expect("write");
    let mut response = Vec::new();
    let mut chunk = [0u8; 4096];
    // Read until the status line and the JSON body are in, or the server closes.
    let read = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let n = socket.read(&mut chunk).await.expect("read");
            if n == 0 {
                break;
            }
            response.extend_from_slice(&chunk[..n]);
            if String::from_utf8_lossy(&response).contains("}") {
                break;
            }
        }
    })
    .await;
    assert!(read.is_ok(), "the server did not answer promptly");
    let text = String::from_utf8_lossy(&response);
    assert!(text.starts_with("HTTP/1.1 413"), "expected 413, got: {text}");
    assert!(text.contains("4036"), "the body names 4036: {text}");

    assert_eq!(messages_count(&client, stream, topic).await, 0);
    let mut ok = vec![sdk_message(1, vec![1u8; 10])];
    client
        .send_messages(
            &id_num(stream),
            &id_num(topic),
            &Partitioning::partition_id(0),
            &mut ok,
        )
        .await
        .expect("server keeps serving");
    assert_eq!(messages_count(&client, stream, topic).await, 1);
    server.stop();
}
