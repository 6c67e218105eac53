//! The cluster simulator (`cairn_vsr::sim::cluster`) running the real partition machine over
//! real partition journals: each replica's log journal is a [`LogJournal`] on the storage
//! crate's simulated disk ([`SimDisk`]), written, synced, read back, cut, crashed (power
//! loss: unsynced writes lost or torn), wiped and reopened exactly as the server's shell
//! does, and state transfer moves segments (`cairn_storage::transfer`: an offer, checksummed
//! chunks, a staged journal made live by the superblock write naming its checkpoint).
//! While a replica is down a bit may flip in any of its journal files; an open (and the
//! scrub's pass over the sealed segments, run with it) that refuses the damage sets the whole
//! group aside (`transfer::quarantine`) and the replica rejoins as a wiped one. Each durable
//! checkpoint lets the shell release its oldest segments, as the server's retention does.
//!
//! The checkers are the simulator's (one committed log, identical machine state after every
//! op on every replica, no offset minted twice, replies that match the committed log), plus
//! this harness's own after the run: every replica's journal serves exactly the committed
//! batches at their offsets (polls read the journal, not the machine).
//!
//! `CAIRN_SIM_SEEDS=<n>` runs seeds `0..n` (default 2 000); `CAIRN_SIM_SEED=<s>` replays one.

use super::{LogJournal, LogParams, check_offer, check_staged, holds_prepare};
use crate::node::{GroupJournal, NamedCheckpoint};
use cairn_machine::partition::PartitionMachine;
use cairn_storage::io::Disk;
use cairn_storage::journal;
use cairn_storage::journal::JournalConfig;
use cairn_storage::sim_disk::{SimDisk, SimRng};
use cairn_storage::transfer::{
    self, CheckpointId, ChunkRequest, StagedJournal, Staging, TransferChunk, TransferManifest,
};
use cairn_vsr::checkpoint::Checkpoint;
use cairn_vsr::header::Message;
use cairn_vsr::journal::SlotState;
use cairn_vsr::replica::StateMachine;
use cairn_vsr::sim::cluster::{SIM_CLUSTER, SIM_GROUP, Sim, SimOptions};
use cairn_vsr::sim::log_store::{Chunk, Opened, SimLog};
use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;

/// The partition id the simulated groups' records carry.
const PARTITION: u32 = 0;
/// Small segments, so that logs span several and transfers move several.
const SEGMENT_SIZE_BYTES: u64 = 4 * 1024;

/// One replica's partition journal on a simulated disk.
struct JournalSimLog {
    disk: SimDisk,
    group_dir: PathBuf,
    journal: Option<LogJournal>,
    /// A verified staging waiting for the superblock, with the checksum of its checkpoint's
    /// prepare.
    staged: Option<(StagedJournal, u128)>,
    checkpoint_size_max: usize,
    /// Installs by state transfer: staged, made live, abandoned (the core did not take them).
    staged_count: u64,
    committed_count: u64,
    abandoned_count: u64,
    /// Offers refused (not the checkpoint's, stale, or not verifying).
    refused_count: u64,
    /// The files a bit flipped in since the log last opened, with their bytes before, in
    /// flip order: only those may make an open refuse (an open that still refuses with them
    /// restored is a violation).
    flipped: Vec<(PathBuf, Vec<u8>)>,
    /// Opens refused for damage, the group set aside; of those, the ones on the current disk
    /// (a wipe takes the others).
    quarantined_count: u64,
    quarantined_on_disk: u64,
    /// Segments released by retention (the durable checkpoint past them, their messages
    /// purged or trimmed).
    released_count: u64,
    /// The mutation: install an offer without checking it against the checkpoint being
    /// installed and the replica's own state.
    skip_offer_checks: bool,
}

/// A replica's log as the cluster drives it, shared with the test (which reads the journals
/// after the run).
struct Shared(Rc<RefCell<JournalSimLog>>);

