//! `tether open`, `attach`, `share`, `kill` and `rm`: terminals by host name and id prefix.

use uuid::Uuid;

use super::detach_key::DetachKey;
use super::errors::{explain, host_offline, start_refused};
use super::output::{print_json, print_one, print_stdout};
use super::{CliError, Connection, Format};
use crate::attach::{self, AttachError, AttachOptions, AttachOutcome};
use crate::client::resolve::{self, short_id};
use crate::client::{Client, Host, NewTerminal, NewToken, Terminal, TerminalFilter};

/// Used when the local window size cannot be read.
const FALLBACK_SIZE: (u16, u16) = (80, 24);

/// A host by name or id prefix, from the user's hosts.
pub async fn find_host(client: &Client, query: &str) -> Result<Host, CliError> {
    let hosts = client.hosts().await.map_err(|e| explain(e, client.server()))?;
    Ok(resolve::host(&hosts, query)?.clone())
}

/// A terminal by id or unique id prefix.
pub async fn find_terminal(client: &Client, query: &str) -> Result<Terminal, CliError> {
    if let Ok(id) = Uuid::parse_str(query.trim()) {
        return client.terminal(id).await.map_err(|e| match e {
            e if e.is_not_found() => CliError::failed(format!("no terminal matches {query:?}")),
            e => explain(e, client.server()),
        });
    }
    let terminals = client.terminals(&TerminalFilter::default()).await.map_err(|e| match e {
        // A share token reaches its one terminal, not the list a prefix needs.
        e if e.code() == Some("insufficient_scope") => CliError::failed(format!(
            "{query:?} is not a whole terminal id, and this token cannot list terminals to match it \
             (a share token reaches one terminal): give the whole id"
        )),
        e => explain(e, client.server()),
    })?;
    Ok(resolve::terminal(&terminals, query)?.clone())
}

/// What `tether open` starts.
pub struct Open {
    pub host: String,
    pub dir: Option<String>,
    pub title: Option<String>,
    pub argv: Vec<String>,
}

pub async fn open(
    client: &Client,
    connection: &Connection,
    Open { host, dir, title, argv }: Open,
    format: Format,
    detach_key: DetachKey,
) -> Result<(), CliError> {
    let host = find_host(client, &host).await?;
    if !host.is_online() {
        return Err(host_offline(&host));
    }
    let (cols, rows) = match crossterm::terminal::size() {
        Ok((cols, rows)) if cols > 0 && rows > 0 => (cols, rows),
        _ => FALLBACK_SIZE,
    };
    let new = NewTerminal { host_id: host.id, dir: dir.clone(), argv, cols: Some(cols), rows: Some(rows), title };
    let terminal =
        client.create_terminal(&new).await.map_err(|e| start_refused(e, client.server(), &host, dir.as_deref()))?;
    // For scripts: the terminal is started and printed; attaching is a
    // later `tether attach`.
    if print_one(format, "terminal", &terminal, terminal.id) {
        return Ok(());
    }
    eprintln!("tether: terminal {} on {}; detach with {detach_key}", short_id(&terminal.id), host.name);
    attach_to(client, connection, &terminal.id.to_string(), &short_id(&terminal.id), detach_key).await
}

pub async fn attach(
    client: &Client,
    connection: &Connection,
    query: &str,
    detach_key: DetachKey,
) -> Result<(), CliError> {
    // A whole id goes straight to the socket, which says "terminal not found"
    // itself; a prefix needs the list.
    // The way back is named as it was given: a share token cannot match
    // the short form.
    let (id, again) = match Uuid::parse_str(query.trim()) {
        Ok(id) => (id, id.to_string()),
        Err(_) => {
            let id = find_terminal(client, query).await?.id;
            (id, short_id(&id))
        }
    };
    attach_to(client, connection, &id.to_string(), &again, detach_key).await
}

