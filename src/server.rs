//! `tether serve`: opens the store (migrating it), builds the shared state
//! and runs the HTTP server until SIGTERM/SIGINT, then drains within
//! `shutdown.grace_ms`.

use std::net::SocketAddr;
use std::sync::Arc;

use actix_web::{web, App, HttpServer};

use crate::config::{ms, Settings};
use crate::http::state::{AppState, Instance, Role};
use crate::store::{self, StoreError};

/// Why `serve` could not run.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error("server failed: {0}")]
    Io(#[from] std::io::Error),
}

/// A bound, not yet running server: lets callers learn the real address
/// (port 0 binds) before it starts serving.
pub struct Bound {
    pub addrs: Vec<SocketAddr>,
    pub state: web::Data<AppState>,
    server: actix_web::dev::Server,
}

impl Bound {
    /// Serves until the process is told to stop.
    pub async fn run(self) -> Result<(), ServeError> {
        self.server.await?;
        Ok(())
    }
}

/// Opens the store and binds the listener.
pub async fn bind(settings: Settings, role: Role) -> Result<Bound, ServeError> {
    let settings = Arc::new(settings);
    let store = store::open(&settings).await?;
    let instance = Instance::new(settings.cell_id(), role);
    tracing::info!(instance_id = %instance.instance_id, backend = store.backend(), "tether_instance_starting");
    let state = AppState::start(settings.clone(), store, instance);
    let app_state = state.clone();
    let max_body = settings.http.max_body_bytes;
    let addr = settings.listen_addr();
    let server = HttpServer::new(move || {
        App::new()
            .app_data(app_state.clone())
            .wrap_fn(crate::http::record_metrics)
            .configure(|cfg| crate::http::configure(cfg, max_body))
    })
    .shutdown_timeout(ms(settings.shutdown.grace_ms).as_secs().max(1))
    .bind(addr)
    .map_err(|source| ServeError::Bind { addr, source })?;
    let addrs = server.addrs();
    Ok(Bound { addrs, state, server: server.run() })
}
