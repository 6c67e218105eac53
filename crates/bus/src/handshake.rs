//! The handshake that opens every replica connection: pure code, no IO, nonces given by the
//! caller.
//!
//! The node with the lower id dials. Three frames of [`FRAME_SIZE`] bytes:
//!
//! ```text
//! dialler  -> acceptor  Hello      cluster, dialler id, acceptor id, dialler nonce
//! acceptor -> dialler   Challenge  the same ids, acceptor nonce, MAC(acceptor direction)
//! dialler  -> acceptor  Finish     the same ids, MAC(dialler direction)
//! ```
//!
//! Each MAC is BLAKE3 in keyed mode over the domain, the handshake version, the direction,
//! the cluster id, both node ids and both nonces, under a key derived from the shared secret and the two ids
//! ([`PairKey`]). So a MAC verifies only for a peer that knows the secret and names the same
//! pair of ids, and a recorded frame is useless in a connection with a fresh nonce. With one
//! secret for the whole cluster this proves membership, not identity: any holder of the
//! secret can compute any pair's key. The ids are bound into the MAC, so a process that does
//! not know the secret cannot claim any id, and the connection carries that pair's traffic
//! only (the frame checks bind each message's sender to the peer).
//!
//! Frame layout (little-endian):
//!
//! | off | size | field |
//! |---:|---:|---|
//! | 0 | 8 | magic `CAIRNBUS` |
//! | 8 | 2 | version ([`VERSION`]) |
//! | 10 | 1 | kind: 1 Hello, 2 Challenge, 3 Finish |
//! | 11 | 1 | holds data: 1 when the sender holds data of this cluster, else 0 (Challenge, Finish; zero in Hello) |
//! | 12 | 4 | zero |
//! | 16 | 16 | cluster id |
//! | 32 | 4 | dialler node id |
//! | 36 | 4 | acceptor node id |
//! | 40 | 32 | nonce (Hello: the dialler's; Challenge: the acceptor's; Finish: zero) |
//! | 72 | 32 | MAC (Challenge, Finish; zero in Hello) |
//! | 104 | 16 | zero |
//! | 120 | 8 | XXH3-64 of bytes 0..120 |
//!
//! The "holds data" flag is how a node without any data tells, at its first start, whether
//! it forms a new cluster (no peer holds data) or lost its disk (a peer does). Each MAC covers
//! its sender's flag.
//!
//! The checksum is not security (the MAC is); it tells a peer that is not a Cairn replica, or
//! a torn frame, from a wrong secret, so the log says which it was.

use xxhash_rust::xxh3::xxh3_64;

/// Bytes of every handshake frame.
pub const FRAME_SIZE: usize = 128;
/// The handshake's version: a peer with another is refused, naming both.
pub const VERSION: u16 = 1;
const MAGIC: &[u8; 8] = b"CAIRNBUS";

const OFFSET_VERSION: usize = 8;
const OFFSET_KIND: usize = 10;
const OFFSET_HOLDS_DATA: usize = 11;
const OFFSET_CLUSTER: usize = 16;
const OFFSET_DIALLER: usize = 32;
const OFFSET_ACCEPTOR: usize = 36;
const OFFSET_NONCE: usize = 40;
const OFFSET_MAC: usize = 72;
const OFFSET_CHECKSUM: usize = 120;

/// The key context of [`ClusterKey`]: BLAKE3's key derivation wants a unique context string.
const KEY_CONTEXT: &str = "cairn 2026-12-03 replica network cluster key";
/// Domain of every MAC transcript.
const MAC_DOMAIN: &[u8; 16] = b"cairn-bus-mac-v1";

/// The three frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    Hello = 1,
    Challenge = 2,
    Finish = 3,
}

/// Which side a MAC speaks for (a MAC never verifies for the other direction).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Direction {
    Acceptor = 1,
    Dialler = 2,
}

