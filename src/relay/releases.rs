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
//! else (its claim never seized, or the lease lapsed) in one more statement
//! for the rest of the batch, which checks the leases as it writes. The
//! queue is unbounded because a release must not be dropped; it holds at
//! most one entry per connection that ended, so it is bounded by the
//! connections an instance holds.
//!
//! A connection takes its [`PendingRelease`] the moment it ends, before it
//! leaves the registry and its host's channel; the release counts as
//! unsettled from then until its statement has run. The drain waits for
//! [`LeaseReleases::settled`] before the process exits, so a connection
//! that ended just before a SIGTERM does not leave its host online until
//! the lease lapses.

use std::collections::HashSet;
use std::sync::Arc;

use tokio::sync::mpsc;
use uuid::Uuid;

use super::owed::Owed;
use crate::store::{LeaseHolder, Store};

/// The most leases released in one statement.
const BATCH: usize = 2000;

/// Where ended connections queue their leases.
#[derive(Clone)]
pub struct LeaseReleases {
    queue: mpsc::UnboundedSender<(Uuid, LeaseHolder)>,
    /// Releases taken by ended connections whose statement has not run yet.
    unsettled: Arc<Owed>,
}

impl LeaseReleases {
    /// Starts the releasing task on the current runtime.
    pub fn start(store: Arc<dyn Store>) -> Self {
        let (queue, inbox) = mpsc::unbounded_channel();
        let unsettled = Arc::new(Owed::default());
        tokio::spawn(release_batches(store, inbox, unsettled.clone()));
        Self { queue, unsettled }
    }

    /// The release a connection to `host_id` that held `holder` owes, taken
    /// the moment the connection ends; queued when it is handed in or dropped.
    pub fn ended(&self, host_id: Uuid, holder: LeaseHolder) -> PendingRelease {
        self.unsettled.add(1);
        PendingRelease { releases: self.clone(), lease: Some((host_id, holder)) }
    }

    /// Returns once every release taken so far has had its statement run
    /// (the drain waits for it before the process exits).
    pub async fn settled(&self) {
        self.unsettled.settled().await;
    }

    /// How many releases taken so far have yet to run.
    pub fn unsettled(&self) -> usize {
        self.unsettled.count()
    }
}

/// A lease an ended connection has yet to release: queued by
/// [`PendingRelease::release`], or by its drop if the task holding it is
/// cancelled first (a worker stopping), so it cannot be lost on the way.
pub struct PendingRelease {
    releases: LeaseReleases,
    lease: Option<(Uuid, LeaseHolder)>,
}

impl PendingRelease {
    /// Queues the release; never waits.
    pub fn release(mut self) {
        self.queue();
    }

    fn queue(&mut self) {
        let Some(lease) = self.lease.take() else { return };
        // The task ends only with the runtime; a release it will never run
        // is not waited for.
        if self.releases.queue.send(lease).is_err() {
            self.releases.unsettled.settle(1);
        }
    }
}

impl Drop for PendingRelease {
    fn drop(&mut self) {
        self.queue();
    }
}

/// Releases queued leases, a batch per statement, until every handle is gone.
async fn release_batches(
    store: Arc<dyn Store>,
    mut inbox: mpsc::UnboundedReceiver<(Uuid, LeaseHolder)>,
    unsettled: Arc<Owed>,
) {
    let mut batch = Vec::with_capacity(BATCH);
    while inbox.recv_many(&mut batch, BATCH).await > 0 {
        release(&*store, &batch).await;
        unsettled.settle(batch.len());
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
    if let Err(e) = store.mark_hosts_offline_unless_leased(&rest).await {
        tracing::warn!(error = %e, hosts = rest.len(), "tether_host_state_failed");
    }
    for host_id in &rest {
        tracing::info!(%host_id, "tether_daemon_disconnected");
    }
}
