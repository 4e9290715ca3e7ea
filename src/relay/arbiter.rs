//! `TerminalArbiter`: one actor per terminal with viewers, on the owner
//! (docs/PROTOCOL.md, "Viewer protocol"). It fans the daemon's output stream out to its members,
//! brings each new member in with snapshot-then-live (or a resume when the
//! bytes are still held), checks offsets so no member sees a gap or a
//! duplicate, runs the grid rules of `grid`, and keeps a run's output
//! flowing into its log until the run ends.
//!
//! A member is a viewer (a `Recipient<ViewerOut>`: local or, later, a
//! remote proxy; the arbiter cannot tell) or a run capture.
//!
//! Flow control (docs/PROTOCOL.md, "Flow control"): the daemon sends this
//! terminal's output only within a window the arbiter grants. The arbiter
//! grants more as it hands output to members whose outbound queues are
//! below the soft bound; while a viewer's queue is over it, the arbiter
//! grants nothing (this terminal pauses, no other does) and checks again
//! every few milliseconds; a viewer still over it after `viewer.slow_ms` is
//! closed 1008 and the window reopens. A daemon whose hello does not claim
//! flow control cannot be told to stop one terminal: while the stream is
//! paused its connection waits for the answer to `OutputChunk` (the
//! protocol's original, connection-wide backpressure).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use bytes::Bytes;
use tokio::sync::oneshot;
use uuid::Uuid;

use super::capture::RunCapture;
use super::ended::ended_messages;
use super::grid::{Grid, GridAction, GridTimings};
use super::outbox::Frame;
use super::owed::{Owed, OwedOne};
use super::resume_ring::{Appended, ResumeRing};
use super::stamp::InteractionStamp;
use super::*;
use crate::proto::v1::server_frame;
use crate::store::{RunState, Store, TerminalState};
use crate::viewer_protocol::ServerMessage;

/// Settings an arbiter needs.
#[derive(Debug, Clone)]
pub struct ArbiterConfig {
    pub timings: GridTimings,
    /// Recent output kept for resumes, in bytes.
    pub ring_bytes: usize,
    /// A viewer queue over this pauses the stream until it drains...
    pub soft_queue_bytes: usize,
    /// ...for at most this long; then the viewer is closed 1008.
    pub slow: Duration,
    /// Bytes queued towards the daemon before a viewer's input is refused.
    pub input_queue_limit: usize,
    pub run_log_max_bytes: usize,
    /// Output a daemon may send ahead of what was handed to the viewers.
    pub window_bytes: u64,
    /// Viewers (local and remote) one terminal takes.
    pub max_viewers: usize,
    /// The instance's count of daemon-reported facts not stored yet; a
    /// captured run's end is one until it is stored.
    pub owed_writes: Arc<Owed>,
}

/// A captured run's end, stored after its log; owed until then, so the
/// drain waits for it (docs/ARCHITECTURE.md, "Drain").
struct RunEnd {
    state: RunState,
    code: Option<i32>,
    _owed: OwedOne,
}

impl RunEnd {
    fn new(code: Option<i32>, owed: &Arc<Owed>) -> Self {
        let state = if code == Some(0) { RunState::Succeeded } else { RunState::Failed };
        Self { state, code, _owed: owed.one() }
    }
}

/// How often a paused stream looks at its lagging viewers' queues again.
const LAG_POLL: Duration = Duration::from_millis(5);
/// How often a run capture writes what it gathered to the run's log.
const CAPTURE_FLUSH: Duration = Duration::from_millis(500);

/// Where a member is in the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// Waiting for the terminal to run or its host to connect.
    Waiting,
    /// An Attach was sent; the member starts at that Scrollback.
    Awaiting(String),
    /// Receiving live output; `next` is the next offset it expects.
    Live { next: u64 },
    /// The daemon refused the Attach; retried when the terminal starts or
    /// its host reconnects, not on every output chunk.
    Refused,
}

/// A member's key: a viewer by its id, or the terminal's run capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum MemberId {
    Viewer(u64),
    Capture,
}

enum Kind {
    /// A viewer and the byte count of its outbound queue.
    Viewer(ViewerSink, Arc<AtomicUsize>),
    Capture(RunCapture),
}

struct Member {
    kind: Kind,
    phase: Phase,
    /// Offset a resume was asked from (`?from=N`, or a run's logged bytes).
    resume_from: Option<u64>,
    /// A viewer that may only watch (see [`read_only_cap`]).
    read_only: bool,
}

/// How many of a terminal's `max_viewers` read-only viewers (read and
/// share tokens) may take: all but a quarter (at least one seat), so that
/// whoever holds a read-only link cannot keep the viewers that may type,
/// the terminal's owner first, out of it (docs/SECURITY.md).
fn read_only_cap(max_viewers: usize) -> usize {
    if max_viewers <= 1 {
        return max_viewers;
    }
    max_viewers - (max_viewers / 4).max(1)
}

