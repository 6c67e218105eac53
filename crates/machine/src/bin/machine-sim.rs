//! `machine-sim`: run VSR simulator seeds on a real state machine, in a release build (the
//! 50 000-seed runs `docs/replication.md` quotes take minutes here, far longer in a test
//! build). `machine-sim metadata|partition --seed N` replays one seed;
//! `machine-sim metadata|partition --seeds COUNT [--from N] [--keep-going]` runs a range and
//! stops at the first violation unless `--keep-going`, then prints the failures and totals.
//! `--one-replica` runs clusters of one (`SimOptions::one_replica`). Like the library, it
//! reads no clock (time a run with `time`).

use cairn_machine::metadata::MetadataMachine;
use cairn_machine::partition::PartitionMachine;
use cairn_vsr::sim::cluster::{SimMachine, SimOptions, run_catching};
use std::process::ExitCode;

const USAGE: &str = "usage: machine-sim metadata|partition [--one-replica] --seed N\n       machine-sim metadata|partition [--one-replica] [--keep-going] --seeds COUNT [--from N]";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((from, count)) = cairn_vsr::sim::seed_range(&args) else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let flags = Flags {
        one_replica: args.iter().any(|arg| arg == "--one-replica"),
        keep_going: args.iter().any(|arg| arg == "--keep-going"),
    };
    match args.first().map(String::as_str) {
        Some("metadata") => run::<MetadataMachine>(from, count, flags),
        Some("partition") => run::<PartitionMachine>(from, count, flags),
        _ => {
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
    }
}

#[derive(Clone, Copy)]
struct Flags {
    one_replica: bool,
    keep_going: bool,
}

fn run<M: SimMachine>(from: u64, count: u64, flags: Flags) -> ExitCode {
    let (mut passed, mut failed) = (0u64, 0u64);
    let (mut committed, mut crashes, mut state_transfers, mut log_truncations) = (0u64, 0u64, 0u64, 0u64);
    let mut transfers_keeping_log = 0u64;
    for seed in from..from.saturating_add(count) {
        let options = if flags.one_replica {
            SimOptions::one_replica(seed)
        } else {
            SimOptions::from_seed(seed)
        };
        match run_catching::<M>(seed, options) {
            Ok(outcome) => {
                passed += 1;
                committed += outcome.committed_ops;
                crashes += outcome.crashes;
                state_transfers += outcome.state_transfers;
                transfers_keeping_log += outcome.state_transfers_keeping_log;
                log_truncations += outcome.log_truncations;
                if count == 1 {
                    println!("seed {seed}: ok, trace {:016x}", outcome.trace_hash);
                }
            }
            Err(violation) => {
                failed += 1;
                println!("seed {seed}: VIOLATION {violation}");
                if !flags.keep_going {
                    break;
                }
            }
        }
    }
    println!(
        "{passed} seeds passed, {failed} failed: {committed} ops committed, {crashes} crashes, {state_transfers} state transfers ({transfers_keeping_log} keeping the log), {log_truncations} log cuts"
    );
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
