//! Group-commit benchmark (a benchmark, not a test): N concurrent producers, each with its own
//! SDK connection, send batches to ONE partition of a `cairn` server in `durable` mode. It
//! reports throughput, per-send latency percentiles over all samples, and the server's own
//! group-commit totals (sends per barrier). With `--strace` the server runs under
//! `strace -f` and the benchmark counts, for the send phase only, the file creations,
//! renames, directory syncs and data barriers per acknowledged send.
//!
//! Run (release build of the server first):
//!
//! ```sh
//! cargo build --release -p cairn
//! cargo run --release -p cairn --example group_commit_bench -- --producers 32 --strace
//! ```
//!
//! Flags: `--producers N` (32), `--sends N` sends per producer (200), `--messages N` per send
//! (10), `--size BYTES` per message (1000), `--server PATH` (target/release/cairn),
//! `--strace`.

use iggy::prelude::*;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

struct Options {
    producers: usize,
    sends: usize,
    messages: usize,
    size: usize,
    server: String,
    strace: bool,
}

fn parse_options() -> Options {
    let mut options = Options {
        producers: 32,
        sends: 200,
        messages: 10,
        size: 1000,
        server: "target/release/cairn".to_string(),
        strace: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut number = |name: &str| -> usize {
            args.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{name} needs a number"))
        };
        match flag.as_str() {
            "--producers" => options.producers = number("--producers"),
            "--sends" => options.sends = number("--sends"),
            "--messages" => options.messages = number("--messages"),
            "--size" => options.size = number("--size"),
            "--server" => options.server = args.next().expect("--server needs a path"),
            "--strace" => options.strace = true,
            other => panic!("unknown flag {other}"),
        }
    }
    options
}

