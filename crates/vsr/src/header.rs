//! The 256-byte header every replication message starts with, its checksums and its codec.
//!
//! Layout (little-endian; `docs/replication.md`, "Messages", says why each field exists):
//!
//! | off | size | field |
//! |---:|---:|---|
//! | 0 | 16 | `checksum`: XXH3-128 of bytes 16..256; it covers `checksum_body`, so the body too |
//! | 16 | 16 | `checksum_body`: XXH3-128 of the body, or a prepare's by its state machine's rule ([`Message::with_body_checksum`]); 0 for a request kept in memory ([`Message::in_memory`]) |
//! | 32 | 16 | `cluster` |
//! | 48 | 4 | `size`: header + body bytes |
//! | 52 | 4 | `release` |
//! | 56 | 2 | `protocol` |
//! | 58 | 1 | `command` |
//! | 59 | 1 | `replica` |
//! | 60 | 4 | `view` |
//! | 64 | 8 | `group` |
//! | 72 | 8 | `op` |
//! | 80 | 8 | `commit` |
//! | 88 | 8 | `timestamp` |
//! | 96 | 16 | `parent` |
//! | 112 | 16 | `client` |
//! | 128 | 8 | `request` |
//! | 136 | 1 | `operation` |
//! | 137 | 3 | reserved, zero |
//! | 140 | 4 | `log_view` |
//! | 144 | 16 | `context` |
//! | 160 | 16 | `nonce` |
//! | 176 | 16 | `cursor`: a prepare's state-machine cursor after it (a partition's next offset and last timestamp) |
//! | 192 | 64 | reserved, zero |
//!
//! Decoding checks before it trusts: the header checksum first (a flipped bit anywhere in
//! bytes 16..256 is caught before any field is used), then every field with a fixed legal
//! range, then the body against `checksum_body` as the XXH3-128 of the body ([`Message::decode`]
//! knows no other rule: a prepare sealed by a state machine's own rule, such as a partition's
//! append, is verified by that machine's `body_verifies` instead, and `decode` refuses it).
//! Nothing is allocated from a size that was not
//! bounded by [`MESSAGE_SIZE_LIMIT`] (a group's own, smaller bound is its
//! replica's to check: `Shape::message_size_max`).

use crate::constants::{HEADER_SIZE, MESSAGE_SIZE_LIMIT, PROTOCOL_VERSION, RELEASE, RELEASE_MIN};
use bytes::Bytes;
use xxhash_rust::xxh3::xxh3_128;

const OFFSET_CHECKSUM: usize = 0;
const OFFSET_CHECKSUM_BODY: usize = 16;
const OFFSET_CLUSTER: usize = 32;
const OFFSET_SIZE: usize = 48;
const OFFSET_RELEASE: usize = 52;
const OFFSET_PROTOCOL: usize = 56;
const OFFSET_COMMAND: usize = 58;
const OFFSET_REPLICA: usize = 59;
const OFFSET_VIEW: usize = 60;
const OFFSET_GROUP: usize = 64;
const OFFSET_OP: usize = 72;
const OFFSET_COMMIT: usize = 80;
const OFFSET_TIMESTAMP: usize = 88;
const OFFSET_PARENT: usize = 96;
const OFFSET_CLIENT: usize = 112;
const OFFSET_REQUEST: usize = 128;
const OFFSET_OPERATION: usize = 136;
const OFFSET_RESERVED_SMALL: usize = 137;
const OFFSET_LOG_VIEW: usize = 140;
const OFFSET_CONTEXT: usize = 144;
const OFFSET_NONCE: usize = 160;
const OFFSET_CURSOR: usize = 176;
const OFFSET_RESERVED: usize = 192;
/// The header checksum covers everything after itself.
const CHECKSUM_COVERAGE_START: usize = OFFSET_CHECKSUM_BODY;

const _: () = assert!(OFFSET_RESERVED_SMALL + 3 == OFFSET_LOG_VIEW);
const _: () = assert!(OFFSET_NONCE + 16 == OFFSET_CURSOR);
const _: () = assert!(OFFSET_CURSOR + 16 == OFFSET_RESERVED);
const _: () = assert!(HEADER_SIZE == 256);
const _: () = assert!(OFFSET_RESERVED < HEADER_SIZE);
const _: () = assert!(CHECKSUM_COVERAGE_START == OFFSET_CHECKSUM + 16);

