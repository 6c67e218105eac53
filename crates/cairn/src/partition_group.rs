//! A partition as a replication group of one replica whose journal is the partition's
//! segment log (`docs/replication.md`, "The partition group"): [`LogJournal`] is the
//! [`GroupJournal`] that [`LocalGroup`] runs a [`PartitionMachine`] over.
//!
//! ```text
//! <group dir>/cluster, superblock, checkpoints   as for every group (`node`)
//!            /log/                               the journal log (`cairn_storage::journal`)
//!            /log.<g>/, journal.live             a journal a state transfer brought, and
//!                                                which generation is live
//!                                                (`cairn_storage::transfer`)
//! ```
//!
//! The open makes live a staged journal whose marker names the checkpoint the superblock
//! names (the install's commit point) and removes any other generation but the live one.
//!
//! How a prepare becomes records, and back:
//! - an append whose batches the primary stamped to continue the log (the partition id, the
//!   log's next offsets, the append's timestamp) is one op record holding the 256-byte
//!   prepare header, then one batch record per batch: the batches are written once, and a
//!   poll can serve them as they are;
//! - any other op (an offset store or delete, a purge, a trim, or an append the machine will
//!   refuse) is one op record holding the header and the body;
//! - read back, the body is rebuilt from the records (`cairn_machine::partition::encode_append`
//!   of the append's timestamp and batches) and the header's body checksum verifies it.
//!
//! Recovery hands the replica each op of the journal's window as its header only
//! (`SlotState::Durable`); the replica reads a body back when it applies the op, so a boot
//! holds headers in memory, not batches.
//!
//! A read-only open (the offline checker's) recovers the group from what lies below the
//! journal's durable frontier, which is what an open keeps, and writes nothing.
//!
//! The server runs every partition as such a group (`crate::partition::PartitionData`).

use crate::node::{GroupError, GroupJournal, LocalGroup, NamedCheckpoint, Peers};
use bytes::Bytes;
use cairn_machine::partition::{self, OPERATION_APPEND, Owner, PartitionMachine};
use cairn_storage::StorageError;
use cairn_storage::check::{BootAction, Damage, LogSummary, PartitionReport};
use cairn_storage::io::{Disk, RealDisk};
use cairn_storage::journal::{JournalConfig, JournalInspection, JournalLog, JournalSegment, StoredOp};
use cairn_storage::read::{ReadOutcome, ReadPart};
use cairn_storage::record::Chain;
use cairn_storage::transfer::{
    self, CheckpointId, ChunkRequest, StagedJournal, Staging, TransferChunk, TransferManifest,
};
use cairn_vsr::checkpoint::Checkpoint;
use cairn_vsr::constants::{HEADER_SIZE, Shape};
use cairn_vsr::header::{Command, Header, Message};
use cairn_vsr::journal::SlotState;
use cairn_vsr::replica::StateMachine as _;
use cairn_wire::batch::{self, ReceivedBatch};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The journal log's directory inside the group directory.
#[cfg(test)]
const LOG_DIR: &str = cairn_storage::transfer::JOURNAL_DIR;

/// How a partition's journal runs: the segment size is the topic's (or the server's), the
/// durability mode the server's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalOptions {
    pub segment_size_bytes: u64,
    /// `storage.durability = relaxed`: an op is acknowledged once written, a flush on a timer
    /// makes it durable (see `cairn_storage::journal`, "Relaxed mode").
    pub relaxed: bool,
}

/// What a partition's journal needs besides its directory.
#[derive(Debug, Clone)]
pub struct LogParams {
    /// The partition's id in its records (and the machine's).
    pub partition_id: u32,
    pub segment_size_bytes: u64,
    /// See [`JournalOptions::relaxed`].
    pub relaxed: bool,
    /// Where the journal's files are (the real filesystem, or a fault-injecting one in tests).
    pub disk: Arc<dyn Disk>,
}

impl LogParams {
    /// A partition journal on the real filesystem.
    pub fn new(partition_id: u32, options: JournalOptions) -> LogParams {
        LogParams {
            partition_id,
            segment_size_bytes: options.segment_size_bytes,
            relaxed: options.relaxed,
            disk: Arc::new(RealDisk),
        }
    }
}

/// A partition group's journal: its segment log (see the module doc).
pub struct LogJournal {
    dir: PathBuf,
    log: JournalLog,
    partition_id: u32,
    /// For a read-only open (the checker's): what an open would do. A read-only journal
    /// writes nothing; a prepare the replica asks to write during its recovery is dropped.
    inspection: Option<JournalInspection>,
    /// The group directory, which holds the journal's generations (`cairn_storage::transfer`).
    group_dir: PathBuf,
    /// How it was opened: a log a state transfer staged is opened the same way when it goes
    /// live.
    params: LogParams,
    ids: (u128, u64),
    journal_slots: usize,
    /// A state transfer's staging (`node::transfer`).
    transfer: Option<LogTransfer>,
}

/// A log being staged by a state transfer, for the checkpoint it ends at.
struct LogTransfer {
    /// The staging's generation (its directory, which an abandon removes).
    generation: u64,
    /// While chunks arrive; `None` once handed to the verification (then `verifying`,
    /// then `staged`).
    staging: Option<Staging>,
    verifying: Option<Verifying>,
    staged: Option<StagedJournal>,
    checkpoint: Checkpoint,
    /// The checkpoint's machine state.
    offered: partition::PartitionState,
}

impl Drop for LogJournal {
    /// A verification still running writes into the group's directory (summaries, the
    /// marker): it ends before the journal does, so a group reopened at the same path never
    /// sees its writes.
    fn drop(&mut self) {
        self.stage_settle();
    }
}

/// A complete staging being verified whole on a thread of its own.
struct Verifying {
    outcome: std::sync::mpsc::Receiver<Result<StagedJournal, String>>,
    thread: std::thread::JoinHandle<()>,
}

impl LogJournal {
    /// [`GroupJournal::open`] with the ring the replica's shape has (`journal_slots`; the
    /// simulator's shapes differ from the partition's).
    #[allow(clippy::type_complexity)]
    fn open_journal(
        dir: &Path,
        params: &LogParams,
        read_only: bool,
        ids: (u128, u64),
        checkpoint: NamedCheckpoint,
        journal_slots: usize,
    ) -> Result<(LogJournal, Vec<SlotState>, Vec<String>), GroupError> {
        let config = JournalConfig {
            segment_size_bytes: params.segment_size_bytes,
            relaxed: params.relaxed,
        };
        let generations_refused = |error: cairn_storage::StorageError| {
            GroupError::refused_for(
                &error,
                dir,
                format!(
                    "the partition's journal generations cannot be resolved, its files are left as they are: {error}"
                ),
            )
        };
        // Which journal generation is live, finishing a state transfer's install a crash
        // interrupted (`cairn_storage::transfer`); the checker only reads what the open would do.
        let disk = params.disk.as_ref();
        let named = Some(checkpoint.id);
        // Asked only when a staging's marker names the superblock's checkpoint: whether the live
        // journal holds the checkpoint's prepare itself (then it stays live).
        let live_serves_named = |live_dir: &Path| {
            JournalLog::open_read_only_on(Arc::clone(&params.disk), live_dir, params.partition_id, config)
                .is_ok_and(|(log, _)| holds_prepare(&log, checkpoint.id.op, checkpoint.prepare_checksum))
        };
        let log_dir = if read_only {
            let resolution =
                transfer::plan_resolution(disk, dir, params.partition_id, named, &live_serves_named)
                    .map_err(generations_refused)?;
            transfer::journal_dir(dir, resolution.journal_generation())
        } else {
            let (log_dir, resolution) =
                transfer::resolve(disk, dir, params.partition_id, named, &live_serves_named)
                    .map_err(generations_refused)?;
            if let Some(generation) = resolution.roll_forward {
                tracing::info!(
                    dir = %dir.display(),
                    generation,
                    checkpoint_op = checkpoint.id.op,
                    "finished installing the journal a state transfer brought (the superblock already named its checkpoint); the old journal was removed"
                );
            } else if !resolution.removed.is_empty() {
                tracing::info!(
                    dir = %dir.display(),
                    generations = ?resolution.removed,
                    "removed journal generations that are not live: a state transfer's staging the superblock never committed, or the journal a committed one replaced"
                );
            }
            log_dir
        };
        let refused = |error: cairn_storage::StorageError| {
            GroupError::refused_for(
                &error,
                &log_dir,
                format!("the partition's journal cannot be opened, its files are left as they are: {error}"),
            )
        };
        if read_only {
            // What the open would keep, read in place (the checker's view).
            let (log, inspection) = JournalLog::open_read_only_on(
                Arc::clone(&params.disk),
                &log_dir,
                params.partition_id,
                config,
            )
            .map_err(refused)?;
            return Self::recovered(dir, log_dir, log, Some(inspection), params, ids, journal_slots);
        }
        let (log, recovery) =
            JournalLog::open_on(Arc::clone(&params.disk), &log_dir, params.partition_id, config)
                .map_err(refused)?;
        if recovery.state_slot_damaged {
            tracing::warn!(
                dir = %log_dir.display(),
                durable_op = recovery.durable_op,
                "one slot of the journal's state file failed verification (a publish torn by a crash, or a flipped bit): the other slot's frontier was used, and the whole ops written above it were kept"
            );
        }
        if recovery.unsynced_ops_kept > 0 {
            tracing::info!(
                dir = %log_dir.display(),
                ops = recovery.unsynced_ops_kept,
                bytes = recovery.unsynced_bytes_kept,
                "kept the whole ops written above the journal's durable frontier (relaxed mode acknowledged them before a barrier, or a state slot failed verification and the newest frontier may be the one lost) and made them durable"
            );
        }
        if recovery.dropped_bytes > 0 {
            if recovery.unsynced_may_be_acknowledged {
                tracing::warn!(
                    dir = %log_dir.display(),
                    bytes = recovery.dropped_bytes,
                    durable_op = recovery.durable_op,
                    "dropped the journal's bytes above its durable frontier that were not whole ops: a torn tail; in relaxed mode it may have held acknowledged messages lost with unsynced data (a power loss), and their offsets are never handed out again"
                );
            } else {
                tracing::warn!(
                    dir = %log_dir.display(),
                    bytes = recovery.dropped_bytes,
                    durable_op = recovery.durable_op,
                    "dropped the journal's bytes above its durable frontier: writes never reported durable (an unsynced or partly written op, or what a cut had removed)"
                );
            }
        }
        Self::recovered(dir, log_dir, log, None, params, ids, journal_slots)
    }

