//! The hello of a daemon connection: admission (the cell's one admission
//! step, `crate::cell::admission`), the claim (subscribe, seize the lease,
//! tell the previous owner), reconciliation of terminal rows, then the
//! acknowledgement and the parked spawns.

use std::collections::{HashMap, HashSet};

use super::*;
use crate::cell::admission::{self, Verdict};
use crate::cell::bookings::AdmittedBy;
use crate::store::{HelloTerminal, HostHello};

/// What the hello established, applied back on the actor.
struct Accepted {
    /// The epoch and the path of the admission, for the cell's seat.
    admitted: (i64, AdmittedBy),
    capabilities: Capabilities,
    claim: Claim,
    live: Vec<crate::store::Terminal>,
    parked: Vec<crate::store::Terminal>,
    /// Terminals the daemon runs that have no live row (docs/PROTOCOL.md,
    /// the hello's reconciliation): hung up after the HelloAck.
    orphans: Vec<Uuid>,
    /// Ended terminals whose tail a run's log still lacks: the HelloAck
    /// names them (`resume_ended`).
    resume_ended: Vec<Uuid>,
}

/// What a hello took before it could fail: cleaned up when the connection
/// stops (registry entry, bus subscription, and the lease if it was seized).
struct Claim {
    conn_no: u64,
    holder: LeaseHolder,
    subscribed: bool,
    /// The subscription still under way after [`SUBSCRIBE_WAIT`].
    subscribing: Option<Subscribing>,
}

/// A bus subscription that goes on in the background.
type Subscribing = actix_rt::task::JoinHandle<Result<(), crate::bus::BusError>>;
/// A bus subscription under way.
type Subscription = std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), crate::bus::BusError>>>>;

/// How long a hello waits for its host's bus subscription before it goes
/// on without it. With Redis away the subscription waits for Redis to
/// come back; the hello does not: the host is claimed (its lease is in the
/// database), served here, and reachable from other instances once the
/// subscription, finished in the background, is in place
/// (docs/CLUSTER.md, "Ownership: the host lease").
const SUBSCRIBE_WAIT: Duration = Duration::from_secs(2);
/// How often a background subscription that failed is tried again.
const SUBSCRIBE_RETRY: Duration = Duration::from_secs(1);

/// Why a hello was refused: the close code and reason (a wrong cell's
/// reason names the URL to dial).
struct Refused(u16, String, Option<Claim>);

/// A refusal made before any claim.
fn refused((code, reason): (u16, &'static str)) -> Refused {
    Refused(code, reason.into(), None)
}

/// Logs a store failure with its cause; the daemon is told only
/// "database error".
fn database_error(e: StoreError) -> (u16, &'static str) {
    tracing::error!(error = %e, "tether_store_error");
    (close::INTERNAL, "database error")
}

/// Why a hello's (or a DirsResult's) dirs cannot be stored, if they
/// cannot: each must be an absolute path without NUL, at most
/// `MAX_DIR_PATH_BYTES` long, as the daemon keeps them (docs/PROTOCOL.md,
/// "What the server enforces"). REST checks a terminal's `dir` against
/// them by prefix, so a relative or empty entry would allow what no daemon
/// lists.
pub(super) fn bad_dirs(dirs: &[String]) -> Option<&'static str> {
    for dir in dirs {
        if !dir.starts_with('/') || dir.contains('\0') {
            return Some("malformed hello: a dir is not an absolute path");
        }
        if dir.len() > crate::daemon::MAX_DIR_PATH_BYTES {
            return Some("malformed hello: a dir is longer than 4096 bytes");
        }
    }
    None
}

/// What the rest of the hello established once the host was claimed.
struct Taken {
    capabilities: Capabilities,
    live: Vec<crate::store::Terminal>,
    parked: Vec<crate::store::Terminal>,
    captures: Vec<(Uuid, Uuid, u64)>,
    orphans: Vec<Uuid>,
    resume_ended: Vec<Uuid>,
}

