//! State transfer between nodes: how a replica with peers that fell behind every peer's
//! journal fetches a peer's durable checkpoint, and with it, for a journal that moves its
//! log (a partition's segments), the log up to that checkpoint (`docs/replication.md`,
//! "State transfer between nodes").
//!
//! The core asks with [`Output::StateTransfer`](cairn_vsr::replica::Output) and takes the
//! result through `Replica::on_state_transferred`; everything in between is this shell's,
//! over the replica network, with four commands the core never sees:
//!
//! ```text
//! target                                   source (one peer at a time)
//!   RequestCheckpoint {above op, commit_max, nonce}  →
//!                                          ←  CheckpointOffer {checkpoint bytes, offer}
//!   (the journal checks the offer against the checkpoint and its own state, stages)
//!   RequestChunk {segment, position, len}   →       (paced: TransferPace)
//!                                          ←  Chunk {bytes, XXH3-64 as read}
//!   ... until the staging is complete; it is verified whole, then the core takes the
//!   checkpoint, and the superblock write naming it makes the staged log live.
//! ```
//!
//! A source answers only with its durable checkpoint above what the target applied, and only
//! when its `commit_max` is at least the target's (never state from a replica that knows
//! less). A transfer whose peer stops answering is dropped; the core's next ask goes to the
//! next peer. Nothing a peer sends is trusted: the checkpoint verifies against its checksum,
//! the offer against the checkpoint, every chunk against its checksum, and the staged log is
//! opened and verified whole before the core sees it.

use super::{GroupError, GroupJournal, LocalGroup, NamedCheckpoint, named_checkpoint};
use bytes::Bytes;
use cairn_storage::transfer::{CheckpointId, ChunkRequest, TransferChunk};
use cairn_vsr::checkpoint::Checkpoint;
use cairn_vsr::constants::HEADER_SIZE;
use cairn_vsr::header::{Command, Header, Message};
use cairn_vsr::replica::{StateMachine, Status, TransferredLog};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a transfer waits for its peer's next answer before it is dropped (the core asks
/// again, of the next peer).
const SILENCE_MAX: Duration = Duration::from_secs(5);

/// Bytes asked of a peer at once.
pub const CHUNK_BYTES: u64 = 1 << 20;

/// How long a chunk asked for may go unanswered before it is asked again (a message the
/// replica network dropped under load), within [`SILENCE_MAX`].
const CHUNK_RESEND: Duration = Duration::from_secs(1);

/// The largest transfer message: what the replica network carries (a partition's message),
/// whatever the group's shape (a metadata checkpoint fills its own shape's message).
const MESSAGE_BYTES_MAX: usize = cairn_vsr::constants::Shape::PARTITION.message_size_max;

/// Progress of a long transfer is logged at most this often.
const LOG_EVERY: Duration = Duration::from_secs(2);

/// The node-wide pace of incoming state transfers: a bucket of bytes refilled at
/// `cluster.transfer_bytes_per_second`, shared by every group of the node, so a rejoining
/// node's transfers leave room for client traffic.
pub struct TransferPace {
    bytes_per_second: u64,
    /// Bytes that may be asked for now (negative: asked ahead of the pace), and when that
    /// was last brought up to date.
    bucket: Mutex<(f64, Instant)>,
}

impl TransferPace {
    pub fn new(bytes_per_second: u64) -> TransferPace {
        TransferPace {
            bytes_per_second: bytes_per_second.max(1),
            bucket: Mutex::new((0.0, Instant::now())),
        }
    }

    /// Whether `bytes` may be asked for at `now`. The bucket holds at most a quarter second
    /// of the pace (at least one chunk); a chunk may be asked while it is not empty, taking
    /// it below zero, so any pace moves every chunk.
    pub fn try_take(&self, bytes: u64, now: Instant) -> bool {
        let mut bucket = self
            .bucket
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let (tokens, refilled) = &mut *bucket;
        let capacity = (self.bytes_per_second as f64 / 4.0).max(CHUNK_BYTES as f64);
        let elapsed = now.saturating_duration_since(*refilled).as_secs_f64();
        *tokens = (*tokens + elapsed * self.bytes_per_second as f64).min(capacity);
        *refilled = now.max(*refilled);
        if *tokens < 0.0 {
            return false;
        }
        *tokens -= bytes as f64;
        true
    }
}

