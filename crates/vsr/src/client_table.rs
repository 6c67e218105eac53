//! The client table: at-most-once execution of client requests across retries, primary
//! changes and restarts (`docs/replication.md`, "Client table").
//!
//! A client first registers, once per client id. The register is an ordinary replicated
//! op, and the op number it commits at becomes the client's **session**. Every later request carries the session
//! and a request number that grows by one per request. The primary asks [`ClientTable::admit`]
//! before preparing a request:
//! - the next request number: execute it;
//! - the latest committed request again (a retry whose reply was lost): answer with the stored
//!   reply, never prepare it again;
//! - anything older, or a session that is not the client's current one: drop it;
//! - a session the table no longer holds (evicted to make room): answer "session evicted".
//!   The client must register again. Its old requests are never re-executed.
//!
//! The last rule is why sessions exist. Without them, evicting a client would erase its dedup
//! fence, and its next retry would run again (Iggy trap 18). The table changes only when an
//! op commits, the same way on every replica, so it is replicated state: it belongs to the
//! checkpoint and survives view changes and restarts identically.

use std::collections::BTreeMap;

/// What the primary does with a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission<R> {
    /// Prepare it.
    Execute,
    /// A retry of the latest committed request: answer with this reply, prepare nothing.
    ReplyCached(R),
    /// Older than the latest committed request, or a request number that skips ahead: drop
    /// it. A well-behaved client never sends one; a duplicate from the network may.
    Drop,
    /// The session is not in the table: the client must register again.
    SessionEvicted,
    /// The client never registered, or registered under another session; it must register.
    NotRegistered,
}

/// One client's dedup fence.
///
/// Invariants: `session <= committed_op`; `request` grows by exactly one per committed
/// request of the session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry<R> {
    /// The op the client's register committed at.
    pub session: u64,
    /// The latest committed request number of the session (0 right after the register).
    pub request: u64,
    /// The reply to that request (to the register, right after it).
    pub reply: R,
    /// The op the latest request committed at; eviction removes the smallest.
    pub committed_op: u64,
}

/// The table. `R` is the stored reply (a message in the replica; anything in tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientTable<R> {
    /// By client id. A BTreeMap: iteration order is part of the replicated state's checksum,
    /// so it must not depend on hashing.
    entries: BTreeMap<u128, Entry<R>>,
    /// Sessions this table evicted, by client: so an evicted client gets a clear answer
    /// rather than "not registered". Bounded like `entries`; the oldest go first.
    evicted: BTreeMap<u128, u64>,
    capacity_clients: usize,
}

impl<R: Clone> ClientTable<R> {
    pub fn new(capacity_clients: usize) -> ClientTable<R> {
        assert!(capacity_clients > 0, "a client table needs room for one client");
        ClientTable {
            entries: BTreeMap::new(),
            evicted: BTreeMap::new(),
            capacity_clients,
        }
    }

    /// What to do with request `request` of `client` under `session` (primary, before
    /// preparing). Registration is not a request: see [`ClientTable::commit_register`].
    pub fn admit(&self, client: u128, session: u64, request: u64) -> Admission<R> {
        let Some(entry) = self.entries.get(&client) else {
            if self.evicted.get(&client) == Some(&session) {
                return Admission::SessionEvicted;
            }
            return Admission::NotRegistered;
        };
        if entry.session != session {
            if session < entry.session {
                // A request from an older session of this client: its fence moved on.
                return Admission::Drop;
            }
            return Admission::NotRegistered;
        }
        if request == entry.request + 1 {
            Admission::Execute
        } else if request == entry.request && request > 0 {
            Admission::ReplyCached(entry.reply.clone())
        } else {
            Admission::Drop
        }
    }

    /// What the primary does with a register of `client`. A client id registers once: a
    /// client that restarts, or was evicted, registers under a fresh id. So a register for a
    /// client in the table is a retry or a network duplicate. Before any request under the
    /// session it gets the original reply (the client may have lost it); after, it is
    /// dropped. Executing it would open a second session and leave the client's live one
    /// stale.
    pub fn admit_register(&self, client: u128) -> Admission<R> {
        match self.entries.get(&client) {
            Some(entry) if entry.request == 0 => Admission::ReplyCached(entry.reply.clone()),
            Some(_) => Admission::Drop,
            None => Admission::Execute,
        }
    }

