//! Typed messages between the relay's actors, and the small link handles
//! they reach each other through.
//!
//! Dependencies run one way: `daemon_conn` -> `registry` -> `arbiter`, and
//! all of them -> this module. An actor that must talk back up that line
//! (the arbiter to its daemon connection or to the registry, the registry
//! to a connection) holds a link built from `Recipient`s: [`DaemonHandle`],
//! [`DaemonLink`], [`ArbiterLink`], so it never names the other actor's type.

use std::sync::atomic::{AtomicU64, Ordering};

use actix::dev::ToEnvelope;
use actix::prelude::*;
use bytes::Bytes;
use uuid::Uuid;

use crate::store::ExitStatus;

/// The most input data one Input frame to a daemon carries.
const INPUT_CHUNK_BYTES: usize = 64 * 1024;

// ------------------------------------------------------------ to a DaemonConn

/// A frame for the daemon that needs no answer (input, resize, kill).
#[derive(Message)]
#[rtype(result = "()")]
pub struct ToDaemon(pub crate::proto::v1::server_frame::Frame);

/// Read the terminal's row, claim `pending -> launching` and send Spawn
/// (docs/ARCHITECTURE.md, "Spawn"). Fire and forget, so it keeps its place
/// among the other messages to the connection (an input sent after it
/// reaches the daemon after the Spawn); `sent` answers whether Spawn went
/// out.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SpawnTerminal {
    pub terminal_id: Uuid,
    pub sent: tokio::sync::oneshot::Sender<bool>,
}

/// Start the daemon's output stream of a terminal towards `arbiter`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct AttachArbiter {
    pub terminal_id: Uuid,
    pub attach_id: String,
    /// Resume the raw stream from this offset when the daemon still has it.
    pub resume_from: Option<u64>,
    /// When the daemon's ring no longer holds `resume_from`: resume from the
    /// oldest byte it holds instead of a snapshot (a run's capture).
    pub from_oldest: bool,
    /// Flow-control window for the new stream (daemons that support it).
    pub window: Option<u64>,
    pub arbiter: ArbiterLink,
}

/// Stop the output stream, if `arbiter` is still the one attached.
#[derive(Message)]
#[rtype(result = "()")]
pub struct DetachArbiter {
    pub terminal_id: Uuid,
    pub arbiter: ArbiterId,
}

/// Close the socket with a code (4000 replaced, 4503 draining).
#[derive(Message)]
#[rtype(result = "()")]
pub struct CloseDaemon {
    pub code: u16,
    pub reason: &'static str,
}

/// A request answered by the daemon (docs/REST.md, "Daemon requests").
#[derive(Debug, Clone)]
pub enum DaemonRequestKind {
    AddDir(String),
    RemoveDir(String),
    RefreshLimits,
    Credentials,
}

/// The daemon's answer to a [`DaemonRequestKind`].
#[derive(Debug, Clone)]
pub enum DaemonAnswer {
    Dirs(Vec<String>),
    Limits(serde_json::Value),
    Credentials(Vec<u8>),
}

/// Why a daemon request produced no answer.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RequestError {
    #[error("the host is offline")]
    Offline,
    #[error("the daemon did not answer in time")]
    Timeout,
    #[error("the daemon refused: {0}")]
    Refused(String),
    #[error("the daemon does not support this")]
    Unsupported,
    #[error("the host's owner did not acknowledge the request in time")]
    Unacknowledged,
    /// The bus to the host's owner (Redis) is away: the request was not
    /// sent, and will not be.
    #[error("the bus to the instance holding the host is away; the request was not sent")]
    BusAway,
    /// The lease names a live owner on another instance, but no instance
    /// took the message (the owner is subscribing again, after a Redis
    /// restart say): the request was not sent. Not "offline": that must
    /// never be said of a live owner.
    #[error("the instance holding the host is not listening now; the request was not sent")]
    Unheard,
    #[error("encryption.key is not set")]
    EncryptionNotConfigured,
    #[error("too many requests are waiting for this daemon's answers")]
    Busy,
    #[error("the daemon has not read the input it was sent")]
    InputBacklog,
    #[error("internal error")]
    Internal,
}

