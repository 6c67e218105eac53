//! `cairn`: the Cairn streaming server.
//!
//! Layout of this crate:
//! - `main.rs`: command line, start-up (config, catalog, root user), signals, clean stop.
//! - [`config`]: configuration sources and validation.
//! - [`tcp`]: the TCP shell (framing, one task per connection).
//! - [`http`]: the HTTP shell (REST/JSON), translating to the same commands and `Server::handle`.
//! - [`handler`]: request semantics, shared by every transport.
//! - [`catalog`]: streams, topics, partitions, users and their persistence.
//! - [`writer`]: group commit, one writer per partition sharing a data barrier among sends.
//! - [`auth`]: password and token hashing.
//! - [`bench`]: `cairn bench`, the load generator (an SDK client, not part of the server).

mod auth;
mod bench;
mod catalog;
mod cluster;
mod config;
mod faults;
mod forward;
mod handler;
mod http;
mod membership;
mod node;
mod partition;
mod partition_group;
mod repair;
mod replicas;
mod retention;
mod scrub;
mod stats;
mod tcp;
#[cfg(test)]
mod test_support;
mod tools;
mod writer;

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// How often the group-commit counters are logged while there is traffic.
const COUNTERS_REPORT_INTERVAL: Duration = Duration::from_secs(10);

#[derive(Parser)]
#[command(
    name = "cairn",
    version,
    about = "Cairn: a persistent message-streaming server speaking the Apache Iggy 0.11 protocol"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the server (the default when no subcommand is given).
    Serve(ServeArgs),
    /// Verify every partition of a stopped server's data directory offline and print a verdict
    /// per partition (healthy / recoverable / damaged). Exit code 0 only when all are healthy,
    /// 1 when something is recoverable or damaged, 2 on usage or IO errors.
    Check {
        /// Read and verify every byte (sealed segments included, whatever their summaries
        /// say). This is what `cairn check` always does; the flag says so explicitly.
        #[arg(long)]
        full: bool,
        /// The data directory (the server must not be running on it).
        data_dir: PathBuf,
    },
    /// Make a partition refused for damage serve again by accepting the loss of everything
    /// from its damage on (server stopped): the messages before the damage keep their offsets,
    /// new ones get offsets above every offset handed out, stored consumer offsets are kept,
    /// and the damaged files are moved aside whole, never deleted. Exit code 0 when repaired,
    /// 1 when refused (not damaged, or not repairable this way), 2 on usage or IO errors.
    Repair {
        /// Required: say that the messages from the damage on may be lost.
        #[arg(long)]
        accept_loss: bool,
        /// The partition, as numeric ids: <stream>/<topic>/<partition> (e.g. 1/1/0).
        partition: String,
        /// The data directory (the server must not be running on it).
        data_dir: PathBuf,
    },
    /// Show a cluster's state as its nodes see it: each node's replica of every group (role,
    /// view, last applied op, log head, lag behind the furthest node, state transfer wanted)
    /// and which peers each node reaches. Reads every node's `GET /cluster/status` at the
    /// `http` address of the node list in FILE. Exit code 0 when every node answered, 1 when
    /// one did not, 2 on usage errors.
    Status {
        /// A node's configuration file (its `[cluster]` node list is used).
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
    },
    /// Load generator: drives an Iggy 0.11 server over TCP with the published SDK and reports
    /// wall-clock throughput, latency percentiles over all samples and server CPU per GB.
    Bench(Box<bench::BenchArgs>),
}

#[derive(Args, Default)]
#[command(after_help = config_help())]
struct ServeArgs {
    /// TOML configuration file.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Data directory (key `data_dir`).
    #[arg(long, value_name = "DIR")]
    data_dir: Option<String>,
    /// TCP listen address (key `tcp.address`).
    #[arg(long, value_name = "ADDR")]
    tcp_address: Option<String>,
    /// HTTP listen address (key `http.address`; empty disables HTTP).
    #[arg(long, value_name = "ADDR")]
    http_address: Option<String>,
    /// Largest request frame (key `tcp.max_frame_bytes`).
    #[arg(long, value_name = "BYTES")]
    max_frame_bytes: Option<String>,
    /// Segment size (key `storage.segment_size_bytes`).
    #[arg(long, value_name = "BYTES")]
    segment_size_bytes: Option<String>,
    /// `durable` or `relaxed` (key `storage.durability`).
    #[arg(long, value_name = "MODE")]
    durability: Option<String>,
    /// Any key: `--set limits.batch_bytes_max=1048576` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
}

