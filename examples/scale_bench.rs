//! Scale of one instance (issue 10, section 3; docs/BENCHMARKS.md): one
//! release `tether serve` on embedded SQLite and then on PostgreSQL, fake
//! daemons (examples/support/fleet.rs: the real registration, hello and
//! pings, then idle) and idle viewers. Per store it prints:
//!
//! - at each N of `--daemons` (fake daemons added to the ones already
//!   connected): server RSS per daemon ((RSS now - RSS before the first
//!   daemon) / N), the server's CPU in % of one core over `--idle` seconds
//!   (60 by default: two of the daemons' 30 s ping periods, so the figure
//!   holds the pings of every daemon however fast they were admitted)
//!   with every daemon connected and idle, the store calls
//!   (`tether_store_queries_total`) per lease-renew tick
//!   (`tether_lease_renew_seconds_count`) over that window, every call of
//!   the instance's background work included (on PostgreSQL also the
//!   statements pg_stat_statements counted, and how many of them were the
//!   lease renewal: one per tick is the goal), and the hosts online
//!   per `GET /api/v1/hosts?state=online`, paginated (`limit=5000`, then
//!   `after=nextCursor`), with the walk's time and bytes;
//! - the reconnect storm at the largest N: SIGKILL of the server and a
//!   restart on the same address; every fake daemon redials with the
//!   daemon's jittered back-off; hellos admitted per second (first to last
//!   HelloAck, and the best second; per second, the median time the
//!   daemons admitted in it spent in the WebSocket upgrade and then waiting
//!   for HelloAck), store calls per hello (on PostgreSQL
//!   also pg_stat_statements calls and `pg_stat_database.xact_commit`
//!   per hello); with `--drain`, SIGTERM instead (a rolling restart: the
//!   server closes its daemons 4503 and releases their leases before it
//!   exits), and how long that took;
//! - with `--cut`, a mass disconnect at the end: every fake daemon's
//!   process is killed at once (as a network cut between the daemons and
//!   the instance looks to it), and the time until no host reads online,
//!   the server's CPU seconds and (PostgreSQL) the statements it took;
//!   then the same daemons connect again to the same server, and after a
//!   second cut once more: RSS per daemon growing from round to round
//!   would be what each round left behind;
//! - `--viewers` idle viewers on `--terminals` terminals (`sleep` in real
//!   PTYs of one real `tether daemon`) on a fresh server process: server
//!   RSS per viewer and idle CPU;
//! - with `--perf`, the top symbols of a `perf record` of the server over
//!   the idle window at the largest N and over the storm's first 12 s.
//!
//! Settings raised for the benchmark through the environment, printed at
//! the start: `http.ws_per_user` (one user holds every socket) and
//! `terminals.max_per_host` and `terminals.max_per_user` (the terminals are
//! on one host). Sockets leave
//! from 127.1.x.y (daemons) and 127.2.x.y (viewers), 200 per address, so
//! `http.ws_per_address` stays at its default. The benchmark raises its own
//! open-file limit to the hard limit (the server inherits it); this
//! machine's hard limit is 20,000 per process, so one server takes about
//! 19,000 sockets, and the fake daemons run in processes of 2,500.
//!
//! With `--tokens per-host` (the default) every fake daemon gets its own
//! daemon-scope token (`POST /api/v1/tokens`, as `tether token create
//! --scope daemon` does), bound to its host at registration; `--tokens
//! shared` gives them all the user's one full token (a daemon token binds
//! to the first host it registers, so it cannot be shared).
//!
//! `TETHER_BENCH_REDIS_URL` (a standalone Redis) or
//! `TETHER_BENCH_REDIS_CLUSTER` (a Redis Cluster's nodes, `HOST:PORT,...`)
//! gives the server that bus (`redis.url`, `redis.cluster_nodes`); without
//! either it runs on the in-process bus.
//!
//! `TETHER_BENCH_PING_MS` changes the fake daemons' ping period (30 s, the
//! daemon's), to measure what the pings cost the idle server; past the
//! server's `daemon.idle_timeout_ms` (95 s) a silent daemon is closed. RSS
//! per daemon is also printed at the end of the idle window, to show
//! whether it grows as the daemons ping (it did while every connection kept
//! actix-http's 8 KiB read buffer, whose pages the pings made resident one
//! by one; docs/ARCHITECTURE.md, "Upgraded connections"); fast pings over a
//! long window (e.g. 50 ms over 300 s) show where it settles.
//!
//! `TETHER_BENCH_DATABASE_URL` (a PostgreSQL server whose server preloads
//! pg_stat_statements) adds the PostgreSQL run; each run gets a fresh
//! database. `scripts/scale-bench` starts such a server, builds and runs
//! this:
//!
//! ```sh
//! scripts/scale-bench [--stores sqlite,postgres] [--daemons 5000,10000,19000] [--idle 60]
//!                     [--viewers 10000] [--terminals 1000] [--tokens per-host|shared] [--no-storm] [--drain] [--cut] [--perf]
//! ```

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::rc::Rc;
use std::time::{Duration, Instant};

