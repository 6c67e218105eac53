//! Users, the permission check every command passes, and the registry of live clients
//! (GetMe, GetClient, GetClients).
//!
//! Users live in the metadata document (argon2 password hashes, permissions); every change is
//! saved atomically before it is answered, and rolled back in memory if the save fails. The
//! rules themselves are the pure `crate::permissions`; this module resolves what a command
//! names under the catalog lock and applies them.
//!
//! A session belongs to a user id. Permission changes, deactivation and deletion take effect
//! on that session's next command: a deleted user's session is logged out (status 40), a
//! deactivated user's session is refused with 47 (only Logout still works).

use super::{Reply, Server, Session, find_stream, find_topic, storage_status};
use crate::auth::{self, User};
use crate::catalog::{self, Catalog};
use crate::permissions::{self, PermissionsDoc, Resolved, UserPermissionsView};
use cairn_wire::codes;
use cairn_wire::command::Command;
use cairn_wire::reply;
use cairn_wire::types::{Identifier, Permissions};
use std::collections::BTreeMap;

/// Client transport numbers (§6.0 Client record).
pub const TRANSPORT_TCP: u8 = 1;
pub const TRANSPORT_HTTP: u8 = 3;

/// 45 InvalidUserStatus: a status other than 1 (active) or 2 (inactive).
const INVALID_USER_STATUS: u32 = 45;
/// 48 CannotDeleteUser: the root user.
const CANNOT_DELETE_USER: u32 = 48;
/// 49 CannotChangePermissions: root's permissions or status.
const CANNOT_CHANGE_PERMISSIONS: u32 = 49;
/// 50 InvalidPersonalAccessTokenName.
pub(super) const INVALID_PAT_NAME: u32 = 50;
/// 52 PersonalAccessTokensLimitReached.
pub(super) const PAT_LIMIT_REACHED: u32 = 52;
/// 55 UsersLimitReached.
const USERS_LIMIT_REACHED: u32 = 55;
/// Most stream plus topic entries one user's permissions may list (they are stored in the
/// metadata document and copied on every change): more is refused with 4 InvalidFormat.
const PERMISSION_ENTRIES_MAX: usize = 10_000;

/// One live client in the registry.
#[derive(Debug, Clone)]
pub struct ClientEntry {
    pub user_id: Option<u32>,
    pub transport: u8,
    pub address: String,
}

/// What a user change needs to undo if the metadata save fails.
struct UsersBefore {
    users: Vec<User>,
    tokens: Vec<auth::PersonalAccessToken>,
    next_user_id: u32,
}

impl UsersBefore {
    fn of(catalog: &Catalog) -> UsersBefore {
        UsersBefore {
            users: catalog.users.clone(),
            tokens: catalog.tokens.clone(),
            next_user_id: catalog.next_user_id,
        }
    }

    /// Save the metadata; on failure restore the users and tokens as they were, so memory
    /// never claims what the disk does not hold.
    fn save_or_restore(self, catalog: &mut Catalog) -> Result<(), u32> {
        if let Err(error) = catalog.save() {
            catalog.users = self.users;
            catalog.tokens = self.tokens;
            catalog.next_user_id = self.next_user_id;
            return Err(storage_status(error));
        }
        Ok(())
    }
}

impl Server {
    // ---- client registry ----

