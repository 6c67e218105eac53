//! The one door to the filesystem.
//!
//! Every file operation of the storage engine (segment logs, indexes, atomic metadata files)
//! goes through the [`Disk`] trait, so a test or simulator can substitute a disk that loses
//! unsynced writes, tears the last one, or fails a barrier. [`RealDisk`] is the production
//! implementation over `std::fs`.
//!
//! The trait is deliberately small and positional: writers say where bytes go
//! (`write_all_at`) instead of relying on a shared file cursor, so a failed write can be
//! retried or cut back at a known position.
//!
//! Errors carry the path they happened on ([`StorageError::Io`]).

use crate::StorageError;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Filesystem operations the engine needs. Implementations must be usable from any thread.
pub trait Disk: Send + Sync + fmt::Debug {
    /// Create `dir` and its missing parents.
    fn create_dir_all(&self, dir: &Path) -> Result<(), StorageError>;
    /// The names of the entries of `dir` (names that are not UTF-8 are skipped).
    fn list_dir(&self, dir: &Path) -> Result<Vec<String>, StorageError>;
    /// The length of the file at `path`, or `None` if it does not exist.
    fn file_len(&self, path: &Path) -> Result<Option<u64>, StorageError>;
    /// The whole file, or `None` if it does not exist. A file longer than `len_bytes_max` is
    /// refused with `Damaged` before anything is read (the caller's plausibility bound).
    fn read_all(&self, path: &Path, len_bytes_max: u64) -> Result<Option<Vec<u8>>, StorageError>;
    /// Open an existing file for positional reads.
    fn open_read(&self, path: &Path) -> Result<Box<dyn ReadFile>, StorageError>;
    /// Create a new, empty file for positional writes; fails if it exists.
    fn create_new(&self, path: &Path) -> Result<Box<dyn WriteFile>, StorageError>;
    /// Open an existing file for positional writes.
    fn open_write(&self, path: &Path) -> Result<Box<dyn WriteFile>, StorageError>;
    /// Create or replace `path` with `bytes` and make its contents stable (fsync).
    fn write_synced(&self, path: &Path, bytes: &[u8]) -> Result<(), StorageError>;
    /// Rename `from` over `to` (atomic within a directory).
    fn rename(&self, from: &Path, to: &Path) -> Result<(), StorageError>;
    /// Remove a file. Returns whether it existed.
    fn remove_file(&self, path: &Path) -> Result<bool, StorageError>;
    /// Make the directory's entries (creations, renames, removals) stable.
    fn sync_dir(&self, dir: &Path) -> Result<(), StorageError>;
    /// Remove an empty directory (its parent's `sync_dir` makes that stable). Returns whether
    /// it existed; a directory that still holds entries is an error.
    fn remove_dir(&self, dir: &Path) -> Result<bool, StorageError>;
}

/// A file open for positional reads.
pub trait ReadFile: Send + Sync + fmt::Debug {
    /// Fill `buf` from `position_bytes`; an early end of file is an error.
    fn read_exact_at(&self, position_bytes: u64, buf: &mut [u8]) -> Result<(), StorageError>;

    /// The OS file behind this handle, if it is one (for `sendfile` of verified bytes). The
    /// default, for simulated files, is `None`.
    fn as_file(&self) -> Option<&File> {
        None
    }

    /// Read `len` bytes from `position_bytes` into `out[at..at + len]`, leaving
    /// `out.len() == at + len` (requires `at <= out.len()`; bytes of `out` from `at` on are
    /// overwritten). Unlike [`ReadFile::read_exact_at`] the caller need not zero the room
    /// first (polls read megabytes straight into the reply buffer). On error `out` is
    /// truncated to `at`.
    fn read_exact_at_into(
        &self,
        position_bytes: u64,
        len: usize,
        out: &mut Vec<u8>,
        at: usize,
    ) -> Result<(), StorageError> {
        out.truncate(at);
        out.resize(at + len, 0);
        let read = self.read_exact_at(position_bytes, &mut out[at..]);
        if read.is_err() {
            out.truncate(at);
        }
        read
    }
}

/// A file open for positional writes.
pub trait WriteFile: Send + Sync + fmt::Debug {
    /// Write all of `bytes` at `position_bytes` (a single logical write).
    fn write_all_at(&mut self, position_bytes: u64, bytes: &[u8]) -> Result<(), StorageError>;
    /// Start writing `len_bytes` from `position_bytes` to the device without waiting
    /// (`sync_file_range(SYNC_FILE_RANGE_WRITE)`). A pacing aid: it makes nothing durable (no
    /// metadata, no cache flush). The default does nothing.
    fn start_writeback(&mut self, _position_bytes: u64, _len_bytes: u64) -> Result<(), StorageError> {
        Ok(())
    }

