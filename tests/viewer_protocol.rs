//! The viewer protocol (docs/PROTOCOL.md, "Viewer protocol") against a real `tether serve`, with a
//! scripted daemon that controls offsets exactly: snapshot-then-live with
//! no gap and no duplicate, a second viewer mid-stream, resume, gaps, the
//! grid arbiter, slow readers, bad input and exits.

mod support;

use std::time::Duration;

use bytes::Bytes;
use serde_json::{json, Value};
use support::client::{create_token, daemon_url, hello, viewer_url, Api, Event, Socket};
use support::TetherServer;
use tether::proto::v1::{daemon_frame, server_frame};
use tether::viewer_protocol::ClientMessage;

/// A server, a user, a host with a scripted daemon and one running terminal.
struct Setup {
    server: TetherServer,
    api: Api,
    daemon: Socket,
    terminal: String,
}

async fn setup(env: &[(&str, &str)]) -> Setup {
    setup_daemon(env, false).await
}

/// The setup, with a daemon whose hello claims flow control (or not).
async fn setup_daemon(env: &[(&str, &str)], flow_control: bool) -> Setup {
    let server = TetherServer::start(env, &[]).await;
    let api = Api::new(server.url(), create_token(&server, "ann"));
    let (_, body) = api.post("/api/v1/hosts", json!({"hostname": "box"})).await;
    let host = body["host"]["id"].as_str().expect("host").to_string();
    let mut daemon = Socket::connect(&daemon_url(&server), Some(&api.token), &["tether.daemon.v1"]).await;
    let mut frame = hello(&host);
    if let daemon_frame::Frame::Hello(h) = &mut frame {
        h.capabilities.as_mut().expect("capabilities").flow_control = flow_control;
    }
    daemon.send_frame(frame).await;
    assert!(matches!(daemon.next_server_frame().await, server_frame::Frame::HelloAck(_)));
    let (status, body) = api.post("/api/v1/terminals", json!({"hostId": host, "argv": ["sh"]})).await;
    assert_eq!(status, 201);
    let terminal = body["terminal"]["id"].as_str().expect("terminal").to_string();
    assert!(matches!(daemon.next_server_frame().await, server_frame::Frame::Spawn(_)));
    daemon
        .send_frame(daemon_frame::Frame::Started(tether::proto::v1::Started { terminal_id: terminal.clone(), pid: 7 }))
        .await;
    api.wait_for(&format!("/api/v1/terminals/{terminal}"), "running", |b| b["terminal"]["state"] == "running").await;
    Setup { server, api, daemon, terminal }
}

impl Setup {
    async fn viewer(&self, query: &str) -> Socket {
        let url = format!("{}{query}", viewer_url(&self.server, &self.terminal));
        Socket::connect(&url, Some(&self.api.token), &["tether.v1"]).await
    }

    async fn output(&mut self, offset: u64, data: &[u8]) {
        self.daemon
            .send_frame(daemon_frame::Frame::Output(tether::proto::v1::Output {
                terminal_id: self.terminal.clone(),
                offset,
                data: Bytes::copy_from_slice(data),
            }))
            .await;
    }

    /// Waits for the daemon's next Attach (skipping other frames) and answers it.
    async fn answer_attach(&mut self, snapshot: &[u8], offset: u64) -> tether::proto::v1::Attach {
        let attach = self.next_attach().await;
        self.daemon
            .send_frame(daemon_frame::Frame::Scrollback(tether::proto::v1::Scrollback {
                terminal_id: self.terminal.clone(),
                attach_id: attach.attach_id.clone(),
                data: Bytes::copy_from_slice(snapshot),
                cols: 80,
                rows: 24,
                offset,
                resumed: false,
            }))
            .await;
        attach
    }

    async fn next_attach(&mut self) -> tether::proto::v1::Attach {
        loop {
            match self.daemon.next_server_frame().await {
                server_frame::Frame::Attach(a) => return a,
                server_frame::Frame::Resize(_) | server_frame::Frame::Detach(_) => continue,
                other => panic!("expected Attach, got {other:?}"),
            }
        }
    }

