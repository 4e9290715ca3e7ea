//! Three real `tether serve` instances sharing one PostgreSQL and one Redis
//! (standalone, and the three-master Redis Cluster), a real `tether daemon`
//! with real PTYs on instance A, and REST calls through B and C
//! (docs/CLUSTER.md, "Requests").

mod support;

use serde_json::{json, Value};
use support::balancer::Balancer;
use support::client::{create_token, viewer_url, Api, Socket};
use support::daemon::DaemonProcess;
use support::e2e::{metric, reattach, Ticks, Viewer};
use support::{pg_database, redis_cluster_nodes, redis_url, unique_prefix, TetherServer};

struct Cluster {
    a: TetherServer,
    b: Api,
    c: Api,
    /// A's API.
    api: Api,
    /// B and C.
    servers: Vec<TetherServer>,
    _dir: tempfile::TempDir,
    daemon: DaemonProcess,
    host: String,
    /// What the daemon dials: a TCP balancer, first pointing at A.
    balancer: Balancer,
}

async fn cluster(standalone: bool, extra: &[(&str, &str)]) -> Cluster {
    let redis = if standalone {
        ("TETHER_REDIS__URL", redis_url())
    } else {
        ("TETHER_REDIS__CLUSTER_NODES", redis_cluster_nodes())
    };
    cluster_on(redis, extra, &[]).await
}

/// Three instances on the Redis that `redis` (setting, value) names; B
/// also gets `b_only`.
async fn cluster_on(redis: (&str, String), extra: &[(&str, &str)], b_only: &[(&str, &str)]) -> Cluster {
    let database = pg_database().await;
    let prefix = unique_prefix();
    let mut env = vec![
        ("TETHER_DATABASE__URL", database.as_str()),
        (redis.0, redis.1.as_str()),
        ("TETHER_BUS__PREFIX", prefix.as_str()),
    ];
    env.extend_from_slice(extra);
    let a = TetherServer::start(&env, &[]).await;
    let b = TetherServer::start(&[env.as_slice(), b_only].concat(), &[]).await;
    let c = TetherServer::start(&env, &[]).await;
    let token = create_token(&a, "ann");
    let api = Api::new(a.url(), token.clone());
    let dir = tempfile::tempdir().expect("temp dir");
    let balancer = Balancer::start(a.listen_addr()).await;
    let daemon = DaemonProcess::start_url(&balancer.url(), &token, &dir.path().join("state"));
    let body = api
        .wait_for("/api/v1/hosts", "host online", |b| {
            b["hosts"].as_array().is_some_and(|h| h.iter().any(|h| h["state"] == "online"))
        })
        .await;
    let host = body["hosts"][0]["id"].as_str().expect("host id").to_string();
    Cluster {
        b: Api::new(b.url(), token.clone()),
        c: Api::new(c.url(), token),
        api,
        a,
        servers: vec![b, c],
        _dir: dir,
        daemon,
        host,
        balancer,
    }
}

async fn wait_state(api: &Api, id: &str, state: &str) -> Value {
    api.wait_for(&format!("/api/v1/terminals/{id}"), state, |b| b["terminal"]["state"] == state).await["terminal"]
        .clone()
}

/// A viewer on A, where the daemon is: it sees what B's and C's requests did.
async fn viewer_on_a(cl: &Cluster, terminal: &str) -> Viewer {
    Viewer::attach_to(&cl.a, &cl.api.token, terminal, "").await
}

async fn requests_from_any_instance(standalone: bool) {
    let cl = cluster(standalone, &[]).await;
    // Spawned through B: acknowledged by A and running.
    let (status, body) =
        cl.b.post("/api/v1/terminals", json!({"hostId": cl.host, "argv": ["sh"], "dir": "/tmp"})).await;
    assert_eq!(status, 201, "{body}");
    assert_ne!(body["terminal"]["state"], "pending", "spawned at once through the owner: {body}");
    let id = body["terminal"]["id"].as_str().expect("id").to_string();
    wait_state(&cl.c, &id, "running").await;
    let mut viewer = viewer_on_a(&cl, &id).await;

    // Input through B, resize through C: they reach the PTY.
    let (status, body) = cl.c.post(&format!("/api/v1/terminals/{id}/resize"), json!({"cols": 101, "rows": 33})).await;
    assert_eq!(status, 202, "{body}");
    let (status, body) = cl.b.post(&format!("/api/v1/terminals/{id}/input"), json!({"data": "stty size\n"})).await;
    assert_eq!(status, 202, "{body}");
    viewer.until("33 101").await;
    let (status, _) =
        cl.b.post(&format!("/api/v1/terminals/{id}/input"), json!({"data": "echo from-$((40+2))\n"})).await;
    assert_eq!(status, 202);
    viewer.until("from-42").await;

    // Dirs and limits through B and C get the daemon's answers.
    let extra = tempfile::tempdir().expect("dir");
    let path = std::fs::canonicalize(extra.path()).expect("canonical").to_string_lossy().into_owned();
    let (status, body) = cl.b.post(&format!("/api/v1/hosts/{}/dirs", cl.host), json!({"path": path})).await;
    assert_eq!(status, 200, "{body}");
    assert!(body["dirs"].as_array().is_some_and(|d| d.iter().any(|d| d == &json!(path))), "{body}");
    let (status, body) = cl.c.post(&format!("/api/v1/hosts/{}/limits/refresh", cl.host), json!({})).await;
    assert_eq!(status, 200, "{body}");
    assert!(body["limits"].is_object(), "{body}");
    // A refusal crosses too: the daemon cannot add a dir that does not exist.
    let (status, body) =
        cl.c.post(&format!("/api/v1/hosts/{}/dirs", cl.host), json!({"path": "/no/such/dir/anywhere"})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (502, Some("daemon_refused")), "{body}");

    // Kill through C (an interactive sh ignores TERM): the row stays
    // running until the real exit.
    let (status, body) = cl.c.post(&format!("/api/v1/terminals/{id}/kill"), json!({"signal": "KILL"})).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["terminal"]["state"], "running");
    let t = wait_state(&cl.b, &id, "exited").await;
    assert_eq!(t["exitSignal"], 9);

    // Runs created through B finish, whichever instance dispatched them.
    let (status, body) =
        cl.b.post("/api/v1/runs", json!({"hostId": cl.host, "argv": ["sh", "-c", "echo ran; exit 3"]})).await;
    assert_eq!(status, 201, "{body}");
    let run = body["run"]["id"].as_str().expect("run").to_string();
    let body =
        cl.c.wait_for(&format!("/api/v1/runs/{run}"), "run failed with usage", |b| {
            b["run"]["state"] == "failed" && b["run"]["usage"].is_object()
        })
        .await;
    assert_eq!(body["run"]["exitCode"], 3);
    let (_, log) = cl.b.get_bytes(&format!("/api/v1/runs/{run}/log")).await;
    assert!(String::from_utf8_lossy(&log).contains("ran"));
}