fn config_help() -> String {
    format!(
        "Configuration keys (precedence: flags > CAIRN_* environment > --config file > default):\n{}",
        config::describe_keys()
    )
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let args = match cli.command {
        Some(Command::Serve(args)) => args,
        None => ServeArgs::default(),
        // Every check is full: a start takes sealed segments from their summaries, the checker
        // never does.
        Some(Command::Check { full: _, data_dir }) => return tools::run_check(&data_dir),
        Some(Command::Repair {
            accept_loss,
            partition,
            data_dir,
        }) => return tools::run_repair(accept_loss, &partition, &data_dir),
        Some(Command::Bench(args)) => return bench::run(*args),
        Some(Command::Status { config }) => {
            let args = ServeArgs {
                config: Some(config),
                ..ServeArgs::default()
            };
            return match load_config(&args) {
                Ok(config) => tools::run_status(&config),
                Err(error) => {
                    eprintln!("cairn status: configuration refused: {error}");
                    ExitCode::from(2)
                }
            };
        }
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let config = match load_config(&args) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("cairn: configuration refused: {error}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("cairn: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("cairn: {error}");
            ExitCode::FAILURE
        }
    }
}

fn load_config(args: &ServeArgs) -> Result<config::Config, config::ConfigError> {
    let mut sources = config::Sources::defaults();
    if let Some(path) = &args.config {
        sources.apply_file(path)?;
    }
    sources.apply_env(std::env::vars())?;
    let flags = [
        ("data_dir", "--data-dir", &args.data_dir),
        ("tcp.address", "--tcp-address", &args.tcp_address),
        ("http.address", "--http-address", &args.http_address),
        ("tcp.max_frame_bytes", "--max-frame-bytes", &args.max_frame_bytes),
        (
            "storage.segment_size_bytes",
            "--segment-size-bytes",
            &args.segment_size_bytes,
        ),
        ("storage.durability", "--durability", &args.durability),
    ];
    for (key, flag, value) in flags {
        if let Some(value) = value {
            sources.apply_flag(key, value.clone(), flag)?;
        }
    }
    for pair in &args.set {
        let Some((key, value)) = pair.split_once('=') else {
            return Err(config::ConfigError::InvalidValue {
                key: pair.clone(),
                source_name: "flag --set".to_string(),
                reason: "expected KEY=VALUE".to_string(),
            });
        };
        sources.apply_flag(key.trim(), value.to_string(), "--set")?;
    }
    sources.build()
}

