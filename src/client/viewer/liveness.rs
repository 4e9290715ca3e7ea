//! Whether the server at the other end of a viewer socket still answers
//! (docs/PROTOCOL.md, "Liveness"). A frozen instance, or a path that a
//! network change left half open, keeps the socket open and silent: a
//! client that only waits for the next frame would wait for ever. After
//! [`QUIET`] with nothing heard the client sends a WebSocket ping; with
//! nothing heard [`ANSWER`] after that it gives the connection up and
//! reattaches, as after any drop.

use std::time::Duration;

use awc::error::WsProtocolError;
use awc::ws::Message;
use bytes::Bytes;
use futures_util::{Sink, SinkExt as _};
use tokio::time::Instant;

/// Nothing heard for this long: ask. The server's own keepalive ping comes
/// every 30 s, and terminal output far more often, so a live connection
/// that is this quiet is idle, not gone.
pub const QUIET: Duration = Duration::from_secs(15);

/// How long the server has to answer a ping.
pub const ANSWER: Duration = Duration::from_secs(5);

/// The close description a connection given up on is reported with.
pub const NO_ANSWER: &str = "the server did not answer";

/// Sends the watchdog's ping; false when even that could not be done
/// within [`ANSWER`] (a peer that stopped reading), which counts as no
/// answer.
async fn ping<S>(socket: &mut S) -> bool
where
    S: Sink<Message, Error = WsProtocolError> + Unpin,
{
    matches!(tokio::time::timeout(ANSWER, socket.send(Message::Ping(Bytes::from_static(b"alive")))).await, Ok(Ok(())))
}

/// The watchdog's state for one connection.
#[derive(Debug, Clone, Copy)]
pub struct Liveness {
    heard: Instant,
    asked: Option<Instant>,
}

/// What is due when [`Liveness::deadline`] comes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// Send a ping now.
    Ask,
    /// The ping went unanswered: give the connection up.
    GiveUp,
    /// Nothing yet (something was heard meanwhile).
    Nothing,
}

impl Liveness {
    /// A connection that just opened counts as heard now.
    pub fn new(now: Instant) -> Self {
        Self { heard: now, asked: None }
    }

    /// Any frame from the server, of any kind, is an answer.
    pub fn heard(&mut self, now: Instant) {
        self.heard = now;
        self.asked = None;
    }

    /// When [`check`](Self::check) has something to do next.
    pub fn deadline(&self) -> Instant {
        match self.asked {
            Some(at) => at + ANSWER,
            None => self.heard + QUIET,
        }
    }

    /// Does what is due at [`deadline`](Self::deadline) on `socket`: a
    /// ping when it has been quiet. False when the connection is to be
    /// given up (a ping went unanswered, or could not be sent).
    pub async fn act<S>(&mut self, socket: &mut S) -> bool
    where
        S: Sink<Message, Error = WsProtocolError> + Unpin,
    {
        match self.check(Instant::now()) {
            Due::Nothing => true,
            Due::Ask => ping(socket).await,
            Due::GiveUp => false,
        }
    }

    pub fn check(&mut self, now: Instant) -> Due {
        match self.asked {
            Some(at) if now >= at + ANSWER => Due::GiveUp,
            Some(_) => Due::Nothing,
            None if now >= self.heard + QUIET => {
                self.asked = Some(now);
                Due::Ask
            }
            None => Due::Nothing,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quiet_connection_is_asked_then_given_up_unless_it_answers() {
        let t0 = Instant::now();
        let mut live = Liveness::new(t0);
        assert_eq!(live.deadline(), t0 + QUIET);
        assert_eq!(live.check(t0 + QUIET - Duration::from_millis(1)), Due::Nothing);
        assert_eq!(live.check(t0 + QUIET), Due::Ask);
        assert_eq!(live.deadline(), t0 + QUIET + ANSWER);
        assert_eq!(live.check(t0 + QUIET + Duration::from_secs(1)), Due::Nothing, "one ping at a time");
        // An answer starts the quiet time over.
        let t1 = t0 + QUIET + Duration::from_secs(2);
        live.heard(t1);
        assert_eq!(live.check(t1 + ANSWER), Due::Nothing);
        assert_eq!(live.check(t1 + QUIET), Due::Ask);
        assert_eq!(live.check(t1 + QUIET + ANSWER), Due::GiveUp);
    }
}
