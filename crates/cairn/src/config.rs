//! Server configuration: defaults < TOML file (`--config`) < `CAIRN_*` environment < flags.
//!
//! Every key is listed once in [`KEYS`]; that table is the single place defaults are
//! documented (README points here and `cairn serve --help` prints it). Unknown keys and
//! invalid values are refused at start with a message naming the key.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// The kind of a config value, for parsing environment variables and flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueKind {
    Text,
    Integer,
}

/// One configuration key: dotted path, value kind, default (as text), description.
pub struct Key {
    pub path: &'static str,
    pub kind: ValueKind,
    pub default: &'static str,
    pub about: &'static str,
}

/// Every configuration key. Environment name = `CAIRN_` + path with dots as underscores,
/// upper case (e.g. `tcp.address` -> `CAIRN_TCP_ADDRESS`).
pub const KEYS: &[Key] = &[
    Key {
        path: "data_dir",
        kind: ValueKind::Text,
        default: "./cairn-data",
        about: "directory holding all streams, topics, messages, users and offsets",
    },
    Key {
        path: "tcp.address",
        kind: ValueKind::Text,
        default: "127.0.0.1:8090",
        about: "TCP listen address (port 0 picks a free port)",
    },
    Key {
        path: "http.address",
        kind: ValueKind::Text,
        default: "127.0.0.1:3000",
        about: "HTTP (REST) listen address (port 0 picks a free port; empty disables HTTP)",
    },
    Key {
        path: "tcp.max_frame_bytes",
        kind: ValueKind::Integer,
        default: "67174400",
        about: "largest request frame accepted (header + body); larger ones are refused before they are read",
    },
    Key {
        path: "tcp.max_connections",
        kind: ValueKind::Integer,
        default: "1024",
        about: "concurrent client connections; further ones wait to be accepted",
    },
    Key {
        path: "limits.message_payload_bytes_max",
        kind: ValueKind::Integer,
        default: "64000000",
        about: "largest payload of one message",
    },
    Key {
        path: "limits.user_headers_bytes_max",
        kind: ValueKind::Integer,
        default: "100000",
        about: "largest user-headers block of one message",
    },
    Key {
        path: "limits.batch_bytes_max",
        kind: ValueKind::Integer,
        default: "67108864",
        about: "largest message batch (256-byte header + frames) in one send",
    },
    Key {
        path: "limits.batch_messages_max",
        kind: ValueKind::Integer,
        default: "1000000",
        about: "most messages in one send",
    },
    Key {
        path: "storage.segment_size_bytes",
        kind: ValueKind::Integer,
        default: "1073741824",
        about: "a partition starts a new segment file once its current one reaches this size",
    },
    Key {
        path: "storage.durability",
        kind: ValueKind::Text,
        default: "durable",
        about: "durable: a send is acknowledged after an fdatasync covering it (shared by concurrent sends); relaxed: acknowledged once written, made durable by a flush every storage.flush_interval_ms (a process crash loses nothing; a power loss may lose the last interval's acknowledged messages, never re-issuing their offsets)",
    },
    Key {
        path: "storage.flush_interval_ms",
        kind: ValueKind::Integer,
        default: "1000",
        about: "relaxed durability only: longest time an acknowledged write waits for the fdatasync that makes it durable",
    },
    Key {
        path: "storage.retention_interval_ms",
        kind: ValueKind::Integer,
        default: "1000",
        about: "how often topics are checked against message_expiry and max_topic_size (whole sealed segments are deleted)",
    },
    Key {
        path: "storage.scrub_interval_ms",
        kind: ValueKind::Integer,
        default: "86400000",
        about: "how often every sealed segment is read and verified in the background (0 = never); damage found refuses the partition as a start would",
    },
    Key {
        path: "cluster.node_id",
        kind: ValueKind::Integer,
        default: "",
        about: "with a [cluster] table: this node's id, one of the `id`s of [[cluster.nodes]]",
    },
    Key {
        path: "cluster.secret",
        kind: ValueKind::Text,
        default: "",
        about: "with a [cluster] table: the replica network's shared secret, at least 16 bytes, the same on every node (also CAIRN_CLUSTER_SECRET)",
    },
    Key {
        path: "cluster.transfer_bytes_per_second",
        kind: ValueKind::Integer,
        default: "67108864",
        about: "with a [cluster] table: how many bytes per second this node's state transfers (a rejoining or lagging replica fetching a peer's log) may move in all, so they leave room for client traffic",
    },
    Key {
        path: "auth.root_password",
        kind: ValueKind::Text,
        default: "",
        about: "password of the root user `iggy` on first start (also CAIRN_ROOT_PASSWORD); empty = generate and print one",
    },
];

/// Upper bound of `storage.flush_interval_ms` (one hour): beyond that "relaxed" would mean
/// "never" in practice.
pub const FLUSH_INTERVAL_MS_MAX: u64 = 3_600_000;

/// Test-only fault hook: `CAIRN_TEST_CRASH_AT=<point>` aborts the process at a named point
/// (`purge-after-marker`, `purge-after-first-partition`), as a crash there would. Not a
/// configuration key; never set in production.
pub const TEST_CRASH_AT_ENV: &str = "CAIRN_TEST_CRASH_AT";

