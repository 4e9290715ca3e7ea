//! Daemon-driven writes that wait out a database outage (docs/OPERATIONS.md,
//! "Faults").
//!
//! What a daemon reports (a terminal started, failed, exited or was
//! resized, its final screen, a run's usage) is written at once. When the
//! database cannot take a write now ([`StoreError::is_transient`]: it is
//! down, restarting, or its disk is full) the write is kept here and
//! retried in order, with backoff, until it is stored, while the connection
//! goes on streaming: output needs no database, and frames are never held
//! up by a write. Writes of later frames queue behind a kept one, so facts
//! land in the order the daemon sent them. A size replaces an earlier
//! queued size of the same terminal, so the queue holds a few writes per
//! terminal, and it is capped besides.
//!
//! When the connection ends with writes still kept, [`drain`] goes on with
//! them in a task of its own: every daemon-driven write is scoped by host
//! and compares state, so a write that lands late never overwrites a newer
//! fact, and a write retried after it did land changes nothing.
//!
//! A write handed to the connection's store step is owed
//! ([`Write::owed_to`], the instance's `RelayContext::writes`) until it is
//! stored or has failed for good; the instance's drain waits for every owed
//! write, within `shutdown.grace_ms`, so a SIGTERM during an outage does
//! not drop the facts kept through it when the database is back in time.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use uuid::Uuid;

use crate::relay::owed::{Owed, OwedOne};
use crate::store::{Store, StoreError, StoreResult};

/// Writes kept at most per connection; past that new ones are dropped
/// (and logged). Sizes are coalesced, so reaching it takes thousands of
/// terminals ending during one outage.
const MAX_KEPT: usize = 10_000;
/// The first retry waits this long, doubling up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(100);
/// Retries of a kept write are at most this far apart, so its fact is
/// stored within a second of the database coming back.
const RETRY_MAX: Duration = Duration::from_secs(1);

pub type WriteFuture = Pin<Box<dyn Future<Output = StoreResult<()>> + Send>>;

/// One write, which can be made again as often as needed.
#[derive(Clone)]
pub struct Write {
    /// What it records, for logs.
    pub what: &'static str,
    /// A terminal's size: a later size of the same terminal replaces it.
    pub size_of: Option<Uuid>,
    make: Arc<dyn Fn(Arc<dyn Store>) -> WriteFuture + Send + Sync>,
    /// Settles the instance's count of owed writes when the last copy of
    /// this write is gone: stored, failed for good, or dropped at the exit.
    owed: Option<Arc<OwedOne>>,
}