/// The daemon connection currently serving the terminal.
struct Stream {
    link: DaemonLink,
    /// The stream offset up to which the daemon may send Output (flow
    /// control); `None` before the first Scrollback or without flow control.
    granted: Option<u64>,
}

/// Sends a member that missed bytes back to the start: a viewer gets a
/// fresh replay, a run capture asks for its missing bytes again.
fn rewind(m: &mut Member) {
    m.resume_from = match (&m.kind, &m.phase) {
        (Kind::Capture(_), Phase::Live { next }) => Some(*next),
        _ => None,
    };
    m.phase = Phase::Waiting;
}

pub struct TerminalArbiter {
    terminal_id: Uuid,
    config: ArbiterConfig,
    /// Names this arbiter in the links others hold (its daemon connection
    /// detaches only the arbiter it attached).
    id: ArbiterId,
    store: Arc<dyn Store>,
    /// The registry that started it, told when it has no members left.
    registry: Recipient<ArbiterIdle>,
    stream: Option<Stream>,
    state: Option<TerminalState>,
    members: HashMap<MemberId, Member>,
    grid: Grid,
    /// Recent raw output, for resumes; its end is the next offset expected
    /// on the daemon's stream, once a Scrollback set it.
    ring: ResumeRing,
    /// Since when a viewer over the soft bound holds the stream back.
    paused_since: Option<Instant>,
    /// Daemons without flow control wait on these while the stream is paused.
    held_daemon: Vec<oneshot::Sender<()>>,
    lag_check_scheduled: bool,
    /// The terminal's end is being read from the store for waiting members.
    ending: bool,
    retiring: bool,
    flushing: bool,
    /// The run capture ends once what it holds is written: the host moved
    /// to another instance, whose capture resumes from the stored log end.
    releasing_capture: bool,
    /// The capture's flush timer (every [`CAPTURE_FLUSH`]); only while a
    /// run is captured, so an arbiter without one has no timer.
    capture_timer: Option<SpawnHandle>,
    finish: Option<RunEnd>,
    stamp: InteractionStamp,
    /// The member id the next joining viewer gets.
    next_member: u64,
}

impl TerminalArbiter {
    /// A viewer typed: stamp the terminal, at most once a minute.
    fn stamp_interaction(&mut self, ctx: &mut Context<Self>) {
        let now = chrono::Utc::now();
        if !self.stamp.due(now) {
            return;
        }
        let (store, id) = (self.store.clone(), self.terminal_id);
        async move { store.stamp_interaction(id, now).await }
            .into_actor(self)
            .map(move |stored, act, _| {
                let stored = stored.unwrap_or_else(|e| {
                    tracing::warn!(error = %e, terminal_id = %act.terminal_id, "tether_interaction_stamp_failed");
                    None
                });
                act.stamp.stored(stored.unwrap_or(now));
            })
            .spawn(ctx);
    }

    pub fn new(
        terminal_id: Uuid,
        id: ArbiterId,
        config: ArbiterConfig,
        store: Arc<dyn Store>,
        registry: Recipient<ArbiterIdle>,
        online: Option<HostOnline>,
    ) -> Self {
        let grid = Grid::new(config.timings, (80, 24));
        Self {
            terminal_id,
            ring: ResumeRing::new(config.ring_bytes),
            config,
            id,
            store,
            registry,
            stream: online.map(|o| Stream { link: o.0, granted: None }),
            state: None,
            members: HashMap::new(),
            grid,
            paused_since: None,
            held_daemon: Vec::new(),
            lag_check_scheduled: false,
            ending: false,
            retiring: false,
            flushing: false,
            releasing_capture: false,
            capture_timer: None,
            finish: None,
            stamp: InteractionStamp::default(),
            next_member: 1,
        }
    }

    fn send_to(&self, member: u64, out: ViewerOut) {
        if let Some(Member { kind: Kind::Viewer(r, _), .. }) = self.members.get(&MemberId::Viewer(member)) {
            r.do_send(out);
        }
    }

    fn broadcast(&self, out: &ViewerOut) {
        for m in self.members.values() {
            if let Kind::Viewer(r, _) = &m.kind {
                r.do_send(out.clone());
            }
        }
    }

    fn status(&self) -> ViewerOut {
        let state = self.state.map_or("pending", TerminalState::as_str);
        let host = if self.stream.is_some() { "online" } else { "offline" };
        ViewerOut::control(ServerMessage::Status { state: state.into(), host: host.into() })
    }

    fn size_for(&self, member: u64) -> ViewerOut {
        let (cols, rows) = self.grid.pty();
        let yours = self.grid.holder() == Some(member);
        ViewerOut::control(ServerMessage::Size { cols, rows, yours })
    }

