//! The replica network over real sockets on loopback: connections between every pair,
//! authentication, the checks that cut off a misbehaving peer, reconnection, bounded queues.

use bytes::Bytes;
use cairn_bus::handshake::{Dialler, FRAME_SIZE, finish_frame_for_tests};
use cairn_bus::{Bus, BusConfig, ClusterKey, NodeAddress, Received, Sent};
use cairn_vsr::header::{Command, Header, Message};
use cairn_vsr::journal::{BodyRule, plain_body};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

const CLUSTER: u128 = 0xc0ffee;
const SECRET: &str = "a shared secret of the test";
/// Every wait in these tests is for a condition, bounded by this.
const WITHIN: Duration = Duration::from_secs(20);

/// `N` listeners on loopback and their addresses (node `i` listens on the `i`th).
async fn bind_listeners<const N: usize>() -> ([TcpListener; N], Vec<SocketAddr>) {
    let mut listeners = Vec::new();
    for _ in 0..N {
        listeners.push(TcpListener::bind("127.0.0.1:0").await.expect("bind"));
    }
    let addresses = listeners
        .iter()
        .map(|listener: &TcpListener| listener.local_addr().expect("address"))
        .collect();
    let Ok(listeners) = <[TcpListener; N]>::try_from(listeners) else {
        unreachable!("N listeners were bound")
    };
    (listeners, addresses)
}

fn nodes(addresses: &[SocketAddr]) -> Vec<NodeAddress> {
    addresses
        .iter()
        .enumerate()
        .map(|(index, address)| NodeAddress {
            id: index as u32 + 1,
            replica: address.to_string(),
        })
        .collect()
}

fn config(node_id: u32, addresses: &[SocketAddr], secret: &str) -> BusConfig {
    let mut config = BusConfig::new(
        CLUSTER,
        node_id,
        nodes(addresses),
        ClusterKey::derive(secret.as_bytes()),
        Arc::new(|_| plain_body as BodyRule),
        1024 * 1024,
    );
    config.backoff_min = Duration::from_millis(5);
    config.backoff_max = Duration::from_millis(100);
    config
}

fn message(command: Command, replica: u8, group: u64, body: &'static [u8]) -> Message {
    let mut header = Header::new(command, CLUSTER);
    header.replica = replica;
    header.group = group;
    Message::new(header, Bytes::from_static(body))
}

async fn receive(received: &mut mpsc::Receiver<Received>) -> Received {
    tokio::time::timeout(WITHIN, received.recv())
        .await
        .expect("a message within the bound")
        .expect("the bus is running")
}

