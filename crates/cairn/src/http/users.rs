//! HTTP routes for users, personal access tokens and clients (the paths and JSON of the 0.11
//! SDK's `HttpClient`). Like every route they only translate: each request becomes the
//! `Command` a binary client would send, and the binary reply payload becomes JSON.

use super::{
    ApiError, ApiResult, Cursor, Peer, Shared, identifier, json, malformed_reply, parse_json, start_session,
};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post, put};
use cairn_machine::permissions::{GlobalDoc, PermissionsDoc, StreamDoc};
use cairn_wire::codes;
use cairn_wire::command::{ClientVersionInfo, Command};
use cairn_wire::types::Permissions;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub(super) fn routes() -> Router<Shared> {
    Router::new()
        .route("/users", get(get_users).post(create_user))
        .route(
            "/users/{user}",
            get(get_user).put(update_user).delete(delete_user),
        )
        .route("/users/{user}/permissions", put(update_permissions))
        .route("/users/{user}/password", put(change_password))
        .route("/personal-access-tokens", get(get_tokens).post(create_token))
        .route("/personal-access-tokens/login", post(login_with_token))
        .route(
            "/personal-access-tokens/{name}",
            axum::routing::delete(delete_token),
        )
        .route("/clients", get(get_clients))
        .route("/clients/{client}", get(get_client))
}

// ---- JSON shapes ----

/// `Permissions` as the SDK serializes it: maps keyed by id, `null` for no entries.
#[derive(Serialize, Deserialize)]
struct PermissionsJson {
    global: GlobalDoc,
    #[serde(default)]
    streams: Option<BTreeMap<u32, StreamDoc>>,
}

impl PermissionsJson {
    fn to_wire(&self) -> Permissions {
        PermissionsDoc {
            global: self.global,
            streams: self.streams.clone().unwrap_or_default(),
        }
        .to_wire()
    }

    fn from_wire(permissions: &Permissions) -> PermissionsJson {
        let doc = PermissionsDoc::from_wire(permissions);
        PermissionsJson {
            global: doc.global,
            streams: (!doc.streams.is_empty()).then_some(doc.streams),
        }
    }
}

#[derive(Serialize)]
struct UserJson {
    id: u32,
    created_at: u64,
    status: &'static str,
    username: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    permissions: Option<Option<PermissionsJson>>,
}

#[derive(Serialize)]
struct ClientJson {
    client_id: u32,
    user_id: Option<u32>,
    address: String,
    transport: &'static str,
    consumer_groups_count: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    consumer_groups: Option<Vec<GroupRefJson>>,
}

#[derive(Serialize)]
struct GroupRefJson {
    stream_id: u32,
    topic_id: u32,
    group_id: u32,
}

#[derive(Serialize)]
struct TokenInfoJson {
    name: String,
    expiry_at: Option<u64>,
}

// ---- decoding reply payloads ----

impl Cursor<'_> {
    fn flag(&mut self) -> Option<bool> {
        self.u8().map(|b| b != 0)
    }

    fn user(&mut self) -> Option<UserJson> {
        let id = self.u32()?;
        let created_at = self.u64()?;
        let status = match self.u8()? {
            1 => "active",
            2 => "inactive",
            _ => return None,
        };
        let username = self.name()?;
        self.skip_option_block()?;
        Some(UserJson {
            id,
            created_at,
            status,
            username,
            permissions: None,
        })
    }

    /// `[1][len u32][Permissions]` or four zero bytes.
    fn optional_permissions(&mut self) -> Option<Option<PermissionsJson>> {
        if !self.flag()? {
            return Some(None);
        }
        let len = self.u32()? as usize;
        let permissions = Permissions::decode(self.take(len)?).ok()?;
        Some(Some(PermissionsJson::from_wire(&permissions)))
    }

    fn user_details(&mut self) -> Option<UserJson> {
        let mut user = self.user()?;
        user.permissions = Some(self.optional_permissions()?);
        Some(user)
    }

    fn client(&mut self) -> Option<ClientJson> {
        let client_id = self.u32()?;
        let user_id = match self.u32()? {
            u32::MAX => None,
            id => Some(id),
        };
        let transport = match self.u8()? {
            1 => "TCP",
            2 => "QUIC",
            3 => "HTTP",
            4 => "WebSocket",
            _ => return None,
        };
        let len = self.u32()? as usize;
        let address = String::from_utf8_lossy(self.take(len)?).into_owned();
        let consumer_groups_count = self.u32()?;
        Some(ClientJson {
            client_id,
            user_id,
            address,
            transport,
            consumer_groups_count,
            consumer_groups: None,
        })
    }

    fn client_details(&mut self) -> Option<ClientJson> {
        let mut client = self.client()?;
        let mut groups = Vec::new();
        for _ in 0..client.consumer_groups_count {
            groups.push(GroupRefJson {
                stream_id: self.u32()?,
                topic_id: self.u32()?,
                group_id: self.u32()?,
            });
        }
        client.consumer_groups = Some(groups);
        Some(client)
    }
}

