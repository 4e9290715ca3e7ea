//! Output path benchmark (issue 10, section 2): tether against the least
//! a relay can do, on the same workloads in the same run, so the ratios
//! hold on a noisy machine.
//!
//! - **tether**: a real `tether serve` (embedded SQLite) and a real
//!   `tether daemon`, one viewer per terminal over the viewer protocol;
//! - **baseline**: `examples/pty_ws_baseline.rs`, one hop from a PTY to a
//!   WebSocket;
//! - **relayed**: the same baseline behind `pty_ws_baseline --forward`, a
//!   process that only copies bytes: the least a two-hop relay costs (tether
//!   has two: viewer -> server -> daemon), for what the extra hop alone
//!   does to the echo;
//! - **ttyd**, only with `--ttyd PATH`: a ttyd binary (not part of this
//!   repository; 1.7-style protocol, `tty` subprotocol, a command byte
//!   before every message), started with `-W` on a free loopback port.
//!
//! All run `bash --norc +o history` on an 80x24 PTY. Each round runs each,
//! in alternating order (baseline first in odd rounds, last in even ones),
//! on a fresh terminal and socket each:
//!
//! - keystroke echo: `x` typed (a binary frame) until a frame holding its
//!   echo arrives, in bash's readline; `^U` every 40 keys; and the CPU the
//!   system's processes (as for the `cat` below) spent per echo, `^U`s
//!   included: their threads' time on a CPU (`/proc/PID/task/*/schedstat`,
//!   nanoseconds, where the ticks of `stat` are too coarse for it);
//! - `cat` of a text file (lines of 64 bytes, `--mib` MiB, generated once):
//!   the viewer checks the bytes between two markers printed around the
//!   `cat` against the file as the PTY renders it (`\n` -> `\r\n`), byte for
//!   byte. MB/s is those bytes (10^6 a MB) over the time from sending the
//!   command to the end marker's arrival. CPU per 100 MB is utime + stime
//!   (`/proc/PID/stat`, all threads) over that time: `tether serve` plus
//!   `tether daemon`, against the baseline process (the baseline and the
//!   forwarder for relayed; the ttyd process).
//!   None counts bash or `cat`, which are the same for all.
//!
//! Then `--viewers` viewers on one terminal (tether), and as many sockets on
//! one shared PTY (`pty_ws_baseline --shared`), `cat` a `--fanout-mib` file:
//! every viewer must get every byte (checked as above), and it prints the
//! bytes delivered per second to all viewers together and the peak RSS of
//! the server (tether serve, and the daemon) during the `cat`.
//!
//! With `--perf FILE`, after the rounds, one more tether `cat` runs under
//! `perf record` of the daemon and the server (options `--perf-options`,
//! default `-F 999 -g`), written to FILE; it is not counted in the figures.
//!
//! ```sh
//! cargo build --release --bin tether --examples
//! target/release/examples/output_bench [--mib 115] [--rounds 4] [--echo 200] \
//!     [--viewers 100] [--fanout-mib 10] [--perf FILE [--perf-options '-F 999 -g']] \
//!     [--ttyd PATH]
//! ```

mod support;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::rc::Rc;
use std::time::{Duration, Instant};

use actix_http::ws;
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use support::{
    arg, cpu_ns, cpu_ticks, drain, drain_for, kill_terminal, ms, new_terminal, percentile, reset_peak_rss, status_kib,
    ticks_per_second, tie_to_parent, until_live, viewer, websocket, Framed, Guard, Single, Start,
};

/// The shell both systems run.
const SHELL: [&str; 4] = ["bash", "--norc", "+o", "history"];
/// Printed around the `cat`; the typed command line holds `%s` where these
/// hold BEGIN and END, so its echo never matches them.
const BEGIN: &[u8] = b"OUTPUT-BENCH-BEGIN\r\n";
const END: &[u8] = b"OUTPUT-BENCH-END";
/// How long a stream may stay silent before the run counts as stalled.
const STALL: Duration = Duration::from_secs(60);

// ------------------------------------------------------------------ workload

