//! Shared harness for the Cairn integration tests.
//!
//! * [`TestServer`] launches the real `cairn` binary (`cairn serve --data-dir <dir>
//!   --tcp-address 127.0.0.1:0 --http-address 127.0.0.1:0`, root password from
//!   `CAIRN_ROOT_PASSWORD`) and waits for the `CAIRN_READY tcp=<addr> http=<addr>` line on stdout.
//! * [`sdk_client`] / [`root_client`] build `iggy 0.11.0` SDK clients against it.
//! * [`RawConn`] speaks the VSR-framed wire protocol by hand (256-byte headers, §2 of the
//!   protocol reference) for the behaviours the SDK hides.
//! * The `enc` / `batch` / `poll` helpers encode request bodies and decode reply bodies.

#![allow(dead_code)]

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use iggy::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub const ROOT_USER: &str = "iggy";
pub const ROOT_PASSWORD: &str = "cairn-test-Secret-1";
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);
pub const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound for any single raw reply.
pub const RAW_REPLY_TIMEOUT: Duration = Duration::from_secs(10);

// ------------------------------------------------------------------------------------------
// Server process
// ------------------------------------------------------------------------------------------

pub struct TestServer {
    child: Option<Child>,
    addr: SocketAddr,
    /// `None` when the server runs without HTTP (`http=off`).
    http_addr: Option<SocketAddr>,
    data_dir: PathBuf,
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
}

impl TestServer {
    /// Start `cairn serve` on `data_dir` with the default test password and no extra args.
    pub fn start(data_dir: &Path) -> TestServer {
        Self::start_with(data_dir, &[], &[])
    }

    /// Start with extra command-line arguments (e.g. `--segment-size-bytes 4096`) and extra
    /// environment variables.
    pub fn start_with(data_dir: &Path, extra_args: &[&str], extra_env: &[(&str, &str)]) -> TestServer {
        let dir = data_dir.to_str().expect("utf-8 data dir");
        // Port 0 for HTTP too, so parallel test servers never collide on the default port.
        let mut args = vec![
            "--data-dir",
            dir,
            "--tcp-address",
            "127.0.0.1:0",
            "--http-address",
            "127.0.0.1:0",
        ];
        args.extend_from_slice(extra_args);
        Self::start_args(data_dir, &args, extra_env)
    }

    /// Start `cairn serve <args…>` with exactly the given arguments (no implicit
    /// `--data-dir` / `--tcp-address`); `data_dir` is only recorded.
    pub fn start_args(data_dir: &Path, args: &[&str], extra_env: &[(&str, &str)]) -> TestServer {
        let bin = env!("CARGO_BIN_EXE_cairn");
        let mut cmd = Command::new(bin);
        // The server refuses unknown CAIRN_* variables; a test's own settings (e.g.
        // CAIRN_SOAK_CYCLES) must not leak into it. Only what the harness passes is seen.
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("CAIRN_") {
                cmd.env_remove(&name);
            }
        }
        cmd.arg("serve")
            .args(args)
            .env("CAIRN_ROOT_PASSWORD", ROOT_PASSWORD)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in extra_env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("failed to spawn {bin}: {e}"));

        // Stderr: forward every line (shown by the test harness on failure) and keep a tail.
        let stderr_tail = Arc::new(Mutex::new(VecDeque::new()));
        let stderr = child.stderr.take().expect("stderr piped");
        {
            let tail = stderr_tail.clone();
            std::thread::spawn(move || {
                let reader = BufReader::new(stderr);
                for line in reader.lines() {
                    let Ok(line) = line else { break };
                    eprintln!("[cairn] {line}");
                    let mut t = tail.lock().unwrap();
                    if t.len() >= 200 {
                        t.pop_front();
                    }
                    t.push_back(line);
                }
            });
        }

        // Stdout: forward lines to the waiting thread; keep draining afterwards.
        let stdout = child.stdout.take().expect("stdout piped");
        let (tx, rx) = mpsc::channel::<String>();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            loop {
                line.clear();
                match reader.read_line(&mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        let l = line.trim_end().to_string();
                        eprintln!("[cairn stdout] {l}");
                        let _ = tx.send(l);
                    }
                }
            }
            // Drain anything left so the child never blocks on a full pipe.
            let mut sink = Vec::new();
            let _ = reader.read_to_end(&mut sink);
        });

        let deadline = Instant::now() + READY_TIMEOUT;
        let (addr, http_addr) = loop {
            let now = Instant::now();
            if now >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "cairn did not print CAIRN_READY within {READY_TIMEOUT:?}; stderr tail:\n{}",
                    tail_string(&stderr_tail)
                );
            }
            match rx.recv_timeout(deadline - now) {
                Ok(line) => {
                    if let Some(rest) = line.strip_prefix("CAIRN_READY ") {
                        let addr = rest
                            .split_whitespace()
                            .find_map(|kv| kv.strip_prefix("tcp="))
                            .unwrap_or_else(|| panic!("CAIRN_READY line without tcp=: {line:?}"));
                        let http_addr = rest
                            .split_whitespace()
                            .find_map(|kv| kv.strip_prefix("http="))
                            .and_then(|a| a.parse::<SocketAddr>().ok());
                        break (
                            addr.parse::<SocketAddr>()
                                .unwrap_or_else(|e| panic!("bad address in {line:?}: {e}")),
                            http_addr,
                        );
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = child.wait();
                    panic!(
                        "cairn exited before CAIRN_READY ({status:?}); stderr tail:\n{}",
                        tail_string(&stderr_tail)
                    );
                }
            }
        };
        assert_ne!(addr.port(), 0, "server reported port 0");

        TestServer {
            child: Some(child),
            addr,
            http_addr,
            data_dir: data_dir.to_path_buf(),
            stderr_tail,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The HTTP address from the readiness line (panics if the server runs without HTTP).
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr.expect("server started without HTTP (http=off)")
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("server running").id()
    }

    /// The last stderr lines (for failure messages).
    pub fn logs(&self) -> String {
        tail_string(&self.stderr_tail)
    }

    /// Wait until a log line holding `needle` has been read from the server's stderr (another
    /// thread reads it, so a line the server wrote before answering a request may arrive
    /// after the answer), at most `within`. Whether it came.
    pub async fn wait_for_log(&self, needle: &str, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while !self.logs().contains(needle) {
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        true
    }

    /// True if the process has not exited.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            None => false,
            Some(c) => matches!(c.try_wait(), Ok(None)),
        }
    }

    /// Clean stop (SIGTERM), asserting exit 0, then `cairn check` on the data directory: every
    /// data directory a test leaves behind after a clean stop must verify as healthy.
    pub fn stop(mut self) {
        let status = self.terminate();
        assert!(
            status.success(),
            "cairn did not exit cleanly after SIGTERM: {status:?}; stderr tail:\n{}",
            self.logs()
        );
        assert_check_healthy(&self.data_dir);
    }

    /// SIGTERM and wait; returns the exit status.
    pub fn terminate(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("server running");
        let pid = child.id() as libc::pid_t;
        // SAFETY: plain kill(2) on our own child process id.
        let rc = unsafe { libc::kill(pid, libc::SIGTERM) };
        assert_eq!(rc, 0, "kill(SIGTERM) failed");
        match wait_bounded(&mut child, STOP_TIMEOUT) {
            Some(status) => status,
            None => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "cairn did not exit within {STOP_TIMEOUT:?} of SIGTERM; stderr tail:\n{}",
                    self.logs()
                );
            }
        }
    }

    /// Crash: SIGKILL and wait.
    pub fn kill(mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn wait_bounded(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) => {}
            Err(_) => return None,
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn tail_string(tail: &Arc<Mutex<VecDeque<String>>>) -> String {
    tail.lock()
        .unwrap()
        .iter()
        .cloned()
        .collect::<Vec<_>>()
        .join("\n")
}

pub fn temp_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("cairn-it-")
        .tempdir()
        .expect("tempdir")
}

// ------------------------------------------------------------------------------------------
// SDK clients
// ------------------------------------------------------------------------------------------

/// A connected (not logged-in) SDK client. Reconnection is off so that a broken server makes
/// the test fail fast instead of retrying forever.
pub async fn sdk_client(addr: SocketAddr) -> IggyClient {
    let config = TcpClientConfig {
        server_address: addr.to_string(),
        reconnection: TcpClientReconnectionConfig {
            enabled: false,
            ..Default::default()
        },
        ..Default::default()
    };
    let tcp = TcpClient::create(Arc::new(config)).expect("TcpClient::create");
    let client = IggyClient::new(ClientWrapper::Tcp(tcp));
    tokio::time::timeout(Duration::from_secs(10), client.connect())
        .await
        .expect("connect timed out")
        .expect("connect failed");
    client
}

