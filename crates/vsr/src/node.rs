//! Many replication groups on one node (`docs/replication.md`, "Many groups per node").
//!
//! A node hosts one replica of each of its groups (a partition each, plus the metadata). A
//! [`Node`] is pure like the replicas it holds, and it keeps two costs from growing with
//! the number of groups:
//!
//! - **Heartbeats.** Every group's primary sends a Commit heartbeat to each backup every
//!   [`COMMIT_INTERVAL_TICKS`](crate::constants::COMMIT_INTERVAL_TICKS). The node gathers
//!   those of one tick into a single [`Command::Heartbeats`] message per peer node, and the
//!   receiving node hands each group its own. So idle traffic is one message per node pair
//!   per interval, whatever the number of groups.
//! - **Durable state.** A node-wide view change asks every group to persist its view. The
//!   node hands the shell those requests as one batch ([`NodeOutputs::durable_writes`]), to
//!   be written with one sync per superblock copy and completed together
//!   ([`Node::on_durable_written`]): not a synchronous write per group on one thread.
//!
//! A tick of an idle group is a few comparisons; groups are kept in a `BTreeMap`, so the
//! order in which the node visits them, and so its output, is deterministic.

use crate::constants::{HEADER_SIZE, MESSAGE_SIZE_MAX};
use crate::durable::DurableState;
use crate::header::{Command, Header, Message};
use crate::replica::{Destination, Output, Replica, StateMachine, TransferredLog};
use bytes::Bytes;
use std::collections::BTreeMap;

/// Bytes of one heartbeat entry: group u64, view u32, commit u64, context u128, 4 reserved.
pub const HEARTBEAT_ENTRY_SIZE: usize = 40;

/// Entries in one heartbeat message; more groups take more messages.
pub const HEARTBEAT_ENTRIES_MAX: usize = (MESSAGE_SIZE_MAX - HEADER_SIZE) / HEARTBEAT_ENTRY_SIZE;

/// What the node asks its shell to do after an input, grouped so the shell can batch.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct NodeOutputs {
    /// Messages to other nodes (by replica index) and to clients.
    pub sends: Vec<(Destination, Message)>,
    /// Prepares to write, by group.
    pub prepare_writes: Vec<(u64, Message)>,
    /// Durable states to write, by group: one batch, one sync per superblock copy.
    pub durable_writes: Vec<(u64, DurableState)>,
    /// Checkpoint writes and state-transfer requests, by group, as the replica asked.
    pub checkpoint_work: Vec<(u64, Output)>,
    /// Prepares to read back from a group's journal (`Output::ReadPrepare`), by group.
    pub prepare_reads: Vec<(u64, Output)>,
}

/// The replicas of one node, by group.
pub struct Node<S: StateMachine> {
    cluster: u128,
    replica: u8,
    groups: BTreeMap<u64, Replica<S>>,
}

impl<S: StateMachine> Node<S> {
    pub fn new(cluster: u128, replica: u8) -> Node<S> {
        Node {
            cluster,
            replica,
            groups: BTreeMap::new(),
        }
    }

    /// Host `replica` (its config names the group, this node's replica index and cluster).
    pub fn add_group(&mut self, replica: Replica<S>) {
        let config = *replica.config();
        assert_eq!(config.cluster, self.cluster);
        assert_eq!(config.replica, self.replica);
        let previous = self.groups.insert(config.group, replica);
        assert!(previous.is_none(), "group {} is already hosted", config.group);
    }

    pub fn group(&self, group: u64) -> Option<&Replica<S>> {
        self.groups.get(&group)
    }

    pub fn group_count(&self) -> usize {
        self.groups.len()
    }

    /// One tick for every group.
    pub fn tick(&mut self) -> NodeOutputs {
        for replica in self.groups.values_mut() {
            replica.on_tick();
        }
        self.collect()
    }

    /// A message from the network: a group's own message, or a node heartbeat batch.
    pub fn on_message(&mut self, message: Message) -> NodeOutputs {
        if message.header.cluster != self.cluster {
            return NodeOutputs::default();
        }
        if message.header.command == Command::Heartbeats {
            self.on_heartbeats(&message);
        } else if let Some(replica) = self.groups.get_mut(&message.header.group) {
            replica.on_message(message);
        }
        self.collect()
    }

    pub fn on_prepare_written(&mut self, group: u64, op: u64, checksum: u128) -> NodeOutputs {
        if let Some(replica) = self.groups.get_mut(&group) {
            replica.on_prepare_written(op, checksum);
        }
        self.collect()
    }

    /// The shell read a prepare back for `group` (`Output::ReadPrepare` in `prepare_reads`).
    pub fn on_prepare_read(
        &mut self,
        group: u64,
        op: u64,
        checksum: u128,
        prepare: Option<Message>,
        for_replica: Option<u8>,
    ) -> NodeOutputs {
        if let Some(replica) = self.groups.get_mut(&group) {
            replica.on_prepare_read(op, checksum, prepare, for_replica);
        }
        self.collect()
    }

