//! The report: what was run, the figures, and its three renderings (table, JSON, HTML).

use super::stats::{self, Kind, PhaseSummary, Sample, SecondBucket};
use super::workload::{BenchArgs, DurabilityLabel, Workload};
use serde::Serialize;

pub const DURABILITY_NOTE: &str = "durability is the server's storage.durability setting; the \
bench only labels the report with it, except with --start-server, which starts the server in \
that mode";

#[derive(Clone, Debug, Serialize)]
pub struct Parameters {
    pub workload: Workload,
    pub server_address: String,
    pub started_server: bool,
    pub server_pid: Option<u32>,
    pub producers: usize,
    pub consumers: usize,
    pub streams: usize,
    pub partitions: u32,
    pub message_size: usize,
    pub messages_per_batch: u32,
    pub batches: u64,
    pub rate_limit_bytes_per_s: Option<u64>,
    pub durability: DurabilityLabel,
    pub durability_note: &'static str,
}

impl Parameters {
    pub fn new(args: &BenchArgs, server_address: &str, server_pid: Option<u32>) -> Parameters {
        Parameters {
            workload: args.workload,
            server_address: server_address.to_string(),
            started_server: args.start_server,
            server_pid,
            producers: if args.workload.produces() {
                args.producers
            } else {
                0
            },
            consumers: if args.workload.consumes() {
                args.consumers
            } else {
                0
            },
            streams: args.streams(),
            partitions: args.partitions,
            message_size: args.message_size,
            messages_per_batch: args.messages_per_batch,
            batches: args.batches,
            rate_limit_bytes_per_s: args.rate_limit,
            durability: args.durability,
            durability_note: DURABILITY_NOTE,
        }
    }
}

/// Everything measured, from the first request's start to the last reply, all kinds together.
#[derive(Clone, Debug, Serialize)]
pub struct Totals {
    pub messages: u64,
    pub payload_bytes: u64,
    pub wall_seconds: f64,
    pub throughput_bytes_per_s: f64,
    pub throughput_mb_per_s: f64,
    pub messages_per_s: f64,
}

