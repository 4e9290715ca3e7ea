//! A WebSocket's outbound side: a queue whose size in bytes is counted, so
//! a peer that does not read is detected (the queue passes its bound)
//! instead of buffered without limit.
//!
//! The queue is the socket's response body itself ([`Body`]): the
//! connection's task takes frames from it while the socket has room,
//! encodes them and writes them. A sender's push wakes that task and
//! nothing else: no writer task and no channel sit between the two, so
//! every frame out (an idle daemon's pong, a keystroke's echo to a viewer)
//! takes one task hop less (docs/ARCHITECTURE.md, "Upgraded connections").
//!
//! Frames leave strictly in push order. `close` goes through the same queue
//! (after what was pushed before it) and ends the body; `abort` drops what
//! is queued and closes at once.
//!
//! A large binary frame's payload is not copied: the body hands over the
//! frame's header and then the payload's `Bytes` as they are (the
//! daemon's Output, sliced out of its frame, reaches every viewer's socket
//! that way), and the connection writes both with one vectored write.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use actix_codec::Encoder;
use actix_http::body::{BodySize, BoxBody, MessageBody};
use actix_http::ws::{Codec, Message, ProtocolError};
use actix_web::HttpResponse;
use actix_ws::{CloseCode, CloseReason};
use bytes::{Bytes, BytesMut};

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

    /// The frame as actix-http's codec takes it; control payloads cut to
    /// the 125 bytes RFC 6455 allows.
    fn into_message(self) -> Message {
        let control = |b: Bytes| if b.len() > MAX_CONTROL_PAYLOAD { b.slice(..MAX_CONTROL_PAYLOAD) } else { b };
        match self {
            Frame::Binary(b) => Message::Binary(b),
            Frame::Text(t) => Message::Text(t.into()),
            Frame::Ping(b) => Message::Ping(control(b)),
            Frame::Pong(b) => Message::Pong(control(b)),
            Frame::Close(code, reason) => Message::Close(Some(close_reason(code, &reason))),
        }
    }
}

/// The most a control frame's payload may hold (RFC 6455, 5.5).
const MAX_CONTROL_PAYLOAD: usize = 125;

/// Encoded bytes the body hands over in one chunk at most (the connection
/// gathers chunks into writes of its own size).
const CHUNK: usize = 64 * 1024;

/// Binary payloads from this size on are handed over as they are, after
/// their header, instead of copied into a chunk.
const BY_REFERENCE: usize = 1024;

/// A server's (unmasked, final) binary frame header for a payload of `len`
/// bytes (RFC 6455, 5.2).
fn binary_header(len: usize, out: &mut BytesMut) {
    use bytes::BufMut;
    out.put_u8(0x82);
    if len < 126 {
        out.put_u8(len as u8);
    } else if let Ok(len) = u16::try_from(len) {
        out.put_u8(126);
        out.put_u16(len);
    } else {
        out.put_u8(127);
        out.put_u64(len as u64);
    }
}

/// The queue was over its bound: the peer is not keeping up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overflow;

/// A sender's handle to a socket's queue.
pub struct Outbox {
    shared: Arc<Shared>,
    high_water: Option<&'static AtomicUsize>,
    limit: usize,
    /// Whether this handle keeps the body open (see [`Outbox::sender`]).
    counted: bool,
}

/// What the handles and the body share.
struct Shared {
    queue: Mutex<Queue>,
    /// Bytes queued, by `Frame::weight`, including frames reserved by a
    /// sender and not pushed yet.
    queued: Arc<AtomicUsize>,
    /// A push was refused for the bound: every later one is refused too,
    /// so the peer never gets a frame that came after one it lost (a
    /// stream with a hole no offset shows). The owner closes the socket.
    overflowed: AtomicBool,
}

/// Where a socket's outbound side stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Frames are taken.
    Open,
    /// A close frame is queued: nothing pushed after it would be written.
    Closing,
    /// The body has ended or the connection is gone.
    Gone,
}

