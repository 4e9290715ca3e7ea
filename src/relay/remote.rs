//! Viewers across instances (docs/CLUSTER.md, "Viewers across instances").
//!
//! A viewer socket on instance B for a terminal whose daemon is owned by A
//! is served by two proxies:
//! - [`HomeViewer`] on B, which its `Viewer` talks to instead of an
//!   arbiter: it joins through the owner (`ViewerJoin`, attached only once
//!   the owner answered), publishes the client's messages in order on the
//!   host's channel and hands the frames the owner sends back to the
//!   `Viewer`, taking them only from the owner it joined through.
//! - [`RemoteViewer`] on A, a member of the terminal's arbiter like any
//!   local viewer socket (it takes `ViewerOut`, with a counted outbound
//!   queue): it publishes what the arbiter sends on the terminal's channel.
//!
//! Every `bus.heartbeat_ms` each instance checks, in one lease query, that
//! the owners its home viewers joined through still hold their hosts
//! (otherwise the viewer is closed 4503 and the client reattaches), and
//! reports its home viewers to each owner in one message; an owner drops
//! remote viewers that were not reported (their home died or forgot them)
//! and tells the home to close viewers it does not know.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::prelude::*;
use tokio::sync::mpsc;
use uuid::Uuid;

use super::ended::ended_messages;
use super::lapse_grace::LapseGrace;
use super::outbox::Frame;
use super::registry::{HostsElsewhere, OpenTerminal, WaitingHosts};
use super::requests::{ask_owner, HostOp, OpAnswer};
use super::*;
use crate::proto::bus::{self, envelope, viewer_event, viewer_frame};
use crate::store::host_lease_key;
use crate::viewer_protocol::ServerMessage;

/// Client messages a home viewer holds until the owner heard its join.
const EARLY_EVENTS: usize = 256;
/// Bytes of a home viewer's messages waiting to be published. While the
/// bus does not take them (Redis stalled or away) a client that keeps
/// typing or pasting would grow the queue without end; past this the
/// viewer is closed 4503 and reattaches once the bus is back.
const QUEUED_EVENT_BYTES: usize = 4 * MAX_FRAME_BYTES;
/// How long a home viewer waits for the bus to take one of its messages
/// before it gives up on the bus and closes the client 4503: Redis that
/// stalls (a primary frozen until it fails over) answers nothing, and
/// what the client types meanwhile would wait behind that message, to be
/// lost if Redis answers at last that nobody heard it. Redis that is away
/// refuses the message at once (it is published failing fast).
const PUBLISH_PATIENCE: Duration = Duration::from_secs(2);
/// How long a home viewer's subscription to its terminal's channel may
/// take before the client is told the host is offline (the bus is away).
const SUBSCRIBE_PATIENCE: Duration = Duration::from_secs(1);
/// How often a home viewer at most reports flow credit to the owner.
const CREDIT_REPORT: Duration = Duration::from_millis(5);
/// What a ping frame weighs on both sides of the bus.
const PING_WEIGHT: usize = 16;
/// How often the leases of the hosts home viewers wait for are read (in
/// one query for all of them), and the first wait before a waiting home
/// viewer asks its owner to join again.
const OWNER_RETRY: Duration = Duration::from_secs(1);
/// The longest a waiting home viewer goes without asking its owner again:
/// the waits double up to it. A lease that moves is seen by the shared
/// lease read (or the new owner's `HostTaken`), not by these joins; they
/// only find an owner that holds on and was not hearing (the bus away).
const OWNER_RETRY_MAX: Duration = Duration::from_secs(8);

/// The proxies of this instance, for the bus dispatcher: home viewers by
/// their key (this instance's own numbering), remote viewers by their home
/// instance and the key it gave them. The pair names a remote viewer
/// uniquely across the cluster; inside an arbiter every member has the id
/// the arbiter gave it when it joined.
#[derive(Default)]
pub struct Remotes {
    next_home: AtomicU64,
    homes: Mutex<HashMap<u64, HomeEntry>>,
    remotes: Mutex<HashMap<(String, u64), RemoteEntry>>,
    /// When each home instance last reported its viewers here.
    reports: Mutex<HashMap<String, Instant>>,
}

struct HomeEntry {
    addr: Addr<HomeViewer>,
    host_id: Uuid,
    terminal_id: Uuid,
    /// The owner it joined (or waits to join) through, while it waits.
    waiting_for: Option<String>,
}

