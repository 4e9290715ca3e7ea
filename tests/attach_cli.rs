//! `tether attach` against a fake viewer endpoint (actix-web + actix-ws)
//! that plays scripted server sides of the viewer protocol (docs/PROTOCOL.md, "Viewer protocol"), with
//! the local terminal replaced by channels and a byte buffer.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::{dev::ServerHandle, web, App, HttpRequest, HttpResponse, HttpServer};
use actix_ws::{CloseCode, CloseReason, Message, Session};
use bytes::Bytes;
use futures_util::future::LocalBoxFuture;
use futures_util::{stream, FutureExt as _, Stream, StreamExt as _};
use serde_json::Value;
use tether::attach::{self, AttachOptions, AttachOutcome, LocalIo};
use tether::viewer_protocol::{ClientMessage, GridDim, ServerMessage};
use tokio::sync::mpsc;

/// Upper bound for any one attach session or wait in these tests.
const TEST_TIMEOUT: Duration = Duration::from_secs(10);
const TOKEN: &str = "tth_test_token";
const TERMINAL_ID: &str = "0b9f6a7e-2f55-4c1e-9d7b-1c2d3e4f5a6b";
const SNAPSHOT: &[u8] = b"\x1b[m\x1b[H\x1b[J$ echo hi\r\nhi\r\n$ ";

/// What the fake server heard from the client on one connection.
#[derive(Debug, Clone, PartialEq)]
enum Received {
    /// A control message in exactly the shape `ClientMessage` sends.
    Text(ClientMessage),
    /// A text frame that is not (see `heard_text`).
    OtherText(String),
    Binary(Vec<u8>),
    Pong(Vec<u8>),
    Close(Option<u16>),
}

#[derive(Debug, Clone, Default)]
struct Connection {
    terminal_id: String,
    query: String,
    authorization: Option<String>,
    protocols: Option<String>,
    received: Vec<Received>,
    ended: bool,
}

/// The server side of one connection.
type Script = fn(ScriptContext, Session) -> LocalBoxFuture<'static, ()>;

struct ScriptContext {
    /// 0 for the first connection.
    index: usize,
    query: String,
    connections: Arc<Mutex<Vec<Connection>>>,
}

