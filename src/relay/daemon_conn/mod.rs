//! `DaemonConn`: one actor per daemon socket (docs/PROTOCOL.md, "What the
//! server enforces").
//!
//! Split by job: [`reader`] feeds frames in order, [`hello`] admits and
//! claims the host, [`frames`] applies what the daemon sends after that,
//! [`requests`] pairs requests with the daemon's answers, [`writes`] keeps
//! what the database could not take yet and retries it in order,
//! [`input_flow`] keeps each terminal's Input within the daemon's window.
//!
//! A reader task decodes frames and hands them to the actor one at a time,
//! waiting for each to be handled, so frames of one connection are applied
//! strictly in order and a fast daemon is slowed by TCP rather than
//! buffered. Until the hello is done, frames are held (at most 256 frames /
//! 4 MiB, else 1008). The socket is closed 4401 when its token is revoked or
//! expires (`token_watch`). The hello checks the host (and a daemon token's
//! binding to one host), registers with the
//! `HostRegistry` (newest wins), seizes the lease, reconciles terminal rows,
//! acknowledges, then spawns parked terminals.
//!
//! Every write this actor makes is scoped by host id and compares state
//! (see `store`), so a late frame can never overwrite a newer fact.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use actix_ws::{AggregatedMessage, AggregatedMessageStream, ProtocolError};
use bytes::Bytes;
use futures_util::StreamExt;
use prost::Message as _;
use tokio::sync::oneshot;
use uuid::Uuid;

pub mod frames;
mod hello;
mod input_flow;
pub mod reader;
mod requests;
mod writes;

use super::limiter::AddressGuard;
use super::outbox::{Frame, Outbox};
use super::registry::{HostRegistry, OpenTerminal, Ready, Register, TerminalLifecycle, Unregister};
use super::token_watch::{TokenRevoked, Watched};
use super::*;
use crate::auth::Principal;
use crate::cell::admission::Prefetched;
use crate::proto::v1::{daemon_frame, server_frame, DaemonFrame, ServerFrame};
use crate::store::{Capabilities, ExitStatus, LeaseHolder, RunState, RunUsage, StoreError, TerminalState};
use input_flow::InputFlow;
use reader::read_loop;
use writes::{Outcome, Write, WriteQueue};

/// Frames held before the hello is done (docs/PROTOCOL.md, "What the server enforces").
const EARLY_FRAMES: usize = 256;
const EARLY_BYTES: usize = 4 * 1024 * 1024;
/// The close reason of a daemon whose outbound queue is full.
const NOT_READING: &str = "daemon is not reading";

/// Bytes queued towards a daemon before it counts as not reading.
pub const OUTBOUND_LIMIT: usize = 8 * 1024 * 1024;

/// A server frame as the outbox sends it.
fn encoded(frame: server_frame::Frame) -> Frame {
    Frame::Binary(Bytes::from(ServerFrame { frame: Some(frame) }.encode_to_vec()))
}

/// The host this connection serves, once its hello was accepted.
struct HostSession {
    host_id: Uuid,
    conn_no: u64,
    holder: LeaseHolder,
    ready: bool,
    capabilities: Capabilities,
    /// The host's bus channel is subscribed for this connection.
    subscribed: bool,
}

/// What the connection knows of a terminal its host owns.
#[derive(Default)]
struct Owned {
    run_id: Option<Uuid>,
    final_snapshot: Option<(Bytes, u16, u16)>,
    /// Its process runs (Started came, or the hello reported it): a
    /// SpawnError for it is out of place and changes nothing.
    started: bool,
    /// Its Exit came (a run's terminal is kept for the Usage behind it).
    exited: bool,
    /// The PTY's grid as last stored. A Scrollback that shows another one
    /// is stored too: a Size the daemon sent on a connection that died
    /// before it arrived is never heard otherwise.
    size: Option<(u16, u16)>,
}