use actix_http::ws;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use support::fleet::{self, Fleet};
use support::{
    api, arg, bound_client, cpu_ticks, create_token, family_cpu_ticks, metric, pg, raise_nofile, source_address,
    start_daemon, start_instance, start_instance_on, ticks_per_second, tie_to_parent, until_live, websocket_via, Guard,
    Instance, Start,
};

/// Viewers per source address (127.2.x.y).
const VIEWERS_PER_ADDRESS: usize = 200;
/// Hosts per page of the walk (the most `?limit=` takes).
const PAGE: usize = 5000;
/// How long the reconnect storm may take before the benchmark gives up.
const STORM_LIMIT: Duration = Duration::from_secs(300);

struct Options {
    daemons: Vec<usize>,
    idle: Duration,
    viewers: usize,
    terminals: usize,
    per_host_tokens: bool,
    storm: bool,
    /// `--drain`: the storm's server stops on SIGTERM, not SIGKILL.
    drain: bool,
    /// `--cut`: every fake daemon's socket closes at once at the end.
    cut: bool,
    /// `--perf`: a `perf record` of the server over the idle window at the
    /// largest N and over the storm's first seconds, top symbols printed.
    perf: bool,
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Sqlite,
    Postgres,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::Sqlite => "embedded SQLite",
            Kind::Postgres => "PostgreSQL",
        }
    }
}

/// One store's run: the server, its settings and (PostgreSQL) database.
struct Run {
    kind: Kind,
    instance: Instance,
    env: Vec<(String, String)>,
    dir: std::path::PathBuf,
    token: String,
    pg: Option<(tokio_postgres::Client, String)>,
}

// ------------------------------------------------------------------ figures

#[derive(Default)]
struct Step {
    n: usize,
    admitted: u64,
    failed: u64,
    grow_secs: f64,
    rss_per_daemon_kib: f64,
    /// The same at the end of the idle window: what the daemons' pings
    /// have made resident since (see the module docs).
    rss_per_daemon_after_idle_kib: f64,
    idle_cpu: f64,
    calls_per_tick: f64,
    /// PostgreSQL statements per renew tick: all of them, and the renewal.
    statements_per_tick: Option<(f64, f64)>,
    walk: Walk,
    all_hosts: usize,
}

#[derive(Default)]
struct Walk {
    online: usize,
    pages: usize,
    bytes: usize,
    secs: f64,
    complete: bool,
}

#[derive(Default)]
struct Storm {
    n: usize,
    admitted: usize,
    restart_secs: f64,
    ready_to_all_secs: f64,
    spread_secs: f64,
    rate: f64,
    peak: usize,
    calls_per_hello: f64,
    pg: Option<(f64, f64)>,
    online_after: Walk,
}

#[derive(Default)]
struct Viewers {
    wanted: usize,
    live: usize,
    terminals: usize,
    rss_per_viewer_kib: f64,
    idle_cpu: f64,
}

#[derive(Default)]
struct Figures {
    steps: Vec<Step>,
    storm: Option<Storm>,
    viewers: Option<Viewers>,
}

fn kib_of(pid: u32) -> u64 {
    support::status_kib(pid, "VmRSS")
}

