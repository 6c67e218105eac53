//! Scenarios that need real disks, scripted on the simulator (`Simulation::scripted`): a
//! backup restarting on a wiped disk, a corrupt journal entry, a corrupt superblock copy on
//! each replica in turn, and every replica restarting at once. Clients send requests throughout, and every checker of the
//! seeded runs (one canonical log, equal state machines, monotone views, replies, liveness
//! after the heal) runs here too.

use cairn_vsr::constants::{JOURNAL_SLOTS, SUPERBLOCK_COPIES};
use cairn_vsr::durable::{self, COPY_SIZE, Chosen};
use cairn_vsr::journal::{SlotState, classify_slot, slot_of};
use cairn_vsr::replica::Status;
use cairn_vsr::sim::cluster::{SIM_CLUSTER, Sent, Simulation};
use cairn_vsr::sim::storage::Zone;

/// The group the simulator's replicas replicate.
const SIM_GROUP: u64 = 1;

/// Run until replica `replica` is normal and has applied what the cluster committed when
/// this was called; panics if that takes more than `ticks_max`.
fn until_caught_up(sim: &mut Simulation, replica: usize, ticks_max: u64) {
    let target = sim.committed_ops();
    let caught_up = sim
        .run_until(ticks_max, |sim| {
            sim.replica(replica).status() == Status::Normal && sim.replica(replica).commit_min() >= target
        })
        .expect("no violation");
    assert!(
        caught_up,
        "replica {replica} did not catch up to op {target}: {}",
        sim.replica(replica).describe()
    );
}

fn until_committed(sim: &mut Simulation, ops: u64, ticks_max: u64) {
    let reached = sim
        .run_until(ticks_max, |sim| sim.committed_ops() >= ops)
        .expect("no violation");
    assert!(reached, "only {} ops committed", sim.committed_ops());
}

/// What journal slot `slot` of `replica`'s disk proves now.
fn slot_state(sim: &Simulation, replica: usize, slot: usize) -> SlotState {
    let storage = sim.storage(replica);
    let prepare = storage.read(Zone::Prepares, slot as u32);
    let header = storage.read(Zone::Headers, slot as u32);
    classify(slot, &prepare, &header)
}

/// What a slot's prepare and header bytes prove (the simulator's machine keeps the plain
/// body rule).
fn classify(slot: usize, prepare: &[u8], header: &[u8]) -> SlotState {
    classify_slot(
        slot,
        JOURNAL_SLOTS,
        prepare,
        header,
        SIM_CLUSTER,
        SIM_GROUP,
        cairn_vsr::journal::plain_body,
    )
}

#[test]
fn a_backup_restarting_with_a_wiped_disk_rejoins_by_state_transfer_and_never_votes_before() {
    let mut sim = Simulation::scripted(1, 3);
    until_committed(&mut sim, 20, 2_000);
    let wiped = 1;
    sim.crash_replica(wiped);
    sim.wipe_disk(wiped);
    // The others go on well past what any journal still holds of the ops it lacks.
    until_committed(&mut sim, 20 + 2 * JOURNAL_SLOTS as u64, 20_000);
    sim.restart_replica(wiped).expect("a wiped disk boots, as wiped");
    assert_eq!(sim.replica(wiped).status(), Status::Recovering);
    assert_eq!(sim.replica(wiped).commit_min(), 0, "nothing survived the wipe");

    // Until it has installed a view, it casts no vote and acknowledges nothing.
    let installed = sim
        .run_until(20_000, |sim| sim.replica(wiped).status() != Status::Recovering)
        .expect("no violation");
    assert!(installed, "{}", sim.replica(wiped).describe());
    assert_eq!(
        sim.sent(wiped),
        Sent::default(),
        "it voted or acknowledged on an empty log"
    );
    assert!(
        sim.state_transfers_of(wiped) >= 1,
        "the ops it needed are gone from every journal: only a checkpoint brings it back"
    );
    until_caught_up(&mut sim, wiped, 20_000);

    // A full member again: it acknowledges new ops, and the cluster can lose another.
    let acknowledged = sim
        .run_until(5_000, |sim| sim.sent(wiped).prepare_oks > 0)
        .expect("no violation");
    assert!(acknowledged, "it never acknowledged a prepare after rejoining");
    sim.crash_replica(2);
    let committed = sim.committed_ops();
    until_committed(&mut sim, committed + 10, 20_000);
    sim.restart_replica(2).expect("restarts");
    let outcome = sim.finish().expect("no violation, and every request completes");
    assert!(outcome.state_transfers >= 1 && outcome.wipes == 1);
}

