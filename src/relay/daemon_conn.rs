//! `DaemonConn`: one actor per daemon socket (docs/PROTOCOL.md, "What the
//! server enforces").
//!
//! A reader task decodes frames and hands them to the actor one at a time,
//! waiting for each to be handled, so frames of one connection are applied
//! strictly in order and a fast daemon is slowed by TCP rather than
//! buffered. Until the hello is done, frames are held (at most 256 frames /
//! 4 MiB, else 1008). The hello checks the host, registers with the
//! `HostRegistry` (newest wins), seizes the lease, reconciles terminal rows,
//! acknowledges, then spawns parked terminals.
//!
//! Every write this actor makes is scoped by host id and compares state
//! (see `store`), so a late frame can never overwrite a newer fact.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use actix::prelude::*;
use actix_ws::{AggregatedMessage, AggregatedMessageStream, ProtocolError};
use bytes::Bytes;
use futures_util::StreamExt;
use prost::Message as _;
use tokio::sync::oneshot;
use uuid::Uuid;

use super::arbiter::TerminalArbiter;
use super::limiter::AddressGuard;
use super::outbox::{Frame, Outbox};
use super::registry::{HostRegistry, OpenTerminal, Ready, Register, TerminalLifecycle, Unregister};
use super::*;
use crate::proto::v1::{daemon_frame, server_frame, DaemonFrame, ServerFrame};
use crate::store::{host_lease_key, Capabilities, ExitStatus, HostState, RunState, RunUsage, TerminalState};

/// Frames held before the hello is done (docs/PROTOCOL.md, "What the server enforces").
const EARLY_FRAMES: usize = 256;
const EARLY_BYTES: usize = 4 * 1024 * 1024;
/// Bytes queued towards a daemon before it counts as not reading.
const OUTBOUND_LIMIT: usize = 8 * 1024 * 1024;
/// A daemon pings every 30 s; three missed pings end the connection.
const IDLE_LIMIT: Duration = Duration::from_secs(95);

/// The host this connection serves, once its hello was accepted.
struct HostSession {
    host_id: Uuid,
    conn_no: u64,
    holder: String,
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
}

pub struct DaemonConn {
    relay: RelayContext,
    user_id: Uuid,
    outbox: Outbox,
    stream: Option<AggregatedMessageStream>,
    host: Option<HostSession>,
    owned: HashMap<Uuid, Owned>,
    attached: HashMap<Uuid, Addr<TerminalArbiter>>,
    pending: HashMap<String, (DaemonRequestKind, oneshot::Sender<Result<DaemonAnswer, RequestError>>)>,
    last_heard: Instant,
    closed: bool,
    _guard: AddressGuard,
}

impl DaemonConn {
    pub fn new(
        relay: RelayContext,
        user_id: Uuid,
        outbox: Outbox,
        stream: AggregatedMessageStream,
        guard: AddressGuard,
    ) -> Self {
        Self {
            relay,
            user_id,
            outbox,
            stream: Some(stream),
            host: None,
            owned: HashMap::new(),
            attached: HashMap::new(),
            pending: HashMap::new(),
            last_heard: Instant::now(),
            closed: false,
            _guard: guard,
        }
    }

    fn send(&mut self, frame: server_frame::Frame, ctx: &mut Context<Self>) {
        let bytes = ServerFrame { frame: Some(frame) }.encode_to_vec();
        if self.outbox.push(Frame::Binary(Bytes::from(bytes))).is_err() {
            tracing::warn!("tether_daemon_not_reading");
            self.close(close::POLICY, "daemon is not reading", ctx);
        }
    }

