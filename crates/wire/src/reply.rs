//! Reply payload encoders (protocol reference §4.2, §4.4, §5, §6, §7.4).
//!
//! Each function appends to `out`. The caller adds the result section (`[0u32]`) for
//! result-framed operations via [`ok_result_section`]; errors are sent as a status with an
//! empty body and need nothing from here.

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
    let _ = (out, s);
    todo!()
}

/// StreamDetails: the stream record then exactly `topics.len()` topic headers.
/// Debug-asserts `s.topics_count == topics.len()`.
pub fn stream_details(out: &mut Vec<u8>, s: &StreamRecord, topics: &[TopicRecord]) {
    let _ = (out, s, topics);
    todo!()
}

/// TopicHeader (with two empty option blocks).
pub fn topic_header(out: &mut Vec<u8>, t: &TopicRecord) {
    let _ = (out, t);
    todo!()
}

/// TopicDetails: header then exactly `partitions.len()` 40-byte partition records.
pub fn topic_details(out: &mut Vec<u8>, t: &TopicRecord, partitions: &[PartitionRecord]) {
    let _ = (out, t, partitions);
    todo!()
}

/// GetTopics reply: `[count u32]` + headers.
pub fn topics_list(out: &mut Vec<u8>, topics: &[TopicRecord]) {
    let _ = (out, topics);
    todo!()
}

/// LoginRegisterResponse (after the result section).
pub fn login_response(out: &mut Vec<u8>, user_id: u32, session: u64, server_version: &str) {
    let _ = (out, user_id, session, server_version);
    todo!()
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
    let _ = (out, cluster_name, nodes);
    todo!()
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
    let _ = (out, s);
    todo!()
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
    let _ = (out, c);
    todo!()
}

/// ClientDetails: the record then every group entry.
pub fn client_details(out: &mut Vec<u8>, c: &ClientRecord) {
    let _ = (out, c);
    todo!()
}

/// GetConsumerOffset reply.
pub fn consumer_offset(out: &mut Vec<u8>, partition_id: u32, current_offset: u64, stored_offset: u64) {
    let _ = (out, partition_id, current_offset, stored_offset);
    todo!()
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
    let _ = (out, confirmations);
    todo!()
}

/// The 16-byte poll reply head; whole batches follow it.
pub fn poll_head(out: &mut Vec<u8>, partition_id: u32, current_offset: u64, messages_count: u32) {
    let _ = (out, partition_id, current_offset, messages_count);
    todo!()
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
    let _ = (out, u);
    todo!()
}

/// UserDetails: user record + permissions (`[1][len u32][Permissions]`, or 4 zero bytes).
pub fn user_details(out: &mut Vec<u8>, u: &UserRecord, permissions: Option<&Permissions>) {
    let _ = (out, u, permissions);
    todo!()
}

/// Encode Permissions as on the wire (without the presence flag and length).
pub fn permissions(out: &mut Vec<u8>, p: &Permissions) {
    let _ = (out, p);
    todo!()
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
    let _ = (out, g);
    todo!()
}

/// GroupDetails: the record then every member.
pub fn group_details(out: &mut Vec<u8>, g: &GroupRecord) {
    let _ = (out, g);
    todo!()
}

/// SyncConsumerGroup reply for a member.
pub fn group_sync(out: &mut Vec<u8>, generation: u64, partitions: &[u32]) {
    let _ = (out, generation, partitions);
    todo!()
}

/// CreatePAT reply payload `[token Name]`.
pub fn pat_token(out: &mut Vec<u8>, token: &str) {
    let _ = (out, token);
    todo!()
}

/// One GetPATs entry `[name Name][expiry_at u64 µs, 0 = never]`.
pub fn pat_entry(out: &mut Vec<u8>, name: &str, expiry_at_us: u64) {
    let _ = (out, name, expiry_at_us);
    todo!()
}