    fn broadcast_sizes(&self) {
        for id in self.members.keys() {
            if let MemberId::Viewer(id) = *id {
                self.send_to(id, self.size_for(id));
            }
        }
    }

    /// Sends Attach for every waiting member when the terminal can stream;
    /// when it has ended, tells them so from the store instead.
    fn attach_waiting(&mut self, ctx: &mut Context<Self>) {
        if matches!(self.state, Some(TerminalState::Exited | TerminalState::Error)) {
            self.end_from_store(ctx);
            return;
        }
        let Some(stream) = &self.stream else { return };
        // A launching terminal's Spawn already went out on this connection,
        // and the daemon handles frames in order, so an Attach finds it even
        // if the process exits at once (a short run).
        if !matches!(self.state, Some(TerminalState::Running | TerminalState::Launching)) {
            return;
        }
        // This runs after every Output chunk; the handles below cost two
        // allocations, so only make them when someone is waiting.
        if !self.members.values().any(|member| member.phase == Phase::Waiting) {
            return;
        }
        let daemon = stream.link.daemon.clone();
        let arbiter = ArbiterLink::of(self.id, &ctx.address());
        let window = stream.link.flow_control.then_some(self.config.window_bytes);
        for member in self.members.values_mut() {
            if member.phase != Phase::Waiting {
                continue;
            }
            let attach_id = Uuid::new_v4().to_string();
            member.phase = Phase::Awaiting(attach_id.clone());
            daemon.attach(AttachArbiter {
                terminal_id: self.terminal_id,
                attach_id,
                resume_from: member.resume_from,
                from_oldest: matches!(member.kind, Kind::Capture(_)),
                window,
                arbiter: arbiter.clone(),
            });
        }
    }

    /// The terminal ended and its members did not see it on the stream (the
    /// arbiter learned it from the store: the Exit came before the arbiter,
    /// or the host came back with the process gone). Every viewer gets the
    /// recorded end and is closed 1000; a run capture finishes the run.
    fn end_from_store(&mut self, ctx: &mut Context<Self>) {
        if self.ending || self.members.is_empty() {
            self.maybe_idle(ctx);
            return;
        }
        self.ending = true;
        let store = self.store.clone();
        let id = self.terminal_id;
        async move {
            let terminal = store.terminal_by_id(id).await;
            let snapshot = crate::store::logged(store.get_snapshot(id).await, "load snapshot").flatten();
            (terminal, snapshot)
        }
        .into_actor(self)
        .map(|(terminal, snapshot), act, ctx| {
            act.ending = false;
            match terminal {
                Ok(Some(t)) if !t.state.is_live() && t.state != TerminalState::Pending => {
                    let messages = ended_messages(&t, snapshot, act.stream.is_some());
                    for m in act.members.values() {
                        if let Kind::Viewer(r, _) = &m.kind {
                            for message in &messages {
                                r.do_send(message.clone());
                            }
                        }
                    }
                    act.close_viewers(close::NORMAL, "terminal ended");
                    if act.members.contains_key(&MemberId::Capture) && act.finish.is_none() {
                        act.finish = Some(RunEnd::new(t.exit_code, &act.config.owed_writes));
                        act.flush_capture(ctx);
                    }
                }
                Ok(Some(t)) => {
                    // Started again in between (a row is never revived, but a
                    // stale state is possible): stream as usual.
                    act.state = Some(t.state);
                    act.attach_waiting(ctx);
                }
                Ok(None) => {
                    act.close_viewers(close::UNKNOWN_TERMINAL, "terminal deleted");
                    act.members.remove(&MemberId::Capture);
                }
                Err(e) => {
                    tracing::error!(error = %e, terminal_id = %act.terminal_id, "tether_arbiter_load_failed");
                    act.close_viewers(close::INTERNAL, "database error");
                    act.members.remove(&MemberId::Capture);
                }
            }
            act.maybe_idle(ctx);
        })
        .wait(ctx);
    }

    fn apply(&mut self, actions: Vec<GridAction>, ctx: &mut Context<Self>) {
        for action in actions {
            match action {
                GridAction::Resize { cols, rows } => self.resize_pty(cols, rows),
                GridAction::HolderChanged => self.broadcast_sizes(),
                GridAction::PingHolder { holder, arrival } => {
                    self.send_to(holder, ViewerOut::Ping);
                    ctx.run_later(self.config.timings.ping_timeout, move |act, ctx| {
                        let actions = act.grid.ping_expired(holder, arrival, Instant::now());
                        act.apply(actions, ctx);
                    });
                }
            }
        }
    }