impl JournalSimLog {
    fn new(checkpoint_size_max: usize, skip_offer_checks: bool) -> JournalSimLog {
        let mut log = JournalSimLog {
            disk: SimDisk::new(),
            group_dir: PathBuf::from("/sim/group"),
            journal: None,
            staged: None,
            checkpoint_size_max,
            staged_count: 0,
            committed_count: 0,
            abandoned_count: 0,
            refused_count: 0,
            flipped: Vec::new(),
            quarantined_count: 0,
            quarantined_on_disk: 0,
            released_count: 0,
            skip_offer_checks,
        };
        log.format();
        log
    }

    fn params(&self) -> LogParams {
        LogParams {
            partition_id: PARTITION,
            segment_size_bytes: SEGMENT_SIZE_BYTES,
            relaxed: false,
            disk: Arc::new(self.disk.clone()),
        }
    }

    fn config() -> JournalConfig {
        JournalConfig {
            segment_size_bytes: SEGMENT_SIZE_BYTES,
            relaxed: false,
        }
    }

    /// A new, empty journal (a fresh or wiped disk).
    fn format(&mut self) {
        self.disk
            .create_dir_all(&self.group_dir)
            .expect("the group directory");
        let journal = LogJournal::create(&self.group_dir, &self.params(), (SIM_CLUSTER, SIM_GROUP))
            .expect("a journal on a blank disk");
        self.journal = Some(journal);
    }

    /// Checkpoint `bytes` (whose checksum is `checksum`), verified, and the machine restored
    /// from it.
    fn checkpoint_machine(
        &self,
        bytes: &[u8],
        checksum: u128,
    ) -> Result<(Checkpoint, PartitionMachine), String> {
        let checkpoint =
            Checkpoint::decode(bytes, self.checkpoint_size_max, checksum, SIM_CLUSTER, SIM_GROUP)
                .map_err(|fault| format!("the checkpoint does not verify: {fault:?}"))?;
        let mut machine = PartitionMachine::new(PARTITION);
        machine.restore(&checkpoint.state_machine)?;
        Ok((checkpoint, machine))
    }

    /// Open the log as a restart does, then run the scrub's pass over every sealed segment
    /// (read and verified in full), and verify the prefix of the frontier's segment the open
    /// took from a summary unread, as the server does before a partition answers anything
    /// (`partition::serving`).
    fn open_checked(
        &self,
        named: NamedCheckpoint,
        journal_slots: usize,
    ) -> Result<(LogJournal, Vec<SlotState>), String> {
        let (journal, slots, damaged) = LogJournal::open_journal(
            &self.group_dir,
            &self.params(),
            false,
            (SIM_CLUSTER, SIM_GROUP),
            named,
            journal_slots,
        )
        .map_err(|error| error.to_string())?;
        if !damaged.is_empty() {
            return Err(format!("damaged ops at open: {damaged:?}"));
        }
        for segment in journal.log.sealed_segments() {
            journal::verify_sealed(&self.disk, &segment).map_err(|error| error.to_string())?;
        }
        let mut journal = journal;
        journal
            .log
            .verify_unverified_prefix()
            .map_err(|error| error.to_string())?;
        Ok((journal, slots))
    }

    fn journal(&mut self) -> Result<&mut LogJournal, String> {
        self.journal
            .as_mut()
            .ok_or_else(|| "the journal is not open (crashed)".to_string())
    }
}

impl SimLog for JournalSimLog {
    fn write(&mut self, message: &Message) -> Result<(), String> {
        self.journal()?
            .write_prepare(message)
            .map_err(|error| error.to_string())
    }

    fn sync(&mut self) -> Result<(), String> {
        self.journal()?
            .prepares_barrier()
            .map_err(|error| error.to_string())
    }

    fn read(&mut self, op: u64, checksum: u128) -> Option<Message> {
        self.journal.as_mut()?.read_prepare(op, checksum)
    }

    fn crash(&mut self, seed: u64) {
        self.journal = None;
        self.staged = None;
        self.disk.crash(seed);
    }

    fn wipe(&mut self) {
        self.journal = None;
        self.staged = None;
        self.disk = SimDisk::new();
        self.flipped.clear();
        self.quarantined_on_disk = 0;
    }