/// What a message is. The numbers are on the wire: never reuse one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum Command {
    /// Client → primary: an operation to replicate.
    Request = 1,
    /// Primary → backups (and a repair answer): one op of the log.
    Prepare = 2,
    /// Backup → primary: the prepare named by `context` is durable here.
    PrepareOk = 3,
    /// Primary → client: the result of a committed request.
    Reply = 4,
    /// Primary → backups: heartbeat carrying `commit`.
    Commit = 5,
    StartViewChange = 6,
    /// Replica → new primary; the body is prepare headers (the suffix behind its head).
    DoViewChange = 7,
    /// New primary → replicas; the body is the canonical suffix headers.
    StartView = 8,
    /// Recovering replica → all: a probe carrying a fresh `nonce`.
    RequestStartView = 9,
    /// Repair: asks for the prepare at `op` whose checksum is `context`.
    RequestPrepare = 10,
    /// Repair: asks for the headers of ops `op ..= commit` (reusing `commit` as the upper end).
    RequestHeaders = 11,
    /// Repair answer: the body is prepare headers.
    Headers = 12,
    /// Node → node: the commit heartbeats of every group whose primary is on the sender, for
    /// the receiver's replicas, in one message (`node::HEARTBEAT_ENTRY_SIZE` bytes each).
    /// `context`: the nodes the sender hears, a bit per replica index (the node shell's; the
    /// core's `Node` sends 0).
    Heartbeats = 13,
    /// Any replica → a recovering replica that probed: the responder's `view`, echoing the
    /// probe's `nonce`. A wiped replica installs a view only after a quorum of these.
    RecoveryResponse = 14,
    /// State transfer, node shell → a peer's replica of the group: send your durable
    /// checkpoint if it lies above `op` and your `commit_max` is at least `commit`; `nonce`
    /// names the transfer. The replica core never sees the transfer commands (`cairn::node`).
    RequestCheckpoint = 15,
    /// State transfer answer: the durable checkpoint at `op` whose checksum is `context`,
    /// the sender's `commit_max` in `commit`, `nonce` echoed; the body is the checkpoint's
    /// length (u32), its bytes, then what the sender's journal offers with it (a log's
    /// manifest, or nothing).
    CheckpointOffer = 16,
    /// State transfer: `request` bytes at byte `commit` of the segment whose first op is `op`,
    /// for transfer `nonce`.
    RequestChunk = 17,
    /// State transfer answer: the bytes asked for (the fields of the request echoed), their
    /// XXH3-64 as read at the source in `context`.
    Chunk = 18,
    /// Node shell → the node of a partition's primary: a client's send that reached a node
    /// whose replica is not the primary. `group` is the partition's group, `client` names
    /// the forward, `request` is the batch's message count; the body is the batch. The
    /// replica core never sees it (`cairn::forward`).
    ForwardSend = 19,
    /// Answer to a `ForwardSend`: `client` echoed, `request` the send's status (0: stored),
    /// `op` the base offset it got.
    ForwardReply = 20,
}

impl Command {
    pub fn from_u8(byte: u8) -> Option<Command> {
        Some(match byte {
            1 => Command::Request,
            2 => Command::Prepare,
            3 => Command::PrepareOk,
            4 => Command::Reply,
            5 => Command::Commit,
            6 => Command::StartViewChange,
            7 => Command::DoViewChange,
            8 => Command::StartView,
            9 => Command::RequestStartView,
            10 => Command::RequestPrepare,
            11 => Command::RequestHeaders,
            12 => Command::Headers,
            13 => Command::Heartbeats,
            14 => Command::RecoveryResponse,
            15 => Command::RequestCheckpoint,
            16 => Command::CheckpointOffer,
            17 => Command::RequestChunk,
            18 => Command::Chunk,
            19 => Command::ForwardSend,
            20 => Command::ForwardReply,
            _ => return None,
        })
    }
}

