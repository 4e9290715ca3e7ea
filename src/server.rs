//! `tether serve`: opens the store (migrating it), builds the shared state
//! and runs the HTTP server until SIGTERM/SIGINT, then drains within
//! `shutdown.grace_ms` (docs/ARCHITECTURE.md, "Drain").

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use actix_http::HttpService;
use actix_service::{map_config, IntoServiceFactory, ServiceFactoryExt};
use actix_web::dev::AppConfig;
use actix_web::{web, App, HttpServer};

use crate::config::{ms, Settings};
use crate::http::routes::Serving;
use crate::http::state::{AppState, Instance, Role};
use crate::relay::owed::Owed;
use crate::relay::registry::DrainAll;
use crate::store::{self, LeaseHolder, StoreError};

/// Why `serve` could not run.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    #[error(transparent)]
    Director(#[from] crate::director::StartError),
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error("server failed: {0}")]
    Io(#[from] std::io::Error),
}

/// A bound, not yet running server: lets callers learn the real address
/// (port 0 binds) before it starts serving.
pub struct Bound {
    pub addrs: Vec<SocketAddr>,
    /// Where `/metrics` is served when `metrics.listen` moved it.
    pub metrics_addrs: Vec<SocketAddr>,
    pub state: web::Data<AppState>,
    server: actix_web::dev::Server,
    /// The listening socket (a second handle on it): the drain shuts it so
    /// that new connections are refused, not left waiting in its backlog.
    listening: std::net::TcpListener,
    /// The upgraded connections (every WebSocket), which actix-server does
    /// not count once their upgrade is answered.
    upgraded: Arc<Owed>,
    metrics_server: Option<actix_web::dev::Server>,
}

impl Bound {
    /// Serves until SIGTERM or SIGINT, then drains (docs/ARCHITECTURE.md, "Drain"): stops
    /// accepting, closes daemon sockets and viewers with 4503, releases its
    /// leases, and exits within `shutdown.grace_ms`.
    pub async fn run(self) -> Result<(), ServeError> {
        let handle = self.server.handle();
        let metrics_handle = self.metrics_server.as_ref().map(|s| s.handle());
        if let Some(metrics_server) = self.metrics_server {
            actix_rt::spawn(async move {
                if let Err(e) = metrics_server.await {
                    tracing::error!(error = %e, "tether_metrics_listener_failed");
                }
            });
        }
        let state = self.state.clone();
        let upgraded = self.upgraded.clone();
        let listening = self.listening;
        actix_rt::spawn(async move {
            wait_for_stop_signal().await;
            let grace = ms(state.settings.shutdown.grace_ms);
            // The whole drain, the server's own stop included, fits in the
            // grace counted from the signal: the drain and the sockets'
            // closes get all of it but the stop's share.
            let deadline = tokio::time::Instant::now() + grace.saturating_sub(stop_share(grace));
            tracing::info!(grace_ms = state.settings.shutdown.grace_ms, "tether_instance_draining");
            state.draining.store(true, std::sync::atomic::Ordering::Relaxed);
            handle.pause().await;
            // The pause is carried out by actix-server's accept thread once
            // it wakes; a listener shut before then wakes it with an accept
            // that fails (EINVAL), logged as two ERROR lines.
            tokio::time::sleep(PAUSE_SETTLE).await;
            stop_listening(&listening);
            if tokio::time::timeout_at(deadline, drain(&state)).await.is_err() {
                tracing::warn!(
                    releases_left = state.relay.releases.unsettled(),
                    writes_left = state.relay.writes.count(),
                    audit_events_left = state.relay.audit.unwritten(),
                    "tether_drain_timed_out"
                );
            }
            // The drain closed every WebSocket; their close frames go out
            // before the workers (and the sockets' tasks with them) stop,
            // within the same grace.
            if tokio::time::timeout_at(deadline, upgraded.settled()).await.is_err() {
                tracing::warn!(connections_left = upgraded.count(), "tether_drain_sockets_cut");
            }
            handle.stop(true).await;
            if let Some(metrics_handle) = metrics_handle {
                metrics_handle.stop(true).await;
            }
        });
        self.server.await?;
        tracing::info!("tether_instance_stopped");
        Ok(())
    }
}

/// A write past the process's file-size limit (`ulimit -f`, systemd's
/// `LimitFSIZE=`) raises SIGXFSZ, whose default action kills the process.
/// Ignored, the write fails with EFBIG instead, and the store reports it
/// like a full disk: the request fails, the instance stays
/// (docs/OPERATIONS.md, "Faults").
fn ignore_file_size_signal() {
    // SAFETY: setting a signal's disposition to SIG_IGN installs no handler.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
}

/// Raises the soft open-file limit to the hard one: every daemon and viewer
/// socket is a file, and container runtimes and shells often start a
/// process at a soft 1,024 under a far higher hard limit
/// (docs/OPERATIONS.md, "Capacity"). Returns the limit in force.
fn raise_open_file_limit() -> Option<u64> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit read and write the struct we pass.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return None;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit { rlim_cur: limit.rlim_max, rlim_max: limit.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit = raised;
            }
        }
    }
    Some(limit.rlim_cur)
}