    fn recover(
        &mut self,
        checkpoint: Option<(u64, u128, u128)>,
        journal_slots: usize,
    ) -> Result<Opened, String> {
        self.journal = None;
        self.staged = None;
        let Some((op, checksum, prepare_checksum)) = checkpoint else {
            self.format();
            self.flipped.clear();
            return Ok(Opened::Log(vec![SlotState::Empty; journal_slots]));
        };
        let named = NamedCheckpoint {
            id: CheckpointId { op, checksum },
            prepare_checksum,
        };
        match self.open_checked(named, journal_slots) {
            Ok((journal, slots)) => {
                self.journal = Some(journal);
                self.flipped.clear();
                Ok(Opened::Log(slots))
            }
            Err(reason) if !self.flipped.is_empty() => {
                // The flips must explain the refusal: with their bytes restored it opens.
                for (path, bytes) in std::mem::take(&mut self.flipped).into_iter().rev() {
                    self.disk.overwrite_durable(&path, bytes);
                }
                if let Err(still) = self.open_checked(named, journal_slots) {
                    return Err(format!(
                        "the open refused ({reason}), and still refuses with the flipped bits restored: {still}"
                    ));
                }
                // Damage: the node sets the whole group aside and rebuilds it from its peers.
                transfer::quarantine(&self.disk, &self.group_dir)
                    .map_err(|error| format!("{reason}; and the quarantine failed: {error}"))?;
                self.quarantined_count += 1;
                self.quarantined_on_disk += 1;
                Ok(Opened::Quarantined(reason))
            }
            Err(reason) => Err(reason),
        }
    }

    fn release(
        &mut self,
        checkpoint_op: u64,
        checkpoint_checksum: u128,
        checkpoint: &[u8],
    ) -> Result<(), String> {
        if self.journal.is_none() {
            return Ok(());
        }
        let (_, machine) = self.checkpoint_machine(checkpoint, checkpoint_checksum)?;
        let start_offset = machine.state().start_offset;
        let journal = self.journal()?;
        // As the server's retention does (`PartitionGroup::remove_released_segments`), from
        // the durable checkpoint.
        let removed = journal
            .log
            .remove_oldest_segments(checkpoint_op + 1, start_offset)
            .map_err(|error| error.to_string())?;
        if journal.log.first_offset() > start_offset || journal.log.first_op() > checkpoint_op + 1 {
            return Err(format!(
                "released up to op {} and offset {}, past the checkpoint's op {checkpoint_op} or start offset {start_offset}",
                journal.log.first_op(),
                journal.log.first_offset()
            ));
        }
        self.released_count += removed.len() as u64;
        Ok(())
    }

    fn first_op(&self) -> u64 {
        self.journal.as_ref().map_or(1, |journal| journal.log.first_op())
    }

    fn flip(&mut self, seed: u64) -> bool {
        let mut rng = SimRng::new(seed);
        let files: Vec<(PathBuf, Vec<u8>)> = self
            .disk
            .files_under(&self.group_dir)
            .into_iter()
            .filter_map(|path| {
                let bytes = self.disk.read_volatile(&path)?;
                (!bytes.is_empty()).then_some((path, bytes))
            })
            .collect();
        if files.is_empty() {
            return false;
        }
        let (path, original) = files[rng.below(files.len() as u64) as usize].clone();
        let mut bytes = original.clone();
        let bit = rng.below(bytes.len() as u64 * 8);
        bytes[(bit / 8) as usize] ^= 1 << (bit % 8);
        let flipped = self.disk.overwrite_durable(&path, bytes);
        if flipped {
            self.flipped.push((path, original));
        }
        flipped
    }

    fn holds_durably(&self, op: u64, checksum: u128) -> bool {
        self.journal
            .as_ref()
            .is_some_and(|journal| holds_prepare(&journal.log, op, checksum))
    }

    fn offer(&self, checkpoint_op: u64, checkpoint_checksum: u128, checkpoint: &[u8]) -> Option<Vec<u8>> {
        let journal = self.journal.as_ref()?;
        let (_, machine) = self.checkpoint_machine(checkpoint, checkpoint_checksum).ok()?;
        let manifest = TransferManifest::of(
            &journal.log,
            CheckpointId {
                op: checkpoint_op,
                checksum: checkpoint_checksum,
            },
            machine.state().purge_generation,
        )
        .ok()?;
        Some(manifest.encode())
    }