/// Why a handshake failed. The text is for the log: it says what the peer did, never the
/// secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    #[error("not a Cairn replica handshake frame (bad magic or checksum)")]
    NotAFrame,
    #[error("handshake version {theirs}, this node speaks {VERSION}")]
    Version { theirs: u16 },
    #[error("expected a {expected:?} frame, got kind {got}")]
    UnexpectedKind { expected: Kind, got: u8 },
    #[error("the peer is of cluster {theirs:032x}, this node of {ours:032x} (another node list?)")]
    Cluster { ours: u128, theirs: u128 },
    #[error("the peer claims node id {claimed}, which is not in this node's list")]
    UnknownNode { claimed: u32 },
    #[error("the frame is addressed to node {addressed}, this is node {ours}")]
    NotForUs { addressed: u32, ours: u32 },
    #[error("node {dialler} dialled node {acceptor}; only the lower id dials")]
    WrongDirection { dialler: u32, acceptor: u32 },
    #[error(
        "the frame names nodes {dialler} -> {acceptor}, the handshake began as {expected_dialler} -> {expected_acceptor}"
    )]
    IdsChanged {
        dialler: u32,
        acceptor: u32,
        expected_dialler: u32,
        expected_acceptor: u32,
    },
    #[error(
        "the MAC does not verify: the peer does not know the cluster secret, or claims another node's id"
    )]
    Mac,
}

/// The cluster's key, derived once from the shared secret.
#[derive(Clone)]
pub struct ClusterKey([u8; 32]);

impl std::fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterKey(..)")
    }
}

impl ClusterKey {
    pub fn derive(secret: &[u8]) -> ClusterKey {
        ClusterKey(blake3::derive_key(KEY_CONTEXT, secret))
    }

    /// The key of the connection between nodes `a` and `b` (either order).
    pub fn pair(&self, a: u32, b: u32) -> PairKey {
        let (low, high) = (a.min(b), a.max(b));
        let mut material = [0u8; 12];
        material[..4].copy_from_slice(b"pair");
        material[4..8].copy_from_slice(&low.to_le_bytes());
        material[8..].copy_from_slice(&high.to_le_bytes());
        PairKey(*blake3::keyed_hash(&self.0, &material).as_bytes())
    }
}

/// The key of one node pair: MACs of that pair's handshakes verify under it only.
#[derive(Clone)]
pub struct PairKey([u8; 32]);

impl PairKey {
    fn mac(
        &self,
        direction: Direction,
        cluster: u128,
        ids: Ids,
        nonces: (&[u8; 32], &[u8; 32]),
        holds_data: bool,
    ) -> blake3::Hash {
        let mut hasher = blake3::Hasher::new_keyed(&self.0);
        hasher.update(MAC_DOMAIN);
        hasher.update(&VERSION.to_le_bytes());
        hasher.update(&[direction as u8, u8::from(holds_data)]);
        hasher.update(&cluster.to_le_bytes());
        hasher.update(&ids.dialler.to_le_bytes());
        hasher.update(&ids.acceptor.to_le_bytes());
        hasher.update(nonces.0);
        hasher.update(nonces.1);
        hasher.finalize()
    }
}

/// The two ends of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ids {
    dialler: u32,
    acceptor: u32,
}

/// A decoded frame.
struct Frame {
    kind: u8,
    holds_data: bool,
    ids: Ids,
    nonce: [u8; 32],
    mac: [u8; 32],
}

fn encode(
    kind: Kind,
    holds_data: bool,
    cluster: u128,
    ids: Ids,
    nonce: &[u8; 32],
    mac: &[u8; 32],
) -> [u8; FRAME_SIZE] {
    let mut frame = [0u8; FRAME_SIZE];
    frame[..8].copy_from_slice(MAGIC);
    frame[OFFSET_VERSION..OFFSET_VERSION + 2].copy_from_slice(&VERSION.to_le_bytes());
    frame[OFFSET_KIND] = kind as u8;
    frame[OFFSET_HOLDS_DATA] = u8::from(holds_data);
    frame[OFFSET_CLUSTER..OFFSET_CLUSTER + 16].copy_from_slice(&cluster.to_le_bytes());
    frame[OFFSET_DIALLER..OFFSET_DIALLER + 4].copy_from_slice(&ids.dialler.to_le_bytes());
    frame[OFFSET_ACCEPTOR..OFFSET_ACCEPTOR + 4].copy_from_slice(&ids.acceptor.to_le_bytes());
    frame[OFFSET_NONCE..OFFSET_NONCE + 32].copy_from_slice(nonce);
    frame[OFFSET_MAC..OFFSET_MAC + 32].copy_from_slice(mac);
    let checksum = xxh3_64(&frame[..OFFSET_CHECKSUM]);
    frame[OFFSET_CHECKSUM..].copy_from_slice(&checksum.to_le_bytes());
    frame
}

