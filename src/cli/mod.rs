//! The everyday command line (docs/CLI.md): `tether login`, `hosts`, `ls`,
//! `open`, `attach`, `kill`, `rm`, `run`, `runs`, `logs`. Each command is a
//! thin layer over [`crate::client`]: resolve what the person typed, make
//! the calls, print a table (or `--json`, or `--quiet` ids), and turn
//! failures into messages that say what to do.
//!
//! Where the server and token come from, strongest first: `--server` /
//! `--token`, then `TETHER_SERVER` / `TETHER_TOKEN`, then what `tether login`
//! stored ([`login_config`]).
//!
//! Exit status: 0 on success, 2 for a usage or configuration error, 1
//! otherwise; `tether run` exits with the run's own code.

mod errors;
mod hosts;
mod login;
pub mod login_config;
mod output;
mod runs;
mod terminals;

use std::path::PathBuf;

use clap::{Args, Subcommand};

use crate::client::Client;
pub use errors::CliError;

/// Where to connect: on every client command.
#[derive(Debug, Clone, Args)]
pub struct Connection {
    /// The server's HTTP base URL, e.g. https://tether.example.com [default: from `tether login`]
    #[arg(long, value_name = "URL", env = "TETHER_SERVER")]
    pub server: Option<String>,
    /// An API token [default: from `tether login`]
    #[arg(long, value_name = "TOKEN", env = "TETHER_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// PEM CA certificates to trust for an https:// server, besides the system's roots.
    #[arg(long, value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
}

/// How to print: for listing commands.
#[derive(Debug, Clone, Copy, Args)]
pub struct Format {
    /// Print the API's resources as JSON.
    #[arg(long)]
    pub json: bool,
    /// Print ids only, one a line.
    #[arg(long, short, conflicts_with = "json")]
    pub quiet: bool,
}

#[derive(Debug, Subcommand)]
pub enum ClientCommand {
    /// Check a token against a server and store both for later commands.
    ///
    /// The token is asked for when not given (without echo on a terminal; a
    /// line of stdin otherwise). Server and token are stored with mode 0600
    /// in $XDG_CONFIG_HOME/tether/login.json (default ~/.config).
    Login {
        /// The server's HTTP base URL, e.g. https://tether.example.com.
        #[arg(long, value_name = "URL")]
        server: String,
        /// An API token (`tether token create`); prompted for when absent.
        #[arg(long, value_name = "TOKEN", env = "TETHER_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// PEM CA certificates to trust for an https:// server, besides the system's roots.
        #[arg(long, value_name = "FILE")]
        ca_file: Option<PathBuf>,
    },
    /// Forget the stored server and token.
    Logout,
    /// List your hosts: name, state, platform, last seen.
    Hosts {
        #[command(flatten)]
        connection: Connection,
        #[command(flatten)]
        format: Format,
    },
    /// List terminals (of one host, by name or id prefix): id, host, state, size, title, started.
    Ls {
        /// Only this host's terminals (name or id prefix).
        host: Option<String>,
        #[command(flatten)]
        connection: Connection,
        #[command(flatten)]
        format: Format,
    },
    /// Start a terminal on a host, sized to this window, and attach to it (detach with Ctrl-]).
    Open {
        /// The host, by name or id prefix.
        host: String,
        /// Directory to start in (an allowed dir of the host, or inside one).
        #[arg(long, value_name = "DIR")]
        dir: Option<String>,
        /// A title for the terminal.
        #[arg(long, value_name = "TITLE")]
        title: Option<String>,
        #[command(flatten)]
        connection: Connection,
        /// The command to run instead of the login shell.
        #[arg(last = true, value_name = "ARGV")]
        argv: Vec<String>,
    },
    /// Attach to a terminal in raw mode (detach with Ctrl-]).
    Attach {
        /// The terminal's id or a unique prefix of it.
        #[arg(value_name = "ID")]
        terminal_id: String,
        #[command(flatten)]
        connection: Connection,
    },
    /// Send a signal to a terminal's process (TERM by default).
    Kill {
        /// The terminal's id or a unique prefix of it.
        #[arg(value_name = "ID")]
        terminal: String,
        /// Signal name (TERM, KILL, HUP, INT, ...) or number.
        #[arg(long, short, value_name = "SIGNAL")]
        signal: Option<String>,
        #[command(flatten)]
        connection: Connection,
    },
    /// Delete an ended terminal.
    Rm {
        /// The terminal's id or a unique prefix of it.
        #[arg(value_name = "ID")]
        terminal: String,
        #[command(flatten)]
        connection: Connection,
    },
    /// Run a command on a host, stream its output, exit with its exit code.
    ///
    /// A command killed by signal N exits 128+N; a run lost with its host
    /// exits 1 with a message.
    Run {
        /// The host, by name or id prefix.
        host: String,
        /// Directory to run in (an allowed dir of the host, or inside one).
        #[arg(long, value_name = "DIR")]
        dir: Option<String>,
        /// Queue the run, print its id and return at once.
        #[arg(long, short)]
        detach: bool,
        #[command(flatten)]
        connection: Connection,
        /// With --detach: print the run resource as JSON.
        #[arg(long)]
        json: bool,
        /// The command and its arguments.
        #[arg(last = true, required = true, value_name = "ARGV")]
        argv: Vec<String>,
    },
    /// List runs: id, host, state, exit code, command, created.
    Runs {
        #[command(flatten)]
        connection: Connection,
        #[command(flatten)]
        format: Format,
    },
    /// Print a run's captured output.
    Logs {
        /// The run's id or a unique prefix of it.
        #[arg(value_name = "RUN_ID")]
        run: String,
        /// Keep printing output as it comes until the run ends.
        #[arg(long, short)]
        follow: bool,
        #[command(flatten)]
        connection: Connection,
    },
}

