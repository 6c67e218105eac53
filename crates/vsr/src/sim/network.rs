//! A simulated message network between numbered endpoints.
//!
//! Fault model. Every message is sent on the one-way link `(from, to)`, and:
//! - **is delayed** by `delay_ticks_min` plus an exponential draw with mean
//!   `delay_ticks_mean`, independently per message, so later messages often overtake earlier
//!   ones (reordering);
//! - **may be dropped** at send, with probability `drop_ppm`;
//! - **may be duplicated** at send, with probability `duplicate_ppm`. The copy draws its own
//!   delay, so it may arrive before or long after the original;
//! - **is dropped when the queue is full**: at most `capacity_messages` messages are in flight,
//!   like the bounded buffers of a real transport;
//! - **is dropped at delivery if its link is cut then.** A cut is one-way; `cut_both` and
//!   `isolate` are sets of one-way cuts. The link's state at the moment the message would
//!   arrive is the one rule: a message in flight when a partition starts is lost, and a message
//!   sent during a partition that is still in flight when the partition heals is delivered,
//!   like a sender's buffer flushing on reconnection. Both are behaviours of an asynchronous
//!   network, which may delay any message arbitrarily, and one rule in one place is easier to
//!   reason about than a check at each end.
//!
//! Not modelled: corruption (a corrupt message fails its checksum and is dropped, which the drop
//! fault already covers; a replica network must then check a prepare sealed by its state
//! machine's own rule with that machine's `body_verifies`, as `Message::decode` refuses it),
//! and misdelivery to another endpoint. Why these are safe to exclude is
//! in `docs/replication.md`, "What the fault model excludes".
//!
//! Determinism: every draw comes from the network's own [`Prng`] (the "network" stream) in
//! send order, and deliveries leave in (due tick, send sequence) order, so messages due in the
//! same tick keep the order in which they were sent. No hash map is iterated.

use std::collections::BTreeMap;

use super::prng::{PPM, Prng};

/// A numbered endpoint: a replica or a client. The harness maps its actors to endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Endpoint(pub u16);

/// The network's fault parameters. Times are in ticks, probabilities in parts per million.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkOptions {
    /// Endpoints are `Endpoint(0)..Endpoint(endpoint_count)`.
    pub endpoint_count: u16,
    /// Most messages in flight at once. Invariant: `> 0`.
    pub capacity_messages: usize,
    /// The least delay of any message. A delay of 0 makes a message due in the tick it was
    /// sent, so a harness that delivers until nothing is due may then run a ping-pong within
    /// one tick; 1 or more bounds the work of a tick.
    pub delay_ticks_min: u64,
    /// The mean of the exponential delay added to `delay_ticks_min`.
    pub delay_ticks_mean: u64,
    /// Invariant: `≤ 1_000_000`.
    pub drop_ppm: u32,
    /// Invariant: `≤ 1_000_000`.
    pub duplicate_ppm: u32,
}

impl NetworkOptions {
    /// A network that only delays: every message arrives exactly once, after exactly
    /// `delay_ticks` ticks, in send order.
    pub fn reliable(endpoint_count: u16, delay_ticks: u64) -> NetworkOptions {
        NetworkOptions {
            endpoint_count,
            capacity_messages: 1 << 20,
            delay_ticks_min: delay_ticks,
            delay_ticks_mean: 0,
            drop_ppm: 0,
            duplicate_ppm: 0,
        }
    }

    fn check(&self) {
        assert!(self.endpoint_count > 0);
        assert!(self.capacity_messages > 0);
        assert!(self.drop_ppm <= PPM);
        assert!(self.duplicate_ppm <= PPM);
    }
}

/// A message handed to its destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery<M> {
    /// The tick the message was due. It is at or before the `now` of the delivering call.
    pub due_tick: u64,
    pub from: Endpoint,
    pub to: Endpoint,
    pub message: M,
}

