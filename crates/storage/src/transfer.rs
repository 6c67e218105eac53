//! State transfer of a partition's journal: the segments a peer sends, staged beside the live
//! journal and installed with one commit point (issue 13, point 6; the design is in
//! `docs/replication.md`, "State transfer of a partition").
//!
//! # Journal generations
//!
//! ```text
//! <group dir>/log/               generation 0: the journal the partition was created with
//! <group dir>/log.<g>/           generation g >= 1: a journal a state transfer brought
//! <group dir>/journal.live       atomic file: the live generation (absent: 0)
//! <group dir>/log.<g>/transfer   atomic file: the checkpoint a staged generation ends at
//! ```
//!
//! # The install
//!
//! 1. [`Staging::begin`] removes every generation but the live one (what an abandoned or
//!    rolled-back install left) and creates `log.<g>/`, `g` one above the live generation.
//! 2. [`Staging::write_chunk`] takes the segments in the [`TransferManifest`]'s order, each
//!    chunk checked against what the manifest says comes next and against its own
//!    checksum (for transport; integrity is step 3). A segment is synced once complete.
//! 3. [`Staging::finish`] writes `journal.start` and the state file (the frontier at the end
//!    of the checkpoint's op), then opens the whole read-only, verifying every record and
//!    the chain from the start: nothing the peer said is trusted. The journal must end
//!    exactly at the manifest's checkpoint op with the manifest's chain. The sealed
//!    segments' summaries are written from that verified index (so opens do not read them
//!    all). Only then is the marker `transfer` written, naming the checkpoint.
//! 4. The caller makes the checkpoint durable and writes the superblock naming it. **That
//!    write is the commit point.**
//! 5. [`commit`] writes `journal.live` naming the new generation, then removes every other.
//!
//! At open, [`resolve`] finishes what a crash interrupted, from the checkpoint the superblock
//! names: a staged generation whose marker names that checkpoint is rolled forward (step 5),
//! unless the live journal itself holds that checkpoint's op (the caller says so: the replica
//! reached the op on its own); any other generation but the live one is removed (a staging
//! never committed, or the old journal of a committed install). So a crash at any point leaves the old journal or the new
//! one, never a mix. A marker or `journal.live` that fails verification is damage: refused,
//! nothing removed.
//!
//! A staged generation is never the live one before step 5, so nothing a running replica
//! writes lands in it; the caller writes no prepare between taking the checkpoint (step 4)
//! and step 5, or op C + 1 would land in the old generation.
//!
//! The caller removes a staging the core did not take ([`abandon`]) before it writes any
//! superblock: a later checkpoint of its own at the same op and checksum would otherwise
//! roll the staging forward over ops above it.

use crate::StorageError;
use crate::atomic_file;
use crate::io::{Disk, WriteFile};
use crate::journal::{
    JournalConfig, JournalLog, SEGMENT_BYTES_MAX, TRANSFER_CHUNK_BYTES_MAX, TransferSegment, segment_log_name,
};
use crate::record::Chain;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use xxhash_rust::xxh3::xxh3_64;

/// The directory of generation 0.
pub const JOURNAL_DIR: &str = "log";
/// The file naming the live generation, in the group directory.
pub const JOURNAL_LIVE_FILE: &str = "journal.live";
/// The marker of a verified staging, in its generation's directory.
pub const TRANSFER_MARKER_FILE: &str = "transfer";

/// Most segments one manifest may list (a plausibility bound on what a peer sends: with
/// segments of 1 MiB, a 1 TiB partition).
pub const MANIFEST_SEGMENTS_MAX: usize = 1 << 20;

const MANIFEST_VERSION: u32 = 1;
const MANIFEST_HEAD_BYTES: usize = 4 + 4 + 8 + 16 + 8 + 24 + 4;
const MANIFEST_SEGMENT_BYTES: usize = 24 + 8;
const MARKER_VERSION: u32 = 1;
const MARKER_BYTES: usize = 4 + 4 + 8 + 8 + 16 + 8;

/// A checkpoint as the superblock names it: its op and its checksum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointId {
    pub op: u64,
    pub checksum: u128,
}

