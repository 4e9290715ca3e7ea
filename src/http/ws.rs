//! WebSocket upgrades: `GET /ws/v1/daemon` (docs/PROTOCOL.md, "What the server
//! enforces") and `GET /ws/v1/terminals/{id}` (docs/PROTOCOL.md, "Connecting").
//!
//! Every refusal happens after the upgrade, as a close code the client can
//! read (browsers cannot see an HTTP status of a failed upgrade): 4401 bad
//! token (revoked or expired included), 4403 foreign or outside the token's
//! scope, 4404 unknown terminal, 4429 a cap of the user (per client address
//! or in all). The
//! one exception is a browser page of a foreign origin (`super::origin`):
//! it gets 403 and no socket at all, before any token is looked at.

use std::sync::atomic::AtomicUsize;
use std::time::Instant;

use actix_web::{web, HttpRequest, HttpResponse, ResponseError};
use actix_ws::AggregatedMessageStream;
use futures_util::StreamExt;
use serde::Deserialize;
use uuid::Uuid;

use super::error::ApiError;
use super::state::{authenticate, AppState};
use crate::auth::{self, Access, Principal};
use crate::cell::admission::Prefetched;
use crate::relay::limiter::{AddressGuard, Caps};
use crate::relay::outbox::Outbox;
use crate::relay::{close, daemon_conn, viewer, MAX_FRAME_BYTES};

pub const DAEMON_PROTOCOL: &str = "tether.daemon.v1";
pub const VIEWER_PROTOCOL: &str = "tether.v1";

/// Closes a freshly upgraded socket with a code, reading (and dropping)
/// what the peer sends until the connection is gone.
fn refuse(outbox: Outbox, mut stream: AggregatedMessageStream, code: u16, reason: &'static str) {
    outbox.close(code, reason);
    actix_rt::spawn(async move { while stream.next().await.is_some() {} });
}

/// Why an upgrade did not happen: a foreign origin (403) or a bad handshake.
enum Refused {
    Origin,
    Draining,
    Handshake(actix_web::Error),
}

impl From<actix_web::Error> for Refused {
    fn from(e: actix_web::Error) -> Self {
        Refused::Handshake(e)
    }
}

/// The answer to an upgrade that did not happen.
fn refused(r: Refused) -> Result<HttpResponse, actix_web::Error> {
    match r {
        Refused::Origin => Ok(ApiError::new(
            actix_web::http::StatusCode::FORBIDDEN,
            "origin_not_allowed",
            "WebSockets are accepted from this server's own pages and http.allowed_origins only",
        )
        .error_response()),
        Refused::Draining => Ok(ApiError::new(
            actix_web::http::StatusCode::SERVICE_UNAVAILABLE,
            "draining",
            "this instance is shutting down; connect to another one",
        )
        .error_response()),
        // actix-ws's own answer has no body; the API's error shape says why.
        Refused::Handshake(e) => Ok(ApiError::new(
            e.error_response().status(),
            "not_a_websocket",
            format!("this path takes a WebSocket upgrade: {e}"),
        )
        .error_response()),
    }
}

/// The WebSocket handshake's answer and the socket's two sides: its
/// outbox (bounded at `queue_limit` bytes, see `Outbox::for_response`)
/// and its message stream.
fn upgrade(
    req: &HttpRequest,
    body: web::Payload,
    protocol: &str,
    state: &AppState,
    queue_limit: usize,
    high_water: Option<&'static AtomicUsize>,
) -> Result<(HttpResponse, Outbox, AggregatedMessageStream), Refused> {
    // A socket taken while draining would claim a host (or join a terminal)
    // that this instance is about to let go of.
    if state.draining.load(std::sync::atomic::Ordering::Relaxed) {
        return Err(Refused::Draining);
    }
    if !super::origin::allowed(req, &state.settings.http.allowed_origins, &state.trusted_proxies) {
        let origin = req.headers().get(actix_web::http::header::ORIGIN).and_then(|o| o.to_str().ok()).unwrap_or("?");
        tracing::info!(origin, path = req.path(), "tether_ws_origin_refused");
        return Err(Refused::Origin);
    }
    // actix-ws's session is not used: the outbox's body writes the socket.
    let body = crate::relay::frame_guard::guard(req, body, MAX_FRAME_BYTES)?;
    let (res, _session, stream) = actix_ws::handle_with_protocols(req, body, &[protocol])?;
    let (res, outbox) = Outbox::for_response(res, queue_limit, high_water);
    let stream =
        stream.max_frame_size(MAX_FRAME_BYTES).aggregate_continuations().max_continuation_size(MAX_FRAME_BYTES);
    Ok((res, outbox, stream))
}