/// A connected client logged in as root.
pub async fn root_client(addr: SocketAddr) -> IggyClient {
    let client = sdk_client(addr).await;
    tokio::time::timeout(
        Duration::from_secs(30),
        client.login_user(ROOT_USER, ROOT_PASSWORD),
    )
    .await
    .expect("login timed out")
    .expect("root login failed");
    client
}

pub fn id_num(v: u32) -> Identifier {
    Identifier::numeric(v).unwrap()
}

pub fn id_name(v: &str) -> Identifier {
    Identifier::named(v).unwrap()
}

pub fn topic_opts(partitions: u32) -> TopicCreateOptions {
    TopicCreateOptions {
        partitions_count: Some(partitions),
        ..Default::default()
    }
}

/// Assert that `result` failed with the given Iggy error code.
#[track_caller]
pub fn assert_code<T: std::fmt::Debug>(result: Result<T, IggyError>, code: u32) {
    match result {
        Ok(v) => panic!("expected error code {code}, got Ok({v:?})"),
        Err(e) => assert_eq!(e.as_code(), code, "expected error code {code}, got {e:?} ({e})"),
    }
}

pub fn now_micros() -> u64 {
    IggyTimestamp::now().as_micros()
}

// ------------------------------------------------------------------------------------------
// Wire constants
// ------------------------------------------------------------------------------------------

pub const HEADER_SIZE: usize = 256;
pub const CMD_REQUEST: u8 = 5;
pub const CMD_REPLY: u8 = 8;
pub const CMD_EVICTION: u8 = 13;
pub const PROTOCOL_VERSION: u32 = 0x2C00;

pub mod op {
    pub const REGISTER: u8 = 1;
    pub const NON_REPLICATED: u8 = 2;
    pub const LOGOUT: u8 = 3;
    pub const CREATE_STREAM: u8 = 128;
    pub const CREATE_TOPIC: u8 = 132;
    pub const DELETE_SEGMENTS: u8 = 138;
    pub const SEND_MESSAGES: u8 = 160;
    pub const STORE_CONSUMER_OFFSET: u8 = 161;
    pub const DELETE_CONSUMER_OFFSET: u8 = 162;
}

pub mod code {
    pub const PING: u32 = 1;
    pub const GET_STATS: u32 = 10;
    pub const GET_CLUSTER_METADATA: u32 = 12;
    pub const GET_ME: u32 = 20;
    pub const GET_CLIENT: u32 = 21;
    pub const GET_USER: u32 = 31;
    pub const LOGOUT: u32 = 39;
    pub const CREATE_PAT: u32 = 42;
    pub const POLL_MESSAGES: u32 = 100;
    pub const SEND_MESSAGES: u32 = 101;
    pub const GET_CONSUMER_OFFSET: u32 = 120;
    pub const STORE_CONSUMER_OFFSET: u32 = 121;
    pub const DELETE_CONSUMER_OFFSET: u32 = 122;
    pub const GET_STREAM: u32 = 200;
    pub const GET_STREAMS: u32 = 201;
    pub const CREATE_STREAM: u32 = 202;
    pub const GET_TOPIC: u32 = 300;
    pub const GET_TOPICS: u32 = 301;
    pub const CREATE_TOPIC: u32 = 302;
    pub const DELETE_SEGMENTS: u32 = 503;
    pub const GET_CONSUMER_GROUP: u32 = 600;
}

/// The operation byte the 0.11.0 client uses for a command code (§3).
pub fn operation_for_code(code: u32) -> u8 {
    match code {
        39 => 3,
        202 => 128,
        204 => 129,
        203 => 130,
        205 => 131,
        302 => 132,
        304 => 133,
        303 => 134,
        305 => 135,
        402 => 136,
        403 => 137,
        503 => 138,
        602 => 139,
        603 => 140,
        33 => 141,
        35 => 142,
        34 => 143,
        37 => 144,
        36 => 145,
        42 => 146,
        43 => 147,
        604 => 148,
        605 => 149,
        101 => 160,
        121 => 161,
        122 => 162,
        _ => 2,
    }
}

/// Result-section-framed reply operations (§5).
pub fn is_result_framed(operation: u8) -> bool {
    matches!(operation, 128..=137 | 139..=149 | 161 | 162)
}

pub fn xxh3(data: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(data)
}

/// request_checksum the 0.11.0 client stamps (§2.2).
pub fn request_checksum_for(operation: u8, body: &[u8]) -> u128 {
    match operation {
        1 | 3 | 128..=149 => u128::from(xxh3(body)),
        _ => 0,
    }
}

// ------------------------------------------------------------------------------------------
// Request header
// ------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy)]
pub struct ReqHeader {
    pub command: u8,
    pub client: u128,
    pub request_checksum: u128,
    pub request: u64,
    pub operation: u8,
    pub session: u64,
    pub user_id: u32,
    pub code: u32,
    /// If set, written at 48 instead of 256 + body length.
    pub size_override: Option<u32>,
}

impl ReqHeader {
    pub fn new(client: u128, operation: u8, code: u32, request: u64, session: u64) -> Self {
        ReqHeader {
            command: CMD_REQUEST,
            client,
            request_checksum: 0,
            request,
            operation,
            session,
            user_id: 0,
            code,
            size_override: None,
        }
    }

    pub fn encode(&self, body_len: usize) -> [u8; HEADER_SIZE] {
        let mut h = [0u8; HEADER_SIZE];
        let size = self.size_override.unwrap_or((HEADER_SIZE + body_len) as u32);
        h[48..52].copy_from_slice(&size.to_le_bytes());
        h[60] = self.command;
        h[128..144].copy_from_slice(&self.client.to_le_bytes());
        h[144..160].copy_from_slice(&self.request_checksum.to_le_bytes());
        h[168..176].copy_from_slice(&self.request.to_le_bytes());
        h[176] = self.operation;
        h[184..192].copy_from_slice(&self.session.to_le_bytes());
        h[192..196].copy_from_slice(&self.user_id.to_le_bytes());
        if self.operation == op::NON_REPLICATED {
            h[196..200].copy_from_slice(&self.code.to_le_bytes());
        }
        h
    }
}

// ------------------------------------------------------------------------------------------
// Reply frame
// ------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
pub struct Frame {
    pub header: [u8; HEADER_SIZE],
    pub body: Vec<u8>,
}

fn rd_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
fn rd_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}
fn rd_u128(b: &[u8], at: usize) -> u128 {
    u128::from_le_bytes(b[at..at + 16].try_into().unwrap())
}

impl Frame {
    pub fn command(&self) -> u8 {
        self.header[60]
    }
    pub fn size(&self) -> u32 {
        rd_u32(&self.header, 48)
    }
    pub fn is_reply(&self) -> bool {
        self.command() == CMD_REPLY
    }
    pub fn is_eviction(&self) -> bool {
        self.command() == CMD_EVICTION
    }
    // Reply fields (§2.3)
    pub fn request_checksum(&self) -> u128 {
        rd_u128(&self.header, 128)
    }
    pub fn context(&self) -> u128 {
        rd_u128(&self.header, 144)
    }
    pub fn client(&self) -> u128 {
        rd_u128(&self.header, 160)
    }
    pub fn request(&self) -> u64 {
        rd_u64(&self.header, 200)
    }
    pub fn operation(&self) -> u8 {
        self.header[208]
    }
    pub fn status(&self) -> u32 {
        rd_u32(&self.header, 216)
    }
    // Eviction fields (§2.4)
    pub fn eviction_client(&self) -> u128 {
        rd_u128(&self.header, 128)
    }
    pub fn eviction_max_version(&self) -> u32 {
        rd_u32(&self.header, 144)
    }
    pub fn eviction_min_version(&self) -> u32 {
        rd_u32(&self.header, 148)
    }
    pub fn eviction_reason(&self) -> u8 {
        self.header[255]
    }

    /// The error code the 0.11.0 client would raise for this frame, if any (§2.4, §5).
    pub fn sdk_error_code(&self) -> Option<u32> {
        if self.is_eviction() {
            let r = self.eviction_reason();
            return Some(match r {
                9 => 42,
                10 => 53,
                1 | 7 | 8 | 11 | 12 => 40,
                13 => 30,
                14 => {
                    let (max, min) = (self.eviction_max_version(), self.eviction_min_version());
                    if min >= 1 && min <= max { 14003 } else { 40 }
                }
                15 => 4,
                0 => 40,
                _ => 3,
            });
        }
        if !self.is_reply() {
            return Some(3);
        }
        if self.status() != 0 {
            return Some(self.status());
        }
        if is_result_framed(self.operation()) {
            if self.body.len() < 4 {
                return Some(3);
            }
            let count = rd_u32(&self.body, 0);
            if count > 0 {
                if self.body.len() < 12 {
                    return Some(3);
                }
                return Some(rd_u32(&self.body, 8));
            }
        }
        None
    }

