//! What can go wrong talking to a server, in terms a caller can act on:
//! the server is unreachable, answered as something other than tether, or
//! refused the request with the API's error body
//! (`{"error":{"code":"snake_case","message":"..."}}`, docs/CLI.md).

use serde::Deserialize;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("invalid server URL {0:?}: expected http(s)://HOST[:PORT][/PATH]")]
    InvalidServerUrl(String),
    #[error("invalid id {0:?}")]
    InvalidId(String),
    /// A request that cannot be encoded (a query or body serializer refused it).
    #[error("cannot encode the request: {0}")]
    Encode(String),
    /// The `--ca-file` cannot be used.
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    // awc's errors are neither Send nor Sync, so they are kept as text.
    /// Nothing answered (refused, DNS, timeout).
    #[error("cannot reach {url}: {message}")]
    Connect { url: String, message: String },
    /// The TLS handshake failed on the server's certificate.
    #[error("cannot connect to {url}: {message}")]
    Certificate { url: String, message: String },
    /// The API refused the request with its error body.
    #[error("{message} ({status} {code})")]
    Api { status: u16, code: String, message: String },
    /// An answer that is not the API's: most often the URL points at some
    /// other web server, or at the right one with a wrong path prefix.
    #[error("{url} answered HTTP {status} without a tether error body")]
    NotTether { url: String, status: u16 },
    /// A 2xx answer whose body is not the documented resource.
    #[error("unexpected answer from {url}: {message}")]
    Decode { url: String, message: String },
    /// The viewer socket's handshake was refused with this HTTP status.
    #[error("the server refused the viewer connection (HTTP {status})")]
    Rejected { status: u16 },
    #[error("WebSocket protocol error: {0}")]
    Protocol(String),
}

impl ClientError {
    /// The API's error code, when the server answered with one.
    pub fn code(&self) -> Option<&str> {
        match self {
            ClientError::Api { code, .. } => Some(code),
            _ => None,
        }
    }

    /// Whether the server could not be reached: nothing answered, or a
    /// proxy in front of it answered 502-504 (a restart, an instance away).
    /// A later attempt may get through (`client::reconnect`).
    pub fn is_unreachable(&self) -> bool {
        match self {
            ClientError::Connect { .. } => true,
            ClientError::Api { status, .. } | ClientError::NotTether { status, .. } => (502..=504).contains(status),
            _ => false,
        }
    }

    /// Whether the server refused the token (HTTP 401 on REST, 4401 or a
    /// 401 handshake on a socket).
    pub fn is_unauthorized(&self) -> bool {
        matches!(self, ClientError::Api { status: 401, .. } | ClientError::Rejected { status: 401 })
    }

    /// Whether the server said the resource does not exist (for this user).
    pub fn is_not_found(&self) -> bool {
        matches!(self, ClientError::Api { status: 404, .. } | ClientError::Rejected { status: 404 })
    }
}

/// The API's error body, `{"error":{"code":...,"message":...}}`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ApiErrorBody {
    pub code: String,
    pub message: String,
}

impl ApiErrorBody {
    /// The error in `body`, when it is the API's error body.
    pub fn parse(body: &[u8]) -> Option<Self> {
        #[derive(Deserialize)]
        struct Wrapped {
            error: ApiErrorBody,
        }
        serde_json::from_slice::<Wrapped>(body).ok().map(|w| w.error)
    }
}

/// The error for a non-2xx answer: the API's own when the body is one.
pub(super) fn from_response(url: &str, status: u16, body: &[u8]) -> ClientError {
    match ApiErrorBody::parse(body) {
        Some(error) => ClientError::Api { status, code: error.code, message: error.message },
        None => ClientError::NotTether { url: url.to_owned(), status },
    }
}

/// A failed request as a connection or certificate error.
pub(super) fn from_send(url: &str, error: &dyn std::fmt::Display) -> ClientError {
    let message = crate::tls::explain(error);
    if crate::tls::is_certificate_problem(&message) {
        ClientError::Certificate { url: url.to_owned(), message }
    } else {
        ClientError::Connect { url: url.to_owned(), message }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_bodies_become_api_errors_and_others_do_not() {
        let body = br#"{"error":{"code":"host_offline","message":"the host is offline"}}"#;
        let err = from_response("http://h/api/v1/terminals", 409, body);
        assert_eq!(err.code(), Some("host_offline"));
        assert_eq!(err.to_string(), "the host is offline (409 host_offline)");
        let err = from_response("http://h/api/v1/hosts", 404, b"<html>Not Found</html>");
        assert!(matches!(err, ClientError::NotTether { status: 404, .. }), "{err}");
        let unauthorized = from_response("u", 401, br#"{"error":{"code":"unauthorized","message":"m"}}"#);
        assert!(unauthorized.is_unauthorized());
        assert!(!err.is_unauthorized());
    }

    #[test]
    fn errors_can_cross_threads_for_anyhow() {
        fn assert_send_sync<T: Send + Sync + 'static>() {}
        assert_send_sync::<ClientError>();
    }
}
