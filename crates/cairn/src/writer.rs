//! Group commit: one writer per partition gathers pending sends and shares one data barrier.
//!
//! An fdatasync costs far more than the write before it, so a partition that syncs once per
//! send is limited to one send per barrier latency however many clients it has. Here every
//! partition has a bounded queue and one writer task:
//!
//! 1. The handler validates a send (before anything is queued), resolves its partition and
//!    returns a [`crate::handler::PreparedSend`]; the shell awaits [`submit`], which puts a
//!    [`PendingSend`] on the partition's queue (waiting for room: backpressure) and awaits its
//!    outcome. No thread is held while a send waits for its group.
//! 2. The writer takes the first pending send and drains what else is queued, within
//!    [`GROUP_BOUNDS`] ([`Group`]).
//! 3. On a blocking thread it locks the partition, appends every batch of the group, issues
//!    ONE barrier for all of them ([`barrier`]), unlocks, and completes each send with its base
//!    offset or its error status ([`commit_group`]).
//!
//! Per ACK there are no file creations, renames or directory syncs; those belong to segment
//! rotation inside the log. Barriers are counted in [`CommitCounters`].
//!
//! Acknowledgement modes ([`AckMode`], from `storage.durability`):
//! - `durable`: a send is completed only after the barrier covering it succeeded.
//! - `relaxed`: a send is completed once its write reached the OS; the writer issues a barrier
//!   at the latest `storage.flush_interval_ms` after the first write it has not covered yet,
//!   whether or not more sends arrive.
//!
//! Failures (durability contract, guarantees 8 and 12):
//! - A write that failed and was cut back cleanly (e.g. the disk is full) refuses that send
//!   with [`WRITE_FAILED_STATUS`]; nothing of it was stored, the partition keeps taking writes
//!   and succeeds again once space returns.
//! - A failed barrier (or any failure that makes the log stop, such as a write that could not
//!   be cut back) is fatal for what it covered: every send of the group that was written gets
//!   [`BARRIER_FAILED_STATUS`], none is acknowledged, and the log refuses writes until restart.
//!   Later sends get [`PARTITION_STOPPED_STATUS`]. The stop is logged once, with the partition
//!   directory and the offsets affected.

use crate::config::Durability;
use crate::partition::{PARTITION_REFUSED_STATUS, PartitionState, lock, serving};
use cairn_storage::StorageError;
use cairn_storage::log::{CommitInfo, PartitionLog};
use cairn_wire::codes;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};

/// Sends the per-partition queue holds before submitters wait (backpressure). Each waiting
/// send already sits in its connection's memory (connections are lockstep, one request in
/// flight each), so the queue adds no memory of its own beyond this count of handles.
pub const QUEUE_SENDS_MAX: usize = 256;

/// How much one group may gather. Larger groups amortise the barrier further but make the
/// first send of the group wait for every append after it.
pub const GROUP_BOUNDS: GroupBounds = GroupBounds {
    sends_max: 128,
    bytes_max: 8 * 1024 * 1024,
};

const _: () = assert!(GROUP_BOUNDS.sends_max >= 1);
const _: () = assert!(GROUP_BOUNDS.sends_max <= QUEUE_SENDS_MAX);
const _: () = assert!(GROUP_BOUNDS.bytes_max >= 1);

/// Answered to every written send of a group whose barrier failed (or that the log stopped
/// under): 10009 `CannotSyncFile`. The send was NOT acknowledged; its bytes may or may not be
/// present after a restart. The 0.11 SDK does not retry it.
pub const BARRIER_FAILED_STATUS: u32 = cairn_wire::codes::CANNOT_SYNC_FILE;

/// Answered to sends to a partition whose log stopped after a failed barrier, until the
/// server restarts: 3003 `CannotOpenPartitionLogFile`, the same "partition unavailable"
/// status as a partition refused at boot. Not retried by the 0.11 SDK.
pub const PARTITION_STOPPED_STATUS: u32 = PARTITION_REFUSED_STATUS;

/// Answered to a send whose write failed and was cut back cleanly (disk full, transient IO
/// error): 4006 `CannotSaveMessagesToSegment`. Nothing of the send was stored; the partition
/// keeps serving, so the same send may be tried again later.
pub const WRITE_FAILED_STATUS: u32 = cairn_wire::codes::CANNOT_SAVE_MESSAGES_TO_SEGMENT;

/// What a submitted send ends with: its base offset, or an Iggy status.
pub type SendOutcome = Result<u64, u32>;

/// When a send is acknowledged (from `storage.durability`; see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckMode {
    /// After the group's barrier succeeded.
    AfterBarrier,
    /// After the write reached the OS; a barrier follows within `flush_interval`.
    AfterWrite { flush_interval: Duration },
}

impl AckMode {
    pub fn new(durability: Durability, flush_interval_ms: u64) -> AckMode {
        match durability {
            Durability::Durable => AckMode::AfterBarrier,
            Durability::Relaxed => AckMode::AfterWrite {
                flush_interval: Duration::from_millis(flush_interval_ms),
            },
        }
    }
}

/// The one barrier of a group: `PartitionLog::commit` makes everything appended so far stable
/// (one fdatasync of the data) and publishes the frontier in place (durable mode: only then do
/// polls see it). The only other caller of `commit` is a client's explicit flush
/// (`PartitionData::flush`).
pub fn barrier(log: &mut PartitionLog) -> Result<CommitInfo, StorageError> {
    log.commit()
}

// ---- groups (pure) ----

/// Bounds of one group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupBounds {
    pub sends_max: usize,
    pub bytes_max: u64,
}

