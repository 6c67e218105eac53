//! An in-memory model of one replica's disk, with the faults a real disk and page cache show.
//!
//! The disk has four zones (`docs/replication.md`, "Durable state", "Journal" and
//! "Checkpoints"), each an array of fixed-size slots, all zero when new:
//! - [`Zone::Superblock`]: one slot per superblock copy;
//! - [`Zone::Headers`]: the redundant header ring, one slot per journal slot;
//! - [`Zone::Prepares`]: the prepare ring, one slot per journal slot;
//! - [`Zone::Checkpoints`]: two checkpoint slots, written alternately.
//!
//! The zones are a fixed enum because the protocol has exactly these four; their shapes (slot
//! counts and sizes) are a [`StorageLayout`], so a simulator can use small prepare slots.
//!
//! # Fault model
//!
//! - **Page-cache writes.** [`Storage::write`] puts bytes at the start of a slot into a pending
//!   buffer. [`Storage::read`] sees them at once, as it would through a page cache, but they are
//!   not durable. Several writes to one slot before a sync coalesce, as dirty pages do.
//! - **Sync.** [`Storage::sync`] makes every pending write durable and clears the slot's fault
//!   marks, since the slot now holds a whole new record.
//! - **Failed sync.** A sync may fail ([`Storage::fail_next_sync`], or `sync_fail_ppm`). It
//!   returns `Err` and leaves every pending write undetermined: the next crash decides each one,
//!   as below. The replica must treat the failure as fatal and crash (as PostgreSQL learned, a
//!   retried fsync can report success over lost pages): further writes and syncs panic until
//!   [`Storage::crash`].
//! - **Crash.** [`Storage::crash`] resolves every pending write independently: it is *lost*
//!   (the slot keeps its old durable bytes), *durable* (as if synced), or *torn*: a random
//!   prefix of whole sectors (`SECTOR_SIZE_BYTES`) of the new bytes lands over the old. A
//!   write that fits in one sector cannot tear: a sector write is atomic (the usual assumption
//!   of journals built from checksummed sectors), so its tear outcome is a loss. Any pending
//!   write may tear, not only the last, because a kernel writes dirty pages back in no
//!   promised order.
//! - **Latent bit flips.** [`Storage::corrupt`] flips one random bit of a slot's durable bytes,
//!   within the last record written there (or anywhere in a never-written slot). Every later
//!   read returns it, until the slot is durably rewritten. It models a media error that the
//!   device did not detect; a detected one is a failed read, which a checksum failure already
//!   covers.
//! - **Wipe.** [`Storage::wipe`] zeroes every zone, as a replaced disk would be.
//! - **A log zone.** [`Storage::set_log_zone`] makes one zone a log (a partition's segment
//!   file): its writes are appends in op order, and a crash keeps a prefix of them, in the
//!   order written: the first write it loses or tears ends what survives, as recovery's scan
//!   of a log ends at the first record that does not verify. [`Storage::truncate_log`] cuts
//!   the log: it syncs the zone's pending writes, as the fsync after a real truncation does,
//!   and zeroes the cut slots durably. A truncation is never torn and never fails (a real one
//!   is one metadata change, made durable with the file's other pending writes).
//!
//! Not modelled: misdirected writes and reads (a write landing in another slot), and faults in
//! more slots than the protocol can repair. The harness keeps injected faults within what the
//! protocol survives (`docs/replication.md`, "Simulator"): [`Storage::faulty_slots`] tells it
//! which slots hold a torn write or a bit flip right now. The marks may over-report (a tear
//! whose sectors happened to match the old ones, a slot with a good rewrite pending) but never
//! miss a fault within the slot's current record. A durable rewrite removes the marks: a flip
//! it did not cover lies beyond the new, shorter record, in bytes no reader looks at.
//!
//! Determinism: pending writes are resolved in (zone, slot) order from the caller's PRNG;
//! nothing iterates a hash map.

use std::collections::BTreeMap;

use crate::constants::{HEADER_SIZE, SUPERBLOCK_COPIES};

use super::prng::{PPM, Prng};

