//! The command-line contract of `tether` (docs/ARCHITECTURE.md, "Processes and roles"), tested against the real
//! binary:
//!
//! - every subcommand answers `--help` with status 0 and lists its flags
//!   (`--config` everywhere);
//! - usage errors (unknown subcommand, missing or bad arguments, a
//!   `daemon --server` that is not an http(s) URL) exit 2;
//! - configuration errors (environment `TETHER_<SECTION>__<KEY>`, a
//!   `--config` file with an unknown key, a missing `--config` file) exit 2
//!   with a message naming the key;
//! - `token create --user NAME` prints the token alone on stdout, on SQLite
//!   and on PostgreSQL, and stores only its SHA-256;
//! - `migrate` is idempotent and refuses (exit 1) a database whose schema is
//!   newer than the binary, as does `serve`;
//! - the README run path: `tether serve --listen ADDR` in an empty directory
//!   with no database settings serves `/healthz`, says where it listens and
//!   creates `./tether.db`; settings also come from a `--config` file;
//! - on PostgreSQL, `serve` is ready and `GET /api/v1/instance` describes the
//!   instance (`<cellId>#<6 hex>`, role, `cell.id`);
//! - `serve --role director` without `cluster.secret` exits 2 naming it; a taken port exits 1;
//! - `cell set` prints the switch and bumps its generation on every write,
//!   refusing bad values with exit 2 and a message; `cell budget` prints the
//!   worked example of docs/CELLS.md (300 connections, 280 with 2 slots).
//!
//! Every child runs with the test process's `TETHER_*` variables removed
//! (the config loader would read them as settings), and anything that may
//! touch the default `./tether.db` runs in an empty temporary directory, so
//! the repository is never written to. Every wait is bounded.

mod support;

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    os::unix::process::CommandExt,
    path::Path,
    process::{Child, Command, ExitStatus, Stdio},
    sync::{Arc, Mutex},
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use serde_json::Value;
use sha2::{Digest, Sha256};
use support::{tether_cmd, TetherServer};

const TETHER: &str = env!("CARGO_BIN_EXE_tether");

/// How long a one-shot command that should fail fast may run.
const QUICK: Duration = Duration::from_secs(30);
/// How long `serve` may take to answer its first request.
const START: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------
// Children

/// A `tether` child started by this file, killed when dropped (also on a
/// panic), with its stdout and stderr collected as they arrive.
struct Tether {
    child: Child,
    what: String,
    stdout: Arc<Mutex<Vec<u8>>>,
    stderr: Arc<Mutex<Vec<u8>>>,
    readers: Vec<thread::JoinHandle<()>>,
}

/// How a one-shot command ended.
struct Finished {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl Finished {
    fn code(&self) -> Option<i32> {
        self.status.code()
    }

    fn describe(&self) -> String {
        format!("status {}\n--- stdout ---\n{}\n--- stderr ---\n{}", self.status, self.stdout, self.stderr)
    }
}

impl Tether {
    /// Starts `tether <args>` in `cwd` with the inherited `TETHER_*`
    /// variables removed and `env` set.
    fn spawn(cwd: &Path, args: &[&str], env: &[(&str, &str)]) -> Tether {
        let mut command = Command::new(TETHER);
        for (key, _) in std::env::vars_os() {
            if key.to_str().is_some_and(|k| k.starts_with("TETHER_")) {
                command.env_remove(&key);
            }
        }
        command
            .envs(env.iter().copied())
            .args(args)
            .current_dir(cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: prctl is async-signal-safe. The child dies with the test
        // thread even if the test process is SIGKILLed (no Drop runs then).
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let what = format!("tether {}", args.join(" "));
        let mut child = command.spawn().unwrap_or_else(|e| panic!("spawn {what}: {e}"));
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let readers = vec![
            collect(child.stdout.take().expect("piped stdout"), stdout.clone()),
            collect(child.stderr.take().expect("piped stderr"), stderr.clone()),
        ];
        Tether { child, what, stdout, stderr, readers }
    }

    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.stdout.lock().unwrap()).into_owned()
    }

    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap()).into_owned()
    }

    fn output(&self) -> String {
        format!("--- stdout ---\n{}\n--- stderr ---\n{}", self.stdout(), self.stderr())
    }

    /// The exit status if the child has exited.
    fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Waits up to `timeout` for the child to exit; panics (after killing
    /// it) if it does not.
    fn wait(mut self, timeout: Duration) -> Finished {
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(status) = self.exited() {
                break status;
            }
            if Instant::now() >= deadline {
                self.kill();
                panic!("{} still running after {timeout:?}; killed it\n{}", self.what, self.output());
            }
            thread::sleep(Duration::from_millis(20));
        };
        // The pipes close with the process; the readers then finish.
        for reader in self.readers.drain(..) {
            let _ = reader.join();
        }
        Finished { status, stdout: self.stdout(), stderr: self.stderr() }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Polls `GET path` until it answers 200; panics with the output if
    /// the child exits first or `START` passes.
    fn wait_for_200(&mut self, listen: &str, path: &str) -> String {
        let deadline = Instant::now() + START;
        loop {
            if let Some(status) = self.exited() {
                panic!("{} exited with {status} before GET {path} answered 200\n{}", self.what, self.output());
            }
            let answer = http_get(listen, path, &[]);
            if let Some((200, body)) = answer {
                return body;
            }
            if Instant::now() >= deadline {
                panic!("{}: GET {path} not 200 after {START:?} (last answer {answer:?})\n{}", self.what, self.output());
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Polls the collected stdout until a line contains `needle`.
    fn wait_for_stdout_line(&mut self, needle: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(line) = self.stdout().lines().find(|l| l.contains(needle)) {
                return line.to_string();
            }
            if Instant::now() >= deadline {
                panic!("{}: no stdout line containing {needle:?} after {timeout:?}\n{}", self.what, self.output());
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Tether {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Copies a pipe into `sink` until it closes.
fn collect(mut pipe: impl Read + Send + 'static, sink: Arc<Mutex<Vec<u8>>>) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let mut chunk = [0u8; 4096];
        while let Ok(n) = pipe.read(&mut chunk) {
            if n == 0 {
                break;
            }
            sink.lock().unwrap().extend_from_slice(&chunk[..n]);
        }
    })
}

/// Runs `tether <args>` to completion in a new empty directory.
fn run_in_empty_dir(args: &[&str], env: &[(&str, &str)]) -> Finished {
    let dir = tempdir();
    let finished = Tether::spawn(dir.path(), args, env).wait(QUICK);
    assert!(
        !dir.path().join("tether.db").exists(),
        "tether {args:?} created ./tether.db although it should have stopped before opening a database\n{}",
        finished.describe()
    );
    finished
}

fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("tether-cli-").tempdir().expect("create a temp dir")
}

fn free_listen() -> String {
    format!("127.0.0.1:{}", support::free_port())
}

// ---------------------------------------------------------------------------
// HTTP

/// `GET path` over HTTP/1.1 with `Connection: close`: (status, body), or
/// None if nothing answers within a couple of seconds.
fn http_get(listen: &str, path: &str, headers: &[(&str, &str)]) -> Option<(u16, String)> {
    let address = listen.parse().ok()?;
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_millis(500)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream.set_write_timeout(Some(Duration::from_secs(2))).ok()?;
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: {listen}\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).ok()?;
    let split = response.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&response[..split]).into_owned();
    let raw_body = &response[split + 4..];
    let status = head.lines().next()?.split_whitespace().nth(1)?.parse().ok()?;
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let body = if chunked { dechunk(raw_body)? } else { raw_body.to_vec() };
    Some((status, String::from_utf8_lossy(&body).into_owned()))
}

fn dechunk(mut raw: &[u8]) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = raw.windows(2).position(|w| w == b"\r\n")?;
        let size_text = String::from_utf8_lossy(&raw[..line_end]);
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        raw = &raw[line_end + 2..];
        if size == 0 {
            return Some(body);
        }
        body.extend_from_slice(raw.get(..size)?);
        raw = raw.get(size + 2..)?;
    }
}

