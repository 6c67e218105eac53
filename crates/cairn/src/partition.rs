//! A partition's mutable state as every module sees it: serving (its replicated log, a
//! partition group), refused at boot, deleted, or closed. One mutex guards it; the writer,
//! the handler, retention and the clean stop take it for each change.
//!
//! `PartitionData`'s methods are what the request handler asks of a serving partition
//! (polls, stored offsets, stats, flush, purge, segment deletion): each change is one op of
//! the partition's group ([`crate::partition_group`]), durable and applied before the method
//! returns, and each read sees exactly the committed state (the lock is held, so the
//! journal's end and the state machine agree: the commit point is the next offset).
//!
//! This module sits below the catalog, the writer and retention, and imports none of them.

use crate::handler::{Clock, SystemClock};
use crate::node::{GroupError, Peers};
use crate::partition_group::{
    self, JournalOptions, LogParams, PartitionError, PartitionGroup, PartitionStats,
};
use cairn_machine::partition::Owner;
use cairn_storage::StorageError;
use cairn_storage::check::{Damage, PartitionReport};
use cairn_storage::io::Disk;
use cairn_storage::journal::{JournalSegment, SealedSegment};
use cairn_storage::read::{ReadOutcome, ReadPart};
use cairn_wire::codes;
use cairn_wire::types::PollingStrategy;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Status answered for every request to a partition that failed to open (damage or IO
/// error at boot). 3003 CannotOpenPartitionLogFile: the 0.11 SDK does not retry it.
pub const PARTITION_REFUSED_STATUS: u32 = codes::CANNOT_OPEN_PARTITION_LOG_FILE;

/// Answered to every send of a group whose op stopped the partition (a failed barrier, a
/// write that could not be undone): 10009 `CannotSyncFile`. The send was NOT acknowledged;
/// its bytes may or may not be present after a restart. The 0.11 SDK does not retry it.
pub const BARRIER_FAILED_STATUS: u32 = codes::CANNOT_SYNC_FILE;

/// Answered to requests that change a partition whose log stopped after a failed write,
/// until the server restarts: 3003 `CannotOpenPartitionLogFile`, the same "partition
/// unavailable" status as a partition refused at boot. Not retried by the 0.11 SDK.
pub const PARTITION_STOPPED_STATUS: u32 = PARTITION_REFUSED_STATUS;

/// Answered to a send whose write failed and was undone (disk full, a transient IO error):
/// 4006 `CannotSaveMessagesToSegment`. Nothing of the send was stored; the partition keeps
/// serving, so the same send may be tried again later.
pub const WRITE_FAILED_STATUS: u32 = codes::CANNOT_SAVE_MESSAGES_TO_SEGMENT;

pub enum PartitionState {
    Serving(Box<PartitionData>),
    /// Open failed (damage or IO): every request to it gets the refusal status; files are
    /// left as they were.
    Refused {
        reason: String,
    },
    /// Deleted or its topic/stream deleted: late holders of the `Arc` must not write.
    Deleted,
    /// Closed at a clean stop; nothing may use it any more.
    Closed,
}

/// A serving partition: its group, and where it lives (for log lines).
pub struct PartitionData {
    group: PartitionGroup,
    dir: PathBuf,
    /// Damage a read met (a sealed segment a start took from its summary is verified only
    /// when read): the holder of the lock refuses the partition ([`refuse_for_damage`]).
    found_damage: Option<StorageError>,
    /// With peers: whether this node is the metadata group's primary (the leader clients
    /// are sent to), and since when this replica, a backup, has seen another node lead the
    /// partition while this node leads the metadata.
    follows_leader: Option<(Arc<AtomicBool>, Option<Instant>)>,
}

/// How long a partition's primary may sit on another node than the leader's before the
/// leader's replica takes it over: clients send to the leader (the SDK follows command 12),
/// and a send elsewhere is not taken. Past a failover's settling, well within the SDK's 2 s
/// of retrying a send that was not taken.
const FOLLOW_LEADER_AFTER: Duration = Duration::from_millis(500);

/// Which partition a directory holds: the ids its group id derives from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionIds {
    pub stream_id: u32,
    pub topic_id: u32,
    pub partition_id: u32,
}

impl PartitionIds {
    fn group_id(self) -> u64 {
        partition_group::group_id(self.stream_id, self.topic_id, self.partition_id)
    }
}

/// This node's replica of a partition in a cluster of several nodes.
#[derive(Clone)]
pub struct PartitionPeers {
    pub peers: Peers,
    /// The group id: the partition's ids and its creation (`partition_group::cluster_group_id`),
    /// so a partition deleted and created again with the same ids is another group.
    pub group: u64,
    /// Set while this node is the metadata group's primary: the partition's primary follows.
    pub leads_metadata: Arc<AtomicBool>,
    /// This node rejoins after losing its data: a replica without files is a wiped one, never
    /// a new one (`ClusterSeat::rejoining`).
    pub missing_is_wiped: bool,
}

