//! One attach session: a sequence of viewer connections to the same terminal
//! that, to the user, looks like one uninterrupted stream.
//!
//! A connection ends either for good (detach, exit, a refusal) or in a way
//! another connection can continue (4503, a dropped socket); then the session
//! reattaches with `?from=<offset>` after a short backoff. It gives up only
//! as `client::reconnect` says (no connection live for 10 minutes): a
//! server restarting, frozen or out of reach for a while is waited for, as
//! the web page does, and says so on the screen. The detach key works at every moment, including while
//! reconnecting. A
//! connection whose server stops answering is given up and reattached too
//! (`client::viewer::liveness`).
//!
//! A connection starts with the server's `access` message. A full viewer
//! then sends its `view` (and, on a fresh attach, its `resize` claim), and
//! whatever was typed meanwhile once the stream is live (`live` or
//! `resume`): keys typed before, or while the host is offline, are held,
//! since the server refuses input then. A read-only viewer (a `read` or share
//! token, docs/PROTOCOL.md "Read-only viewers") says so at once, in the
//! screen and the window title, and sends nothing: keystrokes other than
//! the detach key ring the bell instead.

use std::future::Future;
use std::io::Write;
use std::time::Duration;

use awc::error::WsProtocolError;
use awc::ws::{CloseCode, CloseReason, Frame, Message};
use bytes::{Bytes, BytesMut};
use futures_util::{Sink, SinkExt as _, Stream, StreamExt as _};
use tokio::time::{Instant, MissedTickBehavior};

use super::position::StreamPosition;
use super::{AttachError, AttachOptions, AttachOutcome, LocalIo};
use crate::client::reconnect::Outage;
use crate::client::viewer::fragments::{Complete, Fragments};
use crate::client::viewer::liveness::{Liveness, NO_ANSWER};
use crate::client::viewer::protocol::{
    describe_close, should_reattach, ClientMessage, ServerMessage, CLOSE_ABNORMAL, CLOSE_NORMAL, CLOSE_NO_STATUS,
};
use crate::client::viewer::MAX_FRAME;
use crate::client::Client;

/// How often a `view` tells the arbiter this viewer is alive and how idle
/// it is, so a quiet CLI holder is not taken for a vanished one (the arbiter
/// also pings holders it has not heard from, and our pongs answer that).
const HEARTBEAT: Duration = Duration::from_secs(5);

/// How long to wait for the server's Close reply after we close.
const CLOSE_WAIT: Duration = Duration::from_secs(1);

/// Keystrokes typed while disconnected are sent after the reattach, up to
/// this much; beyond it they are dropped rather than buffered without bound.
/// Once one read of the keyboard does not fit, it and everything typed
/// after it until the reattach are dropped, never a part of one, and the
/// user is told how much.
const MAX_HELD_INPUT: usize = 64 * 1024;

/// Shown when the server says the connection is read-only, before the
/// screen's snapshot (which then repaints over it).
pub const READ_ONLY_BANNER: &str = "[read-only: you can watch this terminal but not type into it]";
/// The window title for the rest of a read-only session: xterm's "save the
/// title" first, then the title, so [`RESTORE_TITLE`] can put the user's
/// back (terminals without the save ignore both).
const READ_ONLY_TITLE: &[u8] = b"\x1b[22;2t\x1b]2;tether: read-only\x07";
const RESTORE_TITLE: &[u8] = b"\x1b[23;2t";
/// Shown while waiting for the host, on a line of its own (the stream's
/// repaint covers it once the host is back).
const WAITING_FOR_HOST: &str = "\r\n[host offline; waiting for it to come back]\r\n";

/// Shown once per outage when a reattach's handshake failed (the stream's
/// repaint, or the next output, follows it once a connection is live again).
const RECONNECTING: &str = "\r\n[connection to the server lost; reconnecting (the detach key ends the wait)]\r\n";

/// Said once when typing while disconnected passes [`MAX_HELD_INPUT`].
const DROPPING_INPUT: &str = "\r\n[disconnected: over 64 KiB typed; the rest is not sent]\r\n";