    /// Assert an OK reply and return its payload (after the result section when framed).
    #[track_caller]
    pub fn ok_payload(&self) -> &[u8] {
        assert!(
            self.is_reply(),
            "expected a Reply (8), got command {} (eviction reason {})",
            self.command(),
            self.eviction_reason()
        );
        assert_eq!(self.status(), 0, "expected status 0, got {}", self.status());
        assert_eq!(self.size() as usize, HEADER_SIZE + self.body.len());
        if is_result_framed(self.operation()) {
            assert!(self.body.len() >= 4, "result-framed reply without a section");
            assert_eq!(
                rd_u32(&self.body, 0),
                0,
                "result section reports a rejection: {:?}",
                &self.body[..self.body.len().min(16)]
            );
            &self.body[4..]
        } else {
            &self.body
        }
    }

    /// Assert an error reply with the exact status and an empty body, or (for framed
    /// operations) a committed rejection `[1][0][code]`.
    #[track_caller]
    pub fn assert_error(&self, expected: u32) {
        assert!(
            self.is_reply(),
            "expected a Reply with error {expected}, got command {} (eviction reason {})",
            self.command(),
            self.eviction_reason()
        );
        if self.status() != 0 {
            assert_eq!(self.status(), expected, "wrong status");
            assert!(
                self.body.is_empty(),
                "error reply (status {}) must have an empty body, got {} bytes",
                self.status(),
                self.body.len()
            );
        } else {
            assert!(
                is_result_framed(self.operation()),
                "expected status {expected}, got status 0 on a non-framed operation {}",
                self.operation()
            );
            assert_eq!(
                self.body,
                [1u32.to_le_bytes(), 0u32.to_le_bytes(), expected.to_le_bytes()].concat(),
                "expected committed rejection [1][0][{expected}]"
            );
        }
    }
}

// ------------------------------------------------------------------------------------------
// Raw connection
// ------------------------------------------------------------------------------------------

pub struct RawConn {
    pub stream: TcpStream,
    pub client: u128,
    /// Next replicated request id (starts at 1 after Register).
    pub next_request: u64,
    pub session: u64,
    pub user_id: u32,
}

#[derive(Debug)]
pub enum RawError {
    Closed,
    Timeout,
    Io(std::io::Error),
}

pub fn random_client_id() -> u128 {
    loop {
        let v: u128 = rand::random();
        if v != 0 {
            return v;
        }
    }
}

impl RawConn {
    pub async fn connect(addr: SocketAddr) -> RawConn {
        let stream = tokio::time::timeout(Duration::from_secs(10), TcpStream::connect(addr))
            .await
            .expect("raw connect timed out")
            .expect("raw connect failed");
        RawConn {
            stream,
            client: random_client_id(),
            next_request: 1,
            session: 0,
            user_id: 0,
        }
    }

    /// Raw write of arbitrary bytes.
    pub async fn write_all(&mut self, bytes: &[u8]) -> Result<(), RawError> {
        self.stream.write_all(bytes).await.map_err(RawError::Io)
    }

    pub async fn send_frame(&mut self, header: &ReqHeader, body: &[u8]) -> Result<(), RawError> {
        let mut buf = Vec::with_capacity(HEADER_SIZE + body.len());
        buf.extend_from_slice(&header.encode(body.len()));
        buf.extend_from_slice(body);
        self.write_all(&buf).await
    }

    /// Read one frame (header + size-256 body bytes) with a timeout.
    pub async fn read_frame_timeout(&mut self, timeout: Duration) -> Result<Frame, RawError> {
        let fut = async {
            let mut header = [0u8; HEADER_SIZE];
            match self.stream.read_exact(&mut header).await {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    return Err(RawError::Closed);
                }
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                    return Err(RawError::Closed);
                }
                Err(e) => return Err(RawError::Io(e)),
            }
            let size = rd_u32(&header, 48) as usize;
            if size < HEADER_SIZE {
                return Ok(Frame {
                    header,
                    body: Vec::new(),
                });
            }
            let mut body = vec![0u8; size - HEADER_SIZE];
            match self.stream.read_exact(&mut body).await {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    return Err(RawError::Closed);
                }
                Err(e) => return Err(RawError::Io(e)),
            }
            Ok(Frame { header, body })
        };
        match tokio::time::timeout(timeout, fut).await {
            Ok(r) => r,
            Err(_) => Err(RawError::Timeout),
        }
    }

    pub async fn read_frame(&mut self) -> Frame {
        match self.read_frame_timeout(RAW_REPLY_TIMEOUT).await {
            Ok(f) => f,
            Err(e) => panic!("reading reply failed: {e:?}"),
        }
    }

    /// True if the server closes the connection (EOF / reset) within `timeout`, reading and
    /// discarding anything it sends first.
    pub async fn wait_closed(&mut self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut buf = [0u8; 4096];
        loop {
            match tokio::time::timeout_at(deadline, self.stream.read(&mut buf)).await {
                Err(_) => return false,
                Ok(Ok(0)) => return true,
                Ok(Ok(_)) => continue,
                Ok(Err(_)) => return true,
            }
        }
    }

    /// Send a request the way the 0.11.0 client would (op from the code, request id rules,
    /// session, request checksum) and read the reply.
    pub async fn call(&mut self, code: u32, body: &[u8]) -> Frame {
        let operation = operation_for_code(code);
        let request = if operation == op::NON_REPLICATED {
            self.next_request
        } else {
            let r = self.next_request;
            self.next_request += 1;
            r
        };
        let mut h = ReqHeader::new(self.client, operation, code, request, self.session);
        h.request_checksum = request_checksum_for(operation, body);
        self.send_frame(&h, body).await.expect("write request");
        self.read_frame().await
    }

    /// Send a Register (op 1) with the given body and read the reply. Mints a new client id
    /// first, as the SDK does.
    pub async fn register_raw(&mut self, body: &[u8]) -> Frame {
        self.client = random_client_id();
        let mut h = ReqHeader::new(self.client, op::REGISTER, 0, 0, 0);
        h.request_checksum = request_checksum_for(op::REGISTER, body);
        self.send_frame(&h, body).await.expect("write register");
        self.read_frame().await
    }

    /// Password Register; on success remembers the session and resets the request counter.
    pub async fn login(&mut self, user: &str, password: &str) -> Frame {
        let body = enc::login_body(PROTOCOL_VERSION, user, password);
        let f = self.register_raw(&body).await;
        self.absorb_login(&f);
        f
    }

    pub async fn login_root(&mut self) {
        let f = self.login(ROOT_USER, ROOT_PASSWORD).await;
        let _ = f.ok_payload();
        assert!(self.session > 0);
    }

    pub fn absorb_login(&mut self, f: &Frame) {
        if f.is_reply() && f.status() == 0 && f.body.len() >= 4 + 16 && rd_u32(&f.body, 0) == 0 {
            let p = &f.body[4..];
            self.user_id = rd_u32(p, 0);
            self.session = rd_u64(p, 4);
            self.next_request = 1;
        }
    }
}

// ------------------------------------------------------------------------------------------
// Body encoders
// ------------------------------------------------------------------------------------------

pub mod enc {
    use super::*;

    pub fn name(out: &mut Vec<u8>, s: &str) {
        assert!(!s.is_empty() && s.len() <= 255);
        out.push(s.len() as u8);
        out.extend_from_slice(s.as_bytes());
    }

    pub fn id_num(out: &mut Vec<u8>, v: u32) {
        out.push(1);
        out.push(4);
        out.extend_from_slice(&v.to_le_bytes());
    }

    pub fn id_str(out: &mut Vec<u8>, s: &str) {
        out.push(2);
        out.push(s.len() as u8);
        out.extend_from_slice(s.as_bytes());
    }

    /// Consumer kind 1 (consumer) with a numeric id.
    pub fn consumer(out: &mut Vec<u8>, kind: u8, id: u32) {
        out.push(kind);
        id_num(out, id);
    }

    pub fn opt_part(out: &mut Vec<u8>, p: Option<u32>) {
        match p {
            Some(p) => {
                out.push(1);
                out.extend_from_slice(&p.to_le_bytes());
            }
            None => {
                out.push(0);
                out.extend_from_slice(&[0; 4]);
            }
        }
    }

