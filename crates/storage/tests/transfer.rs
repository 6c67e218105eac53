//! State transfer of a journal (`cairn_storage::transfer`) over the simulated disk: a source
//! journal's segments up to a checkpoint staged into a target's group directory and installed
//! with one commit point (a superblock the test models as an atomic file).
//!
//! The crash test cuts the power at every step of an install in turn (each disk operation,
//! then a power loss that keeps a random part of what was not synced) and checks that the
//! open afterwards finds exactly the old journal or exactly the transferred one, as the
//! superblock decides, and nothing else left in the group directory.

mod common;

use cairn_storage::StorageError;
use cairn_storage::atomic_file;
use cairn_storage::io::Disk;
use cairn_storage::journal::{JournalConfig, JournalLog, StoredOp};
use cairn_storage::record::Chain;
use cairn_storage::sim_disk::{SimDisk, SimRng};
use cairn_storage::transfer::{
    self, CheckpointId, ChunkRequest, JOURNAL_LIVE_FILE, Staging, TransferChunk, TransferManifest,
};
use common::client_batch;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const PARTITION: u32 = 4;
const SUPERBLOCK: &str = "superblock";

fn config() -> JournalConfig {
    JournalConfig {
        segment_size_bytes: 700,
        relaxed: false,
    }
}

/// A journal of ops `1..=ops` in `dir`, all synced: appends of one to three batches and op
/// records alone, their contents drawn from `seed`.
fn journal_with(disk: &SimDisk, dir: &Path, ops: u64, seed: u64) -> JournalLog {
    let mut rng = SimRng::new(seed);
    let mut journal = JournalLog::create_on(
        Arc::new(disk.clone()),
        dir,
        PARTITION,
        config(),
        Chain::genesis(PARTITION),
    )
    .expect("create");
    for op in 1..=ops {
        let payload = format!("op {op} of seed {seed}").into_bytes();
        let batches: Vec<Vec<u8>> = if rng.chance(1, 4) {
            Vec::new()
        } else {
            (0..rng.range_inclusive(1, 3))
                .map(|batch| {
                    let messages = (0..rng.range_inclusive(1, 4))
                        .map(|message| {
                            format!("seed {seed} op {op} batch {batch} message {message}").into_bytes()
                        })
                        .collect::<Vec<_>>();
                    client_batch(&messages)
                })
                .collect()
        };
        let batches: Vec<&[u8]> = batches.iter().map(Vec::as_slice).collect();
        journal
            .write_op(op, 1, 1_000 + op, &payload, &batches)
            .expect("write");
    }
    journal.sync().expect("sync");
    journal
}

fn ops_of(journal: &JournalLog) -> Vec<StoredOp> {
    (journal.first_op()..=journal.last_op())
        .map(|op| journal.read_op(op).expect("read op"))
        .collect()
}

fn write_superblock(disk: &dyn Disk, group: &Path, checkpoint: CheckpointId) -> Result<(), StorageError> {
    let mut bytes = checkpoint.op.to_le_bytes().to_vec();
    bytes.extend_from_slice(&checkpoint.checksum.to_le_bytes());
    atomic_file::write_on(disk, &group.join(SUPERBLOCK), &bytes)
}

fn read_superblock(disk: &dyn Disk, group: &Path) -> Option<CheckpointId> {
    let bytes = atomic_file::read_on(disk, &group.join(SUPERBLOCK)).expect("superblock")?;
    Some(CheckpointId {
        op: u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")),
        checksum: u128::from_le_bytes(bytes[8..24].try_into().expect("16 bytes")),
    })
}

/// The checkpoint the tests transfer at `op` (its checksum is the test's own: the storage
/// layer only compares it).
fn checkpoint_at(op: u64) -> CheckpointId {
    CheckpointId {
        op,
        checksum: 0xC0FFEE_u128 << 64 | u128::from(op),
    }
}

