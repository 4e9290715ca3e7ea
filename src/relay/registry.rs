//! `HostRegistry`: this instance's live daemon connections and terminal
//! arbiters (docs/CLUSTER.md, "Ownership: the host lease").
//!
//! - Newest daemon wins: registering a host replaces (4000) the connection
//!   this instance already had for it.
//! - Every `lease.renew_ms` all held host leases are renewed in ONE store
//!   statement; a connection whose lease was not renewed (another instance
//!   seized it) is closed 4000. A renewal the database did not answer
//!   closes nothing and is retried within a quarter second.
//! - Arbiters are created on demand, one per terminal, and told when their
//!   host's connection comes and goes; while their host has no connection
//!   here, their channels are watched so they learn at once when it comes
//!   back on another instance ([`super::waiting_watch`]).
//!
//! The registry never awaits another actor, so nothing can deadlock on it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use uuid::Uuid;

use super::arbiter::{ArbiterConfig, TerminalArbiter};
use super::waiting_watch::WaitingWatch;
use super::{
    close, ArbiterId, ArbiterIdle, ArbiterLink, DaemonHandle, DaemonLink, HostElsewhere, HostOffline, HostOnline,
    InputBacklog, LifecycleEvent, Retire,
};
use crate::bus::Bus;
use crate::store::{host_lease_key, LeaseHolder, Store};

/// How soon a failed lease renewal is tried again.
const RENEW_RETRY: Duration = Duration::from_millis(250);
/// How often at most the registry looks for silent connections (one pass
/// over all of them, instead of a timer per connection); a third of
/// `daemon.idle_timeout_ms` when that is shorter.
const IDLE_CHECK: Duration = Duration::from_secs(30);

struct HostEntry {
    conn_no: u64,
    conn: DaemonHandle,
    /// Set once the connection holds its lease and finished its hello.
    ready: Option<DaemonLink>,
}

/// A terminal's arbiter on this instance; the registry started it.
struct ArbiterEntry {
    host_id: Uuid,
    addr: Addr<TerminalArbiter>,
    link: ArbiterLink,
}

pub struct HostRegistry {
    store: Arc<dyn Store>,
    instance_id: String,
    lease_ttl: Duration,
    renew_every: Duration,
    /// `daemon.idle_timeout_ms`: a connection silent this long is closed.
    idle_limit: Duration,
    arbiter_config: ArbiterConfig,
    next_conn: u64,
    hosts: HashMap<Uuid, HostEntry>,
    terminals: HashMap<Uuid, ArbiterEntry>,
    renewing: bool,
    /// Given to the host watch when the actor starts, on a shared bus.
    bus: Option<Arc<Bus>>,
    watch: WaitingWatch,
}

impl HostRegistry {
    pub fn new(
        store: Arc<dyn Store>,
        instance_id: String,
        lease_ttl: Duration,
        renew_every: Duration,
        idle_limit: Duration,
        arbiter_config: ArbiterConfig,
        bus: Arc<Bus>,
    ) -> Self {
        Self {
            store,
            instance_id,
            lease_ttl,
            renew_every,
            idle_limit,
            arbiter_config,
            next_conn: 0,
            hosts: HashMap::new(),
            terminals: HashMap::new(),
            renewing: false,
            bus: bus.is_shared().then_some(bus),
            watch: WaitingWatch::off(),
        }
    }

    /// Whether the host has a ready connection on this instance.
    fn is_here(&self, host_id: &Uuid) -> bool {
        self.hosts.get(host_id).is_some_and(|e| e.ready.is_some())
    }

    /// Sends what `message` makes to every arbiter of the host's terminals.
    fn tell_arbiters<M>(&self, host_id: Uuid, message: impl Fn() -> M)
    where
        M: Message<Result = ()> + Send + 'static,
        TerminalArbiter: Handler<M>,
    {
        for entry in self.terminals.values().filter(|t| t.host_id == host_id) {
            entry.addr.do_send(message());
        }
    }

