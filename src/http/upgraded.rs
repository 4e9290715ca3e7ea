//! Connections after an HTTP/1 upgrade request (every daemon and viewer
//! WebSocket), served without actix-http's per-connection buffers
//! (docs/ARCHITECTURE.md, "Upgraded connections").
//!
//! actix-http's HTTP/1 dispatcher gives every connection a read buffer and
//! a write buffer of 8 KiB each for the connection's whole life; on an idle
//! WebSocket that is most of what the socket costs (docs/BENCHMARKS.md,
//! "where a daemon connection's memory goes"). The dispatcher hands an
//! upgrade request, its socket and its buffers to an upgrade service
//! instead; this is that service. It answers the request with the same
//! actix-web application (routes, middleware, handlers: nothing about a
//! socket changes for them) and then moves bytes both ways itself: a read
//! goes through a buffer on the stack and only what arrived is kept, and
//! the response body's chunks are written as they are (one vectored write
//! for what is ready), nothing held once they are out. An idle socket
//! holds no buffer at all.
//!
//! Once the request is answered the connection leaves the dispatcher's
//! task, which is sized for any request the application serves, for a
//! task of its own that holds only the socket and the two sides; an
//! [`Owed`] count keeps them for the drain, as actix-server counted them
//! while they were its.
//!
//! What reaches the handler keeps actix-http's flow control: at most
//! [`QUEUED_BYTES`] read and not taken yet, then reading pauses (the peer
//! is slowed by TCP), as the dispatcher's payload does.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use actix_codec::{AsyncRead, AsyncWrite, Encoder, Framed, ReadBuf};
use actix_http::body::{BodySize, BoxBody, MessageBody};
use actix_http::error::PayloadError;
use actix_http::h1::{Codec, Message};
use actix_http::{Request, Response, StatusCode};
use actix_web::dev::{fn_factory, fn_service, AppConfig, Service, ServiceFactory, ServiceResponse};
use bytes::{Buf, Bytes, BytesMut};
use futures_util::Stream;

use crate::relay::owed::Owed;

/// Bytes read and not yet taken by the handler at which reading pauses
/// (actix-http's payload pauses at the same mark).
pub const QUEUED_BYTES: usize = 32 * 1024;

/// The stack buffer one read goes through.
const READ_CHUNK: usize = 16 * 1024;

/// Reads per wake-up before the writes get their turn.
const READS_PER_TURN: usize = 4;

/// Outbound bytes gathered into one write.
const WRITE_BATCH: usize = 64 * 1024;

/// Pieces one vectored write takes at most.
const WRITE_SLICES: usize = 64;

/// How long a connection whose response has ended (a WebSocket's close
/// frame is its last frame) may take to write what is left before it is
/// dropped: a peer that stopped reading holds its socket, and the kernel's
/// buffers behind it, no longer than this once it is closed.
const CLOSE_GRACE: Duration = Duration::from_secs(30);

/// What the socket's reader and the handler's request body share.
#[derive(Default)]
struct Inbound {
    chunks: VecDeque<Bytes>,
    queued: usize,
    /// The peer closed its side (or the read failed, then `error` says why).
    ended: bool,
    error: Option<io::Error>,
    /// The body's consumer, waiting for bytes.
    consumer: Option<Waker>,
    /// The reader, waiting for the consumer to take what is queued.
    reader: Option<Waker>,
    /// The body was dropped: nobody reads what arrives any more.
    dropped: bool,
}

impl Inbound {
    fn wake_consumer(&mut self) {
        if let Some(waker) = self.consumer.take() {
            waker.wake();
        }
    }
}

/// The request body handed to the application: what the socket delivers.
struct Body(Rc<RefCell<Inbound>>);

