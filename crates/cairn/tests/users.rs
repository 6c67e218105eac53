//! Users, permissions, personal access tokens and the client registry, driven by the published
//! 0.11 SDK against a real `cairn` process (raw frames where the SDK validates client-side).

mod common;

use common::*;
use iggy::prelude::*;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Upper bound for conditions that depend on the clock or on the server noticing a
/// disconnect.
const CONDITION_TIMEOUT: Duration = Duration::from_secs(15);

async fn login(addr: std::net::SocketAddr, user: &str, password: &str) -> IggyClient {
    let client = sdk_client(addr).await;
    client
        .login_user(user, password)
        .await
        .unwrap_or_else(|e| panic!("login of {user} failed: {e:?}"));
    client
}

/// Per-stream read-only grant: read_stream + poll_messages.
fn stream_reader(stream: u32) -> Permissions {
    let mut streams = BTreeMap::new();
    streams.insert(
        stream as usize,
        StreamPermissions {
            read_stream: true,
            poll_messages: true,
            ..Default::default()
        },
    );
    Permissions {
        global: GlobalPermissions::default(),
        streams: Some(streams),
    }
}

async fn stream_with_topic(client: &IggyClient, name: &str) -> (u32, u32) {
    let s = client.create_stream(name).await.expect("create stream");
    let t = client
        .create_topic(&id_num(s.id), "t", &topic_opts(1))
        .await
        .expect("create topic");
    (s.id, t.id)
}

async fn send_one(client: &IggyClient, s: u32, t: u32, id: u128) -> Result<(), IggyError> {
    let mut msgs = vec![sdk_message(id, b"payload".to_vec())];
    client
        .send_messages(&id_num(s), &id_num(t), &Partitioning::partition_id(0), &mut msgs)
        .await
        .map(drop)
}

async fn poll_first(client: &IggyClient, s: u32, t: u32) -> Result<PolledMessages, IggyError> {
    client
        .poll_messages(
            &id_num(s),
            &id_num(t),
            Some(0),
            &Consumer::new(id_num(1)),
            &PollingStrategy::first(),
            10,
            false,
        )
        .await
}

/// The allow/deny results acceptance 2 expects of a user who may only read stream `a`.
async fn assert_reader_of(client: &IggyClient, a: (u32, u32), b: (u32, u32)) {
    let polled = poll_first(client, a.0, a.1).await.expect("reader polls A");
    assert_eq!(polled.messages.len(), 1, "the message in A is visible");
    assert_code(send_one(client, a.0, a.1, 99).await, 41);
    let streams = client.get_streams().await.expect("get_streams");
    let ids: Vec<u32> = streams.iter().map(|s| s.id).collect();
    assert_eq!(ids, vec![a.0], "only stream A is listed");
    assert!(client.get_stream(&id_num(a.0)).await.expect("get A").is_some());
    assert_code(client.get_stream(&id_num(b.0)).await, 41);
    assert_code(poll_first(client, b.0, b.1).await, 41);
    assert_code(client.get_topics(&id_num(b.0)).await, 41);
    assert_code(client.create_stream("not-allowed").await, 41);
    assert_code(client.delete_stream(&id_num(a.0)).await, 41);
    assert_code(client.get_users().await, 41);
    assert_code(client.get_clients().await, 41);
    // A stream that does not exist looks like one the user may not see.
    assert_code(client.get_stream(&id_num(999)).await, 41);
    // Session commands stay allowed.
    client.get_me().await.expect("get_me is always allowed");
    client.ping().await.expect("ping");
}