    pub fn client_version(out: &mut Vec<u8>, protocol_version: u32) {
        out.extend_from_slice(&protocol_version.to_le_bytes());
        name(out, "rust-sdk");
        name(out, "0.11.0");
    }

    pub fn login_body(protocol_version: u32, user: &str, password: &str) -> Vec<u8> {
        let mut b = Vec::new();
        client_version(&mut b, protocol_version);
        name(&mut b, user);
        b.push(password.len() as u8);
        b.extend_from_slice(password.as_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b
    }

    pub fn pat_login_body(protocol_version: u32, token: &str) -> Vec<u8> {
        let mut b = Vec::new();
        client_version(&mut b, protocol_version);
        b.push(token.len() as u8);
        b.extend_from_slice(token.as_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b
    }

    /// A string TLV entry (kind 2).
    pub fn tlv_str(out: &mut Vec<u8>, s: &str) {
        out.push(2);
        out.extend_from_slice(&(s.len() as u32).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    }

    pub fn create_stream(stream_name: &str) -> Vec<u8> {
        let mut b = Vec::new();
        name(&mut b, stream_name);
        b
    }

    /// CreateTopic with the option block the SDK always sends (§6.5).
    pub fn create_topic(stream: u32, partitions: u32, topic_name: &str) -> Vec<u8> {
        let mut b = Vec::new();
        id_num(&mut b, stream);
        b.extend_from_slice(&partitions.to_le_bytes());
        name(&mut b, topic_name);
        tlv_str(&mut b, "consumer_offset_durability");
        tlv_str(&mut b, "replicated");
        tlv_str(&mut b, "durability");
        tlv_str(&mut b, "replicated");
        b
    }

    pub fn stream_topic(stream: u32, topic: u32) -> Vec<u8> {
        let mut b = Vec::new();
        id_num(&mut b, stream);
        id_num(&mut b, topic);
        b
    }

    /// PollMessages body (§6.7). `strategy` = (kind, value).
    pub fn poll(
        consumer_id: u32,
        stream: u32,
        topic: u32,
        partition: Option<u32>,
        strategy: (u8, u64),
        count: u32,
        auto_commit: bool,
    ) -> Vec<u8> {
        let mut b = Vec::new();
        consumer(&mut b, 1, consumer_id);
        id_num(&mut b, stream);
        id_num(&mut b, topic);
        opt_part(&mut b, partition);
        b.push(strategy.0);
        b.extend_from_slice(&strategy.1.to_le_bytes());
        b.extend_from_slice(&count.to_le_bytes());
        b.push(auto_commit as u8);
        b
    }

    pub fn consumer_offset_target(
        consumer_id: u32,
        stream: u32,
        topic: u32,
        partition: Option<u32>,
    ) -> Vec<u8> {
        let mut b = Vec::new();
        consumer(&mut b, 1, consumer_id);
        id_num(&mut b, stream);
        id_num(&mut b, topic);
        opt_part(&mut b, partition);
        b
    }

    pub fn store_offset(
        consumer_id: u32,
        stream: u32,
        topic: u32,
        partition: Option<u32>,
        offset: u64,
    ) -> Vec<u8> {
        let mut b = consumer_offset_target(consumer_id, stream, topic, partition);
        b.extend_from_slice(&offset.to_le_bytes());
        b.push(1);
        b
    }

    pub fn delete_offset(consumer_id: u32, stream: u32, topic: u32, partition: Option<u32>) -> Vec<u8> {
        let mut b = consumer_offset_target(consumer_id, stream, topic, partition);
        b.push(1);
        b
    }

    /// SendMessages body (§7.1) with kind-2 partitioning around an encoded batch.
    pub fn send_messages_with_ids(
        stream: &[u8],
        topic: &[u8],
        partition: u32,
        messages_count: u32,
        batch: &[u8],
    ) -> Vec<u8> {
        let mut meta = Vec::new();
        meta.extend_from_slice(stream);
        meta.extend_from_slice(topic);
        meta.push(2);
        meta.push(4);
        meta.extend_from_slice(&partition.to_le_bytes());
        meta.extend_from_slice(&messages_count.to_le_bytes());
        let mut b = Vec::new();
        b.extend_from_slice(&(meta.len() as u32).to_le_bytes());
        b.extend_from_slice(&meta);
        b.extend_from_slice(batch);
        b
    }

    pub fn send_messages(stream: u32, topic: u32, partition: u32, batch: &batch::Batch) -> Vec<u8> {
        let mut s = Vec::new();
        id_num(&mut s, stream);
        let mut t = Vec::new();
        id_num(&mut t, topic);
        send_messages_with_ids(&s, &t, partition, batch.count, &batch.bytes)
    }
}

// ------------------------------------------------------------------------------------------
// Batches (§7.2, §7.3)
// ------------------------------------------------------------------------------------------

pub mod batch {
    use super::*;

    pub const BATCH_HEADER_SIZE: usize = 256;
    pub const FRAME_HEADER_SIZE: usize = 48;

    #[derive(Debug, Clone)]
    pub struct RawMessage {
        pub id: u128,
        pub origin_timestamp: u64,
        pub payload: Vec<u8>,
        pub headers: Vec<u8>,
    }

    #[derive(Debug, Clone)]
    pub struct Batch {
        pub bytes: Vec<u8>,
        pub count: u32,
        /// Byte ranges of each frame inside `bytes`.
        pub frames: Vec<std::ops::Range<usize>>,
    }

    /// Encode a client batch exactly as the 0.11.0 SDK does.
    pub fn encode(messages: &[RawMessage]) -> Batch {
        let origin = messages.iter().map(|m| m.origin_timestamp).min().unwrap_or(0);
        let mut bytes = vec![0u8; BATCH_HEADER_SIZE];
        let mut frames = Vec::new();
        for (i, m) in messages.iter().enumerate() {
            let start = bytes.len();
            bytes.extend_from_slice(&0u64.to_le_bytes());
            bytes.extend_from_slice(&m.id.to_le_bytes());
            bytes.extend_from_slice(&(i as u32).to_le_bytes());
            bytes.extend_from_slice(&((m.origin_timestamp - origin) as u32).to_le_bytes());
            bytes.extend_from_slice(&(m.headers.len() as u32).to_le_bytes());
            bytes.extend_from_slice(&(m.payload.len() as u32).to_le_bytes());
            bytes.extend_from_slice(&0u64.to_le_bytes());
            bytes.extend_from_slice(&m.payload);
            bytes.extend_from_slice(&m.headers);
            let sum = xxh3(&bytes[start + 8..]);
            bytes[start..start + 8].copy_from_slice(&sum.to_le_bytes());
            frames.push(start..bytes.len());
        }
        let batch_length = bytes.len() as u64;
        bytes[24..32].copy_from_slice(&origin.to_le_bytes());
        bytes[32..40].copy_from_slice(&batch_length.to_le_bytes());
        bytes[48..52].copy_from_slice(&(messages.len() as u32).to_le_bytes());
        let sum = checksum(&bytes);
        bytes[40..48].copy_from_slice(&sum.to_le_bytes());
        Batch {
            bytes,
            count: messages.len() as u32,
            frames,
        }
    }

    /// Batch checksum (§7.3) over the header fields as they are in `batch` and every frame
    /// checksum. `batch` must be well formed.
    pub fn checksum(batch: &[u8]) -> u64 {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        h.update(&batch[0..8]);
        h.update(&batch[8..16]);
        h.update(&batch[16..24]);
        h.update(&batch[24..32]);
        h.update(&batch[32..40]);
        h.update(&batch[48..52]);
        let count = rd_u32(batch, 48) as usize;
        let mut pos = BATCH_HEADER_SIZE;
        for _ in 0..count {
            h.update(&batch[pos..pos + 8]);
            let uh = rd_u32(batch, pos + 32) as usize;
            let pl = rd_u32(batch, pos + 36) as usize;
            pos += FRAME_HEADER_SIZE + pl + uh;
        }
        h.digest()
    }

    pub fn simple(id: u128, payload: &[u8]) -> RawMessage {
        RawMessage {
            id,
            origin_timestamp: now_micros(),
            payload: payload.to_vec(),
            headers: Vec::new(),
        }
    }
}

// ------------------------------------------------------------------------------------------
// Poll reply decoding (§7.4)
// ------------------------------------------------------------------------------------------

pub mod poll {
    use super::batch::{BATCH_HEADER_SIZE, FRAME_HEADER_SIZE};
    use super::*;

    #[derive(Debug, Clone)]
    pub struct PolledBatch {
        pub partition_id: u64,
        pub base_offset: u64,
        pub base_timestamp: u64,
        pub origin_timestamp: u64,
        pub batch_length: u64,
        pub batch_checksum: u64,
        pub message_count: u32,
        pub bytes: Vec<u8>,
        pub messages: Vec<PolledMessage>,
    }

    #[derive(Debug, Clone)]
    pub struct PolledMessage {
        pub offset: u64,
        pub timestamp: u64,
        pub origin_timestamp: u64,
        pub id: u128,
        pub checksum: u64,
        pub offset_delta: u32,
        pub payload: Vec<u8>,
        pub headers: Vec<u8>,
        /// The whole frame, byte for byte.
        pub frame: Vec<u8>,
    }

    #[derive(Debug, Clone)]
    pub struct PollReply {
        pub partition_id: u32,
        pub current_offset: u64,
        pub messages_count: u32,
        pub batches: Vec<PolledBatch>,
    }

    impl PollReply {
        pub fn messages(&self) -> impl Iterator<Item = &PolledMessage> {
            self.batches.iter().flat_map(|b| b.messages.iter())
        }
        pub fn offsets(&self) -> Vec<u64> {
            self.messages().map(|m| m.offset).collect()
        }
    }

    /// Strictly decode a poll reply body, asserting the invariants of §7.4: whole batches,
    /// zero reserved bytes, frames tiling each batch, the head's messages_count equal to
    /// the frames sent, every frame checksum valid and every batch checksum recomputed.
    #[track_caller]
    pub fn decode(body: &[u8]) -> PollReply {
        assert!(body.len() >= 16, "poll reply shorter than its 16-byte head");
        let partition_id = rd_u32(body, 0);
        let current_offset = rd_u64(body, 4);
        let messages_count = rd_u32(body, 12);
        let mut pos = 16;
        let mut batches = Vec::new();
        let mut total = 0u32;
        while pos < body.len() {
            assert!(
                body.len() - pos >= BATCH_HEADER_SIZE,
                "trailing {} bytes that are not a whole batch header",
                body.len() - pos
            );
            let b = &body[pos..];
            let batch_length = rd_u64(b, 32) as usize;
            assert!(
                batch_length >= BATCH_HEADER_SIZE,
                "batch_length {batch_length} < 256"
            );
            assert!(batch_length <= b.len(), "batch_length runs past the reply body");
            let bytes = &b[..batch_length];
            assert!(
                bytes[52..256].iter().all(|&x| x == 0),
                "non-zero reserved bytes in a batch header"
            );
            let base_offset = rd_u64(bytes, 8);
            let base_timestamp = rd_u64(bytes, 16);
            let origin_timestamp = rd_u64(bytes, 24);
            let message_count = rd_u32(bytes, 48);
            let mut fpos = BATCH_HEADER_SIZE;
            let mut messages = Vec::new();
            while fpos < batch_length {
                assert!(batch_length - fpos >= FRAME_HEADER_SIZE, "truncated frame header");
                let f = &bytes[fpos..];
                let uh = rd_u32(f, 32) as usize;
                let pl = rd_u32(f, 36) as usize;
                let flen = FRAME_HEADER_SIZE + pl + uh;
                assert!(flen <= batch_length - fpos, "frame runs past its batch");
                assert_eq!(rd_u64(f, 40), 0, "non-zero reserved bytes in a frame header");
                let frame = &f[..flen];
                let checksum = rd_u64(frame, 0);
                assert_eq!(checksum, xxh3(&frame[8..]), "frame checksum does not match");
                let offset_delta = rd_u32(frame, 24);
                let ts_delta = rd_u32(frame, 28);
                messages.push(PolledMessage {
                    offset: base_offset + u64::from(offset_delta),
                    timestamp: base_timestamp,
                    origin_timestamp: origin_timestamp + u64::from(ts_delta),
                    id: rd_u128(frame, 8),
                    checksum,
                    offset_delta,
                    payload: frame[FRAME_HEADER_SIZE..FRAME_HEADER_SIZE + pl].to_vec(),
                    headers: frame[FRAME_HEADER_SIZE + pl..].to_vec(),
                    frame: frame.to_vec(),
                });
                fpos += flen;
            }
            assert_eq!(
                messages.len() as u32,
                message_count,
                "batch message_count does not match its frames"
            );
            let batch_checksum = rd_u64(bytes, 40);
            assert_eq!(
                batch_checksum,
                batch::checksum(bytes),
                "batch checksum was not recomputed for the served batch"
            );
            total += message_count;
            batches.push(PolledBatch {
                partition_id: rd_u64(bytes, 0),
                base_offset,
                base_timestamp,
                origin_timestamp,
                batch_length: batch_length as u64,
                batch_checksum,
                message_count,
                bytes: bytes.to_vec(),
                messages,
            });
            pos += batch_length;
        }
        assert_eq!(total, messages_count, "poll head messages_count != frames sent");
        PollReply {
            partition_id,
            current_offset,
            messages_count,
            batches,
        }
    }
}

// ------------------------------------------------------------------------------------------
// Reply record parsers (§6.0)
// ------------------------------------------------------------------------------------------

pub mod rec {
    pub struct Cursor<'a> {
        pub b: &'a [u8],
        pub pos: usize,
    }

    impl<'a> Cursor<'a> {
        pub fn new(b: &'a [u8]) -> Self {
            Cursor { b, pos: 0 }
        }
        pub fn remaining(&self) -> usize {
            self.b.len() - self.pos
        }
        #[track_caller]
        pub fn take(&mut self, n: usize) -> &'a [u8] {
            assert!(
                self.remaining() >= n,
                "record truncated: need {n}, have {}",
                self.remaining()
            );
            let s = &self.b[self.pos..self.pos + n];
            self.pos += n;
            s
        }
        pub fn u8(&mut self) -> u8 {
            self.take(1)[0]
        }
        pub fn u16(&mut self) -> u16 {
            u16::from_le_bytes(self.take(2).try_into().unwrap())
        }
        pub fn u32(&mut self) -> u32 {
            u32::from_le_bytes(self.take(4).try_into().unwrap())
        }
        pub fn u64(&mut self) -> u64 {
            u64::from_le_bytes(self.take(8).try_into().unwrap())
        }
        #[track_caller]
        pub fn name(&mut self) -> String {
            let len = self.u8() as usize;
            assert!(len >= 1, "Name with length 0");
            String::from_utf8(self.take(len).to_vec()).expect("Name is not utf-8")
        }
        pub fn lstr(&mut self) -> String {
            let len = self.u32() as usize;
            String::from_utf8(self.take(len).to_vec()).expect("LStr is not utf-8")
        }
        /// A reply option block `[len u32][TLV…]`; checks the TLV structure (§6.0).
        #[track_caller]
        pub fn option_block(&mut self) -> usize {
            let len = self.u32() as usize;
            let block = self.take(len);
            let mut p = 0;
            let mut entries = 0;
            while p < block.len() {
                assert!(block.len() - p >= 5, "truncated TLV entry");
                let kind = block[p];
                assert!((1..=15).contains(&kind), "TLV kind {kind} out of range");
                let l = u32::from_le_bytes(block[p + 1..p + 5].try_into().unwrap()) as usize;
                assert!((1..=255).contains(&l), "TLV length {l} out of range");
                p += 5;
                assert!(block.len() - p >= l, "TLV value runs past the block");
                p += l;
                entries += 1;
            }
            assert_eq!(entries % 2, 0, "odd number of TLV entries in an option block");
            len
        }
    }

    #[derive(Debug, Clone)]
    pub struct StreamRec {
        pub id: u32,
        pub topics_count: u32,
        pub size: u64,
        pub messages_count: u64,
        pub name: String,
    }

    pub fn stream(c: &mut Cursor) -> StreamRec {
        let id = c.u32();
        let _created = c.u64();
        let topics_count = c.u32();
        let size = c.u64();
        let messages_count = c.u64();
        let name = c.name();
        c.option_block();
        StreamRec {
            id,
            topics_count,
            size,
            messages_count,
            name,
        }
    }

    #[derive(Debug, Clone)]
    pub struct TopicRec {
        pub id: u32,
        pub partitions_count: u32,
        pub compression: u8,
        pub messages_count: u64,
        pub name: String,
    }

    #[track_caller]
    pub fn topic_header(c: &mut Cursor) -> TopicRec {
        let id = c.u32();
        let _created = c.u64();
        let partitions_count = c.u32();
        let _expiry = c.u64();
        let compression = c.u8();
        assert!(
            compression == 1 || compression == 2,
            "compression code {compression}"
        );
        let _max = c.u64();
        let _size = c.u64();
        let messages_count = c.u64();
        let name = c.name();
        c.option_block();
        c.option_block();
        TopicRec {
            id,
            partitions_count,
            compression,
            messages_count,
            name,
        }
    }

    #[derive(Debug, Clone)]
    pub struct PartitionRec {
        pub id: u32,
        pub segments_count: u32,
        pub current_offset: u64,
        pub messages_count: u64,
    }

    pub fn partition(c: &mut Cursor) -> PartitionRec {
        let id = c.u32();
        let _created = c.u64();
        let segments_count = c.u32();
        let current_offset = c.u64();
        let _size = c.u64();
        let messages_count = c.u64();
        PartitionRec {
            id,
            segments_count,
            current_offset,
            messages_count,
        }
    }

    /// StreamDetails: Stream + exactly topics_count topic headers; must consume `body`.
    #[track_caller]
    pub fn stream_details(body: &[u8]) -> (StreamRec, Vec<TopicRec>) {
        let mut c = Cursor::new(body);
        let s = stream(&mut c);
        let topics = (0..s.topics_count).map(|_| topic_header(&mut c)).collect();
        assert_eq!(c.remaining(), 0, "trailing bytes after StreamDetails");
        (s, topics)
    }

    /// TopicDetails: header + exactly partitions_count 40-byte partitions; must consume `body`.
    #[track_caller]
    pub fn topic_details(body: &[u8]) -> (TopicRec, Vec<PartitionRec>) {
        let mut c = Cursor::new(body);
        let t = topic_header(&mut c);
        assert_eq!(
            c.remaining(),
            t.partitions_count as usize * 40,
            "TopicDetails must carry exactly partitions_count 40-byte partition records"
        );
        let parts = (0..t.partitions_count).map(|_| partition(&mut c)).collect();
        (t, parts)
    }
}

// ------------------------------------------------------------------------------------------
// SDK-level setup helpers
// ------------------------------------------------------------------------------------------

/// Create a stream + topic through the SDK and return their ids.
pub async fn create_stream_topic(
    client: &IggyClient,
    stream: &str,
    topic: &str,
    partitions: u32,
) -> (u32, u32) {
    let s = client.create_stream(stream).await.expect("create_stream");
    assert_eq!(s.name, stream);
    let t = client
        .create_topic(&id_num(s.id), topic, &topic_opts(partitions))
        .await
        .expect("create_topic");
    assert_eq!(t.partitions_count, partitions);
    (s.id, t.id)
}

/// Build an SDK message with an explicit id.
pub fn sdk_message(id: u128, payload: Vec<u8>) -> IggyMessage {
    IggyMessage::builder()
        .id(id)
        .payload(bytes::Bytes::from(payload))
        .build()
        .expect("build message")
}

/// Poll every message of a partition via the SDK with Offset strategy, `page` at a time.
/// Bounded by `max_messages`.
pub async fn poll_all(
    client: &IggyClient,
    stream: u32,
    topic: u32,
    partition: u32,
    page: u32,
    max_messages: usize,
) -> Vec<IggyMessage> {
    let consumer = Consumer::new(id_num(999_999));
    let mut out: Vec<IggyMessage> = Vec::new();
    let mut next = 0u64;
    let max_rounds = max_messages / page.max(1) as usize + 10;
    for _ in 0..max_rounds {
        let polled = client
            .poll_messages(
                &id_num(stream),
                &id_num(topic),
                Some(partition),
                &consumer,
                &PollingStrategy::offset(next),
                page,
                false,
            )
            .await
            .expect("poll_messages");
        if polled.messages.is_empty() {
            return out;
        }
        next = polled.messages.last().unwrap().header.offset + 1;
        out.extend(polled.messages);
        assert!(out.len() <= max_messages, "more messages than expected");
    }
    panic!("poll_all did not reach the end within {max_rounds} rounds");
}

// ------------------------------------------------------------------------------------------
// Durability scenario helpers (on-disk format read independently of cairn-storage, so the
// tests do not trust the code they test; see crates/storage/src/record.rs for the layout)
// ------------------------------------------------------------------------------------------

/// `<data>/streams/<s>/topics/<t>/partitions/<p>`.
pub fn partition_dir(data_dir: &Path, stream: u32, topic: u32, partition: u32) -> PathBuf {
    data_dir
        .join("streams")
        .join(stream.to_string())
        .join("topics")
        .join(topic.to_string())
        .join("partitions")
        .join(partition.to_string())
}

pub const RECORD_HEADER_BYTES: usize = 64;
pub const RECORD_MAGIC_BYTES: &[u8; 4] = b"CRNR";
pub const RECORD_KIND_BATCH: u8 = 1;
/// Written by the record log before partitions were groups; damage in a journal.
pub const RECORD_KIND_GAP: u8 = 2;
/// A journal's op record: the op's 256-byte VSR header (and the body of an op that is not
/// an append).
pub const RECORD_KIND_OP: u8 = 3;
/// Byte offset of `base_offset` inside the 64-byte record header.
pub const RECORD_BASE_OFFSET_AT: usize = 40;

/// One record as found in a journal segment (`.log`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskRecord {
    /// Byte position of the record header in its file.
    pub pos: u64,
    /// Whole record size (header + body).
    pub len: u64,
    pub kind: u8,
    pub checksum: u64,
    pub parent_checksum: u64,
    pub op: u64,
    pub partition_id: u32,
    pub base_offset: u64,
    pub message_count: u32,
    pub body_len: u32,
    pub timestamp_us: u64,
}

