//! Whole-file atomic replace with a checksum: write `<name>.tmp`, fsync, rename over `<name>`,
//! fsync the directory. Reading verifies the checksum; a torn temp file is ignored.
//!
//! # Format (little-endian)
//!
//! | Off | Size | Field          | Fault it detects |
//! |-----|------|----------------|------------------|
//! | 0   | 4    | magic `"CRNA"` | not a Cairn atomic file (wrong file, zeros) |
//! | 4   | 4    | version = 1    | an incompatible format version |
//! | 8   | 8    | `length_bytes` | truncation or extension: the file is exactly 24 + length bytes |
//! | 16  | 8    | checksum       | bit flips, torn contents: XXH3-64 (seed 0) over bytes 0..16, then the contents |
//! | 24  | n    | contents       | |
//!
//! A crash before the rename leaves the old file intact (the torn `.tmp` is removed on the next
//! read); a crash after it leaves the new one. So a reader sees the last whole write, and any
//! verification failure of the file itself is damage, never a torn write. The exception is a
//! file written with [`write_unsynced_on`] (no barrier, for files whose loss is harmless): a
//! power loss may leave it torn, and its reader takes a file that fails verification as none.

use crate::StorageError;
use crate::io::{Disk, RealDisk, parent_dir};
use std::path::{Path, PathBuf};
use xxhash_rust::xxh3::Xxh3;

pub const ATOMIC_FILE_MAGIC: u32 = u32::from_le_bytes(*b"CRNA");
pub const ATOMIC_FILE_VERSION: u32 = 1;
pub const ATOMIC_FILE_HEADER_SIZE: usize = 24;
/// Plausibility ceiling on contents (metadata files are small); larger files are not read.
pub const ATOMIC_FILE_CONTENTS_BYTES_MAX: u64 = 64 * 1024 * 1024;

/// The staging file next to `path`.
pub fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".tmp");
    PathBuf::from(name)
}

/// Atomically replace `path` with `contents` (framed with a magic, length and XXH3 checksum).
pub fn write(path: &Path, contents: &[u8]) -> Result<(), StorageError> {
    write_on(&RealDisk, path, contents)
}

/// Read and verify a file written by [`write()`]. `Ok(None)` if it does not exist;
/// `Err(Damaged)` if it exists but fails verification.
pub fn read(path: &Path) -> Result<Option<Vec<u8>>, StorageError> {
    read_on(&RealDisk, path)
}

/// Replace `path` with `contents`, framed as [`write_on`] frames them, with no barrier: the
/// staging file is written and renamed over `path`, nothing synced. For a file whose loss is
/// harmless (an index a reader can do without, such as a segment summary): after a crash
/// `path` may hold the old contents, the new ones, or contents that fail verification, which
/// a reader takes as no file. Never for a file whose loss would lose anything.
pub fn write_unsynced_on(disk: &dyn Disk, path: &Path, contents: &[u8]) -> Result<(), StorageError> {
    check_size(contents)?;
    let framed = frame(contents);
    let tmp = tmp_path(path);
    disk.remove_file(&tmp)?;
    let mut file = disk.create_new(&tmp)?;
    file.write_all_at(0, &framed)?;
    drop(file);
    disk.rename(&tmp, path)
}

/// [`write()`] through `disk`.
pub fn write_on(disk: &dyn Disk, path: &Path, contents: &[u8]) -> Result<(), StorageError> {
    check_size(contents)?;
    let framed = frame(contents);
    debug_assert_eq!(unframe(&framed), Ok(contents));
    let tmp = tmp_path(path);
    disk.write_synced(&tmp, &framed)?;
    disk.rename(&tmp, path)?;
    disk.sync_dir(parent_dir(path))
}

/// [`read`] through `disk`. Removes a stale `<path>.tmp` (left by a write that crashed before
/// its rename), so call it when no [`write()`] of the same path is in flight (at load time).
pub fn read_on(disk: &dyn Disk, path: &Path) -> Result<Option<Vec<u8>>, StorageError> {
    disk.remove_file(&tmp_path(path))?;
    read_verified_on(disk, path)
}

/// Read and verify `path` without touching anything else (a stale `<path>.tmp` is ignored and
/// left in place), for read-only phases such as recovery planning.
pub fn read_verified_on(disk: &dyn Disk, path: &Path) -> Result<Option<Vec<u8>>, StorageError> {
    let len_bytes_max = ATOMIC_FILE_HEADER_SIZE as u64 + ATOMIC_FILE_CONTENTS_BYTES_MAX;
    let Some(bytes) = disk.read_all(path, len_bytes_max)? else {
        return Ok(None);
    };
    match unframe(&bytes) {
        Ok(contents) => Ok(Some(contents.to_vec())),
        Err((position, reason)) => Err(StorageError::Damaged {
            path: path.to_path_buf(),
            position,
            reason,
        }),
    }
}

