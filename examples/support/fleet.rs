//! Fake daemons for the scale benchmarks (`cluster_bench`, `scale_bench`).
//!
//! Each does on the wire what a real `tether daemon` does and nothing more
//! (docs/PROTOCOL.md, "Registration" and "The daemon socket"): it registers
//! with `POST /api/v1/hosts`, asks `POST /v1/assign` where to dial (a
//! standalone server answers 404: dial the server itself), opens
//! `/ws/v1/daemon` with the `tether.daemon.v1` subprotocol, sends the
//! protobuf `Hello` and waits for `HelloAck`; then it idles: a `Ping` frame
//! every 30 s, a pong to every WebSocket ping, and a redial with the
//! daemon's jittered back-off when the socket ends or stays silent for 75 s
//! (src/daemon/supervisor.rs: a 4403 registers again and redials at once, a
//! 4401 stops it, a failed dial asks `/v1/assign` again).
//!
//! They run in child processes of the benchmark (`<example> fake-daemons
//! BASE TOKENS FIRST COUNT`, [`child_main`]), at most [`PER_PROCESS`]
//! sockets each, under this machine's 20,000 open files per process, and
//! bind their sockets to 127.1.x.y source addresses, [`PER_ADDRESS`] per
//! address, so no source address runs out of ephemeral ports nor past the
//! server's default `http.ws_per_address` (256). A child reports on its
//! stdout, one line per event: `up UPGRADE_MS ACK_MS` at every HelloAck
//! (how long the upgrade and the wait for HelloAck took), `down` when an
//! admitted socket ends, `fail REASON` when an attempt fails, `done OK
//! FAILED` once each of its daemons has made its first attempt, `fatal ...`
//! when one stops; [`Fleet`] reads them.

use std::io::{BufRead, Write};
use std::process::{ChildStdin, Command, Stdio};
use std::rc::Rc;
use std::time::{Duration, Instant};

use actix_http::ws;
use futures_util::{SinkExt, StreamExt};
use prost::Message as _;
use serde_json::{json, Value};
use tether::proto::v1::{daemon_frame, server_frame, Capabilities, DaemonFrame, Hello, Ping, ServerFrame};

use super::{bound_client, raise_nofile, source_address, tie_to_parent, Framed, Guard};

/// Sockets per fake-daemon process and per source address.
pub const PER_PROCESS: usize = 2_500;
pub const PER_ADDRESS: usize = 200;
/// The second byte of the fake daemons' source addresses (127.1.x.y).
const ADDRESS_BLOCK: u8 = 1;
/// First attempts in flight at once per process, so a fleet grows at a
/// pace the server can take; redials are not gated (they are the storm).
const FIRST_ATTEMPTS_IN_FLIGHT: usize = 32;

/// The daemon's timings (src/daemon/host.rs, src/daemon/supervisor.rs).
const PING_INTERVAL: Duration = Duration::from_secs(30);

/// The ping period: the daemon's, or `TETHER_BENCH_PING_MS` (to measure
/// what the pings cost the server).
fn ping_interval() -> Duration {
    std::env::var("TETHER_BENCH_PING_MS")
        .ok()
        .and_then(|ms| ms.parse().ok())
        .map_or(PING_INTERVAL, Duration::from_millis)
}
const SILENCE_LIMIT: Duration = Duration::from_secs(75);
const HEALTHY_CONNECTION: Duration = Duration::from_secs(10);

// ------------------------------------------------------------------ back-off

/// The daemon's reconnect delays, as src/daemon/backoff.rs (private to the
/// library) defines them: a step of 1 s doubling up to 30 s, plus a random
/// jitter of up to a quarter of the step.
struct Backoff {
    step: Duration,
}

impl Backoff {
    const FIRST: Duration = Duration::from_secs(1);
    const MAX: Duration = Duration::from_secs(30);

    fn new() -> Self {
        Self { step: Self::FIRST }
    }

