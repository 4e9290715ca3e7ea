//! Requests to a host's daemon from any instance (docs/CLUSTER.md,
//! "Requests").
//!
//! [`locate`] is the one routing step: the host's daemon is connected here
//! (a link to its `DaemonConn`), or its lease is live on another instance
//! (reach it over the bus), or nobody holds it (offline). [`deliver`] is
//! the one request lifecycle every caller uses (REST handlers, the run
//! dispatcher, the sweep), for every kind of request:
//! - here: the operation runs on the local connection;
//! - elsewhere: a `HostRequest` is published on the host's channel. Nobody
//!   subscribed (0 receivers) is `offline` at once; no acknowledgement
//!   within `bus.ack_ms` is `unacknowledged` (never re-sent: a spawn's row
//!   stays `launching` and the sweep fails it if it never starts); then
//!   requests that have an answer wait for it.
//!
//! [`serve_bus`] is the other side: it reads the instance's bus inbox,
//! acknowledges and runs requests for hosts connected here and hands
//! replies to the callers waiting for them. Every operation is handed to
//! the host's connection in arrival order (a spawn, then an input for it,
//! reach the daemon in that order); only the waits for answers run apart. Credentials are refreshed by the owner as a
//! whole task; only "ok" or an error crosses the bus.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use super::registry::{HostConn, HostConnection, RecheckLease, RecheckWaiting};
use super::{DaemonAnswer, DaemonLink, DaemonRequestKind, RelayContext, RequestError};
use crate::bus::{Arrival, Inbound, SeenSequence};
use crate::proto::bus::{self, answer, envelope, host_request, reply};
use crate::proto::v1::server_frame;
use crate::store::host_lease_key;

/// Something to do on a host's daemon.
#[derive(Debug, Clone)]
pub enum HostOp {
    /// Claim the parked terminal and send Spawn.
    Spawn(Uuid),
    Input {
        terminal_id: Uuid,
        data: Bytes,
    },
    Resize {
        terminal_id: Uuid,
        cols: u16,
        rows: u16,
    },
    Kill {
        terminal_id: Uuid,
        signal: i32,
    },
    Dirs {
        add: bool,
        path: String,
    },
    RefreshLimits,
    /// Ask the daemon, validate, store encrypted (an owner task).
    RefreshCredentials,
    /// A viewer on this instance joins the terminal on the owner (never
    /// run locally: a local viewer joins the arbiter directly).
    ViewerJoin {
        terminal_id: Uuid,
        viewer: u64,
        resume_from: Option<u64>,
        read_only: bool,
    },
}

impl HostOp {
    /// How long the caller waits for the answer after the acknowledgement;
    /// `None` for operations that are done once the owner has them.
    fn answer_timeout(&self) -> Option<Duration> {
        match self {
            HostOp::Input { .. } | HostOp::Resize { .. } | HostOp::Kill { .. } => None,
            HostOp::Spawn(_) | HostOp::Dirs { .. } | HostOp::RefreshCredentials | HostOp::ViewerJoin { .. } => {
                Some(Duration::from_secs(11))
            }
            HostOp::RefreshLimits => Some(Duration::from_secs(31)),
        }
    }
}

/// What a delivered operation produced.
#[derive(Debug, Clone)]
pub enum OpAnswer {
    /// Handed to the daemon (input, resize, kill).
    Sent,
    /// Spawn: whether the owner claimed the terminal and sent it.
    Spawned(bool),
    Dirs(Vec<String>),
    Limits(serde_json::Value),
    CredentialsStored,
}

/// Where a host's daemon is.
pub enum Location {
    Local(DaemonLink),
    /// Connected to this other instance (its lease is live there).
    Remote(String),
    Offline,
}

/// How often a request for a host whose connection here is still in its
/// hello looks again.
const HELLO_POLL: Duration = Duration::from_millis(20);