struct RemoteEntry {
    addr: Addr<RemoteViewer>,
    host_id: Uuid,
    since: Instant,
    /// Its home's last report left it out.
    unreported: bool,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Remotes {
    /// A frame from an owner for one of this instance's home viewers.
    pub fn frame(&self, frame: bus::ViewerFrame, sender: &str) {
        let home = lock(&self.homes).get(&frame.viewer_id).map(|h| h.addr.clone());
        if let Some(home) = home {
            home.do_send(FromOwner { frame, sender: sender.to_string() });
        }
    }

    /// Instance `by` took `host_id`: the home viewers that joined through
    /// another owner close their clients so they reattach through `by`.
    pub fn taken(&self, host_id: Uuid, by: &str) {
        for home in lock(&self.homes).values().filter(|h| h.host_id == host_id) {
            home.addr.do_send(Taken(by.to_string()));
        }
    }

    /// Output of `terminal_id` was lost on the way here: its home viewers
    /// reattach (their clients resume with `?from=`).
    pub fn repair_terminal(&self, terminal_id: Uuid) {
        for home in lock(&self.homes).values().filter(|h| h.terminal_id == terminal_id) {
            home.addr.do_send(Reattach("output was lost on the bus; reattach"));
        }
    }

    /// Client messages for `host_id` from `home` (any home when unknown)
    /// were lost on the way here: those remote viewers close their clients.
    pub fn repair_host(&self, host_id: Uuid, home: Option<&str>) {
        for ((from, _), entry) in lock(&self.remotes).iter() {
            if entry.host_id == host_id && home.is_none_or(|h| h == from) {
                entry.addr.do_send(Reattach("viewer messages were lost on the bus; reattach"));
            }
        }
    }

    /// This instance drains: its home viewers close their clients 4503
    /// (they reattach through another instance).
    pub fn drain_homes(&self) {
        for home in lock(&self.homes).values() {
            home.addr.do_send(Reattach("instance draining"));
        }
    }

    /// Messages were lost and nobody can say on which channel: every proxy
    /// on this instance closes its client.
    pub fn repair_all(&self) {
        for home in lock(&self.homes).values() {
            home.addr.do_send(Reattach("messages were lost on the bus; reattach"));
        }
        for entry in lock(&self.remotes).values() {
            entry.addr.do_send(Reattach("messages were lost on the bus; reattach"));
        }
    }

    /// Records whether home viewer `key` waits for `owner` to listen.
    fn set_waiting(&self, key: u64, owner: Option<&str>) {
        if let Some(entry) = lock(&self.homes).get_mut(&key) {
            entry.waiting_for = owner.map(str::to_string);
        }
    }

    /// The waiting home viewers, with their hosts and the owners they wait for.
    fn waiting(&self) -> Vec<(Addr<HomeViewer>, Uuid, String)> {
        lock(&self.homes).values().filter_map(|h| Some((h.addr.clone(), h.host_id, h.waiting_for.clone()?))).collect()
    }

    /// A client message from a home viewer on `home`.
    pub fn event(&self, home: &str, event: bus::ViewerEvent) {
        let remote = lock(&self.remotes).get(&(home.to_string(), event.viewer_id)).map(|e| e.addr.clone());
        if let Some(remote) = remote {
            remote.do_send(FromHome(event));
        }
    }

    /// A home's report: drop its remote viewers it no longer serves here;
    /// returns the reported ones this instance does not know.
    ///
    /// A viewer is dropped when two reports in a row leave it out: a report
    /// is composed from the home viewers the home had when its heartbeat
    /// began, so one that began just before a viewer joined arrives after
    /// the join without it.
    pub fn report(&self, report: &bus::ViewerReport) -> Vec<(Uuid, u64)> {
        lock(&self.reports).insert(report.home.clone(), Instant::now());
        let reported: HashSet<u64> = report.viewers.iter().map(|v| v.viewer_id).collect();
        let mut remotes = lock(&self.remotes);
        for ((_, id), entry) in remotes.iter_mut().filter(|((home, _), _)| *home == report.home) {
            let left_out = !reported.contains(id);
            if left_out && entry.unreported {
                entry.addr.do_send(LetGo("not reported by its home"));
            }
            entry.unreported = left_out;
        }
        report
            .viewers
            .iter()
            .filter(|v| !remotes.contains_key(&(report.home.clone(), v.viewer_id)))
            .filter_map(|v| Some((Uuid::parse_str(&v.terminal_id).ok()?, v.viewer_id)))
            .collect()
    }

    /// Remote viewers whose home has not reported for `silence`.
    fn silent(&self, silence: Duration) -> Vec<Addr<RemoteViewer>> {
        let reports = lock(&self.reports);
        lock(&self.remotes)
            .iter()
            .filter(|((home, _), entry)| {
                let heard = reports.get(home).copied().map_or(entry.since, |at| at.max(entry.since));
                heard.elapsed() > silence
            })
            .map(|(_, entry)| entry.addr.clone())
            .collect()
    }
}

// ------------------------------------------------------------------ home side

/// A frame from the owner, for the home viewer.
#[derive(Message)]
#[rtype(result = "()")]
struct FromOwner {
    frame: bus::ViewerFrame,
    sender: String,
}

/// Close the client 4503 so it reattaches: the owner moved or died, or
/// messages were lost.
#[derive(Message)]
#[rtype(result = "()")]
struct Reattach(&'static str);

/// The lease of a waiting viewer's host no longer names the owner it waits
/// for; a viewer that joined meanwhile is left to the heartbeat.
#[derive(Message)]
#[rtype(result = "()")]
struct LeaseMoved;

/// The named instance announced it took the host.
#[derive(Message)]
#[rtype(result = "()")]
struct Taken(String);

pub struct HomeViewer {
    /// Its key on this instance and on the bus (`ViewerEvent.viewer_id`).
    key: u64,
    relay: RelayContext,
    terminal_id: Uuid,
    host_id: Uuid,
    /// The instance holding the host when the viewer joined.
    owner: String,
    resume_from: Option<u64>,
    /// The client may only watch (the owner's arbiter counts it so).
    read_only: bool,
    out: Recipient<ViewerOut>,
    /// The client socket's queued byte count (its outbox).
    client_queued: Arc<AtomicUsize>,
    /// Total weight of the owner's frames handed to the client socket.
    received: u64,
    /// The last `delivered` total published to the owner.
    reported: u64,
    report_scheduled: bool,
    attached: bool,
    /// The lease names an owner that does not listen (it died, or has just
    /// let the host go): the client is told the host is offline, and waits
    /// until the lease moves ([`watch_waiting`]) or a join goes through.
    waiting: bool,
    /// The next join of a waiting viewer, and the wait before the one after.
    retry: Option<SpawnHandle>,
    retry_in: Duration,
    /// The terminal's state as the viewer read it, for the `status` of a
    /// waiting viewer.
    state: crate::store::TerminalState,
    early: VecDeque<FromViewer>,
    events: mpsc::UnboundedSender<(bus::ViewerEvent, usize)>,
    /// The other end of `events`, until the actor starts its publisher.
    queue: Option<mpsc::UnboundedReceiver<(bus::ViewerEvent, usize)>>,
    /// Encoded bytes in `events` and in the publish under way.
    events_queued: Arc<AtomicUsize>,
    closed: bool,
}

impl HomeViewer {
    pub fn new(
        relay: RelayContext,
        terminal: &crate::store::Terminal,
        owner: String,
        resume_from: Option<u64>,
        read_only: bool,
        out: Recipient<ViewerOut>,
        client_queued: Arc<AtomicUsize>,
    ) -> Self {
        let (terminal_id, host_id) = (terminal.id, terminal.host_id);
        let key = relay.remotes.next_home.fetch_add(1, Ordering::Relaxed) + 1;
        // One task publishes this viewer's messages, so they keep their
        // order; it starts with the actor (`publish_events`).
        let (events, queue) = mpsc::unbounded_channel::<(bus::ViewerEvent, usize)>();
        Self {
            key,
            relay,
            terminal_id,
            host_id,
            owner,
            resume_from,
            read_only,
            out,
            client_queued,
            received: 0,
            reported: 0,
            report_scheduled: false,
            attached: false,
            waiting: false,
            retry: None,
            retry_in: OWNER_RETRY,
            state: terminal.state,
            early: VecDeque::new(),
            events,
            queue: Some(queue),
            events_queued: Arc::new(AtomicUsize::new(0)),
            closed: false,
        }
    }

    /// Publishes the viewer's messages in order on the host's channel. One
    /// that no instance heard (the owner died; its lease has not lapsed
    /// yet) or that the bus refused (Redis away) tells the viewer, which
    /// has the client reattach rather than type on into nothing; what is
    /// left in the queue is dropped then. The task holds the viewer by a
    /// weak address: it must not keep the actor that owns its queue alive.
    fn publish_events(&mut self, ctx: &mut Context<Self>) {
        let Some(mut queue) = self.queue.take() else { return };
        let (relay, host_id, queued, viewer) =
            (self.relay.clone(), self.host_id, self.events_queued.clone(), ctx.address().downgrade());
        actix_rt::spawn(async move {
            let channel = relay.bus.host_channel(host_id);
            let mut unheard = false;
            while let Some((event, weight)) = queue.recv().await {
                if !unheard {
                    // What the user did; the rest is said again anyway
                    // (flow credit is a running total, a view is repeated
                    // every few seconds).
                    let done_by_user =
                        matches!(event.event, Some(viewer_event::Event::Input(_) | viewer_event::Event::Resize(_)));
                    let request = bus::HostRequest {
                        request_id: String::new(),
                        reply_to: relay.instance_id.clone(),
                        host_id: host_id.to_string(),
                        op: Some(bus::host_request::Op::ViewerEvent(event)),
                    };
                    // Never held for Redis to come back: a message sent
                    // after the owner's subscription is gone (Redis
                    // restarted, the owner not subscribed again yet)
                    // reaches nobody, and everything typed during the
                    // outage would follow it. The client is closed at once
                    // instead and holds what is typed until it is back.
                    // A message that reached nobody while Redis answered
                    // means the owner is gone: closed whatever it carried.
                    let body = envelope::Body::Request(request);
                    let heard =
                        match tokio::time::timeout(PUBLISH_PATIENCE, relay.bus.publish_or_fail(&channel, body)).await {
                            Ok(Ok(receivers)) => receivers > 0,
                            Ok(Err(e)) => {
                                tracing::warn!(error = %e, "tether_home_viewer_publish_failed");
                                !done_by_user
                            }
                            Err(_) => {
                                tracing::warn!("tether_home_viewer_publish_unanswered");
                                !done_by_user
                            }
                        };
                    if !heard {
                        unheard = true;
                        if let Some(viewer) = viewer.upgrade() {
                            viewer.do_send(Unheard);
                        }
                    }
                }
                queued.fetch_sub(weight, Ordering::Relaxed);
            }
        });
    }

    /// The key this viewer has on this instance and on the bus.
    pub fn key(&self) -> u64 {
        self.key
    }

    /// Queues `event` for the owner; false when [`QUEUED_EVENT_BYTES`] are
    /// already waiting (the bus is not taking them), and then it is not.
    fn publish(&self, event: viewer_event::Event) -> bool {
        let event =
            bus::ViewerEvent { terminal_id: self.terminal_id.to_string(), viewer_id: self.key, event: Some(event) };
        let weight = prost::Message::encoded_len(&event);
        if self.events_queued.fetch_add(weight, Ordering::Relaxed) + weight > QUEUED_EVENT_BYTES {
            self.events_queued.fetch_sub(weight, Ordering::Relaxed);
            return false;
        }
        if self.events.send((event, weight)).is_err() {
            self.events_queued.fetch_sub(weight, Ordering::Relaxed);
        }
        true
    }

    fn forward(&mut self, msg: FromViewer, ctx: &mut Context<Self>) {
        let event = match msg {
            FromViewer::View { view, .. } => viewer_event::Event::View(bus::GridView {
                cols: u32::from(view.cols),
                rows: u32::from(view.rows),
                visible: view.visible,
                idle_ms: view.idle_ms,
                open: view.open,
            }),
            FromViewer::Resize { cols, rows, .. } => {
                viewer_event::Event::Resize(bus::Grid { cols: u32::from(cols), rows: u32::from(rows) })
            }
            FromViewer::Input { data, .. } => viewer_event::Event::Input(data),
            FromViewer::Pong { .. } => viewer_event::Event::Pong(true),
            FromViewer::Leave { .. } => {
                self.closed = true;
                ctx.stop();
                return;
            }
        };
        if !self.publish(event) {
            self.close_for_backlog(ctx);
        }
    }

    /// The bus has not taken [`QUEUED_EVENT_BYTES`] of this viewer's
    /// messages: the client reattaches once it does.
    fn close_for_backlog(&mut self, ctx: &mut Context<Self>) {
        tracing::warn!(terminal_id = %self.terminal_id, "tether_home_viewer_bus_backlog");
        self.close_client(close::HOST_GONE, "the bus is not taking this viewer's messages; reattach", ctx);
    }

    /// Publishes how much of the owner's output the client socket has
    /// taken, at most once per `CREDIT_REPORT`, until all of it has.
    fn schedule_report(&mut self, ctx: &mut Context<Self>) {
        if self.report_scheduled || self.closed {
            return;
        }
        self.report_scheduled = true;
        ctx.run_later(CREDIT_REPORT, |act, ctx| {
            act.report_scheduled = false;
            let waiting = act.client_queued.load(Ordering::Relaxed) as u64;
            let delivered = act.received.saturating_sub(waiting).max(act.reported);
            if delivered > act.reported && act.attached {
                act.reported = delivered;
                if !act.publish(viewer_event::Event::Delivered(delivered)) {
                    act.close_for_backlog(ctx);
                    return;
                }
            }
            if act.reported < act.received {
                act.schedule_report(ctx);
            }
        });
    }

    /// Joins through the owner; attached once it answered.
    fn join_owner(&mut self, ctx: &mut Context<Self>) {
        let relay = self.relay.clone();
        let join = HostOp::ViewerJoin {
            terminal_id: self.terminal_id,
            viewer: self.key,
            resume_from: self.resume_from,
            read_only: self.read_only,
        };
        let host_id = self.host_id;
        async move { ask_owner(&relay, host_id, join).await }
            .into_actor(self)
            .map(|joined, act, ctx| act.joined(joined, ctx))
            .wait(ctx);
    }

    fn joined(&mut self, joined: Result<OpAnswer, RequestError>, ctx: &mut Context<Self>) {
        match joined {
            Ok(OpAnswer::Spawned(true)) => {
                self.attached = true;
                if self.waiting {
                    self.waiting = false;
                    self.relay.remotes.set_waiting(self.key, None);
                }
                while let Some(msg) = self.early.pop_front() {
                    if self.closed {
                        break;
                    }
                    self.forward(msg, ctx);
                }
            }
            // Nobody listens for the host: its owner died with the lease
            // still live (until it lapses, or the daemon redials), or let
            // the host go a moment ago. Closing at once had the client
            // reattach here, and be closed again, in a loop for as long as
            // the lease lasted. No acknowledgement (Redis away, the owner
            // stalled) is waited out the same way: the join goes through
            // once the bus does.
            Err(
                RequestError::Offline | RequestError::Unacknowledged | RequestError::BusAway | RequestError::Unheard,
            ) => self.wait_for_owner(ctx),
            other => {
                tracing::info!(terminal_id = %self.terminal_id, answer = ?other, "tether_home_viewer_join_failed");
                self.close_client(close::HOST_GONE, "the host's instance did not take the join; reattach", ctx);
            }
        }
    }

    /// Tells the client the host is offline (once) and asks the same owner
    /// to join again after a wait that doubles from [`OWNER_RETRY`] up to
    /// [`OWNER_RETRY_MAX`], or at once when the owner announces it took
    /// the host. Once the lease names another instance, this one or nobody,
    /// [`watch_waiting`] has the client reattach, where it joins as the
    /// lease then says.
    fn wait_for_owner(&mut self, ctx: &mut Context<Self>) {
        if !self.waiting {
            self.waiting = true;
            self.retry_in = OWNER_RETRY;
            self.relay.remotes.set_waiting(self.key, Some(&self.owner));
            self.early.clear();
            tell_host_offline(&self.out, self.state);
        }
        let wait = self.retry_in;
        self.retry_in = (wait * 2).min(OWNER_RETRY_MAX);
        self.retry = Some(ctx.run_later(wait, |act, ctx| {
            act.retry = None;
            act.join_owner(ctx);
        }));
    }

    fn close_client(&mut self, code: u16, reason: &str, ctx: &mut Context<Self>) {
        self.closed = true;
        self.out.do_send(ViewerOut::Close { code, reason: reason.to_string() });
        ctx.stop();
    }
}

/// Tells a waiting client its terminal's host cannot be reached: a
/// `status` with host offline, and the error "host offline".
fn tell_host_offline(out: &Recipient<ViewerOut>, state: crate::store::TerminalState) {
    out.do_send(ViewerOut::control(ServerMessage::Status { state: state.as_str().into(), host: "offline".into() }));
    out.do_send(ViewerOut::control(ServerMessage::error(crate::viewer_protocol::HOST_OFFLINE)));
}

impl Actor for HomeViewer {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        metrics::gauge!("tether_home_viewers").increment(1.0);
        self.publish_events(ctx);
        let entry =
            HomeEntry { addr: ctx.address(), host_id: self.host_id, terminal_id: self.terminal_id, waiting_for: None };
        lock(&self.relay.remotes.homes).insert(self.key, entry);
        let relay = self.relay.clone();
        let channel = relay.bus.terminal_channel(self.terminal_id);
        // While Redis is away the subscription waits for it; the client
        // is told the host is offline meanwhile rather than nothing.
        let out = self.out.clone();
        let state = self.state;
        async move {
            let subscribed = relay.bus.subscribe(&channel);
            tokio::pin!(subscribed);
            match tokio::time::timeout(SUBSCRIBE_PATIENCE, &mut subscribed).await {
                Ok(subscribed) => subscribed,
                Err(_) => {
                    tell_host_offline(&out, state);
                    subscribed.await
                }
            }
        }
        .into_actor(self)
        .map(|subscribed, act, ctx| match subscribed {
            Ok(()) => act.join_owner(ctx),
            Err(e) => {
                tracing::warn!(error = %e, "tether_home_viewer_subscribe_failed");
                act.close_client(close::HOST_GONE, "the bus did not subscribe; reattach", ctx);
            }
        })
        .wait(ctx);
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        metrics::gauge!("tether_home_viewers").decrement(1.0);
        lock(&self.relay.remotes.homes).remove(&self.key);
        if self.attached {
            // Past the bound the owner learns of the leave from the next
            // heartbeat's report instead.
            let _ = self.publish(viewer_event::Event::Leave(true));
        }
        let relay = self.relay.clone();
        let channel = relay.bus.terminal_channel(self.terminal_id);
        actix_rt::spawn(async move { relay.bus.unsubscribe(&channel).await });
    }
}

impl Handler<FromViewer> for HomeViewer {
    type Result = ();
    fn handle(&mut self, msg: FromViewer, ctx: &mut Context<Self>) {
        if self.attached {
            self.forward(msg, ctx);
        } else if self.waiting {
            // As an arbiter does for a host that is offline: input is
            // refused, the rest waits for the client's next view.
            match msg {
                FromViewer::Input { .. } => {
                    self.out.do_send(ViewerOut::control(ServerMessage::error(crate::viewer_protocol::HOST_OFFLINE)));
                }
                FromViewer::Leave { .. } => {
                    self.closed = true;
                    ctx.stop();
                }
                _ => {}
            }
        } else if self.early.len() < EARLY_EVENTS {
            self.early.push_back(msg);
        } else {
            self.close_client(close::POLICY, "too many messages before the terminal was joined", ctx);
        }
    }
}

/// A message of this viewer's reached no instance, or input or a resize
/// the bus refused or did not take in time (`publish_events`).
#[derive(Message)]
#[rtype(result = "()")]
struct Unheard;

impl Handler<Unheard> for HomeViewer {
    type Result = ();
    fn handle(&mut self, _: Unheard, ctx: &mut Context<Self>) {
        if self.closed {
            return;
        }
        tracing::info!(terminal_id = %self.terminal_id, owner = %self.owner, "tether_home_viewer_unheard");
        // The client reattaches from its offset: through the new owner, or
        // here to wait, told the host is offline, with its input refused.
        self.close_client(close::HOST_GONE, "the host's instance did not hear this viewer; reattach", ctx);
    }
}

impl Handler<FromOwner> for HomeViewer {
    type Result = ();
    fn handle(&mut self, msg: FromOwner, ctx: &mut Context<Self>) {
        // Only the owner this viewer joined through is heard.
        if msg.sender != self.owner || self.closed {
            return;
        }
        // Each frame's weight is counted as the owner counted it; binary
        // frames are reserved on the client's queue before they are sent
        // to the socket's actor, so they count while in its mailbox.
        match msg.frame.frame {
            Some(viewer_frame::Frame::Text(text)) => {
                self.received += Frame::Text(String::new()).weight() as u64 + text.len() as u64;
                self.out.do_send(ViewerOut::Text(text));
                self.schedule_report(ctx);
            }
            Some(viewer_frame::Frame::Binary(data)) => {
                let weight = Frame::Binary(data.clone()).weight();
                self.received += weight as u64;
                self.client_queued.fetch_add(weight, Ordering::Relaxed);
                self.out.do_send(ViewerOut::Output(data));
                self.schedule_report(ctx);
            }
            Some(viewer_frame::Frame::Ping(_)) => {
                self.received += PING_WEIGHT as u64;
                self.out.do_send(ViewerOut::Ping);
                self.schedule_report(ctx);
            }
            Some(viewer_frame::Frame::Close(c)) => {
                self.attached = false; // the owner already let it go
                let code = u16::try_from(c.code).unwrap_or(close::INTERNAL);
                tracing::info!(terminal_id = %self.terminal_id, code, reason = %c.reason, "tether_home_viewer_closed_by_owner");
                self.close_client(code, &c.reason, ctx);
            }
            None => {}
        }
    }
}

impl Handler<Reattach> for HomeViewer {
    type Result = ();
    fn handle(&mut self, msg: Reattach, ctx: &mut Context<Self>) {
        tracing::info!(terminal_id = %self.terminal_id, reason = msg.0, "tether_home_viewer_reattach");
        self.close_client(close::HOST_GONE, msg.0, ctx);
    }
}

impl Handler<LeaseMoved> for HomeViewer {
    type Result = ();
    fn handle(&mut self, _: LeaseMoved, ctx: &mut Context<Self>) {
        if self.waiting {
            tracing::info!(terminal_id = %self.terminal_id, "tether_home_viewer_lease_moved");
            self.close_client(close::HOST_GONE, "the host moved; reattach", ctx);
        }
    }
}

impl Handler<Taken> for HomeViewer {
    type Result = ();
    fn handle(&mut self, msg: Taken, ctx: &mut Context<Self>) {
        if msg.0 != self.owner {
            tracing::info!(terminal_id = %self.terminal_id, by = %msg.0, "tether_home_viewer_host_taken");
            self.close_client(close::HOST_GONE, "the host moved; reattach", ctx);
        } else if let Some(retry) = self.retry.take() {
            // The owner it waits for took the host again (its daemon
            // redialed it): it listens now.
            ctx.cancel_future(retry);
            self.retry_in = OWNER_RETRY;
            self.join_owner(ctx);
        }
    }
}

/// What the heartbeat needs of a home viewer.
#[derive(Message)]
#[rtype(result = "Option<(Uuid, Uuid, String)>")]
struct Describe;

impl Handler<Describe> for HomeViewer {
    type Result = Option<(Uuid, Uuid, String)>;
    fn handle(&mut self, _: Describe, _: &mut Context<Self>) -> Self::Result {
        self.attached.then(|| (self.terminal_id, self.host_id, self.owner.clone()))
    }
}

// ------------------------------------------------------------------ owner side

/// A client message relayed from the home.
#[derive(Message)]
#[rtype(result = "()")]
struct FromHome(bus::ViewerEvent);

/// Let the remote viewer go without telling its home.
#[derive(Message)]
#[rtype(result = "()")]
struct LetGo(&'static str);

pub struct RemoteViewer {
    relay: RelayContext,
    home: String,
    home_viewer: u64,
    terminal_id: Uuid,
    host_id: Uuid,
    resume_from: Option<u64>,
    read_only: bool,
    /// The arbiter it joined and the member id it was given there.
    joined: Option<(ArbiterLink, u64)>,
    /// Weight handed to this proxy and not yet reported delivered by the
    /// home (the arbiter's flow control reads it like a socket's queue).
    queued: Arc<AtomicUsize>,
    /// Total weight queued for publishing, and what the home reported.
    pushed: u64,
    acked: u64,
    frames: mpsc::UnboundedSender<(viewer_frame::Frame, usize)>,
    left: bool,
}

impl RemoteViewer {
    fn new(relay: RelayContext, home: String, join: &bus::ViewerJoin, terminal_id: Uuid, host_id: Uuid) -> Self {
        let queued = Arc::new(AtomicUsize::new(0));
        let (frames, mut queue) = mpsc::unbounded_channel::<(viewer_frame::Frame, usize)>();
        let publisher = relay.clone();
        let counter = queued.clone();
        let (to, viewer_id) = (home.clone(), join.viewer_id);
        actix_rt::spawn(async move {
            let channel = publisher.bus.terminal_channel(terminal_id);
            while let Some((frame, weight)) = queue.recv().await {
                let frame = bus::ViewerFrame { home: to.clone(), viewer_id, frame: Some(frame) };
                // Published frames stay counted until the home reports them
                // delivered; a frame that never left is released now.
                if let Err(e) = publisher.bus.publish(&channel, envelope::Body::ViewerFrame(frame)).await {
                    tracing::warn!(error = %e, "tether_remote_viewer_publish_failed");
                    counter.fetch_sub(weight, Ordering::Relaxed);
                }
            }
        });
        Self {
            relay,
            home,
            home_viewer: join.viewer_id,
            terminal_id,
            host_id,
            resume_from: join.resume_from,
            read_only: join.read_only,
            joined: None,
            queued,
            pushed: 0,
            acked: 0,
            frames,
            left: false,
        }
    }

    fn push(&mut self, frame: viewer_frame::Frame, weight: usize, counted: bool, ctx: &mut Context<Self>) {
        let now = if counted {
            self.queued.load(Ordering::Relaxed)
        } else {
            self.queued.fetch_add(weight, Ordering::Relaxed) + weight
        };
        if now > self.relay.settings.viewer.queue_bytes {
            self.queued.fetch_sub(weight, Ordering::Relaxed);
            self.too_slow(close::POLICY, crate::viewer_protocol::TOO_SLOW_A_READER, ctx);
            return;
        }
        if self.frames.send((frame, weight)).is_err() {
            self.queued.fetch_sub(weight, Ordering::Relaxed);
        } else {
            self.pushed += weight as u64;
        }
    }

    /// The home's client took frames up to `delivered` in total: release
    /// them (never more than was pushed) so the terminal's stream flows.
    fn credit(&mut self, delivered: u64) {
        let delivered = delivered.min(self.pushed);
        if delivered > self.acked {
            let released = usize::try_from(delivered - self.acked).unwrap_or(usize::MAX);
            self.acked = delivered;
            // A paused arbiter sees the smaller queue at its next lag check.
            let _ =
                self.queued.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |q| Some(q.saturating_sub(released)));
        }
    }

    /// Tells the home to close its client, leaves the arbiter, stops.
    /// Closed for reading too slowly (its queue passed `viewer.queue_bytes`,
    /// or the arbiter evicted it): counted, as a slow local socket is.
    fn too_slow(&mut self, code: u16, reason: &str, ctx: &mut Context<Self>) {
        tracing::info!(terminal_id = %self.terminal_id, home = %self.home, "tether_viewer_too_slow");
        metrics::counter!("tether_viewer_slow_closed_total").increment(1);
        self.leave(code, reason, ctx);
    }

    fn leave(&mut self, code: u16, reason: &str, ctx: &mut Context<Self>) {
        let close = viewer_frame::Frame::Close(bus::Close { code: u32::from(code), reason: reason.to_string() });
        let _ = self.frames.send((close, 0));
        ctx.stop();
    }

    fn join(&mut self, attempt: u32, ctx: &mut Context<Self>) {
        let registry = self.relay.registry.clone();
        let open = OpenTerminal { terminal_id: self.terminal_id, host_id: self.host_id };
        let join = Join {
            out: ViewerSink::actor(ctx.address().recipient::<ViewerOut>()),
            queued: self.queued.clone(),
            resume_from: self.resume_from,
            read_only: self.read_only,
        };
        let store = self.relay.store.clone();
        let terminal_id = open.terminal_id;
        async move {
            let arbiter = registry.send(open).await.ok()?;
            match arbiter.join(join).await {
                Ok(member) => Some(Ok(JoinOutcome::Joined(arbiter, member))),
                Err(NotJoined::Ended) => {
                    let row = store.terminal_by_id(terminal_id).await.ok().flatten()?;
                    let snapshot = crate::store::logged(store.get_snapshot(row.id).await, "load snapshot").flatten();
                    Some(Ok(JoinOutcome::Ended(ended_messages(&row, snapshot, true))))
                }
                Err(NotJoined::Full) => Some(Ok(JoinOutcome::Full)),
                Err(NotJoined::Retired) => Some(Err(())),
            }
        }
        .into_actor(self)
        .map(move |joined, act, ctx| match joined {
            Some(Ok(JoinOutcome::Joined(arbiter, member))) => act.joined = Some((arbiter, member)),
            // The terminal ended meanwhile: the home's client gets what a
            // viewer of an ended terminal gets, then a normal close.
            Some(Ok(JoinOutcome::Ended(ended))) => {
                let close = ViewerOut::Close { code: close::NORMAL, reason: "terminal ended".into() };
                for message in ended.into_iter().chain([close]) {
                    <Self as Handler<ViewerOut>>::handle(act, message, ctx);
                }
            }
            Some(Ok(JoinOutcome::Full)) => act.leave(close::TOO_MANY, "too many viewers of this terminal", ctx),
            Some(Err(())) if attempt < 20 => act.join(attempt + 1, ctx),
            _ => act.leave(close::INTERNAL, "could not join the terminal", ctx),
        })
        .wait(ctx);
    }
}

/// What a RemoteViewer's join through the registry came to.
enum JoinOutcome {
    Joined(ArbiterLink, u64),
    /// The terminal ended meanwhile: what its viewers are told.
    Ended(Vec<ViewerOut>),
    Full,
}

impl Actor for RemoteViewer {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        metrics::gauge!("tether_remote_viewers").increment(1.0);
        let entry =
            RemoteEntry { addr: ctx.address(), host_id: self.host_id, since: Instant::now(), unreported: false };
        let old = lock(&self.relay.remotes.remotes).insert((self.home.clone(), self.home_viewer), entry);
        if let Some(old) = old {
            old.addr.do_send(LetGo("joined again"));
        }
        self.join(0, ctx);
    }

