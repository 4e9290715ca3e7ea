//! Run logs across moves (docs/CLUSTER.md, "Run logs across moves"): two
//! real `tether serve` instances sharing PostgreSQL and Redis, a real
//! `tether daemon` that dials them through a TCP balancer, and a run that
//! prints continuously while its daemon's connection is cut and lands on
//! the other instance, then back. The daemon keeps the run's PTY across the
//! redials; each new owner's capture resumes from where the log ends (the
//! first owner's capture, still waiting, resumes from further back when the
//! host returns before it learned the host is elsewhere, and its repeated
//! bytes are skipped), so the final log is exactly the program's output,
//! with `logGapBytes` 0. An owner the host left for good keeps no capture:
//! once its heartbeat sees the host elsewhere, its arbiter goes.

mod support;

use std::time::Duration;

use serde_json::json;
use support::balancer::Balancer;
use support::client::{create_token, Api};
use support::daemon::DaemonProcess;
use support::e2e::metric;

const LINES: u32 = 3000;

/// What the run prints: `line N` per line, with a pause every 100 lines so
/// it runs for about nine seconds; the PTY turns each `\n` into `\r\n`.
fn expected_output() -> Vec<u8> {
    (1..=LINES).flat_map(|i| format!("line {i}\r\n").into_bytes()).collect()
}

async fn log_len(api: &Api, run: &str) -> usize {
    api.get_bytes(&format!("/api/v1/runs/{run}/log")).await.1.len()
}