/// The host's ready connection on this instance. A connection still in its
/// hello may already hold the lease (so the host reads online everywhere):
/// a request waits for its hello to finish, at most `daemon.hello_timeout_ms`,
/// rather than calling the host offline.
async fn local_link(relay: &RelayContext, host_id: Uuid) -> Option<DaemonLink> {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(relay.settings.daemon.hello_timeout_ms);
    loop {
        match relay.registry.send(HostConn(host_id)).await {
            Ok(HostConnection::Ready(link)) => return Some(link),
            Ok(HostConnection::InHello) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(HELLO_POLL).await;
            }
            _ => return None,
        }
    }
}

/// The routing step: the local connection, else the lease.
pub async fn locate(relay: &RelayContext, host_id: Uuid) -> Result<Location, RequestError> {
    if let Some(link) = local_link(relay, host_id).await {
        return Ok(Location::Local(link));
    }
    if !relay.bus.is_shared() {
        return Ok(Location::Offline);
    }
    match relay.store.lease_holder(&host_lease_key(host_id)).await {
        Ok(Some(holder)) if holder.instance != relay.instance_id => Ok(Location::Remote(holder.instance)),
        // Held here by a connection that is not ready yet (or just left).
        Ok(Some(_)) => Ok(Location::Offline),
        Ok(None) => Ok(Location::Offline),
        Err(e) => {
            tracing::error!(error = %e, %host_id, "tether_locate_failed");
            Err(RequestError::Internal)
        }
    }
}

/// Runs `op` on the host's daemon, wherever it is connected.
pub async fn deliver(relay: &RelayContext, host_id: Uuid, op: HostOp) -> Result<OpAnswer, RequestError> {
    let outcome = match locate(relay, host_id).await? {
        Location::Local(link) => match dispatch(relay, &link, op) {
            Ok(dispatched) => finish(relay, host_id, dispatched).await,
            Err(e) => Err(e),
        },
        Location::Remote(_) => ask_owner(relay, host_id, op).await,
        Location::Offline => Err(RequestError::Offline),
    };
    let label = match &outcome {
        Ok(_) => "sent",
        Err(RequestError::Offline) => "offline",
        Err(RequestError::Unacknowledged) => "unacknowledged",
        Err(RequestError::BusAway) => "bus_away",
        Err(RequestError::Unheard) => "unheard",
        Err(_) => "failed",
    };
    metrics::counter!("tether_requests_total", "outcome" => label).increment(1);
    outcome
}

/// An operation handed to a connection of this instance: queued there in
/// the order it was handed over, so one host's operations reach its daemon
/// in order whatever their kind; what remains is waiting for the answer.
enum Dispatched {
    /// A frame that needs no answer (input, resize, kill).
    Sent,
    Spawn(oneshot::Receiver<bool>),
    Asked(Expect, oneshot::Receiver<Result<DaemonAnswer, RequestError>>),
}

/// What a daemon request's answer becomes.
enum Expect {
    Dirs,
    Limits,
    /// Validated and stored encrypted with this key (an owner task).
    Credentials([u8; 32]),
}

