//! The daemon protocol's edges (docs/PROTOCOL.md, "What the server enforces") against a real `tether serve`,
//! with a scripted daemon: every close code, held early frames, newest
//! daemon wins, and that refused sockets change nothing.

mod support;

use std::time::Duration;

use actix_http::ws::Item;
use bytes::Bytes;
use serde_json::json;
use support::client::{
    create_token, daemon_url, frame_header, hello, input_until_refused, inputs_arrive_in_order, viewer_url, Api, Event,
    Socket,
};
use support::TetherServer;
use tether::proto::v1::{daemon_frame, server_frame};

const PROTOCOL: &[&str] = &["tether.daemon.v1"];

async fn server() -> TetherServer {
    TetherServer::start(&[("TETHER_DAEMON__HELLO_TIMEOUT_MS", "700")], &[]).await
}

/// A user with a registered host: (api, host id).
async fn user_with_host(server: &TetherServer, user: &str) -> (Api, String) {
    let api = Api::new(server.url(), create_token(server, user));
    let (status, body) = api.post("/api/v1/hosts", json!({"hostname": format!("{user}-box")})).await;
    assert_eq!(status, 201, "{body}");
    let id = body["host"]["id"].as_str().expect("host id").to_string();
    (api, id)
}

async fn connected_daemon(server: &TetherServer, api: &Api, host_id: &str) -> Socket {
    let mut sock = Socket::connect(&daemon_url(server), Some(&api.token), PROTOCOL).await;
    sock.send_frame(hello(host_id)).await;
    match sock.next_server_frame().await {
        server_frame::Frame::HelloAck(ack) => assert!(ack.instance_id.contains('#'), "{}", ack.instance_id),
        other => panic!("expected HelloAck, got {other:?}"),
    }
    sock
}

#[actix_rt::test]
async fn no_hello_in_time_is_4408() {
    let server = server().await;
    let (api, _) = user_with_host(&server, "ann").await;
    let mut sock = Socket::connect(&daemon_url(&server), Some(&api.token), PROTOCOL).await;
    assert_eq!(sock.expect_close().await, Some(4408));
}

