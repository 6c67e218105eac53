//! HTTP routes for users, personal access tokens and clients (the paths and JSON of the 0.11
//! SDK's `HttpClient`). Like every route they only translate: each request becomes the
//! `Command` a binary client would send, and the handler's reply values become JSON.

use super::{
    ApiError, ApiResult, Peer, Shared, identifier, json, parse_json, start_session, unexpected_reply,
};
use crate::handler::{Typed, UserDetails};
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

// ---- from the handler's values ----

/// A user's JSON; a status the SDK does not know is a server bug (as the SDK would refuse it).
fn user_json(
    user: cairn_wire::reply::UserRecord,
    permissions: Option<Option<PermissionsJson>>,
) -> Result<UserJson, ApiError> {
    let status = match user.status {
        1 => "active",
        2 => "inactive",
        _ => return Err(unexpected_reply()),
    };
    Ok(UserJson {
        id: user.id,
        created_at: user.created_at,
        status,
        username: user.username,
        permissions,
    })
}

fn user_details_json(details: UserDetails) -> Result<UserJson, ApiError> {
    let permissions = details.permissions.as_ref().map(PermissionsJson::from_wire);
    user_json(details.user, Some(permissions))
}

/// A client's JSON; a transport the SDK does not know is a server bug.
fn client_json(client: cairn_wire::reply::ClientRecord, with_groups: bool) -> Result<ClientJson, ApiError> {
    let transport = match client.transport {
        1 => "TCP",
        2 => "QUIC",
        3 => "HTTP",
        4 => "WebSocket",
        _ => return Err(unexpected_reply()),
    };
    Ok(ClientJson {
        client_id: client.client_id,
        user_id: client.user_id,
        address: client.address,
        transport,
        consumer_groups_count: u32::try_from(client.consumer_groups.len()).unwrap_or(u32::MAX),
        consumer_groups: with_groups.then(|| {
            client
                .consumer_groups
                .iter()
                .map(|&(stream_id, topic_id, group_id)| GroupRefJson {
                    stream_id,
                    topic_id,
                    group_id,
                })
                .collect()
        }),
    })
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
    let Typed::Users(users) = state.run(&headers, peer, Command::GetUsers).await? else {
        return Err(unexpected_reply());
    };
    let users = users
        .into_iter()
        .map(|user| user_json(user, None))
        .collect::<Result<Vec<UserJson>, ApiError>>()?;
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
    match state.run(&headers, peer, command).await? {
        Typed::User(Some(details)) => Ok(json(StatusCode::OK, &user_details_json(*details)?)),
        Typed::User(None) => Err(not_found("user")),
        _ => Err(unexpected_reply()),
    }
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
    let Typed::User(Some(details)) = state.run(&headers, peer, command).await? else {
        return Err(unexpected_reply());
    };
    Ok(json(StatusCode::CREATED, &user_details_json(*details)?))
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
    let Typed::Tokens(tokens) = state
        .run(&headers, peer, Command::GetPersonalAccessTokens)
        .await?
    else {
        return Err(unexpected_reply());
    };
    let tokens: Vec<TokenInfoJson> = tokens
        .into_iter()
        .map(|token| TokenInfoJson {
            name: token.name,
            expiry_at: (token.expiry_at_us != 0).then_some(token.expiry_at_us),
        })
        .collect();
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
    let Typed::Token(token) = state.run(&headers, peer, command).await? else {
        return Err(unexpected_reply());
    };
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
    let Typed::Clients(clients) = state.run(&headers, peer, Command::GetClients).await? else {
        return Err(unexpected_reply());
    };
    let clients = clients
        .into_iter()
        .map(|c| client_json(c, false))
        .collect::<Result<Vec<ClientJson>, ApiError>>()?;
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
    match state
        .run(&headers, peer, Command::GetClient { client_id })
        .await?
    {
        Typed::Client(Some(client)) => Ok(json(StatusCode::OK, &client_json(client, true)?)),
        Typed::Client(None) => Err(not_found("client")),
        _ => Err(unexpected_reply()),
    }
}