    async fn next_resize(&mut self) -> (u32, u32) {
        loop {
            match self.daemon.next_server_frame().await {
                server_frame::Frame::Resize(r) => return (r.cols, r.rows),
                server_frame::Frame::Attach(_) => continue,
                other => panic!("expected Resize, got {other:?}"),
            }
        }
    }

    /// Sends `view` from `viewer` every 200 ms (as clients heartbeat) until
    /// the daemon is asked to resize; the two viewers' sockets are separate,
    /// so only a repeated arrival is ordered after the holder's own change.
    async fn arrive_until_resize(&mut self, viewer: &mut Socket, view: &ClientMessage) -> (u32, u32) {
        for _ in 0..50 {
            viewer.send_message(view).await;
            if let Some(Event::Binary(b)) = self.daemon.next_within(Duration::from_millis(200)).await {
                let frame = <tether::proto::v1::ServerFrame as prost::Message>::decode(b.as_ref()).expect("frame");
                if let Some(server_frame::Frame::Resize(r)) = frame.frame {
                    return (r.cols, r.rows);
                }
            }
        }
        panic!("no resize after repeated arrivals");
    }

    /// Two live viewers; the first holds the grid at 100x30.
    async fn holder_and_newcomer(&mut self) -> (Socket, Socket) {
        let mut v1 = self.viewer("").await;
        self.answer_attach(b"S", 0).await;
        until(&mut v1, "live").await;
        let mut v2 = self.viewer("").await;
        self.answer_attach(b"S", 0).await;
        until(&mut v2, "live").await;
        v1.send_message(&ClientMessage::view(100, 30, true, 0, true)).await;
        assert_eq!(self.next_resize().await, (100, 30));
        (v1, v2)
    }

    async fn size(&mut self, cols: u32, rows: u32) {
        self.daemon
            .send_frame(daemon_frame::Frame::Size(tether::proto::v1::Size {
                terminal_id: self.terminal.clone(),
                cols,
                rows,
            }))
            .await;
    }
}

/// Reads a viewer until a JSON message of `kind`; returns it.
async fn until(viewer: &mut Socket, kind: &str) -> Value {
    viewer.until_message(kind).await
}

/// Reads a viewer until a `size` message for the given grid.
async fn size_of(viewer: &mut Socket, cols: u64) -> Value {
    loop {
        let size = until(viewer, "size").await;
        if size["cols"] == cols {
            return size;
        }
    }
}

/// Reads binary frames until `n` bytes arrived (ignoring text).
async fn bytes(viewer: &mut Socket, n: usize) -> Vec<u8> {
    let mut out = Vec::new();
    while out.len() < n {
        match viewer.next().await {
            Event::Binary(b) => out.extend_from_slice(&b),
            Event::Close(code) => panic!("closed ({code:?}) after {} of {n} bytes", out.len()),
            _ => {}
        }
    }
    out
}

/// Asserts nothing but pings arrives for a moment.
async fn quiet(viewer: &mut Socket) {
    loop {
        match viewer.next_within(Duration::from_millis(300)).await {
            None => return,
            Some(Event::Ping) => continue,
            Some(Event::Text(t)) if t.contains("\"size\"") => continue,
            Some(other) => panic!("expected nothing, got {other:?}"),
        }
    }
}

#[actix_rt::test]
async fn replay_then_live_without_gap_or_duplicate() {
    let mut s = setup(&[]).await;
    let mut v1 = s.viewer("").await;
    let status = until(&mut v1, "status").await;
    assert_eq!((status["state"].as_str(), status["host"].as_str()), (Some("running"), Some("online")));
    let attach = s.answer_attach(b"SNAP1", 100).await;
    assert_eq!(attach.terminal_id, s.terminal);
    let replay = until(&mut v1, "replay").await;
    assert_eq!((replay["offset"].as_u64(), replay["cols"].as_u64()), (Some(100), Some(80)));
    assert_eq!(bytes(&mut v1, 5).await, b"SNAP1");
    assert_eq!(until(&mut v1, "live").await["offset"], 100);
    s.output(100, b"abc").await;
    s.output(100, b"abc").await; // a duplicate is dropped
    s.output(101, b"bcdef").await; // an overlap delivers only the new part
    assert_eq!(bytes(&mut v1, 6).await, b"abcdef");

    // A second viewer mid-stream gets its own snapshot at the current offset.
    let mut v2 = s.viewer("").await;
    s.answer_attach(b"SNAP2", 106).await;
    assert_eq!(until(&mut v2, "replay").await["offset"], 106);
    assert_eq!(bytes(&mut v2, 5).await, b"SNAP2");
    assert_eq!(until(&mut v2, "live").await["offset"], 106);
    s.output(106, b"ghi").await;
    assert_eq!(bytes(&mut v1, 3).await, b"ghi");
    assert_eq!(bytes(&mut v2, 3).await, b"ghi");
    quiet(&mut v1).await;
}

