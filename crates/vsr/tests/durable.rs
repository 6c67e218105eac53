//! Property tests of the superblock (`cairn_vsr::durable`) against its fault model.
//!
//! Fault model, per copy of [`COPY_SIZE`] bytes, each in its own sector:
//! - a crash during a write tears at most the copy being written: a prefix of the new bytes over
//!   the old ones (an empty or a whole prefix included);
//! - a bit flip damages one copy, and stays until that copy is rewritten whole.
//!
//! `crash_during_the_last_write` is the fault of one write: the replica wrote and completed some
//! writes, crashed in the last one, and up to three copies are damaged besides. It checks the
//! choice against an oracle that knows which bytes each copy holds, so a wrong rule (the lowest
//! sequence, the first valid copy) fails it.
//!
//! `repeated_crashes_with_repair` runs a replica through many writes, crashes and repairs, with
//! at most one flipped copy unrepaired at a time, and checks that a boot never goes back behind
//! a state the replica acted on, and never refuses.

use cairn_vsr::constants::SUPERBLOCK_COPIES;
use cairn_vsr::durable::{
    COPY_SIZE, Chosen, DurableRefusal, DurableState, choose, encode_copy, plan_format, plan_write,
};
use proptest::prelude::*;

type Copies = [[u8; COPY_SIZE]; SUPERBLOCK_COPIES];

/// How one write changes the state. Every value gives a valid monotone successor.
#[derive(Clone, Copy, Debug)]
struct Step {
    view_delta: u32,
    log_view_pick: u32,
    commit_delta: u64,
    checkpoint_pick: u64,
    checkpoint_checksum: u128,
    /// Checksums kept below the log head (the head sits just above them).
    log_suffix_len: u64,
    log_checksum_seed: u128,
}

fn step() -> impl Strategy<Value = Step> {
    (
        (0..3u32, any::<u32>(), 0..5u64, any::<u64>(), any::<u128>()),
        (0..6u64, any::<u128>()),
    )
        .prop_map(
            |(
                (view_delta, log_view_pick, commit_delta, checkpoint_pick, checkpoint_checksum),
                (log_suffix_len, log_checksum_seed),
            )| Step {
                view_delta,
                log_view_pick,
                log_suffix_len,
                log_checksum_seed,
                commit_delta,
                checkpoint_pick,
                checkpoint_checksum,
            },
        )
}

fn successor(current: &DurableState, step: &Step) -> DurableState {
    let view = current.view + step.view_delta;
    let log_view = current.log_view + step.log_view_pick % (view - current.log_view + 1);
    let commit_max = current.commit_max + step.commit_delta;
    let checkpoint_op =
        current.checkpoint_op + step.checkpoint_pick % (commit_max - current.checkpoint_op + 1);
    let checkpoint_checksum = if checkpoint_op == current.checkpoint_op {
        current.checkpoint_checksum
    } else {
        step.checkpoint_checksum
    };
    DurableState {
        view,
        log_view,
        commit_max,
        checkpoint_op,
        checkpoint_checksum,
        log_head_op: commit_max + step.log_suffix_len + 1,
        log_head_checksum: step.log_checksum_seed,
        log_suffix: (0..step.log_suffix_len)
            .map(|index| step.log_checksum_seed ^ u128::from(index + 1))
            .collect(),
        ..current.clone()
    }
}

/// Whether `newer` could have been written after `older` (or is it).
fn follows(older: &DurableState, newer: &DurableState) -> bool {
    newer.cluster == older.cluster
        && newer.replica == older.replica
        && newer.replica_count == older.replica_count
        && newer.view >= older.view
        && newer.log_view >= older.log_view
        && newer.commit_max >= older.commit_max
        && newer.checkpoint_op >= older.checkpoint_op
}

fn identity() -> impl Strategy<Value = (u128, u8, u8)> {
    (any::<u128>(), 1..=6u8)
        .prop_flat_map(|(cluster, replica_count)| (Just(cluster), 0..replica_count, Just(replica_count)))
}

fn read(copies: &Copies, cluster: u128, replica: u8) -> Result<Chosen, DurableRefusal> {
    choose(&copies.each_ref().map(|copy| Some(&copy[..])), cluster, replica)
}

/// Write `new` over `old` as a torn write leaves it: the first `prefix_bytes` are new.
fn tear(copy: &mut [u8; COPY_SIZE], new: &[u8; COPY_SIZE], prefix_bytes: usize) {
    copy[..prefix_bytes].copy_from_slice(&new[..prefix_bytes]);
}

fn flip(copy: &mut [u8; COPY_SIZE], bit: usize) {
    copy[bit / 8] ^= 1 << (bit % 8);
}

/// The superblock zone under the fault model of `repeated_crashes_with_repair`: at most one
/// copy holds a bit flip that nothing has written over since.
struct Disk {
    copies: Copies,
    flipped: Option<usize>,
}

