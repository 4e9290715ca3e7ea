//! Races of ownership across three real `tether serve` instances sharing
//! one PostgreSQL and one Redis, with scripted daemons so each test decides
//! exactly when a hello, a close or an answer happens (docs/CLUSTER.md,
//! "Ownership", "Requests", "The sweep"):
//!
//! - the host's live state agrees on every instance before the hello,
//!   after it and after the close;
//! - two hellos for one host at once on two instances leave one owner;
//! - a socket closed while its claim is in flight leaves no lease;
//! - a spawn whose acknowledgement came too late is never sent twice;
//! - credentials refreshed through another instance never cross Redis, and
//!   forged ones (from the bus or unasked from the daemon) are refused;
//! - the sweeper spawns parked terminals of hosts owned elsewhere;
//! - input through another instance is refused, never lost, while the
//!   daemon does not read.

mod support;

use std::time::Duration;

use futures_util::future::join;
use serde_json::{json, Value};
use support::client::{
    create_token, daemon_url, hello, input_until_refused, inputs_arrive_in_order, Api, Event, Socket,
};
use support::{pg_connect, pg_database, redis_url, unique_prefix, TetherServer};
use tether::proto::v1::{daemon_frame, server_frame, CredentialsResult, Started};

const PROTOCOL: &[&str] = &["tether.daemon.v1"];

/// Three instances, a user's token and a registered host.
struct Trio {
    servers: Vec<TetherServer>,
    apis: Vec<Api>,
    host: String,
    database: String,
    prefix: String,
}

/// Starts A, B and C with `common` settings plus each one's own.
async fn trio(common: &[(&str, &str)], own: [&[(&str, &str)]; 3]) -> Trio {
    let database = pg_database().await;
    let redis = redis_url();
    let prefix = unique_prefix();
    let mut env = vec![
        ("TETHER_DATABASE__URL", database.as_str()),
        ("TETHER_REDIS__URL", redis.as_str()),
        ("TETHER_BUS__PREFIX", prefix.as_str()),
    ];
    env.extend_from_slice(common);
    let mut servers = Vec::new();
    for settings in own {
        servers.push(TetherServer::start(&[env.as_slice(), settings].concat(), &[]).await);
    }
    let token = create_token(&servers[0], "ann");
    let apis: Vec<Api> = servers.iter().map(|s| Api::new(s.url(), token.clone())).collect();
    let (status, body) = apis[0].post("/api/v1/hosts", json!({"hostname": "ann-box"})).await;
    assert_eq!(status, 201, "{body}");
    let host = body["host"]["id"].as_str().expect("host id").to_string();
    Trio { servers, apis, host, database, prefix }
}

impl Trio {
    /// A scripted daemon socket on instance `i`, hello not yet sent.
    async fn socket(&self, i: usize) -> Socket {
        Socket::connect(&daemon_url(&self.servers[i]), Some(&self.apis[0].token), PROTOCOL).await
    }

    /// A scripted daemon on instance `i` whose hello was acknowledged.
    async fn daemon(&self, i: usize) -> Socket {
        let mut sock = self.socket(i).await;
        sock.send_frame(hello(&self.host)).await;
        assert!(matches!(sock.next_server_frame().await, server_frame::Frame::HelloAck(_)));
        sock
    }

    /// A terminal created through A and started by `daemon` (on A), once
    /// B shows it running; its id.
    async fn running_terminal(&self, daemon: &mut Socket) -> String {
        let (status, body) = self.apis[0].post("/api/v1/terminals", json!({"hostId": self.host, "argv": ["sh"]})).await;
        assert_eq!(status, 201, "{body}");
        let id = body["terminal"]["id"].as_str().expect("id").to_string();
        match daemon.next_server_frame().await {
            server_frame::Frame::Spawn(s) => assert_eq!(s.terminal_id, id),
            other => panic!("expected Spawn, got {other:?}"),
        }
        daemon.send_frame(daemon_frame::Frame::Started(Started { terminal_id: id.clone(), pid: 7 })).await;
        let path = format!("/api/v1/terminals/{id}");
        self.apis[1].wait_for(&path, "running", |b| b["terminal"]["state"] == "running").await;
        id
    }