    fn stopped(&mut self, ctx: &mut Self::Context) {
        metrics::gauge!("tether_remote_viewers").decrement(1.0);
        let mut remotes = lock(&self.relay.remotes.remotes);
        let key = (self.home.clone(), self.home_viewer);
        if remotes.get(&key).is_some_and(|e| e.addr == ctx.address()) {
            remotes.remove(&key);
        }
        if !self.left {
            if let Some((arbiter, viewer)) = &self.joined {
                arbiter.from_viewer(FromViewer::Leave { viewer: *viewer });
            }
        }
    }
}

impl Handler<ViewerOut> for RemoteViewer {
    type Result = ();
    fn handle(&mut self, msg: ViewerOut, ctx: &mut Context<Self>) {
        match msg {
            ViewerOut::Text(text) => {
                let weight = Frame::Text(String::new()).weight() + text.len();
                self.push(viewer_frame::Frame::Text(text), weight, false, ctx);
            }
            ViewerOut::Binary(data) => {
                let weight = Frame::Binary(data.clone()).weight();
                self.push(viewer_frame::Frame::Binary(data), weight, false, ctx);
            }
            // Counted by the arbiter when it sent it, like a socket's output.
            ViewerOut::Output(data) => {
                let weight = Frame::Binary(data.clone()).weight();
                self.push(viewer_frame::Frame::Binary(data), weight, true, ctx);
            }
            ViewerOut::Ping => self.push(viewer_frame::Frame::Ping(true), PING_WEIGHT, false, ctx),
            ViewerOut::Close { code, reason } => {
                self.left = true; // the arbiter already removed it
                self.leave(code, &reason, ctx);
            }
            ViewerOut::Evict { code, reason } => {
                self.left = true;
                self.too_slow(code, &reason, ctx);
            }
            // Only a local viewer's sink, which pushes on a socket's queue,
            // sends it; this proxy's queue is counted by `push`.
            ViewerOut::TooSlow => {}
        }
    }
}

