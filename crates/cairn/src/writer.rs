//! Group commit: one writer per partition gathers pending sends into one op of the
//! partition's group, so they share one data barrier.
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
//!    [`GROUP_BOUNDS`] ([`Group`]); while more is queued, it gathers further groups, up to
//!    [`LANES`] of them.
//! 3. On a blocking thread it locks the partition and appends each group's batches as ONE op
//!    of the partition group ([`crate::partition::PartitionData::append_batch`], one lane
//!    each): the ops are written to the segment log, made durable by one barrier for all of
//!    them (in `relaxed` mode later, by a flush), and applied, which mints each batch's
//!    offsets; it unlocks and completes each send with its base offset or its error status
//!    ([`commit_groups`]). Each op is stamped with the latest arrival time of its sends.
//!
//! Per ACK there are no file creations, renames or directory syncs; those belong to segment
//! rotation inside the log. Barriers are counted in [`CommitCounters`].
//!
//! In `durable` mode a send is acknowledged only once its op is durable. In `relaxed` mode
//! the op is acknowledged once written to the journal; a flush on a timer
//! (`partition::flush_relaxed`) makes it durable (see `cairn_storage::journal`, "Relaxed
//! mode", for what a crash keeps and why no offset is handed out twice).
//!
//! Failures (durability contract, guarantees 8 and 12):
//! - A write that failed and was undone (e.g. the disk is full) refuses every send of its op,
//!   and of the ops after it in the same commit, with [`WRITE_FAILED_STATUS`]: nothing of
//!   them was stored. The ops before it in the commit were made durable and are
//!   acknowledged. The partition keeps taking writes and succeeds again once space returns.
//! - A failed barrier (or any failure that makes the partition stop, such as a write that
//!   could not be undone) is fatal for what it covered: every send of those ops gets
//!   [`BARRIER_FAILED_STATUS`], none is acknowledged, and the partition refuses writes until
//!   restart. Later sends get [`PARTITION_STOPPED_STATUS`]. The stop is logged once per
//!   commit, with the partition directory and the offsets affected.

use crate::node::{GroupError, LANES};
pub use crate::partition::{BARRIER_FAILED_STATUS, PARTITION_STOPPED_STATUS, WRITE_FAILED_STATUS};
use crate::partition::{PartitionState, lock, serving, serving_verified};
use crate::partition_group::{Append, PartitionError};
use cairn_wire::batch::{self, ReceivedBatch};
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
// A group is one append op: its batches fit one op.
const _: () = assert!(GROUP_BOUNDS.sends_max <= cairn_machine::partition::APPEND_BATCHES_MAX);

/// The largest `limits.batch_bytes_max` a partition's op can carry: a prepare's body less an
/// append's framing (timestamp, count, one length) for a group of one send. A group of
/// several sends stays within [`GROUP_BOUNDS`]`.bytes_max`, far below it.
pub const BATCH_BYTES_LIMIT: u64 =
    (cairn_vsr::constants::Shape::PARTITION.body_size_max() - 8 - 4 - 4) as u64;
const _: () =
    assert!(GROUP_BOUNDS.bytes_max + 8 + 4 + 4 * GROUP_BOUNDS.sends_max as u64 <= BATCH_BYTES_LIMIT);

/// What a submitted send ends with: its base offset, or an Iggy status.
pub type SendOutcome = Result<u64, u32>;

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
    fn record_barrier(&self, latency: Duration, fdatasyncs: u64) {
        let latency_us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.barriers.fetch_add(1, Ordering::Relaxed);
        self.fdatasyncs.fetch_add(fdatasyncs, Ordering::Relaxed);
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
    /// A validated client batch as received; the partition's op stamps it.
    pub batch: ReceivedBatch,
    /// When the server took the send in (the op's timestamp is its group's latest).
    pub received_at_us: u64,
    pub reply: oneshot::Sender<SendOutcome>,
}

/// What every partition's writer shares: where to spawn, global counters.
#[derive(Debug, Clone)]
pub struct WriterContext {
    runtime: tokio::runtime::Handle,
    global: Arc<CommitCounters>,
}