/// Poll `condition` until it holds (bounded by [`WITHIN`]).
async fn eventually(what: &str, condition: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + WITHIN;
    while !condition() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} did not happen within {WITHIN:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn start_three() -> (Vec<Bus>, Vec<mpsc::Receiver<Received>>, Vec<SocketAddr>) {
    let (listeners, addresses) = bind_listeners::<3>().await;
    let mut buses = Vec::new();
    let mut receivers = Vec::new();
    for (index, listener) in listeners.into_iter().enumerate() {
        let (bus, received) =
            Bus::start(config(index as u32 + 1, &addresses, SECRET), listener).expect("start");
        buses.push(bus);
        receivers.push(received);
    }
    (buses, receivers, addresses)
}

/// Each side of every connection learns, from the handshake, whether the other holds data of
/// the cluster: what a node without data asks at its first start.
#[tokio::test]
async fn every_node_learns_which_peers_hold_data() {
    let (listeners, addresses) = bind_listeners::<3>().await;
    let mut buses = Vec::new();
    for (index, listener) in listeners.into_iter().enumerate() {
        let config = config(index as u32 + 1, &addresses, SECRET);
        // The middle node holds data: it dials node 3 and accepts node 1.
        config
            .holds_data
            .store(index == 1, std::sync::atomic::Ordering::Release);
        let (bus, _received) = Bus::start(config, listener).expect("start");
        buses.push((bus, _received));
    }
    for (bus, _) in &buses {
        for peer in (0..3u8).filter(|&peer| peer != bus.index()) {
            eventually("the handshake tells what the peer holds", || {
                bus.peer_holds_data(peer) == Some(peer == 1)
            })
            .await;
        }
    }
}

#[tokio::test]
async fn three_nodes_connect_and_carry_messages_between_every_pair() {
    let (buses, mut receivers, _) = start_three().await;
    for (from, bus) in buses.iter().enumerate() {
        for to in 0..3u8 {
            if usize::from(to) != from {
                let sent = bus.send(
                    to,
                    message(
                        Command::PrepareOk,
                        from as u8,
                        u64::from(to) * 10 + from as u64,
                        b"ok",
                    ),
                );
                assert_eq!(sent, Sent::Queued);
            }
        }
    }
    for (to, received) in receivers.iter_mut().enumerate() {
        let mut senders = Vec::new();
        for _ in 0..2 {
            let Received { from, message, .. } = receive(received).await;
            assert_eq!(
                message.header.replica, from,
                "the sender is the connection's peer"
            );
            assert_eq!(message.header.group, to as u64 * 10 + u64::from(from));
            assert_eq!(&message.body[..], b"ok");
            senders.push(from);
        }
        senders.sort();
        let expected: Vec<u8> = (0..3u8).filter(|&i| usize::from(i) != to).collect();
        assert_eq!(senders, expected);
    }
    for bus in &buses {
        for peer in 0..3u8 {
            if peer != bus.index() {
                assert!(bus.is_connected(peer));
            }
        }
    }
    for bus in buses {
        bus.shutdown().await;
    }
}

#[tokio::test]
async fn control_messages_go_ahead_of_queued_prepares() {
    let (listeners, addresses) = bind_listeners::<2>().await;
    let [first, second] = listeners;
    let (one, _one_received) = Bus::start(config(1, &addresses, SECRET), first).expect("start");
    // Queued before the peer's bus runs: the handshake cannot complete yet.
    for op in [b"prepare 1", b"prepare 2", b"prepare 3"] {
        assert_eq!(one.send(1, message(Command::Prepare, 0, 7, op)), Sent::Queued);
    }
    assert_eq!(
        one.send(1, message(Command::StartView, 0, 7, b"view")),
        Sent::Queued
    );
    let (two, mut two_received) = Bus::start(config(2, &addresses, SECRET), second).expect("start");
    let order: Vec<Command> = {
        let mut order = Vec::new();
        for _ in 0..4 {
            order.push(receive(&mut two_received).await.message.header.command);
        }
        order
    };
    assert_eq!(
        order,
        [
            Command::StartView,
            Command::Prepare,
            Command::Prepare,
            Command::Prepare
        ]
    );
    one.shutdown().await;
    two.shutdown().await;
}

#[tokio::test]
async fn a_peer_without_the_secret_is_refused_on_both_sides() {
    let (listeners, addresses) = bind_listeners::<2>().await;
    let [first, second] = listeners;
    let (one, mut one_received) =
        Bus::start(config(1, &addresses, "another secret entirely"), first).expect("start");
    let (two, mut two_received) = Bus::start(config(2, &addresses, SECRET), second).expect("start");
    one.send(1, message(Command::PrepareOk, 0, 1, b"never delivered"));
    two.send(0, message(Command::PrepareOk, 1, 1, b"never delivered"));
    // Node 1 dials and finds node 2's MAC wrong; node 2 sees each attempt end before a
    // Finish (`the_acceptor_refuses_a_finish_that_does_not_verify` covers its own check).
    eventually("both sides ending the handshakes", || {
        one.counters().handshakes_refused.load(Ordering::Relaxed) >= 2
            && two.counters().handshakes_failed.load(Ordering::Relaxed) >= 2
    })
    .await;
    assert!(!one.is_connected(1) && !two.is_connected(0));
    assert_eq!(one.counters().connections_established.load(Ordering::Relaxed), 0);
    assert_eq!(two.counters().connections_established.load(Ordering::Relaxed), 0);
    assert!(one_received.try_recv().is_err() && two_received.try_recv().is_err());
    one.shutdown().await;
    two.shutdown().await;
}

/// Open a connection to `address` as node `claimed` with `secret`: the stream after a
/// handshake the acceptor took, or the error it ended with.
async fn raw_connection(
    address: SocketAddr,
    claimed: u32,
    acceptor: u32,
    secret: &str,
) -> std::io::Result<TcpStream> {
    let mut stream = TcpStream::connect(address).await?;
    let (dialler, hello) = Dialler::start(
        &ClusterKey::derive(secret.as_bytes()),
        CLUSTER,
        claimed,
        acceptor,
        [3; 32],
        false,
    );
    stream.write_all(&hello).await?;
    let mut challenge = [0u8; FRAME_SIZE];
    stream.read_exact(&mut challenge).await?;
    let finish = dialler
        .on_challenge(&challenge)
        .map_err(|error| std::io::Error::other(error.to_string()))?;
    stream.write_all(&finish.frame).await?;
    Ok(stream)
}

/// Whether the acceptor closed `stream` (reads end or fail within the bound).
async fn closed_by_peer(stream: &mut TcpStream) -> bool {
    let mut byte = [0u8; 1];
    matches!(
        tokio::time::timeout(WITHIN, stream.read(&mut byte)).await,
        Ok(Ok(0) | Err(_))
    )
}

#[tokio::test]
async fn an_authenticated_peer_that_speaks_for_another_replica_is_cut_off() {
    let (listeners, addresses) = bind_listeners::<3>().await;
    let [_first, second, third] = listeners;
    // Only node 3 (index 2) runs at first: nothing else takes the raw connections' place.
    let (three, mut three_received) = Bus::start(config(3, &addresses, SECRET), third).expect("start");

    // An impostor without the secret, claiming node 1: refused at the handshake.
    let impostor = raw_connection(addresses[2], 1, 3, "not the secret").await;
    assert!(impostor.is_err(), "the impostor's handshake failed");
    eventually("the failed handshake counted", || {
        three.counters().handshakes_failed.load(Ordering::Relaxed) >= 1
    })
    .await;

    // A holder of the secret connected as node 2 (index 1) that sends a message naming node
    // 1 (index 0) as its sender: the connection is closed, the message never delivered.
    let mut stream = raw_connection(addresses[2], 2, 3, SECRET)
        .await
        .expect("handshake");
    let forged = message(Command::PrepareOk, 0, 99, b"forged");
    stream.write_all(&forged.header.encode()).await.expect("write");
    stream.write_all(&forged.body).await.expect("write");
    assert!(closed_by_peer(&mut stream).await, "the connection is closed");
    eventually("the refused message counted", || {
        three.counters().messages_refused.load(Ordering::Relaxed) == 1
    })
    .await;

    // The real node 2 connects and is heard; the forged message never was.
    let (two, _two_received) = Bus::start(config(2, &addresses, SECRET), second).expect("start");
    two.send(2, message(Command::PrepareOk, 1, 5, b"real"));
    let received = receive(&mut three_received).await;
    assert_eq!((received.from, received.message.header.group), (1, 5));
    two.shutdown().await;
    three.shutdown().await;
}

#[tokio::test]
async fn the_acceptor_refuses_a_finish_that_does_not_verify() {
    let (listeners, addresses) = bind_listeners::<2>().await;
    let [_first, second] = listeners;
    let (two, mut two_received) = Bus::start(config(2, &addresses, SECRET), second).expect("start");
    // A dialler that does not check the Challenge and answers with a MAC it cannot make.
    let mut stream = TcpStream::connect(addresses[1]).await.expect("connect");
    let (_, hello) = Dialler::start(
        &ClusterKey::derive(b"not the secret"),
        CLUSTER,
        1,
        2,
        [3; 32],
        false,
    );
    stream.write_all(&hello).await.expect("hello");
    let mut challenge = [0u8; FRAME_SIZE];
    stream.read_exact(&mut challenge).await.expect("challenge");
    stream
        .write_all(&finish_frame_for_tests(CLUSTER, 1, 2, [0x5a; 32]))
        .await
        .expect("finish");
    let forged = message(Command::PrepareOk, 0, 1, b"after a bad finish");
    // The write may fail once the acceptor has closed: either way nothing is delivered.
    let _ = stream.write_all(&forged.header.encode()).await;
    let _ = stream.write_all(&forged.body).await;
    assert!(closed_by_peer(&mut stream).await, "the connection is closed");
    eventually("the refusal counted", || {
        two.counters().handshakes_refused.load(Ordering::Relaxed) == 1
    })
    .await;
    assert_eq!(two.counters().connections_established.load(Ordering::Relaxed), 0);
    assert_eq!(two.counters().handshakes_failed.load(Ordering::Relaxed), 0);
    assert!(two_received.try_recv().is_err(), "nothing was delivered");
    assert!(!two.is_connected(0));
    two.shutdown().await;
}

#[tokio::test]
async fn a_newer_connection_of_a_peer_replaces_the_older_one() {
    let (buses, mut receivers, addresses) = start_three().await;
    eventually("node 2 connected to node 3", || buses[1].is_connected(2)).await;
    // A second authenticated connection for node 2 (a holder of the secret): it replaces
    // the live one at node 3, whose writer stops taking from node 2's queue.
    let mut raw = raw_connection(addresses[2], 2, 3, SECRET)
        .await
        .expect("handshake");
    // Node 2 sees its connection end and dials again, replacing the raw one in turn.
    eventually("node 2 dialled again", || {
        buses[1]
            .counters()
            .connections_established
            .load(Ordering::Relaxed)
            >= 2
    })
    .await;
    assert!(closed_by_peer(&mut raw).await, "the raw connection was replaced");
    buses[1].send(2, message(Command::PrepareOk, 1, 42, b"after"));
    let received = loop {
        let received = receive(&mut receivers[2]).await;
        if received.message.header.group == 42 {
            break received;
        }
    };
    assert_eq!(received.from, 1);
    for bus in buses {
        bus.shutdown().await;
    }
}

#[tokio::test]
async fn restarted_peers_are_reconnected_in_both_directions() {
    let (mut buses, mut receivers, addresses) = start_three().await;
    for restarted in [1usize, 0] {
        let bus = buses.remove(restarted);
        bus.shutdown().await;
        let listener = TcpListener::bind(addresses[restarted])
            .await
            .expect("rebind the same port");
        let (bus, received) =
            Bus::start(config(restarted as u32 + 1, &addresses, SECRET), listener).expect("restart");
        buses.insert(restarted, bus);
        receivers[restarted] = received;
        // Messages flow both ways between the restarted node and each other node again.
        for other in (0..3).filter(|&other| other != restarted) {
            for (from, to) in [(restarted, other), (other, restarted)] {
                let group = 1000 + (from * 10 + to) as u64;
                let deadline = tokio::time::Instant::now() + WITHIN;
                'delivered: loop {
                    assert!(
                        tokio::time::Instant::now() < deadline,
                        "{from} -> {to} never delivered"
                    );
                    buses[from].send(to as u8, message(Command::PrepareOk, from as u8, group, b"again"));
                    while let Ok(Some(received)) =
                        tokio::time::timeout(Duration::from_millis(50), receivers[to].recv()).await
                    {
                        if received.message.header.group == group {
                            assert_eq!(usize::from(received.from), from);
                            break 'delivered;
                        }
                    }
                }
            }
        }
    }
    for bus in buses {
        bus.shutdown().await;
    }
}

