//! What a node checks in every message a peer sends, after the handshake: pure code.
//!
//! The VSR message is the frame: a 256-byte header, then `size - 256` bytes of body. The
//! receiver reads the header, and before it allocates for the body it checks:
//!
//! - the header's own checksum and fixed-range fields (`Header::decode`);
//! - the cluster id (one connection never carries another cluster's traffic);
//! - the size against the largest message this node accepts (bounded by the largest group
//!   shape's message, not by the header's say);
//! - the command: replica traffic only, no client request or reply;
//! - the sender: `header.replica` must be the authenticated peer's replica index, except in
//!   a prepare, which names the primary that made it (a repair answer passes on a prepare of
//!   another primary; the body rule and the hash chain verify it).
//!
//! Then the body, by the group's rule: a prepare by its state machine's (a partition's append
//! carries a checksum derived from its batches), anything else as the XXH3-128 of the body.
//! A message that fails any check closes the connection: a peer that sends it is broken or
//! not a peer, and VSR repairs what the connection would have carried.

use bytes::Bytes;
use cairn_vsr::constants::HEADER_SIZE;
use cairn_vsr::header::{Command, Header, HeaderFault, Message};
use cairn_vsr::journal::BodyRule;
use std::sync::Arc;

/// The body rule of a group's prepares, by group id.
pub type PrepareRule = Arc<dyn Fn(u64) -> BodyRule + Send + Sync>;

/// Why a message from a peer was refused (the connection is then closed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("the header does not verify: {0}")]
    Header(HeaderFault),
    #[error("a message of cluster {theirs:032x} on a connection of cluster {ours:032x}")]
    Cluster { ours: u128, theirs: u128 },
    #[error("a message of {size} bytes; this node takes at most {max}")]
    TooLarge { size: usize, max: usize },
    #[error("a {0:?} message is not replica traffic")]
    NotReplicaTraffic(Command),
    #[error(
        "a {command:?} message names replica {claimed} as its sender, on the connection of replica {peer}"
    )]
    Sender { command: Command, claimed: u8, peer: u8 },
    #[error("the body of a {command:?} message of group {group} does not verify")]
    Body { command: Command, group: u64 },
}

/// The checks of one connection's incoming messages.
#[derive(Clone)]
pub struct MessageCheck {
    cluster: u128,
    /// The authenticated peer's replica index.
    peer: u8,
    message_size_max: usize,
    prepare_rule: PrepareRule,
}

impl MessageCheck {
    pub fn new(cluster: u128, peer: u8, message_size_max: usize, prepare_rule: PrepareRule) -> MessageCheck {
        assert!(message_size_max >= HEADER_SIZE);
        MessageCheck {
            cluster,
            peer,
            message_size_max,
            prepare_rule,
        }
    }

    /// Check a received header; `Ok` gives the header, whose `body_len()` bytes are then
    /// safe to read.
    pub fn header(&self, bytes: &[u8; HEADER_SIZE]) -> Result<Header, FrameError> {
        let header = Header::decode(bytes).map_err(FrameError::Header)?;
        if header.cluster != self.cluster {
            return Err(FrameError::Cluster {
                ours: self.cluster,
                theirs: header.cluster,
            });
        }
        if header.size as usize > self.message_size_max {
            return Err(FrameError::TooLarge {
                size: header.size as usize,
                max: self.message_size_max,
            });
        }
        match header.command {
            Command::Request | Command::Reply => return Err(FrameError::NotReplicaTraffic(header.command)),
            Command::Prepare => {}
            command if header.replica != self.peer => {
                return Err(FrameError::Sender {
                    command,
                    claimed: header.replica,
                    peer: self.peer,
                });
            }
            _ => {}
        }
        Ok(header)
    }

    /// Verify `body` against `header` (from [`MessageCheck::header`]) and pair them.
    pub fn body(&self, header: Header, body: Bytes) -> Result<Message, FrameError> {
        let refused = FrameError::Body {
            command: header.command,
            group: header.group,
        };
        if body.len() != header.body_len() {
            return Err(refused);
        }
        let verifies = match header.command {
            Command::Prepare => {
                (self.prepare_rule)(header.group)(header.operation, &body, header.checksum_body)
            }
            _ => header.verify_body(&body).is_ok(),
        };
        if !verifies {
            return Err(refused);
        }
        Ok(Message { header, body })
    }
}

