//! Offline operator tools, run with the server stopped:
//!
//! - `cairn check <data-dir>`: verify the metadata and every partition without changing a byte;
//!   print a verdict per partition (healthy / recoverable / damaged) and a summary line.
//!
//! There is no offline repair: a damaged partition group is refused with its bytes kept, and
//! a peer replica repairs it by state transfer (a three-node cluster; a single node has no
//! peer).
//!
//! A thin front-end over `cairn_storage::check` (the data directory walk) and the server's
//! read-only recovery of each group: printing and exit codes.
//!
//! Exit codes: 0 = healthy; 1 = something recoverable or damaged; 2 = usage or IO error.

use cairn_storage::check::{self, Verdict};
use std::path::Path;
use std::process::ExitCode;

const EXIT_FINDINGS: u8 = 1;
const EXIT_USAGE_OR_IO: u8 = 2;

/// `cairn check <data-dir>`.
pub fn run_check(data_dir: &Path) -> ExitCode {
    match check::check_data_dir_with(data_dir, metadata_report(data_dir), &crate::partition::check) {
        Ok(report) => {
            print!("{report}");
            if report.verdict() == Verdict::Healthy {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(EXIT_FINDINGS)
            }
        }
        Err(error) => {
            eprintln!(
                "cairn check: cannot read data directory {}: {error}",
                data_dir.display()
            );
            ExitCode::from(EXIT_USAGE_OR_IO)
        }
    }
}

/// The metadata's verdict from the replicated metadata log, recovered in memory exactly as
/// boot would recover it, writing nothing. `None` when the data directory has no log yet (a
/// first start, or a metadata document not migrated yet: the checker reads the document).
fn metadata_report(data_dir: &Path) -> Option<check::MetadataReport> {
    let dir = crate::catalog::metadata_group_dir(data_dir);
    let opened = crate::node::LocalGroup::open_read_only(
        &dir,
        crate::catalog::METADATA_GROUP,
        cairn_machine::metadata::MetadataMachine::default,
    );
    let group = match opened {
        Ok(Some(group)) => group,
        Ok(None) => return None,
        Err(error) => {
            return Some(check::MetadataReport {
                verdict: Verdict::Damaged,
                detail: format!("the replicated metadata log cannot be recovered: {error}"),
                named: None,
                purge_targets: Default::default(),
            });
        }
    };
    let meta = &group.state_machine().state;
    let mut named = std::collections::BTreeSet::new();
    let mut purge_targets = std::collections::BTreeMap::new();
    for stream in meta.streams.values() {
        for topic in stream.topics.values() {
            for partition in &topic.partitions {
                let key = (stream.id, topic.id, partition.id);
                named.insert(key);
                if partition.purge_target > 0 {
                    purge_targets.insert(key, partition.purge_target);
                }
            }
        }
    }
    let streams_with_partitions: std::collections::BTreeSet<u32> = named.iter().map(|&(s, _, _)| s).collect();
    Some(check::MetadataReport {
        verdict: Verdict::Healthy,
        detail: format!(
            "{} partition(s) named in {} stream(s) with partitions (replicated metadata log at op {})",
            named.len(),
            streams_with_partitions.len(),
            group.commit_op()
        ),
        named: Some(named),
        purge_targets,
    })
}