/// A socket whose token was accepted.
struct Admitted {
    principal: Principal,
    /// The host the token is bound to, as its lookup read it.
    bound_host: Option<Prefetched>,
    guard: AddressGuard,
    outbox: Outbox,
    stream: AggregatedMessageStream,
}

/// The token's principal and a slot under its user's caps for this
/// request's client (docs/PROTOCOL.md, "What the server enforces");
/// otherwise the socket is closed with the refusal's code.
async fn admit(
    req: &HttpRequest,
    state: &AppState,
    outbox: Outbox,
    stream: AggregatedMessageStream,
) -> Option<Admitted> {
    let (principal, bound_host) = match authenticate(state, auth::websocket_token(req)).await {
        Ok(found) => found,
        Err(e) if e.status == actix_web::http::StatusCode::UNAUTHORIZED => {
            refuse(outbox, stream, close::BAD_TOKEN, "bad token");
            return None;
        }
        Err(_) => {
            refuse(outbox, stream, close::INTERNAL, "server error");
            return None;
        }
    };
    let client = super::client_addr::client_addr(req, &state.trusted_proxies);
    let caps = Caps { per_address: state.settings.http.ws_per_address, per_user: state.settings.http.ws_per_user };
    // Fresh from the lookup's answer: the wait for a pooled connection
    // before it (seconds in a reconnect storm) does not age the row.
    let read_at = Instant::now();
    let bound_host = principal.bound_host.zip(bound_host).map(|(host_id, host)| Prefetched { host_id, host, read_at });
    match state.limiter.acquire(principal.cap_holder(), client, caps) {
        Ok(guard) => Some(Admitted { principal, bound_host, guard, outbox, stream }),
        Err(cap) => {
            refuse(outbox, stream, close::TOO_MANY, cap.reason());
            None
        }
    }
}

pub async fn daemon(
    req: HttpRequest,
    body: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, actix_web::Error> {
    let (res, outbox, stream) = match upgrade(&req, body, DAEMON_PROTOCOL, &state, daemon_conn::OUTBOUND_LIMIT, None) {
        Ok(upgraded) => upgraded,
        Err(r) => return refused(r),
    };
    let Some(Admitted { principal, bound_host, guard, outbox, stream }) = admit(&req, &state, outbox, stream).await
    else {
        return Ok(res);
    };
    if principal.may(Access::DaemonSocket, None).is_err() {
        refuse(outbox, stream, close::FORBIDDEN, "this token's scope may not connect a daemon");
        return Ok(res);
    }
    daemon_conn::start(state.relay.clone(), principal, bound_host, outbox, stream, guard);
    Ok(res)
}

#[derive(Deserialize)]
pub struct ViewerQuery {
    from: Option<String>,
}

pub async fn terminal(
    req: HttpRequest,
    body: web::Payload,
    path: web::Path<String>,
    query: web::Query<ViewerQuery>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, actix_web::Error> {
    let queue_limit = state.relay.settings.viewer.queue_bytes;
    let (res, outbox, stream) =
        match upgrade(&req, body, VIEWER_PROTOCOL, &state, queue_limit, Some(&viewer::QUEUE_HIGH_WATER)) {
            Ok(upgraded) => upgraded,
            Err(r) => return refused(r),
        };
    let Some(Admitted { principal, guard, outbox, stream, .. }) = admit(&req, &state, outbox, stream).await else {
        return Ok(res);
    };
    if principal.may(Access::ViewerSocket, Some(&path)).is_err() {
        refuse(outbox, stream, close::FORBIDDEN, "this token's scope does not reach this terminal");
        return Ok(res);
    }
    let Ok(id) = Uuid::parse_str(&path) else {
        refuse(outbox, stream, close::UNKNOWN_TERMINAL, "unknown terminal");
        return Ok(res);
    };
    let terminal = match state.store.terminal_by_id(id).await {
        Ok(Some(t)) if t.user_id == principal.user_id() => t,
        Ok(Some(_)) => {
            refuse(outbox, stream, close::FORBIDDEN, "not your terminal");
            return Ok(res);
        }
        Ok(None) => {
            refuse(outbox, stream, close::UNKNOWN_TERMINAL, "unknown terminal");
            return Ok(res);
        }
        Err(_) => {
            refuse(outbox, stream, close::INTERNAL, "server error");
            return Ok(res);
        }
    };
    let resume_from = query.from.as_deref().and_then(|f| f.parse::<u64>().ok());
    viewer::start(state.relay.clone(), principal, terminal, resume_from, outbox, stream, guard);
    Ok(res)
}
