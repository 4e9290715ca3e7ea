//! Closing the sockets of a token that is no longer usable (docs/REST.md,
//! "Revocation and expiry"): every open daemon and viewer socket on this
//! instance is watched under its token's id, and every
//! `auth.revocation_check_ms` (500 ms by default) one query asks the shared
//! database which tokens ended since the last look. A socket whose token was
//! revoked, expired or deleted is closed 4401.
//!
//! Why a periodic check and not a bus message: expiry has no event to
//! publish, a row can be deleted behind the server's back, and a message
//! published while Redis is away (or to an instance without Redis) would be
//! lost; the database is the one place every instance agrees on.
//!
//! What a tick costs does not grow with the open sockets
//! (docs/ARCHITECTURE.md, "Closing the sockets of an ended token"): the
//! database logs every revocation, expiry change and deletion of a token
//! (`api_token_ends`, by trigger), and a tick reads the log and the expiries
//! since its last look (with [`OVERLAP`] so a change committed while the last
//! look ran is not missed), plus the tokens of sockets opened since then
//! (their token may have ended between their authentication and the look's
//! window). The first look, and one after [`FULL_AFTER`] without an answer,
//! checks every watched token instead, since the log is kept only for
//! [`ENDS_KEPT`].

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::{Message, Recipient};
use uuid::Uuid;

use chrono::{DateTime, Utc};

use crate::store::Store;

/// How far before the last look's database time the next look reads the
/// log: a revocation logged just before that time may have committed after it.
pub const OVERLAP: Duration = Duration::from_secs(5);
/// How long the sweep keeps the log of ended tokens.
pub const ENDS_KEPT: Duration = Duration::from_secs(3600);
/// A watch that has had no answer for this long checks every token again
/// (well inside [`ENDS_KEPT`], so no logged end is swept before it is read).
pub const FULL_AFTER: Duration = Duration::from_secs(1800);

/// The socket's token is no longer usable: close 4401.
#[derive(Message, Clone, Copy)]
#[rtype(result = "()")]
pub struct TokenRevoked;

/// The open sockets of this instance by token id.
#[derive(Default)]
pub struct TokenWatch {
    sockets: Mutex<Sockets>,
    next: AtomicU64,
}

#[derive(Default)]
struct Sockets {
    by_token: HashMap<Uuid, HashMap<u64, Recipient<TokenRevoked>>>,
    /// Tokens of sockets opened since the last answered look.
    fresh: HashSet<Uuid>,
}

/// Where the watch's next look starts.
struct Cursor {
    /// The database's time of the last answered look, less [`OVERLAP`];
    /// None before the first.
    since: Option<DateTime<Utc>>,
    answered: Instant,
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
        if let Some(of_token) = sockets.by_token.get_mut(&self.token_id) {
            of_token.remove(&self.key);
            if of_token.is_empty() {
                sockets.by_token.remove(&self.token_id);
            }
        }
    }
}

impl TokenWatch {
    /// Watches one socket opened with `token_id`.
    pub fn watch(self: &Arc<Self>, token_id: Uuid, socket: Recipient<TokenRevoked>) -> Watched {
        let key = self.next.fetch_add(1, Ordering::Relaxed);
        let mut sockets = self.sockets.lock().unwrap_or_else(|p| p.into_inner());
        sockets.by_token.entry(token_id).or_default().insert(key, socket);
        sockets.fresh.insert(token_id);
        Watched { watch: self.clone(), token_id, key }
    }

    /// The tokens the next look must check by id: those of sockets opened
    /// since the last answered look, or every watched token when `all`.
    fn take_fresh(&self, all: bool) -> Vec<Uuid> {
        let mut sockets = self.sockets.lock().unwrap_or_else(|p| p.into_inner());
        let fresh = std::mem::take(&mut sockets.fresh);
        if all {
            sockets.by_token.keys().copied().collect()
        } else {
            fresh.into_iter().filter(|id| sockets.by_token.contains_key(id)).collect()
        }
    }

    /// A look went unanswered: its fresh tokens are checked by the next.
    fn keep_fresh(&self, ids: Vec<Uuid>) {
        self.sockets.lock().unwrap_or_else(|p| p.into_inner()).fresh.extend(ids);
    }

    /// Tells every socket of the `ended` tokens to close; returns how many
    /// were told.
    pub fn close_ended(&self, ended: &[Uuid]) -> usize {
        let sockets = self.sockets.lock().unwrap_or_else(|p| p.into_inner());
        let mut told = 0;
        for id in ended {
            for socket in sockets.by_token.get(id).into_iter().flat_map(HashMap::values) {
                socket.do_send(TokenRevoked);
                told += 1;
            }
        }
        told
    }

    /// Whether any socket is watched.
    fn is_idle(&self) -> bool {
        self.sockets.lock().unwrap_or_else(|p| p.into_inner()).by_token.is_empty()
    }

    /// Looks for ended tokens every `every`, forever.
    pub async fn run(self: Arc<Self>, store: Arc<dyn Store>, every: Duration) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut cursor = Cursor { since: None, answered: Instant::now() };
        loop {
            tick.tick().await;
            if self.is_idle() {
                // Nothing to close; the next socket's token is fresh.
                continue;
            }
            let all = cursor.since.is_none() || cursor.answered.elapsed() > FULL_AFTER;
            let since = if all { None } else { cursor.since };
            let fresh = self.take_fresh(all);
            match store.ended_tokens(since, &fresh).await {
                Ok(found) => {
                    let overlap = chrono::Duration::from_std(OVERLAP).unwrap_or(chrono::Duration::zero());
                    cursor = Cursor { since: Some(found.checked_at - overlap), answered: Instant::now() };
                    let told = self.close_ended(&found.ended);
                    if told > 0 {
                        tracing::info!(sockets = told, "tether_token_sockets_closed");
                        metrics::counter!("tether_token_sockets_closed_total").increment(told as u64);
                    }
                }
                // Sockets stay open while the database cannot answer; the
                // next tick asks again, from the same point.
                Err(e) => {
                    tracing::warn!(error = %e, "tether_token_check_failed");
                    self.keep_fresh(fresh);
                }
            }
        }
    }
}
