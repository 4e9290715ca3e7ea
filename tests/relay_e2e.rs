//! End to end on one instance: a real `tether serve`, real `tether daemon`
//! processes and real PTYs (docs/PROTOCOL.md, docs/REST.md). The core flows run against both
//! the embedded SQLite default and PostgreSQL.

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::client::{input_until_refused, viewer_url, Api, Event, Socket, WAIT};
use support::daemon::DaemonProcess;
use support::e2e::{metric, start, terminal, wait_online, wait_state, E2e, Viewer};
use support::TetherServer;
use tether::viewer_protocol::ClientMessage;

macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite_backend {
            $(#[actix_rt::test] async fn $name() { super::$name(false).await })*
        }
        mod postgres_backend {
            $(#[actix_rt::test] async fn $name() { super::$name(true).await })*
        }
    };
}

both_backends!(
    shell_io_resize_second_viewer_resume_and_exit,
    kill_keeps_running_until_the_real_exit,
    runs_succeed_and_fail
);

async fn shell_io_resize_second_viewer_resume_and_exit(postgres: bool) {
    let e = start(postgres, &[]).await;
    let id = terminal(&e, &["sh"]).await;
    let (_, body) = e.api.get(&format!("/api/v1/terminals/{id}")).await;
    assert_eq!(body["terminal"]["lastInteractedAt"], Value::Null, "nobody typed yet: {body}");
    let mut v1 = Viewer::attach(&e, &id, "").await;
    v1.resize(101, 33).await;
    v1.sock.send_message(&ClientMessage::view(101, 33, true, 0, true)).await;
    // The shell expands this, so seeing the result proves a real shell ran it.
    v1.type_line("echo hello-$((6*7))").await;
    v1.until("hello-42").await;
    // Typing stamps the terminal.
    e.api
        .wait_for(&format!("/api/v1/terminals/{id}"), "interaction stamp", |b| {
            b["terminal"]["lastInteractedAt"].is_string()
        })
        .await;
    // Wait for the PTY to have the holder's grid before asking it.
    e.api.wait_for(&format!("/api/v1/terminals/{id}"), "grid", |b| b["terminal"]["cols"] == 101).await;
    v1.type_line("stty size").await;
    v1.until("33 101").await;

    // A second viewer mid-stream: snapshot, then live from its offset.
    let mut v2 = Viewer::attach(&e, &id, "").await;
    assert!(v2.start >= v1.start);
    v1.type_line("echo after-$((1+1))-both").await;
    v1.until("after-2-both").await;
    v2.until("after-2-both").await;
    // No gap, no duplicate: v2's live bytes are exactly v1's from v2's start.
    let skip = (v2.start - v1.start) as usize;
    let tail = &v1.live[skip..];
    let common = tail.len().min(v2.live.len());
    assert_eq!(&tail[..common], &v2.live[..common], "second viewer's stream differs from the first's");
    assert!(common > 0);

    // ?from=N while v1 keeps the arbiter: only the bytes after N.
    let from = v1.start + (v1.live.len() as u64) - 5;
    let mut v3 = Viewer::attach(&e, &id, &format!("?from={from}")).await;
    assert_eq!(v3.start, from, "resumed at the offset asked");
    v1.type_line("echo resumed-ok").await;
    v1.until("resumed-ok\r\n").await;
    v3.until("resumed-ok\r\n").await;
    let expect = &v1.live[(from - v1.start) as usize..];
    assert_eq!(&v3.live[..expect.len().min(v3.live.len())], &expect[..expect.len().min(v3.live.len())]);

    v1.type_line("exit 3").await;
    assert_eq!(v1.until_exit().await["exitCode"], 3);
    let t = wait_state(&e.api, &id, "exited").await;
    assert_eq!(t["exitCode"], 3);
    assert_eq!(t["exitSignal"], Value::Null);
    drop(e.daemon);
}

