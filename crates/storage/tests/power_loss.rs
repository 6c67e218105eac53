//! Seeded power-loss simulation of one `PartitionLog` over [`SimDisk`] (durability contract,
//! scenario 11; the fault model is in `cairn_storage::sim_disk`).
//!
//! Per seed, a deterministic workload: random batches appended, commits (a batch counts as
//! ACKed only once `commit` returned `Ok`; in relaxed mode once `append` did), polls, clean
//! closes, restarts without power loss (SIGKILL), power losses at random points (between append
//! and commit, inside rotation, commit, purge, close and even recovery), injected fdatasync
//! failures and torn writes. After every reopen it checks:
//!
//! - the log reopens (a crash alone never makes it `Damaged`);
//! - durable modes: every ACKed or polled message is readable at its offset with identical bytes;
//! - all modes: no offset ever carries two different messages across the seed's whole history
//!   (ACKed, polled or recovered), and the next offset lies above every offset ever seen;
//! - after a clean close, the reopened log continues at exactly the old counter (no gap);
//! - a commit creates, renames and removes no file, syncs no directory and issues at most two
//!   data barriers.
//!
//! `CAIRN_SIM_SEEDS=<n>` runs seeds `0..n` (default 2000); `CAIRN_SIM_SEED=<s>` replays one.

mod common;

use cairn_storage::StorageError;
use cairn_storage::io::Disk;
use cairn_storage::log::{LogConfig, PartitionLog, SyncMode};
use cairn_storage::sim_disk::{SimDisk, SimRng};
use common::{client_batch, decode_batches};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const PARTITION: u32 = 5;
const DEFAULT_SEEDS: u64 = 2_000;

/// Everything the simulated clients ever learned about the partition.
#[derive(Debug, Default)]
struct History {
    /// Offset → payload of every message that was ACKed, polled, or read back after a reopen.
    /// Invariant: an offset is bound to one payload forever.
    seen: BTreeMap<u64, Vec<u8>>,
    /// Offsets of messages a durable-mode client was promised (ACKed or shown by a poll).
    promised: BTreeMap<u64, Vec<u8>>,
    /// A purge (or a deletion of old segments) was attempted up to here: offsets below may be
    /// gone.
    purge_attempted_below: u64,
    /// A purge or deletion completed up to here: nothing below may ever be readable again.
    purged_below: u64,
}

struct Sim {
    seed: u64,
    rng: SimRng,
    disk: SimDisk,
    dir: PathBuf,
    config: LogConfig,
    log: Option<PartitionLog>,
    history: History,
    /// Appended in a durable mode, waiting for a commit: (base offset, payloads).
    uncommitted: Vec<(u64, Vec<Vec<u8>>)>,
    next_message_id: u64,
    /// Set by a successful `close`: the counter the reopened log must continue at.
    clean_stop_at: Option<u64>,
}

impl Sim {
    fn new(seed: u64) -> Sim {
        let mut rng = SimRng::new(seed);
        let sync = match rng.below(6) {
            0 | 1 => SyncMode::Os,
            2 => SyncMode::EveryAppend,
            _ => SyncMode::GroupCommit,
        };
        let config = LogConfig {
            segment_size_bytes: rng.range_inclusive(700, 4_000),
            sync,
            offset_lease_block_count: rng.range_inclusive(0, 48),
        };
        let disk = SimDisk::new();
        let dir = PathBuf::from("/sim/partitions/5");
        let log = PartitionLog::create_on(Arc::new(disk.clone()), &dir, PARTITION, config)
            .expect("create on a healthy disk");
        Sim {
            seed,
            rng,
            disk,
            dir,
            config,
            log: Some(log),
            history: History::default(),
            uncommitted: Vec::new(),
            next_message_id: 0,
            clean_stop_at: None,
        }
    }

    fn durable(&self) -> bool {
        self.config.sync.is_durable()
    }

    fn log(&mut self) -> &mut PartitionLog {
        self.log.as_mut().expect("log is open")
    }

    /// Bind `offset` to `payload` forever; panics if it was bound to something else.
    fn bind(&mut self, offset: u64, payload: &[u8], what: &str) {
        if let Some(existing) = self.history.seen.get(&offset) {
            assert!(
                existing == payload,
                "offset {offset} {what} with different content than before (re-issued offset): {:?} vs {:?}",
                String::from_utf8_lossy(existing),
                String::from_utf8_lossy(payload)
            );
        } else {
            self.history.seen.insert(offset, payload.to_vec());
        }
    }