/// Why a partition did not open at boot (it is refused; its files are left as they are).
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The directory holds the record log of a Cairn from before partitions were
    /// replicated logs.
    #[error(
        "{}: this partition was written by an earlier Cairn as a plain segment log (segment files, `state` and \
         `offsets/` in the partition directory); this version keeps every partition as a replicated log and cannot \
         read that layout yet. Its files are left untouched: serve this data directory with the earlier version, \
         or move it aside to start empty",
        dir.display()
    )]
    EarlierLayout { dir: PathBuf },
    #[error(
        "{}: the metadata names this partition but its directory holds no replicated log (no `superblock`): its files \
         are missing; nothing was created in their place, so no offset is handed out twice (if a `cairn repair` \
         was interrupted, run it again to finish)",
        dir.display()
    )]
    NotFormatted { dir: PathBuf },
    #[error(transparent)]
    Group(#[from] GroupError),
    /// Applying the committed log faulted (an append that did not continue it: a bug).
    #[error("{}: applying the partition's committed log failed ({fault}); its files are left as they are", dir.display())]
    Faulted { dir: PathBuf, fault: String },
    #[error("{}: finishing a purge recorded in the metadata failed: {source}", dir.display())]
    Purge { dir: PathBuf, source: PartitionError },
    #[error(
        "{}: skipping the offsets reserved before an unclean stop (relaxed mode) failed: {source}; nothing was minted",
        dir.display()
    )]
    Resume { dir: PathBuf, source: PartitionError },
    #[error(
        "{}: the log ends at offset {next_offset}, below the purge target {purge_target} recorded in the metadata (lost data)",
        dir.display()
    )]
    BehindPurgeTarget {
        dir: PathBuf,
        next_offset: u64,
        purge_target: u64,
    },
}

/// Why a client's flush did not happen.
#[derive(Debug)]
pub enum FlushError {
    /// The partition stopped taking writes earlier (a failed write).
    Stopped,
}

impl PartitionData {
    /// Open the partition in `dir`: recover its group, and finish a purge the metadata
    /// recorded up to `purge_target` that did not reach it (an op, like any purge).
    ///
    /// With peers (a cluster of several nodes) the replica comes up as whatever its files
    /// say, and an interrupted purge is not finished at open: only the group's primary may
    /// add an op, and none does it yet (`docs/cluster.md`).
    pub fn open(
        dir: &Path,
        ids: PartitionIds,
        purge_target: u64,
        options: JournalOptions,
        peers: Option<PartitionPeers>,
    ) -> Result<PartitionData, OpenError> {
        if holds_record_log(dir) {
            return Err(OpenError::EarlierLayout {
                dir: dir.to_path_buf(),
            });
        }
        // A partition the metadata names was formatted before its create was committed: a
        // directory without a formatted group lost its files, and formatting a new one would
        // hand its offsets out again.
        // (With peers, a replica mid-rejoin opens wiped: `LocalGroup::open_with_peers`.)
        let rejoins = peers.is_some() && crate::node::rejoin_pending(dir);
        if !crate::node::is_formatted(dir) && !rejoins {
            return Err(OpenError::NotFormatted {
                dir: dir.to_path_buf(),
            });
        }
        let with_peers = peers.is_some();
        let mut data = PartitionData::open_in(dir, ids, LogParams::new(ids.partition_id, options), peers)?;
        if let Some(fault) = data.group.state_machine().fault() {
            return Err(OpenError::Faulted {
                dir: dir.to_path_buf(),
                fault: fault.to_string(),
            });
        }
        // After an unclean stop in relaxed mode, offsets up to the reservation may have been
        // acknowledged and lost: none is handed out again. The skip to it is the first op of
        // the partition's first append (`PartitionGroup::append_batch`), not written here: a
        // start writes nothing before the log prefix it took unread is verified, and a clean
        // stop before then keeps the reservation (`JournalLog::sync_for_stop`).
        if !with_peers {
            data.finish_purge(purge_target)?;
        }
        Ok(data)
    }

    /// Format the group of a new, empty partition in `dir` (with peers: this node's new
    /// replica of it).
    pub fn create(
        dir: &Path,
        ids: PartitionIds,
        options: JournalOptions,
        peers: Option<PartitionPeers>,
    ) -> Result<PartitionData, GroupError> {
        PartitionData::open_in(dir, ids, LogParams::new(ids.partition_id, options), peers)
    }

    /// Open (or format) the group of one replica in `dir` with its journal made from `params`.
    #[cfg(test)]
    pub fn open_with(dir: &Path, ids: PartitionIds, params: LogParams) -> Result<PartitionData, GroupError> {
        PartitionData::open_in(dir, ids, params, None)
    }

