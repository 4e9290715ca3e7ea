//! Three real `tether serve` instances sharing one PostgreSQL and one Redis
//! (standalone, and the three-master Redis Cluster), a real `tether daemon`
//! with real PTYs on instance A, and REST calls through B and C
//! (docs/CLUSTER.md, "Requests").

mod support;

use serde_json::{json, Value};
use support::balancer::Balancer;
use support::client::{create_token, Api};
use support::daemon::DaemonProcess;
use support::e2e::{metric, Viewer};
use support::{pg_database, redis_cluster_nodes, redis_url, unique_prefix, OwnRedis, TetherServer};

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
/// input and resize through B, `size` with `yours`, a resume through B, and
/// a kill through C whose exit reaches B's viewer.
async fn viewer_on_another_instance(standalone: bool) {
    let cl = cluster(standalone, &[]).await;
    let (status, body) =
        cl.c.post("/api/v1/terminals", json!({"hostId": cl.host, "argv": ["sh"], "dir": "/tmp"})).await;
    assert_eq!(status, 201, "{body}");
    let id = body["terminal"]["id"].as_str().expect("id").to_string();
    wait_state(&cl.b, &id, "running").await;
    let mut on_b = Viewer::attach_to(&cl.servers[0], &cl.api.token, &id, "").await;
    on_b.sock.send_json(json!({"type": "resize", "cols": 97, "rows": 31})).await;
    on_b.type_line("stty size; echo via-$((6*7))").await;
    on_b.until("31 97").await;
    on_b.until("via-42").await;
    // The same stream through A, from where B's viewer went live.
    let mut on_a = Viewer::attach_to(&cl.a, &cl.api.token, &id, &format!("?from={}", on_b.start)).await;
    on_a.until("via-42").await;
    // A resume through C from the same offset: the same bytes, no gap, no repeat.
    let mut on_c = Viewer::attach_to(&cl.servers[1], &cl.api.token, &id, &format!("?from={}", on_b.start)).await;
    on_c.until("via-42").await;
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
    let flood = "read go; while :; do head -c 300000 /dev/urandom | base64; done";
    let (status, body) = cl.c.post("/api/v1/terminals", json!({"hostId": cl.host, "argv": ["sh", "-c", flood]})).await;
    assert_eq!(status, 201, "{body}");
    let x = body["terminal"]["id"].as_str().expect("id").to_string();
    wait_state(&cl.b, &x, "running").await;
    let mut stalled = Viewer::attach_to(b, &cl.api.token, &x, "").await;
    stalled.type_line("go").await;
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

/// The daemon moves from A to B (the balancer takes A out, or A is
/// SIGKILLed): viewers that went through A are closed 4503, reattach and
/// stream from B; the terminal never exits. The heartbeat is set far beyond
/// the test's waits: the viewer on C learns of the move from B's takeover
/// announcement, not from its next heartbeat.
async fn failover(standalone: bool, kill_owner: bool) {
    let env =
        [("TETHER_BUS__HEARTBEAT_MS", "600000"), ("TETHER_LEASE__RENEW_MS", "1000"), ("TETHER_LEASE__TTL_MS", "3000")];
    let mut cl = cluster(standalone, &env).await;
    let (status, body) =
        cl.c.post("/api/v1/terminals", json!({"hostId": cl.host, "argv": ["sh"], "dir": "/tmp"})).await;
    assert_eq!(status, 201, "{body}");
    let id = body["terminal"]["id"].as_str().expect("id").to_string();
    wait_state(&cl.b, &id, "running").await;
    let mut on_c = Viewer::attach_to(&cl.servers[1], &cl.api.token, &id, "").await;
    on_c.type_line("echo before-$((2+3))").await;
    on_c.until("before-5").await;
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

/// Redis is SIGKILLed and started again while a viewer on B streams a
/// terminal whose daemon is on A: no instance crashes, the bus comes back,
/// and the viewer either keeps streaming or is closed 4503 and resumes with
/// `?from=`, so that every line arrives exactly once.
#[actix_rt::test]
async fn redis_restarted() {
    let mut redis = OwnRedis::start();
    let mut cl = cluster_on(("TETHER_REDIS__URL", redis.url()), &[], &[]).await;
    let id = ticking_terminal(&cl, "0.05").await;
    let mut ticks = Ticks::follow(&cl.servers[0], &cl.api.token, &id).await;
    redis.kill();
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    redis.start_again();
    ticks.read_past(80).await;
    for server in std::iter::once(&mut cl.a).chain(cl.servers.iter_mut()) {
        assert!(server.try_exit_status().is_none(), "no instance crashed: {}", server.log());
    }
    for api in [&cl.api, &cl.b, &cl.c] {
        api.wait_for("/readyz", "ready again", |b| b["ready"] == true).await;
    }
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
    let ticks = format!("i=0; while :; do i=$((i+1)); echo tick-$i; sleep {period}; done");
    let (status, body) =
        cl.api.post("/api/v1/terminals", json!({"hostId": cl.host, "argv": ["sh", "-c", ticks]})).await;
    assert_eq!(status, 201, "{body}");
    let id = body["terminal"]["id"].as_str().expect("id").to_string();
    wait_state(&cl.api, &id, "running").await;
    id
}

/// A viewer of a terminal printing `tick-N` lines, which reattaches from
/// its last byte whenever it is closed 4503.
struct Ticks<'a> {
    server: &'a TetherServer,
    token: String,
    id: String,
    viewer: Viewer,
    /// Offset of the first byte of `stream`.
    start: u64,
    stream: Vec<u8>,
    reattached: usize,
}

impl<'a> Ticks<'a> {
    async fn follow(server: &'a TetherServer, token: &str, id: &str) -> Ticks<'a> {
        let mut viewer = Viewer::attach_to(server, token, id, "").await;
        viewer.until("tick-").await;
        let (start, stream) = (viewer.start, std::mem::take(&mut viewer.live));
        Ticks { server, token: token.to_string(), id: id.to_string(), viewer, start, stream, reattached: 0 }
    }

    /// Reads until `more` lines after the last one seen now have arrived,
    /// then checks every line came exactly once.
    async fn read_past(&mut self, more: u64) {
        let last = tick_numbers(&String::from_utf8_lossy(&self.stream)).last().copied().expect("a tick");
        while tick_numbers(&String::from_utf8_lossy(&self.stream)).last().is_none_or(|n| *n < last + more) {
            match self.viewer.sock.next_within(support::client::WAIT).await {
                Some(support::client::Event::Binary(b)) => self.stream.extend_from_slice(&b),
                Some(support::client::Event::Close(Some(4503))) => {
                    let from = self.start + self.stream.len() as u64;
                    self.viewer = reattach(self.server, &self.token, &self.id, &format!("?from={from}")).await;
                    assert_eq!(self.viewer.start, from, "resumed from the last byte, not repainted");
                    self.reattached += 1;
                }
                Some(support::client::Event::Close(code)) => panic!("closed {code:?}"),
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
fn tick_numbers(text: &str) -> Vec<u64> {
    text.split("tick-").skip(1).filter_map(|rest| rest.split_once("\r\n").and_then(|(n, _)| n.parse().ok())).collect()
}

/// Attaches with `query` (e.g. `?from=N`), retrying after a 4503 as a
/// client does, while the host is between owners.
async fn reattach(server: &TetherServer, token: &str, id: &str, query: &str) -> Viewer {
    for _ in 0..40 {
        match Viewer::try_attach_to(server, token, id, query).await {
            Ok(viewer) => return viewer,
            Err(Some(4503)) => tokio::time::sleep(std::time::Duration::from_millis(250)).await,
            Err(code) => panic!("closed {code:?} before live"),
        }
    }
    panic!("still 4503 after 10 s");
}

mod standalone {
    #[actix_rt::test]
    async fn daemon_moves_to_another_instance() {
        super::failover(true, false).await;
    }

    #[actix_rt::test]
    async fn owner_killed() {
        super::failover(true, true).await;
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
    async fn daemon_moves_to_another_instance() {
        super::failover(false, false).await;
    }

    #[actix_rt::test]
    async fn owner_killed() {
        super::failover(false, true).await;
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