    /// Watches the channels of `host_id`'s arbiters here exactly while the
    /// host has no ready connection here.
    fn sync_watch(&mut self, host_id: Uuid) {
        let here = self.is_here(&host_id);
        for (terminal_id, entry) in &self.terminals {
            if entry.host_id == host_id {
                self.watch.set(*terminal_id, host_id, !here);
            }
        }
    }

    /// The lease holder of one of this instance's connections.
    pub fn holder(instance_id: &str, conn_no: u64) -> LeaseHolder {
        LeaseHolder::connection(instance_id, conn_no)
    }

    /// Closes the connections that received nothing for `idle_limit`.
    fn close_silent(&self) {
        for (host_id, entry) in self.hosts.iter().filter(|(_, entry)| entry.conn.silence() > self.idle_limit) {
            tracing::info!(%host_id, "tether_daemon_idle");
            entry.conn.close(close::POLICY, "no frame within daemon.idle_timeout_ms");
        }
    }

    fn renew(&mut self, ctx: &mut Context<Self>) {
        if self.renewing {
            return; // never overlap: a slow database must not stack renewals
        }
        let leases: Vec<(String, LeaseHolder, Uuid, u64)> = self
            .hosts
            .iter()
            .filter(|(_, e)| e.ready.is_some())
            .map(|(h, e)| (host_lease_key(*h), Self::holder(&self.instance_id, e.conn_no), *h, e.conn_no))
            .collect();
        if leases.is_empty() {
            // None to renew: none held (the last host's lease was released).
            metrics::gauge!("tether_leases_held").set(0.0);
            return;
        }
        self.renewing = true;
        let store = self.store.clone();
        let ttl = self.lease_ttl;
        let pairs: Vec<(String, LeaseHolder)> = leases.iter().map(|(k, h, _, _)| (k.clone(), h.clone())).collect();
        async move {
            let started = std::time::Instant::now();
            // One statement: the leases, and the hosts' last-seen with them.
            let renewed = store.renew_leases(&pairs, ttl).await;
            metrics::histogram!("tether_lease_renew_seconds").record(started.elapsed().as_secs_f64());
            renewed.map(|keys| keys.into_iter().collect::<std::collections::HashSet<String>>())
        }
        .into_actor(self)
        .map(move |renewed, act, ctx| {
            act.renewing = false;
            match renewed {
                Ok(keys) => {
                    metrics::gauge!("tether_leases_held").set(keys.len() as f64);
                    for (key, _, host_id, conn_no) in leases {
                        if keys.contains(&key) {
                            continue;
                        }
                        // Someone else holds the lease now: this connection lost the host.
                        if let Some(entry) = act.hosts.get(&host_id).filter(|e| e.conn_no == conn_no) {
                            tracing::info!(%host_id, "tether_daemon_lease_lost");
                            entry.conn.close(close::REPLACED, "lease taken by a newer connection");
                        }
                    }
                }
                // The connections stay: a database that cannot be reached
                // says nothing about them. Their leases may lapse while it
                // is away, so the renewal is retried soon rather than at the
                // next tick, and readers give holders a lease TTL to come
                // back (docs/OPERATIONS.md, "Faults"; `lapse_grace`).
                Err(e) => {
                    tracing::warn!(error = %e, "tether_lease_renew_failed");
                    ctx.run_later(RENEW_RETRY.min(act.renew_every), |act, ctx| act.renew(ctx));
                }
            }
        })
        .spawn(ctx);
    }
}

impl Actor for HostRegistry {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.run_interval(self.renew_every, |act, ctx| act.renew(ctx));
        ctx.run_interval(IDLE_CHECK.min(self.idle_limit / 3), |act, _| act.close_silent());
        if let Some(bus) = self.bus.take() {
            self.watch = WaitingWatch::start(bus, ctx.address());
        }
    }
}

/// A daemon connection wants the host; returns its connection number.
#[derive(Message)]
#[rtype(result = "u64")]
pub struct Register {
    pub host_id: Uuid,
    pub conn: DaemonHandle,
}