    /// The host as each instance shows it, once every one shows `state`.
    async fn host_everywhere(&self, state: &str) -> Vec<Value> {
        let path = format!("/api/v1/hosts/{}", self.host);
        let mut views = Vec::new();
        for api in &self.apis {
            views.push(api.wait_for(&path, state, |b| b["host"]["state"] == state).await["host"].clone());
        }
        views
    }

    /// A terminal of the host parked straight in the database (as if its
    /// host had been offline), for a spawn to claim.
    async fn park_terminal(&self) -> uuid::Uuid {
        let client = pg_connect(&self.database).await;
        let id = uuid::Uuid::new_v4();
        let host = uuid::Uuid::parse_str(&self.host).expect("host uuid");
        client
            .execute(
                "INSERT INTO terminals (id, user_id, host_id, argv, state, pending_reason, cols, rows) \
                 SELECT $1, user_id, id, '[\"sh\"]', 'pending', 'host_offline', 80, 24 FROM hosts WHERE id = $2",
                &[&id, &host],
            )
            .await
            .expect("park a terminal");
        id
    }

    /// Live lease rows on the host.
    async fn live_leases(&self) -> i64 {
        let client = pg_connect(&self.database).await;
        let row = client
            .query_one(
                "SELECT count(*) FROM leases WHERE key = $1 AND expires_at > now()",
                &[&format!("host:{}", self.host)],
            )
            .await
            .expect("count leases");
        row.get(0)
    }
}

/// Every instance answers the same host resource: not connected, connected
/// (with the hello's capabilities and dirs), and closed again.
#[actix_rt::test]
async fn online_state_is_the_same_on_every_instance() {
    let trio = trio(&[], [&[], &[], &[]]).await;
    let before = trio.host_everywhere("offline").await;
    assert!(agree(&before), "before the hello: {before:?}");
    assert_eq!(before[0]["capabilities"]["credentials"], false, "{}", before[0]);

    let mut daemon = trio.daemon(1).await;
    let during = trio.host_everywhere("online").await;
    assert!(agree(&during), "after the hello: {during:?}");
    let caps = &during[0]["capabilities"];
    assert!(caps["manageDirs"] == true && caps["credentials"] == true && caps["usage"] == true, "{caps}");
    assert_eq!(during[0]["dirs"], json!(["/tmp"]));

    daemon.close().await;
    let after = trio.host_everywhere("offline").await;
    assert!(agree(&after), "after the close: {after:?}");
    assert_eq!(trio.live_leases().await, 0);
}

/// Whether every instance shows the same host. `lastSeenAt` is left out:
/// the owner's renew tick and the close write it, so two reads a few
/// milliseconds apart may see two values of it, both right.
fn agree(views: &[Value]) -> bool {
    let without_last_seen = |v: &Value| {
        let mut v = v.clone();
        v.as_object_mut().map(|o| o.remove("lastSeenAt"));
        v
    };
    views.iter().all(|v| without_last_seen(v) == without_last_seen(&views[0]))
}

/// What became of a scripted daemon's socket after its hello.
#[derive(Debug, PartialEq)]
enum Fate {
    /// Acknowledged and still open, answering pings.
    Owner(String),
    /// Closed with this code.
    Closed(Option<u16>),
}

/// Sends a hello and watches the socket until it has been quiet for `quiet`.
async fn hello_and_watch(mut sock: Socket, host: &str, quiet: Duration) -> (Fate, Socket) {
    sock.send_frame(hello(host)).await;
    let mut instance = None;
    loop {
        match sock.next_within(quiet).await {
            None => break,
            Some(Event::Close(code)) => return (Fate::Closed(code), sock),
            Some(Event::Binary(bytes)) => {
                use prost::Message;
                let frame = tether::proto::v1::ServerFrame::decode(bytes.as_ref()).expect("server frame");
                if let Some(server_frame::Frame::HelloAck(ack)) = frame.frame {
                    instance = Some(ack.instance_id);
                }
            }
            Some(_) => continue,
        }
    }
    // Still open: it must be the owner, so it was acknowledged and answers.
    let instance = instance.expect("an open socket that was never acknowledged");
    sock.send_frame(daemon_frame::Frame::Ping(tether::proto::v1::Ping {})).await;
    assert!(matches!(sock.next_server_frame().await, server_frame::Frame::Pong(_)), "the survivor answers");
    (Fate::Owner(instance), sock)
}