impl RequestError {
    /// Whether the request may still have reached the daemon and taken
    /// effect: it was handed on and its answer never came (or the failure
    /// is not known). Every other error says it was not carried out.
    pub fn may_have_run(&self) -> bool {
        matches!(self, Self::Timeout | Self::Unacknowledged | Self::Internal)
    }
}

/// Where a daemon request's answer goes.
pub type DaemonAnswerSender = tokio::sync::oneshot::Sender<Result<DaemonAnswer, RequestError>>;

/// A request the daemon answers; fire and forget like [`SpawnTerminal`],
/// answered on `answer` (a timeout is answered too).
#[derive(Message)]
#[rtype(result = "()")]
pub struct DaemonRequest {
    pub kind: DaemonRequestKind,
    pub answer: DaemonAnswerSender,
}

// ------------------------------------------------------------ to a TerminalArbiter

/// A chunk of a terminal's output stream. The daemon connection never
/// waits for the arbiter: the daemon's flow-control window (see `arbiter`)
/// is what bounds a terminal's output in flight.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct OutputChunk {
    pub offset: u64,
    pub data: Bytes,
}

/// Control from the daemon's stream for one terminal.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub enum StreamEvent {
    Scrollback { attach_id: String, data: Bytes, cols: u16, rows: u16, offset: u64, resumed: bool },
    AttachError { attach_id: String, message: String },
    Size { cols: u16, rows: u16 },
}

/// A terminal's lifecycle as the owner records it.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub enum LifecycleEvent {
    Started,
    SpawnFailed(String),
    Exited { status: ExitStatus, snapshot: Option<(Bytes, u16, u16)> },
}

/// When a daemon connection last received a frame: stamped by the
/// connection, read by the registry's one idle check (every
/// `IDLE_CHECK`), which replaces a timer per connection.
#[derive(Clone)]
pub struct Heard(std::sync::Arc<AtomicU64>);

impl Heard {
    /// Milliseconds since the first call in this process.
    fn clock() -> u64 {
        static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        let epoch = *EPOCH.get_or_init(std::time::Instant::now);
        u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Heard just now.
    pub fn now() -> Self {
        Self(std::sync::Arc::new(AtomicU64::new(Self::clock())))
    }

    pub fn stamp(&self) {
        self.0.store(Self::clock(), Ordering::Relaxed);
    }

    /// How long since the last stamp.
    pub fn silence(&self) -> std::time::Duration {
        std::time::Duration::from_millis(Self::clock().saturating_sub(self.0.load(Ordering::Relaxed)))
    }
}

/// A daemon connection as the registry, the arbiters and the request path
/// reach it: one recipient per message it takes, made once and shared by
/// every copy of the handle (a recipient is two allocations, and the
/// registry and each of the host's arbiters keep a copy).
#[derive(Clone)]
pub struct DaemonHandle {
    to: std::sync::Arc<DaemonRecipients>,
    /// The thread the connection runs on; its terminals' arbiters start
    /// there, so output and input pass between them without a thread hop.
    thread: ArbiterHandle,
    heard: Heard,
}

struct DaemonRecipients {
    frames: Recipient<ToDaemon>,
    spawn: Recipient<SpawnTerminal>,
    attach: Recipient<AttachArbiter>,
    detach: Recipient<DetachArbiter>,
    request: Recipient<DaemonRequest>,
    close: Recipient<CloseDaemon>,
    /// The socket's outbox (a handle that does not keep it open), for
    /// [`DaemonHandle::close`].
    outbox: Option<crate::relay::outbox::Outbox>,
}

impl DaemonHandle {
    /// The handle of a connection actor, made on the connection's thread;
    /// the connection stamps `heard` with every frame. `outbox` is its
    /// socket's, for closes that must not wait for the actor.
    pub fn of<A>(conn: &Addr<A>, heard: Heard, outbox: Option<crate::relay::outbox::Outbox>) -> Self
    where
        A: Actor
            + Handler<ToDaemon>
            + Handler<SpawnTerminal>
            + Handler<AttachArbiter>
            + Handler<DetachArbiter>
            + Handler<DaemonRequest>
            + Handler<CloseDaemon>,
        A::Context: ToEnvelope<A, ToDaemon>
            + ToEnvelope<A, SpawnTerminal>
            + ToEnvelope<A, AttachArbiter>
            + ToEnvelope<A, DetachArbiter>
            + ToEnvelope<A, DaemonRequest>
            + ToEnvelope<A, CloseDaemon>,
    {
        let to = DaemonRecipients {
            frames: conn.clone().recipient(),
            spawn: conn.clone().recipient(),
            attach: conn.clone().recipient(),
            detach: conn.clone().recipient(),
            request: conn.clone().recipient(),
            close: conn.clone().recipient(),
            outbox,
        };
        Self { to: std::sync::Arc::new(to), thread: Arbiter::current(), heard }
    }

