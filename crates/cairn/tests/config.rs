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
            "data_dir = {:?}\n\n[tcp]\naddress = \"127.0.0.1:0\"\n\n[http]\naddress = \"127.0.0.1:0\"\n\n[storage]\nsegment_size_bytes = 4096\n",
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

/// Run `cairn serve` with `args` and the environment cleared of CAIRN_* except `env`, expecting
/// it to refuse to start; returns its stderr.
fn refused_start(args: &[&str], env: &[(&str, &str)]) -> String {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"));
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("CAIRN_") {
            command.env_remove(&name);
        }
    }
    command.arg("serve").args(args).envs(env.iter().copied());
    let output = command.output().expect("run cairn");
    assert!(
        !output.status.success(),
        "cairn started with a bad configuration: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    assert_eq!(output.status.code(), Some(2), "configuration errors exit with 2");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn unknown_keys_and_invalid_values_are_refused_by_name() {
    let dir = temp_dir();
    let data = dir.path().join("data");
    let data = data.to_str().expect("utf-8");
    let config = dir.path().join("bad.toml");
    std::fs::write(&config, "[storage]\nsegment_sise_bytes = 4096\n").expect("write config");
    let stderr = refused_start(
        &["--data-dir", data, "--config", config.to_str().expect("utf-8")],
        &[],
    );
    assert!(
        stderr.contains("storage.segment_sise_bytes"),
        "names the unknown file key: {stderr}"
    );

    let stderr = refused_start(&["--data-dir", data], &[("CAIRN_TCP_ADRESS", "127.0.0.1:1")]);
    assert!(
        stderr.contains("CAIRN_TCP_ADRESS"),
        "names the unknown variable: {stderr}"
    );

    let stderr = refused_start(
        &["--data-dir", data],
        &[("CAIRN_STORAGE_DURABILITY", "sometimes")],
    );
    assert!(
        stderr.contains("storage.durability"),
        "names the invalid key: {stderr}"
    );

    let stderr = refused_start(&["--data-dir", data, "--tcp-address", "not-an-address"], &[]);
    assert!(
        stderr.contains("tcp.address"),
        "names the invalid flag's key: {stderr}"
    );
    assert!(
        !std::path::Path::new(data).join("metadata").exists()
            && !std::path::Path::new(data).join("vsr").exists(),
        "nothing was written"
    );
}

/// With no password configured, the first start generates one, prints it once and stores only
/// its hash; it works for login, and a later start neither prints it again nor changes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn root_password_is_generated_once_and_stored_hashed() {
    use std::io::{BufRead, BufReader};
    let dir = temp_dir();
    let data = dir.path().join("data");
    let start = || {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"));
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("CAIRN_") {
                command.env_remove(&name);
            }
        }
        let mut child = command
            .args([
                "serve",
                "--tcp-address",
                "127.0.0.1:0",
                "--http-address",
                "127.0.0.1:0",
                "--data-dir",
            ])
            .arg(&data)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start cairn");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = Vec::new();
        // Bounded by the server's own output: it ends with the readiness line.
        for line in BufReader::new(stdout).lines() {
            let line = line.expect("stdout line");
            let ready = line.starts_with("CAIRN_READY tcp=");
            lines.push(line);
            if ready {
                break;
            }
        }
        (child, lines)
    };
    let stop = |mut child: std::process::Child| {
        // SAFETY: plain kill(2) on our own child.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        assert!(child.wait().expect("wait").success(), "clean stop");
    };
    let address = |lines: &[String]| -> std::net::SocketAddr {
        let ready = lines.last().expect("ready line");
        // `tcp=<addr>` comes first; further fields (`http=`) follow after whitespace.
        ready
            .trim_start_matches("CAIRN_READY tcp=")
            .split_whitespace()
            .next()
            .expect("tcp address")
            .parse()
            .expect("address")
    };

    let (child, lines) = start();
    let generated: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("Generated a password"))
        .collect();
    assert_eq!(generated.len(), 1, "printed exactly once: {lines:?}");
    let password = generated[0].rsplit(' ').next().expect("password").to_string();
    assert!(password.len() >= 16, "a strong generated password: {password}");
    // The metadata log (its journal entries and checkpoints) holds only the hash.
    let log_dir = data.join("vsr").join("metadata");
    let mut files_read = 0;
    for entry in std::fs::read_dir(&log_dir).expect("the metadata log exists") {
        let bytes = std::fs::read(entry.expect("entry").path()).expect("read");
        files_read += 1;
        assert!(
            !bytes.windows(password.len()).any(|w| w == password.as_bytes()),
            "the password itself is never stored"
        );
    }
    assert!(files_read >= 4, "the metadata log's files were not found");
    let client = sdk_client(address(&lines)).await;
    client
        .login_user("iggy", &password)
        .await
        .expect("login with the generated password");
    drop(client);
    stop(child);

    let (child, lines) = start();
    assert!(
        !lines.iter().any(|l| l.contains("Generated a password")),
        "not printed again: {lines:?}"
    );
    let client = sdk_client(address(&lines)).await;
    client
        .login_user("iggy", &password)
        .await
        .expect("the same password still works");
    drop(client);
    stop(child);
    assert_check_healthy(&data);
}

