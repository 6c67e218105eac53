//! The replicated metadata log as operators and clients see it:
//! - memory is never ahead of durable metadata: a change whose log write fails is not applied,
//!   nothing of it is visible (no topic that acknowledges sends and vanishes at the next boot,
//!   no deleted token that comes back), everything acknowledged before survives, and the
//!   operator is told what happened;
//! - a data directory whose metadata is still a document (written before the log existed) is
//!   migrated at boot, with a log line, and the document is kept.

mod common;

use common::*;
use iggy::prelude::*;

const PAYLOAD_BYTES: usize = 100;
/// The fault hook that makes every write of a metadata log entry fail (see `faults.rs`).
const FAIL_METADATA_WRITES: (&str, &str) = ("CAIRN_TEST_FAIL_AT", "group-write-prepares");

#[tokio::test]
async fn a_failed_metadata_log_write_applies_nothing_and_loses_nothing() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let client = root_client(server.addr()).await;
    let stream = client.create_stream("s").await.expect("create stream");
    let kept = client
        .create_topic(&id_num(stream.id), "kept", &topic_opts(2))
        .await
        .expect("create topic");
    let messages: Vec<(u128, Vec<u8>)> = (1..=20u128)
        .map(|id| (id, payload_for(id, PAYLOAD_BYTES)))
        .collect();
    send_batch(&client, stream.id, kept.id, 1, &messages)
        .await
        .expect("acknowledged send");
    let pat = client
        .create_personal_access_token("kept-token", PersonalAccessTokenExpiry::NeverExpire)
        .await
        .expect("create token");
    server.stop();

    // The same data directory on a disk where every write of a metadata log entry fails.
    let server = TestServer::start_with(dir.path(), &[], &[FAIL_METADATA_WRITES]);
    let client = root_client(server.addr()).await;

    // Creations are refused, and nothing of them shows: no topic to send to.
    let refused_topic = client
        .create_topic(&id_num(stream.id), "refused", &topic_opts(3))
        .await;
    assert!(
        refused_topic.is_err(),
        "create_topic succeeded without a durable log entry"
    );
    assert!(
        client
            .get_topic(&id_num(stream.id), &id_name("refused"))
            .await
            .expect("get_topic")
            .is_none(),
        "a refused topic is visible"
    );
    let send_to_refused = client
        .send_messages(
            &id_num(stream.id),
            &id_name("refused"),
            &Partitioning::partition_id(0),
            &mut [sdk_message(99, payload_for(99, PAYLOAD_BYTES))],
        )
        .await;
    assert_code(send_to_refused, 2011);
    assert!(client.create_stream("refused").await.is_err());
    assert_eq!(client.get_streams().await.expect("get_streams").len(), 1);
    assert!(
        client
            .create_user("refused-user", "secret", UserStatus::Active, None)
            .await
            .is_err()
    );
    assert!(
        client
            .get_user(&id_name("refused-user"))
            .await
            .expect("get_user")
            .is_none()
    );

    // Deletions are refused, and what they would have removed keeps working.
    assert!(
        client
            .delete_topic(&id_num(stream.id), &id_num(kept.id))
            .await
            .is_err()
    );
    assert!(client.delete_personal_access_token("kept-token").await.is_err());
    let by_token = sdk_client(server.addr()).await;
    by_token
        .login_with_personal_access_token(&pat.token)
        .await
        .expect("the token whose deletion was refused still logs in");
    let polled = poll_all(&client, stream.id, kept.id, 1, 100, 1_000).await;
    assert_eq!(polled.len(), messages.len());
    send_batch(&client, stream.id, kept.id, 0, &messages[..1])
        .await
        .expect("the topic whose deletion was refused still takes sends");

    let logs = server.logs();
    assert!(
        logs.contains("writing the metadata log failed: the change is not applied"),
        "the operator is not told: {logs}"
    );

    // After the disk recovers and the server restarts, the disk says what the clients saw.
    // (The refused topic's partition files stay until then: had its entry reached the disk,
    // they would be its partitions; `cairn check` reports them as orphans boot removes.)
    let mut server = server;
    assert!(
        server.terminate().success(),
        "no clean stop after failed metadata writes"
    );
    let server = TestServer::start(dir.path());
    let client = root_client(server.addr()).await;
    let topics = client.get_topics(&id_num(stream.id)).await.expect("get_topics");
    assert_eq!(
        topics.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
        ["kept"]
    );
    assert!(
        !dir.path().join("streams/0/topics/1").exists(),
        "the refused topic's files outlived a restart"
    );
    let polled = poll_all(&client, stream.id, kept.id, 1, 100, 1_000).await;
    let payloads: Vec<Vec<u8>> = polled.iter().map(|m| m.payload.to_vec()).collect();
    let expected: Vec<Vec<u8>> = messages.iter().map(|(_, p)| p.clone()).collect();
    assert_eq!(
        payloads, expected,
        "acknowledged messages changed across the restarts"
    );
    sdk_client(server.addr())
        .await
        .login_with_personal_access_token(&pat.token)
        .await
        .expect("the token is still there");
    // The refused create consumed no id.
    let next = client
        .create_topic(&id_num(stream.id), "after", &topic_opts(1))
        .await
        .expect("create after recovery");
    assert_eq!(next.id, 1);
    server.stop();
}

