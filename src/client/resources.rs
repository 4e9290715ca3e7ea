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
}
