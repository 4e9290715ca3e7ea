//! `Viewer`: one actor per viewer socket (docs/PROTOCOL.md, "Viewer protocol").
//!
//! It parses the client's JSON and binary frames into typed messages for the
//! terminal's arbiter, and writes what the arbiter sends through a bounded
//! outbound queue: a client that stops reading is closed 1008 and never
//! grows the server's memory. An exited terminal is answered from the store
//! (status, size, final snapshot, exit) without an arbiter.
//!
//! A viewer of a token that is not `full` is read-only (docs/PROTOCOL.md,
//! "Read-only viewers"): its input, resize and view messages never leave
//! this actor, so it never types and never holds the grid. Every viewer is
//! told what it may do first (`access`), and a read-only one is told again
//! once per kind of message it sends anyway. Its socket is watched under its token's id and
//! closed 4401 when the token is revoked or expires (`token_watch`).

use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use actix::prelude::*;
use actix_ws::{AggregatedMessage, AggregatedMessageStream, ProtocolError};
use bytes::Bytes;

use super::ended::ended_messages;
use super::frame_guard::failure;
use super::limiter::AddressGuard;
use super::outbox::{Frame, Outbox};
use super::registry::OpenTerminal;
use super::remote::HomeViewer;
use super::requests::{locate, Location};
use super::token_watch::{TokenRevoked, Watched};
use super::*;
use crate::audit::{Subject, Throttle};
use crate::auth::Principal;
use crate::store::{host_lease_key, AuditAction, Terminal, TerminalState};
use crate::viewer_protocol::{ClientMessage, ServerMessage};

/// The largest outbound queue any viewer reached, in bytes (for /metrics).
pub static QUEUE_HIGH_WATER: AtomicUsize = AtomicUsize::new(0);

/// What a viewer joined.
enum Joined {
    /// The terminal's arbiter here, and the member id it gave this viewer.
    Here(Recipient<FromViewer>, u64),
    /// The host's owner is this other instance.
    Remote(String),
    /// The terminal ended meanwhile: its row as it is now.
    Ended(Box<Terminal>),
    /// The terminal has as many viewers as it takes.
    Full,
}

pub struct Viewer {
    relay: RelayContext,
    terminal: Terminal,
    resume_from: Option<u64>,
    outbox: Outbox,
    stream: Option<AggregatedMessageStream>,
    /// The terminal's arbiter here, or the home proxy of a remote one,
    /// with the id it knows this viewer by; none until joined.
    target: Option<(Recipient<FromViewer>, u64)>,
    closed_by_arbiter: bool,
    /// The `attach` was recorded: once the terminal took the viewer (a
    /// viewer refused for the terminal's viewer cap never attached), and
    /// only then is its `detach` recorded.
    attached: bool,
    /// `input` and `resize` are audited at most once a minute each.
    audit_input: Throttle,
    audit_resize: Throttle,
    /// Input, resize and view stay here (docs/PROTOCOL.md, "Read-only viewers").
    read_only: bool,
    /// The kinds of message a read-only viewer was already told about.
    told_read_only: Vec<&'static str>,
    principal: Principal,
    watched: Option<Watched>,
    _guard: AddressGuard,
}

/// What a read-only viewer is told, once per kind, when it sends `kind`.
pub fn read_only_message(kind: &str) -> String {
    format!("read-only: this token may watch this terminal but not {kind}")
}

impl Viewer {
    pub fn new(
        relay: RelayContext,
        principal: Principal,
        terminal: Terminal,
        resume_from: Option<u64>,
        outbox: Outbox,
        stream: AggregatedMessageStream,
        guard: AddressGuard,
    ) -> Self {
        Self {
            relay,
            terminal,
            resume_from,
            outbox,
            stream: Some(stream),
            target: None,
            closed_by_arbiter: false,
            attached: false,
            audit_input: Throttle::default(),
            audit_resize: Throttle::default(),
            read_only: principal.read_only(),
            told_read_only: Vec::new(),
            principal,
            watched: None,
            _guard: guard,
        }
    }

    /// True when the message may go on; a read-only viewer's is dropped
    /// (and the viewer told, the first time for each kind).
    fn may_control(&mut self, kind: &'static str, ctx: &mut Context<Self>) -> bool {
        if !self.read_only {
            return true;
        }
        if !self.told_read_only.contains(&kind) {
            self.told_read_only.push(kind);
            self.push(Frame::Text(ServerMessage::error(read_only_message(kind)).to_json()), ctx);
        }
        false
    }

    fn push(&mut self, frame: Frame, ctx: &mut Context<Self>) {
        if self.outbox.push(frame).is_err() {
            self.too_slow(ctx);
        }
    }

    fn too_slow(&mut self, ctx: &mut Context<Self>) {
        tracing::info!(terminal_id = %self.terminal.id, "tether_viewer_too_slow");
        metrics::counter!("tether_viewer_slow_closed_total").increment(1);
        self.outbox.abort(close::POLICY, crate::viewer_protocol::TOO_SLOW_A_READER);
        ctx.stop();
    }

