//! Hardening (docs/SECURITY.md) against real processes: response headers
//! and the separate metrics listener, private state files, WebSocket caps
//! per user behind one address and `http.trusted_proxies`, half-open
//! handshakes (slow loris) cut at their deadline without a slot, a daemon whose
//! allowlist is locked, the caps on a daemon's dirs, JSON nested too deep,
//! the audit record of a real terminal session, the open-file limit, and
//! HEAD and 405's `Allow`.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;
use support::client::{create_token, daemon_url, viewer_url, Api, Event, Socket, WAIT};
use support::daemon::DaemonProcess;
use support::e2e::{self, wait_online, Viewer};
use support::{free_port, TetherServer};
use tether::client::{AuditEvent, AuditFilter, NewToken};
use tether::viewer_protocol::ClientMessage;

const DAEMON: &[&str] = &["tether.daemon.v1"];
const VIEWER: &[&str] = &["tether.v1"];

/// Status and headers of a plain GET.
async fn get(url: &str) -> (u16, awc::http::header::HeaderMap, String) {
    let mut res = awc::Client::default().get(url).send().await.unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let body = res.body().limit(8 * 1024 * 1024).await.unwrap_or_default();
    (res.status().as_u16(), res.headers().clone(), String::from_utf8_lossy(&body).into_owned())
}

#[actix_rt::test]
async fn responses_carry_security_headers_and_metrics_can_move() {
    let metrics_listen = format!("127.0.0.1:{}", free_port());
    let server = TetherServer::start(&[("TETHER_METRICS__LISTEN", &metrics_listen)], &[]).await;
    for path in ["/healthz", "/", "/api/v1/hosts", "/no-such-page"] {
        let (status, headers, _) = get(&format!("{}{path}", server.url())).await;
        assert_ne!(status, 0, "{path}");
        assert_eq!(headers.get("x-content-type-options").map(|v| v.to_str().unwrap()), Some("nosniff"), "{path}");
        assert_eq!(headers.get("referrer-policy").map(|v| v.to_str().unwrap()), Some("no-referrer"), "{path}");
    }
    // /metrics is no longer served with the API...
    let (status, _, body) = get(&format!("{}/metrics", server.url())).await;
    assert_eq!(status, 404, "{body}");
    // ...but on its own address, and only /metrics there.
    let (status, headers, body) = get(&format!("http://{metrics_listen}/metrics")).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("tether_"), "{body}");
    // Counters alerted on by their increase are there, at 0, before any.
    for counter in [
        "tether_bus_gaps_total",
        "tether_bus_duplicates_total",
        "tether_stream_gaps_total",
        "tether_run_log_gap_bytes_total",
        "tether_audit_events_dropped_total",
    ] {
        assert!(body.lines().any(|l| l == format!("{counter} 0")), "{counter} is not at 0:\n{body}");
    }
    assert_eq!(headers.get("x-content-type-options").map(|v| v.to_str().unwrap()), Some("nosniff"));
    let (status, _, _) = get(&format!("http://{metrics_listen}/api/v1/hosts")).await;
    assert_eq!(status, 404, "the metrics listener serves nothing else");
    assert!(server.log().contains(&format!("/metrics is served on http://{metrics_listen}/metrics only")));
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).permissions().mode() & 0o777
}

/// Status, headers and body of a request with `method`, with a token.
async fn request(method: &str, url: &str, token: Option<&str>) -> (u16, awc::http::header::HeaderMap, Vec<u8>) {
    let method = awc::http::Method::from_bytes(method.as_bytes()).expect("method");
    let mut req = awc::Client::default().request(method, url);
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    let mut res = req.send().await.unwrap_or_else(|e| panic!("{url}: {e}"));
    let body = res.body().await.unwrap_or_default();
    (res.status().as_u16(), res.headers().clone(), body.to_vec())
}

