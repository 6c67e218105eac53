//! The command line of `cairn bench`, the workload shapes (which actor uses which stream) and
//! the rate-limit pacer. Pure: no IO.

use clap::{Args, ValueEnum};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Duration;

/// Stream names the bench creates (and deletes unless `--keep`).
pub const STREAM_PREFIX: &str = "bench-stream-";
pub const TOPIC_NAME: &str = "bench-topic";
pub const GROUP_NAME: &str = "bench-group";

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// Every producer sends to its own stream (producer i -> stream i mod streams).
    PinnedProducer,
    /// Every consumer polls its own stream by offset. Missing data is produced first (not
    /// measured); data kept by an earlier `--keep` run is read as it is.
    PinnedConsumer,
    /// Pinned producers and pinned consumers at the same time.
    PinnedProducerAndConsumer,
    /// Producers send balanced over the partitions; consumers poll as one consumer group.
    BalancedProducerAndConsumerGroup,
    /// No server: every producer is a thread writing its own file (in --server-data-parent or
    /// the temp dir) with one write + fdatasync per batch-sized block. The disk's barrier
    /// ceiling for the same shape, to compare a durable run against.
    DiskCeiling,
    /// No server: every producer is a pair of threads on one loopback connection; one sends
    /// batch-sized blocks, the other reads each into one buffer, appends it to its own file
    /// (durable: then fdatasync, and a 4 KiB in-place frontier write with its own fdatasync)
    /// and answers one byte. The floor of receiving and storing a batch, in CPU and time.
    IngestCeiling,
    /// No server: every consumer is a pair of threads on one loopback connection; one asks for
    /// a block, the other reads it from its (cached) file, checks its XXH3 as Cairn verifies a
    /// record, and sendfile()s it. The floor of serving a verified batch, in CPU and time.
    ServeCeiling,
}

impl Workload {
    pub fn produces(self) -> bool {
        !matches!(self, Workload::PinnedConsumer | Workload::ServeCeiling)
    }
    pub fn consumes(self) -> bool {
        !matches!(
            self,
            Workload::PinnedProducer | Workload::DiskCeiling | Workload::IngestCeiling
        )
    }
    /// Runs no server: a floor measured inside this process.
    pub fn is_ceiling(self) -> bool {
        matches!(
            self,
            Workload::DiskCeiling | Workload::IngestCeiling | Workload::ServeCeiling
        )
    }
    pub fn name(self) -> &'static str {
        match self {
            Workload::PinnedProducer => "pinned-producer",
            Workload::PinnedConsumer => "pinned-consumer",
            Workload::PinnedProducerAndConsumer => "pinned-producer-and-consumer",
            Workload::BalancedProducerAndConsumerGroup => "balanced-producer-and-consumer-group",
            Workload::DiskCeiling => "disk-ceiling",
            Workload::IngestCeiling => "ingest-ceiling",
            Workload::ServeCeiling => "serve-ceiling",
        }
    }
}

/// A label only: what the server does is its own setting (`storage.durability`), except with
/// `--start-server`, which starts the server in this mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DurabilityLabel {
    Durable,
    Relaxed,
}

impl DurabilityLabel {
    pub fn name(self) -> &'static str {
        match self {
            DurabilityLabel::Durable => "durable",
            DurabilityLabel::Relaxed => "relaxed",
        }
    }
}

