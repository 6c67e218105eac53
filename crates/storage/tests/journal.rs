//! The journal log (`cairn_storage::journal`) over the simulated disk: ops written in order,
//! synced, cut back and rewritten, with power losses at random points (unsynced writes lost or
//! torn, unsynced directory operations lost, failing barriers).
//!
//! After every reopen, per seed:
//! - the journal opens (a crash alone never makes it damaged);
//! - every op a successful `sync` covered, and no cut reached since, is there with the
//!   content and view it was written with;
//! - every op that is there holds a content once written at that op (a cut may not have
//!   reached the disk, so an older one may come back above the frontier; the core tells
//!   those apart by its own durable state);
//! - the frontier never goes back behind what a `sync` covered.
//!
//! Half the seeds run the journal in `relaxed` mode (ops acknowledged before a barrier), and
//! some crashes are a process kill (the page cache survives) rather than a power loss. Then
//! also: after a kill every op written (and not cut) is there; after any crash no offset
//! handed out since the last clean stop can be minted again (the log's end, or the offset the
//! open says minting resumes at, is past all of them), and the test skips to that offset as
//! the partition shell does. A clean stop (`sync_for_stop`) leaves no gap.
//!
//! Polls by offset and timestamp lookups are checked against the same model after every
//! reopen and at random points between writes: exactly the messages of the ops there, with
//! their stamped offsets and timestamps, whole batches below the end offset asked for.
//!
//! `CAIRN_SIM_SEEDS=<n>` runs seeds `0..n` (default 1000); `CAIRN_SIM_SEED=<s>` replays one.

mod common;

use cairn_storage::StorageError;
use cairn_storage::io::RealDisk;
use cairn_storage::journal::{CACHE_KEPT_BEHIND_BYTES, JournalConfig, JournalLog};
use cairn_storage::read::ReadPart;
use cairn_storage::record::Chain;
use cairn_storage::sim_disk::{SimDisk, SimRng};
use cairn_wire::batch::BATCH_HEADER_SIZE;
use common::{Message, client_batch, decode_batches};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const PARTITION: u32 = 9;

/// What one op wrote, as the test remembers it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Written {
    view: u32,
    /// The op record's payload (a prepare header and body, in the partition shell).
    op_payload: Vec<u8>,
    /// Client batches (unstamped) of an append; none for another op.
    batches: Vec<Vec<u8>>,
    /// A skip op: the offset minting resumes at.
    skip_to: Option<u64>,
}

/// Whether what the journal read back is `written`: the same view and op record payload, and
/// the same batches apart from the stamped 256-byte header.
fn holds(journal: &JournalLog, op: u64, written: &Written) -> Result<bool, StorageError> {
    let stored = journal.read_op(op)?;
    assert_eq!(
        journal.read_op_record(op)?,
        stored.op_payload,
        "op {op}: the op record alone reads the same"
    );
    Ok(stored.view == written.view
        && stored.op_payload == written.op_payload
        && stored.batches.len() == written.batches.len()
        && stored
            .batches
            .iter()
            .zip(&written.batches)
            .all(|(stored, client)| stored[BATCH_HEADER_SIZE..] == client[BATCH_HEADER_SIZE..]))
}

fn random_written(rng: &mut SimRng, op: u64) -> Written {
    let view = rng.range_inclusive(0, 5) as u32;
    let len = rng.below(40) as usize;
    let op_payload = (0..len)
        .map(|index| (op as u8).wrapping_add(index as u8))
        .collect();
    let batches = if rng.chance(1, 3) {
        Vec::new()
    } else {
        (0..rng.range_inclusive(1, 3))
            .map(|batch| {
                let payloads: Vec<Vec<u8>> = (0..rng.range_inclusive(1, 4))
                    .map(|message| {
                        format!("op {op} batch {batch} message {message} {}", rng.next_u64()).into_bytes()
                    })
                    .collect();
                client_batch(&payloads)
            })
            .collect()
    };
    Written {
        view,
        op_payload,
        batches,
        skip_to: None,
    }
}

/// The timestamp the tests stamp op `op` with.
fn timestamp_of(op: u64) -> u64 {
    1_000 + op
}

/// One stored batch as the model expects polls to see it.
struct ModelBatch {
    base_offset: u64,
    messages: Vec<Message>,
}

/// The batches `current` (contiguous ops from the journal's first) hold, with the offsets the
/// journal stamps from `first_offset` on, and the offset after them.
fn model_batches(current: &BTreeMap<u64, Written>, first_offset: u64) -> (Vec<ModelBatch>, u64) {
    let mut next_offset = first_offset;
    let mut batches = Vec::new();
    for (&op, written) in current {
        if let Some(skip_to) = written.skip_to {
            next_offset = next_offset.max(skip_to);
        }
        for client in &written.batches {
            let mut messages = decode_batches(client);
            for message in &mut messages {
                message.offset += next_offset;
                message.timestamp_us = timestamp_of(op);
            }
            batches.push(ModelBatch {
                base_offset: next_offset,
                messages: messages.clone(),
            });
            next_offset += messages.len() as u64;
        }
    }
    (batches, next_offset)
}

/// What a poll of `max` messages from `from`, seeing whole batches below `end`, returns.
fn model_poll(batches: &[ModelBatch], from: u64, max: u32, end: u64) -> Vec<Message> {
    batches
        .iter()
        .take_while(|batch| batch.base_offset + batch.messages.len() as u64 <= end)
        .flat_map(|batch| batch.messages.iter())
        .filter(|message| message.offset >= from)
        .take(max as usize)
        .cloned()
        .collect()
}

/// Poll the journal as a consumer would and decode the reply's batches. The buffer starts with
/// a reply-header-sized prefix (the no-copy path) or, at random, without one.
fn poll(journal: &JournalLog, rng: &mut SimRng, from: u64, max: u32, end: u64) -> Vec<Message> {
    let prefix = if rng.chance(1, 2) {
        64
    } else {
        rng.below(64) as usize
    };
    let mut out = vec![0xA5; prefix];
    let outcome = journal.read_into(from, max, end, &mut out).expect("a poll reads");
    let messages = decode_batches(&out[prefix..]);
    assert!(
        out[..prefix].iter().all(|&byte| byte == 0xA5),
        "the prefix is kept"
    );
    assert_eq!(outcome.messages_count as usize, messages.len());
    assert_eq!(outcome.last_offset, messages.last().map(|message| message.offset));
    messages
}

/// Polls and timestamp lookups against the model of `current`.
fn check_reads(journal: &JournalLog, current: &BTreeMap<u64, Written>, rng: &mut SimRng, seed: u64) {
    let first_offset = journal.first_offset();
    let end_offset = journal.chain().next_offset;
    let (batches, model_end) = model_batches(current, first_offset);
    let all = model_poll(&batches, 0, u32::MAX, u64::MAX);
    assert_eq!(
        model_end, end_offset,
        "seed {seed}: offsets are contiguous but where a skip says otherwise"
    );
    assert_eq!(
        poll(journal, rng, 0, u32::MAX, u64::MAX),
        all,
        "seed {seed}: a poll of everything"
    );
    for _ in 0..4 {
        let from = first_offset + rng.below(end_offset - first_offset + 2);
        let max = rng.range_inclusive(0, 12) as u32;
        let end = first_offset + rng.below(end_offset - first_offset + 2);
        assert_eq!(
            poll(journal, rng, from, max, end),
            model_poll(&batches, from, max, end),
            "seed {seed}: a poll of {max} from {from} below {end}"
        );
        let timestamp_us = rng.range_inclusive(900, 1_200);
        let expected = batches
            .iter()
            .find(|batch| batch.messages[0].timestamp_us >= timestamp_us)
            .filter(|batch| batch.base_offset + batch.messages.len() as u64 <= end)
            .map(|batch| batch.base_offset);
        assert_eq!(
            journal.offset_at_timestamp(timestamp_us, end),
            expected,
            "seed {seed}: the offset at timestamp {timestamp_us} below {end}"
        );
    }
    let segments = journal.segments();
    assert_eq!(
        segments.first().map(|segment| segment.base_offset),
        Some(first_offset)
    );
    assert_eq!(
        segments.last().map(|segment| segment.end_offset),
        Some(end_offset)
    );
    for pair in segments.windows(2) {
        assert_eq!(
            pair[0].end_offset, pair[1].base_offset,
            "seed {seed}: segments tile"
        );
    }
    for segment in &segments {
        let newest = all
            .iter()
            .rev()
            .find(|message| (segment.base_offset..segment.end_offset).contains(&message.offset))
            .map(|message| message.timestamp_us);
        assert_eq!(segment.newest_timestamp_us, newest, "seed {seed}: {segment:?}");
    }
    assert_eq!(
        journal.size_bytes(),
        segments.iter().map(|segment| segment.size_bytes).sum::<u64>()
    );
}

