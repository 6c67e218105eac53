//! Offline operator tools, run with the server stopped:
//!
//! - `cairn check <data-dir>`: verify the metadata and every partition without changing a byte;
//!   print a verdict per partition (healthy / recoverable / damaged) and a summary line.
//!
//! - `cairn repair --accept-loss <stream>/<topic>/<partition> <data-dir>`: make a partition
//!   refused for damage serve again, accepting the loss of everything from its damage on
//!   (`crate::repair`); the damaged files are moved aside whole, never deleted.
//!
//! Front-ends over `cairn_storage::check` (the data directory walk), the server's read-only
//! recovery of each group, and `crate::repair`: arguments, printing and exit codes.
//!
//! Exit codes: 0 = healthy / repaired; 1 = something recoverable or damaged (check), or the
//! repair was refused (not damaged, not repairable, data directory in use); 2 = usage or IO
//! error.

use crate::repair::RepairError;
use cairn_storage::check::{self, Verdict};
use cairn_storage::lock::{DataDirLock, LockError};
use std::path::Path;
use std::process::ExitCode;

const EXIT_FINDINGS: u8 = 1;
const EXIT_USAGE_OR_IO: u8 = 2;

/// How long `cairn status` waits for one node's answer.
const STATUS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);
/// The largest answer `cairn status` reads from one node.
const STATUS_ANSWER_BYTES_MAX: usize = 16 * 1024 * 1024;

/// `cairn status --config FILE`: every node's `GET /cluster/status`, as one table.
pub fn run_status(config: &crate::config::Config) -> ExitCode {
    let Some(cluster) = &config.cluster else {
        eprintln!("cairn status: the configuration has no [cluster] node list");
        return ExitCode::from(EXIT_USAGE_OR_IO);
    };
    let mut answers = Vec::new();
    let mut all_answered = true;
    for node in &cluster.nodes {
        let answer = if node.http.is_empty() {
            Err("no `http` address in the node list".to_string())
        } else {
            fetch_status(&node.http)
        };
        match &answer {
            Ok(status) => {
                let reaches: Vec<String> = status["peers"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|peer| {
                        let id = peer["id"].as_u64().unwrap_or(0);
                        if peer["connected"].as_bool().unwrap_or(false) {
                            format!("{id} connected")
                        } else {
                            format!("{id} NOT connected")
                        }
                    })
                    .collect();
                println!("node {} ({}): peers {}", node.id, node.http, reaches.join(", "));
            }
            Err(error) => {
                all_answered = false;
                println!("node {} ({}): no answer: {error}", node.id, node.http);
            }
        }
        answers.push((node.id, answer.ok()));
    }
    let mut groups: Vec<String> = Vec::new();
    let mut cells: std::collections::HashMap<(String, u32), Option<StatusCell>> =
        std::collections::HashMap::new();
    for (node_id, answer) in &answers {
        for entry in answer
            .iter()
            .flat_map(|status| status["groups"].as_array().into_iter().flatten())
        {
            let group = entry["group"].as_str().unwrap_or("?").to_string();
            if !groups.contains(&group) {
                groups.push(group.clone());
            }
            let replica = &entry["replica"];
            let cell = replica.is_object().then(|| StatusCell {
                role: replica["role"].as_str().unwrap_or("?").to_string(),
                view: replica["view"].as_u64().unwrap_or(0),
                commit: replica["commit"].as_u64().unwrap_or(0),
                op: replica["op"].as_u64().unwrap_or(0),
                transfer_wanted: replica["transfer_wanted"].as_bool().unwrap_or(false),
                transfer: replica["transfer"].is_object().then(|| {
                    let transfer = &replica["transfer"];
                    (
                        transfer["bytes_done"].as_u64().unwrap_or(0),
                        transfer["bytes_total"].as_u64().unwrap_or(0),
                    )
                }),
            });
            cells.insert((group, *node_id), cell);
        }
    }
    println!();
    print!("{:<14}", "group");
    for (node_id, _) in &answers {
        print!(" {:<34}", format!("node {node_id}"));
    }
    println!();
    for group in &groups {
        let furthest = answers
            .iter()
            .filter_map(|(node_id, _)| cells.get(&(group.clone(), *node_id)).cloned().flatten())
            .map(|cell| cell.commit)
            .max()
            .unwrap_or(0);
        print!("{group:<14}");
        for (node_id, _) in &answers {
            let text = match cells.get(&(group.clone(), *node_id)) {
                None => "-".to_string(),
                Some(None) => "busy or not serving".to_string(),
                Some(Some(cell)) => format!(
                    "{} v{} {}/{} lag {}{}",
                    cell.role,
                    cell.view,
                    cell.commit,
                    cell.op,
                    furthest.saturating_sub(cell.commit),
                    match cell.transfer {
                        Some((done, total)) =>
                            format!(" transfer {}/{} MiB", done >> 20, total.div_ceil(1 << 20)),
                        None if cell.transfer_wanted => " wants transfer".to_string(),
                        None => String::new(),
                    }
                ),
            };
            print!(" {text:<34}");
        }
        println!();
    }
    if all_answered {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_FINDINGS)
    }
}

