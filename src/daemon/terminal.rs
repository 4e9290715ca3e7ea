//! One task per terminal: the single owner of its output stream.
//!
//! The task reads the PTY output channel, puts every chunk in the ring
//! buffer and (while attached) cuts Output frames from the ring; then it
//! queues the chunk for the screen model, which parses on its own thread
//! ([`super::screen_worker`]) so forwarding never waits for it. Reads that
//! are already waiting are taken together, so a busy terminal sends fewer,
//! larger frames while a lone keystroke echo goes out at once. Because the
//! offset, the Output cursor and the order of the screen's queue are only
//! touched here, one chunk at a time, a Scrollback taken between two chunks
//! is the screen at exactly its offset, and Output continues from that
//! offset with no gap and no duplicate. An incomplete escape sequence at
//! the end of a read is held back until it completes, so that offset never
//! falls inside a sequence.
//!
//! Ordering rule: before any control frame the task emits for the stream
//! (Scrollback, Size, and the final Snapshot), it flushes the Output that
//! precedes it, so on the wire every frame sits at its place in the stream.
//!
//! Backpressure: while attached, unsent bytes wait in the ring. The task
//! stops taking chunks from the reader when one more chunk could evict
//! unsent bytes; the reader task then waits and so does the child.
//!
//! Flow control (docs/PROTOCOL.md, "Flow control"): when the server gives
//! the Attach a window, Output is sent only up to the limit that window and
//! later Credit frames set. A terminal whose window is spent keeps its bytes
//! in the ring and then stops reading its PTY, while every other terminal
//! of the connection streams on. Flushes that must precede a control frame
//! (a new Scrollback, a Size, the final frames) ignore the limit: they are
//! bounded by the ring, and the order of the stream comes first.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};
use tracing::Instrument;

use super::connection::{Outbound, Outbox};
use super::escape_boundary;
use super::pty::{self, ChildExit};
use super::ring::OutputRing;
use super::screen::GridSize;
use super::screen_worker::ScreenWorker;
use crate::proto::v1::{daemon_frame::Frame, Exit, Output, Scrollback, Size, Snapshot, Usage};

/// Recent output kept per terminal (docs/ARCHITECTURE.md, "Where state lives").
const RING_BYTES: usize = 512 * 1024;
/// Largest Output payload: keeps every frame far below the 1 MiB limit
/// while letting a busy terminal coalesce many small PTY reads.
const MAX_OUTPUT_CHUNK: usize = 64 * 1024;
/// The most one chunk can add to the ring: itself plus a held-back tail.
const MAX_EMIT: usize = pty::MAX_CHUNK + escape_boundary::WINDOW;
/// After the child is reaped, how long to wait for more output before
/// giving up on EOF (a background process may hold the PTY open forever).
const DRAIN_GRACE: Duration = Duration::from_secs(2);

/// What the daemon core asks of a terminal task. Commands come from server
/// frames (processed one at a time), so the channel holds a handful at most.
pub enum TerminalCommand {
    /// Start (or restart, for a new viewer) the stream on `out`: answer
    /// with a Scrollback, then Output from its offset on. With
    /// `resume_from`, the Scrollback carries the raw bytes since that offset
    /// instead of a screen snapshot when the ring still holds them (or, with
    /// the flag set, since the oldest byte it holds, when that is later). With
    /// `window`, Output goes at most `window` bytes past the live offset
    /// until a Credit moves the limit.
    Attach { attach_id: String, resume_from: Option<(u64, bool)>, window: Option<u64>, out: Outbox },
    /// Stop sending Output.
    Detach,
    /// The server may now take Output up to this stream offset.
    Credit { until: u64 },
    /// The PTY was resized: resize the screen model and report Size on `out`.
    Resize { size: GridSize, out: Outbox },
}

/// The core's side of a terminal task.
pub struct TerminalHandle {
    pub commands: mpsc::UnboundedSender<TerminalCommand>,
    /// Bytes emitted so far, for Hello's `next_offset`.
    pub next_offset: Rc<Cell<u64>>,
}

