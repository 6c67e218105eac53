//! Whole-file atomic replace with a checksum: write `<name>.tmp`, fsync, rename over `<name>`,
//! fsync the directory. Reading verifies the checksum; a torn temp file is ignored.

use crate::StorageError;
use std::path::Path;

/// Atomically replace `path` with `contents` (framed with a magic, length and XXH3 checksum).
pub fn write(path: &Path, contents: &[u8]) -> Result<(), StorageError> {
    let _ = (path, contents);
    todo!()
}

/// Read and verify a file written by [`write`]. `Ok(None)` if it does not exist;
/// `Err(Damaged)` if it exists but fails verification.
pub fn read(path: &Path) -> Result<Option<Vec<u8>>, StorageError> {
    let _ = path;
    todo!()
}