/// A text file of at least `bytes` bytes in `dir`; returns its path and its
/// bytes as a PTY with the default `onlcr` renders them.
fn text_file(dir: &std::path::Path, name: &str, bytes: u64) -> (String, Rc<Vec<u8>>) {
    let path = dir.join(name);
    let mut file = std::io::BufWriter::new(std::fs::File::create(&path).expect("workload file"));
    let mut rendered = Vec::with_capacity(bytes as usize + bytes as usize / 32);
    let mut written = 0u64;
    let mut line_no = 0u64;
    while written < bytes {
        let line = format!("{line_no:010} the quick brown fox jumps over the lazy dog 0123456789\n");
        file.write_all(line.as_bytes()).expect("write workload");
        rendered.extend_from_slice(&line.as_bytes()[..line.len() - 1]);
        rendered.extend_from_slice(b"\r\n");
        written += line.len() as u64;
        line_no += 1;
    }
    file.flush().expect("flush workload");
    (path.to_string_lossy().into_owned(), Rc::new(rendered))
}

fn cat_command(path: &str) -> Vec<u8> {
    format!("printf 'OUTPUT-BENCH-%s\\n' BEGIN; cat {path}; printf 'OUTPUT-BENCH-%s\\n' END\r").into_bytes()
}

/// Checks one viewer's stream against the expected bytes between BEGIN and END.
struct Capture {
    expected: Rc<Vec<u8>>,
    /// Before BEGIN: the last bytes seen, to find it across frames.
    before: Vec<u8>,
    started: bool,
    /// Bytes matched against `expected` so far.
    matched: usize,
    mismatch: bool,
    /// Bytes after the matched ones (none in a correct stream), and the
    /// last of them kept to find END across frames.
    extra: u64,
    tail: Vec<u8>,
    done: bool,
}

impl Capture {
    fn new(expected: Rc<Vec<u8>>) -> Capture {
        Capture {
            expected,
            before: Vec::new(),
            started: false,
            matched: 0,
            mismatch: false,
            extra: 0,
            tail: Vec::new(),
            done: false,
        }
    }

    fn feed(&mut self, chunk: &[u8]) {
        if self.done {
            return;
        }
        if self.started {
            return self.content(chunk);
        }
        self.before.extend_from_slice(chunk);
        match find(&self.before, BEGIN) {
            Some(at) => {
                self.started = true;
                let rest = self.before.split_off(at + BEGIN.len());
                self.before = Vec::new();
                self.content(&rest);
            }
            None => {
                let keep = self.before.len().saturating_sub(BEGIN.len());
                self.before.drain(..keep);
            }
        }
    }

    fn content(&mut self, mut data: &[u8]) {
        if !self.mismatch && self.matched < self.expected.len() {
            let n = data.len().min(self.expected.len() - self.matched);
            if data[..n] == self.expected[self.matched..self.matched + n] {
                self.matched += n;
                data = &data[n..];
            } else {
                self.mismatch = true;
            }
        }
        if data.is_empty() {
            return;
        }
        self.tail.extend_from_slice(data);
        if let Some(at) = find(&self.tail, END) {
            self.extra += at as u64;
            self.done = true;
        } else {
            let dropped = self.tail.len().saturating_sub(END.len() - 1);
            self.extra += dropped as u64;
            self.tail.drain(..dropped);
        }
    }

    /// Bytes between the markers.
    fn received(&self) -> u64 {
        self.matched as u64 + self.extra
    }