/// A run's command ended while its daemon, one without `resume_ended`,
/// was disconnected: it reports the terminal ended and does not send the
/// output it printed after the link dropped (it refuses an Attach to an
/// ended terminal), so the log lacks the stream from where it ends to
/// `end`. That is recorded now as a gap (`logGapBytes`), before the run's
/// end is, so the run says what its log lacks (docs/CLUSTER.md, "Run logs
/// across moves").
async fn record_unsent_tail(relay: &RelayContext, terminal_id: Uuid, run_id: Uuid, log_end: u64, end: u64) {
    let max = relay.settings.runs.log_max_bytes;
    match relay.store.append_run_log(run_id, end, &[], max).await {
        Ok(()) => {
            tracing::warn!(%terminal_id, %run_id, lost = end - log_end, "tether_run_log_gap");
            metrics::counter!("tether_run_log_gap_bytes_total").increment(end - log_end);
        }
        Err(e) => tracing::warn!(error = %e, %terminal_id, %run_id, "tether_run_log_unsent_tail_not_recorded"),
    }
}

/// Records the hello in one store call (seizes the lease, newest daemon
/// wins; the host online; its terminal rows reconciled), then tells the
/// previous owner.
async fn take_host(
    relay: &RelayContext,
    host_id: Uuid,
    holder: &LeaseHolder,
    hello: crate::proto::v1::Hello,
) -> Result<Taken, (u16, &'static str)> {
    let caps = hello.capabilities.unwrap_or_default();
    // The daemon serves an ended terminal's tail (docs/PROTOCOL.md,
    // "Terminals that ended while disconnected").
    let serves_tail = caps.resume_ended;
    let capabilities = Capabilities {
        manage_dirs: caps.manage_dirs,
        refresh_limits: caps.refresh_limits,
        credentials: caps.credentials,
        usage: caps.usage,
        flow_control: caps.flow_control,
        input_flow_control: caps.input_flow_control,
    };
    let reported: Vec<(Uuid, bool)> =
        hello.terminals.iter().filter_map(|t| Some((Uuid::parse_str(&t.terminal_id).ok()?, t.running))).collect();
    // Terminals that ended while no connection was attached, with the
    // stream offset they reached.
    let ended: HashMap<Uuid, u64> = hello
        .terminals
        .iter()
        .filter(|t| !t.running)
        .filter_map(|t| Some((Uuid::parse_str(&t.terminal_id).ok()?, t.next_offset)))
        .collect();
    let running: Vec<Uuid> = reported.iter().map(|(id, _)| *id).collect();
    let record = HostHello {
        host_id,
        holder,
        lease_ttl: Duration::from_millis(relay.settings.lease.ttl_ms),
        capabilities: &capabilities,
        dirs: &hello.dirs,
        running: &running,
    };
    let terminals = relay.store.host_hello(&record).await.map_err(database_error)?;
    // The previous owner, if any, re-reads the lease and lets its connection
    // go. Not waiting for Redis: without it, that owner finds out at its
    // next renewal.
    let taken = crate::proto::bus::HostTaken { host_id: host_id.to_string() };
    let channel = relay.bus.host_channel(host_id);
    if let Err(e) = relay.bus.publish_or_fail(&channel, crate::proto::bus::envelope::Body::HostTaken(taken)).await {
        tracing::warn!(error = %e, %host_id, "tether_host_taken_publish_failed");
    }
    let known: HashSet<Uuid> = terminals.iter().map(|t| t.terminal.id).collect();
    let orphans = reported.iter().filter(|(id, running)| *running && !known.contains(id)).map(|(id, _)| *id).collect();
    let mut taken = Taken {
        capabilities,
        live: Vec::new(),
        parked: Vec::new(),
        captures: Vec::new(),
        orphans,
        resume_ended: Vec::new(),
    };
    for HelloTerminal { terminal, unfinished_run_log_end } in terminals {
        if let (TerminalState::Running, Some(run_id), Some(log_end)) =
            (terminal.state, terminal.run_id, unfinished_run_log_end)
        {
            // The capture resumes at the stream offset the log reached.
            let log_end = u64::try_from(log_end).unwrap_or(0);
            if let Some(&end) = ended.get(&terminal.id).filter(|&&end| end > log_end) {
                if serves_tail {
                    taken.resume_ended.push(terminal.id);
                } else {
                    record_unsent_tail(relay, terminal.id, run_id, log_end, end).await;
                }
            }
            taken.captures.push((terminal.id, run_id, log_end));
        }
        if terminal.state == TerminalState::Pending {
            taken.parked.push(terminal);
        } else {
            taken.live.push(terminal);
        }
    }
    Ok(taken)
}