/// The unit of atomic writes: a crash tears a write only at a multiple of this many bytes.
pub const SECTOR_SIZE_BYTES: u32 = 512;

/// A region of the disk. See the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Zone {
    Superblock,
    Headers,
    Prepares,
    Checkpoints,
}

impl Zone {
    pub const ALL: [Zone; 4] = [Zone::Superblock, Zone::Headers, Zone::Prepares, Zone::Checkpoints];

    fn index(self) -> usize {
        match self {
            Zone::Superblock => 0,
            Zone::Headers => 1,
            Zone::Prepares => 2,
            Zone::Checkpoints => 3,
        }
    }
}

/// The shape of one zone. Invariants: both fields `> 0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZoneShape {
    pub slot_count: u32,
    pub slot_size_bytes: u32,
}

/// The shapes of the four zones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StorageLayout {
    pub superblock: ZoneShape,
    pub headers: ZoneShape,
    pub prepares: ZoneShape,
    pub checkpoints: ZoneShape,
}

impl StorageLayout {
    /// The layout the design note describes: `SUPERBLOCK_COPIES` superblock slots,
    /// `journal_slots` header slots of `HEADER_SIZE` bytes and `journal_slots` prepare slots.
    /// The caller picks the superblock copy size (the superblock's encoding decides it), the
    /// prepare slot size (the largest prepare the run sends; a simulator keeps it small) and
    /// the checkpoint slot size (the largest checkpoint the run takes); two checkpoint slots.
    pub fn journal(
        journal_slots: usize,
        superblock_copy_size_bytes: u32,
        prepare_slot_size_bytes: u32,
        checkpoint_slot_size_bytes: u32,
    ) -> StorageLayout {
        let journal_slots = u32::try_from(journal_slots).expect("journal_slots fits u32");
        StorageLayout {
            superblock: ZoneShape {
                slot_count: u32::try_from(SUPERBLOCK_COPIES).expect("SUPERBLOCK_COPIES fits u32"),
                slot_size_bytes: superblock_copy_size_bytes,
            },
            headers: ZoneShape {
                slot_count: journal_slots,
                slot_size_bytes: u32::try_from(HEADER_SIZE).expect("HEADER_SIZE fits u32"),
            },
            prepares: ZoneShape {
                slot_count: journal_slots,
                slot_size_bytes: prepare_slot_size_bytes,
            },
            checkpoints: ZoneShape {
                slot_count: 2,
                slot_size_bytes: checkpoint_slot_size_bytes,
            },
        }
    }

    pub fn shape(&self, zone: Zone) -> ZoneShape {
        match zone {
            Zone::Superblock => self.superblock,
            Zone::Headers => self.headers,
            Zone::Prepares => self.prepares,
            Zone::Checkpoints => self.checkpoints,
        }
    }

    fn check(&self) {
        for zone in Zone::ALL {
            let shape = self.shape(zone);
            assert!(shape.slot_count > 0, "{zone:?} has no slots");
            assert!(shape.slot_size_bytes > 0, "{zone:?} has empty slots");
        }
    }
}

/// How often the storage's own faults fire, in parts per million.
///
/// Invariant: `crash_write_lost_ppm + crash_write_torn_ppm ≤ 1_000_000`; the rest of the
/// pending writes at a crash become durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StorageOptions {
    /// Chance that a sync fails (see [`Storage::sync`]).
    pub sync_fail_ppm: u32,
    /// Chance that a crash loses a pending write.
    pub crash_write_lost_ppm: u32,
    /// Chance that a crash tears a pending write.
    pub crash_write_torn_ppm: u32,
}

impl Default for StorageOptions {
    /// Syncs never fail; at a crash each pending write is lost, torn or durable with equal
    /// odds, so every outcome is common.
    fn default() -> StorageOptions {
        StorageOptions {
            sync_fail_ppm: 0,
            crash_write_lost_ppm: PPM / 3,
            crash_write_torn_ppm: PPM / 3,
        }
    }
}

impl StorageOptions {
    fn check(&self) {
        assert!(self.sync_fail_ppm <= PPM);
        assert!(self.crash_write_lost_ppm <= PPM);
        assert!(self.crash_write_torn_ppm <= PPM - self.crash_write_lost_ppm);
    }
}