/// A connected daemon that sends no frame for `daemon.idle_timeout_ms` is
/// closed 1008 by the registry's one idle check; one that pings stays.
#[actix_rt::test]
async fn a_silent_daemon_is_closed_1008_and_a_pinging_one_stays() {
    let server = TetherServer::start(&[("TETHER_DAEMON__IDLE_TIMEOUT_MS", "1500")], &[]).await;
    let (ann, ann_host) = user_with_host(&server, "ann").await;
    let (bob, bob_host) = user_with_host(&server, "bob").await;
    let mut silent = connected_daemon(&server, &ann, &ann_host).await;
    let mut pinging = connected_daemon(&server, &bob, &bob_host).await;
    let started = std::time::Instant::now();
    let closed = async {
        let code = silent.expect_close().await;
        (code, started.elapsed())
    };
    let pings = async {
        for _ in 0..12 {
            pinging.send_frame(daemon_frame::Frame::Ping(Default::default())).await;
            match pinging.next_server_frame().await {
                server_frame::Frame::Pong(_) => {}
                other => panic!("expected Pong, got {other:?}"),
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    };
    let ((code, after), ()) = tokio::join!(closed, pings);
    assert_eq!(code, Some(1008));
    assert!(after >= Duration::from_millis(1500), "closed after {after:?}, before the idle timeout");
    // The pinging daemon outlived the silent one by over 2 s and still answers.
    pinging.send_frame(daemon_frame::Frame::Ping(Default::default())).await;
    assert!(matches!(pinging.next_server_frame().await, server_frame::Frame::Pong(_)));
    let (_, body) = bob.get(&format!("/api/v1/hosts/{bob_host}")).await;
    assert_eq!(body["host"]["state"], "online", "{body}");
}

#[actix_rt::test]
async fn bad_or_missing_token_is_4401() {
    let server = server().await;
    let (_, host) = user_with_host(&server, "ann").await;
    for token in [Some("tth_wrong"), Some("nonsense"), None] {
        let mut sock = Socket::connect(&daemon_url(&server), token, PROTOCOL).await;
        sock.send_frame(hello(&host)).await;
        assert_eq!(sock.expect_close().await, Some(4401), "token {token:?}");
    }
}

#[actix_rt::test]
async fn foreign_or_unknown_host_is_4403_and_changes_nothing() {
    let server = server().await;
    let (ann, _) = user_with_host(&server, "ann").await;
    let (bob, bobs_host) = user_with_host(&server, "bob").await;
    for host in [bobs_host.as_str(), "00000000-0000-0000-0000-000000000001", "not-a-uuid"] {
        let mut sock = Socket::connect(&daemon_url(&server), Some(&ann.token), PROTOCOL).await;
        sock.send_frame(hello(host)).await;
        assert_eq!(sock.expect_close().await, Some(4403), "host {host}");
    }
    let (_, body) = bob.get(&format!("/api/v1/hosts/{bobs_host}")).await;
    assert_eq!(body["host"]["state"], "offline", "bob's host was not taken over");
    assert_eq!(body["host"]["lastSeenAt"], serde_json::Value::Null);
}

#[actix_rt::test]
async fn frame_over_one_mib_is_4413() {
    let server = server().await;
    let (api, host) = user_with_host(&server, "ann").await;
    let mut sock = connected_daemon(&server, &api, &host).await;
    sock.send_binary(vec![0u8; 1024 * 1024 + 1]).await;
    assert_eq!(sock.expect_close().await, Some(4413));
}

#[actix_rt::test]
async fn a_header_declaring_over_one_mib_is_4413_before_its_payload() {
    let server = server().await;
    let (api, host) = user_with_host(&server, "ann").await;
    let mut sock = connected_daemon(&server, &api, &host).await;
    sock.send_raw(&frame_header(true, 2, 1 << 40)).await;
    sock.send_raw(&[0u8; 64 * 1024]).await;
    assert_eq!(sock.expect_close().await, Some(4413));
    // Fragments count together: two of 700 KiB make one message over 1 MiB.
    let mut sock = connected_daemon(&server, &api, &host).await;
    let half = Bytes::from(vec![0u8; 700 * 1024]);
    sock.send_continuation(Item::FirstBinary(half.clone())).await;
    sock.send_continuation(Item::Last(half)).await;
    assert_eq!(sock.expect_close().await, Some(4413));
}

/// Frames that break RFC 6455 are closed with its codes rather than
/// dropped without a close frame: an unmasked frame, reserved bits, a
/// reserved opcode, a continuation that starts nothing (1002), and text
/// that is not UTF-8 (1007, before the daemon protocol refuses text).
#[actix_rt::test]
async fn frames_that_break_the_websocket_protocol_are_1002_or_1007() {
    let server = server().await;
    let (api, host) = user_with_host(&server, "ann").await;
    let masked = |first: u8, payload: &[u8]| {
        let mut frame = vec![first, 0x80 | payload.len() as u8, 0, 0, 0, 0];
        frame.extend_from_slice(payload);
        frame
    };
    let cases: [(&str, Vec<u8>, u16); 5] = [
        ("an unmasked binary frame", vec![0x82, 0x01, 0x00], 1002),
        ("reserved bits", masked(0x82 | 0x40, b"x"), 1002),
        ("a reserved opcode", masked(0x83, b"x"), 1002),
        ("a continuation that starts nothing", masked(0x80, b"x"), 1002),
        ("text that is not UTF-8", masked(0x81, &[0xff, 0xfe]), 1007),
    ];
    for (what, frame, code) in cases {
        let mut sock = connected_daemon(&server, &api, &host).await;
        sock.send_raw(&frame).await;
        assert_eq!(sock.expect_close().await, Some(code), "{what}");
    }
}

#[actix_rt::test]
async fn a_daemons_close_is_answered_with_its_code() {
    let server = server().await;
    let (api, host) = user_with_host(&server, "ann").await;
    let mut sock = connected_daemon(&server, &api, &host).await;
    sock.close_with(1001).await;
    assert_eq!(sock.expect_close().await, Some(1001), "a close frame answers the daemon's");
}

#[actix_rt::test]
async fn garbage_protobuf_and_text_are_1008() {
    let server = server().await;
    let (api, host) = user_with_host(&server, "ann").await;
    let mut sock = connected_daemon(&server, &api, &host).await;
    sock.send_binary(vec![0xff, 0xff, 0xff, 0x01, 0x02]).await;
    assert_eq!(sock.expect_close().await, Some(1008));
    let mut sock = connected_daemon(&server, &api, &host).await;
    sock.send_text("{\"hello\":1}").await;
    assert_eq!(sock.expect_close().await, Some(1008));
}

/// A hello's dirs are checked before anything is stored: an entry that is
/// not absolute, holds a NUL or is over 4096 bytes closes the socket 1008,
/// and the host stays offline with the dirs it had.
#[actix_rt::test]
async fn a_hello_with_dirs_that_are_not_absolute_paths_is_1008() {
    let server = server().await;
    let (api, host) = user_with_host(&server, "ann").await;
    let long = format!("/{}", "d".repeat(4096));
    for bad in ["relative/dir", "", "/tmp/a\0b", long.as_str()] {
        let mut sock = Socket::connect(&daemon_url(&server), Some(&api.token), PROTOCOL).await;
        let mut frame = hello(&host);
        if let daemon_frame::Frame::Hello(h) = &mut frame {
            h.dirs = vec!["/tmp".into(), bad.to_string()];
        }
        sock.send_frame(frame).await;
        assert_eq!(sock.expect_close().await, Some(1008), "{bad:?}");
        let (_, body) = api.get(&format!("/api/v1/hosts/{host}")).await;
        assert_eq!(body["host"]["state"], "offline", "{bad:?}");
        assert_eq!(body["host"]["dirs"], json!([]), "{bad:?}");
    }
    connected_daemon(&server, &api, &host).await;
}

#[actix_rt::test]
async fn too_many_early_frames_is_1008() {
    let server = TetherServer::start(&[("TETHER_DAEMON__HELLO_TIMEOUT_MS", "20000")], &[]).await;
    let (api, _) = user_with_host(&server, "ann").await;
    let mut sock = Socket::connect(&daemon_url(&server), Some(&api.token), PROTOCOL).await;
    for _ in 0..257 {
        sock.send_frame(daemon_frame::Frame::Ping(tether::proto::v1::Ping {})).await;
    }
    assert_eq!(sock.expect_close().await, Some(1008));
}

#[actix_rt::test]
async fn early_frames_are_held_then_applied_in_order() {
    let server = server().await;
    let (api, host) = user_with_host(&server, "ann").await;
    let mut sock = Socket::connect(&daemon_url(&server), Some(&api.token), PROTOCOL).await;
    // Pings sent before the hello are held, not dropped: each gets its Pong after the ack.
    for _ in 0..3 {
        sock.send_frame(daemon_frame::Frame::Ping(tether::proto::v1::Ping {})).await;
    }
    sock.send_frame(hello(&host)).await;
    assert!(matches!(sock.next_server_frame().await, server_frame::Frame::HelloAck(_)));
    for _ in 0..3 {
        assert!(matches!(sock.next_server_frame().await, server_frame::Frame::Pong(_)));
    }
}

#[actix_rt::test]
async fn newest_daemon_wins() {
    let server = server().await;
    let (api, host) = user_with_host(&server, "ann").await;
    let mut first = connected_daemon(&server, &api, &host).await;
    let (_, body) = api.get(&format!("/api/v1/hosts/{host}")).await;
    assert_eq!(body["host"]["state"], "online");
    assert_eq!(body["host"]["capabilities"]["manageDirs"], true);
    assert_eq!(body["host"]["dirs"], json!(["/tmp"]));
    let mut second = connected_daemon(&server, &api, &host).await;
    assert_eq!(first.expect_close().await, Some(4000), "the older connection is replaced");
    // The host stays online through the replacement, served by the newer socket.
    let (_, body) = api.get(&format!("/api/v1/hosts/{host}")).await;
    assert_eq!(body["host"]["state"], "online");
    second.send_frame(daemon_frame::Frame::Ping(tether::proto::v1::Ping {})).await;
    assert!(matches!(second.next_server_frame().await, server_frame::Frame::Pong(_)));
    let (status, body) = api.delete(&format!("/api/v1/hosts/{host}")).await;
    assert_eq!((status, body["error"]["code"].as_str()), (409, Some("host_online")));
    second.close().await;
    api.wait_for(&format!("/api/v1/hosts/{host}"), "host offline", |b| b["host"]["state"] == "offline").await;
}

/// A second daemon of the same host (another state dir, same hostname) says
/// hello without the first one's terminals, so their rows read exited.
/// When the first daemon returns and reports them, a terminal whose row is
/// still there is running again, and one the user deleted meanwhile is hung
/// up so its process does not run on unreachable. The first daemon's
/// terminals used to stay exited while their processes ran on.
#[actix_rt::test]
async fn a_returning_daemon_gets_its_terminals_back_and_deleted_ones_hung_up() {
    let server = server().await;
    let (api, host) = user_with_host(&server, "ann").await;
    let mut first = connected_daemon(&server, &api, &host).await;
    let mut ids = Vec::new();
    for _ in 0..2 {
        let (status, body) = api.post("/api/v1/terminals", json!({"hostId": host, "argv": ["sh"]})).await;
        assert_eq!(status, 201, "{body}");
        let id = body["terminal"]["id"].as_str().expect("id").to_string();
        assert!(matches!(first.next_server_frame().await, server_frame::Frame::Spawn(s) if s.terminal_id == id));
        let started = tether::proto::v1::Started { terminal_id: id.clone(), pid: 7 };
        first.send_frame(daemon_frame::Frame::Started(started)).await;
        api.wait_for(&format!("/api/v1/terminals/{id}"), "running", |b| b["terminal"]["state"] == "running").await;
        ids.push(id);
    }
    let (kept, deleted) = (&ids[0], &ids[1]);
    let mut second = connected_daemon(&server, &api, &host).await;
    assert_eq!(first.expect_close().await, Some(4000));
    for id in &ids {
        api.wait_for(&format!("/api/v1/terminals/{id}"), "exited", |b| b["terminal"]["state"] == "exited").await;
    }
    let (status, body) = api.delete(&format!("/api/v1/terminals/{deleted}")).await;
    assert_eq!(status, 204, "{body}");
    second.close().await;

    let mut back = Socket::connect(&daemon_url(&server), Some(&api.token), PROTOCOL).await;
    let mut hello = hello(&host);
    if let daemon_frame::Frame::Hello(h) = &mut hello {
        h.terminals = ids
            .iter()
            .map(|id| tether::proto::v1::TerminalReport { terminal_id: id.clone(), running: true, next_offset: 0 })
            .collect();
    }
    back.send_frame(hello).await;
    assert!(matches!(back.next_server_frame().await, server_frame::Frame::HelloAck(_)));
    match back.next_server_frame().await {
        server_frame::Frame::Kill(k) => assert_eq!((&k.terminal_id, k.signal), (deleted, libc::SIGHUP)),
        other => panic!("expected Kill of the deleted terminal, got {other:?}"),
    }
    let (_, body) = api.get(&format!("/api/v1/terminals/{kept}")).await;
    assert_eq!(body["terminal"]["state"], "running", "{body}");
    assert_eq!(body["terminal"]["endedAt"], serde_json::Value::Null, "{body}");
    // Its viewers reach it through the returned daemon again.
    let mut viewer = Socket::connect(&viewer_url(&server, kept), Some(&api.token), &["tether.v1"]).await;
    assert!(matches!(back.next_server_frame().await, server_frame::Frame::Attach(a) if &a.terminal_id == kept));
    viewer.close().await;
}

/// Daemons of one host that say hello at the same moment on one instance:
/// whichever connection the instance keeps holds the lease, so the host
/// reads online. Claims used
/// to commit in database order rather than in the order the registry saw
/// them: an older connection whose seize committed last held the lease, then
/// released it as it was replaced, leaving the kept connection acked,
/// lease-less (the host offline) until its next renewal closed it 4000.
#[actix_rt::test]
async fn simultaneous_hellos_leave_one_connection_holding_the_host() {
    let server = server().await;
    let (api, host) = user_with_host(&server, "ann").await;
    for round in 0..8 {
        let mut sockets = Vec::new();
        for _ in 0..4 {
            sockets.push(Socket::connect(&daemon_url(&server), Some(&api.token), PROTOCOL).await);
        }
        futures_util::future::join_all(sockets.iter_mut().map(|s| s.send_frame(hello(&host)))).await;
        // Each ends acked and kept, or closed 4000 as replaced.
        let outcomes = futures_util::future::join_all(sockets.iter_mut().map(|s| async move {
            let until = tokio::time::Instant::now() + Duration::from_millis(1500);
            let mut acked = false;
            loop {
                let left = until.saturating_duration_since(tokio::time::Instant::now());
                match s.next_within(left).await {
                    None => return (acked, None),
                    Some(Event::Binary(_)) => acked = true,
                    Some(Event::Close(code)) => return (acked, Some(code)),
                    Some(_) => {}
                }
            }
        }))
        .await;
        let open: Vec<usize> = (0..outcomes.len()).filter(|&i| outcomes[i].1.is_none()).collect();
        assert_eq!(open.len(), 1, "round {round}: one connection stays: {outcomes:?}");
        assert!(outcomes[open[0]].0, "round {round}: the kept connection was acked: {outcomes:?}");
        for (acked, code) in outcomes.iter().filter(|o| o.1.is_some()) {
            assert_eq!(*code, Some(Some(4000)), "round {round}: the others are replaced (acked: {acked})");
        }
        let (_, body) = api.get(&format!("/api/v1/hosts/{host}")).await;
        assert_eq!(body["host"]["state"], "online", "round {round}");
        let kept = &mut sockets[open[0]];
        ping_pong(kept).await;
        kept.close().await;
        api.wait_for(&format!("/api/v1/hosts/{host}"), "host offline", |b| b["host"]["state"] == "offline").await;
    }
}

#[actix_rt::test]
async fn subprotocols_are_selected_and_the_token_never_echoed() {
    let server = server().await;
    let (api, host) = user_with_host(&server, "ann").await;
    let (status, body) = api.post("/api/v1/terminals", json!({"hostId": host})).await;
    assert_eq!(status, 201);
    let terminal = body["terminal"]["id"].as_str().expect("id").to_string();
    let auth = format!("tether.auth.{}", api.token);
    let (selected, mut sock) =
        Socket::connect_with_response(&viewer_url(&server, &terminal), &["tether.v1", &auth]).await;
    assert_eq!(selected.as_deref(), Some("tether.v1"));
    // Authenticated through the subprotocol: the viewer is told its access,
    // then the terminal's status.
    for wanted in ["\"access\"", "\"status\""] {
        match sock.next().await {
            Event::Text(t) => assert!(t.contains(wanted), "{t}"),
            other => panic!("expected {wanted}, got {other:?}"),
        }
    }
    let (selected, _sock) = Socket::connect_with_response(&daemon_url(&server), &["tether.daemon.v1"]).await;
    assert_eq!(selected.as_deref(), Some("tether.daemon.v1"));
}

#[actix_rt::test]
async fn spawn_start_and_exit_through_a_scripted_daemon() {
    let server = server().await;
    let (api, host) = user_with_host(&server, "ann").await;
    // Created while offline: parked.
    let (_, body) = api.post("/api/v1/terminals", json!({"hostId": host, "argv": ["sh"]})).await;
    assert_eq!(body["terminal"]["pendingReason"], "host_offline");
    let parked = body["terminal"]["id"].as_str().expect("id").to_string();
    let mut daemon = connected_daemon(&server, &api, &host).await;
    // The parked terminal is spawned after the hello.
    let spawn = match daemon.next_server_frame().await {
        server_frame::Frame::Spawn(s) => s,
        other => panic!("expected Spawn, got {other:?}"),
    };
    assert_eq!(spawn.terminal_id, parked);
    assert_eq!(spawn.argv, vec!["sh"]);
    let (_, body) = api.get(&format!("/api/v1/terminals/{parked}")).await;
    assert_eq!(body["terminal"]["state"], "launching");
    daemon
        .send_frame(daemon_frame::Frame::Started(tether::proto::v1::Started { terminal_id: parked.clone(), pid: 42 }))
        .await;
    api.wait_for(&format!("/api/v1/terminals/{parked}"), "running", |b| b["terminal"]["state"] == "running").await;
    // Out of place for a running terminal (a Usage before its Exit, a
    // SpawnError after its start): they change nothing, and the server
    // still knows the terminal when its Exit comes.
    daemon
        .send_frame(daemon_frame::Frame::Usage(tether::proto::v1::Usage {
            terminal_id: parked.clone(),
            cpu_ms: 1,
            max_rss_kb: 1,
            output_bytes: 1,
            wall_ms: 1,
        }))
        .await;
    daemon
        .send_frame(daemon_frame::Frame::SpawnError(tether::proto::v1::SpawnError {
            terminal_id: parked.clone(),
            message: "late".into(),
        }))
        .await;
    // Frames for a terminal this host does not own are dropped.
    let (_, other) = user_with_host(&server, "bob").await;
    let _ = other;
    daemon
        .send_frame(daemon_frame::Frame::Exit(tether::proto::v1::Exit {
            terminal_id: "00000000-0000-0000-0000-000000000009".into(),
            exit_code: Some(1),
            signal: None,
        }))
        .await;
    daemon
        .send_frame(daemon_frame::Frame::Exit(tether::proto::v1::Exit {
            terminal_id: parked.clone(),
            exit_code: None,
            signal: Some(15),
        }))
        .await;
    let body =
        api.wait_for(&format!("/api/v1/terminals/{parked}"), "exited", |b| b["terminal"]["state"] == "exited").await;
    assert_eq!(body["terminal"]["exitSignal"], 15);
    assert_eq!(body["terminal"]["exitCode"], serde_json::Value::Null);
    // A late duplicate Started changes nothing.
    daemon
        .send_frame(daemon_frame::Frame::Started(tether::proto::v1::Started { terminal_id: parked.clone(), pid: 42 }))
        .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (_, body) = api.get(&format!("/api/v1/terminals/{parked}")).await;
    assert_eq!(body["terminal"]["state"], "exited");
}

/// The next Attach the server sends for `terminal_id` (other frames skipped).
async fn next_attach(daemon: &mut Socket, terminal_id: &str) -> tether::proto::v1::Attach {
    loop {
        if let server_frame::Frame::Attach(a) = daemon.next_server_frame().await {
            if a.terminal_id == terminal_id {
                return a;
            }
        }
    }
}

/// A run of a scripted daemon that printed `first\r\n` into its log, and
/// whose connection is then closed: (run id, terminal id).
async fn run_that_printed_a_line(server: &TetherServer, api: &Api, host: &str) -> (String, String) {
    let mut daemon = connected_daemon(server, api, host).await;
    let (status, body) = api.post("/api/v1/runs", json!({"hostId": host, "argv": ["sh"]})).await;
    assert_eq!(status, 201, "{body}");
    let run = body["run"]["id"].as_str().expect("run id").to_string();
    let terminal = match daemon.next_server_frame().await {
        server_frame::Frame::Spawn(s) => s.terminal_id,
        other => panic!("expected Spawn, got {other:?}"),
    };
    let started = tether::proto::v1::Started { terminal_id: terminal.clone(), pid: 7 };
    daemon.send_frame(daemon_frame::Frame::Started(started)).await;
    let attach = next_attach(&mut daemon, &terminal).await;
    let scrollback = tether::proto::v1::Scrollback {
        terminal_id: terminal.clone(),
        attach_id: attach.attach_id,
        data: Bytes::new(),
        cols: 80,
        rows: 24,
        offset: attach.resume_from.unwrap_or(0),
        resumed: attach.resume_from.is_some(),
    };
    daemon.send_frame(daemon_frame::Frame::Scrollback(scrollback)).await;
    let output = tether::proto::v1::Output { terminal_id: terminal.clone(), offset: 0, data: "first\r\n".into() };
    daemon.send_frame(daemon_frame::Frame::Output(output)).await;
    let log = format!("/api/v1/runs/{run}/log");
    for _ in 0..400 {
        if api.get_bytes(&log).await.1.len() == 7 {
            daemon.close().await;
            return (run, terminal);
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the log never held the first line");
}

/// The hello of a daemon back after its run's command ended with `end`
/// bytes of output, claiming `resume_ended` or not; returns the socket and
/// the HelloAck's `resume_ended`.
async fn back_after_the_run_ended(
    server: &TetherServer,
    api: &Api,
    host: &str,
    terminal: &str,
    end: u64,
    serves_tail: bool,
) -> (Socket, Vec<String>) {
    let mut back = Socket::connect(&daemon_url(server), Some(&api.token), PROTOCOL).await;
    let mut hello = hello(host);
    if let daemon_frame::Frame::Hello(h) = &mut hello {
        h.terminals = vec![tether::proto::v1::TerminalReport {
            terminal_id: terminal.to_owned(),
            running: false,
            next_offset: end,
        }];
        if let Some(caps) = h.capabilities.as_mut() {
            caps.resume_ended = serves_tail;
        }
    }
    back.send_frame(hello).await;
    match back.next_server_frame().await {
        server_frame::Frame::HelloAck(ack) => (back, ack.resume_ended),
        other => panic!("expected HelloAck, got {other:?}"),
    }
}

/// The final frames of a run's terminal that exited 0 after `end` bytes.
async fn send_final_frames(daemon: &mut Socket, terminal: &str, end: u64) {
    let terminal_id = terminal.to_owned();
    let snapshot =
        tether::proto::v1::Snapshot { terminal_id: terminal_id.clone(), data: Bytes::new(), cols: 80, rows: 24 };
    daemon.send_frame(daemon_frame::Frame::Snapshot(snapshot)).await;
    let exit = tether::proto::v1::Exit { terminal_id: terminal_id.clone(), exit_code: Some(0), signal: None };
    daemon.send_frame(daemon_frame::Frame::Exit(exit)).await;
    let usage = tether::proto::v1::Usage { terminal_id, cpu_ms: 1, max_rss_kb: 1, output_bytes: end, wall_ms: 1 };
    daemon.send_frame(daemon_frame::Frame::Usage(usage)).await;
}

/// A run whose command ended while its daemon was away
/// (docs/PROTOCOL.md, "Terminals that ended while disconnected"): a daemon
/// that claims `resume_ended` is named in the HelloAck and asked for the
/// tail from where the log ends, and the log gets it before the run ends;
/// an older daemon is named in nothing, and the tail it cannot serve is
/// counted in `logGapBytes`.
#[actix_rt::test]
async fn the_tail_of_a_run_that_ended_while_away_is_asked_of_a_daemon_that_serves_it() {
    let server = server().await;
    let (api, host) = user_with_host(&server, "ann").await;
    let tail = "x".repeat(100);

    let (run, terminal) = run_that_printed_a_line(&server, &api, &host).await;
    let (mut back, named) = back_after_the_run_ended(&server, &api, &host, &terminal, 107, true).await;
    assert_eq!(named, std::slice::from_ref(&terminal));
    let attach = next_attach(&mut back, &terminal).await;
    assert_eq!((attach.resume_from, attach.from_oldest), (Some(7), Some(true)));
    let scrollback = tether::proto::v1::Scrollback {
        terminal_id: terminal.clone(),
        attach_id: attach.attach_id,
        data: tail.clone().into(),
        cols: 80,
        rows: 24,
        offset: 7,
        resumed: true,
    };
    back.send_frame(daemon_frame::Frame::Scrollback(scrollback)).await;
    send_final_frames(&mut back, &terminal, 107).await;
    let path = format!("/api/v1/runs/{run}");
    let done = api.wait_for(&path, "the run final", |b| b["run"]["state"] == "succeeded").await;
    assert_eq!(done["run"]["logGapBytes"], 0, "{done}");
    let log = api.get_bytes(&format!("/api/v1/runs/{run}/log")).await.1;
    assert_eq!(String::from_utf8_lossy(&log), format!("first\r\n{tail}"));
    back.close().await;

    let (run, terminal) = run_that_printed_a_line(&server, &api, &host).await;
    let (mut back, named) = back_after_the_run_ended(&server, &api, &host, &terminal, 107, false).await;
    assert!(named.is_empty(), "{named:?}");
    send_final_frames(&mut back, &terminal, 107).await;
    let path = format!("/api/v1/runs/{run}");
    let done = api.wait_for(&path, "the run final", |b| b["run"]["state"] == "succeeded").await;
    assert_eq!(done["run"]["logGapBytes"], 100, "{done}");
    assert_eq!(api.get_bytes(&format!("/api/v1/runs/{run}/log")).await.1.len(), 7);
}

/// A run whose command ended while its daemon was away, with nothing
/// printed after the cut, reported to an instance that has no arbiter of
/// its terminal (here a restarted one): the Exit the daemon sends right
/// after the HelloAck ends the run. It could come before the capture was
/// opened, which then found the arbiter retiring, and the run stayed
/// `running` for good (and `tether logs --follow` with it).
#[actix_rt::test]
async fn a_run_that_ended_while_away_is_finished_by_an_instance_that_never_held_it() {
    let dir = tempfile::tempdir().expect("dir");
    let db = dir.path().join("tether.db");
    let env = [("TETHER_DATABASE__SQLITE_PATH", db.to_str().expect("path"))];
    for round in 0..5 {
        let mut first = TetherServer::start(&env, &[]).await;
        let api = Api::new(first.url(), create_token(&first, "ann"));
        let (status, body) = api.post("/api/v1/hosts", json!({"hostname": "ann-box"})).await;
        assert!(status == 201 || status == 200, "{body}");
        let host = body["host"]["id"].as_str().expect("host id").to_string();
        let (run, terminal) = run_that_printed_a_line(&first, &api, &host).await;
        first.kill();

        let second = TetherServer::start(&env, &[]).await;
        let api = Api::new(second.url(), api.token.clone());
        let (mut back, named) = back_after_the_run_ended(&second, &api, &host, &terminal, 7, true).await;
        assert!(named.is_empty(), "nothing past the log: {named:?}");
        send_final_frames(&mut back, &terminal, 7).await;
        let path = format!("/api/v1/runs/{run}");
        let done = api.wait_for(&path, "the run final", |b| b["run"]["state"] == "succeeded").await;
        assert_eq!(done["run"]["logGapBytes"], 0, "round {round}: {done}");
        back.close().await;
    }
}

/// A running terminal of a scripted daemon: (daemon socket, terminal id).
async fn running_terminal(server: &TetherServer, api: &Api, host: &str) -> (Socket, String) {
    let mut daemon = connected_daemon(server, api, host).await;
    let (status, body) = api.post("/api/v1/terminals", json!({"hostId": host, "argv": ["sh"]})).await;
    assert_eq!(status, 201, "{body}");
    let id = body["terminal"]["id"].as_str().expect("id").to_string();
    match daemon.next_server_frame().await {
        server_frame::Frame::Spawn(s) => assert_eq!(s.terminal_id, id),
        other => panic!("expected Spawn, got {other:?}"),
    }
    daemon
        .send_frame(daemon_frame::Frame::Started(tether::proto::v1::Started { terminal_id: id.clone(), pid: 7 }))
        .await;
    api.wait_for(&format!("/api/v1/terminals/{id}"), "running", |b| b["terminal"]["state"] == "running").await;
    (daemon, id)
}

/// The grid a Scrollback shows is stored when it is not the stored one: a
/// Size the daemon sent on a connection that died before it arrived (the
/// daemon was frozen, applied a resize, and its connection was closed)
/// left the terminal's `cols`/`rows` stale, and viewers that came while
/// the host was offline were given them.
#[actix_rt::test]
async fn a_scrollback_with_another_grid_is_stored() {
    let server = server().await;
    let (api, host) = user_with_host(&server, "ann").await;
    let (mut daemon, id) = running_terminal(&server, &api, &host).await;
    let (_, body) = api.get(&format!("/api/v1/terminals/{id}")).await;
    assert_ne!((&body["terminal"]["cols"], &body["terminal"]["rows"]), (&json!(101), &json!(33)), "{body}");

    let mut viewer = Socket::connect(&viewer_url(&server, &id), Some(&api.token), &["tether.v1"]).await;
    let attach = next_attach(&mut daemon, &id).await;
    let scrollback = tether::proto::v1::Scrollback {
        terminal_id: id.clone(),
        attach_id: attach.attach_id,
        data: Bytes::new(),
        cols: 101,
        rows: 33,
        offset: 0,
        resumed: false,
    };
    daemon.send_frame(daemon_frame::Frame::Scrollback(scrollback)).await;
    api.wait_for(&format!("/api/v1/terminals/{id}"), "the grid the daemon showed", |b| {
        b["terminal"]["cols"] == 101 && b["terminal"]["rows"] == 33
    })
    .await;
    viewer.close().await;
}

/// REST input towards a daemon that does not read is refused 429
/// `input_backlog` once 4 MiB waits for it, before the daemon is closed for
/// not reading (8 MiB), so every input that was answered 202 reaches the
/// daemon, in order, once it reads; then input is taken again. It used to
/// be taken until the daemon was closed 1008, and what was queued was lost.
#[actix_rt::test]
async fn rest_input_to_a_daemon_that_does_not_read_is_refused_and_none_taken_is_lost() {
    let server = server().await;
    let (api, host) = user_with_host(&server, "ann").await;
    let (mut daemon, terminal) = running_terminal(&server, &api, &host).await;
    let taken = input_until_refused(&api, &terminal).await;
    inputs_arrive_in_order(&mut daemon, &api, &terminal, taken).await;
}

/// A terminal over a limit (an argv past its entries or bytes, a host past
/// `terminals.max_per_host`) is refused before anything is written or sent:
/// the next frame the daemon gets is the one asked for after the refusals.
#[actix_rt::test]
async fn terminals_over_a_limit_are_refused_and_never_spawned() {
    let server = TetherServer::start(&[("TETHER_TERMINALS__MAX_PER_HOST", "1")], &[]).await;
    let (api, host) = user_with_host(&server, "ann").await;
    let mut daemon = connected_daemon(&server, &api, &host).await;
    let long_entry = "x".repeat(tether::http::rest::MAX_ARG_BYTES + 1);
    let full_entry = "x".repeat(tether::http::rest::MAX_ARG_BYTES);
    let too_many = vec!["x"; tether::http::rest::MAX_ARGS + 1];
    let too_long = vec![full_entry.as_str(); tether::http::rest::MAX_ARGV_BYTES / full_entry.len() + 1];
    for (argv, says) in [(too_many, "entries"), (vec![long_entry.as_str()], "bytes"), (too_long, "bytes in all")] {
        for route in ["/api/v1/terminals", "/api/v1/runs"] {
            let (status, body) = api.post(route, json!({"hostId": host, "argv": argv})).await;
            assert_eq!((status, body["error"]["code"].as_str()), (400, Some("invalid_argv")), "{route}");
            assert!(body["error"]["message"].as_str().unwrap_or_default().contains(says), "{body}");
        }
    }
    let (status, body) = api.post("/api/v1/terminals", json!({"hostId": host, "argv": ["sh"]})).await;
    assert_eq!(status, 201, "{body}");
    let first = body["terminal"]["id"].as_str().expect("id").to_string();
    match daemon.next_server_frame().await {
        server_frame::Frame::Spawn(spawn) => assert_eq!(spawn.terminal_id, first, "only the accepted terminal"),
        other => panic!("expected Spawn, got {other:?}"),
    }
    let (status, body) = api.post("/api/v1/terminals", json!({"hostId": host, "argv": ["sh"]})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (429, Some("too_many_terminals")), "{body}");
    let (status, body) = api.post(&format!("/api/v1/terminals/{first}/input"), json!({"data": "next"})).await;
    assert_eq!(status, 202, "{body}");
    match daemon.next_server_frame().await {
        server_frame::Frame::Input(input) => assert_eq!(input.terminal_id, first),
        other => panic!("the refused terminal reached the daemon: {other:?}"),
    }
    let (_, body) = api.get("/api/v1/terminals").await;
    assert_eq!(body["terminals"].as_array().map(Vec::len), Some(1), "{body}");
    let (_, body) = api.get("/api/v1/runs").await;
    assert_eq!(body["runs"], json!([]), "{body}");
}

#[actix_rt::test]
async fn requests_to_an_offline_host_are_409_and_a_silent_daemon_is_504() {
    let server = server().await;
    let (api, host) = user_with_host(&server, "ann").await;
    let (status, body) = api.post(&format!("/api/v1/hosts/{host}/dirs"), json!({"path": "/tmp"})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (409, Some("host_offline")));
    // A `..` component is refused before anything is asked, as in a
    // terminal's dir: the daemon would resolve it and allow the parent.
    for path in ["/tmp/..", "/tmp/../etc", "/srv/a/../../etc"] {
        let (status, body) = api.post(&format!("/api/v1/hosts/{host}/dirs"), json!({ "path": path })).await;
        assert_eq!((status, body["error"]["code"].as_str()), (400, Some("invalid_dir")), "{path}: {body}");
        let (status, body) = api.delete(&format!("/api/v1/hosts/{host}/dirs?path={path}")).await;
        assert_eq!((status, body["error"]["code"].as_str()), (400, Some("invalid_dir")), "{path}: {body}");
    }
    let (status, _) = api.post(&format!("/api/v1/hosts/{host}/limits/refresh"), json!({})).await;
    assert_eq!(status, 409);
    let mut daemon = connected_daemon(&server, &api, &host).await;
    // A daemon that answers: the dirs come back and are recorded.
    let request = add_dir_in_background(&api, &host, "/srv");
    let dirs = next_dirs(&mut daemon).await;
    assert_eq!(dirs.path, "/srv");
    daemon.send_frame(dirs_result(dirs.request_id, &["/tmp", "/srv"], None)).await;
    let (status, body) = request.await.expect("request");
    assert_eq!((status, body["dirs"].clone()), (200, json!(["/tmp", "/srv"])));
    let (_, body) = api.get(&format!("/api/v1/hosts/{host}")).await;
    assert_eq!(body["host"]["dirs"], json!(["/tmp", "/srv"]));
    // A daemon that refuses: 502.
    let request = add_dir_in_background(&api, &host, "/nope");
    let dirs = next_dirs(&mut daemon).await;
    daemon.send_frame(dirs_result(dirs.request_id, &[], Some("no such directory"))).await;
    let (status, body) = request.await.expect("request");
    assert_eq!((status, body["error"]["code"].as_str()), (502, Some("daemon_refused")));
    // A daemon that never answers: 504 after the 10 s dirs timeout.
    let started = std::time::Instant::now();
    let (status, body) = api.post(&format!("/api/v1/hosts/{host}/dirs"), json!({"path": "/late"})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (504, Some("daemon_timeout")));
    assert!(started.elapsed() >= Duration::from_secs(9), "answered before the timeout");
    let late = next_dirs(&mut daemon).await;
    // Its answer after the timeout is the daemon's list all the same: it is
    // recorded (terminals are checked against it), once.
    daemon.send_frame(dirs_result(late.request_id.clone(), &["/tmp", "/srv", "/late"], None)).await;
    ping_pong(&mut daemon).await;
    let (_, body) = api.get(&format!("/api/v1/hosts/{host}")).await;
    assert_eq!(body["host"]["dirs"], json!(["/tmp", "/srv", "/late"]), "the late answer was not recorded");
    daemon.send_frame(dirs_result(late.request_id, &["/again"], None)).await;
    ping_pong(&mut daemon).await;
    let (_, body) = api.get(&format!("/api/v1/hosts/{host}")).await;
    assert_eq!(body["host"]["dirs"], json!(["/tmp", "/srv", "/late"]), "a second late answer was recorded");
}

/// A DirsResult whose dirs could not be stored (not absolute) closes the
/// connection 1008 and leaves the host's dirs as they were, as a hello
/// with such dirs does: REST checks a terminal's dir by prefix against
/// them, and an empty entry would allow every dir.
#[actix_rt::test]
async fn a_dirs_result_with_a_dir_that_is_not_absolute_is_1008() {
    let server = server().await;
    let (api, host) = user_with_host(&server, "ann").await;
    let mut daemon = connected_daemon(&server, &api, &host).await;
    let request = add_dir_in_background(&api, &host, "/srv");
    let dirs = next_dirs(&mut daemon).await;
    daemon.send_frame(dirs_result(dirs.request_id, &["/tmp", ""], None)).await;
    assert_eq!(daemon.expect_close().await, Some(1008));
    let (status, _) = request.await.expect("request");
    assert_ne!(status, 200, "the malformed answer was taken");
    let (_, body) = api.get(&format!("/api/v1/hosts/{host}")).await;
    assert_eq!(body["host"]["dirs"], json!(["/tmp"]));
}

/// `POST /hosts/{host}/dirs {path}` on a task of its own, for the test to
/// play the daemon's side meanwhile.
fn add_dir_in_background(api: &Api, host: &str, path: &str) -> actix_rt::task::JoinHandle<(u16, serde_json::Value)> {
    let api = Api::new(api.base.clone(), api.token.clone());
    let (host, path) = (host.to_string(), path.to_string());
    actix_rt::spawn(async move { api.post(&format!("/api/v1/hosts/{host}/dirs"), json!({"path": path})).await })
}

/// The daemon's next frame, which must be a Dirs request.
async fn next_dirs(daemon: &mut Socket) -> tether::proto::v1::Dirs {
    match daemon.next_server_frame().await {
        server_frame::Frame::Dirs(d) => d,
        other => panic!("expected Dirs, got {other:?}"),
    }
}

/// The daemon's DirsResult for `request_id`.
fn dirs_result(request_id: String, dirs: &[&str], error: Option<&str>) -> daemon_frame::Frame {
    daemon_frame::Frame::DirsResult(tether::proto::v1::DirsResult {
        request_id,
        dirs: dirs.iter().map(|d| d.to_string()).collect(),
        error: error.map(str::to_string),
    })
}

/// Handled in order: once the Pong is back, every frame sent before the
/// Ping was applied (docs/PROTOCOL.md, "What the server enforces").
async fn ping_pong(daemon: &mut Socket) {
    daemon.send_frame(daemon_frame::Frame::Ping(Default::default())).await;
    match daemon.next_server_frame().await {
        server_frame::Frame::Pong(_) => {}
        other => panic!("expected Pong, got {other:?}"),
    }
}

/// A daemon answer counts only for the waiting request its id names, and
/// only if it is of that request's kind: a DirsResult for no request (or
/// for a limits refresh) leaves the host's dirs as they were, and an
/// answer of the wrong kind is 502 daemon_refused, logged, not a 500.
#[actix_rt::test]
async fn answers_with_a_wrong_id_or_kind_change_nothing_and_are_502() {
    let server = server().await;
    let (api, host) = user_with_host(&server, "ann").await;
    let mut daemon = connected_daemon(&server, &api, &host).await;
    let dirs_now = |api: &Api| {
        let path = format!("/api/v1/hosts/{host}");
        let api = Api::new(api.base.clone(), api.token.clone());
        async move { api.get(&path).await.1["host"]["dirs"].clone() }
    };
    let forged = |request_id: String| dirs_result(request_id, &["/forged"], None);
    let ask = |path: &'static str, body: serde_json::Value| {
        let api = Api::new(api.base.clone(), api.token.clone());
        let host = host.clone();
        actix_rt::spawn(async move { api.post(&format!("/api/v1/hosts/{host}/{path}"), body).await })
    };
    assert_eq!(dirs_now(&api).await, json!(["/tmp"]));

    // A DirsResult that answers nothing: no request waits for that id.
    daemon.send_frame(forged(uuid::Uuid::new_v4().to_string())).await;
    daemon.send_frame(forged(String::new())).await;
    ping_pong(&mut daemon).await;
    assert_eq!(dirs_now(&api).await, json!(["/tmp"]), "an unmatched DirsResult changed the dirs");

    // A DirsResult answering a limits refresh.
    let request = ask("limits/refresh", json!({}));
    let limits = match daemon.next_server_frame().await {
        server_frame::Frame::LimitsRefresh(l) => l,
        other => panic!("expected LimitsRefresh, got {other:?}"),
    };
    daemon.send_frame(forged(limits.request_id.clone())).await;
    let (status, body) = request.await.expect("request");
    assert_eq!((status, body["error"]["code"].as_str()), (502, Some("daemon_refused")), "{body}");
    assert_eq!(dirs_now(&api).await, json!(["/tmp"]), "a DirsResult for a limits refresh changed the dirs");
    // The request is over: its right answer, late, changes nothing either.
    daemon
        .send_frame(daemon_frame::Frame::LimitsResult(tether::proto::v1::LimitsResult {
            request_id: limits.request_id,
            limits_json: "{}".into(),
            error: None,
        }))
        .await;
    ping_pong(&mut daemon).await;

    // A LimitsResult answering a dirs request: the request ends 502 and the
    // DirsResult that follows with the same id is not recorded.
    let request = ask("dirs", json!({"path": "/srv"}));
    let dirs = next_dirs(&mut daemon).await;
    daemon
        .send_frame(daemon_frame::Frame::LimitsResult(tether::proto::v1::LimitsResult {
            request_id: dirs.request_id.clone(),
            limits_json: "{}".into(),
            error: None,
        }))
        .await;
    let (status, body) = request.await.expect("request");
    assert_eq!((status, body["error"]["code"].as_str()), (502, Some("daemon_refused")), "{body}");
    daemon.send_frame(forged(dirs.request_id)).await;
    ping_pong(&mut daemon).await;
    assert_eq!(dirs_now(&api).await, json!(["/tmp"]), "a DirsResult after its request ended changed the dirs");

    // A CredentialsResult answering a dirs request.
    let request = ask("dirs", json!({"path": "/srv"}));
    let dirs = next_dirs(&mut daemon).await;
    daemon
        .send_frame(daemon_frame::Frame::CredentialsResult(tether::proto::v1::CredentialsResult {
            request_id: dirs.request_id,
            credentials_json: Default::default(),
            error: Some("no credentials file".into()),
        }))
        .await;
    let (status, body) = request.await.expect("request");
    assert_eq!((status, body["error"]["code"].as_str()), (502, Some("daemon_refused")), "{body}");

    // The connection still answers: a right answer is recorded.
    let request = ask("dirs", json!({"path": "/srv"}));
    let dirs = next_dirs(&mut daemon).await;
    daemon.send_frame(dirs_result(dirs.request_id, &["/tmp", "/srv"], None)).await;
    let (status, body) = request.await.expect("request");
    assert_eq!((status, body["dirs"].clone()), (200, json!(["/tmp", "/srv"])));
    assert_eq!(dirs_now(&api).await, json!(["/tmp", "/srv"]));
    let log = server.log();
    assert_eq!(log.matches("tether_daemon_answer_wrong_kind").count(), 3, "each wrong kind is logged:\n{log}");
    assert!(!log.contains("tether_daemon_answer_mismatch"), "{log}");
}

#[actix_rt::test]
async fn the_per_address_cap_is_4429_for_daemons_and_viewers() {
    let server = TetherServer::start(&[("TETHER_HTTP__WS_PER_ADDRESS", "2")], &[]).await;
    let (api, host) = user_with_host(&server, "ann").await;
    let (_, body) = api.post("/api/v1/terminals", json!({"hostId": host})).await;
    let terminal = body["terminal"]["id"].as_str().expect("id").to_string();
    let _daemon = connected_daemon(&server, &api, &host).await;
    let mut viewer = Socket::connect(&viewer_url(&server, &terminal), Some(&api.token), &["tether.v1"]).await;
    assert!(matches!(viewer.next().await, Event::Text(_)), "the second socket is served");
    let mut third = Socket::connect(&viewer_url(&server, &terminal), Some(&api.token), &["tether.v1"]).await;
    assert_eq!(third.expect_close().await, Some(4429));
    let mut fourth = Socket::connect(&daemon_url(&server), Some(&api.token), PROTOCOL).await;
    assert_eq!(fourth.expect_close().await, Some(4429));
    // A slot comes back when a socket closes.
    viewer.close().await;
    let _ = viewer.expect_close().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut again = Socket::connect(&viewer_url(&server, &terminal), Some(&api.token), &["tether.v1"]).await;
        match again.next().await {
            Event::Text(_) => break,
            Event::Close(Some(4429)) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => panic!("expected a served socket, got {other:?}"),
        }
    }
}

#[actix_rt::test]
async fn draining_closes_daemons_with_4503() {
    let mut server = server().await;
    let (api, host) = user_with_host(&server, "ann").await;
    let mut daemon = connected_daemon(&server, &api, &host).await;
    server.terminate(Duration::from_secs(10));
    assert_eq!(daemon.expect_close().await, Some(4503), "daemons redial at once elsewhere");
}

/// Runs one statement against the server's own database, whichever it is.
async fn exec_sql(server: &TetherServer, postgres_sql: &str, sqlite_sql: &str) {
    match server.database_url() {
        Some(url) => {
            let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.expect("connect");
            actix_rt::spawn(conn);
            client.batch_execute(postgres_sql).await.expect("sql");
        }
        None => {
            let db = rusqlite::Connection::open(server.scratch_dir().join("tether.db")).expect("open");
            db.execute_batch(sqlite_sql).expect("sql");
        }
    }
}

#[actix_rt::test]
async fn a_host_assigned_to_another_cell_is_4409() {
    let server = TetherServer::start(&[("TETHER_CELL__ID", "cell-a")], &[]).await;
    let (api, host) = user_with_host(&server, "ann").await;
    exec_sql(
        &server,
        &format!(
            "INSERT INTO relay_assignments (host_id, cell_id, epoch) VALUES ('{host}', 'cell-b', 1); \
             INSERT INTO relay_cells (cell_id, url) VALUES ('cell-b', 'https://cell-b.example:8443')"
        ),
        &format!(
            "INSERT INTO relay_assignments (host_id, cell_id, epoch, updated_at) VALUES ('{host}', 'cell-b', 1, 0); \
             INSERT INTO relay_cells (cell_id, url) VALUES ('cell-b', 'https://cell-b.example:8443')"
        ),
    )
    .await;
    let mut sock = Socket::connect(&daemon_url(&server), Some(&api.token), PROTOCOL).await;
    sock.send_frame(hello(&host)).await;
    assert_eq!(sock.expect_close().await, Some(4409));
    assert_eq!(sock.close_reason(), Some("wrong cell: https://cell-b.example:8443"), "the close names where to dial");
    let (_, body) = api.get(&format!("/api/v1/hosts/{host}")).await;
    assert_eq!(body["host"]["state"], "offline", "a refused hello changes nothing");
    // Placed on this cell: admitted.
    let update = format!("UPDATE relay_assignments SET cell_id = 'cell-a' WHERE host_id = '{host}'");
    exec_sql(&server, &update, &update).await;
    connected_daemon(&server, &api, &host).await;
}

/// A daemon token bound to its host brings the host's row with the
/// token's lookup at the upgrade, and the hello decides on it while it is
/// fresh (`cell::admission::PREFETCH_FRESH`, 2 s): an assignment written
/// before the upgrade is seen, and so is one written between the upgrade
/// and a hello that came later than that.
#[actix_rt::test]
async fn a_bound_daemon_tokens_hello_sees_the_assignment_as_it_is() {
    let server =
        TetherServer::start(&[("TETHER_CELL__ID", "cell-a"), ("TETHER_DAEMON__HELLO_TIMEOUT_MS", "10000")], &[]).await;
    let api = Api::new(server.url(), create_token(&server, "ann"));
    let (status, made) = api.post("/api/v1/tokens", json!({"scope": "daemon"})).await;
    assert_eq!(status, 201, "{made}");
    let daemon = Api::new(server.url(), made["secret"].as_str().expect("secret").to_string());
    let (status, body) = daemon.post("/api/v1/hosts", json!({"hostname": "bound-box"})).await;
    assert_eq!(status, 201, "{body}");
    let host = body["host"]["id"].as_str().expect("host id").to_string();
    let assign = |cell: &str| {
        format!(
            "INSERT INTO relay_cells (cell_id, url) VALUES ('{cell}', 'https://{cell}.example') ON CONFLICT DO NOTHING; \
             DELETE FROM relay_assignments WHERE host_id = '{host}'; \
             INSERT INTO relay_assignments (host_id, cell_id, epoch, updated_at) VALUES ('{host}', '{cell}', 1, now())"
        )
    };
    let assign_sqlite = |cell: &str| assign(cell).replace("now()", "0");

    // Placed elsewhere before the upgrade: the row the lookup brought says so.
    exec_sql(&server, &assign("cell-b"), &assign_sqlite("cell-b")).await;
    let mut sock = Socket::connect(&daemon_url(&server), Some(&daemon.token), PROTOCOL).await;
    sock.send_frame(hello(&host)).await;
    assert_eq!(sock.expect_close().await, Some(4409));
    assert_eq!(sock.close_reason(), Some("wrong cell: https://cell-b.example"));

    // Placed here at the upgrade, elsewhere by the time of a late hello:
    // the hello reads the row again.
    exec_sql(&server, &assign("cell-a"), &assign_sqlite("cell-a")).await;
    let mut sock = Socket::connect(&daemon_url(&server), Some(&daemon.token), PROTOCOL).await;
    exec_sql(&server, &assign("cell-c"), &assign_sqlite("cell-c")).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    sock.send_frame(hello(&host)).await;
    assert_eq!(sock.expect_close().await, Some(4409));
    assert_eq!(sock.close_reason(), Some("wrong cell: https://cell-c.example"));

    // Placed here: admitted.
    exec_sql(&server, &assign("cell-a"), &assign_sqlite("cell-a")).await;
    let _connected = connected_daemon(&server, &daemon, &host).await;
    let (_, body) = api.get(&format!("/api/v1/hosts/{host}")).await;
    assert_eq!(body["host"]["state"], "online");
}

#[actix_rt::test]
async fn a_database_failure_is_1011_for_viewers_and_503_for_rest() {
    let url = support::pg_database().await;
    let server = TetherServer::start(&[("TETHER_DATABASE__URL", &url), ("TETHER_DATABASE__POOL_SIZE", "2")], &[]).await;
    let (api, host) = user_with_host(&server, "ann").await;
    let (_, body) = api.post("/api/v1/terminals", json!({"hostId": host})).await;
    let terminal = body["terminal"]["id"].as_str().expect("id").to_string();
    // Take the database away: refuse new connections and end the open ones.
    let database = url.rsplit('/').next().expect("database name").to_string();
    let admin_url = url.replace(&format!("/{database}"), "/postgres");
    let (admin, conn) = tokio_postgres::connect(&admin_url, tokio_postgres::NoTls).await.expect("connect");
    actix_rt::spawn(conn);
    admin.batch_execute(&format!("ALTER DATABASE {database} ALLOW_CONNECTIONS false")).await.expect("alter");
    admin
        .execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", &[&database])
        .await
        .expect("terminate");
    let mut viewer = Socket::connect(&viewer_url(&server, &terminal), Some(&api.token), &["tether.v1"]).await;
    assert_eq!(viewer.expect_close().await, Some(1011));
    let (status, body) = api.get("/api/v1/hosts").await;
    assert!(status == 503 || status == 500, "{status} {body}");
    assert!(body["error"]["code"].is_string(), "{body}");
    let (status, _) = Api::new(server.url(), "").get("/readyz").await;
    assert_eq!(status, 503, "not ready without its database");
    admin.batch_execute(&format!("ALTER DATABASE {database} ALLOW_CONNECTIONS true")).await.expect("alter");
}

#[actix_rt::test]
async fn requests_a_daemon_cannot_answer_are_502_unsupported() {
    let server = server().await;
    let (api, host) = user_with_host(&server, "ann").await;
    let mut sock = Socket::connect(&daemon_url(&server), Some(&api.token), PROTOCOL).await;
    let mut frame = hello(&host);
    if let daemon_frame::Frame::Hello(h) = &mut frame {
        h.capabilities = None; // an old daemon that can do none of them
    }
    sock.send_frame(frame).await;
    assert!(matches!(sock.next_server_frame().await, server_frame::Frame::HelloAck(_)));
    for path in ["dirs", "limits/refresh", "credentials/refresh"] {
        let body = if path == "dirs" { json!({"path": "/tmp"}) } else { json!({}) };
        let (status, body) = api.post(&format!("/api/v1/hosts/{host}/{path}"), body).await;
        let expected = if path == "credentials/refresh" { "encryption_not_configured" } else { "daemon_unsupported" };
        let expected_status = if path == "credentials/refresh" { 409 } else { 502 };
        assert_eq!((status, body["error"]["code"].as_str()), (expected_status, Some(expected)), "{path}");
    }
    // Nothing was sent to the daemon.
    assert!(sock.next_within(Duration::from_millis(300)).await.is_none());
}

/// The close code a viewer socket ends with, skipping what comes before.
async fn close_code(sock: &mut Socket) -> Option<u16> {
    loop {
        if let Event::Close(code) = sock.next().await {
            return code;
        }
    }
}

/// A terminal takes `viewer.max_per_terminal` viewers; one more is closed
/// 4429 and the others keep theirs; a viewer that leaves frees its place.
#[actix_rt::test]
async fn viewers_past_the_terminal_cap_are_4429() {
    let server = TetherServer::start(&[("TETHER_VIEWER__MAX_PER_TERMINAL", "2")], &[]).await;
    let (api, host) = user_with_host(&server, "ann").await;
    let mut daemon = connected_daemon(&server, &api, &host).await;
    let (_, body) = api.post("/api/v1/terminals", json!({"hostId": host, "argv": ["sh"]})).await;
    let terminal = body["terminal"]["id"].as_str().expect("id").to_string();
    assert!(matches!(daemon.next_server_frame().await, server_frame::Frame::Spawn(_)));
    let url = viewer_url(&server, &terminal);
    let viewer = || Socket::connect(&url, Some(&api.token), &["tether.v1"]);
    let mut first = viewer().await;
    let mut second = viewer().await;
    for sock in [&mut first, &mut second] {
        assert!(matches!(sock.next().await, Event::Text(_)), "a viewer within the cap is served");
    }
    let mut third = viewer().await;
    assert_eq!(close_code(&mut third).await, Some(4429));
    assert!(first.next_within(Duration::from_millis(300)).await.is_none_or(|e| !matches!(e, Event::Close(_))));
    second.close().await;
    let _ = close_code(&mut second).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut again = viewer().await;
        match again.next_within(Duration::from_millis(500)).await {
            Some(Event::Close(Some(4429))) if tokio::time::Instant::now() < deadline => {}
            Some(Event::Close(code)) => panic!("the freed place was not given: {code:?}"),
            _ => break,
        }
    }
}

/// A daemon connection holds at most `daemon.max_pending_requests`
/// requests waiting for its answers; one more is refused 429 at once and
/// never reaches the daemon, and answering frees the places.
#[actix_rt::test]
async fn requests_past_the_pending_cap_are_429() {
    let server = TetherServer::start(&[("TETHER_DAEMON__MAX_PENDING_REQUESTS", "2")], &[]).await;
    let (api, host) = user_with_host(&server, "ann").await;
    let mut daemon = connected_daemon(&server, &api, &host).await;
    let dirs = |path: &'static str| {
        let api = Api::new(api.base.clone(), api.token.clone());
        let host = host.clone();
        actix_rt::spawn(async move { api.post(&format!("/api/v1/hosts/{host}/dirs"), json!({"path": path})).await })
    };
    let waiting = [dirs("/a"), dirs("/b")];
    let mut asked = Vec::new();
    for _ in 0..2 {
        match daemon.next_server_frame().await {
            server_frame::Frame::Dirs(d) => asked.push(d),
            other => panic!("expected Dirs, got {other:?}"),
        }
    }
    let (status, body) = api.post(&format!("/api/v1/hosts/{host}/dirs"), json!({"path": "/c"})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (429, Some("too_many_requests")), "{body}");
    assert!(daemon.next_within(Duration::from_millis(300)).await.is_none(), "the refused request reached the daemon");
    for d in asked {
        daemon.send_frame(dirs_result(d.request_id, &[&d.path], None)).await;
    }
    for request in waiting {
        assert_eq!(request.await.expect("request").0, 200);
    }
    let again = dirs("/d");
    match daemon.next_server_frame().await {
        server_frame::Frame::Dirs(d) => assert_eq!(d.path, "/d"),
        other => panic!("expected Dirs, got {other:?}"),
    }
    drop(again);
}