/// Finishes a subscription the hello went on without: waits for it, and
/// tries again while the connection lives, then hands it to the connection
/// (`late`: its address and number), or gives it back when that connection
/// has gone or was refused.
async fn finish_subscription(
    relay: RelayContext,
    host_id: Uuid,
    subscribing: Subscribing,
    late: Option<(Addr<DaemonConn>, u64)>,
) {
    let mut done = matches!(subscribing.await, Ok(Ok(())));
    while !done {
        match &late {
            Some((conn, _)) if conn.connected() => {
                tokio::time::sleep(SUBSCRIBE_RETRY).await;
                done = relay.bus.subscribe(&relay.bus.host_channel(host_id)).await.is_ok();
            }
            _ => return,
        }
    }
    let kept = match late {
        Some((conn, conn_no)) => conn.send(LateSubscribed { conn_no }).await.unwrap_or(false),
        None => false,
    };
    if kept {
        tracing::info!(%host_id, "tether_bus_subscribed_late");
    } else {
        relay.bus.unsubscribe(&relay.bus.host_channel(host_id)).await;
    }
}

/// The host's bus subscription, finished after the hello, is this
/// connection's now; false when the connection is not the ready one it
/// was made for (it will not unsubscribe it).
#[derive(Message)]
#[rtype(result = "bool")]
struct LateSubscribed {
    conn_no: u64,
}

impl Handler<LateSubscribed> for DaemonConn {
    type Result = bool;