async fn wait_for_stop_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Closes every socket with 4503 and releases this instance's leases: the
/// hosts' all in one statement (a connection closed by the drain leaves its
/// lease to it), after which it waits for the releases of connections that
/// ended on their own, the daemon writes not yet stored and the audit
/// events not yet written (docs/ARCHITECTURE.md, "Drain").
async fn drain(state: &AppState) {
    let held = state.relay.registry.send(DrainAll).await.unwrap_or_default();
    // Viewers whose terminal's host is owned elsewhere go too.
    state.relay.remotes.drain_homes();
    // Let the close frames go out before the listener stops.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    match state.store.release_host_leases(&held).await {
        Ok(released) => tracing::info!(held = held.len(), released = released.len(), "tether_drain_released"),
        Err(e) => tracing::warn!(error = %e, held = held.len(), "tether_drain_release_failed"),
    }
    // Connections that ended before the drain closed them release their
    // own leases; the process must not exit with one still queued.
    state.relay.releases.settled().await;
    // Daemon writes kept through a database outage (or still running) are
    // stored if the database takes them within the grace.
    state.relay.writes.settled().await;
    // The audit events of the last moments (the drain's own detaches too).
    state.relay.audit.written().await;
    crate::store::logged(
        state
            .store
            .release_lease(crate::jobs::sweep::SWEEP_LEASE, &LeaseHolder::instance(&state.instance.instance_id))
            .await,
        "release the sweep lease",
    );
}

/// Opens the store and binds the listener.
pub async fn bind(settings: Settings, role: Role) -> Result<Bound, ServeError> {
    ignore_file_size_signal();
    let open_files = raise_open_file_limit();
    let settings = Arc::new(settings);
    // The listeners first: a port already taken is refused before any
    // actor, timer or connection pool has started (they would be torn
    // down half-started when the error ends the runtime).
    let addr = settings.listen_addr();
    let listener = tcp_listener(addr).map_err(|source| ServeError::Bind { addr, source })?;
    let metrics_listener = match &settings.metrics.listen {
        Some(listen) => Some(metrics_listener(listen)?),
        None => None,
    };
    let tls = match (&settings.http.tls_cert_path, &settings.http.tls_key_path) {
        (Some(cert), Some(key)) => Some(crate::tls::server_config(cert, key)?),
        _ => None,
    };
    // A cell never serves placement; a setting that asks for it is a
    // mistake to point out, not to pass over.
    if role == Role::Cell && settings.director.enabled {
        return Err(crate::config::ConfigError::Invalid {
            key: "director.enabled",
            message: "applies to a combined instance only: a cell never serves placement (run a --role director)"
                .into(),
        }
        .into());
    }
    let serving = Serving::of(role, settings.director.enabled);
    let ticket_key = match serving.placement {
        true => Some(crate::director::ticket_key(&settings)?),
        false => None,
    };
    let store = store::open(&settings).await?;
    let instance = Instance::new(settings.cell_id(), role);
    tracing::info!(
        instance_id = %instance.instance_id,
        backend = store.backend(),
        open_files,
        "tether_instance_starting"
    );
    let director = match ticket_key {
        Some(key) => Some(web::Data::new(crate::director::start(&settings, store.clone(), key)?)),
        None => None,
    };
    let state = AppState::start(settings.clone(), store, instance)?;
    let app_state = state.clone();
    let max_body = settings.http.max_body_bytes;
    let make_app = move || {
        App::new()
            .app_data(app_state.clone())
            .configure(|cfg| {
                if let Some(director) = director.clone() {
                    cfg.app_data(director);
                }
            })
            .wrap(crate::http::security_headers())
            .wrap_fn(crate::http::record_metrics)
            .configure(|cfg| crate::http::configure(cfg, max_body, serving))
    };
    let local = listener.local_addr()?;
    let listening = listener.try_clone()?;
    let handshake = ms(settings.http.handshake_timeout_ms);
    let builder = actix_server::Server::build()
        .disable_signals()
        // The HTTP requests still in flight after the drain get the
        // stop's share of the grace (`stop_share`), whole seconds.
        .shutdown_timeout(stop_share(ms(settings.shutdown.grace_ms)).as_secs().max(1));
    let shutdown = builder.graceful_shutdown_signal();
    let secure = tls.is_some();
    let upgraded: Arc<Owed> = Arc::default();
    let live = upgraded.clone();
    // One HTTP service per worker, as actix-web's `HttpServer` builds it,
    // plus the upgrade service that serves WebSockets without the HTTP/1
    // dispatcher's buffers (crate::http::upgraded). A macro, not a closure:
    // the service's type depends on the connection's (TCP or TLS).
    macro_rules! worker_service {
        () => {{
            // `AppConfig` has no public constructor but this one, which
            // actix-web keeps for its test server; `HttpServer` passes the
            // same three values (docs/ARCHITECTURE.md, "Upgraded connections").
            let config = AppConfig::__priv_test_new(secure, local.to_string(), local);
            let app = config.clone();
            let shutdown = shutdown.clone();
            let live = live.clone();
            HttpService::build()
                .graceful_shutdown_signal(move || {
                    let shutdown = shutdown.clone();
                    async move { shutdown.notified().await }
                })
                // A slow-loris client (a connection that never finishes its
                // request head or TLS handshake) is cut at this deadline;
                // WebSocket caps are counted only after the upgrade, so it
                // never held a slot.
                .client_request_timeout(handshake)
                .client_disconnect_timeout(Duration::from_secs(1))
                .h1_allow_half_closed(true)
                // Terminal traffic is many small frames (keystrokes, echoes,
                // control messages): Nagle's algorithm would hold each
                // behind the peer's delayed ACK (~40 ms).
                .tcp_nodelay(true)
                .local_addr(local)
                .upgrade(crate::http::upgraded::factory(make_app().into_factory(), config, live))
                .finish(
                    map_config(make_app().into_factory(), move |_| app.clone())
                        .map_err(|e: actix_web::Error| e.error_response()),
                )
        }};
    }
    let builder = match tls {
        Some(tls) => builder.listen("tether", listener, move || {
            let acceptor = actix_http::TlsAcceptorConfig::default().handshake_timeout(handshake);
            worker_service!().rustls_0_23_with_config(tls.clone(), acceptor)
        }),
        None => builder.listen("tether", listener, move || worker_service!().tcp()),
    }?;
    let server = builder.run();
    let addrs = vec![local];
    state.start_bus_subscriber();
    if role != Role::Director {
        let scheme = if settings.http.tls_cert_path.is_some() { "https" } else { "http" };
        let url = settings.cell.url.clone().unwrap_or_else(|| format!("{scheme}://{}", addr_of(&addrs, addr)));
        crate::cell::runtime::start(state.relay.cell.clone(), state.store.clone(), &settings, url).await?;
    }
    let (metrics_server, metrics_addrs) = match metrics_listener {
        Some(listener) => {
            let (server, addrs) = serve_metrics(listener, state.clone())?;
            (Some(server), addrs)
        }
        None => (None, Vec::new()),
    };
    Ok(Bound { addrs, metrics_addrs, state, server, listening, upgraded, metrics_server })
}