/// A sync failed: the pending writes are undetermined, and the replica must crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("sync failed: pending writes are undetermined and the replica must crash")]
pub struct SyncError;

/// The injected faults a slot holds now. A slot without faults has no entry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SlotFaults {
    /// A crash tore the last write to this slot.
    pub torn: bool,
    /// Bit flips injected since the slot was last durably written. Two flips of one bit
    /// cancel out, but both are counted: the marks over-report rather than under-report.
    pub bits_flipped: u32,
}

/// Running totals of what the storage did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StorageCounters {
    pub writes: u64,
    /// Calls to `sync`, failed ones included.
    pub syncs: u64,
    pub syncs_failed: u64,
    pub crashes: u64,
    /// Pending writes a crash made durable.
    pub crash_writes_durable: u64,
    /// Pending writes a crash lost.
    pub crash_writes_lost: u64,
    /// Pending writes a crash tore.
    pub crash_writes_torn: u64,
    /// Bits flipped by `corrupt`.
    pub bits_flipped: u64,
    pub wipes: u64,
}

/// What a crash does to one pending write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CrashOutcome {
    Lost,
    Durable,
    /// The first this many sectors of the write land. Invariant: `0 < sectors < sectors of
    /// the write`.
    Torn {
        sectors: u32,
    },
}

/// One replica's simulated disk. See the module documentation for its fault model.
#[derive(Debug)]
pub struct Storage {
    layout: StorageLayout,
    options: StorageOptions,
    /// Draws for faults the storage decides itself (failed syncs). Crashes and bit flips are
    /// the harness's decisions and draw from the harness's PRNG.
    prng: Prng,
    /// Per zone (by `Zone::index`), per slot, the durable bytes; `None` is all zeros.
    /// Invariant: every `Some` buffer is exactly the zone's `slot_size_bytes` long.
    durable: [Vec<Option<Box<[u8]>>>; 4],
    /// Per zone, per slot, the length of the last write that reached the durable bytes, whole
    /// or torn; 0 if none since the last wipe. Invariant: `≤ slot_size_bytes`.
    durable_record_bytes: [Vec<u32>; 4],
    /// The bytes written at the start of each slot since the last sync or crash.
    /// Invariants: `0 < len ≤ slot_size_bytes`; empty while no writes are pending.
    pending: BTreeMap<(Zone, u32), Vec<u8>>,
    /// Injected faults present in durable bytes. Invariant: no entry equals the default.
    faults: BTreeMap<(Zone, u32), SlotFaults>,
    /// The zone written as a log, if any (see the module documentation).
    log_zone: Option<Zone>,
    /// The log zone's slots with pending writes, in the order first written since the last
    /// sync or crash.
    log_pending_order: Vec<u32>,
    /// The next sync fails, whatever `sync_fail_ppm` draws.
    fail_next_sync: bool,
    /// A sync failed and no crash has followed yet. While set, `write` and `sync` panic.
    sync_failed: bool,
    counters: StorageCounters,
}

impl Storage {
    /// A new, zeroed disk. `prng` should be this replica's own storage-fault stream.
    pub fn new(layout: StorageLayout, options: StorageOptions, prng: Prng) -> Storage {
        layout.check();
        options.check();
        let slots = |zone: Zone| layout.shape(zone).slot_count as usize;
        Storage {
            layout,
            options,
            prng,
            durable: Zone::ALL.map(|zone| vec![None; slots(zone)]),
            durable_record_bytes: Zone::ALL.map(|zone| vec![0; slots(zone)]),
            pending: BTreeMap::new(),
            faults: BTreeMap::new(),
            log_zone: None,
            log_pending_order: Vec::new(),
            fail_next_sync: false,
            sync_failed: false,
            counters: StorageCounters::default(),
        }
    }

    /// Makes `zone` a log (see the module documentation). Before any write.
    pub fn set_log_zone(&mut self, zone: Zone) {
        assert!(self.pending.is_empty(), "the log zone is chosen before any write");
        self.log_zone = Some(zone);
    }