/// Hands `op` to the local connection without waiting.
fn dispatch(relay: &RelayContext, link: &DaemonLink, op: HostOp) -> Result<Dispatched, RequestError> {
    let daemon = &link.daemon;
    let ask = |kind, expect| {
        let (answer, answered) = oneshot::channel();
        daemon.request(kind, answer);
        Ok(Dispatched::Asked(expect, answered))
    };
    match op {
        HostOp::Spawn(terminal_id) => {
            let (sent, spawned) = oneshot::channel();
            daemon.spawn(terminal_id, sent);
            Ok(Dispatched::Spawn(spawned))
        }
        HostOp::Input { terminal_id, data } => {
            // Refused rather than queued behind input the daemon has not
            // read: past `OUTBOUND_LIMIT` the daemon is closed and what is
            // queued is lost.
            if link.queue.bytes_for(terminal_id) > super::INPUT_QUEUE_LIMIT {
                return Err(RequestError::InputBacklog);
            }
            daemon.input(terminal_id, data);
            Ok(Dispatched::Sent)
        }
        HostOp::Resize { terminal_id, cols, rows } => {
            daemon.frame(server_frame::Frame::Resize(crate::proto::v1::Resize {
                terminal_id: terminal_id.to_string(),
                cols: u32::from(cols),
                rows: u32::from(rows),
            }));
            Ok(Dispatched::Sent)
        }
        HostOp::Kill { terminal_id, signal } => {
            daemon.frame(server_frame::Frame::Kill(crate::proto::v1::Kill {
                terminal_id: terminal_id.to_string(),
                signal,
            }));
            Ok(Dispatched::Sent)
        }
        HostOp::Dirs { add, path } => {
            let kind = if add { DaemonRequestKind::AddDir(path) } else { DaemonRequestKind::RemoveDir(path) };
            ask(kind, Expect::Dirs)
        }
        HostOp::RefreshLimits => ask(DaemonRequestKind::RefreshLimits, Expect::Limits),
        HostOp::RefreshCredentials => {
            let key = relay.settings.encryption_key().ok_or(RequestError::EncryptionNotConfigured)?;
            ask(DaemonRequestKind::Credentials, Expect::Credentials(key))
        }
        HostOp::ViewerJoin { .. } => Err(RequestError::Internal),
    }
}

/// Waits for what a dispatched operation produces.
async fn finish(relay: &RelayContext, host_id: Uuid, dispatched: Dispatched) -> Result<OpAnswer, RequestError> {
    let (expect, answered) = match dispatched {
        Dispatched::Sent => return Ok(OpAnswer::Sent),
        Dispatched::Spawn(spawned) => return Ok(OpAnswer::Spawned(spawned.await.unwrap_or(false))),
        Dispatched::Asked(expect, answered) => (expect, answered),
    };
    // The connection answers every request, a timeout included; a dropped
    // sender means it went away.
    let answer = answered.await.map_err(|_| RequestError::Offline)??;
    match (expect, answer) {
        (Expect::Dirs, DaemonAnswer::Dirs(dirs)) => Ok(OpAnswer::Dirs(dirs)),
        (Expect::Limits, DaemonAnswer::Limits(limits)) => Ok(OpAnswer::Limits(limits)),
        (Expect::Credentials(key), DaemonAnswer::Credentials(plaintext)) => {
            let value = serde_json::from_slice::<serde_json::Value>(&plaintext).ok().filter(|v| v.is_object());
            let Some(value) = value.filter(|_| plaintext.len() <= 64 * 1024) else {
                return Err(RequestError::Refused(
                    "the daemon's credentials are not a JSON object of at most 64 KiB".into(),
                ));
            };
            let sealed = crate::crypto::seal(&key, host_id, &plaintext).map_err(|_| RequestError::Internal)?;
            let expires_at = crate::jobs::credentials::stated_expiry(&value);
            relay.store.put_credentials(host_id, &sealed, expires_at).await.map_err(|e| {
                tracing::error!(error = %e, %host_id, "tether_credentials_store_failed");
                RequestError::Internal
            })?;
            Ok(OpAnswer::CredentialsStored)
        }
        // The connection hands on only answers of the request's kind
        // (`daemon_conn::requests`); anything else is a bug here.
        _ => {
            tracing::error!(%host_id, "tether_daemon_answer_mismatch");
            Err(RequestError::Internal)
        }
    }
}

/// Callers waiting for replies from other instances, by request id.
#[derive(Default)]
pub struct PendingRequests {
    waiting: Mutex<HashMap<String, Waiting>>,
}

struct Waiting {
    ack: Option<oneshot::Sender<()>>,
    answer: Option<oneshot::Sender<bus::Answer>>,
}