/// Acceptance 2: read-only permission on stream A; a PAT of that user inherits it; an
/// expired PAT is refused at login.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_stream_permission_and_pat_inheritance() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let addr = server.addr();
    let root = root_client(addr).await;
    let a = stream_with_topic(&root, "stream-a").await;
    let b = stream_with_topic(&root, "stream-b").await;
    send_one(&root, a.0, a.1, 1).await.expect("root sends to A");
    send_one(&root, b.0, b.1, 2).await.expect("root sends to B");
    root.create_user(
        "reader",
        "reader-pass",
        UserStatus::Active,
        Some(stream_reader(a.0)),
    )
    .await
    .expect("create reader");

    let reader = login(addr, "reader", "reader-pass").await;
    assert_reader_of(&reader, a, b).await;

    // A PAT made by the reader logs in as the reader, with the same results.
    let pat = reader
        .create_personal_access_token("reader-pat", PersonalAccessTokenExpiry::NeverExpire)
        .await
        .expect("create PAT");
    let via_pat = sdk_client(addr).await;
    let identity = via_pat
        .login_with_personal_access_token(&pat.token)
        .await
        .expect("PAT login");
    let reader_id = reader.get_me().await.expect("me").user_id;
    assert_eq!(Some(identity.user_id), reader_id, "a PAT logs in as its user");
    assert_reader_of(&via_pat, a, b).await;

    // An expired PAT is refused at login with 54. Expiry is a property of the clock: retry
    // the login until the server's clock passes the expiry (bounded).
    let short = reader
        .create_personal_access_token(
            "short-lived",
            PersonalAccessTokenExpiry::ExpireDuration(IggyDuration::new_from_secs(1)),
        )
        .await
        .expect("create 1 s PAT");
    let listed = reader.get_personal_access_tokens().await.expect("list PATs");
    let short_info = listed.iter().find(|t| t.name == "short-lived").expect("listed");
    assert!(short_info.expiry_at.is_some(), "the list shows the expiry");
    assert!(
        listed
            .iter()
            .find(|t| t.name == "reader-pat")
            .expect("listed")
            .expiry_at
            .is_none(),
        "a never-expiring PAT has no expiry"
    );
    let started = Instant::now();
    loop {
        let client = sdk_client(addr).await;
        match client.login_with_personal_access_token(&short.token).await {
            Ok(_) => {
                assert!(
                    started.elapsed() < CONDITION_TIMEOUT,
                    "the 1 s PAT still logs in after {CONDITION_TIMEOUT:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => {
                assert_eq!(e.as_code(), 54, "expired PAT: expected 54, got {e:?}");
                break;
            }
        }
    }
    drop((root, reader, via_pat));
    server.stop();
}

/// Acceptance 3: a password change invalidates the old password; deleting a user closes
/// nothing else; root cannot be deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn password_change_and_delete_user_closes_nothing_else() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let addr = server.addr();
    let root = root_client(addr).await;
    let (s, _) = stream_with_topic(&root, "shared").await;
    let alice_id = root
        .create_user("alice", "alice-old", UserStatus::Active, Some(stream_reader(s)))
        .await
        .expect("create alice")
        .id;
    let bob_id = root
        .create_user("bob", "bob-pass", UserStatus::Active, None)
        .await
        .expect("create bob")
        .id;
    let alice = login(addr, "alice", "alice-old").await;
    let bob = login(addr, "bob", "bob-pass").await;
    let bob_pat = bob
        .create_personal_access_token("bob-pat", PersonalAccessTokenExpiry::NeverExpire)
        .await
        .expect("bob's PAT");

    // Own password: the current one must be right.
    assert_code(
        alice
            .change_password(&id_num(alice_id), "wrong-current", "alice-new")
            .await,
        42,
    );
    // Someone else's: needs manage_users.
    assert_code(
        bob.change_password(&id_num(alice_id), "alice-old", "bob-was-here")
            .await,
        41,
    );
    alice
        .change_password(&id_num(alice_id), "alice-old", "alice-new")
        .await
        .expect("alice changes her password");
    let fresh = sdk_client(addr).await;
    assert_code(fresh.login_user("alice", "alice-old").await, 42);
    fresh
        .login_user("alice", "alice-new")
        .await
        .expect("new password works");
    // Root resets bob's password without knowing it.
    root.change_password(&id_num(bob_id), "unknown", "bob-reset")
        .await
        .expect("administrator reset");
    login(addr, "bob", "bob-reset").await;

    let mut raw_bob = RawConn::connect(addr).await;
    let _ = raw_bob.login("bob", "bob-reset").await.ok_payload();
    // Delete bob: his own session is logged out, his PAT is gone, nothing else is touched.
    root.delete_user(&id_num(bob_id)).await.expect("delete bob");
    // The server answers 40 (the login is gone); the SDK, with reconnection off in this
    // harness, reports that as a lost connection, so the exact status is checked raw.
    raw_bob.call(code::GET_STREAMS, &[]).await.assert_error(40);
    raw_bob.call(code::GET_ME, &[]).await.assert_error(40);
    let after = bob.get_streams().await;
    assert!(after.is_err(), "a deleted user's session is refused: {after:?}");
    let pat_client = sdk_client(addr).await;
    assert_code(
        pat_client.login_with_personal_access_token(&bob_pat.token).await,
        53,
    );
    alice.ping().await.expect("alice's connection still works");
    assert_eq!(
        alice.get_streams().await.expect("alice lists").len(),
        1,
        "alice's session and permissions are intact"
    );
    fresh.get_me().await.expect("alice's second session still works");
    root.get_me().await.expect("root's connection still works");
    assert!(root.get_user(&id_num(bob_id)).await.expect("get bob").is_none());

    // Root cannot be deleted, deactivated or restricted.
    assert_code(root.delete_user(&id_num(0)).await, 48);
    assert_code(root.delete_user(&id_name("iggy")).await, 48);
    assert_code(root.update_permissions(&id_num(0), None).await, 49);
    assert_code(
        root.update_user(
            &id_num(0),
            None,
            Some(UserStatus::Inactive),
            &UserUpdateOptions::default(),
        )
        .await,
        49,
    );
    root.get_me().await.expect("root still works");
    drop((root, alice, bob, fresh, pat_client));
    server.stop();
}