/// Stage `source` up to `checkpoint` in `group` (chunks of at most `chunk_bytes`), commit it
/// with the superblock write, then make it live: the whole install as the shell runs it.
fn install(
    source: &JournalLog,
    disk: &SimDisk,
    group: &Path,
    checkpoint: CheckpointId,
    chunk_bytes: u64,
) -> Result<u64, StorageError> {
    let manifest = TransferManifest::of(source, checkpoint, 1)?;
    let mut staging = Staging::begin(Arc::new(disk.clone()), group, manifest)?;
    while let Some(request) = staging.next_request() {
        let request = ChunkRequest {
            len_bytes: request.len_bytes.min(chunk_bytes),
            ..request
        };
        staging.write_chunk(&TransferChunk::read(source, request)?)?;
    }
    let staged = staging.finish(config())?;
    write_superblock(disk, group, checkpoint)?;
    transfer::commit(disk, group, staged.generation, checkpoint)?;
    Ok(staged.generation)
}

/// Stage `source` up to `checkpoint` in `group` whole, marked, not committed.
fn staged_whole(
    source: &JournalLog,
    disk: &SimDisk,
    group: &Path,
    checkpoint: CheckpointId,
) -> transfer::StagedJournal {
    let manifest = TransferManifest::of(source, checkpoint, 1).expect("manifest");
    let mut staging = Staging::begin(Arc::new(disk.clone()), group, manifest).expect("begin");
    while let Some(request) = staging.next_request() {
        staging
            .write_chunk(&TransferChunk::read(source, request).expect("read"))
            .expect("write");
    }
    staging.finish(config()).expect("finish")
}

/// Resolve the group directory as an open does and open the live journal.
fn open_live(disk: &SimDisk, group: &Path) -> (JournalLog, transfer::Resolution) {
    let named = read_superblock(disk, group);
    let (dir, resolution) = transfer::resolve(disk, group, PARTITION, named, &|_| false).expect("resolve");
    let (journal, _) = JournalLog::open_on(Arc::new(disk.clone()), &dir, PARTITION, config()).expect("open");
    (journal, resolution)
}

fn entries(disk: &SimDisk, group: &Path) -> Vec<String> {
    let mut names = disk.list_dir(group).expect("list");
    names.retain(|name| name != SUPERBLOCK);
    names
}

/// A target with a journal of its own (generation 0) and a superblock naming its checkpoint.
fn target(seed: u64) -> (SimDisk, PathBuf, Vec<StoredOp>) {
    let disk = SimDisk::new();
    let group = PathBuf::from("/target/group");
    disk.create_dir_all(&group).expect("group dir");
    let journal = journal_with(&disk, &transfer::journal_dir(&group, 0), 12, seed);
    write_superblock(&disk, &group, checkpoint_at(5)).expect("superblock");
    let ops = ops_of(&journal);
    (disk, group, ops)
}

fn source(ops: u64) -> (SimDisk, JournalLog) {
    let disk = SimDisk::new();
    let journal = journal_with(&disk, Path::new("/source/log"), ops, 99);
    (disk, journal)
}

