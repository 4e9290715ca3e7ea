//! `TerminalArbiter`: one actor per terminal with viewers, on the owner
//! (SPEC §5). It fans the daemon's output stream out to its members,
//! brings each new member in with snapshot-then-live (or a resume when the
//! bytes are still held), checks offsets so no member sees a gap or a
//! duplicate, runs the grid rules of `grid`, and keeps a run's output
//! flowing into its log until the run ends.
//!
//! A member is a viewer (a `Recipient<ViewerOut>`: local or, later, a
//! remote proxy; the arbiter cannot tell) or a run capture.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use bytes::Bytes;
use serde_json::json;
use uuid::Uuid;

use super::daemon_conn::DaemonConn;
use super::grid::{Grid, GridAction, GridTimings};
use super::outbox::Frame;
use super::registry::{ArbiterIdle, HostRegistry, Retire};
use super::*;
use crate::proto::v1::server_frame;
use crate::store::{RunState, Store, TerminalState};

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
}

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

enum Kind {
    /// A viewer and the byte count of its outbound queue.
    Viewer(Recipient<ViewerOut>, Arc<AtomicUsize>),
    Capture {
        run_id: Uuid,
        pending: Vec<u8>,
        logged: u64,
    },
}

struct Member {
    kind: Kind,
    phase: Phase,
    /// Offset a resume was asked from (`?from=N`, or a run's logged bytes).
    resume_from: Option<u64>,
}

/// The daemon connection currently serving the terminal.
struct Stream {
    conn: Addr<DaemonConn>,
    daemon_queue: Arc<AtomicUsize>,
}

const CAPTURE: u64 = 0;

/// Sends a member that missed bytes back to the start: a viewer gets a
/// fresh replay, a run capture asks for its missing bytes again.
fn rewind(m: &mut Member) {
    m.resume_from = match (&m.kind, &m.phase) {
        (Kind::Capture { .. }, Phase::Live { next }) => Some(*next),
        _ => None,
    };
    m.phase = Phase::Waiting;
}

pub struct TerminalArbiter {
    terminal_id: Uuid,
    config: ArbiterConfig,
    store: Arc<dyn Store>,
    registry: Addr<HostRegistry>,
    stream: Option<Stream>,
    state: Option<TerminalState>,
    members: HashMap<u64, Member>,
    grid: Grid,
    /// Recent raw output as (offset, bytes), for resumes.
    ring: VecDeque<(u64, Bytes)>,
    ring_len: usize,
    /// Next offset expected on the daemon's stream, once a Scrollback set it.
    stream_next: Option<u64>,
    retiring: bool,
    flushing: bool,
    finish: Option<(RunState, Option<i32>)>,
}

impl TerminalArbiter {
    pub fn new(
        terminal_id: Uuid,
        config: ArbiterConfig,
        store: Arc<dyn Store>,
        registry: Addr<HostRegistry>,
        online: Option<HostOnline>,
    ) -> Self {
        let grid = Grid::new(config.timings, (80, 24));
        Self {
            terminal_id,
            config,
            store,
            registry,
            stream: online.map(|o| Stream { conn: o.conn, daemon_queue: o.daemon_queue }),
            state: None,
            members: HashMap::new(),
            grid,
            ring: VecDeque::new(),
            ring_len: 0,
            stream_next: None,
            retiring: false,
            flushing: false,
            finish: None,
        }
    }