/// Sends gathered for one barrier.
///
/// Invariants: `1 <= items.len() <= bounds.sends_max`; `bytes` = sum of the items' sizes;
/// `bytes <= bounds.bytes_max` unless the group holds a single item (a send larger than the
/// byte bound still forms a group, alone).
#[derive(Debug)]
pub struct Group<T> {
    items: Vec<T>,
    bytes: u64,
    bounds: GroupBounds,
}

impl<T> Group<T> {
    /// A group always takes its first item, whatever its size.
    pub fn new(first: T, first_bytes: u64, bounds: GroupBounds) -> Group<T> {
        assert!(bounds.sends_max >= 1);
        let mut items = Vec::with_capacity(bounds.sends_max.min(16));
        items.push(first);
        Group {
            items,
            bytes: first_bytes,
            bounds,
        }
    }

    /// Add `item` if the group has room for it; otherwise hand it back (it starts the next
    /// group, so queue order is kept).
    pub fn offer(&mut self, item: T, item_bytes: u64) -> Result<(), T> {
        if self.is_full() {
            return Err(item);
        }
        let Some(bytes) = self.bytes.checked_add(item_bytes) else {
            return Err(item);
        };
        if bytes > self.bounds.bytes_max {
            return Err(item);
        }
        self.items.push(item);
        self.bytes = bytes;
        debug_assert!(self.items.len() <= self.bounds.sends_max);
        Ok(())
    }

    /// Whether another item could still join (a full group stops draining the queue).
    pub fn is_full(&self) -> bool {
        self.items.len() >= self.bounds.sends_max || self.bytes >= self.bounds.bytes_max
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn into_items(self) -> Vec<T> {
        self.items
    }
}

// ---- counters ----

/// Latency buckets: bucket 0 holds 0 µs, bucket i (i >= 1) holds [2^(i-1), 2^i - 1] µs; the
/// last bucket also holds everything longer (2^30 µs is about 18 minutes).
const LATENCY_BUCKETS_COUNT: usize = 32;

/// The bucket a latency falls in (pure).
fn latency_bucket(latency_us: u64) -> usize {
    let bits = (u64::BITS - latency_us.leading_zeros()) as usize;
    bits.min(LATENCY_BUCKETS_COUNT - 1)
}

/// The largest latency bucket `index` holds (pure); for the open-ended last bucket, its lower
/// edge.
fn latency_bucket_upper_us(index: usize) -> u64 {
    debug_assert!(index < LATENCY_BUCKETS_COUNT);
    match index {
        0 => 0,
        i if i == LATENCY_BUCKETS_COUNT - 1 => 1u64 << (i - 1),
        i => (1u64 << i) - 1,
    }
}

/// Group-commit counters of one partition, or of the whole server. Updated by writers with
/// relaxed atomics (they are statistics; nothing is decided from them).
#[derive(Debug, Default)]
pub struct CommitCounters {
    /// Barriers issued for groups and background flushes that succeeded.
    barriers: AtomicU64,
    /// Barriers that failed (each stops its partition).
    barriers_failed: AtomicU64,
    /// fdatasync calls those barriers issued (data, then the frontier publication).
    fdatasyncs: AtomicU64,
    /// Sends completed with success (acknowledged).
    sends_acked: AtomicU64,
    /// Groups written (durable mode: one barrier each).
    groups: AtomicU64,
    latency_sum_us: AtomicU64,
    latency_max_us: AtomicU64,
    /// Max since the last periodic report (the reporter resets it).
    latency_max_us_window: AtomicU64,
    latency_buckets: [AtomicU64; LATENCY_BUCKETS_COUNT],
}

impl CommitCounters {
    fn record_barrier(&self, latency: Duration, info: &CommitInfo) {
        let latency_us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.barriers.fetch_add(1, Ordering::Relaxed);
        self.fdatasyncs
            .fetch_add(u64::from(info.barriers), Ordering::Relaxed);
        self.latency_sum_us.fetch_add(latency_us, Ordering::Relaxed);
        self.latency_max_us.fetch_max(latency_us, Ordering::Relaxed);
        self.latency_max_us_window
            .fetch_max(latency_us, Ordering::Relaxed);
        self.latency_buckets[latency_bucket(latency_us)].fetch_add(1, Ordering::Relaxed);
    }

    fn record_group(&self, sends_acked: u64) {
        self.groups.fetch_add(1, Ordering::Relaxed);
        self.sends_acked.fetch_add(sends_acked, Ordering::Relaxed);
    }

    fn record_barrier_failed(&self) {
        self.barriers_failed.fetch_add(1, Ordering::Relaxed);
    }

    /// Totals since start.
    pub fn snapshot(&self) -> CountersSnapshot {
        CountersSnapshot {
            barriers: self.barriers.load(Ordering::Relaxed),
            barriers_failed: self.barriers_failed.load(Ordering::Relaxed),
            fdatasyncs: self.fdatasyncs.load(Ordering::Relaxed),
            sends_acked: self.sends_acked.load(Ordering::Relaxed),
            groups: self.groups.load(Ordering::Relaxed),
            latency_sum_us: self.latency_sum_us.load(Ordering::Relaxed),
            latency_max_us: self.latency_max_us.load(Ordering::Relaxed),
            latency_buckets: std::array::from_fn(|i| self.latency_buckets[i].load(Ordering::Relaxed)),
        }
    }

    /// Totals since start, with `latency_max_us` replaced by the max since the previous call
    /// (for the periodic report; pair with [`CountersSnapshot::since`]).
    pub fn snapshot_window(&self) -> CountersSnapshot {
        let mut snapshot = self.snapshot();
        snapshot.latency_max_us = self.latency_max_us_window.swap(0, Ordering::Relaxed);
        snapshot
    }
}

/// A copy of [`CommitCounters`] at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CountersSnapshot {
    pub barriers: u64,
    pub barriers_failed: u64,
    pub fdatasyncs: u64,
    pub sends_acked: u64,
    pub groups: u64,
    pub latency_sum_us: u64,
    pub latency_max_us: u64,
    pub latency_buckets: [u64; LATENCY_BUCKETS_COUNT],
}