/// CRUD round trip with persistence across a clean restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_crud_round_trip_survives_restart() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let root = root_client(server.addr()).await;

    let created = root
        .create_user("carol", "carol-pass", UserStatus::Active, Some(stream_reader(3)))
        .await
        .expect("create carol");
    assert_eq!(created.username, "carol");
    assert_eq!(created.status, UserStatus::Active);
    assert_eq!(created.permissions, Some(stream_reader(3)));
    let carol = created.id;
    assert_ne!(carol, 0, "root is user 0");
    let dave = root
        .create_user("dave", "dave-pass", UserStatus::Inactive, None)
        .await
        .expect("create dave")
        .id;

    let by_name = root
        .get_user(&id_name("carol"))
        .await
        .expect("get by name")
        .expect("carol exists");
    assert_eq!(by_name.id, carol);
    let users = root.get_users().await.expect("list");
    let mut names: Vec<&str> = users.iter().map(|u| u.username.as_str()).collect();
    names.sort();
    assert_eq!(names, vec!["carol", "dave", "iggy"]);
    let root_details = root.get_user(&id_num(0)).await.unwrap().expect("root");
    assert!(
        root_details
            .permissions
            .is_some_and(|p| p.global.manage_users && p.global.send_messages),
        "root reports every permission"
    );

    // Update name and status, then permissions.
    root.update_user(
        &id_num(carol),
        Some("carol2"),
        Some(UserStatus::Inactive),
        &UserUpdateOptions::default(),
    )
    .await
    .expect("update carol");
    let mut global = Permissions::default();
    global.global.read_servers = true;
    root.update_permissions(&id_num(carol), Some(global.clone()))
        .await
        .expect("update permissions");
    root.update_user(
        &id_num(dave),
        None,
        Some(UserStatus::Active),
        &UserUpdateOptions::default(),
    )
    .await
    .expect("activate dave");
    root.change_password(&id_num(dave), "x-unused", "dave-new")
        .await
        .expect("reset dave");
    drop(root);
    server.stop();

    let server = TestServer::start(dir.path());
    let root = root_client(server.addr()).await;
    let c = root
        .get_user(&id_num(carol))
        .await
        .unwrap()
        .expect("carol survives restart");
    assert_eq!(c.username, "carol2");
    assert_eq!(c.status, UserStatus::Inactive);
    assert_eq!(c.permissions, Some(global));
    let client = sdk_client(server.addr()).await;
    assert_code(client.login_user("carol2", "carol-pass").await, 47);
    let d = login(server.addr(), "dave", "dave-new").await;
    d.get_me().await.expect("dave works after restart");

    root.delete_user(&id_name("carol2")).await.expect("delete carol");
    assert!(root.get_user(&id_num(carol)).await.unwrap().is_none());
    assert_code(root.delete_user(&id_num(carol)).await, 20);
    let new_id = root
        .create_user("erin", "erin-pass", UserStatus::Active, None)
        .await
        .expect("create erin")
        .id;
    assert!(new_id > dave, "user ids are not reused");
    drop((root, client, d));
    server.stop();

    let server = TestServer::start(dir.path());
    let root = root_client(server.addr()).await;
    let users = root.get_users().await.expect("list after second restart");
    let mut names: Vec<&str> = users.iter().map(|u| u.username.as_str()).collect();
    names.sort();
    assert_eq!(names, vec!["dave", "erin", "iggy"], "the delete persisted");
    drop(root);
    server.stop();
}