#[test]
fn a_transferred_journal_is_the_source_up_to_the_checkpoint_and_goes_on_from_it() {
    let (_source_disk, source) = source(40);
    assert!(
        source.segments().len() >= 4,
        "{} segments",
        source.segments().len()
    );
    let (disk, group, _) = target(1);
    let expected: Vec<StoredOp> = ops_of(&source).into_iter().take(30).collect();

    assert_eq!(
        install(&source, &disk, &group, checkpoint_at(30), 97).expect("install"),
        1
    );
    assert_eq!(
        entries(&disk, &group),
        vec![JOURNAL_LIVE_FILE.to_string(), "log.1".to_string()]
    );
    let (mut journal, resolution) = open_live(&disk, &group);
    assert_eq!((resolution.live, resolution.roll_forward), (1, None));
    assert_eq!(ops_of(&journal), expected);
    assert_eq!(journal.chain(), source.extent(31).expect("op 31").chain_before);
    // Polls serve the same bytes as the source's.
    let end = journal.chain().next_offset;
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    journal.read_into(0, u32::MAX, end, &mut ours).expect("poll");
    source.read_into(0, u32::MAX, end, &mut theirs).expect("poll");
    assert!(!ours.is_empty());
    assert_eq!(ours, theirs);

    // The replica goes on writing after the checkpoint, and a second transfer replaces that.
    journal
        .write_op(31, 2, 5_000, b"after the transfer", &[])
        .expect("write");
    journal.sync().expect("sync");
    drop(journal);
    let (journal, _) = open_live(&disk, &group);
    assert_eq!(journal.last_op(), 31);
    drop(journal);
    assert_eq!(
        install(&source, &disk, &group, checkpoint_at(38), 4_096).expect("install"),
        2
    );
    let (journal, _) = open_live(&disk, &group);
    assert_eq!(ops_of(&journal), ops_of(&source)[..38].to_vec());
    assert_eq!(
        entries(&disk, &group),
        vec![JOURNAL_LIVE_FILE.to_string(), "log.2".to_string()]
    );
}

#[test]
fn a_crash_at_any_step_of_an_install_leaves_the_old_journal_or_the_new_one() {
    crash_at_every_step_of_an_install(&|seed| target(seed), checkpoint_at(5));
}

/// The same over a target whose live journal already came by a transfer (generation 1, with
/// `journal.live`), so the install is generation 1 → 2.
#[test]
fn a_crash_at_any_step_of_a_second_install_leaves_the_old_journal_or_the_new_one() {
    let (_first_disk, first_source) = source(15);
    crash_at_every_step_of_an_install(
        &|seed| {
            let (disk, group, _) = target(seed);
            install(&first_source, &disk, &group, checkpoint_at(9), 4_096).expect("the first install");
            let (journal, _) = open_live(&disk, &group);
            let ops = ops_of(&journal);
            (disk, group, ops)
        },
        checkpoint_at(9),
    );
}

fn crash_at_every_step_of_an_install(
    prepared_target: &dyn Fn(u64) -> (SimDisk, PathBuf, Vec<StoredOp>),
    old_checkpoint: CheckpointId,
) {
    let (_source_disk, source) = source(25);
    let checkpoint = checkpoint_at(20);
    let transferred: Vec<StoredOp> = ops_of(&source).into_iter().take(20).collect();
    let (mut old_kept, mut new_kept, mut rolled_forward) = (0, 0, 0);
    let mut step = 0u64;
    loop {
        let mut completed = false;
        for seed in 0..3 {
            let (disk, group, old) = prepared_target(step);
            disk.cut_power_after(step);
            let installed = install(&source, &disk, &group, checkpoint, 150);
            completed = installed.is_ok() && !disk.power_is_cut();
            disk.crash(step * 7 + seed);
            let named = read_superblock(&disk, &group);
            let (journal, resolution) = open_live(&disk, &group);
            let found = ops_of(&journal);
            if named == Some(checkpoint) {
                assert_eq!(found, transferred, "step {step} seed {seed}: {resolution:?}");
                new_kept += 1;
                rolled_forward += u32::from(resolution.roll_forward.is_some());
            } else {
                assert_eq!(named, Some(old_checkpoint), "step {step}");
                assert_eq!(found, old, "step {step} seed {seed}: {resolution:?}");
                old_kept += 1;
            }
            let generation = resolution.journal_generation();
            let journal_dir = transfer::journal_dir(&group, generation);
            let dir_name = journal_dir
                .file_name()
                .and_then(|name| name.to_str())
                .expect("name");
            assert!(
                entries(&disk, &group)
                    .iter()
                    .all(|name| name == dir_name || name == JOURNAL_LIVE_FILE),
                "step {step}: {:?}",
                entries(&disk, &group)
            );
            // Resolving again changes nothing.
            let again = transfer::plan_resolution(&disk, &group, PARTITION, named, &|_| false).expect("plan");
            assert_eq!((again.journal_generation(), again.removed.len()), (generation, 0));
            if completed {
                break;
            }
        }
        if completed {
            break;
        }
        step += 1;
        assert!(step < 10_000, "the install never completes");
    }
    println!("{step} steps: {old_kept} old journals, {new_kept} new ones ({rolled_forward} rolled forward)");
    assert!(
        step > 30 && old_kept > 0 && new_kept > 0 && rolled_forward > 0,
        "{step} steps: {old_kept} old journals, {new_kept} new ones ({rolled_forward} rolled forward)"
    );
}