impl WriterContext {
    pub fn new(runtime: tokio::runtime::Handle) -> WriterContext {
        WriterContext {
            runtime,
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
            partition: counters,
            global: self.global.clone(),
        });
        let task = self.runtime.spawn(run(receiver, shared));
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

    /// Close the queue and wait until the writer has completed every send already queued.
    pub async fn close(self) {
        drop(self.queue);
        if let Err(error) = self.task.await {
            tracing::error!(%error, "a partition writer ended abnormally");
        }
    }
}

/// Queue a send on the partition's writer (waiting while the queue is full) and wait for its
/// outcome; a stored batch counts in the node's written bytes. `None` means the writer is
/// closed (clean stop in progress).
pub async fn submit(
    queue: Option<mpsc::Sender<PendingSend>>,
    batch: ReceivedBatch,
    received_at_us: u64,
) -> SendOutcome {
    let Some(queue) = queue else {
        return Err(codes::ERROR);
    };
    let (reply, outcome) = oneshot::channel();
    let batch_bytes = batch.len();
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
        Ok(outcome) => {
            if outcome.is_ok() {
                crate::stats::record_written(batch_bytes);
            }
            outcome
        }
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
    partition: Arc<CommitCounters>,
    global: Arc<CommitCounters>,
}

/// The writer task of one partition: gather groups, commit them on a blocking thread,
/// repeat. Each group is one op; when the queue holds more than one group's worth, up to
/// [`LANES`] groups are committed together (one op each on the group's lanes, one barrier
/// for all). Ends when every queue sender is gone and the queue is drained.
async fn run(mut queue: mpsc::Receiver<PendingSend>, shared: Arc<WriterShared>) {
    // A send that did not fit the previous groups: it starts the next one.
    let mut carried: Option<PendingSend> = None;
    loop {
        let first = match carried.take() {
            Some(send) => send,
            None => match queue.recv().await {
                Some(send) => send,
                None => break,
            },
        };
        let mut groups: Vec<Vec<PendingSend>> = Vec::new();
        let mut next_first = Some(first);
        while let Some(first) = next_first.take() {
            let first_bytes = first.batch.len() as u64;
            let mut group = Group::new(first, first_bytes, GROUP_BOUNDS);
            while !group.is_full() {
                let Ok(next) = queue.try_recv() else {
                    break;
                };
                let next_bytes = next.batch.len() as u64;
                if let Err(back) = group.offer(next, next_bytes) {
                    next_first = Some(back);
                    break;
                }
            }
            if group.is_full() && next_first.is_none() {
                next_first = queue.try_recv().ok();
            }
            tracing::trace!(sends = group.len(), bytes = group.bytes(), "group gathered");
            groups.push(group.into_items());
            if groups.len() == LANES {
                carried = next_first.take();
            }
        }
        let work = shared.clone();
        if let Err(error) = tokio::task::spawn_blocking(move || commit_groups(&work, groups)).await {
            // A panic under the partition lock poisons it; later groups panic the same way
            // and their sends get errors. Nothing was acknowledged by the failed groups.
            tracing::error!(partition_dir = %shared.dir.display(), %error, "group commit panicked");
        }
    }
}