fn not_found(what: &str) -> ApiError {
    ApiError::new(codes::RESOURCE_NOT_FOUND, format!("{what} not found"))
}

/// Wire status of a JSON user status.
fn user_status(status: &str) -> Result<u8, ApiError> {
    match status {
        "active" => Ok(1),
        "inactive" => Ok(2),
        other => Err(ApiError::new(45, format!("invalid user status `{other}`"))),
    }
}

// ---- users ----

async fn get_users(State(state): State<Shared>, ConnectInfo(peer): Peer, headers: HeaderMap) -> ApiResult {
    let payload = state.run(&headers, peer, Command::GetUsers).await?;
    let mut cursor = Cursor::new(&payload);
    let mut users = Vec::new();
    while !cursor.is_empty() {
        users.push(cursor.user().ok_or_else(malformed_reply)?);
    }
    Ok(json(StatusCode::OK, &users))
}

async fn get_user(
    State(state): State<Shared>,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(user): Path<String>,
) -> ApiResult {
    let command = Command::GetUser {
        user: identifier(&user)?,
    };
    let payload = state.run(&headers, peer, command).await?;
    if payload.is_empty() {
        return Err(not_found("user"));
    }
    let user = Cursor::new(&payload).user_details().ok_or_else(malformed_reply)?;
    Ok(json(StatusCode::OK, &user))
}

#[derive(Deserialize)]
struct CreateUserBody {
    username: String,
    password: String,
    #[serde(default = "active")]
    status: String,
    #[serde(default)]
    permissions: Option<PermissionsJson>,
}

fn active() -> String {
    "active".to_string()
}

async fn create_user(
    State(state): State<Shared>,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult {
    let body: CreateUserBody = parse_json(&body)?;
    let command = Command::CreateUser {
        username: body.username,
        password: body.password,
        status: user_status(&body.status)?,
        permissions: body.permissions.as_ref().map(PermissionsJson::to_wire),
    };
    let payload = state.run(&headers, peer, command).await?;
    let user = Cursor::new(&payload).user_details().ok_or_else(malformed_reply)?;
    Ok(json(StatusCode::CREATED, &user))
}

#[derive(Deserialize)]
struct UpdateUserBody {
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    options: BTreeMap<String, String>,
}

async fn update_user(
    State(state): State<Shared>,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(user): Path<String>,
    body: Bytes,
) -> ApiResult {
    let body: UpdateUserBody = parse_json(&body)?;
    // Users have no updatable option keys (as in 0.11's catalogue): any key is refused.
    if let Some(key) = body.options.keys().next() {
        return Err(ApiError::new(
            codes::UNSUPPORTED_OPTION_KEY,
            format!("unsupported user option `{key}`"),
        ));
    }
    let command = Command::UpdateUser {
        user: identifier(&user)?,
        username: body.username,
        status: body.status.as_deref().map(user_status).transpose()?,
    };
    state.run(&headers, peer, command).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Deserialize)]
struct UpdatePermissionsBody {
    #[serde(default)]
    permissions: Option<PermissionsJson>,
}