/// What happened to the messages sent so far.
///
/// Invariant (checked by [`Network::check_invariants`]):
/// `sent + duplicated = delivered + dropped_random + dropped_capacity + dropped_cut
/// + dropped_cleared + in flight`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetworkCounters {
    /// Calls to `send`.
    pub sent: u64,
    /// Extra copies made by the duplicate fault.
    pub duplicated: u64,
    pub delivered: u64,
    /// Dropped at send by the drop fault.
    pub dropped_random: u64,
    /// Dropped at send because `capacity_messages` were in flight.
    pub dropped_capacity: u64,
    /// Dropped at delivery because the link was cut.
    pub dropped_cut: u64,
    /// Discarded by `clear_endpoint`.
    pub dropped_cleared: u64,
}

/// Whether a partition blocks both directions or one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartitionKind {
    /// No link between the sides works, in either direction.
    Symmetric,
    /// `side_a` cannot reach `side_b`; `side_b` still reaches `side_a`.
    OneWay,
}

/// A partition chosen by [`Network::random_partition`]: every link from `side_a` to `side_b`
/// is cut, and for a symmetric partition also every link back.
///
/// Invariants: both sides are non-empty, disjoint, and together are the endpoints offered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    pub kind: PartitionKind,
    pub side_a: Vec<Endpoint>,
    pub side_b: Vec<Endpoint>,
}

/// A message in flight.
#[derive(Debug)]
struct Packet<M> {
    from: Endpoint,
    to: Endpoint,
    message: M,
}

/// The simulated network. See the module documentation for its fault model.
#[derive(Debug)]
pub struct Network<M: Clone> {
    options: NetworkOptions,
    prng: Prng,
    /// Messages in flight, keyed and so ordered by (due tick, send sequence).
    /// Invariant: `in_flight.len() ≤ options.capacity_messages`.
    in_flight: BTreeMap<(u64, u64), Packet<M>>,
    /// The sequence number of the next message (copy) queued. Invariant: greater than every
    /// sequence in `in_flight`.
    sequence_next: u64,
    /// `cut[from * endpoint_count + to]`: the one-way link from `from` to `to` is down.
    /// Invariant: `cut.len() = endpoint_count²`, and the diagonal (an endpoint to itself) is
    /// never cut.
    cut: Vec<bool>,
    /// The latest `now` passed in. Invariant: never decreases, since time only moves forward.
    now_tick_last: u64,
    counters: NetworkCounters,
}

impl<M: Clone> Network<M> {
    /// A network with every link up and nothing in flight. `prng` should be the run's
    /// "network" stream, used by nothing else.
    pub fn new(options: NetworkOptions, prng: Prng) -> Network<M> {
        options.check();
        let endpoint_count = usize::from(options.endpoint_count);
        Network {
            options,
            prng,
            in_flight: BTreeMap::new(),
            sequence_next: 0,
            cut: vec![false; endpoint_count * endpoint_count],
            now_tick_last: 0,
            counters: NetworkCounters::default(),
        }
    }

    pub fn options(&self) -> &NetworkOptions {
        &self.options
    }

    /// Change the fault parameters from now on (a harness turns faults off for its final
    /// heal). Messages already in flight keep the delay they were given.
    pub fn set_options(&mut self, options: NetworkOptions) {
        options.check();
        assert_eq!(
            options.endpoint_count, self.options.endpoint_count,
            "the endpoints are fixed"
        );
        self.options = options;
    }

    pub fn counters(&self) -> NetworkCounters {
        self.counters
    }

    /// Messages (copies included) sent but neither delivered nor dropped yet.
    pub fn in_flight_count(&self) -> usize {
        self.in_flight.len()
    }

    /// Sends `message` from `from` to `to` at tick `now`. The faults of the module
    /// documentation apply; the caller learns nothing of them, as with a real network.
    pub fn send(&mut self, now: u64, from: Endpoint, to: Endpoint, message: M) {
        self.advance(now);
        self.check_endpoint(from);
        self.check_endpoint(to);
        self.counters.sent += 1;
        if self.prng.chance_ppm(self.options.drop_ppm) {
            self.counters.dropped_random += 1;
            return;
        }
        if self.prng.chance_ppm(self.options.duplicate_ppm) {
            self.counters.duplicated += 1;
            self.enqueue(now, from, to, message.clone());
        }
        self.enqueue(now, from, to, message);
    }

