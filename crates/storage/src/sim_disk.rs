//! An in-memory [`Disk`] that models power loss, for deterministic simulation tests (here and
//! in the server crate).
//!
//! # Model
//!
//! Every file is an *inode* with two contents: `durable` (what the platter holds) and
//! `volatile` (what reads return: the page cache). Each data operation on an open handle
//! (`write_all_at`, `set_len`) changes `volatile` at once and is queued as *pending* on the
//! inode. `sync_data` applies the pending operations, in order, to `durable`.
//!
//! The namespace (path → inode) likewise exists twice: the volatile one that `list_dir`,
//! `open_*`, `file_len` see, and the durable one. Each `create_new`, `rename`,
//! `remove_file` and the creation of a file by `write_synced` changes the volatile namespace
//! and is queued in the journal of its parent directory; `sync_dir(dir)` applies that
//! directory's journal, in order, to the durable namespace. Directories themselves
//! (`create_dir_all`) are durable at once: partition directories are made by the layer above,
//! which syncs their parents; this model is about files.
//!
//! [`SimDisk::crash`] is a power loss: from a seeded generator it decides, per inode, how many
//! of its pending operations reached the disk and, per directory, how many of its journaled
//! operations did; then volatile state is replaced by durable state and every open handle dies.
//!
//! # Fault model (what may happen at a crash, and why each is recoverable)
//!
//! | Fault | Model | Why the engine recovers |
//! |-------|-------|-------------------------|
//! | Lost unsynced data | Per file, only a *prefix* (in issue order) of the unsynced operations survives, possibly none | Nothing unsynced was acknowledged (durable modes) or it lies above the reservation (relaxed); recovery truncates to whole records |
//! | Torn write | The last surviving unsynced write may survive as a random prefix of its bytes | A torn record fails its checksum with nothing valid after it: a torn tail above the frontier; a torn state slot leaves the other slot |
//! | Lost directory operations | Per directory, only a prefix (in issue order, as a metadata journal) of the unsynced creates/renames/removes survives | Rotation syncs the directory before writing into a new segment; index files are rebuilt; purge and gaps order their steps so every prefix is a state recovery understands |
//! | Failed barrier | [`SimDisk::fail_next_sync_data`]: the next `sync_data` calls fail; what they covered is dropped from the pending queue (it will never reach the disk, although reads still return it until the crash, like Linux after a writeback error) | A failed barrier stops the log and nothing it covered is acknowledged; recovery rewrites data above the frontier before its own barrier, so cached-but-lost pages are not blessed |
//! | Power cut mid-operation | [`SimDisk::cut_power_after`]: the n-th next operation is applied but returns an error, and every later one fails without effect until [`SimDisk::crash`] | Equivalent to the process dying at that instruction; the caller never saw success, so it acknowledged nothing |
//!
//! Deliberately *not* modelled (the engine does not claim to survive them from a crash alone):
//! reordering of unsynced writes within one file (a later record persisted, an earlier one
//! lost: recovery would refuse it as mid-log damage, a false refusal, never a false
//! truncation), bit flips (damage, tested separately), a barrier that reports success without
//! persisting (a lying device).
//!
//! `write_synced` creates or replaces a file and makes its contents durable at once (it models
//! write + fsync; its directory entry, if new, still needs `sync_dir`); barrier failures are
//! not injected into it.
//!
//! Determinism: no clock, no thread-local randomness; iteration over `BTreeMap`s. A run is a
//! function of the seed given to [`SimDisk::crash`] and the sequence of calls.

use crate::StorageError;
use crate::io::{Disk, ReadFile, WriteFile, parent_dir};
use std::collections::{BTreeMap, BTreeSet};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

/// SplitMix64: a tiny seeded generator for simulations (deterministic, no dependencies).
#[derive(Debug, Clone)]
pub struct SimRng {
    state: u64,
}

