//! One real `tether serve` with one real `tether daemon` (real PTYs), and a
//! viewer that records its stream: the setup of the end-to-end suites.

use serde_json::{json, Value};

use super::client::{create_token, viewer_url, Api, Event, Socket, WAIT};
use super::daemon::DaemonProcess;
use super::{pg_database, TetherServer};
use tether::viewer_protocol::{ClientMessage, ServerMessage};

/// A server, a user's API client, a daemon and its host id.
pub struct E2e {
    pub server: TetherServer,
    pub api: Api,
    pub daemon: DaemonProcess,
    pub host: String,
    pub dir: tempfile::TempDir,
}

pub async fn start(postgres: bool, env: &[(&str, &str)]) -> E2e {
    let url = if postgres { Some(pg_database().await) } else { None };
    let mut env: Vec<(&str, &str)> = env.to_vec();
    if let Some(url) = &url {
        env.push(("TETHER_DATABASE__URL", url));
    }
    let server = TetherServer::start(&env, &[]).await;
    let api = Api::new(server.url(), create_token(&server, "ann"));
    let dir = tempfile::tempdir().expect("temp dir");
    let daemon = DaemonProcess::start(&server, &api.token, &dir.path().join("state"));
    let host = wait_online(&api).await;
    E2e { server, api, daemon, host, dir }
}