    /// Every byte arrived, in order, and nothing else.
    fn exact(&self) -> bool {
        self.done && !self.mismatch && self.matched == self.expected.len() && self.extra == 0
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Reads `framed` until the capture is complete; the time it completed, or
/// why it could not.
async fn capture(framed: &mut Framed, wire: Wire, capture: &mut Capture) -> Result<Instant, String> {
    while !capture.done {
        match tokio::time::timeout(STALL, framed.next()).await {
            Ok(Some(Ok(ws::Frame::Binary(b)))) => capture.feed(wire.output(&b).unwrap_or_default()),
            Ok(Some(Ok(ws::Frame::Close(r)))) => {
                return Err(format!("closed {:?} after {} bytes", r.map(|r| u16::from(r.code)), capture.received()))
            }
            Ok(Some(Ok(_))) => {}
            _ => return Err(format!("stream ended or stalled after {} bytes", capture.received())),
        }
    }
    Ok(Instant::now())
}

// ------------------------------------------------------------------ the two systems

struct Baseline {
    process: Guard,
    addr: String,
    url: String,
}

impl Baseline {
    fn start(shared: bool) -> Baseline {
        Baseline::run(if shared { &["--shared", "--"][..] } else { &["--"] }, true)
    }

    /// A forwarder in front of `to`, the relayed system.
    fn forwarder(to: &Baseline) -> Baseline {
        Baseline::run(&["--forward", &to.addr], false)
    }

    fn run(args: &[&str], shell: bool) -> Baseline {
        let mut cmd = Command::new(support::target_dir_binary("examples/pty_ws_baseline"));
        cmd.args(args);
        if shell {
            cmd.args(SHELL);
        }
        cmd.current_dir("/tmp").stdin(Stdio::null()).stdout(Stdio::piped());
        tie_to_parent(&mut cmd);
        let mut process = Guard(cmd.spawn().expect("spawn pty_ws_baseline (build it with --examples)"));
        let stdout = process.0.stdout.take().expect("baseline stdout");
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).expect("baseline listening line");
        let addr = line.trim().strip_prefix("listening on ").expect("`listening on ADDR`").to_owned();
        let url = format!("ws://{addr}/");
        Baseline { process, addr, url }
    }

    fn pid(&self) -> u32 {
        self.process.0.id()
    }
}

/// ttyd, on a port of its own.
struct Ttyd {
    process: Guard,
    url: String,
}

impl Ttyd {
    async fn start(path: &str) -> Ttyd {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let mut cmd = Command::new(path);
        cmd.args(["-p", &port.to_string(), "-i", "127.0.0.1", "-W", "-w", "/tmp"])
            .args(SHELL)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        tie_to_parent(&mut cmd);
        let process = Guard(cmd.spawn().expect("spawn ttyd (--ttyd PATH)"));
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "ttyd did not listen on port {port} within 10 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ttyd { process, url: format!("ws://127.0.0.1:{port}/ws") }
    }

    /// A socket on a fresh terminal: the `tty` subprotocol, then the
    /// message that starts the terminal.
    async fn open(&self) -> Framed {
        let request = awc::Client::default().ws(&self.url).max_frame_size(8 << 20).protocols(["tty"]);
        let (_, mut framed) = request.connect().await.expect("ttyd socket");
        let start = json!({ "AuthToken": "", "columns": 80, "rows": 24 }).to_string();
        framed.send(ws::Message::Text(start.into())).await.expect("ttyd start message");
        framed
    }

    fn pid(&self) -> u32 {
        self.process.0.id()
    }
}

#[derive(Clone, Copy, PartialEq)]
enum System {
    Baseline,
    Tether,
    Ttyd,
    Relayed,
}

impl System {
    fn name(self) -> &'static str {
        match self {
            System::Baseline => "baseline",
            System::Tether => "tether",
            System::Ttyd => "ttyd",
            System::Relayed => "relayed",
        }
    }
}

/// How terminal bytes travel in a system's binary frames.
#[derive(Clone, Copy)]
enum Wire {
    /// As they are (the baseline; tether's viewer protocol).
    Raw,
    /// After a command byte: `0` for input and for output.
    Ttyd,
}

impl Wire {
    fn input(self, data: &[u8]) -> ws::Message {
        match self {
            Wire::Raw => ws::Message::Binary(data.to_vec().into()),
            Wire::Ttyd => ws::Message::Binary([b"0", data].concat().into()),
        }
    }

    /// The terminal output in a binary frame; none in a frame of another kind.
    fn output(self, frame: &[u8]) -> Option<&[u8]> {
        match self {
            Wire::Raw => Some(frame),
            Wire::Ttyd => frame.strip_prefix(b"0"),
        }
    }
}

struct Systems {
    baseline: Baseline,
    /// A forwarder in front of `baseline`.
    relay: Baseline,
    tether: Single,
    ttyd: Option<Ttyd>,
}

/// A terminal with one viewer socket.
struct Session {
    framed: Framed,
    wire: Wire,
    /// The tether terminal, killed when done.
    terminal: Option<String>,
}

impl Systems {
    /// The processes whose CPU counts for `system`.
    fn pids(&self, system: System) -> Vec<u32> {
        match system {
            System::Baseline => vec![self.baseline.pid()],
            System::Tether => vec![self.tether.instance.pid(), self.tether.daemon_pid()],
            System::Ttyd => self.ttyd.iter().map(Ttyd::pid).collect(),
            System::Relayed => vec![self.baseline.pid(), self.relay.pid()],
        }
    }

