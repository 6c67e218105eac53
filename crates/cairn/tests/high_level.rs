//! Acceptance 6: the SDK's high-level IggyProducer and IggyConsumer (standalone consumer,
//! not a consumer group) move 100 000 messages with no loss and no duplicates.

mod common;

use common::*;
use futures_util::StreamExt;
use iggy::prelude::*;
use std::time::Duration;

const STREAM: &str = "hl-stream";
const TOPIC: &str = "hl-topic";
const TOTAL: u64 = 100_000;
const CHUNK: u64 = 1_000;

fn payload_for(i: u64) -> Vec<u8> {
    format!("high-level-message-{i:06}").into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producer_and_consumer_move_100000_messages() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let addr = server.addr();

    let outcome = tokio::time::timeout(Duration::from_secs(120), async move {
        // Producer: creates the stream and the topic (1 partition) itself.
        let producer_client = root_client(addr).await;
        let producer = producer_client
            .producer(STREAM, TOPIC)
            .expect("producer builder")
            .direct(DirectConfig::builder().batch_length(CHUNK as u32).build())
            .create_topic_if_not_exists(1, IggyExpiry::ServerDefault, MaxTopicSize::ServerDefault)
            .build();
        producer.init().await.expect("producer init");

        let producer_task = tokio::spawn(async move {
            for chunk in 0..TOTAL / CHUNK {
                let messages: Vec<IggyMessage> = (chunk * CHUNK..(chunk + 1) * CHUNK)
                    .map(|i| sdk_message(u128::from(i) + 1, payload_for(i)))
                    .collect();
                producer.send(messages).await.expect("producer send");
            }
            producer.shutdown().await;
            drop(producer_client);
        });

        // Consumer: standalone, partition 0, Next + auto-commit on poll.
        let consumer_client = root_client(addr).await;
        let mut consumer = consumer_client
            .consumer("hl-consumer", STREAM, TOPIC, 0)
            .expect("consumer builder")
            .polling_strategy(PollingStrategy::next())
            .auto_commit(AutoCommit::When(AutoCommitWhen::PollingMessages))
            .batch_length(CHUNK as u32)
            .init_retries(30, NonZeroIggyDuration::new(Duration::from_millis(100)).unwrap())
            .build();
        consumer.init().await.expect("consumer init");

        let mut seen = vec![false; TOTAL as usize];
        let mut received = 0u64;
        let mut last_offset: Option<u64> = None;
        // Bounded: at most TOTAL messages plus a budget of errors / duplicates.
        let mut errors = 0u32;
        while received < TOTAL {
            let item = consumer.next().await.expect("consumer stream ended early");
            let msg = match item {
                Ok(m) => m,
                Err(e) => {
                    errors += 1;
                    assert!(errors < 50, "too many consumer errors, last: {e:?}");
                    continue;
                }
            };
            assert_eq!(msg.partition_id, 0);
            let id = msg.message.header.id;
            assert!(id >= 1 && id <= u128::from(TOTAL), "unexpected message id {id}");
            let i = (id - 1) as u64;
            assert!(!seen[i as usize], "message {i} delivered twice");
            seen[i as usize] = true;
            assert_eq!(
                msg.message.payload.as_ref(),
                payload_for(i).as_slice(),
                "payload of {i}"
            );
            assert_eq!(
                msg.message.header.offset, i,
                "offset equals send order on 1 partition"
            );
            if let Some(prev) = last_offset {
                assert_eq!(
                    msg.message.header.offset,
                    prev + 1,
                    "offsets strictly consecutive"
                );
            }
            last_offset = Some(msg.message.header.offset);
            received += 1;
        }
        assert!(seen.iter().all(|&b| b), "every message seen");
        eprintln!("high-level: received {received} distinct messages ({errors} consumer errors)");
        producer_task.await.expect("producer task");
        consumer.shutdown().await.expect("consumer shutdown");

        // The server stored the consumer's position (auto-commit on poll).
        let info = consumer_client
            .get_consumer_offset(
                &Consumer::new(id_name("hl-consumer")),
                &id_name(STREAM),
                &id_name(TOPIC),
                Some(0),
            )
            .await
            .expect("get_consumer_offset")
            .expect("offset stored");
        assert_eq!(info.stored_offset, TOTAL - 1);
        let topic = consumer_client
            .get_topic(&id_name(STREAM), &id_name(TOPIC))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(topic.messages_count, TOTAL, "no extra messages were stored");
    })
    .await;
    assert!(outcome.is_ok(), "high-level test exceeded 120 s");
    server.stop();
}
