//! A WebSocket's outbound side: one writer task per socket drains a queue
//! whose size in bytes is counted, so a peer that does not read is detected
//! (the queue passes its bound) instead of buffered without limit.
//!
//! Frames leave strictly in push order. `close` goes through the same queue
//! (after what was pushed before it); `abort` drops the socket at once.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use actix_ws::{CloseCode, CloseReason, Session};
use bytes::Bytes;
use tokio::sync::Notify;

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
pub struct Outbox {
    shared: Arc<Shared>,
    high_water: Option<&'static AtomicUsize>,
    limit: usize,
    session: Session,
}

/// What the handles and the writer task share.
struct Shared {
    queue: Mutex<Queue>,
    /// Wakes the writer: a frame was queued, or the last handle went.
    wake: Notify,
    /// Wakes the writer to stop at once (`abort`).
    cancel: Notify,
    /// Bytes queued, by `Frame::weight`, including frames reserved by a
    /// sender and not pushed yet.
    queued: Arc<AtomicUsize>,
}

/// The frames waiting for the writer. A plain queue rather than a channel:
/// a socket that is idle (every idle daemon and viewer) holds no buffer
/// for it, where a channel keeps a block of slots for its whole life.
struct Queue {
    frames: VecDeque<Frame>,
    /// `Outbox` handles alive; the writer ends when none is left and the
    /// queue is empty.
    handles: usize,
    /// The writer has ended: nothing pushed now would be written.
    writer_gone: bool,
}

/// The capacity an emptied queue keeps: a few frames, so a socket with a
/// steady trickle does not allocate for each, while a burst's buffer goes.
const KEPT_CAPACITY: usize = 4;

impl Shared {
    fn for_one_handle() -> Self {
        Self {
            queue: Mutex::new(Queue { frames: VecDeque::new(), handles: 1, writer_gone: false }),
            wake: Notify::new(),
            cancel: Notify::new(),
            queued: Arc::new(AtomicUsize::new(0)),
        }
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        // No code panics while holding the lock; a poisoned queue is still whole.
        self.queue.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The next frame, or `None` once every handle is gone and nothing is queued.
    async fn next(&self) -> Option<Frame> {
        loop {
            {
                let mut queue = self.queue();
                if let Some(frame) = queue.frames.pop_front() {
                    if queue.frames.is_empty() && queue.frames.capacity() > KEPT_CAPACITY {
                        queue.frames = VecDeque::new();
                    }
                    return Some(frame);
                }
                if queue.handles == 0 {
                    return None;
                }
            }
            self.wake.notified().await;
        }
    }

    /// Queues `frame` for the writer; gives it back if the writer has ended.
    fn send(&self, frame: Frame) -> Result<(), Frame> {
        {
            let mut queue = self.queue();
            if queue.writer_gone {
                return Err(frame);
            }
            queue.frames.push_back(frame);
        }
        self.wake.notify_one();
        Ok(())
    }
}

impl Clone for Outbox {
    fn clone(&self) -> Self {
        self.shared.queue().handles += 1;
        Self {
            shared: self.shared.clone(),
            high_water: self.high_water,
            limit: self.limit,
            session: self.session.clone(),
        }
    }
}

impl Drop for Outbox {
    fn drop(&mut self) {
        let last = {
            let mut queue = self.shared.queue();
            queue.handles -= 1;
            queue.handles == 0
        };
        if last {
            self.shared.wake.notify_one();
        }
    }
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
        let shared = Arc::new(Shared::for_one_handle());
        let writer_shared = shared.clone();
        let mut writer = session.clone();
        actix_rt::spawn(async move {
            let shared = writer_shared;
            loop {
                let frame = tokio::select! {
                    frame = shared.next() => frame,
                    () = shared.cancel.notified() => None,
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
                    () = shared.cancel.notified() => false,
                };
                shared.queued.fetch_sub(weight, Ordering::Relaxed);
                if !open {
                    break;
                }
            }
            // What is still queued is never written; the frames go now, not
            // with the last handle.
            let left = {
                let mut queue = shared.queue();
                queue.writer_gone = true;
                std::mem::take(&mut queue.frames)
            };
            drop(left);
        });
        Self { shared, high_water, limit, session }
    }