    fn open_in(
        dir: &Path,
        ids: PartitionIds,
        params: LogParams,
        peers: Option<PartitionPeers>,
    ) -> Result<PartitionData, GroupError> {
        let (mut group, follows_leader) = match peers {
            None => (partition_group::open(dir, ids.group_id(), params)?, None),
            Some(PartitionPeers {
                peers,
                group,
                leads_metadata,
                ..
            }) => (
                partition_group::open_with_peers(dir, group, params, peers)?,
                Some((leads_metadata, None)),
            ),
        };
        group.remember_recent_batches(SystemClock.now_us());
        Ok(PartitionData {
            group,
            dir: dir.to_path_buf(),
            found_damage: None,
            follows_leader,
        })
    }

    /// The partition replica's role and positions.
    pub fn replica_status(&self) -> crate::node::ReplicaStatus {
        self.group.replica_status()
    }

    /// Whether the replica is in a view and has applied what its view committed
    /// (`LocalGroup::is_current`).
    pub fn is_current(&self) -> bool {
        self.group.is_current()
    }

    /// Whether the replica takes requests and applied every op its log holds (a new primary
    /// first commits what earlier views prepared): only then do the batches it applied
    /// include every batch its group may have committed.
    pub fn is_caught_up(&self) -> bool {
        self.group.is_caught_up()
    }

    /// The base offset a committed batch with content key `key`
    /// (`cairn_wire::batch::content_key`) got, if it is among the newest this replica applied
    /// and committed within the resend window before `now_us`.
    pub fn committed_batch(&self, key: u128, now_us: u64) -> Option<u64> {
        self.group
            .state_machine()
            .recent_batches()
            .base_offset(key, now_us)
    }

    /// Whether this is a replica of a group with peers (a node of a cluster).
    pub fn has_peers(&self) -> bool {
        self.follows_leader.is_some()
    }

    /// The replica index of the partition group's primary as this replica sees it (`None`
    /// during a view change).
    pub fn primary(&self) -> Option<u8> {
        self.group.primary()
    }

    /// Serve the messages of the group's peers and tick it (a worker of the node, when no
    /// request holds the partition).
    pub fn serve_peers(&mut self) {
        if self.stopped_reason().is_some() {
            return;
        }
        if let Err(error) = self.group.serve_inbox() {
            tracing::error!(partition_dir = %self.dir.display(), %error, "the partition's replica stopped while serving its peers' messages; it takes no writes until a restart");
            return;
        }
        self.follow_leader();
    }

    /// Start a view change to lead the partition from this replica (tests move a
    /// partition's primary away from the leader's node with it).
    #[cfg(test)]
    pub fn lead(&mut self) -> bool {
        self.group.lead().unwrap_or(false)
    }

    /// Whether this replica is its group's primary, in status normal.
    #[cfg(test)]
    pub fn takes_requests(&self) -> bool {
        self.group.takes_requests()
    }

    /// On the leader's node: a replica that has been a backup of another node's primary for
    /// [`FOLLOW_LEADER_AFTER`] starts a view change to a view it leads, so the partition's
    /// primary is where clients send (a view change is safe at any time).
    fn follow_leader(&mut self) {
        let Some((leads_metadata, misaligned_since)) = &mut self.follows_leader else {
            return;
        };
        // Only a replica that holds what its view committed may lead: one behind would start
        // a view change it cannot finish.
        let misaligned = leads_metadata.load(Ordering::Acquire)
            && self.group.primary().is_some()
            && !self.group.takes_requests()
            && self.group.is_current();
        if !misaligned {
            *misaligned_since = None;
            return;
        }
        let since = *misaligned_since.get_or_insert_with(Instant::now);
        if since.elapsed() < FOLLOW_LEADER_AFTER {
            return;
        }
        *misaligned_since = None;
        match self.group.lead() {
            Ok(true) => {
                tracing::info!(partition_dir = %self.dir.display(), "the partition's primary is on another node than the leader's: this node's replica starts a view change to lead it")
            }
            Ok(false) => {}
            Err(error) => {
                tracing::error!(partition_dir = %self.dir.display(), %error, "the partition's replica stopped while starting a view change; it takes no writes until a restart")
            }
        }
    }