/// Test-only fault hook: `CAIRN_TEST_FAIL_AT=<point>` makes the write at a named point fail
/// with an IO error, as a failing disk would (`group-write-prepares`, ...: see `node.rs`).
/// Not a configuration key; never set in production.
pub const TEST_FAIL_AT_ENV: &str = "CAIRN_TEST_FAIL_AT";

/// Test-only: `CAIRN_TEST_REPLICA_LISTEN=<host:port>` makes a node of a cluster listen for
/// replica traffic there rather than at its `replica` address, so a test can put a proxy on
/// that address (and cut the traffic one way). Not a configuration key; never set in
/// production.
pub const TEST_REPLICA_LISTEN_ENV: &str = "CAIRN_TEST_REPLICA_LISTEN";

/// Upper bound of `storage.scrub_interval_ms` (thirty days).
pub const SCRUB_INTERVAL_MS_MAX: u64 = 30 * 86_400_000;

/// Upper bound of `storage.retention_interval_ms` (one day).
pub const RETENTION_INTERVAL_MS_MAX: u64 = 86_400_000;

/// Most nodes a cluster may have: the replication core's bound on replicas per group.
pub const CLUSTER_NODES_MAX: usize = cairn_vsr::constants::REPLICAS_MAX;

/// Shortest accepted `cluster.secret`: it keys the replica network's authentication.
pub const CLUSTER_SECRET_BYTES_MIN: usize = 16;

/// One node of a cluster as a `[[cluster.nodes]]` entry names it. Addresses are `host:port`
/// as clients and peers dial them (an IP or a host name).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ClusterNode {
    pub id: u32,
    /// The address clients use (reported in cluster metadata).
    pub tcp: String,
    /// The HTTP address clients use; empty when the node offers no HTTP.
    pub http: String,
    /// Replica-to-replica traffic.
    pub replica: String,
}

/// The `[cluster]` table, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    pub node_id: u32,
    /// Sorted by id: a node's replica index in every group is its position here.
    pub nodes: Vec<ClusterNode>,
    /// The replica network's shared secret.
    pub secret: ClusterSecret,
    /// `cluster.transfer_bytes_per_second`: the pace of this node's incoming state transfers.
    pub transfer_bytes_per_second: u64,
}

/// The replica network's shared secret: never printed (`Debug` shows its length only).
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterSecret(pub(crate) String);

impl ClusterSecret {
    pub fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl std::fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClusterSecret({} bytes)", self.0.len())
    }
}

impl ClusterConfig {
    /// This node's replica index: its position in the id-sorted node list.
    pub fn replica_index(&self) -> u8 {
        let index = self.nodes.iter().position(|node| node.id == self.node_id);
        debug_assert!(index.is_some(), "a validated cluster lists its own node");
        index.unwrap_or(0) as u8
    }

    /// The id every group of the cluster carries in every message: derived from the node
    /// list (ids and replica addresses), so nodes formatted apart agree on it, and clusters
    /// with different lists never take each other's messages.
    pub fn cluster_id(&self) -> u128 {
        let mut bytes = b"cairn cluster v1".to_vec();
        for node in &self.nodes {
            bytes.extend_from_slice(&node.id.to_le_bytes());
            bytes.extend_from_slice(&(node.replica.len() as u32).to_le_bytes());
            bytes.extend_from_slice(node.replica.as_bytes());
        }
        xxhash_rust::xxh3::xxh3_128(&bytes)
    }

    /// This node's entry (validation guarantees there is one).
    pub fn this_node(&self) -> &ClusterNode {
        let index = self.nodes.iter().position(|node| node.id == self.node_id);
        debug_assert!(index.is_some(), "a validated cluster lists its own node");
        &self.nodes[index.unwrap_or(0)]
    }
}

/// How sends reach stable storage before they are acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    Durable,
    Relaxed,
}

/// The validated configuration the server runs with.
#[derive(Debug, Clone)]
pub struct Config {
    pub data_dir: PathBuf,
    pub tcp_address: SocketAddr,
    /// `None` when HTTP is disabled (`http.address` is empty).
    pub http_address: Option<SocketAddr>,
    pub max_frame_bytes: u32,
    pub max_connections: u32,
    pub message_payload_bytes_max: u32,
    pub user_headers_bytes_max: u32,
    pub batch_bytes_max: u32,
    pub batch_messages_max: u32,
    pub segment_size_bytes: u64,
    pub durability: Durability,
    /// Relaxed mode: longest wait between acknowledging a write and the barrier covering it.
    pub flush_interval_ms: u64,
    /// Period of the retention pass (`retention`).
    pub retention_interval_ms: u64,
    /// 0: no scrub.
    pub scrub_interval_ms: u64,
    /// `None` when not configured (a password is generated on first start).
    pub root_password: Option<String>,
    /// `None` without a `[cluster]` table: one node, as before clusters existed.
    pub cluster: Option<ClusterConfig>,
}

