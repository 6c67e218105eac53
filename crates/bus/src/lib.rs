//! Cairn's replica network: the TCP bus that carries VSR messages between the nodes of a
//! cluster (`docs/replication.md`, "The replica network").
//!
//! - [`handshake`]: the authentication of every connection (pure).
//! - [`frame`]: the checks of every message a peer sends (pure).
//! - [`tcp`]: the tokio shell: connections, queues, reconnection.
//!
//! The node hands the bus what its replicas send to other replicas
//! (`cairn_vsr::node::NodeOutputs::sends`) and feeds it what the bus receives
//! (`Node::on_message`); the simulator plays the same part with its own network.

pub mod frame;
pub mod handshake;
pub mod tcp;

pub use frame::{FrameError, MessageCheck, PrepareRule};
pub use handshake::{ClusterKey, HandshakeError};
pub use tcp::{Bus, BusConfig, BusError, Counters, NodeAddress, Received, Sent};