    /// If the metadata's purge marker says offsets below `purge_target` are purged but the
    /// partition still starts below it (a purge interrupted before it reached this
    /// partition), purge now, before the partition serves.
    fn finish_purge(&mut self, purge_target: u64) -> Result<(), OpenError> {
        let start_offset = self.group.start_offset();
        if start_offset >= purge_target {
            return Ok(());
        }
        // In `relaxed` mode the target may lie among offsets acknowledged and then lost with a
        // power loss: the skip past the reservation comes first, as the first append's would
        // (a write, so the log prefix the start took unread is verified first).
        if self.group.next_offset() < purge_target && self.group.log().resume_offset().is_some() {
            self.group.resume_minting().map_err(|source| OpenError::Resume {
                dir: self.dir.clone(),
                source,
            })?;
        }
        let next_offset = self.group.next_offset();
        if next_offset < purge_target {
            // The target was this partition's next offset, and offsets never go back: a log
            // ending below it lost data.
            return Err(OpenError::BehindPurgeTarget {
                dir: self.dir.clone(),
                next_offset,
                purge_target,
            });
        }
        tracing::info!(
            partition_dir = %self.dir.display(),
            retained_start_offset = start_offset,
            purge_target,
            next_offset,
            "finishing an interrupted purge recorded in the metadata: purging the partition and its consumer offsets"
        );
        self.group
            .purge(purge_target)
            .map_err(|source| OpenError::Purge {
                dir: self.dir.clone(),
                source,
            })?;
        self.remove_released_segments();
        debug_assert!(self.group.start_offset() >= purge_target);
        Ok(())
    }

    /// Why the partition takes no more writes, if it stopped.
    pub fn stopped_reason(&self) -> Option<&str> {
        self.group
            .stopped_reason()
            .or_else(|| self.group.state_machine().fault())
            .or_else(|| self.group.log().stopped_reason())
    }

    /// The offset of the newest message polls may see, 0 when none: `current_offset` in
    /// replies.
    pub fn current_offset(&self) -> u64 {
        self.group.last_offset().unwrap_or(0)
    }

    /// Segment count, message count and bytes, for stats and listings.
    pub fn stats(&self) -> PartitionStats {
        self.group.stats()
    }

    /// Append the batches of a group of sends as one op stamped `timestamp_us`: the base
    /// offset of each batch, in order. Durable and applied when it returns `Ok`.
    #[cfg(test)]
    pub fn append(&mut self, timestamp_us: u64, batches: &[&[u8]]) -> Result<Vec<u64>, PartitionError> {
        self.group.append(timestamp_us, batches)
    }

    /// Several groups of sends, one op each, sharing one barrier (see
    /// `PartitionGroup::append_batch`).
    pub fn append_batch(
        &mut self,
        appends: Vec<crate::partition_group::Append>,
    ) -> Vec<Result<Vec<u64>, PartitionError>> {
        self.group.append_batch(appends)
    }

    /// fdatasync calls the partition's log has issued so far (for the commit counters).
    pub fn fdatasyncs(&self) -> u64 {
        self.group.log().fdatasyncs()
    }

    /// Poll for `owner`: resolve `strategy` against the committed messages, append the
    /// batches of at most `count` messages (`read_parts`), and with `auto_commit` store the
    /// last offset returned as `owner`'s (an op).
    pub fn poll(
        &mut self,
        owner: &Owner,
        strategy: PollingStrategy,
        count: u32,
        auto_commit: bool,
        out: &mut Vec<u8>,
        parts: &mut Vec<ReadPart>,
    ) -> Result<ReadOutcome, u32> {
        let next_offset = self.group.next_offset();
        let Some(first_offset) = self.group.first_offset() else {
            return Ok(ReadOutcome::NOTHING);
        };
        let start = match strategy {
            PollingStrategy::Offset(value) => Some(value),
            PollingStrategy::First => Some(first_offset),
            // The last `count` offsets up to the newest message.
            PollingStrategy::Last => Some(next_offset.saturating_sub(u64::from(count)).max(first_offset)),
            PollingStrategy::Next => Some(
                self.group
                    .stored_offset(owner)
                    .map(|stored| stored.saturating_add(1))
                    .unwrap_or(first_offset),
            ),
            PollingStrategy::Timestamp(t) => self.group.offset_at_timestamp(t),
        };
        let Some(start) = start.filter(|&start| count > 0 && start < next_offset) else {
            return Ok(ReadOutcome::NOTHING);
        };
        let first_returned = start.max(first_offset);
        let read = match self.group.read_parts(first_returned, count, out, parts) {
            Ok(read) => read,
            Err(error @ StorageError::Damaged { .. }) => {
                self.found_damage = Some(error);
                return Err(PARTITION_REFUSED_STATUS);
            }
            Err(error) => return Err(storage_status(&self.dir, error)),
        };
        if auto_commit && read.messages_count > 0 {
            let Some(last) = read.last_offset else {
                tracing::error!(partition_dir = %self.dir.display(), "poll read batches without a last offset");
                return Err(codes::ERROR);
            };
            debug_assert!(last >= first_returned && last < next_offset);
            if self.stopped_reason().is_some() {
                // A stopped partition still serves what it acknowledged, so consumers can
                // drain it; their offsets cannot move until a restart.
                tracing::debug!(partition_dir = %self.dir.display(), "auto-commit skipped: the partition stopped taking writes");
            } else {
                self.store_offset(owner, last)?;
            }
        }
        Ok(read)
    }