impl CountersSnapshot {
    /// What happened between `earlier` and `self` (both from the same counters). The max is
    /// `self`'s (a window max when taken with `snapshot_window`).
    pub fn since(&self, earlier: &CountersSnapshot) -> CountersSnapshot {
        CountersSnapshot {
            barriers: self.barriers.saturating_sub(earlier.barriers),
            barriers_failed: self.barriers_failed.saturating_sub(earlier.barriers_failed),
            fdatasyncs: self.fdatasyncs.saturating_sub(earlier.fdatasyncs),
            sends_acked: self.sends_acked.saturating_sub(earlier.sends_acked),
            groups: self.groups.saturating_sub(earlier.groups),
            latency_sum_us: self.latency_sum_us.saturating_sub(earlier.latency_sum_us),
            latency_max_us: self.latency_max_us,
            latency_buckets: std::array::from_fn(|i| {
                self.latency_buckets[i].saturating_sub(earlier.latency_buckets[i])
            }),
        }
    }

    pub fn is_idle(&self) -> bool {
        self.barriers == 0 && self.barriers_failed == 0 && self.sends_acked == 0 && self.groups == 0
    }

    /// Acknowledged sends per successful barrier, None before the first barrier.
    pub fn sends_per_barrier(&self) -> Option<f64> {
        (self.barriers > 0).then(|| self.sends_acked as f64 / self.barriers as f64)
    }

    /// Upper edge of the bucket holding the `quantile` (0..=1) barrier latency, in µs.
    pub fn latency_quantile_us(&self, quantile: f64) -> Option<u64> {
        let total: u64 = self.latency_buckets.iter().sum();
        if total == 0 {
            return None;
        }
        // The rank of the quantile among `total` samples, at least the first sample.
        let rank = ((total as f64 * quantile.clamp(0.0, 1.0)).ceil() as u64).max(1);
        let mut seen = 0u64;
        for (index, count) in self.latency_buckets.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return Some(latency_bucket_upper_us(index));
            }
        }
        Some(latency_bucket_upper_us(LATENCY_BUCKETS_COUNT - 1))
    }

    /// One line for the log, e.g. `barriers=12 sends=340 sends/barrier=28.33 barrier_p50<=1023us
    /// barrier_mean=812us barrier_max=2345us failed=0`.
    pub fn summary(&self) -> String {
        let per_barrier = self
            .sends_per_barrier()
            .map_or_else(|| "-".to_string(), |ratio| format!("{ratio:.2}"));
        let p50 = self
            .latency_quantile_us(0.5)
            .map_or_else(|| "-".to_string(), |us| format!("{us}us"));
        let mean = match self.barriers {
            0 => "-".to_string(),
            barriers => format!("{}us", self.latency_sum_us / barriers),
        };
        format!(
            "barriers={} sends={} sends/barrier={per_barrier} groups={} fdatasyncs={} barrier_p50<={p50} barrier_mean={mean} barrier_max={}us failed={}",
            self.barriers,
            self.sends_acked,
            self.groups,
            self.fdatasyncs,
            self.latency_max_us,
            self.barriers_failed
        )
    }
}

// ---- the writer ----

/// One send waiting for its partition's writer.
#[derive(Debug)]
pub struct PendingSend {
    /// A validated client batch as received; the log stamps a copy of its header and writes
    /// the frames as they are.
    pub batch: bytes::Bytes,
    /// When the server took the send in (the append timestamp; the log keeps it monotone).
    pub received_at_us: u64,
    pub reply: oneshot::Sender<SendOutcome>,
}

/// What every partition's writer shares: where to spawn, how to acknowledge, global counters.
#[derive(Debug, Clone)]
pub struct WriterContext {
    runtime: tokio::runtime::Handle,
    mode: AckMode,
    global: Arc<CommitCounters>,
}

impl WriterContext {
    pub fn new(runtime: tokio::runtime::Handle, mode: AckMode) -> WriterContext {
        WriterContext {
            runtime,
            mode,
            global: Arc::new(CommitCounters::default()),
        }
    }

    pub fn global_counters(&self) -> &Arc<CommitCounters> {
        &self.global
    }

    /// Start the writer of one partition.
    pub fn spawn(
        &self,
        state: Arc<Mutex<PartitionState>>,
        dir: PathBuf,
        counters: Arc<CommitCounters>,
    ) -> WriterHandle {
        let (queue, receiver) = mpsc::channel(QUEUE_SENDS_MAX);
        let shared = Arc::new(WriterShared {
            state,
            dir,
            acks_before_barrier: matches!(self.mode, AckMode::AfterWrite { .. }),
            partition: counters,
            global: self.global.clone(),
        });
        let task = self.runtime.spawn(run(receiver, shared, self.mode));
        WriterHandle { queue, task }
    }
}

/// The submitting side of a partition's writer, owned by `catalog::Partition`.
#[derive(Debug)]
pub struct WriterHandle {
    queue: mpsc::Sender<PendingSend>,
    task: tokio::task::JoinHandle<()>,
}

impl WriterHandle {
    /// A sender for [`submit`].
    pub fn queue(&self) -> mpsc::Sender<PendingSend> {
        self.queue.clone()
    }

    /// Close the queue and wait until the writer has completed every send already queued
    /// (and, in relaxed mode, made them stable).
    pub async fn close(self) {
        drop(self.queue);
        if let Err(error) = self.task.await {
            tracing::error!(%error, "a partition writer ended abnormally");
        }
    }
}

