//! `Sweeper` (docs/ARCHITECTURE.md, "The sweep"): one instance at a time (lease `poller:sweep`),
//! every `sweep.interval_ms`:
//!
//! - hosts whose last-seen is older than `sweep.stale_host_ms` or whose
//!   lease lapsed become offline;
//! - parked terminals of hosts online on any instance are spawned, each
//!   Spawn routed to the host's owner;
//! - launches unacknowledged for `sweep.launch_timeout_ms` fail (and their
//!   runs with them);
//! - lease rows expired for more than a day are deleted;
//! - runs whose host has been gone longer than `runs.lost_after` become `lost`;
//! - audit events older than `audit.retention_ms` are deleted;
//! - the log of ended tokens is kept for [`ENDS_KEPT`] (the revocation
//!   watch reads only its last seconds).
//!
//! After a sweep the database did not answer, the first two are skipped for
//! one lease TTL: every lease may have lapsed while nobody could renew it
//! ([`LapseGrace`]).

use std::time::Duration;

use actix::prelude::*;

use crate::config::ms;
use crate::relay::lapse_grace::LapseGrace;
use crate::relay::registry::TerminalLifecycle;
use crate::relay::requests::{deliver, HostOp};
use crate::relay::token_watch::ENDS_KEPT;
use crate::relay::{LifecycleEvent, RelayContext};
use crate::store::{LeaseHolder, RunState, StoreError};

/// The lease that makes one instance the sweeper.
pub const SWEEP_LEASE: &str = "poller:sweep";
/// Parked terminals spawned per sweep at most; the rest wait for the next.
const PARKED_PER_SWEEP: usize = 500;
/// Expired lease rows are kept this long (for inspection) before deletion.
const EXPIRED_LEASE_KEEP: Duration = Duration::from_secs(24 * 3600);

pub struct Sweeper {
    relay: RelayContext,
    running: bool,
    /// After a sweep the database did not answer, lapsed host leases are
    /// not acted on for one lease TTL ([`LapseGrace`]).
    grace: LapseGrace,
}

impl Sweeper {
    pub fn new(relay: RelayContext) -> Self {
        let grace = LapseGrace::new(ms(relay.settings.lease.ttl_ms));
        Self { relay, running: false, grace }
    }
}

impl Actor for Sweeper {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let every = ms(self.relay.settings.sweep.interval_ms);
        ctx.run_interval(every, |act, ctx| {
            if act.running {
                return; // a slow sweep is never overlapped by the next
            }
            act.running = true;
            let relay = act.relay.clone();
            let judge_lapses = act.grace.believe_lapses(std::time::Instant::now());
            async move { sweep(&relay, judge_lapses).await }
                .into_actor(act)
                .map(|swept, act, _| {
                    act.running = false;
                    match swept {
                        Ok(()) => act.grace.answered(std::time::Instant::now()),
                        Err(e) => {
                            tracing::warn!(error = %e, "tether_sweep_failed");
                            if e.is_transient() {
                                act.grace.failed();
                            }
                        }
                    }
                })
                .spawn(ctx);
        });
    }
}

/// One sweep, if this instance holds (or takes) the sweep lease. Without
/// `judge_lapses` (the database just came back) hosts and runs are not
/// judged by their leases.
pub async fn sweep(relay: &RelayContext, judge_lapses: bool) -> Result<(), StoreError> {
    let store = &relay.store;
    let settings = &relay.settings;
    // Held for two intervals, renewed by each sweep: a dead sweeper is
    // replaced after at most two missed sweeps.
    let ttl = ms(settings.sweep.interval_ms.saturating_mul(2));
    if !store.claim_lease(SWEEP_LEASE, &LeaseHolder::instance(&relay.instance_id), ttl).await? {
        return Ok(());
    }
    if judge_lapses {
        let offline = store.mark_stale_hosts_offline(ms(settings.sweep.stale_host_ms)).await?;
        for host_id in &offline {
            tracing::info!(%host_id, "tether_host_marked_offline");
        }
    }
    // Parked terminals of hosts online anywhere: the routing step sends
    // each Spawn to the host's owner, here or over the bus.
    for terminal in store.parked_on_online_hosts(PARKED_PER_SWEEP).await? {
        let _ = deliver(relay, terminal.host_id, HostOp::Spawn(terminal.id)).await;
    }
    for terminal_id in store.fail_stuck_launches(ms(settings.sweep.launch_timeout_ms)).await? {
        tracing::info!(%terminal_id, "tether_launch_timed_out");
        metrics::counter!("tether_launch_timeouts_total").increment(1);
        if let Some(run_id) = store.terminal_by_id(terminal_id).await?.and_then(|t| t.run_id) {
            store.finish_run(run_id, RunState::Failed, None).await?;
        }
        let event = LifecycleEvent::SpawnFailed("launch not acknowledged".into());
        relay.registry.do_send(TerminalLifecycle { terminal_id, event });
    }
    let deleted = store.delete_expired_leases(EXPIRED_LEASE_KEEP).await?;
    if deleted > 0 {
        tracing::info!(deleted, "tether_expired_leases_deleted");
    }
    if judge_lapses {
        for run_id in store.mark_lost_runs(ms(settings.runs.lost_after)).await? {
            tracing::info!(%run_id, "tether_run_lost");
            metrics::counter!("tether_runs_lost_total").increment(1);
        }
    }
    let retention = chrono::Duration::milliseconds(i64::try_from(settings.audit.retention_ms).unwrap_or(i64::MAX));
    let cutoff = chrono::Utc::now().checked_sub_signed(retention).unwrap_or(chrono::DateTime::<chrono::Utc>::MIN_UTC);
    let aged = store.delete_audit_events_before(cutoff).await?;
    if aged > 0 {
        tracing::info!(deleted = aged, "tether_audit_events_aged_out");
    }
    let ends_kept = chrono::Duration::from_std(ENDS_KEPT).unwrap_or(chrono::Duration::MAX);
    store.delete_token_ends_before(chrono::Utc::now() - ends_kept).await?;
    Ok(())
}