async fn kill_keeps_running_until_the_real_exit(postgres: bool) {
    let e = start(postgres, &[]).await;
    let id = terminal(&e, &["sleep", "1000"]).await;
    let id2 = terminal(&e, &["sleep", "1000"]).await;
    let (status, body) = e.api.post(&format!("/api/v1/terminals/{id2}/kill"), json!({"signal": "TERM"})).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["terminal"]["state"], "running", "kill answers before the exit");
    let t = wait_state(&e.api, &id2, "exited").await;
    assert_eq!((t["exitSignal"].as_i64(), t["exitCode"].as_i64()), (Some(15), None));
    let (status, body) = e.api.post(&format!("/api/v1/terminals/{id}/kill"), json!({"signal": 9})).await;
    assert_eq!(status, 202, "{body}");
    let t = wait_state(&e.api, &id, "exited").await;
    assert_eq!(t["exitSignal"], 9);
    let (status, body) = e.api.post(&format!("/api/v1/terminals/{id}/kill"), json!({})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (409, Some("terminal_not_running")));
    let (status, body) = e.api.post(&format!("/api/v1/terminals/{id}/kill"), json!({"signal": "BOGUS"})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (400, Some("invalid_signal")));
    drop(e.dir);
}

async fn runs_succeed_and_fail(postgres: bool) {
    let e = start(postgres, &[]).await;
    let (status, ok) =
        e.api.post("/api/v1/runs", json!({"hostId": e.host, "argv": ["sh", "-c", "echo out; exit 0"]})).await;
    assert_eq!(status, 201, "{ok}");
    let (_, bad) =
        e.api.post("/api/v1/runs", json!({"hostId": e.host, "argv": ["sh", "-c", "echo failing; exit 7"]})).await;
    let ok_id = ok["run"]["id"].as_str().expect("id");
    let bad_id = bad["run"]["id"].as_str().expect("id");
    let run = e
        .api
        .wait_for(&format!("/api/v1/runs/{ok_id}"), "run succeeded with usage", |b| {
            b["run"]["state"] == "succeeded" && b["run"]["usage"].is_object()
        })
        .await["run"]
        .clone();
    assert_eq!(run["exitCode"], 0);
    assert!(run["terminalId"].is_string());
    assert!(run["usage"]["wallMs"].as_i64().is_some_and(|w| w >= 0));
    assert!(run["usage"]["outputBytes"].as_i64().is_some_and(|b| b >= 3), "{run}");
    let (status, log) = e.api.get_bytes(&format!("/api/v1/runs/{ok_id}/log")).await;
    assert_eq!(status, 200);
    assert!(String::from_utf8_lossy(&log).contains("out"), "log: {:?}", String::from_utf8_lossy(&log));
    let run = e.api.wait_for(&format!("/api/v1/runs/{bad_id}"), "run failed", |b| b["run"]["state"] == "failed").await
        ["run"]
        .clone();
    assert_eq!(run["exitCode"], 7);
    let (_, log) = e.api.get_bytes(&format!("/api/v1/runs/{bad_id}/log")).await;
    assert!(String::from_utf8_lossy(&log).contains("failing"));
}

/// A viewer may send 1 MiB of input in one frame (the largest a viewer
/// frame may be): it reaches the terminal whole and in order, and the
/// daemon's connection stays up (one Input frame of it would be over the
/// daemon socket's 1 MiB limit with its envelope, and the daemon would drop
/// the connection: every viewer of the host closed 4503).
#[actix_rt::test]
async fn a_megabyte_of_input_in_one_viewer_frame_reaches_the_terminal() {
    use sha2::{Digest, Sha256};
    let e = start(false, &[]).await;
    // Raw mode before any input: a canonical tty keeps 4 KiB of a line.
    let raw = e.dir.path().join("raw");
    let script = format!("stty raw -echo; touch {}; head -c 1048576 | sha256sum; sleep 600", raw.display());
    let id = terminal(&e, &["sh", "-c", &script]).await;
    let mut other = Viewer::attach(&e, &terminal(&e, &["cat"]).await, "").await;
    let mut viewer = Viewer::attach(&e, &id, "").await;
    file_appears(&raw).await;
    let input: Vec<u8> = (0..1024 * 1024).map(|i| b'a' + ((i * 7 + i / 1000) % 26) as u8).collect();
    let digest: String = Sha256::digest(&input).iter().map(|b| format!("{b:02x}")).collect();
    viewer.sock.send_binary(input).await;
    viewer.until(&digest).await;
    // The host's other terminal still answers on the same connection.
    other.type_line("still-here").await;
    other.until("still-here").await;
    assert_eq!(e.daemon.log().matches("tether_daemon_connected").count(), 1, "{}", e.daemon.log());
}

