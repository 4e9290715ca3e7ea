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
//! Fake daemons (examples/support/fleet.rs) run in child processes of this
//! program (`cluster_bench fake-daemons ...`, at most 2,500 sockets each,
//! under the 20,000 open-file limit) and bind their sockets to 127.1.x.y
//! source addresses, 200 per address, under the server's default
//! `http.ws_per_address` (256).
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
use std::rc::Rc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use actix_http::ws;
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use support::{
    api, arg, cpu_ticks, create_token, drain, drain_now, ms, new_terminal, online_host, percentile, start_daemon,
    start_instance, ticks_per_second, until_live, viewer, Framed, Instance, Start,
};
use support::{fleet, fleet::Fleet, metric, pg};

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

struct Sample {
    renews: BTreeMap<&'static str, u64>,
    xact_commit: i64,
    cpu_ticks: BTreeMap<&'static str, u64>,
}

async fn sample(instances: &[&Instance], admin: &tokio_postgres::Client, db: &str) -> Sample {
    let mut renews = BTreeMap::new();
    let mut cpu = BTreeMap::new();
    for i in instances {
        renews.insert(i.name, metric(&i.base(), "tether_lease_renew_seconds_count").await);
        cpu.insert(i.name, cpu_ticks(i.pid()));
    }
    Sample { renews, xact_commit: pg::xact_commit(admin, db).await, cpu_ticks: cpu }
}

/// Statements counted in a window of `window` with the daemons idle.
async fn count_statements(
    label: &str,
    instances: &[&Instance],
    admin: &tokio_postgres::Client,
    db: &str,
    window: Duration,
    fleet: &mut Fleet,
) {
    // Let the hellos' own statements and the last renews finish.
    tokio::time::sleep(Duration::from_secs(3)).await;
    pg::reset_statements(admin).await;
    fleet.poll();
    let lost_before = fleet.downs;
    let before = sample(instances, admin, db).await;
    let began = Instant::now();
    tokio::time::sleep(window).await;
    let after = sample(instances, admin, db).await;
    let elapsed = began.elapsed();
    fleet.poll();
    let rows = pg::statements(admin, db).await;
    let ticks: u64 = instances.iter().map(|i| after.renews[i.name].saturating_sub(before.renews[i.name])).sum();
    let per_instance: Vec<String> = instances
        .iter()
        .map(|i| format!("{} {}", i.name, after.renews[i.name].saturating_sub(before.renews[i.name])))
        .collect();
    let total: i64 = rows.iter().map(|r| r.calls).sum();
    // The renewal (and, in builds before it was folded into the same
    // statement, the hosts' last-seen touch that followed it).
    let is_renew_tick = |q: &str| {
        q.starts_with("WITH renewed AS ( UPDATE leases")
            || q.starts_with("UPDATE leases l SET expires_at")
            || q.starts_with("UPDATE hosts SET last_seen_at")
    };
    let tick_statements: i64 = rows.iter().filter(|r| is_renew_tick(&r.query)).map(|r| r.calls).sum();
    println!(
        "statements, {label}: window {:.1?}, renew ticks {ticks} ({}), daemons lost in window {}",
        elapsed,
        per_instance.join(", "),
        fleet.downs - lost_before
    );
    for r in &rows {
        let q = &r.query;
        println!("    {:>6} calls {:>7} rows  {}", r.calls, r.rows, &q[..q.len().min(110)]);
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

// ------------------------------------------------------------------ main

fn now_ms() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0)
}

#[actix_rt::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("fake-daemons") {
        return fleet::child_main(&args).await;
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
    let admin = pg::connect(&server_url).await;
    let (db, db_url) = pg::fresh_database(&admin, &server_url, "tether_bench").await;
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
    let mut fleet = Fleet::new();
    let mut have = 0usize;
    for &n in &daemons {
        if n <= have {
            continue;
        }
        let began = Instant::now();
        let (ok, failed) = fleet.grow(&a.base(), &token, have, n - have).await;
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