/// Inactive users cannot log in; deactivating a logged-in user refuses its next command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inactive_users_cannot_log_in_or_act() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let addr = server.addr();
    let root = root_client(addr).await;
    let id = root
        .create_user("frank", "frank-pass", UserStatus::Inactive, None)
        .await
        .expect("create")
        .id;
    let client = sdk_client(addr).await;
    assert_code(client.login_user("frank", "frank-pass").await, 47);
    root.update_user(
        &id_num(id),
        None,
        Some(UserStatus::Active),
        &UserUpdateOptions::default(),
    )
    .await
    .expect("activate");
    client
        .login_user("frank", "frank-pass")
        .await
        .expect("active user logs in");
    client.get_me().await.expect("works while active");
    let pat = client
        .create_personal_access_token("frank-pat", PersonalAccessTokenExpiry::NeverExpire)
        .await
        .expect("PAT");
    root.update_user(
        &id_num(id),
        None,
        Some(UserStatus::Inactive),
        &UserUpdateOptions::default(),
    )
    .await
    .expect("deactivate");
    assert_code(client.get_me().await, 47);
    let pat_client = sdk_client(addr).await;
    assert_code(pat_client.login_with_personal_access_token(&pat.token).await, 47);
    drop((root, client, pat_client));
    server.stop();
}

fn create_user_body(username: &str, password: &str, status: u8) -> Vec<u8> {
    let mut b = Vec::new();
    enc::name(&mut b, username);
    b.push(password.len() as u8);
    b.extend_from_slice(password.as_bytes());
    b.push(status);
    b.push(0); // no permissions
    b
}