    /// The systems measured, in the order of a round.
    fn order(&self, round: usize) -> Vec<System> {
        let mut order = vec![System::Baseline, System::Tether, System::Relayed];
        if self.ttyd.is_some() {
            order.push(System::Ttyd);
        }
        if round.is_multiple_of(2) {
            order.reverse();
        }
        order
    }

    async fn open(&self, system: System) -> Session {
        let mut session = match system {
            System::Baseline => Session {
                framed: websocket(&self.baseline.url, None).await.expect("baseline socket"),
                wire: Wire::Raw,
                terminal: None,
            },
            System::Relayed => Session {
                framed: websocket(&self.relay.url, None).await.expect("relayed baseline socket"),
                wire: Wire::Raw,
                terminal: None,
            },
            System::Ttyd => {
                let ttyd = self.ttyd.as_ref().expect("ttyd is measured only with --ttyd");
                Session { framed: ttyd.open().await, wire: Wire::Ttyd, terminal: None }
            }
            System::Tether => {
                let t = &self.tether;
                let base = t.instance.base();
                let id = new_terminal(&base, &t.token, &t.host, json!(SHELL)).await;
                let mut framed = viewer(&t.instance.ws(), &t.token, &id, "").await.expect("tether viewer");
                let Start::At(_) = until_live(&mut framed).await else { panic!("tether viewer not live") };
                Session { framed, wire: Wire::Raw, terminal: Some(id) }
            }
        };
        // The shell is up once it echoes a key.
        let _ = echo_once(&mut session.framed, session.wire).await;
        clear_line(&mut session.framed, session.wire).await;
        session
    }

    async fn close(&self, mut session: Session) {
        let _ = session.framed.send(ws::Message::Close(None)).await;
        if let Some(id) = session.terminal {
            kill_terminal(&self.tether.instance.base(), &self.tether.token, &id).await;
        }
    }
}

// ------------------------------------------------------------------ measurements

/// One `x` typed until a frame with its echo arrives.
async fn echo_once(framed: &mut Framed, wire: Wire) -> Duration {
    let began = Instant::now();
    let _ = framed.send(wire.input(b"x")).await;
    loop {
        match tokio::time::timeout(Duration::from_secs(10), framed.next()).await {
            Ok(Some(Ok(ws::Frame::Binary(b)))) if wire.output(&b).is_some_and(|out| out.contains(&b'x')) => {
                return began.elapsed()
            }
            Ok(Some(Ok(ws::Frame::Close(r)))) => panic!("socket closed during echo: {r:?}"),
            Ok(Some(Ok(_))) => {}
            Ok(Some(Err(e))) => panic!("echo: {e}"),
            Ok(None) => panic!("echo: the socket ended"),
            Err(_) => panic!("echo: no echo within 10 s"),
        }
    }
}

/// `^U` (readline's unix-line-discard) and the redisplay it causes.
async fn clear_line(framed: &mut Framed, wire: Wire) {
    let _ = framed.send(wire.input(&[0x15])).await;
    drain_for(framed, Duration::from_millis(50)).await;
}

async fn echoes(framed: &mut Framed, wire: Wire, rounds: usize) -> Vec<Duration> {
    let mut echoes = Vec::with_capacity(rounds);
    for i in 0..rounds {
        echoes.push(echo_once(framed, wire).await);
        if i % 40 == 39 {
            clear_line(framed, wire).await;
        }
    }
    clear_line(framed, wire).await;
    echoes
}

/// CPU seconds of `pids` (and of this benchmark, the client) across `f`.
struct Cpu {
    ticks: Vec<u64>,
    client: u64,
}

impl Cpu {
    fn read(pids: &[u32]) -> Cpu {
        Cpu { ticks: pids.iter().map(|&pid| cpu_ticks(pid)).collect(), client: cpu_ticks(std::process::id()) }
    }

    /// Seconds per process since `before`, and the client's.
    fn since(before: &Cpu, pids: &[u32]) -> (Vec<f64>, f64) {
        let now = Cpu::read(pids);
        let hz = ticks_per_second();
        let per = now.ticks.iter().zip(&before.ticks).map(|(a, b)| a.saturating_sub(*b) as f64 / hz).collect();
        (per, now.client.saturating_sub(before.client) as f64 / hz)
    }
}

struct CatRun {
    mb_per_s: f64,
    /// CPU seconds per process of the system (see `Systems::pids`).
    cpu: Vec<f64>,
    client_cpu: f64,
    seconds: f64,
}

