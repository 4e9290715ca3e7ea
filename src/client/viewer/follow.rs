//! [`OutputFollower`]: a terminal's output stream as a sequence of offsets
//! and bytes, for programs rather than screens.
//!
//! The stream offset counts PTY output bytes since the terminal started.
//! The follower asks for `?from=<next offset>`; the server answers `resume`
//! (the bytes from there follow) or `replay` (a screen snapshot, then live
//! bytes from a later offset). Snapshot bytes are never handed out: they
//! repaint a screen, they are not output. A later start is a
//! [`Followed::Gap`] the caller may fill from elsewhere (a run's captured
//! log), an earlier one is skipped, so no byte is handed out twice.

use std::time::Duration;

use awc::error::WsProtocolError;
use awc::ws::{CloseCode, CloseReason, Frame, Message};
use bytes::Bytes;
use futures_util::{SinkExt as _, StreamExt as _};
use tokio::time::Instant;

use super::fragments::{Complete, Fragments};
use super::liveness::{Liveness, NO_ANSWER};
use super::protocol::{describe_close, should_reattach, ServerMessage, CLOSE_ABNORMAL, CLOSE_NO_STATUS};
use super::{ViewerSocket, MAX_FRAME};
use crate::client::reconnect::Outage;
use crate::client::{Client, ClientError};

/// What the stream brought next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Followed {
    /// Stream bytes starting at `offset`.
    Output { offset: u64, data: Bytes },
    /// Bytes `from..to` were not delivered: the server no longer held them
    /// and repainted instead.
    Gap { from: u64, to: u64 },
    /// The terminal's process ended (`None`: by a signal, or unknown).
    Exit { code: Option<i32> },
    /// The server reported a problem (such as "host offline") and stopped.
    Error { message: String },
    /// The socket closed for good.
    Closed { code: u16, reason: String },
}

pub struct OutputFollower {
    client: Client,
    terminal_id: String,
    socket: Option<ViewerSocket>,
    /// Offset of the next byte to hand out.
    next: u64,
    /// Bytes still to drop because the server resumed before `next`.
    skip: u64,
    /// Whether bytes arriving now are stream bytes (after `live`/`resume`).
    live: bool,
    went_live: bool,
    /// A connection was opened: later failures are part of riding out a
    /// move or an outage (`client::reconnect`), not the caller's to explain.
    connected: bool,
    outage: Outage,
    /// The wait before the next connection.
    delay: Option<Duration>,
    fragments: Fragments,
    liveness: Liveness,
    done: bool,
}

impl OutputFollower {
    /// Follows `terminal_id` from stream offset `from` (0: the beginning).
    pub fn new(client: Client, terminal_id: impl Into<String>, from: u64) -> Self {
        Self {
            client,
            terminal_id: terminal_id.into(),
            socket: None,
            next: from,
            skip: 0,
            live: false,
            went_live: false,
            connected: false,
            outage: Outage::default(),
            delay: None,
            fragments: Fragments::new(MAX_FRAME),
            liveness: Liveness::new(Instant::now()),
            done: false,
        }
    }

    /// The offset of the next byte.
    pub fn position(&self) -> u64 {
        self.next
    }

    /// Whether any connection reached the live stream (an exited terminal
    /// answers with its final screen and the exit only).
    pub fn went_live(&self) -> bool {
        self.went_live
    }

    /// The next event; `None` after the stream ended.
    pub async fn next(&mut self) -> Result<Option<Followed>, ClientError> {
        loop {
            if self.done {
                return Ok(None);
            }
            let Some(socket) = self.socket.as_mut() else {
                self.connect().await?;
                continue;
            };
            let frame = tokio::select! {
                frame = socket.next() => frame,
                () = tokio::time::sleep_until(self.liveness.deadline()) => {
                    if !self.liveness.act(socket).await {
                        if let Some(ended) = self.lost(CLOSE_ABNORMAL, Some(NO_ANSWER)) {
                            return Ok(Some(ended));
                        }
                    }
                    continue;
                }
            };
            self.liveness.heard(Instant::now());
            let frame = match frame {
                Some(Ok(frame)) => frame,
                None | Some(Err(WsProtocolError::Io(_))) => {
                    if let Some(ended) = self.lost(CLOSE_ABNORMAL, None) {
                        return Ok(Some(ended));
                    }
                    continue;
                }
                Some(Err(e)) => return Err(ClientError::Protocol(e.to_string())),
            };
            let event = match frame {
                Frame::Binary(data) => self.output(data),
                Frame::Text(text) => self.control(&text).await,
                Frame::Continuation(item) => match self.fragments.push(item)? {
                    Some(Complete::Binary(data)) => self.output(data),
                    Some(Complete::Text(text)) => self.control(&text).await,
                    None => None,
                },
                Frame::Ping(payload) => {
                    let _ = socket.send(Message::Pong(payload)).await;
                    None
                }
                Frame::Pong(_) => None,
                Frame::Close(reason) => {
                    let code = reason.as_ref().map_or(CLOSE_NO_STATUS, |r| u16::from(r.code));
                    let description = reason.as_ref().and_then(|r| r.description.clone());
                    let _ = socket.send(Message::Close(reason)).await;
                    self.lost(code, description.as_deref())
                }
            };
            if let Some(event) = event {
                return Ok(Some(event));
            }
        }
    }