    /// Hands live output to one member, trimming what it already has.
    fn deliver(member: &mut Member, offset: u64, data: &Bytes) -> Result<(), ()> {
        let Phase::Live { next } = member.phase else { return Ok(()) };
        let end = offset + data.len() as u64;
        if end <= next {
            return Ok(()); // duplicate
        }
        if offset > next {
            return Err(()); // gap
        }
        let fresh = data.slice((next - offset) as usize..);
        member.phase = Phase::Live { next: end };
        match &mut member.kind {
            Kind::Viewer(r, queued) => {
                // Counted now, not when the viewer's actor gets to it, so
                // the stream pauses on what is really in flight.
                queued.fetch_add(Frame::Binary(fresh.clone()).weight(), Ordering::Relaxed);
                r.do_send(ViewerOut::Output(fresh));
            }
            Kind::Capture(capture) => {
                capture.push(next, &fresh);
            }
        }
        Ok(())
    }

    fn on_output(&mut self, offset: u64, data: Bytes, ctx: &mut Context<Self>) {
        if let Appended::Gap { expected } = self.ring.append(offset, &data) {
            // The stream itself skipped bytes: everyone live gets a fresh replay.
            tracing::warn!(terminal_id = %self.terminal_id, expected, offset, "tether_stream_gap");
            metrics::counter!("tether_stream_gaps_total").increment(1);
            self.ring.reset();
            for m in self.members.values_mut() {
                if matches!(m.phase, Phase::Live { .. }) {
                    rewind(m);
                }
            }
            self.attach_waiting(ctx);
            return;
        }
        let mut gaps = Vec::new();
        for (id, m) in self.members.iter_mut() {
            if Self::deliver(m, offset, &data).is_err() {
                gaps.push(*id);
            }
        }
        for id in gaps {
            if let Some(m) = self.members.get_mut(&id) {
                rewind(m);
            }
        }
        self.attach_waiting(ctx);
        self.check_lag(ctx);
    }

    /// Viewers whose outbound queue is over the soft bound.
    fn lagging(&self) -> Vec<u64> {
        let soft = self.config.soft_queue_bytes;
        self.members
            .iter()
            .filter_map(|(id, m)| match (id, &m.kind) {
                (MemberId::Viewer(id), Kind::Viewer(_, queued)) if queued.load(Ordering::Relaxed) > soft => Some(*id),
                _ => None,
            })
            .collect()
    }

    /// After output was handed out: grant more window, or pause this
    /// terminal's stream while a viewer is behind.
    fn check_lag(&mut self, ctx: &mut Context<Self>) {
        if self.lagging().is_empty() {
            self.unpause();
        } else {
            self.paused_since.get_or_insert_with(Instant::now);
            self.schedule_lag_check(ctx);
        }
    }

    fn schedule_lag_check(&mut self, ctx: &mut Context<Self>) {
        if self.lag_check_scheduled {
            return;
        }
        self.lag_check_scheduled = true;
        ctx.run_later(LAG_POLL, |act, ctx| {
            act.lag_check_scheduled = false;
            act.recheck_lag(ctx);
        });
    }

    /// While paused: resume once every viewer caught up; close the ones
    /// still behind after `slow`.
    fn recheck_lag(&mut self, ctx: &mut Context<Self>) {
        let Some(since) = self.paused_since else { return };
        let lagging = self.lagging();
        if !lagging.is_empty() && since.elapsed() < self.config.slow {
            self.schedule_lag_check(ctx);
            return;
        }
        for id in lagging {
            tracing::info!(terminal_id = %self.terminal_id, "tether_viewer_too_slow");
            self.send_to(
                id,
                ViewerOut::Evict { code: close::POLICY, reason: crate::viewer_protocol::TOO_SLOW_A_READER.into() },
            );
            self.remove_member(id, ctx);
        }
        self.unpause();
        self.maybe_idle(ctx);
    }

    /// The stream may flow again: more window, and a waiting daemon goes on.
    fn unpause(&mut self) {
        self.paused_since = None;
        for held in self.held_daemon.drain(..) {
            let _ = held.send(());
        }
        self.grant();
    }

    /// Moves the daemon's limit to `window` past what arrived, once half of
    /// the previous grant is used (so a busy stream gets one Credit per half
    /// window, and a keystroke echo none).
    fn grant(&mut self) {
        let Some(end) = self.ring.end() else { return };
        let Some(stream) = self.stream.as_mut() else { return };
        let Some(granted) = stream.granted else { return };
        let window = self.config.window_bytes;
        if granted.saturating_sub(end) > window / 2 {
            return;
        }
        let until = end + window;
        stream.granted = Some(until);
        stream.link.daemon.frame(server_frame::Frame::Credit(crate::proto::v1::Credit {
            terminal_id: self.terminal_id.to_string(),
            until,
        }));
    }