/// Contents larger than a reader would read are refused before anything is written.
fn check_size(contents: &[u8]) -> Result<(), StorageError> {
    if contents.len() as u64 > ATOMIC_FILE_CONTENTS_BYTES_MAX {
        return Err(StorageError::Invalid(format!(
            "atomic file contents of {} bytes exceed {ATOMIC_FILE_CONTENTS_BYTES_MAX}",
            contents.len()
        )));
    }
    Ok(())
}

fn frame(contents: &[u8]) -> Vec<u8> {
    let mut framed = Vec::with_capacity(ATOMIC_FILE_HEADER_SIZE + contents.len());
    framed.extend_from_slice(&ATOMIC_FILE_MAGIC.to_le_bytes());
    framed.extend_from_slice(&ATOMIC_FILE_VERSION.to_le_bytes());
    framed.extend_from_slice(&(contents.len() as u64).to_le_bytes());
    let checksum = checksum(&framed, contents);
    framed.extend_from_slice(&checksum.to_le_bytes());
    framed.extend_from_slice(contents);
    framed
}

fn checksum(header_prefix: &[u8], contents: &[u8]) -> u64 {
    debug_assert_eq!(header_prefix.len(), 16);
    let mut hasher = Xxh3::new();
    hasher.update(header_prefix);
    hasher.update(contents);
    hasher.digest()
}

/// The verified contents, or the byte position and reason of the first failure.
fn unframe(bytes: &[u8]) -> Result<&[u8], (u64, String)> {
    let Some(header) = bytes.get(..ATOMIC_FILE_HEADER_SIZE) else {
        return Err((
            0,
            format!("file of {} bytes is shorter than its header", bytes.len()),
        ));
    };
    let field = |at: usize, width: usize| -> u64 {
        let mut raw = [0u8; 8];
        raw[..width].copy_from_slice(&header[at..at + width]);
        u64::from_le_bytes(raw)
    };
    if field(0, 4) != u64::from(ATOMIC_FILE_MAGIC) {
        return Err((0, "bad magic".into()));
    }
    if field(4, 4) != u64::from(ATOMIC_FILE_VERSION) {
        return Err((4, format!("unknown version {}", field(4, 4))));
    }
    let length_bytes = field(8, 8);
    let actual_bytes = (bytes.len() - ATOMIC_FILE_HEADER_SIZE) as u64;
    if length_bytes != actual_bytes {
        return Err((
            8,
            format!("header says {length_bytes} content bytes, file holds {actual_bytes}"),
        ));
    }
    let contents = &bytes[ATOMIC_FILE_HEADER_SIZE..];
    if checksum(&header[..16], contents) != field(16, 8) {
        return Err((16, "checksum mismatch".into()));
    }
    Ok(contents)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_replace() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta");
        assert_eq!(read(&path).unwrap(), None);
        write(&path, b"first").unwrap();
        assert_eq!(read(&path).unwrap().as_deref(), Some(&b"first"[..]));
        write(&path, b"").unwrap();
        assert_eq!(read(&path).unwrap().as_deref(), Some(&b""[..]));
        write(&path, &vec![7u8; 100_000]).unwrap();
        assert_eq!(read(&path).unwrap(), Some(vec![7u8; 100_000]));
        assert!(!tmp_path(&path).exists());
    }

    #[test]
    fn stale_tmp_is_ignored_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta");
        write(&path, b"good").unwrap();
        std::fs::write(tmp_path(&path), b"torn half-writ").unwrap();
        assert_eq!(read(&path).unwrap().as_deref(), Some(&b"good"[..]));
        assert!(!tmp_path(&path).exists());
        // A tmp without its target: a first write that crashed before its rename.
        let other = dir.path().join("other");
        std::fs::write(tmp_path(&other), b"x").unwrap();
        assert_eq!(read(&other).unwrap(), None);
        assert!(!tmp_path(&other).exists());
    }

    #[test]
    fn every_corruption_is_damage() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta");
        write(&path, b"some metadata").unwrap();
        let good = std::fs::read(&path).unwrap();
        for position in 0..good.len() {
            let mut bad = good.clone();
            bad[position] ^= 0x01;
            std::fs::write(&path, &bad).unwrap();
            assert!(
                matches!(read(&path), Err(StorageError::Damaged { .. })),
                "flip at {position}"
            );
            assert_eq!(std::fs::read(&path).unwrap(), bad, "a damaged file is left as is");
        }
        for cut in 0..good.len() {
            std::fs::write(&path, &good[..cut]).unwrap();
            assert!(
                matches!(read(&path), Err(StorageError::Damaged { .. })),
                "cut at {cut}"
            );
        }
        let mut longer = good.clone();
        longer.push(0);
        std::fs::write(&path, &longer).unwrap();
        assert!(matches!(read(&path), Err(StorageError::Damaged { .. })));
    }
}