/// Waits until the user's (single) host is online; returns its id.
pub async fn wait_online(api: &Api) -> String {
    let client = api.client();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let hosts = client.hosts().await.unwrap_or_else(|e| panic!("list hosts: {e}"));
        if let Some(host) = hosts.iter().find(|h| h.is_online()) {
            return host.id.to_string();
        }
        assert!(tokio::time::Instant::now() < deadline, "no host came online: {hosts:?}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// A running terminal of `argv` in /tmp on the e2e host; returns its id.
pub async fn terminal(e: &E2e, argv: &[&str]) -> String {
    let new = tether::client::NewTerminal {
        host_id: e.host.parse().expect("host id"),
        argv: argv.iter().map(|a| a.to_string()).collect(),
        dir: Some("/tmp".into()),
        ..Default::default()
    };
    let created = e.api.client().create_terminal(&new).await.unwrap_or_else(|err| panic!("create a terminal: {err}"));
    let id = created.id.to_string();
    wait_state(&e.api, &id, "running").await;
    id
}

pub async fn wait_state(api: &Api, id: &str, state: &str) -> Value {
    api.wait_for(&format!("/api/v1/terminals/{id}"), state, |b| b["terminal"]["state"] == state).await["terminal"]
        .clone()
}

/// A viewer that records the stream: where its live bytes start, what came,
/// and every control message (`status`, `size`, `error`, ...) in order.
pub struct Viewer {
    pub sock: Socket,
    pub start: u64,
    pub live: Vec<u8>,
    /// Every text frame since the socket opened, parsed.
    pub controls: Vec<ServerMessage>,
    pub exit: Option<Value>,
}

impl Viewer {
    pub async fn attach(e: &E2e, terminal: &str, query: &str) -> Viewer {
        Self::attach_to(&e.server, &e.api.token, terminal, query).await
    }

    /// Attaches through `server` with `token`; `query` is e.g. `?from=0`.
    pub async fn attach_to(server: &TetherServer, token: &str, terminal: &str, query: &str) -> Viewer {
        match Self::try_attach_to(server, token, terminal, query).await {
            Ok(viewer) => viewer,
            Err(code) => panic!("closed {code:?} before live"),
        }
    }

    /// Like `attach_to`; a close before `live` answers its code.
    pub async fn try_attach_to(
        server: &TetherServer,
        token: &str,
        terminal: &str,
        query: &str,
    ) -> Result<Viewer, Option<u16>> {
        let url = format!("{}{query}", viewer_url(server, terminal));
        let sock = Socket::connect(&url, Some(token), &["tether.v1"]).await;
        let mut viewer = Viewer { sock, start: 0, live: Vec::new(), controls: Vec::new(), exit: None };
        // Bytes before `live` or `resume` are the replay's snapshot, not live output.
        loop {
            match viewer.sock.next().await {
                Event::Text(t) => match viewer.record(&t) {
                    ServerMessage::Live { offset } | ServerMessage::Resume { offset } => {
                        viewer.start = offset;
                        return Ok(viewer);
                    }
                    _ => {}
                },
                Event::Close(code) => return Err(code),
                _ => {}
            }
        }
    }

    /// Parses and keeps a text frame.
    fn record(&mut self, text: &str) -> ServerMessage {
        let message = ServerMessage::parse(text).unwrap_or_else(|e| panic!("a viewer control message {text:?}: {e}"));
        if let ServerMessage::Exit { .. } = message {
            self.exit = Some(serde_json::from_str(text).expect("json"));
        }
        self.controls.push(message.clone());
        message
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.live).into_owned()
    }

    /// Reads one frame within what is left until `deadline`: live bytes are
    /// appended, text frames recorded. Panics on a close or the deadline.
    async fn read_one(&mut self, deadline: tokio::time::Instant, waiting_for: &str) {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match self.sock.next_within(left).await {
            Some(Event::Binary(b)) => self.live.extend_from_slice(&b),
            Some(Event::Text(t)) => {
                self.record(&t);
            }
            Some(Event::Close(code)) => panic!("closed {code:?} waiting for {waiting_for}; got {:?}", self.text()),
            Some(Event::Ping) => {}
            None => panic!("timed out waiting for {waiting_for}; got {:?} and {:?}", self.text(), self.controls),
        }
    }

    /// Reads until the live output contains `needle`, recording the control
    /// messages that come meanwhile.
    pub async fn until(&mut self, needle: &str) {
        self.until_match(&format!("{needle:?}"), |text| text.contains(needle).then_some(())).await;
    }

    /// Reads until `found` finds something in the live output; returns it.
    pub async fn until_match<T>(&mut self, what: &str, found: impl Fn(&str) -> Option<T>) -> T {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if let Some(found) = found(&self.text()) {
                return found;
            }
            self.read_one(deadline, what).await;
        }
    }

    /// Reads until a control message since the socket opened matches
    /// `wanted`; returns the first that does.
    pub async fn until_control(&mut self, what: &str, wanted: impl Fn(&ServerMessage) -> bool) -> ServerMessage {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if let Some(found) = self.controls.iter().find(|m| wanted(m)) {
                return found.clone();
            }
            self.read_one(deadline, what).await;
        }
    }

    /// Reads until a `size` message for a `cols` x `rows` grid came; returns
    /// its `yours` (the first such message's).
    pub async fn until_size(&mut self, cols: u16, rows: u16) -> bool {
        let wanted =
            |m: &ServerMessage| matches!(m, ServerMessage::Size { cols: c, rows: r, .. } if (*c, *r) == (cols, rows));
        match self.until_control(&format!("size {cols}x{rows}"), wanted).await {
            ServerMessage::Size { yours, .. } => yours,
            other => unreachable!("matched a size message, got {other:?}"),
        }
    }

    /// Reads until the exit message; returns it.
    pub async fn until_exit(&mut self) -> Value {
        // Any amount of output may come first: each frame gets its own wait.
        while self.exit.is_none() {
            self.read_one(tokio::time::Instant::now() + WAIT, "the exit message").await;
        }
        self.exit.clone().expect("exit")
    }

    /// Claims the grid (`resize`).
    pub async fn resize(&mut self, cols: u16, rows: u16) {
        self.sock.send_message(&ClientMessage::resize(cols, rows)).await;
    }

    pub async fn type_line(&mut self, line: &str) {
        self.sock.send_message(&ClientMessage::Input { data: format!("{line}\n") }).await;
    }
}

/// The value of an unlabelled metric on the server's `/metrics`.
pub async fn metric(api: &Api, name: &str) -> Option<f64> {
    let (_, body) = api.get_bytes("/metrics").await;
    let text = String::from_utf8_lossy(&body);
    let line = text.lines().find(|l| l.split(' ').next() == Some(name))?;
    line.rsplit(' ').next()?.parse().ok()
}