    fn on_scrollback(&mut self, attach_id: String, data: Bytes, (cols, rows): (u16, u16), offset: u64, resumed: bool) {
        // A resume answers only the Attach that asked for one, from where
        // it asked (a capture takes one from further on: the daemon's ring
        // starts later); anything else from the daemon is refused.
        let awaiting = self.awaiting(&attach_id);
        let asked = |m: &Member| match (&m.kind, m.resume_from) {
            (_, None) => false,
            (Kind::Viewer(..), Some(from)) => from == offset,
            (Kind::Capture(_), Some(from)) => from <= offset,
        };
        if resumed && awaiting.iter().any(|id| self.members.get(id).is_some_and(|m| !asked(m))) {
            tracing::warn!(terminal_id = %self.terminal_id, offset, "tether_daemon_unasked_resume");
            let message = "the daemon resumed a stream that was not asked for";
            self.refuse(&attach_id, message);
            return;
        }
        self.grid.pty_resized(cols, rows);
        let live_at = if resumed { offset + data.len() as u64 } else { offset };
        if resumed {
            self.ring.absorb(offset, &data);
        } else {
            self.ring.anchor(live_at);
        }
        // Each Attach gives the daemon a fresh window from its live offset.
        let window = self.config.window_bytes;
        if let Some(stream) = self.stream.as_mut().filter(|s| s.link.flow_control) {
            stream.granted = Some(live_at + window);
        }
        for id in self.awaiting(&attach_id) {
            let size = match id {
                MemberId::Viewer(viewer) => Some(self.size_for(viewer)),
                MemberId::Capture => None,
            };
            let Some(Member { kind, phase, .. }) = self.members.get_mut(&id) else { continue };
            *phase = Phase::Live { next: live_at };
            match kind {
                Kind::Viewer(r, _) => {
                    if resumed {
                        r.do_send(ViewerOut::control(ServerMessage::Resume { offset }));
                        if !data.is_empty() {
                            r.do_send(ViewerOut::Binary(data.clone()));
                        }
                    } else {
                        r.do_send(ViewerOut::control(ServerMessage::Replay { cols, rows, offset }));
                        r.do_send(ViewerOut::Binary(data.clone()));
                        r.do_send(ViewerOut::control(ServerMessage::Live { offset }));
                    }
                    if let Some(size) = size {
                        r.do_send(size);
                    }
                }
                Kind::Capture(capture) => {
                    // A resume from further on, or a snapshot: the daemon's
                    // ring no longer had the bytes since the capture's end.
                    let lost = if resumed { capture.push(offset, &data) } else { capture.restart_at(offset) };
                    if lost > 0 {
                        tracing::warn!(terminal_id = %self.terminal_id, run_id = %capture.run_id, lost, "tether_run_log_gap");
                        metrics::counter!("tether_run_log_gap_bytes_total").increment(lost);
                    }
                }
            }
        }
        // The stream runs now: the PTY takes the holder's grid if it has
        // another (a terminal that started, or a daemon that came back,
        // after the holder's last view).
        if let Some(GridAction::Resize { cols, rows }) = self.grid.refit() {
            self.resize_pty(cols, rows);
        }
    }

    /// Sends the daemon a Resize; with no daemon connected the grid asks
    /// again once one is.
    fn resize_pty(&mut self, cols: u16, rows: u16) {
        match &self.stream {
            Some(stream) => stream.link.daemon.frame(server_frame::Frame::Resize(crate::proto::v1::Resize {
                terminal_id: self.terminal_id.to_string(),
                cols: u32::from(cols),
                rows: u32::from(rows),
            })),
            None => self.grid.resize_not_sent(),
        }
    }

    /// The daemon refused (or answered wrongly) the Attach `attach_id`: its
    /// viewers are told why and wait for the next try (`retry_refused`).
    fn refuse(&mut self, attach_id: &str, message: &str) {
        for id in self.awaiting(attach_id) {
            if let MemberId::Viewer(viewer) = id {
                self.send_to(viewer, ViewerOut::control(ServerMessage::error(message)));
            }
            if let Some(m) = self.members.get_mut(&id) {
                m.phase = Phase::Refused;
            }
        }
    }