    /// How long the connection has received nothing.
    pub fn silence(&self) -> std::time::Duration {
        self.heard.silence()
    }

    /// The thread the connection runs on.
    pub fn thread(&self) -> &ArbiterHandle {
        &self.thread
    }

    /// A frame that needs no answer (input, resize, kill, credit).
    pub fn frame(&self, frame: crate::proto::v1::server_frame::Frame) {
        self.to.frames.do_send(ToDaemon(frame));
    }

    /// Input for a terminal, in order, in Input frames of at most
    /// `INPUT_CHUNK_BYTES` of data each: a viewer may send
    /// `super::MAX_FRAME_BYTES` in one message, and one Input frame of it
    /// would be over the daemon socket's frame limit with its envelope.
    pub fn input(&self, terminal_id: Uuid, mut data: Bytes) {
        loop {
            let chunk = data.split_to(data.len().min(INPUT_CHUNK_BYTES));
            let terminal_id = terminal_id.to_string();
            self.frame(crate::proto::v1::server_frame::Frame::Input(crate::proto::v1::Input {
                terminal_id,
                data: chunk,
            }));
            if data.is_empty() {
                break;
            }
        }
    }

    /// Queues the spawn in order with every other message to the
    /// connection; the answer says whether Spawn was sent.
    pub fn spawn(&self, terminal_id: Uuid, sent: tokio::sync::oneshot::Sender<bool>) {
        self.to.spawn.do_send(SpawnTerminal { terminal_id, sent });
    }

    pub fn attach(&self, attach: AttachArbiter) {
        self.to.attach.do_send(attach);
    }

    pub fn detach(&self, terminal_id: Uuid, arbiter: ArbiterId) {
        self.to.detach.do_send(DetachArbiter { terminal_id, arbiter });
    }

    /// Queues a request in order with every other message to the
    /// connection; its answer arrives on `answer`.
    pub fn request(&self, kind: DaemonRequestKind, answer: DaemonAnswerSender) {
        self.to.request.do_send(DaemonRequest { kind, answer });
    }