async fn offline_is_answered_at_once(standalone: bool) {
    // An owner that never acknowledged would hold each request for 10
    // minutes: only "nobody listening" can answer these.
    let mut cl = cluster(standalone, &[("TETHER_BUS__ACK_MS", "600000")]).await;
    cl.daemon.kill();
    cl.b.wait_for(&format!("/api/v1/hosts/{}", cl.host), "host offline", |b| b["host"]["state"] == "offline").await;
    let (status, body) = cl.b.post(&format!("/api/v1/hosts/{}/limits/refresh", cl.host), json!({})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (409, Some("host_offline")), "{body}");
    let (status, body) = cl.c.post("/api/v1/terminals", json!({"hostId": cl.host, "argv": ["sh"]})).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(
        (body["terminal"]["state"].as_str(), body["terminal"]["pendingReason"].as_str()),
        (Some("pending"), Some("host_offline"))
    );
}

/// A viewer on B of a terminal whose daemon is on A: replay then live,
/// input and resize through B, a resume through B, and a kill through C
/// whose exit reaches B's viewer. The grid arbiter on A serves viewers on
/// every instance: B's resize claims the grid (`size` with `yours: true`
/// on B, `yours: false` on A and C), then C's takes it over, and `stty
/// size` in the PTY shows each claim.
async fn viewer_on_another_instance(standalone: bool) {
    let cl = cluster(standalone, &[]).await;
    let (status, body) =
        cl.c.post("/api/v1/terminals", json!({"hostId": cl.host, "argv": ["sh"], "dir": "/tmp"})).await;
    assert_eq!(status, 201, "{body}");
    let id = body["terminal"]["id"].as_str().expect("id").to_string();
    wait_state(&cl.b, &id, "running").await;
    let mut on_b = Viewer::attach_to(&cl.servers[0], &cl.api.token, &id, "").await;
    on_b.resize(97, 31).await;
    on_b.type_line("stty size; echo via-$((6*7))").await;
    on_b.until("31 97").await;
    on_b.until("via-42").await;
    assert!(on_b.until_size(97, 31).await, "B's viewer claimed the grid: {:?}", on_b.controls);
    // The same stream through A, from where B's viewer went live.
    let mut on_a = Viewer::attach_to(&cl.a, &cl.api.token, &id, &format!("?from={}", on_b.start)).await;
    on_a.until("via-42").await;
    // A resume through C from the same offset: the same bytes, no gap, no repeat.
    let mut on_c = Viewer::attach_to(&cl.servers[1], &cl.api.token, &id, &format!("?from={}", on_b.start)).await;
    on_c.until("via-42").await;
    assert!(!on_a.until_size(97, 31).await, "the grid is B's, not A's viewer's: {:?}", on_a.controls);
    assert!(!on_c.until_size(97, 31).await, "the grid is B's, not C's viewer's: {:?}", on_c.controls);
    // C's viewer claims the grid: the PTY takes its size, and B's viewer is
    // told the grid is no longer its own.
    on_c.resize(88, 27).await;
    assert!(on_c.until_size(88, 27).await, "C's viewer claimed the grid: {:?}", on_c.controls);
    assert!(!on_b.until_size(88, 27).await, "B's viewer lost the grid to C's: {:?}", on_b.controls);
    assert!(!on_a.until_size(88, 27).await, "A's viewer never held the grid: {:?}", on_a.controls);
    on_b.type_line("stty size").await;
    for v in [&mut on_a, &mut on_b, &mut on_c] {
        v.until("27 88").await;
    }
    on_b.type_line("echo after-$((1+1))").await;
    for v in [&mut on_a, &mut on_b, &mut on_c] {
        v.until("after-2").await;
    }
    let reference = on_a.text();
    let upto = |v: &Viewer| {
        let t = v.text();
        let end = t.rfind("after-2").expect("after-2") + "after-2".len();
        t[..end].to_string()
    };
    assert_eq!(upto(&on_b), upto(&on_a), "B's live bytes equal A's from the same offset");
    assert_eq!(upto(&on_c), upto(&on_a), "C's resumed bytes equal A's");
    assert!(reference.contains("31 97"));
    // Kill through C: the exit reaches the viewer on B.
    let (status, _) = cl.c.post(&format!("/api/v1/terminals/{id}/kill"), json!({"signal": "KILL"})).await;
    assert_eq!(status, 202);
    let exit = on_b.until_exit().await;
    assert_eq!(exit["type"], "exit", "{exit}");
    assert_eq!(on_b.sock.expect_close().await, Some(1000));
}