impl Write {
    pub fn new<F, Fut>(what: &'static str, make: F) -> Self
    where
        F: Fn(Arc<dyn Store>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = StoreResult<()>> + Send + 'static,
    {
        Self { what, size_of: None, make: Arc::new(move |store| Box::pin(make(store))), owed: None }
    }

    /// Counts the write in `owed` until it is done with.
    pub fn owed_to(mut self, owed: &Arc<Owed>) -> Self {
        self.owed = Some(Arc::new(owed.one()));
        self
    }

    /// Marks the write as terminal `id`'s size.
    pub fn size_of(mut self, id: Uuid) -> Self {
        self.size_of = Some(id);
        self
    }

    /// One attempt.
    pub fn attempt(&self, store: Arc<dyn Store>) -> WriteFuture {
        (self.make)(store)
    }
}

/// How one attempt went.
pub enum Outcome {
    Stored,
    /// The database could not take it now; it is kept and retried.
    Kept,
    /// It failed for good (logged).
    Failed,
}

/// The writes a connection keeps for later, oldest first.
#[derive(Default)]
pub struct WriteQueue {
    kept: VecDeque<Write>,
    /// The oldest write is being retried right now.
    in_flight: bool,
    failures: u32,
}

impl WriteQueue {
    /// Writes are kept or being retried: a new write must queue behind them.
    pub fn busy(&self) -> bool {
        self.in_flight || !self.kept.is_empty()
    }

    /// Keeps `write` behind the others (a size replaces the same
    /// terminal's earlier size, unless that one is being retried).
    pub fn keep(&mut self, write: Write) {
        if let Some(id) = write.size_of {
            let skip = usize::from(self.in_flight);
            if let Some(at) = self.kept.iter().skip(skip).position(|w| w.size_of == Some(id)) {
                self.kept.remove(at + skip);
            }
        }
        if self.kept.len() >= MAX_KEPT {
            tracing::error!(what = write.what, "tether_daemon_write_dropped");
            return;
        }
        self.kept.push_back(write);
    }

    /// The oldest kept write, to retry now; it stays kept until
    /// [`Self::finished`].
    pub fn next(&mut self) -> Option<Write> {
        let write = self.kept.front().cloned()?;
        self.in_flight = true;
        Some(write)
    }

    /// The retry of the oldest write ended: it is dropped unless the
    /// database still could not take it.
    pub fn finished(&mut self, outcome: &Outcome) {
        self.in_flight = false;
        match outcome {
            Outcome::Kept => self.failures = self.failures.saturating_add(1),
            Outcome::Stored | Outcome::Failed => {
                self.failures = 0;
                self.kept.pop_front();
            }
        }
    }

    /// How long to wait before the next retry.
    pub fn backoff(&self) -> Duration {
        RETRY_FIRST.saturating_mul(1 << self.failures.min(8)).min(RETRY_MAX)
    }

    /// Every kept write, oldest first, for [`drain`].
    pub fn take(&mut self) -> VecDeque<Write> {
        self.in_flight = false;
        std::mem::take(&mut self.kept)
    }
}

/// Makes one attempt and sorts out its outcome; failures are logged.
pub async fn attempt(store: Arc<dyn Store>, write: &Write) -> Outcome {
    match write.attempt(store).await {
        Ok(()) => Outcome::Stored,
        Err(e) => classify(&e, write.what),
    }
}

fn classify(e: &StoreError, what: &'static str) -> Outcome {
    if e.is_transient() {
        tracing::warn!(error = %e, what, "tether_daemon_write_kept");
        Outcome::Kept
    } else {
        tracing::error!(error = %e, what, "tether_daemon_write_failed");
        Outcome::Failed
    }
}

/// Retries `writes` in order until each is stored or failed for good: the
/// rest of a connection that ended while the database was away.
pub async fn drain(store: Arc<dyn Store>, writes: VecDeque<Write>) {
    let mut queue = WriteQueue { kept: writes, in_flight: false, failures: 0 };
    while let Some(write) = queue.next() {
        let outcome = attempt(store.clone(), &write).await;
        queue.finished(&outcome);
        if let Outcome::Kept = outcome {
            tokio::time::sleep(queue.backoff()).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(what: &'static str) -> Write {
        Write::new(what, |_| async { Ok(()) })
    }

    fn whats(queue: &WriteQueue) -> Vec<&'static str> {
        queue.kept.iter().map(|w| w.what).collect()
    }

    #[test]
    fn kept_writes_are_retried_oldest_first_and_dropped_once_stored() {
        let mut q = WriteQueue::default();
        assert!(!q.busy());
        q.keep(write("started"));
        q.keep(write("exited"));
        assert!(q.busy());
        assert_eq!(q.next().map(|w| w.what), Some("started"));
        assert!(q.busy(), "in flight");
        q.finished(&Outcome::Kept);
        assert_eq!(whats(&q), ["started", "exited"], "still kept, still first");
        assert_eq!(q.next().map(|w| w.what), Some("started"));
        q.finished(&Outcome::Stored);
        assert_eq!(q.next().map(|w| w.what), Some("exited"));
        q.finished(&Outcome::Failed);
        assert!(!q.busy());
        assert!(q.next().is_none());
    }

    #[test]
    fn a_size_replaces_the_same_terminals_queued_size_but_not_one_in_flight() {
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let mut q = WriteQueue::default();
        q.keep(write("size a1").size_of(a));
        q.keep(write("size b1").size_of(b));
        q.keep(write("exited"));
        q.keep(write("size a2").size_of(a));
        assert_eq!(whats(&q), ["size b1", "exited", "size a2"]);
        assert_eq!(q.next().map(|w| w.what), Some("size b1"));
        q.keep(write("size b2").size_of(b));
        assert_eq!(whats(&q), ["size b1", "exited", "size a2", "size b2"], "the one in flight stays");
    }

    #[test]
    fn backoff_doubles_to_its_cap_and_restarts_after_a_success() {
        let mut q = WriteQueue::default();
        q.keep(write("w"));
        assert_eq!(q.backoff(), RETRY_FIRST);
        for _ in 0..20 {
            q.next();
            q.finished(&Outcome::Kept);
        }
        assert_eq!(q.backoff(), RETRY_MAX);
        q.next();
        q.finished(&Outcome::Stored);
        assert_eq!(q.backoff(), RETRY_FIRST);
    }

    #[test]
    fn the_queue_is_capped() {
        let mut q = WriteQueue::default();
        for _ in 0..MAX_KEPT + 5 {
            q.keep(write("w"));
        }
        assert_eq!(q.kept.len(), MAX_KEPT);
    }
}
