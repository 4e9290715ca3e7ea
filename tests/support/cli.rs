//! The client commands as a person runs them: a home of their own (so
//! `tether login` writes a config nobody else reads), one-shot commands
//! with pipes, commands watched while they run, and interactive commands
//! driven through a real pseudo-terminal (portable-pty).

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use portable_pty::{CommandBuilder, PtySize};

use super::{process, tether_cmd, tether_command};

const TETHER: &str = env!("CARGO_BIN_EXE_tether");

/// How long a watched command or a PTY wait may take.
pub const CLI_WAIT: Duration = Duration::from_secs(30);

/// A finished command.
#[derive(Debug)]
pub struct Finished {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Finished {
    /// Asserts exit status 0 and returns stdout.
    pub fn ok(&self) -> &str {
        assert_eq!(self.code, Some(0), "expected success:\n{self:#?}");
        &self.stdout
    }

    /// Asserts the exit status and that stderr contains every needle.
    pub fn fails(&self, code: i32, needles: &[&str]) {
        assert_eq!(self.code, Some(code), "expected exit status {code}:\n{self:#?}");
        for needle in needles {
            assert!(self.stderr.contains(needle), "stderr lacks {needle:?}:\n{self:#?}");
        }
    }
}

/// A person: their own config dir and environment variables.
pub struct Person {
    home: tempfile::TempDir,
    env: Vec<(String, String)>,
}

impl Person {
    pub fn new() -> Self {
        let home = tempfile::Builder::new().prefix("tether-home-").tempdir().expect("home dir");
        let env = vec![
            ("HOME".to_owned(), home.path().display().to_string()),
            ("XDG_CONFIG_HOME".to_owned(), home.path().join("config").display().to_string()),
            ("RUST_LOG".to_owned(), "warn".to_owned()),
        ];
        Self { home, env }
    }

    /// Where `tether login` keeps server and token.
    pub fn login_file(&self) -> PathBuf {
        self.home.path().join("config").join("tether").join("login.json")
    }

    /// Sets (or replaces) an environment variable for later commands.
    pub fn set_env(&mut self, key: &str, value: &str) {
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.to_owned(), value.to_owned()));
    }

    pub fn remove_env(&mut self, key: &str) {
        self.env.retain(|(k, _)| k != key);
    }

    fn env_pairs(&self) -> Vec<(&str, &str)> {
        self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
    }

    /// Runs `tether args...` to the end with stdin closed.
    pub fn run(&self, args: &[&str]) -> Finished {
        let out = tether_cmd(args, &self.env_pairs());
        Finished {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Runs `tether args...` with `input` on stdin.
    pub fn run_with_stdin(&self, args: &[&str], input: &str) -> Finished {
        let mut running = self.spawn(args);
        let mut stdin = running.child.stdin.take().expect("stdin");
        stdin.write_all(input.as_bytes()).expect("write stdin");
        drop(stdin);
        running.wait(CLI_WAIT)
    }

    /// Runs `tether args...` to the end with a reader that starts reading
    /// its stdout only after `late` (stderr is read as it comes).
    pub fn run_read_late(&self, args: &[&str], late: Duration) -> Finished {
        let mut command = tether_command(&self.env);
        command.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = process::spawn_tied(command, None).unwrap_or_else(|e| panic!("spawn tether {args:?}: {e}"));
        let stderr = collect(child.stderr.take().expect("stderr"));
        std::thread::sleep(late);
        let mut stdout = Vec::new();
        child.stdout.take().expect("stdout").read_to_end(&mut stdout).expect("read stdout");
        let status = child.wait().expect("wait");
        std::thread::sleep(Duration::from_millis(50));
        let stderr = String::from_utf8_lossy(&stderr.lock().unwrap()).into_owned();
        Finished { code: status.code(), stdout: String::from_utf8_lossy(&stdout).into_owned(), stderr }
    }

    /// Starts `tether args...` with piped stdio, stdout and stderr collected
    /// as they come.
    pub fn spawn(&self, args: &[&str]) -> Running {
        let mut command = tether_command(&self.env);
        command.args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = process::spawn_tied(command, None).unwrap_or_else(|e| panic!("spawn tether {args:?}: {e}"));
        let stdout = collect(child.stdout.take().expect("stdout"));
        let stderr = collect(child.stderr.take().expect("stderr"));
        Running { child, stdout, stderr }
    }

    /// Starts `tether args...` on a new pseudo-terminal of `cols` x `rows`.
    pub fn pty(&self, args: &[&str], (cols, rows): (u16, u16)) -> Pty {
        let system = portable_pty::native_pty_system();
        let pair =
            system.openpty(PtySize { rows, cols, pixel_width: 0, pixel_height: 0 }).expect("open a pseudo-terminal");
        let mut command = CommandBuilder::new(TETHER);
        command.args(args);
        for (key, _) in std::env::vars() {
            if key.starts_with("TETHER_") {
                command.env_remove(key);
            }
        }
        command.env("TERM", "xterm-256color");
        for (key, value) in &self.env {
            command.env(key, value);
        }
        let child = pair.slave.spawn_command(command).expect("spawn tether on the pty");
        // The reader sees EOF only once every slave handle is closed.
        drop(pair.slave);
        let reader = pair.master.try_clone_reader().expect("pty reader");
        let writer = pair.master.take_writer().expect("pty writer");
        Pty { child, master: pair.master, writer, screen: collect(reader) }
    }
}

/// Bytes read from `pipe` on a helper thread until EOF.
fn collect(mut pipe: impl Read + Send + 'static) -> Arc<Mutex<Vec<u8>>> {
    let sink = Arc::new(Mutex::new(Vec::new()));
    let shared = sink.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 64 * 1024];
        while let Ok(n) = pipe.read(&mut buf) {
            if n == 0 {
                break;
            }
            shared.lock().unwrap().extend_from_slice(&buf[..n]);
        }
    });
    sink
}

