//! Tests of the simulator's reusable parts through their public API: the PRNG streams, the
//! faulty network, the faulty storage and the trace hash. Each test names the behaviour it
//! pins; each fails if that behaviour breaks.

use cairn_vsr::sim::network::{
    Delivery, Endpoint, Network, NetworkCounters, NetworkOptions, Partition, PartitionKind,
};
use cairn_vsr::sim::prng::{PPM, Prng, Streams, stream_names};
use cairn_vsr::sim::storage::{
    SECTOR_SIZE_BYTES, SlotFaults, Storage, StorageLayout, StorageOptions, Zone, ZoneShape,
};
use cairn_vsr::sim::trace::TraceHash;

// ---------------------------------------------------------------------------------------------
// PRNG

fn draws(prng: &mut Prng, count: usize) -> Vec<u64> {
    (0..count).map(|_| prng.next_u64()).collect()
}

#[test]
fn prng_same_seed_gives_the_same_sequence() {
    assert_eq!(
        draws(&mut Prng::from_seed(99), 1000),
        draws(&mut Prng::from_seed(99), 1000)
    );
    let streams = Streams::new(99);
    assert_eq!(
        draws(&mut streams.stream(stream_names::NETWORK), 1000),
        draws(&mut Streams::new(99).stream(stream_names::NETWORK), 1000)
    );
    assert_ne!(
        draws(&mut Prng::from_seed(99), 10),
        draws(&mut Prng::from_seed(100), 10)
    );
}

#[test]
fn prng_named_streams_differ() {
    let streams = Streams::new(7);
    let names = [
        stream_names::NETWORK,
        stream_names::PARTITIONS,
        stream_names::STORAGE_FAULTS,
        stream_names::CRASHES,
        stream_names::CLIENTS,
        stream_names::TIMERS,
    ];
    let mut firsts: Vec<u64> = names.iter().map(|name| streams.stream(name).next_u64()).collect();
    // Indexed streams differ from each other and from the plain stream of their family.
    firsts.push(streams.stream_indexed(stream_names::TIMERS, 0).next_u64());
    firsts.push(streams.stream_indexed(stream_names::TIMERS, 1).next_u64());
    let count = firsts.len();
    firsts.sort_unstable();
    firsts.dedup();
    assert_eq!(firsts.len(), count, "two streams started with the same draw");
    // The same name under another seed is another stream.
    assert_ne!(
        draws(&mut Streams::new(7).stream(stream_names::CLIENTS), 4),
        draws(&mut Streams::new(8).stream(stream_names::CLIENTS), 4)
    );
}

#[test]
fn prng_drawing_from_one_stream_never_shifts_another() {
    let streams = Streams::new(2024);
    let baseline = draws(&mut streams.stream(stream_names::CRASHES), 100);

    // Interleave many extra draws from another stream, of every kind.
    let mut network = streams.stream(stream_names::NETWORK);
    let mut crashes = streams.stream(stream_names::CRASHES);
    let mut interleaved = Vec::new();
    for i in 0..100 {
        for _ in 0..i % 7 {
            network.next_u64();
            network.below(1000);
            network.exponential_ticks(50);
        }
        interleaved.push(crashes.next_u64());
    }
    assert_eq!(interleaved, baseline);

    // A stream derived after another was drawn from is the same too.
    let mut clients = streams.stream(stream_names::CLIENTS);
    draws(&mut clients, 1000);
    assert_eq!(draws(&mut streams.stream(stream_names::CRASHES), 100), baseline);
}

#[test]
fn prng_chance_ppm_consumes_the_same_draws_whatever_the_odds() {
    let mut never = Prng::from_seed(11);
    let mut often = Prng::from_seed(11);
    for _ in 0..1000 {
        assert!(!never.chance_ppm(0));
        often.chance_ppm(999_999);
    }
    assert_eq!(never.next_u64(), often.next_u64());
    let mut always = Prng::from_seed(12);
    for _ in 0..1000 {
        assert!(always.chance_ppm(PPM));
    }
}

#[test]
fn prng_chance_ppm_is_roughly_right() {
    let mut prng = Prng::from_seed(13);
    let hits = (0..100_000).filter(|_| prng.chance_ppm(250_000)).count();
    // Expected 25 000, standard deviation about 137.
    assert!((24_000..=26_000).contains(&hits), "{hits}");
}

