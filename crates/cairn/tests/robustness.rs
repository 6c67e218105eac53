//! Acceptance 9: a seeded generator throws thousands of random and mutated frames at a live
//! server over raw connections (random headers, valid headers with random bodies, mutated
//! login / send / poll bodies, declared sizes above the limit, truncated frames), reconnecting
//! whenever the server closes a connection. Every frame must be answered with a well-formed
//! reply or eviction, or the connection closed — never a hang. Afterwards the process must
//! still be alive and a good SDK client must be able to log in, create a stream, send and poll.

mod common;

use common::*;
use iggy::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

const MAX_FRAMES: usize = 3_000;
const TIME_BUDGET: Duration = Duration::from_secs(25);
const MIN_FRAMES: usize = 500;
const MAX_FRAME_BYTES: u32 = 256 * 1024;
const MAX_LOGIN_MUTATIONS: usize = 120;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    RandomHeader,
    ValidHeaderRandomBody,
    MutatedLogin,
    MutatedSend,
    MutatedRead,
    Oversized,
    Undersized,
    Garbage,
}

struct Gen {
    rng: StdRng,
    stream: u32,
    topic: u32,
    login_mutations: usize,
}

/// A generated frame: the bytes to write, whether the connection must be half-closed after
/// writing (declared size and actual bytes disagree), and whether it needs a logged-in
/// connection.
struct Fuzzed {
    kind: Kind,
    bytes: Vec<u8>,
    half_close: bool,
}

const KNOWN_CODES: &[u32] = &[
    1, 10, 11, 12, 13, 14, 20, 21, 22, 31, 32, 33, 34, 35, 36, 37, 39, 41, 42, 43, 100, 101, 102, 103, 104,
    120, 121, 122, 123, 200, 201, 202, 203, 204, 205, 300, 301, 302, 303, 304, 305, 402, 403, 503, 600, 601,
    602, 603, 604, 605, 606,
];

impl Gen {
    fn random_bytes(&mut self, max: usize) -> Vec<u8> {
        let n = self.rng.gen_range(0..=max);
        let mut v = vec![0u8; n];
        self.rng.fill(&mut v[..]);
        v
    }

    fn mutate(&mut self, mut b: Vec<u8>) -> Vec<u8> {
        let rounds = self.rng.gen_range(1..=4);
        for _ in 0..rounds {
            match self.rng.gen_range(0..7) {
                0 if !b.is_empty() => {
                    let i = self.rng.gen_range(0..b.len());
                    b[i] ^= 1 << self.rng.gen_range(0..8);
                }
                1 if !b.is_empty() => {
                    let i = self.rng.gen_range(0..b.len());
                    b[i] = self.rng.r#gen();
                }
                2 if !b.is_empty() => {
                    let n = self.rng.gen_range(0..b.len());
                    b.truncate(n);
                }
                3 => {
                    let extra = self.random_bytes(64);
                    let i = self.rng.gen_range(0..=b.len());
                    b.splice(i..i, extra);
                }
                4 if b.len() >= 4 => {
                    let i = self.rng.gen_range(0..=b.len() - 4);
                    let v: u32 = match self.rng.gen_range(0..4) {
                        0 => 0,
                        1 => u32::MAX,
                        2 => 0x8000_0000,
                        _ => self.rng.gen_range(256..100_000),
                    };
                    b[i..i + 4].copy_from_slice(&v.to_le_bytes());
                }
                5 if b.len() >= 2 => {
                    let a = self.rng.gen_range(0..b.len());
                    let c = self.rng.gen_range(a..b.len());
                    let seg = b[a..c].to_vec();
                    b.extend_from_slice(&seg);
                }
                _ => {
                    if !b.is_empty() {
                        let i = self.rng.gen_range(0..b.len());
                        b.remove(i);
                    }
                }
            }
        }
        b
    }

    fn send_template(&mut self) -> Vec<u8> {
        let n = self.rng.gen_range(1..=5);
        let msgs: Vec<batch::RawMessage> = (0..n)
            .map(|i| {
                let mut payload = vec![0u8; self.rng.gen_range(1..=300)];
                self.rng.fill(&mut payload[..]);
                let mut headers = Vec::new();
                if self.rng.gen_bool(0.3) {
                    enc::tlv_str(&mut headers, "k");
                    enc::tlv_str(&mut headers, "v");
                }
                batch::RawMessage {
                    id: self.rng.r#gen::<u128>() | 1,
                    origin_timestamp: now_micros() + i,
                    payload,
                    headers,
                }
            })
            .collect();
        let p = self.rng.gen_range(0..2);
        enc::send_messages(self.stream, self.topic, p, &batch::encode(&msgs))
    }