    fn clients(&self) -> std::sync::MutexGuard<'_, BTreeMap<u32, ClientEntry>> {
        catalog::lock(&self.clients)
    }

    /// List `session` as a live client (a TCP connection; an HTTP login).
    pub fn register_client(&self, session: &Session) {
        self.clients().insert(
            session.client_id,
            ClientEntry {
                user_id: session.user_id,
                transport: session.transport,
                address: session.address.clone(),
            },
        );
    }

    /// Forget a client (its connection ended, its HTTP token was logged out or expired).
    pub fn unregister_client(&self, client_id: u32) {
        self.clients().remove(&client_id);
    }

    /// Record the session's user in the registry after a login or logout.
    pub(super) fn note_user(&self, session: &Session) {
        if let Some(entry) = self.clients().get_mut(&session.client_id) {
            entry.user_id = session.user_id;
        }
    }

    /// End the session's login: group memberships go, the user id is cleared.
    pub(super) fn end_login(&self, session: &mut Session) {
        self.drop_memberships(session.client_id);
        session.user_id = None;
        session.session_id = 0;
        self.note_user(session);
    }

    /// Consumer-group memberships of every client: client id → (stream, topic, group).
    fn memberships(catalog: &Catalog) -> BTreeMap<u32, Vec<(u32, u32, u32)>> {
        let mut by_client: BTreeMap<u32, Vec<(u32, u32, u32)>> = BTreeMap::new();
        for stream in catalog.streams.values() {
            for topic in stream.topics.values() {
                for (group_id, membership) in catalog::lock(&topic.members).iter() {
                    for member in &membership.members {
                        by_client.entry(member.client_id).or_default().push((
                            stream.id,
                            topic.doc.id,
                            *group_id,
                        ));
                    }
                }
            }
        }
        by_client
    }

    fn client_records(&self, only: Option<u32>) -> Vec<reply::ClientRecord> {
        // Registry first, released before the catalog lock is taken (no nesting).
        let entries: Vec<(u32, ClientEntry)> = {
            let clients = self.clients();
            match only {
                Some(id) => clients.get(&id).map(|e| (id, e.clone())).into_iter().collect(),
                None => clients.iter().map(|(id, e)| (*id, e.clone())).collect(),
            }
        };
        let mut groups = Self::memberships(&self.read());
        entries
            .into_iter()
            .map(|(client_id, entry)| reply::ClientRecord {
                client_id,
                user_id: entry.user_id,
                transport: entry.transport,
                address: entry.address,
                consumer_groups: groups.remove(&client_id).unwrap_or_default(),
            })
            .collect()
    }

    /// GetClient: ClientDetails, or empty (= none).
    pub(super) fn get_client(&self, client_id: u32) -> Reply {
        let mut out = Vec::new();
        if let Some(record) = self.client_records(Some(client_id)).first() {
            reply::client_details(&mut out, record);
        }
        Ok(out)
    }

    /// GetClients: every live client, records back to back.
    pub(super) fn get_clients(&self) -> Reply {
        let mut out = Vec::new();
        for record in self.client_records(None) {
            reply::client(&mut out, &record);
        }
        Ok(out)
    }

    // ---- the permission check ----

    /// Check `command` against the session's user, as it is now: a deleted user's session is
    /// logged out (40), an inactive user's refused (47), and the permission rules decide the
    /// rest (41). Stream/topic/user names are resolved under the catalog read lock.
    pub(super) fn authorize(&self, session: &mut Session, command: &Command) -> Result<(), u32> {
        let Some(user_id) = session.user_id else {
            return Err(codes::UNAUTHENTICATED);
        };
        // Root can be neither deleted, deactivated nor restricted.
        if user_id == auth::ROOT_USER_ID || matches!(command, Command::Logout) {
            return Ok(());
        }
        let decision = {
            let catalog = self.read();
            match catalog.users.iter().find(|u| u.id == user_id) {
                None => None,
                Some(user) if user.status != auth::USER_STATUS_ACTIVE => Some(Err(codes::USER_INACTIVE)),
                Some(user) => {
                    let view = UserPermissionsView {
                        user_id,
                        permissions: user.permissions.as_ref(),
                    };
                    Some(permissions::authorize(
                        &view,
                        command,
                        &resolve(&catalog, command),
                    ))
                }
            }
        };
        match decision {
            Some(result) => {
                if let Err(status) = result {
                    tracing::debug!(user_id, command = command.name(), status, "command refused");
                }
                result
            }
            None => {
                tracing::info!(
                    user_id,
                    client_id = session.client_id,
                    "the session's user was deleted: session logged out"
                );
                self.end_login(session);
                Err(codes::UNAUTHENTICATED)
            }
        }
    }

    /// Whether the session's user may see stream `stream_id` (GetStreams lists only those).
    pub(super) fn may_read_stream(&self, catalog: &Catalog, session: &Session, stream_id: u32) -> bool {
        let Some(user_id) = session.user_id else {
            return false;
        };
        if user_id == auth::ROOT_USER_ID {
            return true;
        }
        catalog
            .users
            .iter()
            .find(|u| u.id == user_id)
            .is_some_and(|user| {
                UserPermissionsView {
                    user_id,
                    permissions: user.permissions.as_ref(),
                }
                .see_stream(Some(stream_id))
            })
    }

    // ---- users ----

    pub(super) fn get_user(&self, user: &Identifier) -> Reply {
        let catalog = self.read();
        let mut out = Vec::new();
        if let Some(user) = find_user(&catalog.users, user) {
            user_details(&mut out, user);
        }
        Ok(out)
    }

    pub(super) fn get_users(&self) -> Reply {
        let catalog = self.read();
        let mut out = Vec::new();
        for user in &catalog.users {
            reply::user(&mut out, &user_record(user));
        }
        Ok(out)
    }

    pub(super) fn create_user(
        &self,
        username: String,
        password: &str,
        status: u8,
        permissions: Option<&Permissions>,
    ) -> Reply {
        check_username(&username)?;
        check_password(password)?;
        check_status(status)?;
        check_permissions(permissions)?;
        // argon2 before the lock: it takes tens of milliseconds.
        let password_hash = hash(password)?;
        let now_us = self.clock.now_us();
        let mut catalog = self.write();
        if catalog.users.iter().any(|u| u.username == username) {
            return Err(codes::USER_ALREADY_EXISTS);
        }
        if catalog.users.len() >= auth::USERS_MAX {
            return Err(USERS_LIMIT_REACHED);
        }
        let before = UsersBefore::of(&catalog);
        let id = catalog.next_user_id;
        catalog.next_user_id = id.checked_add(1).ok_or(USERS_LIMIT_REACHED)?;
        let user = User {
            id,
            username,
            password_hash,
            status,
            created_at_us: now_us,
            permissions: permissions.map(PermissionsDoc::from_wire),
        };
        let mut out = Vec::new();
        user_details(&mut out, &user);
        catalog.users.push(user);
        before.save_or_restore(&mut catalog)?;
        tracing::info!(user_id = id, "user created");
        Ok(out)
    }

    pub(super) fn update_user(
        &self,
        user: &Identifier,
        username: Option<String>,
        status: Option<u8>,
    ) -> Reply {
        if let Some(name) = &username {
            check_username(name)?;
        }
        if let Some(status) = status {
            check_status(status)?;
        }
        let mut catalog = self.write();
        let id = find_user(&catalog.users, user)
            .ok_or(codes::RESOURCE_NOT_FOUND)?
            .id;
        if id == auth::ROOT_USER_ID && status.is_some_and(|s| s != auth::USER_STATUS_ACTIVE) {
            return Err(CANNOT_CHANGE_PERMISSIONS);
        }
        if let Some(name) = &username
            && catalog.users.iter().any(|u| &u.username == name && u.id != id)
        {
            return Err(codes::USER_ALREADY_EXISTS);
        }
        let before = UsersBefore::of(&catalog);
        if let Some(u) = catalog.users.iter_mut().find(|u| u.id == id) {
            if let Some(name) = username {
                u.username = name;
            }
            if let Some(status) = status {
                u.status = status;
            }
        }
        before.save_or_restore(&mut catalog)?;
        Ok(Vec::new())
    }

    /// Delete a user with its tokens and permissions. Nothing else is closed: other users'
    /// sessions are untouched, and the deleted user's own sessions are logged out on their
    /// next command (see [`Server::authorize`]).
    pub(super) fn delete_user(&self, user: &Identifier) -> Reply {
        let mut catalog = self.write();
        let id = find_user(&catalog.users, user)
            .ok_or(codes::RESOURCE_NOT_FOUND)?
            .id;
        if id == auth::ROOT_USER_ID {
            return Err(CANNOT_DELETE_USER);
        }
        let before = UsersBefore::of(&catalog);
        catalog.users.retain(|u| u.id != id);
        catalog.tokens.retain(|t| t.user_id != id);
        before.save_or_restore(&mut catalog)?;
        tracing::info!(user_id = id, "user deleted with its personal access tokens");
        Ok(Vec::new())
    }

    /// Change a password. Changing one's own needs the current password (42 if wrong); a
    /// user with `manage_users` changing someone else's does not (an administrator's reset).
    pub(super) fn change_password(
        &self,
        session: &Session,
        user: &Identifier,
        current_password: &str,
        new_password: &str,
    ) -> Reply {
        check_password(new_password)?;
        let (id, old_hash) = {
            let catalog = self.read();
            let target = find_user(&catalog.users, user).ok_or(codes::RESOURCE_NOT_FOUND)?;
            (target.id, target.password_hash.clone())
        };
        if Some(id) == session.user_id && !auth::verify_secret(current_password, &old_hash) {
            return Err(codes::INVALID_CREDENTIALS);
        }
        let new_hash = hash(new_password)?;
        let mut catalog = self.write();
        let before = UsersBefore::of(&catalog);
        let Some(target) = catalog.users.iter_mut().find(|u| u.id == id) else {
            return Err(codes::RESOURCE_NOT_FOUND);
        };
        // A concurrent change won: the current password checked above is no longer current.
        if target.password_hash != old_hash {
            return Err(codes::INVALID_CREDENTIALS);
        }
        target.password_hash = new_hash;
        before.save_or_restore(&mut catalog)?;
        tracing::info!(user_id = id, "password changed");
        Ok(Vec::new())
    }

    pub(super) fn update_permissions(&self, user: &Identifier, permissions: Option<&Permissions>) -> Reply {
        check_permissions(permissions)?;
        let mut catalog = self.write();
        let id = find_user(&catalog.users, user)
            .ok_or(codes::RESOURCE_NOT_FOUND)?
            .id;
        if id == auth::ROOT_USER_ID {
            return Err(CANNOT_CHANGE_PERMISSIONS);
        }
        let before = UsersBefore::of(&catalog);
        if let Some(u) = catalog.users.iter_mut().find(|u| u.id == id) {
            u.permissions = permissions.map(PermissionsDoc::from_wire);
        }
        before.save_or_restore(&mut catalog)?;
        Ok(Vec::new())
    }
}