#[test]
fn a_corrupt_journal_entry_is_repaired_from_a_peer() {
    let mut sim = Simulation::scripted(2, 3);
    until_committed(&mut sim, 30, 2_000);
    let backup = 2;
    // Stop the clients' progress from moving the op out of the journal window meanwhile:
    // pick the newest op the backup holds durably above its checkpoint.
    let checkpoint = sim.replica(backup).durable().checkpoint_op;
    let head = sim.replica(backup).op();
    assert!(head > checkpoint, "the backup holds ops above its checkpoint");
    sim.crash_replica(backup);
    let op = (checkpoint + 1..=head)
        .rev()
        .find(|&op| matches!(slot_state(&sim, backup, slot_of(op, JOURNAL_SLOTS)), SlotState::Clean(ref prepare) if prepare.header.op == op))
        .expect("a durable prepare above the checkpoint");
    let slot = slot_of(op, JOURNAL_SLOTS);
    let SlotState::Clean(original) = slot_state(&sim, backup, slot) else {
        unreachable!("found clean above");
    };
    sim.flip_bit(backup, Zone::Prepares, slot as u32);
    let SlotState::Faulty { header } = slot_state(&sim, backup, slot) else {
        panic!("a flipped prepare must read as faulty");
    };
    assert_eq!(
        header.map(|header| header.checksum),
        Some(original.header.checksum),
        "the redundant header names what to repair"
    );

    sim.restart_replica(backup).expect("restarts with a faulty slot");
    until_caught_up(&mut sim, backup, 20_000);
    // The slot holds the same prepare again, durably: only a peer could have sent it.
    let repaired = sim
        .run_until(2_000, |sim| {
            let storage = sim.storage(backup);
            let prepare = storage.read_durable(Zone::Prepares, slot as u32);
            let header = storage.read_durable(Zone::Headers, slot as u32);
            classify(slot, &prepare, &header) == SlotState::Clean(original.clone())
        })
        .expect("no violation");
    assert!(
        repaired,
        "slot {slot} does not hold op {op} again: {:?}",
        slot_state(&sim, backup, slot)
    );
    sim.finish().expect("no violation, and every request completes");
}

#[test]
fn one_corrupt_superblock_copy_on_each_replica_in_turn() {
    let mut sim = Simulation::scripted(3, 3);
    until_committed(&mut sim, 10, 2_000);
    for replica in 0..3 {
        let copy = replica % SUPERBLOCK_COPIES;
        // Crash between superblock writes, so every copy holds one state before the flip.
        let idle = sim
            .run_until(2_000, |sim| !sim.superblock_writing(replica))
            .expect("no violation");
        assert!(idle, "replica {replica} never finished a superblock write");
        sim.crash_replica(replica);
        sim.flip_bit(replica, Zone::Superblock, copy as u32);
        let copies: Vec<Vec<u8>> = (0..SUPERBLOCK_COPIES)
            .map(|copy| sim.storage(replica).read(Zone::Superblock, copy as u32))
            .collect();
        let refs: [Option<&[u8]>; SUPERBLOCK_COPIES] =
            std::array::from_fn(|copy| Some(&copies[copy][..COPY_SIZE]));
        let Ok(Chosen::Formatted { copies_valid, .. }) = durable::choose(&refs, SIM_CLUSTER, replica as u8)
        else {
            panic!("three good copies choose a state");
        };
        assert_eq!(
            copies_valid,
            SUPERBLOCK_COPIES - 1,
            "the flip damaged exactly one copy"
        );

        sim.restart_replica(replica).expect("boots from the other copies");
        // The boot rewrote the damaged copy before the replica acted.
        let copies: Vec<Vec<u8>> = (0..SUPERBLOCK_COPIES)
            .map(|copy| sim.storage(replica).read_durable(Zone::Superblock, copy as u32))
            .collect();
        let refs: [Option<&[u8]>; SUPERBLOCK_COPIES] =
            std::array::from_fn(|copy| Some(&copies[copy][..COPY_SIZE]));
        assert!(matches!(
            durable::choose(&refs, SIM_CLUSTER, replica as u8),
            Ok(Chosen::Formatted {
                copies_valid: SUPERBLOCK_COPIES,
                ..
            })
        ));
        until_caught_up(&mut sim, replica, 20_000);
        let committed = sim.committed_ops();
        until_committed(&mut sim, committed + 5, 20_000);
    }
    sim.finish().expect("no violation, and every request completes");
}

#[test]
fn a_whole_cluster_restart_comes_back_with_every_committed_op() {
    let mut sim = Simulation::scripted(4, 3);
    until_committed(&mut sim, 40, 5_000);
    // A power loss: every replica crashes at once, unsynced writes lost, durable or torn.
    for replica in 0..3 {
        sim.crash_replica(replica);
    }
    let committed = sim.committed_ops();
    for replica in 0..3 {
        sim.restart_replica(replica).expect("boots from its disk");
        assert_eq!(sim.replica(replica).status(), Status::Recovering);
    }
    // Nobody can answer a probe: each falls back to a view change with its recovered log,
    // which holds everything it acknowledged. Every checker runs meanwhile, so a committed op
    // lost or changed by the restart is a violation.
    until_committed(&mut sim, committed + 20, 20_000);
    for replica in 0..3 {
        until_caught_up(&mut sim, replica, 20_000);
    }
    sim.finish().expect("no violation, and every request completes");
}