    /// Closes the connection: the close frame goes on its socket at once,
    /// behind what is queued there, even while the actor waits on the
    /// database (a drain with a hung one: the daemon still gets its 4503
    /// and redials at once); the actor stops when it next runs.
    pub fn close(&self, code: u16, reason: &'static str) {
        if let Some(outbox) = &self.to.outbox {
            outbox.close(code, reason);
        }
        self.to.close.do_send(CloseDaemon { code, reason });
    }
}

/// Names one arbiter for as long as the process lives (links compare by it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ArbiterId(u64);

impl ArbiterId {
    /// A fresh id, never given before in this process.
    pub fn next() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Self(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

/// A terminal's arbiter as daemon connections and viewers reach it.
#[derive(Clone)]
pub struct ArbiterLink {
    pub id: ArbiterId,
    output: Recipient<OutputChunk>,
    stream: Recipient<StreamEvent>,
    join: Recipient<Join>,
    viewer: Recipient<FromViewer>,
    capture: Recipient<CaptureRun>,
    lifecycle: Recipient<LifecycleEvent>,
}

impl ArbiterLink {
    /// The link of arbiter `id`.
    pub fn of<A>(id: ArbiterId, arbiter: &Addr<A>) -> Self
    where
        A: Actor
            + Handler<OutputChunk>
            + Handler<StreamEvent>
            + Handler<Join>
            + Handler<FromViewer>
            + Handler<CaptureRun>
            + Handler<LifecycleEvent>,
        A::Context: ToEnvelope<A, OutputChunk>
            + ToEnvelope<A, StreamEvent>
            + ToEnvelope<A, Join>
            + ToEnvelope<A, FromViewer>
            + ToEnvelope<A, CaptureRun>
            + ToEnvelope<A, LifecycleEvent>,
    {
        Self {
            id,
            output: arbiter.clone().recipient(),
            stream: arbiter.clone().recipient(),
            join: arbiter.clone().recipient(),
            viewer: arbiter.clone().recipient(),
            capture: arbiter.clone().recipient(),
            lifecycle: arbiter.clone().recipient(),
        }
    }

    /// Output for the arbiter; never waits (flow control bounds it).
    pub fn output(&self, chunk: OutputChunk) {
        self.output.do_send(chunk);
    }

    /// Output for the arbiter, resolved once it was handled (daemons
    /// without flow control are slowed this way).
    pub async fn output_handled(&self, chunk: OutputChunk) {
        let _ = self.output.send(chunk).await;
    }

    pub fn stream_event(&self, event: StreamEvent) {
        self.stream.do_send(event);
    }

    /// Joins as a member; see [`Join`].
    pub async fn join(&self, join: Join) -> Result<u64, NotJoined> {
        self.join.send(join).await.unwrap_or(Err(NotJoined::Retired))
    }

    pub fn from_viewer(&self, message: FromViewer) {
        self.viewer.do_send(message);
    }

    /// The viewer-side recipient, for a viewer that keeps only that.
    pub fn viewer_recipient(&self) -> Recipient<FromViewer> {
        self.viewer.clone()
    }

    pub fn capture(&self, capture: CaptureRun) {
        self.capture.do_send(capture);
    }

    pub fn lifecycle(&self, event: LifecycleEvent) {
        self.lifecycle.do_send(event);
    }
}

/// An arbiter with no members asks to be dropped; it stops when told
/// ([`Retire`]).
#[derive(Message)]
#[rtype(result = "()")]
pub struct ArbiterIdle {
    pub terminal_id: Uuid,
    pub arbiter: ArbiterId,
    pub retire: Recipient<Retire>,
}

/// Tells an idle arbiter it is no longer reachable and may stop.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Retire;

/// A host's ready daemon connection on this instance, as arbiters use it.
#[derive(Clone)]
pub struct DaemonLink {
    pub daemon: DaemonHandle,
    /// Bytes queued towards the daemon (input is refused past a limit).
    pub queue: InputBacklog,
    /// The daemon's hello claimed flow control: Attach carries a window
    /// and Credit frames move it.
    pub flow_control: bool,
}

/// Input bytes held on the server for each terminal of a daemon
/// connection, waiting for the daemon's window (`daemon_conn::input_flow`).
pub type HeldInput = std::sync::Arc<std::sync::Mutex<std::collections::HashMap<Uuid, usize>>>;

/// What is queued towards a daemon for one of its terminals: the socket's
/// outbound queue (every terminal's) and that terminal's Input waiting for
/// the daemon's window. A terminal whose program does not read holds back
/// its own input only, never another terminal's of the same host.
#[derive(Clone, Default)]
pub struct InputBacklog {
    outbound: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    held: HeldInput,
}

impl InputBacklog {
    pub fn new(outbound: std::sync::Arc<std::sync::atomic::AtomicUsize>, held: HeldInput) -> Self {
        Self { outbound, held }
    }

    /// Bytes queued ahead of new input for `terminal_id`.
    pub fn bytes_for(&self, terminal_id: Uuid) -> usize {
        let held = self.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(&terminal_id).copied();
        self.outbound.load(std::sync::atomic::Ordering::Relaxed) + held.unwrap_or(0)
    }
}

/// The host's daemon connection is (again) available on this instance.
#[derive(Message)]
#[rtype(result = "()")]
pub struct HostOnline(pub DaemonLink);

/// The host's daemon connection ended or was replaced.
#[derive(Message)]
#[rtype(result = "()")]
pub struct HostOffline;

/// The terminal's host, offline here, is connected to another instance:
/// the arbiter's waiting viewers are closed 4503 and reattach through it.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct HostElsewhere;

/// What a viewer tells the arbiter.
#[derive(Message)]
#[rtype(result = "()")]
pub enum FromViewer {
    View { viewer: u64, view: ViewReport },
    Resize { viewer: u64, cols: u16, rows: u16 },
    Input { viewer: u64, data: Bytes },
    Pong { viewer: u64 },
    Leave { viewer: u64 },
}

/// A viewer's `view` message (docs/PROTOCOL.md, "Client -> server").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ViewReport {
    pub cols: u16,
    pub rows: u16,
    pub visible: bool,
    pub idle_ms: u64,
    pub open: bool,
}

/// A viewer joins and is given its member id, which names it in every
/// `FromViewer` after; see [`NotJoined`] for a refusal.
#[derive(Message)]
#[rtype(result = "Result<u64, NotJoined>")]
pub struct Join {
    pub out: ViewerSink,
    /// Bytes waiting in the viewer's outbound queue.
    pub queued: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    pub resume_from: Option<u64>,
    /// The viewer may only watch (a read or share token): such viewers
    /// may take only part of `viewer.max_per_terminal`.
    pub read_only: bool,
}

/// Why an arbiter did not take a member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotJoined {
    /// The arbiter is shutting down; the caller should open the terminal
    /// again.
    Retired,
    /// The terminal ended before the member could join (its Exit was
    /// recorded after the caller read the row): answer from the store,
    /// as for any ended terminal, instead of asking again.
    Ended,
    /// The terminal has `viewer.max_per_terminal` viewers already (or,
    /// for a read-only one, as many read-only viewers as it takes).
    Full,
}

/// Keep the terminal attached and write its output to the run's log.
#[derive(Message)]
#[rtype(result = "()")]
pub struct CaptureRun {
    pub run_id: Uuid,
    /// Bytes of output already in the log (resume point after a restart).
    pub logged: u64,
    /// Set when the daemon connection sends the Attach itself, right after
    /// the Spawn, so even a process that exits at once is captured whole.
    pub attach_id: Option<String>,
}

// ------------------------------------------------------------ to a Viewer

/// What the arbiter sends a viewer socket.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub enum ViewerOut {
    Text(String),
    Binary(Bytes),
    /// Live output whose weight the arbiter already added to the viewer's
    /// queue counter when it sent it.
    Output(Bytes),
    /// A WebSocket ping (the arbiter checks whether the holder is alive).
    Ping,
    Close {
        code: u16,
        reason: String,
    },
    /// Close at once, dropping what is queued (the viewer is not reading).
    Evict {
        code: u16,
        reason: String,
    },
    /// A frame for the viewer found its queue over its bound.
    TooSlow,
}