impl Handler<Register> for HostRegistry {
    type Result = u64;
    fn handle(&mut self, msg: Register, _: &mut Context<Self>) -> u64 {
        self.next_conn += 1;
        let conn_no = self.next_conn;
        let entry = HostEntry { conn_no, conn: msg.conn, ready: None };
        if let Some(old) = self.hosts.insert(msg.host_id, entry) {
            tracing::info!(host_id = %msg.host_id, "tether_daemon_replaced");
            metrics::counter!("tether_daemon_replaced_total").increment(1);
            old.conn.close(close::REPLACED, "replaced by a newer connection");
            if old.ready.is_some() {
                self.notify_arbiters(msg.host_id, None);
            }
        }
        conn_no
    }
}

impl HostRegistry {
    fn notify_arbiters(&self, host_id: Uuid, online: Option<&DaemonLink>) {
        match online {
            Some(link) => self.tell_arbiters(host_id, || HostOnline(link.clone())),
            None => self.tell_arbiters(host_id, || HostOffline),
        }
    }
}

/// The connection holds its lease and finished its hello.
#[derive(Message)]
#[rtype(result = "bool")]
pub struct Ready {
    pub host_id: Uuid,
    pub conn_no: u64,
    pub daemon_queue: InputBacklog,
    pub flow_control: bool,
}

impl Handler<Ready> for HostRegistry {
    type Result = bool;
    fn handle(&mut self, msg: Ready, _: &mut Context<Self>) -> bool {
        let Some(entry) = self.hosts.get_mut(&msg.host_id).filter(|e| e.conn_no == msg.conn_no) else {
            return false; // replaced while it said hello
        };
        let link = DaemonLink { daemon: entry.conn.clone(), queue: msg.daemon_queue, flow_control: msg.flow_control };
        entry.ready = Some(link.clone());
        self.notify_arbiters(msg.host_id, Some(&link));
        self.sync_watch(msg.host_id);
        true
    }
}

/// A connection ended; returns true if it was the host's current one.
#[derive(Message)]
#[rtype(result = "bool")]
pub struct Unregister {
    pub host_id: Uuid,
    pub conn_no: u64,
}

impl Handler<Unregister> for HostRegistry {
    type Result = bool;
    fn handle(&mut self, msg: Unregister, _: &mut Context<Self>) -> bool {
        let current = self.hosts.get(&msg.host_id).is_some_and(|e| e.conn_no == msg.conn_no);
        if current {
            if let Some(entry) = self.hosts.remove(&msg.host_id) {
                if entry.ready.is_some() {
                    self.notify_arbiters(msg.host_id, None);
                }
            }
            self.sync_watch(msg.host_id);
        }
        current
    }
}

/// A host's connection on this instance, as far as it got.
pub enum HostConnection {
    /// Its hello is done: the link to use.
    Ready(DaemonLink),
    /// Registered and still in its hello (it may hold the lease already).
    InHello,
    None,
}

/// The connection of a host on this instance.
#[derive(Message)]
#[rtype(result = "HostConnection")]
pub struct HostConn(pub Uuid);

impl Handler<HostConn> for HostRegistry {
    type Result = MessageResult<HostConn>;
    fn handle(&mut self, msg: HostConn, _: &mut Context<Self>) -> Self::Result {
        MessageResult(match self.hosts.get(&msg.0) {
            Some(HostEntry { ready: Some(link), .. }) => HostConnection::Ready(link.clone()),
            Some(_) => HostConnection::InHello,
            None => HostConnection::None,
        })
    }
}

/// Another connection seized the host's lease: re-read it, and let this
/// instance's connection go (4000) if the holder is no longer its own. The
/// message is only a trigger; the lease is the truth.
#[derive(Message)]
#[rtype(result = "()")]
pub struct RecheckLease(pub Uuid);

