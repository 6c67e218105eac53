//! The data directory lock: one process at a time may own a data directory.
//!
//! `<data_dir>/.lock` is an empty file held with an exclusive advisory lock (`flock` on Unix,
//! through `std::fs::File::try_lock`) for as long as its owner runs. The server should take it
//! at start-up and keep the [`DataDirLock`] alive until it exits; offline tools that change
//! files (`cairn repair`) take it too, so they never run against a live server, and a server
//! never starts while a repair is in progress. The kernel drops the lock when the process
//! dies, so a crash never leaves a stale lock behind (the file itself may stay; only the lock
//! counts).
//!
//! This module calls `std::fs` directly instead of going through [`crate::io::Disk`]: a lock is
//! a property of a live process, not of the data, and the simulated disks have nothing to
//! model about it.

use crate::StorageError;
use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};

/// Name of the lock file inside a data directory.
pub const LOCK_FILE_NAME: &str = ".lock";

/// An exclusive lock on a data directory, held until dropped.
#[derive(Debug)]
pub struct DataDirLock {
    path: PathBuf,
    /// Holding the open file holds the lock; dropping it releases the lock.
    _file: File,
}

/// Why a lock could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("data directory {} is in use by another process (it holds {})", data_dir.display(), data_dir.join(LOCK_FILE_NAME).display())]
    InUse { data_dir: PathBuf },
    #[error(transparent)]
    Storage(#[from] StorageError),
}

impl DataDirLock {
    /// Take the exclusive lock of `data_dir` without waiting (the directory must exist; the lock
    /// file is created if missing). `Err(InUse)` if another process holds it.
    pub fn acquire(data_dir: &Path) -> Result<DataDirLock, LockError> {
        let path = data_dir.join(LOCK_FILE_NAME);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|source| StorageError::Io {
                path: path.clone(),
                source,
            })?;
        match file.try_lock() {
            Ok(()) => Ok(DataDirLock { path, _file: file }),
            Err(TryLockError::WouldBlock) => Err(LockError::InUse {
                data_dir: data_dir.to_path_buf(),
            }),
            Err(TryLockError::Error(source)) => Err(StorageError::Io { path, source }.into()),
        }
    }

    /// Whether another process holds the lock of `data_dir` right now. Read-only: a missing
    /// lock file means nobody holds it, and nothing is created.
    pub fn is_held(data_dir: &Path) -> Result<bool, StorageError> {
        let path = data_dir.join(LOCK_FILE_NAME);
        let file = match File::open(&path) {
            Ok(file) => file,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(source) => return Err(StorageError::Io { path, source }),
        };
        // A shared lock conflicts only with an exclusive one: it never disturbs another reader.
        match file.try_lock_shared() {
            Ok(()) => Ok(false),
            Err(TryLockError::WouldBlock) => Ok(true),
            Err(TryLockError::Error(source)) => Err(StorageError::Io { path, source }),
        }
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_holder_at_a_time_and_released_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!DataDirLock::is_held(dir.path()).unwrap());
        assert!(
            !dir.path().join(LOCK_FILE_NAME).exists(),
            "is_held creates nothing"
        );
        let lock = DataDirLock::acquire(dir.path()).unwrap();
        assert_eq!(lock.path(), dir.path().join(LOCK_FILE_NAME));
        // flock locks belong to the open file description, so a second open in the same process
        // conflicts just as another process would.
        assert!(matches!(
            DataDirLock::acquire(dir.path()),
            Err(LockError::InUse { .. })
        ));
        assert!(DataDirLock::is_held(dir.path()).unwrap());
        drop(lock);
        assert!(!DataDirLock::is_held(dir.path()).unwrap());
        DataDirLock::acquire(dir.path()).unwrap();
    }
}
