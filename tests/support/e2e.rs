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

/// A shell script that prints `tick-1`, `tick-2`, ... every `period` seconds.
pub fn ticks_script(period: &str) -> String {
    format!("i=0; while :; do i=$((i+1)); echo tick-$i; sleep {period}; done")
}

/// A viewer of a terminal printing `tick-N` lines ([`ticks_script`]).
/// Made with [`Ticks::follow`] it reattaches from its last byte whenever
/// it is closed 4503; made with [`Ticks::follow_unbroken`] any close fails
/// the test.
pub struct Ticks<'a> {
    server: &'a TetherServer,
    token: String,
    id: String,
    viewer: Viewer,
    /// Offset of the first byte of `stream`.
    start: u64,
    stream: Vec<u8>,
    may_reattach: bool,
    pub reattached: usize,
}

impl<'a> Ticks<'a> {
    pub async fn follow(server: &'a TetherServer, token: &str, id: &str) -> Ticks<'a> {
        Self::attach(server, token, id, true).await
    }

    pub async fn follow_unbroken(server: &'a TetherServer, token: &str, id: &str) -> Ticks<'a> {
        Self::attach(server, token, id, false).await
    }

    async fn attach(server: &'a TetherServer, token: &str, id: &str, may_reattach: bool) -> Ticks<'a> {
        let mut viewer = Viewer::attach_to(server, token, id, "").await;
        viewer.until("tick-").await;
        let (start, stream) = (viewer.start, std::mem::take(&mut viewer.live));
        Ticks {
            server,
            token: token.to_string(),
            id: id.to_string(),
            viewer,
            start,
            stream,
            may_reattach,
            reattached: 0,
        }
    }

    /// The last 150 lines of the log of the server the viewer is on.
    fn log_tail(&self) -> String {
        let log = self.server.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(150)..].join("\n")
    }

    /// The number of the last complete line so far.
    pub fn last(&self) -> u64 {
        tick_numbers(&String::from_utf8_lossy(&self.stream)).last().copied().unwrap_or(0)
    }

    /// Reads until `more` lines after the last one seen now have arrived,
    /// then checks every line came exactly once.
    pub async fn read_past(&mut self, more: u64) {
        let target = self.last() + more;
        while self.last() < target {
            match self.viewer.sock.next_within(WAIT).await {
                Some(Event::Binary(b)) => self.stream.extend_from_slice(&b),
                Some(Event::Close(Some(4503))) if self.may_reattach => {
                    let from = self.start + self.stream.len() as u64;
                    self.viewer = reattach(self.server, &self.token, &self.id, &format!("?from={from}")).await;
                    assert_eq!(self.viewer.start, from, "resumed from the last byte, not repainted");
                    self.reattached += 1;
                }
                Some(Event::Close(code)) => {
                    panic!(
                        "closed {code:?} after tick-{}; the end of its server's log:\n{}",
                        self.last(),
                        self.log_tail()
                    )
                }
                Some(_) => {}
                None => panic!("the stream stalled; got {:?}", String::from_utf8_lossy(&self.stream)),
            }
        }
        let numbers = tick_numbers(&String::from_utf8_lossy(&self.stream));
        for pair in numbers.windows(2) {
            assert_eq!(pair[1], pair[0] + 1, "every line exactly once ({} reattachments)", self.reattached);
        }
    }
}

/// The numbers of the complete `tick-N` lines in `text`.
pub fn tick_numbers(text: &str) -> Vec<u64> {
    text.split("tick-").skip(1).filter_map(|rest| rest.split_once("\r\n").and_then(|(n, _)| n.parse().ok())).collect()
}

/// Attaches with `query` (e.g. `?from=N`), retrying after a 4503 as a
/// client does, while the host is between owners.
pub async fn reattach(server: &TetherServer, token: &str, id: &str, query: &str) -> Viewer {
    for _ in 0..40 {
        match Viewer::try_attach_to(server, token, id, query).await {
            Ok(viewer) => return viewer,
            Err(Some(4503)) => tokio::time::sleep(std::time::Duration::from_millis(250)).await,
            Err(code) => panic!("closed {code:?} before live"),
        }
    }
    panic!("still 4503 after 10 s");
}
