//! Memory is never ahead of durable metadata: a metadata change whose write fails is refused,
//! nothing of it is visible (no topic that acknowledges sends and vanishes at the next boot,
//! no deleted token that comes back), and everything acknowledged before survives.
//!
//! The fault is real: a directory put where the metadata's staging file (`metadata.tmp`) goes
//! makes every atomic replace of the metadata fail, as a full or failing disk would.

mod common;

use common::*;
use iggy::prelude::*;

const PAYLOAD_BYTES: usize = 100;

fn block_metadata_writes(dir: &std::path::Path) -> std::path::PathBuf {
    let staging = dir.join("metadata.tmp");
    std::fs::create_dir(&staging).expect("put a directory where the staging file goes");
    staging
}

#[tokio::test]
async fn a_failed_metadata_write_refuses_the_change_and_shows_nothing_of_it() {
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

    let staging = block_metadata_writes(dir.path());

    // Creations are refused, and nothing of them shows: no topic to send to, no files left.
    let refused_topic = client
        .create_topic(&id_num(stream.id), "refused", &topic_opts(3))
        .await;
    assert!(
        refused_topic.is_err(),
        "create_topic succeeded without durable metadata"
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
    assert!(
        !dir.path().join("streams/0/topics/1").exists(),
        "the refused topic's files were left behind"
    );
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
        logs.contains("writing the metadata failed: the change is refused"),
        "the operator is not told: {logs}"
    );

    // After the disk recovers and the server restarts, the disk says what the clients saw.
    std::fs::remove_dir(&staging).expect("unblock");
    server.stop();
    let server = TestServer::start(dir.path());
    let client = root_client(server.addr()).await;
    let topics = client.get_topics(&id_num(stream.id)).await.expect("get_topics");
    assert_eq!(
        topics.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
        ["kept"]
    );
    let polled = poll_all(&client, stream.id, kept.id, 1, 100, 1_000).await;
    let payloads: Vec<Vec<u8>> = polled.iter().map(|m| m.payload.to_vec()).collect();
    let expected: Vec<Vec<u8>> = messages.iter().map(|(_, p)| p.clone()).collect();
    assert_eq!(
        payloads, expected,
        "acknowledged messages changed across the restart"
    );
    // The refused create consumed no id.
    let next = client
        .create_topic(&id_num(stream.id), "after", &topic_opts(1))
        .await
        .expect("create after recovery");
    assert_eq!(next.id, 1);
    server.stop();
}
