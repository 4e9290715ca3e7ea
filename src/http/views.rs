//! JSON shapes of the REST resources (SPEC §6): camelCase field names,
//! single resources wrapped (`{"host":{...}}`) and lists too.

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use crate::store::{Capabilities, Host, HostState, Run, RunState, RunUsage, Terminal, TerminalState};

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HostView {
    pub id: Uuid,
    pub name: String,
    pub hostname: String,
    pub platform: String,
    pub arch: String,
    /// Live: online while this instance has the socket or the lease is live.
    pub state: HostState,
    pub capabilities: Capabilities,
    pub dirs: Vec<String>,
    pub last_seen_at: Option<DateTime<Utc>>,
}

impl HostView {
    pub fn new(host: Host, online: bool) -> Self {
        Self {
            id: host.id,
            name: host.name,
            hostname: host.hostname,
            platform: host.platform,
            arch: host.arch,
            state: if online { HostState::Online } else { HostState::Offline },
            capabilities: host.capabilities,
            dirs: host.dirs,
            last_seen_at: host.last_seen_at,
        }
    }
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TerminalView {
    pub id: Uuid,
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
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub ended_at: Option<DateTime<Utc>>,
}

impl From<Terminal> for TerminalView {
    fn from(t: Terminal) -> Self {
        Self {
            id: t.id,
            host_id: t.host_id,
            title: t.title,
            dir: t.dir,
            argv: t.argv,
            state: t.state,
            pending_reason: t.pending_reason,
            exit_code: t.exit_code,
            exit_signal: t.exit_signal,
            error: t.error,
            cols: t.cols,
            rows: t.rows,
            created_at: t.created_at,
            started_at: t.started_at,
            ended_at: t.ended_at,
        }
    }
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunView {
    pub id: Uuid,
    pub host_id: Uuid,
    pub argv: Vec<String>,
    pub dir: Option<String>,
    pub state: RunState,
    pub exit_code: Option<i32>,
    pub usage: Option<RunUsage>,
    pub terminal_id: Option<Uuid>,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

impl From<Run> for RunView {
    fn from(r: Run) -> Self {
        Self {
            id: r.id,
            host_id: r.host_id,
            argv: r.argv,
            dir: r.dir,
            state: r.state,
            exit_code: r.exit_code,
            usage: r.usage,
            terminal_id: r.terminal_id,
            created_at: r.created_at,
            finished_at: r.finished_at,
        }
    }
}
