//! The token lookups of an instance, folded (docs/ARCHITECTURE.md, "Actors
//! of an instance", the token lookups): every request and socket upgrade
//! looks its token up here, and one task per instance runs what queued as
//! one [`Store::tokens_by_hash`], with at most [`IN_FLIGHT`] statements at
//! once: lookups that arrive while every one of them runs go out together
//! in the next.
//!
//! A lone lookup goes out at once, as it would on its own. In a reconnect
//! storm (thousands of daemons upgrading in the same second after an
//! instance restarts) the lookups of a whole wave share one round trip, so
//! the database sees about one statement per hello (the hello's own) rather
//! than two. The queue is unbounded, like the requests waiting for it: each
//! entry belongs to a request in flight, which the HTTP server bounds.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::store::{FoundToken, Store, StoreError, StoreResult};

/// The most hashes looked up in one statement.
const BATCH: usize = 1000;
/// The most statements running at once. More than one, so that a storm's
/// lookups are not held to one statement's latency under a loaded
/// database; few, so that they leave the pool to the hellos.
const IN_FLIGHT: usize = 4;

type Answer = oneshot::Sender<StoreResult<Option<FoundToken>>>;

/// Where requests queue their token lookups.
#[derive(Clone)]
pub struct TokenLookups {
    queue: mpsc::UnboundedSender<(String, Answer)>,
}

impl TokenLookups {
    /// Starts the lookup task on the current runtime.
    pub fn start(store: Arc<dyn Store>) -> Self {
        let (queue, inbox) = mpsc::unbounded_channel();
        tokio::spawn(look_up_batches(store, inbox));
        Self { queue }
    }

    /// The usable token of `token_hash` ([`Store::token_by_hash`]).
    pub async fn find(&self, token_hash: String) -> StoreResult<Option<FoundToken>> {
        let (answer, answered) = oneshot::channel();
        let stopped = || StoreError::Pool("the token lookup task has stopped".into());
        self.queue.send((token_hash, answer)).map_err(|_| stopped())?;
        answered.await.map_err(|_| stopped())?
    }
}

async fn look_up_batches(store: Arc<dyn Store>, mut inbox: mpsc::UnboundedReceiver<(String, Answer)>) {
    let in_flight = Arc::new(Semaphore::new(IN_FLIGHT));
    loop {
        // A free slot first, then whatever has queued: while every slot is
        // busy, the lookups that arrive wait and go out together.
        let Ok(slot) = in_flight.clone().acquire_owned().await else { return };
        let mut batch = Vec::new();
        if inbox.recv_many(&mut batch, BATCH).await == 0 {
            return;
        }
        let store = store.clone();
        tokio::spawn(async move {
            look_up(store.as_ref(), batch).await;
            drop(slot);
        });
    }
}

/// Looks a batch up in one statement and answers each lookup.
async fn look_up(store: &dyn Store, batch: Vec<(String, Answer)>) {
    let mut hashes: Vec<String> = batch.iter().map(|(hash, _)| hash.clone()).collect();
    hashes.sort_unstable();
    hashes.dedup();
    let found = store.tokens_by_hash(&hashes, chrono::Utc::now()).await.map_err(Arc::new);
    // A request that went away no longer waits for its answer.
    for (hash, to) in batch {
        let _ = to.send(match &found {
            Ok(found) => Ok(found.get(&hash).cloned()),
            Err(e) => Err(StoreError::Shared(e.clone())),
        });
    }
}