#[test]
fn a_manifest_round_trips_and_any_damage_to_it_is_refused() {
    let (_source_disk, source) = source(20);
    let manifest = TransferManifest::of(&source, checkpoint_at(17), 3).expect("manifest");
    let bytes = manifest.encode();
    assert_eq!(TransferManifest::decode(&bytes, PARTITION), Ok(manifest.clone()));
    assert!(TransferManifest::decode(&bytes, PARTITION + 1).is_err());
    for at in 0..bytes.len() {
        let mut flipped = bytes.clone();
        flipped[at] ^= 0x10;
        assert!(
            TransferManifest::decode(&flipped, PARTITION).is_err(),
            "byte {at}"
        );
    }
    for len in 0..bytes.len() {
        assert!(
            TransferManifest::decode(&bytes[..len], PARTITION).is_err(),
            "{len} bytes"
        );
    }
    // A manifest that says the journal ends elsewhere than after its checkpoint's op.
    let mut wrong = manifest.clone();
    wrong.checkpoint.op += 1;
    assert!(TransferManifest::decode(&wrong.encode(), PARTITION).is_err());
    // An op the source does not hold durably is not offered.
    assert!(TransferManifest::of(&source, checkpoint_at(21), 3).is_err());
}

#[test]
fn a_staging_takes_chunks_only_in_order_and_whole() {
    let (_source_disk, source) = source(20);
    let (disk, group, _) = target(2);
    let manifest = TransferManifest::of(&source, checkpoint_at(20), 1).expect("manifest");
    let mut staging = Staging::begin(Arc::new(disk.clone()), &group, manifest).expect("begin");
    let request = staging.next_request().expect("a first request");
    let chunk = TransferChunk::read(&source, request).expect("read");
    let mut ahead = chunk.clone();
    ahead.position_bytes += 1;
    assert!(staging.write_chunk(&ahead).is_err());
    let mut flipped = chunk.clone();
    flipped.bytes[3] ^= 1;
    assert!(staging.write_chunk(&flipped).is_err());
    let mut longer = chunk.clone();
    longer.bytes.push(0);
    assert!(staging.write_chunk(&longer).is_err());
    staging.write_chunk(&chunk).expect("the chunk asked for");
    // Finishing early is refused, and the staging is abandoned: the old journal stays live.
    let generation = staging.generation();
    assert!(staging.finish(config()).is_err());
    transfer::abandon(&disk, &group, generation).expect("abandon");
    assert_eq!(entries(&disk, &group), vec!["log".to_string()]);
}

