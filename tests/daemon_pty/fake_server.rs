//! A fake tether server for daemon tests: answers registration, accepts
//! `/ws/v1/daemon`, answers Pings, and hands every frame to the test, which
//! plays the server's side frame by frame. `Streams` checks every Output
//! frame for contiguity against the Scrollback that started its stream.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use prost::Message as _;
use tether::proto::v1::{
    daemon_frame::Frame as Out, server_frame::Frame as In, DaemonFrame, Hello, HelloAck, Pong, ServerFrame,
};
use tokio::sync::mpsc;

pub const TOKEN: &str = "tth_test-token";
pub const WAIT: Duration = Duration::from_secs(15);

enum Event {
    Connected(u32, actix_ws::Session),
    Frame(u32, DaemonFrame),
    Closed(u32),
}

struct Shared {
    events: mpsc::UnboundedSender<Event>,
    next_connection: Mutex<u32>,
    /// What POST /api/v1/hosts hands out, and how often it was called.
    host_id: Mutex<String>,
    registrations: Mutex<u32>,
}

fn bearer_ok(req: &HttpRequest) -> bool {
    req.headers().get("authorization").and_then(|value| value.to_str().ok()) == Some(&format!("Bearer {TOKEN}"))
}

async fn register_host(
    req: HttpRequest,
    body: web::Json<serde_json::Value>,
    shared: web::Data<Shared>,
) -> HttpResponse {
    if !bearer_ok(&req) {
        return HttpResponse::Unauthorized().finish();
    }
    for field in ["name", "hostname", "platform", "arch"] {
        assert!(body.get(field).and_then(|v| v.as_str()).is_some(), "registration lacks {field}: {body}");
    }
    *shared.registrations.lock().unwrap() += 1;
    let id = shared.host_id.lock().unwrap().clone();
    HttpResponse::Created().json(serde_json::json!({"host": {"id": id, "name": body["name"]}}))
}

async fn daemon_socket(
    req: HttpRequest,
    body: web::Payload,
    shared: web::Data<Shared>,
) -> Result<HttpResponse, actix_web::Error> {
    if !bearer_ok(&req) {
        return Ok(HttpResponse::Unauthorized().finish());
    }
    let (response, session, stream) = actix_ws::handle_with_protocols(&req, body, &["tether.daemon.v1"])?;
    let mut stream = stream.max_frame_size(1024 * 1024);
    let number = {
        let mut next = shared.next_connection.lock().unwrap();
        *next += 1;
        *next
    };
    let events = shared.events.clone();
    let mut pong_session = session.clone();
    let _ = events.send(Event::Connected(number, session));
    actix_web::rt::spawn(async move {
        while let Some(Ok(message)) = stream.recv().await {
            match message {
                actix_ws::Message::Binary(data) => {
                    let frame = DaemonFrame::decode(data).expect("daemon sent an undecodable frame");
                    // Like the real server: every Ping gets a Pong, in order.
                    if matches!(frame.frame, Some(Out::Ping(_))) {
                        let pong = ServerFrame { frame: Some(In::Pong(Pong {})) };
                        let _ = pong_session.binary(pong.encode_to_vec()).await;
                    }
                    let _ = events.send(Event::Frame(number, frame));
                }
                actix_ws::Message::Close(_) => break,
                _ => {}
            }
        }
        let _ = events.send(Event::Closed(number));
    });
    Ok(response)
}

/// Tracks what a viewer would see per terminal: the stream position and text.
#[derive(Default)]
pub struct Streams {
    pub next_offset: HashMap<String, u64>,
    text: HashMap<String, Vec<u8>>,
}

impl Streams {
    pub fn observe(&mut self, frame: &Out) {
        match frame {
            Out::Scrollback(scrollback) if scrollback.resumed => {
                // Raw bytes from `offset`: the stream goes on after them.
                let end = scrollback.offset + scrollback.data.len() as u64;
                self.next_offset.insert(scrollback.terminal_id.clone(), end);
            }
            Out::Scrollback(scrollback) => {
                if let Some(expected) = self.next_offset.get(&scrollback.terminal_id) {
                    // A re-attach flushes first: the new snapshot sits exactly
                    // where the stream so far ends.
                    assert_eq!(scrollback.offset, *expected, "re-attach snapshot offset");
                }
                self.next_offset.insert(scrollback.terminal_id.clone(), scrollback.offset);
            }
            Out::Output(output) => {
                let expected = self
                    .next_offset
                    .get_mut(&output.terminal_id)
                    .unwrap_or_else(|| panic!("Output for {} without an attach", output.terminal_id));
                assert_eq!(output.offset, *expected, "Output offsets must be contiguous");
                assert!(!output.data.is_empty(), "empty Output frame");
                assert!(output.data.len() <= 64 * 1024, "Output chunk over 64 KiB");
                *expected += output.data.len() as u64;
                self.text.entry(output.terminal_id.clone()).or_default().extend_from_slice(&output.data);
            }
            _ => {}
        }
    }

    pub fn text(&self, terminal_id: &str) -> String {
        String::from_utf8_lossy(self.text.get(terminal_id).map_or(&[][..], |t| &t[..])).into_owned()
    }
}

pub struct FakeServer {
    pub base_url: String,
    shared: web::Data<Shared>,
    events: mpsc::UnboundedReceiver<Event>,
    connection: u32,
    session: Option<actix_ws::Session>,
    pub streams: Streams,
}