    /// A register of `client` committed at op `session` (every replica, in op order).
    /// Replaces any earlier session of the client; evicts the least recently committed
    /// client if the table is full. Returns the evicted client, if any.
    pub fn commit_register(&mut self, client: u128, session: u64, reply: R) -> Option<u128> {
        let mut evicted_client = None;
        if !self.entries.contains_key(&client) && self.entries.len() == self.capacity_clients {
            let oldest = self
                .entries
                .iter()
                .min_by_key(|(id, entry)| (entry.committed_op, **id))
                .map(|(id, _)| *id);
            if let Some(oldest) = oldest {
                let entry = self.entries.remove(&oldest);
                if let Some(entry) = entry {
                    self.remember_evicted(oldest, entry.session);
                }
                evicted_client = Some(oldest);
            }
        }
        self.evicted.remove(&client);
        self.entries.insert(
            client,
            Entry {
                session,
                request: 0,
                reply,
                committed_op: session,
            },
        );
        debug_assert!(self.entries.len() <= self.capacity_clients);
        evicted_client
    }

    /// Request `request` of `client`'s session committed at op `op` with `reply` (every
    /// replica, in op order). The primary admitted it, so it is the next request number.
    pub fn commit_request(&mut self, client: u128, session: u64, request: u64, op: u64, reply: R) {
        let entry = self
            .entries
            .get_mut(&client)
            .expect("a committed request belongs to a registered client");
        assert_eq!(entry.session, session, "a committed request of another session");
        assert_eq!(entry.request + 1, request, "committed requests are consecutive");
        assert!(op > entry.committed_op, "ops commit in order");
        entry.request = request;
        entry.reply = reply;
        entry.committed_op = op;
    }

    pub fn entry(&self, client: u128) -> Option<&Entry<R>> {
        self.entries.get(&client)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn remember_evicted(&mut self, client: u128, session: u64) {
        self.evicted.insert(client, session);
        while self.evicted.len() > self.capacity_clients {
            let first = self.evicted.keys().next().copied();
            if let Some(first) = first {
                self.evicted.remove(&first);
            }
        }
    }
}

/// Why bytes are not an encoded client table.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TableFault {
    #[error("the encoding ends early or has bytes after its end")]
    Length,
    #[error("the table holds {found} clients, more than its capacity {capacity}")]
    Count { found: usize, capacity: usize },
    #[error("capacity {found}, this replica runs with {expected}")]
    Capacity { found: usize, expected: usize },
    #[error("clients out of order or repeated")]
    Order,
    #[error("a stored reply does not verify: {0}")]
    Reply(crate::header::HeaderFault),
    #[error("an entry breaks its invariants (session after its latest commit)")]
    Entry,
}