#[tokio::test]
async fn a_full_queue_drops_the_newest_message() {
    let (listeners, addresses) = bind_listeners::<2>().await;
    let [first, second] = listeners;
    let mut config = config(1, &addresses, SECRET);
    config.queue_messages_max = 4;
    // The peer's listener is bound but no bus answers yet: nothing leaves the queue.
    let (one, _received) = Bus::start(config, first).expect("start");
    let outcomes: Vec<Sent> = (0..6)
        .map(|group| one.send(1, message(Command::PrepareOk, 0, group, b"x")))
        .collect();
    assert_eq!(&outcomes[..4], &[Sent::Queued; 4]);
    assert_eq!(&outcomes[4..], &[Sent::DroppedFull; 2]);
    assert_eq!(one.counters().messages_dropped.load(Ordering::Relaxed), 2);
    // Once the peer runs, the first four arrive, in order.
    let (two, mut two_received) = Bus::start(config_for(2, &addresses), second).expect("start");
    for group in 0..4 {
        assert_eq!(receive(&mut two_received).await.message.header.group, group);
    }
    one.shutdown().await;
    two.shutdown().await;
}

#[tokio::test]
async fn a_queue_full_of_bytes_drops_the_newest_message() {
    let (listeners, addresses) = bind_listeners::<2>().await;
    let [first, _second] = listeners;
    let mut config = config(1, &addresses, SECRET);
    config.message_size_max = 1024;
    config.queue_bytes_max = 1024;
    let (one, _received) = Bus::start(config, first).expect("start");
    // 256 + 500 bytes fit; a second one would pass 1 024.
    static BODY: [u8; 500] = [7; 500];
    assert_eq!(one.send(1, message(Command::Headers, 0, 1, &BODY)), Sent::Queued);
    assert_eq!(
        one.send(1, message(Command::Headers, 0, 2, &BODY)),
        Sent::DroppedFull
    );
    assert_eq!(one.send(1, message(Command::PrepareOk, 0, 3, b"")), Sent::Queued);
    one.shutdown().await;
}

fn config_for(node_id: u32, addresses: &[SocketAddr]) -> BusConfig {
    config(node_id, addresses, SECRET)
}
