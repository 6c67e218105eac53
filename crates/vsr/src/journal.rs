//! Journal slots as recovery finds them (`docs/replication.md`, "Journal").
//!
//! The journal is two rings of `journal_slots` slots (the group's `Shape`): one of whole
//! prepares, one of their headers alone (the *redundant* headers). Op `o` lives in slot
//! `o % journal_slots` of both.
//! A replica writes the prepare and syncs it, then writes its redundant header and syncs
//! that, and acknowledges the op only once both are durable. A crash can leave either write lost or torn, and a disk can flip
//! bits in either later; [`classify_slot`] tells what a slot still proves:
//!
//! - **Clean**: a whole prepare that verifies (checksums, cluster, group, slot). It may be
//!   newer than the redundant header: the header write was lost, or the header is from an
//!   earlier lap of the ring.
//! - **Faulty**: the slot may hold an op the replica cannot produce. With a header that
//!   verifies, the replica knows which op and checksum to repair from a peer; without one it
//!   knows only the slot. A faulty slot is never taken as proof that an op is absent: a view
//!   change must not count it as a nack (Iggy trap 15).
//! - **Empty**: both rings hold zeros: nothing was ever written here.
//! - **Unfinished**: a prepare that does not verify under a header slot that holds zeros.
//!   A redundant header is written only after its prepare is durable, and a prepare is
//!   acknowledged only after its header is durable, so nothing here was ever acknowledged.
//!
//! Pure: the shell reads the bytes; this decides what they mean.

use crate::constants::HEADER_SIZE;
#[cfg(test)]
use crate::constants::JOURNAL_SLOTS;
use crate::header::{Command, Header, Message};

/// What one slot holds after recovery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotState {
    /// Nothing was ever written to the slot.
    Empty,
    /// A whole prepare that verifies.
    Clean(Message),
    /// A whole prepare that verifies, handed over as its header only: the body stays in the
    /// journal, and the replica asks for it ([`crate::replica::Output::ReadPrepare`]) when it
    /// needs it (to apply it, or to repair a peer). A log journal recovers this way, so that
    /// recovery holds headers, not batches, in memory. `classify_slot` never returns it.
    Durable(Header),
    /// Something was written that cannot be served. `header`, when the redundant header
    /// verifies, names the op and checksum to repair.
    Faulty { header: Option<Header> },
    /// A prepare that cannot be served, under a redundant header slot that was never
    /// written. The header of a prepare is written only once the prepare is durable, and the
    /// prepare is acknowledged only once its header is too: so no prepare in this slot was
    /// ever acknowledged. A torn or lost first write of the slot, or damage to one that was
    /// never acknowledged. Unlike a faulty slot, it hides nothing a view change needs.
    Unfinished,
}

/// Classify slot `slot` of a journal of `journal_slots` slots for `cluster` and `group` from
/// the bytes of its prepare slot and its redundant header slot.
pub fn classify_slot(
    slot: usize,
    journal_slots: usize,
    prepare_bytes: &[u8],
    header_bytes: &[u8],
    cluster: u128,
    group: u64,
    body_rule: BodyRule,
) -> SlotState {
    assert!(slot < journal_slots, "slot {slot} outside the journal");
    let prepare_blank = is_blank(prepare_bytes);
    let header_blank = is_blank(header_bytes);
    if prepare_blank && header_blank {
        return SlotState::Empty;
    }
    let belongs = |header: &Header| {
        header.command == Command::Prepare
            && header.cluster == cluster
            && header.group == group
            && slot_of(header.op, journal_slots) == slot
    };
    let redundant = Header::decode(header_bytes)
        .ok()
        .filter(|header| belongs(header) && header.size as usize >= HEADER_SIZE);
    let prepare = decode_prepare(prepare_bytes, body_rule).filter(|message| belongs(&message.header));
    match (prepare, redundant) {
        (Some(prepare), None) => SlotState::Clean(prepare),
        (Some(prepare), Some(redundant)) => {
            if redundant.checksum == prepare.header.checksum || is_newer(&prepare.header, &redundant) {
                SlotState::Clean(prepare)
            } else {
                // The header names a newer prepare whose own write was lost or torn.
                SlotState::Faulty {
                    header: Some(redundant),
                }
            }
        }
        (None, _) if header_blank => SlotState::Unfinished,
        (None, redundant) => SlotState::Faulty { header: redundant },
    }
}