/// A state transfer this replica runs.
pub(super) struct Transfer {
    /// Names this transfer's messages: an answer to an earlier one is dropped.
    nonce: u128,
    /// The replica asked.
    peer: u8,
    /// What the core asked for: a checkpoint above `above_op` from a peer whose `commit_max`
    /// is at least `commit_max`.
    above_op: u64,
    commit_max: u64,
    /// The checkpoint offered (its bytes, checksum and op), once the offer was staged.
    checkpoint: Option<(Vec<u8>, u128, u64)>,
    /// The chunk asked for and not answered yet, and when it was last asked.
    asked: Option<(ChunkRequest, Instant)>,
    /// The last answer from the peer (or the first ask).
    heard_at: Instant,
    started: Instant,
    logged_at: Instant,
    bytes_total: u64,
    bytes_done: u64,
    /// Every chunk is staged; the journal verifies the staging whole on a thread of its own.
    verifying: bool,
}

/// A transfer in progress, for `cairn status`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TransferProgress {
    /// The replica index of the peer the log comes from.
    pub from_replica: u8,
    /// The checkpoint's op, once offered (0 before).
    pub checkpoint_op: u64,
    pub bytes_done: u64,
    pub bytes_total: u64,
}

impl<S: StateMachine, J: GroupJournal> LocalGroup<S, J> {
    /// Deliver a message from a peer: the transfer commands to this shell, everything else
    /// to the replica.
    pub(super) fn deliver(&mut self, message: Message) {
        match message.header.command {
            Command::RequestCheckpoint => self.answer_checkpoint_request(&message.header),
            Command::CheckpointOffer => self.on_checkpoint_offer(&message),
            Command::RequestChunk => self.answer_chunk_request(&message.header),
            Command::Chunk => self.on_chunk(message),
            _ => self.replica.on_message(message),
        }
    }

    /// The core asked for a state transfer: ask the next peer for its checkpoint, unless a
    /// transfer is under way (a silent one is dropped first).
    pub(super) fn start_transfer(&mut self, above_op: u64, commit_max: u64) {
        let Some(peers) = self.peers.clone() else {
            return;
        };
        let now = self.now();
        self.continue_transfer(now);
        if self.transfer.is_some() || self.install_pending.is_some() || peers.replica_count < 2 {
            return;
        }
        let me = peers.replica;
        let peer = (1..peers.replica_count)
            .map(|step| (me + self.transfer_turn + step) % peers.replica_count)
            .find(|&peer| peer != me)
            .unwrap_or(me);
        self.transfer_turn = self.transfer_turn.wrapping_add(1) % peers.replica_count;
        let nonce = rand::random::<u128>() | 1;
        if !self.transfer_wanted {
            self.transfer_wanted = true;
            tracing::info!(
                dir = %self.files.dir.display(),
                above_op,
                commit_max,
                peer,
                "this replica fell behind what its peers' journals hold: it fetches a peer's checkpoint (state transfer)"
            );
        }
        let message = self.transfer_message(Command::RequestCheckpoint, Vec::new(), |header| {
            header.op = above_op;
            header.commit = commit_max;
            header.nonce = nonce;
        });
        peers.transport.send(peer, message);
        self.transfer = Some(Transfer {
            nonce,
            peer,
            above_op,
            commit_max,
            checkpoint: None,
            asked: None,
            heard_at: now,
            started: now,
            logged_at: now,
            bytes_total: 0,
            bytes_done: 0,
            verifying: false,
        });
    }

    /// The transfer's progress, if one runs.
    pub(super) fn transfer_progress(&self) -> Option<TransferProgress> {
        self.transfer.as_ref().map(|transfer| TransferProgress {
            from_replica: transfer.peer,
            checkpoint_op: transfer.checkpoint.as_ref().map_or(0, |(_, _, op)| *op),
            bytes_done: transfer.bytes_done,
            bytes_total: transfer.bytes_total,
        })
    }