pub struct DaemonConn {
    relay: RelayContext,
    /// The token that opened the socket: its user owns the host, a daemon
    /// token is bound to one host (docs/PROTOCOL.md, "What the server enforces").
    principal: Principal,
    /// The token's bound host as the upgrade read it, for the hello's
    /// admission (boxed: it lives only until the hello).
    bound_host: Option<Box<Prefetched>>,
    watched: Option<Watched>,
    outbox: Outbox,
    stream: Option<AggregatedMessageStream>,
    host: Option<HostSession>,
    owned: HashMap<Uuid, Owned>,
    attached: HashMap<Uuid, ArbiterLink>,
    pending: HashMap<String, (DaemonRequestKind, oneshot::Sender<Result<DaemonAnswer, RequestError>>)>,
    /// Dirs requests that timed out, newest last, at most
    /// `requests::OVERDUE_DIRS`: their late answers are still recorded.
    overdue_dirs: Vec<String>,
    /// When it last received a frame; the registry closes it after
    /// `daemon.idle_timeout_ms` of silence.
    heard: Heard,
    closed: bool,
    /// The close code this side sent, for the cell's seat (docs/CELLS.md,
    /// "Admission": a host closed 4409 is not remembered).
    close_code: Option<u16>,
    /// The hello was accepted and the cell seated the host.
    seated: bool,
    /// Writes the database could not take yet, retried in order (`writes`).
    writes: WriteQueue,
    /// The next retry of `writes`, while one is waiting.
    write_retry: Option<SpawnHandle>,
    /// Input waiting for the daemon to report what it took, per terminal
    /// (a daemon with `input_flow_control` only).
    input_flow: InputFlow,
    _guard: AddressGuard,
}

impl DaemonConn {
    pub fn new(
        relay: RelayContext,
        principal: Principal,
        bound_host: Option<Prefetched>,
        outbox: Outbox,
        stream: AggregatedMessageStream,
        guard: AddressGuard,
    ) -> Self {
        Self {
            relay,
            principal,
            bound_host: bound_host.map(Box::new),
            watched: None,
            outbox,
            stream: Some(stream),
            host: None,
            owned: HashMap::new(),
            attached: HashMap::new(),
            pending: HashMap::new(),
            overdue_dirs: Vec::new(),
            heard: Heard::now(),
            closed: false,
            close_code: None,
            seated: false,
            writes: WriteQueue::default(),
            write_retry: None,
            input_flow: InputFlow::default(),
            _guard: guard,
        }
    }

    fn send(&mut self, frame: server_frame::Frame, ctx: &mut Context<Self>) {
        if self.outbox.push(encoded(frame)).is_err() {
            tracing::warn!("tether_daemon_not_reading");
            // What is queued will not be read: the close goes first.
            self.outbox.abort(close::POLICY, NOT_READING);
            self.close(close::POLICY, NOT_READING, ctx);
        }
    }

    fn close(&mut self, code: u16, reason: &str, ctx: &mut Context<Self>) {
        if !self.closed {
            self.closed = true;
            self.close_code = Some(code);
            self.outbox.close(code, reason);
        }
        ctx.stop();
    }

    /// Stores what a frame reported now, or keeps it behind writes the
    /// database has not taken yet; resolves once that is decided, never
    /// waiting out an outage (docs/OPERATIONS.md, "Faults").
    fn store(&mut self, write: Write) -> ResponseActFuture<Self, Outcome> {
        let write = write.owed_to(&self.relay.writes);
        if self.writes.busy() {
            tracing::debug!(what = write.what, "tether_daemon_write_queued");
            self.writes.keep(write);
            return Box::pin(actix::fut::ready(Outcome::Kept));
        }
        let store = self.relay.store.clone();
        let attempt = async move {
            let outcome = writes::attempt(store, &write).await;
            (write, outcome)
        };
        Box::pin(attempt.into_actor(self).map(|(write, outcome), act, ctx| {
            if let Outcome::Kept = outcome {
                act.writes.keep(write);
                act.retry_writes_later(ctx);
            }
            outcome
        }))
    }

