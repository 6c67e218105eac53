//! `vsr-sim`: run simulator seeds. `vsr-sim --seed N` replays one seed exactly (same trace
//! hash every time); `vsr-sim --seeds COUNT [--from N]` runs a range and stops at the first
//! violation (`--keep-going`: runs them all and counts the failures). `--one-replica` runs
//! the seeds as clusters of one (`SimOptions::one_replica`).

use cairn_vsr::sim::cluster::{ChainMachine, SimOptions, run_catching};
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((from, count)) = cairn_vsr::sim::seed_range(&args) else {
        eprintln!(
            "usage: vsr-sim [--one-replica] --seed N | vsr-sim [--one-replica] [--keep-going] --seeds COUNT [--from N]"
        );
        return ExitCode::from(2);
    };
    let keep_going = args.iter().any(|arg| arg == "--keep-going");
    let mut failures = 0u64;
    let one_replica = args.iter().any(|arg| arg == "--one-replica");
    let options = |seed| {
        if one_replica {
            SimOptions::one_replica(seed)
        } else {
            SimOptions::from_seed(seed)
        }
    };
    for seed in from..from.saturating_add(count) {
        if count == 1 {
            println!("seed {seed}: options {:?}", options(seed));
        }
        match run_catching::<ChainMachine>(seed, options(seed)) {
            Ok(outcome) => {
                println!(
                    "seed {seed}: ok, trace {:016x}, {} ticks, {} ops committed, {} replies, view {}, {} crashes, {} power losses, {} failed syncs, {} wipes, {} bits flipped, {} writes lost, {} torn, {} checkpoints, {} state transfers, {} prepares read back, {} log cuts",
                    outcome.trace_hash,
                    outcome.ticks,
                    outcome.committed_ops,
                    outcome.replies,
                    outcome.highest_view,
                    outcome.crashes,
                    outcome.power_losses,
                    outcome.syncs_failed,
                    outcome.wipes,
                    outcome.bits_flipped,
                    outcome.writes_lost,
                    outcome.writes_torn,
                    outcome.checkpoints,
                    outcome.state_transfers,
                    outcome.prepare_reads,
                    outcome.log_truncations
                );
            }
            Err(violation) => {
                println!("seed {seed}: VIOLATION {violation}");
                let flag = if one_replica { "--one-replica " } else { "" };
                println!("replay: cargo run --profile sim -p cairn-vsr --bin vsr-sim -- {flag}--seed {seed}");
                failures += 1;
                if !keep_going {
                    return ExitCode::FAILURE;
                }
            }
        }
    }
    if failures > 0 {
        println!("{failures} of {count} seeds failed");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