impl ScriptContext {
    /// Waits until the client sent `count` messages. A script must do this
    /// before closing: once actix-ws has sent a Close it stops reading, and
    /// what the client sent would go unrecorded.
    async fn heard(&self, count: usize) {
        let deadline = tokio::time::Instant::now() + TEST_TIMEOUT;
        while self.connections.lock().unwrap()[self.index].received.len() < count {
            assert!(tokio::time::Instant::now() < deadline, "client never sent {count} messages");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

#[derive(Clone)]
struct Shared {
    connections: Arc<Mutex<Vec<Connection>>>,
    script: Script,
}

struct FakeServer {
    url: String,
    connections: Arc<Mutex<Vec<Connection>>>,
    handle: ServerHandle,
}

impl FakeServer {
    async fn start(script: Script) -> Self {
        let shared = Shared { connections: Arc::default(), script };
        let connections = shared.connections.clone();
        let data = web::Data::new(shared);
        let server = HttpServer::new(move || {
            App::new().app_data(data.clone()).route("/ws/v1/terminals/{id}", web::get().to(viewer_endpoint))
        })
        .workers(1)
        .disable_signals()
        .shutdown_timeout(1)
        .bind(("127.0.0.1", 0))
        .expect("bind fake server");
        let addr = server.addrs()[0];
        let server = server.run();
        let handle = server.handle();
        actix_rt::spawn(server);
        FakeServer { url: format!("http://{addr}"), connections, handle }
    }

    fn connections(&self) -> Vec<Connection> {
        self.connections.lock().unwrap().clone()
    }

    /// Polls until `done` holds for the recorded connections.
    async fn wait_for(&self, what: &str, done: impl Fn(&[Connection]) -> bool) -> Vec<Connection> {
        let deadline = tokio::time::Instant::now() + TEST_TIMEOUT;
        loop {
            let connections = self.connections();
            if done(&connections) {
                return connections;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}; server saw {connections:#?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn wait_ended(&self, count: usize) -> Vec<Connection> {
        self.wait_for("connections to end", |c| c.len() == count && c.iter().all(|c| c.ended)).await
    }

    async fn stop(self) {
        self.handle.stop(false).await;
    }
}

async fn viewer_endpoint(
    req: HttpRequest,
    body: web::Payload,
    terminal_id: web::Path<String>,
    shared: web::Data<Shared>,
) -> actix_web::Result<HttpResponse> {
    let (response, session, mut messages) = actix_ws::handle_with_protocols(&req, body, &["tether.v1"])?;
    let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let index = {
        let mut connections = shared.connections.lock().unwrap();
        connections.push(Connection {
            terminal_id: terminal_id.into_inner(),
            query: req.query_string().to_owned(),
            authorization: header("authorization"),
            protocols: header("sec-websocket-protocol"),
            ..Connection::default()
        });
        connections.len() - 1
    };

    let log = shared.connections.clone();
    let record = move |received: Option<Received>| {
        let mut connections = log.lock().unwrap();
        match received {
            Some(received) => connections[index].received.push(received),
            None => connections[index].ended = true,
        }
    };
    let reader_session = session.clone();
    actix_rt::spawn(async move {
        while let Some(Ok(message)) = messages.next().await {
            match message {
                Message::Text(text) => record(Some(heard_text(&text))),
                Message::Binary(data) => record(Some(Received::Binary(data.to_vec()))),
                Message::Pong(data) => record(Some(Received::Pong(data.to_vec()))),
                Message::Close(reason) => {
                    record(Some(Received::Close(reason.as_ref().map(|r| r.code.into()))));
                    // Answer the client's close; fails harmlessly if the
                    // script closed first.
                    let _ = reader_session.clone().close(reason).await;
                    break;
                }
                _ => {}
            }
        }
        record(None);
    });
    let context =
        ScriptContext { index, query: req.query_string().to_owned(), connections: shared.connections.clone() };
    actix_rt::spawn((shared.script)(context, session));
    Ok(response)
}

/// A text frame as heard. Decoding alone would fill in missing fields,
/// clamp grids and drop unknown fields, so it is a control message only if
/// it is exactly what `ClientMessage` serialises to.
fn heard_text(text: &str) -> Received {
    let sent: Option<Value> = serde_json::from_str(text).ok();
    match serde_json::from_str::<ClientMessage>(text) {
        Ok(message) if sent == serde_json::to_value(&message).ok() => Received::Text(message),
        _ => Received::OtherText(text.to_owned()),
    }
}

async fn send_control(session: &mut Session, message: ServerMessage) {
    session.text(message.to_json()).await.expect("send control");
}

/// The first message of every connection, as a real server sends it.
async fn say_access(session: &mut Session, read_only: bool) {
    send_control(session, ServerMessage::Access { read_only }).await;
}

/// What a server says when the terminal's host has no daemon connected.
async fn say_host_offline(session: &mut Session) {
    send_control(session, ServerMessage::Status { state: "running".into(), host: "offline".into() }).await;
    send_control(session, ServerMessage::error("host offline")).await;
}

async fn send_bytes(session: &mut Session, bytes: &'static [u8]) {
    session.binary(Bytes::from_static(bytes)).await.expect("send bytes");
}

async fn close_with(session: Session, code: u16, description: &str) {
    let reason = CloseReason { code: CloseCode::from(code), description: Some(description.to_owned()) };
    session.close(Some(reason)).await.expect("close");
}

/// status, a ping, replay + snapshot + live, live bytes, exit 3.
fn exits_with_3(_: ScriptContext, mut session: Session) -> LocalBoxFuture<'static, ()> {
    async move {
        say_access(&mut session, false).await;
        send_control(&mut session, ServerMessage::Status { state: "running".into(), host: "online".into() }).await;
        session.ping(b"hb").await.expect("ping");
        send_control(&mut session, ServerMessage::Replay { cols: 80, rows: 24, offset: 100 }).await;
        send_bytes(&mut session, SNAPSHOT).await;
        send_control(&mut session, ServerMessage::Live { offset: 100 }).await;
        send_bytes(&mut session, b"hello ").await;
        send_bytes(&mut session, b"world\r\n").await;
        send_control(&mut session, ServerMessage::Exit { exit_code: Some(3) }).await;
    }
    .boxed_local()
}

/// First connection: replay at 1000, 7 live bytes, then 4503. Later ones:
/// resume when asked for exactly offset 1007, otherwise a replay with bytes
/// and an exit code that make the mistake visible in the assertions.
fn moves_once(context: ScriptContext, mut session: Session) -> LocalBoxFuture<'static, ()> {
    async move {
        say_access(&mut session, false).await;
        if context.index == 0 {
            send_control(&mut session, ServerMessage::Replay { cols: 80, rows: 24, offset: 1000 }).await;
            send_bytes(&mut session, b"SNAP").await;
            send_control(&mut session, ServerMessage::Live { offset: 1000 }).await;
            send_bytes(&mut session, b"abc").await;
            send_bytes(&mut session, b"defg").await;
            context.heard(2).await; // view, resize
            close_with(session, 4503, "host moved").await;
        } else if context.query == "from=1007" {
            send_control(&mut session, ServerMessage::Resume { offset: 1007 }).await;
            send_bytes(&mut session, b"hij").await;
            send_control(&mut session, ServerMessage::Exit { exit_code: Some(0) }).await;
        } else {
            send_control(&mut session, ServerMessage::Replay { cols: 80, rows: 24, offset: 2000 }).await;
            send_bytes(&mut session, b"WRONG-REPAINT").await;
            send_control(&mut session, ServerMessage::Live { offset: 2000 }).await;
            send_control(&mut session, ServerMessage::Exit { exit_code: Some(99) }).await;
        }
    }
    .boxed_local()
}

/// Live at 0, two bytes, then 4503; the first reattach finds the host
/// offline (its daemon has not redialled yet) and is closed 4503 once the
/// daemon is back on another instance; the second resumes.
fn moves_and_is_briefly_offline(context: ScriptContext, mut session: Session) -> LocalBoxFuture<'static, ()> {
    async move {
        say_access(&mut session, false).await;
        match context.index {
            0 => {
                send_control(&mut session, ServerMessage::Replay { cols: 80, rows: 24, offset: 0 }).await;
                send_control(&mut session, ServerMessage::Live { offset: 0 }).await;
                send_bytes(&mut session, b"ok").await;
                context.heard(2).await; // view, resize
                close_with(session, 4503, "host moved").await;
            }
            1 => {
                say_host_offline(&mut session).await;
                tokio::time::sleep(Duration::from_millis(300)).await;
                close_with(session, 4503, "the host moved; reattach").await;
            }
            _ => {
                let offset: u64 =
                    context.query.strip_prefix("from=").and_then(|n| n.parse().ok()).expect("reattach without from=");
                send_control(&mut session, ServerMessage::Resume { offset }).await;
                send_bytes(&mut session, b"!").await;
                send_control(&mut session, ServerMessage::Exit { exit_code: None }).await;
            }
        }
    }
    .boxed_local()
}

/// Replay, live, then silence: the client decides when it ends.
fn stays_open(_: ScriptContext, mut session: Session) -> LocalBoxFuture<'static, ()> {
    async move {
        say_access(&mut session, false).await;
        send_control(&mut session, ServerMessage::Replay { cols: 80, rows: 24, offset: 0 }).await;
        send_bytes(&mut session, SNAPSHOT).await;
        send_control(&mut session, ServerMessage::Live { offset: 0 }).await;
    }
    .boxed_local()
}

fn not_found(context: ScriptContext, session: Session) -> LocalBoxFuture<'static, ()> {
    async move {
        let mut session = session;
        say_access(&mut session, false).await;
        context.heard(2).await; // view, resize
        close_with(session, 4404, "terminal not found").await;
    }
    .boxed_local()
}