    pub fn on_checkpoint_written(&mut self, group: u64, op: u64, checksum: u128) -> NodeOutputs {
        if let Some(replica) = self.groups.get_mut(&group) {
            replica.on_checkpoint_written(op, checksum);
        }
        self.collect()
    }

    /// See [`Replica::on_state_transferred`]; also says whether the checkpoint was installed.
    pub fn on_state_transferred(
        &mut self,
        group: u64,
        bytes: &[u8],
        checksum: u128,
        log: TransferredLog,
    ) -> (bool, NodeOutputs) {
        let installed = self
            .groups
            .get_mut(&group)
            .is_some_and(|replica| replica.on_state_transferred(bytes, checksum, log));
        (installed, self.collect())
    }

    /// The shell wrote a batch of durable states (one sync per copy for all of them).
    pub fn on_durable_written(&mut self, written: &[(u64, DurableState)]) -> NodeOutputs {
        for (group, state) in written {
            if let Some(replica) = self.groups.get_mut(group) {
                replica.on_durable_written(state.clone());
            }
        }
        self.collect()
    }

    fn on_heartbeats(&mut self, message: &Message) {
        for commit in heartbeat_commits(message) {
            if let Some(replica) = self.groups.get_mut(&commit.header.group) {
                replica.on_message(commit);
            }
        }
    }

    /// Gather every group's outputs: heartbeats batched per peer, the rest passed on.
    fn collect(&mut self) -> NodeOutputs {
        let mut outputs = NodeOutputs::default();
        let mut heartbeats: BTreeMap<u8, Vec<u8>> = BTreeMap::new();
        for (&group, replica) in self.groups.iter_mut() {
            for output in replica.take_outputs() {
                match output {
                    Output::Send {
                        to: Destination::Replica(to),
                        message,
                    } if message.header.command == Command::Commit => {
                        debug_assert_eq!(message.header.group, group);
                        push_heartbeat_entry(heartbeats.entry(to).or_default(), &message.header);
                    }
                    Output::Send { to, message } => outputs.sends.push((to, message)),
                    Output::WritePrepare { message } => outputs.prepare_writes.push((group, message)),
                    Output::WriteDurable { state } => outputs.durable_writes.push((group, state)),
                    work @ (Output::WriteCheckpoint { .. } | Output::StateTransfer { .. }) => {
                        outputs.checkpoint_work.push((group, work))
                    }
                    read @ Output::ReadPrepare { .. } => outputs.prepare_reads.push((group, read)),
                }
            }
        }
        for (to, body) in heartbeats {
            for message in heartbeat_messages(self.cluster, self.replica, 0, &body) {
                outputs.sends.push((Destination::Replica(to), message));
            }
        }
        outputs
    }
}

/// Add a group's `Commit` heartbeat to a batch for one peer, as one
/// [`HEARTBEAT_ENTRY_SIZE`]-byte entry.
pub fn push_heartbeat_entry(batch: &mut Vec<u8>, commit: &Header) {
    debug_assert_eq!(commit.command, Command::Commit);
    batch.extend_from_slice(&commit.group.to_le_bytes());
    batch.extend_from_slice(&commit.view.to_le_bytes());
    batch.extend_from_slice(&commit.commit.to_le_bytes());
    batch.extend_from_slice(&commit.context.to_le_bytes());
    batch.extend_from_slice(&[0u8; 4]);
}

/// The `Heartbeats` messages of replica `from` carrying a batch of entries
/// ([`push_heartbeat_entry`]): as many as the entries need. `context` goes in every header
/// (the node shell says there which nodes the sender hears; 0 here).
pub fn heartbeat_messages(cluster: u128, from: u8, context: u128, batch: &[u8]) -> Vec<Message> {
    debug_assert!(batch.len().is_multiple_of(HEARTBEAT_ENTRY_SIZE));
    batch
        .chunks(HEARTBEAT_ENTRIES_MAX * HEARTBEAT_ENTRY_SIZE)
        .map(|entries| {
            let mut header = Header::new(Command::Heartbeats, cluster);
            header.replica = from;
            header.context = context;
            Message::new(header, Bytes::copy_from_slice(entries))
        })
        .collect()
}

/// Each group's `Commit` rebuilt from a `Heartbeats` message (none from a body that is not
/// whole entries). The batch's checksums already covered these bytes.
pub fn heartbeat_commits(message: &Message) -> Vec<Message> {
    if message.header.command != Command::Heartbeats
        || !message.body.len().is_multiple_of(HEARTBEAT_ENTRY_SIZE)
    {
        return Vec::new();
    }
    message
        .body
        .chunks_exact(HEARTBEAT_ENTRY_SIZE)
        .map(|entry| {
            let mut commit = Header::new(Command::Commit, message.header.cluster);
            commit.group = u64::from_le_bytes(entry[0..8].try_into().expect("8 bytes"));
            commit.replica = message.header.replica;
            commit.view = u32::from_le_bytes(entry[8..12].try_into().expect("4 bytes"));
            commit.commit = u64::from_le_bytes(entry[12..20].try_into().expect("8 bytes"));
            commit.context = u128::from_le_bytes(entry[20..36].try_into().expect("16 bytes"));
            Message::new(commit, Bytes::new())
        })
        .collect()
}
