//! The daemon core: the terminals this process hosts and the handling of
//! server frames, one connection at a time.
//!
//! Frames from the server are handled strictly in order, one after the
//! other (a handler may wait for room in the outbound queue, which is how a
//! slow server slows down its own requests). Terminals outlive connections:
//! each connection starts with no attachments, and the final frames of
//! terminals (Snapshot, Exit, Usage) stay here until a Pong confirms the
//! server has them (see `ping_ledger`), being re-sent after each HelloAck.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use portable_pty::MasterPty;
use tokio::sync::mpsc;

use super::connection::{Connection, Inbound, Outbound, Outbox, ServerClose};
use super::dirs::{DirAllowlist, DirError};
use super::limits::HostLimits;
use super::ping_ledger::PingLedger;
use super::pty;
use super::screen::GridSize;
use super::screen_worker::ScreenWorker;
use super::state::StateDir;
use super::stop::{self, Stop};
use super::terminal::{self, ChildStreams, FinalFrames, TerminalCommand, TerminalHandle};
use crate::proto::v1::{
    daemon_frame::Frame, server_frame::Frame as In, Attach, AttachError, Booking, Capabilities, CredentialsResult,
    Dirs, DirsOp, DirsResult, Hello, InputTaken, LimitsResult, Ping, Scrollback, ServerFrame, Spawn, SpawnError,
    Started, TerminalReport,
};

/// How often the daemon pings (docs/PROTOCOL.md, "Connection lifecycle").
const PING_INTERVAL: Duration = Duration::from_secs(30);
/// How long after a Ping the daemon waits to hear anything at all (the
/// Pong, or any other frame) before it takes the socket for dead and
/// redials: a frozen instance, or a path that silently stopped, is left
/// within a ping interval and this. Longer than a server's slowest answer
/// (a frame's database write waits at most `database.call_timeout_ms`,
/// 10 s, before it is kept for later and the next frame is read).
const PING_ANSWER_PATIENCE: Duration = Duration::from_secs(20);
/// How long to wait for HelloAck before trying another connection.
const HELLO_ACK_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the final frames of a terminal a HelloAck lists in
/// `resume_ended` wait for the server's resuming Attach before they are
/// sent anyway (docs/PROTOCOL.md, "Terminals that ended while
/// disconnected").
const RESUME_ENDED_PATIENCE: Duration = Duration::from_secs(10);
/// How long the core waits for room in the outbound queue before giving the
/// connection up: a half-open TCP connection blocks writes for many minutes
/// without an error, and while the core waits it cannot run the ping check.
const QUEUE_STALL_LIMIT: Duration = Duration::from_secs(75);

/// How a connection ended.
#[derive(Debug)]
pub enum SessionEnd {
    /// The server closed it, with this close code and reason if any.
    Closed(ServerClose),
    /// The socket failed, went silent, or never acknowledged the hello.
    Lost(String),
    /// The daemon was asked to stop: its terminals were ended, and their
    /// endings reported if the connection was established.
    Stopped,
}

impl std::fmt::Display for SessionEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SessionEnd::Closed(ServerClose { code: None, .. }) => f.write_str("closed by the server without a code"),
            SessionEnd::Closed(ServerClose { code: Some(code), reason }) => {
                write!(f, "closed by the server with code {code}")?;
                match reason.as_deref().filter(|reason| !reason.is_empty()) {
                    Some(reason) => write!(f, " ({reason})"),
                    None => Ok(()),
                }
            }
            SessionEnd::Lost(reason) => write!(f, "connection lost: {reason}"),
            SessionEnd::Stopped => f.write_str("the daemon stopped"),
        }
    }
}

/// What the reconnect loop needs to know about a finished connection.
#[derive(Debug)]
pub struct SessionOutcome {
    /// HelloAck arrived.
    pub established: bool,
    pub lived: Duration,
    pub end: SessionEnd,
}