/// Append each group as one op (all of them sharing one barrier) under the partition lock,
/// then complete every send. Runs on a blocking thread.
fn commit_groups(shared: &WriterShared, groups: Vec<Vec<PendingSend>>) {
    assert!(!groups.is_empty() && groups.len() <= LANES);
    assert!(groups.iter().all(|group| !group.is_empty()));
    // Computed before the lock: a walk over each batch's frame headers.
    let keyed: Vec<Vec<(PendingSend, Option<u128>)>> = groups
        .into_iter()
        .map(|group| {
            group
                .into_iter()
                .map(|send| {
                    let key = batch::content_key(&send.batch);
                    (send, key)
                })
                .collect()
        })
        .collect();
    // Sends answered without an op (refused, or resends of committed batches).
    let mut settled: Vec<(oneshot::Sender<SendOutcome>, SendOutcome)> = Vec::new();
    // Per op, per send: its reply, and whether its batch has a content key.
    let mut replies: Vec<Vec<(oneshot::Sender<SendOutcome>, bool)>> = Vec::with_capacity(keyed.len());
    // Sends of a batch another send of this commit carries (a resend queued behind its
    // original): answered with that send's outcome, by (op, send) index.
    let mut copies: Vec<(oneshot::Sender<SendOutcome>, (usize, usize))> = Vec::new();
    let outcomes: Vec<Vec<SendOutcome>> = 'locked: {
        let mut state = lock(&shared.state);
        let refuse_all = |settled: &mut Vec<_>, keyed: Vec<Vec<(PendingSend, Option<u128>)>>, status: u32| {
            settled.extend(
                keyed
                    .into_iter()
                    .flatten()
                    .map(|(send, _)| (send.reply, Err(status))),
            );
        };
        match serving(&mut state) {
            Err(status) => {
                refuse_all(&mut settled, keyed, status);
                Vec::new()
            }
            // Stopped earlier (logged then): refused without touching the log.
            Ok(data) if data.stopped_reason().is_some() => {
                refuse_all(&mut settled, keyed, PARTITION_STOPPED_STATUS);
                Vec::new()
            }
            // With peers, a resend is recognised only by a primary that applied everything its
            // log holds: a new primary's first ops (prepared in an earlier view) may hold the
            // batch. Nothing is prepared; the client sends again (58), here or elsewhere.
            Ok(data) if data.has_peers() && !data.is_caught_up() => {
                refuse_all(&mut settled, keyed, codes::TRANSIENT_NOT_ACCEPTED);
                Vec::new()
            }
            Ok(data) => {
                // The batches go to the partition's op by value (the op may stamp a batch in
                // the buffer it arrived in); the replies stay here. A batch the partition
                // committed already (same messages, same ids: the client resent it after
                // losing the reply) is answered with the offset it got, and not stored again.
                let mut appends: Vec<Append> = Vec::with_capacity(keyed.len());
                let mut resends = 0usize;
                let mut in_this_commit: std::collections::HashMap<u128, (usize, usize)> =
                    std::collections::HashMap::new();
                for group in keyed {
                    let mut timestamp_us = 0;
                    let mut batches = Vec::with_capacity(group.len());
                    let mut group_replies = Vec::with_capacity(group.len());
                    for (send, key) in group {
                        if let Some(key) = key {
                            if let Some(base_offset) = data.committed_batch(key, send.received_at_us) {
                                resends += 1;
                                settled.push((send.reply, Ok(base_offset)));
                                continue;
                            }
                            let here = (appends.len(), batches.len());
                            if let Some(&original) = in_this_commit.get(&key) {
                                resends += 1;
                                copies.push((send.reply, original));
                                continue;
                            }
                            in_this_commit.insert(key, here);
                        }
                        timestamp_us = timestamp_us.max(send.received_at_us);
                        batches.push(send.batch);
                        group_replies.push((send.reply, key.is_some()));
                    }
                    if !batches.is_empty() {
                        appends.push(Append {
                            timestamp_us,
                            batches,
                        });
                        replies.push(group_replies);
                    }
                }
                if resends > 0 {
                    tracing::info!(
                        partition_dir = %shared.dir.display(),
                        resends,
                        "sends of batches this partition committed already (the same messages, resent after a lost reply) answered with the offsets they got; not stored again"
                    );
                }
                if appends.is_empty() {
                    break 'locked Vec::new();
                }
                let fdatasyncs_before = data.fdatasyncs();
                let next_offset = data.purge_target();
                let started = Instant::now();
                let results = data.append_batch(appends);
                let latency = started.elapsed();
                let acknowledged: usize = replies
                    .iter()
                    .zip(&results)
                    .filter(|(group, result)| {
                        result.as_ref().is_ok_and(|offsets| offsets.len() == group.len())
                    })
                    .map(|(group, _)| group.len())
                    .sum();
                if acknowledged > 0 {
                    let fdatasyncs = data.fdatasyncs().saturating_sub(fdatasyncs_before);
                    for counters in [&shared.partition, &shared.global] {
                        counters.record_barrier(latency, fdatasyncs);
                        counters.record_group(acknowledged as u64);
                    }
                }
                let mut stop_cause: Option<String> = None;
                let mut stopped_sends = 0usize;
                let outcomes = replies
                    .iter()
                    .zip(results)
                    .map(|(group, result)| {
                        let (mut outcomes, cause) = outcomes_of(shared, group.len(), result);
                        if let Some(cause) = cause {
                            stopped_sends += group.len();
                            stop_cause.get_or_insert(cause);
                        }
                        for (outcome, (_, keyed)) in outcomes.iter_mut().zip(group) {
                            if *outcome == Err(codes::TRANSIENT_NOT_COMMITTED) && !keyed {
                                // A resend of a batch without identity (a message of id 0)
                                // would not be recognised: the client must not be invited.
                                *outcome = Err(codes::ERROR);
                            }
                        }
                        outcomes
                    })
                    .collect();
                if let Some(cause) = stop_cause {
                    // Once per commit, however many of its ops the stop refused.
                    for counters in [&shared.partition, &shared.global] {
                        counters.record_barrier_failed();
                    }
                    tracing::error!(
                        partition_dir = %shared.dir.display(),
                        cause = %cause,
                        written_sends = stopped_sends,
                        from_offset = next_offset,
                        "partition stopped taking writes until restart: these sends were NOT acknowledged \
                         (clients got status {BARRIER_FAILED_STATUS}); after a restart their messages may or may not be present; \
                         nothing acknowledged earlier is affected; later sends get status {PARTITION_STOPPED_STATUS}"
                    );
                }
                outcomes
            }
        }
    };
    for (reply, (op, send)) in copies {
        let outcome = outcomes
            .get(op)
            .and_then(|outcomes| outcomes.get(send))
            .copied()
            .unwrap_or(Err(codes::ERROR));
        settled.push((reply, outcome));
    }
    finish(shared, settled, replies, outcomes);
}

