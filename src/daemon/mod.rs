//! The host daemon (`tether daemon`, docs/PROTOCOL.md and docs/ARCHITECTURE.md,
//! "The daemon"): hosts real PTY terminals on
//! this machine and serves them to a tether server over one WebSocket.
//!
//! Layout, one job per module:
//! - `supervisor`: the reconnect loop and close-code policy;
//! - `assign`: asking the server's director which cell to dial;
//! - `host`: the terminals table and server-frame handling per connection;
//! - `connection`: dialing, the ordered outbound queue, frame decoding;
//! - `terminal`: the per-terminal task that owns the output stream;
//! - `pty`: spawning on a PTY and the blocking I/O threads;
//! - `screen`, `screen_skip`, `screen_worker`, `ring`, `escape_boundary`:
//!   the screen model, its cheap path for text that scrolls off unseen, its
//!   thread, the output ring buffer, and where the stream may be cut;
//! - `ping_ledger`: when the server has a finished terminal's last frames;
//! - `stop`: a stop asked for (SIGTERM), which ends the terminals first;
//! - `dirs`, `state`, `limits`, `registration`, `server_url`, `backoff`.
//!
//! Everything runs on the current thread's local task set (awc is `!Send`),
//! so [`run`] can be spawned with `actix_rt::spawn` inside a server process.

mod assign;
mod backoff;
mod connection;
mod dirs;
mod escape_boundary;
mod host;
mod limits;
mod ping_ledger;
mod pty;
mod registration;
mod ring;
mod screen;
mod screen_skip;
mod screen_worker;
mod server_url;
mod state;
mod stop;
mod supervisor;
mod terminal;
mod token_file;

use std::path::PathBuf;

pub use self::connection::decode_server_frame;
pub use self::dirs::{MAX_DIRS, MAX_DIR_PATH_BYTES};
pub use self::screen::GridSize;
pub use self::server_url::BadServerUrl;
pub use self::state::{default_state_dir, StateError};
pub use self::token_file::{read_token_file, TokenFileError};

/// How to run the daemon (the `tether daemon` flags).
#[derive(Debug, Clone)]
pub struct DaemonOptions {
    /// HTTP base URL of the server, e.g. `http://127.0.0.1:8080`.
    pub server: String,
    pub token: String,
    /// Display name of the host; defaults to the machine's hostname.
    pub name: Option<String>,
    pub state_dir: PathBuf,
    /// Seeds the dir allowlist on the first start (empty = the user's home);
    /// afterwards the persisted list in the state dir is authoritative.
    pub allow_dirs: Vec<PathBuf>,
    /// `--lock-dirs`: the allowlist is exactly `allow_dirs` (or the home)
    /// on every start, and the server's dirs add/remove are refused.
    pub lock_dirs: bool,
    /// PEM CA certificates trusted for `https://` servers besides the
    /// system's roots (`--ca-file`).
    pub ca_file: Option<PathBuf>,
}

/// Why the daemon stopped. Everything else is retried forever.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    BadServerUrl(#[from] BadServerUrl),
    #[error("bad token: the server refused it")]
    BadToken,
    /// The token is a `read` (or share) token: no scope change can make it
    /// run a daemon, so retrying is pointless.
    #[error("the token cannot run a daemon (its scope is read-only): give the daemon a `daemon` or `full` token")]
    TokenScope,
    #[error("the server does not know host {host_id} or it belongs to another user, even after registering again")]
    ForeignHost { host_id: String },
    #[error(
        "another daemon connected as host {host_id} and replaced this one (close 4000); this one stops rather \
         than take the host back in turns: run one daemon per host"
    )]
    Replaced { host_id: String },
    /// The state dir or a file in it is unusable, or an `--allow-dir` seed is.
    #[error(transparent)]
    State(#[from] StateError),
    /// The `--ca-file` cannot be used.
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
}

/// Runs the daemon: registers the host if needed, then keeps a connection
/// to the server forever. Returns only on a fatal error (bad token, a host
/// the server refuses even after re-registering, another daemon that took
/// the host over, unusable state dir).
///
/// The future is `!Send` and spawns local tasks: poll it inside a tokio
/// `LocalSet`, e.g. an actix `System` (`actix_rt::System::new().block_on(..)`
/// or `actix_rt::spawn` from inside one).
pub async fn run(opts: DaemonOptions) -> Result<(), DaemonError> {
    run_until(opts, std::future::pending()).await
}

/// Like [`run`], and stops when `stop` resolves (`tether daemon` passes
/// SIGTERM and SIGINT): its terminals are hung up, then killed after a
/// grace, their endings reported to the server when connected, and the
/// socket closed with 1000 (docs/PROTOCOL.md, "Stopping the daemon").
/// Returns `Ok` then.
pub async fn run_until(
    opts: DaemonOptions,
    stop: impl std::future::Future<Output = ()> + 'static,
) -> Result<(), DaemonError> {
    let stop = stop::Stop::when(stop);
    let server = server_url::ServerUrl::parse(&opts.server)?;
    let client = crate::tls::http_client(opts.ca_file.as_deref(), supervisor::HTTP_TIMEOUT)?;
    let state = state::StateDir::open(opts.state_dir)?;
    let dirs = if opts.lock_dirs { state.lock_dirs(&opts.allow_dirs)? } else { state.load_dirs(&opts.allow_dirs)? };
    tracing::info!(
        server = %server,
        state_dir = %state.path().display(),
        dirs = ?dirs.dirs(),
        lock_dirs = opts.lock_dirs,
        "tether_daemon_starting"
    );
    supervisor::Supervisor {
        client,
        server,
        token: opts.token,
        description: registration::HostDescription::of_this_machine(opts.name),
        host: host::Host::new(state.clone(), dirs, opts.lock_dirs, stop.clone()),
        state,
        stop,
    }
    .run()
    .await
}