/// Snapshot, Exit and Usage of a finished terminal: sent together, in that
/// order, and re-sent after a reconnect until the writer confirms them.
#[derive(Debug, Clone)]
pub struct FinalFrames {
    pub terminal_id: String,
    pub snapshot: Snapshot,
    pub exit: Exit,
    pub usage: Usage,
    /// The ring as the terminal ended: it answers a resuming Attach until
    /// the server confirms these frames (docs/PROTOCOL.md, "Terminals that
    /// ended while disconnected").
    pub output: Arc<OutputRing>,
}

impl FinalFrames {
    pub fn into_frames(self) -> [Frame; 3] {
        [Frame::Snapshot(self.snapshot), Frame::Exit(self.exit), Frame::Usage(self.usage)]
    }
}

/// Where the child's output and end come from.
pub struct ChildStreams {
    pub pid: u32,
    pub output: mpsc::Receiver<Bytes>,
    pub exit: oneshot::Receiver<ChildExit>,
    pub started_at: Instant,
}

/// Spawns the task on the current local task set, with `screen` (started
/// at the PTY's size) as its model. `finished` receives the final frames
/// once all output has been read and the child reaped.
pub fn start(
    terminal_id: String,
    screen: ScreenWorker,
    child: ChildStreams,
    finished: mpsc::UnboundedSender<FinalFrames>,
) -> TerminalHandle {
    let (commands_tx, commands) = mpsc::unbounded_channel();
    let next_offset = Rc::new(Cell::new(0));
    let task = TerminalTask {
        terminal_id,
        screen,
        ring: OutputRing::with_capacity(RING_BYTES),
        attached: None,
        next_offset: Rc::clone(&next_offset),
        held_back: Vec::new(),
    };
    let span = tracing::info_span!("terminal", terminal_id = %task.terminal_id);
    tokio::task::spawn_local(task.run(child, commands, finished).instrument(span));
    TerminalHandle { commands: commands_tx, next_offset }
}

struct Attachment {
    out: Outbox,
    /// Offset of the first byte not yet handed to `out`.
    sent: u64,
    /// Output may go up to (not including) this offset; `None` when the
    /// server asked for no flow control.
    allowed_until: Option<u64>,
}

impl Attachment {
    /// Bytes the window still allows to be sent.
    fn window_left(&self) -> u64 {
        self.allowed_until.map_or(u64::MAX, |until| until.saturating_sub(self.sent))
    }
}

struct TerminalTask {
    terminal_id: String,
    screen: ScreenWorker,
    ring: OutputRing,
    attached: Option<Attachment>,
    next_offset: Rc<Cell<u64>>,
    /// An incomplete sequence at the end of the last chunk, not yet emitted.
    held_back: Vec<u8>,
}