/// The frames waiting for the connection. A plain queue rather than a
/// channel: a socket that is idle (every idle daemon and viewer) holds no
/// buffer for it, where a channel keeps a block of slots for its whole life.
struct Queue {
    frames: VecDeque<Frame>,
    /// `Outbox` handles alive; the body ends when none is left and the
    /// queue is empty.
    handles: usize,
    state: State,
    /// The connection's task, waiting for a frame.
    waker: Option<Waker>,
    /// The connection's task as of its last poll of the body, woken when
    /// the queue stops taking frames (a close, or the last handle gone):
    /// it may not be polling the body while its socket is full, and from
    /// then on it has only its close grace (`crate::http::upgraded`).
    task: Option<Waker>,
}

impl Queue {
    /// Who to wake once the queue takes no more frames: the connection,
    /// whether it waits for a frame or for its socket (the same task twice,
    /// as a rule; a second wake is a no-op).
    fn stop_wakers(&mut self) -> [Option<Waker>; 2] {
        [self.waker.take(), self.task.take()]
    }
}

/// Wakes what [`Queue::stop_wakers`] gave, outside the queue's lock.
fn wake_all(wakers: [Option<Waker>; 2]) {
    wakers.into_iter().flatten().for_each(Waker::wake);
}

/// The capacity an emptied queue keeps: a few frames, so a socket with a
/// steady trickle does not allocate for each, while a burst's buffer goes.
const KEPT_CAPACITY: usize = 4;

