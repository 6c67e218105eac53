//! The HTTP shell: the REST API the 0.11 SDK's `HttpClient` speaks (protocol reference §10).
//!
//! This layer only translates: a request (path, query, JSON) becomes the same
//! [`cairn_wire::command::Command`] a binary client would send, it is applied through the same
//! [`Server::handle`] on a blocking thread, a send is completed through the same
//! [`handler::PreparedSend::complete`] (group commit), and the reply, which the handler gives
//! as values ([`handler::Typed`]; a poll's head as [`handler::PollHead`] with the stored
//! batches behind it), becomes JSON. No binary reply is parsed back here. Authentication,
//! limits and durability are therefore enforced once, in the handler, for both transports.
//!
//! HTTP has no connection-bound session, so a login mints a random bearer token mapped in
//! memory to a [`Session`] (user id) with an expiry; every request runs with a copy of that
//! session, or with a fresh unauthenticated one, which the handler answers with 40 (→ 401).
//!
//! Message bodies are bounded before they are buffered (see [`message_body_limit`]): a
//! declared `Content-Length` above the bound is refused at once, and a body that grows past it
//! while being read is refused as soon as it does.

mod admin;

use crate::auth;
use crate::handler::{self, Handled, Server, Session, Typed};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use cairn_wire::batch;
use cairn_wire::codes;
use cairn_wire::command::{ClientVersionInfo, Command};
use cairn_wire::reply;
use cairn_wire::types::{Consumer, Identifier, OptionEntry, Partitioning, PollingStrategy, value_kind};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::watch;

mod users;

/// How long a bearer token from `/users/login` stays valid. Tokens live in memory only: a
/// restart logs every HTTP client out, which the SDK handles by logging in again.
const TOKEN_LIFETIME: Duration = Duration::from_secs(60 * 60);

/// Bodies other than message sends (logins, stream/topic creation, offsets) are a few hundred
/// bytes; this bounds what such a request may make the server buffer.
const SMALL_BODY_LIMIT: usize = 64 * 1024;

/// Slack on top of the per-message bound in [`message_body_limit`], for the `partitioning`
/// section, the JSON punctuation around the list and any whitespace.
const MESSAGE_BODY_SLACK: u64 = 64 * 1024;

/// The largest POST `/messages` body accepted, derived from `limits.batch_bytes_max`.
///
/// Why twice the batch limit: a message costs `48 + payload + user headers` bytes in a batch.
/// In JSON its payload and raw user headers are base64 (4/3 of their size, plus padding) and
/// its fixed part (`{"id":<up to 39 digits or a 36-char UUID>,"payload":"","user_headers":""}`)
/// is under 96 bytes, i.e. under twice the 48-byte frame header. So every batch within
/// `batch_bytes_max` encodes in less than `2 × batch_bytes_max` plus slack, and a larger body
/// can only be an oversized batch (or padding): it is refused before it is buffered. Bodies
/// within the bound are decoded, encoded as a batch and checked by `batch::validate` with the
/// exact limits, like a TCP send. Structured user headers are the one form whose JSON can be
/// more than twice its binary size; a batch using them near the limit may be refused with
/// 4036 here even though its binary form would fit (use base64 headers for such batches).
pub fn message_body_limit(batch_bytes_max: u32) -> usize {
    let limit = 2 * u64::from(batch_bytes_max) + MESSAGE_BODY_SLACK;
    usize::try_from(limit).unwrap_or(usize::MAX)
}

struct TokenEntry {
    session: Session,
    expires_at: Instant,
}

struct HttpState {
    server: Arc<Server>,
    tokens: Mutex<HashMap<String, TokenEntry>>,
    message_body_limit: usize,
}

type Shared = Arc<HttpState>;

/// Serve HTTP on `listener` until `shutdown` flips to true; in-flight requests finish first.
pub async fn serve(server: Arc<Server>, listener: TcpListener, mut shutdown: watch::Receiver<bool>) {
    let state = Arc::new(HttpState {
        message_body_limit: message_body_limit(server.config.batch_bytes_max),
        server,
        tokens: Mutex::new(HashMap::new()),
    });
    let app = router(state).into_make_service_with_connect_info::<SocketAddr>();
    let stopping = async move {
        let _ = shutdown.wait_for(|stop| *stop).await;
    };
    if let Err(error) = axum::serve(listener, app).with_graceful_shutdown(stopping).await {
        tracing::error!(%error, "the HTTP shell stopped");
    }
}

fn router(state: Shared) -> Router {
    users::routes()
        .route("/ping", get(ping))
        .route("/cluster/status", get(cluster_status))
        .route("/users/login", axum::routing::post(login))
        .route("/users/logout", axum::routing::delete(logout))
        .route("/streams", get(get_streams).post(create_stream))
        .route("/streams/{stream}", get(get_stream).delete(delete_stream))
        .route("/streams/{stream}/topics", get(get_topics).post(create_topic))
        .route(
            "/streams/{stream}/topics/{topic}",
            get(get_topic).delete(delete_topic),
        )
        .route(
            "/streams/{stream}/topics/{topic}/messages",
            get(poll_messages).post(send_messages),
        )
        .route(
            "/streams/{stream}/topics/{topic}/consumer-offsets",
            get(get_consumer_offset).put(store_consumer_offset),
        )
        .merge(admin::routes())
        .layer(DefaultBodyLimit::max(SMALL_BODY_LIMIT))
        .with_state(state)
}

// ---- errors ----

