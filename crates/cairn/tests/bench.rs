//! `cairn bench` runs a tiny workload against a real server and emits a well-formed report.
//! (The bench's figures are benchmarks, not tests: only the report's shape and consistency are
//! checked here.)

mod common;

use common::*;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const BENCH_TIMEOUT: Duration = Duration::from_secs(60);

/// Run the built `cairn bench` with `args`, bounded by [`BENCH_TIMEOUT`].
fn cairn_bench(args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_cairn"));
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("CAIRN_") {
            command.env_remove(&name);
        }
    }
    let mut child = command
        .arg("bench")
        .args(args)
        .env("CAIRN_ROOT_PASSWORD", ROOT_PASSWORD)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn cairn bench");
    let deadline = Instant::now() + BENCH_TIMEOUT;
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("cairn bench {args:?} ran longer than {BENCH_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().expect("output");
    eprintln!(
        "cairn bench {args:?}\nstdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn f64_of(value: &serde_json::Value, path: &[&str]) -> f64 {
    let mut v = value;
    for key in path {
        v = &v[*key];
    }
    v.as_f64()
        .unwrap_or_else(|| panic!("{path:?} is not a number in the report"))
}

/// The phase's totals and percentiles are consistent.
fn check_phase(report: &serde_json::Value, phase: &str, expected_messages: u64, message_size: u64) {
    let p = &report[phase];
    assert_eq!(
        p["messages"].as_u64(),
        Some(expected_messages),
        "{phase} messages"
    );
    assert_eq!(
        p["payload_bytes"].as_u64(),
        Some(expected_messages * message_size),
        "{phase} bytes"
    );
    assert!(f64_of(p, &["throughput_bytes_per_s"]) > 0.0);
    assert!(f64_of(p, &["messages_per_s"]) > 0.0);
    let wall = f64_of(p, &["wall_seconds"]);
    let throughput = f64_of(p, &["throughput_bytes_per_s"]);
    assert!(
        ((expected_messages * message_size) as f64 / wall - throughput).abs() / throughput < 1e-6,
        "throughput = bytes / wall time"
    );
    let l = &p["latency"];
    let (p50, p90, p99, p999, max) = (
        f64_of(l, &["p50_us"]),
        f64_of(l, &["p90_us"]),
        f64_of(l, &["p99_us"]),
        f64_of(l, &["p999_us"]),
        f64_of(l, &["max_us"]),
    );
    assert!(p50 <= p90 && p90 <= p99 && p99 <= p999 && p999 <= max, "{l}");
    assert!(max > 0.0);
}

#[test]
fn bench_reports_a_tiny_producer_and_consumer_run() {
    let dir = temp_dir();
    let server = TestServer::start(&dir.path().join("data"));
    let address = server.addr().to_string();
    let pid = server.pid().to_string();
    let out = dir.path().join("out");
    std::fs::create_dir_all(&out).expect("out dir");
    let json = out.join("producers.json");
    let html = out.join("producers.html");
    let common = [
        "--server-address",
        &address,
        "--server-pid",
        &pid,
        "--streams",
        "2",
        "--batches",
        "10",
        "--messages-per-batch",
        "10",
        "--message-size",
        "100",
    ];
    let mut args = vec!["pinned-producer", "--producers", "2"];
    args.extend_from_slice(&common);
    args.extend_from_slice(&[
        "--output-json",
        json.to_str().expect("utf-8"),
        "--output-html",
        html.to_str().expect("utf-8"),
    ]);
    let output = cairn_bench(&args);
    assert!(output.status.success(), "cairn bench failed: {:?}", output.status);
    assert!(String::from_utf8_lossy(&output.stdout).contains("MB/s"));

    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("json written")).expect("json parses");
    // 2 producers x 10 batches x 10 messages.
    check_phase(&report, "send", 2 * 10 * 10, 100);
    assert_eq!(report["totals"]["messages"].as_u64(), Some(200));
    assert!(f64_of(&report, &["totals", "throughput_bytes_per_s"]) > 0.0);
    assert!(report["poll"].is_null());
    assert_eq!(report["parameters"]["producers"].as_u64(), Some(2));
    assert!(
        report["command_line"]
            .as_str()
            .expect("command line")
            .contains("pinned-producer")
    );
    let cpu = &report["server_cpu"];
    assert_eq!(cpu["pid"].as_u64(), Some(u64::from(server.pid())));
    assert!(f64_of(cpu, &["cpu_seconds"]) >= 0.0);
    // The bench's own CPU (its SDK clients), over the same bytes.
    let client_cpu = &report["client_cpu"];
    assert_ne!(client_cpu["pid"].as_u64(), Some(u64::from(server.pid())));
    assert!(f64_of(client_cpu, &["cpu_seconds"]) >= 0.0);
    assert!((f64_of(client_cpu, &["gb_ingested"]) - 2.0 * 10.0 * 10.0 * 100.0 / 1e9).abs() < 1e-12);
    let series = report["time_series"].as_array().expect("time series");
    assert!(!series.is_empty());
    let series_messages: u64 = series.iter().filter_map(|b| b["messages"].as_u64()).sum();
    assert_eq!(series_messages, 200, "the time series accounts for every message");
    let page = std::fs::read_to_string(&html).expect("html written");
    assert!(page.contains("<svg"), "the page has charts");
    assert!(!page.contains("<script"), "self-contained, no scripts");

    // Pinned consumers: data produced first by the same run, then polled and measured.
    let json = out.join("consumers.json");
    let mut args = vec!["pinned-consumer", "--consumers", "2"];
    args.extend_from_slice(&common);
    args.extend_from_slice(&["--output-json", json.to_str().expect("utf-8")]);
    let output = cairn_bench(&args);
    assert!(
        output.status.success(),
        "cairn bench pinned-consumer failed: {:?}",
        output.status
    );
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("json written")).expect("json parses");
    check_phase(&report, "poll", 2 * 10 * 10, 100);
    assert!(report["send"].is_null());

    // The bench deleted its streams: nothing named bench-* is left.
    let streams = tokio::runtime::Runtime::new().expect("runtime").block_on(async {
        use iggy::prelude::*;
        root_client(server.addr())
            .await
            .get_streams()
            .await
            .expect("streams")
    });
    assert!(
        streams.iter().all(|s| !s.name.starts_with("bench-")),
        "left behind: {streams:?}"
    );
    server.stop();
}