/// A refused configuration: names the key and where its value came from.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("unknown configuration key `{key}` (from {source_name})")]
    UnknownKey { key: String, source_name: String },
    #[error("invalid value for `{key}` (from {source_name}): {reason}")]
    InvalidValue {
        key: String,
        source_name: String,
        reason: String,
    },
    #[error("cannot read config file {path}: {reason}")]
    File { path: PathBuf, reason: String },
}

/// A raw value with where it came from, before validation.
#[derive(Debug, Clone)]
struct RawValue {
    text: String,
    source_name: String,
}

fn key(path: &str) -> Option<&'static Key> {
    KEYS.iter().find(|k| k.path == path)
}

/// Environment variable name for a key path.
pub fn env_name(path: &str) -> String {
    format!("CAIRN_{}", path.replace('.', "_").to_uppercase())
}

/// Layers collected from the sources, lowest precedence first.
#[derive(Default)]
pub struct Sources {
    values: BTreeMap<&'static str, RawValue>,
    /// The `[[cluster.nodes]]` array of the config file, and where it came from: the one key
    /// that is a list of tables, parsed by [`parse_cluster_nodes`].
    cluster_nodes: Option<(toml::Value, String)>,
}

impl Sources {
    /// Start from the documented defaults.
    pub fn defaults() -> Sources {
        let mut sources = Sources::default();
        for k in KEYS {
            sources.values.insert(
                k.path,
                RawValue {
                    text: k.default.to_string(),
                    source_name: "default".to_string(),
                },
            );
        }
        sources
    }

    fn set(&mut self, path: &str, text: String, source_name: String) -> Result<(), ConfigError> {
        let k = key(path).ok_or_else(|| ConfigError::UnknownKey {
            key: path.to_string(),
            source_name: source_name.clone(),
        })?;
        self.values.insert(k.path, RawValue { text, source_name });
        Ok(())
    }

