//! `CredentialsRefresher` (docs/CLUSTER.md, "Periodic host tasks"): every
//! instance looks, each `credentials.check_ms`, for connected hosts whose
//! stored credentials expire within `credentials.refresh_before_ms`. For
//! each it tries to take the lease `credentials-refresh:<hostId>` for that
//! window; the one instance that gets it has the host's owner refresh them
//! (the owner task of docs/REST.md, "Daemon requests"), so a host's
//! credentials are refreshed at most once per window across the cluster.
//!
//! The expiry is read from the credentials the daemon serves: a top-level
//! `expiresAt` string in RFC 3339 (docs/PROTOCOL.md,
//! "`CredentialsResult.credentials_json`"). Credentials without one are
//! stored without an expiry and never refreshed automatically.

use std::time::Duration;

use actix::prelude::*;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::config::ms;
use crate::relay::requests::{deliver, HostOp};
use crate::relay::RelayContext;
use crate::store::{LeaseHolder, StoreError};

/// The field of the daemon's credentials JSON that states their expiry.
pub const EXPIRY_FIELD: &str = "expiresAt";

/// The lease that makes one instance refresh a host's credentials.
pub fn refresh_lease_key(host_id: Uuid) -> String {
    format!("credentials-refresh:{host_id}")
}

/// The expiry a credentials object states, if it has a readable one.
pub fn stated_expiry(credentials: &serde_json::Value) -> Option<DateTime<Utc>> {
    let text = credentials.get(EXPIRY_FIELD)?.as_str()?;
    DateTime::parse_from_rfc3339(text).ok().map(|t| t.with_timezone(&Utc))
}

pub struct CredentialsRefresher {
    relay: RelayContext,
    running: bool,
}

impl CredentialsRefresher {
    pub fn new(relay: RelayContext) -> Self {
        Self { relay, running: false }
    }
}

impl Actor for CredentialsRefresher {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        if self.relay.settings.encryption_key().is_none() {
            return; // nothing is ever stored, so nothing expires
        }
        ctx.run_interval(ms(self.relay.settings.credentials.check_ms), |act, ctx| {
            if act.running {
                return; // a slow look is never overlapped by the next
            }
            act.running = true;
            let relay = act.relay.clone();
            async move {
                if let Err(e) = refresh_due(&relay, Utc::now()).await {
                    tracing::warn!(error = %e, "tether_credentials_check_failed");
                }
            }
            .into_actor(act)
            .map(|(), act, _| act.running = false)
            .spawn(ctx);
        });
    }
}

/// One look at `now`: claims the refresh of each connected host whose
/// credentials expire within the window and has its owner refresh them.
/// Returns the hosts this instance refreshed (or tried to).
pub async fn refresh_due(relay: &RelayContext, now: DateTime<Utc>) -> Result<Vec<Uuid>, StoreError> {
    metrics::counter!("tether_credentials_checks_total").increment(1);
    let window_ms = relay.settings.credentials.refresh_before_ms;
    let window = Duration::from_millis(window_ms);
    let before = now + chrono::Duration::milliseconds(i64::try_from(window_ms).unwrap_or(i64::MAX));
    let mut claimed = Vec::new();
    for host_id in relay.store.credentials_expiring(before).await? {
        // A holder no other claim shares: the lease is taken only when it
        // is free or expired, never renewed by a later look of this instance.
        let holder = LeaseHolder::connection(&relay.instance_id, Uuid::new_v4().as_u64_pair().0);
        if !relay.store.claim_lease(&refresh_lease_key(host_id), &holder, window).await? {
            continue;
        }
        claimed.push(host_id);
        let outcome = deliver(relay, host_id, HostOp::RefreshCredentials).await;
        let label = if outcome.is_ok() { "ok" } else { "failed" };
        metrics::counter!("tether_credentials_refreshes_total", "outcome" => label).increment(1);
        match outcome {
            Ok(_) => tracing::info!(%host_id, "tether_credentials_refreshed"),
            Err(e) => tracing::warn!(%host_id, error = %e, "tether_credentials_refresh_failed"),
        }
    }
    Ok(claimed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_expiry_is_read_from_expires_at_in_rfc3339() {
        let at = stated_expiry(&json!({"token": "t", "expiresAt": "2030-01-02T03:04:05+01:00"}));
        assert_eq!(at.map(|t| t.to_rfc3339()), Some("2030-01-02T02:04:05+00:00".to_string()));
        assert_eq!(stated_expiry(&json!({"token": "t"})), None, "no expiry stated");
        assert_eq!(stated_expiry(&json!({"expiresAt": 1_700_000_000})), None, "not a timestamp string");
        assert_eq!(stated_expiry(&json!({"expiresAt": "tomorrow"})), None);
    }
}
