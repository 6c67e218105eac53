//! `--start-server`: a `cairn serve` child on a fresh temporary data directory with ephemeral
//! ports; and the server CPU time from `/proc/<pid>/stat`.

use super::workload::BenchArgs;
use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

const READY_TIMEOUT: Duration = Duration::from_secs(60);
const STOP_TIMEOUT: Duration = Duration::from_secs(120);
const STDERR_TAIL_LINES: usize = 50;

pub struct StartedServer {
    child: Option<Child>,
    pub address: String,
    pub pid: u32,
    data_dir: PathBuf,
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
}

impl StartedServer {
    pub fn start(args: &BenchArgs, password: &str) -> Result<StartedServer, String> {
        let binary = match &args.server_binary {
            Some(path) => path.clone(),
            None => std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?,
        };
        let data_dir = scratch_dir(args, "cairn-bench");
        let mut command = Command::new(&binary);
        // The server refuses unknown CAIRN_* variables, and the bench's server must not pick up
        // settings from the environment by accident: it sees exactly what is passed here.
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("CAIRN_") {
                command.env_remove(&name);
            }
        }
        command
            .arg("serve")
            .arg("--data-dir")
            .arg(&data_dir)
            .args(["--tcp-address", "127.0.0.1:0", "--http-address", ""])
            .args(["--durability", args.durability.name()])
            .env("CAIRN_ROOT_PASSWORD", password)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for set in &args.server_set {
            command.arg("--set").arg(set);
        }
        let mut child = command
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", binary.display()))?;
        let pid = child.id();
        let stderr_tail = Arc::new(Mutex::new(VecDeque::new()));
        if let Some(stderr) = child.stderr.take() {
            let tail = stderr_tail.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    let mut tail = tail.lock().unwrap_or_else(|p| p.into_inner());
                    if tail.len() >= STDERR_TAIL_LINES {
                        tail.pop_front();
                    }
                    tail.push_back(line);
                }
            });
        }
        let (tx, rx) = mpsc::channel::<String>();
        if let Some(stdout) = child.stdout.take() {
            std::thread::spawn(move || {
                // Keep draining after the ready line so the child never blocks on a full pipe.
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    let _ = tx.send(line);
                }
            });
        }
        let mut server = StartedServer {
            child: Some(child),
            address: String::new(),
            pid,
            data_dir,
            stderr_tail,
        };
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some(rest) = line.strip_prefix("CAIRN_READY ")
                        && let Some(address) = rest.split_whitespace().find_map(|kv| kv.strip_prefix("tcp="))
                    {
                        server.address = address.to_string();
                        return Ok(server);
                    }
                }
                Err(_) => {
                    let tail = server.tail();
                    server.stop();
                    return Err(format!(
                        "the server did not print CAIRN_READY within {READY_TIMEOUT:?}; its stderr:\n{tail}"
                    ));
                }
            }
        }
    }

    pub fn tail(&self) -> String {
        let tail = self.stderr_tail.lock().unwrap_or_else(|p| p.into_inner());
        tail.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    /// Clean stop (SIGTERM, bounded wait, then SIGKILL) and removal of the data directory.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: kill(2) on the pid of a child this process started and has not reaped.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            let deadline = Instant::now() + STOP_TIMEOUT;
            loop {
                match child.try_wait() {
                    Ok(Some(_)) => break,
                    Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                    _ => {
                        eprintln!("cairn bench: the server did not stop within {STOP_TIMEOUT:?}; killing it");
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                }
            }
        }
        if self.data_dir.exists()
            && let Err(error) = std::fs::remove_dir_all(&self.data_dir)
        {
            eprintln!("cairn bench: cannot remove {}: {error}", self.data_dir.display());
        }
    }
}

impl Drop for StartedServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A fresh directory path (not created) under `--server-data-parent` or the temp dir:
/// `<prefix>-<pid>-<nanoseconds>`.
pub fn scratch_dir(args: &BenchArgs, prefix: &str) -> PathBuf {
    let parent = args.server_data_parent.clone().unwrap_or_else(std::env::temp_dir);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    parent.join(format!("{prefix}-{}-{nanos}", std::process::id()))
}

/// User plus system CPU time of a process, from `/proc/<pid>/stat`.
pub fn process_cpu_seconds(pid: u32) -> Result<f64, String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_err(|e| format!("cannot read /proc/{pid}/stat: {e}"))?;
    let ticks = cpu_ticks_from_stat(&stat).ok_or_else(|| format!("cannot parse /proc/{pid}/stat"))?;
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let per_second = if per_second > 0 { per_second as f64 } else { 100.0 };
    Ok(ticks as f64 / per_second)
}

/// Bytes a process caused to be sent to the storage layer so far: `write_bytes` of
/// `/proc/<pid>/io` (counted when pages are dirtied, so a page rewritten after writeback
/// counts again, as the device sees it). `Ok(None)` when the kernel keeps no such
/// accounting.
pub fn process_write_bytes(pid: u32) -> Result<Option<u64>, String> {
    let io = match std::fs::read_to_string(format!("/proc/{pid}/io")) {
        Ok(io) => io,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(format!("cannot read /proc/{pid}/io: {error}")),
    };
    Ok(write_bytes_from_io(&io))
}

/// The `write_bytes:` field of a `/proc/<pid>/io` text.
pub fn write_bytes_from_io(io: &str) -> Option<u64> {
    io.lines()
        .find_map(|line| line.strip_prefix("write_bytes:"))
        .and_then(|value| value.trim().parse().ok())
}

/// utime + stime (fields 14 and 15) of a `/proc/<pid>/stat` line. The command name (field 2)
/// may contain spaces and parentheses, so fields are counted after its last `)`.
pub fn cpu_ticks_from_stat(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_whitespace();
    // After the name: field 3 (state) is the first; utime is field 14, i.e. the 12th here.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_after_a_name_with_spaces() {
        let stat = "1234 (my (odd) name) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 4 0";
        assert_eq!(cpu_ticks_from_stat(stat), Some(300));
        assert_eq!(cpu_ticks_from_stat("garbage"), None);
        assert_eq!(cpu_ticks_from_stat("1 (x) S 1"), None);
    }

    #[test]
    fn write_bytes_field_of_proc_io() {
        let io = "rchar: 10\nwchar: 20\nsyscr: 1\nsyscw: 2\nread_bytes: 4096\nwrite_bytes: 8192\ncancelled_write_bytes: 0\n";
        assert_eq!(write_bytes_from_io(io), Some(8192));
        assert_eq!(write_bytes_from_io("rchar: 1\n"), None);
        assert!(process_write_bytes(std::process::id()).is_ok());
    }

    #[test]
    fn own_cpu_time_is_readable() {
        let seconds = process_cpu_seconds(std::process::id()).expect("own stat");
        assert!(seconds >= 0.0);
    }
}
