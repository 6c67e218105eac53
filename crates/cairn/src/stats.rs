//! Figures for GetStats that do not come from the catalog: bytes read and written by clients,
//! and process / machine figures from `/proc` and `statvfs` (Linux; zero where unavailable).

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes of message batches served to polls since start.
static READ_BYTES: AtomicU64 = AtomicU64::new(0);
/// Bytes of message batches acknowledged to sends since start.
static WRITTEN_BYTES: AtomicU64 = AtomicU64::new(0);

pub fn record_read(bytes: usize) {
    READ_BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
}

pub fn record_written(bytes: usize) {
    WRITTEN_BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
}

pub fn read_bytes() -> u64 {
    READ_BYTES.load(Ordering::Relaxed)
}

pub fn written_bytes() -> u64 {
    WRITTEN_BYTES.load(Ordering::Relaxed)
}

/// Process and machine figures at one moment.
#[derive(Debug, Default, Clone, Copy)]
pub struct Machine {
    /// This process's CPU time over its run time, percent of one core (averaged since start).
    pub cpu_usage: f32,
    /// The machine's busy share of CPU time since boot, percent.
    pub total_cpu_usage: f32,
    /// Resident set size of this process.
    pub memory_usage: u64,
    pub total_memory: u64,
    pub available_memory: u64,
}

pub fn machine(run_time_us: u64) -> Machine {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    Machine {
        cpu_usage: process_cpu_percent(run_time_us),
        total_cpu_usage: total_cpu_percent(),
        memory_usage: kib_field(&status, "VmRSS:"),
        total_memory: kib_field(&meminfo, "MemTotal:"),
        available_memory: kib_field(&meminfo, "MemAvailable:"),
    }
}

/// `<name> <n> kB` in a `/proc` key-value file, in bytes (0 if absent).
fn kib_field(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|line| line.strip_prefix(name))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse::<u64>().ok())
        .map_or(0, |kib| kib.saturating_mul(1024))
}

fn process_cpu_percent(run_time_us: u64) -> f32 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the parenthesised command name: state is field 3, utime 14, stime 15.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |index: usize| fields.get(index).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    let cpu_ticks = ticks(11).saturating_add(ticks(12));
    // SAFETY: sysconf only reads a system constant.
    let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks_per_second <= 0 || run_time_us == 0 {
        return 0.0;
    }
    let cpu_seconds = cpu_ticks as f64 / ticks_per_second as f64;
    (cpu_seconds * 100.0 / (run_time_us as f64 / 1e6)) as f32
}

fn total_cpu_percent() -> f32 {
    let Ok(stat) = std::fs::read_to_string("/proc/stat") else {
        return 0.0;
    };
    let Some(line) = stat.lines().find(|line| line.starts_with("cpu ")) else {
        return 0.0;
    };
    let values: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    let total: u64 = values.iter().fold(0u64, |sum, v| sum.saturating_add(*v));
    // idle (4th) and iowait (5th) are not busy time.
    let idle = values
        .get(3)
        .copied()
        .unwrap_or(0)
        .saturating_add(values.get(4).copied().unwrap_or(0));
    if total == 0 {
        return 0.0;
    }
    (total.saturating_sub(idle) as f64 * 100.0 / total as f64) as f32
}

/// (free bytes available to the server, total bytes) of the filesystem holding `path`.
pub fn disk_space(path: &Path) -> (u64, u64) {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return (0, 0);
    };
    // SAFETY: `c_path` is a valid NUL-terminated string and `stat` a writable statvfs that
    // the call fills; nothing is retained after it returns.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) };
    if rc != 0 {
        return (0, 0);
    }
    let fragment = stat.f_frsize as u64;
    (
        (stat.f_bavail as u64).saturating_mul(fragment),
        (stat.f_blocks as u64).saturating_mul(fragment),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_fields_parse() {
        assert_eq!(
            kib_field("MemTotal:  16 kB\nMemFree: 3 kB\n", "MemFree:"),
            3 * 1024
        );
        assert_eq!(kib_field("MemTotal: 16 kB\n", "MemAvailable:"), 0);
        let figures = machine(1_000_000);
        assert!(figures.memory_usage > 0 && figures.total_memory >= figures.memory_usage);
        let (free, total) = disk_space(Path::new("/"));
        assert!(total > 0 && free <= total);
    }
}