/// The slot of op `op` in a journal of `journal_slots` slots.
pub fn slot_of(op: u64, journal_slots: usize) -> usize {
    assert!(journal_slots > 0);
    (op % journal_slots as u64) as usize
}

/// Whether prepare `a` supersedes prepare `b` in the same slot: a later lap of the ring
/// (higher op), or the same op re-prepared in a later view after a view change replaced an
/// uncommitted op.
fn is_newer(a: &Header, b: &Header) -> bool {
    (a.op, a.view) > (b.op, b.view)
}

/// How a prepare's body is checked against its header's `checksum_body`: `(operation, body,
/// checksum_body)`, checking every byte of the body (a slot has no checksum of its own). The
/// group's state machine's rule ([`crate::replica::StateMachine::body_verifies`]).
pub type BodyRule = fn(u8, &[u8], u128) -> bool;

/// The default rule: `checksum_body` is the XXH3-128 of the body.
pub fn plain_body(_operation: u8, body: &[u8], checksum_body: u128) -> bool {
    xxhash_rust::xxh3::xxh3_128(body) == checksum_body
}

/// What a prepare slot's `bytes` give back for a read of op `op` (`Output::ReadPrepare`):
/// the whole prepare there if it verifies (its body by `body_rule`) and is that op with that
/// checksum; `None` if the slot holds anything else (damage, or a later lap or view reused it).
pub fn read_back(bytes: &[u8], op: u64, checksum: u128, body_rule: BodyRule) -> Option<Message> {
    decode_prepare(bytes, body_rule)
        .filter(|prepare| prepare.header.op == op && prepare.header.checksum == checksum)
}

/// A whole prepare at the start of `bytes`, if its header decodes and its body verifies by
/// `body_rule`. The slot may be longer than the message; the header's size (bounded by
/// decoding) says where the message ends.
fn decode_prepare(bytes: &[u8], body_rule: BodyRule) -> Option<Message> {
    let header = Header::decode(bytes).ok()?;
    let body = bytes.get(HEADER_SIZE..header.size as usize)?;
    body_rule(header.operation, body, header.checksum_body).then(|| Message {
        header,
        body: bytes::Bytes::copy_from_slice(body),
    })
}