    fn chunk(&self, segment: u64, position: u64, len: u64) -> Option<Chunk> {
        let journal = self.journal.as_ref()?;
        let chunk = TransferChunk::read(
            &journal.log,
            ChunkRequest {
                segment_first_op: segment,
                position_bytes: position,
                len_bytes: len,
            },
        )
        .ok()?;
        Some((chunk.bytes, chunk.checksum))
    }

    fn stage(
        &mut self,
        offer: &[u8],
        (checkpoint, checkpoint_checksum): (&[u8], u128),
        own_state: &[u8],
        fetch: &mut dyn FnMut(u64, u64, u64) -> Option<Chunk>,
    ) -> Result<(), String> {
        if self.journal.is_none() {
            return Err("the journal is not open".into());
        }
        if self.staged.is_some() {
            // One install at a time: the pending one may already be committed by a
            // superblock write in flight.
            return Err("an install is pending".into());
        }
        let manifest = TransferManifest::decode(offer, PARTITION)?;
        let (checkpoint, offered) = self.checkpoint_machine(checkpoint, checkpoint_checksum)?;
        let mut own = PartitionMachine::new(PARTITION);
        own.restore(own_state)?;
        if !self.skip_offer_checks
            && let Err(reason) = check_offer(
                &manifest,
                &checkpoint,
                checkpoint_checksum,
                offered.state(),
                own.state(),
            )
        {
            self.refused_count += 1;
            return Err(reason);
        }
        let disk: Arc<dyn Disk> = Arc::new(self.disk.clone());
        let mut staging =
            Staging::begin(disk, &self.group_dir, manifest).map_err(|error| error.to_string())?;
        let generation = staging.generation();
        let skip_offer_checks = self.skip_offer_checks;
        let finished = (|| {
            while let Some(request) = staging.next_request() {
                let (bytes, checksum) = fetch(
                    request.segment_first_op,
                    request.position_bytes,
                    request.len_bytes,
                )
                .ok_or_else(|| format!("the peer did not send segment {}", request.segment_first_op))?;
                staging
                    .write_chunk(&TransferChunk {
                        segment_first_op: request.segment_first_op,
                        position_bytes: request.position_bytes,
                        bytes,
                        checksum,
                    })
                    .map_err(|error| error.to_string())?;
            }
            staging
                .finish_checked(Self::config(), &|journal| {
                    if skip_offer_checks {
                        return Ok(());
                    }
                    check_staged(journal, &checkpoint, offered.state())
                })
                .map_err(|error| error.to_string())
        })();
        match finished {
            Ok(staged) => {
                self.staged = Some((staged, checkpoint.header.checksum));
                self.staged_count += 1;
                Ok(())
            }
            Err(reason) => {
                self.refused_count += 1;
                transfer::abandon(&self.disk, &self.group_dir, generation)
                    .map_err(|error| error.to_string())?;
                Err(reason)
            }
        }
    }

    fn commit_staged(&mut self) -> Result<(), String> {
        let (staged, prepare_checksum) = self.staged.take().ok_or("nothing staged")?;
        // The old journal's files go with the commit: close it first.
        self.journal = None;
        transfer::commit(&self.disk, &self.group_dir, staged.generation, staged.checkpoint)
            .map_err(|error| error.to_string())?;
        let (journal, _, _) = LogJournal::open_journal(
            &self.group_dir,
            &self.params(),
            false,
            (SIM_CLUSTER, SIM_GROUP),
            NamedCheckpoint {
                id: staged.checkpoint,
                prepare_checksum,
            },
            1,
        )
        .map_err(|error| error.to_string())?;
        self.journal = Some(journal);
        self.committed_count += 1;
        Ok(())
    }

    fn served(&mut self, op: u64) -> Option<u64> {
        let journal = self.journal.as_ref()?;
        let stored = journal.log.read_op(op).ok()?;
        let mut digest = xxhash_rust::xxh3::Xxh3::new();
        for batch in &stored.batches {
            digest.update(batch);
        }
        Some(digest.digest())
    }

    fn abandon_staged(&mut self) {
        if let Some((staged, _)) = self.staged.take() {
            self.abandoned_count += 1;
            transfer::abandon(&self.disk, &self.group_dir, staged.generation).expect("abandon a staging");
        }
    }
}

