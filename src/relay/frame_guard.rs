//! A WebSocket peer's bytes, followed frame by frame as they arrive, so a
//! frame or a fragmented message that declares more than the limit ends
//! the socket at its header (close 4413, docs/PROTOCOL.md, "What the
//! server enforces"), before any of its payload is held.
//!
//! actix-http's frame parser checks a frame's length only once the whole
//! frame has arrived: until then it keeps what came, so a header that
//! declares a terabyte would have the server buffer whatever the peer
//! sends. Here only the headers are read (2 to 14 bytes each); payload
//! bytes are passed on untouched and untouched by this scan.

use std::pin::Pin;
use std::task::{Context, Poll};

use actix_web::error::PayloadError;
use actix_web::{web, FromRequest, HttpRequest};
use actix_ws::ProtocolError;
use bytes::Bytes;
use futures_util::{Stream, StreamExt};

/// The longest frame header: 2 bytes, an 8-byte length, a 4-byte mask.
const MAX_HEADER: usize = 14;

/// Where the scan is in the peer's frames.
struct Scan {
    limit: u64,
    /// The current frame's header as far as it has arrived.
    header: [u8; MAX_HEADER],
    have: usize,
    /// Payload bytes of the current frame still to come.
    payload_left: u64,
    /// Data bytes of the message under way (its fragments so far).
    message: u64,
}

/// The length of a header that starts with `seen` (2 until its second
/// byte says more).
fn header_len(seen: &[u8]) -> usize {
    let Some(second) = seen.get(1) else { return 2 };
    let extended = match second & 0x7f {
        126 => 2,
        127 => 8,
        _ => 0,
    };
    let mask = if second & 0x80 != 0 { 4 } else { 0 };
    2 + extended + mask
}

impl Scan {
    fn new(limit: usize) -> Self {
        Scan { limit: limit as u64, header: [0; MAX_HEADER], have: 0, payload_left: 0, message: 0 }
    }

    /// Follows `chunk`; `Err(at)` when the header that starts at `at` (0
    /// if it began in an earlier chunk) declares a frame, or completes a
    /// message, over the limit.
    fn follow(&mut self, chunk: &[u8]) -> Result<(), usize> {
        let mut at = 0;
        while at < chunk.len() {
            if self.payload_left > 0 {
                let n = self.payload_left.min((chunk.len() - at) as u64);
                self.payload_left -= n;
                at += n as usize; // at most the chunk's length
                continue;
            }
            let starts = if self.have == 0 { at } else { 0 };
            loop {
                let need = header_len(&self.header[..self.have]);
                if self.have == need || at == chunk.len() {
                    break;
                }
                let take = (need - self.have).min(chunk.len() - at);
                self.header[self.have..self.have + take].copy_from_slice(&chunk[at..at + take]);
                self.have += take;
                at += take;
            }
            if self.have < header_len(&self.header[..self.have]) {
                return Ok(()); // the rest of the header is in the next chunk
            }
            self.have = 0;
            let length = match self.header[1] & 0x7f {
                126 => u64::from(u16::from_be_bytes([self.header[2], self.header[3]])),
                127 => u64::from_be_bytes(self.header[2..10].try_into().map_err(|_| starts)?),
                n => u64::from(n),
            };
            let data = self.header[0] & 0x08 == 0;
            let fin = self.header[0] & 0x80 != 0;
            if data {
                self.message = self.message.saturating_add(length);
            }
            if length > self.limit || self.message > self.limit {
                return Err(starts);
            }
            if data && fin {
                self.message = 0;
            }
            self.payload_left = length;
        }
        Ok(())
    }
}

/// The peer's byte stream with its frames followed (see the module doc).
struct Guarded<S> {
    inner: S,
    scan: Scan,
    /// An over-limit header was seen: the error is what comes next.
    over: bool,
    done: bool,
}