fn decode(frame: &[u8; FRAME_SIZE], expected: Kind, ours: u128) -> Result<Frame, HandshakeError> {
    let field = |offset: usize, len: usize| &frame[offset..offset + len];
    let checksum = u64::from_le_bytes(field(OFFSET_CHECKSUM, 8).try_into().expect("8 bytes"));
    if &frame[..8] != MAGIC || xxh3_64(&frame[..OFFSET_CHECKSUM]) != checksum {
        return Err(HandshakeError::NotAFrame);
    }
    let version = u16::from_le_bytes(field(OFFSET_VERSION, 2).try_into().expect("2 bytes"));
    if version != VERSION {
        return Err(HandshakeError::Version { theirs: version });
    }
    let kind = frame[OFFSET_KIND];
    if kind != expected as u8 {
        return Err(HandshakeError::UnexpectedKind { expected, got: kind });
    }
    let cluster = u128::from_le_bytes(field(OFFSET_CLUSTER, 16).try_into().expect("16 bytes"));
    if cluster != ours {
        return Err(HandshakeError::Cluster {
            ours,
            theirs: cluster,
        });
    }
    let holds_data = match frame[OFFSET_HOLDS_DATA] {
        0 => false,
        1 => true,
        _ => return Err(HandshakeError::NotAFrame),
    };
    Ok(Frame {
        kind,
        holds_data,
        ids: Ids {
            dialler: u32::from_le_bytes(field(OFFSET_DIALLER, 4).try_into().expect("4 bytes")),
            acceptor: u32::from_le_bytes(field(OFFSET_ACCEPTOR, 4).try_into().expect("4 bytes")),
        },
        nonce: field(OFFSET_NONCE, 32).try_into().expect("32 bytes"),
        mac: field(OFFSET_MAC, 32).try_into().expect("32 bytes"),
    })
}

fn check_ids(frame: &Frame, expected: Ids) -> Result<(), HandshakeError> {
    if frame.ids != expected {
        return Err(HandshakeError::IdsChanged {
            dialler: frame.ids.dialler,
            acceptor: frame.ids.acceptor,
            expected_dialler: expected.dialler,
            expected_acceptor: expected.acceptor,
        });
    }
    Ok(())
}

/// The dialling side, after its Hello went out.
pub struct Dialler {
    cluster: u128,
    ids: Ids,
    key: PairKey,
    nonce: [u8; 32],
    holds_data: bool,
}

/// The dialler's side of a handshake that passed: the Finish to send, and whether the
/// acceptor holds data of the cluster (authenticated by its MAC).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    pub frame: [u8; FRAME_SIZE],
    pub peer_holds_data: bool,
}

/// The acceptor's side of a handshake that passed: the dialler's id and whether it holds data
/// of the cluster, both authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Authenticated {
    pub peer: u32,
    pub peer_holds_data: bool,
}

impl Dialler {
    /// Start a handshake from node `ours` to node `peer` (`ours < peer`): the Hello to send.
    /// `holds_data` is said in the Finish.
    pub fn start(
        key: &ClusterKey,
        cluster: u128,
        ours: u32,
        peer: u32,
        nonce: [u8; 32],
        holds_data: bool,
    ) -> (Dialler, [u8; FRAME_SIZE]) {
        debug_assert!(ours < peer, "only the lower id dials");
        let ids = Ids {
            dialler: ours,
            acceptor: peer,
        };
        let hello = encode(Kind::Hello, false, cluster, ids, &nonce, &[0; 32]);
        let dialler = Dialler {
            cluster,
            ids,
            key: key.pair(ours, peer),
            nonce,
            holds_data,
        };
        (dialler, hello)
    }