/// `cairn bench`: a load generator over TCP with the published Iggy 0.11 SDK.
#[derive(Args, Clone, Debug)]
#[command(after_help = "Durability is a server setting (`storage.durability`, env \
CAIRN_STORAGE_DURABILITY, `cairn serve --durability`): against a running server --durability \
only labels the report; with --start-server the bench starts the server in that mode.\n\
Units: MB = 10^6 bytes, GB = 10^9 bytes. Latency is per request (a send until its \
acknowledgement, a poll until its reply), over all samples of all actors.")]
pub struct BenchArgs {
    /// The workload shape.
    #[arg(value_enum, default_value = "pinned-producer")]
    pub workload: Workload,
    /// Server TCP address (ignored with --start-server).
    #[arg(long, default_value = "127.0.0.1:8090", value_name = "ADDR")]
    pub server_address: String,
    #[arg(long, default_value = "iggy")]
    pub username: String,
    /// Password (default: the CAIRN_ROOT_PASSWORD environment variable).
    #[arg(long)]
    pub password: Option<String>,
    /// Producer actors, each with its own connection.
    #[arg(long, default_value_t = 8)]
    pub producers: usize,
    /// Consumer actors, each with its own connection.
    #[arg(long, default_value_t = 8)]
    pub consumers: usize,
    /// Streams (default: one per actor for pinned workloads, 1 for the consumer group).
    #[arg(long)]
    pub streams: Option<usize>,
    /// Partitions of each stream's one topic.
    #[arg(long, default_value_t = 1)]
    pub partitions: u32,
    /// Payload bytes per message.
    #[arg(long, default_value_t = 1000)]
    pub message_size: usize,
    #[arg(long, default_value_t = 1000)]
    pub messages_per_batch: u32,
    /// Batches per actor (a consumer reads as many messages as one producer sends).
    #[arg(long, default_value_t = 100)]
    pub batches: u64,
    /// Payload bytes per second per producer (token bucket, e.g. 100MB, 5MiB, 250000).
    #[arg(long, value_parser = parse_bytes, value_name = "BYTES")]
    pub rate_limit: Option<u64>,
    /// serve-ceiling only: send without reading the block back and checking its XXH3, to
    /// measure what per-poll verification costs (Cairn itself always verifies).
    #[arg(long)]
    pub unverified: bool,
    /// Report label (see below); with --start-server, the mode the server runs in.
    #[arg(long, value_enum, default_value = "durable")]
    pub durability: DurabilityLabel,
    /// The server's pid, to report its CPU seconds per GB (from /proc/<pid>/stat).
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// Start `cairn serve` on a fresh temporary data directory with ephemeral ports, run
    /// against it, then stop it and remove the directory.
    #[arg(long)]
    pub start_server: bool,
    /// The server binary for --start-server (default: this executable).
    #[arg(long, value_name = "PATH")]
    pub server_binary: Option<PathBuf>,
    /// Extra server settings for --start-server, passed as `--set KEY=VALUE` (repeatable).
    #[arg(long = "server-set", value_name = "KEY=VALUE")]
    pub server_set: Vec<String>,
    /// Where --start-server creates its temporary data directory (default: the temp dir).
    #[arg(long, value_name = "DIR")]
    pub server_data_parent: Option<PathBuf>,
    /// Keep the bench streams afterwards (default: delete them).
    #[arg(long)]
    pub keep: bool,
    #[arg(long, value_name = "PATH")]
    pub output_json: Option<PathBuf>,
    /// A self-contained HTML page with SVG charts (latency over time, percentiles).
    #[arg(long, value_name = "PATH")]
    pub output_html: Option<PathBuf>,
    /// Seconds allowed to connect and log in.
    #[arg(long, default_value_t = 10)]
    pub connect_timeout_s: u64,
    /// Seconds allowed for any one request, and for a consumer to see no new data.
    #[arg(long, default_value_t = 60)]
    pub request_timeout_s: u64,
    /// Run the standard shapes of issue 5 and write a markdown section (see --suite-markdown).
    #[arg(long)]
    pub suite: bool,
    /// Multiplies the suite's batches per actor (100 at scale 1); e.g. 0.01 for a tiny run.
    #[arg(long, default_value_t = 1.0)]
    pub suite_scale: f64,
    /// Runs per suite shape; with 2 or more the first (cold) run is discarded.
    #[arg(long, default_value_t = 4)]
    pub suite_runs: usize,
    /// Where the suite writes its markdown section (default: standard output only).
    #[arg(long, value_name = "PATH")]
    pub suite_markdown: Option<PathBuf>,
}

impl BenchArgs {
    pub fn streams(&self) -> usize {
        self.streams.unwrap_or(match self.workload {
            Workload::PinnedProducer | Workload::DiskCeiling | Workload::IngestCeiling => self.producers,
            Workload::PinnedConsumer | Workload::ServeCeiling => self.consumers,
            Workload::PinnedProducerAndConsumer => self.producers,
            Workload::BalancedProducerAndConsumerGroup => 1,
        })
    }

    pub fn batch_payload_bytes(&self) -> u64 {
        self.message_size as u64 * u64::from(self.messages_per_batch)
    }

    /// Messages one producer sends, and one pinned consumer reads.
    pub fn messages_per_actor(&self) -> u64 {
        self.batches.saturating_mul(u64::from(self.messages_per_batch))
    }

