//! `cairn bench`: a load generator driving any Iggy 0.11 server over TCP with the published
//! SDK (`iggy = "=0.11.0"`).
//!
//! - [`workload`]: command line, workload shapes, the rate-limit pacer.
//! - [`actors`]: producers and consumers, one connection each.
//! - [`stats`]: samples, percentiles over all samples, summaries, time series.
//! - [`report`]: the report, its table and JSON; [`chart`]: the HTML page with SVG charts.
//! - [`server`]: `--start-server` and the server's CPU time from `/proc`.
//! - [`disk`]: the `disk-ceiling` workload, the device's barrier ceiling with no server.
//! - [`loopback`]: `ingest-ceiling` and `serve-ceiling`, the kernel's floor for moving a batch
//!   over loopback into or out of a file, with no server.
//! - [`suite`]: `--suite`, the standard shapes and their markdown section.

mod actors;
mod chart;
mod disk;
mod loopback;
mod report;
mod server;
mod stats;
mod suite;
mod workload;

pub use workload::BenchArgs;

use actors::{ActorContext, ActorResult, Connection, ConsumerMode, ConsumerPlan, ProducerPlan};
use iggy::prelude::*;
use indicatif::{ProgressBar, ProgressStyle};
use report::{Parameters, Report, ServerCpu, StorageWrites, Totals};
use stats::{Kind, Sample};
use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};
use workload::{GROUP_NAME, TOPIC_NAME, Workload, stream_name, stream_of};

pub fn run(args: BenchArgs) -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
        )
        .init();
    if let Err(error) = args.validate() {
        eprintln!("cairn bench: {error}");
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("cairn bench: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    if args.suite {
        return suite::run(&args, &runtime);
    }
    match run_once(&args, &runtime, true) {
        Ok(report) => {
            print!("{}", report::table(&report));
            match write_outputs(&args, &report) {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    eprintln!("cairn bench: {error}");
                    ExitCode::FAILURE
                }
            }
        }
        Err(error) => {
            eprintln!("cairn bench: {error}");
            ExitCode::FAILURE
        }
    }
}