    fn next_delay(&mut self) -> Duration {
        let step = self.step;
        self.step = (step * 2).min(Self::MAX);
        let quarter = u64::try_from(step.as_millis() / 4).unwrap_or(u64::MAX);
        step + Duration::from_millis(rand::random_range(0..=quarter))
    }

    fn reset(&mut self) {
        self.step = Self::FIRST;
    }
}

// ------------------------------------------------------------------ one fake daemon

/// Why an attempt to get admitted failed.
enum Failed {
    /// The token was refused (401): the daemon stops.
    Unauthorized,
    /// The dial failed: ask `/v1/assign` again before the next one.
    Dial(String),
    Other(String),
}

/// How an admitted connection ended.
enum End {
    Closed(Option<u16>),
    Lost,
}

struct FakeDaemon {
    client: awc::Client,
    base: String,
    token: String,
    index: usize,
}

impl FakeDaemon {
    async fn register(&self) -> Result<String, Failed> {
        let hostname = format!("bench-fake-{:05}", self.index);
        let body = json!({"name": hostname, "hostname": hostname, "platform": "linux", "arch": "x86_64"});
        let mut res = self
            .client
            .post(format!("{}/api/v1/hosts", self.base))
            .bearer_auth(&self.token)
            .send_json(&body)
            .await
            .map_err(|e| Failed::Other(format!("register: {e}")))?;
        if res.status() == 401 {
            return Err(Failed::Unauthorized);
        }
        let reg: Value = res.json().await.map_err(|e| Failed::Other(format!("register body: {e}")))?;
        reg["host"]["id"].as_str().map(str::to_string).ok_or_else(|| Failed::Other(format!("register answered {reg}")))
    }

    /// `POST /v1/assign`; a standalone server answers 404 (dial it).
    async fn assign(&self, host_id: &str) -> Result<(), Failed> {
        let res = self
            .client
            .post(format!("{}/v1/assign", self.base))
            .bearer_auth(&self.token)
            .send_json(&json!({"hostId": host_id}))
            .await
            .map_err(|e| Failed::Dial(format!("assign: {e}")))?;
        match res.status().as_u16() {
            401 => Err(Failed::Unauthorized),
            404 | 200..=299 => Ok(()),
            status => Err(Failed::Other(format!("assign answered HTTP {status}"))),
        }
    }

    /// Dials and says hello; answers the socket and how long the upgrade
    /// and then the wait for HelloAck took.
    async fn hello(&self, host_id: &str) -> Result<(Framed, Duration, Duration), Failed> {
        let began = Instant::now();
        let ws_url = format!("{}/ws/v1/daemon", self.base.replacen("http", "ws", 1));
        let (_, mut framed) = self
            .client
            .ws(ws_url.as_str())
            .bearer_auth(&self.token)
            .protocols(["tether.daemon.v1"])
            .max_frame_size(1 << 20)
            .connect()
            .await
            .map_err(|e| match e {
                awc::error::WsClientError::InvalidResponseStatus(s) if s == 401 => Failed::Unauthorized,
                e => Failed::Dial(format!("ws: {e}")),
            })?;
        let upgraded = Instant::now();
        let hello = Hello {
            host_id: host_id.to_string(),
            daemon_version: "bench-fake".into(),
            capabilities: Some(Capabilities { flow_control: true, ..Default::default() }),
            dirs: vec![],
            terminals: vec![],
            booking: None,
        };
        let hello = encode(daemon_frame::Frame::Hello(hello));
        framed.send(ws::Message::Binary(hello)).await.map_err(|e| Failed::Other(e.to_string()))?;
        loop {
            match tokio::time::timeout(Duration::from_secs(60), framed.next()).await {
                Ok(Some(Ok(ws::Frame::Binary(b)))) => {
                    let frame = ServerFrame::decode(b.as_ref()).map_err(|e| Failed::Other(e.to_string()))?;
                    if let Some(server_frame::Frame::HelloAck(_)) = frame.frame {
                        return Ok((framed, upgraded - began, upgraded.elapsed()));
                    }
                }
                Ok(Some(Ok(ws::Frame::Ping(p)))) => {
                    let _ = framed.send(ws::Message::Pong(p)).await;
                }
                Ok(Some(Ok(ws::Frame::Close(r)))) => {
                    return Err(Failed::Other(format!("closed before HelloAck: {:?}", r.map(|r| u16::from(r.code)))))
                }
                Ok(Some(Ok(_))) => {}
                Ok(Some(Err(e))) => return Err(Failed::Other(format!("before HelloAck: {e}"))),
                Ok(None) => return Err(Failed::Other("ended before HelloAck".into())),
                Err(_) => return Err(Failed::Other("no HelloAck within 60 s".into())),
            }
        }
    }