impl CatRun {
    fn cpu_per_100mb(&self, bytes: usize) -> f64 {
        self.cpu.iter().sum::<f64>() * 100e6 / bytes as f64
    }
}

async fn cat(session: &mut Session, pids: &[u32], path: &str, expected: &Rc<Vec<u8>>) -> Result<CatRun, String> {
    let (framed, wire) = (&mut session.framed, session.wire);
    drain(framed).await;
    let before = Cpu::read(pids);
    let began = Instant::now();
    let _ = framed.send(wire.input(&cat_command(path))).await;
    let mut check = Capture::new(expected.clone());
    let finished = capture(framed, wire, &mut check).await?;
    let (cpu, client_cpu) = Cpu::since(&before, pids);
    if !check.exact() {
        return Err(format!("wrong bytes: {} of {} matched, {} others", check.matched, expected.len(), check.extra));
    }
    let seconds = finished.duration_since(began).as_secs_f64();
    Ok(CatRun { mb_per_s: expected.len() as f64 / 1e6 / seconds, cpu, client_cpu, seconds })
}

struct FanOut {
    viewers: usize,
    exact: usize,
    failures: Vec<String>,
    seconds: f64,
    delivered: u64,
    cpu: Vec<f64>,
    client_cpu: f64,
    /// (RSS before, peak RSS during) in KiB per process of the system.
    rss: Vec<(u64, u64)>,
}

/// `viewers` sockets on one terminal; the first types the `cat`.
async fn fan_out(mut sockets: Vec<Framed>, pids: &[u32], path: &str, expected: &Rc<Vec<u8>>) -> FanOut {
    for framed in &mut sockets {
        drain(framed).await;
    }
    let rss_before: Vec<u64> = pids.iter().map(|&pid| status_kib(pid, "VmRSS")).collect();
    for &pid in pids {
        reset_peak_rss(pid);
    }
    let viewers = sockets.len();
    let before = Cpu::read(pids);
    let began = Instant::now();
    let _ = sockets[0].send(ws::Message::Binary(cat_command(path).into())).await;
    let tasks: Vec<_> = sockets
        .into_iter()
        .map(|mut framed| {
            let expected = expected.clone();
            actix_rt::spawn(async move {
                let mut check = Capture::new(expected);
                let result = capture(&mut framed, Wire::Raw, &mut check).await;
                let _ = framed.send(ws::Message::Close(None)).await;
                (result, check.exact(), check.received())
            })
        })
        .collect();
    let mut run = FanOut {
        viewers,
        exact: 0,
        failures: Vec::new(),
        seconds: 0.0,
        delivered: 0,
        cpu: Vec::new(),
        client_cpu: 0.0,
        rss: Vec::new(),
    };
    let mut last = began;
    for task in tasks {
        match task.await {
            Ok((Ok(at), exact, received)) => {
                last = last.max(at);
                run.delivered += received;
                if exact {
                    run.exact += 1;
                } else {
                    run.failures.push(format!("{received} bytes, not the file's"));
                }
            }
            Ok((Err(why), _, received)) => {
                run.delivered += received;
                run.failures.push(why);
            }
            Err(e) => run.failures.push(format!("viewer task: {e}")),
        }
    }
    (run.cpu, run.client_cpu) = Cpu::since(&before, pids);
    run.rss = pids.iter().zip(rss_before).map(|(&pid, before)| (before, status_kib(pid, "VmHWM"))).collect();
    run.seconds = last.duration_since(began).as_secs_f64();
    run
}

/// `perf record` of `pids` until dropped (SIGINT, so it writes its file).
struct Perf(Option<std::process::Child>);

impl Perf {
    fn start(pids: &[u32], file: &str, options: &str) -> Perf {
        let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
        let child = Command::new("perf")
            .arg("record")
            .args(options.split_whitespace())
            .args(["-o", file, "-p", &pids.join(",")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("perf (Debian: linux-perf)");
        // perf needs a moment to attach to every thread.
        std::thread::sleep(Duration::from_millis(500));
        Perf(Some(child))
    }
}

impl Drop for Perf {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            if let Ok(pid) = libc::pid_t::try_from(child.id()) {
                // SAFETY: kill(2) takes plain integers and touches no memory of ours.
                unsafe { libc::kill(pid, libc::SIGINT) };
            }
            let _ = child.wait();
        }
    }
}