/// A terminal on A that floods once its viewer on B says `go`: that viewer,
/// which reads nothing more from then on.
async fn flood_watched_on_b(cl: &Cluster) -> Viewer {
    let flood = "read go; while :; do head -c 300000 /dev/urandom | base64; done";
    let (status, body) = cl.c.post("/api/v1/terminals", json!({"hostId": cl.host, "argv": ["sh", "-c", flood]})).await;
    assert_eq!(status, 201, "{body}");
    let x = body["terminal"]["id"].as_str().expect("id").to_string();
    wait_state(&cl.b, &x, "running").await;
    let mut stalled = Viewer::attach_to(&cl.servers[0], &cl.api.token, &x, "").await;
    stalled.type_line("go").await;
    stalled
}

/// Flow control across instances: terminal X floods, its viewer on B stops
/// reading. The owner A counts what B's client has not taken, so X pauses
/// for it as for a local viewer: B's queue stays within its bound and the
/// viewer is not cut (`viewer.slow_ms` is long), while terminal Y of the
/// same daemon keeps echoing through B. Without the credit B's queue would
/// pass `viewer.queue_bytes` within seconds and B would close it 1008.
#[actix_rt::test]
async fn a_slow_viewer_on_another_instance_holds_back_only_its_terminal() {
    let cl = cluster(true, &[("TETHER_VIEWER__SLOW_MS", "600000")]).await;
    let b = &cl.servers[0];
    let mut stalled = flood_watched_on_b(&cl).await;
    // `stalled` never reads again; at ~3 MB/s, eight seconds of output
    // is several times B's queue bound.
    tokio::time::sleep(std::time::Duration::from_secs(8)).await;

    let (status, body) = cl.b.post("/api/v1/terminals", json!({"hostId": cl.host, "argv": ["cat"]})).await;
    assert_eq!(status, 201, "{body}");
    let y = body["terminal"]["id"].as_str().expect("id").to_string();
    wait_state(&cl.b, &y, "running").await;
    let mut typist = Viewer::attach_to(b, &cl.api.token, &y, "").await;
    for n in 0..10 {
        typist.type_line(&format!("line-{n}-end")).await;
        typist.until(&format!("line-{n}-end\r\nline-{n}-end")).await;
    }

    let high = metric(&cl.b, "tether_viewer_queue_high_water_bytes").await.expect("gauge");
    assert!(high <= 4.0 * 1024.0 * 1024.0, "B's viewer queue passed its bound: {high}");
    for _ in 0..3 {
        match stalled.sock.next_within(support::client::WAIT).await {
            Some(support::client::Event::Close(code)) => panic!("the stalled viewer was closed ({code:?})"),
            None => panic!("the stalled viewer got nothing"),
            Some(_) => {}
        }
    }
}

/// A viewer on B too slow for terminal X on A is closed 1008 once it has
/// held X back for `viewer.slow_ms`, and A, which closed it, counts it in
/// `tether_viewer_slow_closed_total` as it would a local socket. Such
/// closes went uncounted on every instance.
#[actix_rt::test]
async fn a_slow_viewer_on_another_instance_is_closed_and_counted() {
    let cl = cluster(true, &[("TETHER_VIEWER__SLOW_MS", "2000")]).await;
    let mut stalled = flood_watched_on_b(&cl).await;
    // `stalled` reads nothing more until X has waited on it for 2 s.
    tokio::time::sleep(std::time::Duration::from_secs(6)).await;
    let code = loop {
        match stalled.sock.next_within(support::client::WAIT).await {
            Some(support::client::Event::Close(code)) => break code,
            None => panic!("the stalled viewer was never closed"),
            Some(_) => {}
        }
    };
    assert_eq!(code, Some(1008));
    let counted = metric(&cl.api, "tether_viewer_slow_closed_total").await;
    assert_eq!(counted, Some(1.0), "A closed it and counts it");
}

/// A shell made through C, running, and a viewer on C that saw it answer.
async fn shell_viewed_on_c(cl: &Cluster) -> (String, Viewer) {
    let (status, body) =
        cl.c.post("/api/v1/terminals", json!({"hostId": cl.host, "argv": ["sh"], "dir": "/tmp"})).await;
    assert_eq!(status, 201, "{body}");
    let id = body["terminal"]["id"].as_str().expect("id").to_string();
    wait_state(&cl.c, &id, "running").await;
    let mut on_c = Viewer::attach_to(&cl.servers[1], &cl.api.token, &id, "").await;
    on_c.type_line("echo before-$((2+3))").await;
    on_c.until("before-5").await;
    (id, on_c)
}