/// Duplicates and bounds, checked by the server (raw frames: the SDK validates lengths
/// itself before sending).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_and_bounds() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let root = root_client(server.addr()).await;
    root.create_user("grace", "grace-pass", UserStatus::Active, None)
        .await
        .expect("create");
    let henry = root
        .create_user("henry", "henry-pass", UserStatus::Active, None)
        .await
        .expect("create")
        .id;
    assert_code(
        root.create_user("grace", "other-pass", UserStatus::Active, None)
            .await,
        46,
    );
    assert_code(
        root.update_user(&id_num(henry), Some("grace"), None, &UserUpdateOptions::default())
            .await,
        46,
    );

    let mut raw = RawConn::connect(server.addr()).await;
    raw.login_root().await;
    raw.call(33, &create_user_body("ab", "long-enough", 1))
        .await
        .assert_error(43);
    raw.call(33, &create_user_body(&"u".repeat(51), "long-enough", 1))
        .await
        .assert_error(43);
    raw.call(33, &create_user_body("ivan", "pw", 1))
        .await
        .assert_error(44);
    raw.call(33, &create_user_body("ivan", &"p".repeat(101), 1))
        .await
        .assert_error(44);
    raw.call(33, &create_user_body("ivan", "ivan-pass", 3))
        .await
        .assert_error(45);
    let _ = raw
        .call(33, &create_user_body(&"u".repeat(50), &"p".repeat(100), 1))
        .await
        .ok_payload();
    // Permissions listing more than 10 000 streams are refused (4), not stored.
    let streams = 10_001u32;
    let mut perms = vec![0u8; 10];
    perms.push(1);
    for id in 0..streams {
        perms.extend_from_slice(&id.to_le_bytes());
        perms.extend_from_slice(&[0, 1, 0, 0, 1, 0]);
        perms.push(0); // no topics
        perms.push(u8::from(id + 1 < streams));
    }
    let mut body = Vec::new();
    enc::name(&mut body, "huge-perms");
    body.push(9);
    body.extend_from_slice(b"huge-pass");
    body.push(1);
    body.push(1);
    body.extend_from_slice(&(perms.len() as u32).to_le_bytes());
    body.extend_from_slice(&perms);
    raw.call(33, &body).await.assert_error(4);
    assert!(
        root.get_user(&id_name("huge-perms"))
            .await
            .expect("get")
            .is_none()
    );

    // Personal access tokens: name bounds, duplicates, per-user limit, delete.
    assert_code(
        root.create_personal_access_token("ab", PersonalAccessTokenExpiry::NeverExpire)
            .await,
        50,
    );
    root.create_personal_access_token("tok-dup", PersonalAccessTokenExpiry::NeverExpire)
        .await
        .expect("first");
    assert_code(
        root.create_personal_access_token("tok-dup", PersonalAccessTokenExpiry::NeverExpire)
            .await,
        51,
    );
    for i in 1..100 {
        root.create_personal_access_token(&format!("tok-{i:03}"), PersonalAccessTokenExpiry::NeverExpire)
            .await
            .expect("within the limit");
    }
    assert_code(
        root.create_personal_access_token("tok-over", PersonalAccessTokenExpiry::NeverExpire)
            .await,
        52,
    );
    root.delete_personal_access_token("tok-dup")
        .await
        .expect("delete");
    assert_code(root.delete_personal_access_token("tok-dup").await, 20);
    root.create_personal_access_token("tok-over", PersonalAccessTokenExpiry::NeverExpire)
        .await
        .expect("room again after a delete");
    assert_eq!(root.get_personal_access_tokens().await.expect("list").len(), 100);
    drop(root);
    server.stop();
}