impl Totals {
    /// Every sample of a run, all kinds together: wall time from the first request's start
    /// to the last reply.
    pub fn of(samples: &[super::stats::Sample]) -> Totals {
        let first = samples.iter().map(|s| s.start_us).min().unwrap_or(0);
        let last = samples.iter().map(|s| s.end_us()).max().unwrap_or(0);
        let wall_seconds = last.saturating_sub(first).max(1) as f64 / 1e6;
        let messages: u64 = samples.iter().map(|s| s.messages).sum();
        let payload_bytes: u64 = samples.iter().map(|s| s.payload_bytes).sum();
        let throughput = payload_bytes as f64 / wall_seconds;
        Totals {
            messages,
            payload_bytes,
            wall_seconds,
            throughput_bytes_per_s: throughput,
            throughput_mb_per_s: throughput / 1e6,
            messages_per_s: messages as f64 / wall_seconds,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct ServerCpu {
    pub pid: u32,
    /// User + system CPU seconds of the server process during the measured phase.
    pub cpu_seconds: f64,
    pub gb_ingested: f64,
    pub gb_served: f64,
    /// Over ingested + served bytes.
    pub cpu_seconds_per_gb: f64,
    /// Only when the run only sent.
    pub cpu_seconds_per_gb_ingested: Option<f64>,
    /// Only when the run only polled.
    pub cpu_seconds_per_gb_served: Option<f64>,
}

impl ServerCpu {
    pub fn new(pid: u32, cpu_seconds: f64, ingested: u64, served: u64) -> ServerCpu {
        let gb_ingested = ingested as f64 / 1e9;
        let gb_served = served as f64 / 1e9;
        let per = |gb: f64| if gb > 0.0 { cpu_seconds / gb } else { 0.0 };
        ServerCpu {
            pid,
            cpu_seconds,
            gb_ingested,
            gb_served,
            cpu_seconds_per_gb: per(gb_ingested + gb_served),
            cpu_seconds_per_gb_ingested: (served == 0 && ingested > 0).then(|| per(gb_ingested)),
            cpu_seconds_per_gb_served: (ingested == 0 && served > 0).then(|| per(gb_served)),
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub tool: &'static str,
    pub version: &'static str,
    /// The exact command line of this process.
    pub command_line: String,
    /// The single-run command equivalent to these parameters.
    pub equivalent_command: String,
    pub started_at_unix_s: u64,
    pub parameters: Parameters,
    pub send: Option<PhaseSummary>,
    pub poll: Option<PhaseSummary>,
    pub totals: Totals,
    /// For the ceiling workloads, the server-side threads (or the disk writers) of this process.
    pub server_cpu: Option<ServerCpu>,
    /// The load generator's own CPU over the measured phase (this process; for the loopback
    /// ceilings, its client threads). None for the disk ceiling, which has no clients.
    pub client_cpu: Option<ServerCpu>,
    /// Per second of the run, by completion time, per kind of traffic.
    pub time_series: Vec<SecondBucket>,
    /// What the server process wrote to storage over the measured phase (when its pid is
    /// known and the kernel accounts it).
    pub server_writes: Option<StorageWrites>,
}

/// Bytes a process sent to the storage layer during the measured phase, against the payload
/// bytes the run sent: the write amplification of the ingest path (every byte of the stored
/// batch format, the record envelopes, indexes, state publishes and page rewrites).
#[derive(Clone, Debug, Serialize)]
pub struct StorageWrites {
    pub pid: u32,
    pub write_bytes: u64,
    pub payload_bytes_sent: u64,
    /// `write_bytes / payload_bytes_sent`; None when nothing was sent.
    pub write_bytes_per_payload_byte: Option<f64>,
}

impl StorageWrites {
    pub fn new(pid: u32, write_bytes: u64, payload_bytes_sent: u64) -> StorageWrites {
        StorageWrites {
            pid,
            write_bytes,
            payload_bytes_sent,
            write_bytes_per_payload_byte: (payload_bytes_sent > 0)
                .then(|| write_bytes as f64 / payload_bytes_sent as f64),
        }
    }
}

impl Report {
    pub fn phases(&self) -> impl Iterator<Item = &PhaseSummary> {
        self.send.iter().chain(self.poll.iter())
    }
}

impl Report {
    /// The report of a ceiling workload, which runs no server: phases and totals from
    /// `samples`, CPU seconds measured inside this process (the server-side threads or disk
    /// writers, and the client threads if there are any), files under `dir`.
    pub fn of_ceiling(
        args: &BenchArgs,
        dir: &std::path::Path,
        samples: &[Sample],
        server_side_cpu_seconds: f64,
        client_cpu_seconds: Option<f64>,
    ) -> Report {
        debug_assert!(args.workload.is_ceiling());
        let send = stats::summarize(samples, Kind::Send, args.producers, 0);
        let poll = stats::summarize(samples, Kind::Poll, args.consumers, 0);
        let ingested = send.as_ref().map_or(0, |s| s.payload_bytes);
        let served = poll.as_ref().map_or(0, |s| s.payload_bytes);
        let pid = std::process::id();
        Report {
            tool: "cairn bench",
            version: env!("CARGO_PKG_VERSION"),
            command_line: this_command_line(),
            equivalent_command: args.to_command_line(),
            started_at_unix_s: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            parameters: Parameters::new(args, &dir.display().to_string(), None),
            time_series: stats::time_series(samples),
            send,
            poll,
            totals: Totals::of(samples),
            server_cpu: Some(ServerCpu::new(pid, server_side_cpu_seconds, ingested, served)),
            client_cpu: client_cpu_seconds.map(|seconds| ServerCpu::new(pid, seconds, ingested, served)),
            server_writes: None,
        }
    }
}

/// The command line of this process, quoted for a POSIX shell where needed.
pub fn this_command_line() -> String {
    std::env::args()
        .map(|a| shell_quote(&a))
        .collect::<Vec<_>>()
        .join(" ")
}

pub fn shell_quote(arg: &str) -> String {
    if !arg.is_empty()
        && arg
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,@%+".contains(c))
    {
        arg.to_string()
    } else {
        format!("'{}'", arg.replace('\'', "'\\''"))
    }
}

pub fn format_us(us: u64) -> String {
    if us >= 1_000_000 {
        format!("{:.2} s", us as f64 / 1e6)
    } else if us >= 1_000 {
        format!("{:.2} ms", us as f64 / 1e3)
    } else {
        format!("{us} µs")
    }
}

fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Send => "send",
        Kind::Poll => "poll",
    }
}

/// The human-readable table.
pub fn table(report: &Report) -> String {
    let p = &report.parameters;
    let mut out = String::new();
    out.push_str(&format!(
        "cairn bench: {} ({}), server {}{}\n",
        p.workload.name(),
        p.durability.name(),
        p.server_address,
        if p.started_server {
            " (started by the bench)"
        } else {
            ""
        }
    ));
    out.push_str(&format!(
        "  {} producers, {} consumers, {} streams x {} partitions, {} batches x {} messages x {} B{}\n",
        p.producers,
        p.consumers,
        p.streams,
        p.partitions,
        p.batches,
        p.messages_per_batch,
        p.message_size,
        p.rate_limit_bytes_per_s
            .map(|r| format!(", rate limit {:.1} MB/s per producer", r as f64 / 1e6))
            .unwrap_or_default()
    ));
    out.push_str(&format!(
        "{:<6} {:>8} {:>12} {:>9} {:>11} {:>12} {:>10} {:>10} {:>10} {:>10} {:>10}\n",
        "kind", "requests", "messages", "wall s", "MB/s", "msgs/s", "p50", "p90", "p99", "p999", "max"
    ));
    for phase in report.phases() {
        let l = &phase.latency;
        out.push_str(&format!(
            "{:<6} {:>8} {:>12} {:>9.3} {:>11.1} {:>12.0} {:>10} {:>10} {:>10} {:>10} {:>10}\n",
            kind_name(phase.kind),
            phase.requests,
            phase.messages,
            phase.wall_seconds,
            phase.throughput_mb_per_s,
            phase.messages_per_s,
            format_us(l.p50_us),
            format_us(l.p90_us),
            format_us(l.p99_us),
            format_us(l.p999_us),
            format_us(l.max_us),
        ));
    }
    let t = &report.totals;
    out.push_str(&format!(
        "total  {} messages, {:.1} MB in {:.3} s: {:.1} MB/s, {:.0} msgs/s (wall clock, all actors)\n",
        t.messages,
        t.payload_bytes as f64 / 1e6,
        t.wall_seconds,
        t.throughput_mb_per_s,
        t.messages_per_s
    ));
    if let Some(poll) = &report.poll
        && poll.empty_polls > 0
    {
        out.push_str(&format!(
            "       {} empty polls (waiting for data; not in the latency figures)\n",
            poll.empty_polls
        ));
    }
    let whose = match report.parameters.workload {
        Workload::DiskCeiling => ["disk writers (this process)", ""],
        Workload::IngestCeiling | Workload::ServeCeiling => [
            "server-side threads (this process)",
            "client threads (this process)",
        ],
        _ => ["server", "bench clients (this process)"],
    };
    for (whose, cpu) in whose
        .iter()
        .zip([&report.server_cpu, &report.client_cpu])
        .filter_map(|(whose, cpu)| Some((whose, cpu.as_ref()?)))
    {
        out.push_str(&format!(
            "{whose} pid {}: {:.2} CPU s, {:.3} CPU s/GB moved{}{}\n",
            cpu.pid,
            cpu.cpu_seconds,
            cpu.cpu_seconds_per_gb,
            cpu.cpu_seconds_per_gb_ingested
                .map(|v| format!(" ({v:.3} per GB ingested)"))
                .unwrap_or_default(),
            cpu.cpu_seconds_per_gb_served
                .map(|v| format!(" ({v:.3} per GB served)"))
                .unwrap_or_default(),
        ));
    }
    if let Some(writes) = &report.server_writes {
        out.push_str(&format!(
            "server pid {}: {:.1} MB written to storage{}\n",
            writes.pid,
            writes.write_bytes as f64 / 1e6,
            writes
                .write_bytes_per_payload_byte
                .map(|ratio| format!(", {ratio:.3} bytes per payload byte sent"))
                .unwrap_or_default(),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("--producers"), "--producers");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
        assert_eq!(shell_quote(""), "''");
    }

    #[test]
    fn cpu_per_gb() {
        let cpu = ServerCpu::new(1, 2.0, 4_000_000_000, 0);
        assert_eq!(cpu.cpu_seconds_per_gb, 0.5);
        assert_eq!(cpu.cpu_seconds_per_gb_ingested, Some(0.5));
        assert_eq!(cpu.cpu_seconds_per_gb_served, None);
        assert_eq!(ServerCpu::new(1, 1.0, 0, 0).cpu_seconds_per_gb, 0.0);
    }
}
