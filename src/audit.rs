//! The audit log's writer (docs/SECURITY.md, "Audit"): who attached to,
//! typed into, resized, spawned or killed which terminal, and who
//! registered which host.
//!
//! Recording never waits: [`AuditLog::record`] puts the event on a bounded
//! queue and returns; one task per instance drains the queue into the
//! store in batches. A full queue or a database error loses audit events
//! (counted in `tether_audit_events_dropped_total`, logged), never a
//! keystroke or a frame of output. Input is recorded as "input started",
//! at most once a minute per viewer, and never its bytes. An event counts
//! as owed from its queueing until its batch's statement has run; the
//! drain waits for none to be owed ([`AuditLog::written`]), so the events
//! of an instance's last moments are not lost with the process.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chrono::Utc;
use tokio::sync::mpsc;
use uuid::Uuid;

use crate::relay::owed::Owed;
use crate::store::{self, AuditAction, NewAuditEvent, Store};

/// Events the queue holds before new ones are dropped: several seconds of
/// a busy instance's attaches and inputs while the database is slow.
const QUEUE_EVENTS: usize = 8192;
/// Events written in one transaction at most.
const BATCH_EVENTS: usize = 256;
/// The least time between two `input` (or `resize`) events of one viewer.
pub const REPEAT_EVERY: Duration = Duration::from_secs(60);

/// The handle every part of an instance records events through.
#[derive(Clone)]
pub struct AuditLog {
    queue: mpsc::Sender<NewAuditEvent>,
    /// Events queued whose batch has not been written yet.
    owed: std::sync::Arc<Owed>,
    instance_id: String,
    /// `input` throttles of REST callers, by (user, terminal): the API's
    /// equivalent of a viewer.
    rest_input: std::sync::Arc<std::sync::Mutex<HashMap<(Uuid, Uuid), Throttle>>>,
}

/// What an event is about, besides who and what.
#[derive(Debug, Clone, Default)]
pub struct Subject {
    pub token_id: Option<Uuid>,
    pub host_id: Option<Uuid>,
    pub terminal_id: Option<Uuid>,
    pub detail: Option<String>,
}

impl Subject {
    pub fn terminal(host_id: Uuid, terminal_id: Uuid) -> Self {
        Self { host_id: Some(host_id), terminal_id: Some(terminal_id), ..Self::default() }
    }

    pub fn host(host_id: Uuid) -> Self {
        Self { host_id: Some(host_id), ..Self::default() }
    }

    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }

    /// The token the action was taken with.
    pub fn by(mut self, token_id: Uuid) -> Self {
        self.token_id = Some(token_id);
        self
    }
}

impl AuditLog {
    /// Starts the writer task on the current runtime.
    pub fn start(store: std::sync::Arc<dyn Store>, instance_id: String) -> Self {
        let (queue, inbox) = mpsc::channel(QUEUE_EVENTS);
        let owed = std::sync::Arc::new(Owed::default());
        tokio::spawn(write_batches(store, inbox, owed.clone()));
        Self { queue, owed, instance_id, rest_input: Default::default() }
    }

    /// Returns once every event queued so far has had its batch written
    /// (or its write failed).
    pub async fn written(&self) {
        self.owed.settled().await;
    }

    /// Events queued and not written yet.
    pub fn unwritten(&self) -> usize {
        self.owed.count()
    }

    /// Records `input` for input sent over REST, at most once a minute per
    /// user and terminal.
    pub fn rest_input(&self, user_id: Uuid, token_id: Uuid, host_id: Uuid, terminal_id: Uuid) {
        let due = {
            let mut throttles = self.rest_input.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            // Bounded by the callers active in the last minute.
            throttles.retain(|_, t| t.last.is_some_and(|last| now.duration_since(last) < REPEAT_EVERY));
            throttles.entry((user_id, terminal_id)).or_default().due(now)
        };
        if due {
            self.record(user_id, AuditAction::Input, Subject::terminal(host_id, terminal_id).by(token_id));
        }
    }

    /// Queues one event; never waits.
    pub fn record(&self, user_id: Uuid, action: AuditAction, subject: Subject) {
        let event = NewAuditEvent {
            at: Utc::now(),
            user_id,
            token_id: subject.token_id,
            action,
            host_id: subject.host_id,
            terminal_id: subject.terminal_id,
            instance_id: self.instance_id.clone(),
            detail: subject.detail,
        };
        // Owed before it is queued, so its write cannot settle it first.
        self.owed.add(1);
        if self.queue.try_send(event).is_err() {
            self.owed.settle(1);
            metrics::counter!("tether_audit_events_dropped_total").increment(1);
            tracing::warn!(action = action.as_str(), %user_id, "tether_audit_event_dropped");
        }
    }
}

/// Writes queued events until every [`AuditLog`] handle is gone.
async fn write_batches(
    store: std::sync::Arc<dyn Store>,
    mut inbox: mpsc::Receiver<NewAuditEvent>,
    owed: std::sync::Arc<Owed>,
) {
    let mut batch = Vec::with_capacity(BATCH_EVENTS);
    while inbox.recv_many(&mut batch, BATCH_EVENTS).await > 0 {
        let written = batch.len() as u64;
        if store::logged(store.insert_audit_events(&batch).await, "write audit events").is_some() {
            metrics::counter!("tether_audit_events_written_total").increment(written);
        } else {
            metrics::counter!("tether_audit_events_dropped_total").increment(written);
        }
        owed.settle(batch.len());
        batch.clear();
    }
}

/// At most one event per `REPEAT_EVERY` for one repeated action of one
/// viewer (its input, its resizes).
#[derive(Debug, Default)]
pub struct Throttle {
    last: Option<Instant>,
}

impl Throttle {
    /// True when an event is due now (and remembers that it was).
    pub fn due(&mut self, now: Instant) -> bool {
        if self.last.is_some_and(|last| now.duration_since(last) < REPEAT_EVERY) {
            return false;
        }
        self.last = Some(now);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttle_lets_one_event_a_minute_through() {
        let mut throttle = Throttle::default();
        let t0 = Instant::now();
        assert!(throttle.due(t0));
        assert!(!throttle.due(t0 + Duration::from_secs(1)));
        assert!(!throttle.due(t0 + Duration::from_secs(59)));
        assert!(throttle.due(t0 + Duration::from_secs(60)));
        assert!(!throttle.due(t0 + Duration::from_secs(61)));
    }
}
