//! Closing the sockets of a token that is no longer usable (docs/REST.md,
//! "Revocation and expiry"): every open daemon and viewer socket on this
//! instance is watched under its token's id, and every
//! `auth.revocation_check_ms` (500 ms by default) one query asks the shared
//! database which of those ids are still usable. A socket whose token was
//! revoked, expired or deleted is closed 4401.
//!
//! Why a periodic check and not a bus message: expiry has no event to
//! publish, a row can be deleted behind the server's back, and a message
//! published while Redis is away (or to an instance without Redis) would be
//! lost; the database is the one place every instance agrees on. The cost
//! is one indexed query per instance per tick, over the distinct tokens of
//! its open sockets (none when it has no socket).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::{Message, Recipient};
use uuid::Uuid;

use crate::store::Store;

/// The socket's token is no longer usable: close 4401.
#[derive(Message, Clone, Copy)]
#[rtype(result = "()")]
pub struct TokenRevoked;

/// The open sockets of this instance by token id.
#[derive(Default)]
pub struct TokenWatch {
    sockets: Mutex<HashMap<Uuid, HashMap<u64, Recipient<TokenRevoked>>>>,
    next: AtomicU64,
}

/// A watched socket; dropping it (with its actor) stops the watch.
pub struct Watched {
    watch: Arc<TokenWatch>,
    token_id: Uuid,
    key: u64,
}

impl Drop for Watched {
    fn drop(&mut self) {
        let mut sockets = self.watch.sockets.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(of_token) = sockets.get_mut(&self.token_id) {
            of_token.remove(&self.key);
            if of_token.is_empty() {
                sockets.remove(&self.token_id);
            }
        }
    }
}

impl TokenWatch {
    /// Watches one socket opened with `token_id`.
    pub fn watch(self: &Arc<Self>, token_id: Uuid, socket: Recipient<TokenRevoked>) -> Watched {
        let key = self.next.fetch_add(1, Ordering::Relaxed);
        let mut sockets = self.sockets.lock().unwrap_or_else(|p| p.into_inner());
        sockets.entry(token_id).or_default().insert(key, socket);
        Watched { watch: self.clone(), token_id, key }
    }

    /// The distinct tokens of the open sockets.
    pub fn token_ids(&self) -> Vec<Uuid> {
        self.sockets.lock().unwrap_or_else(|p| p.into_inner()).keys().copied().collect()
    }

    /// Tells every socket of a token that is not in `usable` to close;
    /// returns how many were told.
    pub fn close_unusable(&self, checked: &[Uuid], usable: &[Uuid]) -> usize {
        // A set: an instance with thousands of daemons watches thousands of
        // tokens (one per machine), and this runs every tick.
        let usable: HashSet<&Uuid> = usable.iter().collect();
        let sockets = self.sockets.lock().unwrap_or_else(|p| p.into_inner());
        let mut told = 0;
        for id in checked.iter().filter(|id| !usable.contains(id)) {
            for socket in sockets.get(id).into_iter().flat_map(HashMap::values) {
                socket.do_send(TokenRevoked);
                told += 1;
            }
        }
        told
    }

    /// Checks the watched tokens every `every`, forever.
    pub async fn run(self: Arc<Self>, store: Arc<dyn Store>, every: Duration) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let ids = self.token_ids();
            if ids.is_empty() {
                continue;
            }
            match store.usable_tokens(&ids).await {
                Ok(usable) => {
                    let told = self.close_unusable(&ids, &usable);
                    if told > 0 {
                        tracing::info!(sockets = told, "tether_token_sockets_closed");
                        metrics::counter!("tether_token_sockets_closed_total").increment(told as u64);
                    }
                }
                // Sockets stay open while the database cannot answer; the
                // next tick asks again.
                Err(e) => tracing::warn!(error = %e, "tether_token_check_failed"),
            }
        }
    }
}