    /// Cuts the log zone: syncs its pending writes, then zeroes `slots` durably and clears
    /// their fault marks.
    pub fn truncate_log(&mut self, slots: &[u32]) {
        let zone = self.log_zone.expect("a log zone");
        assert!(
            !self.sync_failed,
            "truncate after a failed sync: the replica must crash first"
        );
        for slot in std::mem::take(&mut self.log_pending_order) {
            if let Some(bytes) = self.pending.remove(&(zone, slot)) {
                self.apply(zone, slot, &bytes);
            }
        }
        for &slot in slots {
            self.check_slot(zone, slot);
            self.durable[zone.index()][slot as usize] = None;
            self.durable_record_bytes[zone.index()][slot as usize] = 0;
            self.faults.remove(&(zone, slot));
        }
    }

    pub fn layout(&self) -> &StorageLayout {
        &self.layout
    }

    pub fn options(&self) -> &StorageOptions {
        &self.options
    }

    pub fn counters(&self) -> StorageCounters {
        self.counters
    }

    /// Slots with writes not yet synced.
    pub fn pending_count(&self) -> usize {
        self.pending.len()
    }

    /// Whether a sync failed with no crash since (the replica must crash now).
    pub fn sync_failed(&self) -> bool {
        self.sync_failed
    }

    /// Writes `bytes` at the start of `slot`; the rest of the slot is untouched. The write is
    /// visible to `read` at once and durable only after a successful `sync`.
    pub fn write(&mut self, zone: Zone, slot: u32, bytes: &[u8]) {
        assert!(
            !self.sync_failed,
            "write after a failed sync: the replica must crash first"
        );
        self.check_slot(zone, slot);
        assert!(!bytes.is_empty(), "an empty write");
        let size_bytes = self.layout.shape(zone).slot_size_bytes as usize;
        assert!(
            bytes.len() <= size_bytes,
            "{} bytes do not fit a {zone:?} slot of {size_bytes}",
            bytes.len()
        );
        if self.log_zone == Some(zone) && !self.pending.contains_key(&(zone, slot)) {
            self.log_pending_order.push(slot);
        }
        let pending = self.pending.entry((zone, slot)).or_default();
        // A shorter rewrite keeps the tail of the longer pending one, as a page cache would.
        if pending.len() < bytes.len() {
            pending.resize(bytes.len(), 0);
        }
        pending[..bytes.len()].copy_from_slice(bytes);
        self.counters.writes += 1;
    }

    /// The slot's current bytes, `slot_size_bytes` long: the durable bytes with any pending
    /// write over them. A slot never written reads as zeros.
    pub fn read(&self, zone: Zone, slot: u32) -> Vec<u8> {
        self.check_slot(zone, slot);
        let mut bytes = self.read_durable(zone, slot);
        if let Some(pending) = self.pending.get(&(zone, slot)) {
            bytes[..pending.len()].copy_from_slice(pending);
        }
        assert_eq!(bytes.len(), self.layout.shape(zone).slot_size_bytes as usize);
        bytes
    }

    /// The slot's durable bytes only: what a crash with every pending write lost would leave.
    /// For checkers and tests; a replica reads through `read`.
    pub fn read_durable(&self, zone: Zone, slot: u32) -> Vec<u8> {
        self.check_slot(zone, slot);
        let size_bytes = self.layout.shape(zone).slot_size_bytes as usize;
        match &self.durable[zone.index()][slot as usize] {
            Some(bytes) => bytes.to_vec(),
            None => vec![0; size_bytes],
        }
    }

    /// Arms a failure of the next `sync`. It stays armed across a crash: "next" is literal.
    pub fn fail_next_sync(&mut self) {
        self.fail_next_sync = true;
    }

