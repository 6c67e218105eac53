//! Acceptance 5 and §11 items 27, 28, 29: auto-commit + Next, Store/Get/DeleteConsumerOffset.

mod common;

use common::*;
use iggy::prelude::*;
use std::collections::BTreeSet;

const MESSAGES: u64 = 250;

async fn setup(client: &IggyClient, partitions: u32) -> (u32, u32) {
    let (s, t) = create_stream_topic(client, "off", "t", partitions).await;
    // 5 batches of 50 into every partition so polls span stored batches.
    for p in 0..partitions {
        for b in 0..5u64 {
            let mut msgs: Vec<IggyMessage> = (0..50u64)
                .map(|i| {
                    let n = b * 50 + i;
                    sdk_message(
                        u128::from(p) * 1_000_000 + u128::from(n) + 1,
                        format!("p{p}-m{n}").into_bytes(),
                    )
                })
                .collect();
            client
                .send_messages(&id_num(s), &id_num(t), &Partitioning::partition_id(p), &mut msgs)
                .await
                .expect("send");
        }
    }
    (s, t)
}

async fn poll_next(
    client: &IggyClient,
    s: u32,
    t: u32,
    partition: Option<u32>,
    consumer: &Consumer,
    count: u32,
    auto_commit: bool,
) -> PolledMessages {
    client
        .poll_messages(
            &id_num(s),
            &id_num(t),
            partition,
            consumer,
            &PollingStrategy::next(),
            count,
            auto_commit,
        )
        .await
        .expect("poll next")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_commit_next_walks_a_partition_exactly_once() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let client = root_client(server.addr()).await;
    let (s, t) = setup(&client, 2).await;
    let consumer = Consumer::new(id_name("walker"));

    for p in 0..2u32 {
        let mut seen = Vec::new();
        // 250 messages, 17 per poll → 15 polls; bounded at 100.
        for _ in 0..100 {
            let polled = poll_next(&client, s, t, Some(p), &consumer, 17, true).await;
            if polled.messages.is_empty() {
                break;
            }
            assert_eq!(polled.partition_id, p);
            for m in &polled.messages {
                let n = m.header.offset;
                assert_eq!(m.payload.as_ref(), format!("p{p}-m{n}").as_bytes());
            }
            seen.extend(polled.messages.iter().map(|m| m.header.offset));
        }
        assert_eq!(
            seen,
            (0..MESSAGES).collect::<Vec<_>>(),
            "partition {p}: every offset exactly once, in order"
        );
        // Nothing more; and the stored offset is the last one returned.
        let polled = poll_next(&client, s, t, Some(p), &consumer, 17, true).await;
        assert!(polled.messages.is_empty());
        let info = client
            .get_consumer_offset(&consumer, &id_num(s), &id_num(t), Some(p))
            .await
            .unwrap()
            .expect("offset stored by auto-commit");
        assert_eq!(info.partition_id, p);
        assert_eq!(info.stored_offset, MESSAGES - 1);
        assert_eq!(info.current_offset, MESSAGES - 1);
    }

    // New messages are picked up after the stored offset.
    let mut more = vec![sdk_message(9_999_001, b"late".to_vec())];
    client
        .send_messages(&id_num(s), &id_num(t), &Partitioning::partition_id(0), &mut more)
        .await
        .unwrap();
    let polled = poll_next(&client, s, t, Some(0), &consumer, 17, true).await;
    assert_eq!(polled.messages.len(), 1);
    assert_eq!(polled.messages[0].header.offset, MESSAGES);
    assert_eq!(polled.messages[0].header.id, 9_999_001);

    // Another consumer is independent and starts from the beginning.
    let other = Consumer::new(id_num(42));
    let polled = poll_next(&client, s, t, Some(0), &other, 3, true).await;
    assert_eq!(
        polled
            .messages
            .iter()
            .map(|m| m.header.offset)
            .collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    // A poll without auto-commit does not move the stored offset.
    let polled = poll_next(&client, s, t, Some(0), &other, 3, false).await;
    assert_eq!(polled.messages[0].header.offset, 3);
    let polled = poll_next(&client, s, t, Some(0), &other, 3, false).await;
    assert_eq!(polled.messages[0].header.offset, 3, "no auto-commit → no move");
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_get_delete_consumer_offset() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let client = root_client(server.addr()).await;
    let (s, t) = setup(&client, 2).await;
    let (sid, tid) = (id_num(s), id_num(t));
    let consumer = Consumer::new(id_num(7));

    // Nothing stored yet.
    assert!(
        client
            .get_consumer_offset(&consumer, &sid, &tid, Some(0))
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        client
            .get_consumer_offset(&consumer, &sid, &tid, None)
            .await
            .unwrap()
            .is_none()
    );

    client
        .store_consumer_offset(&consumer, &sid, &tid, Some(0), 100)
        .await
        .expect("store");
    let info = client
        .get_consumer_offset(&consumer, &sid, &tid, Some(0))
        .await
        .unwrap()
        .expect("stored");
    assert_eq!(info.partition_id, 0);
    assert_eq!(info.stored_offset, 100);
    assert_eq!(info.current_offset, MESSAGES - 1);
    // flag 0 with a kind-1 consumer means partition 0.
    let info0 = client
        .get_consumer_offset(&consumer, &sid, &tid, None)
        .await
        .unwrap()
        .expect("None → partition 0");
    assert_eq!(info0.stored_offset, 100);
    assert_eq!(info0.partition_id, 0);
    // Partition 1 is separate.
    assert!(
        client
            .get_consumer_offset(&consumer, &sid, &tid, Some(1))
            .await
            .unwrap()
            .is_none()
    );

    // Next resumes at stored + 1.
    let polled = poll_next(&client, s, t, Some(0), &consumer, 5, false).await;
    assert_eq!(
        polled
            .messages
            .iter()
            .map(|m| m.header.offset)
            .collect::<Vec<_>>(),
        vec![101, 102, 103, 104, 105]
    );

    // Overwrite, including storing 0 (legal).
    client
        .store_consumer_offset(&consumer, &sid, &tid, Some(0), 0)
        .await
        .expect("store 0");
    let info = client
        .get_consumer_offset(&consumer, &sid, &tid, Some(0))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(info.stored_offset, 0);
    let polled = poll_next(&client, s, t, Some(0), &consumer, 2, false).await;
    assert_eq!(polled.messages[0].header.offset, 1);

    // Store on partition 1 via explicit partition.
    client
        .store_consumer_offset(&consumer, &sid, &tid, Some(1), 200)
        .await
        .unwrap();
    assert_eq!(
        client
            .get_consumer_offset(&consumer, &sid, &tid, Some(1))
            .await
            .unwrap()
            .unwrap()
            .stored_offset,
        200
    );

    // Delete → Get returns None and Next restarts at the first message.
    client
        .delete_consumer_offset(&consumer, &sid, &tid, Some(0))
        .await
        .expect("delete");
    assert!(
        client
            .get_consumer_offset(&consumer, &sid, &tid, Some(0))
            .await
            .unwrap()
            .is_none()
    );
    let polled = poll_next(&client, s, t, Some(0), &consumer, 3, false).await;
    assert_eq!(
        polled
            .messages
            .iter()
            .map(|m| m.header.offset)
            .collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    // Partition 1 untouched by the delete on partition 0.
    assert_eq!(
        client
            .get_consumer_offset(&consumer, &sid, &tid, Some(1))
            .await
            .unwrap()
            .unwrap()
            .stored_offset,
        200
    );
    // Deleting an offset that does not exist: the SDK documents 3021; §6.8 also allows a
    // plain success. Anything else is wrong, and it must not resurrect an offset.
    match client
        .delete_consumer_offset(&consumer, &sid, &tid, Some(0))
        .await
    {
        Ok(()) => {}
        Err(e) => assert_eq!(e.as_code(), 3021, "delete of a missing offset: {e:?}"),
    }
    assert!(
        client
            .get_consumer_offset(&consumer, &sid, &tid, Some(0))
            .await
            .unwrap()
            .is_none()
    );
    server.stop();
}

/// Auto-commit on a freshly connected client (the SDK sends GetClusterMetadata before the first
/// auto-commit poll, §4.4 / item 29), and string consumer ids are distinct from numeric ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_commit_on_fresh_clients_and_consumer_identity() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let setup_client = root_client(server.addr()).await;
    let (s, t) = setup(&setup_client, 1).await;

    let mut seen = BTreeSet::new();
    // Each round uses a brand-new client: auto-commit must persist server-side.
    for _ in 0..30 {
        let c = root_client(server.addr()).await;
        let polled = poll_next(&c, s, t, None, &Consumer::new(id_name("fresh")), 20, true).await;
        if polled.messages.is_empty() {
            break;
        }
        for m in &polled.messages {
            assert!(
                seen.insert(m.header.offset),
                "offset {} delivered twice",
                m.header.offset
            );
        }
    }
    assert_eq!(seen.len() as u64, MESSAGES);
    assert_eq!(
        seen.iter().copied().collect::<Vec<_>>(),
        (0..MESSAGES).collect::<Vec<_>>()
    );

    // The numeric consumer 1 has nothing stored.
    let num = Consumer::new(id_num(1));
    assert!(
        setup_client
            .get_consumer_offset(&num, &id_num(s), &id_num(t), None)
            .await
            .unwrap()
            .is_none()
    );
    // Auto-commit with nothing returned stores nothing.
    let empty_topic = setup_client
        .create_topic(&id_num(s), "empty", &topic_opts(1))
        .await
        .unwrap();
    let polled = poll_next(&setup_client, s, empty_topic.id, None, &num, 10, true).await;
    assert!(polled.messages.is_empty());
    assert!(
        setup_client
            .get_consumer_offset(&num, &id_num(s), &id_num(empty_topic.id), None)
            .await
            .unwrap()
            .is_none()
    );
    server.stop();
}

/// §11 items 27/28 at the byte level.
#[tokio::test]
async fn raw_consumer_offset_replies() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let mut raw = RawConn::connect(server.addr()).await;
    raw.login_root().await;
    let f = raw
        .call(code::CREATE_STREAM, &enc::create_stream("raw-off"))
        .await;
    let (st, _) = rec::stream_details(f.ok_payload());
    let f = raw
        .call(code::CREATE_TOPIC, &enc::create_topic(st.id, 1, "t"))
        .await;
    let (tp, _) = rec::topic_details(f.ok_payload());
    let (s, t) = (st.id, tp.id);
    let b = batch::encode(&(0..10).map(|i| batch::simple(i + 1, b"m")).collect::<Vec<_>>());
    let f = raw
        .call(code::SEND_MESSAGES, &enc::send_messages(s, t, 0, &b))
        .await;
    let _ = f.ok_payload();

    // Get with nothing stored → OK, empty body.
    let f = raw
        .call(
            code::GET_CONSUMER_OFFSET,
            &enc::consumer_offset_target(5, s, t, None),
        )
        .await;
    assert!(f.ok_payload().is_empty(), "missing offset → empty body");

    // Auto-commit poll of Next stores the last returned offset.
    let f = raw
        .call(code::POLL_MESSAGES, &enc::poll(5, s, t, None, (5, 0), 4, true))
        .await;
    let r = poll::decode(f.ok_payload());
    assert_eq!(r.offsets(), vec![0, 1, 2, 3]);
    let f = raw
        .call(
            code::GET_CONSUMER_OFFSET,
            &enc::consumer_offset_target(5, s, t, None),
        )
        .await;
    let body = f.ok_payload().to_vec();
    assert_eq!(body.len(), 20, "[partition u32][current u64][stored u64]");
    let mut c = rec::Cursor::new(&body);
    assert_eq!(c.u32(), 0);
    assert_eq!(c.u64(), 9, "current offset");
    assert_eq!(c.u64(), 3, "stored offset");

    // Store → op 161, body exactly [0u32].
    let f = raw
        .call(code::STORE_CONSUMER_OFFSET, &enc::store_offset(5, s, t, None, 7))
        .await;
    assert_eq!(f.operation(), op::STORE_CONSUMER_OFFSET);
    assert_eq!(f.ok_payload().len(), 0);
    assert_eq!(f.body, vec![0, 0, 0, 0], "store reply = [0u32]");
    let f = raw
        .call(code::POLL_MESSAGES, &enc::poll(5, s, t, None, (5, 0), 10, false))
        .await;
    assert_eq!(poll::decode(f.ok_payload()).offsets(), vec![8, 9]);

    // Delete → op 162, body exactly [0u32]; then Get is empty and Next restarts at 0.
    let f = raw
        .call(code::DELETE_CONSUMER_OFFSET, &enc::delete_offset(5, s, t, None))
        .await;
    assert_eq!(f.operation(), op::DELETE_CONSUMER_OFFSET);
    assert_eq!(f.body, vec![0, 0, 0, 0], "delete reply = [0u32]");
    let f = raw
        .call(
            code::GET_CONSUMER_OFFSET,
            &enc::consumer_offset_target(5, s, t, None),
        )
        .await;
    assert!(f.ok_payload().is_empty());
    let f = raw
        .call(code::POLL_MESSAGES, &enc::poll(5, s, t, None, (5, 0), 2, false))
        .await;
    assert_eq!(poll::decode(f.ok_payload()).offsets(), vec![0, 1]);
    server.stop();
}