impl DiskRecord {
    pub fn end(&self) -> u64 {
        self.pos + self.len
    }
    pub fn range(&self) -> std::ops::Range<usize> {
        self.pos as usize..self.end() as usize
    }
}

/// Walk whole records from the start of `bytes`; stops at the first position that does not
/// hold a whole record with the right magic. Returns the records and the bytes they cover.
/// (No checksum verification: this is a structural walk for test bookkeeping.)
pub fn parse_records(bytes: &[u8]) -> (Vec<DiskRecord>, u64) {
    let mut out = Vec::new();
    let mut pos = 0usize;
    while bytes.len() - pos >= RECORD_HEADER_BYTES {
        let h = &bytes[pos..pos + RECORD_HEADER_BYTES];
        if &h[0..4] != RECORD_MAGIC_BYTES {
            break;
        }
        let body_len = rd_u32(h, 52);
        let len = RECORD_HEADER_BYTES as u64 + u64::from(body_len);
        if ((bytes.len() - pos) as u64) < len {
            break;
        }
        out.push(DiskRecord {
            pos: pos as u64,
            len,
            kind: h[5],
            checksum: rd_u64(h, 8),
            parent_checksum: rd_u64(h, 16),
            op: rd_u64(h, 24),
            partition_id: rd_u32(h, 36),
            base_offset: rd_u64(h, 40),
            message_count: rd_u32(h, 48),
            body_len,
            timestamp_us: rd_u64(h, 56),
        });
        pos += len as usize;
    }
    (out, pos as u64)
}

