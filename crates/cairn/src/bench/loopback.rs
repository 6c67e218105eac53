//! `cairn bench ingest-ceiling` and `serve-ceiling`: the least CPU and time that moving a
//! batch through this kernel can cost, with no server in the way.
//!
//! Every actor is a pair of threads in this process joined by one loopback TCP connection:
//! a *client* thread (where the SDK would be) and a *server-side* thread (where Cairn would
//! be). Each does only what any server of the same design cannot avoid:
//!
//! - **ingest-ceiling** (one pair per `--producers`): the client writes a batch-sized block
//!   from one reused buffer; the server side reads it into one reused buffer, appends it to
//!   its own file and answers one byte. With `--durability durable` it first runs the two
//!   barriers of Cairn's durability contract: `fdatasync` of the data, then an in-place 4 KiB
//!   write of the frontier into a second file and its `fdatasync` (and then releases the page
//!   cache of the synced data behind the last few megabytes, as the journal does).
//! - **serve-ceiling** (one pair per `--consumers`): the client asks with one byte and reads
//!   the block into one reused buffer; the server side reads the block from its file in
//!   64 KiB pieces and checks its XXH3 (Cairn verifies every record it serves), then sends it
//!   with `sendfile`; `--unverified` leaves the check out, to measure what it costs. The
//!   files are written and synced before the measured phase, so they are in the page cache.
//!
//! The report gives the server-side threads' CPU (`getrusage(RUSAGE_THREAD)`; on loopback
//! the sender's CPU also carries the TCP receive processing, as a real server's does) and the
//! client threads' CPU separately: on a machine where both share the cores, their sum per GB
//! bounds the throughput. Files go in a fresh directory under `--server-data-parent` (default:
//! the temp dir), removed afterwards.

use super::report::Report;
use super::stats::{Kind, Sample};
use super::workload::{BenchArgs, DurabilityLabel, Pacer, Workload};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// The frontier slot the durable ingest floor rewrites in place after each data barrier.
const FRONTIER_SLOT_BYTES: usize = 4096;
/// The serving thread reads and hashes a block in pieces of this size.
const VERIFY_PIECE_BYTES: usize = 64 * 1024;

pub fn run(args: &BenchArgs) -> Result<Report, String> {
    debug_assert!(matches!(
        args.workload,
        Workload::IngestCeiling | Workload::ServeCeiling
    ));
    let dir = super::server::scratch_dir(args, "cairn-bench-loopback");
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let measured = measure(args, &dir);
    if let Err(error) = std::fs::remove_dir_all(&dir) {
        eprintln!("cairn bench: cannot remove {}: {error}", dir.display());
    }
    let measured = measured?;
    Ok(Report::of_ceiling(
        args,
        &dir,
        &measured.samples,
        measured.server_cpu_seconds,
        Some(measured.client_cpu_seconds),
    ))
}

struct Measured {
    samples: Vec<Sample>,
    server_cpu_seconds: f64,
    client_cpu_seconds: f64,
}

/// What one thread of a pair hands back: its samples (client side only) and its CPU seconds
/// over the measured phase.
type ThreadResult = Result<(Vec<Sample>, f64), String>;