fn write_outputs(args: &BenchArgs, report: &Report) -> Result<(), String> {
    if let Some(path) = &args.output_json {
        let json =
            serde_json::to_string_pretty(report).map_err(|e| format!("cannot encode the report: {e}"))?;
        std::fs::write(path, json + "\n").map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    if let Some(path) = &args.output_html {
        std::fs::write(path, chart::html(report))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(())
}

fn password(args: &BenchArgs) -> Option<String> {
    args.password.clone().or_else(|| {
        std::env::var("CAIRN_ROOT_PASSWORD")
            .ok()
            .filter(|p| !p.is_empty())
    })
}

/// One run: start the server if asked, set up, measure, clean up, stop the server.
pub(crate) fn run_once(
    args: &BenchArgs,
    runtime: &tokio::runtime::Runtime,
    progress: bool,
) -> Result<Report, String> {
    match args.workload {
        Workload::DiskCeiling => return disk::run(args),
        Workload::IngestCeiling | Workload::ServeCeiling => return loopback::run(args),
        _ => {}
    }
    let mut started = None;
    let (address, pid, password) = if args.start_server {
        let password = password(args).unwrap_or_else(|| format!("bench-{:016x}", rand::random::<u64>()));
        let server = server::StartedServer::start(args, &password)?;
        let target = (server.address.clone(), Some(server.pid), password);
        started = Some(server);
        target
    } else {
        let password = password(args).ok_or("no password: pass --password or set CAIRN_ROOT_PASSWORD")?;
        (args.server_address.clone(), args.server_pid, password)
    };
    let connection = Connection {
        address: address.clone(),
        username: args.username.clone(),
        password,
        connect_timeout: Duration::from_secs(args.connect_timeout_s.max(1)),
        request_timeout: Duration::from_secs(args.request_timeout_s.max(1)),
    };
    let outcome = runtime.block_on(execute(args, connection, pid, progress));
    if let Some(mut server) = started {
        if outcome.is_err() {
            let tail = server.tail();
            if !tail.is_empty() {
                eprintln!("cairn bench: the server's last log lines:\n{tail}");
            }
        }
        server.stop();
    }
    outcome
}

/// Streams the run uses, created fresh (deleting a leftover bench stream of the same name) or,
/// for `pinned-consumer`, reused when they already hold enough data.
async fn set_up(args: &BenchArgs, connection: &Connection, admin: &IggyClient) -> Result<Vec<usize>, String> {
    let topic = Identifier::named(TOPIC_NAME).map_err(|e| e.to_string())?;
    let mut to_fill = Vec::new();
    for stream in 1..=args.streams() {
        let name = stream_name(stream);
        let id = Identifier::named(&name).map_err(|e| e.to_string())?;
        let existing = connection.bounded("get stream", admin.get_stream(&id)).await?;
        if existing.is_some() && args.workload == Workload::PinnedConsumer {
            let details = connection
                .bounded("get topic", admin.get_topic(&id, &topic))
                .await?;
            if let Some(details) = details
                && details.partitions_count == args.partitions
                && details.messages_count >= args.messages_per_actor()
            {
                continue;
            }
        }
        if existing.is_some() {
            connection
                .bounded("delete stream", admin.delete_stream(&id))
                .await?;
        }
        connection
            .bounded("create stream", admin.create_stream(&name))
            .await?;
        let options = TopicCreateOptions {
            partitions_count: Some(args.partitions),
            ..Default::default()
        };
        connection
            .bounded("create topic", admin.create_topic(&id, TOPIC_NAME, &options))
            .await?;
        if args.workload == Workload::BalancedProducerAndConsumerGroup {
            connection
                .bounded(
                    "create consumer group",
                    admin.create_consumer_group(&id, &topic, GROUP_NAME),
                )
                .await?;
        }
        if args.workload == Workload::PinnedConsumer {
            to_fill.push(stream);
        }
    }
    Ok(to_fill)
}

/// `pinned-consumer` without data: one producer per stream writes what a consumer will read
/// (not measured).
async fn fill(args: &BenchArgs, connection: &Connection, streams: &[usize]) -> Result<(), String> {
    if streams.is_empty() {
        return Ok(());
    }
    eprintln!(
        "cairn bench: producing {} messages into each of {} streams for the consumers (not measured)",
        args.messages_per_actor(),
        streams.len()
    );
    let context = Arc::new(ActorContext {
        connection: connection.clone(),
        epoch: Instant::now(),
        progress: ProgressBar::hidden(),
    });
    let start = Arc::new(tokio::sync::Barrier::new(streams.len()));
    let mut tasks = Vec::new();
    for (actor, &stream) in streams.iter().enumerate() {
        let client = connection.client().await?;
        let plan = ProducerPlan {
            actor,
            stream: Identifier::named(&stream_name(stream)).map_err(|e| e.to_string())?,
            partitions: args.partitions,
            balanced: false,
            message_size: args.message_size,
            messages_per_batch: args.messages_per_batch,
            batches: args.batches,
            rate_limit: None,
        };
        tasks.push(tokio::spawn(actors::produce(
            context.clone(),
            client,
            plan,
            start.clone(),
        )));
    }
    for task in tasks {
        task.await.map_err(|e| format!("a fill producer failed: {e}"))??;
    }
    Ok(())
}

async fn execute(
    args: &BenchArgs,
    connection: Connection,
    pid: Option<u32>,
    progress: bool,
) -> Result<Report, String> {
    let admin = connection.client().await?;
    let to_fill = set_up(args, &connection, &admin).await?;
    let measured = measure(args, &connection, &to_fill, pid, progress).await;
    if !args.keep {
        for stream in 1..=args.streams() {
            let id = Identifier::named(&stream_name(stream)).map_err(|e| e.to_string())?;
            if let Err(error) = connection
                .bounded("delete stream", admin.delete_stream(&id))
                .await
            {
                eprintln!("cairn bench: cleaning up {}: {error}", stream_name(stream));
            }
        }
    }
    measured
}

async fn measure(
    args: &BenchArgs,
    connection: &Connection,
    to_fill: &[usize],
    pid: Option<u32>,
    progress: bool,
) -> Result<Report, String> {
    fill(args, connection, to_fill).await?;
    let streams = args.streams();
    let producers = if args.workload.produces() {
        args.producers
    } else {
        0
    };
    let consumers = if args.workload.consumes() {
        args.consumers
    } else {
        0
    };
    // Producers per stream, for the consumer group's targets.
    let mut producers_on = vec![0u64; streams];
    for actor in 0..producers {
        producers_on[stream_of(actor, streams) - 1] += 1;
    }
    let group_counters: Vec<Arc<AtomicU64>> = (0..streams).map(|_| Arc::new(AtomicU64::new(0))).collect();
    let group_target = |stream: usize| producers_on[stream - 1] * args.messages_per_actor();
    let expected_messages: u64 = producers as u64 * args.messages_per_actor()
        + match args.workload {
            Workload::BalancedProducerAndConsumerGroup => (0..consumers)
                .map(|c| stream_of(c, streams))
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .map(group_target)
                .sum(),
            _ => consumers as u64 * args.messages_per_actor(),
        };
    let bar = if progress && std::io::stderr().is_terminal() {
        let bar = ProgressBar::new(expected_messages);
        if let Ok(style) = ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} messages ({per_sec}, eta {eta})",
        ) {
            bar.set_style(style);
        }
        bar
    } else {
        ProgressBar::hidden()
    };

    // Connect every actor (and join the group) before the start, so setup is not measured.
    let mut producer_clients = Vec::with_capacity(producers);
    for _ in 0..producers {
        producer_clients.push(connection.client().await?);
    }
    let topic = Identifier::named(TOPIC_NAME).map_err(|e| e.to_string())?;
    let mut consumer_clients = Vec::with_capacity(consumers);
    for actor in 0..consumers {
        let client = connection.client().await?;
        if args.workload == Workload::BalancedProducerAndConsumerGroup {
            let stream =
                Identifier::named(&stream_name(stream_of(actor, streams))).map_err(|e| e.to_string())?;
            let group = Identifier::named(GROUP_NAME).map_err(|e| e.to_string())?;
            connection
                .bounded(
                    "join consumer group",
                    client.join_consumer_group(&stream, &topic, &group),
                )
                .await?;
        }
        consumer_clients.push(client);
    }

    // Read before any actor is spawned: a failure here leaves nobody waiting at the start.
    let started_at_unix_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let cpu_before = match pid {
        Some(pid) => Some(server::process_cpu_seconds(pid)?),
        None => None,
    };
    // The load generator's own CPU over the same phase: on a machine the server shares, the
    // two together per GB bound the throughput.
    let client_cpu_before = server::process_cpu_seconds(std::process::id())?;
    let writes_before = match pid {
        Some(pid) => server::process_write_bytes(pid)?,
        None => None,
    };
    let context = Arc::new(ActorContext {
        connection: connection.clone(),
        epoch: Instant::now(),
        progress: bar.clone(),
    });
    let start = Arc::new(tokio::sync::Barrier::new(producers + consumers + 1));
    let mut tasks: Vec<tokio::task::JoinHandle<Result<ActorResult, String>>> = Vec::new();
    for (actor, client) in producer_clients.into_iter().enumerate() {
        let plan = ProducerPlan {
            actor,
            stream: Identifier::named(&stream_name(stream_of(actor, streams))).map_err(|e| e.to_string())?,
            partitions: args.partitions,
            balanced: args.workload == Workload::BalancedProducerAndConsumerGroup,
            message_size: args.message_size,
            messages_per_batch: args.messages_per_batch,
            batches: args.batches,
            rate_limit: args.rate_limit,
        };
        tasks.push(tokio::spawn(actors::produce(
            context.clone(),
            client,
            plan,
            start.clone(),
        )));
    }
    for (actor, client) in consumer_clients.into_iter().enumerate() {
        let stream = stream_of(actor, streams);
        let mode = match args.workload {
            Workload::BalancedProducerAndConsumerGroup => ConsumerMode::Group {
                consumed: group_counters[stream - 1].clone(),
                target: group_target(stream),
            },
            _ => ConsumerMode::Pinned {
                partitions: args.partitions,
                target: args.messages_per_actor(),
            },
        };
        let plan = ConsumerPlan {
            actor,
            stream: Identifier::named(&stream_name(stream)).map_err(|e| e.to_string())?,
            messages_per_batch: args.messages_per_batch,
            mode,
        };
        tasks.push(tokio::spawn(actors::consume(
            context.clone(),
            client,
            plan,
            start.clone(),
        )));
    }
    start.wait().await;
    let mut samples: Vec<Sample> = Vec::new();
    let mut empty_polls = 0;
    let mut first_error = None;
    for task in tasks {
        match task.await {
            Ok(Ok(result)) => {
                samples.extend(result.samples);
                empty_polls += result.empty_polls;
            }
            Ok(Err(error)) => {
                first_error.get_or_insert(error);
            }
            Err(error) => {
                first_error.get_or_insert(format!("an actor failed: {error}"));
            }
        }
    }
    let cpu_after = match pid {
        Some(pid) => Some(server::process_cpu_seconds(pid)?),
        None => None,
    };
    let client_cpu_after = server::process_cpu_seconds(std::process::id())?;
    let writes_after = match pid {
        Some(pid) => server::process_write_bytes(pid)?,
        None => None,
    };
    bar.finish_and_clear();
    if let Some(error) = first_error {
        return Err(error);
    }
    let send = stats::summarize(&samples, Kind::Send, producers, 0);
    let poll = stats::summarize(&samples, Kind::Poll, consumers, empty_polls);
    let totals = Totals::of(&samples);
    let server_cpu = match (pid, cpu_before, cpu_after) {
        (Some(pid), Some(before), Some(after)) => Some(ServerCpu::new(
            pid,
            (after - before).max(0.0),
            send.as_ref().map_or(0, |s| s.payload_bytes),
            poll.as_ref().map_or(0, |s| s.payload_bytes),
        )),
        _ => None,
    };
    let client_cpu = ServerCpu::new(
        std::process::id(),
        (client_cpu_after - client_cpu_before).max(0.0),
        send.as_ref().map_or(0, |s| s.payload_bytes),
        poll.as_ref().map_or(0, |s| s.payload_bytes),
    );
    let server_writes = match (pid, writes_before, writes_after) {
        (Some(pid), Some(before), Some(after)) => Some(StorageWrites::new(
            pid,
            after.saturating_sub(before),
            send.as_ref().map_or(0, |s| s.payload_bytes),
        )),
        _ => None,
    };
    Ok(Report {
        tool: "cairn bench",
        version: env!("CARGO_PKG_VERSION"),
        command_line: report::this_command_line(),
        equivalent_command: args.to_command_line(),
        started_at_unix_s,
        parameters: Parameters::new(args, &connection.address, pid),
        time_series: stats::time_series(&samples),
        send,
        poll,
        totals,
        server_cpu,
        client_cpu: Some(client_cpu),
        server_writes,
    })
}