/// `ping` is answered with `pong` for any viewer, a read-only one included,
/// and the socket stays open (docs/PROTOCOL.md, "Liveness").
#[actix_rt::test]
async fn a_ping_is_answered_with_a_pong() {
    let mut s = setup(&[]).await;
    let (status, made) = s.api.post("/api/v1/tokens", json!({"scope": "read"})).await;
    assert_eq!(status, 201, "{made}");
    let read = made["secret"].as_str().expect("secret");
    let mut watcher = Socket::connect(&viewer_url(&s.server, &s.terminal), Some(read), &["tether.v1"]).await;
    assert_eq!(until(&mut watcher, "access").await["readOnly"], true);
    s.answer_attach(b"SNAP", 0).await;
    until(&mut watcher, "live").await;
    for _ in 0..2 {
        watcher.send_json(json!({"type": "ping"})).await;
        assert_eq!(until(&mut watcher, "pong").await, json!({"type": "pong"}));
    }
    s.output(0, b"still here").await;
    assert_eq!(bytes(&mut watcher, 10).await, b"still here");
}

#[actix_rt::test]
async fn resume_from_an_offset_the_owner_still_holds() {
    let mut s = setup(&[]).await;
    let mut v1 = s.viewer("").await;
    s.answer_attach(b"S", 0).await;
    until(&mut v1, "live").await;
    s.output(0, b"hello ").await;
    s.output(6, b"world").await;
    assert_eq!(bytes(&mut v1, 11).await, b"hello world");
    // v1 stays; a reconnecting viewer resumes from offset 6 without a repaint.
    let mut v2 = s.viewer("?from=6").await;
    let resume = until(&mut v2, "resume").await;
    assert_eq!(resume["offset"], 6);
    assert_eq!(bytes(&mut v2, 5).await, b"world");
    s.output(11, b"!").await;
    assert_eq!(bytes(&mut v2, 1).await, b"!");
    assert_eq!(bytes(&mut v1, 1).await, b"!");
    // Bytes the owner no longer holds: the daemon is asked to resume instead.
    let _v3 = s.viewer("?from=999999").await;
    let attach = s.next_attach().await;
    assert_eq!(attach.resume_from, Some(999_999));
}

/// A daemon's stream is checked, not trusted: a resume for a viewer that
/// asked for none is refused (the viewer is told, and gets no `resume`
/// it never asked for), and a chunk whose end would pass 2^64 bytes is a
/// malformed frame (1008), where offsets used to wrap.
#[actix_rt::test]
async fn a_daemons_unasked_resume_and_wrapping_offsets_are_refused() {
    let mut s = setup(&[]).await;
    let mut v = s.viewer("").await;
    let attach = s.next_attach().await;
    assert_eq!(attach.resume_from, None);
    s.daemon
        .send_frame(daemon_frame::Frame::Scrollback(tether::proto::v1::Scrollback {
            terminal_id: s.terminal.clone(),
            attach_id: attach.attach_id,
            data: Bytes::from_static(b"bytes"),
            cols: 80,
            rows: 24,
            offset: 0,
            resumed: true,
        }))
        .await;
    let error = loop {
        let Event::Text(t) = v.next().await else { continue };
        let m: Value = serde_json::from_str(&t).expect("json");
        assert_ne!(m["type"], "resume", "{m}");
        if m["type"] == "error" {
            break m;
        }
    };
    assert!(error["message"].as_str().is_some_and(|m| m.contains("not asked for")), "{error}");
    s.output(u64::MAX - 2, b"wraps").await;
    assert_eq!(s.daemon.expect_close().await, Some(1008));
}