/// What a state transfer moves (see the module doc): the journal up to the checkpoint's op.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferManifest {
    pub partition_id: u32,
    pub checkpoint: CheckpointId,
    /// The purge generation of the checkpoint's snapshot: a target refuses an offer below
    /// its own (a stale peer would bring purged messages back).
    pub purge_generation: u64,
    /// The chain after the checkpoint's op: where the transferred journal ends.
    pub end: Chain,
    /// Oldest first; the first begins where the journal does.
    pub segments: Vec<TransferSegment>,
}

impl TransferManifest {
    /// The manifest of `journal` up to the checkpoint at `checkpoint.op` (at or below its
    /// durable frontier).
    pub fn of(
        journal: &JournalLog,
        checkpoint: CheckpointId,
        purge_generation: u64,
    ) -> Result<TransferManifest, StorageError> {
        let (segments, end) = journal.transfer_extent(checkpoint.op)?;
        let manifest = TransferManifest {
            partition_id: end.partition_id,
            checkpoint,
            purge_generation,
            end,
            segments,
        };
        debug_assert_eq!(manifest.check(), Ok(()));
        Ok(manifest)
    }

    /// Where the transferred journal begins.
    pub fn start(&self) -> Chain {
        self.segments.first().map_or(self.end, |segment| segment.start)
    }

    /// Bytes the segments hold in all.
    pub fn len_bytes(&self) -> u64 {
        self.segments.iter().map(|segment| segment.len_bytes).sum()
    }

    /// The relations every manifest obeys; `Err` names the first one broken.
    pub fn check(&self) -> Result<(), String> {
        let (Some(first), Some(last)) = (self.segments.first(), self.segments.last()) else {
            return Err("no segments".into());
        };
        if self.segments.len() > MANIFEST_SEGMENTS_MAX {
            return Err(format!(
                "{} segments, over {MANIFEST_SEGMENTS_MAX}",
                self.segments.len()
            ));
        }
        if self.checkpoint.op.checked_add(1) != Some(self.end.next_op) {
            return Err(format!(
                "the journal ends before op {}, the checkpoint is op {}",
                self.end.next_op, self.checkpoint.op
            ));
        }
        let chains = self
            .segments
            .iter()
            .map(|segment| segment.start)
            .chain([self.end]);
        if chains
            .clone()
            .any(|chain| chain.partition_id != self.partition_id || chain.next_op == 0)
        {
            return Err("a chain of another partition, or at op 0".into());
        }
        for pair in self.segments.windows(2) {
            let (before, after) = (pair[0], pair[1]);
            if before.first_op() >= after.first_op() || before.start.next_offset > after.start.next_offset {
                return Err(format!(
                    "segment {} does not follow segment {}",
                    after.first_op(),
                    before.first_op()
                ));
            }
            if before.len_bytes == 0 {
                return Err(format!("segment {} is empty but not the last", before.first_op()));
            }
        }
        if self
            .segments
            .iter()
            .any(|segment| segment.len_bytes > SEGMENT_BYTES_MAX)
        {
            return Err(format!("a segment over {SEGMENT_BYTES_MAX} bytes"));
        }
        if last.start.next_offset > self.end.next_offset
            || (last.len_bytes > 0 && last.first_op() >= self.end.next_op)
            || last.first_op() > self.end.next_op
        {
            return Err("the last segment begins after the journal's end".into());
        }
        if (last.len_bytes == 0) != (first.start == self.end)
            || (last.len_bytes == 0 && self.segments.len() > 1)
        {
            return Err("an empty journal is one empty segment, and only it is empty".into());
        }
        Ok(())
    }

    /// The manifest's bytes, with their checksum (XXH3-64) last.
    pub fn encode(&self) -> Vec<u8> {
        let mut out =
            Vec::with_capacity(MANIFEST_HEAD_BYTES + self.segments.len() * MANIFEST_SEGMENT_BYTES + 8);
        out.extend_from_slice(&MANIFEST_VERSION.to_le_bytes());
        out.extend_from_slice(&self.partition_id.to_le_bytes());
        out.extend_from_slice(&self.checkpoint.op.to_le_bytes());
        out.extend_from_slice(&self.checkpoint.checksum.to_le_bytes());
        out.extend_from_slice(&self.purge_generation.to_le_bytes());
        put_chain(&mut out, self.end);
        out.extend_from_slice(&(self.segments.len() as u32).to_le_bytes());
        for segment in &self.segments {
            put_chain(&mut out, segment.start);
            out.extend_from_slice(&segment.len_bytes.to_le_bytes());
        }
        let checksum = xxh3_64(&out);
        out.extend_from_slice(&checksum.to_le_bytes());
        out
    }

