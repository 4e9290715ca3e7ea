//! `tether attach`: the raw-mode command-line viewer of one terminal, like
//! `tmux attach` for a PTY hosted by a `tether daemon` somewhere else.
//!
//! It connects to `ws(s)://HOST/ws/v1/terminals/{id}` through
//! [`crate::client`] (docs/PROTOCOL.md, "Viewer protocol") with the user's
//! token, puts the local terminal in raw mode, shows
//! the terminal's bytes as they come (a snapshot repaint first, then live
//! output), and sends keystrokes back. The detach key (`Ctrl-]` by default)
//! leaves without touching the remote terminal. When the host disconnects or
//! moves to another instance (close 4503) the viewer reattaches on its own
//! with `?from=<offset>`, so the server can resume the stream without a
//! repaint when it still holds the missing bytes.
//!
//! Using it from the CLI (the wiring lives in `main.rs`):
//!
//! ```text
//! let outcome = actix_rt::System::new().block_on(attach::run(opts));
//! match outcome {
//!     Ok(outcome) => { println!("{}", attach::describe(&outcome)); exit(outcome.exit_status()) }
//!     // anyhow's `{:#}` prints the cause chain (`#[source]`s) too.
//!     Err(e) => { eprintln!("error: {:#}", anyhow::Error::new(e)); exit(1) }
//! }
//! ```
//!
//! Suggested exit status ([`AttachOutcome::exit_status`]): 0 when the user
//! detached or the terminal exited with code 0; 1 for every other outcome
//! (a non-zero or unknown exit code, any close by the server) and for
//! errors. The remote exit code itself is shown by [`describe`] rather than
//! passed through, so a failing remote command cannot be confused with a
//! failing `tether attach`.
//!
//! `run` returns only after the local terminal is restored, so the caller
//! prints [`describe`]'s message on a sane terminal. Keystrokes are read on
//! a helper thread that stays blocked in `read` until the next key after
//! `run` returns; a CLI that exits right after `run` never notices.
//! `run_with_io` is the same session over injected input, window sizes and
//! output: tests use it without a TTY.
//!
//! An `https://` server URL maps to `wss://`, trusting the system's roots
//! plus [`AttachOptions::ca_file`] (docs/CONFIG.md, "TLS"). A certificate
//! the client refuses ends the session at once with a message naming the
//! problem: reattaching cannot fix it.

mod local;
mod position;
mod session;

pub use session::READ_ONLY_BANNER;

use std::fmt;
use std::io::{self, Write};
use std::path::PathBuf;

use bytes::Bytes;
use futures_util::Stream;

use crate::client::viewer::protocol;
use crate::client::{Client, ClientError};

/// `Ctrl-]`, as in telnet and `docker attach`: rarely needed by programs.
pub const DEFAULT_DETACH_KEY: u8 = 0x1d;

/// What to attach to and how.
#[derive(Clone)]
pub struct AttachOptions {
    /// The server's HTTP base URL, e.g. `http://127.0.0.1:8080`.
    pub server: String,
    /// An API token (`tth_...`), sent as `Authorization: Bearer`.
    pub token: String,
    pub terminal_id: String,
    /// The byte that detaches instead of being sent (default `Ctrl-]`).
    pub detach_key: u8,
    /// PEM CA certificates trusted for `https://` besides the system's roots.
    pub ca_file: Option<PathBuf>,
}

impl AttachOptions {
    /// Options with the default detach key.
    pub fn new(server: impl Into<String>, token: impl Into<String>, terminal_id: impl Into<String>) -> Self {
        Self {
            server: server.into(),
            token: token.into(),
            terminal_id: terminal_id.into(),
            detach_key: DEFAULT_DETACH_KEY,
            ca_file: None,
        }
    }
}

/// Never prints the token: options end up in logs and error reports.
impl fmt::Debug for AttachOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AttachOptions")
            .field("server", &self.server)
            .field("token", &"<redacted>")
            .field("terminal_id", &self.terminal_id)
            .field("detach_key", &self.detach_key)
            .field("ca_file", &self.ca_file)
            .finish()
    }
}