#[actix_rt::test]
async fn a_gap_in_the_stream_gets_a_fresh_replay() {
    let mut s = setup(&[]).await;
    let mut v1 = s.viewer("").await;
    s.answer_attach(b"S", 10).await;
    until(&mut v1, "live").await;
    s.output(10, b"ok").await;
    assert_eq!(bytes(&mut v1, 2).await, b"ok");
    s.output(50, b"after a gap").await;
    s.answer_attach(b"FRESH", 61).await;
    let replay = until(&mut v1, "replay").await;
    assert_eq!(replay["offset"], 61);
    assert_eq!(bytes(&mut v1, 5).await, b"FRESH");
}

#[actix_rt::test]
async fn input_reaches_the_daemon() {
    let mut s = setup(&[]).await;
    let mut v1 = s.viewer("").await;
    s.answer_attach(b"S", 0).await;
    until(&mut v1, "live").await;
    v1.send_message(&ClientMessage::Input { data: "ls\r".into() }).await;
    v1.send_binary(Bytes::from_static(b"\x03")).await;
    let mut got = Vec::new();
    while got.len() < 2 {
        if let server_frame::Frame::Input(i) = s.daemon.next_server_frame().await {
            got.push(i.data.to_vec());
        }
    }
    assert_eq!(got, vec![b"ls\r".to_vec(), b"\x03".to_vec()]);
    // REST input takes the same path.
    let (status, _) = s.api.post(&format!("/api/v1/terminals/{}/input", s.terminal), json!({"data": "pwd\n"})).await;
    assert_eq!(status, 202);
    loop {
        if let server_frame::Frame::Input(i) = s.daemon.next_server_frame().await {
            assert_eq!(i.data.as_ref(), b"pwd\n");
            break;
        }
    }
    let big = "x".repeat(64 * 1024 + 1);
    let (status, body) = s.api.post(&format!("/api/v1/terminals/{}/input", s.terminal), json!({"data": big})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (413, Some("payload_too_large")));
}

#[actix_rt::test]
async fn grid_holder_in_use_keeps_idle_or_hidden_loses_resize_claims() {
    let mut s = setup(&[]).await;
    let mut v1 = s.viewer("").await;
    s.answer_attach(b"S", 0).await;
    until(&mut v1, "live").await;
    let mut v2 = s.viewer("").await;
    s.answer_attach(b"S", 0).await;
    until(&mut v2, "live").await;

    v1.send_message(&ClientMessage::view(100, 30, true, 0, true)).await;
    assert_eq!(s.next_resize().await, (100, 30));
    s.size(100, 30).await;
    let size = size_of(&mut v1, 100).await;
    assert_eq!((size["cols"].as_u64(), size["yours"].as_bool()), (Some(100), Some(true)));
    let size = size_of(&mut v2, 100).await;
    assert_eq!(size["yours"], false);

    // In use and fresh: the holder keeps the grid.
    v2.send_message(&ClientMessage::view(90, 20, true, 0, true)).await;
    assert!(s.daemon.next_within(Duration::from_millis(300)).await.is_none(), "the holder in use keeps the grid");
    // Idle holder (61 s): the newcomer's next view takes it.
    v1.send_message(&ClientMessage::view(100, 30, true, 61000, true)).await;
    let arrival = ClientMessage::view(90, 20, true, 0, true);
    assert_eq!(s.arrive_until_resize(&mut v2, &arrival).await, (90, 20), "only the idle holder's loss resizes");
    s.size(90, 20).await;
    let size = size_of(&mut v2, 90).await;
    assert_eq!((size["cols"].as_u64(), size["yours"].as_bool()), (Some(90), Some(true)));

    // Hidden holder loses to a visible arrival.
    v2.send_message(&ClientMessage::view(90, 20, false, 0, true)).await;
    let arrival = ClientMessage::view(100, 30, true, 0, true);
    assert_eq!(s.arrive_until_resize(&mut v1, &arrival).await, (100, 30));

    // resize always claims.
    v2.send_message(&ClientMessage::resize(70, 25)).await;
    assert_eq!(s.next_resize().await, (70, 25));
    s.size(70, 25).await;
    let size = size_of(&mut v2, 70).await;
    assert_eq!(size["yours"], true);
    let size = size_of(&mut v1, 70).await;
    assert_eq!(size["yours"], false);
}

