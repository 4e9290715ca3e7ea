//! The socket reader of a daemon connection: decodes frames and hands
//! them to the actor one at a time, waiting for each, so frames are
//! handled strictly in order and a fast daemon is slowed by TCP. After the
//! hello it answers the daemon's 30 s pings itself: a Pong needs nothing
//! of the actor, and a trip through its mailbox per ping is most of what
//! thousands of idle daemons cost (docs/BENCHMARKS.md).

use super::*;
use crate::relay::frame_guard::failure;

/// A decoded frame, or why the reader stopped.
enum Read {
    Frame(DaemonFrame, usize),
    Closed,
    Fail(u16, &'static str),
    Skip,
}

/// A binary message from a daemon as a frame; `None` when it is not a
/// `DaemonFrame` or carries no frame kind (the socket is closed 1008).
/// Given the message's `Bytes`, Output data comes out as a slice of them,
/// not a copy (prost's `Buf` for `Bytes`).
pub fn decode_frame(bytes: impl bytes::Buf) -> Option<DaemonFrame> {
    DaemonFrame::decode(bytes).ok().filter(|frame| frame.frame.is_some())
}

fn decode(msg: Option<Result<AggregatedMessage, ProtocolError>>, outbox: &Outbox) -> Read {
    match msg {
        None => Read::Closed,
        Some(Ok(AggregatedMessage::Close(reason))) => {
            outbox.answer_close(reason.as_ref());
            Read::Closed
        }
        Some(Ok(AggregatedMessage::Binary(bytes))) => {
            let len = bytes.len();
            match decode_frame(bytes) {
                Some(frame) => Read::Frame(frame, len),
                None => Read::Fail(close::POLICY, "malformed frame"),
            }
        }
        Some(Ok(AggregatedMessage::Text(_))) => {
            Read::Fail(close::POLICY, "text frames are not part of the daemon protocol")
        }
        Some(Ok(AggregatedMessage::Ping(bytes))) => {
            let _ = outbox.push(Frame::Pong(bytes));
            Read::Skip
        }
        Some(Ok(AggregatedMessage::Pong(_))) => Read::Skip,
        Some(Err(e)) => match failure(&e) {
            Some((code, reason)) => Read::Fail(code, reason),
            None => Read::Closed,
        },
    }
}

pub(super) async fn read_loop(
    addr: Addr<DaemonConn>,
    mut stream: AggregatedMessageStream,
    outbox: Outbox,
    heard: Heard,
    hello_timeout: Duration,
) {
    let deadline = tokio::time::Instant::now() + hello_timeout;
    let mut held: VecDeque<DaemonFrame> = VecDeque::new();
    let mut held_bytes = 0usize;
    let mut hello: Option<std::pin::Pin<Box<Request<DaemonConn, Hello>>>> = None;
    // Phase 1: until the hello is done, hold everything else.
    loop {
        let read = tokio::select! {
            accepted = async {
                match hello.as_mut() {
                    Some(pending) => pending.await,
                    None => std::future::pending().await,
                }
            }, if hello.is_some() => {
                match accepted {
                    Ok(true) => break,
                    _ => return, // refused: the actor closed the socket
                }
            }
            () = tokio::time::sleep_until(deadline), if hello.is_none() => {
                addr.do_send(Fail(close::NO_HELLO, "no hello in time"));
                return;
            }
            msg = stream.next() => decode(msg, &outbox),
        };
        match read {
            Read::Frame(frame, len) => {
                if hello.is_none() {
                    if let Some(daemon_frame::Frame::Hello(h)) = frame.frame {
                        hello = Some(Box::pin(addr.send(Hello(h))));
                        continue;
                    }
                }
                held_bytes += len;
                held.push_back(frame);
                if held.len() > EARLY_FRAMES || held_bytes > EARLY_BYTES {
                    addr.do_send(Fail(close::POLICY, "too many frames before the hello was done"));
                    return;
                }
            }
            Read::Skip => {}
            ended => return report_end(&addr, ended),
        }
    }
    // Phase 2: one frame at a time, each handled before the next is read.
    for frame in held {
        if addr.send(Inbound(frame)).await.is_err() {
            return;
        }
    }
    loop {
        match decode(stream.next().await, &outbox) {
            Read::Frame(DaemonFrame { frame: Some(daemon_frame::Frame::Ping(_)) }, _) => {
                heard.stamp();
                if outbox.push(encoded(server_frame::Frame::Pong(crate::proto::v1::Pong {}))).is_err() {
                    tracing::warn!("tether_daemon_not_reading");
                    // What is queued will not be read: the close goes first.
                    outbox.abort(close::POLICY, NOT_READING);
                    addr.do_send(Fail(close::POLICY, NOT_READING));
                    return;
                }
            }
            Read::Frame(frame, _) => {
                if addr.send(Inbound(frame)).await.is_err() {
                    return;
                }
            }
            Read::Skip => {}
            ended => return report_end(&addr, ended),
        }
    }
}

/// Tells the actor why the reader stopped.
fn report_end(addr: &Addr<DaemonConn>, read: Read) {
    match read {
        Read::Fail(code, reason) => addr.do_send(Fail(code, reason)),
        _ => addr.do_send(SocketClosed),
    }
}
