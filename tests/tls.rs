//! TLS end to end with real processes (docs/CONFIG.md, "TLS"): `tether
//! serve` terminates TLS from PEM files, `tether daemon` and `tether attach`
//! dial `https://`/`wss://` trusting `--ca-file`. The CA and certificates are
//! generated at run time with rcgen; nothing is read from the machine's
//! trust store that the test depends on.
//!
//! A wrong CA and an expired certificate must fail with a message naming the
//! problem, and the daemon must keep retrying rather than exit.

mod support;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
use serde_json::{json, Value};

const TETHER: &str = env!("CARGO_BIN_EXE_tether");
const WAIT: Duration = Duration::from_secs(30);
const UNKNOWN_CA: &str = "the server's certificate is not signed by a trusted certificate authority";
const EXPIRED: &str = "the server's certificate has expired";

/// A CA, a server certificate it signed, an expired one it signed, and an
/// unrelated CA, as PEM files in `dir`.
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn generate() -> Pki {
        let dir = tempfile::tempdir().expect("temp dir");
        let (ca, ca_key) = make_ca("tether test CA");
        let (other_ca, _) = make_ca("some other CA");
        let write = |name: &str, pem: String| std::fs::write(dir.path().join(name), pem).expect("write PEM");
        write("ca.pem", ca.pem());
        write("wrong-ca.pem", other_ca.pem());

        let key = KeyPair::generate().expect("server key");
        let params = server_params();
        write("server.pem", params.signed_by(&key, &ca, &ca_key).expect("sign server cert").pem());
        write("server.key", key.serialize_pem());

        let old_key = KeyPair::generate().expect("expired key");
        let mut params = server_params();
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        write("expired.pem", params.signed_by(&old_key, &ca, &ca_key).expect("sign expired cert").pem());
        write("expired.key", old_key.serialize_pem());
        Pki { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

fn make_ca(name: &str) -> (rcgen::Certificate, KeyPair) {
    let key = KeyPair::generate().expect("CA key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    (params.self_signed(&key).expect("self-sign CA"), key)
}

fn server_params() -> CertificateParams {
    let mut params =
        CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).expect("server params");
    params.distinguished_name.push(DnType::CommonName, "tether test server");
    params
}

/// A child `tether` process with its output in a log file; killed on drop.
struct Proc {
    child: Child,
    log: PathBuf,
}

impl Proc {
    fn spawn(args: &[&str], env: &[(&str, &str)], log: PathBuf) -> Proc {
        let out = File::create(&log).expect("log file");
        let err = out.try_clone().expect("log file");
        let mut command = Command::new(TETHER);
        // Inherited TETHER_* variables would be read as settings.
        for (key, _) in std::env::vars_os() {
            if key.to_str().is_some_and(|k| k.starts_with("TETHER_")) {
                command.env_remove(&key);
            }
        }
        command.args(args).envs(env.iter().copied()).env("RUST_LOG", "info");
        let child = command.stdin(Stdio::null()).stdout(out).stderr(err).spawn().expect("spawn tether");
        Proc { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits until the log holds `needle` at least `times` times.
    async fn wait_log(&mut self, needle: &str, times: usize) {
        let started = Instant::now();
        while self.log().matches(needle).count() < times {
            assert!(self.running(), "the process exited; its log:\n{}", self.log());
            assert!(started.elapsed() < WAIT, "no {times} x {needle:?} in the log after {WAIT:?}:\n{}", self.log());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// When each log line holding `needle` was written (tracing's RFC 3339
/// timestamp at the start of the line).
fn times_of(log: &str, needle: &str) -> Vec<chrono::DateTime<chrono::FixedOffset>> {
    log.lines()
        .filter(|line| line.contains(needle))
        .filter_map(|line| line.split_whitespace().next())
        .filter_map(|stamp| chrono::DateTime::parse_from_rfc3339(stamp).ok())
        .collect()
}

/// The daemon retried `needle`'s failure with its backoff (1 s, then 2 s,
/// each plus jitter): lower bounds only, so a slow machine cannot fail it.
fn assert_backed_off(daemon: &Proc, needle: &str) {
    let log = daemon.log();
    let times = times_of(&log, needle);
    assert!(times.len() >= 3, "fewer than 3 attempts logged:\n{log}");
    let gaps: Vec<i64> = times.windows(2).map(|w| (w[1] - w[0]).num_milliseconds()).collect();
    assert!(gaps[0] >= 1_000 && gaps[1] >= 2_000, "no 1 s / 2 s backoff between attempts ({gaps:?} ms):\n{log}");
}

impl Proc {
    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `tether serve` with TLS on a free port and its own SQLite file.
struct TlsServer {
    proc: Proc,
    port: u16,
    sqlite: PathBuf,
    _scratch: tempfile::TempDir,
}

impl TlsServer {
    fn start(cert: &Path, key: &Path) -> TlsServer {
        let scratch = tempfile::tempdir().expect("scratch");
        let port = support::free_port();
        let sqlite = scratch.path().join("tether.db");
        let proc = Self::spawn(cert, key, port, &sqlite, scratch.path().join("serve.log"));
        TlsServer { proc, port, sqlite, _scratch: scratch }
    }

    /// Stops this server and starts it again on the same port and database
    /// with another certificate.
    fn restart_with(&mut self, cert: &Path, key: &Path) {
        let log = self._scratch.path().join(format!("serve-{}.log", rand::random::<u32>()));
        // The old process is gone (and its port free) before the new one binds.
        self.proc.stop();
        self.proc = Self::spawn(cert, key, self.port, &self.sqlite, log);
    }

    fn spawn(cert: &Path, key: &Path, port: u16, sqlite: &Path, log: PathBuf) -> Proc {
        let listen = format!("127.0.0.1:{port}");
        let (cert, key, db) = (cert.display().to_string(), key.display().to_string(), sqlite.display().to_string());
        let env = [
            ("TETHER_HTTP__LISTEN", listen.as_str()),
            ("TETHER_HTTP__TLS_CERT_PATH", cert.as_str()),
            ("TETHER_HTTP__TLS_KEY_PATH", key.as_str()),
            ("TETHER_DATABASE__SQLITE_PATH", db.as_str()),
        ];
        Proc::spawn(&["serve"], &env, log)
    }

    fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// Waits for the "listening on https://" line (the listener is bound).
    async fn wait_listening(&mut self) {
        let line = format!("listening on https://127.0.0.1:{}", self.port);
        self.proc.wait_log(&line, 1).await;
    }

    fn token(&self) -> String {
        let db = self.sqlite.display().to_string();
        let output =
            support::tether_cmd(&["token", "create", "--user", "ann"], &[("TETHER_DATABASE__SQLITE_PATH", &db)]);
        assert!(output.status.success(), "token create: {}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8(output.stdout).expect("utf-8 token").trim().to_owned()
    }
}

/// REST over https with `ca` trusted, through the library's own client.
struct Rest {
    client: awc::Client,
    base: String,
    token: String,
}

impl Rest {
    fn new(base: String, token: String, ca: &Path) -> Rest {
        let client = tether::tls::http_client(Some(ca), Duration::from_secs(10)).expect("client with CA");
        Rest { client, base, token }
    }

    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<(u16, Value), String> {
        let url = format!("{}{path}", self.base);
        let request = match method {
            "POST" => self.client.post(url),
            _ => self.client.get(url),
        }
        .bearer_auth(&self.token);
        let mut response = match body {
            Some(body) => request.send_json(&body).await,
            None => request.send().await,
        }
        .map_err(|e| tether::tls::explain(&e))?;
        let bytes = response.body().await.map_err(|e| e.to_string())?;
        Ok((response.status().as_u16(), serde_json::from_slice(&bytes).unwrap_or(Value::Null)))
    }

    async fn wait_healthy(&self, server: &mut TlsServer) {
        let started = Instant::now();
        loop {
            if let Ok((200, _)) = self.call("GET", "/healthz", None).await {
                return;
            }
            assert!(server.proc.running(), "tether serve exited; its log:\n{}", server.proc.log());
            assert!(started.elapsed() < WAIT, "no https /healthz after {WAIT:?}; log:\n{}", server.proc.log());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn online_host(&self) -> Option<String> {
        let (_, body) = self.call("GET", "/api/v1/hosts", None).await.ok()?;
        let hosts = body["hosts"].as_array()?;
        hosts.iter().find(|h| h["state"] == "online").and_then(|h| h["id"].as_str()).map(str::to_owned)
    }
}

fn daemon(server: &TlsServer, token: &str, ca: &Path, dir: &Path) -> Proc {
    let state = dir.join(format!("daemon-state-{}", rand::random::<u32>()));
    let (url, ca, state_dir) = (server.url(), ca.display().to_string(), state.display().to_string());
    let args = [
        "daemon",
        "--server",
        &url,
        "--token",
        token,
        "--ca-file",
        &ca,
        "--allow-dir",
        "/tmp",
        "--state-dir",
        &state_dir,
    ];
    Proc::spawn(&args, &[], dir.join(format!("daemon-{}.log", rand::random::<u32>())))
}

#[actix_rt::test]
async fn daemon_and_attach_run_a_terminal_over_wss_with_a_ca_file() {
    let pki = Pki::generate();
    let ca = pki.path("ca.pem");
    let mut server = TlsServer::start(&pki.path("server.pem"), &pki.path("server.key"));
    server.wait_listening().await;
    let token = server.token();
    let rest = Rest::new(server.url(), token.clone(), &ca);
    rest.wait_healthy(&mut server).await;

    let mut daemon = daemon(&server, &token, &ca, pki.dir.path());
    let started = Instant::now();
    let host_id = loop {
        if let Some(id) = rest.online_host().await {
            break id;
        }
        assert!(daemon.running(), "the daemon exited; its log:\n{}", daemon.log());
        assert!(started.elapsed() < WAIT, "no online host over wss after {WAIT:?}; daemon log:\n{}", daemon.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };

    let argv = json!(["sh", "-c", "echo tls-ok-$((6*7)); exec sleep 60"]);
    let (status, body) = rest
        .call("POST", "/api/v1/terminals", Some(json!({"hostId": host_id, "argv": argv, "dir": "/tmp"})))
        .await
        .expect("create terminal");
    assert_eq!(status, 201, "{body}");
    let terminal_id = body["terminal"]["id"].as_str().expect("terminal id").to_owned();

    // The real CLI viewer over wss://, trusting the same CA.
    let (url, ca_arg) = (server.url(), ca.display().to_string());
    let args = ["attach", terminal_id.as_str(), "--server", &url, "--token", &token, "--ca-file", &ca_arg];
    let mut attach = Proc::spawn(&args, &[], pki.path("attach.log"));
    // The shell's computed output proves bytes crossed daemon -> server -> viewer.
    attach.wait_log("tls-ok-42", 1).await;
    assert!(daemon.running());
}

#[actix_rt::test]
async fn a_wrong_ca_is_named_and_the_daemon_keeps_retrying() {
    let pki = Pki::generate();
    let mut server = TlsServer::start(&pki.path("server.pem"), &pki.path("server.key"));
    server.wait_listening().await;
    let token = server.token();
    let rest = Rest::new(server.url(), token.clone(), &pki.path("ca.pem"));
    rest.wait_healthy(&mut server).await;

    let mut daemon = daemon(&server, &token, &pki.path("wrong-ca.pem"), pki.dir.path());
    // Three failed attempts, backing off in between, and still running.
    daemon.wait_log(UNKNOWN_CA, 3).await;
    assert!(daemon.running(), "the daemon gave up:\n{}", daemon.log());
    assert_backed_off(&daemon, UNKNOWN_CA);
    assert_eq!(rest.online_host().await, None);

    // `tether attach` stops at once with the same explanation (a retry cannot fix it).
    let wrong = pki.path("wrong-ca.pem").display().to_string();
    let url = server.url();
    let args =
        ["attach", "00000000-0000-0000-0000-000000000000", "--server", &url, "--token", &token, "--ca-file", &wrong];
    let output = support::tether_cmd(&args, &[]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(UNKNOWN_CA), "{stderr}");
}

#[actix_rt::test]
async fn an_expired_certificate_is_named_and_the_daemon_keeps_retrying() {
    let pki = Pki::generate();
    let mut server = TlsServer::start(&pki.path("expired.pem"), &pki.path("expired.key"));
    server.wait_listening().await;
    let token = server.token();

    let mut daemon = daemon(&server, &token, &pki.path("ca.pem"), pki.dir.path());
    daemon.wait_log(EXPIRED, 3).await;
    assert!(daemon.running(), "the daemon gave up:\n{}", daemon.log());
    assert_backed_off(&daemon, EXPIRED);

    let ca = pki.path("ca.pem").display().to_string();
    let url = server.url();
    let args =
        ["attach", "00000000-0000-0000-0000-000000000000", "--server", &url, "--token", &token, "--ca-file", &ca];
    let output = support::tether_cmd(&args, &[]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(EXPIRED), "{stderr}");

    // Renewing the server's certificate is all it takes: the retrying daemon
    // comes online by itself.
    server.restart_with(&pki.path("server.pem"), &pki.path("server.key"));
    server.wait_listening().await;
    daemon.wait_log("tether_daemon_connected", 1).await;
    let rest = Rest::new(server.url(), token.clone(), &pki.path("ca.pem"));
    let started = Instant::now();
    while rest.online_host().await.is_none() {
        assert!(started.elapsed() < WAIT, "the host never came online; daemon log:\n{}", daemon.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[test]
fn serve_and_daemon_refuse_unusable_tls_files_with_status_2() {
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("missing.pem").display().to_string();
    let db = dir.path().join("t.db").display().to_string();
    let port = support::free_port().to_string();
    let listen = format!("127.0.0.1:{port}");
    let output = support::tether_cmd(
        &["serve"],
        &[
            ("TETHER_HTTP__LISTEN", &listen),
            ("TETHER_HTTP__TLS_CERT_PATH", &missing),
            ("TETHER_HTTP__TLS_KEY_PATH", &missing),
            ("TETHER_DATABASE__SQLITE_PATH", &db),
        ],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("certificate file") && stderr.contains("missing.pem"), "{stderr}");

    let state = dir.path().join("state").display().to_string();
    let output = support::tether_cmd(
        &[
            "daemon",
            "--server",
            "https://127.0.0.1:1",
            "--token",
            "tth_x",
            "--ca-file",
            &missing,
            "--state-dir",
            &state,
        ],
        &[],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("CA file") && stderr.contains("missing.pem"), "{stderr}");
}