#[actix_rt::test]
async fn an_unresponsive_holder_loses_the_grid() {
    let mut s = setup(&[("TETHER_VIEWER__FRESH_MS", "200"), ("TETHER_VIEWER__PING_TIMEOUT_MS", "300")]).await;
    let (v1, mut v2) = s.holder_and_newcomer().await;
    // v1 stops reading (so it never answers the ping); v2 arrives after v1 went stale.
    tokio::time::sleep(Duration::from_millis(400)).await;
    v2.send_message(&ClientMessage::view(60, 20, true, 0, true)).await;
    assert_eq!(s.next_resize().await, (60, 20), "no pong within ping_timeout: the newcomer takes the grid");
    drop(v1);
}

#[actix_rt::test]
async fn a_responsive_stale_holder_keeps_the_grid() {
    let mut s = setup(&[("TETHER_VIEWER__FRESH_MS", "200"), ("TETHER_VIEWER__PING_TIMEOUT_MS", "1500")]).await;
    let (mut v1, mut v2) = s.holder_and_newcomer().await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    v2.send_message(&ClientMessage::view(60, 20, true, 0, true)).await;
    // v1 reads, so it answers the ping with a pong.
    let pinged = loop {
        match v1.next_within(Duration::from_secs(3)).await {
            Some(Event::Ping) => break true,
            Some(_) => continue,
            None => break false,
        }
    };
    assert!(pinged, "the stale holder is pinged");
    match s.daemon.next_within(Duration::from_millis(2500)).await {
        None | Some(Event::Ping) => {}
        Some(Event::Binary(b)) => {
            let frame = <tether::proto::v1::ServerFrame as prost::Message>::decode(b.as_ref()).expect("frame");
            assert!(!matches!(frame.frame, Some(server_frame::Frame::Resize(_))), "the holder answered; no resize");
        }
        Some(other) => panic!("unexpected {other:?}"),
    }
}

#[actix_rt::test]
async fn a_reader_that_stops_is_closed_1008_and_others_get_every_byte() {
    let mut s = setup(&[("TETHER_VIEWER__QUEUE_BYTES", "1048576")]).await;
    let mut slow = s.viewer("").await;
    s.answer_attach(b"S", 0).await;
    until(&mut slow, "live").await;
    let mut healthy = s.viewer("").await;
    s.answer_attach(b"S", 0).await;
    until(&mut healthy, "live").await;

    const CHUNK: usize = 64 * 1024;
    const TOTAL: usize = 50 * 1024 * 1024;
    let reader = actix_rt::spawn(async move {
        let mut expected: u8 = 0;
        let mut got = 0usize;
        while got < TOTAL {
            match healthy.next().await {
                Event::Binary(b) => {
                    for byte in b.iter() {
                        assert_eq!(*byte, expected, "byte {got} out of order");
                        expected = expected.wrapping_add(1);
                        got += 1;
                    }
                }
                Event::Close(code) => panic!("healthy viewer closed ({code:?}) after {got} bytes"),
                _ => {}
            }
        }
        got
    });
    let mut offset = 0u64;
    let mut next: u8 = 0;
    while (offset as usize) < TOTAL {
        let chunk: Vec<u8> = (0..CHUNK)
            .map(|_| {
                let b = next;
                next = next.wrapping_add(1);
                b
            })
            .collect();
        s.output(offset, &chunk).await;
        offset += CHUNK as u64;
    }
    assert_eq!(reader.await.expect("reader"), TOTAL, "the healthy viewer got every byte in order");
    assert_eq!(slow.expect_close().await, Some(1008), "the slow reader is closed 1008");
    let (_, metrics) = s.api.get_bytes("/metrics").await;
    let text = String::from_utf8_lossy(&metrics);
    let line = text.lines().find(|l| l.starts_with("tether_viewer_queue_high_water_bytes")).expect("gauge");
    let high: f64 = line.rsplit(' ').next().and_then(|v| v.parse().ok()).expect("value");
    assert!(high <= 1_048_576.0, "the outbound queue never passed its bound: {high}");
    assert!(high > 0.0);
}

