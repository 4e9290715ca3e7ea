//! The `tether` command line: parses arguments, loads settings and calls
//! into the library; the everyday client commands live in `tether::cli`
//! (docs/CLI.md). Exit status: 0 success, 2 usage or configuration error,
//! 1 anything else (`tether run`: the run's own code).

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory as _, Parser, Subcommand};
use tether::cli::print_stdout;
use tether::config::Settings;
use tether::http::state::Role;
use tether::store::{AuditAction, Revocation};
use uuid::Uuid;

#[derive(Parser)]
#[command(name = "tether", version, about = "A horizontally scaled terminal relay")]
struct Cli {
    /// TOML settings file (also `TETHER_CONFIG`).
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    // The everyday commands first: they are what `tether --help` is read for.
    #[command(flatten)]
    Client(tether::cli::ClientCommand),
    /// Run an API/relay instance.
    ///
    /// Serves the REST API, the viewer and daemon sockets and the web page.
    /// With no `database.url` and no `redis.url` it runs a single instance on
    /// an embedded SQLite file (./tether.db) and an in-process bus; with
    /// PostgreSQL and Redis any number of instances form one cluster.
    #[command(after_long_help = "Examples:
  tether serve --demo
  tether serve --listen 0.0.0.0:8080 --config /etc/tether/tether.toml
  TETHER_DATABASE__URL=postgres://tether@db/tether TETHER_REDIS__URL=redis://redis tether serve")]
    Serve {
        /// What this instance serves.
        #[arg(long, value_enum, default_value = "combined")]
        role: Role,
        /// Listen address (setting `http.listen`).
        #[arg(long, value_name = "ADDR")]
        listen: Option<String>,
        /// Also run a daemon in this process, with a demo user, token and shell terminal.
        #[arg(long)]
        demo: bool,
        /// Serve the web page from this directory (a built web/dist) instead of
        /// the embedded copy (setting `http.web_dir`); for developing the page.
        #[arg(long, value_name = "DIR")]
        web_dir: Option<PathBuf>,
    },
    /// Run the host daemon: host PTY terminals for the server.
    ///
    /// Dials the server, registers this machine as a host of the token's
    /// user and runs the terminals and runs started on it. It reconnects by
    /// itself; terminals keep running while the server is away. SIGTERM or
    /// SIGINT ends its terminals (SIGHUP, then SIGKILL after 3 s), reports
    /// their endings and exits 0.
    #[command(after_long_help = "Examples:
  tether daemon --server https://tether.example.com --token \"$TOKEN\"
  tether daemon --server http://127.0.0.1:8080 --token \"$TOKEN\" --name laptop --allow-dir ~/src")]
    Daemon {
        /// The server's HTTP base URL, e.g. http://127.0.0.1:8080.
        #[arg(long, value_name = "URL")]
        server: String,
        /// An API token of the user who owns this host (a `daemon` token is best).
        /// Prefer TETHER_TOKEN or --token-file: every local user can read a
        /// command line.
        #[arg(long, value_name = "TOKEN", env = "TETHER_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// Read the token from this file (mode 0600; refused when group or
        /// others may read it). Wins over --token and TETHER_TOKEN.
        #[arg(long, value_name = "PATH")]
        token_file: Option<PathBuf>,
        /// Display name of this host (default: its hostname).
        #[arg(long, value_name = "NAME")]
        name: Option<String>,
        /// Where the host id, allowed dirs and credentials file live.
        #[arg(long, value_name = "DIR")]
        state_dir: Option<PathBuf>,
        /// A directory terminals may start in (repeatable; default: your home).
        /// Seeds the allowlist on first start only.
        #[arg(long = "allow-dir", value_name = "DIR")]
        allow_dirs: Vec<PathBuf>,
        /// Refuse the server's changes to the allowed dirs: the list is the
        /// --allow-dir flags (default: your home) on every start.
        #[arg(long)]
        lock_dirs: bool,
        /// PEM CA certificates to trust for an https:// server, besides the system's roots.
        #[arg(long, value_name = "FILE")]
        ca_file: Option<PathBuf>,
    },
    /// Apply database migrations and exit.
    ///
    /// Applying is idempotent; a database whose schema is newer than this
    /// binary is refused. `serve` also migrates at start.
    #[command(after_long_help = "Examples:
  tether migrate
  TETHER_DATABASE__URL=postgres://tether@db/tether tether migrate")]
    Migrate,
    /// Manage API tokens.
    ///
    /// Operator commands against the database (run where the server's
    /// settings are); only the token's SHA-256 is stored.
    #[command(after_long_help = "Examples:
  tether token create --user ann")]
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// Operate relay cells: the admit-mode switch and the connection budget.
    ///
    /// Operator commands against the database (run where the server's
    /// settings are); docs/CELLS.md explains the modes and the budget.
    #[command(after_long_help = "Examples:
  tether cell set --cell relay-7 --admit-mode reserve --dead-man-trip-slots 2
  tether cell budget")]
    Cell {
        #[command(subcommand)]
        command: CellCommand,
    },
    /// Print a shell completion script (e.g. `tether completions bash`).
    ///
    /// The script completes subcommands and flags; load it in the shell's
    /// start-up file.
    #[command(after_long_help = "Examples:
  tether completions bash > ~/.local/share/bash-completion/completions/tether
  tether completions zsh > \"${fpath[1]}/_tether\"
  tether completions fish > ~/.config/fish/completions/tether.fish")]
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Create a token for a user (created if needed); prints the token alone on stdout.
    ///
    /// Everything else goes to stderr, so the token can be captured.
    #[command(after_long_help = "Examples:
  tether token create --user ann
  TOKEN=$(tether token create --user ann)")]
    Create {
        /// The user the token belongs to (created if needed).
        #[arg(long, value_name = "NAME")]
        user: String,
        /// What the token may do: full, daemon (dial and register one host) or read.
        #[arg(long, value_enum, default_value = "full")]
        scope: tether::store::TokenScope,
        /// Lifetime: a number and s, m, h or d (90s, 30m, 12h, 30d); default: no expiry.
        #[arg(long, value_name = "TTL", value_parser = tether::auth::parse_ttl)]
        ttl: Option<std::time::Duration>,
        /// A label shown by `token list`.
        #[arg(long, value_name = "LABEL")]
        name: Option<String>,
        /// Bind a daemon token to this host id now (else: the first host it registers).
        #[arg(long, value_name = "ID")]
        host: Option<uuid::Uuid>,
    },
    /// List a user's tokens: id, label, scope, created, expires, last used (never a secret).
    ///
    /// Revoked and expired tokens are listed too, so they can be told apart
    /// from the ones still in use. Works on the database directly.
    #[command(after_long_help = "Examples:
  tether token list --user ann")]
    List {
        /// Whose tokens.
        #[arg(long, value_name = "NAME")]
        user: String,
    },
    /// Revoke a token: refused at once, its open sockets closed 4401 within a second.
    ///
    /// Every instance checks its open sockets' tokens every
    /// auth.revocation_check_ms, so a revoked token's viewers and daemons are
    /// closed wherever they are connected.
    #[command(after_long_help = "Examples:
  tether token list --user ann
  tether token revoke 0b7e6f52-3c1d-4a0e-9f1e-2d3c4b5a6978")]
    Revoke {
        /// The token's id (from `token list`).
        id: uuid::Uuid,
    },
}

