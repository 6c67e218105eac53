//! Many groups on one node: idle heartbeats cost one message per node pair per interval, and
//! a node-wide view change asks for its durable writes in one batch.

use cairn_vsr::constants::COMMIT_INTERVAL_TICKS;
use cairn_vsr::header::Command;
use cairn_vsr::node::{Node, NodeOutputs};
use cairn_vsr::replica::{Bugs, Config, Destination, Replica, StateMachine, Status};
use std::collections::VecDeque;

const CLUSTER: u128 = 0xAB;
const GROUPS: u64 = 500;
const NODES: u8 = 3;

struct Nothing;

impl StateMachine for Nothing {
    fn apply(&mut self, _op: u64, _timestamp: u64, _operation: u8, _input: &[u8]) -> Vec<u8> {
        Vec::new()
    }

    fn snapshot(&self) -> Vec<u8> {
        Vec::new()
    }

    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String> {
        if snapshot.is_empty() {
            Ok(())
        } else {
            Err("this machine has no state".to_string())
        }
    }
}

struct Cluster {
    nodes: Vec<Node<Nothing>>,
    /// Messages between nodes, with their receiver.
    queue: VecDeque<(u8, cairn_vsr::header::Message)>,
    /// Node isolated from the others (its messages both ways are dropped).
    isolated: Option<u8>,
    messages_sent: u64,
    heartbeat_messages: u64,
    /// Sizes of the durable-write batches written.
    durable_batches: Vec<usize>,
    /// Per node: durable writes asked for since its last flush.
    durable_queued: Vec<Vec<(u64, cairn_vsr::durable::DurableState)>>,
}

impl Cluster {
    fn new() -> Cluster {
        let nodes = (0..NODES)
            .map(|replica| {
                let mut node = Node::new(CLUSTER, replica);
                for group in 0..GROUPS {
                    let config = Config {
                        cluster: CLUSTER,
                        group,
                        replica,
                        replica_count: NODES,
                        shape: cairn_vsr::constants::Shape::METADATA,
                        bugs: Bugs::default(),
                    };
                    node.add_group(Replica::new(config, Nothing));
                }
                node
            })
            .collect();
        Cluster {
            nodes,
            queue: VecDeque::new(),
            isolated: None,
            messages_sent: 0,
            heartbeat_messages: 0,
            durable_batches: Vec::new(),
            durable_queued: (0..NODES).map(|_| Vec::new()).collect(),
        }
    }

    /// Route one node's outputs; writes complete at once (in one batch for durable state).
    fn handle(&mut self, from: u8, outputs: NodeOutputs) {
        let mut pending = vec![(from, outputs)];
        while let Some((node, outputs)) = pending.pop() {
            for (to, message) in outputs.sends {
                let Destination::Replica(to) = to else { continue };
                self.messages_sent += 1;
                if message.header.command == Command::Heartbeats {
                    self.heartbeat_messages += 1;
                }
                if self.isolated != Some(node) && self.isolated != Some(to) {
                    self.queue.push_back((to, message));
                }
            }
            for (group, message) in outputs.prepare_writes {
                let written = self.nodes[usize::from(node)].on_prepare_written(
                    group,
                    message.header.op,
                    message.header.checksum,
                );
                pending.push((node, written));
            }
            // Durable writes wait for the node's next flush, as a shell's write queue would:
            // everything asked for meanwhile goes in one batch.
            self.durable_queued[usize::from(node)].extend(outputs.durable_writes);
        }
    }

    /// Write every node's queued durable states, one batch per node.
    fn flush_durable(&mut self) -> bool {
        let mut any = false;
        for node in 0..NODES {
            let batch = std::mem::take(&mut self.durable_queued[usize::from(node)]);
            if batch.is_empty() {
                continue;
            }
            any = true;
            self.durable_batches.push(batch.len());
            let written = self.nodes[usize::from(node)].on_durable_written(&batch);
            self.handle(node, written);
        }
        any
    }

    fn tick(&mut self) {
        for node in 0..NODES {
            let outputs = self.nodes[usize::from(node)].tick();
            self.handle(node, outputs);
        }
        loop {
            while let Some((to, message)) = self.queue.pop_front() {
                let outputs = self.nodes[usize::from(to)].on_message(message.clone());
                self.handle(to, outputs);
            }
            if !self.flush_durable() {
                break;
            }
        }
    }
}

#[test]
fn idle_groups_share_one_heartbeat_message_per_node_pair() {
    let mut cluster = Cluster::new();
    let intervals = 20;
    for _ in 0..intervals * COMMIT_INTERVAL_TICKS {
        cluster.tick();
    }
    // Node 0 is every group's primary in view 0: it heartbeats nodes 1 and 2, one message
    // each per interval, for all 500 groups.
    assert_eq!(cluster.heartbeat_messages, 2 * intervals);
    assert_eq!(
        cluster.messages_sent, cluster.heartbeat_messages,
        "nothing else while idle"
    );
    for node in &cluster.nodes[1..] {
        for group in 0..GROUPS {
            let replica = node.group(group).expect("hosted");
            assert_eq!(
                replica.status(),
                Status::Normal,
                "the heartbeats kept group {group} calm"
            );
            assert_eq!(replica.view(), 0);
        }
    }
}

#[test]
fn a_node_wide_view_change_persists_its_views_in_batches() {
    let mut cluster = Cluster::new();
    cluster.isolated = Some(0);
    // The tick at which each group's replica on node 1 left view 0.
    let mut left_view_0: Vec<Option<u64>> = vec![None; GROUPS as usize];
    for tick in 0..300 {
        cluster.tick();
        for group in 0..GROUPS {
            let replica = cluster.nodes[1].group(group).expect("hosted");
            if replica.view() > 0 && left_view_0[group as usize].is_none() {
                left_view_0[group as usize] = Some(tick);
            }
        }
    }
    // Per-group timeout jitter: the groups did not all time out in the same tick.
    let start_ticks: std::collections::BTreeSet<u64> = left_view_0.iter().flatten().copied().collect();
    assert!(
        start_ticks.len() >= 10,
        "view changes started in only {} distinct ticks: {start_ticks:?}",
        start_ticks.len()
    );
    for node in &cluster.nodes[1..] {
        for group in 0..GROUPS {
            let replica = node.group(group).expect("hosted");
            assert_eq!(replica.status(), Status::Normal, "group {group}");
            assert!(replica.view() >= 1);
            assert!(!replica.config().replica.eq(&0));
        }
    }
    // Every group changed view and persisted it at least twice (the view, then the log
    // view), yet each node wrote its durable state in whole-node batches, one per round of
    // work, never one per group: the jitter spreads the view changes over a few dozen ticks,
    // and each batch still carries many groups.
    let written: usize = cluster.durable_batches.iter().sum();
    assert!(
        written >= 2 * 2 * GROUPS as usize,
        "{written} durable states written"
    );
    assert!(
        cluster.durable_batches.len() * 10 <= written,
        "{} batches for {written} durable states: {:?}",
        cluster.durable_batches.len(),
        cluster.durable_batches
    );
}
