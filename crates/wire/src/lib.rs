//! cairn-wire: the Apache Iggy 0.11 TCP dialect ("VSR-framed"), as pure code.
//!
//! Layout:
//! - [`frame`]: the 256-byte request/reply/eviction headers and the size check that runs
//!   before a body is read.
//! - [`types`]: shared value types on the wire (identifiers, consumers, strategies, ...).
//! - [`command`]: decoding a request (operation + code + body) into one [`command::Command`] enum.
//! - [`reply`]: encoding reply payloads (records, lists, poll replies, confirmations) and the
//!   result-section rule.
//! - [`batch`]: the message-batch layout, its validation on send, stamping and slicing.
//! - [`codes`]: the Iggy error codes Cairn answers with.
//! - `reader` (private): the bounds-checked cursor every request decoder reads through.
//!
//! Architecture invariant: this crate does no IO, reads no clock and holds no state. Every
//! length read from the wire is bounded against the input before it is used.

pub mod batch;
pub mod codes;
pub mod command;
pub mod frame;
pub mod reply;
pub mod types;

mod reader;

#[cfg(test)]
mod tests;