/// Two hellos for one host at once, on A and on B, twenty times: each time
/// exactly one socket survives, the other is closed 4000, the lease names
/// the survivor's instance and every instance shows the host online.
#[actix_rt::test]
async fn simultaneous_hellos_leave_one_owner() {
    let fast = [("TETHER_LEASE__TTL_MS", "2000"), ("TETHER_LEASE__RENEW_MS", "200")];
    let trio = trio(&fast, [&[], &[], &[]]).await;
    let client = pg_connect(&trio.database).await;
    for round in 0..20 {
        let (a, b) = join(trio.socket(0), trio.socket(1)).await;
        let quiet = Duration::from_millis(1200);
        let ((fate_a, sock_a), (fate_b, sock_b)) =
            join(hello_and_watch(a, &trio.host, quiet), hello_and_watch(b, &trio.host, quiet)).await;
        let (owner, mut survivor) = match (fate_a, fate_b) {
            (Fate::Owner(owner), Fate::Closed(Some(4000))) => (owner, sock_a),
            (Fate::Closed(Some(4000)), Fate::Owner(owner)) => (owner, sock_b),
            other => panic!("round {round}: expected one owner and one 4000, got {other:?}"),
        };
        let holder: String = client
            .query_one("SELECT holder FROM leases WHERE key = $1", &[&format!("host:{}", trio.host)])
            .await
            .expect("lease row")
            .get(0);
        assert!(holder.starts_with(&owner), "round {round}: lease holder {holder}, owner {owner}");
        let views = trio.host_everywhere("online").await;
        assert!(agree(&views), "round {round}: {views:?}");
        survivor.close().await;
        trio.host_everywhere("offline").await;
    }
}