    fn ack(&mut self, base_offset: u64, payloads: &[Vec<u8>]) {
        for (i, payload) in payloads.iter().enumerate() {
            let offset = base_offset + i as u64;
            self.bind(offset, payload, "ACKed");
            if self.durable() {
                self.history.promised.insert(offset, payload.clone());
            }
        }
    }

    fn new_payloads(&mut self) -> Vec<Vec<u8>> {
        let count = self.rng.range_inclusive(1, 4);
        (0..count)
            .map(|_| {
                self.next_message_id += 1;
                let mut payload = format!("seed{}-msg{}-", self.seed, self.next_message_id).into_bytes();
                let filler = self.rng.below(160) as usize;
                payload.resize(payload.len() + filler, b'a' + (self.next_message_id % 26) as u8);
                payload
            })
            .collect()
    }

    fn append(&mut self) {
        let payloads = self.new_payloads();
        let batch = client_batch(&payloads);
        let timestamp_us = 1_000 + self.next_message_id;
        match self.log().append(&batch, timestamp_us) {
            Ok(base_offset) => match self.config.sync {
                SyncMode::Os | SyncMode::EveryAppend => self.ack(base_offset, &payloads),
                SyncMode::GroupCommit => self.uncommitted.push((base_offset, payloads)),
            },
            Err(error) => self.after_failure(error),
        }
    }

    fn commit(&mut self, inject_fsync_failure: bool) {
        if inject_fsync_failure {
            self.disk.fail_next_sync_data(1);
        }
        let before = self.disk.stats();
        let result = self.log().commit();
        let after = self.disk.stats();
        self.disk.fail_next_sync_data(0);
        assert_eq!(after.create_count, before.create_count, "a commit created a file");
        assert_eq!(after.rename_count, before.rename_count, "a commit renamed a file");
        assert_eq!(after.remove_count, before.remove_count, "a commit removed a file");
        assert_eq!(
            after.sync_dir_count, before.sync_dir_count,
            "a commit synced a directory"
        );
        assert!(
            after.sync_data_count - before.sync_data_count <= 2,
            "more than two barriers"
        );
        match result {
            Ok(info) => {
                let uncommitted = std::mem::take(&mut self.uncommitted);
                for (base_offset, payloads) in uncommitted {
                    assert!(base_offset + payloads.len() as u64 <= info.durable_next_offset);
                    self.ack(base_offset, &payloads);
                }
                assert_eq!(info.durable_next_offset, self.log().next_offset());
                assert_eq!(self.log().visible_next_offset(), self.log().next_offset());
            }
            Err(error) => self.after_failure(error),
        }
    }

    /// A failed call: nothing pending is ever ACKed. The log is either stopped (reopen it) or
    /// the power is out (crash, then reopen).
    fn after_failure(&mut self, error: StorageError) {
        assert!(
            !matches!(error, StorageError::Damaged { .. } | StorageError::Invalid(_)),
            "unexpected error from a healthy workload: {error}"
        );
        self.uncommitted.clear();
        if self.disk.power_is_cut() {
            self.power_loss();
        } else {
            let log = self.log.take().expect("log is open");
            assert!(
                log.stopped_reason().is_some(),
                "a failed write must stop the log: {error}"
            );
            drop(log);
            if self.rng.chance(1, 2) {
                self.power_loss();
            } else {
                self.reopen();
            }
        }
    }

    fn poll(&mut self) {
        let log = self.log.as_ref().expect("log is open");
        let from_offset = match self.history.seen.keys().next_back() {
            Some(&last) if self.rng.chance(1, 2) => self.rng.below(last + 2),
            _ => 0,
        };
        let max_messages = self.rng.range_inclusive(1, 50) as u32;
        let mut out = Vec::new();
        if let Err(error) = log.read(from_offset, max_messages, &mut out) {
            assert!(self.disk.power_is_cut(), "poll failed: {error}");
            self.power_loss();
            return;
        }
        let visible = log.visible_next_offset();
        let messages = decode_batches(&out);
        assert!(messages.len() <= max_messages as usize);
        for message in messages {
            assert!(message.offset >= from_offset);
            assert!(
                message.offset < visible,
                "poll returned offset {} at or above the visible end {visible}",
                message.offset
            );
            self.bind(message.offset, &message.payload, "polled");
            if self.durable() {
                self.history.promised.insert(message.offset, message.payload);
            }
        }
    }