    /// `owner`'s stored offset, if any.
    pub fn stored_offset(&self, owner: &Owner) -> Option<u64> {
        self.group.stored_offset(owner)
    }

    /// Store `owner`'s offset: at most the newest message's (`INVALID_OFFSET` otherwise; 0
    /// on an empty partition). A store the machine would refuse, or that changes nothing,
    /// takes no op: requests that change nothing must not grow the log.
    pub fn store_offset(&mut self, owner: &Owner, offset: u64) -> Result<(), u32> {
        if !self.group.state_machine().state().offset_store(owner, offset)? {
            return Ok(());
        }
        self.check_not_stopped()?;
        let result = self.group.store_offset(owner, offset);
        result.map_err(|error| self.op_status(error, "storing a consumer offset"))
    }

    /// Delete `owner`'s stored offset (`CONSUMER_OFFSET_NOT_FOUND` when none).
    pub fn delete_offset(&mut self, owner: &Owner) -> Result<(), u32> {
        if self.group.stored_offset(owner).is_none() {
            return Err(codes::CONSUMER_OFFSET_NOT_FOUND);
        }
        self.check_not_stopped()?;
        let result = self.group.delete_offset(owner);
        result.map_err(|error| self.op_status(error, "deleting a consumer offset"))
    }

    /// Make every acknowledged op durable: a client's flush, and the `relaxed` mode's timer
    /// (in `durable` mode each op is durable before its reply, so this syncs nothing).
    /// Refused once the partition stopped; a failed barrier stops it.
    pub fn flush(&mut self) -> Result<(), FlushError> {
        if self.stopped_reason().is_some() {
            return Err(FlushError::Stopped);
        }
        self.group.flush().map_err(|error| {
            tracing::error!(
                partition_dir = %self.dir.display(),
                %error,
                "a flush of the partition's journal failed: the partition stops taking writes until a restart; acknowledged messages it did not cover may be lost with a power loss (relaxed mode), their offsets are never handed out again"
            );
            FlushError::Stopped
        })
    }

    /// The segments retention may still trim: sealed (not the one written) and ending above
    /// the start offset, oldest first.
    pub fn sealed_retained_segments(&self) -> Vec<JournalSegment> {
        self.group.sealed_retained_segments()
    }

    /// The DeleteSegments request: [`PartitionData::delete_segments_through`] the end of the
    /// oldest `count` sealed retained segments (all of them if fewer).
    pub fn delete_oldest_segments(&mut self, count: usize) -> Result<Vec<JournalSegment>, u32> {
        let sealed = self.group.sealed_retained_segments();
        match sealed.get(count.min(sealed.len()).wrapping_sub(1)) {
            Some(last) => self.delete_segments_through(last.end_offset),
            None => self.delete_segments_through(self.group.start_offset()),
        }
    }

    /// Retention: trim every message below `end_offset` (one op, none when the start is
    /// there already), then remove every segment the partition no longer needs.
    /// `end_offset` must be the end of a segment [`PartitionData::sealed_retained_segments`]
    /// lists now: a retention pass decides on a list taken under an earlier lock hold, so it
    /// is checked again here, and a stale one trims nothing (never the newest messages, never
    /// more than was decided). Returns the segments removed.
    pub fn delete_segments_through(&mut self, end_offset: u64) -> Result<Vec<JournalSegment>, u32> {
        self.check_not_stopped()?;
        if end_offset > self.group.start_offset() {
            let sealed = self.group.sealed_retained_segments();
            if !sealed.iter().any(|segment| segment.end_offset == end_offset) {
                return Ok(Vec::new());
            }
            let trimmed = self.group.trim(end_offset);
            trimmed.map_err(|error| self.op_status(error, "trimming messages for retention"))?;
        }
        let removed = self.group.remove_released_segments();
        removed.map_err(|error| self.op_status(error, "removing released segments"))
    }

    /// Remove the segments a purge or trim released, logging (not returning) a failure: the
    /// messages are gone for polls either way, and the next removal or start retries.
    fn remove_released_segments(&mut self) {
        if let Err(error) = self.group.remove_released_segments() {
            if self.stopped_reason().is_some() {
                tracing::error!(
                    partition_dir = %self.dir.display(),
                    %error,
                    "removing segments released by a purge or trim failed and stopped the partition: it takes no writes until restart; polls no longer see the released messages, and the next start finishes the removal"
                );
            } else {
                tracing::warn!(
                    partition_dir = %self.dir.display(),
                    %error,
                    "cannot remove segments released by a purge or trim yet; polls no longer see their messages, and a later removal or the next start retries"
                );
            }
        }
    }

    /// The sealed segments of the partition's log, and the disk they are on: what a scrub
    /// verifies, without the partition's lock.
    pub fn sealed_segments(&self) -> (Arc<dyn Disk>, Vec<SealedSegment>) {
        (self.group.log().disk(), self.group.log().sealed_segments())
    }

