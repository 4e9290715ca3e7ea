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

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use actix_http::ws;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};

/// Kills a child process when dropped.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn tether_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    // target/<profile>/examples/relay_bench -> target/<profile>/tether
    exe.parent().and_then(|p| p.parent()).map(|p| p.join("tether")).expect("target dir")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("port")
}

async fn api(method: &str, url: &str, token: &str, body: Option<Value>) -> Value {
    let client = awc::Client::default();
    let req = match method {
        "POST" => client.post(url),
        _ => client.get(url),
    }
    .insert_header(("Authorization", format!("Bearer {token}")));
    let mut res = match body {
        Some(body) => req.send_json(&body).await,
        None => req.send().await,
    }
    .expect("request");
    res.json::<Value>().limit(16 * 1024 * 1024).await.unwrap_or(Value::Null)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

#[actix_rt::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let megabytes: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(200);
    let rounds: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(20);
    let tether = tether_binary();
    let dir = tempfile::tempdir().expect("temp dir");
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let env_clean = |c: &mut Command| {
        for (key, _) in std::env::vars().filter(|(k, _)| k.starts_with("TETHER_")) {
            c.env_remove(key);
        }
        c.env("RUST_LOG", "warn").current_dir(dir.path());
    };

    let mut serve = Command::new(&tether);
    serve.args(["serve", "--listen", &format!("127.0.0.1:{port}")]).stdout(Stdio::null());
    env_clean(&mut serve);
    let _serve = Guard(serve.spawn().expect("spawn serve"));
    let mut token_cmd = Command::new(&tether);
    token_cmd.args(["token", "create", "--user", "bench"]);
    env_clean(&mut token_cmd);
    let token = loop {
        let out = token_cmd.output().expect("token create");
        if out.status.success() {
            break String::from_utf8_lossy(&out.stdout).trim().to_string();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // `token create` works on the database file directly, so the server
    // may not be listening yet: wait until it is ready.
    let client = awc::Client::default();
    let began = Instant::now();
    while !client.get(format!("{base}/readyz")).send().await.is_ok_and(|r| r.status().is_success()) {
        assert!(began.elapsed() < Duration::from_secs(60), "the server was not ready after 60 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut daemon = Command::new(&tether);
    daemon
        .args(["daemon", "--server", &base, "--token", &token, "--allow-dir", "/tmp", "--state-dir"])
        .arg(dir.path().join("state"));
    env_clean(&mut daemon);
    let _daemon = Guard(daemon.spawn().expect("spawn daemon"));
    let host = loop {
        let hosts = api("GET", &format!("{base}/api/v1/hosts"), &token, None).await;
        if let Some(h) = hosts["hosts"].as_array().and_then(|h| h.iter().find(|h| h["state"] == "online")) {
            break h["id"].as_str().expect("id").to_string();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };

    // Terminal start latency.
    let mut starts = Vec::new();
    for _ in 0..rounds {
        let began = Instant::now();
        let body = json!({"hostId": host, "argv": ["sleep", "1000"], "dir": "/tmp"});
        let t = api("POST", &format!("{base}/api/v1/terminals"), &token, Some(body)).await;
        let id = t["terminal"]["id"].as_str().expect("id").to_string();
        loop {
            let t = api("GET", &format!("{base}/api/v1/terminals/{id}"), &token, None).await;
            if t["terminal"]["state"] == "running" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        starts.push(began.elapsed());
        api("POST", &format!("{base}/api/v1/terminals/{id}/kill"), &token, Some(json!({"signal": 9}))).await;
    }

    // Attach latency and throughput on one terminal.
    let script =
        format!("read go; head -c {} /dev/zero | tr '\\0' x; echo; echo bench-done; exec sleep 1000", megabytes << 20);
    let body = json!({"hostId": host, "argv": ["sh", "-c", script], "dir": "/tmp"});
    let t = api("POST", &format!("{base}/api/v1/terminals"), &token, Some(body)).await;
    let id = t["terminal"]["id"].as_str().expect("id").to_string();
    let ws_url = format!("ws://127.0.0.1:{port}/ws/v1/terminals/{id}");
    let connect = || async {
        let (_, framed) = awc::Client::default()
            .ws(ws_url.as_str())
            .header("Authorization", format!("Bearer {token}"))
            .protocols(["tether.v1"])
            .max_frame_size(8 << 20)
            .connect()
            .await
            .expect("ws connect");
        framed
    };
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
