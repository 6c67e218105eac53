//! `cairn`: the Cairn streaming server.
//!
//! Layout of this crate:
//! - `main.rs`: command line, start-up (config, catalog, root user), signals, clean stop.
//! - [`config`]: configuration sources and validation.
//! - [`tcp`]: the TCP shell (framing, one task per connection).
//! - [`handler`]: request semantics, shared by every transport.
//! - [`catalog`]: streams, topics, partitions, users and their persistence.
//! - [`auth`]: password and token hashing.

mod auth;
mod catalog;
mod config;
mod handler;
mod tcp;

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;

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
    let log_config = cairn_storage::log::LogConfig {
        segment_size_bytes: config.segment_size_bytes,
        sync: match config.durability {
            config::Durability::Durable => cairn_storage::log::SyncMode::EveryAppend,
            config::Durability::Relaxed => cairn_storage::log::SyncMode::Os,
        },
    };
    let data_dir = config.data_dir.clone();
    let (mut catalog, first_start) = catalog::Catalog::load(&data_dir, log_config)
        .map_err(|e| format!("cannot load the data directory {}: {e}", data_dir.display()))?;
    let clock: Box<dyn handler::Clock> = Box::new(handler::SystemClock);
    let generated_password = ensure_root_user(&mut catalog, &config, clock.now_us(), first_start)?;
    let listener = tokio::net::TcpListener::bind(config.tcp_address)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", config.tcp_address))?;
    let bound = listener
        .local_addr()
        .map_err(|e| format!("cannot read the bound address: {e}"))?;
    let server = Arc::new(handler::Server::new(config, catalog, clock));
    server.bound_port.store(bound.port() as u32, Ordering::Relaxed);

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
    // The machine-readable readiness line tests and scripts wait for.
    println!("CAIRN_READY tcp={bound}");
    tracing::info!(%bound, data_dir = %data_dir.display(), "serving");

    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
    let serving = tokio::spawn(tcp::serve(server.clone(), listener, shutdown_rx));
    wait_for_stop_signal().await;
    tracing::info!("stop requested: finishing in-flight requests");
    let _ = shutdown_tx.send(true);
    if let Err(error) = serving.await {
        tracing::error!(%error, "the TCP shell ended abnormally");
    }
    flush_all(&server);
    tracing::info!("stopped cleanly");
    Ok(())
}

/// Create the root user on first start. Returns the generated password, if one was made.
fn ensure_root_user(
    catalog: &mut catalog::Catalog,
    config: &config::Config,
    now_us: u64,
    first_start: bool,
) -> Result<Option<String>, String> {
    if catalog.users.iter().any(|u| u.id == auth::ROOT_USER_ID) {
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
    let (password, generated) = match &config.root_password {
        Some(password) => (password.clone(), false),
        None => (auth::random_secret(24), true),
    };
    let password_hash =
        auth::hash_secret(&password).map_err(|e| format!("cannot hash the root password: {e}"))?;
    catalog.users.push(auth::User {
        id: auth::ROOT_USER_ID,
        username: auth::ROOT_USERNAME.to_string(),
        password_hash,
        status: auth::USER_STATUS_ACTIVE,
        created_at_us: now_us,
    });
    catalog.next_user_id = catalog.next_user_id.max(auth::ROOT_USER_ID + 1);
    catalog.save().map_err(|e| format!("cannot save metadata: {e}"))?;
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

/// Make every partition's appended data stable before exiting.
fn flush_all(server: &handler::Server) {
    let catalog = match server.catalog.read() {
        Ok(catalog) => catalog,
        Err(poisoned) => poisoned.into_inner(),
    };
    for stream in catalog.streams.values() {
        for topic in stream.topics.values() {
            for partition in &topic.partitions {
                if let catalog::PartitionState::Serving(data) = &mut *catalog::lock(&partition.state)
                    && let Err(error) = data.log.flush()
                {
                    tracing::error!(partition_dir = %partition.dir.display(), %error, "flush at stop failed");
                }
            }
        }
    }
}
