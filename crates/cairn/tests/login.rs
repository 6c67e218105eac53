//! Acceptance 2 (connect, login, GetMe, wrong password, unauthenticated commands) and the
//! session items of the conformance checklist (§11 items 1, 3, 4, 5, 6, 9, 35).

mod common;

use common::*;
use iggy::prelude::*;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_login_and_get_me() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let client = sdk_client(server.addr()).await;

    // Ping before login must work (heartbeat / `iggy ping`).
    client.ping().await.expect("ping before login");

    let identity = client
        .login_user(ROOT_USER, ROOT_PASSWORD)
        .await
        .expect("root login");
    let me = client.get_me().await.expect("get_me");
    assert_eq!(
        me.user_id,
        Some(identity.user_id),
        "GetMe reports the logged-in user"
    );
    assert_eq!(me.transport, "TCP", "GetMe transport must be TCP (1)");
    assert!(!me.address.is_empty(), "GetMe address is empty");
    assert_eq!(me.consumer_groups_count, 0);
    assert!(me.consumer_groups.is_empty());
    client.ping().await.expect("ping after login");
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_password_is_invalid_credentials_and_connection_survives() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let client = sdk_client(server.addr()).await;

    let err = client
        .login_user(ROOT_USER, "definitely-wrong")
        .await
        .expect_err("login with a wrong password must fail");
    assert_eq!(err.as_code(), 42, "expected InvalidCredentials (42), got {err:?}");

    let err = client
        .login_user("nobody-here", ROOT_PASSWORD)
        .await
        .expect_err("login of an unknown user must fail");
    assert_eq!(err.as_code(), 42, "unknown user: expected 42, got {err:?}");

    // Same client object, same TCP connection (reconnection is disabled in the harness).
    client
        .ping()
        .await
        .expect("connection still usable after failed logins");
    client
        .login_user(ROOT_USER, ROOT_PASSWORD)
        .await
        .expect("correct login after a failed one");
    client.get_me().await.expect("get_me after relogin");
    server.stop();
}

#[tokio::test]
async fn raw_wrong_password_is_status_42_and_connection_stays_open() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let mut raw = RawConn::connect(server.addr()).await;
    let f = raw.login(ROOT_USER, "wrong-password").await;
    if f.is_eviction() {
        // Eviction 9 is an allowed alternative (§4.2); the client raises 42 either way.
        assert_eq!(f.eviction_reason(), 9, "eviction reason for bad credentials");
        return;
    }
    assert_eq!(f.operation(), op::REGISTER);
    f.assert_error(42);
    // The connection still works: a correct Register on the same socket succeeds.
    let f = raw.login(ROOT_USER, ROOT_PASSWORD).await;
    let _ = f.ok_payload();
    assert!(raw.session > 0);
    server.stop();
}

/// Every command other than Ping before login is refused with 40 (or an eviction the client
/// maps to 40). Ping before login succeeds.
#[tokio::test]
async fn commands_before_login_are_unauthenticated() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());

    // Ping (op 2, code 1, session 0, request 1) works.
    let mut raw = RawConn::connect(server.addr()).await;
    let f = raw.call(code::PING, &[]).await;
    assert!(f.is_reply());
    assert_eq!(f.status(), 0, "ping before login must succeed");
    assert!(f.body.is_empty(), "ping reply body must be empty");

    // Reads (op 2) before login.
    let reads: Vec<(u32, Vec<u8>)> = vec![
        (code::GET_STREAMS, vec![]),
        (code::GET_STATS, vec![]),
        (code::GET_ME, vec![]),
        (code::GET_STREAM, {
            let mut b = Vec::new();
            enc::id_num(&mut b, 0);
            b
        }),
        (code::POLL_MESSAGES, enc::poll(1, 0, 0, None, (3, 0), 10, false)),
        (code::GET_CLUSTER_METADATA, vec![]),
    ];
    for (c, body) in reads {
        let mut raw = RawConn::connect(server.addr()).await;
        let f = raw.call(c, &body).await;
        assert_eq!(
            f.sdk_error_code(),
            Some(40),
            "code {c} before login: expected 40, got command {} status {} reason {}",
            f.command(),
            f.status(),
            f.eviction_reason()
        );
        if f.is_reply() {
            assert!(f.body.is_empty(), "error reply must have an empty body");
        }
    }

    // Replicated writes before login, with a made-up session (a session of 0 would be a
    // header violation for these operations).
    let writes: Vec<(u32, Vec<u8>)> = vec![
        (code::CREATE_STREAM, enc::create_stream("nope")),
        (
            code::SEND_MESSAGES,
            enc::send_messages(0, 0, 0, &batch::encode(&[batch::simple(1, b"x")])),
        ),
        (code::STORE_CONSUMER_OFFSET, enc::store_offset(1, 0, 0, None, 0)),
    ];
    for (c, body) in writes {
        let mut raw = RawConn::connect(server.addr()).await;
        raw.session = 0x0bad_5e55_1011;
        let f = raw.call(c, &body).await;
        assert_eq!(
            f.sdk_error_code(),
            Some(40),
            "code {c} before login: expected 40, got command {} status {} reason {}",
            f.command(),
            f.status(),
            f.eviction_reason()
        );
    }

    // Nothing was created by the refused requests.
    let client = root_client(server.addr()).await;
    assert!(client.get_streams().await.unwrap().is_empty());
    server.stop();
}

