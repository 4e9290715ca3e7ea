//! Row types shared by both store backends and the REST layer.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{ApiToken, StoreError};

/// An account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub id: Uuid,
    pub name: String,
    pub created_at: DateTime<Utc>,
}

/// Last-known host state (liveness itself comes from the lease).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HostState {
    Online,
    Offline,
}

/// Who holds a lease (docs/ARCHITECTURE.md, "Leases"): an instance, and
/// for a host lease the daemon connection on it (connections are numbered
/// from 1 per instance, so a redial to the same instance is a new holder;
/// 0 is the instance itself, for the sweep). Stored in `leases.holder` as
/// `<instance id>#<connection>`; only the store encodes and decodes it, and
/// the connection is always the last `#` field (instance ids hold `#`
/// themselves).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LeaseHolder {
    pub instance: String,
    pub connection: u64,
}

impl LeaseHolder {
    /// The instance itself (leases no connection holds).
    pub fn instance(instance: &str) -> Self {
        Self { instance: instance.to_string(), connection: 0 }
    }

    /// A daemon connection on `instance`.
    pub fn connection(instance: &str, connection: u64) -> Self {
        Self { instance: instance.to_string(), connection }
    }

    /// The stored `holder` text.
    pub fn encode(&self) -> String {
        format!("{}#{}", self.instance, self.connection)
    }

    /// Reads a stored `holder` text; a text this encoding did not write
    /// (an older release's) is an error, never a guess.
    pub fn decode(raw: &str) -> Result<Self, StoreError> {
        raw.rsplit_once('#')
            .and_then(|(instance, n)| Some(Self { instance: instance.to_string(), connection: n.parse().ok()? }))
            .filter(|h| !h.instance.is_empty())
            .ok_or_else(|| StoreError::Corrupt(format!("lease holder {raw:?}")))
    }
}

/// What a daemon says it can do (from its Hello).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Capabilities {
    pub manage_dirs: bool,
    pub refresh_limits: bool,
    pub credentials: bool,
    pub usage: bool,
    /// Per-terminal flow control (docs/PROTOCOL.md, "Flow control").
    pub flow_control: bool,
    /// It reports the Input it took (docs/PROTOCOL.md, "Input flow control").
    pub input_flow_control: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    pub id: Uuid,
    pub user_id: Uuid,
    pub name: String,
    pub hostname: String,
    pub platform: String,
    pub arch: String,
    pub state: HostState,
    pub capabilities: Capabilities,
    pub dirs: Vec<String>,
    pub last_seen_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Clone)]
pub struct NewHost {
    pub user_id: Uuid,
    pub name: String,
    pub hostname: String,
    pub platform: String,
    pub arch: String,
}

/// What [`Store::register_host`](super::Store::register_host) did.
#[derive(Debug, Clone)]
pub enum Registered {
    Host(Host),
    /// Refused: the daemon token is bound to another host.
    TokenBoundElsewhere,
    /// Refused: another usable daemon token is bound to this host.
    HostHasToken,
}

/// Terminal lifecycle (docs/REST.md, "Terminal").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TerminalState {
    Pending,
    Launching,
    Running,
    Exited,
    Error,
}

impl TerminalState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Launching => "launching",
            Self::Running => "running",
            Self::Exited => "exited",
            Self::Error => "error",
        }
    }

    /// True while a PTY may exist or is about to (`DELETE` refuses these).
    pub fn is_live(self) -> bool {
        matches!(self, Self::Launching | Self::Running)
    }
}

impl fmt::Display for TerminalState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TerminalState {
    type Err = StoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "pending" => Self::Pending,
            "launching" => Self::Launching,
            "running" => Self::Running,
            "exited" => Self::Exited,
            "error" => Self::Error,
            other => return Err(StoreError::Corrupt(format!("terminal state `{other}`"))),
        })
    }
}

/// Why a pending terminal waits.
pub const PENDING_HOST_OFFLINE: &str = "host_offline";

/// A terminal row; its JSON form is the API's terminal resource (docs/REST.md, "Terminal").
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Terminal {
    pub id: Uuid,
    #[serde(skip)]
    pub user_id: Uuid,
    pub host_id: Uuid,
    pub title: Option<String>,
    pub dir: Option<String>,
    pub argv: Vec<String>,
    pub state: TerminalState,
    pub pending_reason: Option<String>,
    pub exit_code: Option<i32>,
    pub exit_signal: Option<i32>,
    pub error: Option<String>,
    pub cols: u16,
    pub rows: u16,
    #[serde(skip)]
    pub run_id: Option<Uuid>,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub ended_at: Option<DateTime<Utc>>,
    /// When a viewer last typed into it, to the minute (docs/CLUSTER.md,
    /// "Interaction stamp").
    pub last_interacted_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone)]
