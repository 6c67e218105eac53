//! The node list a data directory was formatted with (`<data_dir>/membership`).
//!
//! A node's data belongs to one node of one cluster: its replica index in every group is its
//! position in the node list, so starting it under another node's id, or with another node
//! list, would let two processes vote as one replica. The first start with a `[cluster]`
//! table records this node's id and the list (a checksummed atomic file, written before the
//! metadata group is formatted); every later start compares the configuration with it and
//! refuses a difference, naming the key. Nothing here reads the network or the clock.

use crate::config::{ClusterConfig, ClusterNode};
use std::path::{Path, PathBuf};

/// The record's file name in the data directory.
pub const MEMBERSHIP_FILE: &str = "membership";

/// The record's layout version.
const FORMAT: u32 = 1;

/// What the membership file holds.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Membership {
    pub format: u32,
    pub node_id: u32,
    /// Sorted by id, as the configuration's list.
    pub nodes: Vec<ClusterNode>,
    /// Set once this node's metadata group is formatted (a node of several): a later start
    /// that finds no metadata group lost it, and must not format a new one. Unset between
    /// the record and the format (a stop there left no group that ever voted).
    #[serde(default)]
    pub metadata_formatted: bool,
    /// Set while this node rejoins a cluster that formed without it (its data directory was
    /// empty while a peer held the cluster's data: it lost its data). Its groups then open as
    /// wiped replicas, never as new ones, until its metadata has caught up with its peers'
    /// and every partition it names has a replica here.
    #[serde(default)]
    pub rejoining: bool,
}

impl Membership {
    fn of(cluster: &ClusterConfig) -> Membership {
        Membership {
            format: FORMAT,
            node_id: cluster.node_id,
            nodes: cluster.nodes.clone(),
            metadata_formatted: false,
            rejoining: false,
        }
    }
}

/// Why a start is refused: the text names the configuration key and says what was found.
#[derive(Debug, thiserror::Error)]
pub enum MembershipError {
    #[error("`{key}` does not match this data directory ({path}): {reason}")]
    Mismatch {
        key: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("cannot use the node list record {path}: {reason} (the record is left as it is)")]
    Io { path: PathBuf, reason: String },
}

/// Whether `data_dir` already holds a server's data (formatted before this start): the
/// metadata group, a pre-replication metadata document, or partitions.
fn holds_data(data_dir: &Path) -> bool {
    ["vsr", "metadata", "metadata.migrated", "streams"]
        .iter()
        .any(|name| data_dir.join(name).exists())
}

/// Check the configuration's `[cluster]` (or its absence) against what `data_dir` was
/// formatted with, recording it on the first start with a `[cluster]`. Returns what the
/// directory belongs to after this start.
///
/// - A record and a `[cluster]`: this node's id and the node list must equal the record.
/// - A record of several nodes and no `[cluster]`: refused (the node would run alone on a
///   member's data). A record of one node serves without `[cluster]`, as one node does.
/// - No record on a directory holding data (formatted as one node, or before clusters): a
///   one-node `[cluster]` is recorded; a list of several nodes is refused, since a node joins
///   a cluster with an empty data directory.
/// - No record and no data: the `[cluster]` is recorded before anything else is written.
pub fn check_or_record(
    data_dir: &Path,
    cluster: Option<&ClusterConfig>,
) -> Result<Option<Membership>, MembershipError> {
    match (check(data_dir, cluster)?, cluster) {
        (Checked::Recorded(membership), _) => Ok(Some(membership)),
        (Checked::Unrecorded, Some(cluster)) => record(data_dir, cluster, false).map(Some),
        (Checked::Unrecorded, None) => Ok(None),
    }
}

/// What [`check`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checked {
    /// A record this start matches.
    Recorded(Membership),
    /// No record: with a `[cluster]`, an empty directory (or a single node's data that a
    /// one-node `[cluster]` may take), which [`record`] makes this node's.
    Unrecorded,
}

