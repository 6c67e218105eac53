//! A node of a cluster of several nodes (a `[cluster]` listing more than one): the start of
//! its replica network and the seat its catalog's groups open with, the first start's
//! decision (form the cluster, or rejoin it as a node that lost its data), the root user,
//! and the roster command 12 reports. `docs/cluster.md` describes the whole.
//!
//! Start order (`main.rs`): [`Cluster::start`] binds the replica listener, starts the bus
//! and, at a node's first start, waits until every peer has said in its handshake whether it
//! holds data of the cluster: none does, so the cluster is being formed and this node
//! records its membership and formats its groups; one does, so this node lost its data: it
//! records that it rejoins, and every group it opens is a wiped replica that catches up from
//! its peers (repairs, or a state transfer: `node::transfer`). Then the replica workers
//! start and the catalog loads with [`Cluster::seat`].

use crate::catalog::{Catalog, ClusterSeat, METADATA_GROUP};
use crate::config::ClusterConfig;
use crate::membership::{self, Checked};
use crate::replicas::Replicas;
use cairn_bus::{Bus, BusConfig, ClusterKey, NodeAddress};
use cairn_machine::metadata::MetadataMachine;
use cairn_machine::partition::PartitionMachine;
use cairn_vsr::constants::Shape;
use cairn_vsr::journal::BodyRule;
use cairn_vsr::replica::StateMachine;
use cairn_wire::reply;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// Wall time of one replica tick: heartbeats every 10 ticks, a backup's view-change
/// timeout 50 to 75 ticks, so a dead primary is replaced well within 2 s.
pub const TICK: Duration = Duration::from_millis(10);
/// How long a request waits for a quorum before its outcome is given up as unknown.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Threads serving the groups' messages from peers and their ticks.
const WORKERS: usize = 2;
/// How often the first start says which peers it still waits for.
const WAITING_REPORT_INTERVAL: Duration = Duration::from_secs(5);

/// Command 12's roles and statuses (`iggy_common` `ClusterNodeRole`, `ClusterNodeStatus`).
pub const ROLE_LEADER: u8 = 0;
const ROLE_FOLLOWER: u8 = 1;
pub const STATUS_HEALTHY: u8 = 0;
const STATUS_UNREACHABLE: u8 = 3;

/// This node's part of the cluster at run time.
pub struct Cluster {
    pub config: ClusterConfig,
    pub bus: Arc<Bus>,
    pub replicas: Arc<Replicas>,
    /// This node's replica index.
    pub index: u8,
    seat: ClusterSeat,
    /// This node's membership record as the start found or made it.
    membership: membership::Membership,
}

