//! The sweep (docs/ARCHITECTURE.md, "The sweep") with short configured intervals, against a real
//! `tether serve` and a scripted daemon: unacknowledged launches fail, runs
//! of hosts gone too long are lost, hosts whose owner died go offline, and
//! audit events past their retention are deleted.

mod support;

use std::time::Duration;

use serde_json::json;
use support::client::{create_token, daemon_url, hello, Api, Socket};
use support::{pg_database, TetherServer};
use tether::proto::v1::server_frame;

const FAST: &[(&str, &str)] = &[
    ("TETHER_SWEEP__INTERVAL_MS", "200"),
    ("TETHER_SWEEP__LAUNCH_TIMEOUT_MS", "600"),
    ("TETHER_RUNS__LOST_AFTER", "600"),
];

async fn daemon(server: &TetherServer, api: &Api) -> (String, Socket) {
    let (_, body) = api.post("/api/v1/hosts", json!({"hostname": "box"})).await;
    let host = body["host"]["id"].as_str().expect("host").to_string();
    let mut sock = Socket::connect(&daemon_url(server), Some(&api.token), &["tether.daemon.v1"]).await;
    sock.send_frame(hello(&host)).await;
    assert!(matches!(sock.next_server_frame().await, server_frame::Frame::HelloAck(_)));
    (host, sock)
}

#[actix_rt::test]
async fn an_unacknowledged_launch_fails() {
    let server = TetherServer::start(FAST, &[]).await;
    let api = Api::new(server.url(), create_token(&server, "ann"));
    let (host, mut sock) = daemon(&server, &api).await;
    let (_, body) = api.post("/api/v1/terminals", json!({"hostId": host})).await;
    let id = body["terminal"]["id"].as_str().expect("id").to_string();
    assert!(matches!(sock.next_server_frame().await, server_frame::Frame::Spawn(_)));
    assert_eq!(body["terminal"]["state"], "launching");
    // The daemon never answers Started.
    let t = api.wait_for(&format!("/api/v1/terminals/{id}"), "error", |b| b["terminal"]["state"] == "error").await;
    assert_eq!(t["terminal"]["error"], "launch not acknowledged");
}

#[actix_rt::test]
async fn runs_of_a_host_gone_too_long_are_lost() {
    let server = TetherServer::start(FAST, &[]).await;
    let api = Api::new(server.url(), create_token(&server, "ann"));
    let (host, mut sock) = daemon(&server, &api).await;
    sock.close().await;
    drop(sock);
    api.wait_for(&format!("/api/v1/hosts/{host}"), "offline", |b| b["host"]["state"] == "offline").await;
    let (_, body) = api.post("/api/v1/runs", json!({"hostId": host, "argv": ["true"]})).await;
    let run = body["run"]["id"].as_str().expect("id").to_string();
    let body = api.wait_for(&format!("/api/v1/runs/{run}"), "lost", |b| b["run"]["state"] == "lost").await;
    assert!(body["run"]["finishedAt"].is_string());
}

#[actix_rt::test]
async fn a_host_whose_owner_died_is_marked_offline() {
    let url = pg_database().await;
    let mut first = TetherServer::start(
        &[
            ("TETHER_DATABASE__URL", &url),
            ("TETHER_LEASE__TTL_MS", "1000"),
            ("TETHER_LEASE__RENEW_MS", "300"),
            ("TETHER_SWEEP__STALE_HOST_MS", "1000"),
        ],
        &[],
    )
    .await;
    let api = Api::new(first.url(), create_token(&first, "ann"));
    let (host, _sock) = daemon(&first, &api).await;
    first.kill(); // a crash: nothing released, the row still says online
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.expect("connect");
    actix_rt::spawn(conn);
    let host_id = uuid::Uuid::parse_str(&host).expect("uuid");
    let row = client.query_one("SELECT state FROM hosts WHERE id = $1", &[&host_id]).await.expect("row");
    assert_eq!(row.get::<_, String>(0), "online");
    let mut env: Vec<(&str, &str)> = FAST.to_vec();
    env.extend([
        ("TETHER_DATABASE__URL", url.as_str()),
        ("TETHER_LEASE__TTL_MS", "1000"),
        ("TETHER_LEASE__RENEW_MS", "300"),
        ("TETHER_SWEEP__STALE_HOST_MS", "1000"),
    ]);
    let _second = TetherServer::start(&env, &[]).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let row = client.query_one("SELECT state FROM hosts WHERE id = $1", &[&host_id]).await.expect("row");
        if row.get::<_, String>(0) == "offline" {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the sweep never marked the host offline");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The sweep deletes audit events older than `audit.retention_ms` and
/// keeps the younger ones.
#[actix_rt::test]
async fn the_sweep_ages_out_audit_events_past_their_retention() {
    let url = pg_database().await;
    let mut env: Vec<(&str, &str)> = FAST.to_vec();
    env.extend([("TETHER_DATABASE__URL", url.as_str()), ("TETHER_AUDIT__RETENTION_MS", "3600000")]);
    let server = TetherServer::start(&env, &[]).await;
    let api = Api::new(server.url(), create_token(&server, "ann"));
    let mut settings = tether::config::Settings::default();
    settings.database.url = Some(url.clone());
    let store = tether::store::open(&settings).await.expect("the server's store");
    let ann = store.ensure_user("ann").await.expect("ann");
    let now = chrono::Utc::now();
    let event = |detail: &str, age: chrono::Duration| tether::store::NewAuditEvent {
        at: now - age,
        user_id: ann.id,
        token_id: None,
        action: tether::store::AuditAction::Kill,
        host_id: None,
        terminal_id: None,
        instance_id: "elsewhere#000001".into(),
        detail: Some(detail.into()),
    };
    let batch =
        [event("two hours old", chrono::Duration::hours(2)), event("half an hour old", chrono::Duration::minutes(30))];
    store.insert_audit_events(&batch).await.expect("insert");
    let details = |body: &serde_json::Value| -> Vec<String> {
        body["events"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e["detail"].as_str().map(str::to_string))
            .collect()
    };
    // One pass of the sweep deletes everything past the retention at once:
    // once the old event is gone, the younger one has been judged too.
    let body = api
        .wait_for("/api/v1/audit", "the old event aged out", |b| !details(b).contains(&"two hours old".into()))
        .await;
    assert!(details(&body).contains(&"half an hour old".into()), "the younger event was kept: {body}");
}