#[test]
fn transferred_bytes_that_do_not_verify_are_refused_before_anything_is_marked() {
    let (_source_disk, source) = source(20);
    let (disk, group, old) = target(3);
    let checkpoint = checkpoint_at(20);
    let manifest = TransferManifest::of(&source, checkpoint, 1).expect("manifest");
    let mut staging = Staging::begin(Arc::new(disk.clone()), &group, manifest).expect("begin");
    let mut chunks = 0;
    while let Some(request) = staging.next_request() {
        let mut chunk = TransferChunk::read(&source, request).expect("read");
        chunks += 1;
        if chunks == 2 {
            // A peer that sends other bytes with a checksum that matches them.
            let last = chunk.bytes.len() - 1;
            chunk.bytes[last / 2] ^= 0x40;
            chunk.checksum = xxhash_rust::xxh3::xxh3_64(&chunk.bytes);
        }
        staging.write_chunk(&chunk).expect("write");
    }
    let generation = staging.generation();
    assert!(matches!(
        staging.finish(config()),
        Err(StorageError::Damaged { .. })
    ));
    // Even if the superblock named the checkpoint, an unmarked staging is never rolled forward.
    write_superblock(&disk, &group, checkpoint).expect("superblock");
    let (journal, resolution) = open_live(&disk, &group);
    assert_eq!((resolution.live, resolution.removed), (0, vec![generation]));
    assert_eq!(ops_of(&journal), old);
}

#[test]
fn a_journal_with_no_op_up_to_the_checkpoint_transfers_as_one_empty_segment() {
    let (_source_disk, source) = source(0);
    let (disk, group, _) = target(4);
    let manifest = TransferManifest::of(&source, checkpoint_at(0), 1).expect("manifest");
    assert_eq!((manifest.segments.len(), manifest.len_bytes()), (1, 0));
    install(&source, &disk, &group, checkpoint_at(0), 100).expect("install");
    let (journal, _) = open_live(&disk, &group);
    assert_eq!((journal.first_op(), journal.last_op()), (1, 0));
}

#[test]
fn a_damaged_marker_or_live_file_is_refused_and_nothing_is_removed() {
    let (_source_disk, source) = source(10);
    let (disk, group, _) = target(5);
    let checkpoint = checkpoint_at(10);
    let staged = staged_whole(&source, &disk, &group, checkpoint);
    let marker = staged.dir.join(transfer::TRANSFER_MARKER_FILE);
    let mut bytes = disk.read_volatile(&marker).expect("marker");
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    assert!(disk.overwrite_durable(&marker, bytes));
    disk.crash(1);
    let named = read_superblock(&disk, &group);
    assert!(matches!(
        transfer::resolve(&disk, &group, PARTITION, named, &|_| false),
        Err(StorageError::Damaged { .. })
    ));
    assert_eq!(
        entries(&disk, &group),
        vec!["log".to_string(), "log.1".to_string()]
    );

    // `journal.live` naming a generation that is not there is damage too.
    atomic_file::write_on(&disk, &group.join(JOURNAL_LIVE_FILE), &7u64.to_le_bytes()).expect("live");
    assert!(matches!(
        transfer::plan_resolution(&disk, &group, PARTITION, named, &|_| false),
        Err(StorageError::Damaged { .. })
    ));
}

/// A transferred journal's sealed segments come with summaries written from the verified
/// staging, so its opens take them from the summaries instead of reading them whole: a
/// flipped bit in a sealed segment then passes the open (the scrub and polls find it), where
/// a journal without summaries would be refused at once.
#[test]
fn a_transferred_journal_opens_from_the_summaries_of_its_sealed_segments() {
    let (_source_disk, source) = source(40);
    let (disk, group, _) = target(6);
    install(&source, &disk, &group, checkpoint_at(35), 4_096).expect("install");
    let dir = transfer::journal_dir(&group, 1);
    let names = disk.list_dir(&dir).expect("list");
    let segments: Vec<&String> = names.iter().filter(|name| name.ends_with(".log")).collect();
    let summaries = names.iter().filter(|name| name.ends_with(".summary")).count();
    assert!(segments.len() >= 3, "{names:?}");
    assert_eq!(summaries, segments.len() - 1, "{names:?}");
    let sealed = dir.join(segments[0]);
    let mut bytes = disk.read_volatile(&sealed).expect("a sealed segment");
    bytes[40] ^= 0x08;
    assert!(disk.overwrite_durable(&sealed, bytes));
    disk.crash(3);
    let (journal, _) = open_live(&disk, &group);
    assert_eq!(journal.last_op(), 35);
    // The read-only open (the checker's) trusts no summary, and refuses it.
    assert!(matches!(
        JournalLog::open_read_only_on(Arc::new(disk.clone()), &dir, PARTITION, config()),
        Err(StorageError::Damaged { .. })
    ));
}