impl TerminalTask {
    async fn run(
        mut self,
        child: ChildStreams,
        mut commands: mpsc::UnboundedReceiver<TerminalCommand>,
        finished: mpsc::UnboundedSender<FinalFrames>,
    ) {
        let ChildStreams { pid, mut output, mut exit, started_at } = child;
        let mut output_open = true;
        let mut commands_open = true;
        let mut child_exit: Option<ChildExit> = None;
        let drain_deadline = tokio::time::sleep(DRAIN_GRACE);
        tokio::pin!(drain_deadline);

        while output_open || child_exit.is_none() {
            let may_read = output_open && self.has_room();
            let sendable = self.sendable_bytes() > 0;
            let permit = self.reserve_output_slot(sendable);
            tokio::select! {
                // Commands first: a Detach should not wait behind a backlog.
                biased;
                command = commands.recv(), if commands_open => match command {
                    Some(command) => self.on_command(command).await,
                    None => {
                        // The daemon is gone: hang up like a closing terminal
                        // emulator would, and keep going until the child ends.
                        commands_open = false;
                        let _ = pty::send_signal(pid, libc::SIGHUP);
                    }
                },
                permit = permit, if sendable => match permit {
                    Some(permit) => self.send_output_chunk(permit, true),
                    None => self.attached = None,
                },
                chunk = output.recv(), if may_read => match chunk {
                    Some(chunk) => {
                        // Reads already waiting join this one's frame, up to
                        // a frame's worth; this never waits for more, so an
                        // echo is not delayed.
                        let mut taken = chunk.len();
                        self.on_output(chunk).await;
                        while taken < MAX_OUTPUT_CHUNK && self.has_room() {
                            let Ok(chunk) = output.try_recv() else { break };
                            taken += chunk.len();
                            self.on_output(chunk).await;
                        }
                        if child_exit.is_some() {
                            drain_deadline.as_mut().reset(tokio::time::Instant::now() + DRAIN_GRACE);
                        }
                    }
                    None => {
                        self.on_output_end().await;
                        output_open = false;
                    }
                },
                status = &mut exit, if child_exit.is_none() => {
                    child_exit = Some(status.unwrap_or_else(|_| unknown_exit()));
                    drain_deadline.as_mut().reset(tokio::time::Instant::now() + DRAIN_GRACE);
                },
                () = &mut drain_deadline, if child_exit.is_some() && may_read => {
                    tracing::warn!(terminal_id = %self.terminal_id, "tether_daemon_output_left_open");
                    self.on_output_end().await;
                    output_open = false;
                },
            }
        }

        self.flush().await;
        let child_exit = child_exit.unwrap_or_else(unknown_exit);
        let _ = finished.send(self.final_frames(child_exit, started_at).await);
    }

    /// Whether one more chunk plus a held-back tail fits without evicting
    /// bytes the connection has not taken yet.
    fn has_room(&self) -> bool {
        self.pending_bytes().saturating_add(MAX_EMIT) <= self.ring.capacity()
    }

    /// Bytes read but not yet handed to the attached connection.
    fn pending_bytes(&self) -> usize {
        self.attached
            .as_ref()
            .map_or(0, |attachment| usize::try_from(self.ring.end_offset() - attachment.sent).unwrap_or(usize::MAX))
    }

    /// Bytes the attached connection may take now: pending, within the window.
    fn sendable_bytes(&self) -> usize {
        let window = self.attached.as_ref().map_or(0, Attachment::window_left);
        self.pending_bytes().min(usize::try_from(window).unwrap_or(usize::MAX))
    }