    /// Move the transfer on at `now`: drop it if its peer fell silent, ask for the next chunk
    /// when the pace allows, or finish it once the staging is complete. Run whenever the
    /// group is served.
    pub(super) fn continue_transfer(&mut self, now: Instant) {
        let Some(transfer) = &self.transfer else {
            if self.transfer_wanted
                && self.replica.status() == Status::Normal
                && self.replica.commit_min() >= self.replica.commit_max()
            {
                // Caught up by repairs after all (a peer's journal held what it missed).
                self.transfer_wanted = false;
            }
            return;
        };
        if transfer.verifying {
            // Whatever happened meanwhile (the replica may have caught up on its own) is
            // decided once the verification ends: waiting for it here would hold this worker.
            match self.journal.stage_verified() {
                None => {}
                Some(Ok(())) => self.finish_transfer(),
                Some(Err(reason)) => {
                    let peer = transfer.peer;
                    tracing::warn!(dir = %self.files.dir.display(), peer, %reason, "the log a state transfer brought failed verification whole (or could not be read back); discarded it (the next try asks another peer)");
                    self.drop_transfer();
                }
            }
            return;
        }
        if transfer
            .checkpoint
            .as_ref()
            .is_some_and(|(_, _, op)| *op <= self.replica.commit_min())
        {
            // The replica reached the checkpoint's op on its own: the transfer cannot be
            // installed any more.
            tracing::info!(dir = %self.files.dir.display(), "a state transfer is not needed any more (the replica caught up by repairs); dropped it");
            self.drop_transfer();
            return;
        }
        let waiting_for_peer = transfer.checkpoint.is_none() || transfer.asked.is_some();
        if waiting_for_peer && now.saturating_duration_since(transfer.heard_at) > SILENCE_MAX {
            tracing::warn!(
                dir = %self.files.dir.display(),
                peer = transfer.peer,
                bytes_done = transfer.bytes_done,
                "the peer stopped answering a state transfer; dropped it (the next try asks another peer)"
            );
            self.drop_transfer();
            return;
        }
        let peer = transfer.peer;
        let nonce = transfer.nonce;
        if let Some((request, asked_at)) = transfer.asked {
            if now.saturating_duration_since(asked_at) >= CHUNK_RESEND {
                // Asked again, not dropped: one message lost under load must not throw
                // away what was staged.
                self.ask_chunk(peer, nonce, request, now);
            }
            return;
        }
        if waiting_for_peer {
            return;
        }
        match self.journal.stage_next() {
            Some(request) => {
                let request = ChunkRequest {
                    len_bytes: request.len_bytes.min(CHUNK_BYTES),
                    ..request
                };
                let Some(peers) = self.peers.clone() else {
                    return;
                };
                if !peers.transfer_pace.try_take(request.len_bytes, now) {
                    // The next serve of the group asks again.
                    return;
                }
                if let Some(transfer) = &mut self.transfer {
                    transfer.heard_at = now;
                }
                self.ask_chunk(peer, nonce, request, now);
            }
            None => self.verify_staging(),
        }
    }

    /// Every chunk is staged: start verifying the staging whole, off this thread; the
    /// transfer finishes once that is done ([`LocalGroup::continue_transfer`]).
    fn verify_staging(&mut self) {
        match self.journal.stage_verify() {
            Ok(()) => {
                if let Some(transfer) = &mut self.transfer {
                    transfer.verifying = true;
                }
            }
            Err(reason) => {
                let peer = self.transfer.as_ref().map(|transfer| transfer.peer);
                tracing::warn!(dir = %self.files.dir.display(), ?peer, %reason, "the log a state transfer brought could not be verified; discarded it (the next try asks another peer)");
                self.drop_transfer();
            }
        }
    }

    /// Ask `peer` for the chunk `request` of transfer `nonce`.
    fn ask_chunk(&mut self, peer: u8, nonce: u128, request: ChunkRequest, now: Instant) {
        let Some(peers) = self.peers.clone() else {
            return;
        };
        let message = self.transfer_message(Command::RequestChunk, Vec::new(), |header| {
            header.op = request.segment_first_op;
            header.commit = request.position_bytes;
            header.request = request.len_bytes;
            header.nonce = nonce;
        });
        peers.transport.send(peer, message);
        if let Some(transfer) = &mut self.transfer {
            transfer.asked = Some((request, now));
        }
    }