/// The daemon moves from A to B (the balancer takes A out, or A is
/// SIGKILLed): viewers that went through A are closed 4503, reattach and
/// stream from B; the terminal never exits. The heartbeat is set far beyond
/// the test's waits: the viewer on C learns of the move from B's takeover
/// announcement, not from its next heartbeat.
async fn failover(standalone: bool, kill_owner: bool) {
    let env =
        [("TETHER_BUS__HEARTBEAT_MS", "600000"), ("TETHER_LEASE__RENEW_MS", "1000"), ("TETHER_LEASE__TTL_MS", "3000")];
    let mut cl = cluster(standalone, &env).await;
    let (id, mut on_c) = shell_viewed_on_c(&cl).await;
    let mut on_a = Viewer::attach_to(&cl.a, &cl.api.token, &id, "").await;

    if kill_owner {
        cl.a.kill();
    }
    cl.balancer.switch(cl.servers[0].listen_addr());
    assert_eq!(on_c.sock.expect_close().await, Some(4503), "the viewer through A is told to reattach");
    if !kill_owner {
        assert_eq!(on_a.sock.expect_close().await, Some(4503), "the viewer on A is told to reattach");
    }
    // The daemon redialed through the balancer and landed on B.
    cl.c.wait_for(&format!("/api/v1/hosts/{}", cl.host), "host online", |b| b["host"]["state"] == "online").await;
    let mut again = reattach(&cl.servers[1], &cl.api.token, &id, "").await;
    again.type_line("echo after-$((3+4))").await;
    again.until("after-7").await;
    if !kill_owner {
        let mut on_a = reattach(&cl.a, &cl.api.token, &id, "").await;
        on_a.type_line("echo on-a-again").await;
        on_a.until("on-a-again\r\n").await;
    }
    let (_, body) = cl.b.get(&format!("/api/v1/terminals/{id}")).await;
    assert_eq!(body["terminal"]["state"], "running", "the terminal never exited: {body}");
    drop(cl.daemon);
}

/// A viewer on C types after the host's owner A died, long before A's
/// lease lapses: its input reaches no instance, and it is closed 4503 at
/// once (it used to be told nothing until the lease lapsed, and everything
/// typed meanwhile was lost). Its reattach says the host is offline and
/// refuses input with that error.
async fn input_after_the_owner_died_is_refused_not_lost(standalone: bool) {
    let env = [
        ("TETHER_BUS__HEARTBEAT_MS", "600000"),
        ("TETHER_LEASE__TTL_MS", "120000"),
        ("TETHER_SWEEP__STALE_HOST_MS", "120000"),
    ];
    let mut cl = cluster(standalone, &env).await;
    let (id, mut on_c) = shell_viewed_on_c(&cl).await;

    cl.a.kill();
    on_c.type_line("echo into-nothing").await;
    assert_eq!(on_c.sock.expect_close().await, Some(4503), "the viewer is told to reattach");
    let url = viewer_url(&cl.servers[1], &id);
    let mut again = Socket::connect(&url, Some(&cl.api.token), &["tether.v1"]).await;
    assert_eq!(again.until_message("error").await["message"], "host offline");
    again.send_json(json!({"type": "input", "data": "echo refused\n"})).await;
    assert_eq!(again.until_message("error").await["message"], "host offline", "input is refused, not dropped");
    drop(cl.daemon);
}

/// A viewer on B of a terminal whose host is offline waits on B. When the
/// daemon comes back on A, B's heartbeat reads the host's lease, finds it
/// on A and closes the waiting viewer 4503; its reattach streams through
/// A. (It used to wait on B for good: only a daemon returning to B woke it.)
#[actix_rt::test]
async fn a_viewer_waiting_for_its_host_follows_it_to_another_instance() {
    waiting_viewer_follows_its_host("300").await;
}

/// The same without the heartbeat (600 s): B watches the channel of the
/// terminal its viewer waits for, so A's takeover announcement sends the
/// viewer there at once. (Without the watch it waited for the heartbeat,
/// and a client reattaching during a failover stalled that long.)
#[actix_rt::test]
async fn a_waiting_viewer_hears_the_takeover_without_a_heartbeat() {
    waiting_viewer_follows_its_host("600000").await;
}

async fn waiting_viewer_follows_its_host(heartbeat_ms: &str) {
    let cl = cluster(true, &[("TETHER_BUS__HEARTBEAT_MS", heartbeat_ms)]).await;
    let (status, body) = cl.api.post("/api/v1/terminals", json!({"hostId": cl.host, "argv": ["cat"]})).await;
    assert_eq!(status, 201, "{body}");
    let id = body["terminal"]["id"].as_str().expect("id").to_string();
    wait_state(&cl.b, &id, "running").await;
    let host = format!("/api/v1/hosts/{}", cl.host);
    let b = &cl.servers[0];
    let waiting = async {
        cl.b.wait_for(&host, "host offline", |b| b["host"]["state"] == "offline").await;
        let url = support::client::viewer_url(b, &id);
        let mut sock = support::client::Socket::connect(&url, Some(&cl.api.token), &["tether.v1"]).await;
        loop {
            match sock.next().await {
                support::client::Event::Text(t) if t.contains("host offline") => return sock,
                support::client::Event::Close(code) => panic!("closed {code:?} before it waited"),
                _ => {}
            }
        }
    };
    // The daemon's connection is cut and it cannot redial for 3 s; then it
    // comes back through the balancer, to A.
    let outage = cl.balancer.outage(std::time::Duration::from_secs(3));
    let (_, mut waiting) = futures_util::future::join(outage, waiting).await;
    assert_eq!(waiting.expect_close().await, Some(4503), "the waiting viewer is sent to the host's new owner");
    cl.b.wait_for(&host, "host online", |b| b["host"]["state"] == "online").await;
    let mut again = reattach(b, &cl.api.token, &id, "").await;
    again.type_line("followed-the-host").await;
    again.until("followed-the-host\r\nfollowed-the-host").await;
}