    /// Makes every pending write durable, or fails (see the module documentation).
    ///
    /// On `Err`, nothing is known of the pending writes: the caller must `crash`, which decides
    /// each one. Until then `write` and `sync` panic, because carrying on after a failed sync is
    /// the bug this model exists to catch.
    pub fn sync(&mut self) -> Result<(), SyncError> {
        assert!(
            !self.sync_failed,
            "sync after a failed sync: the replica must crash first"
        );
        self.counters.syncs += 1;
        // Drawn on every sync, so that arming `fail_next_sync` does not shift later draws.
        let fail_drawn = self.prng.chance_ppm(self.options.sync_fail_ppm);
        if self.fail_next_sync || fail_drawn {
            self.fail_next_sync = false;
            self.sync_failed = true;
            self.counters.syncs_failed += 1;
            return Err(SyncError);
        }
        for ((zone, slot), bytes) in std::mem::take(&mut self.pending) {
            self.apply(zone, slot, &bytes);
        }
        assert!(self.pending.is_empty());
        self.log_pending_order.clear();
        Ok(())
    }

    /// Crashes the disk: every pending write (also after a failed sync) is lost, made durable,
    /// or torn, drawn from `prng` with the options' odds, in (zone, slot) order. Afterwards
    /// nothing is pending and writes are allowed again.
    pub fn crash(&mut self, prng: &mut Prng) {
        let mut pending = std::mem::take(&mut self.pending);
        // The log zone first, in the order written: once one write is lost or torn, every
        // later one is lost.
        let mut log_ended = false;
        if let Some(zone) = self.log_zone {
            for slot in std::mem::take(&mut self.log_pending_order) {
                let Some(bytes) = pending.remove(&(zone, slot)) else {
                    continue;
                };
                let outcome = if log_ended {
                    CrashOutcome::Lost
                } else {
                    self.crash_outcome(prng, &bytes)
                };
                log_ended |= outcome != CrashOutcome::Durable;
                self.land_at_crash(zone, slot, &bytes, outcome);
            }
        }
        for ((zone, slot), bytes) in pending {
            let outcome = self.crash_outcome(prng, &bytes);
            self.land_at_crash(zone, slot, &bytes, outcome);
        }
        assert!(self.pending.is_empty());
        self.sync_failed = false;
        self.counters.crashes += 1;
    }

    /// What a crash leaves of one pending write.
    fn land_at_crash(&mut self, zone: Zone, slot: u32, bytes: &[u8], outcome: CrashOutcome) {
        match outcome {
            CrashOutcome::Lost => self.counters.crash_writes_lost += 1,
            CrashOutcome::Durable => {
                self.counters.crash_writes_durable += 1;
                self.apply(zone, slot, bytes);
            }
            CrashOutcome::Torn { sectors } => {
                self.counters.crash_writes_torn += 1;
                let torn_bytes = (sectors * SECTOR_SIZE_BYTES) as usize;
                assert!(0 < torn_bytes);
                assert!(torn_bytes < bytes.len());
                self.durable_bytes_mut(zone, slot)[..torn_bytes].copy_from_slice(&bytes[..torn_bytes]);
                // The record in the slot is the torn one, so later flips land within it.
                self.durable_record_bytes[zone.index()][slot as usize] = bytes.len() as u32;
                self.faults.entry((zone, slot)).or_default().torn = true;
            }
        }
    }

    fn crash_outcome(&self, prng: &mut Prng, bytes: &[u8]) -> CrashOutcome {
        let draw = prng.below(u64::from(PPM));
        let lost_ppm = u64::from(self.options.crash_write_lost_ppm);
        let torn_ppm = u64::from(self.options.crash_write_torn_ppm);
        if draw < lost_ppm {
            return CrashOutcome::Lost;
        }
        if draw >= lost_ppm + torn_ppm {
            return CrashOutcome::Durable;
        }
        let sectors_total = (bytes.len() as u32).div_ceil(SECTOR_SIZE_BYTES);
        if sectors_total < 2 {
            // One sector is written atomically: it cannot tear, so the write is lost.
            return CrashOutcome::Lost;
        }
        let sectors = prng.range_inclusive(1, u64::from(sectors_total) - 1) as u32;
        CrashOutcome::Torn { sectors }
    }