    /// Overlay a TOML file. Tables map to dotted paths (`[tcp] address = ...`).
    pub fn apply_file(&mut self, path: &Path) -> Result<(), ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::File {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        let table: toml::Table = text.parse().map_err(|e: toml::de::Error| ConfigError::File {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        let source_name = format!("config file {}", path.display());
        let mut table = table;
        if let Some(toml::Value::Table(cluster)) = table.get_mut("cluster")
            && let Some(nodes) = cluster.remove("nodes")
        {
            self.cluster_nodes = Some((nodes, source_name.clone()));
        }
        let mut flat = Vec::new();
        flatten("", &toml::Value::Table(table), &mut flat);
        for (key_path, value) in flat {
            let text = match value {
                toml::Value::String(s) => s,
                toml::Value::Integer(i) => i.to_string(),
                other => {
                    // Known key with an unsupported TOML type: report against the key.
                    if key(&key_path).is_none() {
                        return Err(ConfigError::UnknownKey {
                            key: key_path,
                            source_name,
                        });
                    }
                    return Err(ConfigError::InvalidValue {
                        key: key_path,
                        source_name,
                        reason: format!("expected a string or an integer, got {}", other.type_str()),
                    });
                }
            };
            self.set(&key_path, text, source_name.clone())?;
        }
        Ok(())
    }

    /// Overlay `CAIRN_*` environment variables. `CAIRN_ROOT_PASSWORD` is an alias of
    /// `auth.root_password`. An unknown `CAIRN_*` variable is refused.
    pub fn apply_env(&mut self, vars: impl IntoIterator<Item = (String, String)>) -> Result<(), ConfigError> {
        for (name, value) in vars {
            if !name.starts_with("CAIRN_") {
                continue;
            }
            if name == TEST_CRASH_AT_ENV || name == TEST_FAIL_AT_ENV || name == TEST_REPLICA_LISTEN_ENV {
                // A test-only fault hook read where it fires (see the handler), not a key.
                continue;
            }
            if name == "CAIRN_CLUSTER_NODES" {
                return Err(ConfigError::InvalidValue {
                    key: "cluster.nodes".to_string(),
                    source_name: format!("environment {name}"),
                    reason: "the node list is given only as [[cluster.nodes]] tables in the --config file"
                        .to_string(),
                });
            }
            if name == "CAIRN_ROOT_PASSWORD" {
                self.set("auth.root_password", value, format!("environment {name}"))?;
                continue;
            }
            match KEYS.iter().find(|k| env_name(k.path) == name) {
                Some(k) => self.set(k.path, value, format!("environment {name}"))?,
                None => {
                    return Err(ConfigError::UnknownKey {
                        key: name.clone(),
                        source_name: "environment".to_string(),
                    });
                }
            }
        }
        Ok(())
    }

    /// Overlay a command-line value.
    pub fn apply_flag(&mut self, path: &str, value: String, flag: &str) -> Result<(), ConfigError> {
        self.set(path, value, format!("flag {flag}"))
    }

    /// Validate every value and build the [`Config`].
    pub fn build(&self) -> Result<Config, ConfigError> {
        let min_batch =
            (cairn_wire::batch::BATCH_HEADER_SIZE + cairn_wire::batch::FRAME_HEADER_SIZE + 1) as u64;
        // A send's batch is one op of its partition's replicated log: it must fit one.
        let batch_bytes_max = self.integer(
            "limits.batch_bytes_max",
            min_batch,
            crate::writer::BATCH_BYTES_LIMIT,
        )? as u32;
        let max_frame_bytes = self.integer("tcp.max_frame_bytes", 256, u32::MAX as u64)? as u32;
        let segment_size_bytes = self.integer("storage.segment_size_bytes", 4096, u32::MAX as u64)?;
        let config = Config {
            data_dir: PathBuf::from(self.text("data_dir")?),
            tcp_address: self.parsed("tcp.address")?,
            http_address: match self.text("http.address")?.trim() {
                "" => None,
                _ => Some(self.parsed("http.address")?),
            },
            max_frame_bytes,
            max_connections: self.integer("tcp.max_connections", 1, 1_000_000)? as u32,
            message_payload_bytes_max: self.integer("limits.message_payload_bytes_max", 1, u32::MAX as u64)?
                as u32,
            user_headers_bytes_max: self.integer("limits.user_headers_bytes_max", 0, u32::MAX as u64)? as u32,
            batch_bytes_max,
            batch_messages_max: self.integer("limits.batch_messages_max", 1, u32::MAX as u64)? as u32,
            segment_size_bytes,
            durability: match self.text("storage.durability")?.as_str() {
                "durable" => Durability::Durable,
                "relaxed" => Durability::Relaxed,
                other => {
                    return Err(self.invalid(
                        "storage.durability",
                        format!("`{other}` is not `durable` or `relaxed`"),
                    ));
                }
            },
            flush_interval_ms: self.integer("storage.flush_interval_ms", 1, FLUSH_INTERVAL_MS_MAX)?,
            retention_interval_ms: self.integer(
                "storage.retention_interval_ms",
                1,
                RETENTION_INTERVAL_MS_MAX,
            )?,
            scrub_interval_ms: self.integer("storage.scrub_interval_ms", 0, SCRUB_INTERVAL_MS_MAX)?,
            root_password: {
                let password = self.text("auth.root_password")?;
                if password.is_empty() {
                    None
                } else if !(3..=100).contains(&password.len()) {
                    return Err(self.invalid("auth.root_password", "must be 3 to 100 bytes long".to_string()));
                } else {
                    Some(password)
                }
            },
            cluster: self.cluster()?,
        };
        let mut config = config;
        if let Some(cluster) = &config.cluster
            && cluster.nodes.len() > 1
            && config.durability == Durability::Relaxed
        {
            // A backup counting an unsynced prepare as durable would break quorum
            // intersection after a power loss (`docs/replication.md`).
            return Err(self.invalid(
                "storage.durability",
                "`relaxed` is for a single node: in a cluster of several nodes every replica makes a prepare \
                 durable before it counts towards a quorum, so use `durable`"
                    .to_string(),
            ));
        }
        if let Some(cluster) = &config.cluster {
            // A node listens where the node list says clients and peers reach it, unless the
            // listen address is configured (behind NAT, or a host name that resolves elsewhere).
            let node = cluster.this_node();
            if self.raw("tcp.address").source_name == "default" {
                config.tcp_address = listen_address(&node.tcp);
            }
            if self.raw("http.address").source_name == "default" {
                config.http_address = (!node.http.is_empty()).then(|| listen_address(&node.http));
            }
        }
        // A frame must be able to carry the largest batch plus the send's metadata section.
        if (config.max_frame_bytes as u64) < config.batch_bytes_max as u64 + 256 + 1024 {
            return Err(self.invalid(
                "tcp.max_frame_bytes",
                format!(
                    "{} is too small for limits.batch_bytes_max = {} (needs at least batch + 1280 bytes)",
                    config.max_frame_bytes, config.batch_bytes_max
                ),
            ));
        }
        Ok(config)
    }

    /// The `[cluster]` table: `None` when there is none. Refused, naming the key: a node list
    /// without a `node_id` or secret, or either without a node list; more nodes than a group
    /// may have replicas; duplicate ids or addresses; a `node_id` the list does not name.
    fn cluster(&self) -> Result<Option<ClusterConfig>, ConfigError> {
        let node_id = self.text("cluster.node_id")?;
        let secret = self.text("cluster.secret")?;
        let Some((nodes, nodes_source)) = &self.cluster_nodes else {
            for key in ["cluster.node_id", "cluster.secret"] {
                if !self.text(key)?.is_empty() {
                    return Err(self.invalid(
                        key,
                        "is set, but the config file has no [[cluster.nodes]]: a cluster needs its node list"
                            .to_string(),
                    ));
                }
            }
            return Ok(None);
        };
        let nodes = parse_cluster_nodes(nodes, nodes_source)?;
        if node_id.is_empty() {
            return Err(self.invalid(
                "cluster.node_id",
                "missing: [[cluster.nodes]] is given, so this node's id must be too".to_string(),
            ));
        }
        let node_id: u32 = self.parsed("cluster.node_id")?;
        if !nodes.iter().any(|node| node.id == node_id) {
            let ids: Vec<String> = nodes.iter().map(|node| node.id.to_string()).collect();
            return Err(self.invalid(
                "cluster.node_id",
                format!(
                    "{node_id} is not the id of any [[cluster.nodes]] entry ({})",
                    ids.join(", ")
                ),
            ));
        }
        if secret.is_empty() {
            return Err(self.invalid(
                "cluster.secret",
                "missing: a cluster needs the replica network's shared secret (or CAIRN_CLUSTER_SECRET)"
                    .to_string(),
            ));
        }
        if secret.len() < CLUSTER_SECRET_BYTES_MIN {
            // The text of the secret is never put in a message.
            return Err(self.invalid(
                "cluster.secret",
                format!(
                    "is {} bytes long; it must be at least {CLUSTER_SECRET_BYTES_MIN}",
                    secret.len()
                ),
            ));
        }
        let transfer_bytes_per_second =
            self.integer("cluster.transfer_bytes_per_second", 1 << 20, 1 << 40)?;
        Ok(Some(ClusterConfig {
            node_id,
            nodes,
            secret: ClusterSecret(secret),
            transfer_bytes_per_second,
        }))
    }

    fn raw(&self, path: &str) -> &RawValue {
        // Every key in KEYS has a default, so a lookup of a known path cannot miss.
        &self.values[path]
    }

    fn invalid(&self, path: &str, reason: String) -> ConfigError {
        ConfigError::InvalidValue {
            key: path.to_string(),
            source_name: self.raw(path).source_name.clone(),
            reason,
        }
    }

    fn text(&self, path: &str) -> Result<String, ConfigError> {
        Ok(self.raw(path).text.clone())
    }

    fn parsed<T: std::str::FromStr>(&self, path: &str) -> Result<T, ConfigError>
    where
        T::Err: std::fmt::Display,
    {
        let raw = self.raw(path);
        raw.text
            .parse::<T>()
            .map_err(|e| self.invalid(path, format!("`{}`: {e}", raw.text)))
    }

    fn integer(&self, path: &str, min: u64, max: u64) -> Result<u64, ConfigError> {
        debug_assert_eq!(key(path).map(|k| k.kind), Some(ValueKind::Integer));
        let value: u64 = self.parsed(path)?;
        if value < min || value > max {
            return Err(self.invalid(path, format!("{value} is outside {min}..={max}")));
        }
        Ok(value)
    }
}

/// Parse and check the `[[cluster.nodes]]` array: each entry has exactly `id`, `tcp`,
/// `replica` and optionally `http`; ids and addresses are unique; 1 to
/// [`CLUSTER_NODES_MAX`] entries. Sorted by id.
fn parse_cluster_nodes(value: &toml::Value, source_name: &str) -> Result<Vec<ClusterNode>, ConfigError> {
    let invalid = |key: String, reason: String| ConfigError::InvalidValue {
        key,
        source_name: source_name.to_string(),
        reason,
    };
    let Some(entries) = value.as_array() else {
        return Err(invalid(
            "cluster.nodes".to_string(),
            format!("expected [[cluster.nodes]] tables, got {}", value.type_str()),
        ));
    };
    if entries.is_empty() || entries.len() > CLUSTER_NODES_MAX {
        return Err(invalid(
            "cluster.nodes".to_string(),
            format!(
                "lists {} nodes; a cluster has 1 to {CLUSTER_NODES_MAX}",
                entries.len()
            ),
        ));
    }
    let mut nodes: Vec<ClusterNode> = Vec::with_capacity(entries.len());
    for (index, entry) in entries.iter().enumerate() {
        let key = |field: &str| format!("cluster.nodes[{index}].{field}");
        let Some(table) = entry.as_table() else {
            return Err(invalid(
                format!("cluster.nodes[{index}]"),
                format!("expected a table, got {}", entry.type_str()),
            ));
        };
        if let Some(unknown) = table
            .keys()
            .find(|field| !["id", "tcp", "http", "replica"].contains(&field.as_str()))
        {
            return Err(ConfigError::UnknownKey {
                key: key(unknown),
                source_name: source_name.to_string(),
            });
        }
        let id = match table.get("id") {
            Some(toml::Value::Integer(id)) => u32::try_from(*id)
                .map_err(|_| invalid(key("id"), format!("{id} is outside 0..={}", u32::MAX)))?,
            Some(other) => {
                return Err(invalid(
                    key("id"),
                    format!("expected an integer, got {}", other.type_str()),
                ));
            }
            None => return Err(invalid(key("id"), "missing".to_string())),
        };
        let address = |field: &str, required: bool| -> Result<String, ConfigError> {
            match table.get(field) {
                Some(toml::Value::String(text)) => {
                    check_host_port(text).map_err(|reason| invalid(key(field), reason))?;
                    Ok(text.clone())
                }
                Some(other) => Err(invalid(
                    key(field),
                    format!("expected a string, got {}", other.type_str()),
                )),
                None if required => Err(invalid(key(field), "missing".to_string())),
                None => Ok(String::new()),
            }
        };
        let node = ClusterNode {
            id,
            tcp: address("tcp", true)?,
            http: address("http", false)?,
            replica: address("replica", true)?,
        };
        if nodes.iter().any(|other| other.id == id) {
            return Err(invalid(
                key("id"),
                format!("{id} is the id of an earlier entry too"),
            ));
        }
        nodes.push(node);
    }
    // Every address once, across nodes and kinds: two nodes (or two roles) on one address
    // would take each other's traffic.
    let mut seen: Vec<(String, String)> = Vec::new();
    for (index, node) in nodes.iter().enumerate() {
        for (field, text) in [
            ("tcp", &node.tcp),
            ("http", &node.http),
            ("replica", &node.replica),
        ] {
            if text.is_empty() {
                continue;
            }
            let key = format!("cluster.nodes[{index}].{field}");
            if let Some((_, first)) = seen.iter().find(|(seen, _)| seen.eq_ignore_ascii_case(text)) {
                return Err(invalid(key, format!("`{text}` is given as {first} too")));
            }
            seen.push((text.clone(), key));
        }
    }
    nodes.sort_by_key(|node| node.id);
    Ok(nodes)
}

/// `host:port` with a non-empty host (an IP, `[v6]`, or a name) and a port above 0.
fn check_host_port(text: &str) -> Result<(), String> {
    if let Ok(address) = text.parse::<SocketAddr>() {
        return match address.port() {
            0 => Err(format!("`{text}`: port 0 cannot be dialled")),
            _ => Ok(()),
        };
    }
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err(format!("`{text}` is not host:port"));
    };
    let host_ok = !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_');
    if !host_ok {
        return Err(format!("`{text}`: `{host}` is not an IP address or a host name"));
    }
    match port.parse::<u16>() {
        Ok(0) | Err(_) => Err(format!("`{text}`: `{port}` is not a port from 1 to 65535")),
        Ok(_) => Ok(()),
    }
}

/// The host (brackets of an IPv6 address removed) and port of a validated `host:port`;
/// `("", 0)` for an empty one (a node without HTTP).
pub fn split_host_port(host_port: &str) -> (&str, u16) {
    match host_port.rsplit_once(':') {
        Some((host, port)) => (
            host.trim_start_matches('[').trim_end_matches(']'),
            port.parse().unwrap_or(0),
        ),
        None => ("", 0),
    }
}

/// Where to listen for a `host:port` others dial: that address when it is an IP, every
/// interface on its port when it is a host name (which may resolve to an address this host
/// cannot bind, such as a Kubernetes service name).
pub fn listen_address(host_port: &str) -> SocketAddr {
    if let Ok(address) = host_port.parse::<SocketAddr>() {
        return address;
    }
    let (_, port) = split_host_port(host_port);
    debug_assert!(port != 0, "a validated address has a port");
    SocketAddr::from(([0, 0, 0, 0], port))
}

fn flatten(prefix: &str, value: &toml::Value, out: &mut Vec<(String, toml::Value)>) {
    match value {
        toml::Value::Table(table) => {
            for (k, v) in table {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&path, v, out);
            }
        }
        other => out.push((prefix.to_string(), other.clone())),
    }
}