/// Complete every send of a commit (after the partition's lock is released, so woken
/// submitters never wait on it), then summarise the log's progress.
fn finish(
    shared: &WriterShared,
    settled: Vec<(oneshot::Sender<SendOutcome>, SendOutcome)>,
    replies: Vec<Vec<(oneshot::Sender<SendOutcome>, bool)>>,
    outcomes: Vec<Vec<SendOutcome>>,
) {
    debug_assert_eq!(replies.len(), outcomes.len());
    // A submitter that went away (connection closed) just misses its reply.
    for (reply, outcome) in settled {
        let _ = reply.send(outcome);
    }
    for (group, outcomes) in replies.into_iter().zip(outcomes) {
        debug_assert_eq!(outcomes.len(), group.len());
        for ((reply, _), outcome) in group.into_iter().zip(outcomes) {
            let _ = reply.send(outcome);
        }
    }
    // Off the acknowledgement path: once the segment being written has grown enough since its
    // last summary, summarise it, so that a start after a crash reads only what follows.
    if let Some(data) = serving_verified(&mut lock(&shared.state)) {
        data.summarise_log_progress();
    }
}

/// What each of a group's `sends_count` sends is answered, from its op's result, and the
/// cause when the failure stopped the partition (logged once per commit by the caller).
fn outcomes_of(
    shared: &WriterShared,
    sends_count: usize,
    result: Result<Vec<u64>, PartitionError>,
) -> (Vec<SendOutcome>, Option<String>) {
    let outcomes = match result {
        Ok(base_offsets) if base_offsets.len() == sends_count => base_offsets.into_iter().map(Ok).collect(),
        Ok(base_offsets) => {
            // The op is durable and applied, but its reply does not match it.
            tracing::error!(
                partition_dir = %shared.dir.display(),
                sends = sends_count,
                base_offsets = base_offsets.len(),
                "an append's reply does not give one base offset per send (a bug): the sends were stored but are answered with an error"
            );
            vec![Err(codes::ERROR); sends_count]
        }
        Err(PartitionError::Group(error @ GroupError::NotTaken { .. })) => {
            // With peers: this replica is not the partition's primary (now). The client may
            // send again, here or elsewhere: nothing of it was prepared.
            tracing::debug!(partition_dir = %shared.dir.display(), %error, sends = sends_count, "append not taken (the error says why: this replica is not the partition's primary now, or its node hears no quorum); nothing of it was stored");
            vec![Err(codes::TRANSIENT_NOT_ACCEPTED); sends_count]
        }
        Err(PartitionError::Group(error @ GroupError::OutcomeUnknown { .. })) => {
            // 57: the SDK sends the same batch again, and the partition recognises it by its
            // content if it did commit (a batch whose messages have id 0 has no identity:
            // such a resend could be stored twice, as after any lost reply).
            tracing::warn!(partition_dir = %shared.dir.display(), %error, sends = sends_count, "append got no reply from a quorum in time: the sends may or may not be stored; answered 57 (the client resends; a resend of a committed batch is recognised), the partition keeps serving");
            vec![Err(codes::TRANSIENT_NOT_COMMITTED); sends_count]
        }
        Err(PartitionError::Group(error @ GroupError::WriteUndone { .. })) => {
            tracing::warn!(
                partition_dir = %shared.dir.display(),
                %error,
                sends = sends_count,
                "append not stored (the error says why): the sends were refused, nothing of them was stored; the partition keeps serving"
            );
            vec![Err(WRITE_FAILED_STATUS); sends_count]
        }
        Err(PartitionError::Group(error @ GroupError::TooLarge { .. })) => {
            // The configuration caps a batch at what one op carries and a group of several
            // stays far below it: a bug if reached. Nothing was taken.
            tracing::error!(partition_dir = %shared.dir.display(), %error, sends = sends_count, "an append exceeded the largest op (a bug); the sends were refused, nothing of them was stored");
            vec![Err(codes::ERROR); sends_count]
        }
        Err(PartitionError::Status(status)) => {
            // Validation ran before the sends were queued; what the partition still refuses
            // (offsets exhausted) changed nothing.
            tracing::warn!(partition_dir = %shared.dir.display(), status, sends = sends_count, "the partition refused an append; nothing of it was stored");
            vec![Err(status); sends_count]
        }
        Err(error) => {
            return (
                vec![Err(BARRIER_FAILED_STATUS); sends_count],
                Some(error.to_string()),
            );
        }
    };
    (outcomes, None)
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

    /// An op's barrier: the data, then the frontier.
    const TWO_FDATASYNCS: u64 = 2;

    #[test]
    fn counters_summarise_barriers_and_sends() {
        let counters = CommitCounters::default();
        assert!(counters.snapshot().is_idle());
        assert_eq!(counters.snapshot().sends_per_barrier(), None);
        assert_eq!(counters.snapshot().latency_quantile_us(0.5), None);
        for latency_us in [100u64, 100, 100, 5_000] {
            counters.record_barrier(Duration::from_micros(latency_us), TWO_FDATASYNCS);
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
        counters.record_barrier(Duration::from_micros(7), TWO_FDATASYNCS);
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

    // ---- commit_groups and the writer against a disk with injected faults ----

    use crate::partition::{PartitionData, PartitionIds};
    use crate::partition_group::LogParams;
    use crate::test_support::{DISK_FULL, Faults, FaultyDisk};

    /// A valid client batch of `count` messages of `payload_bytes` bytes, with ids no other
    /// batch of these tests has (a batch with the same messages would be taken for a resend).
    fn client_batch(count: u32, payload_bytes: usize) -> Vec<u8> {
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let first_id = NEXT_ID.fetch_add(u64::from(count), std::sync::atomic::Ordering::Relaxed);
        crate::test_support::client_batch_from(u128::from(first_id), count, payload_bytes, 7)
    }

    struct Fixture {
        _dir: tempfile::TempDir,
        faults: Arc<Faults>,
        shared: Arc<WriterShared>,
    }

    const IDS: PartitionIds = PartitionIds {
        stream_id: 1,
        topic_id: 1,
        partition_id: 0,
    };

    fn params(faults: &Arc<Faults>) -> LogParams {
        LogParams {
            partition_id: IDS.partition_id,
            segment_size_bytes: 1 << 20,
            relaxed: false,
            disk: Arc::new(FaultyDisk {
                faults: faults.clone(),
            }),
        }
    }

    fn fixture() -> Fixture {
        let dir = tempfile::tempdir().expect("tempdir");
        let faults = Arc::new(Faults::default());
        let partition_dir = dir.path().join("partition");
        let data = PartitionData::open_with(&partition_dir, IDS, params(&faults)).expect("create partition");
        let state = PartitionState::Serving(Box::new(data));
        let shared = Arc::new(WriterShared {
            state: Arc::new(Mutex::new(state)),
            dir: partition_dir,
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
    fn run_group(shared: &WriterShared, counts: &[u32]) -> Vec<SendOutcome> {
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
        commit_groups(shared, vec![sends]);
        outcomes
            .into_iter()
            .map(|mut outcome| outcome.try_recv().expect("every send is completed"))
            .collect()
    }

    /// [`run_group`] of several groups committed together (one op each, one barrier).
    fn run_groups(shared: &WriterShared, groups: &[&[u32]]) -> Vec<Vec<SendOutcome>> {
        let batches: Vec<Vec<Vec<u8>>> = groups
            .iter()
            .map(|counts| counts.iter().map(|&count| client_batch(count, 10)).collect())
            .collect();
        let borrowed: Vec<Vec<&[u8]>> = batches
            .iter()
            .map(|group| group.iter().map(Vec::as_slice).collect())
            .collect();
        let groups: Vec<&[&[u8]]> = borrowed.iter().map(Vec::as_slice).collect();
        run_batches(shared, &groups, 1_000)
    }

    /// Commit `groups` of the given batches; what each send got.
    fn run_batches(shared: &WriterShared, groups: &[&[&[u8]]], received_at_us: u64) -> Vec<Vec<SendOutcome>> {
        let mut pending = Vec::new();
        let mut outcomes = Vec::new();
        for group in groups {
            let mut sends = Vec::new();
            let mut group_outcomes = Vec::new();
            for batch in group.iter() {
                let (reply, outcome) = oneshot::channel();
                sends.push(PendingSend {
                    batch: batch.to_vec().into(),
                    received_at_us,
                    reply,
                });
                group_outcomes.push(outcome);
            }
            pending.push(sends);
            outcomes.push(group_outcomes);
        }
        commit_groups(shared, pending);
        outcomes
            .into_iter()
            .map(|group| {
                group
                    .into_iter()
                    .map(|mut outcome| outcome.try_recv().expect("every send is completed"))
                    .collect()
            })
            .collect()
    }

    #[test]
    fn a_resent_batch_is_answered_with_its_offset_and_stored_once() {
        let fixture = fixture();
        let (first, second) = (client_batch(2, 10), client_batch(3, 10));
        // A copy in the same commit (a resend queued behind its original) shares its outcome.
        let outcomes = run_batches(&fixture.shared, &[&[&first, &second], &[&first]], 1_000);
        assert_eq!(outcomes, vec![vec![Ok(0), Ok(2)], vec![Ok(0)]]);
        // A resend after the commit gets the offset the batch got.
        let outcomes = run_batches(&fixture.shared, &[&[&second]], 2_000);
        assert_eq!(outcomes, vec![vec![Ok(2)]]);
        {
            let mut state = lock(&fixture.shared.state);
            let data = serving(&mut state).expect("serving");
            assert_eq!(data.purge_target(), 5, "five messages stored, none twice");
        }
        // The same messages sent again after the resend window are new messages.
        let later = 1_000 + cairn_machine::partition::RESEND_WINDOW_US + 1;
        let outcomes = run_batches(&fixture.shared, &[&[&first]], later);
        assert_eq!(outcomes, vec![vec![Ok(5)]]);
    }

    #[test]
    fn groups_committed_together_share_one_barrier() {
        let fixture = fixture();
        // The lanes register first (a barrier of their own), so the commit below is alone.
        run_groups(&fixture.shared, &[&[1], &[1], &[1]]);
        let before = fixture.shared.partition.snapshot();
        let outcomes = run_groups(&fixture.shared, &[&[1, 2], &[3], &[1, 1]]);
        assert_eq!(
            outcomes,
            vec![vec![Ok(3), Ok(4)], vec![Ok(6)], vec![Ok(9), Ok(10)]],
            "offsets in the order of the groups"
        );
        let counters = fixture.shared.partition.snapshot().since(&before);
        assert_eq!(
            (counters.barriers, counters.fdatasyncs, counters.sends_acked),
            (1, 2, 5),
            "three ops, one barrier (the data, then the frontier)"
        );
        assert_eq!(next_offset(&fixture.shared), 11);
    }

    fn with_data<R>(shared: &WriterShared, read: impl FnOnce(&mut PartitionData) -> R) -> R {
        match &mut *lock(&shared.state) {
            PartitionState::Serving(data) => read(data),
            _ => panic!("partition not serving"),
        }
    }

    fn next_offset(shared: &WriterShared) -> u64 {
        with_data(shared, |data| data.purge_target())
    }

    fn stopped(shared: &WriterShared) -> bool {
        with_data(shared, |data| data.stopped_reason().is_some())
    }

    #[test]
    fn a_group_shares_one_barrier() {
        let fixture = fixture();
        let outcomes = run_group(&fixture.shared, &[1, 3, 2, 1]);
        assert_eq!(outcomes, vec![Ok(0), Ok(1), Ok(4), Ok(6)]);
        let counters = fixture.shared.partition.snapshot();
        assert_eq!(counters.barriers, 1);
        assert_eq!(
            counters.fdatasyncs, 4,
            "the boot's session registration, then the append: each the data, then the frontier"
        );
        assert_eq!(counters.sends_acked, 4);
        assert_eq!(fixture.shared.global.snapshot().sends_acked, 4);
        assert_eq!(next_offset(&fixture.shared), 7);
    }

    #[test]
    fn a_failed_barrier_fails_its_whole_group_and_stops_the_partition() {
        let fixture = fixture();
        assert_eq!(run_group(&fixture.shared, &[1]), vec![Ok(0)]);

        fixture.faults.syncs_fail.store(true, Ordering::Relaxed);
        assert_eq!(
            run_group(&fixture.shared, &[1, 2, 1]),
            vec![Err(BARRIER_FAILED_STATUS); 3],
            "nothing the barrier covered is acknowledged"
        );
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
        assert_eq!(
            run_group(&fixture.shared, &[1, 1]),
            vec![Err(PARTITION_STOPPED_STATUS); 2]
        );
        assert_eq!(
            next_offset(&fixture.shared),
            offset_before,
            "nothing written after the stop"
        );

        // The acknowledged message is still readable.
        let read = with_data(&fixture.shared, |data| {
            let (mut out, mut parts) = (Vec::new(), Vec::new());
            let owner = cairn_machine::partition::Owner::Consumer(1);
            data.poll(
                &owner,
                cairn_wire::types::PollingStrategy::First,
                10,
                false,
                &mut out,
                &mut parts,
            )
            .expect("poll")
        });
        assert_eq!(read.messages_count, 1);
    }

    #[test]
    fn an_undone_write_refuses_its_group_and_writes_resume() {
        let fixture = fixture();
        assert_eq!(run_group(&fixture.shared, &[2]), vec![Ok(0)]);

        // Disk full: each write fails half-way and is undone.
        fixture
            .faults
            .log_writes_to_fail
            .store(DISK_FULL, Ordering::Relaxed);
        assert_eq!(
            run_group(&fixture.shared, &[1, 3]),
            vec![Err(WRITE_FAILED_STATUS); 2]
        );
        assert!(
            !stopped(&fixture.shared),
            "an undone write does not stop the partition"
        );
        assert_eq!(
            next_offset(&fixture.shared),
            2,
            "no offset was used by the refused sends"
        );

        // Space returns: sends succeed at the next offset, contiguous with what was acknowledged.
        fixture.faults.log_writes_to_fail.store(0, Ordering::Relaxed);
        assert_eq!(run_group(&fixture.shared, &[1, 1]), vec![Ok(2), Ok(3)]);

        // The files hold the acknowledged ops, whole: a reopen serves all four messages.
        let dir = fixture.shared.dir.clone();
        drop(fixture.shared);
        let reopened = PartitionData::open_with(&dir, IDS, params(&fixture.faults)).expect("reopen");
        assert_eq!(
            reopened.purge_target(),
            4,
            "no acknowledged offset is handed out again"
        );
        assert_eq!(reopened.stats().messages_count, 4);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_writer_completes_concurrent_sends_with_distinct_contiguous_offsets() {
        let fixture = fixture();
        let context = WriterContext::new(tokio::runtime::Handle::current());
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
}