async fn serve(config: config::Config) -> Result<(), String> {
    if config.durability == config::Durability::Relaxed {
        tracing::warn!(
            flush_interval_ms = config.flush_interval_ms,
            "storage.durability = relaxed: sends are acknowledged once written, before a barrier; a flush every \
             storage.flush_interval_ms makes them durable. A process crash loses nothing; a power loss may lose \
             the acknowledged messages of the last interval, whose offsets are never handed out again"
        );
    }
    // Each partition's writer commits one op per group of sends, durable before its ACK.
    let writers = writer::WriterContext::new(tokio::runtime::Handle::current());
    let global_counters = writers.global_counters().clone();
    let data_dir = config.data_dir.clone();
    std::fs::create_dir_all(&data_dir)
        .map_err(|e| format!("cannot create the data directory {}: {e}", data_dir.display()))?;
    // Held until the server has closed every partition: a second server on the same directory
    // is refused instead of corrupting it (and `cairn check` says the directory is in use).
    let _data_dir_lock = cairn_storage::lock::DataDirLock::acquire(&data_dir).map_err(|e| e.to_string())?;
    // Before anything is formatted: a node's data belongs to one node of one node list. A
    // node of several records it once it knows the cluster is being formed (`cluster.rs`).
    let cluster = match &config.cluster {
        Some(cluster_config) if cluster_config.nodes.len() > 1 => Some(Arc::new(
            cluster::Cluster::start(cluster_config, &data_dir).await?,
        )),
        _ => {
            membership::check_or_record(&data_dir, config.cluster.as_ref()).map_err(|e| e.to_string())?;
            None
        }
    };
    let (mut catalog, first_start) = catalog::Catalog::load(
        &data_dir,
        config.segment_size_bytes,
        config.durability == config::Durability::Relaxed,
        writers,
        cluster.as_ref().map(|cluster| cluster.seat()),
    )
    .map_err(|e| format!("cannot load the data directory {}: {e}", data_dir.display()))?;
    if let Some(cluster) = &cluster {
        cluster.note_metadata_formatted(&data_dir)?;
    }
    let clock: Box<dyn handler::Clock> = Box::new(handler::SystemClock);
    // A cluster's root user is made by the metadata primary, once there is one (below).
    let generated_password = match cluster {
        None => ensure_root_user(&mut catalog, &config, clock.now_us(), first_start)?,
        Some(_) => None,
    };
    let catalog = catalog::Catalog::share(catalog);
    let listener = tokio::net::TcpListener::bind(config.tcp_address)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", config.tcp_address))?;
    let bound = listener
        .local_addr()
        .map_err(|e| format!("cannot read the bound address: {e}"))?;
    // Bound before the readiness line, like TCP, so a client may connect as soon as it is printed.
    let http_listener = match config.http_address {
        Some(address) => Some(
            tokio::net::TcpListener::bind(address)
                .await
                .map_err(|e| format!("cannot listen for HTTP on {address}: {e}"))?,
        ),
        None => None,
    };
    let http_bound = match &http_listener {
        Some(listener) => Some(
            listener
                .local_addr()
                .map_err(|e| format!("cannot read the bound HTTP address: {e}"))?,
        ),
        None => None,
    };
    let server = Arc::new(handler::Server::new(config, catalog, clock, cluster.clone()));
    server.bound_port.store(bound.port() as u32, Ordering::Relaxed);
    if let Some(http_bound) = http_bound {
        server
            .http_bound_port
            .store(http_bound.port() as u32, Ordering::Relaxed);
    }

    if let Some(password) = generated_password {
        println!(
            "Generated a password for the root user `iggy` (shown once, stored only as a hash): {password}"
        );
    }
    println!(
        "Cairn {} is serving the Iggy TCP protocol on {bound}, data in {}",
        env!("CARGO_PKG_VERSION"),
        data_dir.display()
    );
    println!(
        "Connect with the Iggy CLI: iggy --tcp-server-address {bound} -u iggy -p <password> stream list"
    );
    if let Some(http_bound) = http_bound {
        println!("Serving the Iggy HTTP API on http://{http_bound}");
    }
    // The machine-readable readiness line tests and scripts wait for: `tcp=` first, then
    // `http=` (`http=off` when HTTP is disabled).
    match http_bound {
        Some(http_bound) => println!("CAIRN_READY tcp={bound} http={http_bound}"),
        None => println!("CAIRN_READY tcp={bound} http=off"),
    }
    tracing::info!(%bound, data_dir = %data_dir.display(), "serving");

    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
    let root_user = cluster.as_ref().map(|_| {
        tokio::spawn(cluster::ensure_root_user(
            server.catalog.clone(),
            server.config.root_password.clone(),
            || handler::Clock::now_us(&handler::SystemClock),
            shutdown_rx.clone(),
        ))
    });
    let reporting = tokio::spawn(report_counters(global_counters.clone(), shutdown_rx.clone()));
    let http_serving = http_listener
        .map(|listener| tokio::spawn(http::serve(server.clone(), listener, shutdown_rx.clone())));
    let retaining = tokio::spawn(run_retention(
        server.clone(),
        std::time::Duration::from_millis(server.config.retention_interval_ms),
        shutdown_rx.clone(),
    ));
    let scrubbing = tokio::spawn(run_scrub(
        server.clone(),
        server.config.scrub_interval_ms,
        shutdown_rx.clone(),
    ));
    let flushing = (server.config.durability == config::Durability::Relaxed).then(|| {
        tokio::spawn(run_flush(
            server.clone(),
            Duration::from_millis(server.config.flush_interval_ms),
            shutdown_rx.clone(),
        ))
    });
    let verifying = {
        let (server, stop) = (server.clone(), shutdown_rx.clone());
        tokio::task::spawn_blocking(move || {
            let started = std::time::Instant::now();
            let totals = scrub::verify_prefixes(&server.catalog, &|| *stop.borrow());
            scrub::log_prefixes_verified(totals, started.elapsed());
        })
    };
    let serving = tokio::spawn(tcp::serve(server.clone(), listener, shutdown_rx));
    wait_for_stop_signal().await;
    tracing::info!("stop requested: finishing in-flight requests");
    let _ = shutdown_tx.send(true);
    if let Err(error) = serving.await {
        tracing::error!(%error, "the TCP shell ended abnormally");
    }
    if let Some(http_serving) = http_serving
        && let Err(error) = http_serving.await
    {
        tracing::error!(%error, "the HTTP shell ended abnormally");
    }
    let _ = reporting.await;
    // No retention or scrub pass may run while the partitions close.
    if let Err(error) = retaining.await {
        tracing::error!(%error, "the retention task ended abnormally");
    }
    if let Err(error) = scrubbing.await {
        tracing::error!(%error, "the scrub task ended abnormally");
    }
    if let Err(error) = verifying.await {
        tracing::error!(%error, "the verification of the log prefixes taken unread ended abnormally");
    }
    if let Some(flushing) = flushing
        && let Err(error) = flushing.await
    {
        tracing::error!(%error, "the flush task ended abnormally");
    }
    if let Some(root_user) = root_user {
        let _ = root_user.await;
    }
    stop_partitions(&server).await;
    if let Some(cluster) = &cluster {
        cluster.stop().await;
    }
    tracing::info!("group commit totals: {}", global_counters.snapshot().summary());
    tracing::info!("stopped cleanly");
    Ok(())
}

