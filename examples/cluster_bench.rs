//! Cluster benchmark (issue 6, section 4): three real `tether serve`
//! instances A, B and C on this machine sharing one PostgreSQL and one
//! standalone Redis, a real `tether daemon` (real PTYs) dialing A through a
//! small TCP balancer (A first, B when A refuses), and viewers on the
//! instances. Prints:
//!
//! - keystroke echo p50/p99 with the viewer on the owner (A) and on another
//!   instance (B), alternating blocks so machine noise shows;
//! - output MiB/s to one viewer on A vs on B, alternating runs, and the ratio;
//! - PostgreSQL statements per lease-renew tick with N connected fake
//!   daemons on A (default 1,000 and 10,000): fake daemons register with
//!   the real `POST /api/v1/hosts`, send the real protobuf Hello over
//!   `/ws/v1/daemon` and then idle, pinging every 30 s. Statements are
//!   counted with `pg_stat_statements` (filtered to the benchmark's
//!   database, utility statements such as BEGIN/COMMIT included) over a
//!   window; ticks are the instances' `tether_lease_renew_seconds_count`
//!   deltas from `/metrics`; `pg_stat_database.xact_commit` is printed as a
//!   cross-check; after each window, a paced echo on A (one key per 20 ms
//!   for 12 s) with the daemons still connected, naming the slow echoes;
//! - failover: SIGKILL of A while a viewer on C streams a terminal that
//!   prints its clock every 20 ms, until that viewer (reattached with
//!   `?from=`) receives a line printed after the kill.
//!
//! Fake daemons run in child processes of this program (`cluster_bench
//! fake-daemons ...`, at most 2,500 sockets each, under the 20,000 open-file
//! limit) and bind their sockets to 127.1.x.y source addresses, 200 per
//! address, under the server's default `http.ws_per_address` (256).
//!
//! Needs `TETHER_BENCH_DATABASE_URL` (a PostgreSQL server URL whose server
//! preloads pg_stat_statements) and `TETHER_BENCH_REDIS_URL`;
//! `TETHER_BENCH_SERVE_ENV` (optional, `KEY=VALUE` pairs separated by
//! spaces) adds settings to the three instances, e.g.
//! `TETHER_LEASE__RENEW_MS=3000`. `scripts/cluster-bench` starts both
//! servers, builds and runs this:
//!
//! ```sh
//! scripts/cluster-bench [--daemons 1000,10000] [--mib 100] [--echo 200] [--window 31]
//! ```

mod support;

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::net::{IpAddr, Ipv4Addr};
use std::process::{ChildStdin, Command, Stdio};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use actix_http::ws;
use futures_util::{SinkExt, StreamExt};
use prost::Message as _;
use serde_json::{json, Value};
use support::{
    api, arg, cpu_ticks, create_token, drain, drain_now, ms, new_terminal, online_host, percentile, start_daemon,
    start_instance, ticks_per_second, tie_to_parent, until_live, viewer, Framed, Guard, Instance, Start,
};
use tether::proto::v1::{daemon_frame, server_frame, Capabilities, DaemonFrame, Hello, Ping, ServerFrame};

/// Sockets per fake-daemon process and per source address.
const PER_PROCESS: usize = 2_500;
const PER_ADDRESS: usize = 200;

// ------------------------------------------------------------------ processes

/// When the balancer forwarded a connection to a backend other than the
/// first (the daemon's redial after A died).
type Redials = Rc<std::cell::RefCell<Vec<Instant>>>;

/// A plain TCP balancer: each connection goes to the first backend that
/// accepts it (A while it lives, then B).
async fn start_balancer(backends: Vec<String>, redials: Redials) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind balancer");
    let addr = listener.local_addr().expect("balancer addr").to_string();
    actix_rt::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let backends = backends.clone();
            let redials = redials.clone();
            actix_rt::spawn(async move {
                for (n, backend) in backends.iter().enumerate() {
                    if let Ok(mut server) = tokio::net::TcpStream::connect(backend).await {
                        if n > 0 {
                            redials.borrow_mut().push(Instant::now());
                        }
                        let _ = server.set_nodelay(true);
                        let _ = client.set_nodelay(true);
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                        return;
                    }
                }
            });
        }
    });
    addr
}

// ------------------------------------------------------------------ REST and viewers