/// How a connection ended.
enum Ended {
    /// The session is over.
    Finished(AttachOutcome),
    /// The connection is gone, but another one may continue the session.
    Lost {
        /// Whether this connection got as far as live bytes (resets the
        /// failure budget: it was progress, not a failed attempt).
        went_live: bool,
        /// What the session ends with if no further attempt is made.
        if_giving_up: Result<AttachOutcome, AttachError>,
    },
}

pub(super) struct Session<I, R, W> {
    opts: AttachOptions,
    client: Client,
    io: LocalIo<I, R, W>,
    input_open: bool,
    resizes_open: bool,
    last_keystroke: Instant,
    position: StreamPosition,
    held_input: BytesMut,
    /// Bytes typed while disconnected that did not fit in the hold.
    dropped_input: usize,
    /// Whether this connection's `access` came (or another message, from a
    /// server that sends none, which counts as full access).
    access_known: bool,
    read_only: bool,
    /// The read-only title is set (restored when the session ends).
    titled: bool,
    /// The user was told the host is offline and we wait for it (said
    /// again only after the stream went on).
    waiting_for_host: bool,
    /// The user was told we reconnect (said again only after the stream
    /// went on).
    told_reconnecting: bool,
}

impl<I, R, W> Session<I, R, W>
where
    I: Stream<Item = Bytes> + Unpin,
    R: Stream<Item = (u16, u16)> + Unpin,
    W: Write,
{
    pub(super) fn new(opts: AttachOptions, io: LocalIo<I, R, W>, client: Client) -> Self {
        Self {
            opts,
            client,
            io,
            input_open: true,
            resizes_open: true,
            last_keystroke: Instant::now(),
            position: StreamPosition::new(),
            held_input: BytesMut::new(),
            dropped_input: 0,
            access_known: false,
            read_only: false,
            titled: false,
            waiting_for_host: false,
            told_reconnecting: false,
        }
    }

    pub(super) async fn run(mut self) -> Result<AttachOutcome, AttachError> {
        let result = self.connections().await;
        if self.titled {
            self.notify(RESTORE_TITLE);
        }
        result
    }

    async fn connections(&mut self) -> Result<AttachOutcome, AttachError> {
        let mut reattaching = false;
        // Failed attempts since a connection last went live: a host or
        // server gone for good ends the session instead of a retry loop.
        let mut outage = Outage::default();
        loop {
            let connecting = self.open_socket(self.position.resume_from());
            let Some(connected) = self.watch_input_while(connecting).await else {
                return Ok(AttachOutcome::Detached);
            };
            let ended = match connected {
                Ok(mut socket) => self.serve_connection(&mut socket, reattaching).await?,
                Err(e) if !reattaching || e.is_permanent() => return Err(e),
                Err(e) => Ended::Lost { went_live: false, if_giving_up: Err(e) },
            };
            let if_giving_up = match ended {
                Ended::Finished(outcome) => return Ok(outcome),
                Ended::Lost { went_live, if_giving_up } => {
                    if went_live {
                        outage.over();
                    }
                    if_giving_up
                }
            };
            let Some(delay) = outage.next_delay() else {
                return self.give_up_reattaching(if_giving_up, outage.attempts());
            };
            // A handshake that failed, not a server that answered and sent
            // us on (a 4503 from a moving host is over in a moment).
            if if_giving_up.is_err() && !self.told_reconnecting {
                self.told_reconnecting = true;
                self.notify(RECONNECTING.as_bytes());
            }
            reattaching = true;
            tracing::debug!(attempt = outage.attempts(), "tether_attach_reattaching");
            if self.watch_input_while(tokio::time::sleep(delay)).await.is_none() {
                return Ok(AttachOutcome::Detached);
            }
        }
    }

    /// Ends the session after the last failed attempt, saying how much of
    /// what was typed meanwhile was never sent.
    fn give_up_reattaching(
        &mut self,
        if_giving_up: Result<AttachOutcome, AttachError>,
        attempts: u32,
    ) -> Result<AttachOutcome, AttachError> {
        let unsent = self.held_input.len() + self.dropped_input;
        if unsent > 0 {
            self.notify(format!("\r\n[{unsent} bytes typed while disconnected were not sent]\r\n").as_bytes());
        }
        give_up(if_giving_up, attempts)
    }

    /// The handshake, as a future that borrows nothing from `self` so that
    /// keystrokes can be watched while it runs.
    fn open_socket(
        &self,
        resume_from: Option<u64>,
    ) -> impl Future<
        Output = Result<
            impl Stream<Item = Result<Frame, WsProtocolError>> + Sink<Message, Error = WsProtocolError> + Unpin,
            AttachError,
        >,
    > + 'static {
        let client = self.client.clone();
        let terminal_id = self.opts.terminal_id.clone();
        async move { client.open_viewer(&terminal_id, resume_from).await.map_err(AttachError::from) }
    }

    /// Runs `fut` to completion while still reading keystrokes: the detach
    /// key must work during a handshake or a backoff too. Other keystrokes
    /// are held for the next connection. `None` means the user detached.
    async fn watch_input_while<F: Future>(&mut self, fut: F) -> Option<F::Output> {
        tokio::pin!(fut);
        loop {
            tokio::select! {
                output = &mut fut => return Some(output),
                chunk = self.io.input.next(), if self.input_open => match chunk {
                    None => self.input_open = false,
                    Some(chunk) => {
                        let (keys, detach) = self.take_keystrokes(chunk);
                        self.hold_input(&keys);
                        if detach {
                            return None;
                        }
                    }
                },
            }
        }
    }

    async fn serve_connection<S>(&mut self, socket: &mut S, reattaching: bool) -> Result<Ended, AttachError>
    where
        S: Stream<Item = Result<Frame, WsProtocolError>> + Sink<Message, Error = WsProtocolError> + Unpin,
    {
        self.position.on_connect();
        self.access_known = false;

        let mut heartbeat = tokio::time::interval_at(Instant::now() + HEARTBEAT, HEARTBEAT);
        heartbeat.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut fragments = Fragments::new(MAX_FRAME);
        let mut liveness = Liveness::new(Instant::now());
        loop {
            tokio::select! {
                frame = socket.next() => {
                    liveness.heard(Instant::now());
                    let frame = match frame {
                        Some(Ok(frame)) => frame,
                        None => return Ok(self.lost(CLOSE_ABNORMAL, None)),
                        Some(Err(WsProtocolError::Io(e))) => {
                            return Ok(self.lost(CLOSE_ABNORMAL, Some(&e.to_string())));
                        }
                        Some(Err(e)) => return Err(AttachError::Protocol(e.to_string())),
                    };
                    let ended = match frame {
                        Frame::Binary(data) => {
                            self.show(&data)?;
                            None
                        }
                        Frame::Text(text) => self.on_control(socket, &text, reattaching).await,
                        Frame::Continuation(item) => match fragments.push(item)? {
                            Some(Complete::Binary(data)) => {
                                self.show(&data)?;
                                None
                            }
                            Some(Complete::Text(text)) => {
                                self.on_control(socket, &text, reattaching).await
                            }
                            None => None,
                        },
                        Frame::Ping(payload) => {
                            send(socket, Message::Pong(payload)).await;
                            None
                        }
                        Frame::Pong(_) => None,
                        Frame::Close(reason) => Some(self.on_close(socket, reason).await),
                    };
                    if let Some(ended) = ended {
                        return Ok(ended);
                    }
                }
                chunk = self.io.input.next(), if self.input_open => match chunk {
                    // stdin at EOF (a pipe ran dry): keep showing the terminal.
                    None => self.input_open = false,
                    Some(chunk) => {
                        let (keys, detach) = self.take_keystrokes(chunk);
                        if keys.is_empty() {
                            // Only the detach key, or nothing.
                        } else if self.access_known && self.read_only {
                            self.notify(b"\x07");
                        } else if !self.access_known || !self.streaming() {
                            self.hold_input(&keys);
                        } else {
                            send(socket, Message::Binary(keys)).await;
                        }
                        if detach {
                            close_gracefully(socket).await;
                            return Ok(Ended::Finished(AttachOutcome::Detached));
                        }
                    }
                },
                size = self.io.resizes.next(), if self.resizes_open => match size {
                    None => self.resizes_open = false,
                    Some(size) => {
                        self.io.size = size;
                        if self.may_control() {
                            self.send_control(socket, &self.view()).await;
                        }
                    }
                },
                _ = heartbeat.tick(), if self.may_control() => self.send_control(socket, &self.view()).await,
                () = tokio::time::sleep_until(liveness.deadline()) => {
                    if !liveness.act(socket).await {
                        return Ok(self.lost(CLOSE_ABNORMAL, Some(NO_ANSWER)));
                    }
                }
            }
        }
    }

    async fn on_control<S>(&mut self, socket: &mut S, text: &[u8], reattaching: bool) -> Option<Ended>
    where
        S: Stream<Item = Result<Frame, WsProtocolError>> + Sink<Message, Error = WsProtocolError> + Unpin,
    {
        let control = match ServerMessage::parse(text) {
            Ok(control) => control,
            Err(e) => {
                // One malformed message is not worth losing the session over.
                tracing::debug!(error = %e, "tether_attach_bad_control_message");
                return None;
            }
        };
        if !self.access_known && !matches!(control, ServerMessage::Access { .. }) {
            self.on_access(socket, false, reattaching).await;
        }
        match control {
            ServerMessage::Access { read_only } => self.on_access(socket, read_only, reattaching).await,
            ServerMessage::Status { state, host } => {
                tracing::debug!(%state, %host, "tether_attach_status");
            }
            ServerMessage::Replay { cols, rows, offset } => {
                tracing::debug!(cols, rows, offset, "tether_attach_replay");
                self.position.on_replay();
            }
            ServerMessage::Live { offset } => {
                self.waiting_for_host = false;
                self.told_reconnecting = false;
                self.position.on_live(offset);
                self.send_held_input(socket).await;
            }
            ServerMessage::Resume { offset } => {
                self.waiting_for_host = false;
                self.told_reconnecting = false;
                if let Some(expected) = self.position.on_resume(offset) {
                    tracing::warn!(expected, offset, "tether_attach_resume_offset_mismatch");
                }
                self.send_held_input(socket).await;
            }
            ServerMessage::Size { cols, rows, yours } => {
                tracing::debug!(cols, rows, yours, "tether_attach_size");
            }
            ServerMessage::Exit { exit_code } => {
                close_gracefully(socket).await;
                return Some(Ended::Finished(AttachOutcome::Exited { code: exit_code }));
            }
            // A read-only refusal leaves the socket open (a server that
            // heard from us before `access` came may send one).
            ServerMessage::Error { message } if message.starts_with("read-only:") => {
                tracing::debug!(%message, "tether_attach_read_only_refusal");
            }
            // The socket stays open and the stream starts when the daemon
            // is back (docs/PROTOCOL.md, "Server -> client"); if it comes
            // back to another instance, a 4503 sends us there. Not a
            // failed attempt: a daemon's redial may take its whole back-off.
            ServerMessage::Error { message } if message == crate::viewer_protocol::HOST_OFFLINE => {
                if !self.waiting_for_host {
                    self.waiting_for_host = true;
                    self.notify(WAITING_FOR_HOST.as_bytes());
                }
            }
            ServerMessage::Error { message } => {
                close_gracefully(socket).await;
                return Some(Ended::Finished(AttachOutcome::Closed { code: CLOSE_NORMAL, reason: message }));
            }
            // Only an answer to `ping`, which attach does not send.
            ServerMessage::Pong => {}
            ServerMessage::Unknown => {
                tracing::debug!("tether_attach_unknown_control_message");
            }
        }
        None
    }

    async fn on_close<S>(&mut self, socket: &mut S, reason: Option<CloseReason>) -> Ended
    where
        S: Sink<Message, Error = WsProtocolError> + Unpin,
    {
        let code = reason.as_ref().map_or(CLOSE_NO_STATUS, |reason| u16::from(reason.code));
        let description = reason.as_ref().and_then(|r| r.description.clone());
        // RFC 6455 §5.5.1: answer a Close with a Close (echoing the code).
        send(socket, Message::Close(reason)).await;
        if should_reattach(code, description.as_deref()) {
            return self.lost(code, description.as_deref());
        }
        Ended::Finished(AttachOutcome::Closed { code, reason: describe_close(code, description.as_deref()) })
    }

    /// What this connection may do, once per connection. A full viewer
    /// sends its `view`, on a fresh attach its `resize` claim (the user just
    /// chose this terminal; a reattach is an arrival like any other, so a
    /// viewer that took the grid while we were away keeps it), and the keys
    /// typed meanwhile. A read-only one says so and sends nothing.
    async fn on_access<S>(&mut self, socket: &mut S, read_only: bool, reattaching: bool)
    where
        S: Sink<Message, Error = WsProtocolError> + Unpin,
    {
        if self.access_known {
            return;
        }
        self.access_known = true;
        self.read_only = read_only;
        if read_only {
            self.held_input.clear();
            self.dropped_input = 0;
            if !self.titled {
                self.titled = true;
                self.notify(format!("\r\n{READ_ONLY_BANNER}\r\n").as_bytes());
                self.notify(READ_ONLY_TITLE);
            }
            return;
        }
        self.send_control(socket, &self.view()).await;
        if !reattaching {
            let claim = ClientMessage::resize(self.io.size.0, self.io.size.1);
            self.send_control(socket, &claim).await;
        }
    }

    /// Keys typed go out only while the stream is live: before it, or
    /// while the host is offline, the server would refuse them.
    fn streaming(&self) -> bool {
        self.position.is_live() && !self.waiting_for_host
    }

    /// The stream is live: what was typed while it was not goes out now,
    /// and the user hears of what did not fit.
    async fn send_held_input<S>(&mut self, socket: &mut S)
    where
        S: Sink<Message, Error = WsProtocolError> + Unpin,
    {
        if self.read_only {
            return;
        }
        if !self.held_input.is_empty() {
            let held = self.held_input.split().freeze();
            send(socket, Message::Binary(held)).await;
        }
        if self.dropped_input > 0 {
            let dropped = std::mem::take(&mut self.dropped_input);
            self.notify(format!("\r\n[{dropped} bytes typed while disconnected were not sent]\r\n").as_bytes());
        }
    }

    /// Whether `view` messages may go out on this connection now.
    fn may_control(&self) -> bool {
        self.access_known && !self.read_only
    }

    /// Writes a note of our own to the user's screen: not terminal output,
    /// so the stream position does not move. A failed write shows up on the
    /// next output anyway.
    fn notify(&mut self, bytes: &[u8]) {
        let _ = self.io.output.write_all(bytes).and_then(|()| self.io.output.flush());
    }

    fn lost(&self, code: u16, description: Option<&str>) -> Ended {
        Ended::Lost {
            went_live: self.position.is_live(),
            if_giving_up: Ok(AttachOutcome::Closed { code, reason: describe_close(code, description) }),
        }
    }

    /// Terminal bytes go to the user's screen at once and in order.
    fn show(&mut self, bytes: &[u8]) -> Result<(), AttachError> {
        self.io.output.write_all(bytes).and_then(|()| self.io.output.flush()).map_err(AttachError::Output)?;
        self.position.on_output(bytes.len());
        Ok(())
    }

    fn take_keystrokes(&mut self, chunk: Bytes) -> (Bytes, bool) {
        self.last_keystroke = Instant::now();
        split_at_detach_key(chunk, self.opts.detach_key)
    }

    fn hold_input(&mut self, keys: &[u8]) {
        if self.dropped_input == 0 && self.held_input.len() + keys.len() <= MAX_HELD_INPUT {
            self.held_input.extend_from_slice(keys);
            return;
        }
        if self.dropped_input == 0 {
            self.notify(DROPPING_INPUT.as_bytes());
        }
        self.dropped_input += keys.len();
    }

    /// A CLI viewer is always open and visible: it is the user's terminal.
    fn view(&self) -> ClientMessage {
        let idle = self.last_keystroke.elapsed().as_millis();
        ClientMessage::view(self.io.size.0, self.io.size.1, true, u64::try_from(idle).unwrap_or(u64::MAX), true)
    }

    async fn send_control<S>(&self, socket: &mut S, control: &ClientMessage)
    where
        S: Sink<Message, Error = WsProtocolError> + Unpin,
    {
        send(socket, Message::Text(control.to_json().into())).await;
    }
}