impl Stream for Body {
    type Item = Result<Bytes, PayloadError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut inbound = self.0.borrow_mut();
        if let Some(chunk) = inbound.chunks.pop_front() {
            inbound.queued -= chunk.len();
            if inbound.chunks.is_empty() {
                // A burst's slots go with its last chunk.
                inbound.chunks = VecDeque::new();
            }
            if let Some(waker) = inbound.reader.take() {
                waker.wake();
            }
            return Poll::Ready(Some(Ok(chunk)));
        }
        if let Some(error) = inbound.error.take() {
            return Poll::Ready(Some(Err(PayloadError::Io(error))));
        }
        if inbound.ended {
            return Poll::Ready(None);
        }
        match &inbound.consumer {
            Some(waker) if waker.will_wake(cx.waker()) => {}
            _ => inbound.consumer = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

impl Drop for Body {
    fn drop(&mut self) {
        let mut inbound = self.0.borrow_mut();
        inbound.dropped = true;
        inbound.chunks = VecDeque::new();
        inbound.queued = 0;
        if let Some(waker) = inbound.reader.take() {
            waker.wake();
        }
    }
}

/// The socket's read side: feeds [`Body`] until the peer closes.
struct Reader {
    inbound: Rc<RefCell<Inbound>>,
    done: bool,
}

impl Reader {
    /// Reads what the socket has, as far as the handler keeps up; returns
    /// with the waker registered wherever it waits.
    fn poll<T: AsyncRead + Unpin>(&mut self, io: &mut T, cx: &mut Context<'_>) {
        let mut reads = 0;
        while !self.done {
            {
                let mut inbound = self.inbound.borrow_mut();
                if !inbound.dropped && inbound.queued >= QUEUED_BYTES {
                    inbound.reader = Some(cx.waker().clone());
                    return;
                }
            }
            if reads == READS_PER_TURN {
                cx.waker().wake_by_ref();
                return;
            }
            reads += 1;
            let mut stack = [MaybeUninit::<u8>::uninit(); READ_CHUNK];
            let mut buf = ReadBuf::uninit(&mut stack);
            let read = match Pin::new(&mut *io).poll_read(cx, &mut buf) {
                Poll::Pending => return,
                Poll::Ready(read) => read,
            };
            let mut inbound = self.inbound.borrow_mut();
            match read {
                Ok(()) if buf.filled().is_empty() => {
                    inbound.ended = true;
                    self.done = true;
                }
                Ok(()) if inbound.dropped => {}
                Ok(()) => {
                    inbound.queued += buf.filled().len();
                    inbound.chunks.push_back(Bytes::copy_from_slice(buf.filled()));
                }
                Err(error) => {
                    inbound.error = Some(error);
                    inbound.ended = true;
                    self.done = true;
                }
            }
            inbound.wake_consumer();
        }
    }
}

/// The socket's write side: the response head, then the body as it comes.
struct Writer {
    /// Bytes not written yet, in order; empty (no allocation) between
    /// batches. Each is written from where it is, with vectored writes.
    out: VecDeque<Bytes>,
    /// Their length in all.
    queued: usize,
    /// The body's chunks go out as they are: a streamed body of an upgrade
    /// request, which the codec would copy unchanged (it neither frames
    /// nor counts an upgrade's stream).
    raw: bool,
    body_done: bool,
}

impl Writer {
    /// A writer that starts with the response's encoded head.
    fn new(head: BytesMut, raw: bool) -> Self {
        let mut writer = Writer { out: VecDeque::new(), queued: 0, raw, body_done: false };
        writer.queue(head.freeze());
        writer
    }

    fn queue(&mut self, bytes: Bytes) {
        if !bytes.is_empty() {
            self.queued += bytes.len();
            self.out.push_back(bytes);
        }
    }

    /// Takes `n` written bytes off the front.
    fn advance(&mut self, mut n: usize) {
        self.queued -= n;
        while n > 0 {
            let Some(front) = self.out.front_mut() else { break };
            if front.len() > n {
                front.advance(n);
                break;
            }
            n -= front.len();
            self.out.pop_front();
        }
        if self.out.is_empty() {
            self.out = VecDeque::new();
        }
    }

    /// Writes what the body has ready. `Ready` once the body has ended and
    /// all of it is out (or the socket failed).
    fn poll<T: AsyncWrite + Unpin>(
        &mut self,
        io: &mut T,
        codec: &mut Codec,
        body: &mut Pin<Box<BoxBody>>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            while !self.body_done && self.queued < WRITE_BATCH {
                match body.as_mut().poll_next(cx) {
                    Poll::Ready(Some(Ok(chunk))) if self.raw => self.queue(chunk),
                    Poll::Ready(Some(Ok(chunk))) => {
                        let mut encoded = BytesMut::new();
                        codec.encode(Message::Chunk(Some(chunk)), &mut encoded)?;
                        self.queue(encoded.freeze());
                    }
                    Poll::Ready(Some(Err(error))) => {
                        tracing::debug!(error = %error, "tether_upgraded_body_failed");
                        self.body_done = true;
                        self.out = VecDeque::new();
                        self.queued = 0;
                        return Poll::Ready(Ok(()));
                    }
                    Poll::Ready(None) => {
                        let mut end = BytesMut::new();
                        codec.encode(Message::Chunk(None), &mut end)?;
                        self.queue(end.freeze());
                        self.body_done = true;
                    }
                    Poll::Pending => break,
                }
            }
            if self.out.is_empty() {
                break;
            }
            let mut slices = [io::IoSlice::new(&[]); WRITE_SLICES];
            let n =
                self.out.iter().zip(slices.iter_mut()).map(|(bytes, slice)| *slice = io::IoSlice::new(bytes)).count();
            match Pin::new(&mut *io).poll_write_vectored(cx, &slices[..n]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => self.advance(n),
                Poll::Ready(Err(error)) => return Poll::Ready(Err(error)),
                Poll::Pending => return Poll::Pending,
            }
        }
        let flushed = Pin::new(&mut *io).poll_flush(cx)?;
        match (self.body_done, flushed) {
            (true, Poll::Ready(())) => Poll::Ready(Ok(())),
            _ => Poll::Pending,
        }
    }
}

/// Serves one upgrade request on its socket: the application answers it
/// (a WebSocket handler's 101, or a refusal) here, in the dispatcher's
/// task; then a task of its own carries the response's body out and the
/// peer's bytes in until the body ends, and the dispatcher's task (sized
/// for any request the application serves) ends. Once the body has ended
/// the rest is written within `close_grace`.
async fn serve<T, S, B>(app: Rc<S>, mut req: Request, framed: Framed<T, Codec>, live: &Arc<Owed>, close_grace: Duration)
where
    T: AsyncRead + AsyncWrite + Unpin + 'static,
    S: Service<Request, Response = ServiceResponse<B>, Error = actix_web::Error>,
    B: MessageBody + 'static,
{
    let open = live.one();
    let parts = framed.into_parts();
    let (mut io, mut codec) = (parts.io, parts.codec);
    let inbound = Rc::new(RefCell::new(Inbound::default()));
    if !parts.read_buf.is_empty() {
        // Bytes the peer sent right behind its request head.
        let mut first = inbound.borrow_mut();
        first.queued = parts.read_buf.len();
        first.chunks.push_back(Bytes::copy_from_slice(&parts.read_buf));
    }
    // The dispatcher's buffers go now; only what they held was kept.
    drop((parts.read_buf, parts.write_buf));
    let body: actix_http::Payload = actix_http::Payload::Stream { payload: Box::pin(Body(inbound.clone())) };
    *req.payload() = body;
    let mut reader = Reader { inbound, done: false };

    // The handler may read the request's body before it answers.
    let mut call = std::pin::pin!(app.call(req));
    let response: Response<BoxBody> = poll_fn(|cx| {
        reader.poll(&mut io, cx);
        call.as_mut().poll(cx)
    })
    .await
    .map(|res| res.map_into_boxed_body().into_parts().1.into())
    .unwrap_or_else(|error| error.error_response().into());

    let (head, body) = response.into_parts();
    // A 101's body is the upgraded protocol's stream, whatever its size
    // says (a refused socket's outbox may already read 0: its close frame
    // is all it will take); any other answer is a sized HTTP body.
    let size = match head.status() {
        StatusCode::SWITCHING_PROTOCOLS => BodySize::Stream,
        _ => body.size(),
    };
    let mut encoded = BytesMut::new();
    if let Err(error) = codec.encode(Message::Item((head, size)), &mut encoded) {
        tracing::debug!(error = %error, "tether_upgraded_head_failed");
        return;
    }
    // Every request here is an upgrade, whose streamed body the codec
    // passes through unchanged (a sized one it counts, and is kept to).
    let mut writer = Writer::new(encoded, size == BodySize::Stream);
    // What the connection keeps while it lives moves into its own task.
    actix_rt::spawn(async move {
        let _open = open;
        let mut body = Box::pin(body);
        let mut cut: Option<Pin<Box<tokio::time::Sleep>>> = None;
        let written = poll_fn(|cx| {
            reader.poll(&mut io, cx);
            let written = writer.poll(&mut io, &mut codec, &mut body, cx);
            // A body with nothing left to give may not have said so yet
            // (the writer stops taking chunks while a batch waits), but its
            // size does: a sized body is down to 0, and the outbox's body
            // reads 0 once it takes no more frames (a close frame queued,
            // or its last handle gone), and then wakes this task.
            if written.is_pending() && (writer.body_done || body.size() == BodySize::Sized(0)) {
                let cut = cut.get_or_insert_with(|| Box::pin(tokio::time::sleep(close_grace)));
                if cut.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Err(io::ErrorKind::TimedOut.into()));
                }
            }
            written
        })
        .await;
        if let Err(error) = written {
            tracing::debug!(error = %error, "tether_upgraded_write_failed");
            return;
        }
        // Every connection ends after its upgrade request's response; the
        // peer learns it from the FIN.
        let shutdown = poll_fn(|cx| Pin::new(&mut io).poll_shutdown(cx));
        let _ = tokio::time::timeout(close_grace, shutdown).await;
    });
}