/// A decoded header. Fields a command does not use are zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Header {
    pub checksum: u128,
    pub checksum_body: u128,
    pub cluster: u128,
    /// Header plus body bytes: `HEADER_SIZE ..= MESSAGE_SIZE_LIMIT`.
    pub size: u32,
    pub release: u32,
    pub protocol: u16,
    pub command: Command,
    pub replica: u8,
    pub view: u32,
    pub group: u64,
    pub op: u64,
    pub commit: u64,
    pub timestamp: u64,
    pub parent: u128,
    pub client: u128,
    pub request: u64,
    pub operation: u8,
    pub log_view: u32,
    pub context: u128,
    pub nonce: u128,
    /// Prepare: what the state machine's next prepare mints from, after this op (a
    /// partition's next offset and the last timestamp it stamped); decided by the primary
    /// (`StateMachine::prepare`) and carried with the op, so a new primary continues from its
    /// log's head. 0 elsewhere.
    pub cursor: u128,
}

/// Why bytes are not a valid header or message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HeaderFault {
    #[error("fewer than {HEADER_SIZE} bytes")]
    Short,
    #[error("header checksum mismatch")]
    ChecksumHeader,
    #[error("body checksum mismatch")]
    ChecksumBody,
    #[error("protocol version {0}, this build speaks {PROTOCOL_VERSION}")]
    Protocol(u16),
    #[error("release {0} is older than the oldest accepted ({RELEASE_MIN})")]
    Release(u32),
    #[error("unknown command {0}")]
    Command(u8),
    #[error("size {0} outside {HEADER_SIZE}..={MESSAGE_SIZE_LIMIT}")]
    Size(u32),
    #[error("reserved bytes are not zero")]
    Reserved,
    #[error("the body is {found} bytes, the header says {expected}")]
    BodyLength { found: usize, expected: usize },
}

impl Header {
    /// A header for `command` in `cluster` with this build's protocol and release and an empty
    /// body; not yet sealed.
    pub fn new(command: Command, cluster: u128) -> Header {
        Header {
            checksum: 0,
            checksum_body: 0,
            cluster,
            size: HEADER_SIZE as u32,
            release: RELEASE,
            protocol: PROTOCOL_VERSION,
            command,
            replica: 0,
            view: 0,
            group: 0,
            op: 0,
            commit: 0,
            timestamp: 0,
            parent: 0,
            client: 0,
            request: 0,
            operation: 0,
            log_view: 0,
            context: 0,
            nonce: 0,
            cursor: 0,
        }
    }

    /// Set `size`, `checksum_body` and `checksum` for `body`. Every other field must be final:
    /// the checksum covers them all.
    pub fn seal(&mut self, body: &[u8]) {
        assert!(
            HEADER_SIZE + body.len() <= MESSAGE_SIZE_LIMIT,
            "a body of {} bytes does not fit a message",
            body.len()
        );
        self.size = (HEADER_SIZE + body.len()) as u32;
        self.checksum_body = xxh3_128(body);
        self.checksum = header_checksum(&self.encode());
        debug_assert!(Header::decode(&self.encode()).is_ok());
    }

    /// [`Header::seal`] with `checksum_body` given rather than hashed from the body.
    fn seal_with(&mut self, body_len: usize, checksum_body: u128) {
        assert!(
            HEADER_SIZE + body_len <= MESSAGE_SIZE_LIMIT,
            "a body of {body_len} bytes does not fit a message"
        );
        self.size = (HEADER_SIZE + body_len) as u32;
        self.checksum_body = checksum_body;
        self.checksum = header_checksum(&self.encode());
        debug_assert!(Header::decode(&self.encode()).is_ok());
    }

    /// The 256 header bytes, `checksum` as it stands.
    pub fn encode(&self) -> [u8; HEADER_SIZE] {
        let mut bytes = [0u8; HEADER_SIZE];
        put_u128(&mut bytes, OFFSET_CHECKSUM, self.checksum);
        put_u128(&mut bytes, OFFSET_CHECKSUM_BODY, self.checksum_body);
        put_u128(&mut bytes, OFFSET_CLUSTER, self.cluster);
        put_u32(&mut bytes, OFFSET_SIZE, self.size);
        put_u32(&mut bytes, OFFSET_RELEASE, self.release);
        bytes[OFFSET_PROTOCOL..OFFSET_PROTOCOL + 2].copy_from_slice(&self.protocol.to_le_bytes());
        bytes[OFFSET_COMMAND] = self.command as u8;
        bytes[OFFSET_REPLICA] = self.replica;
        put_u32(&mut bytes, OFFSET_VIEW, self.view);
        put_u64(&mut bytes, OFFSET_GROUP, self.group);
        put_u64(&mut bytes, OFFSET_OP, self.op);
        put_u64(&mut bytes, OFFSET_COMMIT, self.commit);
        put_u64(&mut bytes, OFFSET_TIMESTAMP, self.timestamp);
        put_u128(&mut bytes, OFFSET_PARENT, self.parent);
        put_u128(&mut bytes, OFFSET_CLIENT, self.client);
        put_u64(&mut bytes, OFFSET_REQUEST, self.request);
        bytes[OFFSET_OPERATION] = self.operation;
        put_u32(&mut bytes, OFFSET_LOG_VIEW, self.log_view);
        put_u128(&mut bytes, OFFSET_CONTEXT, self.context);
        put_u128(&mut bytes, OFFSET_NONCE, self.nonce);
        put_u128(&mut bytes, OFFSET_CURSOR, self.cursor);
        bytes
    }