    /// Queues a frame; `Err(Overflow)` when the queue would pass its bound
    /// (the frame is not queued).
    pub fn push(&self, frame: Frame) -> Result<(), Overflow> {
        let weight = frame.weight();
        let now = self.shared.queued.fetch_add(weight, Ordering::Relaxed) + weight;
        self.enqueue(frame, weight, now)
    }

    /// Queues a frame whose weight the sender already added to the counter
    /// (so frames still in an actor's mailbox count too); `Err(Overflow)`
    /// when the queue is over its bound (the reservation is released).
    pub fn push_reserved(&self, frame: Frame) -> Result<(), Overflow> {
        let weight = frame.weight();
        let now = self.shared.queued.load(Ordering::Relaxed);
        self.enqueue(frame, weight, now)
    }

    fn enqueue(&self, frame: Frame, weight: usize, queued: usize) -> Result<(), Overflow> {
        if queued > self.limit {
            self.shared.queued.fetch_sub(weight, Ordering::Relaxed);
            return Err(Overflow);
        }
        if let Some(high_water) = &self.high_water {
            high_water.fetch_max(queued, Ordering::Relaxed);
        }
        if self.shared.send(frame).is_err() {
            self.shared.queued.fetch_sub(weight, Ordering::Relaxed);
        }
        Ok(())
    }

    /// A shared view of the queued byte count.
    pub fn queued_counter(&self) -> Arc<AtomicUsize> {
        self.shared.queued.clone()
    }

    /// Closes after everything queued so far has been written.
    pub fn close(&self, code: u16, reason: &str) {
        let _ = self.shared.send(Frame::Close(code, reason.to_string()));
    }

    /// Closes now, discarding what is queued (the peer is not reading).
    pub fn abort(&self, code: u16, reason: &str) {
        self.shared.cancel.notify_one();
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

#[cfg(test)]
mod tests {
    use super::*;

    fn binary(n: u8) -> Frame {
        Frame::Binary(Bytes::from(vec![n]))
    }

    fn byte(frame: Option<Frame>) -> u8 {
        match frame {
            Some(Frame::Binary(b)) => b[0],
            other => panic!("expected a binary frame, got {other:?}"),
        }
    }

    #[actix_rt::test]
    async fn frames_come_out_in_order_and_the_writer_ends_after_the_last_handle() {
        let shared = Arc::new(Shared::for_one_handle());
        let reader = shared.clone();
        let writer = actix_rt::spawn(async move {
            let mut got = Vec::new();
            while let Some(frame) = reader.next().await {
                got.push(byte(Some(frame)));
            }
            got
        });
        for n in 0..100 {
            shared.send(binary(n)).expect("queued");
            if n % 7 == 0 {
                tokio::task::yield_now().await;
            }
        }
        // The last handle goes with frames still queued: they are written first.
        shared.queue().handles -= 1;
        shared.wake.notify_one();
        assert_eq!(writer.await.expect("writer"), (0..100).collect::<Vec<u8>>());
    }

    #[actix_rt::test]
    async fn an_emptied_queue_gives_back_a_bursts_buffer() {
        let shared = Shared::for_one_handle();
        assert_eq!(shared.queue().frames.capacity(), 0, "a new socket holds no buffer");
        for n in 0..1000 {
            shared.send(binary(n as u8)).expect("queued");
        }
        for n in 0..1000 {
            assert_eq!(byte(shared.next().await), n as u8);
        }
        assert_eq!(shared.queue().frames.capacity(), 0, "the burst's buffer went with its last frame");
        shared.send(binary(1)).expect("queued");
        byte(shared.next().await);
        assert!(shared.queue().frames.capacity() <= KEPT_CAPACITY, "a trickle keeps a small buffer");
    }

    #[test]
    fn a_frame_for_a_writer_that_ended_is_given_back() {
        let shared = Shared::for_one_handle();
        shared.queue().writer_gone = true;
        assert!(matches!(shared.send(binary(1)), Err(Frame::Binary(_))));
    }
}