    fn retry_writes_later(&mut self, ctx: &mut Context<Self>) {
        if self.write_retry.is_none() {
            self.write_retry = Some(ctx.run_later(self.writes.backoff(), |act, ctx| {
                act.write_retry = None;
                act.retry_writes(ctx);
            }));
        }
    }

    /// Retries the oldest kept write; after it is stored the next follows
    /// at once. Spawned, so frames keep flowing meanwhile.
    fn retry_writes(&mut self, ctx: &mut Context<Self>) {
        let Some(write) = self.writes.next() else { return };
        let store = self.relay.store.clone();
        async move { writes::attempt(store, &write).await }
            .into_actor(self)
            .map(|outcome, act, ctx| {
                act.writes.finished(&outcome);
                match outcome {
                    Outcome::Kept => act.retry_writes_later(ctx),
                    Outcome::Stored | Outcome::Failed => act.retry_writes(ctx),
                }
            })
            .spawn(ctx);
    }

    fn host_id(&self) -> Option<Uuid> {
        self.host.as_ref().filter(|h| h.ready).map(|h| h.host_id)
    }

    /// The flow-control window for a new Attach, if the daemon supports it.
    fn window(&self) -> Option<u64> {
        let flow_control = self.host.as_ref().is_some_and(|h| h.capabilities.flow_control);
        flow_control.then_some(self.relay.settings.daemon.window_bytes)
    }

    /// Claims `pending -> launching` and sends Spawn; resolves to whether
    /// this connection sent it. A run's terminal gets its output capture
    /// attached right behind the Spawn, so no byte escapes the log.
    fn spawn_terminal(&mut self, terminal: crate::store::Terminal) -> ResponseActFuture<Self, bool> {
        let Some(host_id) = self.host_id().filter(|h| *h == terminal.host_id) else {
            return Box::pin(actix::fut::ready(false));
        };
        let store = self.relay.store.clone();
        let registry = self.relay.registry.clone();
        let id = terminal.id;
        let run_id = terminal.run_id;
        let claim = async move {
            if !store.claim_launch(host_id, id).await? {
                return Ok(None); // claimed elsewhere, or no longer pending
            }
            let Some(run_id) = run_id else { return Ok(Some(None)) };
            // The registry answers at once; the arbiter is never awaited.
            let Ok(arbiter) = registry.send(OpenTerminal { terminal_id: id, host_id }).await else {
                return Ok(Some(None));
            };
            let attach_id = Uuid::new_v4().to_string();
            // Queued before the Scrollback can reach the arbiter (one
            // mailbox, in order), so the capture is there to take it.
            arbiter.capture(CaptureRun { run_id, logged: 0, attach_id: Some(attach_id.clone()) });
            Ok(Some(Some((arbiter, attach_id))))
        };
        Box::pin(claim.into_actor(self).map(
            move |claimed: Result<_, crate::store::StoreError>, act, ctx| match claimed {
                Ok(Some(capture)) => {
                    act.owned.entry(id).or_default().run_id = terminal.run_id;
                    let spawn = crate::proto::v1::Spawn {
                        terminal_id: id.to_string(),
                        dir: terminal.dir.clone().unwrap_or_default(),
                        argv: terminal.argv.clone(),
                        cols: u32::from(terminal.cols),
                        rows: u32::from(terminal.rows),
                    };
                    act.send(server_frame::Frame::Spawn(spawn), ctx);
                    if let Some((arbiter, attach_id)) = capture {
                        let window = act.window();
                        let attach = AttachArbiter {
                            terminal_id: id,
                            attach_id,
                            resume_from: Some(0),
                            from_oldest: true,
                            window,
                            arbiter,
                        };
                        act.attach(attach, ctx);
                    }
                    true
                }
                Ok(None) => false,
                Err(e) => {
                    tracing::error!(error = %e, terminal_id = %id, "tether_spawn_claim_failed");
                    false
                }
            },
        ))
    }