async fn echo_block(framed: &mut Framed, rounds: usize) -> Vec<Duration> {
    let mut echoes = Vec::with_capacity(rounds);
    for i in 0..rounds {
        let key = [b'a' + (i % 26) as u8];
        let began = Instant::now();
        let _ = framed.send(ws::Message::Binary(key.to_vec().into())).await;
        loop {
            match tokio::time::timeout(Duration::from_secs(10), framed.next()).await {
                Ok(Some(Ok(ws::Frame::Binary(b)))) if b.contains(&key[0]) => break,
                Ok(Some(Ok(ws::Frame::Close(r)))) => panic!("viewer closed during echo: {r:?}"),
                Ok(Some(Ok(_))) => {}
                Ok(Some(Err(e))) => panic!("echo: {e}"),
                Ok(None) => panic!("echo: the viewer socket ended"),
                Err(_) => panic!("echo: no echo within 10 s"),
            }
        }
        echoes.push(began.elapsed());
        if i % 50 == 49 {
            // ^U: keep cat's line short.
            let _ = framed.send(ws::Message::Binary(vec![0x15].into())).await;
            tokio::time::sleep(Duration::from_millis(20)).await;
            drain(framed).await;
        }
    }
    let _ = framed.send(ws::Message::Binary(vec![0x15].into())).await;
    echoes
}

/// Echo on the owner, one key every 20 ms for 12 s (more than one renew
/// tick), with the fake daemons connected.
async fn echo_paced(inst: &Instance, token: &str, id: &str, label: &str) {
    let mut framed = viewer(&inst.ws(), token, id, "").await.expect("echo viewer");
    let Start::At(_) = until_live(&mut framed).await else { panic!("echo viewer not live") };
    drain(&mut framed).await;
    let mut echoes = Vec::new();
    let began = Instant::now();
    while began.elapsed() < Duration::from_secs(12) {
        echoes.extend(echo_block(&mut framed, 1).await);
        tokio::time::sleep(Duration::from_millis(20)).await;
        drain_now(&mut framed);
    }
    let mut at = Duration::ZERO;
    let slow: Vec<String> = echoes
        .iter()
        .filter_map(|e| {
            at += *e + Duration::from_millis(20);
            (*e >= Duration::from_millis(50)).then(|| format!("{:.0} ms at {:.1} s", ms(*e), at.as_secs_f64()))
        })
        .collect();
    println!(
        "  echoes >= 50 ms (at about this far into the 12 s): {}",
        if slow.is_empty() { "none".into() } else { slow.join(", ") }
    );
    echoes.sort();
    println!(
        "  keystroke echo on A with {label}, one key per ~20 ms for 12 s, {} rounds: p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
        echoes.len(),
        ms(percentile(&echoes, 0.5)),
        ms(percentile(&echoes, 0.99)),
        ms(percentile(&echoes, 1.0))
    );
}

/// One flood of `mib` MiB through a fresh viewer; MiB/s, or why it failed.
async fn flood(ws_base: &str, token: &str, id: &str, mib: u64) -> Result<(f64, Duration), String> {
    let mut framed = viewer(ws_base, token, id, "").await?;
    if let Start::Closed(code) = until_live(&mut framed).await {
        return Err(format!("closed {code:?} before live"));
    }
    drain(&mut framed).await;
    let _ = framed.send(ws::Message::Text(json!({"type": "input", "data": "go\n"}).to_string().into())).await;
    let began = Instant::now();
    let mut bytes = 0u64;
    let mut tail = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(60), framed.next()).await {
            Ok(Some(Ok(ws::Frame::Binary(b)))) => {
                bytes += b.len() as u64;
                tail.extend_from_slice(&b[b.len().saturating_sub(64)..]);
                if tail.len() > 256 {
                    tail.drain(..tail.len() - 128);
                }
                if String::from_utf8_lossy(&tail).contains("bench-done") {
                    break;
                }
            }
            Ok(Some(Ok(ws::Frame::Close(r)))) => {
                return Err(format!("closed {:?} after {} MiB", r.map(|r| u16::from(r.code)), bytes >> 20))
            }
            Ok(Some(Ok(_))) => {}
            _ => return Err(format!("stream ended or stalled after {} MiB", bytes >> 20)),
        }
    }
    let elapsed = began.elapsed();
    let _ = framed.send(ws::Message::Close(None)).await;
    // Wait for the flood's tail to be read, so the next run starts clean.
    let _ =
        tokio::time::timeout(Duration::from_secs(2), async { while let Some(Ok(_)) = framed.next().await {} }).await;
    let expected = mib << 20;
    if bytes < expected {
        return Err(format!("only {bytes} of {expected} bytes"));
    }
    Ok((bytes as f64 / (1 << 20) as f64 / elapsed.as_secs_f64(), elapsed))
}