fn get_json(listen: &str, path: &str, headers: &[(&str, &str)]) -> (u16, Value) {
    let (status, body) = http_get(listen, path, headers).unwrap_or_else(|| panic!("GET {path} on {listen}: no answer"));
    let value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: body is not JSON ({e}): {body:?}"));
    (status, value)
}

// ---------------------------------------------------------------------------
// Checks

fn is_token(text: &str) -> bool {
    text.strip_prefix("tth_")
        .is_some_and(|rest| rest.len() == 43 && rest.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'))
}

fn sha256_hex(text: &str) -> String {
    Sha256::digest(text.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// `<cell_id>#<6 lowercase hex>`.
fn is_instance_id(id: &str, cell_id: &str) -> bool {
    id.strip_prefix(cell_id).and_then(|rest| rest.strip_prefix('#')).is_some_and(|suffix| {
        suffix.len() == 6 && suffix.chars().all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
    })
}

/// The N of "N migration(s) applied" in `migrate`'s report.
fn migrations_applied(stderr: &str) -> Option<u64> {
    let at = stderr.find(" migration")?;
    let digits: String =
        stderr[..at].chars().rev().take_while(char::is_ascii_digit).collect::<Vec<_>>().into_iter().rev().collect();
    digits.parse().ok()
}

/// Asserts a usage or configuration error: status 2, nothing on stdout,
/// a message on stderr.
fn assert_status_2(finished: &Finished, what: &str) {
    assert_eq!(finished.code(), Some(2), "{what}: expected exit status 2\n{}", finished.describe());
    assert!(!finished.stderr.trim().is_empty(), "{what}: exit 2 without a message on stderr\n{}", finished.describe());
}

// ---------------------------------------------------------------------------
// 1. --help

#[test]
fn help_of_every_subcommand_exits_0_and_lists_its_flags() {
    let cases: &[(&[&str], &[&str])] = &[
        (&["--help"], &["--config", "serve", "daemon", "attach", "migrate", "token", "login", "open", "run"]),
        (&["serve", "--help"], &["--listen", "--role", "--demo", "--config"]),
        (&["daemon", "--help"], &["--server", "--token", "--name", "--state-dir", "--config"]),
        (&["attach", "--help"], &["--server", "--token", "--config"]),
        (&["migrate", "--help"], &["--config"]),
        (&["token", "--help"], &["create", "--config"]),
        (&["token", "create", "--help"], &["--user", "--config"]),
        (&["login", "--help"], &["--server", "--token", "0600"]),
        (&["logout", "--help"], &["--config"]),
        (&["hosts", "--help"], &["--server", "--token", "--json", "--quiet"]),
        (&["ls", "--help"], &["[HOST]", "--json", "--quiet"]),
        (&["open", "--help"], &["<HOST>", "--dir", "[ARGV]..."]),
        (&["kill", "--help"], &["<ID>", "--signal"]),
        (&["rm", "--help"], &["<ID>"]),
        (&["run", "--help"], &["<HOST>", "--dir", "--detach", "<ARGV>...", "128+N"]),
        (&["runs", "--help"], &["--json", "--quiet"]),
        (&["logs", "--help"], &["<RUN_ID>", "--follow"]),
        (&["completions", "--help"], &["bash", "zsh", "fish"]),
        (&["cell", "--help"], &["set", "budget", "--config"]),
        (&["cell", "set", "--help"], &["--cell", "--admit-mode", "--dead-man-trip-slots", "--config"]),
        (&["cell", "budget", "--help"], &["--config"]),
    ];
    for (args, flags) in cases {
        let out = tether_cmd(args, &[]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(0),
            "tether {args:?}: expected status 0\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}"
        );
        for flag in *flags {
            assert!(stdout.contains(flag), "tether {args:?} does not mention {flag}:\n{stdout}");
        }
        // Variables are named, never shown with a value (none here).
        assert!(!stdout.contains("=]"), "tether {args:?} shows an empty variable:\n{stdout}");
    }
}

/// The subcommands `tether ARGS --help` lists under "Commands:".
fn subcommands_of(args: &[&str]) -> Vec<String> {
    let mut help_args = args.to_vec();
    help_args.push("--help");
    let out = tether_cmd(&help_args, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    stdout
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .filter(|name| name != "help")
        .collect()
}

/// Every subcommand, nested ones included, has a long help: a description
/// above the usage line, more than the one-line `-h`, and examples.
#[test]
fn every_subcommand_has_long_help_with_examples() {
    let mut pending: Vec<Vec<String>> = subcommands_of(&[]).into_iter().map(|name| vec![name]).collect();
    assert!(pending.len() >= 15, "{pending:?}");
    let mut checked = 0;
    while let Some(path) = pending.pop() {
        let args: Vec<&str> = path.iter().map(String::as_str).collect();
        let long = tether_cmd(&[&args[..], &["--help"]].concat(), &[]);
        let short = tether_cmd(&[&args[..], &["-h"]].concat(), &[]);
        let long = String::from_utf8_lossy(&long.stdout).into_owned();
        let short = String::from_utf8_lossy(&short.stdout).into_owned();
        let description = long.split("Usage:").next().unwrap_or("").trim();
        assert!(!description.is_empty(), "tether {args:?} --help has no description:\n{long}");
        assert!(long.len() > short.len(), "tether {args:?}: --help says no more than -h:\n{long}");
        let examples = long.split("Examples:").nth(1).unwrap_or("");
        assert!(
            examples.lines().any(|l| l.trim_start().starts_with("tether ") || l.contains("| tether ")),
            "tether {args:?} --help has no examples:\n{long}"
        );
        pending.extend(subcommands_of(&args).into_iter().map(|name| [path.clone(), vec![name]].concat()));
        checked += 1;
    }
    assert!(checked >= 16, "{checked} subcommands checked");
}

#[test]
fn serve_help_lists_the_three_roles() {
    let out = tether_cmd(&["serve", "--help"], &[]);
    assert_eq!(out.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&out.stdout);
    for role in ["combined", "cell", "director"] {
        assert!(stdout.contains(role), "serve --help does not name role {role}:\n{stdout}");
    }
}

// ---------------------------------------------------------------------------
// 2. Usage errors

#[test]
fn usage_errors_exit_2() {
    let cases: &[&[&str]] = &[
        &["frobnicate"],
        &[],
        &["token", "create"],
        &["token", "create", "--user", ""],
        &["serve", "--role", "nonsense"],
        &["serve", "--no-such-flag"],
        &["daemon", "--token", "tth_x"],
        &["daemon", "--server", "notaurl", "--token", "tth_x"],
        &["daemon", "--server", "ftp://x", "--token", "tth_x"],
        &["attach", "--server", "http://127.0.0.1:1", "--token", "tth_x"],
    ];
    for args in cases {
        let finished = run_in_empty_dir(args, &[]);
        assert_status_2(&finished, &format!("tether {args:?}"));
        assert!(
            finished.stdout.trim().is_empty(),
            "tether {args:?}: a usage error printed on stdout\n{}",
            finished.describe()
        );
    }
}

/// A `--user` name with a control character is refused, and the message
/// names that rule rather than only the length.
#[test]
fn a_user_name_with_a_control_character_is_refused_saying_why() {
    let finished = run_in_empty_dir(&["token", "create", "--user", "evil\x1b[31mred"], &[]);
    assert_status_2(&finished, "token create --user with ESC");
    assert!(finished.stderr.contains("without control characters"), "{}", finished.describe());
}

#[test]
fn unknown_subcommand_and_bad_role_are_named_in_the_message() {
    let finished = run_in_empty_dir(&["frobnicate"], &[]);
    assert_status_2(&finished, "unknown subcommand");
    assert!(finished.stderr.contains("frobnicate"), "{}", finished.describe());

    let finished = run_in_empty_dir(&["serve", "--role", "nonsense"], &[]);
    assert_status_2(&finished, "serve --role nonsense");
    assert!(finished.stderr.contains("nonsense"), "{}", finished.describe());

    let finished = run_in_empty_dir(&["token", "create"], &[]);
    assert_status_2(&finished, "token create without --user");
    assert!(finished.stderr.contains("--user"), "{}", finished.describe());
}

/// `daemon --server` that is not an http(s) base URL stops at once with
/// exit 2, like the client commands, naming the flag and the value.
#[test]
fn daemon_with_a_bad_server_url_exits_2_naming_it() {
    for server in ["notaurl", "ftp://x", "http://", "http://h?x=1"] {
        let finished = run_in_empty_dir(&["daemon", "--server", server, "--token", "tth_x"], &[]);
        assert_status_2(&finished, &format!("daemon --server {server}"));
        assert!(
            finished.stderr.contains("--server") && finished.stderr.contains(&format!("{server:?}")),
            "daemon --server {server}: the message names neither the flag nor the value\n{}",
            finished.describe()
        );
    }
    let finished = run_in_empty_dir(&["hosts", "--server", "notaurl", "--token", "tth_x"], &[]);
    assert_status_2(&finished, "hosts --server notaurl");
}

/// A first start whose `--allow-dir` is missing or not a directory stops
/// with exit 2 naming it, before dialing anything.
#[test]
fn daemon_with_an_allow_dir_that_is_not_a_directory_exits_2() {
    let dir = tempdir();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "").expect("write");
    for allow in ["/no/such/dir".to_owned(), file.display().to_string()] {
        let state = dir.path().join(format!("state-{}", allow.len()));
        let args = ["daemon", "--server", "http://127.0.0.1:9", "--token", "tth_x", "--allow-dir", &allow];
        let finished = run_in_empty_dir(&[&args[..], &["--state-dir", state.to_str().unwrap()]].concat(), &[]);
        assert_status_2(&finished, &format!("daemon --allow-dir {allow}"));
        assert!(finished.stderr.contains(&allow), "the message does not name {allow}\n{}", finished.describe());
    }
}

// ---------------------------------------------------------------------------
// 3. Configuration errors

#[test]
fn lease_renew_not_below_ttl_is_refused_naming_the_key() {
    let listen = free_listen();
    for renew in ["40000", "30000"] {
        let finished = run_in_empty_dir(&["serve", "--listen", &listen], &[("TETHER_LEASE__RENEW_MS", renew)]);
        assert_status_2(&finished, &format!("TETHER_LEASE__RENEW_MS={renew}"));
        assert!(
            finished.stderr.contains("lease.renew_ms"),
            "the message does not name lease.renew_ms\n{}",
            finished.describe()
        );
    }
}

#[test]
fn bad_listen_address_is_refused_naming_the_key() {
    let finished = run_in_empty_dir(&["serve"], &[("TETHER_HTTP__LISTEN", "nowhere")]);
    assert_status_2(&finished, "TETHER_HTTP__LISTEN=nowhere");
    assert!(finished.stderr.contains("http.listen"), "the message does not name http.listen\n{}", finished.describe());

    // The flag is the same setting and is checked the same way.
    let finished = run_in_empty_dir(&["serve", "--listen", "nowhere"], &[]);
    assert_status_2(&finished, "serve --listen nowhere");
    assert!(
        finished.stderr.contains("http.listen") || finished.stderr.contains("--listen"),
        "the message names neither http.listen nor --listen\n{}",
        finished.describe()
    );
}

#[test]
fn bad_value_type_in_environment_is_refused_naming_the_key() {
    let finished = run_in_empty_dir(&["serve", "--listen", &free_listen()], &[("TETHER_LEASE__TTL_MS", "soon")]);
    assert_status_2(&finished, "TETHER_LEASE__TTL_MS=soon");
    assert!(finished.stderr.contains("ttl_ms"), "the message does not name lease.ttl_ms\n{}", finished.describe());
}

#[test]
fn unknown_key_in_config_file_is_refused_naming_it() {
    let dir = tempdir();
    let file = dir.path().join("tether.toml");
    std::fs::write(&file, "[lease]\nttl = 5\n").unwrap();
    let file = file.to_str().unwrap();
    let listen = free_listen();
    // `--config` is accepted before and after the subcommand.
    for args in [vec!["serve", "--listen", &listen, "--config", file], vec!["--config", file, "migrate"]] {
        let finished = run_in_empty_dir(&args, &[]);
        assert_status_2(&finished, &format!("tether {args:?} with [lease] ttl = 5"));
        assert!(
            finished.stderr.contains("`ttl`"),
            "the message does not name the unknown key `ttl`\n{}",
            finished.describe()
        );
    }
}

#[test]
fn missing_config_file_exits_2() {
    for args in [
        vec!["serve", "--config", "/no/such/file"],
        vec!["migrate", "--config", "/no/such/file"],
        vec!["token", "create", "--user", "ann", "--config", "/no/such/file"],
    ] {
        let finished = run_in_empty_dir(&args, &[]);
        assert_status_2(&finished, &format!("tether {args:?}"));
        assert!(
            finished.stderr.contains("/no/such/file"),
            "the message does not name the missing file\n{}",
            finished.describe()
        );
    }
    // TETHER_CONFIG is the same setting, and the message names it.
    let finished = run_in_empty_dir(&["migrate"], &[("TETHER_CONFIG", "/no/such/file")]);
    assert_status_2(&finished, "TETHER_CONFIG=/no/such/file migrate");
    assert!(finished.stderr.contains("TETHER_CONFIG"), "{}", finished.describe());
    assert!(!finished.stderr.contains("--config"), "no --config was given\n{}", finished.describe());
}

// ---------------------------------------------------------------------------
// 4. token create

/// Runs `token create --user <user>` with `db_env` and returns the token,
/// asserting it is printed alone on stdout.
fn create_token(user: &str, db_env: &[(&str, &str)]) -> String {
    let out = tether_cmd(&["token", "create", "--user", user], db_env);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "token create failed\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "stdout must hold exactly one line, the token; got {stdout:?}");
    assert_eq!(stdout, format!("{}\n", lines[0]), "stdout holds more than the token line");
    let token = lines[0].to_string();
    assert!(is_token(&token), "{token:?} does not match ^tth_[A-Za-z0-9_-]{{43}}$");
    assert!(!stderr.contains(&token), "the token also went to stderr (logs):\n{stderr}");
    token
}

#[test]
fn token_create_prints_the_token_alone_on_stdout_sqlite() {
    let dir = tempdir();
    let db = dir.path().join("tokens.db");
    let db_str = db.to_str().unwrap();
    let env = [("TETHER_DATABASE__SQLITE_PATH", db_str)];
    let first = create_token("ann", &env);
    let second = create_token("ann", &env);
    assert_ne!(first, second, "two calls printed the same token");
    // Stderr says which database took it (a relative path run elsewhere
    // would be another file).
    let out = tether_cmd(&["token", "create", "--user", "bob"], &env);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("in embedded SQLite at {db_str}")), "{stderr}");

    // One user, two tokens, stored only as SHA-256.
    let conn = rusqlite::Connection::open(&db).expect("open the SQLite file");
    let users: i64 = conn.query_row("SELECT count(*) FROM users WHERE name = 'ann'", [], |r| r.get(0)).unwrap();
    assert_eq!(users, 1, "token create made a second user `ann`");
    let mut stmt = conn
        .prepare("SELECT token_hash FROM api_tokens WHERE user_id = (SELECT id FROM users WHERE name = 'ann')")
        .unwrap();
    let mut hashes: Vec<String> = stmt.query_map([], |r| r.get(0)).unwrap().map(Result::unwrap).collect();
    hashes.sort();
    let mut expected = vec![sha256_hex(&first), sha256_hex(&second)];
    expected.sort();
    assert_eq!(hashes, expected, "api_tokens must hold exactly the SHA-256 of each token");
}

/// An operator revokes and deletes tokens in the embedded database with
/// the distribution's own `sqlite3` shell, which may be older than the
/// SQLite tether embeds (Debian 12's is 3.40): the schema's triggers, which
/// log every ended token for the sockets to be closed, work there too.
#[test]
fn the_distributions_sqlite3_shell_revokes_and_deletes_tokens() {
    let dir = tempdir();
    let db = dir.path().join("tokens.db");
    let env = [("TETHER_DATABASE__SQLITE_PATH", db.to_str().unwrap())];
    create_token("ann", &env);
    create_token("ann", &env);
    let now_ms = || i64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis()).unwrap();
    let before = now_ms();
    for sql in [
        format!("UPDATE api_tokens SET revoked_at = {before} WHERE rowid = (SELECT min(rowid) FROM api_tokens)"),
        "DELETE FROM api_tokens WHERE revoked_at IS NULL".to_string(),
    ] {
        let out =
            Command::new("sqlite3").arg(&db).arg(&sql).output().expect("the sqlite3 shell (scripts/test installs it)");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && stderr.is_empty(), "sqlite3 {sql:?}: {:?}\n{stderr}", out.status);
    }
    let conn = rusqlite::Connection::open(&db).expect("open the SQLite file");
    let mut stmt = conn.prepare("SELECT ended_at FROM api_token_ends").unwrap();
    let ends: Vec<i64> = stmt.query_map([], |r| r.get(0)).unwrap().map(Result::unwrap).collect();
    assert_eq!(ends.len(), 2, "one logged end per token: {ends:?}");
    let after = now_ms();
    assert!(ends.iter().all(|&at| (before - 1000..=after + 1000).contains(&at)), "{ends:?} not in {before}..{after}");
}