    /// A slot in the attached connection's queue, when there is output to
    /// send; `None` when that connection is gone. Owned, so the select above
    /// can mutate `self` in its handlers.
    fn reserve_output_slot(
        &self,
        wanted: bool,
    ) -> impl std::future::Future<Output = Option<mpsc::OwnedPermit<Outbound>>> + 'static {
        let out = self.attached.as_ref().filter(|_| wanted).map(|attachment| attachment.out.clone());
        async move {
            match out {
                Some(out) => out.reserve_owned().await.ok(),
                None => std::future::pending().await,
            }
        }
    }

    /// Takes a chunk into the stream, holding back an incomplete trailing
    /// escape sequence or character until the rest arrives (see
    /// `escape_boundary`), so snapshots are always taken on a boundary.
    async fn on_output(&mut self, chunk: Bytes) {
        let data = if self.held_back.is_empty() {
            chunk
        } else {
            Bytes::from([std::mem::take(&mut self.held_back).as_slice(), &chunk].concat())
        };
        let complete = escape_boundary::complete_prefix_len(&data);
        self.held_back = data[complete..].to_vec();
        self.emit(data.slice(..complete)).await;
    }

    /// The output ended: whatever was held back is all there will be.
    async fn on_output_end(&mut self) {
        let tail = std::mem::take(&mut self.held_back);
        self.emit(Bytes::from(tail)).await;
    }

    /// Puts a chunk in the stream: the ring (from which it is forwarded)
    /// first, then the screen model's queue.
    async fn emit(&mut self, data: Bytes) {
        if data.is_empty() {
            return;
        }
        self.ring.push(data.clone());
        self.next_offset.set(self.ring.end_offset());
        self.screen.feed(data).await;
    }

    async fn on_command(&mut self, command: TerminalCommand) {
        match command {
            TerminalCommand::Attach { attach_id, resume_from, window, out } => {
                // Viewers already on this connection must get everything up
                // to the new snapshot's offset before it.
                if self.attached.as_ref().is_some_and(|current| current.out.same_channel(&out)) {
                    self.flush().await;
                }
                let offset = self.ring.end_offset();
                let size = self.screen.size();
                let resumed = resume_from.and_then(|(from, from_oldest)| {
                    let from = if from_oldest { from.max(self.ring.start_offset()) } else { from };
                    Some((from, self.ring.bytes_since(from, usize::MAX)?))
                });
                let (data, from, resumed) = match resumed {
                    Some((from, raw)) => (raw, from, true),
                    None => (self.screen.snapshot().await, offset, false),
                };
                let scrollback = Scrollback {
                    terminal_id: self.terminal_id.clone(),
                    attach_id,
                    data,
                    cols: u32::from(size.cols()),
                    rows: u32::from(size.rows()),
                    offset: from,
                    resumed,
                };
                self.attached = match out.send(Outbound::Frame(Frame::Scrollback(scrollback))).await {
                    Ok(()) => Some(Attachment {
                        out,
                        sent: offset,
                        allowed_until: window.map(|window| offset.saturating_add(window)),
                    }),
                    Err(_) => None,
                };
            }
            TerminalCommand::Detach => self.attached = None,
            TerminalCommand::Credit { until } => {
                if let Some(allowed) = self.attached.as_mut().and_then(|a| a.allowed_until.as_mut()) {
                    *allowed = (*allowed).max(until);
                }
            }
            TerminalCommand::Resize { size, out } => {
                if self.attached.as_ref().is_some_and(|current| current.out.same_channel(&out)) {
                    self.flush().await;
                }
                self.screen.resize(size).await;
                let frame = Frame::Size(Size {
                    terminal_id: self.terminal_id.clone(),
                    cols: u32::from(size.cols()),
                    rows: u32::from(size.rows()),
                });
                let _ = out.send(Outbound::Frame(frame)).await;
            }
        }
    }

    /// Sends the next Output frame; `within_window` keeps it inside the
    /// flow-control limit.
    fn send_output_chunk(&mut self, permit: mpsc::OwnedPermit<Outbound>, within_window: bool) {
        if let Some(frame) = self.next_output_frame(within_window) {
            permit.send(Outbound::Frame(frame));
        }
    }

    /// Hands every pending byte to the attached connection, past the window
    /// if need be (a control frame must find the stream complete before it).
    async fn flush(&mut self) {
        while self.pending_bytes() > 0 {
            let Some(out) = self.attached.as_ref().map(|attachment| attachment.out.clone()) else {
                return;
            };
            let Ok(permit) = out.reserve_owned().await else {
                self.attached = None;
                return;
            };
            self.send_output_chunk(permit, false);
        }
    }

    /// The next Output frame for the attachment, advancing its cursor.
    fn next_output_frame(&mut self, within_window: bool) -> Option<Frame> {
        let attachment = self.attached.as_mut()?;
        let mut limit = MAX_OUTPUT_CHUNK;
        if within_window {
            limit = limit.min(usize::try_from(attachment.window_left()).unwrap_or(usize::MAX));
        }
        if limit == 0 {
            return None;
        }
        match self.ring.bytes_since(attachment.sent, limit) {
            Some(data) if !data.is_empty() => {
                let offset = attachment.sent;
                attachment.sent += data.len() as u64;
                Some(Frame::Output(Output { terminal_id: self.terminal_id.clone(), offset, data }))
            }
            Some(_) => None,
            None => {
                // The read throttle keeps unsent bytes in the ring, so this
                // means a bug; stop streaming rather than send a gap.
                tracing::error!(
                    terminal_id = %self.terminal_id,
                    offset = attachment.sent,
                    "tether_daemon_output_gap"
                );
                self.attached = None;
                None
            }
        }
    }

    async fn final_frames(&mut self, child_exit: ChildExit, started_at: Instant) -> FinalFrames {
        let size = self.screen.size();
        let terminal_id = self.terminal_id.clone();
        let wall = child_exit.ended_at.saturating_duration_since(started_at);
        FinalFrames {
            snapshot: Snapshot {
                terminal_id: terminal_id.clone(),
                data: self.screen.snapshot().await,
                cols: u32::from(size.cols()),
                rows: u32::from(size.rows()),
            },
            exit: Exit { terminal_id: terminal_id.clone(), exit_code: child_exit.exit_code, signal: child_exit.signal },
            usage: Usage {
                terminal_id: terminal_id.clone(),
                cpu_ms: child_exit.cpu_ms,
                max_rss_kb: child_exit.max_rss_kb,
                output_bytes: self.ring.end_offset(),
                wall_ms: u64::try_from(wall.as_millis()).unwrap_or(u64::MAX),
            },
            terminal_id,
            output: Arc::new(std::mem::replace(&mut self.ring, OutputRing::with_capacity(0))),
        }
    }
}