/// Runs one client command.
pub async fn run(command: ClientCommand) -> Result<(), CliError> {
    match command {
        ClientCommand::Login { server, token, ca_file } => login::login(&server, token, ca_file).await,
        ClientCommand::Logout => login::logout(),
        ClientCommand::Hosts { connection, format } => hosts::hosts(&connect(&connection)?, format).await,
        ClientCommand::Ls { host, connection, format } => {
            hosts::ls(&connect(&connection)?, host.as_deref(), format).await
        }
        ClientCommand::Open { host, dir, title, connection, argv } => {
            terminals::open(&connect(&connection)?, &connection, &host, dir, title, argv).await
        }
        ClientCommand::Attach { terminal_id, connection } => {
            terminals::attach(&connect(&connection)?, &connection, &terminal_id).await
        }
        ClientCommand::Kill { terminal, signal, connection } => {
            terminals::kill(&connect(&connection)?, &terminal, signal.as_deref()).await
        }
        ClientCommand::Rm { terminal, connection } => terminals::rm(&connect(&connection)?, &terminal).await,
        ClientCommand::Run { host, dir, detach, connection, json, argv } => {
            runs::run(&connect(&connection)?, &host, dir, detach, json, argv).await
        }
        ClientCommand::Runs { connection, format } => runs::runs(&connect(&connection)?, format).await,
        ClientCommand::Logs { run, follow, connection } => runs::logs(&connect(&connection)?, &run, follow).await,
    }
}

/// A client the way the commands make one, for programs without flags:
/// `TETHER_SERVER` / `TETHER_TOKEN`, then the stored login.
pub fn client_from_environment() -> Result<Client, CliError> {
    let from_env = |key: &str| std::env::var(key).ok();
    connect(&Connection { server: from_env("TETHER_SERVER"), token: from_env("TETHER_TOKEN"), ca_file: None })
}

/// The client for a command: flags and environment first (clap merges
/// those two), then the stored login.
fn connect(connection: &Connection) -> Result<Client, CliError> {
    let (server, token) = login_config::effective(connection.server.as_deref(), connection.token.as_deref())?;
    Client::new(&server, &token, connection.ca_file.as_deref()).map_err(|e| errors::explain(e, &server))
}