impl Handler<FromHome> for RemoteViewer {
    type Result = ();
    fn handle(&mut self, msg: FromHome, ctx: &mut Context<Self>) {
        let grid = |n: u32| u16::try_from(n.clamp(1, 1000)).unwrap_or(1000);
        // Events wait in the mailbox while the join is under way (it runs
        // in `wait`), so only a viewer that is stopping has no member id.
        let member = self.joined.as_ref().map(|(_, id)| *id);
        let to_arbiter = match (msg.0.event, member) {
            (Some(viewer_event::Event::Delivered(delivered)), _) => {
                self.credit(delivered);
                return;
            }
            (Some(viewer_event::Event::Leave(_)) | None, _) => {
                ctx.stop();
                return;
            }
            (_, None) => return,
            (Some(viewer_event::Event::View(v)), Some(viewer)) => {
                let view = ViewReport {
                    cols: grid(v.cols),
                    rows: grid(v.rows),
                    visible: v.visible,
                    idle_ms: v.idle_ms,
                    open: v.open,
                };
                FromViewer::View { viewer, view }
            }
            (Some(viewer_event::Event::Resize(g)), Some(viewer)) => {
                FromViewer::Resize { viewer, cols: grid(g.cols), rows: grid(g.rows) }
            }
            (Some(viewer_event::Event::Input(data)), Some(viewer)) => FromViewer::Input { viewer, data },
            (Some(viewer_event::Event::Pong(_)), Some(viewer)) => FromViewer::Pong { viewer },
        };
        if let Some((arbiter, _)) = &self.joined {
            arbiter.from_viewer(to_arbiter);
        }
    }
}