#[derive(Subcommand)]
enum CellCommand {
    /// Write a cell's switch and print it: mode, slot cap, generation.
    ///
    /// Every write bumps the switch's generation, a write without flags too:
    /// that re-arms a cell whose dead-man trip is latched. The cell reads
    /// its switch every cell.switch_poll_ms (5 s).
    #[command(after_long_help = "Examples:
  tether cell set --cell relay-7 --admit-mode reserve --dead-man-trip-slots 2
  tether cell set --cell relay-7 --dead-man-trip-slots none
  tether cell set --cell relay-7    # re-arm a latched trip")]
    Set {
        /// The cell's id (setting `cell.id` of its instances).
        #[arg(long, value_name = "ID")]
        cell: String,
        /// db: every hello is checked in the database; reserve: booked hosts
        /// are admitted from memory (a new switch row without it: db).
        #[arg(long, value_enum)]
        admit_mode: Option<tether::cell::AdmitMode>,
        /// How many reserve cells may be tripped at once, 0 to 64, or none
        /// (trip at once, no cap).
        #[arg(long, value_name = "N|none", value_parser = parse_trip_slots, allow_negative_numbers = true)]
        dead_man_trip_slots: Option<TripSlots>,
    },
    /// Print the fleet's worst-case database connections in a director outage.
    ///
    /// From the registered cells' pools and their switches: without a slot
    /// cap every reserve cell at its full pool; with a cap of N, every cell
    /// at its own pool plus the N largest steps from reserve to full pool.
    #[command(after_long_help = "Examples:
  tether cell budget
  TETHER_DATABASE__URL=postgres://tether@db/tether tether cell budget")]
    Budget,
}