async fn update_permissions(
    State(state): State<Shared>,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(user): Path<String>,
    body: Bytes,
) -> ApiResult {
    let body: UpdatePermissionsBody = parse_json(&body)?;
    let command = Command::UpdatePermissions {
        user: identifier(&user)?,
        permissions: body.permissions.as_ref().map(PermissionsJson::to_wire),
    };
    state.run(&headers, peer, command).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Deserialize)]
struct ChangePasswordBody {
    current_password: String,
    new_password: String,
}

async fn change_password(
    State(state): State<Shared>,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(user): Path<String>,
    body: Bytes,
) -> ApiResult {
    let body: ChangePasswordBody = parse_json(&body)?;
    let command = Command::ChangePassword {
        user: identifier(&user)?,
        current_password: body.current_password,
        new_password: body.new_password,
    };
    state.run(&headers, peer, command).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn delete_user(
    State(state): State<Shared>,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(user): Path<String>,
) -> ApiResult {
    let command = Command::DeleteUser {
        user: identifier(&user)?,
    };
    state.run(&headers, peer, command).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

// ---- personal access tokens ----

async fn get_tokens(State(state): State<Shared>, ConnectInfo(peer): Peer, headers: HeaderMap) -> ApiResult {
    let payload = state
        .run(&headers, peer, Command::GetPersonalAccessTokens)
        .await?;
    let mut cursor = Cursor::new(&payload);
    let mut tokens = Vec::new();
    while !cursor.is_empty() {
        let name = cursor.name().ok_or_else(malformed_reply)?;
        let expiry_at = cursor.u64().ok_or_else(malformed_reply)?;
        tokens.push(TokenInfoJson {
            name,
            expiry_at: (expiry_at != 0).then_some(expiry_at),
        });
    }
    Ok(json(StatusCode::OK, &tokens))
}

#[derive(Deserialize)]
struct CreateTokenBody {
    name: String,
    #[serde(default)]
    expiry: u64,
}

#[derive(Serialize)]
struct RawTokenJson {
    token: String,
}

async fn create_token(
    State(state): State<Shared>,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult {
    let body: CreateTokenBody = parse_json(&body)?;
    let command = Command::CreatePersonalAccessToken {
        name: body.name,
        expiry: body.expiry,
    };
    let payload = state.run(&headers, peer, command).await?;
    let token = Cursor::new(&payload).name().ok_or_else(malformed_reply)?;
    Ok(json(StatusCode::CREATED, &RawTokenJson { token }))
}

async fn delete_token(
    State(state): State<Shared>,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> ApiResult {
    let command = Command::DeletePersonalAccessToken { name };
    state.run(&headers, peer, command).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Deserialize)]
struct TokenLoginBody {
    token: String,
}

async fn login_with_token(State(state): State<Shared>, ConnectInfo(peer): Peer, body: Bytes) -> ApiResult {
    let body: TokenLoginBody = parse_json(&body)?;
    let command = Command::LoginWithToken {
        version: ClientVersionInfo {
            protocol_version: cairn_wire::frame::PROTOCOL_VERSION_MIN,
            sdk_name: "http".to_string(),
            sdk_version: String::new(),
        },
        token: body.token,
    };
    start_session(&state, peer, command).await
}

// ---- clients ----

async fn get_clients(State(state): State<Shared>, ConnectInfo(peer): Peer, headers: HeaderMap) -> ApiResult {
    let payload = state.run(&headers, peer, Command::GetClients).await?;
    let mut cursor = Cursor::new(&payload);
    let mut clients = Vec::new();
    while !cursor.is_empty() {
        clients.push(cursor.client().ok_or_else(malformed_reply)?);
    }
    Ok(json(StatusCode::OK, &clients))
}

async fn get_client(
    State(state): State<Shared>,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(client): Path<String>,
) -> ApiResult {
    let client_id: u32 = client
        .parse()
        .map_err(|_| ApiError::new(codes::INVALID_FORMAT, format!("invalid client id `{client}`")))?;
    let payload = state
        .run(&headers, peer, Command::GetClient { client_id })
        .await?;
    if payload.is_empty() {
        return Err(not_found("client"));
    }
    let client = Cursor::new(&payload)
        .client_details()
        .ok_or_else(malformed_reply)?;
    Ok(json(StatusCode::OK, &client))
}
