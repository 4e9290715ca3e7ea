//! The server's endpoints, derived from the HTTP base URL the user gives
//! (`--server http://127.0.0.1:8080`; docs/PROTOCOL.md, "The socket").
//!
//! The WebSocket URL keeps any path prefix of the base (a reverse proxy may
//! mount tether under `/tether/`) and maps http -> ws, https -> wss.

use std::fmt;

/// Why a `--server` value cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("invalid server URL {url:?}: {reason}")]
pub struct BadServerUrl {
    pub url: String,
    pub reason: &'static str,
}

/// The endpoints the daemon talks to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerUrl {
    /// `http(s)://host[:port][/prefix]`, no trailing slash.
    base: String,
    /// `ws(s)://host[:port][/prefix]`.
    ws_base: String,
}

impl ServerUrl {
    pub fn parse(url: &str) -> Result<Self, BadServerUrl> {
        let bad = |reason| BadServerUrl { url: url.to_owned(), reason };
        let trimmed = url.trim().trim_end_matches('/');
        let (ws_scheme, rest) = if let Some(rest) = trimmed.strip_prefix("http://") {
            ("ws://", rest)
        } else if let Some(rest) = trimmed.strip_prefix("https://") {
            ("wss://", rest)
        } else {
            return Err(bad("expected an http:// or https:// base URL"));
        };
        if rest.is_empty() || rest.starts_with('/') {
            return Err(bad("missing host"));
        }
        if rest.contains(['?', '#']) {
            return Err(bad("a base URL takes no query or fragment"));
        }
        // Let the HTTP stack judge the authority; catching it here turns a
        // typo into a start-up error instead of an endless reconnect loop.
        if trimmed.parse::<awc::http::Uri>().is_err() {
            return Err(bad("not a valid URL"));
        }
        Ok(Self { base: trimmed.to_owned(), ws_base: format!("{ws_scheme}{rest}") })
    }

    /// `POST` here registers the host (docs/PROTOCOL.md, "Registration").
    pub fn hosts_endpoint(&self) -> String {
        format!("{}/api/v1/hosts", self.base)
    }

    /// `POST` here asks the director where to dial (docs/CELLS.md, "What a daemon does").
    pub fn assign_endpoint(&self) -> String {
        format!("{}/v1/assign", self.base)
    }

    /// The daemon WebSocket (docs/PROTOCOL.md, "The socket").
    pub fn daemon_ws_endpoint(&self) -> String {
        format!("{}/ws/v1/daemon", self.ws_base)
    }
}

impl fmt::Display for ServerUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.base)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_maps_to_ws_and_keeps_port_and_prefix() {
        let url = ServerUrl::parse("http://127.0.0.1:8080/").unwrap();
        assert_eq!(url.hosts_endpoint(), "http://127.0.0.1:8080/api/v1/hosts");
        assert_eq!(url.daemon_ws_endpoint(), "ws://127.0.0.1:8080/ws/v1/daemon");
        assert_eq!(url.assign_endpoint(), "http://127.0.0.1:8080/v1/assign");

        let url = ServerUrl::parse("https://relay.example.com/tether").unwrap();
        assert_eq!(url.hosts_endpoint(), "https://relay.example.com/tether/api/v1/hosts");
        assert_eq!(url.daemon_ws_endpoint(), "wss://relay.example.com/tether/ws/v1/daemon");
    }

    #[test]
    fn rejects_what_cannot_be_a_base_url() {
        for bad in ["", "127.0.0.1:8080", "ws://x", "http://", "http:///x", "http://x/?a=1", "http://bad host"] {
            assert!(ServerUrl::parse(bad).is_err(), "{bad:?} was accepted");
        }
    }
}