impl PendingRequests {
    fn waiting(&self) -> std::sync::MutexGuard<'_, HashMap<String, Waiting>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn insert(&self, request_id: &str) -> (oneshot::Receiver<()>, oneshot::Receiver<bus::Answer>) {
        let (ack, acked) = oneshot::channel();
        let (answer, answered) = oneshot::channel();
        self.waiting().insert(request_id.to_string(), Waiting { ack: Some(ack), answer: Some(answer) });
        (acked, answered)
    }

    fn forget(&self, request_id: &str) {
        self.waiting().remove(request_id);
    }

    /// A reply from an owner. An answer also counts as the acknowledgement
    /// (the two travel in order, but the ack may have been lost); it is
    /// handed over first, so a caller woken by the acknowledgement finds it.
    fn resolve(&self, reply: bus::Reply) {
        let mut waiting = self.waiting();
        let Some(entry) = waiting.get_mut(&reply.request_id) else { return };
        let answered = matches!(reply.outcome, Some(reply::Outcome::Answer(_)));
        if let Some(reply::Outcome::Answer(answer)) = reply.outcome {
            if let Some(tx) = entry.answer.take() {
                let _ = tx.send(answer);
            }
        }
        if let Some(ack) = entry.ack.take() {
            let _ = ack.send(());
        }
        if answered {
            waiting.remove(&reply.request_id);
        }
    }
}

/// Removes a request's waiters however the caller's future ends.
struct Forget<'a>(&'a PendingRequests, String);

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.0.forget(&self.1);
    }
}

fn to_wire(op: HostOp) -> host_request::Op {
    match op {
        HostOp::Spawn(id) => host_request::Op::Spawn(bus::Spawn { terminal_id: id.to_string() }),
        HostOp::Input { terminal_id, data } => {
            host_request::Op::Input(bus::Input { terminal_id: terminal_id.to_string(), data })
        }
        HostOp::Resize { terminal_id, cols, rows } => host_request::Op::Resize(bus::Resize {
            terminal_id: terminal_id.to_string(),
            cols: u32::from(cols),
            rows: u32::from(rows),
        }),
        HostOp::Kill { terminal_id, signal } => {
            host_request::Op::Kill(bus::Kill { terminal_id: terminal_id.to_string(), signal })
        }
        HostOp::Dirs { add, path } => host_request::Op::Dirs(bus::Dirs { add, path }),
        HostOp::RefreshLimits => host_request::Op::LimitsRefresh(bus::LimitsRefresh {}),
        HostOp::RefreshCredentials => host_request::Op::CredentialsRefresh(bus::CredentialsRefresh {}),
        HostOp::ViewerJoin { terminal_id, viewer, resume_from, read_only } => {
            host_request::Op::ViewerJoin(bus::ViewerJoin {
                terminal_id: terminal_id.to_string(),
                viewer_id: viewer,
                resume_from,
                read_only,
            })
        }
    }
}

/// A request that arrived over the bus, checked; `None` if malformed.
pub fn from_wire(op: host_request::Op) -> Option<HostOp> {
    let id = |raw: &str| Uuid::parse_str(raw).ok();
    let grid = |v: u32| u16::try_from(v.clamp(1, 1000)).unwrap_or(1000);
    Some(match op {
        host_request::Op::Spawn(s) => HostOp::Spawn(id(&s.terminal_id)?),
        host_request::Op::Input(i) => HostOp::Input { terminal_id: id(&i.terminal_id)?, data: i.data },
        host_request::Op::Resize(r) => {
            HostOp::Resize { terminal_id: id(&r.terminal_id)?, cols: grid(r.cols), rows: grid(r.rows) }
        }
        host_request::Op::Kill(k) => HostOp::Kill { terminal_id: id(&k.terminal_id)?, signal: k.signal },
        host_request::Op::Dirs(d) => HostOp::Dirs { add: d.add, path: d.path },
        host_request::Op::LimitsRefresh(_) => HostOp::RefreshLimits,
        host_request::Op::CredentialsRefresh(_) => HostOp::RefreshCredentials,
        host_request::Op::ViewerJoin(j) => HostOp::ViewerJoin {
            terminal_id: id(&j.terminal_id)?,
            viewer: j.viewer_id,
            resume_from: j.resume_from,
            read_only: j.read_only,
        },
        // Served before this: viewer events are not requests with answers.
        host_request::Op::ViewerEvent(_) => return None,
    })
}