    /// The message size a stream transport must buffer for the header at the start of
    /// `bytes`, once its checksum verifies; `None` while fewer than [`HEADER_SIZE`] bytes
    /// are there. (Check before parse: a transport never allocates from an unverified size.)
    pub fn peek_size(bytes: &[u8]) -> Option<Result<usize, HeaderFault>> {
        if bytes.len() < HEADER_SIZE {
            return None;
        }
        Some(Header::decode(bytes).map(|header| header.size as usize))
    }

    /// Decode and verify the header at the start of `bytes` (the body is not checked).
    pub fn decode(bytes: &[u8]) -> Result<Header, HeaderFault> {
        let Some(bytes) = bytes.get(..HEADER_SIZE) else {
            return Err(HeaderFault::Short);
        };
        let checksum = get_u128(bytes, OFFSET_CHECKSUM);
        if header_checksum(bytes) != checksum {
            return Err(HeaderFault::ChecksumHeader);
        }
        let protocol = u16::from_le_bytes([bytes[OFFSET_PROTOCOL], bytes[OFFSET_PROTOCOL + 1]]);
        if protocol != PROTOCOL_VERSION {
            return Err(HeaderFault::Protocol(protocol));
        }
        let release = get_u32(bytes, OFFSET_RELEASE);
        if release < RELEASE_MIN {
            return Err(HeaderFault::Release(release));
        }
        let Some(command) = Command::from_u8(bytes[OFFSET_COMMAND]) else {
            return Err(HeaderFault::Command(bytes[OFFSET_COMMAND]));
        };
        let size = get_u32(bytes, OFFSET_SIZE);
        if !(HEADER_SIZE..=MESSAGE_SIZE_LIMIT).contains(&(size as usize)) {
            return Err(HeaderFault::Size(size));
        }
        let reserved_small = &bytes[OFFSET_RESERVED_SMALL..OFFSET_LOG_VIEW];
        if reserved_small
            .iter()
            .chain(&bytes[OFFSET_RESERVED..])
            .any(|&b| b != 0)
        {
            return Err(HeaderFault::Reserved);
        }
        Ok(Header {
            checksum,
            checksum_body: get_u128(bytes, OFFSET_CHECKSUM_BODY),
            cluster: get_u128(bytes, OFFSET_CLUSTER),
            size,
            release,
            protocol,
            command,
            replica: bytes[OFFSET_REPLICA],
            view: get_u32(bytes, OFFSET_VIEW),
            group: get_u64(bytes, OFFSET_GROUP),
            op: get_u64(bytes, OFFSET_OP),
            commit: get_u64(bytes, OFFSET_COMMIT),
            timestamp: get_u64(bytes, OFFSET_TIMESTAMP),
            parent: get_u128(bytes, OFFSET_PARENT),
            client: get_u128(bytes, OFFSET_CLIENT),
            request: get_u64(bytes, OFFSET_REQUEST),
            operation: bytes[OFFSET_OPERATION],
            log_view: get_u32(bytes, OFFSET_LOG_VIEW),
            context: get_u128(bytes, OFFSET_CONTEXT),
            nonce: get_u128(bytes, OFFSET_NONCE),
            cursor: get_u128(bytes, OFFSET_CURSOR),
        })
    }

    /// The body's length as the header states it.
    pub fn body_len(&self) -> usize {
        self.size as usize - HEADER_SIZE
    }

    /// Whether `body` is the body this header was sealed over.
    pub fn verify_body(&self, body: &[u8]) -> Result<(), HeaderFault> {
        if body.len() != self.body_len() {
            return Err(HeaderFault::BodyLength {
                found: body.len(),
                expected: self.body_len(),
            });
        }
        if xxh3_128(body) != self.checksum_body {
            return Err(HeaderFault::ChecksumBody);
        }
        Ok(())
    }
}