/// [`check_or_record`] without the write: a node of several decides first whether it forms
/// the cluster (`cluster.rs`), then records.
pub fn check(data_dir: &Path, cluster: Option<&ClusterConfig>) -> Result<Checked, MembershipError> {
    let mismatch = |key: &'static str, reason: String| MembershipError::Mismatch {
        key,
        path: data_dir.to_path_buf(),
        reason,
    };
    let recorded = read_record(data_dir)?;
    match (recorded, cluster) {
        (Some(recorded), Some(cluster)) => {
            if recorded.node_id != cluster.node_id {
                return Err(mismatch(
                    "cluster.node_id",
                    format!(
                        "this directory holds the data of node {}, and node {} is configured; \
                         start each node on its own data directory",
                        recorded.node_id, cluster.node_id
                    ),
                ));
            }
            if let Some(difference) = first_difference(&recorded.nodes, &cluster.nodes) {
                return Err(mismatch(
                    "cluster.nodes",
                    format!(
                        "{difference}; the node list cannot change after the cluster was formatted \
                         (every node must be started with the list it was formatted with)"
                    ),
                ));
            }
            Ok(Checked::Recorded(recorded))
        }
        (Some(recorded), None) if recorded.nodes.len() > 1 => Err(mismatch(
            "cluster",
            format!(
                "this directory holds the data of node {} of a {}-node cluster, and no [cluster] table \
                 is configured; start it with the cluster's configuration",
                recorded.node_id,
                recorded.nodes.len()
            ),
        )),
        (Some(recorded), None) => Ok(Checked::Recorded(recorded)),
        (None, Some(cluster)) if cluster.nodes.len() > 1 && holds_data(data_dir) => Err(mismatch(
            "cluster.nodes",
            format!(
                "this directory holds the data of a server that is not a member of this {}-node cluster; \
                 a node joins a cluster with an empty data directory",
                cluster.nodes.len()
            ),
        )),
        (None, _) => Ok(Checked::Unrecorded),
    }
}

/// Note in the record that this node's metadata group is formatted (a node of several, once
/// its catalog loaded).
pub fn note_metadata_formatted(data_dir: &Path, recorded: &Membership) -> Result<(), MembershipError> {
    if recorded.metadata_formatted {
        return Ok(());
    }
    write_record(
        data_dir,
        &Membership {
            metadata_formatted: true,
            ..recorded.clone()
        },
    )
}

/// Note in the record that this node rejoins (it lost its metadata group after it was
/// formatted): its groups open wiped until it has rejoined. Returns the record as written.
pub fn note_rejoining(data_dir: &Path, recorded: &Membership) -> Result<Membership, MembershipError> {
    let membership = Membership {
        rejoining: true,
        ..recorded.clone()
    };
    write_record(data_dir, &membership)?;
    Ok(membership)
}

/// Note in the record that this node has rejoined (its metadata caught up with its peers'
/// and every partition it names has a replica here): groups new to it are formatted again.
pub fn note_rejoined(data_dir: &Path) -> Result<(), MembershipError> {
    let recorded = read_record(data_dir)?.ok_or_else(|| MembershipError::Io {
        path: data_dir.join(MEMBERSHIP_FILE),
        reason: "the record is missing".to_string(),
    })?;
    write_record(
        data_dir,
        &Membership {
            rejoining: false,
            metadata_formatted: true,
            ..recorded
        },
    )
}

/// Record `cluster` as what `data_dir` belongs to (after [`check`] found no record); with
/// `rejoining`, as a node that lost its data and rejoins the cluster its peers hold.
pub fn record(
    data_dir: &Path,
    cluster: &ClusterConfig,
    rejoining: bool,
) -> Result<Membership, MembershipError> {
    let membership = Membership {
        rejoining,
        ..Membership::of(cluster)
    };
    write_record(data_dir, &membership)?;
    tracing::info!(
        node_id = cluster.node_id,
        nodes = cluster.nodes.len(),
        "recorded this node's id and the cluster's node list in the data directory"
    );
    Ok(membership)
}

