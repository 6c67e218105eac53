//! The administrative routes of the HTTP shell (protocol reference §10): stream and topic
//! updates and purges, partitions and segments, consumer-offset deletion, flushing, consumer
//! groups, stats and cluster metadata.
//!
//! Same rule as the parent module: each route only translates the request into the
//! [`Command`] a binary client would send, runs it through [`HttpState::run`], and turns the
//! handler's reply values ([`Typed`]) into the JSON the 0.11 SDK's `HttpClient` deserializes.
//! Every number taken from a path or query is parsed as a `u32` here and refused with 400
//! and a reason naming the parameter when it is not one; ranges are checked by the handler.

use super::{
    ApiError, ApiResult, CreateTopicBody, Peer, Shared, consumer, identifier, json, parse_json,
    topic_options, unexpected_reply,
};
use crate::handler::Typed;
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{delete, get, post, put};
use cairn_wire::codes;
use cairn_wire::command::Command;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

pub(super) fn routes() -> Router<Shared> {
    Router::new()
        .route("/stats", get(get_stats))
        .route("/cluster/metadata", get(get_cluster_metadata))
        .route("/streams/{stream}", put(update_stream))
        .route("/streams/{stream}/purge", delete(purge_stream))
        .route("/streams/{stream}/topics/{topic}", put(update_topic))
        .route("/streams/{stream}/topics/{topic}/purge", delete(purge_topic))
        .route(
            "/streams/{stream}/topics/{topic}/partitions",
            post(create_partitions).delete(delete_partitions),
        )
        .route(
            "/streams/{stream}/topics/{topic}/partitions/{partition}",
            delete(delete_segments),
        )
        .route(
            "/streams/{stream}/topics/{topic}/consumer-offsets/{consumer}",
            delete(delete_consumer_offset),
        )
        .route(
            "/streams/{stream}/topics/{topic}/messages/flush/{partition}/{fsync}",
            get(flush_unsaved_buffer),
        )
        .route(
            "/streams/{stream}/topics/{topic}/consumer-groups",
            get(get_consumer_groups).post(create_consumer_group),
        )
        .route(
            "/streams/{stream}/topics/{topic}/consumer-groups/{group}",
            get(get_consumer_group).delete(delete_consumer_group),
        )
}

// ---- parsing path and query values ----

fn bad_request(reason: String) -> ApiError {
    ApiError {
        status: StatusCode::BAD_REQUEST,
        id: codes::INVALID_FORMAT,
        reason,
    }
}

/// A numeric path or query value: a `u32`, or 400 naming the parameter.
fn u32_param(name: &str, text: &str) -> Result<u32, ApiError> {
    text.parse::<u32>().map_err(|_| {
        bad_request(format!(
            "`{name}` must be an unsigned 32-bit integer, got `{}`",
            text.chars().take(64).collect::<String>()
        ))
    })
}

/// A query string, or 400 with axum's description of what did not parse.
fn query<T>(query: Result<Query<T>, QueryRejection>) -> Result<T, ApiError> {
    query
        .map(|Query(value)| value)
        .map_err(|rejection| bad_request(rejection.body_text()))
}

/// The last segment of `…/flush/{p}/fsync={bool}`; a bare `true`/`false` is accepted too.
fn fsync_flag(text: &str) -> Result<bool, ApiError> {
    match text.strip_prefix("fsync=").unwrap_or(text) {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(bad_request(format!(
            "expected `fsync=true` or `fsync=false`, got `{}`",
            text.chars().take(64).collect::<String>()
        ))),
    }
}

fn string_options(options: BTreeMap<String, String>) -> Vec<cairn_wire::types::OptionEntry> {
    options
        .into_iter()
        .map(|(key, value)| cairn_wire::types::OptionEntry {
            key,
            value_kind: cairn_wire::types::value_kind::STRING,
            value: value.into_bytes(),
        })
        .collect()
}

fn no_content() -> ApiResult {
    Ok(StatusCode::NO_CONTENT.into_response())
}

// ---- streams and topics ----

#[derive(Deserialize)]
struct UpdateStreamBody {
    name: String,
    #[serde(default)]
    options: BTreeMap<String, String>,
}

