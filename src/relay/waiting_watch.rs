//! Watching the terminals this instance has waiting viewers for
//! (docs/CLUSTER.md, "Failover").
//!
//! A viewer can join a terminal here while its host is between owners (its
//! old connection gone, the new one not yet holding the lease); it then waits
//! in a local arbiter. When the host comes back on another instance, the new
//! owner announces the takeover with `HostTaken` on the channel of each of
//! the host's live terminals. The registry keeps this instance subscribed to
//! the channels of exactly the terminals that have an arbiter here while
//! their host has no ready connection here, so the waiting viewers are sent
//! to the new owner (4503, reattach) at once rather than at the next
//! heartbeat. After each subscription the registry reads the lease once,
//! which closes the gap of a takeover announced before it took effect.
//! Terminal channels carry only frames for home viewers and these
//! announcements, so watching one never makes this instance answer for a
//! host it does not hold.
//!
//! Subscriptions are changed by one task, in the order the registry asked,
//! so a watch dropped and taken again never unbalances the bus's count.

use std::collections::HashMap;
use std::sync::Arc;

use actix::prelude::*;
use tokio::sync::mpsc;
use uuid::Uuid;

use super::registry::{HostRegistry, RecheckWaiting};
use crate::bus::Bus;

/// The watched terminals (with their hosts), and the task that subscribes.
pub struct WaitingWatch {
    watched: HashMap<Uuid, Uuid>,
    changes: Option<mpsc::UnboundedSender<Change>>,
}

struct Change {
    terminal_id: Uuid,
    host_id: Uuid,
    watch: bool,
}

impl WaitingWatch {
    /// No watching: an instance alone on its bus has no other owner to
    /// wait for.
    pub fn off() -> Self {
        Self { watched: HashMap::new(), changes: None }
    }

    /// Starts the subscribing task; after each new subscription the
    /// registry re-reads that terminal's host lease.
    pub fn start(bus: Arc<Bus>, registry: Addr<HostRegistry>) -> Self {
        let (changes, mut queue) = mpsc::unbounded_channel::<Change>();
        actix_rt::spawn(async move {
            while let Some(change) = queue.recv().await {
                let channel = bus.terminal_channel(change.terminal_id);
                if !change.watch {
                    bus.unsubscribe(&channel).await;
                    continue;
                }
                match bus.subscribe(&channel).await {
                    Ok(()) => registry.do_send(RecheckWaiting(change.host_id)),
                    Err(e) => {
                        tracing::warn!(error = %e, terminal_id = %change.terminal_id, "tether_waiting_watch_failed")
                    }
                }
            }
        });
        Self { watched: HashMap::new(), changes: Some(changes) }
    }

    /// Whether any terminal of `host_id` is watched.
    pub fn watches_host(&self, host_id: Uuid) -> bool {
        self.watched.values().any(|h| *h == host_id)
    }

    /// Watches `terminal_id` (of `host_id`) or stops watching it.
    pub fn set(&mut self, terminal_id: Uuid, host_id: Uuid, watch: bool) {
        let Some(changes) = &self.changes else { return };
        let changed = if watch {
            self.watched.insert(terminal_id, host_id).is_none()
        } else {
            self.watched.remove(&terminal_id).is_some()
        };
        if changed {
            let _ = changes.send(Change { terminal_id, host_id, watch });
        }
    }
}