#[actix_rt::test]
async fn token_create_prints_the_token_alone_on_stdout_postgres() {
    let url = support::pg_database().await;
    let env = [("TETHER_DATABASE__URL", url.as_str())];
    let first = create_token("ann", &env);
    let second = create_token("ann", &env);
    assert_ne!(first, second, "two calls printed the same token");
    let out = tether_cmd(&["token", "create", "--user", "bob"], &env);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("in PostgreSQL") && !stderr.contains(&url), "never the URL: {stderr}");
}

// ---------------------------------------------------------------------------
// 5. migrate

#[test]
fn migrate_twice_then_refuse_a_newer_schema() {
    let dir = tempdir();
    let db = dir.path().join("m.db");
    let db_str = db.to_str().unwrap();
    let env = [("TETHER_DATABASE__SQLITE_PATH", db_str)];

    let first = Tether::spawn(dir.path(), &["migrate"], &env).wait(QUICK);
    assert_eq!(first.code(), Some(0), "first migrate\n{}", first.describe());
    let applied = migrations_applied(&first.stderr);
    assert!(
        applied.is_some_and(|n| n > 0),
        "the first migrate on a fresh file should report at least 1 migration applied\n{}",
        first.describe()
    );

    let second = Tether::spawn(dir.path(), &["migrate"], &env).wait(QUICK);
    assert_eq!(second.code(), Some(0), "second migrate\n{}", second.describe());
    assert!(
        second.stderr.contains("0 migration") && migrations_applied(&second.stderr) == Some(0),
        "the second migrate should report 0 migrations applied\n{}",
        second.describe()
    );

    // A database migrated by a newer binary.
    let conn = rusqlite::Connection::open(&db).expect("open the SQLite file");
    conn.execute("INSERT INTO schema_migrations (version, name, applied_at) VALUES (999,'future',0)", [])
        .expect("record a future migration");
    drop(conn);

    let refused = Tether::spawn(dir.path(), &["migrate"], &env).wait(QUICK);
    assert_eq!(refused.code(), Some(1), "migrate on a newer schema\n{}", refused.describe());
    assert!(refused.stderr.contains("newer than this binary"), "{}", refused.describe());

    let listen = free_listen();
    let serve = Tether::spawn(dir.path(), &["serve", "--listen", &listen], &env).wait(QUICK);
    assert_eq!(serve.code(), Some(1), "serve on a newer schema\n{}", serve.describe());
    assert!(serve.stderr.contains("newer than this binary"), "{}", serve.describe());

    // Refusing must not have touched the recorded versions.
    let conn = rusqlite::Connection::open(&db).unwrap();
    let max: i64 = conn.query_row("SELECT max(version) FROM schema_migrations", [], |r| r.get(0)).unwrap();
    assert_eq!(max, 999);
}