/// The host is offline, then its daemon comes back to this instance: the
/// stream starts on the same socket.
fn host_offline_then_back(_: ScriptContext, mut session: Session) -> LocalBoxFuture<'static, ()> {
    async move {
        say_access(&mut session, false).await;
        say_host_offline(&mut session).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        send_control(&mut session, ServerMessage::Status { state: "running".into(), host: "online".into() }).await;
        send_control(&mut session, ServerMessage::Replay { cols: 80, rows: 24, offset: 0 }).await;
        send_control(&mut session, ServerMessage::Live { offset: 0 }).await;
        send_bytes(&mut session, b"back").await;
        send_control(&mut session, ServerMessage::Exit { exit_code: Some(0) }).await;
    }
    .boxed_local()
}

/// A read-only connection: access says so, then the usual stream; then
/// silence, the client decides when it ends.
fn read_only(_: ScriptContext, mut session: Session) -> LocalBoxFuture<'static, ()> {
    async move {
        say_access(&mut session, true).await;
        send_control(&mut session, ServerMessage::Status { state: "running".into(), host: "online".into() }).await;
        send_control(&mut session, ServerMessage::Replay { cols: 80, rows: 24, offset: 0 }).await;
        send_bytes(&mut session, SNAPSHOT).await;
        send_control(&mut session, ServerMessage::Live { offset: 0 }).await;
        send_bytes(&mut session, b"watched").await;
    }
    .boxed_local()
}

