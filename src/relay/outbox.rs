//! A WebSocket's outbound side: one writer task per socket drains a queue
//! whose size in bytes is counted, so a peer that does not read is detected
//! (the queue passes its bound) instead of buffered without limit.
//!
//! Frames leave strictly in push order. `close` goes through the same queue
//! (after what was pushed before it); `abort` drops the socket at once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use actix_ws::{CloseCode, CloseReason, Session};
use bytes::Bytes;
use tokio::sync::{mpsc, Notify};

/// One outbound frame.
#[derive(Debug)]
pub enum Frame {
    Binary(Bytes),
    Text(String),
    Ping(Bytes),
    Pong(Bytes),
    Close(u16, String),
}

impl Frame {
    /// What a frame counts against its queue's bound.
    pub fn weight(&self) -> usize {
        match self {
            Frame::Binary(b) | Frame::Ping(b) | Frame::Pong(b) => b.len() + 16,
            Frame::Text(t) => t.len() + 16,
            Frame::Close(_, r) => r.len() + 16,
        }
    }
}

/// The queue was over its bound: the peer is not keeping up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overflow;

/// Handle to a socket's writer task.
#[derive(Clone)]
pub struct Outbox {
    tx: mpsc::UnboundedSender<Frame>,
    queued: Arc<AtomicUsize>,
    high_water: Option<&'static AtomicUsize>,
    limit: usize,
    cancel: Arc<Notify>,
    session: Session,
}

/// Builds a close reason; the reason text is cut to what a close frame holds.
pub fn close_reason(code: u16, reason: &str) -> CloseReason {
    let mut description = reason.to_string();
    while description.len() > 120 {
        description.pop();
    }
    CloseReason { code: CloseCode::from(code), description: Some(description) }
}

impl Outbox {
    /// Starts the writer task on the current arbiter. `high_water`, when
    /// given, records the largest queue seen (for metrics and tests).
    pub fn start(session: Session, limit: usize, high_water: Option<&'static AtomicUsize>) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel::<Frame>();
        let queued = Arc::new(AtomicUsize::new(0));
        let cancel = Arc::new(Notify::new());
        let writer_queued = queued.clone();
        let writer_cancel = cancel.clone();
        let mut writer = session.clone();
        actix_rt::spawn(async move {
            loop {
                let frame = tokio::select! {
                    frame = rx.recv() => frame,
                    () = writer_cancel.notified() => None,
                };
                let Some(frame) = frame else { break };
                let weight = frame.weight();
                let send = async {
                    match frame {
                        Frame::Binary(b) => writer.binary(b).await.is_ok(),
                        Frame::Text(t) => writer.text(t).await.is_ok(),
                        Frame::Ping(b) => writer.ping(&b).await.is_ok(),
                        Frame::Pong(b) => writer.pong(&b).await.is_ok(),
                        Frame::Close(code, reason) => {
                            let _ = writer.clone().close(Some(close_reason(code, &reason))).await;
                            false
                        }
                    }
                };
                let open = tokio::select! {
                    open = send => open,
                    () = writer_cancel.notified() => false,
                };
                writer_queued.fetch_sub(weight, Ordering::Relaxed);
                if !open {
                    break;
                }
            }
        });
        Self { tx, queued, high_water, limit, cancel, session }
    }

    /// Queues a frame; `Err(Overflow)` when the queue would pass its bound
    /// (the frame is not queued).
    pub fn push(&self, frame: Frame) -> Result<(), Overflow> {
        let weight = frame.weight();
        let now = self.queued.fetch_add(weight, Ordering::Relaxed) + weight;
        self.enqueue(frame, weight, now)
    }

    /// Queues a frame whose weight the sender already added to the counter
    /// (so frames still in an actor's mailbox count too); `Err(Overflow)`
    /// when the queue is over its bound (the reservation is released).
    pub fn push_reserved(&self, frame: Frame) -> Result<(), Overflow> {
        let weight = frame.weight();
        let now = self.queued.load(Ordering::Relaxed);
        self.enqueue(frame, weight, now)
    }

    fn enqueue(&self, frame: Frame, weight: usize, queued: usize) -> Result<(), Overflow> {
        if queued > self.limit {
            self.queued.fetch_sub(weight, Ordering::Relaxed);
            return Err(Overflow);
        }
        if let Some(high_water) = &self.high_water {
            high_water.fetch_max(queued, Ordering::Relaxed);
        }
        if self.tx.send(frame).is_err() {
            self.queued.fetch_sub(weight, Ordering::Relaxed);
        }
        Ok(())
    }

    /// A shared view of the queued byte count.
    pub fn queued_counter(&self) -> Arc<AtomicUsize> {
        self.queued.clone()
    }

    /// Closes after everything queued so far has been written.
    pub fn close(&self, code: u16, reason: &str) {
        let _ = self.tx.send(Frame::Close(code, reason.to_string()));
    }

    /// Closes now, discarding what is queued (the peer is not reading).
    pub fn abort(&self, code: u16, reason: &str) {
        self.cancel.notify_one();
        let session = self.session.clone();
        let reason = close_reason(code, reason);
        actix_rt::spawn(async move {
            // The close frame waits behind what the socket already holds; a
            // peer that reads again sees it, one that never does is dropped
            // when this gives up and the last session handle goes.
            let _ = tokio::time::timeout(std::time::Duration::from_secs(30), session.close(Some(reason))).await;
        });
    }
}
