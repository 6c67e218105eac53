//! Stored consumer offsets of one partition, one small checksummed file per consumer.
//!
//! Layout: `<dir>/consumer-<id>`, `<dir>/consumer-name-<xxh3-128 of the name>` and
//! `<dir>/group-<id>` (decimal ids), each an [`atomic_file`] whose contents are the offset as a
//! little-endian u64, followed for a named consumer by the name's bytes.
//! One file per owner keeps a store to one small atomic replace; a torn store leaves the
//! previous value (the staging file is discarded at load), damage refuses the load.

use crate::StorageError;
use crate::atomic_file::{self, tmp_path};
use crate::io::{Disk, RealDisk};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Whose offset: a single consumer or a consumer group (their ids live in separate spaces).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OffsetOwner {
    Consumer(ConsumerKey),
    Group(u32),
}

/// A single consumer is named by a numeric id or by a string name (the SDK's high-level
/// consumer uses names). The two are separate spaces: consumer 5 and consumer "5" differ.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ConsumerKey {
    Id(u32),
    /// 1..=255 bytes of UTF-8 (the wire bounds it).
    Name(String),
}

/// File-name prefix of a named consumer; the rest is the 32-hex-digit XXH3-128 of the name.
/// Names are not used in file names directly: they may hold `/` and be longer than a file
/// name may be. The name itself is stored after the offset and checked against the hash.
const NAMED_CONSUMER_PREFIX: &str = "consumer-name-";

fn name_hash(name: &str) -> String {
    format!("{:032x}", xxhash_rust::xxh3::xxh3_128(name.as_bytes()))
}

impl OffsetOwner {
    /// The file name of this owner's offset.
    pub fn file_name(&self) -> String {
        match self {
            OffsetOwner::Consumer(ConsumerKey::Id(id)) => format!("consumer-{id}"),
            OffsetOwner::Consumer(ConsumerKey::Name(name)) => {
                format!("{NAMED_CONSUMER_PREFIX}{}", name_hash(name))
            }
            OffsetOwner::Group(id) => format!("group-{id}"),
        }
    }

    /// File contents: the offset (u64 LE), then for named consumers the name's bytes.
    fn encode(&self, offset: u64) -> Vec<u8> {
        let mut contents = offset.to_le_bytes().to_vec();
        if let OffsetOwner::Consumer(ConsumerKey::Name(name)) = self {
            contents.extend_from_slice(name.as_bytes());
        }
        contents
    }

    /// The owner and offset a file holds, checked against its file name. `None` for a name
    /// that is not an offset file; `Err(reason)` for contents that do not match the name.
    fn decode(file_name: &str, contents: &[u8]) -> Option<Result<(OffsetOwner, u64), String>> {
        let parse_id = |digits: &str| -> Option<u32> {
            // Only the canonical spelling, so one owner has exactly one file name.
            let id: u32 = digits.parse().ok()?;
            (id.to_string() == digits).then_some(id)
        };
        let owner_hint = if let Some(hash) = file_name.strip_prefix(NAMED_CONSUMER_PREFIX) {
            if hash.len() != 32
                || !hash
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
            {
                return None;
            }
            None
        } else if let Some(digits) = file_name.strip_prefix("consumer-") {
            Some(OffsetOwner::Consumer(ConsumerKey::Id(parse_id(digits)?)))
        } else if let Some(digits) = file_name.strip_prefix("group-") {
            Some(OffsetOwner::Group(parse_id(digits)?))
        } else {
            return None;
        };
        let Some((offset_bytes, rest)) = contents.split_first_chunk::<8>() else {
            return Some(Err(format!(
                "offset file holds {} bytes, expected at least 8",
                contents.len()
            )));
        };
        let offset = u64::from_le_bytes(*offset_bytes);
        Some(match owner_hint {
            Some(owner) if rest.is_empty() => Ok((owner, offset)),
            Some(_) => Err(format!("offset file holds {} bytes, expected 8", contents.len())),
            None => match std::str::from_utf8(rest) {
                Ok(name)
                    if !name.is_empty()
                        && OffsetOwner::Consumer(ConsumerKey::Name(name.to_string())).file_name()
                            == file_name =>
                {
                    Ok((OffsetOwner::Consumer(ConsumerKey::Name(name.to_string())), offset))
                }
                _ => Err("named consumer offset file does not match its name hash".to_string()),
            },
        })
    }

    /// Whether `file_name` names an offset file (staging suffix removed).
    fn is_offset_file(file_name: &str) -> bool {
        OffsetOwner::decode(file_name, &[0u8; 8]).is_some()
    }
}