/// A header and its body. The body is shared, so a prepare sent to every backup and kept in
/// the journal is one allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub header: Header,
    pub body: Bytes,
}

impl Message {
    /// Seal `header` over `body` and pair them.
    pub fn new(mut header: Header, body: Bytes) -> Message {
        header.seal(&body);
        Message { header, body }
    }

    /// Pair `header` with `body` for a replica in this same process, without hashing the
    /// body: `checksum_body` is 0, so the message must never be encoded for another process
    /// (its [`Message::decode`] there refuses it). A shell hands its own requests to its
    /// replica this way: nothing reads a request's body checksum (a prepare's is computed when
    /// it is made), and hashing a megabyte append only to drop the hash is a pass over every
    /// byte of every send.
    pub fn in_memory(mut header: Header, body: Bytes) -> Message {
        header.seal_with(body.len(), 0);
        Message { header, body }
    }

    /// Seal `header` over `body` with `checksum_body` as the body's checksum, computed by the
    /// caller ([`crate::replica::StateMachine::body_checksum`]: a state machine may derive a
    /// prepare's from fewer bytes than the body). Such a message verifies only where that
    /// machine's rule is known: [`Message::decode`] checks the plain XXH3-128 of the body.
    pub fn with_body_checksum(mut header: Header, body: Bytes, checksum_body: u128) -> Message {
        header.seal_with(body.len(), checksum_body);
        Message { header, body }
    }

    /// Header bytes followed by the body.
    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(self.header.size as usize);
        bytes.extend_from_slice(&self.header.encode());
        bytes.extend_from_slice(&self.body);
        bytes
    }

    /// Decode exactly one whole message; `bytes` must be its `size` bytes.
    pub fn decode(bytes: &[u8]) -> Result<Message, HeaderFault> {
        let header = Header::decode(bytes)?;
        let body = &bytes[HEADER_SIZE..];
        header.verify_body(body)?;
        Ok(Message {
            header,
            body: Bytes::copy_from_slice(body),
        })
    }
}

/// The checksum of op 0, the root every group's hash chain starts from. Derived from the
/// cluster id, so two clusters' chains never share a prefix.
pub fn root_checksum(cluster: u128) -> u128 {
    let mut bytes = [0u8; 32];
    bytes[..16].copy_from_slice(b"cairn-vsr-root\0\0");
    bytes[16..].copy_from_slice(&cluster.to_le_bytes());
    xxh3_128(&bytes)
}

fn header_checksum(header_bytes: &[u8]) -> u128 {
    xxh3_128(&header_bytes[CHECKSUM_COVERAGE_START..HEADER_SIZE])
}

fn put_u32(bytes: &mut [u8], at: usize, value: u32) {
    bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
}

fn put_u64(bytes: &mut [u8], at: usize, value: u64) {
    bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
}

fn put_u128(bytes: &mut [u8], at: usize, value: u128) {
    bytes[at..at + 16].copy_from_slice(&value.to_le_bytes());
}

/// Callers pass a slice of exactly `HEADER_SIZE` bytes and fixed offsets, so the
/// conversions below cannot fail.
fn get_u32(bytes: &[u8], at: usize) -> u32 {
    let mut raw = [0u8; 4];
    raw.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(raw)
}

fn get_u64(bytes: &[u8], at: usize) -> u64 {
    let mut raw = [0u8; 8];
    raw.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(raw)
}

