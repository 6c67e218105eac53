//! Replica scenarios over an in-process network the test controls message by message:
//! normal operation with 3 and 5 replicas, a primary crash mid-pipeline, a new primary that
//! lacks the newest committed op, and a partitioned old primary. Writes (journal and durable
//! state) complete when the test delivers them, so "durable" means what the replica was told.

use bytes::Bytes;
use cairn_vsr::constants::{OPERATION_REGISTER, OPERATION_SESSION_EVICTED};
use cairn_vsr::header::{Command, Header, Message};
use cairn_vsr::replica::{Bugs, Config, Destination, Output, Replica, StateMachine, Status};
use std::collections::VecDeque;

const CLUSTER: u128 = 0xC1;
const GROUP: u64 = 3;
const CLIENT: u128 = 9;

/// Records every applied op; replies with the input.
#[derive(Default, Debug, PartialEq, Eq)]
struct Recorder {
    applied: Vec<(u64, Vec<u8>)>,
}

impl StateMachine for Recorder {
    fn apply(&mut self, op: u64, _timestamp: u64, _operation: u8, input: &[u8]) -> Vec<u8> {
        self.applied.push((op, input.to_vec()));
        input.to_vec()
    }

    /// Each applied op as `op u64, length u32, input`.
    fn snapshot(&self) -> Vec<u8> {
        let mut bytes = Vec::new();
        for (op, input) in &self.applied {
            bytes.extend_from_slice(&op.to_le_bytes());
            bytes.extend_from_slice(&(input.len() as u32).to_le_bytes());
            bytes.extend_from_slice(input);
        }
        bytes
    }

    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String> {
        let mut applied = Vec::new();
        let mut rest = snapshot;
        while !rest.is_empty() {
            let (op, after) = rest.split_at_checked(8).ok_or("short op")?;
            let (len, after) = after.split_at_checked(4).ok_or("short length")?;
            let len = u32::from_le_bytes(len.try_into().map_err(|_| "length")?) as usize;
            let (input, after) = after.split_at_checked(len).ok_or("short input")?;
            applied.push((
                u64::from_le_bytes(op.try_into().map_err(|_| "op")?),
                input.to_vec(),
            ));
            rest = after;
        }
        self.applied = applied;
        Ok(())
    }
}

enum Work {
    Deliver {
        to: u8,
        message: Message,
    },
    Written {
        replica: u8,
        op: u64,
        checksum: u128,
    },
    Durable {
        replica: u8,
        state: cairn_vsr::durable::DurableState,
    },
    CheckpointWritten {
        replica: u8,
        op: u64,
        checksum: u128,
    },
    Read {
        replica: u8,
        op: u64,
        checksum: u128,
        for_replica: Option<u8>,
    },
}