impl Handler<LetGo> for RemoteViewer {
    type Result = ();
    fn handle(&mut self, msg: LetGo, ctx: &mut Context<Self>) {
        tracing::info!(terminal_id = %self.terminal_id, reason = msg.0, "tether_remote_viewer_dropped");
        ctx.stop();
    }
}

impl Handler<Reattach> for RemoteViewer {
    type Result = ();
    fn handle(&mut self, msg: Reattach, ctx: &mut Context<Self>) {
        tracing::info!(terminal_id = %self.terminal_id, reason = msg.0, "tether_remote_viewer_reattach");
        self.leave(close::HOST_GONE, msg.0, ctx);
    }
}

/// The owner's side of a `ViewerJoin`: true once a RemoteViewer exists.
pub fn accept_join(relay: &RelayContext, home: &str, host_id: Uuid, join: &bus::ViewerJoin) -> bool {
    let Ok(terminal_id) = Uuid::parse_str(&join.terminal_id) else { return false };
    RemoteViewer::new(relay.clone(), home.to_string(), join, terminal_id, host_id).start();
    true
}

// ------------------------------------------------------------------ heartbeat

/// Every `bus.heartbeat_ms`: close home viewers whose owner no longer holds
/// the host, and viewers waiting here for a host that is now connected to
/// another instance (both reattach), report the rest to their owners, and
/// drop remote viewers whose home went silent. Never overlaps itself (one
/// loop), and reads every lease it needs in one query.
pub async fn heartbeat(relay: RelayContext) {
    if !relay.bus.is_shared() {
        return;
    }
    let every = Duration::from_millis(relay.settings.bus.heartbeat_ms);
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut grace = LapseGrace::new(Duration::from_millis(relay.settings.lease.ttl_ms));
    loop {
        tick.tick().await;
        check_homes(&relay, &mut grace, every / 2).await;
        for remote in relay.remotes.silent(every * 3) {
            remote.do_send(LetGo("its home stopped reporting"));
        }
    }
}