    /// Decode and check a manifest for `partition_id` (bytes from a peer: every count is
    /// bounded before use).
    pub fn decode(bytes: &[u8], partition_id: u32) -> Result<TransferManifest, String> {
        let body_len = bytes.len().checked_sub(8).ok_or("shorter than its checksum")?;
        let (body, checksum) = bytes.split_at(body_len);
        if xxh3_64(body).to_le_bytes() != checksum {
            return Err("checksum mismatch".into());
        }
        let mut reader = Reader { bytes: body, at: 0 };
        let version = reader.u32()?;
        if version != MANIFEST_VERSION {
            return Err(format!("version {version}, expected {MANIFEST_VERSION}"));
        }
        let manifest_partition = reader.u32()?;
        if manifest_partition != partition_id {
            return Err(format!("partition {manifest_partition}, expected {partition_id}"));
        }
        let checkpoint = CheckpointId {
            op: reader.u64()?,
            checksum: reader.u128()?,
        };
        let purge_generation = reader.u64()?;
        let end = reader.chain(partition_id)?;
        let count = reader.u32()? as usize;
        if count > MANIFEST_SEGMENTS_MAX || body.len() != MANIFEST_HEAD_BYTES + count * MANIFEST_SEGMENT_BYTES
        {
            return Err(format!("{count} segments in {} bytes", body.len()));
        }
        let mut segments = Vec::with_capacity(count);
        for _ in 0..count {
            segments.push(TransferSegment {
                start: reader.chain(partition_id)?,
                len_bytes: reader.u64()?,
            });
        }
        let manifest = TransferManifest {
            partition_id,
            checkpoint,
            purge_generation,
            end,
            segments,
        };
        manifest.check()?;
        Ok(manifest)
    }
}

fn put_chain(out: &mut Vec<u8>, chain: Chain) {
    out.extend_from_slice(&chain.next_offset.to_le_bytes());
    out.extend_from_slice(&chain.parent_checksum.to_le_bytes());
    out.extend_from_slice(&chain.next_op.to_le_bytes());
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let field = self
            .bytes
            .get(self.at..self.at + N)
            .ok_or_else(|| format!("truncated at byte {}", self.at))?;
        self.at += N;
        Ok(field.try_into().expect("N bytes"))
    }

    fn u32(&mut self) -> Result<u32, String> {
        self.take().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Result<u64, String> {
        self.take().map(u64::from_le_bytes)
    }

    fn u128(&mut self) -> Result<u128, String> {
        self.take().map(u128::from_le_bytes)
    }

    fn chain(&mut self, partition_id: u32) -> Result<Chain, String> {
        Ok(Chain {
            partition_id,
            next_offset: self.u64()?,
            parent_checksum: self.u64()?,
            next_op: self.u64()?,
        })
    }
}

/// Which bytes a staging needs next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkRequest {
    pub segment_first_op: u64,
    pub position_bytes: u64,
    pub len_bytes: u64,
}

/// Bytes of one segment as the source read them, with a checksum for the transport.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferChunk {
    pub segment_first_op: u64,
    pub position_bytes: u64,
    pub bytes: Vec<u8>,
    /// XXH3-64 of `bytes`.
    pub checksum: u64,
}

impl TransferChunk {
    /// Read what `request` asks of the source `journal`.
    pub fn read(journal: &JournalLog, request: ChunkRequest) -> Result<TransferChunk, StorageError> {
        let bytes = journal.read_segment_range(
            request.segment_first_op,
            request.position_bytes,
            request.len_bytes,
        )?;
        Ok(TransferChunk {
            segment_first_op: request.segment_first_op,
            position_bytes: request.position_bytes,
            checksum: xxh3_64(&bytes),
            bytes,
        })
    }
}