    fn send_to(&self, member: u64, out: ViewerOut) {
        if let Some(Member { kind: Kind::Viewer(r, _), .. }) = self.members.get(&member) {
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
        ViewerOut::Text(json!({"type": "status", "state": state, "host": host}).to_string())
    }

    fn size_for(&self, member: u64) -> ViewerOut {
        let (cols, rows) = self.grid.pty();
        let yours = self.grid.holder() == Some(member);
        ViewerOut::Text(json!({"type": "size", "cols": cols, "rows": rows, "yours": yours}).to_string())
    }

    fn broadcast_sizes(&self) {
        for (id, m) in &self.members {
            if matches!(m.kind, Kind::Viewer(..)) {
                self.send_to(*id, self.size_for(*id));
            }
        }
    }

    /// Sends Attach for every waiting member when the terminal can stream.
    fn attach_waiting(&mut self, ctx: &mut Context<Self>) {
        let Some(stream) = &self.stream else { return };
        // A launching terminal's Spawn already went out on this connection,
        // and the daemon handles frames in order, so an Attach finds it even
        // if the process exits at once (a short run).
        if !matches!(self.state, Some(TerminalState::Running | TerminalState::Launching)) {
            return;
        }
        let conn = stream.conn.clone();
        for member in self.members.values_mut() {
            if member.phase != Phase::Waiting {
                continue;
            }
            let attach_id = Uuid::new_v4().to_string();
            member.phase = Phase::Awaiting(attach_id.clone());
            conn.do_send(AttachArbiter {
                terminal_id: self.terminal_id,
                attach_id,
                resume_from: member.resume_from,
                arbiter: ctx.address(),
            });
        }
    }

    fn apply(&mut self, actions: Vec<GridAction>, ctx: &mut Context<Self>) {
        for action in actions {
            match action {
                GridAction::Resize { cols, rows } => {
                    if let Some(stream) = &self.stream {
                        stream.conn.do_send(ToDaemon(server_frame::Frame::Resize(crate::proto::v1::Resize {
                            terminal_id: self.terminal_id.to_string(),
                            cols: u32::from(cols),
                            rows: u32::from(rows),
                        })));
                    }
                }
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

    fn remember(&mut self, offset: u64, data: &Bytes) {
        self.ring.push_back((offset, data.clone()));
        self.ring_len += data.len();
        while self.ring_len > self.config.ring_bytes {
            match self.ring.pop_front() {
                Some((_, old)) => self.ring_len -= old.len(),
                None => break,
            }
        }
    }

    /// Bytes from `from` to the end of the stream, if the ring still has them.
    fn ring_since(&self, from: u64) -> Option<Bytes> {
        let end = self.stream_next?;
        if from > end {
            return None;
        }
        if from == end {
            return Some(Bytes::new());
        }
        let start = self.ring.front()?.0;
        if from < start {
            return None;
        }
        let mut out = Vec::with_capacity((end - from) as usize);
        for (offset, data) in &self.ring {
            let chunk_end = offset + data.len() as u64;
            if chunk_end <= from {
                continue;
            }
            let skip = from.saturating_sub(*offset) as usize;
            out.extend_from_slice(&data[skip..]);
        }
        Some(Bytes::from(out))
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
            Kind::Capture { pending, .. } => pending.extend_from_slice(&fresh),
        }
        Ok(())
    }

    fn on_output(&mut self, offset: u64, data: Bytes, ctx: &mut Context<Self>) {
        if let Some(expected) = self.stream_next {
            if offset > expected {
                // The stream itself skipped bytes: everyone live gets a fresh replay.
                tracing::warn!(terminal_id = %self.terminal_id, expected, offset, "tether_stream_gap");
                metrics::counter!("tether_stream_gaps_total").increment(1);
                self.stream_next = None;
                self.ring.clear();
                self.ring_len = 0;
                for m in self.members.values_mut() {
                    if matches!(m.phase, Phase::Live { .. }) {
                        rewind(m);
                    }
                }
                self.attach_waiting(ctx);
                return;
            }
        }
        let end = offset + data.len() as u64;
        if self.stream_next.is_some_and(|n| end > n) {
            self.remember(offset, &data);
            self.stream_next = Some(end);
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
    }

    fn on_scrollback(&mut self, attach_id: String, data: Bytes, (cols, rows): (u16, u16), offset: u64, resumed: bool) {
        self.grid.pty_resized(cols, rows);
        let live_at = if resumed { offset + data.len() as u64 } else { offset };
        if self.stream_next.is_none_or(|n| live_at >= n) {
            if self.stream_next != Some(live_at) {
                self.ring.clear();
                self.ring_len = 0;
            }
            if resumed && !data.is_empty() {
                self.stream_next = Some(offset);
                self.remember(offset, &data);
            }
            self.stream_next = Some(live_at);
        }
        for id in self.awaiting(&attach_id) {
            let size = self.size_for(id);
            let Some(Member { kind, phase, resume_from }) = self.members.get_mut(&id) else { continue };
            *phase = Phase::Live { next: live_at };
            match kind {
                Kind::Viewer(r, _) => {
                    if resumed {
                        r.do_send(ViewerOut::Text(json!({"type": "resume", "offset": offset}).to_string()));
                        if !data.is_empty() {
                            r.do_send(ViewerOut::Binary(data.clone()));
                        }
                    } else {
                        r.do_send(ViewerOut::Text(
                            json!({"type": "replay", "cols": cols, "rows": rows, "offset": offset}).to_string(),
                        ));
                        r.do_send(ViewerOut::Binary(data.clone()));
                        r.do_send(ViewerOut::Text(json!({"type": "live", "offset": offset}).to_string()));
                    }
                    r.do_send(size);
                }
                Kind::Capture { pending, .. } => {
                    if resumed && Some(offset) == *resume_from {
                        pending.extend_from_slice(&data);
                    } else {
                        // The daemon no longer had the bytes since the log's end.
                        tracing::warn!(terminal_id = %self.terminal_id, "tether_run_log_gap");
                    }
                }
            }
        }
    }

    fn flush_capture(&mut self, ctx: &mut Context<Self>) {
        if self.flushing {
            return;
        }
        let Some(Member { kind: Kind::Capture { run_id, pending, logged }, .. }) = self.members.get_mut(&CAPTURE)
        else {
            return;
        };
        let finish = self.finish.take();
        if pending.is_empty() && finish.is_none() {
            return;
        }
        let data = std::mem::take(pending);
        *logged += data.len() as u64;
        let run_id = *run_id;
        let store = self.store.clone();
        let max = self.config.run_log_max_bytes;
        self.flushing = true;
        async move {
            if !data.is_empty() {
                if let Err(e) = store.append_run_log(run_id, &data, max).await {
                    tracing::error!(error = %e, %run_id, "tether_run_log_write_failed");
                }
            }
            if let Some((state, code)) = finish {
                if let Err(e) = store.finish_run(run_id, state, code).await {
                    tracing::error!(error = %e, %run_id, "tether_run_finish_failed");
                }
            }
            finish.is_some()
        }
        .into_actor(self)
        .map(|finished, act, ctx| {
            act.flushing = false;
            if finished {
                act.members.remove(&CAPTURE);
                act.maybe_idle(ctx);
            } else if act.finish.is_some() {
                act.flush_capture(ctx);
            }
        })
        .wait(ctx);
    }

    fn maybe_idle(&mut self, ctx: &mut Context<Self>) {
        if !self.members.is_empty() || self.retiring {
            return;
        }
        self.retiring = true;
        if let Some(stream) = &self.stream {
            stream.conn.do_send(DetachArbiter { terminal_id: self.terminal_id, arbiter: ctx.address() });
        }
        self.registry.do_send(ArbiterIdle { terminal_id: self.terminal_id, arbiter: ctx.address() });
    }

    /// Members waiting for the Scrollback of `attach_id`.
    fn awaiting(&self, attach_id: &str) -> Vec<u64> {
        self.members
            .iter()
            .filter(|(_, m)| matches!(&m.phase, Phase::Awaiting(a) if a == attach_id))
            .map(|(id, _)| *id)
            .collect()
    }

    /// Drops a member and frees the grid if it held it.
    fn remove_member(&mut self, id: u64, ctx: &mut Context<Self>) {
        self.members.remove(&id);
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
        let viewers: Vec<u64> =
            self.members.iter().filter(|(_, m)| matches!(m.kind, Kind::Viewer(..))).map(|(id, _)| *id).collect();
        for id in viewers {
            self.send_to(id, ViewerOut::Close { code, reason: reason.to_string() });
            self.members.remove(&id);
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
        ctx.run_interval(Duration::from_millis(500), |act, ctx| act.flush_capture(ctx));
    }
}

impl Handler<Join> for TerminalArbiter {
    type Result = Result<(), Retired>;
    fn handle(&mut self, msg: Join, ctx: &mut Context<Self>) -> Self::Result {
        if self.retiring {
            return Err(Retired);
        }
        self.grid.join(msg.viewer, Instant::now());
        msg.out.do_send(self.status());
        // A resume the arbiter can serve itself needs no round trip.
        let mut phase = Phase::Waiting;
        if let (Some(from), Some(_)) = (msg.resume_from, &self.stream) {
            if let Some(bytes) = self.ring_since(from) {
                msg.out.do_send(ViewerOut::Text(json!({"type": "resume", "offset": from}).to_string()));
                if !bytes.is_empty() {
                    msg.out.do_send(ViewerOut::Binary(bytes));
                }
                phase = Phase::Live { next: self.stream_next.unwrap_or(from) };
            }
        }
        let out = msg.out.clone();
        self.members.insert(
            msg.viewer,
            Member { kind: Kind::Viewer(msg.out, msg.queued), phase, resume_from: msg.resume_from },
        );
        out.do_send(self.size_for(msg.viewer));
        if self.stream.is_none() {
            out.do_send(ViewerOut::Text(json!({"type": "error", "message": "host offline"}).to_string()));
        }
        self.attach_waiting(ctx);
        Ok(())
    }
}

impl Handler<CaptureRun> for TerminalArbiter {
    type Result = ();
    fn handle(&mut self, msg: CaptureRun, ctx: &mut Context<Self>) {
        if self.retiring || self.members.contains_key(&CAPTURE) {
            return;
        }
        let phase = msg.attach_id.map_or(Phase::Waiting, Phase::Awaiting);
        self.members.insert(
            CAPTURE,
            Member {
                kind: Kind::Capture { run_id: msg.run_id, pending: Vec::new(), logged: msg.logged },
                phase,
                resume_from: Some(msg.logged),
            },
        );
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
                let Some(stream) = &self.stream else {
                    self.send_to(
                        viewer,
                        ViewerOut::Text(json!({"type": "error", "message": "host offline"}).to_string()),
                    );
                    return;
                };
                if stream.daemon_queue.load(Ordering::Relaxed) > self.config.input_queue_limit {
                    self.send_to(viewer, ViewerOut::Close { code: close::POLICY, reason: "input overflow".into() });
                    self.remove_member(viewer, ctx);
                    self.maybe_idle(ctx);
                    return;
                }
                stream.conn.do_send(ToDaemon(server_frame::Frame::Input(crate::proto::v1::Input {
                    terminal_id: self.terminal_id.to_string(),
                    data,
                })));
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
            StreamEvent::AttachError { attach_id, message } => {
                for id in self.awaiting(&attach_id) {
                    self.send_to(id, ViewerOut::Text(json!({"type": "error", "message": message}).to_string()));
                    if let Some(m) = self.members.get_mut(&id) {
                        m.phase = Phase::Refused;
                    }
                }
            }
            StreamEvent::Size { cols, rows } => {
                self.grid.pty_resized(cols, rows);
                self.broadcast_sizes();
            }
        }
    }
}

impl Handler<OutputChunk> for TerminalArbiter {
    type Result = ResponseActFuture<Self, ()>;

    fn handle(&mut self, msg: OutputChunk, ctx: &mut Context<Self>) -> Self::Result {
        self.on_output(msg.offset, msg.data, ctx);
        let soft = self.config.soft_queue_bytes;
        let behind: Vec<(u64, Arc<AtomicUsize>)> = self
            .members
            .iter()
            .filter_map(|(id, m)| match &m.kind {
                Kind::Viewer(_, queued) if queued.load(Ordering::Relaxed) > soft => Some((*id, queued.clone())),
                _ => None,
            })
            .collect();
        if behind.is_empty() {
            return Box::pin(actix::fut::ready(()));
        }
        // Not atomic: the arbiter keeps serving joins, views and leaves
        // while the stream waits for its slowest viewers.
        let deadline = tokio::time::Instant::now() + self.config.slow;
        Box::pin(
            async move {
                loop {
                    let lagging: Vec<u64> =
                        behind.iter().filter(|(_, q)| q.load(Ordering::Relaxed) > soft).map(|(id, _)| *id).collect();
                    if lagging.is_empty() || tokio::time::Instant::now() >= deadline {
                        return lagging;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
            .into_actor(self)
            .map(|lagging, act, ctx| {
                for id in lagging {
                    tracing::info!(terminal_id = %act.terminal_id, "tether_viewer_too_slow");
                    act.send_to(id, ViewerOut::Evict { code: close::POLICY, reason: "too slow a reader".into() });
                    act.remove_member(id, ctx);
                }
                act.maybe_idle(ctx);
            }),
        )
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
                self.broadcast(&ViewerOut::Text(json!({"type": "error", "message": message}).to_string()));
                self.close_viewers(close::NORMAL, "terminal failed to start");
                self.members.remove(&CAPTURE);
                self.maybe_idle(ctx);
            }
            LifecycleEvent::Exited { status, snapshot } => {
                self.state = Some(TerminalState::Exited);
                // Members still waiting for a snapshot get the final screen.
                if let Some((data, cols, rows)) = snapshot {
                    for m in self.members.values() {
                        if !matches!(m.phase, Phase::Live { .. }) {
                            if let Kind::Viewer(r, _) = &m.kind {
                                r.do_send(ViewerOut::Text(
                                    json!({"type": "size", "cols": cols, "rows": rows, "yours": false}).to_string(),
                                ));
                                r.do_send(ViewerOut::Binary(data.clone()));
                            }
                        }
                    }
                }
                self.broadcast(&ViewerOut::Text(json!({"type": "exit", "exitCode": status.code}).to_string()));
                self.close_viewers(close::NORMAL, "terminal exited");
                if self.members.contains_key(&CAPTURE) {
                    let state = if status.code == Some(0) { RunState::Succeeded } else { RunState::Failed };
                    self.finish = Some((state, status.code));
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
        self.stream = Some(Stream { conn: msg.conn, daemon_queue: msg.daemon_queue });
        self.stream_next = None;
        let store = self.store.clone();
        let id = self.terminal_id;
        // Reconciliation may have changed the row while the host was away.
        async move { store.terminal_by_id(id).await }
            .into_actor(self)
            .map(|row, act, ctx| {
                if let Ok(Some(t)) = row {
                    act.state = Some(t.state);
                }
                act.broadcast(&act.status());
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
        self.stream_next = None;
        self.ring.clear();
        self.ring_len = 0;
        self.close_viewers(close::HOST_GONE, "host disconnected");
        if let Some(m) = self.members.get_mut(&CAPTURE) {
            m.phase = Phase::Waiting;
            if let Kind::Capture { logged, pending, .. } = &m.kind {
                m.resume_from = Some(*logged + pending.len() as u64);
            }
        }
        self.maybe_idle(ctx);
    }
}

impl Handler<Retire> for TerminalArbiter {
    type Result = ();
    fn handle(&mut self, _: Retire, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

/// A unique viewer id within this process (0 is the run capture).
pub fn next_viewer_id() -> u64 {
    static NEXT: AtomicUsize = AtomicUsize::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed) as u64
}