fn write(journal: &mut JournalLog, op: u64, written: &Written) -> Result<(), StorageError> {
    if let Some(to_offset) = written.skip_to {
        return journal.write_skip_op(op, written.view, timestamp_of(op), &written.op_payload, to_offset);
    }
    let batches: Vec<&[u8]> = written.batches.iter().map(Vec::as_slice).collect();
    journal.write_op(op, written.view, timestamp_of(op), &written.op_payload, &batches)
}

struct Sim {
    seed: u64,
    rng: SimRng,
    disk: SimDisk,
    dir: PathBuf,
    config: JournalConfig,
    journal: Option<JournalLog>,
    /// What the journal holds now, as far as the test knows.
    current: BTreeMap<u64, Written>,
    /// Every content ever written at each op.
    ever: BTreeMap<u64, Vec<Written>>,
    /// Ops up to here were covered by a successful sync, and no cut has reached them since.
    guaranteed: u64,
    crashes: u64,
    cuts: u64,
    /// Reopens that dropped bytes above the frontier.
    drops: u64,
    /// A power cut is set to happen after some disk operations.
    power_cut_armed: bool,
    /// The journal's first op is at least this: a removal of the oldest segments published it.
    start_floor: u64,
    /// Removals of the oldest segments that removed any.
    removals: u64,
    /// Reopens that found segments a removal left below the start.
    leftovers: u64,
    /// Reopens that took a prefix of the frontier's segment from its summary, unread.
    prefixes_unread: u64,
    /// Summaries of the segment being written, written between clean stops.
    progress_summaries: u64,
    /// Reopens after a power loss (not a process kill) that took a prefix unread.
    prefixes_unread_after_power_loss: u64,
    /// Whether the last crash was a power loss.
    last_crash_power_loss: bool,
    /// Failed writes the journal undid and went on from.
    undone_writes: u64,
    /// The end of the offsets handed out since the last clean stop (`relaxed` mode: they may
    /// have been acknowledged before a barrier), but those of ops a cut removed (never
    /// committed, so never acknowledged: minting them again is allowed).
    handed_out: u64,
    /// `handed_out` at the last reopen: a cut reaches no op from before it.
    handed_out_at_reopen: u64,
    /// The first op a cut may reach (`relaxed` mode: ops written since the last reopen).
    cut_floor_op: u64,
    /// Reopens after a process kill rather than a power loss.
    kills: u64,
    /// Reopens that kept whole ops above the frontier.
    kept_unsynced: u64,
    /// Skips to the offset an open said minting resumes at.
    skips: u64,
    /// Clean stops (the reservation collapsed).
    clean_stops: u64,
}

impl Sim {
    fn new(seed: u64) -> Sim {
        let mut rng = SimRng::new(seed);
        let config = JournalConfig {
            segment_size_bytes: rng.range_inclusive(400, 3_000),
            relaxed: rng.chance(1, 2),
        };
        let disk = SimDisk::new();
        let dir = PathBuf::from("/sim/journal/9");
        let journal = JournalLog::create_on(
            Arc::new(disk.clone()),
            &dir,
            PARTITION,
            config,
            Chain::genesis(PARTITION),
        )
        .expect("create on a healthy disk");
        Sim {
            seed,
            rng,
            disk,
            dir,
            config,
            journal: Some(journal),
            current: BTreeMap::new(),
            ever: BTreeMap::new(),
            guaranteed: 0,
            crashes: 0,
            cuts: 0,
            drops: 0,
            power_cut_armed: false,
            start_floor: 1,
            removals: 0,
            leftovers: 0,
            prefixes_unread: 0,
            progress_summaries: 0,
            prefixes_unread_after_power_loss: 0,
            last_crash_power_loss: false,
            undone_writes: 0,
            handed_out: 0,
            handed_out_at_reopen: 0,
            cut_floor_op: 0,
            kills: 0,
            kept_unsynced: 0,
            skips: 0,
            clean_stops: 0,
        }
    }

    fn run(&mut self, steps: u64) {
        for _ in 0..steps {
            if !self.power_cut_armed && self.rng.chance(1, 25) {
                let after = self.rng.below(6);
                self.disk.cut_power_after(after);
                self.power_cut_armed = true;
            }
            if self.rng.chance(1, 40) {
                self.disk.fail_next_sync_data(1);
            }
            if self.rng.chance(1, 30) {
                self.disk.fail_next_writes(1);
            }
            let outcome = self.step();
            let undone =
                outcome.is_err() && !self.disk.power_is_cut() && self.journal().stopped_reason().is_none();
            if undone {
                // A failed write the journal cut back: it goes on without a reopen (a sync may
                // follow), and what it holds is checked at the next reopen as always.
                self.undone_writes += 1;
                let journal = self.journal.as_ref().expect("open");
                if !self.power_cut_armed {
                    check_reads(journal, &self.current, &mut self.rng, self.seed);
                }
            } else if outcome.is_err()
                || self.disk.power_is_cut()
                || self.journal().stopped_reason().is_some()
            {
                self.crash_and_reopen();
            } else if !self.power_cut_armed && self.rng.chance(1, 4) {
                // (Reads count as disk operations: an armed power cut would fail them.)
                let journal = self.journal.as_ref().expect("open");
                check_reads(journal, &self.current, &mut self.rng, self.seed);
            }
        }
        self.disk.cancel_power_cut();
        self.crash_and_reopen();
    }

    fn journal(&mut self) -> &mut JournalLog {
        self.journal.as_mut().expect("open")
    }

    fn step(&mut self) -> Result<(), StorageError> {
        self.skip_if_needed()?;
        let last = self.journal().last_op();
        // A cut removes uncommitted ops only. In `relaxed` mode an op may be acknowledged
        // (so committed) once written; the test lets a cut reach only ops written since the
        // last reopen, which it then counts as never acknowledged.
        let first = self.journal().first_op().max(self.cut_floor_op);
        match self.rng.below(10) {
            0..=5 => self.write_new(last + 1),
            6 if last >= first => {
                // A view change replaced a prepare: rewrite an op, cutting what follows.
                let op = self.forget_from(first, last);
                self.write_new(op)
            }
            7 if last >= first => {
                let op = self.forget_from(first, last);
                self.journal().cut(op)
            }
            8 if self.rng.chance(1, 2) => self.remove_oldest(),
            8 => self.clean_stop(),
            _ => {
                let synced = self.journal().sync()?;
                assert_eq!(synced, last, "seed {}: sync covers every op written", self.seed);
                self.guaranteed = synced;
                if self.rng.chance(1, 2) {
                    // As the server does after a commit (its step is 64 MiB, and at least
                    // sixteen times the summary's size).
                    let step_bytes = self.rng.below(400);
                    self.progress_summaries += u64::from(self.journal().summarise_progress(step_bytes, 0));
                }
                Ok(())
            }
        }
    }

    /// Write a new content at `op` and remember it.
    fn write_new(&mut self, op: u64) -> Result<(), StorageError> {
        let written = random_written(&mut self.rng, op);
        self.ever.entry(op).or_default().push(written.clone());
        let result = write(self.journal(), op, &written);
        if result.is_ok() {
            self.current.insert(op, written);
            self.handed_out = self.handed_out.max(self.journal().chain().next_offset);
        }
        result
    }

    /// A clean stop: everything synced and the reservation collapsed; the next open (after
    /// the process exits) skips nothing.
    fn clean_stop(&mut self) -> Result<(), StorageError> {
        self.skip_if_needed()?;
        let synced = self.journal().sync_for_stop()?;
        self.guaranteed = synced;
        let end = self.journal().chain().next_offset;
        self.journal = None;
        self.disk.cancel_power_cut();
        self.power_cut_armed = false;
        self.disk.kill_process();
        let seed = self.seed;
        let (journal, recovery) =
            JournalLog::open_on(Arc::new(self.disk.clone()), &self.dir, PARTITION, self.config)
                .unwrap_or_else(|error| {
                    panic!("seed {seed}: a clean stop left a journal that does not open: {error}")
                });
        assert_eq!(
            (
                journal.chain().next_offset,
                journal.resume_offset(),
                recovery.dropped_bytes
            ),
            (end, None, 0),
            "seed {seed}: a clean stop leaves the log whole and no gap"
        );
        self.handed_out = end;
        self.handed_out_at_reopen = end;
        if self.config.relaxed {
            self.cut_floor_op = journal.last_op() + 1;
        }
        self.clean_stops += 1;
        self.journal = Some(journal);
        Ok(())
    }