/// The directory of journal generation `generation`.
pub fn journal_dir(group_dir: &Path, generation: u64) -> PathBuf {
    if generation == 0 {
        group_dir.join(JOURNAL_DIR)
    } else {
        group_dir.join(format!("{JOURNAL_DIR}.{generation}"))
    }
}

/// The generation a directory entry name is, if it is one.
fn generation_of(name: &str) -> Option<u64> {
    if name == JOURNAL_DIR {
        return Some(0);
    }
    let digits = name.strip_prefix(JOURNAL_DIR)?.strip_prefix('.')?;
    let generation: u64 = digits.parse().ok()?;
    (generation > 0 && generation.to_string() == digits).then_some(generation)
}

/// Every journal generation present in `group_dir`, in order.
fn generations(disk: &dyn Disk, group_dir: &Path) -> Result<Vec<u64>, StorageError> {
    let mut found: Vec<u64> = disk
        .list_dir(group_dir)?
        .iter()
        .filter_map(|name| generation_of(name))
        .collect();
    found.sort_unstable();
    Ok(found)
}

fn damaged(path: PathBuf, reason: String) -> StorageError {
    StorageError::Damaged {
        path,
        position: 0,
        reason,
    }
}

/// The generation `journal.live` names (0 when there is none), reading only.
pub fn live_generation(disk: &dyn Disk, group_dir: &Path) -> Result<u64, StorageError> {
    let path = group_dir.join(JOURNAL_LIVE_FILE);
    match atomic_file::read_verified_on(disk, &path)? {
        None => Ok(0),
        Some(bytes) => match <[u8; 8]>::try_from(bytes.as_slice()) {
            Ok(generation) => Ok(u64::from_le_bytes(generation)),
            Err(_) => Err(damaged(path, format!("{} bytes, expected 8", bytes.len()))),
        },
    }
}

/// What a verified staging's marker says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Marker {
    partition_id: u32,
    generation: u64,
    checkpoint: CheckpointId,
    purge_generation: u64,
}

impl Marker {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(MARKER_BYTES);
        out.extend_from_slice(&MARKER_VERSION.to_le_bytes());
        out.extend_from_slice(&self.partition_id.to_le_bytes());
        out.extend_from_slice(&self.generation.to_le_bytes());
        out.extend_from_slice(&self.checkpoint.op.to_le_bytes());
        out.extend_from_slice(&self.checkpoint.checksum.to_le_bytes());
        out.extend_from_slice(&self.purge_generation.to_le_bytes());
        out
    }

    fn decode(bytes: &[u8]) -> Result<Marker, String> {
        if bytes.len() != MARKER_BYTES {
            return Err(format!("{} bytes, expected {MARKER_BYTES}", bytes.len()));
        }
        let mut reader = Reader { bytes, at: 0 };
        let version = reader.u32()?;
        if version != MARKER_VERSION {
            return Err(format!("version {version}, expected {MARKER_VERSION}"));
        }
        Ok(Marker {
            partition_id: reader.u32()?,
            generation: reader.u64()?,
            checkpoint: CheckpointId {
                op: reader.u64()?,
                checksum: reader.u128()?,
            },
            purge_generation: reader.u64()?,
        })
    }
}

/// A staged generation being written (see the module doc).
pub struct Staging {
    disk: Arc<dyn Disk>,
    group_dir: PathBuf,
    generation: u64,
    manifest: TransferManifest,
    /// The segment being written (index into the manifest's), and its bytes so far.
    segment_index: usize,
    written_bytes: u64,
    file: Option<Box<dyn WriteFile>>,
    /// A write, barrier or file creation failed: what the staging holds is unknown (a failed
    /// barrier may have lost what it covered), so it is only ever abandoned.
    failed: bool,
}

impl std::fmt::Debug for Staging {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Staging")
            .field("generation", &self.generation)
            .field("segment_index", &self.segment_index)
            .field("written_bytes", &self.written_bytes)
            .finish()
    }
}

