//! `cairn bench disk-ceiling`: what the disk under the data directory can do for the same
//! shape, with no server in the way.
//!
//! Every producer is a thread with its own file that writes `--batches` blocks of one batch's
//! payload size (`--messages-per-batch` × `--message-size`) back to back, each write followed
//! by `fdatasync`: the barrier a durable send needs, at the same size and concurrency, minus
//! everything else (network, validation, record framing, the frontier publication). Run in
//! the same session as a durable shape, it tells how much of the gap to a target is the
//! device's. After each barrier a writer releases the page cache of its synced bytes behind
//! the last few megabytes, as the storage journal does for a segment, so the writes cost
//! what the server's cost. `--rate-limit` paces each writer like a producer. `--durability relaxed` leaves
//! the fdatasync out (buffered writes only). Files go in a fresh directory under
//! `--server-data-parent` (default: the temp dir), removed afterwards.
//!
//! The report's CPU figure is this process's own CPU time over the writes (threads creating
//! their blocks excluded): the cost of moving the bytes through the kernel's write path,
//! which a server writing through the page cache pays too, whatever else it does.

use super::report::Report;
use super::stats::{Kind, Sample};
use super::workload::DurabilityLabel;
use super::workload::{BenchArgs, Pacer};
use cairn_storage::journal;
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::time::Instant;

pub fn run(args: &BenchArgs) -> Result<Report, String> {
    let dir = super::server::scratch_dir(args, "cairn-bench-disk");
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let measured = measure(args, &dir);
    let cpu_after = super::server::process_cpu_seconds(std::process::id());
    if let Err(error) = std::fs::remove_dir_all(&dir) {
        eprintln!("cairn bench: cannot remove {}: {error}", dir.display());
    }
    let (samples, cpu_before) = measured?;
    let cpu_seconds = (cpu_after? - cpu_before).max(0.0);
    Ok(Report::of_ceiling(args, &dir, &samples, cpu_seconds, None))
}

/// The samples of every writer, and this process's CPU seconds when all writers were ready.
fn measure(args: &BenchArgs, dir: &Path) -> Result<(Vec<Sample>, f64), String> {
    let block_bytes = usize::try_from(args.batch_payload_bytes())
        .map_err(|_| "the batch size does not fit in memory".to_string())?;
    // The writers and this thread: the CPU clock is read once every block is built.
    let start = Arc::new(Barrier::new(args.producers + 1));
    let epoch = Instant::now();
    let mut threads = Vec::with_capacity(args.producers);
    for writer in 0..args.producers {
        let path = dir.join(format!("writer-{writer}"));
        let start = start.clone();
        let plan = WriterPlan {
            path,
            block_bytes,
            blocks: args.batches,
            messages_per_block: u64::from(args.messages_per_batch),
            rate_limit: args.rate_limit,
            sync: args.durability == DurabilityLabel::Durable,
            seed: writer as u8,
        };
        threads.push(std::thread::spawn(move || write_blocks(&plan, &start, epoch)));
    }
    start.wait();
    let cpu_before = super::server::process_cpu_seconds(std::process::id());
    let mut samples = Vec::new();
    let mut first_error = None;
    for thread in threads {
        match thread.join() {
            Ok(Ok(mut written)) => samples.append(&mut written),
            Ok(Err(error)) => {
                first_error.get_or_insert(error);
            }
            Err(_) => {
                first_error.get_or_insert("a disk writer panicked".to_string());
            }
        }
    }
    match first_error {
        Some(error) => Err(error),
        None => Ok((samples, cpu_before?)),
    }
}

struct WriterPlan {
    path: PathBuf,
    block_bytes: usize,
    blocks: u64,
    messages_per_block: u64,
    rate_limit: Option<u64>,
    /// fdatasync after every block (durable) or not (relaxed).
    sync: bool,
    seed: u8,
}

/// After a barrier made the first `synced_bytes` of `file` stable, release their page cache
/// by the storage journal's rule for a segment ([`journal::cache_release_range`]), so that a
/// ceiling costs what the server's writes cost. `released` is how far it has released so far.
pub(super) fn release_cache_behind(file: &std::fs::File, synced_bytes: u64, released: &mut u64) {
    if let Some((position_bytes, len_bytes)) = journal::cache_release_range(*released, synced_bytes) {
        cairn_storage::io::release_cached_range(file, position_bytes, len_bytes);
        *released = position_bytes + len_bytes;
    }
}

/// One writer: `blocks` × (pwrite of `block_bytes` at the end + fdatasync), each timed.
fn write_blocks(plan: &WriterPlan, start: &Barrier, epoch: Instant) -> Result<Vec<Sample>, String> {
    let opened = OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(&plan.path)
        .map_err(|e| format!("cannot create {}: {e}", plan.path.display()));
    // Not all zeros, so no layer below can skip or compress the writes.
    let block: Vec<u8> = (0..plan.block_bytes)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(plan.seed))
        .collect();
    let mut pacer = plan
        .rate_limit
        .map(|rate| Pacer::for_blocks(rate, plan.block_bytes));
    let mut samples = Vec::with_capacity(usize::try_from(plan.blocks).unwrap_or(0));
    // Everyone reaches the start, a writer that failed to open included, or the others
    // would wait for it forever.
    start.wait();
    let file = opened?;
    let writer_start = Instant::now();
    let mut position = 0u64;
    let mut released = 0u64;
    for _ in 0..plan.blocks {
        if let Some(pacer) = pacer.as_mut() {
            pacer.sleep_until_due(writer_start, plan.block_bytes as u64);
        }
        let began = Instant::now();
        file.write_all_at(&block, position)
            .and_then(|()| if plan.sync { file.sync_data() } else { Ok(()) })
            .map_err(|e| format!("writing {}: {e}", plan.path.display()))?;
        let latency = began.elapsed();
        position += plan.block_bytes as u64;
        if plan.sync {
            release_cache_behind(&file, position, &mut released);
        }
        samples.push(Sample {
            kind: Kind::Send,
            start_us: u64::try_from(began.duration_since(epoch).as_micros()).unwrap_or(u64::MAX),
            latency_us: u64::try_from(latency.as_micros()).unwrap_or(u64::MAX),
            messages: plan.messages_per_block,
            payload_bytes: plan.block_bytes as u64,
        });
    }
    Ok(samples)
}
