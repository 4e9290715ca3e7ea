//! What the benchmark examples share (`relay_bench`, `cluster_bench`,
//! `output_bench`, `scale_bench`): real `tether` processes started from the
//! same target dir and tied to the benchmark's life, the REST calls and
//! viewer sockets they need, and the arithmetic of their figures; fake
//! daemons in [`fleet`] and PostgreSQL helpers in [`pg`].
//!
//! Each example includes it with `mod support;`.

// Each example uses a different part of it.
#![allow(dead_code)]

pub mod fleet;
pub mod pg;

use std::net::{IpAddr, Ipv4Addr};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use actix_http::ws;
use futures_util::StreamExt;
use serde_json::{json, Value};

// ------------------------------------------------------------------ processes

/// A child killed (SIGKILL) and reaped when dropped; it also dies with us.
pub struct Guard(pub Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The child gets SIGKILL when this process dies, however it dies.
pub fn tie_to_parent(cmd: &mut Command) {
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
}

/// A binary of the same build as this example: `tether`, or
/// `examples/<name>` for another example.
pub fn target_dir_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    // target/<profile>/examples/<this example> -> target/<profile>/<name>
    exe.parent().and_then(|p| p.parent()).map(|p| p.join(name)).expect("target dir")
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("port")
}

/// `tether` with `env` and none of our own `TETHER_*` variables, in `dir`
/// (where an embedded SQLite database goes), logging warnings only.
pub fn tether_command(env: &[(String, String)], dir: &Path) -> Command {
    let mut cmd = Command::new(target_dir_binary("tether"));
    for (key, _) in std::env::vars().filter(|(k, _)| k.starts_with("TETHER_")) {
        cmd.env_remove(key);
    }
    cmd.envs(env.iter().map(|(k, v)| (k, v))).env("RUST_LOG", "warn").current_dir(dir);
    tie_to_parent(&mut cmd);
    cmd
}

/// The fields of `/proc/{pid}/stat` after the command name (the first is
/// the state); empty when the process is gone.
fn stat_fields(pid: u32) -> Vec<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(") ").map_or("", |(_, rest)| rest);
    after.split_whitespace().map(|f| f.parse::<u64>().unwrap_or(0)).collect()
}

/// Nanoseconds on a CPU of a process's live threads (the first field of
/// each `/proc/{pid}/task/*/schedstat`): finer than [`cpu_ticks`], for
/// spans of a few milliseconds; threads that ended are not counted.
pub fn cpu_ns(pid: u32) -> u64 {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten();
    tasks
        .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
        .filter_map(|stat| stat.split_whitespace().next().and_then(|ns| ns.parse::<u64>().ok()))
        .sum()
}

/// utime + stime of a process (all its threads), in clock ticks.
pub fn cpu_ticks(pid: u32) -> u64 {
    let fields = stat_fields(pid);
    let get = |i: usize| fields.get(i).copied().unwrap_or(0);
    get(11) + get(12)
}

/// CPU ticks of a process tree one level deep: `parent` itself, the
/// children it has reaped (cutime + cstime), and its live children. It
/// only grows, as children come and go.
pub fn family_cpu_ticks(parent: u32) -> u64 {
    let fields = stat_fields(parent);
    let get = |i: usize| fields.get(i).copied().unwrap_or(0);
    let mut ticks = get(11) + get(12) + get(13) + get(14);
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        if stat_fields(pid).get(1) == Some(&u64::from(parent)) {
            ticks += cpu_ticks(pid);
        }
    }
    ticks
}

/// Raises this process's soft open-file limit to its hard limit (children
/// inherit it); answers the new limit.
pub fn raise_nofile() -> u64 {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit only read and write the struct we pass.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
        }
    }
    limit.rlim_cur
}

/// Clock ticks per second, for [`cpu_ticks`].
pub fn ticks_per_second() -> f64 {
    // SAFETY: sysconf reads a constant and touches no memory of ours.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as f64
    } else {
        100.0
    }
}

/// A line of `/proc/PID/status` in KiB (`VmRSS`, `VmHWM`), 0 when absent.
pub fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Resets a process's peak RSS (`VmHWM`) to its current RSS, so the next
/// reading is the peak of what follows.
pub fn reset_peak_rss(pid: u32) {
    let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
}

// ------------------------------------------------------------------ tether

/// One `tether serve`.
pub struct Instance {
    pub name: &'static str,
    pub listen: String,
    pub child: Option<Guard>,
}

impl Instance {
    pub fn base(&self) -> String {
        format!("http://{}", self.listen)
    }
    pub fn ws(&self) -> String {
        format!("ws://{}", self.listen)
    }
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, |g| g.0.id())
    }
}