impl Handler<RecheckLease> for HostRegistry {
    type Result = ();
    fn handle(&mut self, msg: RecheckLease, ctx: &mut Context<Self>) {
        let host_id = msg.0;
        let Some(entry) = self.hosts.get(&host_id).filter(|e| e.ready.is_some()) else { return };
        let conn_no = entry.conn_no;
        let own = Self::holder(&self.instance_id, conn_no);
        let store = self.store.clone();
        async move { store.lease_holder(&host_lease_key(host_id)).await }
            .into_actor(self)
            .map(move |holder, act, _| {
                let lost = match holder {
                    Ok(Some(holder)) => holder != own,
                    Ok(None) => false,
                    Err(e) => {
                        tracing::warn!(error = %e, %host_id, "tether_lease_read_failed");
                        false
                    }
                };
                if let Some(entry) = act.hosts.get(&host_id).filter(|e| lost && e.conn_no == conn_no) {
                    tracing::info!(%host_id, "tether_daemon_lease_lost");
                    entry.conn.close(close::REPLACED, "replaced by a newer connection");
                }
            })
            .spawn(ctx);
    }
}

/// A host's takeover was announced on a terminal channel (or a watch just
/// started): if this instance has arbiters of that host waiting with no
/// connection here, read the lease; when another instance holds it, they
/// send their waiting viewers there.
#[derive(Message)]
#[rtype(result = "()")]
pub struct RecheckWaiting(pub Uuid);

impl Handler<RecheckWaiting> for HostRegistry {
    type Result = ();
    fn handle(&mut self, msg: RecheckWaiting, ctx: &mut Context<Self>) {
        let host_id = msg.0;
        if !self.watch.watches_host(host_id) {
            return;
        }
        let store = self.store.clone();
        async move { store.lease_holder(&host_lease_key(host_id)).await }
            .into_actor(self)
            .map(move |holder, act, _| match holder {
                Ok(Some(holder)) if holder.instance != act.instance_id => act.tell_arbiters(host_id, || HostElsewhere),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, %host_id, "tether_lease_read_failed"),
            })
            .spawn(ctx);
    }
}

/// Those of the given hosts that have a ready connection on this instance.
#[derive(Message)]
#[rtype(result = "Vec<Uuid>")]
pub struct ConnectedAmong(pub Vec<Uuid>);

impl Handler<ConnectedAmong> for HostRegistry {
    type Result = Vec<Uuid>;
    fn handle(&mut self, ConnectedAmong(mut hosts): ConnectedAmong, _: &mut Context<Self>) -> Vec<Uuid> {
        hosts.retain(|h| self.hosts.get(h).is_some_and(|e| e.ready.is_some()));
        hosts
    }
}

/// Hosts not connected here that have arbiters here: their viewers wait,
/// and the host may come back on another instance.
#[derive(Message)]
#[rtype(result = "Vec<Uuid>")]
pub struct WaitingHosts;

impl Handler<WaitingHosts> for HostRegistry {
    type Result = MessageResult<WaitingHosts>;
    fn handle(&mut self, _: WaitingHosts, _: &mut Context<Self>) -> Self::Result {
        let hosts: std::collections::HashSet<Uuid> =
            self.terminals.values().map(|t| t.host_id).filter(|host| !self.is_here(host)).collect();
        MessageResult(hosts.into_iter().collect())
    }
}

/// These hosts are connected to other instances (the heartbeat read their
/// leases): arbiters here that still wait for them send their viewers
/// there.
#[derive(Message)]
#[rtype(result = "()")]
pub struct HostsElsewhere(pub Vec<Uuid>);

impl Handler<HostsElsewhere> for HostRegistry {
    type Result = ();
    fn handle(&mut self, msg: HostsElsewhere, _: &mut Context<Self>) {
        for host_id in msg.0.into_iter().filter(|host| !self.is_here(host)) {
            self.tell_arbiters(host_id, || HostElsewhere);
        }
    }
}

/// The arbiter of a terminal, created if needed.
#[derive(Message)]
#[rtype(result = "ArbiterLink")]
pub struct OpenTerminal {
    pub terminal_id: Uuid,
    pub host_id: Uuid,
}