    fn storage_error(&self, error: cairn_storage::StorageError) -> GroupError {
        GroupError::Refused {
            dir: self.dir.clone(),
            reason: error.to_string(),
        }
    }

    /// The batches of an append prepare, if the primary stamped them to continue this log
    /// where the op goes: its end, or, for a rewrite, where the op being replaced began.
    fn batches_continuing<'a>(&self, message: &'a Message) -> Option<(u64, Vec<&'a [u8]>)> {
        if message.header.operation != OPERATION_APPEND {
            return None;
        }
        let (timestamp_us, batches) = partition::append_parts(&message.body)?;
        let mut next_offset = self
            .log
            .extent(message.header.op)
            .map_or(self.log.chain(), |extent| extent.chain_before)
            .next_offset;
        for bytes in &batches {
            let header = batch::header(bytes)?;
            let continues = header.partition_id == u64::from(self.partition_id)
                && header.base_offset == next_offset
                && header.base_timestamp == timestamp_us
                && header.batch_length == bytes.len() as u64
                && header.message_count > 0;
            if !continues {
                return None;
            }
            // The journal stamps each batch again as it writes it, with these same values, so
            // the bytes it stores are the prepared ones and the body rebuilt from them verifies.
            debug_assert_eq!(
                batch::stamped_header(bytes, header.partition_id, next_offset, timestamp_us)
                    .as_ref()
                    .map(|head| &head[..]),
                bytes.get(..batch::BATCH_HEADER_SIZE)
            );
            next_offset = next_offset.checked_add(u64::from(header.message_count))?;
        }
        Some((timestamp_us, batches))
    }

    /// Run `sync` on the log (a read-only journal has nothing to sync).
    fn synced(&mut self, sync: fn(&mut JournalLog) -> Result<u64, StorageError>) -> Result<(), GroupError> {
        if self.inspection.is_some() {
            return Ok(());
        }
        sync(&mut self.log)
            .map(|_| ())
            .map_err(|error| self.storage_error(error))
    }

    /// The journal opened over `log`, and what its window holds for the replica.
    #[allow(clippy::type_complexity)]
    fn recovered(
        group_dir: &Path,
        log_dir: PathBuf,
        log: JournalLog,
        inspection: Option<JournalInspection>,
        params: &LogParams,
        (cluster, group): (u128, u64),
        journal_slots: usize,
    ) -> Result<(LogJournal, Vec<SlotState>, Vec<String>), GroupError> {
        let journal = LogJournal {
            dir: log_dir,
            log,
            partition_id: params.partition_id,
            inspection,
            group_dir: group_dir.to_path_buf(),
            params: params.clone(),
            ids: (cluster, group),
            journal_slots,
            transfer: None,
        };
        let mut slots = vec![SlotState::Empty; journal_slots];
        let mut damaged = Vec::new();
        let last = journal.log.last_op();
        let first = journal
            .log
            .first_op()
            .max((last + 1).saturating_sub(journal_slots as u64));
        for op in first..=last {
            let payload = journal
                .log
                .read_op_record(op)
                .map_err(|error| journal.storage_error(error))?;
            let header = payload
                .get(..HEADER_SIZE)
                .and_then(|bytes| Header::decode(bytes).ok())
                .filter(|header| {
                    header.command == Command::Prepare
                        && header.op == op
                        && header.cluster == cluster
                        && header.group == group
                });
            let slot = (op % journal_slots as u64) as usize;
            match header {
                Some(header) => slots[slot] = SlotState::Durable(header),
                None => {
                    // The record verified, yet holds no prepare header of this op: a writer
                    // bug or a foreign log. It may hold an acknowledged prepare.
                    slots[slot] = SlotState::Faulty { header: None };
                    damaged.push(format!("op {op}"));
                }
            }
        }
        Ok((journal, slots, damaged))
    }
}

impl GroupJournal for LogJournal {
    const SHAPE: Shape = Shape::PARTITION;
    type Params = LogParams;

    fn create(dir: &Path, params: &LogParams, ids: (u128, u64)) -> Result<LogJournal, GroupError> {
        let log_dir = transfer::journal_dir(dir, 0);
        // What an interrupted earlier format left here was never used (the superblock, written
        // last, is what makes a group formatted): start empty.
        let disk = params.disk.as_ref();
        let emptied = disk.list_dir(&log_dir).and_then(|names| {
            for name in names {
                disk.remove_file(&log_dir.join(name))?;
            }
            disk.sync_dir(&log_dir)
        });
        match emptied {
            Ok(()) => {}
            Err(cairn_storage::StorageError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => {
                return Err(GroupError::Refused {
                    dir: log_dir,
                    reason: format!("cannot empty what an interrupted format left: {error}"),
                });
            }
        }
        let log = JournalLog::create_on(
            Arc::clone(&params.disk),
            &log_dir,
            params.partition_id,
            JournalConfig {
                segment_size_bytes: params.segment_size_bytes,
                relaxed: params.relaxed,
            },
            Chain::genesis(params.partition_id),
        )
        .map_err(|error| GroupError::Refused {
            dir: log_dir.clone(),
            reason: format!("cannot create the partition's journal: {error}"),
        })?;
        Ok(LogJournal {
            dir: log_dir,
            log,
            partition_id: params.partition_id,
            inspection: None,
            group_dir: dir.to_path_buf(),
            params: params.clone(),
            ids,
            journal_slots: <Self as GroupJournal>::SHAPE.journal_slots,
            transfer: None,
        })
    }

    fn open(
        dir: &Path,
        params: &LogParams,
        read_only: bool,
        ids: (u128, u64),
        checkpoint: NamedCheckpoint,
    ) -> Result<(LogJournal, Vec<SlotState>, Vec<String>), GroupError> {
        LogJournal::open_journal(
            dir,
            params,
            read_only,
            ids,
            checkpoint,
            <Self as GroupJournal>::SHAPE.journal_slots,
        )
    }

    fn write_prepare(&mut self, message: &Message) -> Result<(), GroupError> {
        if self.inspection.is_some() {
            return Ok(());
        }
        let header = message.header.encode();
        // A skip's op record carries the offset minting resumes at (the prepare's cursor).
        let skip_to = (message.header.operation == partition::OPERATION_SKIP)
            .then(|| partition::cursor_parts(message.header.cursor).0)
            .filter(|&to| {
                to > self
                    .log
                    .extent(message.header.op)
                    .map_or(self.log.chain(), |extent| extent.chain_before)
                    .next_offset
            });
        let written = match self.batches_continuing(message) {
            Some((timestamp_us, batches)) => self.log.write_op(
                message.header.op,
                message.header.view,
                timestamp_us,
                &header,
                &batches,
            ),
            None => {
                let payload = [&header[..], &message.body[..]].concat();
                match skip_to {
                    Some(to_offset) => self.log.write_skip_op(
                        message.header.op,
                        message.header.view,
                        message.header.timestamp,
                        &payload,
                        to_offset,
                    ),
                    None => self.log.write_op(
                        message.header.op,
                        message.header.view,
                        message.header.timestamp,
                        &payload,
                        &[],
                    ),
                }
            }
        };
        // The barrier comes after every prepare of the round (`prepares_barrier`).
        match written {
            Ok(()) => Ok(()),
            // An IO error the journal undid (no space left, say): the op was never written.
            // Anything else (a refused op is a bug upstream) stops the group.
            Err(error @ StorageError::Io { .. }) if self.log.stopped_reason().is_none() => {
                Err(GroupError::WriteUndone {
                    dir: self.dir.clone(),
                    reason: error.to_string(),
                })
            }
            Err(error) => Err(self.storage_error(error)),
        }
    }

    /// One barrier for every prepare written since the last (durable mode). In relaxed mode
    /// an op counts as written once it is in the page cache; a timer (or anything durable
    /// naming it) flushes it.
    fn prepares_barrier(&mut self) -> Result<(), GroupError> {
        if self.log.relaxed() {
            return Ok(());
        }
        self.synced(JournalLog::sync)
    }

    fn flush(&mut self) -> Result<(), GroupError> {
        self.synced(JournalLog::sync)
    }

    fn flush_for_stop(&mut self) -> Result<(), GroupError> {
        self.synced(JournalLog::sync_for_stop)
    }

    fn read_prepare(&mut self, op: u64, checksum: u128) -> Option<Message> {
        if op < self.log.first_op() {
            // Released by retention (a peer asking for an op this log no longer holds):
            // nothing to report.
            tracing::debug!(dir = %self.dir.display(), op, "an op below the journal's start was asked for");
            return None;
        }
        let stored = match self.log.read_op(op) {
            Ok(stored) => stored,
            Err(error) => {
                tracing::error!(
                    dir = %self.dir.display(),
                    op,
                    "reading a synced op back from the journal failed ({error}); the replica treats its copy as lost"
                );
                return None;
            }
        };
        let prepare = verified_prepare(prepare_bytes(stored), op, checksum);
        if prepare.is_none() {
            tracing::error!(
                dir = %self.dir.display(),
                op,
                "the journal's records of an op no longer make the prepare it synced; the replica treats its copy as lost (kept on disk as found)"
            );
        }
        prepare
    }

    fn location(&self) -> PathBuf {
        self.dir.clone()
    }

    const TRANSFERS_LOG: bool = true;

    fn offer(&self, checkpoint: CheckpointId, machine: &[u8]) -> Result<Vec<u8>, String> {
        let mut offered = PartitionMachine::new(self.partition_id);
        offered.restore(machine)?;
        let manifest = TransferManifest::of(&self.log, checkpoint, offered.state().purge_generation)
            .map_err(|error| error.to_string())?;
        Ok(manifest.encode())
    }

    fn read_chunk(&self, request: ChunkRequest) -> Result<TransferChunk, String> {
        TransferChunk::read(&self.log, request).map_err(|error| error.to_string())
    }

    fn holds_prepare_durably(&self, op: u64, checksum: u128) -> bool {
        holds_prepare(&self.log, op, checksum)
    }

    fn stage_begin(
        &mut self,
        offer: &[u8],
        checkpoint: &Checkpoint,
        checksum: u128,
        own_state: &[u8],
    ) -> Result<u64, String> {
        if self.inspection.is_some() {
            return Err("a read-only journal stages nothing".into());
        }
        if self.transfer.is_some() {
            // One install at a time: a staged one may be committed by a superblock write in
            // flight.
            return Err("another transfer's staging is pending".into());
        }
        let manifest = TransferManifest::decode(offer, self.partition_id)?;
        let mut offered = PartitionMachine::new(self.partition_id);
        offered.restore(&checkpoint.state_machine)?;
        let mut own = PartitionMachine::new(self.partition_id);
        own.restore(own_state)?;
        check_offer(&manifest, checkpoint, checksum, offered.state(), own.state())?;
        let bytes_total = manifest.len_bytes();
        let staging = Staging::begin(Arc::clone(&self.params.disk), &self.group_dir, manifest)
            .map_err(|error| error.to_string())?;
        self.transfer = Some(LogTransfer {
            generation: staging.generation(),
            staging: Some(staging),
            verifying: None,
            staged: None,
            checkpoint: checkpoint.clone(),
            offered: offered.state().clone(),
        });
        Ok(bytes_total)
    }

    fn stage_next(&self) -> Option<ChunkRequest> {
        self.transfer
            .as_ref()
            .and_then(|transfer| transfer.staging.as_ref())
            .and_then(Staging::next_request)
    }

    fn stage_chunk(&mut self, chunk: &TransferChunk) -> Result<(), String> {
        let staging = self
            .transfer
            .as_mut()
            .and_then(|transfer| transfer.staging.as_mut())
            .ok_or("no staging takes chunks")?;
        staging.write_chunk(chunk).map_err(|error| error.to_string())
    }

    fn stage_verify(&mut self) -> Result<(), String> {
        let transfer = self.transfer.as_mut().ok_or("no staging")?;
        let staging = transfer.staging.take().ok_or("the staging is finished already")?;
        let config = JournalConfig {
            segment_size_bytes: self.params.segment_size_bytes,
            relaxed: self.params.relaxed,
        };
        let (checkpoint, offered) = (transfer.checkpoint.clone(), transfer.offered.clone());
        let (report, outcome) = std::sync::mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("cairn-transfer-verify".to_string())
            .spawn(move || {
                let staged = staging
                    .finish_checked(config, &|journal| check_staged(journal, &checkpoint, &offered))
                    .map_err(|error| error.to_string());
                // The journal may be gone (its group closed): nobody waits for the outcome.
                let _ = report.send(staged);
            });
        let thread = spawned.map_err(|error| format!("cannot start the verification thread: {error}"))?;
        transfer.verifying = Some(Verifying { outcome, thread });
        Ok(())
    }

    fn stage_verified(&mut self) -> Option<Result<(), String>> {
        let Some(transfer) = self.transfer.as_mut() else {
            return Some(Err("no staging".into()));
        };
        let Some(verifying) = &transfer.verifying else {
            return Some(Err("no verification runs".into()));
        };
        let outcome = match verifying.outcome.try_recv() {
            Err(std::sync::mpsc::TryRecvError::Empty) => return None,
            Ok(outcome) => outcome,
            Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                Err("the verification thread ended without an outcome".into())
            }
        };
        if let Some(verifying) = transfer.verifying.take() {
            // It has sent its outcome: ending, if not ended.
            let _ = verifying.thread.join();
        }
        match outcome {
            Ok(staged) => {
                debug_assert_eq!(staged.generation, transfer.generation);
                transfer.staged = Some(staged);
                Some(Ok(()))
            }
            // The staging's files stay until the abandon that follows removes them.
            Err(reason) => Some(Err(reason)),
        }
    }

