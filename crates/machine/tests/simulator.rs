//! The VSR simulator running the real metadata and partition machines: every fault of the protocol tests
//! (network faults, pauses, crashes, power losses, failed syncs, torn and lost writes, wiped
//! disks, bit flips), with the checkers comparing the machine's state after every op on every
//! replica, through checkpoints (its snapshot) and state transfer (its restore). Clusters of
//! three or five, and of one (what `cairn serve` runs).
//!
//! The partition machine mints offsets when the primary prepares; its checkers say that every
//! committed append continues the committed log exactly (no offset minted twice, none
//! skipped) and that the manifest, with a digest chained over every committed batch, is the
//! same after every op on every replica.
//!
//! 2 000 seeds of each run in `cargo test`; `CAIRN_MACHINE_SIM_SEEDS=N` runs N instead. A
//! failing seed replays with `cargo run --profile sim -p cairn-machine --bin machine-sim --
//! partition|metadata [--one-replica] --seed N`, which also runs ranges far faster than a
//! test build.

use cairn_machine::metadata::MetadataMachine;
use cairn_machine::partition::PartitionMachine;
use cairn_vsr::replica::Bugs;
use cairn_vsr::sim::cluster::{SimMachine, SimOptions, run_catching};

#[derive(Default, Debug)]
struct Totals {
    committed: u64,
    crashes: u64,
    power_losses: u64,
    torn: u64,
    checkpoints: u64,
    state_transfers: u64,
    wipes: u64,
    bits_flipped: u64,
}

fn run_range<M: SimMachine>(seeds: std::ops::Range<u64>, options: impl Fn(u64) -> SimOptions) -> Totals {
    let mut totals = Totals::default();
    let mut failures = Vec::new();
    for seed in seeds {
        match run_catching::<M>(seed, options(seed)) {
            Ok(outcome) => {
                totals.committed += outcome.committed_ops;
                totals.crashes += outcome.crashes;
                totals.power_losses += outcome.power_losses;
                totals.torn += outcome.writes_torn;
                totals.checkpoints += outcome.checkpoints;
                totals.state_transfers += outcome.state_transfers;
                totals.wipes += outcome.wipes;
                totals.bits_flipped += outcome.bits_flipped;
            }
            Err(violation) => failures.push((seed, violation)),
        }
    }
    assert!(
        failures.is_empty(),
        "{} seeds failed, first: {:?}",
        failures.len(),
        failures.first()
    );
    totals
}

fn seeds() -> std::ops::Range<u64> {
    let count = std::env::var("CAIRN_MACHINE_SIM_SEEDS")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(2_000);
    0..count
}

/// `M` under every fault, in clusters of three or five: every fault kind occurred.
fn under_every_fault<M: SimMachine>() {
    let totals = run_range::<M>(seeds(), SimOptions::from_seed);
    println!("{totals:?}");
    assert!(totals.committed > 10_000, "{totals:?}");
    assert!(
        totals.crashes > 0 && totals.power_losses > 0 && totals.torn > 0,
        "{totals:?}"
    );
    assert!(totals.checkpoints > 0 && totals.state_transfers > 0, "{totals:?}");
    assert!(totals.wipes > 0 && totals.bits_flipped > 0, "{totals:?}");
}

/// `M` in a cluster of one (what `cairn serve` runs): power losses tore writes and the
/// replica checkpointed.
fn in_a_cluster_of_one<M: SimMachine>() {
    let totals = run_range::<M>(seeds(), SimOptions::one_replica);
    println!("{totals:?}");
    assert!(totals.committed > 10_000, "{totals:?}");
    assert!(
        totals.power_losses > 0 && totals.torn > 0 && totals.checkpoints > 0,
        "{totals:?}"
    );
}

#[test]
fn metadata_machine_under_every_fault() {
    under_every_fault::<MetadataMachine>();
}

#[test]
fn metadata_machine_in_a_cluster_of_one() {
    in_a_cluster_of_one::<MetadataMachine>();
}

#[test]
fn partition_machine_under_every_fault() {
    under_every_fault::<PartitionMachine>();
}

#[test]
fn partition_machine_in_a_cluster_of_one() {
    in_a_cluster_of_one::<PartitionMachine>();
}

/// The first of `seeds` at which the simulator, running the partition machine, catches
/// `bugs`, and what it found.
fn first_caught(bugs: Bugs, seeds: std::ops::Range<u64>) -> Option<(u64, String)> {
    seeds.into_iter().find_map(|seed| {
        let mut options = SimOptions::from_seed(seed);
        options.bugs = bugs;
        run_catching::<PartitionMachine>(seed, options)
            .err()
            .map(|violation| (seed, violation.to_string()))
    })
}

/// The core's protocol mutations, each caught with the partition machine as the replicated
/// state: an ACK counted before the prepare is durable on a quorum (a commit on the
/// primary's own acknowledgement), a truncation of an op a quorum holds (one nack decides),
/// a merge that lets an old log replace committed ops, view-change messages sent before the
/// view is durable, and a restart that trusts stale journal slots.
#[test]
fn the_core_mutations_are_caught_with_the_partition_machine() {
    let mutations = [
        (
            "commit without a quorum",
            Bugs {
                commit_without_quorum: true,
                ..Bugs::default()
            },
        ),
        (
            "truncate without a nack quorum",
            Bugs {
                truncate_without_nack_quorum: true,
                ..Bugs::default()
            },
        ),
        (
            "merge ignoring log_view",
            Bugs {
                merge_ignores_log_view: true,
                ..Bugs::default()
            },
        ),
        (
            "send before the view is durable",
            Bugs {
                send_before_view_persist: true,
                ..Bugs::default()
            },
        ),
        (
            "recovery ignoring the log head",
            Bugs {
                recovery_ignores_log_head: true,
                ..Bugs::default()
            },
        ),
    ];
    for (name, bugs) in mutations {
        let (seed, violation) =
            first_caught(bugs, 0..5_000).unwrap_or_else(|| panic!("{name}: not caught in 5 000 seeds"));
        println!("{name}: caught at seed {seed}: {violation}");
    }
}

/// A primary that mints a batch's offsets from its commit point, not from the head of its
/// log, hands the offsets of prepares in flight out again: the partition machine's checker
/// catches it on the first seeds.
#[test]
fn minting_offsets_from_the_commit_point_is_caught() {
    let bugs = Bugs {
        prepare_from_commit_point: true,
        ..Bugs::default()
    };
    let (_, violation) = first_caught(bugs, 0..200).expect("offsets minted twice are caught");
    assert!(violation.contains("minted twice"), "{violation}");
}

/// A view-change bug the partition machine's seeds found (issue 13, 2026-12-01): a
/// primary-elect that merged the DoViewChanges and filled its journal from the merged log,
/// then moved on to a later view before its holes were filled, sent a DoViewChange under its
/// old `log_view` whose suffix held the merged (newer) ops, and the next primary found two
/// suffixes of one `log_view` disagreeing. The merge now raises `log_view` to the view
/// (persisted before anything of the view leaves). This seed hit it.
#[test]
fn a_do_view_change_suffix_is_the_log_of_its_log_view() {
    let seed = 14_067;
    if let Err(violation) = run_catching::<PartitionMachine>(seed, SimOptions::from_seed(seed)) {
        panic!("seed {seed}: {violation}");
    }
}