/// `--dead-man-trip-slots`: a cap, or none.
#[derive(Debug, Clone, Copy)]
struct TripSlots(Option<u8>);

fn parse_trip_slots(text: &str) -> Result<TripSlots, String> {
    use tether::store::MAX_TRIP_SLOTS;
    if text == "none" {
        return Ok(TripSlots(None));
    }
    match text.parse::<u8>() {
        Ok(n) if n <= MAX_TRIP_SLOTS => Ok(TripSlots(Some(n))),
        _ => Err(format!("`{text}` is not a slot count: use a number from 0 to {MAX_TRIP_SLOTS}, or none")),
    }
}

/// A failure with the exit status it maps to.
struct Failure {
    status: u8,
    message: String,
}

impl Failure {
    fn config(message: impl ToString) -> Self {
        Self { status: 2, message: message.to_string() }
    }
    fn runtime(message: impl ToString) -> Self {
        Self { status: 1, message: message.to_string() }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The client commands talk to people: only warnings unless RUST_LOG asks.
    let default_filter = match cli.command {
        Command::Client(_) | Command::Completions { .. } => "warn",
        _ => "info",
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| default_filter.into()),
        )
        .init();
    match actix_web::rt::System::new().block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            if !failure.message.is_empty() {
                eprintln!("tether: {}", failure.message);
            }
            ExitCode::from(failure.status)
        }
    }
}

/// The database the settings name, for messages: PostgreSQL (never its
/// URL, which may hold a password) or the SQLite file's absolute path.
fn database_named(settings: &Settings) -> String {
    match &settings.database.url {
        Some(_) => "PostgreSQL".to_owned(),
        None => format!("embedded SQLite at {}", sqlite_path(settings).display()),
    }
}

/// The SQLite file, absolute (relative paths are the working directory's).
fn sqlite_path(settings: &Settings) -> PathBuf {
    let path = &settings.database.sqlite_path;
    std::path::absolute(path).unwrap_or_else(|_| path.clone())
}

/// Resolves at the first SIGTERM or SIGINT (the daemon's stop); never, if
/// the handlers cannot be installed (the signals then end the process).
async fn stop_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
        (Ok(mut terminate), Ok(mut interrupt)) => {
            tokio::select! {
                _ = terminate.recv() => {}
                _ = interrupt.recv() => {}
            }
        }
        _ => std::future::pending().await,
    }
}