async fn update_stream(
    State(state): State<Shared>,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(stream): Path<String>,
    body: Bytes,
) -> ApiResult {
    let body: UpdateStreamBody = parse_json(&body)?;
    let command = Command::UpdateStream {
        stream: identifier(&stream)?,
        name: body.name,
        // Streams have no option keys yet: the handler refuses any, as over TCP.
        options: string_options(body.options),
    };
    state.run(&headers, peer, command).await?;
    no_content()
}

async fn purge_stream(
    State(state): State<Shared>,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(stream): Path<String>,
) -> ApiResult {
    let command = Command::PurgeStream {
        stream: identifier(&stream)?,
    };
    state.run(&headers, peer, command).await?;
    no_content()
}

/// PUT `/streams/{s}/topics/{t}`: the SDK's `UpdateTopic` (absent or null typed fields leave
/// the topic's value alone).
#[derive(Deserialize)]
struct UpdateTopicBody {
    name: String,
    #[serde(default)]
    compression_algorithm: Option<String>,
    #[serde(default)]
    message_expiry: Option<u64>,
    #[serde(default)]
    max_topic_size: Option<u64>,
    #[serde(default)]
    options: BTreeMap<String, String>,
}

async fn update_topic(
    State(state): State<Shared>,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((stream, topic)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult {
    let body: UpdateTopicBody = parse_json(&body)?;
    let mut raw = body.options;
    // As in the SDK's own encoding, a typed field wins over a raw entry with the same key
    // (two entries for one key would be a malformed option block).
    for (key, present) in [
        ("compression_algorithm", body.compression_algorithm.is_some()),
        ("message_expiry", body.message_expiry.is_some()),
        ("max_topic_size", body.max_topic_size.is_some()),
    ] {
        if present {
            raw.remove(key);
        }
    }
    // The same option entries CreateTopic's JSON becomes, so the handler checks them alike.
    let fields = CreateTopicBody {
        name: body.name,
        partitions_count: 0,
        compression_algorithm: body.compression_algorithm,
        message_expiry: body.message_expiry,
        max_topic_size: body.max_topic_size,
        options: raw,
    };
    let command = Command::UpdateTopic {
        stream: identifier(&stream)?,
        topic: identifier(&topic)?,
        options: topic_options(&fields),
        name: fields.name,
    };
    state.run(&headers, peer, command).await?;
    no_content()
}

async fn purge_topic(
    State(state): State<Shared>,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((stream, topic)): Path<(String, String)>,
) -> ApiResult {
    let command = Command::PurgeTopic {
        stream: identifier(&stream)?,
        topic: identifier(&topic)?,
    };
    state.run(&headers, peer, command).await?;
    no_content()
}

// ---- partitions and segments ----

#[derive(Deserialize)]
struct CreatePartitionsBody {
    partitions_count: u32,
}

async fn create_partitions(
    State(state): State<Shared>,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((stream, topic)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult {
    let body: CreatePartitionsBody = parse_json(&body)?;
    let command = Command::CreatePartitions {
        stream: identifier(&stream)?,
        topic: identifier(&topic)?,
        partitions_count: body.partitions_count,
    };
    state.run(&headers, peer, command).await?;
    no_content()
}

#[derive(Deserialize)]
struct DeletePartitionsQuery {
    partitions_count: u32,
}

async fn delete_partitions(
    State(state): State<Shared>,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((stream, topic)): Path<(String, String)>,
    params: Result<Query<DeletePartitionsQuery>, QueryRejection>,
) -> ApiResult {
    let params = query(params)?;
    let command = Command::DeletePartitions {
        stream: identifier(&stream)?,
        topic: identifier(&topic)?,
        partitions_count: params.partitions_count,
    };
    state.run(&headers, peer, command).await?;
    no_content()
}

#[derive(Deserialize)]
struct DeleteSegmentsQuery {
    segments_count: u32,
}

async fn delete_segments(
    State(state): State<Shared>,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((stream, topic, partition)): Path<(String, String, String)>,
    params: Result<Query<DeleteSegmentsQuery>, QueryRejection>,
) -> ApiResult {
    let params = query(params)?;
    let command = Command::DeleteSegments {
        stream: identifier(&stream)?,
        topic: identifier(&topic)?,
        partition_id: u32_param("partition_id", &partition)?,
        segments_count: params.segments_count,
    };
    state.run(&headers, peer, command).await?;
    no_content()
}

// ---- consumer offsets and flushing ----

#[derive(Deserialize)]
struct PartitionQuery {
    #[serde(default)]
    partition_id: Option<u32>,
}

async fn delete_consumer_offset(
    State(state): State<Shared>,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((stream, topic, consumer_id)): Path<(String, String, String)>,
    params: Result<Query<PartitionQuery>, QueryRejection>,
) -> ApiResult {
    let params = query(params)?;
    let command = Command::DeleteConsumerOffset {
        consumer: consumer(Some(&consumer_id))?,
        stream: identifier(&stream)?,
        topic: identifier(&topic)?,
        partition_id: params.partition_id,
    };
    state.run(&headers, peer, command).await?;
    no_content()
}

/// GET `…/messages/flush/{p}/fsync={bool}`. The SDK repeats both values as a query
/// (`?partition_id=P&fsync=bool`); the path is what counts.
async fn flush_unsaved_buffer(
    State(state): State<Shared>,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((stream, topic, partition, fsync)): Path<(String, String, String, String)>,
) -> ApiResult {
    let command = Command::FlushUnsavedBuffer {
        stream: identifier(&stream)?,
        topic: identifier(&topic)?,
        partition_id: u32_param("partition_id", &partition)?,
        fsync: fsync_flag(&fsync)?,
    };
    state.run(&headers, peer, command).await?;
    no_content()
}

// ---- consumer groups ----

/// `ConsumerGroup` in the SDK.
#[derive(Serialize)]
struct GroupJson {
    id: u32,
    name: String,
    partitions_count: u32,
    members_count: u32,
}

/// `ConsumerGroupDetails` in the SDK.
#[derive(Serialize)]
struct GroupDetailsJson {
    id: u32,
    name: String,
    partitions_count: u32,
    members_count: u32,
    members: Vec<GroupMemberJson>,
}

#[derive(Serialize)]
struct GroupMemberJson {
    id: u32,
    partitions_count: u32,
    partitions: Vec<u32>,
}

impl GroupJson {
    fn new(group: &cairn_wire::reply::GroupRecord) -> GroupJson {
        GroupJson {
            id: group.id,
            name: group.name.clone(),
            partitions_count: group.partitions_count,
            members_count: u32::try_from(group.members.len()).unwrap_or(u32::MAX),
        }
    }
}

/// A group with its members; none means "no such group" (404, which the SDK's
/// `get_consumer_group` turns into `None`).
fn group_details(typed: Typed) -> Result<GroupDetailsJson, ApiError> {
    let group = match typed {
        Typed::Group(Some(group)) => group,
        Typed::Group(None) => {
            return Err(ApiError::new(
                codes::CONSUMER_GROUP_ID_NOT_FOUND,
                "consumer group not found",
            ));
        }
        _ => return Err(unexpected_reply()),
    };
    let GroupJson {
        id,
        name,
        partitions_count,
        members_count,
    } = GroupJson::new(&group);
    let members = group
        .members
        .into_iter()
        .map(|(id, partitions)| GroupMemberJson {
            id,
            partitions_count: u32::try_from(partitions.len()).unwrap_or(u32::MAX),
            partitions,
        })
        .collect();
    Ok(GroupDetailsJson {
        id,
        name,
        partitions_count,
        members_count,
        members,
    })
}

async fn get_consumer_groups(
    State(state): State<Shared>,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((stream, topic)): Path<(String, String)>,
) -> ApiResult {
    let command = Command::GetConsumerGroups {
        stream: identifier(&stream)?,
        topic: identifier(&topic)?,
    };
    let Typed::Groups(groups) = state.run(&headers, peer, command).await? else {
        return Err(unexpected_reply());
    };
    let groups: Vec<GroupJson> = groups.iter().map(GroupJson::new).collect();
    Ok(json(StatusCode::OK, &groups))
}

async fn get_consumer_group(
    State(state): State<Shared>,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((stream, topic, group)): Path<(String, String, String)>,
) -> ApiResult {
    let command = Command::GetConsumerGroup {
        stream: identifier(&stream)?,
        topic: identifier(&topic)?,
        group: identifier(&group)?,
    };
    let typed = state.run(&headers, peer, command).await?;
    Ok(json(StatusCode::OK, &group_details(typed)?))
}

#[derive(Deserialize)]
struct CreateGroupBody {
    name: String,
}

async fn create_consumer_group(
    State(state): State<Shared>,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((stream, topic)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult {
    let body: CreateGroupBody = parse_json(&body)?;
    let command = Command::CreateConsumerGroup {
        stream: identifier(&stream)?,
        topic: identifier(&topic)?,
        name: body.name,
    };
    let typed = state.run(&headers, peer, command).await?;
    Ok(json(StatusCode::CREATED, &group_details(typed)?))
}

async fn delete_consumer_group(
    State(state): State<Shared>,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((stream, topic, group)): Path<(String, String, String)>,
) -> ApiResult {
    let command = Command::DeleteConsumerGroup {
        stream: identifier(&stream)?,
        topic: identifier(&topic)?,
        group: identifier(&group)?,
    };
    state.run(&headers, peer, command).await?;
    no_content()
}

// ---- stats ----

/// The SDK's `Stats`: byte sizes (`IggyByteSize`), `run_time` (`IggyDuration`) and
/// `start_time` (`IggyTimestamp`) all deserialize from plain numbers (bytes, µs, µs);
/// `cache_metrics` is keyed `"<stream>-<topic>-<partition>"`.
#[derive(Serialize)]
struct StatsJson {
    process_id: u32,
    cpu_usage: f32,
    total_cpu_usage: f32,
    memory_usage: u64,
    total_memory: u64,
    available_memory: u64,
    run_time: u64,
    start_time: u64,
    read_bytes: u64,
    written_bytes: u64,
    messages_size_bytes: u64,
    streams_count: u32,
    topics_count: u32,
    partitions_count: u32,
    segments_count: u32,
    messages_count: u64,
    clients_count: u32,
    consumer_groups_count: u32,
    hostname: String,
    os_name: String,
    os_version: String,
    kernel_version: String,
    iggy_server_version: String,
    iggy_server_semver: Option<u32>,
    cache_metrics: HashMap<String, CacheMetricsJson>,
    threads_count: u32,
    free_disk_space: u64,
    total_disk_space: u64,
}

#[derive(Serialize)]
struct CacheMetricsJson {
    hits: u64,
    misses: u64,
    hit_ratio: f32,
}

/// JSON has no NaN or infinity (serde_json writes `null`, which the SDK's `f32` refuses).
fn finite(value: f32) -> f32 {
    if value.is_finite() { value } else { 0.0 }
}

/// The SDK's `Stats` from the handler's values (no per-partition cache metrics are kept).
fn stats_json(s: cairn_wire::reply::Stats) -> StatsJson {
    StatsJson {
        process_id: s.process_id,
        cpu_usage: finite(s.cpu_usage),
        total_cpu_usage: finite(s.total_cpu_usage),
        memory_usage: s.memory_usage,
        total_memory: s.total_memory,
        available_memory: s.available_memory,
        run_time: s.run_time_us,
        start_time: s.start_time_us,
        read_bytes: s.read_bytes,
        written_bytes: s.written_bytes,
        messages_size_bytes: s.messages_size_bytes,
        streams_count: s.streams_count,
        topics_count: s.topics_count,
        partitions_count: s.partitions_count,
        segments_count: s.segments_count,
        messages_count: s.messages_count,
        clients_count: s.clients_count,
        consumer_groups_count: s.consumer_groups_count,
        hostname: s.hostname,
        os_name: s.os_name,
        os_version: s.os_version,
        kernel_version: s.kernel_version,
        iggy_server_version: s.server_version,
        iggy_server_semver: (s.server_semver != 0).then_some(s.server_semver),
        cache_metrics: HashMap::new(),
        threads_count: s.threads_count,
        free_disk_space: s.free_disk_space,
        total_disk_space: s.total_disk_space,
    }
}

async fn get_stats(State(state): State<Shared>, ConnectInfo(peer): Peer, headers: HeaderMap) -> ApiResult {
    match state.run(&headers, peer, Command::GetStats).await? {
        Typed::Stats(stats) => Ok(json(StatusCode::OK, &stats_json(*stats))),
        _ => Err(unexpected_reply()),
    }
}

// ---- cluster metadata ----

/// The SDK's `ClusterMetadata`.
#[derive(Serialize)]
struct ClusterMetadataJson {
    name: String,
    nodes: Vec<ClusterNodeJson>,
}

#[derive(Serialize)]
struct ClusterNodeJson {
    name: String,
    ip: String,
    endpoints: EndpointsJson,
    role: &'static str,
    status: &'static str,
}

#[derive(Serialize)]
struct EndpointsJson {
    tcp: u16,
    quic: u16,
    http: u16,
    websocket: u16,
}

/// The SDK's `ClusterMetadata` from the handler's values; a role or status the SDK does not
/// know is a server bug (as the SDK would refuse it).
fn cluster_metadata_json(
    name: String,
    nodes: Vec<cairn_wire::reply::ClusterNode>,
) -> Option<ClusterMetadataJson> {
    let nodes = nodes
        .into_iter()
        .map(|node| {
            let role = match node.role {
                0 => "leader",
                1 => "follower",
                _ => return None,
            };
            let status = match node.status {
                0 => "healthy",
                1 => "starting",
                2 => "stopping",
                3 => "unreachable",
                4 => "maintenance",
                _ => return None,
            };
            Some(ClusterNodeJson {
                name: node.name,
                ip: node.ip,
                endpoints: EndpointsJson {
                    tcp: node.tcp_port,
                    quic: node.quic_port,
                    http: node.http_port,
                    websocket: node.websocket_port,
                },
                role,
                status,
            })
        })
        .collect::<Option<Vec<_>>>()?;
    Some(ClusterMetadataJson { name, nodes })
}

async fn get_cluster_metadata(
    State(state): State<Shared>,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
) -> ApiResult {
    match state.run(&headers, peer, Command::GetClusterMetadata).await? {
        Typed::ClusterMetadata { name, nodes } => {
            let metadata = cluster_metadata_json(name, nodes).ok_or_else(unexpected_reply)?;
            Ok(json(StatusCode::OK, &metadata))
        }
        _ => Err(unexpected_reply()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fsync_segment_parses_the_sdk_form_only() {
        assert!(matches!(fsync_flag("fsync=true"), Ok(true)));
        assert!(matches!(fsync_flag("fsync=false"), Ok(false)));
        assert!(fsync_flag("fsync=yes").is_err());
        assert!(fsync_flag("").is_err());
    }

    #[test]
    fn numeric_params_are_u32_or_refused() {
        assert!(matches!(u32_param("p", "7"), Ok(7)));
        assert!(u32_param("p", "-1").is_err());
        assert!(u32_param("p", "4294967296").is_err());
    }

    #[test]
    fn stats_become_the_sdk_json() {
        let stats = cairn_wire::reply::Stats {
            process_id: 9,
            cpu_usage: f32::NAN,
            streams_count: 2,
            messages_count: 5,
            hostname: "h".to_string(),
            server_semver: 0,
            ..Default::default()
        };
        let decoded = stats_json(stats);
        assert_eq!(decoded.process_id, 9);
        assert_eq!(decoded.cpu_usage, 0.0, "JSON has no NaN");
        assert_eq!(decoded.streams_count, 2);
        assert_eq!(decoded.messages_count, 5);
        assert_eq!(decoded.hostname, "h");
        assert_eq!(decoded.iggy_server_semver, None);
    }

    #[test]
    fn group_details_list_members_and_none_is_not_found() {
        let record = cairn_wire::reply::GroupRecord {
            id: 3,
            partitions_count: 2,
            name: "g".to_string(),
            members: vec![(1, vec![0, 1])],
        };
        let Ok(details) = group_details(Typed::Group(Some(record))) else {
            panic!("group details are refused");
        };
        assert_eq!(details.members_count, 1);
        assert_eq!(details.members[0].partitions_count, 2);
        assert_eq!(details.members[0].partitions, vec![0, 1]);
        let Err(not_found) = group_details(Typed::Group(None)) else {
            panic!("a missing group is not refused");
        };
        assert_eq!(not_found.id, codes::CONSUMER_GROUP_ID_NOT_FOUND);
    }
}