/// The waiter thread vanished without a status (it cannot panic in
/// practice); report an end with no code rather than never ending.
fn unknown_exit() -> ChildExit {
    ChildExit { exit_code: None, signal: None, cpu_ms: 0, max_rss_kb: 0, ended_at: Instant::now() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn test_screen() -> ScreenWorker {
        ScreenWorker::start("screen-test".to_owned(), GridSize::clamped(80, 24)).expect("screen thread")
    }

    fn exit_status() -> ChildExit {
        ChildExit { exit_code: Some(0), signal: None, cpu_ms: 1, max_rss_kb: 2, ended_at: Instant::now() }
    }

    /// A connection that is not read stops the reading of the PTY at a
    /// bounded backlog, and once it drains every byte arrives, in order.
    #[tokio::test(flavor = "current_thread")]
    async fn a_stalled_connection_pauses_reading_and_loses_nothing() {
        let local = tokio::task::LocalSet::new();
        local
            .run_until(async {
                let (output_tx, output) = mpsc::channel(4);
                let (exit_tx, exit) = oneshot::channel();
                let (finished_tx, mut finished) = mpsc::unbounded_channel();
                // pid 0 is never signalled (send_signal refuses it).
                let child = ChildStreams { pid: 0, output, exit, started_at: Instant::now() };
                let handle = start("t".to_owned(), test_screen(), child, finished_tx);
                let (out, mut wire) = mpsc::channel(2);
                let attach =
                    TerminalCommand::Attach { attach_id: "a".to_owned(), resume_from: None, window: None, out };
                assert!(handle.commands.send(attach).is_ok());

                let mut fed = 0u64;
                let mut counter = 0u8;
                loop {
                    // Distinct bytes per chunk, so a reordering would show.
                    counter = counter.wrapping_add(1);
                    let chunk = Bytes::from(vec![counter; pty::READ_CHUNK]);
                    let sent = tokio::time::timeout(Duration::from_millis(200), output_tx.send(chunk)).await;
                    match sent {
                        Ok(Ok(())) => fed += pty::READ_CHUNK as u64,
                        _ => break,
                    }
                    assert!(fed < 4 * RING_BYTES as u64, "the reader was never paused");
                }
                // Ring + queued frames + the reader channel, nothing more.
                let bound = RING_BYTES + 2 * MAX_OUTPUT_CHUNK + 4 * pty::READ_CHUNK;
                assert!(fed <= bound as u64, "{fed} bytes taken with nobody reading");

                let mut expected_offset = match wire.recv().await {
                    Some(Outbound::Frame(Frame::Scrollback(scrollback))) => scrollback.offset,
                    _ => panic!("the attach was not answered with a Scrollback"),
                };
                assert_eq!(expected_offset, 0);
                let mut received = Vec::new();
                while expected_offset < fed {
                    match wire.recv().await {
                        Some(Outbound::Frame(Frame::Output(output))) => {
                            assert_eq!(output.offset, expected_offset);
                            expected_offset += output.data.len() as u64;
                            received.extend_from_slice(&output.data);
                        }
                        _ => panic!("expected Output"),
                    }
                }
                assert_eq!(expected_offset, fed);
                let chunks: Vec<u8> = received.chunks(pty::READ_CHUNK).map(|chunk| chunk[0]).collect();
                let in_order: Vec<u8> = (1..=chunks.len()).map(|n| n as u8).collect();
                assert_eq!(chunks, in_order);

                assert!(exit_tx.send(exit_status()).is_ok());
                drop(output_tx);
                let final_frames = finished.recv().await.expect("final frames");
                assert_eq!(final_frames.usage.output_bytes, fed);
                assert_eq!(final_frames.exit.exit_code, Some(0));
            })
            .await;
    }

    /// A Scrollback taken while a sequence is half read sits before it, and
    /// the Output that follows carries the whole sequence.
    #[tokio::test(flavor = "current_thread")]
    async fn snapshots_never_split_an_escape_sequence() {
        let local = tokio::task::LocalSet::new();
        local
            .run_until(async {
                let (output_tx, output) = mpsc::channel(4);
                let (_exit_tx, exit) = oneshot::channel();
                let (finished_tx, _finished) = mpsc::unbounded_channel();
                let child = ChildStreams { pid: 0, output, exit, started_at: Instant::now() };
                let handle = start("t".to_owned(), test_screen(), child, finished_tx);
                assert!(output_tx.send(Bytes::from_static(b"plain \x1b[3")).await.is_ok());
                tokio::task::yield_now().await;

                let (out, mut wire) = mpsc::channel(8);
                let attach =
                    TerminalCommand::Attach { attach_id: "a".to_owned(), resume_from: None, window: None, out };
                assert!(handle.commands.send(attach).is_ok());
                let offset = match wire.recv().await {
                    Some(Outbound::Frame(Frame::Scrollback(scrollback))) => scrollback.offset,
                    _ => panic!("expected Scrollback"),
                };
                assert_eq!(offset, 6, "the snapshot must sit before the partial sequence");
                assert_eq!(handle.next_offset.get(), 6);

                assert!(output_tx.send(Bytes::from_static(b"1mred")).await.is_ok());
                match wire.recv().await {
                    Some(Outbound::Frame(Frame::Output(output))) => {
                        assert_eq!(output.offset, 6);
                        assert_eq!(&output.data[..], b"\x1b[31mred");
                    }
                    _ => panic!("expected Output"),
                }
            })
            .await;
    }

    /// Output of a child that already exited is read to the end before the
    /// final frames, so the last bytes are in the final screen.
    #[tokio::test(flavor = "current_thread")]
    async fn final_frames_wait_for_the_last_output() {
        let local = tokio::task::LocalSet::new();
        local
            .run_until(async {
                let (output_tx, output) = mpsc::channel(4);
                let (exit_tx, exit) = oneshot::channel();
                let (finished_tx, mut finished) = mpsc::unbounded_channel();
                let child = ChildStreams { pid: 0, output, exit, started_at: Instant::now() };
                let _handle = start("t".to_owned(), test_screen(), child, finished_tx);

                assert!(exit_tx.send(exit_status()).is_ok());
                tokio::time::sleep(Duration::from_millis(50)).await;
                assert!(finished.try_recv().is_err(), "finished before the output ended");
                assert!(output_tx.send(Bytes::from_static(b"last words")).await.is_ok());
                drop(output_tx);
                let final_frames = finished.recv().await.expect("final frames");
                assert!(String::from_utf8_lossy(&final_frames.snapshot.data).contains("last words"));
                assert_eq!(final_frames.usage.output_bytes, 10);
            })
            .await;
    }
}
