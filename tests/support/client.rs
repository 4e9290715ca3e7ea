//! Clients for tests: the REST API over HTTP and WebSockets speaking the
//! daemon (protobuf) and viewer (JSON + bytes) protocols, with bounded
//! waits so a broken server fails a test instead of hanging it.

use std::time::Duration;

use actix_http::ws;
use awc::BoxedSocket;
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use prost::Message as _;
use serde_json::Value;
use tether::proto::v1::{daemon_frame, server_frame, DaemonFrame, ServerFrame};
use tether::viewer_protocol::ClientMessage;

use super::TetherServer;

/// How long any single wait in a test may take.
pub const WAIT: Duration = Duration::from_secs(20);

fn client() -> awc::Client {
    awc::Client::builder().timeout(Duration::from_secs(60)).finish()
}

/// A user's view of the REST API.
pub struct Api {
    pub base: String,
    pub token: String,
}

impl Api {
    pub fn new(base: impl Into<String>, token: impl Into<String>) -> Self {
        Self { base: base.into(), token: token.into() }
    }

    async fn send(&self, method: awc::http::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let req = client()
            .request(method, format!("{}{}", self.base, path))
            .insert_header(("Authorization", format!("Bearer {}", self.token)));
        let mut res = match body {
            Some(body) => req.send_json(&body).await,
            None => req.send().await,
        }
        .unwrap_or_else(|e| panic!("{path}: {e}"));
        let bytes = res.body().limit(64 * 1024 * 1024).await.unwrap_or_default();
        let value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        (res.status().as_u16(), value)
    }

    /// The same user through the library's client (`tether::client`): for
    /// everything it can ask, so tests do not build those requests by hand.
    pub fn client(&self) -> tether::client::Client {
        tether::client::Client::new(&self.base, &self.token, None).expect("a client of the test server")
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.send(awc::http::Method::GET, path, None).await
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.send(awc::http::Method::POST, path, Some(body)).await
    }

    pub async fn put(&self, path: &str, body: Value) -> (u16, Value) {
        self.send(awc::http::Method::PUT, path, Some(body)).await
    }

    pub async fn delete(&self, path: &str) -> (u16, Value) {
        self.send(awc::http::Method::DELETE, path, None).await
    }

    /// Raw body of a GET (for run logs).
    pub async fn get_bytes(&self, path: &str) -> (u16, Bytes) {
        let mut res = client()
            .get(format!("{}{}", self.base, path))
            .insert_header(("Authorization", format!("Bearer {}", self.token)))
            .send()
            .await
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        let bytes = res.body().limit(64 * 1024 * 1024).await.unwrap_or_default();
        (res.status().as_u16(), bytes)
    }