impl SimLog for Shared {
    fn write(&mut self, message: &Message) -> Result<(), String> {
        self.0.borrow_mut().write(message)
    }
    fn sync(&mut self) -> Result<(), String> {
        self.0.borrow_mut().sync()
    }
    fn read(&mut self, op: u64, checksum: u128) -> Option<Message> {
        self.0.borrow_mut().read(op, checksum)
    }
    fn crash(&mut self, seed: u64) {
        self.0.borrow_mut().crash(seed);
    }
    fn wipe(&mut self) {
        self.0.borrow_mut().wipe();
    }
    fn recover(
        &mut self,
        checkpoint: Option<(u64, u128, u128)>,
        journal_slots: usize,
    ) -> Result<Opened, String> {
        self.0.borrow_mut().recover(checkpoint, journal_slots)
    }
    fn flip(&mut self, seed: u64) -> bool {
        self.0.borrow_mut().flip(seed)
    }
    fn release(
        &mut self,
        checkpoint_op: u64,
        checkpoint_checksum: u128,
        checkpoint: &[u8],
    ) -> Result<(), String> {
        self.0
            .borrow_mut()
            .release(checkpoint_op, checkpoint_checksum, checkpoint)
    }
    fn first_op(&self) -> u64 {
        self.0.borrow().first_op()
    }
    fn holds_durably(&self, op: u64, checksum: u128) -> bool {
        self.0.borrow().holds_durably(op, checksum)
    }
    fn offer(&self, checkpoint_op: u64, checkpoint_checksum: u128, checkpoint: &[u8]) -> Option<Vec<u8>> {
        self.0
            .borrow()
            .offer(checkpoint_op, checkpoint_checksum, checkpoint)
    }
    fn chunk(&self, segment: u64, position: u64, len: u64) -> Option<Chunk> {
        self.0.borrow().chunk(segment, position, len)
    }
    fn stage(
        &mut self,
        offer: &[u8],
        checkpoint: (&[u8], u128),
        own_state: &[u8],
        fetch: &mut dyn FnMut(u64, u64, u64) -> Option<Chunk>,
    ) -> Result<(), String> {
        self.0.borrow_mut().stage(offer, checkpoint, own_state, fetch)
    }
    fn commit_staged(&mut self) -> Result<(), String> {
        self.0.borrow_mut().commit_staged()
    }
    fn abandon_staged(&mut self) {
        self.0.borrow_mut().abandon_staged();
    }
    fn served(&mut self, op: u64) -> Option<u64> {
        self.0.borrow_mut().served(op)
    }
}

/// The options of seed `seed`, with a log journal whatever shape it drew.
fn options(seed: u64) -> SimOptions {
    let mut options = SimOptions::from_seed(seed);
    options.shape.log_journal = true;
    // A quarter of the offers are stale or forked (an older op of the log, or another
    // replica's log): the receiver must refuse those that are not the checkpoint's.
    options.stale_offer_ppm = 250_000;
    options.shape.message_size_max = options
        .shape
        .message_size_max
        .max(cairn_vsr::constants::Shape::METADATA.message_size_max);
    assert_eq!(options.shape.check(), Ok(()));
    options
}

/// What one seed did to the journals.
#[derive(Debug, Default)]
struct Totals {
    staged: u64,
    committed: u64,
    abandoned: u64,
    /// Offers refused (forked ones among them).
    refused: u64,
    /// Groups set aside for damage found at their open.
    quarantined: u64,
    /// Segments released by retention.
    released: u64,
    /// Ops compared across replicas' journals after the run.
    ops_compared: u64,
}

/// Run seed `seed`, then the journal checker: every pair of replicas' journals holds the
/// same bytes (op records and stamped batches) for every op both hold up to both commit
/// points (and both logs' written ends, `Replica::log_written_end`), and serves the same
/// polls over them.
fn run_seed(seed: u64) -> Result<(cairn_vsr::sim::cluster::Outcome, Totals), String> {
    run_with(seed, options(seed), false)
}

