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