/// Log the group-commit counters every [`COUNTERS_REPORT_INTERVAL`] in which there was
/// traffic, until shutdown.
async fn report_counters(
    counters: Arc<writer::CommitCounters>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut ticks = tokio::time::interval(COUNTERS_REPORT_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick completes at once; start the window there.
    ticks.tick().await;
    let mut previous = counters.snapshot_window();
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = shutdown.changed() => return,
        }
        let current = counters.snapshot_window();
        let window = current.since(&previous);
        if !window.is_idle() {
            tracing::info!(
                "group commit, last {}s: {}",
                COUNTERS_REPORT_INTERVAL.as_secs(),
                window.summary()
            );
        }
        previous = current;
    }
}

/// Run `pass` on a blocking thread at `first`, then every `interval`, until shutdown (a pass
/// in progress finishes first). `what` names it in the log if it panics.
async fn every<T: Send + 'static>(
    first: tokio::time::Instant,
    interval: Duration,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
    what: &'static str,
    pass: impl Fn() -> T + Clone + Send + 'static,
    done: impl Fn(T, Duration),
) {
    let mut ticks = tokio::time::interval_at(first, interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = shutdown.changed() => return,
            _ = ticks.tick() => {}
        }
        let started = std::time::Instant::now();
        match tokio::task::spawn_blocking(pass.clone()).await {
            Ok(outcome) => done(outcome, started.elapsed()),
            Err(error) => tracing::error!(%error, "{what} pass panicked"),
        }
    }
}

/// The retention timer: a pass (`retention::enforce`, with the server's clock) every
/// `interval` until shutdown.
async fn run_retention(
    server: Arc<handler::Server>,
    interval: Duration,
    shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let pass = move || retention::enforce(&server.catalog, server.clock.now_us());
    every(
        tokio::time::Instant::now(),
        interval,
        shutdown,
        "retention",
        pass,
        |(), _| {},
    )
    .await;
}

/// The `relaxed` mode's flush timer: every `interval`, each partition's acknowledged ops are
/// made durable (`partition::flush_relaxed`). The clean stop flushes the rest.
async fn run_flush(
    server: Arc<handler::Server>,
    interval: Duration,
    shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let pass = move || {
        for partition in catalog::all_partitions(&server.catalog) {
            partition::flush_relaxed(&partition.state);
        }
    };
    every(
        tokio::time::Instant::now() + interval,
        interval,
        shutdown,
        "flush",
        pass,
        |(), _| {},
    )
    .await;
}