    pub fn validate(&self) -> Result<(), String> {
        let streams = self.streams();
        if self.workload.produces() && self.producers == 0 {
            return Err(format!("{} needs --producers >= 1", self.workload.name()));
        }
        if self.workload.consumes() && self.consumers == 0 {
            return Err(format!("{} needs --consumers >= 1", self.workload.name()));
        }
        if streams == 0 || streams > 10_000 {
            return Err("--streams must be 1 to 10000".into());
        }
        if self.partitions == 0 || self.partitions > 10_000 {
            return Err("--partitions must be 1 to 10000".into());
        }
        if self.message_size == 0 || self.messages_per_batch == 0 || self.batches == 0 {
            return Err("--message-size, --messages-per-batch and --batches must be >= 1".into());
        }
        if self.producers > 10_000 || self.consumers > 10_000 {
            return Err("at most 10000 producers and 10000 consumers".into());
        }
        if self.batch_payload_bytes() > 1 << 30 {
            return Err("a batch may carry at most 1 GiB of payload".into());
        }
        if self.unverified && self.workload != Workload::ServeCeiling {
            return Err("--unverified applies to serve-ceiling only".into());
        }
        if self.rate_limit == Some(0) {
            return Err("--rate-limit must be > 0".into());
        }
        // A consumer reading alongside producers waits for data: its stream must have one.
        if matches!(
            self.workload,
            Workload::PinnedProducerAndConsumer | Workload::BalancedProducerAndConsumerGroup
        ) && streams > self.producers
        {
            return Err(format!(
                "{} needs --streams <= --producers (every stream a consumer reads needs a producer)",
                self.workload.name()
            ));
        }
        if !(self.suite_scale.is_finite() && self.suite_scale > 0.0) {
            return Err("--suite-scale must be > 0".into());
        }
        if self.suite_runs == 0 || self.suite_runs > 100 {
            return Err("--suite-runs must be 1 to 100".into());
        }
        Ok(())
    }

    /// The equivalent command line (used for the suite's commands and as a record).
    pub fn to_command_line(&self) -> String {
        let mut parts = vec![
            "cairn".to_string(),
            "bench".to_string(),
            self.workload.name().to_string(),
        ];
        let mut flag = |name: &str, value: String| {
            parts.push(format!("--{name}"));
            parts.push(value);
        };
        // The ceilings run no server: no address to name.
        if !self.start_server && !self.workload.is_ceiling() {
            flag("server-address", self.server_address.clone());
        }
        flag("durability", self.durability.name().to_string());
        if self.workload.produces() {
            flag("producers", self.producers.to_string());
        }
        if self.workload.consumes() {
            flag("consumers", self.consumers.to_string());
        }
        if !self.workload.is_ceiling() {
            flag("streams", self.streams().to_string());
            flag("partitions", self.partitions.to_string());
        }
        flag("message-size", self.message_size.to_string());
        flag("messages-per-batch", self.messages_per_batch.to_string());
        flag("batches", self.batches.to_string());
        if let Some(rate) = self.rate_limit {
            flag("rate-limit", rate.to_string());
        }
        for set in &self.server_set {
            flag("server-set", set.clone());
        }
        if self.unverified {
            parts.push("--unverified".to_string());
        }
        if self.start_server {
            parts.push("--start-server".to_string());
        }
        parts.join(" ")
    }
}

/// Parse a byte count: a number with an optional unit (B, KB, MB, GB decimal; KiB, MiB, GiB).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("not a byte count: {text:?}"))?;
    let factor: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" | "k" => 1e3,
        "mb" | "m" => 1e6,
        "gb" | "g" => 1e9,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        other => return Err(format!("unknown unit {other:?} in {text:?}")),
    };
    let bytes = number * factor;
    if !bytes.is_finite() || !(1.0..=1e15).contains(&bytes) {
        return Err(format!("byte count out of range: {text:?}"));
    }
    Ok(bytes.round() as u64)
}

/// The stream (1-based index) actor `actor` of a workload uses.
pub fn stream_of(actor: usize, streams: usize) -> usize {
    actor % streams.max(1) + 1
}

pub fn stream_name(stream: usize) -> String {
    format!("{STREAM_PREFIX}{stream}")
}

/// Token-bucket pacing for one producer, on an absolute schedule so rounding and late wakeups
/// never accumulate (no drift): the batch that follows `sent` bytes is due at
/// `origin + sent / rate`. The bucket holds at most `burst` of credit: a producer that fell
/// further behind (a slow acknowledgement) moves its origin so it never sends more than
/// `burst` back to back.
#[derive(Clone, Debug)]
pub struct Pacer {
    bytes_per_s: u64,
    burst: Duration,
    /// Offset of the schedule from the actor's start.
    origin: Duration,
    sent_bytes: u64,
}

impl Pacer {
    pub fn new(bytes_per_s: u64, burst: Duration) -> Pacer {
        Pacer {
            bytes_per_s: bytes_per_s.max(1),
            burst,
            origin: Duration::ZERO,
            sent_bytes: 0,
        }
    }