/// Panics on a message that must never be sent: one sealed for this process only
/// (`Message::in_memory`: no body checksum).
pub fn assert_sendable(message: &Message) {
    assert!(
        message.header.checksum_body != 0,
        "a message sealed in memory (no body checksum) was handed to the replica network"
    );
    debug_assert_eq!(message.header.body_len(), message.body.len());
}

/// The bytes of `message`'s header on the wire ([`assert_sendable`] first).
pub fn encode_header(message: &Message) -> [u8; HEADER_SIZE] {
    assert_sendable(message);
    message.header.encode()
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_vsr::journal::plain_body;

    const CLUSTER: u128 = 77;

    fn check(peer: u8) -> MessageCheck {
        MessageCheck::new(CLUSTER, peer, 4096, Arc::new(|_| plain_body as BodyRule))
    }

    fn message(command: Command, replica: u8, body: &[u8]) -> Message {
        let mut header = Header::new(command, CLUSTER);
        header.replica = replica;
        header.group = 5;
        Message::new(header, Bytes::copy_from_slice(body))
    }

    fn receive(check: &MessageCheck, message: &Message) -> Result<Message, FrameError> {
        let header = check.header(&encode_header(message))?;
        check.body(header, message.body.clone())
    }

    #[test]
    fn a_peer_message_passes_and_its_sender_is_bound_to_the_connection() {
        let from_1 = message(Command::PrepareOk, 1, b"");
        assert_eq!(receive(&check(1), &from_1), Ok(from_1.clone()));
        assert_eq!(
            receive(&check(2), &from_1),
            Err(FrameError::Sender {
                command: Command::PrepareOk,
                claimed: 1,
                peer: 2
            })
        );
        // A prepare names its primary, which may be another node (a repair answer).
        let prepare = message(Command::Prepare, 0, b"op body");
        assert!(receive(&check(2), &prepare).is_ok());
    }

    #[test]
    fn foreign_oversized_client_and_damaged_messages_are_refused() {
        let mut other = Header::new(Command::Commit, CLUSTER + 1);
        other.replica = 1;
        let other = Message::new(other, Bytes::new());
        assert!(matches!(
            receive(&check(1), &other),
            Err(FrameError::Cluster { .. })
        ));
        let big = message(Command::Headers, 1, &[7; 4096]);
        assert!(matches!(
            receive(&check(1), &big),
            Err(FrameError::TooLarge { .. })
        ));
        let request = message(Command::Request, 1, b"");
        assert_eq!(
            receive(&check(1), &request),
            Err(FrameError::NotReplicaTraffic(Command::Request))
        );
        let headers = message(Command::Headers, 1, b"some headers");
        let header = check(1).header(&encode_header(&headers)).expect("header");
        assert!(matches!(
            check(1).body(header, Bytes::from_static(b"some headerz")),
            Err(FrameError::Body { .. })
        ));
        let mut torn = encode_header(&headers);
        torn[100] ^= 4;
        assert!(matches!(check(1).header(&torn), Err(FrameError::Header(_))));
    }

    #[test]
    fn prepares_are_verified_by_their_groups_rule() {
        // A rule that takes nothing: the prepare is refused even though its plain hash holds.
        fn none(_: u8, _: &[u8], _: u128) -> bool {
            false
        }
        let strict = MessageCheck::new(
            CLUSTER,
            1,
            4096,
            Arc::new(|group| if group == 5 { none } else { plain_body }),
        );
        let prepare = message(Command::Prepare, 1, b"op body");
        assert!(matches!(
            receive(&strict, &prepare),
            Err(FrameError::Body { group: 5, .. })
        ));
    }

    #[test]
    #[should_panic(expected = "sealed in memory")]
    fn a_message_sealed_in_memory_never_reaches_the_wire() {
        let mut header = Header::new(Command::Commit, CLUSTER);
        header.replica = 1;
        let _ = encode_header(&Message::in_memory(header, Bytes::from_static(b"x")));
    }
}