    /// Remove the oldest segments below a random op and offset, and check what went.
    fn remove_oldest(&mut self) -> Result<(), StorageError> {
        let seed = self.seed;
        let (first, last) = (self.journal().first_op(), self.journal().last_op());
        let below_op = self.rng.range_inclusive(first, last + 1);
        let end_offset = self.journal().chain().next_offset;
        let first_offset = self.journal().first_offset();
        let below_offset = if self.rng.chance(1, 2) {
            u64::MAX
        } else {
            first_offset + self.rng.below(end_offset - first_offset + 1)
        };
        let before = self.journal().segments();
        let removed = self.journal().remove_oldest_segments(below_op, below_offset);
        // The start is published first: even a failed removal may have moved it.
        let start_op = self.journal().first_op();
        self.current = self.current.split_off(&start_op);
        self.start_floor = self.start_floor.max(start_op);
        let removed = removed?;
        assert_eq!(
            removed[..],
            before[..removed.len()],
            "seed {seed}: the oldest go first"
        );
        let kept = &before[removed.len()..];
        assert_eq!(kept.first().map(|segment| segment.first_op), Some(start_op));
        for segment in &removed {
            assert!(
                segment.end_offset <= below_offset,
                "seed {seed}: {segment:?} held messages at or above {below_offset}"
            );
        }
        assert!(
            start_op <= below_op,
            "seed {seed}: ops at or above {below_op} removed"
        );
        if let Some(next) = kept.get(1) {
            // The first kept segment had to stay: it holds an op at or above `below_op`, or a
            // message at or above `below_offset`, or the frontier, or it is the active one.
            assert!(
                next.first_op > below_op
                    || next.base_offset > below_offset
                    || next.first_op > self.journal().durable_op(),
                "seed {seed}: {:?} could have gone",
                kept[0]
            );
        }
        self.removals += u64::from(!removed.is_empty());
        Ok(())
    }

    /// Pick an op near the end to cut at, and forget it and what follows: from here on no
    /// sync vouches for them.
    fn forget_from(&mut self, first: u64, last: u64) -> u64 {
        let op = self.rng.range_inclusive(first.max(last.saturating_sub(6)), last);
        self.guaranteed = self.guaranteed.min(op - 1);
        let handed_out = self.handed_out;
        let end_before = self
            .journal()
            .extent(op)
            .map_or(handed_out, |extent| extent.chain_before.next_offset);
        self.handed_out = self.handed_out_at_reopen.max(end_before);
        self.current.split_off(&op);
        self.cuts += 1;
        op
    }

    fn crash_and_reopen(&mut self) {
        self.journal = None;
        self.disk.cancel_power_cut();
        self.power_cut_armed = false;
        let killed = self.rng.chance(1, 3);
        if killed {
            // SIGKILL: the page cache keeps every write; in `relaxed` mode every op written
            // may have been acknowledged, so every one must come back.
            self.disk.kill_process();
            self.kills += 1;
            if self.config.relaxed {
                self.guaranteed = self
                    .current
                    .keys()
                    .next_back()
                    .copied()
                    .unwrap_or(self.guaranteed);
            }
        } else {
            self.disk.crash(self.rng.next_u64());
        }
        self.last_crash_power_loss = !killed;
        self.crashes += 1;
        let seed = self.seed;
        // The read-only inspection sees what the open then does, and changes nothing.
        let stats = self.disk.stats();
        let inspection = JournalLog::inspect_on(&self.disk, &self.dir, PARTITION)
            .unwrap_or_else(|error| panic!("seed {seed}: a crash alone made the inspection refuse: {error}"));
        // So does the read-only open: it keeps what the open keeps, and refuses writes.
        let (mut read_only, inspected) =
            JournalLog::open_read_only_on(Arc::new(self.disk.clone()), &self.dir, PARTITION, self.config)
                .unwrap_or_else(|error| {
                    panic!("seed {seed}: a crash alone made the read-only open refuse: {error}")
                });
        assert_eq!(inspected, inspection, "seed {seed}");
        assert!(read_only.sync().is_err() && read_only.cut(read_only.last_op()).is_err());
        assert_eq!(
            self.disk.stats(),
            stats,
            "seed {seed}: the inspection or the read-only open synced, created or removed"
        );
        let (journal, recovery) =
            match JournalLog::open_on(Arc::new(self.disk.clone()), &self.dir, PARTITION, self.config) {
                Ok(opened) => opened,
                Err(error) => panic!("seed {seed}: a crash alone made the journal refuse to open: {error}"),
            };
        assert_eq!(
            (
                inspection.bytes_above_frontier,
                inspection.unsynced_ops_kept,
                inspection.last_op
            ),
            (
                recovery.dropped_bytes,
                recovery.unsynced_ops_kept,
                journal.last_op()
            ),
            "seed {seed}: the inspection and the open disagree"
        );
        // What the open kept above the frontier it made durable.
        let expected_durable = if recovery.unsynced_ops_kept > 0 {
            journal.last_op()
        } else {
            inspection.durable_op
        };
        assert_eq!(recovery.durable_op, expected_durable, "seed {seed}");
        // A durable journal keeps whole ops above its frontier only when a state slot failed
        // verification (here: a publish torn by the crash; the whole ops above the older
        // frontier are kept, synced or not).
        assert!(
            self.config.relaxed || recovery.state_slot_damaged || recovery.unsynced_ops_kept == 0,
            "seed {seed}: a durable journal kept unsynced ops"
        );
        self.kept_unsynced += u64::from(recovery.unsynced_ops_kept > 0);
        // No offset handed out can be minted again: the log holds it, or minting resumes
        // past it. A durable journal hands nothing out before a barrier and never skips.
        let resume = journal.resume_offset();
        if self.config.relaxed {
            let minting_resumes_at = resume.unwrap_or(journal.chain().next_offset);
            assert!(
                minting_resumes_at >= self.handed_out,
                "seed {seed}: offsets up to {} were handed out, minting would resume at {minting_resumes_at}",
                self.handed_out
            );
        } else {
            assert_eq!(resume, None, "seed {seed}: a durable journal asked for a skip");
        }
        assert_eq!(inspection.next_offset, journal.chain().next_offset);
        assert!(
            recovery.durable_op >= self.guaranteed,
            "seed {seed}: the frontier went back to op {} behind the synced op {}",
            recovery.durable_op,
            self.guaranteed
        );
        assert!(
            journal.first_op() >= self.start_floor,
            "seed {seed}: the journal starts at op {} again, below the published start {}",
            journal.first_op(),
            self.start_floor
        );
        self.start_floor = journal.first_op();
        self.current = self.current.split_off(&journal.first_op());
        self.leftovers += u64::from(inspection.segments_below_start > 0);
        for (&op, written) in self.current.range(..=self.guaranteed) {
            assert!(
                holds(&journal, op, written).unwrap_or(false),
                "seed {seed}: synced op {op} lost or changed"
            );
        }
        let mut current = BTreeMap::new();
        for op in journal.first_op()..=journal.last_op() {
            let ever = self.ever.get(&op).map(Vec::as_slice).unwrap_or_default();
            let found = ever
                .iter()
                .find(|written| holds(&journal, op, written).unwrap_or(false))
                .unwrap_or_else(|| {
                    panic!(
                        "seed {seed}: op {op} holds a content never written there: {:?} (ever: {ever:?})",
                        journal.read_op(op)
                    )
                });
            current.insert(op, found.clone());
        }
        self.current = current;
        assert_eq!(
            (read_only.first_op(), read_only.last_op(), read_only.chain()),
            (journal.first_op(), journal.last_op(), journal.chain()),
            "seed {seed}: the read-only open keeps what the open keeps"
        );
        for op in journal.first_op()..=journal.last_op() {
            assert_eq!(
                read_only.read_op(op).ok(),
                journal.read_op(op).ok(),
                "seed {seed}: op {op}"
            );
        }
        // The open took sealed segments from their summaries; the read-only open scanned
        // every segment: the index each built is the same.
        assert_eq!(
            read_only.extents().copied().collect::<Vec<_>>(),
            journal.extents().copied().collect::<Vec<_>>(),
            "seed {seed}: the ops the summaries gave are the ones a scan finds"
        );
        assert_eq!(
            (read_only.segments(), read_only.batch_count()),
            (journal.segments(), journal.batch_count()),
            "seed {seed}: the segments and batches the summaries gave are the ones a scan finds"
        );
        check_reads(&read_only, &self.current, &mut self.rng, seed);
        self.guaranteed = recovery.durable_op;
        self.handed_out_at_reopen = self.handed_out;
        if self.config.relaxed {
            self.cut_floor_op = journal.last_op() + 1;
        }
        self.drops += u64::from(recovery.dropped_bytes > 0);
        self.prefixes_unread += u64::from(journal.unverified_prefix().is_some());
        self.prefixes_unread_after_power_loss +=
            u64::from(journal.unverified_prefix().is_some() && self.last_crash_power_loss);
        check_reads(&journal, &self.current, &mut self.rng, seed);
        self.journal = Some(journal);
    }