#[test]
fn prng_below_stays_in_range_and_is_roughly_uniform() {
    let mut prng = Prng::from_seed(1);
    let mut buckets = [0u32; 10];
    for _ in 0..100_000 {
        let value = prng.below(10);
        assert!(value < 10);
        buckets[value as usize] += 1;
    }
    // Expected 10 000 per bucket, standard deviation about 95: a loose bound.
    for (value, &count) in buckets.iter().enumerate() {
        assert!(
            (9_000..=11_000).contains(&count),
            "value {value} drawn {count} times"
        );
    }

    // A range just above 2^63: a modulo would put two thirds of the draws in the lower half;
    // an unbiased draw puts half there.
    let n = (1u64 << 63) + (1 << 62);
    let lower = (0..100_000)
        .map(|_| prng.below(n))
        .inspect(|&value| assert!(value < n))
        .filter(|&value| value < n / 2)
        .count();
    assert!((48_000..=52_000).contains(&lower), "{lower}");
}

#[test]
fn prng_range_inclusive_hits_both_ends_only() {
    let mut prng = Prng::from_seed(4);
    let mut seen = [false; 5];
    for _ in 0..1000 {
        let value = prng.range_inclusive(10, 14);
        assert!((10..=14).contains(&value));
        seen[(value - 10) as usize] = true;
    }
    assert_eq!(seen, [true; 5]);
}

#[test]
fn prng_exponential_mean_is_roughly_right() {
    let mut prng = Prng::from_seed(8);
    for mean_ticks in [10u64, 1000] {
        let count = 200_000u64;
        let mut sum = 0u64;
        let mut above_mean = 0u64;
        for _ in 0..count {
            let ticks = prng.exponential_ticks(mean_ticks);
            assert!(ticks <= 20 * mean_ticks);
            sum += ticks;
            above_mean += u64::from(ticks > mean_ticks);
        }
        let mean_observed = sum as f64 / count as f64;
        let relative_error = (mean_observed - mean_ticks as f64).abs() / mean_ticks as f64;
        assert!(
            relative_error < 0.02,
            "mean {mean_ticks}: observed {mean_observed}"
        );
        // An exponential exceeds its mean with probability 1/e ≈ 0.368. Rounding to whole
        // ticks makes "above the mean" start at mean + 0.5: e^-1.05 ≈ 0.350 for a mean of 10.
        let fraction = above_mean as f64 / count as f64;
        let expected = (-(mean_ticks as f64 + 0.5) / mean_ticks as f64).exp();
        assert!(
            (fraction - expected).abs() < 0.01,
            "mean {mean_ticks}: P(X > mean) = {fraction}"
        );
    }
}

#[test]
fn prng_shuffle_is_a_uniform_permutation() {
    let mut prng = Prng::from_seed(21);
    let orders = [[0, 1, 2], [0, 2, 1], [1, 0, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0]];
    let mut counts = [0u32; 6];
    for _ in 0..60_000 {
        let mut items = [0, 1, 2];
        prng.shuffle(&mut items);
        let index = orders
            .iter()
            .position(|order| *order == items)
            .expect("a permutation");
        counts[index] += 1;
    }
    for count in counts {
        assert!((9_000..=11_000).contains(&count), "{counts:?}");
    }
}

#[test]
fn prng_choose_picks_every_element_and_none_from_empty() {
    let mut prng = Prng::from_seed(22);
    let empty: [u8; 0] = [];
    assert_eq!(prng.choose(&empty), None);
    let items = ['a', 'b', 'c'];
    let mut seen = [false; 3];
    for _ in 0..300 {
        let &item = prng.choose(&items).expect("non-empty");
        seen[(item as u8 - b'a') as usize] = true;
    }
    assert_eq!(seen, [true; 3]);
}

// ---------------------------------------------------------------------------------------------
// Network

const A: Endpoint = Endpoint(0);
const B: Endpoint = Endpoint(1);
const C: Endpoint = Endpoint(2);

fn options(endpoint_count: u16) -> NetworkOptions {
    NetworkOptions {
        endpoint_count,
        capacity_messages: 100_000,
        delay_ticks_min: 1,
        delay_ticks_mean: 20,
        drop_ppm: 0,
        duplicate_ppm: 0,
    }
}

fn network(options: NetworkOptions, seed: u64) -> Network<u64> {
    Network::new(options, Streams::new(seed).stream(stream_names::NETWORK))
}

/// Delivers tick by tick until nothing is in flight, checking invariants and order.
fn drain(network: &mut Network<u64>, mut now: u64) -> Vec<Delivery<u64>> {
    let mut deliveries: Vec<Delivery<u64>> = Vec::new();
    while let Some(due_tick) = network.next_due_tick() {
        now = now.max(due_tick);
        let batch = network.deliver_due(now);
        network.check_invariants();
        for delivery in &batch {
            assert!(delivery.due_tick <= now);
            if let Some(previous) = deliveries.last() {
                assert!(
                    previous.due_tick <= delivery.due_tick,
                    "delivered out of due order"
                );
            }
        }
        deliveries.extend(batch);
    }
    deliveries
}