impl Shared {
    fn for_one_handle() -> Self {
        Self {
            queue: Mutex::new(Queue {
                frames: VecDeque::new(),
                handles: 1,
                state: State::Open,
                waker: None,
                task: None,
            }),
            queued: Arc::new(AtomicUsize::new(0)),
            overflowed: AtomicBool::new(false),
        }
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        // No code panics while holding the lock; a poisoned queue is still whole.
        self.queue.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Queues `frame` (a close frame closes the queue behind it); gives it
    /// back if the queue is closed.
    fn send(&self, frame: Frame) -> Result<(), Frame> {
        let wakers = {
            let mut queue = self.queue();
            if queue.state != State::Open {
                return Err(frame);
            }
            let close = matches!(frame, Frame::Close(..));
            queue.frames.push_back(frame);
            if close {
                queue.state = State::Closing;
                queue.stop_wakers()
            } else {
                [queue.waker.take(), None]
            }
        };
        wake_all(wakers);
        Ok(())
    }

    /// Takes frames that will never be written out of the count.
    fn discard(&self, frames: VecDeque<Frame>) {
        let weight: usize = frames.iter().map(Frame::weight).sum();
        self.queued.fetch_sub(weight, Ordering::Relaxed);
    }
}

impl Clone for Outbox {
    fn clone(&self) -> Self {
        if self.counted {
            self.shared.queue().handles += 1;
        }
        Self { shared: self.shared.clone(), high_water: self.high_water, limit: self.limit, counted: self.counted }
    }
}

impl Drop for Outbox {
    fn drop(&mut self) {
        if !self.counted {
            return;
        }
        let wakers = {
            let mut queue = self.shared.queue();
            queue.handles -= 1;
            if queue.handles == 0 {
                queue.stop_wakers()
            } else {
                [None, None]
            }
        };
        wake_all(wakers);
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
    /// A socket's outbox, its [`Body`] put in place of `response`'s: an
    /// actix-ws handshake response, whose own body is kept, never polled,
    /// for the signal its drop gives the socket's message stream.
    /// `high_water`, when given, records the largest queue seen (for
    /// metrics and tests).
    pub fn for_response(
        response: HttpResponse,
        limit: usize,
        high_water: Option<&'static AtomicUsize>,
    ) -> (HttpResponse, Self) {
        let shared = Arc::new(Shared::for_one_handle());
        let (response, actix_ws) = response.into_parts();
        let body =
            Body { shared: shared.clone(), codec: Codec::new(), ended: false, payload: None, _actix_ws: actix_ws };
        (response.set_body(body).map_into_boxed_body(), Self { shared, high_water, limit, counted: true })
    }

    /// A handle that pushes like this one but does not keep the socket
    /// open: the body still ends once the counted handles are gone (the
    /// socket's own actor's), whoever else holds one of these.
    pub fn sender(&self) -> Self {
        Self { shared: self.shared.clone(), high_water: self.high_water, limit: self.limit, counted: false }
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
        if queued > self.limit || self.shared.overflowed.load(Ordering::Relaxed) {
            self.shared.overflowed.store(true, Ordering::Relaxed);
            self.shared.queued.fetch_sub(weight, Ordering::Relaxed);
            return Err(Overflow);
        }
        if let Some(high_water) = &self.high_water {
            high_water.fetch_max(queued, Ordering::Relaxed);
        }
        self.send_counted(frame, weight);
        Ok(())
    }

    /// Hands a frame already in the count to the queue; its weight leaves
    /// the count again if the queue is closed.
    fn send_counted(&self, frame: Frame, weight: usize) {
        if self.shared.send(frame).is_err() {
            self.shared.queued.fetch_sub(weight, Ordering::Relaxed);
        }
    }

    /// A shared view of the queued byte count.
    pub fn queued_counter(&self) -> Arc<AtomicUsize> {
        self.shared.queued.clone()
    }

    /// Closes after everything queued so far has been written.
    pub fn close(&self, code: u16, reason: &str) {
        let frame = Frame::Close(code, reason.to_string());
        let weight = frame.weight();
        self.shared.queued.fetch_add(weight, Ordering::Relaxed);
        self.send_counted(frame, weight);
    }

    /// Closes now, discarding what is queued (the peer is not reading):
    /// the close frame follows only what the socket already holds.
    pub fn abort(&self, code: u16, reason: &str) {
        let frame = Frame::Close(code, reason.to_string());
        let (left, wakers) = {
            let mut queue = self.shared.queue();
            if queue.state == State::Gone {
                return;
            }
            self.shared.queued.fetch_add(frame.weight(), Ordering::Relaxed);
            let left = std::mem::replace(&mut queue.frames, VecDeque::from([frame]));
            queue.state = State::Closing;
            (left, queue.stop_wakers())
        };
        self.shared.discard(left);
        wake_all(wakers);
    }

    /// Answers the peer's close frame, as a close must be (RFC 6455
    /// section 5.5.1), with the peer's code: at once, dropping what is
    /// queued, since the peer reads nothing after its close.
    pub fn answer_close(&self, theirs: Option<&CloseReason>) {
        self.abort(echoed_code(theirs), "");
    }
}

/// The code to answer a peer's close frame with: its own where that code
/// may be sent in a frame (RFC 6455 section 7.4), else 1000 (a close with
/// no code, or one only an endpoint's API may report).
fn echoed_code(theirs: Option<&CloseReason>) -> u16 {
    match theirs.map(|reason| u16::from(reason.code)) {
        Some(code @ (1000..=1003 | 1007..=1011 | 3000..=4999)) => code,
        _ => super::close::NORMAL,
    }
}

/// A socket's response body: the frames of its queue, encoded, in order.
/// It ends after a close frame, or once every [`Outbox`] handle is gone
/// and the queue is empty (the connection then ends without a close
/// frame, as when a socket's handlers all stop).
pub struct Body {
    shared: Arc<Shared>,
    codec: Codec,
    ended: bool,
    /// The payload of the frame whose header ended the last chunk.
    payload: Option<Bytes>,
    /// actix-ws's own body for this socket, never polled: it goes with
    /// this one, and its going tells the socket's message stream that the
    /// connection is gone (the stream ends then, as it does with actix-ws's
    /// own body).
    _actix_ws: BoxBody,
}

impl Body {
    /// The next queued frame; `None` once nothing more will come.
    fn next(&self, cx: &Context<'_>) -> Poll<Option<Frame>> {
        let mut queue = self.shared.queue();
        match &queue.task {
            Some(task) if task.will_wake(cx.waker()) => {}
            _ => queue.task = Some(cx.waker().clone()),
        }
        if let Some(frame) = queue.frames.pop_front() {
            if queue.frames.is_empty() && queue.frames.capacity() > KEPT_CAPACITY {
                queue.frames = VecDeque::new();
            }
            return Poll::Ready(Some(frame));
        }
        if queue.handles == 0 || queue.state != State::Open {
            return Poll::Ready(None);
        }
        match &queue.waker {
            Some(waker) if waker.will_wake(cx.waker()) => {}
            _ => queue.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    /// Nothing more is written: what is still queued goes now, not with
    /// the last handle, and later pushes are refused.
    fn end(&mut self) {
        self.ended = true;
        let left = {
            let mut queue = self.shared.queue();
            queue.state = State::Gone;
            queue.waker = None;
            queue.task = None;
            std::mem::take(&mut queue.frames)
        };
        self.shared.discard(left);
    }
}

impl MessageBody for Body {
    type Error = ProtocolError;

    /// A stream while frames may come; 0 once the queue takes no more (a
    /// close frame is queued, or no handle is left) or the body has ended:
    /// the connection then gives what is left its close grace
    /// (`crate::http::upgraded`), a peer that does not read included.
    fn size(&self) -> BodySize {
        if self.ended {
            return BodySize::Sized(0);
        }
        let queue = self.shared.queue();
        match queue.state == State::Open && queue.handles > 0 {
            true => BodySize::Stream,
            false => BodySize::Sized(0),
        }
    }

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, ProtocolError>>> {
        let this = self.get_mut();
        if let Some(payload) = this.payload.take() {
            return Poll::Ready(Some(Ok(payload)));
        }
        let mut out = BytesMut::new();
        while !this.ended && out.len() < CHUNK {
            match this.next(cx) {
                Poll::Ready(Some(frame)) => {
                    this.shared.queued.fetch_sub(frame.weight(), Ordering::Relaxed);
                    match frame {
                        Frame::Binary(payload) if payload.len() >= BY_REFERENCE => {
                            binary_header(payload.len(), &mut out);
                            this.payload = Some(payload);
                            break;
                        }
                        frame => {
                            let close = matches!(frame, Frame::Close(..));
                            let encoded = this.codec.encode(frame.into_message(), &mut out);
                            if close {
                                this.end();
                            }
                            if let Err(error) = encoded {
                                this.end();
                                return Poll::Ready(Some(Err(error)));
                            }
                        }
                    }
                }
                Poll::Ready(None) => this.end(),
                Poll::Pending => break,
            }
        }
        if !out.is_empty() {
            Poll::Ready(Some(Ok(out.freeze())))
        } else if this.ended {
            Poll::Ready(None)
        } else {
            Poll::Pending
        }
    }
}

impl Drop for Body {
    fn drop(&mut self) {
        if !self.ended {
            self.end();
        }
    }
}

#[cfg(test)]
mod tests {
    use actix_codec::Decoder;
    use actix_http::ws;
    use futures_util::future::poll_fn;

    use super::*;

    fn binary(n: u8) -> Frame {
        Frame::Binary(Bytes::from(vec![n]))
    }

    fn outbox(limit: usize) -> (Outbox, Pin<Box<BoxBody>>) {
        let (response, outbox) = Outbox::for_response(HttpResponse::SwitchingProtocols().finish(), limit, None);
        (outbox, Box::pin(response.into_body()))
    }

    /// What the body yields until it would wait (or ends), decoded as a
    /// client reads it; `true` when it ended.
    async fn written(body: &mut Pin<Box<BoxBody>>) -> (Vec<ws::Frame>, bool) {
        let mut bytes = BytesMut::new();
        let ended = poll_fn(|cx| loop {
            match body.as_mut().poll_next(cx) {
                Poll::Ready(Some(chunk)) => bytes.extend_from_slice(&chunk.expect("encoded")),
                Poll::Ready(None) => return Poll::Ready(true),
                Poll::Pending => return Poll::Ready(false),
            }
        })
        .await;
        let mut codec = ws::Codec::new().client_mode();
        let mut frames = Vec::new();
        while let Some(frame) = codec.decode(&mut bytes).expect("decodes") {
            frames.push(frame);
        }
        assert!(bytes.is_empty(), "whole frames only");
        (frames, ended)
    }

    fn bytes_of(frames: &[ws::Frame]) -> Vec<u8> {
        frames
            .iter()
            .map(|frame| match frame {
                ws::Frame::Binary(b) => b[0],
                other => panic!("expected a binary frame, got {other:?}"),
            })
            .collect()
    }

    #[actix_rt::test]
    async fn frames_come_out_in_order_and_the_body_ends_after_the_last_handle() {
        let (outbox, mut body) = outbox(usize::MAX);
        let other = outbox.clone();
        for n in 0..50 {
            outbox.push(binary(n)).expect("queued");
        }
        let (mut frames, ended) = written(&mut body).await;
        assert!(!ended);
        for n in 50..100 {
            other.push(binary(n)).expect("queued");
        }
        drop(outbox);
        // The last handle goes with frames still queued: they are written first.
        drop(other);
        let (rest, ended) = written(&mut body).await;
        assert!(ended, "no handle left, nothing queued: the body ends");
        frames.extend(rest);
        assert_eq!(bytes_of(&frames), (0..100).collect::<Vec<u8>>());
    }

    #[actix_rt::test]
    async fn a_large_payload_is_handed_over_as_it_is_after_its_header() {
        let (outbox, mut body) = outbox(usize::MAX);
        let sizes = [BY_REFERENCE - 1, BY_REFERENCE, 65_535, 65_536, 200_000];
        let payloads: Vec<Bytes> =
            sizes.iter().map(|&n| Bytes::from((0..n).map(|i| i as u8).collect::<Vec<u8>>())).collect();
        for payload in &payloads {
            outbox.push(Frame::Binary(payload.clone())).expect("queued");
        }
        outbox.push(binary(7)).expect("queued");
        let chunks: Vec<Bytes> = poll_fn(|cx| {
            let mut chunks = Vec::new();
            while let Poll::Ready(Some(chunk)) = body.as_mut().poll_next(cx) {
                chunks.push(chunk.expect("encoded"));
            }
            Poll::Ready(chunks)
        })
        .await;
        // The large ones' bytes are the pushed `Bytes` themselves, not copies.
        for payload in &payloads[1..] {
            assert!(
                chunks.iter().any(|chunk| chunk.as_ptr() == payload.as_ptr() && chunk.len() == payload.len()),
                "a payload of {} bytes is handed over as it is",
                payload.len()
            );
        }
        assert!(!chunks.iter().any(|chunk| chunk.as_ptr() == payloads[0].as_ptr()), "a small one is copied");
        // And the whole is what a client reads as these frames.
        let mut bytes = BytesMut::from(&chunks.concat()[..]);
        let mut codec = ws::Codec::new().client_mode().max_size(1 << 20);
        let mut frames = Vec::new();
        while let Some(frame) = codec.decode(&mut bytes).expect("decodes") {
            frames.push(frame);
        }
        assert!(bytes.is_empty(), "whole frames only");
        let expected: Vec<ws::Frame> =
            payloads.iter().cloned().chain([Bytes::from_static(&[7])]).map(ws::Frame::Binary).collect();
        assert_eq!(frames, expected);
        assert_eq!(outbox.queued_counter().load(Ordering::Relaxed), 0, "every frame's weight is given back");
    }

    #[actix_rt::test]
    async fn a_sender_pushes_but_does_not_keep_the_body_open() {
        let (outbox, mut body) = outbox(usize::MAX);
        let sender = outbox.sender();
        let other = sender.clone();
        sender.push(binary(1)).expect("queued");
        drop(outbox);
        other.push(binary(2)).expect("queued");
        let (frames, ended) = written(&mut body).await;
        assert!(ended, "the counted handle is gone: the body ends after what was queued");
        assert_eq!(bytes_of(&frames), vec![1, 2]);
        sender.push(binary(3)).expect("refused, not an overflow");
        assert_eq!(sender.queued_counter().load(Ordering::Relaxed), 0);
    }

    #[actix_rt::test]
    async fn a_push_wakes_the_connection_waiting_on_the_body() {
        let (outbox, mut body) = outbox(usize::MAX);
        let waiting = actix_rt::spawn(async move { poll_fn(|cx| body.as_mut().poll_next(cx)).await });
        tokio::task::yield_now().await;
        outbox.push(binary(7)).expect("queued");
        let chunk = waiting.await.expect("task").expect("a chunk").expect("encoded");
        assert_eq!(&chunk[..], &[0x82, 1, 7], "one unmasked binary frame");
    }

    #[actix_rt::test]
    async fn the_count_follows_frames_out_and_the_bound_refuses_a_push() {
        let (outbox, mut body) = outbox(100);
        let counter = outbox.queued_counter();
        outbox.push(Frame::Binary(Bytes::from(vec![0; 60]))).expect("under the bound");
        assert_eq!(outbox.push(Frame::Binary(Bytes::from(vec![0; 60]))), Err(Overflow));
        assert_eq!(counter.load(Ordering::Relaxed), 76, "the refused frame is not counted");
        written(&mut body).await;
        assert_eq!(counter.load(Ordering::Relaxed), 0, "a written frame leaves the count");
    }

    /// A sender that pushes chunk after chunk (a terminal's arbiter) must
    /// not get a later chunk through once an earlier one was refused, even
    /// when the queue has drained below the bound meanwhile: the viewer
    /// would get a stream with a hole in it before its close.
    #[actix_rt::test]
    async fn once_a_push_is_refused_every_later_one_is() {
        let (outbox, mut body) = outbox(100);
        outbox.push(Frame::Binary(Bytes::from(vec![1; 60]))).expect("under the bound");
        assert_eq!(outbox.push(Frame::Binary(Bytes::from(vec![2; 60]))), Err(Overflow));
        written(&mut body).await;
        assert_eq!(outbox.push(binary(3)), Err(Overflow), "the queue is empty, but a frame was lost before this one");
        assert_eq!(outbox.queued_counter().load(Ordering::Relaxed), 0, "refused frames are not counted");
    }

    #[actix_rt::test]
    async fn an_emptied_queue_gives_back_a_bursts_buffer() {
        let (outbox, mut body) = outbox(usize::MAX);
        assert_eq!(outbox.shared.queue().frames.capacity(), 0, "a new socket holds no buffer");
        for n in 0..1000 {
            outbox.push(binary(n as u8)).expect("queued");
        }
        assert_eq!(written(&mut body).await.0.len(), 1000);
        assert_eq!(outbox.shared.queue().frames.capacity(), 0, "the burst's buffer went with its last frame");
        outbox.push(binary(1)).expect("queued");
        written(&mut body).await;
        assert!(outbox.shared.queue().frames.capacity() <= KEPT_CAPACITY, "a trickle keeps a small buffer");
    }

    #[actix_rt::test]
    async fn close_follows_what_was_queued_and_ends_the_body() {
        let (outbox, mut body) = outbox(usize::MAX);
        outbox.push(binary(1)).expect("queued");
        outbox.close(4503, "draining");
        outbox.push(binary(2)).expect("a push after close is not an overflow");
        // It takes no more frames: the connection's close grace runs from here.
        assert_eq!(body.size(), BodySize::Sized(0));
        let (frames, ended) = written(&mut body).await;
        assert!(ended);
        assert_eq!(body.size(), BodySize::Sized(0), "nothing left to give");
        assert_eq!(frames.len(), 2, "{frames:?}");
        assert_eq!(frames[1], ws::Frame::Close(Some(close_reason(4503, "draining"))));
        assert_eq!(outbox.queued_counter().load(Ordering::Relaxed), 0);
    }

    #[actix_rt::test]
    async fn abort_drops_what_is_queued_and_closes_at_once() {
        let (outbox, mut body) = outbox(usize::MAX);
        for n in 0..10 {
            outbox.push(binary(n)).expect("queued");
        }
        outbox.abort(4503, "too slow a reader");
        let (frames, ended) = written(&mut body).await;
        assert!(ended);
        assert_eq!(frames, vec![ws::Frame::Close(Some(close_reason(4503, "too slow a reader")))]);
        assert_eq!(outbox.queued_counter().load(Ordering::Relaxed), 0);
    }

    #[actix_rt::test]
    async fn a_gone_connection_refuses_pushes_and_frees_its_queue() {
        let (outbox, body) = outbox(usize::MAX);
        outbox.push(binary(1)).expect("queued");
        drop(body);
        outbox.push(binary(2)).expect("not an overflow");
        outbox.abort(4503, "late");
        assert_eq!(outbox.queued_counter().load(Ordering::Relaxed), 0);
        assert!(outbox.shared.queue().frames.is_empty());
    }

    #[actix_rt::test]
    async fn a_control_frame_is_cut_to_what_rfc_6455_allows() {
        let (outbox, mut body) = outbox(usize::MAX);
        outbox.push(Frame::Pong(Bytes::from(vec![9; 300]))).expect("queued");
        let (frames, _) = written(&mut body).await;
        assert_eq!(frames, vec![ws::Frame::Pong(Bytes::from(vec![9; MAX_CONTROL_PAYLOAD]))]);
    }
}