    /// When (from the actor's start) the next batch of `bytes` may be sent, given the time
    /// `now` (from the same start). Records the batch as sent.
    pub fn next_due(&mut self, now: Duration, bytes: u64) -> Duration {
        let mut due = self.origin + self.schedule_offset();
        if now > due + self.burst {
            // More credit than the bucket holds: drop the excess.
            self.origin += now - (due + self.burst);
            due = now - self.burst;
        }
        self.sent_bytes = self.sent_bytes.saturating_add(bytes);
        due
    }

    /// A pacer for a thread sending blocks of `block_bytes` at `rate` bytes/s, with one block
    /// (at least 1 ms) of burst.
    pub fn for_blocks(rate: u64, block_bytes: usize) -> Pacer {
        let one_block = Duration::from_secs_f64(block_bytes as f64 / rate.max(1) as f64);
        Pacer::new(rate, one_block.max(Duration::from_millis(1)))
    }

    /// Block this thread until the next `bytes` are due (`started`: when the sender began).
    pub fn sleep_until_due(&mut self, started: std::time::Instant, bytes: u64) {
        let due = self.next_due(started.elapsed(), bytes);
        let now = started.elapsed();
        if due > now {
            std::thread::sleep(due - now);
        }
    }

    /// `sent_bytes / rate`, in exact integer nanoseconds.
    fn schedule_offset(&self) -> Duration {
        let nanos = u128::from(self.sent_bytes) * 1_000_000_000 / u128::from(self.bytes_per_s);
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pacer_schedule_is_exact_and_does_not_drift() {
        // 1000 B/s, 100 B batches: one batch per 100 ms, from 0.
        let mut pacer = Pacer::new(1000, Duration::from_millis(100));
        let mut now = Duration::ZERO;
        for k in 0..1_000_000u64 {
            let due = pacer.next_due(now, 100);
            assert_eq!(due, Duration::from_millis(100 * k), "batch {k}");
            // The sender always wakes a little late: lateness must not accumulate.
            now = due + Duration::from_micros(7);
        }
    }

    #[test]
    fn pacer_with_an_awkward_rate_stays_on_the_ideal_line() {
        // 3 B/s with 1 B batches: 333_333_333.33 ns per batch; the 3000th batch is due at
        // exactly 1000 s, not 999.999999 s.
        let mut pacer = Pacer::new(3, Duration::from_secs(1));
        let mut due = Duration::ZERO;
        for _ in 0..=3000 {
            due = pacer.next_due(due, 1);
        }
        assert_eq!(due, Duration::from_secs(1000));
    }

    #[test]
    fn pacer_caps_the_burst_after_a_stall() {
        // 100 B batches at 1000 B/s, burst 200 ms (two batches of credit).
        let mut pacer = Pacer::new(1000, Duration::from_millis(200));
        assert_eq!(pacer.next_due(Duration::ZERO, 100), Duration::ZERO);
        // A 5 s stall: only the burst may go back to back, then the rate resumes.
        let now = Duration::from_secs(5);
        let first = pacer.next_due(now, 100);
        assert_eq!(first, now - Duration::from_millis(200));
        assert_eq!(pacer.next_due(now, 100), now - Duration::from_millis(100));
        assert_eq!(pacer.next_due(now, 100), now);
        assert_eq!(pacer.next_due(now, 100), now + Duration::from_millis(100));
    }

    #[test]
    fn pacer_long_run_average_is_the_rate() {
        // 100 MB/s with 1 MB batches: 1000 batches take 10 s of schedule.
        let mut pacer = Pacer::new(100_000_000, Duration::from_millis(10));
        let mut due = Duration::ZERO;
        for _ in 0..=1000 {
            due = pacer.next_due(due, 1_000_000);
        }
        assert_eq!(due, Duration::from_secs(10));
    }

    #[test]
    fn byte_counts() {
        assert_eq!(parse_bytes("100MB"), Ok(100_000_000));
        assert_eq!(parse_bytes("5MiB"), Ok(5 * 1024 * 1024));
        assert_eq!(parse_bytes("250000"), Ok(250_000));
        assert_eq!(parse_bytes("1.5 GB"), Ok(1_500_000_000));
        assert!(parse_bytes("fast").is_err());
        assert!(parse_bytes("10 parsecs").is_err());
        assert!(parse_bytes("0").is_err());
    }

    #[test]
    fn streams_are_assigned_round_robin() {
        assert_eq!(stream_of(0, 8), 1);
        assert_eq!(stream_of(7, 8), 8);
        assert_eq!(stream_of(8, 8), 1);
        assert_eq!(stream_of(3, 0), 1);
    }
}