fn measure(args: &BenchArgs, dir: &Path) -> Result<Measured, String> {
    let block_bytes = usize::try_from(args.batch_payload_bytes())
        .map_err(|_| "the batch size does not fit in memory".to_string())?;
    let pairs = match args.workload {
        Workload::ServeCeiling => args.consumers,
        _ => args.producers,
    };
    let timeout = Some(Duration::from_secs(args.request_timeout_s.max(1)));
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("cannot listen on loopback: {e}"))?;
    let address = listener.local_addr().map_err(|e| e.to_string())?;
    // Every thread of every pair, and this one: nothing is measured until all are set up.
    let start = Arc::new(Barrier::new(2 * pairs + 1));
    let epoch = Instant::now();
    let mut clients = Vec::with_capacity(pairs);
    let mut servers = Vec::with_capacity(pairs);
    for pair in 0..pairs {
        let client_stream =
            TcpStream::connect(address).map_err(|e| format!("cannot connect on loopback: {e}"))?;
        let (server_stream, _) = listener
            .accept()
            .map_err(|e| format!("cannot accept on loopback: {e}"))?;
        for stream in [&client_stream, &server_stream] {
            stream
                .set_nodelay(true)
                .and_then(|()| stream.set_read_timeout(timeout))
                .and_then(|()| stream.set_write_timeout(timeout))
                .map_err(|e| format!("cannot set up a loopback socket: {e}"))?;
        }
        let plan = PairPlan {
            data_path: dir.join(format!("pair-{pair}")),
            frontier_path: dir.join(format!("pair-{pair}.frontier")),
            block_bytes,
            blocks: args.batches,
            messages_per_block: u64::from(args.messages_per_batch),
            rate_limit: args.rate_limit,
            sync: args.durability == DurabilityLabel::Durable,
            verify: !args.unverified,
            seed: pair as u8,
        };
        let plan = Arc::new(plan);
        let (client_start, server_start, client_plan) = (start.clone(), start.clone(), plan.clone());
        match args.workload {
            Workload::ServeCeiling => {
                clients.push(std::thread::spawn(move || {
                    ask_blocks(&client_plan, client_stream, &client_start, epoch)
                }));
                servers.push(std::thread::spawn(move || {
                    serve_blocks(&plan, server_stream, &server_start)
                }));
            }
            _ => {
                clients.push(std::thread::spawn(move || {
                    send_blocks(&client_plan, client_stream, &client_start, epoch)
                }));
                servers.push(std::thread::spawn(move || {
                    store_blocks(&plan, server_stream, &server_start)
                }));
            }
        }
    }
    drop(listener);
    start.wait();
    let mut first_error = None;
    let mut join = |thread: std::thread::JoinHandle<ThreadResult>| match thread.join() {
        Ok(Ok(result)) => Some(result),
        Ok(Err(error)) => {
            first_error.get_or_insert(error);
            None
        }
        Err(_) => {
            first_error.get_or_insert("a loopback thread panicked".to_string());
            None
        }
    };
    let mut samples = Vec::new();
    let mut client_cpu_seconds = 0.0;
    for thread in clients {
        if let Some((mut taken, cpu)) = join(thread) {
            samples.append(&mut taken);
            client_cpu_seconds += cpu;
        }
    }
    let mut server_cpu_seconds = 0.0;
    for thread in servers {
        if let Some((_, cpu)) = join(thread) {
            server_cpu_seconds += cpu;
        }
    }
    match first_error {
        Some(error) => Err(error),
        None => Ok(Measured {
            samples,
            server_cpu_seconds,
            client_cpu_seconds,
        }),
    }
}

struct PairPlan {
    data_path: PathBuf,
    frontier_path: PathBuf,
    block_bytes: usize,
    blocks: u64,
    messages_per_block: u64,
    rate_limit: Option<u64>,
    /// Durable ingest: the data barrier and the frontier barrier after every block.
    sync: bool,
    /// Serve: read every block back and check its XXH3 before sending it.
    verify: bool,
    seed: u8,
}

impl PairPlan {
    /// Block `index`'s bytes: not all zeros and different per block and pair, so no layer
    /// below can skip, compress or deduplicate them.
    fn fill_block(&self, index: u64, block: &mut [u8]) {
        let salt = (index as u8).wrapping_mul(7).wrapping_add(self.seed);
        for (i, byte) in block.iter_mut().enumerate() {
            *byte = (i as u8).wrapping_mul(31).wrapping_add(salt);
        }
    }

    fn pacer(&self) -> Option<Pacer> {
        self.rate_limit
            .map(|rate| Pacer::for_blocks(rate, self.block_bytes))
    }
}

/// CPU seconds (user + system) of the calling thread.
fn thread_cpu_seconds() -> Result<f64, String> {
    // SAFETY: an all-zero rusage is a valid value of this plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes one rusage through a pointer to memory we own.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
    if rc != 0 {
        return Err(format!(
            "getrusage(RUSAGE_THREAD) failed: {}",
            std::io::Error::last_os_error()
        ));
    }
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Ok(seconds(usage.ru_utime) + seconds(usage.ru_stime))
}

