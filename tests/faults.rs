//! Faults, with real processes (docs/OPERATIONS.md, "Faults"): PostgreSQL
//! stopped while people work, Redis killed and started again, an instance
//! whose clock is 20 s ahead, the SQLite file's disk running full, and a
//! daemon's path to its instance silently stopping.
//!
//! Every test runs real `tether serve` instances and real `tether daemon`s
//! with real PTYs; the servers that fail are the tests' own (an own
//! PostgreSQL, an own Redis), so other tests never see the fault.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::balancer::Balancer;
use support::client::{create_token, viewer_url, Api, Event, Socket};
use support::daemon::DaemonProcess;
use support::disk::{limit_file_size, SmallDisk};
use support::e2e::{ticks_script, wait_online, wait_state, Ticks, Viewer};
use support::{
    clock_ahead_env, instance_pair_on, pg_connect, pg_database, redis_url, OwnPostgres, OwnRedis, TetherServer,
};

/// How long PostgreSQL stays away (the figure docs/OPERATIONS.md promises).
const DATABASE_OUTAGE: Duration = Duration::from_secs(20);

/// Settings of the cluster tests, on top of [`instance_pair_on`]'s leases
/// (renewed every second, 3 s TTL): a heartbeat every second, a sweep every
/// half second, hosts stale after 3 s and runs lost after 5 s. An outage of
/// 20 s is many times every one of them, so whatever judges by them has
/// had its chance to go wrong.
const FAST: [(&str, &str); 5] = [
    ("TETHER_BUS__HEARTBEAT_MS", "1000"),
    ("TETHER_SWEEP__INTERVAL_MS", "500"),
    ("TETHER_SWEEP__STALE_HOST_MS", "3000"),
    ("TETHER_RUNS__LOST_AFTER", "5000"),
    ("RUST_LOG", "info"),
];

/// Instances A and B of one cluster on `database` and `redis`, with the
/// [`FAST`] settings; B also gets `b_only`.
async fn pair(database: &str, redis: &str, b_only: &[(&str, &str)]) -> (TetherServer, TetherServer) {
    instance_pair_on(database, redis, &FAST, b_only).await
}

/// A user with a daemon connected to `home`; `away` is the other instance.
struct Person {
    home: Api,
    away: Api,
    host: String,
    daemon: DaemonProcess,
    /// The daemon's state dir, and room for files a test shares with its terminals.
    dir: tempfile::TempDir,
}

impl Person {
    async fn on(home: &TetherServer, away: &TetherServer, user: &str) -> Person {
        let token = create_token(home, user);
        let dir = tempfile::tempdir().expect("temp dir");
        let daemon = DaemonProcess::start(home, &token, &dir.path().join("state"));
        let home_api = Api::new(home.url(), token.clone());
        let host = wait_online(&home_api).await;
        Person { home: home_api, away: Api::new(away.url(), token), host, daemon, dir }
    }

    fn token(&self) -> &str {
        &self.home.token
    }

    /// A running terminal of `argv` on this person's host, created through `home`.
    async fn terminal(&self, argv: &[&str]) -> String {
        let (status, body) =
            self.home.post("/api/v1/terminals", json!({"hostId": self.host, "argv": argv, "dir": "/tmp"})).await;
        assert_eq!(status, 201, "{body}");
        let id = body["terminal"]["id"].as_str().expect("terminal id").to_string();
        wait_state(&self.home, &id, "running").await;
        id
    }

    /// Asserts the host is online as both instances see it.
    async fn assert_online(&self) {
        for api in [&self.home, &self.away] {
            let (status, body) = api.get(&format!("/api/v1/hosts/{}", self.host)).await;
            assert_eq!(status, 200, "{body}");
            assert_eq!(body["host"]["state"], "online", "{} says {body}", api.base);
        }
    }

    /// Waits until both instances see the host online.
    async fn wait_online(&self) {
        for api in [&self.home, &self.away] {
            api.wait_for(&format!("/api/v1/hosts/{}", self.host), "the host online", |b| {
                b["host"]["state"] == "online"
            })
            .await;
        }
    }
}

/// Ann with her daemon on A and Bob with his on B, each with a running
/// terminal that prints `tick-N` every `period` seconds.
async fn ann_and_bob_ticking(a: &TetherServer, b: &TetherServer, period: &str) -> ([Person; 2], [String; 2]) {
    let ann = Person::on(a, b, "ann").await;
    let bob = Person::on(b, a, "bob").await;
    let ann_ticking = ann.terminal(&["sh", "-c", &ticks_script(period)]).await;
    let bob_ticking = bob.terminal(&["sh", "-c", &ticks_script(period)]).await;
    ([ann, bob], [ann_ticking, bob_ticking])
}

/// Two viewers of one `sh` terminal; a line typed into either is echoed to both.
struct Shell {
    viewers: [Viewer; 2],
    typed: usize,
}

impl Shell {
    async fn open(id: &str, token: &str, servers: [&TetherServer; 2]) -> Shell {
        let viewers =
            [Viewer::attach_to(servers[0], token, id, "").await, Viewer::attach_to(servers[1], token, id, "").await];
        Shell { viewers, typed: 0 }
    }

    /// Types a line through one viewer (taking turns) and waits until both
    /// viewers show its output: input and output both crossed.
    async fn echo_through_both(&mut self, tag: &str) {
        self.typed += 1;
        let n = self.typed;
        let (line, shown) = (format!("echo {tag}-{n}-$(({n}*1000+7))"), format!("{tag}-{n}-{}", n * 1000 + 7));
        self.viewers[n % 2].type_line(&line).await;
        for viewer in &mut self.viewers {
            viewer.until(&shown).await;
        }
    }
}