    async fn connect(&mut self) -> Result<(), ClientError> {
        if let Some(delay) = self.delay.take() {
            tokio::time::sleep(delay).await;
        }
        match self.client.open_viewer(&self.terminal_id, Some(self.next)).await {
            Ok(socket) => {
                self.socket = Some(socket);
                self.connected = true;
                self.liveness = Liveness::new(Instant::now());
                self.live = false;
                Ok(())
            }
            // The first connection's failure is the caller's to explain.
            Err(e) if !self.connected => Err(e),
            Err(e) => match self.outage.next_delay() {
                Some(delay) => {
                    tracing::debug!(error = %e, "tether_follow_reconnect_failed");
                    self.delay = Some(delay);
                    Ok(())
                }
                None => Err(e),
            },
        }
    }

    /// The socket is gone: reopen it when the close invites that.
    fn lost(&mut self, code: u16, description: Option<&str>) -> Option<Followed> {
        self.socket = None;
        if should_reattach(code, description) {
            if let Some(delay) = self.outage.next_delay() {
                self.delay = Some(delay);
                return None;
            }
        }
        self.done = true;
        Some(Followed::Closed { code, reason: describe_close(code, description) })
    }

    fn output(&mut self, mut data: Bytes) -> Option<Followed> {
        if !self.live {
            return None; // a snapshot repaint
        }
        let dropped = self.skip.min(data.len() as u64);
        self.skip -= dropped;
        data = data.slice(dropped as usize..);
        if data.is_empty() {
            return None;
        }
        let offset = self.next;
        self.next += data.len() as u64;
        Some(Followed::Output { offset, data })
    }

    /// The stream (re)starts at `offset`.
    fn start_at(&mut self, offset: u64) -> Option<Followed> {
        self.live = true;
        self.went_live = true;
        self.outage.over();
        if offset > self.next {
            let gap = Followed::Gap { from: self.next, to: offset };
            self.next = offset;
            self.skip = 0;
            return Some(gap);
        }
        self.skip = self.next - offset;
        None
    }

    async fn control(&mut self, text: &[u8]) -> Option<Followed> {
        let Ok(control) = ServerMessage::parse(text) else {
            tracing::debug!("tether_follow_bad_control_message");
            return None;
        };
        match control {
            ServerMessage::Replay { .. } => {
                self.live = false;
                None
            }
            ServerMessage::Live { offset } | ServerMessage::Resume { offset } => self.start_at(offset),
            ServerMessage::Exit { exit_code } => {
                self.finish().await;
                Some(Followed::Exit { code: exit_code })
            }
            ServerMessage::Error { message } => {
                self.finish().await;
                Some(Followed::Error { message })
            }
            ServerMessage::Access { .. }
            | ServerMessage::Status { .. }
            | ServerMessage::Size { .. }
            | ServerMessage::Pong
            | ServerMessage::Unknown => None,
        }
    }

    /// Closes with 1000: the stream is over.
    async fn finish(&mut self) {
        self.done = true;
        if let Some(mut socket) = self.socket.take() {
            let _ = socket.send(Message::Close(Some(CloseReason::from(CloseCode::Normal)))).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn follower(from: u64) -> OutputFollower {
        OutputFollower::new(Client::new("http://127.0.0.1:1", "tth_x", None).unwrap(), "t", from)
    }

    fn output(offset: u64, data: &'static [u8]) -> Option<Followed> {
        Some(Followed::Output { offset, data: Bytes::from_static(data) })
    }

    #[actix_rt::test]
    async fn snapshots_are_dropped_and_live_bytes_counted() {
        let mut f = follower(0);
        assert_eq!(f.output(Bytes::from_static(b"final screen")), None);
        assert_eq!(f.start_at(0), None);
        assert_eq!(f.output(Bytes::from_static(b"abc")), output(0, b"abc"));
        assert_eq!(f.output(Bytes::from_static(b"de")), output(3, b"de"));
        assert_eq!(f.position(), 5);
        assert!(f.went_live());
    }

    #[actix_rt::test]
    async fn a_later_start_is_a_gap_and_an_earlier_one_is_skipped() {
        let mut f = follower(0);
        assert_eq!(f.start_at(100), Some(Followed::Gap { from: 0, to: 100 }));
        assert_eq!(f.output(Bytes::from_static(b"x")), output(100, b"x"));
        // A reconnect resumed three bytes early: they were handed out already.
        f.live = false;
        assert_eq!(f.start_at(98), None);
        assert_eq!(f.output(Bytes::from_static(b"yz")), None);
        assert_eq!(f.output(Bytes::from_static(b"\x01more")), output(101, b"more"));
        assert_eq!(f.position(), 105);
    }

    #[actix_rt::test]
    async fn only_moves_and_drops_reconnect() {
        let mut f = follower(7);
        assert_eq!(f.lost(4503, None), None);
        assert!(!f.done);
        assert_eq!(f.lost(4404, None), Some(Followed::Closed { code: 4404, reason: "terminal not found".into() }));
        assert!(f.done);
    }
}