fn options(server: &FakeServer) -> AttachOptions {
    AttachOptions::new(server.url.clone(), TOKEN, TERMINAL_ID)
}

/// Keystrokes and window sizes the test pushes while the session runs.
fn channel_stream<T: 'static>() -> (mpsc::UnboundedSender<T>, Pin<Box<dyn Stream<Item = T>>>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let stream = stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) });
    (tx, Box::pin(stream))
}

/// A session whose user never types and never resizes.
async fn attach_quietly(server: &FakeServer) -> (AttachOutcome, Vec<u8>) {
    let mut output = Vec::new();
    let io = LocalIo {
        input: stream::pending::<Bytes>(),
        size: (100, 30),
        resizes: stream::pending::<(u16, u16)>(),
        output: &mut output,
    };
    let outcome = tokio::time::timeout(TEST_TIMEOUT, attach::run_with_io(options(server), io))
        .await
        .expect("attach session timed out")
        .expect("attach session failed");
    (outcome, output)
}

/// The control messages heard; panics on a text frame that is not one.
fn texts(received: &[Received]) -> Vec<&ClientMessage> {
    received
        .iter()
        .filter_map(|r| match r {
            Received::Text(message) => Some(message),
            Received::OtherText(text) => panic!("the client sent a text frame that is not a control message: {text}"),
            _ => None,
        })
        .collect()
}

/// A `view` of a visible, open window of `cols` x `rows`, however idle.
fn is_view(message: &ClientMessage, cols: u16, rows: u16) -> bool {
    matches!(message, ClientMessage::View { cols: c, rows: r, visible: true, open: true, .. }
        if (*c, *r) == (GridDim(cols), GridDim(rows)))
}

#[actix_rt::test]
async fn shows_snapshot_then_live_bytes_and_ends_with_the_exit_code() {
    let server = FakeServer::start(exits_with_3).await;
    let (outcome, output) = attach_quietly(&server).await;

    assert_eq!(outcome, AttachOutcome::Exited { code: Some(3) });
    assert_eq!(attach::describe(&outcome), "[terminal exited with code 3]");
    assert_eq!(output, [SNAPSHOT, b"hello ", b"world\r\n"].concat());

    let connections = server.wait_ended(1).await;
    let conn = &connections[0];
    assert_eq!(conn.terminal_id, TERMINAL_ID);
    assert_eq!(conn.query, "");
    assert_eq!(conn.authorization.as_deref(), Some("Bearer tth_test_token"));
    assert_eq!(conn.protocols.as_deref(), Some("tether.v1"));
    assert!(conn.received.contains(&Received::Pong(b"hb".to_vec())), "ping not answered: {:?}", conn.received);
    assert_eq!(conn.received.last(), Some(&Received::Close(Some(1000))));
    server.stop().await;
}