    /// Hand the staged log's checkpoint (verified whole) to the core; the superblock write
    /// naming it makes the log live (`install_pending`).
    fn finish_transfer(&mut self) {
        let Some(transfer) = self.transfer.take() else {
            return;
        };
        let Some((bytes, checksum, op)) = transfer.checkpoint else {
            return;
        };
        let dir = self.files.dir.display().to_string();
        let prepare_checksum = Checkpoint::decode(
            &bytes,
            J::SHAPE.checkpoint_size_max(),
            checksum,
            self.cluster,
            self.replica.config().group,
        )
        .map_or(0, |checkpoint| checkpoint.header.checksum);
        if self.journal.holds_prepare_durably(op, prepare_checksum) {
            // Repairs wrote the checkpoint's op while the log was fetched: the journal keeps
            // its own log (it may hold ops above the checkpoint this replica acknowledged),
            // as the simulator decides at the install.
            self.abandon_staging();
            let installed = self
                .replica
                .on_state_transferred(&bytes, checksum, TransferredLog::Kept);
            if installed {
                self.transfer_wanted = false;
                tracing::info!(%dir, peer = transfer.peer, checkpoint_op = op, "state transfer complete: installed a peer's checkpoint; the journal keeps its log, which reached the checkpoint meanwhile");
            }
            return;
        }
        let installed = self
            .replica
            .on_state_transferred(&bytes, checksum, TransferredLog::Replaced);
        if !installed {
            // The replica reached the checkpoint's op on its own meanwhile, or is busy with a
            // checkpoint of its own: the staging goes before any superblock write.
            self.abandon_staging();
            tracing::info!(%dir, checkpoint_op = op, "a state transfer was not needed any more; discarded what it staged");
            return;
        }
        self.install_pending = Some(NamedCheckpoint {
            id: CheckpointId { op, checksum },
            prepare_checksum,
        });
        self.transfer_wanted = false;
        tracing::info!(
            %dir,
            peer = transfer.peer,
            checkpoint_op = op,
            bytes = transfer.bytes_done,
            took_ms = self.now().saturating_duration_since(transfer.started).as_millis() as u64,
            "state transfer complete: the checkpoint and the log up to it are verified; the log goes live once the superblock names the checkpoint"
        );
    }

    /// Make a staged log live: the superblock now names `state_checkpoint`. Called after the
    /// superblock write and before the replica hears of it (it writes nothing above the
    /// checkpoint until then).
    pub(super) fn commit_install_if_named(
        &mut self,
        state_checkpoint: CheckpointId,
    ) -> Result<(), GroupError> {
        let Some(pending) = self.install_pending else {
            return Ok(());
        };
        if pending.id != state_checkpoint {
            return Ok(());
        }
        self.install_pending = None;
        self.journal.stage_commit(pending)?;
        tracing::info!(
            dir = %self.files.dir.display(),
            checkpoint_op = pending.id.op,
            "the log a state transfer brought is live; the old one was removed"
        );
        Ok(())
    }

    fn drop_transfer(&mut self) {
        if self
            .transfer
            .take()
            .is_some_and(|transfer| transfer.checkpoint.is_some())
        {
            self.abandon_staging();
        }
    }

    /// Remove what was staged. It must be gone before any superblock write (a later
    /// checkpoint of this replica's own at the same op would otherwise roll it forward at
    /// the next open): if that fails, the group stops.
    fn abandon_staging(&mut self) {
        if let Err(reason) = self.journal.stage_abandon() {
            let reason = format!("cannot remove a state transfer's discarded staging: {reason}");
            tracing::error!(dir = %self.files.dir.display(), %reason, "the replicated log stops");
            self.stopped = Some(reason);
        }
    }

    /// A peer asks for this replica's durable checkpoint: offer it if it lies above what
    /// the peer applied and this replica knows at least as much as the peer.
    fn answer_checkpoint_request(&mut self, header: &Header) {
        let Some(peers) = self.peers.clone() else {
            return;
        };
        let state = &self.superblock.0;
        if state.checkpoint_op <= header.op
            || self.replica.commit_max() < header.commit
            || self.install_pending.is_some()
        {
            return;
        }
        let id = CheckpointId {
            op: state.checkpoint_op,
            checksum: state.checkpoint_checksum,
        };
        let group = self.replica.config().group;
        let dir = self.files.dir.display().to_string();
        let (checkpoint, bytes) = match named_checkpoint::<J>(&self.files, state, self.cluster, group) {
            Ok(Some((checkpoint, _, bytes))) => (checkpoint, bytes),
            Ok(None) => return,
            Err(error) => {
                tracing::warn!(%dir, %error, "cannot read this replica's checkpoint for a peer's state transfer");
                return;
            }
        };
        let offer = match self.journal.offer(id, &checkpoint.state_machine) {
            Ok(offer) => offer,
            Err(reason) => {
                tracing::info!(%dir, checkpoint_op = id.op, %reason, "cannot offer this replica's log for a peer's state transfer");
                return;
            }
        };
        let body = [&(bytes.len() as u32).to_le_bytes()[..], &bytes, &offer].concat();
        if HEADER_SIZE + body.len() > MESSAGE_BYTES_MAX {
            tracing::warn!(%dir, bytes = body.len(), "a checkpoint offer does not fit one message; not offered");
            return;
        }
        let commit_max = self.replica.commit_max();
        let message = self.transfer_message(Command::CheckpointOffer, body, |reply| {
            reply.op = id.op;
            reply.context = id.checksum;
            reply.commit = commit_max;
            reply.nonce = header.nonce;
        });
        tracing::info!(%dir, peer = header.replica, checkpoint_op = id.op, "offered this replica's checkpoint for a peer's state transfer");
        peers.transport.send(header.replica, message);
    }