struct Cluster {
    replicas: Vec<Replica<Recorder>>,
    work: VecDeque<Work>,
    replies: Vec<Message>,
    /// Per replica: the prepares its journal holds, by op (what a read-back finds).
    journals: Vec<std::collections::BTreeMap<u64, Message>>,
    /// A crashed replica takes no input and its in-flight work is lost.
    crashed: Vec<bool>,
    /// `cut[a][b]`: messages from a to b are dropped.
    cut: Vec<Vec<bool>>,
    /// Per replica: drop every StartView sent to it.
    lose_start_views: Vec<bool>,
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
                    shape: cairn_vsr::constants::Shape::METADATA,
                    bugs: Bugs::default(),
                };
                Replica::new(config, Recorder::default())
            })
            .collect();
        let n = usize::from(replica_count);
        Cluster {
            replicas,
            work: VecDeque::new(),
            replies: Vec::new(),
            journals: vec![Default::default(); n],
            crashed: vec![false; n],
            cut: vec![vec![false; n]; n],
            lose_start_views: vec![false; n],
        }
    }

    fn collect(&mut self) {
        for index in 0..self.replicas.len() {
            let from = index as u8;
            for output in self.replicas[index].take_outputs() {
                match output {
                    Output::Send {
                        to: Destination::Replica(to),
                        message,
                    } => {
                        let to_index = usize::from(to);
                        if message.header.command == Command::StartView && self.lose_start_views[to_index] {
                            continue;
                        }
                        if !self.cut[index][to_index] {
                            self.work.push_back(Work::Deliver { to, message });
                        }
                    }
                    Output::Send {
                        to: Destination::Client(_),
                        message,
                    } => self.replies.push(message),
                    Output::WritePrepare { message } => {
                        self.work.push_back(Work::Written {
                            replica: from,
                            op: message.header.op,
                            checksum: message.header.checksum,
                        });
                        self.journals[index].insert(message.header.op, message);
                    }
                    Output::ReadPrepare {
                        op,
                        checksum,
                        for_replica,
                    } => self.work.push_back(Work::Read {
                        replica: from,
                        op,
                        checksum,
                        for_replica,
                    }),
                    Output::WriteDurable { state } => {
                        self.work.push_back(Work::Durable { replica: from, state })
                    }
                    Output::WriteCheckpoint { op, checksum, .. } => {
                        self.work.push_back(Work::CheckpointWritten {
                            replica: from,
                            op,
                            checksum,
                        })
                    }
                    // These scenarios never fall behind the journal; the simulator's disks
                    // and `tests/simulator.rs` cover state transfer.
                    Output::StateTransfer { .. } => {}
                }
            }
        }
    }

    /// Run queued work until nothing is left.
    fn settle(&mut self) {
        for _ in 0..100_000 {
            self.collect();
            let Some(work) = self.work.pop_front() else {
                return;
            };
            match work {
                Work::Deliver { to, message } => {
                    if !self.crashed[usize::from(to)] {
                        self.replicas[usize::from(to)].on_message(message.clone());
                    }
                }
                Work::Written {
                    replica,
                    op,
                    checksum,
                } => {
                    if !self.crashed[usize::from(replica)] {
                        self.replicas[usize::from(replica)].on_prepare_written(op, checksum);
                    }
                }
                Work::Durable { replica, state } => {
                    if !self.crashed[usize::from(replica)] {
                        self.replicas[usize::from(replica)].on_durable_written(state);
                    }
                }
                Work::CheckpointWritten {
                    replica,
                    op,
                    checksum,
                } => {
                    if !self.crashed[usize::from(replica)] {
                        self.replicas[usize::from(replica)].on_checkpoint_written(op, checksum);
                    }
                }
                Work::Read {
                    replica,
                    op,
                    checksum,
                    for_replica,
                } => {
                    let index = usize::from(replica);
                    if !self.crashed[index] {
                        let prepare = self.journals[index]
                            .get(&op)
                            .filter(|prepare| prepare.header.checksum == checksum)
                            .cloned();
                        self.replicas[index].on_prepare_read(op, checksum, prepare, for_replica);
                    }
                }
            }
        }
        panic!("the cluster did not settle");
    }

    fn tick(&mut self, ticks: u64) {
        for _ in 0..ticks {
            for (index, replica) in self.replicas.iter_mut().enumerate() {
                if !self.crashed[index] {
                    replica.on_tick();
                }
            }
            self.settle();
        }
    }

    fn isolate(&mut self, replica: usize) {
        for other in 0..self.replicas.len() {
            if other != replica {
                self.cut[replica][other] = true;
                self.cut[other][replica] = true;
            }
        }
    }

    fn heal(&mut self) {
        for row in &mut self.cut {
            row.fill(false);
        }
    }

    fn request_message(request: u64, operation: u8, session: u64, body: &[u8]) -> Message {
        let mut header = Header::new(Command::Request, CLUSTER);
        header.group = GROUP;
        header.client = CLIENT;
        header.request = request;
        header.operation = operation;
        header.context = u128::from(session);
        Message::new(header, Bytes::copy_from_slice(body))
    }

    /// Send the request to every live replica (only the primary acts on it).
    fn request(&mut self, request: u64, operation: u8, session: u64, body: &[u8]) {
        let message = Cluster::request_message(request, operation, session, body);
        for index in 0..self.replicas.len() {
            if !self.crashed[index] {
                self.replicas[index].on_message(message.clone());
            }
        }
        self.settle();
    }

    fn reply_for(&self, request: u64) -> Option<&Message> {
        self.replies
            .iter()
            .rev()
            .find(|reply| reply.header.request == request && reply.header.client == CLIENT)
    }

    fn register(&mut self) -> u64 {
        self.request(0, OPERATION_REGISTER, 0, b"");
        self.reply_for(0).expect("registered").header.op
    }

    /// The live primary in status normal of the highest view (an isolated old primary may
    /// still think it is one).
    fn primary(&self) -> usize {
        (0..self.replicas.len())
            .filter(|&index| {
                !self.crashed[index]
                    && self.replicas[index].status() == Status::Normal
                    && self.replicas[index].is_primary()
            })
            .max_by_key(|&index| self.replicas[index].view())
            .expect("a normal primary")
    }

    /// Every live replica has applied the same ops, with the same checksums, up to its
    /// commit point.
    fn assert_agree(&self) {
        let reference = self
            .replicas
            .iter()
            .enumerate()
            .filter(|(index, _)| !self.crashed[*index])
            .max_by_key(|(_, replica)| replica.commit_min())
            .map(|(_, replica)| replica)
            .expect("a live replica");
        for (index, replica) in self.replicas.iter().enumerate() {
            if self.crashed[index] {
                continue;
            }
            for op in 1..=replica.commit_min() {
                assert_eq!(
                    replica.committed_header(op).map(|h| h.checksum),
                    reference.committed_header(op).map(|h| h.checksum),
                    "replica {index} op {op}"
                );
            }
        }
    }
}