/// The key table as text, for `--help` and the README.
pub fn describe_keys() -> String {
    let mut text = String::new();
    for k in KEYS {
        let default = if k.default.is_empty() { "(none)" } else { k.default };
        text.push_str(&format!(
            "  {:<34} {:<22} {}\n      default: {}\n",
            k.path,
            env_name(k.path),
            k.about,
            default
        ));
    }
    text
}

#[cfg(test)]
mod tests {

    /// The configuration in `deploy/kubernetes/cairn.yaml`'s ConfigMap is valid for every
    /// pod, with the node id and secret the StatefulSet puts in the environment, and listens
    /// on every interface (the node list holds the pods' DNS names).
    #[test]
    fn the_kubernetes_config_is_valid_for_every_pod() {
        let manifest = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kubernetes/cairn.yaml"),
        )
        .expect("the manifest");
        let mut lines = manifest.lines().skip_while(|line| line.trim() != "cairn.toml: |");
        assert!(lines.next().is_some(), "the ConfigMap holds cairn.toml");
        let toml: String = lines
            .take_while(|line| line.starts_with("    ") || line.trim().is_empty())
            .map(|line| format!("{}\n", line.get(4..).unwrap_or("")))
            .collect();
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("cairn.toml");
        std::fs::write(&path, toml).expect("write");
        for node_id in 1..=3u32 {
            let mut sources = Sources::defaults();
            sources.apply_file(&path).expect("the file is read");
            sources
                .apply_env([
                    ("CAIRN_CLUSTER_NODE_ID".to_string(), node_id.to_string()),
                    (
                        "CAIRN_CLUSTER_SECRET".to_string(),
                        "a secret of sixteen bytes or more".to_string(),
                    ),
                ])
                .expect("the environment is read");
            let config = sources.build().expect("valid");
            let cluster = config.cluster.expect("a [cluster] table");
            assert_eq!(cluster.node_id, node_id);
            assert_eq!(cluster.nodes.len(), 3);
            assert_eq!(config.tcp_address.to_string(), "0.0.0.0:8090");
            assert_eq!(
                listen_address(&cluster.this_node().replica).to_string(),
                "0.0.0.0:7090"
            );
        }
    }

    /// The three files of `deploy/local/` (README.md, "Run a three-node cluster") are valid
    /// and describe one cluster: the same list and secret, each node its own entry.
    #[test]
    fn the_local_three_node_configs_describe_one_cluster() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/local");
        let mut clusters = Vec::new();
        for node in 1..=3u32 {
            let mut sources = Sources::defaults();
            sources
                .apply_file(&dir.join(format!("node-{node}.toml")))
                .expect("the file is read");
            let config = sources.build().expect("the file is valid");
            let cluster = config.cluster.expect("a [cluster] table");
            assert_eq!(cluster.node_id, node);
            assert_eq!(config.tcp_address.to_string(), cluster.this_node().tcp);
            clusters.push(cluster);
        }
        assert!(clusters.iter().all(|cluster| cluster.nodes == clusters[0].nodes
            && cluster.secret == clusters[0].secret
            && cluster.cluster_id() == clusters[0].cluster_id()));
    }

    use super::*;

    #[test]
    fn defaults_build() {
        let config = Sources::defaults().build().expect("defaults are valid");
        assert_eq!(config.tcp_address.to_string(), "127.0.0.1:8090");
        assert_eq!(config.data_dir, PathBuf::from("./cairn-data"));
        assert_eq!(config.durability, Durability::Durable);
        assert_eq!(config.flush_interval_ms, 1000);
        assert!(config.root_password.is_none());
    }

    #[test]
    fn precedence_file_env_flag() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("cairn.toml");
        std::fs::write(
            &file,
            "data_dir = \"/from-file\"\n[tcp]\naddress = \"127.0.0.1:1\"\n",
        )
        .expect("write");
        let mut sources = Sources::defaults();
        sources.apply_file(&file).expect("file");
        sources
            .apply_env([("CAIRN_TCP_ADDRESS".to_string(), "127.0.0.1:2".to_string())])
            .expect("env");
        assert_eq!(sources.build().expect("valid").tcp_address.port(), 2);
        assert_eq!(
            sources.build().expect("valid").data_dir,
            PathBuf::from("/from-file")
        );
        sources
            .apply_flag("tcp.address", "127.0.0.1:3".to_string(), "--tcp-address")
            .expect("flag");
        assert_eq!(sources.build().expect("valid").tcp_address.port(), 3);
    }

    #[test]
    fn unknown_keys_are_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("cairn.toml");
        std::fs::write(&file, "[tcp]\nadress = \"x\"\n").expect("write");
        let mut sources = Sources::defaults();
        let error = sources.apply_file(&file).expect_err("unknown key");
        assert!(error.to_string().contains("tcp.adress"), "{error}");
        let error = sources
            .apply_env([("CAIRN_NOPE".to_string(), "1".to_string())])
            .expect_err("unknown env");
        assert!(error.to_string().contains("CAIRN_NOPE"), "{error}");
    }

    #[test]
    fn invalid_values_are_named() {
        let mut sources = Sources::defaults();
        sources
            .apply_env([(
                "CAIRN_STORAGE_SEGMENT_SIZE_BYTES".to_string(),
                "12abc".to_string(),
            )])
            .expect("known key");
        let error = sources.build().expect_err("invalid");
        assert!(
            error.to_string().contains("storage.segment_size_bytes"),
            "{error}"
        );
        let mut sources = Sources::defaults();
        sources
            .apply_flag("storage.durability", "sometimes".to_string(), "--set")
            .expect("known");
        let error = sources.build().expect_err("invalid");
        assert!(error.to_string().contains("storage.durability"), "{error}");
        let mut sources = Sources::defaults();
        sources
            .apply_flag("storage.flush_interval_ms", "0".to_string(), "--set")
            .expect("known");
        let error = sources.build().expect_err("zero interval");
        assert!(error.to_string().contains("storage.flush_interval_ms"), "{error}");
    }

    const THREE_NODES: &str = r#"
