//! A partition as a replication group of one replica whose journal is the partition's
//! segment log (`docs/replication.md`, "The partition group"): [`LogJournal`] is the
//! [`GroupJournal`] that [`LocalGroup`] runs a [`PartitionMachine`] over.
//!
//! ```text
//! <group dir>/cluster, superblock, checkpoints   as for every group (`node`)
//!            /log/                               the journal log (`cairn_storage::journal`)
//! ```
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
//! Not wired into the server yet: the server's sends still take the writer's direct path
//! (issue 13, next step).

use crate::node::{GroupError, GroupJournal, LocalGroup};
use cairn_machine::partition::{self, OPERATION_APPEND, PartitionMachine};
use cairn_storage::io::RealDisk;
use cairn_storage::journal::{JournalConfig, JournalLog};
use cairn_storage::record::Chain;
use cairn_vsr::constants::{HEADER_SIZE, Shape};
use cairn_vsr::header::{Command, Header, Message};
use cairn_vsr::journal::{SlotState, read_back};
use cairn_wire::batch;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The journal log's directory inside the group directory.
const LOG_DIR: &str = "log";

/// What a partition's journal needs besides its directory.
#[derive(Debug, Clone, Copy)]
pub struct LogParams {
    /// The partition's id in its records (and the machine's).
    pub partition_id: u32,
    pub segment_size_bytes: u64,
}

/// A partition group's journal: its segment log (see the module doc).
pub struct LogJournal {
    dir: PathBuf,
    log: JournalLog,
    partition_id: u32,
}

impl LogJournal {
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

    /// The journal opened over `log`, and what its window holds for the replica.
    #[allow(clippy::type_complexity)]
    fn recovered(
        log_dir: PathBuf,
        log: JournalLog,
        partition_id: u32,
        cluster: u128,
        group: u64,
    ) -> Result<(LogJournal, Vec<SlotState>, Vec<String>), GroupError> {
        let journal = LogJournal {
            dir: log_dir,
            log,
            partition_id,
        };
        let journal_slots = <Self as GroupJournal>::SHAPE.journal_slots;
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

    fn create(dir: &Path, params: &LogParams) -> Result<LogJournal, GroupError> {
        let log_dir = dir.join(LOG_DIR);
        // What an interrupted earlier format left here was never used (the superblock, written
        // last, is what makes a group formatted): start empty.
        match std::fs::remove_dir_all(&log_dir) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(GroupError::Io {
                    path: log_dir,
                    source,
                });
            }
        }
        let log = JournalLog::create_on(
            Arc::new(RealDisk),
            &log_dir,
            params.partition_id,
            JournalConfig {
                segment_size_bytes: params.segment_size_bytes,
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
        })
    }

    fn open(
        dir: &Path,
        params: &LogParams,
        read_only: bool,
        cluster: u128,
        group: u64,
    ) -> Result<(LogJournal, Vec<SlotState>, Vec<String>), GroupError> {
        let log_dir = dir.join(LOG_DIR);
        let config = JournalConfig {
            segment_size_bytes: params.segment_size_bytes,
        };
        let refused = |error: cairn_storage::StorageError| GroupError::Refused {
            dir: log_dir.clone(),
            reason: format!(
                "the partition's journal cannot be opened, its files are left as they are: {error}"
            ),
        };
        if read_only {
            // What the open would keep, read in place (the checker's view).
            let (log, _) =
                JournalLog::open_read_only_on(Arc::new(RealDisk), &log_dir, params.partition_id, config)
                    .map_err(refused)?;
            return Self::recovered(log_dir, log, params.partition_id, cluster, group);
        }
        let (log, recovery) = JournalLog::open_on(Arc::new(RealDisk), &log_dir, params.partition_id, config)
            .map_err(refused)?;
        if recovery.dropped_bytes > 0 {
            tracing::warn!(
                dir = %log_dir.display(),
                bytes = recovery.dropped_bytes,
                durable_op = recovery.durable_op,
                "dropped the journal's bytes above its durable frontier: writes never reported durable (an unsynced or partly written op, or what a cut had removed)"
            );
        }
        Self::recovered(log_dir, log, params.partition_id, cluster, group)
    }

    fn write_prepare(&mut self, message: &Message) -> Result<(), GroupError> {
        let header = message.header.encode();
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
                self.log.write_op(
                    message.header.op,
                    message.header.view,
                    message.header.timestamp,
                    &payload,
                    &[],
                )
            }
        };
        written
            .and_then(|()| self.log.sync())
            .map(|_| ())
            .map_err(|error| self.storage_error(error))
    }

    fn read_prepare(&mut self, op: u64, checksum: u128) -> Option<Message> {
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
        let bytes = if stored.batches.is_empty() {
            stored.op_payload
        } else if stored.op_payload.len() == HEADER_SIZE
            && stored.batches.len() <= partition::APPEND_BATCHES_MAX
        {
            let batches: Vec<&[u8]> = stored.batches.iter().map(Vec::as_slice).collect();
            [
                stored.op_payload,
                partition::encode_append(stored.timestamp_us, &batches),
            ]
            .concat()
        } else {
            Vec::new()
        };
        let prepare = read_back(&bytes, op, checksum);
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
}

/// A partition group of one replica over the files of `dir`.
pub type PartitionGroup = LocalGroup<PartitionMachine, LogJournal>;

