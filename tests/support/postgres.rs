//! PostgreSQL for tests: one shared server, one fresh database per caller.
//!
//! The server is `TETHER_TEST_DATABASE_URL` when set (scripts/test starts one
//! for the whole run), else an ephemeral postmaster started lazily once per
//! test process: `initdb` into a scratch directory, then `postgres` run
//! directly (not `pg_ctl`, which daemonizes and so escapes the parent-death
//! signal). As root both run as the `postgres` user.
//!
//! Starting the server is synchronous (std::process), so it works from any
//! number of tests on any number of runtimes. Only `CREATE DATABASE` is
//! async, on a connection that is opened and closed inside the call: no
//! driver task is left behind in a runtime that a test is about to drop.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::OnceLock,
    time::{Duration, Instant},
};

use super::process::{self, StartError};

const SERVER_ENV: &str = "TETHER_TEST_DATABASE_URL";

/// A new, empty database on the shared test server, as a postgres URL.
///
/// Each call creates a database with a random name; nothing is dropped
/// afterwards (the server is thrown away with the test run).
pub async fn pg_database() -> String {
    let server_url = match std::env::var(SERVER_ENV) {
        Ok(url) if !url.trim().is_empty() => url,
        _ => ephemeral_server_url(),
    };
    let name = format!("tether_test_{:016x}", rand::random::<u64>());
    create_database(&server_url, &name).await;
    url_with_database(&server_url, &name)
}

async fn create_database(server_url: &str, name: &str) {
    let connect = tokio_postgres::connect(server_url, tokio_postgres::NoTls);
    let (client, connection) = tokio::time::timeout(Duration::from_secs(30), connect)
        .await
        .unwrap_or_else(|_| panic!("connecting to test PostgreSQL at {server_url} timed out after 30 s"))
        .unwrap_or_else(|e| panic!("connect to test PostgreSQL at {server_url}: {e}"));
    let mut connection = std::pin::pin!(connection);
    let statement = format!("CREATE DATABASE {name}");
    let create = client.batch_execute(&statement);
    tokio::select! {
        result = create => result.unwrap_or_else(|e| panic!("CREATE DATABASE {name} on {server_url}: {e}")),
        ended = &mut connection => panic!("connection to {server_url} ended during CREATE DATABASE: {ended:?}"),
    }
    // Dropping the client makes the connection send Terminate and finish.
    drop(client);
    let _ = tokio::time::timeout(Duration::from_secs(5), connection).await;
}

/// A client on `url` whose connection runs on the current runtime.
pub async fn pg_connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) =
        tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap_or_else(|e| panic!("connect {url}: {e}"));
    actix_rt::spawn(connection);
    client
}

/// `server_url` with its database (the URL path) replaced by `database`;
/// the query string, if any, is kept.
pub fn url_with_database(server_url: &str, database: &str) -> String {
    let (base, query) = match server_url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (server_url, None),
    };
    let authority_start =
        base.find("://").unwrap_or_else(|| panic!("{SERVER_ENV} must be a postgres:// URL, got {server_url:?}")) + 3;
    let authority_end = base[authority_start..].find('/').map_or(base.len(), |i| authority_start + i);
    let mut url = format!("{}/{database}", &base[..authority_end]);
    if let Some(query) = query {
        url.push('?');
        url.push_str(query);
    }
    url
}

/// The URL of this process's ephemeral server, started on first use.
/// A failed start is remembered, so every test reports the same error
/// instead of each trying again.
fn ephemeral_server_url() -> String {
    static SERVER: OnceLock<Result<String, String>> = OnceLock::new();
    SERVER.get_or_init(start_ephemeral_server).clone().unwrap_or_else(|message| panic!("{message}"))
}