impl Staging {
    /// Start staging `manifest` in `group_dir`, whose live generation the caller runs: every
    /// other generation is removed first.
    pub fn begin(
        disk: Arc<dyn Disk>,
        group_dir: &Path,
        manifest: TransferManifest,
    ) -> Result<Staging, StorageError> {
        manifest.check().map_err(StorageError::Invalid)?;
        let live = live_generation(disk.as_ref(), group_dir)?;
        remove_generations_but(disk.as_ref(), group_dir, live)?;
        let generation = live + 1;
        let dir = journal_dir(group_dir, generation);
        disk.create_dir_all(&dir)?;
        disk.sync_dir(group_dir)?;
        let mut staging = Staging {
            disk,
            group_dir: group_dir.to_path_buf(),
            generation,
            manifest,
            segment_index: 0,
            written_bytes: 0,
            file: None,
            failed: false,
        };
        staging.open_segment()?;
        Ok(staging)
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn manifest(&self) -> &TransferManifest {
        &self.manifest
    }

    fn dir(&self) -> PathBuf {
        journal_dir(&self.group_dir, self.generation)
    }

    fn open_segment(&mut self) -> Result<(), StorageError> {
        let segment = self.manifest.segments[self.segment_index];
        let path = self.dir().join(segment_log_name(segment.first_op()));
        self.file = Some(self.disk.create_new(&path)?);
        self.written_bytes = 0;
        Ok(())
    }

    /// The bytes to fetch next (at most [`TRANSFER_CHUNK_BYTES_MAX`]); `None` once every
    /// segment is whole.
    pub fn next_request(&self) -> Option<ChunkRequest> {
        let segment = self.manifest.segments.get(self.segment_index)?;
        let left = segment.len_bytes - self.written_bytes;
        (left > 0).then(|| ChunkRequest {
            segment_first_op: segment.first_op(),
            position_bytes: self.written_bytes,
            len_bytes: left.min(TRANSFER_CHUNK_BYTES_MAX),
        })
    }

    /// Write `chunk`, which must be (a prefix of) what [`Staging::next_request`] asks for and
    /// verify against its checksum.
    pub fn write_chunk(&mut self, chunk: &TransferChunk) -> Result<(), StorageError> {
        if self.failed {
            return Err(StorageError::Invalid(
                "the staging failed before: abandon it".into(),
            ));
        }
        let Some(request) = self.next_request() else {
            return Err(StorageError::Invalid(
                "a chunk after the transfer was complete".into(),
            ));
        };
        let len = chunk.bytes.len() as u64;
        if chunk.segment_first_op != request.segment_first_op
            || chunk.position_bytes != request.position_bytes
            || len == 0
            || len > request.len_bytes
        {
            return Err(StorageError::Invalid(format!(
                "a chunk of {len} bytes at {} of segment {}, expected up to {} bytes at {} of segment {}",
                chunk.position_bytes,
                chunk.segment_first_op,
                request.len_bytes,
                request.position_bytes,
                request.segment_first_op
            )));
        }
        if xxh3_64(&chunk.bytes) != chunk.checksum {
            return Err(StorageError::Invalid(format!(
                "the chunk at {} of segment {} fails its checksum",
                chunk.position_bytes, chunk.segment_first_op
            )));
        }
        let written = self.write_checked(chunk);
        self.failed |= written.is_err();
        written
    }

    fn write_checked(&mut self, chunk: &TransferChunk) -> Result<(), StorageError> {
        let file = self.file.as_mut().expect("the segment being written is open");
        file.write_all_at(chunk.position_bytes, &chunk.bytes)?;
        self.written_bytes += chunk.bytes.len() as u64;
        if self.written_bytes == self.manifest.segments[self.segment_index].len_bytes {
            file.sync_data()?;
            self.file = None;
            if self.segment_index + 1 < self.manifest.segments.len() {
                self.segment_index += 1;
                self.open_segment()?;
            }
        }
        Ok(())
    }

    /// Make the staged generation a journal, verify it whole and mark it (step 3 of the
    /// module doc). `Err` if it does not verify or is not what the manifest promised: the
    /// caller abandons it ([`abandon`]).
    pub fn finish(self, config: JournalConfig) -> Result<StagedJournal, StorageError> {
        self.finish_checked(config, &|_| Ok(()))
    }

    /// [`Staging::finish`], with the caller's own check of the verified journal before it is
    /// marked (the partition shell: op C's prepare header is the checkpoint's, the offsets are
    /// the snapshot's). `Err` from it refuses the staging as not the manifest's.
    pub fn finish_checked(
        mut self,
        config: JournalConfig,
        check: &dyn Fn(&JournalLog) -> Result<(), String>,
    ) -> Result<StagedJournal, StorageError> {
        if self.failed {
            return Err(StorageError::Invalid(
                "the staging failed before: abandon it".into(),
            ));
        }
        if let Some(request) = self.next_request() {
            return Err(StorageError::Invalid(format!(
                "the transfer is incomplete: segment {} needs bytes from {}",
                request.segment_first_op, request.position_bytes
            )));
        }
        if let Some(mut file) = self.file.take() {
            // The only segment, and empty.
            file.sync_data()?;
        }
        let manifest = &self.manifest;
        let dir = self.dir();
        let last = *manifest.segments.last().expect("checked: one segment");
        JournalLog::write_transferred_files(self.disk.as_ref(), &dir, manifest.start(), manifest.end, last)?;
        self.disk.sync_dir(&dir)?;
        let (journal, inspection) =
            JournalLog::open_read_only_on(Arc::clone(&self.disk), &dir, manifest.partition_id, config)?;
        let ends_at_checkpoint = journal.first_op() == manifest.start().next_op
            && journal.last_op() == manifest.checkpoint.op
            && journal.durable_op() == manifest.checkpoint.op
            && journal.chain() == manifest.end
            && inspection.bytes_above_frontier == 0
            && inspection.segments_below_start == 0;
        if ends_at_checkpoint && let Err(reason) = check(&journal) {
            return Err(damaged(
                dir,
                format!("the transferred journal is not the checkpoint's: {reason}"),
            ));
        }
        if ends_at_checkpoint {
            // No rotation sealed these segments here: summarise them now, so that an open
            // does not read them all (the summaries come from what was just verified).
            journal.write_summaries_of_sealed()?;
        }
        drop(journal);
        if !ends_at_checkpoint {
            return Err(damaged(
                dir,
                format!(
                    "the transferred journal is not the manifest's: it holds ops {}..={} (the manifest ends at op {})",
                    inspection.first_op, inspection.last_op, manifest.checkpoint.op
                ),
            ));
        }
        let marker = Marker {
            partition_id: manifest.partition_id,
            generation: self.generation,
            checkpoint: manifest.checkpoint,
            purge_generation: manifest.purge_generation,
        };
        atomic_file::write_on(
            self.disk.as_ref(),
            &dir.join(TRANSFER_MARKER_FILE),
            &marker.encode(),
        )?;
        Ok(StagedJournal {
            generation: self.generation,
            checkpoint: manifest.checkpoint,
            dir,
        })
    }
}

/// A verified staging, waiting for the superblock that commits it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagedJournal {
    pub generation: u64,
    pub checkpoint: CheckpointId,
    pub dir: PathBuf,
}