fn sample(kind: Kind, plan: &PairPlan, began: Instant, epoch: Instant) -> Sample {
    Sample {
        kind,
        start_us: u64::try_from(began.duration_since(epoch).as_micros()).unwrap_or(u64::MAX),
        latency_us: u64::try_from(began.elapsed().as_micros()).unwrap_or(u64::MAX),
        messages: plan.messages_per_block,
        payload_bytes: plan.block_bytes as u64,
    }
}

/// Ingest, client side: send every block and wait for its one-byte answer.
fn send_blocks(plan: &PairPlan, mut stream: TcpStream, start: &Barrier, epoch: Instant) -> ThreadResult {
    let mut block = vec![0u8; plan.block_bytes];
    plan.fill_block(0, &mut block);
    let mut pacer = plan.pacer();
    let mut samples = Vec::with_capacity(usize::try_from(plan.blocks).unwrap_or(0).min(1 << 20));
    start.wait();
    let cpu_before = thread_cpu_seconds()?;
    let sender_start = Instant::now();
    let mut answer = [0u8; 1];
    for _ in 0..plan.blocks {
        if let Some(pacer) = pacer.as_mut() {
            pacer.sleep_until_due(sender_start, plan.block_bytes as u64);
        }
        let began = Instant::now();
        stream
            .write_all(&block)
            .and_then(|()| stream.read_exact(&mut answer))
            .map_err(|e| format!("ingest ceiling: sending a block: {e}"))?;
        samples.push(sample(Kind::Send, plan, began, epoch));
    }
    Ok((samples, thread_cpu_seconds()? - cpu_before))
}

/// Ingest, server side: receive every block, append it to the file (and run the two barriers
/// when durable), answer one byte.
fn store_blocks(plan: &PairPlan, mut stream: TcpStream, start: &Barrier) -> ThreadResult {
    let opened = open_for_ingest(plan);
    let mut block = vec![0u8; plan.block_bytes];
    let mut slot = [0u8; FRONTIER_SLOT_BYTES];
    // Everyone reaches the start, a thread whose set-up failed included, or the others would
    // wait for it forever; its peer then sees the connection close.
    start.wait();
    let (data, frontier) = opened?;
    let cpu_before = thread_cpu_seconds()?;
    let mut position = 0u64;
    let mut released = 0u64;
    for _ in 0..plan.blocks {
        stream
            .read_exact(&mut block)
            .map_err(|e| format!("ingest ceiling: receiving a block: {e}"))?;
        data.write_all_at(&block, position)
            .map_err(|e| format!("writing {}: {e}", plan.data_path.display()))?;
        position += plan.block_bytes as u64;
        if plan.sync {
            data.sync_data()
                .map_err(|e| format!("fdatasync {}: {e}", plan.data_path.display()))?;
            slot[..8].copy_from_slice(&position.to_le_bytes());
            frontier
                .write_all_at(&slot, 0)
                .and_then(|()| frontier.sync_data())
                .map_err(|e| format!("writing {}: {e}", plan.frontier_path.display()))?;
            super::disk::release_cache_behind(&data, position, &mut released);
        }
        stream
            .write_all(&[1])
            .map_err(|e| format!("ingest ceiling: answering: {e}"))?;
    }
    Ok((Vec::new(), thread_cpu_seconds()? - cpu_before))
}

/// The data file, and the frontier file with its slot already on disk (so the measured
/// frontier writes overwrite in place, as Cairn's do).
fn open_for_ingest(plan: &PairPlan) -> Result<(File, File), String> {
    let create = |path: &Path| {
        OpenOptions::new()
            .create_new(true)
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| format!("cannot create {}: {e}", path.display()))
    };
    let data = create(&plan.data_path)?;
    let frontier = create(&plan.frontier_path)?;
    frontier
        .write_all_at(&[0u8; FRONTIER_SLOT_BYTES], 0)
        .and_then(|()| frontier.sync_all())
        .map_err(|e| format!("writing {}: {e}", plan.frontier_path.display()))?;
    Ok((data, frontier))
}

/// Serve, client side: ask for every block with one byte and read it whole.
fn ask_blocks(plan: &PairPlan, mut stream: TcpStream, start: &Barrier, epoch: Instant) -> ThreadResult {
    let mut block = vec![0u8; plan.block_bytes];
    let mut samples = Vec::with_capacity(usize::try_from(plan.blocks).unwrap_or(0).min(1 << 20));
    start.wait();
    let cpu_before = thread_cpu_seconds()?;
    for _ in 0..plan.blocks {
        let began = Instant::now();
        stream
            .write_all(&[1])
            .and_then(|()| stream.read_exact(&mut block))
            .map_err(|e| format!("serve ceiling: reading a block: {e}"))?;
        samples.push(sample(Kind::Poll, plan, began, epoch));
    }
    Ok((samples, thread_cpu_seconds()? - cpu_before))
}