fn start_ephemeral_server() -> Result<String, String> {
    let started = Instant::now();
    let bin = postgres_bin_dir();
    let run_as = process::postgres_user_if_root();
    let dir = process::scratch_dir("pg", run_as);
    let data = dir.join("data");
    let log = dir.join("postgres.log");

    initdb(&bin, &dir, &data, &log, run_as)?;

    let mut last_error = String::new();
    for _attempt in 0..3 {
        let port = process::free_port();
        match start_postmaster(&bin, &dir, &data, &log, port, run_as) {
            Ok(child) => {
                // SIGQUIT: immediate shutdown; the data directory is thrown away.
                process::stop_at_exit(child, libc::SIGQUIT);
                eprintln!(
                    "tests/support: PostgreSQL on 127.0.0.1:{port} ready in {:.1?} (data in {})",
                    started.elapsed(),
                    dir.display()
                );
                return Ok(format!("postgres://postgres@127.0.0.1:{port}/postgres"));
            }
            Err(StartError::PortTaken(message)) => last_error = message,
            Err(StartError::Failed(message)) => return Err(message),
        }
    }
    Err(last_error)
}

/// `initdb` of a new cluster in `data`, its output in `log`.
fn initdb(bin: &Path, dir: &Path, data: &Path, log: &Path, run_as: Option<process::RunAs>) -> Result<(), String> {
    let (out, err) = process::log_file(log);
    let mut initdb = Command::new(bin.join("initdb"));
    initdb
        .arg("-D")
        .arg(data)
        .args(["-A", "trust", "--no-sync", "-U", "postgres", "-E", "UTF8", "--locale=C"])
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    let mut child =
        process::spawn_tied(initdb, run_as).map_err(|e| format!("spawn {}: {e}", bin.join("initdb").display()))?;
    match process::wait_timeout(&mut child, Duration::from_secs(60)) {
        Some(status) if status.success() => Ok(()),
        outcome => {
            let _ = child.kill();
            Err(format!("initdb failed ({outcome:?}); its output:\n{}", process::read_log(log)))
        }
    }
}

fn start_postmaster(
    bin: &Path,
    dir: &Path,
    data: &Path,
    log: &Path,
    port: u16,
    run_as: Option<process::RunAs>,
) -> Result<Child, StartError> {
    let (out, err) = process::log_file(log);
    let mut postgres = Command::new(bin.join("postgres"));
    postgres
        .arg("-D")
        .arg(data)
        .arg("-k")
        .arg(dir)
        .args(["-p", &port.to_string()])
        .args(["-c", "listen_addresses=127.0.0.1"])
        .args(["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"])
        // Many tether instances with their pools may share one server.
        .args(["-c", "max_connections=300", "-c", "shared_buffers=32MB"])
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    let mut child = process::spawn_tied(postgres, run_as)
        .map_err(|e| StartError::Failed(format!("spawn {}: {e}", bin.join("postgres").display())))?;
    let pid_file = data.join("postmaster.pid");
    let ready = process::wait_until_ready("postgres", &mut child, log, Duration::from_secs(60), || {
        postmaster_ready(&pid_file, port)
    });
    match ready {
        Ok(()) => Ok(child),
        Err(error) => {
            let _ = child.kill();
            let _ = child.wait();
            Err(error)
        }
    }
}

/// What `pg_ctl -w` checks: postmaster.pid names our port and says "ready".
fn postmaster_ready(pid_file: &Path, port: u16) -> bool {
    let Ok(contents) = fs::read_to_string(pid_file) else {
        return false;
    };
    let lines: Vec<&str> = contents.lines().collect();
    lines.get(3).is_some_and(|p| p.trim() == port.to_string())
        && lines.get(7).is_some_and(|status| status.trim() == "ready")
}

/// The directory holding `initdb` and `postgres`: where an `initdb` in PATH
/// really lives, else the newest /usr/lib/postgresql/<version>/bin (Debian
/// keeps the server binaries out of PATH).
fn postgres_bin_dir() -> PathBuf {
    let has_server =
        |dir: &Path| process::is_executable(&dir.join("initdb")) && process::is_executable(&dir.join("postgres"));
    if let Some(initdb) = process::find_in_path("initdb") {
        if let Some(dir) = fs::canonicalize(&initdb).ok().and_then(|p| p.parent().map(Path::to_path_buf)) {
            if has_server(&dir) {
                return dir;
            }
        }
    }
    let newest = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version: f64 = entry.file_name().to_str()?.parse().ok()?;
            let dir = entry.path().join("bin");
            has_server(&dir).then_some((version, dir))
        })
        .max_by(|a, b| a.0.total_cmp(&b.0));
    match newest {
        Some((_, dir)) => dir,
        None => panic!(
            "PostgreSQL server binaries (initdb, postgres) not found in PATH or \
             /usr/lib/postgresql/*/bin: install the Debian package `postgresql` \
             (apt-get install -y postgresql), or set {SERVER_ENV} to a running server"
        ),
    }
}