/// §11 item 3: the login reply layout.
#[tokio::test]
async fn login_reply_layout() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let mut raw = RawConn::connect(server.addr()).await;
    let body = enc::login_body(PROTOCOL_VERSION, ROOT_USER, ROOT_PASSWORD);
    let client_id = random_client_id();
    let mut h = ReqHeader::new(client_id, op::REGISTER, 0, 0, 0);
    h.request_checksum = request_checksum_for(op::REGISTER, &body);
    raw.send_frame(&h, &body).await.unwrap();
    let f = raw.read_frame().await;
    assert_eq!(f.command(), CMD_REPLY);
    assert_eq!(f.status(), 0);
    assert_eq!(f.operation(), op::REGISTER, "operation echoed");
    assert_eq!(f.client(), client_id, "client echoed at 160");
    assert_eq!(f.request(), 0, "request echoed at 200");
    assert_eq!(
        f.request_checksum(),
        h.request_checksum,
        "request_checksum echoed at 128"
    );
    assert_eq!(f.size() as usize, HEADER_SIZE + f.body.len());
    let mut c = rec::Cursor::new(&f.body);
    assert_eq!(c.u32(), 0, "empty result section [0u32] first");
    let _user_id = c.u32();
    let session = c.u64();
    assert!(session > 0, "session must be > 0");
    assert_eq!(c.u32(), PROTOCOL_VERSION, "server protocol version");
    let version = c.name();
    assert!(!version.is_empty());
    assert_eq!(c.remaining(), 0, "no trailing bytes after the login reply");

    // A second Register gets a different session.
    raw.absorb_login(&f);
    let f2 = raw.login(ROOT_USER, ROOT_PASSWORD).await;
    let _ = f2.ok_payload();
    assert_ne!(raw.session, session, "each Register gets a new session");
    server.stop();
}

/// §11 item 6: protocol version outside 0x2C00..=0x2FFF → Eviction 14 with the window.
#[tokio::test]
async fn incompatible_protocol_version_is_evicted_with_reason_14() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    for version in [0x2BFFu32, 0x3000, 0x0000_2800, 0x0010_0000] {
        let mut raw = RawConn::connect(server.addr()).await;
        let body = enc::login_body(version, ROOT_USER, ROOT_PASSWORD);
        let f = raw.register_raw(&body).await;
        assert!(
            f.is_eviction(),
            "version {version:#x}: expected Eviction (13), got command {} status {}",
            f.command(),
            f.status()
        );
        assert_eq!(f.size(), 256, "eviction is header-only");
        assert_eq!(f.eviction_reason(), 14, "version {version:#x}: reason");
        let (max, min) = (f.eviction_max_version(), f.eviction_min_version());
        assert!(min >= 1 && min <= max, "window min {min:#x} max {max:#x}");
        assert!(
            (min..=max).contains(&PROTOCOL_VERSION),
            "window must contain 0x2C00: {min:#x}..={max:#x}"
        );
        assert_eq!(f.eviction_client(), raw.client, "eviction echoes the client id");
        assert_eq!(f.sdk_error_code(), Some(14003));
    }
    // Any 0.11.x is accepted.
    for version in [0x2C00u32, 0x2C05, 0x2FFF] {
        let mut raw = RawConn::connect(server.addr()).await;
        let body = enc::login_body(version, ROOT_USER, ROOT_PASSWORD);
        let f = raw.register_raw(&body).await;
        let _ = f.ok_payload();
    }
    server.stop();
}

/// §11 items 5 and 37 (partly): PAT creation, SDK login with it, raw PAT Register.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn personal_access_token_login() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let admin = root_client(server.addr()).await;
    let pat = admin
        .create_personal_access_token("it-token", PersonalAccessTokenExpiry::NeverExpire)
        .await
        .expect("create PAT");
    assert!(!pat.token.is_empty());

    let client = sdk_client(server.addr()).await;
    let identity = client
        .login_with_personal_access_token(&pat.token)
        .await
        .expect("login with PAT");
    let me = client.get_me().await.expect("get_me with PAT session");
    assert_eq!(me.user_id, Some(identity.user_id));
    client
        .create_stream("made-with-pat")
        .await
        .expect("PAT session can write");

    // Raw: the PAT body `[version][sdk][sdk version][len u8][token][0u32]` is told apart
    // from a password body by parsing.
    let mut raw = RawConn::connect(server.addr()).await;
    let f = raw
        .register_raw(&enc::pat_login_body(PROTOCOL_VERSION, &pat.token))
        .await;
    let p = f.ok_payload();
    assert!(p.len() >= 17, "login payload too short");
    raw.absorb_login(&f);
    assert!(raw.session > 0);
    let f = raw.call(code::GET_STREAMS, &[]).await;
    let _ = f.ok_payload();

    // A wrong token is refused with 53 (or eviction 10, which the client maps to 53).
    let bad = sdk_client(server.addr()).await;
    let err = bad
        .login_with_personal_access_token("not-a-real-token-value")
        .await
        .expect_err("bad PAT must fail");
    assert_eq!(err.as_code(), 53, "bad PAT: expected 53, got {err:?}");
    server.stop();
}