fn normal_operation(replica_count: u8) {
    let mut cluster = Cluster::new(replica_count);
    let session = cluster.register();
    assert_eq!(session, 1);
    for request in 1..=40u64 {
        cluster.request(request, 1, session, &request.to_le_bytes());
        let reply = cluster.reply_for(request).expect("a reply");
        assert_eq!(reply.header.op, request + 1);
        assert_eq!(reply.header.replica, 0, "only the primary replies");
        assert_eq!(&reply.body[..], &request.to_le_bytes()[..]);
    }
    // Backups learn the last commit from the heartbeat.
    cluster.tick(20);
    for replica in &cluster.replicas {
        assert_eq!(replica.status(), Status::Normal);
        assert_eq!(replica.commit_min(), 41, "replica {}", replica.config().replica);
        assert_eq!(replica.state_machine(), cluster.replicas[0].state_machine());
    }
    cluster.assert_agree();
    // A retry of the last request is answered from the client table, not executed again.
    let replies = cluster.replies.len();
    cluster.request(40, 1, session, &40u64.to_le_bytes());
    assert_eq!(cluster.replies.len(), replies + 1);
    assert_eq!(cluster.replicas[0].state_machine().applied.len(), 40);
    // A client that never registered is told to register (session 5 is an op this primary
    // applied, and it was no register of client 10). A session beyond what the primary
    // applied gets no answer: the primary may be the one behind.
    let mut header = Header::new(Command::Request, CLUSTER);
    header.group = GROUP;
    header.client = 10;
    header.request = 1;
    header.operation = 1;
    header.context = 77;
    let replies = cluster.replies.len();
    cluster.replicas[0].on_message(Message::new(header, Bytes::from_static(b"x")));
    cluster.settle();
    assert_eq!(
        cluster.replies.len(),
        replies,
        "no answer from a primary that may be behind"
    );
    header.context = 5;
    cluster.replicas[0].on_message(Message::new(header, Bytes::from_static(b"x")));
    cluster.settle();
    assert_eq!(
        cluster.replies.last().expect("a reply").header.operation,
        OPERATION_SESSION_EVICTED
    );
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

/// A backup that missed the last prepares while the primary committed them with the other
/// backup catches up although no prepare follows: the primary's heartbeat names its last
/// committed op and checksum, the backup asks for that prepare, takes it as its head and
/// repairs the ops below from the chain.
#[test]
fn a_backup_behind_an_idle_primary_catches_up_from_its_heartbeats() {
    let mut cluster = Cluster::new(3);
    let session = cluster.register();
    cluster.cut[0][2] = true;
    for request in 1..=3 {
        cluster.request(request, 1, session, format!("op {request}").as_bytes());
    }
    let committed = cluster.replicas[0].commit_min();
    assert!(cluster.reply_for(3).is_some(), "committed with backup 1");
    assert!(
        cluster.replicas[2].op() < committed,
        "backup 2 missed the prepares"
    );
    cluster.heal();
    // No request follows: only heartbeats reach backup 2.
    cluster.tick(40);
    assert_eq!(cluster.replicas[2].op(), committed);
    assert_eq!(
        cluster.replicas[2].commit_min(),
        committed,
        "backup 2 applied what was committed"
    );
    cluster.assert_agree();
}

/// A backup asked to lead starts a view change to the next view it is the primary of: the
/// others follow, it becomes the primary with every committed op, and commits new ones.
#[test]
fn a_backup_that_leads_becomes_the_primary_and_keeps_every_commit() {
    let mut cluster = Cluster::new(3);
    let session = cluster.register();
    cluster.request(1, 1, session, b"one");
    assert!(cluster.reply_for(1).is_some());
    assert!(!cluster.replicas[0].lead(), "the primary does not lead again");
    assert!(cluster.replicas[2].lead());
    cluster.settle();
    cluster.tick(5);
    assert_eq!(cluster.primary(), 2);
    assert_eq!(cluster.replicas[2].view(), 2);
    cluster.request(2, 1, session, b"two");
    assert_eq!(
        cluster
            .reply_for(2)
            .expect("committed by the new primary")
            .header
            .op,
        3
    );
    cluster.assert_agree();
}

#[test]
fn a_lost_acknowledgement_is_recovered_by_retransmission() {
    let mut cluster = Cluster::new(3);
    let session = cluster.register();
    // Every prepare of the next request is lost.
    cluster.isolate(0);
    cluster.request(1, 1, session, b"one");
    assert!(cluster.reply_for(1).is_none());
    cluster.heal();
    cluster.tick(10);
    assert_eq!(
        cluster
            .reply_for(1)
            .expect("committed after the retransmission")
            .header
            .op,
        2
    );
}

#[test]
fn a_primary_crash_mid_pipeline_elects_a_new_primary_that_keeps_every_commit() {
    let mut cluster = Cluster::new(3);
    let session = cluster.register();
    for request in 1..=5 {
        cluster.request(request, 1, session, b"committed");
    }
    // Three more reach the backups as prepares, but the primary dies before any commit
    // reply: hold the backups' acknowledgements back by cutting backup -> primary.
    cluster.cut[1][0] = true;
    cluster.cut[2][0] = true;
    for request in 6..=8 {
        cluster.request(request, 1, session, b"in flight");
    }
    assert!(cluster.reply_for(6).is_none());
    cluster.crashed[0] = true;
    cluster.heal();
    cluster.tick(300);
    let primary = cluster.primary();
    assert_ne!(primary, 0);
    assert!(cluster.replicas[primary].view() >= 1);
    // The client retries the in-flight requests at the new primary: they commit once each.
    for request in 6..=8 {
        cluster.request(request, 1, session, b"in flight");
        assert!(cluster.reply_for(request).is_some(), "request {request}");
    }
    cluster.request(9, 1, session, b"after");
    let reply = cluster.reply_for(9).expect("the new primary serves");
    assert_eq!(reply.header.op, 10, "ops 1..=9 all kept, none doubled");
    cluster.tick(30);
    cluster.assert_agree();
    let applied = &cluster.replicas[primary].state_machine().applied;
    assert_eq!(applied.len(), 9, "each request applied exactly once: {applied:?}");
}

#[test]
fn a_new_primary_missing_the_newest_committed_op_recovers_it_in_the_view_change() {
    let mut cluster = Cluster::new(3);
    let session = cluster.register();
    cluster.request(1, 1, session, b"first");
    // Replica 1 (the next primary) hears nothing more; op 3 commits on replicas 0 and 2.
    cluster.isolate(1);
    cluster.request(2, 1, session, b"committed without replica 1");
    let committed = cluster.reply_for(2).expect("committed by 0 and 2").header;
    assert_eq!(committed.op, 3);
    cluster.crashed[0] = true;
    cluster.heal();
    cluster.tick(300);
    let primary = cluster.primary();
    assert_eq!(primary, 1, "view 1's primary");
    cluster.request(3, 1, session, b"after");
    assert_eq!(cluster.reply_for(3).expect("served").header.op, 4);
    cluster.tick(30);
    cluster.assert_agree();
    assert_eq!(
        cluster.replicas[1].committed_header(3).map(|h| h.checksum),
        Some(committed.context),
        "the op committed in view 0 survived into view 1 unchanged"
    );
}

/// A backup that voted for a view but lost its StartView stays in view-change status while
/// the view runs. Hearing the view's primary heartbeat, it asks for the StartView and joins
/// the view within a heartbeat, instead of timing out into the next view.
#[test]
fn a_replica_that_lost_its_start_view_asks_the_primary_of_its_view_for_it() {
    let mut cluster = Cluster::new(3);
    let session = cluster.register();
    cluster.request(1, 1, session, b"before");
    cluster.lose_start_views[2] = true;
    cluster.crashed[0] = true;
    let mut ticks = 0;
    while cluster.replicas[1].status() != Status::Normal || !cluster.replicas[1].is_primary() {
        cluster.tick(1);
        ticks += 1;
        assert!(ticks < 1_000, "replica 1 leads view 1");
    }
    assert_eq!(cluster.replicas[1].view(), 1);
    assert_eq!(
        cluster.replicas[2].status(),
        Status::ViewChange,
        "its StartView was lost"
    );
    assert_eq!(cluster.replicas[2].view(), 1);
    cluster.lose_start_views[2] = false;
    // Two heartbeats: far below the view change's timeout (100 ticks).
    cluster.tick(25);
    assert_eq!(cluster.replicas[2].status(), Status::Normal);
    assert_eq!(
        cluster.replicas[2].view(),
        1,
        "the view it voted for, no further view change"
    );
    assert_eq!(cluster.replicas[1].view(), 1);
    cluster.request(2, 1, session, b"after");
    assert_eq!(cluster.reply_for(2).expect("served").header.op, 3);
    cluster.tick(15);
    assert_eq!(cluster.replicas[2].commit_min(), 3, "it follows the view");
}

#[test]
fn a_partitioned_old_primary_commits_nothing_and_rejoins() {
    let mut cluster = Cluster::new(3);
    let session = cluster.register();
    cluster.request(1, 1, session, b"before");
    cluster.isolate(0);
    // The old primary still takes requests but can never reach a quorum.
    cluster.replicas[0].on_message(Cluster::request_message(2, 1, session, b"lost"));
    cluster.tick(300);
    assert_eq!(
        cluster.replicas[0].commit_max(),
        2,
        "nothing committed while isolated"
    );
    assert!(cluster.reply_for(2).is_none());
    // The others elected a primary and serve.
    let primary = cluster.primary();
    assert_ne!(primary, 0);
    cluster.request(2, 1, session, b"served");
    assert_eq!(cluster.reply_for(2).expect("served").header.op, 3);
    // After the partition heals, the old primary learns the new view and its log.
    cluster.heal();
    cluster.tick(100);
    assert_eq!(cluster.replicas[0].status(), Status::Normal);
    assert!(!cluster.replicas[0].is_primary());
    assert_eq!(cluster.replicas[0].commit_min(), 3);
    cluster.assert_agree();
    assert_eq!(
        cluster.replicas[0].committed_header(3).map(|h| h.checksum),
        cluster.replicas[primary].committed_header(3).map(|h| h.checksum),
        "the isolated primary's own op 3 was replaced by the committed one"
    );
}