/// The record checksum as the format defines it: XXH3-64 over header bytes 16..64, then the
/// body.
pub fn record_checksum(record: &[u8]) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(&record[16..RECORD_HEADER_BYTES]);
    h.update(&record[RECORD_HEADER_BYTES..]);
    h.digest()
}

/// Build a checksum-valid copy of `prev` (the whole bytes of one batch record) with record
/// op `op`, parent checksum `parent` and base offset `base_offset` (in the record and its
/// batch). Both the batch checksum and the record checksum are recomputed. Self-checks that
/// this computation reproduces `prev`'s own stored checksums, so a forged record is exactly
/// as valid as one the server wrote.
pub fn forge_record(prev: &[u8], op: u64, parent: u64, base_offset: u64) -> Vec<u8> {
    let (recs, covered) = parse_records(prev);
    assert_eq!(recs.len(), 1, "forge_record wants exactly one whole record");
    assert_eq!(covered as usize, prev.len());
    let r = recs[0];
    assert_eq!(r.kind, RECORD_KIND_BATCH, "forge from a batch record");
    // Self-check: our checksum functions reproduce what the server stored.
    assert_eq!(
        record_checksum(prev),
        r.checksum,
        "record checksum formula self-check"
    );
    let body = &prev[RECORD_HEADER_BYTES..];
    assert_eq!(
        batch::checksum(body),
        rd_u64(body, 40),
        "batch checksum formula self-check"
    );

    let mut out = prev.to_vec();
    out[16..24].copy_from_slice(&parent.to_le_bytes());
    out[24..32].copy_from_slice(&op.to_le_bytes());
    out[40..48].copy_from_slice(&base_offset.to_le_bytes()); // record base_offset
    let b = RECORD_HEADER_BYTES;
    out[b + 8..b + 16].copy_from_slice(&base_offset.to_le_bytes()); // batch base_offset
    let bsum = batch::checksum(&out[b..]);
    out[b + 40..b + 48].copy_from_slice(&bsum.to_le_bytes());
    let rsum = record_checksum(&out);
    out[8..16].copy_from_slice(&rsum.to_le_bytes());
    out
}