/// While the database cannot say who holds the hosts (or for a lease TTL
/// after it could not, see [`LapseGrace`]), viewers stay with the owners
/// they joined through and are reported there as usual: an outage of the
/// database is no reason to drop a stream that needs none. A lease read
/// that takes longer than `patience` (a database that hangs rather than
/// refuses) counts as failed, so the reports still go out in time.
async fn check_homes(relay: &RelayContext, grace: &mut LapseGrace, patience: Duration) {
    let homes: Vec<(u64, Addr<HomeViewer>)> =
        lock(&relay.remotes.homes).iter().map(|(i, h)| (*i, h.addr.clone())).collect();
    let mut described = Vec::new();
    for (id, home) in homes {
        if let Ok(Some((terminal_id, host_id, owner))) = home.send(Describe).await {
            described.push((id, home, terminal_id, host_id, owner));
        }
    }
    let waiting = relay.registry.send(WaitingHosts).await.unwrap_or_default();
    if described.is_empty() && waiting.is_empty() {
        return;
    }
    let hosts = described.iter().map(|d| d.3).chain(waiting.iter().copied());
    let keys: Vec<String> = hosts.map(host_lease_key).collect::<HashSet<_>>().into_iter().collect();
    let read = tokio::time::timeout(patience, relay.store.lease_holders(&keys)).await;
    let owners: Option<HashMap<String, String>> = match read {
        Ok(Ok(live)) => {
            grace.answered(Instant::now());
            Some(live.into_iter().map(|(key, holder)| (key, holder.instance)).collect())
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "tether_heartbeat_lease_read_failed");
            grace.failed();
            None
        }
        Err(_) => {
            tracing::warn!(waited_ms = patience.as_millis(), "tether_heartbeat_lease_read_timed_out");
            grace.failed();
            None
        }
    };
    let believe_lapses = grace.believe_lapses(Instant::now());
    // Viewers waiting here for a host that came back on another instance
    // reattach through it.
    let elsewhere: Vec<Uuid> = waiting
        .into_iter()
        .filter(|host_id| {
            owners.as_ref().and_then(|o| o.get(&host_lease_key(*host_id))).is_some_and(|o| *o != relay.instance_id)
        })
        .collect();
    if !elsewhere.is_empty() {
        relay.registry.do_send(HostsElsewhere(elsewhere));
    }
    let mut reports: HashMap<String, Vec<bus::ReportedViewer>> = HashMap::new();
    for (id, home, terminal_id, host_id, owner) in described {
        let moved = match owners.as_ref().map(|o| o.get(&host_lease_key(host_id))) {
            None => None,
            Some(Some(holder)) => (*holder != owner).then_some("the host moved; reattach"),
            Some(None) => believe_lapses.then_some("the host's lease lapsed; reattach"),
        };
        if let Some(why) = moved {
            home.do_send(Reattach(why));
            continue;
        }
        reports
            .entry(owner)
            .or_default()
            .push(bus::ReportedViewer { terminal_id: terminal_id.to_string(), viewer_id: id });
    }
    for (owner, viewers) in reports {
        let report = bus::ViewerReport { home: relay.instance_id.clone(), viewers };
        let channel = relay.bus.reply_channel(&owner);
        if let Err(e) = relay.bus.publish(&channel, envelope::Body::ViewerReport(report)).await {
            tracing::warn!(error = %e, "tether_heartbeat_report_failed");
        }
    }
}

