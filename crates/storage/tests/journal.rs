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
//! `CAIRN_SIM_SEEDS=<n>` runs seeds `0..n` (default 1000); `CAIRN_SIM_SEED=<s>` replays one.

mod common;

use cairn_storage::StorageError;
use cairn_storage::journal::{JournalConfig, JournalLog};
use cairn_storage::record::Chain;
use cairn_storage::sim_disk::{SimDisk, SimRng};
use cairn_wire::batch::BATCH_HEADER_SIZE;
use common::client_batch;
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
    }
}

fn write(journal: &mut JournalLog, op: u64, written: &Written) -> Result<(), StorageError> {
    let batches: Vec<&[u8]> = written.batches.iter().map(Vec::as_slice).collect();
    journal.write_op(op, written.view, 1_000 + op, &written.op_payload, &batches)
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
}

impl Sim {
    fn new(seed: u64) -> Sim {
        let mut rng = SimRng::new(seed);
        let config = JournalConfig {
            segment_size_bytes: rng.range_inclusive(400, 3_000),
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
        }
    }

    fn run(&mut self, steps: u64) {
        for _ in 0..steps {
            if !self.disk.power_is_cut() && self.rng.chance(1, 25) {
                let after = self.rng.below(6);
                self.disk.cut_power_after(after);
            }
            if self.rng.chance(1, 40) {
                self.disk.fail_next_sync_data(1);
            }
            let outcome = self.step();
            if outcome.is_err() || self.disk.power_is_cut() || self.journal().stopped_reason().is_some() {
                self.crash_and_reopen();
            }
        }
        self.disk.cancel_power_cut();
        self.crash_and_reopen();
    }

    fn journal(&mut self) -> &mut JournalLog {
        self.journal.as_mut().expect("open")
    }

    fn step(&mut self) -> Result<(), StorageError> {
        let last = self.journal().last_op();
        let first = self.journal().first_op();
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
            _ => {
                let synced = self.journal().sync()?;
                assert_eq!(synced, last, "seed {}: sync covers every op written", self.seed);
                self.guaranteed = synced;
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
        }
        result
    }

    /// Pick an op near the end to cut at, and forget it and what follows: from here on no
    /// sync vouches for them.
    fn forget_from(&mut self, first: u64, last: u64) -> u64 {
        let op = self.rng.range_inclusive(first.max(last.saturating_sub(6)), last);
        self.guaranteed = self.guaranteed.min(op - 1);
        self.current.split_off(&op);
        self.cuts += 1;
        op
    }

    fn crash_and_reopen(&mut self) {
        self.journal = None;
        self.disk.cancel_power_cut();
        self.disk.crash(self.rng.next_u64());
        self.crashes += 1;
        let seed = self.seed;
        // The read-only inspection sees what the open then does, and changes nothing.
        let stats = self.disk.stats();
        let inspection = JournalLog::inspect_on(&self.disk, &self.dir, PARTITION)
            .unwrap_or_else(|error| panic!("seed {seed}: a crash alone made the inspection refuse: {error}"));
        assert_eq!(
            self.disk.stats(),
            stats,
            "seed {seed}: the inspection synced, created or removed"
        );
        let (journal, recovery) =
            match JournalLog::open_on(Arc::new(self.disk.clone()), &self.dir, PARTITION, self.config) {
                Ok(opened) => opened,
                Err(error) => panic!("seed {seed}: a crash alone made the journal refuse to open: {error}"),
            };
        assert_eq!(
            (
                inspection.bytes_above_frontier,
                inspection.durable_op,
                inspection.last_op
            ),
            (recovery.dropped_bytes, recovery.durable_op, journal.last_op()),
            "seed {seed}: the inspection and the open disagree"
        );
        assert_eq!(inspection.next_offset, journal.chain().next_offset);
        assert!(
            recovery.durable_op >= self.guaranteed,
            "seed {seed}: the frontier went back to op {} behind the synced op {}",
            recovery.durable_op,
            self.guaranteed
        );
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
        self.guaranteed = recovery.durable_op;
        self.drops += u64::from(recovery.dropped_bytes > 0);
        self.journal = Some(journal);
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
    let (mut crashes, mut cuts, mut ops, mut drops) = (0, 0, 0, 0);
    for seed in seeds() {
        let mut sim = Sim::new(seed);
        sim.run(120);
        crashes += sim.crashes;
        cuts += sim.cuts;
        ops += sim.current.len() as u64;
        drops += sim.drops;
    }
    // The workload reaches what it claims to test.
    if seeds().len() >= 100 {
        assert!(
            crashes > 1_000 && cuts > 1_000 && ops > 3_000 && drops > 500,
            "crashes {crashes}, cuts {cuts}, ops {ops}, reopens that dropped unsynced bytes {drops}"
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
        JournalConfig { segment_size_bytes },
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
            journal.extent(op).expect("extent").segment_base_offset
                != journal.extent(1).expect("extent").segment_base_offset
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
    let path = dir.join(cairn_storage::log::segment_log_name(0));
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
