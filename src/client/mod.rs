//! `tether::client`: a typed client of a tether server, for the command
//! line, the examples and the tests (docs/CLI.md, "What the client speaks").
//!
//! - [`Client`] holds the server's base URL and an API token and makes the
//!   REST calls (`rest`): hosts, terminals, runs, tokens and the audit
//!   log, each paged list followed through `nextCursor`, each error body
//!   mapped to [`ClientError::Api`].
//! - [`reconnect`] says how long the clients ride out a server they cannot
//!   reach.
//! - [`resolve`] turns what a person types (a host name, an id prefix) into
//!   one resource, or says which candidates matched.
//! - [`viewer`] speaks the viewer protocol: the raw socket `tether attach`
//!   drives, and [`viewer::OutputFollower`], which follows a terminal's
//!   output stream byte-exactly across reconnects.
//!
//! Everything runs on the current thread's actix system (awc's client is not
//! `Send`), like the rest of the command line.

mod error;
pub mod reconnect;
pub mod resolve;
mod resources;
mod rest;
pub mod viewer;

use std::path::Path;
use std::time::Duration;

pub use error::{ApiErrorBody, ClientError};
pub use resources::{
    AuditEvent, AuditFilter, CreatedToken, Host, NewRun, NewTerminal, NewToken, Run, RunLog, RunUsage, Terminal,
    TerminalFilter, Token,
};

/// How long one REST call may take, connection included.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A server and the token to use there.
#[derive(Clone)]
pub struct Client {
    server: String,
    token: String,
    http: awc::Client,
}

impl Client {
    /// A client of `server` (`http(s)://HOST[:PORT][/PREFIX]`), trusting the
    /// system's roots plus `ca_file` for `https://`.
    pub fn new(server: &str, token: &str, ca_file: Option<&Path>) -> Result<Self, ClientError> {
        let server = normalize_server_url(server)?;
        let http = crate::tls::http_client(ca_file, REQUEST_TIMEOUT)?;
        Ok(Self { server, token: token.to_owned(), http })
    }

    /// The base URL, without a trailing `/`.
    pub fn server(&self) -> &str {
        &self.server
    }

    pub(crate) fn token(&self) -> &str {
        &self.token
    }
}

/// Never prints the token.
impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("server", &self.server).field("token", &"<redacted>").finish()
    }
}

/// Checks a server URL and drops trailing slashes: `http://h:1/` ->
/// `http://h:1`. Only `http` and `https` are base URLs.
pub fn normalize_server_url(raw: &str) -> Result<String, ClientError> {
    let trimmed = raw.trim().trim_end_matches('/');
    let invalid = || ClientError::InvalidServerUrl(raw.trim().to_owned());
    let (scheme, rest) = trimmed.split_once("://").ok_or_else(invalid)?;
    if !matches!(scheme.to_ascii_lowercase().as_str(), "http" | "https") {
        return Err(invalid());
    }
    if rest.is_empty() || rest.starts_with('/') || rest.contains(['?', '#', ' ']) {
        return Err(invalid());
    }
    Ok(trimmed.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_urls_are_checked_and_trimmed() {
        assert_eq!(normalize_server_url("http://127.0.0.1:8080/").unwrap(), "http://127.0.0.1:8080");
        assert_eq!(
            normalize_server_url(" https://relay.example.com/tether ").unwrap(),
            "https://relay.example.com/tether"
        );
        for bad in ["127.0.0.1:8080", "ws://h", "http://", "http:///x", "http://h?x=1", "ftp://h"] {
            assert!(matches!(normalize_server_url(bad), Err(ClientError::InvalidServerUrl(_))), "{bad}");
        }
    }

    #[actix_rt::test]
    async fn debug_never_shows_the_token() {
        let client = Client::new("http://h", "tth_secret", None).unwrap();
        assert!(!format!("{client:?}").contains("tth_secret"));
    }
}