impl<S> Stream for Guarded<S>
where
    S: Stream<Item = Result<Bytes, PayloadError>> + Unpin,
{
    type Item = Result<Bytes, PayloadError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        if self.over {
            self.done = true;
            return Poll::Ready(Some(Err(PayloadError::Overflow)));
        }
        match self.inner.poll_next_unpin(cx) {
            Poll::Ready(Some(Ok(bytes))) => match self.scan.follow(&bytes) {
                Ok(()) => Poll::Ready(Some(Ok(bytes))),
                Err(at) => {
                    // The frames before the header still count.
                    self.over = true;
                    match at {
                        0 => self.poll_next(cx),
                        at => Poll::Ready(Some(Ok(bytes.slice(..at)))),
                    }
                }
            },
            other => other,
        }
    }
}

/// `body` with its frames followed against `limit` (bytes of a frame and
/// of a fragmented message's data).
pub fn guard(req: &HttpRequest, body: web::Payload, limit: usize) -> Result<web::Payload, actix_web::Error> {
    let guarded = Guarded { inner: body, scan: Scan::new(limit), over: false, done: false };
    let stream: Pin<Box<dyn Stream<Item = Result<Bytes, PayloadError>>>> = Box::pin(guarded);
    let mut payload = actix_web::dev::Payload::Stream { payload: stream };
    web::Payload::from_request(req, &mut payload).into_inner()
}

/// The close a message stream's error calls for (docs/PROTOCOL.md, "What
/// the server enforces"), or `None` when the connection itself failed and
/// no close frame can reach the peer:
/// - a frame or message over the limit, from actix-http's own check or
///   from [`guard`]: 4413;
/// - text that is not UTF-8: 1007 (RFC 6455, 8.1);
/// - any other breach of RFC 6455 (an unmasked frame, reserved bits or
///   opcodes, a bad close frame, continuations out of order): 1002.
pub fn failure(error: &ProtocolError) -> Option<(u16, &'static str)> {
    use super::close;
    const BROKEN: Option<(u16, &str)> = Some((close::PROTOCOL_ERROR, "WebSocket protocol error"));
    match error {
        ProtocolError::Overflow => Some((close::TOO_LARGE, "frame over 1 MiB")),
        ProtocolError::Io(error) => {
            let inner = error.get_ref();
            if inner
                .and_then(|inner| inner.downcast_ref::<PayloadError>())
                .is_some_and(|inner| matches!(inner, PayloadError::Overflow))
            {
                return Some((close::TOO_LARGE, "frame over 1 MiB"));
            }
            if error.kind() != std::io::ErrorKind::InvalidData {
                return None;
            }
            // actix-http and actix-ws say both of these as InvalidData
            // I/O errors; only the reserved bits name themselves.
            if error.to_string().contains("reserved bits") {
                BROKEN
            } else {
                Some((close::NOT_UTF8, "text is not UTF-8"))
            }
        }
        ProtocolError::UnmaskedFrame
        | ProtocolError::MaskedFrame
        | ProtocolError::InvalidOpcode(_)
        | ProtocolError::InvalidLength(_)
        | ProtocolError::BadOpCode
        | ProtocolError::ContinuationNotStarted
        | ProtocolError::ContinuationStarted
        | ProtocolError::ContinuationFragment(_) => BROKEN,
    }
}

#[cfg(test)]
mod tests {
    use actix_codec::Encoder;
    use actix_http::ws::{Codec, Item, Message};
    use bytes::BytesMut;

    use super::*;

    /// Messages as one client frames them (masked), a frame each.
    fn frames(messages: Vec<Message>) -> Vec<Vec<u8>> {
        let mut codec = Codec::new().client_mode();
        let mut framed = |message| {
            let mut out = BytesMut::new();
            codec.encode(message, &mut out).expect("frame");
            out.to_vec()
        };
        messages.into_iter().map(&mut framed).collect()
    }

    fn frame(message: Message) -> Vec<u8> {
        frames(vec![message]).concat()
    }

    fn binary(len: usize) -> Vec<u8> {
        frame(Message::Binary(Bytes::from(vec![7; len])))
    }