pub struct NewTerminal {
    pub user_id: Uuid,
    pub host_id: Uuid,
    pub title: Option<String>,
    pub dir: Option<String>,
    pub argv: Vec<String>,
    pub cols: u16,
    pub rows: u16,
    pub run_id: Option<Uuid>,
}

/// A page of a list in creation order (docs/REST.md, "Lists"): at most
/// `limit` items after the item at `after` (its creation time and id), or
/// from the start. Deleting that item in between moves nothing: the page
/// starts after where it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageAfter {
    pub after: Option<(DateTime<Utc>, Uuid)>,
    pub limit: usize,
}

impl PageAfter {
    /// The first `limit` items.
    pub fn first(limit: usize) -> Self {
        Self { after: None, limit }
    }

    /// `limit` for SQL.
    pub fn sql_limit(&self) -> i64 {
        i64::try_from(self.limit).unwrap_or(i64::MAX)
    }
}

#[derive(Debug, Clone, Default)]
pub struct TerminalFilter {
    pub host_id: Option<Uuid>,
    pub state: Option<TerminalState>,
}

/// Which of a user's runs a list returns: of one host, in one state, or both.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunFilter {
    pub host_id: Option<Uuid>,
    pub state: Option<RunState>,
}

/// How a PTY process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExitStatus {
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

/// The final screen of an exited terminal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TerminalSnapshot {
    pub data: Vec<u8>,
    pub cols: u16,
    pub rows: u16,
}

/// Result of a conditional delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteOutcome {
    Deleted,
    NotFound,
    /// The row is in a state that forbids deletion (live terminal).
    Conflict,
}

/// Run lifecycle (docs/REST.md, "Run").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunState {
    Queued,
    Dispatched,
    Running,
    Succeeded,
    Failed,
    Lost,
}

impl RunState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Dispatched => "dispatched",
            Self::Running => "running",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Lost => "lost",
        }
    }

    pub fn is_final(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Lost)
    }
}

impl fmt::Display for RunState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for RunState {
    type Err = StoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "queued" => Self::Queued,
            "dispatched" => Self::Dispatched,
            "running" => Self::Running,
            "succeeded" => Self::Succeeded,
            "failed" => Self::Failed,
            "lost" => Self::Lost,
            other => return Err(StoreError::Corrupt(format!("run state `{other}`"))),
        })
    }
}

/// Resource usage of a finished run, as the daemon measured it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunUsage {
    pub cpu_ms: i64,
    pub max_rss_kb: i64,
    pub output_bytes: i64,
    pub wall_ms: i64,
}

/// A run row; its JSON form is the API's run resource (docs/REST.md, "Run").
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Run {
    pub id: Uuid,
    #[serde(skip)]
    pub user_id: Uuid,
    pub host_id: Uuid,
    pub argv: Vec<String>,
    pub dir: Option<String>,
    pub state: RunState,
    pub exit_code: Option<i32>,
    /// The signal that ended the run's command, if one did (then `exit_code` is null).
    pub exit_signal: Option<i32>,
    pub usage: Option<RunUsage>,
    pub terminal_id: Option<Uuid>,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    /// Output bytes missing from the log because the daemon's ring no
    /// longer held them when the capture resumed (docs/REST.md, "Run").
    pub log_gap_bytes: i64,
    /// The stream offset after the last byte the capture stored: where a
    /// capture resumes (docs/CLUSTER.md, "Run logs across moves").
    #[serde(skip)]
    pub log_end: i64,
}

#[derive(Debug, Clone)]
pub struct NewRun {
    pub user_id: Uuid,
    pub host_id: Uuid,
    pub argv: Vec<String>,
    pub dir: Option<String>,
}

/// Host credentials as stored: AES-256-GCM ciphertext and its nonce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealedCredentials {
    pub nonce: Vec<u8>,
    pub ciphertext: Vec<u8>,
}

pub(crate) fn parse_json_list(text: &str) -> Result<Vec<String>, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(format!("json list: {e}")))
}

pub(crate) fn parse_capabilities(text: &str) -> Result<Capabilities, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(format!("capabilities: {e}")))
}