/// The journal directory of a partition (its group's segment log).
pub fn journal_dir(partition_dir: &Path) -> PathBuf {
    partition_dir.join("log")
}

/// The segment files of a partition's journal, by name: the op of their first record.
pub fn segment_logs(partition_dir: &Path) -> Vec<(u64, PathBuf)> {
    let dir = journal_dir(partition_dir);
    let mut out: Vec<(u64, PathBuf)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()))
        .filter_map(|e| {
            let p = e.ok()?.path();
            if p.extension()? != "log" {
                return None;
            }
            let stem = p.file_stem()?.to_str()?;
            assert_eq!(stem.len(), 20, "segment name {} is not 20 digits", p.display());
            Some((stem.parse::<u64>().ok()?, p))
        })
        .collect();
    out.sort();
    out
}

/// The offset a segment file's first record begins at.
pub fn segment_base_offset(segment: &Path) -> u64 {
    let bytes = std::fs::read(segment).unwrap_or_else(|e| panic!("read {}: {e}", segment.display()));
    let (recs, _) = parse_records(&bytes);
    recs.first()
        .unwrap_or_else(|| panic!("{} holds no record", segment.display()))
        .base_offset
}

/// The base offsets of the journal segments that hold messages (a batch record), oldest
/// first: segments of other ops alone (offset stores, trims) are left out.
pub fn message_segments(partition_dir: &Path) -> Vec<u64> {
    segment_logs(partition_dir)
        .into_iter()
        .filter_map(|(_, path)| {
            let bytes = std::fs::read(&path).ok()?;
            let (recs, _) = parse_records(&bytes);
            recs.iter()
                .find(|r| r.kind == RECORD_KIND_BATCH)
                .map(|r| r.base_offset)
        })
        .collect()
}

/// The newest (active) segment of a partition's journal.
pub fn last_segment_log(partition_dir: &Path) -> PathBuf {
    segment_logs(partition_dir)
        .pop()
        .unwrap_or_else(|| panic!("no .log in {}", journal_dir(partition_dir).display()))
        .1
}

/// Walk every segment of a partition's journal and assert the chain the format promises: no
/// segment file outside the journal directory; the files hold only whole records; each
/// segment is named by its first record's op, which is an op record; ops count up by one,
/// each op record followed by exactly as many batch records of the same op as it names (its
/// `message_count`), never split across segments; offsets are contiguous (an op record holds
/// the chain's next offset, a batch continues it, no gap record exists), but for a skip: an
/// op record without batches whose base offset lies above, which ends its segment; parent
/// checksums chain across every record and segment. Returns the next offset after the last
/// record.
#[track_caller]
pub fn assert_segment_chain(partition_dir: &Path) -> u64 {
    let stray: Vec<_> = std::fs::read_dir(partition_dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "log" || e == "index"))
        .collect();
    assert!(stray.is_empty(), "segment files outside the journal: {stray:?}");
    let segs = segment_logs(partition_dir);
    assert!(!segs.is_empty(), "no segments in {}", partition_dir.display());
    let mut expected_next: Option<u64> = None;
    let mut parent: Option<u64> = None;
    let mut op: Option<u64> = None;
    let mut batches_owed = 0u32;
    for (first_op, path) in &segs {
        let bytes = std::fs::read(path).unwrap();
        let (recs, covered) = parse_records(&bytes);
        assert_eq!(
            covered,
            bytes.len() as u64,
            "{}: {} trailing bytes that are not whole records",
            path.display(),
            bytes.len() as u64 - covered
        );
        let first = recs
            .first()
            .unwrap_or_else(|| panic!("{}: an empty segment", path.display()));
        assert_eq!(
            first.kind,
            RECORD_KIND_OP,
            "{}: begins with a batch record",
            path.display()
        );
        assert_eq!(
            first.op,
            *first_op,
            "{}: named after another op than its first",
            path.display()
        );
        for (index, r) in recs.iter().enumerate() {
            let at = format!("{} record at byte {}", path.display(), r.pos);
            if let Some(parent) = parent {
                assert_eq!(r.parent_checksum, parent, "{at}: parent checksum chain");
            }
            parent = Some(r.checksum);
            match r.kind {
                RECORD_KIND_OP => {
                    if let Some(previous) = op {
                        assert_eq!(r.op, previous + 1, "{at}: op chain");
                    }
                    assert_eq!(batches_owed, 0, "{at}: the op before lacks batch records");
                    if let Some(next) = expected_next
                        && r.base_offset != next
                    {
                        assert!(r.base_offset > next, "{at}: an op record going back in offsets");
                        assert_eq!(r.message_count, 0, "{at}: a skip with batches");
                        assert_eq!(
                            index + 1,
                            recs.len(),
                            "{at}: a skip that does not end its segment"
                        );
                    }
                    batches_owed = r.message_count;
                    op = Some(r.op);
                    expected_next = Some(r.base_offset);
                }
                RECORD_KIND_BATCH => {
                    if let Some(next) = expected_next {
                        assert_eq!(r.base_offset, next, "{at}: offsets not contiguous");
                    }
                    assert_eq!(
                        Some(r.op),
                        op,
                        "{at}: a batch record of another op than its op record's"
                    );
                    assert!(
                        batches_owed > 0,
                        "{at}: more batch records than its op record names"
                    );
                    batches_owed -= 1;
                    assert!(r.message_count > 0, "{at}: empty batch record");
                    expected_next = Some(r.base_offset + u64::from(r.message_count));
                }
                k => panic!("{at}: record kind {k} has no place in a journal"),
            }
        }
        assert_eq!(batches_owed, 0, "{}: an op split across segments", path.display());
    }
    expected_next.unwrap_or(0)
}

/// Every file under `dir` (recursively) with its length and XXH3 hash, by relative path.
pub fn hash_tree(dir: &Path) -> std::collections::BTreeMap<String, (u64, u64)> {
    fn walk(root: &Path, dir: &Path, out: &mut std::collections::BTreeMap<String, (u64, u64)>) {
        for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display())) {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(root, &p, out);
            } else {
                let bytes = std::fs::read(&p).unwrap();
                let rel = p.strip_prefix(root).unwrap().display().to_string();
                out.insert(rel, (bytes.len() as u64, xxh3(&bytes)));
            }
        }
    }
    let mut out = std::collections::BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// [`hash_tree`] of a partition directory without its segment summaries (`*.summary`) and
/// its group's `superblock`: the files a refusal keeps byte-identical (the segments, the
/// journal's start and state files, the checkpoints). A refusal removes the damaged
/// segment's summary, so that every later start reads the segment and refuses it too (a
/// summary is an index, written again from a verified read: the contract's guarantee 7).
/// A start that took the damaged bytes from a summary unread has brought the group up
/// before they were verified, which records the group's new view in its superblock (no
/// data; a repair builds a new group).
pub fn hash_data(dir: &Path) -> std::collections::BTreeMap<String, (u64, u64)> {
    let mut tree = hash_tree(dir);
    tree.retain(|name, _| !name.ends_with(".summary") && name != "superblock");
    tree
}

/// Flip `mask` bits of the byte at `pos` in `path`, in place.
pub fn flip_byte(path: &Path, pos: u64, mask: u8) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[pos as usize] ^= mask;
    std::fs::write(path, bytes).unwrap();
}

/// Append `extra` to the file at `path`.
pub fn append_bytes(path: &Path, extra: &[u8]) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    f.write_all(extra).unwrap();
    f.sync_all().unwrap();
}

/// Run the offline verifier `cairn check <dir>` and assert it exits 0 (healthy), printing its
/// output otherwise. Only for stopped servers.
#[track_caller]
pub fn assert_check_healthy(data_dir: &Path) {
    let bin = env!("CARGO_BIN_EXE_cairn");
    let out = Command::new(bin)
        .arg("check")
        .arg(data_dir)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("failed to run {bin} check: {e}"));
    assert!(
        out.status.success(),
        "`cairn check {}` did not report healthy: {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        data_dir.display(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Assert the server logged no partition refusal (stderr tail).
#[track_caller]
pub fn assert_no_refusal(server: &TestServer) {
    let logs = server.logs();
    assert!(
        !logs.contains("partition refused"),
        "a partition was refused at boot:\n{logs}"
    );
}

/// Deterministic payload of a message id (so identical bytes can be checked from the id).
pub fn payload_for(id: u128, len: usize) -> Vec<u8> {
    let mut out = format!("m{id}:").into_bytes();
    let mut x = (id as u64) ^ ((id >> 64) as u64) ^ 0x9E37_79B9_7F4A_7C15;
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.push(x as u8);
    }
    out.truncate(len.max(1));
    out
}

