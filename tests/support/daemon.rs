//! Real `tether daemon` processes for end-to-end tests: real PTYs, killed
//! when the test ends (dropped, or with the test process).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::{process, tether_command, TetherServer};

/// A running `tether daemon`.
pub struct DaemonProcess {
    child: Option<Child>,
    state_dir: PathBuf,
    log_path: PathBuf,
}

impl DaemonProcess {
    /// Starts a daemon for `server` with `token`, keeping its state in
    /// `state_dir` (reuse the dir to restart the same host) and allowing
    /// terminals in /tmp.
    pub fn start(server: &TetherServer, token: &str, state_dir: &Path) -> DaemonProcess {
        Self::start_url(&server.url(), token, state_dir)
    }

    /// Like `start`, dialing `url` (a balancer in front of servers, say).
    /// The token goes in `TETHER_TOKEN`, as docs/CLI.md advises.
    pub fn start_url(url: &str, token: &str, state_dir: &Path) -> DaemonProcess {
        Self::start_with(url, token, state_dir, &[])
    }

    /// Like `start_url`, with extra `tether daemon` flags.
    pub fn start_with(url: &str, token: &str, state_dir: &Path, flags: &[&str]) -> DaemonProcess {
        Self::spawn(url, state_dir, |command| {
            command.env("TETHER_TOKEN", token).args(flags);
        })
    }

    /// Like `start_url`, the token read from `token_file` (`--token-file`).
    pub fn start_with_token_file(url: &str, token_file: &Path, state_dir: &Path) -> DaemonProcess {
        Self::spawn(url, state_dir, |command| {
            command.env_remove("TETHER_TOKEN").arg("--token-file").arg(token_file);
        })
    }

    fn spawn(url: &str, state_dir: &Path, token: impl FnOnce(&mut Command)) -> DaemonProcess {
        std::fs::create_dir_all(state_dir).expect("state dir");
        let log_path = state_dir.join(format!("daemon-{}.log", rand::random::<u32>()));
        let (out, err) = process::log_file(&log_path);
        let mut command = tether_command(&[]);
        command
            .args(["daemon", "--server", url, "--allow-dir", "/tmp", "--state-dir"])
            .arg(state_dir)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        token(&mut command);
        let child = process::spawn_tied(command, None).expect("spawn tether daemon");
        DaemonProcess { child: Some(child), state_dir: state_dir.to_path_buf(), log_path }
    }

    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    pub fn log(&self) -> String {
        process::read_log(&self.log_path)
    }

    /// The exit status, once the daemon has ended by itself.
    pub fn try_exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    /// Sends SIGTERM and waits up to `within` for the daemon to exit; its
    /// status, or None if it is still running (it is then left running).
    pub fn terminate(&mut self, within: std::time::Duration) -> Option<std::process::ExitStatus> {
        let child = self.child.as_mut()?;
        // SAFETY: kill(2) on our own child, which has not been reaped yet.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = std::time::Instant::now() + within;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Some(status);
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        None
    }

    /// Kills the daemon at once (SIGKILL); its PTYs lose their master and end.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for DaemonProcess {
    fn drop(&mut self) {
        self.kill();
    }
}