impl ClientTable<crate::header::Message> {
    /// The table as bytes, for a checkpoint: it is replicated state, so it is snapshotted with
    /// the state machine. Little-endian, clients in ascending order (the BTreeMap's), so every
    /// replica encodes an equal table to equal bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&(self.capacity_clients as u32).to_le_bytes());
        bytes.extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&(self.evicted.len() as u32).to_le_bytes());
        for (client, entry) in &self.entries {
            bytes.extend_from_slice(&client.to_le_bytes());
            bytes.extend_from_slice(&entry.session.to_le_bytes());
            bytes.extend_from_slice(&entry.request.to_le_bytes());
            bytes.extend_from_slice(&entry.committed_op.to_le_bytes());
            let reply = entry.reply.encode();
            bytes.extend_from_slice(&(reply.len() as u32).to_le_bytes());
            bytes.extend_from_slice(&reply);
        }
        for (client, session) in &self.evicted {
            bytes.extend_from_slice(&client.to_le_bytes());
            bytes.extend_from_slice(&session.to_le_bytes());
        }
        bytes
    }

    /// Decode [`ClientTable::encode`]'s bytes for a replica whose table holds
    /// `capacity_clients`. Every count and length is bounded before use; every stored reply
    /// must verify.
    pub fn decode(bytes: &[u8], capacity_clients: usize) -> Result<Self, TableFault> {
        let mut reader = Reader { bytes, at: 0 };
        let capacity = reader.u32()? as usize;
        if capacity != capacity_clients {
            return Err(TableFault::Capacity {
                found: capacity,
                expected: capacity_clients,
            });
        }
        let entries_count = reader.u32()? as usize;
        let evicted_count = reader.u32()? as usize;
        for found in [entries_count, evicted_count] {
            if found > capacity {
                return Err(TableFault::Count { found, capacity });
            }
        }
        let mut table = ClientTable::new(capacity);
        let mut previous = None;
        for _ in 0..entries_count {
            let client = reader.u128()?;
            if previous.is_some_and(|previous| previous >= client) {
                return Err(TableFault::Order);
            }
            previous = Some(client);
            let session = reader.u64()?;
            let request = reader.u64()?;
            let committed_op = reader.u64()?;
            let reply_len = reader.u32()? as usize;
            if reply_len > crate::constants::REPLY_SIZE_MAX {
                return Err(TableFault::Length);
            }
            let reply = crate::header::Message::decode(reader.take(reply_len)?).map_err(TableFault::Reply)?;
            if session > committed_op {
                return Err(TableFault::Entry);
            }
            table.entries.insert(
                client,
                Entry {
                    session,
                    request,
                    reply,
                    committed_op,
                },
            );
        }
        let mut previous = None;
        for _ in 0..evicted_count {
            let client = reader.u128()?;
            if previous.is_some_and(|previous| previous >= client) {
                return Err(TableFault::Order);
            }
            previous = Some(client);
            table.evicted.insert(client, reader.u64()?);
        }
        if reader.at != bytes.len() {
            return Err(TableFault::Length);
        }
        Ok(table)
    }
}