#[actix_rt::test]
async fn bad_viewer_input_closes_with_its_code() {
    let mut s = setup(&[]).await;
    let mut v = s.viewer("").await;
    s.answer_attach(b"S", 0).await;
    until(&mut v, "live").await;
    // Raw JSON: an unknown type is what ClientMessage cannot express.
    v.send_json(json!({"type": "dance"})).await;
    let error = until(&mut v, "error").await;
    assert!(error["message"].as_str().is_some_and(|m| m.contains("bad message")), "{error}");
    assert_eq!(v.expect_close().await, Some(1008));

    let mut v = s.viewer("").await;
    v.send_text("not json").await;
    assert_eq!(v.expect_close().await, Some(1008));

    let mut v = s.viewer("").await;
    v.send_binary(vec![b'x'; 1024 * 1024 + 1]).await;
    assert_eq!(v.expect_close().await, Some(4413));

    // A header that declares more is refused as it arrives, not after
    // the server has held whatever the peer sends behind it.
    let mut v = s.viewer("").await;
    v.send_raw(&support::client::frame_header(true, 2, 1 << 40)).await;
    v.send_raw(&[b'x'; 64 * 1024]).await;
    assert_eq!(v.expect_close().await, Some(4413));

    // Frames that break RFC 6455 get its close codes.
    let mut v = s.viewer("").await;
    v.send_raw(&[0x81, 0x01, b'x']).await; // unmasked
    assert_eq!(v.expect_close().await, Some(1002));
    let mut v = s.viewer("").await;
    v.send_raw(&[0x81, 0x82, 0, 0, 0, 0, 0xff, 0xfe]).await; // text, not UTF-8
    assert_eq!(v.expect_close().await, Some(1007));

    let url = viewer_url(&s.server, "00000000-0000-0000-0000-000000000000");
    let mut v = Socket::connect(&url, Some(&s.api.token), &["tether.v1"]).await;
    assert_eq!(v.expect_close().await, Some(4404));
    let mut v = Socket::connect(&viewer_url(&s.server, &s.terminal), Some("tth_nope"), &["tether.v1"]).await;
    assert_eq!(v.expect_close().await, Some(4401));
    let bob = create_token(&s.server, "bob");
    let mut v = Socket::connect(&viewer_url(&s.server, &s.terminal), Some(&bob), &["tether.v1"]).await;
    assert_eq!(v.expect_close().await, Some(4403));
    // Nothing reached the daemon from any of them.
    loop {
        match s.daemon.next_within(Duration::from_millis(300)).await {
            None | Some(Event::Ping) => break,
            Some(Event::Binary(b)) => {
                let frame = <tether::proto::v1::ServerFrame as prost::Message>::decode(b.as_ref()).expect("frame");
                assert!(!matches!(frame.frame, Some(server_frame::Frame::Input(_))), "no input was forwarded");
            }
            Some(other) => panic!("unexpected {other:?}"),
        }
    }
}

/// A live viewer hears `status exited` and then `exit`; one that comes
/// later gets the status, the final screen and the exit.
#[actix_rt::test]
async fn exit_reaches_viewers_and_later_viewers_get_the_final_screen() {
    let mut s = setup(&[]).await;
    let mut v = s.viewer("").await;
    s.answer_attach(b"S", 0).await;
    until(&mut v, "live").await;
    s.daemon
        .send_frame(daemon_frame::Frame::Snapshot(tether::proto::v1::Snapshot {
            terminal_id: s.terminal.clone(),
            data: Bytes::from_static(b"FINAL SCREEN"),
            cols: 80,
            rows: 24,
        }))
        .await;
    s.daemon
        .send_frame(daemon_frame::Frame::Exit(tether::proto::v1::Exit {
            terminal_id: s.terminal.clone(),
            exit_code: Some(3),
            signal: None,
        }))
        .await;
    // The new state, then the exit, as a viewer that comes later hears it.
    let status = until(&mut v, "status").await;
    assert_eq!((status["state"].as_str(), status["host"].as_str()), (Some("exited"), Some("online")), "{status}");
    assert_eq!(until(&mut v, "exit").await["exitCode"], 3);
    assert_eq!(v.expect_close().await, Some(1000));
    s.api.wait_for(&format!("/api/v1/terminals/{}", s.terminal), "exited", |b| b["terminal"]["exitCode"] == 3).await;
    let mut late = s.viewer("").await;
    let status = until(&mut late, "status").await;
    assert_eq!(status["state"], "exited");
    // The daemon is still connected: the host reads online, as REST has it.
    assert_eq!(status["host"], "online", "{status}");
    assert_eq!(until(&mut late, "size").await["cols"], 80);
    assert_eq!(bytes(&mut late, 12).await, b"FINAL SCREEN");
    assert_eq!(until(&mut late, "exit").await["exitCode"], 3);
}