    fn flush_capture(&mut self, ctx: &mut Context<Self>) {
        if self.flushing {
            return;
        }
        let Some(Member { kind: Kind::Capture(capture), .. }) = self.members.get_mut(&MemberId::Capture) else {
            if let Some(timer) = self.capture_timer.take() {
                ctx.cancel_future(timer);
            }
            return;
        };
        let finish = self.finish.take();
        if !capture.has_pending() && finish.is_none() {
            return;
        }
        let chunks = capture.take();
        let run_id = capture.run_id;
        let store = self.store.clone();
        let max = self.config.run_log_max_bytes;
        self.flushing = true;
        // What the database could not take now is put back and written at
        // the next flush (every CAPTURE_FLUSH), so a run that ends while it is
        // away still gets its log and result (docs/OPERATIONS.md, "Faults").
        async move {
            let mut chunks = chunks.into_iter();
            while let Some(chunk) = chunks.next() {
                match store.append_run_log(run_id, chunk.offset, &chunk.data, max).await {
                    Ok(()) => {}
                    Err(e) if e.is_transient() => {
                        tracing::warn!(error = %e, %run_id, "tether_run_log_write_kept");
                        return Err((std::iter::once(chunk).chain(chunks).collect(), finish));
                    }
                    Err(e) => tracing::error!(error = %e, %run_id, "tether_run_log_write_failed"),
                }
            }
            if let Some(end) = &finish {
                match store.finish_run(run_id, end.state, end.code).await {
                    Ok(_) => {}
                    Err(e) if e.is_transient() => {
                        tracing::warn!(error = %e, %run_id, "tether_run_finish_kept");
                        return Err((Vec::new(), finish));
                    }
                    Err(e) => tracing::error!(error = %e, %run_id, "tether_run_finish_failed"),
                }
            }
            Ok(finish.is_some())
        }
        .into_actor(self)
        .map(|flushed, act, ctx| {
            act.flushing = false;
            match flushed {
                Ok(true) => {
                    act.members.remove(&MemberId::Capture);
                    act.maybe_idle(ctx);
                }
                Ok(false) if act.finish.is_some() => act.flush_capture(ctx),
                Ok(false) if act.releasing_capture => act.end_released_capture(ctx),
                Ok(false) => {}
                Err((unsent, finish)) => {
                    if let Some(Member { kind: Kind::Capture(capture), .. }) = act.members.get_mut(&MemberId::Capture) {
                        capture.put_back(unsent);
                    }
                    act.finish = act.finish.take().or(finish);
                }
            }
        })
        .wait(ctx);
    }

    /// The host is connected to another instance: its hello there resumed
    /// the run's capture from the stored log end (docs/CLUSTER.md, "Run
    /// logs across moves"), so this one, waiting for the host to come
    /// back here, writes what it holds and ends. It used to wait on, and
    /// with it this arbiter and its bus subscription, for the life of the
    /// process when the host never came back. A capture that is finishing
    /// the run goes on.
    fn release_capture(&mut self, ctx: &mut Context<Self>) {
        if !self.members.contains_key(&MemberId::Capture) || self.finish.is_some() {
            return;
        }
        self.releasing_capture = true;
        if !self.flushing {
            self.flush_capture(ctx);
        }
        if !self.flushing {
            self.end_released_capture(ctx);
        }
    }

    fn end_released_capture(&mut self, ctx: &mut Context<Self>) {
        self.releasing_capture = false;
        self.members.remove(&MemberId::Capture);
        self.maybe_idle(ctx);
    }

    fn maybe_idle(&mut self, ctx: &mut Context<Self>) {
        if !self.members.is_empty() || self.retiring {
            return;
        }
        self.retiring = true;
        if let Some(stream) = &self.stream {
            stream.link.daemon.detach(self.terminal_id, self.id);
        }
        let retire = ctx.address().recipient();
        self.registry.do_send(ArbiterIdle { terminal_id: self.terminal_id, arbiter: self.id, retire });
    }

    /// Members waiting for the Scrollback of `attach_id`.
    fn awaiting(&self, attach_id: &str) -> Vec<MemberId> {
        self.members
            .iter()
            .filter(|(_, m)| matches!(&m.phase, Phase::Awaiting(a) if a == attach_id))
            .map(|(id, _)| *id)
            .collect()
    }

    /// Drops a member and frees the grid if it held it.
    fn remove_member(&mut self, id: u64, ctx: &mut Context<Self>) {
        self.members.remove(&MemberId::Viewer(id));
        let actions = self.grid.leave(id);
        self.apply(actions, ctx);
    }

    /// Members the daemon refused get another try (the terminal started,
    /// or its host came back).
    fn retry_refused(&mut self) {
        for m in self.members.values_mut() {
            if m.phase == Phase::Refused {
                m.phase = Phase::Waiting;
            }
        }
    }

    fn close_viewers(&mut self, code: u16, reason: &str) {
        let viewers: Vec<u64> = self
            .members
            .keys()
            .filter_map(|id| match id {
                MemberId::Viewer(id) => Some(*id),
                MemberId::Capture => None,
            })
            .collect();
        for id in viewers {
            self.send_to(id, ViewerOut::Close { code, reason: reason.to_string() });
            self.members.remove(&MemberId::Viewer(id));
            self.grid.leave(id);
        }
    }
}

impl Actor for TerminalArbiter {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let store = self.store.clone();
        let id = self.terminal_id;
        async move { store.terminal_by_id(id).await }
            .into_actor(self)
            .map(|row, act, ctx| {
                match row {
                    Ok(Some(t)) => {
                        act.grid.pty_resized(t.cols, t.rows);
                        // A lifecycle event may have arrived first; it is newer.
                        act.state.get_or_insert(t.state);
                    }
                    Ok(None) => act.close_viewers(close::UNKNOWN_TERMINAL, "terminal deleted"),
                    Err(e) => tracing::error!(error = %e, "tether_arbiter_load_failed"),
                }
                act.attach_waiting(ctx);
            })
            .wait(ctx);
    }
}

