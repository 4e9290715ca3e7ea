//! The host leases of daemon connections that ended, released in batches
//! (docs/ARCHITECTURE.md, "Actors of an instance", the lease releaser).
//!
//! A connection that ends queues its (host, holder) here and one task per
//! instance releases what is queued in one statement
//! ([`Store::release_host_leases`]), taking everything that queued while
//! the statement before it ran: a lone disconnect goes out at once, and a
//! mass disconnect (a network cut between the daemons and this instance)
//! costs a statement per batch rather than one per host, while the same
//! daemons are redialling and being admitted.
//!
//! A host is marked offline only when no connection anywhere holds its
//! lease: in the release's own statement when the ended connection held it,
//! else (its claim never seized, or the lease lapsed) after one read of the
//! batch's remaining holders. The queue is unbounded because a release
//! must not be dropped; it holds at most one entry per connection that
//! ended, so it is bounded by the connections an instance holds.

use std::collections::HashSet;
use std::sync::Arc;

use tokio::sync::mpsc;
use uuid::Uuid;

use crate::store::{host_lease_key, HostState, LeaseHolder, Store};

/// The most leases released in one statement.
const BATCH: usize = 2000;

/// Where ended connections queue their leases.
#[derive(Clone)]
pub struct LeaseReleases {
    queue: mpsc::UnboundedSender<(Uuid, LeaseHolder)>,
}

impl LeaseReleases {
    /// Starts the releasing task on the current runtime.
    pub fn start(store: Arc<dyn Store>) -> Self {
        let (queue, inbox) = mpsc::unbounded_channel();
        tokio::spawn(release_batches(store, inbox));
        Self { queue }
    }

    /// Queues the lease a connection to `host_id` held as `holder`; never waits.
    pub fn release(&self, host_id: Uuid, holder: LeaseHolder) {
        // The task ends only with the runtime, when nothing is left to release.
        let _ = self.queue.send((host_id, holder));
    }
}

/// Releases queued leases, a batch per statement, until every handle is gone.
async fn release_batches(store: Arc<dyn Store>, mut inbox: mpsc::UnboundedReceiver<(Uuid, LeaseHolder)>) {
    let mut batch = Vec::with_capacity(BATCH);
    while inbox.recv_many(&mut batch, BATCH).await > 0 {
        release(&*store, &batch).await;
        batch.clear();
    }
}

async fn release(store: &dyn Store, batch: &[(Uuid, LeaseHolder)]) {
    let released: HashSet<Uuid> = match store.release_host_leases(batch).await {
        Ok(released) => released.into_iter().collect(),
        Err(e) => {
            tracing::warn!(error = %e, hosts = batch.len(), "tether_lease_release_failed");
            HashSet::new()
        }
    };
    for host_id in &released {
        tracing::info!(%host_id, "tether_daemon_disconnected");
    }
    // The hosts whose ended connection held no lease: offline unless some
    // connection, here or elsewhere, holds one now.
    let rest: Vec<Uuid> = {
        let mut seen = HashSet::new();
        batch.iter().map(|(host_id, _)| *host_id).filter(|h| !released.contains(h) && seen.insert(*h)).collect()
    };
    if rest.is_empty() {
        return;
    }
    let keys: Vec<String> = rest.iter().map(|h| host_lease_key(*h)).collect();
    let held: HashSet<String> = match store.lease_holders(&keys).await {
        Ok(held) => held.into_iter().map(|(key, _)| key).collect(),
        Err(e) => {
            tracing::warn!(error = %e, hosts = rest.len(), "tether_lease_read_failed");
            return;
        }
    };
    for (host_id, key) in rest.iter().zip(&keys) {
        if !held.contains(key) {
            if let Err(e) = store.set_host_state(*host_id, HostState::Offline).await {
                tracing::warn!(error = %e, %host_id, "tether_host_state_failed");
            }
        }
        tracing::info!(%host_id, "tether_daemon_disconnected");
    }
}