    /// Damage the last read met, if any (taken: the caller refuses the partition).
    pub fn take_found_damage(&mut self) -> Option<StorageError> {
        self.found_damage.take()
    }

    /// After a commit's replies went out: summarise the log's progress if it has grown
    /// enough (`PartitionGroup::summarise_log_progress`).
    pub fn summarise_log_progress(&mut self) {
        self.group.summarise_log_progress();
    }

    /// Bytes of the log prefix its start took from a summary unread, while unverified.
    pub fn unverified_prefix_bytes(&self) -> Option<u64> {
        self.group
            .log()
            .unverified_prefix()
            .map(|prefix| prefix.len_bytes)
    }

    /// Whether `segment` is still one of the log's sealed segments, as it was.
    pub fn holds_sealed(&self, segment: &SealedSegment) -> bool {
        self.group.log().sealed_segments().contains(segment)
    }

    /// The first offset still retained.
    pub fn start_offset(&self) -> u64 {
        self.group.start_offset()
    }

    /// The clean stop: a checkpoint at the last op, so the next start has no op to apply.
    /// A partition whose log prefix is still unverified (it served no message and wrote
    /// nothing since its start) is left as its start left it: nothing is written to a log
    /// before it is verified, and the next start opens it as this one did.
    pub fn close(mut self) -> Result<(), GroupError> {
        if self.stopped_reason().is_some() {
            return Ok(());
        }
        if self.unverified_prefix_bytes().is_some() {
            tracing::info!(
                partition_dir = %self.dir.display(),
                "partition left as its start left it: its log prefix taken from a summary was never verified (it \
                 served no message and took no write), so nothing is written to it"
            );
            return Ok(());
        }
        self.group.close()
    }

    /// The offset a purge of the partition now would purge up to: its next offset.
    pub fn purge_target(&self) -> u64 {
        self.group.next_offset()
    }

    /// Purge every message below `target` (the [`PartitionData::purge_target`] the metadata
    /// recorded) and every stored offset, as one op; then remove the released segments.
    pub fn purge(&mut self, target: u64) -> Result<(), u32> {
        self.check_not_stopped()?;
        // One op, none when nothing would change (the group's rule).
        let result = self.group.purge(target);
        result.map_err(|error| self.op_status(error, "purging"))?;
        self.remove_released_segments();
        debug_assert!(self.group.start_offset() >= target.min(self.group.next_offset()));
        Ok(())
    }

    /// `PARTITION_STOPPED_STATUS` once the partition stopped: checked before every op, so an
    /// op that fails is the one that stopped it (and says so).
    fn check_not_stopped(&self) -> Result<(), u32> {
        match self.stopped_reason() {
            Some(_) => Err(PARTITION_STOPPED_STATUS),
            None => Ok(()),
        }
    }

    /// The status a client gets for an op that did not happen (logged here, except a plain
    /// refusal by the state machine, which is the client's to hear).
    fn op_status(&self, error: PartitionError, what: &str) -> u32 {
        match error {
            PartitionError::Status(status) => status,
            PartitionError::Group(GroupError::NotTaken { .. }) => {
                tracing::debug!(partition_dir = %self.dir.display(), %error, "{what} was not taken (the error says why: this replica is not the partition's primary now, or its node hears no quorum); nothing of it was stored");
                codes::TRANSIENT_NOT_ACCEPTED
            }
            PartitionError::Group(GroupError::WriteUndone { .. }) => {
                tracing::warn!(partition_dir = %self.dir.display(), %error, "{what} was not stored (the error says why): nothing of it was stored; the partition keeps serving");
                WRITE_FAILED_STATUS
            }
            PartitionError::Group(GroupError::OutcomeUnknown { .. }) => {
                tracing::warn!(partition_dir = %self.dir.display(), %error, "{what} got no reply from a quorum in time: it may or may not be applied; answered with an error, the partition keeps serving");
                codes::ERROR
            }
            error => {
                tracing::error!(
                    partition_dir = %self.dir.display(),
                    %error,
                    "{what} failed: the partition stopped taking writes until restart; it was not acknowledged"
                );
                codes::ERROR
            }
        }
    }
}

/// The offline checker's verdict on the partition directory `dir` of `(stream, topic,
/// partition)`: what boot would make of it, writing nothing. A directory boot refuses before
/// it reads a group (the earlier record-log layout, or no group at all) is damage.
pub fn check(dir: &Path, ids @ (_, _, partition_id): (u32, u32, u32)) -> PartitionReport {
    let refusal = if holds_record_log(dir) {
        OpenError::EarlierLayout {
            dir: dir.to_path_buf(),
        }
    } else if !crate::node::is_formatted(dir) {
        OpenError::NotFormatted {
            dir: dir.to_path_buf(),
        }
    } else {
        return partition_group::check(dir, ids);
    };
    let mut report = PartitionReport::empty(dir, partition_id);
    report.damage.push(Damage {
        path: dir.to_path_buf(),
        position: 0,
        reason: format!("boot refuses it: {refusal}"),
    });
    report
}