/// Bounded little-endian reads over a byte slice.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, len: usize) -> Result<&'a [u8], TableFault> {
        let end = self.at.checked_add(len).ok_or(TableFault::Length)?;
        let taken = self.bytes.get(self.at..end).ok_or(TableFault::Length)?;
        self.at = end;
        Ok(taken)
    }

    fn u32(&mut self) -> Result<u32, TableFault> {
        let mut raw = [0u8; 4];
        raw.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(raw))
    }

    fn u64(&mut self) -> Result<u64, TableFault> {
        let mut raw = [0u8; 8];
        raw.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(raw))
    }

    fn u128(&mut self) -> Result<u128, TableFault> {
        let mut raw = [0u8; 16];
        raw.copy_from_slice(self.take(16)?);
        Ok(u128::from_le_bytes(raw))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_run_once_and_retries_get_the_stored_reply() {
        let mut table: ClientTable<&str> = ClientTable::new(4);
        assert_eq!(table.admit(7, 1, 1), Admission::NotRegistered);
        table.commit_register(7, 10, "registered");
        assert_eq!(table.admit(7, 10, 1), Admission::Execute);
        // Nothing committed yet: a retry of request 1 is still "execute" for the primary
        // only if it is not already in its pipeline; the replica checks the pipeline first.
        table.commit_request(7, 10, 1, 11, "one");
        assert_eq!(table.admit(7, 10, 1), Admission::ReplyCached("one"));
        assert_eq!(table.admit(7, 10, 2), Admission::Execute);
        assert_eq!(table.admit(7, 10, 0), Admission::Drop);
        assert_eq!(table.admit(7, 10, 3), Admission::Drop, "skipping ahead");
        table.commit_request(7, 10, 2, 12, "two");
        assert_eq!(table.admit(7, 10, 1), Admission::Drop, "older than the latest");
        assert_eq!(table.admit(7, 10, 2), Admission::ReplyCached("two"));
    }

    #[test]
    fn a_retried_register_gets_the_first_session() {
        let mut table: ClientTable<u64> = ClientTable::new(2);
        assert_eq!(table.admit_register(4), Admission::Execute);
        table.commit_register(4, 7, 700);
        assert_eq!(table.admit_register(4), Admission::ReplyCached(700));
        table.commit_request(4, 7, 1, 8, 800);
        // With requests under the session, a register is a stale duplicate: dropped.
        assert_eq!(table.admit_register(4), Admission::Drop);
    }

    #[test]
    fn an_evicted_client_is_told_so_and_never_re_executes() {
        let mut table: ClientTable<u64> = ClientTable::new(2);
        table.commit_register(1, 1, 0);
        table.commit_register(2, 2, 0);
        table.commit_request(1, 1, 1, 3, 100);
        // Client 2 committed least recently (op 2 < op 3): it goes.
        assert_eq!(table.commit_register(3, 4, 0), Some(2));
        assert_eq!(table.len(), 2);
        assert_eq!(table.admit(2, 2, 1), Admission::SessionEvicted);
        assert_eq!(table.admit(2, 2, 0), Admission::SessionEvicted);
        // Registering again gives a new session; the old one stays dead.
        table.commit_register(2, 5, 0);
        assert_eq!(table.admit(2, 5, 1), Admission::Execute);
        assert_eq!(table.admit(2, 2, 1), Admission::Drop);
    }

    #[test]
    fn eviction_order_is_by_commit_then_id() {
        let mut table: ClientTable<()> = ClientTable::new(3);
        for client in [5, 3, 9] {
            table.commit_register(client, 1 + client as u64, ());
        }
        table.commit_request(3, 4, 1, 20, ());
        // Oldest commits: client 5 (op 6), then 9 (op 10), then 3 (op 20).
        assert_eq!(table.commit_register(11, 21, ()), Some(5));
        assert_eq!(table.commit_register(12, 22, ()), Some(9));
        assert!(table.entry(3).is_some());
    }

    fn reply(op: u64) -> crate::header::Message {
        let mut header = crate::header::Header::new(crate::header::Command::Reply, 1);
        header.op = op;
        crate::header::Message::new(header, bytes::Bytes::copy_from_slice(&op.to_le_bytes()))
    }

    fn sample_table() -> ClientTable<crate::header::Message> {
        let mut table = ClientTable::new(2);
        table.commit_register(30, 1, reply(1));
        table.commit_register(10, 2, reply(2));
        table.commit_request(30, 1, 1, 3, reply(3));
        // Client 10 goes (least recently committed), so the evicted map is encoded too.
        table.commit_register(20, 4, reply(4));
        table
    }

    #[test]
    fn the_table_round_trips_through_its_encoding() {
        let table = sample_table();
        let bytes = table.encode();
        assert_eq!(ClientTable::decode(&bytes, 2), Ok(table.clone()));
        assert_eq!(table.encode(), bytes, "equal tables encode to equal bytes");
        assert_eq!(
            ClientTable::decode(&bytes, 3),
            Err(TableFault::Capacity {
                found: 2,
                expected: 3
            })
        );
        for cut in [0, 4, 11, bytes.len() - 1] {
            assert_eq!(
                ClientTable::decode(&bytes[..cut], 2),
                Err(TableFault::Length),
                "cut at {cut}"
            );
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(ClientTable::decode(&longer, 2), Err(TableFault::Length));
        // A flipped bit inside a stored reply is caught by the reply's own checksums.
        let mut flipped = bytes.clone();
        let inside_first_reply = 12 + 16 + 24 + 4 + 100;
        flipped[inside_first_reply] ^= 1;
        assert!(matches!(
            ClientTable::decode(&flipped, 2),
            Err(TableFault::Reply(_))
        ));
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..400)) {
            let _ = ClientTable::decode(&bytes, 2);
        }
    }

    #[test]
    #[should_panic(expected = "consecutive")]
    fn a_committed_request_must_be_the_next_one() {
        let mut table: ClientTable<()> = ClientTable::new(1);
        table.commit_register(1, 1, ());
        table.commit_request(1, 1, 2, 2, ());
    }
}