#[test]
fn network_without_faults_delivers_each_message_once_in_due_order() {
    let mut network = network(options(3), 1);
    let endpoints = [A, B, C];
    let mut send_ticks = Vec::new();
    for id in 0..1000u64 {
        let now = id / 10;
        let from = endpoints[(id % 3) as usize];
        let to = endpoints[((id + 1) % 3) as usize];
        network.send(now, from, to, id);
        send_ticks.push(now);
    }
    let deliveries = drain(&mut network, 100);
    let mut ids: Vec<u64> = deliveries.iter().map(|delivery| delivery.message).collect();
    // Delays are random, so some messages overtake others...
    assert!(
        ids.windows(2).any(|pair| pair[0] > pair[1]),
        "no message was reordered"
    );
    ids.sort_unstable();
    // ...but every one arrives exactly once, after at least the minimum delay.
    assert_eq!(ids, (0..1000).collect::<Vec<_>>());
    for delivery in &deliveries {
        let id = delivery.message;
        assert!(delivery.due_tick > send_ticks[id as usize]);
        assert_eq!(delivery.from, endpoints[(id % 3) as usize]);
        assert_eq!(delivery.to, endpoints[((id + 1) % 3) as usize]);
    }
    let counters = network.counters();
    assert_eq!(
        counters,
        NetworkCounters {
            sent: 1000,
            delivered: 1000,
            ..NetworkCounters::default()
        }
    );
    assert_eq!(network.in_flight_count(), 0);
}

#[test]
fn network_equal_due_ticks_keep_send_order() {
    let mut network = network(NetworkOptions::reliable(3, 5), 2);
    for id in 0..100u64 {
        let from = Endpoint((id % 3) as u16);
        let to = Endpoint(((id + 2) % 3) as u16);
        network.send(0, from, to, id);
    }
    assert_eq!(network.next_due_tick(), Some(5));
    assert!(network.deliver_due(4).is_empty());
    let ids: Vec<u64> = network
        .deliver_due(5)
        .into_iter()
        .map(|delivery| delivery.message)
        .collect();
    assert_eq!(ids, (0..100).collect::<Vec<_>>());
    assert_eq!(network.next_due_tick(), None);
}

#[test]
fn network_deliver_next_interleaves_new_sends_by_due_order() {
    let mut network = network(NetworkOptions::reliable(2, 0), 3);
    network.send(0, A, B, 1);
    network.send(0, A, B, 2);
    let first = network.deliver_next(0).expect("due");
    assert_eq!(first.message, 1);
    // A response sent while handling the first is due now too, but after the second.
    network.send(0, B, A, 3);
    let rest: Vec<u64> = network
        .deliver_due(0)
        .into_iter()
        .map(|delivery| delivery.message)
        .collect();
    assert_eq!(rest, [2, 3]);
}

#[test]
fn network_drop_ppm_of_a_million_delivers_nothing() {
    let mut network = network(
        NetworkOptions {
            drop_ppm: PPM,
            ..options(2)
        },
        4,
    );
    for id in 0..500 {
        network.send(id, A, B, id);
    }
    assert!(drain(&mut network, 499).is_empty());
    assert_eq!(network.counters().dropped_random, 500);
    assert_eq!(network.counters().delivered, 0);
}

#[test]
fn network_duplicate_ppm_of_a_million_delivers_everything_twice() {
    let mut network = network(
        NetworkOptions {
            duplicate_ppm: PPM,
            ..options(2)
        },
        5,
    );
    for id in 0..500 {
        network.send(id, A, B, id);
    }
    let mut ids: Vec<u64> = drain(&mut network, 499)
        .into_iter()
        .map(|delivery| delivery.message)
        .collect();
    ids.sort_unstable();
    let expected: Vec<u64> = (0..500).flat_map(|id| [id, id]).collect();
    assert_eq!(ids, expected);
    assert_eq!(network.counters().duplicated, 500);
    assert_eq!(network.counters().delivered, 1000);
}

#[test]
fn network_one_way_cut_blocks_one_direction_and_heal_restores_it() {
    let mut network = network(options(3), 6);
    network.cut(A, B);
    assert!(network.is_cut(A, B));
    assert!(!network.is_cut(B, A));
    for id in 0..100 {
        network.send(id, A, B, id);
        network.send(id, B, A, 1000 + id);
        network.send(id, A, C, 2000 + id);
    }
    let deliveries = drain(&mut network, 99);
    assert!(
        deliveries
            .iter()
            .all(|delivery| (delivery.from, delivery.to) != (A, B))
    );
    assert_eq!(
        deliveries
            .iter()
            .filter(|delivery| (delivery.from, delivery.to) == (B, A))
            .count(),
        100
    );
    assert_eq!(
        deliveries
            .iter()
            .filter(|delivery| (delivery.from, delivery.to) == (A, C))
            .count(),
        100
    );
    assert_eq!(network.counters().dropped_cut, 100);

    network.heal_all();
    assert!(!network.any_cut());
    // Later than any delivery so far: `drain` advanced time to the last due tick.
    for id in 0..100 {
        network.send(100_000 + id, A, B, id);
    }
    assert_eq!(drain(&mut network, 100_099).len(), 100);
}