/// A daemon asked to stop (SIGTERM) ends its terminals and reports each
/// ending before it goes: a shell that exits on SIGHUP has its code, one
/// that ignores SIGHUP is killed (nothing is left running), a run ends with
/// its signal instead of waiting to be lost, a viewer sees the exit, and
/// the daemon exits 0.
#[actix_rt::test]
async fn a_stopped_daemon_reports_its_terminals_endings() {
    let mut e = start(false, &[]).await;
    // A sleep no other process has: `pgrep -f` finds it, or its shell.
    let marker = format!("sleep {}", 100_000 + rand::random::<u32>() % 100_000);
    // Each shell says when its trap is set, so the hang-up finds it set.
    let (armed, ignoring) = (e.dir.path().join("armed"), e.dir.path().join("ignoring"));
    let script = format!("trap 'exit 9' HUP; touch {}; while :; do sleep 0.1; done", armed.display());
    let exits_on_hup = terminal(&e, &["sh", "-c", &script]).await;
    let script = format!("trap '' HUP; touch {}; {marker}", ignoring.display());
    let ignores_hup = terminal(&e, &["sh", "-c", &script]).await;
    let (status, run) =
        e.api.post("/api/v1/runs", json!({"hostId": e.host, "argv": ["sh", "-c", "echo started; sleep 120"]})).await;
    assert_eq!(status, 201, "{run}");
    let run_id = run["run"]["id"].as_str().expect("run id").to_string();
    let mut viewer = Viewer::attach(&e, &exits_on_hup, "").await;
    file_appears(&armed).await;
    file_appears(&ignoring).await;
    eventually_run_state(&e.api, &run_id, "running").await;

    let status = e.daemon.terminate(Duration::from_secs(20)).expect("the daemon exits");
    assert!(status.success(), "{status:?}\n{}", e.daemon.log());
    assert!(e.daemon.log().contains("tether_daemon_stopped"), "{}", e.daemon.log());
    let exit = viewer.until_exit().await;
    assert_eq!(exit["exitCode"], 9, "{exit}");
    let t = wait_state(&e.api, &exits_on_hup, "exited").await;
    assert_eq!(t["exitCode"], 9, "{t}");
    let t = wait_state(&e.api, &ignores_hup, "exited").await;
    assert_eq!(t["exitSignal"], 9, "killed after the grace: {t}");
    let run = eventually_run_state(&e.api, &run_id, "failed").await;
    assert_eq!(run["exitSignal"], 1, "{run}");
    let left = std::process::Command::new("pgrep").args(["-f", &marker]).output().expect("pgrep");
    assert!(left.stdout.is_empty(), "left running: {}", String::from_utf8_lossy(&left.stdout));
}

