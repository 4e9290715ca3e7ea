//! `POST /v1/assign` behind the HTTP layer (docs/CELLS.md, "The assign
//! call"): where a daemon dials, as an [`AssignAnswer`]. It reads the host's
//! view (its assignment epoch, and the cell its live lease holder is on),
//! then carries out [`Placement`]'s steps: a booking on a reserve cell
//! (answered with a signed ticket), a relay_assignments write on the
//! database path (no ticket), or the held cell the host stays on.

use std::sync::Arc;

use actix::Addr;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::placement::{Freshness, HostView, Placement, Step};
use super::poller::{Book, CellPoller, FleetSnapshot, Snapshot};
use super::ticket::{TicketKey, TicketSubject};
use crate::cell::bookings::{ReserveAnswer, ReserveItem, MAX_BOOKING_TTL};
use crate::cell::feed::AssignAnswer;
use crate::store::{host_lease_key, Store, StoreError};

/// Why no answer was given.
#[derive(Debug, thiserror::Error)]
pub enum AssignError {
    /// No reserve cell took the host and no cell may take it through the database.
    #[error(
        "no cell can take this host now: no reserve cell answered its seat feed lately or had a seat, and no cell \
         admits through the database (a db switch, or a tripped cell); retry later"
    )]
    NoCell,
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the director's poller is not running")]
    PollerGone,
}

/// The cell id of an instance id (`<cell id>#<boot suffix>`).
pub fn cell_of_instance(instance_id: &str) -> &str {
    instance_id.rsplit_once('#').map_or(instance_id, |(cell, _)| cell)
}

/// The placement service one director process runs.
pub struct Director {
    poller: Addr<CellPoller>,
    store: Arc<dyn Store>,
    key: TicketKey,
    freshness: Freshness,
}

impl Director {
    pub fn new(poller: Addr<CellPoller>, store: Arc<dyn Store>, key: TicketKey, freshness: Freshness) -> Self {
        Self { poller, store, key, freshness }
    }

    /// Places `host_id`, a host of `user_id` (the caller checked the owner);
    /// a booking's ticket vouches for both.
    pub async fn assign(&self, user_id: Uuid, host_id: Uuid) -> Result<AssignAnswer, AssignError> {
        let assignment = self.store.assignment(host_id).await?;
        let epoch = assignment.as_ref().map(|(_, epoch)| *epoch);
        let holder = self.store.lease_holder(&host_lease_key(host_id)).await?;
        let connected_on = holder.map(|holder| cell_of_instance(&holder.instance).to_owned());
        let mut placement = Placement::new(HostView { epoch, connected_on }, self.freshness);
        let snapshot = self.poller.send(Snapshot).await.map_err(|_| AssignError::PollerGone)?;
        loop {
            let step = placement.next(&snapshot.cells, snapshot.now_ms, &mut rand::rng());
            match step {
                Step::Book { cell_id, epoch } => {
                    let ttl_ms = MAX_BOOKING_TTL.as_millis() as u64;
                    let item = ReserveItem { host_id, epoch, ttl_ms };
                    let sent = self.poller.send(Book { cell_id: cell_id.clone(), item }).await;
                    match sent.map_err(|_| AssignError::PollerGone)? {
                        Ok(answer) => {
                            count_answer(answer_label(answer));
                            if placement.answered(&cell_id, answer) {
                                let expires_at_ms = snapshot.now_ms + ttl_ms as i64;
                                let subject = TicketSubject { host_id, user_id, cell_id: &cell_id, epoch };
                                let ticket = self.key.sign(&subject, expires_at_ms);
                                count_assignment("reserve");
                                return Ok(answer_for(&snapshot, cell_id, epoch, ticket, expires_at_ms));
                            }
                        }
                        Err(e) => {
                            count_answer("unreachable");
                            tracing::info!(%cell_id, error = %e, "tether_director_booking_failed");
                            placement.unreachable(&cell_id);
                        }
                    }
                }
                Step::Database { cell_id, .. } => {
                    let epoch = self.store.assign_host(host_id, &cell_id).await?;
                    count_assignment("database");
                    let expires_at_ms = snapshot.now_ms + MAX_BOOKING_TTL.as_millis() as i64;
                    return Ok(answer_for(&snapshot, cell_id, epoch, String::new(), expires_at_ms));
                }
                Step::Stay { cell_id, mut epoch } => {
                    // The host's row may name another cell (a booking writes
                    // none; a trip elsewhere wrote it): the held cell's
                    // database check would send the daemon there with 4409,
                    // round and round. The row is made to say where the
                    // host is connected.
                    if assignment.as_ref().is_some_and(|(assigned, _)| *assigned != cell_id) {
                        epoch = self.store.assign_host(host_id, &cell_id).await?;
                    }
                    count_assignment("stay");
                    let expires_at_ms = snapshot.now_ms + MAX_BOOKING_TTL.as_millis() as i64;
                    return Ok(answer_for(&snapshot, cell_id, epoch, String::new(), expires_at_ms));
                }
                Step::NoCell => {
                    count_assignment("none");
                    return Err(AssignError::NoCell);
                }
            }
        }
    }
}

fn answer_for(
    snapshot: &FleetSnapshot,
    cell_id: String,
    epoch: i64,
    ticket: String,
    expires_at_ms: i64,
) -> AssignAnswer {
    AssignAnswer {
        cell_url: snapshot.url(&cell_id).unwrap_or_default().to_owned(),
        cell_id,
        epoch,
        ticket,
        expires_at: DateTime::<Utc>::from_timestamp_millis(expires_at_ms).unwrap_or_default(),
    }
}

fn answer_label(answer: ReserveAnswer) -> &'static str {
    match answer {
        ReserveAnswer::Ok => "ok",
        ReserveAnswer::Full => "full",
        ReserveAnswer::Draining => "draining",
        ReserveAnswer::Off => "off",
        ReserveAnswer::SeatedNewer { .. } => "seated-newer",
    }
}

/// `tether_director_booking_answers_total{answer}`: what cells answered
/// the director's reserve calls (`unreachable`: no answer).
fn count_answer(answer: &'static str) {
    metrics::counter!("tether_director_booking_answers_total", "answer" => answer).increment(1);
}

/// `tether_director_assignments_total{path}`: `reserve`, `database`,
/// `stay` (a connected host of a held cell) or `none` (503).
fn count_assignment(path: &'static str) {
    metrics::counter!("tether_director_assignments_total", "path" => path).increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cell_id_is_the_instance_id_before_its_last_hash() {
        assert_eq!(cell_of_instance("relay-7#a1b2c3"), "relay-7");
        assert_eq!(cell_of_instance("odd#cell#a1b2c3"), "odd#cell");
        assert_eq!(cell_of_instance("bare"), "bare");
    }
}