struct TerminalEntry {
    pid: u32,
    master: Box<dyn MasterPty + Send>,
    size: GridSize,
    input: super::pty::InputQueue,
    handle: TerminalHandle,
    /// Set once the terminal ended; the entry is dropped when the server
    /// confirmed these frames.
    final_frames: Option<FinalFrames>,
    /// The final frames wait for the server's resuming Attach, which takes
    /// the output the server lacks first (`HelloAck.resume_ended`).
    held: bool,
}

impl TerminalEntry {
    fn running(&self) -> bool {
        self.final_frames.is_none()
    }
}

/// Ends a connection with a close frame (1000) once the queue before it is
/// written, waiting at most a second for the writer.
async fn close(link: Link, mut writer: super::connection::WriterTask) {
    if link.out.send(Outbound::Close).await.is_ok() {
        drop(link);
        let _ = tokio::time::timeout(Duration::from_secs(1), writer.stopped()).await;
    }
}

/// The daemon's terminals, allowlist and state files.
pub struct Host {
    state: StateDir,
    dirs: DirAllowlist,
    /// `--lock-dirs`: the server may not change `dirs`.
    dirs_locked: bool,
    terminals: HashMap<String, TerminalEntry>,
    finished_tx: mpsc::UnboundedSender<FinalFrames>,
    finished_rx: mpsc::UnboundedReceiver<FinalFrames>,
    /// Terminals whose input queue has taken input to report (`InputTaken`).
    input_taken_tx: mpsc::UnboundedSender<String>,
    input_taken_rx: mpsc::UnboundedReceiver<String>,
    stop: Stop,
}

/// The core's side of a connection's outbound queue, with its Ping/Pong
/// bookkeeping.
struct Link {
    out: Outbox,
    ledger: PingLedger,
    /// The queue stayed full for QUEUE_STALL_LIMIT: the connection is dead.
    stalled: bool,
}

impl Link {
    /// Queues a frame; false when the connection is gone or stuck (the serve
    /// loop then ends it).
    async fn send(&mut self, frame: Frame) -> bool {
        if self.stalled {
            return false;
        }
        match tokio::time::timeout(QUEUE_STALL_LIMIT, self.out.send(Outbound::Frame(frame))).await {
            Ok(sent) => sent.is_ok(),
            Err(_) => {
                self.stalled = true;
                false
            }
        }
    }

    async fn ping(&mut self) {
        if self.send(Frame::Ping(Ping {})).await {
            self.ledger.ping_queued();
        }
    }

    /// Queues a finished terminal's frames and the Ping whose Pong confirms them.
    async fn send_final_frames(&mut self, final_frames: FinalFrames) {
        let terminal_id = final_frames.terminal_id.clone();
        for frame in final_frames.into_frames() {
            if !self.send(frame).await {
                return;
            }
        }
        self.ledger.final_frames_queued(terminal_id);
        self.ping().await;
    }
}

impl Host {
    pub fn new(state: StateDir, dirs: DirAllowlist, dirs_locked: bool, stop: Stop) -> Self {
        let (finished_tx, finished_rx) = mpsc::unbounded_channel();
        let (input_taken_tx, input_taken_rx) = mpsc::unbounded_channel();
        Self {
            state,
            dirs,
            dirs_locked,
            terminals: HashMap::new(),
            finished_tx,
            finished_rx,
            input_taken_tx,
            input_taken_rx,
            stop,
        }
    }

