//! Normal operation over a perfect in-process network: requests commit in order on every
//! replica, replies come only from the primary, retries are answered without re-executing.

use cairn_vsr::constants::{OPERATION_REGISTER, OPERATION_SESSION_EVICTED};
use cairn_vsr::header::{Command, Header, Message};
use cairn_vsr::replica::{Config, Destination, Output, Replica, StateMachine, Status};
use std::collections::VecDeque;
use std::sync::Arc;

const CLUSTER: u128 = 0xC1;
const GROUP: u64 = 3;

/// Records every applied op; replies with the count so far.
#[derive(Default, Debug, PartialEq, Eq)]
struct Recorder {
    applied: Vec<(u64, Vec<u8>)>,
}

impl StateMachine for Recorder {
    fn apply(&mut self, op: u64, _timestamp: u64, _operation: u8, input: &[u8]) -> Vec<u8> {
        self.applied.push((op, input.to_vec()));
        (self.applied.len() as u64).to_le_bytes().to_vec()
    }
}

struct Cluster {
    replicas: Vec<Replica<Recorder>>,
    network: VecDeque<(u8, Message)>,
    writes: VecDeque<(u8, u64, u128)>,
    replies: Vec<Message>,
}

impl Cluster {
    fn new(replica_count: u8) -> Cluster {
        let replicas = (0..replica_count)
            .map(|replica| {
                let config = Config {
                    cluster: CLUSTER,
                    group: GROUP,
                    replica,
                    replica_count,
                };
                Replica::new(config, Recorder::default())
            })
            .collect();
        Cluster {
            replicas,
            network: VecDeque::new(),
            writes: VecDeque::new(),
            replies: Vec::new(),
        }
    }

    fn collect(&mut self) {
        for (index, replica) in self.replicas.iter_mut().enumerate() {
            for output in replica.take_outputs() {
                match output {
                    Output::Send {
                        to: Destination::Replica(to),
                        message,
                    } => self.network.push_back((to, message)),
                    Output::Send {
                        to: Destination::Client(_),
                        message,
                    } => {
                        assert_eq!(message.header.replica, 0, "only the primary of view 0 replies");
                        self.replies.push(message);
                    }
                    Output::WritePrepare { message } => {
                        self.writes
                            .push_back((index as u8, message.header.op, message.header.checksum));
                    }
                }
            }
        }
    }

    /// Deliver messages and complete writes until nothing is left.
    fn settle(&mut self) {
        for _ in 0..10_000 {
            self.collect();
            if let Some((to, message)) = self.network.pop_front() {
                self.replicas[usize::from(to)].on_message(&message);
            } else if let Some((replica, op, checksum)) = self.writes.pop_front() {
                self.replicas[usize::from(replica)].on_prepare_written(op, checksum);
            } else {
                return;
            }
        }
        panic!("the cluster did not settle");
    }

    fn tick(&mut self, ticks: u64) {
        for _ in 0..ticks {
            for replica in &mut self.replicas {
                replica.on_tick();
            }
            self.settle();
        }
    }

    fn request(&mut self, client: u128, session: u64, request: u64, operation: u8, body: &[u8]) {
        let mut header = Header::new(Command::Request, CLUSTER);
        header.group = GROUP;
        header.client = client;
        header.request = request;
        header.operation = operation;
        header.context = u128::from(session);
        self.replicas[0].on_message(&Message::new(header, Arc::from(body)));
        self.settle();
    }

    fn last_reply(&self) -> &Header {
        &self.replies.last().expect("a reply").header
    }
}

fn normal_operation(replica_count: u8) {
    let mut cluster = Cluster::new(replica_count);
    cluster.request(9, 0, 0, OPERATION_REGISTER, b"");
    let session = cluster.last_reply().op;
    assert_eq!(session, 1);
    for request in 1..=40u64 {
        cluster.request(9, session, request, 1, &request.to_le_bytes());
        let reply = cluster.replies.last().expect("a reply");
        assert_eq!(reply.header.request, request);
        assert_eq!(reply.header.op, request + 1);
        assert_eq!(&reply.body[..], &request.to_le_bytes()[..], "applied once each");
    }
    // Backups learn the last commit from the heartbeat.
    cluster.tick(20);
    for replica in &cluster.replicas {
        assert_eq!(replica.status(), Status::Normal);
        assert_eq!(replica.commit_min(), 41, "replica {}", replica.config().replica);
        assert_eq!(replica.state_machine(), cluster.replicas[0].state_machine());
        for op in 1..=41 {
            assert_eq!(
                replica.committed_header(op),
                cluster.replicas[0].committed_header(op)
            );
        }
    }
    // A retry of the last request is answered from the client table, not executed again.
    let replies = cluster.replies.len();
    cluster.request(9, session, 40, 1, &40u64.to_le_bytes());
    assert_eq!(cluster.replies.len(), replies + 1);
    assert_eq!(cluster.last_reply().op, 41);
    assert_eq!(cluster.replicas[0].state_machine().applied.len(), 40);
    // A client that never registered is told to register.
    cluster.request(10, 77, 1, 1, b"x");
    assert_eq!(cluster.last_reply().operation, OPERATION_SESSION_EVICTED);
    assert_eq!(cluster.replicas[0].commit_min(), 41);
}

#[test]
fn normal_operation_with_three_replicas() {
    normal_operation(3);
}

#[test]
fn normal_operation_with_five_replicas() {
    normal_operation(5);
}

#[test]
fn a_lost_acknowledgement_is_recovered_by_retransmission() {
    let mut cluster = Cluster::new(3);
    cluster.request(9, 0, 0, OPERATION_REGISTER, b"");
    // Drop every message to and from replica 2, and replica 1's acknowledgements: nothing
    // can commit.
    let mut header = Header::new(Command::Request, CLUSTER);
    header.group = GROUP;
    header.client = 9;
    header.request = 1;
    header.operation = 1;
    header.context = 1;
    cluster.replicas[0].on_message(&Message::new(header, Arc::from(&b"one"[..])));
    cluster.collect();
    cluster.network.clear();
    while let Some((replica, op, checksum)) = cluster.writes.pop_front() {
        cluster.replicas[usize::from(replica)].on_prepare_written(op, checksum);
    }
    cluster.collect();
    cluster.network.clear();
    assert_eq!(cluster.replicas[0].commit_max(), 1);
    // The primary resends the prepare on its timeout; the backups acknowledge; it commits.
    cluster.tick(10);
    assert_eq!(cluster.replicas[0].commit_max(), 2);
    assert_eq!(cluster.last_reply().request, 1);
}