    /// The acceptor's Challenge: verify its MAC and return the Finish to send. After
    /// sending it, the connection is authenticated on this side.
    pub fn on_challenge(self, frame: &[u8; FRAME_SIZE]) -> Result<Finished, HandshakeError> {
        let challenge = decode(frame, Kind::Challenge, self.cluster)?;
        debug_assert_eq!(challenge.kind, Kind::Challenge as u8);
        check_ids(&challenge, self.ids)?;
        let nonces = (&self.nonce, &challenge.nonce);
        let expected = self.key.mac(
            Direction::Acceptor,
            self.cluster,
            self.ids,
            nonces,
            challenge.holds_data,
        );
        // `blake3::Hash` compares in constant time.
        if expected != blake3::Hash::from_bytes(challenge.mac) {
            return Err(HandshakeError::Mac);
        }
        let mac = self.key.mac(
            Direction::Dialler,
            self.cluster,
            self.ids,
            nonces,
            self.holds_data,
        );
        Ok(Finished {
            frame: encode(
                Kind::Finish,
                self.holds_data,
                self.cluster,
                self.ids,
                &[0; 32],
                mac.as_bytes(),
            ),
            peer_holds_data: challenge.holds_data,
        })
    }
}

/// A Finish frame with any MAC, for tests of the accepting side's check (a dialler built
/// here always verifies the Challenge first, so it cannot send a bad Finish).
#[doc(hidden)]
pub fn finish_frame_for_tests(cluster: u128, dialler: u32, acceptor: u32, mac: [u8; 32]) -> [u8; FRAME_SIZE] {
    encode(
        Kind::Finish,
        false,
        cluster,
        Ids { dialler, acceptor },
        &[0; 32],
        &mac,
    )
}

/// The accepting side, after its Challenge went out.
pub struct Acceptor {
    cluster: u128,
    ids: Ids,
    key: PairKey,
    nonces: ([u8; 32], [u8; 32]),
}

impl Acceptor {
    /// A Hello arrived at node `ours`, whose peers are `known` (ids): check it and return the
    /// Challenge to send (saying `holds_data`). The claimed dialler id is not trusted until
    /// [`Acceptor::on_finish`].
    pub fn on_hello(
        key: &ClusterKey,
        cluster: u128,
        ours: u32,
        known: &[u32],
        frame: &[u8; FRAME_SIZE],
        nonce: [u8; 32],
        holds_data: bool,
    ) -> Result<(Acceptor, [u8; FRAME_SIZE]), HandshakeError> {
        let hello = decode(frame, Kind::Hello, cluster)?;
        let ids = hello.ids;
        if ids.acceptor != ours {
            return Err(HandshakeError::NotForUs {
                addressed: ids.acceptor,
                ours,
            });
        }
        if ids.dialler == ours || !known.contains(&ids.dialler) {
            return Err(HandshakeError::UnknownNode { claimed: ids.dialler });
        }
        if ids.dialler > ours {
            return Err(HandshakeError::WrongDirection {
                dialler: ids.dialler,
                acceptor: ours,
            });
        }
        let key = key.pair(ids.dialler, ours);
        let nonces = (hello.nonce, nonce);
        let mac = key.mac(
            Direction::Acceptor,
            cluster,
            ids,
            (&nonces.0, &nonces.1),
            holds_data,
        );
        let challenge = encode(Kind::Challenge, holds_data, cluster, ids, &nonce, mac.as_bytes());
        Ok((
            Acceptor {
                cluster,
                ids,
                key,
                nonces,
            },
            challenge,
        ))
    }

    /// The node id the Hello claimed (authenticated only once [`Acceptor::on_finish`] passes).
    pub fn claimed_peer(&self) -> u32 {
        self.ids.dialler
    }