/// The bytes of `contents` framed as Cairn's atomic files are (magic, version, length,
/// XXH3-64 over the first 16 bytes and the contents), written independently of the server.
fn atomic_file_bytes(contents: &[u8]) -> Vec<u8> {
    let mut head = Vec::new();
    head.extend_from_slice(b"CRNA");
    head.extend_from_slice(&1u32.to_le_bytes());
    head.extend_from_slice(&(contents.len() as u64).to_le_bytes());
    let mut summed = head.clone();
    summed.extend_from_slice(contents);
    let mut bytes = head;
    bytes.extend_from_slice(&xxh3(&summed).to_le_bytes());
    bytes.extend_from_slice(contents);
    bytes
}

#[tokio::test]
async fn a_metadata_document_is_migrated_into_the_log_at_boot() {
    let dir = temp_dir();
    // What a data directory of the release before the log held: the catalog as a document
    // (here without a root user: boot creates it, as it did then).
    let document = r#"{"format_version":1,"next_stream_id":8,"streams":[{"id":7,"name":"legacy",
        "created_at_us":1,"next_topic_id":3,"topics":[{"id":2,"name":"no-partitions","created_at_us":1,
        "message_expiry_us":0,"compression":1,"max_topic_size_bytes":0,"partitions":[],
        "consumer_groups":[{"id":0,"name":"readers"}],"next_group_id":1}]}],
        "next_user_id":1,"users":[],"next_token_id":0,"tokens":[]}"#;
    std::fs::write(
        dir.path().join("metadata"),
        atomic_file_bytes(document.as_bytes()),
    )
    .expect("write document");

    let server = TestServer::start(dir.path());
    let client = root_client(server.addr()).await;
    let assert_migrated = |streams: Vec<Stream>| {
        assert_eq!(streams.len(), 1);
        assert_eq!((streams[0].id, streams[0].name.as_str()), (7, "legacy"));
    };
    assert_migrated(client.get_streams().await.expect("get_streams"));
    let group = client
        .get_consumer_group(&id_num(7), &id_num(2), &id_name("readers"))
        .await
        .expect("get group");
    assert!(group.is_some(), "the topic's consumer group was not migrated");
    // New ids continue after the document's.
    assert_eq!(client.create_stream("new").await.expect("create").id, 8);
    let logs = server.logs();
    assert!(
        logs.contains("migrated the metadata document into the replicated metadata log"),
        "no log line says so: {logs}"
    );
    assert!(!dir.path().join("metadata").exists());
    assert!(
        dir.path().join("metadata.migrated").exists(),
        "the document was not kept"
    );
    server.stop();

    let server = TestServer::start(dir.path());
    let client = root_client(server.addr()).await;
    let streams = client.get_streams().await.expect("get_streams");
    assert_eq!(streams.len(), 2);
    assert!(
        !server.logs().contains("migrated the metadata document"),
        "migrated twice"
    );
    server.stop();
}