/// A write lock on the server's database, held by the test: the server's
/// writes wait behind it until it is dropped.
enum WriteLock {
    Postgres(tokio_postgres::Client),
    Sqlite(rusqlite::Connection),
}

impl WriteLock {
    async fn take(server: &TetherServer) -> WriteLock {
        WriteLock::take_table(server, "leases").await
    }

    /// Like `take`, but on PostgreSQL the lock is on `table` (its reads
    /// that lock rows wait too), and the server's other writes go on.
    async fn take_table(server: &TetherServer, table: &str) -> WriteLock {
        match server.database_url() {
            Some(url) => {
                let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.expect("connect");
                actix_rt::spawn(conn);
                client.batch_execute(&format!("BEGIN; LOCK TABLE {table} IN EXCLUSIVE MODE")).await.expect("lock");
                WriteLock::Postgres(client)
            }
            None => {
                let db = rusqlite::Connection::open(server.scratch_dir().join("tether.db")).expect("open");
                db.execute_batch("BEGIN IMMEDIATE").expect("lock");
                WriteLock::Sqlite(db)
            }
        }
    }

    /// Like `take`, but on PostgreSQL only the lease row of `host_id` is
    /// locked, so the server's other writes go on; SQLite has no row locks.
    async fn take_lease(server: &TetherServer, host_id: &str) -> WriteLock {
        let Some(url) = server.database_url() else { return WriteLock::take(server).await };
        let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.expect("connect");
        actix_rt::spawn(conn);
        client.batch_execute("BEGIN").await.expect("begin");
        let locked = client
            .execute("SELECT 1 FROM leases WHERE key = $1 FOR UPDATE", &[&format!("host:{host_id}")])
            .await
            .expect("lock the lease row");
        assert_eq!(locked, 1, "the host holds a lease");
        WriteLock::Postgres(client)
    }