/// What [`ConsumerOffsets::check_on`] found in an offsets directory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OffsetsCheck {
    /// The directory does not exist (open creates it; nothing is stored).
    pub dir_missing: bool,
    /// Offset files that verify.
    pub stored_count: usize,
    /// Staging files of interrupted stores; open removes them (the previous value stays).
    pub stale_staging: Vec<String>,
    /// `(file name, byte position, reason)` of offset files that fail verification: open
    /// refuses the partition.
    pub damaged: Vec<(String, u64, String)>,
    /// Files that are not offset files; open ignores them.
    pub unknown: Vec<String>,
}

#[derive(Debug)]
pub struct ConsumerOffsets {
    disk: Arc<dyn Disk>,
    dir: PathBuf,
    /// Invariant: exactly the owners with a file in `dir`, with the offsets those files hold.
    offsets: BTreeMap<OffsetOwner, u64>,
}

impl ConsumerOffsets {
    /// Load every stored offset under `dir` (created if missing).
    pub fn open(dir: &Path) -> Result<ConsumerOffsets, StorageError> {
        ConsumerOffsets::open_on(Arc::new(RealDisk), dir)
    }

    /// [`ConsumerOffsets::open`] on a given disk.
    pub fn open_on(disk: Arc<dyn Disk>, dir: &Path) -> Result<ConsumerOffsets, StorageError> {
        disk.create_dir_all(dir)?;
        let mut offsets = BTreeMap::new();
        for name in disk.list_dir(dir)? {
            // A staging file whose target never appeared: a first store that crashed before its
            // rename. Reading the target removes it.
            let owner_name = name.strip_suffix(".tmp").unwrap_or(&name);
            if !OffsetOwner::is_offset_file(owner_name) {
                tracing::warn!(dir = %dir.display(), %name, "ignoring unknown file among consumer offsets");
                continue;
            }
            let path = dir.join(owner_name);
            let Some(contents) = atomic_file::read_on(disk.as_ref(), &path)? else {
                continue;
            };
            match OffsetOwner::decode(owner_name, &contents) {
                Some(Ok((owner, offset))) => {
                    offsets.insert(owner, offset);
                }
                Some(Err(reason)) => {
                    return Err(StorageError::Damaged {
                        path,
                        position: 0,
                        reason,
                    });
                }
                None => {}
            }
        }
        Ok(ConsumerOffsets {
            disk,
            dir: dir.to_path_buf(),
            offsets,
        })
    }

    /// Verify every stored offset under `dir` without changing anything (no directory is
    /// created, no staging file removed): what [`ConsumerOffsets::open_on`] would load, clean
    /// up or refuse. `Err` only for IO failures; damage is reported in the result.
    pub fn check_on(disk: &dyn Disk, dir: &Path) -> Result<OffsetsCheck, StorageError> {
        let mut check = OffsetsCheck::default();
        if disk.file_len(dir)?.is_none() {
            check.dir_missing = true;
            return Ok(check);
        }
        // Each owner once, even when both its file and its staging file are listed.
        let mut owner_names = std::collections::BTreeSet::new();
        for name in disk.list_dir(dir)? {
            let owner_name = name.strip_suffix(".tmp").unwrap_or(&name);
            if !OffsetOwner::is_offset_file(owner_name) {
                check.unknown.push(name.clone());
                continue;
            }
            if owner_name != name {
                check.stale_staging.push(name.clone());
            }
            owner_names.insert(owner_name.to_string());
        }
        for owner_name in owner_names {
            let path = dir.join(&owner_name);
            let contents = match atomic_file::read_verified_on(disk, &path) {
                Ok(Some(contents)) => contents,
                // Only a staging file: a first store that crashed before its rename.
                Ok(None) => continue,
                Err(StorageError::Damaged { position, reason, .. }) => {
                    check.damaged.push((owner_name, position, reason));
                    continue;
                }
                Err(error) => return Err(error),
            };
            match OffsetOwner::decode(&owner_name, &contents) {
                Some(Ok(_)) => check.stored_count += 1,
                Some(Err(reason)) => check.damaged.push((owner_name, 0, reason)),
                None => {}
            }
        }
        Ok(check)
    }

    pub fn get(&self, owner: &OffsetOwner) -> Option<u64> {
        self.offsets.get(owner).copied()
    }