/// SIGKILL while a client creates streams and users as fast as it can, three times: every
/// creation that was acknowledged is there after each restart (from the log's checkpoint and
/// the entries above it), ids are never handed out twice, and the log keeps going.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_changes_survive_sigkill() {
    let dir = temp_dir();
    let mut acknowledged: Vec<(u32, String)> = Vec::new();
    let mut users_acknowledged: Vec<String> = Vec::new();
    let mut next_name = 0u32;
    // Three crashes, then a last start that only checks.
    for cycle in 0..4 {
        let server = TestServer::start(dir.path());
        let client = root_client(server.addr()).await;
        // Everything acknowledged before the crash is back, and nothing else.
        let streams = client.get_streams().await.expect("get_streams");
        for (id, name) in &acknowledged {
            assert!(
                streams.iter().any(|s| s.id == *id && &s.name == name),
                "cycle {cycle}: acknowledged stream {id} {name:?} lost"
            );
        }
        let mut ids: Vec<u32> = streams.iter().map(|s| s.id).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), streams.len(), "a stream id was handed out twice");
        for name in &users_acknowledged {
            assert!(
                client.get_user(&id_name(name)).await.expect("get_user").is_some(),
                "cycle {cycle}: acknowledged user {name} lost"
            );
        }
        if cycle == 3 {
            server.stop();
            break;
        }
        // 40 creations (more than two checkpoint intervals), then the crash comes while the
        // next one may be in flight.
        let creating = {
            let addr = server.addr();
            let first = next_name;
            tokio::spawn(async move {
                let client = root_client(addr).await;
                let mut created = Vec::new();
                let mut users = Vec::new();
                for n in first..first + 1_000 {
                    let name = format!("stream-{n}");
                    match client.create_stream(&name).await {
                        Ok(stream) => created.push((stream.id, name)),
                        Err(_) => break,
                    }
                    if n % 5 == 0 {
                        let user = format!("user-{n}");
                        match client
                            .create_user(&user, "secret", UserStatus::Active, None)
                            .await
                        {
                            Ok(_) => users.push(user),
                            Err(_) => break,
                        }
                    }
                }
                (created, users)
            })
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let count = client.get_streams().await.map(|s| s.len()).unwrap_or(0);
            // The creator waits for each reply before the next create, so at most one
            // visible stream is not acknowledged yet: 41 new ones mean 40 acknowledged.
            if count >= streams.len() + 41 {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "creations did not progress");
            tokio::task::yield_now().await;
        }
        server.kill();
        let (created, users) = creating.await.expect("creator");
        assert!(
            created.len() >= 40,
            "cycle {cycle}: only {} creations",
            created.len()
        );
        next_name += 1_000;
        acknowledged.extend(created);
        users_acknowledged.extend(users);
    }
}

/// A bit flip in the newest acknowledged entry of the metadata log: with no peer to repair it
/// from, the server refuses to start and says which entry, `cairn check` reports the damage,
/// and the files stay byte-identical (an operator decides; nothing is cut away).
#[tokio::test]
async fn a_damaged_metadata_log_entry_is_refused_loudly() {
    const MESSAGE_SLOT_BYTES: u64 = 1024 * 1024;
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let client = root_client(server.addr()).await;
    for n in 0..5 {
        client
            .create_stream(&format!("s{n}"))
            .await
            .expect("create stream");
    }
    server.stop();

    // The newest entry: the redundant header slot with the highest op (header bytes 72..80).
    let log = dir.path().join("vsr").join("metadata");
    let headers = std::fs::read(log.join("headers")).expect("headers");
    let (slot, op) = headers
        .chunks(256)
        .enumerate()
        .map(|(slot, header)| {
            (
                slot,
                u64::from_le_bytes(header[72..80].try_into().expect("8 bytes")),
            )
        })
        .max_by_key(|&(_, op)| op)
        .expect("a header slot");
    assert!(op > 0, "no entry found");
    let prepares_path = log.join("prepares");
    let mut prepares = std::fs::read(&prepares_path).expect("prepares");
    let at = (slot as u64 * MESSAGE_SLOT_BYTES + 256 + 3) as usize;
    prepares[at] ^= 0x04;
    std::fs::write(&prepares_path, &prepares).expect("flip a bit");
    let before: Vec<Vec<u8>> = ["superblock", "headers", "prepares", "checkpoints"]
        .iter()
        .map(|name| std::fs::read(log.join(name)).expect("read"))
        .collect();

    let output = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["serve", "--data-dir", dir.path().to_str().expect("utf-8")])
        .args(["--tcp-address", "127.0.0.1:0", "--http-address", "127.0.0.1:0"])
        .env("CAIRN_ROOT_PASSWORD", ROOT_PASSWORD)
        .output()
        .expect("run cairn");
    assert!(
        !output.status.success(),
        "cairn started on a damaged metadata log"
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!(
            "damaged journal entries that may hold acknowledged changes: slot {slot} (op {op})"
        )),
        "the refusal does not say what is damaged: {stderr}"
    );
    let check = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
        .arg("check")
        .arg(dir.path())
        .output()
        .expect("run cairn check");
    assert_eq!(check.status.code(), Some(1), "check did not report the damage");
    assert!(String::from_utf8_lossy(&check.stdout).contains("metadata: DAMAGED"));
    let after: Vec<Vec<u8>> = ["superblock", "headers", "prepares", "checkpoints"]
        .iter()
        .map(|name| std::fs::read(log.join(name)).expect("read"))
        .collect();
    assert!(
        before == after,
        "the refused start or the check changed the log's files"
    );
}