impl SimRng {
    pub fn new(seed: u64) -> SimRng {
        SimRng { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..bound` (`bound` > 0).
    pub fn below(&mut self, bound: u64) -> u64 {
        assert!(bound > 0);
        self.next_u64() % bound
    }

    /// Uniform in `low..=high`.
    pub fn range_inclusive(&mut self, low: u64, high: u64) -> u64 {
        assert!(low <= high);
        low + self.below(high - low + 1)
    }

    /// True with probability `numerator / denominator`.
    pub fn chance(&mut self, numerator: u64, denominator: u64) -> bool {
        self.below(denominator) < numerator
    }
}

/// Counters of the operations a [`SimDisk`] served (for per-ACK cost assertions).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimStats {
    pub sync_data_count: u64,
    pub sync_dir_count: u64,
    pub create_count: u64,
    pub rename_count: u64,
    pub remove_count: u64,
    pub crash_count: u64,
    /// Bytes whose page cache the caller released (`WriteFile::release_cache`).
    pub cache_released_bytes: u64,
    /// Releases that covered bytes not yet made stable by a barrier. In a durable journal a
    /// sign it lost track of what is durable; in `relaxed` mode a release follows a finished
    /// writeback instead, which this disk does not model, so there they count too.
    pub cache_released_unstable: u64,
}

/// The power-loss disk. Clones share one state (hand one clone to the engine as
/// `Arc<dyn Disk>`, keep another to crash it).
#[derive(Debug, Clone, Default)]
pub struct SimDisk {
    shared: Arc<Mutex<SimState>>,
}

#[derive(Debug, Clone)]
enum DataOp {
    Write { position_bytes: u64, bytes: Vec<u8> },
    SetLen { len_bytes: u64 },
}

#[derive(Debug, Clone)]
enum DirOp {
    Link { path: PathBuf, inode: u64 },
    Rename { from: PathBuf, to: PathBuf, inode: u64 },
    Unlink { path: PathBuf },
}

#[derive(Debug, Default)]
struct Inode {
    durable: Vec<u8>,
    volatile: Vec<u8>,
    /// Data operations since the last barrier, in issue order. Invariant: applying them to
    /// `durable` yields `volatile`, except for operations dropped by a failed barrier.
    pending: Vec<DataOp>,
}

#[derive(Debug, Default)]
struct SimState {
    /// Bumped by every crash; handles of an older epoch fail.
    epoch: u64,
    /// Operations left before the power is cut (`Some(0)`: the next operation is the last).
    ops_until_power_cut: Option<u64>,
    power_cut: bool,
    sync_data_failures_left: u32,
    /// Writes that fail as a full disk does: half the bytes written, then ENOSPC.
    write_failures_left: u32,
    inodes: BTreeMap<u64, Inode>,
    next_inode: u64,
    namespace: BTreeMap<PathBuf, u64>,
    durable_namespace: BTreeMap<PathBuf, u64>,
    /// Unsynced directory operations per directory, in issue order.
    journals: BTreeMap<PathBuf, Vec<DirOp>>,
    dirs: BTreeSet<PathBuf>,
    stats: SimStats,
}

fn sim_error(path: &Path, kind: ErrorKind, message: &str) -> StorageError {
    StorageError::Io {
        path: path.to_path_buf(),
        source: std::io::Error::new(kind, message.to_string()),
    }
}

fn apply_data_op(content: &mut Vec<u8>, op: &DataOp) {
    match op {
        DataOp::Write {
            position_bytes,
            bytes,
        } => {
            let start = *position_bytes as usize;
            let end = start + bytes.len();
            if content.len() < end {
                content.resize(end, 0);
            }
            content[start..end].copy_from_slice(bytes);
        }
        DataOp::SetLen { len_bytes } => content.resize(*len_bytes as usize, 0),
    }
}

fn apply_dir_op(namespace: &mut BTreeMap<PathBuf, u64>, op: &DirOp) {
    match op {
        DirOp::Link { path, inode } => {
            namespace.insert(path.clone(), *inode);
        }
        DirOp::Rename { from, to, inode } => {
            namespace.remove(from);
            namespace.insert(to.clone(), *inode);
        }
        DirOp::Unlink { path } => {
            namespace.remove(path);
        }
    }
}

impl SimState {
    /// After a crash or a kill, once the namespace and contents are what the next process
    /// sees: files no name reaches are gone, every open handle dies, faults are reset.
    fn restart(&mut self) {
        let referenced: BTreeSet<u64> = self.namespace.values().copied().collect();
        self.inodes.retain(|id, _| referenced.contains(id));
        self.epoch += 1;
        self.power_cut = false;
        self.ops_until_power_cut = None;
        self.sync_data_failures_left = 0;
        self.write_failures_left = 0;
        self.stats.crash_count += 1;
    }

    /// Count one operation against the power-cut countdown. `Err` once the power is cut;
    /// `Ok(true)` for the last operation before the cut (apply it, then report failure).
    fn tick(&mut self, path: &Path) -> Result<bool, StorageError> {
        if self.power_cut {
            return Err(sim_error(path, ErrorKind::Other, "simulated power loss"));
        }
        match self.ops_until_power_cut {
            Some(0) => {
                self.power_cut = true;
                Ok(true)
            }
            Some(left) => {
                self.ops_until_power_cut = Some(left - 1);
                Ok(false)
            }
            None => Ok(false),
        }
    }

    fn cut_result<T>(cut: bool, path: &Path, value: T) -> Result<T, StorageError> {
        if cut {
            Err(sim_error(path, ErrorKind::Other, "simulated power loss"))
        } else {
            Ok(value)
        }
    }

    fn check_parent(&self, path: &Path) -> Result<(), StorageError> {
        if self.dirs.contains(parent_dir(path)) {
            Ok(())
        } else {
            Err(sim_error(path, ErrorKind::NotFound, "no such directory"))
        }
    }

    fn journal(&mut self, path: &Path, op: DirOp) {
        self.journals
            .entry(parent_dir(path).to_path_buf())
            .or_default()
            .push(op);
    }

    /// A directory renamed with everything in it: the rename itself durable at once, like a
    /// directory's creation; operations inside it that were not synced stay unsynced, under
    /// the new name. Refused when `to` exists.
    fn rename_dir(state: &mut SimState, cut: bool, from: &Path, to: &Path) -> Result<(), StorageError> {
        if state.dirs.contains(to) || state.namespace.contains_key(to) {
            return Err(sim_error(to, ErrorKind::AlreadyExists, "the new name exists"));
        }
        let moved = |path: &Path| match path.strip_prefix(from) {
            Ok(rest) if rest.as_os_str().is_empty() => to.to_path_buf(),
            Ok(rest) => to.join(rest),
            Err(_) => path.to_path_buf(),
        };
        let rekey = |map: &BTreeMap<PathBuf, u64>| -> BTreeMap<PathBuf, u64> {
            map.iter().map(|(path, &inode)| (moved(path), inode)).collect()
        };
        state.namespace = rekey(&state.namespace);
        state.durable_namespace = rekey(&state.durable_namespace);
        state.dirs = state.dirs.iter().map(|dir| moved(dir)).collect();
        let journals = std::mem::take(&mut state.journals);
        state.journals = journals
            .into_iter()
            .map(|(dir, ops)| {
                let ops = ops
                    .into_iter()
                    .map(|op| match op {
                        DirOp::Link { path, inode } => DirOp::Link {
                            path: moved(&path),
                            inode,
                        },
                        DirOp::Rename { from, to, inode } => DirOp::Rename {
                            from: moved(&from),
                            to: moved(&to),
                            inode,
                        },
                        DirOp::Unlink { path } => DirOp::Unlink { path: moved(&path) },
                    })
                    .collect();
                (moved(&dir), ops)
            })
            .collect();
        state.stats.rename_count += 1;
        SimState::cut_result(cut, from, ())
    }

    fn new_inode(&mut self, contents: Vec<u8>) -> u64 {
        self.next_inode += 1;
        self.inodes.insert(
            self.next_inode,
            Inode {
                durable: contents.clone(),
                volatile: contents,
                pending: Vec::new(),
            },
        );
        self.next_inode
    }

    fn inode_of(&self, path: &Path) -> Result<u64, StorageError> {
        self.namespace
            .get(path)
            .copied()
            .ok_or_else(|| sim_error(path, ErrorKind::NotFound, "no such file"))
    }
}

impl SimDisk {
    pub fn new() -> SimDisk {
        SimDisk::default()
    }

    fn lock(&self) -> MutexGuard<'_, SimState> {
        self.shared.lock().expect("sim disk lock poisoned")
    }

    /// The next `count` `sync_data` calls fail; what each covered will never reach the disk.
    pub fn fail_next_sync_data(&self, count: u32) {
        self.lock().sync_data_failures_left = count;
    }

    /// The next `count` file writes fail as on a full disk: the first half of their bytes is
    /// written (unsynced), then ENOSPC is reported.
    pub fn fail_next_writes(&self, count: u32) {
        self.lock().write_failures_left = count;
    }

    /// Cut the power after `ops` more operations: operation number `ops` (0-based) is applied
    /// but reports an error, every later one fails without effect, until [`SimDisk::crash`].
    pub fn cut_power_after(&self, ops: u64) {
        self.lock().ops_until_power_cut = Some(ops);
    }

    /// Whether the power is cut (a countdown ran out) and a crash is due.
    pub fn power_is_cut(&self) -> bool {
        self.lock().power_cut
    }

    /// Cancel a pending power-cut countdown (no effect once the power is cut).
    pub fn cancel_power_cut(&self) {
        self.lock().ops_until_power_cut = None;
    }

    pub fn stats(&self) -> SimStats {
        self.lock().stats
    }

    /// Power loss: decide from `seed` what unsynced state reached the disk (see the module
    /// doc), drop the rest, invalidate every open handle and restore power.
    pub fn crash(&self, seed: u64) {
        let mut rng = SimRng::new(seed);
        let mut state = self.lock();
        let state = &mut *state;
        let journals = std::mem::take(&mut state.journals);
        for ops in journals.values() {
            let surviving = surviving_count(&mut rng, ops.len());
            for op in &ops[..surviving] {
                apply_dir_op(&mut state.durable_namespace, op);
            }
        }
        for inode in state.inodes.values_mut() {
            let pending = std::mem::take(&mut inode.pending);
            let surviving = surviving_count(&mut rng, pending.len());
            for (index, op) in pending[..surviving].iter().enumerate() {
                let last = index + 1 == surviving;
                match op {
                    DataOp::Write {
                        position_bytes,
                        bytes,
                    } if last && rng.chance(1, 2) => {
                        // Torn: a random prefix (possibly empty) reached the disk.
                        let torn_len = rng.below(bytes.len() as u64 + 1) as usize;
                        apply_data_op(
                            &mut inode.durable,
                            &DataOp::Write {
                                position_bytes: *position_bytes,
                                bytes: bytes[..torn_len].to_vec(),
                            },
                        );
                    }
                    _ => apply_data_op(&mut inode.durable, op),
                }
            }
            inode.volatile = inode.durable.clone();
        }
        state.namespace = state.durable_namespace.clone();
        state.restart();
    }

    /// The process dies (SIGKILL) and the machine keeps running: the page cache survives, so
    /// everything written (volatile) is what the next process reads, whatever was synced.
    /// Every open handle dies; power stays on.
    pub fn kill_process(&self) {
        let mut state = self.lock();
        let state = &mut *state;
        state.journals.clear();
        for inode in state.inodes.values_mut() {
            inode.pending.clear();
            inode.durable = inode.volatile.clone();
        }
        state.durable_namespace = state.namespace.clone();
        state.restart();
    }

    /// The volatile contents of `path` (what a reader sees now), for tests.
    pub fn read_volatile(&self, path: &Path) -> Option<Vec<u8>> {
        let state = self.lock();
        let inode = state.namespace.get(path)?;
        Some(state.inodes.get(inode)?.volatile.clone())
    }

    /// Every file whose path lies under `dir` (at any depth), in path order (for tests that
    /// pick a file to damage).
    pub fn files_under(&self, dir: &Path) -> Vec<PathBuf> {
        let state = self.lock();
        state
            .namespace
            .keys()
            .filter(|path| path.starts_with(dir))
            .cloned()
            .collect()
    }

    /// Replace the contents of `path` durably (for tests that inject damage: bit flips).
    pub fn overwrite_durable(&self, path: &Path, contents: Vec<u8>) -> bool {
        let mut state = self.lock();
        let Some(&inode) = state.namespace.get(path) else {
            return false;
        };
        let Some(inode) = state.inodes.get_mut(&inode) else {
            return false;
        };
        inode.durable = contents.clone();
        inode.volatile = contents;
        inode.pending.clear();
        true
    }

    fn handle(&self, path: &Path, inode: u64, epoch: u64) -> SimFile {
        SimFile {
            shared: self.shared.clone(),
            path: path.to_path_buf(),
            inode,
            epoch,
        }
    }
}

/// How many of `len` queued operations survive a crash: none half of the time, otherwise a
/// uniform prefix length.
fn surviving_count(rng: &mut SimRng, len: usize) -> usize {
    if len == 0 || rng.chance(1, 2) {
        0
    } else {
        rng.range_inclusive(1, len as u64) as usize
    }
}

impl Disk for SimDisk {
    fn create_dir_all(&self, dir: &Path) -> Result<(), StorageError> {
        let mut state = self.lock();
        let cut = state.tick(dir)?;
        let mut current = Some(dir);
        while let Some(path) = current {
            if path.as_os_str().is_empty() {
                break;
            }
            state.dirs.insert(path.to_path_buf());
            current = path.parent();
        }
        SimState::cut_result(cut, dir, ())
    }

    fn list_dir(&self, dir: &Path) -> Result<Vec<String>, StorageError> {
        let mut state = self.lock();
        let cut = state.tick(dir)?;
        if !state.dirs.contains(dir) {
            return Err(sim_error(dir, ErrorKind::NotFound, "no such directory"));
        }
        let files = state.namespace.keys();
        let subdirs = state.dirs.iter();
        let mut names: Vec<String> = files
            .chain(subdirs)
            .filter(|path| path.parent() == Some(dir))
            .filter_map(|path| path.file_name()?.to_str().map(str::to_string))
            .collect();
        names.sort();
        names.dedup();
        SimState::cut_result(cut, dir, names)
    }

    fn file_len(&self, path: &Path) -> Result<Option<u64>, StorageError> {
        let mut state = self.lock();
        let cut = state.tick(path)?;
        let len = state
            .namespace
            .get(path)
            .and_then(|inode| state.inodes.get(inode))
            .map(|inode| inode.volatile.len() as u64);
        SimState::cut_result(cut, path, len)
    }

    fn read_all(&self, path: &Path, len_bytes_max: u64) -> Result<Option<Vec<u8>>, StorageError> {
        let mut state = self.lock();
        let cut = state.tick(path)?;
        let Some(inode) = state
            .namespace
            .get(path)
            .and_then(|inode| state.inodes.get(inode))
        else {
            return SimState::cut_result(cut, path, None);
        };
        let len_bytes = inode.volatile.len() as u64;
        if len_bytes > len_bytes_max {
            return Err(StorageError::Damaged {
                path: path.to_path_buf(),
                position: len_bytes_max,
                reason: format!("file of {len_bytes} bytes exceeds the plausible maximum of {len_bytes_max}"),
            });
        }
        let bytes = inode.volatile.clone();
        SimState::cut_result(cut, path, Some(bytes))
    }

    fn open_read(&self, path: &Path) -> Result<Box<dyn ReadFile>, StorageError> {
        let mut state = self.lock();
        let cut = state.tick(path)?;
        let inode = state.inode_of(path)?;
        let epoch = state.epoch;
        drop(state);
        SimState::cut_result(
            cut,
            path,
            Box::new(self.handle(path, inode, epoch)) as Box<dyn ReadFile>,
        )
    }

    fn create_new(&self, path: &Path) -> Result<Box<dyn WriteFile>, StorageError> {
        let mut state = self.lock();
        let cut = state.tick(path)?;
        state.check_parent(path)?;
        if state.namespace.contains_key(path) {
            return Err(sim_error(path, ErrorKind::AlreadyExists, "file exists"));
        }
        let inode = state.new_inode(Vec::new());
        state.namespace.insert(path.to_path_buf(), inode);
        state.journal(
            path,
            DirOp::Link {
                path: path.to_path_buf(),
                inode,
            },
        );
        state.stats.create_count += 1;
        let epoch = state.epoch;
        drop(state);
        SimState::cut_result(
            cut,
            path,
            Box::new(self.handle(path, inode, epoch)) as Box<dyn WriteFile>,
        )
    }

    fn open_write(&self, path: &Path) -> Result<Box<dyn WriteFile>, StorageError> {
        let mut state = self.lock();
        let cut = state.tick(path)?;
        let inode = state.inode_of(path)?;
        let epoch = state.epoch;
        drop(state);
        SimState::cut_result(
            cut,
            path,
            Box::new(self.handle(path, inode, epoch)) as Box<dyn WriteFile>,
        )
    }

    fn write_synced(&self, path: &Path, bytes: &[u8]) -> Result<(), StorageError> {
        let mut state = self.lock();
        let cut = state.tick(path)?;
        state.check_parent(path)?;
        match state.namespace.get(path).copied() {
            Some(inode) => {
                let inode = state.inodes.get_mut(&inode).expect("namespace names live inodes");
                inode.durable = bytes.to_vec();
                inode.volatile = bytes.to_vec();
                inode.pending.clear();
            }
            None => {
                let inode = state.new_inode(bytes.to_vec());
                state.namespace.insert(path.to_path_buf(), inode);
                state.journal(
                    path,
                    DirOp::Link {
                        path: path.to_path_buf(),
                        inode,
                    },
                );
                state.stats.create_count += 1;
            }
        }
        SimState::cut_result(cut, path, ())
    }

    fn rename(&self, from: &Path, to: &Path) -> Result<(), StorageError> {
        let mut state = self.lock();
        let cut = state.tick(from)?;
        assert_eq!(
            parent_dir(from),
            parent_dir(to),
            "the engine renames within one directory"
        );
        if state.dirs.contains(from) {
            return SimState::rename_dir(&mut state, cut, from, to);
        }
        let inode = state.inode_of(from)?;
        state.namespace.remove(from);
        state.namespace.insert(to.to_path_buf(), inode);
        state.journal(
            to,
            DirOp::Rename {
                from: from.to_path_buf(),
                to: to.to_path_buf(),
                inode,
            },
        );
        state.stats.rename_count += 1;
        SimState::cut_result(cut, from, ())
    }

    fn remove_file(&self, path: &Path) -> Result<bool, StorageError> {
        let mut state = self.lock();
        let cut = state.tick(path)?;
        let existed = state.namespace.remove(path).is_some();
        if existed {
            state.journal(
                path,
                DirOp::Unlink {
                    path: path.to_path_buf(),
                },
            );
            state.stats.remove_count += 1;
        }
        SimState::cut_result(cut, path, existed)
    }

    /// Durable at once, like a directory's creation; a directory that holds a file in either
    /// namespace (volatile, or durable because its removal was not synced) is refused, so a
    /// caller removes the files and syncs the directory first.
    fn remove_dir(&self, dir: &Path) -> Result<bool, StorageError> {
        let mut state = self.lock();
        let cut = state.tick(dir)?;
        if !state.dirs.contains(dir) {
            return SimState::cut_result(cut, dir, false);
        }
        let holds = |path: &PathBuf| path.starts_with(dir) && path.as_path() != dir;
        let occupied = state.namespace.keys().any(holds)
            || state.durable_namespace.keys().any(holds)
            || state.dirs.iter().any(holds);
        if occupied {
            return Err(sim_error(
                dir,
                ErrorKind::DirectoryNotEmpty,
                "directory not empty",
            ));
        }
        state.dirs.remove(dir);
        state.journals.remove(dir);
        SimState::cut_result(cut, dir, true)
    }

    fn sync_dir(&self, dir: &Path) -> Result<(), StorageError> {
        let mut state = self.lock();
        let cut = state.tick(dir)?;
        if !state.dirs.contains(dir) {
            return Err(sim_error(dir, ErrorKind::NotFound, "no such directory"));
        }
        let ops = state.journals.remove(dir).unwrap_or_default();
        for op in &ops {
            apply_dir_op(&mut state.durable_namespace, op);
        }
        state.stats.sync_dir_count += 1;
        SimState::cut_result(cut, dir, ())
    }
}

/// An open handle on a [`SimDisk`] inode (read or write).
#[derive(Debug)]
struct SimFile {
    shared: Arc<Mutex<SimState>>,
    path: PathBuf,
    inode: u64,
    epoch: u64,
}

impl SimFile {
    /// Lock the disk, count the operation, and check the handle survived every crash.
    fn begin(&self) -> Result<(MutexGuard<'_, SimState>, bool), StorageError> {
        let mut state = self.shared.lock().expect("sim disk lock poisoned");
        let cut = state.tick(&self.path)?;
        if state.epoch != self.epoch || !state.inodes.contains_key(&self.inode) {
            return Err(sim_error(
                &self.path,
                ErrorKind::Other,
                "handle from before a crash",
            ));
        }
        Ok((state, cut))
    }
}

impl ReadFile for SimFile {
    fn read_exact_at(&self, position_bytes: u64, buf: &mut [u8]) -> Result<(), StorageError> {
        let (state, cut) = self.begin()?;
        let inode = state.inodes.get(&self.inode).expect("checked by begin");
        let start = position_bytes as usize;
        let Some(source) = inode.volatile.get(start..start + buf.len()) else {
            return Err(sim_error(
                &self.path,
                ErrorKind::UnexpectedEof,
                "read past the end",
            ));
        };
        buf.copy_from_slice(source);
        SimState::cut_result(cut, &self.path, ())
    }
}

impl WriteFile for SimFile {
    fn release_cache(&mut self, position_bytes: u64, len_bytes: u64) {
        // Advice only: no fault tick, no change to any byte.
        let mut state = self.shared.lock().expect("sim disk lock poisoned");
        if state.epoch != self.epoch {
            return;
        }
        let end = position_bytes.saturating_add(len_bytes);
        let unstable = state.inodes.get(&self.inode).is_some_and(|inode| {
            inode.pending.iter().any(|op| match op {
                DataOp::Write {
                    position_bytes: at,
                    bytes,
                } => *at < end && at.saturating_add(bytes.len() as u64) > position_bytes,
                DataOp::SetLen { .. } => false,
            })
        });
        state.stats.cache_released_bytes += len_bytes;
        if unstable {
            state.stats.cache_released_unstable += 1;
        }
    }

    fn write_all_at(&mut self, position_bytes: u64, bytes: &[u8]) -> Result<(), StorageError> {
        let (mut state, cut) = self.begin()?;
        let full = state.write_failures_left > 0;
        if full {
            state.write_failures_left -= 1;
        }
        let inode = state.inodes.get_mut(&self.inode).expect("checked by begin");
        let written = if full { &bytes[..bytes.len() / 2] } else { bytes };
        let op = DataOp::Write {
            position_bytes,
            bytes: written.to_vec(),
        };
        apply_data_op(&mut inode.volatile, &op);
        inode.pending.push(op);
        if full {
            return Err(sim_error(&self.path, ErrorKind::StorageFull, "injected ENOSPC"));
        }
        SimState::cut_result(cut, &self.path, ())
    }

    fn set_len(&mut self, len_bytes: u64) -> Result<(), StorageError> {
        let (mut state, cut) = self.begin()?;
        let inode = state.inodes.get_mut(&self.inode).expect("checked by begin");
        let op = DataOp::SetLen { len_bytes };
        apply_data_op(&mut inode.volatile, &op);
        inode.pending.push(op);
        SimState::cut_result(cut, &self.path, ())
    }

    fn sync_data(&mut self) -> Result<(), StorageError> {
        let (mut state, cut) = self.begin()?;
        state.stats.sync_data_count += 1;
        let fail = state.sync_data_failures_left > 0;
        if fail {
            state.sync_data_failures_left -= 1;
        }
        let inode = state.inodes.get_mut(&self.inode).expect("checked by begin");
        let pending = std::mem::take(&mut inode.pending);
        if fail {
            // The covered writes are dropped: reads still return them, the disk never will.
            return Err(sim_error(
                &self.path,
                ErrorKind::Other,
                "injected fdatasync failure (EIO)",
            ));
        }
        for op in &pending {
            apply_data_op(&mut inode.durable, op);
        }
        SimState::cut_result(cut, &self.path, ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsynced_writes_and_directory_entries_vanish_synced_ones_stay() {
        let disk = SimDisk::new();
        let dir = Path::new("/p");
        disk.create_dir_all(dir).unwrap();
        let path = dir.join("a");
        let mut file = disk.create_new(&path).unwrap();
        file.write_all_at(0, b"hello").unwrap();
        file.sync_data().unwrap();
        // The entry is not durable yet: a crash that keeps no journal entry loses the file.
        let mut lost_once = false;
        for seed in 0..64 {
            let disk = SimDisk::new();
            disk.create_dir_all(dir).unwrap();
            let mut file = disk.create_new(&path).unwrap();
            file.write_all_at(0, b"x").unwrap();
            file.sync_data().unwrap();
            disk.crash(seed);
            lost_once |= disk.file_len(&path).unwrap().is_none();
        }
        assert!(lost_once);
        disk.sync_dir(dir).unwrap();
        file.write_all_at(5, b" world").unwrap();
        disk.crash(1);
        let after = disk.read_all(&path, 100).unwrap().unwrap();
        assert!(after.starts_with(b"hello"));
        assert!(b"hello world".starts_with(&after), "{after:?}");
        assert!(file.write_all_at(0, b"x").is_err(), "handles die with the power");
    }

    #[test]
    fn a_directory_renames_with_everything_in_it_and_unsynced_entries_stay_unsynced() {
        let disk = SimDisk::new();
        let group = Path::new("/p/group");
        disk.create_dir_all(&group.join("log")).unwrap();
        let synced = group.join("log/a");
        disk.write_synced(&synced, b"kept").unwrap();
        disk.sync_dir(&group.join("log")).unwrap();
        let unsynced = group.join("log/b");
        disk.create_new(&unsynced).unwrap().write_all_at(0, b"b").unwrap();
        let aside = Path::new("/p/group.quarantine.0");
        disk.rename(group, aside).unwrap();
        assert!(disk.list_dir(group).is_err(), "the old name is gone");
        assert_eq!(disk.list_dir(&aside.join("log")).unwrap(), vec!["a", "b"]);
        disk.crash(0);
        assert!(disk.list_dir(group).is_err(), "the rename is durable");
        assert_eq!(
            disk.read_all(&aside.join("log/a"), 100).unwrap().unwrap(),
            b"kept"
        );
        let names = disk.list_dir(&aside.join("log")).unwrap();
        assert!(names == ["a"] || names == ["a", "b"], "{names:?}");
        assert!(disk.rename(aside, Path::new("/p/x")).is_ok());
        disk.create_dir_all(Path::new("/p/y")).unwrap();
        assert!(
            disk.rename(Path::new("/p/x"), Path::new("/p/y")).is_err(),
            "the new name exists"
        );
    }

    #[test]
    fn a_failed_barrier_loses_what_it_covered_even_after_a_later_good_one() {
        let disk = SimDisk::new();
        let dir = Path::new("/p");
        disk.create_dir_all(dir).unwrap();
        let path = dir.join("a");
        let mut file = disk.create_new(&path).unwrap();
        disk.sync_dir(dir).unwrap();
        file.write_all_at(0, b"aaaa").unwrap();
        disk.fail_next_sync_data(1);
        assert!(file.sync_data().is_err());
        assert_eq!(disk.read_volatile(&path).unwrap(), b"aaaa", "reads still see it");
        file.sync_data().unwrap();
        disk.crash(7);
        assert_eq!(disk.read_all(&path, 100).unwrap().unwrap(), b"");
    }

    #[test]
    fn power_cut_applies_one_operation_then_fails_everything() {
        let disk = SimDisk::new();
        let dir = Path::new("/p");
        disk.create_dir_all(dir).unwrap();
        let mut file = disk.create_new(&dir.join("a")).unwrap();
        disk.sync_dir(dir).unwrap();
        disk.cut_power_after(1);
        file.write_all_at(0, b"one").unwrap();
        assert!(file.sync_data().is_err(), "the cut operation reports failure");
        assert!(disk.power_is_cut());
        assert!(file.write_all_at(3, b"two").is_err());
        disk.crash(3);
        assert_eq!(disk.read_all(&dir.join("a"), 100).unwrap().unwrap(), b"one");
    }
}