/// §11 item 9: Logout (op 3) → empty body without a result section; a new Register on the
/// same connection succeeds; the old session is no longer authenticated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logout_then_login_again_on_the_same_connection() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());

    let mut raw = RawConn::connect(server.addr()).await;
    raw.login_root().await;
    let f = raw.call(code::LOGOUT, &[]).await;
    assert!(f.is_reply());
    assert_eq!(f.status(), 0, "logout status");
    assert_eq!(f.operation(), op::LOGOUT, "logout operation echoed");
    assert!(
        f.body.is_empty(),
        "logout reply must be empty (no result section)"
    );
    // After logout, reads are unauthenticated again.
    let f = raw.call(code::GET_STREAMS, &[]).await;
    assert_eq!(f.sdk_error_code(), Some(40), "GetStreams after logout");
    if f.is_eviction() {
        raw = RawConn::connect(server.addr()).await;
    }
    raw.login_root().await;
    let f = raw.call(code::GET_STREAMS, &[]).await;
    let _ = f.ok_payload();

    // SDK: logout_user then login_user again on the same client.
    let client = root_client(server.addr()).await;
    client.logout_user().await.expect("logout");
    client
        .login_user(ROOT_USER, ROOT_PASSWORD)
        .await
        .expect("relogin after logout");
    client.get_me().await.expect("get_me after relogin");
    server.stop();
}

/// Password is taken from CAIRN_ROOT_PASSWORD: the default Iggy password does not work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn root_password_comes_from_the_environment() {
    let dir = temp_dir();
    let server = TestServer::start(dir.path());
    let client = sdk_client(server.addr()).await;
    let err = client
        .login_user(ROOT_USER, DEFAULT_ROOT_PASSWORD)
        .await
        .expect_err("the default password must not work");
    assert_eq!(err.as_code(), 42);
    tokio::time::timeout(
        Duration::from_secs(10),
        client.login_user(ROOT_USER, ROOT_PASSWORD),
    )
    .await
    .expect("timeout")
    .expect("login with the configured password");
    server.stop();
}

/// Conformance items 7 and 8: after a manual login the server sees exactly Register (login),
/// GetClusterMetadata, GetClusterMetadata; the one-node metadata reply means the client never
/// sends the multi-node routing codes (103/104/123/14) afterwards, not even for auto-commit
/// polls and offset writes. Observed through the server's per-request debug log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manual_login_sequence_and_no_routing_codes() {
    let dir = temp_dir();
    let server = TestServer::start_with(dir.path(), &[], &[("RUST_LOG", "cairn=debug")]);
    let client = sdk_client(server.addr()).await;
    client.login_user(ROOT_USER, ROOT_PASSWORD).await.expect("login");
    let (s, t) = create_stream_topic(&client, "seq", "t", 1).await;
    let mut msgs = vec![sdk_message(1, b"one".to_vec())];
    client
        .send_messages(&id_num(s), &id_num(t), &Partitioning::partition_id(0), &mut msgs)
        .await
        .expect("send");
    let consumer = Consumer::new(id_num(1));
    client
        .poll_messages(
            &id_num(s),
            &id_num(t),
            Some(0),
            &consumer,
            &PollingStrategy::next(),
            10,
            true,
        )
        .await
        .expect("auto-commit poll");
    client
        .store_consumer_offset(&consumer, &id_num(s), &id_num(t), Some(0), 0)
        .await
        .expect("store offset");
    client.ping().await.expect("ping");

    // The server logs each request as it serves it; the reply to the last one (Ping) has
    // arrived, so its log line was written. Wait (bounded) for it to be read from the pipe.
    let commands = |logs: &str| -> Vec<String> {
        logs.lines()
            .filter(|l| l.contains(" request ") && l.contains("command="))
            .filter_map(|l| {
                l.split("command=")
                    .nth(1)?
                    .split_whitespace()
                    .next()
                    .map(str::to_string)
            })
            .map(|c| c.trim_matches('"').to_string())
            .filter(|c| c != "Ping")
            .collect()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut seen = commands(&server.logs());
    while !seen.iter().any(|c| c == "StoreConsumerOffset") {
        assert!(
            std::time::Instant::now() < deadline,
            "request log lines never arrived: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        seen = commands(&server.logs());
    }
    assert_eq!(
        &seen[..3],
        &["LoginUser", "GetClusterMetadata", "GetClusterMetadata"],
        "manual login sequence: {seen:?}"
    );
    assert!(
        !server.logs().contains("request refused"),
        "no undecodable request (routing codes 103/104/123/14 would be): {}",
        server.logs()
    );
    drop(client);
    server.stop();
}