impl Handler<Join> for TerminalArbiter {
    type Result = Result<u64, NotJoined>;
    fn handle(&mut self, msg: Join, ctx: &mut Context<Self>) -> Self::Result {
        if self.retiring {
            let ended = matches!(self.state, Some(TerminalState::Exited | TerminalState::Error));
            return Err(if ended { NotJoined::Ended } else { NotJoined::Retired });
        }
        let viewers = self.members.keys().filter(|m| matches!(m, MemberId::Viewer(_))).count();
        let watching = self.members.values().filter(|m| m.read_only).count();
        if viewers >= self.config.max_viewers || (msg.read_only && watching >= read_only_cap(self.config.max_viewers)) {
            return Err(NotJoined::Full);
        }
        let viewer = self.next_member;
        self.next_member += 1;
        self.grid.join(viewer, Instant::now());
        msg.out.do_send(self.status());
        // A resume the arbiter can serve itself needs no round trip.
        let mut phase = Phase::Waiting;
        if let (Some(from), Some(_)) = (msg.resume_from, &self.stream) {
            if let Some(bytes) = self.ring.since(from) {
                msg.out.do_send(ViewerOut::control(ServerMessage::Resume { offset: from }));
                if !bytes.is_empty() {
                    msg.out.do_send(ViewerOut::Binary(bytes));
                }
                phase = Phase::Live { next: self.ring.end().unwrap_or(from) };
            }
        }
        let out = msg.out.clone();
        self.members.insert(
            MemberId::Viewer(viewer),
            Member {
                kind: Kind::Viewer(msg.out, msg.queued),
                phase,
                resume_from: msg.resume_from,
                read_only: msg.read_only,
            },
        );
        out.do_send(self.size_for(viewer));
        if self.stream.is_none() {
            out.do_send(ViewerOut::control(ServerMessage::error(crate::viewer_protocol::HOST_OFFLINE)));
        }
        self.attach_waiting(ctx);
        Ok(viewer)
    }
}

impl Handler<CaptureRun> for TerminalArbiter {
    type Result = ();
    fn handle(&mut self, msg: CaptureRun, ctx: &mut Context<Self>) {
        if self.retiring || self.members.contains_key(&MemberId::Capture) {
            return;
        }
        let phase = msg.attach_id.map_or(Phase::Waiting, Phase::Awaiting);
        self.members.insert(
            MemberId::Capture,
            Member {
                kind: Kind::Capture(RunCapture::new(msg.run_id, msg.logged, self.config.run_log_max_bytes)),
                phase,
                resume_from: Some(msg.logged),
                read_only: false,
            },
        );
        if self.capture_timer.is_none() {
            self.capture_timer = Some(ctx.run_interval(CAPTURE_FLUSH, |act, ctx| act.flush_capture(ctx)));
        }
        self.attach_waiting(ctx);
    }
}

impl Handler<FromViewer> for TerminalArbiter {
    type Result = ();
    fn handle(&mut self, msg: FromViewer, ctx: &mut Context<Self>) {
        let now = Instant::now();
        match msg {
            FromViewer::View { viewer, view } => {
                let actions = self.grid.view(viewer, &view, now);
                self.apply(actions, ctx);
            }
            FromViewer::Resize { viewer, cols, rows } => {
                let actions = self.grid.resize(viewer, cols, rows, now);
                self.apply(actions, ctx);
            }
            FromViewer::Pong { viewer } => self.grid.heard(viewer, now),
            FromViewer::Input { viewer, data } => {
                self.grid.used(viewer, now);
                self.stamp_interaction(ctx);
                let Some(stream) = &self.stream else {
                    self.send_to(
                        viewer,
                        ViewerOut::control(ServerMessage::error(crate::viewer_protocol::HOST_OFFLINE)),
                    );
                    return;
                };
                if stream.link.queue.bytes_for(self.terminal_id) > self.config.input_queue_limit {
                    self.send_to(viewer, ViewerOut::Close { code: close::POLICY, reason: "input overflow".into() });
                    self.remove_member(viewer, ctx);
                    self.maybe_idle(ctx);
                    return;
                }
                stream.link.daemon.input(self.terminal_id, data);
            }
            FromViewer::Leave { viewer } => {
                self.remove_member(viewer, ctx);
                self.maybe_idle(ctx);
            }
        }
    }
}

impl Handler<StreamEvent> for TerminalArbiter {
    type Result = ();
    fn handle(&mut self, msg: StreamEvent, _: &mut Context<Self>) {
        match msg {
            StreamEvent::Scrollback { attach_id, data, cols, rows, offset, resumed } => {
                self.on_scrollback(attach_id, data, (cols, rows), offset, resumed);
            }
            StreamEvent::AttachError { attach_id, message } => self.refuse(&attach_id, &message),
            StreamEvent::Size { cols, rows } => {
                self.grid.pty_resized(cols, rows);
                self.broadcast_sizes();
            }
        }
    }
}