/// One node's replica of one group, as `cairn status` prints it.
#[derive(Clone)]
struct StatusCell {
    role: String,
    view: u64,
    commit: u64,
    op: u64,
    transfer_wanted: bool,
    /// Bytes fetched and to fetch, while a state transfer runs.
    transfer: Option<(u64, u64)>,
}

/// `GET /cluster/status` from `host:port`, as JSON.
fn fetch_status(address: &str) -> Result<serde_json::Value, String> {
    use std::io::{Read as _, Write as _};
    use std::net::ToSocketAddrs;
    let target = address
        .to_socket_addrs()
        .map_err(|error| format!("cannot resolve {address}: {error}"))?
        .next()
        .ok_or_else(|| format!("{address} resolves to no address"))?;
    let deadline = std::time::Instant::now() + STATUS_TIMEOUT;
    let mut stream = std::net::TcpStream::connect_timeout(&target, STATUS_TIMEOUT)
        .map_err(|error| format!("cannot connect: {error}"))?;
    stream
        .set_write_timeout(Some(STATUS_TIMEOUT))
        .map_err(|error| error.to_string())?;
    write!(
        stream,
        "GET /cluster/status HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|error| format!("cannot send the request: {error}"))?;
    // One deadline for the whole answer, and a bound on its size.
    let mut response = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(format!("no whole answer within {STATUS_TIMEOUT:?}"));
        }
        stream
            .set_read_timeout(Some(left))
            .map_err(|error| error.to_string())?;
        let read = stream
            .read(&mut chunk)
            .map_err(|error| format!("cannot read the answer: {error}"))?;
        if read == 0 {
            break;
        }
        response.extend_from_slice(&chunk[..read]);
        if response.len() > STATUS_ANSWER_BYTES_MAX {
            return Err(format!("the answer exceeds {STATUS_ANSWER_BYTES_MAX} bytes"));
        }
    }
    let text = String::from_utf8_lossy(&response);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| "not an HTTP answer".to_string())?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(head.lines().next().unwrap_or("").to_string());
    }
    serde_json::from_str(body).map_err(|error| format!("not a status answer: {error}"))
}

/// `Some(refusal)` when `data_dir` holds a node of a cluster of several nodes: its groups are
/// replicas among peers, which the offline tools do not recover yet (they recover a group of
/// one, as a single node's). Nothing is read beyond the membership record.
fn cluster_node_refusal(tool: &str, data_dir: &Path) -> Option<String> {
    let bytes =
        cairn_storage::atomic_file::read(&data_dir.join(crate::membership::MEMBERSHIP_FILE)).ok()??;
    let membership: crate::membership::Membership = serde_json::from_slice(&bytes).ok()?;
    (membership.nodes.len() > 1).then(|| {
        format!(
            "cairn {tool}: {} holds node {} of a {}-node cluster; `cairn {tool}` works on a single node's data \
             directory only (it does not recover a replica among peers yet). Nothing was read or changed",
            data_dir.display(),
            membership.node_id,
            membership.nodes.len()
        )
    })
}