    fn stage_settle(&mut self) {
        if let Some(verifying) = self
            .transfer
            .as_mut()
            .and_then(|transfer| transfer.verifying.take())
        {
            let _ = verifying.thread.join();
        }
    }

    fn stage_abandon(&mut self) -> Result<(), String> {
        // Its files are a running verification's until it ends (rare: the group stops
        // meanwhile): wait for it, then remove them.
        self.stage_settle();
        let Some(transfer) = self.transfer.take() else {
            return Ok(());
        };
        let generation = transfer.generation;
        drop(transfer);
        transfer::abandon(self.params.disk.as_ref(), &self.group_dir, generation)
            .map_err(|error| format!("generation {generation}: {error}"))
    }

    fn stage_commit(&mut self, checkpoint: NamedCheckpoint) -> Result<(), GroupError> {
        let staged = self
            .transfer
            .take()
            .and_then(|transfer| transfer.staged)
            .filter(|staged| staged.checkpoint == checkpoint.id)
            .ok_or_else(|| GroupError::Refused {
                dir: self.group_dir.clone(),
                reason: format!(
                    "the superblock names checkpoint op {} for a transferred log that is not staged",
                    checkpoint.id.op
                ),
            })?;
        let failed = |error: String| GroupError::Refused {
            dir: self.group_dir.clone(),
            reason: format!(
                "cannot make the log a state transfer brought live ({error}); the next start finishes it from the superblock"
            ),
        };
        transfer::commit(
            self.params.disk.as_ref(),
            &self.group_dir,
            staged.generation,
            staged.checkpoint,
        )
        .map_err(|error| failed(error.to_string()))?;
        let (journal, _, _) = LogJournal::open_journal(
            &self.group_dir,
            &self.params,
            false,
            self.ids,
            checkpoint,
            self.journal_slots,
        )
        .map_err(|error| failed(error.to_string()))?;
        *self = journal;
        Ok(())
    }
}

/// One append op's input: the batches of a group of sends (validated client batches) and
/// the timestamp the op stamps them with.
#[derive(Debug)]
pub struct Append {
    pub timestamp_us: u64,
    pub batches: Vec<ReceivedBatch>,
}

/// An append request's body. A group of one send with room in front of its batch (a batch as
/// the TCP shell received it) becomes the request in the buffer it arrived in: the request's
/// prefix goes into that room and nothing is copied, so the prepare stamps the very bytes the
/// client sent ([`cairn_vsr::replica::StateMachine::prepare`] stamps a buffer nothing else holds in place). Any
/// other group is copied into one new buffer.
fn append_request(append: Append) -> Bytes {
    let Append {
        timestamp_us,
        mut batches,
    } = append;
    if batches.len() == 1 && batches[0].headroom() >= partition::APPEND_ONE_PREFIX_BYTES {
        let batch = batches.pop().expect("one batch");
        let batch_len = batch.len();
        let (buffer, headroom) = batch.into_buffer();
        match buffer.try_into_mut() {
            Ok(mut owned) => {
                let start = headroom - partition::APPEND_ONE_PREFIX_BYTES;
                owned[start..headroom]
                    .copy_from_slice(&partition::append_one_prefix(timestamp_us, batch_len));
                return owned.freeze().slice(start..);
            }
            Err(shared) => {
                return Bytes::from(partition::encode_append(timestamp_us, &[&shared[headroom..]]));
            }
        }
    }
    let batches: Vec<&[u8]> = batches.iter().map(|batch| &batch[..]).collect();
    Bytes::from(partition::encode_append(timestamp_us, &batches))
}

/// The prepare `bytes` (from [`prepare_bytes`]) hold, if they are one whole prepare of op `op`
/// with checksum `checksum` whose body verifies by the partition machine's rule
/// ([`partition::body_verifies_over_records`]: an append's body checksum covers its batch headers,
/// and the journal verified every batch's bytes against its record's checksum when it read
/// them). The body is not copied.
fn verified_prepare(bytes: Vec<u8>, op: u64, checksum: u128) -> Option<Message> {
    let header = Header::decode(&bytes).ok()?;
    if header.op != op || header.checksum != checksum || header.size as usize != bytes.len() {
        return None;
    }
    let body = Bytes::from(bytes).slice(HEADER_SIZE..);
    partition::body_verifies_over_records(header.operation, &body, header.checksum_body)
        .then_some(Message { header, body })
}

/// The bytes of the prepare an op's records hold (its header, then its body: for an append,
/// rebuilt from the stamped batches), or nothing when they cannot make one.
fn prepare_bytes(stored: StoredOp) -> Vec<u8> {
    if stored.batches.is_empty() {
        stored.op_payload
    } else if stored.op_payload.len() == HEADER_SIZE && stored.batches.len() <= partition::APPEND_BATCHES_MAX
    {
        let batches: Vec<&[u8]> = stored.batches.iter().map(Vec::as_slice).collect();
        [
            stored.op_payload,
            partition::encode_append(stored.timestamp_us, &batches),
        ]
        .concat()
    } else {
        Vec::new()
    }
}

/// Op `op`'s records, read from a log outside a running group (an operator's repair), as the
/// prepare they hold, verified (header and body checksums).
pub(crate) fn prepare_from(stored: StoredOp) -> Result<Message, String> {
    let op = stored.op;
    let header = stored
        .op_payload
        .get(..HEADER_SIZE)
        .and_then(|bytes| Header::decode(bytes).ok())
        .ok_or_else(|| format!("op {op}'s record holds no prepare header"))?;
    verified_prepare(prepare_bytes(stored), op, header.checksum)
        .ok_or_else(|| format!("op {op}'s records do not make the prepare they name"))
}

/// Whether `log` holds op `op` durably as the prepare whose checksum is `prepare_checksum`
/// (its op record begins with that prepare's header): what a state transfer asks of a
/// checkpoint's op.
pub(crate) fn holds_prepare(log: &JournalLog, op: u64, prepare_checksum: u128) -> bool {
    op <= log.durable_op()
        && log.extent(op).is_some()
        && log.read_op_record(op).is_ok_and(|payload| {
            payload
                .get(..HEADER_SIZE)
                .and_then(|bytes| Header::decode(bytes).ok())
                .is_some_and(|header| header.op == op && header.checksum == prepare_checksum)
        })
}

/// The partition shell's checks of an offer before a byte is fetched: it is the offer of
/// the checkpoint being installed, its purge generation and offsets are the checkpoint's,
/// and it does not take the replica's state back (a purge generation below its own: a stale
/// offer would bring purged messages back).
pub(crate) fn check_offer(
    manifest: &TransferManifest,
    checkpoint: &Checkpoint,
    checkpoint_checksum: u128,
    offered: &partition::PartitionState,
    own: &partition::PartitionState,
) -> Result<(), String> {
    let named = CheckpointId {
        op: checkpoint.header.op,
        checksum: checkpoint_checksum,
    };
    if manifest.checkpoint != named {
        return Err(format!(
            "the offer is of checkpoint op {}, not the one being installed (op {})",
            manifest.checkpoint.op, named.op
        ));
    }
    if manifest.purge_generation != offered.purge_generation {
        return Err(format!(
            "the offer's purge generation {} is not its checkpoint's {}",
            manifest.purge_generation, offered.purge_generation
        ));
    }
    if offered.purge_generation < own.purge_generation {
        return Err(format!(
            "a stale offer: purge generation {} below this replica's {}",
            offered.purge_generation, own.purge_generation
        ));
    }
    if manifest.end.next_offset != offered.next_offset || manifest.start().next_offset > offered.start_offset
    {
        return Err(format!(
            "the offered log holds offsets {}..{}, the checkpoint {}..{}",
            manifest.start().next_offset,
            manifest.end.next_offset,
            offered.start_offset,
            offered.next_offset
        ));
    }
    Ok(())
}