    fn read_template(&mut self) -> (u32, Vec<u8>) {
        let (s, t) = (self.stream, self.topic);
        match self.rng.gen_range(0..6) {
            0 => (
                code::POLL_MESSAGES,
                enc::poll(
                    self.rng.r#gen(),
                    s,
                    t,
                    Some(self.rng.gen_range(0..3)),
                    (self.rng.gen_range(1..=5), self.rng.gen_range(0..50)),
                    self.rng.gen_range(0..50),
                    self.rng.gen_bool(0.3),
                ),
            ),
            1 => (code::GET_TOPIC, enc::stream_topic(s, t)),
            2 => {
                let mut b = Vec::new();
                enc::id_num(&mut b, s);
                (code::GET_STREAM, b)
            }
            3 => (
                code::GET_CONSUMER_OFFSET,
                enc::consumer_offset_target(self.rng.r#gen(), s, t, Some(0)),
            ),
            4 => (
                code::STORE_CONSUMER_OFFSET,
                enc::store_offset(self.rng.r#gen(), s, t, Some(1), self.rng.gen_range(0..100)),
            ),
            _ => (code::CREATE_STREAM, enc::create_stream("fz-created")),
        }
    }

    fn frame(&mut self, header: &ReqHeader, body: &[u8]) -> Vec<u8> {
        let mut v = header.encode(body.len()).to_vec();
        v.extend_from_slice(body);
        v
    }

    fn next(&mut self, conn: &RawConn, logged_in: bool) -> Fuzzed {
        let mut kind = match self.rng.gen_range(0..100) {
            0..=14 => Kind::RandomHeader,
            15..=34 => Kind::ValidHeaderRandomBody,
            35..=44 => Kind::MutatedLogin,
            45..=64 => Kind::MutatedSend,
            65..=84 => Kind::MutatedRead,
            85..=89 => Kind::Oversized,
            90..=94 => Kind::Undersized,
            _ => Kind::Garbage,
        };
        if kind == Kind::MutatedLogin && self.login_mutations >= MAX_LOGIN_MUTATIONS {
            kind = Kind::MutatedRead;
        }
        let session = if logged_in { conn.session } else { 0 };
        let request = conn.next_request.max(1);
        match kind {
            Kind::RandomHeader => {
                let mut h = [0u8; HEADER_SIZE];
                self.rng.fill(&mut h[..]);
                let body = self.random_bytes(512);
                let consistent = self.rng.gen_bool(0.7);
                if consistent {
                    h[48..52].copy_from_slice(&((HEADER_SIZE + body.len()) as u32).to_le_bytes());
                }
                if self.rng.gen_bool(0.5) {
                    h[60] = CMD_REQUEST;
                }
                let mut bytes = h.to_vec();
                bytes.extend_from_slice(&body);
                Fuzzed {
                    kind,
                    bytes,
                    half_close: !consistent,
                }
            }
            Kind::ValidHeaderRandomBody => {
                let (operation, code) = match self.rng.gen_range(0..4) {
                    0 => (
                        op::NON_REPLICATED,
                        KNOWN_CODES[self.rng.gen_range(0..KNOWN_CODES.len())],
                    ),
                    1 => (op::NON_REPLICATED, self.rng.r#gen()),
                    2 => {
                        let c = KNOWN_CODES[self.rng.gen_range(0..KNOWN_CODES.len())];
                        (operation_for_code(c), c)
                    }
                    _ => (self.rng.r#gen(), 0),
                };
                let body = self.random_bytes(1024);
                let req = if operation == op::REGISTER { 0 } else { request };
                let ses = if operation == op::REGISTER { 0 } else { session };
                let mut h = ReqHeader::new(random_client_id(), operation, code, req, ses);
                h.request_checksum = request_checksum_for(operation, &body);
                Fuzzed {
                    kind,
                    bytes: self.frame(&h, &body),
                    half_close: false,
                }
            }
            Kind::MutatedLogin => {
                self.login_mutations += 1;
                let base = if self.rng.gen_bool(0.8) {
                    enc::login_body(PROTOCOL_VERSION, ROOT_USER, ROOT_PASSWORD)
                } else {
                    enc::pat_login_body(PROTOCOL_VERSION, "some-token-value")
                };
                let body = self.mutate(base);
                let mut h = ReqHeader::new(random_client_id(), op::REGISTER, 0, 0, 0);
                h.request_checksum = request_checksum_for(op::REGISTER, &body);
                Fuzzed {
                    kind,
                    bytes: self.frame(&h, &body),
                    half_close: false,
                }
            }
            Kind::MutatedSend => {
                let base = self.send_template();
                let body = if self.rng.gen_bool(0.9) {
                    self.mutate(base)
                } else {
                    base
                };
                let h = ReqHeader::new(conn.client, op::SEND_MESSAGES, 0, request, session);
                Fuzzed {
                    kind,
                    bytes: self.frame(&h, &body),
                    half_close: false,
                }
            }
            Kind::MutatedRead => {
                let (code, base) = self.read_template();
                let body = if self.rng.gen_bool(0.8) {
                    self.mutate(base)
                } else {
                    base
                };
                let operation = operation_for_code(code);
                let mut h = ReqHeader::new(conn.client, operation, code, request, session);
                h.request_checksum = request_checksum_for(operation, &body);
                Fuzzed {
                    kind,
                    bytes: self.frame(&h, &body),
                    half_close: false,
                }
            }
            Kind::Oversized => {
                let mut h = ReqHeader::new(conn.client, op::NON_REPLICATED, code::PING, request, session);
                h.size_override = Some(self.rng.gen_range(MAX_FRAME_BYTES + 1..=u32::MAX));
                // A few bytes of the "body" follow, but never the declared amount.
                let body = self.random_bytes(64);
                let mut bytes = h.encode(0).to_vec();
                bytes.extend_from_slice(&body);
                Fuzzed {
                    kind,
                    bytes,
                    half_close: false,
                }
            }
            Kind::Undersized => {
                let mut h = ReqHeader::new(conn.client, op::NON_REPLICATED, code::PING, request, session);
                h.size_override = Some(self.rng.gen_range(0..HEADER_SIZE as u32));
                Fuzzed {
                    kind,
                    bytes: h.encode(0).to_vec(),
                    half_close: false,
                }
            }
            Kind::Garbage => {
                let n = self.rng.gen_range(1..600);
                let mut bytes = vec![0u8; n];
                self.rng.fill(&mut bytes[..]);
                Fuzzed {
                    kind,
                    bytes,
                    half_close: true,
                }
            }
        }
    }
}

#[derive(Default, Debug)]
struct Outcomes {
    replies_ok: usize,
    replies_err: usize,
    evictions: usize,
    closes: usize,
    reconnects: usize,
    logins: usize,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fuzzed_frames_do_not_take_the_server_down() {
    let seed: u64 = std::env::var("CAIRN_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("fuzz seed = {seed} (set CAIRN_FUZZ_SEED to replay)");

    let dir = temp_dir();
    let max = MAX_FRAME_BYTES.to_string();
    let batch_max = format!("limits.batch_bytes_max={}", MAX_FRAME_BYTES - 8192);
    // The server requires max_frame_bytes >= batch_bytes_max + 1280.
    let mut server =
        TestServer::start_with(dir.path(), &["--max-frame-bytes", &max, "--set", &batch_max], &[]);
    let addr = server.addr();
    let (s, t) = {
        let client = root_client(addr).await;
        create_stream_topic(&client, "fuzz", "target", 2).await
    };

    let mut g = Gen {
        rng: StdRng::seed_from_u64(seed),
        stream: s,
        topic: t,
        login_mutations: 0,
    };
    let mut out = Outcomes::default();
    let mut conn: Option<(RawConn, bool)> = None;
    let start = Instant::now();
    let mut frames = 0usize;

    while frames < MAX_FRAMES && start.elapsed() < TIME_BUDGET {
        if conn.is_none() {
            out.reconnects += 1;
            let mut c = RawConn::connect(addr).await;
            // Log in on a third of the connections so post-auth paths get fuzzed too.
            let logged_in = g.rng.gen_bool(0.35);
            if logged_in {
                out.logins += 1;
                c.login_root().await;
            }
            conn = Some((c, logged_in));
        }
        let (c, logged_in) = conn.as_mut().unwrap();
        let fz = g.next(c, *logged_in);
        frames += 1;
        let describe = |fz: &Fuzzed| {
            format!(
                "frame #{frames} kind {:?} ({} bytes, first 64: {:02x?}); seed {seed}",
                fz.kind,
                fz.bytes.len(),
                &fz.bytes[..fz.bytes.len().min(64)]
            )
        };
        if c.write_all(&fz.bytes).await.is_err() {
            out.closes += 1;
            conn = None;
            continue;
        }
        if fz.half_close {
            let _ = c.stream.shutdown().await;
        }
        // Read frames until a reply/eviction, a close, or a timeout (which fails the test).
        match c.read_frame_timeout(Duration::from_secs(5)).await {
            Ok(f) => {
                assert!(
                    f.is_reply() || f.is_eviction(),
                    "server sent command {} — {}",
                    f.command(),
                    describe(&fz)
                );
                assert!(
                    f.size() as usize >= HEADER_SIZE,
                    "reply size < 256 — {}",
                    describe(&fz)
                );
                assert_eq!(f.size() as usize, HEADER_SIZE + f.body.len());
                if f.is_eviction() {
                    out.evictions += 1;
                    assert_eq!(f.size() as usize, HEADER_SIZE, "eviction with a body");
                    assert_ne!(f.eviction_reason(), 0, "eviction reason 0 — {}", describe(&fz));
                    conn = None;
                } else {
                    if f.status() != 0 {
                        out.replies_err += 1;
                        assert!(
                            f.body.is_empty(),
                            "error status {} with a body — {}",
                            f.status(),
                            describe(&fz)
                        );
                    } else {
                        out.replies_ok += 1;
                        // A successful Register makes this connection logged in.
                        if f.operation() == op::REGISTER {
                            c.absorb_login(&f);
                            *logged_in = true;
                        } else if f.operation() != op::NON_REPLICATED && *logged_in {
                            c.next_request += 1;
                        }
                    }
                    if fz.half_close {
                        conn = None;
                    }
                }
            }
            Err(RawError::Closed) | Err(RawError::Io(_)) => {
                out.closes += 1;
                conn = None;
            }
            Err(RawError::Timeout) => {
                panic!(
                    "server neither answered nor closed within 5 s — {}\nstderr tail:\n{}",
                    describe(&fz),
                    server.logs()
                );
            }
        }
        if frames.is_multiple_of(200) {
            assert!(server.is_running(), "server died during fuzzing — seed {seed}");
        }
    }
    eprintln!("fuzz: {frames} frames in {:?}: {out:?}", start.elapsed());
    assert!(
        frames >= MIN_FRAMES,
        "only {frames} frames within the time budget"
    );
    assert!(server.is_running(), "server process died — seed {seed}");
    drop(conn);

    // A good client still works end to end.
    let client = root_client(addr).await;
    client.ping().await.expect("ping after fuzzing");
    let stream = client
        .create_stream("after-fuzz")
        .await
        .expect("create stream after fuzzing");
    let topic = client
        .create_topic(&id_num(stream.id), "t", &topic_opts(1))
        .await
        .expect("create topic after fuzzing");
    let mut msgs: Vec<IggyMessage> = (0..10)
        .map(|i| sdk_message(i + 1, vec![i as u8 + 1; 32]))
        .collect();
    client
        .send_messages(
            &id_num(stream.id),
            &id_num(topic.id),
            &Partitioning::partition_id(0),
            &mut msgs,
        )
        .await
        .expect("send after fuzzing");
    let polled = client
        .poll_messages(
            &id_num(stream.id),
            &id_num(topic.id),
            Some(0),
            &Consumer::new(id_num(1)),
            &PollingStrategy::first(),
            100,
            false,
        )
        .await
        .expect("poll after fuzzing");
    assert_eq!(polled.messages.len(), 10);
    for (i, m) in polled.messages.iter().enumerate() {
        assert_eq!(m.header.offset, i as u64);
        assert_eq!(m.header.id, i as u128 + 1);
    }
    // The fuzz target topic still decodes for the SDK (whatever fuzzing stored in it).
    let fuzz_topic = client
        .get_topic(&id_num(s), &id_num(t))
        .await
        .expect("get fuzz topic")
        .expect("fuzz topic exists");
    for p in 0..2u32 {
        let all = poll_all(&client, s, t, p, 500, 100_000).await;
        assert_eq!(all.len() as u64, fuzz_topic.partitions[p as usize].messages_count);
        for (i, m) in all.iter().enumerate() {
            assert_eq!(m.header.offset, i as u64, "fuzz partition {p} offsets contiguous");
        }
    }
    drop(client);
    server.stop();
}
