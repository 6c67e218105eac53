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
//! failing seed replays with the seed and `SimOptions::from_seed` / `one_replica` in
//! `run_catching::<MetadataMachine>` (or `PartitionMachine`).

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

#[test]
fn metadata_machine_under_every_fault() {
    let totals = run_range::<MetadataMachine>(seeds(), SimOptions::from_seed);
    println!("{totals:?}");
    assert!(totals.committed > 10_000, "{totals:?}");
    assert!(
        totals.crashes > 0 && totals.power_losses > 0 && totals.torn > 0,
        "{totals:?}"
    );
    assert!(totals.checkpoints > 0 && totals.state_transfers > 0, "{totals:?}");
    assert!(totals.wipes > 0 && totals.bits_flipped > 0, "{totals:?}");
}

#[test]
fn metadata_machine_in_a_cluster_of_one() {
    let totals = run_range::<MetadataMachine>(seeds(), SimOptions::one_replica);
    println!("{totals:?}");
    assert!(totals.committed > 10_000, "{totals:?}");
    assert!(
        totals.power_losses > 0 && totals.torn > 0 && totals.checkpoints > 0,
        "{totals:?}"
    );
}

#[test]
fn partition_machine_under_every_fault() {
    let totals = run_range::<PartitionMachine>(seeds(), SimOptions::from_seed);
    println!("{totals:?}");
    assert!(totals.committed > 10_000, "{totals:?}");
    assert!(
        totals.crashes > 0 && totals.power_losses > 0 && totals.torn > 0,
        "{totals:?}"
    );
    assert!(totals.checkpoints > 0 && totals.state_transfers > 0, "{totals:?}");
    assert!(totals.wipes > 0 && totals.bits_flipped > 0, "{totals:?}");
}

#[test]
fn partition_machine_in_a_cluster_of_one() {
    let totals = run_range::<PartitionMachine>(seeds(), SimOptions::one_replica);
    println!("{totals:?}");
    assert!(totals.committed > 10_000, "{totals:?}");
    assert!(
        totals.power_losses > 0 && totals.torn > 0 && totals.checkpoints > 0,
        "{totals:?}"
    );
}

/// A primary that mints a batch's offsets from its commit point, not from the head of its
/// log, hands the offsets of prepares in flight out again: the partition machine's checker
/// catches it on the first seeds.
#[test]
fn minting_offsets_from_the_commit_point_is_caught() {
    let caught = (0..200).find_map(|seed| {
        let mut options = SimOptions::from_seed(seed);
        options.bugs = Bugs {
            prepare_from_commit_point: true,
            ..Bugs::default()
        };
        run_catching::<PartitionMachine>(seed, options).err()
    });
    let violation = caught.expect("offsets minted twice are caught");
    assert!(violation.what.contains("minted twice"), "{violation}");
}