fn now_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn percentile(sorted_us: &[u64], p: f64) -> u64 {
    if sorted_us.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * (sorted_us.len() - 1) as f64).round() as usize;
    sorted_us[rank.min(sorted_us.len() - 1)]
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let options = parse_options();
    let data_dir = tempfile::tempdir().expect("temp dir");
    let strace_log = data_dir.path().join("strace.log");
    let password = "bench-password";
    let mut command = if options.strace {
        let mut c = Command::new("strace");
        c.args(["-f", "-ttt", "-o"])
            .arg(&strace_log)
            .args([
                "-e",
                "trace=openat,creat,rename,renameat,renameat2,fsync,fdatasync,mkdir,mkdirat",
            ])
            .arg(&options.server);
        c
    } else {
        Command::new(&options.server)
    };
    let mut server = command
        .args(["serve", "--tcp-address", "127.0.0.1:0", "--data-dir"])
        .arg(data_dir.path().join("data"))
        .env("CAIRN_ROOT_PASSWORD", password)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the server (build it with `cargo build --release -p cairn`)");
    let stdout = server.stdout.take().expect("stdout");
    let mut address = String::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("server stdout");
        if let Some(rest) = line.strip_prefix("CAIRN_READY tcp=") {
            address = rest.to_string();
            break;
        }
    }
    assert!(!address.is_empty(), "server never became ready");
    let stderr = server.stderr.take().expect("stderr");
    let logs = std::thread::spawn(move || {
        BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<String>>()
    });

    let connection = format!("iggy://iggy:{password}@{address}");
    let setup = IggyClient::from_connection_string(&connection).expect("client");
    setup.connect().await.expect("connect");
    setup.create_stream("bench").await.expect("create stream");
    setup
        .create_topic(
            &Identifier::named("bench").expect("id"),
            "t",
            &TopicCreateOptions {
                partitions_count: Some(1),
                ..Default::default()
            },
        )
        .await
        .expect("create topic");

    let mut clients = Vec::new();
    for _ in 0..options.producers {
        let client = IggyClient::from_connection_string(&connection).expect("client");
        client.connect().await.expect("connect");
        clients.push(Arc::new(client));
    }
    let payload = bytes::Bytes::from(vec![7u8; options.size]);
    let phase_start_s = now_s();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for client in clients {
        let payload = payload.clone();
        let (sends, messages) = (options.sends, options.messages);
        tasks.push(tokio::spawn(async move {
            let stream = Identifier::named("bench").expect("id");
            let topic = Identifier::named("t").expect("id");
            let partitioning = Partitioning::partition_id(0);
            let mut latencies_us = Vec::with_capacity(sends);
            for _ in 0..sends {
                let mut batch: Vec<IggyMessage> = (0..messages)
                    .map(|_| {
                        IggyMessage::builder()
                            .payload(payload.clone())
                            .build()
                            .expect("message")
                    })
                    .collect();
                let sent = Instant::now();
                client
                    .send_messages(&stream, &topic, &partitioning, &mut batch)
                    .await
                    .expect("send");
                latencies_us.push(sent.elapsed().as_micros() as u64);
            }
            latencies_us
        }));
    }
    let mut latencies_us = Vec::new();
    for task in tasks {
        latencies_us.extend(task.await.expect("producer"));
    }
    let elapsed = started.elapsed();
    let phase_end_s = now_s();
    latencies_us.sort_unstable();

    // Clean stop: the server logs its group-commit totals.
    // Under strace the child is strace itself: signal the traced server, its child.
    let mut pid = server.id() as i32;
    if options.strace {
        let children =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        if let Some(server_pid) = children.split_whitespace().next().and_then(|p| p.parse().ok()) {
            pid = server_pid;
        }
    }
    // SAFETY: plain kill(2) on a process we started.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(60);
    while server.try_wait().expect("wait").is_none() {
        assert!(Instant::now() < deadline, "server did not stop");
        std::thread::sleep(Duration::from_millis(20));
    }
    let logs = logs.join().expect("logs");
    let totals = logs
        .iter()
        .find(|l| l.contains("group commit totals:"))
        .map(|l| l[l.find("group commit totals:").unwrap_or(0)..].to_string())
        .unwrap_or_else(|| "(no totals line in the server log)".to_string());

    let sends = options.producers * options.sends;
    let payload_bytes = (sends * options.messages * options.size) as f64;
    println!(
        "## group commit: {} producers -> 1 partition, durable mode",
        options.producers
    );
    println!(
        "sends {sends} x {} messages x {} B in {:.2} s: {:.1} MB/s payload, {:.0} sends/s",
        options.messages,
        options.size,
        elapsed.as_secs_f64(),
        payload_bytes / elapsed.as_secs_f64() / 1e6,
        sends as f64 / elapsed.as_secs_f64()
    );
    println!(
        "send latency over all {} samples: p50 {} us, p90 {} us, p99 {} us, p999 {} us, max {} us",
        latencies_us.len(),
        percentile(&latencies_us, 50.0),
        percentile(&latencies_us, 90.0),
        percentile(&latencies_us, 99.0),
        percentile(&latencies_us, 99.9),
        latencies_us.last().copied().unwrap_or(0)
    );
    println!("server: {totals}");

    if options.strace {
        let trace = std::fs::read_to_string(&strace_log).expect("strace log");
        let (mut creates, mut renames, mut fsyncs, mut fdatasyncs, mut mkdirs) =
            (0u64, 0u64, 0u64, 0u64, 0u64);
        for line in trace.lines() {
            // `<pid> <epoch.micros> <syscall>(...)`: keep the send phase only.
            let mut fields = line.split_whitespace();
            let (_, Some(time), Some(call)) = (fields.next(), fields.next(), fields.next()) else {
                continue;
            };
            let Ok(time_s) = time.parse::<f64>() else { continue };
            if time_s < phase_start_s || time_s > phase_end_s {
                continue;
            }
            if call.starts_with("openat(") && line.contains("O_CREAT") || call.starts_with("creat(") {
                creates += 1;
            } else if call.starts_with("rename") {
                renames += 1;
            } else if call.starts_with("fsync(") {
                fsyncs += 1;
            } else if call.starts_with("fdatasync(") {
                fdatasyncs += 1;
            } else if call.starts_with("mkdir") {
                mkdirs += 1;
            }
        }
        println!(
            "strace, send phase: creates {creates}, renames {renames}, mkdirs {mkdirs}, fsync (directory or whole-file syncs) {fsyncs}, fdatasync {fdatasyncs}"
        );
        println!(
            "per acknowledged send: creates {:.3}, renames {:.3}, fsync {:.3}, fdatasync {:.3}",
            creates as f64 / sends as f64,
            renames as f64 / sends as f64,
            fsyncs as f64 / sends as f64,
            fdatasyncs as f64 / sends as f64
        );
    }
}
