//! One WebSocket connection to an instance: dialing, the ordered outbound
//! queue with its writer task, and decoding inbound frames.
//!
//! Every frame the daemon sends goes through one bounded queue per
//! connection (the `Outbox`), drained by one writer task: that single queue
//! is what orders frames on the wire, and its bound is what pushes back on
//! producers when the server reads slowly (docs/ARCHITECTURE.md, "Backpressure").
//! When the connection dies the queue's receiver is dropped, so producers
//! holding an old `Outbox` see it fail instead of blocking.

use std::time::Instant;

use bytes::Bytes;
use futures_util::stream::{LocalBoxStream, SplitSink};
use futures_util::{Sink, SinkExt, StreamExt};
use prost::Message as _;
use tokio::sync::mpsc;

use super::server_url::ServerUrl;
use crate::proto::v1::{daemon_frame::Frame, DaemonFrame, ServerFrame};

/// The subprotocol of the daemon socket.
pub const SUBPROTOCOL: &str = "tether.daemon.v1";
/// Largest frame either side may send (the server closes 4413 above it;
/// docs/PROTOCOL.md, "What the server enforces").
pub const MAX_FRAME_BYTES: usize = 1024 * 1024;
/// Frames queued for the writer. With Output chunks of at most 64 KiB this
/// bounds a connection's queue to a few MiB.
const OUTBOUND_FRAMES: usize = 64;

/// Something for the writer to put on the wire.
#[derive(Debug)]
pub enum Outbound {
    Frame(Frame),
    /// Answer to a WebSocket-level ping.
    Pong(Bytes),
    /// The daemon is stopping: a close frame (1000), the last thing written.
    Close,
}

/// The sending side of a connection's ordered queue.
pub type Outbox = mpsc::Sender<Outbound>;

/// Why dialing failed.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    /// The server answered the upgrade with this HTTP status.
    #[error("the server refused the WebSocket upgrade with HTTP {0}")]
    Refused(u16),
    #[error("cannot connect: {0}")]
    Failed(String),
}

/// What the read side produced.
pub enum Inbound {
    Frame(ServerFrame),
    /// The server closed the socket, with this close code and reason if
    /// it gave them.
    Closed(ServerClose),
    /// The socket failed or ended without a close frame.
    Lost(String),
}

/// A close frame from the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerClose {
    pub code: Option<u16>,
    /// The close reason: a 4409's names the cell to dial.
    pub reason: Option<String>,
}

/// A live connection, split into its three parts so a select can wait on
/// all of them at once.
pub struct Connection {
    pub inbound: InboundFrames,
    pub out: Outbox,
    pub writer: WriterTask,
}

/// Opens the daemon socket.
pub async fn dial(client: &awc::Client, server: &ServerUrl, token: &str) -> Result<Connection, DialError> {
    let (response, framed) = client
        .ws(server.daemon_ws_endpoint())
        .protocols([SUBPROTOCOL])
        .bearer_auth(token)
        .max_frame_size(MAX_FRAME_BYTES)
        .connect()
        .await
        .map_err(|err| match err {
            awc::error::WsClientError::InvalidResponseStatus(status) => DialError::Refused(status.as_u16()),
            other => DialError::Failed(crate::tls::explain(&other)),
        })?;
    let selected = response.headers().get(awc::http::header::SEC_WEBSOCKET_PROTOCOL);
    if selected.is_none_or(|protocol| protocol.as_bytes() != SUBPROTOCOL.as_bytes()) {
        tracing::warn!(selected = ?selected, "tether_daemon_subprotocol_not_selected");
    }

    let (sink, stream) = framed.split();
    let (out, queue) = mpsc::channel(OUTBOUND_FRAMES);
    let writer = WriterTask(tokio::task::spawn_local(write_loop(sink, queue)));
    Ok(Connection {
        inbound: InboundFrames { stream: stream.boxed_local(), out: out.clone(), last_heard: Instant::now() },
        out,
        writer,
    })
}

type WsItem = Result<awc::ws::Frame, awc::error::WsProtocolError>;

/// A binary message from the server as a frame (an unknown frame kind
/// decodes with no `frame` and is skipped by the host).
pub fn decode_server_frame(bytes: impl bytes::Buf) -> Result<ServerFrame, prost::DecodeError> {
    ServerFrame::decode(bytes)
}

