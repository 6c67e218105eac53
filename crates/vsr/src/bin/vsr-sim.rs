//! `vsr-sim`: run simulator seeds. `vsr-sim --seed N` replays one seed exactly (same trace
//! hash every time); `vsr-sim --seeds COUNT [--from N]` runs a range and stops at the first
//! violation.

use cairn_vsr::sim::cluster::{SimOptions, run_seed};
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |name: &str| {
        args.iter()
            .position(|arg| arg == name)
            .and_then(|at| args.get(at + 1))
            .map(|text| text.parse::<u64>())
    };
    let (from, count) = match (value("--seed"), value("--seeds"), value("--from")) {
        (Some(Ok(seed)), None, None) => (seed, 1),
        (None, Some(Ok(count)), from) => (from.and_then(Result::ok).unwrap_or(0), count),
        _ => {
            eprintln!("usage: vsr-sim --seed N | vsr-sim --seeds COUNT [--from N]");
            return ExitCode::from(2);
        }
    };
    for seed in from..from.saturating_add(count) {
        match run_seed(seed) {
            Ok(outcome) => {
                if count == 1 {
                    println!("seed {seed}: options {:?}", SimOptions::from_seed(seed));
                }
                println!(
                    "seed {seed}: ok, trace {:016x}, {} ticks, {} ops committed, {} replies, view {}",
                    outcome.trace_hash,
                    outcome.ticks,
                    outcome.committed_ops,
                    outcome.replies,
                    outcome.highest_view
                );
            }
            Err(violation) => {
                println!("seed {seed}: VIOLATION {violation}");
                println!("replay: cargo run -p cairn-vsr --release --bin vsr-sim -- --seed {seed}");
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}