/// The record in `data_dir`, read and checked (its format); `None` when there is none.
fn read_record(data_dir: &Path) -> Result<Option<Membership>, MembershipError> {
    let path = data_dir.join(MEMBERSHIP_FILE);
    let io = |reason: String| MembershipError::Io {
        path: path.clone(),
        reason,
    };
    let recorded = match cairn_storage::atomic_file::read(&path).map_err(|error| io(error.to_string()))? {
        Some(bytes) => {
            let membership: Membership = serde_json::from_slice(&bytes)
                .map_err(|error| io(format!("not a node list record: {error}")))?;
            if membership.format != FORMAT {
                return Err(io(format!(
                    "record format {}, this build reads {FORMAT}",
                    membership.format
                )));
            }
            Some(membership)
        }
        None => None,
    };
    Ok(recorded)
}

/// Write `membership` as the record in `data_dir` (an atomic file).
fn write_record(data_dir: &Path, membership: &Membership) -> Result<(), MembershipError> {
    let path = data_dir.join(MEMBERSHIP_FILE);
    let io = |reason: String| MembershipError::Io {
        path: path.clone(),
        reason,
    };
    let bytes = serde_json::to_vec_pretty(membership).map_err(|error| io(error.to_string()))?;
    cairn_storage::atomic_file::write(&path, &bytes).map_err(|error| io(error.to_string()))
}

