//! The director (docs/CELLS.md, "Running a director"): it places daemons on
//! relay cells before they dial. Reserve cells it books hosts onto in
//! advance, so their hellos need no database read; when no reserve cell
//! takes a host it falls back to the database path. Its seat-feed polls are
//! the contact that keeps each reserve cell's dead-man window from passing.
//!
//! - [`placement`]: which cell a host goes to, and at which epoch.
//! - [`fleet`]: what the director knows of each cell, as plain state.
//! - [`poller`]: the actor that polls the cells and books hosts on them.
//! - [`assign`]: `POST /v1/assign`, carried out.
//! - [`ticket`]: the signed booking ticket a cell checks without the database.

pub mod assign;
pub mod fleet;
pub mod placement;
pub mod poller;
pub mod ticket;

use std::sync::Arc;

use actix::Actor;

use crate::config::{ms, ConfigError, Settings};
use crate::store::Store;
pub use assign::{AssignError, Director};

/// Why the director cannot start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
}

/// The director's ticket key from `cluster.secret`, which it needs: it
/// signs booking tickets and authenticates to the cells' `/internal`
/// routes with it. Checked before anything is opened.
pub fn ticket_key(settings: &Settings) -> Result<ticket::TicketKey, ConfigError> {
    let unset = || ConfigError::Invalid {
        key: "cluster.secret",
        message: "the director needs it: it signs booking tickets and authenticates to the cells with it".into(),
    };
    let secret = settings.cluster.secret.as_deref().filter(|s| !s.is_empty()).ok_or_else(unset)?;
    ticket::TicketKey::new(secret.as_bytes()).map_err(|_| unset())
}

/// Starts the director's poller on the current actix system.
pub fn start(settings: &Settings, store: Arc<dyn Store>, key: ticket::TicketKey) -> Result<Director, StartError> {
    let secret = settings.cluster.secret.clone().unwrap_or_default();
    let director = &settings.director;
    let poller = poller::CellPoller::new(store.clone(), secret, ms(director.poll_ms), ms(director.fresh_ms))?.start();
    let freshness = placement::Freshness {
        fresh_ms: i64::try_from(director.fresh_ms).unwrap_or(i64::MAX),
        effective_fresh_ms: i64::try_from(director.effective_fresh_ms).unwrap_or(i64::MAX),
    };
    tracing::info!(poll_ms = director.poll_ms, fresh_ms = director.fresh_ms, "tether_director_started");
    Ok(Director::new(poller, store, key, freshness))
}
