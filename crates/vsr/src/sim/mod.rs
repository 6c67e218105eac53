//! The deterministic simulator's parts (design: `docs/replication.md`, "Simulator").
//!
//! These parts are generic: none of them knows the protocol's messages or replicas, so they
//! can be tested on their own and reused by any harness.
//!
//! Layout:
//! - [`prng`]: a seeded generator and named, independent streams derived from one run seed.
//! - [`network`]: a faulty message network over numbered endpoints (delay, reorder, drop,
//!   duplicate, partitions), generic over the message type.
//! - [`storage`]: an in-memory model of one replica's disk zones with page-cache semantics,
//!   torn and lost writes at a crash, failed syncs and latent bit flips.
//! - [`trace`]: the event-trace hash that lets two runs of one seed be compared.
//! - [`cluster`]: a whole simulated cluster (replicas, clients, faults) and the checkers.

/// The seed range a simulator binary's arguments ask for: `--seed N` (one seed) or
/// `--seeds COUNT [--from N]`, as (first seed, count). `None` for anything else, a number
/// that does not parse included.
pub fn seed_range(args: &[String]) -> Option<(u64, u64)> {
    let value = |name: &str| {
        args.iter()
            .position(|arg| arg == name)
            .map(|at| args.get(at + 1).and_then(|text| text.parse::<u64>().ok()))
    };
    match (value("--seed"), value("--seeds"), value("--from")) {
        (Some(Some(seed)), None, None) => Some((seed, 1)),
        (None, Some(Some(count)), None) => Some((0, count)),
        (None, Some(Some(count)), Some(Some(from))) => Some((from, count)),
        _ => None,
    }
}

pub mod cluster;
pub mod log_store;
pub mod network;
pub mod prng;
pub mod storage;
pub mod trace;