/// The first way `configured` differs from `recorded`, in words; `None` when they are equal.
fn first_difference(recorded: &[ClusterNode], configured: &[ClusterNode]) -> Option<String> {
    let ids = |nodes: &[ClusterNode]| {
        nodes
            .iter()
            .map(|node| node.id.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    if recorded.len() != configured.len() || recorded.iter().zip(configured).any(|(a, b)| a.id != b.id) {
        return Some(format!(
            "the directory was formatted with nodes {}, and nodes {} are configured",
            ids(recorded),
            ids(configured)
        ));
    }
    for (was, now) in recorded.iter().zip(configured) {
        for (field, before, after) in [
            ("tcp", &was.tcp, &now.tcp),
            ("http", &was.http, &now.http),
            ("replica", &was.replica, &now.replica),
        ] {
            if before != after {
                return Some(format!(
                    "node {}'s `{field}` address was `{before}` when formatted and is `{after}` now",
                    was.id
                ));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: u32) -> ClusterNode {
        ClusterNode {
            id,
            tcp: format!("127.0.0.1:{}", 8090 + id),
            http: format!("127.0.0.1:{}", 3000 + id),
            replica: format!("127.0.0.1:{}", 7090 + id),
        }
    }

    fn cluster(node_id: u32, ids: &[u32]) -> ClusterConfig {
        ClusterConfig {
            node_id,
            nodes: ids.iter().copied().map(node).collect(),
            secret: crate::config::ClusterSecret("a secret of the tests".to_string()),
            transfer_bytes_per_second: 1 << 20,
        }
    }

    fn refusal(result: Result<Option<Membership>, MembershipError>) -> (String, String) {
        match result {
            Err(MembershipError::Mismatch { key, reason, .. }) => (key.to_string(), reason),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    /// A node of several records first, then notes that its metadata group is formatted;
    /// later starts read the note, and the list checks are unchanged by it.
    #[test]
    fn the_metadata_format_is_noted_once_recorded() {
        let dir = tempfile::tempdir().expect("tempdir");
        let three = cluster(1, &[1, 2, 3]);
        assert_eq!(
            check(dir.path(), Some(&three)).expect("checked"),
            Checked::Unrecorded
        );
        let recorded = record(dir.path(), &three, false).expect("recorded");
        assert!(!recorded.metadata_formatted);
        note_metadata_formatted(dir.path(), &recorded).expect("noted");
        let Checked::Recorded(found) = check(dir.path(), Some(&three)).expect("checked") else {
            panic!("recorded");
        };
        assert!(found.metadata_formatted);
        assert_eq!(found.nodes, recorded.nodes);
        let (key, _) = refusal(check_or_record(dir.path(), Some(&cluster(2, &[1, 2, 3]))));
        assert_eq!(key, "cluster.node_id");
    }

    /// A node that rejoins after losing its data is recorded as rejoining, and the note that
    /// it has rejoined clears that (keeping the rest of the record).
    #[test]
    fn a_rejoining_node_is_recorded_until_it_has_rejoined() {
        let dir = tempfile::tempdir().expect("tempdir");
        let three = cluster(3, &[1, 2, 3]);
        let recorded = record(dir.path(), &three, true).expect("recorded");
        assert!(recorded.rejoining);
        let Checked::Recorded(found) = check(dir.path(), Some(&three)).expect("checked") else {
            panic!("recorded");
        };
        assert!(found.rejoining);
        note_rejoined(dir.path()).expect("noted");
        let Checked::Recorded(found) = check(dir.path(), Some(&three)).expect("checked") else {
            panic!("recorded");
        };
        assert!(!found.rejoining && found.metadata_formatted);
        assert_eq!(found.nodes, recorded.nodes);
    }

    #[test]
    fn the_first_start_records_and_later_starts_must_match() {
        let dir = tempfile::tempdir().expect("tempdir");
        let three = cluster(2, &[1, 2, 3]);
        let recorded = check_or_record(dir.path(), Some(&three)).expect("recorded");
        assert_eq!(recorded, Some(Membership::of(&three)));
        assert_eq!(check_or_record(dir.path(), Some(&three)).expect("same"), recorded);

        let (key, reason) = refusal(check_or_record(dir.path(), Some(&cluster(3, &[1, 2, 3]))));
        assert_eq!(key, "cluster.node_id");
        assert!(reason.contains("node 2") && reason.contains("node 3"), "{reason}");

        let (key, reason) = refusal(check_or_record(dir.path(), Some(&cluster(2, &[1, 2, 4]))));
        assert_eq!(key, "cluster.nodes");
        assert!(
            reason.contains("1, 2, 3") && reason.contains("1, 2, 4"),
            "{reason}"
        );

        let mut moved = three.clone();
        moved.nodes[2].replica = "127.0.0.1:9999".to_string();
        let (key, reason) = refusal(check_or_record(dir.path(), Some(&moved)));
        assert_eq!(key, "cluster.nodes");
        assert!(
            reason.contains("node 3's `replica`") && reason.contains("9999"),
            "{reason}"
        );

        let (key, _) = refusal(check_or_record(dir.path(), None));
        assert_eq!(key, "cluster");
    }

    #[test]
    fn a_single_node_directory_takes_a_one_node_cluster_but_joins_no_larger_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(check_or_record(dir.path(), None).expect("one node"), None);
        std::fs::create_dir_all(dir.path().join("vsr").join("metadata")).expect("mkdir");
        let (key, reason) = refusal(check_or_record(dir.path(), Some(&cluster(1, &[1, 2, 3]))));
        assert_eq!(key, "cluster.nodes");
        assert!(reason.contains("empty data directory"), "{reason}");
        assert!(
            !dir.path().join(MEMBERSHIP_FILE).exists(),
            "a refusal records nothing"
        );

        let one = cluster(1, &[1]);
        assert!(
            check_or_record(dir.path(), Some(&one))
                .expect("recorded")
                .is_some()
        );
        // A one-node cluster's data may be served without the table, as one node.
        assert!(check_or_record(dir.path(), None).expect("served alone").is_some());
    }

    #[test]
    fn a_damaged_record_is_refused_not_replaced() {
        let dir = tempfile::tempdir().expect("tempdir");
        let three = cluster(1, &[1, 2, 3]);
        check_or_record(dir.path(), Some(&three)).expect("recorded");
        let path = dir.path().join(MEMBERSHIP_FILE);
        let mut bytes = std::fs::read(&path).expect("read");
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x20;
        std::fs::write(&path, &bytes).expect("write");
        match check_or_record(dir.path(), Some(&three)) {
            Err(MembershipError::Io { .. }) => {}
            other => panic!("a damaged record must be refused, got {other:?}"),
        }
        assert_eq!(
            std::fs::read(&path).expect("read"),
            bytes,
            "the damaged record is kept"
        );
    }
}
