//! The API's resources as the client sees them (docs/CLI.md, "What the
//! client speaks"). Every field the client does not use by name is kept in
//! `other`, so `--json` can print a resource exactly as the server sent it,
//! including fields added after this client was built.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use uuid::Uuid;

/// A machine running `tether daemon`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Host {
    pub id: Uuid,
    pub name: String,
    pub hostname: String,
    pub platform: String,
    pub arch: String,
    /// `online` or `offline`, live from the host's lease.
    pub state: String,
    /// Directories terminals and runs may start in (or inside).
    pub dirs: Vec<String>,
    pub last_seen_at: Option<DateTime<Utc>>,
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

impl Host {
    pub fn is_online(&self) -> bool {
        self.state == "online"
    }
}

/// A PTY process on a host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Terminal {
    pub id: Uuid,
    pub host_id: Uuid,
    pub title: Option<String>,
    pub dir: Option<String>,
    pub argv: Vec<String>,
    /// `pending`, `launching`, `running`, `exited` or `error`.
    pub state: String,
    pub pending_reason: Option<String>,
    pub exit_code: Option<i32>,
    pub exit_signal: Option<i32>,
    pub cols: u16,
    pub rows: u16,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub ended_at: Option<DateTime<Utc>>,
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

impl Terminal {
    /// Whether a PTY exists or is about to (the server refuses to delete these).
    pub fn is_live(&self) -> bool {
        matches!(self.state.as_str(), "launching" | "running")
    }

    /// Why the terminal could not start, when the server says.
    pub fn error(&self) -> Option<&str> {
        self.other.get("error").and_then(Value::as_str)
    }
}

/// A batch command executed on a host as a terminal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Run {
    pub id: Uuid,
    pub host_id: Uuid,
    pub argv: Vec<String>,
    pub dir: Option<String>,
    /// `queued`, `dispatched`, `running`, `succeeded`, `failed` or `lost`.
    pub state: String,
    pub exit_code: Option<i32>,
    pub usage: Option<RunUsage>,
    pub terminal_id: Option<Uuid>,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

impl Run {
    pub fn is_final(&self) -> bool {
        matches!(self.state.as_str(), "succeeded" | "failed" | "lost")
    }

    /// The signal that ended the command, when one did. Read from the
    /// fields kept as sent: servers before `exitSignal` on runs do not send
    /// it, and `--json` must not add it for them.
    pub fn exit_signal(&self) -> Option<i32> {
        self.other.get("exitSignal").and_then(Value::as_i64).and_then(|n| i32::try_from(n).ok())
    }

    /// Output bytes missing from the run's log (docs/REST.md, "Run"); 0
    /// also from servers before `logGapBytes`.
    pub fn log_gap_bytes(&self) -> u64 {
        self.other.get("logGapBytes").and_then(Value::as_u64).unwrap_or(0)
    }
}

/// A stretch of a run's log (`GET /runs/{id}/log?from=N`). Log offsets are
/// the run's terminal's stream offsets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunLog {
    /// The offset asked for.
    pub from: u64,
    /// The bytes from `from` to `next_offset`; empty when the log ends before `from`.
    pub data: bytes::Bytes,
    /// Where the log ends so far.
    pub next_offset: u64,
    /// The log will not grow: the run is final, or the log reached
    /// `runs.log_max_bytes`.
    pub complete: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunUsage {
    pub cpu_ms: i64,
    pub max_rss_kb: i64,
    pub output_bytes: i64,
    pub wall_ms: i64,
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// An API token as listed: never its secret (docs/REST.md, "Tokens").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Token {
    pub id: Uuid,
    pub name: Option<String>,
    /// `full`, `daemon` or `read`.
    pub scope: String,
    /// The host a `daemon` token is bound to.
    pub host_id: Option<Uuid>,
    /// The one terminal a share token reaches.
    pub terminal_id: Option<Uuid>,
    pub created_at: DateTime<Utc>,
    pub expires_at: Option<DateTime<Utc>>,
    pub last_used_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

impl Token {
    /// Whether the server would still accept it at `now`.
    pub fn is_usable_at(&self, now: DateTime<Utc>) -> bool {
        self.revoked_at.is_none() && self.expires_at.is_none_or(|at| at > now)
    }
}

/// The answer to `POST /tokens`: the token and its secret, which the server
/// shows this once.
#[derive(Clone, PartialEq, Deserialize)]
pub struct CreatedToken {
    pub token: Token,
    /// `tth_...`, to hand to `Client::new` or `tether login`.
    pub secret: String,
}

/// Never prints the secret.
impl std::fmt::Debug for CreatedToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CreatedToken").field("token", &self.token).field("secret", &"<redacted>").finish()
    }
}

/// One entry of the caller's audit log (docs/REST.md, "Audit").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditEvent {
    pub id: Uuid,
    pub at: DateTime<Utc>,
    pub user_id: Uuid,
    /// The token the action was done with.
    pub token_id: Option<Uuid>,
    /// `attach`, `detach`, `spawn`, `kill`, `input`, `resize`,
    /// `token_created`, `token_revoked` or `host_registered`.
    pub action: String,
    // Left out by the server when they do not apply, and so here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_id: Option<Uuid>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminal_id: Option<Uuid>,
    /// The instance that recorded it.
    pub instance_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// `POST /terminals`.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NewTerminal {
    pub host_id: Uuid,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dir: Option<String>,
    /// Empty: the host user's login shell.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub argv: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cols: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rows: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
}