/// The scrub timer: a pass (`scrub::scrub`) every `interval_ms`, never when 0. The first
/// comes at a random point of the first interval: a start no longer reads sealed segments,
/// so a server restarted more often than the interval must still be scrubbed. A stop
/// interrupts a pass between segments.
async fn run_scrub(
    server: Arc<handler::Server>,
    interval_ms: u64,
    shutdown: tokio::sync::watch::Receiver<bool>,
) {
    if interval_ms == 0 {
        return;
    }
    let interval = Duration::from_millis(interval_ms);
    let first = tokio::time::Instant::now() + Duration::from_millis(rand::random::<u64>() % interval_ms);
    let stop = shutdown.clone();
    let pass = move || scrub::scrub(&server.catalog, &|| *stop.borrow());
    let done = |totals: scrub::ScrubTotals, took: Duration| {
        tracing::info!(
            segments_verified = totals.segments_verified,
            bytes_verified = totals.bytes_verified,
            segments_unread = totals.segments_unread,
            partitions_damaged = totals.partitions_damaged,
            interrupted = totals.interrupted,
            took_ms = took.as_millis() as u64,
            "scrub pass done"
        );
    };
    every(first, interval, shutdown, "scrub", pass, done).await;
}

/// Create the root user on first start. Returns the generated password, if one was made.
fn ensure_root_user(
    catalog: &mut catalog::Catalog,
    config: &config::Config,
    now_us: u64,
    first_start: bool,
) -> Result<Option<String>, String> {
    if catalog.meta().user(auth::ROOT_USER_ID).is_some() {
        if config.root_password.is_some() {
            tracing::info!(
                "root user already exists: the configured root password is ignored (the stored one stays)"
            );
        }
        return Ok(None);
    }
    if !first_start {
        tracing::warn!("metadata has no root user: creating it");
    }
    create_root_user(catalog, config.root_password.clone(), now_us)
}

/// Commit the root user with `password`, or a generated one (returned).
fn create_root_user(
    catalog: &mut catalog::Catalog,
    password: Option<String>,
    now_us: u64,
) -> Result<Option<String>, String> {
    let (password, generated) = match password {
        Some(password) => (password, false),
        None => (auth::random_secret(24), true),
    };
    let password_hash =
        auth::hash_secret(&password).map_err(|e| format!("cannot hash the root password: {e}"))?;
    catalog
        .commit(&cairn_machine::metadata::MetadataOp::CreateRoot {
            password_hash,
            created_at_us: now_us,
        })
        .map_err(|status| format!("cannot create the root user (status {status}); see the log above"))?;
    Ok(generated.then_some(password))
}

async fn wait_for_stop_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut terminate), Ok(mut interrupt)) =
        (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
    else {
        tracing::error!("cannot install signal handlers; stop with SIGKILL only");
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = terminate.recv() => {},
        _ = interrupt.recv() => {},
    }
}

/// Clean stop of the partitions, after the TCP shell stopped taking requests: close every
/// writer (each completes what it has queued first), then make every partition's data stable.
async fn stop_partitions(server: &handler::Server) {
    let partitions: Vec<Arc<catalog::Partition>> = {
        let catalog = match server.catalog.read() {
            Ok(catalog) => catalog,
            Err(poisoned) => poisoned.into_inner(),
        };
        catalog
            .all_topics()
            .flat_map(|topic| topic.partitions.iter().cloned())
            .collect()
    };
    for partition in &partitions {
        if let Some(writer) = partition.take_writer() {
            writer.close().await;
        }
    }
    for partition in &partitions {
        // Closing checkpoints the group at its last op, so the next start applies nothing.
        // The partition stays `Closed`: nothing may write after this.
        let state = std::mem::replace(
            &mut *partition::lock(&partition.state),
            partition::PartitionState::Closed,
        );
        if let partition::PartitionState::Serving(data) = state {
            let stopped = data.stopped_reason().map(str::to_string);
            match (data.close(), stopped) {
                (Ok(()), _) => {}
                (Err(_), Some(reason)) => tracing::warn!(
                    partition_dir = %partition.dir.display(),
                    %reason,
                    "partition stopped earlier; not closed cleanly (the next start treats it as an unclean stop)"
                ),
                (Err(error), None) => tracing::error!(
                    partition_dir = %partition.dir.display(),
                    %error,
                    "closing the partition failed (the next start treats it as an unclean stop)"
                ),
            }
        }
        let counters = partition.counters.snapshot();
        if !counters.is_idle() {
            tracing::info!(
                partition_dir = %partition.dir.display(),
                "group commit totals of the partition: {}",
                counters.summary()
            );
        }
    }
}
