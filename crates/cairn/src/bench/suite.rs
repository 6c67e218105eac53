//! `cairn bench --suite`: the standard shapes of issue 5, each on a server the bench starts
//! itself, repeated, and written up as a markdown section for `docs/PERFORMANCE.md`.

use super::report::{Report, format_us};
use super::stats::median;
use super::workload::{BenchArgs, DurabilityLabel, Workload};
use std::process::ExitCode;

/// Batches per actor at `--suite-scale 1` (8 producers x 100 x 1 MB = 800 MB per run).
const BASE_BATCHES: f64 = 100.0;

struct Shape {
    title: &'static str,
    args: BenchArgs,
}

fn shapes(base: &BenchArgs) -> Vec<Shape> {
    let batches = (BASE_BATCHES * base.suite_scale).round().max(1.0) as u64;
    let shape = |workload: Workload, actors: usize, durability: DurabilityLabel, rate: Option<u64>| {
        let mut args = base.clone();
        args.workload = workload;
        args.producers = actors;
        args.consumers = actors;
        args.streams = Some(actors);
        args.partitions = 1;
        args.message_size = 1000;
        args.messages_per_batch = 1000;
        args.batches = batches;
        args.rate_limit = rate;
        args.durability = durability;
        // The ceilings run no server.
        args.start_server = !workload.is_ceiling();
        args.keep = false;
        args.suite = false;
        args.output_json = None;
        args.output_html = None;
        args.server_pid = None;
        args
    };
    vec![
        Shape {
            title: "8 producers × 8 streams",
            args: shape(Workload::PinnedProducer, 8, DurabilityLabel::Durable, None),
        },
        Shape {
            title: "disk ceiling: 8 writers, write + fdatasync per 1 MB",
            args: shape(Workload::DiskCeiling, 8, DurabilityLabel::Durable, None),
        },
        Shape {
            title: "ingest ceiling: 8 loopback pairs, receive + append + 2 barriers per 1 MB",
            args: shape(Workload::IngestCeiling, 8, DurabilityLabel::Durable, None),
        },
        Shape {
            title: "8 producers × 8 streams",
            args: shape(Workload::PinnedProducer, 8, DurabilityLabel::Relaxed, None),
        },
        Shape {
            title: "disk ceiling: 8 writers, buffered write per 1 MB, no fdatasync",
            args: shape(Workload::DiskCeiling, 8, DurabilityLabel::Relaxed, None),
        },
        Shape {
            title: "ingest ceiling: 8 loopback pairs, receive + buffered append per 1 MB",
            args: shape(Workload::IngestCeiling, 8, DurabilityLabel::Relaxed, None),
        },
        Shape {
            title: "8 pinned consumers × 8 streams",
            args: shape(Workload::PinnedConsumer, 8, DurabilityLabel::Durable, None),
        },
        Shape {
            title: "serve ceiling: 8 loopback pairs, read + XXH3 + sendfile per 1 MB",
            args: shape(Workload::ServeCeiling, 8, DurabilityLabel::Durable, None),
        },
        Shape {
            title: "1 producer at 100 MB/s",
            args: shape(
                Workload::PinnedProducer,
                1,
                DurabilityLabel::Durable,
                Some(100_000_000),
            ),
        },
        Shape {
            title: "disk ceiling: 1 writer at 100 MB/s, write + fdatasync per 1 MB",
            args: shape(
                Workload::DiskCeiling,
                1,
                DurabilityLabel::Durable,
                Some(100_000_000),
            ),
        },
        // The same rate in 100 KB sends (10x the sends, same bytes): the latency of a send
        // whose barrier is not dominated by its own size.
        Shape {
            title: "1 producer at 100 MB/s, 100-message batches",
            args: small_batches(shape(
                Workload::PinnedProducer,
                1,
                DurabilityLabel::Durable,
                Some(100_000_000),
            )),
        },
        Shape {
            title: "disk ceiling: 1 writer at 100 MB/s, write + fdatasync per 100 KB",
            args: small_batches(shape(
                Workload::DiskCeiling,
                1,
                DurabilityLabel::Durable,
                Some(100_000_000),
            )),
        },
        Shape {
            title: "ingest ceiling: 1 loopback pair at 100 MB/s, receive + append + 2 barriers per 100 KB",
            args: small_batches(shape(
                Workload::IngestCeiling,
                1,
                DurabilityLabel::Durable,
                Some(100_000_000),
            )),
        },
    ]
}

