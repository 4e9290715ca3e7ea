//! Host registration: `POST /api/v1/hosts` (docs/PROTOCOL.md, "Registration";
//! docs/REST.md, "Hosts").
//!
//! The server upserts by user + hostname, so registering again (after the
//! state file was lost, or after a 4403) yields the same host when it still
//! exists and a fresh one when it was deleted.

use serde::{Deserialize, Serialize};

use super::server_url::ServerUrl;

/// Why registration failed. Only `BadToken` is fatal; the rest is retried
/// with backoff.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    #[error("the server refused the token")]
    BadToken,
    #[error("the server answered HTTP {status} ({code})")]
    Status { status: u16, code: String },
    /// An error without tether's error body: a proxy's or another
    /// program's answer, usually a `--server` that is not tether's base URL.
    #[error(
        "HTTP {status} from {endpoint} without a tether error body: is --server the tether server's base URL (the \
         address the web page is served at)?"
    )]
    NotTether { status: u16, endpoint: String },
    #[error("cannot reach the server: {0}")]
    Transport(String),
    #[error("unexpected registration response: {0}")]
    BadResponse(String),
}

/// What the daemon tells the server about its machine.
#[derive(Debug, Serialize)]
pub struct HostDescription {
    pub name: String,
    pub hostname: String,
    pub platform: &'static str,
    pub arch: &'static str,
}

impl HostDescription {
    /// This machine, shown as `name` (default: the hostname).
    pub fn of_this_machine(name: Option<String>) -> Self {
        let hostname = gethostname::gethostname().to_string_lossy().into_owned();
        Self {
            name: name.filter(|name| !name.trim().is_empty()).unwrap_or_else(|| hostname.clone()),
            hostname,
            platform: std::env::consts::OS,
            arch: std::env::consts::ARCH,
        }
    }
}

#[derive(Deserialize)]
struct Registered {
    host: RegisteredHost,
}

#[derive(Deserialize)]
struct RegisteredHost {
    id: String,
}

/// The error code of a refused request, None when the body is not
/// tether's error body. The code is enough to act on; the body is not
/// logged whole.
pub(super) async fn error_code(response: &mut awc::ClientResponse) -> Option<String> {
    let body = response.body().await.unwrap_or_default();
    crate::client::ApiErrorBody::parse(&body).map(|error| error.code)
}

/// Registers this machine and returns its host id.
pub async fn register(
    client: &awc::Client,
    server: &ServerUrl,
    token: &str,
    host: &HostDescription,
) -> Result<String, RegisterError> {
    let endpoint = server.hosts_endpoint();
    let mut response = client
        .post(&endpoint)
        .bearer_auth(token)
        .send_json(host)
        .await
        .map_err(|err| RegisterError::Transport(crate::tls::explain(&err)))?;
    let status = response.status();
    if status == awc::http::StatusCode::UNAUTHORIZED {
        return Err(RegisterError::BadToken);
    }
    if !status.is_success() {
        let status = status.as_u16();
        return Err(match error_code(&mut response).await {
            Some(code) => RegisterError::Status { status, code },
            None => RegisterError::NotTether { status, endpoint },
        });
    }
    let registered: Registered = response.json().await.map_err(|err| RegisterError::BadResponse(err.to_string()))?;
    let id = registered.host.id;
    // The id names a file's contents and every Hello; insist on a real UUID.
    uuid::Uuid::parse_str(&id).map_err(|_| RegisterError::BadResponse(format!("host id {id:?} is not a UUID")))?;
    Ok(id)
}
