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

/// Largest message of the metadata shape ([`Shape::METADATA`]), header included, and of
/// the node's own messages (heartbeats). A group's messages are bounded by its shape.
pub const MESSAGE_SIZE_MAX: usize = 1024 * 1024;

/// Largest message of any group, header included: `Header::decode` refuses a larger size
/// before anything is allocated from it, whatever the group. A group's
/// [`Shape::message_size_max`] is at most this (a partition's prepare carries a whole batch).
pub const MESSAGE_SIZE_LIMIT: usize = 1024 * 1024 * 1024;

/// Most replicas in one group.
pub const REPLICAS_MAX: usize = 6;

/// Prepares the primary keeps in flight beyond `commit_max` (metadata shape).
pub const PIPELINE_PREPARES_MAX: usize = 8;

/// Prepare slots in the journal ring (metadata shape; op `o` lives in slot
/// `o % journal_slots`).
pub const JOURNAL_SLOTS: usize = 64;

/// Copies of the durable state (superblock). See `durable` for why four.
pub const SUPERBLOCK_COPIES: usize = 4;

const _: () = assert!(HEADER_SIZE <= MESSAGE_SIZE_MAX);
const _: () = assert!(MESSAGE_SIZE_MAX <= MESSAGE_SIZE_LIMIT);
const _: () = assert!(MESSAGE_SIZE_LIMIT <= u32::MAX as usize);
const _: () = assert!(RELEASE_MIN <= RELEASE);
const _: () = assert!(REPLICAS_MAX <= u8::MAX as usize);

/// The operation number of a client's register (its reply opens a session). Other
/// operations belong to the replicated state machine.
pub const OPERATION_REGISTER: u8 = 0;

/// The `operation` of a reply that tells a client its session was evicted: it must register
/// again; the request was not executed.
pub const OPERATION_SESSION_EVICTED: u8 = 255;

/// Clients the client table holds before it evicts the least recently committed (metadata
/// shape).
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

const _: () = assert!(VIEW_CHANGE_RETRY_TICKS < VIEW_CHANGE_TIMEOUT_TICKS);

/// Most ticks added to a group's normal and view-change timeouts. The amount is a hash of
/// (cluster, group, replica, view, which timeout): fixed for one group in one view, different
/// across groups, replicas and views. So when a node fails, the groups it led do not all time
/// out in the same tick, and no replica is always the first to start a view change.
pub const TIMEOUT_JITTER_TICKS_MAX: u64 = NORMAL_TIMEOUT_TICKS / 2;

/// Ops applied between checkpoints (metadata shape). A replica checkpoints once its applied op
/// is this far past its durable checkpoint; the journal slots of ops at or below a durable
/// checkpoint may be reused.
pub const CHECKPOINT_INTERVAL_OPS: u64 = 16;

/// Largest state-machine snapshot a checkpoint carries. A snapshot is not a message: the
/// metadata group's is the whole catalog (every stream, topic, partition, user and token),
/// as large as the metadata document may be.
pub const STATE_MACHINE_SNAPSHOT_MAX: usize = 64 * 1024 * 1024;

/// Largest encoded checkpoint of the metadata shape ([`Shape::checkpoint_size_max`]).
pub const CHECKPOINT_SIZE_MAX: usize = Shape::METADATA.checkpoint_size_max();

/// Most bytes a stored reply may take in a client table, whatever the group: replies carry
/// outcomes (offsets, ids, statuses), never data. Bounded so that a checkpoint's client table
/// stays small next to the snapshot even for a group whose prepares are large.
pub const REPLY_SIZE_MAX: usize = MESSAGE_SIZE_MAX;

/// The sizes of one group: how large its messages are, how many prepares its journal and
/// pipeline hold, how often it checkpoints and how many clients it remembers. The metadata
/// group and a partition group run the same protocol in different shapes: a partition's
/// prepare carries a whole batch, and it checkpoints (a manifest) far less often per op.
///
/// Every replica of a group must run the same shape (it decides slots, and so what a
/// restarted replica reads back). [`Shape::check`] states the relations the protocol needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shape {
    /// Largest message of the group, header included: `HEADER_SIZE ..= MESSAGE_SIZE_LIMIT`.
    pub message_size_max: usize,
    /// Journal ring slots: op `o` lives in slot `o % journal_slots`.
    pub journal_slots: usize,
    /// Prepares the primary keeps in flight beyond `commit_max`.
    pub pipeline_prepares_max: usize,
    /// Ops applied between checkpoints.
    pub checkpoint_interval_ops: u64,
    /// Clients the client table holds before it evicts the least recently committed.
    pub clients_max: usize,
    /// The journal is a log, not a ring of slots that may be written in any order: prepares
    /// are written strictly in op order, and writing op `o` discards every op above `o` that
    /// the log held (a truncation). A partition's segment log is such a journal
    /// (`docs/replication.md`, "Journal"). The ring still numbers the ops held in memory.
    pub log_journal: bool,
}

impl Shape {
    /// The metadata group's shape (and the simulator's default).
    pub const METADATA: Shape = Shape {
        message_size_max: MESSAGE_SIZE_MAX,
        journal_slots: JOURNAL_SLOTS,
        pipeline_prepares_max: PIPELINE_PREPARES_MAX,
        checkpoint_interval_ops: CHECKPOINT_INTERVAL_OPS,
        clients_max: CLIENTS_MAX,
        log_journal: false,
    };