    /// Waits until one of the server's statements waits for this lock
    /// (PostgreSQL), or gives an ended connection's release time to reach
    /// it (SQLite, whose writers wait inside the store's busy handler).
    async fn until_waited_on(&self) {
        match self {
            WriteLock::Postgres(client) => {
                for _ in 0..200 {
                    let waiting: i64 = client
                        .query_one(
                            "SELECT count(*) FROM pg_stat_activity \
                             WHERE wait_event_type = 'Lock' AND datname = current_database()",
                            &[],
                        )
                        .await
                        .expect("pg_stat_activity")
                        .get(0);
                    if waiting > 0 {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
                panic!("no statement of the server waited for the lock");
            }
            WriteLock::Sqlite(_) => tokio::time::sleep(Duration::from_millis(300)).await,
        }
    }

    /// Deletes every host lease inside the locked transaction: once it is
    /// released, the server finds them gone (lapsed and swept).
    async fn delete_host_leases(&self) {
        const SQL: &str = "DELETE FROM leases WHERE key LIKE 'host:%'";
        match self {
            WriteLock::Postgres(client) => client.batch_execute(SQL).await.expect("delete leases"),
            WriteLock::Sqlite(db) => db.execute_batch(SQL).expect("delete leases"),
        }
    }

    async fn release(self) {
        match self {
            WriteLock::Postgres(client) => client.batch_execute("COMMIT").await.expect("commit"),
            WriteLock::Sqlite(db) => db.execute_batch("COMMIT").expect("commit"),
        }
    }
}

/// Connections that ended before a SIGTERM release their leases before the
/// process exits: one host's release is held up by a lock on its lease row
/// and a second host's queues behind it when the server is told to stop.
/// Both hosts read offline once the process is gone; exiting with the
/// second release still queued would leave its host online until the lease
/// lapsed. PostgreSQL is the backend that tells: there only the first
/// host's row is locked and the drain's own writes go through, while on
/// SQLite the whole database is locked and the drain waits behind it anyway.
#[actix_rt::test]
async fn releases_queued_before_a_sigterm_are_done_before_the_exit() {
    let mut server = server().await;
    let api = Api::new(server.url(), create_token(&server, "ann"));
    let mut hosts = Vec::new();
    for name in ["first", "second"] {
        let (status, body) = api.post("/api/v1/hosts", json!({"hostname": name})).await;
        assert_eq!(status, 201, "{body}");
        hosts.push(body["host"]["id"].as_str().expect("host id").to_string());
    }
    let first = connected_daemon(&server, &api, &hosts[0]).await;
    let second = connected_daemon(&server, &api, &hosts[1]).await;
    assert_eq!(online_hosts(&server).await, 2);

    let lock = WriteLock::take_lease(&server, &hosts[0]).await;
    drop(first);
    lock.until_waited_on().await;
    drop(second);
    until_no_daemon_connections(&api).await;

    terminate_unlocking_later(&mut server, lock).await;
    assert_eq!(online_hosts(&server).await, 0, "both hosts' leases were released before the exit");
}

/// Audit events recorded just before a SIGTERM are written before the
/// exit: a host is registered while another session locks the audit table,
/// so its `host_registered` event waits in the audit writer when the server
/// is told to stop, and the lock goes 1.5 s later, well after the drain's
/// own work. Exiting without waiting rolled the event's batch back with
/// the connection. PostgreSQL is the backend that tells; on SQLite the
/// lock is the whole database, so it is taken after the registration and
/// the test guards against regressions only.
#[actix_rt::test]
async fn audit_events_recorded_before_a_sigterm_are_written_before_the_exit() {
    let mut server = server().await;
    let api = Api::new(server.url(), create_token(&server, "ann"));
    let postgres = server.database_url().is_some();
    let early = if postgres { Some(WriteLock::take_table(&server, "audit_events").await) } else { None };
    let (status, body) = api.post("/api/v1/hosts", json!({"hostname": "audited"})).await;
    assert_eq!(status, 201, "{body}");
    let lock = match early {
        Some(lock) => {
            lock.until_waited_on().await;
            lock
        }
        None => WriteLock::take_table(&server, "audit_events").await,
    };
    terminate_unlocking_later(&mut server, lock).await;
    let written = count_rows(&server, "SELECT count(*) FROM audit_events WHERE action = 'host_registered'").await;
    assert_eq!(written, 1, "the registration's audit event was written before the exit");
}

/// Sends the server a SIGTERM and releases `lock` 1.5 s later, well after
/// the drain's own work (a few hundred milliseconds); the drain must end
/// by itself once the lock is gone.
async fn terminate_unlocking_later(server: &mut TetherServer, lock: WriteLock) {
    let unlock = actix_rt::spawn(async move {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        lock.release().await;
    });
    let status = server.terminate_async(Duration::from_secs(15)).await;
    assert!(status.is_some_and(|s| s.success()), "the drain ended by itself: {status:?}");
    unlock.await.expect("unlock");
}

/// Hosts whose row reads online, straight from the server's database (not
/// through the server, whose store calls the caller is counting).
async fn online_hosts(server: &TetherServer) -> i64 {
    count_rows(server, "SELECT count(*) FROM hosts WHERE state = 'online'").await
}

/// The count a `SELECT count(*)` reads straight from the server's database.
async fn count_rows(server: &TetherServer, sql: &str) -> i64 {
    match server.database_url() {
        Some(url) => {
            let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.expect("connect");
            actix_rt::spawn(conn);
            client.query_one(sql, &[]).await.expect("count").get(0)
        }
        None => rusqlite::Connection::open(server.scratch_dir().join("tether.db"))
            .expect("open")
            .query_row(sql, [], |r| r.get(0))
            .expect("count"),
    }
}

/// A value of the server's `/metrics` whose line starts with `prefix`.
async fn metric_value(api: &Api, prefix: &str) -> f64 {
    let (_, body) = api.get_bytes("/metrics").await;
    let text = String::from_utf8_lossy(&body);
    let line = text.lines().find(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("no {prefix} in {text}"));
    line.rsplit(' ').next().and_then(|v| v.parse().ok()).expect("a number")
}

/// Waits until the server counts no daemon connection.
async fn until_no_daemon_connections(api: &Api) {
    for _ in 0..200 {
        if metric_value(api, "tether_daemon_connections ").await == 0.0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("daemon connections still open: {}", metric_value(api, "tether_daemon_connections ").await);
}

/// A mass disconnect (a network cut between the daemons and the instance)
/// releases the ended connections' leases in batches, not a statement per
/// host: with the database's writes held up while 60 daemons drop at
/// once, their releases queue and go out together once it is free, and
/// every host reads offline after.
#[actix_rt::test]
async fn a_mass_disconnect_releases_the_leases_in_batches() {
    mass_disconnect(Leases::Held).await;
}

/// The same when the leases are already gone by the time the releases run
/// (they lapsed and were swept): the hosts are marked offline in one
/// statement per batch as well, not a read and then a write per host.
#[actix_rt::test]
async fn a_mass_disconnect_of_hosts_whose_leases_are_gone_marks_them_offline_in_batches() {
    mass_disconnect(Leases::Gone).await;
}

/// A wave of daemon upgrades (a reconnect storm) looks its tokens up in
/// a statement or two, not one each. The token lookups are held up (on
/// PostgreSQL by a lock on the token table; on SQLite by the database's
/// write lock, which the first lookup's stamp of a never-used token waits
/// for) while 60 sockets upgrade with one token at once; once the lock is
/// gone every upgrade is answered, for a handful of store calls in all.
#[actix_rt::test]
async fn a_wave_of_upgrades_looks_its_tokens_up_together() {
    const SOCKETS: usize = 60;
    let server = server().await;
    let api = Api::new(server.url(), create_token(&server, "ann"));
    let token = create_token(&server, "ann");
    let calls = metric_value(&api, "tether_store_queries_total{").await;
    let lock = WriteLock::take_table(&server, "api_tokens").await;
    let upgrades: Vec<_> = (0..SOCKETS)
        .map(|_| {
            let (url, token) = (daemon_url(&server), token.clone());
            actix_rt::spawn(async move { Socket::connect(&url, Some(&token), &["tether.daemon.v1"]).await })
        })
        .collect();
    lock.until_waited_on().await;
    // Time for the rest of the upgrades to reach the server and queue.
    tokio::time::sleep(Duration::from_millis(500)).await;
    lock.release().await;
    let mut sockets = Vec::new();
    for upgrade in upgrades {
        sockets.push(upgrade.await.expect("upgrade"));
    }
    let calls = metric_value(&api, "tether_store_queries_total{").await - calls;
    // A lookup per upgrade would be 60 and more; the batches, a renew tick
    // and the instance's once-a-second polls are a handful.
    assert!(calls < (SOCKETS / 3) as f64, "{calls} store calls to look up the tokens of {SOCKETS} upgrades");
    // Each was let in: the socket waits for its hello, not closed 4401.
    for socket in &mut sockets {
        socket.send_frame(hello("not-a-host-id")).await;
        assert_eq!(socket.expect_close().await, Some(4403), "refused at the hello, not at the token");
    }
}

enum Leases {
    Held,
    Gone,
}

async fn mass_disconnect(leases: Leases) {
    const HOSTS: usize = 60;
    let server = server().await;
    let api = Api::new(server.url(), create_token(&server, "ann"));
    let mut daemons = Vec::new();
    for i in 0..HOSTS {
        let (status, body) = api.post("/api/v1/hosts", json!({"hostname": format!("box-{i}")})).await;
        assert_eq!(status, 201, "{body}");
        let host = body["host"]["id"].as_str().expect("host id").to_string();
        daemons.push(connected_daemon(&server, &api, &host).await);
    }
    assert_eq!(online_hosts(&server).await, HOSTS as i64);
    let lock = WriteLock::take(&server).await;
    if let Leases::Gone = leases {
        lock.delete_host_leases().await;
    }
    let calls = metric_value(&api, "tether_store_queries_total{").await;
    drop(daemons);
    until_no_daemon_connections(&api).await;
    // Time for the ended connections to queue their releases behind the lock.
    tokio::time::sleep(Duration::from_millis(500)).await;
    lock.release().await;
    let mut online = HOSTS as i64;
    for _ in 0..200 {
        online = online_hosts(&server).await;
        if online == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(online, 0, "every host reads offline once its lease is released");
    let calls = metric_value(&api, "tether_store_queries_total{").await - calls;
    // A statement per host would be 60 and more; the batches, a renew tick
    // and the instance's once-a-second polls are a handful.
    assert!(calls < (HOSTS / 3) as f64, "{calls} store calls to release {HOSTS} hosts' leases");
}