    /// Wait for writeback already in flight in the range to finish
    /// (`sync_file_range(SYNC_FILE_RANGE_WAIT_BEFORE)`). An error is a failed write of data
    /// handed to the OS, exactly as from `sync_data`, and must be treated as one: Linux
    /// reports a writeback error once per open file, so after this call returns it the next
    /// `sync_data` may succeed although the data is gone. The default does nothing.
    fn wait_writeback(&mut self, _position_bytes: u64, _len_bytes: u64) -> Result<(), StorageError> {
        Ok(())
    }

    /// Tell the OS that the cached pages of the range will not be read soon
    /// (`posix_fadvise(POSIX_FADV_DONTNEED)`): clean pages are dropped from the page cache,
    /// dirty ones are left. Advice only: it changes no byte of the file, and a failure
    /// changes nothing either, so there is nothing to report. The default does nothing.
    fn release_cache(&mut self, _position_bytes: u64, _len_bytes: u64) {}

    /// Write `parts` back to back from `position_bytes`, as if concatenated. The default
    /// writes them one by one; the real file uses one vectored write (`pwritev`).
    fn write_all_vectored_at(&mut self, position_bytes: u64, parts: &[&[u8]]) -> Result<(), StorageError> {
        let mut position = position_bytes;
        for part in parts {
            self.write_all_at(position, part)?;
            position += part.len() as u64;
        }
        Ok(())
    }
    /// Truncate or extend to `len_bytes`.
    fn set_len(&mut self, len_bytes: u64) -> Result<(), StorageError>;
    /// Make the written data stable (fdatasync). A failure is final for what it covered: the
    /// caller must not retry on the same descriptor and then treat the data as stable.
    fn sync_data(&mut self) -> Result<(), StorageError>;
}

/// [`Disk`] over `std::fs`.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealDisk;

fn io_error(path: &Path, source: std::io::Error) -> StorageError {
    StorageError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl Disk for RealDisk {
    fn remove_dir(&self, dir: &Path) -> Result<bool, StorageError> {
        match fs::remove_dir(dir) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io_error(dir, e)),
        }
    }

    fn create_dir_all(&self, dir: &Path) -> Result<(), StorageError> {
        fs::create_dir_all(dir).map_err(|e| io_error(dir, e))
    }

    fn list_dir(&self, dir: &Path) -> Result<Vec<String>, StorageError> {
        let mut names = Vec::new();
        for entry in fs::read_dir(dir).map_err(|e| io_error(dir, e))? {
            let entry = entry.map_err(|e| io_error(dir, e))?;
            if let Ok(name) = entry.file_name().into_string() {
                names.push(name);
            }
        }
        // Directory order is filesystem-defined; sort so every caller sees one order.
        names.sort();
        Ok(names)
    }

    fn file_len(&self, path: &Path) -> Result<Option<u64>, StorageError> {
        match fs::metadata(path) {
            Ok(metadata) => Ok(Some(metadata.len())),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_error(path, e)),
        }
    }

    fn read_all(&self, path: &Path, len_bytes_max: u64) -> Result<Option<Vec<u8>>, StorageError> {
        let file = match File::open(path) {
            Ok(file) => file,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_error(path, e)),
        };
        let len_bytes = file.metadata().map_err(|e| io_error(path, e))?.len();
        if len_bytes > len_bytes_max {
            return Err(StorageError::Damaged {
                path: path.to_path_buf(),
                position: len_bytes_max,
                reason: format!("file of {len_bytes} bytes exceeds the plausible maximum of {len_bytes_max}"),
            });
        }
        let len = usize::try_from(len_bytes).map_err(|_| StorageError::Invalid("file too large".into()))?;
        let mut bytes = vec![0u8; len];
        file.read_exact_at(&mut bytes, 0).map_err(|e| io_error(path, e))?;
        Ok(Some(bytes))
    }

    fn open_read(&self, path: &Path) -> Result<Box<dyn ReadFile>, StorageError> {
        let file = File::open(path).map_err(|e| io_error(path, e))?;
        Ok(Box::new(RealFile {
            path: path.to_path_buf(),
            file,
        }))
    }

    fn create_new(&self, path: &Path) -> Result<Box<dyn WriteFile>, StorageError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path);
        let file = file.map_err(|e| io_error(path, e))?;
        Ok(Box::new(RealFile {
            path: path.to_path_buf(),
            file,
        }))
    }

    fn open_write(&self, path: &Path) -> Result<Box<dyn WriteFile>, StorageError> {
        let file = OpenOptions::new().read(true).write(true).open(path);
        let file = file.map_err(|e| io_error(path, e))?;
        Ok(Box::new(RealFile {
            path: path.to_path_buf(),
            file,
        }))
    }

    fn write_synced(&self, path: &Path, bytes: &[u8]) -> Result<(), StorageError> {
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .map_err(|e| io_error(path, e))?;
        file.write_all(bytes).map_err(|e| io_error(path, e))?;
        file.sync_all().map_err(|e| io_error(path, e))
    }

    fn rename(&self, from: &Path, to: &Path) -> Result<(), StorageError> {
        fs::rename(from, to).map_err(|e| io_error(from, e))
    }

    fn remove_file(&self, path: &Path) -> Result<bool, StorageError> {
        match fs::remove_file(path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io_error(path, e)),
        }
    }

    fn sync_dir(&self, dir: &Path) -> Result<(), StorageError> {
        let handle = File::open(dir).map_err(|e| io_error(dir, e))?;
        handle.sync_all().map_err(|e| io_error(dir, e))
    }
}