/// Waits until `path` exists (a terminal's script touched it).
async fn file_appears(path: &std::path::Path) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !path.exists() {
        assert!(tokio::time::Instant::now() < deadline, "{} never appeared", path.display());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls `GET /runs/{id}` until the run is in `state`; returns it.
async fn eventually_run_state(api: &Api, id: &str, state: &str) -> Value {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let (_, body) = api.get(&format!("/api/v1/runs/{id}")).await;
        if body["run"]["state"] == state {
            return body["run"].clone();
        }
        assert!(tokio::time::Instant::now() < deadline, "run {id} never became {state}: {body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[actix_rt::test]
async fn daemon_restart_parks_then_spawns_and_reconciles() {
    let mut e = start(false, &[]).await;
    let old = terminal(&e, &["sleep", "1000"]).await;
    e.daemon.kill();
    e.api.wait_for(&format!("/api/v1/hosts/{}", e.host), "host offline", |b| b["host"]["state"] == "offline").await;
    // Created while the host is away: parked.
    let (_, body) = e.api.post("/api/v1/terminals", json!({"hostId": e.host, "argv": ["sleep", "1000"]})).await;
    let parked = body["terminal"]["id"].as_str().expect("id").to_string();
    assert_eq!(
        (body["terminal"]["state"].as_str(), body["terminal"]["pendingReason"].as_str()),
        (Some("pending"), Some("host_offline"))
    );
    let (_, body) =
        e.api.post("/api/v1/runs", json!({"hostId": e.host, "argv": ["sh", "-c", "echo queued-run"]})).await;
    let run = body["run"]["id"].as_str().expect("id").to_string();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (_, body) = e.api.get(&format!("/api/v1/runs/{run}")).await;
    assert_eq!(body["run"]["state"], "queued", "a run waits while its host is offline");

    let _daemon = DaemonProcess::start(&e.server, &e.api.token, &e.dir.path().join("state"));
    assert_eq!(wait_online(&e.api).await, e.host, "the same host id comes back");
    wait_state(&e.api, &parked, "running").await;
    let t = wait_state(&e.api, &old, "exited").await;
    assert_eq!(t["exitCode"], Value::Null, "reconciled, not reported");
    e.api.wait_for(&format!("/api/v1/runs/{run}"), "queued run done", |b| b["run"]["state"] == "succeeded").await;
}

#[actix_rt::test]
async fn newest_daemon_wins_and_viewers_are_moved() {
    let e = start(false, &[]).await;
    let id = terminal(&e, &["sleep", "1000"]).await;
    let mut v = Viewer::attach(&e, &id, "").await;
    // A second daemon process claiming the same host (same host id).
    let second_state = e.dir.path().join("state2");
    std::fs::create_dir_all(&second_state).expect("dir");
    for name in ["host.json", "dirs.json"] {
        let _ = std::fs::copy(e.daemon.state_dir().join(name), second_state.join(name));
    }
    let mut second = DaemonProcess::start(&e.server, &e.api.token, &second_state);
    assert_eq!(v.sock.expect_close().await, Some(4503), "viewers of the replaced connection are told to reattach");
    // Reattaching never hangs: the new daemon does not have the old PTY, so
    // the terminal was reconciled to exited and the viewer is told so.
    wait_state(&e.api, &id, "exited").await;
    let url = viewer_url(&e.server, &id);
    let mut again = Socket::connect(&url, Some(&e.api.token), &["tether.v1"]).await;
    let mut saw_exit = false;
    loop {
        match again.next().await {
            Event::Text(t) if t.contains("\"exit\"") => saw_exit = true,
            Event::Close(code) => {
                assert_eq!(code, Some(1000));
                break;
            }
            _ => {}
        }
    }
    assert!(saw_exit);
    assert!(e.daemon.log().contains("4000") || second.log().contains("connected"), "{}", e.daemon.log());
    second.kill();
}

/// Two daemons of one host (a copied state dir, say a service and a
/// forgotten shell): the newer one wins and keeps the host. The replaced
/// one stops with a message that says why; were it to redial, the two
/// would replace each other in turns and each hello would end the other's
/// terminals.
#[actix_rt::test]
async fn a_replaced_daemon_stops_instead_of_taking_the_host_back() {
    let mut e = start(false, &[]).await;
    let second_state = e.dir.path().join("state2");
    std::fs::create_dir_all(&second_state).expect("dir");
    for name in ["host.json", "dirs.json"] {
        let _ = std::fs::copy(e.daemon.state_dir().join(name), second_state.join(name));
    }
    let mut second = DaemonProcess::start(&e.server, &e.api.token, &second_state);
    let deadline = std::time::Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = e.daemon.try_exit_status() {
            break status;
        }
        assert!(std::time::Instant::now() < deadline, "the replaced daemon keeps going: {}", e.daemon.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status.code(), Some(1), "{}", e.daemon.log());
    let log = e.daemon.log();
    assert!(log.contains("replaced this one (close 4000)") && log.contains(&e.host), "{log}");

    // The host stays with the newer daemon: a terminal started there
    // outlives the old one's backoff (1 s plus jitter) many times over.
    let id = terminal(&e, &["sleep", "1000"]).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (_, body) = e.api.get(&format!("/api/v1/terminals/{id}")).await;
    assert_eq!(body["terminal"]["state"], "running", "{body}");
    assert_eq!(second.log().matches("tether_daemon_connected").count(), 1, "{}", second.log());
    second.kill();
}

#[actix_rt::test]
async fn dirs_limits_and_credentials_with_a_real_daemon() {
    let key = "MDEyMzQ1Njc4OTAxMjM0NTY3ODkwMTIzNDU2Nzg5MDE="; // 32 bytes, base64
    let e = start(false, &[("TETHER_ENCRYPTION__KEY", key)]).await;
    let extra = e.dir.path().join("work");
    std::fs::create_dir_all(&extra).expect("dir");
    let extra = extra.canonicalize().expect("canonical").to_string_lossy().into_owned();
    let (status, body) = e.api.post(&format!("/api/v1/hosts/{}/dirs", e.host), json!({"path": extra})).await;
    assert_eq!(status, 200, "{body}");
    assert!(body["dirs"].as_array().is_some_and(|d| d.iter().any(|d| d == &json!(extra))), "{body}");
    let (status, body) = e.api.post("/api/v1/terminals", json!({"hostId": e.host, "dir": "/etc"})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (400, Some("dir_not_allowed")));
    let (status, body) = e.api.post(&format!("/api/v1/hosts/{}/dirs", e.host), json!({"path": "/no/such/dir"})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (502, Some("daemon_refused")), "{body}");

    let (status, body) = e.api.post(&format!("/api/v1/hosts/{}/limits/refresh", e.host), json!({})).await;
    assert_eq!(status, 200, "{body}");
    assert!(body["limits"]["rlimits"].is_object(), "{body}");

    let (status, body) = e.api.post(&format!("/api/v1/hosts/{}/credentials/refresh", e.host), json!({})).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (502, Some("daemon_refused")),
        "no credentials file yet: {body}"
    );
    std::fs::write(e.daemon.state_dir().join("credentials.json"), r#"{"apiKey":"s3cret-value-917"}"#).expect("write");
    let (status, body) = e.api.post(&format!("/api/v1/hosts/{}/credentials/refresh", e.host), json!({})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, json!({"ok": true, "hostId": e.host}));
    assert!(!e.server.log().contains("s3cret-value-917"), "the secret reached the server log");
    let host = uuid::Uuid::parse_str(&e.host).expect("uuid");
    let (nonce, ciphertext): (Vec<u8>, Vec<u8>) = match e.server.database_url() {
        Some(url) => {
            let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.expect("connect");
            actix_rt::spawn(conn);
            let row = client
                .query_one("SELECT nonce, ciphertext FROM host_credentials WHERE host_id = $1", &[&host])
                .await
                .expect("stored");
            (row.get(0), row.get(1))
        }
        None => rusqlite::Connection::open(e.server.scratch_dir().join("tether.db"))
            .expect("open db")
            .query_row("SELECT nonce, ciphertext FROM host_credentials WHERE host_id = ?1", [&e.host], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .expect("stored"),
    };
    assert_eq!(nonce.len(), 12);
    assert!(!ciphertext.windows(9).any(|w| w == b"s3cret-va"), "stored in the clear");
    let key: [u8; 32] = *b"01234567890123456789012345678901";
    let sealed = tether::store::SealedCredentials { nonce, ciphertext };
    assert_eq!(tether::crypto::open(&key, host, &sealed).expect("opens"), br#"{"apiKey":"s3cret-value-917"}"#);
}

#[actix_rt::test]
async fn sigterm_drains_sockets_and_releases_leases() {
    let mut e = start(true, &[("TETHER_SHUTDOWN__GRACE_MS", "5000")]).await;
    let id = terminal(&e, &["sleep", "1000"]).await;
    let mut v = Viewer::attach(&e, &id, "").await;
    let status = e.server.terminate(Duration::from_secs(10));
    assert!(status.is_some_and(|s| s.success()), "serve exits by itself, cleanly, within the grace: {status:?}");
    assert_eq!(v.sock.expect_close().await, Some(4503), "viewers are told to reattach");
    let log = e.server.log();
    assert!(log.contains("tether_instance_draining"), "{log}");
    // The lease was released, not left to expire: another instance sees the host offline at once.
    let url = e.server.database_url().expect("postgres");
    let other = TetherServer::start(&[("TETHER_DATABASE__URL", &url)], &[]).await;
    let api = Api::new(other.url(), e.api.token.clone());
    e.daemon.kill();
    let (_, body) = api.get(&format!("/api/v1/hosts/{}", e.host)).await;
    assert_eq!(body["host"]["state"], "offline", "{body}");
}

#[actix_rt::test]
async fn a_stalled_viewer_is_closed_while_a_real_terminal_prints_50_mb() {
    let e = start(false, &[("TETHER_VIEWER__QUEUE_BYTES", "1048576"), ("TETHER_VIEWER__SLOW_MS", "2000")]).await;
    const LAST: u64 = 6_000_000; // `seq 1 6000000` prints about 47 MB (plus a \r per line on the PTY)
    let script = format!("read go; seq 1 {LAST}; echo seq-done; exec sleep 1000");
    let id = terminal(&e, &["sh", "-c", &script]).await;
    let mut stalled = Viewer::attach(&e, &id, "").await;
    let mut healthy = Viewer::attach(&e, &id, "").await;
    healthy.type_line("go").await;
    // `stalled` never reads again. `healthy` must see every number, in order.
    let mut next = 1u64;
    let mut partial = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    'read: loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match healthy.sock.next_within(left).await {
            Some(Event::Binary(b)) => {
                partial.extend_from_slice(&b);
                let mut start = 0;
                while let Some(pos) = partial[start..].iter().position(|c| *c == b'\n') {
                    let line = String::from_utf8_lossy(&partial[start..start + pos]).trim().to_string();
                    start += pos + 1;
                    if line == "seq-done" {
                        break 'read;
                    }
                    if let Ok(n) = line.parse::<u64>() {
                        assert_eq!(n, next, "the healthy viewer saw {n} where {next} was due");
                        next += 1;
                    }
                }
                partial.drain(..start);
            }
            Some(Event::Close(code)) => panic!("the healthy viewer was closed ({code:?}) at {next}"),
            Some(_) => {}
            None => panic!("timed out at {next}"),
        }
    }
    assert_eq!(next, LAST + 1, "every number arrived");
    assert_eq!(stalled.sock.expect_close().await, Some(1008), "the stalled viewer is closed 1008");
    let high = metric(&e.api, "tether_viewer_queue_high_water_bytes").await.expect("gauge");
    assert!(high <= 1_048_576.0, "the outbound queue passed its bound: {high}");
}

/// Runs `tether attach` as a real process with piped stdin/stdout.
struct AttachProcess {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    output: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
}

impl AttachProcess {
    fn start(e: &E2e, terminal: &str) -> AttachProcess {
        use std::io::Read;
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_tether"));
        command
            .args(["attach", terminal, "--server", &e.server.url(), "--token", &e.api.token])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        for (key, _) in std::env::vars().filter(|(k, _)| k.starts_with("TETHER_")) {
            command.env_remove(key);
        }
        let mut child = command.spawn().expect("spawn tether attach");
        let stdin = child.stdin.take().expect("stdin");
        let mut stdout = child.stdout.take().expect("stdout");
        let output = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = output.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stdout.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().expect("lock").extend_from_slice(&buf[..n]);
            }
        });
        AttachProcess { child, stdin, output }
    }

    fn type_bytes(&mut self, bytes: &[u8]) {
        use std::io::Write;
        self.stdin.write_all(bytes).expect("write");
        self.stdin.flush().expect("flush");
    }

    async fn until(&self, needle: &str) {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let text = String::from_utf8_lossy(&self.output.lock().expect("lock")).into_owned();
            if text.contains(needle) {
                return;
            }
            assert!(tokio::time::Instant::now() < deadline, "attach never printed {needle:?}; got {text:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits for the process to exit; returns (success, stderr).
    async fn finish(mut self) -> (bool, String) {
        use std::io::Read;
        let deadline = tokio::time::Instant::now() + WAIT;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                break status;
            }
            assert!(tokio::time::Instant::now() < deadline, "tether attach did not exit");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let mut stderr = String::new();
        if let Some(mut err) = self.child.stderr.take() {
            let _ = err.read_to_string(&mut stderr);
        }
        (status.success(), stderr)
    }
}

#[actix_rt::test]
async fn tether_attach_types_sees_output_detaches_and_reports_the_exit() {
    let e = start(false, &[]).await;
    let id = terminal(&e, &["sh"]).await;
    let mut attach = AttachProcess::start(&e, &id);
    attach.type_bytes(b"echo attach-$((40+2))\n");
    attach.until("attach-42").await;
    attach.type_bytes(&[0x1d]); // Ctrl-]
    let (ok, stderr) = attach.finish().await;
    assert!(ok && stderr.contains("[detached]"), "detach exits 0: {stderr}");
    // The shell kept running; a second attach ends it and reports the code.
    let mut attach = AttachProcess::start(&e, &id);
    attach.type_bytes(b"exit 3\n");
    let (ok, stderr) = attach.finish().await;
    assert!(!ok, "a non-zero exit is reported with status 1");
    assert!(stderr.contains("exited with code 3"), "{stderr}");
}

/// `serve --demo` prints a token and a shell terminal that answers; a
/// second demo on the same database revokes the first demo's token, and
/// each removes its daemon's state dir when it exits.
#[actix_rt::test]
async fn serve_demo_prints_a_ready_terminal() {
    let dir = tempfile::tempdir().expect("dir");
    let db = dir.path().join("demo.db");
    let env = [("TETHER_DATABASE__SQLITE_PATH", db.to_str().expect("utf-8"))];
    let mut first = TetherServer::start(&env, &["--demo"]).await;
    let (first_token, _) = demo_instructions(&first).await;
    let first_state = std::env::temp_dir().join(format!("tether-demo-{}", first.pid()));
    assert!(first_state.is_dir(), "the demo daemon's state dir {first_state:?}");
    assert!(first.terminate(Duration::from_secs(30)).is_some_and(|s| s.success()), "{}", first.log());
    assert!(!first_state.exists(), "the exited demo left {first_state:?}");

    let server = TetherServer::start(&env, &["--demo"]).await;
    let (token, terminal) = demo_instructions(&server).await;
    let (status, _) = Api::new(server.url(), first_token).get("/api/v1/hosts").await;
    assert_eq!(status, 401, "the earlier demo's token still opens the demo");
    let mut sock = Socket::connect(&viewer_url(&server, &terminal), Some(&token), &["tether.v1"]).await;
    sock.send_message(&ClientMessage::Input { data: "echo demo-$((2*21))\n".into() }).await;
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    while !String::from_utf8_lossy(&seen).contains("demo-42") {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match sock.next_within(left).await {
            Some(Event::Binary(b)) => seen.extend_from_slice(&b),
            Some(Event::Close(code)) => panic!("closed {code:?}"),
            Some(_) => {}
            None => panic!("the demo shell never answered; saw {:?}", String::from_utf8_lossy(&seen)),
        }
    }
}

/// The token and terminal id a demo printed, once it printed them.
async fn demo_instructions(server: &TetherServer) -> (String, String) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let log = server.log();
        let field = |name: &str| log.lines().find_map(|l| l.trim().strip_prefix(name).map(|v| v.trim().to_string()));
        if let (Some(token), Some(terminal)) = (field("token:"), field("terminal:")) {
            assert!(
                log.contains(&format!("tether attach {terminal} --server {} --token {token}", server.url())),
                "{log}"
            );
            return (token, terminal);
        }
        assert!(tokio::time::Instant::now() < deadline, "no demo instructions in the log:\n{log}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A paste far larger than the daemon's input queue (1 MiB), sent while
/// the program has not started reading: from a viewer in 64 KiB frames,
/// then over REST in 64 KiB requests. Every byte reaches the program, in
/// order. The daemon used to drop what came past its queue while the
/// server went on sending, so only 1 MiB arrived and every request had
/// still been answered 202.
#[actix_rt::test]
async fn a_paste_larger_than_the_daemons_input_queue_arrives_whole() {
    let e = start(false, &[]).await;
    let each = 1_200_000;
    let script = format!(
        "stty raw -echo; sleep 3; n=$(head -c {} | tr -d x | wc -c); echo \"other bytes: $n\"; \
         echo done",
        2 * each
    );
    let terminal = terminal(&e, &["sh", "-c", &script]).await;
    let mut viewer = Viewer::attach(&e, &terminal, "").await;
    let chunk = vec![b'x'; 64 * 1024];
    let mut sent = 0;
    while sent < each {
        let len = chunk.len().min(each - sent);
        viewer.sock.send_binary(chunk[..len].to_vec()).await;
        sent += len;
    }
    let text = String::from_utf8(chunk).expect("ascii");
    let mut sent = 0;
    while sent < each {
        let len = text.len().min(each - sent);
        let (status, body) =
            e.api.post(&format!("/api/v1/terminals/{terminal}/input"), json!({"data": &text[..len]})).await;
        assert_eq!(status, 202, "{body}");
        sent += len;
    }
    // `head` ends only once it has every byte; none of them is other than x.
    viewer.until("done").await;
    assert!(viewer.text().contains("other bytes: 0"), "{:?}", viewer.text());
}

/// A viewer holds the grid of a terminal that has not started (its host is
/// offline): once the daemon is back and the terminal starts, the PTY takes
/// the holder's grid. It used to keep its creation size: the arbiter took
/// the resize it could not send as asked for, and the holder's later views
/// matched it, so nothing asked again.
#[actix_rt::test]
async fn a_terminal_that_starts_late_takes_its_holders_grid() {
    let mut e = start(false, &[]).await;
    e.daemon.kill();
    e.api.wait_for(&format!("/api/v1/hosts/{}", e.host), "the host offline", |b| b["host"]["state"] == "offline").await;
    let (status, body) =
        e.api.post("/api/v1/terminals", json!({"hostId": e.host, "argv": ["sh"], "cols": 80, "rows": 24})).await;
    assert_eq!(status, 201, "{body}");
    let terminal = body["terminal"]["id"].as_str().expect("terminal id").to_string();
    let mut holder = Socket::connect(&viewer_url(&e.server, &terminal), Some(&e.api.token), &["tether.v1"]).await;
    holder.send_message(&ClientMessage::view(120, 40, true, 0, true)).await;
    loop {
        match holder.next().await {
            Event::Text(t) if t.contains("\"yours\":true") => break,
            Event::Close(code) => panic!("the holder was closed {code:?}"),
            _ => {}
        }
    }
    e.daemon = DaemonProcess::start(&e.server, &e.api.token, &e.dir.path().join("state"));
    wait_state(&e.api, &terminal, "running").await;
    let mut watcher = Viewer::attach(&e, &terminal, "").await;
    watcher.type_line("stty size").await;
    watcher.until("40 120").await;
}

/// A program that does not read its input holds back its own terminal's
/// input only: once more than 4 MiB waits for it, its input is refused
/// (REST 429), while another terminal of the same host takes input as
/// ever. The input waiting on the server used to count for the whole host.
#[actix_rt::test]
async fn a_terminal_that_does_not_read_holds_back_its_own_input_only() {
    let e = start(false, &[]).await;
    let stuck = terminal(&e, &["sh", "-c", "stty raw -echo; sleep 120"]).await;
    let other = terminal(&e, &["sh"]).await;
    let mut viewer = Viewer::attach(&e, &other, "").await;
    input_until_refused(&e.api, &stuck).await;
    let (status, body) =
        e.api.post(&format!("/api/v1/terminals/{other}/input"), json!({"data": "echo ok-$((4*5))\n"})).await;
    assert_eq!(status, 202, "{body}");
    viewer.until("ok-20").await;
}