    fn enqueue(&mut self, now: u64, from: Endpoint, to: Endpoint, message: M) {
        // The delay is drawn even when the queue is full, so that whether the queue was full
        // does not shift later draws.
        let delay_ticks =
            self.options.delay_ticks_min + self.prng.exponential_ticks(self.options.delay_ticks_mean);
        if self.in_flight.len() >= self.options.capacity_messages {
            self.counters.dropped_capacity += 1;
            return;
        }
        let due_tick = now.checked_add(delay_ticks).expect("due tick overflows u64");
        let sequence = self.sequence_next;
        self.sequence_next += 1;
        let previous = self
            .in_flight
            .insert((due_tick, sequence), Packet { from, to, message });
        assert!(previous.is_none());
        assert!(self.in_flight.len() <= self.options.capacity_messages);
    }

    /// The earliest tick at which a message is due, or `None` if nothing is in flight. A
    /// message due then may still be dropped at delivery by a cut.
    pub fn next_due_tick(&self) -> Option<u64> {
        self.in_flight
            .first_key_value()
            .map(|(&(due_tick, _), _)| due_tick)
    }

    /// Removes and returns the earliest message due at or before `now` whose link is up,
    /// dropping (and counting) any earlier due messages whose link is cut. `None` when nothing
    /// more is due.
    ///
    /// Delivering one at a time lets a harness process a delivery, send its responses, and
    /// have those respect (due tick, sequence) order with everything still queued.
    pub fn deliver_next(&mut self, now: u64) -> Option<Delivery<M>> {
        self.advance(now);
        while let Some(entry) = self.in_flight.first_entry() {
            let (due_tick, _) = *entry.key();
            if due_tick > now {
                return None;
            }
            let packet = entry.remove();
            if self.is_cut(packet.from, packet.to) {
                self.counters.dropped_cut += 1;
                continue;
            }
            self.counters.delivered += 1;
            return Some(Delivery {
                due_tick,
                from: packet.from,
                to: packet.to,
                message: packet.message,
            });
        }
        None
    }

    /// Every message due at or before `now` whose link is up, in (due tick, send sequence)
    /// order. Messages due then on a cut link are dropped and counted.
    pub fn deliver_due(&mut self, now: u64) -> Vec<Delivery<M>> {
        let mut deliveries = Vec::new();
        while let Some(delivery) = self.deliver_next(now) {
            deliveries.push(delivery);
        }
        if let Some(due_tick) = self.next_due_tick() {
            assert!(due_tick > now);
        }
        deliveries
    }

    /// Cuts the one-way link from `from` to `to`. Cutting a cut link is a no-op.
    pub fn cut(&mut self, from: Endpoint, to: Endpoint) {
        assert_ne!(from, to, "an endpoint's link to itself is never cut");
        let index = self.link_index(from, to);
        self.cut[index] = true;
    }

    /// Cuts both links between `a` and `b`.
    pub fn cut_both(&mut self, a: Endpoint, b: Endpoint) {
        self.cut(a, b);
        self.cut(b, a);
    }

    /// Cuts every link to and from `endpoint`, as when its node is partitioned away.
    pub fn isolate(&mut self, endpoint: Endpoint) {
        self.check_endpoint(endpoint);
        for other in 0..self.options.endpoint_count {
            let other = Endpoint(other);
            if other != endpoint {
                self.cut_both(endpoint, other);
            }
        }
    }

    /// Restores the one-way link from `from` to `to`.
    pub fn heal(&mut self, from: Endpoint, to: Endpoint) {
        let index = self.link_index(from, to);
        self.cut[index] = false;
    }

    /// Restores every link.
    pub fn heal_all(&mut self) {
        self.cut.fill(false);
    }