impl Disk {
    /// Flip a bit, unless another copy already holds an unrepaired flip.
    fn flip(&mut self, at: Option<(usize, usize)>) {
        if let Some((copy, bit)) = at
            && self.flipped.is_none()
        {
            flip(&mut self.copies[copy], bit);
            self.flipped = Some(copy);
        }
    }

    /// Write `bytes` to `copies` in order, each synced before the next. With `crash` =
    /// `(copy, prefix_bytes)`, the crash strikes while `copy` is written: the copies before it
    /// hold `bytes`, it holds a torn prefix, and the rest are untouched. Returns whether the
    /// write completed.
    fn write(&mut self, copies: &[usize], bytes: &[u8; COPY_SIZE], crash: Option<(usize, usize)>) -> bool {
        for &copy in copies {
            let crashed = crash.filter(|&(crash_copy, _)| crash_copy == copy);
            let prefix_bytes = crashed.map_or(COPY_SIZE, |(_, prefix_bytes)| prefix_bytes);
            tear(&mut self.copies[copy], bytes, prefix_bytes);
            // Only a whole rewrite repairs a flipped copy. (If a torn rewrite counted as repair,
            // flips could accumulate over crashed repairs until no copy is left: one per boot,
            // each boot crashing before its repair reaches the flipped copy.)
            if prefix_bytes == COPY_SIZE && self.flipped == Some(copy) {
                self.flipped = None;
            }
            // Even a whole copy is not a complete write when the crash came before its sync.
            if crashed.is_some() {
                return false;
            }
        }
        true
    }
}