/// Serve, server side: per request, read the block back, check its XXH3, `sendfile` it.
fn serve_blocks(plan: &PairPlan, mut stream: TcpStream, start: &Barrier) -> ThreadResult {
    let prepared = write_blocks_to_serve(plan);
    let mut scratch = vec![0u8; VERIFY_PIECE_BYTES.min(plan.block_bytes)];
    start.wait();
    let (file, checksums) = prepared?;
    let cpu_before = thread_cpu_seconds()?;
    let mut request = [0u8; 1];
    for (index, expected) in checksums.iter().enumerate() {
        stream
            .read_exact(&mut request)
            .map_err(|e| format!("serve ceiling: reading a request: {e}"))?;
        let position = index as u64 * plan.block_bytes as u64;
        if plan.verify {
            verify_block(plan, &file, position, *expected, &mut scratch)
                .map_err(|reason| format!("{}: block {index}: {reason}", plan.data_path.display()))?;
        }
        send_file(&stream, &file, position, plan.block_bytes)
            .map_err(|e| format!("serve ceiling: sendfile: {e}"))?;
    }
    Ok((Vec::new(), thread_cpu_seconds()? - cpu_before))
}

/// Read block at `position` back and check its XXH3 against `expected`.
fn verify_block(
    plan: &PairPlan,
    file: &File,
    position: u64,
    expected: u64,
    scratch: &mut [u8],
) -> Result<(), String> {
    // In cache-sized pieces: the bytes are hashed while they are still in the L2 cache, which
    // measured about a fifth cheaper here than one read of the whole block.
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    let mut done = 0;
    while done < plan.block_bytes {
        let piece = &mut scratch[..VERIFY_PIECE_BYTES.min(plan.block_bytes - done)];
        file.read_exact_at(piece, position + done as u64)
            .map_err(|e| format!("cannot read it back: {e}"))?;
        hasher.update(piece);
        done += piece.len();
    }
    if hasher.digest() != expected {
        return Err("does not match its checksum".to_string());
    }
    Ok(())
}

/// The file to serve, written and synced (not measured), and each block's XXH3.
fn write_blocks_to_serve(plan: &PairPlan) -> Result<(File, Vec<u64>), String> {
    let file = OpenOptions::new()
        .create_new(true)
        .read(true)
        .write(true)
        .open(&plan.data_path)
        .map_err(|e| format!("cannot create {}: {e}", plan.data_path.display()))?;
    let mut block = vec![0u8; plan.block_bytes];
    let mut checksums = Vec::with_capacity(usize::try_from(plan.blocks).unwrap_or(0).min(1 << 20));
    for index in 0..plan.blocks {
        plan.fill_block(index, &mut block);
        file.write_all_at(&block, index * plan.block_bytes as u64)
            .map_err(|e| format!("writing {}: {e}", plan.data_path.display()))?;
        checksums.push(xxhash_rust::xxh3::xxh3_64(&block));
    }
    file.sync_data()
        .map_err(|e| format!("fdatasync {}: {e}", plan.data_path.display()))?;
    Ok((file, checksums))
}

/// `sendfile` `len` bytes of `file` from `position` to the socket.
fn send_file(stream: &TcpStream, file: &File, position: u64, len: usize) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let mut offset = libc::off_t::try_from(position).map_err(|_| std::io::ErrorKind::InvalidInput)?;
    let mut left = len;
    while left > 0 {
        // SAFETY: both descriptors are open for the whole call and `offset` is ours.
        let sent = unsafe { libc::sendfile(stream.as_raw_fd(), file.as_raw_fd(), &mut offset, left) };
        match sent {
            -1 => {
                let error = std::io::Error::last_os_error();
                if error.kind() != std::io::ErrorKind::Interrupted {
                    return Err(error);
                }
            }
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            sent => left -= sent as usize,
        }
    }
    Ok(())
}