impl Cluster {
    /// Start the replica network of this node, deciding at a first start whether the
    /// cluster is being formed (every peer up and without data) or this node lost its data
    /// (it rejoins). Returns once the catalog may load.
    pub async fn start(config: &ClusterConfig, data_dir: &Path) -> Result<Cluster, String> {
        let mut recorded =
            match membership::check(data_dir, Some(config)).map_err(|error| error.to_string())? {
                Checked::Recorded(membership) => Some(membership),
                Checked::Unrecorded => None,
            };
        let metadata_dir = crate::catalog::metadata_group_dir(data_dir);
        if let Some(membership) = &recorded
            && membership.metadata_formatted
            && !membership.rejoining
            && crate::node::lost_group(&metadata_dir)
        {
            // The record says the metadata group was formatted here, and it is gone: this
            // node lost its data (the record survived), so it rejoins, every group wiped.
            tracing::warn!(
                dir = %metadata_dir.display(),
                "this node's metadata group is gone although its record says it was formatted: the node lost its data and rejoins, every group opening as a wiped replica"
            );
            recorded =
                Some(membership::note_rejoining(data_dir, membership).map_err(|error| error.to_string())?);
        }
        let entry = config.this_node();
        let address = match std::env::var(crate::config::TEST_REPLICA_LISTEN_ENV) {
            Ok(overridden) => overridden.parse().map_err(|error| {
                format!(
                    "{}=`{overridden}` is not an address: {error}",
                    crate::config::TEST_REPLICA_LISTEN_ENV
                )
            })?,
            Err(_) => crate::config::listen_address(&entry.replica),
        };
        let listener = tokio::net::TcpListener::bind(address)
            .await
            .map_err(|error| format!("cannot listen for replica traffic on {address}: {error}"))?;
        // A node says it holds the cluster's data once its metadata group is formatted and it
        // is not rejoining: a node that recorded but has not formatted yet (or rejoins) must
        // not make a node of a forming cluster believe it lost its data.
        let holds_data =
            Arc::new(AtomicBool::new(recorded.as_ref().is_some_and(|membership| {
                membership.metadata_formatted && !membership.rejoining
            })));
        let nodes = config
            .nodes
            .iter()
            .map(|node| NodeAddress {
                id: node.id,
                replica: node.replica.clone(),
            })
            .collect();
        let cluster_id = config.cluster_id();
        let mut bus_config = BusConfig::new(
            cluster_id,
            config.node_id,
            nodes,
            ClusterKey::derive(config.secret.as_bytes()),
            Arc::new(prepare_rule),
            Shape::PARTITION.message_size_max,
        );
        bus_config.holds_data = holds_data.clone();
        let (bus, received) =
            cairn_bus::Bus::start(bus_config, listener).map_err(|error| error.to_string())?;
        let bus = Arc::new(bus);
        let index = config.replica_index();
        let membership = match recorded {
            Some(membership) => membership,
            None => {
                let rejoining = match wait_to_form(&bus, config).await {
                    Ok(formation) => formation,
                    Err(refusal) => {
                        bus.shutdown().await;
                        return Err(refusal);
                    }
                };
                let membership = membership::record(data_dir, config, rejoining.is_some())
                    .map_err(|error| error.to_string())?;
                match rejoining {
                    Some(holder) => tracing::warn!(
                        holder,
                        "this node's data directory holds no data of the cluster, and node {holder} holds the cluster's data: this node lost its data (or was wiped). It rejoins: every group opens as a wiped replica, which takes nothing on until a quorum of its peers answered, and catches up from them by state transfer"
                    ),
                    None => {
                        tracing::info!("every node is up without data: this node forms the cluster with them")
                    }
                }
                membership
            }
        };
        let replicas = Replicas::start(
            bus.clone(),
            cluster_id,
            received,
            WORKERS,
            TICK,
            config.transfer_bytes_per_second,
        );
        // The metadata group is formatted when this node forms the cluster, or after a stop
        // between the record and the format (the group never existed here, so it never
        // acknowledged anything). Once formatted, the record says so: a start that finds no
        // group then lost it, and is refused.
        let forming = !membership.metadata_formatted
            && !membership.rejoining
            && !crate::node::is_formatted(&metadata_dir);
        let seat = ClusterSeat {
            replicas: replicas.clone(),
            replica: index,
            replica_count: config.nodes.len() as u8,
            cluster: cluster_id,
            tick: TICK,
            request_timeout: REQUEST_TIMEOUT,
            forming,
            rejoining: Arc::new(AtomicBool::new(membership.rejoining)),
            holds_data: holds_data.clone(),
            leads_metadata: Arc::default(),
        };
        Ok(Cluster {
            config: config.clone(),
            bus,
            replicas,
            index,
            seat,
            membership,
        })
    }