pub(crate) fn to_json<T: Serialize>(value: &T) -> String {
    // Serialising plain structs and string lists cannot fail.
    serde_json::to_string(value).unwrap_or_else(|_| "null".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_holders_round_trip_whatever_the_instance_id_holds() {
        for holder in [
            LeaseHolder::connection("cell#abc123", 7),
            LeaseHolder::connection("cell#123456", 7),
            LeaseHolder::instance("cell#123456"),
            LeaseHolder::connection("a#b#c", u64::MAX),
        ] {
            assert_eq!(LeaseHolder::decode(&holder.encode()).expect("decode"), holder);
        }
    }

    #[test]
    fn a_holder_text_without_a_connection_is_refused() {
        for raw in ["cell", "cell#abc123", "#4", ""] {
            assert!(LeaseHolder::decode(raw).is_err(), "{raw:?}");
        }
    }
}

/// What an audit event records (docs/SECURITY.md, "Audit").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuditAction {
    Attach,
    Detach,
    Spawn,
    Kill,
    /// Input started (at most one a minute per viewer; never the bytes).
    Input,
    Resize,
    TokenCreated,
    TokenRevoked,
    HostRegistered,
}

impl AuditAction {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Attach => "attach",
            Self::Detach => "detach",
            Self::Spawn => "spawn",
            Self::Kill => "kill",
            Self::Input => "input",
            Self::Resize => "resize",
            Self::TokenCreated => "token_created",
            Self::TokenRevoked => "token_revoked",
            Self::HostRegistered => "host_registered",
        }
    }
}

impl FromStr for AuditAction {
    type Err = StoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "attach" => Self::Attach,
            "detach" => Self::Detach,
            "spawn" => Self::Spawn,
            "kill" => Self::Kill,
            "input" => Self::Input,
            "resize" => Self::Resize,
            "token_created" => Self::TokenCreated,
            "token_revoked" => Self::TokenRevoked,
            "host_registered" => Self::HostRegistered,
            other => return Err(StoreError::Corrupt(format!("audit action `{other}`"))),
        })
    }
}

/// One audit event as written: the store assigns nothing but the row id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewAuditEvent {
    pub at: DateTime<Utc>,
    pub user_id: Uuid,
    /// The token that acted, when the caller knows it.
    pub token_id: Option<Uuid>,
    pub action: AuditAction,
    pub host_id: Option<Uuid>,
    pub terminal_id: Option<Uuid>,
    pub instance_id: String,
    /// A short note (the signal of a kill, the grid of a resize).
    pub detail: Option<String>,
}

/// One stored audit event (docs/REST.md, "Audit").
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditEvent {
    pub id: Uuid,
    pub at: DateTime<Utc>,
    pub user_id: Uuid,
    pub token_id: Option<Uuid>,
    pub action: AuditAction,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_id: Option<Uuid>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub terminal_id: Option<Uuid>,
    pub instance_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// A daemon's hello, as [`super::Store::host_hello`] records it.
#[derive(Debug, Clone, Copy)]
pub struct HostHello<'a> {
    pub host_id: Uuid,
    /// The connection that takes the host lease.
    pub holder: &'a LeaseHolder,
    pub lease_ttl: std::time::Duration,
    pub capabilities: &'a Capabilities,
    pub dirs: &'a [String],
    /// The terminals the daemon says it still runs.
    pub running: &'a [Uuid],
}

/// A live or pending terminal of a host after its hello, oldest first.
#[derive(Debug, Clone)]
pub struct HelloTerminal {
    pub terminal: Terminal,
    /// Where the stored log of its run ends, when it belongs to a run that
    /// has not finished: the run's capture resumes there.
    pub unfinished_run_log_end: Option<i64>,
}

/// What revoking a token found ([`super::Store::revoke_token`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Revocation {
    /// Revoked by this call; the token was `user_id`'s.
    Now { user_id: Uuid },
    /// Revoked before; its first revocation time stays.
    Earlier,
}

/// A usable token as its lookup found it ([`super::Store::token_by_hash`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundToken {
    pub user: User,
    pub token: ApiToken,
    /// The host the token is bound to, read in the same round trip (None:
    /// not bound, or no such host).
    pub bound_host: Option<HostAdmission>,
}

/// A host as a hello's database check sees it ([`super::Store::host_admission`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostAdmission {
    pub user_id: Uuid,
    /// The cell the host is assigned to and the assignment's epoch.
    pub assignment: Option<(String, i64)>,
}