async fn run(cli: Cli) -> Result<(), Failure> {
    // Client commands talk to a server; they need none of its settings.
    // A --config (or TETHER_CONFIG) given to one is still checked (a file
    // that is missing or not valid settings is exit 2, as for every
    // subcommand), not ignored.
    let cli = match cli.command {
        Command::Client(command) => {
            if cli.config.is_some() || std::env::var_os("TETHER_CONFIG").is_some() {
                Settings::load_with(cli.config.as_deref(), &[]).map_err(Failure::config)?;
            }
            return tether::cli::run(command)
                .await
                .map_err(|e| Failure { status: e.status, message: e.message.unwrap_or_default() });
        }
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "tether", &mut std::io::stdout());
            return Ok(());
        }
        command => Cli { command, ..cli },
    };
    // Flags are the top layer of the settings.
    let mut flags: Vec<(&str, String)> = Vec::new();
    if let Command::Serve { listen, web_dir, .. } = &cli.command {
        if let Some(listen) = listen {
            flags.push(("http.listen", listen.clone()));
        }
        if let Some(dir) = web_dir {
            flags.push(("http.web_dir", dir.display().to_string()));
        }
    }
    let settings = Settings::load_with(cli.config.as_deref(), &flags).map_err(Failure::config)?;
    match cli.command {
        Command::Serve { role, demo, .. } => serve(settings, role, demo).await,
        Command::Daemon { server, token, token_file, name, state_dir, allow_dirs, lock_dirs, ca_file } => {
            let token = match (token_file, token) {
                (Some(path), _) => tether::daemon::read_token_file(&path).map_err(Failure::config)?,
                (None, Some(token)) => token,
                (None, None) => {
                    return Err(Failure::config("a token is needed: set TETHER_TOKEN or pass --token-file PATH"))
                }
            };
            let options = tether::daemon::DaemonOptions {
                server,
                token,
                name,
                state_dir: state_dir.unwrap_or_else(tether::daemon::default_state_dir),
                allow_dirs,
                lock_dirs,
                ca_file,
            };
            tether::daemon::run_until(options, stop_signal()).await.map_err(|e| match e {
                // A --server that is not an http(s) base URL is a usage error,
                // as it is for the client commands.
                tether::daemon::DaemonError::BadServerUrl(_) => Failure::config(format!("--server: {e}")),
                tether::daemon::DaemonError::Tls(_) => Failure::config(e),
                // An --allow-dir that is missing or not a directory (or no
                // home to default to) is the command line's to fix.
                tether::daemon::DaemonError::State(tether::daemon::StateError::Dirs(_)) => Failure::config(e),
                other => Failure::runtime(other),
            })
        }
        // Answered above, before any settings were loaded.
        Command::Client(_) | Command::Completions { .. } => Ok(()),
        Command::Migrate => {
            let store = tether::store::open_unmigrated(&settings).await.map_err(Failure::runtime)?;
            let applied = store.migrate().await.map_err(Failure::runtime)?;
            let version = store.schema_version().await.map_err(Failure::runtime)?;
            eprintln!("tether: {applied} migration(s) applied; {} schema at version {version}", store.backend());
            Ok(())
        }
        Command::Token { command } => token_command(&settings, command).await,
        Command::Cell { command } => cell_command(&settings, command).await,
    }
}

/// `tether cell set|budget` against the database (docs/CELLS.md, "Operating the switch").
async fn cell_command(settings: &Settings, command: CellCommand) -> Result<(), Failure> {
    match command {
        CellCommand::Set { cell, admit_mode, dead_man_trip_slots } => {
            let cell = cell.trim().to_string();
            if !tether::config::valid_cell_id(&cell) {
                return Err(Failure::config(
                    "--cell must be a cell id: 1 to 128 characters without `#`, `/`, spaces or control characters",
                ));
            }
            let store = tether::store::open_current(settings).await.map_err(Failure::runtime)?;
            let switch = store
                .set_cell_switch(&cell, admit_mode, dead_man_trip_slots.map(|s| s.0))
                .await
                .map_err(Failure::runtime)?;
            let registered = store.list_cells().await.map_err(Failure::runtime)?;
            if !registered.iter().any(|v| v.cell.cell_id == cell) {
                eprintln!("tether: warning: no cell `{cell}` has registered yet; it reads this switch when it starts");
            }
            let slots = switch.dead_man_trip_slots.map_or("none".to_string(), |n| n.to_string());
            print_stdout(&format!(
                "cell        {}\nadmit mode  {}\ntrip slots  {slots}\ngeneration  {}\n",
                switch.cell_id, switch.admit_mode, switch.generation
            ));
            Ok(())
        }
        CellCommand::Budget => {
            use tether::cell::budget::{worst_case, BudgetCell};
            let store = tether::store::open_current(settings).await.map_err(Failure::runtime)?;
            let cells = store.list_cells().await.map_err(Failure::runtime)?;
            let cells: Vec<BudgetCell> = cells.iter().map(BudgetCell::from).collect();
            print_stdout(&worst_case(&cells).to_string());
            Ok(())
        }
    }
}