#[test]
fn disk_ceiling_writes_and_syncs_every_block_then_removes_its_files() {
    let dir = temp_dir();
    let json = dir.path().join("disk.json");
    let output = cairn_bench(&[
        "disk-ceiling",
        "--producers",
        "3",
        "--batches",
        "4",
        "--messages-per-batch",
        "5",
        "--message-size",
        "1000",
        "--server-data-parent",
        dir.path().to_str().expect("utf-8"),
        "--output-json",
        json.to_str().expect("utf-8"),
    ]);
    assert!(
        output.status.success(),
        "cairn bench disk-ceiling failed: {:?}",
        output.status
    );
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("json written")).expect("json parses");
    // 3 writers x 4 blocks of 5 x 1000 B, each block one sample.
    check_phase(&report, "send", 3 * 4 * 5, 1000);
    assert_eq!(report["send"]["requests"].as_u64(), Some(12), "{report}");
    // No server: the CPU figure is the writers' own (this bench process).
    let cpu = &report["server_cpu"];
    assert!(f64_of(cpu, &["cpu_seconds"]) >= 0.0);
    assert!((f64_of(cpu, &["gb_ingested"]) - 3.0 * 4.0 * 5.0 * 1000.0 / 1e9).abs() < 1e-12);
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .expect("read dir")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("cairn-bench-disk-"))
        .collect();
    assert!(left.is_empty(), "files left behind: {left:?}");
}

/// Run a loopback ceiling workload with 2 pairs x 3 blocks of 4 x 1000 B; its report.
fn loopback_ceiling(
    workload: &str,
    durability: &str,
    extra: &[&str],
    dir: &std::path::Path,
) -> serde_json::Value {
    let json = dir.join(format!("{workload}-{durability}-{}.json", extra.len()));
    let mut args = vec![
        workload,
        "--producers",
        "2",
        "--consumers",
        "2",
        "--batches",
        "3",
        "--messages-per-batch",
        "4",
        "--message-size",
        "1000",
        "--durability",
        durability,
        "--server-data-parent",
        dir.to_str().expect("utf-8"),
        "--output-json",
        json.to_str().expect("utf-8"),
    ];
    args.extend_from_slice(extra);
    let output = cairn_bench(&args);
    assert!(
        output.status.success(),
        "cairn bench {workload} failed: {:?}",
        output.status
    );
    serde_json::from_slice(&std::fs::read(&json).expect("json written")).expect("json parses")
}