    fn handle(&mut self, msg: LateSubscribed, _: &mut Context<Self>) -> bool {
        match self.host.as_mut() {
            Some(host) if host.conn_no == msg.conn_no && host.ready && !self.closed => {
                host.subscribed = true;
                true
            }
            _ => false,
        }
    }
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
        self.heard.stamp();
        let hello = msg.0;
        if let Some(reason) = bad_dirs(&hello.dirs) {
            tracing::info!(reason, "tether_daemon_hello_refused");
            self.close(close::POLICY, reason, ctx);
            return AtomicResponse::new(Box::pin(actix::fut::ready(false)));
        }
        let relay = self.relay.clone();
        let principal = self.principal.clone();
        let bound_host = self.bound_host.take();
        let conn = DaemonHandle::of(&ctx.address(), self.heard.clone(), Some(self.outbox.sender()));
        let queue = InputBacklog::new(self.outbox.queued_counter(), self.input_flow.held());
        let host_id = Uuid::parse_str(&hello.host_id).ok();
        let fut = async move {
            let host_id = host_id.ok_or(Refused(close::FORBIDDEN, "unknown host".into(), None))?;
            // The one admission step (docs/CELLS.md, "Admission").
            let verdict = admission::admit(
                &relay.cell,
                relay.store.as_ref(),
                &principal,
                bound_host.as_deref(),
                host_id,
                hello.booking.as_ref(),
                Instant::now(),
            )
            .await;
            let admitted = match verdict {
                Verdict::Accept { by, epoch } => (epoch, by),
                Verdict::WrongCell { cell_id, url } => {
                    let reason = Verdict::wrong_cell_reason(&cell_id, url.as_deref());
                    return Err(Refused(close::WRONG_CELL, reason, None));
                }
                Verdict::Refuse { code, reason } => return Err(refused((code, reason))),
            };
            // Registered, subscribed and seized in this host's turn
            // (`relay::claims`), so the connection the registry keeps is the
            // one whose seize commits last.
            let _turn = relay.claims.turn(host_id).await;
            let conn_no = relay
                .registry
                .send(Register { host_id, conn })
                .await
                .map_err(|_| Refused(close::INTERNAL, "registry unavailable".into(), None))?;
            let holder = HostRegistry::holder(&relay.instance_id, conn_no);
            // Subscribe first, then seize (docs/CLUSTER.md): a request
            // published right after the seize finds this instance listening.
            // At most SUBSCRIBE_WAIT, though: with Redis away nothing is
            // published, and the hello does not wait for Redis.
            // Only a subscription still under way then becomes a task of
            // its own (it is not dropped half done); the usual one is not.
            let bus = relay.bus.clone();
            let mut subscription: Subscription =
                Box::pin(async move { bus.subscribe(&bus.host_channel(host_id)).await });
            let (subscribed, subscribing) = match tokio::time::timeout(SUBSCRIBE_WAIT, &mut subscription).await {
                Ok(Ok(())) => (true, None),
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, %host_id, "tether_bus_subscribe_failed");
                    (false, None)
                }
                Err(_) => {
                    tracing::warn!(%host_id, "tether_bus_subscribe_slow");
                    (false, Some(actix_rt::spawn(subscription)))
                }
            };
            let claim = Claim { conn_no, holder, subscribed, subscribing };
            match take_host(&relay, host_id, &claim.holder, hello).await {
                Ok(t) => {
                    // Each unfinished run's capture is in its arbiter before
                    // the HelloAck, so the Exit the daemon sends right after
                    // it (a run that ended while it was away) finds it and
                    // ends the run. Opened later, an Exit that came first
                    // left an arbiter with no capture, which the capture
                    // then found retiring: the run stayed `running`.
                    for &(terminal_id, run_id, logged) in &t.captures {
                        if let Ok(arbiter) = relay.registry.send(OpenTerminal { terminal_id, host_id }).await {
                            arbiter.capture(CaptureRun { run_id, logged, attach_id: None });
                        }
                    }
                    Ok(Accepted {
                        admitted,
                        capabilities: t.capabilities,
                        claim,
                        live: t.live,
                        parked: t.parked,
                        orphans: t.orphans,
                        resume_ended: t.resume_ended,
                    })
                }
                Err((code, reason)) => Err(Refused(code, reason.into(), Some(claim))),
            }
        };
        AtomicResponse::new(Box::pin(fut.into_actor(self).map(move |result, act, ctx| match result {
            Err(Refused(code, reason, claim)) => {
                tracing::info!(code, reason = %reason, "tether_daemon_hello_refused");
                if let (Some(claim), Some(host_id)) = (claim, host_id) {
                    if let Some(subscribing) = claim.subscribing {
                        actix_rt::spawn(finish_subscription(act.relay.clone(), host_id, subscribing, None));
                    }
                    act.host = Some(HostSession {
                        host_id,
                        conn_no: claim.conn_no,
                        holder: claim.holder,
                        ready: false,
                        capabilities: Capabilities::default(),
                        subscribed: claim.subscribed,
                    });
                }
                act.close(code, &reason, ctx);
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
                if let Some(subscribing) = accepted.claim.subscribing {
                    let late = Some((ctx.address(), accepted.claim.conn_no));
                    actix_rt::spawn(finish_subscription(act.relay.clone(), host_id, subscribing, late));
                }
                let (epoch, by) = accepted.admitted;
                act.relay.cell.seats().seated(host_id, epoch, accepted.claim.conn_no, by);
                act.seated = true;
                for t in &accepted.live {
                    // Reported by the daemon: its process runs.
                    let owned = act.owned.entry(t.id).or_default();
                    owned.run_id = t.run_id;
                    owned.started = true;
                    owned.size = Some((t.cols, t.rows));
                }
                let ack = crate::proto::v1::HelloAck {
                    instance_id: act.relay.instance_id.clone(),
                    resume_ended: accepted.resume_ended.iter().map(Uuid::to_string).collect(),
                };
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
                for terminal_id in accepted.orphans {
                    tracing::info!(%host_id, %terminal_id, "tether_daemon_orphan_hung_up");
                    let kill = crate::proto::v1::Kill { terminal_id: terminal_id.to_string(), signal: libc::SIGHUP };
                    act.send(server_frame::Frame::Kill(kill), ctx);
                }
                for terminal in accepted.parked {
                    ctx.wait(act.spawn_terminal(terminal).map(|_, _, _| ()));
                }
                true
            }
        })))
    }
}