/// A daemon that closes 0, 1, 3, 8 or 15 ms after its hello, while the
/// claim may still be in flight, leaves no live lease and the host offline
/// everywhere, long before the lease's 30 s lifetime could end it.
#[actix_rt::test]
async fn close_during_claim_leaves_no_lease() {
    let trio = trio(&[], [&[], &[], &[]]).await;
    for delay in [0u64, 1, 3, 8, 15] {
        let mut sock = trio.socket(0).await;
        sock.send_frame(hello(&trio.host)).await;
        tokio::time::sleep(Duration::from_millis(delay)).await;
        drop(sock);
        // Whatever the instance did with the claim, it has settled when a
        // fresh hello and close through another instance have gone by.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let leases = trio.live_leases().await;
            let views = trio.host_everywhere_now().await;
            if leases == 0 && views.iter().all(|h| h["state"] == "offline") {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{delay} ms: {leases} live lease(s), states {:?}",
                views.iter().map(|h| h["state"].clone()).collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Trio {
    /// The host as each instance shows it right now.
    async fn host_everywhere_now(&self) -> Vec<Value> {
        let path = format!("/api/v1/hosts/{}", self.host);
        let mut views = Vec::new();
        for api in &self.apis {
            views.push(api.get(&path).await.1["host"].clone());
        }
        views
    }
}

/// Spawn frames a scripted daemon receives within `window`, answering each
/// with Started.
async fn spawns_within(daemon: &mut Socket, window: Duration) -> Vec<String> {
    let mut spawned = Vec::new();
    let deadline = tokio::time::Instant::now() + window;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match daemon.next_within(left).await {
            None => return spawned,
            Some(Event::Binary(bytes)) => {
                use prost::Message;
                let frame = tether::proto::v1::ServerFrame::decode(bytes.as_ref()).expect("server frame");
                if let Some(server_frame::Frame::Spawn(spawn)) = frame.frame {
                    daemon
                        .send_frame(daemon_frame::Frame::Started(Started {
                            terminal_id: spawn.terminal_id.clone(),
                            pid: 4242,
                        }))
                        .await;
                    spawned.push(spawn.terminal_id);
                }
            }
            Some(Event::Close(code)) => panic!("daemon closed {code:?}"),
            Some(_) => continue,
        }
    }
}

/// B gives up on the owner's acknowledgement after 1 ms, so it answers
/// before A's ack arrives; A still spawns the terminal once, and neither
/// B nor the sweep (every 200 ms) sends it again.
#[actix_rt::test]
async fn an_unacknowledged_spawn_is_sent_once() {
    let sweep = [("TETHER_SWEEP__INTERVAL_MS", "200")];
    let trio = trio(&sweep, [&[], &[("TETHER_BUS__ACK_MS", "1")], &[]]).await;
    let mut daemon = trio.daemon(0).await;
    trio.host_everywhere("online").await;
    let (status, body) = trio.apis[1]
        .post("/api/v1/terminals", json!({"hostId": trio.host, "argv": ["sh"], "cols": 80, "rows": 24}))
        .await;
    assert!(status == 201 || status == 202, "{status} {body}");
    let id = body["terminal"]["id"].as_str().expect("terminal id").to_string();
    let spawned = spawns_within(&mut daemon, Duration::from_secs(3)).await;
    assert_eq!(spawned, vec![id.clone()], "exactly one Spawn");
    trio.apis[2].wait_for(&format!("/api/v1/terminals/{id}"), "running", |b| b["terminal"]["state"] == "running").await;
}

/// The sweeper is B (A and C never sweep during the test); the daemon is
/// on A. A terminal parked while its host is online is spawned by B's
/// sweep through A.
#[actix_rt::test]
async fn the_sweep_spawns_parked_terminals_of_hosts_owned_elsewhere() {
    let never = [("TETHER_SWEEP__INTERVAL_MS", "600000")];
    let trio = trio(&[], [&never, &[("TETHER_SWEEP__INTERVAL_MS", "200")], &never]).await;
    let mut daemon = trio.daemon(0).await;
    trio.host_everywhere("online").await;
    let id = trio.park_terminal().await;
    let spawned = spawns_within(&mut daemon, Duration::from_secs(3)).await;
    assert_eq!(spawned, vec![id.to_string()]);
    trio.apis[2].wait_for(&format!("/api/v1/terminals/{id}"), "running", |b| b["terminal"]["state"] == "running").await;
}

/// Redis may deliver one message twice (a Redis Cluster primary that
/// stalls and fails over: fred sends the command again to the new primary,
/// and the old one delivers its own copy when it resumes). The owner
/// serves a sequence number it has seen once: input published twice with
/// the same sender and number reaches the daemon once.
#[actix_rt::test]
async fn a_message_delivered_twice_is_served_once() {
    use fred::prelude::*;
    use prost::Message as _;
    use tether::proto::bus::{envelope, host_request, Envelope, HostRequest, Input};
    let trio = trio(&[], [&[], &[], &[]]).await;
    let mut daemon = trio.daemon(0).await;
    trio.host_everywhere("online").await;
    let terminal = trio.running_terminal(&mut daemon).await;

    let redis = Builder::from_config(Config::from_url(&redis_url()).expect("redis url")).build().expect("client");
    redis.init().await.expect("connects");
    let typed = |seq: u64, data: &str| {
        let request = HostRequest {
            request_id: String::new(),
            reply_to: "twice#1".into(),
            host_id: trio.host.clone(),
            op: Some(host_request::Op::Input(Input {
                terminal_id: terminal.clone(),
                data: data.as_bytes().to_vec().into(),
            })),
        };
        Envelope { sender: "twice#1".into(), seq, body: Some(envelope::Body::Request(request)) }.encode_to_vec()
    };
    let channel = format!("{}:host:{{{}}}:in", trio.prefix, trio.host);
    for (seq, data) in [(1, "once\n"), (1, "once\n"), (2, "then\n")] {
        let receivers: i64 = redis.publish(channel.as_str(), typed(seq, data)).await.expect("publish");
        assert_eq!(receivers, 1, "the owner heard it");
    }
    let mut inputs = Vec::new();
    while !inputs.iter().any(|d: &String| d.contains("then")) {
        match tokio::time::timeout(Duration::from_secs(10), daemon.next_server_frame()).await {
            Ok(server_frame::Frame::Input(input)) => inputs.push(String::from_utf8_lossy(&input.data).into_owned()),
            Ok(_) => {}
            Err(_) => panic!("the input did not reach the daemon: {inputs:?}"),
        }
    }
    assert_eq!(inputs.concat(), "once\nthen\n", "the repeated message was served again");
    let _ = redis.quit().await;
}

/// A PSUBSCRIBE tap on the bus prefix while credentials are refreshed
/// through B for a daemon on A: the daemon's secret reaches A, is stored,
/// and no byte of it crosses Redis; B answers only `{ok, hostId}`.
#[actix_rt::test]
async fn credentials_never_cross_the_bus() {
    use fred::prelude::*;
    let key = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="; // 32 bytes
    let trio = trio(&[("TETHER_ENCRYPTION__KEY", key)], [&[], &[], &[]]).await;
    let mut daemon = trio.daemon(0).await;
    trio.host_everywhere("online").await;

    let tap = Builder::from_config(Config::from_url(&redis_url()).expect("redis url"))
        .build_subscriber_client()
        .expect("tap");
    tap.init().await.expect("tap connects");
    let mut heard = tap.message_rx();
    tap.psubscribe(format!("{}*", trio.prefix)).await.expect("psubscribe");

    let secret = "tap-must-not-see-this-5f1c2e";
    let path = format!("/api/v1/hosts/{}/credentials/refresh", trio.host);
    let refresh = trio.apis[1].post(&path, json!({}));
    let answer = async {
        loop {
            if let server_frame::Frame::Credentials(ask) = daemon.next_server_frame().await {
                let body = json!({ "token": secret }).to_string();
                daemon
                    .send_frame(daemon_frame::Frame::CredentialsResult(CredentialsResult {
                        request_id: ask.request_id,
                        credentials_json: body.into_bytes().into(),
                        error: None,
                    }))
                    .await;
                return;
            }
        }
    };
    let ((status, body), ()) = join(refresh, answer).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, json!({"ok": true, "hostId": trio.host}));

    let mut messages = 0;
    while let Ok(Ok(message)) = tokio::time::timeout(Duration::from_millis(500), heard.recv()).await {
        messages += 1;
        let bytes = message.value.as_bytes().map(<[u8]>::to_vec).unwrap_or_default();
        assert!(
            !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "the secret crossed Redis on {}",
            message.channel
        );
    }
    assert!(messages >= 2, "the tap heard the request and its reply ({messages} messages)");
    let client = pg_connect(&trio.database).await;
    assert_eq!(stored_credentials(&client).await, 1, "the owner stored the sealed credentials");
    let _ = tap.quit().await;
}

/// Credentials reach the store only as the owner's own task: a bus
/// message on the host's channel that carries credentials (an operation
/// the bus protocol does not have, here field 30 of the request) is
/// refused by the owner with no acknowledgement, and a CredentialsResult
/// the daemon sends unasked is dropped. Nothing is stored; a real refresh
/// afterwards still works.
#[actix_rt::test]
async fn forged_credentials_are_refused() {
    use fred::prelude::*;
    use prost::Message as _;
    use tether::proto::bus::{envelope, Envelope, HostRequest};
    let key = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="; // 32 bytes
    let trio = trio(&[("TETHER_ENCRYPTION__KEY", key)], [&[], &[], &[]]).await;
    let mut daemon = trio.daemon(0).await;
    trio.host_everywhere("online").await;

    let redis = Builder::from_config(Config::from_url(&redis_url()).expect("redis url")).build().expect("client");
    redis.init().await.expect("connects");
    let replies = Builder::from_config(Config::from_url(&redis_url()).expect("redis url"))
        .build_subscriber_client()
        .expect("subscriber");
    replies.init().await.expect("subscriber connects");
    let mut heard = replies.message_rx();
    let reply_channel = format!("{}:reply:{{forger#1}}", trio.prefix);
    replies.subscribe(reply_channel.as_str()).await.expect("subscribe");

    let forged = json!({"token": "forged-secret-9d1"}).to_string();
    let mut request = HostRequest {
        request_id: "forged-1".into(),
        reply_to: "forger#1".into(),
        host_id: trio.host.clone(),
        op: None,
    }
    .encode_to_vec();
    prost::encoding::bytes::encode(30, &forged.into_bytes(), &mut request);
    let mut frame = Envelope { sender: "forger#1".into(), seq: 1, body: None }.encode_to_vec();
    prost::encoding::bytes::encode(10, &request, &mut frame);
    assert!(matches!(
        Envelope::decode(frame.as_slice()).expect("decodes").body,
        Some(envelope::Body::Request(HostRequest { op: None, .. }))
    ));
    let channel = format!("{}:host:{{{}}}:in", trio.prefix, trio.host);
    let receivers: i64 = redis.publish(channel.as_str(), frame).await.expect("publish");
    assert_eq!(receivers, 1, "the owner heard the forged request");

    daemon
        .send_frame(daemon_frame::Frame::CredentialsResult(CredentialsResult {
            request_id: "never-asked".into(),
            credentials_json: json!({"token": "unasked-secret"}).to_string().into_bytes().into(),
            error: None,
        }))
        .await;
    let quiet = tokio::time::timeout(Duration::from_secs(1), heard.recv()).await;
    assert!(quiet.is_err(), "the owner answered a forged request: {quiet:?}");
    let client = pg_connect(&trio.database).await;
    assert_eq!(stored_credentials(&client).await, 0, "forged credentials were stored");

    // The owner still serves a real refresh.
    let path = format!("/api/v1/hosts/{}/credentials/refresh", trio.host);
    let refresh = trio.apis[1].post(&path, json!({}));
    let answer = async {
        loop {
            if let server_frame::Frame::Credentials(ask) = daemon.next_server_frame().await {
                daemon
                    .send_frame(daemon_frame::Frame::CredentialsResult(CredentialsResult {
                        request_id: ask.request_id,
                        credentials_json: json!({"token": "real"}).to_string().into_bytes().into(),
                        error: None,
                    }))
                    .await;
                return;
            }
        }
    };
    let ((status, body), ()) = join(refresh, answer).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(stored_credentials(&client).await, 1);
    let _ = replies.quit().await;
    let _ = redis.quit().await;
}

async fn stored_credentials(client: &tokio_postgres::Client) -> i64 {
    client.query_one("SELECT count(*) FROM host_credentials", &[]).await.expect("count credentials").get(0)
}

/// One host's operations reach its daemon in the order they were published
/// on its channel, whatever their kind: a Spawn, then input for the new
/// terminal. The owner used to read the spawn's row in a task of its own
/// while input went straight through, so the input overtook the Spawn.
#[actix_rt::test]
async fn a_hosts_requests_reach_its_daemon_in_order() {
    use fred::prelude::*;
    use prost::Message as _;
    use tether::proto::bus::{self, envelope, host_request, Envelope, HostRequest};
    let never = [("TETHER_SWEEP__INTERVAL_MS", "600000")];
    let trio = trio(&never, [&[], &[], &[]]).await;
    let mut daemon = trio.daemon(0).await;
    trio.host_everywhere("online").await;
    let id = trio.park_terminal().await;

    let redis = Builder::from_config(Config::from_url(&redis_url()).expect("redis url")).build().expect("client");
    redis.init().await.expect("connects");
    let channel = format!("{}:host:{{{}}}:in", trio.prefix, trio.host);
    let spawn = host_request::Op::Spawn(bus::Spawn { terminal_id: id.to_string() });
    let inputs = (0..5)
        .map(|n| host_request::Op::Input(bus::Input { terminal_id: id.to_string(), data: format!("{n}").into() }));
    for (seq, op) in std::iter::once(spawn).chain(inputs).enumerate() {
        let request = HostRequest {
            request_id: format!("order-{seq}"),
            reply_to: "orderer#1".into(),
            host_id: trio.host.clone(),
            op: Some(op),
        };
        let envelope =
            Envelope { sender: "orderer#1".into(), seq: seq as u64 + 1, body: Some(envelope::Body::Request(request)) };
        let receivers: i64 = redis.publish(channel.as_str(), envelope.encode_to_vec()).await.expect("publish");
        assert_eq!(receivers, 1, "the owner listens");
    }

    let mut seen = Vec::new();
    while seen.len() < 6 {
        match daemon.next_server_frame().await {
            server_frame::Frame::Spawn(spawn) => {
                assert_eq!(spawn.terminal_id, id.to_string());
                seen.push("spawn".to_string());
            }
            server_frame::Frame::Input(input) => {
                assert_eq!(input.terminal_id, id.to_string());
                seen.push(String::from_utf8_lossy(&input.data).into_owned());
            }
            _ => {}
        }
    }
    assert_eq!(seen, ["spawn", "0", "1", "2", "3", "4"], "the daemon got the host's requests out of order");
    let _ = redis.quit().await;
}

/// docs/CLUSTER.md, "Periodic host tasks": all three instances look for
/// credentials due every 100 ms; the daemon on A states credentials that
/// expire in a minute, inside the 10-minute window, so they stay due after
/// every refresh. Exactly one instance refreshes them per window (the
/// daemon is asked once, however many looks every instance makes), and
/// once the window's lease is over (expired here by hand), exactly once
/// more. Without the lease every look of every instance would ask.
#[actix_rt::test]
async fn credentials_are_refreshed_once_per_window_across_instances() {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    let key = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="; // 32 bytes
    let common = [("TETHER_ENCRYPTION__KEY", key), ("TETHER_CREDENTIALS__CHECK_MS", "100")];
    let trio = trio(&common, [&[], &[], &[]]).await;
    let mut daemon = trio.daemon(0).await;
    trio.host_everywhere("online").await;

    // The daemon answers every Credentials request, counting them.
    let asked = Arc::new(AtomicU32::new(0));
    let counter = asked.clone();
    actix_rt::spawn(async move {
        loop {
            if let server_frame::Frame::Credentials(ask) = daemon.next_server_frame().await {
                counter.fetch_add(1, Ordering::SeqCst);
                let expires = (chrono::Utc::now() + chrono::Duration::minutes(1)).to_rfc3339();
                let body = json!({ "token": "t", "expiresAt": expires }).to_string();
                daemon
                    .send_frame(daemon_frame::Frame::CredentialsResult(CredentialsResult {
                        request_id: ask.request_id,
                        credentials_json: body.into_bytes().into(),
                        error: None,
                    }))
                    .await;
            }
        }
    });
    // Nothing is stored yet, so nothing is due: the first credentials come by request.
    let path = format!("/api/v1/hosts/{}/credentials/refresh", trio.host);
    let (status, body) = trio.apis[1].post(&path, json!({})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(asked.load(Ordering::SeqCst), 1);

    let wait_for_asks = |n: u32| {
        let asked = asked.clone();
        async move {
            for _ in 0..200 {
                if asked.load(Ordering::SeqCst) >= n {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            panic!("the daemon was asked {} times, not {n}", asked.load(Ordering::SeqCst));
        }
    };
    wait_for_asks(2).await;
    looks_everywhere(&trio.apis, 5.0).await;
    assert_eq!(asked.load(Ordering::SeqCst), 2, "one automatic refresh in the window");

    let client = pg_connect(&trio.database).await;
    let lease = format!("credentials-refresh:{}", trio.host);
    let expired = client
        .execute("UPDATE leases SET expires_at = now() - interval '1 second' WHERE key = $1", &[&lease])
        .await
        .expect("expire the window's lease");
    assert_eq!(expired, 1, "the refresh was claimed with the window's lease");
    wait_for_asks(3).await;
    looks_everywhere(&trio.apis, 5.0).await;
    assert_eq!(asked.load(Ordering::SeqCst), 3, "one automatic refresh in the next window");
    let expiry: Option<chrono::DateTime<chrono::Utc>> =
        client.query_one("SELECT expires_at FROM host_credentials", &[]).await.expect("stored").get(0);
    assert!(expiry.is_some_and(|t| t > chrono::Utc::now()), "the stated expiry is stored: {expiry:?}");
}

/// Waits until every instance made `looks` more credentials looks than now.
async fn looks_everywhere(apis: &[Api], looks: f64) {
    use support::e2e::metric;
    let mut since = Vec::new();
    for api in apis {
        since.push(metric(api, "tether_credentials_checks_total").await.unwrap_or(0.0));
    }
    for (api, since) in apis.iter().zip(since) {
        for _ in 0..200 {
            if metric(api, "tether_credentials_checks_total").await.unwrap_or(0.0) >= since + looks {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// REST input through B for a daemon on A that does not read: B's requests
/// are refused 429 `input_backlog` once 4 MiB waits at A, before A closes
/// the daemon for not reading, so every input B answered 202 reaches the
/// daemon in order once it reads. A refusal travels in place of the
/// owner's acknowledgement; B used to answer 202 at the acknowledgement
/// whatever the owner then did with the input.
#[actix_rt::test]
async fn input_through_another_instance_is_refused_while_the_daemon_does_not_read() {
    let trio = trio(&[], [&[], &[], &[]]).await;
    let mut daemon = trio.daemon(0).await;
    trio.host_everywhere("online").await;
    let id = trio.running_terminal(&mut daemon).await;

    let taken = input_until_refused(&trio.apis[1], &id).await;
    inputs_arrive_in_order(&mut daemon, &trio.apis[1], &id, taken).await;
}

/// A viewer that attaches through B while the instance holding the host
/// died with its lease still live waits, told the host is offline, until
/// the lease lapses; then it is closed 4503 once, and through B again it
/// waits for the host there. It used to be closed 4503 at once, every
/// time: a client reattached thousands of times while the lease lasted,
/// and `tether attach` gave up after five.
#[actix_rt::test]
async fn a_viewer_of_a_host_whose_owner_died_waits_instead_of_bouncing() {
    let short_leases = [("TETHER_LEASE__TTL_MS", "3000"), ("TETHER_LEASE__RENEW_MS", "1000")];
    let mut trio = trio(&short_leases, [&[], &[], &[]]).await;
    let mut daemon = trio.daemon(0).await;
    trio.host_everywhere("online").await;
    let id = trio.running_terminal(&mut daemon).await;

    trio.servers[0].kill();
    let killed = std::time::Instant::now();
    let url = format!("{}/ws/v1/terminals/{id}", trio.servers[1].ws_url());
    let mut viewer = Socket::connect(&url, Some(&trio.apis[1].token), &["tether.v1"]).await;
    let status = viewer.until_message("status").await;
    assert_eq!((status["state"].as_str(), status["host"].as_str()), (Some("running"), Some("offline")), "{status}");
    assert_eq!(viewer.until_message("error").await["message"], "host offline");
    let code = viewer.expect_close().await;
    let waited = killed.elapsed();
    assert_eq!(code, Some(4503));
    assert!(waited >= Duration::from_millis(1500), "closed {waited:?} after the kill, before the lease lapsed");
    // Reattached through B once the lease is gone: it waits there.
    let mut viewer = Socket::connect(&url, Some(&trio.apis[1].token), &["tether.v1"]).await;
    assert_eq!(viewer.until_message("status").await["host"], "offline");
    match viewer.next_within(Duration::from_secs(2)).await {
        None | Some(Event::Text(_) | Event::Ping) => {}
        other => panic!("the waiting viewer got {other:?}"),
    }
}

/// Viewers waiting through B for a dead owner's lease cost B one lease
/// read a second between them all, not one each: B's store queries while
/// 30 of them wait grow by fewer than one per viewer in 3 s over what B
/// does with none. Each used to read the lease every second (90 queries in
/// the window) and ask the dead owner to join as often.
#[actix_rt::test]
async fn viewers_waiting_for_a_dead_owner_share_one_lease_read() {
    const VIEWERS: usize = 30;
    const QUERIES: &str = "tether_store_queries_total{backend=\"postgres\"}";
    let mut trio = trio(&[], [&[], &[], &[]]).await;
    let mut daemon = trio.daemon(0).await;
    trio.host_everywhere("online").await;
    let id = trio.running_terminal(&mut daemon).await;

    trio.servers[0].kill();
    let window = Duration::from_secs(3);
    let b = &trio.apis[1];
    let queries = || async { support::e2e::metric(b, QUERIES).await.expect("B counts its store queries") };
    let before = queries().await;
    tokio::time::sleep(window).await;
    let idle = queries().await - before;

    let url = format!("{}/ws/v1/terminals/{id}", trio.servers[1].ws_url());
    let mut viewers = Vec::new();
    for _ in 0..VIEWERS {
        let mut viewer = Socket::connect(&url, Some(&b.token), &["tether.v1"]).await;
        assert_eq!(viewer.until_message("status").await["host"], "offline");
        viewers.push(viewer);
    }
    let before = queries().await;
    tokio::time::sleep(window).await;
    let waiting = queries().await - before;
    assert!(
        waiting - idle < VIEWERS as f64,
        "{VIEWERS} waiting viewers cost B {waiting} store queries in {window:?}, against {idle} with none"
    );
    for viewer in &mut viewers {
        match viewer.next_within(Duration::from_millis(10)).await {
            None | Some(Event::Text(_) | Event::Ping) => {}
            other => panic!("a waiting viewer got {other:?}"),
        }
    }
}