#[derive(Debug)]
struct RealFile {
    path: PathBuf,
    file: File,
}

impl ReadFile for RealFile {
    fn read_exact_at(&self, position_bytes: u64, buf: &mut [u8]) -> Result<(), StorageError> {
        self.file
            .read_exact_at(buf, position_bytes)
            .map_err(|e| io_error(&self.path, e))
    }

    fn as_file(&self) -> Option<&File> {
        Some(&self.file)
    }

    fn read_exact_at_into(
        &self,
        position_bytes: u64,
        len: usize,
        out: &mut Vec<u8>,
        at: usize,
    ) -> Result<(), StorageError> {
        use std::os::fd::AsRawFd;
        assert!(at <= out.len(), "read_exact_at_into past the end of the buffer");
        out.truncate(at);
        out.reserve(len);
        let mut done = 0;
        while done < len {
            let position = position_bytes
                .checked_add(done as u64)
                .and_then(|position| libc::off_t::try_from(position).ok())
                .ok_or_else(|| io_error(&self.path, std::io::Error::from(ErrorKind::InvalidInput)))?;
            let room = &mut out.spare_capacity_mut()[done..len];
            // SAFETY: `pread` writes at most `room.len()` bytes through a pointer to memory this
            // Vec owns (its spare capacity, reserved above); no reference to those bytes as
            // initialized `u8` exists until `set_len` below, after the kernel filled them.
            let read = unsafe {
                libc::pread(
                    self.file.as_raw_fd(),
                    room.as_mut_ptr().cast(),
                    room.len(),
                    position,
                )
            };
            match read {
                n if n > 0 => done += n as usize,
                0 => {
                    return Err(io_error(
                        &self.path,
                        std::io::Error::new(ErrorKind::UnexpectedEof, "failed to fill whole buffer"),
                    ));
                }
                _ => {
                    let error = std::io::Error::last_os_error();
                    if error.kind() != ErrorKind::Interrupted {
                        return Err(io_error(&self.path, error));
                    }
                }
            }
        }
        // SAFETY: bytes `at..at + len` were written by `pread` above (`done == len`), and the
        // capacity covers them.
        unsafe { out.set_len(at + len) };
        Ok(())
    }
}

impl WriteFile for RealFile {
    fn write_all_at(&mut self, position_bytes: u64, bytes: &[u8]) -> Result<(), StorageError> {
        self.file
            .write_all_at(bytes, position_bytes)
            .map_err(|e| io_error(&self.path, e))
    }

    fn write_all_vectored_at(&mut self, position_bytes: u64, parts: &[&[u8]]) -> Result<(), StorageError> {
        write_all_vectored_at(&self.file, position_bytes, parts).map_err(|e| io_error(&self.path, e))
    }

    fn set_len(&mut self, len_bytes: u64) -> Result<(), StorageError> {
        self.file.set_len(len_bytes).map_err(|e| io_error(&self.path, e))
    }

    fn start_writeback(&mut self, position_bytes: u64, len_bytes: u64) -> Result<(), StorageError> {
        sync_file_range(&self.file, position_bytes, len_bytes, libc::SYNC_FILE_RANGE_WRITE)
            .map_err(|e| io_error(&self.path, e))
    }

    fn wait_writeback(&mut self, position_bytes: u64, len_bytes: u64) -> Result<(), StorageError> {
        sync_file_range(
            &self.file,
            position_bytes,
            len_bytes,
            libc::SYNC_FILE_RANGE_WAIT_BEFORE,
        )
        .map_err(|e| io_error(&self.path, e))
    }

