//! Users, the permission check every command passes, and the registry of live clients
//! (GetMe, GetClient, GetClients).
//!
//! Users live in the metadata (argon2 password hashes, permissions); every change is a
//! `MetadataOp` committed through `Catalog::commit`, visible only once it is durable. The
//! permission rules themselves are the pure `cairn_machine::permissions`; this module
//! resolves what a command names under the catalog lock and applies them.
//!
//! A session belongs to a user id. Permission changes, deactivation and deletion take effect
//! on that session's next command: a deleted user's session is logged out (status 40), a
//! deactivated user's session is refused with 47 (only Logout still works).

use super::{Reply, Server, Session, Typed, UserDetails};
use crate::auth::{self, User};
use crate::catalog::Catalog;
use crate::partition::lock;
use cairn_machine::metadata::{self, MetadataOp, Outcome};
use cairn_machine::permissions::{self, PermissionsDoc, Resolved, UserPermissionsView};
use cairn_wire::codes;
use cairn_wire::command::Command;
use cairn_wire::reply;
use cairn_wire::types::{Identifier, Permissions};
use std::collections::BTreeMap;

/// Client transport numbers (§6.0 Client record).
pub const TRANSPORT_TCP: u8 = 1;
pub const TRANSPORT_HTTP: u8 = 3;

/// Most stream plus topic entries one user's permissions may list (they are stored in the
/// metadata document and copied on every change): more is refused with 4 InvalidFormat.
const PERMISSION_ENTRIES_MAX: usize = 10_000;

/// One live client in the registry.
#[derive(Debug, Clone)]
pub struct ClientEntry {
    pub user_id: Option<u32>,
    /// The login session handed out to it (0 before login).
    pub session_id: u64,
    pub transport: u8,
    pub address: String,
}

impl Server {
    // ---- client registry ----

