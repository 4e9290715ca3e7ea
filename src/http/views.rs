//! JSON shape of the host resource (docs/REST.md, "Host"): its `state` is live (from the
//! lease), not the stored last-known value. Terminals and runs serialize
//! their rows directly (`store::types`).

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use crate::store::{Capabilities, Host, HostState};

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
    /// Orders the host list (pagination); not part of the resource.
    #[serde(skip)]
    pub created_at: DateTime<Utc>,
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
            created_at: host.created_at,
        }
    }
}