/// Starts `tether serve` with `env` in `dir` (logging to
/// `serve-NAME.log` there) and waits until it is ready.
pub async fn start_instance(name: &'static str, env: &[(String, String)], dir: &Path) -> Instance {
    start_instance_on(name, format!("127.0.0.1:{}", free_port()), env, dir).await
}

/// [`start_instance`] on a given `listen` address (a restart on the
/// address of an instance that died).
pub async fn start_instance_on(name: &'static str, listen: String, env: &[(String, String)], dir: &Path) -> Instance {
    let log = std::fs::File::create(dir.join(format!("serve-{name}.log"))).expect("log file");
    let mut env = env.to_vec();
    env.push(("TETHER_HTTP__LISTEN".into(), listen.clone()));
    let mut cmd = tether_command(&env, dir);
    cmd.arg("serve").stdin(Stdio::null()).stdout(log.try_clone().expect("log")).stderr(log);
    let mut child = Guard(cmd.spawn().expect("spawn tether serve"));
    let began = Instant::now();
    let client = awc::Client::default();
    loop {
        if let Ok(Some(status)) = child.0.try_wait() {
            panic!("tether serve {name} exited with {status}; see {}/serve-{name}.log", dir.display());
        }
        if let Ok(res) = client.get(format!("http://{listen}/readyz")).send().await {
            if res.status() == 200 {
                break;
            }
        }
        assert!(began.elapsed() < Duration::from_secs(60), "instance {name} not ready after 60 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Instance { name, listen, child: Some(child) }
}

/// A new full token of user `bench`, made on the database `env` names.
pub fn create_token(env: &[(String, String)], dir: &Path) -> String {
    let mut token_cmd = tether_command(env, dir);
    token_cmd.args(["token", "create", "--user", "bench"]);
    let out = token_cmd.output().expect("token create");
    assert!(out.status.success(), "token create: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Starts a real `tether daemon` dialing `server` (state and `daemon.log` in
/// `dir`, terminals allowed in /tmp).
pub fn start_daemon(server: &str, token: &str, dir: &Path, rust_log: &str) -> Guard {
    let mut daemon_cmd = tether_command(&[], dir);
    daemon_cmd
        .args(["daemon", "--server", server, "--token", token, "--allow-dir", "/tmp"])
        .arg("--state-dir")
        .arg(dir.join("state"))
        .env("RUST_LOG", rust_log)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("daemon.log")).expect("daemon log"));
    Guard(daemon_cmd.spawn().expect("spawn daemon"))
}

/// The id of the first online host, once there is one.
pub async fn online_host(base: &str, token: &str) -> String {
    let began = Instant::now();
    loop {
        let hosts = api("GET", &format!("{base}/api/v1/hosts"), token, None).await;
        if let Some(h) = hosts["hosts"].as_array().and_then(|h| h.iter().find(|h| h["state"] == "online")) {
            return h["id"].as_str().expect("id").to_string();
        }
        assert!(began.elapsed() < Duration::from_secs(60), "no host online after 60 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One `tether serve` on embedded SQLite and one real daemon, in a temp dir.
pub struct Single {
    pub instance: Instance,
    pub daemon: Guard,
    pub token: String,
    pub host: String,
    pub dir: tempfile::TempDir,
}

impl Single {
    pub async fn start() -> Single {
        let dir = tempfile::Builder::new().prefix("tether-bench-").tempdir().expect("temp dir");
        let instance = start_instance("single", &[], dir.path()).await;
        let token = create_token(&[], dir.path());
        let daemon = start_daemon(&instance.base(), &token, dir.path(), "warn");
        let host = online_host(&instance.base(), &token).await;
        Single { instance, daemon, token, host, dir }
    }

    pub fn daemon_pid(&self) -> u32 {
        self.daemon.0.id()
    }
}

// ------------------------------------------------------------------ REST and viewers

thread_local! {
    /// One client per thread, so REST calls reuse their connections.
    static REST: awc::Client = awc::Client::builder().timeout(Duration::from_secs(30)).finish();
}

pub async fn api(method: &str, url: &str, token: &str, body: Option<Value>) -> Value {
    let client = REST.with(awc::Client::clone);
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
    res.json::<Value>().limit(64 * 1024 * 1024).await.unwrap_or(Value::Null)
}

/// Starts `argv` in /tmp on `host` and waits until it is running.
pub async fn new_terminal(base: &str, token: &str, host: &str, argv: Value) -> String {
    let body = json!({"hostId": host, "argv": argv, "dir": "/tmp"});
    let t = api("POST", &format!("{base}/api/v1/terminals"), token, Some(body)).await;
    let id = t["terminal"]["id"].as_str().unwrap_or_else(|| panic!("create terminal: {t}")).to_string();
    let began = Instant::now();
    loop {
        let t = api("GET", &format!("{base}/api/v1/terminals/{id}"), token, None).await;
        if t["terminal"]["state"] == "running" {
            return id;
        }
        assert!(began.elapsed() < Duration::from_secs(30), "terminal {id} not running: {t}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

pub async fn kill_terminal(base: &str, token: &str, id: &str) {
    api("POST", &format!("{base}/api/v1/terminals/{id}/kill"), token, Some(json!({"signal": 9}))).await;
}

/// A counter of `/metrics` (its first series), 0 when absent.
pub async fn metric(base: &str, name: &str) -> u64 {
    let client = awc::Client::builder().timeout(Duration::from_secs(30)).finish();
    let Ok(mut res) = client.get(format!("{base}/metrics")).send().await else { return 0 };
    let body = res.body().limit(16 << 20).await.unwrap_or_default();
    String::from_utf8_lossy(&body)
        .lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// Source address `i` of block `block`: 127.BLOCK.x.y, `per_address`
/// consecutive sockets on each, so no address runs out of ephemeral ports
/// nor past the server's `http.ws_per_address`.
pub fn source_address(block: u8, i: usize, per_address: usize) -> IpAddr {
    let n = i / per_address;
    IpAddr::V4(Ipv4Addr::new(127, block, (n / 250) as u8, (n % 250 + 1) as u8))
}

/// A client whose connections leave from `ip` (bind before connect), one
/// connection per request.
pub fn bound_client(ip: IpAddr) -> awc::Client {
    let connector = awc::Connector::new().local_address(ip).limit(0).timeout(Duration::from_secs(30));
    awc::Client::builder().connector(connector).timeout(Duration::from_secs(60)).finish()
}

pub type Framed = actix_codec::Framed<awc::BoxedSocket, ws::Codec>;

/// A WebSocket to `url`, with the tether viewer subprotocol and token when
/// given (a plain socket otherwise).
pub async fn websocket(url: &str, token: Option<&str>) -> Result<Framed, String> {
    websocket_via(&awc::Client::default(), url, token).await
}

/// [`websocket`] through `client` (e.g. a [`bound_client`]).
pub async fn websocket_via(client: &awc::Client, url: &str, token: Option<&str>) -> Result<Framed, String> {
    let mut request = client.ws(url).max_frame_size(8 << 20);
    if let Some(token) = token {
        request = request.header("Authorization", format!("Bearer {token}")).protocols(["tether.v1"]);
    }
    let (_, framed) = request.connect().await.map_err(|e| e.to_string())?;
    Ok(framed)
}

pub async fn viewer(ws_base: &str, token: &str, id: &str, query: &str) -> Result<Framed, String> {
    websocket(&format!("{ws_base}/ws/v1/terminals/{id}{query}"), Some(token)).await
}

pub enum Start {
    /// Live (after a replay) or resumed, at this stream offset.
    At(u64),
    Closed(Option<u16>),
}

/// Reads until `live` or `resume`; binary frames before `live` are the
/// replay snapshot and are dropped.
pub async fn until_live(framed: &mut Framed) -> Start {
    loop {
        match tokio::time::timeout(Duration::from_secs(30), framed.next()).await {
            Ok(Some(Ok(ws::Frame::Text(t)))) => {
                let v: Value = serde_json::from_slice(&t).unwrap_or(Value::Null);
                if v["type"] == "live" || v["type"] == "resume" {
                    return Start::At(v["offset"].as_u64().unwrap_or(0));
                }
            }
            Ok(Some(Ok(ws::Frame::Close(reason)))) => return Start::Closed(reason.map(|r| u16::from(r.code))),
            Ok(Some(Ok(_))) => {}
            Ok(Some(Err(_))) | Ok(None) => return Start::Closed(None),
            Err(_) => panic!("no live/resume within 30 s"),
        }
    }
}

/// Drops what is already buffered, without waiting.
pub fn drain_now(framed: &mut Framed) {
    use futures_util::FutureExt;
    while let Some(Some(Ok(_))) = framed.next().now_or_never() {}
}

/// Drops whatever arrives within 20 ms.
pub async fn drain(framed: &mut Framed) {
    drain_for(framed, Duration::from_millis(20)).await;
}

/// Drops frames until none arrives for `quiet`.
pub async fn drain_for(framed: &mut Framed, quiet: Duration) {
    while let Ok(Some(Ok(_))) = tokio::time::timeout(quiet, framed.next()).await {}
}

// ------------------------------------------------------------------ figures

pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The value after `name` on the command line, or `default`.
pub fn arg<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> T {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default)
}