/// The upgrade service of one worker: `app` is the application's factory
/// (the same routes and middleware the worker's other requests go
/// through), created once per worker with `config`; `live` counts the
/// server's upgraded connections.
pub fn factory<T, A, B>(
    app: A,
    config: AppConfig,
    live: Arc<Owed>,
) -> impl ServiceFactory<(Request, Framed<T, Codec>), Config = (), Response = (), Error = actix_http::Error, InitError = ()>
where
    T: AsyncRead + AsyncWrite + Unpin + 'static,
    A: ServiceFactory<
        Request,
        Config = AppConfig,
        Response = ServiceResponse<B>,
        Error = actix_web::Error,
        InitError = (),
    >,
    A::Service: 'static,
    A::Future: 'static,
    B: MessageBody + 'static,
{
    fn_factory(move || {
        let created = app.new_service(config.clone());
        let live = live.clone();
        async move {
            let app = Rc::new(created.await?);
            Ok(fn_service(move |(req, framed): (Request, Framed<T, Codec>)| {
                let app = app.clone();
                let live = live.clone();
                async move {
                    serve(app, req, framed, &live, CLOSE_GRACE).await;
                    Ok::<_, actix_http::Error>(())
                }
            }))
        }
    })
}

#[cfg(test)]
mod tests {
    use actix_codec::FramedParts;
    use actix_http::body::BodyStream;
    use actix_http::{ws, ServiceConfig, StatusCode};
    use actix_web::{web, App, HttpRequest, HttpResponse};
    use futures_util::{SinkExt, StreamExt};
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