/// Queue a send on the partition's writer (waiting while the queue is full) and wait for its
/// outcome. `None` means the writer is closed (clean stop in progress).
pub async fn submit(
    queue: Option<mpsc::Sender<PendingSend>>,
    batch: bytes::Bytes,
    received_at_us: u64,
) -> SendOutcome {
    let Some(queue) = queue else {
        return Err(codes::ERROR);
    };
    let (reply, outcome) = oneshot::channel();
    let pending = PendingSend {
        batch,
        received_at_us,
        reply,
    };
    if queue.send(pending).await.is_err() {
        // The writer ended: only at a clean stop, after the shell stopped taking requests.
        return Err(codes::ERROR);
    }
    match outcome.await {
        Ok(outcome) => outcome,
        Err(_) => {
            // The group's blocking work panicked (a bug): the send was not acknowledged.
            tracing::error!("a partition writer dropped a send without completing it");
            Err(codes::ERROR)
        }
    }
}

/// What the writer task and its blocking work share.
struct WriterShared {
    state: Arc<Mutex<PartitionState>>,
    dir: PathBuf,
    /// Relaxed mode: sends are acknowledged before a barrier covers them, so a stop can
    /// put acknowledged writes at risk (said so in the stop's log line).
    acks_before_barrier: bool,
    partition: Arc<CommitCounters>,
    global: Arc<CommitCounters>,
}

/// The writer task of one partition: gather a group, commit it on a blocking thread, repeat.
/// Ends when every queue sender is gone and the queue is drained.
async fn run(mut queue: mpsc::Receiver<PendingSend>, shared: Arc<WriterShared>, mode: AckMode) {
    // A send that did not fit the previous group: it starts the next one.
    let mut carried: Option<PendingSend> = None;
    // Relaxed mode: when the oldest write not yet covered by a barrier was acknowledged.
    // Invariant: None in durable mode (every group ends with its barrier).
    let mut unstable_since: Option<Instant> = None;
    loop {
        let first = match carried.take() {
            Some(send) => send,
            None => {
                let next = match (mode, unstable_since) {
                    (AckMode::AfterWrite { flush_interval }, Some(since)) => {
                        tokio::select! {
                            next = queue.recv() => next,
                            _ = tokio::time::sleep_until((since + flush_interval).into()) => {
                                // On failure the log is stopped (and said so): a barrier is
                                // never retried, so there is nothing left to wait for either.
                                stabilize(&shared).await;
                                unstable_since = None;
                                continue;
                            }
                        }
                    }
                    _ => queue.recv().await,
                };
                match next {
                    Some(send) => send,
                    None => break,
                }
            }
        };
        let first_bytes = first.batch.len() as u64;
        let mut group = Group::new(first, first_bytes, GROUP_BOUNDS);
        while !group.is_full() {
            let Ok(next) = queue.try_recv() else {
                break;
            };
            let next_bytes = next.batch.len() as u64;
            if let Err(back) = group.offer(next, next_bytes) {
                carried = Some(back);
                break;
            }
        }
        let barrier_required = match (mode, unstable_since) {
            (AckMode::AfterBarrier, _) => true,
            // Under steady traffic the queue never idles long enough for the timer above, so
            // the deadline is also checked here.
            (AckMode::AfterWrite { flush_interval }, Some(since)) => since.elapsed() >= flush_interval,
            (AckMode::AfterWrite { .. }, None) => false,
        };
        tracing::trace!(sends = group.len(), bytes = group.bytes(), "group gathered");
        let sends = group.into_items();
        let work = shared.clone();
        let done = tokio::task::spawn_blocking(move || commit_group(&work, sends, barrier_required)).await;
        let done = match done {
            Ok(done) => done,
            Err(error) => {
                // A panic under the partition lock poisons it; later groups panic the same way
                // and their sends get errors. Nothing was acknowledged by the failed group.
                tracing::error!(partition_dir = %shared.dir.display(), %error, "group commit panicked");
                continue;
            }
        };
        if done.barrier_succeeded || done.stopped {
            unstable_since = None;
        }
        if done.written_unstable && unstable_since.is_none() {
            unstable_since = Some(Instant::now());
        }
        debug_assert!(mode != AckMode::AfterBarrier || unstable_since.is_none());
    }
    // Every sender is gone (clean stop or the partition was dropped): leave nothing that was
    // acknowledged unstable.
    if unstable_since.is_some() {
        stabilize(&shared).await;
    }
}

/// What one group's commit left behind, for the writer's relaxed-mode bookkeeping.
#[derive(Debug, Default, Clone, Copy)]
struct GroupDone {
    /// A barrier covering everything appended so far succeeded.
    barrier_succeeded: bool,
    /// Data was written and acknowledged without a barrier (relaxed mode).
    written_unstable: bool,
    /// The log is stopped (now or before): no barrier will ever be issued again.
    stopped: bool,
}