#[actix_rt::test]
async fn viewers_get_4503_when_the_daemon_goes() {
    let mut s = setup(&[]).await;
    let mut v = s.viewer("").await;
    s.answer_attach(b"S", 0).await;
    until(&mut v, "live").await;
    s.daemon.close().await;
    assert_eq!(v.expect_close().await, Some(4503));
    // Reattaching while the host is offline: told so, and kept waiting.
    let mut again = s.viewer("").await;
    assert_eq!(until(&mut again, "status").await["host"], "offline");
    assert_eq!(until(&mut again, "error").await["message"], "host offline");
}

/// A viewer waiting while its host is away hears once that the terminal
/// ended when the daemon comes back without it (the hello reconciles the
/// row to `exited`): one `status`, the `size`, the `exit`, then a normal
/// close. The status used to come twice.
#[actix_rt::test]
async fn a_terminal_the_returning_daemon_no_longer_runs_ends_once_for_its_viewers() {
    let mut s = setup(&[]).await;
    let path = format!("/api/v1/terminals/{}", s.terminal);
    let (_, body) = s.api.get(&path).await;
    let host = body["terminal"]["hostId"].as_str().expect("host id").to_string();
    s.daemon.close().await;
    s.api.wait_for(&format!("/api/v1/hosts/{host}"), "host offline", |b| b["host"]["state"] == "offline").await;
    let mut v = s.viewer("").await;
    assert_eq!(until(&mut v, "status").await["host"], "offline");
    until(&mut v, "error").await;
    let mut daemon = Socket::connect(&daemon_url(&s.server), Some(&s.api.token), &["tether.daemon.v1"]).await;
    daemon.send_frame(hello(&host)).await;
    assert!(matches!(daemon.next_server_frame().await, server_frame::Frame::HelloAck(_)));
    let mut said = Vec::new();
    let code = loop {
        match v.next().await {
            Event::Text(t) => {
                let m: Value = serde_json::from_str(&t).expect("json");
                said.push(match m["type"].as_str() {
                    Some("status") => format!("status {} {}", m["state"], m["host"]),
                    other => other.unwrap_or("?").to_string(),
                });
            }
            Event::Close(code) => break code,
            _ => {}
        }
    };
    assert_eq!(said, [r#"status "exited" "online""#, "size", "exit"]);
    assert_eq!(code, Some(1000));
    assert_eq!(s.api.get(&path).await.1["terminal"]["state"], "exited");
}

/// Grids are clamped to 1..1000 whatever number a client sends; a value
/// that is not a number is still refused.
#[actix_rt::test]
async fn grid_values_out_of_range_are_clamped() {
    let mut s = setup(&[]).await;
    let mut v = s.viewer("").await;
    s.answer_attach(b"S", 0).await;
    until(&mut v, "live").await;
    // Raw JSON: a negative, a fractional and a non-number grid are what
    // ClientMessage (u16 grids) cannot express.
    v.send_json(json!({"type": "resize", "cols": -1, "rows": 3})).await;
    assert_eq!(s.next_resize().await, (1, 3));
    v.send_json(json!({"type": "resize", "cols": 5000, "rows": 40.7})).await;
    assert_eq!(s.next_resize().await, (1000, 40));
    v.send_json(json!({"type": "resize", "cols": "wide", "rows": 3})).await;
    let error = until(&mut v, "error").await;
    assert!(error["message"].as_str().is_some_and(|m| m.contains("bad message")), "{error}");
    assert_eq!(v.expect_close().await, Some(1008));
}

/// Flow control with a daemon that claims it: the Attach carries the
/// window, Credits follow delivered output, a viewer that stops reading
/// stops the Credits (only for its terminal) until it is closed 1008 after
/// `viewer.slow_ms`, and then the Credits resume.
#[actix_rt::test]
async fn credits_follow_delivery_and_stop_for_a_stalled_viewer() {
    let env = [
        ("TETHER_DAEMON__WINDOW_BYTES", "65536"),
        ("TETHER_VIEWER__QUEUE_BYTES", "262144"),
        ("TETHER_VIEWER__SLOW_MS", "1500"),
    ];
    let mut s = setup_daemon(&env, true).await;
    let mut viewer = s.viewer("").await;
    let attach = s.answer_attach(b"S", 0).await;
    assert_eq!(attach.window, Some(65536), "the Attach carries the window");
    until(&mut viewer, "live").await;
    let (daemon, terminal) = (&mut s.daemon, s.terminal.clone());

    // Sends Output within the current limit, waiting for Credits; returns
    // the offset reached when no Credit came for `quiet`.
    async fn stream(daemon: &mut Socket, terminal: &str, offset: &mut u64, limit: &mut u64, quiet: Duration) {
        loop {
            while *offset < *limit {
                let len = (*limit - *offset).min(16 * 1024);
                daemon
                    .send_frame(daemon_frame::Frame::Output(tether::proto::v1::Output {
                        terminal_id: terminal.to_string(),
                        offset: *offset,
                        data: Bytes::from(vec![b'x'; len as usize]),
                    }))
                    .await;
                *offset += len;
            }
            match daemon.next_within(quiet).await {
                Some(Event::Binary(b)) => {
                    let frame = <tether::proto::v1::ServerFrame as prost::Message>::decode(b.as_ref()).expect("frame");
                    if let Some(server_frame::Frame::Credit(c)) = frame.frame {
                        assert_eq!(c.terminal_id, terminal);
                        assert!(c.until > *limit, "a Credit only ever raises the limit");
                        *limit = c.until;
                    }
                }
                Some(_) => {}
                None => return,
            }
        }
    }

    // A reading viewer: Credits keep coming as its output is delivered.
    let reader = actix_rt::spawn(async move {
        let mut got = 0usize;
        while got < 1024 * 1024 {
            if let Event::Binary(b) = viewer.next().await {
                got += b.len();
            }
        }
        viewer
    });
    let (mut offset, mut limit) = (0u64, 65536u64);
    while offset < 1024 * 1024 {
        let before = offset;
        stream(daemon, &terminal, &mut offset, &mut limit, Duration::from_millis(500)).await;
        assert!(offset > before, "no Credit while the viewer reads (stuck at {offset})");
    }
    let viewer = reader.await.expect("reader");

    // The viewer stops reading: the Credits stop, at most a window past the
    // point where its queue reached the soft bound...
    let stalled_at = {
        stream(daemon, &terminal, &mut offset, &mut limit, Duration::from_millis(700)).await;
        offset
    };
    assert_eq!(stalled_at, limit, "the daemon used all it was given");
    // ...until the viewer is closed 1008 after slow_ms; then they resume.
    let mut viewer = viewer;
    stream(daemon, &terminal, &mut offset, &mut limit, Duration::from_secs(5)).await;
    assert!(offset > stalled_at, "Credits resumed once the stalled viewer was closed");
    assert_eq!(viewer.expect_close().await, Some(1008));
}

#[actix_rt::test]
async fn a_viewers_close_is_answered_with_its_code() {
    let mut s = setup(&[]).await;
    for code in [1000, 4000] {
        let mut v = s.viewer("").await;
        s.answer_attach(b"S", 0).await;
        until(&mut v, "live").await;
        v.close_with(code).await;
        assert_eq!(v.expect_close().await, Some(code), "a close frame answers the viewer's {code}");
    }
}