/// HEAD answers every GET route but the sockets as GET does (status,
/// headers, the token checks), without the body; a method a path does not
/// serve is 405 with an `Allow` header naming the ones it does. HEAD used
/// to be 405 everywhere, and a 405 said nothing of what was allowed.
#[actix_rt::test]
async fn head_is_a_get_without_a_body_and_a_405_says_what_is_allowed() {
    let server = TetherServer::start(&[], &[]).await;
    let token = create_token(&server, "ann");
    for path in ["/healthz", "/api/v1/hosts", "/api/v1/tokens", "/", "/manifest.webmanifest"] {
        let url = format!("{}{path}", server.url());
        let (get_status, get_headers, get_body) = request("GET", &url, Some(&token)).await;
        let (status, headers, body) = request("HEAD", &url, Some(&token)).await;
        assert_eq!((status, get_status), (200, 200), "{path}");
        assert!(body.is_empty(), "{path}: a HEAD answer has no body");
        assert!(!get_body.is_empty(), "{path}");
        assert_eq!(headers.get("content-type"), get_headers.get("content-type"), "{path}");
        assert_eq!(headers.get("content-length"), get_headers.get("content-length"), "{path}");
    }
    let hosts = format!("{}/api/v1/hosts", server.url());
    assert_eq!(request("HEAD", &hosts, None).await.0, 401, "HEAD checks the token as GET does");
    for (method, path, allow) in [
        ("PATCH", "/api/v1/hosts", "POST, HEAD, GET"),
        ("PUT", "/api/v1/tokens/00000000-0000-0000-0000-000000000000", "DELETE"),
        ("HEAD", "/ws/v1/daemon", "GET"),
        ("POST", "/healthz", "HEAD, GET"),
        ("POST", "/", "HEAD, GET"),
        ("DELETE", "/manifest.webmanifest", "HEAD, GET"),
    ] {
        let (status, headers, body) = request(method, &format!("{}{path}", server.url()), Some(&token)).await;
        assert_eq!(status, 405, "{method} {path}");
        assert_eq!(headers.get("allow").and_then(|v| v.to_str().ok()), Some(allow), "{method} {path}");
        if method != "HEAD" {
            let body: serde_json::Value = serde_json::from_slice(&body).expect("json");
            assert_eq!(body["error"]["code"], "method_not_allowed");
        }
    }
    // A plain GET of a socket's path is refused in the API's error shape.
    for path in ["/ws/v1/daemon", "/ws/v1/terminals/00000000-0000-0000-0000-000000000000"] {
        let (status, _, body) = request("GET", &format!("{}{path}", server.url()), Some(&token)).await;
        assert_eq!(status, 400, "{path}");
        let body: serde_json::Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(body["error"]["code"], "not_a_websocket", "{path}: {body}");
    }
}

#[actix_rt::test]
async fn state_files_are_private() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db_dir = dir.path().join("data/tether");
    let db = db_dir.join("tether.db");
    let db_setting = db.display().to_string();
    let server = TetherServer::start(&[("TETHER_DATABASE__SQLITE_PATH", &db_setting)], &[]).await;
    let api = Api::new(server.url(), create_token(&server, "ann"));
    let state_dir = dir.path().join("daemon-state");
    let _daemon = DaemonProcess::start(&server, &api.token, &state_dir);
    wait_online(&api).await;
    // The server wrote to the database (the host, its lease): WAL and SHM exist.
    for suffix in ["", "-wal", "-shm"] {
        let path = db_dir.join(format!("tether.db{suffix}"));
        assert_eq!(mode(&path), 0o600, "{}", path.display());
    }
    assert_eq!(mode(&db_dir), 0o700, "the database's directory, created by serve");
    // The harness created the daemon's state dir with the default mode; the
    // daemon made it private, and its files are private.
    assert_eq!(mode(&state_dir), 0o700);
    for name in ["host.json", "dirs.json"] {
        assert_eq!(mode(&state_dir.join(name)), 0o600, "{name}");
    }
}