    /// Note in the membership record that the metadata group is formatted (after the
    /// catalog loaded).
    pub fn note_metadata_formatted(&self, data_dir: &Path) -> Result<(), String> {
        membership::note_metadata_formatted(data_dir, &self.membership).map_err(|error| error.to_string())?;
        if !self.seat.rejoining.load(Ordering::Acquire) {
            self.seat.holds_data.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// The seat the catalog's groups open with.
    pub fn seat(&self) -> ClusterSeat {
        self.seat.clone()
    }

    /// Command 12's nodes as this node sees them: every node of the list in id order, the
    /// metadata group's primary as the one Leader (none during a view change: clients ask
    /// again; nor this node while it abdicates, since its peers elect another), this node
    /// and the peers it is connected to Healthy, the others Unreachable.
    pub fn roster(&self, metadata_primary: Option<u8>) -> Vec<reply::ClusterNode> {
        let abdicating = self.replicas.abdicating().load(Ordering::Acquire);
        let metadata_primary = metadata_primary.filter(|&primary| !(abdicating && primary == self.index));
        self.config
            .nodes
            .iter()
            .enumerate()
            .map(|(index, node)| {
                let index = index as u8;
                let reachable = index == self.index || self.bus.is_connected(index);
                let role = if metadata_primary == Some(index) {
                    ROLE_LEADER
                } else {
                    ROLE_FOLLOWER
                };
                let status = if reachable {
                    STATUS_HEALTHY
                } else {
                    STATUS_UNREACHABLE
                };
                node_record(node, role, status)
            })
            .collect()
    }

    /// Stop serving the groups and close the replica network (the clean stop, after the
    /// partitions closed).
    pub async fn stop(&self) {
        let replicas = self.replicas.clone();
        let _ = tokio::task::spawn_blocking(move || replicas.stop()).await;
        self.bus.shutdown().await;
    }
}

/// Command 12's record of a node of the list: `cairn-<id>` at its entry's `tcp` host and
/// ports, with `role` and `status`.
pub fn node_record(node: &crate::config::ClusterNode, role: u8, status: u8) -> reply::ClusterNode {
    let (host, tcp_port) = crate::config::split_host_port(&node.tcp);
    reply::ClusterNode {
        name: format!("cairn-{}", node.id),
        ip: host.to_string(),
        tcp_port,
        quic_port: 0,
        http_port: crate::config::split_host_port(&node.http).1,
        websocket_port: 0,
        role,
        status,
    }
}

/// How a group's prepares verify: the metadata's or a partition's state machine.
fn prepare_rule(group: u64) -> BodyRule {
    if group == METADATA_GROUP {
        MetadataMachine::body_verifies
    } else {
        PartitionMachine::body_verifies
    }
}

/// A first start: wait until every peer has said whether it holds data of the cluster.
/// `Ok(None)` when none does (the cluster is being formed); `Ok(Some(id))` as soon as node
/// `id` says it does (this node's data directory is empty, but the cluster exists: it lost
/// its data, and rejoins).
async fn wait_to_form(bus: &Bus, config: &ClusterConfig) -> Result<Option<u32>, String> {
    let peers: Vec<(u8, u32)> = config
        .nodes
        .iter()
        .enumerate()
        .map(|(index, node)| (index as u8, node.id))
        .filter(|(index, _)| *index != bus.index())
        .collect();
    let mut reported = Instant::now();
    loop {
        if let Some((_, id)) = peers
            .iter()
            .find(|(index, _)| bus.peer_holds_data(*index) == Some(true))
        {
            return Ok(Some(*id));
        }
        let waiting: Vec<String> = peers
            .iter()
            .filter(|(index, _)| bus.peer_holds_data(*index).is_none())
            .map(|(_, id)| id.to_string())
            .collect();
        if waiting.is_empty() {
            return Ok(None);
        }
        if reported.elapsed() >= WAITING_REPORT_INTERVAL {
            tracing::info!(
                waiting_for = %waiting.join(", "),
                "first start: waiting for every node to be up before the cluster is formed (each with an empty data directory)"
            );
            reported = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The root user of a new cluster: made by whichever node's metadata replica is the
/// primary (the others see it when the op applies). Runs in the background until the
/// metadata holds it or the server stops. A password this node generated (none configured)
/// is printed when this node made the user with it, or when its attempt had no definite
/// answer (then it is the password if that attempt took effect).
pub async fn ensure_root_user(
    catalog: Arc<RwLock<Catalog>>,
    password: Option<String>,
    now_us: impl Fn() -> u64 + Send + 'static,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let (password, generated) = match password {
        Some(password) => (password, false),
        None => (crate::auth::random_secret(24), true),
    };
    let hashed = {
        let password = password.clone();
        tokio::task::spawn_blocking(move || crate::auth::hash_secret(&password)).await
    };
    let password_hash = match hashed {
        Ok(Ok(hash)) => hash,
        Ok(Err(error)) => {
            tracing::error!(%error, "cannot hash the root password; the root user is not made by this node");
            return;
        }
        Err(error) => {
            tracing::error!(%error, "hashing the root password panicked; the root user is not made by this node");
            return;
        }
    };
    let mut shown = false;
    loop {
        let outcome = {
            let (catalog, password_hash) = (catalog.clone(), password_hash.clone());
            let now_us = now_us();
            tokio::task::spawn_blocking(move || {
                let mut catalog = match catalog.write() {
                    Ok(catalog) => catalog,
                    Err(poisoned) => poisoned.into_inner(),
                };
                if catalog.meta().user(crate::auth::ROOT_USER_ID).is_some() {
                    return Ok(false);
                }
                if catalog.metadata_primary() != catalog.seat().map(|seat| seat.replica) {
                    return Err(None);
                }
                catalog
                    .commit(&cairn_machine::metadata::MetadataOp::CreateRoot {
                        password_hash,
                        created_at_us: now_us,
                    })
                    .map(|_| true)
                    .map_err(Some)
            })
            .await
        };
        match outcome {
            Ok(Ok(made)) => {
                if made && generated && !shown {
                    println!(
                        "Generated a password for the root user `iggy` (shown once, stored only as a hash): {password}"
                    );
                }
                return;
            }
            Ok(Err(Some(status))) if status == cairn_wire::codes::TRANSIENT_NOT_ACCEPTED => {}
            Ok(Err(Some(status))) => {
                if generated && !shown && status == cairn_wire::codes::ERROR {
                    shown = true;
                    println!(
                        "Generated a password for the root user `iggy` (shown once, stored only as a hash): {password} \
                         (making the root user had no definite answer; if it took effect, this is its password)"
                    );
                }
                tracing::warn!(status, "creating the root user failed; trying again");
            }
            Ok(Err(None)) => {}
            Err(error) => tracing::error!(%error, "creating the root user panicked; trying again"),
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            _ = stop.changed() => return,
        }
    }
}