/// Where an arbiter sends a member viewer's `ViewerOut`. A viewer on this
/// instance has its frames pushed straight on its socket's outbox, in the
/// order the arbiter sends them, without a trip through the viewer actor's
/// mailbox (one task hop less per output chunk, docs/ARCHITECTURE.md,
/// "Output"); only a close, an eviction, or an overflow of the queue
/// (`ViewerOut::TooSlow`) go to the actor. A home proxy for another
/// instance's viewer takes every message as a message.
#[derive(Clone)]
pub struct ViewerSink {
    actor: Recipient<ViewerOut>,
    /// The local viewer's outbox; a handle that does not keep its socket
    /// open (the actor's do).
    outbox: Option<crate::relay::outbox::Outbox>,
}

impl ViewerSink {
    /// A viewer of this instance: frames to `outbox`, the rest to `actor`.
    pub fn local(actor: Recipient<ViewerOut>, outbox: &crate::relay::outbox::Outbox) -> Self {
        Self { actor, outbox: Some(outbox.sender()) }
    }

    /// Every message to `actor` (a home proxy, a test's collector).
    pub fn actor(actor: Recipient<ViewerOut>) -> Self {
        Self { actor, outbox: None }
    }

    pub fn do_send(&self, out: ViewerOut) {
        let Some(outbox) = &self.outbox else { return self.actor.do_send(out) };
        match out.queue_on(outbox) {
            Delivery::Queued => {}
            Delivery::Overflow => self.actor.do_send(ViewerOut::TooSlow),
            Delivery::ForActor(out) => self.actor.do_send(out),
        }
    }
}

/// The payload of the WebSocket ping an arbiter sends a viewer.
const VIEWER_PING: &[u8] = b"grid";