/// How an attach session ended (errors aside).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttachOutcome {
    /// The user pressed the detach key; the terminal keeps running.
    Detached,
    /// The terminal's process ended (`None`: killed by a signal or unknown).
    Exited { code: Option<i32> },
    /// The server ended the session: a close code with its reason, or, with
    /// code 1000, an error message such as "host offline".
    Closed { code: u16, reason: String },
}

impl AttachOutcome {
    /// The suggested process exit status: 0 for a detach or an exit with
    /// code 0, 1 otherwise.
    pub fn exit_status(&self) -> i32 {
        match self {
            AttachOutcome::Detached | AttachOutcome::Exited { code: Some(0) } => 0,
            AttachOutcome::Exited { .. } | AttachOutcome::Closed { .. } => 1,
        }
    }
}

/// The message to print once the terminal is restored.
pub fn describe(outcome: &AttachOutcome) -> String {
    match outcome {
        AttachOutcome::Detached => "[detached]".to_owned(),
        AttachOutcome::Exited { code: Some(code) } => format!("[terminal exited with code {code}]"),
        AttachOutcome::Exited { code: None } => "[terminal exited]".to_owned(),
        AttachOutcome::Closed { code: protocol::CLOSE_NORMAL, reason } => format!("[{reason}]"),
        AttachOutcome::Closed { code, reason } => format!("[closed: {reason} ({code})]"),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error("invalid server URL {0:?}: expected http(s)://HOST[:PORT][/PATH]")]
    InvalidServerUrl(String),
    #[error("invalid terminal id {0:?}")]
    InvalidTerminalId(String),
    // awc's errors are neither Send nor Sync, so they are kept as text to
    // let callers wrap this error in anyhow.
    #[error("cannot connect to {url}: {message}")]
    Connect { url: String, message: String },
    /// The `--ca-file` cannot be used.
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    /// The handshake failed on the server's certificate (the message says why).
    #[error("cannot connect to {url}: {message}")]
    Certificate { url: String, message: String },
    #[error("the server refused the viewer connection (HTTP {status})")]
    Rejected { status: u16 },
    #[error("WebSocket protocol error: {0}")]
    Protocol(String),
    #[error("cannot set up the local terminal")]
    Terminal(#[source] io::Error),
    #[error("cannot write terminal output")]
    Output(#[source] io::Error),
    #[error("gave up reattaching after {attempts} attempts")]
    ReattachFailed {
        attempts: u32,
        #[source]
        last: Box<AttachError>,
    },
}

impl From<ClientError> for AttachError {
    fn from(err: ClientError) -> Self {
        match err {
            ClientError::InvalidServerUrl(url) => AttachError::InvalidServerUrl(url),
            ClientError::InvalidId(id) => AttachError::InvalidTerminalId(id),
            ClientError::Tls(e) => AttachError::Tls(e),
            ClientError::Connect { url, message } => AttachError::Connect { url, message },
            ClientError::Certificate { url, message } => AttachError::Certificate { url, message },
            ClientError::Rejected { status } => AttachError::Rejected { status },
            other @ (ClientError::Protocol(_)
            | ClientError::Encode(_)
            | ClientError::Api { .. }
            | ClientError::NotTether { .. }
            | ClientError::Decode { .. }) => AttachError::Protocol(other.to_string()),
        }
    }
}

impl AttachError {
    /// Errors that a retry cannot fix (a 4xx other than 408/429, bad input),
    /// so a reattach stops at once instead of spending its budget.
    fn is_permanent(&self) -> bool {
        match self {
            AttachError::InvalidServerUrl(_)
            | AttachError::InvalidTerminalId(_)
            | AttachError::Tls(_)
            | AttachError::Certificate { .. } => true,
            AttachError::Rejected { status } => (400..500).contains(status) && !matches!(status, 408 | 429),
            _ => false,
        }
    }
}

/// The local side of a session: keystrokes in, window sizes, bytes out.
pub struct LocalIo<I, R, W> {
    /// Raw input chunks in order; the stream ending means stdin hit EOF (the
    /// session goes on showing output).
    pub input: I,
    /// The window size (cols, rows) at start.
    pub size: (u16, u16),
    /// Every later window size.
    pub resizes: R,
    /// Where terminal bytes go; flushed after every frame.
    pub output: W,
}

/// Attaches the process's terminal: raw mode while attached (only if stdin
/// is a TTY), restored before returning, on every path.
pub async fn run(opts: AttachOptions) -> Result<AttachOutcome, AttachError> {
    let _restore_on_return = local::TerminalGuard::enter().map_err(AttachError::Terminal)?;
    let io = LocalIo {
        input: local::stdin_chunks().map_err(AttachError::Terminal)?,
        size: local::window_size(),
        resizes: local::window_resizes().map_err(AttachError::Terminal)?,
        output: io::stdout(),
    };
    run_with_io(opts, io).await
}

/// One attach session over the given local side (see [`LocalIo`]).
pub async fn run_with_io<I, R, W>(opts: AttachOptions, io: LocalIo<I, R, W>) -> Result<AttachOutcome, AttachError>
where
    I: Stream<Item = Bytes> + Unpin,
    R: Stream<Item = (u16, u16)> + Unpin,
    W: Write,
{
    let client = Client::new(&opts.server, &opts.token, opts.ca_file.as_deref())?;
    session::Session::new(opts, io, client).run().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describes_every_outcome() {
        assert_eq!(describe(&AttachOutcome::Detached), "[detached]");
        assert_eq!(describe(&AttachOutcome::Exited { code: Some(3) }), "[terminal exited with code 3]");
        assert_eq!(describe(&AttachOutcome::Exited { code: None }), "[terminal exited]");
        assert_eq!(describe(&AttachOutcome::Closed { code: 1000, reason: "host offline".into() }), "[host offline]");
        assert_eq!(
            describe(&AttachOutcome::Closed { code: 4404, reason: protocol::describe_close(4404, None) }),
            "[closed: terminal not found (4404)]"
        );
    }

    #[test]
    fn exit_status_is_zero_only_for_detach_and_clean_exit() {
        assert_eq!(AttachOutcome::Detached.exit_status(), 0);
        assert_eq!(AttachOutcome::Exited { code: Some(0) }.exit_status(), 0);
        assert_eq!(AttachOutcome::Exited { code: Some(3) }.exit_status(), 1);
        assert_eq!(AttachOutcome::Exited { code: None }.exit_status(), 1);
        let closed = AttachOutcome::Closed { code: 4401, reason: "bad token".into() };
        assert_eq!(closed.exit_status(), 1);
    }

    #[test]
    fn debug_never_shows_the_token() {
        let opts = AttachOptions::new("http://h", "tth_secret", "t1");
        assert_eq!(opts.detach_key, DEFAULT_DETACH_KEY);
        assert!(!format!("{opts:?}").contains("tth_secret"));
    }

    #[test]
    fn errors_can_cross_threads_for_anyhow() {
        fn assert_send_sync<T: Send + Sync + 'static>() {}
        assert_send_sync::<AttachError>();
    }

    #[test]
    fn only_client_errors_stop_a_reattach() {
        assert!(AttachError::Rejected { status: 401 }.is_permanent());
        assert!(AttachError::Rejected { status: 404 }.is_permanent());
        assert!(!AttachError::Rejected { status: 429 }.is_permanent());
        assert!(!AttachError::Rejected { status: 502 }.is_permanent());
        let refused = AttachError::Connect { url: "ws://h".into(), message: "refused".into() };
        assert!(!refused.is_permanent());
        let certificate = AttachError::Certificate { url: "wss://h".into(), message: "expired".into() };
        assert!(certificate.is_permanent());
    }
}