    fn close(&mut self) {
        let log = self.log.take().expect("log is open");
        let counter = log.next_offset();
        let pending = std::mem::take(&mut self.uncommitted);
        match log.close() {
            Ok(()) => {
                // The final commit inside `close` made them durable: the server ACKs them now.
                for (base_offset, payloads) in pending {
                    self.ack(base_offset, &payloads);
                }
                self.clean_stop_at = Some(counter);
            }
            Err(error) => {
                assert!(!matches!(error, StorageError::Damaged { .. }), "{error}");
                if self.disk.power_is_cut() {
                    self.power_loss();
                    return;
                }
            }
        }
        self.reopen();
    }

    /// Retention: delete the oldest 1..=3 sealed segments.
    fn delete_oldest(&mut self) {
        let count = self.rng.range_inclusive(1, 3) as usize;
        let sealed = self.log().sealed_segments();
        // Without a failure, the new start is the base of the first segment kept; a failure
        // may come after the marker, so then anything up to the counter may be gone.
        let bound = sealed
            .get(count)
            .map_or(self.log().next_offset(), |kept| kept.base_offset);
        let counter = self.log().next_offset();
        match self.log().delete_oldest_segments(count) {
            Ok(deleted) => {
                let start = self.log().start_offset();
                self.history.purge_attempted_below = self.history.purge_attempted_below.max(start);
                assert_eq!(deleted.len(), count.min(sealed.len()));
                assert_eq!(deleted[..], sealed[..deleted.len()]);
                assert!(start <= bound);
                self.history.purged_below = self.history.purged_below.max(start);
                self.uncommitted.retain(|(base, _)| *base >= start);
            }
            Err(error) => {
                self.history.purge_attempted_below = self.history.purge_attempted_below.max(counter);
                self.after_failure(error)
            }
        }
    }

    fn purge(&mut self) {
        let counter = self.log().next_offset();
        self.history.purge_attempted_below = counter;
        match self.log().purge() {
            Ok(()) => {
                self.history.purged_below = counter;
                self.uncommitted.clear();
            }
            Err(error) => self.after_failure(error),
        }
    }

    /// SIGKILL-style restart: the process dies, the OS keeps its page cache.
    fn restart(&mut self) {
        self.uncommitted.clear();
        drop(self.log.take());
        self.reopen();
    }

    fn power_loss(&mut self) {
        self.uncommitted.clear();
        drop(self.log.take());
        self.clean_stop_at = None;
        let crash_seed = self.rng.next_u64();
        self.disk.crash(crash_seed);
        self.reopen();
    }

    /// Open (possibly losing power during recovery, then retrying), then verify.
    fn reopen(&mut self) {
        assert!(self.log.is_none());
        if self.rng.chance(1, 4) {
            self.disk.cut_power_after(self.rng.below(40));
        }
        let mut attempts = 0;
        let log = loop {
            attempts += 1;
            match PartitionLog::open_on(Arc::new(self.disk.clone()), &self.dir, PARTITION, self.config) {
                Ok(log) => break log,
                Err(error) if self.disk.power_is_cut() && attempts < 4 => {
                    assert!(!matches!(error, StorageError::Damaged { .. }), "{error}");
                    // Recovery itself lost power: not a clean stop any more.
                    self.clean_stop_at = None;
                    let crash_seed = self.rng.next_u64();
                    self.disk.crash(crash_seed);
                }
                Err(error) => panic!("reopen failed (a crash alone must never damage a log): {error}"),
            }
        };
        self.disk.cancel_power_cut();
        if self.disk.power_is_cut() {
            // The countdown ran out inside a successful open's last operation: treat it as a
            // crash right after the open.
            drop(log);
            self.power_loss();
            return;
        }
        self.log = Some(log);
        self.verify_after_open();
    }