/// `token list`: one aligned line per token, never a secret.
fn token_table(tokens: &[tether::store::ApiToken], now: chrono::DateTime<chrono::Utc>) -> String {
    let when = |t: Option<chrono::DateTime<chrono::Utc>>, none: &str| {
        t.map_or(none.to_string(), |t| t.format("%Y-%m-%d %H:%M:%SZ").to_string())
    };
    let mut rows = vec![["ID", "LABEL", "SCOPE", "STATE", "CREATED", "EXPIRES", "LAST USED"].map(String::from)];
    for t in tokens {
        let state = match (t.revoked_at, t.expires_at) {
            (Some(_), _) => "revoked",
            (None, Some(e)) if e <= now => "expired",
            _ => "active",
        };
        let scope = match t.terminal_id {
            Some(terminal) => format!("read (share {terminal})"),
            None => t.scope.to_string(),
        };
        rows.push([
            t.id.to_string(),
            t.name.clone().unwrap_or_else(|| "-".into()),
            scope,
            state.to_string(),
            when(Some(t.created_at), "-"),
            when(t.expires_at, "never"),
            when(t.last_used_at, "never"),
        ]);
    }
    let widths: Vec<usize> = (0..7).map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for row in rows {
        let cells: Vec<String> = row.iter().zip(&widths).map(|(cell, w)| format!("{cell:<w$}")).collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// Checks a `--user` name.
fn user_name(user: &str) -> Result<String, Failure> {
    let user = user.trim().to_string();
    if user.is_empty() || user.len() > 128 || user.chars().any(char::is_control) {
        return Err(Failure::config(
            "--user must be a non-empty name of at most 128 bytes, without control characters",
        ));
    }
    Ok(user)
}

/// Records an operator's change to a user's token in that user's audit
/// log, as the API records the user's own (docs/SECURITY.md, "Audit"),
/// with `instanceId` `cli` and no acting token. The change is made
/// already: a failed write is reported, not fatal.
async fn audit_operator(store: &dyn tether::store::Store, user_id: Uuid, action: AuditAction, token_id: Uuid) {
    let event = tether::store::NewAuditEvent {
        at: chrono::Utc::now(),
        user_id,
        token_id: None,
        action,
        host_id: None,
        terminal_id: None,
        instance_id: "cli".to_string(),
        detail: Some(format!("token {token_id}")),
    };
    if let Err(e) = store.insert_audit_events(&[event]).await {
        eprintln!("tether: warning: the audit log did not take the {} event: {e}", action.as_str());
    }
}

/// `tether token create|list|revoke` against the database (docs/CLI.md, "Tokens").
async fn token_command(settings: &Settings, command: TokenCommand) -> Result<(), Failure> {
    use tether::store::{NewToken, TokenScope};
    match command {
        TokenCommand::Create { user, scope, ttl, name, host } => {
            let user = user_name(&user)?;
            if host.is_some() && scope != TokenScope::Daemon {
                return Err(Failure::config("--host binds a daemon token: add --scope daemon"));
            }
            let name = name.map(|n| n.trim().to_string()).filter(|n| !n.is_empty());
            if name.as_ref().is_some_and(|n| n.chars().count() > 128 || n.chars().any(char::is_control)) {
                return Err(Failure::config("--name must be at most 128 characters without control characters"));
            }
            let expires_at = match ttl {
                None => None,
                Some(ttl) => Some(
                    chrono::Duration::from_std(ttl)
                        .ok()
                        .and_then(|ttl| chrono::Utc::now().checked_add_signed(ttl))
                        .ok_or_else(|| Failure::config("--ttl is too long"))?,
                ),
            };
            let store = tether::store::open_current(settings).await.map_err(Failure::runtime)?;
            // A token bound to a host is for a user who has it: nobody is
            // created for a refusal.
            let user = match host {
                Some(host) => {
                    let found = store.user_by_name(&user).await.map_err(Failure::runtime)?;
                    let owner = match found {
                        Some(u) if store.get_host(u.id, host).await.map_err(Failure::runtime)?.is_some() => Some(u),
                        _ => None,
                    };
                    owner.ok_or_else(|| Failure::runtime(format!("user `{user}` has no host {host}")))?
                }
                None => store.ensure_user(&user).await.map_err(Failure::runtime)?,
            };
            let secret = tether::auth::generate_token();
            let new = NewToken {
                name,
                scope,
                expires_at,
                host_id: host,
                ..NewToken::full(user.id, &tether::auth::hash_token(&secret))
            };
            let token = store.insert_token(&new).await.map_err(Failure::runtime)?;
            audit_operator(store.as_ref(), user.id, AuditAction::TokenCreated, token.id).await;
            let expires = token.expires_at.map_or("never".to_string(), |e| e.to_rfc3339());
            eprintln!(
                "tether: {scope} token {} created for user `{}` in {} (expires: {expires}); it is shown only once",
                token.id,
                user.name,
                database_named(settings)
            );
            // The one time the secret is shown: not printing it is a failure.
            let mut stdout = std::io::stdout().lock();
            writeln!(stdout, "{secret}")
                .and_then(|()| stdout.flush())
                .map_err(|e| Failure::runtime(format!("cannot print the token: {e}")))
        }
        TokenCommand::List { user } => {
            let user = user_name(&user)?;
            let store = tether::store::open_current(settings).await.map_err(Failure::runtime)?;
            // An unknown user has no tokens; listing creates nobody.
            let tokens = match store.user_by_name(&user).await.map_err(Failure::runtime)? {
                Some(user) => store.list_tokens(user.id).await.map_err(Failure::runtime)?,
                None => Vec::new(),
            };
            print_stdout(&token_table(&tokens, chrono::Utc::now()));
            Ok(())
        }
        TokenCommand::Revoke { id } => {
            let store = tether::store::open_current(settings).await.map_err(Failure::runtime)?;
            match store.revoke_token(None, id).await.map_err(Failure::runtime)? {
                None => return Err(Failure::runtime(format!("no token with id {id}"))),
                Some(Revocation::Now { user_id }) => {
                    audit_operator(store.as_ref(), user_id, AuditAction::TokenRevoked, id).await;
                }
                Some(Revocation::Earlier) => {}
            }
            eprintln!("tether: token {id} revoked; its open sockets close within a second");
            Ok(())
        }
    }
}

async fn serve(settings: Settings, role: Role, demo: bool) -> Result<(), Failure> {
    if demo && role == Role::Director {
        return Err(Failure::config(
            "--demo runs a daemon and a terminal here, and a director serves neither: drop --role director",
        ));
    }
    let scheme = if settings.http.tls_cert_path.is_some() { "https" } else { "http" };
    let backend = database_named(&settings);
    // `token create` must open the same database: a relative SQLite path
    // run from another directory would make (and fill) a new one.
    let token_hint = match &settings.database.url {
        Some(_) => "tether token create --user NAME (with this server's database.url)".to_owned(),
        None => {
            format!("TETHER_DATABASE__SQLITE_PATH={} tether token create --user NAME", sqlite_path(&settings).display())
        }
    };
    let bound = tether::server::bind(settings, role).await.map_err(|e| match e {
        tether::server::ServeError::Config(e) => Failure::config(e),
        tether::server::ServeError::Tls(e) => Failure::config(e),
        tether::server::ServeError::Director(e) => Failure::config(e),
        other => Failure::runtime(other),
    })?;
    for addr in &bound.addrs {
        match role {
            Role::Director => print_stdout(&format!(
                "tether: director listening on {scheme}://{addr} ({backend}); it serves POST /v1/assign\n"
            )),
            _ => print_stdout(&format!(
                "tether: listening on {scheme}://{addr} ({backend}); the web page is at {scheme}://{addr}/\n"
            )),
        }
    }
    for addr in &bound.metrics_addrs {
        print_stdout(&format!("tether: /metrics is served on http://{addr}/metrics only\n"));
    }
    if demo {
        let base = bound.addrs.first().map(|a| format!("{scheme}://{a}")).unwrap_or_default();
        let state = bound.state.clone();
        actix_web::rt::spawn(async move {
            match tether::demo::start(&state, &base).await {
                Ok(demo) => print_stdout(&format!("{}\n", demo.instructions())),
                Err(e) => eprintln!("tether: the demo could not start: {e}"),
            }
        });
    } else {
        print_stdout(&format!("tether: create an API token with: {token_hint}\n"));
    }
    let ran = bound.run().await.map_err(Failure::runtime);
    if demo {
        // The demo daemon's state dir is this process's own.
        let _ = std::fs::remove_dir_all(tether::demo::state_dir());
    }
    ran
}