fn is_blank(bytes: &[u8]) -> bool {
    bytes.iter().all(|&byte| byte == 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    const CLUSTER: u128 = 0xC0FFEE;
    const GROUP: u64 = 4;
    const SLOT_BYTES: usize = 1024;

    fn prepare(op: u64, view: u32, body: &[u8]) -> Message {
        let mut header = Header::new(Command::Prepare, CLUSTER);
        header.group = GROUP;
        header.op = op;
        header.view = view;
        Message::new(header, Bytes::copy_from_slice(body))
    }

    /// The prepare slot's bytes (the message, zero-padded) and the redundant header's.
    fn slot_bytes(message: &Message) -> (Vec<u8>, Vec<u8>) {
        let mut prepare = message.encode();
        prepare.resize(SLOT_BYTES, 0);
        (prepare, message.header.encode().to_vec())
    }

    fn classify(prepare: &[u8], header: &[u8], op: u64) -> SlotState {
        classify_slot(
            slot_of(op, JOURNAL_SLOTS),
            JOURNAL_SLOTS,
            prepare,
            header,
            CLUSTER,
            GROUP,
            plain_body,
        )
    }

    #[test]
    fn whole_writes_are_clean_and_zeros_are_empty() {
        let message = prepare(70, 1, b"seventy");
        let (p, h) = slot_bytes(&message);
        assert_eq!(classify(&p, &h, 70), SlotState::Clean(message));
        assert_eq!(
            classify(&[0; SLOT_BYTES], &[0; HEADER_SIZE], 70),
            SlotState::Empty
        );
    }

    #[test]
    fn a_lost_header_write_leaves_the_prepare_clean() {
        let old = prepare(70 - JOURNAL_SLOTS as u64, 1, b"previous lap");
        let new = prepare(70, 1, b"seventy");
        let (p_new, _) = slot_bytes(&new);
        let (_, h_old) = slot_bytes(&old);
        assert_eq!(classify(&p_new, &h_old, 70), SlotState::Clean(new.clone()));
        assert_eq!(classify(&p_new, &[0; HEADER_SIZE], 70), SlotState::Clean(new));
    }

    #[test]
    fn a_lost_or_torn_prepare_write_is_faulty_with_the_header_to_repair() {
        let old = prepare(70 - JOURNAL_SLOTS as u64, 1, b"previous lap");
        let new = prepare(70, 1, b"seventy");
        let (p_old, _) = slot_bytes(&old);
        let (p_new, h_new) = slot_bytes(&new);
        let faulty = SlotState::Faulty {
            header: Some(new.header),
        };
        // Lost: the old lap's prepare is still there.
        assert_eq!(classify(&p_old, &h_new, 70), faulty);
        // Never written at all.
        assert_eq!(classify(&[0; SLOT_BYTES], &h_new, 70), faulty);
        // Torn: the first sector new, the rest old.
        let mut torn = p_old.clone();
        torn[..512].copy_from_slice(&p_new[..512]);
        torn[200] ^= 1;
        assert_eq!(classify(&torn, &h_new, 70), faulty);
    }

    #[test]
    fn a_replaced_op_is_decided_by_view() {
        let replaced = prepare(70, 1, b"uncommitted, replaced");
        let replacement = prepare(70, 2, b"the view change's");
        let (p_replaced, h_replaced) = slot_bytes(&replaced);
        let (p_replacement, h_replacement) = slot_bytes(&replacement);
        assert_eq!(
            classify(&p_replacement, &h_replaced, 70),
            SlotState::Clean(replacement.clone())
        );
        assert_eq!(
            classify(&p_replaced, &h_replacement, 70),
            SlotState::Faulty {
                header: Some(replacement.header)
            }
        );
    }

    #[test]
    fn bit_flips_and_foreign_bytes_are_faulty_never_clean_or_empty() {
        let message = prepare(70, 1, b"seventy");
        let (p, h) = slot_bytes(&message);
        for bit in (0..message.encode().len() * 8).step_by(7) {
            let mut flipped = p.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(
                classify(&flipped, &h, 70),
                SlotState::Faulty {
                    header: Some(message.header)
                },
                "bit {bit}"
            );
            let mut flipped_header = h.clone();
            flipped_header[bit / 8 % HEADER_SIZE] ^= 1 << (bit % 8);
            assert_eq!(
                classify(&flipped, &flipped_header, 70),
                SlotState::Faulty { header: None }
            );
        }
        // A prepare of another group, cluster or slot is not this slot's.
        let (p, h) = slot_bytes(&message);
        assert_eq!(
            classify_slot(
                slot_of(70, JOURNAL_SLOTS),
                JOURNAL_SLOTS,
                &p,
                &h,
                CLUSTER,
                GROUP + 1,
                plain_body
            ),
            SlotState::Faulty { header: None }
        );
        assert_eq!(
            classify_slot(
                slot_of(71, JOURNAL_SLOTS),
                JOURNAL_SLOTS,
                &p,
                &h,
                CLUSTER,
                GROUP,
                plain_body
            ),
            SlotState::Faulty { header: None }
        );
        // Garbage that is not zeros, under a header slot never written: no prepare there was
        // ever acknowledged (headers are written after their prepare is durable).
        assert_eq!(
            classify(&[0xAA; SLOT_BYTES], &[0; HEADER_SIZE], 70),
            SlotState::Unfinished
        );
        // A two-sector prepare whose first write of the slot tore after the first sector.
        let large = prepare(70, 1, &[7u8; 700]);
        let (p_large, _) = slot_bytes(&large);
        let mut torn_first_write = vec![0u8; SLOT_BYTES];
        torn_first_write[..512].copy_from_slice(&p_large[..512]);
        assert_eq!(
            classify(&torn_first_write, &[0; HEADER_SIZE], 70),
            SlotState::Unfinished
        );
    }
}