    /// A message of `first` and `last` bytes in two fragments.
    fn fragments(first: usize, last: usize) -> Vec<Vec<u8>> {
        let piece = |item: fn(Bytes) -> Item, len| Message::Continuation(item(Bytes::from(vec![7; len])));
        frames(vec![piece(Item::FirstBinary, first), piece(Item::Last, last)])
    }

    /// The header of a masked binary frame that declares 2^40 bytes.
    const HUGE: [u8; 14] = [0x82, 0xff, 0, 0, 1, 0, 0, 0, 0, 0, 1, 2, 3, 4];

    #[test]
    fn frames_under_the_limit_pass_however_they_are_cut() {
        let mut bytes = binary(300);
        bytes.extend(frame(Message::Ping(Bytes::new())));
        bytes.extend(binary(70_000));
        bytes.extend(frame(Message::Text("hello".into())));
        for cut in [1, 2, 3, 7, 13, 4096, bytes.len()] {
            let mut scan = Scan::new(100_000);
            for chunk in bytes.chunks(cut) {
                assert_eq!(scan.follow(chunk), Ok(()), "cut into {cut}-byte pieces");
            }
            assert_eq!((scan.have, scan.payload_left, scan.message), (0, 0, 0));
        }
    }

    #[test]
    fn a_header_over_the_limit_is_caught_where_it_starts() {
        let mut bytes = binary(10);
        let over = bytes.len();
        bytes.extend(HUGE);
        bytes.extend_from_slice(&[0; 100]);
        assert_eq!(Scan::new(1024).follow(&bytes), Err(over));
        // Cut inside the header: it started in the chunk before.
        let mut scan = Scan::new(1024);
        assert_eq!(scan.follow(&bytes[..over + 3]), Ok(()));
        assert_eq!(scan.follow(&bytes[over + 3..]), Err(0));
        // One byte over, in the 16-bit form.
        assert_eq!(Scan::new(1024).follow(&binary(1025)), Err(0));
        assert_eq!(Scan::new(1024).follow(&binary(1024)), Ok(()));
    }

    #[test]
    fn fragments_count_together_and_control_frames_between_them_do_not() {
        let [first, last] = <[Vec<u8>; 2]>::try_from(fragments(600, 500)).expect("two fragments");
        let mut scan = Scan::new(1024);
        assert_eq!(scan.follow(&first), Ok(()));
        assert_eq!(scan.follow(&frame(Message::Ping(Bytes::from(vec![1; 100])))), Ok(()));
        assert_eq!(scan.follow(&last), Err(0), "600 + 500 > 1024");
        // A finished message starts the count again.
        let mut scan = Scan::new(1024);
        for _ in 0..3 {
            for piece in fragments(500, 500) {
                assert_eq!(scan.follow(&piece), Ok(()));
            }
        }
    }

    #[actix_rt::test]
    async fn the_stream_gives_the_frames_before_the_header_then_the_overflow() {
        let mut first = binary(3);
        let whole = first.len();
        first.extend(HUGE);
        let chunks = vec![Ok(Bytes::from(first)), Ok(Bytes::from_static(&[0; 64]))];
        let mut guarded =
            Guarded { inner: futures_util::stream::iter(chunks), scan: Scan::new(1024), over: false, done: false };
        assert_eq!(guarded.next().await.and_then(Result::ok).map(|b| b.len()), Some(whole));
        let error = guarded.next().await.and_then(Result::err);
        assert!(matches!(error, Some(PayloadError::Overflow)), "{error:?}");
        assert!(guarded.next().await.is_none());
        let io = ProtocolError::Io(std::io::Error::other(PayloadError::Overflow));
        assert_eq!(failure(&io).map(|f| f.0), Some(4413));
        assert_eq!(failure(&ProtocolError::Overflow).map(|f| f.0), Some(4413));
        assert_eq!(failure(&ProtocolError::UnmaskedFrame).map(|f| f.0), Some(1002));
        let gone = ProtocolError::Io(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert_eq!(failure(&gone), None, "a failed connection gets no close frame");
    }
}
