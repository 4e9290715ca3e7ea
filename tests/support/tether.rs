//! Real `tether` processes for end-to-end tests.
//!
//! `TetherServer` runs `tether serve` on a free port with its own scratch
//! directory (SQLite file, log), waits for `GET /readyz` to answer 200 and
//! kills the process when dropped. `tether_cmd` runs a one-shot subcommand.
//!
//! With `TETHER_TEST_BACKEND=postgres`, a server started without database
//! settings gets a fresh PostgreSQL database instead of a SQLite file.
//!
//! Children do not inherit the test process's `TETHER_*` variables (such as
//! `TETHER_TEST_DATABASE_URL`): the config loader would read them as settings.
//! They get exactly the variables the test passes.

use std::{
    io::{Read, Write},
    net::TcpStream,
    path::PathBuf,
    process::{Child, Command, ExitStatus, Output, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use super::process;

const TETHER: &str = env!("CARGO_BIN_EXE_tether");

/// How long `start` waits for `/readyz`.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a one-shot subcommand may run.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// A running `tether serve`, killed on drop.
pub struct TetherServer {
    child: Child,
    listen: String,
    log_path: PathBuf,
    /// The database settings the server got, so `run` can reach the same store.
    database_env: Vec<(String, String)>,
    // Last field: dropped after the child is killed.
    scratch: tempfile::TempDir,
}

impl TetherServer {
    /// Starts `tether serve <args>` with `env` on top of:
    /// `TETHER_HTTP__LISTEN=127.0.0.1:<free port>` (unless `env` sets it) and
    /// `TETHER_DATABASE__SQLITE_PATH=<scratch>/tether.db` (unless `env` sets
    /// `TETHER_DATABASE__URL` or `TETHER_DATABASE__SQLITE_PATH`).
    ///
    /// Panics with the server's log if it exits early or `/readyz` does not
    /// answer 200 within 30 s.
    pub async fn start(env: &[(&str, &str)], args: &[&str]) -> TetherServer {
        Self::launch(env, args, "/readyz").await
    }

    /// Like [`TetherServer::start`] but waits only for `/healthz` (the
    /// process is up), for tests of a server that must not become ready.
    pub async fn start_unready(env: &[(&str, &str)], args: &[&str]) -> TetherServer {
        Self::launch(env, args, "/healthz").await
    }

    async fn launch(env: &[(&str, &str)], args: &[&str], probe: &'static str) -> TetherServer {
        let scratch =
            tempfile::Builder::new().prefix("tether-serve-").tempdir().expect("create a scratch dir for tether serve");
        let log_path = scratch.path().join("tether.log");
        let lookup = |key: &str| env.iter().find(|(k, _)| *k == key).map(|(_, v)| v.to_string());

        let listen = lookup("TETHER_HTTP__LISTEN").unwrap_or_else(|| format!("127.0.0.1:{}", process::free_port()));
        let mut vars: Vec<(String, String)> =
            vec![("TETHER_HTTP__LISTEN".into(), listen.clone()), ("RUST_BACKTRACE".into(), "1".into())];
        let mut database_env: Vec<(String, String)> = ["TETHER_DATABASE__URL", "TETHER_DATABASE__SQLITE_PATH"]
            .into_iter()
            .filter_map(|key| lookup(key).map(|value| (key.to_string(), value)))
            .collect();
        // TETHER_TEST_BACKEND=postgres (scripts/test's second pass) gives
        // every server that names no database a fresh PostgreSQL one.
        if database_env.is_empty() && std::env::var("TETHER_TEST_BACKEND").as_deref() == Ok("postgres") {
            database_env.push(("TETHER_DATABASE__URL".into(), super::pg_database().await));
        }
        if database_env.is_empty() {
            let sqlite = scratch.path().join("tether.db");
            database_env.push(("TETHER_DATABASE__SQLITE_PATH".into(), sqlite.display().to_string()));
        }
        vars.extend(database_env.iter().cloned());
        // The caller's variables last, so they win.
        vars.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));

        let (out, err) = process::log_file(&log_path);
        let mut command = tether_command(&vars);
        command.arg("serve").args(args).current_dir(scratch.path()).stdin(Stdio::null()).stdout(out).stderr(err);
        let child = process::spawn_tied(command, None).unwrap_or_else(|e| panic!("spawn {TETHER} serve: {e}"));
        let mut server = TetherServer { child, listen, log_path, database_env, scratch };
        server.wait_ready(probe).await;
        server
    }

    async fn wait_ready(&mut self, probe: &'static str) {
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("tether serve exited with {status} before /readyz answered 200; its log:\n{}", self.log());
            }
            let listen = self.listen.clone();
            let status = tokio::task::spawn_blocking(move || http_get_status(&listen, probe)).await.ok().flatten();
            if status == Some(200) {
                return;
            }
            if started.elapsed() > READY_TIMEOUT {
                self.kill();
                panic!(
                    "tether serve on {} not ready after {READY_TIMEOUT:?} (last /readyz status: {status:?}); its log:\n{}",
                    self.listen,
                    self.log()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The HTTP base URL, e.g. `http://127.0.0.1:41234`.
    pub fn url(&self) -> String {
        format!("http://{}", self.listen)
    }

    /// The WebSocket base URL, e.g. `ws://127.0.0.1:41234`.
    pub fn ws_url(&self) -> String {
        format!("ws://{}", self.listen)
    }

    /// The listen address, e.g. `127.0.0.1:41234`.
    pub fn listen_addr(&self) -> &str {
        &self.listen
    }

    /// Everything the server printed so far (stdout and stderr).
    pub fn log(&self) -> String {
        process::read_log(&self.log_path)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The server's scratch directory (SQLite file, log); removed on drop.
    pub fn scratch_dir(&self) -> &std::path::Path {
        self.scratch.path()
    }

    /// SIGKILL, as in a crash; waits for the process to go. Idempotent.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, as in a graceful shutdown; waits up to `timeout`, then
    /// SIGKILLs. Returns the exit status if it stopped by itself.
    pub fn terminate(&mut self, timeout: Duration) -> Option<ExitStatus> {
        if let Ok(Some(status)) = self.child.try_wait() {
            return Some(status);
        }
        self.signal(libc::SIGTERM);
        let status = process::wait_timeout(&mut self.child, timeout);
        if status.is_none() {
            self.kill();
        }
        status
    }

    /// Like `terminate`, but waits without blocking the test's runtime, so
    /// its clients keep running while the server drains.
    pub async fn terminate_async(&mut self, timeout: Duration) -> Option<ExitStatus> {
        if let Ok(Some(status)) = self.child.try_wait() {
            return Some(status);
        }
        self.signal(libc::SIGTERM);
        let deadline = tokio::time::Instant::now() + timeout;
        while tokio::time::Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.kill();
        None
    }

    /// SIGSTOP: the process is frozen and its sockets stay open, as in a
    /// hung instance; `resume` thaws it.
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// SIGCONT after `pause`.
    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) on our own unreaped child.
        unsafe { libc::kill(self.child.id() as libc::pid_t, signal) };
    }

    /// The PostgreSQL URL the server was given, if any.
    pub fn database_url(&self) -> Option<String> {
        self.database_env.iter().find(|(k, _)| k == "TETHER_DATABASE__URL").map(|(_, v)| v.clone())
    }

    /// The exit status if the server has exited (without waiting).
    pub fn try_exit_status(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Runs a one-shot subcommand against this server's database
    /// (e.g. `token create --user bob`), with `env` added.
    pub fn run(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut vars: Vec<(&str, &str)> = self.database_env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        vars.extend_from_slice(env);
        tether_cmd(args, &vars)
    }
}

impl Drop for TetherServer {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            self.keep_log();
        }
    }
}