// ------------------------------------------------------------------ report

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg").unwrap_or_default().split_whitespace().next().unwrap_or("?").to_owned()
}

/// The median of the values that are not NaN (a failed run).
fn median(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|v| !v.is_nan()).collect();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    let mid = v.len() / 2;
    if v.len().is_multiple_of(2) {
        (v[mid - 1] + v[mid]) / 2.0
    } else {
        v[mid]
    }
}

fn range(values: &[f64]) -> (f64, f64) {
    values
        .iter()
        .filter(|v| !v.is_nan())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(*v), hi.max(*v)))
}

fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "MISSED"
    }
}

#[derive(Default)]
struct Figures {
    mb_per_s: Vec<f64>,
    cpu_per_100mb: Vec<f64>,
    echoes: Vec<Duration>,
    echo_p99: Vec<f64>,
    /// CPU microseconds of the system's processes per echo, per round.
    cpu_per_echo: Vec<f64>,
}

/// The medians of all rounds, their ratios and the goals (issue 10):
/// tether against the baseline, against the relayed baseline (the least
/// two hops cost, no goal), and against ttyd when it ran.
fn summary(figures: &mut [Figures; 4], rounds: usize) {
    for f in figures.iter_mut() {
        f.echoes.sort();
    }
    println!();
    println!("summary over {rounds} rounds (median, and min..max of the runs):");
    let systems = [System::Baseline, System::Tether, System::Ttyd, System::Relayed];
    for (system, f) in systems.into_iter().zip(figures.iter()) {
        if f.mb_per_s.is_empty() {
            continue;
        }
        let (lo, hi) = range(&f.mb_per_s);
        let (clo, chi) = range(&f.cpu_per_100mb);
        println!(
            "  {:<8} cat {:.1} MB/s ({lo:.1}..{hi:.1}); CPU {:.2} s per 100 MB ({clo:.2}..{chi:.2}); echo over {} keys p50 {:.3} ms p99 {:.3} ms, CPU {:.0} us per echo",
            system.name(),
            median(&f.mb_per_s),
            median(&f.cpu_per_100mb),
            f.echoes.len(),
            ms(percentile(&f.echoes, 0.5)),
            ms(percentile(&f.echoes, 0.99)),
            median(&f.cpu_per_echo),
        );
    }
    let [b, t, d, r] = &*figures;
    ratios((t, "tether"), (b, "baseline"), [Some(0.9), Some(1.3), Some(1.5)]);
    ratios((r, "relayed"), (b, "baseline"), [None, None, None]);
    ratios((t, "tether"), (r, "relayed"), [None, None, None]);
    if !d.mb_per_s.is_empty() {
        ratios((t, "tether"), (d, "ttyd"), [Some(1.0), None, None]);
    }
}

/// One system's figures over another's, with the goals for cat MB/s (at
/// least), echo p99 and CPU per 100 MB (at most), where there are goals.
fn ratios(
    (t, name_t): (&Figures, &str),
    (other, name): (&Figures, &str),
    [mb_goal, p99_goal, cpu_goal]: [Option<f64>; 3],
) {
    let pair_ratios = |tv: &[f64], ov: &[f64]| -> Vec<f64> { tv.iter().zip(ov).map(|(t, o)| t / o).collect() };
    let show = |v: &[f64]| v.iter().map(|r| format!("{r:.2}")).collect::<Vec<_>>().join(" ");
    let goal = |ratio: f64, goal: Option<f64>, at_least: bool| match goal {
        Some(g) if at_least => format!("  goal >= {g}: {}", verdict(ratio >= g)),
        Some(g) => format!("  goal <= {g}: {}", verdict(ratio <= g)),
        None => String::new(),
    };
    let mb_ratio = median(&t.mb_per_s) / median(&other.mb_per_s);
    let p50_ratio = ms(percentile(&t.echoes, 0.5)) / ms(percentile(&other.echoes, 0.5));
    let p99_ratio = ms(percentile(&t.echoes, 0.99)) / ms(percentile(&other.echoes, 0.99));
    let cpu_ratio = median(&t.cpu_per_100mb) / median(&other.cpu_per_100mb);
    println!("ratios {name_t}/{name} (of the medians; per round in brackets):");
    println!(
        "  cat MB/s        {mb_ratio:.2}  [{}]{}",
        show(&pair_ratios(&t.mb_per_s, &other.mb_per_s)),
        goal(mb_ratio, mb_goal, true)
    );
    println!("  echo p50        {p50_ratio:.2}");
    println!(
        "  echo p99        {p99_ratio:.2}  [{}]{}",
        show(&pair_ratios(&t.echo_p99, &other.echo_p99)),
        goal(p99_ratio, p99_goal, false)
    );
    println!(
        "  CPU per 100 MB  {cpu_ratio:.2}  [{}]{}",
        show(&pair_ratios(&t.cpu_per_100mb, &other.cpu_per_100mb)),
        goal(cpu_ratio, cpu_goal, false)
    );
    println!(
        "  CPU per echo    {:.2}  [{}]",
        median(&t.cpu_per_echo) / median(&other.cpu_per_echo),
        show(&pair_ratios(&t.cpu_per_echo, &other.cpu_per_echo))
    );
}