    /// The peer offered its checkpoint: check it, then take it (a journal that keeps its
    /// log) or stage the offered log (a journal that moves it).
    fn on_checkpoint_offer(&mut self, message: &Message) {
        let header = &message.header;
        let now = self.now();
        let Some(transfer) = &mut self.transfer else {
            return;
        };
        if header.nonce != transfer.nonce || header.replica != transfer.peer || transfer.checkpoint.is_some()
        {
            return;
        }
        transfer.heard_at = now;
        let (above_op, commit_max, peer) = (transfer.above_op, transfer.commit_max, transfer.peer);
        let dir = self.files.dir.display().to_string();
        let refuse = |group: &mut Self, reason: String| {
            tracing::warn!(%dir, peer, %reason, "refused a peer's state transfer offer (the next try asks another peer)");
            group.transfer = None;
        };
        let Some((bytes, offer)) = split_offer(&message.body) else {
            return refuse(self, "the offer's body is malformed".into());
        };
        if header.op <= above_op.max(self.replica.commit_min()) || header.commit < commit_max {
            return refuse(
                self,
                format!(
                    "checkpoint op {} (peer commit_max {}) is not above op {} or the peer knows less than commit_max {commit_max}",
                    header.op,
                    header.commit,
                    above_op.max(self.replica.commit_min())
                ),
            );
        }
        let checkpoint = match Checkpoint::decode(
            bytes,
            J::SHAPE.checkpoint_size_max(),
            header.context,
            self.cluster,
            self.replica.config().group,
        ) {
            Ok(checkpoint) if checkpoint.op() == header.op => checkpoint,
            Ok(_) => return refuse(self, "the checkpoint is of another op than the offer says".into()),
            Err(fault) => return refuse(self, format!("the checkpoint does not verify: {fault}")),
        };
        if !J::TRANSFERS_LOG
            || self
                .journal
                .holds_prepare_durably(header.op, checkpoint.header.checksum)
        {
            // The journal keeps its log: the checkpoint alone is the transfer.
            let installed = self
                .replica
                .on_state_transferred(bytes, header.context, TransferredLog::Kept);
            self.transfer = None;
            if installed {
                self.transfer_wanted = false;
                tracing::info!(%dir, peer, checkpoint_op = header.op, "state transfer complete: installed a peer's checkpoint; the journal keeps its log");
            }
            return;
        }
        let own_state = self.replica.state_machine().snapshot();
        match self
            .journal
            .stage_begin(offer, &checkpoint, header.context, &own_state)
        {
            Ok(bytes_total) => {
                if let Some(transfer) = &mut self.transfer {
                    transfer.checkpoint = Some((bytes.to_vec(), header.context, header.op));
                    transfer.bytes_total = bytes_total;
                }
                tracing::info!(%dir, peer, checkpoint_op = header.op, bytes_total, "a peer offered its checkpoint and log; fetching the log");
                self.continue_transfer(self.now());
            }
            Err(reason) => refuse(self, reason),
        }
    }