/// Act on `damage` found in the files of the partition whose state is `state` by `finder`
/// (a poll, the scrub, the check of a prefix a start took unread). With peers, its replica's
/// files are set aside whole and it is rebuilt from them (`LocalGroup::rebuild_from_peers`;
/// refused if that fails). A node of one refuses it as a start would: every request then
/// gets the refusal status, its segment files are left as they are, and the damaged
/// segment's summary (if any) is removed, so every later start reads that segment and
/// refuses the partition too.
pub fn refuse_for_damage(state: &mut PartitionState, dir: &Path, damage: &StorageError, finder: &str) {
    // With peers the replica is rebuilt from them instead, its files set aside whole.
    if let PartitionState::Serving(data) = state
        && data.has_peers()
    {
        let error = match data
            .group
            .rebuild_from_peers(&format!("{finder} found: {damage}"))
        {
            Ok(_) => return,
            Err(error) => error,
        };
        tracing::error!(
            partition_dir = %dir.display(),
            %error,
            "partition refused: {finder} found damage in its log and the replica could not be rebuilt from its peers (the error says whether its files were set aside); it will not serve reads or writes until a restart"
        );
        *state = PartitionState::Refused {
            reason: damage.to_string(),
        };
        return;
    }
    let later_starts = match damage {
        StorageError::Damaged { path, .. } => {
            match cairn_storage::journal::forget_summary(&cairn_storage::io::RealDisk, path) {
                Ok(()) => "every start reads the segment and refuses the partition too",
                Err(_) => {
                    "its summary could not be removed, so a restart may serve the partition until the damage is found again"
                }
            }
        }
        _ => "a restart reads the partition again",
    };
    tracing::error!(
        partition_dir = %dir.display(),
        error = %damage,
        "partition refused: {finder} found damage in its log; it will not serve reads or writes; its segment \
         files are left untouched ({later_starts})"
    );
    *state = PartitionState::Refused {
        reason: damage.to_string(),
    };
}

/// Whether `dir` holds the record log of a Cairn from before partitions were groups: a
/// `state` file, a `start.meta` marker or an `offsets/` directory beside no group superblock.
pub fn holds_record_log(dir: &Path) -> bool {
    !crate::node::is_formatted(dir)
        && ["state", "start.meta", "offsets"]
            .iter()
            .any(|name| dir.join(name).exists())
}

/// A storage failure as a client sees it (logged here with its cause).
pub fn storage_status(dir: &Path, error: StorageError) -> u32 {
    tracing::error!(partition_dir = %dir.display(), %error, "reading the partition failed");
    match error {
        StorageError::Damaged { .. } => PARTITION_REFUSED_STATUS,
        _ => codes::ERROR,
    }
}

/// The data of a serving partition, or the status for one that is not.
///
/// A partition whose start took a prefix of its log from a summary without reading it (the
/// segment being written, up to its last summary: `JournalLog::unverified_prefix`) has that prefix
/// verified here first, once, under the partition's lock: damage there refuses the partition
/// as a start that read it would have; so does an error reading it (an IO error), as a
/// start that met it would have (the next start tries again). So no request is answered
/// from, and no op is added to, a log with damage below its frontier. A background pass
/// started at boot (`scrub::verify_prefixes`) usually gets there before the first request.
pub fn serving(state: &mut PartitionState) -> Result<&mut PartitionData, u32> {
    if let PartitionState::Serving(data) = state
        && let Err(error) = data.group.verify_log_prefix()
    {
        let dir = data.dir.clone();
        match error {
            StorageError::Damaged { .. } => refuse_for_damage(
                state,
                &dir,
                &error,
                "the check of the log prefix its start took from a summary unread",
            ),
            error => {
                tracing::error!(
                    partition_dir = %dir.display(),
                    %error,
                    "partition refused: reading the log prefix its start took from a summary unread failed; it \
                     will not serve reads or writes until a restart, which reads it again; its files are left untouched"
                );
                *state = PartitionState::Refused {
                    reason: error.to_string(),
                };
            }
        }
        // With peers a damaged replica is rebuilt from them and serves on (as a wiped one).
        if !matches!(state, PartitionState::Serving(_)) {
            return Err(PARTITION_REFUSED_STATUS);
        }
    }
    match state {
        PartitionState::Serving(data) => Ok(data),
        PartitionState::Refused { reason } => {
            tracing::debug!(%reason, "request to a refused partition");
            Err(PARTITION_REFUSED_STATUS)
        }
        PartitionState::Deleted => Err(codes::PARTITION_NOT_FOUND),
        // Only after the shell stopped taking requests; a straggler gets a plain error.
        PartitionState::Closed => Err(codes::ERROR),
    }
}