    /// Polls `GET path` until `check` accepts the body.
    pub async fn wait_for(&self, path: &str, what: &str, check: impl Fn(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let (_, body) = self.get(path).await;
            if check(&body) {
                return body;
            }
            if tokio::time::Instant::now() > deadline {
                panic!("timed out waiting for {what}; last {path}: {body}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Creates a token for `user` against the server's own database.
pub fn create_token(server: &TetherServer, user: &str) -> String {
    let out = server.run(&["token", "create", "--user", user], &[]);
    assert!(out.status.success(), "token create: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf8").trim().to_string()
}

/// What a test sees on a WebSocket.
#[derive(Debug)]
pub enum Event {
    Text(String),
    Binary(Bytes),
    Ping,
    Close(Option<u16>),
}

/// A WebSocket client.
pub struct Socket {
    framed: actix_codec::Framed<BoxedSocket, ws::Codec>,
    /// The description of the close frame, once one came.
    close_reason: Option<String>,
}

impl Socket {
    /// Connects with an optional Bearer token and the given subprotocols.
    pub async fn connect(url: &str, token: Option<&str>, protocols: &[&str]) -> Socket {
        Self::connect_with_headers(url, token, protocols, &[]).await
    }

    /// Like `connect`, with extra request headers (`X-Forwarded-For`, say).
    pub async fn connect_with_headers(
        url: &str,
        token: Option<&str>,
        protocols: &[&str],
        headers: &[(&str, &str)],
    ) -> Socket {
        let mut req = client().ws(url).max_frame_size(8 * 1024 * 1024);
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        if let Some(token) = token {
            req = req.header("Authorization", format!("Bearer {token}"));
        }
        if !protocols.is_empty() {
            req = req.protocols(protocols);
        }
        let (_, framed) = req.connect().await.unwrap_or_else(|e| panic!("ws connect {url}: {e}"));
        Socket { framed, close_reason: None }
    }

    /// Connects and returns the selected subprotocol header too.
    pub async fn connect_with_response(url: &str, protocols: &[&str]) -> (Option<String>, Socket) {
        let (res, framed) = client().ws(url).protocols(protocols).connect().await.expect("ws connect");
        let selected = res.headers().get("sec-websocket-protocol").and_then(|v| v.to_str().ok()).map(str::to_string);
        (selected, Socket { framed, close_reason: None })
    }

    pub async fn send_binary(&mut self, data: impl Into<Bytes>) {
        let _ = self.framed.send(ws::Message::Binary(data.into())).await;
    }

    pub async fn send_text(&mut self, text: impl Into<String>) {
        let _ = self.framed.send(ws::Message::Text(text.into().into())).await;
    }

    pub async fn send_json(&mut self, value: Value) {
        self.send_text(value.to_string()).await;
    }

    /// Sends a viewer control message as its text frame.
    pub async fn send_message(&mut self, message: &ClientMessage) {
        self.send_text(message.to_json()).await;
    }

    pub async fn close(&mut self) {
        let _ = self.framed.send(ws::Message::Close(None)).await;
    }

    /// Sends a close frame with `code`.
    pub async fn close_with(&mut self, code: u16) {
        let _ = self.framed.send(ws::Message::Close(Some(ws::CloseCode::from(code).into()))).await;
    }

    /// Sends one fragment of a message.
    pub async fn send_continuation(&mut self, item: ws::Item) {
        let _ = self.framed.send(ws::Message::Continuation(item)).await;
    }

    /// Writes bytes to the socket past the codec (a header that lies
    /// about its frame's length, say).
    pub async fn send_raw(&mut self, bytes: &[u8]) {
        use tokio::io::AsyncWriteExt;
        let _ = self.framed.io_mut().write_all(bytes).await;
    }

    /// The next frame, answering pings; `None` on timeout.
    pub async fn next_within(&mut self, wait: Duration) -> Option<Event> {
        loop {
            let frame = match tokio::time::timeout(wait, self.framed.next()).await {
                Err(_) => return None,
                Ok(None) | Ok(Some(Err(_))) => return Some(Event::Close(None)),
                Ok(Some(Ok(frame))) => frame,
            };
            return Some(match frame {
                ws::Frame::Text(t) => Event::Text(String::from_utf8_lossy(&t).into_owned()),
                ws::Frame::Binary(b) => Event::Binary(b),
                ws::Frame::Ping(p) => {
                    let _ = self.framed.send(ws::Message::Pong(p)).await;
                    Event::Ping
                }
                ws::Frame::Pong(_) => continue,
                ws::Frame::Close(reason) => {
                    self.close_reason = reason.as_ref().and_then(|r| r.description.clone());
                    Event::Close(reason.map(|r| u16::from(r.code)))
                }
                ws::Frame::Continuation(_) => continue,
            });
        }
    }

    pub async fn next(&mut self) -> Event {
        self.next_within(WAIT).await.expect("timed out waiting for a frame")
    }

    /// The text of the close frame that came, if any (after `Event::Close`).
    pub fn close_reason(&self) -> Option<&str> {
        self.close_reason.as_deref()
    }

    /// Reads until a JSON text message of type `kind` and returns it;
    /// panics if the socket closes first.
    pub async fn until_message(&mut self, kind: &str) -> Value {
        loop {
            match self.next().await {
                Event::Text(t) => {
                    let message: Value = serde_json::from_str(&t).expect("json");
                    if message["type"] == kind {
                        return message;
                    }
                }
                Event::Close(code) => panic!("closed ({code:?}) while waiting for {kind}"),
                _ => continue,
            }
        }
    }

    /// Reads until a close frame and returns its code.
    pub async fn expect_close(&mut self) -> Option<u16> {
        loop {
            match self.next().await {
                Event::Close(code) => return code,
                _ => continue,
            }
        }
    }

    // ---- daemon protocol helpers

    pub async fn send_frame(&mut self, frame: daemon_frame::Frame) {
        self.send_binary(DaemonFrame { frame: Some(frame) }.encode_to_vec()).await;
    }

    /// The next server frame (skipping pings); panics on anything else.
    pub async fn next_server_frame(&mut self) -> server_frame::Frame {
        loop {
            match self.next().await {
                Event::Binary(b) => {
                    return ServerFrame::decode(b.as_ref()).expect("server frame").frame.expect("frame set");
                }
                Event::Ping => continue,
                other => panic!("expected a server frame, got {other:?}"),
            }
        }
    }
}

/// Daemon socket URL of a server.
/// A client's (masked) frame header: `fin`, `opcode`, and a payload
/// length of `len` bytes, which need not follow.
pub fn frame_header(fin: bool, opcode: u8, len: u64) -> Vec<u8> {
    let mut out = vec![if fin { 0x80 } else { 0 } | opcode];
    match len {
        0..=125 => out.push(0x80 | len as u8),
        126..=0xffff => {
            out.push(0x80 | 126);
            out.extend_from_slice(&(len as u16).to_be_bytes());
        }
        _ => {
            out.push(0x80 | 127);
            out.extend_from_slice(&len.to_be_bytes());
        }
    }
    out.extend_from_slice(&[0x11, 0x22, 0x33, 0x44]);
    out
}

pub fn daemon_url(server: &TetherServer) -> String {
    format!("{}/ws/v1/daemon", server.ws_url())
}

/// Viewer socket URL of a terminal.
pub fn viewer_url(server: &TetherServer, terminal_id: &str) -> String {
    format!("{}/ws/v1/terminals/{terminal_id}", server.ws_url())
}

/// A hello for `host_id` reporting no terminals.
pub fn hello(host_id: &str) -> daemon_frame::Frame {
    daemon_frame::Frame::Hello(tether::proto::v1::Hello {
        host_id: host_id.to_string(),
        daemon_version: "test".into(),
        capabilities: Some(tether::proto::v1::Capabilities {
            manage_dirs: true,
            refresh_limits: true,
            credentials: true,
            usage: true,
            // Scripted daemons send what the test says; no Credit or
            // InputTaken frames.
            flow_control: false,
            input_flow_control: false,
            resume_ended: false,
        }),
        dirs: vec!["/tmp".into()],
        terminals: vec![],
        booking: None,
    })
}

/// Posts 64 KiB inputs, each starting with its number, to a terminal whose
/// daemon does not read, until one is refused: that must be 429
/// `input_backlog`, after at least 4 MiB was taken. Returns how many were
/// taken.
pub async fn input_until_refused(api: &Api, terminal: &str) -> usize {
    let path = format!("/api/v1/terminals/{terminal}/input");
    let mut taken = 0;
    loop {
        let data = format!("{taken:06}{}", "x".repeat(64 * 1024 - 6));
        let (status, body) = api.post(&path, serde_json::json!({ "data": data })).await;
        match status {
            202 => taken += 1,
            429 => {
                assert_eq!(body["error"]["code"], "input_backlog", "{body}");
                break;
            }
            _ => panic!("input {taken}: {status} {body}"),
        }
        assert!(taken < 1000, "64 MiB of input was taken for a daemon that does not read");
    }
    assert!(taken * 64 * 1024 >= 4 * 1024 * 1024, "refused after only {taken} inputs");
    taken
}

/// Reads the `taken` inputs of [`input_until_refused`] from the daemon, in
/// order, then checks input is taken again.
pub async fn inputs_arrive_in_order(daemon: &mut Socket, api: &Api, terminal: &str, taken: usize) {
    let mut next = 0;
    while next < taken {
        match daemon.next_server_frame().await {
            server_frame::Frame::Input(i) => {
                assert_eq!(i.terminal_id, terminal);
                assert_eq!(&i.data[..6], format!("{next:06}").as_bytes(), "input arrives in order");
                next += 1;
            }
            other => panic!("expected Input, got {other:?}"),
        }
    }
    let path = format!("/api/v1/terminals/{terminal}/input");
    let (status, body) = api.post(&path, serde_json::json!({ "data": "again" })).await;
    assert_eq!(status, 202, "{body}");
    match daemon.next_server_frame().await {
        server_frame::Frame::Input(i) => assert_eq!(i.data, "again"),
        other => panic!("expected Input, got {other:?}"),
    }
}