/// Append every send of a group under the partition lock, issue one barrier (when
/// `barrier_required`), then complete every send. Runs on a blocking thread.
fn commit_group(shared: &WriterShared, sends: Vec<PendingSend>, barrier_required: bool) -> GroupDone {
    assert!(!sends.is_empty());
    let sends_count = sends.len();
    let mut replies: Vec<(oneshot::Sender<SendOutcome>, SendOutcome)> = Vec::with_capacity(sends_count);
    let mut done = GroupDone::default();
    {
        let mut state = lock(&shared.state);
        let data = match serving(&mut state) {
            Ok(data) => data,
            Err(status) => {
                drop(state);
                for send in sends {
                    let _ = send.reply.send(Err(status));
                }
                return done;
            }
        };
        let log = &mut data.log;
        if log.stopped_reason().is_some() {
            // Stopped earlier (logged then): refuse without touching the log.
            done.stopped = true;
            drop(state);
            for send in sends {
                let _ = send.reply.send(Err(PARTITION_STOPPED_STATUS));
            }
            return done;
        }
        // Sends written to the log in this group, with their base offsets: acknowledged only
        // if no stop happens before the group ends (and, when required, the barrier succeeds).
        let mut written: Vec<(oneshot::Sender<SendOutcome>, u64)> = Vec::with_capacity(sends_count);
        let mut stop_cause: Option<String> = None;
        for send in sends {
            if stop_cause.is_some() {
                replies.push((send.reply, Err(PARTITION_STOPPED_STATUS)));
                continue;
            }
            match log.append(&send.batch, send.received_at_us) {
                Ok(base_offset) => written.push((send.reply, base_offset)),
                Err(error) if log.stopped_reason().is_some() => {
                    // E.g. a partial write that could not be cut back, or a failed seal barrier
                    // at rotation: the state on disk is unknown.
                    stop_cause = Some(format!("append failed and stopped the log: {error}"));
                    replies.push((send.reply, Err(BARRIER_FAILED_STATUS)));
                }
                Err(error) => {
                    // The log cut the failed write back: nothing of this send was stored and
                    // the log keeps serving (disk full recovers once space returns).
                    tracing::warn!(
                        partition_dir = %shared.dir.display(),
                        %error,
                        "append failed and was cut back cleanly: the send was refused, nothing of it was stored; the partition keeps serving"
                    );
                    replies.push((send.reply, Err(append_status(&error))));
                }
            }
        }
        if stop_cause.is_none() && !written.is_empty() && barrier_required {
            let started = Instant::now();
            match barrier(log) {
                Ok(info) => {
                    let latency = started.elapsed();
                    shared.partition.record_barrier(latency, &info);
                    shared.global.record_barrier(latency, &info);
                    done.barrier_succeeded = true;
                }
                Err(error) => stop_cause = Some(format!("data barrier failed: {error}")),
            }
        }
        if let Some(cause) = stop_cause {
            done.stopped = true;
            shared.partition.record_barrier_failed();
            shared.global.record_barrier_failed();
            let first_offset = written.first().map(|(_, base)| *base);
            let earlier = if shared.acks_before_barrier {
                // Relaxed mode: earlier groups were acknowledged after their write alone.
                "sends acknowledged earlier (relaxed mode) that no successful barrier covered yet may be lost if the OS crashes, \
                 and their offsets will not be re-issued"
            } else {
                "nothing acknowledged earlier is affected"
            };
            tracing::error!(
                partition_dir = %shared.dir.display(),
                %cause,
                written_sends = written.len(),
                written_offsets = %offsets_text(first_offset, log.next_offset()),
                "partition stopped taking writes until restart: the sends of this group were NOT acknowledged \
                 (clients got status {BARRIER_FAILED_STATUS}); after a restart their messages may or may not be present; \
                 {earlier}; later sends get status {PARTITION_STOPPED_STATUS}"
            );
            for (reply, _) in written {
                replies.push((reply, Err(BARRIER_FAILED_STATUS)));
            }
        } else {
            done.written_unstable = !written.is_empty() && !barrier_required;
            let acked = written.len() as u64;
            shared.partition.record_group(acked);
            shared.global.record_group(acked);
            for (reply, base_offset) in written {
                replies.push((reply, Ok(base_offset)));
            }
        }
    }
    // Completed after the lock is released, so woken submitters never wait on it.
    debug_assert_eq!(replies.len(), sends_count);
    for (reply, outcome) in replies {
        // A submitter that went away (connection closed) just misses its reply.
        let _ = reply.send(outcome);
    }
    done
}

/// Relaxed mode: make every acknowledged write stable. Returns whether the barrier succeeded.
async fn stabilize(shared: &Arc<WriterShared>) -> bool {
    let work = shared.clone();
    let joined = tokio::task::spawn_blocking(move || {
        let mut state = lock(&work.state);
        let Ok(data) = serving(&mut state) else {
            // Deleted (or refused): nothing to make stable.
            return true;
        };
        if data.stopped_reason().is_some() {
            return false;
        }
        let started = Instant::now();
        match barrier(&mut data.log) {
            Ok(info) => {
                let latency = started.elapsed();
                work.partition.record_barrier(latency, &info);
                work.global.record_barrier(latency, &info);
                true
            }
            Err(error) => {
                work.partition.record_barrier_failed();
                work.global.record_barrier_failed();
                tracing::error!(
                    partition_dir = %work.dir.display(),
                    %error,
                    next_offset = data.log.next_offset(),
                    "relaxed-mode background barrier failed: partition stopped taking writes until restart; \
                     messages acknowledged since the last successful barrier (at most storage.flush_interval_ms of traffic) \
                     may be lost if the OS crashes; their offsets will not be re-issued; later sends get status {PARTITION_STOPPED_STATUS}"
                );
                false
            }
        }
    })
    .await;
    joined.unwrap_or_else(|error| {
        tracing::error!(partition_dir = %shared.dir.display(), %error, "background barrier panicked");
        false
    })
}

/// Status for an append that failed without stopping the log.
fn append_status(error: &StorageError) -> u32 {
    match error {
        StorageError::Io { .. } => WRITE_FAILED_STATUS,
        // Validation ran before the send was queued; a precondition the log still refuses
        // (e.g. offsets exhausted) is a server-side error.
        StorageError::Invalid(_) => codes::ERROR,
        StorageError::Damaged { .. } => PARTITION_REFUSED_STATUS,
    }
}