    use super::*;

    const HEAD: &str = "GET /ws HTTP/1.1\r\nHost: tether.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
                        Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";

    /// An upgrade request as the dispatcher hands it over: decoded, with
    /// `behind` (bytes that came right after the head) in the read buffer.
    fn handed_over(behind: &[u8]) -> (Request, Framed<DuplexStream, Codec>, DuplexStream) {
        let (server, client) = tokio::io::duplex(1024 * 1024);
        let mut codec = Codec::new(ServiceConfig::default());
        let mut read = BytesMut::from(HEAD.as_bytes());
        read.extend_from_slice(behind);
        let Some(Message::Item(req)) = actix_codec::Decoder::decode(&mut codec, &mut read).expect("head") else {
            panic!("no request head");
        };
        (req, Framed::from_parts(FramedParts::with_read_buf(server, codec, read)), client)
    }

    /// A WebSocket handler that sends every binary message back.
    async fn echo(req: HttpRequest, body: web::Payload) -> actix_web::Result<HttpResponse> {
        let (response, mut session, mut stream) = actix_ws::handle(&req, body)?;
        actix_rt::spawn(async move {
            while let Some(Ok(actix_ws::Message::Binary(bytes))) = stream.next().await {
                if session.binary(bytes).await.is_err() {
                    return;
                }
            }
        });
        Ok(response)
    }

