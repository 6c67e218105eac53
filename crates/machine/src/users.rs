//! Users and personal access tokens as the metadata state machine stores them, and their
//! bounds. Hashing and random secrets are the server's (the primary decides them once and
//! carries the hash in the op); this module only holds and checks what an op brings.

use crate::permissions::PermissionsDoc;
use serde::{Deserialize, Serialize};

/// The root user's name: what the Iggy tools assume.
pub const ROOT_USERNAME: &str = "iggy";
/// Root is always user 0.
pub const ROOT_USER_ID: u32 = 0;

/// Wire status value of an active user.
pub const USER_STATUS_ACTIVE: u8 = 1;
/// Wire status value of an inactive user (cannot log in).
pub const USER_STATUS_INACTIVE: u8 = 2;

/// Username length bounds (bytes), as the 0.11 SDK's validators: 43 InvalidUsername outside.
pub const USERNAME_LEN: std::ops::RangeInclusive<usize> = 3..=50;
/// Password length bounds (bytes): 44 InvalidPassword outside.
pub const PASSWORD_LEN: std::ops::RangeInclusive<usize> = 3..=100;
/// Personal access token name bounds (bytes): 50 InvalidPersonalAccessTokenName outside.
pub const TOKEN_NAME_LEN: std::ops::RangeInclusive<usize> = 3..=30;
/// Most personal access tokens one user may hold: 52 PersonalAccessTokensLimitReached.
pub const TOKENS_PER_USER_MAX: usize = 100;
/// Most users (root included): 55 UsersLimitReached.
pub const USERS_MAX: usize = 1000;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct User {
    pub id: u32,
    pub username: String,
    /// argon2 PHC string.
    pub password_hash: String,
    pub status: u8,
    pub created_at_us: u64,
    /// What the user may do (see `permissions`); `None` = nothing beyond the always-allowed
    /// session commands. Ignored for root, which may do everything. Absent in metadata
    /// written before permissions existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<PermissionsDoc>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PersonalAccessToken {
    /// Public id, embedded in the raw token the server hands out once.
    pub id: u64,
    pub user_id: u32,
    pub name: String,
    /// argon2 PHC string of the raw token.
    pub token_hash: String,
    /// 0 = never expires.
    pub expiry_at_us: u64,
}