#[test]
fn network_cut_and_heal_decide_at_delivery_time() {
    let mut network = network(NetworkOptions::reliable(2, 10), 7);
    // In flight when the link is cut: lost.
    network.send(0, A, B, 1);
    network.cut_both(A, B);
    assert!(network.deliver_due(10).is_empty());
    assert_eq!(network.counters().dropped_cut, 1);
    // Sent while cut, in flight when the link heals: delivered.
    network.send(10, A, B, 2);
    network.heal(A, B);
    let deliveries = network.deliver_due(20);
    assert_eq!(deliveries.len(), 1);
    assert_eq!(deliveries[0].message, 2);
    // The other direction is still cut.
    assert!(network.is_cut(B, A));
}

#[test]
fn network_isolate_cuts_every_link_of_one_endpoint() {
    let mut network = network(options(3), 8);
    network.isolate(C);
    for id in 0..50 {
        network.send(id, A, C, id);
        network.send(id, C, B, id);
        network.send(id, A, B, id);
        network.send(id, C, C, id);
    }
    let deliveries = drain(&mut network, 49);
    // Only A → B and C's link to itself work.
    assert_eq!(deliveries.len(), 100);
    assert!(
        deliveries
            .iter()
            .all(|delivery| (delivery.from, delivery.to) == (A, B) || (delivery.from, delivery.to) == (C, C))
    );
}

#[test]
fn network_random_partition_cuts_exactly_between_its_sides() {
    let endpoints = [Endpoint(0), Endpoint(1), Endpoint(2), Endpoint(3), Endpoint(4)];
    let client = Endpoint(5);
    let mut partitions = Streams::new(9).stream(stream_names::PARTITIONS);
    let (mut symmetric, mut one_way) = (0, 0);
    for _ in 0..200 {
        let mut network = network(options(6), 9);
        let Partition { kind, side_a, side_b } = network.random_partition(&mut partitions, &endpoints);
        assert!(!side_a.is_empty());
        assert!(!side_b.is_empty());
        let mut all: Vec<Endpoint> = side_a.iter().chain(&side_b).copied().collect();
        all.sort_unstable();
        assert_eq!(all, endpoints);
        match kind {
            PartitionKind::Symmetric => symmetric += 1,
            PartitionKind::OneWay => one_way += 1,
        }
        for &from in &endpoints {
            for &to in &endpoints {
                if from == to {
                    continue;
                }
                let across = side_a.contains(&from) && side_b.contains(&to);
                let back = side_b.contains(&from) && side_a.contains(&to);
                let expected = across || (back && kind == PartitionKind::Symmetric);
                assert_eq!(network.is_cut(from, to), expected, "{kind:?} {from:?} → {to:?}");
            }
            assert!(!network.is_cut(from, client));
            assert!(!network.is_cut(client, from));
        }
    }
    assert!(symmetric > 50, "{symmetric}");
    assert!(one_way > 50, "{one_way}");
}

#[test]
fn network_full_queue_drops_and_counts() {
    let mut network = network(
        NetworkOptions {
            capacity_messages: 10,
            ..options(2)
        },
        10,
    );
    for id in 0..25 {
        network.send(0, A, B, id);
    }
    assert_eq!(network.in_flight_count(), 10);
    assert_eq!(network.counters().dropped_capacity, 15);
    assert_eq!(drain(&mut network, 0).len(), 10);
}

#[test]
fn network_clear_endpoint_discards_its_messages() {
    let mut network = network(options(3), 11);
    for id in 0..30 {
        network.send(0, A, B, id);
        network.send(0, B, C, id);
        network.send(0, C, A, id);
    }
    network.clear_endpoint(C);
    assert_eq!(network.counters().dropped_cleared, 60);
    let deliveries = drain(&mut network, 0);
    assert_eq!(deliveries.len(), 30);
    assert!(
        deliveries
            .iter()
            .all(|delivery| (delivery.from, delivery.to) == (A, B))
    );
}

#[test]
#[should_panic(expected = "time went backwards")]
fn network_refuses_time_going_backwards() {
    let mut network = network(options(2), 12);
    network.send(10, A, B, 1);
    network.send(9, A, B, 2);
}