#[actix_rt::test]
async fn reattaches_after_4503_from_the_offset_it_has_shown() {
    let server = FakeServer::start(moves_once).await;
    let (outcome, output) = attach_quietly(&server).await;

    let connections = server.wait_ended(2).await;
    assert_eq!(connections[0].query, "");
    assert_eq!(connections[1].query, "from=1007", "1000 + 3 + 4 live bytes");
    assert_eq!(outcome, AttachOutcome::Exited { code: Some(0) });
    // Resumed without a repaint: the stream simply continues.
    assert_eq!(output, b"SNAPabcdefghij");

    // The first attach claims the grid; the reattach only reports its view.
    let first = texts(&connections[0].received);
    assert!(is_view(first[0], 100, 30), "{first:?}");
    assert_eq!(first[1], &ClientMessage::resize(100, 30));
    let second = texts(&connections[1].received);
    assert!(is_view(second[0], 100, 30), "{second:?}");
    assert!(!second.iter().any(|m| matches!(m, ClientMessage::Resize { .. })), "{second:?}");
    server.stop().await;
}

#[actix_rt::test]
async fn host_offline_while_reattaching_is_retried_not_final() {
    let server = FakeServer::start(moves_and_is_briefly_offline).await;
    let (outcome, output) = attach_quietly(&server).await;

    assert_eq!(outcome, AttachOutcome::Exited { code: None });
    assert_eq!(attach::describe(&outcome), "[terminal exited]");
    assert_eq!(String::from_utf8_lossy(&output), "ok\r\n[host offline; waiting for it to come back]\r\n!");
    let connections = server.wait_ended(3).await;
    let queries: Vec<&str> = connections.iter().map(|c| c.query.as_str()).collect();
    assert_eq!(queries, ["", "from=2", "from=2"]);
    server.stop().await;
}

#[actix_rt::test]
async fn detach_key_ends_the_session_after_view_resize_and_input() {
    let server = FakeServer::start(stays_open).await;
    let (keys, input) = channel_stream::<Bytes>();
    let (sizes, resizes) = channel_stream::<(u16, u16)>();
    let mut output = Vec::new();
    let io = LocalIo { input, size: (100, 30), resizes, output: &mut output };
    let session = tokio::time::timeout(TEST_TIMEOUT, attach::run_with_io(options(&server), io));
    let user = async {
        // Type only once connected: the detach key also works while
        // connecting, which would end the session before any socket exists.
        server.wait_for("view and resize", |c| c.len() == 1 && c[0].received.len() >= 2).await;
        sizes.send((120, 40)).expect("resize");
        server.wait_for("view after resize", |c| texts(&c[0].received).iter().any(|v| is_view(v, 120, 40))).await;
        keys.send(Bytes::from_static(b"ls\r")).expect("type");
        keys.send(Bytes::from_static(b"x\x1dnot sent")).expect("type");
    };
    let (outcome, ()) = tokio::join!(session, user);
    let outcome = outcome.expect("attach session timed out").expect("attach session failed");

    assert_eq!(outcome, AttachOutcome::Detached);
    assert_eq!(attach::describe(&outcome), "[detached]");
    let connections = server.wait_ended(1).await;
    let received = &connections[0].received;
    assert_eq!(received.len(), 6, "{received:#?}");
    assert!(matches!(&received[0], Received::Text(v) if is_view(v, 100, 30)), "{received:?}");
    assert_eq!(received[1], Received::Text(ClientMessage::resize(100, 30)));
    assert!(matches!(&received[2], Received::Text(v) if is_view(v, 120, 40)), "{received:?}");
    assert_eq!(
        received[3..],
        [Received::Binary(b"ls\r".to_vec()), Received::Binary(b"x".to_vec()), Received::Close(Some(1000)),]
    );
    assert!(output.starts_with(SNAPSHOT), "{:?}", String::from_utf8_lossy(&output));
    server.stop().await;
}