/// The staged journal, verified by the storage layer, is the checkpoint's: its last op holds
/// the checkpoint's prepare header (every record before it chains to it), and it ends at the
/// checkpoint's next offset.
pub(crate) fn check_staged(
    journal: &JournalLog,
    checkpoint: &Checkpoint,
    offered: &partition::PartitionState,
) -> Result<(), String> {
    let op = checkpoint.header.op;
    let holds_header = op < journal.first_op() || holds_prepare(journal, op, checkpoint.header.checksum);
    if !holds_header {
        return Err(format!("op {op} is not the checkpoint's prepare"));
    }
    if journal.chain().next_offset != offered.next_offset {
        return Err(format!(
            "the journal ends at offset {}, the checkpoint at {}",
            journal.chain().next_offset,
            offered.next_offset
        ));
    }
    Ok(())
}

/// A partition group of one replica over the files of `dir`.
pub type PartitionGroup = LocalGroup<PartitionMachine, LogJournal>;

/// Open (or format) the partition group in `dir`.
pub fn open(dir: &Path, group: u64, params: LogParams) -> Result<PartitionGroup, GroupError> {
    let partition_id = params.partition_id;
    LocalGroup::open_with(dir, group, &params, move || PartitionMachine::new(partition_id))
}

/// Open (or format, when `peers` says the group is new to this node) this node's replica of
/// partition group `group` in `dir`, with peers.
pub fn open_with_peers(
    dir: &Path,
    group: u64,
    params: LogParams,
    peers: Peers,
) -> Result<PartitionGroup, GroupError> {
    let partition_id = params.partition_id;
    LocalGroup::open_with_peers(
        dir,
        group,
        &params,
        move || PartitionMachine::new(partition_id),
        Some(peers),
    )
}

/// The group id of a partition in a cluster of several nodes: its ids and its creation time
/// (the op that created it stamps it), so a partition deleted and created again with the
/// same ids is another group, and a replica that missed the delete never takes the new
/// group's messages as the old one's (`docs/cluster.md`). Top bit set, as [`group_id`].
pub fn cluster_group_id(stream_id: u32, topic_id: u32, partition_id: u32, created_at_us: u64) -> u64 {
    let mut ids = [0u8; 20];
    ids[..4].copy_from_slice(&stream_id.to_le_bytes());
    ids[4..8].copy_from_slice(&topic_id.to_le_bytes());
    ids[8..12].copy_from_slice(&partition_id.to_le_bytes());
    ids[12..].copy_from_slice(&created_at_us.to_le_bytes());
    xxhash_rust::xxh3::xxh3_64_with_seed(&ids, 0x0c1a_57e4) | 1 << 63
}

/// The group id of partition `(stream, topic, partition)`: derived from ids that never
/// change, so it is stable, and its top bit set, so it is never the metadata group's. A
/// partition directory found under another partition's name is refused (its prepares name
/// another group).
pub fn group_id(stream_id: u32, topic_id: u32, partition_id: u32) -> u64 {
    let mut ids = [0u8; 12];
    ids[..4].copy_from_slice(&stream_id.to_le_bytes());
    ids[4..8].copy_from_slice(&topic_id.to_le_bytes());
    ids[8..].copy_from_slice(&partition_id.to_le_bytes());
    xxhash_rust::xxh3::xxh3_64(&ids) | 1 << 63
}

/// The offline checker's verdict on the partition directory `dir` of `(stream, topic,
/// partition)`, which holds a formatted partition group (`crate::partition::check` reports
/// anything else): the group recovered read-only, as boot would recover it, writing nothing.
pub fn check(dir: &Path, (stream_id, topic_id, partition_id): (u32, u32, u32)) -> PartitionReport {
    let mut report = PartitionReport::empty(dir, partition_id);
    let live = transfer::live_generation(&RealDisk, dir).unwrap_or(0);
    report.segment_files = segment_files(&transfer::journal_dir(dir, live)).len();
    // The segment size matters to writes only; a read-only open writes nothing.
    let params = LogParams::new(
        partition_id,
        JournalOptions {
            segment_size_bytes: JOURNAL_SEGMENT_SIZE_ANY,
            relaxed: false,
        },
    );
    let opened = PartitionGroup::open_read_only_with(
        dir,
        group_id(stream_id, topic_id, partition_id),
        &params,
        move || PartitionMachine::new(partition_id),
    );
    match opened {
        Ok(Some(group)) => {
            let log_dir = group.journal().dir.clone();
            report.segment_files = segment_files(&log_dir).len();
            let log = group.log();
            report.log = Some(LogSummary {
                segments_count: log.segments().len(),
                batch_records: log.batch_count() as u64,
                messages: group.next_offset() - group.start_offset(),
                verified_bytes: log.size_bytes(),
                start_offset: group.start_offset(),
                end_offset: group.next_offset(),
            });
            report.resume_offset = Some(group.next_offset());
            if let Some(inspection) = &group.journal().inspection {
                if inspection.bytes_above_frontier > 0 {
                    report.actions.push(BootAction::DropAboveFrontier {
                        path: log_dir.clone(),
                        bytes: inspection.bytes_above_frontier,
                    });
                }
                if inspection.segments_below_start > 0 {
                    report.actions.push(BootAction::FinishSegmentRemoval {
                        path: log_dir.clone(),
                        segments: inspection.segments_below_start,
                    });
                }
            }
            report.notes.push(format!(
                "a partition group (a replicated log of one replica): checkpoint at op {}, ops applied up to {}",
                group.checkpoint_op(),
                group.commit_op()
            ));
        }
        Ok(None) => report.damage.push(Damage {
            path: dir.to_path_buf(),
            position: 0,
            reason: "boot refuses it: the group's superblock vanished while it was checked".into(),
        }),
        Err(error) => report.damage.push(Damage {
            path: dir.to_path_buf(),
            position: 0,
            reason: format!("the partition group cannot be recovered: {error}"),
        }),
    }
    report
}

/// The journal's segment files in `log_dir`, in name order (by first op); none if it cannot
/// be listed.
fn segment_files(log_dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(log_dir).map_or(Vec::new(), |entries| {
        entries
            .filter_map(Result::ok)
            .map(|entry| entry.path())
            .filter(|path| path.extension().is_some_and(|extension| extension == "log"))
            .collect()
    });
    files.sort();
    files
}

/// Any valid journal segment size, for opens that write nothing.
const JOURNAL_SEGMENT_SIZE_ANY: u64 = 1 << 30;

/// Why a partition operation did not happen.
#[derive(Debug, thiserror::Error)]
pub enum PartitionError {
    #[error(transparent)]
    Group(#[from] GroupError),
    /// The machine refused the op, which changed nothing: an Iggy status code
    /// (`cairn_wire::codes`).
    #[error("the partition refused the operation (status {0})")]
    Status(u32),
    /// A committed append did not continue the log (a minting bug): the partition takes no
    /// more writes.
    #[error("the partition stopped: {0}")]
    Faulted(String),
}

/// A partition's counts, as stats and listings show them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionStats {
    pub segments_count: u32,
    /// Messages a poll can reach: from the start offset to the next one, less the offsets a
    /// skip left without messages.
    pub messages_count: u64,
    /// Bytes in the journal's segments (op records included).
    pub size_bytes: u64,
}

/// The most log a reopened partition reads back to recognise resends
/// ([`LocalGroup::remember_recent_batches`]): bounds its open's work.
pub const RECENT_SEED_BYTES_MAX: u64 = 8 * 1024 * 1024;

/// What the server asks of a partition: each change is one op, committed and applied before
/// the call returns; each read sees exactly the committed state (the caller holds the
/// partition's lock, so the journal's end and the machine agree).
impl LocalGroup<PartitionMachine, LogJournal> {
    /// The partition's segment log, for reads.
    pub fn log(&self) -> &JournalLog {
        &self.journal().log
    }

    /// Read back the batches of the newest appends this replica applied (committed, at or
    /// below its commit point), so that it recognises a resend of one committed before it
    /// was reopened: those within [`partition::RESEND_WINDOW_US`] of `now_us`, at most
    /// [`partition::RECENT_BATCHES_MAX`] batches and [`RECENT_SEED_BYTES_MAX`] bytes. An op
    /// that does not read back leaves the machine's recent batches as they are (a poll or
    /// the scrub will find the damage).
    pub fn remember_recent_batches(&mut self, now_us: u64) {
        let commit = self.commit_op();
        let log = self.log();
        let (mut ops, mut batches, mut bytes) = (Vec::new(), 0usize, 0u64);
        for extent in log.extents().rev() {
            if extent.op > commit || extent.message_count == 0 {
                continue;
            }
            if extent.timestamp_us.saturating_add(partition::RESEND_WINDOW_US) < now_us
                || batches >= partition::RECENT_BATCHES_MAX
                || bytes.saturating_add(extent.len_bytes) > RECENT_SEED_BYTES_MAX
            {
                break;
            }
            batches += extent.batch_count as usize;
            bytes += extent.len_bytes;
            ops.push(extent.op);
        }
        let mut committed = Vec::with_capacity(batches);
        for &op in ops.iter().rev() {
            let stored = match log.read_op(op) {
                Ok(stored) => stored,
                Err(error) => {
                    tracing::debug!(op, %error, "recent batches not read back: an op does not read");
                    return;
                }
            };
            for batch in &stored.batches {
                let Some(header) = cairn_wire::batch::header(batch) else {
                    return;
                };
                if let Some(key) = cairn_wire::batch::content_key(batch) {
                    committed.push((key, header.base_offset, header.base_timestamp));
                }
            }
        }
        self.state_machine_mut().remember_committed_batches(committed);
    }

    /// Verify the log prefix the journal's open took from a summary unread, if it has one
    /// (`JournalLog::verify_unverified_prefix`): damage there is an `Err`, and stops the log.
    pub fn verify_log_prefix(&mut self) -> Result<(), StorageError> {
        if self.log().unverified_prefix().is_none() {
            return Ok(());
        }
        let dir = self.journal().dir.clone();
        let started = std::time::Instant::now();
        let verified = self.journal_mut().log.verify_unverified_prefix();
        if verified.is_ok() {
            tracing::debug!(dir = %dir.display(), took_ms = started.elapsed().as_millis() as u64, "verified the log prefix the start took from a summary");
        }
        verified
    }