impl Handler<OpenTerminal> for HostRegistry {
    type Result = MessageResult<OpenTerminal>;
    fn handle(&mut self, msg: OpenTerminal, ctx: &mut Context<Self>) -> Self::Result {
        // An arbiter whose thread ended (a worker that died) is replaced.
        if let Some(entry) = self.terminals.get(&msg.terminal_id).filter(|entry| entry.addr.connected()) {
            return MessageResult(entry.link.clone());
        }
        let host = self.hosts.get(&msg.host_id);
        let online = host.and_then(|e| e.ready.clone().map(HostOnline));
        let id = ArbiterId::next();
        let (config, store, registry) = (self.arbiter_config.clone(), self.store.clone(), ctx.address().recipient());
        let terminal_id = msg.terminal_id;
        let make = move |_: &mut Context<TerminalArbiter>| {
            TerminalArbiter::new(terminal_id, id, config, store, registry, online)
        };
        // On the thread of the host's connection when it is here: the
        // daemon's output and the viewers' input then reach the arbiter
        // without waking another thread.
        let arbiter = match host {
            Some(entry) => TerminalArbiter::start_in_arbiter(entry.conn.thread(), make),
            None => TerminalArbiter::create(make),
        };
        let link = ArbiterLink::of(id, &arbiter);
        let entry = ArbiterEntry { host_id: msg.host_id, addr: arbiter, link: link.clone() };
        self.terminals.insert(msg.terminal_id, entry);
        metrics::gauge!("tether_terminal_arbiters").set(self.terminals.len() as f64);
        self.sync_watch(msg.host_id);
        MessageResult(link)
    }
}

impl Handler<ArbiterIdle> for HostRegistry {
    type Result = ();
    fn handle(&mut self, msg: ArbiterIdle, _: &mut Context<Self>) {
        if self.terminals.get(&msg.terminal_id).is_some_and(|t| t.link.id == msg.arbiter) {
            if let Some(entry) = self.terminals.remove(&msg.terminal_id) {
                self.watch.set(msg.terminal_id, entry.host_id, false);
            }
            metrics::gauge!("tether_terminal_arbiters").set(self.terminals.len() as f64);
        }
        msg.retire.do_send(Retire);
    }
}

/// A lifecycle event for a terminal, delivered to its arbiter if it has one.
#[derive(Message)]
#[rtype(result = "()")]
pub struct TerminalLifecycle {
    pub terminal_id: Uuid,
    pub event: LifecycleEvent,
}

impl Handler<TerminalLifecycle> for HostRegistry {
    type Result = ();
    fn handle(&mut self, msg: TerminalLifecycle, _: &mut Context<Self>) {
        if let Some(entry) = self.terminals.get(&msg.terminal_id) {
            entry.addr.do_send(msg.event);
        }
    }
}

/// Drain (docs/ARCHITECTURE.md, "Drain"): closes every daemon connection with 4503 (the
/// daemons redial at once, elsewhere) and every viewer with 4503 (they
/// reattach); returns every connection's (host, holder), for the drain to
/// release their leases in one statement.
#[derive(Message)]
#[rtype(result = "Vec<(Uuid, LeaseHolder)>")]
pub struct DrainAll;

impl Handler<DrainAll> for HostRegistry {
    type Result = MessageResult<DrainAll>;
    fn handle(&mut self, _: DrainAll, _: &mut Context<Self>) -> Self::Result {
        let mut held = Vec::new();
        for (host_id, entry) in self.hosts.drain() {
            entry.conn.close(close::DRAINING, "instance draining");
            // Every connection's holder: one whose claim is still in flight
            // has seized nothing yet (releasing by holder then does
            // nothing) and releases what it seizes itself.
            held.push((host_id, Self::holder(&self.instance_id, entry.conn_no)));
        }
        for entry in self.terminals.values() {
            entry.addr.do_send(HostOffline);
        }
        MessageResult(held)
    }
}