/// Attaches to `terminal_id`; a detach says `tether attach <again>` brings
/// the user back.
async fn attach_to(
    client: &Client,
    connection: &Connection,
    terminal_id: &str,
    again: &str,
    detach_key: DetachKey,
) -> Result<(), CliError> {
    let mut options = AttachOptions::new(client.server(), client.token(), terminal_id);
    options.ca_file = connection.ca_file.clone();
    options.detach_key = detach_key.byte();
    match attach::run(options).await {
        Ok(AttachOutcome::Detached) => {
            eprintln!("[detached] the terminal keeps running; come back with `tether attach {again}`");
            Ok(())
        }
        Ok(outcome) if outcome.exit_status() == 0 => {
            eprintln!("{}", attach::describe(&outcome));
            Ok(())
        }
        // The socket's exit carries no signal; the terminal's resource does.
        Ok(outcome @ AttachOutcome::Exited { code: None }) => match ended_by_signal(client, terminal_id).await {
            Some(signal) => Err(CliError::failed(format!("[terminal killed by {}]", signal_name(signal)))),
            None => Err(CliError::failed(attach::describe(&outcome))),
        },
        Ok(AttachOutcome::Closed { code: 4401, .. }) | Err(AttachError::Rejected { status: 401 }) => {
            Err(explain(crate::client::ClientError::Rejected { status: 401 }, client.server()))
        }
        Ok(outcome) => Err(CliError::failed(attach::describe(&outcome))),
        Err(e @ AttachError::Tls(_)) => Err(CliError::config(e.to_string())),
        Err(AttachError::Connect { message, url }) => {
            Err(explain(crate::client::ClientError::Connect { url, message }, client.server()))
        }
        Err(e) => Err(CliError::failed(e.to_string())),
    }
}

/// The signal that ended the terminal, from its resource: the server
/// records the exit before it tells viewers, but a read at that instant
/// may still find it running, so it asks a few times.
async fn ended_by_signal(client: &Client, terminal_id: &str) -> Option<i32> {
    let id = Uuid::parse_str(terminal_id).ok()?;
    for _ in 0..5 {
        match client.terminal(id).await {
            Ok(terminal) if terminal.state == "exited" => return terminal.exit_signal,
            Ok(_) => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
            Err(_) => return None,
        }
    }
    None
}

/// "SIGHUP" for 1: names only for the numbers every Unix shares (the
/// host's numbering may not be this machine's); "signal N" otherwise.
fn signal_name(signal: i32) -> String {
    let name = match signal {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        5 => "SIGTRAP",
        6 => "SIGABRT",
        8 => "SIGFPE",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        13 => "SIGPIPE",
        14 => "SIGALRM",
        15 => "SIGTERM",
        _ => return format!("signal {signal}"),
    };
    name.to_owned()
}

/// `tether share`: a share token for one terminal (docs/REST.md, "Scopes"):
/// the secret alone on stdout, what it is on stderr.
pub async fn share(
    client: &Client,
    query: &str,
    ttl: Option<std::time::Duration>,
    name: Option<String>,
    json: bool,
) -> Result<(), CliError> {
    let terminal = find_terminal(client, query).await?;
    let new = NewToken { name, terminal_id: Some(terminal.id), ttl_seconds: ttl.map(|t| t.as_secs()), scope: None };
    let created = client.create_token(&new).await.map_err(|e| explain(e, client.server()))?;
    if json {
        print_json(&serde_json::json!({ "token": created.token, "secret": created.secret }));
        return Ok(());
    }
    print_stdout(&format!("{}\n", created.secret));
    let until = created.token.expires_at.map_or_else(|| "it is revoked".to_owned(), |at| at.to_rfc3339());
    eprintln!(
        "tether: share token {} watches terminal {} read-only until {until}; with it: \
         TETHER_TOKEN=<token> tether attach {} --server {}, or the web page {}/#/t/{}",
        created.token.id,
        short_id(&terminal.id),
        terminal.id,
        client.server(),
        client.server().trim_end_matches('/'),
        terminal.id,
    );
    Ok(())
}

pub async fn kill(client: &Client, query: &str, signal: Option<&str>, format: Format) -> Result<(), CliError> {
    let terminal = find_terminal(client, query).await?;
    let killed = client.kill_terminal(terminal.id, signal).await.map_err(|e| match e.code() {
        Some("terminal_not_running") => {
            CliError::failed(format!("terminal {} is {}, not running", short_id(&terminal.id), terminal.state))
        }
        _ => explain(e, client.server()),
    })?;
    if !print_one(format, "terminal", &killed, killed.id) {
        eprintln!("tether: sent {} to terminal {}", signal.unwrap_or("HUP"), short_id(&terminal.id));
    }
    Ok(())
}

pub async fn rm(client: &Client, query: &str, format: Format) -> Result<(), CliError> {
    let terminal = find_terminal(client, query).await?;
    let short = short_id(&terminal.id);
    client.delete_terminal(terminal.id).await.map_err(|e| match e.code() {
        Some("terminal_live") => CliError::failed(format!(
            "terminal {short} is still {}; stop it first with `tether kill {short}`",
            terminal.state
        )),
        _ => explain(e, client.server()),
    })?;
    // The API answers 204 with no body: the terminal printed is the one
    // read just before the delete.
    if !print_one(format, "terminal", &terminal, terminal.id) {
        eprintln!("tether: removed terminal {short}");
    }
    Ok(())
}
