//! Tokens end to end (docs/REST.md, "Tokens" and "Scopes"; docs/CLI.md,
//! "Tokens"): real `tether serve` instances sharing PostgreSQL and Redis,
//! real daemons. A read viewer watches but never types; revoking a token
//! closes its sockets 4401 on every instance and refuses it at once; a
//! daemon token speaks for one host; the CLI creates, lists, expires and
//! revokes tokens and the daemon reads its token from a private file;
//! `tether share` makes a share token that `tether attach` shows as
//! read-only before anyone types.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use prost::Message as _;

use serde_json::json;
use support::cli::Person;
use support::client::{create_token, daemon_url, hello, Api, Event, Socket};
use support::daemon::DaemonProcess;
use support::e2e::{self, wait_online, wait_state, Viewer};
use support::{pg_database, redis_url, unique_prefix, TetherServer};
use tether::client::{Client, ClientError, CreatedToken, NewTerminal, NewToken};
use tether::proto::v1::server_frame;
use tether::viewer_protocol::{ClientMessage, ServerMessage};

/// Makes a token through the client.
async fn make_token(client: &Client, new: NewToken) -> CreatedToken {
    client.create_token(&new).await.unwrap_or_else(|e| panic!("create a token {new:?}: {e}"))
}

/// What `client.hosts()` is refused with: (HTTP status, error code).
async fn hosts_refused(client: &Client) -> (u16, String) {
    match client.hosts().await {
        Err(ClientError::Api { status, code, .. }) => (status, code),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// Reads a viewer's frames until `check` accepts a control message; the
/// messages seen on the way are returned too.
async fn until_message(viewer: &mut Viewer, check: impl Fn(&ServerMessage) -> bool) -> Vec<ServerMessage> {
    let mut seen = Vec::new();
    loop {
        match viewer.sock.next().await {
            Event::Text(t) => {
                let message = ServerMessage::parse(&t).expect("a viewer control message");
                let done = check(&message);
                seen.push(message);
                if done {
                    return seen;
                }
            }
            Event::Binary(b) => viewer.live.extend_from_slice(&b),
            Event::Close(code) => panic!("closed {code:?}; saw {seen:?}"),
            Event::Ping => {}
        }
    }
}

/// Waits for a viewer's close and answers its code and how long it took.
async fn close_of(viewer: &mut Viewer, since: Instant) -> (Option<u16>, Duration) {
    let code = viewer.sock.expect_close().await;
    (code, since.elapsed())
}

fn private_file(dir: &std::path::Path, name: &str, text: &str, mode: u32) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    path
}

#[actix_rt::test]
async fn read_viewers_watch_and_revoked_tokens_are_closed_on_every_instance() {
    let database = pg_database().await;
    let redis = redis_url();
    let prefix = unique_prefix();
    let env = [
        ("TETHER_DATABASE__URL", database.as_str()),
        ("TETHER_REDIS__URL", redis.as_str()),
        ("TETHER_BUS__PREFIX", prefix.as_str()),
    ];
    let a = TetherServer::start(&env, &[]).await;
    let b = TetherServer::start(&env, &[]).await;
    let full = create_token(&a, "ann");
    let api = Api::new(a.url(), full.clone());
    let client = api.client();

    // The daemon reads a daemon token from a 0600 file and binds it to its host.
    let dir = tempfile::tempdir().expect("temp dir");
    let daemon_token = make_token(
        &client,
        NewToken { scope: Some("daemon".into()), name: Some("laptop".into()), ..Default::default() },
    )
    .await;
    let token_file = private_file(dir.path(), "token", &format!("{}\n", daemon_token.secret), 0o600);
    let mut daemon = DaemonProcess::start_with_token_file(&a.url(), &token_file, &dir.path().join("state"));
    let host = wait_online(&api).await;
    let tokens = client.tokens().await.expect("tokens");
    let daemon_row = tokens.iter().find(|t| t.id == daemon_token.token.id).expect("the daemon token is listed");
    assert_eq!((daemon_row.scope.as_str(), daemon_row.host_id.map(|h| h.to_string())), ("daemon", Some(host.clone())));
    // The listing as the server sent it (unknown fields included).
    let listing = serde_json::to_string(&tokens).expect("json");
    assert!(!listing.contains("tth_"), "a listing never holds a secret: {listing}");

    let new = NewTerminal {
        host_id: host.parse().expect("host id"),
        argv: vec!["sh".into()],
        dir: Some("/tmp".into()),
        ..Default::default()
    };
    let terminal = client.create_terminal(&new).await.expect("create a terminal").id.to_string();
    wait_state(&api, &terminal, "running").await;

    let read_token = make_token(&client, NewToken { scope: Some("read".into()), ..Default::default() }).await;
    let (read_id, read) = (read_token.token.id, read_token.secret);
    let share_new = NewToken {
        terminal_id: Some(terminal.parse().expect("terminal id")),
        name: Some("for bob".into()),
        ..Default::default()
    };
    let CreatedToken { token: share_row, secret: share } = make_token(&client, share_new).await;
    assert_eq!(share_row.scope, "read");
    assert_eq!(share_row.terminal_id.map(|t| t.to_string()), Some(terminal.clone()));
    assert!(share_row.expires_at.is_some(), "a share token expires: {share_row:?}");

    let mut writer = Viewer::attach_to(&a, &full, &terminal, "").await;
    let mut reader = Viewer::attach_to(&b, &read, &terminal, "").await; // across instances
    let mut sharer = Viewer::attach_to(&a, &share, &terminal, "").await;

    // The reader's input, resize and view stay on its instance; it is told
    // once for each.
    reader.sock.send_message(&ClientMessage::Input { data: "echo typed-by-reader\n".into() }).await;
    reader.sock.send_binary(&b"echo typed-by-reader-binary\n"[..]).await;
    reader.sock.send_message(&ClientMessage::resize(33, 11)).await;
    reader.sock.send_message(&ClientMessage::view(33, 11, true, 0, true)).await;
    let mut refusals = Vec::new();
    for _ in 0..3 {
        let seen = until_message(&mut reader, |m| matches!(m, ServerMessage::Error { .. })).await;
        for m in &seen {
            assert!(!matches!(m, ServerMessage::Size { yours: true, .. }), "a reader never holds the grid: {seen:?}");
        }
        if let Some(ServerMessage::Error { message }) = seen.last() {
            refusals.push(message.clone());
        }
    }
    assert_eq!(
        refusals,
        [
            "read-only: this token may watch this terminal but not send input",
            "read-only: this token may watch this terminal but not resize it",
            "read-only: this token may watch this terminal but not claim its grid",
        ]
    );
    writer.type_line("echo marker-$((6*7))").await;
    writer.until("marker-42").await;
    reader.until("marker-42").await;
    sharer.until("marker-42").await;
    assert!(!writer.text().contains("typed-by-reader"), "the reader's input reached the shell: {}", writer.text());
    let current = client.terminal(terminal.parse().expect("terminal id")).await.expect("terminal");
    assert_ne!((current.cols, current.rows), (33, 11));

    // The share token reads its terminal and nothing else.
    let share_client = Api::new(a.url(), share.clone()).client();
    share_client.terminal(terminal.parse().expect("terminal id")).await.expect("the share token reads its terminal");
    assert_eq!(hosts_refused(&share_client).await, (403, "insufficient_scope".into()));

    // A read token reads hosts but not the audit log, which names tokens
    // and what was done with them, as the token list does.
    let reading = Api::new(a.url(), read.clone());
    assert_eq!(reading.get("/api/v1/hosts").await.0, 200);
    let (status, body) = reading.get("/api/v1/audit").await;
    assert_eq!((status, body["error"]["code"].as_str()), (403, Some("insufficient_scope")), "{body}");

    // Revoked on A, the reader on B is closed 4401 and refused at once.
    let revoked_at = Instant::now();
    client.revoke_token(read_id).await.expect("revoke");
    assert_eq!(
        hosts_refused(&Api::new(b.url(), read.clone()).client()).await,
        (401, "unauthorized".into()),
        "refused on the next request"
    );
    let (code, took) = close_of(&mut reader, revoked_at).await;
    eprintln!("the revoked reader on the other instance was closed {code:?} after {took:?}");
    assert_eq!(code, Some(4401));
    // The promise (docs/REST.md, "Revocation and expiry"): closed within
    // one check interval (`auth.revocation_check_ms`, 500 ms here) plus
    // one query, which is the second the product promises; half a second
    // is the query's (and the close frame's) share.
    let interval = Duration::from_millis(tether::config::Settings::default().auth.revocation_check_ms);
    assert!(took < interval + Duration::from_millis(500), "closed after {took:?}");
    writer.type_line("echo still-$((2*3))-here").await;
    writer.until("still-6-here").await;
    sharer.until("still-6-here").await;

    // A token row deleted behind the server's back ends its sockets too.
    let db = support::pg_connect(&database).await;
    let share_id = share_row.id.to_string();
    let deleted = db.execute("DELETE FROM api_tokens WHERE id = $1::text::uuid", &[&share_id]).await.expect("delete");
    assert_eq!(deleted, 1);
    let (code, took) = close_of(&mut sharer, Instant::now()).await;
    assert_eq!(code, Some(4401), "the deleted token's viewer, after {took:?}");
    writer.type_line("echo writer-$((3*3))-stays").await;
    writer.until("writer-9-stays").await;

    // The daemon token revoked from the command line: its socket is
    // closed 4401 and the daemon stops (a refused token is fatal to it).
    let out = a.run(&["token", "revoke", &daemon_token.token.id.to_string()], &[]);
    assert!(out.status.success(), "token revoke: {}", String::from_utf8_lossy(&out.stderr));
    let deadline = Instant::now() + Duration::from_secs(20);
    while daemon.try_exit_status().is_none() {
        assert!(Instant::now() < deadline, "the daemon kept running; its log:\n{}", daemon.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(daemon.log().contains("bad token"), "{}", daemon.log());
    api.wait_for(&format!("/api/v1/hosts/{host}"), "host offline", |b| b["host"]["state"] == "offline").await;
}

/// Says hello for `host` with `token` and answers the close code, or None
/// when the server acknowledged.
async fn hello_as(server: &TetherServer, token: &str, host: &str) -> Option<u16> {
    let mut sock = Socket::connect(&daemon_url(server), Some(token), &["tether.daemon.v1"]).await;
    sock.send_frame(hello(host)).await;
    loop {
        match sock.next().await {
            Event::Binary(b) => {
                let frame = tether::proto::v1::ServerFrame::decode(b.as_ref()).expect("server frame").frame;
                if matches!(frame, Some(server_frame::Frame::HelloAck(_))) {
                    return None;
                }
            }
            Event::Close(code) => return code,
            _ => {}
        }
    }
}

#[actix_rt::test]
async fn a_daemon_token_speaks_for_one_host() {
    let server = TetherServer::start(&[], &[]).await;
    let api = Api::new(server.url(), create_token(&server, "ann"));
    let out = server.run(&["token", "create", "--user", "ann", "--scope", "daemon", "--name", "box-1"], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let daemon = Api::new(server.url(), String::from_utf8(out.stdout).expect("utf8").trim());
    let register = |api: &Api, hostname: &str| {
        let body = json!({"name": hostname, "hostname": hostname, "platform": "linux", "arch": "x86_64"});
        let api = Api::new(api.base.clone(), api.token.clone());
        async move { api.post("/api/v1/hosts", body).await }
    };
    let (status, h1) = register(&daemon, "box-1").await;
    assert_eq!(status, 201, "{h1}");
    let h1 = h1["host"]["id"].as_str().expect("id").to_string();
    assert_eq!(register(&daemon, "box-1").await.0, 201, "its own host again");
    let (status, refused) = register(&daemon, "box-2").await;
    assert_eq!((status, refused["error"]["code"].as_str()), (403, Some("token_bound_to_other_host")), "{refused}");
    let (status, h2) = register(&api, "box-2").await;
    assert_eq!(status, 201, "{h2}");
    let h2 = h2["host"]["id"].as_str().expect("id").to_string();
    assert_eq!(api.get("/api/v1/hosts").await.1["hosts"].as_array().map(Vec::len), Some(2));

    // One machine's token cannot say hello as another.
    assert_eq!(hello_as(&server, &daemon.token, &h2).await, Some(4403));
    assert_eq!(hello_as(&server, &daemon.token, &h1).await, None);
    // A daemon token bound at create.
    let out = server.run(&["token", "create", "--user", "ann", "--scope", "daemon", "--host", &h2], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let bound = String::from_utf8(out.stdout).expect("utf8").trim().to_string();
    assert_eq!(hello_as(&server, &bound, &h1).await, Some(4403));
    assert_eq!(hello_as(&server, &bound, &h2).await, None);
    // --host is for daemon tokens, and for the user's own hosts.
    let out = server.run(&["token", "create", "--user", "ann", "--host", &h2], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    let out = server.run(&["token", "create", "--user", "bob", "--scope", "daemon", "--host", &h2], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stdout.is_empty());
}

/// A new daemon token cannot become a machine that already has a usable
/// daemon token, neither by registering its hostname nor by a hello: its
/// real daemon would be replaced and what is typed there would reach the
/// new token's holder. Once the old token is revoked, the new one binds.
#[actix_rt::test]
async fn a_new_daemon_token_cannot_take_over_a_machine_that_has_one() {
    let server = TetherServer::start(&[], &[]).await;
    let daemon_token = |label: &str| {
        let out = server.run(&["token", "create", "--user", "ann", "--scope", "daemon", "--name", label], &[]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        Api::new(server.url(), String::from_utf8(out.stdout).expect("utf8").trim())
    };
    let body = json!({"name": "box", "hostname": "box", "platform": "linux", "arch": "x86_64"});
    let first = daemon_token("first");
    let (status, host) = first.post("/api/v1/hosts", body.clone()).await;
    assert_eq!(status, 201, "{host}");
    let host = host["host"]["id"].as_str().expect("id").to_string();
    assert_eq!(hello_as(&server, &first.token, &host).await, None);

    let second = daemon_token("second");
    let renamed = json!({"name": "PWNED", "hostname": "box", "platform": "evil", "arch": "mips"});
    let (status, refused) = second.post("/api/v1/hosts", renamed).await;
    assert_eq!((status, refused["error"]["code"].as_str()), (403, Some("host_bound_to_other_token")), "{refused}");
    // The refusal changed nothing.
    let full = Api::new(server.url(), create_token(&server, "ann"));
    let (_, shown) = full.get(&format!("/api/v1/hosts/{host}")).await;
    assert_eq!((&shown["host"]["name"], &shown["host"]["platform"]), (&json!("box"), &json!("linux")), "{shown}");
    assert_eq!(hello_as(&server, &second.token, &host).await, Some(4403));
    let third = daemon_token("third");
    assert_eq!(hello_as(&server, &third.token, &host).await, Some(4403), "a hello does not bind it either");
    // Still unbound: it can become another machine.
    let (status, other) = third.post("/api/v1/hosts", json!({"hostname": "other"})).await;
    assert_eq!(status, 201, "{other}");

    let list = server.run(&["token", "list", "--user", "ann"], &[]);
    let table = String::from_utf8(list.stdout).expect("utf8");
    let first_id = table.lines().find(|l| l.contains(" first ")).and_then(|l| l.split_whitespace().next());
    let revoked = server.run(&["token", "revoke", first_id.unwrap_or_else(|| panic!("{table}"))], &[]);
    assert!(revoked.status.success(), "{}", String::from_utf8_lossy(&revoked.stderr));
    let (status, again) = second.post("/api/v1/hosts", body).await;
    assert_eq!((status, again["host"]["id"].as_str()), (201, Some(host.as_str())), "{again}");
    assert_eq!(hello_as(&server, &second.token, &host).await, None);
}

#[actix_rt::test]
async fn the_cli_creates_lists_expires_and_revokes_tokens() {
    let server = TetherServer::start(&[], &[]).await;
    let out = server.run(&["token", "create", "--user", "ann", "--ttl", "3s", "--name", "short-lived"], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).expect("utf8");
    assert_eq!(stdout.lines().count(), 1, "the token alone on stdout: {stdout:?}");
    let secret = stdout.trim().to_string();
    assert!(secret.starts_with("tth_"));
    let api = Api::new(server.url(), secret.clone());
    assert_eq!(api.get("/api/v1/hosts").await.0, 200);

    let list = server.run(&["token", "list", "--user", "ann"], &[]);
    assert!(list.status.success(), "{}", String::from_utf8_lossy(&list.stderr));
    let table = String::from_utf8(list.stdout).expect("utf8");
    assert!(!table.contains("tth_"), "never a secret: {table}");
    let row = table.lines().find(|l| l.contains("short-lived")).unwrap_or_else(|| panic!("no row: {table}"));
    assert!(row.contains(" full ") && row.contains(" active "), "{row}");
    assert!(!row.ends_with("never"), "the use was stamped: {row}");
    let id = row.split_whitespace().next().expect("id").to_string();

    // A socket opened with it while it was valid: a daemon connection.
    let (status, body) = api.post("/api/v1/hosts", json!({"hostname": "ann-box"})).await;
    assert_eq!(status, 201, "{body}");
    let host = body["host"]["id"].as_str().expect("host id").to_string();
    let mut daemon = Socket::connect(&daemon_url(&server), Some(&secret), &["tether.daemon.v1"]).await;
    daemon.send_frame(hello(&host)).await;
    assert!(matches!(daemon.next_server_frame().await, server_frame::Frame::HelloAck(_)));

    // Expired: refused, listed as such, and its open socket closed 4401.
    tokio::time::sleep(Duration::from_millis(3200)).await;
    assert_eq!(api.get("/api/v1/hosts").await.0, 401);
    assert_eq!(daemon.expect_close().await, Some(4401), "the expired token's socket stays open");
    let table = String::from_utf8(server.run(&["token", "list", "--user", "ann"], &[]).stdout).expect("utf8");
    assert!(table.lines().any(|l| l.starts_with(&id) && l.contains(" expired ")), "{table}");

    let out = server.run(&["token", "revoke", &id], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let table = String::from_utf8(server.run(&["token", "list", "--user", "ann"], &[]).stdout).expect("utf8");
    assert!(table.lines().any(|l| l.starts_with(&id) && l.contains(" revoked ")), "{table}");
    let out = server.run(&["token", "revoke", "00000000-0000-4000-8000-000000000000"], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    for bad in [["--ttl", "5x"], ["--scope", "admin"]] {
        let out = server.run(&[&["token", "create", "--user", "ann"][..], &bad[..]].concat(), &[]);
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        assert!(out.stdout.is_empty());
    }
}

#[actix_rt::test]
async fn the_daemon_refuses_a_token_file_others_can_read() {
    let dir = tempfile::tempdir().expect("temp dir");
    let open = private_file(dir.path(), "token", "tth_abc\n", 0o644);
    let out = support::tether_cmd(
        &["daemon", "--server", "http://127.0.0.1:9", "--token-file", open.to_str().expect("path")],
        &[("TETHER_TOKEN", "")],
    );
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("mode 0644") && stderr.contains("chmod 600"), "{stderr}");
    let out = support::tether_cmd(&["daemon", "--server", "http://127.0.0.1:9"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("TETHER_TOKEN"), "{}", String::from_utf8_lossy(&out.stderr));
}

/// A daemon given a `read` token stops at once, saying why: no retry can
/// make that token run a daemon (it used to retry `403 insufficient_scope`
/// for ever).
#[actix_rt::test]
async fn a_daemon_with_a_read_token_stops_and_says_why() {
    let server = TetherServer::start(&[], &[]).await;
    let full = support::client::create_token(&server, "ann");
    let client = Client::new(&server.url(), &full, None).expect("client");
    let read = make_token(&client, NewToken { scope: Some("read".into()), ..Default::default() }).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let mut daemon = DaemonProcess::start_url(&server.url(), &read.secret, &dir.path().join("state"));
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = daemon.try_exit_status() {
            break status;
        }
        assert!(Instant::now() < deadline, "the daemon kept trying:\n{}", daemon.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(status.code(), Some(1), "{}", daemon.log());
    assert!(daemon.log().contains("give the daemon a `daemon` or `full` token"), "{}", daemon.log());
}

/// `tether share` makes a share token of one terminal: listed as such and
/// expiring as asked; it reads that terminal and nothing else; `tether
/// attach` with it (a real PTY) says "read-only" before the screen comes,
/// and what is typed there never reaches the shell.
#[actix_rt::test]
async fn tether_share_makes_a_read_only_token_for_one_terminal() {
    let e = e2e::start(false, &[]).await;
    let terminal = e2e::terminal(&e, &["sh"]).await;
    let other = e2e::terminal(&e, &["sh"]).await;
    let mut ann = Person::new();
    ann.set_env("TETHER_SERVER", &e.server.url());
    ann.set_env("TETHER_TOKEN", &e.api.token);
    let out = ann.run(&["share", &terminal[..8], "--ttl", "30m", "--name", "for bob"]);
    let secret = out.ok().trim().to_string();
    assert!(secret.starts_with("tth_") && !secret.contains('\n'), "the token alone on stdout: {out:#?}");
    assert!(out.stderr.contains("read-only"), "{out:#?}");

    let tokens = e.api.client().tokens().await.expect("tokens");
    let shared = tokens.iter().find(|t| t.name.as_deref() == Some("for bob")).expect("the share token is listed");
    assert_eq!((shared.scope.as_str(), shared.terminal_id.map(|t| t.to_string())), ("read", Some(terminal.clone())));
    // The expiry is the server's clock plus the TTL, the creation time the
    // database's at the insert, a moment later.
    let lives = shared.expires_at.expect("it expires") - shared.created_at;
    assert!((lives - chrono::Duration::minutes(30)).num_seconds().abs() <= 5, "{shared:?}");

    let bob = Api::new(e.server.url(), secret.clone()).client();
    bob.terminal(terminal.parse().expect("id")).await.expect("the share token reads its terminal");
    match bob.terminal(other.parse().expect("id")).await {
        Err(ClientError::Api { status, code, .. }) => assert_eq!((status, code.as_str()), (403, "insufficient_scope")),
        answer => panic!("the share token read another terminal: {answer:?}"),
    }
    assert_eq!(hosts_refused(&bob).await, (403, "insufficient_scope".into()));

    let mut writer = Viewer::attach(&e, &terminal, "").await;
    let mut person = Person::new();
    person.set_env("TETHER_SERVER", &e.server.url());
    person.set_env("TETHER_TOKEN", &secret);
    let mut pty = person.pty(&["attach", &terminal], (80, 24));
    pty.wait_for(tether::attach::READ_ONLY_BANNER);
    writer.type_line("echo shown-$((6*7))").await;
    pty.wait_for("shown-42");
    let screen = pty.screen();
    let banner = screen.find(tether::attach::READ_ONLY_BANNER).expect("the banner");
    assert!(banner < screen.find("shown-42").expect("the output"), "read-only is said before the screen comes");
    pty.type_keys(b"echo typed-by-bob\r");
    writer.type_line("echo after-$((2*3))").await;
    writer.until("after-6").await;
    pty.wait_for("after-6");
    assert!(!writer.text().contains("typed-by-bob"), "the share token's keys reached the shell: {}", writer.text());
    pty.type_keys(b"\x1d");
    assert_eq!(pty.wait_exit(), 0, "{}", pty.screen());
}