/// `serve` raises its soft open-file limit to the hard one: a process
/// started at a soft 512 (as shells and container runtimes often start
/// one at 1,024) could otherwise hold only a few hundred sockets.
#[actix_rt::test]
async fn serve_raises_its_open_file_limit_to_the_hard_one() {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit read and write the struct passed. Each
    // test runs in its own process (nextest), and the child inherits it.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        assert!(limit.rlim_max > 512, "the hard limit here: {}", limit.rlim_max);
        let low = libc::rlimit { rlim_cur: 512, rlim_max: limit.rlim_max };
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &low), 0);
    }
    let server = TetherServer::start(&[], &[]).await;
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", server.pid())).expect("read the limits");
    let open_files = limits.lines().find(|l| l.starts_with("Max open files")).expect("the open-files line");
    let figures: Vec<&str> = open_files.split_whitespace().skip(3).take(2).collect();
    let hard = limit.rlim_max.to_string();
    assert_eq!(figures, [hard.as_str(), hard.as_str()], "{open_files}");
    assert!(server.log().contains("open_files"), "the figure is logged: {}", server.log());
}

/// True when the socket is still open after a short wait (it was served,
/// not closed 4429).
async fn still_open(sock: &mut Socket) -> bool {
    loop {
        match sock.next_within(Duration::from_millis(700)).await {
            None => return true,
            Some(Event::Close(_)) => return false,
            Some(_) => continue,
        }
    }
}

/// A user with a registered host and a (pending) terminal; returns the API
/// and the terminal id.
async fn user_with_terminal(server: &TetherServer, name: &str) -> (Api, String) {
    let api = Api::new(server.url(), create_token(server, name));
    let (status, body) = api.post("/api/v1/hosts", json!({"hostname": format!("{name}-box")})).await;
    assert_eq!(status, 201, "{body}");
    let host = body["host"]["id"].as_str().expect("host id").to_string();
    let (status, body) = api.post("/api/v1/terminals", json!({"hostId": host})).await;
    assert_eq!(status, 201, "{body}");
    (api, body["terminal"]["id"].as_str().expect("terminal id").to_string())
}

#[actix_rt::test]
async fn one_users_sockets_do_not_lock_out_another_user_behind_the_same_address() {
    let server = TetherServer::start(&[("TETHER_HTTP__WS_PER_ADDRESS", "2")], &[]).await;
    let (ann, ann_terminal) = user_with_terminal(&server, "ann").await;
    let (bob, bob_terminal) = user_with_terminal(&server, "bob").await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut sock = Socket::connect(&viewer_url(&server, &ann_terminal), Some(&ann.token), VIEWER).await;
        assert!(still_open(&mut sock).await);
        held.push(sock);
    }
    // Ann is at her cap from this address; a forged X-Forwarded-For does
    // not help without trusted proxies.
    let forged = [("X-Forwarded-For", "198.51.100.9")];
    let mut third =
        Socket::connect_with_headers(&viewer_url(&server, &ann_terminal), Some(&ann.token), VIEWER, &forged).await;
    assert_eq!(third.expect_close().await, Some(4429));
    let mut daemon = Socket::connect(&daemon_url(&server), Some(&ann.token), DAEMON).await;
    assert_eq!(daemon.expect_close().await, Some(4429));
    // Bob, from the same address, keeps his own slots: a viewer and a daemon.
    let mut viewer = Socket::connect(&viewer_url(&server, &bob_terminal), Some(&bob.token), VIEWER).await;
    assert!(still_open(&mut viewer).await, "bob's viewer was closed");
    let mut daemon = Socket::connect(&daemon_url(&server), Some(&bob.token), DAEMON).await;
    assert!(still_open(&mut daemon).await, "bob's daemon was closed");
}