/// `cairn check <data-dir>`.
pub fn run_check(data_dir: &Path) -> ExitCode {
    if let Some(refusal) = cluster_node_refusal("check", data_dir) {
        eprintln!("{refusal}");
        return ExitCode::from(EXIT_USAGE_OR_IO);
    }
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

/// `cairn repair --accept-loss <stream>/<topic>/<partition> <data-dir>`.
pub fn run_repair(accept_loss: bool, target: &str, data_dir: &Path) -> ExitCode {
    if !accept_loss {
        eprintln!(
            "cairn repair: refused: a repair loses every message from the damage on; pass --accept-loss to say so (nothing was changed)"
        );
        return ExitCode::from(EXIT_USAGE_OR_IO);
    }
    if let Some(refusal) = cluster_node_refusal("repair", data_dir) {
        eprintln!("{refusal}");
        return ExitCode::from(EXIT_USAGE_OR_IO);
    }
    let (stream_id, topic_id, partition_id) = match parse_target(target) {
        Ok(ids) => ids,
        Err(reason) => {
            eprintln!("cairn repair: {reason}");
            return ExitCode::from(EXIT_USAGE_OR_IO);
        }
    };
    if !data_dir.is_dir() {
        eprintln!(
            "cairn repair: data directory {} does not exist",
            data_dir.display()
        );
        return ExitCode::from(EXIT_USAGE_OR_IO);
    }
    // Held until the end: a server cannot start while files move, and the repair never runs
    // against a live server.
    let _lock = match DataDirLock::acquire(data_dir) {
        Ok(lock) => lock,
        Err(LockError::InUse { .. }) => {
            eprintln!(
                "cairn repair: refused: {} is in use by another process; stop the server first (nothing was changed)",
                data_dir.display()
            );
            return ExitCode::from(EXIT_FINDINGS);
        }
        Err(LockError::Storage(error)) => {
            eprintln!("cairn repair: {error}");
            return ExitCode::from(EXIT_USAGE_OR_IO);
        }
    };
    let Some(segment_size_bytes) = topic_segment_size(data_dir, (stream_id, topic_id, partition_id)) else {
        eprintln!(
            "cairn repair: refused: the metadata names no partition {target} (or cannot be read; `cairn check` says which); nothing was changed"
        );
        return ExitCode::from(EXIT_FINDINGS);
    };
    let dir = crate::catalog::partition_dir(data_dir, stream_id, topic_id, partition_id);
    match crate::repair::repair_accept_loss(&dir, (stream_id, topic_id, partition_id), segment_size_bytes) {
        Ok(report) => {
            print!("{report}");
            ExitCode::SUCCESS
        }
        Err(error @ (RepairError::NotDamaged(_) | RepairError::Unsupported(_))) => {
            eprintln!("cairn repair: refused for {target}: {error}");
            ExitCode::from(EXIT_FINDINGS)
        }
        Err(error) => {
            eprintln!("cairn repair: {target} ({}): {error}", dir.display());
            ExitCode::from(EXIT_USAGE_OR_IO)
        }
    }
}

/// The segment size partition `ids`' topic sets (0: the server's), from the replicated
/// metadata log read-only; `None` if the metadata does not name the partition.
fn topic_segment_size(data_dir: &Path, (stream_id, topic_id, partition_id): (u32, u32, u32)) -> Option<u64> {
    let group = crate::node::LocalGroup::open_read_only(
        &crate::catalog::metadata_group_dir(data_dir),
        crate::catalog::METADATA_GROUP,
        cairn_machine::metadata::MetadataMachine::default,
    )
    .ok()??;
    let topic = group
        .state_machine()
        .state
        .streams
        .get(&stream_id)?
        .topics
        .get(&topic_id)?;
    topic
        .partitions
        .iter()
        .any(|partition| partition.id == partition_id)
        .then_some(topic.segment_size_bytes)
}

/// `<stream>/<topic>/<partition>` numeric ids.
fn parse_target(target: &str) -> Result<(u32, u32, u32), String> {
    let parts: Vec<&str> = target.split('/').collect();
    let [stream, topic, partition] = parts.as_slice() else {
        return Err(format!(
            "expected <stream id>/<topic id>/<partition id> (e.g. 1/1/0), got {target:?}"
        ));
    };
    let id = |what: &str, text: &str| {
        text.parse::<u32>().map_err(|_| {
            format!(
                "{what} id {text:?} in {target:?} is not a number (names are not accepted; use numeric ids)"
            )
        })
    };
    Ok((
        id("stream", stream)?,
        id("topic", topic)?,
        id("partition", partition)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets() {
        assert_eq!(parse_target("1/2/0"), Ok((1, 2, 0)));
        assert!(parse_target("1/2").is_err());
        assert!(parse_target("1/2/0/4").is_err());
        assert!(parse_target("a/2/0").is_err());
    }
}