    /// Flips one random bit of the slot's durable bytes, within the last record written there
    /// (anywhere in the slot if none), and marks the slot faulty. Returns the bit's index from
    /// the slot's start (byte `index / 8`, bit `index % 8`). A pending write covering the bit
    /// hides it from `read` (page cache) until a crash loses that write; a durable rewrite of
    /// the slot removes the mark.
    pub fn corrupt(&mut self, zone: Zone, slot: u32, prng: &mut Prng) -> u64 {
        self.check_slot(zone, slot);
        let record_bytes = match self.durable_record_bytes[zone.index()][slot as usize] {
            0 => self.layout.shape(zone).slot_size_bytes,
            record_bytes => record_bytes,
        };
        let bit_index = prng.below(u64::from(record_bytes) * 8);
        self.durable_bytes_mut(zone, slot)[(bit_index / 8) as usize] ^= 1 << (bit_index % 8);
        self.faults.entry((zone, slot)).or_default().bits_flipped += 1;
        self.counters.bits_flipped += 1;
        bit_index
    }

    /// Zeroes every zone and forgets pending writes and fault marks, as a new disk in place of
    /// the old. Counters are kept.
    pub fn wipe(&mut self) {
        for zone in Zone::ALL {
            self.durable[zone.index()].fill(None);
            self.durable_record_bytes[zone.index()].fill(0);
        }
        self.pending.clear();
        self.log_pending_order.clear();
        self.faults.clear();
        self.sync_failed = false;
        self.counters.wipes += 1;
    }

    /// The slots that hold an injected fault now (a torn write or a bit flip not yet durably
    /// overwritten), in (zone, slot) order.
    pub fn faulty_slots(&self) -> Vec<(Zone, u32, SlotFaults)> {
        self.faults
            .iter()
            .map(|(&(zone, slot), &faults)| (zone, slot, faults))
            .collect()
    }

    /// Whether `slot` holds an injected fault now.
    pub fn is_faulty(&self, zone: Zone, slot: u32) -> bool {
        self.faults.contains_key(&(zone, slot))
    }

    /// Asserts the cross-field invariants. Cheap enough to call after every step in tests.
    pub fn check_invariants(&self) {
        for zone in Zone::ALL {
            let shape = self.layout.shape(zone);
            assert_eq!(self.durable[zone.index()].len(), shape.slot_count as usize);
            assert_eq!(
                self.durable_record_bytes[zone.index()].len(),
                shape.slot_count as usize
            );
            for bytes in self.durable[zone.index()].iter().flatten() {
                assert_eq!(bytes.len(), shape.slot_size_bytes as usize);
            }
            for &record_bytes in &self.durable_record_bytes[zone.index()] {
                assert!(record_bytes <= shape.slot_size_bytes);
            }
        }
        for (&(zone, slot), bytes) in &self.pending {
            assert!(slot < self.layout.shape(zone).slot_count);
            assert!(!bytes.is_empty());
            assert!(bytes.len() <= self.layout.shape(zone).slot_size_bytes as usize);
        }
        for (&(zone, slot), faults) in &self.faults {
            assert!(slot < self.layout.shape(zone).slot_count);
            assert_ne!(*faults, SlotFaults::default());
        }
        if self.sync_failed {
            assert!(self.counters.syncs_failed > 0);
        }
    }

    /// Lands a whole write in the durable bytes. The slot now holds one complete new record,
    /// so its fault marks go.
    fn apply(&mut self, zone: Zone, slot: u32, bytes: &[u8]) {
        self.durable_bytes_mut(zone, slot)[..bytes.len()].copy_from_slice(bytes);
        self.durable_record_bytes[zone.index()][slot as usize] = bytes.len() as u32;
        self.faults.remove(&(zone, slot));
    }

    fn durable_bytes_mut(&mut self, zone: Zone, slot: u32) -> &mut [u8] {
        let size_bytes = self.layout.shape(zone).slot_size_bytes as usize;
        self.durable[zone.index()][slot as usize]
            .get_or_insert_with(|| vec![0; size_bytes].into_boxed_slice())
    }

    fn check_slot(&self, zone: Zone, slot: u32) {
        let slot_count = self.layout.shape(zone).slot_count;
        assert!(
            slot < slot_count,
            "{zone:?} slot {slot} is not below {slot_count}"
        );
    }
}
