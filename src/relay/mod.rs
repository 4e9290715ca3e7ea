//! The relay on an instance: the actors that connect daemons, terminals and
//! viewers (docs/ARCHITECTURE.md, "Actors of an instance").
//!
//! - [`daemon_conn::DaemonConn`]: one per daemon socket; handles its frames
//!   strictly in order and owns its lease.
//! - [`registry::HostRegistry`]: this instance's connected hosts (newest
//!   wins, batched lease renew) and its terminal arbiters.
//! - [`arbiter::TerminalArbiter`]: one per terminal with viewers, on the
//!   owner: fan-out, snapshot-then-live, resume, the grid.
//! - [`viewer::Viewer`]: one per viewer socket, with a bounded outbound queue.
//!
//! The owner-side logic never asks where a viewer or a request came from:
//! viewers are `Recipient<ViewerOut>`s and requests are messages.

pub mod arbiter;
pub mod capture;
pub mod claims;
pub mod daemon_conn;
pub mod ended;
pub mod frame_guard;
pub mod grid;
pub mod lapse_grace;
pub mod limiter;
pub mod messages;
pub mod outbox;
pub mod owed;
pub mod registry;
pub mod releases;
pub mod remote;
pub mod requests;
pub mod resume_ring;
pub mod stamp;
pub mod token_watch;
pub mod viewer;
pub mod waiting_watch;

pub use messages::*;

/// Close codes of the daemon and viewer sockets (docs/PROTOCOL.md, "What the
/// server enforces" and "Viewer close codes").
pub mod close {
    pub const REPLACED: u16 = 4000;
    pub const BAD_TOKEN: u16 = 4401;
    pub const FORBIDDEN: u16 = 4403;
    pub const UNKNOWN_TERMINAL: u16 = 4404;
    pub const NO_HELLO: u16 = 4408;
    pub const WRONG_CELL: u16 = 4409;
    pub const TOO_LARGE: u16 = 4413;
    pub const TOO_MANY: u16 = 4429;
    pub const DRAINING: u16 = 4503;
    pub const HOST_GONE: u16 = 4503;
    pub const POLICY: u16 = 1008;
    /// RFC 6455's own: a frame that breaks the protocol, text not UTF-8.
    pub const PROTOCOL_ERROR: u16 = 1002;
    pub const NOT_UTF8: u16 = 1007;
    pub const INTERNAL: u16 = 1011;
    pub const NORMAL: u16 = 1000;
}

/// Bytes queued towards a daemon past which it counts as not reading its
/// input: a viewer's input then closes that viewer 1008, REST input is 429
/// `input_backlog` (docs/PROTOCOL.md, "Slow viewers"; docs/REST.md).
/// Below `daemon_conn::OUTBOUND_LIMIT`, so input is refused before the
/// daemon is closed and what was accepted is never dropped for it.
pub const INPUT_QUEUE_LIMIT: usize = 4 * 1024 * 1024;

/// Largest WebSocket frame accepted from a daemon or a viewer.
pub const MAX_FRAME_BYTES: usize = 1024 * 1024;

use std::sync::Arc;

use actix::Addr;

use crate::config::Settings;
use crate::store::Store;

/// What every relay actor needs from its instance.
#[derive(Clone)]
pub struct RelayContext {
    pub store: Arc<dyn Store>,
    pub registry: Addr<registry::HostRegistry>,
    pub settings: Arc<Settings>,
    pub instance_id: String,
    pub cell_id: String,
    /// This cell's seats, bookings and admit mode (docs/CELLS.md).
    pub cell: Arc<crate::cell::state::CellState>,
    pub bus: Arc<crate::bus::Bus>,
    /// Requests this instance sent to owners elsewhere, awaiting replies.
    pub requests: Arc<requests::PendingRequests>,
    /// The viewer proxies of this instance (viewers across instances).
    pub remotes: Arc<remote::Remotes>,
    /// Where who-did-what is recorded (docs/SECURITY.md, "Audit").
    pub audit: crate::audit::AuditLog,
    /// Open sockets by token, closed 4401 when their token stops being usable.
    pub tokens: Arc<token_watch::TokenWatch>,
    /// Hosts being claimed by a hello here, one claim per host at a time.
    pub claims: claims::HostClaims,
    /// Where ended daemon connections queue their host leases.
    pub releases: releases::LeaseReleases,
    /// Daemon writes not yet stored or failed for good, kept ones included
    /// (waited for by the drain).
    pub writes: Arc<owed::Owed>,
}