/// Waits until the log holds more than `bytes` bytes.
async fn log_grows_past(api: &Api, run: &str, bytes: usize) -> usize {
    for _ in 0..400 {
        let len = log_len(api, run).await;
        if len > bytes {
            return len;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the log stayed at {bytes} bytes");
}

/// Waits until the daemon is connected to `to` and not to `from`.
async fn daemon_moved(from: &Api, to: &Api) {
    for _ in 0..400 {
        let gone = metric(from, "tether_daemon_connections").await.unwrap_or(0.0) == 0.0;
        if gone && metric(to, "tether_daemon_connections").await == Some(1.0) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the daemon did not move");
}

#[actix_rt::test]
async fn a_run_log_is_complete_across_daemon_moves() {
    let (a, b) = support::instance_pair().await;
    let token = create_token(&a, "ann");
    let (on_a, on_b) = (Api::new(a.url(), token.clone()), Api::new(b.url(), token.clone()));
    let dir = tempfile::tempdir().expect("temp dir");
    let balancer = Balancer::start(a.listen_addr()).await;
    let daemon = DaemonProcess::start_url(&balancer.url(), &token, &dir.path().join("state"));
    let hosts = on_a
        .wait_for("/api/v1/hosts", "host online", |b| {
            b["hosts"].as_array().is_some_and(|h| h.iter().any(|h| h["state"] == "online"))
        })
        .await;
    let host = hosts["hosts"][0]["id"].as_str().expect("host id").to_string();

    let script = format!("for i in $(seq 1 {LINES}); do echo \"line $i\"; case $i in *00) sleep 0.3;; esac; done");
    let (status, body) =
        on_b.post("/api/v1/runs", json!({"hostId": host, "argv": ["sh", "-c", script], "dir": "/tmp"})).await;
    assert_eq!(status, 201, "{body}");
    let run = body["run"]["id"].as_str().expect("run id").to_string();
    let mut seen = log_grows_past(&on_a, &run, 0).await;

    // The daemon's connection is cut twice: it lands on B, then on A again.
    for (to, from, api) in [(&b, &on_a, &on_b), (&a, &on_b, &on_a)] {
        balancer.switch(to.listen_addr());
        daemon_moved(from, api).await;
        seen = log_grows_past(api, &run, seen).await;
    }
    let (_, body) = on_a.get(&format!("/api/v1/runs/{run}")).await;
    assert_eq!(body["run"]["state"], "running", "the run kept running through the moves: {body}");
    let done = on_b
        .wait_for(&format!("/api/v1/runs/{run}"), "run finished", |b| {
            matches!(b["run"]["state"].as_str(), Some("succeeded" | "failed" | "lost"))
        })
        .await;
    assert_eq!(done["run"]["state"], "succeeded", "{done}");
    let (_, log) = on_b.get_bytes(&format!("/api/v1/runs/{run}/log")).await;
    let expected = expected_output();
    if log.as_ref() != expected.as_slice() {
        let at = log.iter().zip(&expected).position(|(x, y)| x != y).unwrap_or(log.len().min(expected.len()));
        panic!(
            "the log differs from the output at byte {at} (log {} bytes, output {}): {:?}",
            log.len(),
            expected.len(),
            String::from_utf8_lossy(&log[at.saturating_sub(40)..(at + 40).min(log.len())])
        );
    }
    assert_eq!(done["run"]["logGapBytes"], 0, "{done}");
    let (_, list) = on_a.get("/api/v1/runs").await;
    assert_eq!(list["runs"][0]["logGapBytes"], 0, "{list}");
    // B, which the host left for A, kept a waiting capture (its arbiter and
    // its bus subscription) for the life of the process; it lets it go once
    // its heartbeat reads that the host is on A.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while metric(&on_b, "tether_terminal_arbiters").await != Some(0.0) {
        assert!(tokio::time::Instant::now() < deadline, "B still has an arbiter for the run's terminal");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(daemon);
}

/// A run whose command ends while its daemon's connection is cut: the
/// daemon reports the terminal ended when it redials, and the server takes
/// what it printed after the cut from the ring the daemon kept
/// (`resume_ended`) before it records the run's end. The log is the whole
/// output and `logGapBytes` is 0. The tail used to be lost (and, before
/// that, `logGapBytes` said 0 about a log that lacked it).
#[actix_rt::test]
async fn a_run_that_ends_while_its_daemon_is_away_keeps_its_tail() {
    let server = support::TetherServer::start(&[], &[]).await;
    let token = create_token(&server, "ann");
    let api = Api::new(server.url(), token.clone());
    let dir = tempfile::tempdir().expect("temp dir");
    let balancer = Balancer::start(server.listen_addr()).await;
    let _daemon = DaemonProcess::start_url(&balancer.url(), &token, &dir.path().join("state"));
    let hosts = api
        .wait_for("/api/v1/hosts", "host online", |b| {
            b["hosts"].as_array().is_some_and(|h| h.iter().any(|h| h["state"] == "online"))
        })
        .await;
    let host = hosts["hosts"][0]["id"].as_str().expect("host id").to_string();
    let script = "echo first; sleep 2; seq 1 1000; echo end";
    let (status, body) = api.post("/api/v1/runs", json!({"hostId": host, "argv": ["sh", "-c", script]})).await;
    assert_eq!(status, 201, "{body}");
    let run = body["run"]["id"].as_str().expect("run id").to_string();
    log_grows_past(&api, &run, 0).await;

    // Cut before the command goes on, back after it ended.
    balancer.outage(Duration::from_secs(5)).await;
    let path = format!("/api/v1/runs/{run}");
    let done = api.wait_for(&path, "the run final", |b| b["run"]["state"] == "succeeded").await;
    let output = done["run"]["usage"]["outputBytes"].as_u64().expect("usage");
    assert_eq!(done["run"]["logGapBytes"], 0, "{done}");
    let log = api.get_bytes(&format!("/api/v1/runs/{run}/log")).await.1;
    assert_eq!(log.len() as u64, output, "{done}");
    let expected: Vec<u8> = ["first\r\n".to_owned()]
        .into_iter()
        .chain((1..=1000).map(|n| format!("{n}\r\n")))
        .chain(["end\r\n".to_owned()])
        .flat_map(String::into_bytes)
        .collect();
    assert_eq!(String::from_utf8_lossy(&log), String::from_utf8_lossy(&expected));
}