/// A PostgreSQL server of one test's own, which the test may stop (as an
/// operator's `pg_ctl stop -m fast` does: every connection is ended and the
/// port is closed) and start again on the same port with its data kept.
pub struct OwnPostgres {
    bin: PathBuf,
    dir: PathBuf,
    data: PathBuf,
    log: PathBuf,
    port: u16,
    run_as: Option<process::RunAs>,
    child: Option<Child>,
}

impl OwnPostgres {
    pub fn start() -> OwnPostgres {
        let bin = postgres_bin_dir();
        let run_as = process::postgres_user_if_root();
        let dir = process::scratch_dir("own-pg", run_as);
        let data = dir.join("data");
        let log = dir.join("postgres.log");
        initdb(&bin, &dir, &data, &log, run_as).unwrap_or_else(|message| panic!("{message}"));
        for _attempt in 0..3 {
            let port = process::free_port();
            match start_postmaster(&bin, &dir, &data, &log, port, run_as) {
                Ok(child) => return OwnPostgres { bin, dir, data, log, port, run_as, child: Some(child) },
                Err(StartError::PortTaken(_)) => continue,
                Err(StartError::Failed(message)) => panic!("{message}"),
            }
        }
        panic!("no free port for an own PostgreSQL");
    }

    /// A new, empty database on this server, as a postgres URL.
    pub async fn database(&self) -> String {
        let server_url = format!("postgres://postgres@127.0.0.1:{}/postgres", self.port);
        let name = format!("tether_test_{:016x}", rand::random::<u64>());
        create_database(&server_url, &name).await;
        url_with_database(&server_url, &name)
    }

    /// Fast shutdown (SIGINT to the postmaster): open sessions are ended,
    /// and this returns once the server has exited and its port refuses
    /// connections.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        // SAFETY: kill(2) on our own unreaped child.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
        if process::wait_timeout(&mut child, Duration::from_secs(30)).is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let address = std::net::SocketAddr::from(([127, 0, 0, 1], self.port));
        assert!(
            std::net::TcpStream::connect_timeout(&address, Duration::from_millis(500)).is_err(),
            "PostgreSQL still accepts connections on {address} after it stopped"
        );
    }

    /// Starts the server again, on the same port and data directory.
    pub fn start_again(&mut self) {
        self.stop();
        let child = start_postmaster(&self.bin, &self.dir, &self.data, &self.log, self.port, self.run_as)
            .unwrap_or_else(|e| match e {
                StartError::PortTaken(m) | StartError::Failed(m) => panic!("restart PostgreSQL: {m}"),
            });
        self.child = Some(child);
    }

    /// Freezes the server (SIGSTOP to the postmaster and its backends), as
    /// a host that hangs does: connections stay open and nothing answers.
    pub fn pause(&self) {
        self.signal_all(libc::SIGSTOP);
    }

    /// Undoes [`OwnPostgres::pause`].
    pub fn resume(&self) {
        self.signal_all(libc::SIGCONT);
    }

    /// Sends `signal` to the postmaster and every process it started.
    fn signal_all(&self, signal: i32) {
        let Some(child) = &self.child else { return };
        let postmaster = child.id() as libc::pid_t;
        let mut pids = vec![postmaster];
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<libc::pid_t>() else { continue };
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            // The parent pid is the second field after the command's closing parenthesis.
            let parent = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse().ok());
            if parent == Some(postmaster) {
                pids.push(pid);
            }
        }
        for pid in pids {
            // SAFETY: kill(2) on the test's own server processes.
            unsafe { libc::kill(pid, signal) };
        }
    }

    /// The server's log.
    pub fn log(&self) -> String {
        process::read_log(&self.log)
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        // A test that failed while the server was paused.
        self.resume();
        if let Some(mut child) = self.child.take() {
            // SIGQUIT: immediate shutdown, backends included; the data is thrown away.
            // SAFETY: kill(2) on our own unreaped child.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGQUIT) };
            if process::wait_timeout(&mut child, Duration::from_secs(5)).is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}