fn answer_to_wire(result: Result<OpAnswer, RequestError>) -> bus::Answer {
    let result = match result {
        Ok(OpAnswer::Sent) => answer::Result::Spawned(true),
        Ok(OpAnswer::Spawned(sent)) => answer::Result::Spawned(sent),
        Ok(OpAnswer::Dirs(dirs)) => answer::Result::Dirs(bus::DirsList { dirs }),
        Ok(OpAnswer::Limits(limits)) => answer::Result::LimitsJson(limits.to_string()),
        Ok(OpAnswer::CredentialsStored) => answer::Result::CredentialsOk(true),
        Err(e) => {
            let code = match &e {
                RequestError::Offline => "offline",
                RequestError::Timeout
                | RequestError::Unacknowledged
                | RequestError::BusAway
                | RequestError::Unheard => "timeout",
                RequestError::Refused(_) => "refused",
                RequestError::Unsupported => "unsupported",
                RequestError::EncryptionNotConfigured => "encryption_not_configured",
                RequestError::Busy => "busy",
                RequestError::InputBacklog => "input_backlog",
                RequestError::Internal => "internal",
            };
            let message = match e {
                RequestError::Refused(message) => message,
                other => other.to_string(),
            };
            answer::Result::Failure(bus::Failure { code: code.to_string(), message })
        }
    };
    bus::Answer { result: Some(result) }
}

/// An answer from the owner's instance, checked against the operation
/// asked. One that does not fit it (another kind, no result, limits that
/// are not JSON: an owner of another version, or a bug) is refused as a
/// daemon's wrong answer is (`502 daemon_refused`), not a 500.
pub fn answer_from_wire(op: &HostOp, answer: bus::Answer) -> Result<OpAnswer, RequestError> {
    match (op, answer.result) {
        (_, Some(answer::Result::Failure(f))) => Err(match f.code.as_str() {
            "offline" => RequestError::Offline,
            "timeout" => RequestError::Timeout,
            "refused" => RequestError::Refused(f.message),
            "unsupported" => RequestError::Unsupported,
            "encryption_not_configured" => RequestError::EncryptionNotConfigured,
            "busy" => RequestError::Busy,
            "input_backlog" => RequestError::InputBacklog,
            _ => RequestError::Internal,
        }),
        (HostOp::Spawn(_) | HostOp::ViewerJoin { .. }, Some(answer::Result::Spawned(sent))) => {
            Ok(OpAnswer::Spawned(sent))
        }
        (HostOp::Input { .. } | HostOp::Resize { .. } | HostOp::Kill { .. }, Some(answer::Result::Spawned(true))) => {
            Ok(OpAnswer::Sent)
        }
        (HostOp::Dirs { .. }, Some(answer::Result::Dirs(list))) => Ok(OpAnswer::Dirs(list.dirs)),
        (HostOp::RefreshLimits, Some(answer::Result::LimitsJson(json))) => serde_json::from_str(&json)
            .map(OpAnswer::Limits)
            .map_err(|_| RequestError::Refused("the daemon sent limits that are not JSON".into())),
        (HostOp::RefreshCredentials, Some(answer::Result::CredentialsOk(true))) => Ok(OpAnswer::CredentialsStored),
        _ => Err(RequestError::Refused("the instance holding the host answered with another kind of answer".into())),
    }
}