/// GetMe, GetClient, GetClients: every live TCP and HTTP client, with transport, address,
/// user id and group memberships; GetClients needs read_servers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_are_listed_with_their_groups() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let addr = server.addr();
    let root = root_client(addr).await;
    let (s, t) = stream_with_topic(&root, "cg").await;
    let g = root
        .create_consumer_group(&id_num(s), &id_num(t), "group")
        .await
        .expect("group")
        .id;
    let mut poller = Permissions::default();
    poller.global.poll_messages = true;
    let user_id = root
        .create_user("judy", "judy-pass", UserStatus::Active, Some(poller))
        .await
        .expect("create")
        .id;
    let judy = login(addr, "judy", "judy-pass").await;
    judy.join_consumer_group(&id_num(s), &id_num(t), &id_num(g))
        .await
        .expect("join with poll permission");
    let me = judy.get_me().await.expect("me");
    assert_eq!(me.user_id, Some(user_id));
    assert_eq!(me.transport, "TCP");
    assert_eq!(me.consumer_groups_count, 1);
    assert_eq!(
        (
            me.consumer_groups[0].stream_id,
            me.consumer_groups[0].topic_id,
            me.consumer_groups[0].group_id
        ),
        (s, t, g)
    );
    assert_code(judy.get_clients().await, 41);
    assert_code(judy.get_client(me.client_id).await, 41);

    let anonymous = sdk_client(addr).await; // connected, not logged in
    let http =
        iggy::prelude::HttpClient::new(&format!("http://{}", server.http_addr())).expect("http client");
    http.login_user("judy", "judy-pass").await.expect("HTTP login");

    let clients = root.get_clients().await.expect("root lists clients");
    let judy_tcp = clients
        .iter()
        .find(|c| c.client_id == me.client_id)
        .expect("judy's connection listed");
    assert_eq!(judy_tcp.user_id, Some(user_id));
    assert_eq!(judy_tcp.transport, "TCP");
    assert_eq!(judy_tcp.address, me.address);
    assert_eq!(judy_tcp.consumer_groups_count, 1);
    assert!(
        clients
            .iter()
            .any(|c| c.user_id.is_none() && c.transport == "TCP"),
        "a connection without a login is listed with no user: {clients:?}"
    );
    assert!(
        clients
            .iter()
            .any(|c| c.user_id == Some(user_id) && c.transport == "HTTP"),
        "the HTTP login is listed: {clients:?}"
    );
    let root_me = root.get_me().await.expect("root me");
    assert!(
        clients
            .iter()
            .any(|c| c.client_id == root_me.client_id && c.user_id == Some(0))
    );

    let details = root
        .get_client(me.client_id)
        .await
        .expect("get_client")
        .expect("judy's client exists");
    assert_eq!(details.user_id, Some(user_id));
    assert_eq!(details.consumer_groups.len(), 1);
    assert_eq!(details.consumer_groups[0].group_id, g);
    assert!(root.get_client(999_999).await.expect("missing").is_none());

    // Leaving the group shows at once; a closed connection leaves the list once the server
    // has seen it close (bounded wait on that condition).
    judy.leave_consumer_group(&id_num(s), &id_num(t), &id_num(g))
        .await
        .expect("leave");
    assert!(judy.get_me().await.expect("me").consumer_groups.is_empty());
    judy.disconnect().await.expect("disconnect");
    drop(judy);
    let started = Instant::now();
    while root
        .get_clients()
        .await
        .expect("clients")
        .iter()
        .any(|c| c.client_id == me.client_id)
    {
        assert!(
            started.elapsed() < CONDITION_TIMEOUT,
            "a closed connection is still listed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop((root, anonymous, http));
    server.stop();
}

fn http_client(server: &TestServer) -> HttpClient {
    HttpClient::create(std::sync::Arc::new(HttpClientConfig {
        api_url: format!("http://{}", server.http_addr()),
        // A retry would hide what the server answered first.
        retries: 0,
        ..Default::default()
    }))
    .expect("http client")
}

/// The user, token and client routes of the SDK's `HttpClient` go through the same handler:
/// same records, same permission refusals (403 → 41).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_tokens_and_clients_over_http() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let root = http_client(&server);
    root.login_user(ROOT_USER, ROOT_PASSWORD)
        .await
        .expect("root HTTP login");
    let a = root.create_stream("http-a").await.expect("stream a").id;
    root.create_stream("http-b").await.expect("stream b");

    let created = root
        .create_user("kim", "kim-pass", UserStatus::Active, Some(stream_reader(a)))
        .await
        .expect("create over HTTP");
    assert_eq!(created.permissions, Some(stream_reader(a)));
    let kim = created.id;
    let fetched = root.get_user(&id_num(kim)).await.expect("get").expect("exists");
    assert_eq!(fetched.username, "kim");
    assert_eq!(fetched.permissions, Some(stream_reader(a)));
    assert!(root.get_user(&id_num(4242)).await.expect("missing").is_none());
    assert_eq!(root.get_users().await.expect("list").len(), 2);
    root.update_user(&id_num(kim), Some("kim2"), None, &UserUpdateOptions::default())
        .await
        .expect("rename");
    let mut more = stream_reader(a);
    more.global.read_servers = true;
    root.update_permissions(&id_num(kim), Some(more.clone()))
        .await
        .expect("permissions");
    root.change_password(&id_num(kim), "ignored", "kim-new")
        .await
        .expect("reset");

    let user = http_client(&server);
    user.login_user("kim2", "kim-new")
        .await
        .expect("login with the new name and password");
    let streams = user.get_streams().await.expect("streams");
    assert_eq!(streams.iter().map(|s| s.id).collect::<Vec<_>>(), vec![a]);
    assert_code(user.create_stream("nope").await, 41);
    assert_code(user.get_users().await, 41);
    let clients = user.get_clients().await.expect("read_servers lists clients");
    assert!(
        clients
            .iter()
            .any(|c| c.user_id == Some(kim) && c.transport == "HTTP"),
        "{clients:?}"
    );
    let mine = clients
        .iter()
        .find(|c| c.user_id == Some(kim))
        .expect("kim's client");
    let details = user
        .get_client(mine.client_id)
        .await
        .expect("get_client")
        .expect("exists");
    assert_eq!(details.user_id, Some(kim));
    assert!(details.consumer_groups.is_empty());

    // Tokens: create, list, log in with one (same permissions), delete.
    let pat = user
        .create_personal_access_token("kim-http", PersonalAccessTokenExpiry::NeverExpire)
        .await
        .expect("create PAT");
    let listed = user.get_personal_access_tokens().await.expect("list PATs");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].name, "kim-http");
    assert!(listed[0].expiry_at.is_none());
    let via_pat = http_client(&server);
    let identity = via_pat
        .login_with_personal_access_token(&pat.token)
        .await
        .expect("PAT login over HTTP");
    assert_eq!(identity.user_id, kim);
    assert_code(via_pat.create_stream("nope").await, 41);
    user.delete_personal_access_token("kim-http")
        .await
        .expect("delete PAT");
    assert!(user.get_personal_access_tokens().await.expect("list").is_empty());

    root.delete_user(&id_num(kim)).await.expect("delete");
    assert_code(user.get_streams().await, 40);
    // Other refusals are HTTP 400 with the Iggy code in the body.
    match root.delete_user(&id_num(0)).await {
        Err(IggyError::HttpResponseError(400, body)) => {
            assert!(body.contains("\"id\":48"), "root delete refused with 48: {body}");
            assert!(body.contains("cannot_delete_user"), "{body}");
        }
        other => panic!("deleting root over HTTP: expected 400 with code 48, got {other:?}"),
    }
    drop((root, user, via_pat));
    server.stop();
}