/// The listener, as actix-web's `HttpServer` makes it: the address may be
/// reused at once after a restart, and a reconnect storm's dials wait in a
/// backlog of 1,024.
fn tcp_listener(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)?.into_std()
}

/// How long the drain lets actix-server's accept thread take in the pause
/// before it shuts the listening socket: the thread wakes at once, so this
/// is margin; meanwhile dials still land in the backlog and are reset with
/// it.
const PAUSE_SETTLE: Duration = Duration::from_millis(100);

/// The part of `shutdown.grace_ms` kept for the server's graceful stop
/// after the drain, in which HTTP requests still in flight may finish
/// (with a database that hangs, a request can wait on it): a second (the
/// server counts whole seconds), or half a grace shorter than two.
fn stop_share(grace: Duration) -> Duration {
    Duration::from_secs(1).min(grace / 2)
}

/// Stops the listening socket taking connections: actix-server's pause
/// only stops accepting them, and the kernel would go on completing
/// handshakes into the backlog, where a client waits unanswered until the
/// process exits. Shut for reading, a listening socket refuses new
/// connections and resets those in its backlog, so their clients dial
/// another instance at once (docs/ARCHITECTURE.md, "Drain").
fn stop_listening(listening: &std::net::TcpListener) {
    use std::os::fd::AsRawFd;
    // SAFETY: shutdown(2) on a descriptor this struct owns; no memory is touched.
    if unsafe { libc::shutdown(listening.as_raw_fd(), libc::SHUT_RD) } != 0 {
        tracing::warn!(error = %std::io::Error::last_os_error(), "tether_drain_listener_shutdown_failed");
    }
}

/// The first bound address (the real port of a port-0 bind).
fn addr_of(addrs: &[SocketAddr], configured: SocketAddr) -> SocketAddr {
    addrs.first().copied().unwrap_or(configured)
}

/// The `metrics.listen` listener.
fn metrics_listener(listen: &str) -> Result<std::net::TcpListener, ServeError> {
    let addr: SocketAddr = listen.parse().map_err(|e| crate::config::ConfigError::Invalid {
        key: "metrics.listen",
        message: format!("`{listen}`: {e}"),
    })?;
    std::net::TcpListener::bind(addr).map_err(|source| ServeError::Bind { addr, source })
}

/// Serves `/metrics` and nothing else on its own listener, plain HTTP
/// (docs/OPERATIONS.md, "Metrics"); returns the server and its addresses.
fn serve_metrics(
    listener: std::net::TcpListener,
    state: web::Data<AppState>,
) -> Result<(actix_web::dev::Server, Vec<SocketAddr>), ServeError> {
    let addr = listener.local_addr()?;
    let server = HttpServer::new(move || {
        App::new()
            .app_data(state.clone())
            .wrap(crate::http::security_headers())
            .configure(crate::http::configure_metrics)
    })
    .workers(1)
    .disable_signals()
    .listen(listener)
    .map_err(|source| ServeError::Bind { addr, source })?;
    let addrs = server.addrs();
    Ok((server.run(), addrs))
}