    fn close(&mut self, code: u16, reason: &str, ctx: &mut Context<Self>) {
        if !self.closed {
            self.closed = true;
            self.outbox.close(code, reason);
        }
        ctx.stop();
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
            arbiter.do_send(CaptureRun { run_id, logged: 0, attach_id: Some(attach_id.clone()) });
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
                        let attach =
                            AttachArbiter { terminal_id: id, attach_id, resume_from: Some(0), window, arbiter };
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

    fn attach(&mut self, msg: AttachArbiter, ctx: &mut Context<Self>) {
        if !self.owned.contains_key(&msg.terminal_id) || self.host_id().is_none() {
            msg.arbiter.do_send(StreamEvent::AttachError {
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
            window: msg.window,
        };
        self.send(server_frame::Frame::Attach(attach), ctx);
    }

    fn arbiter_event(&self, terminal_id: Uuid, event: StreamEvent) {
        if let Some(arbiter) = self.attached.get(&terminal_id) {
            arbiter.do_send(event);
        }
    }

    /// Starts the reader task that feeds frames to this actor in order.
    fn start_reader(&mut self, ctx: &mut Context<Self>) {
        let Some(stream) = self.stream.take() else { return };
        let addr = ctx.address();
        let outbox = self.outbox.clone();
        let hello_timeout = Duration::from_millis(self.relay.settings.daemon.hello_timeout_ms);
        actix_rt::spawn(read_loop(addr, stream, outbox, hello_timeout));
    }
}

/// A decoded frame, or why the reader stopped.
enum Read {
    Frame(DaemonFrame, usize),
    Closed,
    Fail(u16, &'static str),
    Skip,
}

fn decode(msg: Option<Result<AggregatedMessage, ProtocolError>>, outbox: &Outbox) -> Read {
    match msg {
        None | Some(Ok(AggregatedMessage::Close(_))) => Read::Closed,
        Some(Ok(AggregatedMessage::Binary(bytes))) => match DaemonFrame::decode(bytes.as_ref()) {
            Ok(frame) if frame.frame.is_some() => Read::Frame(frame, bytes.len()),
            _ => Read::Fail(close::POLICY, "malformed frame"),
        },
        Some(Ok(AggregatedMessage::Text(_))) => {
            Read::Fail(close::POLICY, "text frames are not part of the daemon protocol")
        }
        Some(Ok(AggregatedMessage::Ping(bytes))) => {
            let _ = outbox.push(Frame::Pong(bytes));
            Read::Skip
        }
        Some(Ok(AggregatedMessage::Pong(_))) => Read::Skip,
        Some(Err(ProtocolError::Overflow)) => Read::Fail(close::TOO_LARGE, "frame over 1 MiB"),
        Some(Err(_)) => Read::Closed,
    }
}

async fn read_loop(
    addr: Addr<DaemonConn>,
    mut stream: AggregatedMessageStream,
    outbox: Outbox,
    hello_timeout: Duration,
) {
    let deadline = tokio::time::Instant::now() + hello_timeout;
    let mut held: VecDeque<DaemonFrame> = VecDeque::new();
    let mut held_bytes = 0usize;
    let mut hello: Option<std::pin::Pin<Box<Request<DaemonConn, Hello>>>> = None;
    // Phase 1: until the hello is done, hold everything else.
    loop {
        let read = tokio::select! {
            accepted = async {
                match hello.as_mut() {
                    Some(pending) => pending.await,
                    None => std::future::pending().await,
                }
            }, if hello.is_some() => {
                match accepted {
                    Ok(true) => break,
                    _ => return, // refused: the actor closed the socket
                }
            }
            () = tokio::time::sleep_until(deadline), if hello.is_none() => {
                addr.do_send(Fail(close::NO_HELLO, "no hello in time"));
                return;
            }
            msg = stream.next() => decode(msg, &outbox),
        };
        match read {
            Read::Frame(frame, len) => {
                if hello.is_none() {
                    if let Some(daemon_frame::Frame::Hello(h)) = frame.frame {
                        hello = Some(Box::pin(addr.send(Hello(h))));
                        continue;
                    }
                }
                held_bytes += len;
                held.push_back(frame);
                if held.len() > EARLY_FRAMES || held_bytes > EARLY_BYTES {
                    addr.do_send(Fail(close::POLICY, "too many frames before the hello was done"));
                    return;
                }
            }
            Read::Skip => {}
            ended => return report_end(&addr, ended),
        }
    }
    // Phase 2: one frame at a time, each handled before the next is read.
    for frame in held {
        if addr.send(Inbound(frame)).await.is_err() {
            return;
        }
    }
    loop {
        match decode(stream.next().await, &outbox) {
            Read::Frame(frame, _) => {
                if addr.send(Inbound(frame)).await.is_err() {
                    return;
                }
            }
            Read::Skip => {}
            ended => return report_end(&addr, ended),
        }
    }
}

/// Tells the actor why the reader stopped.
fn report_end(addr: &Addr<DaemonConn>, read: Read) {
    match read {
        Read::Fail(code, reason) => addr.do_send(Fail(code, reason)),
        _ => addr.do_send(SocketClosed),
    }
}

impl Actor for DaemonConn {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        metrics::gauge!("tether_daemon_connections").increment(1.0);
        self.start_reader(ctx);
        ctx.run_interval(Duration::from_secs(30), |act, ctx| {
            if act.last_heard.elapsed() > IDLE_LIMIT {
                tracing::info!("tether_daemon_idle");
                act.close(close::POLICY, "no frame in 95 s", ctx);
            }
        });
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        metrics::gauge!("tether_daemon_connections").decrement(1.0);
        for (_, (_, reply)) in self.pending.drain() {
            let _ = reply.send(Err(RequestError::Offline));
        }
        let Some(host) = self.host.take() else { return };
        let relay = self.relay.clone();
        // Releases only this connection's own lease, and marks the host
        // offline only when no connection anywhere holds one.
        actix_rt::spawn(async move {
            let _ = relay.registry.send(Unregister { host_id: host.host_id, conn_no: host.conn_no }).await;
            if host.subscribed {
                relay.bus.unsubscribe(&relay.bus.host_channel(host.host_id)).await;
            }
            let key = host_lease_key(host.host_id);
            if let Err(e) = relay.store.release_lease(&key, &host.holder).await {
                tracing::warn!(error = %e, host_id = %host.host_id, "tether_lease_release_failed");
            }
            match relay.store.lease_holder(&key).await {
                Ok(None) => {
                    if let Err(e) = relay.store.set_host_state(host.host_id, HostState::Offline).await {
                        tracing::warn!(error = %e, "tether_host_state_failed");
                    }
                }
                Ok(Some(_)) => {}
                Err(e) => tracing::warn!(error = %e, "tether_lease_read_failed"),
            }
            tracing::info!(host_id = %host.host_id, "tether_daemon_disconnected");
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

/// What the hello established, applied back on the actor.
struct Accepted {
    capabilities: Capabilities,
    claim: Claim,
    live: Vec<crate::store::Terminal>,
    parked: Vec<crate::store::Terminal>,
    captures: Vec<(Uuid, Uuid, u64)>,
}

/// What a hello took before it could fail: cleaned up when the connection
/// stops (registry entry, bus subscription, and the lease if it was seized).
#[derive(Clone)]
struct Claim {
    conn_no: u64,
    holder: String,
    subscribed: bool,
}

/// Why a hello was refused.
struct Refused(u16, &'static str, Option<Claim>);

/// What the rest of the hello established once the host was claimed.
struct Taken {
    capabilities: Capabilities,
    live: Vec<crate::store::Terminal>,
    parked: Vec<crate::store::Terminal>,
    captures: Vec<(Uuid, Uuid, u64)>,
}

/// Seizes the lease (newest daemon wins), tells the previous owner, records
/// the hello and reconciles the host's terminal rows.
async fn take_host(
    relay: &RelayContext,
    host_id: Uuid,
    user_id: Uuid,
    holder: &str,
    hello: crate::proto::v1::Hello,
) -> Result<Taken, (u16, &'static str)> {
    let ttl = Duration::from_millis(relay.settings.lease.ttl_ms);
    let db = |_| (close::INTERNAL, "database error");
    relay.store.seize_lease(&host_lease_key(host_id), holder, ttl).await.map_err(db)?;
    // The previous owner, if any, re-reads the lease and lets its connection go.
    let taken = crate::proto::bus::HostTaken { host_id: host_id.to_string() };
    let channel = relay.bus.host_channel(host_id);
    if let Err(e) = relay.bus.publish(&channel, crate::proto::bus::envelope::Body::HostTaken(taken)).await {
        tracing::warn!(error = %e, %host_id, "tether_host_taken_publish_failed");
    }
    let caps = hello.capabilities.unwrap_or_default();
    let capabilities = Capabilities {
        manage_dirs: caps.manage_dirs,
        refresh_limits: caps.refresh_limits,
        credentials: caps.credentials,
        usage: caps.usage,
        flow_control: caps.flow_control,
    };
    relay.store.host_connected(host_id, &capabilities, &hello.dirs).await.map_err(db)?;
    let reported: Vec<Uuid> = hello.terminals.iter().filter_map(|t| Uuid::parse_str(&t.terminal_id).ok()).collect();
    let gone = relay.store.reconcile_terminals(host_id, &reported).await.map_err(db)?;
    for id in &gone {
        if let Some(run_id) = relay.store.terminal_by_id(*id).await.map_err(db)?.and_then(|t| t.run_id) {
            relay.store.finish_run(run_id, RunState::Failed, None).await.map_err(db)?;
        }
    }
    let filter = crate::store::TerminalFilter { host_id: Some(host_id), state: None };
    let all = relay.store.list_terminals(user_id, &filter).await.map_err(db)?;
    let live: Vec<_> = all.iter().filter(|t| t.state.is_live()).cloned().collect();
    let parked: Vec<_> = all.into_iter().filter(|t| t.state == TerminalState::Pending).collect();
    let mut captures = Vec::new();
    for t in live.iter().filter(|t| t.state == TerminalState::Running) {
        let Some(run_id) = t.run_id else { continue };
        let run = relay.store.get_run(user_id, run_id).await.map_err(db)?;
        if run.as_ref().is_some_and(|r| !r.state.is_final()) {
            let logged = relay.store.run_log(user_id, run_id).await.map_err(db)?.map_or(0, |l| l.len() as u64);
            captures.push((t.id, run_id, logged));
        }
    }
    Ok(Taken { capabilities, live, parked, captures })
}

/// Tells the homes of viewers that joined through a previous owner that
/// this instance holds the host now (docs/CLUSTER.md, "Failover"): each
/// closes its client 4503 at once instead of at its next heartbeat, and the
/// client reattaches through this instance.
async fn announce_takeover(relay: RelayContext, host_id: Uuid, terminals: Vec<Uuid>) {
    for terminal_id in terminals {
        let taken = crate::proto::bus::HostTaken { host_id: host_id.to_string() };
        let channel = relay.bus.terminal_channel(terminal_id);
        if let Err(e) = relay.bus.publish(&channel, crate::proto::bus::envelope::Body::HostTaken(taken)).await {
            tracing::warn!(error = %e, %terminal_id, "tether_takeover_announce_failed");
        }
    }
}

impl Handler<Hello> for DaemonConn {
    type Result = AtomicResponse<Self, bool>;

    fn handle(&mut self, msg: Hello, ctx: &mut Context<Self>) -> Self::Result {
        self.last_heard = Instant::now();
        let hello = msg.0;
        let relay = self.relay.clone();
        let user_id = self.user_id;
        let addr = ctx.address();
        let queue = self.outbox.queued_counter();
        let host_id = Uuid::parse_str(&hello.host_id).ok();
        let fut = async move {
            let host_id = host_id.ok_or(Refused(close::FORBIDDEN, "unknown host", None))?;
            let host =
                relay.store.host_by_id(host_id).await.map_err(|_| Refused(close::INTERNAL, "database error", None))?;
            if host.is_none_or(|h| h.user_id != user_id) {
                return Err(Refused(close::FORBIDDEN, "unknown or foreign host", None));
            }
            // Database admission (docs/ARCHITECTURE.md, "Cells"): a host placed on another cell
            // belongs there.
            let assignment =
                relay.store.assignment(host_id).await.map_err(|_| Refused(close::INTERNAL, "database error", None))?;
            if assignment.is_some_and(|(cell, _)| cell != relay.cell_id) {
                return Err(Refused(close::WRONG_CELL, "the host is assigned to another cell", None));
            }
            let conn_no = relay
                .registry
                .send(Register { host_id, conn: addr })
                .await
                .map_err(|_| Refused(close::INTERNAL, "registry unavailable", None))?;
            let holder = HostRegistry::holder(&relay.instance_id, conn_no);
            // Subscribe first, then seize (docs/CLUSTER.md): a request
            // published right after the seize finds this instance listening.
            let channel = relay.bus.host_channel(host_id);
            let subscribed = match relay.bus.subscribe(&channel).await {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(error = %e, %host_id, "tether_bus_subscribe_failed");
                    false
                }
            };
            let claim = Claim { conn_no, holder, subscribed };
            match take_host(&relay, host_id, user_id, &claim.holder, hello).await {
                Ok(t) => Ok(Accepted {
                    capabilities: t.capabilities,
                    claim,
                    live: t.live,
                    parked: t.parked,
                    captures: t.captures,
                }),
                Err((code, reason)) => Err(Refused(code, reason, Some(claim))),
            }
        };
        AtomicResponse::new(Box::pin(fut.into_actor(self).map(move |result, act, ctx| match result {
            Err(Refused(code, reason, claim)) => {
                tracing::info!(code, reason, "tether_daemon_hello_refused");
                if let (Some(claim), Some(host_id)) = (claim, host_id) {
                    act.host = Some(HostSession {
                        host_id,
                        conn_no: claim.conn_no,
                        holder: claim.holder,
                        ready: false,
                        capabilities: Capabilities::default(),
                        subscribed: claim.subscribed,
                    });
                }
                act.close(code, reason, ctx);
                false
            }
            Ok(accepted) => {
                let Some(host_id) = host_id else { return false };
                act.host = Some(HostSession {
                    host_id,
                    conn_no: accepted.claim.conn_no,
                    holder: accepted.claim.holder,
                    ready: false,
                    capabilities: accepted.capabilities,
                    subscribed: accepted.claim.subscribed,
                });
                if act.closed {
                    return false;
                }
                for t in &accepted.live {
                    act.owned.entry(t.id).or_default().run_id = t.run_id;
                }
                let ack = crate::proto::v1::HelloAck { instance_id: act.relay.instance_id.clone() };
                act.send(server_frame::Frame::HelloAck(ack), ctx);
                if let Some(h) = act.host.as_mut() {
                    h.ready = true;
                }
                tracing::info!(%host_id, "tether_daemon_connected");
                let registry = act.relay.registry.clone();
                let conn_no = accepted.claim.conn_no;
                let flow_control = accepted.capabilities.flow_control;
                registry.do_send(Ready { host_id, conn_no, daemon_queue: queue.clone(), flow_control });
                let terminals: Vec<Uuid> = accepted.live.iter().map(|t| t.id).collect();
                actix_rt::spawn(announce_takeover(act.relay.clone(), host_id, terminals));
                for (terminal_id, run_id, logged) in accepted.captures {
                    let registry = registry.clone();
                    actix_rt::spawn(async move {
                        if let Ok(arbiter) = registry.send(OpenTerminal { terminal_id, host_id }).await {
                            arbiter.do_send(CaptureRun { run_id, logged, attach_id: None });
                        }
                    });
                }
                for terminal in accepted.parked {
                    ctx.wait(act.spawn_terminal(terminal).map(|_, _, _| ()));
                }
                true
            }
        })))
    }
}

fn terminal_id(raw: &str) -> Option<Uuid> {
    Uuid::parse_str(raw).ok()
}

fn grid(value: u32) -> u16 {
    u16::try_from(value.clamp(1, 1000)).unwrap_or(1000)
}

impl Handler<Inbound> for DaemonConn {
    type Result = AtomicResponse<Self, ()>;

    fn handle(&mut self, msg: Inbound, ctx: &mut Context<Self>) -> Self::Result {
        self.last_heard = Instant::now();
        let done = || AtomicResponse::new(Box::pin(actix::fut::ready(())));
        let Some(host_id) = self.host_id() else { return done() };
        let Some(frame) = msg.0.frame else { return done() };
        // Frames about a terminal this host does not own are dropped.
        let owned_id = |raw: &str, owned: &HashMap<Uuid, Owned>| terminal_id(raw).filter(|id| owned.contains_key(id));
        let store = self.relay.store.clone();
        match frame {
            daemon_frame::Frame::Output(out) => {
                let Some(id) = owned_id(&out.terminal_id, &self.owned) else {
                    metrics::counter!("tether_daemon_frames_dropped_total").increment(1);
                    return done();
                };
                metrics::counter!("tether_daemon_output_bytes_total").increment(out.data.len() as u64);
                let Some(arbiter) = self.attached.get(&id).cloned() else { return done() };
                let chunk = OutputChunk { offset: out.offset, data: out.data };
                if self.window().is_some() {
                    // Never waits for the arbiter: the terminal's flow-control
                    // window bounds what is in flight (see `arbiter`).
                    arbiter.do_send(chunk);
                    return done();
                }
                // A daemon without flow control is slowed as a whole: the
                // reader waits while the terminal's stream is paused.
                AtomicResponse::new(Box::pin(
                    async move {
                        let _ = arbiter.send(chunk).await;
                    }
                    .into_actor(self),
                ))
            }
            daemon_frame::Frame::Scrollback(s) => {
                if let Some(id) = owned_id(&s.terminal_id, &self.owned) {
                    self.arbiter_event(
                        id,
                        StreamEvent::Scrollback {
                            attach_id: s.attach_id,
                            data: s.data,
                            cols: grid(s.cols),
                            rows: grid(s.rows),
                            offset: s.offset,
                            resumed: s.resumed,
                        },
                    );
                }
                done()
            }
            daemon_frame::Frame::AttachError(e) => {
                if let Some(id) = terminal_id(&e.terminal_id) {
                    self.arbiter_event(id, StreamEvent::AttachError { attach_id: e.attach_id, message: e.message });
                }
                done()
            }
            daemon_frame::Frame::Size(s) => {
                let Some(id) = owned_id(&s.terminal_id, &self.owned) else { return done() };
                let (cols, rows) = (grid(s.cols), grid(s.rows));
                self.arbiter_event(id, StreamEvent::Size { cols, rows });
                AtomicResponse::new(Box::pin(
                    async move {
                        if let Err(e) = store.set_terminal_size(host_id, id, cols, rows).await {
                            tracing::warn!(error = %e, "tether_terminal_size_failed");
                        }
                    }
                    .into_actor(self),
                ))
            }
            daemon_frame::Frame::Ping(_) => {
                self.send(server_frame::Frame::Pong(crate::proto::v1::Pong {}), ctx);
                done()
            }
            daemon_frame::Frame::Hello(_) => {
                self.close(close::POLICY, "a second hello on one connection", ctx);
                done()
            }
            daemon_frame::Frame::Started(s) => {
                let Some(id) = owned_id(&s.terminal_id, &self.owned) else { return done() };
                let run_id = self.owned.get(&id).and_then(|o| o.run_id);
                let registry = self.relay.registry.clone();
                AtomicResponse::new(Box::pin(
                    async move {
                        match store.mark_started(host_id, id).await {
                            Ok(_) => {
                                if let Some(run_id) = run_id {
                                    let _ = store.mark_run_running(run_id).await;
                                }
                                registry.do_send(TerminalLifecycle { terminal_id: id, event: LifecycleEvent::Started });
                            }
                            Err(e) => tracing::error!(error = %e, terminal_id = %id, "tether_started_write_failed"),
                        }
                    }
                    .into_actor(self),
                ))
            }
            daemon_frame::Frame::SpawnError(s) => {
                let Some(id) = owned_id(&s.terminal_id, &self.owned) else { return done() };
                let run_id = self.owned.remove(&id).and_then(|o| o.run_id);
                let registry = self.relay.registry.clone();
                let message: String = s.message.chars().take(1000).collect();
                AtomicResponse::new(Box::pin(
                    async move {
                        if let Err(e) = store.mark_spawn_failed(host_id, id, &message).await {
                            tracing::error!(error = %e, terminal_id = %id, "tether_spawn_error_write_failed");
                        }
                        if let Some(run_id) = run_id {
                            let _ = store.append_run_log(run_id, message.as_bytes(), usize::MAX / 2).await;
                            let _ = store.finish_run(run_id, RunState::Failed, None).await;
                        }
                        registry.do_send(TerminalLifecycle {
                            terminal_id: id,
                            event: LifecycleEvent::SpawnFailed(message),
                        });
                    }
                    .into_actor(self),
                ))
            }
            daemon_frame::Frame::Snapshot(s) => {
                let Some(id) = owned_id(&s.terminal_id, &self.owned) else { return done() };
                let (cols, rows) = (grid(s.cols), grid(s.rows));
                if let Some(owned) = self.owned.get_mut(&id) {
                    owned.final_snapshot = Some((s.data.clone(), cols, rows));
                }
                let snapshot = crate::store::TerminalSnapshot { data: s.data.to_vec(), cols, rows };
                AtomicResponse::new(Box::pin(
                    async move {
                        if let Err(e) = store.put_snapshot(host_id, id, &snapshot).await {
                            tracing::error!(error = %e, terminal_id = %id, "tether_snapshot_write_failed");
                        }
                    }
                    .into_actor(self),
                ))
            }
            daemon_frame::Frame::Exit(e) => {
                let Some(id) = owned_id(&e.terminal_id, &self.owned) else { return done() };
                let snapshot = self.owned.get_mut(&id).and_then(|o| o.final_snapshot.take());
                // A run's terminal is forgotten when its Usage arrives; others now.
                if self.owned.get(&id).is_some_and(|o| o.run_id.is_none()) {
                    self.owned.remove(&id);
                }
                let status = ExitStatus { code: e.exit_code, signal: e.signal };
                let arbiter = self.attached.remove(&id);
                let registry = self.relay.registry.clone();
                AtomicResponse::new(Box::pin(
                    async move {
                        if let Err(err) = store.mark_exited(host_id, id, status).await {
                            tracing::error!(error = %err, terminal_id = %id, "tether_exit_write_failed");
                        }
                        let event = LifecycleEvent::Exited { status, snapshot };
                        match arbiter {
                            Some(arbiter) => arbiter.do_send(event),
                            None => registry.do_send(TerminalLifecycle { terminal_id: id, event }),
                        }
                    }
                    .into_actor(self),
                ))
            }
            daemon_frame::Frame::Usage(u) => {
                let Some(id) = terminal_id(&u.terminal_id) else { return done() };
                // Usage follows Exit; the terminal is forgotten once it arrives.
                let Some(run_id) = self.owned.remove(&id).and_then(|o| o.run_id) else { return done() };
                let usage = RunUsage {
                    cpu_ms: i64::try_from(u.cpu_ms).unwrap_or(i64::MAX),
                    max_rss_kb: i64::try_from(u.max_rss_kb).unwrap_or(i64::MAX),
                    output_bytes: i64::try_from(u.output_bytes).unwrap_or(i64::MAX),
                    wall_ms: i64::try_from(u.wall_ms).unwrap_or(i64::MAX),
                };
                AtomicResponse::new(Box::pin(
                    async move {
                        if let Err(e) = store.set_run_usage(run_id, &usage).await {
                            tracing::error!(error = %e, "tether_usage_write_failed");
                        }
                    }
                    .into_actor(self),
                ))
            }
            daemon_frame::Frame::DirsResult(r) => {
                let answer = match r.error {
                    Some(error) => Err(RequestError::Refused(error)),
                    None => Ok(DaemonAnswer::Dirs(r.dirs.clone())),
                };
                let ok = answer.is_ok();
                self.answer(&r.request_id, answer);
                if !ok {
                    return done();
                }
                AtomicResponse::new(Box::pin(
                    async move {
                        if let Err(e) = store.set_host_dirs(host_id, &r.dirs).await {
                            tracing::error!(error = %e, "tether_dirs_write_failed");
                        }
                    }
                    .into_actor(self),
                ))
            }
            daemon_frame::Frame::LimitsResult(r) => {
                let answer = match r.error {
                    Some(error) => Err(RequestError::Refused(error)),
                    None => serde_json::from_str(&r.limits_json)
                        .map(DaemonAnswer::Limits)
                        .map_err(|_| RequestError::Refused("the daemon sent limits that are not JSON".into())),
                };
                self.answer(&r.request_id, answer);
                done()
            }
            daemon_frame::Frame::CredentialsResult(r) => {
                let answer = match r.error {
                    Some(error) => Err(RequestError::Refused(error)),
                    None => Ok(DaemonAnswer::Credentials(r.credentials_json.to_vec())),
                };
                self.answer(&r.request_id, answer);
                done()
            }
        }
    }
}

impl DaemonConn {
    fn answer(&mut self, request_id: &str, answer: Result<DaemonAnswer, RequestError>) {
        if let Some((_, reply)) = self.pending.remove(request_id) {
            let _ = reply.send(answer);
        }
    }
}

impl Handler<ToDaemon> for DaemonConn {
    type Result = ();
    fn handle(&mut self, msg: ToDaemon, ctx: &mut Context<Self>) {
        if self.host_id().is_some() {
            self.send(msg.0, ctx);
        }
    }
}

impl Handler<SpawnTerminal> for DaemonConn {
    type Result = AtomicResponse<Self, bool>;
    fn handle(&mut self, msg: SpawnTerminal, _: &mut Context<Self>) -> Self::Result {
        AtomicResponse::new(self.spawn_terminal(msg.0))
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
        if self.attached.get(&msg.terminal_id) == Some(&msg.arbiter) {
            self.attached.remove(&msg.terminal_id);
            let detach = crate::proto::v1::Detach { terminal_id: msg.terminal_id.to_string() };
            self.send(server_frame::Frame::Detach(detach), ctx);
        }
    }
}

impl Handler<DaemonRequest> for DaemonConn {
    type Result = ResponseFuture<Result<DaemonAnswer, RequestError>>;

    fn handle(&mut self, msg: DaemonRequest, ctx: &mut Context<Self>) -> Self::Result {
        let Some(host) = self.host.as_ref().filter(|h| h.ready) else {
            return Box::pin(async { Err(RequestError::Offline) });
        };
        let caps = host.capabilities;
        let supported = match msg.0 {
            DaemonRequestKind::AddDir(_) | DaemonRequestKind::RemoveDir(_) => caps.manage_dirs,
            DaemonRequestKind::RefreshLimits => caps.refresh_limits,
            DaemonRequestKind::Credentials => caps.credentials,
        };
        if !supported {
            return Box::pin(async { Err(RequestError::Unsupported) });
        }
        let request_id = Uuid::new_v4().to_string();
        let (frame, timeout) = match &msg.0 {
            DaemonRequestKind::AddDir(path) | DaemonRequestKind::RemoveDir(path) => {
                let op = if matches!(msg.0, DaemonRequestKind::AddDir(_)) {
                    crate::proto::v1::DirsOp::Add
                } else {
                    crate::proto::v1::DirsOp::Remove
                };
                let dirs = crate::proto::v1::Dirs { request_id: request_id.clone(), op: op as i32, path: path.clone() };
                (server_frame::Frame::Dirs(dirs), Duration::from_secs(10))
            }
            DaemonRequestKind::RefreshLimits => (
                server_frame::Frame::LimitsRefresh(crate::proto::v1::LimitsRefresh { request_id: request_id.clone() }),
                Duration::from_secs(30),
            ),
            DaemonRequestKind::Credentials => (
                server_frame::Frame::Credentials(crate::proto::v1::Credentials { request_id: request_id.clone() }),
                Duration::from_secs(10),
            ),
        };
        let (tx, rx) = oneshot::channel();
        self.pending.insert(request_id.clone(), (msg.0, tx));
        self.send(frame, ctx);
        let addr = ctx.address();
        Box::pin(async move {
            match tokio::time::timeout(timeout, rx).await {
                Ok(Ok(answer)) => answer,
                Ok(Err(_)) => Err(RequestError::Offline),
                Err(_) => {
                    addr.do_send(ForgetRequest(request_id));
                    Err(RequestError::Timeout)
                }
            }
        })
    }
}

/// Drops a request that timed out, so a late answer is ignored.
#[derive(Message)]
#[rtype(result = "()")]
struct ForgetRequest(String);

impl Handler<ForgetRequest> for DaemonConn {
    type Result = ();
    fn handle(&mut self, msg: ForgetRequest, _: &mut Context<Self>) {
        self.pending.remove(&msg.0);
    }
}

/// Starts a connection actor for an upgraded daemon socket.
pub fn start(
    relay: RelayContext,
    user_id: Uuid,
    session: actix_ws::Session,
    stream: AggregatedMessageStream,
    guard: AddressGuard,
) -> Addr<DaemonConn> {
    let outbox = Outbox::start(session, OUTBOUND_LIMIT, None);
    DaemonConn::new(relay, user_id, outbox, stream, guard).start()
}