impl TetherServer {
    /// A failing test's server log outlives the scratch dir: it is copied
    /// to `$TMPDIR/tether-test-logs/` and the path printed, so a failure
    /// that needs the server's side (a race across instances, say) can be
    /// read after the run, in CI too.
    fn keep_log(&self) {
        let dir = std::env::temp_dir().join("tether-test-logs");
        let test = std::thread::current().name().unwrap_or("test").replace("::", "-");
        let kept = dir.join(format!("{test}-{}-{}.log", self.listen.replace(':', "_"), self.child.id()));
        match std::fs::create_dir_all(&dir).and_then(|()| std::fs::copy(&self.log_path, &kept)) {
            Ok(_) => eprintln!("the log of tether serve on {} is kept in {}", self.listen, kept.display()),
            Err(e) => eprintln!("could not keep the log of tether serve on {}: {e}", self.listen),
        }
    }
}

/// Runs `tether <args>` with exactly `env` (no inherited `TETHER_*`
/// variables) and returns its output; panics if it runs over 60 s.
/// Pass `TETHER_DATABASE__URL` or `TETHER_DATABASE__SQLITE_PATH` (absolute)
/// for commands that touch the database.
pub fn tether_cmd(args: &[&str], env: &[(&str, &str)]) -> Output {
    let vars: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let mut command = tether_command(&vars);
    command.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = process::spawn_tied(command, None).unwrap_or_else(|e| panic!("spawn {TETHER} {args:?}: {e}"));
    let pid = child.id();
    // wait_with_output drains both pipes; it runs on a helper thread so the
    // wait can be bounded.
    let (done, finished) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(child.wait_with_output());
    });
    match finished.recv_timeout(COMMAND_TIMEOUT) {
        Ok(output) => output.unwrap_or_else(|e| panic!("wait for tether {args:?}: {e}")),
        Err(_) => {
            // SAFETY: kill(2) on our own child; the helper thread reaps it.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            panic!("tether {args:?} still running after {COMMAND_TIMEOUT:?}; killed it");
        }
    }
}