#[actix_rt::test]
async fn trusted_proxies_name_the_client_and_the_user_cap_spans_addresses() {
    let server = TetherServer::start(
        &[
            ("TETHER_HTTP__WS_PER_ADDRESS", "1"),
            ("TETHER_HTTP__WS_PER_USER", "2"),
            ("TETHER_HTTP__TRUSTED_PROXIES", "127.0.0.0/8"),
        ],
        &[],
    )
    .await;
    let (ann, terminal) = user_with_terminal(&server, "ann").await;
    let url = viewer_url(&server, &terminal);
    let from = |addr: &'static str| [("X-Forwarded-For", addr)];
    let mut first = Socket::connect_with_headers(&url, Some(&ann.token), VIEWER, &from("198.51.100.1")).await;
    assert!(still_open(&mut first).await);
    let mut same = Socket::connect_with_headers(&url, Some(&ann.token), VIEWER, &from("198.51.100.1")).await;
    assert_eq!(same.expect_close().await, Some(4429), "one socket per address");
    let mut other = Socket::connect_with_headers(&url, Some(&ann.token), VIEWER, &from("198.51.100.2")).await;
    assert!(still_open(&mut other).await, "another client address behind the proxy has its own slot");
    let mut third = Socket::connect_with_headers(&url, Some(&ann.token), VIEWER, &from("198.51.100.3")).await;
    assert_eq!(third.expect_close().await, Some(4429), "two sockets per user in all");
}

/// Ann with a terminal she shares: her client, the share token, and the
/// terminal's viewer URL.
async fn shared_terminal(server: &TetherServer) -> (Api, String, String) {
    let (ann, terminal) = user_with_terminal(server, "ann").await;
    let (status, body) = ann.post("/api/v1/tokens", json!({"terminalId": terminal})).await;
    assert_eq!(status, 201, "{body}");
    let share = body["secret"].as_str().expect("secret").to_string();
    (ann, share, viewer_url(server, &terminal))
}

/// A read-only token given away (a share link) uses caps of its own: its
/// sockets at the cap do not lock its user's viewers and daemons out.
#[actix_rt::test]
async fn a_read_tokens_sockets_leave_its_users_slots_alone() {
    let server = TetherServer::start(&[("TETHER_HTTP__WS_PER_USER", "2")], &[]).await;
    let (ann, share, url) = shared_terminal(&server).await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut sock = Socket::connect(&url, Some(&share), VIEWER).await;
        assert!(still_open(&mut sock).await, "a share viewer under its cap was closed");
        held.push(sock);
    }
    let mut over = Socket::connect(&url, Some(&share), VIEWER).await;
    assert_eq!(over.expect_close().await, Some(4429), "the share token has a cap of its own");
    let mut viewer = Socket::connect(&url, Some(&ann.token), VIEWER).await;
    assert!(still_open(&mut viewer).await, "the owner's viewer was locked out by the share token");
    let mut daemon = Socket::connect(&daemon_url(&server), Some(&ann.token), DAEMON).await;
    assert!(still_open(&mut daemon).await, "the owner's daemon was locked out by the share token");
}

/// Read-only viewers (a share link's) take at most three quarters of a
/// terminal's viewers (`viewer.max_per_terminal`), so the link cannot keep
/// the terminal's owner out; a viewer refused for the cap never attached,
/// and the audit has no attach or detach of it.
#[actix_rt::test]
async fn a_share_link_cannot_fill_its_terminal() {
    let server = TetherServer::start(&[("TETHER_VIEWER__MAX_PER_TERMINAL", "4")], &[]).await;
    let (ann, share, url) = shared_terminal(&server).await;
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut sock = Socket::connect(&url, Some(&share), VIEWER).await;
        assert!(still_open(&mut sock).await, "a share viewer under the read-only cap was closed");
        held.push(sock);
    }
    let mut over = Socket::connect(&url, Some(&share), VIEWER).await;
    assert_eq!(over.expect_close().await, Some(4429), "read-only viewers past three quarters of the cap");
    let mut owner = Socket::connect(&url, Some(&ann.token), VIEWER).await;
    assert!(still_open(&mut owner).await, "the owner was kept out of the terminal by a share link");
    let mut fifth = Socket::connect(&url, Some(&ann.token), VIEWER).await;
    assert_eq!(fifth.expect_close().await, Some(4429), "the cap itself still holds");
    // The owner's attach is recorded after the refusals were: had they
    // been recorded, they would be there by then.
    let events = audit_until(&ann, "the owner's attach", |events| count(events, "attach") >= 4).await;
    assert_eq!(count(&events, "attach"), 4, "three share viewers and the owner: {events:#?}");
    assert_eq!(count(&events, "detach"), 0, "the refused viewers never attached: {events:#?}");
}

