//! Typed messages between the relay's actors.

use actix::prelude::*;
use bytes::Bytes;
use uuid::Uuid;

use super::arbiter::TerminalArbiter;
use super::daemon_conn::DaemonConn;
use crate::store::{ExitStatus, Terminal};

// ------------------------------------------------------------ to a DaemonConn

/// A frame for the daemon that needs no answer (input, resize, kill).
#[derive(Message)]
#[rtype(result = "()")]
pub struct ToDaemon(pub crate::proto::v1::server_frame::Frame);

/// Claim `pending -> launching` and send Spawn (docs/ARCHITECTURE.md, "Spawn"); true when sent.
#[derive(Message)]
#[rtype(result = "bool")]
pub struct SpawnTerminal(pub Terminal);

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
    pub arbiter: Addr<TerminalArbiter>,
}

/// Stop the output stream, if `arbiter` is still the one attached.
#[derive(Message)]
#[rtype(result = "()")]
pub struct DetachArbiter {
    pub terminal_id: Uuid,
    pub arbiter: Addr<TerminalArbiter>,
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
    #[error("encryption.key is not set")]
    EncryptionNotConfigured,
    #[error("internal error")]
    Internal,
}

#[derive(Message)]
#[rtype(result = "Result<DaemonAnswer, RequestError>")]
pub struct DaemonRequest(pub DaemonRequestKind);

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

/// A host's ready daemon connection on this instance, as arbiters use it.
#[derive(Clone)]
pub struct DaemonLink {
    pub conn: Addr<DaemonConn>,
    /// Bytes queued towards the daemon (input is refused past a limit).
    pub queue: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// The daemon's hello claimed flow control: Attach carries a window
    /// and Credit frames move it.
    pub flow_control: bool,
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
/// `FromViewer` after; `Err(Retired)` means ask the registry again.
#[derive(Message)]
#[rtype(result = "Result<u64, Retired>")]
pub struct Join {
    pub out: Recipient<ViewerOut>,
    /// Bytes waiting in the viewer's outbound queue.
    pub queued: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    pub resume_from: Option<u64>,
}

/// The arbiter is shutting down; the caller should open the terminal again.
#[derive(Debug, Clone, Copy)]
pub struct Retired;

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
}

impl ViewerOut {
    /// A control message as its text frame.
    pub fn control(message: crate::viewer_protocol::ServerMessage) -> Self {
        Self::Text(message.to_json())
    }
}