/// The read side: decodes ServerFrames and answers WebSocket pings.
pub struct InboundFrames {
    stream: LocalBoxStream<'static, WsItem>,
    out: Outbox,
    last_heard: Instant,
}

impl InboundFrames {
    /// The next server frame or the end of the socket. Cancel-safe: it only
    /// awaits the socket, never the outbound queue.
    pub async fn next(&mut self) -> Inbound {
        loop {
            let item = self.stream.next().await;
            self.last_heard = Instant::now();
            match item {
                None => return Inbound::Lost("socket ended without a close frame".to_owned()),
                Some(Err(err)) => return Inbound::Lost(err.to_string()),
                Some(Ok(awc::ws::Frame::Binary(data))) => match decode_server_frame(data) {
                    Ok(frame) => return Inbound::Frame(frame),
                    Err(err) => tracing::warn!(error = %err, "tether_daemon_bad_server_frame"),
                },
                Some(Ok(awc::ws::Frame::Close(reason))) => {
                    return Inbound::Closed(ServerClose {
                        code: reason.as_ref().map(|reason| reason.code.into()),
                        reason: reason.and_then(|reason| reason.description),
                    });
                }
                Some(Ok(awc::ws::Frame::Ping(payload))) => {
                    // A full queue already proves the socket is busy; a lost
                    // pong is harmless next to blocking the read side.
                    let _ = self.out.try_send(Outbound::Pong(payload));
                }
                Some(Ok(awc::ws::Frame::Pong(_))) => {}
                Some(Ok(awc::ws::Frame::Text(_) | awc::ws::Frame::Continuation(_))) => {
                    tracing::warn!("tether_daemon_unexpected_message");
                }
            }
        }
    }

    /// Whether anything at all arrived on the socket after `at`.
    pub fn heard_since(&self, at: Instant) -> bool {
        self.last_heard > at
    }
}

/// The writer task; aborted when the connection is dropped, which drops the
/// queue's receiver and fails every `Outbox` still pointing at it.
pub struct WriterTask(tokio::task::JoinHandle<()>);

impl WriterTask {
    /// Resolves when the writer stopped (the socket failed).
    pub async fn stopped(&mut self) {
        let _ = (&mut self.0).await;
    }
}

impl Drop for WriterTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn write_loop<S>(mut sink: SplitSink<S, awc::ws::Message>, mut queue: mpsc::Receiver<Outbound>)
where
    S: Sink<awc::ws::Message, Error = awc::error::WsProtocolError> + futures_util::Stream,
{
    while let Some(item) = queue.recv().await {
        let result = match item {
            Outbound::Frame(frame) => feed_frame(&mut sink, frame).await,
            Outbound::Pong(payload) => sink.feed(awc::ws::Message::Pong(payload)).await,
            Outbound::Close => {
                let reason = awc::ws::CloseReason {
                    code: awc::ws::CloseCode::Normal,
                    description: Some("daemon stopping".to_owned()),
                };
                let _ = sink.send(awc::ws::Message::Close(Some(reason))).await;
                return;
            }
        };
        // Batch writes while the queue is busy; flush once it drains.
        let result = match result {
            Ok(()) if queue.is_empty() => sink.flush().await,
            other => other,
        };
        if let Err(err) = result {
            tracing::info!(error = %err, "tether_daemon_socket_write_failed");
            return;
        }
    }
}

async fn feed_frame<S>(
    sink: &mut SplitSink<S, awc::ws::Message>,
    frame: Frame,
) -> Result<(), awc::error::WsProtocolError>
where
    S: Sink<awc::ws::Message, Error = awc::error::WsProtocolError> + futures_util::Stream,
{
    let frame = DaemonFrame { frame: Some(frame) };
    let len = frame.encoded_len();
    if len > MAX_FRAME_BYTES {
        // The server would close the whole connection (4413) for it.
        tracing::error!(bytes = len, "tether_daemon_frame_too_large");
        return Ok(());
    }
    sink.feed(awc::ws::Message::Binary(Bytes::from(frame.encode_to_vec()))).await
}