/// `tether` with the inherited `TETHER_*` variables removed, `HOME` set to
/// [`shell_home`] and `vars` set (they win).
pub fn tether_command(vars: &[(String, String)]) -> Command {
    let mut command = Command::new(TETHER);
    for (key, _) in std::env::vars_os() {
        if key.to_str().is_some_and(|k| k.starts_with("TETHER_")) {
            command.env_remove(&key);
        }
    }
    command.env("HOME", shell_home());
    command.envs(vars.iter().map(|(k, v)| (k, v)));
    command
}

/// The `HOME` of every tether process the harness starts, and so of the
/// shells its daemons start: an empty directory, so that a login shell
/// reads none of the machine user's dotfiles. Those are not the project's
/// and can stall a shell: pyenv's `rehash` in `~/.bashrc` takes a lock
/// file, and a shell killed while it holds it (a test that kills a fresh
/// shell) leaves the file behind, after which every later shell waits 60 s
/// for it.
fn shell_home() -> PathBuf {
    let home = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("home");
    std::fs::create_dir_all(&home).unwrap_or_else(|e| panic!("create {home:?}: {e}"));
    home
}

/// The status code of `GET path` over HTTP/1.1, or None if the server does
/// not answer within a second. Plain std, so it needs no particular runtime.
fn http_get_status(listen: &str, path: &str) -> Option<u16> {
    let address = listen.parse().ok()?;
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_millis(500)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    stream.set_write_timeout(Some(Duration::from_secs(1))).ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {listen}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    // The status line is all we need.
    while !head.ends_with(b"\r\n") && head.len() < 1024 {
        if stream.read(&mut byte).ok()? == 0 {
            break;
        }
        head.push(byte[0]);
    }
    let line = String::from_utf8_lossy(&head);
    let mut parts = line.split_whitespace();
    parts.next().filter(|version| version.starts_with("HTTP/"))?;
    parts.next()?.parse().ok()
}
