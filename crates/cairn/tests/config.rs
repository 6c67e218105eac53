//! The launch contract: `--config <file.toml>` supplies the data dir, listen address and
//! segment size; a restart with the same file finds the data again.

mod common;

use common::*;
use iggy::prelude::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_file_supplies_data_dir_address_and_segment_size() {
    let dir = temp_dir();
    let data = dir.path().join("data");
    let config = dir.path().join("cairn.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = {:?}\n\n[tcp]\naddress = \"127.0.0.1:0\"\n\n[storage]\nsegment_size_bytes = 4096\n",
            data.to_str().unwrap()
        ),
    )
    .unwrap();
    let cfg = config.to_str().unwrap();

    let server = TestServer::start_args(&data, &["--config", cfg], &[]);
    let client = root_client(server.addr()).await;
    let (s, t) = create_stream_topic(&client, "cfg", "t", 1).await;
    for b in 0..10u128 {
        let mut msgs: Vec<IggyMessage> = (0..10u128)
            .map(|i| sdk_message(b * 10 + i + 1, vec![b as u8; 500]))
            .collect();
        client
            .send_messages(&id_num(s), &id_num(t), &Partitioning::partition_id(0), &mut msgs)
            .await
            .unwrap();
    }
    let topic = client.get_topic(&id_num(s), &id_num(t)).await.unwrap().unwrap();
    assert!(
        topic.partitions[0].segments_count > 1,
        "50 KB with segment_size_bytes = 4096 from the config file must rotate segments (got {})",
        topic.partitions[0].segments_count
    );
    drop(client);
    server.stop();
    assert!(data.is_dir(), "data_dir from the config file was used");

    let server = TestServer::start_args(&data, &["--config", cfg], &[]);
    let client = root_client(server.addr()).await;
    let all = poll_all(&client, s, t, 0, 33, 100).await;
    assert_eq!(all.len(), 100);
    assert_eq!(all[99].header.id, 100);
    drop(client);
    server.stop();
}