/// A user allowed only to send to one topic can run the SDK's high-level `IggyProducer`
/// (whose init looks up the stream and the topic), and nothing more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_only_user_runs_the_high_level_producer() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let addr = server.addr();
    let root = root_client(addr).await;
    let (s, t) = stream_with_topic(&root, "produce-here").await;
    let (other, _) = stream_with_topic(&root, "elsewhere").await;
    let mut topics = BTreeMap::new();
    topics.insert(
        t as usize,
        TopicPermissions {
            send_messages: true,
            ..Default::default()
        },
    );
    let mut streams = BTreeMap::new();
    streams.insert(
        s as usize,
        StreamPermissions {
            topics: Some(topics),
            ..Default::default()
        },
    );
    let permissions = Permissions {
        global: GlobalPermissions::default(),
        streams: Some(streams),
    };
    root.create_user(
        "pat-producer",
        "producer-pass",
        UserStatus::Active,
        Some(permissions),
    )
    .await
    .expect("create producer user");

    let client = login(addr, "pat-producer", "producer-pass").await;
    let producer = client
        .producer("produce-here", "t")
        .expect("producer builder")
        .direct(DirectConfig::builder().build())
        .build();
    producer
        .init()
        .await
        .expect("producer init with send-only permission");
    producer
        .send(vec![sdk_message(7, b"from a producer".to_vec())])
        .await
        .expect("producer send");
    producer.shutdown().await;

    let polled = poll_first(&root, s, t).await.expect("root polls");
    assert_eq!(polled.messages.len(), 1, "the producer's message arrived");
    assert_code(poll_first(&client, s, t).await, 41);
    assert_code(client.get_stream(&id_num(other)).await, 41);
    let visible: Vec<u32> = client
        .get_streams()
        .await
        .expect("streams")
        .iter()
        .map(|x| x.id)
        .collect();
    assert_eq!(visible, vec![s], "only the stream with a grant is listed");
    drop((root, client));
    server.stop();
}