#[actix_rt::test]
async fn migrate_twice_on_postgres() {
    let url = support::pg_database().await;
    let env = [("TETHER_DATABASE__URL", url.as_str())];
    let dir = tempdir();
    let first = Tether::spawn(dir.path(), &["migrate"], &env).wait(QUICK);
    assert_eq!(first.code(), Some(0), "first migrate\n{}", first.describe());
    assert!(migrations_applied(&first.stderr).is_some_and(|n| n > 0), "{}", first.describe());
    let second = Tether::spawn(dir.path(), &["migrate"], &env).wait(QUICK);
    assert_eq!(second.code(), Some(0), "second migrate\n{}", second.describe());
    assert_eq!(migrations_applied(&second.stderr), Some(0), "{}", second.describe());
    // What is there already is skipped without a word (PostgreSQL's NOTICE
    // for it is not logged on every start).
    assert!(!second.stderr.contains("NOTICE"), "a second migrate logged a notice\n{}", second.describe());
    assert!(!dir.path().join("tether.db").exists(), "migrate against PostgreSQL created ./tether.db");
}

/// A migration that fails names the migration and PostgreSQL's reason, not
/// only "db error", and records nothing.
#[actix_rt::test]
async fn a_failed_migration_says_why() {
    let url = support::pg_database().await;
    let client = support::pg_connect(&url).await;
    // The first migration creates `users`; one that is there already makes it fail.
    client.batch_execute("CREATE TABLE users (x int)").await.unwrap();
    let dir = tempdir();
    let finished = Tether::spawn(dir.path(), &["migrate"], &[("TETHER_DATABASE__URL", url.as_str())]).wait(QUICK);
    assert_eq!(finished.code(), Some(1), "{}", finished.describe());
    assert!(finished.stderr.contains("0001_foundation"), "{}", finished.describe());
    assert!(finished.stderr.contains("relation \"users\" already exists"), "{}", finished.describe());
    let recorded = client
        .query_one("SELECT count(*) FROM pg_tables WHERE tablename = 'schema_migrations'", &[])
        .await
        .unwrap()
        .get::<_, i64>(0);
    assert_eq!(recorded, 0, "a failed migration left schema_migrations behind");
}