    fn close(&mut self, code: u16, reason: &str, ctx: &mut Context<Self>) {
        self.outbox.close(code, reason);
        ctx.stop();
    }

    /// An exited or failed terminal: status (with the host's live state,
    /// from its lease as the REST API reads it), size, final snapshot, exit.
    fn replay_ended(&mut self, ctx: &mut Context<Self>) {
        let store = self.relay.store.clone();
        let id = self.terminal.id;
        let lease = [host_lease_key(self.terminal.host_id)];
        async move {
            let snapshot = store.get_snapshot(id).await.ok().flatten();
            let host_online = store.lease_holders(&lease).await.is_ok_and(|live| !live.is_empty());
            (snapshot, host_online)
        }
        .into_actor(self)
        .map(|(snapshot, host_online), act, ctx| {
            for message in ended_messages(&act.terminal, snapshot, host_online) {
                match message {
                    ViewerOut::Binary(data) => act.push(Frame::Binary(data), ctx),
                    ViewerOut::Text(text) => act.push(Frame::Text(text), ctx),
                    _ => {}
                }
            }
            act.close(close::NORMAL, "terminal ended", ctx);
        })
        .wait(ctx);
    }

    /// Joins the terminal's arbiter on this instance, or, when another
    /// instance holds the host, a home proxy that joins there.
    fn join(&mut self, attempt: u32, ctx: &mut Context<Self>) {
        let relay = self.relay.clone();
        let open = OpenTerminal { terminal_id: self.terminal.id, host_id: self.terminal.host_id };
        let out = ViewerSink::local(ctx.address().recipient::<ViewerOut>(), &self.outbox);
        let join = Join {
            out,
            queued: self.outbox.queued_counter(),
            resume_from: self.resume_from,
            read_only: self.read_only,
        };
        let terminal_id = open.terminal_id;
        async move {
            if let Ok(Location::Remote(owner)) = locate(&relay, open.host_id).await {
                return Some(Ok(Joined::Remote(owner)));
            }
            let arbiter = relay.registry.send(open).await.ok()?;
            match arbiter.join(join).await {
                Ok(member) => Some(Ok(Joined::Here(arbiter.viewer_recipient(), member))),
                Err(NotJoined::Ended) => match relay.store.terminal_by_id(terminal_id).await {
                    Ok(Some(row)) => Some(Ok(Joined::Ended(Box::new(row)))),
                    _ => None,
                },
                Err(NotJoined::Full) => Some(Ok(Joined::Full)),
                Err(NotJoined::Retired) => Some(Err(())),
            }
        }
        .into_actor(self)
        .map(move |joined, act, ctx| match joined {
            Some(Ok(Joined::Here(arbiter, member))) => {
                act.record_attach();
                act.target = Some((arbiter, member));
            }
            Some(Ok(Joined::Full)) => act.close(close::TOO_MANY, "too many viewers of this terminal", ctx),
            Some(Ok(Joined::Ended(row))) => {
                act.record_attach();
                act.terminal = *row;
                act.replay_ended(ctx);
            }
            Some(Ok(Joined::Remote(owner))) => {
                let home = HomeViewer::new(
                    act.relay.clone(),
                    &act.terminal,
                    owner,
                    act.resume_from,
                    act.read_only,
                    ctx.address().recipient(),
                    act.outbox.queued_counter(),
                );
                let key = home.key();
                act.target = Some((home.start().recipient(), key));
            }
            Some(Err(())) if attempt < 20 => act.join(attempt + 1, ctx),
            _ => act.close(close::INTERNAL, "could not join the terminal", ctx),
        })
        .wait(ctx);
    }

    fn record_attach(&mut self) {
        if !self.attached {
            self.attached = true;
            self.audit(AuditAction::Attach, None);
        }
    }

    /// Records an event about this viewer's terminal.
    fn audit(&self, action: AuditAction, detail: Option<String>) {
        let subject = Subject { detail, ..Subject::terminal(self.terminal.host_id, self.terminal.id) }
            .by(self.principal.token_id);
        self.relay.audit.record(self.terminal.user_id, action, subject);
    }

    fn input(&mut self, data: Bytes) {
        if self.audit_input.due(std::time::Instant::now()) {
            self.audit(AuditAction::Input, None);
        }
        self.to_arbiter(|viewer| FromViewer::Input { viewer, data });
    }

    /// Sends the message `make` builds for this viewer's id to its target
    /// (nothing before the join).
    fn to_arbiter(&self, make: impl FnOnce(u64) -> FromViewer) {
        if let Some((target, viewer)) = &self.target {
            target.do_send(make(*viewer));
        }
    }