/// `POST /runs`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NewRun {
    pub host_id: Uuid,
    pub argv: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dir: Option<String>,
}

/// `POST /tokens`. A `terminal_id` makes a share token: `read`, expiring
/// in `ttl_seconds` or 24 h.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NewToken {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `full` (the server's default), `daemon` or `read`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// None: never expires (unless it is a share token).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub terminal_id: Option<Uuid>,
}

/// The query of `GET /audit`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct AuditFilter {
    /// Leaves out events older than this (inclusive bound).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since: Option<DateTime<Utc>>,
    /// At most this many, newest first: 1..5000; the server's default is 500.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

/// Filters of `GET /terminals`.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TerminalFilter {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_id: Option<Uuid>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resources_round_trip_with_unknown_fields() {
        let raw = serde_json::json!({
            "id": "0b9f6a7e-2f55-4c1e-9d7b-1c2d3e4f5a6b", "hostId": "1b9f6a7e-2f55-4c1e-9d7b-1c2d3e4f5a6b",
            "title": null, "dir": "/tmp", "argv": [], "state": "exited", "pendingReason": null,
            "exitCode": 0, "exitSignal": null, "error": "boom", "cols": 80, "rows": 24,
            "createdAt": "2026-12-01T10:00:00.123456Z", "startedAt": null, "endedAt": null,
            "lastInteractedAt": null, "somethingNew": {"x": 1}
        });
        let terminal: Terminal = serde_json::from_value(raw.clone()).unwrap();
        assert_eq!(terminal.error(), Some("boom"));
        assert!(!terminal.is_live());
        assert_eq!(serde_json::to_value(&terminal).unwrap(), raw);
    }

    #[test]
    fn tokens_and_audit_events_round_trip_as_sent() {
        let raw = serde_json::json!({
            "id": "0b9f6a7e-2f55-4c1e-9d7b-1c2d3e4f5a6b", "name": "laptop", "scope": "daemon",
            "hostId": "1b9f6a7e-2f55-4c1e-9d7b-1c2d3e4f5a6b", "terminalId": null,
            "createdAt": "2026-12-02T01:00:00Z", "expiresAt": "2026-12-03T01:00:00Z", "lastUsedAt": null,
            "revokedAt": null
        });
        let token: Token = serde_json::from_value(raw.clone()).unwrap();
        assert!(token.is_usable_at("2026-12-02T12:00:00Z".parse().unwrap()));
        assert!(!token.is_usable_at("2026-12-03T01:00:00Z".parse().unwrap()), "expired at its expiry");
        assert_eq!(serde_json::to_value(&token).unwrap(), raw);
        // hostId, terminalId and detail are left out when they do not apply;
        // tokenId is null, not left out.
        let raw = serde_json::json!({
            "id": "2b9f6a7e-2f55-4c1e-9d7b-1c2d3e4f5a6b", "at": "2026-12-02T01:40:00.123Z",
            "userId": "3b9f6a7e-2f55-4c1e-9d7b-1c2d3e4f5a6b", "tokenId": null, "action": "token_created",
            "instanceId": "tether-0#3fa9c1"
        });
        let event: AuditEvent = serde_json::from_value(raw.clone()).unwrap();
        assert_eq!((event.host_id, event.detail.as_deref()), (None, None));
        assert_eq!(serde_json::to_value(&event).unwrap(), raw);
    }

    #[test]
    fn created_tokens_never_print_their_secret() {
        let created: CreatedToken = serde_json::from_value(serde_json::json!({
            "token": {"id": "0b9f6a7e-2f55-4c1e-9d7b-1c2d3e4f5a6b", "name": null, "scope": "full", "hostId": null,
                      "terminalId": null, "createdAt": "2026-12-02T01:00:00Z", "expiresAt": null,
                      "lastUsedAt": null, "revokedAt": null},
            "secret": "tth_very_secret"
        }))
        .unwrap();
        assert_eq!(created.secret, "tth_very_secret");
        assert!(!format!("{created:?}").contains("tth_very_secret"));
    }

    #[actix_rt::test]
    async fn new_tokens_and_audit_filters_send_only_what_is_set() {
        let share = NewToken { terminal_id: Some(Uuid::nil()), ttl_seconds: Some(60), ..Default::default() };
        assert_eq!(
            serde_json::to_value(&share).unwrap(),
            serde_json::json!({"ttlSeconds": 60, "terminalId": "00000000-0000-0000-0000-000000000000"})
        );
        let since = "2026-12-02T01:40:00.123Z".parse().unwrap();
        let uri = |filter: &AuditFilter| {
            let request = awc::Client::default().get("http://h/api/v1/audit").query(filter).unwrap();
            request.get_uri().to_string()
        };
        assert_eq!(
            uri(&AuditFilter { since: Some(since), limit: Some(7) }),
            "http://h/api/v1/audit?since=2026-12-02T01%3A40%3A00.123Z&limit=7"
        );
        assert_eq!(uri(&AuditFilter::default()), "http://h/api/v1/audit?");
    }
}