/// Remove generation `generation` (its files, then the directory), durably.
fn remove_generation(disk: &dyn Disk, group_dir: &Path, generation: u64) -> Result<(), StorageError> {
    let dir = journal_dir(group_dir, generation);
    for name in disk.list_dir(&dir)? {
        disk.remove_file(&dir.join(name))?;
    }
    disk.sync_dir(&dir)?;
    disk.remove_dir(&dir)?;
    disk.sync_dir(group_dir)
}

/// Remove every generation but `kept`.
fn remove_generations_but(disk: &dyn Disk, group_dir: &Path, kept: u64) -> Result<(), StorageError> {
    for generation in generations(disk, group_dir)? {
        if generation != kept {
            remove_generation(disk, group_dir, generation)?;
        }
    }
    Ok(())
}

/// Remove a staging the core did not take (or that failed verification).
pub fn abandon(disk: &dyn Disk, group_dir: &Path, generation: u64) -> Result<(), StorageError> {
    assert_ne!(
        generation,
        live_generation(disk, group_dir)?,
        "the live journal is never abandoned"
    );
    if generations(disk, group_dir)?.contains(&generation) {
        remove_generation(disk, group_dir, generation)?;
    }
    Ok(())
}

/// Make staged generation `generation` the live journal and remove every other (step 5 of the
/// module doc). Only after the superblock naming its checkpoint, `checkpoint`, is durable; the
/// generation's marker must name it (else `Invalid`, and nothing changes).
pub fn commit(
    disk: &dyn Disk,
    group_dir: &Path,
    generation: u64,
    checkpoint: CheckpointId,
) -> Result<(), StorageError> {
    let marker_path = journal_dir(group_dir, generation).join(TRANSFER_MARKER_FILE);
    let marker = atomic_file::read_verified_on(disk, &marker_path)?
        .map(|bytes| Marker::decode(&bytes).map_err(|reason| damaged(marker_path.clone(), reason)))
        .transpose()?;
    if marker.is_none_or(|marker| marker.checkpoint != checkpoint || marker.generation != generation) {
        return Err(StorageError::Invalid(format!(
            "generation {generation} is not a staging of checkpoint op {}: nothing was changed",
            checkpoint.op
        )));
    }
    atomic_file::write_on(
        disk,
        &group_dir.join(JOURNAL_LIVE_FILE),
        &generation.to_le_bytes(),
    )?;
    remove_generations_but(disk, group_dir, generation)
}