    /// Reads the terminal's row, then spawns it as [`Self::spawn_terminal`]
    /// does; false for a terminal of another host or none at all.
    fn spawn_terminal_by_id(&mut self, terminal_id: Uuid) -> ResponseActFuture<Self, bool> {
        let store = self.relay.store.clone();
        let host_id = self.host_id();
        let load = async move { store.terminal_by_id(terminal_id).await };
        Box::pin(load.into_actor(self).then(move |row, act, _| match row {
            Ok(Some(terminal)) if Some(terminal.host_id) == host_id => act.spawn_terminal(terminal),
            Ok(_) => Box::pin(actix::fut::ready(false)),
            Err(e) => {
                tracing::error!(error = %e, %terminal_id, "tether_spawn_load_failed");
                Box::pin(actix::fut::ready(false))
            }
        }))
    }

    fn attach(&mut self, msg: AttachArbiter, ctx: &mut Context<Self>) {
        if !self.owned.contains_key(&msg.terminal_id) || self.host_id().is_none() {
            msg.arbiter.stream_event(StreamEvent::AttachError {
                attach_id: msg.attach_id,
                message: "the daemon has no such terminal".into(),
            });
            return;
        }
        self.attached.insert(msg.terminal_id, msg.arbiter);
        let attach = crate::proto::v1::Attach {
            terminal_id: msg.terminal_id.to_string(),
            attach_id: msg.attach_id,
            resume_from: msg.resume_from,
            from_oldest: msg.from_oldest.then_some(true),
            window: msg.window,
        };
        self.send(server_frame::Frame::Attach(attach), ctx);
    }

    fn arbiter_event(&self, terminal_id: Uuid, event: StreamEvent) {
        if let Some(arbiter) = self.attached.get(&terminal_id) {
            arbiter.stream_event(event);
        }
    }

    /// Starts the reader task that feeds frames to this actor in order.
    fn start_reader(&mut self, ctx: &mut Context<Self>) {
        let Some(stream) = self.stream.take() else { return };
        let addr = ctx.address();
        let outbox = self.outbox.clone();
        let hello_timeout = Duration::from_millis(self.relay.settings.daemon.hello_timeout_ms);
        actix_rt::spawn(read_loop(addr, stream, outbox, self.heard.clone(), hello_timeout));
    }
}

impl Actor for DaemonConn {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        metrics::gauge!("tether_daemon_connections").increment(1.0);
        self.watched = Some(self.relay.tokens.watch(self.principal.token_id, ctx.address().recipient()));
        self.start_reader(ctx);
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        metrics::gauge!("tether_daemon_connections").decrement(1.0);
        let kept = self.writes.take();
        if !kept.is_empty() {
            actix_rt::spawn(writes::drain(self.relay.store.clone(), kept));
        }
        for (_, (_, reply)) in self.pending.drain() {
            let _ = reply.send(Err(RequestError::Offline));
        }
        let Some(host) = self.host.take() else { return };
        if self.seated {
            let code = self.close_code.unwrap_or(close::NORMAL);
            self.relay.cell.seats().left(Instant::now(), host.host_id, host.conn_no, code);
        }
        let relay = self.relay.clone();
        if host.ready && self.close_code == Some(close::DRAINING) {
            // The instance is draining: it releases every host's lease in
            // one statement and exits (`server::drain`), instead of one
            // connection at a time. The channel still goes, so a request
            // for the host meanwhile finds nobody listening here.
            relay.registry.do_send(Unregister { host_id: host.host_id, conn_no: host.conn_no });
            if host.subscribed {
                actix_rt::spawn(async move { relay.bus.unsubscribe(&relay.bus.host_channel(host.host_id)).await });
            }
            return;
        }
        // Releases only this connection's own lease, batched with the other
        // connections that ended meanwhile (`super::releases`); owed from
        // now, so a drain starting meanwhile waits for it.
        let pending = relay.releases.ended(host.host_id, host.holder);
        actix_rt::spawn(async move {
            let _ = relay.registry.send(Unregister { host_id: host.host_id, conn_no: host.conn_no }).await;
            if host.subscribed {
                relay.bus.unsubscribe(&relay.bus.host_channel(host.host_id)).await;
            }
            pending.release();
        });
    }
}