/// `GET path` on `api` until it answers `status`; returns the body.
async fn wait_status(api: &Api, path: &str, status: u16) -> Value {
    let deadline = tokio::time::Instant::now() + support::client::WAIT;
    loop {
        let (got, body) = api.get(path).await;
        if got == status {
            return body;
        }
        assert!(tokio::time::Instant::now() < deadline, "{path} on {} still {got}: {body}", api.base);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every host lease as (key, holder), read straight from the database.
async fn host_leases(database: &str) -> BTreeMap<String, String> {
    let client = pg_connect(database).await;
    let rows = client.query("SELECT key, holder FROM leases WHERE key LIKE 'host:%'", &[]).await.expect("leases");
    rows.iter().map(|r| (r.get(0), r.get(1))).collect()
}

/// The `state` column of every host, read straight from the database.
async fn host_columns(database: &str) -> BTreeMap<String, String> {
    let client = pg_connect(database).await;
    let rows = client.query("SELECT id::text, state FROM hosts", &[]).await.expect("hosts");
    rows.iter().map(|r| (r.get(0), r.get(1))).collect()
}

fn assert_running(servers: &mut [&mut TetherServer]) {
    for server in servers.iter_mut() {
        assert!(server.try_exit_status().is_none(), "the instance exited; its log:\n{}", server.log());
    }
}

/// Asserts no instance's log has `event`.
fn assert_never_logged(servers: &[&TetherServer], event: &str) {
    for server in servers {
        let log = server.log();
        assert!(!log.contains(event), "{} logged {event}:\n{log}", server.url());
    }
}

/// PostgreSQL is stopped (fast shutdown: connections ended, port closed)
/// for 20 s while two instances serve daemons and viewers. Meanwhile
/// `/readyz` says 503 and the API 503 `database_unavailable`, but live
/// terminals keep streaming to viewers on both instances (output needs no
/// database) and a run exits. Once PostgreSQL is back: `/readyz` is 200,
/// the run's exit code, output and usage are stored, every host is still
/// online on the same connection (its lease never changed hands), every
/// terminal still runs, and no instance marked a host offline or a run
/// lost, though every lease lapsed while nobody could renew it.
#[actix_rt::test]
async fn postgres_stopped_for_twenty_seconds() {
    let mut pg = OwnPostgres::start();
    let database = pg.database().await;
    let (mut a, mut b) = pair(&database, &redis_url(), &[]).await;
    let ann = Person::on(&a, &b, "ann").await;
    let bob = Person::on(&b, &a, "bob").await;

    // Ann's host is on A: a ticking terminal, watched from A and from B.
    let ticking = ann.terminal(&["sh", "-c", &ticks_script("0.1")]).await;
    let mut ticks = [
        Ticks::follow_unbroken(&a, ann.token(), &ticking).await,
        Ticks::follow_unbroken(&b, ann.token(), &ticking).await,
    ];
    // Bob's host is on B: a shell typed into from B and from A.
    let shell = bob.terminal(&["sh"]).await;
    let mut bob_shell = Shell::open(&shell, bob.token(), [&b, &a]).await;
    bob_shell.echo_through_both("before").await;

    // A run on Ann's host that ends when the test says so, watched from B.
    let flag = ann.dir.path().join("finish-the-run");
    let script = format!(
        "echo run-started; while [ ! -e {} ]; do sleep 0.1; done; echo run-ended-$((6*7)); exit 7",
        flag.display()
    );
    let (status, body) =
        ann.home.post("/api/v1/runs", json!({"hostId": ann.host, "argv": ["sh", "-c", script], "dir": "/tmp"})).await;
    assert_eq!(status, 201, "{body}");
    let run = body["run"]["id"].as_str().expect("run id").to_string();
    let body = ann
        .home
        .wait_for(&format!("/api/v1/runs/{run}"), "the run running", |b| {
            b["run"]["state"] == "running" && b["run"]["terminalId"].is_string()
        })
        .await;
    let run_terminal = body["run"]["terminalId"].as_str().expect("terminal id").to_string();
    let mut run_viewer = Viewer::attach_to(&b, ann.token(), &run_terminal, "").await;

    let leases = host_leases(&database).await;
    assert_eq!(leases.len(), 2, "both hosts hold a lease: {leases:?}");

    pg.stop();
    let stopped = Instant::now();
    for api in [&ann.home, &ann.away] {
        let body = wait_status(api, "/readyz", 503).await;
        assert_ne!(body["checks"]["database"], "ok", "{body}");
        let (status, body) = api.get("/api/v1/hosts").await;
        assert_eq!((status, body["error"]["code"].as_str()), (503, Some("database_unavailable")), "{body}");
    }
    let mut round = 0;
    loop {
        round += 1;
        for ticks in &mut ticks {
            ticks.read_past(5).await;
        }
        bob_shell.echo_through_both("outage").await;
        if round == 2 {
            std::fs::write(&flag, b"").expect("write the flag");
            run_viewer.until("run-ended-42").await;
            assert_eq!(run_viewer.until_exit().await["exitCode"], 7, "the run's viewer saw it end");
        }
        for api in [&ann.home, &ann.away] {
            assert_eq!(api.get("/healthz").await.0, 200, "{} is up", api.base);
        }
        if stopped.elapsed() >= DATABASE_OUTAGE {
            break;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    assert!(round >= 3, "the streams were checked through the outage");

    pg.start_again();
    for api in [&ann.home, &ann.away] {
        wait_status(api, "/readyz", 200).await;
    }
    let body = ann
        .away
        .wait_for(&format!("/api/v1/runs/{run}"), "the run's result and usage", |b| {
            b["run"]["state"] != "running" && b["run"]["usage"].is_object()
        })
        .await;
    assert_eq!((&body["run"]["state"], &body["run"]["exitCode"]), (&json!("failed"), &json!(7)), "{body}");
    assert!(body["run"]["usage"]["wallMs"].as_i64().is_some_and(|ms| ms > 0), "usage stored: {body}");
    let (status, log) = ann.away.get_bytes(&format!("/api/v1/runs/{run}/log")).await;
    let log = String::from_utf8_lossy(&log);
    assert_eq!(status, 200);
    assert!(log.contains("run-started") && log.contains("run-ended-42"), "the whole output stored: {log:?}");
    let terminal = wait_state(&ann.home, &run_terminal, "exited").await;
    assert_eq!(terminal["exitCode"], 7, "{terminal}");

    // Everything that was live still is, on the same connections.
    for ticks in &mut ticks {
        ticks.read_past(10).await;
    }
    bob_shell.echo_through_both("after").await;
    // Leases lapsed while nobody could renew them; each owner renews within
    // a quarter second of the database's return.
    for person in [&ann, &bob] {
        person.wait_online().await;
    }
    for (person, id) in [(&ann, &ticking), (&bob, &shell)] {
        let (_, body) = person.away.get(&format!("/api/v1/terminals/{id}")).await;
        assert_eq!(body["terminal"]["state"], "running", "{body}");
    }
    assert_eq!(host_leases(&database).await, leases, "no lease changed hands: no daemon reconnected");
    // The sweep had its turns after the lapse: one lease TTL and a few sweeps.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let columns = host_columns(&database).await;
    assert!(columns.values().all(|state| state == "online"), "hosts.state: {columns:?}");
    assert_never_logged(&[&a, &b], "tether_host_marked_offline");
    assert_never_logged(&[&a, &b], "tether_run_lost");
    assert_never_logged(&[&a, &b], "tether_daemon_lease_lost");
    drop((ticks, bob_shell, run_viewer));
    assert_running(&mut [&mut a, &mut b]);
    let (_, body) = ann.home.get(&format!("/api/v1/runs/{run}")).await;
    assert_eq!(body["run"]["state"], "failed", "{body}");
    for daemon in [&ann.daemon, &bob.daemon] {
        assert_eq!(daemon.log().matches("tether_daemon_connected").count(), 1, "one connection: {}", daemon.log());
    }
}

/// PostgreSQL hangs (SIGSTOP: connections open, nothing answers) while a
/// terminal streams to a viewer on its owner A and one on B. Both keep
/// streaming through the hang and after, and `/readyz` answers 503. B's heartbeat used to wait on its
/// lease query for as long as the hang lasted, so it stopped reporting its
/// viewers, A dropped B's as gone silent, and B's client got nothing, with
/// no close, until the database was back.
#[actix_rt::test]
async fn postgres_hung_streams_on_across_instances() {
    let pg = OwnPostgres::start();
    let database = pg.database().await;
    let (a, b) = pair(&database, &redis_url(), &[]).await;
    let ann = Person::on(&a, &b, "ann").await;
    let ticking = ann.terminal(&["sh", "-c", &ticks_script("0.1")]).await;
    let mut ticks = [
        Ticks::follow_unbroken(&a, ann.token(), &ticking).await,
        Ticks::follow_unbroken(&b, ann.token(), &ticking).await,
    ];
    pg.pause();
    // Two seconds of ticks a round: many heartbeats (one a second here,
    // and a viewer unreported for three is dropped).
    for _ in 0..4 {
        for ticks in &mut ticks {
            ticks.read_past(20).await;
        }
    }
    // /readyz says so rather than hang with the database (it used to
    // answer 200 once the database was back).
    let (status, body) = tokio::time::timeout(Duration::from_secs(10), ann.away.get("/readyz"))
        .await
        .expect("/readyz answers while the database hangs");
    assert_eq!(status, 503, "{body}");
    assert!(body["checks"]["database"].as_str().is_some_and(|d| d.contains("no answer")), "{body}");
    pg.resume();
    for ticks in &mut ticks {
        ticks.read_past(20).await;
    }
    assert!(!a.log().contains("its home stopped reporting"), "{}", a.log());
}

/// SIGTERM while PostgreSQL hangs and an API request waits on it: the
/// instance still exits within `shutdown.grace_ms` of the signal, as SPEC's
/// drain promises. The drain used to take the whole grace from after its
/// first step, and then the server's graceful stop gave the hung request
/// another second or more. (The half second of slack is for the process's
/// exit after its last step, not for the drain.)
#[actix_rt::test]
async fn a_drain_with_a_hung_database_ends_within_the_grace() {
    let pg = OwnPostgres::start();
    let database = pg.database().await;
    let grace = Duration::from_secs(3);
    let grace_ms = grace.as_millis().to_string();
    let mut server =
        TetherServer::start(&[("TETHER_DATABASE__URL", &database), ("TETHER_SHUTDOWN__GRACE_MS", &grace_ms)], &[])
            .await;
    let api = Api::new(server.url(), create_token(&server, "ann"));
    pg.pause();
    let hung = actix_rt::spawn(async move { api.get("/api/v1/hosts").await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!hung.is_finished(), "the request waits on the hung database");
    let signalled = Instant::now();
    let status = server.terminate_async(Duration::from_secs(30)).await;
    let took = signalled.elapsed();
    pg.resume();
    assert!(status.is_some(), "the instance did not exit:\n{}", server.log());
    let exit = Duration::from_millis(500);
    assert!(took < grace + exit, "exited {took:?} after SIGTERM, grace {grace:?}:\n{}", server.log());
}

/// A server on `env`, a daemon of ann's, and a running terminal of the
/// script that exits 7 once the file `flag` exists.
struct FlaggedExit {
    server: TetherServer,
    daemon: DaemonProcess,
    api: Api,
    host: String,
    terminal: String,
    flag: PathBuf,
    script: String,
    _dir: tempfile::TempDir,
}

async fn flagged_exit(env: &[(&str, &str)]) -> FlaggedExit {
    let server = TetherServer::start(env, &[]).await;
    let token = create_token(&server, "ann");
    let dir = tempfile::tempdir().expect("temp dir");
    let daemon = DaemonProcess::start(&server, &token, &dir.path().join("state"));
    let api = Api::new(server.url(), token);
    let host = wait_online(&api).await;
    let flag = dir.path().join("exit-now");
    let script = format!("while [ ! -e {} ]; do sleep 0.05; done; exit 7", flag.display());
    let (status, body) =
        api.post("/api/v1/terminals", json!({"hostId": host, "argv": ["sh", "-c", script], "dir": "/tmp"})).await;
    assert_eq!(status, 201, "{body}");
    let terminal = body["terminal"]["id"].as_str().expect("terminal id").to_string();
    wait_state(&api, &terminal, "running").await;
    FlaggedExit { server, daemon, api, host, terminal, flag, script, _dir: dir }
}

/// SIGTERM while PostgreSQL hangs and a daemon's connection waits on it
/// (its terminal's exit being written): the daemon still gets its 4503
/// and redials at once. The close used to wait behind the write in the
/// connection's mailbox, so the socket was cut when the grace ran out and
/// the daemon, seeing no close frame, backed off for seconds.
#[actix_rt::test]
async fn a_drain_with_a_hung_database_still_closes_daemons_4503() {
    let pg = OwnPostgres::start();
    let database = pg.database().await;
    let env = [("TETHER_DATABASE__URL", database.as_str()), ("TETHER_SHUTDOWN__GRACE_MS", "6000")];
    // Every part kept: what is left out would be dropped (the daemon killed) here.
    let FlaggedExit { mut server, daemon, flag, _dir, .. } = flagged_exit(&env).await;
    pg.pause();
    std::fs::write(&flag, b"").expect("write the flag");
    // The Exit frame reaches the connection, whose write of it now waits.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let exit = server.terminate_async(Duration::from_secs(30)).await;
    pg.resume();
    assert!(exit.is_some(), "the instance did not exit:\n{}", server.log());
    assert!(
        daemon.log().contains("tether_daemon_instance_draining"),
        "the daemon was not closed 4503:\n{}\n--- server ---\n{}",
        daemon.log(),
        server.log()
    );
}

/// API calls while PostgreSQL hangs (SIGSTOP: connections open, nothing
/// answers) answer `503 database_unavailable` once `database.call_timeout_ms`
/// has passed, while the database still hangs: reads and writes, and more
/// of them at once than the pool has connections, so some wait for a
/// connection rather than on a statement. They used to wait for as long as
/// the hang lasted. Once it ends, the same calls answer again.
#[actix_rt::test]
async fn api_calls_answer_503_while_postgres_hangs() {
    let pg = OwnPostgres::start();
    let database = pg.database().await;
    let env = [
        ("TETHER_DATABASE__URL", database.as_str()),
        ("TETHER_DATABASE__POOL_SIZE", "2"),
        ("TETHER_DATABASE__CALL_TIMEOUT_MS", "1000"),
    ];
    let server = TetherServer::start(&env, &[]).await;
    let api = Api::new(server.url(), create_token(&server, "ann"));
    let (status, body) = api.post("/api/v1/hosts", json!({"hostname": "box"})).await;
    assert_eq!(status, 201, "{body}");
    let host = body["host"]["id"].as_str().expect("host id").to_string();
    pg.pause();
    let (api, host) = (&api, &host);
    let calls = (0..6).map(|i| async move {
        if i % 2 == 0 {
            api.get("/api/v1/hosts").await
        } else {
            api.post("/api/v1/terminals", json!({"hostId": host})).await
        }
    });
    let answers = tokio::time::timeout(Duration::from_secs(8), futures_util::future::join_all(calls))
        .await
        .expect("every call answers while the database still hangs");
    pg.resume();
    for (status, body) in answers {
        assert_eq!(status, 503, "{body}");
        assert_eq!(body["error"]["code"], "database_unavailable", "{body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("did not answer within 1000 ms"), "{body}");
    }
    let (status, body) = api.get("/api/v1/hosts").await;
    assert_eq!(status, 200, "the same calls answer once the database does: {body}");
}

/// A terminal and a run end while PostgreSQL is away: the daemon's
/// connection keeps the terminal's exit and the run's capture keeps the
/// run's end, and the instance is told to stop before the database is
/// back. The drain waits for both (within `shutdown.grace_ms`), stores them
/// once PostgreSQL is back, and only then exits: the terminal reads exited
/// and the run failed, each with its code, rather than running until the
/// sweep calls them lost (docs/ARCHITECTURE.md, "Drain").
///
/// The stop comes only once the server holds the terminal's exit (kept,
/// or queued behind its kept final screen): an Exit frame still on its
/// way when the drain closes the socket 4503 is the daemon's to deliver
/// on its next connection, not this instance's.
#[actix_rt::test]
async fn a_write_kept_through_an_outage_is_stored_before_a_sigterm_exit() {
    let mut pg = OwnPostgres::start();
    let database = pg.database().await;
    let env = [
        ("TETHER_DATABASE__URL", database.as_str()),
        ("TETHER_SHUTDOWN__GRACE_MS", "30000"),
        ("RUST_LOG", "info,tether::relay::daemon_conn=debug"),
    ];
    let FlaggedExit { mut server, daemon: _daemon, api, host, terminal, flag, script, _dir } = flagged_exit(&env).await;
    let run_script = format!("echo run-started; {script}");
    let (status, body) =
        api.post("/api/v1/runs", json!({"hostId": host, "argv": ["sh", "-c", run_script], "dir": "/tmp"})).await;
    assert_eq!(status, 201, "{body}");
    let run = body["run"]["id"].as_str().expect("run id").to_string();
    // Its capture is attached once its first output is in its log.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !String::from_utf8_lossy(&api.get_bytes(&format!("/api/v1/runs/{run}/log")).await.1).contains("run-started") {
        assert!(Instant::now() < deadline, "the run's output never reached its log");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    pg.stop();
    std::fs::write(&flag, b"").expect("write the flag");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !["what=\"terminal exited\"", "tether_run_finish_kept"].iter().all(|kept| server.log().contains(kept)) {
        assert!(Instant::now() < deadline, "the ends were never kept: {}", server.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let listen = server.listen_addr().to_string();
    let back_later = async {
        // Draining, waiting for the database: new connections are refused,
        // not left unanswered in the listener's backlog.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let dial = tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(&listen)).await;
        assert!(matches!(dial, Ok(Err(_))), "a dial while draining: {dial:?}");
        tokio::time::sleep(Duration::from_secs(1)).await;
        pg.start_again();
    };
    let (exit, ()) = tokio::join!(server.terminate_async(Duration::from_secs(40)), back_later);
    assert!(exit.is_some_and(|s| s.success()), "a clean exit: {exit:?}\n{}", server.log());
    assert!(!server.log().contains("tether_drain_timed_out"), "{}", server.log());

    let client = pg_connect(&database).await;
    let row = client
        .query_one("SELECT state, exit_code FROM terminals WHERE id = $1::text::uuid", &[&terminal])
        .await
        .expect("read the terminal");
    let (state, code): (String, Option<i32>) = (row.get(0), row.get(1));
    assert_eq!((state.as_str(), code), ("exited", Some(7)), "the kept exit was stored before the exit");
    let row = client
        .query_one("SELECT state, exit_code FROM runs WHERE id = $1::text::uuid", &[&run])
        .await
        .expect("read the run");
    let (state, code): (String, Option<i32>) = (row.get(0), row.get(1));
    assert_eq!((state.as_str(), code), ("failed", Some(7)), "the run's kept end was stored before the exit");
}

/// Redis is SIGKILLed and started again on the same port while viewers
/// stream terminals of hosts on A and on B, each watched from its own
/// instance and from the other. Viewers on the owner's instance never
/// notice (no close, every line exactly once); viewers across instances
/// keep streaming or are closed 4503 and resume with `?from=` (every line
/// exactly once). While Redis is away `/readyz` says 503 and every host
/// stays online on its owner; once it is back the subscriptions are too:
/// a new viewer across instances streams, and requests across instances
/// (spawn, input) reach the daemons. A request across instances made while
/// Redis is away is answered 504 after `bus.ack_ms`. No lease changes
/// hands throughout.
#[actix_rt::test]
async fn redis_killed_and_restarted() {
    let mut redis = OwnRedis::start();
    let database = pg_database().await;
    let (mut a, mut b) = pair(&database, &redis.url(), &[]).await;
    let ([ann, bob], [ann_ticking, bob_ticking]) = ann_and_bob_ticking(&a, &b, "0.05").await;
    let mut same = [
        Ticks::follow_unbroken(&a, ann.token(), &ann_ticking).await,
        Ticks::follow_unbroken(&b, bob.token(), &bob_ticking).await,
    ];
    let mut across =
        [Ticks::follow(&b, ann.token(), &ann_ticking).await, Ticks::follow(&a, bob.token(), &bob_ticking).await];
    let shell = ann.terminal(&["sh"]).await;
    let leases = host_leases(&database).await;

    redis.kill();
    for api in [&ann.home, &ann.away] {
        let body = wait_status(api, "/readyz", 503).await;
        assert_ne!(body["checks"]["bus"], "ok", "{body}");
    }
    // A request across instances is answered 504 and not held until Redis
    // is back: it used to wait out the outage, then read "nobody listens"
    // and answer 409 host_offline; later it was answered 504 after
    // bus.ack_ms but still sent, and run, once Redis was back.
    let path = format!("/api/v1/terminals/{shell}/input");
    let input = ann.away.post(&path, json!({"data": "echo held-$((6*7))\n"}));
    let (status, body) =
        tokio::time::timeout(Duration::from_secs(30), input).await.expect("answered while Redis is away");
    assert_eq!((status, body["error"]["code"].as_str()), (504, Some("daemon_timeout")), "{body}");
    // A viewer that attaches across instances meanwhile waits, told the
    // host cannot be reached, instead of being closed 4503 each time its
    // join goes unacknowledged (checked below, past a few of those).
    let mut waiting = Socket::connect(&viewer_url(&b, &ann_ticking), Some(ann.token()), &["tether.v1"]).await;
    assert_eq!(waiting.until_message("status").await["host"], "offline");
    // The same for a terminal no viewer on B watched yet, whose channel B
    // must subscribe first: that waits for Redis, and the client used to
    // hear nothing at all until Redis was back. It streams once it is.
    let mut first = Socket::connect(&viewer_url(&b, &shell), Some(ann.token()), &["tether.v1"]).await;
    let told = tokio::time::timeout(Duration::from_secs(5), first.until_message("status")).await;
    assert_eq!(told.expect("a status while Redis is away")["host"], "offline");
    // The owners keep their hosts (PostgreSQL is up): over several renewals.
    for _ in 0..3 {
        for ticks in &mut same {
            ticks.read_past(20).await;
        }
        for person in [&ann, &bob] {
            person.assert_online().await;
        }
        assert_eq!(host_leases(&database).await, leases, "no lease changed hands while Redis was away");
    }

    // bus.ack_ms is 5 s: more than one unacknowledged join by now.
    while let Some(event) = waiting.next_within(Duration::from_secs(12)).await {
        assert!(!matches!(event, Event::Close(_)), "the waiting viewer was closed while Redis was away: {event:?}");
    }
    drop(waiting);
    redis.start_again();
    for api in [&ann.home, &ann.away] {
        wait_status(api, "/readyz", 200).await;
    }
    first.until_message("live").await;
    for ticks in &mut across {
        ticks.read_past(40).await;
    }
    for ticks in &mut same {
        ticks.read_past(40).await;
    }
    // New subscriptions work: a new viewer across instances, requests across instances.
    for (person, id, home, away) in [(&ann, &ann_ticking, &a, &b), (&bob, &bob_ticking, &b, &a)] {
        Ticks::follow_unbroken(away, person.token(), id).await.read_past(10).await;
        let (status, body) =
            person.away.post("/api/v1/terminals", json!({"hostId": person.host, "argv": ["sh"], "dir": "/tmp"})).await;
        assert_eq!(status, 201, "spawned across instances: {body}");
        let shell = body["terminal"]["id"].as_str().expect("terminal id").to_string();
        wait_state(&person.away, &shell, "running").await;
        let (status, body) = person
            .away
            .post(&format!("/api/v1/terminals/{shell}/input"), json!({"data": "echo typed-$((6*7))\n"}))
            .await;
        assert_eq!(status, 202, "{body}");
        Viewer::attach_to(home, person.token(), &shell, "?from=0").await.until("typed-42").await;
    }
    // The input refused while Redis was away never ran, before or after.
    let (status, body) = ann.home.post(&path, json!({"data": "echo after-$((6*7))\n"})).await;
    assert_eq!(status, 202, "{body}");
    let mut shell_viewer = Viewer::attach_to(&a, ann.token(), &shell, "?from=0").await;
    shell_viewer.until("after-42").await;
    assert!(!shell_viewer.text().contains("held-42"), "input answered 504 ran later: {}", shell_viewer.text());
    for person in [&ann, &bob] {
        person.assert_online().await;
    }
    assert_eq!(host_leases(&database).await, leases, "no lease changed hands");
    assert_never_logged(&[&a, &b], "tether_daemon_lease_lost");
    let reattached: usize = across.iter().map(|t| t.reattached).sum();
    eprintln!("viewers across instances reattached {reattached} times");
    drop((same, across));
    assert_running(&mut [&mut a, &mut b]);
    for daemon in [&ann.daemon, &bob.daemon] {
        assert_eq!(daemon.log().matches("tether_daemon_connected").count(), 1, "one connection: {}", daemon.log());
    }
}

/// A daemon moves to the other instance while Redis is away: that instance
/// takes the host at once (its hello no longer waits for Redis, neither to
/// subscribe nor to tell the previous owner) and serves it; once Redis is
/// back, the subscription it finished in the background lets requests from
/// the first instance reach the daemon. The hello used to wait for Redis
/// to come back, the host offline meanwhile.
#[actix_rt::test]
async fn a_daemon_that_moves_while_redis_is_away_is_taken_at_once() {
    let mut redis = OwnRedis::start();
    let database = pg_database().await;
    let (a, b) = pair(&database, &redis.url(), &[]).await;
    let token = create_token(&a, "ann");
    let balancer = Balancer::start(a.listen_addr()).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let _daemon = DaemonProcess::start_url(&balancer.url(), &token, &dir.path().join("state"));
    let (on_a, on_b) = (Api::new(a.url(), token.clone()), Api::new(b.url(), token.clone()));
    let host = wait_online(&on_a).await;
    let (status, body) = on_a.post("/api/v1/terminals", json!({"hostId": host, "argv": ["sh"], "dir": "/tmp"})).await;
    assert_eq!(status, 201, "{body}");
    let shell = body["terminal"]["id"].as_str().expect("terminal id").to_string();
    wait_state(&on_a, &shell, "running").await;
    let (_, card) = Api::new(b.url(), "").get("/api/v1/instance").await;
    let b_instance = card["instanceId"].as_str().expect("instance id").to_string();

    redis.kill();
    balancer.switch(b.listen_addr());
    let key = format!("host:{host}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !host_leases(&database).await.get(&key).is_some_and(|h| h.starts_with(&format!("{b_instance}#"))) {
        assert!(Instant::now() < deadline, "B did not take the host while Redis was away:\n{}", b.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let input = |text: &str| json!({ "data": format!("echo {text}-$((6*7))\n") });
    let (status, body) = on_b.post(&format!("/api/v1/terminals/{shell}/input"), input("moved")).await;
    assert_eq!(status, 202, "B serves the host with Redis away: {body}");
    Viewer::attach_to(&b, &token, &shell, "?from=0").await.until("moved-42").await;

    redis.start_again();
    wait_status(&on_a, "/readyz", 200).await;
    let path = format!("/api/v1/terminals/{shell}/input");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = on_a.post(&path, input("across")).await;
        if status == 202 {
            break;
        }
        assert!(Instant::now() < deadline, "A never reached the host on B: {status} {body}\n{}", b.log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Viewer::attach_to(&b, &token, &shell, "?from=0").await.until("across-42").await;
    // A's unsubscribe of the host's channel failed while Redis was away,
    // and its Redis client subscribed the channel again on reconnecting.
    // Only B answers: A used to answer "offline" to requests from any
    // instance, itself included, racing B's acknowledgement for as long
    // as A ran. A drops the stale subscription instead.
    for n in 0..10 {
        let (status, body) = on_a.post(&path, input(&format!("again{n}"))).await;
        assert_eq!(status, 202, "request {n} after Redis came back: {body}\n{}", a.log());
    }
    Viewer::attach_to(&b, &token, &shell, "?from=0").await.until("again9-42").await;
}

/// A client that keeps typing into a viewer across instances while Redis
/// answers nothing (SIGSTOP) does not grow its home's queue without end:
/// past 4 MiB of messages waiting for the bus the viewer is closed 4503,
/// to reattach once the bus is back. Before, its messages queued for as
/// long as the stall lasted, and the socket stayed open.
#[actix_rt::test]
async fn typing_across_instances_into_a_stalled_bus_closes_the_viewer_4503() {
    let redis = OwnRedis::start();
    let database = pg_database().await;
    let (a, b) = pair(&database, &redis.url(), &[]).await;
    let ann = Person::on(&a, &b, "ann").await;
    let shell = ann.terminal(&["sh"]).await;
    wait_state(&ann.home, &shell, "running").await;
    let mut viewer = Viewer::attach_to(&b, ann.token(), &shell, "").await;
    redis.pause();
    // 6 MiB of input in 64 KiB messages.
    let paste = bytes::Bytes::from(vec![b'#'; 64 * 1024]);
    for _ in 0..96 {
        viewer.sock.send_binary(paste.clone()).await;
    }
    assert_eq!(viewer.sock.expect_close().await, Some(4503));
    let reason = viewer.sock.close_reason().unwrap_or_default().to_string();
    redis.resume();
    assert!(reason.contains("bus"), "{reason}");
}

/// How far ahead of A's the wall clock of B is, from their HTTP `Date` headers.
async fn clock_ahead(a: &TetherServer, b: &TetherServer) -> i64 {
    let date = |server: &TetherServer| {
        let url = format!("{}/healthz", server.url());
        async move {
            let response = awc::Client::new().get(url).send().await.expect("GET /healthz");
            let header = response.headers().get("date").expect("a Date header").to_str().expect("ascii").to_string();
            chrono::DateTime::parse_from_rfc2822(&header).expect("an HTTP date").timestamp()
        }
    };
    date(b).await - date(a).await
}

/// Watches `people`'s hosts for `renewals` lease renewals (one a second):
/// each stays online as every API sees it, no lease changes hands, and
/// every `Ticks` keeps streaming.
async fn watch_steady(database: Option<&str>, people: &[&Person], ticks: &mut [Ticks<'_>], renewals: u32) {
    let leases = match database {
        Some(database) => host_leases(database).await,
        None => BTreeMap::new(),
    };
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(renewals.into()) {
        for person in people {
            person.assert_online().await;
        }
        if let Some(database) = database {
            assert_eq!(host_leases(database).await, leases, "no lease changed hands");
        }
        for ticks in ticks.iter_mut() {
            ticks.read_past(5).await;
        }
    }
}

/// Instance B's wall clock runs 20 s ahead of A's and PostgreSQL's (through
/// libfaketime; B's `Date` header shows it). Leases are written and judged
/// by the database's clock (`now()`), so nothing notices: over ten renewals
/// (more than three lease TTLs) both hosts stay online as both instances
/// see them, no lease changes hands, no connection is replaced or told its
/// lease was lost, and viewers across instances are never closed (their
/// heartbeat reads the leases every second). Were a lease judged by an
/// instance's own clock, B would see A's leases 17 s stale.
#[actix_rt::test]
async fn clock_twenty_seconds_ahead_on_postgres() {
    let database = pg_database().await;
    let skew = clock_ahead_env(20);
    let skew: Vec<(&str, &str)> = skew.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let (mut a, mut b) = pair(&database, &redis_url(), &skew).await;
    let ahead = clock_ahead(&a, &b).await;
    assert!((19..=21).contains(&ahead), "B's clock is 20 s ahead: {ahead} s");
    let ([ann, bob], [ann_ticking, bob_ticking]) = ann_and_bob_ticking(&a, &b, "0.1").await;
    let mut across = [
        Ticks::follow_unbroken(&b, ann.token(), &ann_ticking).await,
        Ticks::follow_unbroken(&a, bob.token(), &bob_ticking).await,
    ];
    watch_steady(Some(&database), &[&ann, &bob], &mut across, 10).await;
    for event in ["tether_daemon_lease_lost", "tether_daemon_replaced", "tether_remote_viewer_reattach"] {
        assert_never_logged(&[&a, &b], event);
    }
    drop(across);
    assert_running(&mut [&mut a, &mut b]);
    for daemon in [&ann.daemon, &bob.daemon] {
        assert_eq!(daemon.log().matches("tether_daemon_connected").count(), 1, "one connection: {}", daemon.log());
    }
}

/// The embedded SQLite store judges leases by the instance's own clock
/// (one instance, one clock: docs/OPERATIONS.md, "Faults"). With that clock
/// 20 s ahead of the real one (and of the `tether token create` that made
/// the token), a host stays online and its viewer streams over ten renewals.
#[actix_rt::test]
async fn clock_twenty_seconds_ahead_on_sqlite() {
    let skew = clock_ahead_env(20);
    let mut env: Vec<(&str, &str)> = skew.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    env.extend_from_slice(&FAST);
    env.extend_from_slice(&[("TETHER_LEASE__RENEW_MS", "1000"), ("TETHER_LEASE__TTL_MS", "3000")]);
    let mut server = TetherServer::start(&env, &[]).await;
    let ann = Person::on(&server, &server, "ann").await;
    let ticking = ann.terminal(&["sh", "-c", &ticks_script("0.1")]).await;
    let mut ticks = [Ticks::follow_unbroken(&server, ann.token(), &ticking).await];
    watch_steady(None, &[&ann], &mut ticks, 10).await;
    assert_never_logged(&[&server], "tether_daemon_lease_lost");
    drop(ticks);
    assert_running(&mut [&mut server]);
}

/// How the disk under the SQLite file fills up.
enum FullDisk {
    /// A small tmpfs, filled with a ballast file (ENOSPC).
    Tmpfs(SmallDisk),
    /// A file-size limit on the server process (EFBIG).
    FileSizeLimit,
}

impl FullDisk {
    fn fill(&self, server: &TetherServer, database: &Path) {
        match self {
            FullDisk::Tmpfs(disk) => disk.fill(),
            FullDisk::FileSizeLimit => {
                // Just past the files as they are: the next growth fails.
                let size = |path: PathBuf| std::fs::metadata(path).map_or(0, |m| m.len());
                let wal = PathBuf::from(format!("{}-wal", database.display()));
                let limit = size(database.to_path_buf()).max(size(wal)) + 16 * 1024;
                limit_file_size(server.pid(), Some(limit));
            }
        }
    }

    fn free(&self, server: &TetherServer) {
        match self {
            FullDisk::Tmpfs(disk) => disk.free(),
            FullDisk::FileSizeLimit => limit_file_size(server.pid(), None),
        }
    }
}

/// The SQLite file's disk fills up under a running server: writes fail
/// with a clear error (507 `storage_full` from the API, the cause in the
/// log) and change nothing, reads go on, the instance stays up. Once there
/// is room again writes succeed, and after a crash (SIGKILL) the file
/// passes `PRAGMA integrity_check`, holds every write that was answered
/// 201 and none that failed, and a new server opens it.
async fn sqlite_disk_fills_up(dir: &Path, disk: FullDisk) {
    let database = dir.join("tether.db");
    let path = database.display().to_string();
    let env = [("TETHER_DATABASE__SQLITE_PATH", path.as_str()), ("RUST_LOG", "info")];
    let mut server = TetherServer::start(&env, &[]).await;
    let api = Api::new(server.url(), create_token(&server, "ann"));
    let register = |i: usize| {
        let hostname = format!("box-{i:05}-{}", "x".repeat(200));
        json!({"name": hostname, "hostname": hostname, "platform": "linux", "arch": "x86_64"})
    };
    let mut stored = 0;
    let (status, body) = api.post("/api/v1/hosts", register(stored)).await;
    assert_eq!(status, 201, "{body}");
    stored += 1;

    disk.fill(&server, &database);
    let refused = loop {
        let (status, body) = api.post("/api/v1/hosts", register(stored)).await;
        match status {
            201 => stored += 1,
            _ => break (status, body),
        }
        assert!(stored < 5000, "still writing after {stored} hosts: the disk never filled");
    };
    assert_eq!(refused.0, 507, "{}", refused.1);
    assert_eq!(refused.1["error"]["code"], "storage_full", "{}", refused.1);
    for _ in 0..3 {
        let (status, body) = api.post("/api/v1/hosts", register(stored)).await;
        assert_eq!((status, &body["error"]["code"]), (507, &json!("storage_full")), "{body}");
    }
    let (status, body) = api.get("/api/v1/hosts").await;
    assert_eq!(status, 200, "reads go on: {body}");
    assert_eq!(body["hosts"].as_array().map(Vec::len), Some(stored), "{body}");
    assert_eq!(api.get("/healthz").await.0, 200);
    assert!(server.try_exit_status().is_none(), "the instance stays up: {}", server.log());
    assert!(server.log().contains("tether_storage_full"), "the cause is in the log: {}", server.log());

    disk.free(&server);
    let (status, body) = api.post("/api/v1/hosts", register(stored)).await;
    assert_eq!(status, 201, "writes work again: {body}");
    stored += 1;

    server.kill();
    let file = rusqlite::Connection::open(&database).expect("open the database file");
    let check: String = file.query_row("PRAGMA integrity_check", [], |r| r.get(0)).expect("integrity_check");
    assert_eq!(check, "ok");
    let hosts: i64 = file.query_row("SELECT count(*) FROM hosts", [], |r| r.get(0)).expect("count hosts");
    assert_eq!(hosts, stored as i64, "every answered write and nothing else");
    drop(file);
    let again = TetherServer::start(&env, &[]).await;
    let (status, body) = Api::new(again.url(), api.token.clone()).get("/api/v1/hosts").await;
    assert_eq!((status, body["hosts"].as_array().map(Vec::len)), (200, Some(stored)), "{body}");
}

/// The disk under the SQLite file fills up: a small tmpfs where this test
/// may mount one (root, outside a locked-down container), else the same
/// through a file-size limit, said so on stderr (never skipped).
#[actix_rt::test]
async fn sqlite_disk_full() {
    match SmallDisk::mount() {
        Ok(disk) => {
            let dir = disk.path().to_path_buf();
            sqlite_disk_fills_up(&dir, FullDisk::Tmpfs(disk)).await;
        }
        Err(reason) => {
            eprintln!("cannot mount a tmpfs ({reason}): filling the disk with a file-size limit instead");
            let dir = tempfile::tempdir().expect("temp dir");
            sqlite_disk_fills_up(dir.path(), FullDisk::FileSizeLimit).await;
        }
    }
}

/// The SQLite file reaches the server's file-size limit (`ulimit -f`): the
/// same as a full disk, and the process is not killed by SIGXFSZ.
#[actix_rt::test]
async fn sqlite_file_size_limit() {
    let dir = tempfile::tempdir().expect("temp dir");
    sqlite_disk_fills_up(dir.path(), FullDisk::FileSizeLimit).await;
}

/// The path to the daemon's instance silently stops (a balancer freezes
/// the connection: open, nothing forwarded either way, as in a network
/// partition or with the instance frozen). The daemon gives the socket up
/// once nothing answers a Ping for 20 s, redials, and its terminal goes on
/// over the new connection. It used to wait for 75 s of silence, checked
/// at its 30 s pings: 75 to 90 s with the host unreachable.
#[actix_rt::test]
async fn a_daemon_leaves_a_connection_that_stopped_answering() {
    let server = TetherServer::start(&[], &[]).await;
    let token = create_token(&server, "ann");
    let balancer = Balancer::start(server.listen_addr()).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let daemon = DaemonProcess::start_url(&balancer.url(), &token, &dir.path().join("state"));
    let api = Api::new(server.url(), token.clone());
    let host = wait_online(&api).await;
    let (status, body) = api.post("/api/v1/terminals", json!({"hostId": host, "argv": ["sh"], "dir": "/tmp"})).await;
    assert_eq!(status, 201, "{body}");
    let shell = body["terminal"]["id"].as_str().expect("terminal id").to_string();
    wait_state(&api, &shell, "running").await;

    balancer.stall();
    // The next Ping is at most 30 s away, and its answer due 20 s after it.
    let deadline = Instant::now() + Duration::from_secs(30 + 20 + 10);
    while daemon.log().matches("tether_daemon_connected").count() < 2 {
        assert!(Instant::now() < deadline, "the daemon did not redial in time:\n{}", daemon.log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let input = json!({ "data": "echo redialled-$((6*7))\n" });
    let path = format!("/api/v1/terminals/{shell}/input");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = api.post(&path, input.clone()).await;
        if status == 202 {
            break;
        }
        assert!(Instant::now() < deadline, "the terminal was not served again: {status} {body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Viewer::attach_to(&server, &token, &shell, "?from=0").await.until("redialled-42").await;
}

/// A viewer on B of Ann's shell on A types while Redis is away. Its input
/// cannot cross, and it is closed 4503 at once, so that the client holds
/// what it types next (the web page and `tether attach` do) and sends it
/// once it is back. It used to stay open, its messages held by the Redis
/// client until Redis came back, and then lost: they reached A before A had
/// subscribed again (25 s of typing lost in a probe's run).
#[actix_rt::test]
async fn a_viewer_across_instances_is_closed_when_redis_goes_away() {
    let mut redis = OwnRedis::start();
    let database = pg_database().await;
    let (a, b) = pair(&database, &redis.url(), &[]).await;
    let ann = Person::on(&a, &b, "ann").await;
    let shell = ann.terminal(&["sh"]).await;
    let mut on_b = Viewer::attach_to(&b, ann.token(), &shell, "").await;
    on_b.type_line("echo before-$((6*7))").await;
    on_b.until("before-42").await;

    redis.kill();
    on_b.type_line("echo during").await;
    let closed = tokio::time::timeout(Duration::from_secs(5), on_b.sock.expect_close()).await;
    assert_eq!(closed.ok().flatten(), Some(4503), "the viewer was not told to reattach while Redis was away");

    redis.start_again();
    wait_status(&ann.away, "/readyz", 200).await;
    let mut again = Viewer::attach_to(&b, ann.token(), &shell, "").await;
    again.type_line("echo after-$((6*7))").await;
    again.until("after-42").await;
}

/// Runs `redis-cli` against `redis`; it must succeed.
fn redis_cli(redis: &OwnRedis, args: &[&str]) {
    let out = std::process::Command::new("redis-cli")
        .args(["-p", &redis.port().to_string()])
        .args(args)
        .output()
        .expect("redis-cli");
    assert!(out.status.success(), "redis-cli {args:?}: {out:?}");
}

/// An ACL keeps every instance from subscribing, and the subscriptions
/// they hold are dropped (their pubsub connections killed).
fn refuse_subscriptions(redis: &OwnRedis) {
    redis_cli(redis, &["ACL", "SETUSER", "default", "-subscribe", "-ssubscribe", "-psubscribe"]);
    redis_cli(redis, &["CLIENT", "KILL", "TYPE", "pubsub"]);
}

fn allow_subscriptions(redis: &OwnRedis) {
    redis_cli(redis, &["ACL", "SETUSER", "default", "+subscribe", "+ssubscribe", "+psubscribe"]);
}

/// A request through another instance for a host whose owner is live but
/// not subscribed (here an ACL keeps it from subscribing again; after a
/// Redis restart it is a moment) reaches nobody: that is `504
/// daemon_timeout`, the request was not sent, never `409 host_offline`,
/// which is never to be said of a live owner. It used to be 409.
#[actix_rt::test]
async fn a_request_no_instance_hears_for_a_live_host_is_504_not_409() {
    let redis = OwnRedis::start();
    let database = pg_database().await;
    let (a, b) = pair(&database, &redis.url(), &[]).await;
    let ann = Person::on(&a, &b, "ann").await;
    let shell = ann.terminal(&["sh"]).await;
    refuse_subscriptions(&redis);
    wait_status(&Api::new(a.url(), String::new()), "/readyz", 503).await;
    ann.assert_online().await;
    let path = format!("/api/v1/terminals/{shell}/input");
    let (status, body) = ann.away.post(&path, json!({"data": "echo unheard-$((6*7))\n"})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (504, Some("daemon_timeout")), "{body}");
    assert!(body["error"]["message"].as_str().is_some_and(|m| m.contains("not sent")), "{body}");

    allow_subscriptions(&redis);
    for server in [&a, &b] {
        wait_status(&Api::new(server.url(), String::new()), "/readyz", 200).await;
    }
    let (status, body) = ann.away.post(&path, json!({"data": "echo heard-$((6*7))\n"})).await;
    assert_eq!(status, 202, "{body}");
    let mut viewer = Viewer::attach_to(&a, ann.token(), &shell, "?from=0").await;
    viewer.until("heard-42").await;
    assert!(!viewer.text().contains("unheard-42"), "the refused input never ran: {:?}", viewer.text());
}

/// `/readyz` asks Redis whether this instance is subscribed, not only
/// whether Redis answers: with its subscriber connection dropped and its
/// subscriptions refused (an ACL that forbids SUBSCRIBE), the instance is
/// unready although Redis answers PING, and ready again once it could
/// subscribe again. It used to stay ready: a flag set at the first
/// subscription was never cleared.
#[actix_rt::test]
async fn readyz_says_unready_while_the_instance_is_not_subscribed() {
    let redis = OwnRedis::start();
    let database = pg_database().await;
    let (a, _b) = pair(&database, &redis.url(), &[]).await;
    let api = Api::new(a.url(), String::new());
    wait_status(&api, "/readyz", 200).await;
    refuse_subscriptions(&redis);
    let body = wait_status(&api, "/readyz", 503).await;
    assert!(body["checks"]["bus"].as_str().is_some_and(|b| b.contains("not subscribed")), "{body}");
    allow_subscriptions(&redis);
    wait_status(&api, "/readyz", 200).await;
}