/// A database that refuses the connection says why, not only "db error".
#[actix_rt::test]
async fn a_refused_postgres_connection_says_why() {
    let url = support::pg_database().await;
    let wrong = url.replacen("://postgres@", "://nouser@", 1);
    assert_ne!(wrong, url, "the test database's URL names the postgres role: {url}");
    let dir = tempdir();
    let finished = Tether::spawn(dir.path(), &["migrate"], &[("TETHER_DATABASE__URL", wrong.as_str())]).wait(QUICK);
    assert_eq!(finished.code(), Some(1), "{}", finished.describe());
    assert!(finished.stderr.contains("role \"nouser\" does not exist"), "{}", finished.describe());
}

// ---------------------------------------------------------------------------
// 6. The README run path

#[test]
fn serve_in_an_empty_dir_uses_embedded_sqlite_and_listens() {
    let dir = tempdir();
    let listen = free_listen();
    let mut serve = Tether::spawn(dir.path(), &["serve", "--listen", &listen], &[]);

    serve.wait_for_200(&listen, "/healthz");
    let line = serve.wait_for_stdout_line("listening on", Duration::from_secs(5));
    assert!(
        line.contains(&format!("listening on http://{listen}")),
        "the listening line does not give http://{listen}: {line:?}"
    );
    assert!(
        dir.path().join("tether.db").is_file(),
        "serve with no database settings did not create ./tether.db in its working directory\n{}",
        serve.output()
    );
    // Ready too: the embedded database is migrated.
    serve.wait_for_200(&listen, "/readyz");
    assert!(serve.exited().is_none(), "serve exited\n{}", serve.output());
}

#[test]
fn serve_exits_0_on_sigterm() {
    let dir = tempdir();
    let listen = free_listen();
    let mut serve =
        Tether::spawn(dir.path(), &["serve", "--listen", &listen], &[("TETHER_SHUTDOWN__GRACE_MS", "5000")]);
    serve.wait_for_200(&listen, "/healthz");
    // SAFETY: kill(2) on our own, not yet reaped child.
    unsafe { libc::kill(serve.child.id() as libc::pid_t, libc::SIGTERM) };
    let finished = serve.wait(Duration::from_secs(15));
    assert_eq!(finished.code(), Some(0), "serve should stop with status 0 on SIGTERM\n{}", finished.describe());
}