/// An error answer: HTTP status plus `{"id": <iggy code>, "code": "<name>", "reason": "..."}`.
struct ApiError {
    status: StatusCode,
    id: u32,
    reason: String,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    id: u32,
    code: &'a str,
    reason: &'a str,
}

impl ApiError {
    fn new(id: u32, reason: impl Into<String>) -> ApiError {
        ApiError {
            status: http_status(id),
            id,
            reason: reason.into(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            id: self.id,
            code: code_name(self.id),
            reason: &self.reason,
        };
        let json = serde_json::to_vec(&body).unwrap_or_default();
        (self.status, [(header::CONTENT_TYPE, "application/json")], json).into_response()
    }
}

/// 401/403/404 are the statuses the SDK turns into Unauthenticated, Unauthorized and
/// ResourceNotFound (a single-object GET then returns `None`). 58 (not taken: nothing was
/// stored) is 503, which the SDK retries. Everything else is 400: a retried send is not
/// always idempotent (57 among them: the HTTP transport mints ids for messages without one,
/// so its resend would not be recognised).
fn http_status(code: u32) -> StatusCode {
    match code {
        codes::UNAUTHENTICATED | codes::INVALID_CREDENTIALS | codes::INVALID_PAT | codes::PAT_EXPIRED => {
            StatusCode::UNAUTHORIZED
        }
        codes::UNAUTHORIZED => StatusCode::FORBIDDEN,
        codes::RESOURCE_NOT_FOUND
        | codes::CLIENT_NOT_FOUND
        | codes::STREAM_ID_NOT_FOUND
        | codes::STREAM_NAME_NOT_FOUND
        | codes::TOPIC_ID_NOT_FOUND
        | codes::TOPIC_NAME_NOT_FOUND
        | codes::PARTITION_NOT_FOUND
        | codes::CONSUMER_OFFSET_NOT_FOUND
        | codes::CONSUMER_GROUP_ID_NOT_FOUND
        | codes::CONSUMER_GROUP_NAME_NOT_FOUND => StatusCode::NOT_FOUND,
        codes::TRANSIENT_NOT_ACCEPTED => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::BAD_REQUEST,
    }
}

/// The Iggy error name for the codes Cairn answers with (the `code` field of error bodies).
fn code_name(code: u32) -> &'static str {
    match code {
        codes::ERROR => "error",
        codes::INVALID_COMMAND => "invalid_command",
        codes::INVALID_FORMAT => "invalid_format",
        codes::FEATURE_UNAVAILABLE => "feature_unavailable",
        codes::INVALID_IDENTIFIER => "invalid_identifier",
        codes::RESOURCE_NOT_FOUND => "resource_not_found",
        codes::UNAUTHENTICATED => "unauthenticated",
        codes::UNAUTHORIZED => "unauthorized",
        codes::INVALID_CREDENTIALS => "invalid_credentials",
        codes::INVALID_USERNAME => "invalid_username",
        codes::INVALID_PASSWORD => "invalid_password",
        45 => "invalid_user_status",
        codes::USER_ALREADY_EXISTS => "user_already_exists",
        codes::USER_INACTIVE => "user_inactive",
        48 => "cannot_delete_user",
        49 => "cannot_change_permissions",
        50 => "invalid_personal_access_token_name",
        codes::PAT_ALREADY_EXISTS => "personal_access_token_already_exists",
        52 => "personal_access_tokens_limit_reached",
        55 => "users_limit_reached",
        codes::INVALID_PAT => "invalid_personal_access_token",
        codes::PAT_EXPIRED => "personal_access_token_expired",
        codes::TRANSIENT_NOT_COMMITTED => "transient_not_committed",
        codes::TRANSIENT_NOT_ACCEPTED => "transient_not_accepted",
        codes::STREAM_ID_NOT_FOUND => "stream_id_not_found",
        codes::STREAM_NAME_NOT_FOUND => "stream_name_not_found",
        codes::STREAM_NAME_ALREADY_EXISTS => "stream_name_already_exists",
        codes::INVALID_STREAM_NAME => "invalid_stream_name",
        codes::TOPIC_ID_NOT_FOUND => "topic_id_not_found",
        codes::TOPIC_NAME_NOT_FOUND => "topic_name_not_found",
        codes::TOPIC_NAME_ALREADY_EXISTS => "topic_name_already_exists",
        codes::INVALID_TOPIC_NAME => "invalid_topic_name",
        codes::INVALID_PARTITIONS_COUNT => "invalid_partitions_count",
        codes::PARTITION_NOT_FOUND => "partition_not_found",
        codes::NO_PARTITIONS => "no_partitions",
        codes::CONSUMER_OFFSET_NOT_FOUND => "consumer_offset_not_found",
        codes::INVALID_MESSAGES_COUNT => "invalid_messages_count",
        codes::TOO_BIG_USER_HEADERS => "too_big_user_headers",
        codes::TOO_BIG_MESSAGE_PAYLOAD => "too_big_message_payload",
        codes::EMPTY_MESSAGE_PAYLOAD => "empty_message_payload",
        codes::INVALID_MESSAGE_CHECKSUM => "invalid_message_checksum",
        codes::INVALID_BATCH_CHECKSUM => "invalid_batch_checksum",
        codes::TOO_MANY_MESSAGES => "too_many_messages",
        codes::INVALID_MESSAGES_SIZE => "invalid_messages_size",
        codes::UNSUPPORTED_OPTION_KEY => "unsupported_option_key",
        codes::INVALID_OPTION_VALUE => "invalid_option_value",
        codes::INVALID_RESERVED_FIELD => "invalid_reserved_field",
        codes::CONSUMER_GROUP_MEMBER_NOT_FOUND => "consumer_group_member_not_found",
        crate::partition::PARTITION_REFUSED_STATUS => "cannot_open_partition_log_file",
        _ => "error",
    }
}