    fn masked(bytes: &'static [u8]) -> BytesMut {
        let mut out = BytesMut::new();
        ws::Codec::new().client_mode().encode(ws::Message::Binary(Bytes::from_static(bytes)), &mut out).expect("frame");
        out
    }

    /// `future`'s output, or a failure saying `what` did not happen in time.
    async fn soon<F: Future>(what: &str, future: F) -> F::Output {
        tokio::time::timeout(std::time::Duration::from_secs(10), future).await.unwrap_or_else(|_| panic!("{what}"))
    }

    #[actix_rt::test]
    async fn a_websocket_is_answered_then_served_by_its_own_task_with_bytes_behind_the_head() {
        let app = Rc::new(actix_web::test::init_service(App::new().route("/ws", web::get().to(echo))).await);
        let (req, framed, mut client) = handed_over(&masked(b"first"));
        let live = Arc::new(Owed::default());
        // The dispatcher's part ends with the answer, before the peer has
        // read a byte; the socket lives on, counted.
        soon("the upgrade service returns once it has answered", serve(app, req, framed, &live, CLOSE_GRACE)).await;
        assert_eq!(live.count(), 1);

        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            head.push(client.read_u8().await.expect("response head"));
        }
        let head = String::from_utf8(head).expect("utf-8");
        assert!(head.starts_with("HTTP/1.1 101"), "{head}");
        assert!(!head.to_ascii_lowercase().contains("transfer-encoding"), "{head}");

        let mut socket = Framed::new(client, ws::Codec::new().client_mode());
        assert_eq!(
            socket.next().await.expect("frame").expect("decoded"),
            ws::Frame::Binary(Bytes::from_static(b"first"))
        );
        socket.send(ws::Message::Binary(Bytes::from_static(b"second"))).await.expect("sent");
        assert_eq!(
            socket.next().await.expect("frame").expect("decoded"),
            ws::Frame::Binary(Bytes::from_static(b"second"))
        );
        assert_eq!(live.count(), 1);