/// A run with every fault on, as a sequence of (due tick, from, to, message).
fn faulty_run(seed: u64) -> Vec<(u64, Endpoint, Endpoint, u64)> {
    let streams = Streams::new(seed);
    let options = NetworkOptions {
        endpoint_count: 4,
        capacity_messages: 64,
        delay_ticks_min: 1,
        delay_ticks_mean: 15,
        drop_ppm: 100_000,
        duplicate_ppm: 100_000,
    };
    let mut network: Network<u64> = Network::new(options, streams.stream(stream_names::NETWORK));
    let mut partitions = streams.stream(stream_names::PARTITIONS);
    let mut clients = streams.stream(stream_names::CLIENTS);
    let endpoints = [Endpoint(0), Endpoint(1), Endpoint(2), Endpoint(3)];
    let mut trace = Vec::new();
    for now in 0..2000u64 {
        if now % 200 == 0 {
            network.heal_all();
            network.random_partition(&mut partitions, &endpoints);
        }
        for _ in 0..clients.below(3) {
            let from = *clients.choose(&endpoints).expect("endpoints");
            let to = *clients.choose(&endpoints).expect("endpoints");
            network.send(now, from, to, clients.next_u64());
        }
        for delivery in network.deliver_due(now) {
            trace.push((delivery.due_tick, delivery.from, delivery.to, delivery.message));
        }
        network.check_invariants();
    }
    trace
}

#[test]
fn network_same_seed_gives_the_same_deliveries() {
    let first = faulty_run(77);
    assert!(
        first.len() > 500,
        "too few deliveries to compare: {}",
        first.len()
    );
    assert_eq!(first, faulty_run(77));
    assert_ne!(first, faulty_run(78));
}

// ---------------------------------------------------------------------------------------------
// Storage

const SECTOR: usize = SECTOR_SIZE_BYTES as usize;

fn layout() -> StorageLayout {
    StorageLayout {
        superblock: ZoneShape {
            slot_count: 4,
            slot_size_bytes: 1024,
        },
        headers: ZoneShape {
            slot_count: 8,
            slot_size_bytes: 256,
        },
        prepares: ZoneShape {
            slot_count: 8,
            slot_size_bytes: 4 * SECTOR_SIZE_BYTES,
        },
        checkpoints: ZoneShape {
            slot_count: 2,
            slot_size_bytes: 4 * SECTOR_SIZE_BYTES,
        },
    }
}

fn storage(options: StorageOptions, seed: u64) -> Storage {
    Storage::new(
        layout(),
        options,
        Streams::new(seed).stream_indexed(stream_names::STORAGE_FAULTS, 0),
    )
}

fn random_bytes(prng: &mut Prng, len: usize) -> Vec<u8> {
    (0..len).map(|_| prng.next_u64() as u8).collect()
}

/// `bytes` written at the start of `image`.
fn overlay(image: &[u8], bytes: &[u8]) -> Vec<u8> {
    let mut result = image.to_vec();
    result[..bytes.len()].copy_from_slice(bytes);
    result
}

#[test]
fn storage_journal_layout_follows_the_constants() {
    let layout = StorageLayout::journal(cairn_vsr::constants::JOURNAL_SLOTS, 4096, 8192, 16384);
    assert_eq!(
        layout.shape(Zone::Superblock),
        ZoneShape {
            slot_count: 4,
            slot_size_bytes: 4096
        }
    );
    assert_eq!(
        layout.shape(Zone::Headers),
        ZoneShape {
            slot_count: 64,
            slot_size_bytes: 256
        }
    );
    assert_eq!(
        layout.shape(Zone::Prepares),
        ZoneShape {
            slot_count: 64,
            slot_size_bytes: 8192
        }
    );
    assert_eq!(
        layout.shape(Zone::Checkpoints),
        ZoneShape {
            slot_count: 2,
            slot_size_bytes: 16384
        }
    );
}

#[test]
fn storage_reads_see_pending_writes_before_sync() {
    let mut storage = storage(StorageOptions::default(), 1);
    assert_eq!(
        storage.read(Zone::Prepares, 3),
        vec![0; 4 * SECTOR],
        "a new slot reads as zeros"
    );
    storage.write(Zone::Prepares, 3, b"hello");
    assert_eq!(storage.pending_count(), 1);
    assert_eq!(&storage.read(Zone::Prepares, 3)[..6], b"hello\0");
    assert_eq!(storage.read_durable(Zone::Prepares, 3), vec![0; 4 * SECTOR]);
    // A shorter rewrite keeps the longer one's tail, as a page cache does.
    storage.write(Zone::Prepares, 3, b"J");
    assert_eq!(&storage.read(Zone::Prepares, 3)[..6], b"Jello\0");
    storage.sync().expect("no sync faults");
    assert_eq!(storage.pending_count(), 0);
    assert_eq!(&storage.read_durable(Zone::Prepares, 3)[..6], b"Jello\0");
    storage.check_invariants();
}