fn offsets_text(first_offset: Option<u64>, next_offset: u64) -> String {
    match first_offset {
        Some(first) => format!("{first}..{next_offset}"),
        None => "none".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUNDS: GroupBounds = GroupBounds {
        sends_max: 3,
        bytes_max: 100,
    };

    #[test]
    fn group_takes_its_first_item_whatever_its_size() {
        let group = Group::new(1u32, 1_000, BOUNDS);
        assert_eq!(group.len(), 1);
        assert!(group.is_full());
        assert_eq!(group.bytes(), 1_000);
    }

    #[test]
    fn group_stops_at_the_send_count_bound() {
        let mut group = Group::new(1u32, 1, BOUNDS);
        assert_eq!(group.offer(2, 1), Ok(()));
        assert!(!group.is_full());
        assert_eq!(group.offer(3, 1), Ok(()));
        assert!(group.is_full());
        assert_eq!(group.offer(4, 1), Err(4), "the fourth send starts the next group");
        assert_eq!(group.into_items(), vec![1, 2, 3]);
    }

    #[test]
    fn group_stops_at_the_byte_bound_and_hands_the_item_back() {
        let mut group = Group::new(1u32, 60, BOUNDS);
        assert_eq!(group.offer(2, 41), Err(2), "60 + 41 > 100");
        assert_eq!(group.offer(3, 40), Ok(()), "60 + 40 = 100 fits exactly");
        assert!(group.is_full());
        assert_eq!(group.bytes(), 100);
        assert_eq!(group.offer(4, 0), Err(4));
        assert_eq!(group.into_items(), vec![1, 3]);
    }

    #[test]
    fn group_byte_count_never_overflows() {
        let bounds = GroupBounds {
            sends_max: 10,
            bytes_max: u64::MAX,
        };
        let mut group = Group::new(1u32, u64::MAX - 1, bounds);
        assert_eq!(group.offer(2, 2), Err(2));
        assert_eq!(group.offer(3, 1), Ok(()));
        assert_eq!(group.bytes(), u64::MAX);
    }

    #[test]
    fn group_bounds_hold_for_random_offers() {
        use rand::{Rng, SeedableRng};
        let seed: u64 = rand::random();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        for _ in 0..1_000 {
            let bounds = GroupBounds {
                sends_max: rng.gen_range(1..20),
                bytes_max: rng.gen_range(1..1_000),
            };
            let mut group = Group::new(0usize, rng.gen_range(0..2_000), bounds);
            let mut offered = 1usize;
            let mut refused = None;
            for item in 1..50usize {
                let size = rng.gen_range(0..300);
                offered += 1;
                if let Err(back) = group.offer(item, size) {
                    assert_eq!(back, item, "seed {seed}");
                    refused = Some(item);
                    break;
                }
            }
            let len = group.len();
            let bytes = group.bytes();
            assert!(len >= 1, "seed {seed}");
            assert!(len <= bounds.sends_max, "seed {seed}");
            assert!(len == 1 || bytes <= bounds.bytes_max, "seed {seed}");
            let items = group.into_items();
            // Queue order is kept: the group is a prefix of what was offered.
            assert_eq!(items, (0..len).collect::<Vec<_>>(), "seed {seed}");
            assert!(refused.is_none_or(|item| item == len), "seed {seed}");
            assert!(offered >= len, "seed {seed}");
        }
    }

    #[test]
    fn latency_buckets_cover_powers_of_two() {
        assert_eq!(latency_bucket(0), 0);
        assert_eq!(latency_bucket(1), 1);
        assert_eq!(latency_bucket(2), 2);
        assert_eq!(latency_bucket(3), 2);
        assert_eq!(latency_bucket(4), 3);
        assert_eq!(latency_bucket(1023), 10);
        assert_eq!(latency_bucket(1024), 11);
        assert_eq!(latency_bucket(u64::MAX), LATENCY_BUCKETS_COUNT - 1);
        for latency_us in [0u64, 1, 2, 3, 5, 100, 1023, 1024, 65_000] {
            assert!(latency_us <= latency_bucket_upper_us(latency_bucket(latency_us)));
        }
    }

    const TWO_FDATASYNCS: CommitInfo = CommitInfo {
        durable_next_offset: 0,
        barriers: 2,
    };

    #[test]
    fn counters_summarise_barriers_and_sends() {
        let counters = CommitCounters::default();
        assert!(counters.snapshot().is_idle());
        assert_eq!(counters.snapshot().sends_per_barrier(), None);
        assert_eq!(counters.snapshot().latency_quantile_us(0.5), None);
        for latency_us in [100u64, 100, 100, 5_000] {
            counters.record_barrier(Duration::from_micros(latency_us), &TWO_FDATASYNCS);
        }
        counters.record_group(10);
        counters.record_group(30);
        let total = counters.snapshot();
        assert_eq!(total.barriers, 4);
        assert_eq!(total.sends_acked, 40);
        assert_eq!(total.sends_per_barrier(), Some(10.0));
        assert_eq!(
            total.latency_quantile_us(0.5),
            Some(127),
            "100 µs lies in [64, 127]"
        );
        assert_eq!(total.latency_quantile_us(1.0), Some(8_191));
        assert_eq!(total.latency_max_us, 5_000);
        let line = total.summary();
        assert!(line.contains("barriers=4 sends=40 sends/barrier=10.00"), "{line}");
        assert!(line.contains("fdatasyncs=8"), "{line}");
        assert!(line.contains("barrier_max=5000us"), "{line}");

        let window = counters.snapshot_window();
        assert_eq!(window.latency_max_us, 5_000);
        counters.record_barrier(Duration::from_micros(7), &TWO_FDATASYNCS);
        counters.record_group(2);
        let delta = counters.snapshot_window().since(&window);
        assert_eq!(delta.barriers, 1);
        assert_eq!(delta.sends_acked, 2);
        assert_eq!(
            delta.latency_max_us, 7,
            "the window max restarts after each report"
        );
        assert_eq!(delta.latency_quantile_us(0.5), Some(7));
        assert_eq!(counters.snapshot().latency_max_us, 5_000, "the total max stays");
    }

    #[test]
    fn ack_mode_follows_the_server_durability() {
        assert_eq!(AckMode::new(Durability::Durable, 1000), AckMode::AfterBarrier);
        assert_eq!(
            AckMode::new(Durability::Relaxed, 250),
            AckMode::AfterWrite {
                flush_interval: Duration::from_millis(250)
            }
        );
    }

    // ---- commit_group and the writer against a disk with injected faults ----

    use crate::partition::PartitionData;
    use cairn_storage::log::{LogConfig, SyncMode};
    use cairn_storage::offsets::ConsumerOffsets;

    use crate::test_support::{DISK_FULL, Faults, FaultyDisk};

    /// A valid client batch of `count` messages of `payload_bytes` bytes.
    fn client_batch(count: u32, payload_bytes: usize) -> Vec<u8> {
        crate::test_support::client_batch(count, payload_bytes, 7)
    }

    struct Fixture {
        _dir: tempfile::TempDir,
        faults: Arc<Faults>,
        shared: Arc<WriterShared>,
    }

    fn fixture() -> Fixture {
        let dir = tempfile::tempdir().expect("tempdir");
        let faults = Arc::new(Faults::default());
        let disk = Arc::new(FaultyDisk {
            faults: faults.clone(),
        });
        let partition_dir = dir.path().join("partition");
        let config = LogConfig::new(1 << 20, SyncMode::GroupCommit);
        let log = PartitionLog::create_on(disk, &partition_dir, 0, config).expect("create log");
        let offsets = ConsumerOffsets::open(&partition_dir.join("offsets")).expect("offsets");
        let state = PartitionState::Serving(Box::new(PartitionData { log, offsets }));
        let shared = Arc::new(WriterShared {
            state: Arc::new(Mutex::new(state)),
            dir: partition_dir,
            acks_before_barrier: false,
            partition: Arc::default(),
            global: Arc::default(),
        });
        Fixture {
            _dir: dir,
            faults,
            shared,
        }
    }

    /// Run one group of sends with `counts[i]` messages each; return what each send got.
    fn run_group(
        shared: &WriterShared,
        counts: &[u32],
        barrier_required: bool,
    ) -> (GroupDone, Vec<SendOutcome>) {
        let mut outcomes = Vec::new();
        let mut sends = Vec::new();
        for &count in counts {
            let (reply, outcome) = oneshot::channel();
            sends.push(PendingSend {
                batch: client_batch(count, 10).into(),
                received_at_us: 1_000,
                reply,
            });
            outcomes.push(outcome);
        }
        let done = commit_group(shared, sends, barrier_required);
        let outcomes = outcomes
            .into_iter()
            .map(|mut outcome| outcome.try_recv().expect("every send is completed"))
            .collect();
        (done, outcomes)
    }

    fn next_offset(shared: &WriterShared) -> u64 {
        match &*lock(&shared.state) {
            PartitionState::Serving(data) => data.log.next_offset(),
            _ => panic!("partition not serving"),
        }
    }

    fn stopped(shared: &WriterShared) -> bool {
        match &*lock(&shared.state) {
            PartitionState::Serving(data) => data.stopped_reason().is_some(),
            _ => panic!("partition not serving"),
        }
    }

    #[test]
    fn a_group_shares_one_barrier() {
        let fixture = fixture();
        let (done, outcomes) = run_group(&fixture.shared, &[1, 3, 2, 1], true);
        assert_eq!(outcomes, vec![Ok(0), Ok(1), Ok(4), Ok(6)]);
        assert!(done.barrier_succeeded);
        assert!(!done.written_unstable);
        let counters = fixture.shared.partition.snapshot();
        assert_eq!(counters.barriers, 1);
        assert_eq!(counters.sends_acked, 4);
        assert_eq!(fixture.shared.global.snapshot().sends_acked, 4);
        assert_eq!(next_offset(&fixture.shared), 7);
    }

    #[test]
    fn relaxed_group_acknowledges_without_a_barrier() {
        let fixture = fixture();
        let (done, outcomes) = run_group(&fixture.shared, &[2, 2], false);
        assert_eq!(outcomes, vec![Ok(0), Ok(2)]);
        assert!(!done.barrier_succeeded);
        assert!(done.written_unstable);
        assert_eq!(fixture.shared.partition.snapshot().barriers, 0);
        assert_eq!(fixture.shared.partition.snapshot().sends_acked, 2);
    }

    #[test]
    fn a_failed_barrier_fails_its_whole_group_and_stops_the_partition() {
        let fixture = fixture();
        let (_, first) = run_group(&fixture.shared, &[1], true);
        assert_eq!(first, vec![Ok(0)]);

        fixture.faults.syncs_fail.store(true, Ordering::Relaxed);
        let (done, outcomes) = run_group(&fixture.shared, &[1, 2, 1], true);
        assert_eq!(
            outcomes,
            vec![Err(BARRIER_FAILED_STATUS); 3],
            "nothing the barrier covered is acknowledged"
        );
        assert!(!done.barrier_succeeded);
        assert!(done.stopped);
        assert!(stopped(&fixture.shared));
        let counters = fixture.shared.partition.snapshot();
        assert_eq!(counters.barriers_failed, 1);
        assert_eq!(
            counters.sends_acked, 1,
            "only the first send was ever acknowledged"
        );

        // Even once the disk behaves again, the partition refuses writes until restart: the
        // barrier is never retried on the same descriptor.
        fixture.faults.syncs_fail.store(false, Ordering::Relaxed);
        let offset_before = next_offset(&fixture.shared);
        let (_, later) = run_group(&fixture.shared, &[1, 1], true);
        assert_eq!(later, vec![Err(PARTITION_STOPPED_STATUS); 2]);
        assert_eq!(
            next_offset(&fixture.shared),
            offset_before,
            "nothing written after the stop"
        );

        // The acknowledged message is still readable.
        let mut out = Vec::new();
        match &*lock(&fixture.shared.state) {
            PartitionState::Serving(data) => assert!(data.log.read(0, 1, &mut out).expect("read") == 1),
            _ => panic!("partition not serving"),
        }
    }

    #[test]
    fn a_cut_back_write_refuses_only_that_send_and_writes_resume() {
        let fixture = fixture();
        let (_, first) = run_group(&fixture.shared, &[2], true);
        assert_eq!(first, vec![Ok(0)]);

        // Disk full: each write fails half-way and is cut back.
        fixture
            .faults
            .log_writes_to_fail
            .store(DISK_FULL, Ordering::Relaxed);
        let (done, outcomes) = run_group(&fixture.shared, &[1, 3], true);
        assert_eq!(outcomes, vec![Err(WRITE_FAILED_STATUS); 2]);
        assert!(!done.barrier_succeeded, "nothing written, no barrier needed");
        assert!(
            !stopped(&fixture.shared),
            "a cleanly cut-back write does not stop the partition"
        );
        assert_eq!(
            next_offset(&fixture.shared),
            2,
            "no offset was used by the refused sends"
        );

        // Space returns: sends succeed at the next offset, contiguous with what was acknowledged.
        fixture.faults.log_writes_to_fail.store(0, Ordering::Relaxed);
        let (done, outcomes) = run_group(&fixture.shared, &[1, 1], true);
        assert_eq!(outcomes, vec![Ok(2), Ok(3)]);
        assert!(done.barrier_succeeded);

        // The files hold the acknowledged records, whole: a reopen serves all four messages.
        let mut out = Vec::new();
        let reopened = PartitionLog::open(
            &fixture.shared.dir,
            0,
            LogConfig::new(1 << 20, SyncMode::GroupCommit),
        )
        .expect("reopen");
        assert_eq!(reopened.read(0, 10, &mut out).expect("read"), 4);
        assert!(
            reopened.next_offset() >= 4,
            "no acknowledged offset is handed out again"
        );
    }

    #[test]
    fn a_mixed_group_acknowledges_the_sends_that_were_written() {
        let fixture = fixture();
        let (_, first) = run_group(&fixture.shared, &[1], true);
        assert_eq!(first, vec![Ok(0)]);
        // One write fails and is cut back: the group's first send is refused, the two after it
        // are written, covered by the group's one barrier, at contiguous offsets.
        fixture.faults.log_writes_to_fail.store(1, Ordering::Relaxed);
        let (done, outcomes) = run_group(&fixture.shared, &[2, 1, 3], true);
        assert_eq!(outcomes, vec![Err(WRITE_FAILED_STATUS), Ok(1), Ok(2)]);
        assert!(done.barrier_succeeded);
        assert_eq!(fixture.shared.partition.snapshot().barriers, 2);
        assert_eq!(next_offset(&fixture.shared), 5);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_writer_completes_concurrent_sends_with_distinct_contiguous_offsets() {
        let fixture = fixture();
        let context = WriterContext::new(tokio::runtime::Handle::current(), AckMode::AfterBarrier);
        let counters = Arc::new(CommitCounters::default());
        let handle = context.spawn(
            fixture.shared.state.clone(),
            fixture.shared.dir.clone(),
            counters.clone(),
        );
        let mut tasks = tokio::task::JoinSet::new();
        const SENDERS: u32 = 32;
        for _ in 0..SENDERS {
            let queue = handle.queue();
            tasks.spawn(async move { submit(Some(queue), client_batch(2, 5).into(), 1_000).await });
        }
        let mut bases = Vec::new();
        while let Some(joined) = tasks.join_next().await {
            bases.push(joined.expect("task").expect("send acknowledged"));
        }
        bases.sort_unstable();
        assert_eq!(bases, (0..SENDERS as u64).map(|i| i * 2).collect::<Vec<_>>());
        handle.close().await;
        let snapshot = counters.snapshot();
        assert_eq!(snapshot.sends_acked, u64::from(SENDERS));
        assert!(snapshot.barriers >= 1);
        assert!(snapshot.barriers <= u64::from(SENDERS));
        assert_eq!(
            context.global_counters().snapshot().sends_acked,
            u64::from(SENDERS)
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn relaxed_writer_makes_acknowledged_writes_stable_within_the_interval() {
        let fixture = fixture();
        let context = WriterContext::new(
            tokio::runtime::Handle::current(),
            AckMode::AfterWrite {
                flush_interval: Duration::from_millis(20),
            },
        );
        let counters = Arc::new(CommitCounters::default());
        let handle = context.spawn(
            fixture.shared.state.clone(),
            fixture.shared.dir.clone(),
            counters.clone(),
        );
        assert_eq!(
            submit(Some(handle.queue()), client_batch(1, 5).into(), 1_000).await,
            Ok(0)
        );
        // The background barrier follows without further traffic; wait for it, bounded.
        let deadline = Instant::now() + Duration::from_secs(10);
        while counters.snapshot().barriers == 0 {
            assert!(Instant::now() < deadline, "no background barrier within 10 s");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        handle.close().await;
        assert_eq!(
            counters.snapshot().barriers,
            1,
            "idle afterwards: one barrier covered the write"
        );
    }
}
