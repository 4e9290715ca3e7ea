//! Failures of a client command, with the exit status each maps to, and
//! the messages a person can act on for the usual ones: a wrong server URL,
//! a refused token, an offline host, a directory outside the allowlist.

use chrono::Utc;

use super::output::relative_time;
use crate::client::resolve::{short_id, ResolveError};
use crate::client::{ClientError, Host};

/// What `main` prints (after `tether: `) and the status it exits with.
#[derive(Debug)]
pub struct CliError {
    pub status: u8,
    /// `None`: exit quietly (`tether run` passing on the run's exit code).
    pub message: Option<String>,
}

impl CliError {
    /// A usage or configuration error: status 2.
    pub fn config(message: impl Into<String>) -> Self {
        Self { status: 2, message: Some(message.into()) }
    }

    /// Anything else: status 1.
    pub fn failed(message: impl Into<String>) -> Self {
        Self { status: 1, message: Some(message.into()) }
    }

    /// Exit with `status` and say nothing more.
    pub fn silent(status: u8) -> Self {
        Self { status, message: None }
    }
}

impl From<ResolveError> for CliError {
    fn from(err: ResolveError) -> Self {
        CliError::failed(err.to_string())
    }
}

/// A client error in words, for a command talking to `server`.
pub fn explain(err: ClientError, server: &str) -> CliError {
    match err {
        ClientError::InvalidServerUrl(_) | ClientError::Tls(_) => CliError::config(err.to_string()),
        ClientError::Connect { message, .. } => CliError::failed(format!(
            "cannot reach the tether server at {server}: {message}\n\
             check the URL (--server, TETHER_SERVER or `tether login --server URL`) and that the server is running"
        )),
        ClientError::Certificate { message, .. } => CliError::failed(format!("cannot connect to {server}: {message}")),
        ClientError::NotTether { url, status } => CliError::failed(format!(
            "{server} does not look like a tether server: {url} answered HTTP {status} without a tether error; \
             check the URL (the server's HTTP base URL, e.g. http://127.0.0.1:8080)"
        )),
        ref e if e.is_unauthorized() => CliError::failed(format!(
            "the server at {server} refused the token (401 unauthorized): it is wrong, revoked or expired; \
             run `tether login --server {server}` with a valid token, or check --token / TETHER_TOKEN"
        )),
        // The server refused a value the command line gave it (a signal
        // name, a TTL, a dir that is not absolute): a usage error. The dir
        // allowlist, a host's state, is refused in `start_refused` first.
        ClientError::Api { status: 400, message, code } => CliError::config(format!("{message} ({code})")),
        ClientError::Api { message, code, .. } => CliError::failed(format!("{message} ({code})")),
        other => CliError::failed(other.to_string()),
    }
}

/// A host that is offline, and since when.
pub fn host_offline(host: &Host) -> CliError {
    let seen = match host.last_seen_at {
        Some(at) => format!("last seen {}", relative_time(Some(at), Utc::now())),
        None => "never seen online".to_owned(),
    };
    CliError::failed(format!(
        "host {} ({}) is offline ({seen}); start `tether daemon` on it, or wait for it to reconnect",
        host.name,
        short_id(&host.id)
    ))
}

/// Errors of creating a terminal or run on `host`, with the allowed dirs
/// spelled out when the directory was refused.
pub fn start_refused(err: ClientError, server: &str, host: &Host, dir: Option<&str>) -> CliError {
    match err.code() {
        Some("dir_not_allowed") => CliError::failed(format!(
            "directory {} is not allowed on host {}; allowed: {} (the daemon's --allow-dir)",
            dir.unwrap_or("?"),
            host.name,
            if host.dirs.is_empty() { "none reported".to_owned() } else { host.dirs.join(", ") }
        )),
        Some("host_offline") => host_offline(host),
        _ => explain(err, server),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_follow_the_contract() {
        assert_eq!(explain(ClientError::InvalidServerUrl("x".into()), "x").status, 2);
        let refused = ClientError::Connect { url: "http://h/api".into(), message: "Connection refused".into() };
        let err = explain(refused, "http://h");
        assert_eq!(err.status, 1);
        assert!(err.message.unwrap().contains("cannot reach the tether server at http://h"));
        let unauthorized = ClientError::Api { status: 401, code: "unauthorized".into(), message: "m".into() };
        assert!(explain(unauthorized, "http://h").message.unwrap().contains("refused the token"));
        let refused_value = ClientError::Api { status: 400, code: "invalid_signal".into(), message: "m".into() };
        assert_eq!(explain(refused_value, "http://h").status, 2, "a refused flag value is a usage error");
        let conflict = ClientError::Api { status: 409, code: "host_offline".into(), message: "m".into() };
        assert_eq!(explain(conflict, "http://h").status, 1);
    }
}