/// 100-message batches, ten times as many: the same bytes per actor.
fn small_batches(mut args: BenchArgs) -> BenchArgs {
    args.messages_per_batch = 100;
    args.batches = args.batches.saturating_mul(10);
    args
}

pub fn run(base: &BenchArgs, runtime: &tokio::runtime::Runtime) -> ExitCode {
    let shapes = shapes(base);
    let mut results: Vec<(Shape, Vec<Report>)> = Vec::new();
    for shape in shapes {
        if let Err(error) = shape.args.validate() {
            eprintln!("cairn bench --suite: {error}");
            return ExitCode::from(2);
        }
        let mut reports = Vec::new();
        for run in 1..=base.suite_runs {
            eprintln!(
                "cairn bench --suite: {} ({}), run {run} of {}",
                shape.title,
                shape.args.durability.name(),
                base.suite_runs
            );
            match super::run_once(&shape.args, runtime, true) {
                Ok(report) => {
                    eprint!("{}", super::report::table(&report));
                    reports.push(report);
                }
                Err(error) => {
                    eprintln!("cairn bench --suite: {} failed: {error}", shape.title);
                    return ExitCode::FAILURE;
                }
            }
        }
        results.push((shape, reports));
    }
    let text = markdown(base, &results);
    print!("{text}");
    if let Some(path) = &base.suite_markdown
        && let Err(error) = std::fs::write(path, &text)
    {
        eprintln!("cairn bench --suite: cannot write {}: {error}", path.display());
        return ExitCode::FAILURE;
    }
    if let Some(path) = &base.output_json {
        let all: Vec<&Report> = results.iter().flat_map(|(_, reports)| reports.iter()).collect();
        let written = serde_json::to_string_pretty(&all)
            .map_err(|e| e.to_string())
            .and_then(|json| std::fs::write(path, json + "\n").map_err(|e| e.to_string()));
        if let Err(error) = written {
            eprintln!("cairn bench --suite: cannot write {}: {error}", path.display());
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

/// The runs that count: all but the first (cold) one when there are two or more.
fn kept(reports: &[Report]) -> &[Report] {
    if reports.len() >= 2 {
        &reports[1..]
    } else {
        reports
    }
}

fn markdown(base: &BenchArgs, results: &[(Shape, Vec<Report>)]) -> String {
    let runs = base.suite_runs;
    let batches = results.first().map_or(0, |(shape, _)| shape.args.batches);
    let mut out = String::new();
    out.push_str("## `cairn bench --suite`\n\n");
    out.push_str(&format!(
        "Server and load generator on the same host over loopback; this machine's 2 cores are \
         shared and noisy. {} Every shape runs on a fresh server started by the bench \
         (`--start-server`, temporary data directory) and deletes its streams afterwards. \
         Batches are 1 000 messages × 1 000 B, {batches} batches per actor (`--suite-scale {}`; \
         the shapes marked 100-message batches send ten times as many of a tenth the size). \
         MB = 10⁶ B, GB = 10⁹ B. Throughput is total payload over wall time (first send to last \
         reply); latency is per request (a send until its acknowledgement, a poll until its \
         reply) over all samples of all actors. A *disk ceiling* row runs no server: the same \
         number of writers each write batch-sized blocks to their own file in the same kind of \
         temporary directory, one `fdatasync` per block, which is the barrier a durable send \
         needs and nothing else (without it for `relaxed`); its CPU column is the writers' own \
         CPU time, what moving the bytes through the kernel's buffered write path costs. \
         An *ingest ceiling* row adds the network: pairs of threads on loopback connections, \
         one sends each block, the other receives it into a reused buffer, appends it to its \
         file and answers (durable: after an `fdatasync` of the data and an in-place 4 KiB \
         frontier write with its own `fdatasync`, the two barriers of Cairn's contract). A \
         *serve ceiling* row: one thread asks, the other reads the block from its cached file, \
         checks its XXH3 and `sendfile`s it. Their server CPU column is the serving threads' \
         CPU, the client column the asking threads'. The client CPU column of a server row is \
         the bench process's own CPU (the SDK clients) over the measured phase; both share \
         the same 2 cores, so (server + client CPU s/GB) × MB/s cannot exceed 2 cores.\n\n",
        if runs >= 3 {
            format!("Each figure is the median of runs 2–{runs} of {runs} (the first, cold, run discarded).")
        } else if runs == 2 {
            "Each figure is from run 2 of 2 (the first, cold, run discarded; not a median).".to_string()
        } else {
            "One run per shape (nothing discarded: not a measurement to quote).".to_string()
        },
        base.suite_scale
    ));
    out.push_str(&format!(
        "Suite command: `cairn bench --suite --suite-scale {} --suite-runs {runs}`\n\n",
        base.suite_scale
    ));
    out.push_str("| shape | durability | MB/s | msgs/s | p50 | p90 | p99 | p999 | max | server CPU s/GB | client CPU s/GB |\n");
    out.push_str("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (shape, reports) in results {
        let kept = kept(reports);
        let phases: Vec<_> = kept
            .iter()
            .filter_map(|r| r.send.as_ref().or(r.poll.as_ref()))
            .collect();
        let med = |f: &dyn Fn(&super::stats::PhaseSummary) -> f64| {
            median(&phases.iter().map(|p| f(p)).collect::<Vec<_>>())
        };
        let cpu_median = |cpu: &dyn Fn(&Report) -> Option<f64>| {
            let cpu: Vec<f64> = kept.iter().filter_map(cpu).collect();
            if cpu.is_empty() {
                "–".to_string()
            } else {
                format!("{:.3}", median(&cpu))
            }
        };
        out.push_str(&format!(
            "| {}{} | {} | {:.1} | {:.0} | {} | {} | {} | {} | {} | {} | {} |\n",
            shape.title,
            match shape.args.workload {
                workload if workload.is_ceiling() => " (no server)",
                Workload::PinnedConsumer => " (served)",
                _ => " (ingested)",
            },
            shape.args.durability.name(),
            med(&|p| p.throughput_mb_per_s),
            med(&|p| p.messages_per_s),
            format_us(med(&|p| p.latency.p50_us as f64) as u64),
            format_us(med(&|p| p.latency.p90_us as f64) as u64),
            format_us(med(&|p| p.latency.p99_us as f64) as u64),
            format_us(med(&|p| p.latency.p999_us as f64) as u64),
            format_us(med(&|p| p.latency.max_us as f64) as u64),
            cpu_median(&|r| r.server_cpu.as_ref().map(|c| c.cpu_seconds_per_gb)),
            cpu_median(&|r| r.client_cpu.as_ref().map(|c| c.cpu_seconds_per_gb)),
        ));
    }
    out.push_str("\nRaw MB/s per run (the first is the cold run):\n\n");
    for (shape, reports) in results {
        let raw: Vec<String> = reports
            .iter()
            .filter_map(|r| r.send.as_ref().or(r.poll.as_ref()))
            .map(|p| format!("{:.1}", p.throughput_mb_per_s))
            .collect();
        out.push_str(&format!(
            "- {}, {}: {}\n",
            shape.title,
            shape.args.durability.name(),
            raw.join(" / ")
        ));
    }
    out.push_str("\nOne run of each shape:\n\n```sh\n");
    for (shape, _) in results {
        out.push_str(&shape.args.to_command_line());
        out.push('\n');
    }
    out.push_str("```\n");
    out
}