impl Handler<OutputChunk> for TerminalArbiter {
    /// Resolves at once, or, for a daemon without flow control, when the
    /// stream is no longer paused.
    type Result = ResponseFuture<()>;

    fn handle(&mut self, msg: OutputChunk, ctx: &mut Context<Self>) -> Self::Result {
        self.on_output(msg.offset, msg.data, ctx);
        let windowed = self.stream.as_ref().is_some_and(|s| s.link.flow_control);
        if self.paused_since.is_none() || windowed {
            return Box::pin(async {});
        }
        let (held, released) = oneshot::channel();
        self.held_daemon.push(held);
        Box::pin(async move {
            let _ = released.await;
        })
    }
}

impl Handler<LifecycleEvent> for TerminalArbiter {
    type Result = ();
    fn handle(&mut self, msg: LifecycleEvent, ctx: &mut Context<Self>) {
        match msg {
            LifecycleEvent::Started => {
                self.state = Some(TerminalState::Running);
                self.broadcast(&self.status());
                self.retry_refused();
                self.attach_waiting(ctx);
            }
            LifecycleEvent::SpawnFailed(message) => {
                self.state = Some(TerminalState::Error);
                self.broadcast(&self.status());
                self.broadcast(&ViewerOut::control(ServerMessage::error(message.clone())));
                self.close_viewers(close::NORMAL, "terminal failed to start");
                self.members.remove(&MemberId::Capture);
                self.maybe_idle(ctx);
            }
            LifecycleEvent::Exited { status, snapshot } => {
                self.state = Some(TerminalState::Exited);
                // As for a start or a failed spawn, the new state first.
                self.broadcast(&self.status());
                // Members still waiting for a snapshot get the final screen.
                if let Some((data, cols, rows)) = snapshot {
                    for m in self.members.values() {
                        if !matches!(m.phase, Phase::Live { .. }) {
                            if let Kind::Viewer(r, _) = &m.kind {
                                r.do_send(ViewerOut::control(ServerMessage::Size { cols, rows, yours: false }));
                                r.do_send(ViewerOut::Binary(data.clone()));
                            }
                        }
                    }
                }
                self.broadcast(&ViewerOut::control(ServerMessage::Exit { exit_code: status.code }));
                self.close_viewers(close::NORMAL, "terminal exited");
                if self.members.contains_key(&MemberId::Capture) {
                    self.finish = Some(RunEnd::new(status.code, &self.config.owed_writes));
                    self.flush_capture(ctx);
                } else {
                    self.maybe_idle(ctx);
                }
            }
        }
    }
}

impl Handler<HostOnline> for TerminalArbiter {
    type Result = ();
    fn handle(&mut self, msg: HostOnline, ctx: &mut Context<Self>) {
        self.stream = Some(Stream { link: msg.0, granted: None });
        // Back here before a released capture ended: it captures again.
        self.releasing_capture = false;
        self.ring.reset();
        self.unpause();
        let store = self.store.clone();
        let id = self.terminal_id;
        // Reconciliation may have changed the row while the host was away.
        async move { store.terminal_by_id(id).await }
            .into_actor(self)
            .map(|row, act, ctx| {
                if let Ok(Some(t)) = row {
                    act.state = Some(t.state);
                }
                // A terminal the hello reconciled to ended is told as such
                // once, status included, by `attach_waiting` below.
                if !matches!(act.state, Some(TerminalState::Exited | TerminalState::Error)) {
                    act.broadcast(&act.status());
                }
                act.retry_refused();
                act.attach_waiting(ctx);
            })
            .wait(ctx);
    }
}

impl Handler<HostOffline> for TerminalArbiter {
    type Result = ();
    fn handle(&mut self, _: HostOffline, ctx: &mut Context<Self>) {
        self.stream = None;
        self.ring.reset();
        self.unpause();
        self.close_viewers(close::HOST_GONE, "host disconnected");
        if let Some(m) = self.members.get_mut(&MemberId::Capture) {
            m.phase = Phase::Waiting;
            if let Kind::Capture(capture) = &m.kind {
                m.resume_from = Some(capture.end());
            }
        }
        self.maybe_idle(ctx);
    }
}

impl Handler<HostElsewhere> for TerminalArbiter {
    type Result = ();
    fn handle(&mut self, _: HostElsewhere, ctx: &mut Context<Self>) {
        if self.stream.is_some() {
            return; // the host came back here meanwhile
        }
        self.close_viewers(close::HOST_GONE, "the host is connected to another instance; reattach");
        self.release_capture(ctx);
        self.maybe_idle(ctx);
    }
}

impl Handler<Retire> for TerminalArbiter {
    type Result = ();
    fn handle(&mut self, _: Retire, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}