fn run_with(
    seed: u64,
    options: SimOptions,
    skip_offer_checks: bool,
) -> Result<(cairn_vsr::sim::cluster::Outcome, Totals), String> {
    let checkpoint_size_max = options.shape.checkpoint_size_max();
    let logs: Vec<Rc<RefCell<JournalSimLog>>> = (0..options.replica_count)
        .map(|_| {
            Rc::new(RefCell::new(JournalSimLog::new(
                checkpoint_size_max,
                skip_offer_checks,
            )))
        })
        .collect();
    let sim = Sim::<PartitionMachine>::with_logs(seed, options, &|replica| {
        Box::new(Shared(Rc::clone(&logs[usize::from(replica)])))
    });
    let outcome = sim.run().map_err(|violation| format!("{violation:?}"))?;
    let mut totals = Totals::default();
    for log in &logs {
        let log = log.borrow();
        totals.staged += log.staged_count;
        totals.committed += log.committed_count;
        totals.abandoned += log.abandoned_count;
        totals.refused += log.refused_count;
        totals.quarantined += log.quarantined_count;
        totals.released += log.released_count;
        // Every group set aside is still there, whole, beside the live one.
        let parent = log.group_dir.parent().expect("the group's parent");
        let set_aside = log
            .disk
            .list_dir(parent)
            // A wiped disk not yet formatted (its replica down at the end) has no directory.
            .unwrap_or_default()
            .into_iter()
            .filter(|name| name.starts_with("group.quarantine."))
            .count() as u64;
        if set_aside != log.quarantined_on_disk {
            return Err(format!(
                "{} quarantines on this disk, {set_aside} quarantined groups on it",
                log.quarantined_on_disk
            ));
        }
    }
    for (a, b) in (0..logs.len()).flat_map(|a| (a + 1..logs.len()).map(move |b| (a, b))) {
        let (log_a, log_b) = (logs[a].borrow(), logs[b].borrow());
        let (Some(journal_a), Some(journal_b)) = (log_a.journal.as_ref(), log_b.journal.as_ref()) else {
            // Down at the end (a sync failure armed before the final heal crashed it after
            // the clients were done): nothing of its to compare.
            continue;
        };
        let (journal_a, journal_b) = (&journal_a.log, &journal_b.log);
        let first = journal_a.first_op().max(journal_b.first_op());
        // What each serves: committed, and in its log as its replica has it (a backup
        // catching up applies ops before it has rewritten them in its log).
        let last = outcome.commit_points[a]
            .min(outcome.commit_points[b])
            .min(outcome.log_written_ends[a])
            .min(outcome.log_written_ends[b])
            .min(journal_a.last_op())
            .min(journal_b.last_op());
        for op in first..=last {
            let (stored_a, stored_b) = (journal_a.read_op(op), journal_b.read_op(op));
            match (stored_a, stored_b) {
                (Ok(stored_a), Ok(stored_b)) if stored_a == stored_b => totals.ops_compared += 1,
                (stored_a, stored_b) => {
                    let views = |journal: &cairn_storage::journal::JournalLog| {
                        (op.saturating_sub(3)..=op + 3)
                            .map(|op| journal.extent(op).map(|extent| (op, extent.view)))
                            .collect::<Vec<_>>()
                    };
                    eprintln!(
                        "written ends {:?} commit points {:?}; a: first {} last {} durable {} views {:?}; b: first {} last {} durable {} views {:?}",
                        outcome.log_written_ends,
                        outcome.commit_points,
                        journal_a.first_op(),
                        journal_a.last_op(),
                        journal_a.durable_op(),
                        views(journal_a),
                        journal_b.first_op(),
                        journal_b.last_op(),
                        journal_b.durable_op(),
                        views(journal_b)
                    );
                    return Err(format!(
                        "committed op {op} differs between replicas {a} and {b}: {:?} / {:?}",
                        stored_a.map(|stored| stored.op_payload.len()),
                        stored_b.map(|stored| stored.op_payload.len())
                    ));
                }
            }
        }
        if first <= last {
            // Polls over the same committed ops read the same bytes.
            let from = journal_a
                .extent(first)
                .map_or(0, |extent| extent.chain_before.next_offset);
            let end = journal_a
                .extent(last + 1)
                .map_or(journal_a.chain().next_offset, |extent| {
                    extent.chain_before.next_offset
                });
            let (mut served_a, mut served_b) = (Vec::new(), Vec::new());
            let read_a = journal_a.read_into(from, u32::MAX, end, &mut served_a);
            let read_b = journal_b.read_into(from, u32::MAX, end, &mut served_b);
            if read_a.is_err() || read_b.is_err() || served_a != served_b {
                return Err(format!(
                    "polls of offsets {from}..{end} differ between replicas {a} and {b}"
                ));
            }
        }
    }
    Ok((outcome, totals))
}