/// B drains (SIGTERM) while its viewer streams a terminal whose daemon is
/// on A: the viewer is closed 4503 like B's own, and reattaches through C
/// with `?from=`, missing nothing.
#[actix_rt::test]
async fn a_draining_instance_sends_its_viewers_of_other_owners_away() {
    let mut cl = cluster(true, &[("TETHER_SHUTDOWN__GRACE_MS", "3000")]).await;
    let (status, body) = cl.api.post("/api/v1/terminals", json!({"hostId": cl.host, "argv": ["cat"]})).await;
    assert_eq!(status, 201, "{body}");
    let id = body["terminal"]["id"].as_str().expect("id").to_string();
    wait_state(&cl.b, &id, "running").await;
    let mut on_b = Viewer::attach_to(&cl.servers[0], &cl.api.token, &id, "").await;
    on_b.type_line("before-drain").await;
    on_b.until("before-drain\r\nbefore-drain").await;
    let status = cl.servers[0].terminate(std::time::Duration::from_secs(10));
    assert!(status.is_some_and(|s| s.success()), "B exits cleanly within its grace: {status:?}");
    assert_eq!(on_b.sock.expect_close().await, Some(4503), "B's viewer is told to reattach");
    let from = on_b.start + on_b.live.len() as u64;
    let mut on_c = reattach(&cl.servers[1], &cl.api.token, &id, &format!("?from={from}")).await;
    on_c.type_line("after-drain").await;
    on_c.until("after-drain\r\nafter-drain").await;
}

/// B loses its Redis connections for a second while its viewer streams:
/// what the owner published meanwhile never reaches B. The loss is detected
/// (the sequence jumps once B is subscribed again), the viewer is closed
/// 4503 (never shown a stream with a hole), and a reattach with `?from=`
/// gets every line exactly once. (The lost-frames path of a full inbox is
/// shown in tests/bus.rs.)
#[actix_rt::test]
async fn lost_frames_are_repaired() {
    let redis = Balancer::start(redis_url().trim_start_matches("redis://")).await;
    let b_redis = format!("redis://{}", redis.addr);
    let cl = cluster_on(("TETHER_REDIS__URL", redis_url()), &[], &[("TETHER_REDIS__URL", &b_redis)]).await;
    let id = ticking_terminal(&cl, "0.02").await;
    let mut ticks = Ticks::follow(&cl.servers[0], &cl.api.token, &id).await;
    redis.outage(std::time::Duration::from_secs(1)).await;
    ticks.read_past(150).await;
    assert!(ticks.reattached > 0, "the viewer was told about the loss");
    let gaps = support::e2e::metric(&cl.b, "tether_bus_gaps_total").await.unwrap_or(0.0);
    assert!(gaps > 0.0, "B counted the loss");
}

/// A running terminal on A that prints `tick-N` every `period` seconds.
async fn ticking_terminal(cl: &Cluster, period: &str) -> String {
    let ticks = support::e2e::ticks_script(period);
    let (status, body) =
        cl.api.post("/api/v1/terminals", json!({"hostId": cl.host, "argv": ["sh", "-c", ticks]})).await;
    assert_eq!(status, 201, "{body}");
    let id = body["terminal"]["id"].as_str().expect("id").to_string();
    wait_state(&cl.api, &id, "running").await;
    id
}

/// The shell's pid in a terminal running `sh`, asked through `viewer`
/// (`tag` tells this answer from earlier ones): the same pid before and
/// after a move shows the process never restarted.
async fn shell_pid(viewer: &mut Viewer, tag: &str) -> u32 {
    viewer.type_line(&format!("echo {tag}-$$-pid")).await;
    let prefix = format!("{tag}-");
    viewer
        .until_match(&format!("{tag}'s pid"), |text| {
            text.match_indices(&prefix).find_map(|(at, _)| {
                let rest = &text[at + prefix.len()..];
                let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
                rest[digits..].starts_with("-pid").then(|| rest[..digits].parse().ok()).flatten()
            })
        })
        .await
}

/// What one instance said about the host and the terminal at one moment.
#[derive(Debug)]
struct Seen {
    base: String,
    host: Value,
    terminal: Value,
}