/// A readable reason for a status from the handler (which answers with codes only). Limit
/// errors name the configured limit, so a refused send says what it exceeded.
fn reason(server: &Server, code: u32) -> String {
    let config = &server.config;
    match code {
        codes::TOO_BIG_MESSAGE_PAYLOAD => format!(
            "a message payload exceeds limits.message_payload_bytes_max ({} bytes); nothing was written",
            config.message_payload_bytes_max
        ),
        codes::TOO_BIG_USER_HEADERS => format!(
            "a message's user headers exceed limits.user_headers_bytes_max ({} bytes); nothing was written",
            config.user_headers_bytes_max
        ),
        codes::INVALID_MESSAGES_SIZE => format!(
            "the batch exceeds limits.batch_bytes_max ({} bytes); nothing was written",
            config.batch_bytes_max
        ),
        codes::TOO_MANY_MESSAGES => format!(
            "the batch has more messages than limits.batch_messages_max ({}); nothing was written",
            config.batch_messages_max
        ),
        code => format!("request refused with Iggy status {code} ({})", code_name(code)),
    }
}

// ---- sessions and applying commands ----

impl HttpState {
    /// The session of the bearer token, or a fresh unauthenticated one (the handler then
    /// refuses everything but ping and login with 40).
    fn session(&self, headers: &HeaderMap, peer: SocketAddr) -> Session {
        if let Some(token) = bearer(headers) {
            let mut tokens = lock(&self.tokens);
            match tokens.get(token) {
                Some(entry) if entry.expires_at > Instant::now() => return entry.session.clone(),
                Some(_) => {
                    if let Some(expired) = tokens.remove(token) {
                        self.server.unregister_client(expired.session.client_id);
                    }
                }
                None => {}
            }
        }
        self.server.new_session(peer.to_string(), handler::TRANSPORT_HTTP)
    }

    /// Apply `command` through the one request path: `Server::handle` on a blocking thread
    /// and, for a send, the prepared send's completion (the partition writer's group commit).
    async fn apply(&self, session: Session, command: Command) -> Result<(Typed, Session), ApiError> {
        let (handled, session) = self.handled(session, command).await?;
        let reply = match handled {
            Handled::Done(reply) => reply,
            Handled::Send(send) => send.complete().await,
            // Polls go through `poll`.
            Handled::Prefixed(_) => return Err(unexpected_reply()),
        };
        match reply {
            Ok(typed) => Ok((typed, session)),
            Err(code) => Err(self.refused(code)),
        }
    }

    fn refused(&self, code: u32) -> ApiError {
        ApiError::new(code, reason(&self.server, code))
    }

    /// Run `command` in the session of the request's bearer token; the reply as values.
    async fn run(&self, headers: &HeaderMap, peer: SocketAddr, command: Command) -> Result<Typed, ApiError> {
        let session = self.session(headers, peer);
        self.apply(session, command).await.map(|(typed, _)| typed)
    }

    /// Run a poll: the reply's head as values and the stored batches behind it.
    async fn poll(
        &self,
        headers: &HeaderMap,
        peer: SocketAddr,
        command: Command,
    ) -> Result<(handler::PollHead, Vec<u8>), ApiError> {
        let session = self.session(headers, peer);
        match self.handled(session, command).await?.0 {
            Handled::Prefixed(Ok(payload)) => {
                let head = payload.head();
                let batches = payload.into_batches().map_err(|error| {
                    tracing::error!(%error, "reading a poll's batches failed");
                    ApiError::new(codes::ERROR, reason(&self.server, codes::ERROR))
                })?;
                Ok((head, batches))
            }
            Handled::Prefixed(Err(code)) | Handled::Done(Err(code)) => Err(self.refused(code)),
            Handled::Done(Ok(_)) | Handled::Send(_) => Err(unexpected_reply()),
        }
    }

    /// [`Server::handle`] on a blocking thread.
    async fn handled(&self, session: Session, command: Command) -> Result<(Handled, Session), ApiError> {
        let server = self.server.clone();
        let joined = tokio::task::spawn_blocking(move || {
            let mut session = session;
            let handled = server.handle(&mut session, command);
            (handled, session)
        })
        .await;
        joined.map_err(|error| {
            tracing::error!(%error, "request handler panicked");
            ApiError::new(codes::ERROR, "internal error")
        })
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The token map holds no invariant a panicking holder could break half-way.
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let token = value.strip_prefix("Bearer ")?.trim();
    (!token.is_empty()).then_some(token)
}

/// A path or query id as the SDK writes it: the number, or the name.
fn identifier(text: &str) -> Result<Identifier, ApiError> {
    if let Ok(id) = text.parse::<u32>() {
        return Ok(Identifier::Numeric(id));
    }
    if text.is_empty() || text.len() > 255 {
        return Err(ApiError::new(
            codes::INVALID_IDENTIFIER,
            format!("invalid identifier `{text}`"),
        ));
    }
    Ok(Identifier::Name(text.to_string()))
}

fn parse_json<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::new(codes::INVALID_FORMAT, format!("invalid JSON body: {e}")))
}

