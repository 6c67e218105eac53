//! Helpers shared by the crate's unit tests.

use cairn_storage::StorageError;
use cairn_storage::io::{Disk, ReadFile, RealDisk, WriteFile};
use cairn_wire::batch::{self, BATCH_HEADER_SIZE, BatchLimits, FRAME_HEADER_SIZE};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// A valid client batch (what `batch::validate` accepts) of `count` messages of
/// `payload_bytes` bytes each; message `i`'s payload bytes are all `fill + i`.
pub fn client_batch(count: u32, payload_bytes: usize, fill: u8) -> Vec<u8> {
    client_batch_from(1, count, payload_bytes, fill)
}

/// [`client_batch`] with message ids from `first_id` up.
pub fn client_batch_from(first_id: u128, count: u32, payload_bytes: usize, fill: u8) -> Vec<u8> {
    let frame_bytes = FRAME_HEADER_SIZE + payload_bytes;
    let length = BATCH_HEADER_SIZE + frame_bytes * count as usize;
    let mut batch = vec![0u8; length];
    batch[32..40].copy_from_slice(&(length as u64).to_le_bytes());
    batch[48..52].copy_from_slice(&count.to_le_bytes());
    for index in 0..count {
        let start = BATCH_HEADER_SIZE + frame_bytes * index as usize;
        let frame = &mut batch[start..start + frame_bytes];
        frame[8..24].copy_from_slice(&(first_id + u128::from(index)).to_le_bytes());
        frame[24..28].copy_from_slice(&index.to_le_bytes());
        frame[36..40].copy_from_slice(&(payload_bytes as u32).to_le_bytes());
        frame[FRAME_HEADER_SIZE..].fill(fill.wrapping_add(index as u8));
        let checksum = xxhash_rust::xxh3::xxh3_64(&frame[8..]);
        frame[0..8].copy_from_slice(&checksum.to_le_bytes());
    }
    let checksum = batch::compute_checksum(&batch);
    batch[40..48].copy_from_slice(&checksum.to_le_bytes());
    let limits = BatchLimits {
        message_payload_bytes_max: 1 << 20,
        user_headers_bytes_max: 0,
        batch_bytes_max: 1 << 24,
        batch_messages_max: 1000,
    };
    assert!(batch::validate(&batch, count, &limits).is_ok());
    batch
}

/// Fault model: after `log_writes_before_failing` more writes to a `.log` succeed, the next
/// `log_writes_to_fail` fail with ENOSPC after writing half their bytes (a partial write, as
/// a full disk may leave), and while `syncs_fail` is set every fdatasync fails with EIO.
/// Everything else goes to the real filesystem.
#[derive(Debug, Default)]
pub struct Faults {
    pub log_writes_before_failing: AtomicU64,
    pub log_writes_to_fail: AtomicU64,
    pub syncs_fail: AtomicBool,
}

/// "The disk is full until further notice."
pub const DISK_FULL: u64 = u64::MAX;

#[derive(Debug)]
pub struct FaultyDisk {
    pub faults: Arc<Faults>,
}

#[derive(Debug)]
struct FaultyFile {
    inner: Box<dyn WriteFile>,
    is_log: bool,
    faults: Arc<Faults>,
}

impl FaultyDisk {
    fn wrap(&self, path: &Path, inner: Box<dyn WriteFile>) -> Box<dyn WriteFile> {
        Box::new(FaultyFile {
            inner,
            is_log: path.extension().is_some_and(|ext| ext == "log"),
            faults: self.faults.clone(),
        })
    }
}

impl Disk for FaultyDisk {
    fn create_dir_all(&self, dir: &Path) -> Result<(), StorageError> {
        RealDisk.create_dir_all(dir)
    }
    fn list_dir(&self, dir: &Path) -> Result<Vec<String>, StorageError> {
        RealDisk.list_dir(dir)
    }
    fn file_len(&self, path: &Path) -> Result<Option<u64>, StorageError> {
        RealDisk.file_len(path)
    }
    fn read_all(&self, path: &Path, len_bytes_max: u64) -> Result<Option<Vec<u8>>, StorageError> {
        RealDisk.read_all(path, len_bytes_max)
    }
    fn open_read(&self, path: &Path) -> Result<Box<dyn ReadFile>, StorageError> {
        RealDisk.open_read(path)
    }
    fn create_new(&self, path: &Path) -> Result<Box<dyn WriteFile>, StorageError> {
        Ok(self.wrap(path, RealDisk.create_new(path)?))
    }
    fn open_write(&self, path: &Path) -> Result<Box<dyn WriteFile>, StorageError> {
        Ok(self.wrap(path, RealDisk.open_write(path)?))
    }
    fn write_synced(&self, path: &Path, bytes: &[u8]) -> Result<(), StorageError> {
        RealDisk.write_synced(path, bytes)
    }
    fn rename(&self, from: &Path, to: &Path) -> Result<(), StorageError> {
        RealDisk.rename(from, to)
    }
    fn remove_file(&self, path: &Path) -> Result<bool, StorageError> {
        RealDisk.remove_file(path)
    }
    fn sync_dir(&self, dir: &Path) -> Result<(), StorageError> {
        RealDisk.sync_dir(dir)
    }
    fn remove_dir(&self, dir: &Path) -> Result<bool, StorageError> {
        RealDisk.remove_dir(dir)
    }
}

impl WriteFile for FaultyFile {
    /// One logical write (as the real file's single `pwritev`), counted once.
    fn write_all_vectored_at(&mut self, position_bytes: u64, parts: &[&[u8]]) -> Result<(), StorageError> {
        self.write_all_at(position_bytes, &parts.concat())
    }

    fn write_all_at(&mut self, position_bytes: u64, bytes: &[u8]) -> Result<(), StorageError> {
        let spared = self.is_log
            && self
                .faults
                .log_writes_before_failing
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| left.checked_sub(1))
                .is_ok();
        let fail = self.is_log
            && !spared
            && self
                .faults
                .log_writes_to_fail
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| left.checked_sub(1))
                .is_ok();
        if fail {
            self.inner
                .write_all_at(position_bytes, &bytes[..bytes.len() / 2])?;
            return Err(StorageError::Io {
                path: PathBuf::from("faulty.log"),
                source: std::io::Error::from_raw_os_error(28), // ENOSPC
            });
        }
        self.inner.write_all_at(position_bytes, bytes)
    }
    fn set_len(&mut self, len_bytes: u64) -> Result<(), StorageError> {
        self.inner.set_len(len_bytes)
    }
    fn sync_data(&mut self) -> Result<(), StorageError> {
        if self.faults.syncs_fail.load(Ordering::Relaxed) {
            return Err(StorageError::Io {
                path: PathBuf::from("faulty"),
                source: std::io::Error::from_raw_os_error(5), // EIO
            });
        }
        self.inner.sync_data()
    }
}