#[test]
fn serve_reads_its_settings_from_a_config_file() {
    let dir = tempdir();
    let data = tempdir();
    let db = data.path().join("from-config.db");
    let listen = free_listen();
    let file = dir.path().join("tether.toml");
    std::fs::write(&file, format!("[http]\nlisten = \"{listen}\"\n[database]\nsqlite_path = \"{}\"\n", db.display()))
        .unwrap();
    let mut serve = Tether::spawn(dir.path(), &["serve", "--config", file.to_str().unwrap()], &[]);
    serve.wait_for_200(&listen, "/readyz");
    serve.wait_for_stdout_line(&format!("listening on http://{listen}"), Duration::from_secs(5));
    assert!(db.is_file(), "database.sqlite_path from the file was not used");
    assert!(!dir.path().join("tether.db").exists(), "serve created ./tether.db although database.sqlite_path was set");
}

#[test]
fn serve_on_a_taken_port_exits_1() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let listen = taken.local_addr().unwrap().to_string();
    let dir = tempdir();
    let finished = Tether::spawn(dir.path(), &["serve", "--listen", &listen], &[]).wait(QUICK);
    assert_eq!(finished.code(), Some(1), "serve on a port in use should exit 1\n{}", finished.describe());
    assert!(finished.stderr.contains(&listen), "{}", finished.describe());
    // Refused before anything started, so nothing is torn down half-started.
    assert!(!finished.stderr.contains("panicked"), "{}", finished.describe());
    // The same for the metrics listener.
    let finished = Tether::spawn(
        dir.path(),
        &["serve", "--listen", "127.0.0.1:0"],
        &[("TETHER_METRICS__LISTEN", listen.as_str())],
    )
    .wait(QUICK);
    assert_eq!(finished.code(), Some(1), "metrics.listen on a port in use should exit 1\n{}", finished.describe());
    assert!(finished.stderr.contains(&listen), "{}", finished.describe());
    assert!(!finished.stderr.contains("panicked"), "{}", finished.describe());
    drop(taken);
}

// ---------------------------------------------------------------------------
// 7. PostgreSQL and the instance card

#[actix_rt::test]
async fn serve_on_postgres_describes_its_instance() {
    let url = support::pg_database().await;
    let server = TetherServer::start(&[("TETHER_DATABASE__URL", &url), ("TETHER_CELL__ID", "cell-x")], &[]).await;
    let listen = server.listen_addr().to_string();
    let (status, _) = get_json(&listen, "/readyz", &[]);
    assert_eq!(status, 200, "/readyz on PostgreSQL\n{}", server.log());

    let (status, card) = get_json(&listen, "/api/v1/instance", &[]);
    assert_eq!(status, 200, "GET /api/v1/instance: {card}");
    assert_eq!(card["cellId"], "cell-x", "cellId must be TETHER_CELL__ID: {card}");
    assert_eq!(card["role"], "combined", "{card}");
    let instance_id = card["instanceId"].as_str().unwrap_or_default();
    assert!(is_instance_id(instance_id, "cell-x"), "instanceId {instance_id:?} is not cell-x#<6 hex>");
    assert!(!server.scratch_dir().join("tether.db").exists(), "serve with database.url also created ./tether.db");

    // A token from `token create` on the same database authenticates.
    let token = server.run(&["token", "create", "--user", "ann"], &[]);
    let token = String::from_utf8_lossy(&token.stdout).trim().to_string();
    assert!(is_token(&token), "{token:?}");
    let bearer = format!("Bearer {token}");
    let (status, hosts) = get_json(&listen, "/api/v1/hosts", &[("Authorization", &bearer)]);
    assert_eq!(status, 200, "GET /api/v1/hosts with a fresh token: {hosts}");
    let (status, _) = get_json(&listen, "/api/v1/hosts", &[]);
    assert_eq!(status, 401, "GET /api/v1/hosts without a token");
}

#[actix_rt::test]
async fn instance_id_is_new_each_boot_and_cell_id_defaults_to_the_host_name() {
    let url = support::pg_database().await;
    let mut ids = Vec::new();
    for _ in 0..2 {
        let server = TetherServer::start(&[("TETHER_DATABASE__URL", &url)], &[]).await;
        let (status, card) = get_json(server.listen_addr(), "/api/v1/instance", &[]);
        assert_eq!(status, 200, "{card}");
        let hostname = gethostname::gethostname().to_string_lossy().into_owned();
        assert_eq!(card["cellId"], hostname.as_str(), "cellId defaults to the host name: {card}");
        let instance_id = card["instanceId"].as_str().unwrap_or_default().to_string();
        assert!(is_instance_id(&instance_id, &hostname), "instanceId {instance_id:?} is not <host name>#<6 hex>");
        ids.push(instance_id);
    }
    assert_ne!(ids[0], ids[1], "two boots got the same instance id");
}

#[actix_rt::test]
async fn serve_role_cell_reports_its_role() {
    let server = TetherServer::start(&[], &["--role", "cell"]).await;
    let (status, card) = get_json(server.listen_addr(), "/api/v1/instance", &[]);
    assert_eq!(status, 200, "{card}");
    assert_eq!(card["role"], "cell", "{card}");
}

// ---------------------------------------------------------------------------
// 8. director

#[test]
fn serve_role_director_without_the_cluster_secret_is_refused_naming_the_key() {
    let finished = run_in_empty_dir(&["serve", "--role", "director", "--listen", &free_listen()], &[]);
    assert_status_2(&finished, "serve --role director");
    assert!(
        finished.stderr.contains("cluster.secret") && finished.stderr.contains("director"),
        "the message does not name the missing key\n{}",
        finished.describe()
    );
}

#[test]
fn serve_role_cell_with_the_director_enabled_is_refused_naming_the_key() {
    let env = [("TETHER_DIRECTOR__ENABLED", "true"), ("TETHER_CLUSTER__SECRET", "a-cluster-secret-of-16+")];
    let finished = run_in_empty_dir(&["serve", "--role", "cell", "--listen", &free_listen()], &env);
    assert_status_2(&finished, "serve --role cell with director.enabled");
    assert!(finished.stderr.contains("director.enabled"), "the message does not name the key\n{}", finished.describe());
}