/// Sends `op` to the host's owner on another instance and waits as the
/// request lifecycle says.
pub(crate) async fn ask_owner(relay: &RelayContext, host_id: Uuid, op: HostOp) -> Result<OpAnswer, RequestError> {
    let request_id = Uuid::new_v4().to_string();
    let (acked, mut answered) = relay.requests.insert(&request_id);
    let _forget = Forget(&relay.requests, request_id.clone());
    let request = bus::HostRequest {
        request_id,
        reply_to: relay.instance_id.clone(),
        host_id: host_id.to_string(),
        op: Some(to_wire(op.clone())),
    };
    let channel = relay.bus.host_channel(host_id);
    let ack_wait = Duration::from_millis(relay.settings.bus.ack_ms);
    // While Redis is away the publish fails at once and is never sent
    // later, so a request answered as failed is not carried out when Redis
    // is back; a publish that failed says nothing of the owner (only one
    // that reached nobody says the host is offline).
    let published = relay.bus.publish_or_fail(&channel, envelope::Body::Request(request));
    let receivers = match tokio::time::timeout(ack_wait, published).await {
        Ok(Ok(receivers)) => receivers,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, %host_id, "tether_bus_publish_failed");
            return Err(RequestError::BusAway);
        }
        Err(_) => {
            tracing::warn!(%host_id, "tether_bus_publish_timed_out");
            return Err(RequestError::Unacknowledged);
        }
    };
    // The lease named a live owner a moment ago: one that hears nothing
    // is subscribing again (or just died, which its lease will say).
    if receivers == 0 {
        return Err(RequestError::Unheard);
    }
    if !matches!(tokio::time::timeout(ack_wait, acked).await, Ok(Ok(()))) {
        return Err(RequestError::Unacknowledged);
    }
    let Some(wait) = op.answer_timeout() else {
        // Done once the owner has it, unless the owner refused it: a
        // refusal comes instead of the acknowledgement and is in hand
        // before it (`PendingRequests::resolve`).
        return match answered.try_recv() {
            Ok(answer) => answer_from_wire(&op, answer),
            Err(_) => Ok(OpAnswer::Sent),
        };
    };
    match tokio::time::timeout(wait, answered).await {
        Ok(Ok(answer)) => answer_from_wire(&op, answer),
        _ => Err(RequestError::Timeout),
    }
}

async fn send_reply(relay: &RelayContext, reply_to: &str, reply: bus::Reply) {
    let channel = relay.bus.reply_channel(reply_to);
    if let Err(e) = relay.bus.publish(&channel, envelope::Body::Reply(reply)).await {
        tracing::warn!(error = %e, "tether_bus_reply_failed");
    }
}

/// An owner's handling of one request from the bus.
async fn serve_request(relay: &RelayContext, request: bus::HostRequest) {
    let Some(host_id) = Uuid::parse_str(&request.host_id).ok() else { return };
    // A viewer's messages are relayed in order, with no acknowledgement.
    if let Some(host_request::Op::ViewerEvent(event)) = request.op {
        relay.remotes.event(&request.reply_to, event);
        return;
    }
    let join = match &request.op {
        Some(host_request::Op::ViewerJoin(join)) => Some(join.clone()),
        _ => None,
    };
    let Some(op) = request.op.and_then(from_wire) else {
        tracing::warn!(%host_id, "tether_bus_bad_request");
        return;
    };
    let reply_to = request.reply_to;
    let request_id = request.request_id;
    // No waiting for a hello here: this loop serves every host in order.
    // Without a ready connection this instance is not the owner, or not
    // yet, or no longer (its subscription outlives the connection for a
    // moment): it says nothing, since the owner, if there is one, heard
    // the request too and answers it. A caller nobody answers times out
    // (`ask_owner`).
    let Ok(HostConnection::Ready(conn)) = relay.registry.send(HostConn(host_id)).await else { return };
    let ack = bus::Reply { request_id: request_id.clone(), outcome: Some(reply::Outcome::Ack(bus::Ack {})) };
    // An operation done once it is handed over (input, resize, kill) is
    // acknowledged once it is, or answered with why not instead: its caller
    // reads no answer after the acknowledgement.
    if op.answer_timeout().is_some() {
        send_reply(relay, &reply_to, ack.clone()).await;
    }
    let answer = |result| bus::Reply {
        request_id: request_id.clone(),
        outcome: Some(reply::Outcome::Answer(answer_to_wire(result))),
    };
    if let Some(join) = join {
        let joined = super::remote::accept_join(relay, &reply_to, host_id, &join);
        send_reply(relay, &reply_to, answer(Ok(OpAnswer::Spawned(joined)))).await;
        return;
    }
    // Handed over in arrival order (one host's operations reach its daemon
    // in the order they were published); only the answers are awaited
    // apart.
    let dispatched = dispatch(relay, &conn, op);
    if let Ok(Dispatched::Sent) = dispatched {
        send_reply(relay, &reply_to, ack).await;
        return;
    }
    let relay = relay.clone();
    actix_rt::spawn(async move {
        let result = match dispatched {
            Ok(dispatched) => finish(&relay, host_id, dispatched).await,
            Err(e) => Err(e),
        };
        let reply = bus::Reply { request_id, outcome: Some(reply::Outcome::Answer(answer_to_wire(result))) };
        send_reply(&relay, &reply_to, reply).await;
    });
}