    /// The dialler's Finish: verify its MAC. `Ok` returns the peer's id and flag, now
    /// authenticated.
    pub fn on_finish(self, frame: &[u8; FRAME_SIZE]) -> Result<Authenticated, HandshakeError> {
        let finish = decode(frame, Kind::Finish, self.cluster)?;
        check_ids(&finish, self.ids)?;
        let expected = self.key.mac(
            Direction::Dialler,
            self.cluster,
            self.ids,
            (&self.nonces.0, &self.nonces.1),
            finish.holds_data,
        );
        if expected != blake3::Hash::from_bytes(finish.mac) {
            return Err(HandshakeError::Mac);
        }
        Ok(Authenticated {
            peer: self.ids.dialler,
            peer_holds_data: finish.holds_data,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLUSTER: u128 = 0x1234_5678_9abc_def0_1122_3344_5566_7788;

    fn key(secret: &str) -> ClusterKey {
        ClusterKey::derive(secret.as_bytes())
    }

    /// Run a whole handshake: dialler `d` with `d_key`, acceptor `a` with `a_key`.
    fn handshake(d_key: &ClusterKey, d: u32, a_key: &ClusterKey, a: u32) -> Result<u32, HandshakeError> {
        let (dialler, hello) = Dialler::start(d_key, CLUSTER, d, a, [1; 32], false);
        let (acceptor, challenge) =
            Acceptor::on_hello(a_key, CLUSTER, a, &[1, 2, 3], &hello, [2; 32], false)?;
        let finish = dialler.on_challenge(&challenge)?;
        acceptor
            .on_finish(&finish.frame)
            .map(|authenticated| authenticated.peer)
    }

    #[test]
    fn each_side_learns_whether_the_other_holds_data_and_the_flag_is_authenticated() {
        let secret = key("the secret!");
        for (dialler_holds, acceptor_holds) in [(false, false), (false, true), (true, false), (true, true)] {
            let (dialler, hello) = Dialler::start(&secret, CLUSTER, 1, 3, [1; 32], dialler_holds);
            let (acceptor, challenge) =
                Acceptor::on_hello(&secret, CLUSTER, 3, &[1, 2, 3], &hello, [2; 32], acceptor_holds)
                    .expect("hello");
            let finished = dialler.on_challenge(&challenge).expect("challenge");
            assert_eq!(finished.peer_holds_data, acceptor_holds);
            let authenticated = acceptor.on_finish(&finished.frame).expect("finish");
            assert_eq!(authenticated.peer_holds_data, dialler_holds);
        }
        // A flag flipped on the path (checksum fixed up) fails the MAC on either side.
        let (dialler, hello) = Dialler::start(&secret, CLUSTER, 1, 3, [1; 32], true);
        let (acceptor, mut challenge) =
            Acceptor::on_hello(&secret, CLUSTER, 3, &[1, 2, 3], &hello, [2; 32], true).expect("hello");
        let flip = |frame: &mut [u8; FRAME_SIZE]| {
            frame[OFFSET_HOLDS_DATA] ^= 1;
            let checksum = xxh3_64(&frame[..OFFSET_CHECKSUM]);
            frame[OFFSET_CHECKSUM..].copy_from_slice(&checksum.to_le_bytes());
        };
        let mut untouched = challenge;
        flip(&mut challenge);
        assert_eq!(dialler.on_challenge(&challenge), Err(HandshakeError::Mac));
        let (dialler, _) = Dialler::start(&secret, CLUSTER, 1, 3, [1; 32], true);
        let mut finish = dialler.on_challenge(&untouched).expect("challenge").frame;
        flip(&mut finish);
        assert_eq!(acceptor.on_finish(&finish), Err(HandshakeError::Mac));
        untouched[OFFSET_HOLDS_DATA] = 2;
        let checksum = xxh3_64(&untouched[..OFFSET_CHECKSUM]);
        untouched[OFFSET_CHECKSUM..].copy_from_slice(&checksum.to_le_bytes());
        let (dialler, _) = Dialler::start(&secret, CLUSTER, 1, 3, [1; 32], true);
        assert_eq!(dialler.on_challenge(&untouched), Err(HandshakeError::NotAFrame));
    }

    #[test]
    fn peers_with_the_secret_authenticate_each_other() {
        assert_eq!(handshake(&key("the secret!"), 1, &key("the secret!"), 3), Ok(1));
        assert_eq!(handshake(&key("the secret!"), 2, &key("the secret!"), 3), Ok(2));
    }

    #[test]
    fn a_wrong_secret_fails_on_both_sides() {
        // The dialler finds out first: the acceptor's MAC does not verify.
        assert_eq!(
            handshake(&key("a wrong secret"), 1, &key("the secret!"), 3),
            Err(HandshakeError::Mac)
        );
        // A dialler that skips the check cannot produce a Finish the acceptor takes.
        let good = key("the secret!");
        let (_, hello) = Dialler::start(&key("a wrong secret"), CLUSTER, 1, 3, [1; 32], false);
        let (acceptor, _) =
            Acceptor::on_hello(&good, CLUSTER, 3, &[1, 2, 3], &hello, [2; 32], false).expect("hello");
        let ids = Ids {
            dialler: 1,
            acceptor: 3,
        };
        let forged_mac = key("a wrong secret").pair(1, 3).mac(
            Direction::Dialler,
            CLUSTER,
            ids,
            (&[1; 32], &[2; 32]),
            false,
        );
        let forged = encode(Kind::Finish, false, CLUSTER, ids, &[0; 32], forged_mac.as_bytes());
        assert_eq!(acceptor.on_finish(&forged), Err(HandshakeError::Mac));
    }

    #[test]
    fn a_claimed_id_is_bound_into_the_mac() {
        let secret = key("the secret!");
        // Node 2's Finish, replayed by a process claiming node 1 in its Hello, fails: the MAC
        // covers both ids, and the pair key differs too.
        let (dialler, _) = Dialler::start(&secret, CLUSTER, 2, 3, [1; 32], false);
        let (_, hello_as_1) = Dialler::start(&secret, CLUSTER, 1, 3, [1; 32], false);
        let (acceptor, challenge) =
            Acceptor::on_hello(&secret, CLUSTER, 3, &[1, 2, 3], &hello_as_1, [2; 32], false).expect("hello");
        assert_eq!(acceptor.claimed_peer(), 1);
        // The challenge names 1 -> 3: node 2's dialler refuses it.
        assert!(matches!(
            dialler.on_challenge(&challenge),
            Err(HandshakeError::IdsChanged { .. })
        ));
        // A Finish made for the pair 2-3 with the right ids relabelled does not verify.
        let ids = Ids {
            dialler: 2,
            acceptor: 3,
        };
        let mac = secret
            .pair(2, 3)
            .mac(Direction::Dialler, CLUSTER, ids, (&[1; 32], &[2; 32]), false);
        let relabelled = encode(
            Kind::Finish,
            false,
            CLUSTER,
            Ids {
                dialler: 1,
                acceptor: 3,
            },
            &[0; 32],
            mac.as_bytes(),
        );
        assert_eq!(acceptor.on_finish(&relabelled), Err(HandshakeError::Mac));
    }

    #[test]
    fn a_recorded_finish_fails_with_a_fresh_nonce() {
        let secret = key("the secret!");
        let (dialler, hello) = Dialler::start(&secret, CLUSTER, 1, 3, [1; 32], false);
        let (acceptor, challenge) =
            Acceptor::on_hello(&secret, CLUSTER, 3, &[1, 2, 3], &hello, [2; 32], false).expect("hello");
        let finish = dialler.on_challenge(&challenge).expect("challenge").frame;
        assert_eq!(
            acceptor
                .on_finish(&finish)
                .map(|authenticated| authenticated.peer),
            Ok(1)
        );
        let (replayed, _) =
            Acceptor::on_hello(&secret, CLUSTER, 3, &[1, 2, 3], &hello, [9; 32], false).expect("hello");
        assert_eq!(replayed.on_finish(&finish), Err(HandshakeError::Mac));
        // A challenge's MAC does not pass as a finish (the direction is in the transcript).
        let mut reflected = challenge;
        reflected[OFFSET_KIND] = Kind::Finish as u8;
        let checksum = xxh3_64(&reflected[..OFFSET_CHECKSUM]);
        reflected[OFFSET_CHECKSUM..].copy_from_slice(&checksum.to_le_bytes());
        let (acceptor, _) =
            Acceptor::on_hello(&secret, CLUSTER, 3, &[1, 2, 3], &hello, [2; 32], false).expect("hello");
        assert_eq!(acceptor.on_finish(&reflected), Err(HandshakeError::Mac));
    }

    #[test]
    fn hellos_that_break_the_rules_are_refused_by_name() {
        let secret = key("the secret!");
        let accept = |hello: &[u8; FRAME_SIZE]| {
            Acceptor::on_hello(&secret, CLUSTER, 2, &[1, 2, 3], hello, [2; 32], false)
                .map(|(_, challenge)| challenge)
        };
        let (_, from_3) = Dialler::start(&secret, CLUSTER, 1, 2, [1; 32], false);
        let mut from_3 = from_3;
        from_3[OFFSET_DIALLER..OFFSET_DIALLER + 4].copy_from_slice(&3u32.to_le_bytes());
        let checksum = xxh3_64(&from_3[..OFFSET_CHECKSUM]);
        from_3[OFFSET_CHECKSUM..].copy_from_slice(&checksum.to_le_bytes());
        assert_eq!(
            accept(&from_3),
            Err(HandshakeError::WrongDirection {
                dialler: 3,
                acceptor: 2
            })
        );
        let (_, to_3) = Dialler::start(&secret, CLUSTER, 1, 3, [1; 32], false);
        assert_eq!(
            accept(&to_3),
            Err(HandshakeError::NotForUs {
                addressed: 3,
                ours: 2
            })
        );
        let (_, from_0) = Dialler::start(&secret, CLUSTER, 0, 2, [1; 32], false);
        assert_eq!(accept(&from_0), Err(HandshakeError::UnknownNode { claimed: 0 }));
        let (_, other_cluster) = Dialler::start(&secret, CLUSTER + 1, 1, 2, [1; 32], false);
        assert!(matches!(
            accept(&other_cluster),
            Err(HandshakeError::Cluster { .. })
        ));
        let (_, mut torn) = Dialler::start(&secret, CLUSTER, 1, 2, [1; 32], false);
        torn[50] ^= 1;
        assert_eq!(accept(&torn), Err(HandshakeError::NotAFrame));
        let http = {
            let mut bytes = [0u8; FRAME_SIZE];
            bytes[..16].copy_from_slice(b"GET / HTTP/1.1\r\n");
            bytes
        };
        assert_eq!(accept(&http), Err(HandshakeError::NotAFrame));
    }

    proptest::proptest! {
        /// Any bytes given as a frame are refused or accepted without a panic, and a frame
        /// with one flipped bit never passes.
        #[test]
        fn arbitrary_frames_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), FRAME_SIZE), flip in 0..FRAME_SIZE * 8) {
            let secret = key("the secret!");
            let frame: [u8; FRAME_SIZE] = bytes.try_into().expect("size");
            let _ = Acceptor::on_hello(&secret, CLUSTER, 2, &[1, 2, 3], &frame, [2; 32], false);
            let (dialler, hello) = Dialler::start(&secret, CLUSTER, 1, 2, [1; 32], false);
            let _ = Dialler::start(&secret, CLUSTER, 1, 2, [1; 32], false).0.on_challenge(&frame);
            let (acceptor, mut challenge) = Acceptor::on_hello(&secret, CLUSTER, 2, &[1, 2, 3], &hello, [2; 32], false).expect("hello");
            challenge[flip / 8] ^= 1 << (flip % 8);
            proptest::prop_assert!(dialler.on_challenge(&challenge).is_err());
            let _ = acceptor.on_finish(&frame);
        }
    }
}
