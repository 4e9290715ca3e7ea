//! Relay benchmark: a real `tether serve` (embedded SQLite), a real
//! `tether daemon` and a viewer on loopback. Prints:
//!
//! - terminal start latency (POST /terminals until the row is `running`),
//! - attach latency (socket open until the replay snapshot arrived),
//! - keystroke echo latency (a byte typed until the PTY's echo arrives),
//! - output throughput through PTY -> daemon -> server -> viewer.
//!
//! Build and run (release, the `tether` binary must be built first):
//!
//! ```sh
//! cargo build --release --bin tether --example relay_bench
//! target/release/examples/relay_bench [MEGABYTES] [ROUNDS]
//! ```

mod support;

use std::time::{Duration, Instant};

use actix_http::ws;
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use support::{api, kill_terminal, percentile, websocket, Single};

#[actix_rt::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let megabytes: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(200);
    let rounds: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(20);
    let single = Single::start().await;
    let (base, token, host) = (single.instance.base(), single.token.as_str(), single.host.as_str());

    // Terminal start latency.
    let mut starts = Vec::new();
    for _ in 0..rounds {
        let began = Instant::now();
        let body = json!({"hostId": host, "argv": ["sleep", "1000"], "dir": "/tmp"});
        let t = api("POST", &format!("{base}/api/v1/terminals"), token, Some(body)).await;
        let id = t["terminal"]["id"].as_str().expect("id").to_string();
        loop {
            let t = api("GET", &format!("{base}/api/v1/terminals/{id}"), token, None).await;
            if t["terminal"]["state"] == "running" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        starts.push(began.elapsed());
        kill_terminal(&base, token, &id).await;
    }

    // Attach latency and throughput on one terminal.
    let script =
        format!("read go; head -c {} /dev/zero | tr '\\0' x; echo; echo bench-done; exec sleep 1000", megabytes << 20);
    let body = json!({"hostId": host, "argv": ["sh", "-c", script], "dir": "/tmp"});
    let t = api("POST", &format!("{base}/api/v1/terminals"), token, Some(body)).await;
    let id = t["terminal"]["id"].as_str().expect("id").to_string();
    let ws_url = format!("{}/ws/v1/terminals/{id}", single.instance.ws());
    let connect = || async { websocket(&ws_url, Some(token)).await.expect("ws connect") };
    let mut attaches = Vec::new();
    for _ in 0..rounds {
        let began = Instant::now();
        let mut framed = connect().await;
        loop {
            if let Some(Ok(ws::Frame::Text(t))) = framed.next().await {
                if String::from_utf8_lossy(&t).contains("\"live\"") {
                    break;
                }
            }
        }
        attaches.push(began.elapsed());
        let _ = framed.send(ws::Message::Close(None)).await;
    }
    // Keystroke echo: one byte typed, until the PTY's echo of it arrives.
    let mut framed = connect().await;
    loop {
        if let Some(Ok(ws::Frame::Text(t))) = framed.next().await {
            if String::from_utf8_lossy(&t).contains("\"live\"") {
                break;
            }
        }
    }
    let mut echoes = Vec::new();
    for i in 0..rounds * 5 {
        let key = [b'a' + (i % 26) as u8];
        let began = Instant::now();
        let _ = framed.send(ws::Message::Binary(key.to_vec().into())).await;
        loop {
            if let Some(Ok(ws::Frame::Binary(b))) = framed.next().await {
                if b.contains(&key[0]) {
                    break;
                }
            }
        }
        echoes.push(began.elapsed());
    }
    // Clear the typed line, then start the flood.
    let _ = framed.send(ws::Message::Binary(vec![0x15].into())).await;
    let _ = framed.send(ws::Message::Text(json!({"type": "input", "data": "go\n"}).to_string().into())).await;
    let began = Instant::now();
    let mut bytes = 0u64;
    let mut tail = Vec::new();
    while let Some(Ok(frame)) = framed.next().await {
        if let ws::Frame::Binary(b) = frame {
            bytes += b.len() as u64;
            tail.extend_from_slice(&b[b.len().saturating_sub(64)..]);
            if tail.len() > 256 {
                tail.drain(..tail.len() - 128);
            }
            if String::from_utf8_lossy(&tail).contains("bench-done") {
                break;
            }
        }
    }
    let elapsed = began.elapsed();

    starts.sort();
    attaches.sort();
    println!(
        "terminal start (POST -> running), {rounds} rounds: p50 {:?}, p90 {:?}, max {:?}",
        percentile(&starts, 0.5),
        percentile(&starts, 0.9),
        percentile(&starts, 1.0)
    );
    println!(
        "attach (socket -> live), {rounds} rounds: p50 {:?}, p90 {:?}, max {:?}",
        percentile(&attaches, 0.5),
        percentile(&attaches, 0.9),
        percentile(&attaches, 1.0)
    );
    echoes.sort();
    println!(
        "keystroke echo (viewer -> PTY -> viewer), {} rounds: p50 {:?}, p90 {:?}, max {:?}",
        echoes.len(),
        percentile(&echoes, 0.5),
        percentile(&echoes, 0.9),
        percentile(&echoes, 1.0)
    );
    println!(
        "throughput: {} MiB in {:.2?} = {:.1} MiB/s (PTY -> daemon -> server -> one viewer)",
        bytes >> 20,
        elapsed,
        bytes as f64 / (1 << 20) as f64 / elapsed.as_secs_f64()
    );
}