/// The ids `command` names, resolved against the catalog (`None` where nothing resolves).
fn resolve(catalog: &Catalog, command: &Command) -> Resolved {
    let (stream, topic) = permissions::target_of(command);
    let stream = stream.and_then(|id| find_stream(catalog, id).ok());
    let topic = match (stream, topic) {
        (Some(s), Some(t)) => find_topic(s, t).ok().map(|t| t.doc.id),
        _ => None,
    };
    Resolved {
        stream: stream.map(|s| s.id),
        topic,
        user: permissions::user_of(command)
            .and_then(|id| find_user(&catalog.users, id))
            .map(|u| u.id),
    }
}

fn find_user<'a>(users: &'a [User], id: &Identifier) -> Option<&'a User> {
    match id {
        Identifier::Numeric(n) => users.iter().find(|u| u.id == *n),
        Identifier::Name(name) => users.iter().find(|u| &u.username == name),
    }
}

fn user_record(user: &User) -> reply::UserRecord {
    reply::UserRecord {
        id: user.id,
        created_at: user.created_at_us,
        status: user.status,
        username: user.username.clone(),
    }
}

/// UserDetails; root reports every global permission (what it is allowed).
fn user_details(out: &mut Vec<u8>, user: &User) {
    let permissions = if user.id == auth::ROOT_USER_ID {
        Some(PermissionsDoc::root().to_wire())
    } else {
        user.permissions.as_ref().map(PermissionsDoc::to_wire)
    };
    reply::user_details(out, &user_record(user), permissions.as_ref());
}