// ------------------------------------------------------------------ PostgreSQL

async fn pg(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.expect("connect PostgreSQL");
    actix_rt::spawn(async move {
        let _ = conn.await;
    });
    client
}

fn with_database(server_url: &str, db: &str) -> String {
    let (base, query) = server_url.split_once('?').map_or((server_url, None), |(b, q)| (b, Some(q)));
    let start = base.find("://").expect("postgres:// URL") + 3;
    let end = base[start..].find('/').map_or(base.len(), |i| start + i);
    let mut url = format!("{}/{db}", &base[..end]);
    if let Some(q) = query {
        url.push('?');
        url.push_str(q);
    }
    url
}

struct Sample {
    renews: BTreeMap<&'static str, u64>,
    xact_commit: i64,
    cpu_ticks: BTreeMap<&'static str, u64>,
}

async fn metric(base: &str, name: &str) -> u64 {
    let client = awc::Client::default();
    let Ok(mut res) = client.get(format!("{base}/metrics")).send().await else { return 0 };
    let body = res.body().limit(16 << 20).await.unwrap_or_default();
    String::from_utf8_lossy(&body)
        .lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

async fn sample(instances: &[&Instance], admin: &tokio_postgres::Client, db: &str) -> Sample {
    let mut renews = BTreeMap::new();
    let mut cpu = BTreeMap::new();
    for i in instances {
        renews.insert(i.name, metric(&i.base(), "tether_lease_renew_seconds_count").await);
        cpu.insert(i.name, cpu_ticks(i.pid()));
    }
    let row =
        admin.query_one("SELECT xact_commit FROM pg_stat_database WHERE datname = $1", &[&db]).await.expect("stat");
    Sample { renews, xact_commit: row.get(0), cpu_ticks: cpu }
}

/// Statements counted in a window of `window` with the daemons idle.
async fn count_statements(
    label: &str,
    instances: &[&Instance],
    admin: &tokio_postgres::Client,
    db: &str,
    window: Duration,
    fleet: &mut FakeFleet,
) {
    // Let the hellos' own statements and the last renews finish.
    tokio::time::sleep(Duration::from_secs(3)).await;
    admin.batch_execute("SELECT pg_stat_statements_reset()").await.expect("reset pg_stat_statements");
    fleet.poll();
    let lost_before = fleet.lost.load(Ordering::Relaxed);
    let before = sample(instances, admin, db).await;
    let began = Instant::now();
    tokio::time::sleep(window).await;
    let after = sample(instances, admin, db).await;
    let elapsed = began.elapsed();
    fleet.poll();
    let rows = admin
        .query(
            "SELECT s.calls, s.rows, s.query FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid \
             WHERE d.datname = $1 ORDER BY s.calls DESC",
            &[&db],
        )
        .await
        .expect("read pg_stat_statements");
    let ticks: u64 = instances.iter().map(|i| after.renews[i.name].saturating_sub(before.renews[i.name])).sum();
    let per_instance: Vec<String> = instances
        .iter()
        .map(|i| format!("{} {}", i.name, after.renews[i.name].saturating_sub(before.renews[i.name])))
        .collect();
    let total: i64 = rows.iter().map(|r| r.get::<_, i64>(0)).sum();
    // The renewal (and, in builds before it was folded into the same
    // statement, the hosts' last-seen touch that followed it).
    let is_renew_tick = |q: &str| {
        q.starts_with("WITH renewed AS ( UPDATE leases")
            || q.starts_with("UPDATE leases l SET expires_at")
            || q.starts_with("UPDATE hosts SET last_seen_at")
    };
    let tick_statements: i64 =
        rows.iter().filter(|r| is_renew_tick(r.get::<_, &str>(2))).map(|r| r.get::<_, i64>(0)).sum();
    println!(
        "statements, {label}: window {:.1?}, renew ticks {ticks} ({}), daemons lost in window {}",
        elapsed,
        per_instance.join(", "),
        fleet.lost.load(Ordering::Relaxed) - lost_before
    );
    for r in &rows {
        let (calls, n, q): (i64, i64, &str) = (r.get(0), r.get(1), r.get(2));
        let q: String = q.split_whitespace().collect::<Vec<_>>().join(" ");
        println!("    {calls:>6} calls {n:>7} rows  {}", &q[..q.len().min(110)]);
    }
    println!(
        "  => renew-tick statements per tick: {:.2} ({} statements / {} ticks); all statements in the window: {} \
         ({:.2} per tick); xact_commit delta {}",
        tick_statements as f64 / ticks.max(1) as f64,
        tick_statements,
        ticks,
        total,
        total as f64 / ticks.max(1) as f64,
        after.xact_commit - before.xact_commit
    );
    let hz = ticks_per_second();
    let cpu: Vec<String> = instances
        .iter()
        .map(|i| {
            let t = after.cpu_ticks[i.name].saturating_sub(before.cpu_ticks[i.name]) as f64 / hz;
            format!("{} {:.2} s ({:.1} %)", i.name, t, 100.0 * t / elapsed.as_secs_f64())
        })
        .collect();
    println!("  CPU of the instances over the window: {}", cpu.join(", "));
}

// ------------------------------------------------------------------ fake daemons

/// Source address of fake daemon `i`: 127.1.x.y, PER_ADDRESS daemons each.
fn source_address(i: usize) -> IpAddr {
    let n = i / PER_ADDRESS;
    IpAddr::V4(Ipv4Addr::new(127, 1, (n / 250) as u8, (n % 250 + 1) as u8))
}

fn encode(frame: daemon_frame::Frame) -> bytes::Bytes {
    DaemonFrame { frame: Some(frame) }.encode_to_vec().into()
}

/// Registers, says hello, waits for HelloAck; then idles with pings.
async fn fake_daemon(
    client: &awc::Client,
    base: &str,
    token: &str,
    i: usize,
    lost: Rc<AtomicU64>,
) -> Result<(), String> {
    let hostname = format!("bench-fake-{i:05}");
    let body = json!({"name": hostname, "hostname": hostname, "platform": "linux", "arch": "x86_64"});
    let mut res = client
        .post(format!("{base}/api/v1/hosts"))
        .bearer_auth(token)
        .send_json(&body)
        .await
        .map_err(|e| format!("register: {e}"))?;
    let reg: Value = res.json().await.map_err(|e| format!("register body: {e}"))?;
    let host_id = reg["host"]["id"].as_str().ok_or_else(|| format!("register answered {reg}"))?.to_string();
    let ws_url = format!("{}/ws/v1/daemon", base.replacen("http", "ws", 1));
    let (_, mut framed) = client
        .ws(ws_url.as_str())
        .bearer_auth(token)
        .protocols(["tether.daemon.v1"])
        .max_frame_size(1 << 20)
        .connect()
        .await
        .map_err(|e| format!("ws: {e}"))?;
    let hello = Hello {
        host_id,
        daemon_version: "cluster-bench-fake".into(),
        capabilities: Some(Capabilities { flow_control: true, ..Default::default() }),
        dirs: vec![],
        terminals: vec![],
        booking: None,
    };
    framed.send(ws::Message::Binary(encode(daemon_frame::Frame::Hello(hello)))).await.map_err(|e| e.to_string())?;
    loop {
        match tokio::time::timeout(Duration::from_secs(60), framed.next()).await {
            Ok(Some(Ok(ws::Frame::Binary(b)))) => {
                let frame = ServerFrame::decode(b.as_ref()).map_err(|e| e.to_string())?;
                if let Some(server_frame::Frame::HelloAck(_)) = frame.frame {
                    break;
                }
            }
            Ok(Some(Ok(ws::Frame::Ping(p)))) => {
                let _ = framed.send(ws::Message::Pong(p)).await;
            }
            Ok(Some(Ok(ws::Frame::Close(r)))) => return Err(format!("closed before HelloAck: {r:?}")),
            Ok(Some(Ok(_))) => {}
            Ok(Some(Err(e))) => return Err(format!("before HelloAck: {e}")),
            Ok(None) => return Err("ended before HelloAck".into()),
            Err(_) => return Err("no HelloAck within 60 s".into()),
        }
    }
    actix_rt::spawn(async move {
        let mut ping =
            tokio::time::interval_at(tokio::time::Instant::now() + Duration::from_secs(30), Duration::from_secs(30));
        loop {
            tokio::select! {
                frame = framed.next() => match frame {
                    Some(Ok(ws::Frame::Ping(p))) => { let _ = framed.send(ws::Message::Pong(p)).await; }
                    Some(Ok(ws::Frame::Close(r))) => {
                        if lost.fetch_add(1, Ordering::Relaxed) < 3 {
                            eprintln!("fake daemon {i} closed: {r:?}");
                        }
                        println!("lost 1");
                        return;
                    }
                    Some(Ok(_)) => {}
                    _ => { lost.fetch_add(1, Ordering::Relaxed); println!("lost 1"); return; }
                },
                _ = ping.tick() => {
                    let _ = framed.send(ws::Message::Binary(encode(daemon_frame::Frame::Ping(Ping {})))).await;
                }
            }
        }
    });
    Ok(())
}

/// `cluster_bench fake-daemons BASE TOKEN FIRST COUNT`: runs daemons
/// FIRST..FIRST+COUNT; prints `connected N` as they get HelloAck, `done OK
/// FAILED`, then `lost 1` per socket that closes; exits when stdin closes.
async fn fake_daemons_main(args: &[String]) {
    let (base, token) = (args[2].clone(), args[3].clone());
    let first: usize = args[4].parse().expect("first");
    let count: usize = args[5].parse().expect("count");
    std::thread::spawn(|| {
        let mut sink = String::new();
        while std::io::stdin().read_line(&mut sink).map(|n| n > 0).unwrap_or(false) {}
        std::process::exit(0);
    });
    let lost = Rc::new(AtomicU64::new(0));
    let mut clients: BTreeMap<IpAddr, awc::Client> = BTreeMap::new();
    let mut jobs = Vec::new();
    let connected = Rc::new(AtomicU64::new(0));
    let failed = Rc::new(AtomicU64::new(0));
    let gate = Rc::new(tokio::sync::Semaphore::new(32));
    for i in first..first + count {
        let ip = source_address(i);
        let client = clients
            .entry(ip)
            .or_insert_with(|| {
                let connector = awc::Connector::new().local_address(ip).limit(0).timeout(Duration::from_secs(30));
                awc::Client::builder().connector(connector).timeout(Duration::from_secs(60)).finish()
            })
            .clone();
        let (base, token, lost, connected, failed, gate) =
            (base.clone(), token.clone(), lost.clone(), connected.clone(), failed.clone(), gate.clone());
        jobs.push(actix_rt::spawn(async move {
            let _permit = gate.acquire().await;
            match fake_daemon(&client, &base, &token, i, lost).await {
                Ok(()) => {
                    let n = connected.fetch_add(1, Ordering::Relaxed) + 1;
                    if n % 250 == 0 {
                        println!("connected {n}");
                    }
                }
                Err(e) => {
                    if failed.fetch_add(1, Ordering::Relaxed) < 3 {
                        eprintln!("fake daemon {i}: {e}");
                    }
                }
            }
        }));
    }
    for job in jobs {
        let _ = job.await;
    }
    println!("done {} {}", connected.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    let _ = std::io::stdout().flush();
    std::future::pending::<()>().await;
}

struct FakeFleet {
    children: Vec<(Guard, ChildStdin)>,
    events: tokio::sync::mpsc::UnboundedReceiver<String>,
    lost: Rc<AtomicU64>,
}

impl FakeFleet {
    fn new() -> (FakeFleet, tokio::sync::mpsc::UnboundedSender<String>) {
        let (tx, events) = tokio::sync::mpsc::unbounded_channel();
        (FakeFleet { children: Vec::new(), events, lost: Rc::new(AtomicU64::new(0)) }, tx)
    }

    /// Starts daemons `first..first+count` in processes of PER_PROCESS and
    /// waits until every process reported `done`; answers (ok, failed).
    async fn grow(
        &mut self,
        tx: &tokio::sync::mpsc::UnboundedSender<String>,
        base: &str,
        token: &str,
        first: usize,
        count: usize,
    ) -> (u64, u64) {
        let mut pending = 0;
        let mut start = first;
        while start < first + count {
            let n = PER_PROCESS.min(first + count - start);
            let mut cmd = Command::new(std::env::current_exe().expect("exe"));
            cmd.args(["fake-daemons", base, token, &start.to_string(), &n.to_string()])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit());
            tie_to_parent(&mut cmd);
            let mut child = cmd.spawn().expect("spawn fake daemons");
            let stdin = child.stdin.take().expect("stdin");
            let stdout = child.stdout.take().expect("stdout");
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
            self.children.push((Guard(child), stdin));
            pending += 1;
            start += n;
        }
        let (mut ok, mut failed) = (0, 0);
        while pending > 0 {
            let line = tokio::time::timeout(Duration::from_secs(300), self.events.recv())
                .await
                .expect("fake daemons: nothing for 300 s")
                .expect("fake daemon events");
            self.note(&line);
            if let Some(rest) = line.strip_prefix("done ") {
                let mut parts = rest.split(' ').map(|p| p.parse::<u64>().unwrap_or(0));
                ok += parts.next().unwrap_or(0);
                failed += parts.next().unwrap_or(0);
                pending -= 1;
            }
        }
        (ok, failed)
    }

    fn note(&self, line: &str) {
        if line.starts_with("lost") {
            self.lost.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn poll(&mut self) {
        while let Ok(line) = self.events.try_recv() {
            self.note(&line);
        }
    }
}

// ------------------------------------------------------------------ main

fn now_ms() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0)
}

#[actix_rt::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("fake-daemons") {
        return fake_daemons_main(&args).await;
    }
    let daemons: Vec<usize> = arg(&args, "--daemons", "1000,10000".to_string())
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .filter(|n| *n > 0)
        .collect();
    let mib: u64 = arg(&args, "--mib", 100);
    let echo_rounds: usize = arg(&args, "--echo", 200);
    let window = Duration::from_secs(arg(&args, "--window", 31));
    let server_url =
        std::env::var("TETHER_BENCH_DATABASE_URL").expect("TETHER_BENCH_DATABASE_URL (see scripts/cluster-bench)");
    let redis_url =
        std::env::var("TETHER_BENCH_REDIS_URL").expect("TETHER_BENCH_REDIS_URL (see scripts/cluster-bench)");

    // Kept afterwards: the instances' and the daemon's logs are in it.
    let dir = tempfile::Builder::new().prefix("cluster-bench-").tempdir().expect("temp dir").keep();
    let db = format!("tether_bench_{:08x}", rand::random::<u32>());
    let admin = pg(&server_url).await;
    admin.batch_execute(&format!("CREATE DATABASE {db}")).await.expect("create database");
    admin
        .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .await
        .expect("pg_stat_statements (the server must preload it: shared_preload_libraries)");
    let db_url = with_database(&server_url, &db);
    let env: Vec<(String, String)> = vec![
        ("TETHER_DATABASE__URL".into(), db_url.clone()),
        ("TETHER_REDIS__URL".into(), redis_url.clone()),
        ("TETHER_BUS__PREFIX".into(), format!("bench{:06x}", rand::random::<u32>() & 0xff_ffff)),
    ];
    // Extra settings for the three instances, e.g.
    // TETHER_BENCH_SERVE_ENV="TETHER_LEASE__RENEW_MS=3000" (space-separated).
    let mut env = env;
    for pair in std::env::var("TETHER_BENCH_SERVE_ENV").unwrap_or_default().split_whitespace() {
        if let Some((k, v)) = pair.split_once('=') {
            println!("cluster_bench: instances get {k}={v}");
            env.push((k.to_string(), v.to_string()));
        }
    }
    println!("cluster_bench: PostgreSQL database {db}, Redis {redis_url}, logs in {}", dir.as_path().display());

    // A first (it applies the migrations), then B and C.
    let mut a = start_instance("A", &env, dir.as_path()).await;
    let b = start_instance("B", &env, dir.as_path()).await;
    let c = start_instance("C", &env, dir.as_path()).await;
    let token = create_token(&env, dir.as_path());

    let redials: Redials = Rc::default();
    let balancer = start_balancer(vec![a.listen.clone(), b.listen.clone()], redials.clone()).await;
    let _daemon = start_daemon(&format!("http://{balancer}"), &token, dir.as_path(), "info");
    let host = online_host(&a.base(), &token).await;

    // Keystroke echo: viewer on A (the owner) and on B, alternating blocks.
    let cat = new_terminal(&a.base(), &token, &host, json!(["cat"])).await;
    let mut on_a = viewer(&a.ws(), &token, &cat, "").await.expect("viewer on A");
    let mut on_b = viewer(&b.ws(), &token, &cat, "").await.expect("viewer on B");
    let (Start::At(_), Start::At(_)) = (until_live(&mut on_a).await, until_live(&mut on_b).await) else {
        panic!("echo viewers not live")
    };
    drain(&mut on_a).await;
    drain(&mut on_b).await;
    let (mut same, mut cross) = (Vec::new(), Vec::new());
    for block in 0..4 {
        let (framed, other, into) =
            if block % 2 == 0 { (&mut on_a, &mut on_b, &mut same) } else { (&mut on_b, &mut on_a, &mut cross) };
        let mut e = echo_block(framed, echo_rounds / 2).await;
        drain(other).await;
        drain(framed).await;
        e.sort();
        println!(
            "echo block {} ({}): p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
            block + 1,
            if block % 2 == 0 { "viewer on A, the owner" } else { "viewer on B" },
            ms(percentile(&e, 0.5)),
            ms(percentile(&e, 0.99)),
            ms(percentile(&e, 1.0))
        );
        into.extend(e);
    }
    drop((on_a, on_b));
    for (label, e) in
        [("same instance (viewer on A, the owner)", &mut same), ("cross instance (viewer on B)", &mut cross)]
    {
        e.sort();
        println!(
            "keystroke echo, {label}, {} rounds: p50 {:.3} ms, p90 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
            e.len(),
            ms(percentile(e, 0.5)),
            ms(percentile(e, 0.9)),
            ms(percentile(e, 0.99)),
            ms(percentile(e, 1.0))
        );
    }

    // Throughput to one viewer: on A, on B, alternating.
    let script = format!("while read go; do head -c {} /dev/zero | tr '\\0' x; echo; echo bench-done; done", mib << 20);
    let flood_term = new_terminal(&a.base(), &token, &host, json!(["sh", "-c", script])).await;
    let (mut same_rates, mut cross_rates) = (Vec::new(), Vec::new());
    for run in 0..4 {
        let (inst, into) = if run % 2 == 0 { (&a, &mut same_rates) } else { (&b, &mut cross_rates) };
        match flood(&inst.ws(), &token, &flood_term, mib).await {
            Ok((rate, took)) => {
                println!(
                    "throughput run {} (viewer on {}): {mib} MiB in {took:.2?} = {rate:.1} MiB/s",
                    run + 1,
                    inst.name
                );
                into.push(rate);
            }
            Err(e) => println!("throughput run {} (viewer on {}): FAILED: {e}", run + 1, inst.name),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let mean = |v: &[f64]| if v.is_empty() { f64::NAN } else { v.iter().sum::<f64>() / v.len() as f64 };
    println!(
        "throughput to one viewer: same instance {:.1} MiB/s, cross instance {:.1} MiB/s, cross/same = {:.2}",
        mean(&same_rates),
        mean(&cross_rates),
        mean(&cross_rates) / mean(&same_rates)
    );

    // Statements per renew tick with N idle fake daemons on A.
    let (mut fleet, tx) = FakeFleet::new();
    let mut have = 0usize;
    for &n in &daemons {
        if n <= have {
            continue;
        }
        let began = Instant::now();
        let (ok, failed) = fleet.grow(&tx, &a.base(), &token, have, n - have).await;
        have = n;
        println!(
            "fake daemons on A: {} more connected in {:.1?} ({failed} failed); now {} fake + 1 real",
            ok,
            began.elapsed(),
            have
        );
        count_statements(&format!("{n} fake daemons + 1 real on A"), &[&a, &b, &c], &admin, &db, window, &mut fleet)
            .await;
        echo_paced(&a, &token, &cat, &format!("{n} fake daemons idle on A")).await;
    }
    let leases = metric(&a.base(), "tether_leases_held").await;
    println!("A holds {leases} leases (gauge at its last renew)");
    // Stop the fleet and let A release their leases before the failover.
    drop(fleet);
    tokio::time::sleep(Duration::from_secs(5)).await;

    // Failover: a viewer on C streams a clock terminal owned by A; SIGKILL A.
    let clock = new_terminal(
        &a.base(),
        &token,
        &host,
        json!(["sh", "-c", "while :; do echo \"t=$(date +%s%3N)\"; sleep 0.02; done"]),
    )
    .await;
    let mut on_c = viewer(&c.ws(), &token, &clock, "").await.expect("viewer on C");
    let Start::At(live) = until_live(&mut on_c).await else { panic!("viewer on C not live") };
    let mut received = 0u64;
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        if let Ok(Some(Ok(ws::Frame::Binary(b)))) = tokio::time::timeout(Duration::from_millis(100), on_c.next()).await
        {
            received += b.len() as u64;
        }
    }
    assert!(received > 0, "the clock terminal streams to C before the kill");
    let killed_at_ms = now_ms();
    let killed_at_utc = chrono::Utc::now().format("%H:%M:%S%.3f");
    let killed = Instant::now();
    drop(a.child.take()); // SIGKILL
    let mut told = None;
    let mut attempts = 0;
    let mut text = String::new();
    let streaming = loop {
        // Read the current socket until it closes or a post-kill line arrives.
        let mut closed = false;
        while !closed {
            match tokio::time::timeout(Duration::from_secs(30), on_c.next()).await {
                Ok(Some(Ok(ws::Frame::Binary(b)))) => {
                    received += b.len() as u64;
                    text.push_str(&String::from_utf8_lossy(&b));
                    let newest = text.rsplit("t=").find_map(|t| t.get(..13).and_then(|d| d.parse::<u128>().ok()));
                    if newest.is_some_and(|t| t > killed_at_ms) {
                        break;
                    }
                    if text.len() > 4096 {
                        text.drain(..text.len() - 64);
                    }
                }
                Ok(Some(Ok(ws::Frame::Close(r)))) => {
                    if told.is_none() {
                        told = Some((killed.elapsed(), r.map(|r| u16::from(r.code))));
                    }
                    closed = true;
                }
                Ok(Some(Ok(_))) => {}
                Ok(Some(Err(_))) | Ok(None) => closed = true,
                Err(_) => panic!("failover: nothing for 30 s"),
            }
        }
        if !closed {
            break killed.elapsed();
        }
        // Reattach through C with ?from=, retrying while the host moves.
        loop {
            attempts += 1;
            assert!(killed.elapsed() < Duration::from_secs(90), "failover: no stream after 90 s");
            match viewer(&c.ws(), &token, &clock, &format!("?from={}", live + received)).await {
                Ok(mut framed) => match until_live(&mut framed).await {
                    Start::At(_) => {
                        on_c = framed;
                        break;
                    }
                    Start::Closed(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                },
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    };
    let redial = redials.borrow().first().map(|t| t.saturating_duration_since(killed));
    let redial =
        redial.map_or("no redial seen".to_string(), |d| format!("daemon redialed (reached B) after {:.0} ms", ms(d)));
    let told = told.map_or("never closed".to_string(), |(d, code)| format!("closed {code:?} after {:.0} ms", ms(d)));
    println!(
        "failover: SIGKILL of A -> {redial}; viewer on C {told}; streaming again (a line printed after the kill) \
         after {:.0} ms, {attempts} attach attempts",
        ms(streaming)
    );
    println!("  the kill was at {killed_at_utc} UTC; the daemon's log around it:");
    let daemon_log = std::fs::read_to_string(dir.as_path().join("daemon.log")).unwrap_or_default();
    for line in daemon_log
        .lines()
        .filter(|l| l.contains("reconnect_scheduled") || l.contains("dial_failed") || l.contains("connected"))
        .rev()
        .take(4)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
    {
        println!("    {}", &line[..line.len().min(220)]);
    }
    let hosts = api("GET", &format!("{}/api/v1/terminals/{clock}", b.base()), &token, None).await;
    println!("clock terminal after the failover (through B): {}", hosts["terminal"]["state"]);
    drop(c);
    drop(b);
}