[cluster]
node_id = 2
secret = "0123456789abcdef-shared"
[[cluster.nodes]]
id = 1
tcp = "127.0.0.1:8091"
http = "127.0.0.1:3001"
replica = "127.0.0.1:7091"
[[cluster.nodes]]
id = 3
tcp = "cairn-2.cairn:8093"
replica = "cairn-2.cairn:7093"
[[cluster.nodes]]
id = 2
tcp = "127.0.0.2:8092"
http = "127.0.0.2:3002"
replica = "127.0.0.2:7092"
"#;

    /// Build from `toml` (a file) and `env`.
    fn build_from(toml: &str, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("cairn.toml");
        std::fs::write(&file, toml).expect("write");
        let mut sources = Sources::defaults();
        sources.apply_file(&file)?;
        sources.apply_env(env.iter().map(|(k, v)| (k.to_string(), v.to_string())))?;
        sources.build()
    }

    fn refused_key(toml: &str, env: &[(&str, &str)]) -> String {
        match build_from(toml, env) {
            Err(ConfigError::InvalidValue { key, .. } | ConfigError::UnknownKey { key, .. }) => key,
            other => panic!("expected a refusal naming a key, got {other:?}"),
        }
    }

    #[test]
    fn a_cluster_table_is_parsed_sorted_and_listens_where_its_entry_says() {
        let config = build_from(THREE_NODES, &[]).expect("valid");
        let cluster = config.cluster.as_ref().expect("cluster");
        assert_eq!(cluster.node_id, 2);
        let ids: Vec<u32> = cluster.nodes.iter().map(|node| node.id).collect();
        assert_eq!(ids, [1, 2, 3], "sorted by id: the position is the replica index");
        assert_eq!(cluster.this_node().replica, "127.0.0.2:7092");
        assert_eq!(cluster.nodes[2].http, "", "http is optional");
        assert_eq!(config.tcp_address.to_string(), "127.0.0.2:8092");
        assert_eq!(
            config.http_address.map(|a| a.to_string()).as_deref(),
            Some("127.0.0.2:3002")
        );

        // A host name listens on every interface at its port; an explicit address wins.
        let third = THREE_NODES.replace("node_id = 2", "node_id = 3");
        let config = build_from(&third, &[]).expect("valid");
        assert_eq!(config.tcp_address.to_string(), "0.0.0.0:8093");
        assert_eq!(config.http_address, None, "node 3 offers no HTTP");
        let config = build_from(&third, &[("CAIRN_TCP_ADDRESS", "127.0.0.1:9000")]).expect("valid");
        assert_eq!(config.tcp_address.to_string(), "127.0.0.1:9000");

        // The id and the secret may come from the environment (one file for every node).
        let shared = THREE_NODES
            .replace("node_id = 2\n", "")
            .replace("secret = \"0123456789abcdef-shared\"\n", "");
        let config = build_from(
            &shared,
            &[
                ("CAIRN_CLUSTER_NODE_ID", "1"),
                ("CAIRN_CLUSTER_SECRET", "from-the-environment"),
            ],
        )
        .expect("valid");
        assert_eq!(config.cluster.map(|c| c.node_id), Some(1));
        assert!(Sources::defaults().build().expect("valid").cluster.is_none());
    }

    #[test]
    fn cluster_misconfigurations_are_refused_by_key() {
        let cases: &[(&str, &str, &str)] = &[
            ("node_id = 2", "node_id = 4", "cluster.node_id"),
            ("node_id = 2\n", "", "cluster.node_id"),
            ("node_id = 2", "node_id = \"two\"", "cluster.node_id"),
            ("secret = \"0123456789abcdef-shared\"\n", "", "cluster.secret"),
            ("0123456789abcdef-shared", "short", "cluster.secret"),
            ("id = 3", "id = 1", "cluster.nodes[1].id"),
            ("id = 3", "id = -3", "cluster.nodes[1].id"),
            ("cairn-2.cairn:7093", "127.0.0.1:3001", "cluster.nodes[1].replica"),
            ("127.0.0.2:7092", "127.0.0.2:8092", "cluster.nodes[2].replica"),
            ("cairn-2.cairn:8093", "cairn-2.cairn", "cluster.nodes[1].tcp"),
            ("cairn-2.cairn:8093", "cairn-2.cairn:0", "cluster.nodes[1].tcp"),
            ("cairn-2.cairn:8093", "no spaces:8093", "cluster.nodes[1].tcp"),
            (
                "replica = \"cairn-2.cairn:7093\"\n",
                "",
                "cluster.nodes[1].replica",
            ),
            (
                "replica = \"cairn-2.cairn:7093\"",
                "replica = 7093",
                "cluster.nodes[1].replica",
            ),
            (
                "replica = \"cairn-2.cairn:7093\"",
                "replika = \"x:1\"",
                "cluster.nodes[1].replika",
            ),
        ];
        for (from, to, key) in cases {
            assert!(THREE_NODES.contains(from), "{from}");
            let toml = THREE_NODES.replacen(from, to, 1);
            assert_eq!(&refused_key(&toml, &[]), key, "{from} -> {to}");
        }
        let seven: String = (1..=7)
            .map(|id| format!("[[cluster.nodes]]\nid = {id}\ntcp = \"h{id}:1\"\nreplica = \"h{id}:2\"\n"))
            .collect();
        let toml = format!("[cluster]\nnode_id = 1\nsecret = \"0123456789abcdef\"\n{seven}");
        assert_eq!(refused_key(&toml, &[]), "cluster.nodes");
        // An id or a secret without a node list.
        assert_eq!(
            refused_key("", &[("CAIRN_CLUSTER_NODE_ID", "1")]),
            "cluster.node_id"
        );
        assert_eq!(
            refused_key("[cluster]\nsecret = \"0123456789abcdef\"\n", &[]),
            "cluster.secret"
        );
        assert_eq!(refused_key("", &[("CAIRN_CLUSTER_NODES", "1")]), "cluster.nodes");
        // The secret's text never appears in a refusal.
        let error = build_from(
            &THREE_NODES.replace("0123456789abcdef-shared", "tiny-secret"),
            &[],
        )
        .expect_err("short secret")
        .to_string();
        assert!(!error.contains("tiny-secret"), "{error}");
    }
}