        // The peer goes: the handler's stream ends, its session with it,
        // and the connection's task ends.
        drop(socket);
        soon("the connection ends after its peer", live.settled()).await;
        assert_eq!(live.count(), 0);
    }

    #[actix_rt::test]
    async fn a_refused_upgrade_gets_its_response_and_the_connection_ends() {
        let app = Rc::new(
            actix_web::test::init_service(
                App::new().route("/ws", web::get().to(|| async { HttpResponse::Forbidden().body("no") })),
            )
            .await,
        );
        let (req, framed, mut client) = handed_over(b"");
        let live = Arc::new(Owed::default());
        serve(app, req, framed, &live, CLOSE_GRACE).await;
        let mut response = String::new();
        client.read_to_string(&mut response).await.expect("read to the end");
        assert!(response.starts_with("HTTP/1.1 403"), "{response}");
        assert!(response.ends_with("\r\n\r\nno"), "{response}");
        soon("the connection ends once its response is out", live.settled()).await;
    }

    #[actix_rt::test]
    async fn a_peer_that_stops_reading_is_dropped_once_its_response_has_ended() {
        let app = Rc::new(
            actix_web::test::init_service(App::new().route(
                "/ws",
                web::get().to(|| async { HttpResponse::SwitchingProtocols().body(vec![7u8; 2 * 1024 * 1024]) }),
            ))
            .await,
        );
        let (req, framed, client) = handed_over(b"");
        let live = Arc::new(Owed::default());
        serve(app, req, framed, &live, Duration::from_millis(300)).await;
        assert_eq!(live.count(), 1, "the response is still being written");
        // The peer keeps its end open and never reads: the two megabytes
        // cannot all be written, and the connection goes after the grace.
        soon("the connection is dropped after its grace", live.settled()).await;
        drop(client);
    }

    /// A WebSocket handler that queues more than the socket takes, then
    /// closes behind it while keeping its outbox: the peer never reads.
    async fn closes_behind_a_full_socket(req: HttpRequest, body: web::Payload) -> actix_web::Result<HttpResponse> {
        use crate::relay::outbox::{Frame, Outbox};
        let (response, _session, stream) = actix_ws::handle(&req, body)?;
        let (response, outbox) = Outbox::for_response(response, usize::MAX, None);
        actix_rt::spawn(async move {
            for _ in 0..64 {
                let _ = outbox.push(Frame::Binary(Bytes::from(vec![7u8; 64 * 1024])));
            }
            // The connection's task writes until the socket is full and
            // stops taking from the body; the close comes after that.
            tokio::time::sleep(Duration::from_millis(200)).await;
            outbox.close(4503, "closing");
            tokio::time::sleep(Duration::from_secs(60)).await;
            drop((outbox, stream));
        });
        Ok(response)
    }

    #[actix_rt::test]
    async fn a_peer_that_stops_reading_is_dropped_once_its_outbox_is_closed() {
        let app = Rc::new(
            actix_web::test::init_service(App::new().route("/ws", web::get().to(closes_behind_a_full_socket))).await,
        );
        let (req, framed, client) = handed_over(b"");
        let live = Arc::new(Owed::default());
        serve(app, req, framed, &live, Duration::from_millis(300)).await;
        assert_eq!(live.count(), 1, "the socket is being written");
        // Its handler still holds the outbox, but the queue takes no more
        // frames: the close grace runs from then, however full the socket.
        soon("the connection is dropped after its grace", live.settled()).await;
        drop(client);
    }

    /// One turn of the reader: it reads until it would wait.
    async fn read_until_it_waits(reader: &mut Reader, server: &mut DuplexStream) {
        poll_fn(|cx| {
            reader.poll(server, cx);
            Poll::Ready(())
        })
        .await
    }

    #[actix_rt::test]
    async fn reading_pauses_while_the_handler_leaves_bytes_untaken() {
        let (mut server, mut client) = tokio::io::duplex(1024 * 1024);
        let inbound = Rc::new(RefCell::new(Inbound::default()));
        let mut body = Body(inbound.clone());
        let mut reader = Reader { inbound: inbound.clone(), done: false };
        client.write_all(&[7u8; 200 * 1024]).await.expect("written");

        for _ in 0..20 {
            read_until_it_waits(&mut reader, &mut server).await;
        }
        let queued = inbound.borrow().queued;
        assert!((QUEUED_BYTES..QUEUED_BYTES + READ_CHUNK).contains(&queued), "{queued} bytes read ahead");

        // What the handler takes makes room for more, and nothing is lost.
        let mut taken = 0;
        while taken < 200 * 1024 {
            read_until_it_waits(&mut reader, &mut server).await;
            let chunk = body.next().await.expect("a chunk").expect("no error");
            assert!(chunk.iter().all(|b| *b == 7));
            taken += chunk.len();
        }
        assert_eq!(taken, 200 * 1024);
        assert_eq!(inbound.borrow().chunks.capacity(), 0, "an emptied queue holds no slots");
    }

    #[actix_rt::test]
    async fn pieces_are_written_as_they_are_however_little_the_socket_takes() {
        // A socket that takes a few bytes at a time: writes end inside a
        // piece and between pieces.
        let (mut server, mut client) = tokio::io::duplex(5);
        let pieces: Vec<Bytes> = (0..20u8).map(|n| Bytes::from(vec![n; 1 + 3 * n as usize])).collect();
        let expected: Vec<u8> =
            [&b"head"[..]].into_iter().chain(pieces.iter().map(|p| &p[..])).flatten().copied().collect();
        let mut body: Pin<Box<BoxBody>> = Box::pin(BoxBody::new(BodyStream::new(futures_util::stream::iter(
            pieces.into_iter().map(Ok::<_, io::Error>),
        ))));
        let mut writer = Writer::new(BytesMut::from(&b"head"[..]), true);
        let mut codec = Codec::new(ServiceConfig::default());
        let reading = async {
            let mut got = Vec::new();
            let mut buf = [0u8; 3];
            while got.len() < expected.len() {
                let n = client.read(&mut buf).await.expect("read");
                got.extend_from_slice(&buf[..n]);
            }
            got
        };
        let writing = poll_fn(|cx| writer.poll(&mut server, &mut codec, &mut body, cx));
        let (written, got) = soon("everything is written", futures_util::future::join(writing, reading)).await;
        written.expect("written");
        assert_eq!(got, expected);
        assert_eq!((writer.queued, writer.out.capacity()), (0, 0));
    }

    #[actix_rt::test]
    async fn an_idle_socket_holds_no_write_buffer() {
        let (req, framed, mut client) = handed_over(b"");
        drop(req);
        let mut parts = framed.into_parts();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Bytes>();
        let chunks = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|chunk| (Ok::<_, io::Error>(chunk), rx))
        });
        let mut body: Pin<Box<BoxBody>> = Box::pin(BoxBody::new(BodyStream::new(chunks)));
        let mut switching = Response::with_body(StatusCode::SWITCHING_PROTOCOLS, ());
        switching.head_mut().set_connection_type(actix_http::ConnectionType::Upgrade);
        let mut head = BytesMut::new();
        parts.codec.encode(Message::Item((switching, body.size())), &mut head).expect("head");
        let mut writer = Writer::new(head, true);

        tx.send(Bytes::from_static(b"one")).expect("queued");
        tx.send(Bytes::from_static(b"two")).expect("queued");
        let pending = poll_fn(|cx| Poll::Ready(writer.poll(&mut parts.io, &mut parts.codec, &mut body, cx))).await;
        assert!(pending.is_pending(), "the body has not ended");
        assert_eq!(writer.out.capacity(), 0, "nothing is held once the batch is out");
        assert_eq!(writer.queued, 0);

        drop(tx);
        poll_fn(|cx| writer.poll(&mut parts.io, &mut parts.codec, &mut body, cx)).await.expect("written");
        drop(parts);
        let mut out = String::new();
        client.read_to_string(&mut out).await.expect("read to the end");
        assert!(out.starts_with("HTTP/1.1 101"), "{out}");
        assert!(out.ends_with("\r\n\r\nonetwo"), "the body goes out as it is: {out}");
    }
}