    /// As the partition shell does: while an open says minting resumes above the log's end,
    /// the next op is a skip to it.
    fn skip_if_needed(&mut self) -> Result<(), StorageError> {
        let Some(to_offset) = self.journal().resume_offset() else {
            return Ok(());
        };
        let op = self.journal().last_op() + 1;
        let skip = Written {
            view: 0,
            op_payload: format!("skip to {to_offset}").into_bytes(),
            batches: Vec::new(),
            skip_to: Some(to_offset),
        };
        self.ever.entry(op).or_default().push(skip.clone());
        write(self.journal(), op, &skip)?;
        self.current.insert(op, skip);
        self.skips += 1;
        assert_eq!(self.journal().chain().next_offset, to_offset);
        assert_eq!(self.journal().resume_offset(), None);
        Ok(())
    }
}

fn seeds() -> Vec<u64> {
    if let Ok(seed) = std::env::var("CAIRN_SIM_SEED") {
        return vec![seed.parse().expect("CAIRN_SIM_SEED is a number")];
    }
    let count =
        std::env::var("CAIRN_SIM_SEEDS").map_or(1_000, |n| n.parse().expect("CAIRN_SIM_SEEDS is a number"));
    (0..count).collect()
}

#[test]
fn synced_ops_survive_power_losses_cuts_and_rewrites() {
    let (mut crashes, mut cuts, mut ops, mut drops, mut removals, mut leftovers, mut undone) =
        (0, 0, 0, 0, 0, 0, 0);
    let (mut kills, mut kept_unsynced, mut skips, mut clean_stops, mut prefixes_unread) = (0, 0, 0, 0, 0);
    let (mut progress_summaries, mut prefixes_after_power_loss) = (0, 0);
    for seed in seeds() {
        let mut sim = Sim::new(seed);
        sim.run(120);
        crashes += sim.crashes;
        cuts += sim.cuts;
        ops += sim.current.len() as u64;
        drops += sim.drops;
        removals += sim.removals;
        leftovers += sim.leftovers;
        undone += sim.undone_writes;
        kills += sim.kills;
        kept_unsynced += sim.kept_unsynced;
        skips += sim.skips;
        clean_stops += sim.clean_stops;
        prefixes_unread += sim.prefixes_unread;
        progress_summaries += sim.progress_summaries;
        prefixes_after_power_loss += sim.prefixes_unread_after_power_loss;
    }
    // The workload reaches what it claims to test.
    if seeds().len() >= 100 {
        assert!(
            crashes > 1_000
                && cuts > 1_000
                && ops > 3_000
                && drops > 500
                && removals > 500
                && leftovers > 5
                && undone > 500,
            "crashes {crashes}, cuts {cuts}, ops {ops}, reopens that dropped unsynced bytes {drops}, removals {removals}, reopens finishing a removal {leftovers}, undone writes {undone}"
        );
        assert!(
            kills > 300
                && kept_unsynced > 300
                && skips > 300
                && clean_stops > 300
                && prefixes_unread > 300
                && progress_summaries > 300
                && prefixes_after_power_loss > 100,
            "process kills {kills}, reopens keeping unsynced ops {kept_unsynced}, skips {skips}, clean stops {clean_stops}, reopens taking a prefix unread {prefixes_unread} ({prefixes_after_power_loss} after a power loss), summaries of the segment being written {progress_summaries}"
        );
    }
}

/// A new journal on a new simulated disk, at `/j`.
fn created(segment_size_bytes: u64) -> (SimDisk, PathBuf, JournalLog) {
    let disk = SimDisk::new();
    let dir = PathBuf::from("/j");
    let journal = JournalLog::create_on(
        Arc::new(disk.clone()),
        &dir,
        PARTITION,
        JournalConfig {
            segment_size_bytes,
            relaxed: false,
        },
        Chain::genesis(PARTITION),
    )
    .expect("create");
    (disk, dir, journal)
}

fn open(disk: &SimDisk, dir: &Path) -> Result<JournalLog, StorageError> {
    JournalLog::open_on(
        Arc::new(disk.clone()),
        dir,
        PARTITION,
        JournalConfig {
            segment_size_bytes: 600,
            relaxed: false,
        },
    )
    .map(|(journal, _)| journal)
}

/// Ops across several segments come back after a clean reopen; a cut at an op of an older
/// segment removes the segments above it, and the journal goes on from the cut.
#[test]
fn a_cut_reaches_back_across_segments_and_writing_goes_on_from_it() {
    let mut rng = SimRng::new(7);
    let (disk, dir, mut journal) = created(600);
    let mut written = BTreeMap::new();
    for op in 1..=30 {
        let content = random_written(&mut rng, op);
        write(&mut journal, op, &content).expect("write");
        written.insert(op, content);
    }
    assert_eq!(journal.sync().expect("sync"), 30);
    let segments_before = disk_logs(&disk, &dir);
    assert!(segments_before.len() >= 3, "{segments_before:?}");
    drop(journal);

    let mut journal = open(&disk, &dir).expect("reopen");
    assert_eq!(
        (journal.first_op(), journal.last_op(), journal.durable_op()),
        (1, 30, 30)
    );
    for (&op, content) in &written {
        assert!(holds(&journal, op, content).expect("read"), "op {op}");
    }
    // Cut at an op of the second segment.
    let op = (1..=30)
        .find(|&op| {
            journal.extent(op).expect("extent").segment_first_op
                != journal.extent(1).expect("extent").segment_first_op
        })
        .expect("an op in a later segment");
    journal.cut(op).expect("cut");
    assert_eq!((journal.last_op(), journal.durable_op()), (op - 1, op - 1));
    assert!(disk_logs(&disk, &dir).len() < segments_before.len());
    let content = random_written(&mut rng, op);
    write(&mut journal, op, &content).expect("write after the cut");
    journal.sync().expect("sync");
    drop(journal);
    let journal = open(&disk, &dir).expect("reopen");
    assert_eq!(journal.last_op(), op);
    assert!(holds(&journal, op, &content).expect("read"));
    assert!(holds(&journal, op - 1, &written[&(op - 1)]).expect("read"));
}