    /// A partition group's shape: a prepare carries a whole append up to the server's
    /// 64 MiB batch limit (plus room for the append's framing), several are in flight, the
    /// journal is the partition's segment log, and a checkpoint (a manifest, never the data)
    /// comes every 256 ops.
    pub const PARTITION: Shape = Shape {
        message_size_max: 64 * 1024 * 1024 + 64 * 1024,
        journal_slots: 1024,
        pipeline_prepares_max: 8,
        checkpoint_interval_ops: 256,
        clients_max: 32,
        log_journal: true,
    };

    /// Headers behind the head that a DoViewChange or StartView carries. Every op that may be
    /// committed without the new primary knowing lies within the pipeline behind the head;
    /// the rest is reached through the hash chain.
    pub const fn view_change_headers_max(&self) -> usize {
        2 * self.pipeline_prepares_max + 1
    }

    /// Largest encoded checkpoint: a prepare header, the snapshot, and the client table (one
    /// stored reply per client, each at most [`REPLY_SIZE_MAX`]).
    pub const fn checkpoint_size_max(&self) -> usize {
        64 + STATE_MACHINE_SNAPSHOT_MAX + (self.clients_max + 1) * (REPLY_SIZE_MAX + 64)
    }

    /// Largest body of one of the group's messages.
    pub const fn body_size_max(&self) -> usize {
        self.message_size_max - HEADER_SIZE
    }

    /// Why the shape cannot run the protocol, if it cannot.
    pub const fn check(&self) -> Result<(), &'static str> {
        if self.message_size_max < HEADER_SIZE + HEADER_SIZE || self.message_size_max > MESSAGE_SIZE_LIMIT {
            return Err("message_size_max must lie within 2 × HEADER_SIZE ..= MESSAGE_SIZE_LIMIT");
        }
        if self.message_size_max < MESSAGE_SIZE_MAX {
            // View-change suffixes, repair requests and replies are sized for the metadata
            // shape's messages; a group's messages are never smaller.
            return Err("message_size_max must be at least MESSAGE_SIZE_MAX");
        }
        if self.pipeline_prepares_max == 0 || self.clients_max == 0 || self.checkpoint_interval_ops == 0 {
            return Err("pipeline_prepares_max, clients_max and checkpoint_interval_ops must be at least 1");
        }
        if self.clients_max > 1 << 12 || self.journal_slots > 1 << 24 {
            return Err("clients_max or journal_slots is beyond what a replica may hold in memory");
        }
        if self.checkpoint_size_max() > u32::MAX as usize {
            return Err("a checkpoint must fit a u32 size");
        }
        // A view change sends the pipeline behind the head, which must fit one message.
        if self.view_change_headers_max() * (HEADER_SIZE + 1) > MESSAGE_SIZE_MAX - HEADER_SIZE {
            return Err("a view change's headers must fit one message");
        }
        // The journal holds ops up to `checkpoint_op + journal_slots - 1`. The primary's
        // pipeline, the view change's suffix and the lag of a checkpoint behind the applied op
        // must fit in it, or the primary stalls waiting for its own checkpoint.
        if self.checkpoint_interval_ops as usize + 2 * self.pipeline_prepares_max >= self.journal_slots {
            return Err("journal_slots must exceed checkpoint_interval_ops + 2 × pipeline_prepares_max");
        }
        // The durable state keeps the installed log's checksums below its head, the whole
        // suffix a view change may send (`DurableState::log_suffix`).
        if self.view_change_headers_max() > crate::durable::LOG_SUFFIX_MAX + 1 {
            return Err("a view change's headers must fit the durable state's log suffix");
        }
        if self.view_change_headers_max() >= self.journal_slots {
            return Err("journal_slots must exceed a view change's headers");
        }
        Ok(())
    }
}

const _: () = assert!(Shape::METADATA.check().is_ok());
const _: () = assert!(Shape::PARTITION.check().is_ok());
const _: () = assert!(REPLY_SIZE_MAX <= MESSAGE_SIZE_MAX);

/// Ticks between a recovering replica's RequestStartView probes.
pub const PROBE_INTERVAL_TICKS: u64 = 10;

/// Probe rounds a restarted (not wiped) replica sends without any answer before it concludes
/// the whole cluster restarted, and starts a view change with its recovered log.
pub const PROBE_ATTEMPTS_MAX: u64 = 10;

/// Ticks a replica waits with committed ops it cannot apply (their prepares are gone from
/// every journal it asked) before it asks its shell for state transfer, and between asks.
pub const STATE_TRANSFER_TIMEOUT_TICKS: u64 = 100;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_that_cannot_run_the_protocol_are_refused() {
        let partition_like = Shape::PARTITION;
        assert_eq!(partition_like.check(), Ok(()));
        let refused = [
            Shape {
                message_size_max: MESSAGE_SIZE_LIMIT + 1,
                ..partition_like
            },
            Shape {
                message_size_max: MESSAGE_SIZE_MAX - 1,
                ..partition_like
            },
            Shape {
                pipeline_prepares_max: 0,
                ..partition_like
            },
            Shape {
                clients_max: 0,
                ..partition_like
            },
            Shape {
                checkpoint_interval_ops: 0,
                ..partition_like
            },
            // The journal cannot hold a checkpoint interval and the pipeline twice over.
            Shape {
                journal_slots: 256 + 16,
                ..partition_like
            },
            // A checkpoint's client table would not fit a u32 size.
            Shape {
                clients_max: 4096,
                ..partition_like
            },
            // A view change's headers would not fit one message.
            Shape {
                pipeline_prepares_max: 4096,
                journal_slots: 1 << 16,
                ..partition_like
            },
        ];
        for shape in refused {
            assert!(shape.check().is_err(), "{shape:?} was accepted");
        }
    }
}
