//! The everyday command line (docs/CLI.md): `tether login`, `hosts`, `ls`,
//! `open`, `attach`, `share`, `kill`, `rm`, `run`, `runs`, `logs`. Each command is a
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

mod detach_key;
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
pub use output::print_stdout;

/// Where to connect: on every client command.
#[derive(Debug, Clone, Args)]
pub struct Connection {
    /// The server's HTTP base URL, e.g. https://tether.example.com [default: from `tether login`]
    #[arg(long, value_name = "URL", env = "TETHER_SERVER", hide_env_values = true)]
    pub server: Option<String>,
    /// An API token [default: from `tether login`]
    #[arg(long, value_name = "TOKEN", env = "TETHER_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// PEM CA certificates to trust for an https:// server, besides the system's roots.
    #[arg(long, value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
}

/// The key that leaves the terminal running: on `open` and `attach`.
#[derive(Debug, Clone, Copy, Args)]
pub struct Detach {
    /// The key that detaches (ctrl-X, C-X or ^X), when the program inside needs Ctrl-].
    #[arg(long = "detach-key", value_name = "KEY", default_value = "ctrl-]", value_parser = detach_key::DetachKey::parse)]
    pub key: detach_key::DetachKey,
}

/// How to print: on every command that prints something.
#[derive(Debug, Clone, Copy, Args)]
pub struct Format {
    /// Print the API's resources as JSON.
    #[arg(long)]
    pub json: bool,
    /// Print ids only, one a line (for `run` and `logs`: the output only).
    #[arg(long, short, conflicts_with = "json")]
    pub quiet: bool,
}