    fn clients(&self) -> std::sync::MutexGuard<'_, BTreeMap<u32, ClientEntry>> {
        lock(&self.clients)
    }

    /// List `session` as a live client (a TCP connection; an HTTP login).
    pub fn register_client(&self, session: &Session) {
        self.clients().insert(
            session.client_id,
            ClientEntry {
                user_id: session.user_id,
                session_id: session.session_id,
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
            entry.session_id = session.session_id;
        }
    }

    /// The live client signed in with login session `session_id` (> 0), and its user.
    pub(super) fn client_of_session(&self, session_id: u64) -> Option<(u32, Option<u32>)> {
        if session_id == 0 {
            return None;
        }
        self.clients()
            .iter()
            .find(|(_, entry)| entry.session_id == session_id)
            .map(|(client_id, entry)| (*client_id, entry.user_id))
    }

    /// End the session's login: group memberships go, the user id is cleared.
    pub(super) fn end_login(&self, session: &mut Session) {
        self.drop_memberships(session.client_id);
        session.user_id = None;
        session.session_id = 0;
        session.consumer_of = None;
        self.note_user(session);
    }

    /// Consumer-group memberships of every client: client id → (stream, topic, group).
    fn memberships(catalog: &Catalog) -> BTreeMap<u32, Vec<(u32, u32, u32)>> {
        let mut by_client: BTreeMap<u32, Vec<(u32, u32, u32)>> = BTreeMap::new();
        for topic in catalog.all_topics() {
            for (group_id, membership) in lock(topic.members).iter() {
                for member in &membership.members {
                    by_client.entry(member.client_id).or_default().push((
                        topic.stream_id,
                        topic.doc.id,
                        *group_id,
                    ));
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
        Ok(Typed::Client(
            self.client_records(Some(client_id)).into_iter().next(),
        ))
    }

    /// GetClients: every live client, records back to back.
    pub(super) fn get_clients(&self) -> Reply {
        Ok(Typed::Clients(self.client_records(None)))
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
            match catalog.meta().user(user_id) {
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
        catalog.meta().user(user_id).is_some_and(|user| {
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
        Ok(Typed::User(catalog.meta().find_user(user).map(user_details)))
    }

    pub(super) fn get_users(&self) -> Reply {
        let catalog = self.read();
        Ok(Typed::Users(
            catalog.meta().users.iter().map(user_record).collect(),
        ))
    }

    pub(super) fn create_user(
        &self,
        username: String,
        password: &str,
        status: u8,
        permissions: Option<&Permissions>,
    ) -> Reply {
        metadata::check_username(&username)?;
        check_password(password)?;
        metadata::check_user_status(status)?;
        check_permissions(permissions)?;
        // argon2 before the lock: it takes tens of milliseconds.
        let password_hash = hash(password)?;
        let created_at_us = self.clock.now_us();
        let mut catalog = self.write();
        let outcome = catalog
            .commit(&MetadataOp::CreateUser {
                username,
                password_hash,
                status,
                permissions: permissions.map(PermissionsDoc::from_wire),
                created_at_us,
            })?
            .outcome;
        let mut created = None;
        if let Outcome::User(id) = outcome
            && let Some(user) = catalog.meta().user(id)
        {
            created = Some(user_details(user));
            tracing::info!(user_id = id, "user created");
        }
        Ok(Typed::User(created))
    }

    pub(super) fn update_user(
        &self,
        user: &Identifier,
        username: Option<String>,
        status: Option<u8>,
    ) -> Reply {
        if let Some(name) = &username {
            metadata::check_username(name)?;
        }
        if let Some(status) = status {
            metadata::check_user_status(status)?;
        }
        let mut catalog = self.write();
        let user_id = catalog
            .meta()
            .find_user(user)
            .ok_or(codes::RESOURCE_NOT_FOUND)?
            .id;
        catalog.commit(&MetadataOp::UpdateUser {
            user_id,
            username,
            status,
        })?;
        Ok(Typed::Empty)
    }

    /// Delete a user with its tokens and permissions. Nothing else is closed: other users'
    /// sessions are untouched, and the deleted user's own sessions are logged out on their
    /// next command (see [`Server::authorize`]).
    pub(super) fn delete_user(&self, user: &Identifier) -> Reply {
        let mut catalog = self.write();
        let user_id = catalog
            .meta()
            .find_user(user)
            .ok_or(codes::RESOURCE_NOT_FOUND)?
            .id;
        catalog.commit(&MetadataOp::DeleteUser { user_id })?;
        tracing::info!(user_id, "user deleted with its personal access tokens");
        Ok(Typed::Empty)
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
        let (user_id, old_hash) = {
            let catalog = self.read();
            let target = catalog.meta().find_user(user).ok_or(codes::RESOURCE_NOT_FOUND)?;
            (target.id, target.password_hash.clone())
        };
        if Some(user_id) == session.user_id && !auth::verify_secret(current_password, &old_hash) {
            return Err(codes::INVALID_CREDENTIALS);
        }
        let new_hash = hash(new_password)?;
        // Refused with 42 if a concurrent change won: the password checked above is no
        // longer the current one.
        self.write().commit(&MetadataOp::ChangePassword {
            user_id,
            expected_hash: old_hash,
            new_hash,
        })?;
        tracing::info!(user_id, "password changed");
        Ok(Typed::Empty)
    }

    pub(super) fn update_permissions(&self, user: &Identifier, permissions: Option<&Permissions>) -> Reply {
        check_permissions(permissions)?;
        let mut catalog = self.write();
        let user_id = catalog
            .meta()
            .find_user(user)
            .ok_or(codes::RESOURCE_NOT_FOUND)?
            .id;
        catalog.commit(&MetadataOp::UpdatePermissions {
            user_id,
            permissions: permissions.map(PermissionsDoc::from_wire),
        })?;
        Ok(Typed::Empty)
    }
}

/// The ids `command` names, resolved against the catalog (`None` where nothing resolves).
fn resolve(catalog: &Catalog, command: &Command) -> Resolved {
    let (stream, topic) = permissions::target_of(command);
    let meta = catalog.meta();
    let stream = stream.and_then(|id| meta.find_stream(id).ok());
    let topic = match (stream, topic) {
        (Some(s), Some(t)) => s.find_topic(t).ok().map(|t| t.id),
        _ => None,
    };
    Resolved {
        stream: stream.map(|s| s.id),
        topic,
        user: permissions::user_of(command)
            .and_then(|id| meta.find_user(id))
            .map(|u| u.id),
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
fn user_details(user: &User) -> Box<UserDetails> {
    let permissions = if user.id == auth::ROOT_USER_ID {
        Some(PermissionsDoc::root().to_wire())
    } else {
        user.permissions.as_ref().map(PermissionsDoc::to_wire)
    };
    Box::new(UserDetails {
        user: user_record(user),
        permissions,
    })
}

fn check_password(password: &str) -> Result<(), u32> {
    if auth::PASSWORD_LEN.contains(&password.len()) {
        Ok(())
    } else {
        Err(codes::INVALID_PASSWORD)
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