/// A `[cluster]` table of one node is served as one node, and command 12 reports its entry of
/// the node list. The node list and id are recorded at the first start: a later start with
/// another list or id is refused naming the key, and nothing of the data changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_node_cluster_is_served_and_its_node_list_is_kept() {
    let dir = temp_dir();
    let data = dir.path().join("data");
    let data_text = data.to_str().expect("utf-8");
    let write_config = |name: &str, node_id: u32, nodes: &[(u32, &str)]| {
        let mut text = format!("[cluster]\nnode_id = {node_id}\nsecret = \"a-test-secret-of-16+\"\n");
        for (id, replica) in nodes {
            text.push_str(&format!(
                "[[cluster.nodes]]\nid = {id}\ntcp = \"127.0.0.1:{}\"\nhttp = \"127.0.0.1:{}\"\nreplica = \"{replica}\"\n",
                18_400 + id,
                13_400 + id
            ));
        }
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write config");
        path.to_str().expect("utf-8").to_string()
    };
    let one = write_config("one.toml", 1, &[(1, "127.0.0.1:17401")]);

    // One node: served; the listen addresses given explicitly win over the entry's.
    let server = TestServer::start_with(&data, &["--config", &one], &[]);
    let client = root_client(server.addr()).await;
    let metadata = client.get_cluster_metadata().await.expect("cluster metadata");
    assert_eq!(metadata.nodes.len(), 1);
    let node = &metadata.nodes[0];
    assert_eq!(node.name, "cairn-1");
    assert_eq!(node.endpoints.tcp, 18_401, "the address clients are to use");
    assert_eq!(node.endpoints.http, 13_401);
    assert_eq!(node.role, ClusterNodeRole::Leader);
    assert_eq!(node.status, ClusterNodeStatus::Healthy);
    create_stream_topic(&client, "kept", "t", 1).await;
    drop(client);
    server.stop();
    let record = std::fs::read(data.join("membership")).expect("the node list is recorded");

    // Another node list, or another node's id: refused, naming the key; the data stays.
    let moved = write_config("moved.toml", 1, &[(1, "127.0.0.1:17999")]);
    let other = write_config("other.toml", 2, &[(2, "127.0.0.1:17401")]);
    for (config, key) in [(&moved, "cluster.nodes"), (&other, "cluster.node_id")] {
        let output = cairn_command()
            .args(["serve", "--data-dir", data_text, "--tcp-address", "127.0.0.1:0"])
            .args(["--http-address", "127.0.0.1:0", "--config", config])
            .output()
            .expect("run cairn");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "started with a changed node list");
        assert!(
            stderr.contains(key) && stderr.contains("does not match"),
            "{stderr}"
        );
    }
    assert_eq!(std::fs::read(data.join("membership")).expect("record"), record);

    // The same list again, and no [cluster] (a one-node cluster's data serves alone).
    for args in [vec!["--config", one.as_str()], vec![]] {
        let server = TestServer::start_with(&data, &args, &[]);
        let client = root_client(server.addr()).await;
        let streams = client.get_streams().await.expect("streams");
        assert_eq!(streams.len(), 1, "the data is kept");
        drop(client);
        server.stop();
    }
}

/// `cairn` with the environment cleared of CAIRN_* (a test's own knobs must not leak in).
fn cairn_command() -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"));
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("CAIRN_") {
            command.env_remove(&name);
        }
    }
    command.env("CAIRN_ROOT_PASSWORD", ROOT_PASSWORD);
    command
}
