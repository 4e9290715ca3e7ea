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