    /// Summarise the durable part of the segment being written once it has grown enough
    /// (`JournalLog::summarise_progress`, every `PREFIX_SUMMARY_STEP_BYTES`), so that a start
    /// after a crash reads only what follows the summary. Off the acknowledgement path.
    pub fn summarise_log_progress(&mut self) {
        use cairn_storage::journal::{PREFIX_SUMMARY_GROWTH_PER_BYTE, PREFIX_SUMMARY_STEP_BYTES};
        if self
            .journal_mut()
            .log
            .summarise_progress(PREFIX_SUMMARY_STEP_BYTES, PREFIX_SUMMARY_GROWTH_PER_BYTE)
        {
            tracing::debug!(dir = %self.journal().dir.display(), "summarised the segment being written");
        }
    }

    fn state(&self) -> &partition::PartitionState {
        self.state_machine().state()
    }

    /// Replicate one op and return its reply, refusing once the machine has faulted.
    fn op(&mut self, operation: u8, body: &[u8]) -> Result<Vec<u8>, PartitionError> {
        if let Some(fault) = self.state_machine().fault() {
            return Err(PartitionError::Faulted(fault.to_string()));
        }
        let reply = self.submit(operation, body)?;
        if let Some(fault) = self.state_machine().fault() {
            return Err(PartitionError::Faulted(fault.to_string()));
        }
        Ok(reply)
    }

    fn status_op(&mut self, operation: u8, body: &[u8]) -> Result<(), PartitionError> {
        match partition::reply_status(&self.op(operation, body)?) {
            partition::STATUS_OK => Ok(()),
            status => Err(PartitionError::Status(status)),
        }
    }

    /// If the journal's open found offsets reserved above the log's end (an unclean stop in
    /// `relaxed` mode: they may have been acknowledged and lost), commit a skip to them, so
    /// none is handed out again. Returns the offset minting resumes at, if it skipped.
    pub fn resume_minting(&mut self) -> Result<Option<u64>, PartitionError> {
        let Some(to_offset) = self.log().resume_offset() else {
            return Ok(None);
        };
        let from_offset = self.next_offset();
        self.status_op(partition::OPERATION_SKIP, &partition::encode_skip(to_offset))?;
        tracing::warn!(
            dir = %self.journal().dir.display(),
            from_offset,
            to_offset,
            "offsets skipped after an unclean stop in relaxed mode: offsets up to the durable reservation may have been acknowledged before a power loss took them, so minting resumes above them (polls find no messages in between)"
        );
        Ok(Some(to_offset))
    }

    /// Append the batches of a group of sends (validated client batches) as one op stamped
    /// `timestamp_us`: the base offset each batch got, in order.
    #[cfg(test)]
    pub fn append(&mut self, timestamp_us: u64, batches: &[&[u8]]) -> Result<Vec<u64>, PartitionError> {
        let batches = batches
            .iter()
            .map(|batch| ReceivedBatch::from(batch.to_vec()))
            .collect();
        self.append_batch(vec![Append {
            timestamp_us,
            batches,
        }])
        .pop()
        .expect("one result per append")
    }

    /// [`Self::append_batch`] of borrowed batches (copied): for tests.
    #[cfg(test)]
    pub fn append_copies(&mut self, appends: &[(u64, &[&[u8]])]) -> Vec<Result<Vec<u64>, PartitionError>> {
        let appends = appends
            .iter()
            .map(|&(timestamp_us, batches)| Append {
                timestamp_us,
                batches: batches
                    .iter()
                    .map(|batch| ReceivedBatch::from(batch.to_vec()))
                    .collect(),
            })
            .collect();
        self.append_batch(appends)
    }

    /// Several appends (each a group of sends, stamped with its timestamp) as one op each, on
    /// the group's lanes (at most [`crate::node::LANES`]): prepared together, one barrier for
    /// all. Offsets follow the order given. Each result is as [`Self::append`]'s; an append
    /// whose op was durable before a later one's write failed keeps its offsets.
    pub fn append_batch(&mut self, appends: Vec<Append>) -> Vec<Result<Vec<u64>, PartitionError>> {
        // (After a reopen of the journal: the skip comes before anything is minted.)
        if let Err(error) = self.resume_minting() {
            return self.errors_like(error, appends.len());
        }
        if let Some(fault) = self.state_machine().fault() {
            let fault = fault.to_string();
            return appends
                .iter()
                .map(|_| Err(PartitionError::Faulted(fault.clone())))
                .collect();
        }
        let requests = appends
            .into_iter()
            .map(|append| (OPERATION_APPEND, append_request(append)))
            .collect();
        let replies = self.submit_batch(requests);
        let fault = self.state_machine().fault().map(str::to_string);
        // An op applied before the one that faulted keeps its offsets; the faulted one and
        // every later one (which the machine refuses) report the fault.
        replies
            .into_iter()
            .map(|reply| match (reply, &fault) {
                (Ok(reply), fault) => match (partition::decode_append_reply(&reply), fault) {
                    (Ok(offsets), _) => Ok(offsets),
                    (Err(_), Some(fault)) => Err(PartitionError::Faulted(fault.clone())),
                    (Err(status), None) => Err(PartitionError::Status(status)),
                },
                (Err(error), None) => Err(PartitionError::Group(error)),
                (Err(_), Some(fault)) => Err(PartitionError::Faulted(fault.clone())),
            })
            .collect()
    }

    /// `count` results failing as `error` did (the first gets it, the others its like).
    fn errors_like(&self, error: PartitionError, count: usize) -> Vec<Result<Vec<u64>, PartitionError>> {
        let like = |error: &PartitionError| match error {
            PartitionError::Status(status) => PartitionError::Status(*status),
            PartitionError::Faulted(fault) => PartitionError::Faulted(fault.clone()),
            PartitionError::Group(error) => PartitionError::Group(error.like(&self.journal().dir)),
        };
        let mut results: Vec<Result<Vec<u64>, PartitionError>> =
            (1..count).map(|_| Err(like(&error))).collect();
        results.insert(0, Err(error));
        results.truncate(count);
        results
    }

    /// Store `owner`'s offset (at most the last offset the partition holds). A store the
    /// machine would refuse, or of the offset already stored, takes no op, so a consumer
    /// polling an idle partition with auto-commit adds nothing to its log.
    pub fn store_offset(&mut self, owner: &Owner, offset: u64) -> Result<(), PartitionError> {
        if !self
            .state()
            .offset_store(owner, offset)
            .map_err(PartitionError::Status)?
        {
            return Ok(());
        }
        self.status_op(
            partition::OPERATION_STORE_OFFSET,
            &partition::encode_offset_op(owner, Some(offset)),
        )
    }

    /// Delete `owner`'s stored offset (`Status(CONSUMER_OFFSET_NOT_FOUND)` when none).
    pub fn delete_offset(&mut self, owner: &Owner) -> Result<(), PartitionError> {
        self.status_op(
            partition::OPERATION_DELETE_OFFSET,
            &partition::encode_offset_op(owner, None),
        )
    }

    /// Purge every message below `target` and every stored offset (offsets keep counting).
    /// A purge that would change nothing takes no op.
    pub fn purge(&mut self, target: u64) -> Result<(), PartitionError> {
        if !self.state().purge_changes(target) {
            return Ok(());
        }
        self.status_op(partition::OPERATION_PURGE, &partition::encode_purge(target))
    }

    /// Skip offsets: minting resumes at `to_offset` (above the next offset); polls find no
    /// messages in between.
    pub fn skip_to(&mut self, to_offset: u64) -> Result<(), PartitionError> {
        self.status_op(partition::OPERATION_SKIP, &partition::encode_skip(to_offset))
    }

    /// Retention: the messages below `below_offset` leave.
    pub fn trim(&mut self, below_offset: u64) -> Result<(), PartitionError> {
        self.status_op(partition::OPERATION_TRIM, &partition::encode_trim(below_offset))
    }

    pub fn stored_offset(&self, owner: &Owner) -> Option<u64> {
        self.state().offsets.get(owner).copied()
    }

    /// The first offset still retained.
    pub fn start_offset(&self) -> u64 {
        self.state().start_offset
    }

    /// The offset the next message gets: every offset below it is committed.
    pub fn next_offset(&self) -> u64 {
        self.state().next_offset
    }

    /// The offset after the newest message (below the next offset when the log ends with
    /// skipped offsets).
    fn messages_end(&self) -> u64 {
        self.log()
            .messages_end()
            .unwrap_or(self.start_offset())
            .min(self.next_offset())
    }

    /// The oldest message a poll can reach, if any (past skipped offsets the start may lie
    /// in).
    pub fn first_offset(&self) -> Option<u64> {
        self.log()
            .first_message_from(self.start_offset())
            .filter(|&offset| offset < self.messages_end())
    }

    /// The newest message a poll can reach, if any.
    pub fn last_offset(&self) -> Option<u64> {
        let end = self.messages_end();
        (self.start_offset() < end).then(|| end - 1)
    }

    /// [`JournalLog::read_parts`] over what a poll may see: retained and committed messages.
    pub fn read_parts(
        &self,
        from_offset: u64,
        max_messages: u32,
        out: &mut Vec<u8>,
        parts: &mut Vec<ReadPart>,
    ) -> Result<ReadOutcome, StorageError> {
        self.log().read_parts(
            from_offset.max(self.start_offset()),
            max_messages,
            self.next_offset(),
            out,
            parts,
        )
    }

    /// [`JournalLog::read_into`] over what a poll may see.
    #[cfg(test)]
    pub fn read_into(
        &self,
        from_offset: u64,
        max_messages: u32,
        out: &mut Vec<u8>,
    ) -> Result<ReadOutcome, StorageError> {
        self.log().read_into(
            from_offset.max(self.start_offset()),
            max_messages,
            self.next_offset(),
            out,
        )
    }

    /// The first retained, committed message appended at or after `timestamp_us`, if any
    /// (timestamps never go back, so when the first such batch was purged or trimmed, every
    /// retained message qualifies).
    pub fn offset_at_timestamp(&self, timestamp_us: u64) -> Option<u64> {
        self.log()
            .offset_at_timestamp(timestamp_us, self.next_offset())
            .map(|offset| offset.max(self.start_offset()))
            .filter(|&offset| offset < self.next_offset())
    }