fn get_u128(bytes: &[u8], at: usize) -> u128 {
    let mut raw = [0u8; 16];
    raw.copy_from_slice(&bytes[at..at + 16]);
    u128::from_le_bytes(raw)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Message {
        let mut header = Header::new(Command::Prepare, 0xC1u128 << 64 | 7);
        header.replica = 2;
        header.view = 9;
        header.group = 42;
        header.op = 1_000;
        header.commit = 990;
        header.timestamp = 123_456;
        header.parent = 0xAB;
        header.client = 77;
        header.request = 5;
        header.operation = 3;
        header.log_view = 8;
        header.context = 0xCD;
        header.nonce = 0xEF;
        header.cursor = 0x1234_5678 << 64 | 9;
        Message::new(header, Bytes::from_static(b"an operation's input"))
    }

    #[test]
    fn an_in_memory_message_never_decodes_from_bytes() {
        let sealed = sample();
        let in_memory = Message::in_memory(sealed.header, sealed.body.clone());
        assert_eq!(in_memory.header.size, sealed.header.size);
        assert_eq!(in_memory.header.checksum_body, 0);
        // Its header is whole, but another process would refuse the body.
        let bytes = in_memory.encode();
        assert!(Header::decode(&bytes).is_ok());
        assert_eq!(Message::decode(&bytes), Err(HeaderFault::ChecksumBody));
    }

    #[test]
    fn round_trip_keeps_every_field() {
        let message = sample();
        let bytes = message.encode();
        assert_eq!(bytes.len(), message.header.size as usize);
        assert_eq!(Message::decode(&bytes), Ok(message.clone()));
        assert_eq!(Header::peek_size(&bytes[..HEADER_SIZE]), Some(Ok(bytes.len())));
        assert_eq!(Header::peek_size(&bytes[..HEADER_SIZE - 1]), None);
    }

    #[test]
    fn every_flipped_bit_is_refused() {
        let bytes = sample().encode();
        for bit in 0..bytes.len() * 8 {
            let mut damaged = bytes.clone();
            damaged[bit / 8] ^= 1 << (bit % 8);
            assert!(Message::decode(&damaged).is_err(), "bit {bit}");
        }
    }

    #[test]
    fn fields_with_one_legal_range_are_checked_after_the_checksum() {
        let base = sample();
        let reseal = |edit: &dyn Fn(&mut [u8; HEADER_SIZE])| {
            let mut bytes = base.header.encode();
            edit(&mut bytes);
            let checksum = header_checksum(&bytes);
            put_u128(&mut bytes, OFFSET_CHECKSUM, checksum);
            Header::decode(&bytes)
        };
        assert_eq!(reseal(&|b| b[OFFSET_PROTOCOL] = 2), Err(HeaderFault::Protocol(2)));
        assert_eq!(
            reseal(&|b| put_u32(b, OFFSET_RELEASE, 0)),
            Err(HeaderFault::Release(0))
        );
        assert_eq!(reseal(&|b| b[OFFSET_COMMAND] = 0), Err(HeaderFault::Command(0)));
        assert_eq!(
            reseal(&|b| b[OFFSET_COMMAND] = 200),
            Err(HeaderFault::Command(200))
        );
        assert_eq!(
            reseal(&|b| put_u32(b, OFFSET_SIZE, 255)),
            Err(HeaderFault::Size(255))
        );
        let too_big = MESSAGE_SIZE_LIMIT as u32 + 1;
        assert_eq!(
            reseal(&|b| put_u32(b, OFFSET_SIZE, too_big)),
            Err(HeaderFault::Size(too_big))
        );
        assert_eq!(reseal(&|b| b[HEADER_SIZE - 1] = 1), Err(HeaderFault::Reserved));
        assert_eq!(
            reseal(&|b| b[OFFSET_RESERVED_SMALL] = 1),
            Err(HeaderFault::Reserved)
        );
    }

    #[test]
    fn a_body_must_match_in_length_and_checksum() {
        let message = sample();
        let mut bytes = message.encode();
        bytes.push(0);
        assert!(matches!(
            Message::decode(&bytes),
            Err(HeaderFault::BodyLength { .. })
        ));
        let other = Message::new(message.header, Bytes::from_static(b"another operation's inp"));
        assert_ne!(other.header.checksum, message.header.checksum);
        assert_eq!(
            message.header.verify_body(&other.body),
            Err(HeaderFault::BodyLength {
                found: other.body.len(),
                expected: message.body.len()
            })
        );
        // Same length, different bytes: the body checksum differs, and so does the identity.
        let same_len = Message::new(message.header, Bytes::from_static(b"an operation's INPUT"));
        assert_ne!(same_len.header.checksum, message.header.checksum);
        assert_eq!(
            message.header.verify_body(&same_len.body),
            Err(HeaderFault::ChecksumBody)
        );
    }

    #[test]
    fn roots_differ_per_cluster() {
        assert_ne!(root_checksum(1), root_checksum(2));
        assert_eq!(root_checksum(1), root_checksum(1));
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = Message::decode(&bytes);
            let _ = Header::peek_size(&bytes);
        }
    }
}