#[test]
fn loopback_ceilings_move_every_block_and_report_both_sides_cpu() {
    let dir = temp_dir();
    let bytes = 2.0 * 3.0 * 4.0 * 1000.0 / 1e9;
    for durability in ["durable", "relaxed"] {
        let report = loopback_ceiling("ingest-ceiling", durability, &[], dir.path());
        check_phase(&report, "send", 2 * 3 * 4, 1000);
        assert_eq!(report["send"]["requests"].as_u64(), Some(6), "{report}");
        assert!(report["poll"].is_null());
        for side in ["server_cpu", "client_cpu"] {
            assert!(f64_of(&report[side], &["cpu_seconds"]) >= 0.0, "{side}");
            assert!(
                (f64_of(&report[side], &["gb_ingested"]) - bytes).abs() < 1e-12,
                "{side}"
            );
        }
    }
    for extra in [&[][..], &["--unverified"][..]] {
        let report = loopback_ceiling("serve-ceiling", "durable", extra, dir.path());
        check_phase(&report, "poll", 2 * 3 * 4, 1000);
        assert_eq!(report["poll"]["requests"].as_u64(), Some(6), "{report}");
        assert!(report["send"].is_null());
        for side in ["server_cpu", "client_cpu"] {
            assert!(
                (f64_of(&report[side], &["gb_served"]) - bytes).abs() < 1e-12,
                "{side}"
            );
        }
    }
    // --unverified names the serve ceiling's variant only.
    let output = cairn_bench(&["ingest-ceiling", "--unverified"]);
    assert_eq!(output.status.code(), Some(2));
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .expect("read dir")
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("cairn-bench-loopback-")
        })
        .collect();
    assert!(left.is_empty(), "files left behind: {left:?}");
}

#[test]
fn bench_refuses_bad_parameters_without_touching_a_server() {
    let output = cairn_bench(&["--messages-per-batch", "0", "--server-address", "127.0.0.1:9"]);
    assert_eq!(output.status.code(), Some(2));
    let output = cairn_bench(&[
        "balanced-producer-and-consumer-group",
        "--producers",
        "1",
        "--streams",
        "2",
    ]);
    assert_eq!(output.status.code(), Some(2));
}

#[test]
fn bench_suite_writes_markdown_tables() {
    let dir = temp_dir();
    let markdown = dir.path().join("suite.md");
    let output = cairn_bench(&[
        "--suite",
        "--suite-scale",
        "0.01",
        "--suite-runs",
        "1",
        "--server-data-parent",
        dir.path().to_str().expect("utf-8"),
        "--suite-markdown",
        markdown.to_str().expect("utf-8"),
    ]);
    assert!(
        output.status.success(),
        "cairn bench --suite failed: {:?}",
        output.status
    );
    let text = std::fs::read_to_string(&markdown).expect("markdown written");
    assert!(text.contains("| shape | durability | MB/s |"), "{text}");
    assert!(text.contains("| server CPU s/GB | client CPU s/GB |"), "{text}");
    for row in [
        "8 producers × 8 streams (ingested) | durable",
        "8 producers × 8 streams (ingested) | relaxed",
        "8 pinned consumers",
        "1 producer at 100 MB/s",
        "disk ceiling: 8 writers, write + fdatasync per 1 MB (no server) | durable",
        "disk ceiling: 1 writer at 100 MB/s",
        "1 producer at 100 MB/s, 100-message batches (ingested) | durable",
        "disk ceiling: 1 writer at 100 MB/s, write + fdatasync per 100 KB (no server)",
        "ingest ceiling: 8 loopback pairs, receive + append + 2 barriers per 1 MB (no server) | durable",
        "ingest ceiling: 8 loopback pairs, receive + buffered append per 1 MB (no server) | relaxed",
        "serve ceiling: 8 loopback pairs, read + XXH3 + sendfile per 1 MB (no server)",
        "ingest ceiling: 1 loopback pair at 100 MB/s",
    ] {
        assert!(text.contains(row), "missing row {row:?} in\n{text}");
    }
    assert!(
        text.contains("cairn bench pinned-producer --durability relaxed"),
        "{text}"
    );
    assert!(text.contains("```sh"), "{text}");
    // Every server's temporary data directory was removed.
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .expect("read dir")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("cairn-bench-"))
        .collect();
    assert!(left.is_empty(), "data directories left behind: {left:?}");
}
