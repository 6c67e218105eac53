//! Reply payload encoders (protocol reference §4.2, §4.4, §5, §6, §7.4).
//!
//! Each function appends to `out`. The caller adds the result section (`[0u32]`) for
//! result-framed operations via [`ok_result_section`]; errors are sent as a status with an
//! empty body and need nothing from here.

use crate::frame::SERVER_PROTOCOL_VERSION;
use crate::types::Permissions;

/// Append the empty result section `[0u32]` that precedes the payload of a framed success.
pub fn ok_result_section(out: &mut Vec<u8>) {
    out.extend_from_slice(&0u32.to_le_bytes());
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamRecord {
    pub id: u32,
    pub created_at: u64,
    pub topics_count: u32,
    pub size_bytes: u64,
    pub messages_count: u64,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicRecord {
    pub id: u32,
    pub created_at: u64,
    pub partitions_count: u32,
    /// µs; 0 or u64::MAX = never.
    pub message_expiry: u64,
    /// 1 none, 2 gzip.
    pub compression: u8,
    /// 0 = server default, u64::MAX = unlimited.
    pub max_topic_size: u64,
    pub size_bytes: u64,
    pub messages_count: u64,
    pub name: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionRecord {
    pub id: u32,
    pub created_at: u64,
    pub segments_count: u32,
    pub current_offset: u64,
    pub size_bytes: u64,
    pub messages_count: u64,
}

/// Stream record (with one empty option block).
pub fn stream(out: &mut Vec<u8>, s: &StreamRecord) {
    put_u32(out, s.id);
    put_u64(out, s.created_at);
    put_u32(out, s.topics_count);
    put_u64(out, s.size_bytes);
    put_u64(out, s.messages_count);
    put_name(out, &s.name);
    empty_option_block(out);
}

/// StreamDetails: the stream record then exactly `topics.len()` topic headers.
/// Debug-asserts `s.topics_count == topics.len()`.
pub fn stream_details(out: &mut Vec<u8>, s: &StreamRecord, topics: &[TopicRecord]) {
    debug_assert_eq!(
        s.topics_count as usize,
        topics.len(),
        "topics_count must match the topics sent"
    );
    // The client reads exactly topics_count headers, so the count written is the number of
    // headers that follow, whatever the record says.
    stream(
        out,
        &StreamRecord {
            topics_count: len_u32(topics.len()),
            ..s.clone()
        },
    );
    for topic in topics {
        topic_header(out, topic);
    }
}

/// TopicHeader (with two empty option blocks).
pub fn topic_header(out: &mut Vec<u8>, t: &TopicRecord) {
    put_u32(out, t.id);
    put_u64(out, t.created_at);
    put_u32(out, t.partitions_count);
    put_u64(out, t.message_expiry);
    out.push(t.compression);
    put_u64(out, t.max_topic_size);
    put_u64(out, t.size_bytes);
    put_u64(out, t.messages_count);
    put_name(out, &t.name);
    // Client-explicit options, then server-derived options.
    empty_option_block(out);
    empty_option_block(out);
}

/// TopicDetails: header then exactly `partitions.len()` 40-byte partition records.
pub fn topic_details(out: &mut Vec<u8>, t: &TopicRecord, partitions: &[PartitionRecord]) {
    debug_assert_eq!(
        t.partitions_count as usize,
        partitions.len(),
        "partitions_count must match the partitions sent"
    );
    // The client reads exactly partitions_count records; keep the two in step.
    topic_header(
        out,
        &TopicRecord {
            partitions_count: len_u32(partitions.len()),
            ..t.clone()
        },
    );
    for p in partitions {
        put_u32(out, p.id);
        put_u64(out, p.created_at);
        put_u32(out, p.segments_count);
        put_u64(out, p.current_offset);
        put_u64(out, p.size_bytes);
        put_u64(out, p.messages_count);
    }
}

/// GetTopics reply: `[count u32]` + headers.
pub fn topics_list(out: &mut Vec<u8>, topics: &[TopicRecord]) {
    put_u32(out, len_u32(topics.len()));
    for topic in topics {
        topic_header(out, topic);
    }
}

/// LoginRegisterResponse (after the result section).
pub fn login_response(out: &mut Vec<u8>, user_id: u32, session: u64, server_version: &str) {
    put_u32(out, user_id);
    put_u64(out, session);
    put_u32(out, SERVER_PROTOCOL_VERSION);
    put_name(out, server_version);
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNode {
    pub name: String,
    pub ip: String,
    pub tcp_port: u16,
    pub quic_port: u16,
    pub http_port: u16,
    pub websocket_port: u16,
    /// 0 leader, 1 follower.
    pub role: u8,
    /// 0 healthy.
    pub status: u8,
}

pub fn cluster_metadata(out: &mut Vec<u8>, cluster_name: &str, nodes: &[ClusterNode]) {
    put_long_str(out, cluster_name);
    put_u32(out, len_u32(nodes.len()));
    for node in nodes {
        cluster_node(out, node);
    }
}

/// One node record of cluster metadata: name, IP, four ports, role, status.
fn cluster_node(out: &mut Vec<u8>, node: &ClusterNode) {
    put_long_str(out, &node.name);
    put_long_str(out, &node.ip);
    put_u16(out, node.tcp_port);
    put_u16(out, node.quic_port);
    put_u16(out, node.http_port);
    put_u16(out, node.websocket_port);
    out.push(node.role);
    out.push(node.status);
}

/// GetPollRouting (103) and GetConsumerOffsetRouting (123) payload: the 32-byte attach block
/// (client u128, session u64, metadata watermark u64), then the partition primary's node
/// record as in [`cluster_metadata`].
pub fn poll_route(
    out: &mut Vec<u8>,
    client: u128,
    session: u64,
    metadata_watermark: u64,
    primary: &ClusterNode,
) {
    out.extend_from_slice(&client.to_le_bytes());
    out.extend_from_slice(&session.to_le_bytes());
    out.extend_from_slice(&metadata_watermark.to_le_bytes());
    cluster_node(out, primary);
}

/// GetStats payload (§6.1), every field present, no cache entries.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    pub process_id: u32,
    pub cpu_usage: f32,
    pub total_cpu_usage: f32,
    pub memory_usage: u64,
    pub total_memory: u64,
    pub available_memory: u64,
    pub run_time_us: u64,
    pub start_time_us: u64,
    pub read_bytes: u64,
    pub written_bytes: u64,
    pub messages_size_bytes: u64,
    pub streams_count: u32,
    pub topics_count: u32,
    pub partitions_count: u32,
    pub segments_count: u32,
    pub messages_count: u64,
    pub clients_count: u32,
    pub consumer_groups_count: u32,
    pub hostname: String,
    pub os_name: String,
    pub os_version: String,
    pub kernel_version: String,
    pub server_version: String,
    /// 0 = none.
    pub server_semver: u32,
    pub threads_count: u32,
    pub free_disk_space: u64,
    pub total_disk_space: u64,
}

pub fn stats(out: &mut Vec<u8>, s: &Stats) {
    put_u32(out, s.process_id);
    out.extend_from_slice(&s.cpu_usage.to_le_bytes());
    out.extend_from_slice(&s.total_cpu_usage.to_le_bytes());
    put_u64(out, s.memory_usage);
    put_u64(out, s.total_memory);
    put_u64(out, s.available_memory);
    put_u64(out, s.run_time_us);
    put_u64(out, s.start_time_us);
    put_u64(out, s.read_bytes);
    put_u64(out, s.written_bytes);
    put_u64(out, s.messages_size_bytes);
    put_u32(out, s.streams_count);
    put_u32(out, s.topics_count);
    put_u32(out, s.partitions_count);
    put_u32(out, s.segments_count);
    put_u64(out, s.messages_count);
    put_u32(out, s.clients_count);
    put_u32(out, s.consumer_groups_count);
    put_long_str(out, &s.hostname);
    put_long_str(out, &s.os_name);
    put_long_str(out, &s.os_version);
    put_long_str(out, &s.kernel_version);
    put_long_str(out, &s.server_version);
    put_u32(out, s.server_semver);
    // No per-partition cache metrics.
    put_u32(out, 0);
    put_u32(out, s.threads_count);
    put_u64(out, s.free_disk_space);
    put_u64(out, s.total_disk_space);
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientRecord {
    pub client_id: u32,
    pub user_id: Option<u32>,
    /// 1 TCP, 2 QUIC, 3 HTTP, 4 WebSocket.
    pub transport: u8,
    pub address: String,
    /// (stream_id, topic_id, group_id)
    pub consumer_groups: Vec<(u32, u32, u32)>,
}

/// Client record (count of groups, no entries).
pub fn client(out: &mut Vec<u8>, c: &ClientRecord) {
    put_u32(out, c.client_id);
    // u32::MAX is the client's "no user" marker.
    put_u32(out, c.user_id.unwrap_or(u32::MAX));
    out.push(c.transport);
    put_long_str(out, &c.address);
    put_u32(out, len_u32(c.consumer_groups.len()));
}

/// ClientDetails: the record then every group entry.
pub fn client_details(out: &mut Vec<u8>, c: &ClientRecord) {
    client(out, c);
    for &(stream_id, topic_id, group_id) in &c.consumer_groups {
        put_u32(out, stream_id);
        put_u32(out, topic_id);
        put_u32(out, group_id);
    }
}

/// GetConsumerOffset reply.
pub fn consumer_offset(out: &mut Vec<u8>, partition_id: u32, current_offset: u64, stored_offset: u64) {
    put_u32(out, partition_id);
    put_u64(out, current_offset);
    put_u64(out, stored_offset);
}

/// One send confirmation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendConfirmation {
    pub stream_id: u32,
    pub topic_id: u32,
    pub partition_id: u32,
    pub base_offset: u64,
}

/// SendMessages reply: `[count u32]` + 20-byte confirmations.
pub fn send_confirmations(out: &mut Vec<u8>, confirmations: &[SendConfirmation]) {
    put_u32(out, len_u32(confirmations.len()));
    for c in confirmations {
        put_u32(out, c.stream_id);
        put_u32(out, c.topic_id);
        put_u32(out, c.partition_id);
        put_u64(out, c.base_offset);
    }
}

/// The 16-byte poll reply head; whole batches follow it.
pub fn poll_head(out: &mut Vec<u8>, partition_id: u32, current_offset: u64, messages_count: u32) {
    put_u32(out, partition_id);
    put_u64(out, current_offset);
    put_u32(out, messages_count);
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserRecord {
    pub id: u32,
    pub created_at: u64,
    /// 1 active, 2 inactive.
    pub status: u8,
    pub username: String,
}

/// User record (with an empty option block).
pub fn user(out: &mut Vec<u8>, u: &UserRecord) {
    put_u32(out, u.id);
    put_u64(out, u.created_at);
    out.push(u.status);
    put_name(out, &u.username);
    empty_option_block(out);
}

/// UserDetails: user record + permissions (`[1][len u32][Permissions]`, or 4 zero bytes).
pub fn user_details(out: &mut Vec<u8>, u: &UserRecord, permissions: Option<&Permissions>) {
    user(out, u);
    match permissions {
        Some(p) => {
            out.push(1);
            let len_at = out.len();
            put_u32(out, 0);
            let start = out.len();
            self::permissions(out, p);
            let len = len_u32(out.len() - start);
            out[len_at..len_at + 4].copy_from_slice(&len.to_le_bytes());
        }
        // The client reads a 0 flag and then skips three more bytes.
        None => put_u32(out, 0),
    }
}

/// Encode Permissions as on the wire (without the presence flag and length).
pub fn permissions(out: &mut Vec<u8>, p: &Permissions) {
    let g = &p.global;
    put_bools(
        out,
        &[
            g.manage_servers,
            g.read_servers,
            g.manage_users,
            g.read_users,
            g.manage_streams,
            g.read_streams,
            g.manage_topics,
            g.read_topics,
            g.poll_messages,
            g.send_messages,
        ],
    );
    // Streams and topics are linked lists: a "has first" byte, then each entry followed by a
    // "has next" byte (§6.0, as the SDK's decoder reads them).
    out.push(u8::from(!p.streams.is_empty()));
    for (stream_index, (stream_id, s)) in p.streams.iter().enumerate() {
        put_u32(out, *stream_id);
        put_bools(
            out,
            &[
                s.manage_stream,
                s.read_stream,
                s.manage_topics,
                s.read_topics,
                s.poll_messages,
                s.send_messages,
            ],
        );
        out.push(u8::from(!s.topics.is_empty()));
        for (topic_index, (topic_id, t)) in s.topics.iter().enumerate() {
            put_u32(out, *topic_id);
            put_bools(
                out,
                &[t.manage_topic, t.read_topic, t.poll_messages, t.send_messages],
            );
            out.push(u8::from(topic_index + 1 < s.topics.len()));
        }
        out.push(u8::from(stream_index + 1 < p.streams.len()));
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupRecord {
    pub id: u32,
    pub partitions_count: u32,
    pub name: String,
    /// (member_id, assigned partition ids)
    pub members: Vec<(u32, Vec<u32>)>,
}

/// Group record (members_count, no member entries).
pub fn group(out: &mut Vec<u8>, g: &GroupRecord) {
    put_u32(out, g.id);
    put_u32(out, g.partitions_count);
    put_u32(out, len_u32(g.members.len()));
    put_name(out, &g.name);
}

/// GroupDetails: the record then every member.
pub fn group_details(out: &mut Vec<u8>, g: &GroupRecord) {
    group(out, g);
    for (member_id, partitions) in &g.members {
        put_u32(out, *member_id);
        put_u32(out, len_u32(partitions.len()));
        for &partition_id in partitions {
            put_u32(out, partition_id);
        }
    }
}

/// SyncConsumerGroup reply for a member.
pub fn group_sync(out: &mut Vec<u8>, generation: u64, partitions: &[u32]) {
    put_u64(out, generation);
    put_u32(out, len_u32(partitions.len()));
    for &partition_id in partitions {
        put_u32(out, partition_id);
    }
}

/// CreatePAT reply payload `[token Name]`.
pub fn pat_token(out: &mut Vec<u8>, token: &str) {
    put_name(out, token);
}

/// One GetPATs entry `[name Name][expiry_at u64 µs, 0 = never]`.
pub fn pat_entry(out: &mut Vec<u8>, name: &str, expiry_at_us: u64) {
    put_name(out, name);
    put_u64(out, expiry_at_us);
}

/// A committed rejection inside the result section: `[1][index 0][code]`, nothing after it.
/// Only for result-framed operations; everywhere else send the code as the header status.
pub fn rejected_result_section(out: &mut Vec<u8>, code: u32) {
    put_u32(out, 1);
    put_u32(out, 0);
    put_u32(out, code);
}

/// One DescribeOptions (13) entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionDescriptor {
    pub key: String,
    /// TLV kind of the value (1..=15).
    pub kind: u8,
    /// Default value, encoded as that kind.
    pub default_value: Vec<u8>,
    pub description: String,
}

/// DescribeOptions reply: `[count u32]` + `[key Name][kind u8][default_len u32][default]
/// [desc_len u32][desc]` per entry (count 0 is valid).
pub fn describe_options(out: &mut Vec<u8>, options: &[OptionDescriptor]) {
    put_u32(out, len_u32(options.len()));
    for option in options {
        put_name(out, &option.key);
        out.push(option.kind);
        put_u32(out, len_u32(option.default_value.len()));
        out.extend_from_slice(&option.default_value);
        put_long_str(out, &option.description);
    }
}

fn put_u16(out: &mut Vec<u8>, value: u16) {
    out.extend_from_slice(&value.to_le_bytes());
}

fn put_u32(out: &mut Vec<u8>, value: u32) {
    out.extend_from_slice(&value.to_le_bytes());
}

fn put_u64(out: &mut Vec<u8>, value: u64) {
    out.extend_from_slice(&value.to_le_bytes());
}

fn put_bools(out: &mut Vec<u8>, flags: &[bool]) {
    out.extend(flags.iter().map(|&flag| u8::from(flag)));
}

/// Reply lists and records are far below 4 GiB; saturating keeps a (never expected) overflow
/// from silently wrapping into a small, wrong count.
fn len_u32(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}

/// `Name` = `[len u8][utf-8]`. Names are validated to 1..=255 bytes when they are created; a
/// longer one is cut at the last char boundary within 255 bytes so the reply stays decodable
/// rather than carrying a length byte that disagrees with the bytes.
fn put_name(out: &mut Vec<u8>, name: &str) {
    let mut end = name.len().min(255);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    let bytes = &name.as_bytes()[..end];
    out.push(bytes.len() as u8);
    out.extend_from_slice(bytes);
}

/// `LStr` = `[len u32][utf-8]`.
fn put_long_str(out: &mut Vec<u8>, value: &str) {
    put_u32(out, len_u32(value.len()));
    out.extend_from_slice(value.as_bytes());
}

/// `[len u32 = 0]`: Cairn reports no option values in replies, and the client accepts an
/// empty block everywhere one is expected.
fn empty_option_block(out: &mut Vec<u8>) {
    put_u32(out, 0);
}