/// The daemon's Hello; answers whether the connection is ready.
#[derive(Message)]
#[rtype(result = "bool")]
struct Hello(crate::proto::v1::Hello);

/// A frame after the hello.
#[derive(Message)]
#[rtype(result = "()")]
struct Inbound(DaemonFrame);

#[derive(Message)]
#[rtype(result = "()")]
struct Fail(u16, &'static str);

#[derive(Message)]
#[rtype(result = "()")]
struct SocketClosed;

impl Handler<Fail> for DaemonConn {
    type Result = ();
    fn handle(&mut self, msg: Fail, ctx: &mut Context<Self>) {
        tracing::info!(code = msg.0, reason = msg.1, "tether_daemon_closed");
        self.close(msg.0, msg.1, ctx);
    }
}

impl Handler<SocketClosed> for DaemonConn {
    type Result = ();
    fn handle(&mut self, _: SocketClosed, ctx: &mut Context<Self>) {
        self.closed = true;
        ctx.stop();
    }
}

impl Handler<CloseDaemon> for DaemonConn {
    type Result = ();
    fn handle(&mut self, msg: CloseDaemon, ctx: &mut Context<Self>) {
        tracing::info!(code = msg.code, reason = msg.reason, "tether_daemon_closed");
        self.close(msg.code, msg.reason, ctx);
    }
}

impl Handler<TokenRevoked> for DaemonConn {
    type Result = ();
    fn handle(&mut self, _: TokenRevoked, ctx: &mut Context<Self>) {
        tracing::info!(token_id = %self.principal.token_id, "tether_daemon_token_revoked");
        self.close(close::BAD_TOKEN, "token revoked or expired", ctx);
    }
}

impl Handler<ToDaemon> for DaemonConn {
    type Result = ();
    fn handle(&mut self, msg: ToDaemon, ctx: &mut Context<Self>) {
        let Some(host) = self.host.as_ref().filter(|h| h.ready) else { return };
        match msg.0 {
            server_frame::Frame::Input(input) if host.capabilities.input_flow_control => {
                if let Some(input) = self.input_flow.offer(input) {
                    self.send(server_frame::Frame::Input(input), ctx);
                }
            }
            frame => self.send(frame, ctx),
        }
    }
}

impl Handler<SpawnTerminal> for DaemonConn {
    type Result = AtomicResponse<Self, ()>;
    fn handle(&mut self, msg: SpawnTerminal, _: &mut Context<Self>) -> Self::Result {
        let sent = msg.sent;
        AtomicResponse::new(Box::pin(self.spawn_terminal_by_id(msg.terminal_id).map(move |spawned, _, _| {
            let _ = sent.send(spawned);
        })))
    }
}

impl Handler<AttachArbiter> for DaemonConn {
    type Result = ();
    fn handle(&mut self, msg: AttachArbiter, ctx: &mut Context<Self>) {
        self.attach(msg, ctx);
    }
}

impl Handler<DetachArbiter> for DaemonConn {
    type Result = ();
    fn handle(&mut self, msg: DetachArbiter, ctx: &mut Context<Self>) {
        if self.attached.get(&msg.terminal_id).is_some_and(|a| a.id == msg.arbiter) {
            self.attached.remove(&msg.terminal_id);
            let detach = crate::proto::v1::Detach { terminal_id: msg.terminal_id.to_string() };
            self.send(server_frame::Frame::Detach(detach), ctx);
        }
    }
}

/// Starts a connection actor for an upgraded daemon socket.
pub fn start(
    relay: RelayContext,
    principal: Principal,
    bound_host: Option<Prefetched>,
    outbox: Outbox,
    stream: AggregatedMessageStream,
    guard: AddressGuard,
) -> Addr<DaemonConn> {
    DaemonConn::new(relay, principal, bound_host, outbox, stream, guard).start()
}