    pub fn stats(&self) -> PartitionStats {
        PartitionStats {
            segments_count: u32::try_from(self.log().segments().len()).unwrap_or(u32::MAX),
            messages_count: (self.next_offset() - self.start_offset())
                .saturating_sub(self.log().offsets_skipped_from(self.start_offset())),
            size_bytes: self.log().size_bytes(),
        }
    }

    /// The segments retention may still trim, oldest first: sealed and ending above the start
    /// offset, and never the one holding the newest message (nor the segments of ops after
    /// it), so a trim through them keeps the newest messages.
    pub fn sealed_retained_segments(&self) -> Vec<JournalSegment> {
        let (start_offset, next_offset) = (self.start_offset(), self.next_offset());
        let mut segments = self.log().segments();
        segments.retain(|segment| segment.end_offset > start_offset && segment.end_offset < next_offset);
        segments
    }

    /// Remove the segments the group no longer needs: every op in them at or below its
    /// checkpoint, every message below its start offset (after a purge or a trim) and below
    /// its checkpoint's start offset (a state transfer ships the checkpoint with the log
    /// from there: a trim applied after the checkpoint releases nothing until a checkpoint
    /// holds it). When the checkpoint lags, checkpoint first (a quiet partition would
    /// otherwise wait for the interval's ops). Returns what went.
    pub fn remove_released_segments(&mut self) -> Result<Vec<JournalSegment>, PartitionError> {
        let start_offset = self.start_offset();
        let Some(last_released) = self
            .log()
            .segments()
            .windows(2)
            .take_while(|pair| pair[1].base_offset <= start_offset)
            .last()
            .map(|pair| pair[1].first_op)
        else {
            return Ok(Vec::new());
        };
        let mut checkpoint_start = self.checkpoint_start_offset()?;
        if last_released > self.checkpoint_op() + 1 || checkpoint_start < start_offset {
            self.checkpoint()?;
            checkpoint_start = self.checkpoint_start_offset()?;
        }
        let below_op = self.checkpoint_op() + 1;
        self.journal_mut()
            .log
            .remove_oldest_segments(below_op, start_offset.min(checkpoint_start))
            .map_err(|error| PartitionError::Group(self.journal().storage_error(error)))
    }