#[actix_rt::test]
async fn refusal_close_codes_end_with_a_clear_reason() {
    let server = FakeServer::start(not_found).await;
    let (outcome, output) = attach_quietly(&server).await;

    assert_eq!(outcome, AttachOutcome::Closed { code: 4404, reason: "terminal not found".into() });
    assert_eq!(attach::describe(&outcome), "[closed: terminal not found (4404)]");
    assert!(output.is_empty());
    // Not a reattachable code: exactly one connection.
    assert_eq!(server.wait_ended(1).await.len(), 1);
    server.stop().await;
}

/// `error: host offline` leaves the socket open (docs/PROTOCOL.md): the
/// session says so once and waits there for the stream. It used to close
/// and end with "[host offline]".
#[actix_rt::test]
async fn host_offline_is_waited_out_on_the_open_socket() {
    let server = FakeServer::start(host_offline_then_back).await;
    let (outcome, output) = attach_quietly(&server).await;

    assert_eq!(outcome, AttachOutcome::Exited { code: Some(0) });
    assert_eq!(String::from_utf8_lossy(&output), "\r\n[host offline; waiting for it to come back]\r\nback");
    assert_eq!(server.wait_ended(1).await.len(), 1, "one connection: no reattach");
    server.stop().await;
}

/// A read-only connection is shown as such before the snapshot (a line and
/// the window title), and nothing goes to the server: no view, no grid
/// claim, no keystrokes (they ring the bell); the detach key still works and
/// the title is put back.
#[actix_rt::test]
async fn a_read_only_connection_says_so_and_sends_nothing() {
    let server = FakeServer::start(read_only).await;
    let (keys, input) = channel_stream::<Bytes>();
    let (sizes, resizes) = channel_stream::<(u16, u16)>();
    let output = Arc::new(Mutex::new(Vec::new()));
    let shown = SharedOutput(output.clone());
    let io = LocalIo { input, size: (100, 30), resizes, output: shown };
    let session = tokio::time::timeout(TEST_TIMEOUT, attach::run_with_io(options(&server), io));
    let user = async {
        let deadline = tokio::time::Instant::now() + TEST_TIMEOUT;
        while !String::from_utf8_lossy(&output.lock().unwrap()).contains("watched") {
            assert!(tokio::time::Instant::now() < deadline, "the stream never came");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        sizes.send((120, 40)).expect("resize");
        keys.send(Bytes::from_static(b"rm -rf /\r")).expect("type");
        keys.send(Bytes::from_static(b"\x1d")).expect("detach");
    };
    let (outcome, ()) = tokio::join!(session, user);
    assert_eq!(outcome.expect("attach session timed out").expect("attach session failed"), AttachOutcome::Detached);
    let output = output.lock().unwrap().clone();
    let banner = format!("\r\n{}\r\n", attach::READ_ONLY_BANNER);
    assert!(output.starts_with(banner.as_bytes()), "{:?}", String::from_utf8_lossy(&output));
    let text = String::from_utf8_lossy(&output);
    let (before, after) = text.split_once("\x1b[H\x1b[J").expect("the snapshot");
    assert!(before.contains("\x1b]2;tether: read-only\x07"), "the title says it before the snapshot: {before:?}");
    assert!(after.contains("watched\x07"), "typing rang the bell: {after:?}");
    assert!(after.ends_with("\x1b[23;2t"), "the title is put back: {after:?}");
    let connections = server.wait_ended(1).await;
    assert_eq!(connections[0].received, [Received::Close(Some(1000))], "nothing but the close was sent");
    server.stop().await;
}

/// Output shared with the test while the session writes it.
struct SharedOutput(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for SharedOutput {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