/// What [`resolve`] does at open, decided reading only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolution {
    /// The generation `journal.live` names.
    pub live: u64,
    /// A staged generation the superblock's checkpoint commits: it becomes the live one.
    pub roll_forward: Option<u64>,
    /// Generations removed (a staging never committed, the old journal of a committed one).
    pub removed: Vec<u64>,
}

impl Resolution {
    /// The generation the journal is opened from.
    pub fn journal_generation(&self) -> u64 {
        self.roll_forward.unwrap_or(self.live)
    }
}

/// Decide, reading only, which journal generation of `group_dir` is live given the checkpoint
/// the superblock names (see the module doc).
///
/// `live_serves_named` says, given the live journal's directory, whether that journal holds
/// the named checkpoint's op (its prepare) durably; it is asked only when a staging's marker
/// names the checkpoint. If it does, the staging is not what the superblock committed (the
/// replica checkpointed at that op itself, or its log came to hold the op before a crash)
/// and is removed: rolling it forward would drop the live journal's ops above the op.
pub fn plan_resolution(
    disk: &dyn Disk,
    group_dir: &Path,
    partition_id: u32,
    named: Option<CheckpointId>,
    live_serves_named: &dyn Fn(&Path) -> bool,
) -> Result<Resolution, StorageError> {
    let live = live_generation(disk, group_dir)?;
    let present = generations(disk, group_dir)?;
    if !present.contains(&live) {
        return Err(damaged(
            journal_dir(group_dir, live),
            format!("the live journal (generation {live}) is missing; generations present: {present:?}"),
        ));
    }
    let mut roll_forward = None;
    let mut removed = Vec::new();
    for generation in present.into_iter().filter(|&generation| generation != live) {
        let marker_path = journal_dir(group_dir, generation).join(TRANSFER_MARKER_FILE);
        let marker = if generation > live {
            match atomic_file::read_verified_on(disk, &marker_path)? {
                Some(bytes) => {
                    Some(Marker::decode(&bytes).map_err(|reason| damaged(marker_path.clone(), reason))?)
                }
                None => None,
            }
        } else {
            None
        };
        let commits = marker.is_some_and(|marker| {
            marker.partition_id == partition_id
                && marker.generation == generation
                && Some(marker.checkpoint) == named
        });
        if commits {
            if roll_forward.is_some() {
                return Err(damaged(
                    marker_path,
                    "two staged journals name the checkpoint the superblock names".into(),
                ));
            }
            roll_forward = Some(generation);
        } else {
            removed.push(generation);
        }
    }
    if let Some(forward) = roll_forward
        && live_serves_named(&journal_dir(group_dir, live))
    {
        roll_forward = None;
        removed.push(forward);
        removed.sort_unstable();
    }
    if let Some(forward) = roll_forward {
        removed.push(live);
        removed.retain(|&generation| generation != forward);
        removed.sort_unstable();
    }
    Ok(Resolution {
        live,
        roll_forward,
        removed,
    })
}