    /// Waits out a reconnect delay while still noting terminals that end;
    /// a stop ends the wait.
    pub async fn idle(&mut self, delay: Duration) {
        let deadline = tokio::time::sleep(delay);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                () = &mut deadline => return,
                () = self.stop.asked() => return,
                Some(final_frames) = self.finished_rx.recv() => self.on_finished(final_frames, None).await,
            }
        }
    }

    /// Ends every terminal with no connection to report to: SIGHUP, then
    /// SIGKILL for what is left after the grace, waiting for each to be
    /// reaped (the server learns of them at the next hello, if any).
    pub async fn stop_unconnected(&mut self) {
        self.signal_running(libc::SIGHUP);
        let mut killed = false;
        let timer = tokio::time::sleep(stop::HANGUP_GRACE);
        tokio::pin!(timer);
        while self.terminals.values().any(TerminalEntry::running) {
            tokio::select! {
                Some(final_frames) = self.finished_rx.recv() => self.on_finished(final_frames, None).await,
                () = &mut timer => {
                    if killed {
                        break;
                    }
                    killed = true;
                    self.signal_running(libc::SIGKILL);
                    timer.as_mut().reset(tokio::time::Instant::now() + stop::KILL_GRACE);
                }
            }
        }
        let left = self.terminals.values().filter(|entry| entry.running()).count();
        tracing::info!(terminals_left = left, "tether_daemon_stopped");
    }

    /// Sends `signal` to the process group of every running terminal.
    fn signal_running(&self, signal: i32) {
        for (terminal_id, entry) in self.terminals.iter().filter(|(_, entry)| entry.running()) {
            if let Err(error) = pty::send_signal(entry.pid, signal) {
                tracing::warn!(terminal_id, signal, %error, "tether_daemon_kill_failed");
            }
        }
    }

    /// Runs one connection: Hello, wait for HelloAck, then serve frames
    /// until the socket ends.
    pub async fn serve(&mut self, connection: Connection, host_id: &str, booking: Option<Booking>) -> SessionOutcome {
        let started = Instant::now();
        let Connection { mut inbound, out, mut writer } = connection;
        let outcome =
            |established: bool, end: SessionEnd| SessionOutcome { established, lived: started.elapsed(), end };

        // Terminals that ended since the last look must be reported as not running.
        while let Ok(final_frames) = self.finished_rx.try_recv() {
            self.on_finished(final_frames, None).await;
        }
        // This server counts only the input it sends (docs/PROTOCOL.md,
        // "Input flow control").
        while self.input_taken_rx.try_recv().is_ok() {}
        for entry in self.terminals.values() {
            entry.input.begin_connection();
        }
        let mut link = Link { out, ledger: PingLedger::default(), stalled: false };
        if !link.send(Frame::Hello(self.hello(host_id, booking))).await {
            return outcome(false, SessionEnd::Lost("writer stopped before hello".to_owned()));
        }

        let mut established = false;
        let hello_deadline = tokio::time::sleep(HELLO_ACK_TIMEOUT);
        tokio::pin!(hello_deadline);
        let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + PING_INTERVAL, PING_INTERVAL);
        ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The last Ping: when it went out, and when something must have
        // arrived after it.
        let mut answer_due: Option<(Instant, tokio::time::Instant)> = None;
        // A stop (`stop`): terminals hung up, then killed when the timer
        // first fires; the second time it fires the stop ends regardless.
        let mut stopping = false;
        let mut killed = false;
        let stop_timer = tokio::time::sleep(HELLO_ACK_TIMEOUT);
        tokio::pin!(stop_timer);
        let mut stop = self.stop.clone();
        // When final frames the HelloAck held stop waiting for their Attach.
        let mut held_until: Option<tokio::time::Instant> = None;

        loop {
            if link.stalled {
                return outcome(established, SessionEnd::Lost("outbound queue stalled".to_owned()));
            }
            if stopping && self.terminals.is_empty() {
                // Every ending is confirmed (Pong): nothing is left to say.
                close(link, writer).await;
                return outcome(established, SessionEnd::Stopped);
            }
            tokio::select! {
                inbound_item = inbound.next() => match inbound_item {
                    Inbound::Frame(ServerFrame { frame: Some(In::HelloAck(ack)) }) if !established => {
                        established = true;
                        tracing::info!(instance_id = %ack.instance_id, "tether_daemon_connected");
                        if self.send_pending_final_frames(&mut link, &ack.resume_ended).await {
                            held_until = Some(tokio::time::Instant::now() + RESUME_ENDED_PATIENCE);
                        }
                    }
                    Inbound::Frame(ServerFrame { frame: Some(In::Pong(_)) }) => {
                        for terminal_id in link.ledger.pong_received() {
                            self.forget(&terminal_id);
                        }
                    }
                    Inbound::Frame(frame) => self.on_frame(frame.frame, &mut link).await,
                    Inbound::Closed(close) => return outcome(established, SessionEnd::Closed(close)),
                    Inbound::Lost(reason) => return outcome(established, SessionEnd::Lost(reason)),
                },
                Some(final_frames) = self.finished_rx.recv() => {
                    self.on_finished(final_frames, established.then_some(&mut link)).await;
                }
                Some(terminal_id) = self.input_taken_rx.recv() => {
                    let bytes = self.terminals.get(&terminal_id).map_or(0, |entry| entry.input.take_unreported());
                    if bytes > 0 && established {
                        link.send(Frame::InputTaken(InputTaken { terminal_id, bytes })).await;
                    }
                }
                _ = ping.tick() => {
                    let pinged_at = Instant::now();
                    link.ping().await;
                    answer_due = Some((pinged_at, tokio::time::Instant::now() + PING_ANSWER_PATIENCE));
                }
                () = tokio::time::sleep_until(answer_due.map_or_else(tokio::time::Instant::now, |(_, due)| due)),
                    if answer_due.is_some() => {
                    // Heard since the Ping, however long before the due time
                    // (a Pong comes within a millisecond on a fast link).
                    if answer_due.is_some_and(|(pinged_at, _)| !inbound.heard_since(pinged_at)) {
                        return outcome(established, SessionEnd::Lost("no answer to a ping".to_owned()));
                    }
                    answer_due = None;
                }
                () = tokio::time::sleep_until(held_until.unwrap_or_else(tokio::time::Instant::now)),
                    if held_until.is_some() => {
                    held_until = None;
                    self.release_all_held_final_frames(&mut link).await;
                }
                () = &mut hello_deadline, if !established => {
                    return outcome(false, SessionEnd::Lost("no HelloAck in time".to_owned()));
                }
                () = writer.stopped() => {
                    return outcome(established, SessionEnd::Lost("socket write failed".to_owned()));
                }
                () = stop.asked(), if !stopping => {
                    tracing::info!(terminals = self.terminals.len(), "tether_daemon_stopping");
                    if !established {
                        // Nothing can be reported on this socket yet.
                        return outcome(false, SessionEnd::Stopped);
                    }
                    stopping = true;
                    self.signal_running(libc::SIGHUP);
                    stop_timer.as_mut().reset(tokio::time::Instant::now() + stop::HANGUP_GRACE);
                }
                () = &mut stop_timer, if stopping => {
                    if killed {
                        tracing::warn!(unconfirmed = self.terminals.len(), "tether_daemon_stop_unconfirmed");
                        return outcome(established, SessionEnd::Stopped);
                    }
                    killed = true;
                    self.signal_running(libc::SIGKILL);
                    stop_timer.as_mut().reset(tokio::time::Instant::now() + stop::KILL_GRACE);
                }
            }
        }
    }

    fn hello(&self, host_id: &str, booking: Option<Booking>) -> Hello {
        Hello {
            host_id: host_id.to_owned(),
            daemon_version: env!("CARGO_PKG_VERSION").to_owned(),
            capabilities: Some(Capabilities {
                manage_dirs: true,
                refresh_limits: true,
                credentials: true,
                usage: true,
                flow_control: true,
                input_flow_control: true,
                resume_ended: true,
            }),
            dirs: self.dirs.to_strings(),
            terminals: self
                .terminals
                .iter()
                .map(|(terminal_id, entry)| TerminalReport {
                    terminal_id: terminal_id.clone(),
                    running: entry.running(),
                    next_offset: entry.handle.next_offset.get(),
                })
                .collect(),
            booking,
        }
    }

    /// After HelloAck: the final frames of terminals that ended while the
    /// socket was down (or whose frames were never confirmed), but for
    /// those the server named in `resume_ended`: they wait for its resuming
    /// Attach. True when some wait.
    async fn send_pending_final_frames(&mut self, link: &mut Link, resume_ended: &[String]) -> bool {
        let resume_ended: std::collections::HashSet<&str> = resume_ended.iter().map(String::as_str).collect();
        let mut pending = Vec::new();
        let mut held = false;
        for (terminal_id, entry) in &mut self.terminals {
            let Some(final_frames) = &entry.final_frames else { continue };
            entry.held = resume_ended.contains(terminal_id.as_str());
            if entry.held {
                held = true;
            } else {
                pending.push(final_frames.clone());
            }
        }
        for final_frames in pending {
            link.send_final_frames(final_frames).await;
        }
        held
    }

    /// Sends the final frames of `terminal_id` if they waited for the
    /// Attach just answered.
    async fn release_held_final_frames(&mut self, link: &mut Link, terminal_id: &str) {
        let Some(entry) = self.terminals.get_mut(terminal_id).filter(|entry| entry.held) else { return };
        entry.held = false;
        if let Some(final_frames) = entry.final_frames.clone() {
            link.send_final_frames(final_frames).await;
        }
    }

    /// The server never sent the resuming Attach it announced: the final
    /// frames go without it.
    async fn release_all_held_final_frames(&mut self, link: &mut Link) {
        let held: Vec<String> =
            self.terminals.iter().filter(|(_, entry)| entry.held).map(|(terminal_id, _)| terminal_id.clone()).collect();
        for terminal_id in held {
            tracing::warn!(%terminal_id, "tether_daemon_resume_ended_not_asked");
            self.release_held_final_frames(link, &terminal_id).await;
        }
    }

    /// A terminal ended: remember its final frames, and send them now if
    /// the connection is established.
    async fn on_finished(&mut self, final_frames: FinalFrames, link: Option<&mut Link>) {
        let Some(entry) = self.terminals.get_mut(&final_frames.terminal_id) else {
            return;
        };
        tracing::info!(
            terminal_id = %final_frames.terminal_id,
            exit_code = ?final_frames.exit.exit_code,
            signal = ?final_frames.exit.signal,
            "tether_daemon_terminal_exited"
        );
        entry.final_frames = Some(final_frames.clone());
        if let Some(link) = link {
            link.send_final_frames(final_frames).await;
        }
    }

    /// The server confirmed a terminal's final frames.
    fn forget(&mut self, terminal_id: &str) {
        if self.terminals.get(terminal_id).is_some_and(|entry| !entry.running()) {
            self.terminals.remove(terminal_id);
            tracing::debug!(terminal_id, "tether_daemon_terminal_forgotten");
        }
    }

    async fn on_frame(&mut self, frame: Option<In>, link: &mut Link) {
        let Some(frame) = frame else {
            // An empty oneof: a frame type newer than this daemon.
            tracing::warn!("tether_daemon_unknown_server_frame");
            return;
        };
        let reply = match frame {
            In::HelloAck(_) | In::Pong(_) => None,
            In::Spawn(spawn) => self.spawn(spawn),
            In::Input(input) => {
                self.input(&input.terminal_id, input.data);
                None
            }
            In::Resize(resize) => {
                let size = GridSize::clamped(resize.cols, resize.rows);
                self.resize(&resize.terminal_id, size, &link.out);
                None
            }
            In::Kill(kill) => {
                self.kill(&kill.terminal_id, kill.signal);
                None
            }
            In::Attach(attach) => {
                let (terminal_id, resuming) = (attach.terminal_id.clone(), attach.resume_from.is_some());
                if let Some(reply) = self.attach(attach, &link.out) {
                    link.send(reply).await;
                }
                // Final frames held for this Attach follow its answer.
                if resuming {
                    self.release_held_final_frames(link, &terminal_id).await;
                }
                None
            }
            In::Credit(credit) => {
                if let Some(entry) = self.terminals.get(&credit.terminal_id) {
                    let _ = entry.handle.commands.send(TerminalCommand::Credit { until: credit.until });
                }
                None
            }
            In::Detach(detach) => {
                if let Some(entry) = self.terminals.get(&detach.terminal_id) {
                    let _ = entry.handle.commands.send(TerminalCommand::Detach);
                }
                None
            }
            In::Dirs(request) => Some(Frame::DirsResult(self.change_dirs(request))),
            In::LimitsRefresh(request) => Some(Frame::LimitsResult(LimitsResult {
                request_id: request.request_id,
                limits_json: HostLimits::collect().to_json(),
                error: None,
            })),
            In::Credentials(request) => Some(Frame::CredentialsResult(self.credentials(request.request_id))),
        };
        if let Some(reply) = reply {
            // A failed send means the connection is gone; the serve loop sees it.
            link.send(reply).await;
        }
    }

    fn spawn(&mut self, spawn: Spawn) -> Option<Frame> {
        let terminal_id = spawn.terminal_id;
        if let Some(entry) = self.terminals.get(&terminal_id) {
            // Idempotent: a re-sent Spawn learns the pid again; one for a
            // terminal that already ended is answered by its pending Exit.
            return entry.running().then(|| Frame::Started(Started { terminal_id, pid: entry.pid }));
        }
        let spawn_error = |terminal_id: String, message: String| {
            tracing::info!(%terminal_id, %message, "tether_daemon_spawn_failed");
            Some(Frame::SpawnError(SpawnError { terminal_id, message }))
        };
        if terminal_id.is_empty() {
            return spawn_error(terminal_id, "empty terminal id".to_owned());
        }
        if self.stop.requested() {
            return spawn_error(terminal_id, "the daemon is stopping".to_owned());
        }
        let dir = match self.dirs.resolve_spawn_dir(&spawn.dir) {
            Ok(dir) => dir,
            Err(err) => return spawn_error(terminal_id, err.to_string()),
        };
        let size = GridSize::for_spawn(spawn.cols, spawn.rows);
        // Before the process, so a failure leaves nothing to clean up.
        let screen = match ScreenWorker::start(format!("tether-screen-{terminal_id}"), size) {
            Ok(screen) => screen,
            Err(err) => return spawn_error(terminal_id, format!("cannot start the screen thread: {err}")),
        };
        let process = match pty::spawn(&dir, &spawn.argv, size) {
            Ok(process) => process,
            Err(err) => return spawn_error(terminal_id, err.to_string()),
        };
        tracing::info!(
            %terminal_id,
            pid = process.pid,
            dir = %dir.display(),
            "tether_daemon_terminal_started"
        );
        let child = ChildStreams {
            pid: process.pid,
            output: process.output,
            exit: process.exit,
            started_at: process.started_at,
        };
        process.input.report_to(pty::InputReport { terminal_id: terminal_id.clone(), tx: self.input_taken_tx.clone() });
        let handle = terminal::start(terminal_id.clone(), screen, child, self.finished_tx.clone());
        self.terminals.insert(
            terminal_id.clone(),
            TerminalEntry {
                pid: process.pid,
                master: process.master,
                size,
                input: process.input,
                handle,
                final_frames: None,
                held: false,
            },
        );
        Some(Frame::Started(Started { terminal_id, pid: process.pid }))
    }

    fn running_terminal(&mut self, terminal_id: &str) -> Option<&mut TerminalEntry> {
        let entry = self.terminals.get_mut(terminal_id).filter(|entry| entry.running());
        if entry.is_none() {
            tracing::debug!(terminal_id, "tether_daemon_frame_for_absent_terminal");
        }
        entry
    }

    fn input(&mut self, terminal_id: &str, data: Bytes) {
        let Some(entry) = self.running_terminal(terminal_id) else {
            return;
        };
        if let Err(data) = entry.input.push(data) {
            // The child is not reading its input (or is gone); blocking here
            // would stall every other terminal's frames behind it.
            tracing::warn!(terminal_id, bytes = data.len(), "tether_daemon_input_dropped");
        }
    }

    fn resize(&mut self, terminal_id: &str, size: GridSize, out: &Outbox) {
        let Some(entry) = self.running_terminal(terminal_id) else {
            return;
        };
        if entry.size == size {
            return;
        }
        // The PTY is resized here, before any later Input of the same
        // connection reaches the writer task, so `stty size` typed after a
        // Resize sees the new size.
        if let Err(error) = pty::resize(&*entry.master, size) {
            tracing::warn!(terminal_id, %error, "tether_daemon_resize_failed");
            return;
        }
        entry.size = size;
        let _ = entry.handle.commands.send(TerminalCommand::Resize { size, out: out.clone() });
    }

    fn kill(&mut self, terminal_id: &str, signal: i32) {
        let Some(entry) = self.running_terminal(terminal_id) else {
            return;
        };
        if let Err(error) = pty::send_signal(entry.pid, signal) {
            tracing::warn!(terminal_id, signal, %error, "tether_daemon_kill_failed");
        }
    }

    fn attach(&mut self, attach: Attach, out: &Outbox) -> Option<Frame> {
        let Attach { terminal_id, attach_id, resume_from, window, from_oldest } = attach;
        // From the oldest byte held when `resume_from` is gone (a run's capture).
        let resume_from = resume_from.map(|from| (from, from_oldest.unwrap_or(false)));
        let message = match self.terminals.get(&terminal_id) {
            None => "unknown terminal",
            Some(entry) if entry.running() => {
                let command =
                    TerminalCommand::Attach { attach_id: attach_id.clone(), resume_from, window, out: out.clone() };
                match entry.handle.commands.send(command) {
                    Ok(()) => return None,
                    // The task ended a moment ago; its final frames are on their way.
                    Err(_) => "terminal has exited",
                }
            }
            // Ended: a resume is served from the ring it ended with.
            Some(entry) => match (&entry.final_frames, resume_from) {
                (Some(ended), Some((from, from_oldest))) => {
                    let from = if from_oldest { from.max(ended.output.start_offset()) } else { from };
                    match ended.output.bytes_since(from, usize::MAX) {
                        Some(data) => {
                            return Some(Frame::Scrollback(Scrollback {
                                terminal_id,
                                attach_id,
                                data,
                                cols: ended.snapshot.cols,
                                rows: ended.snapshot.rows,
                                offset: from,
                                resumed: true,
                            }))
                        }
                        None => "terminal has exited",
                    }
                }
                _ => "terminal has exited",
            },
        };
        Some(Frame::AttachError(AttachError { terminal_id, attach_id, message: message.to_owned() }))
    }

    fn change_dirs(&mut self, request: Dirs) -> DirsResult {
        let mut dirs = self.dirs.clone();
        let changed = match DirsOp::try_from(request.op) {
            Ok(DirsOp::Add | DirsOp::Remove) if self.dirs_locked => {
                tracing::warn!(path = %request.path, "tether_daemon_dirs_change_refused");
                Err(DirError::Locked.to_string())
            }
            Ok(DirsOp::Add) => dirs.add(&request.path).map_err(|err| err.to_string()),
            Ok(DirsOp::Remove) => dirs.remove(&request.path).map_err(|err| err.to_string()),
            Ok(DirsOp::Unspecified) | Err(_) => Err(format!("unknown dirs op {}", request.op)),
        };
        let result = changed.and_then(|()| {
            self.state.save_dirs(&dirs).map_err(|err| {
                tracing::error!(error = %err, "tether_daemon_dirs_not_saved");
                "cannot save the allowed dirs".to_owned()
            })
        });
        match result {
            Ok(()) => {
                self.dirs = dirs;
                tracing::info!(dirs = ?self.dirs.dirs(), "tether_daemon_dirs_changed");
                DirsResult { request_id: request.request_id, dirs: self.dirs.to_strings(), error: None }
            }
            Err(error) => {
                DirsResult { request_id: request.request_id, dirs: self.dirs.to_strings(), error: Some(error) }
            }
        }
    }

    fn credentials(&self, request_id: String) -> CredentialsResult {
        match self.state.credentials() {
            Ok(credentials_json) => CredentialsResult { request_id, credentials_json, error: None },
            Err(err) => CredentialsResult { request_id, credentials_json: Bytes::new(), error: Some(err.to_string()) },
        }
    }
}