impl FakeServer {
    pub async fn start(host_id: &str) -> Self {
        let (events_tx, events) = mpsc::unbounded_channel();
        let shared = web::Data::new(Shared {
            events: events_tx,
            next_connection: Mutex::new(0),
            host_id: Mutex::new(host_id.to_owned()),
            registrations: Mutex::new(0),
        });
        let app_shared = shared.clone();
        let server = HttpServer::new(move || {
            App::new()
                .app_data(app_shared.clone())
                .route("/api/v1/hosts", web::post().to(register_host))
                .route("/ws/v1/daemon", web::get().to(daemon_socket))
        })
        .workers(1)
        .disable_signals()
        .bind(("127.0.0.1", 0))
        .expect("bind the fake server");
        let addr = server.addrs()[0];
        actix_web::rt::spawn(server.run());
        Self {
            base_url: format!("http://{addr}"),
            shared,
            events,
            connection: 0,
            session: None,
            streams: Streams::default(),
        }
    }

    pub fn registrations(&self) -> u32 {
        *self.shared.registrations.lock().unwrap()
    }

    pub fn set_host_id(&self, host_id: &str) {
        *self.shared.host_id.lock().unwrap() = host_id.to_owned();
    }

    /// Waits for the daemon's next connection and returns its Hello.
    pub async fn accept(&mut self) -> Hello {
        loop {
            match self.next_event().await {
                Event::Connected(number, session) => {
                    self.connection = number;
                    self.session = Some(session);
                    break;
                }
                // Leftovers of an earlier connection.
                Event::Frame(..) | Event::Closed(_) => {}
            }
        }
        match self.next_frame().await {
            Out::Hello(hello) => hello,
            other => panic!("first frame was not Hello: {other:?}"),
        }
    }

    pub async fn accept_and_ack(&mut self) -> Hello {
        let hello = self.accept().await;
        self.send(In::HelloAck(HelloAck { instance_id: "fake#000001".to_owned(), resume_ended: Vec::new() })).await;
        hello
    }

    async fn next_event(&mut self) -> Event {
        tokio::time::timeout(WAIT, self.events.recv())
            .await
            .expect("timed out waiting for the daemon")
            .expect("fake server stopped")
    }

    /// The next frame of the current connection (Pings skipped), observed
    /// by the stream tracker.
    pub async fn next_frame(&mut self) -> Out {
        loop {
            match self.next_event().await {
                Event::Frame(number, frame) if number == self.connection => {
                    let frame = frame.frame.expect("empty DaemonFrame");
                    if matches!(frame, Out::Ping(_)) {
                        continue;
                    }
                    self.streams.observe(&frame);
                    return frame;
                }
                Event::Closed(number) if number == self.connection => {
                    panic!("the daemon closed the connection")
                }
                Event::Connected(number, _) => panic!("unexpected new connection {number}"),
                _ => {}
            }
        }
    }

    /// Waits `quiet` while the daemon stays on this connection, sending
    /// nothing but Pings (answered as they come); returns how many came.
    pub async fn pings_while_quiet(&mut self, quiet: Duration) -> u32 {
        let deadline = tokio::time::Instant::now() + quiet;
        let mut pings = 0;
        loop {
            match tokio::time::timeout_at(deadline, self.events.recv()).await {
                Err(_) => return pings,
                Ok(None) => panic!("fake server stopped"),
                Ok(Some(Event::Frame(number, frame))) if number == self.connection => match frame.frame {
                    Some(Out::Ping(_)) => pings += 1,
                    other => panic!("expected only Pings, got {other:?}"),
                },
                Ok(Some(Event::Closed(number))) if number == self.connection => {
                    panic!("the daemon left a connection that answered every Ping")
                }
                Ok(Some(Event::Connected(number, _))) => panic!("unexpected new connection {number}"),
                Ok(Some(_)) => {}
            }
        }
    }

    /// The next frame that is not Output.
    pub async fn next_control(&mut self) -> Out {
        loop {
            let frame = self.next_frame().await;
            if !matches!(frame, Out::Output(_)) {
                return frame;
            }
        }
    }

    /// Waits until a terminal's streamed text contains `needle`.
    pub async fn wait_for_text(&mut self, terminal_id: &str, needle: &str) {
        while !self.streams.text(terminal_id).contains(needle) {
            match self.next_frame().await {
                Out::Output(_) => {}
                other => panic!("expected output {needle:?} for {terminal_id}, got {other:?}"),
            }
        }
    }

    /// Reads Output until the terminal has been quiet for `quiet`.
    pub async fn drain_output(&mut self, quiet: Duration) {
        loop {
            match tokio::time::timeout(quiet, self.next_frame()).await {
                Err(_) => return,
                Ok(Out::Output(_)) => {}
                Ok(other) => panic!("expected only output, got {other:?}"),
            }
        }
    }

    pub async fn send(&mut self, frame: In) {
        let bytes = ServerFrame { frame: Some(frame) }.encode_to_vec();
        self.session.as_mut().expect("no connection").binary(bytes).await.expect("send to the daemon");
    }

    pub async fn close(&mut self, code: Option<u16>) {
        let reason =
            code.map(|code| actix_ws::CloseReason { code: actix_ws::CloseCode::from(code), description: None });
        if let Some(session) = self.session.take() {
            let _ = session.close(reason).await;
        }
    }
}