/// A WebSocket handshake that never finishes (a slow-loris client: the
/// upgrade's head sent in part, then nothing) holds no socket slot, and is
/// cut with 408 at `http.handshake_timeout_ms`.
#[actix_rt::test]
async fn half_open_handshakes_hold_no_slot_and_are_cut_at_their_deadline() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let deadline = Duration::from_millis(3000);
    let server = TetherServer::start(
        &[("TETHER_HTTP__WS_PER_ADDRESS", "2"), ("TETHER_HTTP__HANDSHAKE_TIMEOUT_MS", "3000")],
        &[],
    )
    .await;
    let (ann, terminal) = user_with_terminal(&server, "ann").await;
    let head = format!(
        "GET /ws/v1/terminals/{terminal} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\n\
         Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n",
        server.listen_addr(),
        ann.token
    );
    let opened = Instant::now();
    let mut half_open = Vec::new();
    for _ in 0..5 {
        let mut tcp = tokio::net::TcpStream::connect(server.listen_addr()).await.expect("connect");
        tcp.write_all(head.as_bytes()).await.expect("a partial upgrade");
        half_open.push(tcp);
    }
    // Ann's real sockets from the same address are served up to her cap,
    // which the half-open ones did not take; one more is refused as ever.
    let url = viewer_url(&server, &terminal);
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut sock = Socket::connect(&url, Some(&ann.token), VIEWER).await;
        assert!(still_open(&mut sock).await, "a real socket was refused while half-open handshakes were pending");
        held.push(sock);
    }
    let mut third = Socket::connect(&url, Some(&ann.token), VIEWER).await;
    assert_eq!(third.expect_close().await, Some(4429));
    assert!(opened.elapsed() < deadline, "the real sockets came while the half-open ones were pending");
    // Each half-open connection is answered 408 and closed at its deadline.
    for mut tcp in half_open {
        let mut answer = Vec::new();
        tokio::time::timeout(WAIT, tcp.read_to_end(&mut answer))
            .await
            .expect("a half-open handshake was never cut")
            .expect("read");
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        // actix times the head against a clock it refreshes every 500 ms.
        assert!(opened.elapsed() >= deadline - Duration::from_millis(500), "cut {:?} after", opened.elapsed());
    }
}