    /// Idles on an admitted socket until it ends.
    async fn idle(framed: &mut Framed) -> End {
        let every = ping_interval();
        let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        let mut heard = Instant::now();
        loop {
            tokio::select! {
                frame = framed.next() => {
                    heard = Instant::now();
                    match frame {
                        Some(Ok(ws::Frame::Ping(p))) => { let _ = framed.send(ws::Message::Pong(p)).await; }
                        Some(Ok(ws::Frame::Close(r))) => return End::Closed(r.map(|r| u16::from(r.code))),
                        Some(Ok(_)) => {}
                        _ => return End::Lost,
                    }
                }
                _ = ping.tick() => {
                    if heard.elapsed() > SILENCE_LIMIT {
                        return End::Lost;
                    }
                    let _ = framed.send(ws::Message::Binary(encode(daemon_frame::Frame::Ping(Ping {})))).await;
                }
            }
        }
    }

    /// A failed attempt, for the benchmark's tally of why attempts fail.
    fn say(&self, error: &str) {
        let short: String = error.chars().take(90).collect();
        report(&format!("fail {short}"));
    }

    /// Runs until the token is refused. `first` hears whether the first
    /// attempt got admitted.
    async fn run(self, gate: Rc<tokio::sync::Semaphore>, first: tokio::sync::mpsc::UnboundedSender<bool>) {
        let mut first = Some(first);
        let mut backoff = Backoff::new();
        let mut host_id: Option<String> = None;
        let mut assigned = false;
        loop {
            let permit = match first {
                Some(_) => gate.acquire().await.ok(),
                None => None,
            };
            let attempt = async {
                let id = match &host_id {
                    Some(id) => id.clone(),
                    None => host_id.insert(self.register().await?).clone(),
                };
                if !assigned {
                    self.assign(&id).await?;
                    assigned = true;
                }
                self.hello(&id).await
            }
            .await;
            drop(permit);
            if let Some(tx) = first.take() {
                let _ = tx.send(attempt.is_ok());
            }
            let end = match attempt {
                Ok((mut framed, upgrade, ack)) => {
                    report(&format!("up {} {}", upgrade.as_millis(), ack.as_millis()));
                    let began = Instant::now();
                    let end = Self::idle(&mut framed).await;
                    report("down");
                    if began.elapsed() >= HEALTHY_CONNECTION {
                        backoff.reset();
                    }
                    end
                }
                Err(Failed::Unauthorized) => {
                    report(&format!("fatal daemon {}: token refused", self.index));
                    return;
                }
                Err(Failed::Dial(e)) => {
                    assigned = false;
                    self.say(&e);
                    End::Lost
                }
                Err(Failed::Other(e)) => {
                    self.say(&e);
                    End::Lost
                }
            };
            match end {
                // Unknown or foreign host: register again, redial at once.
                End::Closed(Some(4403)) => host_id = None,
                End::Closed(Some(4401)) => {
                    report(&format!("fatal daemon {}: closed 4401", self.index));
                    return;
                }
                _ => tokio::time::sleep(backoff.next_delay()).await,
            }
        }
    }
}

fn encode(frame: daemon_frame::Frame) -> bytes::Bytes {
    DaemonFrame { frame: Some(frame) }.encode_to_vec().into()
}