    fn verify_after_open(&mut self) {
        let log = self.log.as_ref().expect("log is open");
        assert!(log.check_invariants());
        let next_offset = log.next_offset();
        assert_eq!(
            log.visible_next_offset(),
            next_offset,
            "everything recovered is durable and visible after open"
        );
        if let Some(counter) = self.clean_stop_at.take() {
            assert_eq!(next_offset, counter, "a clean stop must leave no gap");
        }
        if let Some(&last_seen) = self.history.seen.keys().next_back() {
            assert!(
                next_offset > last_seen,
                "next offset {next_offset} would re-issue offset {last_seen}"
            );
        }
        let mut out = Vec::new();
        log.read(0, u32::MAX, &mut out)
            .unwrap_or_else(|error| panic!("read after reopen failed: {error}"));
        let messages = decode_batches(&out);
        let mut readable = BTreeMap::new();
        for message in &messages {
            assert!(
                message.offset >= self.history.purged_below,
                "purged offset {} came back",
                message.offset
            );
            assert!(message.offset < next_offset);
            readable.insert(message.offset, message.payload.clone());
        }
        for (offset, payload) in &readable {
            self.bind(*offset, payload, "recovered");
        }
        if self.durable() {
            for (offset, payload) in &self.history.promised {
                if *offset < self.history.purge_attempted_below {
                    continue;
                }
                let found = readable.get(offset);
                assert!(
                    found == Some(payload),
                    "ACKed message at offset {offset} lost or changed after reopen ({} readable messages, next offset {next_offset})",
                    readable.len()
                );
            }
        }
    }

    fn run(&mut self) {
        let steps = self.rng.range_inclusive(20, 70);
        for _ in 0..steps {
            if self.rng.chance(1, 10) {
                self.disk.cut_power_after(self.rng.below(12));
            }
            let action = self.rng.below(100);
            match action {
                0..=49 => self.append(),
                50..=71 => {
                    let inject = self.rng.chance(1, 12);
                    self.commit(inject);
                }
                72..=79 => self.poll(),
                80..=84 => self.close(),
                85..=89 => self.restart(),
                90..=95 => self.power_loss(),
                96..=97 => self.delete_oldest(),
                _ => self.purge(),
            }
            if self.disk.power_is_cut() {
                // The countdown ran out in an operation that reported success to nobody
                // (e.g. a read inside `append` before its write): lose power now.
                self.power_loss();
            } else {
                self.disk.cancel_power_cut();
            }
        }
        if self.rng.chance(1, 2) {
            self.power_loss();
        } else {
            self.close();
        }
    }
}

fn run_seed(seed: u64) {
    let outcome = std::panic::catch_unwind(|| Sim::new(seed).run());
    if let Err(panic) = outcome {
        let message = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        panic!(
            "power-loss simulation failed for seed {seed}: {message}\n\
             replay: CAIRN_SIM_SEED={seed} cargo test -p cairn-storage --test power_loss"
        );
    }
}

fn env_u64(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    Some(
        value
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value} is not a number")),
    )
}

#[test]
fn power_loss_seeds() {
    if let Some(seed) = env_u64("CAIRN_SIM_SEED") {
        run_seed(seed);
        return;
    }
    let seeds = env_u64("CAIRN_SIM_SEEDS").unwrap_or(DEFAULT_SEEDS);
    for seed in 0..seeds {
        run_seed(seed);
    }
}

/// The simulator's own disk is sane for the basic paths the workload relies on.
#[test]
fn a_log_on_the_sim_disk_round_trips_without_faults() {
    let disk = SimDisk::new();
    let dir = Path::new("/sim/p");
    let config = LogConfig::new(1_000, SyncMode::GroupCommit);
    let mut log = PartitionLog::create_on(Arc::new(disk.clone()), dir, PARTITION, config).unwrap();
    for i in 0..30u64 {
        let batch = client_batch(&[format!("m{i}").into_bytes()]);
        assert_eq!(log.append(&batch, i).unwrap(), i);
    }
    assert_eq!(log.visible_next_offset(), 0, "nothing visible before a commit");
    assert_eq!(log.read(0, 100, &mut Vec::new()).unwrap(), 0);
    let info = log.commit().unwrap();
    assert_eq!(info.durable_next_offset, 30);
    assert_eq!(info.barriers, 2);
    assert_eq!(log.commit().unwrap().barriers, 0, "nothing new: no barrier");
    log.close().unwrap();
    disk.crash(99);
    let log = PartitionLog::open_on(Arc::new(disk.clone()), dir, PARTITION, config).unwrap();
    assert_eq!(log.next_offset(), 30);
    let mut out = Vec::new();
    assert_eq!(log.read(0, 100, &mut out).unwrap(), 30);
    assert!(disk.list_dir(dir).unwrap().contains(&"state".to_string()));
}