#[actix_rt::test]
async fn a_locked_daemon_refuses_remote_dir_changes() {
    let server = TetherServer::start(&[], &[]).await;
    let api = Api::new(server.url(), create_token(&server, "ann"));
    let dir = tempfile::tempdir().expect("temp dir");
    let _daemon = DaemonProcess::start_with(&server.url(), &api.token, &dir.path().join("state"), &["--lock-dirs"]);
    let host = wait_online(&api).await;
    let dirs = format!("/api/v1/hosts/{host}/dirs");
    let (status, body) = api.post(&dirs, json!({"path": "/var"})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (502, Some("daemon_refused")), "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("--lock-dirs"), "{body}");
    let (status, body) = api.delete(&format!("{dirs}?path=/tmp")).await;
    assert_eq!((status, body["error"]["code"].as_str()), (502, Some("daemon_refused")), "{body}");
    let (_, body) = api.get(&format!("/api/v1/hosts/{host}")).await;
    assert_eq!(body["host"]["dirs"], json!(["/tmp"]), "nothing changed: {body}");
}

/// A daemon takes dirs from the server up to its cap, each path up to its
/// length: past either the add is refused with a clear error and the
/// allowlist stays as it was.
#[actix_rt::test]
async fn dirs_past_the_daemons_caps_are_refused_and_the_list_is_unchanged() {
    let server = TetherServer::start(&[], &[]).await;
    let api = Api::new(server.url(), create_token(&server, "ann"));
    let dir = tempfile::tempdir().expect("temp dir");
    let _daemon = DaemonProcess::start(&server, &api.token, &dir.path().join("state"));
    let host = wait_online(&api).await;
    let add = format!("/api/v1/hosts/{host}/dirs");
    let many = std::fs::canonicalize(dir.path()).expect("canonical").join("many");
    for n in 1..tether::daemon::MAX_DIRS {
        let path = many.join(n.to_string());
        std::fs::create_dir_all(&path).expect("dir");
        let (status, body) = api.post(&add, json!({"path": path})).await;
        assert_eq!(status, 200, "{body}");
    }
    let (_, body) = api.get(&format!("/api/v1/hosts/{host}")).await;
    let full = body["host"]["dirs"].clone();
    assert_eq!(full.as_array().map(Vec::len), Some(tether::daemon::MAX_DIRS), "{body}");
    let one_more = many.join("one-more");
    std::fs::create_dir_all(&one_more).expect("dir");
    let (status, body) = api.post(&add, json!({"path": one_more})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (502, Some("daemon_refused")), "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(&format!("already allows {} dirs", tether::daemon::MAX_DIRS)), "{body}");
    let long = format!("/{}", "x".repeat(tether::daemon::MAX_DIR_PATH_BYTES));
    let (status, body) = api.post(&add, json!({"path": long})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (400, Some("field_too_long")), "{body}");
    let (_, body) = api.get(&format!("/api/v1/hosts/{host}")).await;
    assert_eq!(body["host"]["dirs"], full, "nothing changed");
    let stored = std::fs::read_to_string(dir.path().join("state/dirs.json")).expect("dirs.json");
    assert!(!stored.contains("one-more"), "the daemon's own list did not change: {stored}");
}

/// JSON nested deeper than the limit is malformed input: a REST body is
/// `400 bad_json` that says so (at once, however deep), a viewer's control
/// message is answered `bad message` and closed 1008.
#[actix_rt::test]
async fn json_nested_too_deep_is_refused_clearly() {
    let server = TetherServer::start(&[], &[]).await;
    let (ann, terminal) = user_with_terminal(&server, "ann").await;
    let depth = 100_000;
    let deep = format!(r#"{{"hostname": "deep", "extra": {}{}}}"#, "[".repeat(depth), "]".repeat(depth));
    let res = awc::Client::default()
        .post(format!("{}/api/v1/hosts", server.url()))
        .insert_header(("Authorization", format!("Bearer {}", ann.token)))
        .insert_header(("Content-Type", "application/json"))
        .send_body(deep)
        .await;
    let mut res = res.expect("an answer");
    let body: serde_json::Value = res.json().await.expect("a JSON error");
    assert_eq!((res.status().as_u16(), body["error"]["code"].as_str()), (400, Some("bad_json")), "{body}");
    let limit = format!("nested deeper than {} levels", tether::json_input::MAX_JSON_DEPTH);
    assert!(body["error"]["message"].as_str().unwrap_or_default().contains(&limit), "{body}");
    let (_, hosts) = ann.get("/api/v1/hosts").await;
    assert_eq!(hosts["hosts"].as_array().map(Vec::len), Some(1), "nothing registered: {hosts}");

    let mut viewer = Socket::connect(&viewer_url(&server, &terminal), Some(&ann.token), VIEWER).await;
    let nested = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    // Within the limit an unknown field is ignored, as ever...
    let inside = format!(r#"{{"type":"view","cols":80,"rows":24,"extra":{}}}"#, nested(100));
    viewer.send_text(inside).await;
    assert!(still_open(&mut viewer).await, "a message within the limit was refused");
    // ...past it the message is refused.
    let past = format!(r#"{{"type":"view","cols":80,"rows":24,"extra":{}}}"#, nested(1000));
    viewer.send_text(past).await;
    let mut said = None;
    let code = loop {
        match viewer.next().await {
            Event::Text(text) if text.contains("bad message") => said = Some(text),
            Event::Close(code) => break code,
            _ => {}
        }
    };
    assert_eq!(code, Some(1008));
    assert!(said.is_some_and(|text| text.contains(&limit)), "the error names the limit");
}

/// Polls the audit log until `done` accepts it.
async fn audit_until(api: &Api, what: &str, done: impl Fn(&[AuditEvent]) -> bool) -> Vec<AuditEvent> {
    let client = api.client();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let events = client.audit(&AuditFilter::default()).await.unwrap_or_else(|e| panic!("the audit log: {e}"));
        if done(&events) {
            return events;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what}: {events:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn count(events: &[AuditEvent], action: &str) -> usize {
    events.iter().filter(|e| e.action == action).count()
}

#[actix_rt::test]
async fn a_terminal_session_is_audited_without_its_input() {
    let e = e2e::start(false, &[]).await;
    let terminal = e2e::terminal(&e, &["sh"]).await;
    let mut viewer = Viewer::attach(&e, &terminal, "").await;
    viewer.type_line("echo one-secret-word").await;
    viewer.until("one-secret-word").await;
    viewer.type_line("echo two").await;
    viewer.sock.send_json(serde_json::to_value(ClientMessage::resize(100, 30)).expect("json")).await;
    viewer.until("two").await;
    viewer.sock.close().await;
    let _ = viewer.sock.expect_close().await;
    // A malformed kill body is refused and the terminal keeps running.
    let kill = format!("{}/api/v1/terminals/{terminal}/kill", e.server.url());
    let res = awc::Client::default()
        .post(&kill)
        .insert_header(("Authorization", format!("Bearer {}", e.api.token)))
        .insert_header(("Content-Type", "application/json"))
        .send_body("{\"signal\": 9")
        .await
        .expect("kill");
    assert_eq!(res.status().as_u16(), 400);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (_, body) = e.api.get(&format!("/api/v1/terminals/{terminal}")).await;
    assert_eq!(body["terminal"]["state"], "running", "{body}");
    let (status, body) = e.api.post(&format!("/api/v1/terminals/{terminal}/kill"), json!({"signal": "KILL"})).await;
    assert_eq!(status, 202, "{body}");
    e2e::wait_state(&e.api, &terminal, "exited").await;

    let events = audit_until(&e.api, "the session's events", |events| {
        ["host_registered", "spawn", "attach", "input", "resize", "detach", "kill"]
            .iter()
            .all(|action| count(events, action) >= 1)
    })
    .await;
    assert_eq!(count(&events, "input"), 1, "input started once, however much was typed: {events:#?}");
    assert_eq!(count(&events, "kill"), 1, "the refused kill is not audited: {events:#?}");
    let text = serde_json::to_string(&events).expect("json");
    assert!(!text.contains("secret"), "input bytes are never stored: {text}");
    let of = |action: &str| events.iter().find(|e| e.action == action).expect(action).clone();
    for action in ["spawn", "attach", "input", "resize", "detach", "kill"] {
        let event = of(action);
        assert_eq!(event.terminal_id.map(|t| t.to_string()), Some(terminal.clone()), "{event:?}");
        assert_eq!(event.host_id.map(|h| h.to_string()), Some(e.host.clone()), "{event:?}");
    }
    assert_eq!(of("resize").detail.as_deref(), Some("100x30"));
    assert_eq!(of("kill").detail.as_deref(), Some("signal 9"));
    // Every event names the token it was done with (the test's one token),
    // but the operator's creation of that token, which no token did.
    let tokens = e.api.client().tokens().await.expect("tokens");
    let token_id = tokens.first().expect("the test's token").id;
    for event in &events {
        let by_operator = event.action == "token_created" && event.instance_id == "cli";
        assert_eq!(event.token_id, (!by_operator).then_some(token_id), "{event:?}");
    }
    // Newest first: the kill came last.
    assert_eq!(events[0].action, "kill", "{events:#?}");
}

/// Creating and revoking a token over REST is audited, naming the token
/// that did it and the token it was done to; so is the operator's `tether
/// token create` and `revoke`, from instance `cli`.
#[actix_rt::test]
async fn tokens_created_and_revoked_are_audited() {
    let e = e2e::start(false, &[]).await;
    let client = e.api.client();
    let new = NewToken { name: Some("ci".into()), scope: Some("read".into()), ..Default::default() };
    let new_id = client.create_token(&new).await.expect("create a token").token.id;
    client.revoke_token(new_id).await.expect("revoke it");
    // The test's own token was made by the operator (`tether token create`).
    let events = audit_until(&e.api, "token events", |events| {
        count(events, "token_created") == 2 && count(events, "token_revoked") == 1
    })
    .await;
    let tokens = client.tokens().await.expect("tokens");
    let mine = tokens.iter().find(|t| t.id != new_id).expect("mine").id;
    let about_new = Some(format!("token {new_id}"));
    for action in ["token_created", "token_revoked"] {
        let event = events.iter().find(|ev| ev.action == action && ev.detail == about_new).expect(action);
        assert_eq!(event.token_id, Some(mine), "{event:?}");
        assert_eq!(event.detail, Some(format!("token {new_id}")), "{event:?}");
    }

    // The operator's `tether token create` and `revoke` are in the user's
    // log too, from instance `cli`, with no acting token.
    let out = e.server.run(&["token", "create", "--user", "ann", "--scope", "read"], &[]);
    assert!(out.status.success(), "token create: {}", String::from_utf8_lossy(&out.stderr));
    let tokens = client.tokens().await.expect("tokens");
    let operators = tokens.iter().find(|t| t.id != new_id && t.id != mine).expect("the operator's token").id;
    let out = e.server.run(&["token", "revoke", &operators.to_string()], &[]);
    assert!(out.status.success(), "token revoke: {}", String::from_utf8_lossy(&out.stderr));
    let events = audit_until(&e.api, "the operator's token events", |events| {
        count(events, "token_created") == 3 && count(events, "token_revoked") == 2
    })
    .await;
    let operator = format!("token {operators}");
    for action in ["token_created", "token_revoked"] {
        let event = events.iter().find(|ev| ev.action == action && ev.detail.as_ref() == Some(&operator));
        let event = event.unwrap_or_else(|| panic!("the operator's {action}: {events:#?}"));
        assert_eq!((event.token_id, event.instance_id.as_str()), (None, "cli"), "{event:?}");
    }
}

/// A run is audited as a spawn when it is queued, naming the token that
/// asked, the host and the run (its terminal does not exist yet).
#[actix_rt::test]
async fn a_run_is_audited_as_a_spawn() {
    let e = e2e::start(false, &[]).await;
    let (status, body) = e.api.post("/api/v1/runs", json!({"hostId": e.host, "argv": ["true"]})).await;
    assert_eq!(status, 201, "{body}");
    let run = body["run"]["id"].as_str().expect("run id").to_string();
    let events = audit_until(&e.api, "the run's spawn", |events| count(events, "spawn") == 1).await;
    let event = events.iter().find(|ev| ev.action == "spawn").expect("spawn");
    let token = e.api.client().tokens().await.expect("tokens").first().expect("the test's token").id;
    assert_eq!(event.detail, Some(format!("run {run}")), "{event:?}");
    assert_eq!(event.host_id.map(|h| h.to_string()), Some(e.host.clone()), "{event:?}");
    assert_eq!((event.token_id, event.terminal_id), (Some(token), None), "{event:?}");
}