/// Answers messages lost on `channel` (from `sender`, when known): viewers
/// whose stream or input may miss bytes are closed 4503 and reattach with
/// `?from=`, which gets them the bytes again or a fresh replay. Lost
/// requests and replies are not repaired here: their callers time out.
fn repair(relay: &RelayContext, channel: &str, sender: Option<&str>) {
    if let Some(terminal_id) = relay.bus.channel_terminal(channel) {
        relay.remotes.repair_terminal(terminal_id);
    } else if let Some(host_id) = relay.bus.channel_host(channel) {
        relay.remotes.repair_host(host_id, sender);
    }
}

/// Reads the instance's bus inbox until the bus stops.
pub async fn serve_bus(relay: RelayContext, mut inbox: mpsc::Receiver<Inbound>) {
    // The sequence numbers seen per channel and sender.
    let mut seen: HashMap<String, HashMap<String, SeenSequence>> = HashMap::new();
    while let Some(item) = inbox.recv().await {
        let (channel, envelope) = match item {
            Inbound::Gap { lost, channels } => {
                tracing::warn!(lost, ?channels, "tether_bus_gap");
                metrics::counter!("tether_bus_gaps_total").increment(lost);
                match channels {
                    Some(channels) => channels.iter().for_each(|c| repair(&relay, c, None)),
                    None => relay.remotes.repair_all(),
                }
                continue;
            }
            Inbound::Reset { channel } => {
                seen.remove(&channel);
                continue;
            }
            Inbound::Message { channel, envelope } => (channel, envelope),
        };
        // A channel this instance let go of is none of its business: an
        // answer from here (a host request's "offline") would race the
        // real owner's. The subscription is dropped again.
        if !relay.bus.is_subscribed(&channel) {
            if relay.bus.starts_dropping(&channel) {
                let relay = relay.clone();
                actix_rt::spawn(async move { relay.bus.drop_stale(&channel).await });
            }
            continue;
        }
        metrics::counter!("tether_bus_received_total", "kind" => relay.bus.kind(&channel)).increment(1);
        let sequence = seen.entry(channel.clone()).or_default().entry(envelope.sender.clone()).or_default();
        match sequence.arrive(envelope.seq) {
            Arrival::Fresh { missed: 0 } | Arrival::Late => {}
            Arrival::Fresh { missed } => {
                tracing::warn!(%channel, sender = %envelope.sender, missed, "tether_bus_gap");
                metrics::counter!("tether_bus_gaps_total").increment(missed);
                repair(&relay, &channel, Some(&envelope.sender));
            }
            Arrival::Duplicate => {
                tracing::debug!(%channel, sender = %envelope.sender, seq = envelope.seq, "tether_bus_duplicate");
                metrics::counter!("tether_bus_duplicates_total").increment(1);
                continue;
            }
        }
        match envelope.body {
            Some(envelope::Body::Request(request)) => serve_request(&relay, request).await,
            Some(envelope::Body::Reply(reply)) => relay.requests.resolve(reply),
            Some(envelope::Body::ViewerFrame(frame)) if frame.home == relay.instance_id => {
                relay.remotes.frame(frame, &envelope.sender);
            }
            Some(envelope::Body::ViewerFrame(_)) => {}
            Some(envelope::Body::ViewerReport(report)) => {
                let unknown = relay.remotes.report(&report);
                if !unknown.is_empty() {
                    let relay = relay.clone();
                    actix_rt::spawn(async move {
                        super::remote::unknown_viewers(&relay, &report.home, unknown).await;
                    });
                }
            }
            Some(envelope::Body::HostTaken(taken)) => {
                if let Ok(host_id) = Uuid::parse_str(&taken.host_id) {
                    if channel == relay.bus.host_channel(host_id) {
                        // To the previous owner: its connection may be stale.
                        // Not our own announcement (the bus echoes it): this
                        // instance's registry already holds the newest
                        // connection, and the lease read would be one more
                        // statement per hello.
                        if envelope.sender != relay.instance_id {
                            relay.registry.do_send(RecheckLease(host_id));
                        }
                    } else {
                        // On a terminal channel, to the homes of its viewers
                        // and to viewers waiting here for the host.
                        relay.remotes.taken(host_id, &envelope.sender);
                        relay.registry.do_send(RecheckWaiting(host_id));
                    }
                }
            }
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(result: answer::Result) -> bus::Answer {
        bus::Answer { result: Some(result) }
    }

    #[test]
    fn answers_that_do_not_fit_the_request_are_refused() {
        let dirs = HostOp::Dirs { add: true, path: "/srv".into() };
        let fits = answer_from_wire(&dirs, answer(answer::Result::Dirs(bus::DirsList { dirs: vec!["/srv".into()] })));
        assert!(matches!(fits, Ok(OpAnswer::Dirs(d)) if d == ["/srv"]));
        for unfit in [
            answer(answer::Result::LimitsJson("{}".into())),
            answer(answer::Result::CredentialsOk(true)),
            bus::Answer { result: None },
        ] {
            assert!(matches!(answer_from_wire(&dirs, unfit), Err(RequestError::Refused(_))));
        }
        let limits = answer(answer::Result::LimitsJson("not json".into()));
        assert!(matches!(answer_from_wire(&HostOp::RefreshLimits, limits), Err(RequestError::Refused(_))));
        let failure =
            |code: &str| answer(answer::Result::Failure(bus::Failure { code: code.into(), message: "m".into() }));
        assert!(matches!(answer_from_wire(&dirs, failure("input_backlog")), Err(RequestError::InputBacklog)));
        assert!(matches!(answer_from_wire(&dirs, failure("what")), Err(RequestError::Internal)));
        let input = HostOp::Input { terminal_id: Uuid::nil(), data: Bytes::new() };
        assert!(matches!(answer_from_wire(&input, answer(answer::Result::Spawned(true))), Ok(OpAnswer::Sent)));
    }

    /// A remote viewer's join tells its owner whether it may only watch:
    /// the owner's arbiter keeps part of its cap for viewers that type.
    #[test]
    fn a_viewer_join_keeps_read_only_across_the_bus() {
        for read_only in [false, true] {
            let terminal_id = Uuid::new_v4();
            let join = HostOp::ViewerJoin { terminal_id, viewer: 7, resume_from: Some(42), read_only };
            let back = from_wire(to_wire(join)).expect("a well-formed join");
            assert!(
                matches!(back, HostOp::ViewerJoin { terminal_id: t, viewer: 7, resume_from: Some(42), read_only: r }
                    if t == terminal_id && r == read_only),
                "{read_only}"
            );
        }
    }
}
