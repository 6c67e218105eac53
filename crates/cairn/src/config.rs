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

/// Upper bound of `storage.scrub_interval_ms` (thirty days).
pub const SCRUB_INTERVAL_MS_MAX: u64 = 30 * 86_400_000;

/// Upper bound of `storage.retention_interval_ms` (one day).
pub const RETENTION_INTERVAL_MS_MAX: u64 = 86_400_000;

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
            if name == TEST_CRASH_AT_ENV || name == TEST_FAIL_AT_ENV {
                // A test-only fault hook read where it fires (see the handler), not a key.
                continue;
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
        };
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
}