/// Polls the host and the terminal on each of `apis` until `stop` is set;
/// returns everything seen.
async fn watch_states(apis: &[&Api], host: &str, terminal: &str, stop: &std::cell::Cell<bool>) -> Vec<Seen> {
    let mut seen = Vec::new();
    while !stop.get() {
        for api in apis {
            let (_, h) = api.get(&format!("/api/v1/hosts/{host}")).await;
            let (_, t) = api.get(&format!("/api/v1/terminals/{terminal}")).await;
            seen.push(Seen {
                base: api.base.clone(),
                host: h["host"]["state"].clone(),
                terminal: t["terminal"]["state"].clone(),
            });
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    seen
}

/// A sh terminal on A's daemon, created through C and running.
async fn shell(cl: &Cluster) -> String {
    let (status, body) =
        cl.c.post("/api/v1/terminals", json!({"hostId": cl.host, "argv": ["sh"], "dir": "/tmp"})).await;
    assert_eq!(status, 201, "{body}");
    let id = body["terminal"]["id"].as_str().expect("id").to_string();
    wait_state(&cl.b, &id, "running").await;
    id
}

/// The daemon (a real one, with its PTYs) loses its connection to A on its
/// side only, as in a network split: A still has the socket open when the
/// daemon redials and lands on B. B's hello seizes the lease; A closes its
/// stale socket 4000 (read off the wire the balancer kept open to A); A's
/// viewer is closed 4503, reattaches and streams from B; the host is online
/// on every instance at every moment and the shell keeps its pid.
async fn daemon_redials_while_its_old_socket_is_open(standalone: bool) {
    let cl = cluster(standalone, &[]).await;
    let id = shell(&cl).await;
    let b = &cl.servers[0];
    let mut on_a = Viewer::attach_to(&cl.a, &cl.api.token, &id, "").await;
    let mut on_c = Viewer::attach_to(&cl.servers[1], &cl.api.token, &id, "").await;
    let pid = shell_pid(&mut on_a, "before").await;
    on_c.until(&format!("before-{pid}-pid")).await;

    let stop = std::cell::Cell::new(false);
    let everywhere = [&cl.api, &cl.b, &cl.c];
    let watch = watch_states(&everywhere, &cl.host, &id, &stop);
    let moved = async {
        let orphans = cl.balancer.switch_keeping_backends(b.listen_addr());
        let code = eventually("A's close of its stale socket", || {
            orphans.snapshot().iter().find_map(|o| o.websocket_close_code())
        })
        .await;
        assert_eq!(on_a.sock.expect_close().await, Some(4503), "A's viewer is told to reattach");
        assert_eq!(on_c.sock.expect_close().await, Some(4503), "C's viewer, joined through A, too");
        let mut on_a =
            reattach(&cl.a, &cl.api.token, &id, &format!("?from={}", on_a.start + on_a.live.len() as u64)).await;
        let mut on_c = reattach(&cl.servers[1], &cl.api.token, &id, "").await;
        let after = shell_pid(&mut on_a, "after").await;
        on_c.until(&format!("after-{after}-pid")).await;
        stop.set(true);
        (code, after)
    };
    let (seen, (code, after)) = futures_util::future::join(watch, moved).await;
    assert_eq!(code, 4000, "A closed its stale socket as replaced");
    assert!(cl.a.log().contains("tether_daemon_lease_lost"), "A found its lease taken: {}", cl.a.log());
    assert_eq!(after, pid, "the same shell before and after the move");
    assert!(!seen.is_empty());
    for s in &seen {
        assert_eq!(s.host, "online", "the host was offline on {} during the move: {seen:?}", s.base);
        assert_eq!(s.terminal, "running", "the terminal left running on {} during the move: {seen:?}", s.base);
    }
    let connected = cl.daemon.log().matches("tether_daemon_connected").count();
    assert_eq!(connected, 2, "the daemon connected to A, then to B: {}", cl.daemon.log());
}

/// The owner A drains (SIGTERM) while viewers on B and C stream its host's
/// terminal: the daemon is closed 4503 and redials at once (no backoff),
/// B takes the host over, the viewers are closed 4503, reattach with
/// `?from=` and stream through B; the shell keeps its pid, and no instance
/// ever shows the terminal exited.
async fn owner_drains(standalone: bool) {
    let mut cl = cluster(standalone, &[("TETHER_SHUTDOWN__GRACE_MS", "3000")]).await;
    let id = shell(&cl).await;
    let (b, c) = (&cl.servers[0], &cl.servers[1]);
    let mut on_b = Viewer::attach_to(b, &cl.api.token, &id, "").await;
    let mut on_c = Viewer::attach_to(c, &cl.api.token, &id, "").await;
    let pid = shell_pid(&mut on_b, "before").await;
    on_c.until(&format!("before-{pid}-pid")).await;
    // The balancer sends new connections to B; A's are left to A.
    cl.balancer.route(b.listen_addr());

    let stop = std::cell::Cell::new(false);
    let survivors = [&cl.b, &cl.c];
    let watch = watch_states(&survivors, &cl.host, &id, &stop);
    let (a, c_api, host, token) = (&mut cl.a, &cl.c, &cl.host, &cl.api.token);
    let drained = async {
        let status = a.terminate_async(std::time::Duration::from_secs(30)).await;
        assert!(status.is_some_and(|s| s.success()), "A exits cleanly within its grace: {status:?}");
        for v in [&mut on_b, &mut on_c] {
            assert_eq!(v.sock.expect_close().await, Some(4503), "viewers of A's host are told to reattach");
        }
        c_api.wait_for(&format!("/api/v1/hosts/{host}"), "host online", |b| b["host"]["state"] == "online").await;
        let from = |v: &Viewer| format!("?from={}", v.start + v.live.len() as u64);
        let mut again_b = reattach(b, token, &id, &from(&on_b)).await;
        let mut again_c = reattach(c, token, &id, &from(&on_c)).await;
        let after = shell_pid(&mut again_c, "after").await;
        again_b.until(&format!("after-{after}-pid")).await;
        stop.set(true);
        after
    };
    let (seen, after) = futures_util::future::join(watch, drained).await;
    assert_eq!(after, pid, "the same shell before and after the drain");
    for s in &seen {
        assert_eq!(s.terminal, "running", "the terminal left running on {} during the drain: {seen:?}", s.base);
    }
    // Between A's release and B's hello the host may be offline, once: it
    // comes back for good with the redial.
    for api in survivors {
        let states: Vec<&Value> = seen.iter().filter(|s| s.base == api.base).map(|s| &s.host).collect();
        let spells = states.windows(2).filter(|w| w[0] == "online" && w[1] != "online").count()
            + usize::from(states.first().is_some_and(|s| *s != "online"));
        assert!(spells <= 1 && states.last().is_some_and(|s| *s == "online"), "{}: {states:?}", api.base);
    }
    let log = cl.daemon.log();
    assert!(log.contains("tether_daemon_instance_draining"), "the daemon got 4503: {log}");
    assert!(
        !log.contains("tether_daemon_reconnect_scheduled") && !log.contains("tether_daemon_dial_failed"),
        "the daemon redialed at once and reached B on its first try: {log}"
    );
    assert_eq!(log.matches("tether_daemon_connected").count(), 2, "A, then B: {log}");
}

/// Runs created through B and C for the host on A's daemon: each is
/// dispatched exactly once, by the instance the daemon is connected to (A
/// for the first batch; B after the daemon moved there), and finishes with
/// its exit code, its log and its usage, whichever instance is asked.
async fn runs_from_any_instance(standalone: bool) {
    let cl = cluster(standalone, &[]).await;
    let b = &cl.servers[0];
    let first = create_runs(&cl, &[(&cl.b, 0), (&cl.c, 0), (&cl.b, 0)], 1).await;
    for run in &first {
        run_finished(&cl, run).await;
    }
    // The daemon moves to B; wait for its hello there.
    cl.balancer.switch(b.listen_addr());
    eventually("the daemon's hello on B", || {
        (cl.daemon.log().matches("tether_daemon_connected").count() == 2).then_some(())
    })
    .await;
    cl.c.wait_for(&format!("/api/v1/hosts/{}", cl.host), "host online", |b| b["host"]["state"] == "online").await;
    let second = create_runs(&cl, &[(&cl.c, 0), (&cl.b, 0), (&cl.c, 3)], 4).await;
    for run in &second {
        run_finished(&cl, run).await;
    }
    let instances = [("A", &cl.a), ("B", &cl.servers[0]), ("C", &cl.servers[1])];
    let dispatchers = |run: &TestRun| -> Vec<&str> {
        instances
            .iter()
            .flat_map(|(name, server)| {
                let log = server.log();
                let lines = log
                    .lines()
                    .filter(|l| l.contains("tether_run_dispatched") && l.contains(&format!("run_id={}", run.id)))
                    .count();
                std::iter::repeat_n(*name, lines)
            })
            .collect()
    };
    for run in &first {
        assert_eq!(dispatchers(run), ["A"], "run {} was dispatched once, by A", run.id);
    }
    for run in &second {
        assert_eq!(dispatchers(run), ["B"], "run {} was dispatched once, by B", run.id);
    }
}

/// A run as the test created it.
struct TestRun {
    id: String,
    marker: String,
    exit: i64,
}

/// Creates one run per `(api, exit code)`, numbered from `first`: each
/// prints `ran-N` and exits with its code.
async fn create_runs(cl: &Cluster, through: &[(&Api, i64)], first: usize) -> Vec<TestRun> {
    let mut runs = Vec::new();
    for (n, (api, exit)) in through.iter().enumerate() {
        let marker = format!("ran-{}", first + n);
        let script = format!("echo {marker}; exit {exit}");
        let (status, body) = api.post("/api/v1/runs", json!({"hostId": cl.host, "argv": ["sh", "-c", script]})).await;
        assert_eq!(status, 201, "{body}");
        runs.push(TestRun { id: body["run"]["id"].as_str().expect("run id").to_string(), marker, exit: *exit });
    }
    runs
}

/// Waits until `run` is final on every instance, then checks its state,
/// exit code, usage and log.
async fn run_finished(cl: &Cluster, run: &TestRun) {
    let state = if run.exit == 0 { "succeeded" } else { "failed" };
    for api in [&cl.api, &cl.b, &cl.c] {
        let body = api
            .wait_for(&format!("/api/v1/runs/{}", run.id), "the run final with its usage", |b| {
                b["run"]["state"] != "queued"
                    && b["run"]["state"] != "dispatched"
                    && b["run"]["state"] != "running"
                    && b["run"]["usage"].is_object()
            })
            .await;
        let r = &body["run"];
        assert_eq!((r["state"].as_str(), r["exitCode"].as_i64()), (Some(state), Some(run.exit)), "{body}");
        let usage = &r["usage"];
        assert!(usage["outputBytes"].as_u64().is_some_and(|n| n >= run.marker.len() as u64), "{body}");
        assert!(usage["wallMs"].is_u64() && usage["cpuMs"].is_u64() && usage["maxRssKb"].is_u64(), "{body}");
        let (status, log) = api.get_bytes(&format!("/api/v1/runs/{}/log", run.id)).await;
        assert_eq!(status, 200);
        assert!(String::from_utf8_lossy(&log).contains(&run.marker), "{:?}", String::from_utf8_lossy(&log));
    }
}

/// The heartbeat (docs/CLUSTER.md, "Viewers across instances"), both ways,
/// with B frozen (SIGSTOP) while its viewer of a terminal on A stays open:
/// - A drops the remote viewer whose home stopped reporting it;
/// - once B runs again it still reports that viewer, which A no longer
///   knows, so A tells B to close it ("... does not know this viewer; reattach", 4503, the one path that
///   closes with that reason: the lease never moved) and the client
///   reattaches and streams.
async fn heartbeat_recovers_a_frozen_home(standalone: bool) {
    let cl = cluster(standalone, &[("TETHER_BUS__HEARTBEAT_MS", "300")]).await;
    let (status, body) = cl.api.post("/api/v1/terminals", json!({"hostId": cl.host, "argv": ["cat"]})).await;
    assert_eq!(status, 201, "{body}");
    let id = body["terminal"]["id"].as_str().expect("id").to_string();
    wait_state(&cl.b, &id, "running").await;
    let b = &cl.servers[0];
    let mut on_b = Viewer::attach_to(b, &cl.api.token, &id, "").await;
    on_b.type_line("before-freeze").await;
    on_b.until("before-freeze\r\nbefore-freeze").await;
    wait_metric(&cl.api, "tether_remote_viewers", 1.0).await;

    b.pause();
    wait_metric(&cl.api, "tether_remote_viewers", 0.0).await;
    assert!(cl.a.log().contains("its home stopped reporting"), "{}", cl.a.log());
    b.resume();

    assert_eq!(on_b.sock.expect_close().await, Some(4503), "A asks B to reconnect the viewer it forgot");
    assert_eq!(
        on_b.sock.close_reason(),
        Some("the host's instance does not know this viewer; reattach"),
        "closed because A did not know it"
    );
    let from = on_b.start + on_b.live.len() as u64;
    let mut again = reattach(b, &cl.api.token, &id, &format!("?from={from}")).await;
    again.type_line("after-thaw").await;
    again.until("after-thaw\r\nafter-thaw").await;
    wait_metric(&cl.api, "tether_remote_viewers", 1.0).await;
}

/// Checks `found` every 50 ms until it finds something; returns it.
async fn eventually<T>(what: &str, found: impl Fn() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + support::client::WAIT;
    loop {
        if let Some(found) = found() {
            return found;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Polls `/metrics` until the unlabelled metric `name` is `value`.
async fn wait_metric(api: &Api, name: &str, value: f64) {
    let deadline = tokio::time::Instant::now() + support::client::WAIT;
    loop {
        let now = metric(api, name).await;
        if now == Some(value) {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{name} on {} stayed {now:?}, not {value}", api.base);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

mod standalone {
    #[actix_rt::test]
    async fn daemon_redials_while_its_old_socket_is_open() {
        super::daemon_redials_while_its_old_socket_is_open(true).await;
    }

    #[actix_rt::test]
    async fn owner_drains() {
        super::owner_drains(true).await;
    }

    #[actix_rt::test]
    async fn runs_from_any_instance() {
        super::runs_from_any_instance(true).await;
    }

    #[actix_rt::test]
    async fn heartbeat_recovers_a_frozen_home() {
        super::heartbeat_recovers_a_frozen_home(true).await;
    }

    #[actix_rt::test]
    async fn daemon_moves_to_another_instance() {
        super::failover(true, false).await;
    }

    #[actix_rt::test]
    async fn owner_killed() {
        super::failover(true, true).await;
    }

    #[actix_rt::test]
    async fn input_after_the_owner_died_is_refused_not_lost() {
        super::input_after_the_owner_died_is_refused_not_lost(true).await;
    }

    #[actix_rt::test]
    async fn viewer_on_another_instance() {
        super::viewer_on_another_instance(true).await;
    }

    #[actix_rt::test]
    async fn requests_from_any_instance() {
        super::requests_from_any_instance(true).await;
    }

    #[actix_rt::test]
    async fn offline_is_answered_at_once() {
        super::offline_is_answered_at_once(true).await;
    }
}

mod redis_cluster {
    #[actix_rt::test]
    async fn daemon_redials_while_its_old_socket_is_open() {
        super::daemon_redials_while_its_old_socket_is_open(false).await;
    }

    #[actix_rt::test]
    async fn owner_drains() {
        super::owner_drains(false).await;
    }

    #[actix_rt::test]
    async fn runs_from_any_instance() {
        super::runs_from_any_instance(false).await;
    }

    #[actix_rt::test]
    async fn heartbeat_recovers_a_frozen_home() {
        super::heartbeat_recovers_a_frozen_home(false).await;
    }

    #[actix_rt::test]
    async fn daemon_moves_to_another_instance() {
        super::failover(false, false).await;
    }

    #[actix_rt::test]
    async fn owner_killed() {
        super::failover(false, true).await;
    }

    #[actix_rt::test]
    async fn input_after_the_owner_died_is_refused_not_lost() {
        super::input_after_the_owner_died_is_refused_not_lost(false).await;
    }

    #[actix_rt::test]
    async fn viewer_on_another_instance() {
        super::viewer_on_another_instance(false).await;
    }

    #[actix_rt::test]
    async fn requests_from_any_instance() {
        super::requests_from_any_instance(false).await;
    }

    #[actix_rt::test]
    async fn offline_is_answered_at_once() {
        super::offline_is_answered_at_once(false).await;
    }
}