proptest! {
    #[test]
    fn crash_during_the_last_write(
        (cluster, replica, replica_count) in identity(),
        steps in prop::collection::vec(step(), 1..20),
        crash_copy in 0..=SUPERBLOCK_COPIES,
        torn_prefix_bytes in prop::option::of(0..=COPY_SIZE),
        flips in prop::collection::vec((0..SUPERBLOCK_COPIES, 0..COPY_SIZE * 8), 0..=3),
        permutation in Just((0..SUPERBLOCK_COPIES).collect::<Vec<_>>()).prop_shuffle(),
    ) {
        let formatted = DurableState::formatted(cluster, replica, replica_count);
        let (mut sequence, mut bytes) = plan_format(&formatted).unwrap();
        let mut state = formatted.clone();
        let mut copies: Copies = [bytes; SUPERBLOCK_COPIES];

        // Every write but the last completes: every copy holds it.
        for step in &steps[..steps.len() - 1] {
            let next = successor(&state, step);
            (sequence, bytes) = plan_write(&state, sequence, &next).unwrap();
            state = next;
            copies = [bytes; SUPERBLOCK_COPIES];
        }
        let (completed_state, completed_sequence, completed_bytes) = (state.clone(), sequence, bytes);

        // The last write crashes while writing copy `crash_copy` (none, if it is
        // SUPERBLOCK_COPIES: then the write completed).
        let progress_state = successor(&state, &steps[steps.len() - 1]);
        let (progress_sequence, progress_bytes) = plan_write(&state, sequence, &progress_state).unwrap();
        prop_assert_eq!(progress_sequence, completed_sequence + 1);
        for copy in copies.iter_mut().take(crash_copy) {
            *copy = progress_bytes;
        }
        if crash_copy < SUPERBLOCK_COPIES && let Some(prefix_bytes) = torn_prefix_bytes {
            tear(&mut copies[crash_copy], &progress_bytes, prefix_bytes);
        }
        let flip_count = flips.len();
        for &(copy, bit) in &flips {
            flip(&mut copies[copy], bit);
        }

        // The oracle knows what each copy holds without decoding it.
        let holds: [Option<u64>; SUPERBLOCK_COPIES] = copies.each_ref().map(|copy| {
            if *copy == progress_bytes {
                Some(progress_sequence)
            } else if *copy == completed_bytes {
                Some(completed_sequence)
            } else {
                None
            }
        });
        let chosen = read(&copies, cluster, replica);
        let Some(expected_sequence) = holds.iter().flatten().copied().max() else {
            // Every copy damaged: that takes one torn copy and three flips, or four flips. The
            // superblock refuses; it never boots as wiped or from something older.
            prop_assert!(flip_count >= 3);
            prop_assert!(matches!(chosen, Err(DurableRefusal::AllCopiesCorrupt { .. })), "{:?}", chosen);
            return Ok(());
        };
        let expected_state =
            if expected_sequence == progress_sequence { progress_state } else { completed_state };
        let expected_copies_to_repair = holds.map(|held| held != Some(expected_sequence));
        let expected_copies_valid = expected_copies_to_repair.iter().filter(|&&repair| !repair).count();
        prop_assert_eq!(chosen, Ok(Chosen::Formatted {
            state: expected_state.clone(),
            sequence: expected_sequence,
            copies_valid: expected_copies_valid,
            copies_to_repair: expected_copies_to_repair,
        }));

        // The claims of the design note, stated directly: never older than the last complete
        // write, however many copies are damaged, as long as one verifies; the write itself if it
        // completed and nothing was damaged.
        prop_assert!(expected_sequence >= completed_sequence);
        prop_assert!(expected_sequence <= progress_sequence);
        if crash_copy == SUPERBLOCK_COPIES && flip_count == 0 {
            prop_assert_eq!(expected_sequence, progress_sequence);
            prop_assert_eq!(expected_copies_valid, SUPERBLOCK_COPIES);
        }
        // One torn copy and one flip leave at least two copies that verify.
        if flip_count <= 1 {
            prop_assert!(holds.iter().flatten().count() >= 2);
        }

        // The choice depends on the set of copies, not on their positions.
        let permuted: Copies = std::array::from_fn(|copy| copies[permutation[copy]]);
        let permuted_copies_to_repair: [bool; SUPERBLOCK_COPIES] =
            std::array::from_fn(|copy| expected_copies_to_repair[permutation[copy]]);
        prop_assert_eq!(read(&permuted, cluster, replica), Ok(Chosen::Formatted {
            state: expected_state,
            sequence: expected_sequence,
            copies_valid: expected_copies_valid,
            copies_to_repair: permuted_copies_to_repair,
        }));
    }

    #[test]
    fn repeated_crashes_with_repair(
        (cluster, replica, replica_count) in identity(),
        events in prop::collection::vec(
            (
                step(),
                prop::option::of((0..SUPERBLOCK_COPIES, 0..COPY_SIZE * 8)),
                prop::option::of((0..SUPERBLOCK_COPIES, 0..=COPY_SIZE)),
                prop::collection::vec(
                    (
                        prop::option::of((0..SUPERBLOCK_COPIES, 0..COPY_SIZE * 8)),
                        prop::option::of((0..SUPERBLOCK_COPIES, 0..=COPY_SIZE)),
                    ),
                    0..4,
                ),
            ),
            1..40,
        ),
    ) {
        let formatted = DurableState::formatted(cluster, replica, replica_count);
        let (format_sequence, format_bytes) = plan_format(&formatted).unwrap();
        let mut disk = Disk { copies: [format_bytes; SUPERBLOCK_COPIES], flipped: None };
        // The state the replica acted on last. Every copy held it when it started acting.
        let mut acted = (formatted, format_sequence);

        for (step, flip_before_write, write_crash, boots) in events {
            // A latent flip may be there before the write starts.
            disk.flip(flip_before_write);

            // The replica writes its next state; the write may crash and tear one copy.
            let (current, current_sequence) = acted.clone();
            let next = successor(&current, &step);
            let (next_sequence, next_bytes) = plan_write(&current, current_sequence, &next).unwrap();
            let order: Vec<usize> = (0..SUPERBLOCK_COPIES).collect();
            if disk.write(&order, &next_bytes, write_crash) {
                acted = (next, next_sequence);
                continue;
            }

            // Boots until one repairs completely: each may find a new flip, and each repair may
            // crash again. The last boot is clean.
            let clean_boot = (None, None);
            for (flip_at_boot, repair_crash) in boots.into_iter().chain(std::iter::once(clean_boot)) {
                disk.flip(flip_at_boot);
                let chosen = read(&disk.copies, cluster, replica);
                let Ok(Chosen::Formatted { state, sequence, copies_valid, copies_to_repair }) = chosen
                else {
                    return Err(TestCaseError::fail(format!("boot refused: {chosen:?}")));
                };
                prop_assert!(sequence >= acted.1, "rolled back from {} to {}", acted.1, sequence);
                prop_assert!(sequence <= next_sequence);
                prop_assert!(follows(&acted.0, &state));
                if sequence == acted.1 {
                    prop_assert_eq!(&state, &acted.0);
                }

                // Repair: rewrite each copy that does not hold the chosen bytes, in ascending
                // order, each synced before the next.
                let repair_bytes = encode_copy(&state, sequence);
                let to_repair: Vec<usize> =
                    (0..SUPERBLOCK_COPIES).filter(|&copy| copies_to_repair[copy]).collect();
                prop_assert_eq!(to_repair.len(), SUPERBLOCK_COPIES - copies_valid);
                for &copy in &to_repair {
                    prop_assert_ne!(disk.copies[copy], repair_bytes);
                }
                let repair_crash = repair_crash
                    .filter(|_| !to_repair.is_empty())
                    .map(|(index, prefix_bytes)| (to_repair[index % to_repair.len()], prefix_bytes));
                if disk.write(&to_repair, &repair_bytes, repair_crash) {
                    prop_assert!(disk.copies.iter().all(|copy| *copy == repair_bytes));
                    acted = (state, sequence);
                    break;
                }
            }
        }
    }
}