/// A byte flipped in a synced op is damage: the journal refuses to open, never cuts it.
#[test]
fn a_flip_below_the_frontier_is_refused() {
    let mut rng = SimRng::new(3);
    let (disk, dir, mut journal) = created(1 << 20);
    for op in 1..=5 {
        write(&mut journal, op, &random_written(&mut rng, op)).expect("write");
    }
    journal.sync().expect("sync");
    let extent = *journal.extent(5).expect("op 5");
    drop(journal);
    let path = dir.join(cairn_storage::journal::segment_log_name(1));
    let mut bytes = disk.read_volatile(&path).expect("segment");
    bytes[(extent.position_bytes + extent.len_bytes - 1) as usize] ^= 1;
    assert!(disk.overwrite_durable(&path, bytes.clone()));
    assert!(matches!(
        JournalLog::inspect_on(&disk, &dir, PARTITION),
        Err(StorageError::Damaged { .. })
    ));
    assert_eq!(
        disk.read_volatile(&path),
        Some(bytes),
        "the inspection wrote nothing"
    );
    match open(&disk, &dir) {
        Err(StorageError::Damaged { .. }) => {}
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// A bit flipped in the state file's newest slot (a publish reported durable) leaves the
/// older slot in charge; the ops synced above its frontier are kept, not dropped as if never
/// reported durable. Both slots, every third byte of the slot.
#[test]
fn a_flip_in_the_newest_state_slot_keeps_the_synced_ops_above_the_older_frontier() {
    for slot in 0..2u64 {
        for byte in (0..128u64).step_by(3) {
            let mut rng = SimRng::new(11);
            let (disk, dir, mut journal) = created(1 << 20);
            let mut written = BTreeMap::new();
            for op in 1..=8 {
                let content = random_written(&mut rng, op);
                write(&mut journal, op, &content).expect("write");
                written.insert(op, content);
                if op == 5 || op == 8 {
                    journal.sync().expect("sync");
                }
            }
            drop(journal);
            let path = dir.join("state");
            let mut bytes = disk.read_volatile(&path).expect("state file");
            let position = slot * cairn_storage::state::STATE_SLOT_STRIDE_BYTES + byte;
            bytes[position as usize] ^= 0x10;
            assert!(disk.overwrite_durable(&path, bytes));
            disk.crash(slot * 1000 + byte);
            let (journal, recovery) = JournalLog::open_on(
                Arc::new(disk.clone()),
                &dir,
                PARTITION,
                JournalConfig {
                    segment_size_bytes: 1 << 20,
                    relaxed: false,
                },
            )
            .unwrap_or_else(|error| panic!("slot {slot} byte {byte}: {error}"));
            assert!(recovery.state_slot_damaged, "slot {slot} byte {byte}");
            assert_eq!(
                (journal.last_op(), journal.durable_op()),
                (8, 8),
                "slot {slot} byte {byte}: {recovery:?}"
            );
            for (&op, content) in &written {
                assert!(holds(&journal, op, content).expect("read"), "op {op}");
            }
        }
    }
}

/// A flip in the newest state slot after retention removed the segment the older slot's
/// frontier lies in: the open starts from the journal's start instead of refusing, and keeps
/// every whole op (either slot flipped).
#[test]
fn a_flipped_state_slot_older_than_a_segment_removal_opens_from_the_start() {
    for slot in 0..2u64 {
        let mut rng = SimRng::new(13);
        let (disk, dir, mut journal) = created(600);
        let mut written = BTreeMap::new();
        let mut op = 0;
        // Fill the first segment; the write that starts the second seals it (a publish).
        while disk_logs(&disk, &dir).len() < 2 {
            op += 1;
            let content = random_written(&mut rng, op);
            write(&mut journal, op, &content).expect("write");
            written.insert(op, content);
        }
        journal.sync().expect("sync");
        let second_first_op = journal.extent(op).expect("the last op").segment_first_op;
        let below_offset = journal
            .extent(second_first_op)
            .expect("extent")
            .chain_before
            .next_offset;
        let removed = journal
            .remove_oldest_segments(second_first_op, below_offset)
            .expect("remove");
        assert_eq!(removed.len(), 1);
        drop(journal);
        let path = dir.join("state");
        let mut bytes = disk.read_volatile(&path).expect("state file");
        bytes[(slot * cairn_storage::state::STATE_SLOT_STRIDE_BYTES + 20) as usize] ^= 0x01;
        assert!(disk.overwrite_durable(&path, bytes));
        disk.crash(slot);
        let journal = open(&disk, &dir).unwrap_or_else(|error| panic!("slot {slot}: {error}"));
        assert_eq!(journal.last_op(), op, "slot {slot}");
        for kept in second_first_op..=op {
            assert!(holds(&journal, kept, &written[&kept]).expect("read"), "op {kept}");
        }
    }
}

/// A journal refused for a flipped byte in an older segment gives up, for a repair, every
/// whole op before the damage, verified, and says where the damage is; a sound journal gives
/// up all of it.
#[test]
fn the_salvage_of_a_damaged_journal_is_every_whole_op_before_the_damage() {
    let mut rng = SimRng::new(5);
    let (disk, dir, mut journal) = created(600);
    let mut written = BTreeMap::new();
    for op in 1..=30 {
        let content = random_written(&mut rng, op);
        write(&mut journal, op, &content).expect("write");
        written.insert(op, content);
    }
    journal.sync().expect("sync");
    let next_offset = journal.chain().next_offset;
    let damaged_op = (1..=30)
        .find(|&op| journal.extent(op).expect("extent").segment_first_op > 1)
        .expect("an op in a later segment")
        + 1;
    let extent = *journal.extent(damaged_op).expect("extent");
    drop(journal);
    let config = JournalConfig {
        segment_size_bytes: 600,
        relaxed: false,
    };
    let (sound, salvage) =
        JournalLog::open_salvage_on(Arc::new(disk.clone()), &dir, PARTITION, config).expect("salvage");
    assert_eq!((sound.last_op(), salvage.damage), (30, None));
    drop(sound);

    let path = dir.join(cairn_storage::journal::segment_log_name(extent.segment_first_op));
    let mut bytes = disk.read_volatile(&path).expect("segment");
    bytes[(extent.position_bytes + extent.len_bytes / 2) as usize] ^= 0x04;
    assert!(disk.overwrite_durable(&path, bytes));
    // (An open takes the sealed segment from its summary; the checker reads it.)
    assert!(matches!(
        JournalLog::inspect_on(&disk, &dir, PARTITION),
        Err(StorageError::Damaged { .. })
    ));
    let (prefix, salvage) =
        JournalLog::open_salvage_on(Arc::new(disk.clone()), &dir, PARTITION, config).expect("salvage");
    assert_eq!(prefix.last_op(), damaged_op - 1);
    let (damage_path, position, _) = salvage.damage.clone().expect("the damage");
    assert_eq!((damage_path, position), (path, extent.position_bytes));
    assert_eq!(
        salvage.highest_offset_after_damage,
        Some(next_offset),
        "the records after the damage name every offset handed out"
    );
    assert_eq!(salvage.handed_out, Some((next_offset, true)));
    for op in 1..damaged_op {
        assert!(holds(&prefix, op, &written[&op]).expect("read"), "op {op}");
    }
    assert!(prefix.read_op(damaged_op).is_err());
}

/// Bad input is refused before a byte is written: an op out of order, an empty append, a
/// batch whose header disagrees with its length.
#[test]
fn writes_out_of_order_or_malformed_are_refused() {
    let (_disk, _dir, mut journal) = created(1 << 20);
    assert!(matches!(
        journal.write_op(2, 0, 1, b"x", &[]),
        Err(StorageError::Invalid(_))
    ));
    assert!(matches!(
        journal.write_op(0, 0, 1, b"x", &[]),
        Err(StorageError::Invalid(_))
    ));
    let mut batch = client_batch(&[b"m".to_vec()]);
    batch.push(0);
    assert!(matches!(
        journal.write_op(1, 0, 1, b"x", &[&batch]),
        Err(StorageError::Invalid(_))
    ));
    let empty = client_batch(&[]);
    assert!(matches!(
        journal.write_op(1, 0, 1, b"x", &[&empty]),
        Err(StorageError::Invalid(_))
    ));
    assert_eq!(journal.last_op(), 0);
    assert!(matches!(journal.cut(1), Err(StorageError::Invalid(_))));
    journal
        .write_op(1, 0, 1, b"x", &[])
        .expect("a good write still works");
}

fn disk_logs(disk: &SimDisk, dir: &Path) -> Vec<String> {
    use cairn_storage::io::Disk;
    disk.list_dir(dir)
        .expect("list")
        .into_iter()
        .filter(|name| name.ends_with(".log"))
        .collect()
}

/// The batches `parts` stand for, in order: file ranges read back, buffer ranges from `out`.
fn parts_bytes(parts: &[ReadPart], out: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::new();
    for part in parts {
        match part {
            ReadPart::Buffer(range) => bytes.extend_from_slice(&out[range.clone()]),
            ReadPart::File {
                file,
                position_bytes,
                len,
            } => {
                let mut read = vec![0u8; *len];
                file.read_exact_at(*position_bytes, &mut read)
                    .expect("read the part");
                bytes.extend_from_slice(&read);
            }
        }
    }
    bytes
}

/// On real files, a poll sends whole batches as file ranges and cuts partial ones; after a
/// cut and a rewrite that starts a segment under the same name again, polls serve the new
/// batches, never the replaced ones (a read handle of the removed file must not be reused).
#[test]
fn polls_on_real_files_serve_the_rewritten_batches_after_a_cut() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("journal");
    let mut journal = JournalLog::create_on(
        Arc::new(RealDisk),
        &dir,
        PARTITION,
        JournalConfig {
            segment_size_bytes: 1_000,
            relaxed: false,
        },
        Chain::genesis(PARTITION),
    )
    .expect("create");
    let batch_of = |op: u64, generation: &str| {
        client_batch(&[
            format!("{generation} op {op} first").into_bytes(),
            format!("{generation} op {op} second").into_bytes(),
        ])
    };
    for op in 1..=12 {
        let batch = batch_of(op, "old");
        journal
            .write_op(op, 1, timestamp_of(op), b"header", &[&batch])
            .expect("write");
    }
    journal.sync().expect("sync");
    let segments = journal.segments();
    assert!(segments.len() >= 3, "{segments:?}");
    let last_base = segments.last().expect("segments").base_offset;

    // Whole batches go as file ranges; a poll starting mid-batch gets that batch cut.
    let end = journal.chain().next_offset;
    let (mut out, mut parts) = (vec![0u8; 64], Vec::new());
    let outcome = journal
        .read_parts(last_base + 1, 100, end, &mut out, &mut parts)
        .expect("poll");
    assert!(parts.iter().any(|part| matches!(part, ReadPart::File { .. })));
    let messages = decode_batches(&parts_bytes(&parts, &out));
    assert_eq!(
        messages.first().map(|message| message.offset),
        Some(last_base + 1)
    );
    assert_eq!(outcome.messages_count as usize, messages.len());
    assert!(messages.iter().all(|message| message.payload.starts_with(b"old")));

    // Cut into the first segment, then write the same shapes again: the segments are started
    // again at the same offsets, under the same names.
    let cut_op = (1..=12)
        .find(|&op| journal.extent(op).expect("extent").segment_first_op != 1)
        .expect("an op in the second segment")
        - 1;
    journal.cut(cut_op).expect("cut");
    for op in cut_op..=12 {
        let batch = batch_of(op, "new");
        journal
            .write_op(op, 2, timestamp_of(op), b"header", &[&batch])
            .expect("rewrite");
    }
    journal.sync().expect("sync");
    assert_eq!(
        journal.segments().last().expect("segments").base_offset,
        last_base
    );
    for parts_wanted in [false, true] {
        let (mut out, mut parts) = (vec![0u8; 64], Vec::new());
        let bytes = if parts_wanted {
            journal
                .read_parts(last_base, 100, end, &mut out, &mut parts)
                .expect("poll");
            parts_bytes(&parts, &out)
        } else {
            journal.read_into(last_base, 100, end, &mut out).expect("poll");
            out[64..].to_vec()
        };
        let messages = decode_batches(&bytes);
        assert!(!messages.is_empty());
        assert!(
            messages.iter().all(|message| message.payload.starts_with(b"new")),
            "a replaced batch was served: {messages:?}"
        );
    }
}

/// A partition that only stores offsets (op records, no message) rotates its segments like
/// one that receives messages, and its oldest segments can be removed once its checkpoint is
/// past them; the removal survives a reopen.
#[test]
fn op_records_alone_rotate_segments_and_the_oldest_can_be_removed() {
    let (disk, dir, mut journal) = created(600);
    for op in 1..=40 {
        journal
            .write_op(op, 1, timestamp_of(op), &[op as u8; 100], &[])
            .expect("write");
    }
    journal.sync().expect("sync");
    let segments = journal.segments();
    assert!(segments.len() >= 5, "{segments:?}");
    assert!(segments.iter().all(|segment| segment.base_offset == 0));
    assert!(segments.iter().all(|segment| segment.size_bytes < 600 + 200));

    // Nothing goes while the checkpoint is below the second segment's first op.
    assert_eq!(
        journal
            .remove_oldest_segments(segments[1].first_op, u64::MAX)
            .expect("remove")
            .len(),
        1
    );
    let removed = journal.remove_oldest_segments(30, u64::MAX).expect("remove");
    assert!(!removed.is_empty());
    let first_op = journal.first_op();
    assert!(first_op > segments[1].first_op && first_op <= 30, "{first_op}");
    assert_eq!(journal.segments()[0].first_op, first_op);
    assert!(journal.extent(first_op - 1).is_none());
    assert_eq!(journal.read_op_record(40).expect("read"), vec![40u8; 100]);
    drop(journal);

    let journal = open(&disk, &dir).expect("reopen");
    assert_eq!((journal.first_op(), journal.last_op()), (first_op, 40));
    assert_eq!(disk_logs(&disk, &dir).len(), journal.segments().len());
    assert_eq!(
        journal.read_op_record(first_op).expect("read"),
        vec![first_op as u8; 100]
    );
}

/// A sealed segment below the frontier's is taken at open from the summary written when it
/// was sealed, without reading it: a byte flipped in it does not stop the open, but the op it
/// damaged is refused when read, and the checker (which trusts no summary) reports it. The
/// frontier's own segment is always read, so damage there still refuses the open.
#[test]
fn a_sealed_segment_is_taken_from_its_summary_and_verified_when_read() {
    let mut rng = SimRng::new(11);
    let (disk, dir, mut journal) = created(600);
    for op in 1..=30 {
        write(&mut journal, op, &random_written(&mut rng, op)).expect("write");
        journal.sync().expect("sync");
    }
    let segments = journal.segments();
    assert!(segments.len() >= 4, "{segments:?}");
    let sealed = segments[1];
    let victim = *journal
        .extent(sealed.first_op)
        .expect("the sealed segment's first op");
    drop(journal);
    let segment_files: Vec<String> = disk_logs(&disk, &dir);
    let listing = cairn_storage::io::Disk::list_dir(&disk, &dir).expect("list");
    for segment in &segments[..segments.len() - 1] {
        assert!(
            listing.contains(&format!("{:020}.summary", segment.first_op)),
            "sealed segment {} has no summary: {listing:?}",
            segment.first_op
        );
    }
    assert_eq!(segment_files.len(), segments.len());

    // A flip inside the sealed segment's first op.
    let path = dir.join(cairn_storage::journal::segment_log_name(sealed.first_op));
    let mut bytes = disk.read_volatile(&path).expect("segment");
    bytes[(victim.position_bytes + victim.len_bytes - 1) as usize] ^= 1;
    assert!(disk.overwrite_durable(&path, bytes));

    let journal = open(&disk, &dir).expect("the open takes the sealed segment from its summary");
    assert!(
        matches!(
            journal.read_op(sealed.first_op),
            Err(StorageError::Damaged { .. })
        ),
        "the damaged op is refused when read"
    );
    assert!(
        journal.read_op(segments[2].first_op).is_ok(),
        "the other ops read back"
    );
    drop(journal);
    assert!(matches!(
        JournalLog::inspect_on(&disk, &dir, PARTITION),
        Err(StorageError::Damaged { .. })
    ));
}

/// A summary that matches a segment's start and length but not its records (here: the
/// summary of another journal whose ops had the same sizes and other bytes) is not taken:
/// the open reads the segment, serves it, and removes the summary.
#[test]
fn a_summary_that_does_not_match_its_segment_is_not_taken() {
    let mut rng = SimRng::new(5);
    let writtens: Vec<Written> = (1..=20).map(|op| random_written(&mut rng, op)).collect();
    let (disk, dir, mut journal) = created(600);
    let (other_disk, other_dir, mut other) = created(600);
    for (index, written) in writtens.iter().enumerate() {
        let op = index as u64 + 1;
        write(&mut journal, op, written).expect("write");
        let mut changed = written.clone();
        for byte in changed.op_payload.iter_mut() {
            *byte ^= 1;
        }
        write(&mut other, op, &changed).expect("write the other");
    }
    journal.sync().expect("sync");
    other.sync().expect("sync the other");
    let sealed = journal.segments()[0];
    assert_eq!(
        other.segments()[0],
        sealed,
        "the same sizes, so the same segment shape"
    );
    drop(journal);
    drop(other);
    let name = format!("{:020}.summary", sealed.first_op);
    let foreign = other_disk
        .read_volatile(&other_dir.join(&name))
        .expect("the other's summary");
    assert!(disk.overwrite_durable(&dir.join(&name), foreign));

    let journal = open(&disk, &dir).expect("the segment is read instead");
    for (index, written) in writtens.iter().enumerate() {
        assert!(
            holds(&journal, index as u64 + 1, written).expect("read"),
            "op {}",
            index + 1
        );
    }
    let listing = cairn_storage::io::Disk::list_dir(&disk, &dir).expect("list");
    assert!(
        !listing.contains(&name),
        "the summary that did not match was removed: {listing:?}"
    );
}

fn open_sized(disk: &SimDisk, dir: &Path, segment_size_bytes: u64) -> Result<JournalLog, StorageError> {
    JournalLog::open_on(
        Arc::new(disk.clone()),
        dir,
        PARTITION,
        JournalConfig {
            segment_size_bytes,
            relaxed: false,
        },
    )
    .map(|(journal, _)| journal)
}

fn has_summary(disk: &SimDisk, dir: &Path, first_op: u64) -> bool {
    cairn_storage::io::Disk::list_dir(disk, dir)
        .expect("list")
        .contains(&format!("{first_op:020}.summary"))
}

/// The segment being written is summarised at a clean stop, and the next open takes that
/// prefix from the summary without reading it (a byte flipped in it does not stop the open),
/// marks it unverified, and verifies it before anything is written: the write is refused
/// with the damage, the journal stops, the summary goes, and every later open reads the
/// prefix and refuses it, as does the checker.
#[test]
fn a_clean_stop_summary_spares_the_open_a_read_and_damage_is_found_before_a_write() {
    let mut rng = SimRng::new(21);
    let (disk, dir, mut journal) = created(1 << 20);
    let writtens: Vec<Written> = (1..=20).map(|op| random_written(&mut rng, op)).collect();
    for (index, written) in writtens.iter().enumerate() {
        write(&mut journal, index as u64 + 1, written).expect("write");
    }
    journal.sync_for_stop().expect("clean stop");
    let victim = *journal.extent(5).expect("op 5");
    assert_eq!(journal.segments().len(), 1, "one segment, being written");
    let chain_at_stop = journal.chain();
    drop(journal);
    assert!(
        has_summary(&disk, &dir, 1),
        "a clean stop summarises the active segment"
    );

    // Undamaged: the open takes the whole segment from its summary, unread, and a write
    // verifies it first.
    let mut journal = open_sized(&disk, &dir, 1 << 20).expect("open");
    let prefix = journal
        .unverified_prefix()
        .cloned()
        .expect("the prefix is unverified");
    assert_eq!(
        (prefix.first_op, prefix.start.next_op, prefix.end),
        (1, 1, chain_at_stop)
    );
    assert_eq!(journal.chain(), chain_at_stop);
    write(&mut journal, 21, &random_written(&mut rng, 21)).expect("a write after the prefix verified");
    assert!(
        journal.unverified_prefix().is_none(),
        "the write verified the prefix"
    );
    journal.sync_for_stop().expect("clean stop");
    drop(journal);

    // A flip inside op 5: the open still succeeds, the op is refused when read.
    let path = dir.join(cairn_storage::journal::segment_log_name(1));
    let mut bytes = disk.read_volatile(&path).expect("segment");
    bytes[(victim.position_bytes + victim.len_bytes - 1) as usize] ^= 1;
    assert!(disk.overwrite_durable(&path, bytes.clone()));
    let mut journal = open_sized(&disk, &dir, 1 << 20).expect("the open takes the prefix from its summary");
    assert!(journal.unverified_prefix().is_some());
    assert!(matches!(journal.read_op(5), Err(StorageError::Damaged { .. })));
    assert!(holds(&journal, 6, &writtens[5]).expect("op 6 reads"));
    let in_op_5 = victim.position_bytes..victim.position_bytes + victim.len_bytes;
    let refused = write(&mut journal, 22, &random_written(&mut rng, 22));
    assert!(
        matches!(&refused, Err(StorageError::Damaged { position, .. }) if in_op_5.contains(position)),
        "the write is refused with the damage in op 5 ({in_op_5:?}): {refused:?}"
    );
    assert!(
        matches!(
            write(&mut journal, 22, &random_written(&mut rng, 22)),
            Err(StorageError::Invalid(_))
        ),
        "the journal stopped"
    );
    drop(journal);
    assert_eq!(
        disk.read_volatile(&path),
        Some(bytes.clone()),
        "nothing was written to the segment"
    );
    assert!(
        !has_summary(&disk, &dir, 1),
        "the damaged prefix's summary is removed"
    );
    assert!(matches!(
        open_sized(&disk, &dir, 1 << 20),
        Err(StorageError::Damaged { .. })
    ));
    assert!(matches!(
        JournalLog::inspect_on(&disk, &dir, PARTITION),
        Err(StorageError::Damaged { .. })
    ));

    // The same with the summary written again, and a cut (a rewrite of op 3) as the first
    // write.
    let mut restored = bytes.clone();
    restored[(victim.position_bytes + victim.len_bytes - 1) as usize] ^= 1;
    assert!(disk.overwrite_durable(&path, restored));
    let mut journal = open_sized(&disk, &dir, 1 << 20).expect("the open reads the restored segment");
    journal.sync_for_stop().expect("clean stop");
    drop(journal);
    assert!(has_summary(&disk, &dir, 1));
    assert!(disk.overwrite_durable(&path, bytes.clone()));
    let mut journal = open_sized(&disk, &dir, 1 << 20).expect("the open takes the prefix from its summary");
    let refused = write(&mut journal, 3, &random_written(&mut rng, 3));
    assert!(
        matches!(&refused, Err(StorageError::Damaged { position, .. }) if in_op_5.contains(position)),
        "the cut is refused with the damage: {refused:?}"
    );
    drop(journal);
    assert_eq!(disk.read_volatile(&path), Some(bytes), "the cut changed nothing");
}

/// The summary written at a clean stop stays while the segment is written on (it still
/// describes that prefix): after a crash the open takes the prefix from it and reads only
/// the bytes after it, and builds the index a read of everything builds. A cut into the
/// prefix removes the summary.
#[test]
fn a_prefix_summary_outlives_later_writes_and_goes_with_a_cut_into_it() {
    let mut rng = SimRng::new(22);
    let (disk, dir, mut journal) = created(1 << 20);
    let mut writtens: BTreeMap<u64, Written> = BTreeMap::new();
    for op in 1..=10 {
        let written = random_written(&mut rng, op);
        write(&mut journal, op, &written).expect("write");
        writtens.insert(op, written);
    }
    journal.sync_for_stop().expect("clean stop");
    let summarised_len = journal.segments()[0].size_bytes;
    drop(journal);

    let mut journal = open_sized(&disk, &dir, 1 << 20).expect("open");
    for op in 11..=20 {
        let written = random_written(&mut rng, op);
        write(&mut journal, op, &written).expect("write");
        writtens.insert(op, written);
        journal.sync().expect("sync");
    }
    drop(journal);
    disk.kill_process();
    assert!(
        has_summary(&disk, &dir, 1),
        "the prefix's summary outlives the writes after it"
    );

    let journal = open_sized(&disk, &dir, 1 << 20).expect("open after the crash");
    let prefix = journal
        .unverified_prefix()
        .cloned()
        .expect("the prefix is taken from the summary");
    assert_eq!(prefix.len_bytes, summarised_len);
    assert_eq!((journal.first_op(), journal.last_op()), (1, 20));
    for (&op, written) in &writtens {
        assert!(holds(&journal, op, written).expect("read"), "op {op}");
    }
    assert_index_as_read(&disk, &dir, &journal, "");

    // A rewrite of op 4 cuts into the prefix: the summary goes first.
    let mut journal = journal;
    write(&mut journal, 4, &random_written(&mut rng, 4)).expect("rewrite op 4");
    assert!(
        !has_summary(&disk, &dir, 1),
        "a cut into the prefix removes its summary"
    );
    journal.sync().expect("sync");
    drop(journal);
    let journal = open_sized(&disk, &dir, 1 << 20).expect("open after the cut");
    assert!(journal.unverified_prefix().is_none(), "nothing taken unread");
    assert_eq!(journal.last_op(), 4);
}

/// Between clean stops, the durable part of the segment being written is summarised once it
/// has grown by the step given (and by the growth factor times the summary's size): a start
/// after a process crash takes that prefix from the summary and reads only what follows,
/// building the index a read of everything builds. A summary written without a barrier and
/// lost or torn by a power loss is no summary: the start reads the segment.
#[test]
fn progress_summaries_bound_what_a_start_after_a_crash_reads() {
    let mut rng = SimRng::new(23);
    let (disk, dir, mut journal) = created(1 << 20);
    let mut writtens: BTreeMap<u64, Written> = BTreeMap::new();
    let write_synced =
        |journal: &mut JournalLog, op: u64, rng: &mut SimRng, writtens: &mut BTreeMap<u64, Written>| {
            let written = random_written(rng, op);
            write(journal, op, &written).expect("write");
            journal.sync().expect("sync");
            writtens.insert(op, written);
        };
    for op in 1..=10 {
        write_synced(&mut journal, op, &mut rng, &mut writtens);
    }
    let len_at = |journal: &JournalLog| journal.segments()[0].size_bytes;
    assert!(
        !journal.summarise_progress(len_at(&journal) + 1, 0),
        "not grown by the step yet"
    );
    assert!(
        !journal.summarise_progress(1, 1 << 20),
        "not grown by the factor times the summary's size yet"
    );
    disk.fail_next_writes(1);
    assert!(!journal.summarise_progress(1, 0), "the write fails");
    assert!(
        !journal.summarise_progress(1, 0),
        "not tried again before the segment grows by the step"
    );
    write_synced(&mut journal, 11, &mut rng, &mut writtens);
    assert!(journal.summarise_progress(1, 0));
    let summarised = len_at(&journal);
    assert!(
        !journal.summarise_progress(0, 0),
        "nothing grew since the last summary"
    );
    for op in 12..=20 {
        write_synced(&mut journal, op, &mut rng, &mut writtens);
    }
    // Written after the last summary, not yet synced: a process crash keeps it, but it lies
    // above the frontier and is dropped (a durable journal).
    write(&mut journal, 21, &random_written(&mut rng, 21)).expect("write");
    drop(journal);
    disk.kill_process();
    assert!(has_summary(&disk, &dir, 1));

    let journal = open_sized(&disk, &dir, 1 << 20).expect("open after a process crash");
    let prefix = journal
        .unverified_prefix()
        .cloned()
        .expect("the summarised prefix is taken unread");
    assert_eq!(prefix.len_bytes, summarised);
    assert_eq!(journal.last_op(), 20);
    for (&op, written) in &writtens {
        assert!(holds(&journal, op, written).expect("read"), "op {op}");
    }
    assert_index_as_read(&disk, &dir, &journal, "");

    // A power loss after a summary written without a barrier: whatever of it survived (the
    // summary, nothing, or a torn file), the start opens with every synced op and builds
    // what a read of everything builds. Each seed runs the scenario afresh.
    drop(journal);
    let (mut adopted, mut read_whole) = (0, 0);
    for seed in 0..40 {
        let mut rng = SimRng::new(seed);
        let (disk, dir, mut journal) = created(1 << 20);
        let mut writtens = BTreeMap::new();
        for op in 1..=12 {
            write_synced(&mut journal, op, &mut rng, &mut writtens);
        }
        assert!(journal.summarise_progress(1, 0));
        for op in 13..=14 {
            write_synced(&mut journal, op, &mut rng, &mut writtens);
        }
        drop(journal);
        disk.crash(seed);
        let journal = open_sized(&disk, &dir, 1 << 20).expect("open after a power loss");
        assert_eq!(journal.last_op(), 14, "seed {seed}: every synced op is there");
        for (&op, written) in &writtens {
            assert!(
                holds(&journal, op, written).expect("read"),
                "seed {seed}: op {op}"
            );
        }
        assert_index_as_read(&disk, &dir, &journal, &format!("seed {seed}"));
        match journal.unverified_prefix() {
            Some(_) => adopted += 1,
            None => read_whole += 1,
        }
    }
    assert!(
        adopted > 0 && read_whole > 0,
        "both outcomes of a power loss occur: the summary taken {adopted} times, the segment read {read_whole} times"
    );
}

/// The index `journal`'s open built (taking what it could from summaries) is the one a
/// read-only open of `dir` builds by reading every segment.
fn assert_index_as_read(disk: &SimDisk, dir: &Path, journal: &JournalLog, context: &str) {
    let (read_only, _) = JournalLog::open_read_only_on(
        Arc::new(disk.clone()),
        dir,
        PARTITION,
        JournalConfig {
            segment_size_bytes: 1 << 20,
            relaxed: false,
        },
    )
    .expect("read-only open");
    assert_eq!(
        read_only.extents().copied().collect::<Vec<_>>(),
        journal.extents().copied().collect::<Vec<_>>(),
        "{context}: the ops the summaries gave are the ones a read finds"
    );
    assert_eq!(
        (read_only.segments(), read_only.batch_count(), read_only.chain()),
        (journal.segments(), journal.batch_count(), journal.chain()),
        "{context}: the segments and batches the summaries gave are the ones a read finds"
    );
}

/// The page cache of bytes a barrier made stable is released behind the end of the segment
/// being written, keeping the last `CACHE_KEPT_BEHIND_BYTES`; bytes no barrier covered are
/// never released; a sealed segment's synced bytes are released the same way; every op reads
/// back unchanged.
#[test]
fn synced_bytes_behind_the_kept_window_leave_the_page_cache() {
    const MIB: u64 = 1 << 20;
    const { assert!(CACHE_KEPT_BEHIND_BYTES >= MIB && CACHE_KEPT_BEHIND_BYTES <= 64 * MIB) };
    let ops_in_window = CACHE_KEPT_BEHIND_BYTES / MIB;
    // Segments of twice the window plus a bit, so that the test also crosses a seal.
    let (disk, dir, mut journal) = created(2 * CACHE_KEPT_BEHIND_BYTES + 3 * MIB);
    let written = |op: u64| Written {
        view: 1,
        op_payload: (0..MIB)
            .map(|index| (op as u8).wrapping_mul(7).wrapping_add(index as u8))
            .collect(),
        batches: Vec::new(),
        skip_to: None,
    };
    let segment_len = |journal: &JournalLog| journal.segments().last().expect("a segment").size_bytes;
    for op in 1..=ops_in_window {
        write(&mut journal, op, &written(op)).expect("write");
        journal.sync().expect("sync");
    }
    assert_eq!(
        disk.stats().cache_released_bytes,
        0,
        "all of it is within the kept window"
    );
    let mut op = ops_in_window;
    while disk.stats().cache_released_bytes == 0 {
        op += 1;
        assert!(
            op < 4 * ops_in_window,
            "released once grown by the window and a step"
        );
        write(&mut journal, op, &written(op)).expect("write");
        // Written but not synced: nothing of it may be released.
        assert_eq!(disk.stats().cache_released_bytes, 0);
        journal.sync().expect("sync");
    }
    let released = disk.stats().cache_released_bytes;
    assert!(
        released <= segment_len(&journal) - CACHE_KEPT_BEHIND_BYTES,
        "{released}"
    );
    // On until a seal, and past it into the next segment.
    let segments_before = journal.segments().len();
    while journal.segments().len() == segments_before
        || segment_len(&journal) < CACHE_KEPT_BEHIND_BYTES + 6 * MIB
    {
        op += 1;
        assert!(
            op < 16 * ops_in_window,
            "the segment is sealed and the next one grows"
        );
        write(&mut journal, op, &written(op)).expect("write");
        journal.sync().expect("sync");
    }
    let stats = disk.stats();
    let sealed_len = journal.segments()[journal.segments().len() - 2].size_bytes;
    assert!(
        stats.cache_released_bytes > released + (sealed_len - released - CACHE_KEPT_BEHIND_BYTES) / 2,
        "the sealed segment's synced bytes and the new one's were released too: {stats:?}"
    );
    assert!(
        stats.cache_released_bytes
            <= sealed_len - CACHE_KEPT_BEHIND_BYTES + segment_len(&journal) - CACHE_KEPT_BEHIND_BYTES,
        "{stats:?}"
    );
    assert_eq!(
        stats.cache_released_unstable, 0,
        "only bytes a barrier covered: {stats:?}"
    );
    for op in 1..=op {
        assert!(holds(&journal, op, &written(op)).expect("read"), "op {op}");
    }
    drop(journal);
    let journal = open_sized(&disk, &dir, 2 * CACHE_KEPT_BEHIND_BYTES + 3 * MIB).expect("reopen");
    assert_eq!(journal.last_op(), op);
}