/// What became of a `ViewerOut` offered to a viewer's outbox.
pub enum Delivery {
    Queued,
    /// The queue is over its bound: the viewer is too slow.
    Overflow,
    /// Not a frame (a close, an eviction, `TooSlow`): the actor's to do.
    ForActor(ViewerOut),
}

impl ViewerOut {
    /// Queues a frame message (Text, Binary, Output, Ping) on a viewer's
    /// outbox: the one place where they become WebSocket frames, whether
    /// the arbiter's sink or the viewer's actor queues them.
    pub fn queue_on(self, outbox: &crate::relay::outbox::Outbox) -> Delivery {
        use crate::relay::outbox::Frame;
        let pushed = match self {
            ViewerOut::Text(text) => outbox.push(Frame::Text(text)),
            ViewerOut::Binary(data) => outbox.push(Frame::Binary(data)),
            // Counted by the arbiter when it sent it.
            ViewerOut::Output(data) => outbox.push_reserved(Frame::Binary(data)),
            ViewerOut::Ping => outbox.push(Frame::Ping(Bytes::from_static(VIEWER_PING))),
            to_actor @ (ViewerOut::Close { .. } | ViewerOut::Evict { .. } | ViewerOut::TooSlow) => {
                return Delivery::ForActor(to_actor);
            }
        };
        match pushed {
            Ok(()) => Delivery::Queued,
            Err(_) => Delivery::Overflow,
        }
    }

    /// A control message as its text frame.
    pub fn control(message: crate::viewer_protocol::ServerMessage) -> Self {
        Self::Text(message.to_json())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use actix_web::HttpResponse;

    use super::*;
    use crate::relay::outbox::Outbox;

    /// Stands in for a viewer actor: keeps what reaches its mailbox.
    struct Mailbox(Arc<Mutex<Vec<String>>>);

    impl Actor for Mailbox {
        type Context = Context<Self>;
    }

    impl Handler<ViewerOut> for Mailbox {
        type Result = ();
        fn handle(&mut self, msg: ViewerOut, _: &mut Context<Self>) {
            let name = match msg {
                ViewerOut::Close { code, .. } => format!("close {code}"),
                ViewerOut::TooSlow => "too slow".to_string(),
                other => format!("frame {}", matches!(other, ViewerOut::Output(_))),
            };
            self.0.lock().expect("mailbox").push(name);
        }
    }

    #[actix_rt::test]
    async fn a_local_sink_queues_frames_on_the_socket_and_tells_the_actor_the_rest() {
        let got = Arc::new(Mutex::new(Vec::new()));
        let actor = Mailbox(got.clone()).start();
        let (_response, outbox) = Outbox::for_response(HttpResponse::SwitchingProtocols().finish(), 100, None);
        let sink = ViewerSink::local(actor.clone().recipient(), &outbox);
        let queued = outbox.queued_counter();

        sink.do_send(ViewerOut::Text("{}".into()));
        sink.do_send(ViewerOut::Ping);
        assert_eq!(queued.load(Ordering::Relaxed), 18 + 20, "both frames are on the socket's queue");
        // Over the bound: not queued, and the actor hears of it.
        sink.do_send(ViewerOut::Binary(Bytes::from(vec![0; 100])));
        sink.do_send(ViewerOut::Close { code: 1000, reason: "bye".into() });
        actor.send(ViewerOut::Ping).await.expect("the mailbox is there");
        assert_eq!(queued.load(Ordering::Relaxed), 38);
        assert_eq!(*got.lock().expect("mailbox"), ["too slow", "close 1000", "frame false"]);
    }

    #[actix_rt::test]
    async fn an_actor_sink_sends_everything_as_messages() {
        let got = Arc::new(Mutex::new(Vec::new()));
        let actor = Mailbox(got.clone()).start();
        let sink = ViewerSink::actor(actor.clone().recipient());
        sink.do_send(ViewerOut::Output(Bytes::from_static(b"x")));
        sink.do_send(ViewerOut::Close { code: 4503, reason: String::new() });
        actor.send(ViewerOut::TooSlow).await.expect("the mailbox is there");
        assert_eq!(*got.lock().expect("mailbox"), ["frame true", "close 4503", "too slow"]);
    }
}