/// Polls `done` every 10 ms until it holds or `timeout` passes.
fn wait_until(timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    done()
}

/// A command with piped stdio, still running.
pub struct Running {
    pub child: Child,
    stdout: Arc<Mutex<Vec<u8>>>,
    stderr: Arc<Mutex<Vec<u8>>>,
}

impl Running {
    pub fn stdout_bytes(&self) -> Vec<u8> {
        self.stdout.lock().unwrap().clone()
    }

    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.stdout.lock().unwrap()).into_owned()
    }

    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap()).into_owned()
    }

    /// Whether the process has ended.
    pub fn exited(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_some()
    }

    /// Waits until stdout contains `needle`.
    pub fn wait_for_stdout(&self, needle: &str, timeout: Duration) {
        let found = wait_until(timeout, || self.stdout().contains(needle));
        assert!(
            found,
            "stdout never showed {needle:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.stdout(),
            self.stderr()
        );
    }

    /// Waits for the end (killing the process after `timeout`).
    pub fn wait(mut self, timeout: Duration) -> Finished {
        let mut status = None;
        wait_until(timeout, || {
            status = self.child.try_wait().expect("try_wait");
            status.is_some()
        });
        let Some(status) = status else {
            let _ = self.child.kill();
            panic!("tether still running after {timeout:?}\n--- stderr ---\n{}", self.stderr());
        };
        // The collectors finish once the pipes close.
        std::thread::sleep(Duration::from_millis(50));
        Finished { code: status.code(), stdout: self.stdout(), stderr: self.stderr() }
    }
}

/// A command on a pseudo-terminal: what it drew so far, and keys to send.
pub struct Pty {
    child: Box<dyn portable_pty::Child + Send + Sync>,
    // Kept open: closing the master hangs the command up.
    #[allow(dead_code)]
    master: Box<dyn portable_pty::MasterPty + Send>,
    writer: Box<dyn Write + Send>,
    screen: Arc<Mutex<Vec<u8>>>,
}

impl Pty {
    /// Everything written to the terminal so far, lossily as text.
    pub fn screen(&self) -> String {
        String::from_utf8_lossy(&self.screen.lock().unwrap()).into_owned()
    }

    pub fn type_keys(&mut self, keys: &[u8]) {
        self.writer.write_all(keys).expect("type on the pty");
        self.writer.flush().expect("flush the pty");
    }

    /// Waits until the terminal shows `needle`.
    pub fn wait_for(&self, needle: &str) {
        let found = wait_until(CLI_WAIT, || self.screen().contains(needle));
        assert!(found, "the terminal never showed {needle:?}; it shows:\n{}", self.screen());
    }

    /// Whether the command has ended.
    pub fn exited(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_some()
    }

    /// Waits for the command's exit status.
    pub fn wait_exit(&mut self) -> u32 {
        let mut status = None;
        wait_until(CLI_WAIT, || {
            status = self.child.try_wait().expect("try_wait");
            status.is_some()
        });
        match status {
            Some(status) => status.exit_code(),
            None => {
                let _ = self.child.kill();
                panic!("still running after {CLI_WAIT:?}; the terminal shows:\n{}", self.screen());
            }
        }
    }
}