fn check_username(name: &str) -> Result<(), u32> {
    if auth::USERNAME_LEN.contains(&name.len()) {
        Ok(())
    } else {
        Err(codes::INVALID_USERNAME)
    }
}

fn check_password(password: &str) -> Result<(), u32> {
    if auth::PASSWORD_LEN.contains(&password.len()) {
        Ok(())
    } else {
        Err(codes::INVALID_PASSWORD)
    }
}

fn check_status(status: u8) -> Result<(), u32> {
    match status {
        auth::USER_STATUS_ACTIVE | auth::USER_STATUS_INACTIVE => Ok(()),
        _ => Err(INVALID_USER_STATUS),
    }
}

fn check_permissions(permissions: Option<&Permissions>) -> Result<(), u32> {
    let entries = permissions.map_or(0, |p| {
        p.streams.len() + p.streams.iter().map(|(_, s)| s.topics.len()).sum::<usize>()
    });
    if entries > PERMISSION_ENTRIES_MAX {
        tracing::debug!(entries, "permissions with too many entries refused");
        return Err(codes::INVALID_FORMAT);
    }
    Ok(())
}

fn hash(secret: &str) -> Result<String, u32> {
    auth::hash_secret(secret).map_err(|error| {
        tracing::error!(%error, "hashing a password failed");
        codes::ERROR
    })
}