/// Open (or format) the partition group in `dir`.
pub fn open(dir: &Path, group: u64, params: LogParams) -> Result<PartitionGroup, GroupError> {
    LocalGroup::open_with(dir, group, &params, || PartitionMachine::new(params.partition_id))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::client_batch;
    use cairn_machine::partition::{OPERATION_STORE_OFFSET, Owner, decode_append_reply, encode_append};

    const GROUP: u64 = 7;
    const PARAMS: LogParams = LogParams {
        partition_id: 3,
        segment_size_bytes: 4096,
    };

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
        let mut group = open(&dir, GROUP, PARAMS).expect("format");
        let minted = append(&mut group, 300);
        // Offsets continue, each batch where the last one ended.
        assert_eq!(minted.first(), Some(&0));
        assert!(minted.windows(2).all(|pair| pair[0] < pair[1]));
        let owner = Owner::Consumer(9);
        let store = partition::encode_offset_op(&owner, Some(17));
        group.submit(OPERATION_STORE_OFFSET, &store).expect("store");
        let before = group.state_machine().state().clone();
        assert!(group.commit_op() > Shape::PARTITION.checkpoint_interval_ops);
        let segments = std::fs::read_dir(dir.join(LOG_DIR))
            .expect("log dir")
            .filter(|entry| {
                entry
                    .as_ref()
                    .is_ok_and(|entry| entry.file_name().to_string_lossy().ends_with(".log"))
            })
            .count();
        assert!(segments > 3, "{segments} segments");
        drop(group);

        let mut group = open(&dir, GROUP, PARAMS).expect("recover");
        assert_eq!(group.state_machine().state(), &before);
        assert_eq!(group.state_machine().state().offsets.get(&owner), Some(&17));
        // And it goes on from there.
        let next = append(&mut group, 1);
        assert_eq!(next.first(), Some(&before.next_offset));
        assert!(group.state_machine().fault().is_none());
    }

    /// An append prepare of op `op`, its batches stamped from `next_offset` as the primary's
    /// machine stamps them.
    fn append_prepare(op: u64, next_offset: u64, fill: u8) -> Message {
        let timestamp_us = 5_000 + op;
        let mut batches = vec![client_batch(2, 40, fill), client_batch(3, 10, fill ^ 1)];
        let mut offset = next_offset;
        for bytes in &mut batches {
            batch::stamp(bytes, u64::from(PARAMS.partition_id), offset, timestamp_us);
            offset += u64::from(batch::header(bytes).expect("header").message_count);
        }
        let parts: Vec<&[u8]> = batches.iter().map(Vec::as_slice).collect();
        let mut header = Header::new(Command::Prepare, 0xC1);
        header.group = GROUP;
        header.op = op;
        header.view = 2;
        header.operation = OPERATION_APPEND;
        Message::new(header, Arc::from(encode_append(timestamp_us, &parts)))
    }

    /// A view change replaced op 2 (an append) with another append: the rewrite cuts the
    /// journal back and stores the new batches as batch records from where op 2 began, and
    /// both ops read back as the prepares written.
    #[test]
    fn a_rewritten_append_is_stored_as_batches_where_the_old_one_began() {
        let temp = tempfile::tempdir().expect("tempdir");
        let mut journal = LogJournal::create(temp.path(), &PARAMS).expect("create");
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
        drop(LogJournal::create(&dir, &PARAMS).expect("create"));
        assert!(!dir.join("superblock").exists());
        let mut group = open(&dir, GROUP, PARAMS).expect("formats over the leftovers");
        assert_eq!(append(&mut group, 1).first(), Some(&0));
    }

    /// Bytes above the journal's durable frontier (a write never reported durable) are
    /// dropped at open; a flipped byte below it is damage, and the group refuses to start.
    #[test]
    fn a_torn_tail_is_dropped_and_damage_is_refused() {
        let temp = tempfile::tempdir().expect("tempdir");
        let dir = temp.path().join("partition");
        let mut group = open(&dir, GROUP, PARAMS).expect("format");
        append(&mut group, 5);
        let before = group.state_machine().state().clone();
        drop(group);
        // The active segment: the last one.
        let segment = std::fs::read_dir(dir.join(LOG_DIR))
            .expect("log dir")
            .map(|entry| entry.expect("entry").path())
            .filter(|path| path.extension().is_some_and(|extension| extension == "log"))
            .max()
            .expect("a segment");
        let mut bytes = std::fs::read(&segment).expect("segment");
        let synced_len = bytes.len();
        bytes.extend_from_slice(&[0xA5; 300]);
        std::fs::write(&segment, &bytes).expect("tear");
        // The checker's read-only open recovers the same state and leaves the tail in place.
        let read_only = PartitionGroup::open_read_only_with(&dir, GROUP, &PARAMS, || {
            PartitionMachine::new(PARAMS.partition_id)
        })
        .expect("a read-only open")
        .expect("a formatted group");
        assert_eq!(read_only.state_machine().state(), &before);
        drop(read_only);
        assert_eq!(std::fs::read(&segment).expect("segment"), bytes);
        let group = open(&dir, GROUP, PARAMS).expect("a torn tail opens");
        assert_eq!(group.state_machine().state(), &before);
        drop(group);
        assert_eq!(std::fs::read(&segment).expect("segment").len(), synced_len);

        let mut bytes = std::fs::read(&segment).expect("segment");
        bytes[synced_len / 2] ^= 0x10;
        std::fs::write(&segment, &bytes).expect("flip");
        match open(&dir, GROUP, PARAMS) {
            Err(GroupError::Refused { reason, .. }) => {
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