    fn release_cache(&mut self, position_bytes: u64, len_bytes: u64) {
        release_cached_range(&self.file, position_bytes, len_bytes);
    }

    fn sync_data(&mut self) -> Result<(), StorageError> {
        self.file.sync_data().map_err(|e| io_error(&self.path, e))
    }
}

/// The directory holding `path` (`.` for a bare file name), for directory syncs.
pub fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    }
}

/// `posix_fadvise(POSIX_FADV_DONTNEED)` on the range (see [`WriteFile::release_cache`]);
/// public so that the bench's ceilings release the page cache as the journal does.
pub fn release_cached_range(file: &File, position_bytes: u64, len_bytes: u64) {
    use std::os::fd::AsRawFd;
    let (Ok(offset), Ok(len)) = (
        libc::off_t::try_from(position_bytes),
        libc::off_t::try_from(len_bytes),
    ) else {
        return;
    };
    // SAFETY: a plain syscall on a descriptor owned by `file`; no memory is passed. Its
    // result is advice taken or not, never a change to the file's bytes.
    let _ = unsafe { libc::posix_fadvise(file.as_raw_fd(), offset, len, libc::POSIX_FADV_DONTNEED) };
}

/// One `sync_file_range` call on the range.
fn sync_file_range(
    file: &File,
    position_bytes: u64,
    len_bytes: u64,
    flags: libc::c_uint,
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let out_of_range = || std::io::Error::new(std::io::ErrorKind::InvalidInput, "range beyond off64_t");
    let offset = libc::off64_t::try_from(position_bytes).map_err(|_| out_of_range())?;
    let len = libc::off64_t::try_from(len_bytes).map_err(|_| out_of_range())?;
    // SAFETY: a plain syscall on a descriptor owned by `file`; no memory is passed.
    let rc = unsafe { libc::sync_file_range(file.as_raw_fd(), offset, len, flags) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `pwritev` until every byte of `parts` is written from `position_bytes` on (a short write
/// continues where it stopped; EINTR retries).
fn write_all_vectored_at(file: &File, position_bytes: u64, parts: &[&[u8]]) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    /// Well under every platform's IOV_MAX (1024 on Linux).
    const IOVECS_MAX: usize = 64;
    let mut parts: Vec<&[u8]> = parts.iter().copied().filter(|part| !part.is_empty()).collect();
    let mut position = position_bytes;
    let mut first = 0usize;
    while first < parts.len() {
        let batch = &parts[first..parts.len().min(first + IOVECS_MAX)];
        let iovecs: Vec<libc::iovec> = batch
            .iter()
            .map(|part| libc::iovec {
                iov_base: part.as_ptr() as *mut libc::c_void,
                iov_len: part.len(),
            })
            .collect();
        let offset = libc::off_t::try_from(position).map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "file position beyond off_t")
        })?;
        // SAFETY: every iovec points into a live borrowed slice of its stated length, the
        // count is at most IOVECS_MAX, and the descriptor is owned by `file`.
        let written = unsafe {
            libc::pwritev(
                file.as_raw_fd(),
                iovecs.as_ptr(),
                iovecs.len() as libc::c_int,
                offset,
            )
        };
        if written < 0 {
            let error = std::io::Error::last_os_error();
            if error.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        if written == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::WriteZero,
                "pwritev wrote nothing",
            ));
        }
        let mut written = written as usize;
        position += written as u64;
        // Drop the parts written whole, trim the one written in part.
        while written > 0 && first < parts.len() {
            let part = parts[first];
            if written >= part.len() {
                written -= part.len();
                first += 1;
            } else {
                parts[first] = &part[written..];
                written = 0;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectored_write_lands_parts_back_to_back_at_the_position() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let disk = RealDisk;
        let mut file = disk.create_new(&path).unwrap();
        file.write_all_at(0, b"0123456789").unwrap();
        // More parts than one pwritev takes, empty parts among them.
        let parts_owned: Vec<Vec<u8>> = (0..150u32)
            .map(|i| {
                if i % 7 == 0 {
                    Vec::new()
                } else {
                    vec![(i % 251) as u8; (i % 5) as usize + 1]
                }
            })
            .collect();
        let parts: Vec<&[u8]> = parts_owned.iter().map(|part| part.as_slice()).collect();
        file.write_all_vectored_at(4, &parts).unwrap();
        let expected: Vec<u8> = b"0123".iter().copied().chain(parts.concat()).collect();
        let read = disk.read_all(&path, 1 << 20).unwrap().unwrap();
        assert_eq!(read, expected);
    }
}