#[derive(Debug, Subcommand)]
pub enum ClientCommand {
    /// Check a token against a server and store both for later commands.
    ///
    /// The token is asked for when not given (without echo on a terminal; a
    /// line of stdin otherwise). Server and token are stored with mode 0600
    /// in $XDG_CONFIG_HOME/tether/login.json (default ~/.config). A refused
    /// token stores nothing.
    #[command(after_long_help = "Examples:
  tether login --server https://tether.example.com
  echo \"$TOKEN\" | tether login --server http://127.0.0.1:8080")]
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
    ///
    /// Removes $XDG_CONFIG_HOME/tether/login.json; the token itself stays
    /// valid on the server.
    #[command(after_long_help = "Examples:
  tether logout")]
    Logout,
    /// List your hosts: name, state, platform, last seen.
    ///
    /// A host is a machine running `tether daemon` with one of your tokens;
    /// it is online while its daemon is connected to any instance.
    #[command(after_long_help = "Examples:
  tether hosts
  tether hosts --json | jq -r '.hosts[] | select(.state == \"online\") | .name'")]
    Hosts {
        #[command(flatten)]
        connection: Connection,
        #[command(flatten)]
        format: Format,
    },
    /// List terminals (of one host, by name or id prefix): id, host, state, size, title, started.
    ///
    /// Ids are shown as their first 8 hex digits; any unique prefix works
    /// wherever an id is asked for.
    #[command(after_long_help = "Examples:
  tether ls
  tether ls laptop
  tether ls -q | xargs -n1 tether kill")]
    Ls {
        /// Only this host's terminals (name or id prefix).
        host: Option<String>,
        #[command(flatten)]
        connection: Connection,
        #[command(flatten)]
        format: Format,
    },
    /// Start a terminal on a host, sized to this window, and attach to it (detach with Ctrl-] or --detach-key).
    ///
    /// The terminal outlives the connection: after a detach (Ctrl-]) it keeps
    /// running, and `tether attach ID` comes back to it. With --json or
    /// --quiet the terminal is started and printed (the resource, or its id)
    /// and the command returns without attaching.
    #[command(after_long_help = "Examples:
  tether open laptop
  tether open laptop --dir ~/src -- htop
  id=$(tether open laptop -q -- make watch) && tether attach \"$id\"")]
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
        #[command(flatten)]
        format: Format,
        #[command(flatten)]
        detach: Detach,
        /// The command to run instead of the login shell.
        #[arg(last = true, value_name = "ARGV")]
        argv: Vec<String>,
    },
    /// Attach to a terminal in raw mode (detach with Ctrl-] or --detach-key).
    ///
    /// Shows the screen as it is, then the live output; keys go to the
    /// terminal. The window's size is offered to the terminal; another
    /// viewer in use keeps the grid until it goes idle.
    #[command(after_long_help = "Examples:
  tether attach 3fa9
  tether attach 3fa9c1d2-0b6e-4c55-9d1f-6f0f1a2b3c4d
  tether attach 3fa9 --detach-key ctrl-q")]
    Attach {
        /// The terminal's id or a unique prefix of it.
        #[arg(value_name = "ID")]
        terminal_id: String,
        #[command(flatten)]
        connection: Connection,
        #[command(flatten)]
        detach: Detach,
    },
    /// Share a terminal read-only: print a token that can watch it and nothing else.
    ///
    /// The token (a share token: read-only, this one terminal) is printed
    /// alone on stdout, its id and expiry on stderr. Whoever has it can
    /// watch the terminal with `tether attach` or on the web page, but not
    /// type into it, resize it, or see anything else of yours. It expires
    /// after --ttl (default 24h) and dies with the terminal; revoke it
    /// sooner with `DELETE /api/v1/tokens/ID`. --json prints the token
    /// resource and its secret (`{"token":{...},"secret":"tth_..."}`).
    #[command(after_long_help = "Examples:
  tether share 3fa9
  tether share 3fa9 --ttl 30m --name \"for bob\"")]
    Share {
        /// The terminal's id or a unique prefix of it.
        #[arg(value_name = "ID")]
        terminal: String,
        /// How long the token lives: a number and s, m, h or d (at most 3650d) [default: 24h].
        #[arg(long, value_name = "TTL", value_parser = crate::auth::parse_ttl)]
        ttl: Option<std::time::Duration>,
        /// A label for the token, shown in token lists.
        #[arg(long, value_name = "LABEL")]
        name: Option<String>,
        #[command(flatten)]
        connection: Connection,
        /// Print the token resource and its secret as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Send a signal to a terminal's process (HUP by default, as closing a terminal does).
    ///
    /// The terminal stays running until its process really exits. --json
    /// prints the terminal as the server answered the kill; --quiet its id.
    #[command(after_long_help = "Examples:
  tether kill 3fa9
  tether kill 3fa9 --signal KILL
  tether kill 3fa9 -s 2")]
    Kill {
        /// The terminal's id or a unique prefix of it.
        #[arg(value_name = "ID")]
        terminal: String,
        /// Signal name (TERM, KILL, HUP, INT, ...) or number.
        #[arg(long, short, value_name = "SIGNAL")]
        signal: Option<String>,
        #[command(flatten)]
        connection: Connection,
        #[command(flatten)]
        format: Format,
    },
    /// Delete an ended terminal.
    ///
    /// A running terminal is refused: `tether kill` it first. --json prints
    /// the terminal as it was just before it was deleted; --quiet its id.
    #[command(after_long_help = "Examples:
  tether rm 3fa9
  tether ls --json | jq -r '.terminals[] | select(.state == \"exited\") | .id' | xargs -n1 tether rm")]
    Rm {
        /// The terminal's id or a unique prefix of it.
        #[arg(value_name = "ID")]
        terminal: String,
        #[command(flatten)]
        connection: Connection,
        #[command(flatten)]
        format: Format,
    },
    /// Run a command on a host, stream its output, exit with its exit code.
    ///
    /// The output is written to stdout as it comes, every byte once and in
    /// order. A command killed by signal N exits 128+N; a run lost with its
    /// host, or one that could not start, exits 1 with a message.
    /// Ctrl-C sends SIGINT to the command; a second Ctrl-C stops watching.
    /// --detach prints the run's id (--json: the run) and returns at once;
    /// without it, --json prints the finished run with its output
    /// (`{"run":{...},"log":"..."}`) instead of streaming, and --quiet
    /// streams the output with no notes on stderr.
    #[command(after_long_help = "Examples:
  tether run laptop -- make test
  tether run laptop --dir ~/src -- sh -c 'git pull && cargo build'
  id=$(tether run laptop --detach -- ./backup.sh) && tether logs --follow \"$id\"")]
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
        #[command(flatten)]
        format: Format,
        /// The command and its arguments.
        #[arg(last = true, required = true, value_name = "ARGV")]
        argv: Vec<String>,
    },
    /// List runs: id, host, state, exit code, command, created.
    #[command(after_long_help = "Examples:
  tether runs
  tether runs --json | jq '.runs[] | {id, state, exitCode, usage}'")]
    Runs {
        #[command(flatten)]
        connection: Connection,
        #[command(flatten)]
        format: Format,
    },
    /// Print a run's captured output.
    ///
    /// Without --follow: the output stored so far. With --follow: the stored
    /// output, then the live output until the run ends, with no gap and no
    /// byte twice. --json prints the run with its output
    /// (`{"run":{...},"log":"..."}`, after the end with --follow); --quiet
    /// prints the output with no notes on stderr.
    #[command(after_long_help = "Examples:
  tether logs 7c2e
  tether logs --follow 7c2e
  tether logs --json 7c2e | jq -r .log")]
    Logs {
        /// The run's id or a unique prefix of it.
        #[arg(value_name = "RUN_ID")]
        run: String,
        /// Keep printing output as it comes until the run ends.
        #[arg(long, short)]
        follow: bool,
        #[command(flatten)]
        connection: Connection,
        #[command(flatten)]
        format: Format,
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
        ClientCommand::Open { host, dir, title, connection, format, detach, argv } => {
            let new = terminals::Open { host, dir, title, argv };
            terminals::open(&connect(&connection)?, &connection, new, format, detach.key).await
        }
        ClientCommand::Attach { terminal_id, connection, detach } => {
            terminals::attach(&connect(&connection)?, &connection, &terminal_id, detach.key).await
        }
        ClientCommand::Share { terminal, ttl, name, connection, json } => {
            terminals::share(&connect(&connection)?, &terminal, ttl, name, json).await
        }
        ClientCommand::Kill { terminal, signal, connection, format } => {
            terminals::kill(&connect(&connection)?, &terminal, signal.as_deref(), format).await
        }
        ClientCommand::Rm { terminal, connection, format } => {
            terminals::rm(&connect(&connection)?, &terminal, format).await
        }
        ClientCommand::Run { host, dir, detach, connection, format, argv } => {
            runs::run(&connect(&connection)?, &host, dir, detach, format, argv).await
        }
        ClientCommand::Runs { connection, format } => runs::runs(&connect(&connection)?, format).await,
        ClientCommand::Logs { run, follow, connection, format } => {
            runs::logs(&connect(&connection)?, &run, follow, format).await
        }
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