/// Finish what a crash interrupted (see the module doc) and return the live journal's
/// directory, with what was done.
pub fn resolve(
    disk: &dyn Disk,
    group_dir: &Path,
    partition_id: u32,
    named: Option<CheckpointId>,
    live_serves_named: &dyn Fn(&Path) -> bool,
) -> Result<(PathBuf, Resolution), StorageError> {
    // A `journal.live` write a crash cut before its rename leaves a staging file.
    disk.remove_file(&atomic_file::tmp_path(&group_dir.join(JOURNAL_LIVE_FILE)))?;
    let resolution = plan_resolution(disk, group_dir, partition_id, named, live_serves_named)?;
    match (resolution.roll_forward, named) {
        (Some(generation), Some(named)) => commit(disk, group_dir, generation, named)?,
        _ => {
            for &generation in &resolution.removed {
                remove_generation(disk, group_dir, generation)?;
            }
        }
    }
    Ok((
        journal_dir(group_dir, resolution.journal_generation()),
        resolution,
    ))
}

/// How many quarantined copies of one group directory may pile up beside it before a
/// quarantine is refused (each holds a whole damaged group: an operator clears them).
pub const QUARANTINES_MAX: u32 = 1_000;

/// The name a group directory named `name` gets in quarantine number `number`.
pub fn quarantine_name(name: &str, number: u32) -> String {
    format!("{name}.quarantine.{number}")
}

/// Set a damaged group directory aside, every byte kept: `group_dir` is renamed to
/// `<name>.quarantine.<n>` beside it (`n` the lowest number not in use), and the parent
/// directory is synced. Afterwards no group directory exists under the old name: the group
/// starts again as a replica with a blank disk and is rebuilt from its peers (state
/// transfer). Only a group with peers may do this; a group of one replica refuses instead,
/// keeping the files where they are. Returns the quarantine's path.
///
/// One rename, so a crash leaves the whole group where it was or the whole group set aside.
pub fn quarantine(disk: &dyn Disk, group_dir: &Path) -> Result<PathBuf, StorageError> {
    let invalid = |reason: String| StorageError::Invalid(reason);
    let (Some(parent), Some(name)) = (
        group_dir.parent(),
        group_dir.file_name().and_then(|name| name.to_str()),
    ) else {
        return Err(invalid(format!(
            "{} names no directory that can be set aside",
            group_dir.display()
        )));
    };
    // The group's own directory operations first: the rename moves what is durable.
    disk.sync_dir(group_dir)?;
    let taken = disk.list_dir(parent)?;
    let number = (0..QUARANTINES_MAX)
        .find(|&number| !taken.contains(&quarantine_name(name, number)))
        .ok_or_else(|| {
            invalid(format!(
                "{QUARANTINES_MAX} quarantined copies of {} already exist beside it; remove those an operator has examined",
                group_dir.display()
            ))
        })?;
    let quarantined = parent.join(quarantine_name(name, number));
    disk.rename(group_dir, &quarantined)?;
    disk.sync_dir(parent)?;
    Ok(quarantined)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_names_round_trip_and_nothing_else_is_one() {
        let group = Path::new("/g");
        for generation in [0, 1, 7, 12_345] {
            let dir = journal_dir(group, generation);
            let name = dir.file_name().and_then(|name| name.to_str()).expect("a name");
            assert_eq!(generation_of(name), Some(generation));
        }
        for name in [
            "log.0",
            "log.01",
            "log.",
            "logs",
            "log.x",
            "journal.live",
            "log.1.tmp",
        ] {
            assert_eq!(generation_of(name), None, "{name}");
        }
    }

    #[test]
    fn a_marker_round_trips() {
        let marker = Marker {
            partition_id: 3,
            generation: 2,
            checkpoint: CheckpointId {
                op: 77,
                checksum: u128::MAX - 5,
            },
            purge_generation: 4,
        };
        assert_eq!(Marker::decode(&marker.encode()), Ok(marker));
        assert!(Marker::decode(&marker.encode()[1..]).is_err());
    }
}