/// Send one batch through the SDK (bounded by a timeout).
pub async fn send_batch(
    client: &IggyClient,
    stream: u32,
    topic: u32,
    partition: u32,
    messages: &[(u128, Vec<u8>)],
) -> Result<(), IggyError> {
    let mut msgs: Vec<IggyMessage> = messages
        .iter()
        .map(|(id, payload)| sdk_message(*id, payload.clone()))
        .collect();
    match tokio::time::timeout(
        Duration::from_secs(30),
        client.send_messages(
            &id_num(stream),
            &id_num(topic),
            &Partitioning::partition_id(partition),
            &mut msgs,
        ),
    )
    .await
    {
        Ok(r) => r.map(|_| ()),
        Err(_) => panic!("send_messages timed out after 30 s"),
    }
}

/// Poll one page from `offset` (Offset strategy, no auto-commit).
pub async fn poll_from(
    client: &IggyClient,
    stream: u32,
    topic: u32,
    partition: u32,
    strategy: PollingStrategy,
    count: u32,
) -> Result<PolledMessages, IggyError> {
    match tokio::time::timeout(
        Duration::from_secs(30),
        client.poll_messages(
            &id_num(stream),
            &id_num(topic),
            Some(partition),
            &Consumer::new(id_num(777_777)),
            &strategy,
            count,
            false,
        ),
    )
    .await
    {
        Ok(r) => r,
        Err(_) => panic!("poll_messages timed out after 30 s"),
    }
}

/// What the client knows about one partition: every ACKed message by offset.
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    pub stream: u32,
    pub topic: u32,
    pub partition: u32,
    /// offset -> (message id, payload) of every ACKed message.
    pub acked: std::collections::BTreeMap<u64, (u128, Vec<u8>)>,
    next_id: u128,
    payload_len: usize,
}

impl Ledger {
    pub fn new(stream: u32, topic: u32, partition: u32, payload_len: usize) -> Ledger {
        Ledger {
            stream,
            topic,
            partition,
            acked: Default::default(),
            // Ids unique across partitions of a test.
            next_id: (u128::from(stream) << 80)
                | (u128::from(topic) << 64)
                | (u128::from(partition) << 48)
                | 1,
            payload_len,
        }
    }

    pub fn max_offset(&self) -> Option<u64> {
        self.acked.keys().next_back().copied()
    }

    pub fn len(&self) -> usize {
        self.acked.len()
    }

    /// The next `n` messages this ledger would send.
    pub fn next_messages(&mut self, n: usize) -> Vec<(u128, Vec<u8>)> {
        (0..n)
            .map(|_| {
                let id = self.next_id;
                self.next_id += 1;
                (id, payload_for(id, self.payload_len))
            })
            .collect()
    }

    /// Send one batch of `n` messages (must be ACKed), learn the offsets it got by polling,
    /// record them, and return them.
    pub async fn send_acked(&mut self, client: &IggyClient, n: usize) -> Vec<u64> {
        let msgs = self.next_messages(n);
        send_batch(client, self.stream, self.topic, self.partition, &msgs)
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "send to partition {} not ACKed: {e} ({})",
                    self.partition,
                    e.as_code()
                )
            });
        self.learn(client, &msgs).await
    }

    /// Find the offsets of `msgs` (ACKed, single producer per partition: they follow every
    /// known message) and record them.
    pub async fn learn(&mut self, client: &IggyClient, msgs: &[(u128, Vec<u8>)]) -> Vec<u64> {
        let from = self.max_offset().map_or(0, |o| o + 1);
        let polled = poll_from(
            client,
            self.stream,
            self.topic,
            self.partition,
            PollingStrategy::offset(from),
            msgs.len() as u32 + 16,
        )
        .await
        .unwrap_or_else(|e| panic!("poll after send: {e} ({})", e.as_code()));
        let mut offsets = Vec::new();
        for (id, payload) in msgs {
            let m = polled
                .messages
                .iter()
                .find(|m| m.header.id == *id)
                .unwrap_or_else(|| panic!("ACKed message {id:#x} not visible from offset {from}"));
            assert!(
                m.payload[..] == payload[..],
                "ACKed message {id:#x}: payload differs"
            );
            let prev = self.acked.insert(m.header.offset, (*id, payload.clone()));
            assert!(
                prev.is_none(),
                "offset {} ACKed twice: first {:#x}, now {id:#x}",
                m.header.offset,
                prev.unwrap().0
            );
            offsets.push(m.header.offset);
        }
        offsets
    }

    /// Poll the whole partition and assert every ACKed message is at its offset with identical
    /// bytes. With `exact`, nothing else is there either. Returns the polled messages.
    pub async fn verify(&self, client: &IggyClient, exact: bool) -> Vec<IggyMessage> {
        let all = poll_all(
            client,
            self.stream,
            self.topic,
            self.partition,
            1000,
            self.acked.len() + 100_000,
        )
        .await;
        let mut by_offset = std::collections::BTreeMap::new();
        let mut prev: Option<u64> = None;
        for m in &all {
            if let Some(p) = prev {
                assert!(
                    m.header.offset > p,
                    "poll returned offset {} after {p}",
                    m.header.offset
                );
            }
            prev = Some(m.header.offset);
            by_offset.insert(m.header.offset, m);
        }
        for (offset, (id, payload)) in &self.acked {
            let m = by_offset.get(offset).unwrap_or_else(|| {
                panic!(
                    "partition {}: ACKed message {id:#x} at offset {offset} is missing ({} polled, {} ACKed)",
                    self.partition,
                    all.len(),
                    self.acked.len()
                )
            });
            assert_eq!(
                m.header.id, *id,
                "partition {}: offset {offset} holds another message",
                self.partition
            );
            assert!(
                m.payload[..] == payload[..],
                "partition {}: offset {offset}: payload bytes differ",
                self.partition
            );
        }
        if exact {
            assert_eq!(
                all.len(),
                self.acked.len(),
                "partition {}: polled {} messages, ACKed {}",
                self.partition,
                all.len(),
                self.acked.len()
            );
        }
        all
    }
}

/// Unmounts a tmpfs on drop.
pub struct TmpfsMount {
    pub path: PathBuf,
}

impl TmpfsMount {
    /// `mount -t tmpfs -o size=<size> tmpfs <path>`; panics with a clear message if refused.
    pub fn mount(path: &Path, size: &str) -> TmpfsMount {
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(path)
            .output()
            .unwrap_or_else(|e| {
                panic!("could not run mount(8): {e}; the disk-full scenario needs root and mount")
            });
        assert!(
            out.status.success(),
            "mounting a {size} tmpfs on {} failed ({:?}): {}; the disk-full scenario must run as root with \
             mount permitted (CI does)",
            path.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        TmpfsMount {
            path: path.to_path_buf(),
        }
    }
}

impl Drop for TmpfsMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.path).status();
    }
}

/// Run `cairn check <dir>` on a stopped server's data dir holding damage: it must exit 1 and
/// say "damaged". Returns its stdout.
#[track_caller]
pub fn assert_check_reports_damage(data_dir: &Path) -> String {
    let bin = env!("CARGO_BIN_EXE_cairn");
    let out = Command::new(bin)
        .arg("check")
        .arg(data_dir)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("failed to run {bin} check: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "`cairn check {}` on damaged data: {:?}\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}",
        data_dir.display(),
        out.status
    );
    assert!(
        stdout.to_lowercase().contains("damaged") || stderr.to_lowercase().contains("damaged"),
        "`cairn check` exit 1 without saying 'damaged':\n{stdout}\n{stderr}"
    );
    stdout
}

impl TestServer {
    /// Clean stop (SIGTERM, exit 0 asserted) of a server whose data dir deliberately holds
    /// damage (a refused partition): instead of [`TestServer::stop`]'s healthy check, `cairn
    /// check` must report the damage (exit 1). Returns the check's stdout.
    pub fn stop_with_damage(mut self) -> String {
        let status = self.terminate();
        assert!(
            status.success(),
            "cairn did not exit cleanly after SIGTERM: {status:?}; stderr tail:\n{}",
            self.logs()
        );
        assert_check_reports_damage(&self.data_dir)
    }
}