#[actix_rt::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mib: u64 = arg(&args, "--mib", 115);
    let rounds: usize = arg(&args, "--rounds", 4);
    let echo_rounds: usize = arg(&args, "--echo", 200);
    let viewers: usize = arg(&args, "--viewers", 100);
    let fanout_mib: u64 = arg(&args, "--fanout-mib", 10);
    let perf_file: String = arg(&args, "--perf", String::new());
    let perf_options: String = arg(&args, "--perf-options", "-F 999 -g".to_owned());
    let ttyd_path: String = arg(&args, "--ttyd", String::new());

    let work = tempfile::Builder::new().prefix("output-bench-").tempdir_in("/tmp").expect("temp dir");
    let (big, big_expected) = text_file(work.path(), "cat.txt", mib << 20);
    let (small, small_expected) = text_file(work.path(), "fanout.txt", fanout_mib << 20);
    println!(
        "output_bench: {} MB to cat ({} MiB file), {} MB per viewer for {viewers} viewers, {rounds} rounds, {echo_rounds} echoes per run",
        big_expected.len() as f64 / 1e6,
        mib,
        small_expected.len() as f64 / 1e6,
    );
    let ttyd = if ttyd_path.is_empty() { None } else { Some(Ttyd::start(&ttyd_path).await) };
    let baseline = Baseline::start(false);
    let relay = Baseline::forwarder(&baseline);
    let systems = Systems { baseline, relay, tether: Single::start().await, ttyd };
    println!(
        "output_bench: pids: baseline {}, its forwarder {}, tether serve {}, tether daemon {}; logs in {}",
        systems.baseline.pid(),
        systems.relay.pid(),
        systems.tether.instance.pid(),
        systems.tether.daemon_pid(),
        systems.tether.dir.path().display()
    );
    if let Some(ttyd) = &systems.ttyd {
        println!("output_bench: ttyd {} at {}", ttyd.pid(), ttyd.url);
    }

    let mut figures = [Figures::default(), Figures::default(), Figures::default(), Figures::default()];
    for round in 1..=rounds {
        for system in systems.order(round) {
            let load = load_average();
            let pids = systems.pids(system);
            let mut session = systems.open(system).await;
            let before: Vec<u64> = pids.iter().map(|&pid| cpu_ns(pid)).collect();
            let mut echo = echoes(&mut session.framed, session.wire, echo_rounds).await;
            let echo_cpu: Vec<f64> = pids
                .iter()
                .zip(before)
                .map(|(&pid, before)| cpu_ns(pid).saturating_sub(before) as f64 / 1e3 / echo_rounds.max(1) as f64)
                .collect();
            echo.sort();
            let run = cat(&mut session, &pids, &big, &big_expected).await;
            systems.close(session).await;
            let f = &mut figures[system as usize];
            let p99 = ms(percentile(&echo, 0.99));
            f.echo_p99.push(p99);
            f.echoes.extend(echo.iter().copied());
            f.cpu_per_echo.push(echo_cpu.iter().sum());
            let echo_cpu: Vec<String> = echo_cpu.iter().map(|us| format!("{us:.0}")).collect();
            let echo_text = format!(
                "echo p50 {:.3} ms p99 {:.3} ms, CPU {} us per echo",
                ms(percentile(&echo, 0.5)),
                p99,
                echo_cpu.join(" + ")
            );
            match run {
                Ok(run) => {
                    let per_100 = run.cpu_per_100mb(big_expected.len());
                    f.mb_per_s.push(run.mb_per_s);
                    f.cpu_per_100mb.push(per_100);
                    let cpu: Vec<String> = run.cpu.iter().map(|c| format!("{c:.2}")).collect();
                    println!(
                        "round {round} {:<8} load {load}: {echo_text}; cat {:.1} MB/s ({:.2} s), CPU {} s = {:.2} s per 100 MB (client {:.2} s)",
                        system.name(),
                        run.mb_per_s,
                        run.seconds,
                        cpu.join(" + "),
                        per_100,
                        run.client_cpu,
                    );
                }
                Err(why) => {
                    // Keeps the rounds of the systems paired; the figures skip it.
                    f.mb_per_s.push(f64::NAN);
                    f.cpu_per_100mb.push(f64::NAN);
                    println!("round {round} {:<8} load {load}: {echo_text}; cat FAILED: {why}", system.name());
                }
            }
        }
    }

    if rounds > 0 {
        summary(&mut figures, rounds);
    }

    if viewers > 0 {
        println!();
        let shared = Baseline::start(true);
        for (n, system) in [System::Baseline, System::Tether, System::Tether, System::Baseline].into_iter().enumerate()
        {
            let load = load_average();
            let (mut sockets, pids, terminal) = match system {
                System::Baseline => {
                    let mut sockets = Vec::new();
                    for _ in 0..viewers {
                        sockets.push(websocket(&shared.url, None).await.expect("baseline socket"));
                    }
                    (sockets, vec![shared.pid()], None)
                }
                System::Tether => {
                    let tt = &systems.tether;
                    let id = new_terminal(&tt.instance.base(), &tt.token, &tt.host, json!(SHELL)).await;
                    let mut sockets = Vec::new();
                    for _ in 0..viewers {
                        let mut framed = viewer(&tt.instance.ws(), &tt.token, &id, "").await.expect("tether viewer");
                        let Start::At(_) = until_live(&mut framed).await else { panic!("viewer not live") };
                        sockets.push(framed);
                    }
                    (sockets, systems.pids(system), Some(id))
                }
                // ttyd starts a terminal per socket: it has no fan-out to
                // compare; the relayed baseline's is the baseline's.
                System::Ttyd | System::Relayed => unreachable!("the fan-out runs the baseline and tether"),
            };
            let _ = echo_once(&mut sockets[0], Wire::Raw).await;
            clear_line(&mut sockets[0], Wire::Raw).await;
            let run = fan_out(sockets, &pids, &small, &small_expected).await;
            if let Some(id) = terminal {
                kill_terminal(&systems.tether.instance.base(), &systems.tether.token, &id).await;
            }
            let names: &[&str] = match system {
                System::Baseline => &["baseline"],
                System::Tether => &["serve", "daemon"],
                System::Ttyd | System::Relayed => unreachable!("the fan-out runs the baseline and tether"),
            };
            let rss: Vec<String> = names
                .iter()
                .zip(&run.rss)
                .map(|(name, (before, peak))| {
                    format!("{name} {:.1} -> peak {:.1} MiB", *before as f64 / 1024.0, *peak as f64 / 1024.0)
                })
                .collect();
            let cpu: Vec<String> = run.cpu.iter().map(|c| format!("{c:.2}")).collect();
            println!(
                "fan-out {} {:<8} load {load}: {}/{} viewers got every byte; {:.1} MB delivered in {:.2} s = {:.1} MB/s in all; RSS {}; CPU {} s (client {:.2} s)",
                n + 1,
                system.name(),
                run.exact,
                run.viewers,
                run.delivered as f64 / 1e6,
                run.seconds,
                run.delivered as f64 / 1e6 / run.seconds,
                rss.join(", "),
                cpu.join(" + "),
                run.client_cpu,
            );
            for why in run.failures.iter().take(5) {
                println!("  failed viewer: {why}");
            }
        }
    }

    if !perf_file.is_empty() {
        let pids = systems.pids(System::Tether);
        let mut session = systems.open(System::Tether).await;
        let run = {
            let _perf = Perf::start(&pids, &perf_file, &perf_options);
            cat(&mut session, &pids, &big, &big_expected).await
        };
        systems.close(session).await;
        match run {
            Ok(run) => {
                println!("\nperf: tether cat under perf record: {:.1} MB/s; profile in {perf_file}", run.mb_per_s)
            }
            Err(why) => println!("\nperf: tether cat under perf record FAILED: {why}"),
        }
    }
}