fn seeds() -> std::ops::Range<u64> {
    if let Some(seed) = std::env::var("CAIRN_SIM_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
    {
        return seed..seed + 1;
    }
    let count = std::env::var("CAIRN_SIM_SEEDS")
        .ok()
        .and_then(|count| count.parse().ok())
        .unwrap_or(2_000);
    0..count
}

#[test]
fn partition_groups_over_real_journals_survive_the_fault_set() {
    let (mut transfers, mut kept, mut crashes, mut committed, mut wipes, mut flips) = (0, 0, 0, 0, 0, 0);
    let mut all = Totals::default();
    for seed in seeds() {
        // A panic in the core (an assertion) is a violation of this seed too.
        let ran = std::panic::catch_unwind(|| run_seed(seed))
            .unwrap_or_else(|panic| Err(format!("panicked: {:?}", panic.downcast_ref::<String>())));
        let (outcome, totals) = ran.unwrap_or_else(|violation| panic!("seed {seed}: {violation}"));
        all.staged += totals.staged;
        all.committed += totals.committed;
        all.abandoned += totals.abandoned;
        all.refused += totals.refused;
        all.quarantined += totals.quarantined;
        all.released += totals.released;
        all.ops_compared += totals.ops_compared;
        transfers += outcome.state_transfers;
        kept += outcome.state_transfers_keeping_log;
        crashes += outcome.crashes;
        committed += outcome.committed_ops;
        wipes += outcome.wipes;
        flips += outcome.bits_flipped;
        assert_eq!(
            outcome.quarantines, totals.quarantined,
            "seed {seed}: every quarantine the cluster saw is one the journals made"
        );
    }
    println!(
        "{} seeds: {committed} ops committed, {crashes} crashes, {wipes} wipes, {flips} bits flipped in journal files, {} journals set aside for damage, {} segments released by retention, {transfers} state transfers ({kept} keeping the log); journals: {} staged, {} installed, {} abandoned, {} offers refused; {} committed ops compared across replicas",
        seeds().count(),
        all.quarantined,
        all.released,
        all.staged,
        all.committed,
        all.abandoned,
        all.refused,
        all.ops_compared
    );
    if seeds().count() >= 100 {
        assert!(
            transfers > 0
                && crashes > 0
                && wipes > 0
                && flips > 0
                && all.quarantined > 0
                && all.released > 0
                && all.committed > 0
                && all.ops_compared > 0,
            "the faults reached nothing"
        );
    }
}

/// Mutation test: a replica that serves polls above its commit point serves messages a view
/// change later replaces, and the poll checker says so.
#[test]
fn a_poll_above_the_commit_point_is_caught() {
    let caught = (0..2_000u64).find(|&seed| {
        let mut options = options(seed);
        options.poll_above_commit_point = true;
        run_with(seed, options, false).is_err_and(|violation| violation.contains("served op"))
    });
    assert!(
        caught.is_some(),
        "no seed of 2 000 caught polls above the commit point"
    );
    println!("caught by seed {caught:?}");
}

/// Mutation test: a receiver that installs an offer without checking it against the
/// checkpoint (stale offers are on) installs a log that is not the checkpoint's, and the
/// checkers see it.
#[test]
fn installing_an_offer_without_checking_it_is_caught() {
    let caught = (0..2_000u64).find(|&seed| run_with(seed, options(seed), true).is_err());
    assert!(caught.is_some(), "no seed of 2 000 caught an unchecked install");
    println!(
        "caught by seed {caught:?}: {:?}",
        caught.map(|seed| run_with(seed, options(seed), true))
    );
}