    /// A peer asks for bytes of a segment of this replica's log.
    fn answer_chunk_request(&mut self, header: &Header) {
        let Some(peers) = self.peers.clone() else {
            return;
        };
        let request = ChunkRequest {
            segment_first_op: header.op,
            position_bytes: header.commit,
            len_bytes: header.request,
        };
        if request.len_bytes == 0 || request.len_bytes > CHUNK_BYTES {
            return;
        }
        let chunk = match self.journal.read_chunk(request) {
            Ok(chunk) => chunk,
            Err(reason) => {
                tracing::info!(dir = %self.files.dir.display(), segment = request.segment_first_op, %reason, "cannot send a chunk a peer's state transfer asked for");
                return;
            }
        };
        let checksum = chunk.checksum;
        let len = chunk.bytes.len() as u64;
        let message = self.transfer_message(Command::Chunk, chunk.bytes, |reply| {
            reply.op = request.segment_first_op;
            reply.commit = request.position_bytes;
            reply.request = len;
            reply.context = u128::from(checksum);
            reply.nonce = header.nonce;
        });
        peers.transport.send(header.replica, message);
    }

    /// The peer sent a chunk: stage it, then ask for the next.
    fn on_chunk(&mut self, message: Message) {
        let header = message.header;
        let now = self.now();
        let Some(transfer) = &mut self.transfer else {
            return;
        };
        let Some((asked, _)) = transfer.asked else {
            return;
        };
        let len = message.body.len() as u64;
        if header.nonce != transfer.nonce
            || header.replica != transfer.peer
            || header.op != asked.segment_first_op
            || header.commit != asked.position_bytes
            || len == 0
            || len > asked.len_bytes
        {
            return;
        }
        transfer.asked = None;
        transfer.heard_at = now;
        let chunk = TransferChunk {
            segment_first_op: header.op,
            position_bytes: header.commit,
            bytes: Vec::from(message.body),
            checksum: header.context as u64,
        };
        if let Err(reason) = self.journal.stage_chunk(&chunk) {
            tracing::warn!(dir = %self.files.dir.display(), peer = header.replica, %reason, "a chunk of a state transfer was refused; dropped the transfer (the next try asks another peer)");
            self.drop_transfer();
            return;
        }
        if let Some(transfer) = &mut self.transfer {
            transfer.bytes_done += len;
            if now.saturating_duration_since(transfer.logged_at) >= LOG_EVERY {
                transfer.logged_at = now;
                tracing::info!(
                    dir = %self.files.dir.display(),
                    peer = transfer.peer,
                    bytes_done = transfer.bytes_done,
                    bytes_total = transfer.bytes_total,
                    "state transfer in progress"
                );
            }
        }
        self.continue_transfer(now);
    }

    /// A transfer command from this replica, sealed over `body`.
    fn transfer_message(&self, command: Command, body: Vec<u8>, fields: impl FnOnce(&mut Header)) -> Message {
        let mut header = Header::new(command, self.cluster);
        header.replica = self.replica.config().replica;
        header.group = self.replica.config().group;
        fields(&mut header);
        header.seal(&body);
        Message {
            header,
            body: Bytes::from(body),
        }
    }
}

/// An offer's body: the checkpoint's bytes and the journal's offer.
fn split_offer(body: &[u8]) -> Option<(&[u8], &[u8])> {
    let len = u32::from_le_bytes(body.get(..4)?.try_into().ok()?) as usize;
    let rest = &body[4..];
    (len <= rest.len()).then(|| rest.split_at(len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pace_lets_a_chunk_through_per_share_of_a_second() {
        let pace = TransferPace::new(4 * CHUNK_BYTES);
        let start = Instant::now();
        // The bucket starts empty but not below zero: one chunk goes, the next waits.
        assert!(pace.try_take(CHUNK_BYTES, start));
        assert!(!pace.try_take(CHUNK_BYTES, start));
        assert!(!pace.try_take(CHUNK_BYTES, start + Duration::from_millis(200)));
        assert!(pace.try_take(CHUNK_BYTES, start + Duration::from_millis(260)));
        // Idle time fills the bucket up to its capacity only.
        let later = start + Duration::from_secs(60);
        assert!(pace.try_take(CHUNK_BYTES, later));
        assert!(pace.try_take(CHUNK_BYTES, later));
        assert!(!pace.try_take(CHUNK_BYTES, later));
    }

    #[test]
    fn a_malformed_offer_body_is_refused() {
        assert_eq!(split_offer(&[1, 0]), None);
        assert_eq!(split_offer(&[3, 0, 0, 0, 9, 9]), None);
        assert_eq!(
            split_offer(&[2, 0, 0, 0, 7, 8, 9]),
            Some((&[7u8, 8][..], &[9u8][..]))
        );
    }
}