#[test]
fn storage_synced_writes_survive_a_crash_byte_exact() {
    for seed in 0..200 {
        let mut prng = Prng::from_seed(seed);
        let mut storage = storage(StorageOptions::default(), seed);
        let mut expected = Vec::new();
        for slot in 0..4 {
            let len = prng.range_inclusive(1, 4 * SECTOR as u64) as usize;
            let bytes = random_bytes(&mut prng, len);
            storage.write(Zone::Prepares, slot, &bytes);
            expected.push(overlay(&[0; 4 * SECTOR], &bytes));
        }
        storage.sync().expect("no sync faults");
        // Unsynced writes to other slots must not disturb the synced ones.
        for slot in 4..8 {
            storage.write(Zone::Prepares, slot, &random_bytes(&mut prng, 3 * SECTOR));
        }
        storage.crash(&mut prng);
        storage.check_invariants();
        for slot in 0..4 {
            assert_eq!(
                storage.read(Zone::Prepares, slot),
                expected[slot as usize],
                "seed {seed}"
            );
        }
    }
}

#[test]
fn storage_unsynced_writes_after_a_crash_are_old_new_or_a_sector_tear() {
    let (mut old_seen, mut new_seen, mut torn_seen) = (0, 0, 0);
    for seed in 0..500 {
        let mut prng = Prng::from_seed(seed);
        let mut storage = storage(StorageOptions::default(), seed);
        let slot_bytes = 4 * SECTOR;
        let old_len = prng.range_inclusive(1, slot_bytes as u64) as usize;
        let old_bytes = random_bytes(&mut prng, old_len);
        storage.write(Zone::Prepares, 0, &old_bytes);
        storage.sync().expect("no sync faults");
        let old = overlay(&[0; 4 * SECTOR], &old_bytes);

        let new_len = prng.range_inclusive(1, slot_bytes as u64) as usize;
        let new_bytes = random_bytes(&mut prng, new_len);
        storage.write(Zone::Prepares, 0, &new_bytes);
        let new = overlay(&old, &new_bytes);
        storage.crash(&mut prng);
        storage.check_invariants();

        let after = storage.read(Zone::Prepares, 0);
        let tears: Vec<Vec<u8>> = (1..new_len.div_ceil(SECTOR))
            .map(|sectors| overlay(&old, &new_bytes[..sectors * SECTOR]))
            .collect();
        if after == new {
            new_seen += 1;
            assert!(!storage.is_faulty(Zone::Prepares, 0));
        } else if after == old {
            old_seen += 1;
            assert!(!storage.is_faulty(Zone::Prepares, 0));
        } else {
            assert!(
                tears.contains(&after),
                "seed {seed}: neither old, new nor a sector tear"
            );
            torn_seen += 1;
            assert_eq!(
                storage.faulty_slots(),
                [(
                    Zone::Prepares,
                    0,
                    SlotFaults {
                        torn: true,
                        bits_flipped: 0
                    }
                )]
            );
        }
    }
    // Each outcome must actually happen, or this test checks nothing.
    assert!(old_seen > 50, "{old_seen}");
    assert!(new_seen > 50, "{new_seen}");
    assert!(torn_seen > 50, "{torn_seen}");
}

/// A log zone keeps a prefix of its pending writes at a crash, in the order written: slots
/// written later than a lost or torn one are lost too, whatever order their slot numbers
/// have.
#[test]
fn storage_log_zone_crash_keeps_a_prefix_in_write_order() {
    let (mut whole_seen, mut partial_seen) = (0, 0);
    for seed in 0..500 {
        let mut prng = Prng::from_seed(seed);
        let mut storage = storage(StorageOptions::default(), seed);
        storage.set_log_zone(Zone::Prepares);
        // Written in the order 5, 6, 7, 0, 1, 2 (a log wrapping around the ring), two
        // sectors each so that a write can tear.
        let order = [5u32, 6, 7, 0, 1, 2];
        let writes: Vec<Vec<u8>> = order
            .iter()
            .map(|_| random_bytes(&mut prng, 2 * SECTOR))
            .collect();
        for (slot, bytes) in order.iter().zip(&writes) {
            storage.write(Zone::Prepares, *slot, bytes);
        }
        storage.crash(&mut prng);
        storage.check_invariants();
        let landed: Vec<bool> = order
            .iter()
            .zip(&writes)
            .map(|(slot, bytes)| storage.read(Zone::Prepares, *slot)[..bytes.len()] == bytes[..])
            .collect();
        let survivors = landed.iter().take_while(|landed| **landed).count();
        for (at, slot) in order.iter().enumerate().skip(survivors + 1) {
            assert_eq!(
                storage.read(Zone::Prepares, *slot),
                vec![0; 4 * SECTOR],
                "seed {seed}: slot {slot}, written after the first write the crash did not keep, landed"
            );
            assert!(!landed[at]);
        }
        if survivors == order.len() {
            whole_seen += 1;
        } else {
            partial_seen += 1;
        }
    }
    assert!(
        whole_seen > 0 && partial_seen > 100,
        "{whole_seen} {partial_seen}"
    );
}