/// `--config` is taken by every subcommand: a client command does not read
/// settings, but a file that is missing or not settings is still exit 2
/// naming it; a good one changes nothing (here: no server answers, 1).
#[test]
fn a_client_command_checks_its_config_file() {
    let client = ["hosts", "--server", "http://127.0.0.1:9", "--token", "tth_x"];
    let missing = run_in_empty_dir(&[&client[..], &["--config", "/no/such/tether.toml"]].concat(), &[]);
    assert_status_2(&missing, "hosts --config /no/such/tether.toml");
    assert!(missing.stderr.contains("--config"), "{}", missing.describe());
    let dir = tempdir();
    let good = dir.path().join("tether.toml");
    std::fs::write(&good, "[http]\nlisten = \"127.0.0.1:8080\"\n").expect("write");
    let finished = run_in_empty_dir(&[&client[..], &["--config", good.to_str().unwrap()]].concat(), &[]);
    assert_eq!(finished.code(), Some(1), "{}", finished.describe());
    // TETHER_CONFIG is checked as --config is.
    let from_env = run_in_empty_dir(&client, &[("TETHER_CONFIG", "/no/such/tether.toml")]);
    assert_status_2(&from_env, "TETHER_CONFIG=/no/such/tether.toml hosts");
    assert!(from_env.stderr.contains("TETHER_CONFIG"), "{}", from_env.describe());
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "this is not [toml").expect("write");
    let invalid = run_in_empty_dir(&client, &[("TETHER_CONFIG", bad.to_str().unwrap())]);
    assert_status_2(&invalid, "TETHER_CONFIG=bad.toml hosts");
    let finished = run_in_empty_dir(&client, &[("TETHER_CONFIG", good.to_str().unwrap())]);
    assert_eq!(finished.code(), Some(1), "{}", finished.describe());
}

/// A director serves no daemon and no viewer: `--demo` there is refused
/// rather than left retrying its placement forever.
#[test]
fn serve_demo_as_a_director_is_refused() {
    let env = [("TETHER_CLUSTER__SECRET", "a-cluster-secret-of-16+")];
    let finished = run_in_empty_dir(&["serve", "--demo", "--role", "director", "--listen", &free_listen()], &env);
    assert_status_2(&finished, "serve --demo --role director");
    assert!(finished.stderr.contains("--demo"), "the message does not name the flag\n{}", finished.describe());
}

// ---------------------------------------------------------------------------
// TETHER_TOKEN

/// `daemon --help` and `attach --help` advertise `[env: TETHER_TOKEN]`; it
/// must not be read as a setting (an unknown key `token`, exit 2).
#[test]
fn tether_token_env_is_not_a_config_error() {
    for args in [
        vec!["daemon", "--server", "http://127.0.0.1:1"],
        vec!["attach", "00000000-0000-0000-0000-000000000000", "--server", "http://127.0.0.1:1"],
    ] {
        let dir = tempdir();
        // TETHER_SERVER belongs to the client commands just as much.
        let env = [("TETHER_TOKEN", "tth_x"), ("TETHER_SERVER", "http://127.0.0.1:1")];
        let mut child = Tether::spawn(dir.path(), &args, &env);
        // The daemon redials forever and attach fails to connect: either way
        // it must not be a configuration error.
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline && child.exited().is_none() {
            thread::sleep(Duration::from_millis(20));
        }
        let stderr = child.stderr();
        assert!(
            !stderr.contains("unknown field `token`") && child.exited().and_then(|s| s.code()) != Some(2),
            "tether {args:?} with TETHER_TOKEN set: {}",
            child.output()
        );
    }
}

/// A `daemon --server` that is some other web server (here one that
/// answers every request 404 with an HTML page) is named as the likely
/// mistake, not logged as a bare HTTP status on every retry.
#[test]
fn a_daemon_pointed_at_another_web_server_says_so() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut request = [0u8; 4096];
            let _ = stream.read(&mut request);
            let page = "<html><body>Not Found</body></html>";
            let answer = format!(
                "HTTP/1.1 404 Not Found\r\ncontent-type: text/html\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{page}",
                page.len()
            );
            let _ = stream.write_all(answer.as_bytes());
        }
    });
    let dir = tempdir();
    let server = format!("http://{addr}");
    let mut child = Tether::spawn(dir.path(), &["daemon", "--server", &server, "--token", "tth_x"], &[]);
    let deadline = Instant::now() + QUICK;
    while !child.stderr().contains("is --server the tether server's base URL") {
        assert!(Instant::now() < deadline && child.exited().is_none(), "{}", child.output());
        thread::sleep(Duration::from_millis(20));
    }
    assert!(child.stderr().contains(&format!("HTTP 404 from {server}/api/v1/hosts")), "{}", child.output());
}

// ---------------------------------------------------------------------------
// cell set, cell budget