fn report(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// The tokens of daemons FIRST..: `@FILE` (line i is daemon i's token) or
/// one token for all.
fn tokens(spec: &str, first: usize, count: usize) -> Vec<String> {
    match spec.strip_prefix('@') {
        Some(path) => {
            let text = std::fs::read_to_string(path).expect("tokens file");
            let tokens: Vec<String> = text.lines().skip(first).take(count).map(str::to_string).collect();
            assert_eq!(tokens.len(), count, "{path} has fewer than {} tokens", first + count);
            tokens
        }
        None => vec![spec.to_string(); count],
    }
}

/// `<example> fake-daemons BASE TOKENS FIRST COUNT`: runs daemons
/// FIRST..FIRST+COUNT (see the module doc); exits when stdin closes.
pub async fn child_main(args: &[String]) {
    raise_nofile();
    let base = args[2].clone();
    let first: usize = args[4].parse().expect("first");
    let count: usize = args[5].parse().expect("count");
    let tokens = tokens(&args[3], first, count);
    std::thread::spawn(|| {
        let mut sink = String::new();
        while std::io::stdin().read_line(&mut sink).map(|n| n > 0).unwrap_or(false) {}
        std::process::exit(0);
    });
    let gate = Rc::new(tokio::sync::Semaphore::new(FIRST_ATTEMPTS_IN_FLIGHT));
    let (tx, mut firsts) = tokio::sync::mpsc::unbounded_channel();
    let mut client = None;
    for (n, token) in tokens.into_iter().enumerate() {
        let index = first + n;
        if index.is_multiple_of(PER_ADDRESS) || client.is_none() {
            client = Some(bound_client(source_address(ADDRESS_BLOCK, index, PER_ADDRESS)));
        }
        let client = client.clone().expect("client");
        let daemon = FakeDaemon { client, base: base.clone(), token, index };
        actix_rt::spawn(daemon.run(gate.clone(), tx.clone()));
    }
    drop(tx);
    let (mut ok, mut failed) = (0, 0);
    while let Some(admitted) = firsts.recv().await {
        if admitted {
            ok += 1;
        } else {
            failed += 1;
        }
        if ok + failed == count {
            break;
        }
    }
    report(&format!("done {ok} {failed}"));
    std::future::pending::<()>().await;
}

// ------------------------------------------------------------------ the benchmark's side

/// One HelloAck: when the benchmark read it, and how long the daemon's
/// WebSocket upgrade and then its wait for HelloAck took.
pub struct Admission {
    pub at: Instant,
    pub upgrade_ms: u32,
    pub ack_ms: u32,
}

/// What a child reported, stamped when the benchmark read it.
enum Event {
    Up(Admission),
    Down,
    Fail(String),
    Done(u64, u64),
    Other(String),
}

/// The fake-daemon processes of one benchmark and the tally of their
/// reports. Dropping it kills them.
pub struct Fleet {
    children: Vec<(Guard, ChildStdin)>,
    tx: tokio::sync::mpsc::UnboundedSender<(Instant, Event)>,
    events: tokio::sync::mpsc::UnboundedReceiver<(Instant, Event)>,
    /// HelloAcks and ends of admitted sockets so far, all children.
    pub ups: u64,
    pub downs: u64,
    /// Each HelloAck, while [`Fleet::record`] is on.
    pub up_times: Vec<Admission>,
    /// Failed attempts by reason, since [`Fleet::record`] last cleared them.
    pub failures: std::collections::BTreeMap<String, u64>,
    recording: bool,
}

impl Default for Fleet {
    fn default() -> Self {
        Self::new()
    }
}

impl Fleet {
    pub fn new() -> Fleet {
        let (tx, events) = tokio::sync::mpsc::unbounded_channel();
        Fleet {
            children: Vec::new(),
            tx,
            events,
            ups: 0,
            downs: 0,
            up_times: Vec::new(),
            failures: Default::default(),
            recording: false,
        }
    }

    /// Daemons online now (HelloAcks minus ends).
    pub fn online(&self) -> u64 {
        self.ups.saturating_sub(self.downs)
    }

    /// Keeps (or stops keeping) the time of every HelloAck from now on;
    /// clears the tally of failures.
    pub fn record(&mut self, on: bool) {
        self.up_times.clear();
        self.failures.clear();
        self.recording = on;
    }

    /// Starts daemons `first..first+count` (tokens as [`child_main`] takes
    /// them) in processes of [`PER_PROCESS`] and waits until every process
    /// reported `done`; answers (admitted, failed) of the first attempts.
    pub async fn grow(&mut self, base: &str, tokens: &str, first: usize, count: usize) -> (u64, u64) {
        let mut pending = 0;
        let mut start = first;
        while start < first + count {
            let n = PER_PROCESS.min(first + count - start);
            let mut cmd = Command::new(std::env::current_exe().expect("exe"));
            cmd.args(["fake-daemons", base, tokens, &start.to_string(), &n.to_string()])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit());
            tie_to_parent(&mut cmd);
            let mut child = cmd.spawn().expect("spawn fake daemons");
            let stdin = child.stdin.take().expect("stdin");
            let stdout = child.stdout.take().expect("stdout");
            let tx = self.tx.clone();
            std::thread::spawn(move || {
                for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                    let event = match line.as_str() {
                        _ if line.starts_with("up") => {
                            let mut ms = line.split(' ').skip(1).map(|v| v.parse::<u32>().unwrap_or(0));
                            let (upgrade_ms, ack_ms) = (ms.next().unwrap_or(0), ms.next().unwrap_or(0));
                            Event::Up(Admission { at: Instant::now(), upgrade_ms, ack_ms })
                        }
                        "down" => Event::Down,
                        _ if line.starts_with("fail ") => Event::Fail(line[5..].to_string()),
                        _ => match line.strip_prefix("done ").and_then(|r| r.split_once(' ')) {
                            Some((ok, failed)) => Event::Done(ok.parse().unwrap_or(0), failed.parse().unwrap_or(0)),
                            None => Event::Other(line),
                        },
                    };
                    if tx.send((Instant::now(), event)).is_err() {
                        break;
                    }
                }
            });
            self.children.push((Guard(child), stdin));
            pending += 1;
            start += n;
        }
        let (mut ok, mut failed) = (0, 0);
        let mut said = Instant::now();
        while pending > 0 {
            let (at, event) = tokio::time::timeout(Duration::from_secs(300), self.events.recv())
                .await
                .expect("fake daemons: nothing for 300 s")
                .expect("fake daemon events");
            if let Event::Done(o, f) = event {
                ok += o;
                failed += f;
                pending -= 1;
            } else {
                self.note(at, event);
            }
            if said.elapsed() > Duration::from_secs(10) {
                println!("  ... {} fake daemons online", self.online());
                said = Instant::now();
            }
        }
        (ok, failed)
    }

    fn note(&mut self, at: Instant, event: Event) {
        match event {
            Event::Up(admission) => {
                self.ups += 1;
                if self.recording {
                    self.up_times.push(Admission { at, ..admission });
                }
            }
            Event::Down => self.downs += 1,
            Event::Fail(reason) => *self.failures.entry(reason).or_default() += 1,
            Event::Done(..) => {}
            Event::Other(line) => println!("  fake daemons: {line}"),
        }
    }

    /// Takes in what the children reported so far.
    pub fn poll(&mut self) {
        while let Ok((at, event)) = self.events.try_recv() {
            self.note(at, event);
        }
    }

    /// Waits until `done` holds of the tally or `timeout` passes; answers
    /// whether it held.
    pub async fn wait_until(&mut self, timeout: Duration, done: impl Fn(&Fleet) -> bool) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        self.poll();
        while !done(self) {
            match tokio::time::timeout_at(deadline, self.events.recv()).await {
                Ok(Some((at, event))) => self.note(at, event),
                _ => return false,
            }
        }
        true
    }
}