/// Truncating a log zone makes its pending writes durable first (the fsync after a real
/// truncation), then zeroes the cut slots durably and forgets their fault marks.
#[test]
fn storage_log_truncation_syncs_the_log_then_zeroes_the_cut() {
    let mut prng = Prng::from_seed(7);
    let mut storage = storage(StorageOptions::default(), 7);
    storage.set_log_zone(Zone::Prepares);
    let kept = random_bytes(&mut prng, 2 * SECTOR);
    let cut = random_bytes(&mut prng, 2 * SECTOR);
    storage.write(Zone::Prepares, 3, &cut);
    storage.sync().expect("no sync faults");
    storage.corrupt(Zone::Prepares, 3, &mut prng);
    storage.write(Zone::Prepares, 2, &kept);
    storage.truncate_log(&[3]);
    storage.crash(&mut prng);
    storage.check_invariants();
    assert_eq!(storage.read(Zone::Prepares, 2)[..kept.len()], kept[..]);
    assert_eq!(storage.read(Zone::Prepares, 3), vec![0; 4 * SECTOR]);
    assert!(storage.faulty_slots().is_empty());
}

#[test]
fn storage_one_sector_writes_never_tear() {
    let options = StorageOptions {
        sync_fail_ppm: 0,
        crash_write_lost_ppm: 0,
        crash_write_torn_ppm: PPM,
    };
    let mut storage = storage(options, 2);
    let mut prng = Prng::from_seed(2);
    for slot in 0..8 {
        storage.write(Zone::Headers, slot, &[0xAB; 256]);
    }
    storage.crash(&mut prng);
    assert_eq!(storage.counters().crash_writes_torn, 0);
    assert_eq!(storage.counters().crash_writes_lost, 8);
    assert!(storage.faulty_slots().is_empty());
}

#[test]
fn storage_corrupt_flips_exactly_one_bit_until_rewritten() {
    for seed in 0..100 {
        let mut prng = Prng::from_seed(seed);
        let mut storage = storage(StorageOptions::default(), seed);
        let record = random_bytes(&mut prng, 700);
        storage.write(Zone::Superblock, 1, &record);
        storage.sync().expect("no sync faults");
        let before = storage.read(Zone::Superblock, 1);

        let bit_index = storage.corrupt(Zone::Superblock, 1, &mut prng);
        let after = storage.read(Zone::Superblock, 1);
        let flipped: u32 = before.iter().zip(&after).map(|(x, y)| (x ^ y).count_ones()).sum();
        assert_eq!(flipped, 1, "seed {seed}");
        assert!(bit_index < 700 * 8, "the flip lands in the record");
        assert_ne!(before[(bit_index / 8) as usize], after[(bit_index / 8) as usize]);
        assert_eq!(
            storage.faulty_slots(),
            [(
                Zone::Superblock,
                1,
                SlotFaults {
                    torn: false,
                    bits_flipped: 1
                }
            )]
        );
        // It persists across a crash...
        storage.crash(&mut prng);
        assert_eq!(storage.read(Zone::Superblock, 1), after);
        // ...until the slot is durably rewritten.
        storage.write(Zone::Superblock, 1, &record);
        assert!(
            storage.is_faulty(Zone::Superblock, 1),
            "a pending rewrite is not durable yet"
        );
        storage.sync().expect("no sync faults");
        assert!(!storage.is_faulty(Zone::Superblock, 1));
        assert_eq!(storage.read(Zone::Superblock, 1), before);
        storage.check_invariants();
    }
}

#[test]
fn storage_corrupt_reaches_a_never_written_slot() {
    let mut storage = storage(StorageOptions::default(), 3);
    let mut prng = Prng::from_seed(3);
    storage.corrupt(Zone::Headers, 7, &mut prng);
    let ones: u32 = storage
        .read(Zone::Headers, 7)
        .iter()
        .map(|byte| byte.count_ones())
        .sum();
    assert_eq!(ones, 1);
    assert!(storage.is_faulty(Zone::Headers, 7));
}

#[test]
fn storage_failed_sync_reports_err_and_the_crash_decides() {
    let options = StorageOptions {
        sync_fail_ppm: 0,
        crash_write_lost_ppm: PPM,
        crash_write_torn_ppm: 0,
    };
    let mut storage = storage(options, 4);
    let mut prng = Prng::from_seed(4);
    storage.write(Zone::Prepares, 0, &[1; 1000]);
    storage.fail_next_sync();
    assert!(storage.sync().is_err());
    assert!(storage.sync_failed());
    // The write is still visible (page cache) but undetermined until the crash.
    assert_eq!(storage.read(Zone::Prepares, 0)[0], 1);
    storage.crash(&mut prng);
    assert!(!storage.sync_failed());
    assert_eq!(
        storage.read(Zone::Prepares, 0),
        vec![0; 4 * SECTOR],
        "the crash lost it"
    );
    // Only the next sync was armed.
    storage.write(Zone::Prepares, 0, &[2; 1000]);
    assert!(storage.sync().is_ok());
    let counters = storage.counters();
    assert_eq!(
        (counters.syncs, counters.syncs_failed, counters.crashes),
        (2, 1, 1)
    );
    storage.check_invariants();
}