/// The data of a serving partition whose log holds nothing unverified, for the timers
/// (retention, the scrub's listing, the `relaxed` flush): they leave a partition whose
/// prefix is still unverified to the boot pass and its first request ([`serving`]) rather
/// than read it under the lock themselves. Such a partition has written nothing since its
/// start, so it has nothing to flush.
pub fn serving_verified(state: &mut PartitionState) -> Option<&mut PartitionData> {
    match state {
        PartitionState::Serving(data) if data.unverified_prefix_bytes().is_none() => Some(data),
        _ => None,
    }
}

/// The `relaxed` mode's flush of one partition (on `storage.flush_interval_ms`): the bulk of
/// the barrier, the active segment's dirty pages, is synced on a handle of its own without
/// the partition's lock, so sends are not held up by it; then, under the lock, the journal's
/// own barrier covers what arrived meanwhile and publishes the frontier
/// ([`PartitionData::flush`]). A partition with nothing new costs nothing. A writeback error
/// the first sync meets is reported to the journal's handle too (Linux reports it to every
/// descriptor open before it, since 4.13), so the second one fails and the partition stops.
pub fn flush_relaxed(state: &Mutex<PartitionState>) {
    let (disk, path) = match serving_verified(&mut lock(state)) {
        Some(data) if data.group.log().durable_op() < data.group.log().last_op() => {
            (data.group.log().disk(), data.group.log().active_segment_path())
        }
        _ => return,
    };
    if let Ok(mut file) = disk.open_write(&path) {
        let _ = file.sync_data();
    }
    if let Some(data) = serving_verified(&mut lock(state)) {
        // A failure is logged by `flush` and stops the partition.
        let _ = data.flush();
    }
}

/// Lock a std mutex; a poisoned lock means a writer panicked mid-update, which is a bug:
/// carrying on could publish half-applied state, so the poison propagates as a panic.
pub fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => panic!("partition lock poisoned by an earlier panic: {poisoned}"),
    }
}

pub fn remove_dir(dir: &Path) -> Result<(), StorageError> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(StorageError::Io {
            path: dir.to_path_buf(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::client_batch;

    const IDS: PartitionIds = PartitionIds {
        stream_id: 1,
        topic_id: 2,
        partition_id: 0,
    };

    const OPTIONS: JournalOptions = JournalOptions {
        segment_size_bytes: 1 << 20,
        relaxed: false,
    };

    /// Requests that would change nothing are answered without an op, so they cannot grow
    /// the log; each real change is exactly one op.
    #[test]
    fn requests_that_change_nothing_add_no_op() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut data = PartitionData::create(dir.path(), IDS, OPTIONS, None).expect("create");
        let batch = client_batch(3, 10, 1);
        assert_eq!(data.append(5, &[&batch]).expect("append"), vec![0]);
        let owner = Owner::ConsumerName("reader".into());
        let ops = |data: &PartitionData| data.group.commit_op();
        let before = ops(&data);

        assert_eq!(
            data.store_offset(&owner, 3),
            Err(codes::INVALID_OFFSET),
            "past the newest message"
        );
        assert_eq!(data.delete_offset(&owner), Err(codes::CONSUMER_OFFSET_NOT_FOUND));
        assert_eq!(ops(&data), before, "refusals take no op");

        data.store_offset(&owner, 1).expect("store");
        data.store_offset(&owner, 1).expect("store again");
        assert_eq!(ops(&data), before + 1, "a store of the stored offset takes no op");

        data.purge(3).expect("purge");
        assert_eq!((data.start_offset(), data.stored_offset(&owner)), (3, None));
        data.purge(3).expect("purge again");
        assert_eq!(
            ops(&data),
            before + 2,
            "a purge with nothing to purge takes no op"
        );

        // Offsets stored after the messages went are still purged (one op).
        data.store_offset(&owner, 2).expect("store below the start");
        data.purge(3).expect("purge the offset");
        assert_eq!(data.stored_offset(&owner), None);
        assert_eq!(ops(&data), before + 4);
    }

    /// A partition the metadata names whose directory holds no group is refused, never
    /// formatted afresh; one of the earlier record-log layout is refused as that.
    #[test]
    fn open_refuses_a_directory_without_a_group() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("missing");
        assert!(matches!(
            PartitionData::open(&missing, IDS, 0, OPTIONS, None),
            Err(OpenError::NotFormatted { .. })
        ));
        assert!(!missing.exists(), "nothing was created");
        let earlier = dir.path().join("earlier");
        std::fs::create_dir_all(earlier.join("offsets")).expect("mkdir");
        assert!(matches!(
            PartitionData::open(&earlier, IDS, 0, OPTIONS, None),
            Err(OpenError::EarlierLayout { .. })
        ));
    }
}