/// Samples the server (`perf record`, no call graphs) for `window`, into
/// `file`; None when perf cannot run.
fn perf_record(pid: u32, window: Duration, file: &Path) -> Option<Guard> {
    let mut cmd = Command::new("perf");
    cmd.args(["record", "-q", "-F", "499", "-p", &pid.to_string(), "-o"])
        .arg(file)
        .args(["--", "sleep", &window.as_secs().to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    tie_to_parent(&mut cmd);
    cmd.spawn().ok().map(Guard)
}

/// Waits (at most 20 s) for a `perf record` to stop at the end of its
/// `sleep`, then prints its top symbols.
async fn finish_profile(mut perf: Guard, file: &Path) {
    for _ in 0..200 {
        if let Ok(Some(_)) = perf.0.try_wait() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(perf);
    print_profile(file);
}

/// The top symbols of a `perf record` file.
fn print_profile(file: &Path) {
    let out = Command::new("perf")
        .args(["report", "--stdio", "--no-children", "--sort", "dso,symbol", "--percent-limit", "1", "-i"])
        .arg(file)
        .stderr(Stdio::null())
        .output();
    let text = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
    println!("  perf profile of the server ({}), symbols over 1 %:", file.display());
    for line in text.lines().filter(|l| l.trim_start().chars().next().is_some_and(|c| c.is_ascii_digit())).take(25) {
        // Columns: overhead, dso, symbol (perf pads them, and may add empty ones).
        let line = line.split_whitespace().filter(|w| *w != "-").collect::<Vec<_>>().join(" ");
        println!("    {line}");
    }
}

/// The server's CPU (% of one core), store calls and renew ticks over
/// `window`; with `profile`, a perf profile of it too.
async fn idle_window(run: &Run, window: Duration, profile: Option<&Path>) -> (f64, u64, u64, Option<Statements>) {
    let base = run.instance.base();
    if let Some((admin, _)) = &run.pg {
        pg::reset_statements(admin).await;
    }
    let (calls0, ticks0) = (metric(&base, "tether_store_queries_total").await, renews(&base).await);
    let cpu0 = cpu_ticks(run.instance.pid());
    let began = Instant::now();
    let perf = profile.and_then(|file| perf_record(run.instance.pid(), window, file));
    tokio::time::sleep(window).await;
    let cpu = (cpu_ticks(run.instance.pid()) - cpu0) as f64 / ticks_per_second();
    if let (Some(perf), Some(file)) = (perf, profile) {
        finish_profile(perf, file).await;
    }
    let elapsed = began.elapsed().as_secs_f64();
    let (calls, ticks) = (metric(&base, "tether_store_queries_total").await, renews(&base).await);
    let statements = match &run.pg {
        Some((admin, db)) => {
            let rows = pg::statements(admin, db).await;
            println!("  pg_stat_statements over the window (utility statements included):");
            pg::print_top(&rows, 8);
            Some(Statements {
                all: rows.iter().map(|r| r.calls).sum(),
                renewals: rows.iter().filter(|r| r.query.starts_with(RENEWAL)).map(|r| r.calls).sum(),
            })
        }
        None => None,
    };
    (100.0 * cpu / elapsed, calls.saturating_sub(calls0), ticks.saturating_sub(ticks0), statements)
}

/// The start of the PostgreSQL store's lease renewal (src/store/postgres.rs),
/// one statement per renew tick.
const RENEWAL: &str = "WITH renewed AS (";

/// PostgreSQL statements over an idle window: all of them, and the lease
/// renewals among them.
#[derive(Clone, Copy)]
struct Statements {
    all: i64,
    renewals: i64,
}

async fn renews(base: &str) -> u64 {
    metric(base, "tether_lease_renew_seconds_count").await
}

/// Walks a paginated list (`url` with its query, e.g.
/// `.../api/v1/hosts?limit=5000&state=online`) page by page, following
/// `nextCursor`; `visit` sees each page's `key` items and answers whether
/// to stop. Answers the walk's pages, bytes and time.
async fn walk(url: &str, token: &str, key: &str, mut visit: impl FnMut(&[Value]) -> bool) -> Walk {
    let client = awc::Client::builder().timeout(Duration::from_secs(120)).finish();
    let mut walk = Walk::default();
    let mut after: Option<String> = None;
    let began = Instant::now();
    // Bounded: 200 pages of 5,000 is ten times the most items measured here.
    for _ in 0..200 {
        let page_url = match &after {
            Some(after) => format!("{url}&after={after}"),
            None => url.to_string(),
        };
        let Ok(mut res) = client.get(page_url).bearer_auth(token).send().await else { break };
        if !res.status().is_success() {
            println!("  GET {url} answered {}", res.status());
            break;
        }
        let Ok(body) = res.body().limit(256 << 20).await else { break };
        walk.pages += 1;
        walk.bytes += body.len();
        let page: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        if visit(page[key].as_array().map(Vec::as_slice).unwrap_or(&[])) {
            break;
        }
        match page["nextCursor"].as_str() {
            Some(next) => after = Some(next.to_string()),
            None => {
                walk.complete = true;
                break;
            }
        }
    }
    walk.secs = began.elapsed().as_secs_f64();
    walk
}

/// `GET /api/v1/hosts?state=online`, every page: the hosts online.
async fn walk_hosts(base: &str, token: &str) -> Walk {
    let mut online = 0;
    let url = format!("{base}/api/v1/hosts?limit={PAGE}&state=online");
    let walked = walk(&url, token, "hosts", |hosts| {
        online += hosts.iter().filter(|h| h["state"] == "online").count();
        false
    })
    .await;
    Walk { online, ..walked }
}

/// How many hosts the user has (a walk without the state filter).
async fn count_hosts(base: &str, token: &str) -> usize {
    let mut total = 0;
    walk(&format!("{base}/api/v1/hosts?limit={PAGE}"), token, "hosts", |hosts| {
        total += hosts.len();
        false
    })
    .await;
    total
}

// ------------------------------------------------------------------ steps

/// `count` daemon-scope tokens of the run's user, one per line in
/// `dir/daemon-tokens`; answers the fleet's `@FILE` argument.
async fn daemon_tokens(run: &Run, count: usize) -> String {
    let began = Instant::now();
    let client = awc::Client::builder().timeout(Duration::from_secs(60)).finish();
    let base = run.instance.base();
    let make = |i: usize| {
        let (client, base, token) = (client.clone(), base.clone(), run.token.clone());
        async move {
            let body = json!({"name": format!("bench-fake-{i:05}"), "scope": "daemon"});
            for _ in 0..5 {
                if let Ok(mut res) =
                    client.post(format!("{base}/api/v1/tokens")).bearer_auth(&token).send_json(&body).await
                {
                    let v: Value = res.json().await.unwrap_or(Value::Null);
                    if let Some(secret) = v["secret"].as_str() {
                        return secret.to_string();
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            panic!("could not create daemon token {i}");
        }
    };
    let secrets: Vec<String> = futures_util::stream::iter((0..count).map(make)).buffered(16).collect().await;
    let path = run.dir.join("daemon-tokens");
    std::fs::write(&path, secrets.join("\n") + "\n").expect("write tokens");
    println!(
        "  {count} daemon tokens (scope daemon, one per fake daemon) made through POST /api/v1/tokens in {:.1} s",
        began.elapsed().as_secs_f64()
    );
    format!("@{}", path.display())
}

async fn daemons_step(
    run: &Run,
    fleet: &mut Fleet,
    tokens: &str,
    (have, n): (usize, usize),
    rss0: u64,
    idle: Duration,
    profile: bool,
) -> Step {
    let began = Instant::now();
    let (admitted, failed) = fleet.grow(&run.instance.base(), tokens, have, n - have).await;
    let grow_secs = began.elapsed().as_secs_f64();
    println!(
        "{}: {admitted} more fake daemons admitted in {grow_secs:.1} s ({failed} first attempts failed); {} online",
        run.kind.label(),
        fleet.online()
    );
    // Let the hellos' own work finish before measuring.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rss = kib_of(run.instance.pid());
    let file = run.dir.join(format!("perf-{n}.data"));
    let (idle_cpu, calls, ticks, statements) = idle_window(run, idle, profile.then_some(file.as_path())).await;
    let rss_after_idle = kib_of(run.instance.pid());
    let walk = walk_hosts(&run.instance.base(), &run.token).await;
    let all_hosts = count_hosts(&run.instance.base(), &run.token).await;
    fleet.poll();
    let step = Step {
        n,
        admitted,
        failed,
        grow_secs,
        rss_per_daemon_kib: (rss as f64 - rss0 as f64) / n as f64,
        rss_per_daemon_after_idle_kib: (rss_after_idle as f64 - rss0 as f64) / n as f64,
        idle_cpu,
        calls_per_tick: calls as f64 / ticks.max(1) as f64,
        statements_per_tick: statements.map(|s| {
            let per_tick = |n: i64| n as f64 / ticks.max(1) as f64;
            (per_tick(s.all), per_tick(s.renewals))
        }),
        walk,
        all_hosts,
    };
    println!(
        "  N={n}: RSS {rss} KiB ({:.1} KiB per daemon), {rss_after_idle} KiB at the end of the idle window ({:.1} KiB \
         per daemon); idle CPU {:.1} % of a core over {:.0} s; {calls} store calls in the window, {ticks} renew ticks \
         in it ({:.1} calls per tick){}",
        step.rss_per_daemon_kib,
        step.rss_per_daemon_after_idle_kib,
        idle_cpu,
        idle.as_secs_f64(),
        step.calls_per_tick,
        statements.zip(step.statements_per_tick).map_or(String::new(), |(s, (all, renewals))| format!(
            ", {} PostgreSQL statements ({all:.1} per tick), {} of them lease renewals ({renewals:.1} per tick)",
            s.all, s.renewals
        ))
    );
    println!(
        "  GET /api/v1/hosts?state=online: {} online of {all_hosts} hosts, {} pages of <= {PAGE}, {:.1} MB, {:.2} s{}; \
         fake daemons online by their own count {}",
        step.walk.online,
        step.walk.pages,
        step.walk.bytes as f64 / 1e6,
        step.walk.secs,
        if step.walk.complete { "" } else { " (walk INCOMPLETE)" },
        fleet.online()
    );
    step
}

/// The first seconds of the storm that `--perf` profiles.
const STORM_PROFILE: Duration = Duration::from_secs(12);

async fn storm(run: &mut Run, fleet: &mut Fleet, n: usize, drain: bool, profile: bool) -> Storm {
    let mut server = run.instance.child.take().expect("the server");
    if drain {
        if let Some((admin, _)) = &run.pg {
            pg::reset_statements(admin).await;
        }
        let term = Instant::now();
        // SAFETY: kill(2) with the pid of a child the guard owns and waits for.
        unsafe { libc::kill(i32::try_from(server.0.id()).expect("pid"), libc::SIGTERM) };
        let status = loop {
            if let Ok(Some(status)) = server.0.try_wait() {
                break status;
            }
            assert!(term.elapsed() < STORM_LIMIT, "the server did not exit after SIGTERM");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let drained = term.elapsed().as_secs_f64();
        let statements = match &run.pg {
            Some((admin, db)) => {
                let n: i64 = pg::statements(admin, db).await.iter().map(|r| r.calls).sum();
                format!(", {n} PostgreSQL statements")
            }
            None => String::new(),
        };
        println!("{}: SIGTERM: drained and exited ({status}) in {drained:.2} s{statements}", run.kind.label());
    }
    fleet.poll();
    let ups0 = fleet.ups;
    let xact0 = match &run.pg {
        Some((admin, db)) => {
            pg::reset_statements(admin).await;
            Some(pg::xact_commit(admin, db).await)
        }
        None => None,
    };
    fleet.record(true);
    let listen = run.instance.listen.clone();
    let killed = Instant::now();
    drop(server); // SIGKILL, unless it drained and exited
    let name = match run.kind {
        Kind::Sqlite => "sqlite-restarted",
        Kind::Postgres => "postgres-restarted",
    };
    run.instance = start_instance_on(name, listen, &run.env, &run.dir).await;
    let ready = Instant::now();
    let file = run.dir.join("perf-storm.data");
    let perf = if profile { perf_record(run.instance.pid(), STORM_PROFILE, &file) } else { None };
    let calls0 = metric(&run.instance.base(), "tether_store_queries_total").await;
    let server_cpu0 = cpu_ticks(run.instance.pid());
    let postmaster = match &run.pg {
        Some((admin, _)) => Some(pg::postmaster_pid(admin).await),
        None => None,
    };
    let pg_cpu0 = postmaster.map(family_cpu_ticks);
    println!(
        "{}: server stopped and restarted on the same address, ready after {:.2} s; waiting for {n} redials",
        run.kind.label(),
        (ready - killed).as_secs_f64()
    );
    let deadline = Instant::now() + STORM_LIMIT;
    while Instant::now() < deadline {
        if fleet.wait_until(Duration::from_secs(10), |f| f.ups - ups0 >= n as u64).await {
            break;
        }
        println!("  ... {} of {n} admitted again", fleet.ups - ups0);
    }
    let calls = metric(&run.instance.base(), "tether_store_queries_total").await.saturating_sub(calls0);
    let server_cpu = (cpu_ticks(run.instance.pid()) - server_cpu0) as f64 / ticks_per_second();
    let pg_cpu = postmaster.zip(pg_cpu0).map(|(pid, t0)| (family_cpu_ticks(pid) - t0) as f64 / ticks_per_second());
    if let Some(perf) = perf {
        println!("  (the profile below is of the new server's first {} s)", STORM_PROFILE.as_secs());
        finish_profile(perf, &file).await;
    }
    let times = std::mem::take(&mut fleet.up_times);
    for (reason, count) in &fleet.failures {
        println!("  {count} redial attempts failed: {reason}");
    }
    fleet.record(false);
    let admitted = times.len();
    let (first, last) = (times.first().map_or(ready, |a| a.at), times.last().map_or(ready, |a| a.at));
    let spread = (last - first).as_secs_f64();
    let mut per_second = vec![0usize; spread as usize + 1];
    let mut waits: Vec<Vec<(u32, u32)>> = vec![Vec::new(); per_second.len()];
    for a in &times {
        let second = (a.at - first).as_secs() as usize;
        per_second[second] += 1;
        waits[second].push((a.upgrade_ms, a.ack_ms));
    }
    let pg_figures = match (&run.pg, xact0) {
        (Some((admin, db)), Some(xact0)) => {
            let rows = pg::statements(admin, db).await;
            let xact = pg::xact_commit(admin, db).await - xact0;
            println!("  pg_stat_statements over the storm (from the kill to the last HelloAck):");
            pg::print_top(&rows, 10);
            let statements: i64 = rows.iter().map(|r| r.calls).sum();
            Some((statements as f64 / admitted.max(1) as f64, xact as f64 / admitted.max(1) as f64))
        }
        _ => None,
    };
    let s = Storm {
        n,
        admitted,
        restart_secs: (ready - killed).as_secs_f64(),
        ready_to_all_secs: last.saturating_duration_since(ready).as_secs_f64(),
        spread_secs: spread,
        rate: admitted as f64 / spread.max(0.001),
        peak: per_second.iter().copied().max().unwrap_or(0),
        calls_per_hello: calls as f64 / admitted.max(1) as f64,
        pg: pg_figures,
        online_after: Walk::default(),
    };
    println!(
        "  storm: {admitted} of {n} admitted again; from the first HelloAck to the last {:.1} s = {:.0} hellos/s \
         (best second {}); the last {:.1} s after ready; {:.2} store calls per hello{}",
        s.spread_secs,
        s.rate,
        s.peak,
        s.ready_to_all_secs,
        s.calls_per_hello,
        s.pg.map_or(String::new(), |(st, x)| format!(", {st:.2} PostgreSQL statements and {x:.2} commits per hello"))
    );
    let per_hello = |secs: f64| secs * 1e6 / admitted.max(1) as f64;
    println!(
        "  CPU from ready to the last HelloAck: server {server_cpu:.2} s ({:.0} us per hello){}",
        per_hello(server_cpu),
        pg_cpu.map_or(String::new(), |c| format!(", PostgreSQL {c:.2} s ({:.0} us per hello)", per_hello(c)))
    );
    println!("  hellos admitted per second from the first: {per_second:?}");
    // Where the daemons of each second waited: the upgrade (the token is
    // checked there) or the hello (admission, claim, the hello statement).
    let medians: Vec<String> = waits
        .iter_mut()
        .map(|w| {
            let median = |v: &mut Vec<u32>| {
                v.sort_unstable();
                v.get(v.len() / 2).copied().unwrap_or(0)
            };
            let (mut up, mut ack): (Vec<u32>, Vec<u32>) = w.iter().copied().unzip();
            format!("{}/{}", median(&mut up), median(&mut ack))
        })
        .collect();
    println!("  median ms of the upgrade / of the wait for HelloAck, per second: {}", medians.join(" "));
    tokio::time::sleep(Duration::from_secs(5)).await;
    let online_after = walk_hosts(&run.instance.base(), &run.token).await;
    println!("  5 s after the storm: {} hosts online per GET /api/v1/hosts?state=online", online_after.online);
    Storm { online_after, ..s }
}

/// Kills every fake daemon's process at once, so the server sees all their
/// sockets close together, and times it until no host reads online.
async fn cut(run: &Run, fleet: Fleet, n: usize) {
    if let Some((admin, _)) = &run.pg {
        pg::reset_statements(admin).await;
    }
    let pid = run.instance.pid();
    let cpu0 = cpu_ticks(pid);
    let url = format!("{}/api/v1/hosts?limit=1&state=online", run.instance.base());
    let cut = Instant::now();
    drop(fleet);
    let killed = cut.elapsed().as_secs_f64();
    let all_offline = loop {
        let mut online = 0;
        walk(&url, &run.token, "hosts", |hosts| {
            online += hosts.len();
            true
        })
        .await;
        if online == 0 {
            break Some(cut.elapsed().as_secs_f64());
        }
        if cut.elapsed() > STORM_LIMIT {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let cpu = (cpu_ticks(pid) - cpu0) as f64 / ticks_per_second();
    let statements = match &run.pg {
        Some((admin, db)) => {
            let rows = pg::statements(admin, db).await;
            pg::print_top(&rows, 5);
            format!(", {} PostgreSQL statements", rows.iter().map(|r| r.calls).sum::<i64>())
        }
        None => String::new(),
    };
    match all_offline {
        Some(secs) => println!(
            "{}: cut: {n} daemons' processes killed in {killed:.2} s; no host online after {secs:.2} s; \
             server CPU {cpu:.2} s{statements}",
            run.kind.label()
        ),
        None => println!("{}: cut: hosts still online after {} s{statements}", run.kind.label(), STORM_LIMIT.as_secs()),
    }
}

/// The real daemon's host (not a fake one), once it is online.
async fn real_host(base: &str, token: &str) -> Option<String> {
    let url = format!("{base}/api/v1/hosts?limit={PAGE}&state=online");
    for _ in 0..120 {
        let mut found = None;
        walk(&url, token, "hosts", |hosts| {
            let real =
                hosts.iter().find(|h| !h["hostname"].as_str().unwrap_or("bench-fake-").starts_with("bench-fake-"));
            found = real.and_then(|h| h["id"].as_str()).map(str::to_string);
            found.is_some()
        })
        .await;
        if found.is_some() {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    None
}

/// Starts `sleep` in `count` terminals on `host`; answers their ids and
/// how many run, once all do (or after a minute or more).
async fn sleeping_terminals(base: &str, token: &str, host: &str, count: usize) -> (Vec<String>, usize) {
    let create = |_| async move {
        let body = json!({"hostId": host, "argv": ["sleep", "1000000"], "dir": "/tmp"});
        let t = api("POST", &format!("{base}/api/v1/terminals"), token, Some(body)).await;
        t["terminal"]["id"].as_str().map(str::to_string)
    };
    let ids: Vec<String> =
        futures_util::stream::iter(0..count).map(create).buffered(8).filter_map(|id| async { id }).collect().await;
    let url = format!("{base}/api/v1/terminals?limit={PAGE}");
    let mut running = 0;
    for _ in 0..600 {
        running = 0;
        walk(&url, token, "terminals", |terminals| {
            running += terminals.iter().filter(|t| t["state"] == "running").count();
            false
        })
        .await;
        if running >= ids.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (ids, running)
}

async fn viewers_step(run: &Run, viewers: usize, terminals: usize, idle: Duration) -> Viewers {
    let daemon_dir = run.dir.join("real-daemon");
    std::fs::create_dir_all(&daemon_dir).expect("daemon dir");
    let _daemon = start_daemon(&run.instance.base(), &run.token, &daemon_dir, "warn");
    let mut figures = Viewers { wanted: viewers, ..Default::default() };
    let Some(host) = real_host(&run.instance.base(), &run.token).await else {
        println!("{}: the real daemon's host did not come online; no viewer figures", run.kind.label());
        return figures;
    };
    let (ids, running) = sleeping_terminals(&run.instance.base(), &run.token, &host, terminals).await;
    figures.terminals = ids.len();
    println!("{}: {} terminals of `sleep` on one real daemon, {running} running", run.kind.label(), ids.len());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rss0 = kib_of(run.instance.pid());
    let ws_base = run.instance.ws();
    let lost = Rc::new(std::cell::Cell::new(0usize));
    let began = Instant::now();
    let attach = |i: usize| {
        let url = format!("{ws_base}/ws/v1/terminals/{}", ids[i % ids.len().max(1)]);
        let client = bound_client(source_address(2, i, VIEWERS_PER_ADDRESS));
        let (token, lost) = (run.token.clone(), lost.clone());
        async move {
            let mut framed = websocket_via(&client, &url, Some(&token)).await?;
            if let Start::Closed(code) = until_live(&mut framed).await {
                return Err(format!("closed {code:?} before live"));
            }
            // Idle: answer pings until the benchmark drops the task.
            Ok(actix_rt::spawn(async move {
                while let Some(frame) = framed.next().await {
                    match frame {
                        Ok(ws::Frame::Ping(p)) => {
                            let _ = framed.send(ws::Message::Pong(p)).await;
                        }
                        Ok(ws::Frame::Close(_)) | Err(_) => break,
                        Ok(_) => {}
                    }
                }
                lost.set(lost.get() + 1);
            }))
        }
    };
    let attempts: Vec<Result<_, String>> = if ids.is_empty() {
        Vec::new()
    } else {
        futures_util::stream::iter(0..viewers).map(attach).buffer_unordered(64).collect().await
    };
    let mut failures: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
    let mut tasks = Vec::new();
    for attempt in attempts {
        match attempt {
            Ok(task) => tasks.push(task),
            Err(e) => *failures.entry(e).or_default() += 1,
        }
    }
    figures.live = tasks.len();
    println!("  {} of {viewers} viewers live in {:.1} s", tasks.len(), began.elapsed().as_secs_f64());
    for (reason, count) in &failures {
        println!("    {count} viewers failed: {reason}");
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rss = kib_of(run.instance.pid());
    let (idle_cpu, _, _, _) = idle_window(run, idle, None).await;
    figures.rss_per_viewer_kib = (rss as f64 - rss0 as f64) / tasks.len().max(1) as f64;
    figures.idle_cpu = idle_cpu;
    println!(
        "  RSS {rss0} -> {rss} KiB: {:.1} KiB per viewer; idle CPU {idle_cpu:.1} % of a core; viewers lost {}",
        figures.rss_per_viewer_kib,
        lost.get()
    );
    for task in tasks {
        task.abort();
    }
    figures
}

// ------------------------------------------------------------------ one store

async fn run_store(kind: Kind, opts: &Options, server_url: Option<&str>) -> Figures {
    // Kept afterwards: the server's logs are in it.
    let dir = tempfile::Builder::new().prefix("scale-bench-").tempdir().expect("temp dir").keep();
    let most = opts.daemons.iter().copied().max().unwrap_or(0);
    let mut env: Vec<(String, String)> = vec![
        ("TETHER_HTTP__WS_PER_USER".into(), (most + opts.viewers + 1000).to_string()),
        ("TETHER_TERMINALS__MAX_PER_HOST".into(), opts.terminals.max(256).to_string()),
        ("TETHER_TERMINALS__MAX_PER_USER".into(), opts.terminals.max(1024).to_string()),
    ];
    // The bus between instances, when the caller names a Redis for it.
    for (bench, key) in
        [("TETHER_BENCH_REDIS_URL", "TETHER_REDIS__URL"), ("TETHER_BENCH_REDIS_CLUSTER", "TETHER_REDIS__CLUSTER_NODES")]
    {
        if let Some(value) = std::env::var(bench).ok().filter(|v| !v.is_empty()) {
            env.push((key.into(), value));
        }
    }
    println!(
        "\n== {} ({}); settings raised for the benchmark: {}",
        kind.label(),
        dir.display(),
        env.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ")
    );
    let pg = match (kind, server_url) {
        (Kind::Postgres, Some(url)) => {
            let admin = pg::connect(url).await;
            let (db, db_url) = pg::fresh_database(&admin, url, "tether_scale").await;
            env.push(("TETHER_DATABASE__URL".into(), db_url));
            Some((admin, db))
        }
        _ => None,
    };
    let name = match kind {
        Kind::Sqlite => "sqlite",
        Kind::Postgres => "postgres",
    };
    let instance = start_instance(name, &env, &dir).await;
    let token = create_token(&env, &dir);
    let mut run = Run { kind, instance, env, dir, token, pg };
    let tokens = if opts.per_host_tokens {
        daemon_tokens(&run, most).await
    } else {
        // A daemon token binds to the first host it registers, so the one
        // token of every fake daemon is the user's full token.
        println!("  one token (the user's full token) for every fake daemon");
        run.token.clone()
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss0 = kib_of(run.instance.pid());
    println!("  server RSS before the daemons: {rss0} KiB");
    let mut figures = Figures::default();
    let mut fleet = Fleet::new();
    let mut have = 0;
    for &n in &opts.daemons {
        if n <= have {
            continue;
        }
        let profile = opts.perf && n == most;
        figures.steps.push(daemons_step(&run, &mut fleet, &tokens, (have, n), rss0, opts.idle, profile).await);
        have = n;
    }
    if opts.storm && have > 0 {
        figures.storm = Some(storm(&mut run, &mut fleet, have, opts.drain, opts.perf).await);
    }
    if opts.cut && have > 0 {
        // Then the same daemons again on the same server, twice: what a
        // round left behind (a map that kept an entry per connection)
        // shows as RSS per daemon that grows from round to round.
        let mut fleet = fleet;
        for round in 2..=3 {
            cut(&run, fleet, have).await;
            println!("{}: round {round}: the same {have} daemons again, after the cut:", kind.label());
            fleet = Fleet::new();
            daemons_step(&run, &mut fleet, &tokens, (0, have), rss0, opts.idle, false).await;
        }
        drop(fleet);
    } else {
        drop(fleet);
    }
    if opts.viewers > 0 && opts.terminals > 0 {
        // A fresh server process, so the viewers' memory is not memory the
        // fleet's connections left free.
        let listen = run.instance.listen.clone();
        drop(run.instance.child.take());
        let name = match kind {
            Kind::Sqlite => "sqlite-viewers",
            Kind::Postgres => "postgres-viewers",
        };
        run.instance = start_instance_on(name, listen, &run.env, &run.dir).await;
        figures.viewers = Some(viewers_step(&run, opts.viewers, opts.terminals, opts.idle).await);
    }
    drop(run.instance.child.take());
    if let Some((admin, db)) = &run.pg {
        pg::drop_database(admin, db).await;
    }
    figures
}

// ------------------------------------------------------------------ main

fn print_tables(results: &[(Kind, Figures)], opts: &Options) {
    println!("\n== summary (Markdown)");
    for (kind, f) in results {
        println!(
            "\n{} ({} tokens):\n",
            kind.label(),
            if opts.per_host_tokens { "one daemon token per host" } else { "one shared full token" }
        );
        println!("| idle daemons | admitted (failed), time | RSS per daemon (after the idle window) | idle CPU | store calls in the idle window per renew tick | hosts online per GET /api/v1/hosts?state=online | walk |");
        println!("|---|---|---|---|---|---|---|");
        for s in &f.steps {
            let statements = s.statements_per_tick.map_or(String::new(), |(all, renewals)| {
                format!(" ({all:.1} PostgreSQL statements, {renewals:.1} of them the renewal)")
            });
            println!(
                "| {} | {} ({}), {:.0} s | {:.1} KiB ({:.1} KiB) | {:.1} % of a core | {:.1}{statements} | {} of {} | {} pages, {:.1} MB, {:.2} s |",
                s.n, s.admitted, s.failed, s.grow_secs, s.rss_per_daemon_kib, s.rss_per_daemon_after_idle_kib, s.idle_cpu, s.calls_per_tick, s.walk.online, s.all_hosts,
                s.walk.pages, s.walk.bytes as f64 / 1e6, s.walk.secs
            );
        }
        if let Some(s) = &f.storm {
            println!(
                "\nReconnect storm, {} daemons: restart ready after {:.2} s; {} admitted again, first to last HelloAck {:.1} s = \
                 **{:.0} hellos/s** (best second {}); {:.2} store calls per hello{}; {} hosts online 5 s later.",
                s.n, s.restart_secs, s.admitted, s.spread_secs, s.rate, s.peak, s.calls_per_hello,
                s.pg.map_or(String::new(), |(st, x)| format!(", {st:.2} PostgreSQL statements and {x:.2} commits per hello")),
                s.online_after.online
            );
        }
        if let Some(v) = &f.viewers {
            println!(
                "\n{} of {} idle viewers on {} terminals: **{:.1} KiB per viewer**, idle CPU {:.1} % of a core.",
                v.live, v.wanted, v.terminals, v.rss_per_viewer_kib, v.idle_cpu
            );
        }
    }
}

#[actix_rt::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("fake-daemons") {
        return fleet::child_main(&args).await;
    }
    let server_url = std::env::var("TETHER_BENCH_DATABASE_URL").ok().filter(|u| !u.is_empty());
    let stores = arg(&args, "--stores", if server_url.is_some() { "sqlite,postgres" } else { "sqlite" }.to_string());
    let opts = Options {
        daemons: arg(&args, "--daemons", "5000,10000,19000".to_string())
            .split(',')
            .filter_map(|n| n.trim().parse().ok())
            .filter(|n| *n > 0)
            .collect(),
        idle: Duration::from_secs(arg(&args, "--idle", 60)),
        viewers: arg(&args, "--viewers", 10_000),
        terminals: arg(&args, "--terminals", 1_000),
        per_host_tokens: arg(&args, "--tokens", "per-host".to_string()) != "shared",
        storm: !args.iter().any(|a| a == "--no-storm"),
        drain: args.iter().any(|a| a == "--drain"),
        cut: args.iter().any(|a| a == "--cut"),
        perf: args.iter().any(|a| a == "--perf"),
    };
    let nofile = raise_nofile();
    println!(
        "scale_bench: open files {nofile} per process (the server inherits it); daemons {:?}, idle window {} s, \
         {} viewers on {} terminals",
        opts.daemons,
        opts.idle.as_secs(),
        opts.viewers,
        opts.terminals
    );
    let mut results = Vec::new();
    for store in stores.split(',').map(str::trim) {
        let kind = match store {
            "sqlite" => Kind::Sqlite,
            "postgres" if server_url.is_some() => Kind::Postgres,
            "postgres" => panic!("--stores postgres needs TETHER_BENCH_DATABASE_URL (see scripts/scale-bench)"),
            other => panic!("unknown store {other}"),
        };
        results.push((kind, run_store(kind, &opts, server_url.as_deref()).await));
    }
    print_tables(&results, &opts);
}