    /// Whether the one-way link from `from` to `to` is down now.
    pub fn is_cut(&self, from: Endpoint, to: Endpoint) -> bool {
        self.cut[self.link_index(from, to)]
    }

    /// Whether any link is down.
    pub fn any_cut(&self) -> bool {
        self.cut.contains(&true)
    }

    /// Splits `endpoints` (at least two, distinct) into two random non-empty sides and cuts
    /// the links between them: both ways or, with even odds, only from `side_a` to `side_b`.
    /// Links to endpoints not offered (clients, say) are untouched, and existing cuts stay:
    /// call `heal_all` first for a fresh partition.
    ///
    /// The draws come from `prng`, not the network's stream, so that when and how the harness
    /// partitions does not shift message delays.
    pub fn random_partition(&mut self, prng: &mut Prng, endpoints: &[Endpoint]) -> Partition {
        assert!(endpoints.len() >= 2, "a partition needs two sides");
        let mut shuffled = endpoints.to_vec();
        shuffled.sort_unstable();
        shuffled.dedup();
        assert_eq!(shuffled.len(), endpoints.len(), "endpoints must be distinct");
        prng.shuffle(&mut shuffled);
        let side_a_count = prng.range_inclusive(1, shuffled.len() as u64 - 1) as usize;
        let kind = if prng.chance_ppm(PPM / 2) {
            PartitionKind::Symmetric
        } else {
            PartitionKind::OneWay
        };
        let side_b = shuffled.split_off(side_a_count);
        let side_a = shuffled;
        for &a in &side_a {
            for &b in &side_b {
                match kind {
                    PartitionKind::Symmetric => self.cut_both(a, b),
                    PartitionKind::OneWay => self.cut(a, b),
                }
            }
        }
        assert!(!side_a.is_empty());
        assert!(!side_b.is_empty());
        Partition { kind, side_a, side_b }
    }

    /// Discards every message in flight to or from `endpoint`, as a harness may do when that
    /// endpoint crashes. Optional: without it, messages to a crashed endpoint arrive and the
    /// harness discards them, and messages it sent before crashing still arrive, which a real
    /// network allows too.
    pub fn clear_endpoint(&mut self, endpoint: Endpoint) {
        self.check_endpoint(endpoint);
        let count_before = self.in_flight.len();
        self.in_flight
            .retain(|_, packet| packet.from != endpoint && packet.to != endpoint);
        self.counters.dropped_cleared += (count_before - self.in_flight.len()) as u64;
    }

    /// Asserts the cross-field invariants. Cheap enough to call after every step in tests.
    pub fn check_invariants(&self) {
        let c = &self.counters;
        assert_eq!(
            c.sent + c.duplicated,
            c.delivered
                + c.dropped_random
                + c.dropped_capacity
                + c.dropped_cut
                + c.dropped_cleared
                + self.in_flight.len() as u64
        );
        assert!(self.in_flight.len() <= self.options.capacity_messages);
        let endpoint_count = usize::from(self.options.endpoint_count);
        assert_eq!(self.cut.len(), endpoint_count * endpoint_count);
        for e in 0..endpoint_count {
            assert!(!self.cut[e * endpoint_count + e]);
        }
        if let Some((&(_, sequence), _)) = self.in_flight.last_key_value() {
            assert!(sequence < self.sequence_next);
        }
    }

    fn advance(&mut self, now: u64) {
        assert!(
            now >= self.now_tick_last,
            "time went backwards: {now} < {}",
            self.now_tick_last
        );
        self.now_tick_last = now;
    }

    fn check_endpoint(&self, endpoint: Endpoint) {
        assert!(
            endpoint.0 < self.options.endpoint_count,
            "{endpoint:?} is not below endpoint_count {}",
            self.options.endpoint_count
        );
    }

    fn link_index(&self, from: Endpoint, to: Endpoint) -> usize {
        self.check_endpoint(from);
        self.check_endpoint(to);
        usize::from(from.0) * usize::from(self.options.endpoint_count) + usize::from(to.0)
    }
}