#[test]
fn storage_sync_fail_ppm_of_a_million_always_fails() {
    let options = StorageOptions {
        sync_fail_ppm: PPM,
        ..StorageOptions::default()
    };
    let mut storage = storage(options, 5);
    let mut prng = Prng::from_seed(5);
    for _ in 0..20 {
        storage.write(Zone::Headers, 0, &[9; 256]);
        assert!(storage.sync().is_err());
        storage.crash(&mut prng);
    }
    assert_eq!(storage.counters().syncs_failed, 20);
}

#[test]
#[should_panic(expected = "must crash first")]
fn storage_refuses_writes_after_a_failed_sync() {
    let mut storage = storage(StorageOptions::default(), 6);
    storage.fail_next_sync();
    let _ = storage.sync();
    storage.write(Zone::Headers, 0, &[1; 256]);
}

#[test]
#[should_panic(expected = "do not fit")]
fn storage_refuses_writes_larger_than_the_slot() {
    let mut storage = storage(StorageOptions::default(), 7);
    storage.write(Zone::Headers, 0, &[1; 257]);
}

#[test]
fn storage_wipe_zeroes_everything() {
    let mut storage = storage(StorageOptions::default(), 8);
    let mut prng = Prng::from_seed(8);
    for zone in Zone::ALL {
        let shape = layout().shape(zone);
        for slot in 0..shape.slot_count {
            storage.write(zone, slot, &vec![0xFF; shape.slot_size_bytes as usize]);
        }
    }
    storage.sync().expect("no sync faults");
    storage.corrupt(Zone::Prepares, 2, &mut prng);
    storage.write(Zone::Headers, 1, &[7; 10]);
    storage.wipe();
    storage.check_invariants();
    assert_eq!(storage.pending_count(), 0);
    assert!(storage.faulty_slots().is_empty());
    for zone in Zone::ALL {
        let shape = layout().shape(zone);
        for slot in 0..shape.slot_count {
            assert_eq!(storage.read(zone, slot), vec![0; shape.slot_size_bytes as usize]);
        }
    }
}

/// A run of random writes, syncs, crashes and flips; returns every slot's final bytes.
fn storage_run(seed: u64) -> Vec<Vec<u8>> {
    let streams = Streams::new(seed);
    let mut storage = Storage::new(
        layout(),
        StorageOptions {
            sync_fail_ppm: 50_000,
            ..StorageOptions::default()
        },
        streams.stream_indexed(stream_names::STORAGE_FAULTS, 0),
    );
    let mut crashes = streams.stream(stream_names::CRASHES);
    let mut clients = streams.stream(stream_names::CLIENTS);
    for _ in 0..500 {
        let zone = *clients.choose(&Zone::ALL).expect("zones");
        let shape = layout().shape(zone);
        let slot = clients.below(u64::from(shape.slot_count)) as u32;
        let len = clients.range_inclusive(1, u64::from(shape.slot_size_bytes)) as usize;
        storage.write(zone, slot, &random_bytes(&mut clients, len));
        if clients.chance_ppm(300_000) && storage.sync().is_err() {
            storage.crash(&mut crashes);
        }
        if crashes.chance_ppm(20_000) {
            storage.crash(&mut crashes);
        }
        if crashes.chance_ppm(20_000) {
            storage.corrupt(zone, slot, &mut crashes);
        }
        storage.check_invariants();
    }
    Zone::ALL
        .iter()
        .flat_map(|&zone| (0..layout().shape(zone).slot_count).map(move |slot| (zone, slot)))
        .map(|(zone, slot)| storage.read(zone, slot))
        .collect()
}

#[test]
fn storage_same_seed_gives_the_same_disk() {
    assert_eq!(storage_run(31), storage_run(31));
    assert_ne!(storage_run(31), storage_run(32));
}

// ---------------------------------------------------------------------------------------------
// Trace

#[test]
fn trace_hash_depends_on_every_record() {
    let run = |last: u64| {
        let mut trace = TraceHash::new();
        for (due_tick, from, to, message) in faulty_run(5) {
            trace.record_u64(due_tick);
            trace.record_u64(u64::from(from.0));
            trace.record_u64(u64::from(to.0));
            trace.record_u64(message);
        }
        trace.record_str("end");
        trace.record_u64(last);
        trace.finish()
    };
    assert_eq!(run(1), run(1));
    assert_ne!(run(1), run(2));
}