/// Sends one message. A failed write means the socket is going away; the
/// read half then reports how it ended, so there is a single place deciding
/// whether to reattach, and the failure is only logged here.
async fn send<S>(socket: &mut S, message: Message)
where
    S: Sink<Message, Error = WsProtocolError> + Unpin,
{
    if let Err(e) = socket.send(message).await {
        tracing::debug!(error = %e, "tether_attach_send_failed");
    }
}

/// Closes with 1000 and waits briefly for the server's Close, so the server
/// sees a clean close rather than a reset. Frames arriving meanwhile are not
/// shown: the session is already over.
async fn close_gracefully<S>(socket: &mut S)
where
    S: Stream<Item = Result<Frame, WsProtocolError>> + Sink<Message, Error = WsProtocolError> + Unpin,
{
    send(socket, Message::Close(Some(CloseReason::from(CloseCode::Normal)))).await;
    let drain = async {
        while let Some(Ok(frame)) = socket.next().await {
            if matches!(frame, Frame::Close(_)) {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(CLOSE_WAIT, drain).await;
}

/// Splits off everything from the detach key on: the bytes before it are
/// still input, the key itself and what follows are not sent.
fn split_at_detach_key(chunk: Bytes, detach_key: u8) -> (Bytes, bool) {
    match chunk.iter().position(|&b| b == detach_key) {
        Some(at) => (chunk.slice(..at), true),
        None => (chunk, false),
    }
}

fn give_up(if_giving_up: Result<AttachOutcome, AttachError>, attempts: u32) -> Result<AttachOutcome, AttachError> {
    match if_giving_up {
        Ok(AttachOutcome::Closed { code, reason }) => Ok(AttachOutcome::Closed {
            code,
            reason: format!("{reason}; gave up reattaching after {attempts} attempts"),
        }),
        Ok(outcome) => Ok(outcome),
        Err(last) => Err(AttachError::ReattachFailed { attempts, last: Box::new(last) }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detach_key_ends_input_at_its_position() {
        let (keys, detach) = split_at_detach_key(Bytes::from_static(b"ls\r"), 0x1d);
        assert_eq!((&keys[..], detach), (&b"ls\r"[..], false));
        let (keys, detach) = split_at_detach_key(Bytes::from_static(b"ab\x1dcd"), 0x1d);
        assert_eq!((&keys[..], detach), (&b"ab"[..], true));
        let (keys, detach) = split_at_detach_key(Bytes::from_static(b"\x1d"), 0x1d);
        assert_eq!((&keys[..], detach), (&b""[..], true));
        let (keys, detach) = split_at_detach_key(Bytes::from_static(b"q\x1d"), b'q');
        assert_eq!((&keys[..], detach), (&b""[..], true));
    }

    #[test]
    fn input_held_while_disconnected_is_never_cut_and_a_drop_is_told() {
        let io = LocalIo {
            input: futures_util::stream::empty::<Bytes>(),
            size: (80, 24),
            resizes: futures_util::stream::empty::<(u16, u16)>(),
            output: Vec::new(),
        };
        let opts = AttachOptions::new("http://127.0.0.1:1", "tth_x", "t");
        let client = Client::new("http://127.0.0.1:1", "tth_x", None).expect("client");
        let mut session = Session::new(opts, io, client);
        let line = vec![b'x'; 60 * 1024];
        session.hold_input(&line);
        session.hold_input(&[b'y'; 8 * 1024]); // does not fit: dropped whole
        session.hold_input(b"z"); // would fit, but comes after a drop
        assert_eq!(session.held_input.len(), line.len(), "the hold keeps what fitted, whole");
        assert_eq!(session.dropped_input, 8 * 1024 + 1);
        let shown = String::from_utf8_lossy(&session.io.output).into_owned();
        assert_eq!(shown, DROPPING_INPUT, "said once, at the first drop");
    }

    #[test]
    fn giving_up_says_so() {
        let closed =
            give_up(Ok(AttachOutcome::Closed { code: 4503, reason: "host disconnected or moved".into() }), 5).unwrap();
        assert_eq!(
            closed,
            AttachOutcome::Closed {
                code: 4503,
                reason: "host disconnected or moved; gave up reattaching after 5 attempts".into()
            }
        );
        let err = give_up(Err(AttachError::Rejected { status: 502 }), 5).unwrap_err();
        assert!(matches!(err, AttachError::ReattachFailed { attempts: 5, .. }), "{err}");
    }
}