    /// Every stored offset, in owner order.
    pub fn iter(&self) -> impl Iterator<Item = (OffsetOwner, u64)> + '_ {
        self.offsets
            .iter()
            .map(|(owner, offset)| (owner.clone(), *offset))
    }

    /// Durably store (atomic replace).
    pub fn store(&mut self, owner: &OffsetOwner, offset: u64) -> Result<(), StorageError> {
        atomic_file::write_on(
            self.disk.as_ref(),
            &self.dir.join(owner.file_name()),
            &owner.encode(offset),
        )?;
        self.offsets.insert(owner.clone(), offset);
        Ok(())
    }

    /// Returns whether an offset was stored.
    pub fn delete(&mut self, owner: &OffsetOwner) -> Result<bool, StorageError> {
        let path = self.dir.join(owner.file_name());
        let existed = self.disk.remove_file(&path)?;
        self.disk.remove_file(&tmp_path(&path))?;
        self.disk.sync_dir(&self.dir)?;
        Ok(self.offsets.remove(owner).is_some() || existed)
    }

    /// Remove every stored offset (purge).
    pub fn clear(&mut self) -> Result<(), StorageError> {
        let owners: Vec<OffsetOwner> = self.offsets.keys().cloned().collect();
        for owner in owners {
            self.disk.remove_file(&self.dir.join(owner.file_name()))?;
            self.offsets.remove(&owner);
        }
        self.disk.sync_dir(&self.dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(id: u32) -> OffsetOwner {
        OffsetOwner::Consumer(ConsumerKey::Id(id))
    }

    #[test]
    fn store_get_delete_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("offsets");
        let mut offsets = ConsumerOffsets::open(&path).unwrap();
        assert_eq!(offsets.get(&c(1)), None);
        offsets.store(&c(1), 0).unwrap();
        offsets.store(&OffsetOwner::Group(1), 42).unwrap();
        offsets.store(&c(7), 5).unwrap();
        offsets.store(&c(7), 9).unwrap();
        assert_eq!(offsets.get(&c(1)), Some(0));
        assert_eq!(offsets.get(&OffsetOwner::Group(1)), Some(42));
        assert!(offsets.delete(&c(1)).unwrap());
        assert!(!offsets.delete(&c(1)).unwrap());
        drop(offsets);

        let mut offsets = ConsumerOffsets::open(&path).unwrap();
        assert_eq!(offsets.get(&c(1)), None);
        assert_eq!(offsets.get(&OffsetOwner::Group(1)), Some(42));
        assert_eq!(offsets.get(&c(7)), Some(9));
        assert_eq!(offsets.iter().count(), 2);
        offsets.clear().unwrap();
        assert_eq!(offsets.get(&OffsetOwner::Group(1)), None);
        drop(offsets);
        assert_eq!(ConsumerOffsets::open(&path).unwrap().iter().count(), 0);
    }

    #[test]
    fn torn_store_keeps_the_previous_value_and_damage_refuses() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("offsets");
        let mut offsets = ConsumerOffsets::open(&path).unwrap();
        offsets.store(&OffsetOwner::Group(3), 100).unwrap();
        drop(offsets);
        // A store that crashed before its rename (to an existing owner and to a new one).
        std::fs::write(path.join("group-3.tmp"), b"torn").unwrap();
        std::fs::write(path.join("consumer-8.tmp"), b"torn").unwrap();
        std::fs::write(path.join("notes.txt"), b"unrelated").unwrap();
        let offsets = ConsumerOffsets::open(&path).unwrap();
        assert_eq!(offsets.get(&OffsetOwner::Group(3)), Some(100));
        assert_eq!(offsets.get(&c(8)), None);
        assert!(!path.join("group-3.tmp").exists());
        assert!(!path.join("consumer-8.tmp").exists());
        drop(offsets);

        let file = path.join("group-3");
        let mut bytes = std::fs::read(&file).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x80;
        std::fs::write(&file, &bytes).unwrap();
        assert!(matches!(
            ConsumerOffsets::open(&path),
            Err(StorageError::Damaged { .. })
        ));
        assert_eq!(std::fs::read(&file).unwrap(), bytes);
    }

    #[test]
    fn owner_names() {
        for (owner, offset) in [
            (c(0), 1u64),
            (OffsetOwner::Group(u32::MAX), 2),
            (
                OffsetOwner::Consumer(ConsumerKey::Name("a/b ../c".to_string())),
                3,
            ),
        ] {
            let decoded = OffsetOwner::decode(&owner.file_name(), &owner.encode(offset));
            assert_eq!(decoded, Some(Ok((owner, offset))));
        }
        assert_eq!(OffsetOwner::decode("consumer-01", &[0; 8]), None);
        assert_eq!(OffsetOwner::decode("consumer-", &[0; 8]), None);
        assert_eq!(OffsetOwner::decode("group-4294967296", &[0; 8]), None);
        let named = OffsetOwner::Consumer(ConsumerKey::Name("x".to_string()));
        let wrong = OffsetOwner::Consumer(ConsumerKey::Name("y".to_string())).encode(5);
        assert!(matches!(
            OffsetOwner::decode(&named.file_name(), &wrong),
            Some(Err(_))
        ));
    }

    #[test]
    fn named_consumers_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("offsets");
        let named = OffsetOwner::Consumer(ConsumerKey::Name("orders-reader".to_string()));
        let mut offsets = ConsumerOffsets::open(&path).unwrap();
        offsets.store(&named, 77).unwrap();
        offsets.store(&c(77), 1).unwrap();
        drop(offsets);
        let offsets = ConsumerOffsets::open(&path).unwrap();
        assert_eq!(offsets.get(&named), Some(77));
        assert_eq!(offsets.get(&c(77)), Some(1));
    }
}