    fn on_text(&mut self, text: &str, ctx: &mut Context<Self>) {
        match crate::json_input::parse::<ClientMessage>(text.as_bytes()) {
            Ok(ClientMessage::Input { .. }) if !self.may_control("send input", ctx) => {}
            Ok(ClientMessage::Resize { .. }) if !self.may_control("resize it", ctx) => {}
            Ok(ClientMessage::View { .. }) if !self.may_control("claim its grid", ctx) => {}
            Ok(ClientMessage::Input { data }) => self.input(Bytes::from(data.into_bytes())),
            Ok(ClientMessage::Resize { cols, rows }) => {
                if self.audit_resize.due(std::time::Instant::now()) {
                    self.audit(AuditAction::Resize, Some(format!("{}x{}", cols.0, rows.0)));
                }
                self.to_arbiter(|viewer| FromViewer::Resize { viewer, cols: cols.0, rows: rows.0 });
            }
            Ok(ClientMessage::View { cols, rows, visible, idle_ms, open }) => {
                let view = ViewReport { cols: cols.0, rows: rows.0, visible, idle_ms, open };
                self.to_arbiter(|viewer| FromViewer::View { viewer, view });
            }
            Ok(ClientMessage::Ping) => {
                self.push(Frame::Text(ServerMessage::Pong.to_json()), ctx);
                self.to_arbiter(|viewer| FromViewer::Pong { viewer });
            }
            Err(e) => {
                let message = format!("bad message: {e}");
                self.push(Frame::Text(ServerMessage::error(message).to_json()), ctx);
                self.close(close::POLICY, "bad message", ctx);
            }
        }
    }
}

impl Actor for Viewer {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        metrics::gauge!("tether_viewer_connections").increment(1.0);
        self.watched = Some(self.relay.tokens.watch(self.principal.token_id, ctx.address().recipient()));
        // First of all, so a client can say "read-only" before anyone types.
        self.push(Frame::Text(ServerMessage::Access { read_only: self.read_only }.to_json()), ctx);
        if let Some(stream) = self.stream.take() {
            ctx.add_stream(stream);
        }
        if matches!(self.terminal.state, TerminalState::Exited | TerminalState::Error) {
            self.record_attach();
            self.replay_ended(ctx);
            return;
        }
        self.join(0, ctx);
        // Keepalive for proxies and dead-peer detection.
        ctx.run_interval(Duration::from_secs(30), |act, ctx| act.push(Frame::Ping(Bytes::new()), ctx));
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        metrics::gauge!("tether_viewer_connections").decrement(1.0);
        if self.attached {
            self.audit(AuditAction::Detach, None);
        }
        if !self.closed_by_arbiter {
            self.to_arbiter(|viewer| FromViewer::Leave { viewer });
        }
    }
}

impl StreamHandler<Result<AggregatedMessage, ProtocolError>> for Viewer {
    fn handle(&mut self, msg: Result<AggregatedMessage, ProtocolError>, ctx: &mut Context<Self>) {
        match msg {
            Ok(AggregatedMessage::Text(text)) => self.on_text(&text, ctx),
            Ok(AggregatedMessage::Binary(data)) => {
                if self.may_control("send input", ctx) {
                    self.input(data);
                }
            }
            Ok(AggregatedMessage::Ping(data)) => {
                self.push(Frame::Pong(data), ctx);
                self.to_arbiter(|viewer| FromViewer::Pong { viewer });
            }
            Ok(AggregatedMessage::Pong(_)) => self.to_arbiter(|viewer| FromViewer::Pong { viewer }),
            Ok(AggregatedMessage::Close(reason)) => {
                self.outbox.answer_close(reason.as_ref());
                ctx.stop();
            }
            Err(e) => match failure(&e) {
                Some((code, reason)) => self.close(code, reason, ctx),
                None => ctx.stop(),
            },
        }
    }

    fn finished(&mut self, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

impl Handler<TokenRevoked> for Viewer {
    type Result = ();
    fn handle(&mut self, _: TokenRevoked, ctx: &mut Context<Self>) {
        tracing::info!(terminal_id = %self.terminal.id, token_id = %self.principal.token_id, "tether_viewer_token_revoked");
        self.close(close::BAD_TOKEN, "token revoked or expired", ctx);
    }
}

impl Handler<ViewerOut> for Viewer {
    type Result = ();
    fn handle(&mut self, msg: ViewerOut, ctx: &mut Context<Self>) {
        match msg {
            ViewerOut::TooSlow => self.too_slow(ctx),
            ViewerOut::Close { code, reason } => {
                self.closed_by_arbiter = true;
                self.close(code, &reason, ctx);
            }
            ViewerOut::Evict { code, reason } => {
                self.closed_by_arbiter = true;
                metrics::counter!("tether_viewer_slow_closed_total").increment(1);
                self.outbox.abort(code, &reason);
                ctx.stop();
            }
            // A home proxy's frames (a local arbiter queues its own): the
            // owner took the viewer, or the home tells it the host is
            // offline and it waits, as a local arbiter's viewer would.
            frame => {
                self.record_attach();
                if matches!(frame.queue_on(&self.outbox), Delivery::Overflow) {
                    self.too_slow(ctx);
                }
            }
        }
    }
}

/// Starts a viewer actor for an upgraded socket.
pub fn start(
    relay: RelayContext,
    principal: Principal,
    terminal: Terminal,
    resume_from: Option<u64>,
    outbox: Outbox,
    stream: AggregatedMessageStream,
    guard: AddressGuard,
) -> Addr<Viewer> {
    Viewer::new(relay, principal, terminal, resume_from, outbox, stream, guard).start()
}
