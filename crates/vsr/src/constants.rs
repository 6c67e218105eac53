//! Limits and timeouts of the replication core. Each is a named constant; relations between
//! them are asserted at compile time.

/// Wire format version carried in every header (`protocol`). Any other value is refused.
pub const PROTOCOL_VERSION: u16 = 1;

/// This build's software release, carried in every header (`release`).
pub const RELEASE: u32 = 1;

/// The oldest release whose messages this build accepts. Raising it is a deliberate,
/// documented step of a rolling upgrade.
pub const RELEASE_MIN: u32 = 1;

/// Bytes in every message header.
pub const HEADER_SIZE: usize = 256;

/// Largest message, header included. Checked before any allocation.
pub const MESSAGE_SIZE_MAX: usize = 1024 * 1024;

/// Most replicas in one group.
pub const REPLICAS_MAX: usize = 6;

/// Prepares the primary keeps in flight beyond `commit_max`.
pub const PIPELINE_PREPARES_MAX: usize = 8;

/// Prepare slots in the journal ring (op `o` lives in slot `o % JOURNAL_SLOTS`).
pub const JOURNAL_SLOTS: usize = 64;

/// Copies of the durable state (superblock). See `durable` for why four.
pub const SUPERBLOCK_COPIES: usize = 4;

const _: () = assert!(HEADER_SIZE <= MESSAGE_SIZE_MAX);
const _: () = assert!(RELEASE_MIN <= RELEASE);
// A view change sends the pipeline behind the head; the journal must still hold all of it,
// and room for a checkpoint interval besides.
const _: () = assert!(2 * PIPELINE_PREPARES_MAX < JOURNAL_SLOTS);
const _: () = assert!(REPLICAS_MAX <= u8::MAX as usize);

/// The operation number of a client's register (its reply opens a session). Other
/// operations belong to the replicated state machine.
pub const OPERATION_REGISTER: u8 = 0;

/// The `operation` of a reply that tells a client its session was evicted: it must register
/// again; the request was not executed.
pub const OPERATION_SESSION_EVICTED: u8 = 255;

/// Clients the client table holds before it evicts the least recently committed.
pub const CLIENTS_MAX: usize = 64;

/// Ticks between the primary's commit heartbeats.
pub const COMMIT_INTERVAL_TICKS: u64 = 10;

/// Ticks before the primary sends an unacknowledged prepare again.
pub const PREPARE_TIMEOUT_TICKS: u64 = 5;

/// Ticks a backup waits for its primary before it starts a view change.
pub const NORMAL_TIMEOUT_TICKS: u64 = 50;

const _: () = assert!(COMMIT_INTERVAL_TICKS * 3 <= NORMAL_TIMEOUT_TICKS);
const _: () = assert!(OPERATION_REGISTER != OPERATION_SESSION_EVICTED);

/// Ticks between resends of StartViewChange / DoViewChange while a view change lasts, and of
/// repair requests.
pub const VIEW_CHANGE_RETRY_TICKS: u64 = 10;

/// Ticks a view change may last before the replica moves on to the next view.
pub const VIEW_CHANGE_TIMEOUT_TICKS: u64 = 100;

/// Headers behind the head that a DoViewChange or StartView carries. Every op that may be
/// committed without the new primary knowing lies within the pipeline behind the head; the
/// rest is reached through the hash chain.
pub const VIEW_CHANGE_HEADERS_MAX: usize = 2 * PIPELINE_PREPARES_MAX + 1;

const _: () = assert!(VIEW_CHANGE_RETRY_TICKS < VIEW_CHANGE_TIMEOUT_TICKS);

/// Most ticks added to a group's normal and view-change timeouts. The amount is a hash of
/// (cluster, group, replica, view, which timeout): fixed for one group in one view, different
/// across groups, replicas and views. So when a node fails, the groups it led do not all time
/// out in the same tick, and no replica is always the first to start a view change.
pub const TIMEOUT_JITTER_TICKS_MAX: u64 = NORMAL_TIMEOUT_TICKS / 2;
const _: () = assert!(VIEW_CHANGE_HEADERS_MAX * HEADER_SIZE <= MESSAGE_SIZE_MAX - HEADER_SIZE);
const _: () = assert!(VIEW_CHANGE_HEADERS_MAX < JOURNAL_SLOTS);

/// Ops applied between checkpoints. A replica checkpoints once its applied op is this far past
/// its durable checkpoint; the journal slots of ops at or below a durable checkpoint may be
/// reused.
pub const CHECKPOINT_INTERVAL_OPS: u64 = 16;

/// Largest state-machine snapshot a checkpoint carries. A snapshot is not a message: the
/// metadata group's is the whole catalog (every stream, topic, partition, user and token),
/// as large as the metadata document may be.
pub const STATE_MACHINE_SNAPSHOT_MAX: usize = 64 * 1024 * 1024;

/// Largest encoded checkpoint: a prepare header, the snapshot, and the client table (one
/// stored reply per client, each at most a message).
pub const CHECKPOINT_SIZE_MAX: usize =
    64 + STATE_MACHINE_SNAPSHOT_MAX + (CLIENTS_MAX + 1) * (MESSAGE_SIZE_MAX + 64);

// The journal holds ops up to `checkpoint_op + JOURNAL_SLOTS`. The primary's pipeline, the
// view change's suffix and the lag of a checkpoint behind the applied op must fit in it, or
// the primary stalls waiting for its own checkpoint.
const _: () = assert!(CHECKPOINT_INTERVAL_OPS as usize + 2 * PIPELINE_PREPARES_MAX < JOURNAL_SLOTS);

/// Ticks between a recovering replica's RequestStartView probes.
pub const PROBE_INTERVAL_TICKS: u64 = 10;

/// Probe rounds a restarted (not wiped) replica sends without any answer before it concludes
/// the whole cluster restarted, and starts a view change with its recovered log.
pub const PROBE_ATTEMPTS_MAX: u64 = 10;

/// Ticks a replica waits with committed ops it cannot apply (their prepares are gone from
/// every journal it asked) before it asks its shell for state transfer, and between asks.
pub const STATE_TRANSFER_TIMEOUT_TICKS: u64 = 100;