/// A marked staging whose checkpoint the superblock names, while the live journal holds that
/// checkpoint's op itself (the replica checkpointed there on its own before a crash left the
/// staging behind): the live journal stays, with its ops above the checkpoint, and the
/// staging goes. Rolled forward, it would drop those ops.
#[test]
fn a_staging_is_not_rolled_forward_over_a_live_journal_that_holds_the_checkpoint() {
    let (_source_disk, source) = source(30);
    let disk = SimDisk::new();
    let group = PathBuf::from("/target/group");
    disk.create_dir_all(&group).expect("group dir");
    // The target's own journal is the same log, further along (ops 1..=30).
    let own = journal_with(&disk, &transfer::journal_dir(&group, 0), 30, 99);
    let own_ops = ops_of(&own);
    drop(own);
    let checkpoint = checkpoint_at(20);
    staged_whole(&source, &disk, &group, checkpoint);
    // Its own checkpoint at op 20 happens to be named like the staging's.
    write_superblock(&disk, &group, checkpoint).expect("superblock");
    disk.crash(5);
    let live_holds = |dir: &Path| {
        JournalLog::open_read_only_on(Arc::new(disk.clone()), dir, PARTITION, config())
            .is_ok_and(|(log, _)| log.last_op() >= checkpoint.op && log.first_op() <= checkpoint.op)
    };
    let (dir, resolution) =
        transfer::resolve(&disk, &group, PARTITION, Some(checkpoint), &live_holds).expect("resolve");
    assert_eq!(
        (resolution.live, resolution.roll_forward, resolution.removed),
        (0, None, vec![1])
    );
    let (journal, _) = JournalLog::open_on(Arc::new(disk.clone()), &dir, PARTITION, config()).expect("open");
    assert_eq!(ops_of(&journal), own_ops);
    // A commit of a generation whose marker names another checkpoint is refused.
    assert!(matches!(
        transfer::commit(&disk, &group, 0, checkpoint),
        Err(StorageError::Invalid(_))
    ));
}

/// A damaged group is set aside whole (superblock and every journal file, byte for byte),
/// durably, under the lowest free quarantine number; the group's name is free for a blank
/// start.
#[test]
fn a_quarantine_sets_the_whole_group_aside_and_keeps_every_byte() {
    let (disk, group, _) = target(21);
    let files = disk.files_under(&group);
    let contents: Vec<Vec<u8>> = files
        .iter()
        .map(|path| disk.read_volatile(path).expect("a file"))
        .collect();
    assert!(files.len() > 3, "{files:?}");
    let aside = transfer::quarantine(&disk, &group).expect("quarantine");
    assert_eq!(aside, PathBuf::from("/target/group.quarantine.0"));
    disk.crash(5);
    assert!(disk.list_dir(&group).is_err(), "the group's name is free");
    for (path, bytes) in files.iter().zip(&contents) {
        let moved = aside.join(path.strip_prefix(&group).expect("under the group"));
        assert_eq!(
            disk.read_volatile(&moved).as_ref(),
            Some(bytes),
            "{}",
            moved.display()
        );
    }
    // The group starts again blank; a second quarantine takes the next number.
    disk.create_dir_all(&group).expect("a blank group");
    journal_with(&disk, &transfer::journal_dir(&group, 0), 3, 22);
    let again = transfer::quarantine(&disk, &group).expect("a second quarantine");
    assert_eq!(again, PathBuf::from("/target/group.quarantine.1"));
    assert!(
        transfer::quarantine(&disk, &group).is_err(),
        "nothing left to set aside"
    );
}