/// Every [`OWNER_RETRY`], while home viewers wait for owners that do not
/// listen: reads the leases of all their hosts in one query, and has each
/// viewer whose host is no longer held by the owner it waits for (another
/// instance holds it, this one, or nobody) reattach, where it joins as the
/// lease now says. When the database does not answer, they keep waiting.
pub async fn watch_waiting(relay: RelayContext) {
    if !relay.bus.is_shared() {
        return;
    }
    let mut tick = tokio::time::interval(OWNER_RETRY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let waiting = relay.remotes.waiting();
        if waiting.is_empty() {
            continue;
        }
        let keys: HashSet<String> = waiting.iter().map(|(_, host_id, _)| host_lease_key(*host_id)).collect();
        let holders = match relay.store.lease_holders(&keys.into_iter().collect::<Vec<_>>()).await {
            Ok(live) => live.into_iter().map(|(key, holder)| (key, holder.instance)).collect::<HashMap<_, _>>(),
            Err(e) => {
                tracing::warn!(error = %e, "tether_waiting_lease_read_failed");
                continue;
            }
        };
        for (home, host_id, owner) in waiting {
            if holders.get(&host_lease_key(host_id)) != Some(&owner) {
                home.do_send(LeaseMoved);
            }
        }
    }
}

/// Tells a home to close viewers this owner does not know (they reattach).
pub async fn unknown_viewers(relay: &RelayContext, home: &str, unknown: Vec<(Uuid, u64)>) {
    for (terminal_id, viewer_id) in unknown {
        tracing::info!(%terminal_id, viewer_id, %home, "tether_remote_viewer_unknown");
        let reason = "the host's instance does not know this viewer; reattach";
        let close = bus::Close { code: u32::from(close::HOST_GONE), reason: reason.into() };
        let frame =
            bus::ViewerFrame { home: home.to_string(), viewer_id, frame: Some(viewer_frame::Frame::Close(close)) };
        let channel = relay.bus.terminal_channel(terminal_id);
        let _ = relay.bus.publish(&channel, envelope::Body::ViewerFrame(frame)).await;
    }
}