/// `tether cell set ARGS` on `db`: exit status, stdout, stderr.
fn cell_set(db: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    let out = tether_cmd(
        &[&["cell", "set"], args].concat(),
        &[("TETHER_DATABASE__SQLITE_PATH", db.to_str().expect("utf-8 path"))],
    );
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The printed switch as (mode, slots, generation).
fn printed_switch(stdout: &str) -> (String, String, String) {
    let field = |name: &str| {
        let line = stdout.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no {name} in {stdout:?}"));
        line[name.len()..].trim().to_string()
    };
    assert_eq!(field("cell"), "relay-7", "{stdout}");
    (field("admit mode"), field("trip slots"), field("generation"))
}

#[test]
fn cell_set_prints_the_switch_and_bumps_its_generation() {
    let dir = tempdir();
    let db = dir.path().join("cells.db");
    let switch = |args: &[&str]| {
        let (code, stdout, stderr) = cell_set(&db, args);
        assert_eq!(code, Some(0), "cell set {args:?}\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}");
        printed_switch(&stdout)
    };
    let s = |a: &str, b: &str, c: &str| (a.to_string(), b.to_string(), c.to_string());
    assert_eq!(switch(&["--cell", "relay-7"]), s("db", "none", "1"), "a new switch without a mode is db");
    assert_eq!(
        switch(&["--cell", "relay-7", "--admit-mode", "reserve", "--dead-man-trip-slots", "2"]),
        s("reserve", "2", "2")
    );
    assert_eq!(switch(&["--cell", "relay-7"]), s("reserve", "2", "3"), "a write without flags bumps it too");
    assert_eq!(switch(&["--cell", "relay-7", "--dead-man-trip-slots", "none"]), s("reserve", "none", "4"));

    for (args, says) in [
        (&["--cell", "relay-7", "--dead-man-trip-slots", "65"][..], "0 to 64"),
        (&["--cell", "relay-7", "--dead-man-trip-slots", "-1"][..], "0 to 64"),
        (&["--cell", "relay-7", "--dead-man-trip-slots", "two"][..], "0 to 64"),
        (&["--cell", "relay-7", "--admit-mode", "maybe"][..], "db, reserve"),
        (&["--admit-mode", "db"][..], "--cell"),
        (&["--cell", " ", "--admit-mode", "db"][..], "--cell"),
        (&["--cell", "a#b"][..], "--cell"),
        (&["--cell", "has space"][..], "--cell"),
        (&["--cell", "a/b"][..], "--cell"),
    ] {
        let (code, stdout, stderr) = cell_set(&db, args);
        assert_eq!(code, Some(2), "cell set {args:?}\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}");
        assert!(stderr.contains(says), "cell set {args:?}: the message does not say {says:?}:\n{stderr}");
        assert!(stdout.is_empty(), "cell set {args:?} printed a switch: {stdout}");
    }
    assert_eq!(switch(&["--cell", "relay-7"]), s("reserve", "none", "5"), "the refused writes wrote nothing");
    let conn = rusqlite::Connection::open(&db).expect("open the SQLite file");
    let cells: Vec<String> = conn
        .prepare("SELECT cell_id FROM relay_cell_admit_modes")
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
        .expect("switches");
    assert_eq!(cells, ["relay-7"], "a refused cell id got a switch");
}

/// `token list` of a user that does not exist, and a `token create --host`
/// refused because the user has no such host, create no user; `token` and
/// `cell` commands give a fresh database its schema but refuse (exit 1,
/// naming `tether migrate`) one at an older schema instead of upgrading it.
#[test]
fn operator_commands_create_no_user_and_upgrade_no_schema() {
    let dir = tempdir();
    let db = dir.path().join("ops.db");
    let env = [("TETHER_DATABASE__SQLITE_PATH", db.to_str().unwrap())];
    let out = tether_cmd(&["token", "list", "--user", "zed"], &env);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let host = "0d9e8f7a-6b5c-4d3e-8f1a-2b3c4d5e6f70";
    let out = tether_cmd(&["token", "create", "--user", "erin", "--scope", "daemon", "--host", host], &env);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("has no host"), "{out:?}");
    let conn = rusqlite::Connection::open(&db).expect("the fresh database got its schema");
    let users: i64 = conn.query_row("SELECT count(*) FROM users", [], |r| r.get(0)).unwrap();
    assert_eq!(users, 0, "a list or a refused create made a user");

    // An older schema: the last migration undone in the record.
    conn.execute("DELETE FROM schema_migrations WHERE version = (SELECT max(version) FROM schema_migrations)", [])
        .expect("forget the last migration");
    let before: i64 = conn.query_row("SELECT max(version) FROM schema_migrations", [], |r| r.get(0)).unwrap();
    for args in [&["token", "list", "--user", "ann"][..], &["cell", "budget"][..]] {
        let out = tether_cmd(args, &env);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains("tether migrate"), "{args:?}: {stderr}");
    }
    let after: i64 = conn.query_row("SELECT max(version) FROM schema_migrations", [], |r| r.get(0)).unwrap();
    assert_eq!(after, before, "an operator command migrated the database");
}

/// Operator commands whose reader is gone (`| head`, a closed pipe): a
/// table is dropped quietly (exit 0); the secret of `token create`, shown
/// only once, is a failure to say so (exit 1). They used to panic (101).
#[test]
fn operator_commands_into_a_closed_pipe_exit_without_a_panic() {
    let dir = tempdir();
    let db = dir.path().join("pipe.db");
    let vars = vec![("TETHER_DATABASE__SQLITE_PATH".to_string(), db.to_str().expect("utf-8").to_string())];
    for (args, status) in [
        (&["cell", "budget"][..], 0),
        (&["cell", "set", "--cell", "relay-7"][..], 0),
        (&["token", "list", "--user", "ann"][..], 0),
        (&["token", "create", "--user", "ann"][..], 1),
    ] {
        let (reader, writer) = std::io::pipe().expect("pipe");
        drop(reader);
        let out = support::tether_command(&vars)
            .args(args)
            .stdin(Stdio::null())
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()
            .expect("run tether");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(status), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

#[actix_rt::test]
async fn cell_budget_prints_the_worked_example() {
    use tether::cell::AdmitMode;
    use tether::store::{CellRow, Store};
    let dir = tempdir();
    let db = dir.path().join("cells.db");
    let env = [("TETHER_DATABASE__SQLITE_PATH", db.to_str().expect("utf-8 path"))];
    // docs/CELLS.md: 6 db cells at pool 10; 16 reserve cells at 8 (reserve 8); 7 at 16 (reserve 12).
    let fleet: Vec<(String, AdmitMode, u32, u32)> = (0..6)
        .map(|i| (format!("db-{i}"), AdmitMode::Db, 10, 10))
        .chain((0..16).map(|i| (format!("small-{i}"), AdmitMode::Reserve, 8, 8)))
        .chain((0..7).map(|i| (format!("large-{i}"), AdmitMode::Reserve, 16, 12)))
        .collect();
    let store = tether::store::sqlite::SqliteStore::open(&db).expect("open");
    store.migrate().await.expect("migrate");
    for (id, mode, pool, reserve) in &fleet {
        let row = CellRow {
            cell_id: id.clone(),
            url: format!("http://{id}:8080"),
            region: String::new(),
            pool_size: *pool,
            reserve_pool_size: *reserve,
        };
        store.register_cell(&row).await.expect("register");
        store.set_cell_switch(id, Some(*mode), None).await.expect("switch");
    }
    let budget = || {
        let out = tether_cmd(&["cell", "budget"], &env);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert_eq!(out.status.code(), Some(0), "cell budget\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        stdout
    };
    let uncapped = budget();
    assert!(uncapped.contains("db cells: 6, 60 connections"), "{uncapped}");
    assert!(uncapped.contains("reserve cells: 23, 212 connections at their reserve pools, 240"), "{uncapped}");
    assert!(uncapped.contains("(every reserve cell tripped): 300 connections"), "{uncapped}");
    assert!(uncapped.contains("no reserve cell has dead_man_trip_slots"), "{uncapped}");

    for (id, mode, ..) in &fleet {
        if *mode == AdmitMode::Reserve {
            let (code, _, stderr) = cell_set(&db, &["--cell", id, "--dead-man-trip-slots", "2"]);
            assert_eq!(code, Some(0), "{stderr}");
        }
    }
    let capped = budget();
    assert!(capped.contains("(every reserve cell tripped): 300 connections"), "{capped}");
    assert!(
        capped.contains("dead_man_trip_slots = 2 (at most 2 reserve cells tripped at once): 280 connections"),
        "{capped}"
    );
    assert!(capped.contains("runs a build that honours dead_man_trip_slots"), "the rollout rule: {capped}");
}