fn json<T: Serialize>(status: StatusCode, value: &T) -> Response {
    match serde_json::to_vec(value) {
        Ok(body) => (status, [(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(error) => {
            tracing::error!(%error, "encoding a JSON reply failed");
            ApiError::new(codes::ERROR, "cannot encode the reply").into_response()
        }
    }
}

/// The handler answered a command with a reply of another kind: a server bug, logged.
fn unexpected_reply() -> ApiError {
    tracing::error!("the handler's reply does not match the HTTP route's command");
    ApiError::new(codes::ERROR, "internal error: unexpected reply kind")
}

type Peer = ConnectInfo<SocketAddr>;
type ApiResult = Result<Response, ApiError>;

// ---- system and users ----

async fn ping(State(state): State<Shared>, ConnectInfo(peer): Peer, headers: HeaderMap) -> ApiResult {
    state.run(&headers, peer, Command::Ping).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `GET /cluster/status`: this node's replicas, their roles and positions, and which peers
/// its replica network reaches (what `cairn status` gathers from every node). Open without
/// sign-in, like `/ping`: it holds topology and positions, no data and no names.
async fn cluster_status(State(state): State<Shared>) -> Response {
    let server = state.server.clone();
    let groups =
        match tokio::task::spawn_blocking(move || crate::catalog::replica_statuses(&server.catalog)).await {
            Ok(groups) => groups,
            Err(_) => return StatusCode::INTERNAL_SERVER_ERROR.into_response(),
        };
    let groups: Vec<serde_json::Value> = groups
        .into_iter()
        .map(|(group, status)| serde_json::json!({ "group": group, "replica": status }))
        .collect();
    let (node_id, peers) = match &state.server.cluster {
        Some(cluster) => (
            cluster.config.node_id,
            cluster
                .config
                .nodes
                .iter()
                .enumerate()
                .filter(|(index, _)| *index != usize::from(cluster.index))
                .map(|(index, node)| {
                    serde_json::json!({ "id": node.id, "connected": cluster.bus.is_connected(index as u8) })
                })
                .collect(),
        ),
        None => (0, Vec::new()),
    };
    axum::Json(serde_json::json!({ "node_id": node_id, "peers": peers, "groups": groups })).into_response()
}

#[derive(Deserialize)]
struct LoginBody {
    username: String,
    password: String,
}

#[derive(Serialize)]
struct IdentityJson {
    user_id: u32,
    access_token: TokenJson,
}

#[derive(Serialize)]
struct TokenJson {
    token: String,
    /// Unix seconds.
    expiry: u64,
}

async fn login(State(state): State<Shared>, ConnectInfo(peer): Peer, body: Bytes) -> ApiResult {
    let body: LoginBody = parse_json(&body)?;
    let command = Command::LoginUser {
        version: ClientVersionInfo {
            protocol_version: cairn_wire::frame::PROTOCOL_VERSION_MIN,
            sdk_name: "http".to_string(),
            sdk_version: String::new(),
        },
        username: body.username,
        password: body.password,
    };
    start_session(&state, peer, command).await
}

/// Run a login command on a fresh session and, if it succeeds, hand out a bearer token for
/// that session (the HTTP client it stands for is listed by GetClients until logout or
/// expiry).
async fn start_session(state: &Shared, peer: SocketAddr, command: Command) -> ApiResult {
    let session = state
        .server
        .new_session(peer.to_string(), handler::TRANSPORT_HTTP);
    let (_, session) = state.apply(session, command).await?;
    let Some(user_id) = session.user_id else {
        return Err(ApiError::new(codes::ERROR, "login succeeded without a user"));
    };
    let token = auth::random_secret(48);
    let now = Instant::now();
    {
        let mut tokens = lock(&state.tokens);
        // Logins are the only way the map grows; dropping expired tokens here bounds it by
        // the logins of one token lifetime.
        tokens.retain(|_, entry| {
            let live = entry.expires_at > now;
            if !live {
                state.server.unregister_client(entry.session.client_id);
            }
            live
        });
        // Each HTTP login is one client (GetClients) until its logout or expiry.
        state.server.register_client(&session);
        tokens.insert(
            token.clone(),
            TokenEntry {
                session,
                expires_at: now + TOKEN_LIFETIME,
            },
        );
    }
    let expiry = state.server.clock.now_us() / 1_000_000 + TOKEN_LIFETIME.as_secs();
    Ok(json(
        StatusCode::OK,
        &IdentityJson {
            user_id,
            access_token: TokenJson { token, expiry },
        },
    ))
}

async fn logout(State(state): State<Shared>, ConnectInfo(peer): Peer, headers: HeaderMap) -> ApiResult {
    state.run(&headers, peer, Command::Logout).await?;
    if let Some(token) = bearer(&headers)
        && let Some(entry) = lock(&state.tokens).remove(token)
    {
        state.server.unregister_client(entry.session.client_id);
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

// ---- streams and topics ----

#[derive(Serialize)]
struct StreamJson {
    id: u32,
    created_at: u64,
    name: String,
    size: u64,
    messages_count: u64,
    topics_count: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    topics: Option<Vec<TopicJson>>,
}

#[derive(Serialize)]
struct TopicJson {
    id: u32,
    created_at: u64,
    name: String,
    size: u64,
    message_expiry: u64,
    compression_algorithm: &'static str,
    max_topic_size: u64,
    messages_count: u64,
    partitions_count: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    partitions: Option<Vec<PartitionJson>>,
}

#[derive(Serialize)]
struct PartitionJson {
    id: u32,
    created_at: u64,
    segments_count: u32,
    current_offset: u64,
    size: u64,
    messages_count: u64,
}

impl StreamJson {
    fn new(stream: reply::StreamRecord, topics: Option<Vec<reply::TopicRecord>>) -> StreamJson {
        StreamJson {
            id: stream.id,
            created_at: stream.created_at,
            name: stream.name,
            size: stream.size_bytes,
            messages_count: stream.messages_count,
            topics_count: stream.topics_count,
            topics: topics.map(|topics| topics.into_iter().map(|t| TopicJson::new(t, None)).collect()),
        }
    }
}

impl TopicJson {
    fn new(topic: reply::TopicRecord, partitions: Option<Vec<reply::PartitionRecord>>) -> TopicJson {
        TopicJson {
            id: topic.id,
            created_at: topic.created_at,
            name: topic.name,
            size: topic.size_bytes,
            message_expiry: topic.message_expiry,
            compression_algorithm: match topic.compression {
                2 => "gzip",
                _ => "none",
            },
            max_topic_size: topic.max_topic_size,
            messages_count: topic.messages_count,
            partitions_count: topic.partitions_count,
            partitions: partitions.map(|partitions| {
                partitions
                    .into_iter()
                    .map(|p| PartitionJson {
                        id: p.id,
                        created_at: p.created_at,
                        segments_count: p.segments_count,
                        current_offset: p.current_offset,
                        size: p.size_bytes,
                        messages_count: p.messages_count,
                    })
                    .collect()
            }),
        }
    }
}

async fn get_streams(State(state): State<Shared>, ConnectInfo(peer): Peer, headers: HeaderMap) -> ApiResult {
    let Typed::Streams(streams) = state.run(&headers, peer, Command::GetStreams).await? else {
        return Err(unexpected_reply());
    };
    let streams: Vec<StreamJson> = streams.into_iter().map(|s| StreamJson::new(s, None)).collect();
    Ok(json(StatusCode::OK, &streams))
}

/// A stream with its topics; none means "no such stream" (404).
fn stream_details(typed: Typed) -> Result<StreamJson, ApiError> {
    match typed {
        Typed::Stream(Some(details)) => {
            let details = *details;
            Ok(StreamJson::new(details.stream, Some(details.topics)))
        }
        Typed::Stream(None) => Err(ApiError::new(codes::RESOURCE_NOT_FOUND, "stream not found")),
        _ => Err(unexpected_reply()),
    }
}

/// A topic with its partitions; none means "no such topic" (404).
fn topic_details(typed: Typed) -> Result<TopicJson, ApiError> {
    match typed {
        Typed::Topic(Some(details)) => {
            let details = *details;
            Ok(TopicJson::new(details.topic, Some(details.partitions)))
        }
        Typed::Topic(None) => Err(ApiError::new(codes::RESOURCE_NOT_FOUND, "topic not found")),
        _ => Err(unexpected_reply()),
    }
}

async fn get_stream(
    State(state): State<Shared>,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(stream): Path<String>,
) -> ApiResult {
    let command = Command::GetStream {
        stream: identifier(&stream)?,
    };
    let typed = state.run(&headers, peer, command).await?;
    Ok(json(StatusCode::OK, &stream_details(typed)?))
}

#[derive(Deserialize)]
struct CreateStreamBody {
    name: String,
}

async fn create_stream(
    State(state): State<Shared>,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult {
    let body: CreateStreamBody = parse_json(&body)?;
    let command = Command::CreateStream {
        name: body.name,
        options: Vec::new(),
    };
    let typed = state.run(&headers, peer, command).await?;
    Ok(json(StatusCode::CREATED, &stream_details(typed)?))
}

async fn delete_stream(
    State(state): State<Shared>,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(stream): Path<String>,
) -> ApiResult {
    let command = Command::DeleteStream {
        stream: identifier(&stream)?,
    };
    state.run(&headers, peer, command).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn get_topics(
    State(state): State<Shared>,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(stream): Path<String>,
) -> ApiResult {
    let command = Command::GetTopics {
        stream: identifier(&stream)?,
    };
    let Typed::Topics(topics) = state.run(&headers, peer, command).await? else {
        return Err(unexpected_reply());
    };
    let topics: Vec<TopicJson> = topics.into_iter().map(|t| TopicJson::new(t, None)).collect();
    Ok(json(StatusCode::OK, &topics))
}

async fn get_topic(
    State(state): State<Shared>,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((stream, topic)): Path<(String, String)>,
) -> ApiResult {
    let command = Command::GetTopic {
        stream: identifier(&stream)?,
        topic: identifier(&topic)?,
    };
    let typed = state.run(&headers, peer, command).await?;
    Ok(json(StatusCode::OK, &topic_details(typed)?))
}

#[derive(Deserialize)]
struct CreateTopicBody {
    name: String,
    #[serde(default = "one")]
    partitions_count: u32,
    #[serde(default)]
    compression_algorithm: Option<String>,
    #[serde(default)]
    message_expiry: Option<u64>,
    #[serde(default)]
    max_topic_size: Option<u64>,
    #[serde(default)]
    options: std::collections::BTreeMap<String, String>,
}

fn one() -> u32 {
    1
}

/// The topic fields of the JSON body become the option entries the binary client sends for
/// them (§6.5), so the handler checks them exactly as for TCP.
fn topic_options(body: &CreateTopicBody) -> Vec<OptionEntry> {
    let mut options = Vec::new();
    if let Some(compression) = &body.compression_algorithm {
        options.push(OptionEntry {
            key: "compression_algorithm".to_string(),
            value_kind: value_kind::STRING,
            value: compression.clone().into_bytes(),
        });
    }
    for (key, value) in [
        ("message_expiry", body.message_expiry),
        ("max_topic_size", body.max_topic_size),
    ] {
        if let Some(value) = value {
            options.push(OptionEntry {
                key: key.to_string(),
                value_kind: value_kind::UINT64,
                value: value.to_le_bytes().to_vec(),
            });
        }
    }
    for (key, value) in &body.options {
        options.push(OptionEntry {
            key: key.clone(),
            value_kind: value_kind::STRING,
            value: value.clone().into_bytes(),
        });
    }
    options
}

async fn create_topic(
    State(state): State<Shared>,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(stream): Path<String>,
    body: Bytes,
) -> ApiResult {
    let body: CreateTopicBody = parse_json(&body)?;
    let command = Command::CreateTopic {
        stream: identifier(&stream)?,
        partitions_count: body.partitions_count,
        options: topic_options(&body),
        name: body.name,
    };
    let typed = state.run(&headers, peer, command).await?;
    Ok(json(StatusCode::CREATED, &topic_details(typed)?))
}

async fn delete_topic(
    State(state): State<Shared>,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((stream, topic)): Path<(String, String)>,
) -> ApiResult {
    let command = Command::DeleteTopic {
        stream: identifier(&stream)?,
        topic: identifier(&topic)?,
    };
    state.run(&headers, peer, command).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

// ---- messages ----

#[derive(Deserialize)]
struct SendBody {
    partitioning: PartitioningJson,
    messages: Vec<MessageJsonIn>,
}

#[derive(Deserialize)]
struct PartitioningJson {
    kind: String,
    #[serde(default)]
    value: String,
}

#[derive(Deserialize)]
struct MessageJsonIn {
    #[serde(default)]
    id: MessageId,
    payload: String,
    #[serde(default)]
    user_headers: Option<serde_json::Value>,
}

/// A message id as the SDK and other HTTP clients send it: a number, a decimal string or a
/// UUID string. 0 or absent means "server, pick one".
#[derive(Default)]
struct MessageId(u128);

impl<'de> Deserialize<'de> for MessageId {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<MessageId, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = MessageId;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a non-negative integer, a decimal string or a UUID")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<MessageId, E> {
                Ok(MessageId(u128::from(v)))
            }
            fn visit_u128<E: serde::de::Error>(self, v: u128) -> Result<MessageId, E> {
                Ok(MessageId(v))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<MessageId, E> {
                if let Ok(id) = v.parse::<u128>() {
                    return Ok(MessageId(id));
                }
                let hex: String = v.chars().filter(|c| *c != '-').collect();
                if hex.len() == 32
                    && let Ok(id) = u128::from_str_radix(&hex, 16)
                {
                    return Ok(MessageId(id));
                }
                Err(E::custom(format!("invalid message id `{v}`")))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// A random UUIDv4-shaped id, what the binary SDK puts in place of id 0.
fn random_message_id() -> u128 {
    let raw: u128 = rand::random();
    (raw & !(0xf << 76) | (0x4 << 76)) & !(0x3 << 62) | (0x2 << 62)
}

fn decode_base64(text: &str, what: &str) -> Result<Vec<u8>, ApiError> {
    BASE64
        .decode(text)
        .map_err(|e| ApiError::new(codes::INVALID_FORMAT, format!("{what} is not valid base64: {e}")))
}

fn partitioning(json: &PartitioningJson) -> Result<Partitioning, ApiError> {
    let value = decode_base64(&json.value, "partitioning value")?;
    match json.kind.as_str() {
        "balanced" => Ok(Partitioning::Balanced),
        "partition_id" => {
            let raw: [u8; 4] = value.as_slice().try_into().map_err(|_| {
                ApiError::new(
                    codes::INVALID_FORMAT,
                    "a partition_id value must be 4 bytes (u32 LE)",
                )
            })?;
            Ok(Partitioning::PartitionId(u32::from_le_bytes(raw)))
        }
        "messages_key" if (1..=255).contains(&value.len()) => Ok(Partitioning::MessagesKey(value)),
        "messages_key" => Err(ApiError::new(
            codes::INVALID_FORMAT,
            "a messages_key value must be 1 to 255 bytes",
        )),
        other => Err(ApiError::new(
            codes::INVALID_FORMAT,
            format!("unknown partitioning kind `{other}`"),
        )),
    }
}

/// User headers in either JSON form, as the TLV block a binary client sends: a base64 string
/// is the block itself; a list of `{"key":{"kind","value"},"value":{"kind","value"}}` entries
/// is encoded as `[kind u8][len u32][bytes]` key then value, per entry.
fn user_headers(value: Option<&serde_json::Value>) -> Result<Vec<u8>, ApiError> {
    let invalid =
        |reason: &str| ApiError::new(codes::INVALID_FORMAT, format!("invalid user_headers: {reason}"));
    match value {
        None | Some(serde_json::Value::Null) => Ok(Vec::new()),
        Some(serde_json::Value::String(text)) => decode_base64(text, "user_headers"),
        Some(serde_json::Value::Array(entries)) => {
            let mut out = Vec::new();
            for entry in entries {
                for part in ["key", "value"] {
                    let item = entry
                        .get(part)
                        .ok_or_else(|| invalid("an entry lacks key or value"))?;
                    let kind = item
                        .get("kind")
                        .and_then(|k| k.as_str())
                        .and_then(header_kind_code)
                        .ok_or_else(|| invalid("unknown or missing kind"))?;
                    let bytes = item
                        .get("value")
                        .and_then(|v| v.as_str())
                        .ok_or_else(|| invalid("missing value"))
                        .and_then(|v| decode_base64(v, "a user header"))?;
                    let len = u32::try_from(bytes.len()).map_err(|_| invalid("value too long"))?;
                    out.push(kind);
                    out.extend_from_slice(&len.to_le_bytes());
                    out.extend_from_slice(&bytes);
                }
            }
            Ok(out)
        }
        Some(_) => Err(invalid("expected a base64 string or a list of entries")),
    }
}

fn header_kind_code(name: &str) -> Option<u8> {
    let code = match name {
        "raw" => 1,
        "string" => 2,
        "bool" => 3,
        "int8" => 4,
        "int16" => 5,
        "int32" => 6,
        "int64" => 7,
        "int128" => 8,
        "uint8" => 9,
        "uint16" => 10,
        "uint32" => 11,
        "uint64" => 12,
        "uint128" => 13,
        "float32" => 14,
        "float64" => 15,
        _ => return None,
    };
    Some(code)
}

#[derive(Serialize)]
struct ConfirmationsJson {
    confirmations: Vec<ConfirmationJson>,
}

#[derive(Serialize)]
struct ConfirmationJson {
    stream_id: u32,
    topic_id: u32,
    partition_id: u32,
    base_offset: u64,
}

fn too_big_body(limit: usize) -> ApiError {
    ApiError {
        status: StatusCode::PAYLOAD_TOO_LARGE,
        id: codes::INVALID_MESSAGES_SIZE,
        reason: format!(
            "request body exceeds {limit} bytes, the most a batch within limits.batch_bytes_max can take in JSON; nothing was read or written"
        ),
    }
}

async fn send_messages(
    State(state): State<Shared>,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((stream, topic)): Path<(String, String)>,
    body: Body,
) -> ApiResult {
    let limit = state.message_body_limit;
    // Refuse on the declared length before reading a byte of the body.
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit as u64) {
        return Err(too_big_body(limit));
    }
    // Chunked bodies (no length) are cut off as soon as they pass the limit.
    let body = axum::body::to_bytes(body, limit)
        .await
        .map_err(|_| too_big_body(limit))?;
    let body: SendBody = parse_json(&body)?;
    let partitioning = partitioning(&body.partitioning)?;
    let now_us = state.server.clock.now_us();
    let mut decoded = Vec::with_capacity(body.messages.len());
    for message in &body.messages {
        let id = match message.id.0 {
            0 => random_message_id(),
            id => id,
        };
        let payload = decode_base64(&message.payload, "payload")?;
        let headers = user_headers(message.user_headers.as_ref())?;
        decoded.push((id, payload, headers));
    }
    let messages: Vec<batch::MessageIn<'_>> = decoded
        .iter()
        .map(|(id, payload, headers)| batch::MessageIn {
            id: *id,
            // HTTP carries no origin timestamp: the receive time stands in for it.
            origin_timestamp: now_us,
            payload,
            user_headers: headers,
        })
        .collect();
    let messages_count = u32::try_from(messages.len()).map_err(|_| {
        ApiError::new(
            codes::TOO_MANY_MESSAGES,
            reason(&state.server, codes::TOO_MANY_MESSAGES),
        )
    })?;
    let batch = batch::encode(&messages).ok_or_else(|| {
        ApiError::new(
            codes::INVALID_MESSAGES_SIZE,
            reason(&state.server, codes::INVALID_MESSAGES_SIZE),
        )
    })?;
    drop(messages);
    drop(decoded);
    let command = Command::SendMessages {
        stream: identifier(&stream)?,
        topic: identifier(&topic)?,
        partitioning,
        messages_count,
        batch: batch.into(),
    };
    let Typed::Sent(sent) = state.run(&headers, peer, command).await? else {
        return Err(unexpected_reply());
    };
    let confirmations = vec![ConfirmationJson {
        stream_id: sent.stream_id,
        topic_id: sent.topic_id,
        partition_id: sent.partition_id,
        base_offset: sent.base_offset,
    }];
    Ok(json(StatusCode::CREATED, &ConfirmationsJson { confirmations }))
}

#[derive(Deserialize)]
struct PollQuery {
    #[serde(default)]
    consumer_id: Option<String>,
    #[serde(default)]
    partition_id: Option<u32>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    value: Option<u64>,
    #[serde(default)]
    count: Option<u32>,
    #[serde(default)]
    auto_commit: Option<bool>,
}

#[derive(Serialize)]
struct PolledJson {
    partition_id: u32,
    current_offset: u64,
    count: u32,
    messages: Vec<PolledMessageJson>,
}

#[derive(Serialize)]
struct PolledMessageJson {
    header: MessageHeaderJson,
    payload: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    user_headers: Option<String>,
}

#[derive(Serialize)]
struct MessageHeaderJson {
    checksum: u64,
    id: u128,
    offset: u64,
    timestamp: u64,
    origin_timestamp: u64,
    user_headers_length: u32,
    payload_length: u32,
    reserved: u64,
}

/// Consumer ids travel as text over HTTP (the kind is never sent: always a plain consumer).
fn consumer(id: Option<&str>) -> Result<Consumer, ApiError> {
    Ok(Consumer::Consumer(match id {
        Some(id) => identifier(id)?,
        None => Identifier::Numeric(0),
    }))
}

fn strategy(kind: Option<&str>, value: u64) -> Result<PollingStrategy, ApiError> {
    Ok(match kind.unwrap_or("offset") {
        "offset" => PollingStrategy::Offset(value),
        "timestamp" => PollingStrategy::Timestamp(value),
        "first" => PollingStrategy::First,
        "last" => PollingStrategy::Last,
        "next" => PollingStrategy::Next,
        other => {
            return Err(ApiError::new(
                codes::INVALID_FORMAT,
                format!("unknown polling kind `{other}`"),
            ));
        }
    })
}

async fn poll_messages(
    State(state): State<Shared>,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((stream, topic)): Path<(String, String)>,
    Query(query): Query<PollQuery>,
) -> ApiResult {
    let command = Command::PollMessages {
        consumer: consumer(query.consumer_id.as_deref())?,
        stream: identifier(&stream)?,
        topic: identifier(&topic)?,
        partition_id: query.partition_id,
        strategy: strategy(query.kind.as_deref(), query.value.unwrap_or(0))?,
        count: query.count.unwrap_or(10),
        auto_commit: query.auto_commit.unwrap_or(false),
    };
    let (head, batches) = state.poll(&headers, peer, command).await?;
    // The batches are stored data the handler verified when it read them; they are decoded
    // into messages here because JSON lists messages, not batches.
    let messages = batch::messages(&batches).ok_or_else(|| {
        tracing::error!("a poll's stored batches did not decode in the HTTP shell");
        ApiError::new(codes::ERROR, "internal error: stored batches did not decode")
    })?;
    let messages: Vec<PolledMessageJson> = messages
        .iter()
        .map(|m| PolledMessageJson {
            header: MessageHeaderJson {
                checksum: m.checksum,
                id: m.id,
                offset: m.offset,
                timestamp: m.timestamp,
                origin_timestamp: m.origin_timestamp,
                user_headers_length: m.user_headers.len() as u32,
                payload_length: m.payload.len() as u32,
                reserved: 0,
            },
            payload: BASE64.encode(m.payload),
            user_headers: (!m.user_headers.is_empty()).then(|| BASE64.encode(m.user_headers)),
        })
        .collect();
    let polled = PolledJson {
        partition_id: head.partition_id,
        current_offset: head.current_offset,
        count: u32::try_from(messages.len()).unwrap_or(u32::MAX),
        messages,
    };
    Ok(json(StatusCode::OK, &polled))
}

// ---- consumer offsets ----

#[derive(Deserialize)]
struct OffsetQuery {
    #[serde(default)]
    consumer_id: Option<String>,
    #[serde(default)]
    partition_id: Option<u32>,
}

#[derive(Deserialize)]
struct StoreOffsetBody {
    #[serde(default)]
    consumer_id: Option<serde_json::Value>,
    #[serde(default)]
    partition_id: Option<u32>,
    offset: u64,
}

#[derive(Serialize)]
struct OffsetJson {
    partition_id: u32,
    current_offset: u64,
    stored_offset: u64,
}

async fn get_consumer_offset(
    State(state): State<Shared>,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((stream, topic)): Path<(String, String)>,
    Query(query): Query<OffsetQuery>,
) -> ApiResult {
    let command = Command::GetConsumerOffset {
        consumer: consumer(query.consumer_id.as_deref())?,
        stream: identifier(&stream)?,
        topic: identifier(&topic)?,
        partition_id: query.partition_id,
    };
    let Typed::ConsumerOffset(offset) = state.run(&headers, peer, command).await? else {
        return Err(unexpected_reply());
    };
    let Some(offset) = offset else {
        return Err(ApiError::new(
            codes::CONSUMER_OFFSET_NOT_FOUND,
            "no offset stored",
        ));
    };
    let offset = OffsetJson {
        partition_id: offset.partition_id,
        current_offset: offset.current_offset,
        stored_offset: offset.stored_offset,
    };
    Ok(json(StatusCode::OK, &offset))
}

async fn store_consumer_offset(
    State(state): State<Shared>,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((stream, topic)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult {
    let body: StoreOffsetBody = parse_json(&body)?;
    // The SDK writes the consumer id as a string; accept a bare number too.
    let consumer_id = match &body.consumer_id {
        Some(serde_json::Value::String(text)) => Some(text.clone()),
        Some(serde_json::Value::Number(n)) => Some(n.to_string()),
        Some(serde_json::Value::Null) | None => None,
        Some(_) => return Err(ApiError::new(codes::INVALID_FORMAT, "invalid consumer_id")),
    };
    let command = Command::StoreConsumerOffset {
        consumer: consumer(consumer_id.as_deref())?,
        stream: identifier(&stream)?,
        topic: identifier(&topic)?,
        partition_id: body.partition_id,
        offset: body.offset,
    };
    state.run(&headers, peer, command).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minted_ids_are_uuid_v4_shaped_and_non_zero() {
        for _ in 0..100 {
            let id = random_message_id();
            assert_ne!(id, 0);
            assert_eq!((id >> 76) & 0xf, 4, "version nibble");
            assert_eq!((id >> 62) & 0x3, 2, "variant bits");
        }
    }

    #[test]
    fn body_limit_covers_a_full_batch_in_json() {
        // The worst case for JSON growth per byte: one-byte payloads, largest ids.
        let batch_bytes_max = 65_536u32;
        let per_message_binary = 48 + 1;
        let count = (batch_bytes_max as usize - 256) / per_message_binary;
        let one = format!(r#"{{"id":{},"payload":"AA==","user_headers":null}},"#, u128::MAX);
        let json_len = count * one.len() + 200;
        assert!(json_len <= message_body_limit(batch_bytes_max));
    }

    #[test]
    fn identifiers_follow_the_sdk_text_form() {
        assert!(matches!(identifier("7"), Ok(Identifier::Numeric(7))));
        assert!(matches!(identifier("orders"), Ok(Identifier::Name(n)) if n == "orders"));
        assert!(identifier("").is_err());
    }
}
