//! Operations endpoints against real processes: `/readyz` reports the
//! database, the migrations and, when configured, Redis (standalone or a
//! three-master cluster), and turns 503 when Redis does not answer.

mod support;

use serde_json::Value;
use support::client::Api;
use support::{free_port, redis_cluster_nodes, redis_url, TetherServer};

async fn readyz(server: &TetherServer) -> (u16, Value) {
    Api::new(server.url(), "").get("/readyz").await
}

#[actix_rt::test]
async fn readyz_reports_a_standalone_redis() {
    let url = redis_url();
    let server = TetherServer::start(&[("TETHER_REDIS__URL", &url)], &[]).await;
    let (status, body) = readyz(&server).await;
    assert_eq!((status, body["checks"]["bus"].as_str()), (200, Some("ok")), "{body}");
    assert_eq!(body["checks"]["database"], "ok");
}

#[actix_rt::test]
async fn readyz_reports_a_redis_cluster() {
    let nodes = redis_cluster_nodes();
    let server = TetherServer::start(&[("TETHER_REDIS__CLUSTER_NODES", &nodes)], &[]).await;
    let (status, body) = readyz(&server).await;
    assert_eq!((status, body["checks"]["bus"].as_str()), (200, Some("ok")), "{body}");
}

#[actix_rt::test]
async fn readyz_is_503_while_redis_does_not_answer() {
    let dead = format!("redis://127.0.0.1:{}", free_port());
    // Started without waiting for readiness: it is expected not to become ready.
    let server = TetherServer::start_unready(&[("TETHER_REDIS__URL", &dead)], &[]).await;
    let (status, body) = readyz(&server).await;
    assert_eq!(status, 503, "{body}");
    assert!(body["checks"]["bus"].as_str().is_some_and(|b| b.starts_with("redis:")), "{body}");
    assert_eq!(body["ready"], false);
    let (status, _) = Api::new(server.url(), "").get("/healthz").await;
    assert_eq!(status, 200, "the process is up even when not ready");
    // The log says why, not only /readyz (it used to say nothing of Redis).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !server.log().contains("tether_bus_connection_error") {
        assert!(std::time::Instant::now() < deadline, "nothing logged of Redis:\n{}", server.log());
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// A clean drain (SIGTERM, nothing connected) logs no error. The drain
/// used to shut the listening socket before actix-server's accept thread
/// had taken in the pause, which woke it into a failing accept: two ERROR
/// lines from `actix_server::accept` on every shutdown.
#[actix_rt::test]
async fn a_clean_shutdown_logs_no_error() {
    let mut server = TetherServer::start(&[], &[]).await;
    let status = server.terminate_async(std::time::Duration::from_secs(15)).await;
    assert!(status.is_some_and(|s| s.success()), "{status:?}\n{}", server.log());
    let log = server.log();
    assert!(log.contains("tether_instance_draining"), "{log}");
    assert!(!log.contains("ERROR"), "{log}");
}

/// Every counter docs/OPERATIONS.md suggests alerting on when it
/// increases is in `/metrics` from the start, at 0, so the first increase
/// is one a rule can see. The cell's trip counter and its failed slot
/// claims used to appear only at their first event.
#[actix_rt::test]
async fn counters_alerted_on_are_exported_at_zero_from_the_start() {
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/OPERATIONS.md")).expect("OPERATIONS.md");
    let alerted: Vec<(String, Option<String>)> = doc
        .lines()
        .filter(|line| line.contains("| counter |") && line.rsplit('|').nth(1).is_some_and(|a| a.contains("increas")))
        .filter_map(|line| {
            let name = line.split('`').nth(1)?;
            let (base, _) = name.split_once('{').unwrap_or((name, ""));
            // An alert on one label value names it in backquotes: `failed` increasing.
            let alert = line.rsplit('|').nth(1)?;
            let value = alert.split('`').nth(1).map(str::to_owned);
            Some((base.to_owned(), value))
        })
        .collect();
    assert!(alerted.len() >= 4, "{alerted:?}");
    let server = TetherServer::start(&[], &[]).await;
    let (status, text) = Api::new(server.url(), "").get_bytes("/metrics").await;
    assert_eq!(status, 200);
    let text = String::from_utf8_lossy(&text);
    for (name, value) in &alerted {
        let exported = text.lines().any(|line| {
            line.starts_with(name.as_str()) && value.as_ref().is_none_or(|v| line.contains(&format!("=\"{v}\"")))
        });
        assert!(exported, "{name} ({value:?}) is not in /metrics of a fresh server:\n{text}");
    }
    // Gauges too (the unlabelled ones; the labelled are set when rendered):
    // an alert comparing two of them must not find one missing.
    let gauges: Vec<&str> = doc
        .lines()
        .filter(|line| line.contains("| gauge |"))
        .filter_map(|line| line.split('`').nth(1))
        .filter(|name| !name.contains('{'))
        .collect();
    assert!(gauges.contains(&"tether_leases_held"), "{gauges:?}");
    for name in gauges {
        assert!(
            text.lines().any(|line| line.split_whitespace().next() == Some(name)),
            "{name} is not in /metrics of a fresh server:\n{text}"
        );
    }
}

/// `tether_leases_held` follows the hosts this instance holds down to 0:
/// it used to keep its last value once the last daemon left (nothing was
/// left to renew), and OPERATIONS.md's alert comparing it with
/// `tether_daemon_connections` fired on an idle pod.
#[actix_rt::test]
async fn the_leases_held_gauge_falls_to_zero_when_the_last_host_leaves() {
    let mut e =
        support::e2e::start(false, &[("TETHER_LEASE__RENEW_MS", "300"), ("TETHER_LEASE__TTL_MS", "3000")]).await;
    let gauge = |e: &support::e2e::E2e| {
        let api = Api::new(e.server.url(), "");
        async move { support::e2e::metric(&api, "tether_leases_held").await }
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while gauge(&e).await != Some(1.0) {
        assert!(std::time::Instant::now() < deadline, "never 1 with one host: {:?}", gauge(&e).await);
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    e.daemon.kill();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while gauge(&e).await != Some(0.0) {
        assert!(std::time::Instant::now() < deadline, "still {:?} with no host", gauge(&e).await);
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}