    /// The start offset of the state the durable checkpoint holds (0 before the first).
    fn checkpoint_start_offset(&self) -> Result<u64, PartitionError> {
        let Some(bytes) = self.checkpoint_state_machine()? else {
            return Ok(0);
        };
        let mut machine = PartitionMachine::new(self.journal().partition_id);
        machine.restore(&bytes).map_err(|reason| {
            PartitionError::Group(GroupError::Damaged {
                dir: self.journal().dir.clone(),
                reason: format!("the durable checkpoint's machine state does not decode: {reason}"),
            })
        })?;
        Ok(machine.state().start_offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::client_batch;
    use cairn_machine::partition::{OPERATION_STORE_OFFSET, Owner, decode_append_reply, encode_append};

    const GROUP: u64 = 7;
    const PARTITION_ID: u32 = 3;

    fn params() -> LogParams {
        LogParams::new(
            PARTITION_ID,
            JournalOptions {
                segment_size_bytes: 4096,
                relaxed: false,
            },
        )
    }

    /// The test parameters over a disk whose faults the test sets.
    fn faulty_params(relaxed: bool) -> (Arc<crate::test_support::Faults>, LogParams) {
        let faults = Arc::new(crate::test_support::Faults::default());
        let params = LogParams {
            relaxed,
            disk: Arc::new(crate::test_support::FaultyDisk {
                faults: Arc::clone(&faults),
            }),
            ..params()
        };
        (faults, params)
    }

    /// Append `sends` requests of two batches each; returns every base offset minted.
    fn append(group: &mut PartitionGroup, sends: u32) -> Vec<u64> {
        let mut minted = Vec::new();
        for send in 0..sends {
            let first = client_batch(1 + send % 3, 20, send as u8);
            let second = client_batch(2, 30, send as u8 ^ 0x55);
            let body = encode_append(1_000 + u64::from(send), &[&first, &second]);
            let reply = group.submit(OPERATION_APPEND, &body).expect("append");
            minted.extend(decode_append_reply(&reply).expect("appended"));
        }
        minted
    }

    /// Appends and an offset store come back after a restart, with the same state: the
    /// replica reads every op above its checkpoint back from the journal (recovered as
    /// headers) to apply it, across a checkpoint and several segments.
    #[test]
    fn a_restart_recovers_every_op_from_the_segment_log() {
        let temp = tempfile::tempdir().expect("tempdir");
        let dir = temp.path().join("partition");
        let mut group = open(&dir, GROUP, params()).expect("format");
        let minted = append(&mut group, 300);
        // Offsets continue, each batch where the last one ended.
        assert_eq!(minted.first(), Some(&0));
        assert!(minted.windows(2).all(|pair| pair[0] < pair[1]));
        let owner = Owner::Consumer(9);
        let store = partition::encode_offset_op(&owner, Some(17));
        group.submit(OPERATION_STORE_OFFSET, &store).expect("store");
        let before = group.state_machine().state().clone();
        assert!(group.commit_op() > Shape::PARTITION.checkpoint_interval_ops);
        let segments = segment_files(&dir.join(LOG_DIR)).len();
        assert!(segments > 3, "{segments} segments");
        drop(group);

        let mut group = open(&dir, GROUP, params()).expect("recover");
        assert_eq!(group.state_machine().state(), &before);
        assert_eq!(group.state_machine().state().offsets.get(&owner), Some(&17));
        // And it goes on from there.
        let next = append(&mut group, 1);
        assert_eq!(next.first(), Some(&before.next_offset));
        assert!(group.state_machine().fault().is_none());
    }

    /// `relaxed` mode over the simulated disk (the group's own files are real, its journal
    /// simulated): appends are acknowledged before any barrier; a process kill loses none of
    /// them; a power loss may lose the unflushed ones, but their offsets are never minted
    /// again; flushed ones survive it; a clean stop leaves no gap.
    #[test]
    fn relaxed_appends_survive_a_kill_and_lost_offsets_are_never_minted_again() {
        use cairn_storage::sim_disk::SimDisk;
        let temp = tempfile::tempdir().expect("tempdir");
        let dir = temp.path().join("partition");
        let disk = SimDisk::new();
        let params = LogParams {
            relaxed: true,
            disk: Arc::new(disk.clone()),
            ..params()
        };
        let send = |group: &mut PartitionGroup, fill: u8| -> u64 {
            group
                .append(1_000, &[&client_batch(2, 40, fill)])
                .expect("append")[0]
        };
        let mut group = open(&dir, GROUP, params.clone()).expect("format");
        for fill in 0..10 {
            send(&mut group, fill);
        }
        let end = group.next_offset();
        assert_eq!(end, 20);
        assert!(
            group.log().durable_op() < group.log().last_op(),
            "acknowledged before a barrier covered them"
        );
        drop(group);
        disk.kill_process();

        let mut group = open(&dir, GROUP, params.clone()).expect("reopen after a kill");
        assert_eq!(
            poll_all(&group, 0).len(),
            20,
            "a kill loses no acknowledged message"
        );
        let resumed = send(&mut group, 10);
        assert!(resumed > end, "minting resumes above the reservation: {resumed}");
        assert_eq!(poll_all(&group, 0).len(), 22);
        assert_eq!(
            group.stats().messages_count,
            22,
            "skipped offsets hold no message"
        );
        assert_eq!(group.last_offset(), Some(resumed + 1));

        group.flush().expect("flush");
        let flushed = poll_all(&group, 0);
        for fill in 11..20 {
            send(&mut group, fill);
        }
        let handed_out_end = group.next_offset();
        drop(group);
        disk.crash(3);

        let mut group = open(&dir, GROUP, params.clone()).expect("reopen after a power loss");
        let kept = poll_all(&group, 0);
        assert_eq!(
            kept[..flushed.len()],
            flushed[..],
            "flushed messages survive a power loss"
        );
        let next = send(&mut group, 20);
        assert!(
            next >= handed_out_end,
            "offset {next} minted again: offsets up to {handed_out_end} were handed out before the power loss"
        );

        // A clean stop gives the reservation back: no skip at the next start.
        group.close().expect("clean stop");
        let end = group.next_offset();
        drop(group);
        disk.kill_process();
        let mut group = open(&dir, GROUP, params).expect("reopen after a clean stop");
        assert_eq!(send(&mut group, 21), end, "no gap after a clean stop");
    }

    /// Every message a poll of everything from `from` returns: (offset, timestamp, first
    /// payload byte).
    fn poll_all(group: &PartitionGroup, from: u64) -> Vec<(u64, u64, u8)> {
        let mut out = vec![0u8; 64];
        let outcome = group.read_into(from, u32::MAX, &mut out).expect("poll");
        let messages: Vec<(u64, u64, u8)> = batch::messages(&out[64..])
            .expect("whole batches")
            .iter()
            .map(|message| (message.offset, message.timestamp, message.payload[0]))
            .collect();
        assert_eq!(outcome.messages_count as usize, messages.len());
        messages
    }

    /// The server's view of a partition group: appends mint contiguous offsets, polls see
    /// what is retained and committed, stored offsets are bounded by the log, a trim and a
    /// purge move the start, the segments they and the checkpoint release are removed, and
    /// all of it comes back after a restart.
    #[test]
    fn the_partition_api_over_a_group() {
        let temp = tempfile::tempdir().expect("tempdir");
        let dir = temp.path().join("partition");
        let mut group = open(&dir, GROUP, params()).expect("format");
        let mut bases = Vec::new();
        for send in 0..300u64 {
            let first = client_batch(2, 20, send as u8);
            let second = client_batch(1, 30, send as u8);
            let minted = group.append(10_000 + send, &[&first, &second]).expect("append");
            assert_eq!(minted.len(), 2);
            bases.push(minted[0]);
        }
        assert_eq!((group.start_offset(), group.next_offset()), (0, 900));
        assert_eq!((group.first_offset(), group.last_offset()), (Some(0), Some(899)));
        let all = poll_all(&group, 0);
        assert_eq!(all.len(), 900);
        assert!(
            all.iter()
                .enumerate()
                .all(|(index, message)| message.0 == index as u64)
        );
        assert_eq!(all[3], (3, 10_001, 1), "send 1's first message");
        assert_eq!(group.offset_at_timestamp(10_010), Some(bases[10]));
        assert_eq!(group.offset_at_timestamp(20_000), None);
        assert_eq!(group.stats().messages_count, 900);

        // Offsets: bounded by the log's end; a delete of nothing is refused.
        let owner = Owner::Consumer(4);
        group.store_offset(&owner, 899).expect("store");
        let ops = group.log().last_op();
        group.store_offset(&owner, 899).expect("the same again");
        assert_eq!(
            group.log().last_op(),
            ops,
            "a store that changes nothing takes no op"
        );
        assert!(matches!(
            group.store_offset(&owner, 900),
            Err(PartitionError::Status(cairn_wire::codes::INVALID_OFFSET))
        ));
        assert_eq!(group.stored_offset(&owner), Some(899));
        group.delete_offset(&owner).expect("delete");
        assert!(matches!(
            group.delete_offset(&owner),
            Err(PartitionError::Status(
                cairn_wire::codes::CONSUMER_OFFSET_NOT_FOUND
            ))
        ));

        // Retention trims up to the end of the third sealed segment; polls start there.
        let sealed = group.sealed_retained_segments();
        assert!(sealed.len() > 4, "{sealed:?}");
        let trim_to = sealed[2].end_offset;
        group.trim(trim_to).expect("trim");
        assert_eq!(group.start_offset(), trim_to);
        assert_eq!(poll_all(&group, 0), all[trim_to as usize..].to_vec());
        assert_eq!(group.offset_at_timestamp(0), Some(trim_to));
        assert_eq!(group.sealed_retained_segments()[0].base_offset, trim_to);
        // The checkpoint is past them (300 ops, one every 256), so the three go.
        assert!(group.checkpoint_op() >= 256);
        let removed = group.remove_released_segments().expect("remove");
        assert_eq!(removed.len(), 3, "{removed:?}");
        assert_eq!(group.log().first_offset(), trim_to);
        // They went only once a checkpoint held the trim: a state transfer ships the
        // checkpoint with the log from the checkpoint's start offset.
        assert_eq!(group.checkpoint_start_offset().expect("the checkpoint"), trim_to);
        let before = group.state_machine().state().clone();
        drop(group);

        let mut group = open(&dir, GROUP, params()).expect("recover after a removal");
        assert_eq!(group.state_machine().state(), &before);
        assert_eq!(poll_all(&group, 0), all[trim_to as usize..].to_vec());
        assert_eq!(
            group.append(20_000, &[&client_batch(1, 8, 7)]).expect("append"),
            vec![900]
        );

        // A purge: nothing left to poll, offsets keep counting, stored offsets cleared.
        group.store_offset(&owner, 5).expect("store");
        group.purge(901).expect("purge");
        assert_eq!((group.first_offset(), group.last_offset()), (None, None));
        assert!(poll_all(&group, 0).is_empty());
        assert_eq!(group.offset_at_timestamp(0), None);
        assert_eq!(group.stored_offset(&owner), None);
        assert_eq!(group.stats().messages_count, 0);
        assert_eq!(
            group.append(20_001, &[&client_batch(1, 8, 7)]).expect("append"),
            vec![901]
        );
        assert_eq!(poll_all(&group, 0).len(), 1);
        // The purged segments go at once: the group checkpoints off the interval to let them.
        let checkpoint_before = group.checkpoint_op();
        let removed = group.remove_released_segments().expect("release");
        assert!(!removed.is_empty());
        assert!(group.checkpoint_op() > checkpoint_before);
        assert_eq!(group.stats().segments_count, 1);
        assert_eq!(poll_all(&group, 0).len(), 1);
        drop(group);
        let group = open(&dir, GROUP, params()).expect("recover after the purge");
        assert_eq!(poll_all(&group, 0).len(), 1);
        assert_eq!(group.next_offset(), 902);
    }

    /// A write the disk refuses (no space: half written, then ENOSPC) is undone: the request
    /// fails, nothing of it is visible, and the group goes on from its files once space
    /// returns, minting the offsets the failed op never handed out. A failed barrier instead
    /// stops the group until it is reopened, which drops the op never reported durable.
    #[test]
    fn a_write_the_disk_refuses_is_undone_and_the_group_goes_on() {
        use crate::test_support::DISK_FULL;
        use std::sync::atomic::Ordering;
        let temp = tempfile::tempdir().expect("tempdir");
        let dir = temp.path().join("partition");
        let (faults, params) = faulty_params(false);
        let mut group = open(&dir, GROUP, params.clone()).expect("format");
        for send in 0..5 {
            group
                .append(100 + send, &[&client_batch(2, 50, send as u8)])
                .expect("append");
        }
        let owner = Owner::Consumer(1);
        let before = group.state_machine().state().clone();
        let polled = poll_all(&group, 0);

        faults.log_writes_to_fail.store(DISK_FULL, Ordering::Relaxed);
        for attempt in 0..3 {
            match group.append(200 + attempt, &[&client_batch(3, 50, 9)]) {
                Err(PartitionError::Group(GroupError::WriteUndone { reason, .. })) => {
                    assert!(reason.contains("No space left"), "{reason}");
                }
                other => panic!("expected an undone write, got {other:?}"),
            }
        }
        assert!(matches!(
            group.store_offset(&owner, 3),
            Err(PartitionError::Group(GroupError::WriteUndone { .. }))
        ));
        assert_eq!(group.stopped_reason(), None);
        assert_eq!(group.state_machine().state(), &before);
        assert_eq!(poll_all(&group, 0), polled);

        // Space returns: the next append gets the offsets the failed ones never handed out.
        faults.log_writes_to_fail.store(0, Ordering::Relaxed);
        assert_eq!(
            group.append(300, &[&client_batch(1, 50, 1)]).expect("append"),
            vec![before.next_offset]
        );
        group.store_offset(&owner, 3).expect("store");
        let after = group.state_machine().state().clone();

        // A failed barrier stops the group; the op it covered is never acknowledged.
        faults.syncs_fail.store(true, Ordering::Relaxed);
        assert!(group.append(400, &[&client_batch(1, 50, 2)]).is_err());
        assert!(group.stopped_reason().is_some());
        assert!(matches!(
            group.append(401, &[&client_batch(1, 50, 2)]),
            Err(PartitionError::Group(GroupError::Stopped { .. }))
        ));
        drop(group);
        faults.syncs_fail.store(false, Ordering::Relaxed);
        let group = open(&dir, GROUP, params).expect("reopen");
        assert_eq!(group.state_machine().state(), &after);
        let mut out = vec![0u8; 64];
        let mut parts = Vec::new();
        let outcome = group.read_parts(0, u32::MAX, &mut out, &mut parts).expect("poll");
        assert_eq!(u64::from(outcome.messages_count), after.next_offset);
    }

    /// In `relaxed` mode too, a write the disk refuses is undone without losing anything, and
    /// the group goes on without a gap: the reopen after it gives the reservation back first
    /// (nothing was lost, so there is nothing to skip).
    #[test]
    fn a_relaxed_write_the_disk_refuses_is_undone_without_a_gap() {
        use crate::test_support::DISK_FULL;
        use std::sync::atomic::Ordering;
        let temp = tempfile::tempdir().expect("tempdir");
        let dir = temp.path().join("partition");
        let (faults, params) = faulty_params(true);
        let mut group = open(&dir, GROUP, params).expect("format");
        for send in 0..5 {
            group
                .append(100 + send, &[&client_batch(2, 50, send as u8)])
                .expect("append");
        }
        let before = group.state_machine().state().clone();
        let polled = poll_all(&group, 0);
        faults.log_writes_to_fail.store(DISK_FULL, Ordering::Relaxed);
        for attempt in 0..3 {
            assert!(matches!(
                group.append(200 + attempt, &[&client_batch(3, 50, 9)]),
                Err(PartitionError::Group(GroupError::WriteUndone { .. }))
            ));
        }
        assert_eq!(
            poll_all(&group, 0),
            polled,
            "the acknowledged appends are all there"
        );
        faults.log_writes_to_fail.store(0, Ordering::Relaxed);
        assert_eq!(
            group.append(300, &[&client_batch(1, 50, 1)]).expect("append"),
            vec![before.next_offset],
            "no offsets skipped after an undone write"
        );
    }

    /// A write the disk refuses in the middle of a batch: the ops before it are made durable
    /// and keep their offsets, the refused op and the ones after it are never taken (undone),
    /// and the group goes on from its files without a gap; nothing acknowledged is lost.
    #[test]
    fn a_write_refused_in_the_middle_of_a_batch_keeps_the_ops_before_it() {
        use std::sync::atomic::Ordering;
        let temp = tempfile::tempdir().expect("tempdir");
        let dir = temp.path().join("partition");
        let (faults, params) = faulty_params(false);
        let mut group = open(&dir, GROUP, params.clone()).expect("format");
        let batch = client_batch(2, 50, 1);
        let batches: Vec<&[u8]> = vec![&batch];
        // The lanes register first (their own writes).
        let appends: Vec<(u64, &[&[u8]])> = (0..4).map(|n| (100 + n, &batches[..])).collect();
        assert!(group.append_copies(&appends).iter().all(Result::is_ok));
        let next = group.next_offset();
        // The third op's write fails; the two before it are written.
        faults.log_writes_before_failing.store(2, Ordering::Relaxed);
        faults.log_writes_to_fail.store(1, Ordering::Relaxed);
        let results = group.append_copies(&appends);
        assert_eq!(
            results[0].as_ref().expect("durable before the failure"),
            &vec![next]
        );
        assert_eq!(
            results[1].as_ref().expect("durable before the failure"),
            &vec![next + 2]
        );
        for result in &results[2..] {
            assert!(
                matches!(result, Err(PartitionError::Group(GroupError::WriteUndone { .. }))),
                "{result:?}"
            );
        }
        assert_eq!(group.stopped_reason(), None);
        assert_eq!(group.next_offset(), next + 4);
        // It goes on where the taken ops ended, and everything taken survives a restart.
        let after = group.append_copies(&appends[..1]);
        assert_eq!(after[0].as_ref().expect("append"), &vec![next + 4]);
        let messages = poll_all(&group, 0).len();
        drop(group);
        let group = open(&dir, GROUP, params).expect("reopen");
        assert_eq!(poll_all(&group, 0).len(), messages);
        assert_eq!(group.next_offset(), next + 6);
    }

    /// `cairn check` reads a partition group in place: healthy when it opens as it is,
    /// recoverable with a tail above the frontier (which it leaves there), damaged with a
    /// flipped byte below it or under another partition's name; a record-log directory is
    /// left to the storage checker.
    #[test]
    fn the_checker_reads_a_partition_group_in_place() {
        use cairn_storage::check::Verdict;
        let temp = tempfile::tempdir().expect("tempdir");
        let dir = temp.path().join("partition");
        let ids = (1, 2, PARTITION_ID);
        let mut group = open(&dir, group_id(1, 2, PARTITION_ID), params()).expect("format");
        for send in 0..40u64 {
            group
                .append(1_000 + send, &[&client_batch(3, 40, send as u8)])
                .expect("append");
        }
        group.store_offset(&Owner::Consumer(1), 7).expect("store");
        drop(group);

        let report = check(&dir, ids);
        assert_eq!(report.verdict(), Verdict::Healthy, "{report}");
        let log = report.log.expect("a log summary");
        assert_eq!((log.start_offset, log.end_offset, log.messages), (0, 120, 120));
        assert_eq!(log.batch_records, 40);
        assert_eq!(report.resume_offset, Some(120));

        // A tail above the frontier: recoverable, and the checker leaves it in place.
        let segment = segment_files(&dir.join(LOG_DIR)).pop().expect("a segment");
        let mut bytes = std::fs::read(&segment).expect("segment");
        let synced_len = bytes.len();
        bytes.extend_from_slice(&[0x5A; 100]);
        std::fs::write(&segment, &bytes).expect("tear");
        let report = check(&dir, ids);
        assert_eq!(report.verdict(), Verdict::Recoverable, "{report}");
        assert!(report.to_string().contains("drop 100 bytes"), "{report}");
        assert_eq!(std::fs::read(&segment).expect("segment"), bytes);

        // Under another partition's name: its prepares name another group.
        let report = check(&dir, (9, 2, PARTITION_ID));
        assert_eq!(report.verdict(), Verdict::Damaged, "{report}");

        // A flipped byte below the frontier.
        bytes[synced_len / 2] ^= 0x01;
        std::fs::write(&segment, &bytes).expect("flip");
        let report = check(&dir, ids);
        assert_eq!(report.verdict(), Verdict::Damaged, "{report}");
        assert_eq!(std::fs::read(&segment).expect("segment"), bytes);

        // No superblock: `partition::check` reports it as refused (no group at all).
        let report = crate::partition::check(&temp.path().join("elsewhere"), ids);
        assert_eq!(report.verdict(), Verdict::Damaged, "{report}");
    }

    #[test]
    fn a_lone_batch_with_room_in_front_becomes_the_request_in_its_own_buffer() {
        let batch = client_batch(2, 40, 1);
        let received = |headroom: usize| {
            let mut frame = vec![0xEE; headroom];
            frame.extend_from_slice(&batch);
            ReceivedBatch::with_headroom(Bytes::from(frame), headroom)
        };
        let expected = partition::encode_append(7, &[&batch]);
        // Alone in its buffer, with room: the prefix goes in front, nothing is copied.
        let alone = received(20);
        let batch_at = alone.as_ptr();
        let request = append_request(Append {
            timestamp_us: 7,
            batches: vec![alone],
        });
        assert_eq!(&request[..], &expected[..]);
        assert_eq!(
            request[partition::APPEND_ONE_PREFIX_BYTES..].as_ptr(),
            batch_at,
            "not copied"
        );
        // As the TCP shell reads a frame (a `BytesMut`, frozen), through the machine's
        // prepare: stamped where it arrived.
        let mut read = bytes::BytesMut::with_capacity(20 + batch.len());
        read.extend_from_slice(&[0xEE; 20]);
        read.extend_from_slice(&batch);
        let as_read = ReceivedBatch::with_headroom(read.freeze(), 20);
        let batch_at = as_read.as_ptr();
        let request = append_request(Append {
            timestamp_us: 7,
            batches: vec![as_read],
        });
        let machine = PartitionMachine::new(GROUP as u32);
        let (prepared, _) =
            cairn_vsr::replica::StateMachine::prepare(&machine, 1, 0, OPERATION_APPEND, request, 0);
        assert_eq!(
            prepared[partition::APPEND_ONE_PREFIX_BYTES..].as_ptr(),
            batch_at,
            "stamped in place"
        );
        let stamped = batch::header(&prepared[partition::APPEND_ONE_PREFIX_BYTES..]).expect("a header");
        assert_eq!((stamped.base_offset, stamped.base_timestamp), (0, 7));
        // Held elsewhere too, too little room, or two batches: copied, the same bytes.
        let shared = received(20);
        let (buffer, headroom) = shared.clone().into_buffer();
        let held = ReceivedBatch::with_headroom(buffer, headroom);
        let request = append_request(Append {
            timestamp_us: 7,
            batches: vec![held],
        });
        assert_eq!(&request[..], &expected[..]);
        assert_ne!(
            request[partition::APPEND_ONE_PREFIX_BYTES..].as_ptr(),
            shared.as_ptr()
        );
        let (untouched, _) = shared.into_buffer();
        assert_eq!(&untouched[..20], &[0xEE; 20], "a shared buffer is left as it was");
        let request = append_request(Append {
            timestamp_us: 7,
            batches: vec![received(15)],
        });
        assert_eq!(&request[..], &expected[..]);
        let request = append_request(Append {
            timestamp_us: 7,
            batches: vec![received(20), received(20)],
        });
        assert_eq!(&request[..], &partition::encode_append(7, &[&batch, &batch])[..]);
    }

    /// An append prepare of op `op`, its batches stamped from `next_offset` as the primary's
    /// machine stamps them.
    fn append_prepare(op: u64, next_offset: u64, fill: u8) -> Message {
        let timestamp_us = 5_000 + op;
        let mut batches = vec![client_batch(2, 40, fill), client_batch(3, 10, fill ^ 1)];
        let mut offset = next_offset;
        for bytes in &mut batches {
            batch::stamp(bytes, u64::from(PARTITION_ID), offset, timestamp_us);
            offset += u64::from(batch::header(bytes).expect("header").message_count);
        }
        let parts: Vec<&[u8]> = batches.iter().map(Vec::as_slice).collect();
        let mut header = Header::new(Command::Prepare, 0xC1);
        header.group = GROUP;
        header.op = op;
        header.view = 2;
        header.operation = OPERATION_APPEND;
        // Sealed as the primary seals an append: the checksum of its batch headers.
        let body = Bytes::from(encode_append(timestamp_us, &parts));
        let checksum_body = partition::append_body_checksum(&body).expect("an append body");
        Message::with_body_checksum(header, body, checksum_body)
    }

    /// A view change replaced op 2 (an append) with another append: the rewrite cuts the
    /// journal back and stores the new batches as batch records from where op 2 began, and
    /// both ops read back as the prepares written.
    #[test]
    fn a_rewritten_append_is_stored_as_batches_where_the_old_one_began() {
        let temp = tempfile::tempdir().expect("tempdir");
        let mut journal = LogJournal::create(temp.path(), &params(), (1, GROUP)).expect("create");
        let first = append_prepare(1, 0, 1);
        journal.write_prepare(&first).expect("op 1");
        let old = append_prepare(2, 5, 2);
        journal.write_prepare(&old).expect("op 2");
        let next = append_prepare(3, 10, 3);
        journal.write_prepare(&next).expect("op 3");
        // The new op 2 continues op 1 as the old one did (offset 5), with other messages.
        let new = append_prepare(2, 5, 9);
        assert_ne!(new.header.checksum, old.header.checksum);
        journal.write_prepare(&new).expect("rewrite op 2");
        assert_eq!(journal.log.last_op(), 2);
        let extent = journal.log.extent(2).expect("op 2");
        assert_eq!(
            (extent.batch_count, extent.message_count),
            (2, 5),
            "stored as batch records"
        );
        assert_eq!(journal.read_prepare(1, first.header.checksum), Some(first));
        assert_eq!(journal.read_prepare(2, new.header.checksum), Some(new));
        assert_eq!(journal.read_prepare(2, old.header.checksum), None);
    }

    /// A format interrupted after the journal was created (no superblock yet) formats again.
    #[test]
    fn an_interrupted_format_formats_again() {
        let temp = tempfile::tempdir().expect("tempdir");
        let dir = temp.path().join("partition");
        std::fs::create_dir_all(&dir).expect("dir");
        drop(LogJournal::create(&dir, &params(), (1, GROUP)).expect("create"));
        assert!(!dir.join("superblock").exists());
        let mut group = open(&dir, GROUP, params()).expect("formats over the leftovers");
        assert_eq!(append(&mut group, 1).first(), Some(&0));
    }

    /// Bytes above the journal's durable frontier (a write never reported durable) are
    /// dropped at open; a flipped byte below it is damage, and the group refuses to start.
    #[test]
    fn a_torn_tail_is_dropped_and_damage_is_refused() {
        let temp = tempfile::tempdir().expect("tempdir");
        let dir = temp.path().join("partition");
        let mut group = open(&dir, GROUP, params()).expect("format");
        append(&mut group, 5);
        let before = group.state_machine().state().clone();
        drop(group);
        // The active segment: the last one.
        let segment = segment_files(&dir.join(LOG_DIR)).pop().expect("a segment");
        let mut bytes = std::fs::read(&segment).expect("segment");
        let synced_len = bytes.len();
        bytes.extend_from_slice(&[0xA5; 300]);
        std::fs::write(&segment, &bytes).expect("tear");
        // The checker's read-only open recovers the same state and leaves the tail in place.
        let read_only = PartitionGroup::open_read_only_with(&dir, GROUP, &params(), || {
            PartitionMachine::new(PARTITION_ID)
        })
        .expect("a read-only open")
        .expect("a formatted group");
        assert_eq!(read_only.state_machine().state(), &before);
        drop(read_only);
        assert_eq!(std::fs::read(&segment).expect("segment"), bytes);
        let group = open(&dir, GROUP, params()).expect("a torn tail opens");
        assert_eq!(group.state_machine().state(), &before);
        drop(group);
        assert_eq!(std::fs::read(&segment).expect("segment").len(), synced_len);

        let mut bytes = std::fs::read(&segment).expect("segment");
        bytes[synced_len / 2] ^= 0x10;
        std::fs::write(&segment, &bytes).expect("flip");
        match open(&dir, GROUP, params()) {
            Err(GroupError::Damaged { reason, .. }) => {
                assert!(reason.contains("damaged"), "{reason}");
            }
            Err(other) => panic!("refused for another reason: {other}"),
            Ok(_) => panic!("damage below the frontier was accepted"),
        }
        assert_eq!(
            std::fs::read(&segment).expect("segment"),
            bytes,
            "a refused open changed the log"
        );
    }
}

#[cfg(test)]
mod sim;
